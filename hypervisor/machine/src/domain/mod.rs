//! Domains described as data: Dom0 plus DomUs.
//!
//! DomUs are described with Xen's dom0less device-tree binding (nodes
//! `/chosen/domU<N>` with `compatible = "xen,domain"`, `memory` in KiB,
//! `cpus`, `vpl011`, and `module@…` children `multiboot,kernel` /
//! `multiboot,ramdisk` with `bootargs`), so Xen users recognise it. The
//! parser turns them into [`VmSpec`]s; the boot plan places each DomU's
//! RAM ([`DomuPlacement`]); the runtime builds each VM from the two.
//!
//! The types live in `spec` and the parser in `dtb::dom0less`, below the
//! boot plan; here are the DomU layout, the VM plans, the DomU device-tree
//! builder, the console's line discipline and the pool run-time DomUs' memory
//! comes from (`pool`).

pub mod console;
#[cfg(test)]
mod console_tests;
pub mod domu_dt;
pub mod layout;
pub mod pool;
#[cfg(test)]
mod tests;
pub mod vmplan;
#[cfg(test)]
mod vmplan_tests;

/// vMPIDR of a domain's vCPU `i`: Aff0 = i % 16, Aff1 = i / 16.
pub fn vcpu_mpidr(i: usize) -> u64 {
    ((i as u64 / 16) << 8) | (i as u64 % 16)
}

pub use crate::ids::DomainId;
pub use crate::spec::{DomuPlacement, VmSpec, DEFAULT_WEIGHT};
