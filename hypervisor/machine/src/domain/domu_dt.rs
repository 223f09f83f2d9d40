//! A DomU's device tree, built from scratch (a DomU sees nothing of the
//! host's tree): memory, the vCPUs with PSCI over HVC, the vGICv3's
//! distributor and redistributors where [`super::layout`] puts them, the
//! architected timer, the PMU (with a vPMU), a PL011 (with `vpl011`), the
//! hypervisor's virtio-blk (with a disk), with assigned PCIe functions an
//! ITS and a host bridge, and `/chosen` (bootargs, initrd, stdout-path).
//!
//! The DomU's machine is laid out like QEMU `virt`, so a kernel configured
//! for it finds what it expects: GICD 0x0800_0000, GICR 0x080A_0000, PL011
//! 0x0900_0000 (SPI 1), virtio-mmio 0x0A00_0000 (SPI 16), RAM at
//! 0x4000_0000.

use super::layout::{DOMU_GICD, DOMU_GICR, DOMU_UART, DOMU_UART_SPI, DOMU_VIRTIO, DOMU_VIRTIO_SPI, GICR_STRIDE};
use super::vmplan::{DOMU_ECAM, DOMU_ITS, DOMU_PCI_MMIO};
use crate::dtb::DtbError;
use crate::region::Region;
use alloc::format;
use alloc::vec::Vec;
use vm_fdt::FdtWriter;

/// What the DomU's tree says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomuDtConfig<'a> {
    /// Guest-physical RAM.
    pub ram: Region,
    /// One `cpu@` node each, `reg` = [`super::vcpu_mpidr`].
    pub vcpus: u32,
    pub bootargs: &'a str,
    /// Guest-physical initrd, inside `ram`.
    pub initrd: Option<Region>,
    /// A PL011 at [`DOMU_UART`] (and `stdout-path` to it).
    pub vpl011: bool,
    /// A virtio-mmio node at [`DOMU_VIRTIO`] for the hypervisor's disk.
    pub disk: bool,
    /// A virtual PMU whose overflow interrupt is this PPI (`crate::vpmu`).
    pub pmu_intid: Option<crate::intid::IntId>,
    /// Assigned PCIe functions, (device number on the virtual bus, ITS
    /// DeviceID): with any, an ITS at [`DOMU_ITS`] and a host bridge at
    /// [`DOMU_ECAM`] whose `msi-map` gives each its DeviceID.
    pub pci: Vec<(u8, u32)>,
}

const PHANDLE_GIC: u32 = 1;
const PHANDLE_CLK: u32 = 2;
const PHANDLE_ITS: u32 = 3;
/// GIC interrupt specifier types and flags (the `arm,gic-v3` binding).
const SPI: u32 = 0;
const PPI: u32 = 1;
const LEVEL_HIGH: u32 = 4;
const EDGE_RISING: u32 = 1;

fn reg(base: u64, size: u64) -> [u64; 2] {
    [base, size]
}

/// Builds the DomU's flattened device tree.
pub fn build_domu_dtb(cfg: &DomuDtConfig<'_>) -> Result<Vec<u8>, DtbError> {
    if cfg.vcpus == 0 || cfg.vcpus > super::layout::MAX_DOMU_VCPUS {
        return Err(DtbError::Write("a DomU has 1 to 64 vCPUs"));
    }
    if let Some(i) = cfg.initrd {
        if i.base < cfg.ram.base || i.end() > cfg.ram.end() {
            return Err(DtbError::Write("the initrd lies outside the DomU's RAM"));
        }
    }
    let mut w = FdtWriter::new()?;
    let root = w.begin_node("")?;
    w.property_string("compatible", "linux,dummy-virt")?;
    w.property_u32("#address-cells", 2)?;
    w.property_u32("#size-cells", 2)?;
    w.property_u32("interrupt-parent", PHANDLE_GIC)?;

    let chosen = w.begin_node("chosen")?;
    w.property_string("bootargs", cfg.bootargs)?;
    if let Some(i) = cfg.initrd {
        w.property_u64("linux,initrd-start", i.base)?;
        w.property_u64("linux,initrd-end", i.end())?;
    }
    if cfg.vpl011 {
        w.property_string("stdout-path", &format!("/pl011@{DOMU_UART:x}"))?;
    }
    if !cfg.pci.is_empty() {
        // The hypervisor placed the BARs (mapped in stage 2 where the BAR
        // registers say): the guest keeps them.
        w.property_u32("linux,pci-probe-only", 1)?;
    }
    w.end_node(chosen)?;

    let mem = w.begin_node(&format!("memory@{:x}", cfg.ram.base))?;
    w.property_string("device_type", "memory")?;
    w.property_array_u64("reg", &reg(cfg.ram.base, cfg.ram.size))?;
    w.end_node(mem)?;

    let cpus = w.begin_node("cpus")?;
    w.property_u32("#address-cells", 1)?;
    w.property_u32("#size-cells", 0)?;
    for i in 0..cfg.vcpus {
        let mpidr = super::vcpu_mpidr(i as usize);
        let c = w.begin_node(&format!("cpu@{mpidr:x}"))?;
        w.property_string("device_type", "cpu")?;
        w.property_string("compatible", "arm,armv8")?;
        w.property_u32("reg", mpidr as u32)?;
        w.property_string("enable-method", "psci")?;
        w.end_node(c)?;
    }
    w.end_node(cpus)?;

    let psci = w.begin_node("psci")?;
    w.property_string_list("compatible", alloc::vec!["arm,psci-1.0".into(), "arm,psci-0.2".into()])?;
    w.property_string("method", "hvc")?;
    w.end_node(psci)?;

    let gic = w.begin_node(&format!("intc@{DOMU_GICD:x}"))?;
    w.property_string("compatible", "arm,gic-v3")?;
    w.property_u32("#interrupt-cells", 3)?;
    w.property_null("interrupt-controller")?;
    w.property_u32("#redistributor-regions", 1)?;
    let gicr_size = u64::from(cfg.vcpus) * GICR_STRIDE;
    w.property_array_u64("reg", &[DOMU_GICD, 0x1_0000, DOMU_GICR, gicr_size])?;
    w.property_u32("phandle", PHANDLE_GIC)?;
    if !cfg.pci.is_empty() {
        write_its(&mut w)?;
    }
    w.end_node(gic)?;

    let timer = w.begin_node("timer")?;
    w.property_string("compatible", "arm,armv8-timer")?;
    // Secure physical, non-secure physical, virtual, hypervisor PPIs.
    w.property_array_u32(
        "interrupts",
        &[PPI, 13, LEVEL_HIGH, PPI, 14, LEVEL_HIGH, PPI, 11, LEVEL_HIGH, PPI, 10, LEVEL_HIGH],
    )?;
    w.property_null("always-on")?;
    w.end_node(timer)?;

    if let Some(p) = cfg.pmu_intid.filter(|p| p.is_ppi()) {
        let pmu = w.begin_node("pmu")?;
        w.property_string("compatible", "arm,armv8-pmuv3")?;
        w.property_array_u32("interrupts", &[PPI, p.raw() - 16, LEVEL_HIGH])?;
        w.end_node(pmu)?;
    }

    if cfg.vpl011 {
        let clk = w.begin_node("apb-pclk")?;
        w.property_string("compatible", "fixed-clock")?;
        w.property_u32("#clock-cells", 0)?;
        w.property_u32("clock-frequency", 24_000_000)?;
        w.property_string("clock-output-names", "clk24mhz")?;
        w.property_u32("phandle", PHANDLE_CLK)?;
        w.end_node(clk)?;

        let uart = w.begin_node(&format!("pl011@{DOMU_UART:x}"))?;
        w.property_string_list("compatible", alloc::vec!["arm,pl011".into(), "arm,primecell".into()])?;
        w.property_array_u64("reg", &reg(DOMU_UART, 0x1000))?;
        w.property_array_u32("interrupts", &[SPI, DOMU_UART_SPI, LEVEL_HIGH])?;
        w.property_array_u32("clocks", &[PHANDLE_CLK, PHANDLE_CLK])?;
        w.property_string_list("clock-names", alloc::vec!["uartclk".into(), "apb_pclk".into()])?;
        w.end_node(uart)?;
    }

    if cfg.disk {
        let v = w.begin_node(&format!("virtio_mmio@{DOMU_VIRTIO:x}"))?;
        w.property_string("compatible", "virtio,mmio")?;
        w.property_array_u64("reg", &reg(DOMU_VIRTIO, 0x200))?;
        w.property_array_u32("interrupts", &[SPI, DOMU_VIRTIO_SPI, EDGE_RISING])?;
        w.property_null("dma-coherent")?;
        w.end_node(v)?;
    }

    if !cfg.pci.is_empty() {
        write_pci_bridge(&mut w, &cfg.pci)?;
    }

    w.end_node(root)?;
    Ok(w.finish()?)
}

/// The ITS node under the GIC's (which gets the cells and `ranges` its
/// child needs).
fn write_its(w: &mut FdtWriter) -> Result<(), DtbError> {
    w.property_u32("#address-cells", 2)?;
    w.property_u32("#size-cells", 2)?;
    w.property_null("ranges")?;
    let its = w.begin_node(&format!("its@{:x}", DOMU_ITS.base))?;
    w.property_string("compatible", "arm,gic-v3-its")?;
    w.property_null("msi-controller")?;
    w.property_u32("#msi-cells", 1)?;
    w.property_array_u64("reg", &reg(DOMU_ITS.base, DOMU_ITS.size))?;
    w.property_u32("phandle", PHANDLE_ITS)?;
    w.end_node(its)?;
    Ok(())
}

/// A `pci-host-ecam-generic` bridge at [`DOMU_ECAM`], one bus, one 32-bit
/// window, whose `msi-map` gives each (device number, DeviceID) its ITS
/// DeviceID.
fn write_pci_bridge(w: &mut FdtWriter, pci: &[(u8, u32)]) -> Result<(), DtbError> {
    let node = w.begin_node(&format!("pcie@{:x}", DOMU_ECAM.base))?;
    w.property_string("compatible", "pci-host-ecam-generic")?;
    w.property_string("device_type", "pci")?;
    w.property_u32("#address-cells", 3)?;
    w.property_u32("#size-cells", 2)?;
    w.property_array_u32("bus-range", &[0, 0])?;
    w.property_u32("linux,pci-domain", 0)?;
    w.property_array_u64("reg", &reg(DOMU_ECAM.base, DOMU_ECAM.size))?;
    // One 32-bit memory window, PCI address = CPU address.
    let (b, sz) = (DOMU_PCI_MMIO.base, DOMU_PCI_MMIO.size);
    w.property_array_u32(
        "ranges",
        &[0x0200_0000, 0, b as u32, (b >> 32) as u32, b as u32, (sz >> 32) as u32, sz as u32],
    )?;
    let mut map = Vec::new();
    for &(slot, devid) in pci {
        map.extend_from_slice(&[u32::from(slot) << 3, PHANDLE_ITS, devid, 1]);
    }
    w.property_array_u32("msi-map", &map)?;
    w.property_null("dma-coherent")?;
    w.end_node(node)?;
    Ok(())
}
