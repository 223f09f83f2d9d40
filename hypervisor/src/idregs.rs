//! The ID registers a guest sees (HCR_EL2.TID3 traps reads of the
//! op0=3, op1=0, CRn=0, CRm=1..7 space to EL2).
//!
//! Features whose state the hypervisor does not context-switch between vCPUs
//! are hidden, so an overcommitted guest never relies on registers another
//! vCPU may clobber: SVE and SME (the Z/P/ZA registers beyond V0-V31), MTE
//! (tag state), AMU and SPE/TRBE (counters and buffers the guest cannot own),
//! and the GICv3 CPU interface's "system register" bit stays as is (the
//! virtual interface provides it). Everything else reads as the hardware's
//! value, as KVM does for the features it supports.

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

const fn field(shift: u32) -> u64 {
    0xf << shift
}

/// The guest-visible value of ID register `reg` whose hardware value is `hw`.
pub fn sanitize(reg: IdReg, hw: u64) -> u64 {
    match reg {
        // SVE [35:32], AMU [47:44].
        ID_AA64PFR0_EL1 => hw & !(field(32) | field(44)),
        // MTE [11:8], SME [27:24], MTE_frac [43:40].
        ID_AA64PFR1_EL1 => hw & !(field(8) | field(24) | field(40)),
        ID_AA64ZFR0_EL1 | ID_AA64SMFR0_EL1 => 0,
        // PMSVer (SPE) [35:32], TraceBuffer (TRBE) [47:44].
        ID_AA64DFR0_EL1 => hw & !(field(32) | field(44)),
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
        let g = sanitize(ID_AA64PFR0_EL1, pfr0);
        assert_eq!((g >> 32) & 0xf, 0);
        assert_eq!((g >> 44) & 0xf, 0);
        assert_eq!((g >> 24) & 0xf, (pfr0 >> 24) & 0xf, "GIC field kept");
        let pfr1 = (1 << 24) | (2 << 8) | 0x1;
        assert_eq!(sanitize(ID_AA64PFR1_EL1, pfr1), 0x1);
        assert_eq!(sanitize(ID_AA64ZFR0_EL1, u64::MAX), 0);
        assert_eq!(sanitize(IdReg { crm: 6, op2: 0 }, 0x1234), 0x1234);
    }

    #[test]
    fn id_space() {
        assert!(is_id_space(3, 0, 0, 4));
        assert!(!is_id_space(3, 0, 0, 0)); // MIDR/MPIDR live at CRm=0
        assert!(!is_id_space(3, 1, 0, 4));
        assert!(!is_id_space(3, 0, 1, 4));
    }
}
