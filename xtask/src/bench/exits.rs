//! `cargo xtask bench exits`: what one exit costs, in instructions.
//!
//! The conformance guest (tests/conformance) with `conformance.exits` times
//! the operations that exit to a hypervisor (a null SMCCC call, an emulated
//! distributor register read, a UART register read (emulated for Dom0:
//! the console is the hypervisor's), a virtual-timer expiry until its
//! handler runs, an SGI to this CPU and to the other CPU until its handler
//! runs) over many iterations. Every case runs under
//! `-icount shift=0`, where guest time is instructions executed (all
//! exception levels together, one per nanosecond): the figures are path
//! lengths, the same on any host. Bare QEMU (no hypervisor, the guest at
//! EL1) is the reference; the hypervisor runs it as Dom0 (2 vCPUs on 2
//! pCPUs, the vITS backed by an NVMe disk it never touches) on GICv3 and on
//! GICv4, and with both vCPUs on one pCPU (GICv3), where an SGI to the
//! other vCPU is a switch of vCPUs.

use crate::conformance::{options, Placement};
use crate::Result;
use anyhow::{anyhow, Context};
use std::fmt::Write as _;

/// One run of the guest: 2 CPUs (vCPUs under the hypervisor) on `pcpus`,
/// with `hv_args` added to the hypervisor's.
#[derive(Clone, Copy, Debug)]
struct Case {
    label: &'static str,
    at: Placement,
    gic: u8,
    pcpus: u32,
    hv_args: &'static str,
}

/// On one pCPU an SGI to the other vCPU preempts the sender, which was
/// itself preempted by the last one: by default it is protected for
/// `sched_wake_min_run_us` (100 µs) after it is switched back in, and the
/// SGI waits for that, a policy, not a path. The case measures the path.
const CASES: [Case; 4] = [
    Case { label: "bare QEMU", at: Placement::Bare, gic: 3, pcpus: 2, hv_args: "" },
    Case { label: "hypervisor GICv3", at: Placement::Dom0, gic: 3, pcpus: 2, hv_args: "" },
    Case { label: "hypervisor GICv4", at: Placement::Dom0, gic: 4, pcpus: 2, hv_args: "" },
    Case {
        label: "GICv3, 1 pCPU, min run 0",
        at: Placement::Dom0,
        gic: 3,
        pcpus: 1,
        hv_args: "sched_wake_min_run_us=0",
    },
];

/// The operations, in the guest's order.
pub const OPS: [&str; 8] = [
    "smccc-unknown",
    "gicd-iidr-read",
    "uart-fr-read",
    "vtimer-expiry",
    "sgi-to-self",
    "sgi-to-other-cpu",
    "sgi-to-other-handler",
    "sgi-to-other-handler-median",
];

/// `exit <name>: <ns> ns/op over <n>` lines: (name, ns per op).
pub fn parse(console: &str) -> Vec<(String, f64)> {
    console
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().strip_prefix("exit ")?.split_once(": ")?;
            rest.contains(" ns/op over ").then_some(())?;
            let ns = rest.split_whitespace().next()?;
            Some((name.to_string(), ns.parse().ok()?))
        })
        .collect()
}

/// The guest's `exit <name>: FAIL …` lines.
fn failures(console: &str) -> Vec<String> {
    console
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("exit ") && l.contains(": FAIL"))
        .map(String::from)
        .collect()
}

/// The report: one row per operation, one column per case, and the
/// hypervisor's cost over bare QEMU's.
pub fn report(results: &[(&str, Vec<(String, f64)>)]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Exit cost (instructions per operation, `-icount shift=0`)\n");
    let _ = writeln!(
        s,
        "Recorded with `cargo xtask bench exits`: the conformance guest's `conformance.exits` loops, guest time \
         under `-icount shift=0` = instructions executed at every exception level. Dom0 has 2 vCPUs on 2 pCPUs \
         (on 1 pCPU where the column says so, with `sched_wake_min_run_us=0`: see `CASES`) and the vITS. `sgi-to-other-cpu` is the round trip (until the \
         sender saw the handler's count move), `sgi-to-other-handler` its first half (until the handler read \
         the clock), as a mean and as the median iteration: the path. On 1 pCPU the mean also carries the \
         scheduler's rare decisions not to preempt the sender (a woken vCPU with no more credit than the runner \
         waits for the runner's ratelimit window, ~1 ms).\n"
    );
    let _ = write!(s, "| operation |");
    for (label, _) in results {
        let _ = write!(s, " {label} |");
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "|---|{}", "---:|".repeat(results.len()));
    for op in OPS {
        let _ = write!(s, "| `{op}` |");
        let base = results.first().and_then(|(_, r)| r.iter().find(|(n, _)| n == op).map(|x| x.1));
        for (_, r) in results {
            match r.iter().find(|(n, _)| n == op) {
                Some((_, v)) => match base {
                    Some(b) if b > 0.0 && !std::ptr::eq(r, &results[0].1) => {
                        let _ = write!(s, " {v:.0} ({:.1}×) |", v / b);
                    }
                    _ => {
                        let _ = write!(s, " {v:.0} |");
                    }
                },
                None => {
                    let _ = write!(s, " - |");
                }
            }
        }
        let _ = writeln!(s);
    }
    s
}

pub fn run() -> Result<()> {
    let dir = crate::root().join("target").join("bench").join("exits");
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let mut results = Vec::new();
    let mut failed = Vec::new();
    for c in CASES {
        eprintln!("xtask: bench exits: {}", c.label);
        let mut o = options(c.at, c.gic, c.pcpus, crate::conformance::KernelFormat::Image)?;
        o.icount = true;
        o.echo = false;
        o.append = Some("conformance.exits".into());
        if !c.hv_args.is_empty() {
            o.hv_args = format!("{} {}", o.hv_args, c.hv_args);
        }
        let r = crate::run::qemu::run(&o)?;
        let got = parse(&r.console);
        let fails = failures(&r.console);
        if r.timed_out || got.is_empty() || !fails.is_empty() {
            let last = r.console.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").to_string();
            failed.push(format!("{}: {} (last console line: {last})", c.label, fails.join("; ")));
        }
        results.push((c.label, got));
    }
    let text = report(&results);
    std::fs::write(dir.join("report.md"), &text).with_context(|| dir.join("report.md").display().to_string())?;
    println!("{text}");
    eprintln!("xtask: wrote {}", dir.join("report.md").display());
    if failed.is_empty() {
        Ok(())
    } else {
        Err(anyhow!("{} case(s) failed: {}", failed.len(), failed.join(" | ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_and_the_report_has_ratios() {
        let c = "conformance: EL1\nexit smccc-unknown: 12.3 ns/op over 20000\n(d1) nothing\n\
                 exit uart-fr-read: skip no UART in the DT\nexit gicd-iidr-read: 15.0 ns/op over 20000\n";
        assert_eq!(parse(c), [("smccc-unknown".to_string(), 12.3), ("gicd-iidr-read".to_string(), 15.0)]);
        let hv = parse("exit smccc-unknown: 123.0 ns/op over 20000\nexit gicd-iidr-read: 1500.0 ns/op over 9\n");
        let r = report(&[("bare QEMU", parse(c)), ("hypervisor GICv3", hv)]);
        assert!(r.contains("| `smccc-unknown` | 12 | 123 (10.0×) |"), "{r}");
        assert!(r.contains("| `gicd-iidr-read` | 15 | 1500 (100.0×) |"), "{r}");
        assert!(r.contains("| `uart-fr-read` | - | - |"), "{r}");
        assert_eq!(
            failures("exit vtimer-expiry: FAIL lost\nexit a: 1.0 ns/op over 1"),
            ["exit vtimer-expiry: FAIL lost"]
        );
    }
}
