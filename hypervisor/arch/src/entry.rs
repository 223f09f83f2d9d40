//! The arm64 Image header, the PE/COFF header and the entry points.
//!
//! The binary starts with the 64-byte arm64 Image header (Linux
//! Documentation/arch/arm64/booting.rst), so QEMU's `-kernel`, U-Boot's
//! `booti` and TF-A's BL33 load it like a kernel. Like Linux's EFI stub it
//! is also a PE/COFF image: its first instruction encodes "MZ", offset 0x3c
//! points at the PE header in the first page, and UEFI firmware starts it
//! at `efi_entry` as an EFI application (runtime/uefi/), which ends by
//! restarting the image at `primary_entry` with the MMU off. The header is
//! written here in assembly from linker-script symbols rather than by a
//! post-processing tool or the `aarch64-unknown-uefi` target (hard-float,
//! a second binary): one binary, and xtask's `pe_pad` only checks it and
//! pads the file to the sections' raw size. The boot registers x0..x3
//! go to `hypervisor::runtime::primary_main` unchanged: which of them holds the
//! DTB depends on the firmware (`hv_machine::boot::handoff`).
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
//! zeroes BSS, takes the boot stack and calls Rust. Secondaries come in
//! through `secondary_entry` from PSCI CPU_ON, after the primary relocated
//! the image, with x0 (the context ID) = the top of the stack the primary
//! allocated for them from the heap, their pCPU index stored in its top 16
//! bytes (`runtime::boot::bring_up`; no fixed CPU count, see
//! `hv_machine::boot::pcpus`).

pub use crate::limits::STACK_SIZE;

/// pCPU 0's stack; the secondaries' come from the heap.
#[repr(C, align(4096))]
pub struct BootStack(pub [u8; STACK_SIZE]);

#[no_mangle]
pub static mut HV_BOOT_STACK: BootStack = BootStack([0; STACK_SIZE]);

core::arch::global_asm!(
    r#"
    .section .text.head, "ax"
    .global _start
_start:
    .inst   0xfa405a4d              // "MZ": ccmp x18, #0, #0xd, pl (flags only)
    b       primary_entry
    .quad   0                       // text_offset (2 MiB-aligned base)
    .quad   __image_size            // image_size, BSS included
    .quad   0xa                     // LE, 4 KiB pages, anywhere in RAM
    .quad   0
    .quad   0
    .quad   0
    .ascii  "ARM\x64"
    .long   .Lpe_header - _start    // PE/COFF: the "PE\0\0" signature

    // PE/COFF header (Microsoft PE format; UEFI 2.10 section 2.1.1), as
    // Linux's arm64 EFI stub lays it out. Image offsets are RVAs (the image
    // is one block, file offset = RVA). Section .text: 0x1000 up to
    // .rodata, executable; section .data: .rodata up to the image end (BSS
    // as uninitialised tail), writable: every relocation the entry code
    // applies is there (xtask's elf_to_flat checks it). No .reloc: ImageBase
    // is 0 and the image relocates itself (efi_entry).
    .balign 8
.Lpe_header:
    .ascii  "PE\0\0"
    .short  0xaa64                  // Machine: AArch64
    .short  2                       // NumberOfSections
    .long   0                       // TimeDateStamp
    .long   0                       // PointerToSymbolTable
    .long   0                       // NumberOfSymbols
    .short  .Lsection_table - .Loptional_header
    .short  0x206                   // EXECUTABLE_IMAGE | LINE_NUMS_STRIPPED | DEBUG_STRIPPED
.Loptional_header:
    .short  0x20b                   // PE32+
    .byte   0, 0                    // linker version
    .long   __pe_text_size          // SizeOfCode
    .long   __pe_data_file_size     // SizeOfInitializedData
    .long   0                       // SizeOfUninitializedData
    .long   efi_entry - _start      // AddressOfEntryPoint
    .long   {pe_header_size}        // BaseOfCode
    .quad   0                       // ImageBase
    .long   {pe_section_align}      // SectionAlignment
    .long   {pe_file_align}         // FileAlignment
    .short  0, 0                    // OS version
    .short  0, 0                    // image version
    .short  0, 0                    // subsystem version
    .long   0                       // Win32VersionValue
    .long   __image_size            // SizeOfImage
    .long   {pe_header_size}        // SizeOfHeaders
    .long   0                       // CheckSum
    .short  10                      // Subsystem: EFI application
    .short  0                       // DllCharacteristics
    .quad   0, 0, 0, 0              // stack and heap reserve/commit
    .long   0                       // LoaderFlags
    .long   6                       // NumberOfRvaAndSizes
    .quad   0, 0, 0, 0, 0, 0        // data directories: none (no .reloc)
.Lsection_table:
    .ascii  ".text\0\0\0"
    .long   __pe_text_size          // VirtualSize
    .long   {pe_header_size}        // VirtualAddress
    .long   __pe_text_size          // SizeOfRawData
    .long   {pe_header_size}        // PointerToRawData
    .long   0, 0                    // relocations, line numbers
    .short  0, 0
    .long   0x60000020              // CNT_CODE | MEM_EXECUTE | MEM_READ
    .ascii  ".data\0\0\0"
    .long   __pe_data_virt_size     // VirtualSize (BSS included)
    .long   __pe_data_offset        // VirtualAddress
    .long   __pe_data_file_size     // SizeOfRawData
    .long   __pe_data_offset        // PointerToRawData
    .long   0, 0
    .short  0, 0
    .long   0xc0000040              // CNT_INITIALIZED_DATA | MEM_READ | MEM_WRITE

    // The code starts on the page after the headers (PE section .text).
    .balign {pe_header_size}
primary_entry:
    msr     daifset, #0xf
    mov     x19, x0
    mov     x20, x1
    mov     x21, x2
    mov     x22, x3
    mrs     x4, CurrentEL
    cmp     x4, #(2 << 2)
    b.ne    park
    bl      apply_relocations
    cbnz    x0, park                // cannot happen: xtask checked the ELF
    bl      zero_bss
    adrp    x1, HV_BOOT_STACK
    add     x1, x1, :lo12:HV_BOOT_STACK
    mov     x2, #{stack_size}
    add     sp, x1, x2
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
    // x0 = the stack's top; the pCPU index is in the 16 bytes below it
    // (written and cleaned to the point of coherency by the primary: the
    // MMU is off here, so this load reads memory).
    sub     sp, x0, #16
    ldr     x0, [sp]
    bl      hv_secondary_main
    b       park

// Applies .rela.dyn for the address the image runs at; x0 = 0, or 1 on a
// relocation that is not R_AARCH64_RELATIVE. Clobbers x9..x15. Applying it
// twice is harmless: each place gets addend + delta, whatever it held.
apply_relocations:
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
    mov     x0, #0
    // Elf64_Rela: r_offset, r_info, r_addend.
1:  cmp     x11, x12
    b.hs    2f
    ldp     x13, x14, [x11], #16
    ldr     x15, [x11], #8
    cmp     x14, #{r_aarch64_relative}
    b.ne    3f
    add     x15, x15, x9
    str     x15, [x13, x9]
    b       1b
3:  mov     x0, #1
2:  ret

// Zeroes BSS; clobbers x1, x2.
zero_bss:
    adrp    x1, __bss_start
    add     x1, x1, :lo12:__bss_start
    adrp    x2, __bss_end
    add     x2, x2, :lo12:__bss_end
1:  cmp     x1, x2
    b.hs    2f
    stp     xzr, xzr, [x1], #16
    b       1b
2:  ret

// The PE/COFF entry point: EDK2 (UEFI) calls it as an EFI application,
// `EFI_STATUS efi_main(EFI_HANDLE image, EFI_SYSTEM_TABLE *st)` (AAPCS64),
// at EL2 with the MMU and caches on (the firmware's identity map), on the
// firmware's stack, with x30 the return address. It relocates the image
// where EDK2 loaded it (stores through the identity map into the PE .data
// section, which is writable), zeroes BSS and calls `hv_efi_main`
// (runtime/uefi/), which returns an EFI status only when it fails before
// ExitBootServices; otherwise it leaves through `efi_to_primary`.
    .global efi_entry
efi_entry:
    stp     x29, x30, [sp, #-32]!
    mov     x29, sp
    stp     x19, x20, [sp, #16]
    mov     x19, x0
    mov     x20, x1
    bl      apply_relocations
    cbnz    x0, 1f
    bl      zero_bss
    mov     x0, x19
    mov     x1, x20
    bl      hv_efi_main
    b       2f
1:  movz    x0, #0x8000, lsl #48    // EFI_LOAD_ERROR (high bit | 1)
    orr     x0, x0, #1
2:  ldp     x19, x20, [sp, #16]
    ldp     x29, x30, [sp], #32
    ret

// After ExitBootServices: masks exceptions, turns the EL2 MMU and caches
// off (the caller cleaned and invalidated the image to the point of
// coherency), discards stale instructions and translations, and starts the
// image again at primary_entry as if loaded by `-kernel`, with x0..x3 = 0
// (the EFI hand-off is in .data, which neither relocation nor BSS clearing
// touches). Identity-mapped code keeps running at the same address.
    .global efi_to_primary
efi_to_primary:
    msr     daifset, #0xf
    mrs     x0, sctlr_el2
    bic     x0, x0, #(1 << 0)       // M
    bic     x0, x0, #(1 << 2)       // C
    bic     x0, x0, #(1 << 12)      // I
    msr     sctlr_el2, x0
    isb
    ic      iallu
    tlbi    alle2
    dsb     sy
    isb
    mov     x0, #0
    mov     x1, #0
    mov     x2, #0
    mov     x3, #0
    b       primary_entry
"#,
    stack_size = const STACK_SIZE,
    r_aarch64_relative = const R_AARCH64_RELATIVE,
    pe_header_size = const PE_HEADER_SIZE,
    pe_section_align = const PE_SECTION_ALIGN,
    pe_file_align = const PE_FILE_ALIGN,
);

/// The first page holds the arm64 Image and PE/COFF headers; the PE
/// section .text starts after it.
pub const PE_HEADER_SIZE: usize = 0x1000;
/// PE section alignment: pages (the image's sections are page-aligned).
pub const PE_SECTION_ALIGN: usize = 0x1000;
/// PE file alignment: the smallest the format allows.
pub const PE_FILE_ALIGN: usize = 0x200;

/// The only relocation type the image has (`r_info` with symbol 0).
pub const R_AARCH64_RELATIVE: u64 = 1027;
