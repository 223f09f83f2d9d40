//! Building a DomU at EL2 from a `VmSpec` and its `DomuPlacement`:
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

use super::create::{
    apply_disk, apply_stage2, apply_vgic, copy_module, hw_facts, start_vcpus, write_firmware_blob, VcpuStart, VmParts,
};
use super::vm::{DomuSlot, Host, Vm, VmError};
use crate::arch::cache;
use crate::boot::image as boot_image;
use crate::boot::plan::{ModuleCopy, Plan, GUEST_DTB_SIZE};
use crate::config::Config;
use crate::domain::domu_dt::{build_domu_dtb, DomuDtConfig};
use crate::domain::layout::{self, DomainError};
use crate::domain::vmplan;
use crate::domain::{DomuPlacement, VmSpec};
use crate::dtb::{BootInfo, Machine};
use crate::region::Region;
use crate::sync::Mutex;
use crate::vgic::its::{Vits, VitsConfig};
use alloc::boxed::Box;
use alloc::vec::Vec;
use log::info;

impl From<DomainError> for VmError {
    fn from(e: DomainError) -> Self {
        VmError::Domain(e)
    }
}

impl Vm {
    /// Builds DomU `spec` in `placement`: `domain::vmplan::plan_domu`
    /// decides its machine, this applies it (copies the modules, writes its
    /// DTB, maps stage 2, makes the vGIC, vCPUs and disk) and makes the VM
    /// (`Vm::from_plan`) in `slot`; `dom0`'s route table gets its physical
    /// interrupts (GICv4 doorbells).
    pub fn create_domu(
        spec: &VmSpec,
        placement: &DomuPlacement,
        machine: &Machine,
        nr_pcpus: usize,
        host: &'static Host,
        slot: DomuSlot,
        dom0: &Vm,
    ) -> Result<Box<Vm>, VmError> {
        let DomuSlot { vcpu_base, vmid, power_on } = slot;
        // SAFETY: the kernel module lies in RAM the boot plan keeps (never
        // written), identity-mapped as normal memory.
        let file = unsafe { core::slice::from_raw_parts(spec.kernel.base as *const u8, spec.kernel.size as usize) };
        let load = boot_image::read_kernel(file, spec.kernel_load_addr).map_err(|e| VmError::Layout(e.into()))?;
        let (vp, l) =
            vmplan::plan_domu(spec, placement, &load, machine, &hw_facts(machine, false, host.vpmu, host.iommu))
                .map_err(VmError::Plan)?;

        // SAFETY: the placement's RAM is host RAM nothing else uses (the
        // boot plan placed it apart from everything it keeps), identity-mapped
        // as normal memory; the DomU does not run yet. Whatever was there
        // before is not the DomU's to read.
        unsafe { core::ptr::write_bytes(l.ram.host as *mut u8, 0, l.ram.ipa.size as usize) };
        // The DomU starts with its MMU and caches off: its reads go to
        // memory, past any line the zeroing left dirty (which would show it
        // the previous owner's bytes). Cleaned and invalidated, so no clean
        // line of zeros outlives a non-cacheable write of the guest's either,
        // once it turns its caches on. (The copies below clean their own.)
        cache::clean_inval_to_poc(l.ram.host, l.ram.ipa.size);
        for c in &l.kernel {
            copy_module(&ModuleCopy { src: c.src, dst: Region { base: c.dst.host, size: c.dst.ipa.size } });
        }
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
            pmu_intid: vp.pmu_intid,
            pci: vp.pci.iter().map(|f| (f.slot, f.devid)).collect(),
        })?;
        write_firmware_blob(&dtb, Region { base: l.dtb.host, size: GUEST_DTB_SIZE }, "DomU DTB larger than 2 MiB")?;

        // Stage 2: its RAM and its assigned functions' BARs; its devices'
        // DMA: its RAM and its vITS's doorbell.
        let stage2 = apply_stage2(&vp)?;
        super::smmu::attach_dma(&vp, vmid)?;
        let vgic = apply_vgic(&vp)?;
        let vcpus = start_vcpus(
            &vp,
            host,
            &VcpuStart { vcpu_base, nr_pcpus, weights: &[], dtb: l.dtb.ipa.base, kernel: l.entry, power_on },
        )?;
        let quota = alloc::sync::Arc::new(crate::quota::Quota::new(vp.spec.heap_quota));
        let disk = apply_disk(&vp, &quota)?;
        info!(
            "d{}: {} vCPU(s), RAM {:#x}+{:#x} at host {:#x}, kernel entry {:#x} ({} KiB), initrd {:?}, disk {} MiB, vpl011 {}, VMID {vmid}",
            spec.id,
            vp.nr_vcpus(),
            l.ram.ipa.base,
            l.ram.ipa.size,
            l.ram.host,
            l.entry,
            l.kernel.iter().map(|c| c.dst.ipa.size).sum::<u64>() / 1024,
            l.initrd.map(|i| (i.ipa.base, i.ipa.size)),
            l.disk.map_or(0, |d| d.size >> 20),
            spec.vpl011
        );
        // A vITS only for assigned PCIe functions; no forwarded SPI, no
        // iomem policy (`plan_domu`), no timer slop.
        let vits = match vp.its {
            Some(r) => Some(Mutex::new(Vits::new(VitsConfig {
                base: r.base,
                nr_vcpus: vp.nr_vcpus(),
                msi_vcpu: None,
                devices: vp.its_devices.clone(),
            })?)),
            None => None,
        };
        let parts = VmParts { vmid, vcpu_base, stage2, vgic, vcpus, disk, vits, timer_slop_ns: 0, quota };
        Vm::from_plan(&vp, parts, host, nr_pcpus, Some(&dom0.routes))
    }
}

/// `domu_selftest=N`: Dom0's plan with its RAM shrunk from the top (the
/// guest DTB moved to the new top), and the N DomUs' specs and placements
/// in what was cut off. Dom0 keeps at least 256 MiB.
pub fn selftest(boot: &BootInfo, cfg: &Config, plan: &Plan) -> Result<(Plan, Vec<(VmSpec, DomuPlacement)>), VmError> {
    let Some(kernel) = &boot.kernel else { return Err(VmError::NoKernel) };
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
    let modules_end = plan.kernel.iter().chain(&plan.initrd).map(|c| c.dst.end()).max().unwrap_or(0);
    if modules_end > dom0.guest_dtb.base {
        return Err(VmError::Memory("domu_selftest: Dom0's kernel and initrd do not fit in the RAM left to it"));
    }
    let specs = layout::selftest_specs(
        cfg.domu_selftest,
        Region { base: kernel.base, size: kernel.size },
        boot.initrd(),
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
