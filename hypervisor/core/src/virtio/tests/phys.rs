//! Host tests of the physical-disk driver ([`PhysDisk`]): the real
//! `virtio-drivers` virtqueue against a fake virtio-blk device that reads the
//! split rings the way a device does (virtio 1.2 §2.7) and finishes requests
//! only when, and in the order, a test says so.

use super::super::phys::{PhysDisk, MAX_TRANSFER, QUEUE_SIZE};
use super::*;
use alloc::rc::Rc;
use core::cell::RefCell;
use core::ptr::NonNull;
use virtio_drivers::transport::{DeviceStatus, DeviceType, InterruptStatus, Transport};
use virtio_drivers::{BufferDirection, Hal, PhysAddr};
use zerocopy::FromBytes;

const F_RO: u64 = 1 << 5;
const F_FLUSH: u64 = 1 << 9;
const F_INDIRECT: u64 = 1 << 28;
const F_VERSION_1: u64 = 1 << 32;
const PHYS_SECTORS: u64 = 4096; // 2 MiB

/// DMA from the host heap; a "physical" address is the host pointer.
struct HostHal;

// SAFETY: dma_alloc returns zeroed, page-aligned memory that stays allocated
// until dma_dealloc; the fake device uses the addresses as host pointers, so
// physical == virtual, as the trait requires of `share`.
unsafe impl Hal for HostHal {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        let layout = std::alloc::Layout::from_size_align(pages * 4096, 4096).unwrap();
        // SAFETY: non-zero size.
        let p = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).expect("host allocation");
        (p.as_ptr() as PhysAddr, p)
    }
    unsafe fn dma_dealloc(_paddr: PhysAddr, vaddr: NonNull<u8>, pages: usize) -> i32 {
        let layout = std::alloc::Layout::from_size_align(pages * 4096, 4096).unwrap();
        // SAFETY: allocated by dma_alloc with this layout.
        unsafe { std::alloc::dealloc(vaddr.as_ptr(), layout) };
        0
    }
    unsafe fn mmio_phys_to_virt(_paddr: PhysAddr, _size: usize) -> NonNull<u8> {
        unreachable!("the fake transport has no MMIO")
    }
    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        buffer.as_ptr() as *mut u8 as PhysAddr
    }
    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {}
}

/// One chain the fake device took from the avail ring.
#[derive(Clone, Debug)]
struct Chain {
    head: u16,
    segs: Vec<(u64, u32, bool)>,
}

/// The fake device's state, shared by its transport (owned by the driver)
/// and the test.
struct Dev {
    features: u64,
    status: u32,
    driver_features: u64,
    /// (size, descriptor table, avail ring, used ring).
    queue: Option<(u32, u64, u64, u64)>,
    last_avail: u16,
    used_idx: u16,
    notifies: u32,
    irq: bool,
    disk: Vec<u8>,
    flushes: u32,
}

// The device reads and writes the rings and buffers the driver shared with
// it, by address (HostHal: address == host pointer). Every address comes
// from the driver's queue or from a chain it made available and has not
// popped, so it points into live memory the driver shared for this purpose.
fn dev_read(addr: u64, buf: &mut [u8]) {
    // SAFETY: see above.
    unsafe { core::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), buf.len()) }
}
fn dev_write(addr: u64, buf: &[u8]) {
    // SAFETY: see above.
    unsafe { core::ptr::copy_nonoverlapping(buf.as_ptr(), addr as *mut u8, buf.len()) }
}
fn dev_u16(addr: u64) -> u16 {
    let mut b = [0; 2];
    dev_read(addr, &mut b);
    u16::from_le_bytes(b)
}

impl Dev {
    fn new(features: u64) -> Rc<RefCell<Dev>> {
        Rc::new(RefCell::new(Dev {
            features,
            status: 0,
            driver_features: 0,
            queue: None,
            last_avail: 0,
            used_idx: 0,
            notifies: 0,
            irq: false,
            disk: vec![0; (PHYS_SECTORS * 512) as usize],
            flushes: 0,
        }))
    }

    /// Takes every chain the driver made available.
    fn fetch(&mut self) -> Vec<Chain> {
        let (size, desc, avail, _) = self.queue.expect("queue set up");
        let idx = dev_u16(avail + 2);
        let mut out = Vec::new();
        while self.last_avail != idx {
            let head = dev_u16(avail + 4 + 2 * u64::from(u32::from(self.last_avail) % size));
            self.last_avail = self.last_avail.wrapping_add(1);
            out.push(Chain { head, segs: walk(desc, head) });
        }
        out
    }

    /// Does what the chain asks, writes its status and returns it in the
    /// used ring.
    fn finish(&mut self, c: &Chain, status: u8) {
        let mut hdr = [0u8; 16];
        assert_eq!(c.segs[0].1, 16, "the header is its own buffer");
        dev_read(c.segs[0].0, &mut hdr);
        let ty = u32::from_le_bytes(hdr[..4].try_into().unwrap());
        let at = u64::from_le_bytes(hdr[8..].try_into().unwrap()) as usize * 512;
        let (last, data) = c.segs[1..].split_last().unwrap();
        assert!(last.2 && last.1 == 1, "the status byte is the last buffer");
        let mut written = 1;
        for &(addr, len, w) in data {
            let len = len as usize;
            match ty {
                T_IN => {
                    assert!(w);
                    dev_write(addr, &self.disk[at..at + len]);
                    written += len as u32;
                }
                T_OUT => {
                    assert!(!w);
                    let mut b = vec![0; len];
                    dev_read(addr, &mut b);
                    self.disk[at..at + len].copy_from_slice(&b);
                }
                other => panic!("unexpected data for request type {other}"),
            }
        }
        if ty == T_FLUSH {
            self.flushes += 1;
        }
        dev_write(last.0, &[status]);
        self.push_used(c.head, written);
    }

    fn push_used(&mut self, id: u16, len: u32) {
        let (size, _, _, used) = self.queue.unwrap();
        let slot = u64::from(u32::from(self.used_idx) % size);
        let mut e = [0u8; 8];
        e[..4].copy_from_slice(&u32::from(id).to_le_bytes());
        e[4..].copy_from_slice(&len.to_le_bytes());
        dev_write(used + 4 + 8 * slot, &e);
        self.used_idx = self.used_idx.wrapping_add(1);
        dev_write(used + 2, &self.used_idx.to_le_bytes());
        self.irq = true;
    }
}

/// The buffers of the chain at `head`, through an indirect table if any.
fn walk(desc: u64, head: u16) -> Vec<(u64, u32, bool)> {
    let read = |table: u64, i: u16| {
        let mut b = [0u8; 16];
        dev_read(table + 16 * u64::from(i), &mut b);
        let addr = u64::from_le_bytes(b[..8].try_into().unwrap());
        let len = u32::from_le_bytes(b[8..12].try_into().unwrap());
        let flags = u16::from_le_bytes(b[12..14].try_into().unwrap());
        (addr, len, flags, u16::from_le_bytes(b[14..].try_into().unwrap()))
    };
    let (mut table, mut i) = (desc, head);
    let mut segs = Vec::new();
    loop {
        let (addr, len, flags, next) = read(table, i);
        if flags & DESC_F_INDIRECT != 0 {
            table = addr;
            i = 0;
            continue;
        }
        assert_ne!(len, 0, "an empty buffer reached the device");
        segs.push((addr, len, flags & DESC_F_WRITE != 0));
        if flags & DESC_F_NEXT == 0 {
            return segs;
        }
        i = next;
    }
}

struct FakeTransport(Rc<RefCell<Dev>>);

impl Transport for FakeTransport {
    fn device_type(&self) -> DeviceType {
        DeviceType::Block
    }
    fn read_device_features(&mut self) -> u64 {
        self.0.borrow().features
    }
    fn write_driver_features(&mut self, f: u64) {
        self.0.borrow_mut().driver_features = f;
    }
    fn max_queue_size(&mut self, _queue: u16) -> u32 {
        QUEUE_SIZE as u32
    }
    fn notify(&mut self, _queue: u16) {
        self.0.borrow_mut().notifies += 1;
    }
    fn get_status(&self) -> DeviceStatus {
        DeviceStatus::from_bits_truncate(self.0.borrow().status)
    }
    fn set_status(&mut self, s: DeviceStatus) {
        let mut d = self.0.borrow_mut();
        d.status = s.bits();
        if s.is_empty() {
            d.queue = None;
            d.last_avail = 0;
            d.used_idx = 0;
        }
    }
    fn set_guest_page_size(&mut self, _size: u32) {}
    fn requires_legacy_layout(&self) -> bool {
        false
    }
    fn queue_set(&mut self, _queue: u16, size: u32, desc: PhysAddr, driver: PhysAddr, device: PhysAddr) {
        self.0.borrow_mut().queue = Some((size, desc, driver, device));
    }
    fn queue_unset(&mut self, _queue: u16) {
        self.0.borrow_mut().queue = None;
    }
    fn queue_used(&mut self, _queue: u16) -> bool {
        self.0.borrow().queue.is_some()
    }
    fn ack_interrupt(&mut self) -> InterruptStatus {
        let was = core::mem::replace(&mut self.0.borrow_mut().irq, false);
        if was {
            InterruptStatus::QUEUE_INTERRUPT
        } else {
            InterruptStatus::empty()
        }
    }
    fn read_config_generation(&self) -> u32 {
        0
    }
    fn read_config_space<T: FromBytes>(&self, offset: usize) -> Result<T, virtio_drivers::Error> {
        let cfg = PHYS_SECTORS.to_le_bytes();
        cfg.get(offset..offset + size_of::<T>())
            .and_then(|b| T::read_from_bytes(b).ok())
            .ok_or(virtio_drivers::Error::ConfigSpaceTooSmall)
    }
    fn write_config_space<T>(&mut self, _offset: usize, _value: T) -> Result<(), virtio_drivers::Error> {
        Ok(())
    }
}

type Disk = PhysDisk<HostHal, FakeTransport>;

fn phys(features: u64) -> (Disk, Rc<RefCell<Dev>>) {
    let dev = Dev::new(features);
    let d = PhysDisk::new(FakeTransport(dev.clone())).expect("driver init");
    (d, dev)
}

fn req(token: u64, op: BackendOp) -> BackendRequest {
    BackendRequest { token, op, submit_ns: 0 }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add((i * 7 % 251) as u8)).collect()
}

#[test]
fn phys_init_negotiates_and_reads_capacity() {
    let (d, dev) = phys(F_VERSION_1 | F_FLUSH | F_INDIRECT | F_RO | (1 << 29));
    assert_eq!(d.capacity_sectors(), PHYS_SECTORS);
    assert!(d.read_only());
    let dev = dev.borrow();
    // EVENT_IDX (bit 29) is not taken.
    assert_eq!(dev.driver_features, F_VERSION_1 | F_FLUSH | F_INDIRECT | F_RO);
    assert_eq!(
        dev.status,
        (DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER | DeviceStatus::FEATURES_OK | DeviceStatus::DRIVER_OK).bits()
    );
    assert!(dev.queue.is_some());
}

/// A FLUSH among other requests in flight. virtio-drivers'
/// `VirtIOBlk::flush` (which the backend does not call) spins until the next used
/// element and pops it as its own: here it would spin forever (the fake
/// device finishes nothing on its own), and on a real device it fails with
/// WrongToken when another request finishes first, never recycles its
/// descriptors and stalls `poll` at that entry. Every request is
/// submitted without waiting and every completion comes back.
#[test]
fn phys_flush_among_in_flight_requests_loses_nothing() {
    let (mut d, dev) = phys(F_VERSION_1 | F_FLUSH | F_INDIRECT);
    let a = pattern(1, 4096);
    let b = pattern(2, 8192);
    dev.borrow_mut().disk[512 * 100..512 * 108].copy_from_slice(&pattern(3, 4096));
    d.submit(req(1, BackendOp::Write { sector: 0, data: a.clone().into() })).unwrap();
    d.submit(req(2, BackendOp::Write { sector: 8, data: b.clone().into() })).unwrap();
    d.submit(req(3, BackendOp::Flush)).unwrap();
    d.submit(req(4, BackendOp::Read { sector: 100, len: 4096 })).unwrap();
    // Submitting did not wait for anything.
    assert_eq!(d.in_flight(), 4);
    assert!(d.poll().is_empty());
    let chains = dev.borrow_mut().fetch();
    assert_eq!(chains.len(), 4);
    assert!(dev.borrow().notifies >= 1);
    // The device finishes them in another order: flush first, then the
    // read, then the writes in reverse.
    let mut seen = Vec::new();
    for i in [2usize, 3, 1, 0] {
        dev.borrow_mut().finish(&chains[i], S_OK);
        let done = d.poll();
        assert_eq!(done.len(), 1, "one completion per finished request");
        seen.push(done[0].clone());
    }
    assert_eq!(seen.iter().map(|c| c.token).collect::<Vec<_>>(), vec![3, 4, 2, 1]);
    assert_eq!(seen[0].result, Ok(DataBuf::new()));
    assert_eq!(seen[1].result, Ok(pattern(3, 4096).into()));
    assert!(seen[2..].iter().all(|c| c.result == Ok(DataBuf::new())));
    assert_eq!(dev.borrow().flushes, 1);
    assert_eq!(&dev.borrow().disk[..4096], &a[..]);
    assert_eq!(&dev.borrow().disk[8 * 512..8 * 512 + 8192], &b[..]);
    assert_eq!(d.in_flight(), 0);

    // Every descriptor came back: the queue takes QUEUE_SIZE requests again,
    // flushes interleaved, completed in reverse.
    for t in 0..QUEUE_SIZE as u64 {
        let op = if t % 4 == 3 { BackendOp::Flush } else { BackendOp::Read { sector: t * 8, len: 4096 } };
        d.submit(req(100 + t, op)).unwrap();
    }
    assert_eq!(d.free_slots(), 0);
    assert_eq!(d.submit(req(999, BackendOp::Flush)), Err(BackendError::Busy));
    let chains = dev.borrow_mut().fetch();
    assert_eq!(chains.len(), QUEUE_SIZE);
    for c in chains.iter().rev() {
        dev.borrow_mut().finish(c, S_OK);
    }
    let mut tokens: Vec<u64> = d.poll().into_iter().map(|c| c.token).collect();
    tokens.sort();
    assert_eq!(tokens, (100..100 + QUEUE_SIZE as u64).collect::<Vec<_>>());
    assert_eq!(dev.borrow().flushes, 1 + QUEUE_SIZE as u32 / 4);
}

/// Bad lengths at the backend: what virtio-drivers would assert on (an
/// empty buffer) or what the device cannot do never reaches the queue.
#[test]
fn phys_rejects_what_would_reach_a_virtio_drivers_assert() {
    let (mut d, dev) = phys(F_VERSION_1 | F_FLUSH | F_INDIRECT);
    let bad = [
        (BackendOp::Read { sector: 0, len: 0 }, BackendError::Io),
        (BackendOp::Write { sector: 0, data: Vec::new().into() }, BackendError::Io),
        (BackendOp::Read { sector: 0, len: 100 }, BackendError::Io),
        (BackendOp::Write { sector: 0, data: vec![0; 513].into() }, BackendError::Io),
        (BackendOp::Read { sector: 0, len: (MAX_TRANSFER + 512) as u32 }, BackendError::Io),
        (BackendOp::Read { sector: PHYS_SECTORS - 1, len: 1024 }, BackendError::OutOfRange),
        (BackendOp::Read { sector: PHYS_SECTORS, len: 512 }, BackendError::OutOfRange),
        (BackendOp::Read { sector: u64::MAX, len: 512 }, BackendError::OutOfRange),
        (BackendOp::Write { sector: u64::MAX - 1, data: vec![0; 4096].into() }, BackendError::OutOfRange),
    ];
    for (i, (op, e)) in bad.into_iter().enumerate() {
        assert_eq!(d.submit(req(i as u64, op.clone())), Err(e), "{op:?}");
    }
    assert_eq!(d.in_flight(), 0);
    assert!(dev.borrow_mut().fetch().is_empty(), "nothing reached the device");
    // The last sector is fine.
    d.submit(req(50, BackendOp::Read { sector: PHYS_SECTORS - 1, len: 512 })).unwrap();
    let c = dev.borrow_mut().fetch();
    dev.borrow_mut().finish(&c[0], S_OK);
    assert_eq!(d.poll(), vec![Completion { token: 50, result: Ok(vec![0; 512].into()) }]);

    // Read-only devices refuse writes before the queue.
    let (mut ro, dev) = phys(F_VERSION_1 | F_RO);
    assert_eq!(
        ro.submit(req(1, BackendOp::Write { sector: 0, data: vec![1; 512].into() })),
        Err(BackendError::ReadOnly)
    );
    assert!(dev.borrow_mut().fetch().is_empty());
}

#[test]
fn phys_without_indirect_or_flush_feature() {
    let (mut d, dev) = phys(F_VERSION_1);
    // Without indirect descriptors a request may take the header, up to 14
    // data chunks and the status: the sixteen descriptors hold one at a time.
    let data: Vec<u8> = (0..(2 << 20) - 512).map(|i| (i % 253) as u8).collect();
    d.submit(req(0, BackendOp::Write { sector: 0, data: data.clone().into() })).unwrap();
    assert_eq!(d.free_slots(), 0);
    assert_eq!(d.submit(req(5, BackendOp::Read { sector: 0, len: 512 })), Err(BackendError::Busy));
    // FLUSH without the feature: nothing to flush, completed without the
    // device (and without a free slot).
    d.submit(req(6, BackendOp::Flush)).unwrap();
    assert!(d.has_ready());
    let first = d.poll();
    assert_eq!(first, vec![Completion { token: 6, result: Ok(DataBuf::new()) }]);
    let chains = dev.borrow_mut().fetch();
    assert_eq!(chains.len(), 1);
    assert_eq!(chains[0].segs.len(), 14, "header, 12 chunks, status");
    dev.borrow_mut().finish(&chains[0], S_OK);
    assert_eq!(d.poll(), vec![Completion { token: 0, result: Ok(DataBuf::new()) }]);
    // A device error becomes Io.
    d.submit(req(1, BackendOp::Read { sector: 0, len: 512 })).unwrap();
    let chains = dev.borrow_mut().fetch();
    assert_eq!(chains[0].segs.len(), 3);
    dev.borrow_mut().finish(&chains[0], S_IOERR);
    assert_eq!(d.poll(), vec![Completion { token: 1, result: Err(BackendError::Io) }]);
}

#[test]
fn phys_unknown_used_entry_fails_in_flight_requests_once() {
    let (mut d, dev) = phys(F_VERSION_1 | F_FLUSH | F_INDIRECT);
    d.submit(req(1, BackendOp::Read { sector: 0, len: 512 })).unwrap();
    d.submit(req(2, BackendOp::Flush)).unwrap();
    let _chains = dev.borrow_mut().fetch();
    // A device bug: a used entry for a chain nobody submitted.
    dev.borrow_mut().push_used(9, 0);
    let mut done = d.poll();
    done.sort_by_key(|c| c.token);
    assert_eq!(
        done,
        vec![
            Completion { token: 1, result: Err(BackendError::Io) },
            Completion { token: 2, result: Err(BackendError::Io) }
        ]
    );
    assert!(d.broken());
    assert_eq!(d.submit(req(3, BackendOp::Flush)), Err(BackendError::Io));
    assert!(d.poll().is_empty());
    // Leaked on purpose: the broken device may still write those buffers.
}

/// The guest-facing device over the physical driver, the way fio with
/// libaio at queue depth 8 and fsync=4 drives it: writes, a FLUSH and reads
/// in flight together, finished by the device in a scrambled order. Every
/// request gets its used element and an OK status.
#[test]
fn virtio_blk_over_phys_with_concurrent_flushes() {
    let mut rig = rig();
    let (mut d, dev) = phys(F_VERSION_1 | F_FLUSH | F_INDIRECT);
    let mut sts = Vec::new();
    let mut x = Xorshift(99);
    for round in 0..3u64 {
        let mut heads = Vec::new();
        for i in 0..8u64 {
            let sector = round * 64 + i * 8;
            let (head, st) = if i % 4 == 3 {
                let h = rig.header(T_FLUSH, 0);
                let st = rig.status_byte();
                (rig.chain(&[r(h, 16), w(st, 1)]), st)
            } else if i % 2 == 0 {
                // Header and data in one descriptor (two a request, so
                // eight fit in the rig's 16-entry table).
                let h = rig.alloc(16 + 4096);
                rig.mem.write_u32(h, T_OUT).unwrap();
                rig.mem.write_u64(h + 8, sector).unwrap();
                rig.mem.write(h + 16, &pattern(i as u8, 4096)).unwrap();
                let st = rig.status_byte();
                (rig.chain(&[r(h, 16 + 4096), w(st, 1)]), st)
            } else {
                // Data and status in one descriptor.
                let h = rig.header(T_IN, sector);
                let b = rig.alloc(4097);
                rig.mem.write_u8(b + 4096, 0xff).unwrap();
                (rig.chain(&[r(h, 16), w(b, 4097)]), b + 4096)
            };
            rig.offer(head);
            heads.push(head);
            sts.push(st);
        }
        let fx = rig.dev.mmio_write(QUEUE_NOTIFY, 4, 0, &rig.mem).unwrap();
        assert_eq!(fx.notify, Some(0));
        let _ = rig.dev.process_queue(0, &mut rig.mem, &mut d, 0);
        assert_eq!(rig.dev.in_flight(), 8);
        let mut chains = dev.borrow_mut().fetch();
        assert_eq!(chains.len(), 8);
        // Scramble the device's finishing order.
        for i in (1..chains.len()).rev() {
            chains.swap(i, x.below(i as u64 + 1) as usize);
        }
        for c in &chains {
            dev.borrow_mut().finish(c, S_OK);
            for comp in d.poll() {
                let fx = rig.dev.complete(&mut rig.mem, comp);
                rig.apply(fx);
            }
        }
        let mut used: Vec<u32> = rig.used().into_iter().map(|u| u.0).collect();
        used.sort();
        let mut want: Vec<u32> = heads.iter().map(|&h| u32::from(h)).collect();
        want.sort();
        assert_eq!(used, want, "round {round}: every request came back");
    }
    assert!(sts.iter().all(|&s| rig.mem.read_u8(s).unwrap() == S_OK));
    let c = rig.dev.counters();
    assert_eq!((c.flushes, c.io_errors, c.in_flight), (6, 0, 0));
    assert_eq!(c.completions, c.submitted());
    assert_eq!(dev.borrow().flushes, 6);
}
