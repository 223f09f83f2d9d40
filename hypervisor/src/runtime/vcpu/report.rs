//! What the hypervisor reports: counters at power-off, flight-recorder
//! dumps, and stopping a domain or the machine.

use super::*;

/// `sched_trace_threshold_us`: dumps the rings when the vCPU `d` switched
/// in waited longer than that since its wake (rate-limited by the trigger).
/// The same for a virtual-timer wake: how late after the timer's deadline
/// the vCPU switched in (what cyclictest sees, less the guest's own part).
/// `next`: the VM and local index of `d.next`, which the caller looked up.
pub(super) fn dump_if_outlier(me: usize, now: u64, d: &crate::sched::Decision, next: Option<(&Vm, usize)>) {
    let Some((vcpu, _, lat)) = d.switch.into else { return };
    let found = if d.next == Some(vcpu) { next } else { vcpu_of(vcpu) };
    let Some((vm, local)) = found else { return };
    // A plain load first: the swap (an exclusive-access loop) only after a
    // timer wake.
    let fired = &vm.shared[local].vtimer_fired;
    let due = match fired.load(Ordering::Acquire) {
        u64::MAX => u64::MAX,
        _ => fired.swap(u64::MAX, Ordering::AcqRel),
    };
    let late = (due != u64::MAX).then(|| now.saturating_sub(due));
    if let Some(l) = late {
        vm.trace[me].lock().push(now, Event::TimerWake { vcpu: vcpu.0 as u16, late_ns: l });
    }
    let why = match (lat, late) {
        (Some(lat), _) if vm.trace_trigger.fire(now, lat) => DumpReason::Outlier { vcpu, latency_ns: lat },
        (_, Some(l)) if vm.trace_trigger.fire(now, l) => DumpReason::TimerLate { vcpu, late_ns: l },
        _ => return,
    };
    let span = match why {
        DumpReason::Outlier { latency_ns, .. } => latency_ns,
        DumpReason::TimerLate { late_ns, .. } => late_ns,
        DumpReason::Key | DumpReason::Request => 0,
    };
    vm.dump_trace(why, crate::trace::outlier_window_start(now, span));
}

/// Prints every VM's statistics (`runtime::stats::write_stats`) and the
/// control device's counters on the console.
pub fn print_stats() {
    let mut text = alloc::string::String::new();
    crate::runtime::stats::write_stats(&mut text);
    crate::runtime::devices::control::write_counters(&mut text, crate::runtime::devices::control::counters());
    for line in text.lines() {
        crate::hvprintln!("{line}");
    }
}

/// Dom0's SYSTEM_OFF: the machine powers off (whatever DomUs still run).
pub(super) fn power_off() -> ! {
    print_stats();
    info!("dom0 powered off; powering off the machine");
    console::flush();
    smc::psci_system_off()
}

/// A DomU's SYSTEM_OFF or SYSTEM_RESET: only that domain stops. Its vCPUs go
/// offline (the caller's now; the others at their next switch-in or exit,
/// see `run_vcpu`); its assigned PCIe functions are reset (`runtime::pci`).
/// A boot-time DomU's memory and emulated devices stay as they are, unused
/// (`hvctl destroy` frees them); one `hvctl create` made is destroyed
/// (`runtime::domctl::stopped_itself`, xl's `on_poweroff="destroy"`).
pub(super) fn stop_domain(vm: &Vm, me: usize, v: &Vcpu, what: &str) -> Next {
    vm.shared[v.id].online.store(false, Ordering::Release);
    if let Err(e) = vm.sched.power_off(now_ns(), me) {
        warn!("d{} vCPU{}: stopping: {e}", vm.domid, v.id);
    }
    crate::runtime::wake::stop_vm(vm, me, what);
    crate::runtime::domctl::stopped_itself(me, vm.domid);
    Next::Schedule
}
