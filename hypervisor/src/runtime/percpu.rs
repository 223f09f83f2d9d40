//! Per-pCPU state: what other pCPUs may set (reschedule requests, timer
//! re-arm requests) as atomics, the run block for guest entry, and time.
//! Allocated at boot for the machine's pCPUs ([`init`],
//! `crate::boot::pcpus`): there is no fixed CPU count.

use crate::arch::exception::CpuRun;
use crate::arch::sysreg::CNTHP_CVAL_EL2;
use crate::sync::Once;
use aarch64_cpu::registers::{CNTFRQ_EL0, CNTHP_CTL_EL2, CNTPCT_EL0};
use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};
use tock_registers::interfaces::{Readable, Writeable};

pub use crate::runloop::pcpu::{PcpuShared, SGI_KICK};

/// `PcpuShared::hyp_timer_at` of a stopped EL2 timer.
const HYP_TIMER_OFF: u64 = u64::MAX;

/// A deadline watched by pCPU `cpu`'s EL2 timer (a saved vCPU's timers or
/// WFIT limit, a disk's completion) changed: `cpu` recomputes the earliest
/// before it next arms the timer. Call it after storing the new deadline.
/// A deadline that only moved later may go unreported: the stale earlier
/// value makes the timer fire once for nothing, and the firing pCPU
/// recomputes (`timer_expired`).
pub fn note_timers_changed(cpu: usize) {
    if let Some(p) = PCPUS.get().and_then(|p| p.get(cpu)) {
        p.timers_changed.store(true, Ordering::Release);
    }
}

impl PcpuShared {
    /// Arms this pCPU's EL2 physical timer (CNTHP) at `ns`, or stops it;
    /// call it on this pCPU only. Returns whether the deadline changed (the
    /// flight recorder notes only changes).
    ///
    /// The registers are written even when the deadline is unchanged: under
    /// QEMU's single-threaded `-icount`, where every test and benchmark
    /// runs, that write is what ends this emulated CPU's turn, so the other
    /// pCPUs run between two of its exits; without it a cross-pCPU wake-up
    /// waits for the sender's whole time slice (`bench exits`'
    /// `sgi-to-other-cpu`: 11 k instructions become 0.9 M) and the wake
    /// benchmarks on 2 pCPUs measure that instead. Skipping the write is
    /// ~60 instructions per exit, to take when those benchmarks are run
    /// again beside it. An unchanged deadline rewrites the compare value
    /// it already converted (one register write is enough for QEMU; the
    /// control register keeps its value).
    #[inline]
    pub fn arm_hyp_timer(&self, at: Option<u64>) -> bool {
        let want = at.unwrap_or(HYP_TIMER_OFF);
        let changed = self.hyp_timer_at.load(Ordering::Relaxed) != want;
        match at {
            Some(_) if !changed => CNTHP_CVAL_EL2.set(self.hyp_timer_cval.load(Ordering::Relaxed)),
            Some(ns) => {
                let cval = ns_to_ticks(ns);
                self.hyp_timer_cval.store(cval, Ordering::Relaxed);
                CNTHP_CVAL_EL2.set(cval);
                CNTHP_CTL_EL2.write(CNTHP_CTL_EL2::ENABLE::SET + CNTHP_CTL_EL2::IMASK::CLEAR);
            }
            None => CNTHP_CTL_EL2.write(CNTHP_CTL_EL2::ENABLE::CLEAR + CNTHP_CTL_EL2::IMASK::SET),
        }
        if changed {
            self.hyp_timer_at.store(want, Ordering::Relaxed);
        }
        crate::arch::sysreg::isb();
        changed
    }

    /// The earliest deadline of saved vCPUs and disks that this pCPU
    /// watches; `walk` computes it afresh when one was reported changed
    /// since the last call (on this pCPU only).
    pub fn timers_min(&self, walk: impl FnOnce() -> u64) -> u64 {
        // Loaded before the swap, which only a change pays for (see
        // `arm_timer`'s `rearm_at`).
        if self.timers_changed.load(Ordering::Acquire) && self.timers_changed.swap(false, Ordering::AcqRel) {
            self.timers_min.store(walk(), Ordering::Relaxed);
        }
        self.timers_min.load(Ordering::Relaxed)
    }
}

/// Every pCPU's shared state, allocated by [`init`].
static PCPUS: Once<&'static [PcpuShared]> = Once::new();

/// Allocates the shared state of `n` pCPUs: once, on the primary, after
/// the main heap is added and before any secondary starts.
pub fn init(n: usize) {
    PCPUS.call_once(|| Box::leak((0..n.max(1)).map(|_| PcpuShared::new()).collect::<Vec<_>>().into_boxed_slice()));
    NS_PER_TICK.store(crate::time::whole_ns_per_tick(cntfrq()).unwrap_or(0), Ordering::Relaxed);
}

/// Nanoseconds per counter tick when a whole number (0 until [`init`], or
/// for a frequency that does not divide 10^9): CNTFRQ_EL0 is the same on
/// every pCPU and never changes, so the clock's conversion is one
/// multiplication by a factor computed once.
static NS_PER_TICK: AtomicU64 = AtomicU64::new(0);

/// pCPU `cpu`'s shared state. `cpu` is an index the boot code handed out,
/// below the count [`init`] got; any other is a hypervisor bug and panics
/// like an out-of-bounds index.
#[inline]
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

/// Every pCPU's shared state ([`init`]).
pub fn all() -> &'static [PcpuShared] {
    PCPUS.get().copied().unwrap_or(&[])
}

/// Asks pCPU `cpu` to reschedule, by SGI when it is not this one.
pub fn request_resched(me: usize, cpu: usize) {
    crate::runloop::pcpu::request_resched(all(), me, cpu);
}

/// Asks pCPU `cpu` to move its scheduler deadline to `at` or earlier.
pub fn request_rearm(me: usize, cpu: usize, at: u64) {
    crate::runloop::pcpu::request_rearm(all(), me, cpu, at);
}

/// Interrupts pCPU `cpu` (a running vCPU there exits and refills its LRs).
pub fn kick(cpu: usize) {
    crate::runloop::pcpu::kick(all(), cpu);
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

/// Whether this pCPU's EL2 timer is on and its deadline has passed (it is
/// armed at or before the scheduler's deadline, `vcpu::arm_timer`: until it
/// fires, that deadline has not come, and the exit path reads no clock).
#[inline(always)]
pub fn hyp_timer_fired() -> bool {
    CNTHP_CTL_EL2.matches_all(CNTHP_CTL_EL2::ENABLE::SET + CNTHP_CTL_EL2::ISTATUS::SET)
}

/// The physical counter in nanoseconds (the scheduler's clock).
pub fn now_ns() -> u64 {
    ticks_to_ns(CNTPCT_EL0.get())
}

/// Counter ticks in ns (see `crate::time`). With a whole factor the
/// product is not checked: it overflows after 2^64 ns (584 years of
/// counting), which no counter value reaches.
#[inline]
pub fn ticks_to_ns(t: u64) -> u64 {
    match NS_PER_TICK.load(Ordering::Relaxed) {
        0 => crate::time::ticks_to_ns(t, cntfrq()),
        k => t.wrapping_mul(k),
    }
}

fn ns_to_ticks(ns: u64) -> u64 {
    match NS_PER_TICK.load(Ordering::Relaxed) {
        0 => crate::time::ns_to_ticks(ns, cntfrq()),
        k => ns.div_ceil(k),
    }
}
