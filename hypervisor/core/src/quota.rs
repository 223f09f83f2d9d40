//! Per-VM heap quotas: every allocation the hypervisor makes at run time on
//! a VM's behalf is charged to that VM first.
//!
//! # The contract
//!
//! The boot plan sizes the heap as the hypervisor's own part plus the sum of
//! every VM's quota (`boot::plan` in the `hypervisor` crate), and each VM's run-time
//! allocations (virtio-blk request buffers and their bookkeeping, stage-2
//! tables mapped on demand, physical ITTs for the vITS's MAPD) are charged
//! here *before* they are made, at the size the buddy allocator really takes
//! ([`heap_cost`]). So no guest action can take more than its quota, and the
//! quotas together cannot take more than the heap holds: a VM at its quota
//! gets back-pressure (requests wait in the avail ring, MAPD is refused, an
//! on-demand mapping aborts), never the machine a panic.
//!
//! Allocations made while a VM is built (its vGIC, vCPUs, the stage 2 of its
//! RAM) are bounded by its plan and belong to the hypervisor's part; they
//! are not charged.
//!
//! A quota is a set of atomics: devices, the stage-2 code and the vITS of
//! one VM charge it from any pCPU without a lock.

use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering};

/// Dom0's quota unless `dom0_heap_quota=` says otherwise: its disk's
/// largest request (4 MiB) and about three more, stage-2 tables an ACPI
/// Dom0 maps on demand, physical ITTs for its MSI devices.
pub const DEFAULT_DOM0_HEAP_QUOTA: u64 = 16 << 20;
/// A DomU's unless `hv,heap-quota` says otherwise: its disk's largest
/// request and one more.
pub const DEFAULT_DOMU_HEAP_QUOTA: u64 = 8 << 20;
/// Quotas a boot option or DT property may ask for.
pub const QUOTA_RANGE: core::ops::RangeInclusive<u64> = (1 << 20)..=(1 << 30);

/// The heap the boot plan reserves: the hypervisor's own part (`own`) and
/// every VM's quota, so the quotas cannot overcommit it.
pub fn heap_size(own: u64, quotas: impl IntoIterator<Item = u64>) -> u64 {
    quotas.into_iter().fold(own, u64::saturating_add)
}

/// Smallest block the buddy allocator hands out (it keeps a free-list
/// pointer in every free block).
const MIN_BLOCK: usize = core::mem::size_of::<usize>();

/// Bytes the buddy allocator takes for a block of `size` bytes aligned to
/// `align`: the next power of two of the larger of the two (and of the
/// allocator's smallest block).
pub fn heap_cost(size: usize, align: usize) -> u64 {
    size.max(align).max(MIN_BLOCK).checked_next_power_of_two().map_or(u64::MAX, |b| b as u64)
}

/// A charge the quota refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaExceeded {
    /// Bytes asked for.
    pub asked: u64,
    /// Bytes charged when it was refused.
    pub used: u64,
    pub limit: u64,
}

impl fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "heap quota exceeded: {} bytes asked, {} of {} in use", self.asked, self.used, self.limit)
    }
}

/// One VM's heap allowance.
#[derive(Debug)]
pub struct Quota {
    limit: u64,
    used: AtomicU64,
    hwm: AtomicU64,
    /// Charges refused (each one back-pressure or an error for the guest).
    refused: AtomicU64,
}

impl Quota {
    pub const fn new(limit: u64) -> Self {
        Quota { limit, used: AtomicU64::new(0), hwm: AtomicU64::new(0), refused: AtomicU64::new(0) }
    }

    /// No bound: for host tests and devices nobody accounts for.
    pub const fn unlimited() -> Self {
        Self::new(u64::MAX)
    }

    /// Charges `bytes`, or refuses (and counts the refusal) when that would
    /// pass the limit; a refused charge changes nothing else.
    pub fn try_charge(&self, bytes: u64) -> Result<(), QuotaExceeded> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let new = match used.checked_add(bytes) {
                Some(n) if n <= self.limit => n,
                _ => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    return Err(QuotaExceeded { asked: bytes, used, limit: self.limit });
                }
            };
            match self.used.compare_exchange_weak(used, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    self.hwm.fetch_max(new, Ordering::Relaxed);
                    return Ok(());
                }
                Err(now) => used = now,
            }
        }
    }

    /// Gives back `bytes` charged earlier. Giving back more than is charged
    /// is a bug in the caller; the count stops at zero rather than wrap.
    pub fn release(&self, bytes: u64) {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let new = used.saturating_sub(bytes);
            match self.used.compare_exchange_weak(used, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => used = now,
            }
        }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The most ever charged at once.
    pub fn high_water(&self) -> u64 {
        self.hwm.load(Ordering::Relaxed)
    }

    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// `prefix.used=`, `.hwm=`, `.limit=`, `.refused=` lines (the stats
    /// format of `crate::stats`).
    pub fn write_text(&self, prefix: &str, out: &mut dyn fmt::Write) -> fmt::Result {
        writeln!(out, "{prefix}.used={}", self.used())?;
        writeln!(out, "{prefix}.hwm={}", self.high_water())?;
        writeln!(out, "{prefix}.limit={}", self.limit)?;
        writeln!(out, "{prefix}.refused={}", self.refused())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_cost_is_the_buddy_block() {
        assert_eq!(heap_cost(1, 1), MIN_BLOCK as u64);
        assert_eq!(heap_cost(512, 1), 512);
        assert_eq!(heap_cost(513, 1), 1024);
        assert_eq!(heap_cost(4096, 4096), 4096);
        assert_eq!(heap_cost(256, 65536), 65536, "alignment dominates");
        assert_eq!(heap_cost((2 << 20) + 512, 1), 4 << 20, "a buddy block doubles an odd size");
        assert_eq!(heap_cost(usize::MAX, 1), u64::MAX);
    }

    #[test]
    fn charges_stop_at_the_limit_and_are_counted() {
        let q = Quota::new(10_000);
        q.try_charge(6_000).unwrap();
        assert_eq!(q.try_charge(5_000), Err(QuotaExceeded { asked: 5_000, used: 6_000, limit: 10_000 }));
        assert_eq!((q.used(), q.refused()), (6_000, 1), "a refusal changes nothing but its count");
        q.try_charge(4_000).unwrap();
        assert_eq!(q.used(), 10_000);
        q.release(7_000);
        assert_eq!((q.used(), q.high_water()), (3_000, 10_000));
        q.release(u64::MAX);
        assert_eq!(q.used(), 0, "over-release stops at zero");
        assert!(q.try_charge(u64::MAX).is_err(), "no wrap-around");
    }

    #[test]
    fn concurrent_charges_never_pass_the_limit() {
        let q = std::sync::Arc::new(Quota::new(1000 * 64));
        let threads: std::vec::Vec<_> = (0..4)
            .map(|_| {
                let q = q.clone();
                std::thread::spawn(move || {
                    let mut got = 0u64;
                    for _ in 0..10_000 {
                        if q.try_charge(64).is_ok() {
                            got += 1;
                            assert!(q.used() <= q.limit());
                            if got.is_multiple_of(3) {
                                q.release(64);
                                got -= 1;
                            }
                        }
                    }
                    got
                })
            })
            .collect();
        let held: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(q.used(), held * 64);
        assert!(q.high_water() <= q.limit());
    }

    #[test]
    fn the_heap_holds_every_quota() {
        assert_eq!(heap_size(48 << 20, [16 << 20, 8 << 20, 8 << 20]), 80 << 20);
        assert_eq!(heap_size(48 << 20, []), 48 << 20);
        assert_eq!(heap_size(u64::MAX, [1]), u64::MAX);
    }

    #[test]
    fn stats_line() {
        let q = Quota::new(4096);
        q.try_charge(1024).unwrap();
        let _ = q.try_charge(8192);
        let mut s = std::string::String::new();
        q.write_text("quota", &mut s).unwrap();
        assert_eq!(s, "quota.used=1024\nquota.hwm=1024\nquota.limit=4096\nquota.refused=1\n");
    }
}
