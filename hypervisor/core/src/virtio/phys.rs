//! A physical virtio-blk device as a [`BlockBackend`] (`dom0_disk=backend`):
//! the driver side, built on `virtio-drivers`' split [`VirtQueue`] and
//! [`Transport`], generic over the [`Hal`] so the host tests can run it
//! against a fake device.
//!
//! # Why not the crate's `VirtIOBlk`
//!
//! `VirtIOBlk` 0.13 submits reads and writes without waiting, but its only
//! FLUSH is blocking (`add_notify_wait_pop`): it spins until the *next* used
//! element appears and pops it as its own. With another request in flight
//! that element is usually someone else's, so the flush fails with
//! `WrongToken`, its descriptors are never recycled, and the used ring stays
//! stuck at an entry nobody pops, losing every later completion. It also
//! spins on the pCPU (IRQs masked, the disk lock held) for as long as the
//! device takes. Its request header type cannot be built with another
//! request type from outside the crate, so this module builds the three
//! requests itself (a 16-byte header, the data, a status byte) and submits
//! each one with [`VirtQueue::add`]; completions are collected in
//! [`PhysDisk::poll`] after the device's interrupt, in whatever order the
//! device finishes them.
//!
//! # FLUSH is not held back
//!
//! A virtio-blk FLUSH makes durable the writes *completed* before it was
//! submitted (virtio 1.2 §5.2.6.1). The guest learns that a write completed
//! only after the physical device completed it, so every write a guest FLUSH
//! must cover has already completed on the physical device when the FLUSH
//! is passed on, in arrival order, beside whatever else is in flight. Writes
//! still in flight are not covered, exactly as for the guest's own device.
//!
//! # Nothing the guest sends reaches a `virtio-drivers` assertion
//!
//! The crate asserts on empty buffers (`assert_ne!(buffer.len(), 0)`), and
//! a descriptor length must fit in `u32`. The device model already answers
//! such requests IOERR ([`super::blk`]); [`PhysDisk::submit`] checks again
//! (non-empty, whole sectors, at most [`MAX_TRANSFER`], inside the
//! capacity, sector arithmetic without overflow) and returns a
//! [`BackendError`] instead of ever handing the crate a bad buffer.
//!
//! # Buffers
//!
//! Header, data and status of a request are heap allocations owned by its
//! entry in `in_flight` until the device has returned the chain; moving the
//! entry does not move them. Should the device return a chain we never
//! submitted, the device is declared broken: every request in flight fails
//! with `Io` and its buffers are leaked, since the device may still write
//! them.

use super::blk::{
    BackendError, BackendOp, BackendRequest, BlockBackend, Completion, SECTOR_SIZE, S_OK, T_FLUSH, T_IN, T_OUT,
};
use super::buf::DataBuf;
use alloc::boxed::Box;
use alloc::vec::Vec;
use virtio_drivers::queue::VirtQueue;
use virtio_drivers::transport::{DeviceStatus, DeviceType, Transport};
use virtio_drivers::Hal;

/// Descriptors in the queue (and so requests in flight with indirect
/// descriptors; a third of it without).
pub const QUEUE_SIZE: usize = 16;
/// Largest data transfer of one request (the guest-facing device allows
/// [`super::BlkConfig::max_request_bytes`], 4 MiB by default).
pub const MAX_TRANSFER: u64 = 4 << 20;

/// Most data chunks of one request: a [`DataBuf`] of at most
/// [`MAX_TRANSFER`] bytes in whole sectors has one per set bit from 512 up.
const MAX_CHUNKS: usize = (MAX_TRANSFER.trailing_zeros() - SECTOR_SIZE.trailing_zeros() + 1) as usize;
/// Descriptors of one request without indirect descriptors: the header, the
/// chunks, the status byte.
const MAX_DESCRIPTORS: usize = MAX_CHUNKS + 2;
const _: () = assert!(MAX_DESCRIPTORS <= QUEUE_SIZE, "a request must fit the queue without indirect descriptors");

const F_RO: u64 = 1 << 5;
const F_FLUSH: u64 = 1 << 9;
const F_INDIRECT_DESC: u64 = 1 << 28;
const F_VERSION_1: u64 = 1 << 32;

/// Why the device cannot be driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhysDiskError {
    /// No virtio transport there (bad magic or version, null frame).
    Transport,
    /// The transport is not a block device.
    NotBlock,
    /// FEATURES_OK did not stick (the device refused our features).
    FeaturesRejected,
    /// Reading the configuration space or setting up the queue failed.
    Driver(virtio_drivers::Error),
}

impl From<virtio_drivers::Error> for PhysDiskError {
    fn from(e: virtio_drivers::Error) -> Self {
        PhysDiskError::Driver(e)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Flush,
}

/// One request on the device. The buffers stay put (heap) until the device
/// returns the chain.
struct Request {
    token: u64,
    kind: Kind,
    header: Box<[u8; 16]>,
    /// Read destination or write source; empty for FLUSH.
    data: DataBuf,
    status: Box<[u8; 1]>,
}

impl Request {
    /// Hands the buffers to the queue.
    ///
    /// # Safety
    /// The buffers must stay allocated and untouched until the chain is
    /// popped with [`Request::pop`] (or be leaked).
    unsafe fn add<H: Hal>(&mut self, q: &mut VirtQueue<H, QUEUE_SIZE>) -> virtio_drivers::Result<u16> {
        let Request { kind, header, data, status, .. } = self;
        let (ins, n_in, mut outs, n_out) = buffers(*kind, header, data, status);
        // SAFETY: forwarded from the caller; no buffer is empty (data is
        // checked non-empty for reads and writes and not used for FLUSH,
        // and a DataBuf has no empty chunk).
        unsafe { q.add(&ins[..n_in], &mut outs[..n_out]) }
    }

    /// Takes the chain `token` back from the queue.
    ///
    /// # Safety
    /// `token` must be what [`Request::add`] returned for these buffers.
    unsafe fn pop<H: Hal>(&mut self, q: &mut VirtQueue<H, QUEUE_SIZE>, token: u16) -> virtio_drivers::Result<u32> {
        let Request { kind, header, data, status, .. } = self;
        let (ins, n_in, mut outs, n_out) = buffers(*kind, header, data, status);
        // SAFETY: forwarded from the caller: the same buffers as at `add`.
        unsafe { q.pop_used(token, &ins[..n_in], &mut outs[..n_out]) }
    }
}

/// Device-readable and device-writable buffers of a request, in chain order
/// (header, data chunks, status), and how many of each array are used.
type Buffers<'a> = ([&'a [u8]; MAX_DESCRIPTORS], usize, [&'a mut [u8]; MAX_DESCRIPTORS], usize);

fn buffers<'a>(kind: Kind, header: &'a [u8; 16], data: &'a mut DataBuf, status: &'a mut [u8; 1]) -> Buffers<'a> {
    let mut ins: [&[u8]; MAX_DESCRIPTORS] = [&[]; MAX_DESCRIPTORS];
    let mut outs: [&mut [u8]; MAX_DESCRIPTORS] = core::array::from_fn(|_| <&mut [u8]>::default());
    ins[0] = &header[..];
    let (mut n_in, mut n_out) = (1, 0);
    match kind {
        Kind::Read => {
            for c in data.chunks_mut().take(MAX_CHUNKS) {
                outs[n_out] = c;
                n_out += 1;
            }
        }
        Kind::Write => {
            for c in data.chunks().take(MAX_CHUNKS) {
                ins[n_in] = c;
                n_in += 1;
            }
        }
        Kind::Flush => {}
    }
    outs[n_out] = &mut status[..];
    (ins, n_in, outs, n_out + 1)
}

/// The driver for one physical virtio-blk device.
pub struct PhysDisk<H: Hal, T: Transport> {
    transport: T,
    queue: VirtQueue<H, QUEUE_SIZE>,
    capacity: u64,
    read_only: bool,
    flush: bool,
    /// Requests the queue can hold at once.
    slots: usize,
    /// (descriptor head = virtio-drivers token, request).
    in_flight: Vec<(u16, Request)>,
    /// Completions made without the device (FLUSH on a device without a
    /// cache, requests failed when the device broke).
    ready: Vec<Completion>,
    broken: bool,
}

impl<H: Hal, T: Transport> PhysDisk<H, T> {
    /// Resets and initialises the device behind `transport` (virtio 1.2
    /// §3.1.1) with one queue and interrupts enabled.
    pub fn new(mut transport: T) -> Result<Self, PhysDiskError> {
        if transport.device_type() != DeviceType::Block {
            return Err(PhysDiskError::NotBlock);
        }
        transport.set_status(DeviceStatus::empty());
        transport.set_status(DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER);
        let offered = transport.read_device_features();
        let accepted = offered & (F_VERSION_1 | F_RO | F_FLUSH | F_INDIRECT_DESC);
        transport.write_driver_features(accepted);
        transport.set_status(DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER | DeviceStatus::FEATURES_OK);
        // A legacy device has no FEATURES_OK to read back.
        if accepted & F_VERSION_1 != 0 && !transport.get_status().contains(DeviceStatus::FEATURES_OK) {
            transport.set_status(DeviceStatus::FAILED);
            return Err(PhysDiskError::FeaturesRejected);
        }
        transport.set_guest_page_size(virtio_drivers::PAGE_SIZE as u32);
        let capacity = transport.read_consistent(|| {
            let lo: u32 = transport.read_config_space(0)?;
            let hi: u32 = transport.read_config_space(4)?;
            Ok(u64::from(lo) | (u64::from(hi) << 32))
        })?;
        let indirect = accepted & F_INDIRECT_DESC != 0;
        let mut queue = VirtQueue::new(&mut transport, 0, indirect, false)?;
        transport.finish_init();
        queue.set_dev_notify(true);
        Ok(Self {
            transport,
            queue,
            capacity,
            read_only: accepted & F_RO != 0,
            flush: accepted & F_FLUSH != 0,
            // Without indirect descriptors a request takes up to
            // MAX_DESCRIPTORS of the ring, so one is on the device at a time.
            slots: if indirect { QUEUE_SIZE } else { QUEUE_SIZE / MAX_DESCRIPTORS },
            in_flight: Vec::new(),
            ready: Vec::new(),
            broken: false,
        })
    }

    /// Disk size in 512-byte sectors.
    pub fn capacity_sectors(&self) -> u64 {
        self.capacity
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Requests on the device now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Completions [`poll`](Self::poll) can return without an interrupt.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// The device returned something impossible; it is no longer used.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// A data transfer of `len` bytes at `sector` that the device and
    /// `virtio-drivers` can take.
    fn check(&self, sector: u64, len: u64) -> Result<(), BackendError> {
        if len == 0 || !len.is_multiple_of(SECTOR_SIZE) || len > MAX_TRANSFER {
            return Err(BackendError::Io);
        }
        match sector.checked_add(len / SECTOR_SIZE) {
            Some(end) if end <= self.capacity => Ok(()),
            _ => Err(BackendError::OutOfRange),
        }
    }

    /// Starts `r` on the device without waiting for it.
    pub fn submit(&mut self, r: BackendRequest) -> Result<(), BackendError> {
        if self.broken {
            return Err(BackendError::Io);
        }
        if r.op == BackendOp::Flush && !self.flush {
            // No FLUSH feature: the device has no volatile cache to flush.
            self.ready.push(Completion { token: r.token, result: Ok(DataBuf::new()) });
            return Ok(());
        }
        if self.in_flight.len() >= self.slots {
            return Err(BackendError::Busy);
        }
        let (kind, ty, sector, data) = match r.op {
            BackendOp::Read { sector, len } => {
                self.check(sector, u64::from(len))?;
                let data = DataBuf::try_zeroed(len as usize).map_err(|_| BackendError::NoMemory)?;
                (Kind::Read, T_IN, sector, data)
            }
            BackendOp::Write { sector, data } => {
                if self.read_only {
                    return Err(BackendError::ReadOnly);
                }
                self.check(sector, data.len() as u64)?;
                (Kind::Write, T_OUT, sector, data)
            }
            BackendOp::Flush => (Kind::Flush, T_FLUSH, 0, DataBuf::new()),
        };
        let mut header = Box::new([0u8; 16]);
        header[..4].copy_from_slice(&ty.to_le_bytes());
        header[8..].copy_from_slice(&sector.to_le_bytes());
        let mut req = Request { token: r.token, kind, header, data, status: Box::new([0xff]) };
        // SAFETY: `req` goes into `self.in_flight` and its buffers are not
        // touched until `poll` pops the chain (or `break_down` leaks them).
        let head = unsafe { req.add(&mut self.queue) }.map_err(|_| BackendError::Busy)?;
        if self.queue.should_notify() {
            self.transport.notify(0);
        }
        self.in_flight.push((head, req));
        Ok(())
    }

    /// Collects what the device finished (after its interrupt), in the order
    /// it finished them.
    pub fn poll(&mut self) -> Vec<Completion> {
        let _ = self.transport.ack_interrupt();
        let mut done = core::mem::take(&mut self.ready);
        while let Some(head) = self.queue.peek_used() {
            let Some(i) = self.in_flight.iter().position(|(h, _)| *h == head) else {
                self.break_down(&mut done);
                break;
            };
            let (_, mut req) = self.in_flight.swap_remove(i);
            // SAFETY: `head` is the token `add` returned for these buffers.
            if unsafe { req.pop(&mut self.queue, head) }.is_err() {
                // Cannot happen after peek_used; if it does, the chain is
                // still the device's.
                self.in_flight.push((head, req));
                self.break_down(&mut done);
                break;
            }
            let result = match (req.status[0], req.kind) {
                (S_OK, Kind::Read) => Ok(core::mem::take(&mut req.data)),
                (S_OK, _) => Ok(DataBuf::new()),
                _ => Err(BackendError::Io),
            };
            done.push(Completion { token: req.token, result });
        }
        done
    }

    /// The device returned a chain we did not give it: stop using it, fail
    /// everything in flight, and leak the buffers it may still write.
    fn break_down(&mut self, done: &mut Vec<Completion>) {
        log::error!(
            "physical virtio-blk returned an unknown descriptor chain; failing {} requests",
            self.in_flight.len()
        );
        self.broken = true;
        for (_, req) in self.in_flight.drain(..) {
            done.push(Completion { token: req.token, result: Err(BackendError::Io) });
            core::mem::forget(req);
        }
    }
}

impl<H: Hal, T: Transport> BlockBackend for PhysDisk<H, T> {
    fn submit(&mut self, req: BackendRequest) -> Result<(), BackendError> {
        PhysDisk::submit(self, req)
    }
    fn free_slots(&self) -> usize {
        if self.broken {
            // Let requests through to fail at once rather than wait forever.
            return usize::MAX;
        }
        self.slots.saturating_sub(self.in_flight.len())
    }
}

impl<H: Hal, T: Transport> Drop for PhysDisk<H, T> {
    fn drop(&mut self) {
        // Stop the device before the queue and the buffers are freed.
        self.transport.set_status(DeviceStatus::empty());
        self.transport.queue_unset(0);
    }
}
