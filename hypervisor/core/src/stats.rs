//! Per-vCPU counters and latency histograms, and their stable text format.
//!
//! Why this exists: the project's claim is about *where* a woken vCPU's time
//! goes between the kick and the next schedule-in. Every figure the benchmark
//! harness reports is read back from the text this module prints, so the
//! format is part of the interface:
//!
//! ```text
//! vcpu1.wakes_interrupt=1234
//! vcpu1.preempt_wake=0
//! ...
//! vcpu1.kick_to_run_ns.count=1234
//! vcpu1.kick_to_run_ns.sum=6170000
//! vcpu1.kick_to_run_ns.min=5000
//! vcpu1.kick_to_run_ns.max=9000
//! vcpu1.kick_to_run_ns.bucket[4096,8192)=1200
//! vcpu1.kick_to_run_ns.bucket[8192,16384)=34
//! ```
//!
//! One `name=value` line per counter (always all of them, zero or not, in
//! [`Counters::NAMES`] order), then the histogram's summary lines and one line
//! per *non-empty* log2 bucket. [`parse_text`] reads it back; it skips lines
//! that do not start with `vcpuN.` (console noise) and counter names it does
//! not know (forward compatibility), and rejects malformed values.
//!
//! Ownership of the counters: the scheduler (`crate::sched`) updates wakes,
//! preemptions, deferrals, yields, migrations, schedule-ins, run time and the
//! kick→run histogram; the EL2 trap code updates injections, kicks and
//! WFI/WFE traps through `Scheduler::stats_mut`.

use alloc::collections::BTreeMap;
use core::fmt;

/// Number of log2 buckets: bucket 0 is `[0,1)`, bucket `k` (1..=62) is
/// `[2^(k-1), 2^k)`, bucket 63 is `[2^62, u64::MAX]`.
pub const NR_BUCKETS: usize = 64;

/// A histogram of nanosecond values in power-of-two buckets.
///
/// Recording is O(1) and allocation-free so it can run in the scheduler's
/// hot path; percentiles are estimated by linear interpolation inside the
/// bucket (and clamped to the exact min/max), i.e. within a factor of two.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Log2Histogram {
    buckets: [u64; NR_BUCKETS],
    count: u64,
    sum: u64,
    min: u64,
    max: u64,
}

impl Default for Log2Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Log2Histogram {
    pub const fn new() -> Self {
        Self { buckets: [0; NR_BUCKETS], count: 0, sum: 0, min: u64::MAX, max: 0 }
    }

    /// The bucket index a value falls into.
    pub fn bucket_of(v: u64) -> usize {
        if v == 0 {
            0
        } else {
            core::cmp::min(NR_BUCKETS - 1, 64 - v.leading_zeros() as usize)
        }
    }

    /// `[lo, hi)` of bucket `i` (the last bucket's `hi` is `u64::MAX`, inclusive).
    pub fn bucket_range(i: usize) -> Option<(u64, u64)> {
        match i {
            0 => Some((0, 1)),
            1..=62 => Some((1u64 << (i - 1), 1u64 << i)),
            63 => Some((1u64 << 62, u64::MAX)),
            _ => None,
        }
    }

    pub fn record(&mut self, v: u64) {
        self.buckets[Self::bucket_of(v)] += 1;
        self.count += 1;
        self.sum = self.sum.saturating_add(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    pub fn count(&self) -> u64 {
        self.count
    }
    pub fn sum(&self) -> u64 {
        self.sum
    }
    /// Smallest recorded value, `None` when empty.
    pub fn min(&self) -> Option<u64> {
        (self.count > 0).then_some(self.min)
    }
    pub fn max(&self) -> Option<u64> {
        (self.count > 0).then_some(self.max)
    }
    pub fn bucket(&self, i: usize) -> u64 {
        self.buckets.get(i).copied().unwrap_or(0)
    }

    /// Estimated `num/den` quantile (e.g. `quantile(99, 100)` for p99),
    /// integer-only so it is usable at EL2 without touching FP registers.
    /// `None` when empty or `den == 0`.
    pub fn quantile(&self, num: u64, den: u64) -> Option<u64> {
        if self.count == 0 || den == 0 {
            return None;
        }
        let num = num.min(den);
        // Rank of the wanted sample, 1-based, rounded up.
        let rank = (self.count as u128 * num as u128).div_ceil(den as u128).max(1) as u64;
        let mut seen = 0u64;
        for (i, &n) in self.buckets.iter().enumerate() {
            if n == 0 {
                continue;
            }
            if seen + n >= rank {
                let (lo, hi) = Self::bucket_range(i)?;
                let lo = lo.max(self.min);
                let hi = hi.min(self.max.saturating_add(1)).max(lo);
                if rank == 1 {
                    return Some(self.min);
                }
                if rank == self.count {
                    return Some(self.max);
                }
                // Samples assumed evenly spread: the midpoint of the rank's share.
                let into = (rank - seen) as u128; // 1..=n
                let est = lo as u128 + (hi - lo) as u128 * (2 * into - 1) / (2 * n as u128);
                return Some((est as u64).clamp(self.min, self.max));
            }
            seen += n;
        }
        Some(self.max)
    }

    /// Merge another histogram into this one.
    pub fn merge(&mut self, other: &Self) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += *b;
        }
        self.count += other.count;
        self.sum = self.sum.saturating_add(other.sum);
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }
}

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// Plain event counters of one vCPU. Field names are the text names.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct Counters {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        impl Counters {
            /// Every counter name, in the order they are printed.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            pub fn get(&self, name: &str) -> Option<u64> {
                match name {
                    $(stringify!($name) => Some(self.$name),)*
                    _ => None,
                }
            }

            pub fn get_mut(&mut self, name: &str) -> Option<&mut u64> {
                match name {
                    $(stringify!($name) => Some(&mut self.$name),)*
                    _ => None,
                }
            }
        }
    };
}

counters! {
    /// Woken from blocked by a virtual SPI/PPI/LPI.
    wakes_interrupt,
    /// Woken from blocked by a vSGI.
    wakes_sgi,
    /// Woken from blocked by its virtual timer deadline.
    wakes_timer,
    /// Woken from blocked by a GICv4 doorbell.
    wakes_doorbell,
    /// Wake requests for a vCPU that was already runnable or running.
    wakes_noop,
    /// Virtual interrupts injected (EL2 trap code).
    irqs_injected,
    /// Guest LPIs made pending from host LPIs (MSIs of passthrough devices, EL2 trap code).
    lpis_injected,
    /// Kicks sent to this vCPU (EL2 trap code: IPIs / reschedule requests).
    kicks,
    /// GICv4 doorbells of this vCPU's vPE that found it blocked and woke it (EL2 trap code).
    doorbells,
    /// Doorbells that found the vCPU runnable but descheduled: expected under GICv4.0, no wake (EL2 trap code).
    doorbells_runnable,
    /// Doorbells that found the vCPU running or offline: nothing to do (EL2 trap code).
    doorbells_spurious,
    /// Times its vPE was made resident or non-resident (EL2 trap code).
    vpe_residency_switches,
    /// VMOVPs of its vPE to the pCPU it runs on (EL2 trap code).
    vmovps,
    /// WFI traps (EL2 trap code).
    wfi_traps,
    /// WFE traps (EL2 trap code).
    wfe_traps,
    /// Yields because sampling found it spinning with IRQs masked, WFE not trapping (EL2 trap code, `sched::spin`).
    spin_yields,
    /// Times this vCPU was preempted by a woken vCPU.
    preempt_wake,
    /// Times this vCPU was preempted at the end of its slice (timer/credit).
    preempt_slice,
    /// Times this vCPU yielded (WFE, directed or not).
    yields,
    /// Wakes of this vCPU that landed inside the runner's ratelimit window and did not preempt.
    ratelimit_deferrals,
    /// Wake-preemptions of this vCPU deferred by the lock-holder grace period.
    lhp_deferrals,
    /// Wake-preemptions by this vCPU deferred by the runner's protected minimum run.
    min_run_deferrals,
    /// Times this vCPU was put on a pCPU (switch-ins, not continuations).
    schedule_ins,
    /// Moves between pCPU runqueues.
    migrations,
    /// Nanoseconds of pCPU time consumed.
    run_ns,
    /// Guest exits of any kind (EL2 trap code, from here on).
    exits,
    /// Exits for a physical interrupt.
    irq_exits,
    /// IRQ exits that delivered a guest MSI (took its host LPI or a GICv4 doorbell): interrupt delivery's share.
    irq_exits_msi,
    /// Emulated MMIO accesses.
    mmio,
    /// HVC calls.
    hvc,
    /// SMC calls (trapped).
    smc,
    /// Trapped system-register accesses.
    sysreg,
    /// vSGIs this vCPU sent.
    sgis_sent,
    /// HVC/SMC calls answered with SMCCC NOT_SUPPORTED.
    unsupported_calls,
    /// Synchronous external aborts injected for bad accesses.
    aborts_injected,
    /// Undefined-instruction exceptions injected.
    undef_injected,
    /// Debug-register accesses emulated (trapped by MDCR_EL2.TDA/TDOSA/TDRA),
    /// counting the ones that gave the vCPU the breakpoint and watchpoint
    /// registers.
    debug_emulated,
    /// PMU accesses that trapped to load the vCPU's PMU registers
    /// (`crate::vpmu`: the first access after a switch-in that left them
    /// saved).
    pmu_loads,
    /// Physical SErrors the vCPU caused (taken from it or pending at its
    /// exit), reflected to it as virtual SErrors.
    serrors,
}

/// Everything recorded for one vCPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VcpuStats {
    pub counters: Counters,
    /// Wake (kick) → the `schedule()` that picks the vCPU, in ns.
    pub kick_to_run_ns: Log2Histogram,
}

const HIST: &str = "kick_to_run_ns";

impl VcpuStats {
    /// Write this vCPU's lines in the stable text format.
    pub fn write_text(&self, vcpu: u32, out: &mut dyn fmt::Write) -> fmt::Result {
        for name in Counters::NAMES {
            writeln!(out, "vcpu{vcpu}.{name}={}", self.counters.get(name).unwrap_or(0))?;
        }
        let h = &self.kick_to_run_ns;
        writeln!(out, "vcpu{vcpu}.{HIST}.count={}", h.count())?;
        writeln!(out, "vcpu{vcpu}.{HIST}.sum={}", h.sum())?;
        writeln!(out, "vcpu{vcpu}.{HIST}.min={}", h.min().unwrap_or(0))?;
        writeln!(out, "vcpu{vcpu}.{HIST}.max={}", h.max().unwrap_or(0))?;
        for i in 0..NR_BUCKETS {
            let n = h.bucket(i);
            if n != 0 {
                if let Some((lo, hi)) = Log2Histogram::bucket_range(i) {
                    writeln!(out, "vcpu{vcpu}.{HIST}.bucket[{lo},{hi})={n}")?;
                }
            }
        }
        Ok(())
    }
}

/// Why a stats text did not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseErrorKind {
    /// `vcpuN` where N is not a number.
    BadVcpu,
    /// Missing `=` or a value that is not a u64.
    BadValue,
    /// A bucket whose bounds are not a log2 bucket.
    BadBucket,
    /// `count` disagrees with the bucket total.
    CountMismatch,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number (0 for whole-text checks).
    pub line: usize,
    pub kind: ParseErrorKind,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stats text line {}: {:?}", self.line, self.kind)
    }
}

/// Parse the text written by [`VcpuStats::write_text`] (several vCPUs may
/// be concatenated and interleaved with other console lines).
pub fn parse_text(text: &str) -> Result<BTreeMap<u32, VcpuStats>, ParseError> {
    let mut out: BTreeMap<u32, VcpuStats> = BTreeMap::new();
    // Summary lines seen per vCPU: (count, min, max).
    let mut summary: BTreeMap<u32, (u64, u64, u64)> = BTreeMap::new();
    for (idx, raw) in text.lines().enumerate() {
        let line_no = idx + 1;
        let err = |kind| ParseError { line: line_no, kind };
        let line = raw.trim();
        let Some(rest) = line.strip_prefix("vcpu") else { continue };
        let Some((id, rest)) = rest.split_once('.') else { continue };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            continue; // e.g. "vcpus: 2" on the console
        }
        let id: u32 = id.parse().map_err(|_| err(ParseErrorKind::BadVcpu))?;
        let (key, value) = rest.rsplit_once('=').ok_or(err(ParseErrorKind::BadValue))?;
        let value: u64 = value.trim().parse().map_err(|_| err(ParseErrorKind::BadValue))?;
        let st = out.entry(id).or_default();
        if let Some(h) = key.strip_prefix(HIST).and_then(|k| k.strip_prefix('.')) {
            let s = summary.entry(id).or_insert((0, 0, 0));
            match h {
                "count" => s.0 = value,
                "sum" => st.kick_to_run_ns.sum = value,
                "min" => s.1 = value,
                "max" => s.2 = value,
                _ => {
                    let b = h
                        .strip_prefix("bucket[")
                        .and_then(|b| b.strip_suffix(')'))
                        .and_then(|b| b.split_once(','))
                        .ok_or(err(ParseErrorKind::BadBucket))?;
                    let lo: u64 = b.0.parse().map_err(|_| err(ParseErrorKind::BadBucket))?;
                    let hi: u64 = b.1.parse().map_err(|_| err(ParseErrorKind::BadBucket))?;
                    let i = Log2Histogram::bucket_of(lo);
                    if Log2Histogram::bucket_range(i) != Some((lo, hi)) {
                        return Err(err(ParseErrorKind::BadBucket));
                    }
                    st.kick_to_run_ns.buckets[i] = value;
                }
            }
        } else if let Some(c) = st.counters.get_mut(key) {
            *c = value;
        }
    }
    for (id, st) in out.iter_mut() {
        let (count, min, max) = summary.get(id).copied().unwrap_or((0, 0, 0));
        let h = &mut st.kick_to_run_ns;
        let total: u64 = h.buckets.iter().sum();
        if total != count {
            return Err(ParseError { line: 0, kind: ParseErrorKind::CountMismatch });
        }
        h.count = count;
        if count > 0 {
            h.min = min;
            h.max = max;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::String;

    #[test]
    fn buckets_cover_u64() {
        assert_eq!(Log2Histogram::bucket_of(0), 0);
        assert_eq!(Log2Histogram::bucket_of(1), 1);
        assert_eq!(Log2Histogram::bucket_of(2), 2);
        assert_eq!(Log2Histogram::bucket_of(3), 2);
        assert_eq!(Log2Histogram::bucket_of(1024), 11);
        assert_eq!(Log2Histogram::bucket_of(u64::MAX), 63);
        for v in [0u64, 1, 5, 1000, 123_456_789, 1 << 62, u64::MAX] {
            let (lo, hi) = Log2Histogram::bucket_range(Log2Histogram::bucket_of(v)).unwrap();
            assert!(lo <= v && (v < hi || hi == u64::MAX), "{v} not in [{lo},{hi})");
        }
    }

    #[test]
    fn quantiles_are_within_a_bucket() {
        let mut h = Log2Histogram::new();
        assert_eq!(h.quantile(50, 100), None);
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(50, 100).unwrap();
        assert!((250_000..=1_000_000).contains(&p50), "{p50}");
        let p99 = h.quantile(99, 100).unwrap();
        assert!((524_288..=1_000_000).contains(&p99), "{p99}");
        assert_eq!(h.quantile(100, 100), Some(1_000_000));
        assert_eq!(h.quantile(0, 100), Some(1000));
        let mut one = Log2Histogram::new();
        one.record(5000);
        assert_eq!(one.quantile(99, 100), Some(5000));
    }

    #[test]
    fn text_round_trip() {
        let mut a = VcpuStats::default();
        a.counters.wakes_sgi = 7;
        a.counters.run_ns = 123;
        for v in [0, 3, 5000, 5100, 1 << 40] {
            a.kick_to_run_ns.record(v);
        }
        let b = VcpuStats::default();
        let mut s = String::from("boot noise\nvcpus: 2\n");
        a.write_text(0, &mut s).unwrap();
        b.write_text(12, &mut s).unwrap();
        assert!(s.contains("vcpu0.wakes_sgi=7\n"));
        assert!(s.contains("vcpu0.kick_to_run_ns.bucket[4096,8192)=2\n"));
        let parsed = parse_text(&s).unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[&0], a);
        assert_eq!(parsed[&12], b);
    }

    #[test]
    fn parse_rejects_garbage() {
        assert_eq!(parse_text("vcpu0.kicks=x").unwrap_err().kind, ParseErrorKind::BadValue);
        assert_eq!(parse_text("vcpu0.kick_to_run_ns.bucket[3,8)=1").unwrap_err().kind, ParseErrorKind::BadBucket);
        assert_eq!(
            parse_text("vcpu0.kick_to_run_ns.count=2\nvcpu0.kick_to_run_ns.bucket[4,8)=1").unwrap_err().kind,
            ParseErrorKind::CountMismatch
        );
        // Unknown counters are skipped for forward compatibility.
        assert!(parse_text("vcpu0.new_counter=3").is_ok());
    }
}
