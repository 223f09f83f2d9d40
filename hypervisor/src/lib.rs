//! The hypervisor library.
//!
//! Everything that does not need EL2 lives here as plain Rust that builds on
//! the host, so `cargo test` exercises it with fakes: device-tree discovery and
//! guest DTB editing (`dtb`), the vGIC register model (`vgic`), the
//! Credit2-compatible scheduler (`sched`), trap decoding (`esr`), stage-2 table
//! building (`stage2`), timer arithmetic (`time`), the emulated PL011
//! (`vpl011`) and PSCI (`psci`).
//! On the bare-metal aarch64 target the EL2 runtime (`arch`, `vm`) is added.
#![cfg_attr(not(test), no_std)]
extern crate alloc;

pub mod dtb;
pub mod sched;
pub mod stats;
pub mod vgic;
pub mod config;
pub mod esr;
pub mod idregs;
pub mod psci;
pub mod stage2;
pub mod time;
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
