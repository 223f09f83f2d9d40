//! The physical GICv3/v4 as the hypervisor uses it: the only code that
//! touches the distributor, the redistributors and the CPU interface.
//!
//! Distributor and redistributors are set up with the `arm-gic` crate; the
//! CPU interface runs with ICC_CTLR_EL1.EOImode = 1 so that a write to
//! ICC_EOIR1_EL1 only drops priority and a forwarded interrupt stays active
//! until the guest deactivates it through a HW=1 list register. The virtual
//! CPU interface (ICH_*_EL2) is reached through the accessors below; what to
//! put in the list registers is decided by the portable `vgic` model.
//!
//! The ITS and host LPIs are in [`its`]; `ack` counts the LPIs it takes
//! and `deactivate` leaves them alone (LPIs have no active state: the
//! priority drop of `eoi` ends them).
//!
//! Distributor accesses go through the `GIC` lock. A pCPU's own
//! redistributor SGI frame (the active state of its private interrupts)
//! is written without it: those registers are write-1-to-set/clear and only
//! that pCPU writes them.

pub mod its;

use super::sysreg::{
    self, ICC_BPR1_EL1, ICC_CTLR_EL1, ICC_DIR_EL1, ICC_EOIR1_EL1, ICC_IAR1_EL1, ICC_IGRPEN1_EL1, ICC_PMR_EL1,
    ICC_SGI1R_EL1,
};
use crate::intid::{IntId, IntIdKind};
use crate::regs;
use aarch64_cpu::registers::{
    ICC_SRE_EL2, ICH_AP0R0_EL2, ICH_AP1R0_EL2, ICH_HCR_EL2, ICH_LR0_EL2, ICH_LR10_EL2, ICH_LR11_EL2, ICH_LR12_EL2,
    ICH_LR13_EL2, ICH_LR14_EL2, ICH_LR15_EL2, ICH_LR1_EL2, ICH_LR2_EL2, ICH_LR3_EL2, ICH_LR4_EL2, ICH_LR5_EL2,
    ICH_LR6_EL2, ICH_LR7_EL2, ICH_LR8_EL2, ICH_LR9_EL2, ICH_VMCR_EL2, ICH_VTR_EL2, MPIDR_EL1,
};
use arm_gic::gicv3::GicV3;
use arm_gic::UniqueMmioPointer;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};
use spin::Mutex;
use tock_registers::interfaces::{Readable, Writeable};
use tock_registers::{register_bitfields, LocalRegisterCopy};

register_bitfields! {u64,
    /// Redistributor Type Register (RD_base + 0x8).
    GICR_TYPER [
        /// Aff3.Aff2.Aff1.Aff0 of the PE this redistributor serves.
        Affinity OFFSET(32) NUMBITS(32) [],
        /// The last redistributor frame of the region.
        /// The processor number ITS commands name with GITS_TYPER.PTA = 0.
        Processor_Number OFFSET(8) NUMBITS(16) [],
        Last OFFSET(4) NUMBITS(1) [],
        /// GICv4 virtual LPIs: the frame has two more 64 KiB pages.
        VLPIS OFFSET(1) NUMBITS(1) []
    ],

    /// Interrupt Routing Register for one SPI (GICD_IROUTER<n>).
    GICD_IROUTER [
        Aff3 OFFSET(32) NUMBITS(8) [],
        /// 1 = any participating PE (not used: SPIs follow their vCPU).
        IRM OFFSET(31) NUMBITS(1) [],
        Aff2 OFFSET(16) NUMBITS(8) [],
        Aff1 OFFSET(8) NUMBITS(8) [],
        Aff0 OFFSET(0) NUMBITS(8) []
    ]
}

/// Distributor offset of GICD_IROUTER<0>.
const GICD_IROUTER0: u64 = 0x6000;
/// Redistributor offset of GICR_TYPER.
const GICR_TYPER_OFF: u64 = 0x8;
/// The SGI_base frame follows the RD_base frame.
const GICR_SGI_BASE: u64 = 0x10000;
/// SGI_base offsets of GICR_ISACTIVER0 and GICR_ICACTIVER0.
const GICR_ISACTIVER0: u64 = 0x300;
const GICR_ICACTIVER0: u64 = 0x380;
/// Redistributor frame sizes: RD_base + SGI_base (+ VLPI_base + reserved).
const GICR_FRAME_V3: u64 = 0x20000;
const GICR_FRAME_V4: u64 = 0x40000;

pub struct PhysGic {
    gic: GicV3<'static>,
    gicd: u64,
    gicr: u64,
}

// SAFETY: the GIC registers are device memory shared by all CPUs and the
// driver holds no CPU-local state; every access to `PhysGic` goes through
// the `GIC` mutex, so moving it between CPUs is sound.
unsafe impl Send for PhysGic {}

static GIC: Mutex<Option<PhysGic>> = Mutex::new(None);

/// RD_base of each pCPU's redistributor, found by [`init_cpu`]; 0 = none.
/// [`init`] sizes it for the machine's pCPUs.
static RD_BASE: spin::Once<alloc::boxed::Box<[AtomicU64]>> = spin::Once::new();

/// pCPU `cpu`'s RD_base, 0 when unknown.
pub(super) fn rd_base(cpu: usize) -> u64 {
    RD_BASE.get().and_then(|r| r.get(cpu)).map_or(0, |r| r.load(Ordering::Acquire))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GicSetupError {
    /// The redistributor region could not be probed.
    Redistributor,
}

/// Sets up the distributor and every redistributor (once, on the primary).
///
/// # Safety
///
/// `gicd` and `gicr` must be the physical GIC's distributor and
/// redistributor regions, identity-mapped as device memory, and nothing but
/// this module may access them afterwards.
pub unsafe fn init(gicd: u64, gicr: u64, cpus: usize) -> Result<(), GicSetupError> {
    let (Some(d), Some(r)) = (NonNull::new(gicd as *mut _), NonNull::new(gicr as *mut _)) else {
        return Err(GicSetupError::Redistributor);
    };
    // SAFETY: the caller guarantees both regions are the GIC's, mapped as
    // device memory and owned by this module from now on.
    let mut gic =
        unsafe { GicV3::new(UniqueMmioPointer::new(d), r, cpus) }.map_err(|_| GicSetupError::Redistributor)?;
    gic.setup(0);
    RD_BASE.call_once(|| (0..cpus).map(|_| AtomicU64::new(0)).collect());
    *GIC.lock() = Some(PhysGic { gic, gicd, gicr });
    Ok(())
}

/// Per-CPU interface setup: system registers on, EOImode=1, all priorities
/// allowed, group 1 enabled; finds this CPU's redistributor.
pub fn init_cpu(cpu: usize) {
    if let Some(g) = GIC.lock().as_mut() {
        g.gic.init_cpu(cpu);
        let rd = find_redistributor(g, sysreg::mpidr()).unwrap_or(0);
        if let Some(slot) = RD_BASE.get().and_then(|r| r.get(cpu)) {
            slot.store(rd, Ordering::Release);
        }
    }
    // EL1 may use the system-register interface; no FIQ/IRQ bypass.
    ICC_SRE_EL2.write(ICC_SRE_EL2::SRE::SET + ICC_SRE_EL2::DFB::SET + ICC_SRE_EL2::DIB::SET + ICC_SRE_EL2::ENABLE::SET);
    sysreg::isb();
    ICC_CTLR_EL1.write(regs::ICC_CTLR_EL1::EOImode::DropOnly);
    ICC_PMR_EL1.write(regs::ICC_PMR_EL1::Priority.val(0xff));
    ICC_BPR1_EL1.write(regs::ICC_BPR1_EL1::BinaryPoint.val(0));
    ICC_IGRPEN1_EL1.write(regs::ICC_IGRPEN1_EL1::Enable::SET);
    sysreg::isb();
    its::init_cpu(cpu);
}

/// The number of SPIs the distributor implements (from GICD_TYPER).
pub fn nr_spis() -> u32 {
    GIC.lock().as_ref().map_or(0, |g| g.gic.typer().num_spis())
}

/// The same interrupt in `arm-gic`'s type: SGIs, PPIs and SPIs (the
/// hypervisor sets up no other kind).
fn arm_gic_id(intid: IntId) -> Option<arm_gic::IntId> {
    let n = intid.number();
    match intid.kind() {
        IntIdKind::Sgi => Some(arm_gic::IntId::sgi(n)),
        IntIdKind::Ppi => Some(arm_gic::IntId::ppi(n)),
        IntIdKind::Spi => Some(arm_gic::IntId::spi(n)),
        _ => None,
    }
}

/// Enables an interrupt; `cpu` names the redistributor for SGIs/PPIs.
pub fn enable(intid: IntId, cpu: usize, edge: bool) {
    let Some(id) = arm_gic_id(intid) else {
        return;
    };
    if let Some(g) = GIC.lock().as_mut() {
        let trigger = if edge { arm_gic::Trigger::Edge } else { arm_gic::Trigger::Level };
        let _ = g.gic.set_interrupt_priority(id, Some(cpu), 0x80);
        if !intid.is_sgi() {
            let _ = g.gic.set_trigger(id, Some(cpu), trigger);
        }
        let _ = g.gic.enable_interrupt(id, Some(cpu), true);
    }
}

/// Sets an enabled SPI's trigger (a forwarded SPI whose guest wrote its
/// GICD_ICFGR): disabled around the GICD_ICFGR write, whose effect on an
/// enabled interrupt is UNPREDICTABLE, then enabled again.
pub fn set_spi_trigger(intid: IntId, edge: bool) {
    let Some(id) = arm_gic_id(intid).filter(|_| intid.is_spi()) else {
        return;
    };
    if let Some(g) = GIC.lock().as_mut() {
        let trigger = if edge { arm_gic::Trigger::Edge } else { arm_gic::Trigger::Level };
        let _ = g.gic.enable_interrupt(id, None, false);
        // GICD_CTLR.RWP: the disable has taken effect (bounded: a GIC
        // that never clears it gets the write anyway).
        for _ in 0..100_000 {
            // SAFETY: GICD_CTLR of the distributor `init` was given, read
            // under the GIC lock; reading it has no side effect.
            if unsafe { core::ptr::read_volatile(g.gicd as *const u32) } & (1 << 31) == 0 {
                break;
            }
        }
        let _ = g.gic.set_trigger(id, None, trigger);
        let _ = g.gic.enable_interrupt(id, None, true);
    }
}

/// Acknowledges the highest-priority pending group-1 interrupt; `None` when
/// the GIC answers with a special INTID (nothing pending).
pub fn ack() -> Option<IntId> {
    loop {
        let v = ICC_IAR1_EL1.read(regs::ICC_INTID::INTID) as u32;
        match IntId::try_from(v) {
            Ok(id) if id.is_special() => return None,
            Ok(id) => {
                if id.is_lpi() {
                    its::count_lpi();
                }
                return Some(id);
            }
            Err(e) => {
                // No GIC returns a reserved INTID; should one, end it and
                // look for the next.
                log::warn!("GIC acknowledge: {e}");
                ICC_EOIR1_EL1.write(regs::ICC_INTID::INTID.val(u64::from(v)));
                ICC_DIR_EL1.write(regs::ICC_INTID::INTID.val(u64::from(v)));
            }
        }
    }
}

/// Priority drop (EOImode=1: does not deactivate).
pub fn eoi(intid: IntId) {
    ICC_EOIR1_EL1.write(regs::ICC_INTID::INTID.val(u64::from(u32::from(intid))));
}

/// Deactivates an interrupt the hypervisor handled itself. LPIs have no
/// active state (the priority drop of `eoi` ends them): nothing to do.
pub fn deactivate(intid: IntId) {
    if intid.is_lpi() {
        return;
    }
    ICC_DIR_EL1.write(regs::ICC_INTID::INTID.val(u64::from(u32::from(intid))));
}

/// Sends SGI `intid` to the CPU with affinity `mpidr` (nothing for a non-SGI).
pub fn send_sgi(intid: IntId, mpidr: u64) {
    use regs::ICC_SGI1R_EL1 as S;
    if !intid.is_sgi() {
        return;
    }
    let m = LocalRegisterCopy::<u64, MPIDR_EL1::Register>::new(mpidr);
    let aff0 = m.read(MPIDR_EL1::Aff0);
    // TargetList is a bitmap of Aff0 values within the range RS * 16.
    ICC_SGI1R_EL1.write(
        S::Aff3.val(m.read(MPIDR_EL1::Aff3))
            + S::Aff2.val(m.read(MPIDR_EL1::Aff2))
            + S::Aff1.val(m.read(MPIDR_EL1::Aff1))
            + S::RS.val(aff0 / 16)
            + S::INTID.val(u64::from(intid.number()))
            + S::TargetList.val(1 << (aff0 % 16)),
    );
    sysreg::isb();
}

/// Number of list registers (ICH_VTR_EL2.ListRegs + 1).
pub fn nr_lrs() -> usize {
    ICH_VTR_EL2.read(ICH_VTR_EL2::ListRegs) as usize + 1
}

macro_rules! lr_access {
    ($($n:literal => $reg:ident),*) => {
        /// Reads list register `n`.
        pub fn read_lr(n: usize) -> u64 {
            match n {
                $($n => $reg.get(),)*
                _ => 0,
            }
        }
        /// Writes list register `n`.
        pub fn write_lr(n: usize, v: u64) {
            match n {
                $($n => $reg.set(v),)*
                _ => {}
            }
        }
    };
}
lr_access!(
    0 => ICH_LR0_EL2, 1 => ICH_LR1_EL2, 2 => ICH_LR2_EL2, 3 => ICH_LR3_EL2,
    4 => ICH_LR4_EL2, 5 => ICH_LR5_EL2, 6 => ICH_LR6_EL2, 7 => ICH_LR7_EL2,
    8 => ICH_LR8_EL2, 9 => ICH_LR9_EL2, 10 => ICH_LR10_EL2, 11 => ICH_LR11_EL2,
    12 => ICH_LR12_EL2, 13 => ICH_LR13_EL2, 14 => ICH_LR14_EL2, 15 => ICH_LR15_EL2
);

/// Turns the virtual CPU interface on for entering a vCPU, with the
/// underflow maintenance interrupt when `underflow` (the LRs overflowed).
pub fn vcpu_if_on(underflow: bool) {
    ICH_HCR_EL2.write(ICH_HCR_EL2::En::SET + ICH_HCR_EL2::UIE.val(u64::from(underflow)));
}

/// Turns the virtual CPU interface off after an exit (this also silences
/// maintenance interrupts while EL2 runs).
pub fn vcpu_if_off() {
    ICH_HCR_EL2.set(0);
}

/// The virtual CPU interface state of a vCPU that is not on a CPU.
#[derive(Clone, Copy, Debug, Default)]
pub struct VcpuIfState {
    pub vmcr: u64,
    pub ap0r0: u64,
    pub ap1r0: u64,
}

impl VcpuIfState {
    pub fn save(&mut self) {
        self.vmcr = ICH_VMCR_EL2.get();
        self.ap0r0 = ICH_AP0R0_EL2.get();
        self.ap1r0 = ICH_AP1R0_EL2.get();
    }
    pub fn restore(&self) {
        ICH_VMCR_EL2.set(self.vmcr);
        ICH_AP0R0_EL2.set(self.ap0r0);
        ICH_AP1R0_EL2.set(self.ap1r0);
    }
}

/// Finds the redistributor frame (RD_base) whose GICR_TYPER affinity matches
/// `mpidr`, walking the region until GICR_TYPER.Last.
fn find_redistributor(g: &PhysGic, mpidr: u64) -> Option<u64> {
    let m = LocalRegisterCopy::<u64, MPIDR_EL1::Register>::new(mpidr);
    let want = (m.read(MPIDR_EL1::Aff3) << 24)
        | (m.read(MPIDR_EL1::Aff2) << 16)
        | (m.read(MPIDR_EL1::Aff1) << 8)
        | m.read(MPIDR_EL1::Aff0);
    let mut frame = g.gicr;
    for _ in 0..512 {
        // SAFETY: GICR_TYPER of a frame inside the redistributor region
        // (`init`'s contract), read-only and without side effects; the walk
        // stops at the frame marked Last.
        let typer = unsafe { core::ptr::read_volatile((frame + GICR_TYPER_OFF) as *const u64) };
        let typer = LocalRegisterCopy::<u64, GICR_TYPER::Register>::new(typer);
        if typer.read(GICR_TYPER::Affinity) == want {
            return Some(frame);
        }
        if typer.is_set(GICR_TYPER::Last) {
            return None;
        }
        frame += if typer.is_set(GICR_TYPER::VLPIS) { GICR_FRAME_V4 } else { GICR_FRAME_V3 };
    }
    None
}

/// How many redistributor frames the region at `base` of `size` bytes
/// holds: the frames up to the one marked GICR_TYPER.Last, within the
/// region, at most `crate::boot::pcpus::MAX_PCPUS`. Read before [`init`],
/// which hands the region to the driver.
///
/// # Safety
///
/// `base..base + size` must be a redistributor region the firmware names,
/// identity-mapped as device memory (only GICR_TYPER registers are read).
pub unsafe fn redistributors_in(base: u64, size: u64) -> usize {
    let end = base.saturating_add(size);
    let (mut frame, mut n) = (base, 0);
    while n < crate::boot::pcpus::MAX_PCPUS && frame.saturating_add(GICR_FRAME_V3) <= end {
        // SAFETY: GICR_TYPER of a frame inside the region (the caller's
        // contract), read-only and without side effects.
        let raw = unsafe { core::ptr::read_volatile((frame + GICR_TYPER_OFF) as *const u64) };
        let typer = LocalRegisterCopy::<u64, GICR_TYPER::Register>::new(raw);
        n += 1;
        if typer.is_set(GICR_TYPER::Last) {
            break;
        }
        frame += if typer.is_set(GICR_TYPER::VLPIS) { GICR_FRAME_V4 } else { GICR_FRAME_V3 };
    }
    n
}

/// GICR_TYPER of every redistributor frame in the region, in order, up to
/// the one marked Last.
fn find_redistributor_frames(g: &PhysGic) -> alloc::vec::Vec<u64> {
    let mut out = alloc::vec::Vec::new();
    let mut frame = g.gicr;
    for _ in 0..512 {
        // SAFETY: as in `find_redistributor`: GICR_TYPER of a frame inside
        // the region, read-only; the walk stops at the frame marked Last.
        let raw = unsafe { core::ptr::read_volatile((frame + GICR_TYPER_OFF) as *const u64) };
        out.push(raw);
        let typer = LocalRegisterCopy::<u64, GICR_TYPER::Register>::new(raw);
        if typer.is_set(GICR_TYPER::Last) {
            break;
        }
        frame += if typer.is_set(GICR_TYPER::VLPIS) { GICR_FRAME_V4 } else { GICR_FRAME_V3 };
    }
    out
}

/// Sets or clears the physical active state of private interrupt `intid`
/// on pCPU `cpu`'s redistributor (GICR_ISACTIVER0 / GICR_ICACTIVER0). Call
/// it on `cpu` itself.
pub fn set_private_active(cpu: usize, intid: IntId, active: bool) {
    let rd = rd_base(cpu);
    if rd == 0 || !(intid.is_sgi() || intid.is_ppi()) {
        return;
    }
    let intid = u32::from(intid);
    let reg = rd + GICR_SGI_BASE + if active { GICR_ISACTIVER0 } else { GICR_ICACTIVER0 };
    // SAFETY: a write-1-to-set/clear register of a redistributor that
    // `init_cpu` found inside the GIC's region; one bit per private INTID.
    unsafe { core::ptr::write_volatile(reg as *mut u32, 1 << intid) };
    sysreg::dsb_sy();
}

/// Deactivates SPI `intid` in the distributor (GICD_ICACTIVER<n>), from
/// any CPU, whichever CPU acknowledged it.
pub fn clear_spi_active(intid: IntId) {
    if !intid.is_spi() {
        return;
    }
    let intid = u32::from(intid);
    if let Some(g) = GIC.lock().as_ref() {
        let reg = g.gicd + 0x380 + 4 * u64::from(intid / 32);
        // SAFETY: a write-1-to-clear register of the distributor `init` was
        // given; only the bit of `intid`, an SPI the hypervisor forwards, is
        // written, under the GIC lock.
        unsafe { core::ptr::write_volatile(reg as *mut u32, 1 << (intid % 32)) };
    }
    sysreg::dsb_sy();
}

/// Routes SPI `intid` to the CPU with affinity `mpidr` (GICD_IROUTER<n>,
/// affinity routing, IRM = 0).
pub fn route_spi(intid: IntId, mpidr: u64) {
    if !intid.is_spi() {
        return;
    }
    let intid = u32::from(intid);
    let m = LocalRegisterCopy::<u64, MPIDR_EL1::Register>::new(mpidr);
    let v = GICD_IROUTER::Aff3.val(m.read(MPIDR_EL1::Aff3))
        + GICD_IROUTER::IRM::CLEAR
        + GICD_IROUTER::Aff2.val(m.read(MPIDR_EL1::Aff2))
        + GICD_IROUTER::Aff1.val(m.read(MPIDR_EL1::Aff1))
        + GICD_IROUTER::Aff0.val(m.read(MPIDR_EL1::Aff0));
    if let Some(g) = GIC.lock().as_ref() {
        let reg = g.gicd + GICD_IROUTER0 + 8 * u64::from(intid);
        // SAFETY: GICD_IROUTER<intid> (an SPI, checked above) of the
        // distributor `init` was given; the GIC lock is held, and the
        // hypervisor owns the physical routing of every SPI.
        unsafe { core::ptr::write_volatile(reg as *mut u64, v.value) };
    }
}
