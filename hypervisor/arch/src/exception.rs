//! EL2 exception vectors and the guest entry/exit path.
//!
//! The hypervisor runs with interrupts masked. A guest runs until it traps:
//! `guest_enter` saves the hypervisor's callee-saved registers and stack
//! pointer in this CPU's [`CpuRun`] block (TPIDR_EL2), loads the guest's
//! general registers and `eret`s. Any exception from a lower EL stores the
//! guest's registers into the [`GuestRegs`] the block points to, restores the
//! hypervisor's registers and returns from `guest_enter` with the exception
//! kind, so traps are handled as ordinary Rust code on the hypervisor stack.
//! An exception taken at EL2 itself is a hypervisor bug: it is reported and
//! the CPU stops (except an SError inside the exit path's window, below).
//!
//! SError synchronisation at exit: an asynchronous SError the guest caused
//! (a write to failing memory, say) may still be in flight when the guest
//! traps for another reason. Left alone it would be taken at the next guest
//! entry, charged to whichever vCPU that is, perhaps another VM's. So the
//! exit path finds it while it is still the exiting vCPU's, as KVM does:
//! every lower-EL vector starts with ESB, which on a CPU with FEAT_RAS
//! defers a pending physical SError into DISR_EL1 (SErrors are masked at
//! EL2); the common exit path reads DISR_EL1 and clears it. Without
//! FEAT_RAS (ESB is a NOP there) it waits for outstanding accesses (DSB SY;
//! ISB), looks at ISR_EL1.A, and only if an SError is pending opens a
//! one-instruction window with SErrors unmasked to take it (the EL2 SError
//! vector recognises the window and returns). Either way the exit returns
//! with [`SERROR_AT_EXIT`] set in its kind and the caller injects a virtual
//! SError into that vCPU. Cost on the common path: ESB plus 4 instructions
//! with FEAT_RAS, ESB plus 6 (one DSB, one ISB) without.
//!
//! Then, before the exit path's first indirect branch, the pCPU's
//! branch-predictor hardening runs (`crate::mitigations`): nothing (2
//! instructions) on CPUs that need none, else firmware's workaround call,
//! CLRBHB, or the Spectre-BHB branch loop.

use aarch64_cpu::registers::{TPIDR_EL2, VBAR_EL2};
use tock_registers::interfaces::{Readable, Writeable};

/// The guest's general-purpose registers, ELR_EL2 and SPSR_EL2.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GuestRegs {
    pub x: [u64; 31],
    pub elr: u64,
    pub spsr: u64,
}

impl GuestRegs {
    /// General register `r` as a trapped instruction names it (ESR's SRT,
    /// Rt): 31 is XZR there, and reads as 0.
    pub fn reg(&self, r: u8) -> u64 {
        if r == 31 {
            0
        } else {
            self.x[usize::from(r)]
        }
    }

    /// Writes general register `r` (31, XZR, discards the value).
    pub fn set_reg(&mut self, r: u8, v: u64) {
        if r != 31 {
            self.x[usize::from(r)] = v;
        }
    }
}

/// Per-CPU block addressed by TPIDR_EL2; the layout is used by assembly.
#[repr(C)]
pub struct CpuRun {
    pub guest: *mut GuestRegs,
    pub host_sp: u64,
    pub host_regs: [u64; 12],
    /// Non-zero: this CPU has FEAT_RAS (DISR_EL1 exists, ESB defers).
    pub ras: u64,
    /// DISR_EL1 of the last exit that found a deferred SError.
    pub disr: u64,
    /// What every exit runs against branch-predictor attacks
    /// (`crate::mitigations::ExitMitigation::encode`).
    pub exit_mitigation: u64,
}

impl Default for CpuRun {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuRun {
    pub const fn new() -> Self {
        Self { guest: core::ptr::null_mut(), host_sp: 0, host_regs: [0; 12], ras: 0, disr: 0, exit_mitigation: 0 }
    }
}

/// Bit of `guest_enter`'s result: an SError was pending at the exit (see
/// the module documentation).
const SERROR_AT_EXIT: u64 = 4;

/// How the guest exited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitKind {
    Sync,
    Irq,
    Fiq,
    SError,
}

extern "C" {
    fn guest_enter(regs: *mut GuestRegs) -> u64;
    static el2_vectors: u8;
}

/// An exit: its kind and, when an SError was pending at the exit (it is
/// the exiting vCPU's), its syndrome: DISR_EL1 on a CPU with FEAT_RAS, 0
/// without (the SError was taken, nothing describes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestExit {
    pub kind: ExitKind,
    pub serror: Option<u64>,
}

/// Installs the vector table and this CPU's run block; every exit runs
/// `exit_mitigation` (`crate::mitigations::ExitMitigation::encode`).
pub fn init_cpu(run: &'static mut CpuRun, exit_mitigation: u64) {
    run.ras = u64::from(super::el2::has_ras());
    run.exit_mitigation = exit_mitigation;
    // Only the address of the linker-placed vector table is taken.
    let vbar = core::ptr::addr_of!(el2_vectors) as u64;
    VBAR_EL2.set(vbar);
    // The run block is this CPU's for good (`'static mut`): the exit path
    // reaches it through TPIDR_EL2.
    TPIDR_EL2.set(run as *mut CpuRun as u64);
    super::sysreg::isb();
}

/// Runs the guest until its next exit.
pub fn run_guest(regs: &mut GuestRegs) -> GuestExit {
    // SAFETY: `guest_enter` saves and restores every callee-saved register
    // and the stack pointer (see the assembly below), and the registers it
    // loads come from `regs`, which stays borrowed for the call.
    let r = unsafe { guest_enter(regs) };
    let kind = match r & 3 {
        0 => ExitKind::Sync,
        1 => ExitKind::Irq,
        2 => ExitKind::Fiq,
        _ => ExitKind::SError,
    };
    let serror = (r & SERROR_AT_EXIT != 0).then(|| {
        let run = TPIDR_EL2.get() as *const CpuRun;
        // SAFETY: TPIDR_EL2 holds this CPU's run block (`init_cpu`), which
        // lives for good; the exit path wrote `disr` before returning and
        // nothing else writes it while this CPU runs here.
        unsafe { core::ptr::addr_of!((*run).disr).read() }
    });
    GuestExit { kind, serror }
}

// An exception taken from EL2 itself branches to `el2_fatal(kind, esr,
// elr, far)`, which the layer above defines (`runtime`): the vectors only
// name the symbol, so `arch` does not depend on what reports the fault.

core::arch::global_asm!(
    r#"
.macro GUEST_EXIT kind
    hint    #16                     // ESB: defer a pending SError (FEAT_RAS)
    stp     x0, x1, [sp, #-16]!
    mrs     x0, tpidr_el2
    ldr     x0, [x0]
    stp     x2, x3, [x0, #16]
    stp     x4, x5, [x0, #32]
    stp     x6, x7, [x0, #48]
    stp     x8, x9, [x0, #64]
    stp     x10, x11, [x0, #80]
    stp     x12, x13, [x0, #96]
    stp     x14, x15, [x0, #112]
    stp     x16, x17, [x0, #128]
    stp     x18, x19, [x0, #144]
    stp     x20, x21, [x0, #160]
    stp     x22, x23, [x0, #176]
    stp     x24, x25, [x0, #192]
    stp     x26, x27, [x0, #208]
    stp     x28, x29, [x0, #224]
    ldp     x2, x3, [sp], #16
    stp     x2, x3, [x0, #0]
    mrs     x2, elr_el2
    mrs     x3, spsr_el2
    stp     x30, x2, [x0, #240]
    str     x3, [x0, #256]
    mov     x0, #\kind
    b       guest_exit_common
.endm

.macro EL2_SERROR
    // Only expected inside the exit path's window, where SErrors are
    // unmasked for one instruction: flag the exit and go back.
    mrs     x5, elr_el2
    adr     x6, serror_window
    cmp     x5, x6
    adr     x6, serror_window_end
    ccmp    x5, x6, #4, ne
    b.ne    1f
    orr     x0, x0, #{serror}
    eret
1:
    EL2_FATAL 3
.endm

.macro EL2_FATAL kind
    mov     x0, #\kind
    mrs     x1, esr_el2
    mrs     x2, elr_el2
    mrs     x3, far_el2
    b       el2_fatal
.endm

    .section .text.vectors, "ax"
    .balign 2048
    .global el2_vectors
el2_vectors:
    .balign 128
    EL2_FATAL 0
    .balign 128
    EL2_FATAL 1
    .balign 128
    EL2_FATAL 2
    .balign 128
    EL2_SERROR
    .balign 128
    EL2_FATAL 0
    .balign 128
    EL2_FATAL 1
    .balign 128
    EL2_FATAL 2
    .balign 128
    EL2_SERROR
    .balign 128
    GUEST_EXIT 0
    .balign 128
    GUEST_EXIT 1
    .balign 128
    GUEST_EXIT 2
    .balign 128
    GUEST_EXIT 3
    .balign 128
    GUEST_EXIT 0
    .balign 128
    GUEST_EXIT 1
    .balign 128
    GUEST_EXIT 2
    .balign 128
    GUEST_EXIT 3

    .text
guest_exit_common:
    mrs     x1, tpidr_el2
    // SError synchronisation (module documentation). x0 = kind; x1 = the
    // run block; x2-x18 are free (the guest's are saved).
    ldr     x2, [x1, #112]          // CpuRun.ras
    cbz     x2, 2f
    mrs     x2, s3_0_c12_c1_1       // DISR_EL1: what ESB deferred
    cbz     x2, 3f
    str     x2, [x1, #120]          // CpuRun.disr
    msr     s3_0_c12_c1_1, xzr
    orr     x0, x0, #{serror}
    b       3f
2:
    dsb     sy                      // outstanding accesses complete
    isb
    mrs     x2, isr_el1
    tbz     x2, #8, 3f              // ISR_EL1.A: no SError pending
    str     xzr, [x1, #120]
    mrs     x3, esr_el2             // the exit's syndrome, which the
    mrs     x4, far_el2             // SError exception overwrites
    msr     daifclr, #4
serror_window:
    isb
serror_window_end:
    msr     daifset, #4
    msr     esr_el2, x3
    msr     far_el2, x4
3:
    // Branch-predictor hardening, before the first indirect branch (the
    // `ret` below): CpuRun.exit_mitigation, 0 = none, bit 63 = SMC with
    // that function ID (ARCH_WORKAROUND_1/3), 1 = CLRBHB, k = a loop of k
    // taken branches (Spectre-BHB).
    ldr     x2, [x1, #128]
    cbz     x2, 6f
    tbz     x2, #63, 4f
    mov     x5, x0                  // the kind (SMCCC 1.1 keeps x4-x17)
    mov     w0, w2
    smc     #0
    mov     x0, x5
    mrs     x1, tpidr_el2
    b       6f
4:
    cmp     x2, #1
    b.ne    5f
    hint    #22                     // CLRBHB
    isb
    b       6f
5:
    b       . + 4
    subs    x2, x2, #1
    b.ne    5b
    dsb     nsh
    isb
6:
    ldr     x2, [x1, #8]
    mov     sp, x2
    ldp     x19, x20, [x1, #16]
    ldp     x21, x22, [x1, #32]
    ldp     x23, x24, [x1, #48]
    ldp     x25, x26, [x1, #64]
    ldp     x27, x28, [x1, #80]
    ldp     x29, x30, [x1, #96]
    ret

    .global guest_enter
guest_enter:
    mrs     x1, tpidr_el2
    str     x0, [x1]
    mov     x2, sp
    str     x2, [x1, #8]
    stp     x19, x20, [x1, #16]
    stp     x21, x22, [x1, #32]
    stp     x23, x24, [x1, #48]
    stp     x25, x26, [x1, #64]
    stp     x27, x28, [x1, #80]
    stp     x29, x30, [x1, #96]
    ldr     x2, [x0, #248]
    ldr     x3, [x0, #256]
    msr     elr_el2, x2
    msr     spsr_el2, x3
    ldp     x2, x3, [x0, #16]
    ldp     x4, x5, [x0, #32]
    ldp     x6, x7, [x0, #48]
    ldp     x8, x9, [x0, #64]
    ldp     x10, x11, [x0, #80]
    ldp     x12, x13, [x0, #96]
    ldp     x14, x15, [x0, #112]
    ldp     x16, x17, [x0, #128]
    ldp     x18, x19, [x0, #144]
    ldp     x20, x21, [x0, #160]
    ldp     x22, x23, [x0, #176]
    ldp     x24, x25, [x0, #192]
    ldp     x26, x27, [x0, #208]
    ldp     x28, x29, [x0, #224]
    ldr     x30, [x0, #240]
    ldp     x0, x1, [x0, #0]
    eret

"#,
    serror = const SERROR_AT_EXIT,
);
