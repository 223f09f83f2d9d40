//! Each pCPU's state that other pCPUs may set (a reschedule request, an
//! earlier scheduler deadline) and the SGI that makes it look. The table is
//! allocated at boot for the machine's pCPUs (`runtime::percpu`); the
//! functions here take it as an argument so host tests use their own.

use crate::arch::gic;
use crate::intid::IntId;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// The physical SGI that asks a pCPU to look at its requests (and, as a
/// side effect of the IRQ exit, to refill a running vCPU's list registers).
pub const SGI_KICK: IntId = match IntId::sgi(1) {
    Ok(id) => id,
    Err(_) => panic!("SGI 1 exists"),
};

/// `PcpuShared::hyp_timer_at` before the first programming: no deadline
/// equals it (584 years of uptime), so the first call always writes.
pub(crate) const HYP_TIMER_UNKNOWN: u64 = u64::MAX - 1;

// The EL2 timer's fields are used by `runtime::percpu` only, which the
// host build does not have.
#[cfg_attr(not(target_os = "none"), allow(dead_code))]
pub struct PcpuShared {
    /// Its MPIDR_EL1 affinity, where SGIs for it go (set as it comes up).
    pub mpidr: AtomicU64,
    pub online: AtomicBool,
    /// Call `schedule()` at the next opportunity.
    pub resched: AtomicBool,
    /// Earliest requested scheduler deadline (ns), u64::MAX = none.
    pub rearm_at: AtomicU64,
    /// The vCPU index running here, usize::MAX = none.
    pub running: AtomicUsize,
    /// What this pCPU's EL2 timer is programmed to (`arm_hyp_timer`): a
    /// deadline in ns, `HYP_TIMER_OFF`, or [`HYP_TIMER_UNKNOWN`] before
    /// the first programming. Only this pCPU reads or writes it.
    pub(crate) hyp_timer_at: AtomicU64,
    /// `hyp_timer_at` in counter ticks, when it is a deadline (only this
    /// pCPU reads or writes it).
    pub(crate) hyp_timer_cval: AtomicU64,
    /// Set by whoever changes a deadline this pCPU's EL2 timer watches for
    /// saved vCPUs and disks (`note_timers_changed`); the run loop then
    /// recomputes `timers_min` instead of walking every VM at each entry.
    pub(crate) timers_changed: AtomicBool,
    /// The earliest of those deadlines (ns) when last computed; only this
    /// pCPU reads or writes it.
    pub(crate) timers_min: AtomicU64,
    /// Quiescent points passed (`grace::quiescent`); only this pCPU writes it.
    pub quiescent: AtomicU64,
    /// Idle in WFI, holding nothing from the VM table (`grace::idle`).
    pub idle: AtomicBool,
}

impl PcpuShared {
    pub const fn new() -> Self {
        Self {
            mpidr: AtomicU64::new(0),
            online: AtomicBool::new(false),
            resched: AtomicBool::new(false),
            rearm_at: AtomicU64::new(u64::MAX),
            running: AtomicUsize::new(usize::MAX),
            hyp_timer_at: AtomicU64::new(HYP_TIMER_UNKNOWN),
            hyp_timer_cval: AtomicU64::new(0),
            timers_changed: AtomicBool::new(true),
            timers_min: AtomicU64::new(u64::MAX),
            quiescent: AtomicU64::new(0),
            idle: AtomicBool::new(false),
        }
    }
}

impl Default for PcpuShared {
    fn default() -> Self {
        Self::new()
    }
}

/// Interrupts pCPU `cpu` of `pcpus` (a running vCPU there exits and
/// refills its LRs; an idle one looks at its requests).
pub fn kick(pcpus: &[PcpuShared], cpu: usize) {
    if let Some(p) = pcpus.get(cpu) {
        gic::send_sgi(SGI_KICK, p.mpidr.load(Ordering::Acquire));
    }
}

/// Asks pCPU `cpu` to reschedule; by SGI when it is not `me`, which looks
/// at its flag on the way back to the guest anyway.
pub fn request_resched(pcpus: &[PcpuShared], me: usize, cpu: usize) {
    let Some(p) = pcpus.get(cpu) else { return };
    p.resched.store(true, Ordering::Release);
    if cpu != me {
        kick(pcpus, cpu);
    }
}

/// Asks pCPU `cpu` to move its scheduler deadline to `at` or earlier.
pub fn request_rearm(pcpus: &[PcpuShared], me: usize, cpu: usize, at: u64) {
    let Some(p) = pcpus.get(cpu) else { return };
    p.rearm_at.fetch_min(at, Ordering::AcqRel);
    if cpu != me {
        kick(pcpus, cpu);
    }
}
