//! Builds the hypervisor for the bare-metal target and writes the flat
//! binary (arm64 Image layout) that QEMU's `-kernel` loads.

use crate::{root, Result};
use std::path::PathBuf;
use std::process::Command;

/// Builds `hypervisor` for `platform` and returns the flat image's path.
pub fn hypervisor(platform: &str) -> Result<PathBuf> {
    crate::setup::ensure_target()?;
    let target_dir = root().join("target").join("hv");
    let st = Command::new(env!("CARGO"))
        .current_dir(root())
        .env("HV_PLATFORM", platform)
        .env("CARGO_TARGET_DIR", &target_dir)
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "hypervisor",
            "--bin",
            "hypervisor",
            "--target",
            crate::setup::TARGET,
        ])
        .status()
        .map_err(|e| format!("cargo: {e}"))?;
    if !st.success() {
        return Err("building the hypervisor failed".into());
    }
    let elf = target_dir.join(crate::setup::TARGET).join("release").join("hypervisor");
    let bin = crate::out_dir().join(format!("hypervisor-{platform}.bin"));
    std::fs::create_dir_all(crate::out_dir()).map_err(|e| e.to_string())?;
    let data = std::fs::read(&elf).map_err(|e| format!("{}: {e}", elf.display()))?;
    let flat = elf_to_flat(&data)?;
    std::fs::write(&bin, flat).map_err(|e| e.to_string())?;
    Ok(bin)
}

/// Lays out the ELF's PT_LOAD segments (file contents only; BSS is zeroed
/// by the entry code) as one flat image starting at the lowest address.
pub fn elf_to_flat(elf: &[u8]) -> Result<Vec<u8>> {
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    if elf.len() < 64 || &elf[0..4] != b"\x7fELF" || elf[4] != 2 || elf[5] != 1 {
        return Err("not a little-endian ELF64 file".into());
    }
    let phoff = u64_at(0x20) as usize;
    let phentsize = u16_at(0x36) as usize;
    let phnum = u16_at(0x38) as usize;
    let mut segs = Vec::new();
    for i in 0..phnum {
        let p = phoff + i * phentsize;
        if p + 56 > elf.len() {
            return Err("truncated program headers".into());
        }
        if u32_at(p) != 1 {
            continue; // PT_LOAD only
        }
        let (off, paddr, filesz) = (u64_at(p + 8) as usize, u64_at(p + 24), u64_at(p + 32) as usize);
        if filesz > 0 {
            segs.push((paddr, &elf[off..off + filesz]));
        }
    }
    let base = segs.iter().map(|s| s.0).min().ok_or("no loadable segments")?;
    let end = segs.iter().map(|s| s.0 + s.1.len() as u64).max().unwrap();
    let mut out = vec![0u8; (end - base) as usize];
    for (addr, bytes) in segs {
        let o = (addr - base) as usize;
        out[o..o + bytes.len()].copy_from_slice(bytes);
    }
    if out.len() < 64 || &out[0x38..0x3c] != b"ARM\x64" {
        return Err("the image lacks the arm64 Image header".into());
    }
    Ok(out)
}
