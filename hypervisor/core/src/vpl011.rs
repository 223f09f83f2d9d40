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
//!
//! # Break and Magic SysRq
//!
//! A FIFO entry is 12 bits as on the real part: the byte and its error
//! flags (DR bits 8..11); a received break is an entry with BE set and the
//! byte 0, as a line held low reads. [`VPl011::request_sysrq`] queues
//! break-then-key pairs, which is how a serial console asks Linux's Magic
//! SysRq (`CONFIG_MAGIC_SYSRQ_SERIAL`) for something: `hvctl shutdown`
//! sends `s`, `u`, `o` (sync, remount read-only, power off). Linux's
//! driver acts on only the last SysRq key of one interrupt (`amba-pl011.c`
//! keeps one `sysrq_ch` until the handler returns), so each pair enters
//! the FIFO alone: the first when the FIFO is empty, the next ones at a
//! read of RIS or MIS that found nothing pending under IMSC, which is the
//! driver's last read before its handler returns. The line is then
//! asserted again and the next pair is the next interrupt's. Nothing
//! enters before the driver has enabled its receive interrupts: it drains
//! the FIFO when the console opens, and the request would be lost (the
//! first handler call after that takes it; `hvctl shutdown -w` repeats
//! the request for a guest that has none).

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
pub const INT_BE: u32 = 1 << 9;

/// DR's break error flag (a FIFO entry's bit 10); bits 8..11 are RSR's
/// FE, PE, BE, OE.
pub const DR_BE: u16 = 1 << 10;
/// Most SysRq keys one request holds.
pub const SYSRQ_MAX: usize = 4;

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
    /// A SysRq request with no keys or more than [`SYSRQ_MAX`].
    #[error("a SysRq request holds 1 to 4 keys")]
    SysrqKeys,
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
    /// Received entries: the byte and its error flags (DR bits 0..11).
    rx: VecDeque<u16>,
    /// RSR/ECR: the error flags of the last entry read from DR.
    rsr: u32,
    /// SysRq keys still to send, each after a break (`sysrq[sysrq_at..]`).
    sysrq: [u8; SYSRQ_MAX],
    sysrq_len: usize,
    sysrq_at: usize,
    /// The driver read RIS or MIS and found nothing pending since the last
    /// SysRq pair entered the FIFO.
    handler_returned: bool,
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
            rsr: 0,
            sysrq: [0; SYSRQ_MAX],
            sysrq_len: 0,
            sysrq_at: 0,
            handler_returned: true,
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
        self.receive_entry(u16::from(byte))
    }

    fn receive_entry(&mut self, entry: u16) -> bool {
        if self.rx.len() >= RX_FIFO {
            self.rx_overruns += 1;
            return false;
        }
        self.rx.push_back(entry);
        self.ris |= INT_RX | INT_RT;
        if entry & DR_BE != 0 {
            self.ris |= INT_BE;
        }
        true
    }

    /// Queues Magic SysRq `keys`, each sent after a break (see the module's
    /// notes); a request still being sent is replaced. The first pair
    /// enters at once if the FIFO is empty and the driver's handler has
    /// returned since the last pair entered (it may still be in the one
    /// that took it); the caller then mirrors [`VPl011::irq_level`] as
    /// after any access.
    pub fn request_sysrq(&mut self, keys: &[u8]) -> Result<(), Pl011Error> {
        if keys.is_empty() || keys.len() > SYSRQ_MAX {
            return Err(Pl011Error::SysrqKeys);
        }
        // The same request again while it is being sent goes on from where
        // it is (a client repeating it must not keep restarting it).
        if self.sysrq_pending() == 0 || self.sysrq[..self.sysrq_len] != *keys {
            self.sysrq[..keys.len()].copy_from_slice(keys);
            self.sysrq_len = keys.len();
            self.sysrq_at = 0;
        }
        self.next_sysrq();
        Ok(())
    }

    /// SysRq keys not yet in the FIFO.
    pub fn sysrq_pending(&self) -> usize {
        self.sysrq_len - self.sysrq_at
    }

    /// Puts the next break and key in the FIFO, if any is left, the FIFO is
    /// empty, the driver takes receive interrupts (IMSC) and the handler
    /// that took the last pair has returned. Linux's driver drains the FIFO
    /// when the console is opened (`pl011_enable_interrupts`): a pair put
    /// there before would be lost.
    fn next_sysrq(&mut self) {
        let driver_reads = self.imsc & (INT_RX | INT_RT) != 0;
        if self.sysrq_at < self.sysrq_len && self.rx.is_empty() && self.handler_returned && driver_reads {
            self.handler_returned = false;
            self.receive_entry(DR_BE);
            self.receive_entry(u16::from(self.sysrq[self.sysrq_at]));
            self.sysrq_at += 1;
        }
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
                let e = self.rx.pop_front().unwrap_or(0) as u32;
                self.rsr = (e >> 8) & 0xf;
                if self.rx.is_empty() {
                    self.ris &= !(INT_RX | INT_RT);
                }
                e
            }
            RSR => self.rsr,
            FR => self.flags(),
            ILPR => self.ilpr,
            IBRD => self.ibrd,
            FBRD => self.fbrd,
            LCR_H => self.lcr_h,
            CR => self.cr,
            IFLS => self.ifls,
            IMSC => self.imsc,
            RIS | MIS => {
                let v = if word == RIS { self.ris } else { self.ris & self.imsc };
                // The driver's handler ends at a read that finds nothing
                // pending: the next SysRq pair is the next interrupt's.
                if self.ris & self.imsc == 0 {
                    self.handler_returned = true;
                    self.next_sysrq();
                }
                v
            }
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
            RSR => self.rsr = 0,
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

    /// Linux's `pl011_int` as far as SysRq goes: one handler call loops
    /// while `RIS & IMSC` is non-zero, a break arms SysRq for the next
    /// byte, and only the last SysRq key of the call is acted on when it
    /// returns. Returns the key acted on and the plain bytes read.
    fn linux_handler(u: &mut VPl011) -> (Option<u8>, Vec<u8>) {
        let (mut armed, mut key, mut plain) = (false, None, Vec::new());
        loop {
            let status = u.read(RIS, 4).unwrap() & u.read(IMSC, 4).unwrap();
            if status == 0 {
                return (key, plain);
            }
            u.write(ICR, 4, status & !(INT_TX | INT_RT | INT_RX), &mut |_| {}).unwrap();
            while u.read(FR, 2).unwrap() & FR_RXFE == 0 {
                let e = u.read(DR, 2).unwrap() as u16;
                if e & DR_BE != 0 {
                    armed = true;
                } else if core::mem::take(&mut armed) {
                    key = Some(e as u8);
                } else {
                    plain.push(e as u8);
                }
            }
        }
    }

    #[test]
    fn sysrq_pairs_reach_linux_one_interrupt_each() {
        let mut u = VPl011::new();
        u.write(IMSC, 4, INT_RX | INT_RT, &mut |_| {}).unwrap();
        // Typed input still in the FIFO: the first pair waits behind it.
        u.receive(b'a');
        u.request_sysrq(b"suo").unwrap();
        assert_eq!(u.sysrq_pending(), 3);
        let mut keys = Vec::new();
        let mut plain = Vec::new();
        for _ in 0..10 {
            if !u.irq_level() {
                break;
            }
            let (k, p) = linux_handler(&mut u);
            keys.extend(k);
            plain.extend(p);
        }
        assert_eq!(keys, b"suo", "each key acted on, in order");
        assert_eq!(plain, b"a");
        assert_eq!(u.sysrq_pending(), 0);
        assert!(!u.irq_level());
        // The break reads as an error entry, with RSR saying so.
        u.request_sysrq(b"o").unwrap();
        assert_eq!(u.read(DR, 4).unwrap(), DR_BE as u32);
        assert_eq!(u.read(RSR, 4).unwrap(), 0x4);
        assert_ne!(u.read(RIS, 4).unwrap() & INT_BE, 0);
        assert_eq!(u.read(DR, 4).unwrap(), b'o' as u32);
        assert_eq!(u.read(RSR, 4).unwrap(), 0);
        assert_eq!(u.request_sysrq(b""), Err(Pl011Error::SysrqKeys));
        assert_eq!(u.request_sysrq(b"sssss"), Err(Pl011Error::SysrqKeys));
    }

    #[test]
    fn a_request_before_the_driver_starts_waits_for_it() {
        let mut u = VPl011::new();
        u.request_sysrq(b"so").unwrap();
        assert_ne!(u.read(FR, 2).unwrap() & FR_RXFE, 0, "nothing for the startup drain to lose");
        u.write(IMSC, 4, INT_RX | INT_RT, &mut |_| {}).unwrap();
        // Repeated meanwhile: it goes on, it does not start again.
        u.request_sysrq(b"so").unwrap();
        assert_eq!(linux_handler(&mut u), (Some(b's'), Vec::new()));
        assert_eq!(linux_handler(&mut u), (Some(b'o'), Vec::new()));
        assert_eq!(u.sysrq_pending(), 0);
        assert!(!u.irq_level());
    }

    #[test]
    fn a_second_request_waits_for_the_handler_of_the_first() {
        let mut u = VPl011::new();
        u.write(IMSC, 4, INT_RX | INT_RT, &mut |_| {}).unwrap();
        u.request_sysrq(b"s").unwrap();
        // The driver takes the pair but has not returned yet.
        assert_eq!(u.read(DR, 2).unwrap(), DR_BE as u32);
        assert_eq!(u.read(DR, 2).unwrap(), b's' as u32);
        u.request_sysrq(b"o").unwrap();
        assert_ne!(u.read(FR, 2).unwrap() & FR_RXFE, 0, "not in the same handler call");
        // Its last RIS read: the next pair is the next interrupt's.
        assert_eq!(u.read(RIS, 4).unwrap() & (INT_RX | INT_RT), 0);
        assert!(u.irq_level());
        assert_eq!(linux_handler(&mut u), (Some(b'o'), Vec::new()));
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
