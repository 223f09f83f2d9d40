//! [`Sched`]: the scheduler the pCPUs share, with a lock per runqueue.
//!
//! # Why
//! With one lock over the whole [`Scheduler`], every wake, block and
//! `schedule()` of every pCPU waits for every other: at Graviton's 64–192
//! pCPUs that lock is the machine's. Credit2 gives each runqueue (at most
//! `sched_credit2_max_cpus_runqueue` pCPUs) a lock of its own; so do we.
//!
//! # Shape
//! * One [`Scheduler`] per runqueue, each behind its own fair lock
//!   ([`TicketMutex`]: first come, first served among running waiters;
//!   see `sync::ticket`). Each knows
//!   every domain, vCPU and pCPU under the same slot numbers (they are
//!   registered in every one, in one order), but only its runqueue's
//!   records are *live*: its pCPUs, and the vCPUs whose `Vcpu::rq` is its
//!   runqueue. A copy that is not live names the runqueue the vCPU went
//!   to. The policy code is the same as with one lock: it already looks
//!   only at the runqueue of the vCPU or pCPU at hand.
//! * A vCPU's runqueue is published in a lock-free route table (ids below
//!   [`DENSE_IDS`](super::DENSE_IDS)). A call about a vCPU reads it, locks
//!   that runqueue and checks the vCPU is live there; if it moved between
//!   the read and the lock, it reads again. A call about a pCPU locks the
//!   pCPU's runqueue: its runner is live there.
//! * A capped domain's budget pool is shared by its copies behind a leaf
//!   lock (`domain::Pool`); the rest of a domain's counters are per
//!   runqueue, summed when read.
//! * Moves between runqueues are Credit2's `balance_load`, on the pCPU that
//!   just reset its runqueue's credit: it `try_lock`s each other runqueue
//!   in turn to bring its load average up to date (skipping a busy one),
//!   then `try_lock`s the one that differs most again and gives up if it
//!   is busy now (as Credit2 does). A vCPU that is not running moves at
//!   once: its record is copied into the other runqueue's scheduler, which
//!   queues and tickles it there; one that runs moves when it leaves its
//!   pCPU (the *emigrant* of that `schedule()`), after the runqueue it
//!   leaves is unlocked, so no pCPU ever waits for a second runqueue lock
//!   while holding one. While it is between the two, a wake of it waits.
//!   A directed yield to a vCPU of another runqueue is undirected.
//! * Registration and parameter changes are serialised by an admin lock
//!   and applied to every runqueue's scheduler in turn.
//!
//! Lock order: admin, then runqueues ascending (or one runqueue, then a
//! `try_lock` of another), then a domain's pool. The caller's own locks
//! (the vGIC's) come before all of these; nothing here calls out.
//!
//! With one runqueue (up to 16 pCPUs by default, every QEMU run) there is
//! one scheduler, one lock, and no route lookup: the same path as a bare
//! [`Scheduler`] behind a lock.
//!
//! Memory: each runqueue's scheduler holds a record of every vCPU and
//! pCPU, so the records take nr_runqueues × (vCPUs + pCPUs) slots; at 192
//! pCPUs (12 runqueues) and 400 vCPUs that is a few MiB of the host's heap.

use super::balance::{best_exchange, imbalance, weighted_move, GRANULARITY};
use super::{
    CritEvidence, Decision, Deferral, DomainId, DomainParams, DomainStats, RunState, SchedConfig, SchedError,
    Scheduler, Vcpu, VcpuId, WakeAction, WakeCause, DENSE_IDS,
};
use crate::stats::VcpuStats;
use crate::sync::{Mutex, TicketMutex, TicketMutexGuard};
use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU16, Ordering};

/// One runqueue's scheduler, alone on its cache lines.
#[repr(align(64))]
struct Shard(TicketMutex<Scheduler>);

/// Reschedule IPIs a [`Sched::schedule`] owes beyond its decision's `kick`:
/// pCPUs tickled for vCPUs that balancing moved to their runqueue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwedKicks(pub(super) [Option<usize>; 3]);

impl OwedKicks {
    pub(super) fn push(&mut self, p: usize) {
        if let Some(k) = self.0.iter_mut().find(|k| k.is_none()) {
            *k = Some(p);
        }
    }

    /// Whether there is any (one comparison: ask after every `schedule()`).
    #[inline(always)]
    pub fn any(&self) -> bool {
        self.0[0].is_some()
    }

    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().flatten().copied()
    }
}

/// What a wake did, for the waker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Woken {
    /// The vCPU was blocked (a real wake-up, not a no-op).
    pub blocked: bool,
    pub action: WakeAction,
    /// The pCPU it runs on after the wake (`None`: it does not run).
    pub on: Option<usize>,
    /// How a preemption it asked for was deferred, if it was.
    pub deferral: Option<(Deferral, u64)>,
}

/// The host's scheduler: runqueues of [`Scheduler`], a lock each.
pub struct Sched {
    /// The configuration (changed by [`Sched::set_option`]).
    cfg: Mutex<SchedConfig>,
    /// Runqueue 0's scheduler, here rather than behind a pointer: with one
    /// runqueue it is the only one, on every call's path.
    first: Shard,
    /// Runqueues 1.. (none with one runqueue).
    rest: Box<[Shard]>,
    /// Each pCPU's runqueue (fixed at boot).
    pcpu_rq: Box<[u16]>,
    /// Runqueue + 1 of each vCPU id below `DENSE_IDS` (0: unknown); empty
    /// with one runqueue.
    route: Box<[AtomicU16]>,
    /// Serialises registration and parameter changes, so that every
    /// runqueue's scheduler sees them in one order (and gives each vCPU
    /// the same slot).
    admin: Mutex<()>,
}

impl Sched {
    pub fn new(cfg: SchedConfig, nr_pcpus: usize) -> Result<Self, SchedError> {
        let first = Scheduler::new(cfg, nr_pcpus)?;
        let n = first.nr_runqueues();
        let pcpu_rq = (0..nr_pcpus).map(|p| first.pcpus[p].rq as u16).collect();
        let mut first = first;
        let mut rest = Vec::with_capacity(n - 1);
        if n > 1 {
            first.shard = Some(0);
            for r in 1..n {
                let mut s = Scheduler::new(cfg, nr_pcpus)?;
                s.shard = Some(r);
                rest.push(Shard(TicketMutex::new(s)));
            }
        }
        let ids = if n > 1 { DENSE_IDS as usize } else { 0 };
        Ok(Self {
            cfg: Mutex::new(cfg),
            first: Shard(TicketMutex::new(first)),
            rest: rest.into_boxed_slice(),
            pcpu_rq,
            route: (0..ids).map(|_| AtomicU16::new(0)).collect(),
            admin: Mutex::new(()),
        })
    }

    pub fn config(&self) -> SchedConfig {
        *self.cfg.lock()
    }

    /// `key=val` while running (`hvctl set`, [`SchedConfig::with_live`]),
    /// in every runqueue; returns the configuration now in force.
    pub fn set_option(&self, key: &str, val: &str) -> Result<SchedConfig, SchedError> {
        let _admin = self.admin.lock();
        let cfg = self.cfg.lock().with_live(key, val)?;
        // The first runqueue checks it against its vCPUs; all hold the same.
        self.set_config(0, cfg)?;
        for r in 1..self.nr_runqueues() {
            self.set_config(r, cfg)?;
        }
        *self.cfg.lock() = cfg;
        Ok(cfg)
    }

    fn set_config(&self, r: usize, cfg: SchedConfig) -> Result<(), SchedError> {
        self.lock(r).set_config(cfg)
    }

    pub fn nr_pcpus(&self) -> usize {
        self.pcpu_rq.len()
    }

    pub fn nr_runqueues(&self) -> usize {
        1 + self.rest.len()
    }

    /// The runqueue `pcpu` picks from.
    pub fn runqueue_of(&self, pcpu: usize) -> Option<usize> {
        self.pcpu_rq.get(pcpu).map(|&r| usize::from(r))
    }

    /// Runqueue `r`'s scheduler and its lock.
    #[inline(always)]
    fn shard(&self, r: usize) -> Option<&TicketMutex<Scheduler>> {
        match r {
            0 => Some(&self.first.0),
            _ => self.rest.get(r - 1).map(|s| &s.0),
        }
    }

    /// Runqueue `r`'s scheduler, locked (`r` is one of ours).
    #[inline(always)]
    fn lock(&self, r: usize) -> TicketMutexGuard<'_, Scheduler> {
        match r {
            0 => self.first.0.lock(),
            _ => self.rest[r - 1].0.lock(),
        }
    }

    /// `pcpu`'s runqueue, locked.
    #[inline(always)]
    fn pcpu_locked(&self, pcpu: usize) -> Result<TicketMutexGuard<'_, Scheduler>, SchedError> {
        if self.rest.is_empty() {
            // Its scheduler checks the pCPU.
            return Ok(self.lock(0));
        }
        let r = self.runqueue_of(pcpu).ok_or(SchedError::BadPcpu(pcpu))?;
        Ok(self.lock(r))
    }

    /// The runqueue `vcpu` is live in, locked (see the module doc).
    #[inline(always)]
    fn vcpu_locked(&self, vcpu: VcpuId) -> Result<(usize, TicketMutexGuard<'_, Scheduler>), SchedError> {
        if self.rest.is_empty() {
            return Ok((0, self.lock(0)));
        }
        let route = self.route.get(vcpu.0 as usize).ok_or(SchedError::UnknownVcpu(vcpu))?;
        loop {
            let r = match route.load(Ordering::Acquire) {
                0 => return Err(SchedError::UnknownVcpu(vcpu)),
                r => usize::from(r - 1),
            };
            let g = self.lock(r);
            match g.runqueue_of_vcpu(vcpu) {
                Some(at) if at == r => return Ok((r, g)),
                // Being removed ([`Sched::remove_domain`] got here first).
                None => return Err(SchedError::UnknownVcpu(vcpu)),
                Some(_) => {}
            }
            // Moving between runqueues: it is live in the other soon.
            drop(g);
            core::hint::spin_loop();
        }
    }

    /// Every runqueue's scheduler in turn, under the admin lock.
    fn each<T>(&self, mut f: impl FnMut(&mut Scheduler) -> Result<T, SchedError>) -> Result<T, SchedError> {
        let _admin = self.admin.lock();
        let mut out = f(&mut self.lock(0))?;
        for r in 1..self.nr_runqueues() {
            // The first accepted it: the others hold the same state.
            out = f(&mut self.lock(r))?;
        }
        Ok(out)
    }

    // ----- registration and parameters -----

    /// [`Scheduler::add_domain`], in every runqueue, sharing one budget pool.
    /// Every runqueue checks and makes room first, so a refusal (or
    /// [`SchedError::NoMemory`]) changes nothing.
    pub fn add_domain(&self, dom: DomainId, params: DomainParams) -> Result<(), SchedError> {
        let _admin = self.admin.lock();
        for r in 0..self.nr_runqueues() {
            let mut s = self.lock(r);
            s.check_new_domain(dom, params)?;
            s.room_for_domain()?;
        }
        let mut pool = None;
        for r in 0..self.nr_runqueues() {
            let mut s = self.lock(r);
            s.add_domain_pooled(dom, params, pool.clone())?;
            pool.get_or_insert_with(|| s.domains[s.domains.len() - 1].pool());
        }
        Ok(())
    }

    /// [`Scheduler::set_domain_params`] in every runqueue.
    pub fn set_domain_params(&self, now: u64, dom: DomainId, params: DomainParams) -> Result<(), SchedError> {
        self.each(|s| s.set_domain_params(now, dom, params))
    }

    /// [`Scheduler::add_vcpu`]: its runqueue is that of the pCPU it is
    /// pinned to, else of the pCPU fewest vCPUs last ran on. Every
    /// runqueue checks and makes room first, so a refusal (or
    /// [`SchedError::NoMemory`]) changes nothing.
    pub fn add_vcpu(&self, vcpu: VcpuId, dom: DomainId, affinity: Option<usize>) -> Result<(), SchedError> {
        let n = self.nr_runqueues();
        if n > 1 && vcpu.0 >= DENSE_IDS {
            return Err(SchedError::VcpuIdRange(vcpu));
        }
        let _admin = self.admin.lock();
        let mut d = 0;
        for r in 0..n {
            let mut s = self.lock(r);
            // The first checks; the others hold the same state.
            d = s.check_new_vcpu(vcpu, dom, affinity)?;
            s.room_for_vcpu(vcpu, d)?;
        }
        let home = match affinity {
            Some(p) => p,
            None => {
                // Each runqueue counts its own live vCPUs' last pCPUs.
                let mut homed = super::lifecycle::zeroes(self.nr_pcpus())?;
                (0..n).for_each(|r| self.lock(r).count_homes(&mut homed));
                super::lifecycle::least_homed(&homed)
            }
        };
        for r in 0..n {
            self.lock(r).add_vcpu_at(vcpu, d, affinity, home);
        }
        if let (Some(route), Some(r)) = (self.route.get(vcpu.0 as usize), self.runqueue_of(home)) {
            route.store(r as u16 + 1, Ordering::Release);
        }
        Ok(())
    }

    /// [`Scheduler::remove_domain`] in every runqueue; the removed vCPUs'
    /// routes are cleared. Every runqueue is checked first, so a refusal
    /// changes nothing: each vCPU of the domain must be offline where it
    /// is live, and live somewhere (one moving between runqueues, an
    /// emigrant on its way, is live in none and makes the domain
    /// [`SchedError::DomainBusy`] until it arrives).
    pub fn remove_domain(&self, dom: DomainId) -> Result<(), SchedError> {
        let _admin = self.admin.lock();
        let mut ids: Vec<VcpuId> = Vec::new();
        let (mut total, mut live) = (0, 0);
        for r in 0..self.nr_runqueues() {
            let s = self.lock(r);
            let d = s.dom_slot(dom)?;
            if s.has_live_online(d) {
                return Err(SchedError::DomainBusy(dom));
            }
            let mut mine = s.vcpus.iter().filter(|v| v.dom == d);
            live += mine.clone().filter(|v| s.owns(v.rq)).count();
            if r == 0 {
                total = mine.clone().count();
                ids.try_reserve_exact(total).map_err(|_| SchedError::NoMemory)?;
                ids.extend(mine.by_ref().map(|v| v.id));
            }
        }
        if live != total {
            return Err(SchedError::DomainBusy(dom));
        }
        for r in 0..self.nr_runqueues() {
            self.lock(r).remove_domain(dom)?;
        }
        for v in ids {
            if let Some(route) = self.route.get(v.0 as usize) {
                route.store(0, Ordering::Release);
            }
        }
        Ok(())
    }

    /// [`Scheduler::reserve`] in every runqueue: afterwards adding and
    /// removing domains and vCPUs within the bounds leaves the heap as it
    /// was (the route table is fixed at boot).
    pub fn reserve(&self, vcpus: u32, domains: usize) -> Result<(), SchedError> {
        let _admin = self.admin.lock();
        (0..self.nr_runqueues()).try_for_each(|r| self.lock(r).reserve(vcpus, domains))
    }

    /// Every runqueue's [`Scheduler::capacity_fingerprint`], and the route table's.
    #[cfg(test)]
    fn capacity_fingerprint(&self) -> Vec<usize> {
        let mut f: Vec<usize> = (0..self.nr_runqueues()).flat_map(|r| self.lock(r).capacity_fingerprint()).collect();
        f.push(self.route.len());
        f
    }

    /// [`Scheduler::set_vcpu_weight`] in every runqueue.
    pub fn set_vcpu_weight(&self, now: u64, vcpu: VcpuId, weight: Option<u32>) -> Result<(), SchedError> {
        self.each(|s| s.set_vcpu_weight(now, vcpu, weight))
    }

    // ----- a vCPU's -----

    /// [`Scheduler::power_on`].
    pub fn power_on(&self, now: u64, vcpu: VcpuId) -> Result<WakeAction, SchedError> {
        self.vcpu_locked(vcpu)?.1.power_on(now, vcpu)
    }

    /// [`Scheduler::wake`].
    pub fn wake(&self, now: u64, vcpu: VcpuId, cause: WakeCause) -> Result<WakeAction, SchedError> {
        self.wake_located(now, vcpu, cause).map(|w| w.action)
    }

    /// [`Scheduler::wake_located`] and its deferral, under one lock.
    #[inline]
    pub fn wake_located(&self, now: u64, vcpu: VcpuId, cause: WakeCause) -> Result<Woken, SchedError> {
        let (_, mut s) = self.vcpu_locked(vcpu)?;
        let (blocked, action, on) = s.wake_located(now, vcpu, cause)?;
        Ok(Woken { blocked, action, on, deferral: s.wake_deferral() })
    }

    pub fn state(&self, vcpu: VcpuId) -> Option<RunState> {
        self.vcpu_locked(vcpu).ok().and_then(|(_, s)| s.state(vcpu))
    }

    /// Counters and histogram of a vCPU, copied.
    pub fn stats(&self, vcpu: VcpuId) -> Option<VcpuStats> {
        self.vcpu_locked(vcpu).ok().and_then(|(_, s)| s.stats(vcpu).cloned())
    }

    /// Changes a vCPU's counters (the caller's own, e.g. the simulators').
    pub fn with_stats_mut<T>(&self, vcpu: VcpuId, f: impl FnOnce(&mut VcpuStats) -> T) -> Option<T> {
        self.vcpu_locked(vcpu).ok().and_then(|(_, mut s)| s.stats_mut(vcpu).map(f))
    }

    pub fn is_preempted(&self, vcpu: VcpuId) -> bool {
        self.vcpu_locked(vcpu).is_ok_and(|(_, s)| s.is_preempted(vcpu))
    }

    pub fn is_parked(&self, vcpu: VcpuId) -> bool {
        self.vcpu_locked(vcpu).is_ok_and(|(_, s)| s.is_parked(vcpu))
    }

    pub fn credit(&self, vcpu: VcpuId) -> Option<i64> {
        self.vcpu_locked(vcpu).ok().and_then(|(_, s)| s.credit(vcpu))
    }

    pub fn vcpu_weight(&self, vcpu: VcpuId) -> Option<u32> {
        self.vcpu_locked(vcpu).ok().and_then(|(_, s)| s.vcpu_weight(vcpu))
    }

    pub fn domain_of(&self, vcpu: VcpuId) -> Option<DomainId> {
        self.vcpu_locked(vcpu).ok().and_then(|(_, s)| s.domain_of(vcpu))
    }

    /// The runqueue `vcpu` is live in.
    pub fn runqueue_of_vcpu(&self, vcpu: VcpuId) -> Option<usize> {
        self.vcpu_locked(vcpu).ok().map(|(r, _)| r)
    }

    // ----- a pCPU's -----

    /// [`Scheduler::block`].
    pub fn block(&self, now: u64, pcpu: usize) -> Result<VcpuId, SchedError> {
        self.pcpu_locked(pcpu)?.block(now, pcpu)
    }

    /// [`Scheduler::power_off`].
    pub fn power_off(&self, now: u64, pcpu: usize) -> Result<VcpuId, SchedError> {
        self.pcpu_locked(pcpu)?.power_off(now, pcpu)
    }

    /// [`Scheduler::yield_to`] (a target of another runqueue: undirected).
    pub fn yield_to(&self, now: u64, pcpu: usize, target: Option<VcpuId>) -> Result<(), SchedError> {
        self.pcpu_locked(pcpu)?.yield_to(now, pcpu, target)
    }

    /// [`Scheduler::note_critical_exit`].
    pub fn note_critical_exit(&self, now: u64, pcpu: usize, evidence: CritEvidence) -> Result<WakeAction, SchedError> {
        self.pcpu_locked(pcpu)?.note_critical_exit(now, pcpu, evidence)
    }

    /// vCPU currently on `pcpu`.
    pub fn current(&self, pcpu: usize) -> Option<VcpuId> {
        self.pcpu_locked(pcpu).ok().and_then(|s| s.current(pcpu))
    }

    /// [`Scheduler::schedule`], and the IPIs it owes beyond its decision's
    /// `kick` (send them as that one).
    /// (The run loop calls [`Sched::runqueue_for`] and [`Sched::scheduled`]
    /// itself, to publish what the decision says while the runqueue is
    /// still locked.)
    pub fn schedule(&self, now: u64, pcpu: usize) -> Result<(Decision, OwedKicks), SchedError> {
        let mut owed = OwedKicks::default();
        let mut s = self.runqueue_for(pcpu);
        let mut d = s.schedule(now, pcpu)?;
        self.scheduled(now, pcpu, s, &mut d, &mut owed);
        Ok((d, owed))
    }

    /// `pcpu`'s runqueue, locked for [`Scheduler::schedule`] on `pcpu` and
    /// nothing else; then hand it to [`Sched::scheduled`] with the
    /// decision. (The run loop's path: its decision is large, and this way
    /// it is made in place, not copied out of a call.) A pCPU we do not
    /// have gets runqueue 0, whose `schedule` says so.
    #[inline(always)]
    pub fn runqueue_for(&self, pcpu: usize) -> TicketMutexGuard<'_, Scheduler> {
        self.pcpu_locked(pcpu).unwrap_or_else(|_| self.lock(0))
    }

    /// After `s` (from [`Sched::runqueue_for`]) scheduled `pcpu` and decided
    /// `d`: unlocks it and, with several runqueues, does what the decision
    /// left to the front (a move to another runqueue, a balance), which may
    /// change `d`'s timer and owe IPIs (added to `owed`).
    #[inline(always)]
    pub fn scheduled<'a>(
        &'a self,
        now: u64,
        pcpu: usize,
        mut s: TicketMutexGuard<'a, Scheduler>,
        d: &mut Decision,
        owed: &mut OwedKicks,
    ) {
        if self.rest.is_empty() {
            // Nothing to balance with, nothing owed.
            return;
        }
        if s.owes_balance_kicks() {
            s.take_balance_kicks().for_each(|k| owed.push(k));
        }
        if self.after_schedule(now, pcpu, s, owed) {
            d.timer_at = self.lock(usize::from(self.pcpu_rq[pcpu])).rearm_slice(now, pcpu);
        }
    }

    /// With several runqueues, after a `schedule()` of `pcpu`: take its
    /// emigrant to its new runqueue (with `s` unlocked first: one lock at a
    /// time), then balance if it reset its runqueue's credit.
    #[inline(never)]
    /// Returns whether balancing pulled a vCPU in (the slice is to be
    /// computed again).
    fn after_schedule<'a>(
        &'a self,
        now: u64,
        pcpu: usize,
        mut s: TicketMutexGuard<'a, Scheduler>,
        kicks: &mut OwedKicks,
    ) -> bool {
        let r = usize::from(self.pcpu_rq[pcpu]);
        if let Some(v) = s.emigrant.take().map(|v| s.vcpus[v].clone()) {
            drop(s);
            let to = v.rq;
            self.arrive(now, v, (&mut self.lock(to), to), pcpu, kicks);
            s = self.lock(r);
        }
        core::mem::take(&mut s.reset_pending) && self.balance(now, r, pcpu, &mut s, kicks)
    }

    /// Credit2's `balance_load` from runqueue `l` (locked as `s`) after its
    /// reset, against the runqueue whose published load differs most, if
    /// its lock is free (see balance.rs).
    /// Returns whether it pulled a vCPU into `l`.
    fn balance(&self, now: u64, l: usize, pcpu: usize, s: &mut Scheduler, kicks: &mut OwedKicks) -> bool {
        let t = now >> GRANULARITY;
        s.rq_load_add(l, 0, t);
        let la = s.rqs[l].avgload;
        let mut other = None;
        let mut delta = 0u64;
        s.op(self.nr_runqueues());
        // As Credit2: each other runqueue whose lock is free has its
        // average brought to now and compared; a busy one is skipped.
        for o in (0..self.nr_runqueues()).filter(|&o| o != l) {
            let Some(mut os) = self.shard(o).and_then(|m| m.try_lock()) else { continue };
            os.rq_load_add(o, 0, t);
            let d = la.abs_diff(os.rqs[o].avgload);
            if d > delta {
                (delta, other) = (d, Some(o));
            }
        }
        let weighted = s.cfg.extensions();
        let o = match other {
            Some(o) => o,
            None if weighted => s.next_partner(l),
            None => return false,
        };
        let Some(mut os) = self.shard(o).and_then(|m| m.try_lock()) else { return false };
        os.rq_load_add(o, 0, t);
        let oa = os.rqs[o].avgload;
        let cpus_max = s.rqs[l].pcpus.len().max(os.rqs[o].pcpus.len());
        let counted = imbalance(la, oa, cpus_max);
        if weighted {
            // Our mode: by service per weight (see balance.rs's
            // `weighted_move`), with the other runqueue that differs most
            // in count if that is worth a balance, else the next in turn.
            let o = if counted.is_some() {
                o
            } else {
                drop(os);
                let p = if other.is_some() { s.next_partner(l) } else { o };
                os = match self.shard(p).and_then(|m| m.try_lock()) {
                    Some(g) => g,
                    None => return false,
                };
                p
            };
            s.note_members_served(l, now);
            os.note_members_served(o, now);
            let (mut mine, mut theirs) =
                (core::mem::take(&mut s.candidates.mine), core::mem::take(&mut os.candidates.theirs));
            s.collect_served(l, o, &mut mine);
            os.collect_served(o, l, &mut theirs);
            let ((push, pull), work) = weighted_move(&mine, s.rqs[l].pcpus.len(), &theirs, os.rqs[o].pcpus.len());
            (s.candidates.mine, os.candidates.theirs) = (mine, theirs);
            s.op(work);
            return self.exchange(now, (push, s, l), (pull, &mut os, o), pcpu, kicks);
        }
        let Some(delta) = counted else { return false };
        s.note_members_load(l, now);
        os.note_members_load(o, now);
        s.collect_push(l, o);
        os.collect_pull(o, l);
        let ((push, pull), work) =
            best_exchange(delta, la as i64, oa as i64, &s.candidates.push, &mut os.candidates.pull);
        s.op(s.rqs[l].members.len() + os.rqs[o].members.len() + work);
        self.exchange(now, (push, s, l), (pull, &mut os, o), pcpu, kicks)
    }

    /// A balance's decision between runqueues `l` and `o` (both locked):
    /// `push` from `l` to `o`, `pull` from `o` to `l`. Returns whether it
    /// pulled.
    fn exchange(
        &self,
        now: u64,
        (push, s, l): (Option<usize>, &mut Scheduler, usize),
        (pull, os, o): (Option<usize>, &mut Scheduler, usize),
        pcpu: usize,
        kicks: &mut OwedKicks,
    ) -> bool {
        if let Some(v) = push {
            os.rqs[o].arrivals += 1;
            self.move_between(now, v, (s, l), (os, o), pcpu, kicks);
        }
        if let Some(v) = pull {
            s.rqs[l].arrivals += 1;
            self.move_between(now, v, (os, o), (s, l), pcpu, kicks);
        }
        pull.is_some()
    }

    /// Moves `v` from runqueue `from` to `to` (both locked): now if it is
    /// not running, else when it leaves its pCPU.
    fn move_between(
        &self,
        now: u64,
        v: usize,
        (from, _): (&mut Scheduler, usize),
        (to, r): (&mut Scheduler, usize),
        pcpu: usize,
        kicks: &mut OwedKicks,
    ) {
        if let Some(rec) = from.export(now, v, r) {
            self.arrive(now, rec, (to, r), pcpu, kicks);
        }
    }

    /// `rec`, let go by its runqueue, joins runqueue `r` (locked as `to`),
    /// and the route names `r` from now on (unless it was removed on its
    /// way: its route stays cleared).
    fn arrive(&self, now: u64, rec: Vcpu, (to, r): (&mut Scheduler, usize), pcpu: usize, kicks: &mut OwedKicks) {
        let id = rec.id;
        if let Ok(k) = to.import(now, rec, pcpu) {
            k.into_iter().for_each(|k| kicks.push(k));
            self.route[id.0 as usize].store(r as u16 + 1, Ordering::Release);
        }
    }

    // ----- reports -----

    /// [`Scheduler::domain_params`].
    pub fn domain_params(&self, dom: DomainId) -> Option<DomainParams> {
        self.lock(0).domain_params(dom)
    }

    /// A domain's counters, summed over the runqueues.
    pub fn domain_stats(&self, dom: DomainId) -> Option<DomainStats> {
        let mut sum: Option<DomainStats> = None;
        for r in 0..self.nr_runqueues() {
            let d = *self.lock(r).domain_stats(dom)?;
            let t = sum.get_or_insert_with(DomainStats::default);
            t.run_ns += d.run_ns;
            t.credit_resets += d.credit_resets;
            t.cap_parks += d.cap_parks;
            t.replenishments += d.replenishments;
        }
        sum
    }

    /// [`Scheduler::domain_run_ns`], summed over the runqueues.
    pub fn domain_run_ns(&self, dom: DomainId, now: u64) -> Option<u64> {
        (0..self.nr_runqueues()).map(|r| self.lock(r).domain_run_ns(dom, now)).sum()
    }

    /// [`Scheduler::write_runqueue_stats`], runqueue by runqueue, then the
    /// turns the runqueue locks passed over (`sched.lock_passed`: a waiter
    /// was not running when its turn came; see `sync::ticket`).
    pub fn write_runqueue_stats(&self, out: &mut impl core::fmt::Write) -> core::fmt::Result {
        (0..self.nr_runqueues()).try_for_each(|r| self.lock(r).write_runqueue_stats(out))?;
        writeln!(out, "sched.lock_passed={}", crate::sync::ticket_turns_passed())
    }

    /// Credit resets of runqueue `rq` so far.
    pub fn runqueue_resets(&self, rq: usize) -> Option<u64> {
        self.shard(rq).and_then(|s| s.lock().runqueue_resets(rq))
    }

    /// How long a caller waited for `pcpu`'s runqueue lock is the bench's;
    /// this is that lock, for it to time (`cargo xtask bench sched-scale`).
    #[doc(hidden)]
    pub fn runqueue_lock_of(&self, pcpu: usize) -> Option<&TicketMutex<Scheduler>> {
        self.runqueue_of(pcpu).and_then(|r| self.shard(r))
    }
}

impl Scheduler {
    /// Every member of runqueue `rq` has its load average brought to `now`.
    pub(super) fn note_members_load(&mut self, rq: usize, now: u64) {
        for i in 0..self.rqs[rq].members.len() {
            let v = self.rqs[rq].members[i];
            self.note_load(v, 0, now);
        }
    }

    /// Lets vCPU slot `v` go to runqueue `to`: its record, and whether it
    /// was queued, if it is not running; if it runs, it goes when it leaves
    /// its pCPU (`None` now).
    pub(super) fn export(&mut self, now: u64, v: usize, to: usize) -> Option<Vcpu> {
        if matches!(self.vcpus[v].state, RunState::Running(_)) {
            self.vcpus[v].migrate_to = Some(to);
            return None;
        }
        self.unqueue(v);
        self.let_go(now, v, to);
        Some(self.vcpus[v].clone())
    }

    /// Takes in `rec`, a vCPU another runqueue let go to this one: a
    /// runnable one is queued here and a pCPU tickled for it (returned: it
    /// is owed an IPI unless it is `pcpu`, the caller's). Its weight stays
    /// as the parameter changes left this copy.
    /// Its domain slot stays this copy's: while [`Sched::remove_domain`]
    /// goes through the runqueues, slots above the removed domain's differ
    /// between copies. A vCPU this copy no longer knows (its domain was
    /// removed while it moved) is [`SchedError::UnknownVcpu`], and dropped.
    pub(super) fn import(&mut self, now: u64, rec: Vcpu, pcpu: usize) -> Result<Option<usize>, SchedError> {
        let to = rec.rq;
        let v = self.slot(rec.id)?;
        let here = &self.vcpus[v];
        let (weight, weight_override, dom) = (here.weight, here.weight_override, here.dom);
        self.vcpus[v] = rec;
        self.vcpus[v].weight = weight;
        self.vcpus[v].weight_override = weight_override;
        self.vcpus[v].dom = dom;
        self.join_rq(now, v, to);
        if self.vcpus[v].state == RunState::Runnable && !self.vcpus[v].parked {
            self.enqueue(v);
            return Ok(self.tickle_requeued(now, v, pcpu).filter(|&k| k != pcpu));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::super::conformance::{mix_scheduler, run_mix, run_mix_on, Load, MixParams, MixResult, MixVcpu};
    use super::super::RunqueueLayout;
    use super::*;
    use alloc::vec;

    const MS: u64 = 1_000_000;

    fn v(i: u32) -> VcpuId {
        VcpuId(i)
    }

    fn per_cpu(cfg: SchedConfig) -> SchedConfig {
        SchedConfig { runqueue: RunqueueLayout::PerCpu, ..cfg }
    }

    /// `p` run on a bare [`Scheduler`] (one lock over every runqueue).
    fn bare(p: &MixParams) -> MixResult {
        let mut s = Scheduler::new(p.cfg, p.nr_pcpus).unwrap();
        for &(d, params) in &p.domains {
            s.add_domain(d, params).unwrap();
        }
        for x in &p.vcpus {
            s.add_vcpu(x.id, x.dom, x.affinity).unwrap();
        }
        run_mix_on(p, s).unwrap()
    }

    #[test]
    fn runqueues_under_their_own_locks_schedule_as_under_one() {
        // The front moves records between runqueues' schedulers where the
        // bare scheduler moves them inside one, and balances after the
        // `schedule()` rather than inside it: the same run (decision for
        // decision with the extensions on; in the control mode, where
        // the vCPU that left is queued after the balance, within 1 % of
        // run time and 2 % of completions). Hogs beside I/O vCPUs whose blocking shifts the loads,
        // on 4 pCPUs with a runqueue each, so that resets balance; and
        // weighted hogs on 2.
        let io = |submit_ns, lo, hi| Load::Io { submit_ns, service_ns: (lo, hi) };
        let loads = [
            Load::Hog,
            io(200_000, 100_000, 3 * MS),
            Load::Hog,
            io(MS, 50_000, 500_000),
            Load::Hog,
            io(50_000, MS, 2 * MS),
        ];
        for cfg in [SchedConfig::default(), SchedConfig::xen_compat(1000)] {
            let vcpus = loads
                .iter()
                .enumerate()
                .map(|(i, &load)| MixVcpu { id: v(i as u32 + 1), dom: 1, affinity: None, load })
                .collect();
            let mixed = MixParams {
                cfg: per_cpu(cfg),
                nr_pcpus: 4,
                domains: vec![(1, DomainParams::default())],
                vcpus,
                duration_ns: 2000 * MS,
                seed: 5,
                period_ns: 0,
                changes: Vec::new(),
            };
            let w = [512, 256, 256, 256];
            let domains =
                (1..=4u16).map(|d| (d, DomainParams { weight: w[d as usize - 1], cap_percent: None })).collect();
            let weighted = MixParams::hog_per_domain(per_cpu(cfg), 2, domains, 2000 * MS, 0);
            for p in [mixed, weighted] {
                let (front, bare) = (run_mix(&p).unwrap(), bare(&p));
                let close = |a: u64, b: u64, tol: f64| (a as f64 - b as f64).abs() <= tol * (b as f64).max(1.0);
                let ctx = alloc::format!("{:?}: front {front:?}\nbare {bare:?}", cfg.wake_mode);
                for (&f, &b) in front.run_ns.iter().zip(&bare.run_ns) {
                    assert!(f.abs_diff(b) <= p.duration_ns / 100, "{ctx}");
                }
                for (&f, &b) in front.completions.iter().zip(&bare.completions) {
                    assert!(close(f, b, 0.02), "{ctx}");
                }
                assert!(front.switches > 0 && close(front.switches, bare.switches, 0.02), "{ctx}");
            }
        }
    }

    #[test]
    fn a_balanced_vcpu_is_woken_and_reported_where_it_went() {
        // Two hogs start on pCPU 0's runqueue; a reset moves one to the
        // idle runqueue of pCPU 1, which then runs it.
        let s = Sched::new(per_cpu(SchedConfig::default()), 2).unwrap();
        assert_eq!(s.nr_runqueues(), 2);
        s.add_domain(0, DomainParams::default()).unwrap();
        for id in 1..=3 {
            s.add_vcpu(v(id), 0, None).unwrap();
        }
        assert_eq!((s.runqueue_of_vcpu(v(1)), s.runqueue_of_vcpu(v(3))), (Some(0), Some(0)));
        s.power_on(0, v(1)).unwrap();
        s.power_on(0, v(3)).unwrap();
        let mut timers = [Some(0u64), Some(0)];
        let mut t = 0;
        while t < 3000 * MS {
            let (p, at) = timers.iter().enumerate().filter_map(|(p, t)| t.map(|t| (p, t))).min_by_key(|x| x.1).unwrap();
            t = at;
            let (d, owed) = s.schedule(t, p).unwrap();
            timers[p] = d.timer_at;
            for k in d.kick.into_iter().chain(owed.iter()) {
                timers[k] = Some(t);
            }
        }
        let (r1, r3) = (s.runqueue_of_vcpu(v(1)).unwrap(), s.runqueue_of_vcpu(v(3)).unwrap());
        assert_ne!(r1, r3, "one hog moved");
        let moved = if r1 == 1 { v(1) } else { v(3) };
        for id in [1, 3] {
            let run = s.stats(v(id)).unwrap().counters.run_ns as f64 / t as f64;
            assert!(run > 0.8, "vcpu{id} ran {run:.2}");
        }
        // Where it runs now, it blocks and is woken: pCPU 1's runqueue
        // answers, and pCPU 1 runs it again.
        assert_eq!(s.current(1), Some(moved));
        assert_eq!(s.block(t, 1), Ok(moved));
        assert_eq!(s.schedule(t, 1).unwrap().0.next, None);
        let w = s.wake_located(t + MS, moved, WakeCause::Interrupt).unwrap();
        assert!(w.blocked);
        assert_eq!(w.action, WakeAction::Reschedule { pcpu: 1 });
        assert_eq!(s.schedule(t + MS, 1).unwrap().0.next, Some(moved));
        // Each runqueue reports its own members and pCPUs: the offline
        // vCPU 2 was homed on runqueue 1, and our mode's balance moved the
        // hog alone (Credit2's would swap it with vCPU 2, which changes no
        // count either).
        let mut text = alloc::string::String::new();
        s.write_runqueue_stats(&mut text).unwrap();
        let want = [
            "sched.rq0.pcpus=0-0\n",
            "sched.rq0.vcpus=1\n",
            "sched.rq0.arrivals=0\n",
            "sched.rq1.pcpus=1-1\n",
            "sched.rq1.vcpus=2\n",
            "sched.rq1.arrivals=1\n",
        ];
        for want in want {
            assert!(text.contains(want), "{want}: {text}");
        }
        let resets = s.runqueue_resets(0).unwrap() + s.runqueue_resets(1).unwrap();
        assert!(resets > 0 && s.domain_stats(0).unwrap().credit_resets > 0);
    }

    #[test]
    fn a_cap_holds_across_runqueues() {
        // One domain capped at 50 % with a hog on each of two runqueues:
        // they draw from one pool, so together they get half a pCPU, not
        // half each.
        let cfg = per_cpu(SchedConfig::default());
        let params = DomainParams { weight: 256, cap_percent: Some(50) };
        let vcpus =
            (0..2).map(|p| MixVcpu { id: v(10 + p as u32), dom: 1, affinity: Some(p), load: Load::Hog }).collect();
        let p = MixParams {
            cfg,
            nr_pcpus: 2,
            domains: vec![(1, params)],
            vcpus,
            duration_ns: 1000 * MS,
            seed: 1,
            period_ns: 0,
            changes: Vec::new(),
        };
        let r = run_mix(&p).unwrap();
        let total = r.run_ns.iter().sum::<u64>() as f64 / p.duration_ns as f64;
        assert!((total - 0.5).abs() < 0.02, "together {total:.3} of a pCPU");
        for (i, &n) in r.run_ns.iter().enumerate() {
            let share = n as f64 / p.duration_ns as f64;
            assert!(share > 0.15, "vcpu {i}: {share:.3}");
        }
    }

    #[test]
    fn a_cap_set_while_it_runs_holds_across_runqueues() {
        // The same two hogs, uncapped for the first second, then capped at
        // 50 % together: each runqueue's copy of the domain takes the cap,
        // and they share the one pool it starts.
        let cfg = per_cpu(SchedConfig::default());
        let vcpus =
            (0..2).map(|p| MixVcpu { id: v(10 + p as u32), dom: 1, affinity: Some(p), load: Load::Hog }).collect();
        let capped = DomainParams { weight: 256, cap_percent: Some(50) };
        let p = MixParams {
            cfg,
            nr_pcpus: 2,
            domains: vec![(1, DomainParams::default())],
            vcpus,
            duration_ns: 2000 * MS,
            seed: 1,
            period_ns: 1000 * MS,
            changes: vec![(1000 * MS, 1, capped)],
        };
        let r = run_mix(&p).unwrap();
        let per_second: Vec<f64> = r.domain_periods[0].iter().map(|&ns| ns as f64 / (1000 * MS) as f64).collect();
        assert!((per_second[0] - 2.0).abs() < 0.02, "uncapped: {per_second:?}");
        assert!((per_second[1] - 0.5).abs() < 0.02, "capped: {per_second:?}");
    }

    #[test]
    fn ids_past_the_route_table_need_one_runqueue() {
        let s = Sched::new(per_cpu(SchedConfig::default()), 2).unwrap();
        s.add_domain(0, DomainParams::default()).unwrap();
        assert_eq!(s.add_vcpu(VcpuId(DENSE_IDS), 0, None), Err(SchedError::VcpuIdRange(VcpuId(DENSE_IDS))));
        assert_eq!(s.runqueue_of_vcpu(VcpuId(DENSE_IDS)), None);
        let one = Sched::new(SchedConfig::default(), 2).unwrap();
        one.add_domain(0, DomainParams::default()).unwrap();
        assert_eq!(one.add_vcpu(VcpuId(DENSE_IDS), 0, None), Ok(()));
    }

    #[test]
    fn options_change_while_running_in_every_runqueue() {
        use super::super::WakeMode;
        let s = Sched::new(SchedConfig { max_cpus_runqueue: 2, ..SchedConfig::default() }, 4).unwrap();
        assert_eq!(s.nr_runqueues(), 2);
        s.add_domain(1, DomainParams::default()).unwrap();
        s.add_vcpu(v(0), 1, None).unwrap();
        let c = s.set_option("sched_wake_preempt", "off").unwrap();
        assert!(!c.extensions() && !s.config().extensions());
        for r in 0..s.nr_runqueues() {
            assert_eq!(s.lock(r).cfg.wake_mode, WakeMode::XenCompat, "runqueue {r}");
        }
        assert_eq!(s.set_option("sched_ratelimit_us", "500").unwrap().ratelimit_ns, 500_000);
        // Refused, and nothing changes: out of range (Xen would warn and
        // use 1000 at boot), fixed at boot, not an option, inconsistent.
        assert_eq!(s.set_option("sched_ratelimit_us", "5"), Err(SchedError::BadBootArg("sched_ratelimit_us")));
        assert_eq!(s.set_option("credit2_runqueue", "cpu"), Err(SchedError::NotLive));
        assert_eq!(s.set_option("credit2_cap_period_ms", "20"), Err(SchedError::NotLive));
        assert_eq!(s.set_option("no_such_option", "1"), Err(SchedError::UnknownOption));
        assert_eq!(s.set_option("sched_max_slice_us", "100"), Err(SchedError::BadConfig), "below the minimum slice");
        assert_eq!(s.config().ratelimit_ns, 500_000);
        assert_eq!(s.lock(1).cfg.max_slice_ns, SchedConfig::default().max_slice_ns);
        // A vCPU's own weight is an extension: it keeps them on.
        s.set_option("sched_wake_preempt", "on").unwrap();
        s.set_vcpu_weight(0, v(0), Some(512)).unwrap();
        assert_eq!(s.set_option("sched_wake_preempt", "off"), Err(SchedError::ExtensionOff("sched_vcpu_weight")));
        assert!(s.config().extensions() && s.lock(1).cfg.extensions());
    }

    /// Checks every vCPU is live in exactly one runqueue, the one its route
    /// names; returns how many are.
    pub(super) fn live_members(s: &Sched) -> usize {
        let mut members = 0;
        for r in 0..s.nr_runqueues() {
            let g = s.lock(r);
            members += g.rqs[r].members.len();
            for &m in &g.rqs[r].members {
                assert_eq!(g.vcpus[m].rq, r);
                assert_eq!(s.route[g.vcpus[m].id.0 as usize].load(Ordering::Relaxed) as usize, r + 1);
            }
        }
        members
    }

    #[test]
    fn pcpus_of_different_runqueues_run_at_once_and_lose_no_vcpu() {
        // 8 threads stand for 8 pCPUs in 4 runqueues of 2; each blocks its
        // runner, wakes others' vCPUs and schedules, with short slices so
        // that resets balance and vCPUs move under the others' feet.
        extern crate std;
        use std::sync::Arc;
        let cfg = SchedConfig { max_cpus_runqueue: 2, ..SchedConfig::default() };
        let (nr_pcpus, nr_vcpus) = (8usize, 24u32);
        let s = Arc::new(Sched::new(cfg, nr_pcpus).unwrap());
        assert_eq!(s.nr_runqueues(), 4);
        s.add_domain(1, DomainParams::default()).unwrap();
        for i in 0..nr_vcpus {
            s.add_vcpu(v(i), 1, None).unwrap();
            s.power_on(0, v(i)).unwrap();
        }
        let first: Vec<usize> = (0..nr_vcpus).map(|i| s.runqueue_of_vcpu(v(i)).unwrap()).collect();
        let clock = Arc::new(core::sync::atomic::AtomicU64::new(0));
        let threads: Vec<_> = (0..nr_pcpus)
            .map(|p| {
                let (s, clock) = (s.clone(), clock.clone());
                std::thread::spawn(move || {
                    let mut seed = p as u64 + 1;
                    for i in 0..20_000u64 {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let now = clock.fetch_add(50_000, Ordering::Relaxed);
                        if i % 3 == 0 {
                            let _ = s.block(now, p);
                        }
                        let _ = s.wake(now, v((seed >> 33) as u32 % nr_vcpus), WakeCause::Interrupt);
                        s.schedule(now, p).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // Every vCPU is live in exactly one runqueue, the one its route names.
        assert_eq!(live_members(&s), nr_vcpus as usize);
        let moved = (0..nr_vcpus).filter(|&i| s.runqueue_of_vcpu(v(i)) != Some(first[i as usize])).count();
        assert!(moved > 0, "balancing moved vCPUs between runqueues");
        let resets: u64 = (0..s.nr_runqueues()).filter_map(|r| s.runqueue_resets(r)).sum();
        assert!(resets > 0, "the runqueues reset, so they balanced");
    }

    #[test]
    fn hogs_crowded_into_one_runqueue_of_three_spread_until_each_has_a_pcpu() {
        // 48 pCPUs: three runqueues of 16, as on a 48-core Graviton. The
        // vCPUs are homed round the pCPUs in id order, so hogs 0..15 and
        // 48..63 all start in runqueue 0 (32 hogs on 16 pCPUs) while the
        // I/O vCPUs 16..47 leave runqueues 1 and 2 nearly idle. Balancing
        // after resets must spread the hogs so that each gets nearly a
        // whole pCPU (there are 48 for 32 hogs and light I/O). Credit2's
        // count balance empties the crowd by 0.12 s and goes on moving
        // hogs until 0.56 s (61 moves); our mode's weighted balance spreads
        // them by 0.07 s (16 moves, each hog once).
        let io = Load::Io { submit_ns: 100_000, service_ns: (MS, 4 * MS) };
        let is_hog = |i: u32| !(16..48).contains(&i);
        for cfg in [SchedConfig::default(), SchedConfig::xen_compat(1000)] {
            let vcpus = (0..64u32)
                .map(|i| MixVcpu { id: v(i), dom: 1, affinity: None, load: if is_hog(i) { Load::Hog } else { io } })
                .collect();
            let p = MixParams {
                cfg,
                nr_pcpus: 48,
                domains: vec![(1, DomainParams::default())],
                vcpus,
                duration_ns: 2000 * MS,
                seed: 3,
                period_ns: 0,
                changes: Vec::new(),
            };
            let s = mix_scheduler(&p).unwrap();
            assert_eq!(s.nr_runqueues(), 3);
            let crowded = (0..64).filter(|&i| is_hog(i) && s.runqueue_of_vcpu(v(i)) == Some(0)).count();
            assert_eq!(crowded, 32, "the case starts crowded");
            let r = run_mix_on(&p, s).unwrap();
            for i in (0..64).filter(|&i| is_hog(i)) {
                assert!(r.share(i as usize) >= 0.95, "{:?}: hog {i} got {:.3}", cfg.wake_mode, r.share(i as usize));
            }
        }
    }
}

#[cfg(test)]
mod remove_tests {
    use super::*;
    use alloc::vec;

    const MS: u64 = 1_000_000;

    /// Runs `s`'s pCPUs as the run loop does (each at its timer, or when
    /// kicked) from `timers` until `until`.
    fn run(s: &Sched, timers: &mut [Option<u64>], until: u64) {
        while let Some((p, t)) = timers.iter().enumerate().filter_map(|(p, t)| t.map(|t| (p, t))).min_by_key(|x| x.1) {
            if t > until {
                break;
            }
            let (d, owed) = s.schedule(t, p).unwrap();
            timers[p] = d.timer_at;
            for k in d.kick.into_iter().chain(owed.iter()) {
                timers[k] = Some(t);
            }
        }
    }

    /// Runs until `id` runs, then powers it off there; returns the time.
    fn power_off(s: &Sched, timers: &mut [Option<u64>], id: VcpuId, mut now: u64) -> u64 {
        loop {
            if let Some(p) = (0..s.nr_pcpus()).find(|&p| s.current(p) == Some(id)) {
                assert_eq!(s.power_off(now, p), Ok(id));
                timers[p] = s.schedule(now, p).unwrap().0.timer_at;
                return now;
            }
            now += MS;
            run(s, timers, now);
        }
    }

    /// Share of a pCPU each of `ids` got since its run time was `start`.
    fn shares(s: &Sched, ids: &[VcpuId], start: &[u64], ns: u64) -> Vec<f64> {
        ids.iter().zip(start).map(|(&i, &b)| (s.stats(i).unwrap().counters.run_ns - b) as f64 / ns as f64).collect()
    }

    fn run_ns(s: &Sched, ids: &[VcpuId]) -> Vec<u64> {
        ids.iter().map(|&i| s.stats(i).unwrap().counters.run_ns).collect()
    }

    /// Three domains of 8 hogs on 8 pCPUs in runqueues of 2, where some of
    /// domain 2's vCPUs moved between runqueues, then went off one by one;
    /// the time then, and the vCPUs of domains 1 and 3.
    fn domain_two_went_off() -> (Sched, Vec<Option<u64>>, u64, Vec<VcpuId>) {
        // 8 pCPUs, runqueues of 2; three domains of 8 hogs, added in turn
        // (interleaved slots, homes spread evenly). Domain 2's and two of
        // domain 1's start, all with homes in runqueue 0: balancing moves
        // vCPUs off it. Then all run.
        let cfg = SchedConfig { max_cpus_runqueue: 2, ..SchedConfig::default() };
        let s = Sched::new(cfg, 8).unwrap();
        assert_eq!(s.nr_runqueues(), 4);
        s.reserve(64, 8).unwrap();
        let id = |d: u16, i: u32| VcpuId(u32::from(d) * 8 + i);
        for d in 1..=3u16 {
            s.add_domain(d, DomainParams::default()).unwrap();
        }
        for i in 0..8 {
            for d in 1..=3u16 {
                s.add_vcpu(id(d, i), d, None).unwrap();
            }
        }
        let first: Vec<Option<usize>> = (0..24).map(|i| s.runqueue_of_vcpu(VcpuId(8 + i))).collect();
        let early: Vec<VcpuId> =
            (0..24).map(|i| VcpuId(8 + i)).filter(|v| first[v.0 as usize - 8] == Some(0)).collect();
        let early: Vec<VcpuId> = early.into_iter().chain((0..8).map(|i| id(2, i))).collect();
        for &v in &early {
            if s.state(v) == Some(RunState::Offline) {
                s.power_on(0, v).unwrap();
            }
        }
        let mut timers = vec![Some(0u64); 8];
        run(&s, &mut timers, 2000 * MS);
        let moved: Vec<u32> = (0..24).filter(|&i| s.runqueue_of_vcpu(VcpuId(8 + i)) != first[i as usize]).collect();
        assert!(moved.iter().any(|&i| (8..16).contains(&i)), "some of domain 2's vCPUs moved: {moved:?}");
        for v in (8..32).map(VcpuId) {
            if s.state(v) == Some(RunState::Offline) {
                s.power_on(2000 * MS, v).unwrap();
            }
        }
        timers.iter_mut().for_each(|t| *t = Some(2000 * MS));
        run(&s, &mut timers, 3000 * MS);
        let others: Vec<VcpuId> = [1u16, 3].iter().flat_map(|&d| (0..8).map(move |i| id(d, i))).collect();
        let start = run_ns(&s, &others);
        run(&s, &mut timers, 5000 * MS);
        for x in shares(&s, &others, &start, 2000 * MS) {
            assert!((x - 1.0 / 3.0).abs() < 0.05, "24 hogs on 8 pCPUs: {x:.3}");
        }
        let mut now = 5000 * MS;
        // Off one by one: refused until the last is off, changing nothing.
        for i in 0..8 {
            assert_eq!(s.remove_domain(2), Err(SchedError::DomainBusy(2)));
            now = power_off(&s, &mut timers, id(2, i), now);
        }
        (s, timers, now, others)
    }

    #[test]
    fn a_domain_whose_vcpus_moved_is_removed_and_the_rest_stay_fair() {
        let (s, mut timers, mut now, others) = domain_two_went_off();
        let id = |d: u16, i: u32| VcpuId(u32::from(d) * 8 + i);
        let seen = |s: &Sched| -> Vec<_> {
            others.iter().map(|&i| (s.state(i), s.credit(i), s.stats(i).map(|x| x.counters), s.domain_of(i))).collect()
        };
        let kept = seen(&s);
        assert_eq!(s.remove_domain(1), Err(SchedError::DomainBusy(1)));
        assert_eq!(s.remove_domain(9), Err(SchedError::UnknownDomain(9)));
        s.remove_domain(2).unwrap();
        assert_eq!(seen(&s), kept);
        assert_eq!(s.domain_stats(2), None);
        for i in 0..8 {
            assert_eq!((s.state(id(2, i)), s.domain_of(id(2, i))), (None, None));
            assert_eq!(s.route[id(2, i).0 as usize].load(Ordering::Relaxed), 0);
        }
        assert_eq!(super::tests::live_members(&s), 16);
        (0..4).for_each(|r| s.lock(r).assert_slots_consistent());
        let fp = s.capacity_fingerprint();
        // The others run on, as beside a domain 2 that is only off (the same
        // run up to here): once the balancing has settled (the load
        // averages lag by about a second, and a move that overshoots is
        // undone a second later: 5 s here), each gets half a pCPU, in both.
        let (control, mut ctimers, cnow, _) = domain_two_went_off();
        assert_eq!(cnow, now);
        let mut got = Vec::new();
        for (x, t) in [(&s, &mut timers), (&control, &mut ctimers)] {
            t.iter_mut().for_each(|t| *t = Some(now));
            run(x, t, now + 6000 * MS);
            let start = run_ns(x, &others);
            run(x, t, now + 8000 * MS);
            got.push(shares(x, &others, &start, 2000 * MS));
        }
        for (a, b) in got[0].iter().zip(&got[1]) {
            assert!((a - 0.5).abs() < 0.05 && (b - 0.5).abs() < 0.05, "removed {:.3?}\noff {:.3?}", got[0], got[1]);
        }
        let total: f64 = got[0].iter().sum();
        assert!((total - 8.0).abs() < 0.05, "every pCPU busy: {total:.3}");
        now += 8000 * MS;
        // The same ids again, twenty times, running a while: nothing grows.
        for _ in 0..20 {
            s.add_domain(2, DomainParams { weight: 512, cap_percent: Some(150) }).unwrap();
            for i in 0..8 {
                s.add_vcpu(id(2, i), 2, None).unwrap();
            }
            for i in [0, 5] {
                s.power_on(now, id(2, i)).unwrap();
            }
            timers.iter_mut().for_each(|t| *t = Some(now));
            run(&s, &mut timers, now + 50 * MS);
            now += 50 * MS;
            for i in [0, 5] {
                now = power_off(&s, &mut timers, id(2, i), now);
            }
            s.remove_domain(2).unwrap();
            assert_eq!(super::tests::live_members(&s), 16);
            (0..4).for_each(|r| s.lock(r).assert_slots_consistent());
            assert_eq!(s.capacity_fingerprint(), fp);
        }
    }

    /// Domains 1 and 2 (capped) with vCPUs 0..24 between them; those
    /// homed in runqueues 0 and 1 start, run and move to the others, go off, and both domains
    /// are removed, `cycles` times.
    fn add_run_remove(s: &Sched, cycles: u32, mut now: u64) {
        let mut timers = vec![None; s.nr_pcpus()];
        for _ in 0..cycles {
            s.add_domain(1, DomainParams::default()).unwrap();
            s.add_domain(2, DomainParams { weight: 512, cap_percent: Some(300) }).unwrap();
            for i in 0..24 {
                s.add_vcpu(VcpuId(i), 1 + (i % 3 == 0) as DomainId, None).unwrap();
            }
            let on: Vec<VcpuId> = (0..24).filter(|i| i % 8 < 4).map(VcpuId).collect();
            let first: Vec<_> = on.iter().map(|&v| s.runqueue_of_vcpu(v)).collect();
            for &v in &on {
                s.power_on(now, v).unwrap();
            }
            timers.iter_mut().for_each(|t| *t = Some(now));
            run(s, &mut timers, now + 500 * MS);
            let moved = on.iter().zip(&first).filter(|&(&v, &r)| s.runqueue_of_vcpu(v) != r).count();
            assert!(moved > 0);
            now += 500 * MS;
            for &v in &on {
                now = power_off(s, &mut timers, v, now);
            }
            s.remove_domain(2).unwrap();
            s.remove_domain(1).unwrap();
            assert_eq!(super::tests::live_members(s), 0);
            assert!(s.route.iter().all(|r| r.load(Ordering::Relaxed) == 0));
        }
    }

    #[test]
    fn reserved_room_holds_every_later_add_and_remove_in_every_runqueue() {
        let cfg = SchedConfig { max_cpus_runqueue: 2, ..SchedConfig::default() };
        let s = Sched::new(cfg, 8).unwrap();
        s.reserve(24, 2).unwrap();
        let fp = s.capacity_fingerprint();
        add_run_remove(&s, 20, 0);
        assert_eq!(s.capacity_fingerprint(), fp);
        // Without the reservation the first cycle grows the tables.
        let bare = Sched::new(cfg, 8).unwrap();
        let fp = bare.capacity_fingerprint();
        add_run_remove(&bare, 1, 0);
        assert_ne!(bare.capacity_fingerprint(), fp);
    }

    /// `v` let go by runqueue `from` and taken in by runqueue `to`, with
    /// no lock held between the two (as an emigrant).
    fn move_unlocked(s: &Sched, v: VcpuId, from: usize, to: usize) {
        let slot = s.lock(from).slot(v).unwrap();
        let rec = s.lock(from).export(0, slot, to).unwrap();
        let mut kicks = OwedKicks::default();
        s.arrive(0, rec, (&mut s.lock(to), to), 0, &mut kicks);
    }

    #[test]
    fn a_vcpu_that_moves_while_a_domain_goes_keeps_its_own_domain() {
        // Runqueue 1 has removed domain 1 (slots above it moved down),
        // runqueue 0 not yet, when vcpu3 of domain 3 moves from 0 to 1:
        // its record there names domain 3 by runqueue 1's numbering.
        let cfg = SchedConfig { runqueue: super::super::RunqueueLayout::PerCpu, ..SchedConfig::default() };
        let s = Sched::new(cfg, 2).unwrap();
        for d in 1..=3u16 {
            s.add_domain(d, DomainParams::default()).unwrap();
            s.add_vcpu(VcpuId(u32::from(d)), d, None).unwrap();
        }
        let (v1, v3) = (VcpuId(1), VcpuId(3));
        assert_eq!(s.runqueue_of_vcpu(v3), Some(0));
        s.lock(1).remove_domain(1).unwrap();
        move_unlocked(&s, v3, 0, 1);
        s.lock(0).remove_domain(1).unwrap();
        s.route[1].store(0, Ordering::Relaxed);
        assert_eq!((s.runqueue_of_vcpu(v3), s.domain_of(v3)), (Some(1), Some(3)));
        assert_eq!((s.domain_of(VcpuId(2)), s.domain_of(v1)), (Some(2), None));
        (0..2).for_each(|r| s.lock(r).assert_slots_consistent());
        assert_eq!(s.lock(1).domain_of(v3), Some(3));
    }

    #[test]
    fn a_vcpu_removed_on_its_way_is_dropped_and_its_route_stays_clear() {
        let cfg = SchedConfig { runqueue: super::super::RunqueueLayout::PerCpu, ..SchedConfig::default() };
        let s = Sched::new(cfg, 2).unwrap();
        s.add_domain(1, DomainParams::default()).unwrap();
        s.add_vcpu(VcpuId(5), 1, None).unwrap();
        let slot = s.lock(0).slot(VcpuId(5)).unwrap();
        let rec = s.lock(0).export(0, slot, 1).unwrap();
        // Removed in every runqueue while it was between two.
        (0..2).for_each(|r| s.lock(r).remove_domain(1).unwrap());
        s.route[5].store(0, Ordering::Relaxed);
        let mut kicks = OwedKicks::default();
        s.arrive(0, rec, (&mut s.lock(1), 1), 0, &mut kicks);
        assert_eq!(s.route[5].load(Ordering::Relaxed), 0);
        assert_eq!(s.state(VcpuId(5)), None);
        // A route left naming a runqueue that no longer knows the vCPU
        // answers "unknown" rather than waiting for it to arrive.
        s.route[5].store(2, Ordering::Relaxed);
        assert_eq!(s.state(VcpuId(5)), None);
        assert_eq!(s.power_on(0, VcpuId(5)), Err(SchedError::UnknownVcpu(VcpuId(5))));
        (0..2).for_each(|r| s.lock(r).assert_slots_consistent());
    }

    #[test]
    fn a_domain_with_a_vcpu_between_runqueues_is_busy() {
        // A vCPU let go by one runqueue and not yet taken by the other (an
        // emigrant on its way) is live in neither: removal waits for it.
        let cfg = SchedConfig { runqueue: super::super::RunqueueLayout::PerCpu, ..SchedConfig::default() };
        let s = Sched::new(cfg, 2).unwrap();
        s.add_domain(1, DomainParams::default()).unwrap();
        s.add_vcpu(VcpuId(3), 1, Some(0)).unwrap();
        let slot = s.lock(0).slot(VcpuId(3)).unwrap();
        let rec = s.lock(0).export(0, slot, 1).unwrap();
        assert_eq!(s.remove_domain(1), Err(SchedError::DomainBusy(1)));
        let mut kicks = OwedKicks::default();
        s.arrive(0, rec, (&mut s.lock(1), 1), 0, &mut kicks);
        assert_eq!(s.runqueue_of_vcpu(VcpuId(3)), Some(1));
        s.remove_domain(1).unwrap();
        assert_eq!(s.route[3].load(Ordering::Relaxed), 0);
        assert_eq!(s.state(VcpuId(3)), None);
    }

    #[test]
    fn a_domain_is_removed_from_every_runqueue_and_its_routes() {
        let cfg = SchedConfig { max_cpus_runqueue: 2, ..SchedConfig::default() };
        let s = Sched::new(cfg, 8).unwrap();
        assert_eq!(s.nr_runqueues(), 4);
        s.reserve(64, 8).unwrap();
        for d in 1..=3u16 {
            s.add_domain(d, DomainParams::default()).unwrap();
            for i in 0..8 {
                let id = VcpuId(u32::from(d) * 8 + i);
                s.add_vcpu(id, d, None).unwrap();
            }
        }
        // Domain 2's vCPUs stay off; the others run and move about.
        for d in [1u32, 3] {
            for i in 0..8 {
                s.power_on(0, VcpuId(d * 8 + i)).unwrap();
            }
        }
        for t in 0..200u64 {
            for p in 0..8 {
                s.schedule(t * 1_000_000, p).unwrap();
            }
        }
        assert_eq!(s.remove_domain(1), Err(SchedError::DomainBusy(1)));
        s.remove_domain(2).unwrap();
        for i in 16..24 {
            assert!(s.state(VcpuId(i)).is_none());
            assert_eq!(s.route[i as usize].load(Ordering::Relaxed), 0);
        }
        // The others are still live exactly once, where their route says.
        assert_eq!(super::tests::live_members(&s), 16);
        for t in 200..400u64 {
            for p in 0..8 {
                s.schedule(t * 1_000_000, p).unwrap();
            }
        }
        assert!((8..16).chain(24..32).all(|i| s.state(VcpuId(i)).is_some()));
        // The same ids again.
        s.add_domain(2, DomainParams::default()).unwrap();
        s.add_vcpu(VcpuId(16), 2, None).unwrap();
        s.power_on(400_000_000, VcpuId(16)).unwrap();
        assert!(s.runqueue_of_vcpu(VcpuId(16)).is_some());
    }
}
