//! The EL2 binary. All code lives in the library; the entry points are in
//! `hypervisor::arch::aarch64::entry` and `hypervisor::runtime`.
#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(target_os = "none")]
use hypervisor as _;

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!("the hypervisor is a bare-metal aarch64 binary: build it with `cargo xtask build`");
}
