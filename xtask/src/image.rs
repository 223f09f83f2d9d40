//! The guest kernel and initramfs, built by guest-images/build.sh from
//! pinned Debian arm64 packages and cached in guest-images/out.

use crate::{root, Result};
use std::path::PathBuf;
use std::process::Command;

pub struct GuestImage {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

/// Builds (or reuses) the guest image.
pub fn guest() -> Result<GuestImage> {
    crate::setup::ensure_image_tools()?;
    let out = root().join("guest-images").join("out");
    let st = Command::new("bash")
        .arg(root().join("guest-images").join("build.sh"))
        .arg(&out)
        .status()
        .map_err(|e| format!("guest-images/build.sh: {e}"))?;
    if !st.success() {
        return Err("guest-images/build.sh failed".into());
    }
    Ok(GuestImage { kernel: out.join("Image"), initrd: out.join("initramfs.cpio") })
}
