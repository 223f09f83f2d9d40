//! GICv3 as a guest uses it: distributor and redistributors from the DT,
//! interrupts through the ICC system registers, and what the IRQ handler
//! counted. GICR_WAKER is never touched: a guest need not (KVM makes it
//! RAZ/WI, and delivery must not wait for it).

use crate::arch::{self, MAX_CPUS};
use crate::mmio::Mmio;
use crate::platform::Platform;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub const GICD_CTLR: usize = 0x0;
pub const GICD_TYPER: usize = 0x4;
pub const GICD_IGROUPR: usize = 0x80;
pub const GICD_ISENABLER: usize = 0x100;
pub const GICD_ICENABLER: usize = 0x180;
pub const GICD_ISPENDR: usize = 0x200;
pub const GICD_ICPENDR: usize = 0x280;
pub const GICD_IPRIORITYR: usize = 0x400;
pub const GICD_IROUTER: usize = 0x6000;
const GICD_CTLR_RWP: u32 = 1 << 31;
const GICD_CTLR_ARE: u32 = 1 << 4;
const GICD_CTLR_GRP1: u32 = 1 << 1;

pub const GICR_CTLR: usize = 0x0;
pub const GICR_TYPER: usize = 0x8;
pub const GICR_PROPBASER: usize = 0x70;
pub const GICR_PENDBASER: usize = 0x78;
/// The SGI frame's registers, from the redistributor's second 64 KiB frame.
pub const SGI_FRAME: usize = 0x1_0000;
pub const GICR_IGROUPR0: usize = 0x80;
pub const GICR_ISENABLER0: usize = 0x100;
pub const GICR_ICENABLER0: usize = 0x180;
pub const GICR_ISPENDR0: usize = 0x200;
pub const GICR_ICPENDR0: usize = 0x280;
pub const GICR_ISACTIVER0: usize = 0x300;
pub const GICR_ICACTIVER0: usize = 0x380;
pub const GICR_IPRIORITYR: usize = 0x400;

/// The first LPI the checks use, and how many are counted.
pub const LPI_BASE: u32 = 8192;
pub const LPI_COUNTED: usize = 64;

/// Per CPU and INTID (SGIs, PPIs and the first 32 SPIs): interrupts the
/// handler took.
pub const COUNTED: usize = 64;
pub static PRIVATE: [[AtomicU32; COUNTED]; MAX_CPUS] = [const { [const { AtomicU32::new(0) }; COUNTED] }; MAX_CPUS];
/// LPIs LPI_BASE.. taken (on any CPU), and the CPU that took each last.
/// The virtual count when each CPU last took each counted private
/// interrupt (read before acknowledging it): when a handler ran, seen from
/// another CPU (the count is one clock for all CPUs).
pub static TAKEN_AT: [[AtomicU64; COUNTED]; MAX_CPUS] = [const { [const { AtomicU64::new(0) }; COUNTED] }; MAX_CPUS];
pub static LPIS: [AtomicU32; LPI_COUNTED] = [const { AtomicU32::new(0) }; LPI_COUNTED];
pub static LPI_CPU: [AtomicU32; LPI_COUNTED] = [const { AtomicU32::new(0) }; LPI_COUNTED];
/// Anything else taken: (count, last INTID).
pub static OTHER: AtomicU32 = AtomicU32::new(0);
pub static OTHER_LAST: AtomicU32 = AtomicU32::new(0);
/// The timers' and PMU's INTIDs, for the handler to quiet their sources.
pub static VTIMER: AtomicU32 = AtomicU32::new(27);
pub static PTIMER: AtomicU32 = AtomicU32::new(30);
pub static PMU: AtomicU32 = AtomicU32::new(23);
/// Redistributor base per CPU (0 until found).
pub static RD: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

pub fn gicd(p: &Platform) -> Mmio {
    // SAFETY: the DT's distributor frame, mapped as device memory.
    unsafe { Mmio::new(p.gicd as usize) }
}

/// This CPU's redistributor (RD frame; `.at(SGI_FRAME)` for the SGI frame).
pub fn rd(cpu: usize) -> Mmio {
    // SAFETY: found by `find_rd` in the DT's redistributor regions.
    unsafe { Mmio::new(RD[cpu].load(Ordering::Relaxed) as usize) }
}

pub fn sgi_frame(cpu: usize) -> Mmio {
    rd(cpu).at(SGI_FRAME)
}

/// Turns on affinity routing and group 1 at the distributor.
pub fn init_distributor(p: &Platform) {
    let d = gicd(p);
    d.write32(GICD_CTLR, d.read32(GICD_CTLR) | GICD_CTLR_ARE | GICD_CTLR_GRP1);
    while d.read32(GICD_CTLR) & GICD_CTLR_RWP != 0 {}
}

/// Finds the redistributor whose GICR_TYPER.Affinity is `mpidr`'s, walking
/// each region frame by frame (128 KiB, or 256 KiB with VLPIS) to Last.
fn find_rd(p: &Platform, mpidr: u64) -> Option<u64> {
    let aff = ((mpidr >> 32) & 0xff) << 24 | (mpidr & 0xff_ffff);
    for &(base, size) in &p.gicr[..p.ngicr] {
        let mut at = base;
        while size == 0 || at < base + size {
            // SAFETY: a frame inside the DT's redistributor region.
            let typer = unsafe { Mmio::new(at as usize) }.read64(GICR_TYPER);
            if typer >> 32 == aff {
                return Some(at);
            }
            if typer & (1 << 4) != 0 {
                break;
            }
            at += if typer & (1 << 1) != 0 { 0x4_0000 } else { 0x2_0000 };
        }
    }
    None
}

/// Sets up this CPU's redistributor (SGIs 0-15 enabled, group 1, middle
/// priority) and CPU interface. Never writes GICR_WAKER.
pub fn init_cpu(p: &Platform, cpu: usize) -> Result<(), &'static str> {
    let rd_base = find_rd(p, arch::mpidr()).ok_or("no redistributor with this CPU's affinity")?;
    RD[cpu].store(rd_base, Ordering::Relaxed);
    let sgi = sgi_frame(cpu);
    sgi.write32(GICR_IGROUPR0, 0xffff_ffff);
    for i in 0..8 {
        sgi.write32(GICR_IPRIORITYR + 4 * i, 0xa0a0_a0a0);
    }
    sgi.write32(GICR_ICENABLER0, 0xffff_0000);
    sgi.write32(GICR_ISENABLER0, 0x0000_ffff);
    arch::write_icc_sre(arch::icc_sre() | 1);
    arch::write_icc_pmr(0xff);
    arch::write_icc_bpr1(0);
    arch::write_icc_ctlr(0);
    arch::write_icc_igrpen1(1);
    Ok(())
}

/// ICC_SGI1R_EL1 for SGI `intid` to the CPUs in `targets` (MPIDRs, which
/// must share Aff3.Aff2.Aff1 and the range selector); `None` for all but self.
pub fn sgi1r(intid: u32, targets: Option<&[u64]>) -> u64 {
    let intid = (intid as u64 & 0xf) << 24;
    match targets {
        None => intid | 1 << 40,
        Some(t) => {
            let m = t[0];
            let (aff1, aff2, aff3) = ((m >> 8) & 0xff, (m >> 16) & 0xff, (m >> 32) & 0xff);
            let rs = (m & 0xff) >> 4;
            let list = t.iter().fold(0u64, |l, m| l | 1 << (m & 0xf));
            intid | aff3 << 48 | rs << 44 | aff2 << 32 | aff1 << 16 | list
        }
    }
}

pub fn send_sgi(v: u64) {
    arch::dsb();
    arch::write_icc_sgi1r(v);
}

pub fn count(cpu: usize, intid: u32) -> u32 {
    PRIVATE[cpu][intid as usize].load(Ordering::SeqCst)
}

/// The virtual count when `cpu` last took `intid` (see [`TAKEN_AT`]).
pub fn taken_at(cpu: usize, intid: u32) -> u64 {
    TAKEN_AT[cpu][intid as usize].load(Ordering::SeqCst)
}

/// The CPU that took LPI `intid` last.
pub fn lpi_cpu(intid: u32) -> usize {
    LPI_CPU[(intid - LPI_BASE) as usize].load(Ordering::SeqCst) as usize
}

pub fn lpi_count(intid: u32) -> u32 {
    LPIS[(intid - LPI_BASE) as usize].load(Ordering::SeqCst)
}

/// Takes every pending interrupt: counts it, quiets the timers' and the
/// PMU's level sources (so the line drops), ends it.
pub fn handle_irq(cpu: usize) {
    let now = arch::cntvct();
    loop {
        let iar = arch::icc_iar1();
        let intid = (iar & 0xff_ffff) as u32;
        if (1020..1024).contains(&intid) {
            break;
        }
        if intid == VTIMER.load(Ordering::Relaxed) {
            arch::write_cntv_ctl(0);
        } else if intid == PTIMER.load(Ordering::Relaxed) {
            arch::write_cntp_ctl(0);
        } else if intid == PMU.load(Ordering::Relaxed) {
            arch::write_pmintenclr(u32::MAX as u64);
            arch::write_pmovsclr(u32::MAX as u64);
        }
        if (intid as usize) < COUNTED {
            TAKEN_AT[cpu][intid as usize].store(now, Ordering::SeqCst);
            PRIVATE[cpu][intid as usize].fetch_add(1, Ordering::SeqCst);
        } else if (LPI_BASE..LPI_BASE + LPI_COUNTED as u32).contains(&intid) {
            LPI_CPU[(intid - LPI_BASE) as usize].store(cpu as u32, Ordering::SeqCst);
            LPIS[(intid - LPI_BASE) as usize].fetch_add(1, Ordering::SeqCst);
        } else {
            OTHER.fetch_add(1, Ordering::SeqCst);
            OTHER_LAST.store(intid, Ordering::SeqCst);
        }
        arch::write_icc_eoir1(iar);
    }
}
