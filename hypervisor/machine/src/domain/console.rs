//! The physical console shared by every domain, as Xen does it: output of
//! every domain but Dom0 is prefixed `(d<N>) ` per line; input goes to one
//! domain at a time (Dom0 first) and Ctrl-A pressed three times in a row
//! moves it to the next domain, announced as `(HV) input to d<N>`.
//!
//! Lines stay whole: the domain with the input focus writes through (an
//! interactive shell's prompt has no newline), the others are held until a
//! line is complete and printed while nobody is mid-line. Held output
//! beyond [`LINE_MAX`] breaks the open line and is printed.
//!
//! A DomU cannot forge or wedge the console:
//! - its bytes are filtered ([`ConsoleMux::putc`]): printable ASCII, `\n`,
//!   `\t` and a `\r` right before `\n` pass, anything else (a lone `\r`,
//!   ESC, other controls, DEL, bytes >= 0x80) is shown as `\xHH`, so it can
//!   neither move the cursor over its `(dN) ` prefix nor send the operator's
//!   terminal escape sequences. Dom0 owns the UART: its bytes pass as they are.
//! - what the mux emits goes through a bounded [`TxRing`]: a trap writes at
//!   most [`TX_BUDGET`] bytes to the UART (more only for Dom0's and the
//!   hypervisor's own bytes, which are never dropped); the rest waits for the
//!   UART's transmit interrupt; DomU bytes that do not fit are dropped and
//!   counted, a whole line at a time.
//! - input is read from the UART into an [`InputRing`] whatever the focused
//!   domain does; the switch and dump keys are recognised there, before any
//!   guest sees the input.
//!
//! Pure logic: the EL2 console (`runtime::console`) owns the UART and calls
//! this with a byte sink.

use super::DomainId;
use alloc::collections::{BTreeMap, BTreeSet, VecDeque};
use alloc::vec::Vec;

/// The input switch key (Ctrl-A), as Xen's `conswitch` default.
pub const SWITCH_KEY: u8 = 0x01;
/// Presses in a row that switch.
pub const SWITCH_PRESSES: u8 = 3;
/// The most a domain's held output (bytes) grows while another domain's
/// line stays open: past it that line is broken (a vCPU preempted mid-line
/// keeps its line open for a whole time slice).
pub const LINE_MAX: usize = 16 * 1024;

/// Where the bytes go (the physical UART, through a [`TxRing`]).
pub trait Sink {
    /// `bytes` of domain `dom`'s output (its prefix and line ends included).
    fn put(&mut self, dom: DomainId, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, _: DomainId, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// The output side: who is mid-line, and the lines held back.
#[derive(Debug, Default)]
pub struct ConsoleMux {
    /// The domain with the input focus (writes through).
    focus: DomainId,
    /// The domain whose line is open on the UART, if any.
    mid: Option<DomainId>,
    /// Per domain: bytes not printed yet (complete lines, then a partial one).
    held: BTreeMap<DomainId, Vec<u8>>,
    /// DomUs whose last byte was `\r`: shown as is if `\n` follows, else
    /// as `\x0d`.
    cr: BTreeSet<DomainId>,
}

/// Puts `bytes` that start a line of `dom`'s, after its prefix, in one
/// piece (so the ring keeps or drops them together: never a prefix alone).
fn prefixed(dom: DomainId, bytes: &[u8], out: &mut dyn Sink) {
    if dom == 0 {
        return out.put(dom, bytes);
    }
    let mut line = alloc::format!("(d{dom}) ").into_bytes();
    line.extend_from_slice(bytes);
    out.put(dom, &line);
}

/// How a DomU's byte `b` is shown: itself if printable ASCII, `\n` or
/// `\t`, else `\xHH` (lower-case hex). `\r` is [`ConsoleMux::putc`]'s.
pub fn escape(b: u8) -> ([u8; 4], usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    match b {
        0x20..=0x7e | b'\n' | b'\t' => ([b, 0, 0, 0], 1),
        _ => ([b'\\', b'x', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]], 4),
    }
}

impl ConsoleMux {
    pub const fn new() -> Self {
        Self { focus: 0, mid: None, held: BTreeMap::new(), cr: BTreeSet::new() }
    }

    pub fn focus(&self) -> DomainId {
        self.focus
    }

    /// One byte of domain `dom`'s output: Dom0's as it is, a DomU's
    /// filtered (see the module doc; a `\r` waits for the next byte to know
    /// whether it ends a line).
    pub fn putc(&mut self, dom: DomainId, b: u8, out: &mut dyn Sink) {
        if dom == 0 {
            return self.put_raw(dom, b, out);
        }
        let cr = self.cr.remove(&dom);
        if cr && b == b'\n' {
            self.put_raw(dom, b'\r', out);
        } else if cr {
            self.put_escaped(dom, b'\r', out);
        }
        if b == b'\r' {
            self.cr.insert(dom);
        } else {
            self.put_escaped(dom, b, out);
        }
    }

    fn put_escaped(&mut self, dom: DomainId, b: u8, out: &mut dyn Sink) {
        let (bytes, n) = escape(b);
        for &c in &bytes[..n] {
            self.put_raw(dom, c, out);
        }
    }

    /// One byte as it is shown, through the line discipline.
    fn put_raw(&mut self, dom: DomainId, b: u8, out: &mut dyn Sink) {
        if dom == self.focus || self.mid == Some(dom) {
            if let Some(m) = self.mid.filter(|&m| m != dom) {
                out.put(m, b"\n");
                self.mid = None;
                self.flush_held(out);
            }
            if self.mid.is_none() {
                prefixed(dom, &[b], out);
            } else {
                out.put(dom, &[b]);
            }
            self.mid = (b != b'\n').then_some(dom);
            if self.mid.is_none() {
                self.flush_held(out);
            }
            return;
        }
        self.held.entry(dom).or_default().push(b);
        if self.mid.is_none() {
            self.flush_held(out);
        }
        if self.held.get(&dom).is_some_and(|h| h.len() >= LINE_MAX) {
            // The open line does not end: break it, print the complete
            // held lines, and a partial one this long on its own.
            self.break_line(out);
            self.flush_held(out);
            if let Some(buf) = self.held.get_mut(&dom).filter(|h| h.len() >= LINE_MAX) {
                buf.push(b'\n');
                prefixed(dom, buf, out);
                buf.clear();
            }
        }
    }

    /// The hypervisor prints a line of its own: an open line is ended first.
    pub fn break_line(&mut self, out: &mut dyn Sink) {
        if let Some(m) = self.mid.take() {
            out.put(m, b"\n");
        }
    }

    /// After the hypervisor's line: held lines may go out now.
    pub fn after_hv_line(&mut self, out: &mut dyn Sink) {
        self.flush_held(out);
    }

    /// Prints every complete held line (nobody is mid-line).
    fn flush_held(&mut self, out: &mut dyn Sink) {
        for (&dom, buf) in self.held.iter_mut() {
            while let Some(nl) = buf.iter().position(|&c| c == b'\n') {
                prefixed(dom, &buf[..=nl], out);
                buf.drain(..=nl);
            }
        }
        // Nothing is kept for a domain with nothing held: the heap holds
        // only what waits to be printed (and a domain that came and went
        // leaves it as it was).
        self.held.retain(|_, buf| !buf.is_empty());
        if self.held.is_empty() {
            self.held = BTreeMap::new();
        }
    }

    /// Domain `dom` is gone: what it held is printed (a partial last line
    /// ended), and nothing of it is kept.
    pub fn forget(&mut self, dom: DomainId, out: &mut dyn Sink) {
        self.forget_lines(dom, out);
        // An emptied map keeps its root node: dropped, so that a domain
        // that came and went leaves the heap as it was.
        if self.held.is_empty() {
            self.held = BTreeMap::new();
        }
        if self.cr.is_empty() {
            self.cr = BTreeSet::new();
        }
    }

    fn forget_lines(&mut self, dom: DomainId, out: &mut dyn Sink) {
        self.cr.remove(&dom);
        let Some(mut buf) = self.held.remove(&dom) else {
            if self.mid == Some(dom) {
                out.put(dom, b"\n");
                self.mid = None;
            }
            return;
        };
        if buf.is_empty() {
            return;
        }
        // Its lines go out whole, as a hypervisor line would: an open line
        // of another domain's is ended first.
        self.break_line(out);
        if buf.last() != Some(&b'\n') {
            buf.push(b'\n');
        }
        for line in buf.split_inclusive(|&c| c == b'\n') {
            prefixed(dom, line, out);
        }
    }

    /// Moves the input focus (and the write-through) to `dom`; whatever it
    /// held is printed first.
    pub fn set_focus(&mut self, dom: DomainId, out: &mut dyn Sink) {
        self.focus = dom;
        if self.mid.is_none() {
            if let Some(buf) = self.held.remove(&dom) {
                prefixed(dom, &buf, out);
                self.mid = (buf.last() != Some(&b'\n')).then_some(dom);
            }
        }
    }
}

/// What a received byte means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// Give it to the domain with the focus.
    Byte(u8),
    /// The third Ctrl-A: switch (the byte is consumed).
    Switch,
}

/// Counts Ctrl-A presses in a row (the first two still reach the guest, as
/// in Xen).
#[derive(Debug, Default)]
pub struct InputSwitch {
    presses: u8,
}

impl InputSwitch {
    pub const fn new() -> Self {
        Self { presses: 0 }
    }

    pub fn feed(&mut self, b: u8) -> Input {
        if b != SWITCH_KEY {
            self.presses = 0;
            return Input::Byte(b);
        }
        self.presses += 1;
        if self.presses == SWITCH_PRESSES {
            self.presses = 0;
            Input::Switch
        } else {
            Input::Byte(b)
        }
    }
}

/// The domain after `cur` among `live` (ascending ids), wrapping to the first.
pub fn next_domain(cur: DomainId, live: &[DomainId]) -> DomainId {
    live.iter().copied().find(|&d| d > cur).or_else(|| live.first().copied()).unwrap_or(0)
}

/// The physical UART's transmit side, as [`TxRing`] drives it.
pub trait TxPort {
    /// Hands `b` to the UART if its FIFO has room; false if it is full.
    fn try_put(&mut self, b: u8) -> bool;
    /// Hands `b` to the UART, waiting for room.
    fn put(&mut self, b: u8);
}

/// Bytes a trap writes to the UART from the [`TxRing`] (the physical
/// PL011's FIFO holds 32 on real hardware, 16 under QEMU).
pub const TX_BUDGET: usize = 32;
/// Bytes the [`TxRing`] holds.
pub const TX_RING: usize = 16 * 1024;

/// Console output waiting for the UART, bounded.
///
/// Contract: [`TxRing::push`] (a domain's bytes) and [`TxRing::drain`] write
/// at most [`TX_BUDGET`] queued bytes to the UART without waiting, except to
/// make room for Dom0's or the hypervisor's own bytes, which are never
/// dropped (the writer waits for the UART instead: back-pressure on Dom0 and
/// the hypervisor, never on a DomU's behalf beyond the budget). A DomU's
/// bytes that do not fit are dropped and counted; once one of its bytes is
/// dropped, the rest of that line is too, so what is printed of it later
/// starts on a fresh line with its prefix and never continues a line whose
/// prefix was dropped. Whoever owns the UART drains the rest later
/// ([`TxRing::drain`] from the UART's transmit interrupt, wanted while
/// [`TxRing::is_empty`] is false) and [`TxRing::flush`]es before the
/// machine stops.
#[derive(Debug)]
pub struct TxRing {
    buf: VecDeque<u8>,
    cap: usize,
    /// DomUs dropping the rest of a line.
    dropping: BTreeSet<DomainId>,
    /// DomU bytes dropped because the ring was full.
    pub dropped: u64,
    /// Bytes written to the UART while waiting for it (lossless pushes into
    /// a full ring, [`TxRing::flush`]).
    pub waited: u64,
}

impl TxRing {
    pub const fn new(cap: usize) -> Self {
        Self { buf: VecDeque::new(), cap, dropping: BTreeSet::new(), dropped: 0, waited: 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Allocates the ring's whole capacity now (once the heap exists), so
    /// that a burst of output later takes nothing more from the heap.
    pub fn reserve(&mut self) -> Result<(), alloc::collections::TryReserveError> {
        self.buf.try_reserve_exact(self.cap.saturating_sub(self.buf.len()))
    }

    /// Domain `dom` is gone: nothing of its is tracked any more.
    fn forget(&mut self, dom: DomainId) {
        self.dropping.remove(&dom);
        if self.dropping.is_empty() {
            self.dropping = BTreeSet::new();
        }
    }

    /// Queues `dom`'s bytes (see the type's contract).
    pub fn push(&mut self, dom: DomainId, bytes: &[u8], port: &mut dyn TxPort) {
        if dom == 0 {
            self.push_lossless(bytes, port);
        } else if self.dropping.contains(&dom) || self.buf.len() + bytes.len() > self.cap {
            self.dropped += bytes.len() as u64;
            if bytes.last() == Some(&b'\n') {
                self.forget(dom);
            } else {
                self.dropping.insert(dom);
            }
        } else {
            self.buf.extend(bytes);
        }
    }

    /// The hypervisor's own bytes: written at once if nothing waits (boot
    /// logs and fatal errors reach the UART before anything else can go
    /// wrong), else queued behind what waits, never dropped. The caller
    /// drains a budget when its line is complete.
    pub fn push_hv(&mut self, bytes: &[u8], port: &mut dyn TxPort) {
        if self.buf.is_empty() {
            for &b in bytes {
                port.put(b);
            }
        } else {
            self.push_lossless(bytes, port);
        }
    }

    fn push_lossless(&mut self, bytes: &[u8], port: &mut dyn TxPort) {
        let room = self.cap.saturating_sub(self.buf.len());
        for _ in room..bytes.len() {
            match self.buf.pop_front() {
                Some(b) => {
                    port.put(b);
                    self.waited += 1;
                }
                None => break,
            }
        }
        self.buf.extend(bytes);
    }

    /// Writes up to `max` queued bytes while the UART has room; returns how
    /// many.
    pub fn drain(&mut self, max: usize, port: &mut dyn TxPort) -> usize {
        let mut n = 0;
        while n < max {
            let Some(&b) = self.buf.front() else { break };
            if !port.try_put(b) {
                break;
            }
            self.buf.pop_front();
            n += 1;
        }
        n
    }

    /// Writes everything queued, waiting for the UART.
    pub fn flush(&mut self, port: &mut dyn TxPort) {
        while let Some(b) = self.buf.pop_front() {
            port.put(b);
            self.waited += 1;
        }
    }
}

/// The mux's output into the ring.
struct Queue<'a> {
    tx: &'a mut TxRing,
    port: &'a mut dyn TxPort,
}

impl Sink for Queue<'_> {
    fn put(&mut self, dom: DomainId, bytes: &[u8]) {
        self.tx.push(dom, bytes, self.port);
    }
}

/// The console's output side: the mux in front of the ring. Each call is
/// what one trap or interrupt does, and writes at most [`TX_BUDGET`] queued
/// bytes to the UART without waiting (plus, waiting, what Dom0's or the
/// hypervisor's own bytes need to find room); the caller keeps the UART's
/// transmit interrupt on while [`ConsoleOut::pending`] and calls
/// [`ConsoleOut::transmit`] from it.
#[derive(Debug)]
pub struct ConsoleOut {
    pub mux: ConsoleMux,
    pub tx: TxRing,
}

impl Default for ConsoleOut {
    fn default() -> Self {
        Self::new()
    }
}

impl ConsoleOut {
    pub const fn new() -> Self {
        Self { mux: ConsoleMux::new(), tx: TxRing::new(TX_RING) }
    }

    /// Output waits for the UART.
    pub fn pending(&self) -> bool {
        !self.tx.is_empty()
    }

    /// One byte of domain `dom`'s output.
    pub fn putc(&mut self, dom: DomainId, b: u8, port: &mut dyn TxPort) {
        self.mux.putc(dom, b, &mut Queue { tx: &mut self.tx, port });
        self.tx.drain(TX_BUDGET, port);
    }

    /// Allocates the transmit ring whole (see [`TxRing::reserve`]).
    pub fn reserve(&mut self) -> Result<(), alloc::collections::TryReserveError> {
        self.tx.reserve()
    }

    /// Moves the input focus (see [`ConsoleMux::set_focus`]).
    pub fn set_focus(&mut self, dom: DomainId, port: &mut dyn TxPort) {
        self.mux.set_focus(dom, &mut Queue { tx: &mut self.tx, port });
        self.tx.drain(TX_BUDGET, port);
    }

    /// Domain `dom` is gone (see [`ConsoleMux::forget`]).
    pub fn forget(&mut self, dom: DomainId, port: &mut dyn TxPort) {
        self.mux.forget(dom, &mut Queue { tx: &mut self.tx, port });
        self.tx.drain(TX_BUDGET, port);
        self.tx.forget(dom);
    }

    /// A hypervisor line starts: an open line is ended.
    pub fn hv_begin(&mut self, port: &mut dyn TxPort) {
        self.mux.break_line(&mut Queue { tx: &mut self.tx, port });
    }

    /// Bytes of the hypervisor's line ([`TxRing::push_hv`]).
    pub fn hv_bytes(&mut self, bytes: &[u8], port: &mut dyn TxPort) {
        self.tx.push_hv(bytes, port);
    }

    /// The hypervisor's line is complete: held lines may follow.
    pub fn hv_end(&mut self, port: &mut dyn TxPort) {
        self.mux.after_hv_line(&mut Queue { tx: &mut self.tx, port });
        self.tx.drain(TX_BUDGET, port);
    }

    /// The UART's transmit interrupt: the next budget.
    pub fn transmit(&mut self, port: &mut dyn TxPort) -> usize {
        self.tx.drain(TX_BUDGET, port)
    }

    /// Everything queued, waiting for the UART (the machine stops).
    pub fn flush(&mut self, port: &mut dyn TxPort) {
        self.tx.flush(port);
    }
}

/// The statistics and flight-recorder dump key (Ctrl-\\).
pub const DUMP_KEY: u8 = 0x1c;
/// Bytes of input the [`InputRing`] holds for the focused domain (a paste
/// into a console that reads slowly is not lost up to this much).
pub const INPUT_RING: usize = 32 * 1024;

/// A key the hypervisor takes out of the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    /// The third Ctrl-A: the focus moves on.
    Switch,
    /// Ctrl-\\: statistics and a flight-recorder dump.
    Dump,
}

/// Console input on its way to the domain with the focus.
///
/// Contract: [`InputRing::fill`] reads the physical UART whatever the
/// domains do (so the UART never stops the keys below from being seen),
/// stopping at each [`Key`] so that the bytes before it are the old focus's
/// and those after it the new one's. The focused domain's emulated UART takes
/// bytes from the ring as its FIFO has room ([`InputRing::pop`]); what does
/// not fit in the ring, and what the old focus has not taken when the focus
/// moves ([`InputRing::discard`]), is dropped and counted against that
/// domain.
#[derive(Debug)]
pub struct InputRing {
    buf: VecDeque<u8>,
    cap: usize,
    switch: InputSwitch,
    /// Bytes read from the UART.
    pub bytes: u64,
    /// Bytes dropped because the ring was full.
    pub overruns: u64,
    /// Per domain: bytes typed for it that it never took (ring full while it
    /// had the focus, or left in the ring when the focus moved on).
    dropped: BTreeMap<DomainId, u64>,
}

impl InputRing {
    pub const fn new(cap: usize) -> Self {
        Self { buf: VecDeque::new(), cap, switch: InputSwitch::new(), bytes: 0, overruns: 0, dropped: BTreeMap::new() }
    }

    /// Reads up to `max` bytes from `src` (`None`: the UART is empty) for
    /// domain `focus`; stops after a [`Key`] and returns it.
    pub fn fill(&mut self, src: &mut dyn FnMut() -> Option<u8>, focus: DomainId, max: usize) -> Option<Key> {
        for _ in 0..max {
            let b = src()?;
            self.bytes += 1;
            if b == DUMP_KEY {
                return Some(Key::Dump);
            }
            match self.switch.feed(b) {
                Input::Switch => return Some(Key::Switch),
                Input::Byte(b) if self.buf.len() < self.cap => self.buf.push_back(b),
                Input::Byte(_) => {
                    self.overruns += 1;
                    *self.dropped.entry(focus).or_default() += 1;
                }
            }
        }
        None
    }

    /// The next byte for the focused domain.
    pub fn pop(&mut self) -> Option<u8> {
        self.buf.pop_front()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Drops what `dom` (losing the focus) has not taken; returns how much.
    /// Domain `dom` is gone: its count of dropped input goes with it.
    pub fn forget(&mut self, dom: DomainId) {
        self.dropped.remove(&dom);
        if self.dropped.is_empty() {
            self.dropped = BTreeMap::new();
        }
    }

    pub fn discard(&mut self, dom: DomainId) -> usize {
        let n = self.buf.len();
        self.buf.clear();
        if n > 0 {
            *self.dropped.entry(dom).or_default() += n as u64;
        }
        n
    }

    /// Bytes typed for `dom` that it never took.
    pub fn dropped(&self, dom: DomainId) -> u64 {
        self.dropped.get(&dom).copied().unwrap_or(0)
    }
}

/// Domains input can switch to, ascending: Dom0 (always: its console is the
/// physical UART's place, emulated) and every running DomU with a vPL011.
/// `doms`: (id, has a vPL011, stopped).
pub fn input_targets(doms: &[(DomainId, bool, bool)]) -> Vec<DomainId> {
    let mut v: Vec<DomainId> =
        doms.iter().filter(|&&(d, uart, stopped)| d == 0 || (uart && !stopped)).map(|&(d, _, _)| d).collect();
    v.sort_unstable();
    v
}
