use super::*;
use crate::sched::{RunState, SchedConfig, Scheduler};
use alloc::string::String;
use alloc::vec;

#[test]
fn ring_overwrites_oldest_and_iterates_in_order() {
    let mut r = Ring::new(3);
    assert!(r.is_empty());
    for t in 1..=5 {
        r.push(t, Event::TimerFire);
    }
    let ts: Vec<u64> = r.iter().map(|e| e.t).collect();
    assert_eq!(ts, vec![3, 4, 5]);
    assert_eq!(r.overwritten(), 2);
    assert_eq!(r.len(), 3);
    // No reallocation: the capacity is the one given at creation.
    assert_eq!(r.buf.capacity(), 3);
    let mut r = Ring::new(4);
    r.push(1, Event::Idle);
    r.push(2, Event::Idle);
    assert_eq!(r.snapshot().iter().map(|e| e.t).collect::<Vec<_>>(), vec![1, 2]);
}

#[test]
fn timer_arm_recorded_only_when_it_changes() {
    let mut r = Ring::new(16);
    r.note_arm(1, Some(100));
    r.note_arm(2, Some(100));
    r.note_arm(3, Some(200));
    r.note_fire(4);
    r.note_arm(5, Some(200));
    r.note_arm(6, None);
    let evs: Vec<Event> = r.iter().map(|e| e.ev).collect();
    assert_eq!(
        evs,
        vec![
            Event::TimerArm { at: 100 },
            Event::TimerArm { at: 200 },
            Event::TimerFire,
            Event::TimerArm { at: 200 },
            Event::TimerArm { at: u64::MAX }
        ]
    );
}

#[test]
fn text_format_is_stable() {
    let line = |ev| alloc::format!("{}", Line { pcpu: 1, rec: &Record { t: 42, ev } });
    let w = |outcome| Event::Wake { vcpu: 1, cause: WakeCause::Timer, outcome };
    assert_eq!(line(w(WakeOutcome::Noop)), "trace pcpu1 t=42 wake vcpu1 cause=timer action=noop");
    assert_eq!(
        line(w(WakeOutcome::Resched { pcpu: 0 })),
        "trace pcpu1 t=42 wake vcpu1 cause=timer action=resched pcpu=0"
    );
    assert_eq!(
        line(w(WakeOutcome::Rearm { pcpu: 0, at: 99 })),
        "trace pcpu1 t=42 wake vcpu1 cause=timer action=rearm pcpu=0 at=99"
    );
    assert_eq!(line(Event::Defer { kind: Deferral::MinRun, until: 7 }), "trace pcpu1 t=42 defer kind=min_run until=7");
    assert_eq!(line(Event::Kick { pcpu: 0 }), "trace pcpu1 t=42 kick pcpu=0");
    assert_eq!(
        line(Event::SchedOut { vcpu: 0, credit: -5, reason: SwitchReason::WakePreempt }),
        "trace pcpu1 t=42 sched_out vcpu0 credit=-5 reason=wake_preempt"
    );
    assert_eq!(
        line(Event::SchedIn { vcpu: 1, credit: 9, wake_ns: 300 }),
        "trace pcpu1 t=42 sched_in vcpu1 credit=9 wake_ns=300"
    );
    assert_eq!(
        line(Event::SchedIn { vcpu: 1, credit: 9, wake_ns: u64::MAX }),
        "trace pcpu1 t=42 sched_in vcpu1 credit=9"
    );
    assert_eq!(line(Event::TimerArm { at: u64::MAX }), "trace pcpu1 t=42 timer_arm off");
    assert_eq!(line(Event::Exit { vcpu: 2, class: ExitClass::Sgi }), "trace pcpu1 t=42 exit vcpu2 class=sgi");
    assert_eq!(line(Event::TimerWake { vcpu: 1, late_ns: 5 }), "trace pcpu1 t=42 vtimer_late vcpu1 late_ns=5");
    assert_eq!(
        line(Event::IrqsOff { vcpu: 1, pc: 0xffff_8000_0812_3456 }),
        "trace pcpu1 t=42 irqs_off vcpu1 pc=0xffff800008123456"
    );
}

#[test]
fn exit_classes() {
    use crate::esr::{MmioAccess, SysRegAccess, WfxTimeout};
    assert_eq!(ExitClass::of(&Exit::Wfx { wfe: false, timeout: WfxTimeout::None }), ExitClass::Wfi);
    assert_eq!(ExitClass::of(&Exit::Wfx { wfe: true, timeout: WfxTimeout::None }), ExitClass::Wfe);
    let sgi = SysRegAccess { op0: 3, op1: 0, crn: 12, crm: 11, op2: 5, reg: 0, read: false };
    assert_eq!(ExitClass::of(&Exit::SysReg(sgi)), ExitClass::Sgi);
    assert_eq!(ExitClass::of(&Exit::SysReg(SysRegAccess { read: true, ..sgi })), ExitClass::Sysreg);
    let m = MmioAccess { ipa: 0, size: 4, write: true, reg: 0, sign_extend: false, reg64: false };
    assert_eq!(ExitClass::of(&Exit::Mmio(m)), ExitClass::Mmio);
    assert_eq!(ExitClass::of(&Exit::Hvc { imm: 0 }), ExitClass::Hvc);
}

#[test]
fn trigger_threshold_and_rate_limit() {
    let off = Trigger::new(None, MAX_DUMPS);
    assert!(!off.fire(u64::MAX, u64::MAX));
    let t = Trigger::new(Some(150), MAX_DUMPS);
    assert!(!t.fire(1_000_000, 150_000));
    let fired = (0..20).filter(|_| t.fire(1_000_000, 150_001)).count();
    assert_eq!(fired, MAX_DUMPS as usize);
    let two = Trigger::new(Some(1), 2);
    assert_eq!((0..5).filter(|_| two.fire(10_000, 2000)).count(), 2);
    // A wait that overlaps the last dump is the dump's doing: no cascade.
    let t = Trigger::new(Some(150), MAX_DUMPS);
    t.dumped(5_000_000);
    assert!(!t.fire(5_100_000, 200_000), "began at 4.9 ms, before the dump ended");
    assert!(t.fire(5_300_000, 200_000), "began at 5.1 ms");
}

#[test]
fn dom0_key_dumps_only_when_enabled_and_counts() {
    assert!(!Trigger::new(None, MAX_DUMPS).dom0_key(), "off by default");
    assert!(!Trigger::new(None, MAX_DUMPS).dom0_key_on());
    assert!(Trigger::new(None, 0).with_dom0_key(true).dom0_key_on());
    let t = Trigger::new(None, 2).with_dom0_key(true);
    assert_eq!((0..5).filter(|_| t.dom0_key()).count(), 2, "at most sched_trace_max_dumps");
    // Threshold dumps and Dom0's share the budget.
    let t = Trigger::new(Some(1), 1).with_dom0_key(true);
    assert!(t.dom0_key());
    assert!(!t.fire(10_000, 2000));
}

/// The acceptance test's synthetic outlier: the real scheduler, driven as
/// the run loop drives it and recorded with the same `Ring` calls, holds a
/// woken vCPU behind a hog's ratelimit window; the dump must appear, name
/// the vCPU and its latency, and hold the wake and the schedule-in.
#[test]
fn synthetic_outlier_dumps_the_events_that_explain_it() {
    const HOG: VcpuId = VcpuId(0);
    const RT: VcpuId = VcpuId(1);
    let mut s = Scheduler::new(SchedConfig::xen_compat(1000), 1).unwrap();
    s.add_domain(0, Default::default()).unwrap();
    s.add_vcpu(HOG, 0, None).unwrap();
    s.add_vcpu(RT, 0, None).unwrap();
    let mut ring = Ring::new(RING_EVENTS);
    let trigger = Trigger::new(Some(150), MAX_DUMPS);
    let mut dumps = Vec::new();
    let sched = |s: &mut Scheduler, ring: &mut Ring, now: u64, dumps: &mut Vec<String>| {
        let d = s.schedule(now, 0).unwrap();
        ring.decision(now, &d);
        ring.note_arm(now, d.timer_at);
        if let Some((v, _, Some(lat))) = d.switch.into {
            if trigger.fire(now, lat) {
                let mut out = String::new();
                let why = DumpReason::Outlier { vcpu: v, latency_ns: lat };
                let from = outlier_window_start(now, lat);
                write_dump(&mut out, why, &[(0, ring.snapshot(), ring.overwritten())], from).unwrap();
                dumps.push(out);
            }
        }
        d
    };
    s.power_on(0, HOG).unwrap();
    s.power_on(0, RT).unwrap();
    let _ = sched(&mut s, &mut ring, 0, &mut dumps);
    assert_eq!(s.current(0), Some(HOG));
    // The hog runs; RT is the one runnable and then blocks, as in cyclictest.
    let now = 2_000_000;
    ring.note_fire(now);
    let _ = sched(&mut s, &mut ring, now, &mut dumps);
    assert_eq!(s.current(0), Some(RT));
    ring.push(now + 10_000, Event::Exit { vcpu: 1, class: ExitClass::Wfi });
    s.block(now + 10_000, 0).unwrap();
    let _ = sched(&mut s, &mut ring, now + 10_000, &mut dumps);
    assert_eq!(s.current(0), Some(HOG));
    // RT's timer fires 20 µs into the hog's new ratelimit window: the
    // Xen-compatible wake path does not preempt, so RT waits out the window.
    let wake = now + 30_000;
    let blocked = s.state(RT) == Some(RunState::Blocked);
    let a = s.wake(wake, RT, WakeCause::Timer).unwrap();
    ring.wake(wake, RT, WakeCause::Timer, blocked, a, s.wake_deferral());
    assert_eq!(a, WakeAction::None);
    assert!(dumps.is_empty());
    let end = now + 10_000 + 1_000_000;
    ring.note_fire(end);
    let _ = sched(&mut s, &mut ring, end, &mut dumps);
    assert_eq!(s.current(0), Some(RT));
    assert_eq!(dumps.len(), 1, "one dump for the one outlier");
    let d = &dumps[0];
    let lat = end - wake;
    assert!(d.starts_with(&alloc::format!("(HV) trace begin reason=outlier vcpu1 latency_ns={lat}\n")), "{d}");
    assert!(d.contains(&alloc::format!("trace pcpu0 t={wake} wake vcpu1 cause=timer action=none\n")), "{d}");
    assert!(d.contains(&alloc::format!("trace pcpu0 t={wake} defer kind=ratelimit until={end}\n")), "{d}");
    assert!(d.contains(&alloc::format!("trace pcpu0 t={end} sched_out vcpu0 ")), "{d}");
    assert!(d.contains(&alloc::format!("reason=slice_end\ntrace pcpu0 t={end} sched_in vcpu1 ")), "{d}");
    assert!(d.contains(&alloc::format!(" wake_ns={lat}\n")), "{d}");
    // The hog's switch-in that opened the window is in the dump too.
    assert!(d.contains(&alloc::format!("trace pcpu0 t={} sched_in vcpu0 ", now + 10_000)), "{d}");
    assert!(d.ends_with("(HV) trace end\n"));
}
