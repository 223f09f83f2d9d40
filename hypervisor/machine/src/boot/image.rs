//! The guest kernel module's format and what it occupies once loaded.
//!
//! Three formats boot, for Dom0 and DomUs alike (x0 = DTB in each):
//!
//! * **arm64 Image** (Linux `Documentation/arch/arm64/booting.rst`):
//!   relocatable; loaded at the 2 MiB-aligned base of guest RAM, occupying
//!   the header's `image_size`, entered at its first byte.
//! * **ELF64** (`boot::elf`): each `PT_LOAD` segment at its `p_paddr`,
//!   entered at `e_entry` (through its segment).
//! * **Raw binary at a load address** (`dom0_kernel_load_addr=`, a DomU's
//!   `hv,kernel-load-addr`): the file copied as it is to the address
//!   (4 KiB aligned), entered at its first byte. Only the file's bytes are
//!   known to be the kernel's: a raw binary with BSS beyond its file must
//!   be given RAM where the layout does not put the initrd (which goes at
//!   the first 2 MiB boundary after the file, the DTB at the top of RAM).
//!
//! A load address selects the raw format whatever the file holds;
//! otherwise the ELF magic selects ELF and the Image magic an Image, and
//! anything else is refused. Addresses are guest-physical: host-physical
//! for Dom0 (identity-mapped), from `DOMU_RAM_BASE` for a DomU.

use super::elf::{self, Elf, ElfError};
use crate::region::Region;
use alloc::vec::Vec;
use core::fmt;

/// Length of the arm64 Image header.
pub const HEADER_LEN: usize = 64;
/// Alignment a raw binary's load address must have.
pub const RAW_ALIGN: u64 = 4096;

/// Why the kernel module cannot be booted. `Display` is one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelError {
    /// Neither ELF nor Image magic (and no load address was given).
    UnknownFormat,
    /// An arm64 Image defect.
    Image(&'static str),
    /// An ELF defect.
    Elf(ElfError),
    /// A raw binary's load address is not [`RAW_ALIGN`]-aligned.
    RawUnaligned { addr: u64 },
    /// A raw binary's range wraps past 2^64.
    RawWraps { addr: u64, size: u64 },
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            KernelError::UnknownFormat => write!(
                f,
                "the kernel module is neither an arm64 Image (ARM\\x64 at offset 0x38) nor an ELF64 file; \
                 a raw binary needs a load address (dom0_kernel_load_addr=, or hv,kernel-load-addr for a DomU)"
            ),
            KernelError::Image(why) => write!(f, "the kernel module is not an arm64 Image: {why}"),
            KernelError::Elf(e) => write!(f, "the ELF kernel cannot be loaded: {e}"),
            KernelError::RawUnaligned { addr } => {
                write!(f, "the raw kernel's load address {addr:#x} is not {RAW_ALIGN}-byte aligned")
            }
            KernelError::RawWraps { addr, size } => {
                write!(f, "the raw kernel at {addr:#x} of {size:#x} bytes wraps past the end of the address space")
            }
        }
    }
}

impl From<ElfError> for KernelError {
    fn from(e: ElfError) -> Self {
        KernelError::Elf(e)
    }
}

/// `size` bytes of the module from `offset`, copied to `at.base`; the rest
/// of `at` (`at.size >= size`) is zeroed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub offset: u64,
    pub size: u64,
    /// Guest-physical destination.
    pub at: Region,
}

/// A kernel loaded at addresses it chose (ELF, raw binary): its pieces
/// (disjoint, non-empty) and its guest-physical entry point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FixedLoad {
    pub pieces: Vec<Piece>,
    pub entry: u64,
}

impl FixedLoad {
    /// The guest-physical ranges the kernel occupies.
    pub fn ranges(&self) -> impl Iterator<Item = Region> + '_ {
        self.pieces.iter().map(|p| p.at)
    }
}

/// How a kernel module is loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelLoad {
    /// An arm64 Image: at the base of guest RAM, occupying `size` bytes.
    Image { size: u64 },
    /// At fixed guest-physical addresses.
    Fixed(FixedLoad),
}

/// The RAM a kernel Image occupies once loaded: the header's `image_size`
/// (text, data and BSS), or the file length when the header says 0
/// (kernels before 3.17) or less than the file. `header` is the start of the
/// module (at least [`HEADER_LEN`] bytes), `file_len` its length.
pub fn arm64_image_size(header: &[u8], file_len: u64) -> Result<u64, KernelError> {
    if header.len() < HEADER_LEN || file_len < HEADER_LEN as u64 {
        return Err(KernelError::Image("shorter than the 64-byte arm64 Image header"));
    }
    if header[0x38..0x3c] != *b"ARM\x64" {
        return Err(KernelError::Image("no arm64 Image magic (ARM\\x64 at offset 0x38)"));
    }
    let mut size = [0u8; 8];
    size.copy_from_slice(&header[16..24]);
    Ok(u64::from_le_bytes(size).max(file_len))
}

/// Reads the kernel module `file` (all of it): a raw binary at
/// `load_addr` when one is given, else ELF or Image by magic.
pub fn read_kernel(file: &[u8], load_addr: Option<u64>) -> Result<KernelLoad, KernelError> {
    let len = file.len() as u64;
    if let Some(addr) = load_addr {
        if !addr.is_multiple_of(RAW_ALIGN) {
            return Err(KernelError::RawUnaligned { addr });
        }
        if len == 0 || addr.checked_add(len).is_none() {
            return Err(KernelError::RawWraps { addr, size: len });
        }
        let at = Region { base: addr, size: len };
        return Ok(KernelLoad::Fixed(FixedLoad {
            pieces: Vec::from([Piece { offset: 0, size: len, at }]),
            entry: addr,
        }));
    }
    if elf::is_elf(file) {
        let e = Elf::parse(file)?;
        let pieces = e
            .segments()
            .map(|s| Piece { offset: s.offset, size: s.filesz, at: Region { base: s.paddr, size: s.memsz } })
            .collect();
        return Ok(KernelLoad::Fixed(FixedLoad { pieces, entry: e.entry }));
    }
    if file.len() >= HEADER_LEN && file[0x38..0x3c] == *b"ARM\x64" {
        return Ok(KernelLoad::Image { size: arm64_image_size(file, len)? });
    }
    if file.len() < HEADER_LEN {
        return Err(KernelError::Image("shorter than the 64-byte arm64 Image header"));
    }
    Err(KernelError::UnknownFormat)
}
