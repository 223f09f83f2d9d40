//! Host tests: a fake driver that sets the device up the way Linux's
//! virtio_mmio + virtio_blk do, then good and bad requests, and randomized
//! garbage against the registers and the rings.

use super::blk::*;
use super::mmio::*;
use super::queue::{ChainError, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE};
use super::*;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

mod phys;

const RAM: u64 = 0x4000_0000;
const RAM_SIZE: usize = 4 << 20;
const QSZ: u16 = 16;
const DESC: u64 = RAM + 0x1000;
const AVAIL: u64 = RAM + 0x2000;
const USED: u64 = RAM + 0x3000;
const INDIRECT: u64 = RAM + 0x8000;
const BUF: u64 = RAM + 0x10000;
const DISK_SECTORS: u64 = 2048; // 1 MiB

struct Xorshift(u64);
impl Xorshift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn fill(&mut self, b: &mut [u8]) {
        for c in b.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

fn checksum(b: &[u8]) -> u64 {
    // FNV-1a
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3))
}

/// One descriptor as the fake driver wants it.
#[derive(Clone, Copy)]
struct D {
    addr: u64,
    len: u32,
    write: bool,
}
fn r(addr: u64, len: u32) -> D {
    D { addr, len, write: false }
}
fn w(addr: u64, len: u32) -> D {
    D { addr, len, write: true }
}

struct Rig {
    dev: VirtioBlk,
    mem: VecMemory,
    be: RamBackend,
    now: u64,
    next_desc: u16,
    avail_idx: u16,
    used_seen: u16,
    irq: bool,
    bump: u64,
}

impl Rig {
    fn new(cfg: BlkConfig, be: RamBackend) -> Self {
        Self {
            dev: VirtioBlk::new(cfg),
            mem: VecMemory::new(RAM, RAM_SIZE),
            be,
            now: 0,
            next_desc: 0,
            avail_idx: 0,
            used_seen: 0,
            irq: false,
            bump: BUF,
        }
    }

    fn rd(&self, off: u64) -> u32 {
        self.dev.mmio_read(off, 4).unwrap() as u32
    }

    fn wr(&mut self, off: u64, v: u32) {
        let fx = self.dev.mmio_write(off, 4, u64::from(v), &self.mem).unwrap();
        self.apply(fx);
    }

    /// What the EL2 code does with effects: process notified queues, mirror
    /// the line level.
    fn apply(&mut self, mut fx: Effects) {
        loop {
            if fx.irq_level_changed {
                self.irq = self.dev.irq_level();
            }
            assert_eq!(self.irq, self.dev.irq_level(), "an irq level change was not reported");
            match fx.notify {
                Some(q) => fx = self.dev.process_queue(q, &mut self.mem, &mut self.be, self.now),
                None => break,
            }
        }
    }

    /// Run the backend until nothing is pending (advancing time to each
    /// deadline), completing into the device.
    fn drain(&mut self) {
        while let Some(t) = self.be.next_deadline() {
            self.now = self.now.max(t);
            self.poll();
        }
    }

    fn poll(&mut self) {
        for c in self.be.poll(self.now) {
            let fx = self.dev.complete(&mut self.mem, c);
            self.apply(fx);
        }
    }

    /// Linux's probe: reset, ACK, DRIVER, features, FEATURES_OK, queue 0, DRIVER_OK.
    fn handshake(&mut self, accept: u64) -> bool {
        assert_eq!(self.rd(MAGIC_VALUE), MAGIC);
        assert_eq!(self.rd(VERSION), 2);
        assert_eq!(self.rd(DEVICE_ID), 2);
        self.wr(STATUS, 0);
        assert_eq!(self.rd(STATUS), 0);
        self.wr(STATUS, status::ACKNOWLEDGE);
        self.wr(STATUS, status::ACKNOWLEDGE | status::DRIVER);
        self.wr(DEVICE_FEATURES_SEL, 1);
        let mut f = u64::from(self.rd(DEVICE_FEATURES)) << 32;
        self.wr(DEVICE_FEATURES_SEL, 0);
        f |= u64::from(self.rd(DEVICE_FEATURES));
        let want = f & accept;
        self.wr(DRIVER_FEATURES_SEL, 1);
        self.wr(DRIVER_FEATURES, (want >> 32) as u32);
        self.wr(DRIVER_FEATURES_SEL, 0);
        self.wr(DRIVER_FEATURES, want as u32);
        let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
        self.wr(STATUS, s);
        if self.rd(STATUS) & status::FEATURES_OK == 0 {
            return false;
        }
        self.setup_queue(QSZ, DESC, AVAIL, USED);
        self.wr(STATUS, s | status::DRIVER_OK);
        true
    }

    fn setup_queue(&mut self, n: u16, desc: u64, avail: u64, used: u64) {
        self.wr(QUEUE_SEL, 0);
        assert_eq!(self.rd(QUEUE_READY), 0);
        assert_eq!(self.rd(QUEUE_NUM_MAX), 128);
        self.wr(QUEUE_NUM, u32::from(n));
        self.wr(QUEUE_DESC_LOW, desc as u32);
        self.wr(QUEUE_DESC_HIGH, (desc >> 32) as u32);
        self.wr(QUEUE_DRIVER_LOW, avail as u32);
        self.wr(QUEUE_DRIVER_HIGH, (avail >> 32) as u32);
        self.wr(QUEUE_DEVICE_LOW, used as u32);
        self.wr(QUEUE_DEVICE_HIGH, (used >> 32) as u32);
        self.wr(QUEUE_READY, 1);
    }

    fn alloc(&mut self, len: u64) -> u64 {
        let a = self.bump;
        self.bump = (self.bump + len + 15) & !15;
        assert!(self.bump < RAM + RAM_SIZE as u64);
        a
    }

    fn write_desc(&mut self, table: u64, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = table + 16 * u64::from(i);
        self.mem.write_u64(at, addr).unwrap();
        self.mem.write_u32(at + 8, len).unwrap();
        self.mem.write_u16(at + 12, flags).unwrap();
        self.mem.write_u16(at + 14, next).unwrap();
    }

    /// Put a chain in the descriptor table (round robin) and return its head.
    fn chain(&mut self, ds: &[D]) -> u16 {
        let head = self.next_desc;
        for (k, d) in ds.iter().enumerate() {
            let i = (head + k as u16) % QSZ;
            let last = k + 1 == ds.len();
            let flags = if d.write { DESC_F_WRITE } else { 0 } | if last { 0 } else { DESC_F_NEXT };
            self.write_desc(DESC, i, d.addr, d.len, flags, (i + 1) % QSZ);
        }
        self.next_desc = (head + ds.len() as u16) % QSZ;
        head
    }

    /// Publish `head` in the avail ring (no notify).
    fn offer(&mut self, head: u16) {
        self.mem.write_u16(AVAIL + 4 + 2 * u64::from(self.avail_idx % QSZ), head).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.mem.write_u16(AVAIL + 2, self.avail_idx).unwrap();
    }

    fn kick(&mut self) {
        self.wr(QUEUE_NOTIFY, 0);
    }

    fn used(&mut self) -> Vec<(u32, u32)> {
        let idx = self.mem.read_u16(USED + 2).unwrap();
        let mut v = Vec::new();
        while self.used_seen != idx {
            let e = USED + 4 + 8 * u64::from(self.used_seen % QSZ);
            v.push((self.mem.read_u32(e).unwrap(), self.mem.read_u32(e + 4).unwrap()));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        v
    }

    /// The guest's interrupt handler: read InterruptStatus, ack it.
    fn ack_irq(&mut self) -> u32 {
        let s = self.rd(INTERRUPT_STATUS);
        self.wr(INTERRUPT_ACK, s);
        assert!(!self.irq);
        s
    }

    fn header(&mut self, ty: u32, sector: u64) -> u64 {
        let h = self.alloc(16);
        self.mem.write_u32(h, ty).unwrap();
        self.mem.write_u32(h + 4, 0).unwrap();
        self.mem.write_u64(h + 8, sector).unwrap();
        h
    }

    fn status_byte(&mut self) -> u64 {
        let s = self.alloc(1);
        self.mem.write_u8(s, 0xff).unwrap();
        s
    }

    /// Submit a chain, kick, run the backend; return (used len, status).
    fn run(&mut self, ds: &[D], status_at: u64) -> (u32, u8) {
        let head = self.chain(ds);
        self.offer(head);
        self.kick();
        self.drain();
        let u = self.used();
        assert_eq!(u.len(), 1, "exactly one used element expected");
        assert_eq!(u[0].0, u32::from(head));
        (u[0].1, self.mem.read_u8(status_at).unwrap())
    }

    /// A write of `data` at `sector`, data split in `pieces` descriptors.
    fn write(&mut self, sector: u64, data: &[u8], pieces: usize) -> (u32, u8) {
        let h = self.header(T_OUT, sector);
        let buf = self.alloc(data.len() as u64);
        self.mem.write(buf, data).unwrap();
        let st = self.status_byte();
        let mut ds = vec![r(h, 16)];
        ds.extend(split(buf, data.len() as u32, pieces, false));
        ds.push(w(st, 1));
        self.run(&ds, st)
    }

    /// A read of `len` bytes; returns (used len, status, data).
    fn read(&mut self, sector: u64, len: u32, pieces: usize) -> (u32, u8, Vec<u8>) {
        let h = self.header(T_IN, sector);
        let buf = self.alloc(u64::from(len));
        self.mem.write(buf, &vec![0xee; len as usize]).unwrap();
        let st = self.status_byte();
        let mut ds = vec![r(h, 16)];
        ds.extend(split(buf, len, pieces, true));
        ds.push(w(st, 1));
        let (ul, s) = self.run(&ds, st);
        let mut data = vec![0; len as usize];
        self.mem.read(buf, &mut data).unwrap();
        (ul, s, data)
    }
}

fn split(addr: u64, len: u32, pieces: usize, write: bool) -> Vec<D> {
    let pieces = pieces.max(1) as u32;
    let step = len.div_ceil(pieces).max(1);
    let mut v = Vec::new();
    let mut off = 0;
    while off < len {
        let n = step.min(len - off);
        v.push(D { addr: addr + u64::from(off), len: n, write });
        off += n;
    }
    v
}

fn rig_with(cfg: BlkConfig, latency_ns: u64, read_only: bool) -> Rig {
    let be = RamBackend::new(vec![0u8; (DISK_SECTORS * 512) as usize], read_only, latency_ns);
    let mut rig = Rig::new(cfg, be);
    assert!(rig.handshake(u64::MAX));
    rig
}

fn rig() -> Rig {
    rig_with(BlkConfig::new(DISK_SECTORS, false), 0, false)
}

// ---------------------------------------------------------------- transport

#[test]
fn virtio_handshake_and_features() {
    let mut rig = Rig::new(BlkConfig::new(DISK_SECTORS, false), RamBackend::new(vec![0; 512], false, 0));
    assert!(rig.handshake(u64::MAX));
    let s = rig.rd(STATUS);
    assert_eq!(s, status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK);
    let neg = rig.dev.transport().negotiated();
    for f in [
        features::VERSION_1,
        features::BLK_FLUSH,
        features::BLK_SEG_MAX,
        features::BLK_BLK_SIZE,
        features::RING_INDIRECT_DESC,
    ] {
        assert_ne!(neg & f, 0);
    }
    assert_eq!(neg & (features::BLK_RO | features::RING_EVENT_IDX | features::RING_PACKED), 0);
    assert_eq!(rig.rd(QUEUE_READY), 1);
    assert_ne!(rig.rd(VENDOR_ID), 0);

    // Without VERSION_1 (a legacy driver) FEATURES_OK does not stick.
    let mut rig = Rig::new(BlkConfig::new(DISK_SECTORS, false), RamBackend::new(vec![0; 512], false, 0));
    assert!(!rig.handshake(!features::VERSION_1));
    // A feature the device did not offer: refused as well.
    rig.wr(STATUS, 0);
    rig.wr(STATUS, status::ACKNOWLEDGE | status::DRIVER);
    rig.wr(DRIVER_FEATURES_SEL, 1);
    rig.wr(DRIVER_FEATURES, 1); // VERSION_1
    rig.wr(DRIVER_FEATURES_SEL, 0);
    rig.wr(DRIVER_FEATURES, features::RING_EVENT_IDX as u32);
    rig.wr(STATUS, status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
    assert_eq!(rig.rd(STATUS) & status::FEATURES_OK, 0);
}

#[test]
fn virtio_read_only_offers_ro() {
    let rig = rig_with(BlkConfig::new(DISK_SECTORS, true), 0, true);
    assert_ne!(rig.dev.transport().negotiated() & features::BLK_RO, 0);
}

#[test]
fn virtio_mmio_access_rules_and_config() {
    let mut cfg = BlkConfig::new(0x1_2345_6789, false);
    cfg.size_max = Some(65536);
    let rig = Rig::new(cfg, RamBackend::new(vec![0; 512], false, 0));
    let d = &rig.dev;
    assert_eq!(d.mmio_read(MAGIC_VALUE, 2), Err(MmioError::BadAccessSize { offset: 0, size: 2 }));
    assert_eq!(d.mmio_read(MAGIC_VALUE, 8), Err(MmioError::BadAccessSize { offset: 0, size: 8 }));
    assert_eq!(d.mmio_read(2, 4), Err(MmioError::Misaligned { offset: 2 }));
    assert_eq!(d.mmio_read(FRAME_SIZE, 4), Err(MmioError::OutOfRange { offset: FRAME_SIZE }));
    assert_eq!(d.mmio_read(FRAME_SIZE - 2, 4), Err(MmioError::OutOfRange { offset: FRAME_SIZE - 2 }));
    assert_eq!(d.mmio_read(CONFIG, 3), Err(MmioError::BadAccessSize { offset: CONFIG, size: 3 }));
    // capacity as one u64, as two u32 (Linux), bytewise.
    assert_eq!(d.mmio_read(CONFIG, 8).unwrap(), 0x1_2345_6789);
    assert_eq!(d.mmio_read(CONFIG, 4).unwrap(), 0x2345_6789);
    assert_eq!(d.mmio_read(CONFIG + 4, 4).unwrap(), 1);
    assert_eq!(d.mmio_read(CONFIG + 1, 1).unwrap(), 0x67);
    assert_eq!(d.mmio_read(CONFIG + 8, 4).unwrap(), 65536); // size_max
    assert_eq!(d.mmio_read(CONFIG + 12, 4).unwrap(), 126); // seg_max
    assert_eq!(d.mmio_read(CONFIG + 20, 4).unwrap(), 512); // blk_size
    assert_eq!(d.mmio_read(CONFIG + 34, 2).unwrap(), 1); // num_queues
    assert_eq!(d.mmio_read(CONFIG + 0xf8, 8).unwrap(), 0);
    assert_ne!(d.transport().device_features() & features::BLK_SIZE_MAX, 0);
    // Config writes and read-only register writes are ignored.
    let mut rig = rig;
    let mem = VecMemory::new(RAM, 4096);
    assert_eq!(rig.dev.mmio_write(CONFIG, 1, 0xff, &mem).unwrap(), Effects::default());
    assert_eq!(rig.dev.mmio_write(MAGIC_VALUE, 4, 0, &mem).unwrap(), Effects::default());
    assert_eq!(rig.rd(MAGIC_VALUE), MAGIC);
    assert!(rig.dev.mmio_write(STATUS, 1, 1, &mem).is_err());
    // Only queue 0 exists.
    rig.wr(QUEUE_SEL, 1);
    assert_eq!(rig.rd(QUEUE_NUM_MAX), 0);
    assert_eq!(rig.rd(SHM_LEN_LOW), u32::MAX);
}

#[test]
fn virtio_queue_setup_validation() {
    for (n, desc, avail, used) in [
        (12, DESC, AVAIL, USED),                      // not a power of two
        (256, DESC, AVAIL, USED),                     // above QueueNumMax (128)
        (0, DESC, AVAIL, USED),                       // zero
        (QSZ, DESC + 8, AVAIL, USED),                 // misaligned desc
        (QSZ, DESC, AVAIL + 1, USED),                 // misaligned avail
        (QSZ, DESC, AVAIL, USED + 2),                 // misaligned used
        (QSZ, 0x1000, AVAIL, USED),                   // desc outside RAM
        (QSZ, DESC, RAM + RAM_SIZE as u64 - 8, USED), // avail crosses the end
        (QSZ, DESC, AVAIL, u64::MAX - 3),             // wraps
    ] {
        let mut rig = Rig::new(BlkConfig::new(DISK_SECTORS, false), RamBackend::new(vec![0; 512], false, 0));
        rig.wr(STATUS, status::ACKNOWLEDGE | status::DRIVER);
        rig.wr(DRIVER_FEATURES_SEL, 1);
        rig.wr(DRIVER_FEATURES, 1);
        rig.wr(STATUS, status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
        rig.setup_queue(n, desc, avail, used);
        assert_eq!(rig.rd(QUEUE_READY), 0, "size {n} desc {desc:#x} avail {avail:#x} used {used:#x}");
        assert_ne!(rig.rd(STATUS) & status::DEVICE_NEEDS_RESET, 0);
        assert!(rig.irq);
        assert_eq!(rig.ack_irq(), irq::CONFIG);
        // A reset makes it usable again.
        assert!(rig.handshake(u64::MAX));
    }
}

#[test]
fn virtio_queue_registers_frozen_while_ready() {
    let mut rig = rig();
    rig.wr(QUEUE_NUM, 4);
    rig.wr(QUEUE_DESC_LOW, 0);
    let q = &rig.dev.transport().queues[0];
    assert_eq!((q.size, q.desc), (QSZ, DESC));
    // Data still flows.
    let (_, st) = rig.write(0, &[1u8; 512], 1);
    assert_eq!(st, S_OK);
}

// ------------------------------------------------------------- good requests

#[test]
fn virtio_write_then_read_back() {
    let mut rig = rig();
    let mut x = Xorshift(0x1234_5678);
    for (sector, len, pieces) in [(0u64, 512usize, 1usize), (10, 8192, 3), (100, 4096, 8), (DISK_SECTORS - 8, 4096, 2)]
    {
        let mut data = vec![0u8; len];
        x.fill(&mut data);
        let (ul, st) = rig.write(sector, &data, pieces);
        assert_eq!((ul, st), (1, S_OK));
        let (ul, st, back) = rig.read(sector, len as u32, pieces + 1);
        assert_eq!((ul, st), (len as u32 + 1, S_OK));
        assert_eq!(checksum(&back), checksum(&data));
        let at = sector as usize * 512;
        assert_eq!(checksum(&rig.be.image()[at..at + len]), checksum(&data));
    }
    let c = rig.dev.counters();
    assert_eq!((c.reads, c.writes, c.io_errors, c.bad_chains), (4, 4, 0, 0));
    assert_eq!(c.bytes_written, 512 + 8192 + 4096 + 4096);
    assert_eq!(c.bytes_read, c.bytes_written);
    assert_eq!(c.in_flight, 0);
}

#[test]
fn virtio_framing_agnostic() {
    // Header and data in one readable descriptor; data and status in one
    // writable descriptor; header split in two.
    let mut rig = rig();
    let buf = rig.alloc(16 + 1024);
    rig.mem.write_u32(buf, T_OUT).unwrap();
    rig.mem.write_u64(buf + 8, 5).unwrap();
    rig.mem.write(buf + 16, &[0xab; 1024]).unwrap();
    let st = rig.status_byte();
    assert_eq!(rig.run(&[r(buf, 1040), w(st, 1)], st), (1, S_OK));

    let h = rig.header(T_IN, 5);
    let io = rig.alloc(1025);
    assert_eq!(rig.run(&[r(h, 7), r(h + 7, 9), w(io, 1025)], io + 1024), (1025, S_OK));
    let mut back = [0u8; 1024];
    rig.mem.read(io, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0xab));
}

#[test]
fn virtio_indirect_descriptors() {
    let mut rig = rig();
    let h = rig.header(T_OUT, 7);
    let data = rig.alloc(1024);
    rig.mem.write(data, &[0x5a; 1024]).unwrap();
    let st = rig.status_byte();
    rig.write_desc(INDIRECT, 0, h, 16, DESC_F_NEXT, 1);
    rig.write_desc(INDIRECT, 1, data, 512, DESC_F_NEXT, 2);
    rig.write_desc(INDIRECT, 2, data + 512, 512, DESC_F_NEXT, 3);
    rig.write_desc(INDIRECT, 3, st, 1, DESC_F_WRITE, 0);
    rig.write_desc(DESC, 0, INDIRECT, 64, DESC_F_INDIRECT, 0);
    rig.offer(0);
    rig.kick();
    rig.drain();
    assert_eq!(rig.used(), vec![(0, 1)]);
    assert_eq!(rig.mem.read_u8(st).unwrap(), S_OK);
    assert!(rig.be.image()[7 * 512..9 * 512].iter().all(|&b| b == 0x5a));
}

#[test]
fn virtio_flush_and_get_id() {
    let mut rig = rig();
    let h = rig.header(T_FLUSH, 0);
    let st = rig.status_byte();
    assert_eq!(rig.run(&[r(h, 16), w(st, 1)], st), (1, S_OK));
    assert_eq!(rig.be.flushes, 1);

    let h = rig.header(T_GET_ID, 0);
    let id = rig.alloc(20);
    let st = rig.status_byte();
    assert_eq!(rig.run(&[r(h, 16), w(id, 20), w(st, 1)], st), (21, S_OK));
    let mut got = [0u8; 20];
    rig.mem.read(id, &mut got).unwrap();
    assert_eq!(&got, &rig.dev.config().serial);
    // A shorter id buffer gets a truncated id, not an overflow.
    let h = rig.header(T_GET_ID, 0);
    let id = rig.alloc(8);
    rig.mem.write(id, &[0xcc; 8]).unwrap();
    let after = rig.alloc(4);
    rig.mem.write(after, &[0xcc; 4]).unwrap();
    let st = rig.status_byte();
    assert_eq!(rig.run(&[r(h, 16), w(id, 4), w(st, 1)], st), (5, S_OK));
    assert_eq!(rig.mem.read_u32(id + 4).unwrap(), 0xcccc_cccc);
    let c = rig.dev.counters();
    assert_eq!((c.flushes, c.get_ids), (1, 2));
}

#[test]
fn virtio_write_acknowledged_only_after_backend_completion() {
    let mut rig = rig_with(BlkConfig::new(DISK_SECTORS, false), 50_000, false);
    rig.now = 1_000;
    let h = rig.header(T_OUT, 3);
    let buf = rig.alloc(512);
    rig.mem.write(buf, &[0x77; 512]).unwrap();
    let st = rig.status_byte();
    let head = rig.chain(&[r(h, 16), r(buf, 512), w(st, 1)]);
    rig.offer(head);
    rig.kick();
    // Submitted, not completed: nothing in the used ring, no interrupt, disk untouched.
    assert_eq!(rig.dev.in_flight(), 1);
    assert_eq!(rig.be.next_deadline(), Some(51_000));
    assert!(rig.used().is_empty());
    assert!(!rig.irq);
    assert_eq!(rig.mem.read_u8(st).unwrap(), 0xff);
    // The guest scribbles on its buffer after submitting: the disk gets the
    // data as it was at submit.
    rig.mem.write(buf, &[0x11; 512]).unwrap();
    rig.now = 50_999;
    rig.poll();
    assert!(rig.used().is_empty());
    assert!(rig.be.image()[3 * 512..4 * 512].iter().all(|&b| b == 0));
    rig.now = 51_000;
    rig.poll();
    assert_eq!(rig.used(), vec![(u32::from(head), 1)]);
    assert_eq!(rig.mem.read_u8(st).unwrap(), S_OK);
    assert!(rig.irq);
    assert_eq!(rig.ack_irq(), irq::VRING);
    assert!(rig.be.image()[3 * 512..4 * 512].iter().all(|&b| b == 0x77));
    assert_eq!(rig.dev.counters().in_flight_hwm, 1);
}

#[test]
fn virtio_many_in_flight_complete_out_of_order() {
    // Backend latency depends on submit time, so later requests submitted
    // earlier... emulate out-of-order by polling in two steps.
    let mut rig = rig_with(BlkConfig::new(DISK_SECTORS, false), 1000, false);
    let mut heads = Vec::new();
    let mut sts = Vec::new();
    for i in 0..4u64 {
        rig.now = i * 10;
        let h = rig.header(T_IN, i);
        let b = rig.alloc(512);
        let st = rig.status_byte();
        let head = rig.chain(&[r(h, 16), w(b, 512), w(st, 1)]);
        rig.offer(head);
        rig.kick();
        heads.push(head);
        sts.push(st);
    }
    assert_eq!(rig.dev.counters().in_flight_hwm, 4);
    rig.now = 1015;
    rig.poll();
    let u = rig.used();
    assert_eq!(u.iter().map(|e| e.0).collect::<Vec<_>>(), vec![u32::from(heads[0]), u32::from(heads[1])]);
    rig.drain();
    assert_eq!(rig.used().len(), 2);
    assert!(sts.iter().all(|&s| rig.mem.read_u8(s).unwrap() == S_OK));
}

#[test]
fn virtio_stall_when_backend_full_then_resume() {
    let mut rig = rig_with(BlkConfig::new(DISK_SECTORS, false), 100, false);
    rig.be.max_in_flight = 2;
    let mut sts = Vec::new();
    for i in 0..5u64 {
        let h = rig.header(T_OUT, i);
        let b = rig.alloc(512);
        let st = rig.status_byte();
        let head = rig.chain(&[r(h, 16), r(b, 512), w(st, 1)]);
        rig.offer(head);
        sts.push(st);
    }
    rig.kick();
    assert_eq!(rig.dev.in_flight(), 2);
    assert_eq!(rig.dev.counters().stalls, 1);
    rig.drain();
    assert_eq!(rig.used().len(), 5);
    // All OK: the backend never had to refuse (Busy would be IOERR).
    assert!(sts.iter().all(|&s| rig.mem.read_u8(s).unwrap() == S_OK));
    assert_eq!(rig.dev.counters().backend_errors, 0);
}

#[test]
fn virtio_in_flight_byte_budget() {
    let mut cfg = BlkConfig::new(DISK_SECTORS, false);
    cfg.max_in_flight_bytes = 8192;
    let mut rig = rig_with(cfg, 100, false);
    for i in 0..4u64 {
        let h = rig.header(T_OUT, i * 8);
        let b = rig.alloc(4096);
        let st = rig.status_byte();
        let head = rig.chain(&[r(h, 16), r(b, 4096), w(st, 1)]);
        rig.offer(head);
    }
    rig.kick();
    // 4096 + 4113 > 8192: the second waits in the ring.
    assert_eq!(rig.dev.in_flight(), 1);
    assert_eq!(rig.dev.transport().queues[0].last_avail(), 1);
    rig.drain();
    assert_eq!(rig.used().len(), 4);
    assert_eq!(rig.dev.counters().writes, 4);
    // One request larger than the budget is still served when alone.
    let (_, st, _) = rig.read(0, 16384, 2);
    assert_eq!(st, S_OK);
}

#[test]
fn virtio_no_interrupt_flag_is_honoured() {
    let mut rig = rig();
    rig.mem.write_u16(AVAIL, 1).unwrap(); // VIRTQ_AVAIL_F_NO_INTERRUPT
    let (_, st) = rig.write(0, &[0; 512], 1);
    assert_eq!(st, S_OK);
    assert!(!rig.irq);
    rig.mem.write_u16(AVAIL, 0).unwrap();
    let (_, st) = rig.write(0, &[0; 512], 1);
    assert_eq!(st, S_OK);
    assert!(rig.irq);
}

#[test]
fn virtio_counters_text() {
    let mut rig = rig();
    rig.write(0, &[1; 1024], 1);
    rig.read(0, 1024, 1);
    let mut s = String::new();
    rig.dev.write_text("blk0", &mut s).unwrap();
    assert!(s.contains("blk0.reads=1\n"));
    assert!(s.contains("blk0.writes=1\n"));
    assert!(s.contains("blk0.bytes_read=1024\n"));
    assert!(s.contains("blk0.bytes_written=1024\n"));
    assert!(s.contains("blk0.in_flight_hwm=1\n"));
    assert_eq!(s.lines().count(), BlkCounters::NAMES.len());
    assert!(s.lines().all(|l| l.starts_with("blk0.") && l.split_once('=').unwrap().1.parse::<u64>().is_ok()));
}

// -------------------------------------------------------------- bad requests

/// After a bad request, a good one still works.
fn still_serving(rig: &mut Rig) {
    let (ul, st) = rig.write(1, &[0x42; 512], 1);
    assert_eq!((ul, st), (1, S_OK));
    let (_, st, back) = rig.read(1, 512, 1);
    assert_eq!(st, S_OK);
    assert!(back.iter().all(|&b| b == 0x42));
}

fn expect_status(rig: &mut Rig, ds: &[D], st: u64, want: u8) {
    let (ul, s) = rig.run(ds, st);
    assert_eq!((ul, s), (1, want));
    still_serving(rig);
}

#[test]
fn virtio_unknown_type_unsupp() {
    let mut rig = rig();
    for ty in [2, 3, 10, 11, 13, 14, 0xffff_ffff] {
        let h = rig.header(ty, 0);
        let st = rig.status_byte();
        expect_status(&mut rig, &[r(h, 16), w(st, 1)], st, S_UNSUPP);
    }
    assert_eq!(rig.dev.counters().unsupported, 7);
}

#[test]
fn virtio_misaligned_length_ioerr() {
    let mut rig = rig();
    for len in [1u32, 100, 511, 513, 4097] {
        let h = rig.header(T_IN, 0);
        let b = rig.alloc(u64::from(len));
        let st = rig.status_byte();
        expect_status(&mut rig, &[r(h, 16), w(b, len), w(st, 1)], st, S_IOERR);
        let h = rig.header(T_OUT, 0);
        expect_status(&mut rig, &[r(h, 16), r(b, len), w(st, 1)], st, S_IOERR);
    }
    assert_eq!(rig.dev.last_error(), Some(RequestError::Misaligned(4097)));
    assert_eq!(rig.dev.counters().io_errors, 10);
}

#[test]
fn virtio_past_end_ioerr() {
    let mut rig = rig();
    for (sector, len) in [(DISK_SECTORS, 512u32), (DISK_SECTORS - 1, 1024), (u64::MAX, 512), (u64::MAX / 512 + 1, 512)]
    {
        let h = rig.header(T_IN, sector);
        let b = rig.alloc(u64::from(len));
        let st = rig.status_byte();
        expect_status(&mut rig, &[r(h, 16), w(b, len), w(st, 1)], st, S_IOERR);
        let h = rig.header(T_OUT, sector);
        expect_status(&mut rig, &[r(h, 16), r(b, len), w(st, 1)], st, S_IOERR);
    }
    // The last sector itself is fine.
    let (_, st, _) = rig.read(DISK_SECTORS - 1, 512, 1);
    assert_eq!(st, S_OK);
}

#[test]
fn virtio_too_large_ioerr() {
    let mut cfg = BlkConfig::new(DISK_SECTORS, false);
    cfg.max_request_bytes = 4096;
    let mut rig = rig_with(cfg, 0, false);
    let h = rig.header(T_IN, 0);
    let b = rig.alloc(8192);
    let st = rig.status_byte();
    expect_status(&mut rig, &[r(h, 16), w(b, 8192), w(st, 1)], st, S_IOERR);
    assert_eq!(rig.dev.last_error(), Some(RequestError::TooLarge(8192)));
}

#[test]
fn virtio_read_only_write_ioerr() {
    let mut rig = rig_with(BlkConfig::new(DISK_SECTORS, true), 0, true);
    let (ul, st) = rig.write(0, &[9; 512], 1);
    assert_eq!((ul, st), (1, S_IOERR));
    assert!(rig.be.image().iter().all(|&b| b == 0));
    let (_, st, _) = rig.read(0, 512, 1);
    assert_eq!(st, S_OK);
    // FLUSH on a read-only disk is fine.
    let h = rig.header(T_FLUSH, 0);
    let st = rig.status_byte();
    assert_eq!(rig.run(&[r(h, 16), w(st, 1)], st), (1, S_OK));
}

#[test]
fn virtio_wrong_direction_ioerr() {
    let mut rig = rig();
    // OUT whose data is device-writable.
    let h = rig.header(T_OUT, 0);
    let b = rig.alloc(512);
    rig.mem.write(b, &[0x33; 512]).unwrap();
    let st = rig.status_byte();
    expect_status(&mut rig, &[r(h, 16), w(b, 512), w(st, 1)], st, S_IOERR);
    // The device did not write into that buffer.
    let mut chk = [0u8; 512];
    rig.mem.read(b, &mut chk).unwrap();
    assert!(chk.iter().all(|&x| x == 0x33));
    // IN whose data is device-readable.
    let h = rig.header(T_IN, 0);
    expect_status(&mut rig, &[r(h, 16), r(b, 512), w(st, 1)], st, S_IOERR);
    rig.mem.read(b, &mut chk).unwrap();
    assert!(chk.iter().all(|&x| x == 0x33));
    // Header short / device-writable.
    expect_status(&mut rig, &[r(h, 8), w(st, 1)], st, S_IOERR);
    expect_status(&mut rig, &[w(h, 16), w(st, 1)], st, S_IOERR);
    assert_eq!(rig.dev.counters().reads + rig.dev.counters().writes, 8);
}

#[test]
fn virtio_data_outside_ram_ioerr() {
    let mut rig = rig();
    let end = RAM + RAM_SIZE as u64;
    for addr in [0u64, RAM - 512, end - 256, end, u64::MAX - 100] {
        let h = rig.header(T_IN, 0);
        let st = rig.status_byte();
        expect_status(&mut rig, &[r(h, 16), w(addr, 512), w(st, 1)], st, S_IOERR);
        let h = rig.header(T_OUT, 0);
        expect_status(&mut rig, &[r(h, 16), r(addr, 512), w(st, 1)], st, S_IOERR);
        // Header outside RAM.
        if !rig.mem.contains(addr, 16) {
            expect_status(&mut rig, &[r(addr, 16), w(st, 1)], st, S_IOERR);
        }
    }
    assert_eq!(rig.dev.counters().bad_chains, 0);
}

/// Submit a raw chain; expect it back with used len 0 and counted as bad.
fn expect_bad_chain(rig: &mut Rig, head: u16, want: ChainErrorKind) {
    let before = rig.dev.counters().bad_chains;
    rig.offer(head);
    rig.kick();
    rig.drain();
    assert_eq!(rig.used(), vec![(u32::from(head), 0)]);
    assert_eq!(rig.dev.counters().bad_chains, before + 1);
    want.check(rig.dev.last_error());
    // Reuse descriptors from 8 on for the follow-up good requests.
    rig.next_desc = 8;
    still_serving(rig);
}

#[derive(Clone, Copy)]
enum ChainErrorKind {
    Chain(ChainError),
    NoStatus,
    StatusOutside,
    AnyMem,
}
impl ChainErrorKind {
    fn check(self, e: Option<RequestError>) {
        match (self, e) {
            (ChainErrorKind::Chain(c), Some(RequestError::Chain(g))) => assert_eq!(c, g),
            (ChainErrorKind::NoStatus, Some(RequestError::NoStatus)) => {}
            (ChainErrorKind::StatusOutside, Some(RequestError::StatusOutsideRam(_))) => {}
            (ChainErrorKind::AnyMem, Some(RequestError::Chain(ChainError::Mem(_)))) => {}
            (_, g) => panic!("unexpected last error {g:?}"),
        }
    }
}

#[test]
fn virtio_bad_chains_are_returned_and_device_keeps_serving() {
    let mut rig = rig();
    let h = rig.header(T_IN, 0);
    let b = rig.alloc(512);
    let st = rig.status_byte();

    // A loop: 0 → 1 → 0.
    rig.write_desc(DESC, 0, h, 16, DESC_F_NEXT, 1);
    rig.write_desc(DESC, 1, b, 512, DESC_F_NEXT | DESC_F_WRITE, 0);
    expect_bad_chain(&mut rig, 0, ChainErrorKind::Chain(ChainError::TooLong));
    // A self loop.
    rig.write_desc(DESC, 0, h, 16, DESC_F_NEXT, 0);
    expect_bad_chain(&mut rig, 0, ChainErrorKind::Chain(ChainError::TooLong));
    // A chain through all QSZ descriptors and back: longer than the queue.
    for i in 0..QSZ {
        rig.write_desc(DESC, i, b, 512, DESC_F_NEXT | DESC_F_WRITE, (i + 1) % QSZ);
    }
    expect_bad_chain(&mut rig, 0, ChainErrorKind::Chain(ChainError::TooLong));
    // next out of range.
    rig.write_desc(DESC, 0, h, 16, DESC_F_NEXT, QSZ);
    expect_bad_chain(&mut rig, 0, ChainErrorKind::Chain(ChainError::NextOutOfRange(QSZ)));
    // head out of range.
    expect_bad_chain(&mut rig, QSZ + 3, ChainErrorKind::Chain(ChainError::HeadOutOfRange(QSZ + 3)));
    expect_bad_chain(&mut rig, u16::MAX, ChainErrorKind::Chain(ChainError::HeadOutOfRange(u16::MAX)));
    // Lengths whose sum does not fit in 32 bits.
    rig.write_desc(DESC, 0, h, 0xffff_fff0, DESC_F_NEXT, 1);
    rig.write_desc(DESC, 1, st, 0x20, DESC_F_WRITE, 0);
    expect_bad_chain(&mut rig, 0, ChainErrorKind::Chain(ChainError::LengthOverflow));
    // No status descriptor at all.
    rig.write_desc(DESC, 0, h, 16, 0, 0);
    expect_bad_chain(&mut rig, 0, ChainErrorKind::NoStatus);
    // Zero-length writable "status".
    rig.write_desc(DESC, 0, h, 16, DESC_F_NEXT, 1);
    rig.write_desc(DESC, 1, st, 0, DESC_F_WRITE, 0);
    expect_bad_chain(&mut rig, 0, ChainErrorKind::NoStatus);
    // Status outside guest RAM (and one whose address wraps).
    for bad in [RAM + RAM_SIZE as u64, 0x10, u64::MAX] {
        rig.write_desc(DESC, 0, h, 16, DESC_F_NEXT, 1);
        rig.write_desc(DESC, 1, bad, 2, DESC_F_WRITE, 0);
        expect_bad_chain(&mut rig, 0, ChainErrorKind::StatusOutside);
    }

    // Indirect misuse.
    rig.write_desc(INDIRECT, 0, h, 16, DESC_F_NEXT, 1);
    rig.write_desc(INDIRECT, 1, st, 1, DESC_F_WRITE, 0);
    rig.write_desc(DESC, 0, INDIRECT, 32, DESC_F_INDIRECT | DESC_F_NEXT, 1);
    expect_bad_chain(&mut rig, 0, ChainErrorKind::Chain(ChainError::IndirectWithNext));
    for len in [0u32, 24, 16 * 1025] {
        rig.write_desc(DESC, 0, INDIRECT, len, DESC_F_INDIRECT, 0);
        expect_bad_chain(&mut rig, 0, ChainErrorKind::Chain(ChainError::BadIndirectLen(len)));
    }
    rig.write_desc(DESC, 0, 0x1000, 32, DESC_F_INDIRECT, 0);
    expect_bad_chain(&mut rig, 0, ChainErrorKind::AnyMem);
    // Nested indirect.
    rig.write_desc(INDIRECT, 0, INDIRECT + 0x100, 32, DESC_F_INDIRECT, 0);
    rig.write_desc(DESC, 0, INDIRECT, 32, DESC_F_INDIRECT, 0);
    expect_bad_chain(&mut rig, 0, ChainErrorKind::Chain(ChainError::NestedIndirect));
    // An indirect loop.
    rig.write_desc(INDIRECT, 0, h, 16, DESC_F_NEXT, 1);
    rig.write_desc(INDIRECT, 1, b, 512, DESC_F_NEXT | DESC_F_WRITE, 0);
    rig.write_desc(DESC, 0, INDIRECT, 32, DESC_F_INDIRECT, 0);
    expect_bad_chain(&mut rig, 0, ChainErrorKind::Chain(ChainError::TooLong));
    // next out of the indirect table.
    rig.write_desc(INDIRECT, 1, st, 1, DESC_F_NEXT | DESC_F_WRITE, 2);
    expect_bad_chain(&mut rig, 0, ChainErrorKind::Chain(ChainError::NextOutOfRange(2)));

    assert_eq!(rig.dev.counters().needs_reset, 0);
    assert_eq!(rig.rd(STATUS) & status::DEVICE_NEEDS_RESET, 0);
}

#[test]
fn virtio_indirect_not_negotiated_is_a_bad_chain() {
    let be = RamBackend::new(vec![0u8; (DISK_SECTORS * 512) as usize], false, 0);
    let mut rig = Rig::new(BlkConfig::new(DISK_SECTORS, false), be);
    assert!(rig.handshake(!features::RING_INDIRECT_DESC));
    let h = rig.header(T_FLUSH, 0);
    let st = rig.status_byte();
    rig.write_desc(INDIRECT, 0, h, 16, DESC_F_NEXT, 1);
    rig.write_desc(INDIRECT, 1, st, 1, DESC_F_WRITE, 0);
    rig.write_desc(DESC, 0, INDIRECT, 32, DESC_F_INDIRECT, 0);
    expect_bad_chain(&mut rig, 0, ChainErrorKind::Chain(ChainError::IndirectNotNegotiated));
}

#[test]
fn virtio_bad_chain_policy_needs_reset() {
    let mut cfg = BlkConfig::new(DISK_SECTORS, false);
    cfg.bad_chain_policy = BadChainPolicy::NeedsReset;
    let mut rig = rig_with(cfg, 0, false);
    let h = rig.header(T_IN, 0);
    rig.write_desc(DESC, 0, h, 16, DESC_F_NEXT, 0);
    rig.offer(0);
    rig.kick();
    assert!(rig.used().is_empty());
    assert_ne!(rig.rd(STATUS) & status::DEVICE_NEEDS_RESET, 0);
    assert_eq!(rig.ack_irq(), irq::CONFIG);
    // Nothing is served until the reset...
    rig.next_desc = 8;
    let hw = rig.header(T_FLUSH, 0);
    let st = rig.status_byte();
    let head = rig.chain(&[r(hw, 16), w(st, 1)]);
    rig.offer(head);
    rig.kick();
    assert!(rig.used().is_empty());
    // ... after which a fresh driver works.
    rig.mem.bytes[0..0x8000].fill(0);
    rig.avail_idx = 0;
    rig.used_seen = 0;
    rig.next_desc = 0;
    assert!(rig.handshake(u64::MAX));
    still_serving(&mut rig);
}

#[test]
fn virtio_avail_idx_jump_needs_reset() {
    let mut rig = rig();
    rig.mem.write_u16(AVAIL + 2, QSZ + 1).unwrap();
    rig.kick();
    assert_ne!(rig.rd(STATUS) & status::DEVICE_NEEDS_RESET, 0);
    assert!(rig.irq);
    assert_eq!(rig.ack_irq(), irq::CONFIG);
    assert_eq!(rig.dev.counters().needs_reset, 1);
    // The driver cannot clear NEEDS_RESET except by a reset.
    rig.wr(STATUS, 0xf);
    assert_ne!(rig.rd(STATUS) & status::DEVICE_NEEDS_RESET, 0);
}

#[test]
fn virtio_reset_with_requests_in_flight() {
    let mut rig = rig_with(BlkConfig::new(DISK_SECTORS, false), 1000, false);
    let h = rig.header(T_IN, 0);
    let b = rig.alloc(512);
    rig.mem.write(b, &[0x99; 512]).unwrap();
    let st = rig.status_byte();
    let head = rig.chain(&[r(h, 16), w(b, 512), w(st, 1)]);
    rig.offer(head);
    rig.kick();
    assert_eq!(rig.dev.in_flight(), 1);
    rig.wr(STATUS, 0);
    // Orphaned, not forgotten: the backend still holds it.
    assert_eq!((rig.dev.in_flight(), rig.dev.orphans()), (1, 1));
    assert_eq!(rig.dev.in_flight_bytes(), 512);
    let snapshot = rig.mem.bytes.clone();
    rig.drain();
    // The late completion touched nothing.
    assert!(rig.mem.bytes == snapshot);
    assert_eq!(rig.dev.counters().stale_completions, 1);
    assert_eq!((rig.dev.in_flight(), rig.dev.orphans(), rig.dev.in_flight_bytes()), (0, 0, 0));
    // Queue disable (QueueReady = 0) also orphans its requests.
    rig.mem.bytes[0..0x8000].fill(0);
    rig.avail_idx = 0;
    rig.used_seen = 0;
    rig.next_desc = 0;
    assert!(rig.handshake(u64::MAX));
    let head = rig.chain(&[r(h, 16), w(b, 512), w(st, 1)]);
    rig.offer(head);
    rig.kick();
    rig.wr(QUEUE_READY, 0);
    assert_eq!(rig.rd(QUEUE_READY), 0);
    assert_eq!(rig.dev.orphans(), 1);
    let snapshot = rig.mem.bytes.clone();
    rig.drain();
    assert!(rig.mem.bytes == snapshot);
    let c = rig.dev.counters();
    assert_eq!((c.stale_completions, c.orphaned, c.unknown_completions), (2, 2, 0));
    assert_eq!((c.completions, c.submitted(), c.in_flight), (2, 2, 0));
}

/// A guest that toggles QueueReady (or resets) while reads are in flight.
/// Orphaned requests keep their byte budget until the backend finishes
/// them, and requests beyond it stay in the ring: if a toggle freed the
/// budget while the RAM backend kept the requests, each toggle would admit
/// a new budget's worth and the backend's pending list (and, at the
/// deadline, the read buffers it allocates all at once) would grow until
/// the 48 MiB heap ran out.
#[test]
fn virtio_queue_toggling_cannot_grow_the_backend() {
    const LEN: u32 = 8192;
    let cost = u64::from(LEN) + 16 + 1;
    let mut cfg = BlkConfig::new(DISK_SECTORS, false);
    cfg.max_in_flight_bytes = 3 * cost;
    let budget = cfg.max_in_flight_bytes;
    let mut rig = rig_with(cfg, 1_000_000, false);
    // Eight reads into one buffer, offered once: every re-enable starts the
    // ring over from entry 0 and the device sees them all again.
    let buf = rig.alloc(u64::from(LEN));
    for i in 0..8u64 {
        let h = rig.header(T_IN, i * 16);
        let st = rig.status_byte();
        let head = rig.chain(&[r(h, 16), w(buf, LEN), w(st, 1)]);
        rig.offer(head);
    }
    rig.kick();
    let mut toggles = 0;
    for round in 0..200u64 {
        if round % 3 == 0 {
            rig.wr(STATUS, 0);
            rig.used_seen = 0;
            assert!(rig.handshake(u64::MAX));
        } else {
            rig.wr(QUEUE_READY, 0);
            rig.wr(QUEUE_READY, 1);
            // The re-enabled queue starts its used ring over.
            rig.used_seen = 0;
        }
        toggles += 1;
        rig.kick();
        assert!(rig.be.pending() <= 3, "round {round}: the backend holds {} requests", rig.be.pending());
        assert!(rig.dev.in_flight_bytes() <= budget, "round {round}");
        // Time passes (a fifth of the service time a round).
        rig.now += 200_000;
        rig.poll();
        rig.used();
    }
    assert!(toggles > 100);
    let c = rig.dev.counters().clone();
    // Reads were admitted as the backend finished them, not more.
    assert!(c.reads >= 100 && c.reads <= 3 * (rig.now / 1_000_000 + 1), "{c:?}");
    assert!(c.in_flight_bytes_hwm <= budget);
    assert!(c.orphaned > 50 && c.stalls > 100, "{c:?}");
    // A last QueueReady = 0 orphans what is left; its completions write
    // nothing (no data, no status, no used element).
    rig.wr(QUEUE_READY, 0);
    let snapshot = rig.mem.bytes.clone();
    rig.drain();
    assert!(rig.mem.bytes == snapshot);
    let c = rig.dev.counters().clone();
    assert_eq!((c.in_flight, c.in_flight_bytes), (0, 0));
    assert_eq!(c.completions, c.submitted(), "every request accounted for");
    assert_eq!(c.stale_completions, c.orphaned);
    assert_eq!(c.unknown_completions, 0);
    // Only live completions were answered: each raised exactly one used
    // element (the ring was drained after every round).
    assert_eq!(c.completions - c.stale_completions, c.bytes_read / u64::from(LEN));
}

/// The request bound holds too when requests are small: at most
/// `max_in_flight_requests` held, orphans included.
#[test]
fn virtio_request_budget_counts_orphans() {
    let mut cfg = BlkConfig::new(DISK_SECTORS, false);
    cfg.max_in_flight_requests = 4;
    let mut rig = rig_with(cfg, 1_000_000, false);
    // Five chains of three descriptors fill the rig's 16-entry table.
    for i in 0..5u64 {
        let h = rig.header(T_IN, i);
        let b = rig.alloc(512);
        let st = rig.status_byte();
        let head = rig.chain(&[r(h, 16), w(b, 512), w(st, 1)]);
        rig.offer(head);
    }
    for _ in 0..20 {
        rig.kick();
        assert!(rig.be.pending() <= 4);
        rig.wr(QUEUE_READY, 0);
        rig.wr(QUEUE_READY, 1);
    }
    // Orphans finishing free room: the stalled queue is served again
    // without the guest notifying.
    rig.kick();
    rig.now = 1_000_000;
    rig.poll();
    assert_eq!(rig.be.pending(), 4);
    assert_eq!(rig.dev.orphans(), 0);
    rig.drain();
    assert_eq!(rig.used().len(), 5);
    let c = rig.dev.counters();
    assert_eq!((c.stale_completions, c.orphaned, c.completions), (4, 4, 9));
}

/// A backend that asserts what virtio-drivers asserts (a non-empty,
/// whole-sector transfer), over the RAM disk.
struct StrictBackend(RamBackend);

impl BlockBackend for StrictBackend {
    fn submit(&mut self, req: BackendRequest) -> Result<(), BackendError> {
        match &req.op {
            BackendOp::Read { len, .. } => {
                assert_ne!(*len, 0);
                assert_eq!(*len % 512, 0);
            }
            BackendOp::Write { data, .. } => {
                assert_ne!(data.len(), 0);
                assert_eq!(data.len() % 512, 0);
            }
            BackendOp::Flush => {}
        }
        self.0.submit(req)
    }
}

/// An IN or OUT with no data (header and status only, or with empty data
/// descriptors) is answered IOERR and no backend sees it, and so are the
/// other lengths virtio-drivers cannot take: virtio-drivers'
/// `assert_ne!(buf.len(), 0)` would panic at EL2 and power the machine off.
#[test]
fn virtio_bad_lengths_never_reach_the_backend() {
    let mut rig = rig();
    let mut be = StrictBackend(RamBackend::new(vec![0u8; (DISK_SECTORS * 512) as usize], false, 0));
    let mut submit = |rig: &mut Rig, ds: &[D], st: u64| -> (u32, u8) {
        let head = rig.chain(ds);
        rig.offer(head);
        let fx = rig.dev.mmio_write(QUEUE_NOTIFY, 4, 0, &rig.mem).unwrap();
        let fx = rig.dev.process_queue(fx.notify.unwrap(), &mut rig.mem, &mut be, 0);
        rig.apply(fx);
        for c in be.0.poll(u64::MAX) {
            let fx = rig.dev.complete(&mut rig.mem, c);
            rig.apply(fx);
        }
        let u = rig.used();
        assert_eq!(u.len(), 1);
        (u[0].1, rig.mem.read_u8(st).unwrap())
    };
    let b = rig.alloc(8192);
    let cases = [
        (T_IN, 0, vec![]),                 // header + status only
        (T_OUT, 0, vec![]),                // header + status only
        (T_IN, 0, vec![w(b, 0), w(b, 0)]), // empty data descriptors
        (T_OUT, 0, vec![r(b, 0)]),
        (T_IN, 0, vec![w(b, 100)]), // not whole sectors
        (T_OUT, 0, vec![r(b, 513)]),
        (T_IN, DISK_SECTORS, vec![w(b, 512)]), // past the end
        (T_IN, u64::MAX, vec![w(b, 512)]),     // sector overflow
        (T_OUT, u64::MAX - 7, vec![r(b, 4096)]),
    ];
    for (i, (ty, sector, data)) in cases.into_iter().enumerate() {
        let h = rig.header(ty, sector);
        let st = rig.status_byte();
        let mut ds = vec![r(h, 16)];
        ds.extend(data);
        ds.push(w(st, 1));
        assert_eq!(submit(&mut rig, &ds, st), (1, S_IOERR), "case {i}: type {ty} sector {sector}");
    }
    // Too large for one request (over max_request_bytes): IOERR as well.
    let h = rig.header(T_IN, 0);
    let st = rig.status_byte();
    assert_eq!(submit(&mut rig, &[r(h, 16), w(b, 5 << 20), w(st, 1)], st), (1, S_IOERR));
    let c = rig.dev.counters().clone();
    assert_eq!((c.reads, c.writes, c.io_errors), (0, 0, 10));
    assert_eq!(rig.dev.last_error(), Some(RequestError::TooLarge(5 << 20)));
    // The device still serves a good request.
    let h = rig.header(T_IN, 0);
    let st = rig.status_byte();
    assert_eq!(submit(&mut rig, &[r(h, 16), w(b, 512), w(st, 1)], st), (513, S_OK));
}

#[test]
fn virtio_not_processed_before_driver_ok() {
    let be = RamBackend::new(vec![0u8; 4096], false, 0);
    let mut rig = Rig::new(BlkConfig::new(8, false), be);
    rig.wr(STATUS, status::ACKNOWLEDGE | status::DRIVER);
    rig.wr(DRIVER_FEATURES_SEL, 1);
    rig.wr(DRIVER_FEATURES, 1);
    rig.wr(STATUS, status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
    rig.setup_queue(QSZ, DESC, AVAIL, USED);
    let h = rig.header(T_FLUSH, 0);
    let st = rig.status_byte();
    let head = rig.chain(&[r(h, 16), w(st, 1)]);
    rig.offer(head);
    rig.kick();
    assert!(rig.used().is_empty());
    rig.wr(STATUS, status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK);
    rig.kick();
    rig.drain();
    assert_eq!(rig.used(), vec![(u32::from(head), 1)]);
}

#[test]
fn virtio_backend_errors_become_ioerr() {
    struct Failing;
    impl BlockBackend for Failing {
        fn submit(&mut self, _: BackendRequest) -> Result<(), BackendError> {
            Err(BackendError::Io)
        }
    }
    let mut rig = rig();
    let h = rig.header(T_FLUSH, 0);
    let st = rig.status_byte();
    let head = rig.chain(&[r(h, 16), w(st, 1)]);
    rig.offer(head);
    let fx = rig.dev.mmio_write(QUEUE_NOTIFY, 4, 0, &rig.mem).unwrap();
    assert_eq!(fx.notify, Some(0));
    let _ = rig.dev.process_queue(0, &mut rig.mem, &mut Failing, 0);
    assert_eq!(rig.used(), vec![(u32::from(head), 1)]);
    assert_eq!(rig.mem.read_u8(st).unwrap(), S_IOERR);
    // Completion with an error or the wrong amount of data.
    let mut rig = rig_with(BlkConfig::new(DISK_SECTORS, false), 10, false);
    for result in [Err(BackendError::Io), Ok(vec![0u8; 100].into())] {
        let h = rig.header(T_IN, 0);
        let b = rig.alloc(512);
        let st = rig.status_byte();
        let head = rig.chain(&[r(h, 16), w(b, 512), w(st, 1)]);
        rig.offer(head);
        rig.kick();
        let mut cs = rig.be.poll(u64::MAX);
        assert_eq!(cs.len(), 1);
        cs[0].result = result;
        let fx = rig.dev.complete(&mut rig.mem, cs.pop().unwrap());
        rig.apply(fx);
        assert_eq!(rig.used(), vec![(u32::from(head), 1)]);
        assert_eq!(rig.mem.read_u8(st).unwrap(), S_IOERR);
    }
    // A completion for a token the device never issued.
    let fx = rig.dev.complete(&mut rig.mem, Completion { token: 999_999, result: Ok(DataBuf::new()) });
    assert_eq!(fx, Effects::default());
    assert_eq!(rig.dev.counters().backend_errors, 2);
}

// ----------------------------------------------------------------- garbage

/// Random register writes, ring contents and completions; the device must
/// never panic, never exceed its in-flight bound, and never write outside
/// guest RAM (VecMemory would refuse, and the fake counts such attempts).
fn garbage_run(seed: u64, rounds: usize) {
    let mut x = Xorshift(seed | 1);
    let mut rig = rig_with(BlkConfig::new(DISK_SECTORS, false), 500, false);
    for round in 0..rounds {
        match x.below(10) {
            0 => garbage_register_access(&mut rig, &mut x),
            1 => {
                // Re-handshake (the garbage may have reset the device).
                if x.below(4) == 0 {
                    rig.used_seen = 0;
                    rig.avail_idx = 0;
                    rig.handshake(x.next() | features::VERSION_1);
                }
            }
            2..=4 => garbage_ring_contents(&mut rig, &mut x),
            5..=6 => {
                // Offer heads (or scribble the avail index) and kick.
                if x.below(8) == 0 {
                    rig.avail_idx = x.next() as u16;
                    let _ = rig.mem.write_u16(AVAIL + 2, rig.avail_idx);
                } else {
                    for _ in 0..=x.below(4) {
                        let head = x.below(u64::from(QSZ) + 1) as u16;
                        rig.offer(head);
                    }
                }
                if x.below(8) == 0 {
                    let _ = rig.mem.write_u16(AVAIL, x.below(2) as u16);
                }
                rig.kick();
            }
            7 => {
                // Time passes.
                rig.now += x.below(1000);
                rig.poll();
            }
            8 => {
                let _ = rig.used();
                if rig.irq {
                    rig.ack_irq();
                }
            }
            _ => {
                // A completion for a random token.
                let fx = rig.dev.complete(
                    &mut rig.mem,
                    Completion { token: x.below(64), result: Ok(vec![0; x.below(3) as usize * 512].into()) },
                );
                rig.apply(fx);
            }
        }
        let qsize = rig.dev.transport().queues[0].size.max(1) as usize;
        let cfg = rig.dev.config();
        assert!(rig.dev.in_flight() - rig.dev.orphans() <= qsize.max(QSZ as usize), "round {round}");
        assert!(rig.dev.in_flight() <= cfg.max_in_flight_requests, "round {round}");
        assert!(
            rig.dev.in_flight_bytes() <= cfg.max_in_flight_bytes.max(u64::from(cfg.max_request_bytes)),
            "round {round}"
        );
        assert_eq!(rig.irq, rig.dev.irq_level());
    }
    rig.drain();
}

/// The garbage run's register write (sometimes with a bad size or offset)
/// and a read anywhere in or just past the frame.
fn garbage_register_access(rig: &mut Rig, x: &mut Xorshift) {
    const OFFSETS: [u64; 16] = [
        DEVICE_FEATURES_SEL,
        DRIVER_FEATURES,
        DRIVER_FEATURES_SEL,
        QUEUE_SEL,
        QUEUE_NUM,
        QUEUE_READY,
        QUEUE_NOTIFY,
        INTERRUPT_ACK,
        STATUS,
        QUEUE_DESC_LOW,
        QUEUE_DESC_HIGH,
        QUEUE_DRIVER_LOW,
        QUEUE_DRIVER_HIGH,
        QUEUE_DEVICE_LOW,
        QUEUE_DEVICE_HIGH,
        CONFIG,
    ];
    let off = if x.below(4) == 0 { x.below(FRAME_SIZE + 16) } else { OFFSETS[x.below(OFFSETS.len() as u64) as usize] };
    let size = [1u8, 2, 4, 4, 4, 8][x.below(6) as usize];
    let v = match x.below(3) {
        0 => x.next(),
        1 => x.below(64),
        _ => [0, 1, 0xf, QSZ as u64, DESC, AVAIL, USED][x.below(7) as usize],
    };
    if let Ok(fx) = rig.dev.mmio_write(off, size, v, &rig.mem) {
        rig.apply(fx);
    }
    let _ = rig.dev.mmio_read(x.below(FRAME_SIZE + 16), size);
}

/// The garbage run's ring contents: random descriptors (biased towards
/// plausible values) in the table or the indirect table, and a random
/// request header in the buffer area.
fn garbage_ring_contents(rig: &mut Rig, x: &mut Xorshift) {
    for _ in 0..x.below(8) {
        let i = x.below(u64::from(QSZ) + 2) as u16;
        let addr = match x.below(4) {
            0 => x.next(),
            1 => RAM + x.below(RAM_SIZE as u64 + 64),
            _ => BUF + x.below(0x4000),
        };
        let len = match x.below(4) {
            0 => x.next() as u32,
            1 => 16,
            2 => 1,
            _ => 512 * x.below(9) as u32,
        };
        let flags = x.below(8) as u16;
        let next = x.below(u64::from(QSZ) + 2) as u16;
        let table = if x.below(4) == 0 { INDIRECT } else { DESC };
        let _ = rig.mem.write_u64(table + 16 * u64::from(i), addr);
        let _ = rig.mem.write_u32(table + 16 * u64::from(i) + 8, len);
        let _ = rig.mem.write_u16(table + 16 * u64::from(i) + 12, flags);
        let _ = rig.mem.write_u16(table + 16 * u64::from(i) + 14, next);
    }
    let at = (BUF + x.below(0x4000)) & !15;
    let _ = rig.mem.write_u32(at, [T_IN, T_OUT, T_FLUSH, T_GET_ID, x.next() as u32][x.below(5) as usize]);
    let _ = rig.mem.write_u64(at + 8, if x.below(2) == 0 { x.below(DISK_SECTORS + 4) } else { x.next() });
}

#[test]
fn virtio_randomized_garbage() {
    for seed in 1..=40u64 {
        garbage_run(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 2_000);
    }
}

/// The long version (run with `cargo test -p hv-core virtio -- --ignored`).
#[test]
#[ignore]
fn virtio_randomized_garbage_long() {
    let seeds: u64 = option_env!("VIRTIO_GARBAGE_SEEDS").and_then(|s| s.parse().ok()).unwrap_or(2_000);
    for seed in 1..=seeds {
        garbage_run(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 20_000);
    }
}

#[test]
fn virtio_random_rings_against_a_valid_setup() {
    // Whole-ring garbage: random bytes over the descriptor table, the avail
    // ring and the indirect table, then process. Exercises the walker on
    // arbitrary input with a validly configured queue.
    let mut x = Xorshift(77);
    for _ in 0..300 {
        let mut rig = rig();
        let mut junk = vec![0u8; 0x1000];
        x.fill(&mut junk);
        rig.mem.write(DESC, &junk[..16 * QSZ as usize]).unwrap();
        x.fill(&mut junk);
        rig.mem.write(INDIRECT, &junk).unwrap();
        x.fill(&mut junk);
        rig.mem.write(AVAIL + 4, &junk[..2 * QSZ as usize]).unwrap();
        let n = x.below(u64::from(QSZ) + 1) as u16;
        rig.mem.write_u16(AVAIL + 2, n).unwrap();
        rig.kick();
        rig.drain();
        let used = rig.used();
        // Every chain comes back, unless a malformed request made the
        // device stop (no NeedsReset with the default policy).
        assert_eq!(used.len(), usize::from(n));
        assert_eq!(rig.rd(STATUS) & status::DEVICE_NEEDS_RESET, 0);
    }
}

// ------------------------------------------------------------------- quota

/// A device charging `quota`, requests of at most 64 KiB (so the floor, one
/// such request, is small), behind a RAM disk with `latency_ns`.
fn quota_rig(quota: &alloc::sync::Arc<crate::quota::Quota>, latency_ns: u64) -> Rig {
    let mut cfg = BlkConfig::new(DISK_SECTORS, false);
    cfg.max_request_bytes = 64 << 10;
    let be = RamBackend::new(vec![0u8; (DISK_SECTORS * 512) as usize], false, latency_ns);
    let mut rig = Rig::new(cfg.clone(), be);
    rig.dev = VirtioBlk::with_quota(cfg, quota.clone()).unwrap();
    assert!(rig.handshake(u64::MAX));
    rig
}

/// The floor a [`quota_rig`] device charges when it is made.
fn quota_floor() -> u64 {
    request_cost((64 << 10) + 17, 128, 64 << 10)
}

#[test]
fn virtio_quota_back_pressure_then_everything_completes() {
    let one = request_cost((64 << 10) + 17, 3, 64 << 10);
    // Room for the floor and two more 64 KiB writes.
    let quota = alloc::sync::Arc::new(crate::quota::Quota::new(quota_floor() + 2 * one));
    let mut rig = quota_rig(&quota, 1000);
    assert_eq!(quota.used(), quota_floor(), "the largest request is charged once, up front");
    let mut sts = Vec::new();
    for i in 0..5u64 {
        // 15 of the queue's 16 descriptors
        let h = rig.header(T_OUT, i * 128);
        let b = rig.alloc(64 << 10);
        rig.mem.write(b, &vec![i as u8 + 1; 64 << 10]).unwrap();
        let st = rig.status_byte();
        let head = rig.chain(&[r(h, 16), r(b, 64 << 10), w(st, 1)]);
        rig.offer(head);
        sts.push(st);
    }
    rig.kick();
    // The first fits the floor, two more the quota; the rest wait in the ring.
    assert_eq!(rig.dev.in_flight(), 3);
    assert_eq!(rig.dev.transport().queues[0].last_avail(), 3);
    assert!(quota.used() <= quota.limit() && quota.used() + one > quota.limit(), "{quota:?}");
    let c = rig.dev.counters();
    assert_eq!((c.stalls, c.quota_stalls), (1, 1));
    assert_eq!(quota.refused(), 1);
    rig.drain();
    assert_eq!(rig.used().len(), 5);
    assert!(sts.iter().all(|&s| rig.mem.read_u8(s).unwrap() == S_OK));
    for i in 0..5usize {
        let sector = &rig.be.image()[i * (64 << 10)..(i + 1) * (64 << 10)];
        assert!(sector.iter().all(|&b| b == i as u8 + 1), "write {i} reached the disk");
    }
    assert_eq!(quota.used(), quota_floor(), "every request gave its charge back");
    assert!(quota.high_water() <= quota.limit());
}

#[test]
fn virtio_quota_covers_reads_and_answers_given_at_once() {
    let quota = alloc::sync::Arc::new(crate::quota::Quota::new(quota_floor() + (64 << 10)));
    let mut rig = quota_rig(&quota, 0);
    rig.write(0, &[0x5a; 4096], 1);
    let (_, st, data) = rig.read(0, 4096, 4);
    assert_eq!((st, data.iter().all(|&b| b == 0x5a)), (S_OK, true));
    // Requests answered without the backend (GET_ID, bad ones) give their
    // charge back at once.
    let (_, st) = rig.write(u64::MAX / 512, &[0; 512], 1);
    assert_eq!(st, S_IOERR);
    assert_eq!(quota.used(), quota_floor());
    assert_eq!(rig.dev.counters().quota_stalls, 0);
}

#[test]
fn virtio_quota_resets_cannot_pile_up_orphans() {
    // A guest that submits, resets and submits again: orphans keep their
    // charge until the backend is done with them, so the quota still holds.
    let one = request_cost((64 << 10) + 17, 3, 64 << 10);
    let quota = alloc::sync::Arc::new(crate::quota::Quota::new(quota_floor() + one));
    let mut rig = quota_rig(&quota, 1_000_000);
    for round in 0..4u64 {
        for i in 0..4u64 {
            let h = rig.header(T_OUT, i * 128);
            let b = rig.alloc(64 << 10);
            let st = rig.status_byte();
            let head = rig.chain(&[r(h, 16), r(b, 64 << 10), w(st, 1)]);
            rig.offer(head);
        }
        rig.kick();
        assert!(quota.used() <= quota.limit(), "round {round}");
        assert!(rig.dev.in_flight() <= 2, "round {round}: {}", rig.dev.in_flight());
        // Reset and set the queue up again, as a driver would.
        rig.used_seen = 0;
        rig.avail_idx = 0;
        assert!(rig.handshake(u64::MAX));
    }
    rig.drain();
    assert_eq!(rig.dev.in_flight(), 0);
    assert_eq!(quota.used(), quota_floor());
}

#[test]
fn virtio_quota_too_small_for_one_request_is_refused_up_front() {
    let cfg = BlkConfig::new(DISK_SECTORS, false);
    let quota = alloc::sync::Arc::new(crate::quota::Quota::new(1 << 20));
    let e = VirtioBlk::with_quota(cfg, quota.clone()).err().unwrap();
    assert!(e.needed > 4 << 20 && e.limit == 1 << 20, "{e:?}");
    assert_eq!(quota.used(), 0);
}

#[test]
fn virtio_request_cost_bounds_what_a_request_allocates() {
    // Whatever the chain, the charge covers the data buffer and the
    // writable segments kept for the completion.
    let mut x = crate::testrng::Rng(7);
    for _ in 0..10_000 {
        let max = 4u32 << 20;
        let bytes = x.below(6 << 20);
        let nsegs = 1 + x.below(128) as usize;
        let data_len = (bytes.min(u64::from(max)) / 512 * 512) as usize;
        let segs = crate::quota::heap_cost(nsegs * core::mem::size_of::<super::queue::Segment>(), 8);
        assert!(request_cost(bytes, nsegs, max) >= DataBuf::cost(data_len) + segs, "{bytes} {nsegs}");
    }
}
