//! virtio-blk (virtio 1.2 §5.2): request parsing and the device.
//!
//! # Requests, framing-agnostic
//!
//! A request is a descriptor chain whose device-readable bytes are the
//! 16-byte header (`type u32, reserved u32, sector u64`) followed, for OUT,
//! by the data, and whose device-writable bytes are the data for IN (or the
//! 20-byte id for GET_ID) followed by the 1-byte status. As §2.6.4 requires,
//! the device makes no assumption about how these bytes are split into
//! descriptors: it treats the readable and the writable segments as two
//! byte streams. The status byte is the last byte of the writable stream.
//!
//! | type | handled | status |
//! |------|---------|--------|
//! | IN (0) | backend `Read`, data copied into the guest at completion | OK / IOERR |
//! | OUT (1) | data copied out of the guest at submit, backend `Write` | OK / IOERR |
//! | FLUSH (4) | backend `Flush` | OK / IOERR |
//! | GET_ID (8) | at once: up to 20 bytes of [`BlkConfig::serial`] | OK |
//! | anything else | at once | UNSUPP |
//!
//! IOERR without touching the backend when: the header is short; IN has
//! device-readable data or OUT has device-writable data (wrong direction); the
//! data length is zero, not a multiple of 512 or exceeds
//! [`BlkConfig::max_request_bytes`]; the sector range passes the capacity
//! (or overflows); a data segment is outside guest RAM; OUT on a read-only
//! device. A zero-length IN or OUT is valid framing but transfers nothing;
//! Linux never sends one, and it is answered IOERR rather than passed on, so
//! no backend ever sees an empty transfer (`virtio-drivers` asserts on one).
//!
//! # Chains that cannot be answered
//!
//! When the chain itself is broken (index out of range, loop or longer than
//! the queue, bad indirect table, descriptor table outside RAM) or no status
//! byte can be written (no device-writable byte, or it lies outside guest
//! RAM), there is nowhere to put an error status. [`BadChainPolicy`] decides:
//! `ReturnUnused` (default) puts the head in the used ring with length 0, so
//! the driver gets its descriptors back and the device keeps serving the
//! other requests; `NeedsReset` sets DEVICE_NEEDS_RESET and stops the device
//! until the driver resets it. Linux's virtio_blk never builds such chains;
//! only a buggy or hostile guest does, and either way it only hurts itself.
//! Broken *rings* (avail index jumping by more than the queue size, rings
//! outside RAM at QueueReady) always mean DEVICE_NEEDS_RESET.
//!
//! # In flight, and what a reset does to it
//!
//! Every backend request carries a device-unique token; the device keeps
//! (queue, head, where the read data and status go) per token until the
//! backend's [`Completion`] comes back through [`VirtioBlk::complete`].
//!
//! A reset (Status = 0) or QueueReady = 0 *orphans* the in-flight requests of
//! the affected queues: the backend still holds them (a RAM disk's pending
//! list, a physical device's DMA buffers), so the device keeps counting them
//! until the backend really finishes; their completions are then dropped
//! without touching guest memory (the driver may have reused the buffers, and
//! a re-enabled queue starts over) and counted as `stale_completions`.
//!
//! The budget covers orphans and live requests alike, so a guest that resets
//! or toggles QueueReady in a loop cannot make the backend hold more than:
//! at most [`BlkConfig::max_in_flight_requests`] requests, at most
//! `queue size` live ones per queue, at most what
//! [`BlockBackend::free_slots`] allows, and at most
//! [`BlkConfig::max_in_flight_bytes`] of data (one request is admitted when
//! nothing at all is held). When any of these is exhausted the remaining
//! chains stay in the avail ring (they are not fetched, nothing is
//! allocated for them), and the completion that frees room returns
//! [`Effects::notify`] so the caller processes the queue again.
//!
//! Besides the device's own budget, every request is charged to the VM's
//! heap quota ([`crate::quota`]) at admission, by an upper bound of what it
//! will hold ([`request_cost`]), and given back when it is answered or
//! completed. The largest request is charged once when the device is made
//! ([`VirtioBlk::with_quota`]), so the quota never stops the first request;
//! beyond it, a VM at its quota finds its chains waiting in the ring
//! (`quota_stalls`) until a completion gives heap back.
//!
//! Accounting: `reads + writes + flushes` (requests handed to the backend)
//! always equals `completions + in_flight`.

use super::buf::DataBuf;
use super::mmio::{Effects, Event, MmioError, MmioTransport};
use super::queue::{ChainError, QueueError, Segment};
use super::{features, irq, GuestMemory, GuestMemoryExt, MemError};
use crate::quota::{heap_cost, Quota};
use alloc::collections::BTreeMap;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

pub const VIRTIO_ID_BLOCK: u32 = 2;
pub const SECTOR_SIZE: u64 = 512;

pub const T_IN: u32 = 0;
pub const T_OUT: u32 = 1;
pub const T_FLUSH: u32 = 4;
pub const T_GET_ID: u32 = 8;

pub const S_OK: u8 = 0;
pub const S_IOERR: u8 = 1;
pub const S_UNSUPP: u8 = 2;

/// Bytes in the GET_ID answer.
pub const ID_BYTES: usize = 20;
/// Bytes of `struct virtio_blk_config` the device fills (up to and
/// including the write-zeroes fields; the rest reads as zero).
pub const CONFIG_LEN: usize = 60;
const HEADER_LEN: u64 = 16;
/// Log at most this many bad requests per device (then count only).
const LOG_LIMIT: u64 = 16;

/// What to do with a chain that has no usable status byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadChainPolicy {
    /// Return the head with used length 0 and keep serving.
    ReturnUnused,
    /// Set DEVICE_NEEDS_RESET and stop.
    NeedsReset,
}

/// The device's fixed parameters.
#[derive(Clone, Debug)]
pub struct BlkConfig {
    /// Disk size in 512-byte sectors.
    pub capacity_sectors: u64,
    /// Offer VIRTIO_BLK_F_RO and fail writes.
    pub read_only: bool,
    /// GET_ID answer (NUL-padded, not necessarily NUL-terminated).
    pub serial: [u8; ID_BYTES],
    /// QueueNumMax (a power of two).
    pub queue_size_max: u16,
    /// Advertised seg_max (VIRTIO_BLK_F_SEG_MAX): data segments per request.
    pub seg_max: u32,
    /// Advertised size_max (VIRTIO_BLK_F_SIZE_MAX) when `Some`.
    pub size_max: Option<u32>,
    /// Advertised blk_size (VIRTIO_BLK_F_BLK_SIZE), the logical block size.
    pub blk_size: u32,
    /// Largest data transfer of one request; larger ones get IOERR.
    pub max_request_bytes: u32,
    /// Most data bytes of all in-flight requests together (write data is
    /// held by the device/backend until completion, read buffers by the
    /// backend): further chains wait in the ring. Bounds the hypervisor heap
    /// a guest can tie up; one request is always admitted when none is in
    /// flight. Requests orphaned by a reset count until the backend
    /// finishes them.
    pub max_in_flight_bytes: u64,
    /// Most requests held by the backend at once (live and orphaned).
    pub max_in_flight_requests: usize,
    /// Offer VIRTIO_F_INDIRECT_DESC.
    pub indirect_desc: bool,
    pub bad_chain_policy: BadChainPolicy,
    /// VendorID register.
    pub vendor_id: u32,
}

impl BlkConfig {
    pub fn new(capacity_sectors: u64, read_only: bool) -> Self {
        let mut serial = [0u8; ID_BYTES];
        serial[..8].copy_from_slice(b"hv-vblk0");
        Self {
            capacity_sectors,
            read_only,
            serial,
            queue_size_max: 128,
            seg_max: 126,
            size_max: None,
            blk_size: 512,
            max_request_bytes: 4 << 20,
            max_in_flight_bytes: 16 << 20,
            max_in_flight_requests: 128,
            indirect_desc: true,
            bad_chain_policy: BadChainPolicy::ReturnUnused,
            // "HVVB", like QEMU's "QEMU" (0x554d4551).
            vendor_id: 0x4256_5648,
        }
    }

    /// The feature bits the device offers.
    pub fn features(&self) -> u64 {
        let mut f = features::VERSION_1 | features::BLK_SEG_MAX | features::BLK_BLK_SIZE | features::BLK_FLUSH;
        if self.read_only {
            f |= features::BLK_RO;
        }
        if self.size_max.is_some() {
            f |= features::BLK_SIZE_MAX;
        }
        if self.indirect_desc {
            f |= features::RING_INDIRECT_DESC;
        }
        f
    }

    /// `struct virtio_blk_config`, little endian.
    pub fn config_space(&self) -> [u8; CONFIG_LEN] {
        let mut c = [0u8; CONFIG_LEN];
        c[0..8].copy_from_slice(&self.capacity_sectors.to_le_bytes());
        c[8..12].copy_from_slice(&self.size_max.unwrap_or(0).to_le_bytes());
        c[12..16].copy_from_slice(&self.seg_max.to_le_bytes());
        // geometry (16..20) not offered; blk_size:
        c[20..24].copy_from_slice(&self.blk_size.to_le_bytes());
        // topology (24..32) and writeback (32) not offered; num_queues:
        c[34..36].copy_from_slice(&1u16.to_le_bytes());
        c
    }
}

/// What a backend is asked to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendOp {
    /// Read `len` bytes (a multiple of 512) from `sector`.
    Read { sector: u64, len: u32 },
    /// Write `data` (a multiple of 512 bytes, already copied out of the
    /// guest) at `sector`.
    Write { sector: u64, data: DataBuf },
    /// Make every completed write durable.
    Flush,
}

/// One request for a backend; `token` comes back in its [`Completion`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendRequest {
    pub token: u64,
    pub op: BackendOp,
    /// The `now_ns` the caller passed to `process_queue` (for backends with
    /// a service time).
    pub submit_ns: u64,
}

/// A backend failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendError {
    /// The device reported an I/O error.
    Io,
    /// The request lies past the end of the backing store.
    OutOfRange,
    /// Write to a read-only backing store.
    ReadOnly,
    /// No room for another request (should not happen when `free_slots` is
    /// honest; the request gets IOERR).
    Busy,
    /// The hypervisor had no heap for the request's data (the request gets
    /// IOERR; with quotas sized by the boot plan this does not happen).
    NoMemory,
}

/// A finished backend request. For `Read`, `Ok` carries exactly the bytes
/// read; for `Write` and `Flush`, an empty buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub token: u64,
    pub result: Result<DataBuf, BackendError>,
}

/// Where requests go. Completion is asynchronous: `submit` only starts the
/// request; its [`Completion`] reaches the device later through the EL2 code
/// calling [`VirtioBlk::complete`] (from the physical device's interrupt, or
/// the EL2 timer for [`super::RamBackend`]).
pub trait BlockBackend {
    fn submit(&mut self, req: BackendRequest) -> Result<(), BackendError>;
    /// How many more requests `submit` accepts now.
    fn free_slots(&self) -> usize {
        usize::MAX
    }
}

/// Device counters; printed by [`VirtioBlk::write_text`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlkCounters {
    /// IN requests accepted (well-formed, sent to the backend).
    pub reads: u64,
    /// OUT requests accepted.
    pub writes: u64,
    pub flushes: u64,
    pub get_ids: u64,
    /// Requests answered UNSUPP.
    pub unsupported: u64,
    /// Bytes read into the guest / written from the guest, counted at
    /// successful completion.
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Requests answered IOERR (bad request or backend failure).
    pub io_errors: u64,
    /// Of those, the backend's failures.
    pub backend_errors: u64,
    /// Chains that could not be answered (see [`BadChainPolicy`]).
    pub bad_chains: u64,
    /// Times the device entered DEVICE_NEEDS_RESET.
    pub needs_reset: u64,
    /// QueueNotify writes.
    pub notifies: u64,
    /// Used-buffer notifications raised.
    pub interrupts: u64,
    /// Times the device left requests in the ring for want of room.
    pub stalls: u64,
    /// Of those, the times the VM's heap quota was the limit.
    pub quota_stalls: u64,
    /// Backend completions of requests the device had handed over (live or
    /// orphaned): `reads + writes + flushes == completions + in_flight`.
    pub completions: u64,
    /// Requests orphaned by a reset or QueueReady = 0 while in flight.
    pub orphaned: u64,
    /// Completions of orphaned requests (dropped, guest memory untouched).
    pub stale_completions: u64,
    /// Completions with a token the device does not hold (a backend bug).
    pub unknown_completions: u64,
    /// Requests the backend holds now (live and orphaned) and the most ever.
    pub in_flight: u64,
    pub in_flight_hwm: u64,
    /// Data bytes of those requests now, and the most ever.
    pub in_flight_bytes: u64,
    pub in_flight_bytes_hwm: u64,
}

impl BlkCounters {
    /// Names, in print order.
    pub const NAMES: [&'static str; 23] = [
        "reads",
        "writes",
        "flushes",
        "get_ids",
        "unsupported",
        "bytes_read",
        "bytes_written",
        "io_errors",
        "backend_errors",
        "bad_chains",
        "needs_reset",
        "notifies",
        "interrupts",
        "stalls",
        "quota_stalls",
        "completions",
        "orphaned",
        "stale_completions",
        "unknown_completions",
        "in_flight",
        "in_flight_hwm",
        "in_flight_bytes",
        "in_flight_bytes_hwm",
    ];

    pub fn values(&self) -> [u64; 23] {
        [
            self.reads,
            self.writes,
            self.flushes,
            self.get_ids,
            self.unsupported,
            self.bytes_read,
            self.bytes_written,
            self.io_errors,
            self.backend_errors,
            self.bad_chains,
            self.needs_reset,
            self.notifies,
            self.interrupts,
            self.stalls,
            self.quota_stalls,
            self.completions,
            self.orphaned,
            self.stale_completions,
            self.unknown_completions,
            self.in_flight,
            self.in_flight_hwm,
            self.in_flight_bytes,
            self.in_flight_bytes_hwm,
        ]
    }

    /// Requests handed to the backend so far.
    pub fn submitted(&self) -> u64 {
        self.reads + self.writes + self.flushes
    }
}

/// Why a request was answered IOERR/UNSUPP or not at all (for the log and
/// for tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestError {
    Chain(ChainError),
    /// No device-writable byte for the status.
    NoStatus,
    /// The status byte is outside guest RAM (or its address wraps).
    StatusOutsideRam(u64),
    ShortHeader,
    /// Data in the wrong direction for the request type.
    WrongDirection,
    /// An IN or OUT without data.
    Empty,
    Misaligned(u64),
    TooLarge(u64),
    PastEnd {
        sector: u64,
        len: u64,
    },
    ReadOnly,
    /// A data segment outside guest RAM.
    Mem(MemError),
    Unsupported(u32),
    Backend(BackendError),
    /// The used ring or status could not be written at completion.
    Queue(QueueError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Flush,
}

#[derive(Clone, Debug)]
struct InFlight {
    queue: u16,
    head: u16,
    kind: Kind,
    /// Device-writable segments, for read data (status byte excluded by
    /// length: only `data_len` bytes are scattered).
    wsegs: Vec<Segment>,
    /// Data bytes of a read or write (checked ≤ max_request_bytes).
    data_len: u32,
    status_gpa: u64,
    /// The guest reset the device or disabled the queue after submission:
    /// the completion is awaited (the backend still holds the request and
    /// its budget) but dropped.
    orphaned: bool,
    /// What admitting it added to `held_cost` ([`request_cost`]).
    cost: u64,
}

/// Heap a request's bookkeeping takes besides its data and segment list:
/// its share of the in-flight map's nodes and the backend's entry for it.
const REQUEST_OVERHEAD: u64 = 512;

/// An upper bound of the heap a request takes while in flight, known before
/// it is parsed: a chain of `chain_bytes` over `nr_segs` segments carries at
/// most that much data (and no more than `max_request_bytes` is ever
/// allocated: a larger request is answered at once), in a [`DataBuf`] whose
/// chunk list takes at most 512 bytes, plus its writable segments kept for
/// the completion.
pub fn request_cost(chain_bytes: u64, nr_segs: usize, max_request_bytes: u32) -> u64 {
    let data = chain_bytes.min(u64::from(max_request_bytes));
    let segs = heap_cost(nr_segs.saturating_mul(core::mem::size_of::<Segment>()), core::mem::align_of::<Segment>());
    data + 512 + segs + REQUEST_OVERHEAD
}

/// The emulated virtio-blk device behind one virtio-mmio frame.
pub struct VirtioBlk {
    cfg: BlkConfig,
    config_space: [u8; CONFIG_LEN],
    transport: MmioTransport,
    /// Every request the backend holds, live or orphaned.
    in_flight: BTreeMap<u64, InFlight>,
    /// Sum of `data_len` over `in_flight`.
    in_flight_bytes: u64,
    /// How many of `in_flight` are orphaned.
    orphans: usize,
    next_token: u64,
    counters: BlkCounters,
    stalled: Vec<bool>,
    last_error: Option<RequestError>,
    logged: u64,
    segs: Vec<Segment>,
    /// The VM's heap quota, charged for what requests in flight hold beyond
    /// `floor`.
    quota: Arc<Quota>,
    /// Charged to the quota once, when the device was made: the largest
    /// request, so one request always fits whatever else the VM holds.
    floor: u64,
    /// Sum of `cost` over `in_flight`.
    held_cost: u64,
    /// What is charged to the quota now: `held_cost - floor`, at least 0.
    charged: u64,
}

/// What a device with `cfg` charges its VM's quota when it is made: its
/// largest request (a chain as long as the queue).
pub fn floor_cost(cfg: &BlkConfig) -> u64 {
    let max_segs = usize::from(cfg.queue_size_max.max(1));
    request_cost(u64::from(cfg.max_request_bytes) + HEADER_LEN + 1, max_segs, cfg.max_request_bytes)
}

/// A quota too small for even one request of the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaTooSmall {
    /// Bytes the device needs for its largest request.
    pub needed: u64,
    pub limit: u64,
}

impl fmt::Display for QuotaTooSmall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "heap quota of {} bytes leaves less than the {} bytes of the disk's largest request",
            self.limit, self.needed
        )
    }
}

fn stream_len(segs: &[Segment], writable: bool) -> u64 {
    segs.iter().filter(|s| s.writable == writable).map(|s| u64::from(s.len)).sum()
}

/// Copy `buf.len()` bytes starting at byte `skip` of the readable stream.
fn gather(mem: &dyn GuestMemory, segs: &[Segment], mut skip: u64, buf: &mut [u8]) -> Result<(), MemError> {
    let mut done = 0usize;
    for s in segs.iter().filter(|s| !s.writable) {
        if done == buf.len() {
            break;
        }
        let len = u64::from(s.len);
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = ((len - skip) as usize).min(buf.len() - done);
        let gpa = s.addr.checked_add(skip).ok_or(MemError::OutOfRange { gpa: s.addr, len })?;
        mem.read(gpa, &mut buf[done..done + n])?;
        done += n;
        skip = 0;
    }
    Ok(())
}

/// Copy `data` to the writable stream from its byte `skip`.
fn scatter(mem: &mut dyn GuestMemory, segs: &[Segment], mut skip: u64, data: &[u8]) -> Result<(), MemError> {
    let mut done = 0usize;
    for s in segs.iter().filter(|s| s.writable) {
        if done == data.len() {
            break;
        }
        let len = u64::from(s.len);
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = ((len - skip) as usize).min(data.len() - done);
        let gpa = s.addr.checked_add(skip).ok_or(MemError::OutOfRange { gpa: s.addr, len })?;
        mem.write(gpa, &data[done..done + n])?;
        done += n;
        skip = 0;
    }
    Ok(())
}

/// Copy all of `data` to the start of the writable stream.
fn scatter_buf(mem: &mut dyn GuestMemory, segs: &[Segment], data: &DataBuf) -> Result<(), MemError> {
    let mut at = 0u64;
    for c in data.chunks() {
        scatter(mem, segs, at, c)?;
        at += c.len() as u64;
    }
    Ok(())
}

/// Copy the readable stream from byte `skip` into `data`.
fn gather_buf(mem: &dyn GuestMemory, segs: &[Segment], skip: u64, data: &mut DataBuf) -> Result<(), MemError> {
    let mut at = skip;
    for c in data.chunks_mut() {
        gather(mem, segs, at, c)?;
        at += c.len() as u64;
    }
    Ok(())
}

impl VirtioBlk {
    /// A device that charges nobody (host tests, and a VM without a quota).
    pub fn new(cfg: BlkConfig) -> Self {
        Self::build(cfg, Arc::new(Quota::unlimited()), 0)
    }

    /// A device whose requests are charged to `quota`; its largest request
    /// is charged now, once, so it can always make progress.
    pub fn with_quota(cfg: BlkConfig, quota: Arc<Quota>) -> Result<Self, QuotaTooSmall> {
        let floor = floor_cost(&cfg);
        quota.try_charge(floor).map_err(|_| QuotaTooSmall { needed: floor, limit: quota.limit() })?;
        Ok(Self::build(cfg, quota, floor))
    }

    fn build(cfg: BlkConfig, quota: Arc<Quota>, floor: u64) -> Self {
        let qmax = if cfg.queue_size_max.is_power_of_two() { cfg.queue_size_max } else { 128 };
        let transport = MmioTransport::new(VIRTIO_ID_BLOCK, cfg.vendor_id, cfg.features(), 1, qmax);
        Self {
            config_space: cfg.config_space(),
            cfg,
            transport,
            in_flight: BTreeMap::new(),
            in_flight_bytes: 0,
            orphans: 0,
            next_token: 1,
            counters: BlkCounters::default(),
            stalled: vec![false; 1],
            last_error: None,
            logged: 0,
            segs: Vec::new(),
            quota,
            floor,
            held_cost: 0,
            charged: 0,
        }
    }

    /// The quota the device charges.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// Takes `cost` more into `held_cost`, charging the quota for what passes
    /// `floor`; false (and nothing changes) when the quota refuses.
    fn hold(&mut self, cost: u64) -> bool {
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
    fn unhold(&mut self, cost: u64) {
        self.held_cost = self.held_cost.saturating_sub(cost);
        let excess = self.held_cost.saturating_sub(self.floor);
        if excess < self.charged {
            self.quota.release(self.charged - excess);
            self.charged = excess;
        }
    }

    pub fn config(&self) -> &BlkConfig {
        &self.cfg
    }

    pub fn counters(&self) -> &BlkCounters {
        &self.counters
    }

    pub fn transport(&self) -> &MmioTransport {
        &self.transport
    }

    /// The level of the device's interrupt line (InterruptStatus != 0).
    pub fn irq_level(&self) -> bool {
        self.transport.irq_level()
    }

    /// Requests handed to the backend and not yet completed by it,
    /// including those orphaned by a reset.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Of [`in_flight`](Self::in_flight), those orphaned by a reset or
    /// QueueReady = 0.
    pub fn orphans(&self) -> usize {
        self.orphans
    }

    /// Data bytes of the requests the backend holds.
    pub fn in_flight_bytes(&self) -> u64 {
        self.in_flight_bytes
    }

    /// The most recent bad request or chain, if any.
    pub fn last_error(&self) -> Option<RequestError> {
        self.last_error
    }

    /// A guest read of the register frame at `offset`.
    pub fn mmio_read(&self, offset: u64, size: u8) -> Result<u64, MmioError> {
        self.transport.read(offset, size, &self.config_space)
    }

    /// A guest write to the register frame. `mem` is only used to check the
    /// ring addresses at QueueReady.
    pub fn mmio_write(
        &mut self,
        offset: u64,
        size: u8,
        value: u64,
        mem: &dyn GuestMemory,
    ) -> Result<Effects, MmioError> {
        let (fx, ev) = self.transport.write(offset, size, value, mem)?;
        if fx.notify.is_some() {
            self.counters.notifies += 1;
        }
        match ev {
            Event::None => {}
            Event::Reset => {
                self.orphan(|_| true);
                self.stalled.iter_mut().for_each(|s| *s = false);
            }
            Event::QueueDisabled(q) => {
                self.orphan(|r| r.queue == q);
                if let Some(s) = self.stalled.get_mut(usize::from(q)) {
                    *s = false;
                }
            }
            Event::QueueRejected(_, e) => {
                self.counters.needs_reset += 1;
                self.note(RequestError::Queue(e));
            }
        }
        Ok(fx)
    }

    /// The guest took back the queues `which` selects: their in-flight
    /// requests stay counted (and keep their budget) until the backend
    /// completes them, but nothing will be written for them.
    fn orphan(&mut self, which: impl Fn(&InFlight) -> bool) {
        for r in self.in_flight.values_mut().filter(|r| !r.orphaned && which(r)) {
            r.orphaned = true;
            r.wsegs = Vec::new();
            self.orphans += 1;
            self.counters.orphaned += 1;
        }
    }

    fn update_in_flight(&mut self) {
        let c = &mut self.counters;
        c.in_flight = self.in_flight.len() as u64;
        c.in_flight_hwm = c.in_flight_hwm.max(c.in_flight);
        c.in_flight_bytes = self.in_flight_bytes;
        c.in_flight_bytes_hwm = c.in_flight_bytes_hwm.max(self.in_flight_bytes);
    }

    fn note(&mut self, e: RequestError) {
        self.last_error = Some(e);
        if self.logged < LOG_LIMIT {
            self.logged += 1;
            log::warn!("virtio-blk: bad request: {:?}", e);
        }
    }

    /// Enter DEVICE_NEEDS_RESET (noting `e` if given).
    fn fail_device(&mut self, e: Option<QueueError>) -> Effects {
        if let Some(e) = e {
            self.note(RequestError::Queue(e));
        }
        let mut fx = Effects::default();
        if !self.transport.needs_reset() {
            self.counters.needs_reset += 1;
            fx.irq_level_changed = self.transport.set_needs_reset();
        }
        fx
    }

    /// Publish `{head, len}` on queue `q` and raise the interrupt if wanted.
    fn finish(&mut self, mem: &mut dyn GuestMemory, q: u16, head: u16, len: u32) -> Effects {
        let Some(queue) = self.transport.queues.get_mut(usize::from(q)) else {
            return Effects::default();
        };
        match queue.push_used(mem, head, len) {
            Ok(true) => {
                self.counters.interrupts += 1;
                Effects { notify: None, irq_level_changed: self.transport.raise(irq::VRING) }
            }
            Ok(false) => Effects::default(),
            Err(e) => self.fail_device(Some(e)),
        }
    }

    /// Write a status byte then publish; a status that cannot be written
    /// (checked earlier, so never in practice) fails the device.
    fn answer(
        &mut self,
        mem: &mut dyn GuestMemory,
        q: u16,
        head: u16,
        status_gpa: u64,
        st: u8,
        written: u32,
    ) -> Effects {
        if let Err(e) = mem.write_u8(status_gpa, st) {
            return self.fail_device(Some(QueueError::Mem(e)));
        }
        self.finish(mem, q, head, written.saturating_add(1))
    }

    fn unanswerable(&mut self, mem: &mut dyn GuestMemory, q: u16, head: u16, e: RequestError) -> Effects {
        self.counters.bad_chains += 1;
        self.note(e);
        match self.cfg.bad_chain_policy {
            BadChainPolicy::ReturnUnused => self.finish(mem, q, head, 0),
            BadChainPolicy::NeedsReset => self.fail_device(None),
        }
    }

    /// Consume the chains the driver made available on queue `q`: parse each
    /// request, hand it to `backend`, or answer it at once. `now_ns` is
    /// passed to the backend as the submit time. Reads the avail index once:
    /// chains added during the call wait for the driver's next notify.
    pub fn process_queue(
        &mut self,
        q: u16,
        mem: &mut dyn GuestMemory,
        backend: &mut dyn BlockBackend,
        now_ns: u64,
    ) -> Effects {
        let mut fx = Effects::default();
        let qi = usize::from(q);
        if !self.transport.live() || qi >= self.transport.queues.len() || !self.transport.queues[qi].ready {
            return fx;
        }
        self.stalled[qi] = false;
        let pending = match self.transport.queues[qi].pending(mem) {
            Ok(n) => n,
            Err(e) => return self.fail_device(Some(e)),
        };
        let size = usize::from(self.transport.queues[qi].size);
        for _ in 0..pending {
            if self.transport.needs_reset() {
                break;
            }
            // Live requests (the device has one queue) against the queue
            // size; everything held, orphans included, against the budget.
            let held = self.in_flight.len();
            if held - self.orphans >= size || held >= self.cfg.max_in_flight_requests || backend.free_slots() == 0 {
                self.stalled[qi] = true;
                self.counters.stalls += 1;
                break;
            }
            let head = match self.transport.queues[qi].peek_head(mem) {
                Ok(h) => h,
                Err(e) => {
                    fx.merge(self.fail_device(Some(e)));
                    break;
                }
            };
            let indirect = self.transport.negotiated() & features::RING_INDIRECT_DESC != 0;
            let mut segs = core::mem::take(&mut self.segs);
            let walked = self.transport.queues[qi].walk_chain(mem, head, indirect, &mut segs);
            // Byte budget: a request's data is at most its chain's length.
            let bytes: u64 = segs.iter().map(|s| u64::from(s.len)).sum();
            if walked.is_ok() && held > 0 && self.in_flight_bytes + bytes > self.cfg.max_in_flight_bytes {
                self.segs = segs;
                self.stalled[qi] = true;
                self.counters.stalls += 1;
                break;
            }
            // The VM's quota, charged for the request before anything is
            // allocated for it; given back when it is answered.
            let cost = request_cost(bytes, segs.len(), self.cfg.max_request_bytes);
            if walked.is_ok() && !self.hold(cost) {
                self.segs = segs;
                self.stalled[qi] = true;
                self.counters.stalls += 1;
                self.counters.quota_stalls += 1;
                break;
            }
            self.transport.queues[qi].advance();
            let e = match walked {
                Err(e) => self.unanswerable(mem, q, head, RequestError::Chain(e)),
                Ok(()) => match self.handle_request(q, head, &segs, mem, backend, now_ns, cost) {
                    // The backend holds it, and its charge.
                    None => Effects::default(),
                    // Answered at once: its charge comes back.
                    Some(fx) => {
                        self.unhold(cost);
                        fx
                    }
                },
            };
            fx.merge(e);
            segs.clear();
            self.segs = segs;
        }
        self.update_in_flight();
        fx
    }

    /// Answers the request at once (`Some`: the effects of answering it) or
    /// hands it to the backend, which then holds `cost` (`None`).
    #[allow(clippy::too_many_arguments)]
    fn handle_request(
        &mut self,
        q: u16,
        head: u16,
        segs: &[Segment],
        mem: &mut dyn GuestMemory,
        backend: &mut dyn BlockBackend,
        now_ns: u64,
        cost: u64,
    ) -> Option<Effects> {
        // The status byte: the last byte of the writable stream.
        let Some(last) = segs.iter().rev().find(|s| s.writable && s.len > 0) else {
            return Some(self.unanswerable(mem, q, head, RequestError::NoStatus));
        };
        let status_gpa = match last.addr.checked_add(u64::from(last.len) - 1) {
            Some(a) if mem.contains(a, 1) => a,
            a => {
                let e = RequestError::StatusOutsideRam(a.unwrap_or(u64::MAX));
                return Some(self.unanswerable(mem, q, head, e));
            }
        };
        let readable = stream_len(segs, false);
        let writable_data = stream_len(segs, true) - 1;

        let mut hdr = [0u8; HEADER_LEN as usize];
        if readable < HEADER_LEN {
            return Some(self.reject(mem, q, head, status_gpa, RequestError::ShortHeader));
        }
        if let Err(e) = gather(mem, segs, 0, &mut hdr) {
            return Some(self.reject(mem, q, head, status_gpa, RequestError::Mem(e)));
        }
        let ty = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
        let sector = u64::from_le_bytes([hdr[8], hdr[9], hdr[10], hdr[11], hdr[12], hdr[13], hdr[14], hdr[15]]);

        let (kind, op, data_len) = match ty {
            T_IN => {
                if readable != HEADER_LEN {
                    return Some(self.reject(mem, q, head, status_gpa, RequestError::WrongDirection));
                }
                if let Err(e) = self.check_range(sector, writable_data) {
                    return Some(self.reject(mem, q, head, status_gpa, e));
                }
                if let Some(s) = segs.iter().find(|s| s.writable && !mem.contains(s.addr, u64::from(s.len))) {
                    let e = MemError::OutOfRange { gpa: s.addr, len: u64::from(s.len) };
                    return Some(self.reject(mem, q, head, status_gpa, RequestError::Mem(e)));
                }
                (Kind::Read, BackendOp::Read { sector, len: writable_data as u32 }, writable_data as u32)
            }
            T_OUT => {
                let len = readable - HEADER_LEN;
                if writable_data != 0 {
                    return Some(self.reject(mem, q, head, status_gpa, RequestError::WrongDirection));
                }
                if self.cfg.read_only {
                    return Some(self.reject(mem, q, head, status_gpa, RequestError::ReadOnly));
                }
                if let Err(e) = self.check_range(sector, len) {
                    return Some(self.reject(mem, q, head, status_gpa, e));
                }
                // Copy the data now: the guest cannot change it afterwards.
                let Ok(mut data) = DataBuf::try_zeroed(len as usize) else {
                    return Some(self.reject(mem, q, head, status_gpa, RequestError::Backend(BackendError::NoMemory)));
                };
                if let Err(e) = gather_buf(mem, segs, HEADER_LEN, &mut data) {
                    return Some(self.reject(mem, q, head, status_gpa, RequestError::Mem(e)));
                }
                (Kind::Write, BackendOp::Write { sector, data }, len as u32)
            }
            T_FLUSH => (Kind::Flush, BackendOp::Flush, 0),
            T_GET_ID => {
                self.counters.get_ids += 1;
                let n = (writable_data as usize).min(ID_BYTES);
                let serial = self.cfg.serial;
                if let Err(e) = scatter(mem, segs, 0, &serial[..n]) {
                    return Some(self.reject(mem, q, head, status_gpa, RequestError::Mem(e)));
                }
                return Some(self.answer(mem, q, head, status_gpa, S_OK, n as u32));
            }
            other => {
                self.counters.unsupported += 1;
                self.note(RequestError::Unsupported(other));
                return Some(self.answer(mem, q, head, status_gpa, S_UNSUPP, 0));
            }
        };

        // Where read data goes at completion, kept before the backend has
        // the request so no allocation can fail after it does.
        let mut wsegs = Vec::new();
        if kind == Kind::Read {
            if wsegs.try_reserve_exact(segs.len()).is_err() {
                return Some(self.reject(mem, q, head, status_gpa, RequestError::Backend(BackendError::NoMemory)));
            }
            wsegs.extend(segs.iter().filter(|s| s.writable).copied());
        }
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(1);
        match backend.submit(BackendRequest { token, op, submit_ns: now_ns }) {
            Ok(()) => {
                match kind {
                    Kind::Read => self.counters.reads += 1,
                    Kind::Write => self.counters.writes += 1,
                    Kind::Flush => self.counters.flushes += 1,
                }
                let r = InFlight { queue: q, head, kind, wsegs, data_len, status_gpa, orphaned: false, cost };
                self.in_flight.insert(token, r);
                self.in_flight_bytes += u64::from(data_len);
                self.update_in_flight();
                None
            }
            Err(e) => {
                self.counters.backend_errors += 1;
                Some(self.reject(mem, q, head, status_gpa, RequestError::Backend(e)))
            }
        }
    }

    /// IOERR for data length `len` at `sector`.
    fn check_range(&self, sector: u64, len: u64) -> Result<(), RequestError> {
        if len == 0 {
            return Err(RequestError::Empty);
        }
        if !len.is_multiple_of(SECTOR_SIZE) {
            return Err(RequestError::Misaligned(len));
        }
        if len > u64::from(self.cfg.max_request_bytes) {
            return Err(RequestError::TooLarge(len));
        }
        match sector.checked_add(len / SECTOR_SIZE) {
            Some(end) if end <= self.cfg.capacity_sectors => Ok(()),
            _ => Err(RequestError::PastEnd { sector, len }),
        }
    }

    /// Answer IOERR.
    fn reject(&mut self, mem: &mut dyn GuestMemory, q: u16, head: u16, status_gpa: u64, e: RequestError) -> Effects {
        self.counters.io_errors += 1;
        self.note(e);
        self.answer(mem, q, head, status_gpa, S_IOERR, 0)
    }

    /// A backend finished request `c.token`: copy read data into the guest,
    /// write the status, publish the used element, raise the interrupt. A
    /// request orphaned by a reset only gives its budget back. If the device
    /// had left chains in the ring for want of room, the result's `notify`
    /// asks the caller to process that queue again.
    pub fn complete(&mut self, mem: &mut dyn GuestMemory, c: Completion) -> Effects {
        let Some(r) = self.in_flight.remove(&c.token) else {
            self.counters.unknown_completions += 1;
            return Effects::default();
        };
        self.counters.completions += 1;
        self.in_flight_bytes = self.in_flight_bytes.saturating_sub(u64::from(r.data_len));
        self.unhold(r.cost);
        self.update_in_flight();
        let mut fx = if r.orphaned {
            // The guest reset this queue after submitting: its memory is
            // no longer ours to write.
            self.orphans -= 1;
            self.counters.stale_completions += 1;
            Effects::default()
        } else if self.transport.needs_reset() {
            // The driver must reset; leave its memory alone meanwhile.
            Effects::default()
        } else {
            let (st, written) = self.outcome(mem, &r, &c.result);
            self.answer(mem, r.queue, r.head, r.status_gpa, st, written)
        };
        // Room was freed: resume a queue that had to stop.
        if let Some(q) = self.stalled.iter().position(|&s| s) {
            self.stalled[q] = false;
            fx.notify = Some(q as u16);
        }
        fx
    }

    /// The status (and bytes written) for the backend's `result` of `r`;
    /// read data is copied into the guest here.
    fn outcome(
        &mut self,
        mem: &mut dyn GuestMemory,
        r: &InFlight,
        result: &Result<DataBuf, BackendError>,
    ) -> (u8, u32) {
        match (result, r.kind) {
            (Ok(data), Kind::Read) if data.len() == r.data_len as usize => match scatter_buf(mem, &r.wsegs, data) {
                Ok(()) => {
                    self.counters.bytes_read += data.len() as u64;
                    (S_OK, r.data_len)
                }
                Err(e) => {
                    self.counters.io_errors += 1;
                    self.note(RequestError::Mem(e));
                    (S_IOERR, 0)
                }
            },
            (Ok(_), Kind::Read) => {
                self.counters.io_errors += 1;
                self.counters.backend_errors += 1;
                self.note(RequestError::Backend(BackendError::Io));
                (S_IOERR, 0)
            }
            (Ok(_), Kind::Write) => {
                self.counters.bytes_written += u64::from(r.data_len);
                (S_OK, 0)
            }
            (Ok(_), Kind::Flush) => (S_OK, 0),
            (Err(e), _) => {
                self.counters.io_errors += 1;
                self.counters.backend_errors += 1;
                self.note(RequestError::Backend(*e));
                (S_IOERR, 0)
            }
        }
    }

    /// Print the counters as `prefix.name=value` lines, all of them, in
    /// [`BlkCounters::NAMES`] order.
    pub fn write_text(&self, prefix: &str, out: &mut dyn fmt::Write) -> fmt::Result {
        for (name, v) in BlkCounters::NAMES.iter().zip(self.counters.values()) {
            writeln!(out, "{prefix}.{name}={v}")?;
        }
        Ok(())
    }
}
