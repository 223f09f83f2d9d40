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
//!
//! # Modules
//!
//! This file holds the inputs and the plan's types, [`check`] and [`plan`]
//! (the phases in order) and re-exports the rest of the public items.
//!
//! - `error`: [`LayoutError`];
//! - `ranges`: range arithmetic and free lists;
//! - `validate`: checking the inputs, [`check_passthrough`];
//! - `place`: placing the heap, the DomUs, Dom0's RAM and RAM disk, and the
//!   modules inside guest RAM ([`place_modules`]).

use super::image::FixedLoad;
use crate::ids::DomainId;
use crate::region::Region;
use crate::spec::{DomuPlacement, VmSpec};
use alloc::vec::Vec;
use core::fmt;

mod error;
mod place;
mod ranges;
mod validate;

pub use error::LayoutError;
pub use place::place_modules;
pub use ranges::range;
pub use validate::check_passthrough;

use error::Range;
use place::{fixed_kernel_span, modules_need, place_dom0_ram, place_domus, place_heap, place_pool};
use ranges::subtract;
use validate::{check_inputs, Checked};

pub(super) const MIB: u64 = 1 << 20;
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
    /// The dom0less DomUs (`BootInfo::domus`): their modules are kept,
    /// their RAM and disks placed.
    pub domus: &'a [VmSpec],
    /// `domu_pool`: RAM for DomUs made while running, placed like a
    /// DomU's (highest), 0 for none.
    pub domu_pool: u64,
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
    /// The DomU pool (`Inputs::domu_pool`), when asked for.
    pub domu_pool: Option<Region>,
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
    let domu_pool = place_pool(i.domu_pool, &mut free, &mut placed)?;
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
        domu_pool,
    })
}
