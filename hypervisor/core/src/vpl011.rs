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
//! # Receive side
//!
//! The hypervisor reads the physical UART into its own input ring
//! (`domain::console::InputRing`) whatever the guest does, so a guest that
//! never reads (or masks its receive interrupt) cannot hold the physical UART
//! and the keys the hypervisor listens for. [`VPl011::pump_rx`] moves bytes
//! from that ring into the 64-byte receive FIFO while it has room; when it is
//! full the rest waits in the ring (counted in `rx_holds`) and the caller
//! pumps again after the guest's next read (see [`VPl011::rx_held`]). The ring
//! is bounded: a guest that stops reading loses the input beyond it, counted
//! by the ring, not the other domains' input.

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
#[derive(thiserror::Error, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pl011Error {
    /// Only 8, 16 and 32-bit accesses are defined.
    #[error("PL011 access size not 8, 16 or 32 bits")]
    BadAccessSize,
    /// Outside the 4 KiB frame.
    #[error("outside the PL011 frame")]
    OutOfRange,
}

/// Input for this UART, as [`VPl011::pump_rx`] takes it.
pub trait RxSource {
    /// The next byte for this UART, if any is waiting.
    fn getc(&mut self) -> Option<u8>;
    /// More bytes are waiting for this UART.
    fn pending(&mut self) -> bool;
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
    /// Times the FIFO filled up and input waited in the hypervisor's ring.
    pub rx_holds: u64,
    /// The FIFO is full and input waits in the hypervisor's ring.
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
    /// or `src` is empty; returns how many bytes. Call it when input arrives
    /// and after a guest read while [`VPl011::rx_held`].
    pub fn pump_rx(&mut self, src: &mut dyn RxSource) -> usize {
        let mut n = 0;
        while self.rx_space() > 0 {
            let Some(b) = src.getc() else { break };
            self.receive(b);
            self.rx_bytes += 1;
            n += 1;
        }
        let held = self.rx_space() == 0 && src.pending();
        if held && !self.rx_held {
            self.rx_holds += 1;
        }
        self.rx_held = held;
        n
    }

    /// Input waits in the hypervisor's ring until the guest makes room.
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

    impl RxSource for VecDeque<u8> {
        fn getc(&mut self) -> Option<u8> {
            self.pop_front()
        }
        fn pending(&mut self) -> bool {
            !self.is_empty()
        }
    }

    #[test]
    fn input_beyond_the_fifo_waits_for_guest_reads_in_order() {
        let flood: Vec<u8> = (0..10_000).map(|i| b'a' + (i % 26) as u8).collect();
        let mut src: VecDeque<u8> = flood.iter().copied().collect();
        let mut u = VPl011::new();
        u.write(IMSC, 4, INT_RX | INT_RT, &mut |_| {}).unwrap();
        assert_eq!(u.pump_rx(&mut src), RX_FIFO);
        assert!(u.rx_held() && u.irq_level());
        assert_eq!((u.rx_holds, u.rx_overruns), (1, 0));
        // The guest reads everything, the caller pumping after each read
        // while held: every byte arrives, in order, none dropped.
        let mut got = Vec::new();
        while u.read(FR, 4).unwrap() & FR_RXFE == 0 {
            got.push(u.read(DR, 4).unwrap() as u8);
            if u.rx_held() {
                u.pump_rx(&mut src);
            }
        }
        assert_eq!(got, flood);
        assert_eq!((u.rx_bytes, u.rx_overruns), (10_000, 0));
        assert!(!u.rx_held() && !u.irq_level());
        // Exactly a FIFO's worth with nothing behind it is not a hold.
        let mut src: VecDeque<u8> = core::iter::repeat_n(b'x', RX_FIFO).collect();
        u.pump_rx(&mut src);
        assert!(!u.rx_held());
        assert_eq!(u.rx_holds, 1);
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
