//! Credit2-compatible vCPU scheduler with an immediate preempt-on-wake path.
//!
//! # Why
//! On Xen's Credit2 with one pCPU, a CPU-hog vCPU and an I/O vCPU, a device
//! completion that wakes the I/O vCPU inside the hog's ratelimit window
//! neither preempts the hog nor shortens its timer, so the I/O vCPU waits out
//! the rest of a slice of up to 10 ms, for every request
//! (docs/benchmarks/scheduler-tuning.md has the figures). We keep the
//! Credit2 model, so figures stay comparable with Xen, and fix the wake path.
//!
//! # Files, by policy
//! The state ([`Scheduler`] and its per-vCPU, per-pCPU and per-runqueue
//! records) and [`Scheduler::schedule`], which reads as its phases, live
//! here; each policy is an `impl Scheduler` block of its own file, and
//! documents its part of the model:
//! - `config`: [`SchedConfig`], its defaults and the boot arguments.
//! - `credit`: credit burn at the weights, and the per-runqueue reset.
//! - `domain`: a domain's weight, cap and budget pool ([`DomainParams`]).
//! - `cap`: caps on the scheduler's side: quotas, parking, timers.
//! - `runq`: run queues, picking, slices, tickling idle pCPUs.
//! - `balance`: load averages and balancing between runqueues.
//! - `wake`: wake paths ([`WakeMode`]), lock-holder grace, protected runs.
//! - `switch`: `schedule()`'s phases around the pick (switch out, in, idle).
//! - `lifecycle`: adding domains and vCPUs, power on/off, block, yield.
//! - `shards`: [`Sched`], the scheduler the pCPUs share: a [`Scheduler`]
//!   per runqueue, each behind its own lock, and the moves between them.
//! - `spin`: spin detection by PC sampling where WFE does not trap.
//! - `sim`: a discrete-event simulator that drives the real scheduler.
//! - `conformance`: a simulator of any mix of hogs and I/O vCPUs (and of
//!   hogs alone in weighted or capped domains), and the cases that check
//!   Credit2's figures on it.
//!
//! The policy files depend on each other in one direction only: `credit`
//! and `cap` use no other, `runq` uses both, `wake` uses those three,
//! `switch` and `lifecycle` any of them; what they all need (the records,
//! the id lookups, [`MIN_TIMER_NS`]) is here.
//!
//! # Driving it
//! Pure logic over the caller's clock (ns, monotonic); no globals, no arch
//! code, no panics (errors are [`SchedError`]). The EL2 code calls
//! [`Sched`] (the same calls, a lock per runqueue taken inside), per pCPU:
//! `wake` on a virtual interrupt/vSGI/vtimer/doorbell for a vCPU; `block` on a
//! WFI with nothing pending; `yield_to` on WFE; `note_critical_exit` on an SGI
//! trap (with the evidence) and on any exit while a grace is open (without
//! it, if it is gone); then `schedule` whenever a [`WakeAction`] or the pCPU's
//! scheduling timer says so, switching to [`Decision::next`] and arming the
//! timer at [`Decision::timer_at`]. `sim` runs exactly this on a virtual clock.

mod balance;
mod cap;
mod config;
pub mod conformance;
mod credit;
pub mod domain;
mod lifecycle;
mod runq;
mod shards;
pub mod sim;
pub mod spin;
mod switch;
#[cfg(test)]
mod tests;
mod wake;

pub use config::{
    RunqueueLayout, SchedConfig, WakeMode, LIVE_OPTIONS, MAX_CPUS_RUNQUEUE, RATELIMIT_US_RANGE,
    XEN_OPTIONS_NOT_IMPLEMENTED,
};
pub use credit::{CARRYOVER_MAX_NS, CREDIT_INIT_NS};
use domain::Domain;
pub use domain::{DomainId, DomainParams, DomainStats, CAP_PERIOD_NS};
pub use runq::MIGRATE_RESIST_NS;
pub use shards::{OwedKicks, Sched, Woken};
pub use wake::{CritEvidence, GraceWatch, RATELIMIT_TOLERANCE_NS};

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::fmt;

use crate::stats::VcpuStats;

/// Default domain weight (`dom0_weight`).
pub const DEFAULT_WEIGHT: u32 = 256;
/// Shortest timer the scheduler ever asks for, so a caller loop always progresses.
pub const MIN_TIMER_NS: u64 = 1_000;

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
    /// An idle pCPU the caller should send a reschedule IPI so it pulls
    /// queued work. A `schedule()` that balanced may owe more (rare: see
    /// [`Scheduler::take_balance_kicks`]).
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
    /// One of our extensions of Credit2, by option, asked for while they
    /// are off (`sched_wake_preempt=off`: Xen's Credit2 alone).
    ExtensionOff(&'static str),
    /// A vCPU id at or above [`DENSE_IDS`] with several runqueues (their
    /// lock-free route table has that many entries).
    VcpuIdRange(VcpuId),
    /// An option fixed at boot, asked to change while running.
    NotLive,
    /// Not a scheduler option.
    UnknownOption,
    /// `remove_domain` of a domain with a vCPU that is not offline (or,
    /// under [`Sched`], is moving between runqueues: try again).
    DomainBusy(DomainId),
    /// The heap could not give the room asked for.
    NoMemory,
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
            SchedError::ExtensionOff(k) => write!(f, "{k} is an extension of Credit2, off with sched_wake_preempt=off"),
            SchedError::VcpuIdRange(v) => write!(f, "{v}: ids of {DENSE_IDS} and above need a single runqueue"),
            SchedError::NotLive => write!(f, "this option is fixed at boot"),
            SchedError::UnknownOption => write!(f, "not a scheduler option"),
            SchedError::DomainBusy(d) => write!(f, "domain d{d} still has vCPUs online"),
            SchedError::NoMemory => write!(f, "no heap left for the scheduler's records"),
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

#[derive(Clone)]
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
    /// Decaying average of its runnable time (`balance`, fixed point).
    avgload: u64,
    /// When `avgload` was last brought up to date (`balance`'s units).
    load_last: u64,
    /// `avgload`'s average of a constant 1 (fixed point): how much of the
    /// window `avgload` has seen, to judge a vCPU on what it has.
    load_seen: u64,
    /// Its runnable time so far, in `balance`'s units (kept with `avgload`).
    runnable_units: u64,
    /// Decaying averages of its running and its runnable time over a
    /// shorter window (our mode's weighted balance: brought up to date
    /// only when it balances), the run and runnable time (ns) they last
    /// saw, and when that was (ns; 0: never).
    served_run: u64,
    served_load: u64,
    served_seen: (u64, u64),
    served_last: u64,
    /// The runqueue a balance moves it to when it leaves its pCPU.
    migrate_to: Option<usize>,
    /// Descheduled by a wake-preemption; its next switch-in starts a
    /// protected run of `wake_min_run` (consumed there).
    wake_preempted: bool,
    yielding: bool,
    /// The pCPU a tickle reserved it for (Credit2's `tickled_cpu`): while
    /// that pCPU is still tickled, other pCPUs' picks leave it queued.
    tickled_cpu: Option<usize>,
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
    /// Its pCPUs, ascending (at most `sched_credit2_max_cpus_runqueue`).
    pcpus: Vec<usize>,
    /// The vCPUs it holds, whatever their state.
    members: Vec<usize>,
    /// How many of them are runnable or running (`balance`'s contract).
    load: u32,
    /// Decaying average of `load` (`balance`, fixed point).
    avgload: u64,
    /// When `avgload` was last brought up to date.
    load_last: u64,
    /// Slots, sorted by credit (highest first, FIFO on ties).
    queue: Vec<usize>,
    /// Largest weight of its vCPUs (Credit2's `rqd->max_weight`).
    max_weight: u32,
    /// Credit resets of this runqueue.
    resets: u64,
    /// vCPUs a balance moved into it (a running one counted when the move
    /// is decided; it moves when it leaves its pCPU).
    arrivals: u64,
    /// Our mode's weighted balance compares it with runqueue
    /// `(self + 1 + partner) % n` next, when no count imbalance chooses.
    partner: usize,
    /// Its pCPUs that run a vCPU (`Pcpu::curr` in `RunState::Running` on
    /// it), a bit each ([`Pcpu::bit`]): the others are idle, or their
    /// runner has just left and their `schedule()` is on its way. Kept by
    /// [`Scheduler::mark_busy`].
    busy: u32,
    /// Its pCPUs that a tickle asked to reschedule and that have not yet
    /// (Credit2's `rqd->tickled`): later wakes look for another pCPU.
    tickled: u32,
}

// The runqueue's pCPU masks have a bit per pCPU.
const _: () = assert!(config::MAX_CPUS_RUNQUEUE <= 32);

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
    /// Its bit in its runqueue's pCPU masks ([`Runqueue::busy`],
    /// [`Runqueue::tickled`]): 1 << its place among the runqueue's pCPUs.
    bit: u32,
    /// `schedule()` calls on it (summed per runqueue in the statistics).
    schedules: u64,
    /// Tickles that told it to reschedule.
    tickles: u64,
}

/// vCPU id to its slot in [`Scheduler`]'s records. Every wake, block and
/// switch looks one up; the hypervisor's ids are small (a VM's first id
/// plus the vCPU's index), so ids below [`DENSE_IDS`] are one table load,
/// and only larger ones search a map.
#[derive(Default)]
struct SlotIndex {
    /// Slot + 1 per id below [`DENSE_IDS`], 0 for none.
    dense: Vec<u32>,
    sparse: BTreeMap<VcpuId, usize>,
}

#[cfg(feature = "sched-opcount")]
std::thread_local! {
    /// Records the schedulers visited on this thread ([`Scheduler::ops`]).
    static OPS: core::cell::Cell<u64> = const { core::cell::Cell::new(0) };
}

/// Ids below this are looked up in a table (a scheduler's slots, `Sched`'s routes).
pub const DENSE_IDS: u32 = 4096;

impl SlotIndex {
    fn get(&self, v: VcpuId) -> Option<usize> {
        if v.0 < DENSE_IDS {
            match self.dense.get(v.0 as usize) {
                Some(&s) if s > 0 => Some(s as usize - 1),
                _ => None,
            }
        } else {
            self.sparse.get(&v).copied()
        }
    }

    fn contains_key(&self, v: VcpuId) -> bool {
        self.get(v).is_some()
    }

    fn remove(&mut self, v: VcpuId) {
        if v.0 < DENSE_IDS {
            if let Some(s) = self.dense.get_mut(v.0 as usize) {
                *s = 0;
            }
        } else {
            self.sparse.remove(&v);
        }
    }

    /// Maps `v` to `slot`; a new id below [`DENSE_IDS`] grows `dense`
    /// within the room `Scheduler::room_for_vcpu` made for it.
    fn insert(&mut self, v: VcpuId, slot: usize) {
        match u32::try_from(slot + 1) {
            Ok(s) if v.0 < DENSE_IDS => {
                let i = v.0 as usize;
                if self.dense.len() <= i {
                    self.dense.resize(i + 1, 0);
                }
                self.dense[i] = s;
            }
            _ => {
                self.sparse.insert(v, slot);
            }
        }
    }
}

/// The scheduler: all vCPUs of all domains over `nr_pcpus` pCPUs.
pub struct Scheduler {
    cfg: SchedConfig,
    vcpus: Vec<Vcpu>,
    index: SlotIndex,
    domains: Vec<Domain>,
    dom_index: BTreeMap<DomainId, usize>,
    pcpus: Vec<Pcpu>,
    rqs: Vec<Runqueue>,
    /// How the last `wake` was deferred, if it was (see [`Scheduler::wake_deferral`]).
    last_deferral: Option<(Deferral, u64)>,
    /// How many vCPUs are parked (`Vcpu::parked`, kept by
    /// [`Scheduler::set_parked`]): every pick asks for the next unpark,
    /// which need not look at any vCPU while none is.
    nr_parked: usize,
    /// The earliest replenishment of any capped domain (`u64::MAX`: none
    /// capped), kept by [`Scheduler::replenish_due`] and the cap changes:
    /// every wake and schedule asks for replenishments, which need not look
    /// at any domain before then.
    next_repl: u64,
    /// Tickles of the last `schedule()`'s balancing, owed an IPI
    /// ([`Scheduler::take_balance_kicks`]).
    owed_kicks: OwedKicks,
    /// The runqueue this scheduler holds, when it is one of [`Sched`]'s
    /// (`None`: it holds them all). Every scheduler knows every vCPU and
    /// pCPU, but only its runqueue's records are live: a vCPU's record is
    /// its runqueue's (`Vcpu::rq` says which in every copy that is not
    /// live), and a move between runqueues copies it (see `shards`).
    shard: Option<usize>,
    /// A vCPU the last `schedule()` let go to another runqueue (its
    /// pending balance move), for [`Sched`] to take there.
    emigrant: Option<usize>,
    /// The last `schedule()` reset this runqueue's credit: [`Sched`]
    /// balances it against another.
    reset_pending: bool,
    /// The balance's candidate lists, with room for every vCPU reserved
    /// when vCPUs are registered (only with several runqueues), so a
    /// balance allocates nothing under the lock.
    candidates: balance::Candidates,
}

impl Scheduler {
    pub fn new(cfg: SchedConfig, nr_pcpus: usize) -> Result<Self, SchedError> {
        if nr_pcpus == 0 {
            return Err(SchedError::NoPcpus);
        }
        cfg.validate()?;
        let nr_rqs = cfg.nr_runqueues(nr_pcpus);
        let mut pcpus = Vec::new();
        pcpus.resize_with(nr_pcpus, Pcpu::default);
        let mut rqs = Vec::new();
        rqs.resize_with(nr_rqs, || Runqueue { max_weight: 1, ..Runqueue::default() });
        for (p, pc) in pcpus.iter_mut().enumerate() {
            // Contiguous blocks whose sizes differ by at most one.
            pc.rq = p * nr_rqs / nr_pcpus;
            pc.bit = 1 << rqs[pc.rq].pcpus.len();
            rqs[pc.rq].pcpus.push(p);
        }
        Ok(Self {
            cfg,
            vcpus: Vec::new(),
            index: SlotIndex::default(),
            domains: Vec::new(),
            dom_index: BTreeMap::new(),
            pcpus,
            rqs,
            last_deferral: None,
            nr_parked: 0,
            next_repl: u64::MAX,
            owed_kicks: OwedKicks::default(),
            shard: None,
            emigrant: None,
            reset_pending: false,
            candidates: balance::Candidates::default(),
        })
    }

    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    pub fn nr_pcpus(&self) -> usize {
        self.pcpus.len()
    }

    /// Decide what `pcpu` runs from `now`. Call it when a [`WakeAction`] or
    /// the pCPU's timer says so, and after `block`/`yield_to`/`power_off`.
    pub fn schedule(&mut self, now: u64, pcpu: usize) -> Result<Decision, SchedError> {
        self.check_pcpu(pcpu)?;
        #[cfg(test)]
        self.assert_masks();
        let pc = &mut self.pcpus[pcpu];
        self.rqs[pc.rq].tickled &= !pc.bit;
        pc.schedules += 1;
        let prev = self.pcpus[pcpu].curr;
        let prev_runnable = self.account_prev(now, pcpu, prev);
        let yielding = prev_runnable.is_some_and(|s| self.vcpus[s].yielding);
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
        let preempted = prev_runnable.and_then(|s| self.deschedule_prev(s, next, yielding, forced));
        let mut requeue = prev_runnable.filter(|&s| next != Some(s));
        // One that left for another runqueue is queued there (`Sched`).
        if left.is_some_and(|s| self.finish_migration(now, s)) {
            requeue = None;
        }
        // Credit2 queues the vCPU that left only after the next one's slice
        // is set; with our extensions on it is queued first (see `switch`).
        let delayed = !self.cfg.extensions();
        if let (Some(s), false) = (requeue, delayed) {
            self.enqueue(s);
        }

        let Some(n) = next else {
            return Ok(self.go_idle(now, pcpu, left, preempted, switch));
        };
        let reset = self.end_epoch_if_due(now, pcpu, n);
        if prev_runnable != Some(n) {
            switch.into = Some(self.switch_in(now, pcpu, n));
        }
        if reset {
            self.balance_load(now, pcpu);
        }
        // What the vCPU that left holds goes back to its domain's pool
        // (after the switch, as Credit2's context_saved).
        if let Some(s) = left {
            self.give_back_budget(now, s);
        }
        let timer = self.arm_slice(now, pcpu, n, directed);
        let kick = self.requeue(now, pcpu, requeue, delayed);
        Ok(Decision { next: Some(self.vcpus[n].id), timer_at: timer, preempted, kick, switch })
    }

    /// Whether the last `schedule()` owes reschedule IPIs beyond its
    /// decision's `kick` (one load: ask after every `schedule()`).
    #[inline(always)]
    pub fn owes_balance_kicks(&self) -> bool {
        self.owed_kicks.any()
    }

    /// The pCPUs that the last `schedule()`'s balancing (after a credit
    /// reset) tickled for a queued vCPU it moved between runqueues, each
    /// owed a reschedule IPI as a decision's `kick` is: an idle pCPU would
    /// otherwise sleep on, tickled, while the vCPU waits. At most two (a
    /// balance moves at most two vCPUs); taking them clears them.
    pub fn take_balance_kicks(&mut self) -> impl Iterator<Item = usize> {
        core::mem::take(&mut self.owed_kicks).0.into_iter().flatten()
    }

    /// Counters and histogram of a vCPU.
    pub fn stats(&self, vcpu: VcpuId) -> Option<&VcpuStats> {
        self.index.get(vcpu).map(|s| &self.vcpus[s].stats)
    }

    /// For the counters the trap code owns (injections, kicks, WFI/WFE traps).
    pub fn stats_mut(&mut self, vcpu: VcpuId) -> Option<&mut VcpuStats> {
        self.index.get(vcpu).map(|s| &mut self.vcpus[s].stats)
    }

    /// All vCPU ids, in registration order.
    pub fn vcpu_ids(&self) -> impl Iterator<Item = VcpuId> + '_ {
        self.vcpus.iter().map(|v| v.id)
    }

    pub fn state(&self, vcpu: VcpuId) -> Option<RunState> {
        self.index.get(vcpu).map(|s| self.vcpus[s].state)
    }

    /// Runnable but descheduled involuntarily (a directed-yield candidate).
    pub fn is_preempted(&self, vcpu: VcpuId) -> bool {
        self.index.get(vcpu).is_some_and(|s| {
            let v = &self.vcpus[s];
            v.preempted && !v.parked && v.state == RunState::Runnable
        })
    }

    /// vCPU currently on `pcpu`.
    pub fn current(&self, pcpu: usize) -> Option<VcpuId> {
        self.pcpus.get(pcpu).and_then(|p| p.curr).map(|s| self.vcpus[s].id)
    }

    /// How many records (queued or member vCPUs, pCPUs, runqueues,
    /// domains) any scheduler has visited in its loops on the calling
    /// thread so far, with the `sched-opcount` feature (0 without it): the
    /// host stress bench's measure of the work per call, which neither the
    /// host's scheduling nor its caches distort. The loops are counted,
    /// not the constant work around them. Per thread, so that a thread
    /// standing for a pCPU counts its own calls whatever runqueue locks
    /// they take.
    pub fn ops() -> u64 {
        #[cfg(feature = "sched-opcount")]
        return OPS.with(|c| c.get());
        #[cfg(not(feature = "sched-opcount"))]
        0
    }

    /// Counts `n` records visited (see [`Scheduler::ops`]); nothing without
    /// the feature, so the EL2 paths carry no counting.
    #[inline(always)]
    pub(super) fn op(&self, n: usize) {
        #[cfg(feature = "sched-opcount")]
        OPS.with(|c| c.set(c.get() + n as u64));
        #[cfg(not(feature = "sched-opcount"))]
        let _ = n;
    }

    /// Every capacity this scheduler's tables hold, and the sizes of its
    /// maps (whose nodes come and go with their entries): equal before and
    /// after an add and remove of the same records when nothing grew.
    #[cfg(test)]
    pub(super) fn capacity_fingerprint(&self) -> Vec<usize> {
        let mut f = alloc::vec![
            self.vcpus.capacity(),
            self.index.dense.capacity(),
            self.index.sparse.len(),
            self.domains.capacity(),
            self.dom_index.len(),
            self.pcpus.capacity(),
            self.rqs.capacity(),
        ];
        for rq in &self.rqs {
            f.extend([rq.pcpus.capacity(), rq.members.capacity(), rq.queue.capacity()]);
        }
        f.extend(self.domains.iter().map(|d| d.parked.capacity()));
        let c = &self.candidates;
        f.extend([c.push.capacity(), c.pull.capacity(), c.mine.capacity(), c.theirs.capacity()]);
        f
    }

    /// Checks that every slot this scheduler stores names the record it
    /// should: the id index, runqueue members and queues (live runqueues),
    /// runners, parked lists, domain slots and the parked count.
    #[cfg(test)]
    pub(super) fn assert_slots_consistent(&self) {
        for (s, v) in self.vcpus.iter().enumerate() {
            assert_eq!(self.index.get(v.id), Some(s), "{}", v.id);
            assert_eq!(self.dom_index.get(&self.domains[v.dom].id), Some(&v.dom), "{}", v.id);
        }
        assert_eq!(self.dom_index.len(), self.domains.len());
        for (r, rq) in self.rqs.iter().enumerate().filter(|&(r, _)| self.owns(r)) {
            for &m in &rq.members {
                assert_eq!(self.vcpus[m].rq, r, "member {m} of rq{r}");
            }
            for &q in &rq.queue {
                assert!(rq.members.contains(&q), "queued {q} of rq{r}");
                assert_eq!(self.vcpus[q].state, RunState::Runnable);
            }
            let live = self.vcpus.iter().filter(|v| v.rq == r).count();
            assert_eq!(rq.members.len(), live, "rq{r}'s members");
        }
        for (p, pc) in self.pcpus.iter().enumerate().filter(|(_, pc)| self.owns(pc.rq)) {
            if let Some(c) = pc.curr {
                assert!(c < self.vcpus.len(), "pCPU {p} runs slot {c}");
            }
        }
        self.assert_masks();
        for (d, dm) in self.domains.iter().enumerate() {
            assert_eq!(dm.nr_vcpus as usize, self.vcpus.iter().filter(|v| v.dom == d).count());
            assert!(dm.parked.iter().all(|&s| self.vcpus[s].parked && self.vcpus[s].dom == d));
        }
        assert_eq!(self.nr_parked, self.domains.iter().map(|d| d.parked.len()).sum::<usize>());
    }

    /// Checks each live runqueue's busy mask against its pCPUs' runners.
    #[cfg(test)]
    pub(super) fn assert_masks(&self) {
        for (r, rq) in self.rqs.iter().enumerate().filter(|&(r, _)| self.owns(r)) {
            let busy = rq.pcpus.iter().enumerate().fold(0u32, |m, (i, &p)| {
                let running = self.pcpus[p].curr.is_some_and(|c| self.vcpus[c].state == RunState::Running(p));
                m | (u32::from(running) << i)
            });
            assert_eq!(rq.busy, busy, "rq{r}'s busy mask");
            assert_eq!(rq.tickled & !((1u32 << rq.pcpus.len()) - 1), 0, "rq{r}'s tickled mask");
        }
    }

    // ----- lookups shared by the policy files -----

    pub(super) fn check_pcpu(&self, p: usize) -> Result<(), SchedError> {
        if p < self.pcpus.len() {
            Ok(())
        } else {
            Err(SchedError::BadPcpu(p))
        }
    }

    pub(super) fn slot(&self, v: VcpuId) -> Result<usize, SchedError> {
        self.index.get(v).ok_or(SchedError::UnknownVcpu(v))
    }

    pub(super) fn dom_slot(&self, d: DomainId) -> Result<usize, SchedError> {
        self.dom_index.get(&d).copied().ok_or(SchedError::UnknownDomain(d))
    }

    /// Whether runqueue `rq`'s records are live here (see `shard`).
    #[inline(always)]
    pub(super) fn owns(&self, rq: usize) -> bool {
        self.shard.is_none_or(|r| r == rq)
    }

    /// `p` now runs a vCPU (`busy`) or not: its bit in its runqueue's busy
    /// mask. Set where a vCPU is switched in; cleared where `p`'s runner
    /// stops (block, power-off) and where `p` goes idle. A runner that
    /// `schedule()` replaces or parks leaves the bit set until the same
    /// call switches another in or goes idle: nothing reads `p`'s own bit
    /// in between.
    #[inline(always)]
    pub(super) fn mark_busy(&mut self, p: usize, busy: bool) {
        let pc = &self.pcpus[p];
        let m = &mut self.rqs[pc.rq].busy;
        *m = if busy { *m | pc.bit } else { *m & !pc.bit };
    }

    /// Whether a tickle asked `p` to reschedule and it has not yet.
    #[inline(always)]
    pub(super) fn is_tickled(&self, p: usize) -> bool {
        let pc = &self.pcpus[p];
        self.rqs[pc.rq].tickled & pc.bit != 0
    }

    pub(super) fn running(&self, p: usize) -> Result<usize, SchedError> {
        self.check_pcpu(p)?;
        match self.pcpus[p].curr {
            Some(s) if self.vcpus[s].state == RunState::Running(p) => Ok(s),
            _ => Err(SchedError::NotRunning(p)),
        }
    }
}
