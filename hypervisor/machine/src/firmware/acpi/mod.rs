//! ACPI: the machine as UEFI firmware describes it (Graviton's path), and
//! the tables Dom0 is given.
//!
//! # Why this shape
//!
//! On a UEFI machine the hypervisor gets an RSDP address (from the EFI
//! configuration table) instead of a DTB. [`Tables::from_rsdp`] follows
//! RSDP → XSDT → each table (and FADT → DSDT), checking every checksum and
//! length, and keeps checked byte slices. The `parse_*` functions in
//! [`tables`] decode the tables the hypervisor needs — MADT (GICD, GICR,
//! GICC, GIC ITS), GTDT, SPCR, MCFG, IORT, FADT — into plain values
//! ([`AcpiMachine`]), and [`AcpiMachine::to_machine`] turns those into the
//! same [`Machine`](crate::dtb::Machine) the DTB path produces. [`dom0`]
//! writes the tables a Dom0 kernel boots with: a new FADT (PSCI over HVC), a
//! MADT with one GICC per vCPU, an STAO hiding the hypervisor's UART, a new
//! XSDT and RSDP; every other host table is passed on by address.
//!
//! The tables are parsed by hand with checked slices rather than with the
//! `acpi` crate: that crate reads tables through raw pointers from an
//! `AcpiHandler` mapping (so host tests would need unsafe fakes), has no
//! GTDT or IORT decoding, and its errors do not say which entry of which
//! table was bad. The tables we need are a few fixed layouts; reading them
//! from `&[u8]` keeps everything safe and testable on captured bytes.
//!
//! # Untrusted input
//!
//! ACPI tables are input. Every read is bounds-checked; a bad checksum, a
//! length that does not fit, an entry that overruns its table, a zero-length
//! entry (which would loop forever), an absurd count or overlapping GIC/ECAM
//! regions is an [`AcpiError`] naming the table and the problem. Entries of
//! unknown types (a newer ACPI revision) are skipped. Nothing here panics on
//! any input (the tests feed truncated and randomly corrupted tables).

pub mod dom0;
mod platform;
pub mod tables;

#[cfg(test)]
mod tests;

use alloc::vec::Vec;
use core::fmt;

pub use platform::AcpiMachine;

/// A table's four-byte signature (`APIC` is the MADT, `FACP` the FADT).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Signature(pub [u8; 4]);

impl Signature {
    pub const RSDP: Signature = Signature(*b"RSD ");
    pub const XSDT: Signature = Signature(*b"XSDT");
    pub const FADT: Signature = Signature(*b"FACP");
    pub const DSDT: Signature = Signature(*b"DSDT");
    pub const MADT: Signature = Signature(*b"APIC");
    pub const GTDT: Signature = Signature(*b"GTDT");
    pub const SPCR: Signature = Signature(*b"SPCR");
    pub const MCFG: Signature = Signature(*b"MCFG");
    pub const IORT: Signature = Signature(*b"IORT");
    pub const STAO: Signature = Signature(*b"STAO");
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for &b in &self.0 {
            let c = if b.is_ascii_graphic() || b == b' ' { b as char } else { '?' };
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// Why the ACPI tables could not be read or written. Each names the table.
#[derive(thiserror::Error, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcpiError {
    /// The bytes at `addr` (wanted as `table`) are not in readable memory.
    #[error("ACPI {table}: {addr:#x} is not readable memory")]
    Unmapped { table: Signature, addr: u64 },
    /// The RSDP's signature or revision is wrong (named).
    #[error("ACPI RSDP: {0}")]
    BadRsdp(&'static str),
    /// A table's header signature is not the one its reference promised.
    #[error("ACPI: expected table {expected}, found {found}")]
    WrongSignature { expected: Signature, found: Signature },
    /// The bytes of `table` do not sum to zero.
    #[error("ACPI {table}: bad checksum")]
    BadChecksum { table: Signature },
    /// `table` is shorter than a field at `offset` of `need` bytes.
    #[error("ACPI {table}: truncated ({need} bytes at offset {offset} do not fit)")]
    Truncated { table: Signature, offset: usize, need: usize },
    /// A table's or entry's length field is impossible (named).
    #[error("ACPI {table}: bad length of {what}")]
    BadLength { table: Signature, what: &'static str },
    /// A field has an impossible value (named), at byte `offset`.
    #[error("ACPI {table}: bad {what} at offset {offset}")]
    BadValue { table: Signature, offset: usize, what: &'static str },
    /// A count of zero where one is required, or more than can be (named).
    #[error("ACPI {table}: impossible number of {what}")]
    BadCount { table: Signature, what: &'static str },
    /// Two regions that must be disjoint overlap (named).
    #[error("ACPI {table}: overlapping {what}")]
    Overlap { table: Signature, what: &'static str },
    /// A table the hypervisor needs is absent.
    #[error("ACPI: no {0} table")]
    Missing(Signature),
    /// Valid, but something we do not handle (named).
    #[error("ACPI {table}: unsupported {what}")]
    Unsupported { table: Signature, what: &'static str },
    /// A table we write would exceed its length field.
    #[error("ACPI {0}: table too large to write")]
    TooLarge(Signature),
}

/// Read access to physical memory holding the firmware's tables.
///
/// At EL2 this is the identity-mapped ACPI reclaim memory of the EFI memory
/// map; in host tests a captured memory image ([`MemImage`]).
pub trait PhysMem {
    /// The `len` bytes at physical address `addr`, or `None` when any of
    /// them is outside the readable memory.
    fn read(&self, addr: u64, len: usize) -> Option<&[u8]>;
}

/// A contiguous piece of physical memory: `bytes` are at `base`.
#[derive(Clone, Copy, Debug)]
pub struct MemImage<'a> {
    pub base: u64,
    pub bytes: &'a [u8],
}

impl PhysMem for MemImage<'_> {
    fn read(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let start = usize::try_from(addr.checked_sub(self.base)?).ok()?;
        self.bytes.get(start..start.checked_add(len)?)
    }
}

/// Several disjoint pieces (e.g. the host's tables and Dom0's new ones).
impl PhysMem for [MemImage<'_>] {
    fn read(&self, addr: u64, len: usize) -> Option<&[u8]> {
        self.iter().find_map(|m| m.read(addr, len))
    }
}

/// Size of the standard table header (signature … creator revision).
pub const HEADER_LEN: usize = 36;

/// Sum of all bytes modulo 256; a valid table (or RSDP part) sums to 0.
pub fn checksum(bytes: &[u8]) -> u8 {
    bytes.iter().fold(0u8, |a, &b| a.wrapping_add(b))
}

/// Checked little-endian reads from one table, errors naming it.
#[derive(Clone, Copy)]
pub(crate) struct Reader<'a> {
    pub sig: Signature,
    pub data: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(sig: Signature, data: &'a [u8]) -> Self {
        Reader { sig, data }
    }

    pub fn bytes(&self, offset: usize, len: usize) -> Result<&'a [u8], AcpiError> {
        offset.checked_add(len).and_then(|end| self.data.get(offset..end)).ok_or(AcpiError::Truncated {
            table: self.sig,
            offset,
            need: len,
        })
    }

    fn array<const N: usize>(&self, offset: usize) -> Result<[u8; N], AcpiError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(offset, N)?);
        Ok(a)
    }

    pub fn u8(&self, offset: usize) -> Result<u8, AcpiError> {
        Ok(self.array::<1>(offset)?[0])
    }

    pub fn u16(&self, offset: usize) -> Result<u16, AcpiError> {
        Ok(u16::from_le_bytes(self.array(offset)?))
    }

    pub fn u32(&self, offset: usize) -> Result<u32, AcpiError> {
        Ok(u32::from_le_bytes(self.array(offset)?))
    }

    pub fn u64(&self, offset: usize) -> Result<u64, AcpiError> {
        Ok(u64::from_le_bytes(self.array(offset)?))
    }

    /// A reader over a whole table whose header `Length` must be exactly
    /// `data.len()` (a slice cut short, or with trailing bytes, is refused).
    pub fn table(sig: Signature, data: &'a [u8]) -> Result<Self, AcpiError> {
        let r = Reader::new(sig, data);
        if data.len() < HEADER_LEN {
            return Err(AcpiError::Truncated { table: sig, offset: 0, need: HEADER_LEN });
        }
        if r.u32(4)? as usize != data.len() {
            return Err(AcpiError::BadLength { table: sig, what: "table (header length is not the table's)" });
        }
        Ok(r)
    }

    pub fn bad(&self, offset: usize, what: &'static str) -> AcpiError {
        AcpiError::BadValue { table: self.sig, offset, what }
    }
}

/// One checked table: its physical address and its `length` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Table<'a> {
    pub addr: u64,
    pub data: &'a [u8],
}

impl Table<'_> {
    /// The header's signature (all zero if `data` is too short to have one).
    pub fn signature(&self) -> Signature {
        match self.data {
            [a, b, c, d, ..] => Signature([*a, *b, *c, *d]),
            _ => Signature([0; 4]),
        }
    }

    /// The header: the first [`HEADER_LEN`] bytes.
    pub fn header(&self) -> Result<&[u8], AcpiError> {
        Reader::new(self.signature(), self.data).bytes(0, HEADER_LEN)
    }
}

/// The RSDP's identity, reused for the RSDP written for Dom0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RsdpInfo {
    pub addr: u64,
    pub oem_id: [u8; 6],
    pub xsdt_addr: u64,
}

/// All tables reachable from the RSDP, each length- and checksum-checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tables<'a> {
    pub rsdp: RsdpInfo,
    pub xsdt: Table<'a>,
    /// The XSDT's entries in order, then the DSDT (from the FADT).
    pub tables: Vec<Table<'a>>,
}

/// Length of an ACPI 2.0+ RSDP.
pub const RSDP_LEN: usize = 36;

/// Most XSDT entries we accept: far more than any real machine has, few
/// enough that a corrupt length cannot make us walk gigabytes.
pub const MAX_XSDT_ENTRIES: usize = 1024;

/// Reads and checks one table at `addr` whose signature must be `expected`.
pub fn read_table<M: PhysMem + ?Sized>(mem: &M, addr: u64, expected: Signature) -> Result<Table<'_>, AcpiError> {
    let head = mem.read(addr, HEADER_LEN).ok_or(AcpiError::Unmapped { table: expected, addr })?;
    let r = Reader::new(expected, head);
    let found = Signature(r.array(0)?);
    if found != expected {
        return Err(AcpiError::WrongSignature { expected, found });
    }
    check_table(mem, addr, found)
}

/// Reads and checks the table at `addr`, whatever its signature.
fn check_table<M: PhysMem + ?Sized>(mem: &M, addr: u64, sig: Signature) -> Result<Table<'_>, AcpiError> {
    let head = mem.read(addr, HEADER_LEN).ok_or(AcpiError::Unmapped { table: sig, addr })?;
    let len = Reader::new(sig, head).u32(4)? as usize;
    if len < HEADER_LEN {
        return Err(AcpiError::BadLength { table: sig, what: "table (shorter than its header)" });
    }
    let data = mem.read(addr, len).ok_or(AcpiError::Unmapped { table: sig, addr })?;
    if checksum(data) != 0 {
        return Err(AcpiError::BadChecksum { table: sig });
    }
    Ok(Table { addr, data })
}

impl<'a> Tables<'a> {
    /// Follows the RSDP at `rsdp_addr` to every table (ACPI 2.0+: the XSDT;
    /// a revision-0 RSDP with only an RSDT is `BadRsdp`, arm64 requires 2.0).
    pub fn from_rsdp<M: PhysMem + ?Sized>(mem: &'a M, rsdp_addr: u64) -> Result<Self, AcpiError> {
        let rsdp = parse_rsdp(mem, rsdp_addr)?;
        let xsdt = read_table(mem, rsdp.xsdt_addr, Signature::XSDT)?;
        let body = &xsdt.data[HEADER_LEN..];
        if !body.len().is_multiple_of(8) {
            return Err(AcpiError::BadLength { table: Signature::XSDT, what: "entry array (not a multiple of 8)" });
        }
        if body.len() / 8 > MAX_XSDT_ENTRIES {
            return Err(AcpiError::BadCount { table: Signature::XSDT, what: "entries" });
        }
        let mut tables = Vec::new();
        for chunk in body.chunks_exact(8) {
            let mut a = [0u8; 8];
            a.copy_from_slice(chunk);
            let addr = u64::from_le_bytes(a);
            let head = mem.read(addr, 4).ok_or(AcpiError::Unmapped { table: Signature::XSDT, addr })?;
            let sig = Signature([head[0], head[1], head[2], head[3]]);
            tables.push(check_table(mem, addr, sig)?);
        }
        let mut this = Tables { rsdp, xsdt, tables };
        if let Some(fadt) = this.find(Signature::FADT) {
            let dsdt_addr = tables::dsdt_address(fadt.data)?;
            if dsdt_addr != 0 {
                let dsdt = read_table(mem, dsdt_addr, Signature::DSDT)?;
                this.tables.push(dsdt);
            }
        }
        Ok(this)
    }

    /// The first table with signature `sig`.
    pub fn find(&self, sig: Signature) -> Option<Table<'a>> {
        self.tables.iter().copied().find(|t| t.signature() == sig)
    }
}

/// Checks the RSDP at `addr` (both checksums, revision ≥ 2, length).
pub fn parse_rsdp<M: PhysMem + ?Sized>(mem: &M, addr: u64) -> Result<RsdpInfo, AcpiError> {
    let bytes = mem.read(addr, RSDP_LEN).ok_or(AcpiError::Unmapped { table: Signature::RSDP, addr })?;
    let r = Reader::new(Signature::RSDP, bytes);
    if r.bytes(0, 8)? != b"RSD PTR " {
        return Err(AcpiError::BadRsdp("signature is not \"RSD PTR \""));
    }
    if checksum(&bytes[..20]) != 0 {
        return Err(AcpiError::BadRsdp("bad checksum of the first 20 bytes"));
    }
    if r.u8(15)? < 2 {
        return Err(AcpiError::BadRsdp("revision < 2 (no XSDT)"));
    }
    if (r.u32(20)? as usize) < RSDP_LEN {
        return Err(AcpiError::BadRsdp("length shorter than 36"));
    }
    if checksum(bytes) != 0 {
        return Err(AcpiError::BadRsdp("bad extended checksum"));
    }
    let mut oem_id = [0u8; 6];
    oem_id.copy_from_slice(r.bytes(9, 6)?);
    Ok(RsdpInfo { addr, oem_id, xsdt_addr: r.u64(24)? })
}
