//! Emulated PL011 UART for a guest (Arm PrimeCell UART, DDI 0183).
//!
//! The hypervisor owns the physical UART; the guest's console is this model.
//! Transmitted bytes go straight to the sink the caller passes (the physical
//! console), received bytes come from the hypervisor's RX interrupt. The
//! model keeps the interrupt line level (`irq_level`) that the caller mirrors
//! into the vGIC. Like QEMU's model, transmission completes at once, so the
//! TX interrupt is raised after every write to DR; Linux's amba-pl011 driver
//! is written for that behaviour.
//!
//! # Receive flow control
//!
//! [`VPl011::pump_rx`] moves input from the physical UART into the 64-byte
//! receive FIFO. When the FIFO is full it masks the physical receive
//! interrupt instead of reading on: the input waits in the physical UART
//! (and, under QEMU, in its character backend, which stops reading stdin),
//! and the physical line, which is level-sensitive, goes quiet. Reading
//! on and dropping would be the other choice (a real PL011 overruns and sets
//! OE), but then the hypervisor works at the rate the input arrives, not
//! the rate the guest reads: an endless flood would keep pCPU0 busy in the
//! interrupt handler, and a paste into a busy guest's console would lose
//! bytes. With flow control the work per byte is paced by the guest and
//! nothing is lost while it keeps reading. As soon as a guest read leaves
//! room, the caller pumps again (see [`VPl011::rx_held`]); once the
//! physical UART is empty its interrupt is unmasked. The byte the caller
//! intercepts (the statistics key) is taken whenever input is read, so it
//! works as long as the guest reads its console or has room for it.

use alloc::collections::VecDeque;

const DR: u64 = 0x000;
const RSR: u64 = 0x004;
const FR: u64 = 0x018;
const ILPR: u64 = 0x020;
const IBRD: u64 = 0x024;
const FBRD: u64 = 0x028;
const LCR_H: u64 = 0x02c;
const CR: u64 = 0x030;
const IFLS: u64 = 0x034;
const IMSC: u64 = 0x038;
const RIS: u64 = 0x03c;
const MIS: u64 = 0x040;
const ICR: u64 = 0x044;
const DMACR: u64 = 0x048;

const FR_RXFE: u32 = 1 << 4;
const FR_TXFF: u32 = 1 << 5;
const FR_RXFF: u32 = 1 << 6;
const FR_TXFE: u32 = 1 << 7;

pub const INT_RX: u32 = 1 << 4;
pub const INT_TX: u32 = 1 << 5;
pub const INT_RT: u32 = 1 << 6;

/// Size of the register frame.
pub const FRAME_SIZE: u64 = 0x1000;
/// Bytes the model buffers before dropping input.
pub const RX_FIFO: usize = 64;

/// PrimeCell peripheral and cell ID bytes at 0xfe0..0xfff (PL011 r1p5).
const ID_BYTES: [u8; 8] = [0x11, 0x10, 0x14, 0x00, 0x0d, 0xf0, 0x05, 0xb1];

/// A bad guest access to the UART frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pl011Error {
    /// Only 8, 16 and 32-bit accesses are defined.
    BadAccessSize,
    /// Outside the 4 KiB frame.
    OutOfRange,
}

/// The physical receive side, as [`VPl011::pump_rx`] drives it.
pub trait RxSource {
    /// The next received byte, if any is waiting.
    fn getc(&mut self) -> Option<u8>;
    /// Unmasks (`true`) or masks the receive interrupts.
    fn set_rx_irq(&mut self, on: bool);
}

/// The emulated UART's state.
pub struct VPl011 {
    rx: VecDeque<u8>,
    ibrd: u32,
    fbrd: u32,
    lcr_h: u32,
    cr: u32,
    ifls: u32,
    imsc: u32,
    ris: u32,
    dmacr: u32,
    ilpr: u32,
    /// Bytes dropped because the RX FIFO was full.
    pub rx_overruns: u64,
    /// Bytes [`VPl011::pump_rx`] put in the receive FIFO.
    pub rx_bytes: u64,
    /// Times the FIFO filled up and input was held back (physical receive
    /// interrupt masked).
    pub rx_holds: u64,
    /// The physical receive interrupt is masked by flow control.
    rx_held: bool,
}

impl Default for VPl011 {
    fn default() -> Self {
        Self::new()
    }
}

impl VPl011 {
    pub fn new() -> Self {
        Self {
            rx: VecDeque::with_capacity(RX_FIFO),
            ibrd: 0,
            fbrd: 0,
            lcr_h: 0,
            cr: 0x300,
            ifls: 0x12,
            imsc: 0,
            ris: 0,
            dmacr: 0,
            ilpr: 0,
            rx_overruns: 0,
            rx_bytes: 0,
            rx_holds: 0,
            rx_held: false,
        }
    }

    /// The level of the UART's combined interrupt line.
    pub fn irq_level(&self) -> bool {
        self.ris & self.imsc != 0
    }

    /// Queues a received byte; returns false when it had to be dropped.
    pub fn receive(&mut self, byte: u8) -> bool {
        if self.rx.len() >= RX_FIFO {
            self.rx_overruns += 1;
            return false;
        }
        self.rx.push_back(byte);
        self.ris |= INT_RX | INT_RT;
        true
    }

    /// Room left in the receive FIFO.
    pub fn rx_space(&self) -> usize {
        RX_FIFO - self.rx.len()
    }

    /// Moves waiting input from `src` into the receive FIFO until it is full
    /// or `src` is empty, and masks `src`'s receive interrupt while the FIFO
    /// is full (flow control, see the module doc). Bytes equal to
    /// `intercept` are not queued; returns how many there were. Call it
    /// from the physical receive interrupt, and after a guest read while
    /// [`VPl011::rx_held`].
    pub fn pump_rx(&mut self, src: &mut dyn RxSource, intercept: u8) -> usize {
        let mut intercepted = 0;
        while self.rx_space() > 0 {
            match src.getc() {
                Some(b) if b == intercept => intercepted += 1,
                Some(b) => {
                    self.receive(b);
                    self.rx_bytes += 1;
                }
                None => break,
            }
        }
        let full = self.rx_space() == 0;
        if full != self.rx_held {
            src.set_rx_irq(!full);
            self.rx_held = full;
            if full {
                self.rx_holds += 1;
            }
        }
        intercepted
    }

    /// Input is held back in the physical UART until the guest makes room.
    pub fn rx_held(&self) -> bool {
        self.rx_held
    }

    fn flags(&self) -> u32 {
        let mut fr = FR_TXFE;
        if self.rx.is_empty() {
            fr |= FR_RXFE;
        }
        if self.rx.len() >= RX_FIFO {
            fr |= FR_RXFF;
        }
        let _ = FR_TXFF;
        fr
    }

    /// A guest read of `size` bytes at `offset` into the frame.
    pub fn read(&mut self, offset: u64, size: u8) -> Result<u32, Pl011Error> {
        check(offset, size)?;
        let word = offset & !3;
        let v = match word {
            DR => {
                let b = self.rx.pop_front().unwrap_or(0) as u32;
                if self.rx.is_empty() {
                    self.ris &= !(INT_RX | INT_RT);
                }
                b
            }
            RSR => 0,
            FR => self.flags(),
            ILPR => self.ilpr,
            IBRD => self.ibrd,
            FBRD => self.fbrd,
            LCR_H => self.lcr_h,
            CR => self.cr,
            IFLS => self.ifls,
            IMSC => self.imsc,
            RIS => self.ris,
            MIS => self.ris & self.imsc,
            ICR => 0,
            DMACR => self.dmacr,
            0xfe0..=0xffc => ID_BYTES[((word - 0xfe0) / 4) as usize] as u32,
            _ => 0,
        };
        Ok(v >> ((offset & 3) * 8))
    }

    /// A guest write; transmitted bytes are handed to `tx`.
    pub fn write(&mut self, offset: u64, size: u8, value: u32, tx: &mut dyn FnMut(u8)) -> Result<(), Pl011Error> {
        check(offset, size)?;
        let value = value << ((offset & 3) * 8);
        match offset & !3 {
            DR => {
                tx(value as u8);
                self.ris |= INT_TX;
            }
            RSR => {}
            ILPR => self.ilpr = value & 0xff,
            IBRD => self.ibrd = value & 0xffff,
            FBRD => self.fbrd = value & 0x3f,
            LCR_H => self.lcr_h = value & 0xff,
            CR => self.cr = value & 0xff87,
            IFLS => self.ifls = value & 0x3f,
            IMSC => self.imsc = value & 0x7ff,
            ICR => {
                self.ris &= !(value & 0x7ff);
                // Data still waiting keeps the receive interrupt asserted.
                if !self.rx.is_empty() {
                    self.ris |= INT_RX | INT_RT;
                }
            }
            DMACR => self.dmacr = value & 0x7,
            _ => {}
        }
        Ok(())
    }
}

fn check(offset: u64, size: u8) -> Result<(), Pl011Error> {
    if offset >= FRAME_SIZE {
        return Err(Pl011Error::OutOfRange);
    }
    match size {
        1 => Ok(()),
        2 if offset.is_multiple_of(2) => Ok(()),
        4 if offset.is_multiple_of(4) => Ok(()),
        _ => Err(Pl011Error::BadAccessSize),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transmit_raises_tx_interrupt() {
        let mut u = VPl011::new();
        let mut out = Vec::new();
        u.write(IMSC, 4, INT_TX, &mut |b| out.push(b)).unwrap();
        assert!(!u.irq_level());
        u.write(DR, 4, b'A' as u32, &mut |b| out.push(b)).unwrap();
        assert_eq!(out, b"A");
        assert!(u.irq_level());
        u.write(ICR, 4, INT_TX, &mut |_| {}).unwrap();
        assert!(!u.irq_level());
    }

    #[test]
    fn receive_fifo_and_flags() {
        let mut u = VPl011::new();
        assert_eq!(u.read(FR, 4).unwrap() & FR_RXFE, FR_RXFE);
        u.write(IMSC, 4, INT_RX | INT_RT, &mut |_| {}).unwrap();
        assert!(u.receive(b'x'));
        assert!(u.irq_level());
        assert_eq!(u.read(FR, 4).unwrap() & FR_RXFE, 0);
        assert_eq!(u.read(DR, 4).unwrap(), b'x' as u32);
        assert!(!u.irq_level());
        for i in 0..RX_FIFO {
            assert!(u.receive(i as u8));
        }
        assert!(!u.receive(0));
        assert_eq!(u.rx_overruns, 1);
        assert_ne!(u.read(FR, 4).unwrap() & FR_RXFF, 0);
        // Clearing the interrupt while data waits keeps it asserted.
        u.write(ICR, 4, 0x7ff, &mut |_| {}).unwrap();
        assert!(u.irq_level());
    }

    /// A physical UART whose receive line is level-sensitive: asserted while
    /// a byte waits and the interrupt is unmasked.
    struct FakeRx {
        waiting: VecDeque<u8>,
        irq_on: bool,
        mask_writes: usize,
    }

    impl FakeRx {
        fn with(bytes: &[u8]) -> Self {
            FakeRx { waiting: bytes.iter().copied().collect(), irq_on: true, mask_writes: 0 }
        }
        fn line(&self) -> bool {
            self.irq_on && !self.waiting.is_empty()
        }
    }

    impl RxSource for FakeRx {
        fn getc(&mut self) -> Option<u8> {
            self.waiting.pop_front()
        }
        fn set_rx_irq(&mut self, on: bool) {
            self.irq_on = on;
            self.mask_writes += 1;
        }
    }

    /// What the EL2 interrupt handler does: take the interrupt while its line
    /// is asserted. Returns how many times it ran, or None if it never ends.
    fn irq_storm(u: &mut VPl011, src: &mut FakeRx) -> Option<usize> {
        let mut n = 0;
        while src.line() {
            u.pump_rx(src, STATS);
            n += 1;
            if n > 1000 {
                return None;
            }
        }
        Some(n)
    }

    const STATS: u8 = 0x1c;

    #[test]
    fn a_flood_masks_the_physical_interrupt_instead_of_livelocking() {
        let flood: Vec<u8> = (0..10_000).map(|i| b'a' + (i % 26) as u8).collect();
        let mut src = FakeRx::with(&flood);
        let mut u = VPl011::new();
        u.write(IMSC, 4, INT_RX | INT_RT, &mut |_| {}).unwrap();
        // The guest does not read yet: one interrupt fills the FIFO, then the
        // physical line goes quiet.
        assert_eq!(irq_storm(&mut u, &mut src), Some(1));
        assert!(u.rx_held() && !src.irq_on);
        assert_eq!(u.rx_space(), 0);
        assert_eq!((u.rx_holds, u.rx_overruns), (1, 0));
        // The guest reads everything, the caller pumping after each read
        // while held: every byte arrives, in order, none dropped.
        let mut got = Vec::new();
        while u.read(FR, 4).unwrap() & FR_RXFE == 0 {
            got.push(u.read(DR, 4).unwrap() as u8);
            if u.rx_held() {
                u.pump_rx(&mut src, STATS);
            }
        }
        assert_eq!(got, flood);
        assert_eq!(u.rx_bytes, 10_000);
        assert_eq!(u.rx_overruns, 0);
        // Drained: the physical interrupt is on again; the hold was one
        // mask and one unmask, not one per byte.
        assert!(!u.rx_held() && src.irq_on);
        assert_eq!(src.mask_writes, 2);
        assert!(!u.irq_level());
    }

    #[test]
    fn the_stats_key_is_taken_out_of_the_input() {
        let mut src = FakeRx::with(&[b'a', STATS, b'b', STATS]);
        let mut u = VPl011::new();
        assert_eq!(u.pump_rx(&mut src, STATS), 2);
        assert_eq!(u.read(DR, 4).unwrap(), b'a' as u32);
        assert_eq!(u.read(DR, 4).unwrap(), b'b' as u32);
        assert!(!u.rx_held());
        // Behind a full FIFO the key waits for room, like the bytes before it.
        let mut bytes = vec![b'x'; RX_FIFO];
        bytes.push(STATS);
        let mut src = FakeRx::with(&bytes);
        assert_eq!(u.pump_rx(&mut src, STATS), 0);
        assert!(u.rx_held());
        u.read(DR, 4).unwrap();
        assert_eq!(u.pump_rx(&mut src, STATS), 1);
        assert!(!u.rx_held() && src.irq_on);
    }

    #[test]
    fn primecell_ids() {
        let mut u = VPl011::new();
        let id: Vec<u32> = (0..8).map(|i| u.read(0xfe0 + i * 4, 4).unwrap()).collect();
        assert_eq!(id, [0x11, 0x10, 0x14, 0x00, 0x0d, 0xf0, 0x05, 0xb1]);
    }

    #[test]
    fn bad_accesses() {
        let mut u = VPl011::new();
        assert_eq!(u.read(0, 8), Err(Pl011Error::BadAccessSize));
        assert_eq!(u.read(2, 4), Err(Pl011Error::BadAccessSize));
        assert_eq!(u.read(0x1000, 4), Err(Pl011Error::OutOfRange));
        assert_eq!(u.read(0x800, 4), Ok(0));
        u.write(0x900, 4, 0xffff_ffff, &mut |_| panic!()).unwrap();
        assert_eq!(u.read(CR + 1, 1).unwrap(), 0x03);
    }
}
