//! The physical virtio-blk device as a backend of the guest's virtio-blk
//! (`dom0_disk=backend`): the EL2 half of it, the identity-map [`Hal`] and
//! the MMIO transport. The driver itself ([`crate::virtio::phys::PhysDisk`])
//! is plain Rust, host-tested: every request (FLUSH included) is submitted
//! without waiting; the device's completion interrupt arrives at EL2, where
//! [`PhysDisk::poll`] collects the finished requests and hands them to the
//! guest-facing model. Data buffers are hypervisor heap (identity-mapped, and
//! QEMU virt has no IOMMU, so a buffer's address is its DMA address).

use crate::virtio::phys::{PhysDisk, PhysDiskError};
use core::alloc::Layout;
use core::ptr::NonNull;
use virtio_drivers::transport::mmio::{MmioTransport, VirtIOHeader};
use virtio_drivers::{BufferDirection, Hal, PhysAddr};

/// DMA and MMIO for `virtio-drivers` under the EL2 identity map.
pub struct IdentityHal;

// SAFETY: dma_alloc returns zeroed, page-aligned, identity-mapped memory that
// stays allocated until dma_dealloc; MMIO and shared buffers are identity
// mapped, so physical == virtual addresses, and no IOMMU translates DMA.
unsafe impl Hal for IdentityHal {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        let layout = Layout::from_size_align(pages * 4096, 4096).expect("DMA layout");
        // SAFETY: non-zero size.
        let p = unsafe { alloc::alloc::alloc_zeroed(layout) };
        let nn = NonNull::new(p).expect("out of memory for virtio DMA");
        (p as PhysAddr, nn)
    }

    unsafe fn dma_dealloc(_paddr: PhysAddr, vaddr: NonNull<u8>, pages: usize) -> i32 {
        let layout = Layout::from_size_align(pages * 4096, 4096).expect("DMA layout");
        // SAFETY: allocated by dma_alloc with this layout.
        unsafe { alloc::alloc::dealloc(vaddr.as_ptr(), layout) };
        0
    }

    unsafe fn mmio_phys_to_virt(paddr: PhysAddr, _size: usize) -> NonNull<u8> {
        NonNull::new(paddr as *mut u8).expect("null MMIO address")
    }

    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        buffer.as_ptr() as *mut u8 as PhysAddr
    }

    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {}
}

/// The physical disk at EL2.
pub type PhysBlk = PhysDisk<IdentityHal, MmioTransport<'static>>;

/// Takes over the virtio-blk device at `base` (identity-mapped).
///
/// # Safety
/// `base` must be a virtio-mmio frame of `size` bytes that nothing else
/// (in particular not the guest) accesses.
pub unsafe fn open(base: u64, size: usize) -> Result<PhysBlk, PhysDiskError> {
    let header = NonNull::new(base as *mut VirtIOHeader).ok_or(PhysDiskError::Transport)?;
    // SAFETY: guaranteed by the caller.
    let transport = unsafe { MmioTransport::new(header, size) }.map_err(|_| PhysDiskError::Transport)?;
    PhysDisk::new(transport)
}
