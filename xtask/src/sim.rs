//! `cargo xtask sim wakeup [--json FILE] [--seconds N] [--service-us N]
//! [--submit-us N] [--switch-cost-us N] [--granularity-us N] [--grace-us N]
//! [--min-run-us N]`
//!
//! Runs the scheduler simulator (`hypervisor::sched::sim`, which drives the
//! real scheduler) over the seed workload in every mode and topology, prints
//! a table, and optionally writes the JSON the benchmark harness reads:
//! `{"cases":[{"mode":..,"ratelimit_us":..,"topology":..,"iops":..,"p50_us":..,"p99_us":..,"p999_us":..}]}`
//! (latencies: I/O vCPU wake → running again). The hog's share (`hog%`)
//! counts its guest progress only: the context switches are charged to the
//! incoming vCPU and are nobody's progress. Further tables, printed only:
//! the lock-holder scenario (submission latency), a fast waker against the
//! hog (the preemption-rate bound, `--min-run-us`), and a hog that floods
//! the SGI register (the bounded lock-holder grace), and CPU hogs in
//! Credit2 domains on 2 pCPUs (weights, a 25 % cap: shares of a pCPU, and
//! the capped domain's least and most in any 10 ms period).
//! The options and their defaults are in [`xtask::cli::SimWakeupArgs`].

use anyhow::{anyhow, Context};
use hypervisor::sched::sim::{self, Scenario, SimParams, SimResult, Topology};
use hypervisor::sched::{conformance, CritEvidence, DomainParams, SchedConfig, CAP_PERIOD_NS};
use std::fmt::Write as _;
use xtask::cli::SimWakeupArgs as Opts;

struct Case {
    mode: &'static str,
    ratelimit_us: u64,
    topology: Topology,
    res: SimResult,
}

fn params(o: &Opts, cfg: SchedConfig, topology: Topology, scenario: Scenario) -> SimParams {
    SimParams {
        cfg,
        topology,
        scenario,
        duration_ns: o.seconds * 1_000_000_000,
        service_ns: o.service_us * 1000,
        submit_ns: o.submit_us * 1000,
        switch_ns: o.switch_cost_us * 1000,
    }
}

fn preempt_cfg(o: &Opts) -> SchedConfig {
    let mut c = SchedConfig::default();
    if let Some(g) = o.granularity_us {
        c.wake_granularity_ns = g * 1000;
    }
    if let Some(g) = o.grace_us {
        c.lhp_grace_ns = g * 1000;
    }
    if let Some(m) = o.min_run_us {
        c.wake_min_run_ns = m * 1000;
    }
    c
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

pub fn main(o: &Opts) -> anyhow::Result<()> {
    let mut modes: Vec<(&'static str, u64, SchedConfig)> =
        [1000, 100, 0].into_iter().map(|rl| ("xen-compat", rl, SchedConfig::xen_compat(rl))).collect();
    let pc = preempt_cfg(o);
    modes.push(("wake-preempt", pc.ratelimit_ns / 1000, pc));

    let cases = wakeup_cases(o, &modes)?;
    print_wakeup(o, &cases);
    lock_holder(o, pc)?;
    fast_waker(o, pc)?;
    sgi_flood(o, pc)?;
    domains(o, pc)?;
    if let Some(path) = &o.json {
        write_json(path, &cases)?;
    }
    Ok(())
}

/// The seed workload in every mode and topology.
fn wakeup_cases(o: &Opts, modes: &[(&'static str, u64, SchedConfig)]) -> anyhow::Result<Vec<Case>> {
    let mut cases = Vec::new();
    for &(mode, rl, cfg) in modes {
        for topology in [Topology::OneP2V, Topology::TwoP2V] {
            let res = sim::run(&params(o, cfg, topology, Scenario::Wakeup)).map_err(|e| anyhow!("{e}"))?;
            cases.push(Case { mode, ratelimit_us: rl, topology, res });
        }
    }
    Ok(cases)
}

/// The wakeup table: a row per mode and topology.
fn print_wakeup(o: &Opts, cases: &[Case]) {
    println!(
        "wakeup: {} s virtual, service {} us, submit {} us, context switch {} us; latency = I/O vCPU wake -> running",
        o.seconds, o.service_us, o.submit_us, o.switch_cost_us
    );
    println!(
        "{:<13} {:>6} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9}",
        "mode", "rl_us", "topo", "iops", "p50_us", "p99_us", "p999_us", "max_us", "hog%", "preempt/s"
    );
    for c in cases {
        let r = &c.res;
        println!(
            "{:<13} {:>6} {:>5} {:>9.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6.1} {:>9.0}",
            c.mode,
            c.ratelimit_us,
            c.topology.name(),
            r.iops(),
            us(r.wake_to_run(50, 100)),
            us(r.wake_to_run(99, 100)),
            us(r.wake_to_run(999, 1000)),
            us(r.wake_to_run(1, 1)),
            100.0 * r.hog_share(),
            r.hog_preempts_per_s(),
        );
    }
}

/// Lock-holder preemption: completion IRQ on the hog vCPU, whose handler
/// holds the queue lock around the SGI that wakes the I/O vCPU.
fn lock_holder(o: &Opts, pc: SchedConfig) -> anyhow::Result<()> {
    println!();
    println!("lock-holder (1p2v): IRQ on the hog, lock held 5 us before and 5 us after the waking SGI; slat = lock attempt -> submitted");
    println!("{:<34} {:>9} {:>9} {:>9} {:>10} {:>10}", "case", "iops", "p99_us", "p999_us", "slat_p99", "slat_max");
    let lhp = |wfe| Scenario::LockHolder { pre_sgi_ns: 5_000, post_sgi_ns: 5_000, wfe };
    let no_grace = SchedConfig { lhp_grace_ns: 0, ..pc };
    let lhp_cases: [(&str, SchedConfig, Scenario); 6] = [
        ("xen-compat rl=1000, busy spin", SchedConfig::xen_compat(1000), lhp(None)),
        ("xen-compat rl=0, busy spin", SchedConfig::xen_compat(0), lhp(None)),
        ("wake-preempt no grace, busy spin", no_grace, lhp(None)),
        ("wake-preempt no grace, wfe yield", no_grace, lhp(Some(2_000))),
        ("wake-preempt grace, busy spin", pc, lhp(None)),
        ("wake-preempt grace, wfe yield", pc, lhp(Some(2_000))),
    ];
    for (name, cfg, sc) in lhp_cases {
        let r = sim::run(&params(o, cfg, Topology::OneP2V, sc)).map_err(|e| anyhow!("{e}"))?;
        println!(
            "{:<34} {:>9.0} {:>9.1} {:>9.1} {:>10.1} {:>10.1}",
            name,
            r.iops(),
            us(r.wake_to_run(99, 100)),
            us(r.wake_to_run(999, 1000)),
            us(r.slat(99, 100)),
            us(r.slat(1, 1)),
        );
    }
    Ok(())
}

/// Preemption-rate bound: a waker that wakes 50 µs after it blocks and
/// runs 5 µs, against the hog.
fn fast_waker(o: &Opts, pc: SchedConfig) -> anyhow::Result<()> {
    println!();
    println!(
        "fast waker (1p2v): wakes 50 us after it blocks, runs 5 us, context switch {} us; hog% = hog's guest progress",
        o.switch_cost_us
    );
    println!("{:<34} {:>9} {:>6} {:>9} {:>9} {:>9}", "case", "wakes/s", "hog%", "preempt/s", "p99_us", "max_us");
    let min_run_us = pc.wake_min_run_ns / 1000;
    let fast_cases = [
        ("wake-preempt min-run 0".to_string(), SchedConfig { wake_min_run_ns: 0, ..pc }),
        (format!("wake-preempt min-run {min_run_us}"), pc),
    ];
    for (name, cfg) in fast_cases {
        let p =
            SimParams { service_ns: 50_000, submit_ns: 5_000, ..params(o, cfg, Topology::OneP2V, Scenario::Wakeup) };
        let r = sim::run(&p).map_err(|e| anyhow!("{e}"))?;
        println!(
            "{:<34} {:>9.0} {:>6.1} {:>9.0} {:>9.1} {:>9.1}",
            name,
            r.iops(),
            100.0 * r.hog_share(),
            r.hog_preempts_per_s(),
            us(r.wake_to_run(99, 100)),
            us(r.wake_to_run(1, 1)),
        );
    }
    Ok(())
}

/// Bounded lock-holder grace: the hog writes the SGI register every 30 µs
/// (empty target list); the other vCPU wakes every 1 ms and runs 50 µs.
fn sgi_flood(o: &Opts, pc: SchedConfig) -> anyhow::Result<()> {
    println!();
    println!("SGI flood (1p2v): hog writes ICC_SGI1R_EL1 every 30 us; vCPU B wakes every 1 ms, runs 50 us");
    println!("{:<34} {:>9} {:>9} {:>9}", "case", "B_ms/s", "p99_us", "max_us");
    let flood = |evidence| Scenario::SgiFlood { sgi_every_ns: 30_000, evidence, wake_every_ns: 1_000_000 };
    let flood_cases = [
        ("IRQs masked at each write", flood(CritEvidence::IrqsMasked)),
        ("IRQs enabled at each write", flood(CritEvidence::None)),
    ];
    for (name, sc) in flood_cases {
        let p = SimParams { submit_ns: 50_000, ..params(o, pc, Topology::OneP2V, sc) };
        let r = sim::run(&p).map_err(|e| anyhow!("{e}"))?;
        println!(
            "{:<34} {:>9.1} {:>9.1} {:>9.1}",
            name,
            r.io_guest_ns as f64 / 1e6 / o.seconds as f64,
            us(r.wake_to_run(99, 100)),
            us(r.wake_to_run(1, 1)),
        );
    }
    Ok(())
}

/// The wakeup cases as the JSON the benchmark harness reads.
fn write_json(path: &std::path::Path, cases: &[Case]) -> anyhow::Result<()> {
    let mut s = String::from("{\"cases\":[");
    for (i, c) in cases.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let r = &c.res;
        let _ = write!(
            s,
            "{{\"mode\":\"{}\",\"ratelimit_us\":{},\"topology\":\"{}\",\"iops\":{:.1},\"p50_us\":{:.1},\"p99_us\":{:.1},\"p999_us\":{:.1}}}",
            c.mode,
            c.ratelimit_us,
            c.topology.name(),
            r.iops(),
            us(r.wake_to_run(50, 100)),
            us(r.wake_to_run(99, 100)),
            us(r.wake_to_run(999, 1000)),
        );
    }
    s.push_str("]}\n");
    std::fs::write(path, s).with_context(|| format!("writing {}", path.display()))?;
    println!("\nwrote {}", path.display());
    Ok(())
}

/// CPU hogs in domains on 2 pCPUs (`sched::conformance::run_mix`, a hog per domain): each domain's
/// share of a pCPU, and the capped one's least/most in a 10 ms period.
fn domains(o: &Opts, cfg: SchedConfig) -> anyhow::Result<()> {
    println!();
    println!("domains (2 pCPUs, one CPU hog per domain): share of a pCPU per domain");
    println!("{:<34} shares", "case");
    // Per domain: (weight, cap in %).
    type Doms = &'static [(u32, Option<u32>)];
    let cases: [(&str, Doms); 3] = [
        ("weights 512/256/256/256", &[(512, None), (256, None), (256, None), (256, None)]),
        ("three equal", &[(256, None), (256, None), (256, None)]),
        ("d1 capped 25%, two hogs", &[(256, Some(25)), (256, None), (256, None)]),
    ];
    for (name, doms) in cases {
        let domains = (1..)
            .zip(doms.iter())
            .map(|(d, &(weight, cap_percent))| (d, DomainParams { weight, cap_percent }))
            .collect();
        let p = conformance::MixParams::hog_per_domain(cfg, 2, domains, o.seconds * 1_000_000_000, CAP_PERIOD_NS);
        let r = conformance::run_mix(&p).map_err(|e| anyhow!("{e}"))?;
        let mut line: String = (0..doms.len()).map(|i| format!(" d{}={:.3}", i + 1, r.share(i))).collect();
        if doms[0].1.is_some() {
            let per = &r.domain_periods[0];
            let pct = |ns: u64| ns as f64 / CAP_PERIOD_NS as f64;
            let _ = write!(
                line,
                "  (d1 per period: min {:.3} max {:.3})",
                pct(per.iter().copied().min().unwrap_or(0)),
                pct(per.iter().copied().max().unwrap_or(0))
            );
        }
        println!("{name:<34}{line}");
    }
    Ok(())
}

/// `cargo xtask sim conformance`: every case of
/// `hypervisor::sched::conformance`, a line each; 1 when one fails.
pub fn conformance() -> anyhow::Result<i32> {
    let checks = hypervisor::sched::conformance::checks().map_err(|e| anyhow!("scheduler: {e}"))?;
    println!("{:<4} {:<42} {:<12} {:<18} {:>9}  {:<16} note", "", "case", "mode", "figure", "value", "Xen's range");
    let mut failed = 0;
    for c in &checks {
        failed += usize::from(!c.pass());
        println!(
            "{:<4} {:<42} {:<12} {:<18} {:>9.3}  {:<16} {}",
            if c.pass() { "ok" } else { "FAIL" },
            c.case,
            c.mode,
            c.what,
            c.value,
            format!("[{}, {}]", c.lo, c.hi),
            c.note
        );
    }
    println!("{} cases, {failed} failed", checks.len());
    Ok(i32::from(failed > 0))
}
