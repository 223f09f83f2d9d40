//! Planning Dom0 ([`plan_dom0`]): its [`VmSpec`] from the options and the
//! boot plan ([`dom0_spec`]), its devices as the disk mode and the firmware
//! kind decide (passthrough virtio-mmio and PCIe bridges, the emulated disk's
//! slot), the device-tree nodes hidden from it, its stage-2 mappings and the
//! SPIs forwarded to it.

use super::common::{bus_of, check_ipa, check_passthrough, forward, iomem_policy, needed_ipa_top, LPI_ROUTES};
use super::dma::{plan_dma, smmu_irqs};
use super::error::PlanError;
use super::pci::{cut, plan_pci, PciPlan};
use super::{
    DiskBacking, DiskPlan, Dom0Firmware, Forward, HwFacts, MapWhy, Mapping, VgicPlan, VmPlan, DOM0_MAX_SPIS, PAGE,
};
use crate::boot::plan::Plan;
use crate::config::{Config, DiskMode};
use crate::domain::VmSpec;
use crate::dtb::{BootInfo, Machine, MmioDevice, PcieHost};
use crate::intid::IntId;
use crate::mmio_bus::{Device, MmioRange};
use crate::region::Region;
use crate::stage2::{IpaSize, MemType};
use alloc::string::String;
use alloc::vec::Vec;

/// Dom0 as a [`VmSpec`], the same shape as a DomU's: from the options
/// (`dom0_max_vcpus`, `dom0_weight`, `dom0_cap`, `dom0_vcpus_pin`,
/// `dom0_heap_quota`, `dom0_kernel_load_addr`, the RAM disk's size), the
/// boot modules, and the RAM the boot plan gave it.
pub fn dom0_spec(machine: &Machine, boot: &BootInfo, plan: &Plan, cfg: &Config) -> Result<VmSpec, PlanError> {
    let Some(kernel) = &boot.kernel else {
        return Err(PlanError::NoKernel);
    };
    Ok(VmSpec {
        id: 0,
        name: String::from("Dom0"),
        memory: plan.guest_ram.size,
        vcpus: cfg.dom0_max_vcpus.unwrap_or(1),
        vpl011: machine.uart.is_some(),
        kernel: Region { base: kernel.base, size: kernel.size },
        ramdisk: boot.initrd(),
        bootargs: String::from(boot.options()),
        weight: cfg.dom0_weight,
        cap_percent: cfg.dom0_cap,
        disk_size: if cfg.disk == DiskMode::Ram { cfg.disk_size } else { 0 },
        heap_quota: cfg.dom0_heap_quota,
        kernel_load_addr: cfg.dom0_kernel_load_addr,
        pin_vcpus: cfg.dom0_vcpus_pin,
        cpus: alloc::vec::Vec::new(),
        pci: Vec::new(),
    })
}

/// Plans Dom0: identity-mapped RAM where the boot plan put it, the devices
/// `cfg.disk` asks for, and everything its firmware view implies.
pub fn plan_dom0(
    machine: &Machine,
    boot: &BootInfo,
    plan: &Plan,
    cfg: &Config,
    firmware: Dom0Firmware<'_>,
    hw: &HwFacts,
) -> Result<VmPlan, PlanError> {
    let spec = dom0_spec(machine, boot, plan, cfg)?;
    let nr_vcpus = spec.vcpus as usize;
    if nr_vcpus == 0 {
        return Err(PlanError::NoVcpus);
    }
    let ram = plan.guest_ram;
    let acpi = matches!(firmware, Dom0Firmware::Acpi { .. });
    if cfg.disk.emulated() && acpi {
        // Its virtio-mmio frame would need a DSDT entry, and the host's
        // DSDT is passed on unchanged.
        return Err(PlanError::EmulatedDiskOnAcpi);
    }

    let Dom0Devices { disk_slot, passthrough, bridges } = dom0_devices(machine, cfg, hw, acpi)?;
    // The IPA space: all of the physical address space for an ACPI Dom0
    // (its devices are found on demand, anywhere), else what the DT
    // describes for it; at most what the CPU implements (`stage2`).
    let pa_bits = hw.pa_bits;
    let ipa = IpaSize::choose(pa_bits, if acpi { 1 << pa_bits } else { needed_ipa_top(ram, &passthrough, &bridges) });
    // Functions assigned to DomUs: their ECAM pages and the top of the
    // 32-bit window their BARs take are not Dom0's.
    let pci = plan_pci(machine, cfg.iommu, hw.its_present, &hw.pci)?;
    let hidden_pages: Vec<Region> = if bridges.is_empty() {
        Vec::new()
    } else {
        pci.functions.iter().map(|f| Region { base: f.config, size: PAGE }).collect()
    };
    let pci_carves: Vec<Region> = pci.carves.iter().map(|c| c.1).collect();
    let holes: Vec<Region> = hidden_pages.iter().chain(&pci_carves).copied().collect();
    let pcie_frames: Vec<Region> =
        cut(&bridges.iter().flat_map(|b| b.passthrough_frames(ipa.limit())).collect::<Vec<_>>(), &holes);
    let mut ranges: Vec<Region> = passthrough.iter().map(|d| Region { base: d.base, size: d.size }).collect();
    ranges.extend(&pcie_frames);
    check_passthrough(machine, plan, &ranges, disk_slot.as_ref())?;

    let disk = dom0_disk(disk_slot.as_ref(), plan, cfg, hw)?;

    let hidden_paths = if acpi { Vec::new() } else { dom0_hidden_paths(machine, cfg, disk.as_ref(), &passthrough) };

    let mappings = dom0_mappings(ram, &passthrough, &firmware, &pcie_frames);
    check_ipa(&mappings, ipa)?;

    // The guest's ITS, at the host's address, when it has PCIe devices to
    // give MSIs to and the physical ITS backs them.
    let its = machine.gic.its.filter(|_| cfg.disk.pcie() && hw.its_present);
    // vGIC at the host's addresses, with as many SPIs as the hardware.
    let nr_spis = hw.nr_spis.min(DOM0_MAX_SPIS);
    let vgic = VgicPlan {
        gicd_base: machine.gic.gicd.base,
        gicr_base: machine.gic.gicr.first().map_or(0, |r| r.base),
        nr_spis,
        lpis: its.is_some(),
    };
    let console_intid = machine.uart.as_ref().map_or(hw.uart_intid, |u| u.intid);
    let smmu_irqs = smmu_irqs(machine, cfg.iommu);
    let forwarded = dom0_forwarded(nr_spis, &passthrough, &bridges, acpi, console_intid, &smmu_irqs);

    let dma = plan_dma(machine, cfg.iommu, &bridges, &mappings, its, &|b, rid| pci.takes_rid(b, rid))?;
    let its_devices = its.and_then(|_| its_devices(&bridges, &pci));

    let uart = machine.uart.as_ref().map(|u| Region { base: u.base, size: u.size.max(0x1000) });
    let mut bus = bus_of(&vgic, nr_vcpus, disk.as_ref(), uart, its);
    bus.extend(hidden_pages.iter().map(|p| (MmioRange::new(p.base, p.size), Device::PciHidden)));
    let control = control_page(plan);
    bus.push((MmioRange::new(control.base, control.size), Device::Control));
    let iomem = match firmware {
        Dom0Firmware::Acpi { memory, .. } => Some(iomem_policy(machine, plan, memory, &bus, ipa)),
        Dom0Firmware::Dt => None,
    };
    let p = VmPlan {
        spec,
        ipa,
        ram,
        ram_host: ram.base,
        mappings,
        passthrough,
        bridges,
        mmio: ranges,
        hidden_paths,
        disk,
        uart,
        uart_intid: console_intid,
        vgic,
        virt_timer_intid: machine.timer.virt_intid,
        phys_timer_intid: machine.timer.phys_intid,
        pmu_intid: hw.pmu_intid,
        hyp_timer_intid: machine.timer.hyp_intid,
        maintenance_intid: machine.gic.maintenance_intid.unwrap_or(hw.maintenance_intid),
        console_intid,
        kick_intid: hw.kick,
        its,
        its_devices,
        forwarded,
        bus,
        iomem,
        lpi_routes: LPI_ROUTES,
        dma,
        smmu_irqs,
        pci: Vec::new(),
        pci_carves,
        control: Some(control),
    };
    p.check_quota()?;
    p.routes()?;
    p.mmio_bus()?;
    Ok(p)
}

/// Where Dom0 finds the control device: the guest-physical page at the
/// hypervisor image's first page. Dom0's RAM is identity-mapped and never
/// holds the image, its stage 2 never maps it, and no device of the
/// machine sits there, on any platform; to Linux it is not System RAM, so
/// `/dev/mem` maps it (as Device memory) for `hvctl`.
fn control_page(plan: &Plan) -> Region {
    Region { base: plan.image.base & !(PAGE - 1), size: crate::control::FRAME_SIZE }
}

/// Dom0's devices, as `cfg.disk` and the firmware kind decide.
struct Dom0Devices {
    /// The virtio-mmio slot the emulated disk takes (if `cfg.disk` is one).
    disk_slot: Option<MmioDevice>,
    /// The virtio-mmio devices passed through.
    passthrough: Vec<MmioDevice>,
    /// The PCIe host bridges passed through.
    bridges: Vec<PcieHost>,
}

fn dom0_devices(machine: &Machine, cfg: &Config, hw: &HwFacts, acpi: bool) -> Result<Dom0Devices, PlanError> {
    // Disks. Passthrough: the virtio-mmio devices QEMU gives us, mapped
    // into the guest (Dom0-style). Emulated: our virtio-blk device takes
    // the slot of the last present device (or the last slot), so the guest
    // DTB keeps its node; slots sharing its 4 KiB page are not passed
    // through (stage 2 maps pages) and are hidden from the guest.
    let present = |d: &&MmioDevice| hw.present.contains(&d.base);
    let disk_slot: Option<MmioDevice> = if cfg.disk.emulated() {
        machine
            .virtio_mmio
            .iter()
            .filter(present)
            .max_by_key(|d| d.base)
            .or_else(|| machine.virtio_mmio.iter().max_by_key(|d| d.base))
            .cloned()
    } else {
        None
    };
    let same_page = |d: &MmioDevice| disk_slot.as_ref().is_some_and(|s| s.base & !(PAGE - 1) == d.base & !(PAGE - 1));
    let passthrough: Vec<MmioDevice> = match cfg.disk {
        // ACPI: the DSDT's devices (virtio-mmio slots among them) are
        // mapped when Dom0 touches them (`crate::iomem`), their SPIs
        // forwarded below: nothing to pass through by name.
        _ if acpi => Vec::new(),
        DiskMode::Passthrough => machine.virtio_mmio.clone(),
        DiskMode::None | DiskMode::VirtioPci | DiskMode::Nvme => Vec::new(),
        DiskMode::Ram | DiskMode::Backend => machine.virtio_mmio.iter().filter(|d| !same_page(d)).cloned().collect(),
    };
    // PCIe (dom0_disk=virtio-pci|nvme): the host bridges, Dom0-style, with
    // INTx; other modes hide them (their QEMU command lines put no device
    // behind them, and the guest boots without a bus scan). ACPI: the
    // DSDT's host bridge cannot be hidden (Linux finds its ECAM even without
    // an MCFG), so it is always passed through.
    let bridges: Vec<PcieHost> = if cfg.disk.pcie() || acpi { machine.pcie.clone() } else { Vec::new() };
    if cfg.disk.pcie() && bridges.is_empty() {
        return Err(PlanError::NoPcieBridge);
    }
    Ok(Dom0Devices { disk_slot, passthrough, bridges })
}

/// The emulated disk's plan, in `slot`, as `cfg.disk` asks.
fn dom0_disk(
    slot: Option<&MmioDevice>,
    plan: &Plan,
    cfg: &Config,
    hw: &HwFacts,
) -> Result<Option<DiskPlan>, PlanError> {
    Ok(match (slot, cfg.disk) {
        (Some(slot), DiskMode::Ram) => {
            let image = plan.ram_disk.ok_or(PlanError::NoRamDisk)?;
            Some(DiskPlan {
                base: slot.base,
                intid: slot.intid,
                backing: DiskBacking::Ram { image, latency_us: cfg.disk_latency_us },
            })
        }
        (Some(slot), DiskMode::Backend) => {
            if !hw.present.contains(&slot.base) {
                return Err(PlanError::NoPhysDisk);
            }
            Some(DiskPlan {
                base: slot.base,
                intid: slot.intid,
                backing: DiskBacking::Phys { size: slot.size.max(0x200) },
            })
        }
        (None, DiskMode::Ram | DiskMode::Backend) => return Err(PlanError::NoDiskSlot),
        _ => None,
    })
}

/// DT nodes a DT Dom0 does not see (besides the default removals): the
/// PCIe bridges unless its disk is behind one, and every virtio-mmio slot
/// neither passed through nor its emulated disk's.
fn dom0_hidden_paths(
    machine: &Machine,
    cfg: &Config,
    disk: Option<&DiskPlan>,
    passthrough: &[MmioDevice],
) -> Vec<String> {
    let mut hidden_paths = Vec::new();
    if !cfg.disk.pcie() {
        hidden_paths.extend(machine.pcie.iter().map(|b| b.path.clone()));
    }
    for d in &machine.virtio_mmio {
        let ours = disk.is_some_and(|s| s.base == d.base);
        if !ours && !passthrough.iter().any(|p| p.base == d.base) {
            hidden_paths.push(d.path.clone());
        }
    }
    hidden_paths
}

/// Dom0's stage 2: RAM, the passthrough device pages, ACPI firmware
/// memory, the bridges' ECAM and windows (page-rounded).
fn dom0_mappings(
    ram: Region,
    passthrough: &[MmioDevice],
    firmware: &Dom0Firmware<'_>,
    pcie_frames: &[Region],
) -> Vec<Mapping> {
    let mut mappings =
        Vec::from([Mapping { ipa: ram.base, pa: ram.base, size: ram.size, mem: MemType::Normal, why: MapWhy::Ram }]);
    let mut pages: Vec<u64> = Vec::new();
    for d in passthrough {
        let mut p = d.base & !(PAGE - 1);
        while p < d.base + d.size {
            if !pages.contains(&p) {
                mappings.push(Mapping { ipa: p, pa: p, size: PAGE, mem: MemType::Device, why: MapWhy::Passthrough });
                pages.push(p);
            }
            p += PAGE;
        }
    }
    if let Dom0Firmware::Acpi { firmware, .. } = firmware {
        for r in *firmware {
            mappings.push(Mapping {
                ipa: r.base,
                pa: r.base,
                size: r.size,
                mem: MemType::Normal,
                why: MapWhy::Firmware,
            });
        }
    }
    for r in pcie_frames {
        let base = r.base & !(PAGE - 1);
        let top = r.end().next_multiple_of(PAGE);
        mappings.push(Mapping { ipa: base, pa: base, size: top - base, mem: MemType::Device, why: MapWhy::PcieBridge });
    }
    mappings
}

/// The SPIs forwarded to Dom0 as HW interrupts: its passthrough devices',
/// the bridges' INTx lines and, with ACPI, every SPI the hypervisor does
/// not take.
fn dom0_forwarded(
    nr_spis: u32,
    passthrough: &[MmioDevice],
    bridges: &[PcieHost],
    acpi: bool,
    console_intid: IntId,
    smmu_irqs: &[IntId],
) -> Vec<Forward> {
    let mut forwarded = Vec::new();
    for d in passthrough {
        forward(&mut forwarded, nr_spis, d.intid, true);
    }
    // The bridges' INTx lines: level SPIs, forwarded as HW interrupts like
    // the virtio-mmio ones (the guest's EOI deactivates the physical SPI,
    // which the GIC then samples again while the line is high).
    for irq in bridges.iter().flat_map(|b| &b.intx) {
        forward(&mut forwarded, nr_spis, irq.intid, irq.edge);
    }
    // ACPI: every SPI the hypervisor does not take is Dom0's, forwarded as a
    // HW interrupt (Xen's acpi_route_spis): the DSDT names the devices'
    // interrupts to Dom0 only. Level until the guest's GICD_ICFGR says
    // otherwise (`Vgic::take_hw_triggers`).
    if acpi {
        let keep: Vec<IntId> = core::iter::once(console_intid).chain(smmu_irqs.iter().copied()).collect();
        for intid in crate::irq::acpi_dom0_spis(nr_spis, &keep) {
            forward(&mut forwarded, nr_spis, intid, false);
        }
    }
    forwarded
}

/// The DeviceIDs Dom0's devices have: every bridge's `msi-map` targets
/// (the ITS sees the DeviceID the map gives a requester ID), less those of
/// functions assigned to DomUs. `None` when a bridge has no map: nothing
/// then says which IDs are its.
fn its_devices(bridges: &[PcieHost], pci: &PciPlan) -> Option<Vec<(u32, u32)>> {
    if bridges.iter().any(|b| b.msi_map.is_empty()) {
        return None;
    }
    let all: Vec<Region> = bridges
        .iter()
        .flat_map(|b| b.msi_map.iter().map(|m| Region { base: u64::from(m.msi_base), size: u64::from(m.length) }))
        .collect();
    let taken: Vec<Region> = pci.functions.iter().map(|f| Region { base: u64::from(f.devid), size: 1 }).collect();
    Some(cut(&all, &taken).iter().map(|r| (r.base as u32, r.size as u32)).collect())
}
