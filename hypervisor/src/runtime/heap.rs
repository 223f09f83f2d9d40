//! The hypervisor heap (buddy allocator) and stage-2 table frames.

use crate::stage2::TableAlloc;
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
pub struct HeapFrames;

impl TableAlloc for HeapFrames {
    fn alloc_table(&mut self) -> Option<u64> {
        let layout = Layout::from_size_align(4096, 4096).ok()?;
        // SAFETY: non-zero size layout.
        let p = unsafe { alloc::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            None
        } else {
            Some(p as u64)
        }
    }
    fn table(&mut self, pa: u64) -> &mut [u64; 512] {
        // SAFETY: `pa` was returned by `alloc_table` (stage-2 code only
        // passes addresses it stored), so it is a live 4 KiB frame of ours.
        unsafe { &mut *(pa as *mut [u64; 512]) }
    }
}
