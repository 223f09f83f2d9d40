//! Console text → fio results and hypervisor statistics.
//!
//! The console is one stream shared by the guest's userspace, the guest
//! kernel (printk lines such as `[   12.345678] virtio_blk ...`) and the
//! hypervisor (its stats at power-off). printk does not wait for a userspace
//! line to end, so a kernel line can land *inside* fio's JSON, even in the
//! middle of one of its lines. [`extract_fio_json`] undoes both cases:
//! whole kernel lines are dropped, and a line cut by one is rejoined with
//! its continuation.
//!
//! fio's JSON (3.33, `--output-format=json`) is read with serde_json; only
//! the fields the report needs are taken, so other fio versions with the
//! same fields work too.
//!
//! With a DomU (`1p1v+d1`) the console also carries the DomU's lines, whole
//! and prefixed `(d1) ` (the hypervisor's console mux), and its stats with a
//! `d1.` prefix: [`parse_domu_stats`] reads those, [`check_domu_hog`] decides
//! whether the DomU's hog ran during all of fio, [`hog_share`] how much of
//! the pCPU it got.

use super::{Topology, FIO_BEGIN, FIO_END, FIO_START_MARK, HOG_MARK, IRQ_MARK};
use anyhow::{anyhow, bail, Context};
use hypervisor::stats::{parse_text, ParseError, VcpuStats};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// fio's figures for one run (times in µs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FioResult {
    pub iops: f64,
    pub clat_p50_us: f64,
    pub clat_p99_us: f64,
    pub clat_p999_us: f64,
    /// fio's default percentile list has 99.99.
    pub clat_p9999_us: f64,
    pub clat_max_us: f64,
    /// Mean submission latency: fio's `slat_ns.mean` when fio measured it
    /// (`slat_ns.N > 0`, async engines). fio records no slat for sync
    /// engines such as psync (N = 0, see the fixture): then this is
    /// `lat_ns.mean - clat_ns.mean`, the time from fio's I/O setup to the
    /// `pread` call, and [`FioResult::slat_measured`] is false. With psync,
    /// the kernel's submission (virtqueue lock, kick) is inside clat.
    pub slat_mean_us: f64,
    /// Whether `slat_mean_us` is fio's own slat (see there).
    pub slat_measured: bool,
    pub clat_mean_us: f64,
    /// Every completion-latency percentile fio printed, as (percent, µs),
    /// sorted by percent: the curve of the latency plot.
    pub clat_percentiles_us: Vec<(f64, f64)>,
    /// Number of completed reads.
    pub total_ios: u64,
}

/// What one run of a case produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub fio: FioResult,
    /// Hypervisor statistics per vCPU (empty when none were printed, e.g.
    /// without the hypervisor).
    pub stats: BTreeMap<u32, VcpuStats>,
    /// Why the stats text did not parse, when it did not (the fio figures
    /// are still valid then).
    pub stats_error: Option<String>,
    /// Interrupts of the disk per guest CPU after fio (`@@BENCH-IRQ@@`
    /// lines, summed), when the guest printed them.
    pub disk_irqs_per_cpu: Option<Vec<u64>>,
    /// The irqchips of those lines as /proc/interrupts names them (`GICv3`
    /// for an SPI or INTx, `ITS-MSI` for an LPI), each once, in order.
    pub disk_irq_chips: Vec<String>,
    /// DomU 1's vCPUs' statistics (its `d1.vcpuN.` lines; empty without a DomU).
    pub domu_stats: BTreeMap<u32, VcpuStats>,
}

/// Whether `line[at..]` starts with a printk timestamp `[  12.345678]`.
fn timestamp_at(line: &str, at: usize) -> bool {
    let b = &line.as_bytes()[at..];
    if b.first() != Some(&b'[') {
        return false;
    }
    let mut i = 1;
    while i < b.len() && b[i] == b' ' {
        i += 1;
    }
    let d0 = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    if i == d0 || i >= b.len() || b[i] != b'.' {
        return false;
    }
    i += 1;
    let d1 = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    i > d1 && i < b.len() && b[i] == b']'
}

/// Byte offset of the first printk timestamp in `line`, if any.
fn find_timestamp(line: &str) -> Option<usize> {
    line.match_indices('[').map(|(i, _)| i).find(|&i| timestamp_at(line, i))
}

/// The domain of a DomU's console line (`(d1) text` → `Some(1)`).
pub fn domu_line(line: &str) -> Option<u32> {
    let rest = line.strip_prefix("(d")?;
    let (n, _) = rest.split_once(") ")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// Removes kernel log lines (and DomUs' lines) from the text of a marker block. A kernel line
/// in the middle of a userspace line leaves `head[ 1.2] msg` + `tail`:
/// `head` and `tail` are rejoined (without a newline, which is what the
/// userspace line had there; JSON does not care either way).
fn strip_kernel_lines(block: &str) -> String {
    let mut out = String::with_capacity(block.len());
    for raw in block.lines() {
        let line = raw.trim_end_matches('\r');
        if domu_line(line).is_some() {
            continue; // a DomU's line: always whole (the console mux holds it)
        }
        match find_timestamp(line) {
            Some(0) => {}
            Some(p) => out.push_str(&line[..p]), // cut: continues on the next line
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// The text between the last complete [`FIO_BEGIN`] / [`FIO_END`] pair, with
/// kernel log lines removed and anything before fio's first `{` and after its
/// last `}` (e.g. fio's `note:` lines) dropped.
pub fn extract_fio_json(console: &str) -> anyhow::Result<String> {
    // Markers are matched as whole (trimmed) lines, and a marker line may
    // itself be hit by printk; then it is simply missed and we report that.
    let mut begin = None;
    let mut block = None;
    let mut pos = 0;
    for line in console.split_inclusive('\n') {
        let t = line.trim();
        if t == FIO_BEGIN {
            begin = Some(pos + line.len());
        } else if t == FIO_END {
            if let Some(b) = begin.take() {
                block = Some((b, pos));
            }
        }
        pos += line.len();
    }
    let (b, e) = match (block, begin) {
        (Some(be), _) => be,
        (None, Some(_)) => {
            return Err(anyhow!("fio JSON starts ({FIO_BEGIN}) but never ends ({FIO_END}): run cut short?"))
        }
        (None, None) => bail!("no {FIO_BEGIN} marker on the console (did fio run?)"),
    };
    let text = strip_kernel_lines(&console[b..e]);
    let start = text.find('{').context("the fio block holds no JSON object (fio failed? see the console)")?;
    let end = text.rfind('}').filter(|&end| end > start).context("the fio JSON block is truncated")?;
    Ok(text[start..=end].to_string())
}

fn num(v: &Value, path: &str) -> anyhow::Result<f64> {
    let mut cur = v;
    for key in path.split('/') {
        cur = match key.parse::<usize>() {
            Ok(i) if cur.is_array() => &cur[i],
            _ => &cur[key],
        };
    }
    cur.as_f64().ok_or_else(|| anyhow!("fio JSON: no number at {path}"))
}

/// Parses fio's JSON output: `jobs[0].read` (IOPS, `clat_ns` percentiles,
/// `slat_ns.mean`), converted to µs.
pub fn parse_fio_json(json: &str) -> anyhow::Result<FioResult> {
    let v: Value = serde_json::from_str(json).context("fio JSON")?;
    if let Some(err) = v["jobs"][0]["error"].as_i64().filter(|&e| e != 0) {
        bail!("fio reported error {err} for job 0");
    }
    let read = &v["jobs"][0]["read"];
    if read.is_null() {
        bail!("fio JSON: no jobs[0].read");
    }
    let pct = read["clat_ns"]["percentile"].as_object().context("fio JSON: no jobs[0].read.clat_ns.percentile")?;
    let mut clat: Vec<(f64, f64)> =
        pct.iter().filter_map(|(k, v)| Some((k.parse::<f64>().ok()?, v.as_f64()? / 1000.0))).collect();
    clat.sort_by(|a, b| a.0.total_cmp(&b.0));
    let at = |p: &str| -> anyhow::Result<f64> {
        pct.get(p)
            .and_then(Value::as_f64)
            .map(|ns| ns / 1000.0)
            .ok_or_else(|| anyhow!("fio JSON: no clat percentile {p}"))
    };
    let slat_measured = read["slat_ns"]["N"].as_u64().unwrap_or(0) > 0;
    let clat_mean_us = num(read, "clat_ns/mean")? / 1000.0;
    let slat_mean_us = if slat_measured {
        num(read, "slat_ns/mean")? / 1000.0
    } else {
        (num(read, "lat_ns/mean")? / 1000.0 - clat_mean_us).max(0.0)
    };
    Ok(FioResult {
        iops: num(read, "iops")?,
        clat_p50_us: at("50.000000")?,
        clat_p99_us: at("99.000000")?,
        clat_p999_us: at("99.900000")?,
        clat_p9999_us: at("99.990000")?,
        clat_max_us: num(read, "clat_ns/max")? / 1000.0,
        slat_mean_us,
        slat_measured,
        clat_mean_us,
        clat_percentiles_us: clat,
        total_ios: read["total_ios"].as_u64().unwrap_or(0),
    })
}

/// Per-CPU interrupt counts summed over the `@@BENCH-IRQ@@` lines, and
/// their irqchips, e.g. `@@BENCH-IRQ@@  13:   3  9876  GICv3  79 Edge  virtio0`
/// (one line for a virtio-mmio disk; one per queue vector for NVMe over
/// MSI-X: `@@BENCH-IRQ@@  21:  0  5000  ITS-MSI  16385 Edge  nvme0q1`).
/// A line without counts (the disk's IRQ was not found) adds nothing.
pub fn parse_irq_lines(console: &str) -> (Option<Vec<u64>>, Vec<String>) {
    let mut sum: Option<Vec<u64>> = None;
    let mut chips: Vec<String> = Vec::new();
    for line in console.lines().filter_map(|l| l.trim().strip_prefix(IRQ_MARK)) {
        let Some((_, rest)) = line.split_once(':') else { continue };
        let mut words = rest.split_whitespace().peekable();
        let mut counts = Vec::new();
        while let Some(n) = words.peek().and_then(|w| w.parse::<u64>().ok()) {
            counts.push(n);
            words.next();
        }
        if counts.is_empty() {
            continue;
        }
        let total = sum.get_or_insert_with(Vec::new);
        if total.len() < counts.len() {
            total.resize(counts.len(), 0);
        }
        for (t, n) in total.iter_mut().zip(counts) {
            *t = t.saturating_add(n);
        }
        if let Some(chip) = words.next().filter(|c| !chips.iter().any(|x| x == c)) {
            chips.push(chip.to_string());
        }
    }
    (sum, chips)
}

/// One run's console → [`Sample`]. Fails only when fio's figures are
/// missing or unreadable.
pub fn parse_console(console: &str) -> anyhow::Result<Sample> {
    let fio = parse_fio_json(&extract_fio_json(console)?)?;
    let (stats, stats_error) = match parse_text(console) {
        Ok(s) => (s, None),
        Err(e) => (BTreeMap::new(), Some(e.to_string())),
    };
    let (disk_irqs_per_cpu, disk_irq_chips) = parse_irq_lines(console);
    let (domu_stats, stats_error) = match parse_domu_stats(console, 1) {
        Ok(d) => (d, stats_error),
        Err(e) => (BTreeMap::new(), Some(stats_error.map_or(format!("d1: {e}"), |s| format!("{s}; d1: {e}")))),
    };
    Ok(Sample { fio, stats, stats_error, disk_irqs_per_cpu, disk_irq_chips, domu_stats })
}

/// DomU `dom`'s vCPU statistics: the hypervisor prints them in the stable
/// format with every line prefixed `d<dom>.` (`d1.vcpu0.run_ns=…`).
pub fn parse_domu_stats(console: &str, dom: u32) -> Result<BTreeMap<u32, VcpuStats>, ParseError> {
    let prefix = format!("d{dom}.");
    let text: String =
        console.lines().filter_map(|l| l.trim().strip_prefix(prefix.as_str())).flat_map(|l| [l, "\n"]).collect();
    parse_text(&text)
}

/// The hog's share of the pCPU time the vCPUs ran, over the whole run
/// (boot included), from the hypervisor's `run_ns` counters: 1p2v/2p2v,
/// Dom0's vCPU0 over all Dom0 vCPUs; `1p1v+d1`, the DomU's vCPUs over
/// Dom0's and the DomU's. `None` without a hog or without stats.
pub fn hog_share(topology: Topology, s: &Sample) -> Option<f64> {
    let run = |m: &BTreeMap<u32, VcpuStats>| m.values().map(|v| v.counters.run_ns).sum::<u64>();
    let (hog, total) = if topology.domu_hog() {
        let d = run(&s.domu_stats);
        (d, d + run(&s.stats))
    } else if topology.has_hog() {
        (s.stats.get(&0)?.counters.run_ns, run(&s.stats))
    } else {
        return None;
    };
    (total > 0).then(|| hog as f64 / total as f64)
}

/// The least share of the pCPU a DomU hog that ran all along can have got:
/// Credit2 gives it half of the pCPU while Dom0 boots beside it, and all of
/// it while Dom0 sleeps before fio ([`super::DOMU_BOOT_WAIT_S`]).
pub const MIN_DOMU_HOG_SHARE: f64 = 0.2;

/// Whether a `1p1v+d1` run is a result: DomU 1 booted and printed
/// [`HOG_MARK`] (`(d1) @@BENCH-HOG@@`) before Dom0 printed
/// [`FIO_START_MARK`], it was still running when Dom0 powered the machine
/// off (`dom1.stopped=0`), and the hypervisor charged it at least
/// [`MIN_DOMU_HOG_SHARE`] of the pCPU ([`hog_share`]). Returns that share,
/// or why the run is a failed case.
pub fn check_domu_hog(console: &str, s: &Sample) -> anyhow::Result<f64> {
    let lines: Vec<&str> = console.lines().map(str::trim).collect();
    let hog = lines.iter().position(|l| domu_line(l) == Some(1) && l.ends_with(HOG_MARK));
    let start = lines.iter().position(|l| domu_line(l).is_none() && l.contains(FIO_START_MARK));
    let Some(hog) = hog else {
        bail!("the DomU's hog never started (no `(d1) {HOG_MARK}` on the console: did d1 boot?)");
    };
    let Some(start) = start else {
        bail!("Dom0 never printed {FIO_START_MARK}");
    };
    if hog > start {
        bail!("the DomU's hog started after fio: fio did not share its pCPU all along");
    }
    match lines.iter().find_map(|l| l.strip_prefix("dom1.stopped=")) {
        Some("0") => {}
        Some(_) => bail!("d1 stopped before Dom0 powered off: its hog did not run to the end"),
        None => bail!("no dom1 stats on the console (d1 did not exist?)"),
    }
    let share = hog_share(Topology::OneP1VD1, s).context("no run time for d1's or Dom0's vCPUs in the stats")?;
    if share < MIN_DOMU_HOG_SHARE {
        bail!(
            "the DomU's hog got {:.1} % of the pCPU (< {:.0} %): it did not run",
            share * 100.0,
            MIN_DOMU_HOG_SHARE * 100.0
        );
    }
    Ok(share)
}
