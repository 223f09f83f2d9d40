//! A device frame at a fixed address (identity-mapped as device memory).
//! Every access is one plain `ldr`/`str` with a base register and no
//! writeback, as Linux's readl/writel are: a hypervisor emulating the frame
//! gets a full syndrome (ESR_EL2.ISV = 1) for each, which it cannot for the
//! pair and writeback forms a compiler may pick for volatile pointer
//! accesses.

use core::arch::asm;

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
        let v: u32;
        // SAFETY: a register of the frame `new` was given (its contract).
        unsafe { asm!("ldr {v:w}, [{a}]", a = in(reg) self.0 + off, v = out(reg) v, options(nostack)) };
        v
    }

    pub fn write32(self, off: usize, v: u32) {
        // SAFETY: as read32.
        unsafe { asm!("str {v:w}, [{a}]", a = in(reg) self.0 + off, v = in(reg) v, options(nostack)) };
    }

    pub fn read64(self, off: usize) -> u64 {
        let v: u64;
        // SAFETY: as read32.
        unsafe { asm!("ldr {v}, [{a}]", a = in(reg) self.0 + off, v = out(reg) v, options(nostack)) };
        v
    }

    pub fn write64(self, off: usize, v: u64) {
        // SAFETY: as read32.
        unsafe { asm!("str {v}, [{a}]", a = in(reg) self.0 + off, v = in(reg) v, options(nostack)) };
    }
}
