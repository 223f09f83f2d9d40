//! `cargo xtask bench wakeup --same-boot`: the seed experiment's two
//! schedulers in one boot, switched with `hvctl set sched_wake_preempt=`
//! (docs/hvctl.md), beside the per-boot cases: the report shows both ways
//! give the same figures, so a user can compare settings without
//! rebooting.
//!
//! The boot is the quick matrix's 1p2v case (1 pCPU, Dom0's 2 vCPUs, the
//! RAM disk, `-icount`) with the wake path on; the guest starts the hog on
//! vCPU0, then for each setting in [`SETTINGS`] sets it, runs fio on vCPU1
//! and prints its JSON between [`MARK`]`-<setting>` and the usual fio
//! markers.

use super::parse::{extract_fio_json, parse_fio_json, FioResult};
use super::{fio_command, run_options, CaseResult, Clock, Disk, Sched, Topology, FIO_BEGIN, FIO_END};
use crate::Result;
use std::fmt::Write as _;

/// `sched_wake_preempt=` values, in the order they run, and the per-boot
/// scheduler each stands for.
pub const SETTINGS: [(&str, Sched); 2] = [("off", Sched::XenCompat), ("on", Sched::WakePreempt)];

/// Starts each setting's section of the console: `@@SAME-BOOT@@-off`.
pub const MARK: &str = "@@SAME-BOOT@@";

/// The per-boot case this boot is (wake-preempt at boot).
pub fn case() -> super::Case {
    super::matrix(false, true)
        .into_iter()
        .find(|c| c.topology == Topology::OneP2V && c.sched == Sched::WakePreempt)
        .expect("the quick matrix has 1p2v wake-preempt")
}

/// The guest's script (it travels in `guestcmd=`: keep it short).
pub fn guest_command(runtime_s: u32) -> String {
    let fio = fio_command(runtime_s, Disk::Ram.device_path());
    let mut s = String::from("taskset -c 0 sh -c 'while :; do :; done' & H=$!\n");
    for (value, _) in SETTINGS {
        let _ = writeln!(
            s,
            "hvctl set sched_wake_preempt={value} || exit 4\ntaskset -c 1 {fio} > /tmp/f.json\n\
             echo {MARK}-{value}; echo {FIO_BEGIN}; cat /tmp/f.json; echo; echo {FIO_END}"
        );
    }
    s.push_str("kill $H\n");
    s
}

/// Each setting's fio result from the console, in [`SETTINGS`] order.
pub fn parse(console: &str) -> Vec<anyhow::Result<FioResult>> {
    SETTINGS
        .iter()
        .map(|(value, _)| {
            let section = console
                .split(&format!("{MARK}-{value}"))
                .nth(1)
                .ok_or_else(|| anyhow::anyhow!("no {MARK}-{value} section"))?;
            // Up to the next setting's section.
            let section = section.split(MARK).next().unwrap_or(section);
            parse_fio_json(&extract_fio_json(section)?)
        })
        .collect()
}

/// Boots once and returns each setting's result.
pub fn run(runtime_s: u32, hv_args: Option<&str>) -> Result<Vec<anyhow::Result<FioResult>>> {
    let case = case();
    assert_eq!(case.clock, Clock::Icount);
    let mut o = run_options(&case, runtime_s);
    o.cmd = Some(guest_command(runtime_s));
    o.timeout *= 2;
    if let Some(extra) = hv_args {
        o.hv_args = format!("{} {extra}", o.hv_args);
    }
    let run = crate::run::qemu::run(&o)?;
    let _ = std::fs::create_dir_all(super::out_dir())
        .and_then(|_| std::fs::write(super::out_dir().join("same-boot.console.txt"), &run.console));
    if run.timed_out {
        anyhow::bail!("the same-boot run timed out: {}", super::last_console_line(&run.console));
    }
    Ok(parse(&run.console))
}

/// The report's section: each setting's IOPS and clat p99 in the one boot
/// beside the per-boot case's median (when the matrix ran it), and their
/// ratio.
pub fn section(same: &[anyhow::Result<FioResult>], per_boot: &[CaseResult]) -> String {
    let mut s = String::from(
        "\n## Same boot (`--same-boot`)\n\n1p2v on the RAM disk, one boot, the scheduler switched with \
         `hvctl set sched_wake_preempt=` before each fio run; per boot: the matrix's own 1p2v case \
         (median of its repeats).\n\n\
         | sched_wake_preempt | same boot IOPS | clat p99 (µs) | per boot IOPS | same / per boot |\n|---|---:|---:|---:|---:|\n",
    );
    let base = case();
    for ((value, sched), r) in SETTINGS.iter().zip(same) {
        let per = per_boot
            .iter()
            .find(|c| super::Case { sched: *sched, ratelimit_us: c.case.ratelimit_us, ..base } == c.case)
            .and_then(|c| median(c.samples.iter().map(|s| s.fio.iops).collect()));
        match r {
            Ok(f) => {
                let per_s = per.map_or("-".into(), |p| format!("{p:.0}"));
                let ratio = per.filter(|&p| p > 0.0).map_or("-".into(), |p| format!("{:.2}", f.iops / p));
                let _ = writeln!(s, "| {value} | {:.0} | {:.0} | {per_s} | {ratio} |", f.iops, f.clat_p99_us);
            }
            Err(e) => {
                let _ = writeln!(s, "| {value} | failed: {e:#} | | | |");
            }
        }
    }
    s
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_switches_before_each_run_and_fits_the_command_line() {
        let s = guest_command(10);
        let off = s.find("sched_wake_preempt=off").unwrap();
        let on = s.find("sched_wake_preempt=on").unwrap();
        assert!(off < s.find("@@SAME-BOOT@@-off").unwrap() && on > off);
        assert!(s.matches("fio --name").count() == 2);
        assert!(s.len() < 800, "{} bytes", s.len());
    }

    #[test]
    fn each_section_parses_to_its_own_result() {
        let json = |iops: f64| {
            format!(
                r#"{{"jobs":[{{"error":0,"read":{{"iops":{iops},"slat_ns":{{"mean":1.0}},"clat_ns":{{"mean":1.0,"percentile":{{"50.000000":1,"99.000000":2,"99.900000":3,"99.990000":4}},"max":5.0}},"lat_ns":{{"mean":1.0}}}}}}]}}"#
            )
        };
        let console = format!(
            "boot\n{MARK}-off\n{FIO_BEGIN}\n{}\n{FIO_END}\n{MARK}-on\n{FIO_BEGIN}\n{}\n{FIO_END}\n",
            json(99.0),
            json(4100.0)
        );
        let r = parse(&console);
        let iops: Vec<f64> = r.iter().map(|f| f.as_ref().map_or(-1.0, |f| f.iops)).collect();
        assert_eq!(
            iops,
            [99.0, 4100.0],
            "{:?}",
            r.iter().map(|f| f.as_ref().err().map(|e| e.to_string())).collect::<Vec<_>>()
        );
        assert!(parse("nothing")[0].is_err());
    }
}
