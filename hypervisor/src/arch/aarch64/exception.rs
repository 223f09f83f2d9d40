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
//! the CPU stops.

use aarch64_cpu::registers::{TPIDR_EL2, VBAR_EL2};
use tock_registers::interfaces::Writeable;

/// The guest's general-purpose registers, ELR_EL2 and SPSR_EL2.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GuestRegs {
    pub x: [u64; 31],
    pub elr: u64,
    pub spsr: u64,
}

/// Per-CPU block addressed by TPIDR_EL2; the layout is used by assembly.
#[repr(C)]
pub struct CpuRun {
    pub guest: *mut GuestRegs,
    pub host_sp: u64,
    pub host_regs: [u64; 12],
}

impl Default for CpuRun {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuRun {
    pub const fn new() -> Self {
        Self { guest: core::ptr::null_mut(), host_sp: 0, host_regs: [0; 12] }
    }
}

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

/// Installs the vector table and this CPU's run block.
pub fn init_cpu(run: &'static mut CpuRun) {
    // Only the address of the linker-placed vector table is taken.
    let vbar = core::ptr::addr_of!(el2_vectors) as u64;
    VBAR_EL2.set(vbar);
    // The run block is this CPU's for good (`'static mut`): the exit path
    // reaches it through TPIDR_EL2.
    TPIDR_EL2.set(run as *mut CpuRun as u64);
    super::sysreg::isb();
}

/// Runs the guest until its next exit.
pub fn run_guest(regs: &mut GuestRegs) -> ExitKind {
    // SAFETY: `guest_enter` saves and restores every callee-saved register
    // and the stack pointer (see the assembly below), and the registers it
    // loads come from `regs`, which stays borrowed for the call.
    let kind = unsafe { guest_enter(regs) };
    match kind {
        0 => ExitKind::Sync,
        1 => ExitKind::Irq,
        2 => ExitKind::Fiq,
        _ => ExitKind::SError,
    }
}

#[no_mangle]
extern "C" fn el2_fatal(kind: u64, esr: u64, elr: u64, far: u64) -> ! {
    crate::runtime::fatal(kind, esr, elr, far)
}

core::arch::global_asm!(
    r#"
.macro GUEST_EXIT kind
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
    EL2_FATAL 3
    .balign 128
    EL2_FATAL 0
    .balign 128
    EL2_FATAL 1
    .balign 128
    EL2_FATAL 2
    .balign 128
    EL2_FATAL 3
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

"#
);
