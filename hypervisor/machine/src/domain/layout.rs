//! Where a DomU's pieces go, as a pure function of its [`VmSpec`] and
//! [`DomuPlacement`] (host-tested): its guest-physical machine (laid out
//! like QEMU `virt`) and, inside its RAM, the kernel, initrd and device tree
//! with the host-physical address behind each. The EL2 code
//! (`runtime::vm::Vm::create_domu`, through `domain::vmplan::plan_domu`)
//! copies and maps what this says.
//!
//! Also the `domu_selftest=N` test aid: DomU placements carved from the top
//! of Dom0's planned RAM (before Dom0 is built), for testing DomUs before
//! the dom0less device-tree parser provides real ones.

use super::{DomuPlacement, VmSpec};
use crate::boot::image::KernelLoad;
use crate::boot::plan::{place_modules, ALIGN, GUEST_DTB_SIZE, MIN_GUEST_RAM};
use crate::region::Region;
use alloc::vec::Vec;
use core::fmt;

/// Guest-physical base of every DomU's RAM (QEMU virt's).
pub const DOMU_RAM_BASE: u64 = 0x4000_0000;
/// The DomU's vGIC distributor (64 KiB) and first redistributor.
pub const DOMU_GICD: u64 = 0x0800_0000;
pub const DOMU_GICR: u64 = 0x080A_0000;
/// One redistributor's frames (RD + SGI, 64 KiB each).
pub const GICR_STRIDE: u64 = 0x2_0000;
/// The vPL011 and its SPI number (INTID 32 + 1).
pub const DOMU_UART: u64 = 0x0900_0000;
pub const DOMU_UART_SPI: u32 = 1;
/// The hypervisor's virtio-blk for the DomU and its SPI number (INTID 48).
pub const DOMU_VIRTIO: u64 = 0x0A00_0000;
pub const DOMU_VIRTIO_SPI: u32 = 16;
/// The most vCPUs a DomU may have (its redistributors end below the UART).
pub const MAX_DOMU_VCPUS: u32 = 64;
/// A DomU's IPA space (bits): 39, which every CPU supports here.
pub const DOMU_IPA_BITS: u32 = 39;
/// The most RAM a DomU may have: it must end inside its IPA space.
pub const MAX_DOMU_RAM: u64 = (1 << DOMU_IPA_BITS) - DOMU_RAM_BASE;

/// Why a DomU cannot be laid out. `Display` is one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DomainError {
    /// Its RAM is smaller than [`MIN_GUEST_RAM`], larger than
    /// [`MAX_DOMU_RAM`], or not 2 MiB aligned.
    BadMemory { id: u16, memory: u64 },
    /// 0 or more than [`MAX_DOMU_VCPUS`] vCPUs.
    BadVcpus { id: u16, vcpus: u32 },
    /// The placement's RAM is smaller than the spec's memory.
    PlacementTooSmall { id: u16, memory: u64, placed: u64 },
    /// A disk was asked for but not placed, or placed too small.
    NoDisk { id: u16, size: u64 },
    /// The kernel, initrd and device tree do not fit in its RAM.
    ModulesDoNotFit { id: u16, need: u64, ram: u64 },
    /// Not enough of Dom0's RAM to carve `n` self-test DomUs from.
    SelftestNoRoom { n: u32, need: u64, dom0_ram: u64 },
    /// A fixed-address kernel's range (guest-physical) is not inside its RAM.
    KernelOutsideRam { id: u16, range: Region, ram: Region },
}

impl fmt::Display for DomainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DomainError::BadMemory { id, memory } => {
                write!(f, "d{id}: memory {memory:#x} must be 2 MiB aligned, at least 64 MiB and below the IPA limit")
            }
            DomainError::BadVcpus { id, vcpus } => write!(f, "d{id}: {vcpus} vCPUs (1 to {MAX_DOMU_VCPUS})"),
            DomainError::PlacementTooSmall { id, memory, placed } => {
                write!(f, "d{id}: {memory:#x} bytes of RAM asked, {placed:#x} placed")
            }
            DomainError::NoDisk { id, size } => write!(f, "d{id}: a {size:#x}-byte disk was not placed"),
            DomainError::ModulesDoNotFit { id, need, ram } => {
                write!(f, "d{id}: kernel, initrd and DTB need {need:#x} bytes, RAM is {ram:#x}")
            }
            DomainError::KernelOutsideRam { id, range, ram } => write!(
                f,
                "d{id}: the kernel's load range [{:#x}, {:#x}) is not inside its RAM [{:#x}, {:#x})",
                range.base,
                range.end(),
                ram.base,
                ram.end()
            ),
            DomainError::SelftestNoRoom { n, need, dom0_ram } => {
                write!(f, "domu_selftest={n}: needs {need:#x} bytes of Dom0's {dom0_ram:#x} and leaves too little")
            }
        }
    }
}

/// A guest-physical range and the host-physical address behind its base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    pub ipa: Region,
    pub host: u64,
}

/// One copy into a DomU's RAM: `src` (host-physical, in the module) to
/// `dst`, zeroed past `src.size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelCopy {
    pub src: Region,
    pub dst: Placed,
}

/// One DomU's memory layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomuLayout {
    /// All its RAM.
    pub ram: Placed,
    /// The kernel's copies: one for an Image (`dst.ipa.size` is the
    /// header's `image_size`, zeroed beyond the file), one per piece for a
    /// kernel at fixed addresses (`boot::image`).
    pub kernel: Vec<KernelCopy>,
    /// Where its vCPU 0 starts (guest-physical).
    pub entry: u64,
    pub initrd: Option<Placed>,
    /// The device tree's room (the last [`GUEST_DTB_SIZE`] of RAM).
    pub dtb: Placed,
    /// The RAM disk image (host memory the DomU cannot map).
    pub disk: Option<Region>,
}

fn align_up(x: u64) -> Option<u64> {
    x.checked_add(ALIGN - 1).map(|v| v & !(ALIGN - 1))
}

/// Lays a DomU out: RAM at [`DOMU_RAM_BASE`] backed by `placement.ram`;
/// an arm64 Image at its base (arm64 boot protocol: 2 MiB aligned,
/// `image_size` reserved), a fixed-address kernel (`load`, from
/// `boot::image::read_kernel`) where it says, inside the RAM; the DTB and
/// initrd around the kernel (`boot::plan::place_modules`: the DTB in the
/// highest free 2 MiB, the initrd at the lowest 2 MiB boundary clear of
/// both).
pub fn layout_domu(spec: &VmSpec, placement: &DomuPlacement, load: &KernelLoad) -> Result<DomuLayout, DomainError> {
    let id = spec.id;
    if spec.memory < MIN_GUEST_RAM || spec.memory > MAX_DOMU_RAM || !spec.memory.is_multiple_of(ALIGN) {
        return Err(DomainError::BadMemory { id, memory: spec.memory });
    }
    if spec.vcpus == 0 || spec.vcpus > MAX_DOMU_VCPUS {
        return Err(DomainError::BadVcpus { id, vcpus: spec.vcpus });
    }
    if placement.ram.size < spec.memory {
        return Err(DomainError::PlacementTooSmall { id, memory: spec.memory, placed: placement.ram.size });
    }
    let disk = match (spec.disk_size, placement.disk) {
        (0, _) => None,
        (size, Some(d)) if d.size >= size => Some(Region { base: d.base, size }),
        (size, _) => return Err(DomainError::NoDisk { id, size }),
    };
    let at = |ipa: u64| placement.ram.base + (ipa - DOMU_RAM_BASE);
    let placed = |ipa: Region| Placed { ipa, host: at(ipa.base) };
    let ram = Region { base: DOMU_RAM_BASE, size: spec.memory };
    let (pieces, entry): (Vec<(Region, Region)>, u64) = match load {
        KernelLoad::Image { size } => {
            let size = (*size).max(spec.kernel.size).min(u64::MAX - DOMU_RAM_BASE);
            (Vec::from([(spec.kernel, Region { base: DOMU_RAM_BASE, size })]), DOMU_RAM_BASE)
        }
        KernelLoad::Fixed(f) => {
            let mut v = Vec::new();
            for p in &f.pieces {
                if p.at.base < ram.base || p.at.base.checked_add(p.at.size).is_none_or(|e| e > ram.end()) {
                    return Err(DomainError::KernelOutsideRam { id, range: p.at, ram });
                }
                v.push((Region { base: spec.kernel.base + p.offset, size: p.size }, p.at));
            }
            (v, f.entry)
        }
    };
    let ranges: Vec<Region> = pieces.iter().map(|p| p.1).collect();
    let initrd_size = spec.ramdisk.map(|r| r.size);
    let Some((initrd, dtb)) = place_modules(ram, &ranges, initrd_size) else {
        let need = ranges
            .iter()
            .map(|r| align_up(r.size))
            .chain(initrd_size.map(align_up))
            .try_fold(GUEST_DTB_SIZE, |acc, s| acc.checked_add(s?))
            .unwrap_or(u64::MAX);
        return Err(DomainError::ModulesDoNotFit { id, need, ram: spec.memory });
    };
    let kernel = pieces.iter().map(|&(src, dst)| KernelCopy { src, dst: placed(dst) }).collect();
    Ok(DomuLayout { ram: placed(ram), kernel, entry, initrd: initrd.map(placed), dtb: placed(dtb), disk })
}

/// `domu_selftest=N`: carves N DomUs of `mem` bytes of RAM and `disk` bytes
/// of RAM disk each from the top of Dom0's planned RAM `dom0_ram` (2 MiB
/// aligned). Returns Dom0's RAM that is left and the placements (ids 1..=N).
/// Dom0 keeps at least `dom0_min` bytes. A test aid; real DomUs are placed
/// by the boot plan.
pub fn selftest_carve(
    dom0_ram: Region,
    n: u32,
    mem: u64,
    disk: u64,
    dom0_min: u64,
) -> Result<(Region, Vec<DomuPlacement>), DomainError> {
    let disk = align_up(disk).unwrap_or(u64::MAX);
    let each = mem.checked_add(disk);
    let need = each.and_then(|e| e.checked_mul(u64::from(n)));
    let no_room = DomainError::SelftestNoRoom { n, need: need.unwrap_or(u64::MAX), dom0_ram: dom0_ram.size };
    let need = need.ok_or(no_room)?;
    if !mem.is_multiple_of(ALIGN) || need.checked_add(dom0_min).is_none_or(|t| t > dom0_ram.size) {
        return Err(no_room);
    }
    let left = Region { base: dom0_ram.base, size: dom0_ram.size - need };
    let each = need / u64::from(n.max(1));
    let placements = (0..n)
        .map(|i| {
            let base = left.end() + u64::from(i) * each;
            DomuPlacement {
                id: (i + 1) as u16,
                ram: Region { base, size: mem },
                disk: (disk > 0).then_some(Region { base: base + mem, size: disk }),
            }
        })
        .collect();
    Ok((left, placements))
}

/// The `domu_selftest=N` DomUs' specs: Dom0's kernel and initrd modules,
/// `mem` bytes of RAM, `vcpus` vCPUs, a vPL011, a `disk`-byte RAM disk, and
/// bootargs for the guest image's `/init` (`guestcmd=<cmd_b64>` when given).
pub fn selftest_specs(
    n: u32,
    kernel: Region,
    ramdisk: Option<Region>,
    (mem, vcpus, disk): (u64, u32, u64),
    cmd_b64: Option<&str>,
) -> Vec<VmSpec> {
    let mut bootargs = alloc::format!("console=ttyAMA0 earlycon=pl011,{DOMU_UART:#x}");
    if let Some(c) = cmd_b64 {
        bootargs.push_str(" guestcmd=");
        bootargs.push_str(c);
    }
    (1..=n)
        .map(|i| VmSpec {
            id: i as u16,
            name: alloc::format!("domU{i}"),
            memory: mem,
            vcpus,
            vpl011: true,
            kernel,
            ramdisk,
            bootargs: bootargs.clone(),
            weight: super::DEFAULT_WEIGHT,
            cap_percent: None,
            disk_size: disk,
            heap_quota: crate::quota::DEFAULT_DOMU_HEAP_QUOTA,
            kernel_load_addr: None,
            pin_vcpus: false,
            cpus: alloc::vec::Vec::new(),
            pci: Vec::new(),
        })
        .collect()
}
