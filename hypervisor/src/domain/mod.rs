//! Domains described as data: Dom0 plus DomUs.
//!
//! DomUs are described with Xen's dom0less device-tree binding (nodes
//! `/chosen/domU<N>` with `compatible = "xen,domain"`, `memory` in KiB,
//! `cpus`, `vpl011`, and `module@…` children `multiboot,kernel` /
//! `multiboot,ramdisk` with `bootargs`), so Xen users recognise it. The
//! parser turns them into [`DomainSpec`]s; the boot plan places each DomU's
//! RAM ([`DomuPlacement`]); the runtime builds each VM from the two.
//!
//! This module holds the shared types; the parser, the layout and the
//! DomU device-tree builder live in submodules.

pub mod console;
#[cfg(test)]
mod console_tests;
pub mod domu_dt;
pub mod layout;
#[cfg(test)]
mod tests;
pub mod vmplan;
#[cfg(test)]
mod vmplan_tests;

use crate::region::Region;
use alloc::string::String;

/// vMPIDR of a domain's vCPU `i`: Aff0 = i % 16, Aff1 = i / 16.
pub fn vcpu_mpidr(i: usize) -> u64 {
    ((i as u64 / 16) << 8) | (i as u64 % 16)
}

pub use crate::ids::DomainId;

/// Credit2's default domain weight.
pub const DEFAULT_WEIGHT: u32 = 256;

/// One DomU as the device tree describes it. Addresses of modules are host
/// physical (where the bootloader loaded them); nothing here is trusted
/// until the plan has checked it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainSpec {
    pub id: DomainId,
    /// The node's name, e.g. `domU1`.
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

/// The dom0less parser: the boot DTB's `/chosen/domU*` nodes → [`DomainSpec`]s.
pub mod dom0less;
