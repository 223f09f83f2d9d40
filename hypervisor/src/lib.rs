//! The hypervisor library.
//!
//! Everything that does not need EL2 lives here as plain Rust that builds on
//! the host, so `cargo test` exercises it with fakes: device-tree discovery and
//! guest DTB editing (`dtb`), the vGIC register model (`vgic`), the
//! Credit2-compatible scheduler (`sched`), trap decoding (`esr`), stage-2 table
//! building (`stage2`), the emulated PL011 (`vpl011`), PSCI (`psci`), the
//! boot-layout plan (`boot`), the EL2 trap configuration (`traps`) over
//! typed register layouts (`regs`, with `aarch64-cpu`), the guest's ID
//! registers (`idregs`) and its emulated debug registers (`vdebug`).
//! On the bare-metal aarch64 target the EL2 runtime (`arch`, `runtime`) is
//! added.
//!
//! `unsafe` is held to two rules the compiler enforces: every unsafe block
//! says why it is sound (`// SAFETY:`), and an `unsafe fn` body still marks
//! its own unsafe operations.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
extern crate alloc;

pub mod boot;
pub mod dtb;
pub mod sched;
pub mod stats;
pub mod vgic;
pub mod config;
pub mod esr;
pub mod idregs;
pub mod psci;
pub mod regs;
pub mod stage2;
pub mod traps;
pub mod vdebug;
pub mod vpl011;
pub mod virtio;

/// The platform this binary is built for (`HV_PLATFORM`, default qemu-virt).
#[allow(dead_code)]
pub mod platform {
    include!(env!("HV_PLATFORM_RS"));
}

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub mod arch;
#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub mod runtime;
