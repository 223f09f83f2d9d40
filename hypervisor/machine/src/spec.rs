//! A domain as data: what one VM is to be ([`VmSpec`], Dom0 and DomUs
//! alike) and where the boot plan put a DomU ([`DomuPlacement`]). The
//! parsers produce these and the plans consume them, so they sit below
//! both: a DomU's spec comes from its dom0less node, Dom0's from the
//! options and the boot modules once the boot plan has sized its RAM
//! (`domain::vmplan::dom0_spec`).

use crate::ids::DomainId;
use crate::region::Region;
use alloc::string::String;
use core::fmt;

/// Credit2's default domain weight.
pub const DEFAULT_WEIGHT: u32 = 256;

/// One VM as it was asked for: its size, kernel and boot arguments, its
/// share of the pCPUs, its disk and heap. Addresses of modules are host
/// physical (where the bootloader loaded them); nothing here is trusted
/// until the plan has checked it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmSpec {
    pub id: DomainId,
    /// The dom0less node's name, e.g. `domU1`; `Dom0` for Dom0.
    pub name: String,
    /// Guest RAM in bytes (the binding's `memory` is in KiB).
    pub memory: u64,
    pub vcpus: u32,
    /// An emulated PL011 console (`vpl011`).
    pub vpl011: bool,
    /// The kernel module as loaded (host physical).
    pub kernel: Region,
    pub ramdisk: Option<Region>,
    /// The kernel module's `bootargs` (or the domain node's).
    pub bootargs: String,
    /// Credit2 weight (`hv,sched-weight`; default [`DEFAULT_WEIGHT`]).
    pub weight: u32,
    /// Credit2 cap in percent of one pCPU (`hv,sched-cap`; none = uncapped).
    pub cap_percent: Option<u32>,
    /// Size in bytes of the RAM-backed virtio-blk disk the hypervisor serves
    /// to this domain (`hv,disk-size`; 0 or absent = no disk).
    pub disk_size: u64,
    /// Heap the hypervisor may allocate at run time on its behalf
    /// (`hv,heap-quota`; default [`crate::quota::DEFAULT_DOMU_HEAP_QUOTA`]).
    pub heap_quota: u64,
    /// The kernel module is a raw binary loaded at this guest-physical
    /// address and entered there (`hv,kernel-load-addr`); `None`: an arm64
    /// Image or ELF file (`boot::image`).
    pub kernel_load_addr: Option<u64>,
    /// vCPU i runs only on pCPU i mod N (`dom0_vcpus_pin`; DomUs have no
    /// such property and float).
    pub pin_vcpus: bool,
    /// vCPU i runs only on pCPU `cpus[i]` (`hvctl create`'s `cpus=`);
    /// empty: as `pin_vcpus` says.
    pub cpus: alloc::vec::Vec<u32>,
    /// PCIe functions assigned to it (`hv,pci-assigned`; Dom0: none).
    pub pci: alloc::vec::Vec<crate::vpci::Bdf>,
}

/// Where the boot plan put one DomU's backing memory (host physical, 2 MiB
/// aligned, disjoint from everything else the plan keeps or places).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DomuPlacement {
    pub id: DomainId,
    /// Backs the DomU's RAM (mapped at a fixed guest-physical base, not
    /// identity-mapped).
    pub ram: Region,
    /// Backs its RAM disk, when `disk_size` > 0.
    pub disk: Option<Region>,
}

/// `n` bytes as the boot log shows sizes: MiB when whole, else bytes.
struct Bytes(u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            n if n.is_multiple_of(1 << 20) => write!(f, "{} MiB", n >> 20),
            n => write!(f, "{n} bytes"),
        }
    }
}

/// The boot log's line for a parsed DomU: `domU1 (d1): 256 MiB, 1 vCPU,
/// kernel 0x… (… bytes), ramdisk …, weight 256, cap none, disk 64 MiB,
/// vpl011, bootargs "…"`.
impl fmt::Display for VmSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.vcpus == 1 { "" } else { "s" };
        write!(f, "{} (d{}): {}, {} vCPU{s}", self.name, self.id, Bytes(self.memory), self.vcpus)?;
        write!(f, ", kernel {:#x} ({} bytes)", self.kernel.base, self.kernel.size)?;
        match self.ramdisk {
            Some(r) => write!(f, ", ramdisk {:#x} ({} bytes)", r.base, r.size)?,
            None => write!(f, ", no ramdisk")?,
        }
        if let Some(a) = self.kernel_load_addr {
            write!(f, ", raw kernel at {a:#x}")?;
        }
        write!(f, ", weight {}", self.weight)?;
        match self.cap_percent {
            Some(c) => write!(f, ", cap {c}%")?,
            None => write!(f, ", cap none")?,
        }
        match self.disk_size {
            0 => write!(f, ", no disk")?,
            d => write!(f, ", disk {}", Bytes(d))?,
        }
        if self.vpl011 {
            write!(f, ", vpl011")?;
        }
        write!(f, ", bootargs {:?}", self.bootargs)
    }
}

/// The boot log's line for a placed DomU: `d1: RAM 0x…-0x…, disk 0x…-0x…`.
impl fmt::Display for DomuPlacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "d{}: RAM {:#x}-{:#x}", self.id, self.ram.base, self.ram.end())?;
        match self.disk {
            Some(d) => write!(f, ", disk {:#x}-{:#x}", d.base, d.end()),
            None => write!(f, ", no disk"),
        }
    }
}
