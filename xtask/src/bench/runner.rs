//! The runner of `cargo xtask bench wakeup`: boots one QEMU per case and
//! repeat, collects fio's and the hypervisor's figures, writes the report.

use super::{matrix, parse_console, run_options, write_report, Case, CaseResult, Progress, DEFAULT_REPEATS, DEFAULT_RUNTIME_S};
use crate::Result;
use std::path::PathBuf;

pub const USAGE: &str = "usage: cargo xtask bench wakeup [--quick | --full] [--runtime SECS] [--repeats N] [--only SUBSTRING]

  --quick        1p1v and 1p2v, unpinned IRQ, xen-compat 1000 vs wake-preempt, ram disk, icount, 1 repeat
  --full         also the real-time clock matrix (with 2p2v)
  --runtime S    fio runtime per case (default 10)
  --repeats N    repeats per case, the median is reported (default 3; 1 with --quick)
  --only S       run only the cases whose label contains S
  --hv-args \"..\" extra hypervisor boot arguments for every case (e.g. sched_lhp_grace_us=20)
Writes target/bench/wakeup/{report.md,results.json,latency.svg}.";

/// A raw disk image for the passthrough and backend disks (sparse, 256 MiB),
/// apart from the tests' image so a benchmark and a test can run together.
fn disk_image() -> Result<PathBuf> {
    crate::qemu::sparse_image(crate::root().join("target").join("bench").join("disk.img")).map_err(|e| e.to_string())
}

pub fn wakeup(args: &[String]) -> Result<()> {
    let (mut quick, mut full, mut runtime, mut repeats, mut only) = (false, false, DEFAULT_RUNTIME_S, None, None);
    let mut extra_hv_args: Option<String> = None;
    let mut i = 0;
    while i < args.len() {
        let val = || args.get(i + 1).cloned().ok_or_else(|| format!("{} needs a value", args[i]));
        match args[i].as_str() {
            "--quick" => quick = true,
            "--full" => full = true,
            "--runtime" => {
                runtime = val()?.parse().map_err(|_| "bad --runtime")?;
                i += 1;
            }
            "--repeats" => {
                repeats = Some(val()?.parse::<u32>().map_err(|_| "bad --repeats")?.max(1));
                i += 1;
            }
            "--only" => {
                only = Some(val()?);
                i += 1;
            }
            "--hv-args" => {
                extra_hv_args = Some(val()?);
                i += 1;
            }
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
        i += 1;
    }
    let repeats = repeats.unwrap_or(if quick { 1 } else { DEFAULT_REPEATS });
    let cases: Vec<Case> = matrix(full, quick)
        .into_iter()
        .filter(|c| only.as_ref().is_none_or(|s| c.label().contains(s.as_str()) || c.to_string().contains(s.as_str())))
        .collect();
    if cases.is_empty() {
        return Err("no case matches".into());
    }
    let disk = disk_image()?;
    let mut progress = Progress::new(cases.len());
    let mut results = Vec::new();
    for case in &cases {
        progress.next(case);
        let mut r = CaseResult { case: *case, samples: Vec::new(), errors: Vec::new() };
        for rep in 0..repeats {
            let mut o = run_options(case, runtime, &disk);
            if let Some(extra) = &extra_hv_args {
                o.hv_args = format!("{} {extra}", o.hv_args);
            }
            match crate::qemu::run(&o) {
                Ok(run) if run.timed_out => r.errors.push(format!("repeat {rep}: QEMU timed out")),
                Ok(run) => match parse_console(&run.console) {
                    Ok(s) => {
                        eprintln!("  repeat {}: {:.0} IOPS, clat p99 {:.0} us", rep + 1, s.fio.iops, s.fio.clat_p99_us);
                        r.samples.push(s);
                    }
                    Err(e) => {
                        let tail: Vec<&str> = run.console.lines().rev().take(15).collect();
                        eprintln!("  repeat {}: {e}; console tail:\n{}", rep + 1, tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
                        r.errors.push(format!("repeat {rep}: {e}"));
                    }
                },
                Err(e) => r.errors.push(format!("repeat {rep}: {e}")),
            }
        }
        results.push(r);
    }
    let files = write_report(&super::out_dir(), &results)?;
    let report = std::fs::read_to_string(&files.report_md).unwrap_or_default();
    println!("{report}");
    eprintln!("wrote {}, {}, {}", files.report_md.display(), files.results_json.display(), files.latency_svg.display());
    Ok(())
}
