//! Scheduler domains: Credit2's per-domain weight and cap.
//!
//! Every vCPU belongs to one domain ([`DomainId`], Dom0 = 0). A domain's
//! weight is every one of its vCPUs' weight (Credit2 gives each unit the
//! domain's weight; it is not split between them). A cap of `c` % gives the
//! domain a budget of `c / 100 × CAP_PERIOD_NS` of run time (one pCPU's
//! worth per 100 %) every period; its running vCPUs draw it in quotas of
//! `budget / nr_vcpus` (at least `CAP_MIN_QUOTA_NS`), give back what they
//! did not use when they are switched out, and are *parked* when there is
//! none left: off the runqueues, runnable again at the next replenishment.
//! This module holds the domain's book-keeping; `Scheduler` (sched/cap.rs, sched/wake.rs)
//! decides when to grab, return, park and replenish.

pub use crate::ids::DomainId;

use super::{SchedError, DEFAULT_WEIGHT};
use crate::sync::Mutex;
use alloc::sync::Arc;
use alloc::vec::Vec;

/// Budget replenishment period of capped domains by default, ns (Credit2's
/// `CSCHED2_BDGT_REPL_PERIOD` at its default `credit2_cap_period_ms=10`).
pub const CAP_PERIOD_NS: u64 = 10_000_000;
/// Smallest budget quota a vCPU grabs (Credit2: `CSCHED2_MIN_TIMER`).
pub const CAP_MIN_QUOTA_NS: i64 = 500_000;
/// Largest weight (Credit2 takes a `uint16_t`-sized weight: 1..=65535).
pub const MAX_WEIGHT: u32 = 65535;

/// What the caller sets per domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DomainParams {
    /// Credit2 weight of each of the domain's vCPUs, 1..=65535 (default 256).
    pub weight: u32,
    /// Credit2 cap in percent of one pCPU, 1..=100 × nr_pcpus; `None` = uncapped.
    pub cap_percent: Option<u32>,
}

impl Default for DomainParams {
    fn default() -> Self {
        Self { weight: DEFAULT_WEIGHT, cap_percent: None }
    }
}

impl DomainParams {
    /// Check the parameters for a scheduler with `nr_pcpus` pCPUs (a cap
    /// of a domain with vCPUs is checked against those too, by
    /// [`Scheduler::set_domain_params`](super::Scheduler::set_domain_params)).
    pub fn validate(&self, nr_pcpus: usize) -> Result<(), SchedError> {
        if self.weight == 0 || self.weight > MAX_WEIGHT {
            return Err(SchedError::BadWeight(self.weight));
        }
        if let Some(c) = self.cap_percent {
            let max = 100u64.saturating_mul(nr_pcpus as u64);
            if c == 0 || u64::from(c) > max {
                return Err(SchedError::BadCap(c));
            }
        }
        Ok(())
    }
}

/// Per-domain counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DomainStats {
    /// Run time of all its vCPUs, ns (as charged by the scheduler).
    pub run_ns: u64,
    /// Credit resets of runqueues holding (online) vCPUs of the domain.
    pub credit_resets: u64,
    /// Times one of its vCPUs was parked for lack of budget.
    pub cap_parks: u64,
    /// Budget replenishments (capped domains).
    pub replenishments: u64,
}

/// A capped domain's budget, shared by every runqueue's scheduler that
/// holds vCPUs of the domain (`Sched`: one lock per runqueue): the one
/// thing about a domain that several runqueues change. A leaf lock, taken
/// inside a runqueue's and never around one.
#[derive(Debug, Default)]
pub(super) struct Pool {
    /// Budget per period, ns (0 when uncapped).
    tot_budget: i64,
    /// Budget left this period, ns (may be negative: overrun debt).
    budget: i64,
    /// Next replenishment (valid when capped).
    next_repl: u64,
}

/// A pool to share between the runqueues' copies of one domain.
pub(super) type SharedPool = Arc<Mutex<Pool>>;

/// A domain as the scheduler keeps it (one copy per runqueue under
/// `Sched`; all but the pool are the same in every copy or per runqueue).
pub(super) struct Domain {
    pub id: DomainId,
    pub params: DomainParams,
    /// Budget per period, ns (0 when uncapped): the pool's, copied.
    pub tot_budget: i64,
    /// The pool's replenishment this copy last saw: when the pool's moves
    /// past it, another runqueue (or this one) replenished, and this copy's
    /// parked vCPUs come back.
    pub next_repl: u64,
    /// The replenishment period (`credit2_cap_period_ms`), ns.
    pub period: u64,
    pub nr_vcpus: u32,
    /// Slots of its vCPUs parked for lack of budget, ascending: a
    /// replenishment walks these, not every vCPU. Its capacity covers all
    /// its vCPUs from `add_vcpu` on, so parking never allocates.
    pub parked: Vec<usize>,
    /// The last credit reset counted in `stats.credit_resets`, as (runqueue,
    /// that runqueue's reset number): a reset counts once per domain however
    /// many of its vCPUs it touches, with no list to build.
    pub last_reset: Option<(usize, u64)>,
    pub stats: DomainStats,
    pool: SharedPool,
}

impl Domain {
    /// A domain drawing from `pool` (a new one: its own), which other
    /// copies of it may share:
    /// setting the same cap on each copy changes the pool once.
    pub fn with_pool(id: DomainId, params: DomainParams, now: u64, period: u64, pool: SharedPool) -> Self {
        let uncapped = DomainParams { cap_percent: None, ..params };
        let mut d = Self {
            id,
            params: uncapped,
            tot_budget: 0,
            next_repl: 0,
            period: period.max(1),
            nr_vcpus: 0,
            parked: Vec::new(),
            last_reset: None,
            stats: DomainStats::default(),
            pool,
        };
        d.set_cap(params.cap_percent, now);
        d
    }

    /// The pool, for another runqueue's copy of this domain.
    pub fn pool(&self) -> SharedPool {
        self.pool.clone()
    }

    pub fn capped(&self) -> bool {
        self.params.cap_percent.is_some()
    }

    /// Budget left in the pool this period, ns.
    pub fn budget(&self) -> i64 {
        self.pool.lock().budget
    }

    /// (Re)sets the cap. A domain that was uncapped starts a full budget
    /// and its first period now; a changed cap keeps the period and clips
    /// what is left to the new budget. Setting what is set changes nothing.
    pub fn set_cap(&mut self, cap: Option<u32>, now: u64) {
        self.params.cap_percent = cap;
        let mut pool = self.pool.lock();
        let was_capped = pool.tot_budget > 0;
        match cap {
            None => {
                pool.tot_budget = 0;
                pool.budget = 0;
            }
            Some(c) => {
                pool.tot_budget = (self.period.min(i64::MAX as u64) as i64).saturating_mul(i64::from(c)) / 100;
                if was_capped {
                    pool.budget = pool.budget.min(pool.tot_budget);
                } else {
                    pool.budget = pool.tot_budget;
                    pool.next_repl = now.saturating_add(self.period);
                }
            }
        }
        self.tot_budget = pool.tot_budget;
        self.next_repl = pool.next_repl;
    }

    /// What one vCPU grabs at a time: a fair share of the period's budget.
    pub fn quota(&self) -> i64 {
        (self.tot_budget / i64::from(self.nr_vcpus.max(1))).max(CAP_MIN_QUOTA_NS)
    }

    /// Replenish if the period is over: one period's budget per period
    /// passed (a late call catches up), never more than one period's in
    /// the pool. Returns true if the pool was replenished since this copy
    /// last asked (by this call or another runqueue's) and holds budget:
    /// this copy's parked vCPUs may come back.
    pub fn replenish_due(&mut self, now: u64) -> bool {
        if !self.capped() {
            return false;
        }
        let mut pool = self.pool.lock();
        if now >= pool.next_repl {
            let periods = (now - pool.next_repl) / self.period + 1;
            pool.next_repl = pool.next_repl.saturating_add(periods.saturating_mul(self.period));
            let add = pool.tot_budget.saturating_mul(periods.min(i64::MAX as u64) as i64);
            pool.budget = pool.budget.saturating_add(add).min(pool.tot_budget);
            self.stats.replenishments += 1;
        }
        let seen = core::mem::replace(&mut self.next_repl, pool.next_repl);
        seen != pool.next_repl && pool.budget > 0
    }

    /// A vCPU holding `held` (≤ 0: used up, maybe overrun) asks for more.
    /// Returns the new budget of the vCPU; 0 means none is left: park it.
    pub fn grab(&mut self, held: i64) -> i64 {
        let quota = self.quota();
        let mut pool = self.pool.lock();
        pool.budget = pool.budget.saturating_add(held);
        if pool.budget <= 0 {
            return 0;
        }
        let take = quota.min(pool.budget);
        pool.budget -= take;
        take
    }

    /// A vCPU switched out gives back what it holds (negative: its overrun
    /// is charged to the pool); returns the budget the pool has then.
    pub fn give_back(&mut self, held: i64) -> i64 {
        let mut pool = self.pool.lock();
        pool.budget = pool.budget.saturating_add(held);
        pool.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_checked() {
        assert_eq!(DomainParams::default().validate(2), Ok(()));
        assert_eq!(DomainParams { weight: 0, cap_percent: None }.validate(2), Err(SchedError::BadWeight(0)));
        assert_eq!(DomainParams { weight: 65536, cap_percent: None }.validate(2), Err(SchedError::BadWeight(65536)));
        assert_eq!(DomainParams { weight: 1, cap_percent: Some(0) }.validate(2), Err(SchedError::BadCap(0)));
        assert_eq!(DomainParams { weight: 1, cap_percent: Some(200) }.validate(2), Ok(()));
        assert_eq!(DomainParams { weight: 1, cap_percent: Some(201) }.validate(2), Err(SchedError::BadCap(201)));
        assert_eq!(
            DomainParams { weight: 1, cap_percent: Some(u32::MAX) }.validate(2),
            Err(SchedError::BadCap(u32::MAX))
        );
    }

    #[test]
    fn budget_grab_give_back_replenish() {
        let mut d = Domain::with_pool(
            3,
            DomainParams { weight: 256, cap_percent: Some(25) },
            0,
            CAP_PERIOD_NS,
            SharedPool::default(),
        );
        d.nr_vcpus = 1;
        assert_eq!((d.tot_budget, d.budget(), d.next_repl), (2_500_000, 2_500_000, CAP_PERIOD_NS));
        assert_eq!(d.grab(0), 2_500_000);
        assert_eq!(d.grab(-1_000), 0, "overrun and nothing left");
        assert_eq!(d.budget(), -1_000);
        assert!(!d.replenish_due(CAP_PERIOD_NS - 1));
        assert!(d.replenish_due(CAP_PERIOD_NS));
        assert_eq!((d.budget(), d.next_repl), (2_499_000, 2 * CAP_PERIOD_NS), "the debt is paid");
        // Late by three periods: full budget, never more, next period on the grid.
        assert!(d.replenish_due(5 * CAP_PERIOD_NS + 7));
        assert_eq!((d.budget(), d.next_repl), (2_500_000, 6 * CAP_PERIOD_NS));
        // Two vCPUs share in quotas of half the budget.
        d.nr_vcpus = 2;
        assert_eq!(d.grab(0), 1_250_000);
        assert_eq!(d.give_back(250_000), 1_500_000);
        // Uncapping clears the pool; capping again starts a period now.
        d.set_cap(None, 61 * CAP_PERIOD_NS / 10);
        assert!(!d.capped() && !d.replenish_due(u64::MAX));
        d.set_cap(Some(150), 7 * CAP_PERIOD_NS);
        assert_eq!((d.budget(), d.next_repl), (15_000_000, 8 * CAP_PERIOD_NS));
    }

    #[test]
    fn copies_sharing_a_pool_replenish_it_once_and_each_see_it() {
        let params = DomainParams { weight: 256, cap_percent: Some(50) };
        let mut a = Domain::with_pool(3, params, 0, CAP_PERIOD_NS, SharedPool::default());
        let mut b = Domain::with_pool(3, params, 0, CAP_PERIOD_NS, a.pool());
        a.nr_vcpus = 2;
        b.nr_vcpus = 2;
        assert_eq!(b.budget(), 5_000_000, "setting the same cap again changes nothing");
        assert_eq!(a.grab(0), 2_500_000);
        assert_eq!(b.grab(0), 2_500_000);
        assert_eq!(b.grab(-100), 0, "both drew from one pool");
        assert!(a.replenish_due(CAP_PERIOD_NS));
        assert!(b.replenish_due(CAP_PERIOD_NS), "b sees a's replenishment");
        assert!(!b.replenish_due(CAP_PERIOD_NS), "once");
        assert_eq!((a.budget(), a.stats.replenishments + b.stats.replenishments), (4_999_900, 1));
    }
}
