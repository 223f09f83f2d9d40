//! Checking the inputs before anything is placed: every range well formed,
//! the modules in RAM, nothing kept overlapping anything else kept (DomUs
//! may share a module), and [`check_passthrough`] for the devices a guest
//! gets mapped.

use super::error::LayoutError;
use super::ranges::{align_down, align_up, end, module, overlaps, ram_spans, range};
use super::{Inputs, Kept};
use crate::region::Region;
use alloc::vec::Vec;

/// The inputs, checked: RAM spans, the ranges kept (named) and reserved.
pub(super) struct Checked {
    pub(super) spans: Vec<Region>,
    pub(super) kept: Vec<Kept>,
    pub(super) reserved: Vec<Region>,
    pub(super) kernel: Region,
    pub(super) initrd: Option<Region>,
}

pub(super) fn check_inputs(i: &Inputs<'_>) -> Result<Checked, LayoutError> {
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
