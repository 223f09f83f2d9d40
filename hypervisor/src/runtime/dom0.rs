//! Dom0's creation: `domain::vmplan::plan_dom0` decides its machine, this
//! applies it with the appliers of `runtime::create` (copies the modules,
//! writes the guest DTB or ACPI tables, maps stage 2, makes the vGIC,
//! vCPUs, disk and vITS) and makes the VM (`Vm::from_plan`).

use super::create::*;
use super::vm::*;
use crate::boot::plan::Plan;
use crate::config::Config;
use crate::domain::vmplan::{self, Dom0Firmware, VmPlan};
use crate::dtb::{self, BootInfo, GuestDtbConfig, Machine};
use crate::quota::Quota;
use crate::region::Region;
use crate::sync::Mutex;
use crate::vgic::its::{Vits, VitsConfig};
use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use log::info;

/// What Dom0 learns the machine from.
pub enum GuestFirmware<'a> {
    /// A DT derived from the host's (the `-kernel` and TF-A boots).
    Dtb(&'a [u8]),
    /// ACPI (the EFI boot): `firmware::dom0_efi` in the guest DTB area.
    Acpi(AcpiDom0<'a>),
}

/// The host's ACPI side of an ACPI Dom0.
pub struct AcpiDom0<'a> {
    pub tables: &'a crate::firmware::acpi::Tables<'a>,
    /// Host firmware memory Dom0 reads (ACPI reclaim/NVS), identity-mapped
    /// as normal memory and passed on in Dom0's memory map.
    pub firmware: Vec<crate::firmware::uefi::MemoryDescriptor>,
    /// Every range of the firmware's memory map that is not MMIO: never
    /// mapped on demand (Dom0's devices are, `crate::iomem`).
    pub memory: Vec<Region>,
}

/// Writes Dom0's firmware view into the plan's guest DTB slot: a DT
/// derived from the host's without the nodes the plan hides, or an ACPI
/// Dom0's tables, EFI system table and memory map.
fn write_dom0_firmware(boot: &BootInfo, plan: &Plan, vp: &VmPlan, firmware: &GuestFirmware<'_>) -> Result<(), VmError> {
    let kernel_mod = boot.kernel.as_ref().ok_or(VmError::NoKernel)?;
    let (ram, nr_vcpus) = (vp.ram, vp.nr_vcpus());
    let initrd = plan.initrd.map(|c| c.dst);
    let bootargs = kernel_mod.bootargs.clone().unwrap_or_else(|| String::from("console=ttyAMA0"));
    let vcpu_mpidrs: Vec<u64> = (0..nr_vcpus).map(vcpu_mpidr).collect();
    let keep_its = vp.its.is_some();
    let guest_dtb = match firmware {
        GuestFirmware::Dtb(host_dtb) => {
            let mut remove = dtb::default_removals(host_dtb, vp.pmu_intid.is_some())?;
            remove.extend(vp.hidden_paths.iter().cloned());
            dtb::build_guest_dtb(
                host_dtb,
                &GuestDtbConfig {
                    memory: ram,
                    vcpu_mpidrs,
                    bootargs,
                    initrd,
                    remove_paths: remove,
                    extra_virtio_mmio: Vec::new(),
                    keep_its,
                    ipa_size: Some(vp.ipa.limit()),
                    pci_carves: vp.pci_carves.clone(),
                    control: vp.control,
                },
            )?
        }
        GuestFirmware::Acpi(a) => {
            use crate::firmware::acpi::dom0::Dom0AcpiConfig;
            use crate::firmware::dom0_efi::{build_dom0_efi, Dom0EfiConfig};
            let acpi_cfg =
                Dom0AcpiConfig { vcpu_mpidrs, base: 0, remove: Vec::new(), keep_uart: true, drop_its: !keep_its };
            let efi = build_dom0_efi(
                a.tables,
                &acpi_cfg,
                &Dom0EfiConfig {
                    ram,
                    area: plan.guest_dtb,
                    bootargs,
                    initrd,
                    firmware: a.firmware.clone(),
                    mmio: vp.mmio.clone(),
                    control: vp.control,
                },
            )
            .map_err(VmError::Efi)?;
            info!(
                "dom0 ACPI: RSDP {:#x}, EFI system table {:#x}, memory map {:#x} ({} bytes)",
                efi.tables.rsdp, efi.system_table, efi.memory_map.base, efi.memory_map.size
            );
            efi.blob
        }
    };
    write_firmware_blob(&guest_dtb, plan.guest_dtb, "guest DTB (or ACPI Dom0 firmware area) larger than 2 MiB")
}

impl Vm {
    /// Builds the Dom0-style guest from the boot modules, where `plan` says:
    /// `domain::vmplan::plan_dom0` decides its machine, this applies it
    /// (copies the modules, writes the guest DTB or ACPI tables, maps stage
    /// 2, makes the vGIC, vCPUs, disk and vITS) and makes the VM
    /// (`Vm::from_plan`). Dom0's vCPUs are host-wide ids 0..nr_vcpus (made
    /// first), in scheduler domain 0; its VMID is 1.
    pub fn create_dom0(
        machine: &Machine,
        boot: &BootInfo,
        cfg: &Config,
        plan: &Plan,
        firmware: &GuestFirmware<'_>,
        nr_pcpus: usize,
        host: &'static Host,
    ) -> Result<Box<Vm>, VmError> {
        let hw = hw_facts(machine, true, host.vpmu, cfg.iommu);
        let fw_regions: Vec<Region> = match firmware {
            GuestFirmware::Acpi(a) => a.firmware.iter().filter_map(|d| d.region()).collect(),
            GuestFirmware::Dtb(_) => Vec::new(),
        };
        let fw = match firmware {
            GuestFirmware::Acpi(a) => Dom0Firmware::Acpi { firmware: &fw_regions, memory: &a.memory },
            GuestFirmware::Dtb(_) => Dom0Firmware::Dt,
        };
        let vp = vmplan::plan_dom0(machine, boot, plan, cfg, fw, &hw).map_err(VmError::Plan)?;
        info!("dom0 stage 2: {}-bit IPA ({}-bit PA)", vp.ipa.bits(), hw.pa_bits);
        let nr_vcpus = vp.nr_vcpus();
        // The kernel (an Image at the bottom of guest RAM with image_size
        // reserved, or its pieces at their fixed addresses), the initrd
        // and the DTB around it: see `boot::plan`.
        for c in &plan.kernel {
            copy_module(c);
        }
        if let Some(c) = &plan.initrd {
            copy_module(c);
        }
        write_dom0_firmware(boot, plan, &vp, firmware)?;
        let stage2 = apply_stage2(&vp)?;
        super::smmu::attach_dma(&vp, 1)?;
        let vgic = apply_vgic(&vp)?;
        log_dom0_devices(&vp, firmware);

        let vcpus = start_vcpus(
            &vp,
            host,
            &VcpuStart {
                vcpu_base: 0,
                nr_pcpus,
                weights: &cfg.sched_vcpu_weights,
                dtb: plan.guest_dtb.base,
                kernel: plan.entry,
                power_on: true,
            },
        )?;
        let quota = Arc::new(Quota::new(vp.spec.heap_quota));
        let disk = apply_disk(&vp, &quota)?;
        info!(
            "dom0: {} vCPU(s) on {} pCPU(s), RAM {:#x}-{:#x}, kernel entry {:#x} ({} KiB in {} piece(s)), initrd {:?}, dtb {:#x}, {} passthrough device(s)",
            nr_vcpus,
            nr_pcpus,
            vp.ram.base,
            vp.ram.end(),
            plan.entry,
            plan.kernel.iter().map(|c| c.dst.size).sum::<u64>() / 1024,
            plan.kernel.len(),
            plan.initrd.map(|c| (c.dst.base, c.dst.size)),
            plan.guest_dtb.base,
            vp.passthrough.len()
        );
        let vits = match vp.its {
            Some(r) => Some(Mutex::new(Vits::new(VitsConfig {
                base: r.base,
                nr_vcpus,
                msi_vcpu: cfg.msi_vcpu(nr_vcpus),
                devices: vp.its_devices.clone(),
            })?)),
            None => None,
        };
        let parts =
            VmParts { vmid: 1, vcpu_base: 0, stage2, vgic, vcpus, disk, vits, timer_slop_ns: cfg.timer_slop_ns, quota };
        Vm::from_plan(&vp, parts, host, nr_pcpus, None)
    }
}

/// Logs what Dom0 is given beyond RAM: an ACPI Dom0's forwarded SPIs, the
/// PCIe host bridges passed through.
fn log_dom0_devices(vp: &VmPlan, firmware: &GuestFirmware<'_>) {
    if matches!(firmware, GuestFirmware::Acpi(_)) {
        info!(
            "dom0 ACPI: {} SPIs forwarded (all but the hypervisor's UART, {})",
            vp.forwarded
                .iter()
                .filter(|f| !vp.bridges.iter().flat_map(|b| &b.intx).any(|i| i.intid == f.intid))
                .count(),
            vp.console_intid
        );
    }
    for b in &vp.bridges {
        info!(
            "dom0 PCIe: {} ECAM {:#x}+{:#x}, {} window(s) mapped, INTx {:?}",
            b.path,
            b.ecam.base,
            b.ecam.size,
            b.passthrough_frames(vp.ipa.limit()).len() - 1,
            b.intx.iter().map(|i| u32::from(i.intid)).collect::<Vec<_>>()
        );
    }
}
