//! Data cache maintenance by virtual address.

use super::sysreg::{self, CTR_EL0};
use crate::regs;
use tock_registers::interfaces::Readable;

/// The smallest data cache line in bytes (CTR_EL0.DminLine, in words).
fn dcache_line() -> u64 {
    4 << CTR_EL0.read(regs::CTR_EL0::DminLine)
}

/// Cleans `[start, start + len)` to the point of coherency, so a guest
/// running with its MMU and caches off sees what the hypervisor wrote.
pub fn clean_to_poc(start: u64, len: u64) {
    let line = dcache_line();
    let end = start.saturating_add(len);
    let mut p = start & !(line - 1);
    while p < end {
        // SAFETY: `dc cvac` writes a dirty line back to memory without
        // changing what any address holds, so no Rust-visible state changes
        // whatever the address. (An address outside the EL2 identity map
        // would fault and stop the hypervisor, not corrupt it; callers pass
        // RAM.)
        unsafe { core::arch::asm!("dc cvac, {0}", in(reg) p, options(nostack, preserves_flags)) };
        p += line;
    }
    sysreg::dsb_sy();
}

/// Cleans and invalidates `[start, start + len)` to the point of
/// coherency: memory gets every dirty line and the caches keep none, so
/// whatever is written with the MMU (caches) off is what is read after.
pub fn clean_inval_to_poc(start: u64, len: u64) {
    let line = dcache_line();
    let end = start.saturating_add(len);
    let mut p = start & !(line - 1);
    while p < end {
        // SAFETY: `dc civac` writes a dirty line back before dropping it,
        // so what each address holds does not change (callers pass RAM of
        // the identity map, as for `clean_to_poc`).
        unsafe { core::arch::asm!("dc civac, {0}", in(reg) p, options(nostack, preserves_flags)) };
        p += line;
    }
    sysreg::dsb_sy();
}
