//! `cargo xtask bench timer`: timer wake-up latency inside the guest.
//!
//! cyclictest (Debian rt-tests) on vCPU1 at 50 µs and 1 ms intervals while
//! a CPU hog runs on vCPU0, both vCPUs on one pCPU, under each scheduler and
//! with `timer_slop_ns` 0 (exact EL2 timer for blocked vCPUs) and 50000
//! (deadlines rounded up to 50 µs, as a slack-based timer would). Reported:
//! min/avg/max latency and the samples over 100 µs.

use crate::cli::BenchTimerArgs;
use crate::qemu::RunOptions;
use crate::Result;
use std::fmt::Write as _;
use std::time::Duration;

pub const BEGIN: &str = "@@CT-BEGIN@@";
pub const END: &str = "@@CT-END@@";

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
    pub max_us: u64,
    pub over_100us: u64,
}

pub fn guest_command(c: &TimerCase, seconds: u32) -> String {
    format!(
        "taskset -c 0 sh -c 'while :; do :; done' & H=$!\n\
         cyclictest -t1 -a1 -p99 -i{} -D{} -m -q -h1000 > /tmp/ct.txt; R=$?\n\
         kill $H\n\
         echo {BEGIN}; grep '^# [TMAH]' /tmp/ct.txt | head -6; \
         awk '$1 !~ /^#/ && $1+0 > 100 {{s+=$2}} END {{print \"# Over100: \" s+0}}' /tmp/ct.txt; echo {END}\n\
         exit $R\n",
        c.interval_us, seconds
    )
}

pub fn hypervisor_args(c: &TimerCase) -> String {
    format!(
        "sched=credit2 sched_wake_preempt={} sched_ratelimit_us=1000 timer_slop_ns={}",
        if c.wake_preempt { "on" } else { "off" },
        c.slop_ns
    )
}

/// Parses the block between the markers (kernel lines may interleave).
pub fn parse(console: &str) -> Result<CyclicResult> {
    let start = console.rfind(BEGIN).ok_or("no cyclictest output")?;
    let block = &console[start..];
    let block = &block[..block.find(END).ok_or("cyclictest output not terminated")?];
    let field = |name: &str| -> Option<u64> {
        block.lines().find_map(|l| l.trim().strip_prefix(name).and_then(|v| v.trim().parse().ok()))
    };
    let overflows = field("# Histogram Overflows:").unwrap_or(0);
    Ok(CyclicResult {
        // cyclictest's histogram total leaves out the samples beyond it.
        samples: field("# Total:").ok_or("no total")? + overflows,
        min_us: field("# Min Latencies:").ok_or("no min")?,
        avg_us: field("# Avg Latencies:").ok_or("no avg")?,
        max_us: field("# Max Latencies:").ok_or("no max")?,
        over_100us: field("# Over100:").unwrap_or(0) + overflows,
    })
}

pub fn render(results: &[(TimerCase, std::result::Result<CyclicResult, String>)]) -> String {
    let mut s = String::from(
        "# Timer wake-up latency (cyclictest in the guest)\n\n\
         cyclictest on vCPU1 (SCHED_FIFO 99), CPU hog on vCPU0, 1 pCPU, QEMU -icount; latencies in µs.\n\n\
         | case | samples | min | avg | max | samples > 100 µs |\n|---|---:|---:|---:|---:|---:|\n",
    );
    for (c, r) in results {
        match r {
            Ok(r) => {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} |",
                    c.label(),
                    r.samples,
                    r.min_us,
                    r.avg_us,
                    r.max_us,
                    r.over_100us
                );
            }
            Err(e) => {
                let _ = writeln!(s, "| {} | failed: {e} | | | | |", c.label());
            }
        }
    }
    s
}

pub fn results_json(results: &[(TimerCase, std::result::Result<CyclicResult, String>)]) -> String {
    let cases: Vec<serde_json::Value> = results
        .iter()
        .filter_map(|(c, r)| r.as_ref().ok().map(|r| (c, r)))
        .map(|(c, r)| {
            serde_json::json!({
                "sched": if c.wake_preempt { "wake-preempt" } else { "xen-compat" },
                "interval_us": c.interval_us, "timer_slop_ns": c.slop_ns,
                "samples": r.samples, "min_us": r.min_us, "avg_us": r.avg_us, "max_us": r.max_us, "over_100us": r.over_100us
            })
        })
        .collect();
    serde_json::json!({ "cases": cases }).to_string()
}

pub fn run(args: &BenchTimerArgs) -> Result<()> {
    let seconds = args.runtime;
    let cases = cases();
    let mut progress = super::Progress::new(cases.len());
    let mut results = Vec::new();
    for c in cases {
        progress.next(&c.label());
        let o = RunOptions {
            pcpus: 1,
            vcpus: 2,
            icount: true,
            hv_args: hypervisor_args(&c),
            cmd: Some(guest_command(&c, seconds)),
            timeout: Duration::from_secs(600 + 60 * seconds as u64),
            echo: false,
            ..Default::default()
        };
        let r = crate::qemu::run(&o).and_then(|run| parse(&run.console));
        match &r {
            Ok(r) => eprintln!(
                "  min {} avg {} max {} us, {} samples over 100 us",
                r.min_us, r.avg_us, r.max_us, r.over_100us
            ),
            Err(e) => eprintln!("  failed: {e}"),
        }
        results.push((c, r));
    }
    let dir = crate::root().join("target").join("bench").join("timer");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let report = render(&results);
    std::fs::write(dir.join("report.md"), &report).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("results.json"), results_json(&results)).map_err(|e| e.to_string())?;
    println!("{report}");
    eprintln!("wrote {}", dir.join("report.md").display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONSOLE: &str = "[    4.1] random kernel line\n@@CT-BEGIN@@\n# Total: 000003000\n# Min Latencies: 00004\n\
        # Avg Latencies: 00013\n[    4.2] interleaved\n# Max Latencies: 00125\n# Histogram Overflows: 00002\n# Over100: 7\n@@CT-END@@\n";

    #[test]
    fn parses_cyclictest_summary() {
        let r = parse(CONSOLE).unwrap();
        assert_eq!(r, CyclicResult { samples: 3002, min_us: 4, avg_us: 13, max_us: 125, over_100us: 9 });
        assert!(parse("nothing").is_err());
        assert!(parse("@@CT-BEGIN@@\n# Total: 1\n").is_err());
    }

    #[test]
    fn cases_and_report() {
        let c = cases();
        assert_eq!(c.len(), 6);
        assert!(c.iter().any(|c| c.slop_ns == 50_000 && c.interval_us == 50));
        assert!(hypervisor_args(&c[1]).contains("timer_slop_ns=50000"));
        let results = vec![(c[0], parse(CONSOLE)), (c[1], Err("boom".to_string()))];
        let md = render(&results);
        assert!(md.contains("| 1p2v wake-preempt -i50 timer_slop_ns=0 | 3002 | 4 | 13 | 125 | 9 |"));
        assert!(md.contains("failed: boom"));
        let j: serde_json::Value = serde_json::from_str(&results_json(&results)).unwrap();
        assert_eq!(j["cases"].as_array().unwrap().len(), 1);
        assert!(guest_command(&c[0], 5).contains("cyclictest -t1 -a1 -p99 -i50 -D5"));
    }
}
