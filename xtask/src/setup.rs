//! What a fresh machine lacks and the user's own tools can give: the
//! bare-metal Rust target and the guest tools' musl target (rustup, per
//! user). QEMU, EDK2 and the TF-A tools are the project's own
//! ([`crate::toolchain`]); nothing here installs system packages.

use crate::Result;
use anyhow::{anyhow, bail, Context};
use std::process::Command;

/// The hypervisor's and the conformance guest's target.
pub const TARGET: &str = "aarch64-unknown-none-softfloat";
/// The target of the guest's own tools (`hvctl`): static Linux binaries.
pub const GUEST_TARGET: &str = "aarch64-unknown-linux-musl";

/// Whether `cmd` is on PATH.
pub fn have(cmd: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {cmd} >/dev/null 2>&1")).status().is_ok_and(|s| s.success())
}

/// `rustup target add` when `target`'s standard library is missing
/// ([`TARGET`], [`GUEST_TARGET`]).
pub fn ensure_target(target: &str) -> Result<()> {
    let out = Command::new("rustup").args(["target", "list", "--installed"]).output();
    if let Ok(o) = &out {
        if String::from_utf8_lossy(&o.stdout).lines().any(|l| l.trim() == target) {
            return Ok(());
        }
    }
    eprintln!("xtask: installing Rust target {target}");
    let st = Command::new("rustup").args(["target", "add", target]).status().context("rustup")?;
    if !st.success() {
        bail!("`rustup target add {target}` failed");
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
