//! The physical PL011 console: polled transmit, interrupt-driven receive.

use core::ptr::{read_volatile, write_volatile};

const DR: usize = 0x00;
const FR: usize = 0x18;
const IMSC: usize = 0x38;
const ICR: usize = 0x44;
const FR_TXFF: u32 = 1 << 5;
const FR_RXFE: u32 = 1 << 4;

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
        // SAFETY: the frame is valid by construction (see `new`).
        unsafe {
            while read_volatile(self.reg(FR)) & FR_TXFF != 0 {}
            write_volatile(self.reg(DR), c as u32);
        }
    }

    pub fn getc(&self) -> Option<u8> {
        // SAFETY: as above.
        unsafe {
            if read_volatile(self.reg(FR)) & FR_RXFE != 0 {
                None
            } else {
                Some(read_volatile(self.reg(DR)) as u8)
            }
        }
    }

    /// Enables the receive and receive-timeout interrupts.
    pub fn enable_rx_irq(&self) {
        // SAFETY: as above.
        unsafe {
            write_volatile(self.reg(ICR), 0x7ff);
        }
        self.set_rx_irq(true);
    }

    /// Unmasks (`true`) or masks the receive and receive-timeout interrupts
    /// (the only ones used: transmit is polled).
    pub fn set_rx_irq(&self, on: bool) {
        // SAFETY: as above.
        unsafe { write_volatile(self.reg(IMSC), if on { (1 << 4) | (1 << 6) } else { 0 }) };
    }
}
