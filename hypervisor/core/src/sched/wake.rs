//! Wakes: whether a woken vCPU preempts the runner at once, waits for a
//! lock-holder grace or a protected run, or waits for the runner's
//! ratelimit window; and a capped domain's parked vCPUs coming back.
//!
//! # Wake paths ([`WakeMode`])
//! * Both modes look for a pCPU as Credit2's `runq_tickle` does
//!   (`Scheduler::tickle`): an idle, untickled pCPU of the vCPU's
//!   runqueue first, else the busy, untickled one whose runner it beats by
//!   most.
//! * [`WakeMode::XenCompat`] reproduces `runq_tickle`: a busy pCPU whose
//!   runner ran less than `ratelimit - 50 µs` is not tickled; otherwise it is
//!   tickled when the woken vCPU has more credit. Nothing re-arms the
//!   runner's timer. This is the control group and must show the collapse
//!   described in the `sched` module doc.
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
//! * A vCPU whose capped domain has no budget is parked at once when it
//!   wakes: it preempts nobody, and the answer re-arms a timer to the
//!   replenishment. A parked vCPU's wake is a no-op.
//!
//! # Lock-holder preemption
//! Preempting a vCPU at its SGI/MMIO trap can preempt a guest lock holder
//! (the guest's virtqueue lock; docs/benchmarks/scheduler-tuning.md has what
//! that costs). Two defences, both for [`WakeMode::Preempt`] only:
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
//!   Where WFE does not trap (QEMU's TCG), [`super::spin::SpinDetector`] finds
//!   the spinner by sampling its PC instead, and the run loop yields it the
//!   same way.
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
//! preemptions of it; equal weights keep the full bound. The bound is not
//! lifted on evidence of a light waker: cyclictest `-i50`, which it delays,
//! and the fast waker it exists for — wakes every 50 µs, runs a few µs —
//! both use well under their share, so no demand test tells them apart
//! (docs/benchmarks/timer-tail.md has the figures). The context switch
//! costs (a few µs of EL2 work each) fall inside the switched-in vCPU's run
//! time, as the clock starts at `schedule()`; the simulator models them
//! that way.
//!
//! Uses credit.rs, cap.rs and runq.rs (a woken vCPU is placed and queued
//! there); none of them uses this file.

use super::{
    Decision, Deferral, PreemptReason, RunState, SchedError, Scheduler, SwitchInfo, VcpuId, WakeAction, WakeCause,
    WakeMode, MIN_TIMER_NS,
};

/// Credit2's ratelimit tolerance in `runq_tickle`.
pub const RATELIMIT_TOLERANCE_NS: u64 = 50_000;

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

/// A lock-holder grace opened at an SGI trap with IRQs masked, and what
/// ends it at a later exit of the same vCPU (the trap code then reports
/// [`CritEvidence::None`] to [`Scheduler::note_critical_exit`]).
///
/// Either the guest unmasked IRQs, or the interrupt handler it was running
/// when it sent the SGI has dropped its priority. A Linux guest sends the
/// wake-up IPI of an I/O completion from the disk's interrupt handler,
/// holding the queue's lock, IRQs masked because it is a handler; it writes
/// EOI once the handler has returned and released its locks, but stays
/// masked until it leaves interrupt context, which causes no exit. While
/// such a grace is open the vGIC gives the vCPU's active software
/// interrupts EOI maintenance (`Vgic::watch_active_eoi`), so that EOI is an
/// exit and the grace ends at the handler's end rather than at its time
/// limit. A forwarded hardware interrupt's EOI reaches the physical GIC
/// without an exit: its grace still ends at the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraceWatch {
    /// The priority-group bit of the handler running at the trap (the
    /// highest active priority: the lowest set bit), 0 outside a handler.
    handler: u128,
}

impl GraceWatch {
    /// Opened at an SGI trap; `active`: the vCPU's active Group 1 priority
    /// bits then (bit n: priority group n acknowledged, not dropped).
    pub fn open(active: u128) -> Self {
        GraceWatch { handler: active & active.wrapping_neg() }
    }

    /// Whether an exit with `evidence` and active priority bits `active`
    /// ends the grace.
    pub fn ends(self, evidence: CritEvidence, active: u128) -> bool {
        evidence == CritEvidence::None || (self.handler != 0 && active & self.handler == 0)
    }

    /// Whether the SGI was sent from inside an interrupt handler.
    pub fn in_handler(self) -> bool {
        self.handler != 0
    }
}

impl Scheduler {
    /// Wake `vcpu` (virtual interrupt, vSGI, vtimer, doorbell). A vCPU that is
    /// not blocked gets a no-op (a parked one stays parked until its
    /// domain's budget is replenished); an offline one is ignored. A vCPU
    /// whose domain has no budget left is parked at once: it preempts
    /// nobody, and the answer re-arms a timer to the replenishment.
    pub fn wake(&mut self, now: u64, vcpu: VcpuId, cause: WakeCause) -> Result<WakeAction, SchedError> {
        let s = self.slot(vcpu)?;
        Ok(self.wake_slot(now, s, cause))
    }

    /// [`Scheduler::wake`], with what the waker does next: whether the
    /// vCPU was blocked, and the pCPU it runs on after the wake (`None`:
    /// it does not run), found with one lookup of the vCPU.
    pub fn wake_located(
        &mut self,
        now: u64,
        vcpu: VcpuId,
        cause: WakeCause,
    ) -> Result<(bool, WakeAction, Option<usize>), SchedError> {
        let s = self.slot(vcpu)?;
        let blocked = self.vcpus[s].state == RunState::Blocked;
        let action = self.wake_slot(now, s, cause);
        let on = match self.vcpus[s].state {
            RunState::Running(p) => Some(p),
            _ => None,
        };
        Ok((blocked, action, on))
    }

    fn wake_slot(&mut self, now: u64, s: usize, cause: WakeCause) -> WakeAction {
        self.last_deferral = None;
        self.replenish_due(now);
        let v = &mut self.vcpus[s];
        match v.state {
            RunState::Offline => return WakeAction::None,
            RunState::Runnable | RunState::Running(_) => {
                v.stats.counters.wakes_noop += 1;
                return WakeAction::None;
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
        self.make_runnable(now, s)
    }

    /// How the last [`Scheduler::wake`] was deferred (kind, until when), if
    /// it asked for a preemption that waits or fell in a ratelimit window.
    pub fn wake_deferral(&self) -> Option<(Deferral, u64)> {
        self.last_deferral
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

    pub(super) fn make_runnable(&mut self, now: u64, s: usize) -> WakeAction {
        self.note_load(s, 1, now);
        self.vcpus[s].state = RunState::Runnable;
        self.vcpus[s].preempted = false;
        let d = self.vcpus[s].dom;
        if !self.no_caps() && self.domains[d].capped() && self.vcpus[s].budget <= 0 && self.domains[d].budget() <= 0 {
            // No budget: parked, it waits for the replenishment and preempts nobody.
            self.set_parked(s, true);
            self.domains[d].stats.cap_parks += 1;
            let p = self.vcpus[s].affinity.unwrap_or(self.vcpus[s].home);
            let at = self.domains[d].next_repl;
            return self.rearm(now, p, at);
        }
        self.queue_and_tickle(now, s)
    }

    /// Queue the runnable vCPU `s` on its runqueue (a wake never changes
    /// it, unless the vCPU is pinned to a pCPU of another) and tickle.
    #[inline]
    pub(super) fn queue_and_tickle(&mut self, now: u64, s: usize) -> WakeAction {
        if let Some(a) = self.vcpus[s].affinity {
            // A pinned vCPU is on its pCPU's runqueue from `add_vcpu` on
            // (no balance moves it): this changes nothing (see `shards`).
            debug_assert!(self.shard.is_none() || self.vcpus[s].rq == self.pcpus[a].rq);
            self.move_to_rq(now, s, self.pcpus[a].rq);
        }
        self.enqueue(s);
        self.tickle(now, s)
    }

    /// Credit2's `runq_tickle` for the vCPU `s`, just queued: the first
    /// idle pCPU of its runqueue that no tickle is on its way to, from the
    /// one it last ran on; else the busy, untickled pCPU whose runner it
    /// beats by most (its runner charged to `now` first; the migration
    /// resistance taken off the lead on any pCPU but its last one), which
    /// in [`WakeMode::XenCompat`] must have run out its ratelimit window
    /// (less the tolerance) and be beaten at all, and in
    /// [`WakeMode::Preempt`] is preempted by the rules of this module's doc.
    /// A pCPU told to reschedule is marked tickled until it does, and `s`
    /// reserved for it.
    #[inline]
    pub(super) fn tickle(&mut self, now: u64, s: usize) -> WakeAction {
        if self.pcpus.len() == 1 {
            return self.tickle_the_pcpu(now, s);
        }
        if let Some(p) = self.idle_to_tickle(s) {
            return self.mark_tickled(p, s);
        }
        match self.cfg.wake_mode {
            WakeMode::XenCompat => match self.best_busy(now, s, true, None) {
                Some((p, lead)) if lead > 0 => self.mark_tickled(p, s),
                _ => WakeAction::None,
            },
            WakeMode::Preempt => match self.best_busy(now, s, false, None) {
                Some((p, lead)) => self.wake_preempt(now, s, p, lead),
                None => WakeAction::None,
            },
        }
    }

    /// [`Self::tickle`] on a machine of one pCPU: no pCPU to choose, no
    /// migration; the same decisions without the search.
    fn tickle_the_pcpu(&mut self, now: u64, s: usize) -> WakeAction {
        let Some(r) = self.pcpus[0].curr.filter(|&r| self.vcpus[r].state == RunState::Running(0)) else {
            return if self.is_tickled(0) { WakeAction::None } else { self.mark_tickled(0, s) };
        };
        if self.is_tickled(0) {
            return WakeAction::None;
        }
        if self.cfg.wake_mode == WakeMode::XenCompat && self.in_ratelimit_window(now, 0) {
            self.note_ratelimit_deferral(s, 0);
            return WakeAction::None;
        }
        self.burn(r, now);
        let lead = self.vcpus[s].credit.saturating_sub(self.vcpus[r].credit);
        match self.cfg.wake_mode {
            WakeMode::XenCompat if lead > 0 => self.mark_tickled(0, s),
            WakeMode::XenCompat => WakeAction::None,
            WakeMode::Preempt => self.wake_preempt(now, s, 0, lead),
        }
    }

    /// The pCPU that `s`, requeued at `pcpu`'s `schedule()` of another
    /// vCPU, is to be taken by (Credit2's `runq_tickle` from
    /// `context_saved`): an idle one, or a busy one past its ratelimit
    /// window whose runner it beats; the same choice in both wake modes,
    /// since this is no wake. `pcpu` itself is never one: its runner has
    /// just been picked over `s`.
    #[inline]
    pub(super) fn tickle_requeued(&mut self, now: u64, s: usize, pcpu: usize) -> Option<usize> {
        if self.rqs[self.vcpus[s].rq].pcpus == [pcpu] {
            return None;
        }
        let p = match self.idle_to_tickle(s) {
            Some(p) => p,
            None => match self.best_busy(now, s, true, Some(pcpu)) {
                Some((p, lead)) if lead > 0 => p,
                _ => return None,
            },
        };
        self.mark_tickled(p, s);
        Some(p)
    }

    /// Whether `p`'s runner is still inside its ratelimit window less the
    /// tolerance: not preemptible by a tickle (Credit2's `is_preemptable`
    /// negated).
    #[inline(always)]
    fn in_ratelimit_window(&self, now: u64, p: usize) -> bool {
        let rl = self.cfg.ratelimit_ns;
        rl > RATELIMIT_TOLERANCE_NS && now.saturating_sub(self.pcpus[p].entry) <= rl - RATELIMIT_TOLERANCE_NS
    }

    /// A wake of `s` that `p`'s ratelimit window holds off: counted, and
    /// recorded until the window's end ([`Scheduler::wake_deferral`]).
    #[inline(always)]
    fn note_ratelimit_deferral(&mut self, s: usize, p: usize) {
        self.vcpus[s].stats.counters.ratelimit_deferrals += 1;
        let end = self.pcpus[p].entry.saturating_add(self.cfg.ratelimit_ns);
        self.last_deferral = Some((Deferral::Ratelimit, end));
    }

    #[inline]
    fn mark_tickled(&mut self, p: usize, s: usize) -> WakeAction {
        let pc = &mut self.pcpus[p];
        self.rqs[pc.rq].tickled |= pc.bit;
        pc.tickles += 1;
        self.vcpus[s].tickled_cpu = Some(p);
        WakeAction::Reschedule { pcpu: p }
    }

    /// A pCPU of `s`'s runqueue that `s` may run on, is idle (or its runner
    /// has just blocked: its `schedule()` is on its way) and is not tickled:
    /// its last pCPU if so, else the next such from there, cycling (Credit2's
    /// `cpumask_test_or_cycle` over `idle & ~tickled`). From the runqueue's
    /// masks: no walk of its pCPUs.
    #[inline]
    fn idle_to_tickle(&self, s: usize) -> Option<usize> {
        let v = &self.vcpus[s];
        let rq = &self.rqs[v.rq];
        let all = (1u32 << rq.pcpus.len()) - 1;
        let allowed = match v.affinity {
            None => all,
            Some(a) if self.pcpus[a].rq == v.rq => self.pcpus[a].bit,
            Some(_) => 0,
        };
        let free = allowed & !(rq.busy | rq.tickled);
        self.op(1);
        if free == 0 {
            return None;
        }
        let first = rq.pcpus[0];
        // The place of its last pCPU, or of the first above it when that
        // is not one of the runqueue's.
        let from = v.home.saturating_sub(first).min(rq.pcpus.len());
        let above = free & !((1u32 << from) - 1);
        let at = if above != 0 { above } else { free }.trailing_zeros() as usize;
        Some(rq.pcpus[at])
    }

    /// The busy, untickled pCPU of `s`'s runqueue whose runner `s` leads by
    /// most in credit, and that lead (less the migration resistance on any
    /// pCPU but `s`'s last): its last pCPU first, another only if strictly
    /// better. `window`: skip pCPUs whose runner is inside its ratelimit
    /// window less the tolerance (Credit2's `is_preemptable`); when that
    /// leaves none `s` beats, a wake (`skip` None) counts a ratelimit
    /// deferral. `skip`: a pCPU not to consider.
    #[inline]
    fn best_busy(&mut self, now: u64, s: usize, window: bool, skip: Option<usize>) -> Option<(usize, i64)> {
        let resist = self.cfg.migrate_resist_ns as i64;
        let home = self.vcpus[s].home;
        let mut best: Option<(usize, i64)> = None;
        let mut held_off = None;
        let rq = self.vcpus[s].rq;
        self.op(self.rqs[rq].pcpus.len());
        for i in 0..self.rqs[rq].pcpus.len() {
            let p = self.rqs[rq].pcpus[i];
            let Some(r) = self.pcpus[p].curr else { continue };
            if self.is_tickled(p) || !self.vcpus[s].allowed_on(p) || skip == Some(p) {
                continue;
            }
            if window && self.in_ratelimit_window(now, p) {
                if p == home || held_off.is_none() {
                    held_off = Some(p);
                }
                continue;
            }
            self.burn(r, now);
            let mut lead = self.vcpus[s].credit.saturating_sub(self.vcpus[r].credit);
            if p != home {
                lead = lead.saturating_sub(resist);
            }
            // The home pCPU is looked at first by Credit2; here it wins ties.
            let better = match best {
                None => true,
                Some((b, l)) => lead > l || (lead == l && p == home && b != home),
            };
            if better {
                best = Some((p, lead));
            }
        }
        if let (Some(p), true, None) = (held_off, best.is_none_or(|(_, l)| l <= 0), skip) {
            self.note_ratelimit_deferral(s, p);
        }
        best
    }

    /// [`WakeMode::Preempt`]: whether the woken vCPU `s`, leading `p`'s
    /// runner by `lead` (less any migration resistance), preempts it now,
    /// after a lock-holder grace or protected run, or not (the runner's
    /// timer is then pulled to the end of its ratelimit window, or to when
    /// a heavier waker catches up).
    #[inline]
    fn wake_preempt(&mut self, now: u64, s: usize, p: usize, lead: i64) -> WakeAction {
        let Some(r) = self.pcpus[p].curr else {
            return self.mark_tickled(p, s);
        };
        let ran = now.saturating_sub(self.pcpus[p].entry);
        let in_window = self.cfg.ratelimit_ns > 0 && ran < self.cfg.ratelimit_ns;
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
                self.mark_tickled(p, s)
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

    /// Until when a pending wake-preemption of `p`'s runner is deferred:
    /// the end of its lock-holder grace (never past the cap fixed at the
    /// wake) or of its protected run, whichever is later.
    pub(super) fn deferral_end(&self, p: usize) -> u64 {
        let pc = &self.pcpus[p];
        pc.crit_until.min(pc.grace_limit).max(pc.protect_until)
    }

    pub(super) fn rearm(&mut self, now: u64, p: usize, at: u64) -> WakeAction {
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

    /// Catch-up of a heavier waker: a woken vCPU queued here whose weight
    /// exceeds the runner `s`'s, and which did not preempt at its wake (a
    /// little behind in credit, e.g. right after a reset), preempts once it
    /// leads by the granularity, as if it woke now, instead of waiting out
    /// the runner's ratelimit window (`tickle` pulled the timer to that
    /// moment). Equal weights keep Credit2's behaviour: the window.
    pub(super) fn catch_up_heavier_waker(&mut self, now: u64, pcpu: usize, s: usize) {
        if self.cfg.wake_mode != WakeMode::Preempt || self.pcpus[pcpu].pending_preempt.is_some() {
            return;
        }
        let rq = self.pcpus[pcpu].rq;
        let head = self.rqs[rq].queue.iter().copied().inspect(|_| self.op(1)).find(|&h| self.vcpus[h].allowed_on(pcpu));
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
    pub(super) fn defer_preemption(&mut self, now: u64, pcpu: usize, s: usize) -> Option<Decision> {
        self.pcpus[pcpu].pending_preempt?;
        let at = self.deferral_end(pcpu);
        if now >= at {
            return None;
        }
        let timer = self.clamp_timer(Some(at.min(self.budget_end(now, s))));
        self.pcpus[pcpu].timer_at = timer;
        let kind = if at == self.pcpus[pcpu].protect_until { Deferral::MinRun } else { Deferral::LhpGrace };
        let switch = SwitchInfo { deferred: Some((kind, at)), ..Default::default() };
        Some(Decision { next: Some(self.vcpus[s].id), timer_at: timer, switch, ..Decision::default() })
    }

    /// Replenish every capped domain whose period is over, and unpark its
    /// vCPUs. Every wake and schedule asks; the answer is nearly always
    /// "not yet", one comparison inlined at the caller.
    #[inline(always)]
    pub(super) fn replenish_due(&mut self, now: u64) {
        if now >= self.next_repl {
            self.replenish(now);
        }
    }

    #[cold]
    #[inline(never)]
    fn replenish(&mut self, now: u64) {
        self.op(self.domains.len());
        for d in 0..self.domains.len() {
            if self.domains[d].replenish_due(now) {
                self.unpark_domain(now, d);
            }
        }
        self.note_replenishments();
    }

    /// No domain is capped (the budget bookkeeping has nothing to do).
    pub(super) fn no_caps(&self) -> bool {
        self.next_repl == u64::MAX
    }

    /// Recomputes the earliest replenishment due (after a cap changed or
    /// replenishments were made).
    pub(super) fn note_replenishments(&mut self) {
        self.op(self.domains.len());
        self.next_repl = self.domains.iter().filter(|d| d.capped()).map(|d| d.next_repl).min().unwrap_or(u64::MAX);
    }

    /// Make the parked vCPUs of domain `d` runnable again.
    /// In slot order, each once: one that a tickle parks again stays so.
    pub(super) fn unpark_domain(&mut self, now: u64, d: usize) {
        let mut from = 0;
        loop {
            let list = &self.domains[d].parked;
            let Some(&s) = list.get(list.partition_point(|&x| x < from)) else { break };
            self.op(1);
            from = s + 1;
            self.set_parked(s, false);
            if self.vcpus[s].state == RunState::Runnable {
                // Its pCPU's timer is due now (see `clamp_timer`), so a
                // tickle of a busy pCPU is seen at its `schedule()`.
                let _ = self.queue_and_tickle(now, s);
            }
        }
    }

    /// `s` left its pCPU: what it holds goes back to its domain's pool,
    /// and if that leaves budget, the domain's parked vCPUs come back.
    #[inline]
    pub(super) fn give_back_budget(&mut self, now: u64, s: usize) {
        if self.no_caps() {
            return;
        }
        let d = self.vcpus[s].dom;
        if !self.domains[d].capped() {
            return;
        }
        let held = core::mem::take(&mut self.vcpus[s].budget);
        if self.domains[d].give_back(held) > 0 {
            self.unpark_domain(now, d);
        }
    }
}
