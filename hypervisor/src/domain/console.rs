//! The physical console shared by every domain, as Xen does it: output of
//! every domain but Dom0 is prefixed `(d<N>) ` per line; input goes to one
//! domain at a time (Dom0 first) and Ctrl-A pressed three times in a row
//! moves it to the next domain, announced as `(HV) input to d<N>`.
//!
//! Lines stay whole: the domain with the input focus writes through (an
//! interactive shell's prompt has no newline), the others are held until a
//! line is complete and printed while nobody is mid-line. Held output
//! beyond [`LINE_MAX`] breaks the open line and is printed.
//! Pure logic: the EL2 console (`runtime::console`) owns the UART and calls
//! this with a byte sink.

use super::DomainId;
use alloc::collections::BTreeMap;
use alloc::vec::Vec;

/// The input switch key (Ctrl-A), as Xen's `conswitch` default.
pub const SWITCH_KEY: u8 = 0x01;
/// Presses in a row that switch.
pub const SWITCH_PRESSES: u8 = 3;
/// The most a domain's held output (bytes) grows while another domain's
/// line stays open: past it that line is broken (a vCPU preempted mid-line
/// keeps its line open for a whole time slice).
pub const LINE_MAX: usize = 16 * 1024;

/// Where the bytes go (the physical UART).
pub trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
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
}

fn prefix(dom: DomainId, out: &mut dyn Sink) {
    if dom != 0 {
        out.put(alloc::format!("(d{dom}) ").as_bytes());
    }
}

impl ConsoleMux {
    pub const fn new() -> Self {
        Self { focus: 0, mid: None, held: BTreeMap::new() }
    }

    pub fn focus(&self) -> DomainId {
        self.focus
    }

    /// One byte of domain `dom`'s output.
    pub fn putc(&mut self, dom: DomainId, b: u8, out: &mut dyn Sink) {
        if dom == self.focus || self.mid == Some(dom) {
            if self.mid.is_some_and(|m| m != dom) {
                out.put(b"\n");
                self.mid = None;
                self.flush_held(out);
            }
            if self.mid.is_none() {
                prefix(dom, out);
            }
            out.put(&[b]);
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
                prefix(dom, out);
                out.put(buf);
                out.put(b"\n");
                buf.clear();
            }
        }
    }

    /// The hypervisor prints a line of its own: an open line is ended first.
    pub fn break_line(&mut self, out: &mut dyn Sink) {
        if self.mid.take().is_some() {
            out.put(b"\n");
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
                prefix(dom, out);
                out.put(&buf[..=nl]);
                buf.drain(..=nl);
            }
        }
    }

    /// Moves the input focus (and the write-through) to `dom`; whatever it
    /// held is printed first.
    pub fn set_focus(&mut self, dom: DomainId, out: &mut dyn Sink) {
        self.focus = dom;
        if self.mid.is_none() {
            if let Some(buf) = self.held.remove(&dom) {
                prefix(dom, out);
                out.put(&buf);
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
