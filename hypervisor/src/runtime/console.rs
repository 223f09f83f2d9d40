//! The hypervisor console: log output and every domain's emulated UART share
//! the physical PL011. A hypervisor log line always starts on a fresh line, so
//! it never splices into the middle of a guest line's bytes; Dom0's bytes pass
//! through unchanged, other domains' lines get a `(dN) ` prefix, and input
//! goes to one domain at a time, switched by Ctrl-A three times
//! (`crate::domain::console`, Xen's convention).

use crate::arch::pl011::Pl011;
use crate::domain::console::{ConsoleMux, Input, InputSwitch, Sink};
use crate::domain::DomainId;
use crate::sync::Mutex;
use core::fmt::Write;

struct Console {
    uart: Option<Pl011>,
    /// Who is mid-line, held DomU lines, the input focus.
    mux: ConsoleMux,
    switch: InputSwitch,
}

static CONSOLE: Mutex<Console> = Mutex::new(Console { uart: None, mux: ConsoleMux::new(), switch: InputSwitch::new() });

/// Guest bytes, as they are.
struct Raw<'a>(&'a Pl011);

impl Sink for Raw<'_> {
    fn put(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0.putc(b);
        }
    }
}

/// A sink for when there is no UART yet.
struct Nowhere;

impl Sink for Nowhere {
    fn put(&mut self, _: &[u8]) {}
}

struct Writer<'a>(&'a Pl011);

impl Write for Writer<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        for b in s.bytes() {
            if b == b'\n' {
                self.0.putc(b'\r');
            }
            self.0.putc(b);
        }
        Ok(())
    }
}

/// Uses the PL011 at `base` (identity-mapped) from now on.
///
/// # Safety
///
/// `base` must be the register frame of a PL011, mapped as device memory,
/// that nothing but this module drives.
pub unsafe fn init(base: usize) {
    // SAFETY: the caller's guarantee is `Pl011::new`'s contract.
    CONSOLE.lock().uart = Some(unsafe { Pl011::new(base) });
}

/// One byte from Dom0's emulated UART.
pub fn guest_putc(b: u8) {
    domain_putc(0, b);
}

/// One byte from domain `dom`'s emulated UART.
pub fn domain_putc(dom: DomainId, b: u8) {
    let c = &mut *CONSOLE.lock();
    match &c.uart {
        Some(u) => c.mux.putc(dom, b, &mut Raw(u)),
        None => c.mux.putc(dom, b, &mut Nowhere),
    }
}

/// The domain that gets console input.
pub fn input_focus() -> DomainId {
    CONSOLE.lock().mux.focus()
}

/// Gives console input to `dom` (and prints what it held back).
pub fn set_input_focus(dom: DomainId) {
    let c = &mut *CONSOLE.lock();
    match &c.uart {
        Some(u) => c.mux.set_focus(dom, &mut Raw(u)),
        None => c.mux.set_focus(dom, &mut Nowhere),
    }
}

/// Bytes waiting on the physical UART.
pub fn getc() -> Option<u8> {
    CONSOLE.lock().uart.as_ref().and_then(|u| u.getc())
}

pub fn enable_rx_irq() {
    if let Some(u) = &CONSOLE.lock().uart {
        u.enable_rx_irq();
    }
}

/// The physical UART's receive side, as the guest's emulated UART pumps it
/// (`VPl011::pump_rx`: flow control by masking the receive interrupt).
pub struct PhysRx;

/// [`PhysRx`] for the domain with the focus: the third Ctrl-A in a row
/// ends the pump (`switched`), the caller moves the focus and pumps on.
#[derive(Default)]
pub struct FocusRx {
    pub switched: bool,
}

impl crate::vpl011::RxSource for FocusRx {
    fn getc(&mut self) -> Option<u8> {
        if self.switched {
            return None;
        }
        let b = getc()?;
        match CONSOLE.lock().switch.feed(b) {
            Input::Byte(b) => Some(b),
            Input::Switch => {
                self.switched = true;
                None
            }
        }
    }
    fn set_rx_irq(&mut self, on: bool) {
        PhysRx.set_rx_irq(on);
    }
}

impl crate::vpl011::RxSource for PhysRx {
    fn getc(&mut self) -> Option<u8> {
        getc()
    }
    fn set_rx_irq(&mut self, on: bool) {
        if let Some(u) = &CONSOLE.lock().uart {
            u.set_rx_irq(on);
        }
    }
}

/// Prints a whole line (or lines) from the hypervisor.
pub fn print_fmt(args: core::fmt::Arguments) {
    let c = &mut *CONSOLE.lock();
    if let Some(u) = &c.uart {
        c.mux.break_line(&mut Raw(u));
        let _ = Writer(u).write_fmt(args);
        c.mux.after_hv_line(&mut Raw(u));
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
