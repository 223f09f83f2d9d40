//! The arm64 Image header and the entry points.
//!
//! The binary starts with the 64-byte arm64 Image header (Linux
//! Documentation/arch/arm64/booting.rst), so QEMU's `-kernel`, U-Boot's
//! `booti` and TF-A's BL33 load it like a kernel. The boot registers x0..x3
//! go to `crate::runtime::primary_main` unchanged: which of them holds the
//! DTB depends on the firmware (`crate::boot::handoff`).
//!
//! The image is position-independent (linked `--pie`, see
//! linker/hypervisor.ld): it runs wherever it is loaded on a 2 MiB boundary.
//! Before any Rust code runs, the primary CPU applies the image's own
//! relocations: every .rela.dyn entry is R_AARCH64_RELATIVE (xtask's
//! `elf_to_flat` refuses anything else, and any relocation of the code), so
//! each one is `*(offset + delta) = addend + delta`, with `delta` = where
//! `_start` runs minus where it was linked. The MMU is off, so these are
//! plain stores to memory (aligned 64-bit: the places are pointers), the
//! same as the BSS clearing that follows; the image was cleaned to the
//! point of coherency by its loader (the arm64 boot protocol). Then it
//! zeroes BSS, takes stack 0 and calls Rust. Secondaries come in through
//! `secondary_entry` from PSCI CPU_ON with their index in x0, after the
//! primary relocated the image.

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
    .quad   0                       // text_offset (2 MiB-aligned base)
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
    mov     x20, x1
    mov     x21, x2
    mov     x22, x3
    mrs     x4, CurrentEL
    cmp     x4, #(2 << 2)
    b.ne    park
    // x9 = delta: where _start runs minus where it was linked (an absolute
    // symbol, so the movz/movk need no relocation themselves).
    adr     x9, _start
    movz    x10, #:abs_g3:__image_link_base
    movk    x10, #:abs_g2_nc:__image_link_base
    movk    x10, #:abs_g1_nc:__image_link_base
    movk    x10, #:abs_g0_nc:__image_link_base
    sub     x9, x9, x10
    adrp    x11, __rela_start
    add     x11, x11, :lo12:__rela_start
    adrp    x12, __rela_end
    add     x12, x12, :lo12:__rela_end
    // Elf64_Rela: r_offset, r_info, r_addend.
3:  cmp     x11, x12
    b.hs    4f
    ldp     x13, x14, [x11], #16
    ldr     x15, [x11], #8
    cmp     x14, #{r_aarch64_relative}
    b.ne    park                    // cannot happen: xtask checked the ELF
    add     x15, x15, x9
    str     x15, [x13, x9]
    b       3b
4:  adrp    x1, __bss_start
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
    mov     x1, x20
    mov     x2, x21
    mov     x3, x22
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
    r_aarch64_relative = const R_AARCH64_RELATIVE,
);

/// The only relocation type the image has (`r_info` with symbol 0).
pub const R_AARCH64_RELATIVE: u64 = 1027;
