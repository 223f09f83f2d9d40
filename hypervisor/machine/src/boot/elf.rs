//! ELF64 kernels: which bytes of the module go where in guest-physical
//! memory, and where the guest starts.
//!
//! # Contract
//!
//! An accepted file is ELF64, little-endian, `EM_AARCH64` (183), `ET_EXEC`.
//! Each `PT_LOAD` segment with a non-zero `p_memsz` is loaded at its
//! **physical** address `p_paddr` (Xen's choice too: the guest starts with
//! its MMU off, so the addresses it runs at are physical ones; a kernel
//! linked at a virtual address, like Linux's vmlinux, says where it wants
//! its bytes with `p_paddr`): `p_filesz` bytes from `p_offset` in the file
//! are copied and the rest up to `p_memsz` is zeroed. The entry point is
//! `e_entry` taken through the executable (`PF_X`) segment whose virtual
//! range holds it: `p_paddr + (e_entry - p_vaddr)`, which is `e_entry`
//! itself when `p_vaddr == p_paddr`. x0 holds the DTB, as for an Image.
//!
//! The parser checks what the file alone can tell (its shape, that
//! segments lie in the file and do not overlap each other, the entry);
//! whether the segments lie in the guest's RAM and clear of the DTB and
//! initrd is the layout's question (`boot::plan`, `domain::layout`).
//!
//! # Why not a crate
//!
//! The hypervisor needs the ELF header and the program headers, about 60
//! lines of reading little-endian fields; `goblin` and `xmas-elf` parse far
//! more (sections, symbols, notes) and bring their own error types, which
//! would still need mapping to one boot error per defect. This parser is
//! `no_std`, allocates nothing, and never indexes outside the slice.

use core::fmt;

/// `\x7fELF`.
pub const MAGIC: [u8; 4] = *b"\x7fELF";
/// Length of the ELF64 file header.
pub const EHDR_LEN: usize = 64;
/// Length of one ELF64 program header.
pub const PHDR_LEN: usize = 56;
/// `e_machine` of AArch64.
pub const EM_AARCH64: u16 = 183;
/// `e_type` of an executable.
pub const ET_EXEC: u16 = 2;
/// `p_type` of a loadable segment.
pub const PT_LOAD: u32 = 1;
/// `p_flags` bit: executable.
pub const PF_X: u32 = 1;
/// Most program headers accepted (real kernels have fewer than ten): it
/// bounds the pairwise overlap check.
pub const MAX_PHDRS: usize = 64;

/// Why a module is not a loadable ELF kernel. `Display` is one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElfError {
    /// Shorter than the 64-byte ELF64 header.
    TruncatedHeader { len: u64 },
    /// `EI_CLASS` is not ELFCLASS64 (2).
    NotElf64 { class: u8 },
    /// `EI_DATA` is not ELFDATA2LSB (1).
    NotLittleEndian { data: u8 },
    /// `e_machine` is not EM_AARCH64.
    WrongMachine { machine: u16 },
    /// `e_type` is not ET_EXEC.
    NotExecutable { e_type: u16 },
    /// `e_phentsize` is not 56, or `e_phnum` exceeds [`MAX_PHDRS`].
    BadProgramHeaders { phentsize: u16, phnum: u16 },
    /// The program header table runs past the end of the file.
    TruncatedProgramHeaders { phoff: u64, phnum: u16, len: u64 },
    /// No `PT_LOAD` segment with a non-zero size.
    NoLoadSegment,
    /// Segment `index`'s file bytes run past the end of the file.
    SegmentPastFile { index: usize, offset: u64, filesz: u64, len: u64 },
    /// Segment `index` has `p_filesz > p_memsz`.
    FileSizeAboveMemSize { index: usize, filesz: u64, memsz: u64 },
    /// Segment `index`'s physical range wraps past 2^64.
    SegmentWraps { index: usize, paddr: u64, memsz: u64 },
    /// Segments `a` and `b` share physical bytes.
    SegmentsOverlap { a: usize, b: usize },
    /// `e_entry` lies in no executable loaded segment.
    EntryOutside { entry: u64 },
}

impl fmt::Display for ElfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ElfError::TruncatedHeader { len } => write!(f, "{len} bytes, shorter than the 64-byte ELF64 header"),
            ElfError::NotElf64 { class } => write!(f, "ELF class {class}, not ELFCLASS64 (2)"),
            ElfError::NotLittleEndian { data } => write!(f, "ELF data encoding {data}, not little-endian (1)"),
            ElfError::WrongMachine { machine } => {
                write!(f, "ELF machine {machine}, not AArch64 ({EM_AARCH64})")
            }
            ElfError::NotExecutable { e_type } => write!(f, "ELF type {e_type}, not an executable (ET_EXEC, 2)"),
            ElfError::BadProgramHeaders { phentsize, phnum } => write!(
                f,
                "{phnum} program headers of {phentsize} bytes (want {PHDR_LEN}-byte headers, at most {MAX_PHDRS})"
            ),
            ElfError::TruncatedProgramHeaders { phoff, phnum, len } => {
                write!(f, "{phnum} program headers at offset {phoff:#x} run past the end of the {len}-byte file")
            }
            ElfError::NoLoadSegment => write!(f, "no PT_LOAD segment"),
            ElfError::SegmentPastFile { index, offset, filesz, len } => write!(
                f,
                "segment {index}'s {filesz:#x} file bytes at offset {offset:#x} run past the end of the {len}-byte file"
            ),
            ElfError::FileSizeAboveMemSize { index, filesz, memsz } => {
                write!(f, "segment {index} has p_filesz {filesz:#x} above p_memsz {memsz:#x}")
            }
            ElfError::SegmentWraps { index, paddr, memsz } => {
                write!(f, "segment {index} at {paddr:#x} of {memsz:#x} bytes wraps past the end of the address space")
            }
            ElfError::SegmentsOverlap { a, b } => write!(f, "segments {a} and {b} overlap"),
            ElfError::EntryOutside { entry } => {
                write!(f, "entry point {entry:#x} is in no executable PT_LOAD segment")
            }
        }
    }
}

/// One loadable segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Index among the program headers (for errors).
    pub index: usize,
    /// Where its file bytes start in the module.
    pub offset: u64,
    pub filesz: u64,
    /// Guest-physical load address and size in memory.
    pub paddr: u64,
    pub memsz: u64,
    /// Its virtual address (only used to translate the entry point).
    pub vaddr: u64,
    pub exec: bool,
}

impl Segment {
    fn end(&self) -> u64 {
        self.paddr + self.memsz
    }
}

/// A checked ELF kernel: [`Elf::segments`] and [`Elf::entry`].
#[derive(Clone, Copy, Debug)]
pub struct Elf<'a> {
    file: &'a [u8],
    phoff: usize,
    phnum: usize,
    /// The physical entry point.
    pub entry: u64,
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(v)
}

/// Whether `file` starts with the ELF magic (the format is then ELF, and
/// any defect an [`ElfError`]).
pub fn is_elf(file: &[u8]) -> bool {
    file.starts_with(&MAGIC)
}

/// Program header `i` as a segment, `None` for one that loads nothing
/// (not `PT_LOAD`, or `p_memsz` 0). The table is known to be in the file.
fn phdr(file: &[u8], phoff: usize, i: usize) -> Option<Segment> {
    let p = phoff + i * PHDR_LEN;
    let memsz = u64_at(file, p + 40);
    if u32_at(file, p) != PT_LOAD || memsz == 0 {
        return None;
    }
    Some(Segment {
        index: i,
        offset: u64_at(file, p + 8),
        vaddr: u64_at(file, p + 16),
        paddr: u64_at(file, p + 24),
        filesz: u64_at(file, p + 32),
        memsz,
        exec: u32_at(file, p + 4) & PF_X != 0,
    })
}

impl<'a> Elf<'a> {
    /// Checks `file` (the whole module) as described in the module doc.
    pub fn parse(file: &'a [u8]) -> Result<Self, ElfError> {
        let len = file.len() as u64;
        if file.len() < EHDR_LEN || !is_elf(file) {
            return Err(ElfError::TruncatedHeader { len });
        }
        if file[4] != 2 {
            return Err(ElfError::NotElf64 { class: file[4] });
        }
        if file[5] != 1 {
            return Err(ElfError::NotLittleEndian { data: file[5] });
        }
        let e_type = u16_at(file, 16);
        let machine = u16_at(file, 18);
        if machine != EM_AARCH64 {
            return Err(ElfError::WrongMachine { machine });
        }
        if e_type != ET_EXEC {
            return Err(ElfError::NotExecutable { e_type });
        }
        let entry = u64_at(file, 24);
        let phoff = u64_at(file, 32);
        let (phentsize, phnum) = (u16_at(file, 54), u16_at(file, 56));
        if phnum == 0 {
            return Err(ElfError::NoLoadSegment);
        }
        if usize::from(phentsize) != PHDR_LEN || usize::from(phnum) > MAX_PHDRS {
            return Err(ElfError::BadProgramHeaders { phentsize, phnum });
        }
        let table_end = phoff.checked_add(u64::from(phnum) * PHDR_LEN as u64);
        if table_end.is_none_or(|e| e > len) {
            return Err(ElfError::TruncatedProgramHeaders { phoff, phnum, len });
        }
        let mut elf = Elf { file, phoff: phoff as usize, phnum: usize::from(phnum), entry: 0 };
        let mut any = false;
        for s in elf.segments() {
            any = true;
            if s.offset.checked_add(s.filesz).is_none_or(|e| e > len) {
                return Err(ElfError::SegmentPastFile { index: s.index, offset: s.offset, filesz: s.filesz, len });
            }
            if s.filesz > s.memsz {
                return Err(ElfError::FileSizeAboveMemSize { index: s.index, filesz: s.filesz, memsz: s.memsz });
            }
            if s.paddr.checked_add(s.memsz).is_none() {
                return Err(ElfError::SegmentWraps { index: s.index, paddr: s.paddr, memsz: s.memsz });
            }
        }
        if !any {
            return Err(ElfError::NoLoadSegment);
        }
        for a in elf.segments() {
            if let Some(b) = elf.segments().find(|b| b.index > a.index && a.paddr < b.end() && b.paddr < a.end()) {
                return Err(ElfError::SegmentsOverlap { a: a.index, b: b.index });
            }
        }
        let translated = elf
            .segments()
            .filter(|s| s.exec)
            .find_map(|s| {
                let off = entry.checked_sub(s.vaddr).filter(|&o| o < s.memsz)?;
                Some(s.paddr + off)
            })
            .ok_or(ElfError::EntryOutside { entry })?;
        elf.entry = translated;
        Ok(elf)
    }

    /// The loadable segments, in program-header order.
    pub fn segments(&self) -> impl Iterator<Item = Segment> + '_ {
        (0..self.phnum).filter_map(move |i| phdr(self.file, self.phoff, i))
    }
}
