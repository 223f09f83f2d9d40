//! The heap a request costs: [`request_cost`], an upper bound known before
//! the request is parsed, [`floor_cost`], the largest request charged once
//! when the device is made, and the device's side of the VM's quota
//! (`hold` / `unhold`), which charges only what passes that floor.

use super::super::queue::Segment;
use super::config::{BlkConfig, HEADER_LEN};
use super::VirtioBlk;
use crate::quota::heap_cost;

/// Heap a request's bookkeeping takes besides its data and segment list:
/// its share of the in-flight map's nodes and the backend's entry for it.
const REQUEST_OVERHEAD: u64 = 512;

/// An upper bound of the heap a request takes while in flight, known before
/// it is parsed: a chain of `chain_bytes` over `nr_segs` segments carries at
/// most that much data (and no more than `max_request_bytes` is ever
/// allocated: a larger request is answered at once), in a [`DataBuf`](crate::virtio::DataBuf) whose
/// chunk list takes at most 512 bytes, plus its writable segments kept for
/// the completion.
pub fn request_cost(chain_bytes: u64, nr_segs: usize, max_request_bytes: u32) -> u64 {
    let data = chain_bytes.min(u64::from(max_request_bytes));
    let segs = heap_cost(nr_segs.saturating_mul(core::mem::size_of::<Segment>()), core::mem::align_of::<Segment>());
    data + 512 + segs + REQUEST_OVERHEAD
}

/// What a device with `cfg` charges its VM's quota when it is made: its
/// largest request (a chain as long as the queue).
pub fn floor_cost(cfg: &BlkConfig) -> u64 {
    let max_segs = usize::from(cfg.queue_size_max.max(1));
    request_cost(u64::from(cfg.max_request_bytes) + HEADER_LEN + 1, max_segs, cfg.max_request_bytes)
}

impl VirtioBlk {
    /// Takes `cost` more into `held_cost`, charging the quota for what passes
    /// `floor`; false (and nothing changes) when the quota refuses.
    pub(super) fn hold(&mut self, cost: u64) -> bool {
        let held = self.held_cost + cost;
        let excess = held.saturating_sub(self.floor);
        if excess > self.charged && self.quota.try_charge(excess - self.charged).is_err() {
            return false;
        }
        self.charged = self.charged.max(excess);
        self.held_cost = held;
        true
    }

    /// Gives back `cost` taken by [`hold`](Self::hold).
    pub(super) fn unhold(&mut self, cost: u64) {
        self.held_cost = self.held_cost.saturating_sub(cost);
        let excess = self.held_cost.saturating_sub(self.floor);
        if excess < self.charged {
            self.quota.release(self.charged - excess);
            self.charged = excess;
        }
    }
}
