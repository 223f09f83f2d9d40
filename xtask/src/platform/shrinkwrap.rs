//! The Shrinkwrap overlay (`fvp/hypervisor.yaml`) and its check in
//! `cargo xtask test`: Shrinkwrap (`shrinkwraptool` from PyPI) is installed
//! once into a venv under `target/`, then `shrinkwrap -R null process` and
//! `build --dry-run` must resolve the overlay on top of `ns-preload.yaml`
//! with the hypervisor as BL33 at the FVP platform's load address. Neither
//! needs the FVP or the network; the install does, and without PyPI the
//! check is skipped with a line saying so.

use crate::{root, Result};
use anyhow::{anyhow, bail, Context};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The overlay, relative to the repository root.
pub const OVERLAY: &str = "fvp/hypervisor.yaml";
/// The Shrinkwrap config the overlay goes on.
pub const BASE_CONFIG: &str = "ns-preload.yaml";
/// Every command here is bounded (seconds).
const LIMIT_S: &str = "600";

pub fn venv() -> PathBuf {
    root().join("target").join("shrinkwrap-venv")
}

/// The `shrinkwrap` executable, installed into the venv if missing; `None`
/// (with the reason) when it cannot be installed here.
pub fn ensure() -> Result<PathBuf> {
    let bin = venv().join("bin").join("shrinkwrap");
    if bin.is_file() {
        return Ok(bin);
    }
    let quiet = |c: &mut Command| c.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if !venv().join("bin").join("pip").is_file() && !quiet(Command::new("python3").arg("-m").arg("venv").arg(venv())) {
        bail!("python3 -m venv failed (python3-venv missing?)");
    }
    let pip = venv().join("bin").join("pip");
    if !quiet(Command::new("timeout").args([LIMIT_S]).arg(&pip).args(["install", "-q", "shrinkwraptool"])) {
        bail!("pip install shrinkwraptool failed (PyPI unreachable?)");
    }
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(anyhow!("shrinkwraptool installed no shrinkwrap executable"))
    }
}

/// The `shrinkwrap run` line for the files `cargo xtask run --platform fvp`
/// made (printed by its dry run).
pub fn run_line(r: &crate::platform::fvp::FvpRun) -> String {
    let mut v = vec![
        "shrinkwrap".to_string(),
        "run".into(),
        BASE_CONFIG.into(),
        "--overlay".into(),
        root().join(OVERLAY).display().to_string(),
    ];
    let mut rt = |k: &str, val: String| v.extend(["--rtvar".to_string(), format!("{k}={val}")]);
    rt("KERNEL", r.hypervisor.display().to_string());
    rt("DTB", r.dtb.display().to_string());
    rt("DOM0_KERNEL", r.kernel.display().to_string());
    if let Some(i) = &r.initrd {
        rt("DOM0_INITRD", i.display().to_string());
        rt("INITRD_ADDR", format!("{:#x}", r.initrd_addr));
    }
    rt("ROOTFS", r.disk.display().to_string());
    crate::platform::fvp::printable(&v)
}

/// Runs `shrinkwrap -R null ARGS` with Shrinkwrap's directories under
/// target/, bounded in time; its standard output.
fn shrinkwrap(bin: &PathBuf, args: &[&str]) -> Result<String> {
    let dir = root().join("target").join("shrinkwrap");
    let out = Command::new("timeout")
        .arg(LIMIT_S)
        .arg(bin)
        .args(["-R", "null"])
        .args(args)
        .current_dir(root())
        .env("SHRINKWRAP_BUILD", dir.join("build"))
        .env("SHRINKWRAP_PACKAGE", dir.join("package"))
        .output()
        .context("shrinkwrap")?;
    if !out.status.success() {
        bail!("shrinkwrap {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The check: `process` resolves the overlay with every rtvar set and puts
/// the hypervisor, the DTB and the modules at their addresses; `build
/// --dry-run` builds TF-A with BL33 at the load address. `Ok(None)` =
/// skipped (the reason is printed).
pub fn check() -> Result<Option<()>> {
    let bin = match ensure() {
        Ok(b) => b,
        Err(why) => {
            println!("shrinkwrap: skipped ({why:#})");
            return Ok(None);
        }
    };
    let hv = crate::platform::fvp::hv_addr();
    let resolved = shrinkwrap(
        &bin,
        &[
            "process",
            "-a",
            "resolver",
            BASE_CONFIG,
            "-o",
            OVERLAY,
            "-r",
            "KERNEL=/hv.bin",
            "-r",
            "DTB=/fvp.dtb",
            "-r",
            "DOM0_KERNEL=/Image",
            "-r",
            "DOM0_INITRD=/initrd",
            "-r",
            "ROOTFS=/disk.img",
        ],
    )?;
    let want_process = [
        format!("cluster0.cpu0=/hv.bin@{hv:#x}"),
        format!("cluster0.cpu0=/fvp.dtb@{:#x}", crate::platform::fvp::DTB_ADDR),
        format!("cluster0.cpu0=/Image@{:#x}", crate::platform::fvp::KERNEL_ADDR),
        "cluster0.cpu0=/initrd@0x91e00000".into(),
        "bp.virtioblockdevice.image_path=/disk.img".into(),
        "has-gicv4.1=1".into(),
        "gic_distributor.virtual-lpi-support=1".into(),
    ];
    // The resolved run command is one YAML string, folded over lines.
    let flat = resolved.split_whitespace().collect::<Vec<_>>().join(" ");
    for w in &want_process {
        if !flat.contains(w.as_str()) {
            bail!("shrinkwrap process: the FVP command lacks {w}");
        }
    }
    let built = shrinkwrap(&bin, &["build", "--dry-run", BASE_CONFIG, "-o", OVERLAY])?;
    let want = format!("PRELOADED_BL33_BASE={hv}");
    if !built.contains(&want) {
        bail!("shrinkwrap build --dry-run: TF-A is not built with {want}");
    }
    println!("shrinkwrap: {OVERLAY} ok (process: hypervisor at {hv:#x}, GICv4.1; build --dry-run: {want})");
    Ok(Some(()))
}

#[cfg(test)]
mod tests {
    /// Installs Shrinkwrap (network): run with `--ignored`; `cargo xtask
    /// test` runs the same check.
    #[test]
    #[ignore]
    fn overlay_passes_process_and_build_dry_run() {
        assert!(super::check().unwrap().is_some(), "skipped");
    }

    #[test]
    fn run_line_names_every_rtvar() {
        let r = crate::platform::fvp::FvpRun {
            fvp: "FVP".into(),
            tfa: "/tfa".into(),
            hypervisor: "/hv.bin".into(),
            dtb: "/fvp.dtb".into(),
            kernel: "/Image".into(),
            initrd: Some("/initrd".into()),
            initrd_addr: 0x9200_0000,
            disk: "/disk.img".into(),
        };
        let l = super::run_line(&r);
        for w in [
            "--rtvar KERNEL=/hv.bin",
            "--rtvar DTB=/fvp.dtb",
            "--rtvar DOM0_KERNEL=/Image",
            "--rtvar DOM0_INITRD=/initrd",
            "--rtvar INITRD_ADDR=0x92000000",
            "--rtvar ROOTFS=/disk.img",
        ] {
            assert!(l.contains(w), "{w} in {l}");
        }
    }
}
