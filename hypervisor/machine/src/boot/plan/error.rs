//! [`LayoutError`], every way the boot inputs or the layout can be wrong,
//! displayed as one line naming the ranges in conflict (addresses and sizes
//! in a fixed, readable form).

use super::super::image::KernelError;
use super::{Kept, MIB, MIN_GUEST_RAM};
use crate::ids::DomainId;
use crate::region::Region;
use core::fmt;

/// Why the boot layout does not work. `Display` is one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutError {
    /// `base + size` does not fit in 64 bits.
    Wraps { name: &'static str, base: u64, size: u64 },
    /// A module of size 0.
    Empty { name: &'static str, base: u64 },
    /// A module not entirely inside RAM.
    OutsideRam { name: &'static str, range: Region },
    /// Two ranges that must not share a byte do.
    Overlap { a: (&'static str, Region), b: (&'static str, Region) },
    /// `dom0_mem` (plus the RAM disk) exceeds all RAM.
    Dom0MemTooLarge { dom0_mem: u64, ram_disk: u64, ram: u64 },
    /// No free RAM range is large enough for `what`.
    NoRoom { what: &'static str, size: u64, largest: u64 },
    /// Guest RAM would be smaller than [`MIN_GUEST_RAM`].
    GuestTooSmall { size: u64 },
    /// The kernel, initrd and guest DTB do not fit in guest RAM.
    ModulesDoNotFit { need: u64, guest_ram: Region },
    /// The kernel module cannot be booted (format, `boot::image`).
    Kernel(KernelError),
    /// A fixed-address kernel's 2 MiB-aligned span `span` is not inside
    /// one free RAM range (guest RAM must cover it).
    KernelSpanNotFree { span: Region },
    /// `dom0_mem` is smaller than a fixed-address kernel's span needs, or
    /// the span's free range cannot hold `dom0_mem` around it.
    KernelSpanVsDom0Mem { span: Region, dom0_mem: u64 },
    /// A DomU's module (`kernel`, `ramdisk`) is not entirely inside RAM.
    DomuOutsideRam { id: DomainId, what: &'static str, range: Region },
    /// Two kept ranges share a byte and at least one is a DomU's module.
    DomuOverlap { a: Kept, b: Kept },
    /// No free RAM range holds a DomU's `what` (`RAM`, `disk`).
    DomuNoRoom { id: DomainId, what: &'static str, size: u64, largest: u64 },
    /// A DomU's kernel, initrd and DTB (2 MiB-aligned, as in Dom0's RAM) do
    /// not fit in its `memory`.
    DomuModulesDoNotFit { id: DomainId, need: u64, memory: u64 },
}

impl From<KernelError> for LayoutError {
    fn from(e: KernelError) -> Self {
        LayoutError::Kernel(e)
    }
}

/// `[base, end)` in hex.
pub(super) struct Range(pub(super) Region);

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.base.checked_add(self.0.size) {
            Some(end) => write!(f, "[{:#x}, {:#x})", self.0.base, end),
            None => write!(f, "[{:#x}, +{:#x})", self.0.base, self.0.size),
        }
    }
}

/// A byte count in MiB (KiB or bytes when not a whole number of them).
pub(super) struct Size(pub(super) u64);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            n if n % MIB == 0 => write!(f, "{} MiB", n / MIB),
            n if n % 1024 == 0 => write!(f, "{} KiB", n / 1024),
            n => write!(f, "{n} bytes"),
        }
    }
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LayoutError::Wraps { name, base, size } => {
                write!(f, "{name} at {base:#x} of size {size:#x} wraps past the end of the address space")
            }
            LayoutError::Empty { name, base } => write!(f, "{name} at {base:#x} is empty"),
            LayoutError::OutsideRam { name, range } => write!(f, "{name} {} is not inside RAM", Range(range)),
            LayoutError::Overlap { a, b } => write!(f, "{} {} overlaps {} {}", a.0, Range(a.1), b.0, Range(b.1)),
            LayoutError::Dom0MemTooLarge { dom0_mem, ram_disk: 0, ram } => {
                write!(f, "dom0_mem ({}) is larger than RAM ({})", Size(dom0_mem), Size(ram))
            }
            LayoutError::Dom0MemTooLarge { dom0_mem, ram_disk, ram } => write!(
                f,
                "dom0_mem ({}) plus the RAM disk ({}) is larger than RAM ({})",
                Size(dom0_mem),
                Size(ram_disk),
                Size(ram)
            ),
            LayoutError::NoRoom { what, size, largest } => {
                write!(f, "no free RAM range of {} for the {what} (largest free range: {})", Size(size), Size(largest))
            }
            LayoutError::GuestTooSmall { size } => {
                write!(f, "only {} of RAM is left for the guest, it needs at least {}", Size(size), Size(MIN_GUEST_RAM))
            }
            LayoutError::ModulesDoNotFit { need, guest_ram } => write!(
                f,
                "the kernel, initrd and guest DTB need {} but guest RAM {} has {}",
                Size(need),
                Range(guest_ram),
                Size(guest_ram.size)
            ),
            LayoutError::Kernel(e) => write!(f, "{e}"),
            LayoutError::KernelSpanNotFree { span } => write!(
                f,
                "the kernel's load ranges, 2 MiB-aligned {}, are not inside one free RAM range for Dom0's RAM to cover",
                Range(span)
            ),
            LayoutError::KernelSpanVsDom0Mem { span, dom0_mem } => write!(
                f,
                "Dom0's RAM of {} (dom0_mem) cannot cover the kernel's load ranges, 2 MiB-aligned {}, in their free RAM range",
                Size(dom0_mem),
                Range(span)
            ),
            LayoutError::DomuOutsideRam { id, what, range } => {
                write!(f, "DomU d{id}'s {what} module {} is not inside RAM", Range(range))
            }
            LayoutError::DomuOverlap { a, b } => write!(f, "{a} overlaps {b}"),
            LayoutError::DomuNoRoom { id, what, size, largest } => write!(
                f,
                "no free RAM range of {} for DomU d{id}'s {what} (largest free range: {})",
                Size(size),
                Size(largest)
            ),
            LayoutError::DomuModulesDoNotFit { id, need, memory } => {
                write!(f, "DomU d{id}'s kernel, initrd and DTB need {} but its memory is {}", Size(need), Size(memory))
            }
        }
    }
}
