//! [`PlanError`], every reason a VM cannot be made as asked, one line each
//! when displayed, with the conversions from the layout, route, bus and
//! domain errors the planner passes on.

use super::MapWhy;
use crate::boot::plan::LayoutError;
use crate::domain::layout::DomainError;
use crate::domain::DomainId;
use crate::irq::RouteError;
use crate::mmio_bus::BusError;
use crate::vpci::Bdf;
use alloc::string::String;
use core::fmt;

/// Why a VM cannot be made as asked. `Display` is one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// No kernel module to boot Dom0 from.
    NoKernel,
    /// A bridge's `iommu-map` names an IOMMU the description lacks.
    IommuMapMissing { bridge: String, phandle: u32 },
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
    /// `hv,pci-assigned` names a segment with no host bridge, or a function
    /// beyond its ECAM.
    PciNoBridge(Bdf),
    /// An assigned function below a switch (only root-bus functions can be).
    PciNotRootBus(Bdf),
    /// One function assigned twice.
    PciTwice(Bdf),
    /// An assigned function without an SMMU in front of it (or `iommu=off`).
    PciNeedsIommu(Bdf),
    /// An assigned function without an ITS DeviceID (no `msi-map`, no ITS).
    PciNeedsIts(Bdf),
    /// The function's bridge has no 32-bit non-prefetchable window.
    PciNoWindow(Bdf),
    /// A BAR that does not fit the room the plan has for it.
    PciBarTooBig { bdf: Bdf, index: u8, size: u64 },
    /// More than `pci::MAX_ASSIGNED` functions for one DomU.
    PciTooMany(DomainId),
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::NoKernel => write!(f, "no kernel module (/chosen/module@… multiboot,kernel)"),
            PlanError::IommuMapMissing { bridge, phandle } => write!(
                f,
                "{bridge}: iommu-map names phandle {phandle:#x}, which is no arm,smmu-v3 node (iommu=off boots without confining DMA)"
            ),
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
            PlanError::PciNoBridge(b) => write!(f, "hv,pci-assigned {b}: no such function's ECAM on the machine's host bridges"),
            PlanError::PciNotRootBus(b) => {
                write!(f, "hv,pci-assigned {b}: only functions on a host bridge's root bus can be assigned")
            }
            PlanError::PciTwice(b) => write!(f, "hv,pci-assigned {b}: the function is assigned twice"),
            PlanError::PciNeedsIommu(b) => write!(
                f,
                "hv,pci-assigned {b}: assigning a function needs an SMMU in front of its bridge (iommu-map) and iommu=on"
            ),
            PlanError::PciNeedsIts(b) => {
                write!(f, "hv,pci-assigned {b}: assigning a function needs an ITS and its bridge's msi-map")
            }
            PlanError::PciNoWindow(b) => {
                write!(f, "hv,pci-assigned {b}: its bridge has no 32-bit non-prefetchable memory window")
            }
            PlanError::PciBarTooBig { bdf, index, size } => {
                write!(f, "hv,pci-assigned {bdf}: BAR{index} of {size:#x} bytes does not fit the room for assigned BARs")
            }
            PlanError::PciTooMany(d) => {
                write!(f, "d{d}: more than {} assigned PCIe functions", super::MAX_ASSIGNED)
            }
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
