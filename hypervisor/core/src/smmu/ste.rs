//! Stream Table Entries and the two-level stream table (IHI 0070, "Stream
//! Table Entry" and "SMMU_STRTAB_BASE_CFG").
//!
//! An STE is 64 bytes, eight little-endian doublewords. The fields used
//! here (DW = doubleword):
//! * DW0 \[0\] V, \[3:1\] Config (0b000 abort, 0b100 bypass, 0b110 stage 2)
//! * DW1 \[45:44\] SHCFG (0b01: use the incoming shareability), \[29:28\]
//!   EATS (0: ATS off), \[31:30\] STRW (0: NS-EL1)
//! * DW2 \[15:0\] S2VMID, \[37:32\] S2T0SZ, \[39:38\] S2SL0, \[41:40\] S2IR0,
//!   \[43:42\] S2OR0, \[45:44\] S2SH0, \[47:46\] S2TG, \[50:48\] S2PS,
//!   \[51\] S2AA64, \[52\] S2ENDI, \[53\] S2AFFD, \[54\] S2PTW, \[55\] S2HD,
//!   \[56\] S2HA, \[57\] S2S, \[58\] S2R
//! * DW3 \[51:4\] S2TTB
//!
//! Every field not listed is zero: stage 1, ATS and the attribute overrides
//! stay off.

use super::SmmuError;

/// A Stream Table Entry.
pub type Ste = [u64; 8];
/// Bytes of an STE.
pub const STE_BYTES: usize = 64;

/// STE.Config values.
pub mod config {
    pub const ABORT: u8 = 0b000;
    pub const BYPASS: u8 = 0b100;
    pub const S1_TRANS: u8 = 0b101;
    pub const S2_TRANS: u8 = 0b110;
    pub const NESTED: u8 = 0b111;
}

const V: u64 = 1;
const SHCFG_INCOMING: u64 = 0b01 << 44;
/// S2IR0/S2OR0: write-back, read- and write-allocate.
const S2_WBRAWA: u64 = 0b01;
/// S2SH0: inner shareable.
const S2_ISH: u64 = 0b11;
const S2AA64: u64 = 1 << 51;
const S2AFFD: u64 = 1 << 53;
const S2R: u64 = 1 << 58;
/// S2TTB \[51:4\].
const S2TTB_MASK: u64 = 0x000f_ffff_ffff_fff0;

/// How a stream's traffic is translated at stage 2: the same tables and
/// VMID the CPUs use for the domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct S2Config {
    /// The domain's VMID (tags the SMMU's TLB entries).
    pub vmid: u16,
    /// 4 KiB-aligned PA of the stage-2 root table.
    pub root: u64,
    /// IPA bits: 39 (walk from level 1) or 40..=48 (walk from level 0).
    pub ipa_bits: u32,
    /// The walk's start level with the 4 KiB granule: 0 or 1.
    pub start_level: u8,
    /// Output PA bits: 32, 36, 40, 42, 44 or 48.
    pub ps_bits: u32,
}

impl S2Config {
    /// The start level a single 4 KiB root table needs for `ipa_bits`, as
    /// the CPU's stage 2 walks it (no concatenated roots): level 1 covers
    /// up to 39 bits, level 0 the rest up to 48.
    pub const fn start_level_for(ipa_bits: u32) -> u8 {
        if ipa_bits <= 39 {
            1
        } else {
            0
        }
    }

    /// Whether an STE expresses this configuration as the CPU walks it:
    /// IPA 39..=48 bits with the matching start level, a known output
    /// size and a 4 KiB-aligned root inside that output size.
    pub const fn check(&self) -> Result<(), SmmuError> {
        let ok = self.ipa_bits >= 39
            && self.ipa_bits <= 48
            && self.start_level == Self::start_level_for(self.ipa_bits)
            && ps_encoding(self.ps_bits).is_some()
            && self.root & 0xfff == 0
            && self.root >> self.ps_bits == 0;
        if ok {
            Ok(())
        } else {
            Err(SmmuError::BadS2Config)
        }
    }
}

/// S2PS (and `IDR5.OAS`) encoding of an output size in bits.
pub const fn ps_encoding(bits: u32) -> Option<u8> {
    Some(match bits {
        32 => 0,
        36 => 1,
        40 => 2,
        42 => 3,
        44 => 4,
        48 => 5,
        52 => 6,
        _ => return None,
    })
}

/// An STE that aborts all traffic of the stream (and records no event:
/// the stream is meant to be silent).
pub const fn ste_abort() -> Ste {
    [V | (config::ABORT as u64) << 1, 0, 0, 0, 0, 0, 0, 0]
}

/// An STE that passes the stream's traffic untranslated, with its own
/// shareability (SHCFG = incoming; 0 would make it non-shareable).
pub const fn ste_bypass() -> Ste {
    [V | (config::BYPASS as u64) << 1, SHCFG_INCOMING, 0, 0, 0, 0, 0, 0]
}

/// An STE that translates the stream at stage 2 only, with the tables of
/// `cfg`, which the caller has [`S2Config::check`]ed (out-of-range values
/// are truncated to their fields here).
///
/// * S2T0SZ = 64 - IPA bits; S2SL0 = 1 for level 1, 2 for level 0 (4 KiB).
/// * The walks are write-back inner-shareable, like the CPU's, so no cache
///   maintenance is needed on coherent SMMUs; S2TG = 4 KiB, S2AA64 = 1,
///   S2ENDI = 0 (little-endian).
/// * S2AFFD = 1: the tables' descriptors set AF, so an access flag fault
///   could only be spurious.
/// * S2PTW = 0 and S2HD/S2HA = 0: no hardware AF/dirty updates; the
///   tables are the hypervisor's and only it writes them.
/// * S2S = 0: a fault terminates the transaction (stalling would leave the
///   device waiting on a resume the hypervisor never sends); S2R = 1:
///   faults are recorded in the event queue.
pub const fn ste_stage2(cfg: &S2Config) -> Ste {
    let t0sz = (64u32.saturating_sub(cfg.ipa_bits) & 0x3f) as u64;
    let sl0: u64 = if cfg.start_level == 0 { 2 } else { 1 };
    let ps = match ps_encoding(cfg.ps_bits) {
        Some(p) => p as u64,
        None => 5,
    };
    let dw2 = cfg.vmid as u64
        | t0sz << 32
        | sl0 << 38
        | S2_WBRAWA << 40
        | S2_WBRAWA << 42
        | S2_ISH << 44
        | ps << 48
        | S2AA64
        | S2AFFD
        | S2R;
    [V | (config::S2_TRANS as u64) << 1, SHCFG_INCOMING, dw2, cfg.root & S2TTB_MASK, 0, 0, 0, 0]
}

/// The fields of an STE the tests and diagnostics read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SteFields {
    pub valid: bool,
    pub config: u8,
    pub shcfg: u8,
    pub vmid: u16,
    pub t0sz: u8,
    pub sl0: u8,
    pub ps: u8,
    pub ttb: u64,
}

/// Reads back the fields of `ste`.
pub const fn ste_fields(ste: &Ste) -> SteFields {
    SteFields {
        valid: ste[0] & V != 0,
        config: (ste[0] >> 1 & 0b111) as u8,
        shcfg: (ste[1] >> 44 & 0b11) as u8,
        vmid: ste[2] as u16,
        t0sz: (ste[2] >> 32 & 0x3f) as u8,
        sl0: (ste[2] >> 38 & 0b11) as u8,
        ps: (ste[2] >> 48 & 0b111) as u8,
        ttb: ste[3] & S2TTB_MASK,
    }
}

/// StreamID bits resolved by the second level: each L2 table covers 256
/// StreamIDs (one PCI bus) in 256 × 64 = 16 KiB.
pub const SPLIT: u32 = 8;
/// STEs in an L2 table.
pub const L2_ENTRIES: usize = 1 << SPLIT;
/// Bytes of an L2 table; it is aligned to its size.
pub const L2_BYTES: usize = L2_ENTRIES * STE_BYTES;

/// L1 descriptor Span \[4:0\]: an L2 table of 2^(Span - 1) STEs.
const L1_SPAN: u64 = SPLIT as u64 + 1;
/// L1 descriptor L2Ptr \[51:6\].
const L1_L2PTR_MASK: u64 = 0x000f_ffff_ffff_ffc0;

/// The L1 descriptor of an L2 table at `l2_pa` (aligned to [`L2_BYTES`]).
/// A zero descriptor (Span 0) has no L2 table: the SMMU treats the
/// streams it covers as having invalid STEs (`C_BAD_STE`).
pub const fn l1_descriptor(l2_pa: u64) -> u64 {
    l2_pa & L1_L2PTR_MASK | L1_SPAN
}

/// The L1 descriptor's L2 table address, if it is valid (Span != 0).
pub const fn l1_l2_table(desc: u64) -> Option<u64> {
    if desc & 0x1f == 0 {
        None
    } else {
        Some(desc & L1_L2PTR_MASK)
    }
}

/// Which L1 descriptor covers `sid`.
pub const fn l1_index(sid: u32) -> usize {
    (sid >> SPLIT) as usize
}

/// Which STE of its L2 table is `sid`'s.
pub const fn l2_index(sid: u32) -> usize {
    (sid as usize) & (L2_ENTRIES - 1)
}

/// L1 descriptors for `sid_bits` StreamID bits (at least one).
pub const fn l1_entries(sid_bits: u32) -> usize {
    1 << sid_bits.saturating_sub(SPLIT)
}

/// Bytes of the L1 table; the SMMU reads it aligned to the larger of 64
/// bytes and its size, so the driver allocates it so aligned.
pub const fn l1_table_bytes(sid_bits: u32) -> usize {
    let b = l1_entries(sid_bits) * 8;
    if b < 64 {
        64
    } else {
        b
    }
}

/// `SMMU_STRTAB_BASE`: RA \[62\] (the SMMU may read-allocate the table in
/// its caches), ADDR \[51:6\].
pub const fn strtab_base(pa: u64) -> u64 {
    1 << 62 | pa & L1_L2PTR_MASK
}

/// The LOG2SIZE to program for `sid_bits` StreamID bits: at least
/// [`SPLIT`], so that a small SMMU still has one whole L1 descriptor (the
/// SMMU itself rejects StreamIDs beyond `IDR1.SIDSIZE`).
pub const fn strtab_log2size(sid_bits: u32) -> u32 {
    if sid_bits < SPLIT {
        SPLIT
    } else {
        sid_bits
    }
}

/// `SMMU_STRTAB_BASE_CFG` for a two-level table covering `log2size`
/// StreamID bits ([`strtab_log2size`]): FMT \[17:16\] = 0b01, SPLIT
/// \[10:6\], LOG2SIZE \[5:0\].
pub const fn strtab_base_cfg_2level(log2size: u32) -> u32 {
    0b01 << 16 | SPLIT << 6 | log2size & 0x3f
}
