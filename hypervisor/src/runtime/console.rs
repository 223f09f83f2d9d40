//! The hypervisor console: log output and the guest's emulated UART share the
//! physical PL011. A hypervisor log line always starts on a fresh line, so it
//! never splices into the middle of a guest line's bytes; guest bytes pass
//! through unchanged.

use crate::arch::pl011::Pl011;
use core::fmt::Write;
use spin::Mutex;

struct Console {
    uart: Option<Pl011>,
    /// The last byte the guest wrote was not a newline.
    guest_mid_line: bool,
}

static CONSOLE: Mutex<Console> = Mutex::new(Console { uart: None, guest_mid_line: false });

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

/// One byte from the guest's emulated UART.
pub fn guest_putc(b: u8) {
    let mut c = CONSOLE.lock();
    if let Some(u) = &c.uart {
        u.putc(b);
    }
    c.guest_mid_line = b != b'\n';
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
    let mut c = CONSOLE.lock();
    let mid = c.guest_mid_line;
    if let Some(u) = &c.uart {
        let mut w = Writer(u);
        if mid {
            let _ = w.write_str("\n");
        }
        let _ = w.write_fmt(args);
    }
    c.guest_mid_line = false;
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
