//! Repeats → one figure per case.
//!
//! Each metric's median is taken on its own (the median IOPS and the median
//! p99 may come from different repeats): with 3 repeats on a noisy host that
//! is what discards one outlier per metric. An even count gives the mean of
//! the two middle values. Histograms are not medians: the kick→schedule-in
//! histograms of all repeats are merged (added), since they count events.

use super::{Case, CaseResult, FioResult};
use hypervisor::stats::{Counters, Log2Histogram};

/// Median of the finite values (`None` when there is none).
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// One case, aggregated over its successful repeats.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub case: Case,
    /// Per-metric medians; `clat_percentiles_us` holds the median of each
    /// percentile that every repeat printed.
    pub fio: FioResult,
    pub repeats: usize,
    /// Failed repeats (their messages).
    pub errors: Vec<String>,
    /// The fio vCPU's kick→schedule-in histogram, merged over repeats
    /// (`None` when the hypervisor printed no stats).
    pub kick_to_run: Option<Log2Histogram>,
    /// The fio vCPU's counters, summed over repeats (`None` without stats).
    pub fio_vcpu_counters: Option<Counters>,
    /// Every vCPU's counters added up, summed over repeats (`None` without
    /// stats): IRQ exits and injected LPIs land on whichever vCPU runs.
    pub all_vcpu_counters: Option<Counters>,
    /// fio's completed reads summed over the repeats that printed stats:
    /// the denominator of the per-I/O figures (the counters are sums too).
    pub ios_with_stats: u64,
    /// Median disk interrupts per guest CPU, when the guest reported them.
    pub disk_irqs_per_cpu: Option<Vec<u64>>,
    /// The disk interrupts' irqchips over all repeats (`GICv3`, `ITS-MSI`).
    pub disk_irq_chips: Vec<String>,
    /// Stats parse problems of individual repeats.
    pub stats_errors: Vec<String>,
    /// Median share of the pCPU time the hog got (`super::parse::hog_share`:
    /// Dom0's vCPU0 in 1p2v/2p2v, the DomU in 1p1v+d1), over the repeats
    /// that printed stats; `None` without a hog or stats.
    pub hog_share: Option<f64>,
}

/// Medians over the samples of one case; `None` when no repeat succeeded.
pub fn summarize(r: &CaseResult) -> Option<Summary> {
    let s = &r.samples;
    if s.is_empty() {
        return None;
    }
    let med = |f: fn(&FioResult) -> f64| median(&s.iter().map(|x| f(&x.fio)).collect::<Vec<_>>()).unwrap_or(f64::NAN);
    // Percentile curve: the percents every repeat has, each median'ed.
    let mut clat = Vec::new();
    for &(p, _) in &s[0].fio.clat_percentiles_us {
        let vals: Vec<f64> =
            s.iter().filter_map(|x| x.fio.clat_percentiles_us.iter().find(|q| q.0 == p).map(|q| q.1)).collect();
        if vals.len() == s.len() {
            clat.push((p, median(&vals).unwrap_or(f64::NAN)));
        }
    }
    let ios: Vec<f64> = s.iter().map(|x| x.fio.total_ios as f64).collect();
    let fio = FioResult {
        iops: med(|f| f.iops),
        clat_p50_us: med(|f| f.clat_p50_us),
        clat_p99_us: med(|f| f.clat_p99_us),
        clat_p999_us: med(|f| f.clat_p999_us),
        clat_p9999_us: med(|f| f.clat_p9999_us),
        clat_max_us: med(|f| f.clat_max_us),
        slat_mean_us: med(|f| f.slat_mean_us),
        slat_measured: s.iter().all(|x| x.fio.slat_measured),
        clat_mean_us: med(|f| f.clat_mean_us),
        clat_percentiles_us: clat,
        total_ios: median(&ios).unwrap_or(0.0) as u64,
    };

    let vcpu = r.case.topology.fio_vcpu();
    let mut hist: Option<Log2Histogram> = None;
    let mut counters: Option<Counters> = None;
    let mut all_counters: Option<Counters> = None;
    let mut ios_with_stats = 0u64;
    let add = |acc: &mut Option<Counters>, from: &Counters| {
        let c = acc.get_or_insert_with(Counters::default);
        for name in Counters::NAMES {
            if let (Some(dst), Some(v)) = (c.get_mut(name), from.get(name)) {
                *dst += v;
            }
        }
    };
    for x in s.iter() {
        let Some(st) = x.stats.get(&vcpu) else { continue };
        hist.get_or_insert_with(Log2Histogram::new).merge(&st.kick_to_run_ns);
        add(&mut counters, &st.counters);
        for other in x.stats.values() {
            add(&mut all_counters, &other.counters);
        }
        ios_with_stats += x.fio.total_ios;
    }

    let irq_samples: Vec<&Vec<u64>> = s.iter().filter_map(|x| x.disk_irqs_per_cpu.as_ref()).collect();
    let disk_irqs_per_cpu = irq_samples.first().map(|first| {
        (0..first.len())
            .map(|cpu| {
                let v: Vec<f64> = irq_samples.iter().filter_map(|x| x.get(cpu)).map(|&n| n as f64).collect();
                median(&v).unwrap_or(0.0).round() as u64
            })
            .collect()
    });

    let mut disk_irq_chips: Vec<String> = Vec::new();
    for c in s.iter().flat_map(|x| &x.disk_irq_chips) {
        if !disk_irq_chips.contains(c) {
            disk_irq_chips.push(c.clone());
        }
    }

    Some(Summary {
        case: r.case,
        fio,
        repeats: s.len(),
        errors: r.errors.clone(),
        kick_to_run: hist,
        fio_vcpu_counters: counters,
        all_vcpu_counters: all_counters,
        ios_with_stats,
        disk_irqs_per_cpu,
        disk_irq_chips,
        stats_errors: s.iter().filter_map(|x| x.stats_error.clone()).collect(),
        hog_share: median(&s.iter().filter_map(|x| super::parse::hog_share(r.case.topology, x)).collect::<Vec<_>>()),
    })
}
