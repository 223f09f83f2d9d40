//! The guest kernel and initramfs, built by guest-images/build.sh from
//! pinned Debian arm64 packages and cached per kernel flavour in
//! guest-images/out (cloud) and guest-images/out-generic (generic).

use crate::{root, Result};
use anyhow::{bail, Context};
use std::path::PathBuf;
use std::process::Command;

pub struct GuestImage {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    /// `perf` and the libraries it needs beyond the initramfs's, as a cpio
    /// archive to append to `initrd` (Linux unpacks both): kept out of the
    /// initramfs, which must still fit between the kernel and QEMU's DTB.
    pub perf: PathBuf,
    /// The kernel flavour it was built with.
    pub flavour: Flavour,
}

impl GuestImage {
    /// Dom0's initrd by default: `initrd` with `/usr/bin/hvctl` appended
    /// ([`crate::build::hvctl`]; about 0.5 MiB more), built when missing
    /// or out of date. DomUs need no hvctl but get the same file, as they
    /// got `initrd` before.
    pub fn dom0_initrd(&self) -> Result<PathBuf> {
        crate::build::hvctl::initrd_with_hvctl(&self.initrd, self.flavour.as_str())
    }
}

/// Debian's arm64 kernel flavour the guest image is built with
/// (`cargo xtask run --kernel-flavour`, build.sh's second argument).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Flavour {
    /// linux-image-*-cloud-arm64: virtio as modules, NVMe built in
    #[default]
    Cloud,
    /// linux-image-*-arm64: Debian's generic kernel, virtio and NVMe disks as modules
    Generic,
}

impl Flavour {
    /// The flavour's name, as build.sh takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Flavour::Cloud => "cloud",
            Flavour::Generic => "generic",
        }
    }

    /// Where build.sh writes this flavour's image: each flavour has its own
    /// directory, so each keeps its own up-to-date check.
    pub fn out_dir(self) -> PathBuf {
        let dir = match self {
            Flavour::Cloud => "out",
            Flavour::Generic => "out-generic",
        };
        root().join("guest-images").join(dir)
    }
}

/// Builds (or reuses) the guest image with the cloud kernel.
pub fn guest() -> Result<GuestImage> {
    guest_flavour(Flavour::Cloud)
}

/// Builds (or reuses) the guest image with the kernel `flavour`.
pub fn guest_flavour(flavour: Flavour) -> Result<GuestImage> {
    crate::setup::ensure_image_tools()?;
    let out = flavour.out_dir();
    let st = Command::new("bash")
        .arg(root().join("guest-images").join("build.sh"))
        .arg(&out)
        .arg(flavour.as_str())
        .status()
        .context("guest-images/build.sh")?;
    if !st.success() {
        bail!("guest-images/build.sh ({} kernel) failed", flavour.as_str());
    }
    Ok(GuestImage {
        kernel: out.join("Image"),
        initrd: out.join("initramfs.cpio"),
        perf: out.join("perf.cpio"),
        flavour,
    })
}
