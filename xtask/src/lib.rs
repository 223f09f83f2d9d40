//! The project's driver, as a library so integration tests use the same code
//! paths as `cargo xtask run`.
//!
//! - [`cli`]: the command line (clap), its help text and checks
//! - [`platform`]: the machine a command is for (`--platform`), below [`cli`]
//! - [`setup`]: the rustup target; names missing host tools (installs no system package)
//! - [`toolchain`]: the project's own QEMU 10.0, EDK2 and TF-A tools, fetched as Debian packages into a cache (no root)
//! - [`doctor`]: `cargo xtask doctor` (what is in use and ready) and `clean [--caches]`
//! - [`build`]: builds the hypervisor and converts it to a flat arm64 Image
//! - [`hvload`]: where QEMU loads the hypervisor and which register
//!   convention enters it (`--hv-addr`, `--hv-entry`)
//! - [`image`]: builds the guest kernel + initramfs (guest-images/build.sh)
//! - [`firmware`]: TF-A from Debian's source package, cached; the DTB with the hypervisor's options
//! - [`uefi`]: `--firmware uefi`: EDK2 as -bios, the ESP with the hypervisor as BOOTAA64.EFI
//! - [`graviton`]: `--platform graviton`: the UEFI + ACPI boot on a Neoverse core with NVMe, on QEMU
//! - [`qemu`]: composes the QEMU command line and runs it with a timeout
//! - [`text`]: base64 for `guestcmd=` and shell quoting for printed command lines, shared below [`qemu`]
//! - [`domu`]: `--domu N`: the DomUs' dom0less DTB nodes, their modules and RAM
//! - [`fvp`]: the FVP Base RevC command line and DTB (`run --platform fvp`)
//! - [`shrinkwrap`]: the Shrinkwrap overlay fvp/hypervisor.yaml and its check
//! - [`lint`]: rustfmt, clippy and rustdoc (warnings as errors), run by `cargo xtask test`
//! - [`bench`](mod@bench): the benchmarks in Linux guests (`cargo xtask bench`)
//! - [`conformance`]: `cargo xtask conformance`: the conformance guest on bare QEMU, as Dom0 or a DomU, and its output parsed
//! - [`trace`]: reads the hypervisor's flight-recorder dumps back, per-pCPU timelines
//! - [`deps`]: `cargo xtask deps`: the module graph of a crate read from its
//!   source, and the circles among sibling modules
//! - `arch_doc` (tests only): keeps docs/ARCHITECTURE.md, README's
//!   architecture section and the module lists true to the tree
//! - `source_rules` (tests only): no function over 120 lines, no issue
//!   numbers in comments

pub mod bench;
pub mod build;
pub mod cli;
pub mod conformance;
pub mod deps;
pub mod doctor;
pub mod domu;
pub mod firmware;
pub mod fvp;
pub mod graviton;
pub mod hvload;
pub mod image;
pub mod lint;
pub mod platform;
pub mod qemu;
pub mod setup;
pub mod shrinkwrap;
pub mod text;
pub mod toolchain;
pub mod trace;
pub mod uefi;

#[cfg(test)]
mod arch_doc;
#[cfg(test)]
mod source_rules;

use std::path::PathBuf;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Where xtask puts its outputs (`target/xtask`).
pub fn out_dir() -> PathBuf {
    root().join("target").join("xtask")
}

pub type Result<T> = std::result::Result<T, String>;
