//! Waking vCPUs: what an injection, a doorbell or a timer does to the
//! vCPU it is for (`Scheduler::wake`, then a kick of the pCPU it runs on or
//! a reschedule request), and the flight-recorder note of each step. Used by
//! the trap and interrupt paths (`runtime::vcpu`), the vITS and the GICv4
//! doorbells, so it sits below all of them.

use super::percpu::{self, now_ns};
use super::vm::{inc, Vm};
use crate::sched::{RunState, WakeAction, WakeCause};
use crate::trace::Event;
use crate::vgic::Kicks;
use core::sync::atomic::Ordering;

/// Records `ev` now in this pCPU's flight-recorder ring.
pub(super) fn rec(vm: &Vm, me: usize, ev: Event) {
    vm.trace[me].lock().push(now_ns(), ev);
}

/// Acts on the scheduler's answer to a wake.
pub(super) fn do_wake_action(me: usize, a: WakeAction) {
    match a {
        WakeAction::None => {}
        WakeAction::Reschedule { pcpu } => percpu::request_resched(me, pcpu),
        WakeAction::RearmTimer { pcpu, at } => percpu::request_rearm(me, pcpu, at),
    }
}

/// Makes every kicked vCPU notice its new interrupt: wake it if blocked,
/// interrupt its pCPU if it runs elsewhere.
pub(super) fn process_kicks(vm: &Vm, me: usize, kicks: Kicks, cause: WakeCause) {
    if kicks.is_empty() {
        return;
    }
    let now = now_ns();
    for k in kicks.iter() {
        let running = vm.shared[k].running_on.load(Ordering::Acquire);
        if running == me {
            continue; // refilled at the next entry
        }
        wake_vcpu(vm, me, k, now, cause);
    }
}

/// Wakes vCPU `k` if blocked, or interrupts its pCPU if it runs elsewhere.
pub(super) fn wake_vcpu(vm: &Vm, me: usize, k: usize, now: u64, cause: WakeCause) {
    inc(&vm.shared[k].counters.kicks);
    let g = vm.gid(k);
    let (action, state, blocked, deferral) = {
        let mut s = vm.sched.lock();
        let blocked = s.state(g) == Some(RunState::Blocked);
        let a = s.wake(now, g, cause).unwrap_or(WakeAction::None);
        (a, s.state(g), blocked, s.wake_deferral())
    };
    vm.trace[me].lock().wake(now, g, cause, blocked, action, deferral);
    if let Some(RunState::Running(p)) = state {
        if p != me {
            rec(vm, me, Event::Kick { pcpu: p as u16 });
            percpu::kick(p);
        }
    }
    do_wake_action(me, action);
}
