//! The EL2 stage-1 identity map.
//!
//! One level-1 table of 1 GiB blocks covers the 39-bit (512 GiB) physical
//! space: blocks the platform names as device windows are Device-nGnRE and
//! execute-never, the rest Normal write-back. It is built before any lock or
//! heap use (exclusives on Device memory are IMPLEMENTATION DEFINED, and
//! with the MMU off all data accesses are Device), using only aligned
//! 64-bit stores.

use super::sysreg;
use crate::regs::{SCTLR_EL2_RES1, TCR_EL2_RES1};
use aarch64_cpu::registers::{MAIR_EL2, SCTLR_EL2, TCR_EL2, TTBR0_EL2};
use tock_registers::interfaces::{Readable, Writeable};
use tock_registers::register_bitfields;

register_bitfields! {u64,
    /// A stage-1 level-1 block descriptor (4 KiB granule: 1 GiB blocks).
    BLOCK [
        /// Execute-never at EL2.
        XN OFFSET(54) NUMBITS(1) [],
        /// Output address bits [38:30] (this map covers 39 bits).
        OUTPUT OFFSET(30) NUMBITS(9) [],
        AF OFFSET(10) NUMBITS(1) [],
        SH OFFSET(8) NUMBITS(2) [
            Inner = 0b11
        ],
        /// MAIR_EL2 attribute index.
        AttrIndx OFFSET(2) NUMBITS(3) [
            Device = 1,
            Normal = 2
        ],
        TYPE OFFSET(1) NUMBITS(1) [
            Block = 0
        ],
        VALID OFFSET(0) NUMBITS(1) []
    ]
}

#[repr(C, align(4096))]
struct Table([u64; 512]);

static mut L1: Table = Table([0; 512]);

/// Input address bits: T0SZ = 64 - 39.
const VA_BITS: u64 = 39;

/// Builds the identity map and turns the MMU and caches on.
/// `is_device(gib)` says whether the 1 GiB block at `gib` GiB is a device window.
///
/// # Safety
///
/// Call once, on the primary CPU, with the MMU off and before any other CPU
/// runs [`enable_secondary`]: the table is written through a `&mut` to a
/// static that nothing else may be using.
pub unsafe fn enable(is_device: impl Fn(u64) -> bool) {
    // SAFETY: the caller guarantees that this is the only reference to L1
    // (once, primary, before secondaries read it).
    let table = unsafe { &mut *core::ptr::addr_of_mut!(L1) };
    for (i, e) in table.0.iter_mut().enumerate() {
        let gib = i as u64;
        let desc = if is_device(gib) {
            BLOCK::OUTPUT.val(gib) + BLOCK::AttrIndx::Device + BLOCK::AF::SET + BLOCK::XN::SET
        } else {
            BLOCK::OUTPUT.val(gib) + BLOCK::AttrIndx::Normal + BLOCK::AF::SET + BLOCK::SH::Inner
        };
        *e = (desc + BLOCK::TYPE::Block + BLOCK::VALID::SET).value;
    }
    enable_secondary();
}

/// Turns the MMU on with the table the primary CPU built.
pub fn enable_secondary() {
    let root = core::ptr::addr_of!(L1) as u64;
    // 0 = Device-nGnRnE, 1 = Device-nGnRE, 2 = Normal write-back
    // non-transient read/write-allocate.
    MAIR_EL2.write(
        MAIR_EL2::Attr0_Device::nonGathering_nonReordering_noEarlyWriteAck
            + MAIR_EL2::Attr1_Device::nonGathering_nonReordering_EarlyWriteAck
            + MAIR_EL2::Attr2_Normal_Outer::WriteBack_NonTransient_ReadWriteAlloc
            + MAIR_EL2::Attr2_Normal_Inner::WriteBack_NonTransient_ReadWriteAlloc,
    );
    // 39-bit VA, 4 KiB granule, write-back inner-shareable walks, 40-bit PA.
    TCR_EL2.write(
        TCR_EL2_RES1
            + TCR_EL2::PS::Bits_40
            + TCR_EL2::TG0::KiB_4
            + TCR_EL2::SH0::Inner
            + TCR_EL2::ORGN0::WriteBack_ReadAlloc_WriteAlloc_Cacheable
            + TCR_EL2::IRGN0::WriteBack_ReadAlloc_WriteAlloc_Cacheable
            + TCR_EL2::T0SZ.val(64 - VA_BITS),
    );
    TTBR0_EL2.set(root);
    // SAFETY: invalidates stale EL2 translations before the MMU goes on;
    // the identity map keeps every address the code uses where it was.
    unsafe { core::arch::asm!("dsb sy", "tlbi alle2", "dsb sy", "isb", options(nostack)) };
    let _ = SCTLR_EL2.get();
    SCTLR_EL2.write(
        SCTLR_EL2_RES1
            + SCTLR_EL2::EOS::IsSynch
            + SCTLR_EL2::EIS::IsSynch
            + SCTLR_EL2::M::Enable
            + SCTLR_EL2::C::Cacheable
            + SCTLR_EL2::SA::Enable
            + SCTLR_EL2::I::Cacheable,
    );
    sysreg::isb();
}
