//! Placing what the hypervisor writes: the span of a fixed-address kernel,
//! the heap (lowest), the DomUs (highest), Dom0's RAM and RAM disk in what
//! is left, and the guest DTB and initrd inside guest RAM
//! ([`place_modules`]). All in 2 MiB units.

use super::error::LayoutError;
use super::ranges::{align_down, align_up, aligned, end, highest_fit, largest, lowest_fit, overlaps, subtract};
use super::{Inputs, ALIGN, GUEST_DTB_SIZE, MIN_GUEST_RAM};
use crate::region::Region;
use crate::spec::{DomuPlacement, VmSpec};
use alloc::vec::Vec;

/// A fixed-address kernel: the 2 MiB-aligned span of its ranges, which
/// Dom0's RAM must cover, and which stays out of the heap's and the DomUs'
/// way; it must lie in `base_free`.
pub(super) fn fixed_kernel_span(i: &Inputs<'_>, base_free: &[Region]) -> Result<Option<Region>, LayoutError> {
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
pub(super) fn place_heap(size: u64, free: &mut Vec<Region>, placed: &mut Vec<Region>) -> Result<Region, LayoutError> {
    let no_room = |size, free: &[Region]| LayoutError::NoRoom { what: "hypervisor heap", size, largest: largest(free) };
    let heap_size = align_up(size.max(1), ALIGN).ok_or(no_room(size, free))?;
    let heap = lowest_fit(free, heap_size).ok_or(no_room(heap_size, free))?;
    *free = subtract(free, &[heap]);
    placed.push(heap);
    Ok(heap)
}

/// Each DomU's RAM and RAM disk, as high as they fit, in device-tree order.
pub(super) fn place_domus(
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

/// The DomU pool: `size` (2 MiB multiples) as high as it fits, none for 0.
pub(super) fn place_pool(
    size: u64,
    free: &mut Vec<Region>,
    placed: &mut Vec<Region>,
) -> Result<Option<Region>, LayoutError> {
    if size == 0 {
        return Ok(None);
    }
    let no_room =
        |size, free: &[Region]| LayoutError::NoRoom { what: "DomU pool (domu_pool)", size, largest: largest(free) };
    let size = align_up(size, ALIGN).ok_or(no_room(size, free))?;
    let pool = highest_fit(free, size).ok_or(no_room(size, free))?;
    *free = subtract(free, &[pool]);
    placed.push(pool);
    Ok(Some(pool))
}

/// Dom0's RAM (`dom0_mem`, or the largest free range above `keep_low`;
/// around a fixed kernel's `span`) and its RAM disk, in `free`.
pub(super) fn place_dom0_ram(
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
pub(super) fn dom0_ram_around(
    free: &[Region],
    span: Region,
    dom0_mem: Option<u64>,
    disk: u64,
) -> Result<Region, LayoutError> {
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
pub(super) fn modules_need(kernel: &[Region], initrd: Option<u64>) -> u64 {
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
