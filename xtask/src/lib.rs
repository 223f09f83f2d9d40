//! The project's driver, as a library so integration tests use the same code
//! paths as `cargo xtask run`.
//!
//! - [`cli`]: the command line (clap), its help text and checks
//! - [`platform`]: the machine a command is for (`--platform`), below [`cli`];
//!   FVP, its Shrinkwrap overlay, and Graviton's boot on QEMU
//! - [`setup`]: the rustup target; names missing host tools (installs no system package)
//! - [`toolchain`]: the project's own QEMU 10.0, EDK2 and TF-A tools, fetched as Debian packages into a cache (no root)
//! - [`doctor`]: `cargo xtask doctor` (what is in use and ready) and `clean [--caches]`
//! - [`build`]: builds the hypervisor and converts it to a flat arm64 Image,
//!   the conformance guest, and the guest kernel + initramfs
//! - [`firmware`]: `--firmware tf-a` (TF-A from Debian's source package) and
//!   `--firmware uefi` (EDK2, the ESP)
//! - [`run`]: composes the QEMU command line and runs it; where the
//!   hypervisor loads; the DomUs
//! - [`text`]: base64 for `guestcmd=` and shell quoting for printed command lines, shared below [`run`]
//! - [`bench`](mod@bench): the benchmarks in Linux guests (`cargo xtask bench`)
//! - [`conformance`]: `cargo xtask conformance`: the conformance guest on bare QEMU, as Dom0 or a DomU, and its output parsed
//! - [`trace`]: reads the hypervisor's flight-recorder dumps back, per-pCPU timelines
//! - [`checks`]: the checks on the tree: lint (rustfmt, clippy, rustdoc),
//!   `cargo xtask deps` (the module graph), and the tests that keep the
//!   architecture document and the source rules true

pub mod bench;
pub mod build;
pub mod checks;
pub mod cli;
pub mod conformance;
pub mod doctor;
pub mod firmware;
pub mod platform;
pub mod run;
pub mod setup;
pub mod text;
pub mod toolchain;
pub mod trace;

use std::path::PathBuf;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Where xtask puts its outputs (`target/xtask`).
pub fn out_dir() -> PathBuf {
    root().join("target").join("xtask")
}

/// xtask's result: an [`anyhow::Error`], what failed with what xtask was
/// doing as its context.
pub type Result<T> = anyhow::Result<T>;
