//! The hypervisor library.
//!
//! Everything that does not need EL2 lives here as plain Rust that builds on
//! the host, so `cargo test` exercises it with fakes:
//! - `boot`: the boot-layout plan and the arm64 Image header
//! - `dtb`: device-tree discovery (incl. the dom0less DomUs) and guest DTB editing
//! - `spec`: a domain as data (`DomainSpec`) and where the plan put it
//! - `domain`: the DomU layout, VM plans and DomU device tree, the console
//! - `firmware`: the machine from ACPI (`firmware::acpi`: table parser, the
//!   `Platform` it yields, Dom0's rewritten tables)
//! - `config`: hypervisor options from `/chosen/xen,xen-bootargs` or `/chosen/bootargs`
//! - `regs`: register layouts `aarch64-cpu` lacks; `traps`: the EL2 trap
//!   configuration over them; `idregs`: the guest's ID registers; `vdebug`:
//!   its debug registers (breakpoints switched lazily, the rest emulated);
//!   `vpmu`: its virtual PMU, switched lazily
//! - `esr`: trap decoding; `psci`: PSCI/SMCCC decoding; `mitigations`:
//!   Spectre-v2/v4/BHB decisions and the SMCCC workaround answers; `stage2`:
//!   stage-2 table building
//! - `ids`: the identifiers every layer shares (`DomainId`)
//! - `intid`: the GIC's interrupt IDs as a checked type (`IntId`)
//! - `gicr`: each CPU's redistributor found over every GICR region
//! - `its`: the ITS register layouts and command format (physical driver and vITS)
//! - `irq`: the physical IRQ route table (INTID → what the hypervisor does)
//! - `mmio_bus`: a VM's emulated MMIO ranges (guest-physical range → device)
//! - `iomem`: which unmapped addresses an ACPI Dom0 gets mapped on demand
//! - `vgic`: the virtual GICv3 register model and list registers
//! - `virtio`: the hypervisor's virtio-blk device and its RAM backend
//! - `vpl011`: the emulated PL011
//! - `quota`: per-VM heap quotas (what a guest's actions may allocate)
//! - `region`: `Region`, the physical address range every layer shares
//! - `sched`: the Credit2-compatible scheduler and its simulator
//! - `stats`: per-vCPU counters and histograms in a stable text format
//! - `sync`: the hypervisor's locks (`spin`'s, waiting with YIELD)
//! - `time`: counter-tick/ns arithmetic that saturates, timer slop
//! - `ptimer`: the emulated EL1 physical timer (CNTP_*_EL0)
//! - `trace`: the scheduling flight recorder (per-pCPU event rings, dump format)
//! - `platform_desc`: the typed platform descriptor each `platforms/*/platform.rs`
//!   fills in (`platform` is the one this build is for)
//! - `testrng` (tests only): a deterministic generator for randomized host tests
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

pub mod boot;
pub mod config;
pub mod domain;
pub mod dtb;
pub mod esr;
pub mod firmware;
pub mod gicr;
pub mod idregs;
pub mod ids;
pub mod intid;
pub mod iomem;
pub mod irq;
pub mod its;
pub mod mitigations;
pub mod mmio_bus;
pub mod psci;
pub mod ptimer;
pub mod quota;
pub mod region;
pub mod regs;
pub mod sched;
pub mod spec;
pub mod stage2;
pub mod stats;
pub mod sync;
#[cfg(test)]
mod testrng;
pub mod time;
pub mod trace;
pub mod traps;
pub mod vdebug;
pub mod vgic;
pub mod virtio;
pub mod vpl011;
pub mod vpmu;

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
