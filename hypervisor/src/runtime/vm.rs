//! The Dom0-style VM and its vCPUs: creation (memory, kernel, initrd, DTB,
//! vGIC, stage 2) and the run loop that handles every guest exit.
//!
//! Guest RAM is identity-mapped (IPA == PA), as Xen does for Dom0 on Arm
//! without an IOMMU, so passthrough devices can DMA to guest addresses.

use super::heap::HeapFrames;
use crate::arch::context::{El1Context, FpContext};
use crate::arch::exception::GuestRegs;
use crate::arch::gic::{self, VcpuIfState};
use crate::arch::sysreg;
use crate::config::{Config, DiskMode};
use super::physblk::PhysBlk;
use super::vblk::VDisk;
use crate::dtb::{self, GuestDtbConfig, Platform, Region};
use crate::stage2::{MemType, Stage2, Stage2Error};
use crate::vgic::{Vgic, VgicConfig, VgicError};
use crate::sched::{SchedConfig, SchedError, Scheduler, VcpuId};
use crate::vpl011::VPl011;
use crate::read_sysreg;
use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use log::info;
use spin::Mutex;

const MB: u64 = 1 << 20;
const PAGE: u64 = 4096;

#[derive(Debug)]
pub enum VmError {
    NoKernel,
    /// The kernel module is not an arm64 Image.
    BadKernelImage,
    /// Guest RAM does not fit where it must go.
    Memory(&'static str),
    Stage2(Stage2Error),
    Dtb(dtb::DtbError),
    Vgic(VgicError),
    Sched(SchedError),
}

impl From<Stage2Error> for VmError {
    fn from(e: Stage2Error) -> Self {
        VmError::Stage2(e)
    }
}
impl From<dtb::DtbError> for VmError {
    fn from(e: dtb::DtbError) -> Self {
        VmError::Dtb(e)
    }
}
impl From<VgicError> for VmError {
    fn from(e: VgicError) -> Self {
        VmError::Vgic(e)
    }
}

/// Per-vCPU trap counters, updated by whichever pCPU runs the vCPU and read
/// at power-off while other pCPUs may still run: atomics.
macro_rules! trap_counters {
    ($($name:ident),* $(,)?) => {
        #[derive(Default)]
        pub struct TrapCounters {
            $(pub $name: AtomicU64,)*
        }
        impl TrapCounters {
            /// Copies the counts into the stats record printed at power-off.
            pub fn fill(&self, c: &mut crate::stats::Counters) {
                $(c.$name = self.$name.load(Ordering::Relaxed);)*
            }
        }
    };
}

trap_counters!(
    exits, irq_exits, mmio, hvc, smc, sysreg, sgis_sent, unsupported_calls, aborts_injected,
    undef_injected, wfi_traps, wfe_traps, irqs_injected, kicks,
);

/// Adds one to a counter.
pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A vCPU's register state; locked by the pCPU that runs it, from load to
/// save, so a vCPU never runs on two pCPUs and is never loaded half-saved.
pub struct Vcpu {
    pub id: usize,
    pub regs: GuestRegs,
    pub el1: El1Context,
    pub fp: FpContext,
    pub gicif: VcpuIfState,
    pub lrs: [u64; crate::vgic::NUM_LRS_MAX],
}

/// What other pCPUs may look at without the vCPU's lock.
pub struct VcpuShared {
    pub online: AtomicBool,
    /// Virtual timer deadline (ns) while the vCPU is not on a CPU; u64::MAX = none.
    pub vtimer_deadline: AtomicU64,
    /// The pCPU that watches that deadline (where the vCPU was saved).
    pub vtimer_home: AtomicUsize,
    /// While it is blocked in WFIT: when (ns) the wait ends even without an
    /// interrupt, watched like `vtimer_deadline`; u64::MAX = none.
    pub wake_at: AtomicU64,
    /// The pCPU running it, usize::MAX = none.
    pub running_on: AtomicUsize,
    /// Bit n: the physical active state of forwarded private INTID n (the
    /// virtual timer) must be re-derived from the vGIC by the pCPU that runs
    /// this vCPU, at its next exit (another vCPU changed it by MMIO).
    pub ppi_resync: AtomicU32,
    pub counters: TrapCounters,
}

pub struct Vm {
    pub vmid: u16,
    pub ram: Region,
    pub stage2_root: u64,
    pub vgic: Mutex<Vgic>,
    pub uart: Mutex<VPl011>,
    pub uart_region: Option<Region>,
    pub uart_intid: u32,
    pub virt_timer_intid: u32,
    pub maintenance_intid: u32,
    pub hyp_timer_intid: u32,
    /// Physical SPIs forwarded to the guest as HW interrupts.
    pub forwarded: Vec<u32>,
    /// The pCPU each forwarded SPI is physically routed to (same order).
    pub forwarded_pcpu: Vec<AtomicUsize>,
    /// Physical distributor base (for routing forwarded SPIs).
    pub gicd_base: u64,
    pub vcpus: Vec<Mutex<Vcpu>>,
    pub shared: Vec<VcpuShared>,
    pub sched: Mutex<Scheduler>,
    pub nr_pcpus: usize,
    pub nr_lrs: usize,
    /// More vCPUs than pCPUs: trap WFE so spinning vCPUs yield.
    pub overcommitted: bool,
    /// Guest data aborts reported (the log is rate-limited).
    pub bad_accesses: AtomicU64,
    /// The hypervisor's virtio-blk device, when the guest has one.
    pub disk: Option<VDisk>,
    /// `timer_slop_ns`.
    pub timer_slop_ns: u64,
}

/// Whether a virtio-mmio slot holds a device (MagicValue "virt" and a
/// non-zero DeviceID).
fn virtio_mmio_present(base: u64) -> bool {
    // SAFETY: virtio-mmio registers from the platform's DTB, identity-mapped
    // as device memory; reading MagicValue and DeviceID has no side effects.
    unsafe {
        core::ptr::read_volatile(base as *const u32) == 0x7472_6976 && core::ptr::read_volatile((base + 8) as *const u32) != 0
    }
}

fn align_up(v: u64, a: u64) -> u64 {
    (v + a - 1) & !(a - 1)
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// Reads `image_size` from an arm64 Image header (0 means "unknown").
fn arm64_image_size(kernel: &[u8]) -> Result<u64, VmError> {
    if kernel.len() < 64 || kernel[0x38..0x3c] != *b"ARM\x64" {
        return Err(VmError::BadKernelImage);
    }
    let size = u64::from_le_bytes(kernel[16..24].try_into().unwrap());
    Ok(if size == 0 { kernel.len() as u64 } else { size })
}

/// vMPIDR of vCPU `i`: Aff0 = i % 16, Aff1 = i / 16.
pub fn vcpu_mpidr(i: usize) -> u64 {
    ((i as u64 / 16) << 8) | (i as u64 % 16)
}

/// Cleans a range to the point of coherency so a guest running with its MMU
/// and caches off sees what the hypervisor wrote.
fn clean_dcache(start: u64, len: u64) {
    let line = 4u64 << ((read_sysreg!("ctr_el0") >> 16) & 0xf);
    let mut p = start & !(line - 1);
    while p < start + len {
        // SAFETY: cache maintenance by VA on identity-mapped RAM.
        unsafe { core::arch::asm!("dc cvac, {0}", in(reg) p, options(nostack)) };
        p += line;
    }
    sysreg::dsb_sy();
}

impl Vm {
    /// Builds the Dom0-style guest from the boot modules.
    pub fn create_dom0(plat: &Platform, cfg: &Config, host_dtb: &[u8], hyp_end: u64, nr_pcpus: usize) -> Result<Box<Vm>, VmError> {
        let kernel_mod = plat.kernel.as_ref().ok_or(VmError::NoKernel)?;
        let ram0 = *plat.memory.first().ok_or(VmError::Memory("no memory node"))?;
        let nr_vcpus = cfg.dom0_max_vcpus.unwrap_or(1) as usize;

        // Guest RAM: the top of the first bank, above everything we keep.
        let reserved_top = [
            Some((ram0.base, hyp_end)),
            Some((kernel_mod.base, kernel_mod.base + kernel_mod.size)),
            plat.ramdisk.as_ref().map(|r| (r.base, r.base + r.size)),
        ]
        .into_iter()
        .flatten()
        .filter(|r| r.0 >= ram0.base && r.0 < ram0.end())
        .map(|r| r.1)
        .max()
        .unwrap_or(ram0.base);
        let floor = align_up(reserved_top.max(ram0.base + crate::platform::HYP_RESERVED.min(ram0.size / 2)), 2 * MB);
        let disk_bytes = if cfg.disk == DiskMode::Ram { align_up(cfg.disk_size, 2 * MB) } else { 0 };
        let size = match cfg.dom0_mem {
            Some(m) => align_up(m, 2 * MB),
            None => ram0.end().saturating_sub(floor + disk_bytes) & !(2 * MB - 1),
        };
        if size < 64 * MB || ram0.end() < floor + size + disk_bytes {
            return Err(VmError::Memory("not enough RAM above the hypervisor and boot modules for dom0_mem (and the RAM disk)"));
        }
        let ram = Region { base: (ram0.end() - size) & !(2 * MB - 1), size };

        // Kernel at the bottom of guest RAM (2 MiB aligned, text_offset 0).
        // SAFETY: boot modules are in RAM, identity-mapped, and described by
        // the bootloader's DTB; their ranges were bounded above.
        let kernel = unsafe { core::slice::from_raw_parts(kernel_mod.base as *const u8, kernel_mod.size as usize) };
        let image_size = arm64_image_size(kernel)?;
        let kernel_at = ram.base;
        let mut next = align_up(kernel_at + image_size, 2 * MB);
        let initrd = match &plat.ramdisk {
            Some(r) => {
                let at = next;
                next = align_up(at + r.size, 2 * MB);
                Some(Region { base: at, size: r.size })
            }
            None => None,
        };
        let dtb_at = ram.end() - 2 * MB;
        if next > dtb_at {
            return Err(VmError::Memory("kernel and initrd do not fit in guest RAM"));
        }
        // The copies go into guest RAM, which must not overlap the sources.
        let guest = (ram.base, ram.end());
        if overlaps(guest, (kernel_mod.base, kernel_mod.base + kernel_mod.size))
            || plat.ramdisk.as_ref().is_some_and(|r| overlaps(guest, (r.base, r.base + r.size)))
        {
            return Err(VmError::Memory("boot modules overlap guest RAM"));
        }
        // SAFETY: destination is guest RAM we own, source is the module; they
        // do not overlap (checked above).
        unsafe {
            core::ptr::copy_nonoverlapping(kernel.as_ptr(), kernel_at as *mut u8, kernel.len());
            if let (Some(src), Some(dst)) = (&plat.ramdisk, &initrd) {
                core::ptr::copy_nonoverlapping(src.base as *const u8, dst.base as *mut u8, src.size as usize);
            }
        }
        clean_dcache(kernel_at, kernel.len() as u64);
        if let Some(i) = &initrd {
            clean_dcache(i.base, i.size);
        }

        // Disks. Passthrough: the virtio-mmio devices QEMU gives us, mapped
        // into the guest (Dom0-style). Emulated: our virtio-blk device takes
        // the slot of the first QEMU device (or the last slot), so the guest
        // DTB keeps its node; slots sharing its 4 KiB page are not passed
        // through (stage 2 maps pages) and are hidden from the guest.
        let present: Vec<&dtb::MmioDevice> = plat.virtio_mmio.iter().filter(|d| virtio_mmio_present(d.base)).collect();
        let disk_slot = if cfg.disk.emulated() {
            present.iter().copied().max_by_key(|d| d.base).or_else(|| plat.virtio_mmio.iter().max_by_key(|d| d.base)).cloned()
        } else {
            None
        };
        let same_page = |d: &dtb::MmioDevice| disk_slot.as_ref().is_some_and(|s| s.base & !(PAGE - 1) == d.base & !(PAGE - 1));
        let passthrough: Vec<dtb::MmioDevice> = match cfg.disk {
            DiskMode::Passthrough => plat.virtio_mmio.clone(),
            DiskMode::None => Vec::new(),
            DiskMode::Ram | DiskMode::Backend => plat.virtio_mmio.iter().filter(|d| !same_page(d)).cloned().collect(),
        };
        let mut remove = dtb::default_removals(host_dtb)?;
        for d in &plat.virtio_mmio {
            let ours = disk_slot.as_ref().is_some_and(|s| s.base == d.base);
            if !ours && !passthrough.iter().any(|p| p.base == d.base) {
                remove.push(d.path.clone());
            }
        }
        if cfg.disk == DiskMode::Backend && !disk_slot.as_ref().is_some_and(|s| virtio_mmio_present(s.base)) {
            return Err(VmError::Memory("dom0_disk=backend needs a virtio-blk device on the machine (QEMU -device virtio-blk-device)"));
        }
        let bootargs = kernel_mod.bootargs.clone().unwrap_or_else(|| String::from("console=ttyAMA0"));
        let vcpu_mpidrs: Vec<u64> = (0..nr_vcpus).map(vcpu_mpidr).collect();
        let guest_dtb = dtb::build_guest_dtb(
            host_dtb,
            &GuestDtbConfig {
                memory: ram,
                vcpu_mpidrs: vcpu_mpidrs.clone(),
                bootargs,
                initrd,
                remove_paths: remove,
                extra_virtio_mmio: Vec::new(),
            },
        )?;
        if guest_dtb.len() as u64 > 2 * MB {
            return Err(VmError::Memory("guest DTB larger than 2 MiB"));
        }
        // SAFETY: the last 2 MiB of guest RAM, reserved for the DTB above.
        unsafe { core::ptr::copy_nonoverlapping(guest_dtb.as_ptr(), dtb_at as *mut u8, guest_dtb.len()) };
        clean_dcache(dtb_at, guest_dtb.len() as u64);

        // Stage 2: RAM, and the passthrough device frames (page granular).
        let mut frames = HeapFrames;
        let mut s2 = Stage2::new(&mut frames)?;
        s2.map(&mut frames, ram.base, ram.base, ram.size, MemType::Normal)?;
        let mut mapped_pages: Vec<u64> = Vec::new();
        for d in &passthrough {
            let mut p = d.base & !(PAGE - 1);
            while p < d.base + d.size {
                if !mapped_pages.contains(&p) {
                    s2.map(&mut frames, p, p, PAGE, MemType::Device)?;
                    mapped_pages.push(p);
                }
                p += PAGE;
            }
        }

        // vGIC at the host's addresses.
        // SAFETY: GICD_TYPER of the identity-mapped physical distributor.
        let typer = unsafe { core::ptr::read_volatile((plat.gic.gicd.base + 4) as *const u32) };
        let nr_spis = ((typer & 0x1f) + 1) * 32 - 32;
        let gicr_base = plat.gic.gicr.first().map_or(0, |r| r.base);
        let mut vgic = Vgic::try_new(VgicConfig {
            gicd_base: plat.gic.gicd.base,
            gicr_base,
            nr_spis: nr_spis.min(988),
            vcpu_mpidrs,
        })?;
        let vt = plat.timer.virt_intid;
        for v in 0..nr_vcpus {
            vgic.set_hw_private(v, vt, Some(vt))?;
        }
        let mut forwarded = Vec::new();
        for d in &passthrough {
            if vgic.set_hw(d.intid, Some(d.intid)).is_ok() {
                forwarded.push(d.intid);
            }
        }

        let sched_cfg = SchedConfig::from_bootargs(plat.bootargs.as_deref().unwrap_or("")).map_err(VmError::Sched)?;
        let mut sched = Scheduler::new(sched_cfg, nr_pcpus).map_err(VmError::Sched)?;
        for i in 0..nr_vcpus {
            sched.add_vcpu(VcpuId(i as u32), cfg.dom0_weight, cfg.dom0_vcpus_pin.then_some(i % nr_pcpus)).map_err(VmError::Sched)?;
        }
        let mut vcpus = Vec::new();
        let mut shared = Vec::new();
        for i in 0..nr_vcpus {
            vcpus.push(Mutex::new(Vcpu {
                id: i,
                regs: GuestRegs::default(),
                el1: El1Context::reset(vcpu_mpidr(i)),
                fp: FpContext::default(),
                gicif: VcpuIfState::default(),
                lrs: [0; crate::vgic::NUM_LRS_MAX],
            }));
            shared.push(VcpuShared {
                online: AtomicBool::new(false),
                vtimer_deadline: AtomicU64::new(u64::MAX),
                vtimer_home: AtomicUsize::new(0),
                wake_at: AtomicU64::new(u64::MAX),
                ppi_resync: AtomicU32::new(0),
                running_on: AtomicUsize::new(usize::MAX),
                counters: TrapCounters::default(),
            });
        }
        {
            // vCPU 0 enters the kernel per the arm64 boot protocol.
            let mut v0 = vcpus[0].lock();
            v0.regs.x[0] = dtb_at;
            v0.regs.elr = kernel_at;
            v0.regs.spsr = SPSR_EL1H_MASKED;
        }
        shared[0].online.store(true, Ordering::Release);
        sched.power_on(0, VcpuId(0)).map_err(VmError::Sched)?;
        let disk = match (&disk_slot, cfg.disk) {
            (Some(slot), DiskMode::Ram) => {
                let at = ram.base - disk_bytes;
                // SAFETY: [at, ram.base) is RAM above everything the
                // hypervisor keeps and below guest RAM (checked above): it
                // is ours alone, identity-mapped, and the guest has no
                // stage-2 mapping of it. Guest RAM is identity-mapped.
                let image = unsafe {
                    core::ptr::write_bytes(at as *mut u8, 0, disk_bytes as usize);
                    core::slice::from_raw_parts_mut(at as *mut u8, disk_bytes as usize)
                };
                info!("dom0 disk: virtio-blk at {:#x} (INTID {}), RAM image {} MiB, service time {} us", slot.base, slot.intid, disk_bytes / MB, cfg.disk_latency_us);
                // SAFETY: as above.
                Some(unsafe { VDisk::new_ram(slot.base, slot.intid, image, cfg.disk_latency_us * 1000, ram.base, ram.size) })
            }
            (Some(slot), DiskMode::Backend) => {
                // SAFETY: the device is not passed through (its page is not
                // in stage 2): only the hypervisor drives it.
                let phys = unsafe { PhysBlk::new(slot.base, slot.size.max(0x200) as usize) }.map_err(|_| VmError::Memory("the physical virtio-blk device did not initialise"))?;
                info!("dom0 disk: virtio-blk at {:#x} (INTID {}) over the physical virtio-blk ({} sectors)", slot.base, slot.intid, phys.capacity_sectors());
                // SAFETY: guest RAM is identity-mapped.
                Some(unsafe { VDisk::new_phys(slot.base, slot.intid, phys, ram.base, ram.size) })
            }
            _ => None,
        };
        info!(
            "dom0: {} vCPU(s) on {} pCPU(s), RAM {:#x}-{:#x}, kernel {:#x} ({} KiB), initrd {:?}, dtb {:#x}, {} passthrough device(s)",
            nr_vcpus,
            nr_pcpus,
            ram.base,
            ram.end(),
            kernel_at,
            image_size / 1024,
            initrd.map(|r| (r.base, r.size)),
            dtb_at,
            passthrough.len()
        );
        Ok(Box::new(Vm {
            vmid: 1,
            ram,
            stage2_root: s2.root(),
            vgic: Mutex::new(vgic),
            uart: Mutex::new(VPl011::new()),
            uart_region: plat.uart.as_ref().map(|u| Region { base: u.base, size: u.size.max(0x1000) }),
            uart_intid: plat.uart.as_ref().map_or(33, |u| u.intid),
            virt_timer_intid: vt,
            maintenance_intid: plat.gic.maintenance_intid.unwrap_or(25),
            hyp_timer_intid: plat.timer.hyp_intid,
            forwarded_pcpu: forwarded.iter().map(|_| AtomicUsize::new(0)).collect(),
            forwarded,
            gicd_base: plat.gic.gicd.base,
            vcpus,
            shared,
            sched: Mutex::new(sched),
            nr_pcpus,
            nr_lrs: gic::nr_lrs().min(crate::vgic::NUM_LRS_MAX),
            overcommitted: nr_vcpus > nr_pcpus,
            bad_accesses: AtomicU64::new(0),
            disk,
            timer_slop_ns: cfg.timer_slop_ns,
        }))
    }

}

/// EL1h with D, A, I, F masked: the state Linux expects at entry.
pub const SPSR_EL1H_MASKED: u64 = 0x3c5;
