//! Everything that is assembly: the arm64 Image header and entry points,
//! the EL1 vector table, the MMU switch, system-register accessors and the
//! SMCCC conduits.
//!
//! The register wrappers are safe functions because the registers they
//! reach (timers, GIC CPU interface, debug, PMU, counters) cannot break
//! memory safety: at worst they raise an exception, which `crate::exc`
//! handles. Registers that change translation (SCTLR, TCR, TTBR, MAIR) are
//! written only by `conf_enable_mmu` and the secondary entry.

use core::arch::{asm, global_asm};

/// Each CPU's stack.
pub const STACK_SIZE: usize = 32 * 1024;
/// CPUs the guest can run on (the rest of the DT's CPUs are left off).
pub const MAX_CPUS: usize = 4;

/// The saved registers of an exception, as the vector code lays them out.
#[repr(C)]
pub struct Frame {
    pub x: [u64; 31],
    pub elr: u64,
    pub spsr: u64,
    _pad: u64,
}

#[repr(C, align(16))]
pub struct Stacks(pub [[u8; STACK_SIZE]; MAX_CPUS]);

/// The stacks; CPU 0's is taken by the entry code, the others' tops go to
/// the secondaries through their boot blocks.
#[no_mangle]
pub static mut CONF_STACKS: Stacks = Stacks([[0; STACK_SIZE]; MAX_CPUS]);

/// What a secondary CPU reads with its MMU still off (so the primary
/// cleans it to the point of coherency): stack top, TTBR0, TCR, MAIR, index.
#[repr(C, align(64))]
pub struct BootBlock {
    pub stack_top: u64,
    pub ttbr0: u64,
    pub tcr: u64,
    pub mair: u64,
    pub cpu: u64,
}

global_asm!(
    r#"
    .section .text.head, "ax"
    .global _start
_start:
    b       conf_primary
    .long   0
    .quad   0                       // text_offset
    .quad   __image_size            // image_size, BSS included
    .quad   0xa                     // little endian, 4 KiB pages, anywhere in RAM
    .quad   0, 0, 0
    .ascii  "ARM\x64"
    .long   0

conf_primary:
    msr     daifset, #0xf
    mov     x19, x0                 // the DTB
    adr     x9, _start              // linked at 0: the load address is the delta
    adrp    x10, __rela_start
    add     x10, x10, :lo12:__rela_start
    adrp    x11, __rela_end
    add     x11, x11, :lo12:__rela_end
1:  cmp     x10, x11
    b.hs    2f
    ldp     x12, x13, [x10], #16    // r_offset, r_info
    ldr     x14, [x10], #8          // r_addend
    cmp     x13, #1027              // R_AARCH64_RELATIVE, the only kind xtask lets through
    b.ne    9f
    add     x14, x14, x9
    str     x14, [x12, x9]
    b       1b
2:  adrp    x1, __bss_start
    add     x1, x1, :lo12:__bss_start
    adrp    x2, __bss_end
    add     x2, x2, :lo12:__bss_end
3:  cmp     x1, x2
    b.hs    4f
    stp     xzr, xzr, [x1], #16
    b       3b
4:  adrp    x1, conf_vectors
    add     x1, x1, :lo12:conf_vectors
    msr     vbar_el1, x1
    isb
    adrp    x1, CONF_STACKS
    add     x1, x1, :lo12:CONF_STACKS
    mov     x2, #{stack_size}
    add     sp, x1, x2
    mov     x0, x19
    bl      conf_main
9:  wfe
    b       9b

    .global conf_secondary_entry
conf_secondary_entry:
    msr     daifset, #0xf
    ldr     x1, [x0, #24]
    msr     mair_el1, x1
    ldr     x1, [x0, #16]
    msr     tcr_el1, x1
    ldr     x1, [x0, #8]
    msr     ttbr0_el1, x1
    ldr     x1, [x0]
    mov     sp, x1
    ldr     x19, [x0, #32]
    adrp    x1, conf_vectors
    add     x1, x1, :lo12:conf_vectors
    msr     vbar_el1, x1
    isb
    bl      conf_mmu_on
    mov     x0, x19
    bl      conf_secondary_main
    b       9b

    .global conf_enable_mmu
conf_enable_mmu:
    msr     mair_el1, x2
    msr     tcr_el1, x1
    msr     ttbr0_el1, x0
    isb
conf_mmu_on:
    tlbi    vmalle1
    ic      iallu
    dsb     nsh
    isb
    mrs     x3, sctlr_el1
    orr     x3, x3, #(1 << 0)       // M
    orr     x3, x3, #(1 << 2)       // C
    orr     x3, x3, #(1 << 12)      // I
    bic     x3, x3, #(1 << 1)       // A: Rust may access unaligned normal memory
    bic     x3, x3, #(1 << 19)      // WXN
    msr     sctlr_el1, x3
    isb
    ret

    // Steps one instruction at EL1: ERET to 1f with SPSR.SS set and
    // PSTATE.D clear (MDSCR_EL1.SS and KDE set by the caller), so the
    // software-step exception comes after the `nop` with ELR = 2f.
    // Returns 2f's address. IRQs stay masked until the caller unmasks.
    .global conf_single_step
conf_single_step:
    mrs     x1, mdscr_el1
    orr     x1, x1, #1
    msr     mdscr_el1, x1
    adr     x2, 1f
    msr     elr_el1, x2
    mov     x3, #0x1c5              // EL1h, A I F masked, D clear
    orr     x3, x3, #(1 << 21)      // SS
    msr     spsr_el1, x3
    adr     x0, 2f
    isb
    eret
1:  nop
2:  nop
    ret

    .section .text.vectors, "ax"
    .balign 2048
    .global conf_vectors
conf_vectors:
    .irp kind, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
    .balign 0x80
    sub     sp, sp, #272
    stp     x0, x1, [sp, #0]
    mov     x0, #\kind
    b       conf_exception_common
    .endr

conf_exception_common:
    stp     x2, x3, [sp, #16]
    stp     x4, x5, [sp, #32]
    stp     x6, x7, [sp, #48]
    stp     x8, x9, [sp, #64]
    stp     x10, x11, [sp, #80]
    stp     x12, x13, [sp, #96]
    stp     x14, x15, [sp, #112]
    stp     x16, x17, [sp, #128]
    stp     x18, x19, [sp, #144]
    stp     x20, x21, [sp, #160]
    stp     x22, x23, [sp, #176]
    stp     x24, x25, [sp, #192]
    stp     x26, x27, [sp, #208]
    stp     x28, x29, [sp, #224]
    mrs     x1, elr_el1
    mrs     x2, spsr_el1
    stp     x30, x1, [sp, #240]
    str     x2, [sp, #256]
    mov     x1, sp
    bl      conf_exception
    ldp     x30, x1, [sp, #240]
    ldr     x2, [sp, #256]
    msr     elr_el1, x1
    msr     spsr_el1, x2
    ldp     x0, x1, [sp, #0]
    ldp     x2, x3, [sp, #16]
    ldp     x4, x5, [sp, #32]
    ldp     x6, x7, [sp, #48]
    ldp     x8, x9, [sp, #64]
    ldp     x10, x11, [sp, #80]
    ldp     x12, x13, [sp, #96]
    ldp     x14, x15, [sp, #112]
    ldp     x16, x17, [sp, #128]
    ldp     x18, x19, [sp, #144]
    ldp     x20, x21, [sp, #160]
    ldp     x22, x23, [sp, #176]
    ldp     x24, x25, [sp, #192]
    ldp     x26, x27, [sp, #208]
    ldp     x28, x29, [sp, #224]
    add     sp, sp, #272
    eret
"#,
    stack_size = const STACK_SIZE,
);

extern "C" {
    fn conf_enable_mmu(ttbr0: u64, tcr: u64, mair: u64);
    fn conf_single_step() -> u64;
    fn conf_secondary_entry();
}

/// Turns the EL1 MMU on with `ttbr0` (a level-1 table the caller filled).
///
/// # Safety
/// The table must identity-map the image, its stacks and every address the
/// program touches afterwards, with normal memory for RAM.
pub unsafe fn enable_mmu(ttbr0: u64, tcr: u64, mair: u64) {
    // SAFETY: the caller's contract: the identity map keeps every address
    // the program uses where it was.
    unsafe { conf_enable_mmu(ttbr0, tcr, mair) }
}

/// Steps one instruction (see the assembly); returns the ELR the step
/// exception must report.
pub fn single_step() -> u64 {
    // SAFETY: the routine only returns to its own code; the step exception
    // it raises is handled by `crate::exc`, which clears MDSCR_EL1.SS.
    unsafe { conf_single_step() }
}

/// The secondary entry point's address, for PSCI CPU_ON.
pub fn secondary_entry() -> u64 {
    conf_secondary_entry as *const () as u64
}

macro_rules! sysreg {
    ($read:ident, $write:ident, $reg:literal) => {
        #[inline(always)]
        #[allow(dead_code)]
        pub fn $read() -> u64 {
            let v;
            // SAFETY: a system-register read; an UNDEF is handled by crate::exc.
            unsafe { asm!(concat!("mrs {}, ", $reg), out(reg) v, options(nostack)) };
            v
        }
        #[inline(always)]
        #[allow(dead_code)]
        pub fn $write(v: u64) {
            // SAFETY: none of the registers named below changes translation
            // (see the module docs); an UNDEF is handled by crate::exc.
            unsafe { asm!(concat!("msr ", $reg, ", {}"), "isb", in(reg) v, options(nostack)) };
        }
    };
}

sysreg!(mpidr, _write_mpidr, "mpidr_el1");
sysreg!(current_el, _write_current_el, "currentel");
sysreg!(id_aa64pfr0, _write_id_aa64pfr0, "id_aa64pfr0_el1");
sysreg!(id_aa64dfr0, _write_id_aa64dfr0, "id_aa64dfr0_el1");
sysreg!(id_aa64mmfr0, _write_id_aa64mmfr0, "id_aa64mmfr0_el1");
sysreg!(cntfrq, _write_cntfrq, "cntfrq_el0");
sysreg!(cntvct, _write_cntvct, "cntvct_el0");
sysreg!(cntv_ctl, write_cntv_ctl, "cntv_ctl_el0");
sysreg!(cntv_cval, write_cntv_cval, "cntv_cval_el0");
sysreg!(cntv_tval, write_cntv_tval, "cntv_tval_el0");
sysreg!(cntpct, _write_cntpct, "cntpct_el0");
sysreg!(cntp_ctl, write_cntp_ctl, "cntp_ctl_el0");
sysreg!(cntp_cval, write_cntp_cval, "cntp_cval_el0");
sysreg!(cntp_tval, write_cntp_tval, "cntp_tval_el0");
sysreg!(icc_sre, write_icc_sre, "icc_sre_el1");
sysreg!(icc_pmr, write_icc_pmr, "icc_pmr_el1");
sysreg!(icc_bpr1, write_icc_bpr1, "icc_bpr1_el1");
sysreg!(icc_ctlr, write_icc_ctlr, "icc_ctlr_el1");
sysreg!(icc_igrpen1, write_icc_igrpen1, "icc_igrpen1_el1");
sysreg!(icc_iar1, _write_icc_iar1, "icc_iar1_el1");
sysreg!(_read_icc_eoir1, write_icc_eoir1, "icc_eoir1_el1");
sysreg!(_read_icc_sgi1r, write_icc_sgi1r, "icc_sgi1r_el1");
sysreg!(_read_icc_dir, write_icc_dir, "icc_dir_el1");
sysreg!(mdscr, write_mdscr, "mdscr_el1");
sysreg!(_read_oslar, write_oslar, "oslar_el1");
sysreg!(pmcr, write_pmcr, "pmcr_el0");
sysreg!(pmcntenset, write_pmcntenset, "pmcntenset_el0");
sysreg!(pmcntenclr, write_pmcntenclr, "pmcntenclr_el0");
sysreg!(pmccntr, write_pmccntr, "pmccntr_el0");
sysreg!(pmccfiltr, write_pmccfiltr, "pmccfiltr_el0");
sysreg!(pmevtyper0, write_pmevtyper0, "pmevtyper0_el0");
sysreg!(pmevcntr0, write_pmevcntr0, "pmevcntr0_el0");
sysreg!(_read_pmswinc, write_pmswinc, "pmswinc_el0");
sysreg!(pmovsset, write_pmovsclr, "pmovsclr_el0");
sysreg!(pmintenset, write_pmintenset, "pmintenset_el1");
sysreg!(_read_pmintenclr, write_pmintenclr, "pmintenclr_el1");

macro_rules! indexed_write {
    ($fname:ident, $prefix:literal, [$($n:literal),*]) => {
        /// Writes slot `n` of this register bank (16 slots at most).
        pub fn $fname(n: usize, v: u64) {
            match n {
                $($n => {
                    // SAFETY: a debug register: it can raise a debug
                    // exception (crate::exc) but changes no translation.
                    unsafe { asm!(concat!("msr ", $prefix, stringify!($n), "_el1, {}"), "isb", in(reg) v, options(nostack)) }
                })*
                _ => {}
            }
        }
    };
}

indexed_write!(write_dbgbvr, "dbgbvr", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
indexed_write!(write_dbgbcr, "dbgbcr", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
indexed_write!(write_dbgwvr, "dbgwvr", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
indexed_write!(write_dbgwcr, "dbgwcr", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);

/// Unmasks IRQs.
pub fn irq_on() {
    // SAFETY: the vector table is installed before any code runs.
    unsafe { asm!("msr daifclr, #2", options(nostack)) }
}

/// Masks IRQs.
pub fn irq_off() {
    // SAFETY: masking interrupts is always sound.
    unsafe { asm!("msr daifset, #2", options(nostack)) }
}

/// Unmasks debug exceptions (PSTATE.D).
pub fn debug_on() {
    // SAFETY: debug exceptions go to crate::exc.
    unsafe { asm!("msr daifclr, #8", options(nostack)) }
}

/// Masks debug exceptions.
pub fn debug_off() {
    // SAFETY: masking is always sound.
    unsafe { asm!("msr daifset, #8", options(nostack)) }
}

/// The spin-loop hint (Linux's `cpu_relax()` on arm64). It never traps;
/// QEMU without MTTCG ends the running CPU's turn at it, so the other CPUs
/// run while this one waits for them.
pub fn yield_hint() {
    // SAFETY: a hint; no effects on memory or registers.
    unsafe { asm!("yield", options(nomem, nostack, preserves_flags)) }
}

pub fn wfi() {
    // SAFETY: waits for an interrupt; nothing else.
    unsafe { asm!("dsb sy", "wfi", options(nostack)) }
}

/// Orders normal-memory writes before the device accesses that follow.
pub fn dsb() {
    // SAFETY: a barrier.
    unsafe { asm!("dsb sy", options(nostack)) }
}

/// Cleans and invalidates the cache line holding `addr` to the point of
/// coherency (what a CPU whose MMU is still off reads).
pub fn clean_line(addr: usize) {
    // SAFETY: cache maintenance by address on memory the program owns.
    unsafe { asm!("dc civac, {}", "dsb sy", in(reg) addr, options(nostack)) }
}

/// Branches with link to `addr` (an instruction-abort check: the handler
/// resumes at the link register).
pub fn call_addr(addr: u64) {
    // SAFETY: the target is expected to fault on fetch; crate::exc returns
    // to x30, as if the callee had returned. Caller-saved registers are
    // treated as clobbered.
    unsafe { asm!("blr {a}", a = in(reg) addr, clobber_abi("C"), options(nostack)) }
}

/// BRK #0x42: a software breakpoint, handled at EL1 (crate::exc skips it).
pub fn brk() {
    // SAFETY: raises a breakpoint exception the vector code returns from.
    unsafe { asm!("brk #0x42", options(nostack)) }
}

/// An SMCCC call through HVC (`smc` false) or SMC: x0..x3 in, x0 out.
pub fn smccc(smc: bool, fid: u64, a1: u64, a2: u64, a3: u64) -> u64 {
    let r;
    if smc {
        // SAFETY: SMCCC: the callee may clobber x0-x17 (clobber_abi), nothing
        // else; an UNDEF returns through crate::exc with x0 unchanged.
        unsafe {
            asm!("smc #0", inlateout("x0") fid => r, inlateout("x1") a1 => _, inlateout("x2") a2 => _,
                 inlateout("x3") a3 => _, clobber_abi("C"), options(nostack))
        }
    } else {
        // SAFETY: as above, through HVC.
        unsafe {
            asm!("hvc #0", inlateout("x0") fid => r, inlateout("x1") a1 => _, inlateout("x2") a2 => _,
                 inlateout("x3") a3 => _, clobber_abi("C"), options(nostack))
        }
    }
    r
}
