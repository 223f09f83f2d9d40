//! Where QEMU loads the hypervisor and how it enters it (`--hv-addr`,
//! `--hv-entry`).
//!
//! The image is position-independent (entry.rs), so it can be loaded on
//! any 2 MiB boundary of RAM; these runs check that, and both register
//! conventions firmware uses for a BL33:
//! - [`HvEntry::Linux`]: `-kernel`, x0 = DTB. QEMU loads an arm64 Image at
//!   RAM base + the header's `text_offset` (RAM base + 2 MiB when it is 0,
//!   QEMU 7.2's hw/arm/boot.c), so another address is a copy of the image
//!   with `text_offset` set.
//! - [`HvEntry::TfaMpidr`]: TF-A's default BL33 hand-off, x0 = MPIDR &
//!   0xffff and x1 = DTB. Without `-kernel` QEMU leaves its DTB at the base
//!   of RAM and starts the CPU wherever a generic `loader` with `cpu-num`
//!   says: a 48-byte stub there sets the registers and branches to the
//!   hypervisor, which another `loader` put at its address. QEMU takes no
//!   `-append` without `-kernel`, so the hypervisor runs with its default
//!   options.

use crate::Result;
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};

/// QEMU virt's RAM base.
pub const RAM_BASE: u64 = 0x4000_0000;
/// Where `-kernel` puts the image by default (RAM base + 2 MiB).
pub const DEFAULT_ADDR: u64 = RAM_BASE + (2 << 20);
/// Where the TF-A-style stub goes: behind QEMU's DTB (1 MiB at RAM base),
/// below any hypervisor address (which is at least RAM base + 2 MiB).
pub const STUB_ADDR: u64 = RAM_BASE + (1 << 20);
/// The image's alignment (arm64 boot protocol: a 2 MiB-aligned base).
const ALIGN: u64 = 2 << 20;

/// How the hypervisor is entered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum HvEntry {
    /// The Linux arm64 boot protocol (QEMU's -kernel): x0 = DTB
    #[default]
    Linux,
    /// TF-A's default BL33 hand-off: x0 = MPIDR & 0xffff, x1 = DTB (no hypervisor options)
    #[value(name = "tf-a")]
    TfaMpidr,
}

/// Where and how QEMU starts the hypervisor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HvBoot {
    /// The load address; `None` = [`DEFAULT_ADDR`].
    pub addr: Option<u64>,
    pub entry: HvEntry,
}

impl HvBoot {
    pub fn addr(&self) -> u64 {
        self.addr.unwrap_or(DEFAULT_ADDR)
    }

    /// A load address on a 2 MiB boundary of RAM, above QEMU's DTB.
    pub fn check(&self) -> Result<()> {
        let a = self.addr();
        if !a.is_multiple_of(ALIGN) || a < DEFAULT_ADDR {
            bail!("--hv-addr {a:#x}: must be a multiple of 2 MiB, at least {DEFAULT_ADDR:#x}");
        }
        Ok(())
    }
}

/// The file QEMU loads: `built` itself for the default `-kernel` run, else
/// a copy next to it (with `text_offset` set for [`HvEntry::Linux`]); and
/// for [`HvEntry::TfaMpidr`] the stub, written too.
pub fn prepare(built: &Path, boot: HvBoot) -> Result<PathBuf> {
    boot.check()?;
    if boot == HvBoot::default() {
        return Ok(built.to_path_buf());
    }
    let mut image = std::fs::read(built).with_context(|| built.display().to_string())?;
    let tag = match boot.entry {
        HvEntry::Linux => "linux",
        HvEntry::TfaMpidr => "tf-a",
    };
    let path = built.with_extension(format!("{tag}-{:#x}.bin", boot.addr()));
    match boot.entry {
        HvEntry::Linux => set_text_offset(&mut image, boot.addr() - RAM_BASE)?,
        HvEntry::TfaMpidr => write_atomic(&stub_path(&path), &stub(RAM_BASE, boot.addr()))?,
    }
    write_atomic(&path, &image)?;
    Ok(path)
}

fn stub_path(image: &Path) -> PathBuf {
    image.with_extension("stub.bin")
}

/// Writes through a temporary file, so a parallel run never reads half.
fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, data).with_context(|| tmp.display().to_string())?;
    std::fs::rename(&tmp, path).with_context(|| path.display().to_string())
}

/// Sets the arm64 Image header's `text_offset` (bytes 8..16).
pub fn set_text_offset(image: &mut [u8], offset: u64) -> Result<()> {
    if image.len() < 64 || &image[0x38..0x3c] != b"ARM\x64" {
        bail!("the hypervisor image lacks the arm64 Image header");
    }
    image[8..16].copy_from_slice(&offset.to_le_bytes());
    Ok(())
}

/// AArch64 code that enters `entry` the way TF-A's BL2 hands over to a
/// BL33 from the FIP: x0 = MPIDR_EL1 & 0xffff, x1 = `dtb`, x2 = x3 = 0.
pub fn stub(dtb: u64, entry: u64) -> Vec<u8> {
    let code: [u32; 8] = [
        0xd538_00a0, // mrs  x0, mpidr_el1
        0x9240_3c00, // and  x0, x0, #0xffff
        0x5800_00c1, // ldr  x1, 32 (dtb)
        0xd280_0002, // movz x2, #0
        0xd280_0003, // movz x3, #0
        0x5800_00a4, // ldr  x4, 40 (entry)
        0xd61f_0080, // br   x4
        0xd503_201f, // nop
    ];
    let mut out: Vec<u8> = code.iter().flat_map(|w| w.to_le_bytes()).collect();
    out.extend(dtb.to_le_bytes());
    out.extend(entry.to_le_bytes());
    out
}

/// The QEMU arguments that load and start the hypervisor; `hv_args` are
/// its options (`-append`), dropped for [`HvEntry::TfaMpidr`].
pub fn qemu_args(image: &Path, boot: HvBoot, hv_args: &str) -> Vec<String> {
    match boot.entry {
        HvEntry::Linux => vec!["-kernel".into(), image.display().to_string(), "-append".into(), hv_args.into()],
        HvEntry::TfaMpidr => vec![
            "-device".into(),
            format!("loader,file={},addr={:#x},force-raw=on", image.display(), boot.addr()),
            "-device".into(),
            format!("loader,file={},addr={STUB_ADDR:#x},cpu-num=0,force-raw=on", stub_path(image).display()),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stub_literals_sit_where_the_loads_read_them() {
        let s = stub(0x4000_0000, 0x4800_0000);
        assert_eq!(s.len(), 48);
        let word = |i: usize| u32::from_le_bytes(s[i * 4..i * 4 + 4].try_into().unwrap());
        // LDR (literal): imm19 (words from the instruction) at bits 5..24.
        let target = |i: usize| i * 4 + ((word(i) >> 5) & 0x7ffff) as usize * 4;
        assert_eq!(u64::from_le_bytes(s[target(2)..target(2) + 8].try_into().unwrap()), 0x4000_0000);
        assert_eq!(u64::from_le_bytes(s[target(5)..target(5) + 8].try_into().unwrap()), 0x4800_0000);
        assert_eq!((word(2) & 31, word(5) & 31), (1, 4));
    }

    #[test]
    fn addresses_are_checked() {
        let b = |a| HvBoot { addr: Some(a), entry: HvEntry::Linux };
        assert!(b(0x4a00_0000).check().is_ok());
        assert!(b(0x4a10_0000).check().is_err());
        assert!(b(0x4000_0000).check().is_err());
        assert!(HvBoot::default().check().is_ok());
    }

    #[test]
    fn linux_entry_at_another_address_patches_text_offset() {
        let mut img = vec![0u8; 64];
        img[0x38..0x3c].copy_from_slice(b"ARM\x64");
        set_text_offset(&mut img, 0x0a00_0000).unwrap();
        assert_eq!(u64::from_le_bytes(img[8..16].try_into().unwrap()), 0x0a00_0000);
        assert!(set_text_offset(&mut [0u8; 64], 0).is_err());
        let a = qemu_args(Path::new("hv.bin"), HvBoot { addr: Some(0x4a00_0000), entry: HvEntry::TfaMpidr }, "x");
        assert_eq!(a[1], "loader,file=hv.bin,addr=0x4a000000,force-raw=on");
        assert_eq!(a[3], "loader,file=hv.stub.bin,addr=0x40100000,cpu-num=0,force-raw=on");
    }
}
