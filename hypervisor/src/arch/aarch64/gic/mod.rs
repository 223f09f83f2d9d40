//! The physical GICv3/v4 as the hypervisor uses it: the only code that
//! touches the distributor, the redistributors and the CPU interface.
//!
//! Distributor and redistributors are set up with the `arm-gic` crate, each
//! pCPU's redistributor at the frame `crate::gicr` found for its MPIDR in
//! whichever GICR region holds it (not at an index into one region); the
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
use crate::gicr;
use crate::intid::{IntId, IntIdKind};
use crate::region::Region;
use crate::regs;
use crate::sync::Mutex;
use aarch64_cpu::registers::{
    ICC_SRE_EL2, ICH_AP0R0_EL2, ICH_AP0R1_EL2, ICH_AP0R2_EL2, ICH_AP0R3_EL2, ICH_AP1R0_EL2, ICH_AP1R1_EL2,
    ICH_AP1R2_EL2, ICH_AP1R3_EL2, ICH_HCR_EL2, ICH_LR0_EL2, ICH_LR10_EL2, ICH_LR11_EL2, ICH_LR12_EL2, ICH_LR13_EL2,
    ICH_LR14_EL2, ICH_LR15_EL2, ICH_LR1_EL2, ICH_LR2_EL2, ICH_LR3_EL2, ICH_LR4_EL2, ICH_LR5_EL2, ICH_LR6_EL2,
    ICH_LR7_EL2, ICH_LR8_EL2, ICH_LR9_EL2, ICH_VMCR_EL2, ICH_VTR_EL2, MPIDR_EL1,
};
use alloc::vec::Vec;
use arm_gic::gicv3::registers::{Gicd, GicrSgi};
use arm_gic::gicv3::{GicCpuInterface, GicDistributor, GicRedistributor};
use arm_gic::UniqueMmioPointer;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};
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

pub struct PhysGic {
    gicd: GicDistributor<'static>,
    gicd_base: u64,
    /// Every redistributor frame of every GICR region (`crate::gicr::walk`).
    frames: Vec<gicr::Frame>,
}

// SAFETY: the GIC registers are device memory shared by all CPUs and the
// driver holds no CPU-local state; every access to `PhysGic` goes through
// the `GIC` mutex, so moving it between CPUs is sound.
unsafe impl Send for PhysGic {}

static GIC: Mutex<Option<PhysGic>> = Mutex::new(None);

/// RD_base of each pCPU's redistributor, found by [`init_cpu`]; 0 = none.
/// [`init`] sizes it for the machine's pCPUs.
static RD_BASE: crate::sync::Once<alloc::boxed::Box<[AtomicU64]>> = crate::sync::Once::new();

/// pCPU `cpu`'s RD_base, 0 when unknown.
pub(super) fn rd_base(cpu: usize) -> u64 {
    RD_BASE.get().and_then(|r| r.get(cpu)).map_or(0, |r| r.load(Ordering::Acquire))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GicSetupError {
    /// No distributor, or no redistributor frame in any region.
    Redistributor,
}

/// The redistributor at `rd` (RD_base + SGI_base) as `arm-gic` drives it.
///
/// # Safety
///
/// `rd` must be the RD_base of a frame [`init`] found, and the caller must
/// hold the `GIC` lock or be the only writer of that frame's registers.
unsafe fn redistributor(rd: u64) -> Option<GicRedistributor<'static>> {
    let p = NonNull::new(rd as *mut GicrSgi)?;
    // SAFETY: a redistributor frame found by the walk of the firmware's
    // GICR regions (identity-mapped device memory owned by this module);
    // the caller serialises the accesses.
    Some(GicRedistributor::new(unsafe { UniqueMmioPointer::new(p) }))
}

/// Sets up the distributor and every redistributor frame of `regions`
/// (once, on the primary), for up to `cpus` pCPUs. Returns the frames
/// found: a pCPU is served by the one whose GICR_TYPER.Affinity is its
/// MPIDR's ([`served`] says how many of a list of CPUs have one).
///
/// # Safety
///
/// `gicd` and every region of `regions` must be the physical GIC's
/// distributor and redistributor regions, identity-mapped as device memory,
/// and nothing but this module may access them afterwards.
pub unsafe fn init(gicd: u64, regions: &[Region], cpus: usize) -> Result<usize, GicSetupError> {
    let Some(d) = NonNull::new(gicd as *mut Gicd) else {
        return Err(GicSetupError::Redistributor);
    };
    // SAFETY: GICR_TYPER of frames inside the regions (the caller's
    // contract; `walk` stays inside each region), read-only, no side effect.
    let frames = gicr::walk(regions, |a| unsafe { core::ptr::read_volatile(a as *const u64) });
    if frames.is_empty() {
        return Err(GicSetupError::Redistributor);
    }
    // SAFETY: the caller guarantees the distributor is the GIC's, mapped as
    // device memory and owned by this module from now on.
    let mut gicd_drv = GicDistributor::new(unsafe { UniqueMmioPointer::new(d) });
    for f in &frames {
        // SAFETY: a frame the walk found; no other CPU runs yet.
        if let Some(mut r) = unsafe { redistributor(f.rd_base) } {
            r.configure_default_settings();
        }
    }
    gicd_drv.configure_default_settings();
    RD_BASE.call_once(|| (0..cpus).map(|_| AtomicU64::new(0)).collect());
    let n = frames.len();
    *GIC.lock() = Some(PhysGic { gicd: gicd_drv, gicd_base: gicd, frames });
    Ok(n)
}

/// How many of the CPUs `mpidrs` have a redistributor frame ([`init`]).
pub fn served(mpidrs: &[u64]) -> usize {
    GIC.lock().as_ref().map_or(0, |g| gicr::served(&g.frames, mpidrs))
}

/// Whether the CPU `mpidr` has a redistributor frame ([`init`]).
pub fn has_redistributor(mpidr: u64) -> bool {
    GIC.lock().as_ref().is_some_and(|g| gicr::find(&g.frames, mpidr).is_some())
}

/// Per-CPU interface setup: finds this CPU's redistributor by its MPIDR
/// and wakes it; system registers on, EOImode=1, all priorities allowed,
/// group 1 enabled.
pub fn init_cpu(cpu: usize) {
    let me = sysreg::mpidr();
    if let Some(g) = GIC.lock().as_mut() {
        let rd = gicr::find(&g.frames, me).map_or(0, |f| f.rd_base);
        if rd == 0 {
            log::error!("pCPU{cpu}: no redistributor serves MPIDR {me:#x}");
        }
        if let Some(slot) = RD_BASE.get().and_then(|r| r.get(cpu)) {
            slot.store(rd, Ordering::Release);
        }
        // SAFETY: this CPU's own frame, under the GIC lock.
        if let Some(mut r) = unsafe { redistributor(rd) } {
            // Already awake (a warm restart) is fine.
            let _ = r.mark_core_awake();
        }
    }
    GicCpuInterface::enable_system_register_el1();
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
    GIC.lock().as_ref().map_or(0, |g| g.gicd.typer().num_spis())
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
    let trigger = if edge { arm_gic::Trigger::Edge } else { arm_gic::Trigger::Level };
    let Some(g) = &mut *GIC.lock() else {
        return;
    };
    if id.is_private() {
        // SAFETY: pCPU `cpu`'s frame as `init_cpu` found it, under the GIC lock.
        let Some(mut r) = (unsafe { redistributor(rd_base(cpu)) }) else {
            return;
        };
        let _ = r.set_interrupt_priority(id, 0x80);
        if !intid.is_sgi() {
            let _ = r.set_trigger(id, trigger);
        }
        let _ = r.enable_interrupt(id, true);
    } else {
        let _ = g.gicd.set_interrupt_priority(id, 0x80);
        let _ = g.gicd.set_trigger(id, trigger);
        let _ = g.gicd.enable_interrupt(id, true);
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
        let _ = g.gicd.enable_interrupt(id, false);
        // GICD_CTLR.RWP: the disable has taken effect (bounded: a GIC
        // that never clears it gets the write anyway).
        for _ in 0..100_000 {
            // SAFETY: GICD_CTLR of the distributor `init` was given, read
            // under the GIC lock; reading it has no side effect.
            if unsafe { core::ptr::read_volatile(g.gicd_base as *const u32) } & (1 << 31) == 0 {
                break;
            }
        }
        let _ = g.gicd.set_trigger(id, trigger);
        let _ = g.gicd.enable_interrupt(id, true);
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
    /// ICH_AP0R<n>_EL2 and ICH_AP1R<n>_EL2: the first
    /// `vgic::active_priority_regs(ICH_VTR_EL2)` of each are the vCPU's
    /// (the others do not exist on this CPU and stay 0).
    pub ap0r: [u64; 4],
    pub ap1r: [u64; 4],
}

/// How many ICH_AP<m>R<n>_EL2 registers of each group this CPU implements.
fn nr_ap_regs() -> usize {
    crate::vgic::active_priority_regs(ICH_VTR_EL2.get())
}

impl VcpuIfState {
    pub fn save(&mut self) {
        self.vmcr = ICH_VMCR_EL2.get();
        let n = nr_ap_regs();
        self.ap0r[0] = ICH_AP0R0_EL2.get();
        self.ap1r[0] = ICH_AP1R0_EL2.get();
        if n >= 2 {
            self.ap0r[1] = ICH_AP0R1_EL2.get();
            self.ap1r[1] = ICH_AP1R1_EL2.get();
        }
        if n >= 4 {
            self.ap0r[2] = ICH_AP0R2_EL2.get();
            self.ap1r[2] = ICH_AP1R2_EL2.get();
            self.ap0r[3] = ICH_AP0R3_EL2.get();
            self.ap1r[3] = ICH_AP1R3_EL2.get();
        }
    }
    pub fn restore(&self) {
        ICH_VMCR_EL2.set(self.vmcr);
        let n = nr_ap_regs();
        ICH_AP0R0_EL2.set(self.ap0r[0]);
        ICH_AP1R0_EL2.set(self.ap1r[0]);
        if n >= 2 {
            ICH_AP0R1_EL2.set(self.ap0r[1]);
            ICH_AP1R1_EL2.set(self.ap1r[1]);
        }
        if n >= 4 {
            ICH_AP0R2_EL2.set(self.ap0r[2]);
            ICH_AP1R2_EL2.set(self.ap1r[2]);
            ICH_AP0R3_EL2.set(self.ap0r[3]);
            ICH_AP1R3_EL2.set(self.ap1r[3]);
        }
    }
}

/// GICR_TYPER of every redistributor frame of every region, in order.
fn find_redistributor_frames(g: &PhysGic) -> Vec<u64> {
    g.frames.iter().map(|f| f.typer).collect()
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
        let reg = g.gicd_base + 0x380 + 4 * u64::from(intid / 32);
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
        let reg = g.gicd_base + GICD_IROUTER0 + 8 * u64::from(intid);
        // SAFETY: GICD_IROUTER<intid> (an SPI, checked above) of the
        // distributor `init` was given; the GIC lock is held, and the
        // hypervisor owns the physical routing of every SPI.
        unsafe { core::ptr::write_volatile(reg as *mut u64, v.value) };
    }
}
