//! The Dom0-style guest's device tree: the host tree, rewritten.
//!
//! [`build_guest_dtb`] walks the checked host tree depth-first and writes
//! each kept node again with `vm-fdt`, properties copied byte for byte so
//! that every phandle and every reference to one keeps its value. The nodes
//! the hypervisor owns are written fresh instead:
//!
//! * all `device_type = "memory"` nodes at the root → one `memory@<base>`
//!   holding the guest's RAM (`reg` in the root's cells);
//! * `/cpus` → its own properties plus one `cpu@<mpidr>` per vCPU
//!   (`compatible`/`device_type` from the first host CPU, `reg` = vMPIDR
//!   affinity, `enable-method = "psci"`); `cpu-map`, caches and anything else
//!   under `/cpus` are dropped, since they describe physical CPUs (host CPU
//!   phandles therefore disappear: on QEMU only `cpu-map` refers to them);
//! * `/psci` → PSCI 1.0/0.2 over `hvc` (the host's says `smc` under QEMU
//!   with virtualization=on, which would go to EL3 behind our back);
//! * `/chosen` → host properties kept (`stdout-path`, seeds, …) except the
//!   command line and initrd, which come from the config; the `module@`
//!   children are the hypervisor's boot modules and are dropped, and so are
//!   the dom0less DomU nodes (`compatible = "xen,domain"`).
//!
//! Nodes missing from the host (`/psci`, `/chosen`, `/cpus`, memory) are
//! created. Extra `virtio,mmio` nodes (the hypervisor's emulated devices) are
//! appended to the root; their interrupts inherit the root's
//! `interrupt-parent`, i.e. the GIC the guest sees at the host's address.
//!
//! The GICv3 node keeps only its first redistributor region (`reg` and
//! `#redistributor-regions = <1>`): the vGIC emulates Dom0's
//! redistributors there, and Linux reads every region's GICR_PIDR2, so a
//! further host region (QEMU virt's at 256 GiB with more than 123 CPUs)
//! would be an abort in the guest.
//!
//! PCI host bridges (`device_type = "pci"`) are copied with two edits:
//! `ranges` entries whose CPU window ends beyond the guest's IPA space
//! ([`GuestDtbConfig::ipa_size`]) are dropped (QEMU virt's 64-bit window at
//! 512 GiB does not fit a 39-bit stage 2), and, unless
//! [`GuestDtbConfig::keep_its`], the ITS nodes and every `msi-map`,
//! `msi-map-mask` and `msi-parent` (which would name the missing ITS) are
//! left out, so Linux uses INTx. `iommu-map`, `iommu-map-mask` and
//! `iommus` are always left out, with every SMMU node: the SMMU is the
//! hypervisor's. Only bridges at the root are trimmed
//! correctly: the entry's parent-bus address is taken as its CPU address.
//!
//! [`default_removals`] lists the QEMU-virt devices the hypervisor does not
//! hand to the guest, matched by `compatible`, never by address, together with
//! their dependants (`gpio-keys` points at the PL061), so removing them leaves
//! no dangling phandle.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use fdt::node::FdtNode;
use fdt::Fdt;
use vm_fdt::FdtWriter;

use super::blob;
use super::tree::{self, is_compatible, prop, prop_str, prop_u32, Cells, ROOT_CELLS};
use super::{DtbError, GuestDtbConfig, MmioDevice, Region};

/// Compatible strings whose nodes [`default_removals`] drops (any match).
///
/// The ITS is not listed: [`GuestDtbConfig::keep_its`] decides it (with the
/// PCI bridges' MSI properties that name it). Neither is the PCIe host
/// bridge: it is passed through Dom0-style unless the caller removes it.
pub const DEFAULT_REMOVE_COMPATIBLES: &[&str] = &[
    // QEMU firmware configuration interface.
    "qemu,fw-cfg-mmio",
    // NOR flash (firmware images).
    "cfi-flash",
    // GPIO controller, and the power-off key that references it.
    "arm,pl061",
    "gpio-keys",
    // RTC.
    "arm,pl031",
    // QEMU's dynamic sysbus (empty on a plain virt machine).
    "qemu,platform",
    // The SMMU is the hypervisor's (`smmu`): a guest programming it could
    // point its devices' DMA anywhere. The properties that name it go too
    // (`IOMMU_PROPS`).
    "arm,smmu-v3",
    // The PMU, unless the guest gets a vPMU (`crate::vpmu`): then its
    // registers trap and the ID registers hide it (`crate::traps`), so the
    // guest must not look for it.
    PMU_COMPATIBLE,
];

/// Properties that name an IOMMU: dropped everywhere, since every SMMU node
/// is (`DEFAULT_REMOVE_COMPATIBLES`) and the guest's DMA is the hypervisor's
/// to confine, invisibly.
const IOMMU_PROPS: &[&str] = &["iommu-map", "iommu-map-mask", "iommus"];

/// The PMU node's compatible string ([`default_removals`] keeps the node
/// for a guest with a vPMU).
pub const PMU_COMPATIBLE: &str = "arm,armv8-pmuv3";

/// Full paths of the nodes a Dom0-style guest must not see (see
/// [`DEFAULT_REMOVE_COMPATIBLES`]; the PMU stays when the guest has a
/// vPMU), in tree order. A node under an already listed one is not listed
/// again.
pub fn default_removals(dtb: &[u8], vpmu: bool) -> Result<Vec<String>, DtbError> {
    let checked = blob::check(dtb)?;
    let fdt = Fdt::new(&checked.blob).map_err(|_| DtbError::Parse)?;
    let idx = tree::Index::new(&fdt)?;
    let mut out: Vec<String> = Vec::new();
    for e in idx.iter() {
        let path = idx.path(e);
        if out.iter().any(|p| is_under(path, p)) {
            continue;
        }
        let removed = |c: &&str| !(vpmu && *c == PMU_COMPATIBLE) && is_compatible(e.node, c);
        if DEFAULT_REMOVE_COMPATIBLES.iter().any(removed) {
            out.push(path.to_string());
        }
    }
    Ok(out)
}

/// Is `path` equal to `ancestor` or inside its subtree?
fn is_under(path: &str, ancestor: &str) -> bool {
    path.strip_prefix(ancestor).is_some_and(|rest| rest.is_empty() || rest.starts_with('/') || ancestor == "/")
}

/// Writes the guest's tree; see the module documentation for the edits.
pub fn build_guest_dtb(host: &[u8], cfg: &GuestDtbConfig) -> Result<Vec<u8>, DtbError> {
    check_config(cfg)?;
    let checked = blob::check(host)?;
    let fdt = Fdt::new(&checked.blob).map_err(|_| DtbError::Parse)?;
    let root = tree::root(&fdt)?;

    let mut extra_paths = Vec::with_capacity(cfg.extra_virtio_mmio.len());
    for d in &cfg.extra_virtio_mmio {
        extra_paths.push(format!("/virtio_mmio@{:x}", d.base));
    }
    let remove: Vec<&str> =
        cfg.remove_paths.iter().map(|p| if p.len() > 1 { p.trim_end_matches('/') } else { p.as_str() }).collect();
    if remove.contains(&"/") {
        return Err(DtbError::BadValue("cannot remove the root node"));
    }

    let mut b = Builder {
        w: FdtWriter::new()?,
        cfg,
        remove,
        extra_paths,
        root_cells: tree::child_cells(root, ROOT_CELLS)?,
        memory_done: false,
        cpus_done: false,
        psci_done: false,
        chosen_done: false,
    };
    b.w.set_boot_cpuid_phys(cfg.vcpu_mpidrs[0] as u32);
    b.root(root)?;
    Ok(b.w.finish()?)
}

fn check_config(cfg: &GuestDtbConfig) -> Result<(), DtbError> {
    if cfg.vcpu_mpidrs.is_empty() {
        return Err(DtbError::BadValue("no vCPUs"));
    }
    for (i, m) in cfg.vcpu_mpidrs.iter().enumerate() {
        if cfg.vcpu_mpidrs[..i].contains(m) {
            return Err(DtbError::BadValue("duplicate vCPU MPIDR"));
        }
    }
    if cfg.memory.size == 0 || cfg.memory.base.checked_add(cfg.memory.size).is_none() {
        return Err(DtbError::BadValue("guest memory"));
    }
    if let Some(rd) = cfg.initrd {
        if rd.base < cfg.memory.base || rd.base.checked_add(rd.size).is_none_or(|end| end > cfg.memory.end()) {
            return Err(DtbError::BadValue("initrd outside guest memory"));
        }
    }
    if cfg.bootargs.contains('\0') {
        return Err(DtbError::BadValue("bootargs contains NUL"));
    }
    for (i, d) in cfg.extra_virtio_mmio.iter().enumerate() {
        if !d.intid.is_spi() {
            return Err(DtbError::BadValue("virtio-mmio interrupt must be an SPI"));
        }
        if cfg.extra_virtio_mmio[..i].iter().any(|o| o.base == d.base) {
            return Err(DtbError::BadValue("two virtio-mmio devices at one address"));
        }
    }
    Ok(())
}

/// A PCI bridge's `ranges` value without the entries whose parent-bus
/// window ends beyond `limit`, and each entry that ends with one of
/// `carves` shortened by it. `cells` are the bridge's own (3 address
/// cells, its size cells), `parent` its parent bus's.
fn pci_ranges_within(
    value: &[u8],
    cells: Cells,
    parent: Cells,
    limit: u64,
    carves: &[Region],
) -> Result<Vec<u8>, DtbError> {
    let (ca, pa, sc) = (cells.addr as usize, parent.addr as usize, cells.size as usize);
    if !(1..=2).contains(&pa) || !(1..=2).contains(&sc) {
        return Err(DtbError::Unsupported("pci ranges cells"));
    }
    let per = (ca + pa + sc) * 4;
    if per == 0 || !value.len().is_multiple_of(per) {
        return Err(DtbError::BadValue("pci ranges"));
    }
    let mut out = Vec::with_capacity(value.len());
    for entry in value.chunks_exact(per) {
        let raw = tree::cells_u32(entry, "pci ranges")?;
        let num = |c: &[u32]| c.iter().fold(0u64, |acc, &x| (acc << 32) | u64::from(x));
        let (cpu, size) = (num(&raw[ca..ca + pa]), num(&raw[ca + pa..]));
        let Some(end) = cpu.checked_add(size).filter(|&end| end <= limit) else { continue };
        match carves.iter().find(|c| c.end() == end && c.base > cpu) {
            Some(c) => {
                out.extend_from_slice(&entry[..(ca + pa) * 4]);
                let size = c.base - cpu;
                if sc == 2 {
                    out.extend_from_slice(&((size >> 32) as u32).to_be_bytes());
                }
                out.extend_from_slice(&(size as u32).to_be_bytes());
            }
            None => out.extend_from_slice(entry),
        }
    }
    Ok(out)
}

/// Does this `/chosen` child describe a boot module?
/// A GICv3 node's `reg` with only the first of its `regions` redistributor
/// regions: GICD, the first GICR region, then whatever follows the regions
/// (GICC, GICH, GICV), entries of `cells` each.
pub(super) fn gic_reg_first_region(value: &[u8], regions: u32, cells: Cells) -> Result<Vec<u8>, DtbError> {
    let entry = 4 * (cells.addr as usize + cells.size as usize);
    let rest = entry.checked_mul(1 + regions as usize).filter(|&r| entry > 0 && r <= value.len());
    let Some(rest) = rest else {
        return Err(DtbError::BadValue("gic reg (fewer regions than #redistributor-regions)"));
    };
    let mut out = value[..2 * entry].to_vec();
    out.extend_from_slice(&value[rest..]);
    Ok(out)
}

/// `/hypervisor` holding the control device's register page (docs/hvctl.md),
/// written at the root (with its own cells, so it reads the same under any
/// root). No Linux driver binds `hvrust,*`, so the page stays free for
/// `/dev/mem`; `hvctl` finds it by `compatible`.
pub fn control_node(w: &mut FdtWriter, page: Region) -> Result<(), vm_fdt::Error> {
    let h = w.begin_node("hypervisor")?;
    w.property_string("compatible", "hvrust,hypervisor")?;
    w.property_u32("#address-cells", 2)?;
    w.property_u32("#size-cells", 2)?;
    w.property_null("ranges")?;
    let c = w.begin_node(&format!("control@{:x}", page.base))?;
    w.property_string("compatible", "hvrust,control-1")?;
    w.property_array_u64("reg", &[page.base, page.size])?;
    w.end_node(c)?;
    w.end_node(h)
}

fn is_boot_module(node: FdtNode<'_, '_>) -> bool {
    node.name.split('@').next() == Some("module")
        || prop(node, "compatible").is_some_and(|v| {
            tree::strings(v).any(|s| s.starts_with("multiboot,") || s == "xen,linux-zimage" || s == "xen,linux-initrd")
        })
}

fn child_path(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

struct Builder<'c> {
    w: FdtWriter,
    cfg: &'c GuestDtbConfig,
    remove: Vec<&'c str>,
    extra_paths: Vec<String>,
    root_cells: Cells,
    memory_done: bool,
    cpus_done: bool,
    psci_done: bool,
    chosen_done: bool,
}

impl Builder<'_> {
    fn dropped(&self, path: &str) -> bool {
        self.remove.contains(&path)
    }

    fn root(&mut self, root: FdtNode<'_, '_>) -> Result<(), DtbError> {
        let n = self.w.begin_node("")?;
        self.copy_props(root)?;
        for child in root.children() {
            let path = child_path("/", child.name);
            if self.dropped(&path) || self.extra_paths.contains(&path) || self.hidden_its(child) {
                continue;
            }
            if self.cfg.control.is_some() && child.name == "hypervisor" {
                continue;
            }
            let base = child.name.split('@').next().unwrap_or("");
            if prop_str(child, "device_type") == Some("memory") {
                self.memory()?;
            } else if base == "cpus" {
                self.cpus(Some(child))?;
            } else if base == "psci"
                || prop(child, "compatible").is_some_and(|v| tree::strings(v).any(|s| s.starts_with("arm,psci")))
            {
                self.psci()?;
            } else if base == "chosen" {
                self.chosen(Some(child), &path)?;
            } else {
                self.copy(child, &path, 2, self.root_cells)?;
            }
        }
        self.memory()?;
        if !self.cpus_done {
            self.cpus(None)?;
        }
        self.psci()?;
        if !self.chosen_done {
            self.chosen(None, "/chosen")?;
        }
        for d in &self.cfg.extra_virtio_mmio {
            self.virtio_mmio(d)?;
        }
        if let Some(page) = self.cfg.control {
            control_node(&mut self.w, page)?;
        }
        self.w.end_node(n)?;
        Ok(())
    }

    fn copy_props(&mut self, node: FdtNode<'_, '_>) -> Result<(), DtbError> {
        for p in node.properties() {
            self.w.property(p.name, p.value)?;
        }
        Ok(())
    }

    /// An ITS node the guest must not see (see [`GuestDtbConfig::keep_its`]).
    fn hidden_its(&self, node: FdtNode<'_, '_>) -> bool {
        !self.cfg.keep_its && is_compatible(node, "arm,gic-v3-its")
    }

    /// Copies a kept subtree verbatim, minus removed paths, hidden ITS
    /// nodes and the PCI edits of the module documentation. `reg_cells` are
    /// the cells of the node's parent bus.
    fn copy(&mut self, node: FdtNode<'_, '_>, path: &str, depth: usize, reg_cells: Cells) -> Result<(), DtbError> {
        if depth > blob::MAX_DEPTH {
            return Err(DtbError::Unsupported("device tree nested too deep"));
        }
        let cells = tree::child_cells(node, reg_cells)?;
        let is_pci = prop_str(node, "device_type") == Some("pci");
        // The vGIC emulates one redistributor region: the first.
        let gicr_regions = if is_compatible(node, "arm,gic-v3") {
            prop_u32(node, "#redistributor-regions", "#redistributor-regions")?.filter(|&n| n > 1)
        } else {
            None
        };
        let n = self.w.begin_node(node.name)?;
        for p in node.properties() {
            if let Some(regions) = gicr_regions {
                match p.name {
                    "#redistributor-regions" => {
                        self.w.property_u32(p.name, 1)?;
                        continue;
                    }
                    "reg" => {
                        self.w.property(p.name, &gic_reg_first_region(p.value, regions, reg_cells)?)?;
                        continue;
                    }
                    _ => {}
                }
            }
            if !self.cfg.keep_its && matches!(p.name, "msi-map" | "msi-map-mask" | "msi-parent") {
                continue;
            }
            if IOMMU_PROPS.contains(&p.name) {
                continue;
            }
            if is_pci && p.name == "ranges" && (self.cfg.ipa_size.is_some() || !self.cfg.pci_carves.is_empty()) {
                let limit = self.cfg.ipa_size.unwrap_or(u64::MAX);
                let v = pci_ranges_within(p.value, cells, reg_cells, limit, &self.cfg.pci_carves)?;
                self.w.property("ranges", &v)?;
                continue;
            }
            self.w.property(p.name, p.value)?;
        }
        for child in node.children() {
            let child_path = child_path(path, child.name);
            if !self.dropped(&child_path) && !self.hidden_its(child) {
                self.copy(child, &child_path, depth + 1, cells)?;
            }
        }
        self.w.end_node(n)?;
        Ok(())
    }

    /// The one memory node (written once, where the first host one was).
    fn memory(&mut self) -> Result<(), DtbError> {
        if self.memory_done {
            return Ok(());
        }
        self.memory_done = true;
        let m = self.cfg.memory;
        let n = self.w.begin_node(&format!("memory@{:x}", m.base))?;
        self.w.property_string("device_type", "memory")?;
        self.w.property("reg", &tree::encode_reg(&m, self.root_cells)?)?;
        self.w.end_node(n)?;
        Ok(())
    }

    fn cpus(&mut self, host: Option<FdtNode<'_, '_>>) -> Result<(), DtbError> {
        if self.cpus_done {
            return Ok(());
        }
        self.cpus_done = true;
        let wide = self.cfg.vcpu_mpidrs.iter().any(|&m| m > u64::from(u32::MAX));
        let n = self.w.begin_node("cpus")?;
        let mut addr_cells = if wide { 2 } else { 1 };
        let mut first_cpu = None;
        match host {
            Some(host) => {
                for p in host.properties() {
                    if p.name != "#size-cells" {
                        self.w.property(p.name, p.value)?;
                    }
                }
                addr_cells = prop_u32(host, "#address-cells", "/cpus #address-cells")?.unwrap_or(addr_cells);
                if prop(host, "#address-cells").is_none() {
                    self.w.property_u32("#address-cells", addr_cells)?;
                }
                first_cpu = host
                    .children()
                    .find(|c| prop_str(*c, "device_type") == Some("cpu") || c.name.split('@').next() == Some("cpu"));
            }
            None => self.w.property_u32("#address-cells", addr_cells)?,
        }
        // CPU nodes have no size; say so whatever the host wrote.
        self.w.property_u32("#size-cells", 0)?;
        if !(1..=2).contains(&addr_cells) {
            return Err(DtbError::Unsupported("/cpus #address-cells"));
        }
        for &mpidr in &self.cfg.vcpu_mpidrs {
            let c = self.w.begin_node(&format!("cpu@{mpidr:x}"))?;
            self.w.property_string("device_type", "cpu")?;
            if let Some(compat) = first_cpu.and_then(|c| prop(c, "compatible")) {
                self.w.property("compatible", compat)?;
            }
            let mut reg = Vec::with_capacity(8);
            tree::encode(&mut reg, mpidr, addr_cells)?;
            self.w.property("reg", &reg)?;
            self.w.property_string("enable-method", "psci")?;
            self.w.end_node(c)?;
        }
        self.w.end_node(n)?;
        Ok(())
    }

    fn psci(&mut self) -> Result<(), DtbError> {
        if self.psci_done {
            return Ok(());
        }
        self.psci_done = true;
        let n = self.w.begin_node("psci")?;
        self.w.property("compatible", b"arm,psci-1.0\0arm,psci-0.2\0")?;
        self.w.property_string("method", "hvc")?;
        self.w.end_node(n)?;
        Ok(())
    }

    fn chosen(&mut self, host: Option<FdtNode<'_, '_>>, path: &str) -> Result<(), DtbError> {
        self.chosen_done = true;
        let n = self.w.begin_node(host.map_or("chosen", |h| h.name))?;
        if let Some(host) = host {
            for p in host.properties() {
                // The hypervisor's own options (xen,xen-bootargs) stay with it.
                if !matches!(p.name, "bootargs" | "xen,xen-bootargs" | "linux,initrd-start" | "linux,initrd-end") {
                    self.w.property(p.name, p.value)?;
                }
            }
        }
        self.w.property_string("bootargs", &self.cfg.bootargs)?;
        if let Some(Region { base, size }) = self.cfg.initrd {
            self.w.property_u64("linux,initrd-start", base)?;
            self.w.property_u64("linux,initrd-end", base + size)?;
        }
        if let Some(host) = host {
            let cells = tree::child_cells(host, self.root_cells)?;
            for child in host.children() {
                let child_path = child_path(path, child.name);
                // DomUs (dom0less `xen,domain` nodes) are not Dom0's business.
                let domu = is_compatible(child, "xen,domain");
                if !is_boot_module(child) && !domu && !self.dropped(&child_path) {
                    self.copy(child, &child_path, 3, cells)?;
                }
            }
        }
        self.w.end_node(n)?;
        Ok(())
    }

    fn virtio_mmio(&mut self, d: &MmioDevice) -> Result<(), DtbError> {
        let n = self.w.begin_node(&format!("virtio_mmio@{:x}", d.base))?;
        self.w.property_null("dma-coherent")?;
        self.w.property_array_u32("interrupts", &[0, d.intid.number(), if d.edge { 1 } else { 4 }])?;
        self.w.property("reg", &tree::encode_reg(&Region { base: d.base, size: d.size }, self.root_cells)?)?;
        self.w.property_string("compatible", "virtio,mmio")?;
        self.w.end_node(n)?;
        Ok(())
    }
}
