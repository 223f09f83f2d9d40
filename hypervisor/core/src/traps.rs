//! The EL2 trap configuration for guests, as a pure function of what the CPU
//! implements, and the per-vCPU virtual SError.
//!
//! The rule: a guest reaches a piece of CPU state directly only if the
//! hypervisor switches it between vCPUs (or it is the guest's alone).
//! Everything else traps to EL2, and the ID registers the guest reads
//! ([`crate::idregs`]) say the feature is absent, so a well-behaved guest
//! never touches it and a hostile one gets an UNDEFINED exception:
//!
//! | state | switched? | trap | guest sees |
//! |---|---|---|---|
//! | FP/SIMD V0-V31 | yes | none | FP, AdvSIMD |
//! | SVE Z/P/FFR, ZCR | no | CPTR_EL2.TZ | no SVE |
//! | SME ZA/ZT0, SMCR | no | CPTR_EL2.TSM | no SME |
//! | activity monitors | no | CPTR_EL2.TAM | no AMU |
//! | trace unit (sysregs, TRFCR, TRBE) | no | CPTR_EL2.TTA, MDCR_EL2.TTRF, E2TB | no trace |
//! | PMU counters, PMCR | with a vPMU, lazily ([`crate::vpmu`]) | MDCR_EL2.TPM, TPMCR until the vCPU's first access; counting at EL2 prohibited (HPMD, HCCD) | PMUv3 with all counters, or (`vpmu=off`, PMUv3 without p1) no PMU |
//! | statistical profiling (SPE) | no | MDCR_EL2.TPMS, E2PB | no SPE |
//! | breakpoints, watchpoints, MDSCR_EL1 | yes, lazily ([`crate::vdebug`]) | MDCR_EL2.TDA until the vCPU's first access, then clear for it | the hardware's BRPs/WRPs |
//! | other debug registers (DCC, OSECCR, claim tags), OS lock, MDRAR | no (OS lock emulated per vCPU) | MDCR_EL2.TDA (not while the vCPU owns the breakpoints: then the hardware's), TDOSA, TDRA | read as zero, writes ignored ([`crate::vdebug`]) |
//! | EL1 physical timer | emulated per vCPU | CNTHCTL_EL2.EL1PCEN = 0 (CNTPCT_EL0 not trapped) | CNTP_* ([`crate::ptimer::PhysTimer`]), its PPI a level |
//! | ID registers | - | HCR_EL2.TID3 | sanitized values |
//! | ACTLR_EL1 (IMPLEMENTATION DEFINED controls) | no | HCR_EL2.TACR | the host's value; writes ignored |
//! | IMPLEMENTATION DEFINED registers (CRn 11, 15) | no | HCR_EL2.TIDCP | UNDEFINED |
//! | RAS error records (ERRIDR, ERRSELR, ERX*) | no | HCR_EL2.TERR | read as zero, writes ignored |
//! | DISR_EL1 | yes, as VDISR_EL2 | none (HCR_EL2.AMO redirects it) | its own deferred virtual SErrors |
//! | LORegions (LORSA/LOREA/LORN/LORC/LORID) | no | HCR_EL2.TLOR | no LOR |
//! | SME TPIDR2_EL0, SMPRI_EL1 | no | HFGRTR/HFGWTR_EL2 nTPIDR2_EL0, nSMPRI_EL1 = 0 | no SME |
//! | registers of later features (PIE, POE, GCS, LS64, THE, AIE, BRBE ...) | no | their FGT n-bits = 0; HCRX_EL2 enables = 0 | absent |
//!
//! Without a vPMU the PMU is what KVM makes it for a guest without one (no
//! PMU in the ID registers, accesses UNDEFINED); the breakpoint and watchpoint
//! registers are switched the way KVM does, lazily: only for a vCPU that
//! has used them, which runs with MDCR_EL2.TDA clear ([`crate::vdebug`]).
//! TDA has no finer grain, so such a vCPU also reaches the debug
//! communications channel and claim tags, which are not switched: the one
//! exception to the rule, with no effect on how another vCPU runs.

use crate::regs::{
    cptr_el2_res1, CPTR_EL2, ID_AA64ISAR2_EL1, ID_AA64MMFR0_FGT, ID_AA64MMFR1_HCX, ID_AA64PFR0_RAS, ID_AA64PFR1_SME,
};
use aarch64_cpu::registers::{
    CNTHCTL_EL2, HCR_EL2, ID_AA64DFR0_EL1, ID_AA64ISAR1_EL1, ID_AA64MMFR0_EL1, ID_AA64MMFR1_EL1, ID_AA64PFR0_EL1,
    MDCR_EL2,
};
use tock_registers::LocalRegisterCopy;

pub type Hcr = LocalRegisterCopy<u64, HCR_EL2::Register>;
pub type Cptr = LocalRegisterCopy<u64, CPTR_EL2::Register>;
pub type Mdcr = LocalRegisterCopy<u64, MDCR_EL2::Register>;
pub type Cnthctl = LocalRegisterCopy<u64, CNTHCTL_EL2::Register>;

/// ID register values read at EL2 (the hardware's, not a guest's view).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdRegs {
    pub pfr0: u64,
    pub pfr1: u64,
    pub dfr0: u64,
    pub isar1: u64,
    pub isar2: u64,
    pub mmfr0: u64,
    pub mmfr1: u64,
    /// PMCR_EL0, read only when [`pmu_version`] says there is a PMUv3
    /// (the register is UNDEFINED otherwise).
    pub pmcr: Option<u64>,
}

/// The CPU's PMUv3 version (ID_AA64DFR0_EL1.PMUVer), or `None` when there
/// is no architected PMU (0: none, 0xf: IMPLEMENTATION DEFINED).
pub fn pmu_version(dfr0: u64) -> Option<u8> {
    let v = LocalRegisterCopy::<u64, ID_AA64DFR0_EL1::Register>::new(dfr0).read(ID_AA64DFR0_EL1::PMUVer) as u8;
    (v != 0 && v != 0xf).then_some(v)
}

/// The PMUv3 of a CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pmu {
    /// ID_AA64DFR0_EL1.PMUVer (1 = PMUv3, 4 = v3p1, 6 = v3p5, ...).
    pub version: u8,
    /// PMCR_EL0.N, the number of event counters.
    pub counters: u8,
}

impl Pmu {
    /// FEAT_PMUv3p1: MDCR_EL2.HPMD exists.
    pub fn has_hpmd(&self) -> bool {
        self.version >= 4
    }
    /// FEAT_PMUv3p5: MDCR_EL2.HCCD exists.
    pub fn has_hccd(&self) -> bool {
        self.version >= 6
    }
}

/// What the CPU implements, as far as the trap configuration cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    /// Pointer authentication (any algorithm).
    pub pauth: bool,
    pub sve: bool,
    pub sme: bool,
    /// FEAT_AMUv1 (activity monitors).
    pub amu: bool,
    /// FEAT_RAS: VSESR_EL2 gives a virtual SError its syndrome.
    pub ras: bool,
    pub pmu: Option<Pmu>,
    /// FEAT_SPE (statistical profiling).
    pub spe: bool,
    /// FEAT_TRF (trace filter control, TRFCR_EL1).
    pub trf: bool,
    /// FEAT_FGT: HFGRTR/HFGWTR/HFGITR/HDFGRTR/HDFGWTR_EL2 exist.
    pub fgt: bool,
    /// FEAT_HCX: HCRX_EL2 exists.
    pub hcx: bool,
    /// FEAT_MOPS (memory copy and set instructions).
    pub mops: bool,
    /// FEAT_LOR (limited ordering regions).
    pub lor: bool,
    /// EL3 is implemented (firmware runs beneath the hypervisor).
    pub el3: bool,
}

impl CpuFeatures {
    /// Decodes the ID registers.
    pub fn from_id_regs(ids: &IdRegs) -> Self {
        let pfr0 = LocalRegisterCopy::<u64, ID_AA64PFR0_EL1::Register>::new(ids.pfr0);
        let pfr1 = LocalRegisterCopy::<u64, aarch64_cpu::registers::ID_AA64PFR1_EL1::Register>::new(ids.pfr1);
        let dfr0 = LocalRegisterCopy::<u64, ID_AA64DFR0_EL1::Register>::new(ids.dfr0);
        let isar1 = LocalRegisterCopy::<u64, ID_AA64ISAR1_EL1::Register>::new(ids.isar1);
        let isar2 = LocalRegisterCopy::<u64, ID_AA64ISAR2_EL1::Register>::new(ids.isar2);
        let mmfr0 = LocalRegisterCopy::<u64, ID_AA64MMFR0_EL1::Register>::new(ids.mmfr0);
        let mmfr1 = LocalRegisterCopy::<u64, ID_AA64MMFR1_EL1::Register>::new(ids.mmfr1);
        let pauth = [ID_AA64ISAR1_EL1::APA, ID_AA64ISAR1_EL1::API, ID_AA64ISAR1_EL1::GPA, ID_AA64ISAR1_EL1::GPI]
            .iter()
            .any(|&f| isar1.read(f) != 0)
            || isar2.read(ID_AA64ISAR2_EL1::APA3) != 0
            || isar2.read(ID_AA64ISAR2_EL1::GPA3) != 0;
        let pmu = match (pmu_version(ids.dfr0), ids.pmcr) {
            (Some(version), Some(pmcr)) => {
                let n =
                    LocalRegisterCopy::<u64, crate::regs::PMCR_EL0::Register>::new(pmcr).read(crate::regs::PMCR_EL0::N);
                Some(Pmu { version, counters: n as u8 })
            }
            _ => None,
        };
        Self {
            pauth,
            sve: pfr0.read(ID_AA64PFR0_EL1::SVE) != 0,
            sme: pfr1.read(ID_AA64PFR1_SME) != 0,
            amu: pfr0.read(ID_AA64PFR0_EL1::AMU) != 0,
            ras: pfr0.read(ID_AA64PFR0_RAS) != 0,
            pmu,
            spe: dfr0.read(ID_AA64DFR0_EL1::PMSVer) != 0,
            trf: dfr0.read(ID_AA64DFR0_EL1::TraceFilt) != 0,
            fgt: mmfr0.read(ID_AA64MMFR0_FGT) != 0,
            hcx: mmfr1.read(ID_AA64MMFR1_HCX) != 0,
            mops: isar2.read(ID_AA64ISAR2_EL1::MOPS) != 0,
            lor: mmfr1.read(ID_AA64MMFR1_EL1::LO) != 0,
            el3: pfr0.read(crate::regs::ID_AA64PFR0_EL3) != 0,
        }
    }
}

/// The EL2 controls a pCPU runs guests with.
#[derive(Clone, Copy, Debug)]
pub struct GuestTraps {
    pub hcr: Hcr,
    pub cptr: Cptr,
    pub mdcr: Mdcr,
    pub cnthctl: Cnthctl,
}

/// The trap configuration for running guests on a CPU with `cpu`'s
/// features. `trap_wfe`: vCPUs outnumber pCPUs, so a vCPU spinning in WFE
/// should give its pCPU away.
pub fn guest_traps(cpu: &CpuFeatures, trap_wfe: bool) -> GuestTraps {
    // Stage 2 on; physical IRQ, FIQ and SError to EL2 (and virtual ones to
    // the guest); broadcast TLB/cache maintenance inner shareable; WFI
    // blocks in the scheduler; ID registers emulated; SMC is PSCI to us;
    // EL1 is AArch64. ACTLR_EL1 traps (emulated: its IMPLEMENTATION DEFINED
    // bits can change how the CPU behaves for everyone on it, and it is not
    // switched); so do the IMPLEMENTATION DEFINED registers (UNDEFINED for
    // the guest, as on KVM).
    let mut hcr = HCR_EL2::VM::Enable
        + HCR_EL2::SWIO::SET
        + HCR_EL2::FMO::EnableVirtualFIQ
        + HCR_EL2::IMO::EnableVirtualIRQ
        + HCR_EL2::AMO::SET
        + HCR_EL2::FB::SET
        + HCR_EL2::BSU::InnerShareable
        + HCR_EL2::TWI::SET
        + HCR_EL2::TID3::SET
        + HCR_EL2::TSC::EnableTrapEl1SmcToEl2
        + HCR_EL2::TACR::SET
        + HCR_EL2::TIDCP::SET
        + HCR_EL2::RW::EL1IsAarch64;
    if cpu.ras {
        // The error-record registers are the machine's, not a guest's:
        // read as zero, writes ignored (TERR is RES0 without FEAT_RAS).
        hcr += HCR_EL2::TERR::SET;
    }
    if cpu.lor {
        // LORegions state is not switched: trap it (and the ID register
        // says there is none, see `crate::idregs`).
        hcr += HCR_EL2::TLOR::SET;
    }
    if trap_wfe {
        hcr += HCR_EL2::TWE::SET;
    }
    if cpu.pauth {
        // The keys are switched with the EL1 context: no traps.
        hcr += HCR_EL2::APK::DisableTrapPointerAuthKeyRegsToEl2 + HCR_EL2::API::DisableTrapPointerAuthInstToEl2;
    }

    // FP/SIMD is the guest's (switched); SVE and SME trap (TZ and TSM are
    // RES1 on CPUs without them, so they are set either way); trace
    // registers trap; activity monitors trap where they exist.
    let mut cptr = cptr_el2_res1() + CPTR_EL2::TZ::SET + CPTR_EL2::TSM::SET + CPTR_EL2::TTA::SET;
    if cpu.amu {
        cptr += CPTR_EL2::TAM::SET;
    }

    // Debug registers trap (emulated; TDA is cleared per vCPU once it uses
    // breakpoints or watchpoints, see `crate::vdebug`); debug exceptions
    // stay the guest's (TDE = 0). Fields of absent features stay 0 (they
    // are RES0).
    let mut mdcr = MDCR_EL2::TDA::SET + MDCR_EL2::TDOSA::SET + MDCR_EL2::TDRA::SET + MDCR_EL2::TDE::RouteToEL1;
    if let Some(pmu) = cpu.pmu {
        // Every PMU access traps (a vPMU lifts the traps while its vCPU's
        // registers are loaded, `crate::vpmu`); all counters stay in the
        // guest's range
        // (HPMN = N, as at reset: HPMN = 0 is UNPREDICTABLE without
        // FEAT_HPMN0) with the EL2-reserved range disabled (HPME = 0), and
        // no counter counts while EL2 runs.
        mdcr += MDCR_EL2::TPM::SET
            + MDCR_EL2::TPMCR::SET
            + MDCR_EL2::HPMN.val(u64::from(pmu.counters))
            + MDCR_EL2::HPME::CLEAR;
        if pmu.has_hpmd() {
            mdcr += MDCR_EL2::HPMD::SET;
        }
        if pmu.has_hccd() {
            mdcr += MDCR_EL2::HCCD::SET;
        }
    }
    if cpu.spe {
        // Profiling registers trap; the buffer is owned by EL2 (E2PB = 0b00
        // traps EL1's buffer registers too).
        mdcr += MDCR_EL2::TPMS::SET + MDCR_EL2::E2PB::OwnedByEL2OrEL1;
    }
    if cpu.trf {
        mdcr += MDCR_EL2::TTRF::SET;
    }

    // The counter is readable at EL1/EL0; the EL1 physical timer is not
    // (guests use the virtual timer, which is switched).
    let cnthctl = CNTHCTL_EL2::EL1PCTEN::SET + CNTHCTL_EL2::EL1PCEN::CLEAR;

    GuestTraps {
        hcr: Hcr::new(hcr.value),
        cptr: Cptr::new(cptr.value),
        mdcr: Mdcr::new(mdcr.value),
        cnthctl: Cnthctl::new(cnthctl.value),
    }
}

/// The fine-grained trap registers (FEAT_FGT), one value each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FineGrained {
    pub hfgrtr: u64,
    pub hfgwtr: u64,
    pub hfgitr: u64,
    pub hdfgrtr: u64,
    pub hdfgwtr: u64,
}

/// The EL2 controls that later architecture versions added, which reset to
/// UNKNOWN values and which firmware and earlier boot stages may have left
/// anything in: written once per pCPU at EL2 init, the same for every VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtendedControls {
    /// HCRX_EL2, where FEAT_HCX exists.
    pub hcrx: Option<u64>,
    /// HFGRTR/HFGWTR/HFGITR/HDFGRTR/HDFGWTR_EL2, where FEAT_FGT exists.
    pub fgt: Option<FineGrained>,
}

/// HCRX_EL2 and the fine-grained traps for a CPU with `cpu`'s features.
///
/// The fine-grained trap registers are all zero. Their bits come in two
/// polarities: a plain bit set traps one register or instruction, and
/// none of those is needed (what must trap already does through HCR_EL2,
/// CPTR_EL2 and MDCR_EL2, the same on CPUs without FEAT_FGT); an `n` bit
/// *clear* traps, and each `n` bit belongs to a register of a later
/// feature the hypervisor neither switches nor shows the guest: SME's
/// TPIDR2_EL0 and SMPRI_EL1, permission indirection and overlays
/// (PIR/PIRE0/POR/S2POR), GCS, LS64's ACCDATA_EL1, RCWMASK, AMAIR2/MAIR2,
/// BRBE. So zero traps exactly those, and a guest touching one gets an
/// UNDEFINED exception instead of reaching another vCPU's value. (An `n`
/// bit for a feature the CPU lacks is RES0: zero is right there too.)
/// FEAT_FGT2's registers (HFGRTR2_EL2 and the rest) are not written.
///
/// Only without EL3: where EL3 exists, firmware decides whether EL2 may use
/// these registers (SCR_EL3.HXEn, FGTEn), and EL2 cannot see its choice.
/// An access firmware did not allow traps to EL3 (TF-A 2.8 on QEMU's
/// `max` then stops: it enables neither), and while not allowed the
/// registers have no effect, so there is nothing to initialise; firmware
/// that allows them also sets them up before entering EL2 (TF-A's context
/// management initialises both when it enables the feature).
///
/// HCRX_EL2 is zero too (every field enables a later feature for EL1/EL0:
/// LS64, NMI, TCR2/SCTLR2, 128-bit descriptors, GCS, FPMR ...), except
/// that FEAT_MOPS stays usable where the CPU has it (MSCEn), because the
/// guest's ID registers show it and user space may use it; its exceptions
/// (a copy interrupted on one implementation option and resumed on the
/// other) go to the guest's EL1, which handles them (MCE2 = 0).
pub fn extended_controls(cpu: &CpuFeatures) -> ExtendedControls {
    if cpu.el3 {
        return ExtendedControls { hcrx: None, fgt: None };
    }
    let hcrx = cpu.hcx.then(|| {
        let mut v = crate::regs::HCRX_EL2::MSCEn::CLEAR + crate::regs::HCRX_EL2::MCE2::CLEAR;
        if cpu.mops {
            v += crate::regs::HCRX_EL2::MSCEn::SET;
        }
        v.value
    });
    let fgt = cpu.fgt.then_some(FineGrained { hfgrtr: 0, hfgwtr: 0, hfgitr: 0, hdfgrtr: 0, hdfgwtr: 0 });
    ExtendedControls { hcrx, fgt }
}

/// A trapped system register the hypervisor emulates rather than
/// answering UNDEFINED: the other half of [`guest_traps`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emulated {
    /// ACTLR_EL1 (HCR_EL2.TACR): reads return the vCPU's value, which is
    /// the host's ACTLR_EL1 at vCPU creation; writes are ignored, as on
    /// KVM. Its bits are IMPLEMENTATION DEFINED controls of the physical
    /// CPU (prefetchers, errata workarounds), so no guest value ever
    /// reaches the hardware; keeping a written value to read back would
    /// tell the guest a setting took effect when it did not.
    Actlr,
    /// A RAS error-record register (HCR_EL2.TERR: ERRIDR_EL1, ERRSELR_EL1,
    /// ERXGSR/ERXFR/ERXCTLR/ERXSTATUS/ERXADDR/ERXPFG*`/ERXMISC<n>_EL1`):
    /// read as zero, writes ignored. ERRIDR_EL1 = 0 says there are no
    /// records, so a guest has nothing to select; the machine's records
    /// stay with the hypervisor and firmware.
    RasRecord,
}

/// Which emulated register (op0, op1, CRn, CRm, op2) is, if any.
pub fn emulated(op0: u8, op1: u8, crn: u8, crm: u8, op2: u8) -> Option<Emulated> {
    match (op0, op1, crn, crm, op2) {
        (3, 0, 1, 0, 1) => Some(Emulated::Actlr),
        (3, 0, 5, 3..=5, _) => Some(Emulated::RasRecord),
        _ => None,
    }
}

/// A vCPU's virtual SError (HCR_EL2.VSE), which belongs to the vCPU, not to
/// the pCPU: raised on the pCPU only while that vCPU is loaded.
///
/// The hardware clears HCR_EL2.VSE when the guest takes the virtual SError
/// (Arm ARM D1.3.3 "Virtual interrupts"); until then it stays pending,
/// across exits and across being switched out and back in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtualSError {
    pending: bool,
}

impl VirtualSError {
    /// Makes an SError pending for the vCPU.
    pub fn raise(&mut self) {
        self.pending = true;
    }

    pub fn is_pending(&self) -> bool {
        self.pending
    }

    /// HCR_EL2 for running this vCPU: `hcr` with VSE = pending.
    pub fn on_entry(&self, hcr: Hcr) -> Hcr {
        let mut h = hcr;
        h.modify(HCR_EL2::VSE.val(u64::from(self.pending)));
        h
    }

    /// After an exit, with HCR_EL2 as the hardware left it: a pending
    /// SError whose VSE bit was cleared has been taken.
    pub fn on_exit(&mut self, hcr_now: Hcr) {
        if self.pending && !hcr_now.is_set(HCR_EL2::VSE) {
            self.pending = false;
        }
    }

    /// HCR_EL2 for the pCPU once this vCPU is switched out (after
    /// [`Self::on_exit`]): no virtual SError for whoever runs next.
    pub fn on_switch_out(hcr: Hcr) -> Hcr {
        let mut h = hcr;
        h.modify(HCR_EL2::VSE::CLEAR);
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU like QEMU's `max`: pointer authentication, PMUv3p5 with 6
    /// counters, SVE and SME, RAS, FGT, HCX, MOPS, LOR, no AMU/SPE/TRF.
    fn qemu_max() -> CpuFeatures {
        CpuFeatures {
            pauth: true,
            sve: true,
            sme: true,
            amu: false,
            ras: true,
            pmu: Some(Pmu { version: 6, counters: 6 }),
            spe: false,
            trf: false,
            fgt: true,
            hcx: true,
            mops: true,
            lor: true,
            el3: false,
        }
    }

    /// A Cortex-A57: ARMv8.0, none of the later features.
    fn cortex_a57() -> CpuFeatures {
        CpuFeatures { pmu: Some(Pmu { version: 1, counters: 6 }), ..CpuFeatures::default() }
    }

    #[test]
    fn hcr_field_by_field() {
        let t = guest_traps(&qemu_max(), false);
        let h = t.hcr;
        for f in [
            HCR_EL2::VM,
            HCR_EL2::SWIO,
            HCR_EL2::FMO,
            HCR_EL2::IMO,
            HCR_EL2::AMO,
            HCR_EL2::FB,
            HCR_EL2::TWI,
            HCR_EL2::TID3,
            HCR_EL2::TSC,
            HCR_EL2::RW,
            HCR_EL2::APK,
            HCR_EL2::API,
            HCR_EL2::TACR,
            HCR_EL2::TIDCP,
            HCR_EL2::TERR,
            HCR_EL2::TLOR,
        ] {
            assert!(h.is_set(f), "HCR_EL2 bit {} clear", f.shift);
        }
        assert_eq!(h.read(HCR_EL2::BSU), 1, "inner shareable");
        for f in [
            HCR_EL2::TWE,
            HCR_EL2::VSE,
            HCR_EL2::VI,
            HCR_EL2::VF,
            HCR_EL2::TGE,
            HCR_EL2::E2H,
            HCR_EL2::TVM,
            HCR_EL2::DC,
        ] {
            assert!(!h.is_set(f), "HCR_EL2 bit {} set", f.shift);
        }
        // Nothing else is set: the whole value is accounted for above.
        assert_eq!(h.get(), 0x0000_0318_803c_263b);
        assert!(guest_traps(&qemu_max(), true).hcr.is_set(HCR_EL2::TWE));
        let no_pauth = guest_traps(&CpuFeatures { pauth: false, ..qemu_max() }, false).hcr;
        assert!(!no_pauth.is_set(HCR_EL2::APK) && !no_pauth.is_set(HCR_EL2::API), "APK/API are trap controls: 0 traps");
        // ARMv8.0: TERR and TLOR are RES0 there; ACTLR and IMPLEMENTATION
        // DEFINED registers trap everywhere.
        let v80 = guest_traps(&cortex_a57(), false).hcr;
        assert!(v80.is_set(HCR_EL2::TACR) && v80.is_set(HCR_EL2::TIDCP));
        assert!(!v80.is_set(HCR_EL2::TERR) && !v80.is_set(HCR_EL2::TLOR));
    }

    #[test]
    fn emulated_registers() {
        assert_eq!(emulated(3, 0, 1, 0, 1), Some(Emulated::Actlr));
        // SCTLR_EL1 and CPACR_EL1 share CRn=1 and are not trapped.
        assert_eq!(emulated(3, 0, 1, 0, 0), None);
        assert_eq!(emulated(3, 0, 1, 0, 2), None);
        // ERRIDR_EL1, ERRSELR_EL1, ERXFR_EL1, ERXSTATUS_EL1, ERXMISC3_EL1.
        for (crm, op2) in [(3, 0), (3, 1), (4, 0), (4, 2), (5, 3)] {
            assert_eq!(emulated(3, 0, 5, crm, op2), Some(Emulated::RasRecord), "CRm {crm} op2 {op2}");
        }
        // ESR_EL1/AFSR (CRn=5, CRm 1-2) are the guest's own, never trapped.
        assert_eq!(emulated(3, 0, 5, 2, 0), None);
        assert_eq!(emulated(3, 0, 5, 1, 0), None);
        // IMPLEMENTATION DEFINED space (TIDCP): no emulation, UNDEFINED.
        assert_eq!(emulated(3, 0, 15, 2, 0), None);
        assert_eq!(emulated(3, 1, 11, 0, 0), None);
    }

    #[test]
    fn extended_controls_only_where_they_exist() {
        // ARMv8.0: neither register exists, nothing is written.
        assert_eq!(extended_controls(&cortex_a57()), ExtendedControls { hcrx: None, fgt: None });
        let max = extended_controls(&qemu_max());
        // MOPS stays usable (the guest sees it), its exceptions go to EL1;
        // every other HCRX_EL2 enable is off.
        assert_eq!(max.hcrx, Some(1 << 11));
        let no_mops = extended_controls(&CpuFeatures { mops: false, ..qemu_max() });
        assert_eq!(no_mops.hcrx, Some(0));
        // Fine-grained traps: all zero, so the n-polarity bits trap the
        // unswitched registers of later features (SME's TPIDR2_EL0 among
        // them) and no plain bit adds a trap.
        let f = max.fgt.expect("FEAT_FGT");
        assert_eq!(f, FineGrained { hfgrtr: 0, hfgwtr: 0, hfgitr: 0, hdfgrtr: 0, hdfgwtr: 0 });
        use aarch64_cpu::registers::{HFGRTR_EL2, HFGWTR_EL2};
        let r = LocalRegisterCopy::<u64, HFGRTR_EL2::Register>::new(f.hfgrtr);
        let w = LocalRegisterCopy::<u64, HFGWTR_EL2::Register>::new(f.hfgwtr);
        assert!(!r.is_set(HFGRTR_EL2::nTPIDR2_EL0) && !w.is_set(HFGWTR_EL2::nTPIDR2_EL0), "TPIDR2_EL0 traps");
        assert!(!r.is_set(HFGRTR_EL2::nSMPRI_EL1) && !w.is_set(HFGWTR_EL2::nSMPRI_EL1), "SMPRI_EL1 traps");
        // Under EL3 firmware: firmware's to allow, not written.
        assert_eq!(
            extended_controls(&CpuFeatures { el3: true, ..qemu_max() }),
            ExtendedControls { hcrx: None, fgt: None }
        );
        // FGT without HCX (ARMv8.6) and the reverse are independent.
        let fgt_only = extended_controls(&CpuFeatures { hcx: false, ..qemu_max() });
        assert!(fgt_only.hcrx.is_none() && fgt_only.fgt.is_some());
    }

    #[test]
    fn sve_sme_trace_and_amu_trap_fp_does_not() {
        let c = guest_traps(&qemu_max(), false).cptr;
        assert!(c.is_set(CPTR_EL2::TZ), "SVE is not switched: must trap");
        assert!(c.is_set(CPTR_EL2::TSM), "SME is not switched: must trap");
        assert!(c.is_set(CPTR_EL2::TTA), "trace registers must trap");
        assert!(!c.is_set(CPTR_EL2::TFP), "FP/SIMD is switched: no trap");
        assert!(!c.is_set(CPTR_EL2::TCPAC), "CPACR_EL1 is switched");
        assert!(!c.is_set(CPTR_EL2::TAM), "no AMU here: TAM is RES0");
        assert_eq!(c.get(), 0x0010_33ff);
        let amu = guest_traps(&CpuFeatures { amu: true, ..qemu_max() }, false).cptr;
        assert!(amu.is_set(CPTR_EL2::TAM));
        // Without SVE/SME the bits are RES1: still set.
        let plain = guest_traps(&CpuFeatures { sve: false, sme: false, ..qemu_max() }, false).cptr;
        assert!(plain.is_set(CPTR_EL2::TZ) && plain.is_set(CPTR_EL2::TSM));
    }

    #[test]
    fn pmu_and_debug_trap() {
        let m = guest_traps(&qemu_max(), false).mdcr;
        assert!(m.is_set(MDCR_EL2::TPM), "PMU registers must trap");
        assert!(m.is_set(MDCR_EL2::TPMCR), "PMCR_EL0 must trap");
        assert_eq!(m.read(MDCR_EL2::HPMN), 6, "HPMN = PMCR_EL0.N");
        assert!(!m.is_set(MDCR_EL2::HPME), "no EL2-reserved counters enabled");
        assert!(m.is_set(MDCR_EL2::HPMD), "no counting at EL2");
        assert!(m.is_set(MDCR_EL2::HCCD), "no cycle counting at EL2");
        assert!(m.is_set(MDCR_EL2::TDA), "debug registers must trap");
        assert!(m.is_set(MDCR_EL2::TDOSA), "OS lock registers must trap");
        assert!(m.is_set(MDCR_EL2::TDRA), "debug ROM address must trap");
        assert!(!m.is_set(MDCR_EL2::TDE), "debug exceptions stay with the guest");
        // Absent features leave their (RES0) fields alone.
        assert!(!m.is_set(MDCR_EL2::TPMS) && !m.is_set(MDCR_EL2::TTRF));
        assert_eq!(m.get(), 0x0082_0e66);

        let spe_trf = guest_traps(&CpuFeatures { spe: true, trf: true, ..qemu_max() }, false).mdcr;
        assert!(spe_trf.is_set(MDCR_EL2::TPMS) && spe_trf.is_set(MDCR_EL2::TTRF));
        assert_eq!(spe_trf.read(MDCR_EL2::E2PB), 0, "profiling buffer owned by EL2: EL1 traps");

        // PMUv3 without v3p1/v3p5: HPMD and HCCD do not exist.
        let v3 = guest_traps(&CpuFeatures { pmu: Some(Pmu { version: 1, counters: 4 }), ..qemu_max() }, false).mdcr;
        assert!(v3.is_set(MDCR_EL2::TPM) && !v3.is_set(MDCR_EL2::HPMD) && !v3.is_set(MDCR_EL2::HCCD));
        assert_eq!(v3.read(MDCR_EL2::HPMN), 4);

        // No PMU: its fields are RES0, debug still traps.
        let none = guest_traps(&CpuFeatures { pmu: None, ..qemu_max() }, false).mdcr;
        assert_eq!(none.get(), 0x0e00);
    }

    #[test]
    fn el1_physical_timer_traps_counter_does_not() {
        let t = guest_traps(&qemu_max(), false).cnthctl;
        assert!(t.is_set(CNTHCTL_EL2::EL1PCTEN));
        assert!(!t.is_set(CNTHCTL_EL2::EL1PCEN));
        assert_eq!(t.get(), 1);
    }

    #[test]
    fn features_from_id_registers() {
        // QEMU 7.2 `max`: ISAR1 APA=5/API=0/GPA=1, PFR0 SVE=1 RAS=1,
        // PFR1 SME=1, DFR0 PMUVer=6 DebugVer=6 BRPs=5 WRPs=3.
        let ids = IdRegs {
            pfr0: 0x0000_0001_1001_1011 | (1 << 28),
            pfr1: 1 << 24,
            dfr0: 0x0000_0000_0030_5606,
            isar1: 0x0000_0000_0100_0050,
            isar2: 1 << 16,
            // FGT = 1 [59:56]; HCX = 1 [43:40], LO = 1 [19:16].
            mmfr0: 1 << 56,
            mmfr1: (1 << 40) | (1 << 16),
            pmcr: Some(6 << 11),
        };
        let f = CpuFeatures::from_id_regs(&ids);
        // EL3 [15:12] = 1 in that value (QEMU with secure=on).
        assert_eq!(f, CpuFeatures { amu: false, el3: true, ..qemu_max() });
        assert!(!CpuFeatures::from_id_regs(&IdRegs { pfr0: ids.pfr0 & !0xf000, ..ids }).el3);
        let v80 = CpuFeatures::from_id_regs(&IdRegs { isar2: 0, mmfr0: 0, mmfr1: 0, ..ids });
        assert!(!v80.fgt && !v80.hcx && !v80.mops && !v80.lor);
        // No PMCR read (no PMU): no PMU.
        assert_eq!(CpuFeatures::from_id_regs(&IdRegs { pmcr: None, ..ids }).pmu, None);
        assert_eq!(pmu_version(0xf00), None, "IMPLEMENTATION DEFINED PMU");
        assert_eq!(pmu_version(0x100), Some(1));
        // QARMA3 alone (ISAR2) counts as pointer authentication.
        let q3 = IdRegs { isar1: 0, isar2: 1 << 12, ..ids };
        assert!(CpuFeatures::from_id_regs(&q3).pauth);
        assert!(!CpuFeatures::from_id_regs(&IdRegs { isar1: 0, ..ids }).pauth);
    }

    #[test]
    fn virtual_serror_belongs_to_its_vcpu() {
        let base = guest_traps(&qemu_max(), false).hcr;
        let mut a = VirtualSError::default();
        let b = VirtualSError::default();
        assert!(!a.on_entry(base).is_set(HCR_EL2::VSE));

        // A takes a physical SError that is reflected to it.
        a.raise();
        let running_a = a.on_entry(base);
        assert!(running_a.is_set(HCR_EL2::VSE));
        // A exits before taking it (the guest had SErrors masked): still
        // pending; the pCPU switches to B, which must not see it.
        a.on_exit(running_a);
        assert!(a.is_pending());
        let idle = VirtualSError::on_switch_out(running_a);
        assert!(!idle.is_set(HCR_EL2::VSE));
        assert!(!b.on_entry(idle).is_set(HCR_EL2::VSE), "B inherited A's SError");
        // Back on A (any pCPU): raised again.
        let again = a.on_entry(idle);
        assert!(again.is_set(HCR_EL2::VSE));
        // A takes it: the hardware clears VSE; it is gone for good.
        let mut taken = again;
        taken.modify(HCR_EL2::VSE::CLEAR);
        a.on_exit(taken);
        assert!(!a.is_pending());
        assert!(!a.on_entry(base).is_set(HCR_EL2::VSE));
        // The rest of HCR_EL2 is untouched throughout.
        assert_eq!(VirtualSError::on_switch_out(again).get(), base.get());
    }
}
