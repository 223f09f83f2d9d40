//! Fuzz the virtio-blk device model: the input bytes become guest RAM (rings,
//! descriptors, headers), a queue configuration, and a script of driver and
//! backend actions (descriptor and avail-ring writes, notifies, register
//! writes of any size, completions, time). The device must never panic, must
//! keep at most `queue size` live requests in flight and stay within its
//! request and byte budget counting requests orphaned by resets, must account
//! every request it submitted, and must report every change of its interrupt
//! line.
//!
//! Guest RAM starts at address 0 so that small fuzzer-made numbers are valid
//! addresses; everything outside 16 KiB is "outside guest RAM".
//!
//! Run: `cargo +nightly fuzz run virtqueue -- -max_total_time=600`
#![no_main]

use hypervisor::virtio::mmio::*;
use hypervisor::virtio::buf::DataBuf;
use hypervisor::virtio::{status, BlkConfig, Completion, GuestMemory, RamBackend, VecMemory, VirtioBlk};
use libfuzzer_sys::fuzz_target;

const RAM_SIZE: usize = 16 * 1024;
const DESC: u64 = 0;
const AVAIL: u64 = 0x200;
const USED: u64 = 0x300;
const DISK_SECTORS: u64 = 64;

struct Input<'a>(&'a [u8]);
impl Input<'_> {
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }
    fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | (u16::from(self.u8()) << 8)
    }
    fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
}

struct Rig {
    dev: VirtioBlk,
    mem: VecMemory,
    be: RamBackend,
    now: u64,
    irq: bool,
    qmax: usize,
}

impl Rig {
    fn apply(&mut self, mut fx: hypervisor::virtio::Effects) {
        loop {
            if fx.irq_level_changed {
                self.irq = self.dev.irq_level();
            }
            assert_eq!(self.irq, self.dev.irq_level(), "unreported irq change");
            let cfg = self.dev.config();
            assert!(self.dev.in_flight() - self.dev.orphans() <= self.qmax);
            assert!(self.dev.in_flight() <= cfg.max_in_flight_requests);
            assert!(self.dev.in_flight_bytes() <= cfg.max_in_flight_bytes.max(u64::from(cfg.max_request_bytes)));
            match fx.notify {
                Some(q) => fx = self.dev.process_queue(q, &mut self.mem, &mut self.be, self.now),
                None => break,
            }
        }
    }
    fn wr(&mut self, off: u64, size: u8, v: u64) {
        if let Ok(fx) = self.dev.mmio_write(off, size, v, &self.mem) {
            self.apply(fx);
        }
    }
    fn poll(&mut self) {
        for c in self.be.poll(self.now) {
            let fx = self.dev.complete(&mut self.mem, c);
            self.apply(fx);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let qsize = 1u16 << (inp.u8() % 5);
    let latency = u64::from(inp.u8() % 4) * 100;
    let flags = inp.u8();
    let read_only = flags & 1 == 1;
    let accept = u64::from(inp.u32()) | (1 << 32);

    let mut cfg = BlkConfig::new(DISK_SECTORS, read_only);
    cfg.queue_size_max = 16;
    cfg.max_request_bytes = 8 * 1024;
    let mut rig = Rig {
        dev: VirtioBlk::new(cfg),
        mem: VecMemory::new(0, RAM_SIZE),
        be: RamBackend::new(vec![0u8; (DISK_SECTORS * 512) as usize], read_only, latency),
        now: 0,
        irq: false,
        qmax: 16,
    };
    if flags & 2 != 0 {
        rig.be.max_in_flight = 2;
    }
    // Descriptor table and avail ring straight from the input.
    let init = inp.bytes(0x240).to_vec();
    rig.mem.bytes[..init.len()].copy_from_slice(&init);

    // The Linux-like handshake.
    for (off, v) in [
        (STATUS, 0),
        (STATUS, status::ACKNOWLEDGE),
        (STATUS, status::ACKNOWLEDGE | status::DRIVER),
        (DRIVER_FEATURES_SEL, 0),
        (DRIVER_FEATURES, accept as u32),
        (DRIVER_FEATURES_SEL, 1),
        (DRIVER_FEATURES, (accept >> 32) as u32),
        (STATUS, status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK),
        (QUEUE_SEL, 0),
        (QUEUE_NUM, u32::from(qsize)),
        (QUEUE_DESC_LOW, DESC as u32),
        (QUEUE_DRIVER_LOW, AVAIL as u32),
        (QUEUE_DEVICE_LOW, USED as u32),
        (QUEUE_READY, 1),
        (STATUS, status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK),
    ] {
        rig.wr(off, 4, u64::from(v));
    }

    while !inp.0.is_empty() {
        match inp.u8() % 10 {
            0 | 1 => rig.wr(QUEUE_NOTIFY, 4, u64::from(inp.u8() % 2)),
            2 => {
                // A descriptor, in the table or anywhere in RAM.
                let at = u64::from(inp.u16()) % RAM_SIZE as u64;
                let addr = if inp.u8() & 1 == 0 { u64::from(inp.u16()) } else { inp.u64() };
                let len = if inp.u8() & 1 == 0 { u32::from(inp.u16()) } else { inp.u32() };
                let fl = u16::from(inp.u8() % 8);
                let next = u16::from(inp.u8());
                let mut d = [0u8; 16];
                d[..8].copy_from_slice(&addr.to_le_bytes());
                d[8..12].copy_from_slice(&len.to_le_bytes());
                d[12..14].copy_from_slice(&fl.to_le_bytes());
                d[14..].copy_from_slice(&next.to_le_bytes());
                let _ = rig.mem.write(at & !15, &d);
            }
            3 => {
                // Offer a head: avail.ring[idx % size] = head; idx += 1.
                let head = u16::from(inp.u8());
                let mut idx = [0u8; 2];
                let _ = rig.mem.read(AVAIL + 2, &mut idx);
                let idx = u16::from_le_bytes(idx);
                let _ = rig.mem.write(AVAIL + 4 + 2 * u64::from(idx % qsize), &head.to_le_bytes());
                let _ = rig.mem.write(AVAIL + 2, &idx.wrapping_add(1).to_le_bytes());
            }
            4 => {
                // A request header somewhere.
                let at = u64::from(inp.u16()) % RAM_SIZE as u64;
                let ty = [0u32, 1, 4, 8, 2][usize::from(inp.u8() % 5)];
                let sector = if inp.u8() & 1 == 0 { u64::from(inp.u8()) } else { inp.u64() };
                let mut h = [0u8; 16];
                h[..4].copy_from_slice(&ty.to_le_bytes());
                h[8..].copy_from_slice(&sector.to_le_bytes());
                let _ = rig.mem.write(at, &h);
            }
            5 => {
                // Raw bytes anywhere (including the rings).
                let at = u64::from(inp.u16()) % RAM_SIZE as u64;
                let n = usize::from(inp.u8() % 32);
                let b = inp.bytes(n).to_vec();
                let _ = rig.mem.write(at, &b);
            }
            6 => {
                rig.now += u64::from(inp.u16());
                rig.poll();
            }
            7 => {
                // Any register, any size, any value.
                let off = u64::from(inp.u16()) % (FRAME_SIZE + 8);
                let size = [1u8, 2, 4, 8][usize::from(inp.u8() % 4)];
                let _ = rig.dev.mmio_read(off, size);
                let v = inp.u32();
                rig.wr(off, size, u64::from(v));
            }
            8 => {
                let token = u64::from(inp.u8());
                let n = usize::from(inp.u8()) * 64;
                let fx = rig.dev.complete(&mut rig.mem, Completion { token, result: Ok(DataBuf::try_zeroed(n).expect("heap")) });
                rig.apply(fx);
            }
            _ => {
                let s = rig.dev.mmio_read(INTERRUPT_STATUS, 4).unwrap_or(0);
                rig.wr(INTERRUPT_ACK, 4, s);
            }
        }
    }
    while let Some(t) = rig.be.next_deadline() {
        rig.now = rig.now.max(t);
        rig.poll();
    }
    assert_eq!(rig.dev.in_flight(), 0);
    let c = rig.dev.counters();
    // Forged completions (action 8) may retire a request before the backend
    // does; the backend's own completion of it then counts as unknown.
    assert!(c.completions <= c.submitted());
    assert_eq!(c.stale_completions + rig.dev.orphans() as u64, c.orphaned);
});
