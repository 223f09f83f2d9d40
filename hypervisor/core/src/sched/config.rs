//! Scheduler configuration: [`SchedConfig`], its defaults, and the boot
//! arguments it is parsed from.
//!
//! Contract: every `SchedConfig` a [`Scheduler`](super::Scheduler) runs with
//! has passed `validate` (min slice ≥ [`MIN_TIMER_NS`], max slice ≥ min
//! slice, the granularity and the max slice fit an `i64` of credit), so the
//! policies may convert those times to credit without overflow checks. The
//! parsers ignore words that are not theirs and answer a malformed value of
//! one of theirs with an error naming the key; nothing is half-applied.

use super::{domain, SchedError, VcpuId, MIN_TIMER_NS};

/// What happens when a blocked vCPU wakes while another one runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakeMode {
    /// Credit2's `runq_tickle`: no preemption inside the ratelimit window, no timer re-arm.
    XenCompat,
    /// Immediate preempt-on-wake; bounded deferral otherwise.
    Preempt,
}

/// How pCPUs are grouped into Credit2 runqueues (`credit2_runqueue=`).
/// Every layout but `cpu` groups the pCPUs that share a core, socket or
/// NUMA node (`all`: every pCPU), split into runqueues of at most
/// `sched_credit2_max_cpus_runqueue` (16) pCPUs each, as Xen does. The
/// machines described to us carry no topology (one socket, one node, no
/// SMT), so `core`, `socket`, `node` and `all` mean the same set here; the
/// variant keeps the name the user gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunqueueLayout {
    /// `all`: every pCPU, in runqueues of at most the maximum.
    All,
    /// `socket` (Xen's default).
    Socket,
    /// `node`.
    Node,
    /// `core`.
    Core,
    /// One runqueue per pCPU (`cpu`), balanced by load.
    PerCpu,
}

impl RunqueueLayout {
    /// The option's value that names it.
    pub fn name(self) -> &'static str {
        match self {
            RunqueueLayout::All => "all",
            RunqueueLayout::Socket => "socket",
            RunqueueLayout::Node => "node",
            RunqueueLayout::Core => "core",
            RunqueueLayout::PerCpu => "cpu",
        }
    }
}

/// Most pCPUs in one runqueue (Xen's `MAX_CPUS_RUNQ`, and the default of
/// `sched_credit2_max_cpus_runqueue`): every wake, block and schedule on
/// one of them takes that runqueue's lock.
pub const MAX_CPUS_RUNQUEUE: usize = 16;

/// `sched_ratelimit_us`'s range other than 0 (off), in µs: Xen's
/// `XEN_SYSCTL_SCHED_RATELIMIT_MIN`/`_MAX`.
pub const RATELIMIT_US_RANGE: core::ops::RangeInclusive<u64> = 100..=500_000;

/// Credit2 options Xen 4.17 documents (`docs/misc/xen-command-line.pandoc`)
/// that this scheduler does not implement: named in a warning and ignored,
/// never taken silently.
pub const XEN_OPTIONS_NOT_IMPLEMENTED: &[&str] =
    &["credit2_balance_over", "credit2_balance_under", "credit2_load_precision_shift", "credit2_load_window_shift"];

/// The options [`SchedConfig::with_live`] changes while the machine runs.
pub const LIVE_OPTIONS: [&str; 8] = [
    "sched_wake_preempt",
    "sched_ratelimit_us",
    "sched_wake_granularity_us",
    "sched_lhp_grace_us",
    "sched_wake_min_run_us",
    "sched_min_slice_us",
    "sched_max_slice_us",
    "sched_credit2_migrate_resist",
];

/// Scheduler tunables. All times in ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedConfig {
    /// `sched_ratelimit_us` (0 = off).
    pub ratelimit_ns: u64,
    /// `sched_wake_preempt=on|off`.
    pub wake_mode: WakeMode,
    /// `sched_wake_granularity_us`: credit lead a woken vCPU needs to preempt.
    pub wake_granularity_ns: u64,
    pub min_slice_ns: u64,
    pub max_slice_ns: u64,
    /// `sched_lhp_grace_us`: the most a wake-preemption waits, in total, for
    /// a runner that shows evidence of a guest critical section (0 = off).
    pub lhp_grace_ns: u64,
    /// `sched_wake_min_run_us`: a vCPU that was preempted by a wake runs at
    /// least this long after it is switched back in before a wake can
    /// preempt it again (0 = off). Bounds wake-preemptions of any vCPU to
    /// one per this much of its run time.
    pub wake_min_run_ns: u64,
    /// `credit2_runqueue=cpu|core|socket|node|all`.
    pub runqueue: RunqueueLayout,
    /// `sched_credit2_max_cpus_runqueue` (1..=[`MAX_CPUS_RUNQUEUE`]).
    pub max_cpus_runqueue: usize,
    /// `sched_credit2_migrate_resist` (µs in the option): the credit lead a
    /// vCPU needs to be taken by a pCPU other than the one it last ran on.
    pub migrate_resist_ns: u64,
    /// `credit2_cap_period_ms`: capped domains' replenishment period.
    pub cap_period_ns: u64,
}

impl Default for SchedConfig {
    /// Xen's defaults plus our wake path. The granularity (100 µs) sits well
    /// below the 500 µs that separates two vCPUs' credits right after a reset
    /// (the carry-over cap), so a light I/O vCPU still preempts a hog then,
    /// and well above a context switch, so two wakers alternate at most once
    /// per 100 µs of run time. The LHP grace (40 µs) is the most a
    /// wake-preemption waits for a runner in a guest critical section; the
    /// simulator's lock-holder case pays it in full, as the hypervisor cannot
    /// see the guest unlock. The protected run (100 µs) bounds the
    /// wake-preemptions of a vCPU to 10 000 a second of its run time.
    /// The measurements behind each value: docs/benchmarks/scheduler-tuning.md.
    fn default() -> Self {
        Self {
            ratelimit_ns: 1_000_000,
            wake_mode: WakeMode::Preempt,
            wake_granularity_ns: 100_000,
            min_slice_ns: 500_000,
            max_slice_ns: 10_000_000,
            lhp_grace_ns: 40_000,
            wake_min_run_ns: 100_000,
            runqueue: RunqueueLayout::Socket,
            max_cpus_runqueue: MAX_CPUS_RUNQUEUE,
            migrate_resist_ns: 500_000,
            cap_period_ns: domain::CAP_PERIOD_NS,
        }
    }
}

impl SchedConfig {
    /// Xen-compatible configuration (`sched_wake_preempt=off`) with a ratelimit in µs.
    pub fn xen_compat(ratelimit_us: u64) -> Self {
        Self { ratelimit_ns: ratelimit_us * 1000, wake_mode: WakeMode::XenCompat, ..Self::default() }
    }

    /// The scheduler's options alone out of a command line (tests and the
    /// simulator; the hypervisor's one parser, `config::Config::parse` in
    /// hv-machine, hands each word to [`SchedConfig::set`] and checks the
    /// result with [`SchedConfig::validate`]). Unrelated words are ignored;
    /// a malformed value of one of ours is an error.
    pub fn from_bootargs(args: &str) -> Result<Self, SchedError> {
        let mut cfg = Self::default();
        for word in args.split_ascii_whitespace() {
            if let Some((key, val)) = word.split_once('=') {
                cfg.set(key, val)?;
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// One `key=value` option: `Ok(true)` when `key` is the scheduler's
    /// and `val` is valid, `Ok(false)` when `key` is not the scheduler's.
    /// Keys: `sched=credit2`, `sched_ratelimit_us=N` (0, or 100..=500000;
    /// as in Xen, a number outside that range is warned about and the
    /// default, 1000, used), `sched_wake_preempt=on|off`,
    /// `sched_wake_granularity_us=N`, `sched_lhp_grace_us=N`,
    /// `sched_wake_min_run_us=N`, `sched_min_slice_us=N`,
    /// `sched_max_slice_us=N`, `credit2_runqueue=cpu|core|socket|node|all`
    /// (see [`RunqueueLayout`]), `sched_credit2_max_cpus_runqueue=N`
    /// (1..=16; as in Xen, a larger value is warned about and 16 used),
    /// `sched_credit2_migrate_resist=US`, `credit2_cap_period_ms=N`
    /// (1..=10000). Xen's other Credit2 options
    /// ([`XEN_OPTIONS_NOT_IMPLEMENTED`]) are claimed, warned about and
    /// ignored. The values' combination is checked by
    /// [`SchedConfig::validate`] once all are set.
    pub fn set(&mut self, key: &str, val: &str) -> Result<bool, SchedError> {
        let us = |key: &'static str| -> Result<u64, SchedError> {
            val.parse::<u64>().ok().and_then(|v| v.checked_mul(1000)).ok_or(SchedError::BadBootArg(key))
        };
        match key {
            "sched" if val != "credit2" => return Err(SchedError::BadBootArg("sched")),
            "sched" => {}
            "sched_ratelimit_us" => {
                let v = us("sched_ratelimit_us")?;
                self.ratelimit_ns = if v == 0 || RATELIMIT_US_RANGE.contains(&(v / 1000)) {
                    v
                } else {
                    let default = Self::default().ratelimit_ns;
                    log::warn!(
                        "sched_ratelimit_us={val} is outside [{}, {}] (0 turns it off): using the default, {}",
                        RATELIMIT_US_RANGE.start(),
                        RATELIMIT_US_RANGE.end(),
                        default / 1000
                    );
                    default
                };
            }
            "sched_wake_preempt" => {
                self.wake_mode = match val {
                    "on" | "1" | "true" | "yes" => WakeMode::Preempt,
                    "off" | "0" | "false" | "no" => WakeMode::XenCompat,
                    _ => return Err(SchedError::BadBootArg("sched_wake_preempt")),
                }
            }
            "sched_wake_granularity_us" => self.wake_granularity_ns = us("sched_wake_granularity_us")?,
            "sched_lhp_grace_us" => self.lhp_grace_ns = us("sched_lhp_grace_us")?,
            "sched_wake_min_run_us" => self.wake_min_run_ns = us("sched_wake_min_run_us")?,
            "sched_min_slice_us" => self.min_slice_ns = us("sched_min_slice_us")?,
            "sched_max_slice_us" => self.max_slice_ns = us("sched_max_slice_us")?,
            "credit2_runqueue" => {
                self.runqueue = match val {
                    "all" => RunqueueLayout::All,
                    "socket" => RunqueueLayout::Socket,
                    "node" => RunqueueLayout::Node,
                    "core" => RunqueueLayout::Core,
                    "cpu" => RunqueueLayout::PerCpu,
                    _ => return Err(SchedError::BadBootArg("credit2_runqueue")),
                }
            }
            "sched_credit2_max_cpus_runqueue" => {
                let n = val.parse::<usize>().map_err(|_| SchedError::BadBootArg("sched_credit2_max_cpus_runqueue"))?;
                self.max_cpus_runqueue = if (1..=MAX_CPUS_RUNQUEUE).contains(&n) {
                    n
                } else {
                    log::warn!(
                        "sched_credit2_max_cpus_runqueue={val} is outside [1, {MAX_CPUS_RUNQUEUE}]: using {MAX_CPUS_RUNQUEUE}"
                    );
                    MAX_CPUS_RUNQUEUE
                };
            }
            "sched_credit2_migrate_resist" => self.migrate_resist_ns = us("sched_credit2_migrate_resist")?,
            "credit2_cap_period_ms" => {
                let ms = val.parse::<u64>().map_err(|_| SchedError::BadBootArg("credit2_cap_period_ms"))?;
                // As Xen: a period shorter than the minimum timer (500 µs),
                // i.e. 0 ms, is warned about and 10 ms used.
                self.cap_period_ns = if ms == 0 || ms > 10_000 {
                    log::warn!("credit2_cap_period_ms={val} is outside [1, 10000]: using 10");
                    domain::CAP_PERIOD_NS
                } else {
                    ms * 1_000_000
                };
            }
            k if XEN_OPTIONS_NOT_IMPLEMENTED.contains(&k) => {
                log::warn!("{k}={val}: this Xen Credit2 option is not implemented here; ignored");
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The value of one `sched_vcpu_weight=<vcpu>:<weight>` option (weight
    /// 1..=65535; the option repeats, one vCPU each). Our extension of
    /// Credit2, whose weights are per domain: the vCPU burns credit, and
    /// bounds the protected run of a vCPU it wake-preempts, as if its
    /// domain had that weight (see
    /// [`Scheduler::set_vcpu_weight`](super::Scheduler::set_vcpu_weight)).
    pub fn parse_vcpu_weight(val: &str) -> Result<(VcpuId, u32), SchedError> {
        let bad = SchedError::BadBootArg("sched_vcpu_weight");
        let (v, w) = val.split_once(':').ok_or(bad)?;
        let v = v.parse::<u32>().map_err(|_| bad)?;
        let w = w.parse::<u32>().map_err(|_| bad)?;
        if w == 0 || w > domain::MAX_WEIGHT {
            return Err(SchedError::BadWeight(w));
        }
        Ok((VcpuId(v), w))
    }

    /// Whether the options set agree with each other (slice bounds, the
    /// wake granularity's and the migration resistance's ranges, the
    /// runqueue size).
    pub fn validate(&self) -> Result<(), SchedError> {
        if self.min_slice_ns < MIN_TIMER_NS || self.max_slice_ns < self.min_slice_ns {
            return Err(SchedError::BadConfig);
        }
        if self.wake_granularity_ns > i64::MAX as u64 || self.max_slice_ns > i64::MAX as u64 {
            return Err(SchedError::BadConfig);
        }
        if self.migrate_resist_ns > i64::MAX as u64 / 2 || !(1..=MAX_CPUS_RUNQUEUE).contains(&self.max_cpus_runqueue) {
            return Err(SchedError::BadConfig);
        }
        Ok(())
    }

    /// How many runqueues `nr_pcpus` pCPUs form: one each with `cpu`, else
    /// as few as hold them at `max_cpus_runqueue` each (the scheduler
    /// spreads the pCPUs evenly over them).
    pub fn nr_runqueues(&self, nr_pcpus: usize) -> usize {
        match self.runqueue {
            RunqueueLayout::PerCpu => nr_pcpus,
            _ => nr_pcpus.div_ceil(self.max_cpus_runqueue.max(1)),
        }
    }

    /// This configuration with `key=val` set while the machine runs (`hvctl
    /// set`): only the [`LIVE_OPTIONS`], which every call reads afresh; the
    /// runqueue layout, their size and the cap period shape state built at
    /// boot and stay ([`SchedError::NotLive`]). A value outside its range
    /// is refused here, where at boot Xen warns and uses its default.
    pub fn with_live(&self, key: &str, val: &str) -> Result<SchedConfig, SchedError> {
        if !LIVE_OPTIONS.contains(&key) {
            let mut probe = *self;
            return Err(match probe.set(key, val) {
                Ok(true) | Err(_) => SchedError::NotLive,
                Ok(false) => SchedError::UnknownOption,
            });
        }
        let mut cfg = *self;
        cfg.set(key, val)?;
        if key == "sched_ratelimit_us" && cfg.ratelimit_ns / 1000 != val.parse::<u64>().unwrap_or(u64::MAX) {
            return Err(SchedError::BadBootArg("sched_ratelimit_us"));
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Whether our extensions of Credit2 run: with `sched_wake_preempt=off`
    /// the scheduler is Xen's Credit2 alone (no preempt-on-wake, no
    /// lock-holder grace or protected run, no directed yield or spin
    /// detection, no per-vCPU weights), the control group of every
    /// comparison with Xen.
    pub fn extensions(&self) -> bool {
        self.wake_mode == WakeMode::Preempt
    }
}
