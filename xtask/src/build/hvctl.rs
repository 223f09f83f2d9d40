//! Dom0's control tool `hvctl` (guest-images/hvctl): built static for the
//! guest ([`GUEST_TARGET`](crate::setup::GUEST_TARGET), linked by rust-lld
//! per .cargo/config.toml), packed as `/usr/bin/hvctl` in a cpio archive,
//! and appended to the guest image's initramfs: the default Dom0 initrd of
//! `cargo xtask run` and the tests.

use super::cpio;
use crate::{root, Result};
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where xtask builds hvctl: its own target directory, so that a build
/// from a running `cargo test` or `cargo run` waits on no lock.
fn target_dir() -> PathBuf {
    root().join("target").join("hvctl")
}

/// Builds hvctl (release, static aarch64) and returns the binary's path.
pub fn build() -> Result<PathBuf> {
    let target = crate::setup::GUEST_TARGET;
    crate::setup::ensure_target(target)?;
    // The cargo running xtask (`cargo xtask`, `cargo test`), else the one
    // xtask was built with.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let st = Command::new(cargo)
        .current_dir(root())
        .env("CARGO_TARGET_DIR", target_dir())
        .args(["build", "--quiet", "--release", "-p", "hvctl", "--target", target])
        .status()
        .context("cargo")?;
    if !st.success() {
        bail!("building hvctl for {target} failed");
    }
    Ok(target_dir().join(target).join("release").join("hvctl"))
}

/// The archive holding `usr/bin/hvctl` (and its directories).
pub fn archive(binary: &[u8]) -> Vec<u8> {
    let dir = |name: &str| cpio::Entry { name: name.into(), mode: cpio::DIR_755, data: Vec::new() };
    cpio::write(&[
        dir("usr"),
        dir("usr/bin"),
        cpio::Entry { name: "usr/bin/hvctl".into(), mode: cpio::FILE_755, data: binary.to_vec() },
    ])
}

/// `base` followed by `extra` (Linux unpacks both): `base` is padded with
/// zeros to 4 bytes first, where the next archive must start.
pub fn concat(base: &[u8], extra: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(base.len() + extra.len() + 4);
    out.extend_from_slice(base);
    out.resize(out.len().next_multiple_of(4), 0);
    out.extend_from_slice(extra);
    out
}

fn modified(p: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Whether `out` exists and is newer than each of `inputs`.
fn fresh(out: &Path, inputs: &[&Path]) -> bool {
    let Some(t) = modified(out) else { return false };
    inputs.iter().all(|i| modified(i).is_some_and(|m| m <= t))
}

/// The initramfs `base` with hvctl appended, written to
/// target/xtask/initramfs-hvctl-`tag`.cpio (rewritten only when `base` or
/// the binary changed; hvctl.cpio beside it).
pub fn initrd_with_hvctl(base: &Path, tag: &str) -> Result<PathBuf> {
    let bin = build()?;
    let dir = crate::out_dir();
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let packed = dir.join("hvctl.cpio");
    if !fresh(&packed, &[&bin]) {
        let data = std::fs::read(&bin).with_context(|| bin.display().to_string())?;
        write_whole(&packed, &archive(&data))?;
    }
    let out = dir.join(format!("initramfs-hvctl-{tag}.cpio"));
    if !fresh(&out, &[base, &packed]) {
        let b = std::fs::read(base).with_context(|| base.display().to_string())?;
        let extra = std::fs::read(&packed).with_context(|| packed.display().to_string())?;
        write_whole(&out, &concat(&b, &extra))?;
    }
    Ok(out)
}

/// The example xl.cfg put in Dom0's initrd with the DomU's files
/// ([`initrd_with_domu_files`]): `hvctl create /etc/hvctl/domu.cfg`.
pub const DOMU_CFG: &str = "\
# A DomU from the files in Dom0's initramfs (cargo xtask run --domu-pool).
# Xen's xl.cfg subset hvctl reads: docs/hvctl.md.
name = \"domu\"
kernel = \"/boot/domu/Image\"
ramdisk = \"/boot/domu/initrd\"
extra = \"console=ttyAMA0\"
memory = 128
vcpus = 1
disk_size = 16
";

/// `dom0_initrd` with a DomU's kernel and initrd at `/boot/domu/Image` and
/// `/boot/domu/initrd` and [`DOMU_CFG`] at `/etc/hvctl/domu.cfg`, for
/// `hvctl create`; written to target/xtask/initramfs-domu-`tag`.cpio when
/// any input changed.
pub fn initrd_with_domu_files(dom0_initrd: &Path, kernel: &Path, domu_initrd: &Path, tag: &str) -> Result<PathBuf> {
    let out = crate::out_dir().join(format!("initramfs-domu-{tag}.cpio"));
    if fresh(&out, &[dom0_initrd, kernel, domu_initrd]) {
        return Ok(out);
    }
    let read = |p: &Path| std::fs::read(p).with_context(|| p.display().to_string());
    let dir = |name: &str| cpio::Entry { name: name.into(), mode: cpio::DIR_755, data: Vec::new() };
    let file = |name: &str, data: Vec<u8>| cpio::Entry { name: name.into(), mode: cpio::FILE_644, data };
    let extra = cpio::write(&[
        dir("boot"),
        dir("boot/domu"),
        file("boot/domu/Image", read(kernel)?),
        file("boot/domu/initrd", read(domu_initrd)?),
        dir("etc"),
        dir("etc/hvctl"),
        file("etc/hvctl/domu.cfg", DOMU_CFG.as_bytes().to_vec()),
    ]);
    write_whole(&out, &concat(&read(dom0_initrd)?, &extra))?;
    Ok(out)
}

/// `base` with `script` at `/etc/NAME.sh` (mode 755), written to
/// target/xtask/initramfs-`name`.cpio: a guest script too long for
/// `guestcmd=` (the kernel command line holds 2048 bytes), run with
/// `--cmd 'sh /etc/NAME.sh'`. Rewritten every call (the script is cheap
/// to compare, the file to write).
pub fn initrd_with_script(base: &Path, name: &str, script: &str) -> Result<PathBuf> {
    let out = crate::out_dir().join(format!("initramfs-{name}.cpio"));
    let b = std::fs::read(base).with_context(|| base.display().to_string())?;
    let extra = cpio::write(&[
        cpio::Entry { name: "etc".into(), mode: cpio::DIR_755, data: Vec::new() },
        cpio::Entry { name: format!("etc/{name}.sh"), mode: cpio::FILE_755, data: script.as_bytes().to_vec() },
    ]);
    write_whole(&out, &concat(&b, &extra))?;
    Ok(out)
}

/// Writes `data` aside and renames it to `path`: a reader meanwhile (a
/// parallel test, another run) sees the old or the new file, never half
/// of one.
pub(crate) fn write_whole(path: &Path, data: &[u8]) -> Result<()> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.{n}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, data).with_context(|| tmp.display().to_string())?;
    std::fs::rename(&tmp, path).with_context(|| path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_holds_usr_bin_hvctl_after_the_base() {
        let a = archive(b"\x7fELF...");
        let e = cpio::read(&a).unwrap();
        let names: Vec<(&str, u32)> = e.iter().map(|e| (e.name.as_str(), e.mode)).collect();
        assert_eq!(names, [("usr", 0o040755), ("usr/bin", 0o040755), ("usr/bin/hvctl", 0o100755)]);
        assert_eq!(e[2].data, b"\x7fELF...");
        // A base whose length is not a multiple of 4 is padded.
        let base = cpio::write(&[cpio::Entry { name: "init".into(), mode: cpio::FILE_755, data: vec![1] }]);
        let odd = &base[..base.len() - 2];
        let both = concat(odd, &a);
        assert_eq!(both.len(), odd.len().next_multiple_of(4) + a.len());
        assert_eq!(cpio::read(&both[odd.len().next_multiple_of(4)..]).unwrap(), e);
        assert_eq!(cpio::read(&both).unwrap()[0].name, "init");
    }

    #[test]
    fn freshness_follows_the_inputs() {
        let dir = std::env::temp_dir().join(format!("xtask-hvctl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (input, out) = (dir.join("in"), dir.join("out"));
        std::fs::write(&input, b"a").unwrap();
        assert!(!fresh(&out, &[&input]), "missing output");
        std::fs::write(&out, b"b").unwrap();
        assert!(fresh(&out, &[&input]));
        let later = modified(&out).unwrap() + std::time::Duration::from_secs(5);
        std::fs::File::options().write(true).open(&input).unwrap().set_modified(later).unwrap();
        assert!(!fresh(&out, &[&input]), "a newer input");
        assert!(!fresh(&out, &[&dir.join("none")]), "a missing input");
        write_whole(&out, b"new").unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "no temporary file left");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
