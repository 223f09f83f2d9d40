//! What the machine is and what runs on it, as plain Rust that builds and
//! is tested on the host: the parsers of what firmware says (device tree,
//! ACPI, UEFI), the hypervisor's options, the domains as data and the plans
//! (boot layout, one `VmPlan` per VM) the EL2 code applies. It sits on
//! `hv_core`, whose modules it re-exports under their names so both crates
//! spell paths alike (`crate::vgic`, `crate::region::Region`).
//!
//! - `boot`: the boot-layout plan and the arm64 Image header
//! - `dtb`: device-tree discovery (incl. the dom0less DomUs) and guest DTB editing
//! - `spec`: a domain as data (`VmSpec`) and where the plan put it
//! - `domain`: the DomU layout, VM plans and DomU device tree, the console
//! - `firmware`: the machine from ACPI (`firmware::acpi`: table parser, the
//!   `Machine` it yields, Dom0's rewritten tables)
//! - `config`: hypervisor options from `/chosen/xen,xen-bootargs` or `/chosen/bootargs`
//! - `iomem`: which unmapped addresses an ACPI Dom0 gets mapped on demand
//! - `platform_desc`: the typed platform descriptor each `platforms/*/platform.rs`
//!   fills in (`platform` is the one this build is for)
//!
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
extern crate alloc;

#[cfg(test)]
use hv_core::testrng;
pub use hv_core::{
    control, esr, gicr, idregs, ids, intid, irq, its, limits, mitigations, mmio_bus, psci, ptimer, quota, region, regs,
    sched, smmu, stage2, stats, sync, time, trace, traps, vdebug, vgic, virtio, vpci, vpl011, vpmu,
};

pub mod boot;
pub mod config;
pub mod domain;
pub mod dtb;
pub mod firmware;
pub mod iomem;
pub mod platform_desc;
pub mod spec;
