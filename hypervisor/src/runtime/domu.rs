//! Building a DomU at EL2 from a `DomainSpec` and its `DomuPlacement`:
//! applies what `domain::vmplan::plan_domu` planned (its layout from
//! `domain::layout::layout_domu`). Its RAM is mapped
//! at `DOMU_RAM_BASE` (not identity-mapped), nothing else is: no physical
//! device, no passthrough interrupt. It gets a vGICv3 with one
//! redistributor per vCPU, a vPL011 (`vpl011`) and the hypervisor's
//! virtio-blk over a RAM image (`disk_size`); every other access it makes
//! is a stage-2 fault that the run loop answers with an injected abort.
//!
//! Also the `domu_selftest=N` test aid (`selftest`): N DomUs running Dom0's
//! kernel and initrd in RAM carved from the top of Dom0's.

use super::vblk::VDisk;
use super::vm::{apply_stage2, apply_vgic, copy_module, hw_facts, new_vcpus, Host, Vm, VmError, SPSR_EL1H_MASKED};
use crate::arch::cache;
use crate::arch::gic;
use crate::boot::image as boot_image;
use crate::boot::plan::{ModuleCopy, Plan, GUEST_DTB_SIZE};
use crate::config::Config;
use crate::domain::domu_dt::{build_domu_dtb, DomuDtConfig};
use crate::domain::layout::{self, DomainError};
use crate::domain::vmplan::{self, DiskBacking, DiskPlan};
use crate::domain::{DomainSpec, DomuPlacement};
use crate::dtb::{Platform, Region};
use crate::irq::IrqCounters;
use crate::sched::DomainParams;
use crate::sync::{Mutex, RwLock};
use crate::vpl011::VPl011;
use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use log::info;

impl From<DomainError> for VmError {
    fn from(e: DomainError) -> Self {
        VmError::Domain(e)
    }
}

impl Vm {
    /// Builds DomU `spec` in `placement`: `domain::vmplan::plan_domu`
    /// decides its machine, this applies it. Its vCPUs are the host-wide
    /// scheduler's `vcpu_base..`; `vmid` tags its stage 2 (unique per VM).
    pub fn create_domu(
        spec: &DomainSpec,
        placement: &DomuPlacement,
        plat: &Platform,
        nr_pcpus: usize,
        host: &'static Host,
        vcpu_base: u32,
        vmid: u16,
    ) -> Result<Box<Vm>, VmError> {
        // SAFETY: the kernel module lies in RAM the boot plan keeps (never
        // written), identity-mapped as normal memory.
        let header =
            unsafe { core::slice::from_raw_parts(spec.kernel.base as *const u8, spec.kernel.size.min(64) as usize) };
        let image_size = boot_image::arm64_image_size(header, spec.kernel.size).map_err(VmError::Layout)?;
        let (vp, l) =
            vmplan::plan_domu(spec, placement, image_size, plat, &hw_facts(plat, false)).map_err(VmError::Plan)?;
        let nr_vcpus = vp.nr_vcpus;

        // SAFETY: the placement's RAM is host RAM nothing else uses (the
        // boot plan placed it apart from everything it keeps), identity-mapped
        // as normal memory; the DomU does not run yet. Whatever was there
        // before is not the DomU's to read.
        unsafe { core::ptr::write_bytes(l.ram.host as *mut u8, 0, l.ram.ipa.size as usize) };
        copy_module(&ModuleCopy { src: spec.kernel, dst: Region { base: l.kernel.host, size: l.kernel.ipa.size } });
        if let (Some(src), Some(i)) = (spec.ramdisk, l.initrd) {
            copy_module(&ModuleCopy { src, dst: Region { base: i.host, size: i.ipa.size } });
        }
        let dtb = build_domu_dtb(&DomuDtConfig {
            ram: l.ram.ipa,
            vcpus: spec.vcpus,
            bootargs: &spec.bootargs,
            initrd: l.initrd.map(|i| i.ipa),
            vpl011: spec.vpl011,
            disk: l.disk.is_some(),
        })?;
        if dtb.len() as u64 > GUEST_DTB_SIZE {
            return Err(VmError::Memory("DomU DTB larger than 2 MiB"));
        }
        // SAFETY: the last 2 MiB of the DomU's RAM (its placement, memory
        // nothing else uses; the guest does not run yet).
        unsafe { core::ptr::copy_nonoverlapping(dtb.as_ptr(), l.dtb.host as *mut u8, dtb.len()) };
        cache::clean_to_poc(l.dtb.host, dtb.len() as u64);

        // Stage 2: its RAM, nothing else.
        let (s2, frames) = apply_stage2(&vp)?;
        let vgic = apply_vgic(&vp)?;

        let (vcpus, shared) = new_vcpus(nr_vcpus);
        {
            let mut sched = host.sched.lock();
            let params = DomainParams { weight: spec.weight, cap_percent: spec.cap_percent };
            sched.add_domain(spec.id, params).map_err(VmError::Sched)?;
            for i in 0..nr_vcpus {
                sched.add_vcpu(crate::sched::VcpuId(vcpu_base + i as u32), spec.id, None).map_err(VmError::Sched)?;
            }
            let mut v0 = vcpus[0].lock();
            v0.regs.x[0] = l.dtb.ipa.base;
            v0.regs.elr = l.kernel.ipa.base;
            v0.regs.spsr = SPSR_EL1H_MASKED;
            shared[0].online.store(true, Ordering::Release);
            sched.power_on(0, crate::sched::VcpuId(vcpu_base)).map_err(VmError::Sched)?;
        }

        let disk = match vp.disk {
            Some(DiskPlan { base, intid, backing: DiskBacking::Ram { image: d, latency_us } }) => {
                // SAFETY: the placement's disk region is host RAM nothing
                // else uses and that no stage 2 maps; the DomU's RAM is
                // `l.ram` at `l.ram.host` in the hypervisor's identity map.
                let image = unsafe {
                    core::ptr::write_bytes(d.base as *mut u8, 0, d.size as usize);
                    core::slice::from_raw_parts_mut(d.base as *mut u8, d.size as usize)
                };
                // SAFETY: as above.
                Some(unsafe {
                    VDisk::new_ram_at(base, intid, image, latency_us * 1000, vp.ram.base, vp.ram.size, vp.ram_host)
                })
            }
            // A DomU's disk is a RAM image (`domain::vmplan::plan_domu`).
            Some(DiskPlan { backing: DiskBacking::Phys { .. }, .. }) => {
                return Err(VmError::Memory("a DomU cannot drive a physical disk"))
            }
            None => None,
        };
        // Not consulted (physical interrupts go by Dom0's table); kept so
        // every VM has the same shape.
        let routes = vp.routes()?;
        let bus = vp.mmio_bus()?;
        info!(
            "d{}: {} vCPU(s), RAM {:#x}+{:#x} at host {:#x}, kernel {} KiB, initrd {:?}, disk {} MiB, vpl011 {}, VMID {vmid}",
            spec.id,
            nr_vcpus,
            l.ram.ipa.base,
            l.ram.ipa.size,
            l.ram.host,
            image_size / 1024,
            l.initrd.map(|i| (i.ipa.base, i.ipa.size)),
            l.disk.map_or(0, |d| d.size >> 20),
            spec.vpl011
        );
        Ok(Box::new(Vm {
            domid: spec.id,
            vmid,
            ram: vp.ram,
            ram_host: vp.ram_host,
            vcpu_base,
            stopped: AtomicBool::new(false),
            stage2_root: s2.root(),
            ipa: vp.ipa,
            stage2: Mutex::new((s2, frames)),
            // Every access outside its RAM and devices aborts.
            iomem: None,
            iomem_maps: AtomicU64::new(0),
            iomem_denied: AtomicU64::new(0),
            vgic: Mutex::new(vgic),
            uart: Mutex::new(VPl011::new()),
            uart_region: vp.uart,
            uart_intid: vp.uart_intid,
            virt_timer_intid: vp.virt_timer_intid,
            maintenance_intid: vp.maintenance_intid,
            hyp_timer_intid: vp.hyp_timer_intid,
            forwarded: Vec::new(),
            forwarded_edge: Vec::new(),
            forwarded_pcpu: Vec::new(),
            routes: RwLock::new(routes),
            irq_counters: IrqCounters::default(),
            vits: None,
            lpis_dropped: AtomicU64::new(0),
            vlpi: None,
            bus,
            vcpus,
            shared,
            sched: &host.sched,
            nr_pcpus,
            nr_lrs: crate::vgic::usable_lrs(gic::nr_lrs())?,
            overcommitted: nr_vcpus > nr_pcpus,
            bad_accesses: AtomicU64::new(0),
            disk,
            timer_slop_ns: 0,
            trace: &host.trace,
            trace_trigger: &host.trace_trigger,
        }))
    }
}

/// `domu_selftest=N`: Dom0's plan with its RAM shrunk from the top (the
/// guest DTB moved to the new top), and the N DomUs' specs and placements
/// in what was cut off. Dom0 keeps at least 256 MiB.
pub fn selftest(
    plat: &Platform,
    cfg: &Config,
    plan: &Plan,
) -> Result<(Plan, Vec<(DomainSpec, DomuPlacement)>), VmError> {
    let Some(kernel) = &plat.kernel else { return Err(VmError::NoKernel) };
    let (left, placements) = layout::selftest_carve(
        plan.guest_ram,
        cfg.domu_selftest,
        cfg.domu_selftest_mem,
        cfg.domu_selftest_disk,
        256 << 20,
    )?;
    let mut dom0 = plan.clone();
    dom0.guest_ram = left;
    dom0.guest_dtb = Region { base: left.end() - GUEST_DTB_SIZE, size: GUEST_DTB_SIZE };
    let modules_end = plan.initrd.map_or(plan.kernel.dst.end(), |i| i.dst.end());
    if modules_end > dom0.guest_dtb.base {
        return Err(VmError::Memory("domu_selftest: Dom0's kernel and initrd do not fit in the RAM left to it"));
    }
    let specs = layout::selftest_specs(
        cfg.domu_selftest,
        Region { base: kernel.base, size: kernel.size },
        plat.ramdisk.as_ref().map(|r| Region { base: r.base, size: r.size }),
        (cfg.domu_selftest_mem, cfg.domu_selftest_vcpus, cfg.domu_selftest_disk),
        cfg.domu_selftest_cmd.as_deref(),
    );
    info!(
        "domu_selftest: {} DomU(s) of {} MiB in [{:#x}, {:#x}), Dom0 keeps {:#x}-{:#x}",
        cfg.domu_selftest,
        cfg.domu_selftest_mem >> 20,
        left.end(),
        plan.guest_ram.end(),
        left.base,
        left.end()
    );
    Ok((dom0, specs.into_iter().zip(placements).collect()))
}
