//! `hvctl top`: per-domain CPU use from two `LIST` samples (the `run_ns`
//! delta over the wall-clock delta, like xentop: above 100% with several
//! vCPUs) and exits per second from the stats' `domN.exits=` lines.
//! Pure: the caller samples and sleeps.

use crate::format::Domain;
use std::fmt::Write as _;

/// One sample: the domains and, when the stats were read, each domain's
/// exit count.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub doms: Vec<Domain>,
    /// `(domid, exits)` from `domN.exits=` lines.
    pub exits: Option<Vec<(u32, u64)>>,
}

/// The stats' `domN.exits=V` lines.
pub fn exits(stats: &str) -> Vec<(u32, u64)> {
    stats
        .lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once('=')?;
            let id = k.strip_prefix("dom")?.strip_suffix(".exits")?;
            Some((id.parse().ok()?, v.parse().ok()?))
        })
        .collect()
}

/// A domain's row.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub name: String,
    pub domid: u32,
    pub cpu_pct: f64,
    pub exits_per_s: Option<f64>,
}

/// CPU% of `ns` run time over `wall_ns` of wall-clock time.
pub fn cpu_pct(ns: u64, wall_ns: u64) -> f64 {
    if wall_ns == 0 {
        return 0.0;
    }
    ns as f64 * 100.0 / wall_ns as f64
}

/// The rows of the domains present in both samples, `wall_ns` apart.
pub fn rows(before: &Sample, after: &Sample, wall_ns: u64) -> Vec<Row> {
    let secs = wall_ns as f64 / 1e9;
    after
        .doms
        .iter()
        .filter_map(|d| {
            let b = before.doms.iter().find(|b| b.domid == d.domid)?;
            let count = |s: &Sample| s.exits.as_ref()?.iter().find(|(id, _)| *id == d.domid).map(|(_, n)| *n);
            let exits_per_s = match (count(before), count(after)) {
                (Some(x0), Some(x1)) if secs > 0.0 => Some(x1.saturating_sub(x0) as f64 / secs),
                _ => None,
            };
            Some(Row {
                name: d.name.clone(),
                domid: d.domid,
                cpu_pct: cpu_pct(d.run_ns.saturating_sub(b.run_ns), wall_ns),
                exits_per_s,
            })
        })
        .collect()
}

/// One frame: `hvctl top - <n> domains`, then the table.
pub fn frame(rows: &[Row]) -> String {
    let mut s = format!("hvctl top - {} domains\n", rows.len());
    let _ = writeln!(s, "{:<20} {:>5} {:>8} {:>10}", "NAME", "ID", "CPU(%)", "EXITS/s");
    for r in rows {
        let exits = r.exits_per_s.map_or_else(|| "-".to_string(), |e| format!("{e:.0}"));
        let _ = writeln!(s, "{:<20} {:>5} {:>8.1} {:>10}", r.name, r.domid, r.cpu_pct, exits);
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
        let before = Sample { doms: vec![dom(0, "Dom0", 1_000), dom(1, "busy", 0)], exits: None };
        let after = Sample {
            doms: vec![dom(0, "Dom0", 500_001_000), dom(1, "busy", 3_000_000_000), dom(2, "new", 9)],
            exits: None,
        };
        let r = rows(&before, &after, 2_000_000_000);
        assert_eq!(r.len(), 2, "a domain in one sample only has no row");
        assert_eq!(r[0].cpu_pct, 25.0);
        assert_eq!(r[1].cpu_pct, 150.0, "several vCPUs pass 100%");
        assert_eq!(r[0].exits_per_s, None);
        assert_eq!(cpu_pct(5, 0), 0.0);
    }

    #[test]
    fn exits_per_second_from_the_stats() {
        let s0 = "(HV) stats begin 1\ndom0.exits=100\ndom1.exits=7\nexits=3\ndomx.exits=1\n";
        let s1 = "dom0.exits=1100\ndom1.exits=7\n";
        assert_eq!(exits(s0), vec![(0, 100), (1, 7)]);
        let before = Sample { doms: vec![dom(0, "Dom0", 0), dom(1, "g", 0)], exits: Some(exits(s0)) };
        let after = Sample { doms: vec![dom(0, "Dom0", 0), dom(1, "g", 0)], exits: Some(exits(s1)) };
        let r = rows(&before, &after, 500_000_000);
        assert_eq!(r[0].exits_per_s, Some(2000.0));
        assert_eq!(r[1].exits_per_s, Some(0.0));
        let f = frame(&r);
        assert!(f.starts_with("hvctl top - 2 domains\nNAME "), "{f}");
        assert!(f.lines().nth(2).unwrap().ends_with("0.0       2000"), "{f}");
    }
}
