//! A VM's MMIO bus: which emulated device answers a trapped guest access.
//!
//! Why a table and not a chain that asks each device in turn whether an
//! address is its own: registrations are checked against each other, so two
//! devices can never claim one address (a chain would silently let the first
//! win), and a lookup is a binary search whatever the number of devices.
//!
//! Like Bao's `vm_emul_add_mem`: a sorted list of non-overlapping
//! guest-physical ranges, each mapped to an entry `H`; a lookup returns the
//! entry and the offset of the access inside the range. The bus is built
//! when the VM is created and read-only afterwards, so the run loop reads it
//! without a lock.
//!
//! `H` is generic so that one validated structure serves both layers: the
//! VM plan (hv-machine) builds an `MmioBus<Device>` to refuse overlaps
//! before anything is applied, and the EL2 runtime builds one whose entries
//! are the devices' own handlers (`runtime::devices`), each device
//! registering its ranges, so a trapped access is a lookup and one call.
//! Every entry names its [`Device`] ([`BusEntry`]), which errors report.

use core::fmt;

/// An emulated device a guest-physical range belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The vGIC: the distributor frame and the redistributor frames.
    Vgic,
    /// The hypervisor's virtio-blk (virtio-mmio frame).
    VirtioBlk,
    /// The emulated PL011.
    Vpl011,
    /// The vITS control frame (GITS_CTLR ...; 64 KiB).
    Vits,
    /// A DomU's virtual PCIe host bridge's ECAM (`vpci::VirtualEcam`).
    Vpci,
    /// The ECAM page of a function assigned to a DomU, in Dom0's view of
    /// the host bridge: an empty slot (reads all-ones, writes ignored).
    PciHidden,
    /// Dom0's control device's register page (`control`, docs/hvctl.md).
    Control,
}

/// A guest-physical range `[base, base + size)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmioRange {
    pub base: u64,
    pub size: u64,
}

impl MmioRange {
    pub const fn new(base: u64, size: u64) -> Self {
        Self { base, size }
    }

    /// The last address in the range (`None` when empty or wrapping).
    fn last(&self) -> Option<u64> {
        self.size.checked_sub(1).and_then(|s| self.base.checked_add(s))
    }
}

impl fmt::Display for MmioRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.last() {
            Some(l) => write!(f, "{:#x}-{:#x}", self.base, l),
            None => write!(f, "{:#x}+{:#x}", self.base, self.size),
        }
    }
}

/// What a bus range maps to: anything small and `Copy` that says which
/// device it belongs to (the errors name it).
pub trait BusEntry: Copy {
    fn device(&self) -> Device;
}

impl BusEntry for Device {
    fn device(&self) -> Device {
        *self
    }
}

/// Why a range was not registered.
#[derive(thiserror::Error, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusError {
    /// `new` (for `device`) overlaps `existing` (of `owner`).
    #[error("MMIO range {new} ({device:?}) overlaps {existing} ({owner:?})")]
    Overlap { new: MmioRange, device: Device, existing: MmioRange, owner: Device },
    /// Size 0, or the range runs past the top of the address space.
    #[error("MMIO range {0} is empty or wraps")]
    BadRange(MmioRange),
    /// A planned range of `device` that no handler was registered for.
    #[error("MMIO range {range} ({device:?}) has no handler")]
    Unclaimed { range: MmioRange, device: Device },
}

/// Sorted, non-overlapping guest-physical ranges → `H` (a [`Device`] by
/// default).
pub struct MmioBus<H: BusEntry = Device> {
    ranges: alloc::vec::Vec<(MmioRange, H)>,
}

impl<H: BusEntry> Default for MmioBus<H> {
    fn default() -> Self {
        Self { ranges: alloc::vec::Vec::new() }
    }
}

impl<H: BusEntry> MmioBus<H> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `range` for `entry`; refused when it overlaps a registered one.
    pub fn register(&mut self, range: MmioRange, entry: H) -> Result<(), BusError> {
        let last = range.last().ok_or(BusError::BadRange(range))?;
        // The first registered range that starts after `range`'s base.
        let i = self.ranges.partition_point(|(r, _)| r.base <= range.base);
        let device = entry.device();
        let clash = |(r, d): &(MmioRange, H)| BusError::Overlap { new: range, device, existing: *r, owner: d.device() };
        if let Some(prev) = i.checked_sub(1).map(|p| &self.ranges[p]) {
            if prev.0.last().is_some_and(|l| l >= range.base) {
                return Err(clash(prev));
            }
        }
        if let Some(next) = self.ranges.get(i) {
            if next.0.base <= last {
                return Err(clash(next));
            }
        }
        self.ranges.insert(i, (range, entry));
        Ok(())
    }

    /// The entry at `ipa` and the offset of `ipa` inside its range.
    #[inline]
    pub fn lookup(&self, ipa: u64) -> Option<(H, u64)> {
        self.search(ipa).map(|(_, d, off)| (d, off))
    }

    /// The binary search behind both lookups: the index of the range
    /// holding `ipa`, its entry and the offset.
    #[inline]
    fn search(&self, ipa: u64) -> Option<(usize, H, u64)> {
        let i = self.ranges.partition_point(|(r, _)| r.base <= ipa).checked_sub(1)?;
        let (r, d) = self.ranges[i];
        let off = ipa - r.base;
        (off < r.size).then_some((i, d, off))
    }

    /// [`lookup`](Self::lookup), trying first the range at index `*hint`
    /// (the one this caller found last: a guest polls one device at a
    /// time), and leaving there the index of the range found. Any `hint`
    /// is correct, only slower when it names another range.
    #[inline]
    pub fn lookup_hinted(&self, ipa: u64, hint: &mut usize) -> Option<(H, u64)> {
        if let Some(&(r, d)) = self.ranges.get(*hint) {
            // Below the base wraps to an offset no range has.
            let off = ipa.wrapping_sub(r.base);
            if off < r.size {
                return Some((d, off));
            }
        }
        let (i, d, off) = self.search(ipa)?;
        *hint = i;
        Some((d, off))
    }

    /// The registered ranges, lowest first.
    pub fn ranges(&self) -> impl Iterator<Item = (MmioRange, H)> + '_ {
        self.ranges.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;
    use alloc::vec::Vec;

    const GICD: MmioRange = MmioRange::new(0x0800_0000, 0x1_0000);
    const GITS: MmioRange = MmioRange::new(0x0808_0000, 0x1_0000);
    const GICR: MmioRange = MmioRange::new(0x080a_0000, 0x4_0000);
    const UART: MmioRange = MmioRange::new(0x0900_0000, 0x1000);
    const BLK: MmioRange = MmioRange::new(0x0a00_3e00, 0x200);

    fn qemu_virt() -> MmioBus {
        let mut b = MmioBus::new();
        // Out of address order on purpose.
        b.register(UART, Device::Vpl011).unwrap();
        b.register(GICR, Device::Vgic).unwrap();
        b.register(BLK, Device::VirtioBlk).unwrap();
        b.register(GICD, Device::Vgic).unwrap();
        b.register(GITS, Device::Vits).unwrap();
        b
    }

    #[test]
    fn ranges_are_kept_sorted() {
        let bases: Vec<u64> = qemu_virt().ranges().map(|(r, _)| r.base).collect();
        assert_eq!(bases, [GICD.base, GITS.base, GICR.base, UART.base, BLK.base]);
    }

    #[test]
    fn lookups_at_every_range_edge() {
        let b = qemu_virt();
        for (r, d) in [(GICD, Device::Vgic), (GITS, Device::Vits), (GICR, Device::Vgic), (UART, Device::Vpl011)] {
            assert_eq!(b.lookup(r.base), Some((d, 0)), "{r}");
            assert_eq!(b.lookup(r.base + 4), Some((d, 4)), "{r}");
            assert_eq!(b.lookup(r.base + r.size - 1), Some((d, r.size - 1)), "{r}");
            assert_eq!(b.lookup(r.base + r.size), None, "{r}");
            assert_eq!(b.lookup(r.base - 1), None, "{r}");
        }
        assert_eq!(b.lookup(BLK.base + 0x50), Some((Device::VirtioBlk, 0x50)));
        assert_eq!(b.lookup(BLK.base + 0x200), None);
    }

    #[test]
    fn a_hinted_lookup_answers_as_lookup_whatever_the_hint() {
        let b = qemu_virt();
        let ipas = [0, GICD.base + 8, GICD.base - 1, GITS.base, GICR.base + GICR.size - 1, UART.base + 0x18];
        let ipas = ipas.into_iter().chain([UART.base + UART.size, BLK.base + 0x50, u64::MAX]);
        for ipa in ipas {
            for start in [0, 1, 2, 3, 4, 5, usize::MAX] {
                let mut hint = start;
                assert_eq!(b.lookup_hinted(ipa, &mut hint), b.lookup(ipa), "{ipa:#x} from hint {start}");
                if b.lookup(ipa).is_some() {
                    // The hint now names the range found: the next lookup there
                    // takes it first.
                    let (r, _) = b.ranges().nth(hint).unwrap();
                    assert!(r.base <= ipa && ipa - r.base < r.size, "{ipa:#x}: hint {hint}");
                } else {
                    assert_eq!(hint, start, "a miss leaves the hint");
                }
            }
        }
    }

    #[test]
    fn addresses_outside_all_ranges() {
        let b = qemu_virt();
        for ipa in [0, 0x07ff_ffff, 0x0801_0000, 0x0809_0000, 0x0900_1000, 0x4000_0000, u64::MAX] {
            assert_eq!(b.lookup(ipa), None, "{ipa:#x}");
        }
        assert_eq!(MmioBus::<Device>::new().lookup(0), None);
    }

    #[test]
    fn overlaps_are_refused_naming_both_ranges() {
        let mut b = qemu_virt();
        let cases = [
            (MmioRange::new(GICD.base, 1), GICD),
            (MmioRange::new(GICD.base - 0x1000, 0x1001), GICD),
            (MmioRange::new(GICD.base + GICD.size - 1, 0x10), GICD),
            (MmioRange::new(GICR.base + 0x1000, 0x10), GICR),
            (MmioRange::new(0x0100_0000, 0x1000_0000), GICD),
            (MmioRange::new(BLK.base - 0x200, 0x201), BLK),
        ];
        for (new, existing) in cases {
            let e = b.register(new, Device::Vits).unwrap_err();
            match e {
                BusError::Overlap { new: n, device, existing: x, .. } => {
                    assert_eq!((n, device, x), (new, Device::Vits, existing), "{new}");
                }
                other => panic!("{other:?}"),
            }
        }
        let e = b.register(MmioRange::new(UART.base + 0x800, 0x1000), Device::VirtioBlk).unwrap_err();
        assert_eq!(format!("{e}"), "MMIO range 0x9000800-0x90017ff (VirtioBlk) overlaps 0x9000000-0x9000fff (Vpl011)");
        // Nothing was added: the old layout answers as before.
        assert_eq!(b.ranges().count(), 5);
        assert_eq!(b.lookup(GICD.base - 0x1000), None);
    }

    #[test]
    fn adjacent_ranges_do_not_overlap() {
        let mut b = MmioBus::new();
        b.register(MmioRange::new(0x1000, 0x1000), Device::Vgic).unwrap();
        b.register(MmioRange::new(0x3000, 0x1000), Device::Vpl011).unwrap();
        b.register(MmioRange::new(0x2000, 0x1000), Device::VirtioBlk).unwrap();
        assert_eq!(b.lookup(0x1fff), Some((Device::Vgic, 0xfff)));
        assert_eq!(b.lookup(0x2000), Some((Device::VirtioBlk, 0)));
        assert_eq!(b.lookup(0x3000), Some((Device::Vpl011, 0)));
    }

    #[test]
    fn empty_and_wrapping_ranges_are_refused() {
        let mut b = MmioBus::new();
        for r in [MmioRange::new(0x1000, 0), MmioRange::new(u64::MAX, 2), MmioRange::new(1 << 63, 1 << 63 | 1)] {
            assert_eq!(b.register(r, Device::Vgic), Err(BusError::BadRange(r)));
        }
        // The very top of the address space is a valid range.
        let top = MmioRange::new(u64::MAX - 0xfff, 0x1000);
        b.register(top, Device::Vits).unwrap();
        assert_eq!(b.lookup(u64::MAX), Some((Device::Vits, 0xfff)));
    }

    /// An entry like the runtime's: a function pointer and its device.
    #[derive(Clone, Copy)]
    struct Handler {
        device: Device,
        call: fn(u64) -> u64,
    }

    impl BusEntry for Handler {
        fn device(&self) -> Device {
            self.device
        }
    }

    #[test]
    fn handler_entries_are_found_and_overlaps_name_their_devices() {
        let mut b: MmioBus<Handler> = MmioBus::new();
        b.register(GICD, Handler { device: Device::Vgic, call: |off| off + 1 }).unwrap();
        b.register(UART, Handler { device: Device::Vpl011, call: |off| off * 2 }).unwrap();
        let (h, off) = b.lookup(UART.base + 0x18).unwrap();
        assert_eq!((h.device, (h.call)(off)), (Device::Vpl011, 0x30));
        let (h, off) = b.lookup(GICD.base + 8).unwrap();
        assert_eq!((h.device, (h.call)(off)), (Device::Vgic, 9));
        let e = b.register(MmioRange::new(UART.base, 4), Handler { device: Device::Vits, call: |o| o }).unwrap_err();
        assert_eq!(
            e,
            BusError::Overlap {
                new: MmioRange::new(UART.base, 4),
                device: Device::Vits,
                existing: UART,
                owner: Device::Vpl011
            }
        );
        let e = BusError::Unclaimed { range: UART, device: Device::Vpl011 };
        assert_eq!(format!("{e}"), "MMIO range 0x9000000-0x9000fff (Vpl011) has no handler");
    }

    #[test]
    fn lookups_agree_with_a_linear_scan() {
        let mut rng = crate::testrng::Rng(17);
        let mut b = MmioBus::new();
        let devs = [Device::Vgic, Device::VirtioBlk, Device::Vpl011, Device::Vits];
        for _ in 0..200 {
            let r = MmioRange::new(rng.below(1 << 20), 1 + rng.below(1 << 12));
            let _ = b.register(r, devs[rng.index(4)]);
        }
        let all: Vec<(MmioRange, Device)> = b.ranges().collect();
        for w in all.windows(2) {
            assert!(w[0].0.base + w[0].0.size <= w[1].0.base, "{} {}", w[0].0, w[1].0);
        }
        for _ in 0..5000 {
            let ipa = rng.below((1 << 20) + (1 << 12));
            let want =
                all.iter().find(|(r, _)| ipa >= r.base && ipa - r.base < r.size).map(|(r, d)| (*d, ipa - r.base));
            assert_eq!(b.lookup(ipa), want, "{ipa:#x}");
        }
    }
}
