//! Heap blocks handed to a device that walks them itself (the ITS's
//! tables and queues, the SMMU's stream tables and queues): zeroed,
//! aligned, at VA == PA under the identity map, and cleaned to the point
//! of coherency for a reader that does not snoop the caches.

use crate::cache;
use alloc::alloc::{alloc_zeroed, dealloc, Layout};

/// The heap had no block of the size and alignment asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoMemory;

/// A heap block a device reads or writes: physical address and layout.
#[derive(Clone, Copy)]
pub struct Frame {
    pub pa: u64,
    layout: Layout,
}

impl Frame {
    /// A zeroed block of `bytes` (non-zero) aligned to `align` (a power of
    /// two), cleaned to PoC when `clean` (a non-snooping reader).
    pub fn new(bytes: usize, align: usize, clean: bool) -> Result<Frame, NoMemory> {
        let layout = Layout::from_size_align(bytes, align).map_err(|_| NoMemory)?;
        if bytes == 0 {
            return Err(NoMemory);
        }
        // SAFETY: `layout` has a non-zero size (checked above); the block is
        // only handed to a device and freed with the same layout.
        let p = unsafe { alloc_zeroed(layout) };
        if p.is_null() {
            return Err(NoMemory);
        }
        if clean {
            cache::clean_to_poc(p as u64, bytes as u64);
        }
        Ok(Frame { pa: p as u64, layout })
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> usize {
        self.layout.size()
    }

    /// Gives the block back. The device must no longer use it.
    pub fn free(self) {
        // SAFETY: allocated by `Frame::new` with this layout; the caller
        // has made the device stop using it (e.g. MAPD Valid = 0 has
        // completed).
        unsafe { dealloc(self.pa as *mut u8, self.layout) };
    }
}
