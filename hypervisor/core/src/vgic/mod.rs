//! The virtual GICv3: a portable model of the distributor and redistributors a
//! guest sees, plus the bridge to the hardware list registers.
//!
//! # What the guest sees
//!
//! A GICv3 (ArchRev 3 even on GICv4 hosts) with affinity routing always on,
//! one security state (GICD_CTLR.DS reads 1, as KVM presents it), `nr_spis`
//! SPIs, LPIs only when [`VgicConfig::lpis`] is set (INTIDs 8192..=16383, see
//! the `lpi` module; the virtual ITS that injects them lives apart), no
//! DirectLPI, and one redistributor per vCPU at a 128 KiB stride
//! (RD_base, then SGI_base at +64 KiB). Every interrupt is treated as Group 1:
//! IGROUPR/IGRPMODR are stored for read-back only, list registers always carry
//! Group = 1, and delivery is gated by GICD_CTLR.EnableGrp1 (bit 1, which Linux
//! sets as "EnableGrp1A"). That gate applies to SGIs and PPIs too, as in KVM.
//! GICR_WAKER reads as zero (ProcessorSleep and ChildrenAsleep clear) and
//! ignores writes, as KVM presents it: a virtual redistributor has no power
//! state of its own, so delivery never waits for the guest's wake handshake
//! (a guest that never writes GICR_WAKER still gets its interrupts).
//!
//! # Who calls what
//!
//! This module is plain data plus logic; the EL2 code owns a spin lock around
//! one [`Vgic`] per VM and calls:
//! * [`Vgic::decode`] / [`Vgic::mmio_read`] / [`Vgic::mmio_write`] for
//!   stage-2 data aborts in the GIC windows;
//! * [`Vgic::set_level`], [`Vgic::inject_edge`], [`Vgic::send_sgi`] for
//!   interrupt sources (emulated devices, forwarded physical IRQs, trapped
//!   ICC_SGI1R_EL1 writes);
//! * with LPIs, from the virtual ITS: [`Vgic::inject_lpi`],
//!   [`Vgic::clear_lpi`], [`Vgic::move_lpi`], [`Vgic::set_lpi_config`] (INV)
//!   and [`Vgic::load_lpi_config`] (INVALL); after every `mmio_write` the
//!   caller takes [`Vgic::take_lpi_enable_events`] and loads the
//!   configuration table of each vCPU that just set EnableLPIs;
//! * [`Vgic::sync_lrs`] on **every** exit of a vCPU (before emulating the trap),
//!   and [`Vgic::flush_lrs`] on every entry. Between those two calls the
//!   interrupts in that vCPU's list registers belong to the hardware; the model
//!   remembers that they are "in flight" so no other vCPU gets them.
//!
//! Every call that may make an interrupt deliverable returns [`Kicks`]: the
//! vCPUs to wake (if blocked in WFI) or to IPI (if running, so they exit,
//! sync and re-flush their list registers).
//!
//! # List registers
//!
//! `sync_lrs` folds every LR this model filled back into the model and zeroes
//! it; `flush_lrs` then fills empty LRs with the highest-priority work, active
//! interrupts first (so the guest can always deactivate what it acknowledged).
//! Level-sensitive software interrupts get LR.EOI = 1, so the guest's
//! deactivation raises a maintenance interrupt and the line is resampled on
//! the following sync. Forwarded hardware interrupts get LR.HW = 1 with the
//! physical INTID; their deactivation reaches the physical GIC directly, and
//! an HW LR found empty on sync is simply done (never re-pended).
//!
//! Guest writes that change the state of an interrupt currently sitting in a
//! running vCPU's LRs (ICPENDR, ICACTIVER, ISACTIVER, ICENABLER) are recorded
//! and applied when that vCPU syncs; the owner is returned in `Kicks` so that
//! happens promptly. Until then, reads show the state as it was flushed.
//!
//! # Integration checklist (EL2 side)
//!
//! * Exit: save all `ICH_LR<n>_EL2` into a `[u64; nr_lrs]`, write
//!   ICH_HCR_EL2 = 0 (this also silences maintenance interrupts while EL2 runs),
//!   then `sync_lrs(vcpu, &mut lrs)` under the lock; kick what it returns.
//! * Trap handling: `mmio_*`, `send_sgi` (trapped ICC_SGI1R_EL1 writes), device
//!   `set_level`/`inject_edge`; IPI/wake every vCPU in the returned `Kicks`.
//!   A WFI blocks only if `has_deliverable(vcpu)` is false.
//! * Entry: `flush_lrs(vcpu, &mut lrs)`, write every LR back, then
//!   ICH_HCR_EL2 = En | (UIE if `overflow`). EOI maintenance needs no enable
//!   bit; the maintenance PPI (INTID 25) handler only has to let the vCPU exit
//!   (the exit path above does the rest). UIE fires when at most one LR is
//!   valid, so it needs at least two list registers to be useful.
//! * Forwarded SPIs: `set_hw(intid, Some(pintid))`, physical EOImode = 1; on the
//!   physical IRQ do a priority drop only (ICC_EOIR1) and call `inject_edge`;
//!   the guest's deactivation deactivates the physical interrupt. Program the
//!   physical route from `route_of(intid)` after IROUTER writes. If a
//!   guest ends the pending or active state of a forwarded interrupt with an
//!   ICPENDR/ICACTIVER write (distributor or redistributor), no HW list
//!   register deactivates the physical one: the model reports it, and after
//!   every `sync_lrs` and `mmio_write` the caller takes
//!   [`Vgic::take_hw_deactivations`] and deactivates each physical interrupt
//!   (an SPI in the distributor, a PPI on the pCPU where that vCPU runs).
//! * The trigger of a forwarded SPI is the guest's: a GICD_ICFGR write that
//!   changes it is reported by [`Vgic::take_hw_triggers`] (physical INTID,
//!   edge), and the caller programs the physical GICD_ICFGR (an ACPI Dom0
//!   learns its devices' triggers from the DSDT, the hypervisor does not).
//!
//! The model never panics on guest input: every index is checked, bad access
//! sizes give [`VgicError::BadAccessSize`], reserved offsets read as zero and
//! ignore writes.

pub mod its;
mod lpi;
#[cfg(test)]
mod lpi_tests;
mod lr;
mod mmio;
pub mod regs;
#[cfg(test)]
mod tests;

use crate::intid::IntId;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

pub use lpi::{LPI_BASE, LPI_CONFIG_ENABLE, LPI_CONFIG_PRIORITY, LPI_ID_BITS, NR_LPIS};
pub use lr::{encode_lr, FlushResult};
use regs::*;

/// The most list registers any GICv3 implementation has (ICH_VTR_EL2.ListRegs + 1 ≤ 16).
pub const NUM_LRS_MAX: usize = 16;
/// The fewest list registers the flush protocol works with: on overflow it
/// sets ICH_HCR_EL2.UIE, whose maintenance interrupt fires while at most one
/// LR is valid, so with a single LR it would fire on every entry before the
/// guest could run (and deactivate what fills the LR).
pub const NUM_LRS_MIN: usize = 2;

/// How many list registers to use on a CPU that implements `implemented`
/// (ICH_VTR_EL2.ListRegs + 1), or an error when it has too few.
pub fn usable_lrs(implemented: usize) -> Result<usize, VgicError> {
    if implemented < NUM_LRS_MIN {
        return Err(VgicError::TooFewListRegisters(implemented));
    }
    Ok(implemented.min(NUM_LRS_MAX))
}
/// How many `ICH_AP0R<n>_EL2` (and as many `ICH_AP1R<n>_EL2`) registers hold
/// a vCPU's active priorities on a CPU whose ICH_VTR_EL2 is `vtr`: one
/// 32-bit register per 32 preemption levels, so 1 for 5 preemption bits
/// (PREbits + 1), 2 for 6 and 4 for 7 (the architecture's maximum). Every
/// one of them is the vCPU's state and must be switched with it: a guest
/// using more than 32 preemption levels has active priorities in `AP<n>R1`-3
/// too.
pub fn active_priority_regs(vtr: u64) -> usize {
    let pre_bits = ((vtr >> 26) & 0x7) + 1;
    1 << pre_bits.saturating_sub(5).min(2)
}

/// The most vCPUs one vGIC serves (size of [`Kicks`]).
pub const MAX_VCPUS: usize = 256;
/// Largest number of SPIs (INTIDs 32..=1019).
pub const MAX_SPIS: u32 = 988;
/// Number of private interrupts (SGIs 0..15, PPIs 16..31) per vCPU.
pub const NR_PRIVATE: u32 = 32;

/// Static description of a VM's interrupt controller.
#[derive(Clone, Debug)]
pub struct VgicConfig {
    /// Guest-physical base of the distributor (64 KiB).
    pub gicd_base: u64,
    /// Guest-physical base of the first redistributor (128 KiB per vCPU).
    pub gicr_base: u64,
    /// Number of SPIs; rounded up to a multiple of 32, at most [`MAX_SPIS`].
    pub nr_spis: u32,
    /// The MPIDR_EL1 value each vCPU sees (VMPIDR_EL2), indexed by vCPU number.
    pub vcpu_mpidrs: Vec<u64>,
    /// Whether the guest sees LPIs (GICD_TYPER.LPIS, GICR_TYPER.PLPIS,
    /// EnableLPIs, PROPBASER/PENDBASER): INTIDs [`LPI_BASE`] up to
    /// 2^[`LPI_ID_BITS`] - 1, injected by a virtual ITS. `false` presents a
    /// GICv3 without LPIs.
    pub lpis: bool,
}

/// Errors the caller turns into guest aborts or reports as bugs.
#[derive(thiserror::Error, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VgicError {
    /// The access size or alignment does not fit the register (inject an abort).
    #[error("bad GIC access size or alignment")]
    BadAccessSize,
    /// The INTID does not exist in this vGIC or is not valid for the call.
    #[error("bad interrupt: {0}")]
    BadIntid(IntId),
    /// No such vCPU.
    #[error("bad vCPU {0}")]
    BadVcpu(usize),
    /// The address is not inside a GIC frame of this VM, or a configuration
    /// value is out of range.
    #[error("out of range")]
    OutOfRange,
    /// The CPU interface has fewer list registers than [`NUM_LRS_MIN`].
    #[error("the GIC CPU interface has {0} list register(s); at least {NUM_LRS_MIN} are needed")]
    TooFewListRegisters(usize),
    /// The vGIC has no LPIs, or this vCPU's GICR_CTLR.EnableLPIs is 0.
    #[error("LPIs are not enabled on vCPU {0}")]
    LpisDisabled(usize),
    /// A guest table (the LPI configuration table) is not readable guest RAM.
    #[error("LPI table at {gpa:#x} ({len} bytes) is not guest RAM")]
    TableOutsideRam { gpa: u64, len: u64 },
}

/// Which emulated frame an address falls in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmioTarget {
    Distributor,
    /// The redistributor of this vCPU (offset is within its 128 KiB).
    Redistributor(usize),
}

/// A set of vCPUs that the caller must wake or interrupt.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Kicks {
    bits: [u64; MAX_VCPUS / 64],
}

impl Kicks {
    /// The empty set.
    pub const fn none() -> Self {
        Kicks { bits: [0; MAX_VCPUS / 64] }
    }
    /// Adds `vcpu` (ignored when ≥ [`MAX_VCPUS`]).
    pub fn add(&mut self, vcpu: usize) {
        if let Some(w) = self.bits.get_mut(vcpu / 64) {
            *w |= 1 << (vcpu % 64);
        }
    }
    /// Whether `vcpu` is in the set.
    pub fn contains(&self, vcpu: usize) -> bool {
        self.bits.get(vcpu / 64).is_some_and(|w| w & (1 << (vcpu % 64)) != 0)
    }
    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|&w| w == 0)
    }
    /// Adds every member of `other`.
    pub fn merge(&mut self, other: Kicks) {
        for (a, b) in self.bits.iter_mut().zip(other.bits) {
            *a |= b;
        }
    }
    /// The members, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..MAX_VCPUS).filter(move |&v| self.contains(v))
    }
}

impl fmt::Debug for Kicks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// A forwarded (HW) interrupt whose virtual pending and active state the
/// guest ended with an ICPENDR/ICACTIVER write rather than through a HW list
/// register: the physical interrupt is still active and, unless the caller
/// deactivates it, the device or timer behind it never interrupts again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HwDeactivation {
    /// For a private interrupt, the vCPU it belongs to (its physical twin is
    /// active on the pCPU that runs that vCPU); for an SPI, the vCPU whose
    /// state it was.
    pub vcpu: usize,
    /// The virtual INTID.
    pub intid: IntId,
    /// The physical INTID to deactivate.
    pub pintid: IntId,
}

/// Sentinel for "no vCPU" in compact u16 fields.
const NO_VCPU: u16 = u16::MAX;
/// Sentinel for an empty list-register shadow slot.
const NO_INTID: u32 = u32::MAX;

/// State of one interrupt (one per SPI, one per private INTID per vCPU).
///
/// While `in_lr` names a vCPU, the pending/active state the model put into the
/// list register belongs to the hardware: `lr_pend` and `active` are snapshots
/// of what was written, `latch` collects pending edges that arrived since,
/// and `clr_pend`/`clr_act`/`set_act` record guest MMIO writes to apply at sync.
#[derive(Clone, Copy, Debug)]
struct Irq {
    priority: u8,
    enabled: bool,
    group1: bool,
    grpmod: bool,
    /// ICFGR: true = edge-triggered.
    edge: bool,
    /// Pending latch: edge pending, or ISPENDR / inject on a level interrupt.
    latch: bool,
    /// Input line level (level-sensitive sources).
    line: bool,
    active: bool,
    /// Physical INTID when forwarded as a hardware interrupt (an SGI, PPI
    /// or SPI: [`Vgic::set_hw_private`] checks).
    hw: Option<IntId>,
    /// vCPU whose list registers hold this interrupt.
    in_lr: u16,
    /// For SPIs: the vCPU it was last active on.
    active_on: u16,
    lr_pend: bool,
    lr_latch: bool,
    clr_pend: bool,
    clr_act: bool,
    set_act: bool,
}

impl Irq {
    const fn reset(edge: bool) -> Self {
        Irq {
            priority: 0,
            enabled: false,
            group1: false,
            grpmod: false,
            edge,
            latch: false,
            line: false,
            active: false,
            hw: None,
            in_lr: NO_VCPU,
            active_on: NO_VCPU,
            lr_pend: false,
            lr_latch: false,
            clr_pend: false,
            clr_act: false,
            set_act: false,
        }
    }

    /// Level semantics apply (line sampled): a level-configured software interrupt.
    fn is_sw_level(&self) -> bool {
        !self.edge && self.hw.is_none()
    }

    /// Pending state held by the model (excluding what sits in an LR).
    fn model_pending(&self) -> bool {
        self.latch || (self.is_sw_level() && self.line)
    }

    fn in_flight(&self) -> bool {
        self.in_lr != NO_VCPU
    }

    /// Nothing can make it a list-register candidate without a change to
    /// it: not pending in any way, not active, not in a list register.
    fn idle(&self) -> bool {
        !self.latch && !self.line && !self.active && !self.in_flight()
    }

    /// Pending as the guest should see it.
    fn pending_view(&self) -> bool {
        self.model_pending() || (self.in_flight() && self.lr_pend && !self.clr_pend)
    }

    /// Active as the guest should see it.
    fn active_view(&self) -> bool {
        if self.in_flight() {
            self.set_act || (self.active && !self.clr_act)
        } else {
            self.active
        }
    }
}

/// Per-vCPU state: affinity, private interrupts, and which INTID each list
/// register slot holds.
/// The set bits of `x`, lowest first (a bitmap word of any width, widened).
pub(super) fn set_bits(mut x: u128) -> impl Iterator<Item = usize> {
    core::iter::from_fn(move || {
        if x == 0 {
            return None;
        }
        let b = x.trailing_zeros() as usize;
        x &= x - 1;
        Some(b)
    })
}

#[derive(Clone, Debug)]
struct VcpuState {
    mpidr: u64,
    private: [Irq; NR_PRIVATE as usize],
    /// One bit per private interrupt that may not be idle, as `spi_live`.
    private_live: u32,
    lr_shadow: [u32; NUM_LRS_MAX],
    /// This redistributor's LPI registers and pending LPIs.
    lpi: lpi::LpiRedist,
}

/// The virtual GICv3 of one VM.
pub struct Vgic {
    gicd_base: u64,
    gicr_base: u64,
    nr_spis: u32,
    ctlr: u32,
    vcpus: Vec<VcpuState>,
    spis: Vec<Irq>,
    /// One bit per SPI that may not be idle: set whenever the SPI is changed
    /// (every change goes through `irq_mut`), cleared by `flush_lrs` once it
    /// finds the SPI idle. The entry and WFI paths look at these SPIs only,
    /// not at all of them (up to 988 on an ACPI Dom0).
    spi_live: Vec<u64>,
    irouter: Vec<u64>,
    /// Cached delivery target of each SPI (from IROUTER).
    spi_target: Vec<u16>,
    /// Physical deactivations the caller has not taken yet (one entry per
    /// interrupt at most, so bounded by the number of HW interrupts).
    hw_deactivations: Vec<HwDeactivation>,
    /// Forwarded SPIs whose trigger the guest changed, as (physical INTID,
    /// edge), not taken yet (one entry per SPI at most).
    hw_triggers: Vec<(IntId, bool)>,
    /// Whether LPIs exist (`VgicConfig::lpis`).
    lpis: bool,
    /// One configuration byte per LPI (priority in bits \[7:2\], Enable in
    /// bit 0), shared by all redistributors: [`NR_LPIS`] bytes with LPIs,
    /// empty without.
    lpi_config: Vec<u8>,
    /// vCPUs whose EnableLPIs went 0 -> 1 since the caller last asked (each
    /// at most once, so bounded by the number of vCPUs).
    lpi_enable_events: Vec<usize>,
}

impl Vgic {
    /// Builds a vGIC in its reset state. Out-of-range configuration values are
    /// clamped: `nr_spis` rounded up to a multiple of 32 and capped at
    /// [`MAX_SPIS`], vCPUs beyond [`MAX_VCPUS`] dropped. Use [`Vgic::try_new`]
    /// to get an error instead.
    pub fn new(cfg: VgicConfig) -> Self {
        let nr_spis = cfg.nr_spis.div_ceil(32).saturating_mul(32).min(MAX_SPIS);
        let nr_vcpus = cfg.vcpu_mpidrs.len().min(MAX_VCPUS);
        let mut private = [Irq::reset(false); NR_PRIVATE as usize];
        for sgi in private.iter_mut().take(16) {
            sgi.edge = true;
        }
        let vcpus = cfg.vcpu_mpidrs[..nr_vcpus]
            .iter()
            .map(|&mpidr| VcpuState {
                mpidr,
                private,
                private_live: u32::MAX,
                lr_shadow: [NO_INTID; NUM_LRS_MAX],
                lpi: lpi::LpiRedist::new(cfg.lpis),
            })
            .collect();
        let mut v = Vgic {
            gicd_base: cfg.gicd_base,
            gicr_base: cfg.gicr_base,
            nr_spis,
            ctlr: 0,
            vcpus,
            spis: vec![Irq::reset(false); nr_spis as usize],
            spi_live: vec![0; (nr_spis as usize).div_ceil(64)],
            irouter: vec![0; nr_spis as usize],
            spi_target: vec![NO_VCPU; nr_spis as usize],
            hw_deactivations: Vec::new(),
            hw_triggers: Vec::new(),
            lpis: cfg.lpis,
            lpi_config: if cfg.lpis { vec![0; NR_LPIS as usize] } else { Vec::new() },
            lpi_enable_events: Vec::new(),
        };
        v.retarget_all();
        v
    }

    /// Like [`Vgic::new`] but rejects configurations it would have to clamp.
    pub fn try_new(cfg: VgicConfig) -> Result<Self, VgicError> {
        if cfg.nr_spis > MAX_SPIS
            || cfg.vcpu_mpidrs.is_empty()
            || cfg.vcpu_mpidrs.len() > MAX_VCPUS
            || !cfg.gicd_base.is_multiple_of(GICD_SIZE)
            || !cfg.gicr_base.is_multiple_of(GICR_STRIDE)
        {
            return Err(VgicError::OutOfRange);
        }
        Ok(Self::new(cfg))
    }

    /// Number of vCPUs (redistributors).
    pub fn nr_vcpus(&self) -> usize {
        self.vcpus.len()
    }

    /// Number of SPIs (after rounding).
    pub fn nr_spis(&self) -> u32 {
        self.nr_spis
    }

    /// One past the highest valid INTID.
    pub fn nr_irqs(&self) -> u32 {
        NR_PRIVATE + self.nr_spis
    }

    /// Size of the redistributor region (all vCPUs).
    pub fn gicr_size(&self) -> u64 {
        self.vcpus.len() as u64 * GICR_STRIDE
    }

    /// The guest-physical frames the vGIC emulates, as `(base, size)`: the
    /// distributor, then the redistributors of all vCPUs (what a VM's MMIO
    /// bus registers; [`Vgic::decode`] answers inside them).
    pub fn frames(&self) -> [(u64, u64); 2] {
        [(self.gicd_base, GICD_SIZE), (self.gicr_base, self.gicr_size())]
    }

    /// Whether `ipa` falls in the distributor or a redistributor frame, and at
    /// which offset (within the 64 KiB GICD frame or the vCPU's 128 KiB GICR).
    pub fn decode(&self, ipa: u64) -> Option<(MmioTarget, u64)> {
        if let Some(off) = ipa.checked_sub(self.gicd_base) {
            if off < GICD_SIZE {
                return Some((MmioTarget::Distributor, off));
            }
        }
        let off = ipa.checked_sub(self.gicr_base)?;
        let idx = off / GICR_STRIDE;
        if idx < self.vcpus.len() as u64 {
            return Some((MmioTarget::Redistributor(idx as usize), off % GICR_STRIDE));
        }
        None
    }

    // ---- interrupt lookup ----

    fn irq(&self, vcpu: usize, intid: u32) -> Option<&Irq> {
        if intid < NR_PRIVATE {
            self.vcpus.get(vcpu)?.private.get(intid as usize)
        } else {
            self.spis.get((intid - NR_PRIVATE) as usize)
        }
    }

    fn irq_mut(&mut self, vcpu: usize, intid: u32) -> Option<&mut Irq> {
        if intid < NR_PRIVATE {
            let vs = self.vcpus.get_mut(vcpu)?;
            let irq = vs.private.get_mut(intid as usize)?;
            vs.private_live |= 1 << intid;
            Some(irq)
        } else {
            let i = (intid - NR_PRIVATE) as usize;
            let irq = self.spis.get_mut(i)?;
            self.spi_live[i / 64] |= 1 << (i % 64);
            Some(irq)
        }
    }

    /// Tests: every SPI that is not idle is in `spi_live` (what makes
    /// skipping the others on entry correct).
    #[cfg(test)]
    pub(crate) fn assert_spi_live_covers_busy_spis(&self) {
        for (i, irq) in self.spis.iter().enumerate() {
            let live = self.spi_live[i / 64] & (1 << (i % 64)) != 0;
            assert!(live || irq.idle(), "SPI {} is busy but not live: {irq:?}", NR_PRIVATE as usize + i);
        }
    }

    /// Tests: every busy private interrupt is in its vCPU's `private_live`.
    #[cfg(test)]
    pub(crate) fn assert_private_live_covers_busy(&self) {
        for (v, vs) in self.vcpus.iter().enumerate() {
            for (i, irq) in vs.private.iter().enumerate() {
                assert!(vs.private_live & (1 << i) != 0 || irq.idle(), "vCPU {v} INTID {i} busy but not live: {irq:?}");
            }
        }
    }

    /// Indices (into `spis`) of the SPIs that may not be idle.
    fn live_spis(&self) -> impl Iterator<Item = usize> + '_ {
        self.spi_live.iter().enumerate().flat_map(|(w, &bits)| set_bits(bits.into()).map(move |i| w * 64 + i))
    }

    fn check_vcpu(&self, vcpu: usize) -> Result<(), VgicError> {
        if vcpu < self.vcpus.len() {
            Ok(())
        } else {
            Err(VgicError::BadVcpu(vcpu))
        }
    }

    fn grp1_enabled(&self) -> bool {
        self.ctlr & CTLR_ENABLE_GRP1 != 0
    }

    // ---- routing ----

    /// The vCPU an IROUTER value selects (see [`Vgic::route_of`]).
    fn compute_target(&self, router: u64) -> u16 {
        if router & IROUTER_IRM != 0 {
            return 0;
        }
        let want = router & AFFINITY_MASK;
        self.vcpus.iter().position(|v| v.mpidr & AFFINITY_MASK == want).map_or(NO_VCPU, |v| v as u16)
    }

    fn retarget(&mut self, spi_idx: usize) {
        if let Some(&r) = self.irouter.get(spi_idx) {
            let t = self.compute_target(r);
            if let Some(slot) = self.spi_target.get_mut(spi_idx) {
                *slot = t;
            }
        }
    }

    fn retarget_all(&mut self) {
        for i in 0..self.spis.len() {
            self.retarget(i);
        }
    }

    /// The vCPU an SPI is delivered to: the IROUTER target (IRM = 0), or with
    /// IRM = 1 vCPU 0 (any participating PE is allowed; the model picks one
    /// fixed vCPU so the route stays stable). `None` for non-SPIs and for IROUTER values that match no
    /// vCPU. Use it to set the physical affinity of a forwarded SPI.
    pub fn route_of(&self, intid: IntId) -> Option<usize> {
        self.route_of_raw(u32::from(intid))
    }

    /// [`Vgic::route_of`] for an index the model computed itself.
    fn route_of_raw(&self, intid: u32) -> Option<usize> {
        let idx = intid.checked_sub(NR_PRIVATE)? as usize;
        match *self.spi_target.get(idx)? {
            NO_VCPU => None,
            v => Some(v as usize),
        }
    }

    /// The vCPU that currently owns an interrupt's state: its LR holder, else
    /// (SPIs) the vCPU it is active on, else its route.
    fn owner(&self, ctx_vcpu: usize, intid: u32) -> Option<usize> {
        let irq = self.irq(ctx_vcpu, intid)?;
        if irq.in_flight() {
            return Some(irq.in_lr as usize);
        }
        if intid < NR_PRIVATE {
            return Some(ctx_vcpu);
        }
        if irq.active && irq.active_on != NO_VCPU {
            return Some(irq.active_on as usize);
        }
        self.route_of_raw(intid)
    }

    /// Whether this interrupt could be signalled to the vCPU that owns it now.
    fn deliverable(&self, irq: &Irq) -> bool {
        irq.pending_view() && !irq.active_view() && irq.enabled && self.grp1_enabled()
    }

    /// Kick the owner if the interrupt is deliverable to it, or if it sits in
    /// the owner's LRs (which must then be refreshed).
    fn kick_for(&self, ctx_vcpu: usize, intid: u32) -> Kicks {
        let mut k = Kicks::none();
        if let (Some(owner), Some(irq)) = (self.owner(ctx_vcpu, intid), self.irq(ctx_vcpu, intid)) {
            if irq.in_flight() || self.deliverable(irq) {
                k.add(owner);
            }
        }
        k
    }

    /// Every vCPU that has something deliverable (after global changes).
    fn kick_all_deliverable(&self) -> Kicks {
        let mut k = Kicks::none();
        for v in 0..self.vcpus.len() {
            if self.has_deliverable(v) {
                k.add(v);
            }
        }
        k
    }

    // ---- interrupt sources ----

    /// Checks a source's INTID and vCPU; returns the INTID as a model index.
    fn check_source_intid(&self, intid: IntId, vcpu: usize, allow_sgi: bool) -> Result<u32, VgicError> {
        let raw = u32::from(intid);
        if raw >= self.nr_irqs() || (!allow_sgi && intid.is_sgi()) {
            return Err(VgicError::BadIntid(intid));
        }
        if raw < NR_PRIVATE {
            self.check_vcpu(vcpu)?;
        }
        Ok(raw)
    }

    /// Drives the input line of a PPI or SPI (`vcpu_for_private` selects the
    /// PPI's vCPU; ignored for SPIs). On a level-configured software interrupt
    /// the line is the pending state (plus any ISPENDR latch). On an
    /// edge-configured or hardware-forwarded interrupt a rising level latches
    /// pending once.
    pub fn set_level(&mut self, intid: IntId, vcpu_for_private: usize, level: bool) -> Result<Kicks, VgicError> {
        let raw = self.check_source_intid(intid, vcpu_for_private, false)?;
        let Some(irq) = self.irq_mut(vcpu_for_private, raw) else {
            return Err(VgicError::BadIntid(intid));
        };
        let rising = level && !irq.line;
        irq.line = level;
        if rising && !irq.is_sw_level() {
            irq.latch = true;
        }
        Ok(self.kick_for(vcpu_for_private, raw))
    }

    /// Makes an interrupt pending (an edge, or a one-shot on a level
    /// interrupt, like an ISPENDR write). Use this for forwarded hardware
    /// interrupts too. SGIs are allowed (a pending SGI with no source).
    pub fn inject_edge(&mut self, intid: IntId, vcpu_for_private: usize) -> Result<Kicks, VgicError> {
        let raw = self.check_source_intid(intid, vcpu_for_private, true)?;
        let Some(irq) = self.irq_mut(vcpu_for_private, raw) else {
            return Err(VgicError::BadIntid(intid));
        };
        irq.latch = true;
        Ok(self.kick_for(vcpu_for_private, raw))
    }

    /// Maps (or with `None` unmaps) an SPI to a physical INTID: its LRs get
    /// HW = 1 and pINTID, so the guest's deactivation deactivates the physical
    /// interrupt. Errors for non-SPIs (use [`Vgic::set_hw_private`]) and for
    /// physical INTIDs ≥ 1020.
    pub fn set_hw(&mut self, intid: IntId, pintid: Option<IntId>) -> Result<(), VgicError> {
        if u32::from(intid) < NR_PRIVATE {
            return Err(VgicError::BadIntid(intid));
        }
        self.set_hw_private(0, intid, pintid)
    }

    /// Maps a private interrupt (e.g. the virtual timer PPI 27) of one vCPU,
    /// or an SPI (then `vcpu` is ignored), to a physical INTID.
    pub fn set_hw_private(&mut self, vcpu: usize, intid: IntId, pintid: Option<IntId>) -> Result<(), VgicError> {
        let raw = u32::from(intid);
        if raw < NR_PRIVATE {
            self.check_vcpu(vcpu)?;
        }
        if let Some(p) = pintid {
            // A HW list register's pINTID: an SGI, PPI or SPI (below 1020).
            if p >= IntId::SPECIAL_FIRST {
                return Err(VgicError::BadIntid(p));
            }
        }
        let irq = self.irq_mut(vcpu, raw).ok_or(VgicError::BadIntid(intid))?;
        irq.hw = pintid;
        Ok(())
    }

    /// Resamples the input line of a forwarded private interrupt whose
    /// source is a level (the virtual timer, injected with
    /// [`Vgic::inject_edge`] when the physical PPI fires). With `level` low,
    /// a pending state the guest has not acknowledged ends, as it does for a
    /// level-sensitive interrupt whose line drops; an active state stays (the
    /// guest's deactivation ends it). A high `level` changes nothing: the
    /// physical interrupt reports rising edges. An interrupt sitting in the
    /// vCPU's list registers belongs to the hardware and is left alone, so
    /// call this between `sync_lrs` and `flush_lrs`, or while the vCPU is
    /// not running. The physical interrupt is the caller's: afterwards it
    /// makes it active exactly when [`Vgic::is_pending_or_active`] says so
    /// (nothing goes to [`Vgic::take_hw_deactivations`]). Returns whether a
    /// pending state ended; errors for an interrupt that is not a forwarded
    /// PPI or SGI of `vcpu`.
    pub fn resample_hw_private(&mut self, vcpu: usize, intid: IntId, level: bool) -> Result<bool, VgicError> {
        self.check_vcpu(vcpu)?;
        let raw = u32::from(intid);
        if raw >= NR_PRIVATE {
            return Err(VgicError::BadIntid(intid));
        }
        let irq = self.irq_mut(vcpu, raw).ok_or(VgicError::BadIntid(intid))?;
        if irq.hw.is_none() {
            return Err(VgicError::BadIntid(intid));
        }
        if level || irq.in_flight() {
            return Ok(false);
        }
        irq.line = false;
        Ok(core::mem::take(&mut irq.latch))
    }

    /// Whether the guest enabled SPI `intid` (GICD_ISENABLER); false for
    /// other INTIDs.
    pub fn spi_enabled(&self, intid: IntId) -> bool {
        intid.is_spi() && self.irq(0, u32::from(intid)).is_some_and(|i| i.enabled)
    }

    /// The physical INTID an interrupt is forwarded from, if any.
    pub fn hw_of(&self, vcpu: usize, intid: IntId) -> Option<IntId> {
        self.irq(vcpu, u32::from(intid))?.hw
    }

    /// The physical interrupts to deactivate because the guest ended their
    /// virtual state without a HW list register (see [`HwDeactivation`]).
    /// Call after every `sync_lrs` and `mmio_write`; the list is then empty.
    pub fn take_hw_deactivations(&mut self) -> Vec<HwDeactivation> {
        core::mem::take(&mut self.hw_deactivations)
    }

    /// Forwarded SPIs whose trigger the guest changed through GICD_ICFGR
    /// since the last call, as (physical INTID, edge-triggered): the caller
    /// configures the physical SPI the same way. Call after `mmio_write`.
    pub fn take_hw_triggers(&mut self) -> Vec<(IntId, bool)> {
        core::mem::take(&mut self.hw_triggers)
    }

    /// Records that forwarded SPI `pintid` is now `edge` (or level).
    fn note_hw_trigger(&mut self, pintid: IntId, edge: bool) {
        match self.hw_triggers.iter_mut().find(|(p, _)| *p == pintid) {
            Some(t) => t.1 = edge,
            None => self.hw_triggers.push((pintid, edge)),
        }
    }

    /// Records that `intid` (forwarded from `pintid`) went idle behind the
    /// physical GIC's back.
    fn note_hw_deactivation(&mut self, vcpu: usize, intid: u32, pintid: IntId) {
        // Every model index is an INTID below 1020.
        let Ok(intid) = IntId::try_from(intid) else {
            return;
        };
        let d = HwDeactivation { vcpu, intid, pintid };
        if !self.hw_deactivations.contains(&d) {
            self.hw_deactivations.push(d);
        }
    }

    /// Emulates a write of `icc_sgi1r` to ICC_SGI1R_EL1 by `from_vcpu`:
    /// INTID\[27:24\]; IRM\[40\] = all but self; otherwise the vCPUs whose
    /// affinity is Aff3\[55:48\].Aff2\[39:32\].Aff1\[23:16\] and whose Aff0 is
    /// RS\[47:44\] * 16 + a bit index set in TargetList\[15:0\].
    pub fn send_sgi(&mut self, from_vcpu: usize, icc_sgi1r: u64) -> Result<Kicks, VgicError> {
        self.check_vcpu(from_vcpu)?;
        let intid = ((icc_sgi1r >> 24) & 0xF) as u32;
        let mut kicks = Kicks::none();
        let broadcast = icc_sgi1r & (1 << 40) != 0;
        let upper = ((icc_sgi1r >> 48) & 0xFF) << 32 // Aff3
            | ((icc_sgi1r >> 32) & 0xFF) << 16 // Aff2
            | ((icc_sgi1r >> 16) & 0xFF) << 8; // Aff1
        let rs = (icc_sgi1r >> 44) & 0xF;
        let list = icc_sgi1r & 0xFFFF;
        for v in 0..self.vcpus.len() {
            let target = if broadcast {
                v != from_vcpu
            } else {
                let mpidr = self.vcpus[v].mpidr;
                let aff0 = mpidr & 0xFF;
                mpidr & (AFFINITY_MASK & !0xFF) == upper && aff0 >> 4 == rs && list & (1 << (aff0 & 0xF)) != 0
            };
            if target {
                self.vcpus[v].private[intid as usize].latch = true;
                self.vcpus[v].private_live |= 1 << intid;
                kicks.merge(self.kick_for(v, intid));
            }
        }
        Ok(kicks)
    }

    /// Whether `intid` is pending or active for `vcpu` as the guest sees it.
    /// The EL2 code uses it when it loads a vCPU, to give a forwarded private
    /// interrupt (the virtual timer) the matching physical active state.
    pub fn is_pending_or_active(&self, vcpu: usize, intid: IntId) -> bool {
        if u32::from(intid) >= LPI_BASE {
            return self.lpi_pending(intid, vcpu);
        }
        self.irq(vcpu, u32::from(intid)).is_some_and(|i| i.pending_view() || i.active_view())
    }

    /// Whether `vcpu` has an interrupt that is pending, enabled, not active,
    /// in an enabled group and targeted at it.
    /// The priority mask is the CPU interface's business and not checked.
    /// Use it to decide whether WFI blocks (after `sync_lrs`).
    pub fn has_deliverable(&self, vcpu: usize) -> bool {
        let Some(vs) = self.vcpus.get(vcpu) else {
            return false;
        };
        if !self.grp1_enabled() {
            return false;
        }
        if set_bits(vs.private_live.into()).any(|i| self.deliverable(&vs.private[i])) {
            return true;
        }
        if self.lpi_has_deliverable(vcpu) {
            return true;
        }
        self.live_spis().any(|i| {
            let intid = NR_PRIVATE + i as u32;
            self.owner(vcpu, intid) == Some(vcpu) && self.deliverable(&self.spis[i])
        })
    }

    /// A human-readable summary of one vCPU's view (non-idle interrupts only).
    pub fn dump(&self, vcpu: usize) -> Dump<'_> {
        Dump { vgic: self, vcpu }
    }
}

/// Display adapter returned by [`Vgic::dump`].
pub struct Dump<'a> {
    vgic: &'a Vgic,
    vcpu: usize,
}

impl fmt::Display for Dump<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.vgic;
        let Some(vs) = g.vcpus.get(self.vcpu) else {
            return writeln!(f, "vgic: no vCPU {}", self.vcpu);
        };
        writeln!(
            f,
            "vgic vcpu{} mpidr={:#x} ctlr={:#x} lrs={:?}",
            self.vcpu,
            vs.mpidr,
            g.ctlr,
            vs.lr_shadow.iter().filter(|&&i| i != NO_INTID).collect::<Vec<_>>()
        )?;
        let mut line = |intid: u32, irq: &Irq| -> fmt::Result {
            if !(irq.pending_view() || irq.active_view() || irq.in_flight() || irq.line) {
                return Ok(());
            }
            write!(
                f,
                "  irq {intid:4} prio={:#04x} {}{}{}{}{}",
                irq.priority,
                if irq.enabled { "E" } else { "-" },
                if irq.pending_view() { "P" } else { "-" },
                if irq.active_view() { "A" } else { "-" },
                if irq.edge { "e" } else { "l" },
                if irq.line { "^" } else { "_" },
            )?;
            if let Some(p) = irq.hw {
                write!(f, " hw={}", u32::from(p))?;
            }
            if irq.in_flight() {
                write!(f, " in_lr=vcpu{}", irq.in_lr)?;
            }
            writeln!(f)
        };
        for (i, irq) in vs.private.iter().enumerate() {
            line(i as u32, irq)?;
        }
        for (i, irq) in g.spis.iter().enumerate() {
            let intid = NR_PRIVATE + i as u32;
            if g.owner(self.vcpu, intid) == Some(self.vcpu) {
                line(intid, irq)?;
            }
        }
        g.dump_lpis(f, self.vcpu)
    }
}
