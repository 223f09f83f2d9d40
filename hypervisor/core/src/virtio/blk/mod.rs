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
//!
//! # Modules
//!
//! This file holds the device ([`VirtioBlk`]: its state, construction,
//! register frame, reset handling and the in-flight record) and re-exports
//! the public items of its children, so `virtio::blk::X` names them all.
//!
//! - `config`: the wire constants and [`BlkConfig`] (features, config space);
//! - `backend`: the [`BlockBackend`] contract (requests, completions, errors);
//! - `counters`: [`BlkCounters`];
//! - `error`: [`RequestError`] and [`QuotaTooSmall`];
//! - `cost`: what a request costs the VM's heap quota ([`request_cost`],
//!   [`floor_cost`]) and the device's charge against it;
//! - `stream`: gathering and scattering the chain's readable and writable
//!   byte streams;
//! - `request`: admission, parsing and validation of the chains on a queue
//!   ([`VirtioBlk::process_queue`]);
//! - `answer`: status byte, used element, interrupt, bad chains and
//!   DEVICE_NEEDS_RESET;
//! - `complete`: the backend's completions ([`VirtioBlk::complete`]).

use super::mmio::{Effects, Event, MmioError, MmioTransport};
use super::queue::Segment;
use super::GuestMemory;
use crate::quota::Quota;
use alloc::collections::BTreeMap;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

mod answer;
mod backend;
mod complete;
mod config;
mod cost;
mod counters;
mod error;
mod request;
mod stream;

pub use backend::{BackendError, BackendOp, BackendRequest, BlockBackend, Completion};
pub use config::{
    BadChainPolicy, BlkConfig, CONFIG_LEN, ID_BYTES, SECTOR_SIZE, S_IOERR, S_OK, S_UNSUPP, T_FLUSH, T_GET_ID, T_IN,
    T_OUT, VIRTIO_ID_BLOCK,
};
pub use cost::{floor_cost, request_cost};
pub use counters::BlkCounters;
pub use error::{QuotaTooSmall, RequestError};

/// Log at most this many bad requests per device (then count only).
const LOG_LIMIT: u64 = 16;

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

    /// Print the counters as `prefix.name=value` lines, all of them, in
    /// [`BlkCounters::NAMES`] order.
    pub fn write_text(&self, prefix: &str, out: &mut dyn fmt::Write) -> fmt::Result {
        for (name, v) in BlkCounters::NAMES.iter().zip(self.counters.values()) {
            writeln!(out, "{prefix}.{name}={v}")?;
        }
        Ok(())
    }
}
