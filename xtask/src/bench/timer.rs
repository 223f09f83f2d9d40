//! `cargo xtask bench timer`: timer wake-up latency inside the guest.
//!
//! cyclictest (Debian rt-tests) on vCPU1 at 50 µs and 1 ms intervals while
//! a CPU hog runs on vCPU0, both vCPUs on one pCPU, under each scheduler and
//! with `timer_slop_ns` 0 (exact EL2 timer for blocked vCPUs) and 50000
//! (deadlines rounded up to 50 µs, as a slack-based timer would). Reported:
//! min/avg, p99/p99.9/p99.99 (from cyclictest's per-µs histogram up to
//! 10 ms, [`percentile`]), max and the samples over 100 µs. Each case's
//! console is kept; when the hypervisor dumped its flight recorder
//! (`--hv-args sched_trace_threshold_us=N`) the dumps are rendered as
//! timelines (`xtask::trace`) and the report links the worst one.

use crate::run::qemu::RunOptions;
use crate::Result;
use anyhow::{anyhow, bail, Context};
use std::fmt::Write as _;
use std::time::Duration;

pub const BEGIN: &str = "@@CT-BEGIN@@";
pub const END: &str = "@@CT-END@@";
/// Samples per case by default: p99.99 is then the 10th worst sample.
pub const DEFAULT_SAMPLES: u64 = 100_000;
/// cyclictest's histogram range (µs); later samples count as overflows.
pub const HISTOGRAM_US: u64 = 10_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerCase {
    pub interval_us: u32,
    pub slop_ns: u64,
    pub wake_preempt: bool,
}

impl TimerCase {
    pub fn label(&self) -> String {
        format!(
            "1p2v {} -i{} timer_slop_ns={}",
            if self.wake_preempt { "wake-preempt" } else { "xen-compat rl=1000" },
            self.interval_us,
            self.slop_ns
        )
    }
}

/// The cases: slop 0 vs 50000 at -i50 and -i1000 with preempt-on-wake, and
/// the Xen-compatible path with slop 0 for contrast.
pub fn cases() -> Vec<TimerCase> {
    let mut v = Vec::new();
    for interval_us in [50, 1000] {
        for slop_ns in [0, 50_000] {
            v.push(TimerCase { interval_us, slop_ns, wake_preempt: true });
        }
        v.push(TimerCase { interval_us, slop_ns: 0, wake_preempt: false });
    }
    v
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct CyclicResult {
    pub samples: u64,
    pub min_us: u64,
    pub avg_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub p9999_us: u64,
    pub max_us: u64,
    pub over_100us: u64,
}

/// The guest's awk over cyclictest's output, read twice (`f f`): the
/// nearest-rank p99, p99.9 and p99.99 of the per-µs histogram (samples past
/// it count as the max, as in [`percentile`]) and the samples over 100 µs.
/// Computed in the guest so that only two short lines cross the console.
/// `n()` strips leading zeros: busybox awk reads cyclictest's `000050` as
/// octal (40), which garbled the earlier `$1+0 > 100` count. The test
/// `percentile_awk_matches_percentile` runs it with the host's awk.
pub const PERCENTILE_AWK: &str = "function n(s){sub(/^0+/,\"\",s);return s+0}\
NR==FNR{if($1!~/^#/)t+=n($2);else if($3==\"Overflows:\")t+=n($4);else if($2==\"Max\")m=n($4);next}\
$1!~/^#/{k=n($2);c+=k;u=n($1);if(u>100)o+=k;if(a==\"\"&&c>=t*.99)a=u;if(b==\"\"&&c>=t*.999)b=u;if(d==\"\"&&c>=t*.9999)d=u}\
END{print \"# Percentiles: \"(a==\"\"?m:a)\" \"(b==\"\"?m:b)\" \"(d==\"\"?m:d);print \"# Over100: \"o+0}";

/// The guest's script: a hog on vCPU0, cyclictest on vCPU1 for `samples`
/// loops (and at most `seconds`), then its summary and [`PERCENTILE_AWK`]'s
/// two lines between the markers.
/// With `breaktrace` (µs), cyclictest stops at the first sample above it
/// (`-b`) and the guest at once writes Ctrl-\\ to its console, which makes
/// the hypervisor dump its flight recorder: the events around that sample.
pub fn guest_command(c: &TimerCase, samples: u64, seconds: Option<u32>, breaktrace: Option<u32>) -> String {
    let duration = seconds.map(|s| format!(" -D{s}")).unwrap_or_default();
    let (brk, dump) = match breaktrace {
        Some(us) => (format!(" -b{us}"), "; printf '\\034'"),
        None => (String::new(), ""),
    };
    format!(
        "taskset -c 0 sh -c 'while :; do :; done' & H=$!\n\
         cyclictest -t1 -a1 -p99 -i{} -l{samples}{duration}{brk} -m -q -h{HISTOGRAM_US} > /tmp/ct.txt; R=$?{dump}\n\
         kill $H\n\
         echo {BEGIN}; grep '^# [TMAH]' /tmp/ct.txt | head -6; \
         awk '{PERCENTILE_AWK}' /tmp/ct.txt /tmp/ct.txt; echo {END}\n\
         exit $R\n",
        c.interval_us
    )
}

/// The `num/den` percentile (e.g. 9999/10000) of a latency histogram:
/// `hist` holds (µs, samples) per bucket, `overflows` samples lie beyond it
/// and count as `max_us` (cyclictest keeps only their maximum). The value
/// is the bucket of the sample at rank ⌈n·num/den⌉ (nearest rank).
pub fn percentile(hist: &[(u64, u64)], overflows: u64, max_us: u64, num: u64, den: u64) -> Option<u64> {
    let mut h: Vec<(u64, u64)> = hist.iter().copied().filter(|b| b.1 > 0).collect();
    h.sort_unstable();
    let total: u64 = h.iter().map(|b| b.1).sum::<u64>() + overflows;
    if total == 0 || den == 0 {
        return None;
    }
    let rank = (total as u128 * num.min(den) as u128).div_ceil(den as u128).max(1) as u64;
    let mut seen = 0;
    for (us, n) in h {
        seen += n;
        if seen >= rank {
            return Some(us);
        }
    }
    Some(max_us)
}

pub fn hypervisor_args(c: &TimerCase) -> String {
    format!(
        "sched=credit2 sched_wake_preempt={} sched_ratelimit_us=1000 timer_slop_ns={}",
        if c.wake_preempt { "on" } else { "off" },
        c.slop_ns
    )
}

/// Parses the block between the markers (kernel lines may interleave). The
/// percentiles come from the guest's `# Percentiles:` line, or else from
/// `H <µs> <count>` histogram lines.
pub fn parse(console: &str) -> Result<CyclicResult> {
    let start = console.rfind(BEGIN).context("no cyclictest output")?;
    let block = &console[start..];
    let block = &block[..block.find(END).context("cyclictest output not terminated")?];
    let field = |name: &str| -> Option<u64> {
        block.lines().find_map(|l| l.trim().strip_prefix(name).and_then(|v| v.trim().parse().ok()))
    };
    let overflows = field("# Histogram Overflows:").unwrap_or(0);
    let mut hist = Vec::new();
    for l in block.lines().filter_map(|l| l.trim().strip_prefix("H ")) {
        let mut w = l.split_ascii_whitespace().map(|x| x.parse::<u64>());
        match (w.next(), w.next()) {
            (Some(Ok(us)), Some(Ok(n))) => hist.push((us, n)),
            _ => bail!("bad histogram line {l:?}"),
        }
    }
    let max_us = field("# Max Latencies:").context("no max")?;
    let p = |num, den| percentile(&hist, overflows, max_us, num, den).unwrap_or(0);
    let guest: Option<Vec<u64>> = block
        .lines()
        .find_map(|l| l.trim().strip_prefix("# Percentiles:"))
        .map(|v| v.split_ascii_whitespace().filter_map(|x| x.parse().ok()).collect());
    let (p99_us, p999_us, p9999_us) = match guest.as_deref() {
        Some(&[a, b, c]) => (a, b, c),
        Some(_) => bail!("bad percentiles line"),
        None if hist.is_empty() => bail!("no percentiles"),
        None => (p(99, 100), p(999, 1000), p(9999, 10000)),
    };
    let over_100us = match field("# Over100:") {
        Some(n) => n + overflows,
        None => hist.iter().filter(|b| b.0 > 100).map(|b| b.1).sum::<u64>() + overflows,
    };
    Ok(CyclicResult {
        // cyclictest's histogram total leaves out the samples beyond it.
        samples: field("# Total:").context("no total")? + overflows,
        min_us: field("# Min Latencies:").context("no min")?,
        avg_us: field("# Avg Latencies:").context("no avg")?,
        p99_us,
        p999_us,
        p9999_us,
        max_us,
        over_100us,
    })
}

/// One case's outcome: the result, and the file holding its flight-recorder
/// dumps (worst first) if the hypervisor made any.
pub type CaseOutcome = (TimerCase, Result<CyclicResult>, Option<String>);

pub fn render(results: &[CaseOutcome]) -> String {
    let mut s = String::from(
        "# Timer wake-up latency (cyclictest in the guest)\n\n\
         cyclictest on vCPU1 (SCHED_FIFO 99), CPU hog on vCPU0, 1 pCPU, QEMU -icount; latencies in µs.\n\n\
         | case | samples | min | avg | p99 | p99.9 | p99.99 | max | samples > 100 µs | trace |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for (c, r, trace) in results {
        let trace = trace.as_ref().map(|f| format!("[worst dump]({f})")).unwrap_or_default();
        match r {
            Ok(r) => {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {trace} |",
                    c.label(),
                    r.samples,
                    r.min_us,
                    r.avg_us,
                    r.p99_us,
                    r.p999_us,
                    r.p9999_us,
                    r.max_us,
                    r.over_100us
                );
            }
            Err(e) => {
                let _ = writeln!(s, "| {} | failed: {e:#} | | | | | | | | {trace} |", c.label());
            }
        }
    }
    s
}

/// The case's flight-recorder dumps as timelines, the worst outlier first.
pub fn render_dumps(console: &str) -> Result<Option<String>> {
    let mut dumps = crate::trace::parse_dumps(console)?;
    if dumps.is_empty() {
        return Ok(None);
    }
    dumps.sort_by_key(|d| std::cmp::Reverse(d.latency_ns()));
    Ok(Some(dumps.iter().map(|d| d.timeline()).collect::<Vec<_>>().join("\n")))
}

pub(crate) fn slug(label: &str) -> String {
    label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect()
}

pub fn results_json(results: &[CaseOutcome]) -> String {
    let cases: Vec<serde_json::Value> = results
        .iter()
        .filter_map(|(c, r, _)| r.as_ref().ok().map(|r| (c, r)))
        .map(|(c, r)| {
            serde_json::json!({
                "sched": if c.wake_preempt { "wake-preempt" } else { "xen-compat" },
                "interval_us": c.interval_us, "timer_slop_ns": c.slop_ns,
                "samples": r.samples, "min_us": r.min_us, "avg_us": r.avg_us, "p99_us": r.p99_us, "p999_us": r.p999_us,
                "p9999_us": r.p9999_us, "max_us": r.max_us, "over_100us": r.over_100us
            })
        })
        .collect();
    serde_json::json!({ "cases": cases }).to_string()
}

/// What one `cargo xtask bench timer` runs, as plain values: the command
/// line's `bench timer` options (`BenchTimerArgs::options` in [`crate::cli`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TimerOptions {
    /// `--samples`: cyclictest loops per case.
    pub samples: u64,
    /// `--runtime`: also stop each case's cyclictest after this many seconds.
    pub runtime: Option<u32>,
    /// `--only`: only the cases whose label contains it.
    pub only: Option<String>,
    /// `--hv-args`: extra hypervisor boot arguments for every case.
    pub hv_args: Option<String>,
    /// `--breaktrace`: stop at the first sample above this many µs and dump
    /// the flight recorder.
    pub breaktrace: Option<u32>,
}

pub fn run(args: &TimerOptions) -> Result<()> {
    let cases: Vec<TimerCase> =
        cases().into_iter().filter(|c| args.only.as_ref().is_none_or(|o| c.label().contains(o.as_str()))).collect();
    let dir = crate::root().join("target").join("bench").join("timer");
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let mut progress = super::Progress::new(cases.len());
    let mut results = Vec::new();
    for c in cases {
        progress.next(&c.label());
        let mut hv_args = hypervisor_args(&c);
        if args.breaktrace.is_some() {
            // The guest's Ctrl-\ after cyclictest's break dumps the recorder.
            hv_args.push_str(" sched_trace_dom0_key=on");
        }
        if let Some(extra) = &args.hv_args {
            hv_args = format!("{hv_args} {extra}");
        }
        // Guest time of the loops, and as much again for the slow host.
        let guest_s = args.samples.saturating_mul(c.interval_us as u64) / 1_000_000;
        let guest_s = args.runtime.map_or(guest_s, |r| guest_s.min(r as u64));
        let o = RunOptions {
            pcpus: 1,
            vcpus: 2,
            icount: true,
            hv_args,
            cmd: Some(guest_command(&c, args.samples, args.runtime, args.breaktrace)),
            timeout: Duration::from_secs(600 + 3 * guest_s),
            echo: false,
            ..Default::default()
        };
        let run = crate::run::qemu::run(&o);
        let mut trace = None;
        if let Ok(run) = &run {
            let name = slug(&c.label());
            std::fs::write(dir.join(format!("{name}.console.txt")), &run.console)
                .with_context(|| dir.join(format!("{name}.console.txt")).display().to_string())?;
            match render_dumps(&run.console) {
                Ok(Some(t)) => {
                    let f = format!("{name}.trace.txt");
                    std::fs::write(dir.join(&f), t).with_context(|| dir.join(&f).display().to_string())?;
                    trace = Some(f);
                }
                Ok(None) => {}
                Err(e) => eprintln!("  flight-recorder dumps: {e:#}"),
            }
        }
        let r = run.and_then(|run| {
            if run.timed_out {
                bail!("QEMU timed out; last console line: {}", super::last_console_line(&run.console));
            }
            parse(&run.console)
                .map_err(|e| anyhow!("{e:#}; last console line: {}", super::last_console_line(&run.console)))
        });
        match &r {
            Ok(r) => eprintln!(
                "  min {} avg {} p99 {} p99.9 {} p99.99 {} max {} us, {} samples over 100 us",
                r.min_us, r.avg_us, r.p99_us, r.p999_us, r.p9999_us, r.max_us, r.over_100us
            ),
            Err(e) => eprintln!("  failed: {e:#}"),
        }
        results.push((c, r, trace));
    }
    let report = render(&results);
    std::fs::write(dir.join("report.md"), &report).with_context(|| dir.join("report.md").display().to_string())?;
    std::fs::write(dir.join("results.json"), results_json(&results))
        .with_context(|| dir.join("results.json").display().to_string())?;
    println!("{report}");
    eprintln!("wrote {}", dir.join("report.md").display());
    super::check_failures(
        results.iter().filter_map(|(c, r, _)| r.as_ref().err().map(|e| (c.label(), format!("{e:#}")))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONSOLE: &str = "[    4.1] random kernel line\n@@CT-BEGIN@@\n# Total: 000003000\n# Min Latencies: 00004\n\
        # Avg Latencies: 00013\n[    4.2] interleaved\n# Max Latencies: 12500\n# Histogram Overflows: 00002\n\
        H 4 10\nH 13 2960\nH 90 20\nH 101 3\nH 150 4\nH 9000 3\n@@CT-END@@\n";

    #[test]
    fn parses_cyclictest_summary_and_histogram() {
        let r = parse(CONSOLE).unwrap();
        let want = CyclicResult {
            samples: 3002,
            min_us: 4,
            avg_us: 13,
            // 3002 samples: rank 2972 (p99) is in the 90 µs bucket (10 + 2960
            // before it), 2999 (p99.9) in 9000 µs (2997 before it), 3002
            // (p99.99) an overflow: the max.
            p99_us: 90,
            p999_us: 9000,
            p9999_us: 12500,
            max_us: 12500,
            over_100us: 12,
        };
        assert_eq!(r, want);
        assert!(parse("nothing").is_err());
        assert!(parse("@@CT-BEGIN@@\n# Total: 1\n").is_err());
        assert!(parse("@@CT-BEGIN@@\nH 1 x\n@@CT-END@@").is_err());
    }

    /// The guest's awk computes what `percentile` computes (host awk; the
    /// guest's is busybox's, same language).
    #[test]
    fn percentile_awk_matches_percentile() {
        let hist = [(4u64, 10u64), (13, 2960), (90, 20), (101, 3), (150, 4), (9000, 3)];
        let mut f = String::from("# /dev/cpu_dma_latency set to 0us\n");
        for us in 0..HISTOGRAM_US {
            let n = hist.iter().find(|b| b.0 == us).map_or(0, |b| b.1);
            f.push_str(&format!("{us:06} {n:06}\n"));
        }
        f.push_str("# Total: 000003000\n# Min Latencies: 00004\n# Avg Latencies: 00013\n");
        f.push_str("# Max Latencies: 12500\n# Histogram Overflows: 00002\n# Histogram Overflow at cycle number:\n");
        let path = std::env::temp_dir().join(format!("xtask-ct-{}.txt", std::process::id()));
        std::fs::write(&path, f).unwrap();
        let out = std::process::Command::new("awk").arg(PERCENTILE_AWK).arg(&path).arg(&path).output().unwrap();
        let _ = std::fs::remove_file(&path);
        let text = String::from_utf8(out.stdout).unwrap();
        let want: Vec<u64> = [(99, 100), (999, 1000), (9999, 10000)]
            .iter()
            .map(|&(n, d)| percentile(&hist, 2, 12500, n, d).unwrap())
            .collect();
        assert_eq!(want, vec![90, 9000, 12500]);
        assert_eq!(text, "# Percentiles: 90 9000 12500\n# Over100: 10\n");
        let console = format!("@@CT-BEGIN@@\n# Total: 000003000\n# Min Latencies: 00004\n# Avg Latencies: 00013\n# Max Latencies: 12500\n# Histogram Overflows: 00002\n{text}@@CT-END@@\n");
        let r = parse(&console).unwrap();
        assert_eq!((r.p99_us, r.p999_us, r.p9999_us, r.over_100us), (90, 9000, 12500, 12));
        assert!(parse(
            "@@CT-BEGIN@@\n# Total: 1\n# Min Latencies: 1\n# Avg Latencies: 1\n# Max Latencies: 1\n@@CT-END@@"
        )
        .is_err());
        assert!(guest_command(&cases()[0], 1_000_000, None, Some(150)).len() < 700, "guestcmd stays short");
    }

    #[test]
    fn percentile_is_the_nearest_rank() {
        // 10 000 samples: 9 990 at 10 µs, 9 at 60 µs, 1 at 2000 µs.
        let h = [(60, 9), (10, 9990), (2000, 1), (500, 0)];
        assert_eq!(percentile(&h, 0, 2000, 99, 100), Some(10));
        assert_eq!(percentile(&h, 0, 2000, 999, 1000), Some(10));
        assert_eq!(percentile(&h, 0, 2000, 9999, 10000), Some(60));
        assert_eq!(percentile(&h, 0, 2000, 1, 1), Some(2000));
        assert_eq!(percentile(&h, 5, 30000, 999, 1000), Some(60), "rank 9 996 of 10 005");
        assert_eq!(percentile(&h, 5, 30000, 9999, 10000), Some(30000), "rank 10 004: an overflow");
        assert_eq!(percentile(&h, 5, 30000, 1, 1), Some(30000), "overflows count as the max");
        assert_eq!(percentile(&[], 0, 0, 99, 100), None);
        assert_eq!(percentile(&[(7, 1)], 0, 7, 0, 100), Some(7), "rank at least 1");
    }

    #[test]
    fn cases_and_report() {
        let c = cases();
        assert_eq!(c.len(), 6);
        assert!(c.iter().any(|c| c.slop_ns == 50_000 && c.interval_us == 50));
        assert!(hypervisor_args(&c[1]).contains("timer_slop_ns=50000"));
        let results = vec![(c[0], parse(CONSOLE), Some("x.trace.txt".into())), (c[1], Err(anyhow!("boom")), None)];
        let md = render(&results);
        assert!(
            md.contains("| 1p2v wake-preempt -i50 timer_slop_ns=0 | 3002 | 4 | 13 | 90 | 9000 | 12500 | 12500 | 12 | [worst dump](x.trace.txt) |"),
            "{md}"
        );
        assert!(md.contains("failed: boom"));
        let j: serde_json::Value = serde_json::from_str(&results_json(&results)).unwrap();
        assert_eq!(j["cases"].as_array().unwrap().len(), 1);
        assert_eq!(j["cases"][0]["p9999_us"], 12500);
        assert!(
            guest_command(&c[0], 1000, Some(5), None).contains("cyclictest -t1 -a1 -p99 -i50 -l1000 -D5 -m -q -h10000")
        );
        assert!(guest_command(&c[0], 1000, None, None).contains("-i50 -l1000 -m"));
        let b = guest_command(&c[0], 1000, None, Some(120));
        assert!(b.contains("-i50 -l1000 -b120 -m") && b.contains("R=$?; printf '\\034'"), "{b}");
        assert!(!guest_command(&c[0], 1000, None, None).contains("034"));
        assert_eq!(slug("1p2v wake-preempt -i50 timer_slop_ns=0"), "1p2v-wake-preempt--i50-timer-slop-ns-0");
    }

    #[test]
    fn dumps_rendered_worst_first() {
        let dump = |v: u32, l: u64| {
            format!(
                "(HV) trace begin reason=outlier vcpu{v} latency_ns={l}\n\
                 trace pcpu0 t=10 wake vcpu{v} cause=timer action=none\n\
                 trace pcpu0 t={} sched_in vcpu{v} credit=1 wake_ns={l}\n(HV) trace end\n",
                10 + l
            )
        };
        let console = format!("boot\n{}{}", dump(1, 200_000), dump(1, 3_000_000));
        let t = render_dumps(&console).unwrap().unwrap();
        assert!(t.starts_with("outlier: vcpu1 waited 3000 µs"), "{t}");
        assert!(t.contains("outlier: vcpu1 waited 200 µs"));
        assert_eq!(render_dumps("no dumps").unwrap(), None);
    }
}
