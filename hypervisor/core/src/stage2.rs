//! Stage-2 translation tables (IPA -> PA) for one VM.
//!
//! 4 KiB granule. The IPA size is chosen at boot ([`IpaSize::choose`]) from
//! what the CPU implements (ID_AA64MMFR0_EL1.PARange) and what the platform
//! needs Dom0 to reach (RAM, MMIO windows, ECAM; all of the physical address
//! space for an ACPI Dom0, whose devices are found on demand):
//!
//! * 39 bits, walked from level 1 (VTCR_EL2.T0SZ=25, SL0=1): one 4 KiB root
//!   table; enough for RAM and the low device windows of QEMU virt and FVP.
//! * 40 to 48 bits, walked from level 0 (T0SZ=64-bits, SL0=2): still one 4 KiB
//!   root table, one more level in the walk. QEMU virt's high PCIe window at
//!   0x80_0000_0000 (512 GiB) needs 40 bits; Graviton's devices sit higher.
//!
//! Level-0 start rather than concatenated level-1 roots (KVM's choice for 40
//! to 43 bits): the root stays a single frame, so [`TableAlloc`] hands out
//! nothing but 4 KiB frames and the walk code is the same for every size;
//! the price is one more table lookup on a TLB miss. The architecture
//! allows a level-0 start with the 4 KiB granule only when the implemented
//! PA size is at least 44 bits (AArch64.S2InvalidSL), so on a CPU with 40 or
//! 42 bits of PA the IPA stays at 39 bits and what lies above is out of
//! range (a 64-bit PCIe window up there is trimmed from Dom0's view). The
//! output size (VTCR_EL2.PS) is PARange itself, at most 48 bits.
//! Large aligned ranges use 1 GiB / 2 MiB blocks, the rest 4 KiB pages.
//!
//! The table builder is written here rather than taken from `aarch64-paging`
//! because the hypervisor needs a VMID per VM, walks (`translate`) for
//! validating guest addresses, and host tests over fake memory; the logic is a
//! hundred lines. Table memory comes through [`TableAlloc`], so the host tests
//! run it over a `Vec` and the EL2 build over the frame allocator.

use aarch64_cpu::registers::{VTCR_EL2, VTTBR_EL2};
use tock_registers::LocalRegisterCopy;

/// Errors while building stage-2 tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage2Error {
    /// Address or size not 4 KiB aligned.
    Unaligned,
    /// Beyond the VM's IPA space (or a PA beyond 48 bits).
    OutOfRange,
    /// The range overlaps an existing mapping.
    AlreadyMapped,
    /// No memory for a table.
    NoMemory,
    /// A table address the allocator did not hand out (a corrupted table).
    UnknownTable,
}

/// Memory type of a stage-2 mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemType {
    /// Normal, inner/outer write-back cacheable, inner shareable: guest RAM.
    Normal,
    /// Device-nGnRE, execute-never: passthrough device registers.
    Device,
}

/// Where table frames come from.
pub trait TableAlloc {
    /// A zeroed, 4 KiB aligned frame; returns its physical address.
    fn alloc_table(&mut self) -> Option<u64>;
    /// The table at physical address `pa`, as 512 descriptors, if `pa` is a
    /// frame this allocator handed out.
    fn table(&mut self, pa: u64) -> Option<&mut [u64; 512]>;
}

/// The IPA space of a VM's stage 2: 39 bits (level-1 start) or 40 to 48
/// bits (level-0 start). See the module doc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpaSize {
    bits: u32,
}

impl IpaSize {
    /// 39 bits from level 1: the size every CPU supports here.
    pub const DEFAULT: IpaSize = IpaSize { bits: 39 };
    /// The largest: 48 bits (52 would need FEAT_LPA/LPA2 descriptors).
    pub const MAX_BITS: u32 = 48;

    /// `bits` of IPA, if this builder supports it (39..=48).
    pub const fn new(bits: u32) -> Option<IpaSize> {
        if bits >= 39 && bits <= Self::MAX_BITS {
            Some(IpaSize { bits })
        } else {
            None
        }
    }

    /// The smallest IPA size that reaches `needed_top` (the end of the
    /// highest range the VM must see) on a CPU with `pa_bits` of physical
    /// address ([`pa_bits`]): 39 bits when that is enough or when the CPU
    /// cannot start a walk at level 0 (PA < 44 bits); else the bits needed,
    /// at most the PA size and 48. What does not fit is out of range.
    pub fn choose(pa_bits: u32, needed_top: u64) -> IpaSize {
        let need = 64 - needed_top.saturating_sub(1).leading_zeros();
        if need <= 39 || pa_bits < 44 {
            return Self::DEFAULT;
        }
        IpaSize { bits: need.min(pa_bits).min(Self::MAX_BITS) }
    }

    pub const fn bits(self) -> u32 {
        self.bits
    }

    /// One past the highest IPA.
    pub const fn limit(self) -> u64 {
        1 << self.bits
    }

    /// The level the walk starts at.
    pub const fn start_level(self) -> u32 {
        if self.bits <= 39 {
            1
        } else {
            0
        }
    }
}

/// Physical address bits of an ID_AA64MMFR0_EL1.PARange encoding (an
/// unknown encoding counts as the largest this builder knows, 48).
pub const fn pa_bits(parange: u64) -> u32 {
    match parange {
        0 => 32,
        1 => 36,
        2 => 40,
        3 => 42,
        4 => 44,
        _ => 48,
    }
}
const PAGE: u64 = 4096;
const DESC_VALID: u64 = 1;
const DESC_TABLE: u64 = 0b11;
const DESC_BLOCK: u64 = 0b01;
const DESC_PAGE: u64 = 0b11;
const AF: u64 = 1 << 10;
const SH_INNER: u64 = 0b11 << 8;
const S2AP_RW: u64 = 0b11 << 6;
const MEMATTR_NORMAL_WB: u64 = 0b1111 << 2;
const MEMATTR_DEVICE_NGNRE: u64 = 0b0001 << 2;
const XN: u64 = 0b10 << 53;
const ADDR_MASK: u64 = 0x0000_ffff_ffff_f000;

/// VTCR_EL2 for an IPA space of `ipa` with a 4 KiB granule and write-back
/// inner-shareable table walks, on a CPU whose ID_AA64MMFR0_EL1.PARange is
/// `parange`: PS = PARange (at most 48 bits), T0SZ and SL0 from `ipa`.
pub fn vtcr(ipa: IpaSize, parange: u64) -> LocalRegisterCopy<u64, VTCR_EL2::Register> {
    let sl0 = if ipa.start_level() == 0 { VTCR_EL2::SL0::Granule4KBLevel0 } else { VTCR_EL2::SL0::Granule4KBLevel1 };
    let v = VTCR_EL2::RES1::SET
        + VTCR_EL2::PS.val(parange.min(5))
        + VTCR_EL2::TG0::Granule4KB
        + VTCR_EL2::SH0::Inner
        + VTCR_EL2::ORGN0::NormalWBRAWA
        + VTCR_EL2::IRGN0::NormalWBRAWA
        + sl0
        + VTCR_EL2::T0SZ.val(64 - u64::from(ipa.bits));
    LocalRegisterCopy::new(v.value)
}

/// VTTBR_EL2 value for a root table and VMID.
pub fn vttbr(root: u64, vmid: u16) -> LocalRegisterCopy<u64, VTTBR_EL2::Register> {
    // BADDR holds the table address from bit 1 up.
    let v = VTTBR_EL2::VMID.val(u64::from(vmid)) + VTTBR_EL2::BADDR.val((root & ADDR_MASK) >> 1);
    LocalRegisterCopy::new(v.value)
}

fn leaf_attrs(mem: MemType) -> u64 {
    match mem {
        MemType::Normal => AF | SH_INNER | S2AP_RW | MEMATTR_NORMAL_WB,
        MemType::Device => AF | S2AP_RW | MEMATTR_DEVICE_NGNRE | XN,
    }
}

/// Level shift: level 0 = 512 GiB, 1 = 1 GiB, 2 = 2 MiB, 3 = 4 KiB.
const fn shift(level: u32) -> u32 {
    12 + 9 * (3 - level)
}

/// Where a walk ended.
enum Walk {
    /// A block or page descriptor and the size it maps.
    Leaf(u64, u64),
    /// No mapping: the entry at this level is invalid.
    Empty(u32),
}

/// One VM's stage-2 tables.
pub struct Stage2 {
    root: u64,
    ipa: IpaSize,
}

impl Stage2 {
    pub fn new(alloc: &mut impl TableAlloc, ipa: IpaSize) -> Result<Self, Stage2Error> {
        let root = alloc.alloc_table().ok_or(Stage2Error::NoMemory)?;
        Ok(Self { root, ipa })
    }

    /// Its IPA space (for VTCR_EL2: [`vtcr`]).
    pub fn ipa(&self) -> IpaSize {
        self.ipa
    }

    /// Physical address of the root table (for VTTBR_EL2).
    pub fn root(&self) -> u64 {
        self.root
    }

    /// Maps `[ipa, ipa+size)` to `[pa, pa+size)`.
    pub fn map(
        &mut self,
        alloc: &mut impl TableAlloc,
        ipa: u64,
        pa: u64,
        size: u64,
        mem: MemType,
    ) -> Result<(), Stage2Error> {
        if !ipa.is_multiple_of(PAGE) || !pa.is_multiple_of(PAGE) || !size.is_multiple_of(PAGE) {
            return Err(Stage2Error::Unaligned);
        }
        let end = ipa.checked_add(size).ok_or(Stage2Error::OutOfRange)?;
        if end > self.ipa.limit() || pa.checked_add(size).is_none_or(|e| e > 1 << 48) {
            return Err(Stage2Error::OutOfRange);
        }
        // Refuse overlaps up front so a failed map leaves nothing half done.
        // An empty entry at level l leaves its whole 2^shift(l) block free,
        // so the probe steps by blocks: a 256 MiB ECAM window in an empty
        // 1 GiB slot is one step, not 65536.
        let mut probe = ipa;
        while probe < end {
            match self.walk(alloc, probe) {
                Walk::Leaf(..) => return Err(Stage2Error::AlreadyMapped),
                Walk::Empty(level) => probe = (probe | ((1 << shift(level)) - 1)) + 1,
            }
        }
        let mut off = 0;
        while off < size {
            let (cur_ipa, cur_pa) = (ipa + off, pa + off);
            let left = size - off;
            let level = (1..=3)
                .find(|&l| {
                    let s = 1u64 << shift(l);
                    cur_ipa % s == 0 && cur_pa % s == 0 && left >= s
                })
                .unwrap_or(3);
            self.set_leaf(alloc, cur_ipa, cur_pa, level, mem)?;
            off += 1 << shift(level);
        }
        Ok(())
    }

    fn set_leaf(
        &mut self,
        alloc: &mut impl TableAlloc,
        ipa: u64,
        pa: u64,
        level: u32,
        mem: MemType,
    ) -> Result<(), Stage2Error> {
        let mut table = self.root;
        for l in self.ipa.start_level()..level {
            let idx = ((ipa >> shift(l)) & 511) as usize;
            let desc = alloc.table(table).ok_or(Stage2Error::UnknownTable)?[idx];
            table = if desc & DESC_VALID == 0 {
                let next = alloc.alloc_table().ok_or(Stage2Error::NoMemory)?;
                alloc.table(table).ok_or(Stage2Error::UnknownTable)?[idx] = next | DESC_TABLE;
                next
            } else if desc & 0b11 == DESC_TABLE {
                desc & ADDR_MASK
            } else {
                return Err(Stage2Error::AlreadyMapped);
            };
        }
        let idx = ((ipa >> shift(level)) & 511) as usize;
        let kind = if level == 3 { DESC_PAGE } else { DESC_BLOCK };
        alloc.table(table).ok_or(Stage2Error::UnknownTable)?[idx] = (pa & ADDR_MASK) | leaf_attrs(mem) | kind;
        Ok(())
    }

    /// The leaf descriptor covering `ipa` and the size of its block.
    fn walk_leaf(&self, alloc: &mut impl TableAlloc, ipa: u64) -> Option<(u64, u64)> {
        match self.walk(alloc, ipa) {
            Walk::Leaf(desc, size) => Some((desc, size)),
            Walk::Empty(_) => None,
        }
    }

    /// Walks `ipa` down to its leaf, or to the level whose entry is empty.
    /// An address outside the IPA space or a table the allocator does not
    /// know counts as empty at the root level (nothing the walk can map).
    fn walk(&self, alloc: &mut impl TableAlloc, ipa: u64) -> Walk {
        let start = self.ipa.start_level();
        if ipa >= self.ipa.limit() {
            return Walk::Empty(start);
        }
        let mut table = self.root;
        for level in start..=3 {
            let Some(t) = alloc.table(table) else {
                return Walk::Empty(level);
            };
            let desc = t[((ipa >> shift(level)) & 511) as usize];
            if desc & DESC_VALID == 0 {
                return Walk::Empty(level);
            }
            if level == 3 || desc & 0b11 == DESC_BLOCK {
                return Walk::Leaf(desc, 1 << shift(level));
            }
            table = desc & ADDR_MASK;
        }
        Walk::Empty(3)
    }

    /// Translates an IPA to (PA, memory type), or `None` when unmapped.
    pub fn translate(&self, alloc: &mut impl TableAlloc, ipa: u64) -> Option<(u64, MemType)> {
        let (desc, size) = self.walk_leaf(alloc, ipa)?;
        let pa = (desc & ADDR_MASK & !(size - 1)) | (ipa & (size - 1));
        let mem = if desc & (0b1111 << 2) == MEMATTR_NORMAL_WB { MemType::Normal } else { MemType::Device };
        Some((pa, mem))
    }
}

#[cfg(test)]
// Register values are written field by field, zero fields included.
#[allow(clippy::identity_op)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[derive(Default)]
    struct FakeMem {
        tables: HashMap<u64, Box<[u64; 512]>>,
        next: u64,
        limit: usize,
    }

    impl TableAlloc for FakeMem {
        fn alloc_table(&mut self) -> Option<u64> {
            if self.limit != 0 && self.tables.len() >= self.limit {
                return None;
            }
            self.next += PAGE;
            let pa = 0x7000_0000 + self.next;
            self.tables.insert(pa, Box::new([0; 512]));
            Some(pa)
        }
        fn table(&mut self, pa: u64) -> Option<&mut [u64; 512]> {
            self.tables.get_mut(&pa).map(|t| &mut **t)
        }
    }

    #[test]
    fn identity_ram_uses_blocks() {
        let mut m = FakeMem::default();
        let mut s2 = Stage2::new(&mut m, IpaSize::DEFAULT).unwrap();
        s2.map(&mut m, 0x4000_0000, 0x4000_0000, 0x4000_0000, MemType::Normal).unwrap();
        // A single 1 GiB block: only the root table exists.
        assert_eq!(m.tables.len(), 1);
        assert_eq!(s2.translate(&mut m, 0x4123_4567), Some((0x4123_4567, MemType::Normal)));
        assert_eq!(s2.translate(&mut m, 0x8000_0000), None);
    }

    /// QEMU virt's PCIe windows: the 256 MiB ECAM at 257 GiB is 128 2 MiB
    /// blocks under one level-2 table; the 32-bit window ends off a 2 MiB
    /// boundary (pages for the tail); the I/O window is 16 pages. The
    /// overlap probe still catches a page inside a block.
    #[test]
    fn pcie_windows_use_blocks_and_overlaps_are_refused() {
        let mut m = FakeMem::default();
        let mut s2 = Stage2::new(&mut m, IpaSize::DEFAULT).unwrap();
        s2.map(&mut m, 0x40_1000_0000, 0x40_1000_0000, 0x1000_0000, MemType::Device).unwrap();
        assert_eq!(m.tables.len(), 2, "root + one level-2 table of 2 MiB blocks");
        s2.map(&mut m, 0x1000_0000, 0x1000_0000, 0x2eff_0000, MemType::Device).unwrap();
        s2.map(&mut m, 0x3eff_0000, 0x3eff_0000, 0x1_0000, MemType::Device).unwrap();
        // One more level-2 table for 0..1 GiB and one level-3 table for the
        // last 2 MiB of the 32-bit window and the I/O window.
        assert_eq!(m.tables.len(), 4);
        assert_eq!(s2.translate(&mut m, 0x40_1fff_fffc), Some((0x40_1fff_fffc, MemType::Device)));
        assert_eq!(s2.translate(&mut m, 0x3eff_fff0), Some((0x3eff_fff0, MemType::Device)));
        assert_eq!(s2.translate(&mut m, 0x3f00_0000), None);
        assert_eq!(s2.translate(&mut m, 0x40_2000_0000), None);
        for (ipa, size) in [(0x40_1fff_f000, PAGE), (0x40_0000_0000, 0x2000_0000), (0x3eff_f000, 0x2000)] {
            assert_eq!(s2.map(&mut m, ipa, ipa, size, MemType::Device), Err(Stage2Error::AlreadyMapped), "{ipa:#x}");
        }
        assert_eq!(m.tables.len(), 4, "a refused map allocates nothing");
        // The 64-bit window at 512 GiB is beyond the 39-bit IPA space.
        assert_eq!(
            s2.map(&mut m, 0x80_0000_0000, 0x80_0000_0000, 0x1000_0000, MemType::Device),
            Err(Stage2Error::OutOfRange)
        );
    }

    #[test]
    fn mixed_sizes_and_device_pages() {
        let mut m = FakeMem::default();
        let mut s2 = Stage2::new(&mut m, IpaSize::DEFAULT).unwrap();
        s2.map(&mut m, 0x0a00_0000, 0x0a00_0000, 0x4000, MemType::Device).unwrap();
        s2.map(&mut m, 0x6020_0000, 0x9000_0000, 0x20_3000, MemType::Normal).unwrap();
        assert_eq!(s2.translate(&mut m, 0x0a00_3e10), Some((0x0a00_3e10, MemType::Device)));
        assert_eq!(s2.translate(&mut m, 0x0a00_4000), None);
        assert_eq!(s2.translate(&mut m, 0x6020_0008), Some((0x9000_0008, MemType::Normal)));
        assert_eq!(s2.translate(&mut m, 0x6040_2fff), Some((0x9020_2fff, MemType::Normal)));
        assert_eq!(s2.translate(&mut m, 0x6040_3000), None);
    }

    #[test]
    fn bad_requests_are_errors() {
        let mut m = FakeMem::default();
        let mut s2 = Stage2::new(&mut m, IpaSize::DEFAULT).unwrap();
        assert_eq!(s2.map(&mut m, 0x1001, 0x1000, 0x1000, MemType::Normal), Err(Stage2Error::Unaligned));
        assert_eq!(s2.map(&mut m, 1 << 39, 0, 0x1000, MemType::Normal), Err(Stage2Error::OutOfRange));
        assert_eq!(s2.map(&mut m, u64::MAX & !0xfff, 0, 0x2000, MemType::Normal), Err(Stage2Error::OutOfRange));
        s2.map(&mut m, 0x20_0000, 0x20_0000, 0x20_0000, MemType::Normal).unwrap();
        assert_eq!(s2.map(&mut m, 0x30_0000, 0x30_0000, 0x1000, MemType::Normal), Err(Stage2Error::AlreadyMapped));
        assert_eq!(s2.translate(&mut m, u64::MAX), None);
    }

    #[test]
    fn out_of_table_memory_is_an_error() {
        let mut m = FakeMem { limit: 2, ..Default::default() };
        let mut s2 = Stage2::new(&mut m, IpaSize::DEFAULT).unwrap();
        assert_eq!(s2.map(&mut m, 0x1000, 0x1000, 0x1000, MemType::Normal), Err(Stage2Error::NoMemory));
    }

    #[test]
    fn tables_from_another_allocator_are_refused() {
        // The allocator only lends out frames it handed out: tables built
        // with one cannot be walked through another.
        let mut a = FakeMem::default();
        let mut s2 = Stage2::new(&mut a, IpaSize::DEFAULT).unwrap();
        s2.map(&mut a, 0x4000_0000, 0x4000_0000, 0x20_0000, MemType::Normal).unwrap();
        let mut b = FakeMem::default();
        assert_eq!(s2.translate(&mut b, 0x4000_0000), None);
        assert_eq!(s2.map(&mut b, 0x1000, 0x1000, 0x1000, MemType::Normal), Err(Stage2Error::UnknownTable));
    }

    /// Every IPA size from 40 to 48 bits walks from level 0: the top page
    /// and a 1 GiB block at the top of the space map and translate, QEMU
    /// virt's 64-bit PCIe window fits from 40 bits, and the first byte past
    /// the space (and a range crossing it) is out of range.
    #[test]
    fn level0_sizes_map_high_and_refuse_beyond() {
        for bits in 40..=48 {
            let ipa = IpaSize::new(bits).unwrap();
            let mut m = FakeMem::default();
            let mut s2 = Stage2::new(&mut m, ipa).unwrap();
            let top = ipa.limit();
            s2.map(&mut m, top - PAGE, 0x9000_0000, PAGE, MemType::Device).unwrap();
            assert_eq!(s2.translate(&mut m, top - 8), Some((0x9000_0ff8, MemType::Device)), "{bits}");
            assert_eq!(m.tables.len(), 4, "{bits}: root (level 0) + levels 1, 2, 3");
            s2.map(&mut m, top - (2 << 30), top - (2 << 30), 1 << 30, MemType::Normal).unwrap();
            assert_eq!(m.tables.len(), 4, "{bits}: a 1 GiB block in the existing level-1 table");
            assert_eq!(
                s2.translate(&mut m, top - (2 << 30) + 0x1234),
                Some((top - (2 << 30) + 0x1234, MemType::Normal))
            );
            assert_eq!(s2.translate(&mut m, top - (1 << 30)), None);
            s2.map(&mut m, 0x80_0000_0000, 0x80_0000_0000, 0x1000_0000, MemType::Device).unwrap();
            assert_eq!(s2.translate(&mut m, 0x80_0fff_fff0), Some((0x80_0fff_fff0, MemType::Device)), "{bits}");
            // Low addresses still work (RAM at 1 GiB).
            s2.map(&mut m, 0x4000_0000, 0x4000_0000, 0x4000_0000, MemType::Normal).unwrap();
            assert_eq!(s2.translate(&mut m, 0x7fff_fff8), Some((0x7fff_fff8, MemType::Normal)));
            assert_eq!(s2.map(&mut m, top, top, PAGE, MemType::Device), Err(Stage2Error::OutOfRange), "{bits}");
            assert_eq!(s2.map(&mut m, top - PAGE, 0, 2 * PAGE, MemType::Device), Err(Stage2Error::OutOfRange));
            assert_eq!(s2.translate(&mut m, top), None);
            assert_eq!(s2.translate(&mut m, u64::MAX), None);
            let v = vtcr(ipa, 5);
            assert_eq!(v.read(VTCR_EL2::T0SZ), u64::from(64 - bits));
            assert_eq!(v.read(VTCR_EL2::SL0), 2, "walk starts at level 0");
            assert_eq!(v.read(VTCR_EL2::PS), 5);
        }
    }

    /// 39 bits: out of range from 512 GiB, as before.
    #[test]
    fn level1_size_refuses_the_high_window() {
        let mut m = FakeMem::default();
        let mut s2 = Stage2::new(&mut m, IpaSize::DEFAULT).unwrap();
        s2.map(&mut m, (1 << 39) - PAGE, (1 << 39) - PAGE, PAGE, MemType::Device).unwrap();
        assert_eq!(s2.translate(&mut m, (1 << 39) - 1), Some(((1 << 39) - 1, MemType::Device)));
        assert_eq!(m.tables.len(), 3, "root (level 1) + levels 2, 3");
        assert_eq!(s2.map(&mut m, 1 << 39, 1 << 39, PAGE, MemType::Device), Err(Stage2Error::OutOfRange));
    }

    #[test]
    fn ipa_size_choice() {
        let gib = 1u64 << 30;
        // Enough with 39 bits: 39 whatever the CPU.
        assert_eq!(IpaSize::choose(48, 4 * gib).bits(), 39);
        assert_eq!(IpaSize::choose(48, 1 << 39).bits(), 39);
        assert_eq!(IpaSize::choose(36, 4 * gib).bits(), 39);
        // QEMU virt's 64-bit PCIe window ends at 1 TiB: 40 bits.
        assert_eq!(IpaSize::choose(48, 0x100_0000_0000).bits(), 40);
        assert_eq!(IpaSize::choose(44, 0x100_0000_0001).bits(), 41);
        // All of a 48-bit PA space (an ACPI Dom0).
        assert_eq!(IpaSize::choose(48, 1 << 48).bits(), 48);
        // Capped by the PA size and by 48; no level-0 walk below 44 bits of PA.
        assert_eq!(IpaSize::choose(44, 1 << 47).bits(), 44);
        assert_eq!(IpaSize::choose(52, u64::MAX).bits(), 48);
        assert_eq!(IpaSize::choose(42, 0x100_0000_0000).bits(), 39);
        assert_eq!(IpaSize::choose(40, 0x100_0000_0000).bits(), 39);
        assert_eq!(IpaSize::choose(48, 0).bits(), 39);
        assert_eq!(IpaSize::new(38), None);
        assert_eq!(IpaSize::new(49), None);
        assert_eq!([0, 1, 2, 3, 4, 5, 6, 15].map(pa_bits), [32, 36, 40, 42, 44, 48, 48, 48]);
    }

    #[test]
    fn vtcr_and_vttbr_fields() {
        let v = vtcr(IpaSize::DEFAULT, 2);
        assert_eq!(v.read(VTCR_EL2::T0SZ), 25);
        assert_eq!(v.read(VTCR_EL2::SL0), 1, "walk starts at level 1");
        assert_eq!(v.read(VTCR_EL2::PS), 2);
        assert_eq!(v.read(VTCR_EL2::TG0), 0, "4 KiB granule");
        // The value the raw-bits version produced.
        assert_eq!(v.get(), 0x8002_3559);
        assert_eq!(vttbr(0x4123_4000, 3).get(), (3 << 48) | 0x4123_4000);
        assert_eq!(vttbr(0x4123_4000, 3).read(VTTBR_EL2::VMID), 3);
    }
}
