//! [`discover`]: the boot DTB → the [`Machine`] and the [`BootInfo`].
//!
//! Each piece is found by binding (compatible string, `device_type`, or the
//! standard `/chosen`, `/cpus`, `/aliases` paths), never by address, so the
//! same code serves QEMU virt, FVP and boards. What the hypervisor cannot run
//! without (RAM, CPUs, a GICv3, the timer PPIs) is an error when absent; the
//! rest is optional.

use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::intid::IntId;
use fdt::Fdt;

use super::blob;
use super::tree::{self, gic_irq, is_compatible, is_enabled, prop, prop_str, prop_u32, Entry, Index};
use super::{
    BootInfo, BootModule, DtbError, GicInfo, IommuMapEntry, Machine, MmioDevice, MsiMapEntry, PciSpace, PciWindow,
    PcieHost, Region, SmmuInfo, TimerInfo, UartInfo,
};

/// Reads the board and what to run on it from the boot DTB.
pub fn discover(dtb: &[u8]) -> Result<(Machine, BootInfo), DtbError> {
    let checked = blob::check(dtb)?;
    let fdt = Fdt::new(&checked.blob).map_err(|_| DtbError::Parse)?;
    let idx = Index::new(&fdt)?;

    let (gic_idx, gic) = gic(&idx)?;
    let chosen = idx.find("/chosen");
    let (kernel, ramdisk) = match chosen {
        Some(c) => modules(&idx, c)?,
        None => (None, None),
    };
    let domus = match chosen {
        Some(c) => super::dom0less::from_chosen(&idx, c).map_err(DtbError::Domain)?,
        None => Vec::new(),
    };
    let psci_method = idx
        .iter()
        .find(|e| is_enabled(e.node) && compatible_prefix(e, "arm,psci"))
        .and_then(|e| prop_str(e.node, "method"))
        .map(String::from);
    let machine = Machine {
        memory: memory(&idx)?,
        reserved: reserved(&idx, checked.reserved)?,
        cpus: cpus(&idx)?,
        uart: uart(&idx, chosen, gic_idx),
        timer: timer(&idx, gic_idx)?,
        pmu_intid: pmu(&idx, gic_idx)?,
        virtio_mmio: virtio_mmio(&idx, gic_idx)?,
        pcie: pcie(&idx, gic_idx)?,
        smmus: smmus(&idx, gic_idx)?,
        psci_method,
        gic,
    };
    let boot = BootInfo {
        bootargs: chosen.and_then(|c| hypervisor_bootargs(idx.entries[c].node)).map(String::from),
        kernel,
        ramdisk,
        domus,
    };
    Ok((machine, boot))
}

/// The hypervisor's options in `/chosen`: `xen,xen-bootargs` when present
/// (Xen's binding; what a firmware boot, where QEMU has no `-append` and
/// `bootargs` may be meant for someone else, passes), else `bootargs`.
fn hypervisor_bootargs<'a>(chosen: fdt::node::FdtNode<'_, 'a>) -> Option<&'a str> {
    prop_str(chosen, "xen,xen-bootargs").or_else(|| prop_str(chosen, "bootargs"))
}

fn compatible_prefix(e: &Entry<'_, '_>, prefix: &str) -> bool {
    prop(e.node, "compatible").is_some_and(|v| tree::strings(v).any(|s| s.starts_with(prefix)))
}

fn memory(idx: &Index<'_, '_>) -> Result<Vec<Region>, DtbError> {
    let mut out = Vec::new();
    for (i, e) in idx.iter().enumerate() {
        if e.depth == 2 && prop_str(e.node, "device_type") == Some("memory") && is_enabled(e.node) {
            out.extend(idx.mmio_reg(i, "memory reg")?.into_iter().filter(|r| r.size != 0));
        }
    }
    if out.is_empty() {
        return Err(DtbError::Missing("memory"));
    }
    Ok(out)
}

fn reserved(idx: &Index<'_, '_>, mut out: Vec<Region>) -> Result<Vec<Region>, DtbError> {
    if let Some(rm) = idx.find("/reserved-memory") {
        // A `/reserved-memory` without `ranges` is malformed, but the
        // regions are still what firmware asked us to keep: read them as
        // CPU addresses rather than ignore them.
        let identity = prop(idx.entries[rm].node, "ranges").is_none();
        for (i, e) in idx.children_of(rm) {
            if is_enabled(e.node) && prop(e.node, "reg").is_some() {
                let regs = if identity {
                    tree::reg(e, "reserved-memory reg")?
                } else {
                    idx.mmio_reg(i, "reserved-memory reg")?
                };
                out.extend(regs);
            }
        }
    }
    Ok(out)
}

fn cpus(idx: &Index<'_, '_>) -> Result<Vec<u64>, DtbError> {
    let cpus = idx.find("/cpus").ok_or(DtbError::Missing("/cpus"))?;
    let mut out = Vec::new();
    for (_, e) in idx.children_of(cpus) {
        let is_cpu = match prop_str(e.node, "device_type") {
            Some(t) => t == "cpu",
            None => e.node.name.split('@').next() == Some("cpu"),
        };
        if !is_cpu || !is_enabled(e.node) {
            continue;
        }
        let reg = tree::reg(e, "cpu reg")?;
        if reg.len() != 1 {
            return Err(DtbError::BadValue("cpu reg (want one MPIDR)"));
        }
        out.push(reg[0].base);
    }
    if out.is_empty() {
        return Err(DtbError::Missing("cpu nodes"));
    }
    Ok(out)
}

fn gic(idx: &Index<'_, '_>) -> Result<(usize, GicInfo), DtbError> {
    let (i, e) = idx
        .iter()
        .enumerate()
        .find(|(_, e)| is_enabled(e.node) && is_compatible(e.node, "arm,gic-v3"))
        .ok_or(DtbError::Missing("arm,gic-v3 interrupt controller"))?;
    match prop_u32(e.node, "#interrupt-cells", "gic #interrupt-cells")? {
        Some(3) => {}
        Some(_) => return Err(DtbError::Unsupported("gic #interrupt-cells other than 3")),
        None => return Err(DtbError::Missing("gic #interrupt-cells")),
    }
    let regs = idx.mmio_reg(i, "gic reg")?;
    let n_redist = prop_u32(e.node, "#redistributor-regions", "#redistributor-regions")?.unwrap_or(1) as usize;
    if n_redist == 0 || regs.len() < 1 + n_redist {
        return Err(DtbError::BadValue("gic reg (fewer regions than #redistributor-regions)"));
    }
    let maintenance_intid = match prop(e.node, "interrupts") {
        None => None,
        Some(v) => {
            let cells = tree::cells_u32(v, "gic interrupts")?;
            Some(gic_irq(cells.get(..3).ok_or(DtbError::BadValue("gic interrupts"))?)?.intid)
        }
    };
    let mut all_its = Vec::new();
    for (ci, c) in idx.children_of(i) {
        if is_enabled(c.node) && is_compatible(c.node, "arm,gic-v3-its") {
            all_its.push(idx.mmio_reg(ci, "its reg")?[0]);
        }
    }
    let info = GicInfo {
        version: 3,
        gicd: regs[0],
        gicr: regs[1..1 + n_redist].to_vec(),
        its: all_its.first().copied(),
        other_its: all_its.get(1..).unwrap_or_default().to_vec(),
        maintenance_intid,
        phandle: e.phandle,
    };
    Ok((i, info))
}

fn timer(idx: &Index<'_, '_>, gic: usize) -> Result<TimerInfo, DtbError> {
    let (i, _) = idx
        .iter()
        .enumerate()
        .find(|(_, e)| {
            is_enabled(e.node) && (is_compatible(e.node, "arm,armv8-timer") || is_compatible(e.node, "arm,armv7-timer"))
        })
        .ok_or(DtbError::Missing("arm,armv8-timer"))?;
    let irqs = idx.irqs(i, gic, "timer interrupts")?;
    if irqs.len() < 4 {
        return Err(DtbError::BadValue("timer interrupts (want 4)"));
    }
    Ok(TimerInfo { phys_intid: irqs[1].intid, virt_intid: irqs[2].intid, hyp_intid: irqs[3].intid })
}

/// The first enabled `arm,armv8-pmuv3` node's interrupt, which must be a
/// PPI: one overflow line per CPU, as the vPMU forwards it.
fn pmu(idx: &Index<'_, '_>, gic: usize) -> Result<Option<IntId>, DtbError> {
    let Some(i) = idx.iter().position(|e| is_enabled(e.node) && is_compatible(e.node, "arm,armv8-pmuv3")) else {
        return Ok(None);
    };
    let irqs = idx.irqs(i, gic, "pmu interrupts")?;
    match irqs.first() {
        Some(irq) if irq.intid.is_ppi() => Ok(Some(irq.intid)),
        Some(_) => Err(DtbError::BadValue("pmu interrupts (not a PPI)")),
        None => Err(DtbError::BadValue("pmu interrupts (none)")),
    }
}

/// An MMIO device: its first `reg` region translated to a CPU address, its
/// first interrupt resolved to a GIC INTID.
fn mmio_device(idx: &Index<'_, '_>, i: usize, gic: usize) -> Result<MmioDevice, DtbError> {
    let reg = idx.mmio_reg(i, "device reg")?[0];
    let irq = idx.irqs(i, gic, "device interrupts")?[0];
    let path = idx.path(&idx.entries[i]).to_string();
    Ok(MmioDevice { base: reg.base, size: reg.size, intid: irq.intid, edge: irq.edge, path })
}

fn virtio_mmio(idx: &Index<'_, '_>, gic: usize) -> Result<Vec<MmioDevice>, DtbError> {
    idx.iter()
        .enumerate()
        .filter(|(_, e)| is_enabled(e.node) && is_compatible(e.node, "virtio,mmio"))
        .map(|(i, _)| mmio_device(idx, i, gic))
        .collect()
}

/// Enabled generic ECAM host bridges.
fn pcie(idx: &Index<'_, '_>, gic: usize) -> Result<Vec<PcieHost>, DtbError> {
    idx.iter()
        .enumerate()
        .filter(|(_, e)| is_enabled(e.node) && is_compatible(e.node, "pci-host-ecam-generic"))
        .map(|(i, _)| pcie_host(idx, i, gic))
        .collect()
}

fn pcie_host(idx: &Index<'_, '_>, i: usize, gic: usize) -> Result<PcieHost, DtbError> {
    let e = &idx.entries[i];
    let ecam = *idx.mmio_reg(i, "pcie reg")?.first().ok_or(DtbError::BadValue("pcie reg"))?;
    let bus_range = match prop(e.node, "bus-range") {
        None => (0, 255),
        Some(v) => match tree::cells_u32(v, "bus-range")?.as_slice() {
            &[first, last] if first <= last && last <= 255 => (first as u8, last as u8),
            _ => return Err(DtbError::BadValue("bus-range")),
        },
    };
    let windows = pci_windows(idx, i)?;
    let intx = match prop(e.node, "interrupt-map") {
        Some(_) => idx.interrupt_map_targets(i, gic)?,
        None => Vec::new(),
    };
    let msi_map = id_map(e, "msi-map", "msi-map (want 4-cell entries)")?
        .into_iter()
        .map(|c| MsiMapEntry { rid_base: c[0], msi_controller: c[1], msi_base: c[2], length: c[3] })
        .collect();
    let msi_parent = match prop(e.node, "msi-parent") {
        Some(v) => tree::cells_u32(v, "msi-parent")?,
        None => Vec::new(),
    };
    let iommu_map = id_map(e, "iommu-map", "iommu-map (want 4-cell entries: #iommu-cells = 1)")?
        .into_iter()
        .map(|c| IommuMapEntry { rid_base: c[0], iommu: c[1], sid_base: c[2], length: c[3] })
        .collect();
    Ok(PcieHost {
        path: idx.path(e).to_string(),
        ecam,
        bus_range,
        windows,
        intx,
        msi_map,
        msi_map_mask: prop_u32(e.node, "msi-map-mask", "msi-map-mask")?,
        msi_parent,
        iommu_map,
        iommu_map_mask: prop_u32(e.node, "iommu-map-mask", "iommu-map-mask")?,
    })
}

/// A PCI ID map (`msi-map`, `iommu-map`: rid-base, phandle, base,
/// length), as 4-cell entries; empty when absent, `bad` when it is not
/// whole entries.
fn id_map(e: &Entry<'_, '_>, name: &str, bad: &'static str) -> Result<Vec<[u32; 4]>, DtbError> {
    let Some(v) = prop(e.node, name) else {
        return Ok(Vec::new());
    };
    let raw = tree::cells_u32(v, bad)?;
    if raw.is_empty() || !raw.len().is_multiple_of(4) {
        return Err(DtbError::BadValue(bad));
    }
    Ok(raw.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect())
}

/// Enabled SMMUv3s: registers, phandle, the "eventq" and "gerror"
/// interrupts by `interrupt-names` (a node without names gives none: the
/// driver polls), `dma-coherent`.
fn smmus(idx: &Index<'_, '_>, gic: usize) -> Result<Vec<SmmuInfo>, DtbError> {
    let mut out = Vec::new();
    for (i, e) in idx.iter().enumerate() {
        if !is_enabled(e.node) || !is_compatible(e.node, "arm,smmu-v3") {
            continue;
        }
        let regs = *idx.mmio_reg(i, "smmu reg")?.first().ok_or(DtbError::BadValue("smmu reg"))?;
        let names: Vec<&str> = prop(e.node, "interrupt-names").map(|v| tree::strings(v).collect()).unwrap_or_default();
        let irqs = if names.is_empty() || prop(e.node, "interrupts").is_none() {
            Vec::new()
        } else {
            idx.irqs(i, gic, "smmu interrupts")?
        };
        let named = |n: &str| names.iter().position(|&x| x == n).and_then(|k| irqs.get(k)).map(|irq| irq.intid);
        out.push(SmmuInfo {
            path: idx.path(e).to_string(),
            regs,
            phandle: prop_u32(e.node, "phandle", "smmu phandle")?,
            eventq: named("eventq"),
            gerror: named("gerror"),
            coherent: prop(e.node, "dma-coherent").is_some(),
        });
    }
    Ok(out)
}

/// A PCI bridge's `ranges`: 3-cell PCI addresses (`phys.hi` space code,
/// 64-bit address), CPU addresses in the parent's cells, sizes in the
/// bridge's.
fn pci_windows(idx: &Index<'_, '_>, i: usize) -> Result<Vec<PciWindow>, DtbError> {
    let e = &idx.entries[i];
    let Some(v) = prop(e.node, "ranges") else {
        return Ok(Vec::new());
    };
    let (ca, pa, sc) = (e.child_cells.addr as usize, e.reg_cells.addr as usize, e.child_cells.size as usize);
    if ca != 3 || !(1..=2).contains(&pa) || !(1..=2).contains(&sc) {
        return Err(DtbError::Unsupported("pci ranges cells (want 3 address cells)"));
    }
    let raw = tree::cells_u32(v, "pci ranges")?;
    if !raw.len().is_multiple_of(ca + pa + sc) {
        return Err(DtbError::BadValue("pci ranges"));
    }
    let num = |c: &[u32]| c.iter().fold(0u64, |acc, &x| (acc << 32) | u64::from(x));
    raw.chunks_exact(ca + pa + sc)
        .map(|c| {
            let hi = c[0];
            let space = match (hi >> 24) & 3 {
                0 => PciSpace::Config,
                1 => PciSpace::Io,
                2 => PciSpace::Mem32,
                _ => PciSpace::Mem64,
            };
            let size = num(&c[ca + pa..]);
            let cpu = idx.translate(i, Region { base: num(&c[ca..ca + pa]), size })?;
            Ok(PciWindow { space, prefetchable: hi & (1 << 30) != 0, pci_addr: num(&c[1..3]), cpu })
        })
        .collect()
}

/// The console: `stdout-path` (options after `:` dropped, aliases followed),
/// else the first PL011. A UART we cannot decode is no console (`None`)
/// rather than an error: the hypervisor can run without one.
fn uart(idx: &Index<'_, '_>, chosen: Option<usize>, gic: usize) -> Option<UartInfo> {
    let from_chosen = chosen.and_then(|c| {
        let node = idx.entries[c].node;
        let path = prop_str(node, "stdout-path").or_else(|| prop_str(node, "linux,stdout-path"))?;
        let path = path.split(':').next()?;
        idx.resolve(path)
    });
    let candidates = from_chosen
        .into_iter()
        .chain(idx.iter().enumerate().filter(|(_, e)| is_compatible(e.node, "arm,pl011")).map(|(i, _)| i));
    for i in candidates {
        let e = &idx.entries[i];
        if !is_enabled(e.node) {
            continue;
        }
        if let Ok(d) = mmio_device(idx, i, gic) {
            let compatible = prop_str(e.node, "compatible").unwrap_or("").to_string();
            return Some(UartInfo { base: d.base, size: d.size, intid: d.intid, path: d.path, compatible });
        }
    }
    None
}

/// Kind of a `/chosen` child under Xen's multiboot binding.
#[derive(PartialEq)]
enum ModuleKind {
    Kernel,
    Ramdisk,
    Generic,
    NotAModule,
}

fn module_kind(e: &Entry<'_, '_>) -> ModuleKind {
    let Some(v) = prop(e.node, "compatible") else {
        return ModuleKind::NotAModule;
    };
    // The specific kind wins wherever it appears: QEMU writes
    // "multiboot,module", "multiboot,kernel" in that order.
    if tree::strings(v).any(|s| s == "multiboot,kernel" || s == "xen,linux-zimage") {
        ModuleKind::Kernel
    } else if tree::strings(v).any(|s| s == "multiboot,ramdisk" || s == "xen,linux-initrd") {
        ModuleKind::Ramdisk
    } else if tree::strings(v).any(|s| s == "multiboot,module") {
        ModuleKind::Generic
    } else {
        ModuleKind::NotAModule
    }
}

/// Kernel and ramdisk from `/chosen`'s direct children. Explicitly typed
/// modules take their slot (first one wins); untyped `multiboot,module`s then
/// fill the empty slots in tree order, kernel first, as Xen guesses them.
fn modules(idx: &Index<'_, '_>, chosen: usize) -> Result<(Option<BootModule>, Option<BootModule>), DtbError> {
    let mut kernel = None;
    let mut ramdisk = None;
    let mut generic = Vec::new();
    for (_, e) in idx.children_of(chosen) {
        let kind = module_kind(e);
        if kind == ModuleKind::NotAModule || !is_enabled(e.node) {
            continue;
        }
        let reg = tree::reg(e, "module reg")?[0];
        let module =
            BootModule { base: reg.base, size: reg.size, bootargs: prop_str(e.node, "bootargs").map(String::from) };
        match kind {
            ModuleKind::Kernel if kernel.is_none() => kernel = Some(module),
            ModuleKind::Ramdisk if ramdisk.is_none() => ramdisk = Some(module),
            ModuleKind::Generic => generic.push(module),
            _ => {}
        }
    }
    for module in generic {
        if kernel.is_none() {
            kernel = Some(module);
        } else if ramdisk.is_none() {
            ramdisk = Some(module);
        }
    }
    Ok((kernel, ramdisk))
}
