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

use crate::boot::image::KernelLoad;
use crate::boot::plan::{self, LayoutError, Plan};
use crate::config::{Config, DiskMode};
use crate::domain::layout::{self, DomainError, DomuLayout, DOMU_GICD, DOMU_GICR, DOMU_UART, DOMU_UART_SPI};
use crate::domain::{DomainId, DomuPlacement, VmSpec};
use crate::dtb::{MmioDevice, PcieHost, Platform};
use crate::intid::IntId;
use crate::iomem::IoMemPolicy;
use crate::irq::{HostIrqs, IrqRoutes, RouteError};
use crate::mmio_bus::{BusError, Device, MmioBus, MmioRange};
use crate::region::Region;
use crate::stage2::{IpaSize, MemType};
use crate::vgic::{MAX_SPIS, NR_PRIVATE};
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

const PAGE: u64 = 4096;

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
    /// scheduling parameters and heap quota are read from here.
    pub spec: VmSpec,
    pub nr_vcpus: usize,
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
    pub forwarded: Vec<Forward>,
    /// The MMIO bus: guest-physical range → emulated device.
    pub bus: Vec<(MmioRange, Device)>,
    /// An ACPI Dom0's on-demand device memory; `None`: unmapped accesses abort.
    pub iomem: Option<IoMemPolicy>,
    /// Host LPIs the route table has room for.
    pub lpi_routes: usize,
}

impl VmPlan {
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

/// Why a VM cannot be made as asked. `Display` is one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// No kernel module to boot Dom0 from.
    NoKernel,
    /// The VM's heap quota cannot hold its disk's largest request.
    HeapQuotaTooSmall { domid: DomainId, quota: u64, needed: u64 },
    /// `dom0_disk=virtio-pci|nvme` on a machine without a PCIe host bridge.
    NoPcieBridge,
    /// `dom0_disk=ram|backend` for an ACPI Dom0 (its frame would need a DSDT entry).
    EmulatedDiskOnAcpi,
    /// `dom0_disk=backend` without a physical virtio-blk device.
    NoPhysDisk,
    /// `dom0_disk=ram` but the boot plan placed no RAM disk.
    NoRamDisk,
    /// An emulated disk on a machine without a virtio-mmio slot to put it in.
    NoDiskSlot,
    /// A passthrough range over RAM or the hypervisor's own ranges (or wrapping).
    Layout(LayoutError),
    /// A mapping that ends beyond the IPA space.
    OutsideIpa { why: MapWhy, base: u64, size: u64, limit: u64 },
    /// Two of the VM's physical interrupt sources share an INTID.
    Routes(RouteError),
    /// Two emulated devices claim one guest-physical address.
    Bus(BusError),
    /// A DomU that cannot be laid out.
    Domain(DomainError),
    /// Zero vCPUs asked.
    NoVcpus,
    /// An SPI number with no INTID.
    BadSpi(u32),
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::NoKernel => write!(f, "no kernel module (/chosen/module@… multiboot,kernel)"),
            PlanError::NoPcieBridge => {
                write!(f, "a PCIe disk needs a PCIe host bridge (pci-host-ecam-generic) on the machine")
            }
            PlanError::EmulatedDiskOnAcpi => {
                write!(f, "dom0_disk=ram|backend is not available to an ACPI Dom0 (use nvme, virtio-pci or none)")
            }
            PlanError::NoPhysDisk => {
                write!(f, "dom0_disk=backend needs a virtio-blk device on the machine (QEMU -device virtio-blk-device)")
            }
            PlanError::NoRamDisk => write!(f, "dom0_disk=ram without a planned RAM disk"),
            PlanError::NoDiskSlot => write!(f, "an emulated disk needs a virtio-mmio slot on the machine"),
            PlanError::Layout(e) => write!(f, "{e}"),
            PlanError::OutsideIpa { why, base, size, limit } => {
                write!(f, "{why:?} mapping {base:#x}+{size:#x} ends beyond the IPA space ({limit:#x})")
            }
            PlanError::Routes(e) => write!(f, "IRQ routes: {e}"),
            PlanError::Bus(e) => write!(f, "MMIO bus: {e}"),
            PlanError::Domain(e) => write!(f, "{e}"),
            PlanError::NoVcpus => write!(f, "a VM needs at least one vCPU"),
            PlanError::HeapQuotaTooSmall { domid, quota, needed } => write!(
                f,
                "d{domid}'s heap quota of {quota} bytes cannot hold its disk's largest request ({needed} bytes): \
                 raise dom0_heap_quota= (Dom0) or hv,heap-quota (a DomU)"
            ),
            PlanError::BadSpi(n) => write!(f, "SPI {n} out of range"),
        }
    }
}

impl From<LayoutError> for PlanError {
    fn from(e: LayoutError) -> Self {
        PlanError::Layout(e)
    }
}
impl From<RouteError> for PlanError {
    fn from(e: RouteError) -> Self {
        PlanError::Routes(e)
    }
}
impl From<BusError> for PlanError {
    fn from(e: BusError) -> Self {
        PlanError::Bus(e)
    }
}
impl From<DomainError> for PlanError {
    fn from(e: DomainError) -> Self {
        PlanError::Domain(e)
    }
}

/// Host LPIs a Dom0's route table has room for (allocated when the VM is
/// made: adding a route never allocates). Each backs one guest MSI.
pub const LPI_ROUTES: usize = 1024;

/// Whether a vGIC with `nr_spis` SPIs can HW-link `intid` (an SPI it has,
/// below the special range): what `Vgic::set_hw` accepts.
fn vgic_has_spi(nr_spis: u32, intid: IntId) -> bool {
    let top = NR_PRIVATE + nr_spis.div_ceil(32).saturating_mul(32).min(MAX_SPIS);
    let raw = u32::from(intid);
    raw >= NR_PRIVATE && raw < top && intid < IntId::SPECIAL_FIRST
}

/// Pushes a forwarded SPI unless already there or the vGIC lacks it.
fn forward(out: &mut Vec<Forward>, nr_spis: u32, intid: IntId, edge: bool) {
    if !out.iter().any(|f| f.intid == intid) && vgic_has_spi(nr_spis, intid) {
        out.push(Forward { intid, edge });
    }
}

/// The end of the highest range a DT Dom0 must reach: its RAM, the
/// passthrough devices and the PCIe bridges' ECAM and windows.
fn needed_ipa_top(ram: Region, passthrough: &[MmioDevice], bridges: &[PcieHost]) -> u64 {
    let devices = passthrough.iter().map(|d| d.base.saturating_add(d.size));
    let pcie = bridges.iter().flat_map(|b| core::iter::once(b.ecam).chain(b.windows.iter().map(|w| w.cpu)));
    devices.chain(pcie.map(|r| r.base.saturating_add(r.size))).fold(ram.end(), u64::max)
}

/// Passthrough device frames must not reach RAM or anything the hypervisor
/// owns (its memory, the GIC, its UART and virtio-blk slot): the guest would
/// map them through stage 2.
fn check_passthrough(
    plat: &Platform,
    plan: &Plan,
    ranges: &[Region],
    own_disk: Option<&MmioDevice>,
) -> Result<(), LayoutError> {
    let mut hyp: Vec<(&'static str, Region)> = Vec::from([
        ("hypervisor image", plan.image),
        ("hypervisor heap", plan.heap),
        ("GIC distributor", plat.gic.gicd),
    ]);
    hyp.extend(plan.ram_disk.map(|r| ("RAM disk", r)));
    hyp.extend(plat.gic.gicr.iter().map(|r| ("GIC redistributors", *r)));
    hyp.extend(plat.gic.its.iter().chain(&plat.gic.other_its).map(|r| ("GIC ITS", *r)));
    hyp.extend(plat.uart.as_ref().map(|u| ("hypervisor UART", Region { base: u.base, size: u.size })));
    hyp.extend(own_disk.map(|d| ("hypervisor virtio-blk", Region { base: d.base, size: d.size })));
    for d in plan.domus.iter() {
        hyp.push(("DomU RAM", d.ram));
        hyp.extend(d.disk.map(|r| ("DomU RAM disk", r)));
    }
    plan::check_passthrough(&plat.memory, &hyp, ranges)
}

/// What an ACPI Dom0 may get mapped on demand: everything in the IPA space
/// but memory (any firmware memory-map entry that is not MMIO, the RAM the
/// machine description lists, the hypervisor's image, heap and RAM disk),
/// the GIC's frames, the hypervisor's UART and the emulated devices.
fn iomem_policy(
    plat: &Platform,
    plan: &Plan,
    memory: &[Region],
    bus: &[(MmioRange, Device)],
    ipa: IpaSize,
) -> IoMemPolicy {
    let mut p = IoMemPolicy::new(ipa.limit());
    for r in memory {
        p.deny("firmware memory", *r);
    }
    for r in &plat.memory {
        p.deny("RAM", *r);
    }
    for r in [plan.image, plan.heap].into_iter().chain(plan.ram_disk) {
        p.deny("hypervisor memory", r);
    }
    p.deny("GIC distributor", plat.gic.gicd);
    for r in &plat.gic.gicr {
        p.deny("GIC redistributors", *r);
    }
    for r in plat.gic.its.iter().chain(&plat.gic.other_its) {
        // The control frame and the translation frame after it.
        p.deny("GIC ITS", Region { base: r.base, size: r.size.max(2 * crate::its::CONTROL_FRAME_SIZE) });
    }
    if let Some(u) = &plat.uart {
        p.deny("hypervisor UART", Region { base: u.base, size: u.size.max(PAGE) });
    }
    for (r, _) in bus {
        p.deny("emulated device", Region { base: r.base, size: r.size });
    }
    p
}

/// The MMIO bus list: the vGIC's distributor and redistributors, the
/// virtio-blk frame, the vPL011's (one `vpl011::FRAME_SIZE` frame, whatever
/// the UART region's size) and the vITS control frame (the translation
/// frame above it stays out of stage 2: devices write the physical one).
fn bus_of(
    vgic: &VgicPlan,
    nr_vcpus: usize,
    disk: Option<&DiskPlan>,
    uart: Option<Region>,
    its: Option<Region>,
) -> Vec<(MmioRange, Device)> {
    let mut bus = Vec::from([
        (MmioRange::new(vgic.gicd_base, crate::vgic::regs::GICD_SIZE), Device::Vgic),
        (MmioRange::new(vgic.gicr_base, nr_vcpus as u64 * crate::vgic::regs::GICR_STRIDE), Device::Vgic),
    ]);
    bus.extend(disk.map(|d| (MmioRange::new(d.base, crate::virtio::mmio::FRAME_SIZE), Device::VirtioBlk)));
    bus.extend(uart.map(|u| (MmioRange::new(u.base, crate::vpl011::FRAME_SIZE), Device::Vpl011)));
    bus.extend(its.map(|r| (MmioRange::new(r.base, crate::its::CONTROL_FRAME_SIZE), Device::Vits)));
    bus
}

/// Refuses a mapping that ends beyond the IPA space.
fn check_ipa(mappings: &[Mapping], ipa: IpaSize) -> Result<(), PlanError> {
    for m in mappings {
        if m.ipa.checked_add(m.size).is_none_or(|e| e > ipa.limit()) {
            return Err(PlanError::OutsideIpa { why: m.why, base: m.ipa, size: m.size, limit: ipa.limit() });
        }
    }
    Ok(())
}

/// Dom0 as a [`VmSpec`], the same shape as a DomU's: from the options
/// (`dom0_max_vcpus`, `dom0_weight`, `dom0_cap`, `dom0_vcpus_pin`,
/// `dom0_heap_quota`, `dom0_kernel_load_addr`, the RAM disk's size), the
/// boot modules, and the RAM the boot plan gave it.
pub fn dom0_spec(plat: &Platform, plan: &Plan, cfg: &Config) -> Result<VmSpec, PlanError> {
    let Some(kernel) = &plat.kernel else {
        return Err(PlanError::NoKernel);
    };
    Ok(VmSpec {
        id: 0,
        name: String::from("Dom0"),
        memory: plan.guest_ram.size,
        vcpus: cfg.dom0_max_vcpus.unwrap_or(1),
        vpl011: plat.uart.is_some(),
        kernel: Region { base: kernel.base, size: kernel.size },
        ramdisk: plat.ramdisk.as_ref().map(|r| Region { base: r.base, size: r.size }),
        bootargs: plat.bootargs.clone().unwrap_or_default(),
        weight: cfg.dom0_weight,
        cap_percent: cfg.dom0_cap,
        disk_size: if cfg.disk == DiskMode::Ram { cfg.disk_size } else { 0 },
        heap_quota: cfg.dom0_heap_quota,
        kernel_load_addr: cfg.dom0_kernel_load_addr,
        pin_vcpus: cfg.dom0_vcpus_pin,
    })
}

/// Plans Dom0: identity-mapped RAM where the boot plan put it, the devices
/// `cfg.disk` asks for, and everything its firmware view implies.
pub fn plan_dom0(
    plat: &Platform,
    plan: &Plan,
    cfg: &Config,
    firmware: Dom0Firmware<'_>,
    hw: &HwFacts,
) -> Result<VmPlan, PlanError> {
    let spec = dom0_spec(plat, plan, cfg)?;
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

    let Dom0Devices { disk_slot, passthrough, bridges } = dom0_devices(plat, cfg, hw, acpi)?;
    // The IPA space: all of the physical address space for an ACPI Dom0
    // (its devices are found on demand, anywhere), else what the DT
    // describes for it; at most what the CPU implements (`stage2`).
    let pa_bits = hw.pa_bits;
    let ipa = IpaSize::choose(pa_bits, if acpi { 1 << pa_bits } else { needed_ipa_top(ram, &passthrough, &bridges) });
    let pcie_frames: Vec<Region> = bridges.iter().flat_map(|b| b.passthrough_frames(ipa.limit())).collect();
    let mut ranges: Vec<Region> = passthrough.iter().map(|d| Region { base: d.base, size: d.size }).collect();
    ranges.extend(&pcie_frames);
    check_passthrough(plat, plan, &ranges, disk_slot.as_ref())?;

    let disk = dom0_disk(disk_slot.as_ref(), plan, cfg, hw)?;

    let hidden_paths = if acpi { Vec::new() } else { dom0_hidden_paths(plat, cfg, disk.as_ref(), &passthrough) };

    let mappings = dom0_mappings(ram, &passthrough, &firmware, &pcie_frames);
    check_ipa(&mappings, ipa)?;

    // The guest's ITS, at the host's address, when it has PCIe devices to
    // give MSIs to and the physical ITS backs them.
    let its = plat.gic.its.filter(|_| cfg.disk.pcie() && hw.its_present);
    // vGIC at the host's addresses, with as many SPIs as the hardware.
    let nr_spis = hw.nr_spis.min(DOM0_MAX_SPIS);
    let vgic = VgicPlan {
        gicd_base: plat.gic.gicd.base,
        gicr_base: plat.gic.gicr.first().map_or(0, |r| r.base),
        nr_spis,
        lpis: its.is_some(),
    };
    let console_intid = plat.uart.as_ref().map_or(hw.uart_intid, |u| u.intid);
    let forwarded = dom0_forwarded(nr_spis, &passthrough, &bridges, acpi, console_intid);

    let uart = plat.uart.as_ref().map(|u| Region { base: u.base, size: u.size.max(0x1000) });
    let bus = bus_of(&vgic, nr_vcpus, disk.as_ref(), uart, its);
    let iomem = match firmware {
        Dom0Firmware::Acpi { memory, .. } => Some(iomem_policy(plat, plan, memory, &bus, ipa)),
        Dom0Firmware::Dt => None,
    };
    let p = VmPlan {
        spec,
        nr_vcpus,
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
        virt_timer_intid: plat.timer.virt_intid,
        phys_timer_intid: plat.timer.phys_intid,
        pmu_intid: hw.pmu_intid,
        hyp_timer_intid: plat.timer.hyp_intid,
        maintenance_intid: plat.gic.maintenance_intid.unwrap_or(hw.maintenance_intid),
        console_intid,
        kick_intid: hw.kick,
        its,
        forwarded,
        bus,
        iomem,
        lpi_routes: LPI_ROUTES,
    };
    p.check_quota()?;
    p.routes()?;
    p.mmio_bus()?;
    Ok(p)
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

fn dom0_devices(plat: &Platform, cfg: &Config, hw: &HwFacts, acpi: bool) -> Result<Dom0Devices, PlanError> {
    // Disks. Passthrough: the virtio-mmio devices QEMU gives us, mapped
    // into the guest (Dom0-style). Emulated: our virtio-blk device takes
    // the slot of the last present device (or the last slot), so the guest
    // DTB keeps its node; slots sharing its 4 KiB page are not passed
    // through (stage 2 maps pages) and are hidden from the guest.
    let present = |d: &&MmioDevice| hw.present.contains(&d.base);
    let disk_slot: Option<MmioDevice> = if cfg.disk.emulated() {
        plat.virtio_mmio
            .iter()
            .filter(present)
            .max_by_key(|d| d.base)
            .or_else(|| plat.virtio_mmio.iter().max_by_key(|d| d.base))
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
        DiskMode::Passthrough => plat.virtio_mmio.clone(),
        DiskMode::None | DiskMode::VirtioPci | DiskMode::Nvme => Vec::new(),
        DiskMode::Ram | DiskMode::Backend => plat.virtio_mmio.iter().filter(|d| !same_page(d)).cloned().collect(),
    };
    // PCIe (dom0_disk=virtio-pci|nvme): the host bridges, Dom0-style, with
    // INTx; other modes hide them (their QEMU command lines put no device
    // behind them, and the guest boots without a bus scan). ACPI: the
    // DSDT's host bridge cannot be hidden (Linux finds its ECAM even without
    // an MCFG), so it is always passed through.
    let bridges: Vec<PcieHost> = if cfg.disk.pcie() || acpi { plat.pcie.clone() } else { Vec::new() };
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
    plat: &Platform,
    cfg: &Config,
    disk: Option<&DiskPlan>,
    passthrough: &[MmioDevice],
) -> Vec<String> {
    let mut hidden_paths = Vec::new();
    if !cfg.disk.pcie() {
        hidden_paths.extend(plat.pcie.iter().map(|b| b.path.clone()));
    }
    for d in &plat.virtio_mmio {
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
        for intid in crate::irq::acpi_dom0_spis(nr_spis, &[console_intid]) {
            forward(&mut forwarded, nr_spis, intid, false);
        }
    }
    forwarded
}

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
    plat: &Platform,
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
    let vgic = VgicPlan { gicd_base: DOMU_GICD, gicr_base: DOMU_GICR, nr_spis: DOMU_SPIS, lpis: false };
    let ipa = IpaSize::DEFAULT;
    let mappings = Vec::from([Mapping {
        ipa: l.ram.ipa.base,
        pa: l.ram.host,
        size: l.ram.ipa.size,
        mem: MemType::Normal,
        why: MapWhy::Ram,
    }]);
    check_ipa(&mappings, ipa)?;
    let bus = bus_of(&vgic, nr_vcpus, disk.as_ref(), uart, None);
    let p = VmPlan {
        spec: spec.clone(),
        nr_vcpus,
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
        virt_timer_intid: plat.timer.virt_intid,
        phys_timer_intid: plat.timer.phys_intid,
        pmu_intid: hw.pmu_intid,
        hyp_timer_intid: plat.timer.hyp_intid,
        maintenance_intid: plat.gic.maintenance_intid.unwrap_or(hw.maintenance_intid),
        // Not consulted (physical interrupts go by Dom0's table); kept so
        // every VM has the same shape.
        console_intid: plat.uart.as_ref().map_or(hw.uart_intid, |u| u.intid),
        kick_intid: hw.kick,
        its: None,
        forwarded: Vec::new(),
        bus,
        iomem: None,
        lpi_routes: 0,
    };
    p.check_quota()?;
    p.routes()?;
    p.mmio_bus()?;
    Ok((p, l))
}
