//! Firmware for `cargo xtask run --firmware tf-a`: Arm Trusted Firmware
//! (TF-A) built for QEMU's `virt` machine from Debian's
//! `arm-trusted-firmware` source package, and the device tree that carries
//! the hypervisor's own options under firmware.
//!
//! The flow is the one of real Arm boards and FVP: TF-A's BL1 (from the
//! flash), BL2 and BL31 at EL3, then the hypervisor entered at EL2 as BL33,
//! preloaded by QEMU at [`BL33_BASE`], with x0 = the DTB. PSCI (CPU_ON,
//! SYSTEM_OFF) is served by BL31.
//!
//! TF-A is built once per set of inputs and cached under
//! `target/xtask/tf-a/`: the source package lands in `src/` (apt runs with
//! its own sources list, lists and cache there, never the host's apt state),
//! each build in a directory named by a hash of the source version and the
//! whole recipe (`gic3-…`, `gic4-…`), with its `flash.bin`.
//!
//! QEMU refuses `-append` without `-kernel`, so the hypervisor's options go
//! into the DTB as `/chosen/xen,xen-bootargs` (Xen's binding): QEMU dumps
//! its DTB (`-machine dumpdtb=`, the same command line, so the guest-loader
//! module nodes are in it), `fdtput` adds the property, and the run passes
//! the file with `-dtb`.

use crate::Result;
use anyhow::{anyhow, bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where QEMU preloads the hypervisor and TF-A enters it (BL33).
pub const BL33_BASE: u64 = 0x4020_0000;

/// The Debian source package.
const SOURCE_PACKAGE: &str = "arm-trusted-firmware";

/// bl1.bin at 0, fip.bin at this offset of the flash image (TF-A's
/// `plat/qemu` layout: PLAT_QEMU_FIP_BASE is 256 KiB into the flash).
const FIP_OFFSET: usize = 256 << 10;

/// The build environment: Debian's flags for this toolchain (from its
/// rules file), in the environment rather than on the make line so TF-A's
/// own flags are added to them.
pub fn make_env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("CROSS_COMPILE", "aarch64-linux-gnu-"),
        ("CFLAGS", "--param=min-pagesize=0"),
        ("TF_LDFLAGS", "--no-warn-rwx-segments"),
    ]
}

/// The make arguments for `gic` (3, or 4 with the GICv4 extension), without
/// `BUILD_BASE` and `-j`.
pub fn make_args(gic: u8) -> Vec<String> {
    let mut a: Vec<String> = [
        "PLAT=qemu",
        "QEMU_USE_GIC_DRIVER=QEMU_GICV3",
        "ARM_LINUX_KERNEL_AS_BL33=1",
        // Not `git describe` of whatever repository holds the cache.
        "BUILD_STRING=debian",
    ]
    .map(String::from)
    .to_vec();
    a.push(format!("PRELOADED_BL33_BASE={BL33_BASE:#x}"));
    if gic == 4 {
        a.push("GIC_ENABLE_V4_EXTN=1".into());
    }
    a.extend(["all", "fip"].map(String::from));
    a
}

/// FNV-1a, 64 bits: a hash that stays the same across Rust versions.
fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// The name of the build directory for `gic` from the source tree `src`
/// (e.g. `arm-trusted-firmware-2.8.0+dfsg`): changes with every input.
pub fn build_key(src: &str, gic: u8) -> String {
    let env: Vec<String> = make_env().iter().map(|(k, v)| format!("{k}={v}")).collect();
    let inputs = format!("{src}\n{}\n{}\nflash:{FIP_OFFSET}", env.join(" "), make_args(gic).join(" "));
    format!("gic{gic}-{:016x}", fnv1a(inputs.as_bytes()))
}

/// The flash image: `bl1` at 0 and `fip` at 256 KiB.
pub fn flash_image(bl1: &[u8], fip: &[u8]) -> Result<Vec<u8>> {
    if bl1.len() > FIP_OFFSET {
        bail!("bl1.bin is {} bytes, more than the {FIP_OFFSET} before the FIP", bl1.len());
    }
    let mut f = bl1.to_vec();
    f.resize(FIP_OFFSET, 0);
    f.extend_from_slice(fip);
    Ok(f)
}

/// `target/xtask/tf-a`.
pub fn cache_dir() -> PathBuf {
    crate::out_dir().join("tf-a")
}

/// The tools of the download and the build: the cross compiler and
/// `fdtput` are the project's ([`crate::toolchain::TFA_TOOLS`], fetched
/// when missing); what every Debian development machine has (make, the
/// host compiler for fiptool, OpenSSL's headers, dpkg-source, xz) is
/// checked, and a missing one is named, never installed.
pub fn ensure_tools() -> Result<PathBuf> {
    let needs: [(&str, &str); 4] = [("dpkg-source", "dpkg-dev"), ("make", "make"), ("gcc", "gcc"), ("xz", "xz-utils")];
    let mut missing: Vec<&str> =
        needs.iter().filter(|(cmd, _)| !crate::setup::have(cmd)).map(|(_, pkg)| *pkg).collect();
    // fiptool hashes with OpenSSL.
    if !Path::new("/usr/include/openssl/sha.h").is_file() {
        missing.push("libssl-dev");
    }
    if !missing.is_empty() {
        bail!(
            "building TF-A needs host tools this machine lacks: Debian packages {} (ask whoever administers \
             the machine to install them; the rest of the project runs without them)",
            missing.join(" ")
        );
    }
    crate::toolchain::tfa_tools()
}

/// apt's options for a private state under `dir`, with its own (empty)
/// status file: the host's apt configuration and state are not touched.
fn apt_opts(dir: &Path) -> Vec<String> {
    let mut o = crate::toolchain::apt_opts(dir, Some(&dir.join("status")));
    o.push("-oAcquire::IndexTargets::deb-src::Sources::DefaultEnabled=true".into());
    o
}

fn run_logged(cmd: &mut Command, what: &str, log: &Path) -> Result<()> {
    let f = std::fs::File::create(log).with_context(|| log.display().to_string())?;
    let f2 = f.try_clone()?;
    let st = cmd.stdin(Stdio::null()).stdout(f).stderr(f2).status().with_context(|| what.to_string())?;
    if st.success() {
        return Ok(());
    }
    let out = std::fs::read_to_string(log).unwrap_or_default();
    Err(anyhow!("{what} failed (log {}):\n{}", log.display(), tail(&out, 30)))
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The unpacked source tree (`target/xtask/tf-a/src/arm-trusted-firmware-*`),
/// downloaded with `apt-get source` from Debian bookworm the first time.
fn source_tree(cache: &Path) -> Result<PathBuf> {
    let src = cache.join("src");
    if let Some(t) = find_tree(&src) {
        return Ok(t);
    }
    let apt = cache.join("apt");
    let mirror = crate::toolchain::mirrors().0;
    crate::toolchain::apt_dir(
        &apt,
        &format!("deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {mirror} bookworm main\n"),
    )?;
    std::fs::write(apt.join("status"), "").with_context(|| apt.join("status").display().to_string())?;
    let opts = apt_opts(&apt);
    eprintln!("xtask: downloading Debian's {SOURCE_PACKAGE} source package into {}", src.display());
    let start = std::time::Instant::now();
    run_logged(Command::new("apt-get").args(&opts).args(["-q", "update"]), "apt-get update", &cache.join("apt.log"))?;
    // Unpack into a fresh directory, then rename: an interrupted download
    // leaves no half tree behind.
    let tmp = cache.join(format!("src.tmp{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| tmp.display().to_string())?;
    run_logged(
        Command::new("apt-get").current_dir(&tmp).args(&opts).args(["-q", "source", "--only-source", SOURCE_PACKAGE]),
        "apt-get source",
        &cache.join("source.log"),
    )?;
    let _ = std::fs::remove_dir_all(&src);
    std::fs::rename(&tmp, &src).with_context(|| format!("renaming {} to {}", tmp.display(), src.display()))?;
    eprintln!("xtask: downloaded and unpacked in {:.0} s", start.elapsed().as_secs_f64());
    find_tree(&src).ok_or_else(|| anyhow!("apt-get source left no {SOURCE_PACKAGE}-* directory in {}", src.display()))
}

fn find_tree(src: &Path) -> Option<PathBuf> {
    let prefix = format!("{SOURCE_PACKAGE}-");
    std::fs::read_dir(src).ok()?.filter_map(|e| e.ok()).map(|e| e.path()).find(|p| {
        p.is_dir()
            && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix))
            && p.join("plat").join("qemu").is_dir()
    })
}

/// The flash image (`bl1.bin` + `fip.bin`) for `gic`, built once and
/// cached. Installs the tools and downloads the source when needed.
pub fn tf_a(gic: u8) -> Result<PathBuf> {
    let cache = cache_dir();
    std::fs::create_dir_all(&cache).with_context(|| cache.display().to_string())?;
    // fdtput is needed by every run; a cached image needs no network.
    let tools = ensure_tools()?;
    if let Some(tree) = find_tree(&cache.join("src")) {
        let flash = cache.join(build_key(&tree_name(&tree), gic)).join("flash.bin");
        if flash.is_file() {
            return Ok(flash);
        }
    }
    let tree = source_tree(&cache)?;
    let dir = cache.join(build_key(&tree_name(&tree), gic));
    let flash = dir.join("flash.bin");
    let build = dir.join("build");
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    eprintln!("xtask: building TF-A ({}) for gic-version={gic} in {}", tree_name(&tree), dir.display());
    let start = std::time::Instant::now();
    let jobs = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    run_logged(
        crate::toolchain::apply_env(&mut Command::new("make"), &crate::toolchain::env_for(&tools))
            .current_dir(&tree)
            .envs(make_env())
            .arg(format!("-j{jobs}"))
            .arg(format!("BUILD_BASE={}", build.display()))
            .args(make_args(gic)),
        "make (TF-A)",
        &dir.join("build.log"),
    )?;
    let out = build.join("qemu").join("release");
    let read = |f: &str| std::fs::read(out.join(f)).with_context(|| out.join(f).display().to_string());
    let image = flash_image(&read("bl1.bin")?, &read("fip.bin")?)?;
    let tmp = dir.join("flash.bin.tmp");
    std::fs::write(&tmp, image).with_context(|| tmp.display().to_string())?;
    std::fs::rename(&tmp, &flash).with_context(|| format!("renaming {} to {}", tmp.display(), flash.display()))?;
    eprintln!("xtask: TF-A built in {:.0} s: {}", start.elapsed().as_secs_f64(), flash.display());
    Ok(flash)
}

fn tree_name(tree: &Path) -> String {
    tree.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Turns the direct-boot QEMU arguments of [`crate::run::qemu::command_line`]
/// into the firmware boot: `secure=on`, the flash as `-bios`, the
/// hypervisor preloaded at [`BL33_BASE`] instead of `-kernel`, no `-append`
/// (its text, the hypervisor's options, is returned: it goes into the DTB)
/// and `-dtb`.
pub fn boot_args(args: &[String], flash: &Path, dtb: &Path) -> Result<(Vec<String>, String)> {
    let mut out = Vec::new();
    let (mut hv_args, mut kernel) = (String::new(), false);
    let mut it = args.iter();
    while let Some(x) = it.next() {
        match (x.as_str(), it.clone().next()) {
            ("-machine", Some(m)) if m.starts_with("virt,") => {
                it.next();
                out.push(x.clone());
                out.push(format!("virt,secure=on,{}", &m["virt,".len()..]));
            }
            ("-kernel", Some(hv)) => {
                it.next();
                kernel = true;
                out.push("-device".into());
                out.push(format!("loader,file={},addr={BL33_BASE:#x},force-raw=on", hv.replace(',', ",,")));
            }
            ("-append", Some(a)) => {
                it.next();
                hv_args = a.clone();
            }
            _ => out.push(x.clone()),
        }
    }
    if !kernel {
        bail!("no -kernel (the hypervisor) in the QEMU arguments");
    }
    out.extend(["-bios".into(), flash.display().to_string(), "-dtb".into(), dtb.display().to_string()]);
    Ok((out, hv_args))
}

/// The arguments of the run that dumps QEMU's DTB to `dtb`: the run's own
/// (so memory, CPUs, GIC and the guest-loader module nodes are the same)
/// without its `-dtb`, plus `-machine dumpdtb=`.
pub fn dump_args(run_args: &[String], dtb: &Path) -> Vec<String> {
    let mut a = Vec::new();
    let mut it = run_args.iter();
    while let Some(x) = it.next() {
        if x == "-dtb" {
            it.next();
            continue;
        }
        a.push(x.clone());
    }
    a.push("-machine".into());
    a.push(format!("dumpdtb={}", dtb.display()));
    a
}

/// Writes the DTB that `run_args` pass with `-dtb`: QEMU's own for the same
/// machine, with `/chosen/xen,xen-bootargs` = `hv_args`.
pub fn write_dtb(run_args: &[String], dtb: &Path, hv_args: &str) -> Result<()> {
    if let Some(d) = dtb.parent() {
        std::fs::create_dir_all(d).with_context(|| d.display().to_string())?;
    }
    let qemu = crate::toolchain::qemu()?;
    let out = qemu
        .command()
        .args(dump_args(run_args, dtb))
        .stdin(Stdio::null())
        .output()
        .with_context(|| qemu.bin.display().to_string())?;
    if !out.status.success() || !dtb.is_file() {
        bail!("QEMU did not dump its DTB: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let tools = crate::toolchain::tfa_tools()?;
    let out = crate::toolchain::apply_env(
        &mut Command::new(tools.join("usr/bin/fdtput")),
        &crate::toolchain::env_for(&tools),
    )
    .arg("-t")
    .arg("s")
    .arg(dtb)
    .args(["/chosen", "xen,xen-bootargs", hv_args])
    .output()
    .context("fdtput")?;
    if !out.status.success() {
        bail!("fdtput: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recipe_is_debians_with_the_bl33_address_and_the_gic_extension() {
        let a = make_args(3).join(" ");
        assert!(a.starts_with("PLAT=qemu QEMU_USE_GIC_DRIVER=QEMU_GICV3 ARM_LINUX_KERNEL_AS_BL33=1"), "{a}");
        assert!(a.contains("PRELOADED_BL33_BASE=0x40200000"), "{a}");
        assert!(a.ends_with("all fip"), "{a}");
        assert!(!a.contains("GIC_ENABLE_V4_EXTN"), "{a}");
        assert!(make_args(4).contains(&"GIC_ENABLE_V4_EXTN=1".to_string()));
        assert!(make_env().contains(&("CFLAGS", "--param=min-pagesize=0")));
        // Each input gets its own cache directory.
        let k3 = build_key("arm-trusted-firmware-2.8.0+dfsg", 3);
        assert!(k3.starts_with("gic3-"), "{k3}");
        assert_eq!(k3, build_key("arm-trusted-firmware-2.8.0+dfsg", 3));
        assert_ne!(k3, build_key("arm-trusted-firmware-2.9.0+dfsg", 3));
        assert!(build_key("arm-trusted-firmware-2.8.0+dfsg", 4).starts_with("gic4-"));
    }

    #[test]
    fn the_flash_has_the_fip_at_256k() {
        let f = flash_image(&[1, 2, 3], &[9, 8]).unwrap();
        assert_eq!(f.len(), (256 << 10) + 2);
        assert_eq!(&f[..4], &[1, 2, 3, 0]);
        assert_eq!(&f[256 << 10..], &[9, 8]);
        assert!(flash_image(&vec![0; (256 << 10) + 1], &[]).is_err());
    }

    #[test]
    fn the_firmware_boot_preloads_the_hypervisor_and_moves_its_options_to_the_dtb() {
        let o = crate::run::qemu::RunOptions { pcpus: 2, vcpus: 2, gic: 4, ..Default::default() };
        let direct = crate::run::qemu::command_line(Path::new("/t/hv.bin"), Path::new("/nonexistent/Image"), None, &o);
        let (a, hv) = boot_args(&direct, Path::new("/c/flash.bin"), Path::new("/o/hv.dtb")).unwrap();
        assert_eq!(hv, "dom0_mem=1024M dom0_max_vcpus=2");
        let s = a.join(" ");
        assert!(s.contains("-machine virt,secure=on,virtualization=on,gic-version=4"), "{s}");
        assert!(s.contains("-device loader,file=/t/hv.bin,addr=0x40200000,force-raw=on"), "{s}");
        assert!(s.ends_with("-bios /c/flash.bin -dtb /o/hv.dtb"), "{s}");
        assert!(!s.contains("-kernel") && !s.contains("-append"), "{s}");
        assert!(s.contains("guest-loader,addr=0x50000000,kernel=/nonexistent/Image"), "{s}");
        assert!(boot_args(&a, Path::new("f"), Path::new("d")).is_err());
    }

    #[test]
    fn the_dtb_dump_replaces_dtb_with_dumpdtb() {
        let run: Vec<String> =
            ["-machine", "virt,secure=on", "-dtb", "/x/hv.dtb", "-smp", "2"].map(String::from).to_vec();
        let d = dump_args(&run, Path::new("/x/q.dtb"));
        assert_eq!(d, ["-machine", "virt,secure=on", "-smp", "2", "-machine", "dumpdtb=/x/q.dtb"]);
    }
}
