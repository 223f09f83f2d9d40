//! Event queue records (IHI 0070, "Event records") and the fault policy.
//!
//! A record is 32 bytes, four little-endian doublewords (DW). The fields
//! the translation faults (`F_TRANSLATION`, `F_ADDR_SIZE`, `F_ACCESS`,
//! `F_PERMISSION`) share, and that [`Event::decode`] reads:
//! * DW0 \[7:0\] event type, \[63:32\] StreamID
//! * DW1 \[35\] RnW (1: read), \[39\] S2 (the fault is at stage 2)
//! * DW2 \[63:0\] InputAddr
//! * DW3 \[51:12\] IPA (the faulting IPA of a stage-2 fault)
//!
//! Other events define DW1..DW3 differently; [`Event`] still carries the
//! raw values, and [`EventKind::has_address`] says when they mean these.

/// The event types the hypervisor distinguishes; the rest are
/// [`EventKind::Other`] with their code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// `C_BAD_STREAMID` (0x02): the StreamID is beyond the stream table.
    BadStreamId,
    /// `F_STE_FETCH` (0x03): fetching the STE aborted.
    SteFetch,
    /// `C_BAD_STE` (0x04): the STE is invalid or malformed.
    BadSte,
    /// `F_STREAM_DISABLED` (0x06): a transaction without a SubstreamID on
    /// a stage-1 stream whose STE.S1DSS terminates such traffic.
    StreamDisabled,
    /// `F_WALK_EABT` (0x0b): a translation table walk aborted.
    WalkAbort,
    /// `F_TRANSLATION` (0x10): no valid descriptor for the address.
    Translation,
    /// `F_ADDR_SIZE` (0x11): the address is beyond the configured size.
    AddrSize,
    /// `F_ACCESS` (0x12): access flag fault.
    AccessFlag,
    /// `F_PERMISSION` (0x13): the descriptor forbids the access.
    Permission,
    /// Any other type, by code.
    Other(u8),
}

/// Codes of the types that have a variant, and the names of the others.
const KINDS: [(u8, EventKind, &str); 9] = [
    (0x02, EventKind::BadStreamId, "C_BAD_STREAMID"),
    (0x03, EventKind::SteFetch, "F_STE_FETCH"),
    (0x04, EventKind::BadSte, "C_BAD_STE"),
    (0x06, EventKind::StreamDisabled, "F_STREAM_DISABLED"),
    (0x0b, EventKind::WalkAbort, "F_WALK_EABT"),
    (0x10, EventKind::Translation, "F_TRANSLATION"),
    (0x11, EventKind::AddrSize, "F_ADDR_SIZE"),
    (0x12, EventKind::AccessFlag, "F_ACCESS"),
    (0x13, EventKind::Permission, "F_PERMISSION"),
];
const OTHER_NAMES: [(u8, &str); 10] = [
    (0x01, "F_UUT"),
    (0x05, "F_BAD_ATS_TREQ"),
    (0x07, "F_TRANSL_FORBIDDEN"),
    (0x08, "C_BAD_SUBSTREAMID"),
    (0x09, "F_CD_FETCH"),
    (0x0a, "C_BAD_CD"),
    (0x20, "F_TLB_CONFLICT"),
    (0x21, "F_CFG_CONFLICT"),
    (0x24, "E_PAGE_REQUEST"),
    (0x25, "F_VMS_FETCH"),
];

impl EventKind {
    /// The kind of event type `code`.
    pub fn from_code(code: u8) -> EventKind {
        KINDS.iter().find(|(c, _, _)| *c == code).map_or(EventKind::Other(code), |(_, k, _)| *k)
    }

    /// The event type's code.
    pub fn code(self) -> u8 {
        match self {
            EventKind::Other(c) => c,
            k => KINDS.iter().find(|(_, kind, _)| *kind == k).map_or(0, |(c, _, _)| *c),
        }
    }

    /// The name the specification gives the type (`"UNKNOWN"` if none).
    pub fn name(self) -> &'static str {
        let code = self.code();
        KINDS
            .iter()
            .find(|(c, _, _)| *c == code)
            .map(|(_, _, n)| *n)
            .or_else(|| OTHER_NAMES.iter().find(|(c, _)| *c == code).map(|(_, n)| *n))
            .unwrap_or("UNKNOWN")
    }

    /// Whether the record carries RnW, S2, InputAddr and IPA as
    /// [`Event`] reads them (the translation fault family).
    pub fn has_address(self) -> bool {
        matches!(self, EventKind::Translation | EventKind::AddrSize | EventKind::AccessFlag | EventKind::Permission)
    }
}

/// Bytes of an event record.
pub const EVENT_BYTES: usize = 32;
const RNW: u64 = 1 << 35;
const S2: u64 = 1 << 39;
const IPA_MASK: u64 = 0x000f_ffff_ffff_f000;

/// One event record, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub sid: u32,
    /// The access was a read (RnW = 1).
    pub rnw: bool,
    /// The fault happened at stage 2.
    pub stage2: bool,
    /// The address the device used.
    pub input_addr: u64,
    /// The IPA of a stage-2 fault (page aligned).
    pub ipa: u64,
}

impl Event {
    /// Decodes `raw`; never fails (an unknown type is [`EventKind::Other`]).
    pub fn decode(raw: &[u64; 4]) -> Event {
        Event {
            kind: EventKind::from_code(raw[0] as u8),
            sid: (raw[0] >> 32) as u32,
            rnw: raw[1] & RNW != 0,
            stage2: raw[1] & S2 != 0,
            input_addr: raw[2],
            ipa: raw[3] & IPA_MASK,
        }
    }
}

/// What the event handler does with a fault of a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// Log one line for it.
    Log,
    /// Count it without logging.
    Count,
    /// The stream faulted [`ABORT_AFTER`] times: switch its STE to abort
    /// (and log that). Returned once per stream.
    Abort,
}

/// Streams whose faults are counted one by one; faults of further streams
/// are only rate-limited (they never reach [`FaultAction::Abort`]).
pub const TRACKED_STREAMS: usize = 64;
/// Faults logged per stream before its faults are only counted.
pub const LOG_PER_STREAM: u32 = 4;
/// Faults logged per batch (see [`FaultLog::end_batch`]) over all streams:
/// one device's fault storm must not flood the console.
pub const LOG_BURST: u32 = 8;
/// Faults after which a stream is cut off: a device that keeps faulting is
/// broken or hostile, and every fault costs an event record and handling.
pub const ABORT_AFTER: u32 = 64;

#[derive(Clone, Copy, Debug)]
struct Slot {
    sid: u32,
    faults: u32,
}

/// Per-stream fault counts and the logging rate limit, in fixed memory.
#[derive(Clone, Debug)]
pub struct FaultLog {
    slots: [Option<Slot>; TRACKED_STREAMS],
    /// Logs in the current batch.
    burst: u32,
    /// Faults not logged in the current batch.
    suppressed: u64,
    /// Faults of streams beyond [`TRACKED_STREAMS`].
    untracked: u64,
}

impl Default for FaultLog {
    fn default() -> Self {
        Self::new()
    }
}

impl FaultLog {
    pub const fn new() -> FaultLog {
        FaultLog { slots: [None; TRACKED_STREAMS], burst: 0, suppressed: 0, untracked: 0 }
    }

    /// Records one fault of `sid` and says what to do with it.
    pub fn record(&mut self, sid: u32) -> FaultAction {
        let faults = match self.slot(sid) {
            Some(slot) => {
                slot.faults = slot.faults.saturating_add(1);
                Some(slot.faults)
            }
            None => {
                self.untracked = self.untracked.saturating_add(1);
                None
            }
        };
        if faults == Some(ABORT_AFTER) {
            return FaultAction::Abort;
        }
        let stream_may_log = faults.is_none_or(|f| f <= LOG_PER_STREAM);
        if stream_may_log && self.burst < LOG_BURST {
            self.burst += 1;
            FaultAction::Log
        } else {
            self.suppressed = self.suppressed.saturating_add(1);
            FaultAction::Count
        }
    }

    /// Ends a batch (the handler drained the event queue): the next faults
    /// may be logged again. Returns the faults not logged in the batch, for
    /// one summary line.
    pub fn end_batch(&mut self) -> u64 {
        self.burst = 0;
        core::mem::take(&mut self.suppressed)
    }

    /// The faults counted for `sid`, if it is tracked.
    pub fn faults(&self, sid: u32) -> Option<u32> {
        self.slots.iter().flatten().find(|s| s.sid == sid).map(|s| s.faults)
    }

    /// Faults of streams that found no free slot.
    pub fn untracked(&self) -> u64 {
        self.untracked
    }

    /// Forgets `sid` (its device was reset or reassigned): it starts from
    /// zero, and its slot is free for another stream.
    pub fn forget(&mut self, sid: u32) {
        for s in &mut self.slots {
            if s.is_some_and(|s| s.sid == sid) {
                *s = None;
            }
        }
    }

    /// `sid`'s slot, taking a free one if it has none.
    fn slot(&mut self, sid: u32) -> Option<&mut Slot> {
        let i = match self.slots.iter().position(|s| s.is_some_and(|s| s.sid == sid)) {
            Some(i) => i,
            None => {
                let i = self.slots.iter().position(Option::is_none)?;
                self.slots[i] = Some(Slot { sid, faults: 0 });
                i
            }
        };
        self.slots[i].as_mut()
    }
}
