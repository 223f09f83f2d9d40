//! The hypervisor library.
//!
//! Everything that does not need EL2 is plain Rust in two crates this one
//! re-exports module by module under their own names: `hv_core` (the
//! models and decisions: `vgic`, `sched`, `virtio`, ...) and `hv_machine`
//! (what the machine is and what runs on it: `dtb`, `boot`, `domain`,
//! `config`, ...). This crate adds `platform`, the descriptor of the board
//! this binary is built for (`HV_PLATFORM`).
//!
//! `arch` is the EL2 layer, the `hv-arch-aarch64` crate (the only inline
//! assembly and system-register access; on the host, its fakes). `runloop`
//! holds the run loop's decisions that touch the hardware only through the
//! GIC CPU interface (list registers, kicks, wakes), host-tested against
//! those fakes. On the bare-metal aarch64 target the rest of the EL2 code is
//! added: `runtime` (boot, the run loop, the devices' EL2 side). Where each piece lives and how a trap, an
//! interrupt and an I/O request flow through them: docs/ARCHITECTURE.md.
//!
//! `unsafe` is denied but in `runtime` (the EL2 glue: the heap, the run
//! blocks, device memory it hands to drivers), and held to two rules the
//! compiler enforces: every unsafe block
//! says why it is sound (`// SAFETY:`), and an `unsafe fn` body still marks
//! its own unsafe operations.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]
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

/// The EL2 layer (`hv-arch-aarch64`): on the host, its fakes.
pub use hv_arch_aarch64 as arch;
pub mod runloop;
#[cfg(all(target_arch = "aarch64", target_os = "none"))]
#[allow(unsafe_code)]
pub mod runtime;
