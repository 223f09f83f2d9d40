//! Per-pCPU state: what other pCPUs may set (reschedule requests, timer
//! re-arm requests) as atomics, the run block for guest entry, and time.

use crate::arch::entry::MAX_CPUS;
use crate::arch::exception::CpuRun;
use crate::arch::sysreg::CNTHP_CVAL_EL2;
use crate::intid::IntId;
use aarch64_cpu::registers::{CNTFRQ_EL0, CNTHP_CTL_EL2, CNTPCT_EL0};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use tock_registers::interfaces::{Readable, Writeable};

/// The physical SGI that asks a pCPU to look at its requests (and, as a
/// side effect of the IRQ exit, to refill a running vCPU's list registers).
pub const SGI_KICK: IntId = match IntId::sgi(1) {
    Ok(id) => id,
    Err(_) => panic!("SGI 1 exists"),
};

pub struct PcpuShared {
    pub mpidr: AtomicU64,
    pub online: AtomicBool,
    /// Call `schedule()` at the next opportunity.
    pub resched: AtomicBool,
    /// Earliest requested scheduler deadline (ns), u64::MAX = none.
    pub rearm_at: AtomicU64,
    /// The vCPU index running here, usize::MAX = none.
    pub running: AtomicUsize,
}

impl PcpuShared {
    const fn new() -> Self {
        Self {
            mpidr: AtomicU64::new(0),
            online: AtomicBool::new(false),
            resched: AtomicBool::new(false),
            rearm_at: AtomicU64::new(u64::MAX),
            running: AtomicUsize::new(usize::MAX),
        }
    }
}

#[allow(clippy::declare_interior_mutable_const)]
const INIT: PcpuShared = PcpuShared::new();
pub static PCPUS: [PcpuShared; MAX_CPUS] = [INIT; MAX_CPUS];

#[allow(clippy::declare_interior_mutable_const)]
const RUN_INIT: CpuRun = CpuRun::new();
static mut RUNS: [CpuRun; MAX_CPUS] = [RUN_INIT; MAX_CPUS];

/// This pCPU's run block (guest entry/exit save area).
///
/// # Safety
///
/// Call once per `cpu`, from that pCPU: the block is handed out as
/// `&'static mut`, so a second call for the same index would alias it.
pub unsafe fn run_block(cpu: usize) -> &'static mut CpuRun {
    // SAFETY: the caller takes each entry once; indexing panics (at boot)
    // rather than going out of bounds for a bad `cpu`.
    unsafe { &mut (*core::ptr::addr_of_mut!(RUNS))[cpu] }
}

/// Asks pCPU `cpu` to reschedule, by SGI when it is not this one.
pub fn request_resched(me: usize, cpu: usize) {
    PCPUS[cpu].resched.store(true, Ordering::Release);
    if cpu != me {
        kick(cpu);
    }
}

/// Asks pCPU `cpu` to move its scheduler deadline to `at` or earlier.
pub fn request_rearm(me: usize, cpu: usize, at: u64) {
    PCPUS[cpu].rearm_at.fetch_min(at, Ordering::AcqRel);
    if cpu != me {
        kick(cpu);
    }
}

/// Interrupts pCPU `cpu` (a running vCPU there exits and refills its LRs).
pub fn kick(cpu: usize) {
    let mpidr = PCPUS[cpu].mpidr.load(Ordering::Acquire);
    crate::arch::gic::send_sgi(SGI_KICK, mpidr);
}

/// Counter frequency in Hz.
pub fn cntfrq() -> u64 {
    CNTFRQ_EL0.get().max(1)
}

/// The physical counter in nanoseconds (the scheduler's clock).
pub fn now_ns() -> u64 {
    ticks_to_ns(CNTPCT_EL0.get())
}

/// Counter ticks in ns, saturating (see `crate::time`).
pub fn ticks_to_ns(t: u64) -> u64 {
    crate::time::ticks_to_ns(t, cntfrq())
}

fn ns_to_ticks(ns: u64) -> u64 {
    crate::time::ns_to_ticks(ns, cntfrq())
}

/// Arms the EL2 physical timer (CNTHP) at `ns`, or stops it.
pub fn arm_hyp_timer(at: Option<u64>) {
    match at {
        Some(ns) => {
            CNTHP_CVAL_EL2.set(ns_to_ticks(ns));
            CNTHP_CTL_EL2.write(CNTHP_CTL_EL2::ENABLE::SET + CNTHP_CTL_EL2::IMASK::CLEAR);
        }
        None => CNTHP_CTL_EL2.write(CNTHP_CTL_EL2::ENABLE::CLEAR + CNTHP_CTL_EL2::IMASK::SET),
    }
    crate::arch::sysreg::isb();
}
