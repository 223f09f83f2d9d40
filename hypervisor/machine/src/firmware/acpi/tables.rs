//! Decoders of the tables the hypervisor needs, each from a checked table's
//! bytes (header included) to plain values. Layouts: ACPI 6.5 §5.2.9 (FADT),
//! §5.2.12 (MADT), §5.2.25 (GTDT); SPCR, MCFG and IORT (Arm DEN 0049E) are
//! external specifications the ACPI spec links to.

use alloc::vec::Vec;

use super::{AcpiError, Reader, Signature, HEADER_LEN};
use crate::region::Region;

// ---------------------------------------------------------------- FADT

/// FADT `Flags` bit 20: hardware-reduced ACPI (required on arm64).
pub const FADT_HW_REDUCED_ACPI: u32 = 1 << 20;
/// FADT `ARM_BOOT_ARCH` bit 0: PSCI is implemented.
pub const ARM_BOOT_PSCI_COMPLIANT: u16 = 1 << 0;
/// FADT `ARM_BOOT_ARCH` bit 1: call PSCI with HVC instead of SMC.
pub const ARM_BOOT_PSCI_USE_HVC: u16 = 1 << 1;

pub(crate) const FADT_DSDT: usize = 40;
pub(crate) const FADT_FLAGS: usize = 112;
pub(crate) const FADT_ARM_BOOT_ARCH: usize = 129;
pub(crate) const FADT_MINOR_VERSION: usize = 131;
pub(crate) const FADT_X_DSDT: usize = 140;
/// The FADT up to and including `X_DSDT` (ACPI 5.1 has ARM_BOOT_ARCH).
const FADT_MIN_LEN: usize = FADT_X_DSDT + 8;

/// What the hypervisor reads from the FADT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fadt {
    /// Header revision and `FADT Minor Version` (5.1 or later on arm64).
    pub version: (u8, u8),
    pub flags: u32,
    pub arm_boot_arch: u16,
    /// `X_DSDT`, or the 32-bit `DSDT` when that is 0.
    pub dsdt: u64,
}

impl Fadt {
    pub fn hw_reduced(&self) -> bool {
        self.flags & FADT_HW_REDUCED_ACPI != 0
    }

    /// `Some("hvc")`/`Some("smc")` when PSCI is implemented (DT `method`).
    pub fn psci_method(&self) -> Option<&'static str> {
        match (self.arm_boot_arch & ARM_BOOT_PSCI_COMPLIANT != 0, self.arm_boot_arch & ARM_BOOT_PSCI_USE_HVC != 0) {
            (false, _) => None,
            (true, true) => Some("hvc"),
            (true, false) => Some("smc"),
        }
    }
}

pub fn parse_fadt(data: &[u8]) -> Result<Fadt, AcpiError> {
    let r = Reader::table(Signature::FADT, data)?;
    if data.len() < FADT_MIN_LEN {
        return Err(AcpiError::Truncated { table: Signature::FADT, offset: 0, need: FADT_MIN_LEN });
    }
    Ok(Fadt {
        version: (r.u8(8)?, r.u8(FADT_MINOR_VERSION)?),
        flags: r.u32(FADT_FLAGS)?,
        arm_boot_arch: r.u16(FADT_ARM_BOOT_ARCH)?,
        dsdt: dsdt_address(data)?,
    })
}

/// The DSDT's address from a FADT: `X_DSDT`, else `DSDT`, else 0.
pub fn dsdt_address(data: &[u8]) -> Result<u64, AcpiError> {
    let r = Reader::new(Signature::FADT, data);
    let x = if data.len() >= FADT_X_DSDT + 8 { r.u64(FADT_X_DSDT)? } else { 0 };
    Ok(if x != 0 { x } else { u64::from(r.u32(FADT_DSDT)?) })
}

// ---------------------------------------------------------------- MADT

/// MADT interrupt controller structure types (ACPI 6.5 table 5.21).
pub const MADT_GICC: u8 = 0x0b;
pub const MADT_GICD: u8 = 0x0c;
pub const MADT_GIC_MSI_FRAME: u8 = 0x0d;
pub const MADT_GICR: u8 = 0x0e;
pub const MADT_GIC_ITS: u8 = 0x0f;

/// Offset of the first MADT entry (after `Local Interrupt Controller
/// Address` and `Flags`).
pub const MADT_ENTRIES: usize = HEADER_LEN + 8;
/// Length of a GICC structure in ACPI 6.0–6.4 (6.5 adds 2 bytes).
pub const GICC_LEN: usize = 80;
/// GICC `Flags` bit 0: enabled; bit 3: online capable (may be enabled later).
pub const GICC_ENABLED: u32 = 1 << 0;
pub const GICC_ONLINE_CAPABLE: u32 = 1 << 3;
/// Size of a GICv3 distributor frame and of an ITS (control + translation).
pub const GICD_SIZE: u64 = 0x1_0000;
pub const GITS_SIZE: u64 = 0x2_0000;
/// A GICv3 redistributor (RD_base + SGI_base); GICv4 adds VLPI + reserved.
pub const GICR_V3_STRIDE: u64 = 0x2_0000;
pub const GICR_V4_STRIDE: u64 = 0x4_0000;

/// A GICC structure: one CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gicc {
    pub cpu_interface_number: u32,
    pub acpi_processor_uid: u32,
    pub flags: u32,
    pub perf_gsiv: u32,
    /// `VGIC Maintenance interrupt` GSIV (0: none).
    pub vgic_maint_gsiv: u32,
    /// `GICR Base Address` (0 when GICR structures describe them).
    pub gicr_base: u64,
    /// MPIDR affinity fields (Aff3 at bits 39:32, Aff2..0 at 23:0).
    pub mpidr: u64,
}

impl Gicc {
    pub fn usable(&self) -> bool {
        self.flags & (GICC_ENABLED | GICC_ONLINE_CAPABLE) != 0
    }
}

/// What the hypervisor reads from the MADT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Madt {
    /// The GICD structure's `GIC version` (1–4; 0: "detect from hardware").
    pub gic_version: u8,
    pub gicd: Region,
    /// Every GICC, usable or not, in table order.
    pub giccs: Vec<Gicc>,
    /// GICR discovery ranges (GICR structures).
    pub gicr_ranges: Vec<Region>,
    /// GIC ITS structures: (GIC ITS ID, frame).
    pub its: Vec<(u32, Region)>,
    /// Structures of types we do not decode, skipped.
    pub skipped: usize,
}

/// One MADT entry: its type, byte offset in the table and bytes.
pub(crate) type MadtEntry<'a> = (u8, usize, &'a [u8]);

/// The MADT's entries in order.
pub(crate) fn madt_entries(data: &[u8]) -> Result<Vec<MadtEntry<'_>>, AcpiError> {
    let r = Reader::table(Signature::MADT, data)?;
    let mut out = Vec::new();
    let mut off = MADT_ENTRIES;
    if data.len() < off {
        return Err(AcpiError::Truncated { table: Signature::MADT, offset: HEADER_LEN, need: 8 });
    }
    while off < data.len() {
        let ty = r.u8(off)?;
        let len = r.u8(off + 1)? as usize;
        if len < 2 {
            return Err(AcpiError::BadValue { table: Signature::MADT, offset: off + 1, what: "entry length" });
        }
        out.push((ty, off, r.bytes(off, len)?));
        off += len;
    }
    Ok(out)
}

/// Entry of type `ty` at `off` is shorter than its layout (`need`).
fn short(off: usize, need: usize) -> AcpiError {
    AcpiError::Truncated { table: Signature::MADT, offset: off, need }
}

pub fn parse_madt(data: &[u8]) -> Result<Madt, AcpiError> {
    let mut gicd = None;
    let mut madt = Madt {
        gic_version: 0,
        gicd: Region::default(),
        giccs: Vec::new(),
        gicr_ranges: Vec::new(),
        its: Vec::new(),
        skipped: 0,
    };
    for (ty, off, e) in madt_entries(data)? {
        let r = Reader::new(Signature::MADT, e);
        let need = match ty {
            MADT_GICC => GICC_LEN,
            MADT_GICD => 24,
            MADT_GICR => 16,
            MADT_GIC_ITS => 20,
            _ => 0,
        };
        if e.len() < need {
            return Err(short(off, need));
        }
        match ty {
            MADT_GICC => madt.giccs.push(Gicc {
                cpu_interface_number: r.u32(4)?,
                acpi_processor_uid: r.u32(8)?,
                flags: r.u32(12)?,
                perf_gsiv: r.u32(20)?,
                vgic_maint_gsiv: r.u32(56)?,
                gicr_base: r.u64(60)?,
                mpidr: r.u64(68)?,
            }),
            MADT_GICD => {
                if gicd.is_some() {
                    return Err(AcpiError::BadCount {
                        table: Signature::MADT,
                        what: "GICD structures (more than one)",
                    });
                }
                gicd = Some(Region { base: r.u64(8)?, size: GICD_SIZE });
                madt.gic_version = r.u8(20)?;
            }
            MADT_GICR => {
                let range = Region { base: r.u64(4)?, size: u64::from(r.u32(12)?) };
                if range.size == 0 {
                    return Err(AcpiError::BadValue {
                        table: Signature::MADT,
                        offset: off + 12,
                        what: "GICR range length 0",
                    });
                }
                madt.gicr_ranges.push(range);
            }
            MADT_GIC_ITS => madt.its.push((r.u32(4)?, Region { base: r.u64(8)?, size: GITS_SIZE })),
            _ => {
                log::debug!("ACPI MADT: skipping entry type {ty:#x} at offset {off}");
                madt.skipped += 1;
            }
        }
    }
    madt.gicd = gicd.ok_or(AcpiError::BadCount { table: Signature::MADT, what: "GICD structures (none)" })?;
    if !madt.giccs.iter().any(Gicc::usable) {
        return Err(AcpiError::BadCount { table: Signature::MADT, what: "usable GICC structures (none)" });
    }
    if madt.gic_version > 4 {
        return Err(AcpiError::Unsupported { table: Signature::MADT, what: "GIC version > 4" });
    }
    check_madt_regions(&madt)?;
    Ok(madt)
}

/// MPIDRs unique; GICD, GICR ranges and ITS frames pairwise disjoint.
fn check_madt_regions(madt: &Madt) -> Result<(), AcpiError> {
    let mut mpidrs: Vec<u64> = madt.giccs.iter().filter(|g| g.usable()).map(|g| g.mpidr).collect();
    mpidrs.sort_unstable();
    if mpidrs.windows(2).any(|w| w[0] == w[1]) {
        return Err(AcpiError::Overlap { table: Signature::MADT, what: "GICC MPIDRs (duplicate)" });
    }
    let mut frames: Vec<Region> = core::iter::once(madt.gicd)
        .chain(madt.gicr_ranges.iter().copied())
        .chain(madt.its.iter().map(|&(_, r)| r))
        .collect();
    if frames.iter().any(|f| f.base.checked_add(f.size).is_none()) {
        return Err(AcpiError::BadValue { table: Signature::MADT, offset: 0, what: "GIC frame beyond 2^64" });
    }
    frames.sort_unstable();
    if frames.windows(2).any(|w| w[0].end() > w[1].base) {
        return Err(AcpiError::Overlap { table: Signature::MADT, what: "GIC frames (GICD, GICR, ITS)" });
    }
    Ok(())
}

// ---------------------------------------------------------------- GTDT

/// GTDT timer `Flags` bit 0: edge-triggered; bit 1: active low.
pub const GTDT_EDGE: u32 = 1 << 0;
pub const GTDT_ACTIVE_LOW: u32 = 1 << 1;

/// One timer interrupt: GSIV and GTDT flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerIrq {
    pub gsiv: u32,
    pub flags: u32,
}

/// The generic timer's per-CPU interrupts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gtdt {
    pub secure_el1: TimerIrq,
    pub non_secure_el1: TimerIrq,
    pub virtual_el1: TimerIrq,
    pub non_secure_el2: TimerIrq,
}

pub fn parse_gtdt(data: &[u8]) -> Result<Gtdt, AcpiError> {
    let r = Reader::table(Signature::GTDT, data)?;
    let irq =
        |off: usize| -> Result<TimerIrq, AcpiError> { Ok(TimerIrq { gsiv: r.u32(off)?, flags: r.u32(off + 4)? }) };
    Ok(Gtdt { secure_el1: irq(48)?, non_secure_el1: irq(56)?, virtual_el1: irq(64)?, non_secure_el2: irq(72)? })
}

// ---------------------------------------------------------------- SPCR

/// SPCR `Interface Type`s we know (DBG2 port subtypes).
pub const SPCR_16550: u8 = 0x00;
pub const SPCR_PL011: u8 = 0x03;
pub const SPCR_SBSA_32BIT: u8 = 0x0d;
pub const SPCR_SBSA: u8 = 0x0e;

/// The console UART the firmware names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spcr {
    pub interface_type: u8,
    /// Base address (the Generic Address Structure's; system memory only).
    pub base: u64,
    /// `Interrupt Type` bit 3: the GSIV is a GIC interrupt.
    pub gic_interrupt: bool,
    pub gsiv: u32,
}

impl Spcr {
    /// A DT `compatible` for the interface type, when it has one.
    pub fn compatible(&self) -> Option<&'static str> {
        match self.interface_type {
            SPCR_PL011 => Some("arm,pl011"),
            SPCR_SBSA | SPCR_SBSA_32BIT => Some("arm,sbsa-uart"),
            SPCR_16550 => Some("ns16550a"),
            _ => None,
        }
    }
}

pub fn parse_spcr(data: &[u8]) -> Result<Spcr, AcpiError> {
    let r = Reader::table(Signature::SPCR, data)?;
    // Generic Address Structure at 40: space id, width, offset, access, address.
    if r.u8(40)? != 0 {
        return Err(AcpiError::Unsupported { table: Signature::SPCR, what: "UART outside system memory space" });
    }
    let base = r.u64(44)?;
    if base == 0 {
        return Err(r.bad(44, "UART base address 0"));
    }
    Ok(Spcr { interface_type: r.u8(36)?, base, gic_interrupt: r.u8(52)? & (1 << 3) != 0, gsiv: r.u32(54)? })
}

// ---------------------------------------------------------------- MCFG

/// One ECAM region (PCI segment group, bus range).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct McfgEntry {
    /// The ECAM address of bus 0 of the segment (even if `start_bus` > 0).
    pub base: u64,
    pub segment: u16,
    pub start_bus: u8,
    pub end_bus: u8,
}

impl McfgEntry {
    /// The configuration space of buses `start_bus..=end_bus`: 1 MiB each.
    pub fn ecam(&self) -> Region {
        let first = u64::from(self.start_bus) << 20;
        let buses = u64::from(self.end_bus) - u64::from(self.start_bus) + 1;
        Region { base: self.base.saturating_add(first), size: buses << 20 }
    }
}

pub fn parse_mcfg(data: &[u8]) -> Result<Vec<McfgEntry>, AcpiError> {
    const FIRST: usize = HEADER_LEN + 8;
    let r = Reader::table(Signature::MCFG, data)?;
    if data.len() < FIRST || !(data.len() - FIRST).is_multiple_of(16) {
        return Err(AcpiError::BadLength { table: Signature::MCFG, what: "entry array (not 16-byte entries)" });
    }
    let mut out = Vec::new();
    for off in (FIRST..data.len()).step_by(16) {
        let e = McfgEntry {
            base: r.u64(off)?,
            segment: r.u16(off + 8)?,
            start_bus: r.u8(off + 10)?,
            end_bus: r.u8(off + 11)?,
        };
        if e.start_bus > e.end_bus {
            return Err(r.bad(off + 10, "bus range (start after end)"));
        }
        if e.ecam().base.checked_add(e.ecam().size).is_none() {
            return Err(r.bad(off, "ECAM beyond 2^64"));
        }
        out.push(e);
    }
    let mut regions: Vec<Region> = out.iter().map(McfgEntry::ecam).collect();
    regions.sort_unstable();
    if regions.windows(2).any(|w| w[0].end() > w[1].base) {
        return Err(AcpiError::Overlap { table: Signature::MCFG, what: "ECAM regions" });
    }
    Ok(out)
}

// ---------------------------------------------------------------- IORT

/// IORT node types (Arm DEN 0049E table 4).
pub const IORT_ITS_GROUP: u8 = 0;
pub const IORT_NAMED_COMPONENT: u8 = 1;
pub const IORT_ROOT_COMPLEX: u8 = 2;
pub const IORT_SMMU_V1_V2: u8 = 3;
pub const IORT_SMMU_V3: u8 = 4;

/// Longest chain of nodes an ID may pass through (RC → SMMU → ITS is 2).
const IORT_MAX_HOPS: usize = 4;

/// An ITS group node: its byte offset (what mappings refer to) and the GIC
/// ITS IDs (as in the MADT's GIC ITS structures).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItsGroup {
    pub offset: u32,
    pub its_ids: Vec<u32>,
}

/// Requester IDs `[rid_base, rid_base + count)` of a root complex become
/// DeviceIDs `[device_id_base, …)` at ITS group `its_group` (its offset),
/// composed through any SMMU in between. The `msi-map` of the DT binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcIdMap {
    pub rid_base: u32,
    pub count: u32,
    pub device_id_base: u32,
    pub its_group: u32,
}

/// Requester IDs `[rid_base, rid_base + count)` of a root complex are
/// StreamIDs `[sid_base, …)` of the SMMUv3 at node offset `smmu`: the
/// `iommu-map` of the DT binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcStreamMap {
    pub rid_base: u32,
    pub count: u32,
    pub sid_base: u32,
    pub smmu: u32,
}

/// A PCI root complex node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootComplex {
    /// Its node offset.
    pub offset: u32,
    pub segment: u32,
    pub id_maps: Vec<RcIdMap>,
    /// Its ID mappings that end at an SMMUv3 (where its DMA is translated).
    pub stream_maps: Vec<RcStreamMap>,
}

/// An SMMUv3 node (DEN 0049E table 13).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IortSmmuV3 {
    /// Its node offset (what mappings refer to).
    pub offset: u32,
    pub base: u64,
    /// Flags bit 0, COHACC override: its table and queue walks are coherent.
    pub coherent: bool,
    /// The event queue's and global error's wired interrupts (GSIV 0: none,
    /// the SMMU signals by MSI only).
    pub event_gsiv: u32,
    pub gerr_gsiv: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Iort {
    pub its_groups: Vec<ItsGroup>,
    pub root_complexes: Vec<RootComplex>,
    pub smmus: Vec<IortSmmuV3>,
}

/// One raw ID mapping: inputs `[input, input + count)` → `output` at node
/// offset `target`.
#[derive(Clone, Copy)]
struct IdMapping {
    input: u32,
    count: u32,
    output: u32,
    target: u32,
    /// `Flags` bit 0: a single mapping (the node's own MSIs; input ignored).
    single: bool,
}

/// Node header: (type, length, id mappings).
fn iort_node(r: &Reader<'_>, off: usize) -> Result<(u8, usize, Vec<IdMapping>), AcpiError> {
    let ty = r.u8(off)?;
    let len = r.u16(off + 1)? as usize;
    if len < 16 {
        return Err(r.bad(off + 1, "node length"));
    }
    let node = Reader::new(Signature::IORT, r.bytes(off, len)?);
    let n = node.u32(8)? as usize;
    let first = node.u32(12)? as usize;
    if n > len / 20 {
        return Err(AcpiError::BadCount { table: Signature::IORT, what: "ID mappings of a node" });
    }
    let mut maps = Vec::with_capacity(n);
    for i in 0..n {
        let m = first + i * 20;
        // `Number of IDs` is the count minus one.
        let count = node.u32(m + 4)?.checked_add(1).ok_or(node.bad(off + m + 4, "ID mapping count"))?;
        maps.push(IdMapping {
            input: node.u32(m)?,
            count,
            output: node.u32(m + 8)?,
            target: node.u32(m + 12)?,
            single: node.u32(m + 16)? & 1 != 0,
        });
    }
    Ok((ty, len, maps))
}

/// One node as [`iort_node`] read it, at byte offset `off`.
struct RawNode {
    off: u32,
    ty: u8,
    len: usize,
    maps: Vec<IdMapping>,
}

/// Every node of the IORT `r` (over `data`), in table order (count and
/// lengths checked).
fn iort_nodes(r: &Reader<'_>, data: &[u8]) -> Result<Vec<RawNode>, AcpiError> {
    let count = r.u32(HEADER_LEN)? as usize;
    let first = r.u32(HEADER_LEN + 4)? as usize;
    if count > data.len() / 16 {
        return Err(AcpiError::BadCount { table: Signature::IORT, what: "nodes" });
    }
    let mut nodes = Vec::with_capacity(count);
    let mut off = first;
    for _ in 0..count {
        let (ty, len, maps) = iort_node(r, off)?;
        nodes.push(RawNode { off: off as u32, ty, len, maps });
        off += len;
    }
    Ok(nodes)
}

pub fn parse_iort(data: &[u8]) -> Result<Iort, AcpiError> {
    let r = Reader::table(Signature::IORT, data)?;
    let nodes = iort_nodes(&r, data)?;
    let mut iort = Iort { its_groups: Vec::new(), root_complexes: Vec::new(), smmus: Vec::new() };
    for RawNode { off: node_off, ty, maps, .. } in &nodes {
        let node_off = *node_off as usize;
        match *ty {
            IORT_ITS_GROUP => {
                let n = r.u32(node_off + 16)? as usize;
                if n == 0 || n > data.len() / 4 {
                    return Err(AcpiError::BadCount { table: Signature::IORT, what: "ITS IDs of an ITS group" });
                }
                let its_ids = (0..n).map(|i| r.u32(node_off + 20 + 4 * i)).collect::<Result<_, _>>()?;
                iort.its_groups.push(ItsGroup { offset: node_off as u32, its_ids });
            }
            IORT_ROOT_COMPLEX => {
                let mut id_maps = Vec::new();
                let mut stream_maps = Vec::new();
                for m in maps {
                    resolve(&nodes, *m, 0, &mut id_maps)?;
                    if nodes.iter().any(|n| n.off == m.target && n.ty == IORT_SMMU_V3) {
                        stream_maps.push(RcStreamMap {
                            rid_base: m.input,
                            count: m.count,
                            sid_base: m.output,
                            smmu: m.target,
                        });
                    }
                }
                iort.root_complexes.push(RootComplex {
                    offset: node_off as u32,
                    segment: r.u32(node_off + 28)?,
                    id_maps,
                    stream_maps,
                });
            }
            IORT_SMMU_V3 => {
                iort.smmus.push(IortSmmuV3 {
                    offset: node_off as u32,
                    base: r.u64(node_off + 16)?,
                    coherent: r.u32(node_off + 24)? & 1 != 0,
                    event_gsiv: r.u32(node_off + 44)?,
                    gerr_gsiv: r.u32(node_off + 52)?,
                });
            }
            _ => {}
        }
    }
    Ok(iort)
}

/// The IORT a guest that must not see the SMMUs gets (an ACPI Dom0: the
/// SMMUs are the hypervisor's): the same table without SMMU nodes, with
/// each root complex's and named component's mappings that went through
/// one composed into mappings straight to the ITS groups (what the
/// device's MSIs look like to the ITS whatever the SMMU does). ITS groups,
/// root complexes and named components are kept; PMCG, RMR and other
/// nodes, which describe SMMUs or what sits on them, go. `None`: the table
/// has no SMMU node, pass it on as it is. The checksum is the caller's.
pub fn iort_without_smmus(data: &[u8]) -> Result<Option<Vec<u8>>, AcpiError> {
    let r = Reader::table(Signature::IORT, data)?;
    let nodes = iort_nodes(&r, data)?;
    if !nodes.iter().any(|n| matches!(n.ty, IORT_SMMU_V1_V2 | IORT_SMMU_V3)) {
        return Ok(None);
    }
    // Each kept node: its fixed part and its new mappings (old targets).
    let mut kept: Vec<(u32, Vec<u8>, Vec<IdMapping>)> = Vec::new();
    for RawNode { off: node_off, ty, maps, len } in &nodes {
        let start = *node_off as usize;
        let fixed = match *ty {
            IORT_ITS_GROUP => r.bytes(start, *len)?.to_vec(),
            IORT_ROOT_COMPLEX | IORT_NAMED_COMPONENT => {
                // The fixed part ends where the mappings start (the whole
                // node when it has none); never inside the header.
                let id_off = if maps.is_empty() { *len } else { r.u32(start + 12)? as usize };
                if !(16..=*len).contains(&id_off) {
                    return Err(r.bad(start + 12, "ID array offset"));
                }
                r.bytes(start, id_off)?.to_vec()
            }
            _ => continue,
        };
        let mut out = Vec::new();
        for m in maps {
            match nodes.iter().find(|n| n.off == m.target).map(|n| n.ty) {
                Some(IORT_ITS_GROUP) => out.push(*m),
                _ => {
                    let mut composed = Vec::new();
                    resolve(&nodes, *m, 0, &mut composed)?;
                    out.extend(composed.iter().map(|c| IdMapping {
                        input: c.rid_base,
                        count: c.count,
                        output: c.device_id_base,
                        target: c.its_group,
                        single: false,
                    }));
                }
            }
        }
        if *ty == IORT_ITS_GROUP {
            out.clear();
        }
        kept.push((*node_off, fixed, out));
    }
    // New offsets: the nodes follow the IORT header back to back.
    let nodes_at = HEADER_LEN + 12;
    let mut new_off = Vec::with_capacity(kept.len());
    let mut at = nodes_at;
    for (old, fixed, maps) in &kept {
        new_off.push((*old, at as u32));
        at += fixed.len() + 20 * maps.len();
    }
    let retarget = |old: u32| new_off.iter().find(|(o, _)| *o == old).map(|(_, n)| *n);
    let mut t = r.bytes(0, HEADER_LEN)?.to_vec();
    t.extend_from_slice(&(kept.len() as u32).to_le_bytes());
    t.extend_from_slice(&(nodes_at as u32).to_le_bytes());
    t.extend_from_slice(&0u32.to_le_bytes());
    for (_, fixed, maps) in &kept {
        let mut node = fixed.clone();
        // An ITS group is copied whole; the others get their new mappings
        // right after their fixed part.
        if node[0] != IORT_ITS_GROUP {
            let len = u16::try_from(node.len() + 20 * maps.len()).map_err(|_| AcpiError::TooLarge(Signature::IORT))?;
            node[1..3].copy_from_slice(&len.to_le_bytes());
            node[8..12].copy_from_slice(&(maps.len() as u32).to_le_bytes());
            node[12..16].copy_from_slice(&(fixed.len() as u32).to_le_bytes());
            for m in maps {
                let target = retarget(m.target).ok_or(AcpiError::BadValue {
                    table: Signature::IORT,
                    offset: m.target as usize,
                    what: "ID mapping target",
                })?;
                for v in [m.input, m.count - 1, m.output, target, u32::from(m.single)] {
                    node.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        t.extend_from_slice(&node);
    }
    Ok(Some(t))
}

/// Follows mapping `m` (whose inputs are the root complex's requester IDs,
/// shifted by the hops so far) to ITS groups, clipping at every hop.
fn resolve(nodes: &[RawNode], m: IdMapping, hops: usize, out: &mut Vec<RcIdMap>) -> Result<(), AcpiError> {
    let Some(RawNode { ty, maps: next, .. }) = nodes.iter().find(|n| n.off == m.target) else {
        return Err(AcpiError::BadValue {
            table: Signature::IORT,
            offset: m.target as usize,
            what: "ID mapping target",
        });
    };
    match *ty {
        IORT_ITS_GROUP => {
            out.push(RcIdMap { rid_base: m.input, count: m.count, device_id_base: m.output, its_group: m.target });
            Ok(())
        }
        IORT_SMMU_V1_V2 | IORT_SMMU_V3 if hops < IORT_MAX_HOPS => {
            let (lo, hi) = (u64::from(m.output), u64::from(m.output) + u64::from(m.count));
            for n in next.iter().filter(|n| !n.single) {
                let (nlo, nhi) = (u64::from(n.input), u64::from(n.input) + u64::from(n.count));
                let (s, e) = (lo.max(nlo), hi.min(nhi));
                if s >= e {
                    continue;
                }
                // Bounded by the u32 ranges they come from.
                let clipped = IdMapping {
                    input: m.input.wrapping_add((s - lo) as u32),
                    count: (e - s) as u32,
                    output: n.output.wrapping_add((s - nlo) as u32),
                    target: n.target,
                    single: false,
                };
                resolve(nodes, clipped, hops + 1, out)?;
            }
            Ok(())
        }
        IORT_SMMU_V1_V2 | IORT_SMMU_V3 => {
            Err(AcpiError::BadCount { table: Signature::IORT, what: "hops of an ID mapping (loop?)" })
        }
        _ => Err(AcpiError::Unsupported {
            table: Signature::IORT,
            what: "ID mapping to a node that is not an ITS group or SMMU",
        }),
    }
}
