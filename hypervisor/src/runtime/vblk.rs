//! The hypervisor's virtio-blk device for a VM (`dom0_disk=ram|backend`):
//! the portable device model (`crate::virtio`) wired to guest traps, the EL2
//! timer (request service time), the physical disk's interrupt (backend) and
//! the vGIC (its interrupt line).

use super::physblk::PhysBlk;
use crate::intid::IntId;
use crate::quota::Quota;
use crate::sync::Mutex;
use crate::virtio::QuotaTooSmall;
use crate::virtio::{
    BackendError, BackendRequest, BlkConfig, BlockBackend, Completion, Effects, IdentityMappedRam, MmioError,
    RamBackend, VirtioBlk,
};
use alloc::boxed::Box;
use alloc::sync::Arc;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Where the device's requests go.
pub enum Backend {
    /// A RAM image with a fixed service time.
    Ram(RamBackend<&'static mut [u8]>),
    /// The physical virtio-blk device; completions come by interrupt.
    Phys(Box<PhysBlk>),
}

impl BlockBackend for Backend {
    fn submit(&mut self, req: BackendRequest) -> Result<(), BackendError> {
        match self {
            Backend::Ram(r) => r.submit(req),
            Backend::Phys(p) => p.submit(req),
        }
    }
    fn free_slots(&self) -> usize {
        match self {
            Backend::Ram(r) => r.free_slots(),
            Backend::Phys(p) => p.free_slots(),
        }
    }
}

impl Backend {
    fn next_deadline(&self) -> Option<u64> {
        match self {
            Backend::Ram(r) => r.next_deadline(),
            // Completions made without the device (FLUSH on a device
            // without a cache, a broken device) are collected at once.
            Backend::Phys(p) => p.has_ready().then_some(0),
        }
    }
    fn poll(&mut self, now: u64) -> alloc::vec::Vec<Completion> {
        match self {
            Backend::Ram(r) => r.poll(now),
            Backend::Phys(p) => p.poll(),
        }
    }
}

pub struct DiskState {
    pub dev: VirtioBlk,
    pub backend: Backend,
    mem: IdentityMappedRam,
}

pub struct VDisk {
    /// IPA of the 0x200-byte virtio-mmio frame.
    pub base: u64,
    /// The virtual SPI (level-driven from the device's interrupt status).
    pub intid: IntId,
    pub state: Mutex<DiskState>,
    /// Earliest backend completion (ns), u64::MAX = none.
    pub deadline: AtomicU64,
    /// The pCPU whose EL2 timer watches `deadline`.
    pub home: AtomicUsize,
    /// The physical device's interrupt, taken by the hypervisor (backend mode).
    pub phys_intid: Option<IntId>,
}

impl VDisk {
    /// A RAM disk over `image` (host memory the guest cannot reach) for a
    /// guest whose RAM `[ram_base, ram_base + ram_size)` is backed by host
    /// memory at `ram_host` (equal to `ram_base` for Dom0), its requests
    /// charged to `quota`.
    ///
    /// # Safety
    /// `image` must be hypervisor-owned memory used by nothing else, and the
    /// guest RAM must be identity-mapped normal memory at `ram_host`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn new_ram_at(
        base: u64,
        intid: IntId,
        image: &'static mut [u8],
        latency_ns: u64,
        ram_base: u64,
        ram_size: u64,
        ram_host: u64,
        quota: &Arc<Quota>,
    ) -> Result<Self, QuotaTooSmall> {
        let sectors = image.len() as u64 / 512;
        let dev = VirtioBlk::with_quota(BlkConfig::new(sectors, false), quota.clone())?;
        // SAFETY: guaranteed by the caller.
        let mem = unsafe { IdentityMappedRam::at(ram_base, ram_size, ram_host) };
        Ok(Self {
            base,
            intid,
            state: Mutex::new(DiskState { dev, backend: Backend::Ram(RamBackend::new(image, false, latency_ns)), mem }),
            deadline: AtomicU64::new(u64::MAX),
            home: AtomicUsize::new(0),
            phys_intid: None,
        })
    }

    /// The guest's device over the physical virtio-blk device, its requests
    /// charged to `quota`.
    ///
    /// # Safety
    /// The guest RAM range must be identity-mapped normal memory.
    pub unsafe fn new_phys(
        base: u64,
        intid: IntId,
        phys: PhysBlk,
        ram_base: u64,
        ram_size: u64,
        quota: &Arc<Quota>,
    ) -> Result<Self, QuotaTooSmall> {
        let cfg = BlkConfig::new(phys.capacity_sectors(), phys.read_only());
        let dev = VirtioBlk::with_quota(cfg, quota.clone())?;
        // SAFETY: guaranteed by the caller.
        let mem = unsafe { IdentityMappedRam::new(ram_base, ram_size) };
        Ok(Self {
            base,
            intid,
            state: Mutex::new(DiskState { dev, backend: Backend::Phys(Box::new(phys)), mem }),
            deadline: AtomicU64::new(u64::MAX),
            home: AtomicUsize::new(0),
            phys_intid: Some(intid),
        })
    }

    pub fn contains(&self, ipa: u64) -> bool {
        ipa >= self.base && ipa < self.base + crate::virtio::mmio::FRAME_SIZE
    }

    /// Runs the device until it wants nothing more: queue notifications are
    /// processed, and the new deadline is published. Returns the interrupt
    /// level when it changed.
    fn settle(&self, st: &mut DiskState, mut fx: Effects, now: u64, me: usize) -> Option<bool> {
        let mut changed = fx.irq_level_changed;
        let mut rounds = 0;
        while let Some(q) = fx.notify {
            let DiskState { dev, backend, mem } = st;
            fx = dev.process_queue(q, mem, backend, now);
            changed |= fx.irq_level_changed;
            rounds += 1;
            if rounds > 64 {
                break;
            }
        }
        let d = st.backend.next_deadline().unwrap_or(u64::MAX);
        self.deadline.store(d, Ordering::Release);
        if d != u64::MAX {
            self.home.store(me, Ordering::Release);
        }
        super::percpu::note_timers_changed(self.home.load(Ordering::Acquire));
        changed.then(|| st.dev.irq_level())
    }

    /// A guest read; Err = bad access (abort the guest).
    pub fn read(&self, ipa: u64, size: u8) -> Result<u64, MmioError> {
        self.state.lock().dev.mmio_read(ipa - self.base, size)
    }

    /// A guest write; returns the new interrupt level when it changed.
    pub fn write(&self, ipa: u64, size: u8, value: u64, now: u64, me: usize) -> Result<Option<bool>, MmioError> {
        let mut st = self.state.lock();
        let st = &mut *st;
        let fx = st.dev.mmio_write(ipa - self.base, size, value, &st.mem)?;
        Ok(self.settle(st, fx, now, me))
    }

    /// The EL2 timer reached `deadline`: complete what is due.
    pub fn poll(&self, now: u64, me: usize) -> Option<bool> {
        if self.deadline.load(Ordering::Acquire) > now {
            return None;
        }
        self.collect(now, me)
    }

    /// Collects and completes whatever the backend finished (the physical
    /// device's interrupt, or a deadline that passed).
    pub fn collect(&self, now: u64, me: usize) -> Option<bool> {
        let mut st = self.state.lock();
        let st = &mut *st;
        let mut level = None;
        for c in st.backend.poll(now) {
            let fx = {
                let DiskState { dev, mem, .. } = st;
                dev.complete(mem, c)
            };
            if let Some(l) = self.settle(st, fx, now, me) {
                level = Some(l);
            }
        }
        let d = st.backend.next_deadline().unwrap_or(u64::MAX);
        self.deadline.store(d, Ordering::Release);
        super::percpu::note_timers_changed(self.home.load(Ordering::Acquire));
        level.or_else(|| Some(st.dev.irq_level()))
    }

    pub fn write_text(&self, out: &mut dyn core::fmt::Write) {
        let _ = self.state.lock().dev.write_text("blk0", out);
    }
}
