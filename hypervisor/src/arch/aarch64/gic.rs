//! The physical GICv3/v4 as the hypervisor uses it.
//!
//! Distributor and redistributors are set up with the `arm-gic` crate; the
//! CPU interface runs with ICC_CTLR_EL1.EOImode = 1 so that a write to
//! ICC_EOIR1_EL1 only drops priority and a forwarded interrupt stays active
//! until the guest deactivates it through a HW=1 list register. The virtual
//! CPU interface (ICH_*_EL2) is reached through the accessors below; what to
//! put in the list registers is decided by the portable `vgic` model.

use crate::{read_sysreg, write_sysreg};
use arm_gic::gicv3::GicV3;
use arm_gic::{IntId, UniqueMmioPointer};
use core::ptr::NonNull;
use spin::Mutex;

pub struct PhysGic {
    gic: GicV3<'static>,
}

// SAFETY: the GIC registers are shared device memory; all access goes
// through the mutex below.
unsafe impl Send for PhysGic {}

static GIC: Mutex<Option<PhysGic>> = Mutex::new(None);

/// Spurious interrupt IDs (1020-1023).
pub const SPURIOUS: u32 = 1020;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GicSetupError {
    /// The redistributor region could not be probed.
    Redistributor,
}

/// Sets up the distributor and every redistributor (once, on the primary).
pub fn init(gicd: u64, gicr: u64, cpus: usize) -> Result<(), GicSetupError> {
    // SAFETY: the addresses come from the platform description, are mapped
    // as device memory by the EL2 identity map, and only this driver (behind
    // `GIC`) touches them.
    let mut gic = unsafe {
        GicV3::new(
            UniqueMmioPointer::new(NonNull::new(gicd as *mut _).unwrap()),
            NonNull::new(gicr as *mut _).unwrap(),
            cpus,
        )
    }
    .map_err(|_| GicSetupError::Redistributor)?;
    gic.setup(0);
    *GIC.lock() = Some(PhysGic { gic });
    Ok(())
}

/// Per-CPU interface setup: system registers on, EOImode=1, all priorities
/// allowed, group 1 enabled.
pub fn init_cpu(cpu: usize) {
    if let Some(g) = GIC.lock().as_mut() {
        g.gic.init_cpu(cpu);
    }
    // ICC_SRE_EL2: SRE | DFB | DIB | Enable (EL1 may use system registers).
    write_sysreg!("icc_sre_el2", 0xf);
    super::sysreg::isb();
    write_sysreg!("icc_ctlr_el1", 1 << 1);
    write_sysreg!("icc_pmr_el1", 0xff);
    write_sysreg!("icc_bpr1_el1", 0);
    write_sysreg!("icc_igrpen1_el1", 1);
    super::sysreg::isb();
}

/// Enables an interrupt; `cpu` names the redistributor for SGIs/PPIs.
pub fn enable(intid: u32, cpu: usize, edge: bool) {
    let id = if intid < 16 {
        IntId::sgi(intid)
    } else if intid < 32 {
        IntId::ppi(intid - 16)
    } else {
        IntId::spi(intid - 32)
    };
    if let Some(g) = GIC.lock().as_mut() {
        let trigger = if edge { arm_gic::Trigger::Edge } else { arm_gic::Trigger::Level };
        let _ = g.gic.set_interrupt_priority(id, Some(cpu), 0x80);
        if intid >= 16 {
            let _ = g.gic.set_trigger(id, Some(cpu), trigger);
        }
        let _ = g.gic.enable_interrupt(id, Some(cpu), true);
    }
}

/// Acknowledges the highest-priority pending group-1 interrupt.
pub fn ack() -> Option<u32> {
    let v = read_sysreg!("icc_iar1_el1") as u32 & 0xff_ffff;
    if v >= SPURIOUS && v < 1024 {
        None
    } else {
        Some(v)
    }
}

/// Priority drop (EOImode=1: does not deactivate).
pub fn eoi(intid: u32) {
    write_sysreg!("icc_eoir1_el1", intid as u64);
}

/// Deactivates an interrupt the hypervisor handled itself.
pub fn deactivate(intid: u32) {
    write_sysreg!("icc_dir_el1", intid as u64);
}

/// Sends SGI `intid` to the CPU with affinity `mpidr`.
pub fn send_sgi(intid: u32, mpidr: u64) {
    let aff0 = mpidr & 0xf;
    let v = ((mpidr >> 32 & 0xff) << 48)
        | ((mpidr >> 16 & 0xff) << 32)
        | ((mpidr >> 8 & 0xff) << 16)
        | (((mpidr & 0xff) >> 4) << 44)
        | ((intid as u64 & 0xf) << 24)
        | (1 << aff0);
    write_sysreg!("icc_sgi1r_el1", v);
    super::sysreg::isb();
}

/// Number of list registers (ICH_VTR_EL2.ListRegs + 1).
pub fn nr_lrs() -> usize {
    (read_sysreg!("ich_vtr_el2") & 0x1f) as usize + 1
}

macro_rules! lr_access {
    ($($n:literal),*) => {
        /// Reads list register `n`.
        pub fn read_lr(n: usize) -> u64 {
            match n {
                $($n => read_sysreg!(concat!("ich_lr", stringify!($n), "_el2")),)*
                _ => 0,
            }
        }
        /// Writes list register `n`.
        pub fn write_lr(n: usize, v: u64) {
            match n {
                $($n => write_sysreg!(concat!("ich_lr", stringify!($n), "_el2"), v),)*
                _ => {}
            }
        }
    };
}
lr_access!(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);

/// ICH_HCR_EL2 bits.
pub const ICH_HCR_EN: u64 = 1 << 0;
pub const ICH_HCR_UIE: u64 = 1 << 1;

pub fn write_ich_hcr(v: u64) {
    write_sysreg!("ich_hcr_el2", v);
}

pub fn read_misr() -> u64 {
    read_sysreg!("ich_misr_el2")
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
        self.vmcr = read_sysreg!("ich_vmcr_el2");
        self.ap0r0 = read_sysreg!("ich_ap0r0_el2");
        self.ap1r0 = read_sysreg!("ich_ap1r0_el2");
    }
    pub fn restore(&self) {
        write_sysreg!("ich_vmcr_el2", self.vmcr);
        write_sysreg!("ich_ap0r0_el2", self.ap0r0);
        write_sysreg!("ich_ap1r0_el2", self.ap1r0);
    }
}

/// Finds the redistributor frame (RD_base) whose GICR_TYPER affinity matches
/// `mpidr`, walking the region from `gicr_base` until GICR_TYPER.Last.
pub fn find_redistributor(gicr_base: u64, mpidr: u64) -> Option<u64> {
    let want = ((mpidr >> 32 & 0xff) << 24) | (mpidr & 0xff_ffff);
    let mut frame = gicr_base;
    for _ in 0..512 {
        // SAFETY: GICR_TYPER (offset 8) of a frame inside the redistributor
        // region, identity-mapped as device memory.
        let typer = unsafe { core::ptr::read_volatile((frame + 8) as *const u64) };
        if typer >> 32 == want {
            return Some(frame);
        }
        if typer & (1 << 4) != 0 {
            return None;
        }
        // VLPIS (GICv4) frames have two extra 64 KiB pages.
        frame += if typer & (1 << 1) != 0 { 0x40000 } else { 0x20000 };
    }
    None
}

/// Sets or clears the physical active state of a private interrupt on the
/// redistributor at `rd_base` (GICR_ISACTIVER0 / GICR_ICACTIVER0).
pub fn set_private_active(rd_base: u64, intid: u32, active: bool) {
    let sgi_base = rd_base + 0x10000;
    let off = if active { 0x300 } else { 0x380 };
    // SAFETY: a write-1-to-set/clear register of this CPU's redistributor.
    unsafe { core::ptr::write_volatile((sgi_base + off) as *mut u32, 1 << (intid & 31)) };
    super::sysreg::dsb_sy();
}

/// Deactivates SPI `intid` in the distributor (GICD_ICACTIVER<n>), from
/// any CPU, whichever CPU acknowledged it.
pub fn clear_spi_active(gicd: u64, intid: u32) {
    if !(32..1020).contains(&intid) {
        return;
    }
    let reg = gicd + 0x380 + 4 * (intid as u64 / 32);
    // SAFETY: a write-1-to-clear register of the identity-mapped distributor;
    // only the bit of `intid`, an SPI the hypervisor forwards, is written.
    unsafe { core::ptr::write_volatile(reg as *mut u32, 1 << (intid % 32)) };
    super::sysreg::dsb_sy();
}

/// Routes SPI `intid` to the CPU with affinity `mpidr` (GICD_IROUTER<n>,
/// affinity routing, IRM = 0).
pub fn route_spi(gicd: u64, intid: u32, mpidr: u64) {
    if !(32..1020).contains(&intid) {
        return;
    }
    let aff = (mpidr & 0xff_00ff_ffff) & !(1 << 31);
    // SAFETY: GICD_IROUTER<intid> of the identity-mapped distributor; the
    // hypervisor owns the physical routing of every SPI.
    unsafe { core::ptr::write_volatile((gicd + 0x6000 + 8 * intid as u64) as *mut u64, aff) };
}
