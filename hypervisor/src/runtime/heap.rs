//! The hypervisor heap (buddy allocator) and stage-2 table frames.
//!
//! The heap starts as a bootstrap region inside the image (.bss), so device
//! tree discovery and the boot-layout plan can allocate before the
//! hypervisor knows where the DTB, the boot modules and reserved memory lie;
//! the planned main heap is added to it afterwards (`add`).

use crate::quota::{heap_cost, Quota};
use crate::stage2::TableAlloc;
use crate::sync::Mutex;
use alloc::sync::Arc;
use alloc::vec::Vec;
use buddy_system_allocator::Heap;
use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicUsize, Ordering};

/// The buddy allocator behind one of our locks (`crate::sync`: waiting
/// pCPUs YIELD), instead of `buddy_system_allocator::LockedHeap`, whose
/// `spin` lock waits with ISB.
struct LockedHeap(Mutex<Heap<32>>);

// SAFETY: `alloc` hands out blocks the buddy allocator owns exclusively
// until `dealloc` returns them with the same layout; the lock serialises
// every access to the allocator's state.
unsafe impl GlobalAlloc for LockedHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let mut h = self.0.lock();
        let p = h.alloc(layout).ok().map_or(core::ptr::null_mut(), |p| p.as_ptr());
        HEAP_HWM.fetch_max(h.stats_alloc_actual(), Ordering::Relaxed);
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if let Some(p) = NonNull::new(ptr) {
            // SAFETY: the caller returns a block `alloc` handed out with
            // this layout (GlobalAlloc's contract).
            unsafe { self.0.lock().dealloc(p, layout) };
        }
    }
}

#[global_allocator]
static HEAP: LockedHeap = LockedHeap(Mutex::new(Heap::new()));

/// The most bytes the heap ever had handed out at once (buddy blocks).
static HEAP_HWM: AtomicUsize = AtomicUsize::new(0);

/// The heap's use in bytes: now, the most ever, and its size.
pub struct HeapStats {
    pub used: usize,
    pub hwm: usize,
    pub size: usize,
}

pub fn stats() -> HeapStats {
    let h = HEAP.0.lock();
    HeapStats { used: h.stats_alloc_actual(), hwm: HEAP_HWM.load(Ordering::Relaxed), size: h.stats_total_bytes() }
}

/// Size of the bootstrap heap: room for a 2 MiB DTB copy (the largest the
/// boot code accepts) besides discovery's own allocations. The buddy
/// allocator finds an aligned 2 MiB block in any 4 MiB range.
const BOOT_HEAP_SIZE: usize = 4 << 20;

#[repr(C, align(4096))]
struct BootHeap([u8; BOOT_HEAP_SIZE]);

static mut BOOT_HEAP: BootHeap = BootHeap([0; BOOT_HEAP_SIZE]);

/// Hands the bootstrap region (part of the image) to the allocator. Called
/// once, by the primary CPU, after the MMU is on and before any allocation.
pub fn init_bootstrap() {
    let start = core::ptr::addr_of_mut!(BOOT_HEAP) as usize;
    // SAFETY: BOOT_HEAP is in the image's .bss (zeroed by the entry code,
    // identity-mapped normal memory); nothing but the allocator uses it, and
    // this runs once, so the range is added once.
    unsafe { HEAP.0.lock().init(start, BOOT_HEAP_SIZE) };
}

/// Adds `[start, start+size)` (the planned main heap) to the allocator.
///
/// # Safety
/// The range must be identity-mapped normal memory used by nothing else,
/// and not already part of the heap.
pub unsafe fn add(start: usize, size: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe { HEAP.0.lock().add_to_heap(start, start + size) };
}

/// Stage-2 table frames from the heap (VA == PA under the identity map).
/// It remembers the frames it handed out and gives access to those only.
/// Once [`charge_to`](Self::charge_to) names a VM's quota, every new table
/// (and the growth of the frame list) is charged to it first.
#[derive(Default)]
pub struct HeapFrames {
    frames: Vec<u64>,
    quota: Option<Arc<Quota>>,
}

impl HeapFrames {
    /// Charges tables made from now on to `quota`.
    pub fn charge_to(&mut self, quota: Arc<Quota>) {
        self.quota = Some(quota);
    }

    /// Cleans every frame handed out to the point of coherency, for a
    /// walker that does not snoop (an SMMU).
    pub fn clean_to_poc(&self) {
        for &f in &self.frames {
            crate::arch::cache::clean_to_poc(f, 4096);
        }
    }

    /// A zeroed 4 KiB frame, remembered; `None` when the heap has no room.
    fn new_frame(&mut self) -> Option<u64> {
        self.frames.try_reserve(1).ok()?;
        let layout = Layout::from_size_align(4096, 4096).ok()?;
        // SAFETY: a non-zero-size layout; the frame is freed when its VM is
        // (`Drop`).
        let p = unsafe { alloc::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return None;
        }
        self.frames.push(p as u64);
        Some(p as u64)
    }
}

impl Drop for HeapFrames {
    /// Frees every frame: the VM whose tables they are is being freed, no
    /// pCPU runs it, and its VMID's TLB entries were invalidated
    /// (`runtime::domctl`).
    fn drop(&mut self) {
        let Ok(layout) = Layout::from_size_align(4096, 4096) else { return };
        for &f in &self.frames {
            // SAFETY: `f` came from `alloc_zeroed` with this layout in
            // `new_frame` and is freed once, here.
            unsafe { alloc::alloc::dealloc(f as *mut u8, layout) };
        }
    }
}

impl TableAlloc for HeapFrames {
    fn alloc_table(&mut self) -> Option<u64> {
        // The frame, and the list when it must grow (charged at its new
        // size; the old block is given back to the heap, not to the quota,
        // so the charge stays above what is used).
        let grow = self.frames.len() == self.frames.capacity();
        let cost = 4096 + if grow { heap_cost(8 * 2 * self.frames.capacity().max(4), 8) } else { 0 };
        if let Some(q) = &self.quota {
            q.try_charge(cost).ok()?;
        }
        let frame = self.new_frame();
        if frame.is_none() {
            if let Some(q) = &self.quota {
                q.release(cost);
            }
        }
        frame
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
