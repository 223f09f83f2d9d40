//! Spin detection by sampling, for CPUs whose WFE does not trap.
//!
//! The lock-holder defence of [`super::Scheduler::yield_to`] relies on a
//! waiter's WFE trapping to EL2 (HCR_EL2.TWE). QEMU's TCG never takes that
//! trap (its WFE is a plain yield to its own main loop), so under QEMU a
//! vCPU that spins on a lock held by a preempted sibling — with IRQs masked,
//! as Linux's `spin_lock_irqsave` waiters do — runs without a single exit
//! until its slice ends: its pending virtual timer cannot be taken, and the
//! forwarded physical timer stays active meanwhile. `cargo xtask bench
//! wakeup` showed such runs of 3.6 ms (docs/benchmarks/timer-tail.md).
//!
//! [`SpinDetector`] plays the part of pause-loop exiting instead: the run
//! loop samples the vCPU at its exits (and, while a sibling is preempted,
//! arms the EL2 timer [`SAMPLE_NS`] after each entry, so that there are exits
//! to sample); a vCPU found at EL1 with IRQs masked, within [`PC_WINDOW`]
//! bytes of the same place, at every sample for at least [`SPIN_NS`] of its
//! own run time (not elapsed time: see [`SpinDetector::sample`]) is spinning,
//! and the caller yields it as if it had trapped on WFE. Any exit that is not
//! a physical interrupt (a trap: the guest made progress) starts over.
//!
//! A sibling preempted *inside a critical section* (IRQs masked at its last
//! exit: Linux's `irqsave` locks, seqcount write sides) is the likely holder
//! of whatever the running vCPU waits for, so then the watch is close
//! ([`Watch::Critical`]: sampled every [`CRIT_SAMPLE_NS`], a spin after
//! [`CRIT_SPIN_NS`]). Seen in `cargo xtask bench timer --breaktrace 120`:
//! the hog's vCPU wake-preempted with IRQs masked, cyclictest's vCPU then
//! spinning at one place with IRQs masked for three 50 µs samples before
//! the yield, a 158 µs sample (docs/benchmarks/timer-tail.md).

use super::CritEvidence;

/// How often a running vCPU is sampled while a sibling is preempted (ns).
pub const SAMPLE_NS: u64 = 50_000;
/// How long the vCPU must stay at one place with IRQs masked (ns).
pub const SPIN_NS: u64 = 100_000;
/// Sampling while a sibling is preempted inside a critical section (ns).
pub const CRIT_SAMPLE_NS: u64 = 10_000;
/// How long a spin must last then (ns): two samples at one place.
pub const CRIT_SPIN_NS: u64 = 20_000;

/// How closely a running vCPU is watched, from its siblings' state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watch {
    /// A sibling is preempted (runnable, switched out involuntarily).
    Preempted,
    /// A sibling is preempted with its IRQs masked (inside a critical section).
    Critical,
}

impl Watch {
    /// The sampling period (ns).
    pub fn sample_ns(self) -> u64 {
        match self {
            Watch::Preempted => SAMPLE_NS,
            Watch::Critical => CRIT_SAMPLE_NS,
        }
    }

    /// How long a spin must last to count (ns).
    pub fn spin_ns(self) -> u64 {
        match self {
            Watch::Preempted => SPIN_NS,
            Watch::Critical => CRIT_SPIN_NS,
        }
    }
}
/// How far apart (bytes) two samples of one spin loop may be: Linux's wait
/// loops (`queued_spin_lock_slowpath`, `csd_lock_wait`, seqcount retries) are
/// a few instructions long.
pub const PC_WINDOW: u64 = 64;

/// One vCPU's samples since it last showed progress.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpinDetector {
    /// The current run of IRQs-masked samples at one place: the guest's
    /// own run time since its first sample, and that sample's PC.
    first: Option<(u64, u64)>,
}

impl SpinDetector {
    pub const fn new() -> Self {
        SpinDetector { first: None }
    }

    /// A sample at an IRQ exit: `ran_ns` is how long the guest ran since
    /// it was last entered, `pc` where it was (ELR_EL2), `evidence` what
    /// its PSTATE showed. Returns whether the vCPU has spent `spin_ns`
    /// ([`Watch::spin_ns`]) of its own run time at that place with IRQs
    /// masked since the first such sample; the detector then starts over
    /// (the caller yields).
    ///
    /// Run time, not elapsed time: a vCPU entered only to be interrupted
    /// again before it executes anything (an entry path longer than the
    /// sampling period) stays at one PC without spinning, and yielding it
    /// for that would stop it for good.
    pub fn sample(&mut self, ran_ns: u64, pc: u64, evidence: CritEvidence, spin_ns: u64) -> bool {
        if evidence != CritEvidence::IrqsMasked {
            self.first = None;
            return false;
        }
        match &mut self.first {
            Some((ran, pc0)) if pc.abs_diff(*pc0) <= PC_WINDOW => {
                *ran = ran.saturating_add(ran_ns);
                if *ran >= spin_ns {
                    self.first = None;
                    return true;
                }
                false
            }
            _ => {
                self.first = Some((0, pc));
                false
            }
        }
    }

    /// The guest made progress (a trap), or the vCPU was switched out.
    pub fn reset(&mut self) {
        self.first = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PC: u64 = 0xffff_de93_187b_ed4c;
    const M: CritEvidence = CritEvidence::IrqsMasked;

    #[test]
    fn a_spin_at_one_place_with_irqs_masked_is_found_after_spin_ns_of_run_time() {
        let mut d = SpinDetector::new();
        assert!(!d.sample(SAMPLE_NS, PC, M, SPIN_NS));
        assert!(!d.sample(SAMPLE_NS, PC + 0x0c, M, SPIN_NS));
        assert!(d.sample(SPIN_NS - SAMPLE_NS, PC + 0x24, M, SPIN_NS));
        // It starts over after reporting.
        assert!(!d.sample(SAMPLE_NS, PC, M, SPIN_NS));
    }

    #[test]
    fn irqs_enabled_or_another_place_or_a_trap_starts_over() {
        let mut d = SpinDetector::new();
        d.sample(SPIN_NS, PC, M, SPIN_NS);
        assert!(!d.sample(SPIN_NS, PC, CritEvidence::None, SPIN_NS));
        assert!(!d.sample(SPIN_NS, PC, M, SPIN_NS));
        // Moved on: a new first sample, not a spin.
        assert!(!d.sample(SPIN_NS, PC + 4 * PC_WINDOW, M, SPIN_NS));
        d.reset();
        assert!(!d.sample(SPIN_NS, PC + 4 * PC_WINDOW, M, SPIN_NS));
        assert!(d.sample(SPIN_NS, PC + 4 * PC_WINDOW, M, SPIN_NS));
    }

    #[test]
    fn a_critical_watch_finds_the_spin_after_two_close_samples() {
        let w = Watch::Critical;
        assert!(w.sample_ns() < SAMPLE_NS && w.spin_ns() < SPIN_NS);
        assert_eq!((Watch::Preempted.sample_ns(), Watch::Preempted.spin_ns()), (SAMPLE_NS, SPIN_NS));
        let mut d = SpinDetector::new();
        assert!(!d.sample(w.sample_ns(), PC, M, w.spin_ns()));
        assert!(!d.sample(w.sample_ns(), PC + 8, M, w.spin_ns()));
        assert!(d.sample(w.sample_ns(), PC + 4, M, w.spin_ns()));
        // The same samples under the normal watch are not (yet) a spin.
        let mut d = SpinDetector::new();
        for _ in 0..3 {
            assert!(!d.sample(w.sample_ns(), PC, M, SPIN_NS));
        }
    }

    #[test]
    fn a_short_masked_section_is_not_a_spin() {
        let mut d = SpinDetector::new();
        assert!(!d.sample(SPIN_NS, PC, M, SPIN_NS));
        assert!(!d.sample(SPIN_NS - 1, PC, M, SPIN_NS));
    }

    /// A vCPU whose entries are interrupted before it executes anything
    /// (the sampling timer expiring during a long entry path) shows the
    /// same PC at every sample without running: never a spin, however
    /// many samples, so it is never yielded for it.
    #[test]
    fn samples_without_run_time_are_not_a_spin() {
        let mut d = SpinDetector::new();
        for _ in 0..100_000 {
            assert!(!d.sample(0, PC, M, CRIT_SPIN_NS));
        }
        // Once it runs, the spin is found after spin_ns of its own time.
        assert!(!d.sample(CRIT_SPIN_NS / 2, PC, M, CRIT_SPIN_NS));
        assert!(d.sample(CRIT_SPIN_NS / 2, PC, M, CRIT_SPIN_NS));
    }
}
