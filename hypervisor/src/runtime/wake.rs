//! Waking vCPUs: what an injection, a doorbell or a timer does to the
//! vCPU it is for (`Scheduler::wake`, then a kick of the pCPU it runs on or
//! a reschedule request), and the flight-recorder note of each step. Used by
//! the trap and interrupt paths (`runtime::vcpu`), the vITS and the GICv4
//! doorbells, so it sits below all of them. And stopping a DomU, which is
//! waking each of its vCPUs once so that it goes offline.

use super::percpu::{self, now_ns};
use super::vm::{inc, Vm};
use crate::intid::IntId;
use crate::runloop::wake;
use crate::sched::{WakeAction, WakeCause};
use crate::trace::Event;
use crate::vgic::Kicks;
use core::sync::atomic::Ordering;

/// Records `ev` now in this pCPU's flight-recorder ring.
pub(super) fn rec(vm: &Vm, me: usize, ev: Event) {
    vm.trace[me].lock().push(now_ns(), ev);
}

/// Acts on the scheduler's answer to a wake.
pub(super) fn do_wake_action(me: usize, a: WakeAction) {
    crate::runloop::wake::act(percpu::all(), me, a);
}

/// Drives input line `intid` of the vGIC (a PPI's of vCPU `vcpu`, or an
/// SPI) to `level` and wakes whom that made an interrupt deliverable to; the
/// vGIC's lock is released before the wakes. An INTID the vGIC refuses
/// changes nothing.
#[inline]
pub(super) fn set_line(vm: &Vm, me: usize, intid: IntId, vcpu: usize, level: bool, cause: WakeCause) {
    let kicks = vm.vgic.lock().set_level(intid, vcpu, level);
    if let Ok(k) = kicks {
        process_kicks(vm, me, k, cause);
    }
}

/// Makes every kicked vCPU notice its new interrupt: wake it if blocked,
/// interrupt its pCPU if it runs elsewhere.
pub(super) fn process_kicks(vm: &Vm, me: usize, kicks: Kicks, cause: WakeCause) {
    if kicks.is_empty() {
        return;
    }
    let now = now_ns();
    let running_on = |k: usize| vm.shared.get(k).map_or(usize::MAX, |s| s.running_on.load(Ordering::Acquire));
    for k in wake::to_wake(kicks, me, running_on) {
        wake_vcpu(vm, me, k, now, cause);
    }
}

/// Wakes vCPU `k` if blocked, or interrupts its pCPU if it runs elsewhere.
pub(super) fn wake_vcpu(vm: &Vm, me: usize, k: usize, now: u64, cause: WakeCause) {
    inc(&vm.shared[k].counters.kicks);
    let g = vm.gid(k);
    let w = wake::wake(vm.sched, me, now, g, cause);
    {
        // One lock round trip and one time stamp for both notes.
        let mut t = vm.trace[me].lock();
        t.wake(now, g, cause, w.blocked, w.action, w.deferral);
        if let Some(p) = w.kick {
            t.push(now, Event::Kick { pcpu: p as u16 });
        }
    }
    if let Some(p) = w.kick {
        percpu::kick(p);
    }
    do_wake_action(me, w.action);
}

/// Stops the DomU `vm` (its SYSTEM_OFF or SYSTEM_RESET, `hvctl destroy`):
/// each of its vCPUs goes offline at its next switch-in or exit
/// (`runtime::vcpu`'s `run_vcpu`); the online ones are woken or kicked here
/// so that each runs once to do so. Its memory and emulated devices stay as
/// they are, unused; its assigned PCIe functions are reset
/// (`runtime::pci`). Returns false if it had stopped already.
pub fn stop_vm(vm: &Vm, me: usize, what: &str) -> bool {
    if vm.stopped.swap(true, Ordering::AcqRel) {
        return false;
    }
    log::info!("d{} {what}: the domain stops", vm.domid);
    crate::runtime::pci::reset_domain(vm.domid, &vm.pci_functions);
    if super::console::input_focus() == vm.domid {
        // Nobody reads its console any more: input goes back to Dom0.
        crate::hvprintln!("(HV) input to d0");
        super::console::set_input_focus(0);
    }
    let now = now_ns();
    for k in (0..vm.shared.len()).filter(|&k| vm.shared[k].online.load(Ordering::Acquire)) {
        wake_vcpu(vm, me, k, now, WakeCause::Interrupt);
    }
    true
}

/// `hvctl pause` (`on`) and `unpause` of the DomU `vm`: its vCPUs block at
/// their next switch-in (`runtime::vcpu`'s `run_vcpu`) and stay blocked
/// whatever wakes them; the running ones are made to reschedule now (a
/// vCPU being switched in this very moment runs until its slice ends).
/// Unpaused, every online one is woken and runs again (what became pending
/// meanwhile is delivered). Returns false if it was so already. The exit
/// path does not look at the flag: pausing costs it nothing.
pub fn pause_vm(vm: &Vm, me: usize, on: bool) -> bool {
    if vm.paused.swap(on, Ordering::SeqCst) == on {
        return false;
    }
    log::info!("d{} {}", vm.domid, if on { "paused" } else { "unpaused" });
    let now = now_ns();
    for k in (0..vm.shared.len()).filter(|&k| vm.shared[k].online.load(Ordering::Acquire)) {
        match (on, vm.shared[k].running_on.load(Ordering::SeqCst)) {
            (true, usize::MAX) => {}
            (true, p) => percpu::request_resched(me, p),
            (false, _) => wake_vcpu(vm, me, k, now, WakeCause::Interrupt),
        }
    }
    true
}
