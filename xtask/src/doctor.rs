//! `cargo xtask doctor`: what the runs will use and what is ready, without
//! fetching or building anything; `cargo xtask clean [--caches]`.

use crate::toolchain::{self, Bundle};
use crate::Result;
use anyhow::{anyhow, Context};
use std::path::{Path, PathBuf};

/// Bytes under `p` (files and symlinks themselves, not what they point at).
pub fn disk_usage(p: &Path) -> u64 {
    let Ok(m) = std::fs::symlink_metadata(p) else { return 0 };
    if !m.is_dir() {
        return m.len();
    }
    std::fs::read_dir(p).map(|rd| rd.filter_map(|e| e.ok()).map(|e| disk_usage(&e.path())).sum()).unwrap_or(0)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

/// The caches and what each holds: (path, what).
pub fn caches() -> Vec<(PathBuf, &'static str)> {
    let root = crate::root();
    vec![
        (toolchain::cache_root(), "the project's QEMU, EDK2, TF-A tools and their .debs"),
        (root.join("guest-images/cache"), "the guest image's arm64 packages"),
        (root.join("guest-images/out"), "the guest image (cloud kernel)"),
        (root.join("guest-images/out-generic"), "the guest image (generic kernel)"),
        (crate::firmware::tf_a::cache_dir(), "TF-A's source and builds"),
        (crate::platform::shrinkwrap::venv(), "the Shrinkwrap venv"),
    ]
}

fn bundle_line(b: &Bundle, cache: &Path) -> String {
    match toolchain::cached(b, cache) {
        None => format!("not fetched yet (fetched on first use into {})", cache.join(b.name).display()),
        Some(pkgs) => match toolchain::check(b, &cache.join(b.name)) {
            Ok(c) => format!("ready: {c}, {} packages, {}", pkgs.len(), cache.join(b.name).display()),
            Err(e) => format!("cached but failing its check ({e:#}): fetched again on first use"),
        },
    }
}

/// Prints the report; always succeeds (it only looks).
pub fn doctor() -> Result<()> {
    let cache = toolchain::cache_root();
    let rustc = std::process::Command::new("rustc").arg("--version").output();
    let rustc = rustc
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|e| format!("missing ({e})"));
    let target = std::process::Command::new("rustup").args(["target", "list", "--installed"]).output();
    let target_ok =
        target.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.trim() == crate::setup::TARGET));
    println!(
        "rust:          {rustc}; target {} {}",
        crate::setup::TARGET,
        if target_ok { "installed" } else { "missing (added by the first build)" }
    );
    match std::env::var_os(toolchain::QEMU_ENV).filter(|v| !v.is_empty()) {
        Some(p) => match toolchain::Qemu::user(Path::new(&p), "--qemu (XTASK_QEMU)") {
            Ok(q) => println!("qemu:          {} ({}), the user's", q.version, q.origin),
            Err(e) => println!("qemu:          UNUSABLE: {e:#}"),
        },
        None => {
            println!("qemu:          the project's {}: {}", toolchain::QEMU.name, bundle_line(&toolchain::QEMU, &cache))
        }
    }
    println!("edk2:          {}", bundle_line(&toolchain::EDK2, &cache));
    println!("tf-a tools:    {}", bundle_line(&toolchain::TFA_TOOLS, &cache));
    let builds: Vec<String> = std::fs::read_dir(crate::firmware::tf_a::cache_dir())
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().join("flash.bin").is_file())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    println!(
        "tf-a builds:   {}",
        if builds.is_empty() { "none yet (built on first use)".into() } else { builds.join(", ") }
    );
    let image = crate::root().join("guest-images/out/manifest.txt");
    println!(
        "guest image:   {}",
        if image.is_file() { "built (rebuilt when its inputs change)" } else { "not built yet" }
    );
    let venv = crate::platform::shrinkwrap::venv().join("bin/shrinkwrap");
    println!(
        "shrinkwrap:    {}",
        if venv.is_file() {
            "installed"
        } else {
            "not installed (installed by cargo xtask test when PyPI is reachable)"
        }
    );
    println!("caches:");
    let mut total = 0;
    for (p, what) in caches() {
        let b = disk_usage(&p);
        total += b;
        println!("  {:>10}  {} ({what})", mib(b), p.display());
    }
    println!("  {:>10}  in all; `cargo xtask clean --caches` removes them", mib(total));
    Ok(())
}

/// `cargo clean`, and with `caches` every cache of [`caches`].
pub fn clean(caches_too: bool) -> Result<()> {
    if caches_too {
        for (p, what) in caches() {
            if p.exists() {
                let b = disk_usage(&p);
                std::fs::remove_dir_all(&p).with_context(|| p.display().to_string())?;
                println!("removed {} ({what}, {})", p.display(), mib(b));
            }
        }
    }
    let st = std::process::Command::new(env!("CARGO"))
        .current_dir(crate::root())
        .arg("clean")
        .status()
        .context("cargo clean")?;
    if st.success() {
        Ok(())
    } else {
        Err(anyhow!("cargo clean failed"))
    }
}
