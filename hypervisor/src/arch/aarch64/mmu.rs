//! The EL2 stage-1 identity map.
//!
//! One level-1 table of 1 GiB blocks covers the 39-bit (512 GiB) physical
//! space: blocks the platform names as device windows are Device-nGnRE and
//! execute-never, the rest Normal write-back. It is built before any lock or
//! heap use (exclusives on Device memory are IMPLEMENTATION DEFINED, and
//! with the MMU off all data accesses are Device), using only aligned
//! 64-bit stores.

use crate::{read_sysreg, write_sysreg};

#[repr(C, align(4096))]
struct Table([u64; 512]);

static mut L1: Table = Table([0; 512]);

const ATTR_DEVICE: u64 = 1 << 2; // MAIR index 1
const ATTR_NORMAL: u64 = 2 << 2; // MAIR index 2
const AF: u64 = 1 << 10;
const SH_INNER: u64 = 3 << 8;
const XN: u64 = 1 << 54;
const BLOCK: u64 = 0b01;

/// MAIR: 0 = Device-nGnRnE, 1 = Device-nGnRE, 2 = Normal WB RW-allocate.
const MAIR: u64 = 0x00 | (0x04 << 8) | (0xff << 16);
/// TCR_EL2: T0SZ=25 (39-bit), WBWA, inner shareable, 4 KiB, PS=40-bit.
const TCR: u64 = (1 << 31) | (1 << 23) | (2 << 16) | (3 << 12) | (1 << 10) | (1 << 8) | 25;
/// SCTLR_EL2: RES1 bits, M, C, SA, I.
const SCTLR: u64 = 0x30c5_0830 | (1 << 0) | (1 << 2) | (1 << 3) | (1 << 12);

/// Builds the identity map and turns the MMU and caches on.
/// `is_device(gib)` says whether the 1 GiB block at `gib` GiB is a device window.
pub fn enable(is_device: impl Fn(u64) -> bool) {
    // SAFETY: runs once per CPU with the MMU off before anything else uses L1;
    // secondaries call `enable_secondary` which only reads it.
    let table = unsafe { &mut *core::ptr::addr_of_mut!(L1) };
    for (i, e) in table.0.iter_mut().enumerate() {
        let pa = (i as u64) << 30;
        *e = if is_device(i as u64) {
            pa | ATTR_DEVICE | AF | XN | BLOCK
        } else {
            pa | ATTR_NORMAL | AF | SH_INNER | BLOCK
        };
    }
    enable_secondary();
}

/// Turns the MMU on with the table the primary CPU built.
pub fn enable_secondary() {
    let root = core::ptr::addr_of!(L1) as u64;
    write_sysreg!("mair_el2", MAIR);
    write_sysreg!("tcr_el2", TCR);
    write_sysreg!("ttbr0_el2", root);
    // SAFETY: invalidates stale EL2 translations before enabling.
    unsafe { core::arch::asm!("dsb sy", "tlbi alle2", "dsb sy", "isb", options(nostack)) };
    let _ = read_sysreg!("sctlr_el2");
    write_sysreg!("sctlr_el2", SCTLR);
    super::sysreg::isb();
}
