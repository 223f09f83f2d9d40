//! The plan/apply split for building a VM: a pure function decides each
//! VM's machine from the machine description, the boot plan and the
//! options, and `runtime::vm` (Dom0) and `runtime::domu` (DomUs) apply it.
//!
//! **Planned here** (host-tested, `domain::vmplan_tests`): the IPA size;
//! every stage-2 mapping (IPA range → PA, memory type, and why: RAM,
//! passthrough virtio-mmio page, ACPI firmware memory, PCIe bridge ECAM or
//! window); the passthrough devices and PCIe host bridges; which
//! virtio-mmio slot the hypervisor's virtio-blk takes and its backing; the
//! device-tree nodes hidden from a DT Dom0; the emulated devices of the MMIO
//! bus (vGIC distributor and redistributors, vPL011, virtio-blk, the vITS
//! control frame); the SPIs forwarded as HW interrupts (edge or level); the
//! physical interrupts the run loop takes (`irq::IrqRoutes` sources); the vGIC
//! configuration; an ACPI Dom0's on-demand device memory policy
//! (`iomem::IoMemPolicy`, its deny list). Every impossible request is a
//! typed [`PlanError`]: a passthrough range over RAM or the hypervisor's
//! own ranges, a mapping outside the IPA space, two interrupt sources on one
//! INTID, two emulated devices on one address, a disk mode the machine
//! cannot serve, a DomU that does not fit.
//!
//! **Applied at EL2**: copying modules and zeroing memory, the guest DTB or
//! an ACPI Dom0's tables (they need the host's blob), allocating stage-2
//! frames and mapping what the plan lists, making the vGIC, vITS and disk
//! objects, the scheduler entries, and GICv4 vPEs.
//!
//! What the planner cannot learn from data is passed in as [`HwFacts`]
//! (read from the hardware by the caller): the PA size, the distributor's
//! SPI count, whether a physical ITS works, which virtio-mmio slots hold a
//! device.
//!
//! # Modules
//!
//! This file holds the plan's types ([`VmPlan`] and its parts, [`HwFacts`])
//! and re-exports the planners and their error, so `domain::vmplan::X`
//! names them all.
//!
//! - `error`: [`PlanError`];
//! - `common`: the checks and lists both planners share;
//! - `dma`: [`plan_dma`], a VM's streams and its devices' stage 2 under
//!   the SMMU;
//! - `dom0`: [`dom0_spec`] and [`plan_dom0`];
//! - `domu`: [`plan_domu`];
//! - `pci`: [`plan_pci`], the PCIe functions assigned to DomUs.

use crate::domain::VmSpec;
use crate::dtb::{MmioDevice, PcieHost};
use crate::intid::IntId;
use crate::iomem::IoMemPolicy;
use crate::irq::{HostIrqs, IrqRoutes, RouteError};
use crate::mmio_bus::{BusError, Device, MmioBus, MmioRange};
use crate::region::Region;
use crate::stage2::{IpaSize, MemType};
use alloc::string::String;
use alloc::vec::Vec;

mod common;
mod dma;
mod dom0;
mod domu;
mod error;
mod pci;

pub use common::LPI_ROUTES;
pub use dma::{plan_dma, smmu_irqs, DmaPlan, StreamRange, DMA_BUSES, ITS_TRANSLATER_OFFSET};
pub use dom0::{dom0_spec, plan_dom0};
pub use domu::plan_domu;
pub use error::PlanError;
pub use pci::{
    bar_mappings, cut, locate, plan_pci, AssignedPci, PciPlan, PlacedBar, ProbedPci, DOMU_ECAM, DOMU_ITS, DOMU_PCI_MMIO,
};

const PAGE: u64 = 4096;

/// The most PCIe functions one DomU may be given (`pci`).
pub const MAX_ASSIGNED: usize = 8;

/// The most SPIs a Dom0's vGIC presents (INTIDs up to 1019).
pub const DOM0_MAX_SPIS: u32 = 988;
/// A DomU's SPIs (the vGIC needs at least 32).
pub const DOMU_SPIS: u32 = 32;

/// What the caller read from the hardware (or a test makes up).
#[derive(Clone, Debug)]
pub struct HwFacts {
    /// The CPU's physical address size (ID_AA64MMFR0_EL1.PARange).
    pub pa_bits: u32,
    /// SPIs the physical distributor implements (GICD_TYPER.ITLinesNumber).
    pub nr_spis: u32,
    /// The physical ITS is initialised and can back a guest's MSIs.
    pub its_present: bool,
    /// Bases of the virtio-mmio slots that hold a device (MagicValue "virt",
    /// non-zero DeviceID).
    pub present: Vec<u64>,
    /// The platform's fallback INTIDs when the description names none
    /// (`platform_desc::Platform`): the UART's and the maintenance PPI.
    pub uart_intid: IntId,
    pub maintenance_intid: IntId,
    /// The SGI one pCPU sends another (`runtime::percpu::SGI_KICK`).
    pub kick: IntId,
    /// The PMU's overflow PPI when guests get a vPMU (`crate::vpmu`):
    /// the CPU's PMU allows it, the platform names the interrupt and the
    /// `vpmu` option is on.
    pub pmu_intid: Option<IntId>,
    /// The `iommu=` option: assigning a PCIe function needs the SMMU.
    pub iommu: crate::config::IommuMode,
    /// The PCIe functions assigned to DomUs, as the EL2 probe read them
    /// (`hv,pci-assigned`; see [`plan_pci`]).
    pub pci: Vec<ProbedPci>,
}

/// What Dom0 learns the machine from.
#[derive(Clone, Copy, Debug)]
pub enum Dom0Firmware<'a> {
    /// A device tree derived from the host's.
    Dt,
    /// ACPI: `firmware` is host firmware memory Dom0 reads (identity-mapped
    /// as normal memory); `memory` every non-MMIO range of the firmware's
    /// memory map (never mapped on demand).
    Acpi { firmware: &'a [Region], memory: &'a [Region] },
}

/// Why a stage-2 mapping exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapWhy {
    Ram,
    /// One page of passthrough virtio-mmio registers.
    Passthrough,
    /// ACPI reclaim/NVS memory an ACPI Dom0 reads.
    Firmware,
    /// A PCIe host bridge's ECAM or a window (page-rounded).
    PcieBridge,
    /// The ITS's GITS_TRANSLATER page, in the devices' stage 2 only
    /// (`dma`): their MSIs are writes to it.
    Doorbell,
    /// A BAR of a PCIe function assigned to a DomU (`pci`).
    PciBar,
}

/// One stage-2 mapping: `size` bytes at `ipa` → `pa`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub ipa: u64,
    pub pa: u64,
    pub size: u64,
    pub mem: MemType,
    pub why: MapWhy,
}

/// A physical SPI forwarded to the guest under the same INTID as a HW
/// interrupt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forward {
    pub intid: IntId,
    /// Edge-triggered (virtio-mmio); PCI INTx and ACPI SPIs are level.
    pub edge: bool,
}

/// What backs the hypervisor's virtio-blk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskBacking {
    /// A RAM image in host memory no stage 2 maps, with a service time.
    Ram { image: Region, latency_us: u64 },
    /// The physical virtio-blk device in the same slot (`dom0_disk=backend`),
    /// driven by the hypervisor; its SPI is routed to the disk.
    Phys { size: u64 },
}

/// The hypervisor's virtio-blk device of a VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskPlan {
    /// Its virtio-mmio frame (guest-physical).
    pub base: u64,
    /// The virtual INTID it raises (for `Phys`, also the physical one).
    pub intid: IntId,
    pub backing: DiskBacking,
}

/// The vGIC a VM gets (`vgic::VgicConfig` without the vCPU MPIDRs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VgicPlan {
    pub gicd_base: u64,
    pub gicr_base: u64,
    pub nr_spis: u32,
    pub lpis: bool,
}

/// Everything a VM is made of, as data.
#[derive(Clone, Debug)]
pub struct VmPlan {
    /// What the VM was asked to be (Dom0's from [`dom0_spec`]): its id,
    /// scheduling parameters, vCPU count and heap quota are read from here.
    pub spec: VmSpec,
    pub ipa: IpaSize,
    /// Guest-physical RAM, and the host address behind its base.
    pub ram: Region,
    pub ram_host: u64,
    /// Stage 2, in the order to map.
    pub mappings: Vec<Mapping>,
    /// Passthrough virtio-mmio devices (Dom0).
    pub passthrough: Vec<MmioDevice>,
    /// PCIe host bridges passed through (Dom0).
    pub bridges: Vec<PcieHost>,
    /// The device ranges the guest is given (passthrough devices, the
    /// bridges' ECAM and windows inside the IPA space), not page-rounded:
    /// an ACPI Dom0's EFI memory map lists them as MMIO.
    pub mmio: Vec<Region>,
    /// Device-tree nodes hidden from a DT Dom0 beyond the default removals:
    /// unused PCIe bridges and virtio-mmio slots neither passed through nor ours.
    pub hidden_paths: Vec<String>,
    pub disk: Option<DiskPlan>,
    /// The vPL011's frame and virtual INTID.
    pub uart: Option<Region>,
    pub uart_intid: IntId,
    pub vgic: VgicPlan,
    /// The virtual timer PPI, HW-linked on every vCPU.
    pub virt_timer_intid: IntId,
    /// The EL1 physical timer's PPI (the guest's timer is emulated).
    pub phys_timer_intid: IntId,
    /// With a vPMU: the PMU's overflow PPI, HW-linked on every vCPU.
    pub pmu_intid: Option<IntId>,
    pub hyp_timer_intid: IntId,
    pub maintenance_intid: IntId,
    /// The hypervisor's console UART's physical INTID (`Route::Console`).
    pub console_intid: IntId,
    pub kick_intid: IntId,
    /// The guest's vITS control frame, when it gets one.
    pub its: Option<Region>,
    /// The DeviceIDs its vITS lets it map (`vgic::its::VitsConfig::devices`):
    /// its bridges' `msi-map` targets; `None` when a bridge has no map.
    pub its_devices: Option<Vec<(u32, u32)>>,
    pub forwarded: Vec<Forward>,
    /// The MMIO bus: guest-physical range → emulated device.
    pub bus: Vec<(MmioRange, Device)>,
    /// An ACPI Dom0's on-demand device memory; `None`: unmapped accesses abort.
    pub iomem: Option<IoMemPolicy>,
    /// Host LPIs the route table has room for.
    pub lpi_routes: usize,
    /// Its devices' streams and stage 2 under the SMMU; `None`: its
    /// devices (if any) are not behind one, or `iommu=off`.
    pub dma: Option<DmaPlan>,
    /// The SMMUs' wired interrupts (Dom0's route table takes the
    /// hypervisor's interrupts too).
    pub smmu_irqs: Vec<IntId>,
    /// The PCIe functions assigned to it (a DomU's; Dom0 has none).
    pub pci: Vec<AssignedPci>,
    /// Dom0: the tops of its bridges' 32-bit windows that DomUs' BARs take
    /// (`pci`), cut out of its stage 2 and of the windows its DT describes.
    pub pci_carves: Vec<Region>,
    /// Dom0: the control device's register page (`control`), for `hvctl`.
    pub control: Option<Region>,
}

impl VmPlan {
    /// Its vCPUs (the spec's count).
    pub fn nr_vcpus(&self) -> usize {
        self.spec.vcpus as usize
    }

    /// The quota holds what the VM's devices charge up front: the disk's
    /// largest request.
    pub fn check_quota(&self) -> Result<(), PlanError> {
        if self.disk.is_none() {
            return Ok(());
        }
        let needed = crate::virtio::blk::floor_cost(&crate::virtio::BlkConfig::new(0, false));
        if self.spec.heap_quota < needed {
            return Err(PlanError::HeapQuotaTooSmall { domid: self.spec.id, quota: self.spec.heap_quota, needed });
        }
        Ok(())
    }

    /// The VM's physical IRQ route table: the interrupts the run loop takes
    /// for it (its timers, maintenance, kick, console, the physical disk's
    /// SPI in backend mode, the forwarded SPIs).
    pub fn routes(&self) -> Result<IrqRoutes, RouteError> {
        let forwarded: Vec<IntId> = self.forwarded.iter().map(|f| f.intid).collect();
        let phys_disk = self.disk.and_then(|d| matches!(d.backing, DiskBacking::Phys { .. }).then_some(d.intid));
        let h = HostIrqs {
            virt_timer: self.virt_timer_intid,
            pmu: self.pmu_intid,
            hyp_timer: self.hyp_timer_intid,
            maintenance: self.maintenance_intid,
            kick: self.kick_intid,
            uart: self.console_intid,
            phys_disk,
            forwarded: &forwarded,
            smmu: &self.smmu_irqs,
        };
        IrqRoutes::build(&h, self.lpi_routes)
    }

    /// The VM's MMIO bus.
    pub fn mmio_bus(&self) -> Result<MmioBus, BusError> {
        let mut bus = MmioBus::new();
        for (r, d) in &self.bus {
            bus.register(*r, *d)?;
        }
        Ok(bus)
    }
}
