//! A device frame at a fixed address (identity-mapped as device memory).

use core::ptr::{read_volatile, write_volatile};

#[derive(Clone, Copy)]
pub struct Mmio(usize);

impl Mmio {
    /// # Safety
    /// `base` is a device frame the DT (or the platform) gives this guest,
    /// mapped as device memory, and every offset used below it is one of
    /// its registers.
    pub const unsafe fn new(base: usize) -> Self {
        Mmio(base)
    }

    pub fn base(self) -> usize {
        self.0
    }

    /// The frame `off` bytes further (a redistributor's SGI frame).
    pub fn at(self, off: usize) -> Mmio {
        Mmio(self.0 + off)
    }

    pub fn read32(self, off: usize) -> u32 {
        // SAFETY: a register of the frame `new` was given (its contract).
        unsafe { read_volatile((self.0 + off) as *const u32) }
    }

    pub fn write32(self, off: usize, v: u32) {
        // SAFETY: as read32.
        unsafe { write_volatile((self.0 + off) as *mut u32, v) }
    }

    pub fn read64(self, off: usize) -> u64 {
        // SAFETY: as read32.
        unsafe { read_volatile((self.0 + off) as *const u64) }
    }

    pub fn write64(self, off: usize, v: u64) {
        // SAFETY: as read32.
        unsafe { write_volatile((self.0 + off) as *mut u64, v) }
    }
}
