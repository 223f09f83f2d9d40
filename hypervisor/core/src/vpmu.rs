//! The virtual PMU (PMUv3): the CPU's own counters, given to the vCPU that
//! runs and switched with it, lazily.
//!
//! A vCPU owns the whole PMU while it runs: MDCR_EL2.HPMN is PMCR_EL0.N,
//! so every event counter and the cycle counter are the guest's, and EL2
//! never counts (MDCR_EL2.HPMD, and HCCD where FEAT_PMUv3p5 has it), so the
//! guest's counts exclude the hypervisor's own work. The host's implemented
//! events reach the guest unchanged through PMCEID0/1_EL0.
//!
//! Switching ~70 registers on every vCPU switch would tax every guest for
//! the few that profile, so the state moves lazily: a vCPU runs with
//! MDCR_EL2.TPM/TPMCR set until its first PMU access, which traps; the
//! trap loads its saved registers, clears the traps, and the instruction
//! runs again on the real PMU ([`Placement::Loaded`]). When the vCPU is
//! switched out its registers are saved and the hardware is quiesced
//! (nothing counts, no overflow line). It comes back loaded only if it was
//! counting or its overflow line was high ([`PmuRegs::keep_loaded`]);
//! otherwise it traps again on its next access. Linux's PMU driver touches
//! the PMU at boot and then only while `perf` counts, so an idle guest pays
//! one trap per switch-in at most, and usually none.
//!
//! The overflow interrupt is a level PPI forwarded like the virtual timer:
//! the physical PPI is injected as a HW interrupt into the running vCPU,
//! and the line a saved vCPU would drive ([`PmuRegs::line`]) resamples its
//! virtual pending state at switch-in.
//!
//! A CPU whose PMU lacks FEAT_PMUv3p1 (no MDCR_EL2.HPMD, so the guest
//! could count EL2) gets no vPMU ([`supported`]); neither does a VM when
//! the `vpmu=off` option is given or the platform names no PMU interrupt.

use crate::esr::SysRegAccess;
use crate::traps::Pmu;

/// The most event counters PMUv3 has (PMCR_EL0.N ≤ 31).
pub const MAX_COUNTERS: usize = 31;

/// PMCR_EL0.E: counters enabled (the event counters below HPMN and the
/// cycle counter).
const PMCR_E: u64 = 1;
/// The PMCR_EL0 bits a guest's value keeps across a switch: E, D, X, DP,
/// LC, LP (P and C are write-only actions, N is read-only).
const PMCR_STATE: u64 = PMCR_E | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7);

/// The highest PMUv3 version guests are told of: FEAT_PMUv3p5 (ID_AA64DFR0_EL1.PMUVer
/// 6). Later versions add registers this module does not switch
/// (PMICNTR_EL0, PMUACR_EL1, ...).
pub const MAX_GUEST_PMUVER: u8 = 6;

/// Whether this CPU's PMU can be given to guests: PMUv3p1 or later, so EL2
/// counting can be prohibited.
pub fn supported(pmu: Option<Pmu>) -> bool {
    pmu.is_some_and(|p| p.has_hpmd())
}

/// The PMUVer a guest reads in ID_AA64DFR0_EL1, for the hardware's `hw`
/// (0 = no PMU).
pub fn guest_pmuver(hw: u8) -> u8 {
    if hw == 0 || hw == 0xf {
        0
    } else {
        hw.min(MAX_GUEST_PMUVER)
    }
}

/// Whether a trapped system-register access names a PMU register
/// (MDCR_EL2.TPM and TPMCR trap exactly these from EL0 and EL1).
pub fn is_pmu_reg(s: &SysRegAccess) -> bool {
    if s.op0 != 3 {
        return false;
    }
    match (s.op1, s.crn, s.crm) {
        // PMCR, PMCNTENSET/CLR, PMOVSCLR, PMSWINC, PMSELR, PMCEID0/1 (c12);
        // PMCCNTR, PMXEVTYPER, PMXEVCNTR (c13); PMUSERENR, PMOVSSET (c14).
        (3, 9, 12..=14) => true,
        // PMINTENSET_EL1, PMINTENCLR_EL1, PMMIR_EL1.
        (0, 9, 14) => matches!(s.op2, 1 | 2 | 6),
        // PMEVCNTR<n>_EL0 (c8-c11), PMEVTYPER<n>_EL0 and PMCCFILTR_EL0
        // (c12-c15).
        (3, 14, 8..=15) => true,
        _ => false,
    }
}

/// A vCPU's PMU registers while it is not on a CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PmuRegs {
    /// PMCR_EL0's state bits (`PMCR_STATE`).
    pub pmcr: u64,
    pub pmselr: u64,
    pub pmcnten: u64,
    pub pminten: u64,
    pub pmovs: u64,
    pub pmuserenr: u64,
    pub pmccfiltr: u64,
    pub pmccntr: u64,
    pub evcntr: [u64; MAX_COUNTERS],
    pub evtyper: [u64; MAX_COUNTERS],
}

impl Default for PmuRegs {
    /// The architectural reset values that matter: everything disabled,
    /// nothing pending (the counters' values are UNKNOWN at reset; zero).
    fn default() -> Self {
        Self {
            pmcr: 0,
            pmselr: 0,
            pmcnten: 0,
            pminten: 0,
            pmovs: 0,
            pmuserenr: 0,
            pmccfiltr: 0,
            pmccntr: 0,
            evcntr: [0; MAX_COUNTERS],
            evtyper: [0; MAX_COUNTERS],
        }
    }
}

/// The bit of the cycle counter in PMCNTEN/PMINTEN/PMOVS.
const CYCLE_BIT: u64 = 1 << 31;

/// The PMCNTEN/PMINTEN/PMOVS bits that exist with `counters` event
/// counters: bits 0..counters and the cycle counter's.
pub fn counter_mask(counters: u8) -> u64 {
    let n = u32::from(counters).min(MAX_COUNTERS as u32);
    ((1u64 << n) - 1) | CYCLE_BIT
}

/// The overflow interrupt request of PMCR_EL0, PMINTENSET and PMOVSSET
/// values: see [`PmuRegs::line`].
pub fn overflow_line(pmcr: u64, pminten: u64, pmovs: u64) -> bool {
    pmcr & PMCR_E != 0 && pmovs & pminten != 0
}

impl PmuRegs {
    /// Keeps only what a PMCR_EL0 write leaves in the register.
    pub fn pmcr_state(pmcr: u64) -> u64 {
        pmcr & PMCR_STATE
    }

    /// The overflow interrupt request this state drives: an enabled
    /// counter's overflow with its interrupt enabled, while PMCR_EL0.E is
    /// set (every counter is below HPMN, so E governs them all).
    pub fn line(&self) -> bool {
        overflow_line(self.pmcr, self.pminten, self.pmovs)
    }

    /// Whether the vCPU counts: PMCR_EL0.E with some counter enabled.
    pub fn counting(&self) -> bool {
        self.pmcr & PMCR_E != 0 && self.pmcnten != 0
    }

    /// Whether the vCPU's registers go back on the PMU at its next
    /// switch-in without waiting for a trap: it counts (the counts must go
    /// on) or its overflow line is high (the interrupt must reach it).
    pub fn keep_loaded(&self) -> bool {
        self.counting() || self.line()
    }
}

/// Where a vCPU's PMU registers are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// In [`VPmu::regs`]; its PMU accesses trap.
    #[default]
    Saved,
    /// On the PMU of the CPU it runs on; its accesses reach it directly.
    Loaded,
}

/// One vCPU's virtual PMU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VPmu {
    pub regs: PmuRegs,
    pub placement: Placement,
}

/// What to do with a trapped PMU access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrapAction {
    /// Load the saved registers, stop trapping, and run the instruction
    /// again (the PC does not move).
    LoadAndRetry,
    /// The VM has no vPMU, or the access trapped although the registers
    /// are loaded (traps were not lifted): UNDEFINED.
    Undefined,
}

impl VPmu {
    /// The answer to a trapped PMU access of a VM whose vPMU is `enabled`.
    pub fn on_trap(&mut self, enabled: bool) -> TrapAction {
        if !enabled || self.placement == Placement::Loaded {
            return TrapAction::Undefined;
        }
        self.placement = Placement::Loaded;
        TrapAction::LoadAndRetry
    }

    /// At switch-out, after the registers were saved into `regs`: whether
    /// they return at switch-in (see [`PmuRegs::keep_loaded`]).
    pub fn on_save(&mut self) -> Placement {
        self.placement = if self.regs.keep_loaded() { Placement::Loaded } else { Placement::Saved };
        self.placement
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acc(op0: u8, op1: u8, crn: u8, crm: u8, op2: u8) -> SysRegAccess {
        SysRegAccess { op0, op1, crn, crm, op2, reg: 0, read: true }
    }

    #[test]
    fn pmu_registers_are_recognised() {
        let pmu = [
            (3, 3, 9, 12, 0),  // PMCR_EL0
            (3, 3, 9, 12, 1),  // PMCNTENSET_EL0
            (3, 3, 9, 12, 2),  // PMCNTENCLR_EL0
            (3, 3, 9, 12, 3),  // PMOVSCLR_EL0
            (3, 3, 9, 12, 4),  // PMSWINC_EL0
            (3, 3, 9, 12, 5),  // PMSELR_EL0
            (3, 3, 9, 12, 6),  // PMCEID0_EL0
            (3, 3, 9, 12, 7),  // PMCEID1_EL0
            (3, 3, 9, 13, 0),  // PMCCNTR_EL0
            (3, 3, 9, 13, 1),  // PMXEVTYPER_EL0
            (3, 3, 9, 13, 2),  // PMXEVCNTR_EL0
            (3, 3, 9, 14, 0),  // PMUSERENR_EL0
            (3, 3, 9, 14, 3),  // PMOVSSET_EL0
            (3, 0, 9, 14, 1),  // PMINTENSET_EL1
            (3, 0, 9, 14, 2),  // PMINTENCLR_EL1
            (3, 0, 9, 14, 6),  // PMMIR_EL1
            (3, 3, 14, 8, 0),  // PMEVCNTR0_EL0
            (3, 3, 14, 11, 6), // PMEVCNTR30_EL0
            (3, 3, 14, 12, 0), // PMEVTYPER0_EL0
            (3, 3, 14, 15, 7), // PMCCFILTR_EL0
        ];
        for (op0, op1, crn, crm, op2) in pmu {
            assert!(is_pmu_reg(&acc(op0, op1, crn, crm, op2)), "{:?}", (op0, op1, crn, crm, op2));
        }
        let other = [
            (3, 0, 9, 14, 4), // PMUACR_EL1 (PMUv3p9: not offered)
            (3, 0, 9, 9, 0),  // PMSCR_EL1 (SPE)
            (3, 3, 14, 0, 2), // CNTVCT_EL0
            (3, 3, 14, 3, 1), // CNTV_CTL_EL0
            (3, 3, 14, 2, 1), // CNTP_CTL_EL0
            (2, 0, 0, 2, 2),  // MDSCR_EL1
            (3, 0, 12, 11, 5),
        ];
        for (op0, op1, crn, crm, op2) in other {
            assert!(!is_pmu_reg(&acc(op0, op1, crn, crm, op2)), "{:?}", (op0, op1, crn, crm, op2));
        }
    }

    #[test]
    fn only_pmuv3p1_and_later_is_offered() {
        assert!(!supported(None));
        assert!(!supported(Some(Pmu { version: 1, counters: 6 })), "PMUv3: EL2 would count");
        assert!(supported(Some(Pmu { version: 4, counters: 6 })), "PMUv3p1 (Graviton2)");
        assert!(supported(Some(Pmu { version: 6, counters: 6 })));
        assert_eq!(guest_pmuver(0), 0);
        assert_eq!(guest_pmuver(0xf), 0, "IMPLEMENTATION DEFINED is no PMUv3");
        assert_eq!(guest_pmuver(4), 4);
        assert_eq!(guest_pmuver(8), MAX_GUEST_PMUVER, "capped at what is switched");
    }

    #[test]
    fn the_overflow_line_follows_enable_interrupt_and_flag() {
        let mut r = PmuRegs { pmovs: 1, pminten: 1, ..PmuRegs::default() };
        assert!(!r.line(), "PMCR_EL0.E clear: no request");
        r.pmcr = PMCR_E;
        assert!(r.line());
        r.pminten = CYCLE_BIT;
        assert!(!r.line(), "counter 0's interrupt disabled");
        r.pmovs |= CYCLE_BIT;
        assert!(r.line(), "the cycle counter overflowed");
        r.pmovs = 0;
        assert!(!r.line(), "the guest cleared the flags");
    }

    #[test]
    fn only_a_counting_or_interrupting_vcpu_stays_loaded() {
        let mut v = VPmu::default();
        assert_eq!(v.on_trap(false), TrapAction::Undefined, "no vPMU: UNDEFINED");
        assert_eq!(v.on_trap(true), TrapAction::LoadAndRetry);
        assert_eq!(v.placement, Placement::Loaded);
        assert_eq!(v.on_trap(true), TrapAction::Undefined, "a trap while loaded is not retried forever");
        // Linux's probe: everything reset, nothing counting.
        v.regs = PmuRegs::default();
        assert_eq!(v.on_save(), Placement::Saved);
        assert_eq!(v.on_trap(true), TrapAction::LoadAndRetry);
        // perf stat: the cycle counter enabled.
        v.regs.pmcr = PMCR_E;
        v.regs.pmcnten = CYCLE_BIT;
        assert_eq!(v.on_save(), Placement::Loaded);
        // Stopped, but its overflow interrupt not yet handled.
        v.regs.pmcnten = 0;
        v.regs.pmovs = 1;
        v.regs.pminten = 1;
        assert_eq!(v.on_save(), Placement::Loaded);
        v.regs.pmovs = 0;
        assert_eq!(v.on_save(), Placement::Saved);
    }

    #[test]
    fn pmcr_keeps_state_not_actions() {
        // P (1) and C (2) reset counters; N [15:11] is read-only.
        assert_eq!(PmuRegs::pmcr_state(0x3000 | 0b111 | (1 << 6)), 1 | (1 << 6));
        assert_eq!(counter_mask(6), 0x8000_003f);
        assert_eq!(counter_mask(0), CYCLE_BIT);
        assert_eq!(counter_mask(31), 0xffff_ffff);
    }
}
