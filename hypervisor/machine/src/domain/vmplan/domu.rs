//! Planning a DomU ([`plan_domu`]): its RAM at `DOMU_RAM_BASE` and nothing
//! else in stage 2, the emulated devices of its MMIO bus and its layout
//! inside its RAM.

use super::common::{bus_of, check_ipa, LPI_ROUTES};
use super::dma::plan_dma_assigned;
use super::error::PlanError;
use super::pci::{bar_mappings, plan_pci, AssignedPci, DOMU_ECAM, DOMU_ITS};
use super::ITS_TRANSLATER_OFFSET;
use super::{DiskBacking, DiskPlan, HwFacts, MapWhy, Mapping, VgicPlan, VmPlan, DOMU_SPIS};
use crate::boot::image::KernelLoad;
use crate::domain::layout::{self, DomuLayout, DOMU_GICD, DOMU_GICR, DOMU_UART, DOMU_UART_SPI};
use crate::domain::{DomuPlacement, VmSpec};
use crate::dtb::Machine;
use crate::intid::IntId;
use crate::mmio_bus::{Device, MmioRange};
use crate::region::Region;
use crate::stage2::{IpaSize, MemType};
use alloc::vec::Vec;

/// Plans DomU `spec` in `placement`: its RAM at `DOMU_RAM_BASE` (not
/// identity-mapped) and nothing else in stage 2, a vGICv3 with one
/// redistributor per vCPU, a vPL011 when asked, the hypervisor's virtio-blk
/// over its RAM disk. `load` is how its kernel loads
/// (`boot::image::read_kernel`). Also returns the
/// layout inside its RAM (kernel, initrd, DTB).
pub fn plan_domu(
    spec: &VmSpec,
    placement: &DomuPlacement,
    load: &KernelLoad,
    machine: &Machine,
    hw: &HwFacts,
) -> Result<(VmPlan, DomuLayout), PlanError> {
    let l = layout::layout_domu(spec, placement, load)?;
    let nr_vcpus = spec.vcpus as usize;
    let spi = |n: u32| IntId::spi(n).map_err(|_| PlanError::BadSpi(n));
    let disk = match l.disk {
        Some(image) => Some(DiskPlan {
            base: layout::DOMU_VIRTIO,
            intid: spi(layout::DOMU_VIRTIO_SPI)?,
            backing: DiskBacking::Ram { image, latency_us: 0 },
        }),
        None => None,
    };
    let uart = spec.vpl011.then_some(Region { base: DOMU_UART, size: 0x1000 });
    // Assigned PCIe functions: a host bridge and a vITS of its own, the
    // BARs in stage 2, the devices' DMA confined to its RAM.
    let pci_plan = plan_pci(machine, hw.iommu, hw.its_present, &hw.pci)?;
    let pci: Vec<&AssignedPci> = pci_plan.of(spec.id).filter(|f| spec.pci.contains(&f.bdf)).collect();
    let its = match (pci.is_empty(), machine.gic.its) {
        (true, _) => None,
        (false, Some(_)) => Some(DOMU_ITS),
        (false, None) => return Err(PlanError::PciNeedsIts(pci[0].bdf)),
    };
    let vgic = VgicPlan { gicd_base: DOMU_GICD, gicr_base: DOMU_GICR, nr_spis: DOMU_SPIS, lpis: its.is_some() };
    let ipa = IpaSize::DEFAULT;
    let ram =
        Mapping { ipa: l.ram.ipa.base, pa: l.ram.host, size: l.ram.ipa.size, mem: MemType::Normal, why: MapWhy::Ram };
    let mut mappings = Vec::from([ram]);
    mappings.extend(bar_mappings(&pci));
    check_ipa(&mappings, ipa)?;
    let dma = match (its, machine.gic.its) {
        (Some(v), Some(host_its)) => plan_dma_assigned(&pci, ram, v.base + ITS_TRANSLATER_OFFSET, host_its),
        _ => None,
    };
    let mut bus = bus_of(&vgic, nr_vcpus, disk.as_ref(), uart, its);
    if !pci.is_empty() {
        bus.push((MmioRange::new(DOMU_ECAM.base, DOMU_ECAM.size), Device::Vpci));
    }
    let p = VmPlan {
        spec: spec.clone(),
        ipa,
        ram: l.ram.ipa,
        ram_host: l.ram.host,
        mappings,
        passthrough: Vec::new(),
        bridges: Vec::new(),
        mmio: Vec::new(),
        hidden_paths: Vec::new(),
        disk,
        uart,
        uart_intid: spi(DOMU_UART_SPI)?,
        vgic,
        // The virtual timer is the one physical interrupt a DomU gets: the
        // PPI of the pCPU its vCPU runs on, forwarded as for Dom0.
        virt_timer_intid: machine.timer.virt_intid,
        phys_timer_intid: machine.timer.phys_intid,
        pmu_intid: hw.pmu_intid,
        hyp_timer_intid: machine.timer.hyp_intid,
        maintenance_intid: machine.gic.maintenance_intid.unwrap_or(hw.maintenance_intid),
        // Not consulted (physical interrupts go by Dom0's table); kept so
        // every VM has the same shape.
        console_intid: machine.uart.as_ref().map_or(hw.uart_intid, |u| u.intid),
        kick_intid: hw.kick,
        its,
        forwarded: Vec::new(),
        bus,
        iomem: None,
        lpi_routes: if its.is_some() { LPI_ROUTES } else { 0 },
        dma,
        // Its vITS maps its functions' DeviceIDs and no other.
        its_devices: its.map(|_| pci.iter().map(|f| (f.devid, 1)).collect()),
        smmu_irqs: Vec::new(),
        pci: pci.into_iter().cloned().collect(),
        pci_carves: Vec::new(),
        control: None,
    };
    p.check_quota()?;
    p.routes()?;
    p.mmio_bus()?;
    Ok((p, l))
}
