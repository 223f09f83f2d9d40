//! The arm64 Image header and the entry points.
//!
//! The binary starts with the 64-byte arm64 Image header (Linux
//! Documentation/arch/arm64/booting.rst), so QEMU's `-kernel`, U-Boot's
//! `booti` and TF-A's BL33 load it like a kernel and pass the DTB in x0.
//! The primary CPU zeroes BSS, takes stack 0 and calls
//! `crate::runtime::primary_main(dtb)`. Secondaries come in through
//! `secondary_entry` from PSCI CPU_ON with their index in x0.

pub const STACK_SIZE: usize = 64 * 1024;
pub const MAX_CPUS: usize = 8;

#[repr(C, align(4096))]
pub struct Stacks(pub [[u8; STACK_SIZE]; MAX_CPUS]);

#[no_mangle]
pub static mut HV_STACKS: Stacks = Stacks([[0; STACK_SIZE]; MAX_CPUS]);

core::arch::global_asm!(
    r#"
    .section .text.head, "ax"
    .global _start
_start:
    b       primary_entry
    .long   0
    .quad   0                       // text_offset
    .quad   __image_size            // image_size, BSS included
    .quad   0xa                     // LE, 4 KiB pages, anywhere in RAM
    .quad   0
    .quad   0
    .quad   0
    .ascii  "ARM\x64"
    .long   0

primary_entry:
    msr     daifset, #0xf
    mov     x19, x0
    mrs     x1, CurrentEL
    cmp     x1, #(2 << 2)
    b.ne    park
    adrp    x1, __bss_start
    add     x1, x1, :lo12:__bss_start
    adrp    x2, __bss_end
    add     x2, x2, :lo12:__bss_end
1:  cmp     x1, x2
    b.hs    2f
    stp     xzr, xzr, [x1], #16
    b       1b
2:  mov     x0, #0
    bl      set_stack
    mov     x0, x19
    bl      hv_primary_main
park:
    wfe
    b       park

    .global secondary_entry
secondary_entry:
    msr     daifset, #0xf
    mov     x19, x0
    bl      set_stack
    mov     x0, x19
    bl      hv_secondary_main
    b       park

// sp = HV_STACKS + (x0 + 1) * STACK_SIZE; clobbers x1, x2.
set_stack:
    adrp    x1, HV_STACKS
    add     x1, x1, :lo12:HV_STACKS
    add     x2, x0, #1
    mov     x3, #{stack_size}
    madd    x1, x2, x3, x1
    mov     sp, x1
    ret
"#,
    stack_size = const STACK_SIZE,
);
