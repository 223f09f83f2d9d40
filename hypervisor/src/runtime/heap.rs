//! The hypervisor heap (buddy allocator) and stage-2 table frames.

use crate::stage2::TableAlloc;
use alloc::vec::Vec;
use buddy_system_allocator::LockedHeap;
use core::alloc::Layout;

#[global_allocator]
static HEAP: LockedHeap<32> = LockedHeap::empty();

/// Hands `[start, start+size)` to the allocator.
///
/// # Safety
/// The range must be identity-mapped normal memory used by nothing else.
pub unsafe fn init(start: usize, size: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe { HEAP.lock().init(start, size) };
}

/// Stage-2 table frames from the heap (VA == PA under the identity map).
/// It remembers the frames it handed out and gives access to those only.
#[derive(Default)]
pub struct HeapFrames {
    frames: Vec<u64>,
}

impl TableAlloc for HeapFrames {
    fn alloc_table(&mut self) -> Option<u64> {
        let layout = Layout::from_size_align(4096, 4096).ok()?;
        // SAFETY: a non-zero-size layout; the frame is never freed (stage-2
        // tables live as long as their VM, which is forever).
        let p = unsafe { alloc::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return None;
        }
        self.frames.try_reserve(1).ok()?;
        self.frames.push(p as u64);
        Some(p as u64)
    }
    fn table(&mut self, pa: u64) -> Option<&mut [u64; 512]> {
        if !self.frames.contains(&pa) {
            return None;
        }
        // SAFETY: `pa` is a live, 4 KiB-aligned, zero-initialised heap frame
        // that `alloc_table` handed out and that nothing else references;
        // the `&mut self` borrow keeps this the only reference through us.
        Some(unsafe { &mut *(pa as *mut [u64; 512]) })
    }
}
