//! What a wake does: the scheduler's answer (`Scheduler::wake`), the pCPU
//! the woken vCPU runs on interrupted so it sees its new interrupt, the
//! reschedule or timer request the answer asks for. `runtime::wake` adds
//! the VM's counters and the flight recorder around it.

use super::pcpu::{self, PcpuShared};
use crate::sched::{Deferral, Sched, VcpuId, WakeAction, WakeCause};
use crate::vgic::Kicks;

/// One wake as the scheduler answered it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Woken {
    /// Whether the vCPU was blocked (a real wake-up, not a kick).
    pub blocked: bool,
    /// What the scheduler asks of some pCPU.
    pub action: WakeAction,
    /// How a preemption it asked for was deferred, if it was.
    pub deferral: Option<(Deferral, u64)>,
    /// The other pCPU the vCPU runs on: it must be interrupted to see its
    /// new interrupt. `None` when it runs on the waker's pCPU (its LRs are
    /// refilled at the next entry) or does not run.
    pub kick: Option<usize>,
}

/// Wakes vCPU `g` for `cause`, from pCPU `me`. An error of the scheduler
/// (a vCPU it does not know, one powered off) is a wake that does nothing.
pub fn wake(sched: &Sched, me: usize, now: u64, g: VcpuId, cause: WakeCause) -> Woken {
    match sched.wake_located(now, g, cause) {
        Ok(w) => Woken { blocked: w.blocked, action: w.action, deferral: w.deferral, kick: w.on.filter(|&p| p != me) },
        Err(_) => Woken { blocked: false, action: WakeAction::None, deferral: None, kick: None },
    }
}

/// Carries out the scheduler's answer to a wake, from pCPU `me`.
pub fn act(pcpus: &[PcpuShared], me: usize, action: WakeAction) {
    match action {
        WakeAction::None => {}
        WakeAction::Reschedule { pcpu } => pcpu::request_resched(pcpus, me, pcpu),
        WakeAction::RearmTimer { pcpu, at } => pcpu::request_rearm(pcpus, me, pcpu, at),
    }
}

/// The vCPUs of `kicks` a vGIC change must wake or interrupt, from pCPU
/// `me`: all but those running on `me`, which see it at their next entry.
/// `running_on(v)` is the pCPU vCPU `v` runs on (`usize::MAX`: none).
pub fn to_wake(kicks: Kicks, me: usize, running_on: impl Fn(usize) -> usize) -> impl Iterator<Item = usize> {
    kicks.iter().filter(move |&k| running_on(k) != me)
}
