//! Range arithmetic the planner is built on: alignment, overlap, checked
//! construction ([`range`]), RAM spans, and free lists (what is left of
//! RAM once used ranges are taken out, and the lowest or highest free
//! range that fits). Every computation that could wrap is checked.

use super::error::LayoutError;
use super::ALIGN;
use crate::region::Region;
use alloc::vec::Vec;

pub(super) fn align_up(v: u64, a: u64) -> Option<u64> {
    Some(v.checked_add(a - 1)? & !(a - 1))
}

pub(super) fn align_down(v: u64, a: u64) -> u64 {
    v & !(a - 1)
}

/// One past the last byte (saturating: only checked ranges reach here,
/// except RAM banks and devices in [`check_passthrough`]).
pub(super) fn end(r: Region) -> u64 {
    r.base.saturating_add(r.size)
}

pub(super) fn overlaps(a: Region, b: Region) -> bool {
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
pub(super) fn ram_spans(ram: &[Region]) -> Result<Vec<Region>, LayoutError> {
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
pub(super) fn module(ram: &[Region], name: &'static str, base: u64, size: u64) -> Result<Region, LayoutError> {
    let r = range(name, base, size)?;
    if ram_spans(ram)?.iter().any(|s| s.base <= r.base && end(r) <= end(*s)) {
        Ok(r)
    } else {
        Err(LayoutError::OutsideRam { name, range: r })
    }
}

/// `free` minus every range in `used` (both sorted or not; the result is
/// sorted and disjoint).
pub(super) fn subtract(free: &[Region], used: &[Region]) -> Vec<Region> {
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
pub(super) fn aligned(r: Region) -> Option<Region> {
    let base = align_up(r.base, ALIGN)?;
    let top = align_down(end(r), ALIGN);
    (top > base).then(|| Region { base, size: top - base })
}

pub(super) fn largest(free: &[Region]) -> u64 {
    free.iter().filter_map(|r| aligned(*r)).map(|r| r.size).max().unwrap_or(0)
}

/// The lowest aligned `size` bytes of free RAM.
pub(super) fn lowest_fit(free: &[Region], size: u64) -> Option<Region> {
    free.iter().filter_map(|r| aligned(*r)).find(|r| r.size >= size).map(|r| Region { base: r.base, size })
}

/// The highest aligned `size` bytes of free RAM.
pub(super) fn highest_fit(free: &[Region], size: u64) -> Option<Region> {
    free.iter().rev().filter_map(|r| aligned(*r)).find(|r| r.size >= size).map(|r| Region { base: end(r) - size, size })
}
