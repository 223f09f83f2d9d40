//! Per-pCPU state: what other pCPUs may set (reschedule requests, timer
//! re-arm requests) as atomics, the run block for guest entry, and time.
//! Allocated at boot for the machine's pCPUs ([`init`],
//! `crate::boot::pcpus`): there is no fixed CPU count.

use crate::arch::exception::CpuRun;
use crate::arch::sysreg::CNTHP_CVAL_EL2;
use crate::intid::IntId;
use crate::sync::Once;
use aarch64_cpu::registers::{CNTFRQ_EL0, CNTHP_CTL_EL2, CNTPCT_EL0};
use alloc::boxed::Box;
use alloc::vec::Vec;
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

/// Every pCPU's shared state, allocated by [`init`].
static PCPUS: Once<&'static [PcpuShared]> = Once::new();

/// Allocates the shared state of `n` pCPUs: once, on the primary, after
/// the main heap is added and before any secondary starts.
pub fn init(n: usize) {
    PCPUS.call_once(|| Box::leak((0..n.max(1)).map(|_| PcpuShared::new()).collect::<Vec<_>>().into_boxed_slice()));
}

/// pCPU `cpu`'s shared state. `cpu` is an index the boot code handed out,
/// below the count [`init`] got; any other is a hypervisor bug and panics
/// like an out-of-bounds index.
pub fn pcpu(cpu: usize) -> &'static PcpuShared {
    &PCPUS.get().expect("percpu::init ran at boot")[cpu]
}

/// pCPU 0's run block: it is taken before the main heap exists.
static mut BOOT_RUN: CpuRun = CpuRun::new();

/// This pCPU's run block (guest entry/exit save area): pCPU 0's in the
/// image, the others' from the heap (call it with the MMU on).
///
/// # Safety
///
/// Call once per `cpu`, from that pCPU: pCPU 0's block is handed out as
/// `&'static mut`, so a second call for it would alias it.
pub unsafe fn run_block(cpu: usize) -> &'static mut CpuRun {
    if cpu == 0 {
        // SAFETY: pCPU 0 takes its block once (the caller's contract).
        unsafe { &mut *core::ptr::addr_of_mut!(BOOT_RUN) }
    } else {
        Box::leak(Box::new(CpuRun::new()))
    }
}

/// Asks pCPU `cpu` to reschedule, by SGI when it is not this one.
pub fn request_resched(me: usize, cpu: usize) {
    pcpu(cpu).resched.store(true, Ordering::Release);
    if cpu != me {
        kick(cpu);
    }
}

/// Asks pCPU `cpu` to move its scheduler deadline to `at` or earlier.
pub fn request_rearm(me: usize, cpu: usize, at: u64) {
    pcpu(cpu).rearm_at.fetch_min(at, Ordering::AcqRel);
    if cpu != me {
        kick(cpu);
    }
}

/// Interrupts pCPU `cpu` (a running vCPU there exits and refills its LRs).
pub fn kick(cpu: usize) {
    let mpidr = pcpu(cpu).mpidr.load(Ordering::Acquire);
    crate::arch::gic::send_sgi(SGI_KICK, mpidr);
}

/// Counter frequency in Hz.
pub fn cntfrq() -> u64 {
    CNTFRQ_EL0.get().max(1)
}

/// The physical counter in ticks (CNTVOFF_EL2 = 0: also every guest's
/// virtual counter).
pub fn counter() -> u64 {
    CNTPCT_EL0.get()
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
