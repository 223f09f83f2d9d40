//! System-register access.
//!
//! Registers `aarch64-cpu` types are used from `aarch64_cpu::registers`.
//! For the ones it lacks, this file defines accessors in the crate's style
//! (a unit struct implementing tock-registers' `Readable`/`Writeable`, so
//! `read(FIELD)`, `write(FIELD::X + ...)`, `modify`, `get`, `set` work the
//! same) over the layouts in `crate::regs`. Barriers, TLB maintenance and
//! the ID registers by encoding and the breakpoint/watchpoint registers by
//! number are here too.

use crate::regs;
#[cfg(target_os = "none")]
use hv_core::vdebug::Bank;
use tock_registers::interfaces::{Readable, Writeable};

/// Implements `Readable` with `mrs` of the register named `$asm`.
macro_rules! impl_read {
    ($acc:ident, $asm:literal, $layout:ty) => {
        impl Readable for $acc {
            type T = u64;
            type R = $layout;
            #[cfg(feature = "fakes")]
            fn get(&self) -> u64 {
                crate::fake::read($asm)
            }
            #[cfg(not(feature = "fakes"))]
            #[inline]
            fn get(&self) -> u64 {
                let v: u64;
                // SAFETY: an `mrs` reads a system register into a general
                // register: no memory access, no effect on Rust-visible
                // state (reading ICC_IAR1_EL1 acknowledges an interrupt,
                // which only the GIC sees).
                unsafe { core::arch::asm!(concat!("mrs {0}, ", $asm), out(reg) v, options(nomem, nostack, preserves_flags)) };
                v
            }
        }
    };
}

/// Implements `Writeable` with `msr` to the register named `$asm`.
macro_rules! impl_write {
    ($acc:ident, $asm:literal, $layout:ty) => {
        impl Writeable for $acc {
            type T = u64;
            type R = $layout;
            #[cfg(feature = "fakes")]
            fn set(&self, v: u64) {
                crate::fake::write($asm, v)
            }
            #[cfg(not(feature = "fakes"))]
            #[inline]
            fn set(&self, v: u64) {
                // SAFETY: an `msr` to a register of the GIC CPU interface, the
                // EL2 timer, the PMU or a guest-visible EL2 control: none of
                // them changes how the hypervisor's own memory is translated
                // or accessed. No `nomem`: the compiler keeps memory accesses
                // on their side of the write.
                unsafe { core::arch::asm!(concat!("msr ", $asm, ", {0}"), in(reg) v, options(nostack, preserves_flags)) };
            }
        }
    };
}

/// Declares an accessor `$name` for the system register `$asm` with the
/// field layout `$layout`, readable (`r`), writable (`w`) or both (`rw`).
macro_rules! sys_reg {
    ($(#[$doc:meta])* $name:ident, $asm:literal, $layout:ty, rw) => {
        sys_reg!(@def $(#[$doc])* $name);
        impl_read!($name, $asm, $layout);
        impl_write!($name, $asm, $layout);
    };
    ($(#[$doc:meta])* $name:ident, $asm:literal, $layout:ty, r) => {
        sys_reg!(@def $(#[$doc])* $name);
        impl_read!($name, $asm, $layout);
    };
    ($(#[$doc:meta])* $name:ident, $asm:literal, $layout:ty, w) => {
        sys_reg!(@def $(#[$doc])* $name);
        impl_write!($name, $asm, $layout);
    };
    (@def $(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy)]
        pub struct $name;
    };
}

sys_reg!(
    /// VPIDR_EL2 (the MIDR_EL1 guests read).
    VPIDR_EL2, "vpidr_el2", regs::VPIDR_EL2::Register, rw
);
sys_reg!(
    /// VSESR_EL2 (FEAT_RAS only).
    VSESR_EL2, "s3_4_c5_c2_3", regs::VSESR_EL2::Register, rw
);
sys_reg!(
    /// HCRX_EL2 (FEAT_HCX only).
    HCRX_EL2, "s3_4_c1_c2_2", regs::HCRX_EL2::Register, rw
);
sys_reg!(
    /// FEAT_FGT only.
    HFGRTR_EL2, "s3_4_c1_c1_4", aarch64_cpu::registers::HFGRTR_EL2::Register, rw
);
sys_reg!(
    /// FEAT_FGT only.
    HFGWTR_EL2, "s3_4_c1_c1_5", aarch64_cpu::registers::HFGWTR_EL2::Register, rw
);
sys_reg!(
    /// FEAT_FGT only.
    HFGITR_EL2, "s3_4_c1_c1_6", aarch64_cpu::registers::HFGITR_EL2::Register, rw
);
sys_reg!(
    /// FEAT_FGT only.
    HDFGRTR_EL2, "s3_4_c3_c1_4", (), rw
);
sys_reg!(
    /// FEAT_FGT only.
    HDFGWTR_EL2, "s3_4_c3_c1_5", (), rw
);
sys_reg!(
    /// VDISR_EL2 (FEAT_RAS only): what a guest reads as DISR_EL1 while
    /// HCR_EL2.AMO is set (a virtual SError its ESB deferred).
    VDISR_EL2, "s3_4_c12_c1_1", (), rw
);
sys_reg!(ICH_EISR_EL2, "ich_eisr_el2", regs::ICH_EISR_EL2::Register, r);
sys_reg!(ICH_ELRSR_EL2, "ich_elrsr_el2", regs::ICH_ELRSR_EL2::Register, r);
sys_reg!(ICC_CTLR_EL1, "icc_ctlr_el1", regs::ICC_CTLR_EL1::Register, rw);
sys_reg!(ICC_PMR_EL1, "icc_pmr_el1", regs::ICC_PMR_EL1::Register, rw);
sys_reg!(ICC_BPR1_EL1, "icc_bpr1_el1", regs::ICC_BPR1_EL1::Register, rw);
sys_reg!(ICC_IGRPEN1_EL1, "icc_igrpen1_el1", regs::ICC_IGRPEN1_EL1::Register, rw);
sys_reg!(
    /// Reading acknowledges the highest-priority pending group-1 interrupt.
    ICC_IAR1_EL1, "icc_iar1_el1", regs::ICC_INTID::Register, r
);
sys_reg!(ICC_EOIR1_EL1, "icc_eoir1_el1", regs::ICC_INTID::Register, w);
sys_reg!(ICC_DIR_EL1, "icc_dir_el1", regs::ICC_INTID::Register, w);
sys_reg!(ICC_SGI1R_EL1, "icc_sgi1r_el1", regs::ICC_SGI1R_EL1::Register, w);
sys_reg!(CNTHP_CVAL_EL2, "cnthp_cval_el2", regs::CNTHP_CVAL_EL2::Register, rw);
sys_reg!(ICH_HCR_EL2, "ich_hcr_el2", aarch64_cpu::registers::ICH_HCR_EL2::Register, rw);
sys_reg!(ICH_VTR_EL2, "ich_vtr_el2", aarch64_cpu::registers::ICH_VTR_EL2::Register, r);
sys_reg!(ICH_VMCR_EL2, "ich_vmcr_el2", (), rw);
sys_reg!(ICH_AP0R0_EL2, "ich_ap0r0_el2", (), rw);
sys_reg!(ICH_AP0R1_EL2, "ich_ap0r1_el2", (), rw);
sys_reg!(ICH_AP0R2_EL2, "ich_ap0r2_el2", (), rw);
sys_reg!(ICH_AP0R3_EL2, "ich_ap0r3_el2", (), rw);
sys_reg!(ICH_AP1R0_EL2, "ich_ap1r0_el2", (), rw);
sys_reg!(ICH_AP1R1_EL2, "ich_ap1r1_el2", (), rw);
sys_reg!(ICH_AP1R2_EL2, "ich_ap1r2_el2", (), rw);
sys_reg!(ICH_AP1R3_EL2, "ich_ap1r3_el2", (), rw);
sys_reg!(ICH_LR0_EL2, "ich_lr0_el2", (), rw);
sys_reg!(ICH_LR1_EL2, "ich_lr1_el2", (), rw);
sys_reg!(ICH_LR2_EL2, "ich_lr2_el2", (), rw);
sys_reg!(ICH_LR3_EL2, "ich_lr3_el2", (), rw);
sys_reg!(ICH_LR4_EL2, "ich_lr4_el2", (), rw);
sys_reg!(ICH_LR5_EL2, "ich_lr5_el2", (), rw);
sys_reg!(ICH_LR6_EL2, "ich_lr6_el2", (), rw);
sys_reg!(ICH_LR7_EL2, "ich_lr7_el2", (), rw);
sys_reg!(ICH_LR8_EL2, "ich_lr8_el2", (), rw);
sys_reg!(ICH_LR9_EL2, "ich_lr9_el2", (), rw);
sys_reg!(ICH_LR10_EL2, "ich_lr10_el2", (), rw);
sys_reg!(ICH_LR11_EL2, "ich_lr11_el2", (), rw);
sys_reg!(ICH_LR12_EL2, "ich_lr12_el2", (), rw);
sys_reg!(ICH_LR13_EL2, "ich_lr13_el2", (), rw);
sys_reg!(ICH_LR14_EL2, "ich_lr14_el2", (), rw);
sys_reg!(ICH_LR15_EL2, "ich_lr15_el2", (), rw);
sys_reg!(CTR_EL0, "ctr_el0", regs::CTR_EL0::Register, r);
sys_reg!(
    /// UNDEFINED without FEAT_PMUv3 (check ID_AA64DFR0_EL1.PMUVer first).
    PMCR_EL0, "pmcr_el0", regs::PMCR_EL0::Register, rw
);
sys_reg!(
    /// UNDEFINED without FEAT_PMUv3.
    PMUSERENR_EL0, "pmuserenr_el0", regs::PMUSERENR_EL0::Register, rw
);
sys_reg!(ID_AA64ISAR2_EL1, "s3_0_c0_c6_2", regs::ID_AA64ISAR2_EL1::Register, r);

#[cfg(target_os = "none")]
/// Reads a system register by encoding name (`s3_0_c0_c4_0`); for the ID
/// space, which has no useful names for reserved encodings.
macro_rules! mrs {
    ($asm:expr) => {{
        let v: u64;
        // SAFETY: reads an ID register: no memory access, no side effects.
        unsafe { core::arch::asm!(concat!("mrs {0}, ", $asm), out(reg) v, options(nomem, nostack, preserves_flags)) };
        v
    }};
}

#[cfg(feature = "fakes")]
pub fn isb() {}

#[cfg(not(feature = "fakes"))]
#[inline(always)]
pub fn isb() {
    // SAFETY: a barrier: no memory or register effects beyond ordering.
    unsafe { core::arch::asm!("isb", options(nostack, preserves_flags)) };
}

/// Waits until this CPU's earlier stores are visible to the other CPUs
/// (DSB ISHST): before a system-register write that signals them, such as
/// an SGI, which is not ordered after stores otherwise.
#[cfg(feature = "fakes")]
pub fn dsb_ishst() {}

#[cfg(not(feature = "fakes"))]
#[inline(always)]
pub fn dsb_ishst() {
    // SAFETY: a barrier: no memory or register effects beyond ordering.
    unsafe { core::arch::asm!("dsb ishst", options(nostack, preserves_flags)) };
}

/// One spin-wait step: YIELD, the hint Linux's `cpu_relax` gives. Under
/// QEMU's single-threaded TCG a YIELD also hands the turn to the next
/// emulated CPU, so a pCPU spinning on a lock lets its holder run (see
/// `hv_core::sync`, whose locks call this through
/// [`hv_core::sync::set_relax`]). On the host: `spin_loop`.
#[cfg(not(target_os = "none"))]
#[inline(always)]
pub fn cpu_relax() {
    core::hint::spin_loop();
}

#[cfg(target_os = "none")]
#[inline(always)]
pub fn cpu_relax() {
    // SAFETY: a hint instruction: no memory, register or flag effects.
    unsafe { core::arch::asm!("yield", options(nomem, nostack, preserves_flags)) };
}

#[cfg(target_os = "none")]
#[inline(always)]
pub fn dsb_sy() {
    // SAFETY: a barrier: no memory or register effects beyond ordering.
    unsafe { core::arch::asm!("dsb sy", options(nostack, preserves_flags)) };
}

#[cfg(target_os = "none")]
#[inline(always)]
pub fn dsb_ish() {
    // SAFETY: a barrier: no memory or register effects beyond ordering.
    unsafe { core::arch::asm!("dsb ish", options(nostack, preserves_flags)) };
}

#[cfg(target_os = "none")]
/// Waits for an interrupt with interrupts masked (PSTATE.I stays set: the
/// pending interrupt is taken by reading ICC_IAR1_EL1 afterwards).
#[inline(always)]
pub fn wfi() {
    // SAFETY: waits for an event; no memory effects.
    unsafe { core::arch::asm!("dsb sy", "wfi", options(nostack, preserves_flags)) };
}

#[cfg(target_os = "none")]
/// Invalidates all stage-1 and stage-2 TLB entries for the current VMID
/// (VTTBR_EL2 must hold it) on the inner shareable domain.
pub fn tlbi_vmalls12e1is() {
    // SAFETY: drops guest (EL1&0 regime) translations of the current VMID;
    // the hypervisor's own EL2 translations are not affected.
    unsafe { core::arch::asm!("dsb ishst", "tlbi vmalls12e1is", "dsb ish", "isb", options(nostack, preserves_flags)) };
}

#[cfg(target_os = "none")]
/// Invalidates every EL1&0 regime TLB entry of every VMID on the inner
/// shareable domain (a VM's tables are about to be freed, or its VMID used
/// again).
pub fn tlbi_alle1is() {
    // SAFETY: drops guest translations only; the hypervisor's own EL2
    // translations are not affected.
    unsafe { core::arch::asm!("dsb ishst", "tlbi alle1is", "dsb ish", "isb", options(nostack, preserves_flags)) };
}

#[cfg(target_os = "none")]
/// The exception level this code runs at (CurrentEL.EL, 0..3).
pub fn current_el() -> u64 {
    use aarch64_cpu::registers::CurrentEL;
    CurrentEL.read(CurrentEL::EL)
}

#[cfg(target_os = "none")]
/// This pCPU's MPIDR_EL1 affinity fields (Aff3..Aff0, without the U/MT and
/// RES1 bits).
pub fn mpidr() -> u64 {
    use aarch64_cpu::registers::MPIDR_EL1;
    let m = MPIDR_EL1.extract();
    let aff = MPIDR_EL1::Aff3.val(m.read(MPIDR_EL1::Aff3))
        + MPIDR_EL1::Aff2.val(m.read(MPIDR_EL1::Aff2))
        + MPIDR_EL1::Aff1.val(m.read(MPIDR_EL1::Aff1))
        + MPIDR_EL1::Aff0.val(m.read(MPIDR_EL1::Aff0));
    aff.value
}

#[cfg(target_os = "none")]
macro_rules! id_reg_read {
    ($crm:expr, $op2:expr; $($c:literal),*) => {
        match ($crm, $op2) {
            $(
                ($c, 0) => mrs!(concat!("s3_0_c0_c", stringify!($c), "_0")),
                ($c, 1) => mrs!(concat!("s3_0_c0_c", stringify!($c), "_1")),
                ($c, 2) => mrs!(concat!("s3_0_c0_c", stringify!($c), "_2")),
                ($c, 3) => mrs!(concat!("s3_0_c0_c", stringify!($c), "_3")),
                ($c, 4) => mrs!(concat!("s3_0_c0_c", stringify!($c), "_4")),
                ($c, 5) => mrs!(concat!("s3_0_c0_c", stringify!($c), "_5")),
                ($c, 6) => mrs!(concat!("s3_0_c0_c", stringify!($c), "_6")),
                ($c, 7) => mrs!(concat!("s3_0_c0_c", stringify!($c), "_7")),
            )*
            _ => 0,
        }
    };
}

#[cfg(target_os = "none")]
/// Reads the ID register at op0=3, op1=0, CRn=0, `crm` (1..=7), `op2` at
/// EL2 (unallocated encodings in this space read as zero).
pub fn read_id_reg(crm: u8, op2: u8) -> u64 {
    id_reg_read!(crm, op2; 1, 2, 3, 4, 5, 6, 7)
}

#[cfg(target_os = "none")]
/// Expands to a `match` over `(bank, n)` running `$body!(asm name)` for the
/// breakpoint/watchpoint register `DBG{B,W}{V,C}R<n>_EL1`, n in 0..=15.
macro_rules! break_watch_match {
    ($bank:expr, $n:expr, $body:ident, $($i:literal),*) => {
        match ($bank, $n) {
            $(
                (Bank::Bvr, $i) => $body!(concat!("dbgbvr", stringify!($i), "_el1")),
                (Bank::Bcr, $i) => $body!(concat!("dbgbcr", stringify!($i), "_el1")),
                (Bank::Wvr, $i) => $body!(concat!("dbgwvr", stringify!($i), "_el1")),
                (Bank::Wcr, $i) => $body!(concat!("dbgwcr", stringify!($i), "_el1")),
            )*
            _ => panic!("no breakpoint/watchpoint register {:?}{}", $bank, $n),
        }
    };
}

#[cfg(target_os = "none")]
/// Reads DBG{B,W}{V,C}R<n>_EL1. `n` must be below the bank's count in
/// ID_AA64DFR0_EL1 ([`crate::vdebug::Slots`]): a higher one is UNDEFINED.
pub fn read_break_watch(bank: Bank, n: usize) -> u64 {
    macro_rules! read {
        ($asm:expr) => {{
            let v: u64;
            // SAFETY: reads a breakpoint or watchpoint register: no memory
            // access, no side effects.
            unsafe { core::arch::asm!(concat!("mrs {0}, ", $asm), out(reg) v, options(nomem, nostack, preserves_flags)) };
            v
        }};
    }
    break_watch_match!(bank, n, read, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
}

#[cfg(target_os = "none")]
/// Writes DBG{B,W}{V,C}R<n>_EL1 (`n` as for [`read_break_watch`]). Takes
/// effect at the next context synchronization (the ERET into the guest).
pub fn write_break_watch(bank: Bank, n: usize, v: u64) {
    macro_rules! write {
        ($asm:expr) => {
            // SAFETY: writes a breakpoint or watchpoint register. Its
            // exceptions are only generated at EL1 and EL0 (MDCR_EL2.TDE is
            // clear, so none is taken from EL2) and only with the loaded
            // vCPU's MDSCR_EL1.MDE set, so the hypervisor's own code and
            // memory are not affected.
            unsafe { core::arch::asm!(concat!("msr ", $asm, ", {0}"), in(reg) v, options(nomem, nostack, preserves_flags)) }
        };
    }
    break_watch_match!(bank, n, write, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
}
