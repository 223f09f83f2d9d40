//! Dom0's control device, version 1 (docs/hvctl.md): the requests `hvctl`
//! writes into the window, decoded; the device's one-client claim; the
//! paging of long responses.
//!
//! - `create`: the payloads of making a DomU while running (`CREATE`'s
//!   spec, `LOAD`'s page list, its checksum).
//!
//! Contract: [`decode`] reads only the bytes it is given, which the caller
//! copied out of the window into EL2 memory first (another Dom0 vCPU may
//! change the window at any time); every malformed request is a
//! [`Status`], never a panic. Nothing here acts on a request: the run-time
//! layer does, and answers the same statuses.

pub mod create;

use crate::ids::DomainId;
use alloc::string::String;
use alloc::vec::Vec;
use create::{CreateSpec, Module};

/// Size of the window that holds a request and then its response.
pub const WINDOW_BYTES: usize = 16 * 4096;
/// A request's header: `op`, `len`, `arg0..=arg3`, little-endian u32s.
pub const HEADER_BYTES: usize = 24;
/// Longest `SET_OPTION` payload (`name=value`).
pub const OPTION_MAX: usize = 256;
/// What `MAGIC` reads: "HVCT", little-endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"HVCT");
pub const VERSION: u32 = 1;

/// A request's outcome, as `STATUS` reads it (0 is success).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[repr(u32)]
pub enum Status {
    #[error("another client holds the control device")]
    Busy = 1,
    #[error("the doorbell's token is not the claim's")]
    BadToken = 2,
    #[error("malformed request")]
    Inval = 3,
    #[error("unknown operation")]
    NoOp = 4,
    #[error("no such domain")]
    NoDom = 5,
    #[error("value out of range")]
    Range = 6,
    #[error("unknown option, or not settable while running")]
    NoOpt = 7,
    #[error("not enough memory")]
    NoMem = 8,
    #[error("not permitted")]
    Perm = 9,
    #[error("not an Image or ELF kernel")]
    Format = 10,
    #[error("operation not supported by this hypervisor yet")]
    Unsupported = 11,
}

impl Status {
    /// Every status, in code order (1..).
    pub const ALL: [Status; 11] = [
        Status::Busy,
        Status::BadToken,
        Status::Inval,
        Status::NoOp,
        Status::NoDom,
        Status::Range,
        Status::NoOpt,
        Status::NoMem,
        Status::Perm,
        Status::Format,
        Status::Unsupported,
    ];

    /// The status `STATUS` reads as `code` (0, success, is none).
    pub fn from_code(code: u32) -> Option<Status> {
        Status::ALL.into_iter().find(|s| *s as u32 == code)
    }

    /// The counter name of the hypervisor's `control.err.<name>`.
    pub fn name(self) -> &'static str {
        match self {
            Status::Busy => "busy",
            Status::BadToken => "bad_token",
            Status::Inval => "inval",
            Status::NoOp => "no_op",
            Status::NoDom => "no_dom",
            Status::Range => "range",
            Status::NoOpt => "no_opt",
            Status::NoMem => "no_mem",
            Status::Perm => "perm",
            Status::Format => "format",
            Status::Unsupported => "unsupported",
        }
    }
}

/// `arg` value meaning "leave it as it is".
pub const UNCHANGED: u32 = u32::MAX;

/// A decoded request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// `xl list`: a line per domain.
    List,
    /// `xl vcpu-list`: a line per vCPU.
    VcpuList,
    /// The counters' text from byte `offset` (paged: see [`page`]).
    Stats {
        offset: u32,
    },
    /// The flight recorder's dump from byte `offset`.
    TraceDump {
        offset: u32,
    },
    /// `xl sched-credit2` without `-d`, or of one domain.
    SchedGet {
        dom: Option<DomainId>,
    },
    /// `xl sched-credit2 -d DOM [-w W] [-c CAP]`: `cap` 0 removes it.
    SchedSetDomain {
        dom: DomainId,
        weight: Option<u32>,
        cap: Option<u32>,
    },
    /// `hvctl set NAME=VALUE`.
    SetOption {
        name: &'a str,
        value: &'a str,
    },
    Destroy {
        dom: DomainId,
    },
    Pause {
        dom: DomainId,
    },
    Unpause {
        dom: DomainId,
    },
    /// A shutdown request the guest sees.
    Shutdown {
        dom: DomainId,
    },
    /// `hvctl create`, first step: a domain is reserved (its memory from
    /// the pool) and waits for its files; the reply names it (`domid=N`).
    Create(CreateSpec<'a>),
    /// `hvctl create`, then: copy the Dom0 pages listed (`create::load_pages`)
    /// into the file `module` of the domain being made, from its page
    /// `first_page` on; the reply is `fnv=<hex>` over the bytes copied.
    Load {
        dom: DomainId,
        module: Module,
        first_page: u32,
        pages: &'a [u8],
    },
    /// `hvctl create`, last: build the domain from its files and start it.
    Start {
        dom: DomainId,
    },
}

/// Operation numbers (`op`).
pub mod op {
    pub const LIST: u32 = 1;
    pub const VCPU_LIST: u32 = 2;
    pub const STATS: u32 = 3;
    pub const TRACE_DUMP: u32 = 4;
    pub const SCHED_GET: u32 = 5;
    pub const SCHED_SET_DOMAIN: u32 = 6;
    pub const SET_OPTION: u32 = 7;
    pub const DESTROY: u32 = 8;
    pub const PAUSE: u32 = 9;
    pub const UNPAUSE: u32 = 10;
    pub const SHUTDOWN: u32 = 11;
    pub const CREATE: u32 = 12;
    pub const LOAD: u32 = 13;
    pub const START: u32 = 14;
}

fn word(b: &[u8], i: usize) -> u32 {
    let at = 4 * i;
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn domain(arg: u32) -> Result<DomainId, Status> {
    DomainId::try_from(arg).map_err(|_| Status::NoDom)
}

/// Decodes the request at the start of `buf` (the window's copy).
pub fn decode(buf: &[u8]) -> Result<Request<'_>, Status> {
    if buf.len() < HEADER_BYTES {
        return Err(Status::Inval);
    }
    let (opn, len) = (word(buf, 0), word(buf, 1) as usize);
    let args = [word(buf, 2), word(buf, 3), word(buf, 4), word(buf, 5)];
    let room = buf.len().min(WINDOW_BYTES) - HEADER_BYTES;
    if len > room {
        return Err(Status::Inval);
    }
    let payload = &buf[HEADER_BYTES..HEADER_BYTES + len];
    // Operations without a payload take none.
    let bare = |r: Request<'static>| if len == 0 { Ok(r) } else { Err(Status::Inval) };
    match opn {
        op::LIST => bare(Request::List),
        op::VCPU_LIST => bare(Request::VcpuList),
        op::STATS => bare(Request::Stats { offset: args[0] }),
        op::TRACE_DUMP => bare(Request::TraceDump { offset: args[0] }),
        op::SCHED_GET => bare(Request::SchedGet { dom: (args[0] != UNCHANGED).then(|| domain(args[0])).transpose()? }),
        op::SCHED_SET_DOMAIN => {
            let weight = (args[1] != UNCHANGED).then_some(args[1]);
            if weight.is_some_and(|w| w == 0 || w > crate::sched::domain::MAX_WEIGHT) {
                return Err(Status::Range);
            }
            let cap = (args[2] != UNCHANGED).then_some(args[2]);
            bare(Request::SchedSetDomain { dom: domain(args[0])?, weight, cap })
        }
        op::SET_OPTION => set_option(payload),
        op::DESTROY => bare(Request::Destroy { dom: domain(args[0])? }),
        op::PAUSE => bare(Request::Pause { dom: domain(args[0])? }),
        op::UNPAUSE => bare(Request::Unpause { dom: domain(args[0])? }),
        op::SHUTDOWN => bare(Request::Shutdown { dom: domain(args[0])? }),
        op::CREATE => CreateSpec::parse(payload).map(Request::Create),
        op::LOAD => Ok(Request::Load {
            dom: domain(args[0])?,
            module: Module::from_arg(args[1])?,
            first_page: args[2],
            pages: create::load_pages(payload)?,
        }),
        op::START => bare(Request::Start { dom: domain(args[0])? }),
        _ => Err(Status::NoOp),
    }
}

/// `name=value`: printable ASCII, a name of `[a-z0-9_]`, at most
/// [`OPTION_MAX`] bytes.
fn set_option(payload: &[u8]) -> Result<Request<'_>, Status> {
    if payload.is_empty() || payload.len() > OPTION_MAX || !payload.iter().all(|b| b.is_ascii_graphic()) {
        return Err(Status::Inval);
    }
    let text = core::str::from_utf8(payload).map_err(|_| Status::Inval)?;
    let (name, value) = text.split_once('=').ok_or(Status::Inval)?;
    let name_ok = !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !name_ok || value.is_empty() {
        return Err(Status::Inval);
    }
    Ok(Request::SetOption { name, value })
}

/// The part of a long response `text` that fits `room` bytes from byte
/// `offset` on, and how many bytes follow it (the client asks again from
/// `offset + part.len()` while that is not 0). An offset past the end
/// gives nothing, and nothing left.
pub fn page(text: &[u8], offset: u32, room: usize) -> (&[u8], usize) {
    let start = (offset as usize).min(text.len());
    let end = start.saturating_add(room).min(text.len());
    (&text[start..end], text.len() - end)
}

/// The device's one client: `CLAIM` hands out a token while nobody holds
/// it; the doorbell and `RELEASE` must present it.
#[derive(Debug, Default)]
pub struct Claim {
    held: Option<u64>,
    /// Tokens handed out so far (a token is never reused).
    issued: u64,
}

impl Claim {
    pub const fn new() -> Self {
        Claim { held: None, issued: 0 }
    }

    /// A read of `CLAIM`: a new token, or 0 while another client holds it.
    pub fn claim(&mut self) -> u64 {
        if self.held.is_some() {
            return 0;
        }
        self.issued += 1;
        // Never 0, and hard to guess from the count alone.
        let token = self.issued.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        self.held = Some(token);
        token
    }

    /// Whether `token` holds the device (a doorbell is answered only then).
    pub fn check(&self, token: u64) -> Result<(), Status> {
        match self.held {
            Some(t) if t == token => Ok(()),
            Some(_) => Err(Status::BadToken),
            None => Err(Status::BadToken),
        }
    }

    /// Gives the device up whoever holds it (a holder silent for
    /// [`CLAIM_LAPSE_NS`]).
    fn lapse(&mut self) {
        self.held = None;
    }

    fn held(&self) -> bool {
        self.held.is_some()
    }

    /// A write of `RELEASE`.
    pub fn release(&mut self, token: u64) -> Result<(), Status> {
        self.check(token)?;
        self.held = None;
        Ok(())
    }
}

/// The register page's offsets (docs/hvctl.md, "Registers").
pub mod reg {
    /// r, u32: [`MAGIC`](super::MAGIC).
    pub const MAGIC: u64 = 0x00;
    /// r, u32: [`VERSION`](super::VERSION).
    pub const VERSION: u64 = 0x04;
    /// r, u64: a new token, or 0 while another client holds the device.
    pub const CLAIM: u64 = 0x08;
    /// w, u64: the token; runs the request written through `DATA`.
    pub const DOORBELL: u64 = 0x10;
    /// r, u32: the last request's [`Status`](super::Status) (0: success).
    pub const STATUS: u64 = 0x18;
    /// r, u32: bytes of the last response.
    pub const RESP_LEN: u64 = 0x1c;
    /// w, u64: the token; gives the device up.
    pub const RELEASE: u64 = 0x20;
    /// w, u64: the next 8 bytes of the request. r, u64: the next 8 bytes of
    /// the response (zeros past its end), little-endian.
    pub const DATA: u64 = 0x28;
    /// r, u32: bytes of a paged response after this page (ask again from
    /// `offset + RESP_LEN` while not 0).
    pub const MORE: u64 = 0x30;
}

/// The register page's size; its IPA is the device tree node's `reg`.
pub const FRAME_SIZE: u64 = 0x1000;

/// A claim whose holder has not touched the device for this long lapses:
/// a client killed between `CLAIM` and `RELEASE` does not wedge it.
pub const CLAIM_LAPSE_NS: u64 = 2_000_000_000;

/// What one request produces: text, at most [`WINDOW_BYTES`], and for a
/// paged response the bytes left after it.
#[derive(Debug, Default)]
pub struct Reply {
    pub text: Vec<u8>,
    pub more: u32,
}

impl Reply {
    /// The page of `full` from `offset` (see [`page`]).
    pub fn paged(full: &[u8], offset: u32) -> Self {
        let (part, left) = page(full, offset, WINDOW_BYTES);
        Reply { text: part.to_vec(), more: u32::try_from(left).unwrap_or(u32::MAX) }
    }
}

/// A reply's text built at most `limit` bytes long, and only with memory
/// the heap can give (`try_reserve`): past either, the rest is counted, not
/// kept, so that a large machine's dump neither exhausts the heap nor
/// panics. What is kept is a prefix of the whole; [`BoundedText::finish`]
/// says how much was left out.
#[derive(Debug)]
pub struct BoundedText {
    text: String,
    limit: usize,
    dropped: usize,
}

impl BoundedText {
    pub fn new(limit: usize) -> Self {
        BoundedText { text: String::new(), limit, dropped: 0 }
    }

    /// The text, with a last line `(HV) truncated: N bytes left out` when
    /// something was.
    pub fn finish(mut self) -> String {
        if self.dropped > 0 {
            let line = alloc::format!("(HV) truncated: {} bytes left out\n", self.dropped);
            if self.text.try_reserve(line.len()).is_ok() {
                self.text.push_str(&line);
            }
        }
        self.text
    }
}

impl core::fmt::Write for BoundedText {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let fits = self.dropped == 0 && self.text.len() + s.len() <= self.limit;
        if fits && self.text.try_reserve(s.len()).is_ok() {
            self.text.push_str(s);
        } else {
            self.dropped += s.len();
        }
        Ok(())
    }
}

/// An access the page does not decode: the guest gets an external abort.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadAccess;

/// The device's counters (`control.*` in the stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub requests: u64,
    pub claims: u64,
    pub busy: u64,
    pub lapsed: u64,
    pub bad_accesses: u64,
    /// Requests answered with each [`Status`] (index: its code).
    pub errors: [u64; 12],
}

impl core::fmt::Display for Counters {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        writeln!(f, "control.requests={}", self.requests)?;
        writeln!(f, "control.claims={}", self.claims)?;
        writeln!(f, "control.busy={}", self.busy)?;
        writeln!(f, "control.lapsed={}", self.lapsed)?;
        writeln!(f, "control.bad_accesses={}", self.bad_accesses)?;
        for st in Status::ALL {
            writeln!(f, "control.err.{}={}", st.name(), self.errors[st as usize])?;
        }
        Ok(())
    }
}

/// The control device's register page: the claim, the request as it is
/// written 8 bytes at a time, and the last response as it is read back.
/// Pure: the run-time layer calls [`Device::read`] and [`Device::write`]
/// for each trapped access, with the clock and the code that acts on a
/// decoded request.
#[derive(Debug, Default)]
pub struct Device {
    claim: Claim,
    /// The request so far (at most [`WINDOW_BYTES`]).
    req: Vec<u8>,
    /// `DATA` writes past the window since the last doorbell.
    overflow: bool,
    resp: Vec<u8>,
    /// Where the next `DATA` read starts.
    resp_at: usize,
    status: u32,
    more: u32,
    /// The holder's last access.
    last_ns: u64,
    counters: Counters,
}

impl Device {
    pub const fn new() -> Self {
        Device {
            claim: Claim::new(),
            req: Vec::new(),
            overflow: false,
            resp: Vec::new(),
            resp_at: 0,
            status: 0,
            more: 0,
            last_ns: 0,
            counters: Counters { requests: 0, claims: 0, busy: 0, lapsed: 0, bad_accesses: 0, errors: [0; 12] },
        }
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// A trapped load of `size` bytes at `off`.
    pub fn read(&mut self, now: u64, off: u64, size: u8) -> Result<u64, BadAccess> {
        let v = match (off, size) {
            (reg::MAGIC, 4) => u64::from(MAGIC),
            (reg::VERSION, 4) => u64::from(VERSION),
            (reg::STATUS, 4) => u64::from(self.status),
            (reg::RESP_LEN, 4) => self.resp.len() as u64,
            (reg::MORE, 4) => u64::from(self.more),
            (reg::CLAIM, 8) => {
                if self.claim.held() && now.saturating_sub(self.last_ns) >= CLAIM_LAPSE_NS {
                    self.claim.lapse();
                    self.counters.lapsed += 1;
                }
                let t = self.claim.claim();
                if t == 0 {
                    self.counters.busy += 1;
                    self.counters.errors[Status::Busy as usize] += 1;
                } else {
                    self.counters.claims += 1;
                    self.last_ns = now;
                    self.req.clear();
                    self.overflow = false;
                }
                t
            }
            (reg::DATA, 8) => {
                self.last_ns = now;
                let mut w = [0u8; 8];
                let from = self.resp_at.min(self.resp.len());
                let n = (self.resp.len() - from).min(8);
                w[..n].copy_from_slice(&self.resp[from..from + n]);
                self.resp_at = from + n;
                u64::from_le_bytes(w)
            }
            _ => return Err(self.bad()),
        };
        Ok(v)
    }

    /// A trapped store of `value` (`size` bytes) at `off`. A doorbell with
    /// the holder's token decodes the request and hands it to `run`, whose
    /// reply (or status) the next reads see.
    pub fn write(
        &mut self,
        now: u64,
        off: u64,
        size: u8,
        value: u64,
        run: impl FnOnce(Request<'_>) -> Result<Reply, Status>,
    ) -> Result<(), BadAccess> {
        match (off, size) {
            (reg::DATA, 8) => {
                self.last_ns = now;
                if self.req.len() + 8 <= WINDOW_BYTES {
                    self.req.extend_from_slice(&value.to_le_bytes());
                } else {
                    self.overflow = true;
                }
            }
            (reg::DOORBELL, 8) => {
                self.last_ns = now;
                self.counters.requests += 1;
                let out = match self.claim.check(value) {
                    Err(e) => Err(e),
                    Ok(()) if self.overflow => Err(Status::Inval),
                    Ok(()) => decode(&self.req).and_then(run),
                };
                self.req.clear();
                self.overflow = false;
                self.resp_at = 0;
                match out {
                    Ok(mut r) => {
                        r.text.truncate(WINDOW_BYTES);
                        self.resp = r.text;
                        self.more = r.more;
                        self.status = 0;
                    }
                    Err(e) => {
                        self.resp.clear();
                        self.more = 0;
                        self.status = e as u32;
                        self.counters.errors[e as usize] += 1;
                    }
                }
            }
            (reg::RELEASE, 8) => {
                if let Err(e) = self.claim.release(value) {
                    self.status = e as u32;
                    self.counters.errors[e as usize] += 1;
                } else {
                    self.resp = Vec::new();
                    self.req = Vec::new();
                }
            }
            _ => return Err(self.bad()),
        }
        Ok(())
    }

    fn bad(&mut self) -> BadAccess {
        self.counters.bad_accesses += 1;
        BadAccess
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    fn req(opn: u32, args: [u32; 4], payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        for w in [opn, payload.len() as u32].into_iter().chain(args) {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.extend_from_slice(payload);
        b
    }

    const U: u32 = UNCHANGED;

    #[test]
    fn every_operation_decodes() {
        assert_eq!(decode(&req(1, [0; 4], b"")), Ok(Request::List));
        assert_eq!(decode(&req(2, [0; 4], b"")), Ok(Request::VcpuList));
        assert_eq!(decode(&req(3, [4096, 0, 0, 0], b"")), Ok(Request::Stats { offset: 4096 }));
        assert_eq!(decode(&req(4, [0; 4], b"")), Ok(Request::TraceDump { offset: 0 }));
        let spec = b"name=d\nmemory_mib=64\nvcpus=1\nkernel_bytes=4096\n";
        assert!(matches!(decode(&req(12, [0; 4], spec)), Ok(Request::Create(c)) if c.name == "d"));
        let page = 0x4000_0000u64.to_le_bytes();
        assert_eq!(
            decode(&req(13, [3, 1, 7, 0], &page)),
            Ok(Request::Load { dom: 3, module: Module::Ramdisk, first_page: 7, pages: &page })
        );
        assert_eq!(decode(&req(13, [3, 2, 7, 0], &page)), Err(Status::Inval));
        assert_eq!(decode(&req(14, [3, 0, 0, 0], b"")), Ok(Request::Start { dom: 3 }));
        assert_eq!(decode(&req(5, [U, 0, 0, 0], b"")), Ok(Request::SchedGet { dom: None }));
        assert_eq!(decode(&req(5, [2, 0, 0, 0], b"")), Ok(Request::SchedGet { dom: Some(2) }));
        assert_eq!(
            decode(&req(6, [1, U, 25, 0], b"")),
            Ok(Request::SchedSetDomain { dom: 1, weight: None, cap: Some(25) })
        );
        assert_eq!(
            decode(&req(6, [1, 512, U, 0], b"")),
            Ok(Request::SchedSetDomain { dom: 1, weight: Some(512), cap: None })
        );
        assert_eq!(
            decode(&req(7, [0; 4], b"sched_wake_preempt=off")),
            Ok(Request::SetOption { name: "sched_wake_preempt", value: "off" })
        );
        assert_eq!(decode(&req(8, [3, 0, 0, 0], b"")), Ok(Request::Destroy { dom: 3 }));
        assert_eq!(decode(&req(9, [3, 0, 0, 0], b"")), Ok(Request::Pause { dom: 3 }));
        assert_eq!(decode(&req(10, [3, 0, 0, 0], b"")), Ok(Request::Unpause { dom: 3 }));
        assert_eq!(decode(&req(11, [3, 0, 0, 0], b"")), Ok(Request::Shutdown { dom: 3 }));
    }

    #[test]
    fn malformed_requests_are_statuses() {
        assert_eq!(decode(&req(1, [0; 4], b"")[..HEADER_BYTES - 1]), Err(Status::Inval), "short header");
        assert_eq!(decode(&req(0, [0; 4], b"")), Err(Status::NoOp));
        assert_eq!(decode(&req(99, [0; 4], b"")), Err(Status::NoOp));
        assert_eq!(decode(&req(1, [0; 4], b"x")), Err(Status::Inval), "a payload where none goes");
        let mut long = req(7, [0; 4], b"a=b");
        long[4..8].copy_from_slice(&100u32.to_le_bytes());
        assert_eq!(decode(&long), Err(Status::Inval), "a length past the bytes given");
        long[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(&long), Err(Status::Inval), "a length past the window");
        assert_eq!(decode(&req(8, [70_000, 0, 0, 0], b"")), Err(Status::NoDom));
        assert_eq!(decode(&req(6, [1, 0, U, 0], b"")), Err(Status::Range), "weight 0");
        assert_eq!(decode(&req(6, [1, 65_536, U, 0], b"")), Err(Status::Range));
        for bad in [&b""[..], b"noequals", b"=v", b"n=", b"Name=v", b"a b=c", b"a=\x01", b"a=\xff"] {
            assert_eq!(decode(&req(7, [0; 4], bad)), Err(Status::Inval), "{bad:?}");
        }
        assert_eq!(decode(&req(7, [0; 4], &[b'a'; OPTION_MAX + 1])), Err(Status::Inval));
    }

    #[test]
    fn random_windows_never_panic_and_stay_in_bounds() {
        let mut rng = crate::testrng::Rng(0x5eed_c0de);
        let mut buf = alloc::vec![0u8; 512];
        let (mut options, mut decoded) = (0, 0);
        for _ in 0..200_000 {
            let n = rng.index(buf.len() + 1);
            for b in &mut buf[..n] {
                *b = rng.next() as u8;
            }
            // Plausible requests too, so that the payload paths run: a
            // known op, a length near the bytes given, a payload of the
            // characters an option is made of and some it may not hold.
            if n >= HEADER_BYTES && rng.below(2) == 0 {
                buf[0..4].copy_from_slice(&(1 + rng.below(15) as u32).to_le_bytes());
                let most = (n - HEADER_BYTES + 2).min(24) as u64;
                let len = if rng.below(2) == 0 { 0 } else { rng.below(most) as u32 };
                buf[4..8].copy_from_slice(&len.to_le_bytes());
                for b in &mut buf[HEADER_BYTES..n] {
                    *b = b"ab_=1Z \x7f\n"[rng.index(9)];
                }
            }
            match decode(&buf[..n]) {
                Ok(Request::SetOption { name, value }) => {
                    assert!(HEADER_BYTES + name.len() + 1 + value.len() <= n);
                    assert!(!name.is_empty() && !value.is_empty() && !name.contains(['Z', ' ']));
                    options += 1;
                }
                Ok(Request::Create(c)) => {
                    assert!(!c.name.is_empty() && c.vcpus > 0 && c.kernel_bytes > 0);
                    decoded += 1;
                }
                Ok(Request::Load { pages, .. }) => {
                    assert!(!pages.is_empty() && pages.len().is_multiple_of(8));
                    decoded += 1;
                }
                Ok(_) => decoded += 1,
                Err(_) => {}
            }
        }
        assert!(options > 20 && decoded > 1000, "{options} options, {decoded} others decoded");
    }

    #[test]
    fn long_responses_come_in_pages() {
        let text: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let mut got = Vec::new();
        let mut offset = 0u32;
        loop {
            let (part, left) = page(&text, offset, 4096);
            got.extend_from_slice(part);
            offset += part.len() as u32;
            if left == 0 {
                break;
            }
        }
        assert_eq!(got, text);
        assert_eq!(page(&text, 20_000, 4096), (&[][..], 0), "past the end");
    }

    #[test]
    fn one_client_at_a_time() {
        let mut c = Claim::default();
        let t = c.claim();
        assert_ne!(t, 0);
        assert_eq!(c.claim(), 0, "busy");
        assert_eq!(c.check(t ^ 2), Err(Status::BadToken));
        assert_eq!(c.check(t), Ok(()));
        assert_eq!(c.release(t ^ 2), Err(Status::BadToken));
        assert_eq!(c.release(t), Ok(()));
        let u = c.claim();
        assert!(u != 0 && u != t, "a new token");
        assert_eq!(c.check(t), Err(Status::BadToken), "an old token is dead");
    }

    /// A client as `hvctl` drives the page: claim, write, ring, read.
    fn transact(
        d: &mut Device,
        now: u64,
        token: u64,
        request: &[u8],
        run: impl FnOnce(Request<'_>) -> Result<Reply, Status>,
    ) -> (u32, Vec<u8>, u32) {
        for chunk in request.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            d.write(now, reg::DATA, 8, u64::from_le_bytes(w), |_| unreachable!()).unwrap();
        }
        d.write(now, reg::DOORBELL, 8, token, run).unwrap();
        let status = d.read(now, reg::STATUS, 4).unwrap() as u32;
        let len = d.read(now, reg::RESP_LEN, 4).unwrap() as usize;
        let mut out = Vec::new();
        while out.len() < len {
            out.extend_from_slice(&d.read(now, reg::DATA, 8).unwrap().to_le_bytes());
        }
        out.truncate(len);
        (status, out, d.read(now, reg::MORE, 4).unwrap() as u32)
    }

    #[test]
    fn the_register_page_carries_a_request_and_its_reply() {
        let mut d = Device::default();
        assert_eq!(d.read(0, reg::MAGIC, 4), Ok(u64::from(MAGIC)));
        assert_eq!(d.read(0, reg::VERSION, 4), Ok(1));
        let t = d.read(0, reg::CLAIM, 8).unwrap();
        assert_ne!(t, 0);
        let (st, text, more) = transact(&mut d, 1, t, &req(1, [0; 4], b""), |r| {
            assert_eq!(r, Request::List);
            Ok(Reply { text: b"domid=0 name=Dom0\n".to_vec(), more: 0 })
        });
        assert_eq!((st, text.as_slice(), more), (0, &b"domid=0 name=Dom0\n"[..], 0));
        // An option's payload crosses several DATA words.
        let (st, _, _) = transact(&mut d, 2, t, &req(7, [0; 4], b"sched_wake_preempt=off"), |r| {
            assert_eq!(r, Request::SetOption { name: "sched_wake_preempt", value: "off" });
            Ok(Reply::default())
        });
        assert_eq!(st, 0);
        // A paged response says what is left.
        let full: Vec<u8> = (0..WINDOW_BYTES + 100).map(|i| i as u8).collect();
        let (st, text, more) = transact(&mut d, 3, t, &req(3, [0; 4], b""), |r| match r {
            Request::Stats { offset } => Ok(Reply::paged(&full, offset)),
            _ => unreachable!(),
        });
        assert_eq!((st, text.len(), more), (0, WINDOW_BYTES, 100));
        d.write(4, reg::RELEASE, 8, t, |_| unreachable!()).unwrap();
        assert_eq!(d.counters().requests, 3);
    }

    #[test]
    fn bad_requests_and_accesses_are_statuses_and_aborts() {
        let mut d = Device::default();
        let t = d.read(0, reg::CLAIM, 8).unwrap();
        assert_eq!(d.read(0, reg::CLAIM, 8), Ok(0), "a second client is told busy");
        let never = |_: Request<'_>| -> Result<Reply, Status> { panic!("must not run") };
        assert_eq!(transact(&mut d, 1, t ^ 4, &req(1, [0; 4], b""), never).0, Status::BadToken as u32);
        assert_eq!(transact(&mut d, 1, t, &req(42, [0; 4], b""), never).0, Status::NoOp as u32);
        assert_eq!(transact(&mut d, 1, t, &[1, 0, 0], never).0, Status::Inval as u32, "short");
        // A request longer than the window: refused, nothing kept of it.
        let long = alloc::vec![0u8; WINDOW_BYTES + 64];
        assert_eq!(transact(&mut d, 1, t, &long, never).0, Status::Inval as u32);
        assert!(d.req.capacity() <= WINDOW_BYTES, "the request buffer stays bounded");
        // The executor's own refusal.
        assert_eq!(transact(&mut d, 1, t, &req(8, [0; 4], b""), |_| Err(Status::Perm)).0, Status::Perm as u32);
        // Sizes and directions the page does not have abort.
        assert_eq!(d.read(1, reg::MAGIC, 8), Err(BadAccess));
        assert_eq!(d.read(1, reg::DOORBELL, 8), Err(BadAccess));
        assert_eq!(d.read(1, 0x38, 4), Err(BadAccess));
        assert_eq!(d.write(1, reg::DATA, 4, 0, never), Err(BadAccess));
        assert_eq!(d.write(1, reg::MAGIC, 4, 0, never), Err(BadAccess));
        let c = d.counters();
        assert_eq!((c.bad_accesses, c.busy, c.errors[Status::Inval as usize]), (5, 1, 2));
        assert_eq!(c.errors[Status::BadToken as usize], 1);
    }

    #[test]
    fn a_silent_holder_loses_the_claim() {
        let mut d = Device::default();
        let t = d.read(0, reg::CLAIM, 8).unwrap();
        assert_eq!(d.read(CLAIM_LAPSE_NS - 1, reg::CLAIM, 8), Ok(0));
        let u = d.read(CLAIM_LAPSE_NS, reg::CLAIM, 8).unwrap();
        assert!(u != 0 && u != t);
        assert_eq!(d.counters().lapsed, 1);
        let st = transact(&mut d, CLAIM_LAPSE_NS, t, &req(1, [0; 4], b""), |_| Ok(Reply::default())).0;
        assert_eq!(st, Status::BadToken as u32, "the old holder's doorbell is refused");
        let text = alloc::format!("{}", d.counters());
        assert!(text.contains("control.lapsed=1\n") && text.contains("control.err.bad_token=1\n"), "{text}");
    }

    #[test]
    fn bounded_text_keeps_a_prefix_and_says_what_it_left_out() {
        use core::fmt::Write as _;
        let mut t = BoundedText::new(10);
        write!(t, "12345").unwrap();
        write!(t, "6789").unwrap();
        write!(t, "abc").unwrap();
        write!(t, "d").unwrap();
        assert_eq!(t.finish(), "123456789(HV) truncated: 4 bytes left out\n");
        let mut t = BoundedText::new(10);
        write!(t, "fits").unwrap();
        assert_eq!(t.finish(), "fits");
    }
}
