//! The physical PL011 console: polled transmit, interrupt-driven receive.

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
        /// Receive.
        RXIM OFFSET(4) NUMBITS(1) [],
        /// All eleven interrupt sources.
        ALL OFFSET(0) NUMBITS(11) []
    ]
}

pub struct Pl011 {
    base: usize,
}

impl Pl011 {
    /// # Safety
    /// `base` must be the identity-mapped register frame of a PL011 that
    /// nothing else drives.
    pub const unsafe fn new(base: usize) -> Self {
        Self { base }
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
    pub fn enable_rx_irq(&self) {
        // SAFETY: ICR and IMSC of our PL011 frame (see `new`): interrupt
        // clear and mask, no memory effects.
        unsafe {
            write_volatile(self.reg(ICR), UARTIMSC::ALL.val(0x7ff).value);
        }
        self.set_rx_irq(true);
    }

    /// Unmasks (`true`) or masks the receive and receive-timeout interrupts
    /// (the only ones used: transmit is polled).
    pub fn set_rx_irq(&self, on: bool) {
        let imsc = if on { (UARTIMSC::RXIM::SET + UARTIMSC::RTIM::SET).value } else { 0 };
        // SAFETY: as above.
        unsafe { write_volatile(self.reg(IMSC), imsc) };
    }
}
