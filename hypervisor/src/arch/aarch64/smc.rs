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
