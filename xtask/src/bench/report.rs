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
use super::{svg, CaseResult, Clock, Delivery, Disk, Idle, Irq, Sched, Topology};
use anyhow::Context;
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
    /// GIC version and MSI delivery mode (absent means v3-emulated).
    /// Left out for v3-emulated, so the GICv3 matrix's files keep one schema.
    #[serde(default = "v3_emulated", skip_serializing_if = "is_v3_emulated")]
    pub delivery: Delivery,
    /// The guest's idle loop; left out for WFI (every case before the
    /// resident-vCPU one).
    #[serde(default = "Idle::wfi", skip_serializing_if = "is_wfi")]
    pub idle: Idle,
    pub iops: f64,
    pub clat_p50_us: f64,
    pub clat_p99_us: f64,
    pub clat_p999_us: f64,
    pub slat_mean_us: f64,
    /// Successful repeats the medians are taken over.
    pub repeats: usize,
    /// The hog's share of the pCPU time (`aggregate::Summary::hog_share`);
    /// left out without a hog or stats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hog_share: Option<f64>,
}

fn v3_emulated() -> Delivery {
    Delivery::V3Emulated
}

fn is_v3_emulated(d: &Delivery) -> bool {
    *d == Delivery::V3Emulated
}

fn is_wfi(i: &Idle) -> bool {
    *i == Idle::Wfi
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
            delivery: s.case.delivery,
            idle: s.case.idle,
            iops: r3(s.fio.iops),
            clat_p50_us: r3(s.fio.clat_p50_us),
            clat_p99_us: r3(s.fio.clat_p99_us),
            clat_p999_us: r3(s.fio.clat_p999_us),
            slat_mean_us: r3(s.fio.slat_mean_us),
            repeats: s.repeats,
            hog_share: s.hog_share.map(r3),
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
    /// 1..=6: its place in [`TARGETS`], from 1.
    pub target: usize,
    /// `disk/clock` the numbers come from, or `-` when not measured.
    pub group: String,
    pub status: Status,
    /// The numbers behind the verdict.
    pub detail: String,
}

/// The latency targets: 1–4 with a sibling hog in Dom0, 5–6 with another
/// domain's hog on the same pCPU.
pub const TARGETS: [&str; 6] = [
    "1p2v unpinned wake-preempt IOPS ≥ 0.9× the 1p1v baseline, and clat p99 ≤ 2× baseline",
    "wake-preempt ≥ 5× xen-compat ratelimit-1000 IOPS on 1p2v unpinned",
    "unpinned/pinned IOPS ≥ 0.9 with wake-preempt",
    "1p2v wake-preempt mean slat ≤ 2× baseline",
    "1p1v+d1 (Dom0's fio, a DomU's CPU hog on the same pCPU) wake-preempt IOPS ≥ 0.9× the 1p1v baseline",
    "1p1v+d1 wake-preempt ≥ 10× xen-compat ratelimit-1000 IOPS",
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
            && b.case.delivery == c.delivery
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

/// Any case (only its disk and delivery are looked at, for a group's label).
fn placeholder_case() -> super::Case {
    super::Case {
        topology: Topology::OneP1V,
        irq: Irq::Unpinned,
        sched: Sched::WakePreempt,
        ratelimit_us: super::DEFAULT_RATELIMIT_US,
        disk: Disk::Ram,
        clock: Clock::Icount,
        delivery: Delivery::V3Emulated,
        idle: Idle::Wfi,
    }
}

/// Evaluates the [`TARGETS`] on every (disk, clock) group that has the
/// cases they need; a target with no such group gets one `NotMeasured` row.
pub fn check_targets(all: &[Summary]) -> Vec<TargetCheck> {
    let mut out = Vec::new();
    for target in 1..=TARGETS.len() {
        let mut rows = Vec::new();
        for &clock in Clock::ALL {
            for (disk, delivery) in Disk::ALL.iter().flat_map(|&d| Delivery::ALL.iter().map(move |&m| (d, m))) {
                let shown = super::Case { disk, delivery, ..all.first().map_or_else(placeholder_case, |s| s.case) };
                let group = if shown.shows_delivery() {
                    format!("{disk} {delivery}/{clock}")
                } else {
                    format!("{disk}/{clock}")
                };
                let get = |t: Topology, irq: Irq, sched: Sched, rl: Option<u32>| {
                    find(all, |s| {
                        s.case.topology == t
                            && s.case.irq == irq
                            && s.case.sched == sched
                            && rl.is_none_or(|r| s.case.ratelimit_us == r)
                            && s.case.disk == disk
                            && s.case.clock == clock
                            && s.case.delivery == delivery
                    })
                };
                match target {
                    1 | 4 => rows.extend(check_against_baseline(target, group, &get)),
                    2 => rows.extend(check_against_xen_compat(target, group, &get)),
                    5 | 6 => rows.extend(check_domu_hog(target, group, &get)),
                    _ => rows.extend(check_unpinned_vs_pinned(target, group, &get)),
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

/// The case of one (disk, clock, delivery) group with this topology, IRQ
/// placement, scheduler and (when given) ratelimit, if it ran.
type CaseOf<'a> = dyn Fn(Topology, Irq, Sched, Option<u32>) -> Option<&'a Summary> + 'a;

fn met(ok: bool) -> Status {
    if ok {
        Status::Met
    } else {
        Status::Missed
    }
}

/// Targets 1 and 4: 1p2v unpinned wake-preempt against the 1p1v baseline,
/// on IOPS and p99 (1) or on mean submission latency (4).
fn check_against_baseline(target: usize, group: String, get: &CaseOf) -> Option<TargetCheck> {
    let c = get(Topology::OneP2V, Irq::Unpinned, Sched::WakePreempt, None)?;
    let b = get(Topology::OneP1V, Irq::Unpinned, Sched::WakePreempt, None)?;
    if target == 1 {
        let ri = ratio(c.fio.iops, b.fio.iops);
        let rp = ratio(c.fio.clat_p99_us, b.fio.clat_p99_us);
        Some(TargetCheck {
            target,
            group,
            status: met(ri >= 0.9 && rp <= 2.0),
            detail: format!(
                "IOPS {:.0} vs {:.0} = {} (≥ 0.90×); p99 {} vs {} µs = {} (≤ 2×)",
                c.fio.iops,
                b.fio.iops,
                fr(ri),
                fus(c.fio.clat_p99_us),
                fus(b.fio.clat_p99_us),
                fr(rp)
            ),
        })
    } else {
        let rs = ratio(c.fio.slat_mean_us, b.fio.slat_mean_us);
        let proxy = if c.fio.slat_measured && b.fio.slat_measured { "" } else { " (lat−clat, see note)" };
        Some(TargetCheck {
            target,
            group,
            status: met(rs <= 2.0),
            detail: format!(
                "mean slat {} vs {} µs = {} (≤ 2×){proxy}",
                fus(c.fio.slat_mean_us),
                fus(b.fio.slat_mean_us),
                fr(rs)
            ),
        })
    }
}

/// Target 2: 1p2v unpinned wake-preempt against xen-compat (ratelimit
/// 1000 µs) on IOPS.
fn check_against_xen_compat(target: usize, group: String, get: &CaseOf) -> Option<TargetCheck> {
    let c = get(Topology::OneP2V, Irq::Unpinned, Sched::WakePreempt, None)?;
    let x = get(Topology::OneP2V, Irq::Unpinned, Sched::XenCompat, Some(1000))?;
    let r = ratio(c.fio.iops, x.fio.iops);
    Some(TargetCheck {
        target,
        group,
        status: met(r >= 5.0),
        detail: format!("IOPS {:.0} vs {:.0} = {} (≥ 5×)", c.fio.iops, x.fio.iops, fr(r)),
    })
}

/// Targets 5 and 6: the hog in another domain (1p1v+d1 wake-preempt)
/// against 1p1v (5) or against xen-compat with the same hog (6), on IOPS.
fn check_domu_hog(target: usize, group: String, get: &CaseOf) -> Option<TargetCheck> {
    let d = get(Topology::OneP1VD1, Irq::Unpinned, Sched::WakePreempt, None)?;
    let (other, what, min) = if target == 5 {
        (get(Topology::OneP1V, Irq::Unpinned, Sched::WakePreempt, None), "1p1v", 0.9)
    } else {
        (get(Topology::OneP1VD1, Irq::Unpinned, Sched::XenCompat, Some(1000)), "xen-compat", 10.0)
    };
    let o = other?;
    let r = ratio(d.fio.iops, o.fio.iops);
    let hog = d.hog_share.map_or("n/a".into(), |h| format!("{:.0} %", h * 100.0));
    Some(TargetCheck {
        target,
        group,
        status: met(r >= min),
        detail: format!(
            "IOPS {:.0} vs {what} {:.0} = {} (≥ {min:.2}×); DomU hog's CPU share {hog}",
            d.fio.iops,
            o.fio.iops,
            fr(r)
        ),
    })
}

/// Target 3: unpinned against pinned wake-preempt, at 1p2v and 2p2v, on
/// IOPS.
fn check_unpinned_vs_pinned(target: usize, group: String, get: &CaseOf) -> Vec<TargetCheck> {
    let mut rows = Vec::new();
    for t in [Topology::OneP2V, Topology::TwoP2V] {
        let (Some(u), Some(p)) =
            (get(t, Irq::Unpinned, Sched::WakePreempt, None), get(t, Irq::Pinned, Sched::WakePreempt, None))
        else {
            continue;
        };
        let r = ratio(u.fio.iops, p.fio.iops);
        rows.push(TargetCheck {
            target,
            group: format!("{t} {group}"),
            status: met(r >= 0.9),
            detail: format!("IOPS {:.0} vs {:.0} = {} (≥ 0.90×)", u.fio.iops, p.fio.iops, fr(r)),
        });
    }
    rows
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
        "| case | IOPS | clat p50 µs | clat p99 µs | clat p99.9 µs | clat p99.99 µs | clat max µs | mean slat µs | hog CPU share² | disk IRQs per CPU (irqchip) | repeats |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|");
    for s in &summaries {
        let irqs = s
            .disk_irqs_per_cpu
            .as_ref()
            .map(|v| v.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" / "))
            .map(|v| if s.disk_irq_chips.is_empty() { v } else { format!("{v} ({})", s.disk_irq_chips.join(", ")) })
            .unwrap_or_else(|| "-".into());
        let fail = if s.errors.is_empty() { String::new() } else { format!(" ({} failed)", s.errors.len()) };
        let _ = writeln!(
            w,
            "| {} | {:.0} | {} | {} | {} | {} | {} | {}{} | {} | {} | {}{} |",
            s.case,
            s.fio.iops,
            fus(s.fio.clat_p50_us),
            fus(s.fio.clat_p99_us),
            fus(s.fio.clat_p999_us),
            fus(s.fio.clat_p9999_us),
            fus(s.fio.clat_max_us),
            fus(s.fio.slat_mean_us),
            if s.fio.slat_measured { "" } else { "¹" },
            fshare(s.hog_share),
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
    if summaries.iter().any(|s| s.hog_share.is_some()) {
        let _ = writeln!(
            w,
            "\n² The hog's share of the pCPU time the vCPUs ran, over the whole run (boot included), from the \
             hypervisor's `run_ns` counters: 1p2v/2p2v Dom0's vCPU0 over Dom0's vCPUs; 1p1v+d1 the DomU's \
             (`d1.vcpu0.run_ns`) over Dom0's and the DomU's. A 1p1v+d1 run counts only when the DomU's hog \
             started before fio and was still running at power-off."
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
    delivery(w, &summaries);
    histograms(w, &summaries);
    let _ = writeln!(w, "## Latency plot\n\n![completion latency per case](latency.svg)\n");
    m
}

/// A hog's CPU share as a percentage, `-` without one.
fn fshare(x: Option<f64>) -> String {
    x.filter(|x| x.is_finite()).map_or("-".into(), |x| format!("{:.0} %", x * 100.0))
}

fn ratios(w: &mut String, all: &[Summary]) {
    let _ = writeln!(w, "## Ratios\n");
    let _ = writeln!(w, "### 1p2v, 1p1v+d1 and 2p2v / 1p1v (same scheduler, disk, clock)\n");
    let _ = writeln!(w, "| case | IOPS | clat p99 | mean slat |");
    let _ = writeln!(w, "|---|---:|---:|---:|");
    let mut any = false;
    for s in all.iter().filter(|s| s.case.topology.contended()) {
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
    for u in all.iter().filter(|s| s.case.irq == Irq::Unpinned && s.case.topology.has_hog()) {
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
                && s.case.delivery == p.case.delivery
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
    domu_vs_sibling(w, all);
    msi_vs_spi(w, all);
}

/// The hog in another domain (1p1v+d1) / the hog on a sibling
/// vCPU of Dom0 (1p2v unpinned), same scheduler, disk and clock.
fn domu_vs_sibling(w: &mut String, all: &[Summary]) {
    let pairs: Vec<(&Summary, &Summary)> = all
        .iter()
        .filter(|s| s.case.topology.domu_hog())
        .filter_map(|d| {
            let sib = super::Case { topology: Topology::OneP2V, irq: Irq::Unpinned, ..d.case };
            find(all, |s| s.case == sib).map(|s| (d, s))
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    let _ = writeln!(w, "### A DomU's hog (1p1v+d1) / a sibling vCPU's hog (1p2v unpinned)\n");
    let _ = writeln!(w, "| case (1p1v+d1) | IOPS | clat p99 | mean slat | hog CPU share: DomU vs sibling |");
    let _ = writeln!(w, "|---|---:|---:|---:|---|");
    for (d, s) in pairs {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} vs {} |",
            d.case,
            fr(ratio(d.fio.iops, s.fio.iops)),
            fr(ratio(d.fio.clat_p99_us, s.fio.clat_p99_us)),
            fr(ratio(d.fio.slat_mean_us, s.fio.slat_mean_us)),
            fshare(d.hog_share),
            fshare(s.hog_share)
        );
    }
    let _ = writeln!(w);
}

/// PCIe disk (MSI-X, or INTx before the virtual ITS) / the SPI disk
/// (virtio-mmio passthrough) of the same topology, IRQ, scheduler and
/// clock: only when a PCIe disk was run (`--disk`).
fn msi_vs_spi(w: &mut String, all: &[Summary]) {
    let pairs: Vec<(&Summary, &Summary)> = all
        .iter()
        .filter(|s| s.case.disk.is_pcie())
        .filter_map(|m| {
            // The SPI disk runs on one delivery mode only (it has no LPIs).
            let spi = super::Case { disk: Disk::Passthrough, ..m.case };
            find(all, |s| s.case == spi)
                .or_else(|| find(all, |s| s.case == super::Case { delivery: s.case.delivery, ..spi }))
                .map(|s| (m, s))
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    let _ = writeln!(w, "### PCIe disk (MSI) / passthrough virtio-mmio disk (SPI)\n");
    let _ = writeln!(
        w,
        "Same topology, IRQ, scheduler and clock; the irqchip column shows how the interrupts actually arrived \
         (`ITS-MSI`: LPIs through the ITS; `GICv3`: a wired SPI or INTx).\n"
    );
    let _ = writeln!(w, "| case (PCIe disk) | irqchip | IOPS | clat p99 | mean slat |");
    let _ = writeln!(w, "|---|---|---:|---:|---:|");
    for (m, s) in pairs {
        let chips =
            |x: &Summary| if x.disk_irq_chips.is_empty() { "?".to_string() } else { x.disk_irq_chips.join(", ") };
        let _ = writeln!(
            w,
            "| {} | {} vs {} | {} | {} | {} |",
            m.case,
            chips(m),
            chips(s),
            fr(ratio(m.fio.iops, s.fio.iops)),
            fr(ratio(m.fio.clat_p99_us, s.fio.clat_p99_us)),
            fr(ratio(m.fio.slat_mean_us, s.fio.slat_mean_us))
        );
    }
    let _ = writeln!(w);
}

/// The target "with the fio vCPU resident and alone on its pCPU
/// (2p2v), fewer than 0.1 exits per I/O for interrupt delivery": the
/// [`Idle::Poll`] cases, judged on the fio vCPU's MSI IRQ exits per I/O.
fn resident(w: &mut String, all: &[Summary]) {
    let rows: Vec<&Summary> = all.iter().filter(|s| s.case.idle == Idle::Poll).collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(w, "### fio vCPU resident and alone on its pCPU (2p2v): exits per I/O for interrupt delivery\n");
    let _ = writeln!(
        w,
        "2p2v, real time: the hog on vCPU0 (pCPU0), fio (psync, depth 1) on vCPU1 (pCPU1), every MSI steered to \
         vCPU1, the guest's idle loop polling (`nohlt`) so vCPU1 never blocks in WFI and its vPE stays \
         resident. Target: MSI IRQ exits / I/O < {RESIDENT_MSI_EXITS_PER_IO} on v4-direct. IRQ exits also \
         count the guest's 250 Hz timer tick, the same under every delivery mode.\n"
    );
    let _ = writeln!(
        w,
        "| case | IOPS | fio vCPU exits / I/O | IRQ exits / I/O | MSI IRQ exits / I/O | WFI traps / I/O | \
         doorbells: wake / runnable / spurious | target |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|---|");
    for s in rows {
        let (fc, ios) = (s.fio_vcpu_counters.as_ref(), s.ios_with_stats);
        let msi = per_io(fc, "irq_exits_msi", ios);
        let verdict = if s.case.delivery.emulated() {
            "n/a (emulated: one exit per MSI)".to_string()
        } else {
            resident_status(msi).as_str().to_string()
        };
        let _ = writeln!(
            w,
            "| {} | {:.0} | {} | {} | {} | {} | {} / {} / {} | {verdict} |",
            s.case.label(),
            s.fio.iops,
            fper(per_io(fc, "exits", ios)),
            fper(per_io(fc, "irq_exits", ios)),
            fper(msi),
            fper(per_io(fc, "wfi_traps", ios)),
            fcount(fc, "doorbells"),
            fcount(fc, "doorbells_runnable"),
            fcount(fc, "doorbells_spurious"),
        );
    }
    let _ = writeln!(w);
}

/// The bound on the fio vCPU's vPE residency switches per switch-in of
/// it: one load, one put.
pub const VPE_SWITCHES_PER_SCHEDULE_IN: f64 = 2.0;

/// The fio vCPU's vPE residency switches per schedule-in with a verdict on
/// v4-direct (`-` on the emulated paths, which have no vPE).
fn vpe_switches(s: &Summary) -> String {
    if s.case.delivery.emulated() {
        return "-".into();
    }
    let c = s.fio_vcpu_counters.as_ref();
    let (Some(sw), Some(ins)) =
        (c.and_then(|c| c.get("vpe_residency_switches")), c.and_then(|c| c.get("schedule_ins")))
    else {
        return "n/a".into();
    };
    if ins == 0 {
        return "n/a".into();
    }
    let r = sw as f64 / ins as f64;
    let verdict = if r <= VPE_SWITCHES_PER_SCHEDULE_IN { Status::Met } else { Status::Missed };
    format!("{r:.4} ({})", verdict.as_str())
}

/// The bound on interrupt delivery exits per I/O of a resident fio vCPU.
pub const RESIDENT_MSI_EXITS_PER_IO: f64 = 0.1;

/// The verdict on a resident fio vCPU's MSI IRQ exits per I/O.
pub fn resident_status(msi_exits_per_io: f64) -> Status {
    if !msi_exits_per_io.is_finite() {
        Status::NotMeasured
    } else if msi_exits_per_io < RESIDENT_MSI_EXITS_PER_IO {
        Status::Met
    } else {
        Status::Missed
    }
}

/// A counter per fio I/O (`n/a` without stats or I/Os).
pub fn per_io(counters: Option<&hypervisor::stats::Counters>, name: &str, ios: u64) -> f64 {
    match counters.and_then(|c| c.get(name)) {
        Some(n) if ios > 0 => n as f64 / ios as f64,
        _ => f64::NAN,
    }
}

fn fper(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "n/a".into()
    }
}

fn fcount(c: Option<&hypervisor::stats::Counters>, name: &str) -> String {
    c.and_then(|c| c.get(name)).map_or_else(|| "n/a".into(), |n| n.to_string())
}

/// The issue-10 target lines of one (disk, delivery) group: 1p2v
/// wake-preempt ≥ 0.9× the 1p1v baseline and ≥ 10× xen-compat (IOPS).
/// Returns (line, verdict of the 10× target) per group that has the cases.
pub fn delivery_targets(all: &[Summary]) -> Vec<(String, Status, Status)> {
    let mut out = Vec::new();
    for &disk in Disk::ALL {
        for &delivery in Delivery::ALL {
            let get = |t: Topology, sched: Sched| {
                find(all, |s| {
                    s.case.topology == t
                        && s.case.irq == Irq::Unpinned
                        && s.case.sched == sched
                        && s.case.disk == disk
                        && s.case.delivery == delivery
                        && s.case.clock == Clock::Icount
                })
            };
            let Some(p) = get(Topology::OneP2V, Sched::WakePreempt) else { continue };
            let base = get(Topology::OneP1V, Sched::WakePreempt);
            let xen = get(Topology::OneP2V, Sched::XenCompat);
            if base.is_none() && xen.is_none() {
                continue;
            }
            let st = |ok: bool| if ok { Status::Met } else { Status::Missed };
            let rb = base.map_or(f64::NAN, |b| ratio(p.fio.iops, b.fio.iops));
            let rx = xen.map_or(f64::NAN, |x| ratio(p.fio.iops, x.fio.iops));
            let qemu_disk = disk != Disk::Ram;
            let base_status = if base.is_none() {
                Status::NotMeasured
            } else if qemu_disk {
                // Under icount a QEMU disk's 1p1v service time is ~5× its
                // 1p2v one (README): the ratio is shown, not judged.
                Status::NotMeasured
            } else {
                st(rb >= 0.9)
            };
            let xen_status = if xen.is_none() { Status::NotMeasured } else { st(rx >= 10.0) };
            let name = if p.case.shows_delivery() { format!("{disk} {delivery}") } else { disk.to_string() };
            let mut line = format!(
                "| {name} | {} vs 1p1v {} = {}{} | vs xen-compat {} = {} | {} µs",
                format_args!("{:.0}", p.fio.iops),
                base.map_or("-".into(), |b| format!("{:.0}", b.fio.iops)),
                fr(rb),
                format_args!(
                    " **{}**",
                    if qemu_disk && base.is_some() {
                        "not meaningful (icount, QEMU disk)"
                    } else {
                        base_status.as_str()
                    }
                ),
                xen.map_or("-".into(), |x| format!("{:.0}", x.fio.iops)),
                format_args!("{} **{}**", fr(rx), xen_status.as_str()),
                fus(p.fio.clat_p50_us),
            );
            if qemu_disk {
                line.push_str(&format!(" ({}) |", fr(ratio(p.fio.clat_p50_us, super::QEMU_DISK_LATENCY_US as f64))));
            } else {
                line.push_str(" |");
            }
            out.push((line, base_status, xen_status));
        }
    }
    out
}

/// Interrupt delivery per case: GICv3 emulated LPIs vs GICv4
/// direct vLPIs, with the hypervisor's counters per fio I/O. Only when a
/// case names its delivery mode (a PCIe disk or a GICv4 machine).
fn delivery(w: &mut String, all: &[Summary]) {
    if !all.iter().any(|s| s.case.shows_delivery()) {
        return;
    }
    let _ = writeln!(w, "## Interrupt delivery: GICv3 emulated LPIs vs GICv4 direct vLPIs\n");
    let _ = writeln!(
        w,
        "`v3-emulated`: GICv3 machine, each MSI is a host LPI the hypervisor injects through a list register; \
         `v4-emulated`: the same on a GICv4 machine (`gic_vlpi=off`); `v4-direct`: the ITS makes the vLPI pending \
         in the vPE, a doorbell wakes a blocked vCPU. kick→run: the fio vCPU's kick→schedule-in histogram. \
         Per I/O: counters summed over the repeats divided by fio's reads in them; exits are the fio vCPU's \
         guest exits of any kind (WFI included), fio vCPU IRQ exits its exits for a physical interrupt (the \
         guest's timer tick too), of which MSI IRQ exits are those that took a guest MSI's host LPI or a \
         doorbell (interrupt delivery's share); all IRQ exits are every vCPU's; LPIs injected are those the \
         hypervisor put in list registers (every vCPU). Doorbell wakes and doorbells are the fio vCPU's: \
         doorbells that woke it from WFI / found it runnable but descheduled (GICv4.0 rings for every vLPI \
         of a non-resident vPE: expected, no extra wake) / found it running (spurious). vPE switches / \
         schedule-in: the fio vCPU's vPE made resident or non-resident per switch-in of it (continuations \
         that pick it again leave the vPE resident; target ≤ {VPE_SWITCHES_PER_SCHEDULE_IN} on v4-direct).\n"
    );
    let _ = writeln!(
        w,
        "| case | IOPS | clat p99 µs | kick→run p50 / p99 µs | fio vCPU exits / I/O | fio vCPU IRQ exits / I/O | \
         fio vCPU MSI IRQ exits / I/O | all IRQ exits / I/O | LPIs injected / I/O | doorbell wakes | \
         doorbells: wake / runnable / spurious | vPE switches / schedule-in |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in all {
        let k2r = s.kick_to_run.as_ref().filter(|h| h.count() > 0).map_or_else(
            || "n/a".to_string(),
            |h| {
                let us = |ns: Option<u64>| ns.map(|v| fus(v as f64 / 1000.0)).unwrap_or_else(|| "n/a".into());
                format!("{} / {}", us(h.quantile(50, 100)), us(h.quantile(99, 100)))
            },
        );
        let (fc, ac, ios) = (s.fio_vcpu_counters.as_ref(), s.all_vcpu_counters.as_ref(), s.ios_with_stats);
        let _ = writeln!(
            w,
            "| {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} / {} | {} |",
            s.case.label(),
            s.fio.iops,
            fus(s.fio.clat_p99_us),
            k2r,
            fper(per_io(fc, "exits", ios)),
            fper(per_io(fc, "irq_exits", ios)),
            fper(per_io(fc, "irq_exits_msi", ios)),
            fper(per_io(ac, "irq_exits", ios)),
            fper(per_io(ac, "lpis_injected", ios)),
            fcount(fc, "wakes_doorbell"),
            fcount(fc, "doorbells"),
            fcount(fc, "doorbells_runnable"),
            fcount(fc, "doorbells_spurious"),
            vpe_switches(s),
        );
    }
    let _ = writeln!(w);
    resident(w, all);
    let steered: Vec<(&Summary, &Summary)> = all
        .iter()
        .filter(|s| s.case.irq == Irq::MsiHog)
        .filter_map(|h| find(all, |f| f.case == super::Case { irq: Irq::MsiFio, ..h.case }).map(|f| (h, f)))
        .collect();
    if !steered.is_empty() {
        let _ = writeln!(w, "### MSI aimed at the hog vCPU / at the fio vCPU (`dom0_msi_vcpu=`)\n");
        let _ = writeln!(
            w,
            "| case (msi-hog / msi-fio) | IOPS | clat p99 | fio vCPU exits / I/O | fio vCPU doorbell wakes |"
        );
        let _ = writeln!(w, "|---|---:|---:|---|---|");
        for (h, f) in steered {
            let per = |s: &Summary| fper(per_io(s.fio_vcpu_counters.as_ref(), "exits", s.ios_with_stats));
            let wakes = |s: &Summary| fcount(s.fio_vcpu_counters.as_ref(), "wakes_doorbell");
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} vs {} | {} / {} |",
                h.case.label(),
                fr(ratio(h.fio.iops, f.fio.iops)),
                fr(ratio(h.fio.clat_p99_us, f.fio.clat_p99_us)),
                per(h),
                per(f),
                wakes(h),
                wakes(f)
            );
        }
        let _ = writeln!(w);
    }
    let targets = delivery_targets(all);
    if targets.is_empty() {
        return;
    }
    let _ =
        writeln!(w, "### Issue 10 targets: 1p2v wake-preempt ≥ 0.9× the 1p1v baseline and ≥ 10× xen-compat (IOPS)\n");
    let _ = writeln!(
        w,
        "For the QEMU disks (everything but `ram`) the 1p1v baseline is not meaningful under `-icount`: their \
         200 µs service time is host time, and an idle machine's virtual clock runs ahead while it waits (README, \
         benchmark section), so 1p1v sees ~1.1 ms per read against ~0.2 ms at 1p2v. The ratio is shown but not judged; \
         what is compared instead is wake-preempt against xen-compat at the same topology (the 10× line), and the \
         1p2v wake-preempt clat p50 against the disk's 200 µs service time (last column: 1.00× means the I/O \
         completes at device speed).\n"
    );
    let _ = writeln!(
        w,
        "| disk, delivery | 1p2v wake-preempt IOPS vs 1p1v (≥ 0.9×) | vs 1p2v xen-compat (≥ 10×) | \
         1p2v wake-preempt clat p50 / service time |"
    );
    let _ = writeln!(w, "|---|---|---|---|");
    for (line, _, _) in targets {
        let _ = writeln!(w, "{line}");
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
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let summaries: Vec<Summary> = results.iter().filter_map(summarize).collect();
    let files = ReportFiles {
        report_md: dir.join("report.md"),
        results_json: dir.join("results.json"),
        latency_svg: dir.join("latency.svg"),
    };
    let write = |p: &Path, s: String| std::fs::write(p, s).with_context(|| p.display().to_string());
    write(&files.report_md, render_report(results))?;
    write(&files.results_json, results_json(&summaries))?;
    write(&files.latency_svg, svg::latency_plot(&summaries))?;
    Ok(files)
}
