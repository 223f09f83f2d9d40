//! One request to the control device over a [`Regs`] page: claim, write
//! the request through `DATA`, ring, read the status and the response,
//! release (always, also when the request failed); and the paged requests
//! (`STATS`, `TRACE_DUMP`) as one text.

use crate::regs::Regs;
use hv_core::control::{reg, Status, HEADER_BYTES, MAGIC, UNCHANGED, VERSION, WINDOW_BYTES};
use std::fmt;
use std::time::Duration;

/// What can go wrong talking to the device; `hvctl: <Display>` is printed.
#[derive(Debug, PartialEq, Eq)]
pub enum Error {
    /// The hypervisor refused the request.
    Status(Status),
    /// A status code this `hvctl` does not know.
    UnknownStatus(u32),
    /// `CLAIM` kept reading 0.
    Busy,
    /// The page's `MAGIC` or `VERSION` is not ours.
    NotOurs { magic: u32, version: u32 },
    /// The request does not fit the window.
    TooLong,
    /// A paged response said more follows but gave nothing.
    Stuck,
    /// Anything else, already worded (discovery, /dev/mem, bad arguments).
    Other(String),
    /// The input is wrong and nothing was asked of the device (a
    /// configuration `create` cannot use): exit status 2, as for a bad
    /// command line.
    Usage(String),
}

impl Error {
    /// The process's exit status for this error.
    pub fn exit_status(&self) -> i32 {
        match self {
            Error::Usage(_) => 2,
            _ => 1,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Status(s) => write!(f, "{s}"),
            Error::UnknownStatus(c) => write!(f, "the request failed with status {c}"),
            Error::Busy => write!(f, "the control device is busy (another hvctl?)"),
            Error::NotOurs { magic, version } => write!(
                f,
                "the control device does not speak version {VERSION} (magic {magic:#010x}, version {version})"
            ),
            Error::TooLong => write!(f, "the request does not fit the control window"),
            Error::Stuck => write!(f, "a paged response stopped making progress"),
            Error::Other(s) | Error::Usage(s) => write!(f, "{s}"),
        }
    }
}

/// `STATUS`'s code as a [`Status`] (0 is success).
pub fn status_of(code: u32) -> Result<(), Error> {
    match code {
        0 => Ok(()),
        c => Err(Status::from_code(c).map_or(Error::UnknownStatus(c), Error::Status)),
    }
}

/// A successful request's answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Response {
    pub text: Vec<u8>,
    /// Bytes of a paged response after this page.
    pub more: u32,
}

/// The request bytes: the header (`op`, `len`, `args`) and the payload.
pub fn encode(op: u32, args: [u32; 4], payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER_BYTES + payload.len());
    for w in [op, payload.len() as u32].into_iter().chain(args) {
        b.extend_from_slice(&w.to_le_bytes());
    }
    b.extend_from_slice(payload);
    b
}

/// The device's client.
pub struct Client<R: Regs> {
    regs: R,
    /// How long to wait between `CLAIM` reads, and how many to try.
    pub retry: Duration,
    pub tries: u32,
}

impl<R: Regs> Client<R> {
    /// A client retrying a busy claim every 50 ms for 3 s.
    pub fn new(regs: R) -> Self {
        Client { regs, retry: Duration::from_millis(50), tries: 60 }
    }

    fn check_id(&self) -> Result<(), Error> {
        let magic = self.regs.read32(reg::MAGIC);
        let version = self.regs.read32(reg::VERSION);
        if magic != MAGIC || version != VERSION {
            return Err(Error::NotOurs { magic, version });
        }
        Ok(())
    }

    fn claim(&self) -> Result<u64, Error> {
        for i in 0..self.tries {
            match self.regs.read64(reg::CLAIM) {
                0 if i + 1 < self.tries => std::thread::sleep(self.retry),
                0 => {}
                t => return Ok(t),
            }
        }
        Err(Error::Busy)
    }

    /// One request: `op` with `args` and `payload`.
    pub fn call(&self, op: u32, args: [u32; 4], payload: &[u8]) -> Result<Response, Error> {
        let req = encode(op, args, payload);
        if req.len() > WINDOW_BYTES {
            return Err(Error::TooLong);
        }
        self.check_id()?;
        let token = self.claim()?;
        let out = self.exchange(token, &req);
        self.regs.write64(reg::RELEASE, token);
        out
    }

    /// The claimed part of [`Client::call`].
    fn exchange(&self, token: u64, req: &[u8]) -> Result<Response, Error> {
        for chunk in req.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.regs.write64(reg::DATA, u64::from_le_bytes(w));
        }
        self.regs.write64(reg::DOORBELL, token);
        status_of(self.regs.read32(reg::STATUS))?;
        let len = (self.regs.read32(reg::RESP_LEN) as usize).min(WINDOW_BYTES);
        let mut text = Vec::with_capacity(len.next_multiple_of(8));
        for _ in 0..len.div_ceil(8) {
            text.extend_from_slice(&self.regs.read64(reg::DATA).to_le_bytes());
        }
        text.truncate(len);
        Ok(Response { text, more: self.regs.read32(reg::MORE) })
    }

    /// A request without arguments beyond `arg0`.
    pub fn simple(&self, op: u32, arg0: u32) -> Result<Vec<u8>, Error> {
        Ok(self.call(op, [arg0, UNCHANGED, UNCHANGED, UNCHANGED], &[])?.text)
    }

    /// A paged request (`arg0` is the byte offset), all pages joined.
    pub fn paged(&self, op: u32) -> Result<Vec<u8>, Error> {
        let mut text = Vec::new();
        loop {
            let offset = u32::try_from(text.len()).map_err(|_| Error::Stuck)?;
            let r = self.call(op, [offset, 0, 0, 0], &[])?;
            let got = r.text.len();
            text.extend_from_slice(&r.text);
            if r.more == 0 {
                return Ok(text);
            }
            if got == 0 {
                return Err(Error::Stuck);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod fake {
    //! A register page backed by hv-core's own device model and a canned
    //! executor.
    use super::Regs;
    use hv_core::control::{Device, Reply, Request, Status};
    use std::cell::{Cell, RefCell};

    /// What the fake hypervisor answers a request.
    pub type Exec = Box<dyn Fn(Request<'_>) -> Result<Reply, Status>>;

    pub struct FakeRegs {
        pub dev: RefCell<Device>,
        pub exec: Exec,
        pub now: Cell<u64>,
        /// Every access, as (write?, offset).
        pub log: RefCell<Vec<(bool, u64)>>,
    }

    impl FakeRegs {
        pub fn new(exec: Exec) -> Self {
            FakeRegs { dev: RefCell::default(), exec, now: Cell::new(0), log: RefCell::default() }
        }

        fn tick(&self) -> u64 {
            self.now.set(self.now.get() + 1000);
            self.now.get()
        }
    }

    impl Regs for FakeRegs {
        fn read32(&self, off: u64) -> u32 {
            self.log.borrow_mut().push((false, off));
            let now = self.tick();
            self.dev.borrow_mut().read(now, off, 4).expect("a 32-bit read the device decodes") as u32
        }
        fn read64(&self, off: u64) -> u64 {
            self.log.borrow_mut().push((false, off));
            let now = self.tick();
            self.dev.borrow_mut().read(now, off, 8).expect("a 64-bit read the device decodes")
        }
        fn write64(&self, off: u64, v: u64) {
            self.log.borrow_mut().push((true, off));
            let now = self.tick();
            self.dev.borrow_mut().write(now, off, 8, v, |r| (self.exec)(r)).expect("a write the device decodes");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeRegs;
    use super::*;
    use hv_core::control::{op, Reply, Request};

    fn client(exec: super::fake::Exec) -> Client<FakeRegs> {
        let mut c = Client::new(FakeRegs::new(exec));
        c.retry = Duration::ZERO;
        c
    }

    #[test]
    fn a_request_travels_and_the_device_is_released() {
        let c = client(Box::new(|r| match r {
            Request::SetOption { name: "sched_wake_preempt", value: "off" } => {
                Ok(Reply { text: b"ok: twenty bytes long\n".to_vec(), more: 0 })
            }
            other => panic!("{other:?}"),
        }));
        let r = c.call(op::SET_OPTION, [0; 4], b"sched_wake_preempt=off").unwrap();
        assert_eq!(r, Response { text: b"ok: twenty bytes long\n".to_vec(), more: 0 });
        assert_eq!(c.regs.dev.borrow().counters().requests, 1);
        // Released: a second client claims at once.
        assert_ne!(c.regs.dev.borrow_mut().read(c.regs.now.get(), reg::CLAIM, 8).unwrap(), 0);
        let log = c.regs.log.borrow();
        assert_eq!(log.last(), Some(&(true, reg::RELEASE)));
        assert_eq!(log.iter().filter(|a| **a == (true, reg::DATA)).count(), (24 + 22usize).div_ceil(8));
    }

    #[test]
    fn a_refusal_is_its_status_and_still_releases() {
        let c = client(Box::new(|_| Err(Status::Unsupported)));
        let e = c.simple(op::DESTROY, 3).unwrap_err();
        assert_eq!(e, Error::Status(Status::Unsupported));
        assert_eq!(e.to_string(), "operation not supported by this hypervisor yet");
        assert_eq!(c.regs.log.borrow().last(), Some(&(true, reg::RELEASE)));
        // Decoding errors come from the device model itself.
        let c = client(Box::new(|_| panic!("not run")));
        assert_eq!(c.simple(77, 0), Err(Error::Status(Status::NoOp)));
        assert_eq!(status_of(99), Err(Error::UnknownStatus(99)));
    }

    #[test]
    fn a_held_device_is_busy_after_the_retries() {
        let c = client(Box::new(|_| Ok(Reply::default())));
        let other = c.regs.dev.borrow_mut().read(0, reg::CLAIM, 8).unwrap();
        assert_ne!(other, 0);
        assert_eq!(c.simple(op::LIST, 0), Err(Error::Busy));
        assert_eq!(c.regs.log.borrow().iter().filter(|a| **a == (false, reg::CLAIM)).count(), 60);
        assert_eq!(Error::Busy.to_string(), "the control device is busy (another hvctl?)");
    }

    #[test]
    fn paged_responses_are_joined() {
        let full: Vec<u8> = (0..3 * WINDOW_BYTES + 5).map(|i| b'a' + (i % 26) as u8).collect();
        let f = full.clone();
        let c = client(Box::new(move |r| match r {
            Request::Stats { offset } => Ok(Reply::paged(&f, offset)),
            other => panic!("{other:?}"),
        }));
        assert_eq!(c.paged(op::STATS).unwrap(), full);
        assert_eq!(c.regs.dev.borrow().counters().requests, 4);
        let c = client(Box::new(|_| Ok(Reply { text: Vec::new(), more: 10 })));
        assert_eq!(c.paged(op::TRACE_DUMP), Err(Error::Stuck));
    }

    #[test]
    fn a_foreign_page_is_refused() {
        struct Zero;
        impl Regs for Zero {
            fn read32(&self, _: u64) -> u32 {
                0
            }
            fn read64(&self, _: u64) -> u64 {
                panic!("no claim on a foreign page")
            }
            fn write64(&self, _: u64, _: u64) {
                panic!("no writes to a foreign page")
            }
        }
        let e = Client::new(Zero).simple(op::LIST, 0).unwrap_err();
        assert!(matches!(e, Error::NotOurs { magic: 0, version: 0 }), "{e:?}");
    }

    #[test]
    fn encodes_the_header_little_endian() {
        let b = encode(6, [1, 2, 3, 4], b"xy");
        assert_eq!(b.len(), 26);
        assert_eq!(&b[..8], &[6, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(&b[20..], &[4, 0, 0, 0, b'x', b'y']);
    }
}
