//! The hypervisor console: log output and every domain's emulated UART share
//! the physical PL011. A hypervisor log line always starts on a fresh line, so
//! it never splices into the middle of a guest line's bytes; Dom0's bytes pass
//! through unchanged, other domains' lines get a `(dN) ` prefix, and input
//! goes to one domain at a time, switched by Ctrl-A three times
//! (`crate::domain::console`, Xen's convention).

use crate::arch::pl011::Pl011;
use crate::domain::console::{ConsoleOut, InputRing, Key, TxPort, INPUT_RING};
use crate::domain::DomainId;
use crate::sync::Mutex;
use core::fmt::Write;

struct Console {
    uart: Option<Uart>,
    /// Who is mid-line, held DomU lines, the input focus, output waiting
    /// for the UART (drained by its transmit interrupt).
    out: ConsoleOut,
    /// Input waiting for the focused domain's emulated UART.
    rx: InputRing,
}

static CONSOLE: Mutex<Console> =
    Mutex::new(Console { uart: None, out: ConsoleOut::new(), rx: InputRing::new(INPUT_RING) });

/// The physical UART as the console's output port.
struct Uart(Pl011);

impl core::ops::Deref for Uart {
    type Target = Pl011;
    fn deref(&self) -> &Pl011 {
        &self.0
    }
}

impl core::ops::DerefMut for Uart {
    fn deref_mut(&mut self) -> &mut Pl011 {
        &mut self.0
    }
}

impl TxPort for Uart {
    fn try_put(&mut self, b: u8) -> bool {
        self.0.try_putc(b)
    }
    fn put(&mut self, b: u8) {
        self.0.putc(b);
    }
}

/// A sink for when there is no UART yet.
struct Nowhere;

impl TxPort for Nowhere {
    fn try_put(&mut self, _: u8) -> bool {
        true
    }
    fn put(&mut self, _: u8) {}
}

impl Console {
    /// Runs `f` on the output side with the UART (or nowhere), then asks
    /// for the transmit interrupt while output waits.
    fn with_out(&mut self, f: impl FnOnce(&mut ConsoleOut, &mut dyn TxPort)) {
        match &mut self.uart {
            Some(u) => {
                f(&mut self.out, u);
                u.set_tx_irq(self.out.pending());
            }
            None => f(&mut self.out, &mut Nowhere),
        }
    }
}

/// Uses the PL011 at `base` (identity-mapped) from now on.
///
/// # Safety
///
/// `base` must be the register frame of a PL011, mapped as device memory,
/// that nothing but this module drives.
pub unsafe fn init(base: usize) {
    let c = &mut *CONSOLE.lock();
    if let Some(u) = &mut c.uart {
        // The old UART's queued bytes go out before it is left.
        c.out.flush(u);
    }
    // SAFETY: the caller's guarantee is `Pl011::new`'s contract.
    c.uart = Some(Uart(unsafe { Pl011::new(base) }));
}

/// One byte from domain `dom`'s emulated UART.
pub fn domain_putc(dom: DomainId, b: u8) {
    CONSOLE.lock().with_out(|out, port| out.putc(dom, b, port));
}

/// The domain that gets console input.
pub fn input_focus() -> DomainId {
    CONSOLE.lock().out.mux.focus()
}

/// Gives console input to `dom` (and prints what it held back). Input the
/// old focus has not taken is dropped (counted against it).
pub fn set_input_focus(dom: DomainId) {
    let c = &mut *CONSOLE.lock();
    let old = c.out.mux.focus();
    c.rx.discard(old);
    c.with_out(|out, port| out.set_focus(dom, port));
}

/// Domain `dom` is gone: its held output is printed and dropped.
pub fn forget(dom: DomainId) {
    let c = &mut *CONSOLE.lock();
    c.rx.forget(dom);
    c.with_out(|out, port| out.forget(dom, port));
}

/// Allocates the console's output ring whole, once the heap is there: a
/// burst of output later (a DomU booting) takes nothing more from it.
pub fn reserve() {
    if CONSOLE.lock().out.reserve().is_err() {
        log::warn!("console: no heap for the output ring up front");
    }
}

/// Reads the physical UART into the input ring (at most `max` bytes),
/// stopping after a key; returns the focus the bytes are for, the key, and
/// how many bytes were read.
pub fn receive(max: usize) -> (DomainId, Option<Key>, usize) {
    let c = &mut *CONSOLE.lock();
    let focus = c.out.mux.focus();
    let before = c.rx.bytes;
    let key = match &c.uart {
        Some(u) => c.rx.fill(&mut || u.getc(), focus, max),
        None => None,
    };
    (focus, key, (c.rx.bytes - before) as usize)
}

/// The transmit interrupt: a budget of the waiting output, and the interrupt
/// masked once nothing waits.
pub fn transmit() {
    let c = &mut *CONSOLE.lock();
    if let Some(u) = &mut c.uart {
        u.clear_tx_irq();
        c.out.transmit(u);
        u.set_tx_irq(c.out.pending());
    }
}

/// Writes every queued byte, waiting for the UART: before the machine stops.
pub fn flush() {
    let c = &mut *CONSOLE.lock();
    if let Some(u) = &mut c.uart {
        c.out.flush(u);
        u.set_tx_irq(false);
    }
}

/// Console counters: (input bytes read, input ring overruns, output bytes
/// dropped, output bytes written while waiting for the UART).
pub fn counters() -> (u64, u64, u64, u64) {
    let c = CONSOLE.lock();
    (c.rx.bytes, c.rx.overruns, c.out.tx.dropped, c.out.tx.waited)
}

/// Input typed for `dom` that it never took.
pub fn rx_dropped(dom: DomainId) -> u64 {
    CONSOLE.lock().rx.dropped(dom)
}

pub fn enable_rx_irq() {
    if let Some(u) = &mut CONSOLE.lock().uart {
        u.enable_rx_irq();
    }
}

/// The input ring as domain `dom`'s emulated UART takes it: nothing unless
/// `dom` has the focus (checked under the console lock, so a switch in
/// between cannot hand it another domain's input).
pub struct RingRx {
    pub dom: DomainId,
}

impl crate::vpl011::RxSource for RingRx {
    fn getc(&mut self) -> Option<u8> {
        let c = &mut *CONSOLE.lock();
        if c.out.mux.focus() != self.dom {
            return None;
        }
        c.rx.pop()
    }
    fn pending(&mut self) -> bool {
        let c = CONSOLE.lock();
        c.out.mux.focus() == self.dom && !c.rx.is_empty()
    }
}

/// Prints a whole line (or lines) from the hypervisor (`\n` as `\r\n`),
/// without allocating (it may run before the heap exists).
pub fn print_fmt(args: core::fmt::Arguments) {
    let c = &mut *CONSOLE.lock();
    let Console { uart: Some(u), out, .. } = c else { return };
    out.hv_begin(u);
    let _ = HvLine { out, port: u }.write_fmt(args);
    out.hv_end(u);
    u.set_tx_irq(out.pending());
}

/// The hypervisor's text into the console ([`ConsoleOut::hv_bytes`]), `\n`
/// as `\r\n`.
struct HvLine<'a> {
    out: &'a mut ConsoleOut,
    port: &'a mut Uart,
}

impl Write for HvLine<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        for part in s.split_inclusive('\n') {
            match part.strip_suffix('\n') {
                Some(l) => {
                    self.out.hv_bytes(l.as_bytes(), self.port);
                    self.out.hv_bytes(b"\r\n", self.port);
                }
                None => self.out.hv_bytes(part.as_bytes(), self.port),
            }
        }
        Ok(())
    }
}

/// A `fmt::Write` that prints each complete line with [`print_fmt`] (so
/// other pCPUs' output interleaves only between lines); a last line without
/// a newline is printed when it is dropped.
#[derive(Default)]
pub struct LineWriter {
    line: alloc::string::String,
}

impl core::fmt::Write for LineWriter {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        for part in s.split_inclusive('\n') {
            self.line.push_str(part);
            if self.line.ends_with('\n') {
                print_fmt(format_args!("{}", self.line));
                self.line.clear();
            }
        }
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        if !self.line.is_empty() {
            print_fmt(format_args!("{}\n", self.line));
        }
    }
}

#[macro_export]
macro_rules! hvprintln {
    ($($arg:tt)*) => { $crate::runtime::console::print_fmt(format_args!("{}\n", format_args!($($arg)*))) };
}

struct Logger;

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            print_fmt(format_args!("(HV) {:<5} {}\n", r.level(), r.args()));
        }
    }
    fn flush(&self) {}
}

static LOGGER: Logger = Logger;

pub fn init_log(level: log::LevelFilter) {
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
}
