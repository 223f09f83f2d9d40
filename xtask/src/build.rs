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
/// The image relocates itself with its .rela.dyn (entry.rs), which handles
/// only R_AARCH64_RELATIVE entries that patch data inside the image: any
/// other dynamic relocation, or one that patches code, is refused here.
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
    // (vaddr, file offset, file size, executable) of each PT_LOAD.
    let mut loads = Vec::new();
    let mut dynamic = None;
    for i in 0..phnum {
        let p = phoff + i * phentsize;
        if p + 56 > elf.len() {
            return Err("truncated program headers".into());
        }
        let (off, vaddr, paddr, filesz) =
            (u64_at(p + 8) as usize, u64_at(p + 16), u64_at(p + 24), u64_at(p + 32) as usize);
        if off.checked_add(filesz).is_none_or(|e| e > elf.len()) {
            return Err("a segment lies outside the file".into());
        }
        match u32_at(p) {
            1 => loads.push((vaddr, off, filesz, u32_at(p + 4) & 1 != 0)),
            2 => dynamic = Some((off, filesz)),
            _ => continue,
        }
        if u32_at(p) == 1 && filesz > 0 {
            segs.push((paddr, &elf[off..off + filesz]));
        }
    }
    if let Some((off, size)) = dynamic {
        check_relocations(elf, &elf[off..off + size], &loads)?;
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

/// R_AARCH64_RELATIVE, the one relocation type the entry code applies.
const R_AARCH64_RELATIVE: u64 = 1027;

/// Checks the image's dynamic relocations (see [`elf_to_flat`]).
fn check_relocations(elf: &[u8], dynamic: &[u8], loads: &[(u64, usize, usize, bool)]) -> Result<()> {
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    // The file offset of `n` bytes at `vaddr`, and whether they are code.
    let find = |vaddr: u64, n: u64| {
        loads.iter().find_map(|&(v, off, filesz, exec)| {
            (vaddr >= v && vaddr + n <= v + filesz as u64).then(|| (off + (vaddr - v) as usize, exec))
        })
    };
    let (mut rela, mut relasz, mut relaent) = (None, 0, 24);
    for e in dynamic.chunks_exact(16) {
        match u64_at(e, 0) {
            0 => break,
            7 => rela = Some(u64_at(e, 8)),
            8 => relasz = u64_at(e, 8),
            9 => relaent = u64_at(e, 8),
            // DT_REL, DT_JMPREL, DT_RELR: nothing applies them. (DT_TEXTREL
            // is expected: `-z notext` lets .rodata be patched.)
            17 | 23 | 36 => return Err(format!("unsupported dynamic tag {}", u64_at(e, 0))),
            _ => {}
        }
    }
    let Some(rela) = rela else { return Ok(()) };
    if relaent != 24 {
        return Err(format!("unexpected RELA entry size {relaent}"));
    }
    let (off, exec) = find(rela, relasz).ok_or("the relocation table is not in the image")?;
    if exec {
        return Err("the relocation table is in the code segment".into());
    }
    for r in elf[off..off + relasz as usize].chunks_exact(24) {
        let (place, info) = (u64_at(r, 0), u64_at(r, 8));
        if info != R_AARCH64_RELATIVE {
            return Err(format!("relocation at {place:#x}: type {info:#x} (only R_AARCH64_RELATIVE is applied)"));
        }
        match find(place, 8) {
            None => return Err(format!("relocation at {place:#x} outside the image's loaded data")),
            Some((_, true)) => return Err(format!("relocation at {place:#x} patches code")),
            Some(_) if place % 8 != 0 => return Err(format!("relocation at {place:#x} is misaligned")),
            Some(_) => {}
        }
    }
    Ok(())
}
