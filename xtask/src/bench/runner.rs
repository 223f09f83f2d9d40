//! The runner of `cargo xtask bench wakeup`: boots one QEMU per case and
//! repeat, collects fio's and the hypervisor's figures, writes the report.
//! Each repeat's console is kept (`<case>-r<N>.console.txt`), and its
//! flight-recorder dumps (`--hv-args sched_trace_threshold_us=N`) are
//! rendered as timelines, worst first (`<case>-r<N>.trace.txt`). A
//! `1p1v+d1` repeat counts only when its DomU's hog ran during all of fio
//! (`parse::check_domu_hog`).

use super::{check_failures, last_console_line, parse::check_domu_hog, platform_out_dir, Progress};
use super::{disk_matrix, matrix, parse_console, quick_matrix_on, run_options, write_report, Case, CaseResult, Disk};
use crate::platform::PlatformKind;
use crate::Result;
use anyhow::{anyhow, bail};

/// What one `cargo xtask bench wakeup` runs, as plain values: the command
/// line's `bench wakeup` options (`BenchWakeupArgs::options` in
/// [`crate::cli`]) with `repeats` already resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WakeupOptions {
    /// `--quick`: the quick matrix.
    pub quick: bool,
    /// `--full`: also the real-time clock matrix.
    pub full: bool,
    /// `--disk`: the quick matrix on these disks.
    pub disk: Vec<Disk>,
    /// `--gic`: with `disk`, the GIC versions of the PCIe disks.
    pub gic: Vec<u8>,
    /// `--runtime`: fio runtime per case, seconds.
    pub runtime: u32,
    /// Repeats per case (at least 1).
    pub repeats: u32,
    /// `--only`: only the cases whose label contains it.
    pub only: Option<String>,
    /// `--hv-args`: extra hypervisor boot arguments for every case.
    pub hv_args: Option<String>,
    /// `--platform`: QEMU virt or Graviton.
    pub platform: PlatformKind,
    /// `--same-boot`: also [`super::same_boot`].
    pub same_boot: bool,
}

/// The cases `args` select, before `--only`: on Graviton the quick matrix
/// on `--disk` (default the platform's NVMe), on QEMU virt the default,
/// `--full`, `--quick` or `--disk` matrix.
pub fn cases(args: &WakeupOptions) -> Result<Vec<Case>> {
    match args.platform {
        PlatformKind::Graviton if args.disk.is_empty() => Ok(quick_matrix_on(&[Disk::Nvme])),
        PlatformKind::Graviton => Ok(quick_matrix_on(&args.disk)),
        PlatformKind::FvpBaseRevc => Err(anyhow!("bench wakeup runs on QEMU: --platform qemu-virt or graviton")),
        PlatformKind::QemuVirt if args.disk.is_empty() => Ok(matrix(args.full, args.quick)),
        PlatformKind::QemuVirt => Ok(disk_matrix(&args.disk, &args.gic)),
    }
}

pub fn wakeup(args: &WakeupOptions) -> Result<()> {
    let (runtime, repeats, only) = (args.runtime, args.repeats, &args.only);
    let all = cases(args)?;
    let cases: Vec<Case> = all
        .into_iter()
        .filter(|c| only.as_ref().is_none_or(|s| c.label().contains(s.as_str()) || c.to_string().contains(s.as_str())))
        .collect();
    if cases.is_empty() {
        bail!("no case matches");
    }
    let mut progress = Progress::new(cases.len());
    let mut results = Vec::new();
    for case in &cases {
        progress.next(case);
        let mut r = CaseResult { case: *case, samples: Vec::new(), errors: Vec::new() };
        for rep in 0..repeats {
            let mut o = run_options(case, runtime);
            if args.platform == PlatformKind::Graviton {
                crate::platform::graviton::apply(&mut o, false);
            }
            if let Some(extra) = &args.hv_args {
                o.hv_args = format!("{} {extra}", o.hv_args);
            }
            let run = crate::run::qemu::run(&o);
            if let Ok(run) = &run {
                keep_console(case, rep, &run.console);
            }
            match run {
                Ok(run) if run.timed_out => r.errors.push(format!(
                    "repeat {}: QEMU timed out; last console line: {}",
                    rep + 1,
                    last_console_line(&run.console)
                )),
                Ok(run) => match parse_console(&run.console).and_then(|s| {
                    // 1p1v+d1: a run where the DomU's hog did not run all along is a failure, not a result.
                    if case.topology.domu_hog() {
                        let share = check_domu_hog(&run.console, &s)?;
                        eprintln!("  repeat {}: DomU hog ran, {:.0} % of the pCPU", rep + 1, share * 100.0);
                    }
                    Ok(s)
                }) {
                    Ok(s) => {
                        eprintln!(
                            "  repeat {}: {:.0} IOPS, clat p99 {:.0} p99.9 {:.0} p99.99 {:.0} max {:.0} us",
                            rep + 1,
                            s.fio.iops,
                            s.fio.clat_p99_us,
                            s.fio.clat_p999_us,
                            s.fio.clat_p9999_us,
                            s.fio.clat_max_us
                        );
                        r.samples.push(s);
                    }
                    Err(e) => {
                        let tail: Vec<&str> = run.console.lines().rev().take(15).collect();
                        eprintln!(
                            "  repeat {}: {e:#}; console tail:\n{}",
                            rep + 1,
                            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                        );
                        r.errors.push(format!(
                            "repeat {}: {e:#}; last console line: {}",
                            rep + 1,
                            last_console_line(&run.console)
                        ));
                    }
                },
                Err(e) => r.errors.push(format!("repeat {}: {e:#}", rep + 1)),
            }
        }
        results.push(r);
    }
    let files = write_report(&platform_out_dir(args.platform), &results)?;
    let mut same_boot_failed = None;
    if args.same_boot {
        eprintln!("same boot: 1p2v, sched_wake_preempt switched with hvctl");
        let same = super::same_boot::run(runtime, args.hv_args.as_deref())?;
        same_boot_failed = same.iter().find_map(|r| r.as_ref().err().map(|e| format!("{e:#}")));
        let mut report = std::fs::read_to_string(&files.report_md).unwrap_or_default();
        report.push_str(&super::same_boot::section(&same, &results));
        std::fs::write(&files.report_md, report)?;
    }
    let report = std::fs::read_to_string(&files.report_md).unwrap_or_default();
    println!("{report}");
    eprintln!("wrote {}, {}, {}", files.report_md.display(), files.results_json.display(), files.latency_svg.display());
    if let Some(e) = same_boot_failed {
        bail!("the same-boot run: {e}");
    }
    check_failures(results.iter().flat_map(|r| r.errors.iter().map(|e| (r.case.label(), e.as_str()))))
}

/// Writes a repeat's console and its rendered dumps next to the report
/// (best effort: a failure is reported, the benchmark goes on).
fn keep_console(case: &Case, rep: u32, console: &str) {
    let dir = super::out_dir();
    let name = format!("{}-r{}", super::timer::slug(&case.label()), rep + 1);
    let mut out =
        std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(dir.join(format!("{name}.console.txt")), console));
    match super::timer::render_dumps(console) {
        Ok(Some(t)) => out = out.and_then(|_| std::fs::write(dir.join(format!("{name}.trace.txt")), t)),
        Ok(None) => {}
        Err(e) => eprintln!("  flight-recorder dumps: {e:#}"),
    }
    if let Err(e) = out {
        eprintln!("  keeping the console of {name}: {e}");
    }
}
