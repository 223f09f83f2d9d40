//! The scheduling flight recorder in a real guest: with
//! `sched_trace_threshold_us=1` every wake→run latency is an outlier, so the
//! hypervisor dumps its rings (at most 8 times), and each dump parses with
//! `xtask::trace` and holds the wake and the schedule-in it is about (or,
//! for a late virtual-timer wake, the schedule-in and its `vtimer_late`).

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
    // Exits are recorded as well. Not necessarily in every dump: a dump's
    // window is time-bounded (`outlier_window_start`), and the guest's
    // clock runs on while the host deschedules QEMU, so a window may hold
    // nothing but the wake and the switch it is about.
    assert!(
        dumps.iter().any(|d| d.events.iter().any(|(_, r)| matches!(r.ev, Event::Exit { .. }))),
        "no exit in any of {} dumps:\n{}",
        dumps.len(),
        tail(&r.console, 60)
    );
    let mut outliers = 0;
    for d in &dumps {
        assert_eq!(d.rings.len(), 1, "one ring per pCPU");
        let (vcpu, latency_ns) = match d.reason {
            Reason::Outlier { vcpu, latency_ns } => (vcpu as u16, latency_ns),
            Reason::TimerLate { vcpu, late_ns } => {
                // A switch-in late after the vCPU's virtual-timer deadline:
                // its sched_in, and the vtimer_late event at the same time.
                let v = vcpu as u16;
                let (_, late) = d
                    .events
                    .iter()
                    .rev()
                    .find(|(_, r)| r.ev == Event::TimerWake { vcpu: v, late_ns })
                    .unwrap_or_else(|| panic!("no vtimer_late of vcpu{v}:\n{}", d.timeline()));
                let sin = d
                    .events
                    .iter()
                    .any(|(_, r)| r.t == late.t && matches!(r.ev, Event::SchedIn { vcpu, .. } if vcpu == v));
                assert!(sin && late_ns > 1000, "{}", d.timeline());
                continue;
            }
            Reason::Key => panic!("not an outlier dump: {d:?}"),
        };
        outliers += 1;
        assert!(latency_ns > 1000, "under the threshold: {latency_ns}");
        let v = vcpu;
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
    }
    assert!(outliers > 0, "no wake→run outlier among {} dumps", dumps.len());
    // The rate limit: the run has far more wakes than dumps.
    assert!(stat(&r.console, 1, "kick_to_run_ns.count").unwrap() > MAX_DUMPS as u64);
}

/// `sched_trace_dom0_key=on`: Dom0 writing Ctrl-\ (0x1c) to its console
/// dumps the rings (what `bench timer --breaktrace` uses right after
/// cyclictest's break), at most `sched_trace_max_dumps` times; the byte
/// itself is not printed. Without the option the byte is ordinary output.
#[test]
fn dom0_writing_ctrl_backslash_dumps_only_with_sched_trace_dom0_key() {
    let cmd = "printf 'key1\\034\\n'; printf 'key2\\034\\n'; printf 'key3\\034\\n'; echo keys-done";
    let on = run_cmd(cmd, |o| o.hv_args = "sched_trace_dom0_key=on sched_trace_max_dumps=2".into());
    assert_eq!(on.guest_exit, Some(0));
    assert_console(&on, "keys-done");
    let dumps = parse_dumps(&on.console).expect("the dumps parse");
    assert_eq!(dumps.len(), 2, "sched_trace_max_dumps=2:\n{}", tail(&on.console, 40));
    for d in &dumps {
        assert_eq!(d.reason, Reason::Key);
        assert!(d.events.iter().any(|(_, r)| matches!(r.ev, Event::Exit { .. })), "{}", d.timeline());
    }
    assert!(!on.console.contains('\x1c'), "the key byte was printed");
    let off = run_cmd(cmd, |_| {});
    assert_eq!(off.guest_exit, Some(0));
    assert!(parse_dumps(&off.console).expect("parses").is_empty(), "dumped without the option");
    assert!(off.console.contains("key1\x1c"), "the byte is output as is without the option");
}
