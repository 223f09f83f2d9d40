//! The scheduling flight recorder in a real guest: with
//! `sched_trace_threshold_us=1` every wake→run latency is an outlier, so the
//! hypervisor dumps its rings (at most 8 times), and each dump parses with
//! `xtask::trace` and holds the wake and the schedule-in it is about.

use hypervisor::trace::{Event, WakeOutcome, MAX_DUMPS};
use integration_tests::*;
use xtask::trace::{parse_dumps, Reason};

#[test]
fn outlier_dumps_name_the_vcpu_and_hold_its_wake_and_schedule_in() {
    let r = run_cmd("nproc", |o| {
        o.pcpus = 1;
        o.vcpus = 2;
        o.hv_args = "sched_trace_threshold_us=1".into();
    });
    assert_eq!(r.guest_exit, Some(0));
    let dumps = parse_dumps(&r.console).expect("the dumps parse");
    assert!(!dumps.is_empty() && dumps.len() <= MAX_DUMPS as usize, "{} dumps:\n{}", dumps.len(), tail(&r.console, 60));
    for d in &dumps {
        let Reason::Outlier { vcpu, latency_ns } = d.reason else { panic!("not an outlier dump: {d:?}") };
        assert!(latency_ns > 1000, "under the threshold: {latency_ns}");
        assert_eq!(d.rings.len(), 1, "one ring per pCPU");
        let v = vcpu as u16;
        // The schedule-in the dump is about, with the latency in its header...
        let (_, sin) = d
            .events
            .iter()
            .rev()
            .find(|(_, r)| matches!(r.ev, Event::SchedIn { vcpu, wake_ns, .. } if vcpu == v && wake_ns == latency_ns))
            .unwrap_or_else(|| panic!("no sched_in of vcpu{v} after {latency_ns} ns:\n{}", d.timeline()));
        // ...and the wake that started the wait, exactly that long before.
        let woke = d.events.iter().any(|(_, r)| {
            r.t + latency_ns == sin.t
                && matches!(r.ev, Event::Wake { vcpu, outcome, .. } if vcpu == v && outcome != WakeOutcome::Noop)
        });
        assert!(woke, "no wake of vcpu{v} at {}:\n{}", sin.t - latency_ns, d.timeline());
        assert_eq!(d.outlier_span(), Some((sin.t - latency_ns, sin.t)));
        // Exits and timer events are recorded as well.
        assert!(d.events.iter().any(|(_, r)| matches!(r.ev, Event::Exit { .. })), "{}", d.timeline());
    }
    // The rate limit: the run has far more wakes than dumps.
    assert!(stat(&r.console, 1, "kick_to_run_ns.count").unwrap() > MAX_DUMPS as u64);
}
