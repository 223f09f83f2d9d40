//! The physical PL011 console: interrupt-driven receive; transmit polled,
//! with the transmit interrupt asked for while `runtime::console` has output
//! queued.

use core::ptr::{read_volatile, write_volatile};
use tock_registers::register_bitfields;

const DR: usize = 0x00;
const FR: usize = 0x18;
const IMSC: usize = 0x38;
const ICR: usize = 0x44;

register_bitfields! {u32,
    /// Flag register.
    UARTFR [
        /// Transmit FIFO full.
        TXFF OFFSET(5) NUMBITS(1) [],
        /// Receive FIFO empty.
        RXFE OFFSET(4) NUMBITS(1) []
    ],
    /// Interrupt mask set/clear (1 = enabled); ICR uses the same bits.
    UARTIMSC [
        /// Receive timeout.
        RTIM OFFSET(6) NUMBITS(1) [],
        /// Transmit.
        TXIM OFFSET(5) NUMBITS(1) [],
        /// Receive.
        RXIM OFFSET(4) NUMBITS(1) [],
        /// All eleven interrupt sources.
        ALL OFFSET(0) NUMBITS(11) []
    ]
}

pub struct Pl011 {
    base: usize,
    /// What IMSC holds (written only here).
    imsc: u32,
}

impl Pl011 {
    /// # Safety
    /// `base` must be the identity-mapped register frame of a PL011 that
    /// nothing else drives.
    pub const unsafe fn new(base: usize) -> Self {
        Self { base, imsc: 0 }
    }

    fn reg(&self, off: usize) -> *mut u32 {
        (self.base + off) as *mut u32
    }

    pub fn putc(&self, c: u8) {
        // SAFETY: FR and DR are 32-bit registers of the PL011 frame that
        // `new`'s caller vouched for (mapped as device memory, ours alone).
        unsafe {
            while UARTFR::TXFF.is_set(read_volatile(self.reg(FR))) {}
            write_volatile(self.reg(DR), c as u32);
        }
    }

    /// Hands `c` to the transmit FIFO unless it is full.
    pub fn try_putc(&self, c: u8) -> bool {
        // SAFETY: FR and DR of our PL011 frame (see `new`).
        unsafe {
            if UARTFR::TXFF.is_set(read_volatile(self.reg(FR))) {
                return false;
            }
            write_volatile(self.reg(DR), c as u32);
        }
        true
    }

    pub fn getc(&self) -> Option<u8> {
        // SAFETY: FR and DR of our PL011 frame (see `new`); reading DR pops
        // the receive FIFO, which only this driver uses.
        unsafe {
            if UARTFR::RXFE.is_set(read_volatile(self.reg(FR))) {
                None
            } else {
                Some(read_volatile(self.reg(DR)) as u8)
            }
        }
    }

    /// Enables the receive and receive-timeout interrupts.
    pub fn enable_rx_irq(&mut self) {
        // SAFETY: ICR of our PL011 frame (see `new`): interrupt clear, no
        // memory effects.
        unsafe {
            write_volatile(self.reg(ICR), UARTIMSC::ALL.val(0x7ff).value);
        }
        self.set_imsc(UARTIMSC::RXIM::SET.value | UARTIMSC::RTIM::SET.value, true);
    }

    /// Unmasks (`true`) or masks the transmit interrupt (raised while the
    /// transmit FIFO is at or below its trigger level).
    pub fn set_tx_irq(&mut self, on: bool) {
        self.set_imsc(UARTIMSC::TXIM::SET.value, on);
    }

    /// Clears a raised transmit interrupt (writing DR raises it again).
    pub fn clear_tx_irq(&mut self) {
        // SAFETY: ICR of our PL011 frame (see `new`).
        unsafe { write_volatile(self.reg(ICR), UARTIMSC::TXIM::SET.value) };
    }

    fn set_imsc(&mut self, bits: u32, on: bool) {
        let imsc = if on { self.imsc | bits } else { self.imsc & !bits };
        if imsc != self.imsc {
            self.imsc = imsc;
            // SAFETY: IMSC of our PL011 frame (see `new`): interrupt mask,
            // no memory effects.
            unsafe { write_volatile(self.reg(IMSC), imsc) };
        }
    }
}
