//! Xen's dom0less binding: the boot DTB's `/chosen/domU*` nodes → [`VmSpec`]s.
//!
//! A DomU is a direct child of `/chosen` with `compatible = "xen,domain"`
//! (and `status` absent or okay); the node name is free (`domU1`, `web`, …),
//! the domain's id is its position among those nodes, from 1. Properties:
//!
//! | property | meaning | |
//! |---|---|---|
//! | `memory` | guest RAM in KiB, 1 or 2 cells (Xen writes `<0 N>`) | required, > 0 |
//! | `cpus` | vCPUs, 1 cell | required, 1..=[`MAX_DOMU_VCPUS`] |
//! | `vpl011` | (empty) an emulated PL011 console | optional |
//! | `#address-cells`, `#size-cells` | the cells of the modules' `reg` (inherited from `/chosen`, then the root, when absent) | |
//! | `bootargs` | the kernel's command line when its module has none | optional |
//! | `hv,sched-weight` | Credit2 weight, 1 cell, 1..=65535 | default [`DEFAULT_WEIGHT`] |
//! | `hv,sched-cap` | Credit2 cap in percent of one pCPU, 1 cell; 0 = uncapped (Xen's meaning); at most 100 × `cpus` | default uncapped |
//! | `hv,disk-size` | bytes of the RAM-backed virtio-blk disk, 1 or 2 cells, whole 512-byte sectors; 0 = no disk | default 0: no disk, as a Xen DT (which has no such property) means |
//! | `hv,kernel-load-addr` | the kernel module is a raw binary: copied as it is to this guest-physical address (1 or 2 cells, 4 KiB aligned, inside the domain's RAM from 0x40000000) and entered there with x0 = DTB | default: none, the module is an arm64 Image or an ELF file (`boot::image`) |
//! | `hv,pci-assigned` | PCIe functions given to the domain, a string list of `"SSSS:BB:DD.F"` (segment = the host bridge's index; root-bus functions only). Like Xen's `xen,passthrough` for platform devices: Dom0 no longer sees the function, the domain gets a host bridge and an ITS of its own, and the SMMU confines the function's DMA to the domain's RAM (`domain::vmplan::plan_pci`) | default: none |
//! | `hv,heap-quota` | bytes of hypervisor heap the domain's run-time needs may take (disk requests in flight), 1 or 2 cells, 1 MiB..=1 GiB; at the quota the domain gets back-pressure | default [`crate::quota::DEFAULT_DOMU_HEAP_QUOTA`] |
//!
//! Children `module@…` with `compatible` listing `multiboot,kernel` (or
//! Xen's older `xen,linux-zimage`) or `multiboot,ramdisk` (`xen,linux-initrd`)
//! give the kernel (required) and initrd, each by a one-region `reg`; the
//! kernel module's `bootargs` is the command line. Other modules
//! (`multiboot,device-tree`, untyped `multiboot,module`) and unknown
//! properties are ignored.
//!
//! What this parser checks is what the tree alone can tell: shapes of
//! values, required properties, ranges that are empty or wrap, two kernels
//! (or initrds) in one domain, a domain's kernel and initrd overlapping.
//! Whether the modules lie in RAM, overlap anything else, and whether the
//! memory fits is the boot plan's question (`boot::plan`).

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use fdt::Fdt;

use super::tree::{self, is_compatible, is_enabled, prop, prop_str, Entry, Index};
use super::DtbError;
use crate::ids::DomainId;
use crate::region::Region;
use crate::spec::{VmSpec, DEFAULT_WEIGHT};
use crate::vpci::Bdf;

#[cfg(test)]
#[path = "dom0less_tests.rs"]
mod tests;

/// Most vCPUs a DomU may ask for (the vGIC's limit).
pub const MAX_DOMU_VCPUS: u32 = crate::vgic::MAX_VCPUS as u32;
/// Most DomUs one tree may describe.
pub const MAX_DOMUS: usize = 64;
/// Credit2's weight range (Xen: 1..=65535).
pub const MAX_WEIGHT: u32 = 65535;

/// A domain node's name, kept inline so that [`DomainError`] stays `Copy`
/// (longer names are cut; the devicetree spec allows 31 characters).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NodeName {
    bytes: [u8; 32],
    len: u8,
}

impl NodeName {
    pub fn new(name: &str) -> Self {
        let mut bytes = [0; 32];
        let mut len = name.len().min(bytes.len());
        while !name.is_char_boundary(len) {
            len -= 1;
        }
        bytes[..len].copy_from_slice(&name.as_bytes()[..len]);
        NodeName { bytes, len: len as u8 }
    }

    pub fn as_str(&self) -> &str {
        core::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or("?")
    }
}

impl fmt::Debug for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// What is wrong with one domain node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DomainProblem {
    /// A required property is absent (named).
    Missing(&'static str),
    /// A property has the wrong size or an impossible value (named, with
    /// what it must be).
    BadValue(&'static str),
    /// `memory = <0>`.
    ZeroMemory,
    /// `memory` in bytes does not fit in 64 bits.
    MemoryTooLarge { kib: u64 },
    /// `cpus = <0>`.
    ZeroCpus,
    /// More than [`MAX_DOMU_VCPUS`] vCPUs.
    TooManyCpus(u32),
    /// No `multiboot,kernel` module.
    NoKernel,
    /// Two modules of the same kind (`kernel` or `ramdisk`).
    DuplicateModule(&'static str),
    /// A module of size 0 (`kernel` or `ramdisk`).
    EmptyModule(&'static str),
    /// A module whose end does not fit in 64 bits.
    ModuleWraps(&'static str),
    /// The domain's kernel and ramdisk share bytes.
    ModulesOverlap { kernel: Region, ramdisk: Region },
    /// More than [`MAX_DOMUS`] domain nodes.
    TooManyDomains,
}

/// A domain node the hypervisor cannot use: which one, and why. `Display`
/// is one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DomainError {
    /// The id the domain would have had.
    pub id: DomainId,
    pub name: NodeName,
    pub problem: DomainProblem,
}

impl fmt::Display for DomainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dom0less domain /chosen/{} (d{}): ", self.name.as_str(), self.id)?;
        match self.problem {
            DomainProblem::Missing(what) => write!(f, "no {what}"),
            DomainProblem::BadValue(what) => write!(f, "bad {what}"),
            DomainProblem::ZeroMemory => write!(f, "memory is 0"),
            DomainProblem::MemoryTooLarge { kib } => write!(f, "memory of {kib} KiB does not fit in 64 bits"),
            DomainProblem::ZeroCpus => write!(f, "cpus is 0"),
            DomainProblem::TooManyCpus(n) => write!(f, "{n} cpus, at most {MAX_DOMU_VCPUS}"),
            DomainProblem::NoKernel => write!(f, "no module with compatible \"multiboot,kernel\""),
            DomainProblem::DuplicateModule(what) => write!(f, "more than one {what} module"),
            DomainProblem::EmptyModule(what) => write!(f, "the {what} module is empty"),
            DomainProblem::ModuleWraps(what) => write!(f, "the {what} module wraps past the end of the address space"),
            DomainProblem::ModulesOverlap { kernel, ramdisk } => write!(
                f,
                "kernel [{:#x}, {:#x}) overlaps ramdisk [{:#x}, {:#x})",
                kernel.base,
                kernel.end(),
                ramdisk.base,
                ramdisk.end()
            ),
            DomainProblem::TooManyDomains => write!(f, "more than {MAX_DOMUS} domains"),
        }
    }
}

/// Reads the DomUs of a boot DTB (checked first, like [`crate::dtb::discover`],
/// which does the same as part of discovery and keeps the result in
/// `BootInfo::domus`).
pub fn parse(dtb: &[u8]) -> Result<Vec<VmSpec>, DtbError> {
    let checked = crate::dtb::blob::check(dtb)?;
    let fdt = Fdt::new(&checked.blob).map_err(|_| DtbError::Parse)?;
    let idx = Index::new(&fdt)?;
    match idx.find("/chosen") {
        Some(c) => from_chosen(&idx, c).map_err(DtbError::Domain),
        None => Ok(Vec::new()),
    }
}

/// The DomUs among `/chosen`'s (node `chosen`) children, in tree order.
pub(crate) fn from_chosen(idx: &Index<'_, '_>, chosen: usize) -> Result<Vec<VmSpec>, DomainError> {
    let mut out = Vec::new();
    for (i, e) in idx.children_of(chosen) {
        if !is_compatible(e.node, "xen,domain") || !is_enabled(e.node) {
            continue;
        }
        let id = DomainId::try_from(out.len() + 1).unwrap_or(DomainId::MAX);
        let err = |problem| DomainError { id, name: NodeName::new(e.node.name), problem };
        if out.len() == MAX_DOMUS {
            return Err(err(DomainProblem::TooManyDomains));
        }
        out.push(domain(idx, i, id).map_err(err)?);
    }
    Ok(out)
}

/// A one-cell property.
fn u32_prop(e: &Entry<'_, '_>, name: &'static str) -> Result<Option<u32>, DomainProblem> {
    tree::prop_u32(e.node, name, name).map_err(|_| DomainProblem::BadValue(name))
}

/// A one- or two-cell property.
fn u64_prop(e: &Entry<'_, '_>, name: &'static str) -> Result<Option<u64>, DomainProblem> {
    match prop(e.node, name) {
        None => Ok(None),
        Some(v) => match <[u8; 4]>::try_from(v) {
            Ok(b) => Ok(Some(u64::from(u32::from_be_bytes(b)))),
            Err(_) => {
                <[u8; 8]>::try_from(v).map(|b| Some(u64::from_be_bytes(b))).map_err(|_| DomainProblem::BadValue(name))
            }
        },
    }
}

fn domain(idx: &Index<'_, '_>, i: usize, id: DomainId) -> Result<VmSpec, DomainProblem> {
    let e = &idx.entries[i];
    let kib = u64_prop(e, "memory")?.ok_or(DomainProblem::Missing("memory"))?;
    let memory = match kib.checked_mul(1024) {
        Some(0) => return Err(DomainProblem::ZeroMemory),
        Some(m) => m,
        None => return Err(DomainProblem::MemoryTooLarge { kib }),
    };
    let vcpus = match u32_prop(e, "cpus")?.ok_or(DomainProblem::Missing("cpus"))? {
        0 => return Err(DomainProblem::ZeroCpus),
        n if n > MAX_DOMU_VCPUS => return Err(DomainProblem::TooManyCpus(n)),
        n => n,
    };
    let weight = match u32_prop(e, "hv,sched-weight")? {
        None => DEFAULT_WEIGHT,
        Some(w @ 1..=MAX_WEIGHT) => w,
        Some(_) => return Err(DomainProblem::BadValue("hv,sched-weight (1..=65535)")),
    };
    let cap_percent = match u32_prop(e, "hv,sched-cap")? {
        None | Some(0) => None,
        Some(c) if u64::from(c) <= 100 * u64::from(vcpus) => Some(c),
        Some(_) => return Err(DomainProblem::BadValue("hv,sched-cap (at most 100 per vCPU)")),
    };
    let disk_size = u64_prop(e, "hv,disk-size")?.unwrap_or(0);
    if !disk_size.is_multiple_of(512) {
        return Err(DomainProblem::BadValue("hv,disk-size (whole 512-byte sectors)"));
    }
    let heap_quota = match u64_prop(e, "hv,heap-quota")? {
        None => crate::quota::DEFAULT_DOMU_HEAP_QUOTA,
        Some(q) if crate::quota::QUOTA_RANGE.contains(&q) => q,
        Some(_) => return Err(DomainProblem::BadValue("hv,heap-quota (1 MiB to 1 GiB)")),
    };

    let kernel_load_addr = u64_prop(e, "hv,kernel-load-addr")?;
    if kernel_load_addr.is_some_and(|a| !a.is_multiple_of(crate::boot::image::RAW_ALIGN)) {
        return Err(DomainProblem::BadValue("hv,kernel-load-addr (4 KiB aligned)"));
    }

    let mut pci = Vec::new();
    if let Some(v) = prop(e.node, "hv,pci-assigned") {
        for s in tree::strings(v) {
            let bdf: Bdf =
                s.parse().map_err(|_| DomainProblem::BadValue("hv,pci-assigned (\"SSSS:BB:DD.F\" strings)"))?;
            if pci.contains(&bdf) {
                return Err(DomainProblem::BadValue("hv,pci-assigned (a function named twice)"));
            }
            pci.push(bdf);
        }
        if pci.is_empty() {
            return Err(DomainProblem::BadValue("hv,pci-assigned (\"SSSS:BB:DD.F\" strings)"));
        }
    }

    let (mut kernel, mut ramdisk): (Option<(Region, Option<&str>)>, Option<Region>) = (None, None);
    for (_, m) in idx.children_of(i) {
        let Some(kind) = module_kind(m) else { continue };
        if !is_enabled(m.node) {
            continue;
        }
        let reg = match tree::reg(m, "module reg").as_deref() {
            Ok([r]) => *r,
            Err(DtbError::Missing(_)) => return Err(DomainProblem::Missing("module reg")),
            _ => return Err(DomainProblem::BadValue("module reg (one region in the domain's cells)")),
        };
        if reg.size == 0 {
            return Err(DomainProblem::EmptyModule(kind));
        }
        if reg.base.checked_add(reg.size).is_none() {
            return Err(DomainProblem::ModuleWraps(kind));
        }
        let slot_taken = if kind == "kernel" { kernel.is_some() } else { ramdisk.is_some() };
        if slot_taken {
            return Err(DomainProblem::DuplicateModule(kind));
        }
        if kind == "kernel" {
            kernel = Some((reg, prop_str(m.node, "bootargs")));
        } else {
            ramdisk = Some(reg);
        }
    }
    let (kernel, module_args) = kernel.ok_or(DomainProblem::NoKernel)?;
    if let Some(r) = ramdisk {
        if kernel.base < r.end() && r.base < kernel.end() {
            return Err(DomainProblem::ModulesOverlap { kernel, ramdisk: r });
        }
    }
    let bootargs = module_args.or_else(|| prop_str(e.node, "bootargs")).unwrap_or("");
    Ok(VmSpec {
        id,
        name: String::from(e.node.name),
        memory,
        vcpus,
        vpl011: prop(e.node, "vpl011").is_some(),
        kernel,
        ramdisk,
        bootargs: String::from(bootargs),
        weight,
        cap_percent,
        disk_size,
        heap_quota,
        kernel_load_addr,
        pin_vcpus: false,
        cpus: alloc::vec::Vec::new(),
        pci,
    })
}

/// `"kernel"`, `"ramdisk"`, or `None` for a child that is neither.
fn module_kind(m: &Entry<'_, '_>) -> Option<&'static str> {
    let v = prop(m.node, "compatible")?;
    if tree::strings(v).any(|s| s == "multiboot,kernel" || s == "xen,linux-zimage") {
        Some("kernel")
    } else if tree::strings(v).any(|s| s == "multiboot,ramdisk" || s == "xen,linux-initrd") {
        Some("ramdisk")
    } else {
        None
    }
}
