//! Caps: a capped domain's budget on the scheduler's side — vCPUs holding
//! quotas, parking, and the timers that bring parked vCPUs back.
//!
//! [`super::domain`] keeps each domain's pool (grab, give back, replenish);
//! this file decides when a vCPU draws from it and when it is parked. A cap is
//! 1..=100 × nr_pcpus percent of one pCPU: a budget of `cap% ×
//! CAP_PERIOD_NS` (10 ms) per period, one pCPU's worth per 100 %,
//! replenished every period (periods counted from time 0 of the caller's
//! clock; the pool never holds more than one period's, an overrun is paid
//! from the next). Running vCPUs draw it in quotas of the period's budget /
//! nr_vcpus (≥ 500 µs) and give back what is left when switched out; a vCPU
//! with none is *parked* (runnable, off the runqueues;
//! [`Scheduler::is_parked`]) until a replenishment or a sibling's give-back.
//!
//! Contracts:
//! * While a vCPU is parked every pCPU's timer is no later than its
//!   domain's replenishment (`Scheduler::clamp_timer`), so
//!   unparking happens at a `schedule()` at that time.
//! * The budget bounds a slice hard, after the min slice and the ratelimit
//!   (Credit2 lets its minimum timer overrun the budget and charges the debt
//!   to the next period), so a capped domain gets its exact share in every
//!   period.
//!
//! Parked vCPUs come back through the wake path (`wake.rs`), which queues
//! them; this file uses no other policy file of `sched`.

use super::{DomainId, DomainParams, DomainStats, RunState, Scheduler, VcpuId, MIN_TIMER_NS};

impl Scheduler {
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
            .filter(|v| v.dom == d && self.owns(v.rq) && matches!(v.state, RunState::Running(_)))
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
        self.index.get(vcpu).map(|s| self.domains[self.vcpus[s].dom].id)
    }

    /// Parked for lack of budget (runnable, not on a runqueue).
    pub fn is_parked(&self, vcpu: VcpuId) -> bool {
        self.index.get(vcpu).is_some_and(|s| self.vcpus[s].parked)
    }

    /// Make sure the (capped) vCPU `s` holds budget, drawing a quota from
    /// its domain's pool; false if there is none left (park it).
    #[inline(always)]
    pub(super) fn ensure_budget(&mut self, s: usize) -> bool {
        self.no_caps() || self.ensure_budget_capped(s)
    }

    /// [`Self::ensure_budget`] while some domain is capped (out of the
    /// uncapped path's line: it takes a pool's lock).
    #[inline(never)]
    fn ensure_budget_capped(&mut self, s: usize) -> bool {
        let d = self.vcpus[s].dom;
        if !self.domains[d].capped() || self.vcpus[s].budget > 0 {
            return true;
        }
        let held = self.vcpus[s].budget;
        self.vcpus[s].budget = self.domains[d].grab(held);
        self.vcpus[s].budget > 0
    }

    /// Park the runnable vCPU `s` (taken off its runqueue) until its domain has budget.
    pub(super) fn park(&mut self, s: usize) {
        self.unqueue(s);
        self.set_parked(s, true);
        self.domains[self.vcpus[s].dom].stats.cap_parks += 1;
    }

    /// Parks or unparks vCPU `s`, keeping the count of parked vCPUs.
    pub(super) fn set_parked(&mut self, s: usize, parked: bool) {
        if self.vcpus[s].parked != parked {
            self.vcpus[s].parked = parked;
            let list = &mut self.domains[self.vcpus[s].dom].parked;
            let at = list.partition_point(|&x| x < s);
            if parked {
                self.nr_parked += 1;
                list.insert(at, s);
            } else {
                self.nr_parked -= 1;
                list.remove(at);
            }
            let n = list.len();
            self.op(n);
        }
    }

    /// When the running vCPU `s`'s budget runs out (`u64::MAX`: uncapped).
    /// The budget bounds the slice hard, after min slice and ratelimit
    /// (Credit2 lets the minimum timer overrun it and charges the debt to
    /// the next period; we keep each period exact).
    pub(super) fn budget_end(&self, now: u64, s: usize) -> u64 {
        if self.no_caps() || !self.domains[self.vcpus[s].dom].capped() {
            return u64::MAX;
        }
        let b = self.vcpus[s].budget.max(0) as u64;
        now.saturating_add(b.max(MIN_TIMER_NS))
    }

    /// The earliest replenishment that will unpark someone.
    pub(super) fn next_unpark(&self) -> Option<u64> {
        debug_assert_eq!(self.nr_parked, self.vcpus.iter().filter(|v| v.parked).count(), "nr_parked");
        debug_assert_eq!(self.nr_parked, self.domains.iter().map(|d| d.parked.len()).sum::<usize>(), "parked lists");
        if self.nr_parked == 0 {
            return None;
        }
        self.op(self.domains.len());
        self.domains.iter().filter(|d| !d.parked.is_empty()).map(|d| d.next_repl).min()
    }

    /// A pCPU's timer, brought forward to the next replenishment while a
    /// vCPU is parked, so that every pCPU reschedules when it comes back.
    pub(super) fn clamp_timer(&self, at: Option<u64>) -> Option<u64> {
        match (at, self.next_unpark()) {
            (Some(a), Some(r)) => Some(a.min(r)),
            (a, r) => a.or(r),
        }
    }
}
