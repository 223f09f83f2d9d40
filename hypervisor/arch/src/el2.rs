//! This pCPU's EL2 controls for running guests: the trap configuration
//! computed by [`crate::traps`] and the VM's stage 2 applied, the exit
//! syndrome, and a vCPU's virtual SError.

use super::sysreg::{
    self, HCRX_EL2, HDFGRTR_EL2, HDFGWTR_EL2, HFGITR_EL2, HFGRTR_EL2, HFGWTR_EL2, ID_AA64ISAR2_EL1, PMCR_EL0,
    VPIDR_EL2, VSESR_EL2,
};
use crate::regs;
use crate::stage2;
use crate::traps::{self, CpuFeatures, GuestTraps, Hcr, IdRegs};
use aarch64_cpu::registers::{
    ACTLR_EL1, CNTHCTL_EL2, CNTVOFF_EL2, CPTR_EL2, ESR_EL2, FAR_EL2, HCR_EL2, HPFAR_EL2, ID_AA64DFR0_EL1,
    ID_AA64ISAR1_EL1, ID_AA64MMFR0_EL1, ID_AA64MMFR1_EL1, ID_AA64PFR0_EL1, ID_AA64PFR1_EL1, MDCR_EL2, MIDR_EL1,
    OSLAR_EL1, VTCR_EL2, VTTBR_EL2,
};
use tock_registers::interfaces::{ReadWriteable, Readable, Writeable};

/// This CPU's ID registers as EL2 sees them (PMCR_EL0 only if a PMUv3
/// exists: it is UNDEFINED otherwise).
pub fn id_regs() -> IdRegs {
    let dfr0 = ID_AA64DFR0_EL1.get();
    IdRegs {
        pfr0: ID_AA64PFR0_EL1.get(),
        pfr1: ID_AA64PFR1_EL1.get(),
        dfr0,
        isar1: ID_AA64ISAR1_EL1.get(),
        isar2: ID_AA64ISAR2_EL1.get(),
        mmfr0: ID_AA64MMFR0_EL1.get(),
        mmfr1: ID_AA64MMFR1_EL1.get(),
        pmcr: traps::pmu_version(dfr0).map(|_| PMCR_EL0.get()),
    }
}

/// What the CPUs implement, decoded from the ID registers of the first
/// CPU that asks (the boot CPU, at its EL2 init) and kept: every vCPU load
/// and register switch asks, and decoding costs ~80 instructions a time.
/// The hypervisor treats its pCPUs as one kind, as the platforms it runs on
/// are (QEMU `virt`, FVP Base, Graviton); a secondary whose ID registers
/// decode differently is reported at its init ([`init_extended_controls`]).
static FEATURES: spin::Once<CpuFeatures> = spin::Once::new();

/// What the CPUs implement (see [`FEATURES`]).
pub fn cpu_features() -> CpuFeatures {
    *FEATURES.call_once(|| CpuFeatures::from_id_regs(&id_regs()))
}

/// Writes the EL2 controls later architecture versions added
/// ([`traps::extended_controls`]: HCRX_EL2, the fine-grained traps) on
/// this pCPU, once at its EL2 init: they reset to UNKNOWN values and are
/// the same for every VM. Where the CPU has them, firmware has enabled
/// them for EL2 (SCR_EL3.HXEn, FGTEn), as Linux's boot protocol requires
/// of firmware for the same CPUs.
pub fn init_extended_controls() {
    let here = CpuFeatures::from_id_regs(&id_regs());
    if here != cpu_features() {
        log::error!("this pCPU's features differ from the boot CPU's, which every pCPU is run with: {here:?}");
    }
    let c = traps::extended_controls(&cpu_features());
    if let Some(hcrx) = c.hcrx {
        HCRX_EL2.set(hcrx);
    }
    if let Some(f) = c.fgt {
        HFGRTR_EL2.set(f.hfgrtr);
        HFGWTR_EL2.set(f.hfgwtr);
        HFGITR_EL2.set(f.hfgitr);
        HDFGRTR_EL2.set(f.hdfgrtr);
        HDFGWTR_EL2.set(f.hdfgwtr);
    }
    sysreg::isb();
}

/// This CPU's ACTLR_EL1 as firmware and the hypervisor left it: what a
/// guest reads (HCR_EL2.TACR traps its accesses).
pub fn host_actlr_el1() -> u64 {
    ACTLR_EL1.get()
}

/// The registers `crate::mitigations::decide` reads, on this CPU.
pub fn mitigation_cpu_id() -> crate::mitigations::CpuId {
    crate::mitigations::CpuId {
        midr: MIDR_EL1.get(),
        pfr0: ID_AA64PFR0_EL1.get(),
        pfr1: ID_AA64PFR1_EL1.get(),
        isar2: ID_AA64ISAR2_EL1.get(),
        mmfr1: ID_AA64MMFR1_EL1.get(),
    }
}

/// Whether the CPUs have FEAT_RAS.
pub fn has_ras() -> bool {
    cpu_features().ras
}

/// ID_AA64MMFR0_EL1.PARange: the physical address size this CPU implements
/// (`stage2::pa_bits` decodes it).
pub fn parange() -> u64 {
    ID_AA64MMFR0_EL1.read(ID_AA64MMFR0_EL1::PARange)
}

/// Makes stage-2 table writes visible to the table walker before the guest
/// retries the access that faulted on the entry (the entry was invalid, so
/// no TLB holds it: no invalidation is needed).
pub fn stage2_updated() {
    sysreg::dsb_ish();
    sysreg::isb();
}

/// Configures this pCPU for running a VM's guests: the trap configuration,
/// guest-visible identity and timer offset, and the VM's stage 2 (VMID
/// `vmid`, root table `stage2_root`, IPA space `ipa`).
///
/// TLB maintenance: stage-1 and stage-2 entries of EL1&0 are tagged with the
/// VMID (Arm ARM D8.16, "VMID and the TLB"), so switching VTTBR_EL2 between
/// VMs with distinct VMIDs whose tables never change needs none; the
/// entries of a VMID are invalidated (TLBI VMALLS12E1IS, for the VMID now in
/// VTTBR_EL2) the first time `invalidate` is set for it, before it ever runs
/// here, so nothing cached under that VMID before (firmware, an earlier
/// boot stage) can be used with the new tables.
pub fn load_guest_config(t: &GuestTraps, stage2_root: u64, vmid: u16, ipa: stage2::IpaSize, invalidate: bool) {
    HCR_EL2.set(t.hcr.get());
    CPTR_EL2.set(t.cptr.get());
    MDCR_EL2.set(t.mdcr.get());
    CNTHCTL_EL2.set(t.cnthctl.get());
    CNTVOFF_EL2.set(0);
    VPIDR_EL2.write(regs::VPIDR_EL2::VALUE.val(MIDR_EL1.get()));
    // The OS lock registers trap (MDCR_EL2.TDOSA); the guest's OS lock is
    // emulated, so the hardware one is cleared here once: with it set, the
    // guest's single-step, breakpoints and watchpoints would never fire.
    OSLAR_EL1.write(OSLAR_EL1::OSLK::Unlocked);
    VTCR_EL2.set(stage2::vtcr(ipa, parange()).get());
    VTTBR_EL2.set(stage2::vttbr(stage2_root, vmid).get());
    sysreg::isb();
    if invalidate {
        sysreg::tlbi_vmalls12e1is();
    }
}

/// Sets or clears MDCR_EL2.TDA for the vCPU about to run here: set (as
/// `load_guest_config` leaves it) while it is debug-clean, clear while it
/// owns the breakpoint and watchpoint registers (`crate::vdebug`). Takes
/// effect at the ERET into the guest.
pub fn set_debug_trap(trap: bool) {
    MDCR_EL2.modify(if trap { MDCR_EL2::TDA::SET } else { MDCR_EL2::TDA::CLEAR });
}

/// The breakpoints and watchpoints this CPU implements.
pub fn debug_slots() -> crate::vdebug::Slots {
    crate::vdebug::Slots::from_dfr0(ID_AA64DFR0_EL1.get())
}

/// The syndrome registers of the exception that just left the guest.
#[derive(Clone, Copy, Debug)]
pub struct ExitSyndrome {
    pub esr: u64,
    pub far: u64,
    pub hpfar: u64,
}

pub fn exit_syndrome() -> ExitSyndrome {
    ExitSyndrome { esr: ESR_EL2.get(), far: FAR_EL2.get(), hpfar: HPFAR_EL2.get() }
}

/// HCR_EL2 as it is now (the hardware clears VSE when a virtual SError is
/// taken).
pub fn hcr() -> Hcr {
    HCR_EL2.extract()
}

pub fn set_hcr(h: Hcr) {
    HCR_EL2.set(h.get());
}

/// Gives a virtual SError about to be raised its syndrome: with FEAT_RAS
/// the guest's ESR_EL1 gets VSESR_EL2 (IMPLEMENTATION DEFINED syndrome,
/// as for a physical SError we could not classify); without it there is
/// nothing to set.
pub fn set_vserror_syndrome(features_ras: bool) {
    if features_ras {
        VSESR_EL2.write(regs::VSESR_EL2::IDS::SET);
    }
}
