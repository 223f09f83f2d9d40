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

    /// [`GuestImage::dom0_initrd`] with what `hvctl create` needs for a
    /// DomU (`--domu-pool`): this kernel, the small initramfs
    /// ([`small_initrd`]) and an example xl.cfg
    /// ([`crate::build::hvctl::initrd_with_domu_files`]).
    pub fn dom0_initrd_with_domu(&self) -> Result<PathBuf> {
        let small = small_initrd(&self.initrd)?;
        crate::build::hvctl::initrd_with_domu_files(&self.dom0_initrd()?, &self.kernel, &small, self.flavour.as_str())
    }
}

/// The guest image's initramfs `full` without the shared libraries and the
/// large programs (fio, cyclictest): /init, busybox and the kernel
/// modules, a few MiB, written to target/xtask/initramfs-small.cpio. For
/// layouts with little room for the initrd, many domains booting on one
/// pCPU, and the DomU files `hvctl create` reads from Dom0's initramfs.
pub fn small_initrd(full: &std::path::Path) -> Result<PathBuf> {
    let data = std::fs::read(full).with_context(|| full.display().to_string())?;
    let field = |h: &[u8], i: usize| -> Result<usize> {
        let hex = std::str::from_utf8(&h[6 + 8 * i..14 + 8 * i]).context("cpio header")?;
        usize::from_str_radix(hex, 16).context("cpio header")
    };
    let align4 = |v: usize| (v + 3) & !3;
    let (mut out, mut at) = (Vec::new(), 0);
    loop {
        // newc: "070701", 13 hex fields of 8, the name, then the data, each
        // padded to 4 bytes from the start of the archive.
        let h = data.get(at..at + 110).context("truncated cpio archive")?;
        if &h[..6] != b"070701" {
            bail!("{}: not a newc cpio archive", full.display());
        }
        let (mode, size, namesize) = (field(h, 1)?, field(h, 6)?, field(h, 11)?);
        let name = data.get(at + 110..at + 110 + namesize - 1).context("truncated cpio archive")?;
        let name = std::str::from_utf8(name).context("cpio name")?;
        let next = align4(align4(at + 110 + namesize) + size);
        let large_file = mode & 0o170000 == 0o100000 && size > 256 << 10 && name != "bin/busybox";
        if !large_file {
            out.extend_from_slice(data.get(at..next).context("truncated cpio archive")?);
        }
        if name == "TRAILER!!!" {
            break;
        }
        at = next;
    }
    let path = crate::out_dir().join("initramfs-small.cpio");
    std::fs::create_dir_all(crate::out_dir())?;
    crate::build::hvctl::write_whole(&path, &out)?;
    Ok(path)
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
