//! The physical virtio-blk device as a backend of the guest's virtio-blk
//! (`dom0_disk=backend`), driven with the `virtio-drivers` crate.
//!
//! Requests are submitted without waiting (`*_blocks_nb`); the device's
//! completion interrupt arrives at EL2, where [`PhysBlk::poll`] collects
//! the finished requests and hands them to the guest-facing model, which
//! completes the guest's requests and raises its interrupt. Data buffers are
//! hypervisor heap (identity-mapped, and QEMU virt has no IOMMU, so a
//! buffer's address is its DMA address).
//!
//! FLUSH is the exception: the crate offers only a blocking flush, so a
//! guest FLUSH waits for the device on the pCPU that submitted it (flushes
//! are rare; reads and writes never wait).

use crate::virtio::{BackendError, BackendOp, BackendRequest, Completion};
use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;
use core::alloc::Layout;
use core::ptr::NonNull;
use virtio_drivers::device::blk::{BlkReq, BlkResp, RespStatus, VirtIOBlk};
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

/// A request on the device: the buffers must stay put until it completes.
struct InFlight {
    token: u64,
    write: bool,
    req: Box<BlkReq>,
    resp: Box<BlkResp>,
    buf: Vec<u8>,
}

pub struct PhysBlk {
    dev: VirtIOBlk<IdentityHal, MmioTransport<'static>>,
    in_flight: Vec<(u16, InFlight)>,
    /// Completions produced synchronously (flush, submission errors).
    ready: Vec<Completion>,
}

/// Requests in flight at most: the crate's queue has 16 descriptors and a
/// data request takes three.
const MAX_IN_FLIGHT: usize = 5;

#[derive(Debug)]
pub enum PhysBlkError {
    Transport,
    Device,
}

impl PhysBlk {
    /// Takes over the virtio-blk device at `base` (identity-mapped).
    ///
    /// # Safety
    /// `base` must be a virtio-mmio frame of `size` bytes that nothing else
    /// (in particular not the guest) accesses.
    pub unsafe fn new(base: u64, size: usize) -> Result<Self, PhysBlkError> {
        let header = NonNull::new(base as *mut VirtIOHeader).ok_or(PhysBlkError::Transport)?;
        // SAFETY: guaranteed by the caller.
        let transport = unsafe { MmioTransport::new(header, size) }.map_err(|_| PhysBlkError::Transport)?;
        let mut dev = VirtIOBlk::<IdentityHal, _>::new(transport).map_err(|_| PhysBlkError::Device)?;
        dev.enable_interrupts();
        Ok(Self { dev, in_flight: Vec::new(), ready: Vec::new() })
    }

    pub fn capacity_sectors(&self) -> u64 {
        self.dev.capacity()
    }

    pub fn read_only(&self) -> bool {
        self.dev.readonly()
    }

    pub fn free_slots(&self) -> usize {
        MAX_IN_FLIGHT.saturating_sub(self.in_flight.len())
    }

    pub fn submit(&mut self, r: BackendRequest) -> Result<(), BackendError> {
        if self.free_slots() == 0 {
            return Err(BackendError::Busy);
        }
        match r.op {
            BackendOp::Read { sector, len } => {
                let mut f = InFlight { token: r.token, write: false, req: Box::default(), resp: Box::default(), buf: vec![0; len as usize] };
                // SAFETY: req/buf/resp live in `f`, which is kept (boxed or
                // heap-backed, so they do not move) until the completion.
                let t = unsafe { self.dev.read_blocks_nb(sector as usize, &mut f.req, &mut f.buf, &mut f.resp) }.map_err(|_| BackendError::Io)?;
                self.in_flight.push((t, f));
            }
            BackendOp::Write { sector, data } => {
                let mut f = InFlight { token: r.token, write: true, req: Box::default(), resp: Box::default(), buf: data };
                // SAFETY: as above.
                let t = unsafe { self.dev.write_blocks_nb(sector as usize, &mut f.req, &f.buf, &mut f.resp) }.map_err(|_| BackendError::Io)?;
                self.in_flight.push((t, f));
            }
            BackendOp::Flush => {
                let result = self.dev.flush().map(|_| Vec::new()).map_err(|_| BackendError::Io);
                self.ready.push(Completion { token: r.token, result });
            }
        }
        Ok(())
    }

    /// Collects finished requests (after the device's interrupt).
    pub fn poll(&mut self) -> Vec<Completion> {
        let _ = self.dev.ack_interrupt();
        let mut done = core::mem::take(&mut self.ready);
        while let Some(t) = self.dev.peek_used() {
            let Some(i) = self.in_flight.iter().position(|(tok, _)| *tok == t) else { break };
            let (_, mut f) = self.in_flight.swap_remove(i);
            // SAFETY: the same buffers as at submission.
            let r = unsafe {
                if f.write {
                    self.dev.complete_write_blocks(t, &f.req, &f.buf, &mut f.resp)
                } else {
                    self.dev.complete_read_blocks(t, &f.req, &mut f.buf, &mut f.resp)
                }
            };
            let ok = r.is_ok() && f.resp.status() == RespStatus::OK;
            let result = match (ok, f.write) {
                (true, true) => Ok(Vec::new()),
                (true, false) => Ok(core::mem::take(&mut f.buf)),
                (false, _) => Err(BackendError::Io),
            };
            done.push(Completion { token: f.token, result });
        }
        done
    }

    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }
}
