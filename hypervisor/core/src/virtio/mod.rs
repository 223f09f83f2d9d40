//! The hypervisor's own virtio-blk device, as a guest sees it: a virtio 1.x
//! device behind the virtio-mmio transport (version 2, "modern"), with one
//! split virtqueue and asynchronous backends.
//!
//! # Layers, one module each
//!
//! * this file: the [`GuestMemory`] trait through which every guest byte is
//!   read or written, little-endian helpers, feature and status constants;
//! * [`queue`]: the split virtqueue (available ring, descriptor chains with
//!   indirect tables, used ring) — validation of everything the guest wrote;
//! * [`mmio`]: the virtio-mmio register file (magic, features, status
//!   handshake, queue setup, interrupt status/ack, config space window);
//! * [`buf`]: [`DataBuf`], request data split so the buddy heap takes no
//!   more than its length;
//! * [`blk`]: virtio-blk request parsing and the device ([`VirtioBlk`]) that
//!   ties the transport, the queue and a [`BlockBackend`] together, plus the
//!   device counters;
//! * [`ram`]: [`RamBackend`], a disk image in memory that completes every
//!   request after a fixed service time;
//! * [`phys`]: [`phys::PhysDisk`], a physical virtio-blk device driven through
//!   `virtio-drivers`' virtqueue, every request (FLUSH included) without
//!   waiting.
//!
//! # Why guest memory is only ever *copied*
//!
//! The guest owns its RAM and can change any byte at any time, from another
//! vCPU, while the device looks at it. So the device never holds a Rust
//! reference into guest memory: it copies descriptors, headers and data in
//! and out through [`GuestMemory::read`] / [`GuestMemory::write`], each value
//! is read exactly once, and every decision is taken on the private copy
//! ("double fetch" bugs cannot happen). Write data is copied out of the guest
//! when the request is submitted, so the guest cannot change what reaches the
//! disk afterwards. Every address is checked by the `GuestMemory`
//! implementation against the VM's RAM: a bad address is an error, never an
//! access.
//!
//! # Asynchronous by design
//!
//! A request's journey: the guest writes QueueNotify → the EL2 code calls
//! [`VirtioBlk::process_queue`] → the request is parsed and handed to
//! [`BlockBackend::submit`] with a token → later (physical device interrupt,
//! or the EL2 timer for the RAM backend) the EL2 code passes the backend's
//! [`Completion`] to [`VirtioBlk::complete`], which copies read data into the
//! guest, writes the status byte, publishes the used element and raises the
//! interrupt. A write is therefore acknowledged to the guest only after the
//! backend reported it done. Requests that need no backend (GET_ID,
//! unsupported types, malformed requests) complete inside `process_queue`.
//!
//! # Memory ordering
//!
//! The driver runs on other CPUs concurrently. The device reads the avail
//! index, then (acquire barrier) the ring entries and descriptors; it writes
//! data and status, the used element, then (barrier) the used index, then
//! (full barrier) reads the avail flags to decide on an interrupt. The
//! barriers are [`GuestMemory::fence`], whose default is
//! `core::sync::atomic::fence(SeqCst)` — `dmb ish` on AArch64, which is the
//! barrier needed against guest vCPUs on other physical CPUs (the guest's RAM
//! is Normal Inner-Shareable memory in both stage 1 and stage 2).
//!
//! # What is not implemented (and not offered)
//!
//! VIRTIO_F_EVENT_IDX (the device honours VIRTQ_AVAIL_F_NO_INTERRUPT instead
//! and the driver always notifies), packed rings, multiqueue, discard and
//! write-zeroes, the writeback-cache toggle (the device is write-through:
//! FLUSH is still passed to the backend so a physical device's cache is
//! flushed), VIRTIO_F_NOTIFICATION_DATA and queue reset.

pub mod blk;
pub mod buf;
pub mod mmio;
pub mod phys;
pub mod queue;
pub mod ram;

#[cfg(test)]
mod tests;

pub use blk::{
    BackendError, BackendOp, BackendRequest, BadChainPolicy, BlkConfig, BlkCounters, BlockBackend, Completion,
    QuotaTooSmall, VirtioBlk,
};
pub use buf::DataBuf;
pub use mmio::{Effects, MmioError};
pub use ram::RamBackend;

/// An access to guest memory that cannot be done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemError {
    /// `[gpa, gpa + len)` is not entirely inside the guest's RAM (or wraps).
    OutOfRange { gpa: u64, len: u64 },
}

/// The guest's physical memory, as the device may touch it.
///
/// Implementations must check the whole range `[gpa, gpa + buf.len())`
/// against the guest's RAM (with overflow-checked arithmetic) *before*
/// touching any byte, and must not keep references into guest memory.
pub trait GuestMemory {
    /// Copy `buf.len()` bytes from guest physical address `gpa`.
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError>;
    /// Copy `buf` to guest physical address `gpa`.
    fn write(&mut self, gpa: u64, buf: &[u8]) -> Result<(), MemError>;
    /// Whether `[gpa, gpa + len)` is entirely guest RAM (an empty range is
    /// contained when `gpa` itself is a valid RAM address or the RAM end).
    fn contains(&self, gpa: u64, len: u64) -> bool;
    /// A full memory barrier between the device's accesses to guest memory
    /// and the guest's vCPUs. See the module docs for where it is used.
    fn fence(&self) {
        core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
    }
}

/// Little-endian scalar accessors on top of [`GuestMemory`].
pub trait GuestMemoryExt: GuestMemory {
    fn read_u8(&self, gpa: u64) -> Result<u8, MemError> {
        let mut b = [0u8; 1];
        self.read(gpa, &mut b)?;
        Ok(b[0])
    }
    fn read_u16(&self, gpa: u64) -> Result<u16, MemError> {
        let mut b = [0u8; 2];
        self.read(gpa, &mut b)?;
        Ok(u16::from_le_bytes(b))
    }
    fn read_u32(&self, gpa: u64) -> Result<u32, MemError> {
        let mut b = [0u8; 4];
        self.read(gpa, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
    fn read_u64(&self, gpa: u64) -> Result<u64, MemError> {
        let mut b = [0u8; 8];
        self.read(gpa, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    fn write_u8(&mut self, gpa: u64, v: u8) -> Result<(), MemError> {
        self.write(gpa, &[v])
    }
    fn write_u16(&mut self, gpa: u64, v: u16) -> Result<(), MemError> {
        self.write(gpa, &v.to_le_bytes())
    }
    fn write_u32(&mut self, gpa: u64, v: u32) -> Result<(), MemError> {
        self.write(gpa, &v.to_le_bytes())
    }
    fn write_u64(&mut self, gpa: u64, v: u64) -> Result<(), MemError> {
        self.write(gpa, &v.to_le_bytes())
    }
}

impl<T: GuestMemory + ?Sized> GuestMemoryExt for T {}

/// Guest RAM `[base, base + size)` as one byte vector: the host tests' and
/// the fuzzer's guest memory.
#[derive(Clone, Debug)]
pub struct VecMemory {
    pub base: u64,
    pub bytes: alloc::vec::Vec<u8>,
}

impl VecMemory {
    pub fn new(base: u64, size: usize) -> Self {
        Self { base, bytes: alloc::vec![0; size] }
    }

    fn offset(&self, gpa: u64, len: u64) -> Result<usize, MemError> {
        let off = gpa.checked_sub(self.base).ok_or(MemError::OutOfRange { gpa, len })?;
        let end = off.checked_add(len).ok_or(MemError::OutOfRange { gpa, len })?;
        if end > self.bytes.len() as u64 {
            return Err(MemError::OutOfRange { gpa, len });
        }
        Ok(off as usize)
    }
}

impl GuestMemory for VecMemory {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let off = self.offset(gpa, buf.len() as u64)?;
        buf.copy_from_slice(&self.bytes[off..off + buf.len()]);
        Ok(())
    }
    fn write(&mut self, gpa: u64, buf: &[u8]) -> Result<(), MemError> {
        let off = self.offset(gpa, buf.len() as u64)?;
        self.bytes[off..off + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn contains(&self, gpa: u64, len: u64) -> bool {
        self.offset(gpa, len).is_ok()
    }
}

/// Guest RAM that the hypervisor has identity-mapped (VA == host PA) at EL2:
/// the EL2 code's [`GuestMemory`]. Bounds-checked against one RAM region.
/// Dom0's RAM is identity-mapped in stage 2 too (guest PA == host PA); a
/// DomU's lies at another host address (`host`).
#[derive(Debug)]
pub struct IdentityMappedRam {
    base: u64,
    size: u64,
    /// Host PA (== EL2 VA) of guest PA `base`.
    host: u64,
}

impl IdentityMappedRam {
    /// # Safety
    /// `[base, base + size)` must be mapped readable and writable at the
    /// same virtual addresses in the current translation regime, as Normal
    /// memory, for as long as this value is used, and must be memory the
    /// hypervisor itself does not use (it is the guest's RAM).
    pub unsafe fn new(base: u64, size: u64) -> Self {
        Self { base, size, host: base }
    }

    /// Guest RAM `[base, base + size)` backed by host memory at `host`.
    ///
    /// # Safety
    /// As for [`IdentityMappedRam::new`], for `[host, host + size)`.
    pub unsafe fn at(base: u64, size: u64, host: u64) -> Self {
        Self { base, size, host }
    }

    /// The host address of guest address `gpa` (checked first).
    fn host_addr(&self, gpa: u64) -> usize {
        (gpa - self.base + self.host) as usize
    }

    fn check(&self, gpa: u64, len: u64) -> Result<(), MemError> {
        let end = gpa.checked_add(len).ok_or(MemError::OutOfRange { gpa, len })?;
        if gpa < self.base || end > self.base.saturating_add(self.size) {
            return Err(MemError::OutOfRange { gpa, len });
        }
        Ok(())
    }
}

impl GuestMemory for IdentityMappedRam {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.check(gpa, buf.len() as u64)?;
        // SAFETY: the range is inside the region `new`'s caller promised is
        // mapped at VA == PA. The guest may write these bytes concurrently;
        // each byte is copied once into our private buffer and no reference
        // into guest memory is created, so a racing guest can only make us
        // see a mixture of old and new bytes, which the parsers tolerate.
        unsafe { core::ptr::copy_nonoverlapping(self.host_addr(gpa) as *const u8, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }
    fn write(&mut self, gpa: u64, buf: &[u8]) -> Result<(), MemError> {
        self.check(gpa, buf.len() as u64)?;
        // SAFETY: as in `read`; the destination is guest RAM, never
        // hypervisor memory (promised by `new`'s caller).
        unsafe { core::ptr::copy_nonoverlapping(buf.as_ptr(), self.host_addr(gpa) as *mut u8, buf.len()) };
        Ok(())
    }
    fn contains(&self, gpa: u64, len: u64) -> bool {
        self.check(gpa, len).is_ok()
    }
}

/// Device status bits (virtio 1.2 §2.1).
pub mod status {
    pub const ACKNOWLEDGE: u32 = 1;
    pub const DRIVER: u32 = 2;
    pub const DRIVER_OK: u32 = 4;
    pub const FEATURES_OK: u32 = 8;
    pub const DEVICE_NEEDS_RESET: u32 = 0x40;
    pub const FAILED: u32 = 0x80;
}

/// Feature bits (virtio 1.2 §5.2.3 and §6).
pub mod features {
    pub const BLK_SIZE_MAX: u64 = 1 << 1;
    pub const BLK_SEG_MAX: u64 = 1 << 2;
    pub const BLK_GEOMETRY: u64 = 1 << 4;
    pub const BLK_RO: u64 = 1 << 5;
    pub const BLK_BLK_SIZE: u64 = 1 << 6;
    pub const BLK_FLUSH: u64 = 1 << 9;
    pub const BLK_TOPOLOGY: u64 = 1 << 10;
    pub const BLK_CONFIG_WCE: u64 = 1 << 11;
    pub const BLK_MQ: u64 = 1 << 12;
    pub const RING_INDIRECT_DESC: u64 = 1 << 28;
    pub const RING_EVENT_IDX: u64 = 1 << 29;
    pub const VERSION_1: u64 = 1 << 32;
    pub const ACCESS_PLATFORM: u64 = 1 << 33;
    pub const RING_PACKED: u64 = 1 << 34;
}

/// InterruptStatus bits (virtio 1.2 §4.2.2).
pub mod irq {
    /// Used Buffer Notification.
    pub const VRING: u32 = 1;
    /// Configuration Change Notification.
    pub const CONFIG: u32 = 2;
}

/// `IdentityMappedRam` over another host address (a DomU's RAM); here, not
/// in `tests.rs`, because making one is `unsafe` and this file is where the
/// architecture doc allows that.
#[cfg(test)]
mod ram_view_tests {
    use super::*;
    use alloc::vec;

    /// A DomU's RAM as the EL2 code sees it: guest addresses at 0x40000000,
    /// backed elsewhere (here a host buffer standing in for the placement).
    /// Every access lands at the same offset of the backing; anything outside
    /// the guest's RAM, or wrapping, is refused and touches nothing.
    #[test]
    fn identity_mapped_ram_at_another_host_address_stays_inside_its_backing() {
        const GUEST: u64 = 0x4000_0000;
        const SIZE: usize = 64 << 10;
        // The backing, with a guard page of canaries on each side.
        let mut host = vec![0xa5u8; SIZE + 2 * 4096];
        let backing = host[4096..].as_mut_ptr() as u64;
        // SAFETY: `[backing, backing + SIZE)` is this test's buffer, readable and
        // writable at these addresses for as long as `ram` is used, and used by
        // nothing else meanwhile.
        let mut ram = unsafe { IdentityMappedRam::at(GUEST, SIZE as u64, backing) };
        ram.write(GUEST, &[1, 2, 3]).unwrap();
        ram.write(GUEST + SIZE as u64 - 2, &[7, 8]).unwrap();
        let mut b = [0u8; 3];
        ram.read(GUEST, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3]);
        let bad: [(u64, usize); 6] = [
            (GUEST - 1, 1),               // just below
            (GUEST - 2, 3),               // straddling the start
            (GUEST + SIZE as u64 - 1, 2), // straddling the end
            (GUEST + SIZE as u64, 1),     // just past
            (backing, 1),                 // the host address is no guest address
            (u64::MAX - 1, 4),            // wrapping
        ];
        // (A buffer at 1 GiB would make the host-address case a guest address.)
        for (gpa, len) in bad.into_iter().filter(|&(g, _)| g != backing || !(GUEST..GUEST + SIZE as u64).contains(&g)) {
            let data = vec![0xeeu8; len];
            assert_eq!(ram.write(gpa, &data), Err(MemError::OutOfRange { gpa, len: len as u64 }), "{gpa:#x}+{len}");
            let mut buf = vec![0u8; len];
            assert!(ram.read(gpa, &mut buf).is_err());
            assert!(!ram.contains(gpa, len as u64));
        }
        // `ram` is not used past here: the buffer is read directly.
        assert!(host[..4096].iter().all(|&x| x == 0xa5), "the guard below was written");
        assert!(host[4096 + SIZE..].iter().all(|&x| x == 0xa5), "the guard above was written");
        assert_eq!(&host[4096..4099], &[1, 2, 3]);
        assert_eq!(&host[4096 + SIZE - 2..4096 + SIZE], &[7, 8]);
    }
}
