//! A vCPU's EL1 system registers, virtual timer and FP/SIMD state.
//!
//! The hypervisor is built for `aarch64-unknown-none-softfloat`, so its own
//! code never touches FP/SIMD registers: guest FP state stays live in the
//! registers while the hypervisor handles traps, and is saved only when a
//! pCPU switches to another vCPU.

use super::sysreg::{self, VDISR_EL2};
use crate::regs::SCTLR_EL1_RESET;
use crate::vdebug::{BreakWatchRegs, Slots};
use aarch64_cpu::registers::{
    AFSR0_EL1, AFSR1_EL1, AMAIR_EL1, CNTKCTL_EL1, CNTV_CTL_EL0, CNTV_CVAL_EL0, CONTEXTIDR_EL1, CPACR_EL1, CSSELR_EL1,
    ELR_EL1, ESR_EL1, FAR_EL1, MAIR_EL1, MDSCR_EL1, PAR_EL1, SCTLR_EL1, SPSR_EL1, SP_EL0, SP_EL1, TCR_EL1, TPIDRRO_EL0,
    TPIDR_EL0, TPIDR_EL1, TTBR0_EL1, TTBR1_EL1, VBAR_EL1, VMPIDR_EL2,
};
use tock_registers::interfaces::{Readable, Writeable};

/// EL1 state that belongs to the guest.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct El1Context {
    pub sctlr: u64,
    pub actlr: u64,
    pub cpacr: u64,
    pub ttbr0: u64,
    pub ttbr1: u64,
    pub tcr: u64,
    pub mair: u64,
    pub amair: u64,
    pub vbar: u64,
    pub contextidr: u64,
    pub tpidr_el0: u64,
    pub tpidrro_el0: u64,
    pub tpidr_el1: u64,
    pub sp_el0: u64,
    pub sp_el1: u64,
    pub elr_el1: u64,
    pub spsr_el1: u64,
    pub esr_el1: u64,
    pub far_el1: u64,
    pub afsr0: u64,
    pub afsr1: u64,
    pub par: u64,
    pub cntkctl: u64,
    pub csselr: u64,
    pub mdscr: u64,
    pub cntv_ctl: u64,
    pub cntv_cval: u64,
    pub vmpidr: u64,
    /// VDISR_EL2: the guest's DISR_EL1 (HCR_EL2.AMO redirects its accesses
    /// there), which holds a virtual SError its ESB deferred; switched only
    /// when the CPU has FEAT_RAS.
    pub vdisr: u64,
    /// Pointer-authentication keys (APIA, APIB, APDA, APDB, APGA; lo, hi),
    /// switched only when the CPU has FEAT_PAuth.
    pub pauth_keys: [u64; 10],
    /// The guest's emulated debug state and its breakpoint and watchpoint
    /// registers, switched lazily (not by `save`/`restore`: see
    /// `crate::vdebug`).
    pub debug: crate::vdebug::VDebug,
}

/// Accessors for the pointer-authentication key registers, by encoding
/// (op0=3, op1=0, CRn=2): their names need the assembler's PAuth extension.
macro_rules! pauth_keys {
    ($save:ident, $restore:ident, $($i:literal => $reg:literal),*) => {
        fn $save(keys: &mut [u64; 10]) {
            $(
                // SAFETY: reads a key register (FEAT_PAuth is checked by
                // the caller); no memory effects.
                unsafe { core::arch::asm!(concat!("mrs {0}, ", $reg), out(reg) keys[$i], options(nomem, nostack, preserves_flags)) };
            )*
        }
        fn $restore(keys: &[u64; 10]) {
            $(
                // SAFETY: writes a key register of the guest's EL1 context;
                // the hypervisor does not use pointer authentication.
                unsafe { core::arch::asm!(concat!("msr ", $reg, ", {0}"), in(reg) keys[$i], options(nomem, nostack, preserves_flags)) };
            )*
        }
    };
}

// APIAKeyLo_EL1 .. APGAKeyHi_EL1.
pauth_keys!(save_pauth, restore_pauth,
    0 => "s3_0_c2_c1_0", 1 => "s3_0_c2_c1_1", 2 => "s3_0_c2_c1_2", 3 => "s3_0_c2_c1_3",
    4 => "s3_0_c2_c2_0", 5 => "s3_0_c2_c2_1", 6 => "s3_0_c2_c2_2", 7 => "s3_0_c2_c2_3",
    8 => "s3_0_c2_c3_0", 9 => "s3_0_c2_c3_1");

impl El1Context {
    /// Architectural reset state for a vCPU entering at EL1 with the MMU off.
    /// ACTLR_EL1 is not loaded into the hardware (HCR_EL2.TACR traps it):
    /// `actlr` is what the guest reads, this CPU's own value.
    pub fn reset(vmpidr: u64) -> Self {
        let vmpidr = VMPIDR_EL2::RES1::SET.modify(vmpidr);
        Self { sctlr: SCTLR_EL1_RESET.value, vmpidr, actlr: super::el2::host_actlr_el1(), ..Default::default() }
    }

    /// Loads this state into the EL1 registers.
    pub fn restore(&self) {
        SCTLR_EL1.set(self.sctlr);
        CPACR_EL1.set(self.cpacr);
        TTBR0_EL1.set(self.ttbr0);
        TTBR1_EL1.set(self.ttbr1);
        TCR_EL1.set(self.tcr);
        MAIR_EL1.set(self.mair);
        AMAIR_EL1.set(self.amair);
        VBAR_EL1.set(self.vbar);
        CONTEXTIDR_EL1.set(self.contextidr);
        TPIDR_EL0.set(self.tpidr_el0);
        TPIDRRO_EL0.set(self.tpidrro_el0);
        TPIDR_EL1.set(self.tpidr_el1);
        SP_EL0.set(self.sp_el0);
        SP_EL1.set(self.sp_el1);
        ELR_EL1.set(self.elr_el1);
        SPSR_EL1.set(self.spsr_el1);
        ESR_EL1.set(self.esr_el1);
        FAR_EL1.set(self.far_el1);
        AFSR0_EL1.set(self.afsr0);
        AFSR1_EL1.set(self.afsr1);
        PAR_EL1.set(self.par);
        CNTKCTL_EL1.set(self.cntkctl);
        CSSELR_EL1.set(self.csselr);
        MDSCR_EL1.set(self.mdscr);
        CNTV_CVAL_EL0.set(self.cntv_cval);
        CNTV_CTL_EL0.set(self.cntv_ctl);
        VMPIDR_EL2.set(self.vmpidr);
        // One look at the features for both.
        let f = super::el2::cpu_features();
        if f.pauth {
            restore_pauth(&self.pauth_keys);
        }
        if f.ras {
            VDISR_EL2.set(self.vdisr);
        }
        sysreg::isb();
    }

    /// Saves the EL1 registers and stops the guest's virtual timer so it
    /// cannot fire for the next vCPU on this pCPU.
    pub fn save(&mut self) {
        self.sctlr = SCTLR_EL1.get();
        self.cpacr = CPACR_EL1.get();
        self.ttbr0 = TTBR0_EL1.get();
        self.ttbr1 = TTBR1_EL1.get();
        self.tcr = TCR_EL1.get();
        self.mair = MAIR_EL1.get();
        self.amair = AMAIR_EL1.get();
        self.vbar = VBAR_EL1.get();
        self.contextidr = CONTEXTIDR_EL1.get();
        self.tpidr_el0 = TPIDR_EL0.get();
        self.tpidrro_el0 = TPIDRRO_EL0.get();
        self.tpidr_el1 = TPIDR_EL1.get();
        self.sp_el0 = SP_EL0.get();
        self.sp_el1 = SP_EL1.get();
        self.elr_el1 = ELR_EL1.get();
        self.spsr_el1 = SPSR_EL1.get();
        self.esr_el1 = ESR_EL1.get();
        self.far_el1 = FAR_EL1.get();
        self.afsr0 = AFSR0_EL1.get();
        self.afsr1 = AFSR1_EL1.get();
        self.par = PAR_EL1.get();
        self.cntkctl = CNTKCTL_EL1.get();
        self.csselr = CSSELR_EL1.get();
        self.mdscr = MDSCR_EL1.get();
        self.cntv_ctl = CNTV_CTL_EL0.get();
        self.cntv_cval = CNTV_CVAL_EL0.get();
        self.vmpidr = VMPIDR_EL2.get();
        let f = super::el2::cpu_features();
        if f.pauth {
            save_pauth(&mut self.pauth_keys);
        }
        if f.ras {
            self.vdisr = VDISR_EL2.get();
        }
        CNTV_CTL_EL0.set(0);
    }
}

/// The loaded guest's MDSCR_EL1 (the register is part of the EL1 context).
pub fn read_mdscr() -> u64 {
    MDSCR_EL1.get()
}

/// Writes the loaded guest's MDSCR_EL1.
pub fn write_mdscr(v: u64) {
    MDSCR_EL1.set(v);
}

/// Loads a debug-dirty vCPU's breakpoint and watchpoint registers (every
/// slot `s` counts) into the hardware; see `crate::vdebug`.
pub fn load_break_watch(r: &BreakWatchRegs, s: Slots) {
    for (b, n) in BreakWatchRegs::slots(s) {
        sysreg::write_break_watch(b, n, r.bank(b)[n]);
    }
}

/// Saves the hardware breakpoint and watchpoint registers (every slot `s`
/// counts) of the debug-dirty vCPU leaving this pCPU. They are left as
/// they are: the next vCPU either loads its own or runs with MDE clear.
pub fn save_break_watch(r: &mut BreakWatchRegs, s: Slots) {
    for (b, n) in BreakWatchRegs::slots(s) {
        r.bank_mut(b)[n] = sysreg::read_break_watch(b, n);
    }
}

/// Makes the loaded guest's EL1 registers describe a synchronous exception
/// taken from the state (`elr`, `spsr`) with syndrome `esr` and, for
/// aborts, fault address `far`. Returns VBAR_EL1, where the guest's vectors
/// are.
pub fn enter_el1_exception(esr: u64, far: Option<u64>, elr: u64, spsr: u64) -> u64 {
    ESR_EL1.set(esr);
    if let Some(f) = far {
        FAR_EL1.set(f);
    }
    ELR_EL1.set(elr);
    SPSR_EL1.set(spsr);
    VBAR_EL1.get()
}

/// FP/SIMD registers (V0-V31, FPCR, FPSR).
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default)]
pub struct FpContext {
    pub v: [u128; 32],
    pub fpcr: u64,
    pub fpsr: u64,
}

impl FpContext {
    pub fn save(&mut self) {
        // SAFETY: stores the FP/SIMD registers into `self`, which is 16-byte
        // aligned and large enough (32 x 16 bytes + 2 x 8).
        unsafe {
            core::arch::asm!(
                ".arch_extension fp",
                ".arch_extension simd",
                "stp q0, q1, [{p}, #0]", "stp q2, q3, [{p}, #32]",
                "stp q4, q5, [{p}, #64]", "stp q6, q7, [{p}, #96]",
                "stp q8, q9, [{p}, #128]", "stp q10, q11, [{p}, #160]",
                "stp q12, q13, [{p}, #192]", "stp q14, q15, [{p}, #224]",
                "stp q16, q17, [{p}, #256]", "stp q18, q19, [{p}, #288]",
                "stp q20, q21, [{p}, #320]", "stp q22, q23, [{p}, #352]",
                "stp q24, q25, [{p}, #384]", "stp q26, q27, [{p}, #416]",
                "stp q28, q29, [{p}, #448]", "stp q30, q31, [{p}, #480]",
                "mrs {t}, fpcr", "str {t}, [{p}, #512]",
                "mrs {t}, fpsr", "str {t}, [{p}, #520]",
                p = in(reg) self as *mut Self,
                t = out(reg) _,
                options(nostack)
            );
        }
    }

    pub fn restore(&self) {
        // SAFETY: loads the FP/SIMD registers from `self` (see `save`).
        unsafe {
            core::arch::asm!(
                ".arch_extension fp",
                ".arch_extension simd",
                "ldp q0, q1, [{p}, #0]", "ldp q2, q3, [{p}, #32]",
                "ldp q4, q5, [{p}, #64]", "ldp q6, q7, [{p}, #96]",
                "ldp q8, q9, [{p}, #128]", "ldp q10, q11, [{p}, #160]",
                "ldp q12, q13, [{p}, #192]", "ldp q14, q15, [{p}, #224]",
                "ldp q16, q17, [{p}, #256]", "ldp q18, q19, [{p}, #288]",
                "ldp q20, q21, [{p}, #320]", "ldp q22, q23, [{p}, #352]",
                "ldp q24, q25, [{p}, #384]", "ldp q26, q27, [{p}, #416]",
                "ldp q28, q29, [{p}, #448]", "ldp q30, q31, [{p}, #480]",
                "ldr {t}, [{p}, #512]", "msr fpcr, {t}",
                "ldr {t}, [{p}, #520]", "msr fpsr, {t}",
                p = in(reg) self as *const Self,
                t = out(reg) _,
                options(nostack)
            );
        }
    }
}
