//! Builds the hypervisor for the bare-metal target and writes the flat
//! binary (arm64 Image layout) that QEMU's `-kernel` loads; the conformance
//! guest, flat and as an ELF kernel.
//!
//! - [`image`]: the guest kernel + initramfs (guest-images/build.sh)
//! - [`hvctl`]: Dom0's control tool, built static for the guest, and the
//!   initramfs with it
//! - [`cpio`]: the newc archive writer and reader

pub mod cpio;
pub mod hvctl;
pub mod image;

use crate::{root, Result};
use anyhow::{anyhow, bail, Context};
use std::path::PathBuf;
use std::process::Command;

/// Builds `hypervisor` for `platform` and returns the flat image's path.
pub fn hypervisor(platform: &str) -> Result<PathBuf> {
    crate::setup::ensure_target(crate::setup::TARGET)?;
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
        .context("cargo")?;
    if !st.success() {
        bail!("building the hypervisor failed");
    }
    let elf = target_dir.join(crate::setup::TARGET).join("release").join("hypervisor");
    let bin = crate::out_dir().join(format!("hypervisor-{platform}.bin"));
    std::fs::create_dir_all(crate::out_dir()).with_context(|| crate::out_dir().display().to_string())?;
    let data = std::fs::read(&elf).with_context(|| elf.display().to_string())?;
    let flat = pe_pad(elf_to_flat(&data)?)?;
    std::fs::write(&bin, flat).with_context(|| bin.display().to_string())?;
    Ok(bin)
}

/// Builds the conformance guest (tests/conformance, an EL1 kernel with an
/// arm64 Image header) and returns its flat image's path.
pub fn conformance() -> Result<PathBuf> {
    let elf = cargo_build_conformance(&root().join("target").join("hv"), None)?;
    let bin = crate::out_dir().join("conformance.bin");
    std::fs::create_dir_all(crate::out_dir()).with_context(|| crate::out_dir().display().to_string())?;
    let data = std::fs::read(&elf).with_context(|| elf.display().to_string())?;
    std::fs::write(&bin, elf_to_flat(&data)?).with_context(|| bin.display().to_string())?;
    Ok(bin)
}

/// Builds the conformance guest linked as a fixed-address executable at
/// `base` (ET_EXEC, not PIE: `tests/conformance/build.rs` with
/// `CONFORMANCE_LINK_BASE`) and returns the ELF's path: the kernel the
/// hypervisor loads by its program headers. Built in its own target
/// directory per base, so the Image build is not relinked. Checked with the
/// hypervisor's own reader (`boot::image::read_kernel`): loaded from
/// `base`, entered there.
pub fn conformance_elf(base: u64) -> Result<PathBuf> {
    let elf = cargo_build_conformance(&root().join("target").join(format!("hv-conformance-{base:x}")), Some(base))?;
    let data = std::fs::read(&elf).with_context(|| elf.display().to_string())?;
    match hypervisor::boot::image::read_kernel(&data, None) {
        Ok(hypervisor::boot::image::KernelLoad::Fixed(f))
            if f.entry == base && f.pieces.iter().all(|p| p.at.base >= base) => {}
        other => bail!("{}: not an ELF kernel at {base:#x}: {other:x?}", elf.display()),
    }
    let out = crate::out_dir().join(format!("conformance-{base:x}.elf"));
    std::fs::create_dir_all(crate::out_dir()).with_context(|| crate::out_dir().display().to_string())?;
    std::fs::copy(&elf, &out).with_context(|| format!("copying {} to {}", elf.display(), out.display()))?;
    Ok(out)
}

/// Builds the conformance guest in `target_dir` (release, the bare-metal
/// target), linked position-independent or, with `link_base`, as a
/// fixed-address executable there; returns the ELF's path.
fn cargo_build_conformance(target_dir: &std::path::Path, link_base: Option<u64>) -> Result<PathBuf> {
    crate::setup::ensure_target(crate::setup::TARGET)?;
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(root()).env("CARGO_TARGET_DIR", target_dir);
    if let Some(base) = link_base {
        cmd.env("CONFORMANCE_LINK_BASE", format!("{base:#x}"));
    }
    let st = cmd
        .args(["build", "--quiet", "--release", "-p", "conformance", "--target", crate::setup::TARGET])
        .status()
        .context("cargo")?;
    if !st.success() {
        bail!("building the conformance guest failed");
    }
    Ok(target_dir.join(crate::setup::TARGET).join("release").join("conformance"))
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
        bail!("not a little-endian ELF64 file");
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
            bail!("truncated program headers");
        }
        let (off, vaddr, paddr, filesz) =
            (u64_at(p + 8) as usize, u64_at(p + 16), u64_at(p + 24), u64_at(p + 32) as usize);
        if off.checked_add(filesz).is_none_or(|e| e > elf.len()) {
            bail!("a segment lies outside the file");
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
    let base = segs.iter().map(|s| s.0).min().context("no loadable segments")?;
    let end = segs.iter().map(|s| s.0 + s.1.len() as u64).max().unwrap();
    let mut out = vec![0u8; (end - base) as usize];
    for (addr, bytes) in segs {
        let o = (addr - base) as usize;
        out[o..o + bytes.len()].copy_from_slice(bytes);
    }
    if out.len() < 64 || &out[0x38..0x3c] != b"ARM\x64" {
        bail!("the image lacks the arm64 Image header");
    }
    Ok(out)
}

/// The image's PE/COFF header (written by hypervisor/src/arch/aarch64/entry.rs
/// so EDK2 starts the same file as an EFI application): checks what a PE
/// loader relies on and pads the flat image with zeros up to the end of the
/// last section's file data (the sections' raw data ends where BSS starts,
/// after the ELF's last file byte). The padding lies inside the arm64
/// header's `image_size`, so other loaders see no difference.
pub fn pe_pad(mut flat: Vec<u8>) -> Result<Vec<u8>> {
    let u16_at = |b: &[u8], o: usize| b.get(o..o + 2).map(|s| u16::from_le_bytes(s.try_into().unwrap()));
    let u32_at = |b: &[u8], o: usize| b.get(o..o + 4).map(|s| u32::from_le_bytes(s.try_into().unwrap()));
    let bad = |what: &str| anyhow!("PE/COFF header: {what}");
    if flat.get(0..2) != Some(b"MZ") {
        return Err(bad("no MZ signature at offset 0"));
    }
    let pe = u32_at(&flat, 0x3c).ok_or_else(|| bad("truncated"))? as usize;
    if flat.get(pe..pe + 4) != Some(b"PE\0\0") || u16_at(&flat, pe + 4) != Some(0xaa64) {
        return Err(bad("no PE signature for AArch64 at the offset in 0x3c"));
    }
    let sections = u16_at(&flat, pe + 6).ok_or_else(|| bad("truncated"))? as usize;
    let opt = pe + 24;
    let opt_size = u16_at(&flat, pe + 20).ok_or_else(|| bad("truncated"))? as usize;
    let field = |o: usize| u32_at(&flat, opt + o).ok_or_else(|| bad("truncated optional header"));
    if u16_at(&flat, opt) != Some(0x20b) || u16_at(&flat, opt + 68) != Some(10) {
        return Err(bad("not a PE32+ EFI application"));
    }
    let (entry, section_align, file_align, image_size, headers) =
        (field(16)?, field(32)?, field(36)?, field(56)?, field(60)?);
    if !section_align.is_power_of_two() || !file_align.is_power_of_two() || file_align > section_align {
        return Err(bad("bad alignments"));
    }
    let mut raw_end = headers as usize;
    let mut entry_in_code = false;
    for i in 0..sections {
        let sh = opt + opt_size + i * 40;
        let f = |o: usize| u32_at(&flat, sh + o).ok_or_else(|| bad("truncated section table"));
        let (vsize, va, raw_size, raw_ptr, flags) = (f(8)?, f(12)?, f(16)?, f(20)?, f(36)?);
        if va % section_align != 0 || raw_size % file_align != 0 || raw_ptr != va || va < headers {
            return Err(bad(&format!("section {i} is not aligned, or its file offset is not its RVA")));
        }
        if raw_size > vsize || va as u64 + vsize as u64 > image_size as u64 {
            return Err(bad(&format!("section {i} does not fit the image")));
        }
        if va as usize != raw_end {
            return Err(bad(&format!("section {i} does not follow the previous one")));
        }
        raw_end = (raw_ptr + raw_size) as usize;
        entry_in_code |= flags & 0x2000_0000 != 0 && (va..va + vsize).contains(&entry);
    }
    if !entry_in_code {
        return Err(bad("the entry point is not in an executable section"));
    }
    if flat.len() > raw_end {
        return Err(bad(&format!("the image has {} bytes beyond the sections' file data", flat.len() - raw_end)));
    }
    flat.resize(raw_end, 0);
    Ok(flat)
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
            17 | 23 | 36 => bail!("unsupported dynamic tag {}", u64_at(e, 0)),
            _ => {}
        }
    }
    let Some(rela) = rela else { return Ok(()) };
    if relaent != 24 {
        bail!("unexpected RELA entry size {relaent}");
    }
    let (off, exec) = find(rela, relasz).context("the relocation table is not in the image")?;
    if exec {
        bail!("the relocation table is in the code segment");
    }
    for r in elf[off..off + relasz as usize].chunks_exact(24) {
        let (place, info) = (u64_at(r, 0), u64_at(r, 8));
        if info != R_AARCH64_RELATIVE {
            bail!("relocation at {place:#x}: type {info:#x} (only R_AARCH64_RELATIVE is applied)");
        }
        match find(place, 8) {
            None => bail!("relocation at {place:#x} outside the image's loaded data"),
            Some((_, true)) => bail!("relocation at {place:#x} patches code"),
            Some(_) if place % 8 != 0 => bail!("relocation at {place:#x} is misaligned"),
            Some(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::pe_pad;

    /// A minimal image: arm64 + PE headers in page 0, .text one page,
    /// .data 0x800 bytes of file data and a 0x2000-byte virtual size.
    fn image() -> Vec<u8> {
        let mut b = vec![0u8; 0x1000 + 0x1000 + 0x700];
        b[0..2].copy_from_slice(b"MZ");
        b[0x3c..0x40].copy_from_slice(&0x40u32.to_le_bytes());
        b[0x40..0x44].copy_from_slice(b"PE\0\0");
        b[0x44..0x46].copy_from_slice(&0xaa64u16.to_le_bytes());
        b[0x46..0x48].copy_from_slice(&2u16.to_le_bytes());
        let opt = 0x40 + 24;
        b[0x40 + 20..0x40 + 22].copy_from_slice(&160u16.to_le_bytes());
        let w32 = |b: &mut Vec<u8>, o: usize, v: u32| b[o..o + 4].copy_from_slice(&v.to_le_bytes());
        b[opt..opt + 2].copy_from_slice(&0x20bu16.to_le_bytes());
        b[opt + 68..opt + 70].copy_from_slice(&10u16.to_le_bytes());
        for (o, v) in [(16, 0x1000), (32, 0x1000), (36, 0x200), (56, 0x4000), (60, 0x1000)] {
            w32(&mut b, opt + o, v);
        }
        let sh = opt + 160;
        for (i, (vsize, va, raw, flags)) in
            [(0x1000, 0x1000, 0x1000, 0x6000_0020u32), (0x2000, 0x2000, 0x800, 0xc000_0040)].into_iter().enumerate()
        {
            let s = sh + i * 40;
            for (o, v) in [(8, vsize), (12, va), (16, raw), (20, va), (36, flags)] {
                w32(&mut b, s + o, v);
            }
        }
        b
    }

    #[test]
    fn pads_to_the_last_sections_file_data() {
        let out = pe_pad(image()).unwrap();
        assert_eq!(out.len(), 0x2800);
        assert!(out[0x2700..].iter().all(|&b| b == 0));
    }

    #[test]
    fn refuses_broken_headers() {
        let mut b = image();
        b[0] = b'X';
        assert!(pe_pad(b).unwrap_err().to_string().contains("MZ"));
        let mut b = image();
        b.resize(0x3000, 1);
        assert!(pe_pad(b).unwrap_err().to_string().contains("beyond"));
        let mut b = image();
        b[0x58 + 16..0x58 + 20].copy_from_slice(&0x2100u32.to_le_bytes());
        assert!(pe_pad(b).unwrap_err().to_string().contains("entry point"));
        let mut b = image();
        b[0x58 + 160 + 40 + 16..0x58 + 160 + 40 + 20].copy_from_slice(&0x3000u32.to_le_bytes());
        assert!(pe_pad(b).unwrap_err().to_string().contains("does not fit"));
        let mut b = image();
        b[0x58 + 68] = 3;
        assert!(pe_pad(b).unwrap_err().to_string().contains("EFI application"));
    }
}
