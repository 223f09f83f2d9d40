//! SMC calls to firmware (PSCI on QEMU virt, TF-A on FVP).

/// Issues an SMC64/SMC32 call with up to three arguments; returns x0.
pub fn smc(function: u32, a1: u64, a2: u64, a3: u64) -> u64 {
    let mut x0 = function as u64;
    // SAFETY: SMCCC calls preserve x4-x17 for SMC64 v1.1+ but older firmware
    // may clobber x0-x17; they are declared clobbered.
    unsafe {
        core::arch::asm!(
            "smc #0",
            inout("x0") x0,
            inout("x1") a1 => _, inout("x2") a2 => _, inout("x3") a3 => _,
            out("x4") _, out("x5") _, out("x6") _, out("x7") _,
            out("x8") _, out("x9") _, out("x10") _, out("x11") _,
            out("x12") _, out("x13") _, out("x14") _, out("x15") _,
            out("x16") _, out("x17") _,
            options(nostack)
        );
    }
    x0
}

/// Asks firmware which transient-execution workarounds it implements, the
/// way Linux does (`crate::mitigations::may_ask_firmware`): nothing beyond
/// PSCI_VERSION and PSCI_FEATURES is called unless firmware says it speaks
/// SMCCC 1.1, so firmware without SMCCC (QEMU's built-in PSCI) never sees
/// a call it does not know.
pub fn ask_workarounds() -> crate::mitigations::Firmware {
    use crate::mitigations::{self as m, Firmware};
    use crate::psci;
    // Return values are 32-bit (W0), signed where they are error codes.
    let call = |f: u32, a1: u64| smc(f, a1, 0, 0) as u32 as i32 as i64;
    let version = smc(psci::PSCI_VERSION, 0, 0, 0) & 0xffff_ffff;
    let feature = if version >= 0x1_0000 { call(psci::PSCI_FEATURES, u64::from(psci::SMCCC_VERSION)) } else { -1 };
    let smccc = if feature >= 0 { call(psci::SMCCC_VERSION, 0) } else { -1 };
    if !m::may_ask_firmware(version, feature, smccc) {
        return Firmware::default();
    }
    let ask = |f: u32| Some(call(psci::SMCCC_ARCH_FEATURES, u64::from(f)));
    Firmware { wa1: ask(m::ARCH_WORKAROUND_1), wa2: ask(m::ARCH_WORKAROUND_2), wa3: ask(m::ARCH_WORKAROUND_3) }
}

/// Turns firmware's Spectre-v4 mitigation on for this CPU, for good.
pub fn enable_firmware_ssbd() {
    smc(crate::mitigations::ARCH_WORKAROUND_2, 1, 0, 0);
}

pub fn psci_system_off() -> ! {
    smc(crate::psci::SYSTEM_OFF, 0, 0, 0);
    loop {
        super::sysreg::wfi();
    }
}

pub fn psci_system_reset() -> ! {
    smc(crate::psci::SYSTEM_RESET, 0, 0, 0);
    loop {
        super::sysreg::wfi();
    }
}

/// Starts a physical CPU at `secondary_entry` with `context` in x0.
pub fn psci_cpu_on(mpidr: u64, entry: u64, context: u64) -> i64 {
    smc(crate::psci::CPU_ON_64, mpidr, entry, context) as i64
}
