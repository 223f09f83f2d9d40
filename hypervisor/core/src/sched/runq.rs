//! Run queues: queueing by credit, picking the next vCPU (Credit2's
//! `runq_candidate`), slice length, idle pCPUs for queued work.
//!
//! * pCPUs share Credit2 runqueues sorted by credit (highest first, FIFO on
//!   ties): the pCPUs of a socket (`credit2_runqueue=socket`, Xen's
//!   default; on the machines we describe, all pCPUs) in runqueues of at
//!   most `sched_credit2_max_cpus_runqueue` (16), or one per pCPU
//!   (`credit2_runqueue=cpu`). A pCPU runs whichever of {current vCPU,
//!   first queued vCPU it may take} has more credit; it may take a vCPU
//!   allowed on it, not reserved by a tickle for another pCPU that has not
//!   scheduled yet, and, if the vCPU last ran elsewhere, richer than its
//!   runner by the migration resistance ([`MIGRATE_RESIST_NS`]; a vCPU
//!   that moves gets [`MIGRATE_COMPENSATION_NS`]).
//! * Slice: run until the picked vCPU's credit would fall to the next
//!   waiter's (or to 0 if nobody waits), clamped to
//!   `[max(min_slice, rest of ratelimit window), max_slice]`; a capped
//!   vCPU's budget cuts it (after the clamp with our extensions, before it
//!   in the control mode, as Credit2).
//! * Ratelimit: a runnable vCPU that has run less than `ratelimit` since it
//!   was switched in keeps the pCPU at a `schedule()` unless it yields (or
//!   its domain's budget is used up).
//! * Hard affinity pins a vCPU to one pCPU. Where a woken vCPU goes is
//!   wake.rs's (`runq_tickle`); moves between runqueues are balance.rs's.
//!   `schedule()` asks (through [`Decision::kick`](super::Decision::kick))
//!   an idle, untickled pCPU of its runqueue to come and pick when work is
//!   left queued.
//!
//! Contract: a queue holds only runnable, unparked vCPUs of that runqueue,
//! in credit order; whoever changes a queued vCPU's credit re-sorts it.
//! Uses credit.rs and cap.rs (a capped vCPU is picked only with budget);
//! neither uses this file.

use super::{RunState, Scheduler, MIN_TIMER_NS};

/// Credit lead a remote waiter needs to be pulled to another pCPU
/// (Credit2's migrate resist; the default of `sched_credit2_migrate_resist`).
pub const MIGRATE_RESIST_NS: i64 = 500_000;
/// Credit a vCPU gets when it moves to another pCPU (Credit2's
/// `CSCHED2_MIGRATE_COMPENSATION`), for the cache it leaves behind.
pub const MIGRATE_COMPENSATION_NS: i64 = 50_000;
/// An idle pCPU's credit in the comparisons of a pick (Credit2's
/// `CSCHED2_IDLE_CREDIT`): below any vCPU's.
const IDLE_CREDIT: i64 = -(1 << 30);

impl Scheduler {
    /// Number of runqueues (`credit2_runqueue=`).
    pub fn nr_runqueues(&self) -> usize {
        self.rqs.len()
    }

    /// The runqueue `pcpu` picks from.
    pub fn runqueue_of(&self, pcpu: usize) -> Option<usize> {
        self.pcpus.get(pcpu).map(|p| p.rq)
    }

    /// The runqueue `vcpu` belongs to.
    pub fn runqueue_of_vcpu(&self, vcpu: super::VcpuId) -> Option<usize> {
        self.index.get(vcpu).map(|s| self.vcpus[s].rq)
    }

    /// Credit resets of runqueue `rq` so far.
    pub fn runqueue_resets(&self, rq: usize) -> Option<u64> {
        self.rqs.get(rq).map(|r| r.resets)
    }

    /// Per runqueue, `sched.rqN.name=value` lines: its pCPUs (first-last),
    /// the vCPUs it holds, its credit resets, `schedule()` calls and tickles.
    pub fn write_runqueue_stats(&self, out: &mut impl core::fmt::Write) -> core::fmt::Result {
        for (i, rq) in self.rqs.iter().enumerate().filter(|&(i, _)| self.owns(i)) {
            let (first, last) = (rq.pcpus.first().copied().unwrap_or(0), rq.pcpus.last().copied().unwrap_or(0));
            let vcpus = rq.members.len();
            let sum = |f: fn(&super::Pcpu) -> u64| rq.pcpus.iter().map(|&p| f(&self.pcpus[p])).sum::<u64>();
            writeln!(out, "sched.rq{i}.pcpus={first}-{last}")?;
            writeln!(out, "sched.rq{i}.vcpus={vcpus}")?;
            writeln!(out, "sched.rq{i}.resets={}", rq.resets)?;
            writeln!(out, "sched.rq{i}.arrivals={}", rq.arrivals)?;
            writeln!(out, "sched.rq{i}.schedules={}", sum(|p| p.schedules))?;
            writeln!(out, "sched.rq{i}.tickles={}", sum(|p| p.tickles))?;
        }
        Ok(())
    }

    /// Take `s` off its runqueue's queue, if it is there.
    #[inline]
    pub(super) fn unqueue(&mut self, s: usize) {
        let rq = self.vcpus[s].rq;
        self.op(self.rqs[rq].queue.len());
        self.rqs[rq].queue.retain(|&x| x != s);
    }

    /// Queue the runnable vCPU `s` on its runqueue, by credit.
    #[inline]
    pub(super) fn enqueue(&mut self, s: usize) {
        let c = self.vcpus[s].credit;
        let vcpus = &self.vcpus;
        let q = &mut self.rqs[vcpus[s].rq].queue;
        let pos = q.iter().position(|&x| vcpus[x].credit < c).unwrap_or(q.len());
        q.insert(pos, s);
        self.op(pos + 1);
    }

    pub(super) fn pick(
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
        // Directed yield: run the target here if it is still runnable and
        // preempted (the caller chose it from a lock-free hint) and may run
        // here.
        // A target of another runqueue is not live here: undirected.
        if let Some(t) = yield_target.filter(|&t| self.owns(self.vcpus[t].rq)) {
            let v = &self.vcpus[t];
            if v.state == RunState::Runnable && v.preempted && !v.parked && v.allowed_on(p) {
                if self.ensure_budget(t) {
                    let rq = self.pcpus[p].rq;
                    if self.vcpus[t].rq != rq {
                        self.unqueue(t);
                        self.move_to_rq(now, t, rq);
                        self.enqueue(t);
                    }
                    return (Some(t), true);
                }
                self.park(t);
            }
        }
        loop {
            let head = self.candidate(p, prev);
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
                Some(h) => {
                    if Some(h) == head {
                        self.vcpus[h].tickled_cpu = None;
                    }
                    return (pick, false);
                }
                None => return (None, false),
            }
        }
    }

    /// The first vCPU queued on `p`'s runqueue that `p` may take (Credit2's
    /// `runq_candidate`): allowed on `p`, not reserved by a tickle for
    /// another pCPU that has not scheduled yet, and, if it last ran on
    /// another pCPU, richer than `p`'s runner by the migration resistance
    /// (any waiter beats an idle pCPU).
    fn candidate(&self, p: usize, runner: Option<usize>) -> Option<usize> {
        let base = runner.map_or(IDLE_CREDIT, |s| self.vcpus[s].credit);
        let resist = self.cfg.migrate_resist_ns as i64;
        self.rqs[self.pcpus[p].rq].queue.iter().copied().inspect(|_| self.op(1)).find(|&h| {
            let v = &self.vcpus[h];
            v.allowed_on(p)
                && !v.tickled_cpu.is_some_and(|t| t != p && self.is_tickled(t))
                && (v.home == p || v.credit > base.saturating_add(resist))
        })
    }

    /// Credit2's slice length for the vCPU `n` just picked on `p`.
    #[inline(always)]
    pub(super) fn runtime(&self, now: u64, p: usize, n: usize) -> u64 {
        let credit = self.vcpus[n].credit;
        let rt = match self.rqs[self.pcpus[p].rq].queue.first() {
            Some(&w) if self.vcpus[w].credit > 0 => credit.saturating_sub(self.vcpus[w].credit),
            _ => credit,
        };
        let mut t = self.c2t(n, rt);
        if !self.cfg.extensions() && !self.no_caps() && self.domains[self.vcpus[n].dom].capped() {
            // Credit2: never more than the budget, before the minimum.
            t = t.min(self.vcpus[n].budget.max(0) as u64);
        }
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

    /// An idle pCPU of `p`'s runqueue, not yet tickled, that could take
    /// something still queued there.
    #[inline]
    pub(super) fn idle_pcpu_for_queued(&self, p: usize) -> Option<usize> {
        let rq = &self.rqs[self.pcpus[p].rq];
        if rq.queue.is_empty() || rq.pcpus.len() < 2 {
            return None;
        }
        rq.pcpus.iter().copied().inspect(|_| self.op(1)).find(|&o| {
            o != p
                && self.pcpus[o].curr.is_none()
                && !self.is_tickled(o)
                && rq.queue.iter().inspect(|_| self.op(1)).any(|&s| self.vcpus[s].allowed_on(o))
        })
    }

    /// The pCPUs of `s`'s runqueue it may run on, starting from the one it
    /// last ran on and cycling (Credit2's `cpumask_test_or_cycle`).
    pub(super) fn cycle_from_home(&self, s: usize) -> impl Iterator<Item = usize> + '_ {
        let v = &self.vcpus[s];
        let pcpus = &self.rqs[v.rq].pcpus;
        let start = pcpus.iter().position(|&p| p >= v.home).unwrap_or(0);
        self.op(start + 1);
        pcpus[start..].iter().chain(&pcpus[..start]).copied().inspect(|_| self.op(1)).filter(move |&p| v.allowed_on(p))
    }
}
