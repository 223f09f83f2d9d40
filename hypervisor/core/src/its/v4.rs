//! GICv4.0 direct injection of virtual LPIs: the decisions, in plain Rust so
//! the host tests them.
//!
//! * [`choose_path`]: GICv4 direct injection when the ITS is virtual
//!   (GITS_TYPER.Virtual), every redistributor does vLPIs (GICR_TYPER.VLPIS)
//!   and the CPU interface can present them (ICH_VTR_EL2.nV4 == 0); the
//!   emulated path (host LPIs through list registers) otherwise, or when `gic_vlpi=off`. GICv4.1
//!   (GITS_TYPER.VSGI/VMAPP, GICR_TYPER.RVPEID) is recognised and named, but
//!   its redistributors read GICR_VPROPBASER as a vPE configuration table,
//!   not as the vLPI configuration table GICv4.0 programs there: it takes
//!   the emulated path until someone writes the 4.1 sequence.
//! * [`VpeMap`]: the VM's vPEs (one per vCPU: vPE ID and doorbell LPI). A
//!   guest names vCPUs only through its own collections, and the backend
//!   looks the vPE up here: a guest cannot name another VM's vPE.
//! * [`plan`]: the physical ITS commands for one guest mapping change, each
//!   followed by the VSYNC of the vPEs it touches; [`check_and_plan`] and
//!   [`record`] check it against, and enter it in, the driver's bookkeeping.
//! * [`VlpiIts`]: what the vITS's GICv4 backend
//!   (`vgic::its::direct::DirectBackend`) asks of the physical ITS.
//! * [`vpropbaser`], [`vpendbaser`], [`Residency`]: the redistributor
//!   values that make a vPE resident or not, and what reading back means.

use super::cmd::Command;
use super::host::{ItsError, Mappings};
use super::{GICR_VPENDBASER, GICR_VPROPBASER, GITS_TYPER, LPI_BASE};
use alloc::vec::Vec;
use core::fmt;
use tock_registers::LocalRegisterCopy;

pub use super::{VlpiError, VLPI_ID_BITS};
/// Bytes of a virtual pending table: one bit per INTID below 2^14, the
/// first 1 KiB (INTIDs below 8192) included.
pub const VPT_BYTES: usize = (1 << VLPI_ID_BITS) / 8;
/// GICR_VPENDBASER and VMAPP want 64 KiB alignment.
pub const VPT_ALIGN: usize = 0x1_0000;
/// vPE ID bits of the vPE table: one vPE per vCPU, 256 at most.
pub const VPE_ID_BITS: u8 = 8;
/// The doorbell field value meaning "no doorbell".
pub const NO_DOORBELL: u32 = 1023;
/// GICR_TYPER.RVPEID (GICv4.1: VPROPBASER is the vPE configuration table).
pub const GICR_TYPER_RVPEID: u64 = 1 << 7;
/// ICH_VTR_EL2.nV4: direct injection of virtual interrupts not supported.
pub const ICH_VTR_NV4: u64 = 1 << 20;

/// Which way guest LPIs travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LpiPath {
    /// GICv4.0: the ITS makes vLPIs pending for the vPE; doorbells wake.
    Direct,
    /// The emulated path: a host LPI per event, injected through list registers.
    Emulated(EmulatedWhy),
}

/// Why the emulated path was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmulatedWhy {
    /// `gic_vlpi=off`.
    Disabled,
    /// No ITS, or a GICv3 ITS (GITS_PIDR2.ArchRev < 4 or GITS_TYPER.Virtual = 0).
    NoVirtualIts,
    /// Redistributor `n` (in frame order) has GICR_TYPER.VLPIS = 0.
    NoVlpis(usize),
    /// ICH_VTR_EL2.nV4 = 1.
    CpuInterface,
    /// A GICv4.1 GIC: the 4.1 vPE configuration table is not implemented.
    GicV41,
}

impl fmt::Display for EmulatedWhy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EmulatedWhy::Disabled => write!(f, "gic_vlpi=off"),
            EmulatedWhy::NoVirtualIts => write!(f, "the ITS has no virtual LPIs (GITS_TYPER.Virtual = 0)"),
            EmulatedWhy::NoVlpis(n) => write!(f, "redistributor {n} has GICR_TYPER.VLPIS = 0"),
            EmulatedWhy::CpuInterface => write!(f, "the CPU interface has ICH_VTR_EL2.nV4 = 1"),
            EmulatedWhy::GicV41 => write!(f, "GICv4.1 found; only the GICv4.0 sequence is implemented"),
        }
    }
}

/// What the hardware says about virtual LPIs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V4Probe {
    /// GITS_PIDR2.ArchRev (3 or 4).
    pub its_arch_rev: u8,
    pub its_typer: u64,
    /// GICR_TYPER of every redistributor.
    pub gicr_typers: Vec<u64>,
    pub ich_vtr: u64,
}

impl V4Probe {
    /// GICv4.1 features: GITS_TYPER.VSGI or VMAPP, or a redistributor with
    /// GICR_TYPER.RVPEID.
    pub fn is_v41(&self) -> bool {
        let t = LocalRegisterCopy::<u64, GITS_TYPER::Register>::new(self.its_typer);
        t.is_set(GITS_TYPER::VSGI)
            || t.is_set(GITS_TYPER::VMAPP)
            || self.gicr_typers.iter().any(|&r| r & GICR_TYPER_RVPEID != 0)
    }
}

/// Direct injection or the emulated path; `want` is false for `gic_vlpi=off`.
pub fn choose_path(p: &V4Probe, want: bool) -> LpiPath {
    let t = LocalRegisterCopy::<u64, GITS_TYPER::Register>::new(p.its_typer);
    let why = if !want {
        EmulatedWhy::Disabled
    } else if p.its_arch_rev < 4 || !t.is_set(GITS_TYPER::Virtual) {
        EmulatedWhy::NoVirtualIts
    } else if let Some(n) = p.gicr_typers.iter().position(|&r| r & super::gicr::TYPER_VLPIS == 0) {
        EmulatedWhy::NoVlpis(n)
    } else if p.gicr_typers.is_empty() {
        EmulatedWhy::NoVlpis(0)
    } else if p.ich_vtr & ICH_VTR_NV4 != 0 {
        EmulatedWhy::CpuInterface
    } else if p.is_v41() {
        EmulatedWhy::GicV41
    } else {
        return LpiPath::Direct;
    };
    LpiPath::Emulated(why)
}

/// One vCPU's vPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vpe {
    pub vpe: u16,
    /// The host LPI the ITS raises for a vLPI while the vPE is not resident.
    pub doorbell: u32,
}

/// The vPEs of one VM, indexed by vCPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VpeMap {
    vpes: Vec<Vpe>,
}

impl VpeMap {
    pub fn new(vpes: Vec<Vpe>) -> Self {
        Self { vpes }
    }

    /// The vPE of `vcpu`; a guest event whose collection is unmapped goes
    /// to vCPU 0's (as the emulated backend puts its host LPI on pCPU 0).
    pub fn of(&self, vcpu: Option<usize>) -> Result<Vpe, VlpiError> {
        let v = vcpu.unwrap_or(0);
        self.vpes.get(v).copied().ok_or(VlpiError::NoSuchVcpu(v))
    }

    /// The vCPU whose vPE is `vpe`.
    pub fn vcpu_of(&self, vpe: u16) -> Option<usize> {
        self.vpes.iter().position(|v| v.vpe == vpe)
    }

    pub fn len(&self) -> usize {
        self.vpes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.vpes.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Vpe> {
        self.vpes.iter()
    }
}

/// One change the guest made through its vITS (after the vITS model has
/// checked it against the guest's own tables).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestChange {
    /// MAPTI/MAPI: the event becomes `vintid` of `vcpu`.
    Map { device: u32, event: u32, vintid: u32, vcpu: Option<usize> },
    /// DISCARD, or its device was unmapped.
    Unmap { device: u32, event: u32, vcpu: Option<usize> },
    /// MOVI, or MAPC moved the event's collection.
    Move { device: u32, event: u32, from: Option<usize>, to: Option<usize> },
    /// INV: re-read the event's configuration byte in the guest's table.
    Inv { device: u32, event: u32, vcpu: Option<usize> },
    /// INVALL of a collection on `vcpu`.
    Invall { vcpu: usize },
    /// INT: make the event pending.
    Int { device: u32, event: u32, vcpu: Option<usize> },
    /// CLEAR: clear its pending state.
    Clear { device: u32, event: u32, vcpu: Option<usize> },
}

/// The physical commands for `c`: the V-command (or the plain one, which
/// the ITS applies to the event's virtual ITE) and a VSYNC of each vPE it
/// touches. The vCPUs are looked up in `vpes` only, so nothing outside this
/// VM's vPEs can be named.
pub fn plan(c: GuestChange, vpes: &VpeMap) -> Result<Vec<Command>, VlpiError> {
    let sync = |v: Vpe| Command::Vsync { vpe: v.vpe };
    Ok(match c {
        GuestChange::Map { device, event, vintid, vcpu } => {
            if !(LPI_BASE..1 << VLPI_ID_BITS).contains(&vintid) {
                return Err(VlpiError::BadVintid(vintid));
            }
            let v = vpes.of(vcpu)?;
            let map = if vintid == event {
                Command::Vmapi { device, event, vpe: v.vpe, doorbell: v.doorbell }
            } else {
                Command::Vmapti { device, event, vpe: v.vpe, vintid, doorbell: v.doorbell }
            };
            alloc::vec![map, sync(v)]
        }
        GuestChange::Unmap { device, event, vcpu } => {
            alloc::vec![Command::Discard { device, event }, sync(vpes.of(vcpu)?)]
        }
        GuestChange::Move { device, event, from, to } => {
            let (a, b) = (vpes.of(from)?, vpes.of(to)?);
            if a == b {
                return Ok(Vec::new());
            }
            let mv = Command::Vmovi { device, event, vpe: b.vpe, set_doorbell: true, doorbell: b.doorbell };
            alloc::vec![mv, sync(a), sync(b)]
        }
        GuestChange::Inv { device, event, vcpu } => alloc::vec![Command::Inv { device, event }, sync(vpes.of(vcpu)?)],
        GuestChange::Invall { vcpu } => {
            let v = vpes.of(Some(vcpu))?;
            alloc::vec![Command::Vinvall { vpe: v.vpe }, sync(v)]
        }
        GuestChange::Int { device, event, vcpu } => alloc::vec![Command::Int { device, event }, sync(vpes.of(vcpu)?)],
        GuestChange::Clear { device, event, vcpu } => {
            alloc::vec![Command::Clear { device, event }, sync(vpes.of(vcpu)?)]
        }
    })
}

/// [`plan`] after checking `c` against what the physical ITS has mapped
/// (`map`): a MAP of an event that is mapped, or any other change of an
/// event that is not a vLPI of this VM, is refused before a command is
/// sent. The vPE an existing event is mapped to is taken from `map`, not
/// from the guest's view, so the VSYNC goes where the ITE points.
pub fn check_and_plan(map: &Mappings, c: GuestChange, vpes: &VpeMap) -> Result<Vec<Command>, ItsError> {
    let cur = |device: u32, event: u32| -> Result<Option<usize>, ItsError> {
        let vpe = map.vevent(device, event)?.vpe;
        vpes.vcpu_of(vpe).map(Some).ok_or(ItsError::UnknownEvent { device, event })
    };
    let c = match c {
        GuestChange::Map { device, event, .. } => {
            map.check_new_event(device, event, 0)?;
            c
        }
        GuestChange::Unmap { device, event, .. } => GuestChange::Unmap { device, event, vcpu: cur(device, event)? },
        GuestChange::Move { device, event, to, .. } => {
            GuestChange::Move { device, event, from: cur(device, event)?, to }
        }
        GuestChange::Inv { device, event, .. } => GuestChange::Inv { device, event, vcpu: cur(device, event)? },
        GuestChange::Int { device, event, .. } => GuestChange::Int { device, event, vcpu: cur(device, event)? },
        GuestChange::Clear { device, event, .. } => GuestChange::Clear { device, event, vcpu: cur(device, event)? },
        GuestChange::Invall { .. } => c,
    };
    plan(c, vpes).map_err(ItsError::Vlpi)
}

/// Records in `map` what the commands of [`check_and_plan`] did, once the
/// ITS has consumed them.
pub fn record(map: &mut Mappings, c: GuestChange, vpes: &VpeMap) -> Result<(), ItsError> {
    match c {
        GuestChange::Map { device, event, vintid, vcpu } => {
            let vpe = vpes.of(vcpu).map_err(ItsError::Vlpi)?.vpe;
            map.add_vevent(device, event, vpe, vintid)
        }
        GuestChange::Unmap { device, event, .. } => map.remove_vevent(device, event).map(|_| ()),
        GuestChange::Move { device, event, to, .. } => {
            let vpe = vpes.of(to).map_err(ItsError::Vlpi)?.vpe;
            map.set_vpe(device, event, vpe)
        }
        _ => Ok(()),
    }
}

/// What the GICv4 backend asks of the physical ITS (the EL2 driver, or a
/// fake in the host tests).
pub trait VlpiIts {
    /// MAPD of a passthrough device with 2^`event_bits` events.
    fn map_device(&mut self, device: u32, event_bits: u8) -> Result<(), ItsError>;
    /// DISCARD of its events, MAPD V=0.
    fn unmap_device(&mut self, device: u32) -> Result<(), ItsError>;
    /// [`check_and_plan`], send, [`record`].
    fn change(&mut self, c: GuestChange, vpes: &VpeMap) -> Result<(), ItsError>;
}

/// VMAPP of `vpe` to `rdbase` with its pending table at `vpt` (then VSYNC).
pub fn vmapp(vpe: u16, rdbase: u64, vpt: u64) -> [Command; 2] {
    [Command::Vmapp { vpe, rdbase, vpt_addr: vpt, vpt_size: VLPI_ID_BITS - 1, valid: true }, Command::Vsync { vpe }]
}

/// VMOVP of `vpe` to `rdbase` (one ITS: sequence 0; its ITSList bit only
/// when GITS_TYPER.VMOVP = 0 asks for the handshake), then VSYNC.
pub fn vmovp(vpe: u16, rdbase: u64, its_typer: u64, its_number: u8) -> [Command; 2] {
    let t = LocalRegisterCopy::<u64, GITS_TYPER::Register>::new(its_typer);
    let its_list = if t.is_set(GITS_TYPER::VMOVP) { 0 } else { 1 << (its_number & 0xf) };
    [Command::Vmovp { sequence: 0, its_list, vpe, rdbase }, Command::Vsync { vpe }]
}

/// GICR_VPROPBASER for a guest LPI configuration table at `table_pa` (the
/// guest's GICR_PROPBASER address: Dom0 is identity-mapped) covering
/// `id_bits` INTID bits, capped at [`VLPI_ID_BITS`]. `None` below 14 bits:
/// such a table has no LPIs.
pub fn vpropbaser(table_pa: u64, id_bits: u8, shareable: bool) -> Option<u64> {
    if id_bits < 14 {
        return None;
    }
    let mut v = LocalRegisterCopy::<u64, GICR_VPROPBASER::Register>::new(0);
    let bits = id_bits.min(VLPI_ID_BITS);
    v.modify(
        GICR_VPROPBASER::Physical_Address.val(table_pa >> 12)
            + GICR_VPROPBASER::IDbits.val(u64::from(bits) - 1)
            + GICR_VPROPBASER::InnerCache.val(if shareable { 0b111 } else { 0b001 })
            + GICR_VPROPBASER::Shareability.val(u64::from(shareable)),
    );
    Some(v.get())
}

/// Bytes of the guest's LPI configuration table the redistributor reads
/// through GICR_VPROPBASER (one byte per vLPI from 8192).
pub const VPROP_TABLE_BYTES: u64 = (1 << VLPI_ID_BITS) - LPI_BASE as u64;

/// GICR_VPENDBASER for the pending table at `vpt`, resident or not.
pub fn vpendbaser(vpt: u64, valid: bool, shareable: bool) -> u64 {
    let mut v = LocalRegisterCopy::<u64, GICR_VPENDBASER::Register>::new(0);
    v.modify(
        GICR_VPENDBASER::Physical_Address.val(vpt >> 16)
            + GICR_VPENDBASER::Valid.val(u64::from(valid))
            + GICR_VPENDBASER::InnerCache.val(if shareable { 0b111 } else { 0b001 })
            + GICR_VPENDBASER::Shareability.val(u64::from(shareable)),
    );
    v.get()
}

/// What GICR_VPENDBASER says after Valid was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residency {
    /// The redistributor is still parsing the pending table (Dirty): poll.
    Dirty,
    /// Done: resident (Valid = 1), or not resident and whether an enabled
    /// vLPI was pending when it left (PendingLast).
    Settled { valid: bool, pending_last: bool },
}

/// Reads a GICR_VPENDBASER value.
pub fn residency(raw: u64) -> Residency {
    let v = LocalRegisterCopy::<u64, GICR_VPENDBASER::Register>::new(raw);
    if v.is_set(GICR_VPENDBASER::Dirty) {
        Residency::Dirty
    } else {
        Residency::Settled {
            valid: v.is_set(GICR_VPENDBASER::Valid),
            pending_last: v.is_set(GICR_VPENDBASER::PendingLast),
        }
    }
}

/// Where a vPE must be mapped before it runs on a pCPU: the doorbell and
/// the ITS's vLPIs go to the redistributor VMAPP/VMOVP named, and only a
/// vPE resident *there* gets its vLPIs directly. `None`: it is there.
pub fn needs_vmovp(mapped_pcpu: usize, running_on: usize) -> Option<usize> {
    (mapped_pcpu != running_on).then_some(running_on)
}

/// What a doorbell found (GICv4.0 raises one for *every* vLPI that arrives
/// while its vPE is not resident on the redistributor VMAPP/VMOVP named).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DoorbellFor {
    /// The vCPU is blocked (WFI): wake it, cause `Doorbell`.
    Wake,
    /// The vCPU is runnable but descheduled (e.g. preempted by another
    /// vCPU): expected under GICv4.0, and no wake: loading it makes its vPE
    /// resident, and the redistributor then rescans the pending table. Not
    /// a wake in Credit2 terms either (it is already on a runqueue).
    Runnable,
    /// Truly spurious: the vCPU is running (its vPE is in the short
    /// non-resident window of a load, a put or a WFI's check, whose own
    /// check of `vlpi_pending` covers it) or offline. Nothing to do.
    Spurious,
}

/// Classifies a doorbell by the target vCPU's scheduler state (`None`: no
/// such vCPU).
pub fn doorbell_for(state: Option<crate::sched::RunState>) -> DoorbellFor {
    use crate::sched::RunState;
    match state {
        Some(RunState::Blocked) => DoorbellFor::Wake,
        Some(RunState::Runnable) => DoorbellFor::Runnable,
        Some(RunState::Running(_) | RunState::Offline) | None => DoorbellFor::Spurious,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::its::cmd::Command as C;
    use crate::its::gicr::TYPER_VLPIS;

    fn qemu_v4() -> V4Probe {
        // QEMU 7.2 gic-version=4: Physical, Virtual, VMOVP, CIL; ArchRev 4.
        let typer = (GITS_TYPER::Physical::SET + GITS_TYPER::Virtual::SET + GITS_TYPER::VMOVP::SET).value;
        V4Probe {
            its_arch_rev: 4,
            its_typer: typer,
            gicr_typers: alloc::vec![TYPER_VLPIS | 1; 2],
            ich_vtr: 0x9000_0003,
        }
    }

    #[test]
    fn direct_only_when_its_every_redistributor_and_cpu_interface_agree() {
        let p = qemu_v4();
        assert_eq!(choose_path(&p, true), LpiPath::Direct);
        assert_eq!(choose_path(&p, false), LpiPath::Emulated(EmulatedWhy::Disabled));
        let gicv3 = V4Probe { its_arch_rev: 3, its_typer: 1, ..p.clone() };
        assert_eq!(choose_path(&gicv3, true), LpiPath::Emulated(EmulatedWhy::NoVirtualIts));
        let no_virtual = V4Probe { its_typer: 1, ..p.clone() };
        assert_eq!(choose_path(&no_virtual, true), LpiPath::Emulated(EmulatedWhy::NoVirtualIts));
        let mut one_rd = p.clone();
        one_rd.gicr_typers[1] = 1;
        assert_eq!(choose_path(&one_rd, true), LpiPath::Emulated(EmulatedWhy::NoVlpis(1)));
        let none = V4Probe { gicr_typers: alloc::vec![], ..p.clone() };
        assert_eq!(choose_path(&none, true), LpiPath::Emulated(EmulatedWhy::NoVlpis(0)));
        let nv4 = V4Probe { ich_vtr: p.ich_vtr | ICH_VTR_NV4, ..p.clone() };
        assert_eq!(choose_path(&nv4, true), LpiPath::Emulated(EmulatedWhy::CpuInterface));
        // GICv4.1 (FVP has-gicv4.1): detected and named, not relied on.
        let vsgi = V4Probe { its_typer: p.its_typer | GITS_TYPER::VSGI::SET.value, ..p.clone() };
        assert!(vsgi.is_v41() && !p.is_v41());
        assert_eq!(choose_path(&vsgi, true), LpiPath::Emulated(EmulatedWhy::GicV41));
        let mut rvpeid = p.clone();
        rvpeid.gicr_typers[0] |= GICR_TYPER_RVPEID;
        assert_eq!(choose_path(&rvpeid, true), LpiPath::Emulated(EmulatedWhy::GicV41));
    }

    pub(crate) fn two_vpes() -> VpeMap {
        VpeMap::new(alloc::vec![Vpe { vpe: 0, doorbell: 8200 }, Vpe { vpe: 1, doorbell: 8201 }])
    }

    #[test]
    fn guest_mapping_changes_become_v_commands_with_the_target_vpe_and_its_doorbell() {
        let m = two_vpes();
        let map = |vintid, vcpu| plan(GuestChange::Map { device: 8, event: 3, vintid, vcpu }, &m);
        assert_eq!(
            map(8195, Some(1)).unwrap(),
            [C::Vmapti { device: 8, event: 3, vpe: 1, vintid: 8195, doorbell: 8201 }, C::Vsync { vpe: 1 }]
        );
        // An unmapped collection: vCPU 0's vPE (as the emulated backend).
        assert_eq!(
            map(8195, None).unwrap()[0],
            C::Vmapti { device: 8, event: 3, vpe: 0, vintid: 8195, doorbell: 8200 }
        );
        let mapi = plan(GuestChange::Map { device: 8, event: 8192, vintid: 8192, vcpu: Some(0) }, &m).unwrap();
        assert_eq!(mapi[0], C::Vmapi { device: 8, event: 8192, vpe: 0, doorbell: 8200 });
        // Bad input: a vCPU the VM lacks, a vINTID outside the vPE's range.
        assert_eq!(map(8195, Some(2)), Err(VlpiError::NoSuchVcpu(2)));
        assert_eq!(map(8191, Some(0)), Err(VlpiError::BadVintid(8191)));
        assert_eq!(map(1 << 14, Some(0)), Err(VlpiError::BadVintid(16384)));
        assert_eq!(
            plan(GuestChange::Move { device: 8, event: 3, from: Some(0), to: Some(1) }, &m).unwrap(),
            [
                C::Vmovi { device: 8, event: 3, vpe: 1, set_doorbell: true, doorbell: 8201 },
                C::Vsync { vpe: 0 },
                C::Vsync { vpe: 1 }
            ]
        );
        assert!(plan(GuestChange::Move { device: 8, event: 3, from: None, to: Some(0) }, &m).unwrap().is_empty());
        assert_eq!(
            plan(GuestChange::Move { device: 8, event: 3, from: Some(0), to: Some(5) }, &m),
            Err(VlpiError::NoSuchVcpu(5))
        );
        let one = |c| plan(c, &m).unwrap();
        assert_eq!(
            one(GuestChange::Unmap { device: 8, event: 3, vcpu: Some(1) }),
            [C::Discard { device: 8, event: 3 }, C::Vsync { vpe: 1 }]
        );
        assert_eq!(
            one(GuestChange::Inv { device: 8, event: 3, vcpu: Some(1) }),
            [C::Inv { device: 8, event: 3 }, C::Vsync { vpe: 1 }]
        );
        assert_eq!(one(GuestChange::Invall { vcpu: 0 }), [C::Vinvall { vpe: 0 }, C::Vsync { vpe: 0 }]);
        assert_eq!(
            one(GuestChange::Int { device: 8, event: 3, vcpu: Some(0) }),
            [C::Int { device: 8, event: 3 }, C::Vsync { vpe: 0 }]
        );
        assert_eq!(
            one(GuestChange::Clear { device: 8, event: 3, vcpu: Some(0) }),
            [C::Clear { device: 8, event: 3 }, C::Vsync { vpe: 0 }]
        );
        assert_eq!(plan(GuestChange::Invall { vcpu: 9 }, &m), Err(VlpiError::NoSuchVcpu(9)));
        // Every planned command encodes to what decodes back (no truncation).
        for c in map(8195, Some(1)).unwrap() {
            assert_eq!(C::decode(c.encode()), Ok(c));
        }
    }

    #[test]
    fn vmapp_and_vmovp_name_the_pending_table_and_the_redistributor() {
        assert_eq!(
            vmapp(3, 1, 0x4567_0000),
            [C::Vmapp { vpe: 3, rdbase: 1, vpt_addr: 0x4567_0000, vpt_size: 13, valid: true }, C::Vsync { vpe: 3 }]
        );
        let typer = qemu_v4().its_typer;
        assert_eq!(vmovp(3, 0, typer, 0)[0], C::Vmovp { sequence: 0, its_list: 0, vpe: 3, rdbase: 0 });
        let no_vmovp = typer & !GITS_TYPER::VMOVP::SET.value;
        assert_eq!(vmovp(3, 0, no_vmovp, 2)[0], C::Vmovp { sequence: 0, its_list: 4, vpe: 3, rdbase: 0 });
        assert_eq!(needs_vmovp(0, 0), None);
        assert_eq!(needs_vmovp(0, 1), Some(1));
    }

    #[test]
    fn the_vpe_table_is_one_flat_page_and_pending_tables_fit_their_alignment() {
        use crate::its::host::{plan_table, PageSize};
        // QEMU's vPE table entries are 16 bytes; 2^8 vPEs.
        for (entry, page) in [(16, PageSize::K64), (16, PageSize::K4), (8, PageSize::K4)] {
            let p = plan_table(entry, VPE_ID_BITS, page, false).unwrap();
            assert_eq!((p.indirect, p.bytes), (false, page.bytes()), "{entry} bytes on {page:?}");
        }
        assert!(VPT_BYTES <= VPT_ALIGN && VPT_ALIGN.is_power_of_two());
        // VMAPP's VPT_size covers exactly the vINTIDs the vGIC gives the guest.
        let C::Vmapp { vpt_size, .. } = vmapp(0, 0, 0)[0] else { unreachable!() };
        assert_eq!(1usize << (vpt_size + 1), VPT_BYTES * 8);
    }

    #[test]
    fn residency_registers() {
        let p = LocalRegisterCopy::<u64, GICR_VPROPBASER::Register>::new(vpropbaser(0x4800_0000, 16, true).unwrap());
        assert_eq!(p.read(GICR_VPROPBASER::Physical_Address) << 12, 0x4800_0000);
        assert_eq!(p.read(GICR_VPROPBASER::IDbits), 13, "capped at the 14 bits of the pending table");
        assert_eq!(p.read(GICR_VPROPBASER::Shareability), 1);
        assert_eq!(vpropbaser(0x4800_0000, 13, true), None, "13 bits hold no LPI");
        let on = vpendbaser(0x4123_0000, true, true);
        let r = LocalRegisterCopy::<u64, GICR_VPENDBASER::Register>::new(on);
        assert!(r.is_set(GICR_VPENDBASER::Valid));
        assert_eq!(r.read(GICR_VPENDBASER::Physical_Address) << 16, 0x4123_0000);
        assert!(!LocalRegisterCopy::<u64, GICR_VPENDBASER::Register>::new(vpendbaser(0x4123_0000, false, false))
            .is_set(GICR_VPENDBASER::Valid));
        assert_eq!(residency(1 << 60), Residency::Dirty);
        assert_eq!(residency(1 << 61), Residency::Settled { valid: false, pending_last: true });
        assert_eq!(residency(on), Residency::Settled { valid: true, pending_last: false });
        assert_eq!(VPT_BYTES, 2048);
        assert_eq!(VPROP_TABLE_BYTES, 8192);
    }

    #[test]
    fn doorbell_classes() {
        use crate::sched::RunState;
        assert_eq!(doorbell_for(Some(RunState::Blocked)), DoorbellFor::Wake);
        assert_eq!(doorbell_for(Some(RunState::Runnable)), DoorbellFor::Runnable, "descheduled: expected, no wake");
        assert_eq!(doorbell_for(Some(RunState::Running(1))), DoorbellFor::Spurious);
        assert_eq!(doorbell_for(Some(RunState::Offline)), DoorbellFor::Spurious);
        assert_eq!(doorbell_for(None), DoorbellFor::Spurious);
    }
}
