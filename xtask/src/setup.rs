//! Installs what a fresh Debian machine lacks: the bare-metal Rust target
//! and QEMU. Each step is idempotent and quick when already done.

use crate::Result;
use std::process::Command;

pub const TARGET: &str = "aarch64-unknown-none-softfloat";

fn have(cmd: &str) -> bool {
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
    let st = Command::new("rustup").args(["target", "add", TARGET]).status().map_err(|e| format!("rustup: {e}"))?;
    if !st.success() {
        return Err(format!("`rustup target add {TARGET}` failed"));
    }
    Ok(())
}

/// Runs an apt-get install as root (directly, or through sudo).
pub fn apt_install(packages: &[&str]) -> Result<()> {
    let root = Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0")).unwrap_or(false);
    let prefix = if root { "" } else { "sudo " };
    let script = format!(
        "set -e; export DEBIAN_FRONTEND=noninteractive; \
         for i in $(seq 1 60); do {prefix}fuser /var/lib/dpkg/lock-frontend >/dev/null 2>&1 || break; sleep 5; done; \
         {prefix}apt-get update -qq; {prefix}apt-get install -y -qq --no-install-recommends {}",
        packages.join(" ")
    );
    eprintln!("xtask: apt-get install {}", packages.join(" "));
    let st = Command::new("sh").arg("-c").arg(script).status().map_err(|e| format!("apt-get: {e}"))?;
    if !st.success() {
        return Err(format!("apt-get install {} failed", packages.join(" ")));
    }
    Ok(())
}

/// QEMU for aarch64 (Debian package qemu-system-arm).
pub fn ensure_qemu() -> Result<()> {
    if have("qemu-system-aarch64") {
        return Ok(());
    }
    apt_install(&["qemu-system-arm", "ipxe-qemu"])?;
    if have("qemu-system-aarch64") {
        Ok(())
    } else {
        Err("qemu-system-aarch64 still missing after apt-get install".into())
    }
}

/// Tools the guest image builder uses (normally present on Debian).
pub fn ensure_image_tools() -> Result<()> {
    let missing: Vec<&str> = [("python3", "python3"), ("dpkg-deb", "dpkg"), ("cpio", "cpio")]
        .iter()
        .filter(|(cmd, _)| !have(cmd))
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        apt_install(&missing)
    }
}
