//! The boot-layout planner: where the hypervisor heap, the guest's RAM, the
//! RAM disk and the copies of the boot modules go.
//!
//! # Why a plan
//!
//! Firmware and bootloaders put things wherever they like: the hypervisor
//! image (with its BSS), the DTB, the guest kernel and initrd (Xen's
//! multiboot modules; QEMU's guest-loader documentation puts them at
//! 0x42000000 and 0x47000000, right behind an image at 0x40200000),
//! `/memreserve/` entries and `/reserved-memory` regions. Before the
//! hypervisor writes a byte outside its own image, [`plan`] checks those
//! inputs (no range wraps, the modules lie in RAM, nothing it must keep
//! overlaps anything else it must keep) and places everything it will write
//! in RAM that none of them uses. The EL2 code applies the result and
//! decides nothing itself. Every error is a [`LayoutError`] whose `Display`
//! is one line naming the ranges in conflict.
//!
//! # Policy
//!
//! * Kept (never written): the image, the DTB, the modules (Dom0's and
//!   every DomU's), reserved regions. Reserved regions may cover the DTB
//!   (firmware often reserves it), nothing else that is kept. DomUs may
//!   share a module (the same kind at exactly the same range: one kernel
//!   file loaded once for several DomUs); any other overlap is an error.
//! * The heap: the lowest free 2 MiB-aligned range of `heap_size`, so it
//!   sits near the image and leaves the top of RAM to the guest.
//! * Each DomU, in order: its RAM (`memory`, rounded up to 2 MiB) at the
//!   top of the highest free range that holds it, then its disk
//!   (`disk_size`, rounded up) the same way. DomUs are placed before Dom0's
//!   RAM, so Dom0 without `dom0_mem` gets the largest range that is left.
//! * Guest RAM (identity-mapped): `dom0_mem` at the top of the highest free
//!   range that holds it. Without `dom0_mem`: the largest free range above
//!   the bottom `keep_low` of RAM, less the RAM disk.
//! * The RAM disk image: the highest free range left.
//! * A kernel loaded at fixed addresses (ELF, raw binary with a load
//!   address, `boot::image`): its ranges must lie in RAM clear of
//!   everything kept, and the 2 MiB-aligned span around them in one free
//!   range; the heap and DomUs are placed outside that span, and Dom0's
//!   RAM is placed to cover it (with `dom0_mem`: as high as the span
//!   allows; without: the whole free range holding it).
//! * Inside guest RAM ([`place_modules`]): an arm64 Image at the (2 MiB
//!   aligned) base with its header's `image_size` reserved; the guest DTB
//!   in the highest 2 MiB slot the kernel leaves free, the initrd at the
//!   lowest 2 MiB boundary from which it clears the kernel and the DTB.
//!
//! Everything placed is 2 MiB aligned, so stage 2 can use block mappings.

use super::image::{FixedLoad, KernelError};
use crate::ids::DomainId;
use crate::region::Region;
use crate::spec::{DomuPlacement, VmSpec};
use alloc::vec::Vec;
use core::fmt;

const MIB: u64 = 1 << 20;
/// Alignment of everything the planner places.
pub const ALIGN: u64 = 2 * MIB;
/// The smallest guest RAM worth booting Linux in.
pub const MIN_GUEST_RAM: u64 = 64 * MIB;
/// Room for the guest DTB at the top of guest RAM.
pub const GUEST_DTB_SIZE: u64 = 2 * MIB;

/// The guest kernel module and the RAM it needs once loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel<'a> {
    /// Where the module (the kernel file) lies.
    pub module: Region,
    /// An arm64 Image's `image_size` (see [`super::image::arm64_image_size`]);
    /// not looked at when `fixed` is given.
    pub image_size: u64,
    /// A kernel loaded at fixed addresses (ELF, raw binary): its pieces
    /// (guest-physical = host-physical for Dom0) and entry point.
    pub fixed: Option<&'a FixedLoad>,
}

/// What the planner is told.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// RAM banks (`/memory` nodes).
    pub ram: &'a [Region],
    /// The hypervisor image, BSS included (`__image_start..__image_end`).
    pub image: Region,
    /// The boot DTB (`totalsize` bytes at x0).
    pub dtb: Region,
    /// `/memreserve/` entries and `/reserved-memory` regions.
    pub reserved: &'a [Region],
    pub kernel: Kernel<'a>,
    pub initrd: Option<Region>,
    /// `dom0_mem` in bytes, if given.
    pub dom0_mem: Option<u64>,
    /// Size of the RAM disk image (`dom0_disk=ram`), 0 for none.
    pub ram_disk: u64,
    /// Size of the hypervisor's main heap.
    pub heap_size: u64,
    /// Without `dom0_mem`, guest RAM starts at least this far above the
    /// lowest RAM (at most half of the lowest bank).
    pub keep_low: u64,
    /// The dom0less DomUs (`Platform::domus`): their modules are kept,
    /// their RAM and disks placed.
    pub domus: &'a [VmSpec],
}

/// A module copied into guest RAM: `src.size` bytes are copied, the rest
/// of `dst` is zeroed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModuleCopy {
    pub src: Region,
    pub dst: Region,
}

/// Where everything goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The hypervisor image (an input, kept for later checks).
    pub image: Region,
    /// The main heap (stage-2 tables, the guest DTB being built, buffers).
    pub heap: Region,
    /// The guest's RAM, identity-mapped.
    pub guest_ram: Region,
    /// The RAM disk image, outside guest RAM.
    pub ram_disk: Option<Region>,
    /// The kernel's copies: one for an Image (`dst.size` is the reserved
    /// `image_size`), one per piece for a kernel at fixed addresses.
    pub kernel: Vec<ModuleCopy>,
    /// Where Dom0's vCPU 0 starts.
    pub entry: u64,
    pub initrd: Option<ModuleCopy>,
    /// Where the guest DTB goes (its last [`GUEST_DTB_SIZE`] bytes).
    pub guest_dtb: Region,
    /// Each DomU's RAM and disk, in the order of `Inputs::domus`.
    pub domus: Vec<DomuPlacement>,
}

/// A range the plan keeps, and whose it is (for errors that name a DomU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kept {
    /// The DomU it belongs to; `None` for Dom0's modules and the machine's.
    pub domain: Option<DomainId>,
    pub name: &'static str,
    pub range: Region,
}

impl fmt::Display for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.domain {
            Some(d) => write!(f, "DomU d{d}'s {} {}", self.name, Range(self.range)),
            None => write!(f, "{} {}", self.name, Range(self.range)),
        }
    }
}

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
struct Range(Region);

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.base.checked_add(self.0.size) {
            Some(end) => write!(f, "[{:#x}, {:#x})", self.0.base, end),
            None => write!(f, "[{:#x}, +{:#x})", self.0.base, self.0.size),
        }
    }
}

/// A byte count in MiB (KiB or bytes when not a whole number of them).
struct Size(u64);

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

fn align_up(v: u64, a: u64) -> Option<u64> {
    Some(v.checked_add(a - 1)? & !(a - 1))
}

fn align_down(v: u64, a: u64) -> u64 {
    v & !(a - 1)
}

/// One past the last byte (saturating: only checked ranges reach here,
/// except RAM banks and devices in [`check_passthrough`]).
fn end(r: Region) -> u64 {
    r.base.saturating_add(r.size)
}

fn overlaps(a: Region, b: Region) -> bool {
    a.base < end(b) && b.base < end(a)
}

/// Checks that `[base, base + size)` is a non-empty range that does not
/// wrap.
pub fn range(name: &'static str, base: u64, size: u64) -> Result<Region, LayoutError> {
    if size == 0 {
        return Err(LayoutError::Empty { name, base });
    }
    base.checked_add(size).ok_or(LayoutError::Wraps { name, base, size })?;
    Ok(Region { base, size })
}

/// RAM banks sorted, with touching or overlapping banks merged.
fn ram_spans(ram: &[Region]) -> Result<Vec<Region>, LayoutError> {
    let mut banks = Vec::new();
    for r in ram.iter().filter(|r| r.size != 0) {
        banks.push(range("RAM", r.base, r.size)?);
    }
    banks.sort();
    let mut out: Vec<Region> = Vec::new();
    for b in banks {
        match out.last_mut() {
            Some(last) if b.base <= end(*last) => last.size = end(*last).max(end(b)) - last.base,
            _ => out.push(b),
        }
    }
    Ok(out)
}

/// A module checked for use: non-empty, not wrapping, inside RAM.
fn module(ram: &[Region], name: &'static str, base: u64, size: u64) -> Result<Region, LayoutError> {
    let r = range(name, base, size)?;
    if ram_spans(ram)?.iter().any(|s| s.base <= r.base && end(r) <= end(*s)) {
        Ok(r)
    } else {
        Err(LayoutError::OutsideRam { name, range: r })
    }
}

/// `free` minus every range in `used` (both sorted or not; the result is
/// sorted and disjoint).
fn subtract(free: &[Region], used: &[Region]) -> Vec<Region> {
    let mut out: Vec<Region> = free.to_vec();
    for u in used.iter().filter(|u| u.size != 0) {
        let mut next = Vec::new();
        for f in out {
            if !overlaps(f, *u) {
                next.push(f);
                continue;
            }
            if f.base < u.base {
                next.push(Region { base: f.base, size: u.base - f.base });
            }
            if end(*u) < end(f) {
                next.push(Region { base: end(*u), size: end(f) - end(*u) });
            }
        }
        out = next;
    }
    out.sort();
    out
}

/// The part of `r` usable at [`ALIGN`] granularity.
fn aligned(r: Region) -> Option<Region> {
    let base = align_up(r.base, ALIGN)?;
    let top = align_down(end(r), ALIGN);
    (top > base).then(|| Region { base, size: top - base })
}

fn largest(free: &[Region]) -> u64 {
    free.iter().filter_map(|r| aligned(*r)).map(|r| r.size).max().unwrap_or(0)
}

/// The lowest aligned `size` bytes of free RAM.
fn lowest_fit(free: &[Region], size: u64) -> Option<Region> {
    free.iter().filter_map(|r| aligned(*r)).find(|r| r.size >= size).map(|r| Region { base: r.base, size })
}

/// The highest aligned `size` bytes of free RAM.
fn highest_fit(free: &[Region], size: u64) -> Option<Region> {
    free.iter().rev().filter_map(|r| aligned(*r)).find(|r| r.size >= size).map(|r| Region { base: end(r) - size, size })
}

/// The inputs, checked: RAM spans, the ranges kept (named) and reserved.
struct Checked {
    spans: Vec<Region>,
    kept: Vec<Kept>,
    reserved: Vec<Region>,
    kernel: Region,
    initrd: Option<Region>,
}

fn check_inputs(i: &Inputs<'_>) -> Result<Checked, LayoutError> {
    let spans = ram_spans(i.ram)?;
    let image = range("hypervisor image", i.image.base, i.image.size)?;
    let dtb = range("device tree", i.dtb.base, i.dtb.size)?;
    let kernel = module(i.ram, "kernel", i.kernel.module.base, i.kernel.module.size)?;
    let initrd = match i.initrd {
        Some(r) => Some(module(i.ram, "initrd", r.base, r.size)?),
        None => None,
    };
    let mut reserved = Vec::new();
    for r in i.reserved.iter().filter(|r| r.size != 0) {
        reserved.push(range("reserved region", r.base, r.size)?);
    }

    // What must be kept, in the order errors name them.
    let dom0 = |name, range| Kept { domain: None, name, range };
    let mut kept: Vec<Kept> = Vec::from([dom0("kernel", kernel)]);
    kept.extend(initrd.map(|r| dom0("initrd", r)));
    kept.push(dom0("device tree", dtb));
    kept.push(dom0("hypervisor image", image));
    for d in i.domus {
        let modules = [Some(("kernel", d.kernel)), d.ramdisk.map(|r| ("ramdisk", r))];
        for (what, r) in modules.into_iter().flatten() {
            let range = range(what, r.base, r.size)?;
            if !spans.iter().any(|s| s.base <= range.base && end(range) <= end(*s)) {
                return Err(LayoutError::DomuOutsideRam { id: d.id, what, range });
            }
            let k = Kept { domain: Some(d.id), name: what, range };
            // One file loaded once may serve several DomUs.
            let shared = |o: &Kept| o.domain.is_some() && o.name == what && o.range == range;
            if !kept.iter().any(shared) {
                kept.push(k);
            }
        }
    }
    let overlap = |a: Kept, b: Kept| match (a.domain, b.domain) {
        (None, None) => LayoutError::Overlap { a: (a.name, a.range), b: (b.name, b.range) },
        _ => LayoutError::DomuOverlap { a, b },
    };
    for (n, a) in kept.iter().enumerate() {
        if let Some(b) = kept[n + 1..].iter().find(|b| overlaps(a.range, b.range)) {
            return Err(overlap(*a, *b));
        }
        if a.name == "device tree" {
            continue;
        }
        if let Some(r) = reserved.iter().find(|r| overlaps(a.range, **r)) {
            return Err(overlap(*a, dom0("reserved region", *r)));
        }
    }
    // A fixed-address kernel's ranges become Dom0's RAM: in RAM, clear of
    // everything kept.
    for r in i.kernel.fixed.iter().flat_map(|f| f.ranges()) {
        let r = range("kernel load range", r.base, r.size)?;
        if !spans.iter().any(|s| s.base <= r.base && end(r) <= end(*s)) {
            return Err(LayoutError::OutsideRam { name: "kernel load range", range: r });
        }
        let named = kept.iter().map(|k| (k.name, k.range)).chain(reserved.iter().map(|r| ("reserved region", *r)));
        if let Some(k) = named.into_iter().find(|k| overlaps(r, k.1)) {
            return Err(LayoutError::Overlap { a: ("kernel load range", r), b: k });
        }
    }
    Ok(Checked { spans, kept, reserved, kernel, initrd })
}

/// Checks the inputs without placing anything (`kernel.image_size` is not
/// looked at; a fixed-address kernel's ranges are, when given): no range
/// wraps, the modules lie in RAM, nothing kept overlaps. Once this passes
/// the EL2 code may read the kernel module.
pub fn check(i: &Inputs<'_>) -> Result<(), LayoutError> {
    check_inputs(i).map(|_| ())
}

/// Checks the inputs and plans the layout: the hypervisor's heap lowest,
/// the DomUs highest, Dom0's RAM (and RAM disk) in what is left, its
/// modules inside its RAM.
pub fn plan(i: &Inputs<'_>) -> Result<Plan, LayoutError> {
    let Checked { spans, kept, reserved, kernel, initrd } = check_inputs(i)?;
    let mut used: Vec<Region> = kept.iter().map(|k| k.range).collect();
    used.extend(reserved.iter().copied());
    let base_free = subtract(&spans, &used);

    let span = fixed_kernel_span(i, &base_free)?;
    let mut placed: Vec<Region> = Vec::new();
    let mut free = subtract(&base_free, span.as_slice());
    let heap = place_heap(i.heap_size, &mut free, &mut placed)?;
    let domus = place_domus(i.domus, &mut free, &mut placed)?;
    // The span is free again for Dom0's RAM.
    let free = subtract(&base_free, &placed);
    let (guest_ram, ram_disk) = place_dom0_ram(i, &spans, &free, span)?;

    // Inside guest RAM: the kernel, then the DTB and initrd around it.
    let (kernel_copies, entry) = match i.kernel.fixed {
        Some(f) => {
            let copies = f
                .pieces
                .iter()
                .map(|p| ModuleCopy { src: Region { base: kernel.base + p.offset, size: p.size }, dst: p.at })
                .collect();
            (copies, f.entry)
        }
        None => {
            let room = i.kernel.image_size.max(kernel.size);
            let dst = Region { base: guest_ram.base, size: room.min(u64::MAX - guest_ram.base) };
            (Vec::from([ModuleCopy { src: kernel, dst }]), guest_ram.base)
        }
    };
    let kernel_ranges: Vec<Region> = kernel_copies.iter().map(|c| c.dst).collect();
    let (initrd_dst, guest_dtb) =
        place_modules(guest_ram, &kernel_ranges, initrd.map(|r| r.size)).ok_or_else(|| {
            LayoutError::ModulesDoNotFit { need: modules_need(&kernel_ranges, initrd.map(|r| r.size)), guest_ram }
        })?;
    let initrd_copy = initrd.zip(initrd_dst).map(|(src, dst)| ModuleCopy { src, dst });
    Ok(Plan {
        image: i.image,
        heap,
        guest_ram,
        ram_disk,
        kernel: kernel_copies,
        entry,
        initrd: initrd_copy,
        guest_dtb,
        domus,
    })
}

/// A fixed-address kernel: the 2 MiB-aligned span of its ranges, which
/// Dom0's RAM must cover, and which stays out of the heap's and the DomUs'
/// way; it must lie in `base_free`.
fn fixed_kernel_span(i: &Inputs<'_>, base_free: &[Region]) -> Result<Option<Region>, LayoutError> {
    let fixed_ranges: Vec<Region> = i.kernel.fixed.iter().flat_map(|f| f.ranges()).collect();
    let (Some(lo), Some(hi)) = (fixed_ranges.iter().map(|r| r.base).min(), fixed_ranges.iter().map(|r| end(*r)).max())
    else {
        return Ok(None);
    };
    let base = align_down(lo, ALIGN);
    let top = align_up(hi, ALIGN).ok_or(LayoutError::KernelSpanNotFree { span: Region { base, size: hi - base } })?;
    let span = Region { base, size: top - base };
    if !base_free.iter().filter_map(|f| aligned(*f)).any(|f| f.base <= span.base && end(span) <= end(f)) {
        return Err(LayoutError::KernelSpanNotFree { span });
    }
    Ok(Some(span))
}

/// The hypervisor's heap: `size` rounded up to 2 MiB, as low as it fits.
fn place_heap(size: u64, free: &mut Vec<Region>, placed: &mut Vec<Region>) -> Result<Region, LayoutError> {
    let no_room = |size, free: &[Region]| LayoutError::NoRoom { what: "hypervisor heap", size, largest: largest(free) };
    let heap_size = align_up(size.max(1), ALIGN).ok_or(no_room(size, free))?;
    let heap = lowest_fit(free, heap_size).ok_or(no_room(heap_size, free))?;
    *free = subtract(free, &[heap]);
    placed.push(heap);
    Ok(heap)
}

/// Each DomU's RAM and RAM disk, as high as they fit, in device-tree order.
fn place_domus(
    specs: &[VmSpec],
    free: &mut Vec<Region>,
    placed: &mut Vec<Region>,
) -> Result<Vec<DomuPlacement>, LayoutError> {
    let mut domus = Vec::new();
    for d in specs {
        let no_room =
            |what, size, free: &[Region]| LayoutError::DomuNoRoom { id: d.id, what, size, largest: largest(free) };
        let memory = align_up(d.memory, ALIGN).ok_or(no_room("RAM", d.memory, free))?;
        let need = [Some(d.kernel.size), d.ramdisk.map(|r| r.size), Some(GUEST_DTB_SIZE)]
            .into_iter()
            .flatten()
            .try_fold(0u64, |acc, s| acc.checked_add(align_up(s, ALIGN)?))
            .unwrap_or(u64::MAX);
        if need > memory {
            return Err(LayoutError::DomuModulesDoNotFit { id: d.id, need, memory: d.memory });
        }
        let ram = highest_fit(free, memory).ok_or(no_room("RAM", memory, free))?;
        *free = subtract(free, &[ram]);
        placed.push(ram);
        let disk = match d.disk_size {
            0 => None,
            size => {
                let size = align_up(size, ALIGN).ok_or(no_room("disk", size, free))?;
                let disk = highest_fit(free, size).ok_or(no_room("disk", size, free))?;
                *free = subtract(free, &[disk]);
                placed.push(disk);
                Some(disk)
            }
        };
        domus.push(DomuPlacement { id: d.id, ram, disk });
    }
    Ok(domus)
}

/// Dom0's RAM (`dom0_mem`, or the largest free range above `keep_low`;
/// around a fixed kernel's `span`) and its RAM disk, in `free`.
fn place_dom0_ram(
    i: &Inputs<'_>,
    spans: &[Region],
    free: &[Region],
    span: Option<Region>,
) -> Result<(Region, Option<Region>), LayoutError> {
    let ram_total: u64 = spans.iter().map(|s| s.size).sum();
    let disk = match i.ram_disk {
        0 => 0,
        d => align_up(d, ALIGN).unwrap_or(u64::MAX),
    };
    let dom0_mem = match i.dom0_mem {
        Some(m) => {
            let m = align_up(m, ALIGN).unwrap_or(u64::MAX);
            if m.saturating_add(disk) > ram_total {
                return Err(LayoutError::Dom0MemTooLarge { dom0_mem: m, ram_disk: disk, ram: ram_total });
            }
            Some(m)
        }
        None => None,
    };
    let guest_ram = match span {
        Some(span) => dom0_ram_around(free, span, dom0_mem, disk)?,
        None => {
            let size = match dom0_mem {
                Some(m) => m,
                None => {
                    let low = spans.first().map_or(0, |s| s.base.saturating_add(i.keep_low.min(s.size / 2)));
                    let above = subtract(free, &[Region { base: 0, size: low }]);
                    largest(&above).saturating_sub(disk)
                }
            };
            if size < MIN_GUEST_RAM {
                return Err(LayoutError::GuestTooSmall { size });
            }
            highest_fit(free, size).ok_or(LayoutError::NoRoom {
                what: "guest RAM (dom0_mem)",
                size,
                largest: largest(free),
            })?
        }
    };
    if guest_ram.size < MIN_GUEST_RAM {
        return Err(LayoutError::GuestTooSmall { size: guest_ram.size });
    }
    let free = subtract(free, &[guest_ram]);
    let ram_disk = match disk {
        0 => None,
        d => Some(highest_fit(&free, d).ok_or(LayoutError::NoRoom {
            what: "RAM disk (dom0_disk_size)",
            size: d,
            largest: largest(&free),
        })?),
    };
    Ok((guest_ram, ram_disk))
}

/// Dom0's RAM covering a fixed-address kernel's 2 MiB-aligned `span`, in
/// the free range that holds it: `dom0_mem` bytes as high as the span
/// allows, or (without `dom0_mem`) the whole range, less the RAM disk
/// (`disk` bytes) from its top when no other free range holds the disk.
fn dom0_ram_around(free: &[Region], span: Region, dom0_mem: Option<u64>, disk: u64) -> Result<Region, LayoutError> {
    let f = free
        .iter()
        .filter_map(|f| aligned(*f))
        .find(|f| f.base <= span.base && end(span) <= end(*f))
        .ok_or(LayoutError::KernelSpanNotFree { span })?;
    match dom0_mem {
        Some(m) => {
            if m < span.size || m > f.size {
                return Err(LayoutError::KernelSpanVsDom0Mem { span, dom0_mem: m });
            }
            let base = span.base.min(end(f) - m);
            Ok(Region { base, size: m })
        }
        None => {
            let elsewhere = highest_fit(&subtract(free, &[f]), disk.max(1)).is_some();
            if disk == 0 || elsewhere {
                return Ok(f);
            }
            match end(f).checked_sub(disk) {
                Some(top) if top >= end(span) => Ok(Region { base: f.base, size: top - f.base }),
                _ => Err(LayoutError::NoRoom { what: "RAM disk (dom0_disk_size)", size: disk, largest: largest(free) }),
            }
        }
    }
}

/// What the kernel, an initrd of `initrd` bytes and the DTB need at least
/// (2 MiB-aligned each), for errors.
fn modules_need(kernel: &[Region], initrd: Option<u64>) -> u64 {
    kernel
        .iter()
        .map(|k| align_up(k.size, ALIGN))
        .chain(initrd.map(|s| align_up(s, ALIGN)))
        .try_fold(GUEST_DTB_SIZE, |acc, s| acc.checked_add(s?))
        .unwrap_or(u64::MAX)
}

/// Places the guest DTB ([`GUEST_DTB_SIZE`]) and an initrd of `initrd`
/// bytes in guest RAM `ram` (2 MiB aligned) around the kernel's loaded
/// ranges `kernel`: the DTB in the highest 2 MiB-aligned slot clear of the
/// kernel, the initrd at the lowest 2 MiB boundary from which it clears
/// the kernel and the DTB. `None` when either does not fit. With an Image
/// at the base of RAM this is the arm64 boot protocol's layout: kernel,
/// initrd above it, DTB at the top.
pub fn place_modules(ram: Region, kernel: &[Region], initrd: Option<u64>) -> Option<(Option<Region>, Region)> {
    let mut top = align_down(end(ram), ALIGN);
    let dtb = loop {
        let c = Region { base: top.checked_sub(GUEST_DTB_SIZE).filter(|&b| b >= ram.base)?, size: GUEST_DTB_SIZE };
        match kernel.iter().find(|k| overlaps(c, **k)) {
            Some(k) => top = align_down(k.base, ALIGN),
            None => break c,
        }
    };
    let initrd = match initrd {
        None => None,
        Some(size) => {
            let mut base = align_up(ram.base, ALIGN)?;
            loop {
                let c = Region { base, size };
                if end(c) > end(ram) || base.checked_add(size).is_none() {
                    return None;
                }
                match kernel.iter().chain(core::iter::once(&dtb)).find(|k| overlaps(c, **k)) {
                    Some(k) => base = align_up(end(*k), ALIGN)?,
                    None => break Some(c),
                }
            }
        }
    };
    Some((initrd, dtb))
}

/// Checks that no passthrough device range (mapped into the guest page by
/// page) overlaps RAM or a range the hypervisor owns (`hyp`: its image,
/// heap, RAM disk, and the devices it drives itself).
pub fn check_passthrough(
    ram: &[Region],
    hyp: &[(&'static str, Region)],
    devices: &[Region],
) -> Result<(), LayoutError> {
    const PAGE: u64 = 4096;
    for d in devices {
        let r = range("passthrough device", d.base, d.size)?;
        let top = align_up(end(r), PAGE).ok_or(LayoutError::Wraps {
            name: "passthrough device",
            base: d.base,
            size: d.size,
        })?;
        let base = align_down(r.base, PAGE);
        let pages = Region { base, size: top - base };
        if let Some(bank) = ram.iter().find(|b| b.size != 0 && overlaps(pages, **b)) {
            return Err(LayoutError::Overlap { a: ("passthrough device", pages), b: ("RAM", *bank) });
        }
        if let Some(h) = hyp.iter().find(|h| h.1.size != 0 && overlaps(pages, h.1)) {
            return Err(LayoutError::Overlap { a: ("passthrough device", pages), b: *h });
        }
    }
    Ok(())
}
