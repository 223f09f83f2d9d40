//! The DomU pool (`domu_pool=SIZE`): host RAM the boot plan set aside for
//! DomUs made while the machine runs (`hvctl create`), handed out and
//! taken back in 2 MiB units, so that making a VM never takes memory from
//! a running one, and destroying it gives back exactly what it took.
//!
//! Contract: [`Pool::alloc`] hands out ranges of the pool that no other
//! live allocation overlaps; [`Pool::free`] takes back a range that
//! `alloc` handed out (or one a destroyed boot-time DomU gives up, which
//! then joins the pool) and merges it with its free neighbours. The free
//! list lives in memory reserved at construction: neither call allocates,
//! and one that would need more fragments than that fails instead.

use crate::boot::plan::ALIGN;
use crate::region::Region;
use alloc::collections::TryReserveError;
use alloc::vec::Vec;

/// Most free fragments the pool keeps track of.
pub const MAX_FRAGMENTS: usize = 64;

/// Most DomUs the pool's memory may hold at once: one per 64 MiB (the
/// smallest guest), at most 16. The boot plan's heap has room for each
/// one's [`POOL_DOMAIN_HEAP`].
pub fn max_domains(pool: u64) -> u64 {
    (pool / crate::boot::plan::MIN_GUEST_RAM).min(16)
}

/// The heap a DomU made from the pool may use: its quota (the default
/// DomU's) and what making it takes outside the quota (its VM record,
/// vGIC, vCPUs, device tree), which the heap must also hold.
pub const POOL_DOMAIN_HEAP: u64 = crate::quota::DEFAULT_DOMU_HEAP_QUOTA + (4 << 20);

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("the DomU pool has no free range of {need:#x} bytes ({free:#x} free, largest {largest:#x}; boot with a larger domu_pool=)")]
    NoRoom { need: u64, free: u64, largest: u64 },
    #[error("the DomU pool is too fragmented to take {0:#x} back")]
    Fragmented(u64),
    #[error("{0:#x}+{1:#x} is not a 2 MiB-aligned range the pool can take")]
    BadRange(u64, u64),
}

/// Free ranges, sorted by address, disjoint and never adjacent.
#[derive(Debug)]
pub struct Pool {
    free: Vec<Region>,
    /// Bytes the pool holds, free or handed out.
    size: u64,
}

impl Pool {
    /// A pool of `initial` (2 MiB-aligned; `None`: an empty pool).
    pub fn new(initial: Option<Region>) -> Result<Pool, TryReserveError> {
        let mut free = Vec::new();
        free.try_reserve_exact(MAX_FRAGMENTS)?;
        let mut p = Pool { free, size: 0 };
        if let Some(r) = initial.filter(|r| r.size > 0) {
            p.free.push(r);
            p.size = r.size;
        }
        Ok(p)
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn free_bytes(&self) -> u64 {
        self.free.iter().map(|r| r.size).sum()
    }

    pub fn largest(&self) -> u64 {
        self.free.iter().map(|r| r.size).max().unwrap_or(0)
    }

    /// `size` bytes (rounded up to 2 MiB) from the highest free range that
    /// holds them, taken from its top.
    pub fn alloc(&mut self, size: u64) -> Result<Region, PoolError> {
        let need = size.checked_add(ALIGN - 1).map(|s| s & !(ALIGN - 1)).filter(|&s| s > 0);
        let no_room =
            PoolError::NoRoom { need: need.unwrap_or(size), free: self.free_bytes(), largest: self.largest() };
        let need = need.ok_or(no_room)?;
        let i = self.free.iter().rposition(|r| r.size >= need).ok_or(no_room)?;
        let r = &mut self.free[i];
        r.size -= need;
        let out = Region { base: r.base + r.size, size: need };
        if r.size == 0 {
            self.free.remove(i);
        }
        Ok(out)
    }

    /// Takes `r` back (see the module's contract); a range the pool did not
    /// hold before (a boot-time DomU's) grows it.
    pub fn free(&mut self, r: Region) -> Result<(), PoolError> {
        let end = r.base.checked_add(r.size);
        if r.size == 0 || !r.base.is_multiple_of(ALIGN) || !r.size.is_multiple_of(ALIGN) || end.is_none() {
            return Err(PoolError::BadRange(r.base, r.size));
        }
        let i = self.free.partition_point(|f| f.base < r.base);
        let overlaps_prev = i > 0 && self.free[i - 1].end() > r.base;
        let overlaps_next = self.free.get(i).is_some_and(|n| n.base < r.end());
        if overlaps_prev || overlaps_next {
            return Err(PoolError::BadRange(r.base, r.size));
        }
        let joins_prev = i > 0 && self.free[i - 1].end() == r.base;
        let joins_next = self.free.get(i).is_some_and(|n| n.base == r.end());
        match (joins_prev, joins_next) {
            (true, true) => {
                let next = self.free.remove(i);
                self.free[i - 1].size += r.size + next.size;
            }
            (true, false) => self.free[i - 1].size += r.size,
            (false, true) => {
                self.free[i].base = r.base;
                self.free[i].size += r.size;
            }
            (false, false) => {
                if self.free.len() == self.free.capacity() {
                    return Err(PoolError::Fragmented(r.size));
                }
                self.free.insert(i, r);
            }
        }
        Ok(())
    }

    /// Adds `r` to the pool for good (a destroyed boot-time DomU's RAM).
    pub fn grow(&mut self, r: Region) -> Result<(), PoolError> {
        self.free(r)?;
        self.size += r.size;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    #[test]
    fn alloc_and_free_give_back_exactly_what_was_taken() {
        let mut p = Pool::new(Some(Region { base: 0x8000_0000, size: 256 * M })).unwrap();
        let cap = p.free.capacity();
        for _ in 0..20 {
            let a = p.alloc(64 * M).unwrap();
            let b = p.alloc(3 * M).unwrap();
            let c = p.alloc(100 * M).unwrap();
            assert_eq!(b.size, 4 * M);
            let apart = |x: Region, y: Region| x.end() <= y.base || y.end() <= x.base;
            assert!(apart(a, b) && apart(b, c) && apart(a, c));
            assert_eq!(p.free_bytes(), 256 * M - 168 * M);
            // Out of order: the middle first.
            p.free(b).unwrap();
            p.free(a).unwrap();
            p.free(c).unwrap();
            assert_eq!(p.free, [Region { base: 0x8000_0000, size: 256 * M }]);
            assert_eq!(p.free.capacity(), cap);
        }
    }

    #[test]
    fn too_large_double_free_and_odd_ranges_are_errors() {
        let mut p = Pool::new(Some(Region { base: 0x8000_0000, size: 64 * M })).unwrap();
        assert_eq!(p.alloc(65 * M), Err(PoolError::NoRoom { need: 66 * M, free: 64 * M, largest: 64 * M }));
        assert!(p.alloc(0).is_err());
        let a = p.alloc(32 * M).unwrap();
        p.free(a).unwrap();
        assert_eq!(p.free(a), Err(PoolError::BadRange(a.base, a.size)));
        assert!(p.free(Region { base: 0x1000, size: 2 * M }).is_err());
        assert!(Pool::new(None).unwrap().alloc(2 * M).is_err());
    }

    #[test]
    fn a_boot_domus_ram_joins_the_pool() {
        let mut p = Pool::new(None).unwrap();
        p.grow(Region { base: 0x4000_0000, size: 128 * M }).unwrap();
        assert_eq!((p.size(), p.free_bytes()), (128 * M, 128 * M));
        assert_eq!(p.alloc(128 * M).unwrap().base, 0x4000_0000);
    }

    #[test]
    fn fragments_past_the_reserve_are_refused_not_allocated() {
        let mut p = Pool::new(Some(Region { base: 0, size: 2 * M * 2 * MAX_FRAGMENTS as u64 })).unwrap();
        let all: Vec<Region> = (0..2 * MAX_FRAGMENTS).map(|_| p.alloc(2 * M).unwrap()).collect();
        // Every other one back: MAX_FRAGMENTS fragments.
        for r in all.iter().step_by(2) {
            p.free(*r).unwrap();
        }
        assert_eq!(p.free.len(), MAX_FRAGMENTS);
        // Joining neighbours still works when the list is full.
        p.free(all[1]).unwrap();
        assert_eq!(p.free.len(), MAX_FRAGMENTS - 1);
    }
}
