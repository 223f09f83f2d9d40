//! `mrs`/`msr` for system registers, by name.

/// Reads a system register by its assembler name.
#[macro_export]
macro_rules! read_sysreg {
    ($name:expr) => {{
        let v: u64;
        // SAFETY: reading a system register has no side effects on memory.
        unsafe { core::arch::asm!(concat!("mrs {0}, ", $name), out(reg) v, options(nomem, nostack, preserves_flags)) };
        v
    }};
}

/// Writes a system register by its assembler name.
#[macro_export]
macro_rules! write_sysreg {
    ($name:expr, $v:expr) => {{
        let v: u64 = $v;
        // SAFETY: callers write EL2 or guest EL1 registers that configure
        // translation, traps or guest state; each call site documents why the
        // value is valid there.
        unsafe { core::arch::asm!(concat!("msr ", $name, ", {0}"), in(reg) v, options(nostack, preserves_flags)) };
    }};
}

#[inline(always)]
pub fn isb() {
    // SAFETY: a barrier.
    unsafe { core::arch::asm!("isb", options(nostack, preserves_flags)) };
}

#[inline(always)]
pub fn dsb_sy() {
    // SAFETY: a barrier.
    unsafe { core::arch::asm!("dsb sy", options(nostack, preserves_flags)) };
}

#[inline(always)]
pub fn dsb_ish() {
    // SAFETY: a barrier.
    unsafe { core::arch::asm!("dsb ish", options(nostack, preserves_flags)) };
}

/// Waits for an interrupt with interrupts masked (PSTATE.I stays set: the
/// pending interrupt is taken by reading ICC_IAR1_EL1 afterwards).
#[inline(always)]
pub fn wfi() {
    // SAFETY: waits for an event; no memory effects.
    unsafe { core::arch::asm!("dsb sy", "wfi", options(nostack, preserves_flags)) };
}

/// Invalidates all stage-1 and stage-2 TLB entries for the current VMID
/// (VTTBR_EL2 must hold it) on the inner shareable domain.
pub fn tlbi_vmalls12e1is() {
    // SAFETY: TLB maintenance only.
    unsafe { core::arch::asm!("dsb ishst", "tlbi vmalls12e1is", "dsb ish", "isb", options(nostack, preserves_flags)) };
}

/// The index of this pCPU (set at boot in TPIDR_EL2's per-CPU block).
pub fn mpidr() -> u64 {
    read_sysreg!("mpidr_el1")
}

macro_rules! id_reg_read {
    ($crm:expr, $op2:expr; $($c:literal),*) => {
        match ($crm, $op2) {
            $(
                ($c, 0) => read_sysreg!(concat!("s3_0_c0_c", stringify!($c), "_0")),
                ($c, 1) => read_sysreg!(concat!("s3_0_c0_c", stringify!($c), "_1")),
                ($c, 2) => read_sysreg!(concat!("s3_0_c0_c", stringify!($c), "_2")),
                ($c, 3) => read_sysreg!(concat!("s3_0_c0_c", stringify!($c), "_3")),
                ($c, 4) => read_sysreg!(concat!("s3_0_c0_c", stringify!($c), "_4")),
                ($c, 5) => read_sysreg!(concat!("s3_0_c0_c", stringify!($c), "_5")),
                ($c, 6) => read_sysreg!(concat!("s3_0_c0_c", stringify!($c), "_6")),
                ($c, 7) => read_sysreg!(concat!("s3_0_c0_c", stringify!($c), "_7")),
            )*
            _ => 0,
        }
    };
}

/// Reads the ID register at op0=3, op1=0, CRn=0, `crm` (1..=7), `op2` at
/// EL2 (unallocated encodings in this space read as zero).
pub fn read_id_reg(crm: u8, op2: u8) -> u64 {
    id_reg_read!(crm, op2; 1, 2, 3, 4, 5, 6, 7)
}
