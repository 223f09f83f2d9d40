//! Register offsets and fixed identification values of the emulated GICv3.
//!
//! Offsets are relative to the start of the frame they live in: the 64 KiB
//! distributor frame, the redistributor's RD_base frame, or its SGI_base frame
//! (which starts [`SGI_FRAME`] bytes after RD_base).

/// Size of the distributor frame.
pub const GICD_SIZE: u64 = 0x1_0000;
/// Distance between two vCPUs' redistributors (RD_base + SGI_base, GICv3 layout).
pub const GICR_STRIDE: u64 = 0x2_0000;
/// Offset of SGI_base inside one redistributor.
pub const SGI_FRAME: u64 = 0x1_0000;

// ---- Distributor ----
pub const GICD_CTLR: u64 = 0x0000;
pub const GICD_TYPER: u64 = 0x0004;
pub const GICD_IIDR: u64 = 0x0008;
pub const GICD_TYPER2: u64 = 0x000C;
pub const GICD_STATUSR: u64 = 0x0010;
pub const GICD_SGIR: u64 = 0x0F00;
/// `GICD_IROUTER<n>` lives at `GICD_IROUTER + 8 * n` for n in 32..=1019.
pub const GICD_IROUTER: u64 = 0x6000;
pub const GICD_IROUTER_END: u64 = 0x6000 + 8 * 1020;

// ---- Banks of per-interrupt registers (same offsets in GICD and SGI_base) ----
pub const IGROUPR: u64 = 0x0080;
pub const ISENABLER: u64 = 0x0100;
pub const ICENABLER: u64 = 0x0180;
pub const ISPENDR: u64 = 0x0200;
pub const ICPENDR: u64 = 0x0280;
pub const ISACTIVER: u64 = 0x0300;
pub const ICACTIVER: u64 = 0x0380;
pub const BITREGS_END: u64 = 0x0400;
pub const IPRIORITYR: u64 = 0x0400;
pub const IPRIORITYR_END: u64 = 0x0400 + 1020;
pub const ICFGR: u64 = 0x0C00;
pub const ICFGR_END: u64 = 0x0D00;
pub const IGRPMODR: u64 = 0x0D00;
pub const IGRPMODR_END: u64 = 0x0D80;

// ---- Redistributor, RD_base frame ----
pub const GICR_CTLR: u64 = 0x0000;
pub const GICR_IIDR: u64 = 0x0004;
pub const GICR_TYPER: u64 = 0x0008;
pub const GICR_STATUSR: u64 = 0x0010;
pub const GICR_WAKER: u64 = 0x0014;
pub const GICR_PROPBASER: u64 = 0x0070;
pub const GICR_PENDBASER: u64 = 0x0078;

// ---- Identification block (both GICD and GICR RD_base) ----
pub const ID_BLOCK: u64 = 0xFFD0;

// ---- GICD_CTLR bits (single security state view, DS = 1) ----
pub const CTLR_ENABLE_GRP0: u32 = 1 << 0;
pub const CTLR_ENABLE_GRP1: u32 = 1 << 1;
pub const CTLR_ARE: u32 = 1 << 4;
pub const CTLR_DS: u32 = 1 << 6;

// ---- GICR_WAKER bits ----
pub const WAKER_PROCESSOR_SLEEP: u32 = 1 << 1;
pub const WAKER_CHILDREN_ASLEEP: u32 = 1 << 2;

// ---- GICR_TYPER bits ----
pub const GICR_TYPER_LAST: u64 = 1 << 4;

// ---- GICD_IROUTER fields ----
pub const IROUTER_IRM: u64 = 1 << 31;
/// Aff3 (39:32) and Aff2.Aff1.Aff0 (23:0): the bits that exist in IROUTER and,
/// at the same positions, in MPIDR_EL1.
pub const AFFINITY_MASK: u64 = 0xFF_00FF_FFFF;

/// Implementer/product identification reported in GICD_IIDR and GICR_IIDR:
/// JEP106 code of Arm (0x43B) with a product ID (0x7A) that matches no
/// hardware, so no guest errata workaround is triggered by it.
pub const IIDR_VALUE: u32 = 0x7A00_043B;

/// PIDR4..PIDR7, PIDR0..PIDR3, CIDR0..CIDR3 at 0xFFD0.. in 4-byte steps.
/// PIDR2 = 0x3B: ArchRev 3 in bits 7:4, JEDEC-assigned (bit 3), JEP106 id bits.
pub const GICD_ID_REGS: [u32; 12] = [0x44, 0, 0, 0, 0x92, 0xB4, 0x3B, 0, 0x0D, 0xF0, 0x05, 0xB1];
pub const GICR_ID_REGS: [u32; 12] = [0x44, 0, 0, 0, 0x93, 0xB4, 0x3B, 0, 0x0D, 0xF0, 0x05, 0xB1];

// ---- `ICH_LR<n>_EL2` encoding ----
pub const LR_VINTID_MASK: u64 = 0xFFFF_FFFF;
pub const LR_PINTID_SHIFT: u32 = 32;
pub const LR_PINTID_MASK: u64 = 0x1FFF;
pub const LR_EOI: u64 = 1 << 41;
pub const LR_PRIORITY_SHIFT: u32 = 48;
pub const LR_GROUP1: u64 = 1 << 60;
pub const LR_HW: u64 = 1 << 61;
pub const LR_STATE_SHIFT: u32 = 62;
pub const LR_PENDING: u64 = 1 << 62;
pub const LR_ACTIVE: u64 = 1 << 63;
pub const LR_STATE_MASK: u64 = LR_PENDING | LR_ACTIVE;
