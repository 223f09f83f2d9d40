//! The Interrupt Translation Service as the GIC architecture (IHI 0069)
//! defines it: register layouts and the command format.
//!
//! Plain Rust shared by the two sides that speak ITS:
//! * the physical ITS driver (`arch::aarch64::gic::its`) *encodes* commands
//!   into the hardware's command queue and programs the GITS and LPI
//!   registers through the layouts below; its decisions (host LPI
//!   allocation, table layout, what is mapped) are plain Rust in [`host`];
//! * the virtual ITS a guest sees (`vgic::its`) *decodes* the commands the
//!   guest writes into its queue, treating every field as hostile.
//!
//! One definition of each field for both directions keeps them in step, and
//! the round trip `decode(encode(c)) == c` is host-tested for every command.

pub mod cmd;
pub mod host;
#[cfg(test)]
mod tests;
pub mod v4;

use tock_registers::register_bitfields;

/// Size of the ITS control frame (`ITS_base`): GITS_CTLR … GITS_PIDR.
pub const CONTROL_FRAME_SIZE: u64 = 0x1_0000;
/// Size of the translation frame that follows it (GITS_TRANSLATER).
pub const TRANSLATION_FRAME_SIZE: u64 = 0x1_0000;

/// Register offsets in the control frame.
pub mod offset {
    pub const GITS_CTLR: u64 = 0x0000;
    pub const GITS_IIDR: u64 = 0x0004;
    pub const GITS_TYPER: u64 = 0x0008;
    pub const GITS_MPIDR: u64 = 0x0018;
    pub const GITS_STATUSR: u64 = 0x0040;
    pub const GITS_UMSIR: u64 = 0x0048;
    pub const GITS_CBASER: u64 = 0x0080;
    pub const GITS_CWRITER: u64 = 0x0088;
    pub const GITS_CREADR: u64 = 0x0090;
    /// `GITS_BASER<n>` at 0x100 + 8n, n < 8.
    pub const GITS_BASER: u64 = 0x0100;
    pub const GITS_BASER_COUNT: u64 = 8;
    pub const GITS_PIDR2: u64 = 0xFFE8;
    /// GITS_TRANSLATER, relative to the control frame's base.
    pub const GITS_TRANSLATER: u64 = super::CONTROL_FRAME_SIZE + 0x40;
}

/// Bytes in one command of the queue.
pub const COMMAND_SIZE: u64 = 32;
/// GITS_CBASER.Size counts 4 KiB pages.
pub const CBASER_PAGE: u64 = 0x1000;

register_bitfields! {u64,
    /// ITS Control Register (32 bits).
    pub GITS_CTLR [
        /// The ITS is enabled: it translates and processes commands.
        Enabled OFFSET(0) NUMBITS(1) [],
        /// GICv4.1: ITS is in the "in-memory data disabled" state.
        ImDe OFFSET(1) NUMBITS(1) [],
        ITS_Number OFFSET(4) NUMBITS(4) [],
        /// The ITS is disabled and has no outstanding work.
        Quiescent OFFSET(31) NUMBITS(1) []
    ],

    /// ITS Type Register.
    pub GITS_TYPER [
        /// Physical LPIs supported.
        Physical OFFSET(0) NUMBITS(1) [],
        /// Virtual LPIs and direct injection (GICv4).
        Virtual OFFSET(1) NUMBITS(1) [],
        /// Cumulative Collection Tables.
        CCT OFFSET(2) NUMBITS(1) [],
        /// Bytes per ITT entry, minus one.
        ITT_entry_size OFFSET(4) NUMBITS(4) [],
        /// EventID bits supported, minus one.
        IDbits OFFSET(8) NUMBITS(5) [],
        /// DeviceID bits supported, minus one.
        Devbits OFFSET(13) NUMBITS(5) [],
        SEIS OFFSET(18) NUMBITS(1) [],
        /// Physical Target Addresses: RDbase is the redistributor's physical
        /// address (1) or its processor number (0, GICR_TYPER.Processor_Number).
        PTA OFFSET(19) NUMBITS(1) [],
        /// Hardware Collection Count: collections held in the ITS itself.
        HCC OFFSET(24) NUMBITS(8) [],
        /// Collection ID bits, minus one (valid when CIL = 1; else 16 bits).
        CIDbits OFFSET(32) NUMBITS(4) [],
        /// Collection ID Limit: CIDbits is valid.
        CIL OFFSET(36) NUMBITS(1) [],
        /// VMOVP needs no ITSList / sequence handshake across ITSs.
        VMOVP OFFSET(37) NUMBITS(1) [],
        MPAM OFFSET(38) NUMBITS(1) [],
        /// GICv4.1: direct injection of virtual SGIs.
        VSGI OFFSET(39) NUMBITS(1) [],
        /// GICv4.1: VMAPP with Alloc/PTZ.
        VMAPP OFFSET(40) NUMBITS(1) [],
        SVPET OFFSET(41) NUMBITS(2) [],
        nID_bits OFFSET(43) NUMBITS(1) [],
        UMSI OFFSET(44) NUMBITS(1) [],
        UMSIirq OFFSET(45) NUMBITS(1) [],
        INV OFFSET(46) NUMBITS(1) []
    ],

    /// ITS Command Queue Descriptor.
    pub GITS_CBASER [
        Valid OFFSET(63) NUMBITS(1) [],
        InnerCache OFFSET(59) NUMBITS(3) [],
        OuterCache OFFSET(53) NUMBITS(3) [],
        /// Physical address bits [51:12] (the queue is 4 KiB aligned; the
        /// field holds the address itself, not a shifted value).
        Physical_Address OFFSET(12) NUMBITS(40) [],
        Shareability OFFSET(10) NUMBITS(2) [],
        /// Number of 4 KiB pages, minus one.
        Size OFFSET(0) NUMBITS(8) []
    ],

    /// GITS_CWRITER and GITS_CREADR: a byte offset into the queue in
    /// units of commands.
    pub GITS_CQ_OFFSET [
        /// GITS_CREADR.Stalled / GITS_CWRITER.Retry.
        Stalled_Retry OFFSET(0) NUMBITS(1) [],
        /// Offset bits [19:5].
        Offset OFFSET(5) NUMBITS(15) []
    ],

    /// ITS Translation Table Descriptor.
    pub GITS_BASER [
        Valid OFFSET(63) NUMBITS(1) [],
        /// Two-level table: the first level holds 64-bit descriptors of
        /// second-level pages.
        Indirect OFFSET(62) NUMBITS(1) [],
        InnerCache OFFSET(59) NUMBITS(3) [],
        Type OFFSET(56) NUMBITS(3) [
            Unimplemented = 0,
            Devices = 1,
            VPEs = 2,
            Collections = 4
        ],
        OuterCache OFFSET(53) NUMBITS(3) [],
        /// Bytes per entry, minus one (read-only).
        Entry_Size OFFSET(48) NUMBITS(5) [],
        /// Physical address bits [47:12]; with 64 KiB pages bits [15:12]
        /// hold address bits [51:48].
        Physical_Address OFFSET(12) NUMBITS(36) [],
        Shareability OFFSET(10) NUMBITS(2) [],
        Page_Size OFFSET(8) NUMBITS(2) [
            Size4K = 0,
            Size16K = 1,
            Size64K = 2
        ],
        /// Number of pages, minus one.
        Size OFFSET(0) NUMBITS(8) []
    ],

    /// Redistributor LPI Configuration Table base (GICR_PROPBASER).
    pub GICR_PROPBASER [
        OuterCache OFFSET(56) NUMBITS(3) [],
        Physical_Address OFFSET(12) NUMBITS(40) [],
        Shareability OFFSET(10) NUMBITS(2) [],
        InnerCache OFFSET(7) NUMBITS(3) [],
        /// Number of INTID bits, minus one.
        IDbits OFFSET(0) NUMBITS(5) []
    ],

    /// Redistributor LPI Pending Table base (GICR_PENDBASER).
    pub GICR_PENDBASER [
        /// Pending Table Zero: the table is known to be zero (write-only hint).
        PTZ OFFSET(62) NUMBITS(1) [],
        OuterCache OFFSET(56) NUMBITS(3) [],
        /// Physical address bits [51:16] (64 KiB aligned).
        Physical_Address OFFSET(16) NUMBITS(36) [],
        Shareability OFFSET(10) NUMBITS(2) [],
        InnerCache OFFSET(7) NUMBITS(3) []
    ],

    /// GICv4.0 Virtual Redistributor LPI Configuration Table base
    /// (GICR_VPROPBASER, RD_base + 0x20070 on a GICv4 redistributor).
    pub GICR_VPROPBASER [
        OuterCache OFFSET(56) NUMBITS(3) [],
        Physical_Address OFFSET(12) NUMBITS(40) [],
        Shareability OFFSET(10) NUMBITS(2) [],
        InnerCache OFFSET(7) NUMBITS(3) [],
        IDbits OFFSET(0) NUMBITS(5) []
    ],

    /// GICv4.0 Virtual Redistributor LPI Pending Table base (GICR_VPENDBASER).
    pub GICR_VPENDBASER [
        /// The vPE whose pending table this is is resident.
        Valid OFFSET(63) NUMBITS(1) [],
        /// Made non-resident with an enabled vLPI pending (read-only).
        PendingLast OFFSET(61) NUMBITS(1) [],
        /// The redistributor is still parsing the table after Valid 0→1.
        Dirty OFFSET(60) NUMBITS(1) [],
        /// On Valid 1→0 … or 0→1: the pending table is to be (re)read.
        IDAI OFFSET(62) NUMBITS(1) [],
        OuterCache OFFSET(56) NUMBITS(3) [],
        Physical_Address OFFSET(16) NUMBITS(36) [],
        Shareability OFFSET(10) NUMBITS(2) [],
        InnerCache OFFSET(7) NUMBITS(3) []
    ]
}

/// Offsets of the LPI registers in a redistributor's RD_base frame.
pub mod gicr {
    /// GICR_CTLR.EnableLPIs.
    pub const CTLR_ENABLE_LPIS: u32 = 1 << 0;
    pub const GICR_PROPBASER: u64 = 0x0070;
    pub const GICR_PENDBASER: u64 = 0x0078;
    /// GICv4.0 only (RD_base + 0x20070 / 0x20078 with the 256 KiB stride).
    pub const GICR_VPROPBASER: u64 = 0x2_0070;
    pub const GICR_VPENDBASER: u64 = 0x2_0078;
    /// GICR_TYPER.PLPIS: physical LPIs supported.
    pub const TYPER_PLPIS: u64 = 1 << 0;
    /// GICR_TYPER.VLPIS: virtual LPIs and direct injection (GICv4).
    pub const TYPER_VLPIS: u64 = 1 << 1;
}

/// The first LPI INTID.
pub const LPI_BASE: u32 = 8192;

/// LPI configuration table byte: priority in bits \[7:2\], Enable in bit 0
/// (bit 1 is RES1 in GICv3).
pub const fn lpi_config_byte(priority: u8, enabled: bool) -> u8 {
    (priority & 0xfc) | 0b10 | enabled as u8
}

/// vINTID bits of each vPE (GICR_VPROPBASER.IDbits + 1, the virtual pending
/// table's size): the vGIC gives the guest 14 bits, and making a vPE
/// resident rescans the whole pending table, so it stays this small.
pub const VLPI_ID_BITS: u8 = 14;

/// Why a guest mapping change has no physical equivalent.
#[derive(thiserror::Error, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VlpiError {
    /// A vCPU this VM does not have.
    #[error("no vPE for vCPU{0}")]
    NoSuchVcpu(usize),
    /// A vINTID outside the vPE's LPI range (8192 .. 2^14).
    #[error("vINTID {0} outside 8192..{top}", top = 1u32 << VLPI_ID_BITS)]
    BadVintid(u32),
}
