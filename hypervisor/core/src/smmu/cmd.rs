//! Command queue records (IHI 0070, "Commands"): 16 bytes, two
//! little-endian doublewords, the opcode in DW0 \[7:0\].
//!
//! Fields used (DW = doubleword):
//! * `CFGI_STE` (0x03): DW0 \[63:32\] StreamID, DW1 \[0\] Leaf
//! * `CFGI_ALL` (`CFGI_STE_RANGE`, 0x04): DW1 \[4:0\] Range = 31 (all)
//! * `TLBI_S12_VMALL` (0x28): DW0 \[47:32\] VMID
//! * `TLBI_NSNH_ALL` (0x30): no fields
//! * `CMD_SYNC` (0x46): DW0 \[13:12\] CS = SIG_NONE, the MSI fields zero
//!
//! [`Command::decode`] is strict: any bit outside the command's fields
//! makes it `None`, so a round trip checks [`Command::encode`] bit for bit.

/// The opcodes.
pub mod opcode {
    pub const CFGI_STE: u8 = 0x03;
    pub const CFGI_STE_RANGE: u8 = 0x04;
    pub const TLBI_S12_VMALL: u8 = 0x28;
    pub const TLBI_NSNH_ALL: u8 = 0x30;
    pub const CMD_SYNC: u8 = 0x46;
}

/// `SMMU_CMDQ_CONS.ERR` codes (valid while `GERROR.CMDQ_ERR` is active).
pub mod cerror {
    /// No error.
    pub const NONE: u8 = 0;
    /// An unknown opcode or a reserved field set.
    pub const ILL: u8 = 1;
    /// An abort fetching the command.
    pub const ABT: u8 = 2;
    /// A `CMD_SYNC` that followed an ATC invalidation which timed out.
    pub const ATC_INV_SYNC: u8 = 3;
}

/// The name of a `CMDQ_CONS.ERR` code.
pub const fn cerror_name(code: u8) -> &'static str {
    match code {
        cerror::NONE => "CERROR_NONE",
        cerror::ILL => "CERROR_ILL",
        cerror::ABT => "CERROR_ABT",
        cerror::ATC_INV_SYNC => "CERROR_ATC_INV_SYNC",
        _ => "CERROR_UNKNOWN",
    }
}

/// CFGI_STE_RANGE's Range for "every StreamID" (2^(31 + 1) streams).
const RANGE_ALL: u64 = 31;

/// Bytes of a command.
pub const CMD_BYTES: usize = 16;

/// The commands the hypervisor issues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Drop the SMMU's cached copy of `sid`'s STE. `leaf`: only the STE,
    /// not the L1 descriptor that leads to it (set when only the STE
    /// changed; clear after installing a new L2 table).
    CfgiSte { sid: u32, leaf: bool },
    /// Drop every cached STE and L1 descriptor.
    CfgiAll,
    /// Drop every TLB entry tagged with `vmid` (stage 1 and 2).
    TlbiS12Vmall { vmid: u16 },
    /// Drop every non-secure, non-hypervisor TLB entry.
    TlbiNsnhAll,
    /// Complete after every earlier command. With CS = SIG_NONE the SMMU
    /// signals nothing: it moves `CMDQ_CONS` past the `CMD_SYNC` only once
    /// the commands before it have completed, so the driver polling
    /// `CMDQ_CONS` learns the same without an interrupt or MSI to set up.
    Sync,
}

impl Command {
    /// The opcode.
    pub const fn opcode(&self) -> u8 {
        match self {
            Command::CfgiSte { .. } => opcode::CFGI_STE,
            Command::CfgiAll => opcode::CFGI_STE_RANGE,
            Command::TlbiS12Vmall { .. } => opcode::TLBI_S12_VMALL,
            Command::TlbiNsnhAll => opcode::TLBI_NSNH_ALL,
            Command::Sync => opcode::CMD_SYNC,
        }
    }

    /// The command's name as the specification spells it.
    pub const fn name(&self) -> &'static str {
        match self {
            Command::CfgiSte { .. } => "CMD_CFGI_STE",
            Command::CfgiAll => "CMD_CFGI_ALL",
            Command::TlbiS12Vmall { .. } => "CMD_TLBI_S12_VMALL",
            Command::TlbiNsnhAll => "CMD_TLBI_NSNH_ALL",
            Command::Sync => "CMD_SYNC",
        }
    }

    /// The command's two doublewords.
    pub const fn encode(&self) -> [u64; 2] {
        let op = self.opcode() as u64;
        match *self {
            Command::CfgiSte { sid, leaf } => [op | (sid as u64) << 32, leaf as u64],
            Command::CfgiAll => [op, RANGE_ALL],
            Command::TlbiS12Vmall { vmid } => [op | (vmid as u64) << 32, 0],
            Command::TlbiNsnhAll | Command::Sync => [op, 0],
        }
    }

    /// The command `raw` holds, if it is one of [`Command`]'s exactly
    /// (no other bit set; `CFGI_STE_RANGE` only with Range = 31).
    pub const fn decode(raw: [u64; 2]) -> Option<Command> {
        const OP: u64 = 0xff;
        let [d0, d1] = raw;
        let (cmd, used) = match (d0 & OP) as u8 {
            opcode::CFGI_STE => {
                (Command::CfgiSte { sid: (d0 >> 32) as u32, leaf: d1 & 1 != 0 }, [OP | 0xffff_ffff << 32, 1])
            }
            opcode::CFGI_STE_RANGE if d1 == RANGE_ALL => (Command::CfgiAll, [OP, RANGE_ALL]),
            opcode::TLBI_S12_VMALL => (Command::TlbiS12Vmall { vmid: (d0 >> 32) as u16 }, [OP | 0xffff << 32, 0]),
            opcode::TLBI_NSNH_ALL => (Command::TlbiNsnhAll, [OP, 0]),
            opcode::CMD_SYNC => (Command::Sync, [OP, 0]),
            _ => return None,
        };
        if d0 & !used[0] != 0 || d1 & !used[1] != 0 {
            return None;
        }
        Some(cmd)
    }
}
