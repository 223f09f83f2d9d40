//! `report.md`, `results.json` and `latency.svg` from the cases' results.
//!
//! The report answers the questions in its order: the per-case table
//! (IOPS, clat p50/p99/p99.9, mean slat: a scheduler can win on completion
//! latency and lose on submission latency), the ratios that are meaningful on
//! a shared, emulated host (1p2v/1p1v, unpinned/pinned,
//! wake-preempt/xen-compat, always between cases of the same disk and
//! clock), the four targets marked met / missed / not measured with the
//! numbers behind each verdict, and the hypervisor's kick→schedule-in
//! histogram per case.

use super::aggregate::{summarize, Summary};
use super::{svg, CaseResult, Clock, Disk, Irq, Sched, Topology};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One entry of `results.json` (the schema, field for field).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultCase {
    pub topology: Topology,
    pub irq: Irq,
    pub sched: Sched,
    pub ratelimit_us: u32,
    pub disk: Disk,
    pub clock: Clock,
    pub iops: f64,
    pub clat_p50_us: f64,
    pub clat_p99_us: f64,
    pub clat_p999_us: f64,
    pub slat_mean_us: f64,
    /// Successful repeats the medians are taken over.
    pub repeats: usize,
}

/// `results.json`: `{"cases":[...]}`. Cases where every repeat failed are
/// left out (they are listed in report.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultsFile {
    pub cases: Vec<ResultCase>,
}

/// Rounds to 0.001 so the JSON does not carry float noise.
fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

pub fn results_json(summaries: &[Summary]) -> String {
    let cases = summaries
        .iter()
        .map(|s| ResultCase {
            topology: s.case.topology,
            irq: s.case.irq,
            sched: s.case.sched,
            ratelimit_us: s.case.ratelimit_us,
            disk: s.case.disk,
            clock: s.case.clock,
            iops: r3(s.fio.iops),
            clat_p50_us: r3(s.fio.clat_p50_us),
            clat_p99_us: r3(s.fio.clat_p99_us),
            clat_p999_us: r3(s.fio.clat_p999_us),
            slat_mean_us: r3(s.fio.slat_mean_us),
            repeats: s.repeats,
        })
        .collect();
    let mut s = serde_json::to_string_pretty(&ResultsFile { cases }).expect("plain data serializes");
    s.push('\n');
    s
}

/// Verdict of one target check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Met,
    Missed,
    NotMeasured,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Met => "met",
            Status::Missed => "missed",
            Status::NotMeasured => "not measured",
        }
    }
}

/// One target evaluated on one (disk, clock) group.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetCheck {
    /// 1..=4, in the order.
    pub target: usize,
    /// `disk/clock` the numbers come from, or `-` when not measured.
    pub group: String,
    pub status: Status,
    /// The numbers behind the verdict.
    pub detail: String,
}

/// The targets, as stated there.
pub const TARGETS: [&str; 4] = [
    "1p2v unpinned wake-preempt IOPS ≥ 0.9× the 1p1v baseline, and clat p99 ≤ 2× baseline",
    "wake-preempt ≥ 5× xen-compat ratelimit-1000 IOPS on 1p2v unpinned",
    "unpinned/pinned IOPS ≥ 0.9 with wake-preempt",
    "1p2v wake-preempt mean slat ≤ 2× baseline",
];

fn find(all: &[Summary], f: impl Fn(&Summary) -> bool) -> Option<&Summary> {
    all.iter().find(|s| f(s))
}

/// The 1p1v case an N-vCPU case is compared with: same scheduler, disk and
/// clock (1p1v runs with the IRQ where it is, i.e. `unpinned`).
pub fn baseline_of<'a>(all: &'a [Summary], s: &Summary) -> Option<&'a Summary> {
    let c = s.case;
    find(all, |b| {
        b.case.topology == Topology::OneP1V
            && b.case.irq == Irq::Unpinned
            && b.case.sched == c.sched
            && b.case.ratelimit_us == c.ratelimit_us
            && b.case.disk == c.disk
            && b.case.clock == c.clock
    })
}

fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        f64::NAN
    } else {
        a / b
    }
}

fn fr(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}×")
    } else {
        "n/a".into()
    }
}

/// µs with sensible precision.
fn fus(x: f64) -> String {
    if !x.is_finite() {
        "n/a".into()
    } else if x < 10.0 {
        format!("{x:.2}")
    } else if x < 1000.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.0}")
    }
}

/// Evaluates the four targets on every (disk, clock) group that has the
/// cases they need; a target with no such group gets one `NotMeasured` row.
pub fn check_targets(all: &[Summary]) -> Vec<TargetCheck> {
    let mut out = Vec::new();
    for target in 1..=4 {
        let mut rows = Vec::new();
        for &clock in Clock::ALL {
            for &disk in Disk::ALL {
                let group = format!("{disk}/{clock}");
                let get = |t: Topology, irq: Irq, sched: Sched, rl: Option<u32>| {
                    find(all, |s| {
                        s.case.topology == t
                            && s.case.irq == irq
                            && s.case.sched == sched
                            && rl.is_none_or(|r| s.case.ratelimit_us == r)
                            && s.case.disk == disk
                            && s.case.clock == clock
                    })
                };
                let status = |ok: bool| if ok { Status::Met } else { Status::Missed };
                match target {
                    1 | 4 => {
                        let (Some(c), Some(b)) = (
                            get(Topology::OneP2V, Irq::Unpinned, Sched::WakePreempt, None),
                            get(Topology::OneP1V, Irq::Unpinned, Sched::WakePreempt, None),
                        ) else {
                            continue;
                        };
                        if target == 1 {
                            let ri = ratio(c.fio.iops, b.fio.iops);
                            let rp = ratio(c.fio.clat_p99_us, b.fio.clat_p99_us);
                            rows.push(TargetCheck {
                                target,
                                group,
                                status: status(ri >= 0.9 && rp <= 2.0),
                                detail: format!(
                                    "IOPS {:.0} vs {:.0} = {} (≥ 0.90×); p99 {} vs {} µs = {} (≤ 2×)",
                                    c.fio.iops,
                                    b.fio.iops,
                                    fr(ri),
                                    fus(c.fio.clat_p99_us),
                                    fus(b.fio.clat_p99_us),
                                    fr(rp)
                                ),
                            });
                        } else {
                            let rs = ratio(c.fio.slat_mean_us, b.fio.slat_mean_us);
                            let proxy =
                                if c.fio.slat_measured && b.fio.slat_measured { "" } else { " (lat−clat, see note)" };
                            rows.push(TargetCheck {
                                target,
                                group,
                                status: status(rs <= 2.0),
                                detail: format!(
                                    "mean slat {} vs {} µs = {} (≤ 2×){proxy}",
                                    fus(c.fio.slat_mean_us),
                                    fus(b.fio.slat_mean_us),
                                    fr(rs)
                                ),
                            });
                        }
                    }
                    2 => {
                        let (Some(c), Some(x)) = (
                            get(Topology::OneP2V, Irq::Unpinned, Sched::WakePreempt, None),
                            get(Topology::OneP2V, Irq::Unpinned, Sched::XenCompat, Some(1000)),
                        ) else {
                            continue;
                        };
                        let r = ratio(c.fio.iops, x.fio.iops);
                        rows.push(TargetCheck {
                            target,
                            group,
                            status: status(r >= 5.0),
                            detail: format!("IOPS {:.0} vs {:.0} = {} (≥ 5×)", c.fio.iops, x.fio.iops, fr(r)),
                        });
                    }
                    _ => {
                        for t in [Topology::OneP2V, Topology::TwoP2V] {
                            let (Some(u), Some(p)) = (
                                get(t, Irq::Unpinned, Sched::WakePreempt, None),
                                get(t, Irq::Pinned, Sched::WakePreempt, None),
                            ) else {
                                continue;
                            };
                            let r = ratio(u.fio.iops, p.fio.iops);
                            rows.push(TargetCheck {
                                target,
                                group: format!("{t} {group}"),
                                status: status(r >= 0.9),
                                detail: format!("IOPS {:.0} vs {:.0} = {} (≥ 0.90×)", u.fio.iops, p.fio.iops, fr(r)),
                            });
                        }
                    }
                }
            }
        }
        if rows.is_empty() {
            rows.push(TargetCheck {
                target,
                group: "-".into(),
                status: Status::NotMeasured,
                detail: "the cases it compares were not run (or all their repeats failed)".into(),
            });
        }
        out.extend(rows);
    }
    out
}

/// The whole report.md text.
pub fn render_report(results: &[CaseResult]) -> String {
    let summaries: Vec<Summary> = results.iter().filter_map(summarize).collect();
    let failed: Vec<&CaseResult> = results.iter().filter(|r| r.samples.is_empty()).collect();
    let mut m = String::new();
    let w = &mut m;
    let _ = writeln!(w, "# Wake-latency benchmark (fio inside the guest)\n");
    let _ = writeln!(
        w,
        "fio 4 KiB random read, iodepth 1, direct, psync, on the guest's last vCPU; a CPU hog on vCPU0 when the guest has two. \
         Figures are medians over the successful repeats; compare ratios within this run, not absolute numbers \
         (the host is shared and emulated). {} case(s), {} failed.\n",
        results.len(),
        failed.len()
    );

    // Targets first: the verdicts are what a reader looks for.
    let _ = writeln!(w, "## Targets\n");
    let _ = writeln!(w, "| # | target | where | status | numbers |");
    let _ = writeln!(w, "|---|---|---|---|---|");
    for c in check_targets(&summaries) {
        let _ = writeln!(
            w,
            "| {} | {} | {} | **{}** | {} |",
            c.target,
            TARGETS[c.target - 1],
            c.group,
            c.status.as_str(),
            c.detail
        );
    }
    let _ = writeln!(w);

    let _ = writeln!(w, "## Results\n");
    let _ = writeln!(
        w,
        "| case | IOPS | clat p50 µs | clat p99 µs | clat p99.9 µs | clat p99.99 µs | clat max µs | mean slat µs | disk IRQs per CPU | repeats |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|");
    for s in &summaries {
        let irqs = s
            .disk_irqs_per_cpu
            .as_ref()
            .map(|v| v.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" / "))
            .unwrap_or_else(|| "-".into());
        let fail = if s.errors.is_empty() { String::new() } else { format!(" ({} failed)", s.errors.len()) };
        let _ = writeln!(
            w,
            "| {} | {:.0} | {} | {} | {} | {} | {} | {}{} | {} | {}{} |",
            s.case,
            s.fio.iops,
            fus(s.fio.clat_p50_us),
            fus(s.fio.clat_p99_us),
            fus(s.fio.clat_p999_us),
            fus(s.fio.clat_p9999_us),
            fus(s.fio.clat_max_us),
            fus(s.fio.slat_mean_us),
            if s.fio.slat_measured { "" } else { "¹" },
            irqs,
            s.repeats,
            fail
        );
    }
    if summaries.iter().any(|s| !s.fio.slat_measured) {
        let _ = writeln!(
            w,
            "\n¹ fio records no submission latency for synchronous engines (psync: `slat_ns.N = 0`); the column then shows \
             `lat − clat` (fio's setup before the `pread` call). With psync the kernel's submission (virtqueue lock, kick, \
             any lock-holder-preemption stall) is inside clat."
        );
    }
    let _ = writeln!(w);

    if !failed.is_empty() || summaries.iter().any(|s| !s.errors.is_empty()) {
        let _ = writeln!(w, "### Failed runs\n");
        for r in results.iter().filter(|r| !r.errors.is_empty()) {
            for e in &r.errors {
                let _ = writeln!(w, "- {}: {}", r.case, e.lines().next().unwrap_or(""));
            }
        }
        let _ = writeln!(w);
    }

    ratios(w, &summaries);
    histograms(w, &summaries);
    let _ = writeln!(w, "## Latency plot\n\n![completion latency per case](latency.svg)\n");
    m
}

fn ratios(w: &mut String, all: &[Summary]) {
    let _ = writeln!(w, "## Ratios\n");
    let _ = writeln!(w, "### 1p2v / 1p1v and 2p2v / 1p1v (same scheduler, disk, clock)\n");
    let _ = writeln!(w, "| case | IOPS | clat p99 | mean slat |");
    let _ = writeln!(w, "|---|---:|---:|---:|");
    let mut any = false;
    for s in all.iter().filter(|s| s.case.topology.vcpus() > 1) {
        if let Some(b) = baseline_of(all, s) {
            any = true;
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} |",
                s.case,
                fr(ratio(s.fio.iops, b.fio.iops)),
                fr(ratio(s.fio.clat_p99_us, b.fio.clat_p99_us)),
                fr(ratio(s.fio.slat_mean_us, b.fio.slat_mean_us))
            );
        }
    }
    if !any {
        let _ = writeln!(w, "| (no pair measured) | | | |");
    }

    let _ = writeln!(w, "\n### unpinned / pinned IRQ\n");
    let _ = writeln!(w, "| case | IOPS | clat p99 | mean slat |");
    let _ = writeln!(w, "|---|---:|---:|---:|");
    any = false;
    for u in all.iter().filter(|s| s.case.irq == Irq::Unpinned && s.case.topology.vcpus() > 1) {
        let pinned = super::Case { irq: Irq::Pinned, ..u.case };
        if let Some(p) = find(all, |s| s.case == pinned) {
            any = true;
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} |",
                u.case,
                fr(ratio(u.fio.iops, p.fio.iops)),
                fr(ratio(u.fio.clat_p99_us, p.fio.clat_p99_us)),
                fr(ratio(u.fio.slat_mean_us, p.fio.slat_mean_us))
            );
        }
    }
    if !any {
        let _ = writeln!(w, "| (no pair measured) | | | |");
    }

    let _ = writeln!(w, "\n### wake-preempt / xen-compat\n");
    let _ = writeln!(w, "| case (wake-preempt) | vs xen-compat ratelimit | IOPS | clat p99 | mean slat |");
    let _ = writeln!(w, "|---|---:|---:|---:|---:|");
    any = false;
    for p in all.iter().filter(|s| s.case.sched == Sched::WakePreempt) {
        for x in all.iter().filter(|s| {
            s.case.sched == Sched::XenCompat
                && s.case.topology == p.case.topology
                && s.case.irq == p.case.irq
                && s.case.disk == p.case.disk
                && s.case.clock == p.case.clock
        }) {
            any = true;
            let _ = writeln!(
                w,
                "| {} | {} µs | {} | {} | {} |",
                p.case,
                x.case.ratelimit_us,
                fr(ratio(p.fio.iops, x.fio.iops)),
                fr(ratio(p.fio.clat_p99_us, x.fio.clat_p99_us)),
                fr(ratio(p.fio.slat_mean_us, x.fio.slat_mean_us))
            );
        }
    }
    if !any {
        let _ = writeln!(w, "| (no pair measured) | | | | |");
    }
    let _ = writeln!(w);
}

fn histograms(w: &mut String, all: &[Summary]) {
    let _ = writeln!(w, "## Kick → schedule-in latency of the fio vCPU (hypervisor histogram)\n");
    let _ = writeln!(
        w,
        "From the hypervisor's `vcpuN.kick_to_run_ns` lines at guest power-off, merged over repeats; \
         log2 buckets, percentiles estimated within a bucket.\n"
    );
    for s in all {
        let _ = writeln!(w, "### {}\n", s.case);
        for e in &s.stats_errors {
            let _ = writeln!(w, "stats text did not parse: {e}\n");
        }
        let Some(h) = s.kick_to_run.as_ref().filter(|h| h.count() > 0) else {
            let _ = writeln!(w, "no kick→schedule-in samples (no hypervisor stats on the console)\n");
            continue;
        };
        let us = |ns: Option<u64>| ns.map(|v| fus(v as f64 / 1000.0)).unwrap_or_else(|| "n/a".into());
        let _ = writeln!(
            w,
            "{} wakes; p50 {} µs, p99 {} µs, max {} µs; mean {} µs.\n",
            h.count(),
            us(h.quantile(50, 100)),
            us(h.quantile(99, 100)),
            us(h.max()),
            fus(h.sum() as f64 / h.count() as f64 / 1000.0)
        );
        let _ = writeln!(w, "| bucket (µs) | count | |");
        let _ = writeln!(w, "|---|---:|---|");
        let peak = (0..hypervisor::stats::NR_BUCKETS).map(|i| h.bucket(i)).max().unwrap_or(1).max(1);
        for i in 0..hypervisor::stats::NR_BUCKETS {
            let n = h.bucket(i);
            if n == 0 {
                continue;
            }
            let (lo, hi) = hypervisor::stats::Log2Histogram::bucket_range(i).unwrap_or((0, 0));
            let bar = "█".repeat(((n as f64 / peak as f64) * 30.0).ceil() as usize);
            let _ = writeln!(w, "| [{}, {}) | {} | {} |", fus(lo as f64 / 1000.0), fus(hi as f64 / 1000.0), n, bar);
        }
        let _ = writeln!(w);
    }
}

/// Paths of the written files.
#[derive(Clone, Debug)]
pub struct ReportFiles {
    pub report_md: PathBuf,
    pub results_json: PathBuf,
    pub latency_svg: PathBuf,
}

/// Writes `report.md`, `results.json` and `latency.svg` into `dir`
/// (created if missing).
pub fn write_report(dir: &Path, results: &[CaseResult]) -> crate::Result<ReportFiles> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let summaries: Vec<Summary> = results.iter().filter_map(summarize).collect();
    let files = ReportFiles {
        report_md: dir.join("report.md"),
        results_json: dir.join("results.json"),
        latency_svg: dir.join("latency.svg"),
    };
    let write = |p: &Path, s: String| std::fs::write(p, s).map_err(|e| format!("{}: {e}", p.display()));
    write(&files.report_md, render_report(results))?;
    write(&files.results_json, results_json(&summaries))?;
    write(&files.latency_svg, svg::latency_plot(&summaries))?;
    Ok(files)
}
