//! The phases of [`Scheduler::schedule`] around the pick: charging the
//! vCPU that ran, recording why it left and requeueing it, switching the
//! next one in, arming the timer of its slice, or idling.
//!
//! Contract: a vCPU switched in has `last_burn` = the switch time, so its
//! run time (and the context switch the caller makes then) is charged from
//! the `schedule()` that picked it; a vCPU that leaves gives its budget
//! back only after the switch (as Credit2's `context_saved`). Uses every
//! policy file of `sched` below it (credit, cap, runq, wake); none uses it.

use super::runq::MIGRATE_COMPENSATION_NS;
use super::{Decision, PreemptReason, RunState, Scheduler, SwitchInfo, SwitchReason, VcpuId, WakeMode, MIN_TIMER_NS};

impl Scheduler {
    /// `schedule`'s first phase: the previous vCPU's run is charged and due
    /// budgets replenished; returns the previous vCPU if it may run on (still
    /// running here, and a capped one has budget: else it is parked).
    pub(super) fn account_prev(&mut self, now: u64, pcpu: usize, prev: Option<usize>) -> Option<usize> {
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

    /// Why `s` leaves its pCPU, for the recorder: the switch-out record.
    pub(super) fn switch_out(
        &self,
        s: usize,
        yielding: bool,
        forced: Option<PreemptReason>,
    ) -> (VcpuId, SwitchReason, i64) {
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

    /// The previous vCPU `s`, still runnable, is descheduled if `next` is
    /// another; returns its id when it was preempted so. It goes back on
    /// the runqueue in [`Self::requeue`]: in Credit2 (the control mode)
    /// only once `next`'s slice is set, its delayed re-queue, so that the
    /// slice runs until `next`'s credit would fall to the next *other*
    /// waiter's and two hogs on a pCPU switch every 10 ms. With our
    /// extensions on, `schedule` queues it before the slice is set, so the
    /// slice ends when `next`'s credit falls to `s`'s (at the minimum
    /// slice, for equal hogs): long slices make Credit2's reset clip the
    /// credit of whichever vCPU has just started one on another pCPU, and
    /// three equal hogs on two pCPUs then get 0.71/0.64/0.65 of a pCPU in
    /// the simulator and 0.68/0.69/0.63 in a guest run, where the fine
    /// interleaving keeps them within 0.01 of 2/3. Xen itself counts the
    /// leaving unit's credit from 4.21 on; the control mode is 4.17's.
    /// (The measurements: docs/benchmarks/scheduler-xen-conformance.md.)
    pub(super) fn deschedule_prev(
        &mut self,
        s: usize,
        next: Option<usize>,
        yielding: bool,
        forced: Option<PreemptReason>,
    ) -> Option<VcpuId> {
        let mut preempted = None;
        if next != Some(s) {
            self.vcpus[s].state = RunState::Runnable;
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

    /// The vCPU `s` that [`Self::deschedule_prev`] took off `pcpu` goes back
    /// on its runqueue (unless `schedule` queued it already: `delayed`
    /// false), and a pCPU that should take it is tickled: the decision's
    /// kick (else an idle pCPU for anything else queued).
    #[inline]
    pub(super) fn requeue(&mut self, now: u64, pcpu: usize, s: Option<usize>, delayed: bool) -> Option<usize> {
        if let Some(s) = s {
            if delayed {
                self.enqueue(s);
            }
            if self.pcpus.len() > 1 {
                if let Some(k) = self.tickle_requeued(now, s, pcpu) {
                    return Some(k);
                }
            }
        }
        self.idle_pcpu_for_queued(pcpu)
    }

    /// Nothing to run on `pcpu`: it idles (the vCPU that `left` gives its
    /// budget back), with a timer only for what the runqueue needs.
    pub(super) fn go_idle(
        &mut self,
        now: u64,
        pcpu: usize,
        left: Option<usize>,
        preempted: Option<VcpuId>,
        switch: SwitchInfo,
    ) -> Decision {
        self.mark_busy(pcpu, false);
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

    /// `n` starts running on `pcpu`: state, migration, the protected run
    /// after a wake-preemption, the wake-to-run latency; the switch-in
    /// record.
    pub(super) fn switch_in(&mut self, now: u64, pcpu: usize, n: usize) -> (VcpuId, i64, Option<u64>) {
        self.mark_busy(pcpu, true);
        let v = &mut self.vcpus[n];
        v.state = RunState::Running(pcpu);
        v.last_burn = now;
        v.preempted = false;
        if v.home != pcpu {
            v.home = pcpu;
            v.credit = v.credit.saturating_add(MIGRATE_COMPENSATION_NS);
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
    #[inline(always)]
    pub(super) fn arm_slice(&mut self, now: u64, pcpu: usize, n: usize, directed: bool) -> Option<u64> {
        let lend = directed && self.cfg.wake_mode == WakeMode::Preempt && self.cfg.lhp_grace_ns > 0;
        self.pcpus[pcpu].loan = lend;
        let slice = if lend { self.cfg.lhp_grace_ns.max(MIN_TIMER_NS) } else { self.runtime(now, pcpu, n) };
        // Credit2 clamps the slice to the budget before the minimum time
        // (`csched2_runtime`), so a capped vCPU may overrun its budget up to
        // the minimum slice, the debt charged to its domain's pool; with our
        // extensions the slice ends with the budget.
        let at = if self.cfg.extensions() {
            now.saturating_add(slice).min(self.budget_end(now, n))
        } else {
            now.saturating_add(slice)
        };
        let timer = self.clamp_timer(Some(at));
        self.pcpus[pcpu].timer_at = timer;
        timer
    }

    /// The runner's slice on `pcpu` computed again (Credit2 balances before
    /// it computes the slice; [`Sched`](super::Sched) balances after the
    /// `schedule()` that reset, and a vCPU it pulled in may wait for this
    /// pCPU now). A loan (directed yield) keeps its slice.
    #[cold]
    pub(super) fn rearm_slice(&mut self, now: u64, pcpu: usize) -> Option<u64> {
        match self.pcpus[pcpu].curr {
            Some(n) if !self.pcpus[pcpu].loan => self.arm_slice(now, pcpu, n, false),
            _ => self.pcpus[pcpu].timer_at,
        }
    }
}
