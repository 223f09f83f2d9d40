//! A disk image in memory with a fixed service time: the `--disk ram`
//! backend, and the tests' backend.
//!
//! Every request completes exactly `latency_ns` after its submit time (the
//! `now_ns` the caller gave [`super::VirtioBlk::process_queue`]), independently
//! of the others (an infinite-server device: queue depth does not add
//! waiting). The EL2 code arms its timer at [`RamBackend::next_deadline`] and,
//! when it fires, passes each of [`RamBackend::poll`]'s completions to
//! [`super::VirtioBlk::complete`]. With `latency_ns == 0`, polling right after
//! `process_queue` completes everything at once.
//!
//! The image is touched at *completion* time: a write's data (copied out of
//! the guest at submit) is stored, and a read's data is copied from the image,
//! when the request completes, as a real device would do its work before
//! signalling. So a read submitted while an overlapping write is in flight
//! sees whichever completes first — virtio-blk gives no ordering between
//! outstanding requests, and Linux never issues such pairs.

use super::blk::{BackendError, BackendOp, BackendRequest, BlockBackend, Completion, SECTOR_SIZE};
use super::buf::DataBuf;
use alloc::collections::VecDeque;
use alloc::vec::Vec;

/// The in-memory disk. `S` is the storage: a `Vec<u8>` on the host, a
/// `&'static mut [u8]` over a boot module at EL2.
pub struct RamBackend<S: AsRef<[u8]> + AsMut<[u8]> = Vec<u8>> {
    image: S,
    read_only: bool,
    latency_ns: u64,
    /// (deadline, request), in submit order.
    pending: VecDeque<(u64, BackendRequest)>,
    /// Most requests accepted at once (`free_slots`). Unbounded by default:
    /// the device bounds what it hands over (requests and bytes, counting
    /// those a guest reset orphaned until they complete here).
    pub max_in_flight: usize,
    /// Flushes seen (there is nothing to flush; counted for tests).
    pub flushes: u64,
}

impl<S: AsRef<[u8]> + AsMut<[u8]>> RamBackend<S> {
    pub fn new(image: S, read_only: bool, latency_ns: u64) -> Self {
        Self { image, read_only, latency_ns, pending: VecDeque::new(), max_in_flight: usize::MAX, flushes: 0 }
    }

    /// Whole 512-byte sectors in the image (a partial last sector is unused).
    pub fn capacity_sectors(&self) -> u64 {
        self.image.as_ref().len() as u64 / SECTOR_SIZE
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    pub fn latency_ns(&self) -> u64 {
        self.latency_ns
    }

    pub fn image(&self) -> &[u8] {
        self.image.as_ref()
    }

    pub fn image_mut(&mut self) -> &mut [u8] {
        self.image.as_mut()
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The earliest completion time of a pending request.
    pub fn next_deadline(&self) -> Option<u64> {
        self.pending.iter().map(|(d, _)| *d).min()
    }

    /// Complete every request whose deadline is `<= now_ns`, in deadline
    /// order (submit order among equal deadlines).
    pub fn poll(&mut self, now_ns: u64) -> Vec<Completion> {
        let mut due: Vec<(u64, BackendRequest)> = Vec::new();
        let mut keep = VecDeque::with_capacity(self.pending.len());
        while let Some(p) = self.pending.pop_front() {
            if p.0 <= now_ns {
                due.push(p);
            } else {
                keep.push_back(p);
            }
        }
        self.pending = keep;
        due.sort_by_key(|(d, _)| *d);
        due.into_iter().map(|(_, r)| self.execute(r)).collect()
    }

    fn range(&self, sector: u64, len: u64) -> Result<core::ops::Range<usize>, BackendError> {
        let start = sector.checked_mul(SECTOR_SIZE).ok_or(BackendError::OutOfRange)?;
        let end = start.checked_add(len).ok_or(BackendError::OutOfRange)?;
        if end > self.capacity_sectors() * SECTOR_SIZE {
            return Err(BackendError::OutOfRange);
        }
        Ok(start as usize..end as usize)
    }

    fn execute(&mut self, r: BackendRequest) -> Completion {
        let result = match r.op {
            BackendOp::Read { sector, len } => self
                .range(sector, u64::from(len))
                .and_then(|rg| DataBuf::try_copy_of(&self.image.as_ref()[rg]).map_err(|_| BackendError::NoMemory)),
            BackendOp::Write { sector, data } => {
                if self.read_only {
                    Err(BackendError::ReadOnly)
                } else {
                    self.range(sector, data.len() as u64).map(|rg| {
                        data.copy_to(&mut self.image.as_mut()[rg]);
                        DataBuf::new()
                    })
                }
            }
            BackendOp::Flush => {
                self.flushes += 1;
                Ok(DataBuf::new())
            }
        };
        Completion { token: r.token, result }
    }
}

impl<S: AsRef<[u8]> + AsMut<[u8]>> BlockBackend for RamBackend<S> {
    fn submit(&mut self, req: BackendRequest) -> Result<(), BackendError> {
        if self.pending.len() >= self.max_in_flight {
            return Err(BackendError::Busy);
        }
        let deadline = req.submit_ns.saturating_add(self.latency_ns);
        self.pending.push_back((deadline, req));
        Ok(())
    }

    fn free_slots(&self) -> usize {
        self.max_in_flight.saturating_sub(self.pending.len())
    }
}
