//! Register layouts that `aarch64-cpu` does not define (or defines only in
//! part), written in its style: tock-registers `register_bitfields!`.
//!
//! Plain Rust that builds on the host, so the pure configuration code
//! ([`crate::traps`], [`crate::stage2`]) and its tests use the same typed
//! fields as the EL2 code that writes them. The `mrs`/`msr` accessors for the
//! registers below live in `arch::aarch64::sysreg`; registers the crate
//! types completely (HCR_EL2, MDCR_EL2, VTCR_EL2, VTTBR_EL2, CNTHCTL_EL2,
//! ICH_HCR_EL2, ICH_VTR_EL2, ...) are used from `aarch64_cpu::registers`.
//!
//! Where the crate has the register but lacks a field we need, the missing
//! fields are defined here against the crate's own register type, so one
//! value can mix both (for example [`SCTLR_EL2_RES1`]).

use aarch64_cpu::registers::{
    ID_AA64MMFR0_EL1, ID_AA64MMFR1_EL1, ID_AA64PFR0_EL1, ID_AA64PFR1_EL1, SCTLR_EL1, SCTLR_EL2, TCR_EL2,
};
use tock_registers::fields::{Field, FieldValue};
use tock_registers::register_bitfields;

register_bitfields! {u64,
    /// Architectural Feature Trap Register (EL2), layout with HCR_EL2.E2H = 0
    /// (the crate defines only TAM).
    pub CPTR_EL2 [
        /// Trap CPACR_EL1 accesses.
        TCPAC OFFSET(31) NUMBITS(1) [],
        /// Trap Activity Monitor accesses (RES0 without FEAT_AMUv1).
        TAM OFFSET(30) NUMBITS(1) [],
        /// Trap trace System register accesses.
        TTA OFFSET(20) NUMBITS(1) [],
        /// Trap SME instructions and registers (RES1 without FEAT_SME).
        TSM OFFSET(12) NUMBITS(1) [],
        /// Trap FP/SIMD.
        TFP OFFSET(10) NUMBITS(1) [],
        /// Trap SVE instructions and registers (RES1 without FEAT_SVE).
        TZ OFFSET(8) NUMBITS(1) [],
        /// Bits 13, 9 and 7:0 are RES1 in this layout.
        RES1_13 OFFSET(13) NUMBITS(1) [],
        RES1_9 OFFSET(9) NUMBITS(1) [],
        RES1_0 OFFSET(0) NUMBITS(8) [Ones = 0xff]
    ],

    /// Virtualization Processor ID Register: the MIDR_EL1 a guest reads.
    pub VPIDR_EL2 [
        VALUE OFFSET(0) NUMBITS(32) []
    ],

    /// Extended Hypervisor Configuration Register (FEAT_HCX). Every field
    /// is an enable for a later feature (0: disabled or trapped); only the
    /// ones the hypervisor sets are named.
    pub HCRX_EL2 [
        /// FEAT_MOPS instructions usable at EL1 and EL0 (0: UNDEFINED).
        MSCEn OFFSET(11) NUMBITS(1) [],
        /// FEAT_MOPS exceptions from EL1 taken to EL2 (0: to EL1).
        MCE2 OFFSET(10) NUMBITS(1) []
    ],

    /// Virtual SError Exception Syndrome Register (FEAT_RAS): the ESR_EL1
    /// syndrome of a virtual SError the guest takes.
    pub VSESR_EL2 [
        /// IMPLEMENTATION DEFINED syndrome.
        IDS OFFSET(24) NUMBITS(1) [],
        ISS OFFSET(0) NUMBITS(24) []
    ],

    /// End of Interrupt Status: bit n = list register n holds an interrupt
    /// with EOI maintenance pending.
    pub ICH_EISR_EL2 [
        STATUS OFFSET(0) NUMBITS(16) []
    ],

    /// Empty List Register Status: bit n = list register n holds no
    /// interrupt (state 0).
    pub ICH_ELRSR_EL2 [
        STATUS OFFSET(0) NUMBITS(16) []
    ],

    /// Interrupt Controller Control Register (EL1), the CPU interface's
    /// writable view (the crate's is read-only).
    pub ICC_CTLR_EL1 [
        ExtRange OFFSET(19) NUMBITS(1) [],
        RSS OFFSET(18) NUMBITS(1) [],
        A3V OFFSET(15) NUMBITS(1) [],
        SEIS OFFSET(14) NUMBITS(1) [],
        IDbits OFFSET(11) NUMBITS(3) [],
        PRIbits OFFSET(8) NUMBITS(3) [],
        PMHE OFFSET(6) NUMBITS(1) [],
        /// 1: an EOIR write only drops priority; ICC_DIR_EL1 deactivates.
        EOImode OFFSET(1) NUMBITS(1) [
            DropAndDeactivate = 0,
            DropOnly = 1
        ],
        CBPR OFFSET(0) NUMBITS(1) []
    ],

    /// Interrupt Priority Mask Register.
    pub ICC_PMR_EL1 [
        Priority OFFSET(0) NUMBITS(8) []
    ],

    /// Binary Point Register for group 1.
    pub ICC_BPR1_EL1 [
        BinaryPoint OFFSET(0) NUMBITS(3) []
    ],

    /// Group 1 interrupt enable.
    pub ICC_IGRPEN1_EL1 [
        Enable OFFSET(0) NUMBITS(1) []
    ],

    /// ICC_IAR1_EL1, ICC_EOIR1_EL1 and ICC_DIR_EL1: an INTID.
    pub ICC_INTID [
        INTID OFFSET(0) NUMBITS(24) []
    ],

    /// Software Generated Interrupt group 1 Register.
    pub ICC_SGI1R_EL1 [
        Aff3 OFFSET(48) NUMBITS(8) [],
        /// Range selector: TargetList bit n means Aff0 = RS * 16 + n.
        RS OFFSET(44) NUMBITS(4) [],
        /// Interrupt Routing Mode: 1 = every PE but this one.
        IRM OFFSET(40) NUMBITS(1) [],
        Aff2 OFFSET(32) NUMBITS(8) [],
        INTID OFFSET(24) NUMBITS(4) [],
        Aff1 OFFSET(16) NUMBITS(8) [],
        TargetList OFFSET(0) NUMBITS(16) []
    ],

    /// Counter-timer Hypervisor Physical Timer CompareValue.
    pub CNTHP_CVAL_EL2 [
        VALUE OFFSET(0) NUMBITS(64) []
    ],

    /// Cache Type Register (the fields cache maintenance needs).
    pub CTR_EL0 [
        /// log2 of the smallest data cache line, in 4-byte words.
        DminLine OFFSET(16) NUMBITS(4) [],
        /// log2 of the smallest instruction cache line, in 4-byte words.
        IminLine OFFSET(0) NUMBITS(4) []
    ],

    /// Performance Monitors Control Register (FEAT_PMUv3).
    pub PMCR_EL0 [
        /// Number of event counters.
        N OFFSET(11) NUMBITS(5) [],
        /// Long cycle counter.
        LC OFFSET(6) NUMBITS(1) [],
        /// Enable all counters.
        E OFFSET(0) NUMBITS(1) []
    ],

    /// Performance Monitors User Enable Register (FEAT_PMUv3).
    pub PMUSERENR_EL0 [
        ER OFFSET(3) NUMBITS(1) [],
        CR OFFSET(2) NUMBITS(1) [],
        SW OFFSET(1) NUMBITS(1) [],
        EN OFFSET(0) NUMBITS(1) []
    ],

    /// AArch64 Instruction Set Attribute Register 2 (not in the crate).
    pub ID_AA64ISAR2_EL1 [
        /// FEAT_MOPS: CPYx/SETx memory copy and set instructions.
        MOPS OFFSET(16) NUMBITS(4) [],
        /// QARMA3 pointer authentication of addresses.
        APA3 OFFSET(12) NUMBITS(4) [],
        /// QARMA3 generic pointer authentication.
        GPA3 OFFSET(8) NUMBITS(4) [],
        /// WFET and WFIT.
        WFxT OFFSET(0) NUMBITS(4) []
    ],

    /// OS Lock Status Register (what a guest reads; the lock is emulated).
    pub OSLSR_EL1 [
        /// OS lock model, high bit (OSLM = 0b10: the OS lock is implemented).
        OSLM1 OFFSET(3) NUMBITS(1) [],
        /// Not trapped: always 0 in AArch64.
        nTT OFFSET(2) NUMBITS(1) [],
        /// The OS lock is locked.
        OSLK OFFSET(1) NUMBITS(1) [],
        /// OS lock model, low bit.
        OSLM0 OFFSET(0) NUMBITS(1) []
    ],

    /// ISS of a data or instruction abort (ESR_ELx.EC 0x20-0x25), the
    /// fields the hypervisor reads or injects.
    pub ISS_ABORT [
        /// The instruction syndrome (SAS, SSE, SRT, SF, AR) is valid.
        ISV OFFSET(24) NUMBITS(1) [],
        /// Fault on the stage-2 walk for a stage-1 translation.
        S1PTW OFFSET(7) NUMBITS(1) [],
        /// Write, not read.
        WnR OFFSET(6) NUMBITS(1) [],
        /// Data/Instruction Fault Status Code.
        FSC OFFSET(0) NUMBITS(6) [
            SyncExternalAbort = 0b01_0000
        ]
    ]
}

/// CPTR_EL2's RES1 bits (13, 9, 7:0) with HCR_EL2.E2H = 0.
pub fn cptr_el2_res1() -> FieldValue<u64, CPTR_EL2::Register> {
    CPTR_EL2::RES1_13::SET + CPTR_EL2::RES1_9::SET + CPTR_EL2::RES1_0::Ones
}

/// SCTLR_EL2 bits that are RES1 in ARMv8.0 and that the crate does not
/// name (29, 28, 23, 18, 16, 5, 4); EOS and EIS are set by name.
pub const SCTLR_EL2_RES1: FieldValue<u64, SCTLR_EL2::Register> =
    FieldValue::<u64, SCTLR_EL2::Register>::new(0x3085_0030, 0, 0x3085_0030);

/// TCR_EL2 bits 31 and 23, RES1 (with HCR_EL2.E2H = 0).
pub const TCR_EL2_RES1: FieldValue<u64, TCR_EL2::Register> =
    FieldValue::<u64, TCR_EL2::Register>::new(0x8080_0000, 0, 0x8080_0000);

/// SCTLR_EL1 at a vCPU's reset: the bits that are RES1 in ARMv8.0 (29, 28,
/// 23, 22, 20, 11), everything else (MMU, caches, alignment checks) off.
pub const SCTLR_EL1_RESET: FieldValue<u64, SCTLR_EL1::Register> =
    FieldValue::<u64, SCTLR_EL1::Register>::new(0x30d0_0800, 0, 0x30d0_0800);

/// ID_AA64PFR0_EL1.RAS (not named by the crate).
pub const ID_AA64PFR0_RAS: Field<u64, ID_AA64PFR0_EL1::Register> = Field::new(0xf, 28);

/// ID_AA64PFR0_EL1.EL3 (not named by the crate): 0 = EL3 not implemented.
pub const ID_AA64PFR0_EL3: Field<u64, ID_AA64PFR0_EL1::Register> = Field::new(0xf, 12);

/// ID_AA64MMFR0_EL1.FGT (not named by the crate): 1 = FEAT_FGT, 2 = FEAT_FGT2.
pub const ID_AA64MMFR0_FGT: Field<u64, ID_AA64MMFR0_EL1::Register> = Field::new(0xf, 56);

/// ID_AA64MMFR1_EL1.HCX (not named by the crate): FEAT_HCX, HCRX_EL2.
pub const ID_AA64MMFR1_HCX: Field<u64, ID_AA64MMFR1_EL1::Register> = Field::new(0xf, 40);

/// ID_AA64PFR1_EL1.SME (not named by the crate).
pub const ID_AA64PFR1_SME: Field<u64, ID_AA64PFR1_EL1::Register> = Field::new(0xf, 24);

#[cfg(test)]
mod tests {
    use super::*;
    use tock_registers::LocalRegisterCopy;

    #[test]
    fn res1_values_match_the_architecture() {
        assert_eq!(cptr_el2_res1().value, 0x0000_22ff);
        // SCTLR_EL2 RES1 plus EOS and EIS is the ARMv8.0 RES1 set.
        let sctlr = SCTLR_EL2_RES1 + SCTLR_EL2::EOS::IsSynch + SCTLR_EL2::EIS::IsSynch;
        assert_eq!(sctlr.value, 0x30c5_0830);
    }

    #[test]
    fn sgi1r_fields() {
        let v = ICC_SGI1R_EL1::Aff3.val(0x12)
            + ICC_SGI1R_EL1::Aff2.val(0x34)
            + ICC_SGI1R_EL1::Aff1.val(0x56)
            + ICC_SGI1R_EL1::RS.val(1)
            + ICC_SGI1R_EL1::INTID.val(7)
            + ICC_SGI1R_EL1::TargetList.val(1 << 3);
        assert_eq!(v.value, 0x0012_1034_0756_0008);
        let r = LocalRegisterCopy::<u64, ICC_SGI1R_EL1::Register>::new(v.value);
        assert_eq!(r.read(ICC_SGI1R_EL1::INTID), 7);
    }
}
