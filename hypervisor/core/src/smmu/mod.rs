//! The SMMUv3 model (Arm IHI 0070): register layouts, the structures the
//! SMMU reads from memory and the decisions around them, as plain Rust so
//! the host tests them. The EL2 driver does the MMIO accesses and the
//! allocations; everything it writes is built here.
//!
//! - `ste`: Stream Table Entries (abort, bypass, stage-2 translate) and the
//!   two-level stream table (L1 descriptors, `STRTAB_BASE[_CFG]`)
//! - `cmd`: command queue records (`CFGI_*`, `TLBI_*`, `CMD_SYNC`) and the
//!   `CMDQ_CONS.ERR` codes
//! - `queue`: queue pointers (index + wrap bit), `*Q_BASE` values, queue sizes
//! - `event`: event queue records and the fault policy (`FaultLog`)
//!
//! This module holds the register offsets, the `CR0`/`CR1`/`CR2`/`GBPA`/
//! `IRQ_CTRL` values, [`Features`] (what `SMMU_IDR0/1/5` advertise) and
//! `SMMU_GERROR` decoding.

pub mod cmd;
pub mod event;
pub mod queue;
pub mod ste;
#[cfg(test)]
mod tests;

pub use cmd::Command;
pub use event::{Event, EventKind, FaultAction, FaultLog};
pub use queue::{clamp_log2, queue_base, QueuePtrs, CMDQ_LOG2, EVENTQ_LOG2};
pub use ste::{ste_abort, ste_bypass, ste_stage2, S2Config, Ste};

use core::fmt;

// Register offsets from the SMMU's base (page 0 unless said otherwise).
pub const IDR0: usize = 0x0;
pub const IDR1: usize = 0x4;
pub const IDR5: usize = 0x14;
pub const CR0: usize = 0x20;
pub const CR0ACK: usize = 0x24;
pub const CR1: usize = 0x28;
pub const CR2: usize = 0x2c;
pub const GBPA: usize = 0x44;
pub const IRQ_CTRL: usize = 0x50;
pub const IRQ_CTRLACK: usize = 0x54;
pub const GERROR: usize = 0x60;
pub const GERRORN: usize = 0x64;
/// 64-bit.
pub const STRTAB_BASE: usize = 0x80;
pub const STRTAB_BASE_CFG: usize = 0x88;
/// 64-bit.
pub const CMDQ_BASE: usize = 0x90;
pub const CMDQ_PROD: usize = 0x98;
pub const CMDQ_CONS: usize = 0x9c;
/// 64-bit.
pub const EVENTQ_BASE: usize = 0xa0;
/// Page 1: the event queue's pointers live in the second 64 KiB page.
pub const EVENTQ_PROD: usize = 0x100a8;
/// Page 1.
pub const EVENTQ_CONS: usize = 0x100ac;
/// The register frame the driver maps: pages 0 and 1.
pub const MMIO_SIZE: usize = 0x2_0000;

/// `SMMU_CR0` (and `CR0ACK`, which echoes it once the change took effect).
pub mod cr0 {
    pub const SMMUEN: u32 = 1 << 0;
    pub const EVENTQEN: u32 = 1 << 2;
    pub const CMDQEN: u32 = 1 << 3;
}

/// `SMMU_IRQ_CTRL` (and `IRQ_CTRLACK`).
pub mod irq_ctrl {
    pub const GERROR_IRQEN: u32 = 1 << 0;
    pub const EVENTQ_IRQEN: u32 = 1 << 2;
}

/// `SMMU_GBPA`: what happens to traffic while `CR0.SMMUEN` = 0. A write
/// sets UPDATE; the SMMU clears it once the new value is in effect.
pub mod gbpa {
    pub const UPDATE: u32 = 1 << 31;
    pub const ABORT: u32 = 1 << 20;
}

/// `SMMU_CR1` field values: Shareability and Cacheability encodings.
const CR1_NC: u32 = 0b00;
const CR1_WB: u32 = 0b01;
const CR1_ISH: u32 = 0b11;

/// `SMMU_CR1`: the attributes of the SMMU's own accesses to the stream
/// table (TABLE_IC \[7:6\], TABLE_OC \[9:8\], TABLE_SH \[11:10\]) and the
/// queues (QUEUE_IC \[1:0\], QUEUE_OC \[3:2\], QUEUE_SH \[5:4\]). A coherent
/// SMMU (`IDR0.COHACC`) snoops the CPUs' caches, so inner-shareable
/// write-back matches how the CPUs map that memory; otherwise the accesses
/// are non-cacheable and the driver cleans what it writes to the PoC.
pub const fn cr1_value(coherent: bool) -> u32 {
    let (ic, oc, sh) = if coherent { (CR1_WB, CR1_WB, CR1_ISH) } else { (CR1_NC, CR1_NC, CR1_NC) };
    let attrs = ic | oc << 2 | sh << 4;
    attrs | attrs << 6
}

/// `SMMU_CR2`.
pub mod cr2 {
    /// E2H = 0: no EL2-E2H (host) stage-1 contexts; streams are NS-EL1
    /// stage-2 only.
    pub const E2H: u32 = 1 << 0;
    /// RECINVSID = 1: a StreamID beyond the stream table is recorded as
    /// `C_BAD_STREAMID`, so a misdescribed device shows up in the log
    /// instead of being aborted silently.
    pub const RECINVSID: u32 = 1 << 1;
    /// PTM = 1: the SMMU ignores the CPUs' broadcast TLB invalidations; the
    /// hypervisor invalidates its stage-2 entries itself (`TLBI_S12_VMALL`)
    /// and guests' TLBIs would only cost the SMMU needless misses.
    pub const PTM: u32 = 1 << 2;
    /// The value the driver writes: RECINVSID | PTM, E2H clear.
    pub const VALUE: u32 = RECINVSID | PTM;
}

/// `SMMU_GERROR` bits, in bit order (bit 1 is reserved).
const GERROR_NAMES: [(u32, &str); 8] = [
    (0, "CMDQ_ERR"),
    (2, "EVENTQ_ABT_ERR"),
    (3, "PRIQ_ABT_ERR"),
    (4, "MSI_CMDQ_ABT_ERR"),
    (5, "MSI_EVENTQ_ABT_ERR"),
    (6, "MSI_PRIQ_ABT_ERR"),
    (7, "MSI_GERROR_ABT_ERR"),
    (8, "SFM_ERR"),
];
/// `SMMU_GERROR.CMDQ_ERR`: `CMDQ_CONS.ERR` says why.
pub const GERROR_CMDQ_ERR: u32 = 1 << 0;
/// `SMMU_GERROR.SFM_ERR`: the SMMU entered Service Failure Mode.
pub const GERROR_SFM_ERR: u32 = 1 << 8;

/// The global errors that are active: a `GERROR` bit is active while it
/// differs from the same `GERRORN` bit; the driver acknowledges by writing
/// `GERRORN` = `GERROR`.
pub const fn gerror_active(gerror: u32, gerrorn: u32) -> u32 {
    gerror ^ gerrorn
}

/// The names of the errors in `bits` (from [`gerror_active`]), in bit
/// order; a set bit the specification does not define is `"RESERVED"`.
pub fn gerror_names(bits: u32) -> impl Iterator<Item = &'static str> {
    (0..32u32)
        .filter(move |b| bits & (1 << b) != 0)
        .map(|b| GERROR_NAMES.iter().find(|(bit, _)| *bit == b).map_or("RESERVED", |(_, name)| name))
}

/// Why the SMMU cannot be used, or an operation on it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmmuError {
    /// `IDR0.S2P` = 0: no stage-2 translation.
    NoStage2,
    /// `IDR0.TTF` lacks AArch64 translation tables.
    NoAArch64Tables,
    /// `IDR5.GRAN4K` = 0: the stage-2 tables use the 4 KiB granule.
    No4kGranule,
    /// `IDR0.ST_LEVEL` has no two-level stream table.
    NoTwoLevel,
    /// A StreamID beyond `IDR1.SIDSIZE`.
    StreamOutOfRange { sid: u32 },
    /// A stage-2 configuration no STE can express (IPA size, start level,
    /// output size or root alignment).
    BadS2Config,
    /// `CR0ACK`/`IRQ_CTRLACK`/`GBPA.UPDATE` did not follow the write in time.
    AckTimeout,
    /// The command queue did not drain in time.
    CmdqTimeout,
    /// The command queue stopped on an error (`CMDQ_CONS.ERR`).
    CmdqError { code: u8 },
    /// The tables or queues could not be allocated.
    OutOfMemory,
    /// No SMMU was brought up at that index.
    NotUp,
}

impl fmt::Display for SmmuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SmmuError::NoStage2 => write!(f, "SMMU has no stage-2 translation"),
            SmmuError::NoAArch64Tables => write!(f, "SMMU has no AArch64 translation tables"),
            SmmuError::No4kGranule => write!(f, "SMMU has no 4 KiB translation granule"),
            SmmuError::NoTwoLevel => write!(f, "SMMU has no two-level stream table"),
            SmmuError::StreamOutOfRange { sid } => write!(f, "StreamID {sid:#x} out of range"),
            SmmuError::BadS2Config => write!(f, "stage-2 configuration not expressible in an STE"),
            SmmuError::AckTimeout => write!(f, "SMMU register update not acknowledged"),
            SmmuError::CmdqTimeout => write!(f, "SMMU command queue timed out"),
            SmmuError::CmdqError { code } => {
                write!(f, "SMMU command queue error {code:#x} ({})", cmd::cerror_name(*code))
            }
            SmmuError::OutOfMemory => write!(f, "out of memory for SMMU tables"),
            SmmuError::NotUp => write!(f, "no SMMU is up there"),
        }
    }
}

/// What the SMMU supports, from `SMMU_IDR0`, `SMMU_IDR1` and `SMMU_IDR5`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// IDR0.S1P \[1\]: stage-1 translation.
    pub s1p: bool,
    /// IDR0.S2P \[0\]: stage-2 translation.
    pub s2p: bool,
    /// IDR0.ST_LEVEL \[28:27\] = 0b01: two-level stream tables.
    pub two_level: bool,
    /// IDR0.VMID16 \[18\]: 16-bit VMIDs (else 8).
    pub vmid16: bool,
    /// IDR0.COHACC \[4\]: table and queue accesses are cache coherent.
    pub coherent: bool,
    /// IDR0.TTF \[3:2\] includes AArch64 (0b10 or 0b11).
    pub ttf_aarch64: bool,
    /// IDR0.MSI \[13\]: MSI interrupts.
    pub msi: bool,
    /// IDR1.SIDSIZE \[5:0\]: StreamID bits.
    pub sid_bits: u32,
    /// IDR1.CMDQS \[25:21\]: log2 of the command queue's maximum entries.
    pub cmdq_log2: u32,
    /// IDR1.EVENTQS \[20:16\]: log2 of the event queue's maximum entries.
    pub eventq_log2: u32,
    /// IDR5.OAS \[2:0\] in bits.
    pub oas_bits: u32,
    /// IDR5.GRAN4K \[4\]: the 4 KiB translation granule.
    pub gran4k: bool,
}

const fn bit(v: u32, b: u32) -> bool {
    v >> b & 1 != 0
}
const fn field(v: u32, lo: u32, width: u32) -> u32 {
    v >> lo & ((1 << width) - 1)
}

impl Features {
    /// Decodes the ID registers. An OAS encoding the model does not know
    /// (reserved, or 52 bits, which needs the 52-bit table format) is taken
    /// as 48 bits: the stage-2 tables never output more.
    pub const fn decode(idr0: u32, idr1: u32, idr5: u32) -> Features {
        // IDR5.OAS uses ID_AA64MMFR0_EL1.PARange's encoding.
        let oas_bits = crate::stage2::pa_bits(field(idr5, 0, 3) as u64);
        Features {
            s1p: bit(idr0, 1),
            s2p: bit(idr0, 0),
            two_level: field(idr0, 27, 2) == 0b01,
            vmid16: bit(idr0, 18),
            coherent: bit(idr0, 4),
            ttf_aarch64: field(idr0, 2, 2) & 0b10 != 0,
            msi: bit(idr0, 13),
            sid_bits: field(idr1, 0, 6),
            cmdq_log2: field(idr1, 21, 5),
            eventq_log2: field(idr1, 16, 5),
            oas_bits,
            gran4k: bit(idr5, 4),
        }
    }

    /// Whether the hypervisor can use this SMMU: stage-2 translation with
    /// AArch64 4 KiB-granule tables (the CPU's stage-2 tables are shared
    /// with it) and a two-level stream table (a linear one for 16-bit
    /// StreamIDs would be 4 MiB of mostly unused STEs).
    pub const fn check_stage2(&self) -> Result<(), SmmuError> {
        if !self.s2p {
            Err(SmmuError::NoStage2)
        } else if !self.ttf_aarch64 {
            Err(SmmuError::NoAArch64Tables)
        } else if !self.gran4k {
            Err(SmmuError::No4kGranule)
        } else if !self.two_level {
            Err(SmmuError::NoTwoLevel)
        } else {
            Ok(())
        }
    }

    /// Whether `sid` is a StreamID this SMMU has.
    pub const fn check_sid(&self, sid: u32) -> Result<(), SmmuError> {
        if self.sid_bits >= 32 || sid >> self.sid_bits == 0 {
            Ok(())
        } else {
            Err(SmmuError::StreamOutOfRange { sid })
        }
    }

    /// The largest VMID the SMMU takes (`IDR0.VMID16`).
    pub const fn max_vmid(&self) -> u16 {
        if self.vmid16 {
            u16::MAX
        } else {
            u8::MAX as u16
        }
    }
}
