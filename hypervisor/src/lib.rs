//! The hypervisor library.
//!
//! Everything that does not need EL2 lives here as plain Rust that builds on
//! the host, so `cargo test` exercises it with fakes. The models and
//! decisions that need nothing of the machine's description are the
//! `hv_core` crate, re-exported module by module under their own names
//! (`vgic`, `sched`, `virtio`, ...: see its list); this crate adds how the
//! machine is described and what runs on it:
//! - `boot`: the boot-layout plan and the arm64 Image header
//! - `dtb`: device-tree discovery (incl. the dom0less DomUs) and guest DTB editing
//! - `spec`: a domain as data (`DomainSpec`) and where the plan put it
//! - `domain`: the DomU layout, VM plans and DomU device tree, the console
//! - `firmware`: the machine from ACPI (`firmware::acpi`: table parser, the
//!   `Platform` it yields, Dom0's rewritten tables)
//! - `config`: hypervisor options from `/chosen/xen,xen-bootargs` or `/chosen/bootargs`
//! - `gicr`: each CPU's redistributor found over every GICR region
//! - `iomem`: which unmapped addresses an ACPI Dom0 gets mapped on demand
//! - `platform_desc`: the typed platform descriptor each `platforms/*/platform.rs`
//!   fills in (`platform` is the one this build is for)
//!
//! On the bare-metal aarch64 target the EL2 code is added: `arch` (the only
//! inline assembly and system-register access) and `runtime` (boot, the run
//! loop, the devices' EL2 side). Where each piece lives and how a trap, an
//! interrupt and an I/O request flow through them: docs/ARCHITECTURE.md.
//!
//! `unsafe` is held to two rules the compiler enforces: every unsafe block
//! says why it is sound (`// SAFETY:`), and an `unsafe fn` body still marks
//! its own unsafe operations.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
extern crate alloc;

#[cfg(test)]
use hv_core::testrng;
pub use hv_core::{
    esr, idregs, ids, intid, irq, its, mitigations, mmio_bus, psci, ptimer, quota, region, regs, sched, stage2, stats,
    sync, time, trace, traps, vdebug, vgic, virtio, vpl011, vpmu,
};

pub mod boot;
pub mod config;
pub mod domain;
pub mod dtb;
pub mod firmware;
pub mod gicr;
pub mod iomem;
pub mod spec;

pub mod platform_desc;

/// The platform this binary is built for (`HV_PLATFORM`, default qemu-virt):
/// its `platform.rs` fills in [`PLATFORM`](platform::PLATFORM).
#[allow(dead_code)]
pub mod platform {
    use crate::platform_desc::*;
    include!(env!("HV_PLATFORM_RS"));

    /// Whether 1 GiB window `gib` holds devices (the boot identity map's
    /// and the DTB reader's question).
    pub fn is_device_gib(gib: u64) -> bool {
        PLATFORM.is_device_gib(gib)
    }
}

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub mod arch;
#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub mod runtime;
