//! `hvctl top`: per-domain figures over an interval, from two samples of
//! `LIST` and the stats: CPU use (the `run_ns` delta over the wall-clock
//! delta, like xentop: above 100% with several vCPUs), exits, interrupts
//! injected (SGIs, PPIs, SPIs and LPIs) and disk requests per second, and
//! the kick-to-run latency's p50 and p99 over the interval (from the
//! deltas of the vCPUs' log2 histograms: the bucket's upper bound).
//! Pure: the caller samples and sleeps.

use crate::format::Domain;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One sample: the domains and, when the stats were read, each domain's
/// counters.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub doms: Vec<Domain>,
    pub counters: Option<BTreeMap<u32, Counters>>,
}

/// A domain's counters in the stats (its vCPUs' summed).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    /// `domN.exits`.
    pub exits: u64,
    /// `domN.disk_requests`.
    pub disk: u64,
    /// Its vCPUs' `irqs_injected` and `lpis_injected`.
    pub irqs: u64,
    /// Its vCPUs' `kick_to_run_ns` buckets: lower bound -> (upper, count).
    pub kick_to_run: BTreeMap<u64, (u64, u64)>,
}

/// The per-domain counters of a stats text: `domN.exits=`,
/// `domN.disk_requests=`, and each vCPU's (`vcpuK.` lines are Dom0's,
/// `dN.vcpuK.` DomU N's) interrupts and kick-to-run histogram.
pub fn counters(stats: &str) -> BTreeMap<u32, Counters> {
    let mut m: BTreeMap<u32, Counters> = BTreeMap::new();
    for l in stats.lines() {
        let Some((k, v)) = l.trim().split_once('=') else { continue };
        let Ok(v) = v.parse::<u64>() else { continue };
        if let Some((id, field)) = k.strip_prefix("dom").and_then(|r| r.split_once('.')) {
            let Ok(id) = id.parse() else { continue };
            match field {
                "exits" => m.entry(id).or_default().exits = v,
                "disk_requests" => m.entry(id).or_default().disk = v,
                _ => {}
            }
            continue;
        }
        let (id, rest) = match k.strip_prefix('d').and_then(|r| r.split_once('.')) {
            Some((id, rest)) => match id.parse() {
                Ok(id) => (id, rest),
                Err(_) => continue,
            },
            None => (0, k),
        };
        let Some((vcpu, field)) = rest.split_once('.') else { continue };
        if !vcpu.strip_prefix("vcpu").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        let c = m.entry(id).or_default();
        match field {
            "irqs_injected" | "lpis_injected" => c.irqs += v,
            f => {
                let Some((lo, hi)) = f
                    .strip_prefix("kick_to_run_ns.bucket[")
                    .and_then(|b| b.strip_suffix(')'))
                    .and_then(|b| b.split_once(','))
                    .and_then(|(lo, hi)| Some((lo.parse::<u64>().ok()?, hi.parse::<u64>().ok()?)))
                else {
                    continue;
                };
                c.kick_to_run.entry(lo).or_insert((hi, 0)).1 += v;
            }
        }
    }
    m
}

/// A domain's row.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub name: String,
    pub domid: u32,
    pub cpu_pct: f64,
    pub exits_per_s: Option<f64>,
    pub irqs_per_s: Option<f64>,
    pub iops: Option<f64>,
    /// Upper bounds (ns) of the buckets holding the interval's p50 and
    /// p99 kick-to-run latency; `None` without kicks in the interval.
    pub kick_p50_ns: Option<u64>,
    pub kick_p99_ns: Option<u64>,
}

/// CPU% of `ns` run time over `wall_ns` of wall-clock time.
pub fn cpu_pct(ns: u64, wall_ns: u64) -> f64 {
    if wall_ns == 0 {
        return 0.0;
    }
    ns as f64 * 100.0 / wall_ns as f64
}

/// The upper bound of the bucket where quantile `q` of the counts lies.
fn quantile(buckets: &[(u64, u64)], q: f64) -> Option<u64> {
    let total: u64 = buckets.iter().map(|b| b.1).sum();
    if total == 0 {
        return None;
    }
    let want = ((total as f64 * q).ceil() as u64).max(1);
    let mut seen = 0;
    buckets
        .iter()
        .find(|b| {
            seen += b.1;
            seen >= want
        })
        .map(|b| b.0)
}

/// The interval's kick-to-run buckets (upper bound, count), by bound.
fn histogram_delta(b: &Counters, a: &Counters) -> Vec<(u64, u64)> {
    a.kick_to_run
        .iter()
        .map(|(lo, &(hi, n))| (hi, n.saturating_sub(b.kick_to_run.get(lo).map_or(0, |x| x.1))))
        .collect()
}

/// The rows of the domains present in both samples, `wall_ns` apart.
pub fn rows(before: &Sample, after: &Sample, wall_ns: u64) -> Vec<Row> {
    let secs = wall_ns as f64 / 1e9;
    after
        .doms
        .iter()
        .filter_map(|d| {
            let b = before.doms.iter().find(|b| b.domid == d.domid)?;
            let c = |s: &Sample| s.counters.as_ref()?.get(&d.domid).cloned();
            let (c0, c1) = match (c(before), c(after)) {
                (Some(x), Some(y)) if secs > 0.0 => (Some(x), Some(y)),
                _ => (None, None),
            };
            let rate = |f: fn(&Counters) -> u64| Some(f(c1.as_ref()?).saturating_sub(f(c0.as_ref()?)) as f64 / secs);
            let hist = c0.as_ref().zip(c1.as_ref()).map(|(x, y)| histogram_delta(x, y)).unwrap_or_default();
            Some(Row {
                name: d.name.clone(),
                domid: d.domid,
                cpu_pct: cpu_pct(d.run_ns.saturating_sub(b.run_ns), wall_ns),
                exits_per_s: rate(|c| c.exits),
                irqs_per_s: rate(|c| c.irqs),
                iops: rate(|c| c.disk),
                kick_p50_ns: quantile(&hist, 0.5),
                kick_p99_ns: quantile(&hist, 0.99),
            })
        })
        .collect()
}

/// One frame: `hvctl top - <n> domains`, then the table. Latencies are
/// the bucket's upper bound in µs (`<N`), `-` without kicks.
pub fn frame(rows: &[Row]) -> String {
    let mut s = format!("hvctl top - {} domains\n", rows.len());
    let _ = writeln!(
        s,
        "{:<20} {:>5} {:>8} {:>10} {:>9} {:>8} {:>12} {:>12}",
        "NAME", "ID", "CPU(%)", "EXITS/s", "IRQS/s", "IOPS", "KICK-P50(us)", "KICK-P99(us)"
    );
    let rate = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |e| format!("{e:.0}"));
    let lat = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |ns| format!("<{}", ns.div_ceil(1000)));
    for r in rows {
        let _ = writeln!(
            s,
            "{:<20} {:>5} {:>8.1} {:>10} {:>9} {:>8} {:>12} {:>12}",
            r.name,
            r.domid,
            r.cpu_pct,
            rate(r.exits_per_s),
            rate(r.irqs_per_s),
            rate(r.iops),
            lat(r.kick_p50_ns),
            lat(r.kick_p99_ns)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dom(domid: u32, name: &str, run_ns: u64) -> Domain {
        Domain { domid, name: name.into(), run_ns, ..Domain::default() }
    }

    #[test]
    fn cpu_use_is_run_time_over_wall_time() {
        let before = Sample { doms: vec![dom(0, "Dom0", 1_000), dom(1, "busy", 0)], counters: None };
        let after = Sample {
            doms: vec![dom(0, "Dom0", 500_001_000), dom(1, "busy", 3_000_000_000), dom(2, "new", 9)],
            counters: None,
        };
        let r = rows(&before, &after, 2_000_000_000);
        assert_eq!(r.len(), 2, "a domain in one sample only has no row");
        assert_eq!(r[0].cpu_pct, 25.0);
        assert_eq!(r[1].cpu_pct, 150.0, "several vCPUs pass 100%");
        assert_eq!((r[0].exits_per_s, r[0].iops, r[0].kick_p99_ns), (None, None, None));
        assert_eq!(cpu_pct(5, 0), 0.0);
    }

    const S0: &str = "(HV) stats begin dom0\ndom0.exits=100\ndom0.disk_requests=10\ndom1.exits=7\nexits=3\n\
                      domx.exits=1\nvcpu0.irqs_injected=5\nvcpu1.lpis_injected=5\n\
                      vcpu0.kick_to_run_ns.bucket[8192,16384)=10\nd1.vcpu0.irqs_injected=1\n\
                      d1.blk0.reads=99\nd1.vcpu0.kick_to_run_ns.count=0\n";
    const S1: &str = "dom0.exits=1100\ndom0.disk_requests=510\ndom1.exits=7\nvcpu0.irqs_injected=205\n\
                      vcpu1.lpis_injected=105\nvcpu0.kick_to_run_ns.bucket[8192,16384)=60\n\
                      vcpu1.kick_to_run_ns.bucket[262144,524288)=2\n\
                      vcpu1.kick_to_run_ns.bucket[16384,32768)=48\nd1.vcpu0.irqs_injected=1\n";

    #[test]
    fn counters_per_domain_from_the_stats() {
        let c = counters(S0);
        assert_eq!(c.keys().copied().collect::<Vec<_>>(), [0, 1]);
        assert_eq!((c[&0].exits, c[&0].disk, c[&0].irqs), (100, 10, 10));
        assert_eq!(c[&0].kick_to_run[&8192], (16384, 10));
        assert_eq!((c[&1].exits, c[&1].irqs, c[&1].kick_to_run.len()), (7, 1, 0), "blk0 and count are not vCPU fields");
    }

    #[test]
    fn rates_and_kick_latency_over_the_interval() {
        let doms = || vec![dom(0, "Dom0", 0), dom(1, "g", 0)];
        let before = Sample { doms: doms(), counters: Some(counters(S0)) };
        let after = Sample { doms: doms(), counters: Some(counters(S1)) };
        let r = rows(&before, &after, 500_000_000);
        assert_eq!(r[0].exits_per_s, Some(2000.0));
        assert_eq!(r[0].iops, Some(1000.0));
        assert_eq!(r[0].irqs_per_s, Some(600.0));
        // The interval's 100 kicks: 50 under 16.4 µs, 48 under 32.8, 2 under 524.
        assert_eq!(r[0].kick_p50_ns, Some(16384));
        assert_eq!(r[0].kick_p99_ns, Some(524_288));
        assert_eq!((r[1].exits_per_s, r[1].kick_p50_ns), (Some(0.0), None));
        let f = frame(&r);
        assert!(f.starts_with("hvctl top - 2 domains\nNAME "), "{f}");
        let row: Vec<&str> = f.lines().nth(2).unwrap().split_whitespace().collect();
        assert_eq!(row, ["Dom0", "0", "0.0", "2000", "600", "1000", "<17", "<525"], "{f}");
        assert!(f.lines().nth(3).unwrap().ends_with(" -            -"), "{f}");
    }
}
