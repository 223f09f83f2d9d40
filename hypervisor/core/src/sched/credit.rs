//! Credit accounting (Credit2 semantics): burning, weights, and the
//! per-runqueue reset that ends an epoch.
//!
//! * Credit is nanoseconds. A running vCPU burns `elapsed * max_weight /
//!   weight` (default weight 256; `max_weight` is the largest of its
//!   runqueue), the division's remainder carried to the next burn (Credit2's
//!   `residual`), so heavier domains burn slower and short runs lose nothing.
//!   A vCPU carries its domain's weight (not split between its vCPUs), or its
//!   own ([`Scheduler::set_vcpu_weight`]).
//! * Reset: when the best candidate of a runqueue — the picked vCPU or the
//!   runqueue's head, whichever has more credit — has credit ≤ 0, every
//!   online vCPU of that runqueue (only that one) gets [`CREDIT_INIT_NS`]
//!   (10 ms) added — twice if the picked one is at the -10 ms floor —
//!   and is capped at `CREDIT_INIT + CARRYOVER_MAX`: what it had left carries
//!   over up to 500 µs. Counted per runqueue ([`Scheduler::runqueue_resets`])
//!   and per domain ([`DomainStats::credit_resets`](super::DomainStats::credit_resets)).
//!
//! Contract: only `Scheduler::burn` charges run time, and it is
//! called before anything reads a running vCPU's credit or changes a weight,
//! so run time is always charged at the weight it ran with. This file uses
//! no other policy file of `sched`.

use super::{domain, RunState, SchedError, Scheduler, VcpuId};

/// Credit given at a reset, ns (Credit2's CSCHED2_CREDIT_INIT).
pub const CREDIT_INIT_NS: i64 = 10_000_000;
/// Credit a vCPU may carry over a reset (Credit2: the minimum timer).
pub const CARRYOVER_MAX_NS: i64 = 500_000;
/// Floor of a vCPU's credit, ns (Credit2's CSCHED2_CREDIT_MIN): burning
/// never takes credit below it, in both modes. Without a floor a very light
/// vCPU's debt grows without bound while it runs one slice, and it waits
/// for as many resets as its debt is deep (1 ms per ~65 s at 65535:1); with
/// it, a reset (which adds twice CREDIT_INIT at the floor) always brings
/// the picked vCPU back into the black, so every runnable vCPU runs at
/// least about one slice per epoch (~4.8 % at 65535:1, as Credit2).
pub(super) const CREDIT_MIN_NS: i64 = -CREDIT_INIT_NS;

impl Scheduler {
    /// Give one vCPU its own weight (`Some`, 1..=65535) or its domain's
    /// again (`None`), at `now`: run time until `now` is charged at the old
    /// weight. It then burns credit as a vCPU of a domain of that weight
    /// would, and a vCPU it wake-preempts gets a protected run shortened
    /// by the ratio of their weights (see the module doc). Credit2's
    /// weights are per domain; this is the extension for two vCPUs of one
    /// domain that need different shares (`sched_vcpu_weight=`).
    /// With the extensions off ([`SchedConfig::extensions`](super::SchedConfig::extensions))
    /// an own weight is refused ([`SchedError::ExtensionOff`]).
    pub fn set_vcpu_weight(&mut self, now: u64, vcpu: VcpuId, weight: Option<u32>) -> Result<(), SchedError> {
        let s = self.slot(vcpu)?;
        if weight.is_some() && !self.cfg.extensions() {
            return Err(SchedError::ExtensionOff("sched_vcpu_weight"));
        }
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
        self.index.get(vcpu).map(|s| self.vcpus[s].weight)
    }

    /// Current credit (ns) of a vCPU.
    pub fn credit(&self, vcpu: VcpuId) -> Option<i64> {
        self.index.get(vcpu).map(|s| self.vcpus[s].credit)
    }

    /// Charge a running vCPU for its time since the last burn: credit
    /// `elapsed × max_weight / weight`, the division's remainder carried to
    /// the next burn, never below [`CREDIT_MIN_NS`]; a capped domain's vCPU
    /// also spends budget 1:1.
    #[inline]
    pub(super) fn burn(&mut self, s: usize, now: u64) {
        let max_w = self.rqs[self.vcpus[s].rq].max_weight;
        let v = &mut self.vcpus[s];
        if !matches!(v.state, RunState::Running(_)) {
            return;
        }
        let delta = now.saturating_sub(v.last_burn);
        v.last_burn = v.last_burn.max(now);
        v.stats.counters.run_ns += delta;
        let (cost, residual) = scale_run(delta, max_w, v.residual, v.weight.max(1));
        v.residual = residual;
        v.credit = v.credit.saturating_sub(cost).max(CREDIT_MIN_NS);
        let d = &mut self.domains[v.dom];
        d.stats.run_ns += delta;
        if d.capped() {
            v.budget = v.budget.saturating_sub(delta.min(i64::MAX as u64) as i64);
        }
    }

    /// Credit → run time for vCPU `s`.
    pub(super) fn c2t(&self, s: usize, credit: i64) -> u64 {
        if credit <= 0 {
            return 0;
        }
        let max_w = u64::from(self.rqs[self.vcpus[s].rq].max_weight.max(1));
        let (credit, w) = (credit as u64, u64::from(self.vcpus[s].weight));
        if w == max_w {
            return credit;
        }
        // In 64 bits when the product fits (any credit below ~2^48 ns with
        // a 16-bit weight): a 128-bit division is a library call of some
        // fifty instructions, on every slice armed.
        match credit.checked_mul(w) {
            Some(p) => p / max_w,
            None => (u128::from(credit) * u128::from(w) / u128::from(max_w)) as u64,
        }
    }

    pub(super) fn update_max_weights(&mut self) {
        for rq in 0..self.rqs.len() {
            self.update_max_weight(rq);
        }
    }

    /// Runqueue `rq`'s heaviest weight, from its members.
    pub(super) fn update_max_weight(&mut self, rq: usize) {
        self.op(self.rqs[rq].members.len());
        let r = &mut self.rqs[rq];
        r.max_weight = r.members.iter().map(|&s| self.vcpus[s].weight).max().unwrap_or(1);
    }

    pub(super) fn sort_runq(&mut self, rq: usize) {
        self.op(self.rqs[rq].queue.len());
        let vcpus = &self.vcpus;
        self.rqs[rq].queue.sort_by(|&a, &b| vcpus[b].credit.cmp(&vcpus[a].credit));
    }

    /// Credit2 reset of runqueue `rq`: each of its online vCPUs gets
    /// CREDIT_INIT (twice if the picked vCPU is at the floor
    /// [`CREDIT_MIN_NS`], so that it is positive again), capped at
    /// `CREDIT_INIT + CARRYOVER_MAX`: what a vCPU had left carries over up
    /// to that cap. vCPUs running on the runqueue's other pCPUs are charged
    /// up to `now` first (as Credit2 does), so that the cap clips what they
    /// really have left.
    pub(super) fn reset_credit(&mut self, now: u64, rq: usize, picked_credit: i64) {
        self.op(self.rqs[rq].pcpus.len() + self.rqs[rq].members.len());
        for i in 0..self.rqs[rq].pcpus.len() {
            if let Some(s) = self.pcpus[self.rqs[rq].pcpus[i]].curr {
                self.burn(s, now);
            }
        }
        let mut m: i64 = 1;
        if picked_credit <= CREDIT_MIN_NS {
            m += (-picked_credit) / CREDIT_INIT_NS;
        }
        let add = m.saturating_mul(CREDIT_INIT_NS);
        self.rqs[rq].resets += 1;
        let this = Some((rq, self.rqs[rq].resets));
        for &s in &self.rqs[rq].members {
            let v = &mut self.vcpus[s];
            if v.state == RunState::Offline {
                continue;
            }
            v.credit = v.credit.saturating_add(add).min(CREDIT_INIT_NS + CARRYOVER_MAX_NS);
            let d = &mut self.domains[v.dom];
            if d.last_reset != this {
                d.last_reset = this;
                d.stats.credit_resets += 1;
            }
        }
        self.sort_runq(rq);
    }

    /// `n` leaves the runqueue; Credit2's epoch ends when the best
    /// candidate of the runqueue (`n` or the runqueue's head, whichever has
    /// more) has no credit. Whether it ended.
    #[inline]
    pub(super) fn end_epoch_if_due(&mut self, now: u64, pcpu: usize, n: usize) -> bool {
        let rq = self.pcpus[pcpu].rq;
        self.op(self.rqs[rq].queue.len());
        self.rqs[rq].queue.retain(|&x| x != n);
        let head = self.rqs[rq].queue.first().map(|&h| self.vcpus[h].credit);
        let best = head.map_or(self.vcpus[n].credit, |h| h.max(self.vcpus[n].credit));
        if best <= 0 {
            self.reset_credit(now, rq, self.vcpus[n].credit);
        }
        best <= 0
    }
}

/// `delta` ns of run at weight `w` charged against a runqueue whose
/// heaviest weight is `max_w`, with the remainder `residual` the last
/// charge left: (credit to take, new remainder), so that no fraction of a
/// nanosecond is lost over many charges. In 64 bits when the product fits
/// (any run shorter than ~3 days with a 16-bit weight): a 128-bit division
/// is a library call of some fifty instructions, twice per switch.
fn scale_run(delta: u64, max_w: u32, residual: u64, w: u32) -> (i64, u64) {
    if w == max_w && u64::from(w) > residual {
        // The heaviest weight: one ns of credit per ns of run.
        return (delta.min(i64::MAX as u64) as i64, residual);
    }
    let (max_w, w) = (u64::from(max_w), u64::from(w));
    match delta.checked_mul(max_w).and_then(|p| p.checked_add(residual)) {
        Some(scaled) => ((scaled / w).min(i64::MAX as u64) as i64, scaled % w),
        None => {
            let scaled = u128::from(delta) * u128::from(max_w) + u128::from(residual);
            let w = u128::from(w);
            ((scaled / w).min(i64::MAX as u128) as i64, (scaled % w) as u64)
        }
    }
}

#[cfg(test)]
mod scale_tests {
    use super::scale_run;

    /// The 64-bit path and the 128-bit one agree, and the remainder carries.
    #[test]
    fn scale_run_matches_exact_arithmetic() {
        for &(delta, max_w, residual, w) in &[
            (1_000_000u64, 512u32, 0u64, 256u32),
            (999, 65535, 100, 1),
            (999, 256, 100, 256),
            (999, 256, 300, 256),
            (u64::MAX, 256, 0, 256),
            (12_345_678, 300, 299, 300),
            (u64::MAX / 2, 65535, 7, 3),
            (u64::MAX, 1, 0, 1),
        ] {
            let exact = u128::from(delta) * u128::from(max_w) + u128::from(residual);
            let want = ((exact / u128::from(w)).min(i64::MAX as u128) as i64, (exact % u128::from(w)) as u64);
            assert_eq!(scale_run(delta, max_w, residual, w), want, "{delta} {max_w} {residual} {w}");
        }
        // Three thirds of a nanosecond make one.
        let (c1, r1) = scale_run(1, 1, 0, 3);
        let (c2, r2) = scale_run(1, 1, r1, 3);
        let (c3, r3) = scale_run(1, 1, r2, 3);
        assert_eq!((c1 + c2 + c3, r3), (1, 0));
        assert_eq!(scale_run(1, 3, 0, 3), (1, 0));
    }
}
