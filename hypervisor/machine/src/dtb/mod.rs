//! Device-tree handling: what the machine is ([`discover`]) and what the
//! Dom0-style guest is told it runs on ([`build_guest_dtb`]).
//!
//! # Why this shape
//!
//! The hypervisor boots like Xen: firmware or QEMU hands it a DTB in `x0`,
//! and the guest kernel and initrd arrive as `/chosen/module@…` nodes of
//! Xen's multiboot binding (`multiboot,kernel`, `multiboot,ramdisk`, generic
//! `multiboot,module`), which QEMU's `-device guest-loader` writes for us.
//! [`discover`] turns that tree into two plain values — the [`Machine`] (RAM,
//! CPUs by MPIDR, the GICv3 frames, console UART, timer PPIs, virtio-mmio
//! slots, PSCI conduit) and the [`BootInfo`] (our own `/chosen/bootargs`, the
//! boot modules, the dom0less DomUs) — so the rest of the hypervisor never
//! touches the DTB.
//!
//! The guest gets the *host's* tree, edited: it sees the GIC at the same
//! addresses (we emulate distributor and redistributors there), but only its
//! own RAM, its vCPUs, PSCI over HVC, its command line and initrd, and none of
//! the devices the hypervisor keeps (see [`default_removals`]). Rather than
//! patching the blob in place, [`build_guest_dtb`] walks the host tree and
//! writes a new one with `vm-fdt`, copying every kept property byte for byte
//! (phandles therefore stay valid) and substituting the nodes it owns. A fresh
//! write has no NOP tokens, no stale strings, an empty reservation block, and
//! cannot inherit a layout quirk of the input.
//!
//! # Untrusted input
//!
//! `fdt` 0.1.5 panics on malformed blobs and on missing standard nodes, and a
//! panic at EL2 stops the machine. So: every blob is first checked by
//! `blob::check` (bounds, nesting, token order; NOPs removed),
//! only `all_nodes`/`children`/`properties` of the crate are used, and all
//! values are decoded here with explicit length checks (see `tree`). Errors
//! are a [`DtbError`]; nothing in this module is meant to panic on any input
//! (the tests feed truncated and randomly corrupted blobs to prove it).
//!
//! # Conventions
//!
//! * Cell counts are inherited from ancestors when a node does not state them
//!   (as Linux and Xen read trees); the root defaults to 2/1.
//! * Device addresses (`reg` of the GIC, its ITS, UARTs, virtio-mmio,
//!   memory and reserved-memory) are translated to CPU physical addresses
//!   through every ancestor bus's `ranges`, each level with its own cell
//!   counts; an empty `ranges` is the identity, a missing one means the bus
//!   is not memory-mapped (an error for a device we need). FVP puts its
//!   UART and virtio-mmio two buses down.
//! * Interrupts are resolved as Linux does: the interrupt parent is the
//!   first node with `#interrupt-cells` reached through `interrupt-parent`
//!   links or tree parents; an `interrupt-map` nexus (with its mask, the
//!   device's unit address, and each map parent's own `#address-cells` and
//!   `#interrupt-cells`) is followed to the GIC, whose three-cell
//!   specifiers give INTIDs (SPI n → n+32, PPI n → n+16). An interrupt that
//!   ends at another controller is `Unsupported`.
//! * CPUs are identified by their full MPIDR affinity (FVP: 0x0, 0x100, …,
//!   0x10300), never by an index.
//! * Nodes with `status` other than `okay` are ignored by [`discover`].

pub(crate) mod blob;
mod discover;
pub mod dom0less;
mod guest;
pub use guest::control_node;
pub(crate) mod tree;

#[cfg(test)]
mod tests;

use crate::intid::IntId;
pub use crate::region::Region;
use crate::spec::VmSpec;
use alloc::string::String;
use alloc::vec::Vec;
use dom0less::DomainError;

pub use discover::discover;
pub use guest::{build_guest_dtb, default_removals, DEFAULT_REMOVE_COMPATIBLES};
pub use tree::Irq;

/// Why a device tree could not be read or written.
#[derive(thiserror::Error, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DtbError {
    /// Not a structurally valid flattened device tree.
    #[error("malformed device tree")]
    Parse,
    /// The buffer is shorter than the header (or its `totalsize`) says.
    #[error("device tree truncated")]
    Truncated,
    /// Valid, but uses something we do not handle (named).
    #[error("unsupported device tree feature: {0}")]
    Unsupported(&'static str),
    /// A node or property we need is absent (named).
    #[error("device tree lacks {0}")]
    Missing(&'static str),
    /// A property has the wrong size or an impossible value (named).
    #[error("bad device tree value: {0}")]
    BadValue(&'static str),
    /// A value does not fit in the cells the tree uses for it.
    #[error("value does not fit its device tree cells")]
    TooBig,
    /// `vm-fdt` refused to write the guest tree (its reason).
    #[error("cannot write device tree: {0}")]
    Write(&'static str),
    /// A dom0less domain node (`/chosen/domU*`) is unusable.
    #[error("{0}")]
    Domain(DomainError),
}

impl From<vm_fdt::Error> for DtbError {
    fn from(e: vm_fdt::Error) -> Self {
        use vm_fdt::Error as E;
        DtbError::Write(match e {
            E::InvalidNodeName => "invalid node name",
            E::InvalidPropertyName => "invalid property name",
            E::InvalidString => "string contains NUL",
            E::NodeDepthTooLarge => "nesting too deep",
            E::PropertyValueTooLarge | E::TotalSizeTooLarge => "too large",
            E::DuplicatePhandle => "duplicate phandle",
            _ => "writer misuse",
        })
    }
}

/// The GICv3 (or v4: the DTB cannot tell them apart) interrupt controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GicInfo {
    /// 3 for `arm,gic-v3`; GICv4 shows only in GICD_PIDR2/GICR_TYPER.
    pub version: u8,
    pub gicd: Region,
    /// Redistributor regions (`#redistributor-regions`, default 1).
    pub gicr: Vec<Region>,
    /// The first enabled `arm,gic-v3-its` child: the ITS the hypervisor drives.
    pub its: Option<Region>,
    /// Every other ITS (the MADT's further GIC ITS structures, further
    /// enabled `arm,gic-v3-its` children): undriven, and never a guest's to
    /// map (each would translate any device's MSIs into any LPI).
    pub other_its: Vec<Region>,
    /// INTID of the virtual-interface maintenance interrupt (PPI 9 → 25).
    pub maintenance_intid: Option<IntId>,
    /// The controller's phandle, if it has one.
    pub phandle: Option<u32>,
}

/// The console UART: `/chosen/stdout-path` (or, failing that, the first
/// `arm,pl011`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UartInfo {
    pub base: u64,
    pub size: u64,
    pub intid: IntId,
    /// Full node path, e.g. `/pl011@9000000`.
    pub path: String,
    /// First `compatible` string (e.g. `arm,pl011`).
    pub compatible: String,
}

/// An MMIO device with one interrupt (virtio-mmio slots).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MmioDevice {
    pub base: u64,
    pub size: u64,
    pub intid: IntId,
    /// Edge-triggered (flags 1/2) rather than level (4/8).
    pub edge: bool,
    pub path: String,
}

/// Generic timer interrupts (`arm,armv8-timer`, order: secure phys,
/// non-secure phys, virtual, hypervisor phys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerInfo {
    pub phys_intid: IntId,
    pub virt_intid: IntId,
    pub hyp_intid: IntId,
}

/// A boot module from `/chosen/module@…` (Xen's multiboot binding).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootModule {
    pub base: u64,
    pub size: u64,
    /// The module node's `bootargs` (the guest kernel's command line).
    pub bootargs: Option<String>,
}

/// The address space a PCI `ranges` entry maps (`phys.hi` bits 25:24).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PciSpace {
    /// Configuration space (code 0; not used in a host bridge's `ranges`).
    Config,
    /// I/O space (code 1), memory-mapped by the bridge.
    Io,
    /// 32-bit memory space (code 2).
    Mem32,
    /// 64-bit memory space (code 3).
    Mem64,
}

/// One `ranges` entry of a PCI host bridge: PCI bus addresses
/// `[pci_addr, pci_addr + cpu.size)` appear at CPU addresses `cpu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciWindow {
    pub space: PciSpace,
    /// `phys.hi` bit 30.
    pub prefetchable: bool,
    pub pci_addr: u64,
    /// The CPU physical window (translated through the bridge's ancestors).
    pub cpu: Region,
}

/// One `msi-map` entry (PCI MSI binding): requester IDs
/// `[rid_base, rid_base + length)` are DeviceIDs `[msi_base, …)` of the MSI
/// controller with phandle `msi_controller` (the ITS on QEMU virt).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsiMapEntry {
    pub rid_base: u32,
    pub msi_controller: u32,
    pub msi_base: u32,
    pub length: u32,
}

/// One `iommu-map` entry (PCI IOMMU binding, `#iommu-cells = 1`): requester
/// IDs `[rid_base, rid_base + length)` are StreamIDs `[sid_base, …)` of the
/// IOMMU with phandle `iommu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IommuMapEntry {
    pub rid_base: u32,
    pub iommu: u32,
    pub sid_base: u32,
    pub length: u32,
}

impl IommuMapEntry {
    /// The StreamID requester ID `rid` (already masked) has through this
    /// entry, if the entry covers it.
    pub fn stream_of(&self, rid: u32) -> Option<u32> {
        let off = rid.checked_sub(self.rid_base)?;
        (off < self.length).then(|| self.sid_base.wrapping_add(off))
    }
}

/// An SMMUv3 (`arm,smmu-v3`): the hypervisor's, never a guest's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmmuInfo {
    /// Full node path, e.g. `/smmuv3@9050000`.
    pub path: String,
    /// The register frames (page 0 and page 1: 128 KiB).
    pub regs: Region,
    pub phandle: Option<u32>,
    /// The event queue's and the global error's wired interrupts
    /// (`interrupt-names` "eventq", "gerror"; absent when the node names
    /// none: the driver then polls).
    pub eventq: Option<IntId>,
    pub gerror: Option<IntId>,
    /// `dma-coherent`: its table and queue walks snoop the CPU's caches.
    pub coherent: bool,
}

/// A generic ECAM PCIe host bridge (`pci-host-ecam-generic`), as QEMU virt
/// describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcieHost {
    /// Full node path, e.g. `/pcie@10000000`.
    pub path: String,
    /// The ECAM configuration space (1 MiB per bus).
    pub ecam: Region,
    /// `bus-range` (first, last); `(0, 255)` when absent.
    pub bus_range: (u8, u8),
    /// The `ranges` windows, in tree order.
    pub windows: Vec<PciWindow>,
    /// The distinct GIC interrupts the `interrupt-map` routes INTA..INTD of
    /// every slot to, in map order (QEMU virt: four level SPIs, INTID 35..38).
    pub intx: Vec<Irq>,
    /// `msi-map` entries (empty when absent).
    pub msi_map: Vec<MsiMapEntry>,
    /// `msi-map-mask`, when present.
    pub msi_map_mask: Option<u32>,
    /// `msi-parent` cells as written (phandle, then any MSI specifier).
    pub msi_parent: Vec<u32>,
    /// `iommu-map` entries (empty when absent: the bridge's DMA is not
    /// behind an IOMMU the description names).
    pub iommu_map: Vec<IommuMapEntry>,
    /// `iommu-map-mask`, when present.
    pub iommu_map_mask: Option<u32>,
}

impl PcieHost {
    /// What passing the bridge through maps into a guest whose IPA space is
    /// `ipa_size` bytes: the ECAM, then every I/O and memory window that
    /// ends inside it (the windows the guest DTB keeps, see
    /// [`GuestDtbConfig::ipa_size`]).
    pub fn passthrough_frames(&self, ipa_size: u64) -> Vec<Region> {
        let windows = self
            .windows
            .iter()
            .filter(|w| w.space != PciSpace::Config && w.cpu.size != 0 && w.cpu.end() <= ipa_size)
            .map(|w| w.cpu);
        core::iter::once(self.ecam).chain(windows).collect()
    }
}

/// What the DT or ACPI says the board is: RAM, CPUs, interrupt controller,
/// console, timer, devices, firmware conduit. Hardware only: what to run on
/// it is the [`BootInfo`] beside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    /// RAM from `device_type = "memory"` nodes (or the EFI memory map), in
    /// order.
    pub memory: Vec<Region>,
    /// Memory-reservation block entries and `/reserved-memory/*` `reg`s.
    pub reserved: Vec<Region>,
    /// MPIDR affinity (the `cpu@` node's `reg`), in tree order.
    pub cpus: Vec<u64>,
    pub gic: GicInfo,
    pub uart: Option<UartInfo>,
    pub timer: TimerInfo,
    /// The PMU's overflow interrupt (a PPI): the `arm,armv8-pmuv3` node's,
    /// or the MADT's GICC performance interrupt; `None` when the
    /// description names no PMU.
    pub pmu_intid: Option<IntId>,
    /// Enabled `virtio,mmio` nodes, in tree order.
    pub virtio_mmio: Vec<MmioDevice>,
    /// Enabled PCIe host bridges (`pci-host-ecam-generic`), in tree order.
    pub pcie: Vec<PcieHost>,
    /// Enabled SMMUv3s (`arm,smmu-v3`), in tree order.
    pub smmus: Vec<SmmuInfo>,
    /// `/psci` `method` ("smc" or "hvc").
    pub psci_method: Option<String>,
}

/// What the boot loader handed over to run: the hypervisor's own options,
/// Dom0's modules and the dom0less DomUs (from `/chosen`, or on a UEFI boot
/// from the configuration file and the files it names).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BootInfo {
    /// `/chosen/bootargs` (or `xen,xen-bootargs`): the hypervisor's options.
    pub bootargs: Option<String>,
    pub kernel: Option<BootModule>,
    pub ramdisk: Option<BootModule>,
    /// The dom0less DomUs (`/chosen/domU*`, `compatible = "xen,domain"`),
    /// in tree order: see [`dom0less`].
    pub domus: Vec<VmSpec>,
}

impl BootInfo {
    /// The hypervisor's options ("" when there are none).
    pub fn options(&self) -> &str {
        self.bootargs.as_deref().unwrap_or("")
    }

    /// Dom0's initrd as a range.
    pub fn initrd(&self) -> Option<Region> {
        self.ramdisk.as_ref().map(|r| Region { base: r.base, size: r.size })
    }
}

/// How to edit the host tree into the guest's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuestDtbConfig {
    /// The guest's RAM (one `memory@` node replaces all host ones).
    pub memory: Region,
    /// One `cpu@` node per entry, `reg` = this affinity value.
    pub vcpu_mpidrs: Vec<u64>,
    /// Becomes `/chosen/bootargs`.
    pub bootargs: String,
    /// Becomes `linux,initrd-start`/`-end`; must lie inside `memory`.
    pub initrd: Option<Region>,
    /// Full paths of nodes to drop with their subtrees (see
    /// [`default_removals`]).
    pub remove_paths: Vec<String>,
    /// `virtio,mmio` nodes to add at the root; one at the same path as a host
    /// node replaces it.
    pub extra_virtio_mmio: Vec<MmioDevice>,
    /// Keep the GIC's `arm,gic-v3-its` nodes and the PCI bridges'
    /// `msi-map`/`msi-parent`/`msi-map-mask`. Off (the default) until the
    /// hypervisor emulates an ITS: the ITS nodes are dropped, and so are the
    /// bridges' MSI properties, which would name a missing node; PCI devices
    /// then use INTx.
    pub keep_its: bool,
    /// The guest's IPA space size in bytes: PCI `ranges` entries whose CPU
    /// window ends beyond it are dropped (stage 2 cannot map them; Linux
    /// then assigns BARs from the windows left). `None` keeps them all.
    pub ipa_size: Option<u64>,
    /// CPU ranges at the top of PCI memory windows that are not the
    /// guest's (BARs of functions assigned to DomUs): each window that ends
    /// with one is described without it.
    pub pci_carves: Vec<Region>,
    /// The control device's register page: a `/hypervisor/control@<base>`
    /// node (`hvrust,control-1`, see [`control_node`]); a host
    /// `/hypervisor` node is then left out.
    pub control: Option<Region>,
}
