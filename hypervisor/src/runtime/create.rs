//! Making a VM: applying its `VmPlan` (stage 2, vGIC, disk, vCPUs, modules)
//! and `Vm::from_plan`, which makes the VM from the plan and what applying
//! it made. Dom0 (`runtime::dom0`) and the DomUs (`runtime::domu`) are made
//! with these.

use super::heap::HeapFrames;
use super::vblk::VDisk;
use super::vm::*;
use crate::arch::cache;
use crate::arch::gic;
use crate::boot::plan::ModuleCopy;
use crate::domain::vmplan::{DiskBacking, DiskPlan, HwFacts, VmPlan};
use crate::dtb::Machine;
use crate::irq::IrqCounters;
use crate::its::v4::LpiPath;
use crate::platform;
use crate::quota::Quota;
use crate::region::Region;
use crate::sched::{DomainParams, VcpuId};
use crate::stage2::Stage2;
use crate::sync::{Mutex, RwLock};
use crate::vgic::its::Vits;
use crate::vgic::{Vgic, VgicCell, VgicConfig};
use crate::vpl011::VPl011;
use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use log::{info, warn};

const MB: u64 = 1 << 20;

/// Whether a virtio-mmio slot holds a device (MagicValue "virt" and a
/// non-zero DeviceID).
fn virtio_mmio_present(base: u64) -> bool {
    // SAFETY: virtio-mmio registers from the platform's DTB, identity-mapped
    // as device memory; reading MagicValue and DeviceID has no side effects.
    unsafe {
        core::ptr::read_volatile(base as *const u32) == 0x7472_6976
            && core::ptr::read_volatile((base + 8) as *const u32) != 0
    }
}

/// Copies a boot module into guest RAM and zeroes the rest of its room
/// (the kernel's BSS beyond the file).
pub(super) fn copy_module(c: &ModuleCopy) {
    let len = c.src.size.min(c.dst.size);
    // SAFETY: the plan checked that `src` lies in RAM and `dst` in guest
    // RAM, which overlaps nothing the hypervisor keeps (the modules among
    // them), so the two do not overlap; both are identity-mapped normal
    // memory and the guest does not run yet.
    unsafe {
        core::ptr::copy_nonoverlapping(c.src.base as *const u8, c.dst.base as *mut u8, len as usize);
        core::ptr::write_bytes((c.dst.base + len) as *mut u8, 0, (c.dst.size - len) as usize);
    }
    cache::clean_to_poc(c.dst.base, c.dst.size);
}

/// What the planner needs from the hardware (`domain::vmplan::HwFacts`):
/// the PA size, the distributor's SPIs, whether the physical ITS works,
/// which virtio-mmio slots hold a device (read only when `probe_virtio`:
/// a DomU gets none), the platform's fallback INTIDs, the PMU interrupt
/// when guests get a vPMU (`vpmu`, and the CPU's PMU allows it), the
/// `iommu=` option and the PCIe functions `runtime::pci::prepare` probed.
pub(super) fn hw_facts(machine: &Machine, probe_virtio: bool, vpmu: bool, iommu: crate::config::IommuMode) -> HwFacts {
    let pmu_ok = vpmu && crate::vpmu::supported(crate::arch::el2::cpu_features().pmu);
    HwFacts {
        pa_bits: crate::stage2::pa_bits(crate::arch::el2::parange()),
        nr_spis: gic::nr_spis(),
        its_present: gic::its::its_present(),
        present: if probe_virtio {
            machine.virtio_mmio.iter().filter(|d| virtio_mmio_present(d.base)).map(|d| d.base).collect()
        } else {
            Vec::new()
        },
        uart_intid: platform::PLATFORM.uart_intid,
        maintenance_intid: platform::PLATFORM.maintenance_intid,
        kick: super::percpu::SGI_KICK,
        pmu_intid: machine.pmu_intid.filter(|_| pmu_ok),
        iommu,
        pci: super::pci::probed().to_vec(),
    }
}

/// Applies a plan's stage 2: a new table, every mapping it lists.
pub(super) fn apply_stage2(vp: &VmPlan) -> Result<(Stage2, HeapFrames), VmError> {
    let mut frames = HeapFrames::default();
    let mut s2 = Stage2::new(&mut frames, vp.ipa)?;
    for m in &vp.mappings {
        s2.map(&mut frames, m.ipa, m.pa, m.size, m.mem)?;
    }
    Ok((s2, frames))
}

/// Applies a plan's vGIC: the virtual timer (and the PMU's overflow
/// interrupt, with a vPMU) HW-linked on every vCPU, the
/// forwarded SPIs HW-linked to the same physical INTIDs.
pub(super) fn apply_vgic(vp: &VmPlan) -> Result<Vgic, VmError> {
    let mut vgic = Vgic::try_new(VgicConfig {
        gicd_base: vp.vgic.gicd_base,
        gicr_base: vp.vgic.gicr_base,
        nr_spis: vp.vgic.nr_spis,
        vcpu_mpidrs: (0..vp.nr_vcpus()).map(vcpu_mpidr).collect(),
        lpis: vp.vgic.lpis,
    })?;
    let vt = vp.virt_timer_intid;
    for v in 0..vp.nr_vcpus() {
        vgic.set_hw_private(v, vt, Some(vt))?;
        if let Some(p) = vp.pmu_intid {
            vgic.set_hw_private(v, p, Some(p))?;
        }
    }
    for f in &vp.forwarded {
        vgic.set_hw(f.intid, Some(f.intid))?;
    }
    Ok(vgic)
}

/// Copies a VM's firmware view (its DTB, or an ACPI Dom0's tables) into
/// `slot`, host memory at the top of its RAM; `too_big` says whose blob did
/// not fit.
pub(super) fn write_firmware_blob(blob: &[u8], slot: Region, too_big: &'static str) -> Result<(), VmError> {
    if blob.len() as u64 > slot.size {
        return Err(VmError::Memory(too_big));
    }
    // SAFETY: `slot` is the last 2 MiB of the VM's RAM, reserved for its
    // DTB by the plan: host memory nothing else uses, identity-mapped as
    // normal memory, and the guest does not run yet.
    unsafe { core::ptr::copy_nonoverlapping(blob.as_ptr(), slot.base as *mut u8, blob.len()) };
    cache::clean_to_poc(slot.base, blob.len() as u64);
    Ok(())
}

/// Makes the hypervisor's virtio-blk the plan gives the VM: a RAM image
/// (any VM; Dom0's is logged, a DomU's shows in its `d<N>:` line) or the
/// physical virtio-blk device (Dom0 only: its RAM is identity-mapped).
pub(super) fn apply_disk(vp: &VmPlan, quota: &Arc<Quota>) -> Result<Option<VDisk>, VmError> {
    let ram = vp.ram;
    let too_small = |_| VmError::Memory("the heap quota cannot hold the disk's largest request");
    Ok(match vp.disk {
        Some(DiskPlan { base, intid, backing: DiskBacking::Ram { image, latency_us } }) => {
            // SAFETY: the plan put the RAM disk in host RAM that holds
            // nothing the hypervisor keeps, lies outside every VM's RAM and
            // the heap, and that no stage 2 maps: it is ours alone,
            // identity-mapped. The guest's RAM is `ram` at `ram_host` in the
            // hypervisor's identity map.
            let bytes = unsafe {
                core::ptr::write_bytes(image.base as *mut u8, 0, image.size as usize);
                core::slice::from_raw_parts_mut(image.base as *mut u8, image.size as usize)
            };
            if vp.spec.id == 0 {
                info!(
                    "dom0 disk: virtio-blk at {:#x}, {}, RAM image {} MiB, service time {} us",
                    base,
                    intid,
                    image.size / MB,
                    latency_us
                );
            }
            // SAFETY: as above.
            let disk = unsafe {
                VDisk::new_ram_at(base, intid, bytes, latency_us * 1000, ram.base, ram.size, vp.ram_host, quota)
            };
            Some(disk.map_err(too_small)?)
        }
        // A DomU's disk is a RAM image (`domain::vmplan::plan_domu`).
        Some(DiskPlan { backing: DiskBacking::Phys { .. }, .. }) if vp.spec.id != 0 || vp.ram_host != ram.base => {
            return Err(VmError::Memory("a DomU cannot drive a physical disk"))
        }
        Some(DiskPlan { base, intid, backing: DiskBacking::Phys { size } }) => {
            // SAFETY: the device is not passed through (its page is not
            // in stage 2): only the hypervisor drives it.
            let phys = unsafe { super::physblk::open(base, size as usize) }.map_err(|e| {
                log::error!("physical virtio-blk: {e:?}");
                VmError::Memory("the physical virtio-blk device did not initialise")
            })?;
            info!(
                "dom0 disk: virtio-blk at {:#x}, {}, over the physical virtio-blk ({} sectors)",
                base,
                intid,
                phys.capacity_sectors()
            );
            // SAFETY: Dom0's RAM is identity-mapped (checked above).
            Some(unsafe { VDisk::new_phys(base, intid, phys, ram.base, ram.size, quota) }.map_err(too_small)?)
        }
        None => None,
    })
}

/// How a VM's vCPUs join the host-wide scheduler, and where vCPU 0 enters
/// its kernel.
pub(super) struct VcpuStart<'a> {
    /// The host-wide scheduler id of local vCPU 0 (`Vm::gid`).
    pub vcpu_base: u32,
    /// The machine's pCPUs: a VM whose spec pins its vCPUs has vCPU i on
    /// pCPU i % nr_pcpus.
    pub nr_pcpus: usize,
    /// Per-vCPU weights, by host-wide id (`sched_vcpu_weight`).
    pub weights: &'a [(VcpuId, u32)],
    /// vCPU 0's x0 (the DTB's IPA) and entry point (the kernel's IPA).
    pub dtb: u64,
    pub kernel: u64,
    /// Power vCPU 0 on now; otherwise the caller does, once the VM can be
    /// found (it is in the VM table).
    pub power_on: bool,
}

/// Makes the plan's vCPUs and adds them to the host-wide scheduler in
/// domain `vp.spec.id`, with the spec's weight, cap and pinning; vCPU 0 is online at its kernel's entry per the arm64
/// boot protocol and powered on, the others wait for PSCI CPU_ON.
pub(super) fn start_vcpus(
    vp: &VmPlan,
    host: &Host,
    s: &VcpuStart<'_>,
) -> Result<(Vec<Mutex<Vcpu>>, Vec<VcpuShared>), VmError> {
    let sched = &host.sched;
    let spec = &vp.spec;
    sched
        .add_domain(spec.id, DomainParams { weight: spec.weight, cap_percent: spec.cap_percent })
        .map_err(VmError::Sched)?;
    for i in 0..vp.nr_vcpus() {
        let pin = match spec.cpus.get(i) {
            Some(&p) => Some(p as usize),
            None => spec.pin_vcpus.then(|| i % s.nr_pcpus.max(1)),
        };
        sched.add_vcpu(VcpuId(s.vcpu_base + i as u32), spec.id, pin).map_err(VmError::Sched)?;
    }
    // Our extension of Credit2: a vCPU's own weight.
    for &(v, w) in s.weights {
        match sched.set_vcpu_weight(0, v, Some(w)) {
            Ok(()) => info!("sched: {v} weight {w} (sched_vcpu_weight)"),
            // A vCPU Dom0 does not have: Xen's way with a boot option that
            // does not apply, a warning.
            Err(crate::sched::SchedError::UnknownVcpu(_)) => {
                warn!("sched_vcpu_weight={}:{w}: Dom0 has {} vCPU(s), no vCPU {}; ignored", v.0, vp.nr_vcpus(), v.0)
            }
            Err(e @ crate::sched::SchedError::ExtensionOff(_)) => warn!("sched_vcpu_weight={}:{w}: {e}; ignored", v.0),
            Err(e) => return Err(VmError::Sched(e)),
        }
    }
    let (vcpus, shared) = new_vcpus(vp.nr_vcpus());
    {
        let mut v0 = vcpus[0].lock();
        v0.regs.x[0] = s.dtb;
        v0.regs.elr = s.kernel;
        v0.regs.spsr = SPSR_EL1H_MASKED;
    }
    if s.power_on {
        shared[0].online.store(true, Ordering::Release);
        sched.power_on(0, VcpuId(s.vcpu_base)).map_err(VmError::Sched)?;
    }
    Ok((vcpus, shared))
}

/// What a VM is made of beyond its plan: what applying the plan made, and
/// its place among the host's VMs.
pub(super) struct VmParts {
    /// Its stage-2 tag, unique per VM (Dom0's is 1, DomU N's is N + 1).
    pub vmid: u16,
    /// The host-wide scheduler id of local vCPU 0 (`Vm::gid`).
    pub vcpu_base: u32,
    /// `apply_stage2`'s tables.
    pub stage2: (Stage2, HeapFrames),
    /// `apply_vgic`'s vGIC.
    pub vgic: Vgic,
    /// `start_vcpus`' vCPUs.
    pub vcpus: (Vec<Mutex<Vcpu>>, Vec<VcpuShared>),
    /// `apply_disk`'s disk.
    pub disk: Option<VDisk>,
    /// The guest's vITS, when the plan gives it one (`vp.its`).
    pub vits: Option<Mutex<Vits>>,
    /// `timer_slop_ns` (Dom0's; 0 for a DomU).
    pub timer_slop_ns: u64,
    /// Its heap quota (`vp.spec.heap_quota`), already charged by its disk.
    pub quota: Arc<Quota>,
}

impl Vm {
    /// The VM a plan describes, from the parts applying it made: its IRQ
    /// route table and MMIO bus from the plan, GICv4 vLPIs when it has a
    /// vITS and the physical ITS injects directly (their doorbells routed
    /// in `phys_routes`, Dom0's table, for a DomU), the host-wide scheduler
    /// and flight recorder from `host`.
    pub(super) fn from_plan(
        vp: &VmPlan,
        parts: VmParts,
        host: &'static Host,
        nr_pcpus: usize,
        phys_routes: Option<&RwLock<crate::irq::IrqRoutes>>,
    ) -> Result<Box<Vm>, VmError> {
        let VmParts {
            vmid,
            vcpu_base,
            stage2: (s2, mut frames),
            vgic,
            vcpus: (vcpus, shared),
            disk,
            vits,
            timer_slop_ns,
            quota,
        } = parts;
        // Tables from now on are mapped on the guest's behalf (on-demand
        // device memory): charged to it.
        frames.charge_to(quota.clone());
        let nr_vcpus = vp.nr_vcpus();
        let nr_lrs = crate::vgic::usable_lrs(gic::nr_lrs())?;
        let mut routes = vp.routes()?;
        let bus = super::devices::attach(vp)?;
        // Doorbells are physical interrupts: routed in the table they all go
        // by (Dom0's, `phys_routes`; Dom0's own while it is being made).
        let vlpi = match (vp.its, phys_routes) {
            (Some(_), _) if gic::its::lpi_path() != LpiPath::Direct => None,
            (Some(_), Some(t)) => super::vlpi::VlpiVm::create(nr_vcpus, nr_pcpus, vcpu_base, &mut t.write()),
            (Some(_), None) => super::vlpi::VlpiVm::create(nr_vcpus, nr_pcpus, vcpu_base, &mut routes),
            (None, _) => None,
        };
        if let Some(r) = vp.its {
            let how = if vlpi.is_some() { "GICv4 vLPIs with doorbells" } else { "host LPIs" };
            let who = if vp.spec.id == 0 { String::from("dom0") } else { alloc::format!("d{}", vp.spec.id) };
            info!("{who} ITS: virtual GITS control frame at {:#x}, MSIs backed by {how}", r.base);
        }
        Ok(Box::new(Vm {
            domid: vp.spec.id,
            name: vp.spec.name.clone(),
            vmid,
            ram: vp.ram,
            ram_host: vp.ram_host,
            vcpu_base,
            stopped: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            stage2_root: s2.root(),
            ipa: vp.ipa,
            stage2: Mutex::new((s2, frames)),
            // `None` (every DomU, a DT Dom0): every access outside its RAM
            // and devices aborts.
            iomem: vp.iomem.clone(),
            iomem_maps: AtomicU64::new(0),
            iomem_denied: AtomicU64::new(0),
            vgic: VgicCell::new(vgic),
            uart: Mutex::new(VPl011::new()),
            uart_region: vp.uart,
            uart_intid: vp.uart_intid,
            virt_timer_intid: vp.virt_timer_intid,
            phys_timer_intid: vp.phys_timer_intid,
            pmu_intid: vp.pmu_intid,
            maintenance_intid: vp.maintenance_intid,
            hyp_timer_intid: vp.hyp_timer_intid,
            forwarded_pcpu: vp.forwarded.iter().map(|_| AtomicUsize::new(0)).collect(),
            forwarded: vp.forwarded.iter().map(|f| f.intid).collect(),
            forwarded_edge: vp.forwarded.iter().map(|f| f.edge).collect(),
            // A DomU's is not consulted (physical interrupts go by Dom0's
            // table); kept so every VM has the same shape.
            routes: RwLock::new(routes),
            vits,
            lpis_dropped: AtomicU64::new(0),
            vlpi,
            irq_counters: IrqCounters::default(),
            bus,
            vcpus,
            shared,
            sched: &host.sched,
            nr_pcpus,
            nr_lrs,
            overcommitted: nr_vcpus > nr_pcpus,
            extensions: AtomicBool::new(host.sched.config().extensions()),
            bad_accesses: AtomicU64::new(0),
            disk,
            pci_functions: vp.pci.clone(),
            vpci: super::devices::vpci::virtual_ecam(&vp.pci),
            pci_counters: Default::default(),
            quota,
            timer_slop_ns,
            trace: &host.trace,
            trace_trigger: &host.trace_trigger,
        }))
    }
}
