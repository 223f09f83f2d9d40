//! Life cycle: registering domains and vCPUs, changing a domain's weight
//! and cap at run time, and the runner's own exits (PSCI CPU_ON/OFF, WFI,
//! WFE).
//!
//! `add_domain(dom, DomainParams { weight, cap_percent })` first, then
//! `add_vcpu(vcpu, dom, affinity)` (vCPU ids are unique across domains).
//! Weights are 1..=65535; a cap is 1..=100 × nr_pcpus percent of one pCPU.
//! Contract: bad values, unknown or duplicate ids are
//! [`SchedError`]s and change nothing; a change that affects credit charges
//! the run time before it at the old values.

use super::credit::CREDIT_INIT_NS;
use super::domain::{Domain, SharedPool};
use super::{DomainId, DomainParams, RunState, SchedConfig, SchedError, Scheduler, Vcpu, VcpuId, WakeAction};
use crate::stats::VcpuStats;

impl Scheduler {
    /// Register a domain. Its cap periods run from time 0 of the caller's
    /// clock, with a full budget at first.
    pub fn add_domain(&mut self, dom: DomainId, params: DomainParams) -> Result<(), SchedError> {
        self.add_domain_pooled(dom, params, None)
    }

    /// [`Scheduler::add_domain`], drawing from `pool` when given (the
    /// domain's copy in another runqueue's scheduler made it: `Sched`).
    pub(super) fn add_domain_pooled(
        &mut self,
        dom: DomainId,
        params: DomainParams,
        pool: Option<SharedPool>,
    ) -> Result<(), SchedError> {
        self.check_new_domain(dom, params)?;
        self.room_for_domain()?;
        self.dom_index.insert(dom, self.domains.len());
        let period = self.cfg.cap_period_ns;
        self.domains.push(Domain::with_pool(dom, params, 0, period, pool.unwrap_or_default()));
        self.note_replenishments();
        Ok(())
    }

    /// Whether domain `dom` may be added with `params` (not yet known, valid).
    pub(super) fn check_new_domain(&self, dom: DomainId, params: DomainParams) -> Result<(), SchedError> {
        if self.dom_index.contains_key(&dom) {
            return Err(SchedError::DuplicateDomain(dom));
        }
        params.validate(self.pcpus.len())
    }

    /// Room for one more domain record, so that adding it cannot fail on
    /// the heap half-way (the id map's node and the budget pool are the
    /// only allocations left, and they are freed with the domain).
    pub(super) fn room_for_domain(&mut self) -> Result<(), SchedError> {
        self.domains.try_reserve(1).map_err(|_| SchedError::NoMemory)
    }

    /// Removes domain `dom` and its vCPUs, which must all be offline
    /// ([`SchedError::DomainBusy`] otherwise, and nothing changes). Every
    /// other vCPU keeps its state, credit and statistics; their slots move
    /// down, keeping their order, and every slot stored anywhere follows.
    /// A pCPU whose runner was powered off and not yet scheduled out
    /// forgets it (its next `schedule()` starts from idle). Allocates only
    /// a transient map (failing with [`SchedError::NoMemory`]), frees the
    /// domain's own records, and keeps every table's capacity.
    pub fn remove_domain(&mut self, dom: DomainId) -> Result<(), SchedError> {
        let d = self.dom_slot(dom)?;
        if self.has_live_online(d) {
            return Err(SchedError::DomainBusy(dom));
        }
        let mut map: alloc::vec::Vec<Option<usize>> = alloc::vec::Vec::new();
        map.try_reserve_exact(self.vcpus.len()).map_err(|_| SchedError::NoMemory)?;
        let mut next = 0;
        for v in &self.vcpus {
            map.push((v.dom != d).then(|| {
                next += 1;
                next - 1
            }));
        }
        let m = |s: usize| map.get(s).copied().flatten();
        for rq in &mut self.rqs {
            for list in [&mut rq.members, &mut rq.queue] {
                list.retain_mut(|s| m(*s).map(|n| *s = n).is_some());
            }
        }
        for p in &mut self.pcpus {
            p.curr = p.curr.and_then(m);
            p.yield_target = p.yield_target.and_then(m);
        }
        self.emigrant = self.emigrant.and_then(m);
        for dm in &mut self.domains {
            dm.parked.retain_mut(|s| m(*s).map(|n| *s = n).is_some());
        }
        for (old, v) in self.vcpus.iter().enumerate() {
            match m(old) {
                Some(new) => self.index.insert(v.id, new),
                None => self.index.remove(v.id),
            }
        }
        self.vcpus.retain(|v| v.dom != d);
        for v in &mut self.vcpus {
            if v.dom > d {
                v.dom -= 1;
            }
        }
        self.domains.remove(d);
        self.dom_index.remove(&dom);
        for slot in self.dom_index.values_mut() {
            if *slot > d {
                *slot -= 1;
            }
        }
        self.nr_parked = self.domains.iter().map(|d| d.parked.len()).sum();
        self.update_max_weights();
        self.note_replenishments();
        Ok(())
    }

    /// Whether a vCPU of domain slot `d` whose record is live here (its
    /// runqueue's) is not offline.
    pub(super) fn has_live_online(&self, d: usize) -> bool {
        self.vcpus.iter().any(|v| v.dom == d && self.owns(v.rq) && v.state != RunState::Offline)
    }

    /// Room, reserved exactly, for vCPU ids below `vcpus` (as many vCPUs)
    /// and `domains` domains in every table that registering them grows
    /// (the vCPU records, the dense id table, the domain records, and the
    /// members and queue of each runqueue live here), so that adding and
    /// removing within those bounds leaves every capacity as it was: the
    /// heap returns to where it was but for map nodes, which removal frees.
    /// Fails with [`SchedError::NoMemory`], keeping what it reserved.
    pub fn reserve(&mut self, vcpus: u32, domains: usize) -> Result<(), SchedError> {
        fn exact<T>(v: &mut alloc::vec::Vec<T>, n: usize) -> Result<(), SchedError> {
            v.try_reserve_exact(n.saturating_sub(v.len())).map_err(|_| SchedError::NoMemory)
        }
        let n = vcpus as usize;
        exact(&mut self.vcpus, n)?;
        exact(&mut self.domains, domains)?;
        exact(&mut self.index.dense, n.min(super::DENSE_IDS as usize))?;
        let shard = self.shard;
        for (_, rq) in self.rqs.iter_mut().enumerate().filter(|&(i, _)| shard.is_none_or(|r| r == i)) {
            exact(&mut rq.members, n)?;
            exact(&mut rq.queue, n)?;
        }
        if self.rqs.len() > 1 {
            exact(&mut self.candidates.push, n)?;
            exact(&mut self.candidates.pull, n)?;
            exact(&mut self.candidates.mine, n)?;
            exact(&mut self.candidates.theirs, n)?;
        }
        Ok(())
    }

    /// Takes `cfg` (from [`SchedConfig::with_live`]) while running. Turning
    /// the extensions off (`sched_wake_preempt=off`) is refused while a
    /// vCPU has its own weight, and drops every pCPU's extension state (a
    /// lock-holder grace, a protected run, a pending wake-preemption, a
    /// directed yield's loan): from the next call on, the scheduler is
    /// Credit2 alone.
    pub fn set_config(&mut self, cfg: SchedConfig) -> Result<(), SchedError> {
        let boot_only = (cfg.runqueue, cfg.max_cpus_runqueue, cfg.cap_period_ns);
        if boot_only != (self.cfg.runqueue, self.cfg.max_cpus_runqueue, self.cfg.cap_period_ns) {
            return Err(SchedError::NotLive);
        }
        if !cfg.extensions() && self.vcpus.iter().any(|v| v.weight_override.is_some()) {
            return Err(SchedError::ExtensionOff("sched_vcpu_weight"));
        }
        if !cfg.extensions() {
            for p in &mut self.pcpus {
                (p.crit_until, p.grace_limit, p.protect_until) = (0, 0, 0);
                (p.pending_preempt, p.yield_target, p.loan) = (None, None, false);
            }
        }
        self.cfg = cfg;
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
        // As Credit2: at most 100 % per vCPU of the domain.
        let nr = self.domains[d].nr_vcpus;
        if let (Some(c), true) = (params.cap_percent, nr > 0) {
            if u64::from(c) > 100 * u64::from(nr) {
                return Err(SchedError::BadCap(c));
            }
        }
        for p in 0..self.pcpus.len() {
            if let Some(s) = self.pcpus[p].curr {
                self.burn(s, now);
            }
        }
        let old_cap = self.domains[d].params.cap_percent;
        self.domains[d].params.weight = params.weight;
        self.domains[d].set_cap(params.cap_percent, now);
        self.note_replenishments();
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

    /// Register a vCPU of domain `dom` (offline until [`Scheduler::power_on`]).
    /// `affinity = Some(p)` pins it to pCPU `p`. Fails with
    /// [`SchedError::NoMemory`] (and changes nothing) if the heap has no
    /// room for its records.
    pub fn add_vcpu(&mut self, vcpu: VcpuId, dom: DomainId, affinity: Option<usize>) -> Result<(), SchedError> {
        let d = self.check_new_vcpu(vcpu, dom, affinity)?;
        let home = match affinity {
            Some(p) => p,
            None => self.least_homed_pcpu()?,
        };
        self.room_for_vcpu(vcpu, d)?;
        self.add_vcpu_at(vcpu, d, affinity, home);
        Ok(())
    }

    /// The domain slot of a vCPU about to be added, if it may be.
    pub(super) fn check_new_vcpu(
        &self,
        vcpu: VcpuId,
        dom: DomainId,
        affinity: Option<usize>,
    ) -> Result<usize, SchedError> {
        if self.index.contains_key(vcpu) {
            return Err(SchedError::DuplicateVcpu(vcpu));
        }
        if let Some(p) = affinity {
            self.check_pcpu(p)?;
        }
        self.dom_slot(dom)
    }

    /// The pCPU fewest live vCPUs last ran on (or were placed on).
    fn least_homed_pcpu(&self) -> Result<usize, SchedError> {
        let mut homed = zeroes(self.pcpus.len())?;
        self.count_homes(&mut homed);
        Ok(least_homed(&homed))
    }

    /// Adds to `homed[p]` the live vCPUs that last ran on (or were placed
    /// on) pCPU `p`.
    pub(super) fn count_homes(&self, homed: &mut [usize]) {
        for v in self.vcpus.iter().filter(|v| self.owns(v.rq)) {
            if let Some(c) = homed.get_mut(v.home) {
                *c += 1;
            }
        }
    }

    /// Room for vCPU `vcpu` of domain slot `d` in every table
    /// [`Scheduler::add_vcpu_at`] grows: afterwards it allocates nothing
    /// but a node of the map of ids from [`DENSE_IDS`](super::DENSE_IDS)
    /// on. Any runqueue here may come to hold every vCPU (balancing,
    /// directed yields) and any of its domain's vCPUs may be parked, so
    /// each has room for all of them: queueing, moving and parking never
    /// allocate at run time, under the lock.
    pub(super) fn room_for_vcpu(&mut self, vcpu: VcpuId, d: usize) -> Result<(), SchedError> {
        fn room<T>(v: &mut alloc::vec::Vec<T>, n: usize) -> Result<(), SchedError> {
            v.try_reserve(n.saturating_sub(v.len())).map_err(|_| SchedError::NoMemory)
        }
        let n = self.vcpus.len() + 1;
        room(&mut self.vcpus, n)?;
        if vcpu.0 < super::DENSE_IDS {
            room(&mut self.index.dense, vcpu.0 as usize + 1)?;
        }
        let shard = self.shard;
        for (_, rq) in self.rqs.iter_mut().enumerate().filter(|&(i, _)| shard.is_none_or(|r| r == i)) {
            room(&mut rq.members, n)?;
            room(&mut rq.queue, n)?;
        }
        if self.rqs.len() > 1 {
            room(&mut self.candidates.push, n)?;
            room(&mut self.candidates.pull, n)?;
            room(&mut self.candidates.mine, n)?;
            room(&mut self.candidates.theirs, n)?;
        }
        let dom = &mut self.domains[d];
        room(&mut dom.parked, dom.nr_vcpus as usize + 1)
    }

    /// Registers vCPU `vcpu` of domain slot `d` with its last pCPU `home`
    /// (checked by the caller, with [`Scheduler::room_for_vcpu`] made).
    pub(super) fn add_vcpu_at(&mut self, vcpu: VcpuId, d: usize, affinity: Option<usize>, home: usize) {
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
            tickled_cpu: None,
            avgload: 0,
            load_last: 0,
            load_seen: 0,
            runnable_units: 0,
            served_run: 0,
            served_load: 0,
            served_seen: (0, 0),
            served_last: 0,
            migrate_to: None,
            stats: VcpuStats::default(),
        });
        self.domains[d].nr_vcpus += 1;
        let home_rq = self.pcpus[home].rq;
        if self.owns(home_rq) {
            let rq = &mut self.rqs[home_rq];
            rq.members.push(self.vcpus.len() - 1);
            rq.max_weight = rq.max_weight.max(weight);
        }
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
        self.note_load(s, -1, now);
        self.mark_busy(pcpu, false);
        self.vcpus[s].state = RunState::Offline;
        self.vcpus[s].woken_at = None;
        Ok(self.vcpus[s].id)
    }

    /// The vCPU running on `pcpu` blocks (WFI with nothing pending). The
    /// caller must check for pending virtual interrupts first, then call
    /// `schedule()`.
    pub fn block(&mut self, now: u64, pcpu: usize) -> Result<VcpuId, SchedError> {
        let s = self.running(pcpu)?;
        self.burn(s, now);
        self.note_load(s, -1, now);
        self.mark_busy(pcpu, false);
        self.vcpus[s].state = RunState::Blocked;
        Ok(self.vcpus[s].id)
    }

    /// The vCPU running on `pcpu` yields (WFE trap), preferably to `target`
    /// (directed yield to a preempted vCPU of the same VM: the pick takes it
    /// only if it is still runnable, preempted and unparked then). Call
    /// `schedule()` next. The yielder runs again only if nothing else can.
    /// With the extensions off the yield is Credit2's, undirected: the
    /// target is ignored.
    pub fn yield_to(&mut self, now: u64, pcpu: usize, target: Option<VcpuId>) -> Result<(), SchedError> {
        let s = self.running(pcpu)?;
        let t = match target {
            Some(t) if self.cfg.extensions() => Some(self.slot(t)?),
            _ => None,
        };
        self.burn(s, now);
        self.vcpus[s].yielding = true;
        self.vcpus[s].stats.counters.yields += 1;
        self.pcpus[pcpu].yield_target = t.filter(|&t| t != s);
        Ok(())
    }
}

/// `n` zero counts, or [`SchedError::NoMemory`].
pub(super) fn zeroes(n: usize) -> Result<alloc::vec::Vec<usize>, SchedError> {
    let mut v = alloc::vec::Vec::new();
    v.try_reserve_exact(n).map_err(|_| SchedError::NoMemory)?;
    v.resize(n, 0);
    Ok(v)
}

/// The first pCPU with the fewest vCPUs in `homed` (per pCPU counts).
pub(super) fn least_homed(homed: &[usize]) -> usize {
    (0..homed.len()).min_by_key(|&p| homed[p]).unwrap_or(0)
}
