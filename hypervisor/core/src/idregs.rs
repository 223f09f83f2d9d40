//! The ID registers a guest sees (HCR_EL2.TID3 traps reads of the
//! op0=3, op1=0, CRn=0, CRm=1..7 space to EL2).
//!
//! Features whose state the hypervisor does not context-switch between vCPUs
//! are hidden, so an overcommitted guest never relies on registers another
//! vCPU may clobber: SVE and SME (the Z/P/ZA registers beyond V0-V31), MTE
//! (tag state), AMU and SPE/TRBE (counters and buffers the guest cannot own),
//! the PMU unless the VM has a vPMU (`crate::vpmu`), the trace unit (their
//! registers trap, see `crate::traps`), and
//! the GICv3 CPU interface's "system register" bit stays as is (the virtual
//! interface provides it). The debug feature register keeps only what
//! `crate::vdebug` provides: the debug architecture version and the
//! hardware's breakpoint/watchpoint counts (every one is switched per
//! vCPU), with the context-matching count and DoubleLock. Everything
//! else reads as the hardware's value, as KVM does for the features it
//! supports.
//!
//! Hiding the PMU of a VM without a vPMU matters beyond isolation: Linux's
//! early CPU setup writes PMUSERENR_EL0 (with the MMU off, before it has a
//! vector table) whenever ID_AA64DFR0_EL1.PMUVer says there is a PMU, and
//! that write would be UNDEFINED. With a vPMU it traps and is retried on the
//! loaded PMU.

/// The encoding of an ID register in the trapped space: CRm (1..=7), op2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdReg {
    pub crm: u8,
    pub op2: u8,
}

pub const ID_AA64PFR0_EL1: IdReg = IdReg { crm: 4, op2: 0 };
pub const ID_AA64PFR1_EL1: IdReg = IdReg { crm: 4, op2: 1 };
pub const ID_AA64ZFR0_EL1: IdReg = IdReg { crm: 4, op2: 4 };
pub const ID_AA64SMFR0_EL1: IdReg = IdReg { crm: 4, op2: 5 };
pub const ID_AA64DFR0_EL1: IdReg = IdReg { crm: 5, op2: 0 };
pub const ID_AA64ISAR1_EL1: IdReg = IdReg { crm: 6, op2: 1 };
pub const ID_AA64MMFR1_EL1: IdReg = IdReg { crm: 7, op2: 1 };
pub const ID_AA64MMFR3_EL1: IdReg = IdReg { crm: 7, op2: 3 };
pub const ID_AA64DFR1_EL1: IdReg = IdReg { crm: 5, op2: 1 };
/// AArch32 debug feature registers (what an AArch32 EL0 would be told).
pub const ID_DFR0_EL1: IdReg = IdReg { crm: 1, op2: 2 };
pub const ID_DFR1_EL1: IdReg = IdReg { crm: 3, op2: 5 };

const fn field(shift: u32) -> u64 {
    0xf << shift
}

/// The guest-visible value of ID register `reg` whose hardware value is `hw`,
/// for a VM with a virtual PMU (`vpmu`) or without.
pub fn sanitize(reg: IdReg, hw: u64, vpmu: bool) -> u64 {
    match reg {
        // SVE [35:32], AMU [47:44].
        ID_AA64PFR0_EL1 => hw & !(field(32) | field(44)),
        // MTE [11:8], SME [27:24], MTE_frac [43:40], GCS [47:44] (its
        // registers trap: `crate::traps::extended_controls`).
        ID_AA64PFR1_EL1 => hw & !(field(8) | field(24) | field(40) | field(44)),
        // LS64 [63:60]: its instructions and ACCDATA_EL1 are disabled
        // (HCRX_EL2, fine-grained traps).
        ID_AA64ISAR1_EL1 => hw & !field(60),
        // LO [19:16]: LORegions registers trap (HCR_EL2.TLOR).
        ID_AA64MMFR1_EL1 => hw & !field(16),
        // TCRX, SCTLRX, S1PIE, S2PIE, S1POE, S2POE, AIE [27:0] and D128
        // [35:32]: their EL1 registers are neither switched nor enabled
        // (HCRX_EL2 enables off, fine-grained n-bits clear).
        ID_AA64MMFR3_EL1 => hw & !(0x0fff_ffff | field(32)),
        ID_AA64ZFR0_EL1 | ID_AA64SMFR0_EL1 => 0,
        // Keep DebugVer [3:0], BRPs [15:12], WRPs [23:20], CTX_CMPs [31:28]
        // and DoubleLock [39:36], and PMUVer [11:8] (at most what the vPMU
        // switches) with a vPMU; zero the other PMU fields (MTPMU, PMSS,
        // HPMN0, SEBEP), trace (TraceVer, TraceFilt, TraceBuffer,
        // ExtTrcBuff), SPE and BRBE fields and anything newer.
        ID_AA64DFR0_EL1 => {
            let pmuver = if vpmu { crate::vpmu::guest_pmuver(((hw >> 8) & 0xf) as u8) } else { 0 };
            hw & (field(0) | field(12) | field(20) | field(28) | field(36)) | u64::from(pmuver) << 8
        }
        // Extended breakpoint counts and PMU/SPMU features: none.
        ID_AA64DFR1_EL1 | ID_DFR1_EL1 => 0,
        // AArch32: keep CopDbg, CopSDbg, MMapDbg [11:0]; no trace, no PMU.
        ID_DFR0_EL1 => hw & (field(0) | field(4) | field(8)),
        _ => hw,
    }
}

/// Whether (op0, op1, CRn, CRm) falls in the TID3-trapped ID space.
pub fn is_id_space(op0: u8, op1: u8, crn: u8, crm: u8) -> bool {
    op0 == 3 && op1 == 0 && crn == 0 && (1..=7).contains(&crm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_sve_sme_mte() {
        // A PFR0 with FP, AdvSIMD, GIC, SVE and AMU.
        let pfr0 = 0x0000_1101_1001_1011u64 | (1 << 32) | (1 << 44);
        let g = sanitize(ID_AA64PFR0_EL1, pfr0, false);
        assert_eq!((g >> 32) & 0xf, 0);
        assert_eq!((g >> 44) & 0xf, 0);
        assert_eq!((g >> 24) & 0xf, (pfr0 >> 24) & 0xf, "GIC field kept");
        let pfr1 = (1 << 24) | (2 << 8) | (1 << 44) | 0x1;
        assert_eq!(sanitize(ID_AA64PFR1_EL1, pfr1, false), 0x1, "SME, MTE, GCS hidden");
        assert_eq!(sanitize(ID_AA64ZFR0_EL1, u64::MAX, false), 0);
        assert_eq!(sanitize(IdReg { crm: 6, op2: 0 }, 0x1234, false), 0x1234);
    }

    #[test]
    fn hides_pmu_trace_spe_keeps_breakpoints() {
        // QEMU 7.2 `max`: DebugVer 6 (v8.0 debug), PMUVer 6 (PMUv3p5), BRPs 5,
        // WRPs 3, CTX_CMPs 1; plus made-up SPE, TraceFilt, TRBE, BRBE bits.
        let dfr0 = 0x0000_0000_1030_5606u64 | (1 << 32) | (1 << 40) | (1 << 44) | (1 << 52) | (1 << 4);
        let g = sanitize(ID_AA64DFR0_EL1, dfr0, false);
        assert_eq!((g >> 8) & 0xf, 0, "PMUVer hidden");
        assert_eq!(g, 0x0000_0000_1030_5006, "debug version and breakpoint counts kept, nothing else");
        assert_eq!(sanitize(ID_AA64DFR1_EL1, u64::MAX, false), 0);
        // AArch32 PerfMon [27:24] and trace fields hidden.
        assert_eq!(sanitize(ID_DFR0_EL1, 0x0300_6666, false), 0x0000_0666);
        // With a vPMU: PMUVer shown, capped at PMUv3p5; the other PMU
        // fields (MTPMU [51:48]) still hidden.
        assert_eq!(sanitize(ID_AA64DFR0_EL1, dfr0, true), 0x0000_0000_1030_5606);
        assert_eq!(sanitize(ID_AA64DFR0_EL1, 0x0000_0000_0000_0806 | (1 << 48), true), 0x0606);
        assert_eq!(sanitize(ID_AA64DFR0_EL1, 0x0000_0000_0000_0406, true), 0x0406, "PMUv3p1 as it is");
        assert_eq!(sanitize(ID_AA64DFR0_EL1, 0x0f06, true), 0x0006, "IMPLEMENTATION DEFINED PMU: none");
        assert_eq!(sanitize(ID_DFR0_EL1, 0x0300_6666, true), 0x0000_0666, "no AArch32 PMU");
    }

    #[test]
    fn hides_trapped_later_features() {
        // LO hidden (TLOR traps), PAN [23:20] and VH [11:8] kept.
        assert_eq!(sanitize(ID_AA64MMFR1_EL1, 0x0031_1100 | (1 << 16), false), 0x0031_1100 & !field(16));
        // LS64 hidden, pointer authentication [11:4] kept.
        assert_eq!(sanitize(ID_AA64ISAR1_EL1, (1 << 60) | 0x0100_0050, false), 0x0100_0050);
        // TCR2/SCTLR2/PIE/POE/AIE/D128 hidden; MEC [31:28] and Spec_FPACC
        // [63:60] kept.
        assert_eq!(sanitize(ID_AA64MMFR3_EL1, (1 << 60) | 0x1_1111_1111, false), (1 << 60) | (1 << 28));
    }

    #[test]
    fn id_space() {
        assert!(is_id_space(3, 0, 0, 4));
        assert!(!is_id_space(3, 0, 0, 0)); // MIDR/MPIDR live at CRm=0
        assert!(!is_id_space(3, 1, 0, 4));
        assert!(!is_id_space(3, 0, 1, 4));
    }
}
