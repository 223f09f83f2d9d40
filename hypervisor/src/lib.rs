//! The hypervisor library.
//!
//! Everything that does not need EL2 is plain Rust in two crates this one
//! re-exports module by module under their own names: `hv_core` (the
//! models and decisions: `vgic`, `sched`, `virtio`, ...) and `hv_machine`
//! (what the machine is and what runs on it: `dtb`, `boot`, `domain`,
//! `config`, ...). This crate adds `platform`, the descriptor of the board
//! this binary is built for (`HV_PLATFORM`).
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

// hv-machine's modules and, through it, hv-core's, each under its name.
pub use hv_machine::*;

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
