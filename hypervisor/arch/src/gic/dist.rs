//! The distributor and the redistributors: set up with `arm-gic`, the
//! `GIC` lock around every distributor access, each pCPU's frame found by
//! its MPIDR, SPI routing and enables, the active state of forwarded
//! interrupts.

use crate::gicr;
use crate::intid::{IntId, IntIdKind};
use crate::region::Region;
use crate::regs;
use crate::sync::Mutex;
use crate::sysreg::{self, ICC_BPR1_EL1, ICC_CTLR_EL1, ICC_IGRPEN1_EL1, ICC_PMR_EL1};
use aarch64_cpu::registers::{ICC_SRE_EL2, MPIDR_EL1};
use alloc::vec::Vec;
use arm_gic::gicv3::registers::{Gicd, GicrSgi};
use arm_gic::gicv3::{GicCpuInterface, GicDistributor, GicRedistributor};
use arm_gic::UniqueMmioPointer;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};
use tock_registers::interfaces::Writeable;
use tock_registers::{register_bitfields, LocalRegisterCopy};

register_bitfields! {u64,
    /// Redistributor Type Register (RD_base + 0x8).
    pub(super) GICR_TYPER [
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
pub(super) const GICR_TYPER_OFF: u64 = 0x8;
/// The SGI_base frame follows the RD_base frame.
const GICR_SGI_BASE: u64 = 0x10000;
/// SGI_base offsets of GICR_ISACTIVER0 and GICR_ICACTIVER0.
const GICR_ISACTIVER0: u64 = 0x300;
const GICR_ICACTIVER0: u64 = 0x380;

pub struct PhysGic {
    pub(super) gicd: GicDistributor<'static>,
    gicd_base: u64,
    /// Every redistributor frame of every GICR region (`crate::gicr::walk`).
    frames: Vec<gicr::Frame>,
}

// SAFETY: the GIC registers are device memory shared by all CPUs and the
// driver holds no CPU-local state; every access to `PhysGic` goes through
// the `GIC` mutex, so moving it between CPUs is sound.
unsafe impl Send for PhysGic {}

pub(super) static GIC: Mutex<Option<PhysGic>> = Mutex::new(None);

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

/// This CPU's redistributor (found by its MPIDR) woken and its CPU
/// interface set up: system registers on, EOImode=1, all priorities
/// allowed, group 1 enabled.
pub(super) fn setup_cpu(cpu: usize) {
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

/// GICR_TYPER of every redistributor frame of every region, in order.
pub(super) fn find_redistributor_frames(g: &PhysGic) -> Vec<u64> {
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
