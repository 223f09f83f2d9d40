//! Credit2-compatible vCPU scheduler with an immediate preempt-on-wake path.
//!
//! # Why
//! On Xen's Credit2 with one pCPU, a CPU-hog vCPU and an I/O vCPU, a device
//! completion that wakes the I/O vCPU inside the hog's ratelimit window
//! neither preempts the hog nor shortens its timer, so the I/O vCPU waits out
//! the rest of a slice of up to 10 ms (~100 IOPS, p99 ~10 ms). We keep the
//! Credit2 model, so figures stay comparable with Xen, and fix the wake path.
//!
//! # Model (Credit2 semantics)
//! * Every vCPU belongs to a domain ([`DomainId`], Dom0 = 0) whose weight
//!   each of its vCPUs carries (not split between them) and which may be
//!   capped (below).
//! * Credit is nanoseconds. A running vCPU burns `elapsed * max_weight /
//!   weight` (default weight 256; `max_weight` is the largest of its
//!   runqueue), the division's remainder carried to the next burn (Credit2's
//!   `residual`), so heavier domains burn slower and short runs lose nothing.
//! * pCPUs share Credit2 runqueues sorted by credit (highest first, FIFO on
//!   ties): by default one for all pCPUs (`credit2_runqueue=all`, what Xen's
//!   default `socket` gives on a one-socket machine such as QEMU `virt`), or
//!   one per pCPU (`credit2_runqueue=cpu`). A pCPU runs whichever of
//!   {current vCPU, first queued vCPU allowed on it} has more credit.
//! * Reset: when the best candidate of a runqueue — the picked vCPU or the
//!   runqueue's head, whichever has more credit — has credit ≤ 0, every
//!   online vCPU of that runqueue (only that one) gets `CREDIT_INIT` (10 ms)
//!   added — several times if the picked one is deeper than -10 ms — and is
//!   capped at `CREDIT_INIT + CARRYOVER_MAX`: what it had left carries over up
//!   to 500 µs. Counted per runqueue ([`Scheduler::runqueue_resets`]) and per
//!   domain ([`DomainStats::credit_resets`]).
//! * Slice: run until the picked vCPU's credit would fall to the next
//!   waiter's (or to 0 if nobody waits), clamped to
//!   `[max(min_slice, rest of ratelimit window), max_slice]`, and then to a
//!   capped vCPU's budget.
//! * Ratelimit: a runnable vCPU that has run less than `ratelimit` since it
//!   was switched in keeps the pCPU at a `schedule()` unless it yields (or
//!   its domain's budget is used up).
//! * Hard affinity pins a vCPU to one pCPU. Unpinned vCPUs are placed on an
//!   idle pCPU when they wake if one exists, else on the pCPU whose runner has
//!   the least credit (that pCPU is asked to reschedule, but whichever of the
//!   runqueue's pCPUs schedules first may take it). Within a runqueue any of
//!   its pCPUs picks any queued vCPU, so one shared runqueue needs no
//!   balancing; `schedule()` asks (through [`Decision::kick`]) an idle
//!   pCPU to come and pick when work is left queued. With several runqueues,
//!   `schedule()` also pulls one vCPU from a runqueue ≥ 2 longer, or a
//!   remote waiter richer by > 500 µs (migrate resist); their credits are
//!   reset apart, so that layout balances load, not exact weights.
//!
//! # Domains, weights and caps ([`DomainParams`])
//! `add_domain(dom, DomainParams { weight, cap_percent })` first, then
//! `add_vcpu(vcpu, dom, affinity)` (vCPU ids are unique across domains);
//! `set_domain_params(now, dom, …)` changes weight and cap at run time;
//! `domain_of`, `domain_stats` (run time, credit resets, cap parks,
//! replenishments). Weights are 1..=65535; a cap is 1..=100 × nr_pcpus
//! percent of one pCPU. Bad values, unknown or duplicate ids are
//! [`SchedError`]s and change nothing. Caps are Credit2's: a capped domain
//! has a budget of `cap% × CAP_PERIOD_NS` (10 ms) per period, one pCPU's
//! worth per 100 %, replenished every period (periods counted from time 0
//! of the caller's clock; the pool never holds more than one period's, an
//! overrun is paid from the next). Its running vCPUs draw it in quotas of
//! the period's budget / nr_vcpus (≥ 500 µs) and give back what is left
//! when switched out; a vCPU with none is *parked* (runnable, off the
//! runqueues; [`Scheduler::is_parked`]) until a replenishment or a sibling's
//! give-back. A parked vCPU's wake is a no-op, and a blocked vCPU woken
//! while its domain has no budget is parked at once: it preempts nobody
//! and the answer re-arms a timer to the replenishment. While a vCPU is
//! parked every pCPU's timer is no later than its replenishment, so
//! unparking happens at a `schedule()` at that time. One difference from
//! Credit2: the budget bounds a slice hard, after the min slice and the
//! ratelimit (Credit2 lets its minimum timer overrun the budget and charges
//! the debt to the next period), so a capped domain gets its exact share
//! in every period.

//! # Wake paths ([`WakeMode`])
//! * [`WakeMode::XenCompat`] reproduces `runq_tickle`: a busy pCPU whose
//!   runner ran less than `ratelimit - 50 µs` is not tickled; otherwise it is
//!   tickled when the woken vCPU has more credit. Nothing re-arms the
//!   runner's timer. This is the control group and must show the collapse.
//! * [`WakeMode::Preempt`] (default): a vCPU woken from blocked state whose
//!   credit exceeds the runner's by more than `wake_granularity` preempts it
//!   at once, ratelimit or not ([`WakeAction::Reschedule`]; an IPI when the
//!   pCPU is remote), unless the runner is in a lock-holder grace or a
//!   protected run (below), which defer it. A wake that does not preempt
//!   re-arms the runner's timer to the end of its ratelimit window (never
//!   later than the timer it had); a waker heavier than the runner (its
//!   own weight, [`Scheduler::set_vcpu_weight`]) instead catches up: it
//!   preempts as soon as the runner's burn puts it ahead by the granularity.
//!   The granularity stops two waking vCPUs from ping-ponging; credit burn
//!   keeps a vCPU that wakes very often from getting more than its share.
//!
//! # Lock-holder preemption
//! Preempting a vCPU at its SGI/MMIO trap can preempt a guest lock holder
//! (the guest's virtqueue lock, measured on Xen with ratelimit 0: submission
//! latency ~20 ms). Two defences, both for [`WakeMode::Preempt`] only:
//! * [`Scheduler::note_critical_exit`]: the SGI-send trap passes what it saw
//!   of the guest ([`CritEvidence`]). Only evidence of a critical section —
//!   trapped from EL1 with IRQs masked, which is how Linux holds its
//!   runqueue and `irqsave` locks, and where it sends wake-up IPIs — opens a
//!   grace: a wake-preemption of the runner is deferred
//!   ([`WakeAction::RearmTimer`]) to at most `lhp_grace` after that exit.
//!   The grace is capped per pending preemption, not per trap: it never
//!   runs past `lhp_grace` after the wake that asked for the preemption (or
//!   after the protected run that deferred it, see below: a runner
//!   preempted at the end of that run may be in a critical section it
//!   entered meanwhile), however many critical exits follow, so a vCPU that
//!   keeps writing the SGI register cannot hold a woken vCPU off for longer.
//!   It ends early at the runner's next exit that shows no evidence (the
//!   trap code reports every exit while a grace is open; the timer that
//!   ends the grace is such an exit anyway). The hypervisor cannot see the
//!   guest unmask IRQs without an exit, so a holder that unmasks and runs on
//!   keeps the rest of the grace.
//! * [`Scheduler::yield_to`]: on a WFE trap (a spinning guest) the vCPU
//!   yields, directed at a preempted sibling (see [`Scheduler::is_preempted`])
//!   which is then run next on this pCPU if its affinity allows, for a
//!   grace-long "loan" after which the ratelimit does not hold the yielder off.
//!   Where WFE does not trap (QEMU's TCG), [`spin::SpinDetector`] finds the
//!   spinner by sampling its PC instead, and the run loop yields it the same way.
//!
//! # Preemption-rate bound
//! A vCPU that was descheduled by a wake-preemption gets a protected run of
//! `wake_min_run` (`sched_wake_min_run_us`) when it is switched back in: a
//! wake-preemption of it is deferred to the end of that run (a
//! [`WakeAction::RearmTimer`], counted as `min_run_deferrals`). So no vCPU is
//! wake-preempted more than once per `wake_min_run` of its own run time
//! (≤ 10 000 times a second at the 100 µs default), and a vCPU that wakes
//! every few µs cannot chop a CPU-bound one into slices smaller than that;
//! the wake→run latency this costs the waker is at most `wake_min_run`
//! (plus a grace, if the runner is in a critical section when it ends). We
//! protect only vCPUs that were wake-preempted, rather than every runner
//! that has just been switched in, so the common case — a woken I/O vCPU
//! preempting a hog that got the pCPU at a slice end or by its own wake —
//! keeps its immediate preemption. A waker whose weight exceeds the
//! runner's (per-vCPU weights, [`Scheduler::set_vcpu_weight`]) cuts the
//! runner's protected run to `wake_min_run × w_runner / w_waker`: it is
//! entitled to that much more of the pCPU, and so to that many more
//! preemptions of it; equal weights keep the full bound. (The bound is
//! not lifted on evidence of a light waker: cyclictest `-i50`, which it
//! delays, and the fast waker it exists for — wakes every 50 µs, runs a
//! few µs — both use well under their share, so no demand test tells
//! them apart; timer-tail.md has the figures.) The context switch costs (a few µs of
//! EL2 work each) fall inside the switched-in vCPU's run time, as the clock
//! starts at `schedule()`; the simulator models them that way.
//!
//! # Driving it
//! Pure logic over the caller's clock (ns, monotonic); no globals, no arch
//! code, no panics (errors are [`SchedError`]). The EL2 code calls, per pCPU:
//! `wake` on a virtual interrupt/vSGI/vtimer/doorbell for a vCPU; `block` on a
//! WFI with nothing pending; `yield_to` on WFE; `note_critical_exit` on an SGI
//! trap (with the evidence) and on any exit while a grace is open (without
//! it, if it is gone); then `schedule` whenever a [`WakeAction`] or the pCPU's
//! scheduling timer says so, switching to [`Decision::next`] and arming the
//! timer at [`Decision::timer_at`]. `sim` runs exactly this on a virtual clock.

pub mod domain;
pub mod sim;
pub mod spin;
#[cfg(test)]
mod tests;

use domain::Domain;
pub use domain::{DomainId, DomainParams, DomainStats, CAP_PERIOD_NS};

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::fmt;

use crate::stats::VcpuStats;

/// Credit given at a reset, ns (Credit2's CSCHED2_CREDIT_INIT).
pub const CREDIT_INIT_NS: i64 = 10_000_000;
/// Credit a vCPU may carry over a reset (Credit2: the minimum timer).
pub const CARRYOVER_MAX_NS: i64 = 500_000;
/// Credit2's ratelimit tolerance in `runq_tickle`.
pub const RATELIMIT_TOLERANCE_NS: u64 = 50_000;
/// Default domain weight (`dom0_weight`).
pub const DEFAULT_WEIGHT: u32 = 256;
/// Credit lead a remote waiter needs to be pulled to another pCPU (Credit2's migrate resist).
pub const MIGRATE_RESIST_NS: i64 = 500_000;
/// Shortest timer the scheduler ever asks for, so a caller loop always progresses.
pub const MIN_TIMER_NS: u64 = 1_000;

/// What happens when a blocked vCPU wakes while another one runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakeMode {
    /// Credit2's `runq_tickle`: no preemption inside the ratelimit window, no timer re-arm.
    XenCompat,
    /// Immediate preempt-on-wake; bounded deferral otherwise.
    Preempt,
}

/// How pCPUs are grouped into Credit2 runqueues (`credit2_runqueue=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunqueueLayout {
    /// One runqueue shared by all pCPUs (`all`; what Xen's default,
    /// `socket`, gives on a one-socket machine such as QEMU `virt`).
    All,
    /// One runqueue per pCPU (`cpu`), balanced by load.
    PerCpu,
}

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
    /// `credit2_runqueue=all|cpu`.
    pub runqueue: RunqueueLayout,
}

impl Default for SchedConfig {
    /// Xen's defaults plus our wake path. The granularity default (100 µs)
    /// sits well below the 500 µs that separates two vCPUs' credits right
    /// after a reset (carry-over cap), so a light I/O vCPU still preempts a
    /// hog then, and well above a context switch, so two wakers alternate at
    /// most once per 100 µs of run time. Swept with
    /// `cargo xtask sim wakeup --granularity-us N`: 1p2v results are identical
    /// for 0–600 µs and degrade from 1000 µs (p99 805 µs, -7% IOPS).
    /// The LHP grace (40 µs) is what a wake-preempt of a vCPU in a critical
    /// exit may wait; the simulator's lock-holder case pays it in full since
    /// the hypervisor cannot see the guest unlock. Chosen by measurement in
    /// a Linux guest (`cargo xtask bench wakeup --quick --only "1p2v unp"
    /// --hv-args sched_lhp_grace_us=N`, fio beside a hog, RAM disk 200 µs,
    /// icount): 0 and 10 µs collapse to ~410 IOPS, p99 2.8 ms (the IPI
    /// sender is preempted holding the woken CPU's runqueue lock); 20 and
    /// 30 µs still show lock-holder stalls in p99.9 (7.1 / 2.6 ms); 40 µs
    /// gives 3250 IOPS (0.93× of fio alone), p99.9 354 µs; 50 µs 3123.
    /// (That sweep predates the evidence and the per-wake cap; in that
    /// workload every waking IPI is sent with IRQs masked, so it still holds.)
    /// The protected run (100 µs) is the smallest that holds a fast waker to
    /// ≤ 10 000 wake-preemptions of a hog a second (simulator: waker every
    /// 50 µs, 5 µs switches → 9 090/s, hog 86%, waker p99 55 µs) and the
    /// largest that leaves the same Linux benchmark untouched (`--hv-args
    /// sched_wake_min_run_us=N`: 0/50/100 µs → 3250/3249/3250 IOPS, p99
    /// 334/346/330 µs; 150 → 3190, 432 µs; 200 → 3080, 490 µs).
    fn default() -> Self {
        Self {
            ratelimit_ns: 1_000_000,
            wake_mode: WakeMode::Preempt,
            wake_granularity_ns: 100_000,
            min_slice_ns: 500_000,
            max_slice_ns: 10_000_000,
            lhp_grace_ns: 40_000,
            wake_min_run_ns: 100_000,
            runqueue: RunqueueLayout::All,
        }
    }
}

impl SchedConfig {
    /// Xen-compatible configuration (`sched_wake_preempt=off`) with a ratelimit in µs.
    pub fn xen_compat(ratelimit_us: u64) -> Self {
        Self { ratelimit_ns: ratelimit_us * 1000, wake_mode: WakeMode::XenCompat, ..Self::default() }
    }

    /// Parse the scheduler's options out of `/chosen/bootargs`. Unrelated
    /// words are ignored; a malformed value of one of ours is an error.
    /// Keys: `sched=credit2`, `sched_ratelimit_us=N` (0, or 100..=500000 as
    /// in Xen), `sched_wake_preempt=on|off`, `sched_wake_granularity_us=N`,
    /// `sched_lhp_grace_us=N`, `sched_wake_min_run_us=N`, `sched_min_slice_us=N`,
    /// `sched_max_slice_us=N`, `credit2_runqueue=all|cpu` (Xen's `socket`
    /// and `node` mean `all` here: one socket).
    pub fn from_bootargs(args: &str) -> Result<Self, SchedError> {
        let mut cfg = Self::default();
        for word in args.split_ascii_whitespace() {
            let Some((key, val)) = word.split_once('=') else { continue };
            let us = |key: &'static str| -> Result<u64, SchedError> {
                val.parse::<u64>().ok().and_then(|v| v.checked_mul(1000)).ok_or(SchedError::BadBootArg(key))
            };
            match key {
                "sched" if val != "credit2" => {
                    return Err(SchedError::BadBootArg("sched"));
                }
                "sched_ratelimit_us" => {
                    let v = us("sched_ratelimit_us")?;
                    if v != 0 && !(100_000..=500_000_000).contains(&v) {
                        return Err(SchedError::BadBootArg("sched_ratelimit_us"));
                    }
                    cfg.ratelimit_ns = v;
                }
                "sched_wake_preempt" => {
                    cfg.wake_mode = match val {
                        "on" | "1" | "true" | "yes" => WakeMode::Preempt,
                        "off" | "0" | "false" | "no" => WakeMode::XenCompat,
                        _ => return Err(SchedError::BadBootArg("sched_wake_preempt")),
                    }
                }
                "sched_wake_granularity_us" => cfg.wake_granularity_ns = us("sched_wake_granularity_us")?,
                "sched_lhp_grace_us" => cfg.lhp_grace_ns = us("sched_lhp_grace_us")?,
                "sched_wake_min_run_us" => cfg.wake_min_run_ns = us("sched_wake_min_run_us")?,
                "sched_min_slice_us" => cfg.min_slice_ns = us("sched_min_slice_us")?,
                "sched_max_slice_us" => cfg.max_slice_ns = us("sched_max_slice_us")?,
                "credit2_runqueue" => {
                    cfg.runqueue = match val {
                        "all" | "socket" | "node" => RunqueueLayout::All,
                        "cpu" => RunqueueLayout::PerCpu,
                        _ => return Err(SchedError::BadBootArg("credit2_runqueue")),
                    }
                }
                _ => {}
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// The per-vCPU weights of `/chosen/bootargs`: every
    /// `sched_vcpu_weight=<vcpu>:<weight>` word (repeatable; weight 1..=65535),
    /// in order. Our extension of Credit2, whose weights are per domain: the
    /// vCPU burns credit, and bounds the protected run of a vCPU it
    /// wake-preempts, as if its domain had that weight (see
    /// [`Scheduler::set_vcpu_weight`]). A malformed word is an error.
    pub fn vcpu_weights_from_bootargs(args: &str) -> Result<Vec<(VcpuId, u32)>, SchedError> {
        let mut out = Vec::new();
        for word in args.split_ascii_whitespace() {
            let Some(val) = word.strip_prefix("sched_vcpu_weight=") else { continue };
            let bad = SchedError::BadBootArg("sched_vcpu_weight");
            let (v, w) = val.split_once(':').ok_or(bad)?;
            let v = v.parse::<u32>().map_err(|_| bad)?;
            let w = w.parse::<u32>().map_err(|_| bad)?;
            if w == 0 || w > domain::MAX_WEIGHT {
                return Err(SchedError::BadWeight(w));
            }
            out.push((VcpuId(v), w));
        }
        Ok(out)
    }

    fn validate(&self) -> Result<(), SchedError> {
        if self.min_slice_ns < MIN_TIMER_NS || self.max_slice_ns < self.min_slice_ns {
            return Err(SchedError::BadConfig);
        }
        if self.wake_granularity_ns > i64::MAX as u64 || self.max_slice_ns > i64::MAX as u64 {
            return Err(SchedError::BadConfig);
        }
        Ok(())
    }
}

/// A vCPU's identity, chosen by the caller (unique across VMs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VcpuId(pub u32);

impl fmt::Display for VcpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vcpu{}", self.0)
    }
}

/// Why a vCPU is being woken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakeCause {
    /// A virtual SPI/PPI/LPI became pending.
    Interrupt,
    /// A vSGI from another vCPU.
    Sgi,
    /// Its virtual timer deadline passed.
    Timer,
    /// A GICv4 doorbell.
    Doorbell,
}

/// What the trap code saw of the running vCPU at an exit, as evidence that
/// the guest is inside a short critical section (see
/// [`Scheduler::note_critical_exit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CritEvidence {
    /// Trapped from EL1 with IRQs masked: Linux holds its runqueue locks and
    /// every `spin_lock_irqsave` lock with IRQs off, so this is where a lock
    /// holder sends its wake-up IPIs.
    IrqsMasked,
    /// Nothing suggests a critical section (EL0, or IRQs enabled).
    None,
}

impl CritEvidence {
    /// Read the evidence from the guest's PSTATE as saved in SPSR_EL2 at the
    /// exit: AArch64 EL1t/EL1h (M\[4:0\] = 0b00100/0b00101) with PSTATE.I set.
    /// (A guest that masks IRQs through the GIC priority mask instead, i.e.
    /// Linux's pseudo-NMI mode, shows no evidence and gets no grace.)
    pub fn from_spsr(spsr: u64) -> Self {
        use aarch64_cpu::registers::SPSR_EL2;
        use tock_registers::LocalRegisterCopy;
        let spsr = LocalRegisterCopy::<u64, SPSR_EL2::Register>::new(spsr);
        let el1 = matches!(spsr.read_as_enum(SPSR_EL2::M), Some(SPSR_EL2::M::Value::EL1t | SPSR_EL2::M::Value::EL1h));
        if el1 && spsr.is_set(SPSR_EL2::I) {
            CritEvidence::IrqsMasked
        } else {
            CritEvidence::None
        }
    }
}

/// What the caller must do after [`Scheduler::wake`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakeAction {
    /// Nothing (no-op wake, or the woken vCPU waits for the current timer).
    None,
    /// Call `schedule()` on `pcpu` now: on trap return if it is this pCPU,
    /// through a reschedule IPI (SGI) if it is another one.
    Reschedule { pcpu: usize },
    /// Move `pcpu`'s scheduling timer earlier, to `at` (an IPI if remote, so
    /// that pCPU re-arms its own timer); then call `schedule()` when it fires.
    RearmTimer { pcpu: usize, at: u64 },
}

/// Result of [`Scheduler::schedule`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Decision {
    /// vCPU to run on this pCPU (`None` = idle until a kick).
    pub next: Option<VcpuId>,
    /// Absolute time at which `schedule()` must be called again (`None`: idle, no timer).
    pub timer_at: Option<u64>,
    /// The vCPU that was running and was descheduled while still runnable.
    pub preempted: Option<VcpuId>,
    /// An idle pCPU the caller should send a reschedule IPI so it pulls queued work.
    pub kick: Option<usize>,
    /// What changed on the pCPU, for the flight recorder (`crate::trace`).
    pub switch: SwitchInfo,
}

/// Why a vCPU left its pCPU at a `schedule()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchReason {
    /// Its slice ended and another vCPU had more credit.
    SliceEnd,
    /// A woken vCPU preempted it.
    WakePreempt,
    /// It blocked (WFI).
    Block,
    /// It yielded (WFE).
    Yield,
    /// PSCI CPU_OFF.
    Off,
}

/// Why a wake (or a pending wake-preemption) did not switch at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deferral {
    /// Not enough credit lead: the runner keeps its ratelimit window.
    Ratelimit,
    /// The runner is in a lock-holder grace.
    LhpGrace,
    /// The runner is in its protected minimum run.
    MinRun,
}

/// What a `schedule()` did, in the terms of the flight recorder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SwitchInfo {
    /// The vCPU that left the pCPU, why, and its credit (ns) then.
    pub out: Option<(VcpuId, SwitchReason, i64)>,
    /// The vCPU switched in (not one that continues), its credit (ns), and
    /// its wake→schedule-in latency (ns) when a wake made it runnable.
    pub into: Option<(VcpuId, i64, Option<u64>)>,
    /// A pending wake-preemption this call deferred, and until when.
    pub deferred: Option<(Deferral, u64)>,
}

/// Everything that can go wrong, as values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedError {
    NoPcpus,
    BadPcpu(usize),
    UnknownVcpu(VcpuId),
    DuplicateVcpu(VcpuId),
    BadWeight(u32),
    /// A cap of 0 % or above 100 % per pCPU.
    BadCap(u32),
    UnknownDomain(DomainId),
    DuplicateDomain(DomainId),
    /// The pCPU has no running vCPU (block/yield on an idle pCPU).
    NotRunning(usize),
    /// `power_on` of a vCPU that is already on.
    AlreadyOnline(VcpuId),
    BadConfig,
    /// A malformed boot argument, by key.
    BadBootArg(&'static str),
}

impl fmt::Display for SchedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchedError::NoPcpus => write!(f, "scheduler needs at least one pCPU"),
            SchedError::BadPcpu(p) => write!(f, "no pCPU {p}"),
            SchedError::UnknownVcpu(v) => write!(f, "unknown {v}"),
            SchedError::DuplicateVcpu(v) => write!(f, "{v} added twice"),
            SchedError::BadWeight(w) => write!(f, "bad weight {w} (1..=65535)"),
            SchedError::BadCap(c) => write!(f, "bad cap {c}% (1 to 100 per pCPU)"),
            SchedError::UnknownDomain(d) => write!(f, "unknown domain d{d}"),
            SchedError::DuplicateDomain(d) => write!(f, "domain d{d} added twice"),
            SchedError::NotRunning(p) => write!(f, "no vCPU running on pCPU {p}"),
            SchedError::AlreadyOnline(v) => write!(f, "{v} is already on"),
            SchedError::BadConfig => write!(f, "inconsistent scheduler configuration"),
            SchedError::BadBootArg(k) => write!(f, "bad value for boot argument {k}"),
        }
    }
}

/// Life cycle of a vCPU as the scheduler sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    /// Not powered on (before PSCI CPU_ON, after CPU_OFF). Wakes are ignored.
    Offline,
    /// Waiting for an event (WFI).
    Blocked,
    /// On a runqueue, or parked there for lack of its domain's budget.
    Runnable,
    /// On this pCPU.
    Running(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PreemptReason {
    Wake,
}

struct Vcpu {
    id: VcpuId,
    /// Its domain's slot in `Scheduler::domains`.
    dom: usize,
    state: RunState,
    credit: i64,
    /// Its weight: its own if set (`weight_override`), else its domain's.
    weight: u32,
    /// Set by [`Scheduler::set_vcpu_weight`]; survives domain weight changes.
    weight_override: Option<u32>,
    /// Remainder of the last credit burn's division (Credit2's `residual`).
    residual: u64,
    affinity: Option<usize>,
    /// The runqueue it belongs to (credit resets are per runqueue).
    rq: usize,
    /// The pCPU it last ran on, or was placed on (migrations count changes).
    home: usize,
    /// Budget it holds, drawn from its capped domain's pool (ns).
    budget: i64,
    /// Runnable but off the runqueues: its domain's budget is exhausted.
    parked: bool,
    /// Last time credit was burned (valid while running).
    last_burn: u64,
    /// Time of the wake that made it runnable, until it is scheduled in.
    woken_at: Option<u64>,
    /// Descheduled involuntarily while runnable and not run since.
    preempted: bool,
    /// Descheduled by a wake-preemption; its next switch-in starts a
    /// protected run of `wake_min_run` (consumed there).
    wake_preempted: bool,
    yielding: bool,
    stats: VcpuStats,
}

impl Vcpu {
    fn allowed_on(&self, p: usize) -> bool {
        self.affinity.is_none_or(|a| a == p)
    }
}

/// A Credit2 runqueue: the vCPUs waiting for any of its pCPUs.
#[derive(Default)]
struct Runqueue {
    /// Slots, sorted by credit (highest first, FIFO on ties).
    queue: Vec<usize>,
    /// Largest weight of its vCPUs (Credit2's `rqd->max_weight`).
    max_weight: u32,
    /// Credit resets of this runqueue.
    resets: u64,
}

#[derive(Default)]
struct Pcpu {
    /// The runqueue this pCPU picks from.
    rq: usize,
    curr: Option<usize>,
    /// When `curr` was switched in (ratelimit window start).
    entry: u64,
    /// The scheduling timer as last told to the caller.
    timer_at: Option<u64>,
    /// End of the grace the runner's last critical exit (with evidence)
    /// asked for; 0 once an exit without evidence closed it.
    crit_until: u64,
    /// The latest time the lock-holder grace may defer the pending
    /// wake-preemption to: `lhp_grace` after its first wake (or after the
    /// protected run that defers it), fixed however many critical exits
    /// follow (valid while `pending_preempt` is set).
    grace_limit: u64,
    /// End of the runner's protected minimum run (0 = not protected).
    protect_until: u64,
    pending_preempt: Option<PreemptReason>,
    yield_target: Option<usize>,
    /// `curr` was picked by a directed yield: it runs a grace-long slice and
    /// the ratelimit does not hold the yielder off when it ends.
    loan: bool,
}

/// The scheduler: all vCPUs of all domains over `nr_pcpus` pCPUs.
pub struct Scheduler {
    cfg: SchedConfig,
    vcpus: Vec<Vcpu>,
    index: BTreeMap<VcpuId, usize>,
    domains: Vec<Domain>,
    dom_index: BTreeMap<DomainId, usize>,
    pcpus: Vec<Pcpu>,
    rqs: Vec<Runqueue>,
    /// How the last `wake` was deferred, if it was (see [`Scheduler::wake_deferral`]).
    last_deferral: Option<(Deferral, u64)>,
}

impl Scheduler {
    pub fn new(cfg: SchedConfig, nr_pcpus: usize) -> Result<Self, SchedError> {
        if nr_pcpus == 0 {
            return Err(SchedError::NoPcpus);
        }
        cfg.validate()?;
        let nr_rqs = match cfg.runqueue {
            RunqueueLayout::All => 1,
            RunqueueLayout::PerCpu => nr_pcpus,
        };
        let mut pcpus = Vec::new();
        pcpus.resize_with(nr_pcpus, Pcpu::default);
        for (p, pc) in pcpus.iter_mut().enumerate() {
            pc.rq = p % nr_rqs;
        }
        let mut rqs = Vec::new();
        rqs.resize_with(nr_rqs, || Runqueue { max_weight: 1, ..Runqueue::default() });
        Ok(Self {
            cfg,
            vcpus: Vec::new(),
            index: BTreeMap::new(),
            domains: Vec::new(),
            dom_index: BTreeMap::new(),
            pcpus,
            rqs,
            last_deferral: None,
        })
    }

    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    pub fn nr_pcpus(&self) -> usize {
        self.pcpus.len()
    }

    /// Number of runqueues (`credit2_runqueue=`).
    pub fn nr_runqueues(&self) -> usize {
        self.rqs.len()
    }

    /// The runqueue `pcpu` picks from.
    pub fn runqueue_of(&self, pcpu: usize) -> Option<usize> {
        self.pcpus.get(pcpu).map(|p| p.rq)
    }

    /// Credit resets of runqueue `rq` so far.
    pub fn runqueue_resets(&self, rq: usize) -> Option<u64> {
        self.rqs.get(rq).map(|r| r.resets)
    }

    /// Register a domain. Its cap periods run from time 0 of the caller's
    /// clock, with a full budget at first.
    pub fn add_domain(&mut self, dom: DomainId, params: DomainParams) -> Result<(), SchedError> {
        if self.dom_index.contains_key(&dom) {
            return Err(SchedError::DuplicateDomain(dom));
        }
        params.validate(self.pcpus.len())?;
        self.dom_index.insert(dom, self.domains.len());
        self.domains.push(Domain::new(dom, params, 0));
        Ok(())
    }

    /// Change a domain's weight and cap at `now`. Run time until `now` is
    /// charged at the old weight. A new cap starts a full budget and a
    /// period now; a changed one keeps the period (what is left is clipped
    /// to the new budget); removing it unparks the domain's vCPUs. Running
    /// vCPUs see the change at their pCPU's next `schedule()`.
    pub fn set_domain_params(&mut self, now: u64, dom: DomainId, params: DomainParams) -> Result<(), SchedError> {
        let d = self.dom_slot(dom)?;
        params.validate(self.pcpus.len())?;
        for p in 0..self.pcpus.len() {
            if let Some(s) = self.pcpus[p].curr {
                self.burn(s, now);
            }
        }
        let old_cap = self.domains[d].params.cap_percent;
        self.domains[d].params.weight = params.weight;
        self.domains[d].set_cap(params.cap_percent, now);
        for v in self.vcpus.iter_mut().filter(|v| v.dom == d) {
            v.weight = v.weight_override.unwrap_or(params.weight);
            if old_cap.is_none() {
                v.budget = 0;
            }
        }
        self.update_max_weights();
        if params.cap_percent.is_none() {
            self.unpark_domain(now, d);
        }
        Ok(())
    }

    /// Give one vCPU its own weight (`Some`, 1..=65535) or its domain's
    /// again (`None`), at `now`: run time until `now` is charged at the old
    /// weight. It then burns credit as a vCPU of a domain of that weight
    /// would, and a vCPU it wake-preempts gets a protected run shortened
    /// by the ratio of their weights (see the module doc). Credit2's
    /// weights are per domain; this is the extension for two vCPUs of one
    /// domain that need different shares (`sched_vcpu_weight=`).
    pub fn set_vcpu_weight(&mut self, now: u64, vcpu: VcpuId, weight: Option<u32>) -> Result<(), SchedError> {
        let s = self.slot(vcpu)?;
        if let Some(w) = weight {
            if w == 0 || w > domain::MAX_WEIGHT {
                return Err(SchedError::BadWeight(w));
            }
        }
        for p in 0..self.pcpus.len() {
            if let Some(r) = self.pcpus[p].curr {
                self.burn(r, now);
            }
        }
        let dom_weight = self.domains[self.vcpus[s].dom].params.weight;
        let v = &mut self.vcpus[s];
        v.weight_override = weight;
        v.weight = weight.unwrap_or(dom_weight);
        self.update_max_weights();
        Ok(())
    }

    /// A vCPU's weight (its own, or its domain's).
    pub fn vcpu_weight(&self, vcpu: VcpuId) -> Option<u32> {
        self.index.get(&vcpu).map(|&s| self.vcpus[s].weight)
    }

    /// A domain's parameters.
    pub fn domain_params(&self, dom: DomainId) -> Option<DomainParams> {
        self.dom_index.get(&dom).map(|&d| self.domains[d].params)
    }

    /// A domain's counters.
    pub fn domain_stats(&self, dom: DomainId) -> Option<&DomainStats> {
        self.dom_index.get(&dom).map(|&d| &self.domains[d].stats)
    }

    /// A domain's run time up to `now`: what burning has charged plus the
    /// time its running vCPUs have run since their last burn (read-only, so
    /// every domain can be read at one instant).
    pub fn domain_run_ns(&self, dom: DomainId, now: u64) -> Option<u64> {
        let &d = self.dom_index.get(&dom)?;
        let unburned: u64 = self
            .vcpus
            .iter()
            .filter(|v| v.dom == d && matches!(v.state, RunState::Running(_)))
            .map(|v| now.saturating_sub(v.last_burn))
            .sum();
        Some(self.domains[d].stats.run_ns.saturating_add(unburned))
    }

    /// All domain ids, in registration order.
    pub fn domain_ids(&self) -> impl Iterator<Item = DomainId> + '_ {
        self.domains.iter().map(|d| d.id)
    }

    /// The domain of a vCPU.
    pub fn domain_of(&self, vcpu: VcpuId) -> Option<DomainId> {
        self.index.get(&vcpu).map(|&s| self.domains[self.vcpus[s].dom].id)
    }

    /// Parked for lack of budget (runnable, not on a runqueue).
    pub fn is_parked(&self, vcpu: VcpuId) -> bool {
        self.index.get(&vcpu).is_some_and(|&s| self.vcpus[s].parked)
    }

    /// Register a vCPU of domain `dom` (offline until [`Scheduler::power_on`]).
    /// `affinity = Some(p)` pins it to pCPU `p`.
    pub fn add_vcpu(&mut self, vcpu: VcpuId, dom: DomainId, affinity: Option<usize>) -> Result<(), SchedError> {
        if self.index.contains_key(&vcpu) {
            return Err(SchedError::DuplicateVcpu(vcpu));
        }
        let d = self.dom_slot(dom)?;
        if let Some(p) = affinity {
            self.check_pcpu(p)?;
        }
        let home = match affinity {
            Some(p) => p,
            None => {
                (0..self.pcpus.len()).min_by_key(|&p| self.vcpus.iter().filter(|v| v.home == p).count()).unwrap_or(0)
            }
        };
        let weight = self.domains[d].params.weight;
        self.index.insert(vcpu, self.vcpus.len());
        self.vcpus.push(Vcpu {
            id: vcpu,
            dom: d,
            state: RunState::Offline,
            credit: CREDIT_INIT_NS,
            weight,
            weight_override: None,
            residual: 0,
            affinity,
            rq: self.pcpus[home].rq,
            home,
            budget: 0,
            parked: false,
            last_burn: 0,
            woken_at: None,
            preempted: false,
            wake_preempted: false,
            yielding: false,
            stats: VcpuStats::default(),
        });
        self.domains[d].nr_vcpus += 1;
        let rq = &mut self.rqs[self.pcpus[home].rq];
        rq.max_weight = rq.max_weight.max(weight);
        Ok(())
    }

    /// PSCI CPU_ON: the vCPU becomes runnable (parked if its domain has no budget).
    pub fn power_on(&mut self, now: u64, vcpu: VcpuId) -> Result<WakeAction, SchedError> {
        let s = self.slot(vcpu)?;
        if self.vcpus[s].state != RunState::Offline {
            return Err(SchedError::AlreadyOnline(vcpu));
        }
        self.replenish_due(now);
        self.vcpus[s].state = RunState::Blocked;
        Ok(self.make_runnable(now, s))
    }

    /// PSCI CPU_OFF by the vCPU running on `pcpu`; call `schedule()` next.
    pub fn power_off(&mut self, now: u64, pcpu: usize) -> Result<VcpuId, SchedError> {
        let s = self.running(pcpu)?;
        self.burn(s, now);
        self.vcpus[s].state = RunState::Offline;
        self.vcpus[s].woken_at = None;
        Ok(self.vcpus[s].id)
    }

    /// Wake `vcpu` (virtual interrupt, vSGI, vtimer, doorbell). A vCPU that is
    /// not blocked gets a no-op (a parked one stays parked until its
    /// domain's budget is replenished); an offline one is ignored. A vCPU
    /// whose domain has no budget left is parked at once: it preempts
    /// nobody, and the answer re-arms a timer to the replenishment.
    pub fn wake(&mut self, now: u64, vcpu: VcpuId, cause: WakeCause) -> Result<WakeAction, SchedError> {
        let s = self.slot(vcpu)?;
        self.last_deferral = None;
        self.replenish_due(now);
        let v = &mut self.vcpus[s];
        match v.state {
            RunState::Offline => return Ok(WakeAction::None),
            RunState::Runnable | RunState::Running(_) => {
                v.stats.counters.wakes_noop += 1;
                return Ok(WakeAction::None);
            }
            RunState::Blocked => {}
        }
        let c = &mut v.stats.counters;
        match cause {
            WakeCause::Interrupt => c.wakes_interrupt += 1,
            WakeCause::Sgi => c.wakes_sgi += 1,
            WakeCause::Timer => c.wakes_timer += 1,
            WakeCause::Doorbell => c.wakes_doorbell += 1,
        }
        v.woken_at = Some(now);
        Ok(self.make_runnable(now, s))
    }
    /// How the last [`Scheduler::wake`] was deferred (kind, until when), if
    /// it asked for a preemption that waits or fell in a ratelimit window.
    pub fn wake_deferral(&self) -> Option<(Deferral, u64)> {
        self.last_deferral
    }

    /// The vCPU running on `pcpu` blocks (WFI with nothing pending). The
    /// caller must check for pending virtual interrupts first, then call
    /// `schedule()`.
    pub fn block(&mut self, now: u64, pcpu: usize) -> Result<VcpuId, SchedError> {
        let s = self.running(pcpu)?;
        self.burn(s, now);
        self.vcpus[s].state = RunState::Blocked;
        Ok(self.vcpus[s].id)
    }

    /// The vCPU running on `pcpu` yields (WFE trap), preferably to `target`
    /// (directed yield, e.g. a preempted vCPU of the same VM). Call
    /// `schedule()` next. The yielder runs again only if nothing else can.
    pub fn yield_to(&mut self, now: u64, pcpu: usize, target: Option<VcpuId>) -> Result<(), SchedError> {
        let s = self.running(pcpu)?;
        let t = match target {
            Some(t) => Some(self.slot(t)?),
            None => None,
        };
        self.burn(s, now);
        self.vcpus[s].yielding = true;
        self.vcpus[s].stats.counters.yields += 1;
        self.pcpus[pcpu].yield_target = t.filter(|&t| t != s);
        Ok(())
    }

    /// The vCPU running on `pcpu` exited, and `evidence` says whether it is
    /// inside a guest critical section. The SGI-send trap calls this with
    /// what it saw: [`CritEvidence::IrqsMasked`] opens a lock-holder grace
    /// (a wake-preemption of the runner waits up to `lhp_grace` from `now`,
    /// and never more than `lhp_grace` after the wake that asked for it or
    /// the protected run that deferred it). Any later exit that shows
    /// [`CritEvidence::None`] closes the grace; if a wake-preemption was
    /// waiting for it, the answer says when it happens now
    /// ([`WakeAction::Reschedule`], or a re-arm to the end of a protected run).
    pub fn note_critical_exit(
        &mut self,
        now: u64,
        pcpu: usize,
        evidence: CritEvidence,
    ) -> Result<WakeAction, SchedError> {
        self.check_pcpu(pcpu)?;
        if self.pcpus[pcpu].curr.is_none() || self.cfg.lhp_grace_ns == 0 || self.cfg.wake_mode != WakeMode::Preempt {
            return Ok(WakeAction::None);
        }
        match evidence {
            CritEvidence::IrqsMasked => {
                self.pcpus[pcpu].crit_until = now.saturating_add(self.cfg.lhp_grace_ns);
                Ok(WakeAction::None)
            }
            CritEvidence::None => {
                let was_deferred = self.pcpus[pcpu].pending_preempt.is_some() && now < self.deferral_end(pcpu);
                self.pcpus[pcpu].crit_until = 0;
                if was_deferred {
                    // Now only a protected run may still defer it.
                    let end = self.deferral_end(pcpu);
                    Ok(self.rearm(now, pcpu, end))
                } else {
                    Ok(WakeAction::None)
                }
            }
        }
    }

    /// Decide what `pcpu` runs from `now`. Call it when a [`WakeAction`] or
    /// the pCPU's timer says so, and after `block`/`yield_to`/`power_off`.
    pub fn schedule(&mut self, now: u64, pcpu: usize) -> Result<Decision, SchedError> {
        self.check_pcpu(pcpu)?;
        let prev = self.pcpus[pcpu].curr;
        let prev_runnable = self.account_prev(now, pcpu, prev);
        let yielding = prev_runnable.is_some_and(|s| self.vcpus[s].yielding);
        self.balance(pcpu, prev_runnable);
        if let (Some(s), false) = (prev_runnable, yielding) {
            self.catch_up_heavier_waker(now, pcpu, s);
            if let Some(d) = self.defer_preemption(now, pcpu, s) {
                return Ok(d);
            }
        }
        let forced = self.pcpus[pcpu].pending_preempt.take();
        let yield_target = self.pcpus[pcpu].yield_target.take();
        let was_loan = core::mem::take(&mut self.pcpus[pcpu].loan);

        let (next, directed) =
            self.pick(now, pcpu, prev_runnable, yielding, forced.is_some() || was_loan, yield_target);

        let left = prev.filter(|&s| next != Some(s));
        let mut switch = SwitchInfo { out: left.map(|s| self.switch_out(s, yielding, forced)), ..Default::default() };
        let preempted = prev_runnable.and_then(|s| self.requeue_prev(s, next, yielding, forced));

        let Some(n) = next else {
            return Ok(self.go_idle(now, pcpu, left, preempted, switch));
        };
        self.end_epoch_if_due(now, pcpu, n);
        if prev_runnable != Some(n) {
            switch.into = Some(self.switch_in(now, pcpu, n));
        }
        // What the vCPU that left holds goes back to its domain's pool
        // (after the switch, as Credit2's context_saved).
        if let Some(s) = left {
            self.give_back_budget(now, s);
        }
        let timer = self.arm_slice(now, pcpu, n, directed);
        let kick = self.idle_pcpu_for_queued(pcpu);
        Ok(Decision { next: Some(self.vcpus[n].id), timer_at: timer, preempted, kick, switch })
    }

    /// `schedule`'s first phase: the previous vCPU's run is charged and due
    /// budgets replenished; returns the previous vCPU if it may run on (still
    /// running here, and a capped one has budget: else it is parked).
    fn account_prev(&mut self, now: u64, pcpu: usize, prev: Option<usize>) -> Option<usize> {
        if let Some(s) = prev {
            self.burn(s, now);
        }
        self.replenish_due(now);
        let s = prev.filter(|&s| self.vcpus[s].state == RunState::Running(pcpu))?;
        if self.ensure_budget(s) {
            Some(s)
        } else {
            self.vcpus[s].state = RunState::Runnable;
            self.park(s);
            None
        }
    }

    /// Catch-up of a heavier waker: a woken vCPU queued here whose weight
    /// exceeds the runner `s`'s, and which did not preempt at its wake (a
    /// little behind in credit, e.g. right after a reset), preempts once it
    /// leads by the granularity, as if it woke now, instead of waiting out
    /// the runner's ratelimit window (`tickle` pulled the timer to that
    /// moment). Equal weights keep Credit2's behaviour: the window.
    fn catch_up_heavier_waker(&mut self, now: u64, pcpu: usize, s: usize) {
        if self.cfg.wake_mode != WakeMode::Preempt || self.pcpus[pcpu].pending_preempt.is_some() {
            return;
        }
        let rq = self.pcpus[pcpu].rq;
        let head = self.rqs[rq].queue.iter().copied().find(|&h| self.vcpus[h].allowed_on(pcpu));
        let (runner, g) = (&self.vcpus[s], self.cfg.wake_granularity_ns as i64);
        if head.is_some_and(|h| {
            let v = &self.vcpus[h];
            v.woken_at.is_some() && v.weight > runner.weight && v.credit.saturating_sub(runner.credit) > g
        }) {
            let pc = &mut self.pcpus[pcpu];
            pc.pending_preempt = Some(PreemptReason::Wake);
            pc.grace_limit = now.max(pc.protect_until).saturating_add(self.cfg.lhp_grace_ns);
        }
    }

    /// Lock-holder grace and protected run: a pending wake-preemption of the
    /// runner `s` waits for the end of them; the decision to run `s` on
    /// until then, if so.
    fn defer_preemption(&mut self, now: u64, pcpu: usize, s: usize) -> Option<Decision> {
        self.pcpus[pcpu].pending_preempt?;
        let at = self.deferral_end(pcpu);
        if now >= at {
            return None;
        }
        let timer = self.clamp_timer(Some(at.min(self.budget_end(now, s))));
        self.pcpus[pcpu].timer_at = timer;
        let kind = if at == self.pcpus[pcpu].protect_until { Deferral::MinRun } else { Deferral::LhpGrace };
        let switch = SwitchInfo { deferred: Some((kind, at)), ..Default::default() };
        Some(Decision { next: Some(self.vcpus[s].id), timer_at: timer, preempted: None, kick: None, switch })
    }

    /// Why `s` leaves its pCPU, for the recorder: the switch-out record.
    fn switch_out(&self, s: usize, yielding: bool, forced: Option<PreemptReason>) -> (VcpuId, SwitchReason, i64) {
        let v = &self.vcpus[s];
        let why = match (v.state, forced) {
            (RunState::Offline, _) => SwitchReason::Off,
            (RunState::Blocked, _) => SwitchReason::Block,
            _ if yielding => SwitchReason::Yield,
            _ if v.parked => SwitchReason::SliceEnd,
            (_, Some(PreemptReason::Wake)) => SwitchReason::WakePreempt,
            _ => SwitchReason::SliceEnd,
        };
        (v.id, why, v.credit)
    }

    /// The previous vCPU `s`, still runnable, goes back on the runqueue if
    /// `next` is another; returns its id when it was preempted so.
    fn requeue_prev(
        &mut self,
        s: usize,
        next: Option<usize>,
        yielding: bool,
        forced: Option<PreemptReason>,
    ) -> Option<VcpuId> {
        let mut preempted = None;
        if next != Some(s) {
            self.vcpus[s].state = RunState::Runnable;
            self.enqueue(s);
            if !yielding {
                self.vcpus[s].preempted = true;
                self.vcpus[s].wake_preempted = forced == Some(PreemptReason::Wake);
                let c = &mut self.vcpus[s].stats.counters;
                match forced {
                    Some(PreemptReason::Wake) => c.preempt_wake += 1,
                    None => c.preempt_slice += 1,
                }
            }
            preempted = Some(self.vcpus[s].id);
        }
        self.vcpus[s].yielding = false;
        preempted
    }

    /// Nothing to run on `pcpu`: it idles (the vCPU that `left` gives its
    /// budget back), with a timer only for what the runqueue needs.
    fn go_idle(
        &mut self,
        now: u64,
        pcpu: usize,
        left: Option<usize>,
        preempted: Option<VcpuId>,
        switch: SwitchInfo,
    ) -> Decision {
        let pc = &mut self.pcpus[pcpu];
        pc.curr = None;
        pc.crit_until = 0;
        pc.protect_until = 0;
        if let Some(s) = left {
            self.give_back_budget(now, s);
        }
        let timer = self.clamp_timer(None);
        self.pcpus[pcpu].timer_at = timer;
        let kick = self.idle_pcpu_for_queued(pcpu);
        Decision { next: None, timer_at: timer, preempted, kick, switch }
    }

    /// `n` leaves the runqueue; Credit2's epoch ends when the best
    /// candidate of the runqueue (`n` or the runqueue's head, whichever has
    /// more) has no credit.
    fn end_epoch_if_due(&mut self, now: u64, pcpu: usize, n: usize) {
        let rq = self.pcpus[pcpu].rq;
        self.rqs[rq].queue.retain(|&x| x != n);
        let head = self.rqs[rq].queue.first().map(|&h| self.vcpus[h].credit);
        let best = head.map_or(self.vcpus[n].credit, |h| h.max(self.vcpus[n].credit));
        if best <= 0 {
            self.reset_credit(now, rq, self.vcpus[n].credit);
        }
    }

    /// `n` starts running on `pcpu`: state, migration, the protected run
    /// after a wake-preemption, the wake-to-run latency; the switch-in
    /// record.
    fn switch_in(&mut self, now: u64, pcpu: usize, n: usize) -> (VcpuId, i64, Option<u64>) {
        let v = &mut self.vcpus[n];
        v.state = RunState::Running(pcpu);
        v.last_burn = now;
        v.preempted = false;
        if v.home != pcpu {
            v.home = pcpu;
            v.stats.counters.migrations += 1;
        }
        let protect = core::mem::take(&mut v.wake_preempted) && self.cfg.wake_min_run_ns > 0;
        v.stats.counters.schedule_ins += 1;
        let latency = v.woken_at.take().map(|w| now.saturating_sub(w));
        if let Some(l) = latency {
            v.stats.kick_to_run_ns.record(l);
        }
        let into = (v.id, v.credit, latency);
        let pc = &mut self.pcpus[pcpu];
        pc.curr = Some(n);
        pc.entry = now;
        pc.crit_until = 0;
        pc.protect_until = if protect { now.saturating_add(self.cfg.wake_min_run_ns) } else { 0 };
        into
    }

    /// The timer of `n`'s run: its slice (or, when `directed` to a lock
    /// holder, the lent grace), cut at its budget's end.
    fn arm_slice(&mut self, now: u64, pcpu: usize, n: usize, directed: bool) -> Option<u64> {
        let lend = directed && self.cfg.wake_mode == WakeMode::Preempt && self.cfg.lhp_grace_ns > 0;
        self.pcpus[pcpu].loan = lend;
        let slice = if lend { self.cfg.lhp_grace_ns.max(MIN_TIMER_NS) } else { self.runtime(now, pcpu, n) };
        let at = now.saturating_add(slice).min(self.budget_end(now, n));
        let timer = self.clamp_timer(Some(at));
        self.pcpus[pcpu].timer_at = timer;
        timer
    }

    /// Counters and histogram of a vCPU.
    pub fn stats(&self, vcpu: VcpuId) -> Option<&VcpuStats> {
        self.index.get(&vcpu).map(|&s| &self.vcpus[s].stats)
    }

    /// For the counters the trap code owns (injections, kicks, WFI/WFE traps).
    pub fn stats_mut(&mut self, vcpu: VcpuId) -> Option<&mut VcpuStats> {
        self.index.get(&vcpu).map(|&s| &mut self.vcpus[s].stats)
    }

    /// All vCPU ids, in registration order.
    pub fn vcpu_ids(&self) -> impl Iterator<Item = VcpuId> + '_ {
        self.vcpus.iter().map(|v| v.id)
    }

    pub fn state(&self, vcpu: VcpuId) -> Option<RunState> {
        self.index.get(&vcpu).map(|&s| self.vcpus[s].state)
    }

    /// Current credit (ns) of a vCPU.
    pub fn credit(&self, vcpu: VcpuId) -> Option<i64> {
        self.index.get(&vcpu).map(|&s| self.vcpus[s].credit)
    }

    /// Runnable but descheduled involuntarily (a directed-yield candidate).
    pub fn is_preempted(&self, vcpu: VcpuId) -> bool {
        self.index.get(&vcpu).is_some_and(|&s| {
            let v = &self.vcpus[s];
            v.preempted && !v.parked && v.state == RunState::Runnable
        })
    }

    /// vCPU currently on `pcpu`.
    pub fn current(&self, pcpu: usize) -> Option<VcpuId> {
        self.pcpus.get(pcpu).and_then(|p| p.curr).map(|s| self.vcpus[s].id)
    }

    // ----- internals -----

    fn check_pcpu(&self, p: usize) -> Result<(), SchedError> {
        if p < self.pcpus.len() {
            Ok(())
        } else {
            Err(SchedError::BadPcpu(p))
        }
    }

    fn slot(&self, v: VcpuId) -> Result<usize, SchedError> {
        self.index.get(&v).copied().ok_or(SchedError::UnknownVcpu(v))
    }

    fn dom_slot(&self, d: DomainId) -> Result<usize, SchedError> {
        self.dom_index.get(&d).copied().ok_or(SchedError::UnknownDomain(d))
    }

    fn running(&self, p: usize) -> Result<usize, SchedError> {
        self.check_pcpu(p)?;
        match self.pcpus[p].curr {
            Some(s) if self.vcpus[s].state == RunState::Running(p) => Ok(s),
            _ => Err(SchedError::NotRunning(p)),
        }
    }

    /// Charge a running vCPU for its time since the last burn: credit
    /// `elapsed × max_weight / weight`, the division's remainder carried to
    /// the next burn; a capped domain's vCPU also spends budget 1:1.
    fn burn(&mut self, s: usize, now: u64) {
        let max_w = u128::from(self.rqs[self.vcpus[s].rq].max_weight);
        let v = &mut self.vcpus[s];
        if !matches!(v.state, RunState::Running(_)) {
            return;
        }
        let delta = now.saturating_sub(v.last_burn);
        v.last_burn = v.last_burn.max(now);
        v.stats.counters.run_ns += delta;
        let scaled = delta as u128 * max_w + u128::from(v.residual);
        let w = u128::from(v.weight.max(1));
        v.residual = (scaled % w) as u64;
        let cost = (scaled / w).min(i64::MAX as u128) as i64;
        v.credit = v.credit.saturating_sub(cost).max(i64::MIN / 2);
        let d = &mut self.domains[v.dom];
        d.stats.run_ns += delta;
        if d.capped() {
            v.budget = v.budget.saturating_sub(delta.min(i64::MAX as u64) as i64);
        }
    }

    /// Credit → run time for vCPU `s`.
    fn c2t(&self, s: usize, credit: i64) -> u64 {
        if credit <= 0 {
            return 0;
        }
        let max_w = self.rqs[self.vcpus[s].rq].max_weight.max(1);
        (credit as i128 * self.vcpus[s].weight as i128 / max_w as i128) as u64
    }

    fn update_max_weights(&mut self) {
        for (i, rq) in self.rqs.iter_mut().enumerate() {
            rq.max_weight = self.vcpus.iter().filter(|v| v.rq == i).map(|v| v.weight).max().unwrap_or(1);
        }
    }

    /// Move vCPU `s` (not queued) to runqueue `rq`.
    fn set_rq(&mut self, s: usize, rq: usize) {
        if self.vcpus[s].rq != rq {
            self.vcpus[s].rq = rq;
            self.update_max_weights();
        }
    }

    /// Queue the runnable vCPU `s` on its runqueue, by credit.
    fn enqueue(&mut self, s: usize) {
        let c = self.vcpus[s].credit;
        let vcpus = &self.vcpus;
        let q = &mut self.rqs[vcpus[s].rq].queue;
        let pos = q.iter().position(|&x| vcpus[x].credit < c).unwrap_or(q.len());
        q.insert(pos, s);
    }

    fn sort_runq(&mut self, rq: usize) {
        let vcpus = &self.vcpus;
        self.rqs[rq].queue.sort_by(|&a, &b| vcpus[b].credit.cmp(&vcpus[a].credit));
    }

    /// Credit2 reset of runqueue `rq`: each of its online vCPUs gets
    /// CREDIT_INIT (times `m` if the picked vCPU is deeper than
    /// -CREDIT_INIT, so that it is positive again), capped at
    /// `CREDIT_INIT + CARRYOVER_MAX`: what a vCPU had left carries over up
    /// to that cap. vCPUs running on the runqueue's other pCPUs are charged
    /// up to `now` first (as Credit2 does), so that the cap clips what they
    /// really have left.
    fn reset_credit(&mut self, now: u64, rq: usize, picked_credit: i64) {
        for p in 0..self.pcpus.len() {
            if let Some(s) = self.pcpus[p].curr.filter(|_| self.pcpus[p].rq == rq) {
                self.burn(s, now);
            }
        }
        let mut m: i64 = 1;
        if picked_credit < -CREDIT_INIT_NS {
            m += (-picked_credit) / CREDIT_INIT_NS;
        }
        let add = m.saturating_mul(CREDIT_INIT_NS);
        let mut doms = Vec::new();
        for v in self.vcpus.iter_mut().filter(|v| v.rq == rq && v.state != RunState::Offline) {
            v.credit = v.credit.saturating_add(add).min(CREDIT_INIT_NS + CARRYOVER_MAX_NS);
            if !doms.contains(&v.dom) {
                doms.push(v.dom);
            }
        }
        for d in doms {
            self.domains[d].stats.credit_resets += 1;
        }
        self.rqs[rq].resets += 1;
        self.sort_runq(rq);
    }

    /// Replenish every capped domain whose period is over, and unpark its vCPUs.
    fn replenish_due(&mut self, now: u64) {
        for d in 0..self.domains.len() {
            if self.domains[d].replenish_due(now) && self.domains[d].budget > 0 {
                self.unpark_domain(now, d);
            }
        }
    }

    /// Make the parked vCPUs of domain `d` runnable again.
    fn unpark_domain(&mut self, now: u64, d: usize) {
        for s in 0..self.vcpus.len() {
            if self.vcpus[s].dom == d && self.vcpus[s].parked {
                self.vcpus[s].parked = false;
                if self.vcpus[s].state == RunState::Runnable {
                    // Its pCPU's timer is due now (see `clamp_timer`), so a
                    // tickle of a busy pCPU is seen at its `schedule()`.
                    let _ = self.queue_and_tickle(now, s);
                }
            }
        }
    }

    /// Make sure the (capped) vCPU `s` holds budget, drawing a quota from
    /// its domain's pool; false if there is none left (park it).
    fn ensure_budget(&mut self, s: usize) -> bool {
        let d = self.vcpus[s].dom;
        if !self.domains[d].capped() || self.vcpus[s].budget > 0 {
            return true;
        }
        let held = self.vcpus[s].budget;
        self.vcpus[s].budget = self.domains[d].grab(held);
        self.vcpus[s].budget > 0
    }

    /// Park the runnable vCPU `s` (taken off its runqueue) until its domain has budget.
    fn park(&mut self, s: usize) {
        let rq = self.vcpus[s].rq;
        self.rqs[rq].queue.retain(|&x| x != s);
        self.vcpus[s].parked = true;
        self.domains[self.vcpus[s].dom].stats.cap_parks += 1;
    }

    /// `s` left its pCPU: what it holds goes back to its domain's pool,
    /// and if that leaves budget, the domain's parked vCPUs come back.
    fn give_back_budget(&mut self, now: u64, s: usize) {
        let d = self.vcpus[s].dom;
        if !self.domains[d].capped() {
            return;
        }
        let held = core::mem::take(&mut self.vcpus[s].budget);
        self.domains[d].give_back(held);
        if self.domains[d].budget > 0 {
            self.unpark_domain(now, d);
        }
    }

    /// When the running vCPU `s`'s budget runs out (`u64::MAX`: uncapped).
    /// The budget bounds the slice hard, after min slice and ratelimit
    /// (Credit2 lets the minimum timer overrun it and charges the debt to
    /// the next period; we keep each period exact).
    fn budget_end(&self, now: u64, s: usize) -> u64 {
        if !self.domains[self.vcpus[s].dom].capped() {
            return u64::MAX;
        }
        let b = self.vcpus[s].budget.max(0) as u64;
        now.saturating_add(b.max(MIN_TIMER_NS))
    }

    /// The earliest replenishment that will unpark someone.
    fn next_unpark(&self) -> Option<u64> {
        self.vcpus.iter().filter(|v| v.parked).map(|v| self.domains[v.dom].next_repl).min()
    }

    /// A pCPU's timer, brought forward to the next replenishment while a
    /// vCPU is parked, so that every pCPU reschedules when it comes back.
    fn clamp_timer(&self, at: Option<u64>) -> Option<u64> {
        match (at, self.next_unpark()) {
            (Some(a), Some(r)) => Some(a.min(r)),
            (a, r) => a.or(r),
        }
    }

    fn pick(
        &mut self,
        now: u64,
        p: usize,
        prev: Option<usize>,
        yielding: bool,
        bypass_ratelimit: bool,
        yield_target: Option<usize>,
    ) -> (Option<usize>, bool) {
        // Ratelimit: the runner keeps the pCPU inside its window.
        if let Some(s) = prev {
            let ran = now.saturating_sub(self.pcpus[p].entry);
            if !yielding && !bypass_ratelimit && self.cfg.ratelimit_ns > 0 && ran < self.cfg.ratelimit_ns {
                return (Some(s), false);
            }
        }
        // Directed yield: run the target here if it is runnable and may run here.
        if let Some(t) = yield_target {
            let v = &self.vcpus[t];
            if v.state == RunState::Runnable && !v.parked && v.allowed_on(p) {
                if self.ensure_budget(t) {
                    let rq = self.pcpus[p].rq;
                    if self.vcpus[t].rq != rq {
                        self.rqs[self.vcpus[t].rq].queue.retain(|&x| x != t);
                        self.set_rq(t, rq);
                        self.enqueue(t);
                    }
                    return (Some(t), true);
                }
                self.park(t);
            }
        }
        let rq = self.pcpus[p].rq;
        loop {
            let head = self.rqs[rq].queue.iter().copied().find(|&h| self.vcpus[h].allowed_on(p));
            let pick = match (prev, head) {
                (None, h) => h,
                (Some(s), None) => Some(s),
                (Some(s), Some(h)) => {
                    if yielding || self.vcpus[h].credit > self.vcpus[s].credit {
                        Some(h)
                    } else {
                        Some(s)
                    }
                }
            };
            match pick {
                // A queued vCPU of a capped domain runs only with budget.
                Some(h) if Some(h) == head && !self.ensure_budget(h) => self.park(h),
                _ => return (pick, false),
            }
        }
    }

    /// Credit2's slice length for the vCPU `n` just picked on `p`.
    fn runtime(&self, now: u64, p: usize, n: usize) -> u64 {
        let credit = self.vcpus[n].credit;
        let rt = match self.rqs[self.pcpus[p].rq].queue.first() {
            Some(&w) if self.vcpus[w].credit > 0 => credit.saturating_sub(self.vcpus[w].credit),
            _ => credit,
        };
        let mut t = self.c2t(n, rt);
        let mut min_t = self.cfg.min_slice_ns;
        if self.cfg.ratelimit_ns > 0 {
            let window_end = self.pcpus[p].entry.saturating_add(self.cfg.ratelimit_ns);
            min_t = min_t.max(window_end.saturating_sub(now));
        }
        if t > self.cfg.max_slice_ns {
            t = self.cfg.max_slice_ns;
        }
        t.max(min_t).max(MIN_TIMER_NS)
    }

    /// Runnable vCPUs of runqueue `rq`: queued plus running on its pCPUs.
    fn rq_load(&self, rq: usize) -> usize {
        let running = self
            .pcpus
            .iter()
            .filter(|pc| pc.rq == rq)
            .filter(|pc| pc.curr.is_some_and(|s| matches!(self.vcpus[s].state, RunState::Running(_))))
            .count();
        self.rqs[rq].queue.len() + running
    }

    /// With several runqueues (`credit2_runqueue=cpu`), pull at most one
    /// vCPU into `p`'s from another: from one whose load is at least 2
    /// higher, or else the richest remote waiter when its credit beats our
    /// best candidate by more than `MIGRATE_RESIST_NS` (Credit2's migration
    /// resistance). Credits of different runqueues are reset apart, so this
    /// is load balancing, not exact fairness; one shared runqueue (the
    /// default) needs none.
    fn balance(&mut self, p: usize, prev: Option<usize>) {
        if self.rqs.len() < 2 {
            return;
        }
        let my_rq = self.pcpus[p].rq;
        let mine = self.rqs[my_rq].queue.len() + prev.is_some() as usize;
        let mut from: Option<(usize, usize)> = None; // (runqueue, index in its queue)
        let mut best_load = 0;
        for q in (0..self.rqs.len()).filter(|&q| q != my_rq) {
            let l = self.rq_load(q);
            if l >= mine + 2 && l > best_load {
                if let Some(i) = self.rqs[q].queue.iter().position(|&s| self.vcpus[s].allowed_on(p)) {
                    best_load = l;
                    from = Some((q, i));
                }
            }
        }
        if from.is_none() {
            let local_best = prev
                .map(|s| self.vcpus[s].credit)
                .into_iter()
                .chain(self.rqs[my_rq].queue.first().map(|&s| self.vcpus[s].credit))
                .max()
                .unwrap_or(i64::MIN);
            let mut best_credit = local_best.saturating_add(MIGRATE_RESIST_NS);
            for q in (0..self.rqs.len()).filter(|&q| q != my_rq) {
                let queue = &self.rqs[q].queue;
                if let Some(i) = queue.iter().position(|&s| self.vcpus[s].allowed_on(p)) {
                    let c = self.vcpus[queue[i]].credit;
                    if c > best_credit {
                        best_credit = c;
                        from = Some((q, i));
                    }
                }
            }
        }
        let Some((q, i)) = from else { return };
        let s = self.rqs[q].queue.remove(i);
        self.set_rq(s, my_rq);
        self.enqueue(s);
    }

    /// An idle pCPU that could take something still queued on `p`'s runqueue.
    fn idle_pcpu_for_queued(&self, p: usize) -> Option<usize> {
        let q = &self.rqs[self.pcpus[p].rq].queue;
        if q.is_empty() {
            return None;
        }
        (0..self.pcpus.len())
            .find(|&o| o != p && self.pcpus[o].curr.is_none() && q.iter().any(|&s| self.vcpus[s].allowed_on(o)))
    }

    /// The pCPU a vCPU that becomes runnable should go to (and tickle).
    fn place(&self, s: usize) -> usize {
        let v = &self.vcpus[s];
        if let Some(a) = v.affinity {
            return a;
        }
        let idle = |p: usize| self.pcpus[p].curr.is_none();
        if idle(v.home) {
            return v.home;
        }
        if let Some(p) = (0..self.pcpus.len()).find(|&p| idle(p)) {
            return p;
        }
        // All busy: the pCPU whose runner has the least credit (home on ties).
        let runner_credit = |p: usize| self.pcpus[p].curr.map_or(i64::MIN, |c| self.vcpus[c].credit);
        let mut best = v.home;
        for p in 0..self.pcpus.len() {
            if runner_credit(p) < runner_credit(best) {
                best = p;
            }
        }
        best
    }

    fn make_runnable(&mut self, now: u64, s: usize) -> WakeAction {
        self.vcpus[s].state = RunState::Runnable;
        self.vcpus[s].preempted = false;
        let d = self.vcpus[s].dom;
        if self.domains[d].capped() && self.vcpus[s].budget <= 0 && self.domains[d].budget <= 0 {
            // No budget: parked, it waits for the replenishment and preempts nobody.
            self.vcpus[s].parked = true;
            self.domains[d].stats.cap_parks += 1;
            let p = self.place(s);
            let at = self.domains[d].next_repl;
            return self.rearm(now, p, at);
        }
        self.queue_and_tickle(now, s)
    }

    /// Queue the runnable vCPU `s` where `place` says and decide whether it preempts there.
    fn queue_and_tickle(&mut self, now: u64, s: usize) -> WakeAction {
        let p = self.place(s);
        let rq = self.pcpus[p].rq;
        self.set_rq(s, rq);
        self.enqueue(s);
        self.tickle(now, s, p)
    }
    /// Decide whether the vCPU `s`, just queued on `p`, preempts `p`'s runner.
    fn tickle(&mut self, now: u64, s: usize, p: usize) -> WakeAction {
        let Some(r) = self.pcpus[p].curr else {
            return WakeAction::Reschedule { pcpu: p };
        };
        if !matches!(self.vcpus[r].state, RunState::Running(_)) {
            // The runner already blocked; a schedule() is on its way.
            return WakeAction::Reschedule { pcpu: p };
        }
        self.burn(r, now);
        let ran = now.saturating_sub(self.pcpus[p].entry);
        let in_window = self.cfg.ratelimit_ns > 0 && ran < self.cfg.ratelimit_ns;
        let lead = self.vcpus[s].credit.saturating_sub(self.vcpus[r].credit);
        match self.cfg.wake_mode {
            WakeMode::XenCompat => {
                if self.cfg.ratelimit_ns > 0 && ran < self.cfg.ratelimit_ns.saturating_sub(RATELIMIT_TOLERANCE_NS) {
                    self.vcpus[s].stats.counters.ratelimit_deferrals += 1;
                    self.last_deferral =
                        Some((Deferral::Ratelimit, self.pcpus[p].entry.saturating_add(self.cfg.ratelimit_ns)));
                    WakeAction::None
                } else if lead > 0 {
                    WakeAction::Reschedule { pcpu: p }
                } else {
                    WakeAction::None
                }
            }
            WakeMode::Preempt => {
                if lead > self.cfg.wake_granularity_ns as i64 {
                    // A waker heavier than the runner shortens the runner's
                    // protected run by their weight ratio.
                    let (ws, wr) = (u64::from(self.vcpus[s].weight), u64::from(self.vcpus[r].weight));
                    let pc = &mut self.pcpus[p];
                    if pc.protect_until != 0 && ws > wr {
                        let scaled = self.cfg.wake_min_run_ns.saturating_mul(wr) / ws;
                        pc.protect_until = pc.protect_until.min(pc.entry.saturating_add(scaled));
                    }
                    if pc.pending_preempt.is_none() {
                        // The grace cap runs from the first wake that asks,
                        // or from the end of a protected run that defers it.
                        pc.pending_preempt = Some(PreemptReason::Wake);
                        pc.grace_limit = now.max(pc.protect_until).saturating_add(self.cfg.lhp_grace_ns);
                    }
                    let end = self.deferral_end(p);
                    if now < end {
                        let c = &mut self.vcpus[s].stats.counters;
                        let kind = if end == self.pcpus[p].protect_until {
                            c.min_run_deferrals += 1;
                            Deferral::MinRun
                        } else {
                            c.lhp_deferrals += 1;
                            Deferral::LhpGrace
                        };
                        self.last_deferral = Some((kind, end));
                        self.rearm(now, p, end)
                    } else {
                        WakeAction::Reschedule { pcpu: p }
                    }
                } else {
                    let window = self.cfg.ratelimit_ns.max(self.cfg.min_slice_ns);
                    let mut end = self.pcpus[p].entry.saturating_add(window);
                    if self.vcpus[s].weight > self.vcpus[r].weight {
                        // Catch-up (see `schedule`): when the runner's burn
                        // makes the heavier waker lead by the granularity.
                        let gap = (-lead).saturating_add(self.cfg.wake_granularity_ns as i64).saturating_add(1);
                        // (+1 ns: `c2t` rounds down.)
                        end = end.min(now.saturating_add(self.c2t(r, gap).saturating_add(1).max(MIN_TIMER_NS)));
                    }
                    if in_window {
                        self.vcpus[s].stats.counters.ratelimit_deferrals += 1;
                        self.last_deferral = Some((Deferral::Ratelimit, end));
                    }
                    self.rearm(now, p, end)
                }
            }
        }
    }

    /// Until when a pending wake-preemption of `p`'s runner is deferred:
    /// the end of its lock-holder grace (never past the cap fixed at the
    /// wake) or of its protected run, whichever is later.
    fn deferral_end(&self, p: usize) -> u64 {
        let pc = &self.pcpus[p];
        pc.crit_until.min(pc.grace_limit).max(pc.protect_until)
    }

    fn rearm(&mut self, now: u64, p: usize, at: u64) -> WakeAction {
        if at <= now {
            return WakeAction::Reschedule { pcpu: p };
        }
        match self.pcpus[p].timer_at {
            Some(t) if t <= at => WakeAction::None,
            _ => {
                self.pcpus[p].timer_at = Some(at);
                WakeAction::RearmTimer { pcpu: p, at }
            }
        }
    }
}
