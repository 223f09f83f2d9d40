//! [`BlkCounters`], the device's statistics: every field a count the
//! device keeps, printed in [`BlkCounters::NAMES`] order. The invariant
//! `reads + writes + flushes == completions + in_flight` holds at every
//! call boundary.

/// Device counters; printed by [`VirtioBlk::write_text`](super::VirtioBlk::write_text).
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
    /// Chains that could not be answered (see [`BadChainPolicy`](super::BadChainPolicy)).
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
