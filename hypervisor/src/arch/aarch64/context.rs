//! A vCPU's EL1 system registers, virtual timer and FP/SIMD state.
//!
//! The hypervisor is built for `aarch64-unknown-none-softfloat`, so its own
//! code never touches FP/SIMD registers: guest FP state stays live in the
//! registers while the hypervisor handles traps, and is saved only when a
//! pCPU switches to another vCPU.

use crate::{read_sysreg, write_sysreg};

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
    /// Pointer-authentication keys (APIA, APIB, APDA, APDB, APGA; lo, hi),
    /// switched only when the CPU has FEAT_PAuth.
    pub pauth_keys: [u64; 10],
}

/// Whether the CPU implements pointer authentication (ID_AA64ISAR1_EL1
/// APA/API/GPA/GPI, or ID_AA64ISAR2_EL1 APA3/GPA3).
pub fn has_pauth() -> bool {
    read_sysreg!("id_aa64isar1_el1") & 0xff0_0ff0 != 0 || read_sysreg!("s3_0_c0_c6_2") & 0xff000 != 0
}

macro_rules! pauth_keys {
    ($save:ident, $restore:ident, $($i:literal => $reg:literal),*) => {
        fn $save(keys: &mut [u64; 10]) {
            $(keys[$i] = read_sysreg!($reg);)*
        }
        fn $restore(keys: &[u64; 10]) {
            $(write_sysreg!($reg, keys[$i]);)*
        }
    };
}

// APIAKeyLo_EL1 .. APGAKeyHi_EL1 by encoding (op0=3, op1=0, CRn=2).
pauth_keys!(save_pauth, restore_pauth,
    0 => "s3_0_c2_c1_0", 1 => "s3_0_c2_c1_1", 2 => "s3_0_c2_c1_2", 3 => "s3_0_c2_c1_3",
    4 => "s3_0_c2_c2_0", 5 => "s3_0_c2_c2_1", 6 => "s3_0_c2_c2_2", 7 => "s3_0_c2_c2_3",
    8 => "s3_0_c2_c3_0", 9 => "s3_0_c2_c3_1");

impl El1Context {
    /// Architectural reset state for a vCPU entering at EL1 with the MMU off.
    pub fn reset(vmpidr: u64) -> Self {
        Self { sctlr: 0x30d0_0800, vmpidr: vmpidr | (1 << 31), ..Default::default() }
    }

    /// Loads this state into the EL1 registers.
    pub fn restore(&self) {
        write_sysreg!("sctlr_el1", self.sctlr);
        write_sysreg!("cpacr_el1", self.cpacr);
        write_sysreg!("ttbr0_el1", self.ttbr0);
        write_sysreg!("ttbr1_el1", self.ttbr1);
        write_sysreg!("tcr_el1", self.tcr);
        write_sysreg!("mair_el1", self.mair);
        write_sysreg!("amair_el1", self.amair);
        write_sysreg!("vbar_el1", self.vbar);
        write_sysreg!("contextidr_el1", self.contextidr);
        write_sysreg!("tpidr_el0", self.tpidr_el0);
        write_sysreg!("tpidrro_el0", self.tpidrro_el0);
        write_sysreg!("tpidr_el1", self.tpidr_el1);
        write_sysreg!("sp_el0", self.sp_el0);
        write_sysreg!("sp_el1", self.sp_el1);
        write_sysreg!("elr_el1", self.elr_el1);
        write_sysreg!("spsr_el1", self.spsr_el1);
        write_sysreg!("esr_el1", self.esr_el1);
        write_sysreg!("far_el1", self.far_el1);
        write_sysreg!("afsr0_el1", self.afsr0);
        write_sysreg!("afsr1_el1", self.afsr1);
        write_sysreg!("par_el1", self.par);
        write_sysreg!("cntkctl_el1", self.cntkctl);
        write_sysreg!("csselr_el1", self.csselr);
        write_sysreg!("mdscr_el1", self.mdscr);
        write_sysreg!("cntv_cval_el0", self.cntv_cval);
        write_sysreg!("cntv_ctl_el0", self.cntv_ctl);
        write_sysreg!("vmpidr_el2", self.vmpidr);
        if has_pauth() {
            restore_pauth(&self.pauth_keys);
        }
        super::sysreg::isb();
    }

    /// Saves the EL1 registers and stops the guest's virtual timer so it
    /// cannot fire for the next vCPU on this pCPU.
    pub fn save(&mut self) {
        self.sctlr = read_sysreg!("sctlr_el1");
        self.cpacr = read_sysreg!("cpacr_el1");
        self.ttbr0 = read_sysreg!("ttbr0_el1");
        self.ttbr1 = read_sysreg!("ttbr1_el1");
        self.tcr = read_sysreg!("tcr_el1");
        self.mair = read_sysreg!("mair_el1");
        self.amair = read_sysreg!("amair_el1");
        self.vbar = read_sysreg!("vbar_el1");
        self.contextidr = read_sysreg!("contextidr_el1");
        self.tpidr_el0 = read_sysreg!("tpidr_el0");
        self.tpidrro_el0 = read_sysreg!("tpidrro_el0");
        self.tpidr_el1 = read_sysreg!("tpidr_el1");
        self.sp_el0 = read_sysreg!("sp_el0");
        self.sp_el1 = read_sysreg!("sp_el1");
        self.elr_el1 = read_sysreg!("elr_el1");
        self.spsr_el1 = read_sysreg!("spsr_el1");
        self.esr_el1 = read_sysreg!("esr_el1");
        self.far_el1 = read_sysreg!("far_el1");
        self.afsr0 = read_sysreg!("afsr0_el1");
        self.afsr1 = read_sysreg!("afsr1_el1");
        self.par = read_sysreg!("par_el1");
        self.cntkctl = read_sysreg!("cntkctl_el1");
        self.csselr = read_sysreg!("csselr_el1");
        self.mdscr = read_sysreg!("mdscr_el1");
        self.cntv_ctl = read_sysreg!("cntv_ctl_el0");
        self.cntv_cval = read_sysreg!("cntv_cval_el0");
        self.vmpidr = read_sysreg!("vmpidr_el2");
        if has_pauth() {
            save_pauth(&mut self.pauth_keys);
        }
        write_sysreg!("cntv_ctl_el0", 0);
    }
}

/// FP/SIMD registers (V0-V31, FPCR, FPSR).
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug)]
pub struct FpContext {
    pub v: [u128; 32],
    pub fpcr: u64,
    pub fpsr: u64,
}

impl Default for FpContext {
    fn default() -> Self {
        Self { v: [0; 32], fpcr: 0, fpsr: 0 }
    }
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
