//! Unit tests of the scheduler: Credit2 semantics, both wake paths, the
//! lock-holder defences, bad input, and the simulator's targets.

#![allow(clippy::identity_op)] // `1 * MS` reads better than `MS`

use super::sim::{self, Scenario, SimParams, Topology};
use super::*;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

fn v(n: u32) -> VcpuId {
    VcpuId(n)
}

/// vCPUs `(id, weight, affinity)`, each in its own domain (numbered like the vCPU).
fn sched(cfg: SchedConfig, pcpus: usize, vcpus: &[(u32, u32, Option<usize>)]) -> Scheduler {
    let mut s = Scheduler::new(cfg, pcpus).unwrap();
    for &(id, w, a) in vcpus {
        s.add_domain(id as DomainId, DomainParams { weight: w, cap_percent: None }).unwrap();
        s.add_vcpu(v(id), id as DomainId, a).unwrap();
        s.power_on(0, v(id)).unwrap();
    }
    s
}

/// Drive always-runnable vCPUs: call schedule() exactly when asked.
fn run_hogs(s: &mut Scheduler, until: u64) {
    let n = s.nr_pcpus();
    let mut timers: Vec<Option<u64>> = vec![Some(0); n];
    while let Some((p, t)) = timers.iter().enumerate().filter_map(|(p, t)| t.map(|t| (p, t))).min_by_key(|x| x.1) {
        if t > until {
            break;
        }
        let d = s.schedule(t, p).unwrap();
        timers[p] = d.timer_at;
        for k in d.kick.into_iter().chain(s.take_balance_kicks()) {
            timers[k] = Some(t);
        }
    }
    for p in 0..n {
        s.schedule(until, p).unwrap();
    }
}

fn run_ns(s: &Scheduler, id: u32) -> u64 {
    s.stats(v(id)).unwrap().counters.run_ns
}

#[test]
fn bootargs() {
    let c = SchedConfig::from_bootargs(
        "console=hvc0 sched=credit2 sched_ratelimit_us=0 sched_wake_preempt=off dom0_max_vcpus=2",
    )
    .unwrap();
    assert_eq!(c.ratelimit_ns, 0);
    assert_eq!(c.wake_mode, WakeMode::XenCompat);
    let c = SchedConfig::from_bootargs("sched_wake_preempt=on sched_wake_granularity_us=250 sched_lhp_grace_us=20")
        .unwrap();
    assert_eq!(c.wake_mode, WakeMode::Preempt);
    assert_eq!(c.wake_granularity_ns, 250 * US);
    assert_eq!(c.lhp_grace_ns, 20 * US);
    assert_eq!(SchedConfig::default().wake_min_run_ns, 100 * US);
    let c = SchedConfig::from_bootargs("sched_wake_min_run_us=250").unwrap();
    assert_eq!(c.wake_min_run_ns, 250 * US);
    assert_eq!(SchedConfig::from_bootargs("sched_wake_min_run_us=0").unwrap().wake_min_run_ns, 0);
    assert_eq!(
        SchedConfig::from_bootargs("sched_wake_min_run_us=1e3"),
        Err(SchedError::BadBootArg("sched_wake_min_run_us"))
    );
    assert_eq!(SchedConfig::from_bootargs("").unwrap(), SchedConfig::default());
    // Out of Xen's range: the default, as Xen does (with a warning).
    for bad in ["50", "99", "500001", "18446744073709551"] {
        let c = SchedConfig::from_bootargs(&alloc::format!("sched_ratelimit_us={bad}")).unwrap();
        assert_eq!(c.ratelimit_ns, SchedConfig::default().ratelimit_ns, "{bad}");
    }
    for edge in [100, 500_000] {
        let c = SchedConfig::from_bootargs(&alloc::format!("sched_ratelimit_us={edge}")).unwrap();
        assert_eq!(c.ratelimit_ns, edge * US);
    }
    assert_eq!(
        SchedConfig::from_bootargs("sched_ratelimit_us=1ms"),
        Err(SchedError::BadBootArg("sched_ratelimit_us")),
        "a malformed number is still an error"
    );
    // Xen's Credit2 options this scheduler lacks are claimed (warned about,
    // ignored), not passed on as unknown words.
    let mut c = SchedConfig::default();
    for k in XEN_OPTIONS_NOT_IMPLEMENTED {
        assert_eq!(c.set(k, "4"), Ok(true), "{k}");
    }
    assert_eq!(c, SchedConfig::default());
    assert_eq!(SchedConfig::from_bootargs("credit2_runqueue=core").unwrap().runqueue, RunqueueLayout::Core);
    let c = SchedConfig::from_bootargs("sched_credit2_max_cpus_runqueue=4 sched_credit2_migrate_resist=100").unwrap();
    assert_eq!((c.max_cpus_runqueue, c.migrate_resist_ns), (4, 100 * US));
    assert_eq!((c.nr_runqueues(16), c.nr_runqueues(17)), (4, 5));
    // As in Xen: out of range is warned about and the maximum used.
    assert_eq!(SchedConfig::from_bootargs("sched_credit2_max_cpus_runqueue=0").unwrap().max_cpus_runqueue, 16);
    assert_eq!(SchedConfig::from_bootargs("sched_credit2_max_cpus_runqueue=99").unwrap().max_cpus_runqueue, 16);
    assert!(SchedConfig::from_bootargs("sched_credit2_max_cpus_runqueue=x").is_err());
    assert_eq!(SchedConfig::default().nr_runqueues(192), 12);
    assert_eq!(SchedConfig::from_bootargs("credit2_runqueue=cpu").unwrap().nr_runqueues(192), 192);
    assert_eq!(
        SchedConfig::from_bootargs("sched_wake_preempt=maybe"),
        Err(SchedError::BadBootArg("sched_wake_preempt"))
    );
    assert_eq!(
        SchedConfig::from_bootargs("sched_wake_granularity_us=-1"),
        Err(SchedError::BadBootArg("sched_wake_granularity_us"))
    );
    assert_eq!(SchedConfig::from_bootargs("sched=credit"), Err(SchedError::BadBootArg("sched")));
    assert_eq!(SchedConfig::from_bootargs("sched_min_slice_us=0"), Err(SchedError::BadConfig));
}

#[test]
fn errors_not_panics() {
    assert_eq!(Scheduler::new(SchedConfig::default(), 0).err(), Some(SchedError::NoPcpus));
    let mut s = Scheduler::new(SchedConfig::default(), 1).unwrap();
    assert_eq!(s.add_domain(0, DomainParams { weight: 0, cap_percent: None }), Err(SchedError::BadWeight(0)));
    assert_eq!(s.add_domain(0, DomainParams { weight: 70000, cap_percent: None }), Err(SchedError::BadWeight(70000)));
    assert_eq!(s.add_domain(0, DomainParams { weight: 256, cap_percent: Some(0) }), Err(SchedError::BadCap(0)));
    assert_eq!(s.add_domain(0, DomainParams { weight: 256, cap_percent: Some(101) }), Err(SchedError::BadCap(101)));
    assert_eq!(s.add_vcpu(v(0), 0, None), Err(SchedError::UnknownDomain(0)));
    s.add_domain(0, DomainParams::default()).unwrap();
    assert_eq!(s.add_domain(0, DomainParams::default()), Err(SchedError::DuplicateDomain(0)));
    assert_eq!(s.set_domain_params(0, 7, DomainParams::default()), Err(SchedError::UnknownDomain(7)));
    assert_eq!(
        s.set_domain_params(0, 0, DomainParams { weight: 256, cap_percent: Some(500) }),
        Err(SchedError::BadCap(500))
    );
    assert_eq!(s.domain_params(0), Some(DomainParams::default()), "a refused change changes nothing");
    assert_eq!(s.add_vcpu(v(0), 0, Some(3)), Err(SchedError::BadPcpu(3)));
    s.add_vcpu(v(0), 0, None).unwrap();
    assert_eq!(s.add_vcpu(v(0), 0, None), Err(SchedError::DuplicateVcpu(v(0))));
    assert_eq!(s.domain_of(v(0)), Some(0));
    assert_eq!(s.domain_of(v(1)), None);
    assert_eq!(s.wake(0, v(9), WakeCause::Sgi), Err(SchedError::UnknownVcpu(v(9))));
    assert_eq!(s.block(0, 0), Err(SchedError::NotRunning(0)));
    assert_eq!(s.yield_to(0, 0, None), Err(SchedError::NotRunning(0)));
    assert_eq!(s.schedule(0, 1), Err(SchedError::BadPcpu(1)));
    // Offline: wakes are ignored and nothing runs.
    assert_eq!(s.wake(0, v(0), WakeCause::Interrupt), Ok(WakeAction::None));
    assert_eq!(s.schedule(0, 0).unwrap().next, None);
    // CPU_ON twice.
    assert_eq!(s.power_on(0, v(0)), Ok(WakeAction::Reschedule { pcpu: 0 }));
    assert_eq!(s.power_on(0, v(0)), Err(SchedError::AlreadyOnline(v(0))));
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(0)));
    // Wake of a running vCPU is a counted no-op.
    assert_eq!(s.wake(1, v(0), WakeCause::Sgi), Ok(WakeAction::None));
    assert_eq!(s.stats(v(0)).unwrap().counters.wakes_noop, 1);
    assert_eq!(s.stats(v(0)).unwrap().counters.wakes_sgi, 0);
    // CPU_OFF, then wakes are ignored again.
    assert_eq!(s.power_off(10, 0), Ok(v(0)));
    assert_eq!(s.schedule(10, 0).unwrap().next, None);
    assert_eq!(s.wake(11, v(0), WakeCause::Timer), Ok(WakeAction::None));
    assert_eq!(s.state(v(0)), Some(RunState::Offline));
}

#[test]
fn credit_burn_is_weight_proportional() {
    let mut s = sched(SchedConfig::default(), 1, &[(0, 256, None), (1, 512, None)]);
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(0)));
    s.schedule(1 * MS, 0).unwrap();
    // max weight 512: weight 256 burns 2 ns of credit per ns.
    assert_eq!(s.credit(v(0)), Some(CREDIT_INIT_NS - 2 * MS as i64));
    // Over time the weight-512 vCPU gets twice the CPU.
    let mut s = sched(SchedConfig::default(), 1, &[(0, 256, None), (1, 512, None)]);
    run_hogs(&mut s, 3000 * MS);
    let (a, b) = (run_ns(&s, 0) as f64, run_ns(&s, 1) as f64);
    assert!((b / a - 2.0).abs() < 0.1, "ratio {}", b / a);
}

#[test]
fn credit_reset_when_picked_credit_not_positive() {
    let mut s = sched(SchedConfig::default(), 1, &[(0, 256, None)]);
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(0)));
    // Alone: runs its 10 ms of credit (max slice), then is re-picked at 0 → reset.
    let d = s.schedule(10 * MS, 0).unwrap();
    assert_eq!(d.next, Some(v(0)));
    assert_eq!(s.credit(v(0)), Some(CREDIT_INIT_NS));
    // Overrun by 25 ms: credit stops at the floor (-10 ms), and the reset
    // adds CREDIT_INIT twice.
    s.schedule(35 * MS, 0).unwrap();
    assert_eq!(s.credit(v(0)), Some(CREDIT_INIT_NS));
}

#[test]
fn burn_stops_at_the_credit_floor() {
    let mut s = sched(SchedConfig::xen_compat(1000), 1, &[(0, 65535, None), (1, 1, None)]);
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(0)));
    s.block(0, 0).unwrap();
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(1)));
    // 1 µs at 65535:1 costs ~65 ms of credit: stops at -10 ms.
    s.set_vcpu_weight(1 * US, v(0), None).unwrap();
    assert_eq!(s.credit(v(1)), Some(credit::CREDIT_MIN_NS));
}

#[test]
fn reset_caps_carryover() {
    let mut s = sched(SchedConfig::xen_compat(0), 1, &[(0, 256, None), (1, 256, None)]);
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(0)));
    s.block(0, 0).unwrap(); // vcpu0 blocks with full credit
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(1)));
    s.schedule(10 * MS, 0).unwrap(); // vcpu1 at 0 credit, picked again → reset
    assert_eq!(s.credit(v(0)), Some(CREDIT_INIT_NS + CARRYOVER_MAX_NS));
    assert_eq!(s.credit(v(1)), Some(CREDIT_INIT_NS));
}

#[test]
fn min_and_max_slice() {
    // Alone: the whole credit, capped at max slice.
    let cfg = SchedConfig { max_slice_ns: 4 * MS, ..SchedConfig::default() };
    let mut s = sched(cfg, 1, &[(0, 256, None)]);
    assert_eq!(s.schedule(0, 0).unwrap().timer_at, Some(4 * MS));
    // Two equal hogs: credit difference 0 → min slice (ratelimit off).
    let mut s = sched(SchedConfig::xen_compat(0), 1, &[(0, 256, None), (1, 256, None)]);
    assert_eq!(s.schedule(0, 0).unwrap().timer_at, Some(500 * US));
    // With a ratelimit of 1 ms the ratelimit is the floor.
    let mut s = sched(SchedConfig::xen_compat(1000), 1, &[(0, 256, None), (1, 256, None)]);
    assert_eq!(s.schedule(0, 0).unwrap().timer_at, Some(1 * MS));
    // Run until credits are equal, but with the vCPU it replaces not yet
    // queued again (Credit2's delayed re-queue): vcpu1 runs its whole
    // credit, 10 ms, not the 3 ms by which it leads vcpu0.
    let mut s = sched(SchedConfig::xen_compat(0), 1, &[(0, 256, None), (1, 256, None)]);
    s.schedule(0, 0).unwrap();
    let d = s.schedule(3 * MS, 0).unwrap(); // vcpu0 burnt 3 ms, vcpu1 takes over
    assert_eq!(d.next, Some(v(1)));
    assert_eq!(d.preempted, Some(v(0)));
    assert_eq!(d.timer_at, Some(13 * MS));
    // Another waiter with credit does bound it: vcpu2 (10 ms) waits, so
    // vcpu1 runs until it falls to vcpu2's credit... which it already has.
    let mut s = sched(SchedConfig::xen_compat(0), 1, &[(0, 256, None), (1, 256, None), (2, 256, None)]);
    s.schedule(0, 0).unwrap();
    let d = s.schedule(3 * MS, 0).unwrap();
    assert_eq!(d.next, Some(v(1)));
    assert_eq!(d.timer_at, Some(3 * MS + 500 * US), "the minimum slice");
}

#[test]
fn ratelimit_keeps_runner() {
    let mut s = sched(SchedConfig::xen_compat(1000), 1, &[(0, 256, None), (1, 256, None)]);
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(0)));
    // vcpu1 has more credit, but vcpu0 ran only 300 µs.
    s.schedule(0, 0).unwrap();
    let d = s.schedule(300 * US, 0).unwrap();
    assert_eq!(d.next, Some(v(0)));
    assert_eq!(d.timer_at, Some(1 * MS), "timer = end of the ratelimit window");
    assert_eq!(s.schedule(1 * MS, 0).unwrap().next, Some(v(1)));
}

/// The hog (vcpu0) switched in at this time, with the I/O vCPU (vcpu1) blocked and richer.
const T0: u64 = 2_020 * US;

/// One pCPU, hog vcpu0 running since `T0`, I/O vcpu1 blocked with more credit.
fn hog_and_blocked_io(cfg: SchedConfig) -> Scheduler {
    let mut s = sched(cfg, 1, &[(0, 256, None), (1, 256, None)]);
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(0)));
    s.block(2 * MS, 0).unwrap();
    assert_eq!(s.schedule(2 * MS, 0).unwrap().next, Some(v(1)));
    s.block(T0, 0).unwrap();
    assert_eq!(s.schedule(T0, 0).unwrap().next, None);
    assert_eq!(s.wake(T0, v(0), WakeCause::Timer), Ok(WakeAction::Reschedule { pcpu: 0 }));
    assert_eq!(s.schedule(T0, 0).unwrap().next, Some(v(0)));
    s
}

#[test]
fn xen_compat_wake_in_window_does_nothing() {
    let mut s = hog_and_blocked_io(SchedConfig::xen_compat(1000));
    // Wake 200 µs into the hog's window: no preemption, no timer re-arm.
    assert_eq!(s.wake(T0 + 200 * US, v(1), WakeCause::Interrupt), Ok(WakeAction::None));
    assert_eq!(s.stats(v(1)).unwrap().counters.ratelimit_deferrals, 1);
    // Inside the 50 µs tolerance before the window end: tickled.
    let mut s = hog_and_blocked_io(SchedConfig::xen_compat(1000));
    assert_eq!(s.wake(T0 + 960 * US, v(1), WakeCause::Interrupt), Ok(WakeAction::Reschedule { pcpu: 0 }));
}

#[test]
fn preempt_on_wake_ignores_ratelimit() {
    let mut s = hog_and_blocked_io(SchedConfig::default());
    let t = T0 + 200 * US;
    assert_eq!(s.wake(t, v(1), WakeCause::Interrupt), Ok(WakeAction::Reschedule { pcpu: 0 }));
    let d = s.schedule(t + 3 * US, 0).unwrap();
    assert_eq!(d.next, Some(v(1)));
    assert_eq!(d.preempted, Some(v(0)));
    let st = s.stats(v(0)).unwrap();
    assert_eq!(st.counters.preempt_wake, 1);
    let io = s.stats(v(1)).unwrap();
    assert_eq!(io.counters.wakes_interrupt, 1);
    assert_eq!(io.kick_to_run_ns.count(), 1);
    assert_eq!(io.kick_to_run_ns.max(), Some(3 * US));
}

#[test]
fn non_preempting_wake_rearms_to_window_end() {
    let mut s = sched(SchedConfig::default(), 1, &[(0, 256, None), (1, 256, None)]);
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(0)));
    s.block(0, 0).unwrap();
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(1)));
    // vcpu1 burns 6 ms then blocks: it has less credit than vcpu0 now.
    s.block(6 * MS, 0).unwrap();
    assert_eq!(s.schedule(6 * MS, 0).unwrap().next, None);
    assert_eq!(s.wake(6 * MS, v(0), WakeCause::Timer), Ok(WakeAction::Reschedule { pcpu: 0 }));
    let d = s.schedule(6 * MS, 0).unwrap();
    assert_eq!(d.next, Some(v(0)));
    assert_eq!(d.timer_at, Some(16 * MS), "alone: runs its credit, 10 ms");
    // vcpu1 wakes with less credit: no preemption, timer pulled to window end.
    assert_eq!(s.wake(6 * MS + 200 * US, v(1), WakeCause::Sgi), Ok(WakeAction::RearmTimer { pcpu: 0, at: 7 * MS }));
    assert_eq!(s.stats(v(1)).unwrap().counters.ratelimit_deferrals, 1);
    // At that timer vcpu0 keeps running, but only until the credits cross.
    let d = s.schedule(7 * MS, 0).unwrap();
    assert_eq!(d.next, Some(v(0)));
    assert!(d.timer_at.unwrap() <= 7 * MS + 5 * MS);
}

#[test]
fn wake_granularity_prevents_ping_pong() {
    let cfg = SchedConfig { wake_granularity_ns: 1 * MS, ..SchedConfig::default() };
    let mut s = sched(cfg, 1, &[(0, 256, None), (1, 256, None)]);
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(0)));
    s.block(0, 0).unwrap();
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(1)));
    s.block(0, 0).unwrap();
    s.schedule(0, 0).unwrap();
    // vcpu0 wakes; nobody runs → runs it.
    s.wake(0, v(0), WakeCause::Sgi).unwrap();
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(0)));
    // vcpu1's lead is 500 µs < 1 ms granularity: no preemption.
    let a = s.wake(500 * US, v(1), WakeCause::Sgi).unwrap();
    assert!(!matches!(a, WakeAction::Reschedule { .. }), "{a:?}");
}

#[test]
fn lhp_grace_defers_wake_preemption() {
    let mut s = hog_and_blocked_io(SchedConfig { lhp_grace_ns: 50 * US, ..SchedConfig::default() });
    // The hog traps on an SGI send at 300 µs and wakes vcpu1.
    s.note_critical_exit(T0 + 300 * US, 0, CritEvidence::IrqsMasked).unwrap();
    assert_eq!(s.wake(T0 + 300 * US, v(1), WakeCause::Sgi), Ok(WakeAction::RearmTimer { pcpu: 0, at: T0 + 350 * US }));
    assert_eq!(s.stats(v(1)).unwrap().counters.lhp_deferrals, 1);
    // An early schedule() keeps the holder for the rest of the grace.
    let d = s.schedule(T0 + 310 * US, 0).unwrap();
    assert_eq!((d.next, d.timer_at), (Some(v(0)), Some(T0 + 350 * US)));
    // At the end of the grace the wake-preemption happens, ratelimit or not.
    let d = s.schedule(T0 + 350 * US, 0).unwrap();
    assert_eq!(d.next, Some(v(1)));
    assert_eq!(s.stats(v(0)).unwrap().counters.preempt_wake, 1);
    // Xen-compat has no grace (faithful control group).
    let mut s = hog_and_blocked_io(SchedConfig::xen_compat(0));
    s.note_critical_exit(T0 + 300 * US, 0, CritEvidence::IrqsMasked).unwrap();
    assert_eq!(s.wake(T0 + 300 * US, v(1), WakeCause::Sgi), Ok(WakeAction::Reschedule { pcpu: 0 }));
}

#[test]
fn crit_evidence_from_spsr() {
    use CritEvidence::{IrqsMasked, None as No};
    assert_eq!(CritEvidence::from_spsr(0x3c5), IrqsMasked, "EL1h, DAIF masked");
    assert_eq!(CritEvidence::from_spsr(0x084), IrqsMasked, "EL1t, I");
    assert_eq!(CritEvidence::from_spsr(0x345), No, "EL1h, I clear (D, A, F set)");
    assert_eq!(CritEvidence::from_spsr(0x005), No, "EL1h, all unmasked");
    assert_eq!(CritEvidence::from_spsr(0x080), No, "EL0t with I set");
    assert_eq!(CritEvidence::from_spsr(0x089), No, "EL2h is not a guest EL1");
    assert_eq!(CritEvidence::from_spsr(0x093), No, "AArch32 SVC");
    assert_eq!(CritEvidence::from_spsr(0xffff_ffff_0000_0385), IrqsMasked, "upper bits ignored");
}

#[test]
fn lhp_grace_needs_evidence() {
    // An SGI trap from a vCPU with IRQs enabled opens no grace.
    let mut s = hog_and_blocked_io(SchedConfig::default());
    let t = T0 + 300 * US;
    assert_eq!(s.note_critical_exit(t, 0, CritEvidence::None), Ok(WakeAction::None));
    assert_eq!(s.wake(t, v(1), WakeCause::Sgi), Ok(WakeAction::Reschedule { pcpu: 0 }));
    assert_eq!(s.schedule(t, 0).unwrap().next, Some(v(1)));
    assert_eq!(s.stats(v(1)).unwrap().counters.lhp_deferrals, 0);
}

#[test]
fn lhp_grace_ends_at_an_exit_without_evidence() {
    let mut s = hog_and_blocked_io(SchedConfig::default());
    let t = T0 + 300 * US;
    s.note_critical_exit(t, 0, CritEvidence::IrqsMasked).unwrap();
    assert_eq!(s.wake(t, v(1), WakeCause::Sgi), Ok(WakeAction::RearmTimer { pcpu: 0, at: t + 40 * US }));
    // An exit still inside the critical section changes nothing...
    assert_eq!(s.note_critical_exit(t + 5 * US, 0, CritEvidence::IrqsMasked), Ok(WakeAction::None));
    // ...the first one outside it ends the deferral there and then.
    assert_eq!(s.note_critical_exit(t + 10 * US, 0, CritEvidence::None), Ok(WakeAction::Reschedule { pcpu: 0 }));
    let d = s.schedule(t + 10 * US, 0).unwrap();
    assert_eq!(d.next, Some(v(1)));
    assert_eq!(s.stats(v(1)).unwrap().kick_to_run_ns.max(), Some(10 * US));
    // With nothing pending, closing a grace asks for nothing.
    assert_eq!(s.note_critical_exit(t + 20 * US, 0, CritEvidence::None), Ok(WakeAction::None));
}

#[test]
fn a_grace_opened_in_an_interrupt_handler_ends_at_its_priority_drop() {
    // Linux's priority 0xa0 with 5 priority bits: group 20; a nested
    // higher-priority handler (group 4) is running when the SGI is sent.
    let (outer, inner) = (1u128 << 20, 1u128 << 4);
    let g = GraceWatch::open(outer | inner);
    assert!(g.in_handler());
    // Still masked, the sending handler still active: the grace goes on.
    assert!(!g.ends(CritEvidence::IrqsMasked, outer | inner));
    // The sending (inner) handler dropped its priority: its locks are gone,
    // though IRQs stay masked while the outer one runs.
    assert!(g.ends(CritEvidence::IrqsMasked, outer));
    assert!(g.ends(CritEvidence::IrqsMasked, 0));
    // Unmasked ends it anyway.
    assert!(g.ends(CritEvidence::None, outer | inner));
    // Outside a handler (a spin_lock_irqsave section) only unmasking ends it.
    let g = GraceWatch::open(0);
    assert!(!g.in_handler());
    assert!(!g.ends(CritEvidence::IrqsMasked, 0));
    assert!(!g.ends(CritEvidence::IrqsMasked, outer));
    assert!(g.ends(CritEvidence::None, 0));
}

#[test]
fn lhp_grace_is_capped_per_pending_preemption() {
    let mut s = hog_and_blocked_io(SchedConfig::default());
    let t = T0 + 300 * US;
    s.note_critical_exit(t, 0, CritEvidence::IrqsMasked).unwrap();
    assert_eq!(s.wake(t, v(1), WakeCause::Sgi), Ok(WakeAction::RearmTimer { pcpu: 0, at: t + 40 * US }));
    // More critical exits do not push the preemption past wake + grace.
    for k in 1..4 {
        s.note_critical_exit(t + k * 10 * US, 0, CritEvidence::IrqsMasked).unwrap();
        let d = s.schedule(t + k * 10 * US, 0).unwrap();
        assert_eq!((d.next, d.timer_at), (Some(v(0)), Some(t + 40 * US)), "exit {k}");
    }
    assert_eq!(s.schedule(t + 40 * US, 0).unwrap().next, Some(v(1)));
    // A grace opened long before the wake only defers it for what is left of it.
    let mut s = hog_and_blocked_io(SchedConfig::default());
    s.note_critical_exit(t, 0, CritEvidence::IrqsMasked).unwrap();
    assert_eq!(s.wake(t + 30 * US, v(1), WakeCause::Sgi), Ok(WakeAction::RearmTimer { pcpu: 0, at: t + 40 * US }));
}

/// vcpu0 wake-preempted by vcpu1 at `T0 + 200 µs`; vcpu1 runs 10 µs and
/// blocks, so vcpu0 is switched back in at the returned time.
fn hog_back_after_wake_preemption(cfg: SchedConfig) -> (Scheduler, u64) {
    let mut s = hog_and_blocked_io(cfg);
    let t = T0 + 200 * US;
    assert_eq!(s.wake(t, v(1), WakeCause::Interrupt), Ok(WakeAction::Reschedule { pcpu: 0 }));
    assert_eq!(s.schedule(t, 0).unwrap().next, Some(v(1)));
    s.block(t + 10 * US, 0).unwrap();
    assert_eq!(s.schedule(t + 10 * US, 0).unwrap().next, Some(v(0)));
    assert_eq!(s.stats(v(0)).unwrap().counters.preempt_wake, 1);
    (s, t + 10 * US)
}

#[test]
fn wake_preempted_vcpu_gets_a_protected_run() {
    let (mut s, back) = hog_back_after_wake_preemption(SchedConfig::default());
    // vcpu1 wakes 20 µs later: deferred to the end of vcpu0's 100 µs.
    assert_eq!(
        s.wake(back + 20 * US, v(1), WakeCause::Interrupt),
        Ok(WakeAction::RearmTimer { pcpu: 0, at: back + 100 * US })
    );
    assert_eq!(s.stats(v(1)).unwrap().counters.min_run_deferrals, 1);
    let d = s.schedule(back + 50 * US, 0).unwrap();
    assert_eq!((d.next, d.timer_at), (Some(v(0)), Some(back + 100 * US)));
    let d = s.schedule(back + 100 * US, 0).unwrap();
    assert_eq!(d.next, Some(v(1)));
    assert_eq!(s.stats(v(0)).unwrap().counters.preempt_wake, 2);
    assert_eq!(s.stats(v(1)).unwrap().kick_to_run_ns.max(), Some(80 * US));
    // After its protected run a wake preempts it at once.
    let (mut s, back) = hog_back_after_wake_preemption(SchedConfig::default());
    assert_eq!(s.wake(back + 100 * US, v(1), WakeCause::Interrupt), Ok(WakeAction::Reschedule { pcpu: 0 }));
    // Off (0): no protection.
    let (mut s, back) = hog_back_after_wake_preemption(SchedConfig { wake_min_run_ns: 0, ..SchedConfig::default() });
    assert_eq!(s.wake(back + 20 * US, v(1), WakeCause::Interrupt), Ok(WakeAction::Reschedule { pcpu: 0 }));
}

#[test]
fn heavier_waker_cuts_the_protected_run_by_the_weight_ratio() {
    // vcpu1 with 4× vcpu0's weight: vcpu0's protected run is 100/4 = 25 µs.
    let (mut s, back) = hog_back_after_wake_preemption(SchedConfig::default());
    s.set_vcpu_weight(back, v(1), Some(1024)).unwrap();
    assert_eq!(s.vcpu_weight(v(1)), Some(1024));
    assert_eq!(
        s.wake(back + 10 * US, v(1), WakeCause::Interrupt),
        Ok(WakeAction::RearmTimer { pcpu: 0, at: back + 25 * US })
    );
    let d = s.schedule(back + 25 * US, 0).unwrap();
    assert_eq!(d.next, Some(v(1)));
    assert_eq!(s.stats(v(1)).unwrap().kick_to_run_ns.max(), Some(15 * US));
    // Past the shortened run: at once.
    let (mut s, back) = hog_back_after_wake_preemption(SchedConfig::default());
    s.set_vcpu_weight(back, v(1), Some(1024)).unwrap();
    assert_eq!(s.wake(back + 30 * US, v(1), WakeCause::Interrupt), Ok(WakeAction::Reschedule { pcpu: 0 }));
    // A lighter waker does not lengthen it; equal weights keep the full 100 µs.
    let (mut s, back) = hog_back_after_wake_preemption(SchedConfig::default());
    s.set_vcpu_weight(back, v(0), Some(1024)).unwrap();
    s.set_vcpu_weight(back, v(0), None).unwrap();
    assert_eq!(s.vcpu_weight(v(0)), Some(256));
    assert_eq!(
        s.wake(back + 30 * US, v(1), WakeCause::Interrupt),
        Ok(WakeAction::RearmTimer { pcpu: 0, at: back + 100 * US })
    );
}

/// Weighted wakers: a heavier waker a little behind the
/// runner in credit at its wake preempts once the runner's burn puts it
/// ahead by the granularity, not at the end of the 1 ms ratelimit window.
/// Equal weights keep the window (Credit2's behaviour).
#[test]
fn heavier_waker_catches_up_before_the_window_end() {
    let setup = |w1: u32| {
        let mut s = sched(SchedConfig::default(), 1, &[(0, 256, None), (1, w1, None)]);
        assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(0)));
        s.block(100 * US, 0).unwrap();
        assert_eq!(s.schedule(100 * US, 0).unwrap().next, Some(v(1)));
        s.block(2_100 * US, 0).unwrap();
        assert_eq!(s.schedule(2_100 * US, 0).unwrap().next, None);
        assert_eq!(s.wake(2_100 * US, v(0), WakeCause::Timer), Ok(WakeAction::Reschedule { pcpu: 0 }));
        assert_eq!(s.schedule(2_100 * US, 0).unwrap().next, Some(v(0)));
        s
    };
    let t = 2_100 * US;
    // Weight 1024 (max): vcpu0 burns 4 ns a ns. vcpu1 has 8.0 ms, vcpu0 9.2 ms
    // at the wake: it leads by the granularity 1.3 ms of credit = 325 µs later.
    let mut s = setup(1024);
    let at = t + 100 * US + 325 * US + 1;
    assert_eq!(s.wake(t + 100 * US, v(1), WakeCause::Timer), Ok(WakeAction::RearmTimer { pcpu: 0, at }));
    let d = s.schedule(at, 0).unwrap();
    assert_eq!((d.next, d.preempted), (Some(v(1)), Some(v(0))));
    assert_eq!(d.switch.out.map(|o| o.1), Some(SwitchReason::WakePreempt));
    // Equal weights: the runner keeps its window (1 ms from its switch-in).
    let mut s = setup(256);
    assert_eq!(s.wake(t + 100 * US, v(1), WakeCause::Timer), Ok(WakeAction::RearmTimer { pcpu: 0, at: t + 1 * MS }));
    assert_eq!(s.schedule(t + 500 * US, 0).unwrap().next, Some(v(0)));
}

#[test]
fn vcpu_weight_overrides_the_domain_weight() {
    // Two vCPUs of one domain; vcpu1 gets 512: it runs twice as much.
    let mut s = Scheduler::new(SchedConfig::default(), 1).unwrap();
    s.add_domain(0, DomainParams::default()).unwrap();
    for i in 0..2 {
        s.add_vcpu(v(i), 0, None).unwrap();
        s.power_on(0, v(i)).unwrap();
    }
    s.set_vcpu_weight(0, v(1), Some(512)).unwrap();
    run_hogs(&mut s, 3000 * MS);
    let ratio = run_ns(&s, 1) as f64 / run_ns(&s, 0) as f64;
    assert!((ratio - 2.0).abs() < 0.1, "ratio {ratio}");
    // A domain weight change leaves the override alone.
    s.set_domain_params(3000 * MS, 0, DomainParams { weight: 128, cap_percent: None }).unwrap();
    assert_eq!((s.vcpu_weight(v(0)), s.vcpu_weight(v(1))), (Some(128), Some(512)));
    // Bad input: typed errors, nothing changed.
    assert_eq!(s.set_vcpu_weight(0, v(1), Some(0)), Err(SchedError::BadWeight(0)));
    assert_eq!(s.set_vcpu_weight(0, v(1), Some(65536)), Err(SchedError::BadWeight(65536)));
    assert_eq!(s.set_vcpu_weight(0, v(9), Some(1)), Err(SchedError::UnknownVcpu(v(9))));
    assert_eq!(s.vcpu_weight(v(1)), Some(512));
}

#[test]
fn vcpu_weight_options() {
    let f = SchedConfig::parse_vcpu_weight;
    assert_eq!(f("1:1024"), Ok((v(1), 1024)));
    assert_eq!(f("0:128"), Ok((v(0), 128)));
    assert_eq!(f("1"), Err(SchedError::BadBootArg("sched_vcpu_weight")));
    assert_eq!(f("x:5"), Err(SchedError::BadBootArg("sched_vcpu_weight")));
    assert_eq!(f("1:"), Err(SchedError::BadBootArg("sched_vcpu_weight")));
    assert_eq!(f("1:0"), Err(SchedError::BadWeight(0)));
    assert_eq!(f("1:70000"), Err(SchedError::BadWeight(70000)));
}

#[test]
fn set_claims_only_the_schedulers_keys() {
    let mut c = SchedConfig::default();
    assert_eq!(c.set("sched_ratelimit_us", "0"), Ok(true));
    assert_eq!(c.ratelimit_ns, 0);
    assert_eq!(c.set("sched", "credit2"), Ok(true));
    assert_eq!(c.set("dom0_mem", "512M"), Ok(false));
    assert_eq!(c.set("sched_trace_threshold_us", "5"), Ok(false));
    assert_eq!(c.set("sched_wake_preempt", "maybe"), Err(SchedError::BadBootArg("sched_wake_preempt")));
}

#[test]
fn protected_run_and_grace_defer_to_the_later_end() {
    let (mut s, back) = hog_back_after_wake_preemption(SchedConfig::default());
    // Grace until back + 110 µs outlasts the protected run (back + 100 µs).
    s.note_critical_exit(back + 70 * US, 0, CritEvidence::IrqsMasked).unwrap();
    assert_eq!(
        s.wake(back + 70 * US, v(1), WakeCause::Sgi),
        Ok(WakeAction::RearmTimer { pcpu: 0, at: back + 110 * US })
    );
    assert_eq!(s.stats(v(1)).unwrap().counters.lhp_deferrals, 1);
    // The guest unmasks: the protected run still holds, the grace does not.
    assert_eq!(
        s.note_critical_exit(back + 80 * US, 0, CritEvidence::None),
        Ok(WakeAction::RearmTimer { pcpu: 0, at: back + 100 * US })
    );
    let d = s.schedule(back + 80 * US, 0).unwrap();
    assert_eq!((d.next, d.timer_at), (Some(v(0)), Some(back + 100 * US)));
    assert_eq!(s.schedule(back + 100 * US, 0).unwrap().next, Some(v(1)));

    // A critical section entered during the protected run: the grace runs
    // from the end of that run, so the runner is not preempted inside it.
    let (mut s, back) = hog_back_after_wake_preemption(SchedConfig::default());
    assert_eq!(
        s.wake(back + 20 * US, v(1), WakeCause::Interrupt),
        Ok(WakeAction::RearmTimer { pcpu: 0, at: back + 100 * US })
    );
    s.note_critical_exit(back + 95 * US, 0, CritEvidence::IrqsMasked).unwrap();
    let d = s.schedule(back + 100 * US, 0).unwrap();
    assert_eq!((d.next, d.timer_at), (Some(v(0)), Some(back + 135 * US)));
    // ...and never more than the grace past it, whatever follows.
    s.note_critical_exit(back + 130 * US, 0, CritEvidence::IrqsMasked).unwrap();
    let d = s.schedule(back + 135 * US, 0).unwrap();
    assert_eq!((d.next, d.timer_at), (Some(v(0)), Some(back + 140 * US)));
    assert_eq!(s.schedule(back + 140 * US, 0).unwrap().next, Some(v(1)));
    assert_eq!(s.stats(v(1)).unwrap().kick_to_run_ns.max(), Some(120 * US));
}

/// `pcpus` pCPUs, a runqueue each, and `vcpus` offline vCPUs of domain 1
/// (homes spread over the pCPUs in turn).
fn per_cpu_runqueues(pcpus: usize, vcpus: u32) -> Scheduler {
    let cfg = SchedConfig { runqueue: RunqueueLayout::PerCpu, ..SchedConfig::default() };
    let mut s = Scheduler::new(cfg, pcpus).unwrap();
    s.add_domain(1, DomainParams::default()).unwrap();
    for i in 0..vcpus {
        s.add_vcpu(v(i), 1, None).unwrap();
    }
    s
}

#[test]
fn a_balance_that_moves_a_queued_vcpu_kicks_the_pcpu_it_tickles() {
    let mut s = per_cpu_runqueues(2, 6);
    // Homes alternate: three hogs on pCPU0's runqueue, none on pCPU1's,
    // which is idle (WFI, no timer: only an IPI wakes it).
    for i in [0, 2, 4] {
        assert_eq!(s.runqueue_of_vcpu(v(i)), Some(0));
        s.power_on(0, v(i)).unwrap();
    }
    let d = s.schedule(0, 0).unwrap();
    let queued = [v(0), v(2), v(4)].into_iter().find(|&x| Some(x) != d.next).unwrap();
    // What `balance_load` does to a queued vCPU of pCPU0's runqueue.
    let slot = s.slot(queued).unwrap();
    s.migrate(MS, slot, 1, 0);
    assert_eq!(s.runqueue_of_vcpu(queued), Some(1));
    // The schedule() that balanced owes pCPU1 its IPI.
    assert!(s.owes_balance_kicks());
    assert_eq!(s.take_balance_kicks().collect::<Vec<_>>(), [1]);
    assert!(!s.owes_balance_kicks());
    // Woken, pCPU1 runs the hog that moved.
    assert_eq!(s.schedule(2 * MS, 1).unwrap().next, Some(queued));
}

#[test]
fn every_runqueue_has_room_for_every_vcpu_once_they_are_added() {
    let s = per_cpu_runqueues(4, 10);
    // Queueing or moving a vCPU then never grows a vector at run time.
    for (i, rq) in s.rqs.iter().enumerate() {
        assert!(rq.queue.capacity() >= 10 && rq.members.capacity() >= 10, "rq{i}");
    }
    assert!(s.domains[0].parked.capacity() >= 10);
}

#[test]
fn a_directed_yield_to_a_vcpu_no_longer_preempted_is_undirected() {
    // The runtime picks the target from a lock-free hint, which may be stale.
    let mut s = sched(SchedConfig::default(), 1, &[(0, 256, None), (1, 256, None), (2, 256, None)]);
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(0)));
    let d = s.schedule(2 * MS, 0).unwrap();
    assert_eq!(d.preempted, Some(v(0)));
    let runner = d.next.unwrap();
    // The other waiter never ran: runnable but not preempted.
    let other = [v(1), v(2)].into_iter().find(|&x| x != runner).unwrap();
    assert!(!s.is_preempted(other));
    s.yield_to(2 * MS + 10 * US, 0, Some(other)).unwrap();
    let d = s.schedule(2 * MS + 10 * US, 0).unwrap();
    // Undirected: the richest waiter (the never-run one), no grace-long loan.
    assert_eq!(d.next, Some(other));
    assert_ne!(d.timer_at, Some(2 * MS + 10 * US + SchedConfig::default().lhp_grace_ns));
}

#[test]
fn directed_yield_runs_the_target() {
    let mut s = sched(
        SchedConfig { lhp_grace_ns: 50 * US, ..SchedConfig::default() },
        1,
        &[(0, 256, None), (1, 256, None), (2, 256, None)],
    );
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(0)));
    // vcpu0 is preempted at the end of its slice by the richest waiter.
    let d = s.schedule(2 * MS, 0).unwrap();
    assert_eq!(d.preempted, Some(v(0)));
    let runner = d.next.unwrap();
    assert!(s.is_preempted(v(0)));
    // The runner spins on WFE and yields to vcpu0 (lowest credit, still picked).
    s.yield_to(2 * MS + 10 * US, 0, Some(v(0))).unwrap();
    let d = s.schedule(2 * MS + 10 * US, 0).unwrap();
    assert_eq!(d.next, Some(v(0)));
    assert_eq!(d.timer_at, Some(2 * MS + 60 * US), "a grace-long loan");
    assert!(!s.is_preempted(v(0)));
    assert_eq!(s.stats(runner).unwrap().counters.yields, 1);
    // After the loan the richer vCPUs get the pCPU back despite the ratelimit.
    let d = s.schedule(2 * MS + 60 * US, 0).unwrap();
    assert_ne!(d.next, Some(v(0)));
}

#[test]
fn undirected_yield_gives_way() {
    let mut s = sched(SchedConfig::default(), 1, &[(0, 256, None), (1, 256, None)]);
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(0)));
    s.yield_to(10 * US, 0, None).unwrap();
    assert_eq!(s.schedule(10 * US, 0).unwrap().next, Some(v(1)));
    // Alone, a yielder keeps running.
    let mut s = sched(SchedConfig::default(), 1, &[(0, 256, None)]);
    s.schedule(0, 0).unwrap();
    s.yield_to(10 * US, 0, None).unwrap();
    assert_eq!(s.schedule(10 * US, 0).unwrap().next, Some(v(0)));
}

#[test]
fn affinity_is_respected() {
    let mut s = sched(SchedConfig::default(), 2, &[(0, 256, Some(1)), (1, 256, Some(1)), (2, 256, Some(1))]);
    run_hogs(&mut s, 200 * MS);
    for id in 0..3 {
        let r = run_ns(&s, id);
        assert!(r > 50 * MS, "vcpu{id} ran {r}");
        assert_eq!(s.stats(v(id)).unwrap().counters.migrations, 0);
    }
    // pCPU 0 never ran anything.
    assert_eq!(s.current(0), None);
    assert_eq!(s.schedule(300 * MS, 0).unwrap().next, None);
    let total: u64 = (0..3).map(|id| run_ns(&s, id)).sum();
    assert!(total <= 200 * MS + 1, "only one pCPU's worth: {total}");
}

#[test]
fn load_balancing_across_two_pcpus() {
    // Four unpinned hogs, all made runnable while pCPU 1 is busy elsewhere.
    let mut s = sched(SchedConfig::default(), 2, &[(0, 256, None), (1, 256, None), (2, 256, None), (3, 256, None)]);
    run_hogs(&mut s, 2000 * MS);
    for id in 0..4 {
        let r = run_ns(&s, id) as f64 / (2000 * MS) as f64;
        assert!((r - 0.5).abs() < 0.05, "vcpu{id} got {r}");
    }
    // Three hogs on two pCPUs: balancing keeps both busy and shares fairly.
    let mut s = sched(SchedConfig::default(), 2, &[(0, 256, None), (1, 256, None), (2, 256, None)]);
    run_hogs(&mut s, 3000 * MS);
    let total: u64 = (0..3).map(|id| run_ns(&s, id)).sum();
    assert!(total >= 2 * 3000 * MS - 10 * MS, "both pCPUs busy: {total}");
    for id in 0..3 {
        let r = run_ns(&s, id) as f64 / (3000 * MS) as f64;
        assert!(r > 0.5, "vcpu{id} got {r}");
    }
    assert!((0..3).any(|id| s.stats(v(id)).unwrap().counters.migrations > 0));
}

#[test]
fn wake_places_on_idle_pcpu() {
    let mut s = sched(SchedConfig::default(), 2, &[(0, 256, None), (1, 256, None)]);
    // Both start; each pCPU runs one.
    let d0 = s.schedule(0, 0).unwrap();
    let d1 = s.schedule(0, 1).unwrap();
    assert!(d0.next.is_some() && d1.next.is_some() && d0.next != d1.next);
    let on1 = d1.next.unwrap();
    s.block(100 * US, 1).unwrap();
    s.schedule(100 * US, 1).unwrap();
    // It wakes: pCPU 1 is idle, so it goes there.
    assert_eq!(s.wake(200 * US, on1, WakeCause::Doorbell), Ok(WakeAction::Reschedule { pcpu: 1 }));
    assert_eq!(s.schedule(200 * US, 1).unwrap().next, Some(on1));
}

#[test]
fn two_hogs_split_evenly() {
    for cfg in [SchedConfig::default(), SchedConfig::xen_compat(1000), SchedConfig::xen_compat(0)] {
        let mut s = sched(cfg, 1, &[(0, 256, None), (1, 256, None)]);
        run_hogs(&mut s, 1000 * MS);
        let a = run_ns(&s, 0) as f64 / (1000 * MS) as f64;
        assert!((a - 0.5).abs() < 0.02, "{cfg:?}: {a}");
    }
}

/// A vCPU that runs `burst` then blocks and is re-woken `gap` later (a guest
/// flooding itself with SGIs), against a hog, on one pCPU. Returns the hog's share.
fn flooder_vs_hog(cfg: SchedConfig, burst: u64, gap: u64, until: u64) -> f64 {
    let mut s = sched(cfg, 1, &[(0, 256, None), (1, 256, None)]);
    let mut timer = Some(0u64);
    let mut resched = None;
    let mut wake_at: Option<u64> = None;
    let mut flood_left = burst;
    let mut flood_from = 0u64;
    let mut running = None;
    loop {
        let flood_end = (running == Some(v(1))).then(|| flood_from + flood_left);
        let t = [timer, resched, wake_at, flood_end].into_iter().flatten().min().unwrap();
        if t > until {
            break;
        }
        if Some(t) == flood_end {
            s.block(t, 0).unwrap();
            running = None;
            flood_left = burst;
            wake_at = Some(t + gap);
            resched = Some(t);
        } else if Some(t) == wake_at {
            wake_at = None;
            match s.wake(t, v(1), WakeCause::Sgi).unwrap() {
                WakeAction::Reschedule { .. } => resched = Some(t),
                WakeAction::RearmTimer { at, .. } => timer = Some(at),
                WakeAction::None => {}
            }
        } else {
            if running == Some(v(1)) {
                flood_left -= t - flood_from;
            }
            let d = s.schedule(t, 0).unwrap();
            resched = None;
            timer = d.timer_at;
            running = d.next;
            flood_from = t;
        }
    }
    s.schedule(until, 0).unwrap();
    run_ns(&s, 0) as f64 / until as f64
}

#[test]
fn wake_flooder_cannot_starve_a_hog() {
    for cfg in [
        SchedConfig::default(),
        SchedConfig { wake_granularity_ns: 0, ..SchedConfig::default() },
        SchedConfig::xen_compat(0),
    ] {
        for (burst, gap) in [(50 * US, 1 * US), (5 * US, 1 * US), (900 * US, 2 * US)] {
            let hog = flooder_vs_hog(cfg, burst, gap, 2000 * MS);
            assert!(hog > 0.45, "{cfg:?} burst {burst} gap {gap}: hog share {hog}");
        }
    }
}

#[test]
fn hog_cannot_starve_a_light_vcpu() {
    // Light vCPU (100 µs every ~1 ms): preempt-on-wake gives it all it asks for.
    let hog = flooder_vs_hog(SchedConfig::default(), 100 * US, 900 * US, 2000 * MS);
    assert!(hog < 0.92 && hog > 0.85, "hog share {hog}");
    // Xen-compat defers its wakes to the hog's slice end (the collapse), yet it still runs.
    let hog = flooder_vs_hog(SchedConfig::xen_compat(1000), 100 * US, 900 * US, 2000 * MS);
    assert!(hog < 0.995, "hog share {hog}");
}

// ----- simulator targets -----

fn sim_case(cfg: SchedConfig, topo: Topology) -> sim::SimResult {
    let mut p = SimParams::wakeup(cfg, topo);
    p.duration_ns = 10_000 * MS;
    sim::run(&p).unwrap()
}

#[test]
fn sim_wake_preempt_meets_targets() {
    let base = sim_case(SchedConfig::default(), Topology::TwoP2V);
    let r = sim_case(SchedConfig::default(), Topology::OneP2V);
    assert!(r.iops() >= 0.9 * base.iops(), "iops {} vs baseline {}", r.iops(), base.iops());
    assert!(r.wake_to_run(99, 100) <= 100 * US, "p99 {}", r.wake_to_run(99, 100));
    assert!(r.wake_to_run(999, 1000) <= 100 * US);
    // The hog gets the rest of the CPU.
    assert!(r.hog_run_ns as f64 > 0.8 * r.duration_ns as f64);
}

#[test]
fn sim_xen_compat_reproduces_collapse() {
    let base = sim_case(SchedConfig::xen_compat(1000), Topology::TwoP2V);
    let r = sim_case(SchedConfig::xen_compat(1000), Topology::OneP2V);
    assert!(r.wake_to_run(99, 100) >= 5 * MS, "p99 {}", r.wake_to_run(99, 100));
    assert!(r.iops() < 0.1 * base.iops(), "iops {} vs {}", r.iops(), base.iops());
}

#[test]
fn sim_lock_holder_slat_stays_bounded() {
    let lhp = |cfg, wfe| {
        let mut p = SimParams::wakeup(cfg, Topology::OneP2V);
        p.duration_ns = 2000 * MS;
        p.scenario = Scenario::LockHolder { pre_sgi_ns: 5 * US, post_sgi_ns: 5 * US, wfe };
        sim::run(&p).unwrap()
    };
    // The problem, as on Xen with ratelimit 0: the spinner waits out slices.
    let bad = lhp(SchedConfig::xen_compat(0), None);
    assert!(bad.slat(99, 100) >= 1 * MS, "slat {}", bad.slat(99, 100));
    // Preempt-on-wake with the grace: submission stays at its CPU cost.
    for wfe in [None, Some(2 * US)] {
        let good = lhp(SchedConfig::default(), wfe);
        assert!(good.slat(99, 100) <= 50 * US, "slat {}", good.slat(99, 100));
        assert!(good.wake_to_run(99, 100) <= 100 * US);
        assert!(good.iops() > 3.0 * bad.iops());
    }
}

/// An SGI flood: vCPU A (the hog) writes the SGI register every 30 µs
/// with IRQs masked, the worst case for the grace; vCPU B wakes every 1 ms
/// and runs 50 µs. Without the per-wake cap every write would push the
/// grace 40 µs on, and B would never run again after its first block.
#[test]
fn sim_sgi_flood_cannot_starve_a_woken_vcpu() {
    for evidence in [CritEvidence::IrqsMasked, CritEvidence::None] {
        let cfg = SchedConfig::default();
        let mut p = SimParams::wakeup(cfg, Topology::OneP2V);
        p.duration_ns = 1000 * MS;
        p.submit_ns = 50 * US;
        p.scenario = Scenario::SgiFlood { sgi_every_ns: 30 * US, evidence, wake_every_ns: 1 * MS };
        let r = sim::run(&p).unwrap();
        // wake→run includes the 5 µs context switch.
        let max = r.wake_to_run(1, 1);
        assert!(max <= cfg.lhp_grace_ns + 10 * US, "{evidence:?}: max wake->run {max}");
        assert!(r.io_guest_ns >= 49 * MS, "{evidence:?}: B ran {}", r.io_guest_ns);
        // Every grid tick but the first (B is still runnable from power-on then) is a wake.
        assert!(r.wake_to_run_ns.len() >= 998, "{evidence:?}: {} wakes", r.wake_to_run_ns.len());
        if evidence == CritEvidence::None {
            assert!(max <= p.switch_ns, "no evidence, no grace: {max}");
        }
    }
}

/// A fast waker: one that wakes 50 µs after it blocks and runs 5 µs,
/// against a hog, with a 5 µs context switch charged to the incoming vCPU.
#[test]
fn sim_fast_waker_cannot_chop_a_hog() {
    let fast_waker = |cfg: SchedConfig| {
        let mut p = SimParams::wakeup(cfg, Topology::OneP2V);
        p.duration_ns = 1000 * MS;
        p.service_ns = 50 * US;
        p.submit_ns = 5 * US;
        p.switch_ns = 5 * US;
        sim::run(&p).unwrap()
    };
    let cfg = SchedConfig::default();
    let r = fast_waker(cfg);
    assert!(r.hog_preempts_per_s() <= 10_000.0, "hog preempted {}/s", r.hog_preempts_per_s());
    assert!(r.hog_share() >= 0.8, "hog share {}", r.hog_share());
    let p99 = r.wake_to_run(99, 100);
    assert!(p99 <= cfg.wake_min_run_ns + 10 * US, "waker p99 {p99}");
    // The switches are visible: the hog's guest time is below what it was charged.
    assert!(r.hog_guest_ns + r.hog_preempt_wake * 5 * US <= r.hog_run_ns);
    // Without the protected run (today's behaviour before it) both bounds break.
    let off = fast_waker(SchedConfig { wake_min_run_ns: 0, ..cfg });
    assert!(off.hog_preempts_per_s() > 15_000.0, "{}", off.hog_preempts_per_s());
    assert!(off.hog_share() < 0.8, "{}", off.hog_share());
}

/// The same fast waker (cyclictest `-i50`'s shape) with
/// four times the hog's weight (`sched_vcpu_weight=1:1024`) may cut the
/// hog's protected run to a quarter: its p99 wake→run drops to that plus
/// a switch, and it still gets no more than its weighted share.
#[test]
fn sim_heavier_fast_waker_gets_a_shorter_bound() {
    let mut p = SimParams::wakeup(SchedConfig::default(), Topology::OneP2V);
    p.duration_ns = 1000 * MS;
    p.service_ns = 50 * US;
    p.submit_ns = 5 * US;
    p.switch_ns = 5 * US;
    let eq = sim::run(&p).unwrap();
    let heavy = sim::run_with_io_weight(&p, 1024).unwrap();
    let (p99_eq, p99_heavy) = (eq.wake_to_run(99, 100), heavy.wake_to_run(99, 100));
    // Equal weights: the waker (back 50 µs after it blocks) waits the rest of 100 µs.
    assert!(p99_eq >= 50 * US, "equal weights keep the 100 µs bound: p99 {p99_eq}");
    assert!(p99_heavy <= 10 * US, "weight 4x (25 µs run, over before the next wake): p99 {p99_heavy}");
    // Still bounded: at most one preemption per 25 µs of the hog's run time.
    let bound = heavy.hog_run_ns as f64 / (25 * US) as f64 / (heavy.duration_ns as f64 / 1e9);
    assert!(heavy.hog_preempts_per_s() <= bound + 1.0, "{} > {bound}", heavy.hog_preempts_per_s());
    assert!(heavy.io_run_ns as f64 / heavy.duration_ns as f64 <= 0.8 + 0.01);
}

#[test]
fn sim_is_deterministic() {
    let a = sim_case(SchedConfig::default(), Topology::OneP2V);
    let b = sim_case(SchedConfig::default(), Topology::OneP2V);
    assert_eq!(a.wake_to_run_ns, b.wake_to_run_ns);
    assert_eq!(a.completions, b.completions);
}

// ----- domains: weights, caps, resets -----

fn fleet(
    cfg: SchedConfig,
    nr_pcpus: usize,
    doms: &[(DomainId, u32, Option<u32>)],
    duration: u64,
) -> conformance::MixParams {
    let domains = doms.iter().map(|&(d, weight, cap_percent)| (d, DomainParams { weight, cap_percent })).collect();
    conformance::MixParams::hog_per_domain(cfg, nr_pcpus, domains, duration, CAP_PERIOD_NS)
}

#[test]
fn fleet_weights_512_256_256_256_on_two_pcpus() {
    for cfg in [SchedConfig::default(), SchedConfig::xen_compat(1000)] {
        let p = fleet(cfg, 2, &[(1, 512, None), (2, 256, None), (3, 256, None), (4, 256, None)], 3000 * MS);
        let r = conformance::run_mix(&p).unwrap();
        for (i, want) in [0.80, 0.40, 0.40, 0.40].into_iter().enumerate() {
            assert!((r.share(i) - want).abs() <= 0.05, "{cfg:?}: d{} got {} of a pCPU", i + 1, r.share(i));
        }
    }
}

#[test]
fn fleet_three_equal_hogs_on_two_pcpus() {
    // Credit2 (the control mode) loses some fairness here: its 10 ms
    // slices end in a reset that clips the credit of whichever hog has just
    // started a slice on the other pCPU (0.71/0.64/0.65 in this run, as in
    // a model of Xen's algorithm); our mode keeps the interleaving fine.
    for (cfg, tol) in [(SchedConfig::default(), 0.03), (SchedConfig::xen_compat(1000), 0.06)] {
        let p = fleet(cfg, 2, &[(1, 256, None), (2, 256, None), (3, 256, None)], 3000 * MS);
        let r = conformance::run_mix(&p).unwrap();
        for i in 0..3 {
            assert!((r.share(i) - 2.0 / 3.0).abs() <= tol, "{cfg:?}: d{} got {}", i + 1, r.share(i));
        }
    }
}

#[test]
fn xen_conformance_cases_hold() {
    for c in super::conformance::checks().unwrap() {
        assert!(c.pass(), "{} ({}): {} = {} outside [{}, {}]", c.case, c.mode, c.what, c.value, c.lo, c.hi);
    }
}

#[test]
fn a_tickled_pcpu_is_reserved_and_skipped_by_later_wakes() {
    // Two idle pCPUs; two vCPUs that last ran on pCPU 0 wake at once: the
    // first reserves pCPU 0, the second goes to pCPU 1, and pCPU 1's pick
    // leaves the first alone while pCPU 0 has not yet scheduled.
    let mut s = Scheduler::new(SchedConfig::xen_compat(1000), 2).unwrap();
    s.add_domain(0, DomainParams::default()).unwrap();
    // A hog pinned to pCPU 1 keeps it busy while both run on pCPU 0.
    s.add_vcpu(v(9), 0, Some(1)).unwrap();
    s.power_on(0, v(9)).unwrap();
    s.schedule(0, 1).unwrap();
    for id in [1, 2] {
        s.add_vcpu(v(id), 0, None).unwrap();
        s.power_on(0, v(id)).unwrap();
        assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(id)));
        s.block(10, 0).unwrap();
        s.schedule(10, 0).unwrap();
    }
    s.block(10, 1).unwrap();
    s.schedule(10, 1).unwrap();
    assert_eq!((s.current(0), s.current(1)), (None, None));
    let a = s.wake(100, v(1), WakeCause::Interrupt).unwrap();
    let b = s.wake(100, v(2), WakeCause::Interrupt).unwrap();
    assert_eq!(a, WakeAction::Reschedule { pcpu: 0 }, "its last pCPU");
    assert_eq!(b, WakeAction::Reschedule { pcpu: 1 }, "the next idle one: pCPU 0 is tickled");
    let d = s.schedule(200, 1).unwrap();
    assert_eq!(d.next, Some(v(2)), "pCPU 1 leaves vcpu1 to pCPU 0, which it was tickled for");
    assert_eq!(s.schedule(200, 0).unwrap().next, Some(v(1)));
}

#[test]
fn fleet_cap_25_holds_in_every_period() {
    // 1 pCPU: the capped domain against a hog; 2 pCPUs: against two hogs.
    for (nr, doms) in
        [(1, &[(1, 256, Some(25)), (2, 256, None)][..]), (2, &[(1, 256, Some(25)), (2, 256, None), (3, 256, None)][..])]
    {
        for cfg in [SchedConfig::default(), SchedConfig::xen_compat(1000), SchedConfig::xen_compat(0)] {
            let r = conformance::run_mix(&fleet(cfg, nr, doms, 1000 * MS)).unwrap();
            // The first period is the start: with equal credits the hog's
            // first slice is its whole credit, which nothing ends early
            // (Credit2's caps bound a domain, they do not entitle it).
            for (k, &ns) in r.domain_periods[0].iter().enumerate().skip(1) {
                let share = ns as f64 / CAP_PERIOD_NS as f64;
                assert!((share - 0.25).abs() <= 0.01, "{nr}p {cfg:?}: period {k}: {share}");
            }
            // The hogs share the rest evenly. (With two pCPUs this needs the
            // reset to charge the other pCPU's runner first: charged late, its
            // credit was clipped every epoch and it got 0.76 to the other's 0.99.)
            let fair = (nr as f64 - 0.25) / (doms.len() - 1) as f64;
            for i in 1..doms.len() {
                assert!((r.share(i) - fair).abs() <= 0.03, "{nr}p {cfg:?}: hog d{} got {}", i + 1, r.share(i));
            }
        }
    }
}

#[test]
fn cap_parks_and_replenishes() {
    let mut s = Scheduler::new(SchedConfig::default(), 1).unwrap();
    s.add_domain(1, DomainParams { weight: 256, cap_percent: Some(25) }).unwrap();
    s.add_vcpu(v(1), 1, None).unwrap();
    s.power_on(0, v(1)).unwrap();
    let d = s.schedule(0, 0).unwrap();
    assert_eq!((d.next, d.timer_at), (Some(v(1)), Some(2500 * US)), "the slice ends with the budget");
    // Out of budget: parked, the idle pCPU's timer is the replenishment.
    let d = s.schedule(2500 * US, 0).unwrap();
    assert_eq!((d.next, d.timer_at), (None, Some(10 * MS)));
    assert!(s.is_parked(v(1)) && s.state(v(1)) == Some(RunState::Runnable));
    // A wake of a parked vCPU changes nothing.
    assert_eq!(s.wake(3 * MS, v(1), WakeCause::Interrupt), Ok(WakeAction::None));
    assert!(s.is_parked(v(1)));
    let d = s.schedule(10 * MS, 0).unwrap();
    assert_eq!((d.next, d.timer_at), (Some(v(1)), Some(12_500 * US)));
    let st = s.domain_stats(1).unwrap();
    assert_eq!((st.cap_parks, st.replenishments, st.run_ns), (1, 1, 2500 * US));
    // It blocks with budget left; the budget runs out nowhere, and a wake
    // after the domain's pool is empty parks it at once (no preemption).
    s.block(11 * MS, 0).unwrap();
    assert_eq!(s.schedule(11 * MS, 0).unwrap().next, None);
    assert_eq!(s.wake(11 * MS + 100 * US, v(1), WakeCause::Timer), Ok(WakeAction::Reschedule { pcpu: 0 }));
    let d = s.schedule(11 * MS + 100 * US, 0).unwrap();
    assert_eq!((d.next, d.timer_at), (Some(v(1)), Some(12_600 * US)), "what it gave back: 1.5 ms");
    s.block(12_600 * US, 0).unwrap();
    assert_eq!(s.schedule(12_600 * US, 0).unwrap().next, None);
    assert_eq!(s.wake(13 * MS, v(1), WakeCause::Timer), Ok(WakeAction::RearmTimer { pcpu: 0, at: 20 * MS }));
    assert!(s.is_parked(v(1)));
    assert_eq!(s.domain_stats(1).unwrap().cap_parks, 2);
    assert_eq!(s.schedule(20 * MS, 0).unwrap().next, Some(v(1)));
    // Uncapping unparks at once and lifts the bound.
    let d = s.schedule(22_500 * US, 0).unwrap();
    assert_eq!(d.next, None);
    s.set_domain_params(23 * MS, 1, DomainParams { weight: 256, cap_percent: None }).unwrap();
    assert!(!s.is_parked(v(1)));
    let d = s.schedule(23 * MS, 0).unwrap();
    assert_eq!(d.next, Some(v(1)));
    assert!(d.timer_at.unwrap() > 25 * MS);
}

#[test]
fn capped_domain_shares_its_budget_between_vcpus() {
    // 100 % cap, two vCPUs, two pCPUs, nothing else: one pCPU's worth in all.
    let mut s = Scheduler::new(SchedConfig::default(), 2).unwrap();
    s.add_domain(1, DomainParams { weight: 256, cap_percent: Some(100) }).unwrap();
    s.add_vcpu(v(1), 1, None).unwrap();
    s.add_vcpu(v(2), 1, None).unwrap();
    s.power_on(0, v(1)).unwrap();
    s.power_on(0, v(2)).unwrap();
    run_hogs(&mut s, 1000 * MS);
    let total = run_ns(&s, 1) + run_ns(&s, 2);
    assert!(total.abs_diff(1000 * MS) <= 10 * MS, "total {total}");
    assert!(run_ns(&s, 1).abs_diff(run_ns(&s, 2)) <= 50 * MS);
    assert_eq!(s.domain_stats(1).unwrap().run_ns, total);
}

#[test]
fn domain_run_ns_counts_the_running_vcpus_unburned_time() {
    let mut s = Scheduler::new(SchedConfig::default(), 1).unwrap();
    s.add_domain(1, DomainParams { weight: 256, cap_percent: None }).unwrap();
    s.add_vcpu(v(1), 1, None).unwrap();
    s.power_on(0, v(1)).unwrap();
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(1)));
    // Nothing burned yet: the charged run time lags, the read at 3 ms does not.
    assert_eq!(s.domain_stats(1).unwrap().run_ns, 0);
    assert_eq!(s.domain_run_ns(1, 3 * MS), Some(3 * MS));
    assert_eq!(s.domain_run_ns(9, 3 * MS), None);
    let _ = s.schedule(5 * MS, 0).unwrap();
    assert_eq!(s.domain_run_ns(1, 7 * MS), Some(7 * MS));
}

#[test]
fn weight_change_mid_run_takes_effect() {
    let mut p = fleet(SchedConfig::default(), 1, &[(1, 256, None), (2, 256, None)], 2000 * MS);
    p.changes.push((1000 * MS, 1, DomainParams { weight: 768, cap_percent: None }));
    p.period_ns = 1000 * MS;
    let r = conformance::run_mix(&p).unwrap();
    let (first, second) = (r.domain_periods[0][0] as f64 / 1e9, r.domain_periods[0][1] as f64 / 1e9);
    assert!((first - 0.5).abs() <= 0.02, "before: {first}");
    assert!((second - 0.75).abs() <= 0.03, "after: {second}");
}

#[test]
fn credit_reset_uses_the_best_candidate() {
    // Ratelimit keeps a runner at 0 credit while a richer vCPU waits: no reset.
    let mut s = sched(SchedConfig::xen_compat(0), 1, &[(0, 256, None), (1, 256, None)]);
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(0)));
    s.block(0, 0).unwrap();
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(1)));
    // vcpu1 runs its whole credit; vcpu0 (blocked) still has 10 ms.
    s.wake(5 * MS, v(0), WakeCause::Timer).unwrap();
    let d = s.schedule(10 * MS, 0).unwrap();
    assert_eq!(d.next, Some(v(0)), "the richer one runs");
    assert_eq!(s.runqueue_resets(0), Some(0), "best candidate (10 ms) is positive: no reset");
    // When the best candidate is at 0 too, the runqueue resets; the remainder carries.
    let d = s.schedule(20 * MS, 0).unwrap();
    assert!(d.next.is_some());
    assert_eq!(s.runqueue_resets(0), Some(1));
    assert_eq!(s.credit(v(0)), Some(CREDIT_INIT_NS));
    assert_eq!(s.credit(v(1)), Some(CREDIT_INIT_NS));
    assert_eq!(s.domain_stats(0).unwrap().credit_resets, 1);
}

#[test]
fn credit_resets_are_per_runqueue() {
    // credit2_runqueue=cpu: two pinned hogs on pCPU 0, one on pCPU 1 —
    // each runqueue resets on its own schedule, only its own vCPUs.
    let cfg = SchedConfig::from_bootargs("credit2_runqueue=cpu").unwrap();
    let mut s = sched(cfg, 2, &[(0, 256, Some(0)), (1, 256, Some(0)), (2, 256, Some(1))]);
    assert_eq!((s.nr_runqueues(), s.runqueue_of(1)), (2, Some(1)));
    run_hogs(&mut s, 200 * MS);
    let (r0, r1) = (s.runqueue_resets(0).unwrap(), s.runqueue_resets(1).unwrap());
    // pCPU 1's lone hog burns 10 ms per epoch; pCPU 0's two burn 20 ms.
    assert!((18..=21).contains(&r1), "rq1 resets {r1}");
    assert!((9..=11).contains(&r0), "rq0 resets {r0}");
    assert_eq!(s.domain_stats(2).unwrap().credit_resets, r1);
    assert_eq!(s.domain_stats(0).unwrap().credit_resets, r0);
    // The default: one runqueue for all pCPUs.
    let s = Scheduler::new(SchedConfig::default(), 4).unwrap();
    assert_eq!((s.nr_runqueues(), s.runqueue_of(3)), (1, Some(0)));
    assert_eq!(SchedConfig::from_bootargs("credit2_runqueue=rack"), Err(SchedError::BadBootArg("credit2_runqueue")));
}

#[test]
fn burn_carries_the_remainder() {
    // Weights 2 and 3 (max 3, the weight-3 vCPU offline): 1 ns at weight 2
    // costs 1.5 ns of credit; charged 1 ns at a time, the halves are kept.
    let mut s = Scheduler::new(SchedConfig::xen_compat(0), 1).unwrap();
    s.add_domain(0, DomainParams { weight: 2, cap_percent: None }).unwrap();
    s.add_domain(1, DomainParams { weight: 3, cap_percent: None }).unwrap();
    s.add_vcpu(v(0), 0, None).unwrap();
    s.add_vcpu(v(1), 1, None).unwrap();
    s.power_on(0, v(0)).unwrap();
    assert_eq!(s.schedule(0, 0).unwrap().next, Some(v(0)));
    for t in 1..=1000 {
        assert_eq!(s.schedule(t, 0).unwrap().next, Some(v(0)));
    }
    assert_eq!(s.credit(v(0)), Some(CREDIT_INIT_NS - 1500));
}

/// A capped domain's I/O vCPU (fio-like, ~9 % CPU) beside a hog in another
/// domain on one pCPU: with budget it still preempts at once; when the cap
/// is below its demand it gets its cap, and its wakes while out of budget
/// preempt nobody.
#[test]
fn sim_capped_io_vcpu_preempts_with_budget() {
    let doms = |cap| [(1, DomainParams::default()), (2, DomainParams { weight: 256, cap_percent: Some(cap) })];
    let mut p = SimParams::wakeup(SchedConfig::default(), Topology::OneP2V);
    p.duration_ns = 2000 * MS;
    let base = sim::run(&p).unwrap();
    let r = sim::run_in_domains(&p, &doms(50), [1, 2]).unwrap();
    assert!(r.iops() >= 0.95 * base.iops(), "iops {} vs {}", r.iops(), base.iops());
    assert!(r.wake_to_run(99, 100) <= 100 * US, "p99 {}", r.wake_to_run(99, 100));
    // Cap 4 %: 400 µs of run time per 10 ms period.
    let r = sim::run_in_domains(&p, &doms(4), [1, 2]).unwrap();
    let io_share = r.io_run_ns as f64 / p.duration_ns as f64;
    assert!((io_share - 0.04).abs() <= 0.005, "io share {io_share}");
    assert!(r.iops() < 0.5 * base.iops());
    assert!(r.hog_run_ns as f64 >= 0.95 * p.duration_ns as f64);
}

#[test]
fn heavy_and_light_hog_light_gets_the_floor_share() {
    // Weights 65535:1 on one pCPU: the light vCPU's debt stops at
    // CREDIT_MIN, so each reset brings it back into the black and it runs
    // about one slice per epoch (Credit2 gives it ~4.8 %), in both modes.
    for cfg in [SchedConfig::default(), SchedConfig::xen_compat(1000)] {
        let mut s = sched(cfg, 1, &[(0, 65535, None), (1, 1, None)]);
        run_hogs(&mut s, 10_000 * MS);
        let share = run_ns(&s, 1) as f64 / (10_000 * MS) as f64;
        assert!(share >= 0.04, "light share {share}");
    }
}

#[test]
fn runqueue_stats_name_each_runqueue() {
    let cfg = SchedConfig::from_bootargs("sched_credit2_max_cpus_runqueue=16").unwrap();
    let mut s = Scheduler::new(cfg, 48).unwrap();
    s.add_domain(0, DomainParams::default()).unwrap();
    for i in 0..48 {
        s.add_vcpu(v(i), 0, None).unwrap();
        s.power_on(0, v(i)).unwrap();
    }
    for p in 0..48 {
        s.schedule(0, p).unwrap();
    }
    let mut text = String::new();
    s.write_runqueue_stats(&mut text).unwrap();
    for (rq, pcpus) in [(0, "0-15"), (1, "16-31"), (2, "32-47")] {
        assert!(text.contains(&alloc::format!("sched.rq{rq}.pcpus={pcpus}\n")), "{text}");
        assert!(text.contains(&alloc::format!("sched.rq{rq}.schedules=16\n")), "{text}");
        // Every vCPU was woken onto an idle pCPU of its runqueue.
        assert!(text.contains(&alloc::format!("sched.rq{rq}.tickles=16\n")), "{text}");
    }
    assert!(!text.contains("sched.rq3."), "{text}");
}

#[test]
fn a_reset_balances_a_hog_onto_an_idle_runqueue() {
    // credit2_runqueue=cpu, 2 pCPUs: vcpu1 and vcpu3 start on pCPU 0's
    // runqueue, vcpu2 (pCPU 1's) never comes online. Credit2 balances after
    // a reset, by averaged load: one hog moves to the idle runqueue, and
    // from then each has a pCPU.
    for cfg in [SchedConfig::default(), SchedConfig::xen_compat(1000)] {
        let cfg = SchedConfig { runqueue: RunqueueLayout::PerCpu, ..cfg };
        let mut s = Scheduler::new(cfg, 2).unwrap();
        s.add_domain(0, DomainParams::default()).unwrap();
        for id in 1..=3 {
            s.add_vcpu(v(id), 0, None).unwrap();
        }
        s.power_on(0, v(1)).unwrap();
        s.power_on(0, v(3)).unwrap();
        run_hogs(&mut s, 3000 * MS);
        for id in [1, 3] {
            let share = run_ns(&s, id) as f64 / (3000 * MS) as f64;
            assert!(share > 0.8, "{cfg:?}: vcpu{id} got {share}");
        }
        // The hogs are on different runqueues now.
        assert_ne!(s.runqueue_of_vcpu(v(1)), s.runqueue_of_vcpu(v(3)));
    }
}

#[test]
fn caps_follow_credit2_in_the_control_mode() {
    // A 5 % cap: 500 µs of budget per 10 ms. Credit2 clamps the slice to
    // the budget and then to the minimum (the 1 ms ratelimit): the vCPU
    // overruns; with our extensions the slice ends with the budget.
    for (cfg, slice) in [(SchedConfig::xen_compat(1000), MS), (SchedConfig::default(), 500 * US)] {
        let mut s = Scheduler::new(cfg, 1).unwrap();
        s.add_domain(1, DomainParams { weight: 256, cap_percent: Some(5) }).unwrap();
        s.add_vcpu(v(1), 1, None).unwrap();
        s.power_on(0, v(1)).unwrap();
        let d = s.schedule(0, 0).unwrap();
        assert_eq!((d.next, d.timer_at), (Some(v(1)), Some(slice)), "{:?}", cfg.wake_mode);
    }
    // As Credit2: a cap is at most 100 % per vCPU of the domain, once it
    // has vCPUs; the replenishment period is an option.
    let cfg = SchedConfig::from_bootargs("credit2_cap_period_ms=20").unwrap();
    assert_eq!(cfg.cap_period_ns, 20 * MS);
    assert_eq!(SchedConfig::from_bootargs("credit2_cap_period_ms=0").unwrap().cap_period_ns, 10 * MS);
    assert!(SchedConfig::from_bootargs("credit2_cap_period_ms=x").is_err());
    let mut s = Scheduler::new(cfg, 4).unwrap();
    s.add_domain(1, DomainParams::default()).unwrap();
    s.add_vcpu(v(1), 1, None).unwrap();
    let capped = |c| DomainParams { weight: 256, cap_percent: Some(c) };
    assert_eq!(s.set_domain_params(0, 1, capped(150)), Err(SchedError::BadCap(150)));
    assert_eq!(s.set_domain_params(0, 1, capped(100)), Ok(()));
    // A 20 ms period: half of 20 ms of budget at 50 %.
    s.set_domain_params(0, 1, DomainParams::default()).unwrap();
    s.set_domain_params(0, 1, capped(50)).unwrap();
    s.power_on(0, v(1)).unwrap();
    let d = s.schedule(0, 0).unwrap();
    assert_eq!(d.timer_at, Some(10 * MS), "its budget, 10 ms of each 20 ms");
}

/// Runs hogs until vCPU `id` runs somewhere, then powers it off there.
fn power_off_vcpu(s: &mut Scheduler, id: u32, mut now: u64) -> u64 {
    loop {
        for p in 0..s.nr_pcpus() {
            s.schedule(now, p).unwrap();
            if s.current(p) == Some(v(id)) {
                s.power_off(now, p).unwrap();
                return now;
            }
        }
        now += MS;
    }
}

#[test]
fn a_removed_domain_leaves_the_others_as_they_were() {
    // Three hogs in their own domains on 2 pCPUs, and domain 9 whose two
    // vCPUs never came on.
    let mut s = sched(SchedConfig::default(), 2, &[(0, 256, None), (1, 256, None), (2, 256, None)]);
    s.reserve(16, 8).unwrap();
    s.add_domain(9, DomainParams::default()).unwrap();
    s.add_vcpu(v(10), 9, None).unwrap();
    s.add_vcpu(v(11), 9, None).unwrap();
    run_hogs(&mut s, 100 * MS);
    let caps = (s.vcpus.capacity(), s.domains.capacity(), s.index.dense.capacity());
    // Refused while a vCPU is on: nothing changes.
    let before: Vec<u64> = (0..3).map(|i| run_ns(&s, i)).collect();
    assert_eq!(s.remove_domain(1), Err(SchedError::DomainBusy(1)));
    assert_eq!((0..3).map(|i| run_ns(&s, i)).collect::<Vec<_>>(), before);
    assert_eq!(s.remove_domain(7), Err(SchedError::UnknownDomain(7)));
    s.remove_domain(9).unwrap();
    assert!(s.stats(v(10)).is_none() && s.stats(v(11)).is_none());
    // Domain 1 (in the middle of the slots) once its vCPU is off.
    let now = power_off_vcpu(&mut s, 1, 100 * MS);
    s.remove_domain(1).unwrap();
    assert!(s.stats(v(1)).is_none() && s.state(v(1)).is_none());
    assert!(s.state(v(2)).is_some());
    for id in [0, 2] {
        assert_eq!(s.stats(v(id)).unwrap().counters.run_ns, run_ns(&s, id), "{id} kept its record");
    }
    // Two hogs on two pCPUs: each gets one.
    let (a, b) = (run_ns(&s, 0), run_ns(&s, 2));
    run_hogs(&mut s, now + 200 * MS);
    let (da, db) = (run_ns(&s, 0) - a, run_ns(&s, 2) - b);
    assert!(da > 190 * MS && db > 190 * MS, "{da} {db}");
    // The same ids again, in a domain of the same number: fair among three.
    for _ in 0..20 {
        s.add_domain(1, DomainParams::default()).unwrap();
        s.add_vcpu(v(1), 1, None).unwrap();
        s.add_domain(9, DomainParams::default()).unwrap();
        s.add_vcpu(v(10), 9, None).unwrap();
        s.remove_domain(9).unwrap();
        s.power_on(now, v(1)).unwrap();
        let now = power_off_vcpu(&mut s, 1, now + MS);
        s.remove_domain(1).unwrap();
        assert_eq!((s.vcpus.capacity(), s.domains.capacity(), s.index.dense.capacity()), caps);
        run_hogs(&mut s, now + MS);
    }
    s.add_domain(1, DomainParams::default()).unwrap();
    s.add_vcpu(v(1), 1, None).unwrap();
    let t0 = now + 100 * MS;
    s.power_on(t0, v(1)).unwrap();
    let start: Vec<u64> = (0..3).map(|i| run_ns(&s, i)).collect();
    run_hogs(&mut s, t0 + 3000 * MS);
    let got: Vec<f64> = (0..3).map(|i| (run_ns(&s, i) - start[i as usize]) as f64 / (6000 * MS) as f64).collect();
    assert!(got.iter().all(|g| (g - 1.0 / 3.0).abs() < 0.03), "{got:?}");
}

/// What the scheduler says of `ids`: state, credit, run time, domain,
/// runqueue.
type Seen = (Option<RunState>, Option<i64>, u64, Option<DomainId>, Option<usize>);

fn seen(s: &Scheduler, ids: &[u32]) -> Vec<Seen> {
    ids.iter()
        .map(|&i| (s.state(v(i)), s.credit(v(i)), run_ns(s, i), s.domain_of(v(i)), s.runqueue_of_vcpu(v(i))))
        .collect()
}

/// Shares of a pCPU `ids` got from `start` (their run times then) over `ns`.
fn shares(s: &Scheduler, ids: &[u32], start: &[u64], ns: u64) -> Vec<f64> {
    ids.iter().zip(start).map(|(&i, &b)| (run_ns(s, i) - b) as f64 / ns as f64).collect()
}

#[test]
fn removing_an_interleaved_domain_keeps_the_others_fair_and_their_records() {
    // Two runqueues (a pCPU each); domain 2's vCPUs sit between the
    // others' in the slots. Weights 256 and 512: shares measured before
    // domain 2 ever runs, and again once it ran, moved about and left.
    let cfg = SchedConfig { runqueue: RunqueueLayout::PerCpu, ..SchedConfig::default() };
    let mut s = Scheduler::new(cfg, 2).unwrap();
    s.reserve(16, 4).unwrap();
    for (d, w) in [(1u16, 256u32), (2, 256), (3, 512)] {
        s.add_domain(d, DomainParams { weight: w, cap_percent: None }).unwrap();
    }
    for (id, d) in [(1, 1), (3, 2), (5, 3), (2, 1), (4, 2), (6, 3)] {
        s.add_vcpu(v(id), d, None).unwrap();
    }
    let others = [1, 2, 5, 6];
    for &i in &others {
        s.power_on(0, v(i)).unwrap();
    }
    run_hogs(&mut s, 500 * MS);
    let start: Vec<u64> = others.iter().map(|&i| run_ns(&s, i)).collect();
    run_hogs(&mut s, 2500 * MS);
    let before = shares(&s, &others, &start, 2000 * MS);
    // Domain 2 runs a while, then its vCPUs go off one by one.
    s.power_on(2500 * MS, v(3)).unwrap();
    s.power_on(2500 * MS, v(4)).unwrap();
    run_hogs(&mut s, 3000 * MS);
    assert!(run_ns(&s, 3) > 0 && run_ns(&s, 4) > 0);
    let mut now = power_off_vcpu(&mut s, 3, 3000 * MS);
    assert_eq!(s.remove_domain(2), Err(SchedError::DomainBusy(2)), "vcpu4 is on");
    now = power_off_vcpu(&mut s, 4, now);
    // Refused: nothing changed. Removed: the others' records are as they were.
    let kept = seen(&s, &others);
    assert_eq!(s.remove_domain(1), Err(SchedError::DomainBusy(1)));
    assert_eq!(s.remove_domain(8), Err(SchedError::UnknownDomain(8)));
    assert_eq!(seen(&s, &others), kept);
    s.remove_domain(2).unwrap();
    s.assert_slots_consistent();
    let fp = s.capacity_fingerprint();
    assert_eq!(seen(&s, &others), kept);
    assert_eq!((s.state(v(3)), s.state(v(4)), s.domain_of(v(3))), (None, None, None));
    assert_eq!(s.power_on(now, v(3)), Err(SchedError::UnknownVcpu(v(3))));
    assert!(s.domain_stats(2).is_none() && s.domain_stats(3).is_some());
    // The same fairness as before.
    run_hogs(&mut s, now + 500 * MS);
    let start: Vec<u64> = others.iter().map(|&i| run_ns(&s, i)).collect();
    run_hogs(&mut s, now + 2500 * MS);
    let after = shares(&s, &others, &start, 2000 * MS);
    for (a, b) in after.iter().zip(&before) {
        assert!((a - b).abs() < 0.03, "before {before:?} after {after:?}");
    }
    // The same ids again, twenty times: nothing grows.
    now += 2500 * MS;
    for _ in 0..20 {
        s.add_domain(2, DomainParams::default()).unwrap();
        s.add_vcpu(v(4), 2, None).unwrap();
        s.add_vcpu(v(3), 2, Some(1)).unwrap();
        assert_eq!(s.domain_of(v(3)), Some(2));
        s.power_on(now, v(3)).unwrap();
        now = power_off_vcpu(&mut s, 3, now + MS);
        s.remove_domain(2).unwrap();
        s.assert_slots_consistent();
        run_hogs(&mut s, now + 10 * MS);
        now += 10 * MS;
    }
    assert_eq!(s.capacity_fingerprint(), fp);
}

/// Adds domains 1 and 2 with vCPUs 0..16 between them (a capped one),
/// runs them a while, takes them off and removes both, `cycles` times.
fn add_run_remove(s: &mut Scheduler, cycles: u32, mut now: u64) {
    for _ in 0..cycles {
        s.add_domain(1, DomainParams::default()).unwrap();
        s.add_domain(2, DomainParams { weight: 512, cap_percent: Some(50) }).unwrap();
        for i in 0..16 {
            s.add_vcpu(v(i), 1 + (i % 2) as DomainId, None).unwrap();
        }
        for i in [0, 1, 6, 9] {
            s.power_on(now, v(i)).unwrap();
        }
        run_hogs(s, now + 60 * MS);
        now += 60 * MS;
        for i in [0, 1, 6, 9] {
            now = power_off_vcpu(s, i, now);
        }
        s.remove_domain(2).unwrap();
        s.remove_domain(1).unwrap();
        s.assert_slots_consistent();
        assert_eq!(s.vcpu_ids().count(), 0);
    }
}

#[test]
fn reserved_room_holds_every_later_add_and_remove() {
    // From the reservation on, no table of the scheduler grows or shrinks
    // however often domains come and go within it (without one, the
    // first cycle grows them: the check sees growth).
    let cfg = SchedConfig { runqueue: RunqueueLayout::PerCpu, ..SchedConfig::default() };
    let mut s = Scheduler::new(cfg, 2).unwrap();
    s.reserve(16, 2).unwrap();
    let fp = s.capacity_fingerprint();
    add_run_remove(&mut s, 20, 0);
    assert_eq!(s.capacity_fingerprint(), fp);
    let mut bare = Scheduler::new(cfg, 2).unwrap();
    let fp = bare.capacity_fingerprint();
    add_run_remove(&mut bare, 1, 0);
    assert_ne!(bare.capacity_fingerprint(), fp);
}

#[test]
fn weights_hold_across_per_pcpu_runqueues_in_our_mode() {
    // A runqueue per pCPU, hogs of a domain each, 10 s. Credit2 (the
    // control mode) keeps the pairing its unweighted count balance leaves;
    // our mode's weighted balance takes turns until shares follow weights.
    let per_cpu = |cfg| SchedConfig { runqueue: RunqueueLayout::PerCpu, ..cfg };
    // (pCPUs, weights, shares in our mode, shares in the control mode)
    type Case = (usize, &'static [u32], &'static [f64], &'static [f64]);
    let cases: [Case; 3] = [
        (2, &[512, 256, 256, 256], &[0.8, 0.4, 0.4, 0.4], &[0.667, 0.5, 0.333, 0.5]),
        (2, &[256, 256, 256], &[0.667, 0.667, 0.667], &[0.5, 0.9, 0.6]),
        // The 512 hog wants more than its pCPU: it gets the pCPU.
        (4, &[512, 256, 256, 256, 256, 256, 256], &[1.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5], &[]),
    ];
    for (nr, weights, ours, xen) in cases {
        let doms: Vec<_> = weights.iter().enumerate().map(|(i, &w)| (i as DomainId + 1, w, None)).collect();
        for (cfg, want, tol) in [(SchedConfig::default(), ours, 0.03), (SchedConfig::xen_compat(1000), xen, 0.01)] {
            let r = conformance::run_mix(&fleet(per_cpu(cfg), nr, &doms, 10_000 * MS)).unwrap();
            for (i, &w) in want.iter().enumerate() {
                let got = r.share(i);
                assert!(
                    (got - w).abs() <= tol,
                    "{nr}p {weights:?} {:?}: d{} got {got:.3}, want {w}",
                    cfg.wake_mode,
                    i + 1
                );
            }
        }
    }
}
