//! What a fresh machine lacks and the user's own tools can give: the
//! bare-metal Rust target (rustup, per user). QEMU, EDK2 and the TF-A
//! tools are the project's own ([`crate::toolchain`]); nothing here
//! installs system packages.

use crate::Result;
use anyhow::{anyhow, bail, Context};
use std::process::Command;

pub const TARGET: &str = "aarch64-unknown-none-softfloat";

/// Whether `cmd` is on PATH.
pub fn have(cmd: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {cmd} >/dev/null 2>&1")).status().is_ok_and(|s| s.success())
}

/// `rustup target add` when the target's standard library is missing.
pub fn ensure_target() -> Result<()> {
    let out = Command::new("rustup").args(["target", "list", "--installed"]).output();
    if let Ok(o) = &out {
        if String::from_utf8_lossy(&o.stdout).lines().any(|l| l.trim() == TARGET) {
            return Ok(());
        }
    }
    eprintln!("xtask: installing Rust target {TARGET}");
    let st = Command::new("rustup").args(["target", "add", TARGET]).status().context("rustup")?;
    if !st.success() {
        bail!("`rustup target add {TARGET}` failed");
    }
    Ok(())
}

/// Tools the guest image builder uses (on every Debian machine): named
/// when missing, never installed.
pub fn ensure_image_tools() -> Result<()> {
    let missing: Vec<&str> = [("python3", "python3"), ("dpkg-deb", "dpkg"), ("apt-get", "apt")]
        .iter()
        .filter(|(cmd, _)| !have(cmd))
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(anyhow!("building the guest image needs {} (Debian packages); this machine lacks them", missing.join(" ")))
    }
}
