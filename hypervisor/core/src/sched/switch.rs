//! The phases of [`Scheduler::schedule`] around the pick: charging the
//! vCPU that ran, recording why it left and requeueing it, switching the
//! next one in, arming the timer of its slice, or idling.
//!
//! Contract: a vCPU switched in has `last_burn` = the switch time, so its
//! run time (and the context switch the caller makes then) is charged from
//! the `schedule()` that picked it; a vCPU that leaves gives its budget
//! back only after the switch (as Credit2's `context_saved`). Uses every
//! policy file of `sched` below it (credit, cap, runq, wake); none uses it.

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

    /// The previous vCPU `s`, still runnable, goes back on the runqueue if
    /// `next` is another; returns its id when it was preempted so.
    pub(super) fn requeue_prev(
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
    pub(super) fn go_idle(
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

    /// `n` starts running on `pcpu`: state, migration, the protected run
    /// after a wake-preemption, the wake-to-run latency; the switch-in
    /// record.
    pub(super) fn switch_in(&mut self, now: u64, pcpu: usize, n: usize) -> (VcpuId, i64, Option<u64>) {
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
    pub(super) fn arm_slice(&mut self, now: u64, pcpu: usize, n: usize, directed: bool) -> Option<u64> {
        let lend = directed && self.cfg.wake_mode == WakeMode::Preempt && self.cfg.lhp_grace_ns > 0;
        self.pcpus[pcpu].loan = lend;
        let slice = if lend { self.cfg.lhp_grace_ns.max(MIN_TIMER_NS) } else { self.runtime(now, pcpu, n) };
        let at = now.saturating_add(slice).min(self.budget_end(now, n));
        let timer = self.clamp_timer(Some(at));
        self.pcpus[pcpu].timer_at = timer;
        timer
    }
}
