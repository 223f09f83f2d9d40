//! ITS commands: the 32-byte records of the command queue.
//!
//! [`Command::encode`] is what the physical ITS driver writes. Two decoders
//! read commands back:
//! * [`Command::decode_guest`] is what the virtual ITS reads from a guest's
//!   queue: it takes the fields the command defines and ignores its RES0
//!   bits, saying whether any was set. Real ITSs (and KVM's and QEMU's
//!   emulations) ignore them, and guests rely on it: a driver that reuses
//!   queue slots without clearing them leaves stale bits there. Only an
//!   unknown command number is an error.
//! * [`Command::decode`] is strict: a RES0 bit that is set is an error too.
//!   It checks that what [`Command::encode`] writes for the hypervisor's own
//!   commands is exactly the command meant, bit for bit.
//!
//! Field layout (IHI 0069, "ITS commands"), DW = 64-bit doubleword:
//! * DW0 \[7:0\] command number, \[63:32\] DeviceID (VMOVP: \[47:32\] sequence number)
//! * DW1 \[31:0\] EventID, \[63:32\] pINTID (MAPTI), \[4:0\] Size (MAPD),
//!   \[47:32\] vPEID (GICv4 commands), \[15:0\] ITSList (VMOVP)
//! * DW2 \[15:0\] ICID, \[51:16\] RDbase, \[51:8\] ITT address (MAPD), \[63\] Valid,
//!   \[31:0\] vINTID and \[63:32\] doorbell pINTID (VMAPTI)
//! * DW3 \[51:16\] RDbase2 (MOVALL), VPT address (VMAPP), \[4:0\] VPT size

use core::fmt;

/// A collection: a target redistributor for physical LPIs.
pub type Icid = u16;

/// Where a collection or vPE lives: the redistributor's processor number
/// (GITS_TYPER.PTA = 0) or its physical address divided by 64 KiB (PTA = 1).
/// The command field holds bits \[51:16\] in both cases.
pub type RdBase = u64;

/// The command numbers.
pub mod opcode {
    pub const MOVI: u8 = 0x01;
    pub const INT: u8 = 0x03;
    pub const CLEAR: u8 = 0x04;
    pub const SYNC: u8 = 0x05;
    pub const MAPD: u8 = 0x08;
    pub const MAPC: u8 = 0x09;
    pub const MAPTI: u8 = 0x0A;
    pub const MAPI: u8 = 0x0B;
    pub const INV: u8 = 0x0C;
    pub const INVALL: u8 = 0x0D;
    pub const MOVALL: u8 = 0x0E;
    pub const DISCARD: u8 = 0x0F;
    pub const VMOVI: u8 = 0x21;
    pub const VMOVP: u8 = 0x22;
    pub const VSYNC: u8 = 0x25;
    pub const VMAPP: u8 = 0x29;
    pub const VMAPTI: u8 = 0x2A;
    pub const VMAPI: u8 = 0x2B;
    pub const VINVALL: u8 = 0x2D;
}

/// One ITS command with its fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Map DeviceID to an ITT of 2^(`size` + 1) events at `itt_addr`
    /// (256-byte aligned), or unmap it (`valid` = false).
    Mapd { device: u32, size: u8, itt_addr: u64, valid: bool },
    /// Map collection `icid` to a redistributor, or unmap it.
    Mapc { icid: Icid, rdbase: RdBase, valid: bool },
    /// Map (DeviceID, EventID) to LPI `pintid` in collection `icid`.
    Mapti { device: u32, event: u32, pintid: u32, icid: Icid },
    /// MAPTI with pINTID = EventID.
    Mapi { device: u32, event: u32, icid: Icid },
    /// Move an event's LPI to collection `icid`.
    Movi { device: u32, event: u32, icid: Icid },
    /// Make the event's LPI pending, as if the device had written it.
    Int { device: u32, event: u32 },
    /// Clear the event's LPI's pending state.
    Clear { device: u32, event: u32 },
    /// Unmap the event (and clear its pending state).
    Discard { device: u32, event: u32 },
    /// Re-read the configuration of the event's LPI.
    Inv { device: u32, event: u32 },
    /// Re-read the configuration of every LPI of the collection.
    Invall { icid: Icid },
    /// Wait for earlier commands' effects on a redistributor.
    Sync { rdbase: RdBase },
    /// Move every LPI pending on redistributor `from` to `to`.
    Movall { from: RdBase, to: RdBase },
    /// GICv4: map vPE `vpe` to a redistributor with a virtual pending table
    /// of 2^(`vpt_size` + 1) bits at `vpt_addr` (64 KiB aligned), or unmap it.
    Vmapp { vpe: u16, rdbase: RdBase, vpt_addr: u64, vpt_size: u8, valid: bool },
    /// GICv4: map (DeviceID, EventID) to vLPI `vintid` of vPE `vpe`, with a
    /// physical doorbell LPI (1023 = none).
    Vmapti { device: u32, event: u32, vpe: u16, vintid: u32, doorbell: u32 },
    /// GICv4: VMAPTI with vINTID = EventID.
    Vmapi { device: u32, event: u32, vpe: u16, doorbell: u32 },
    /// GICv4: move an event to another vPE (`set_doorbell`: D bit).
    Vmovi { device: u32, event: u32, vpe: u16, set_doorbell: bool, doorbell: u32 },
    /// GICv4: move vPE `vpe` to redistributor `rdbase`.
    Vmovp { sequence: u16, its_list: u16, vpe: u16, rdbase: RdBase },
    /// GICv4: wait for earlier commands' effects on vPE `vpe`.
    Vsync { vpe: u16 },
    /// GICv4: re-read the configuration of every vLPI of vPE `vpe`.
    Vinvall { vpe: u16 },
}

/// Why a command could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandError {
    /// No command has this number.
    UnknownOpcode(u8),
    /// A RES0 field of this command is not zero (doubleword index, the bits).
    ReservedBits { opcode: u8, dw: u8, bits: u64 },
}

/// A command number no ITS has: the only error of [`Command::decode_guest`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownOpcode(pub u8);

impl fmt::Display for UnknownOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown ITS command {:#04x}", self.0)
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommandError::UnknownOpcode(o) => UnknownOpcode(*o).fmt(f),
            CommandError::ReservedBits { opcode, dw, bits } => {
                write!(f, "ITS command {opcode:#04x}: reserved bits {bits:#x} set in doubleword {dw}")
            }
        }
    }
}

const RDBASE_MASK: u64 = 0x000f_ffff_ffff_0000;
const ITT_ADDR_MASK: u64 = 0x000f_ffff_ffff_ff00;
const fn low32(x: u64) -> u32 {
    x as u32
}
const fn high32(x: u64) -> u32 {
    (x >> 32) as u32
}
const fn vpe_of(dw1: u64) -> u16 {
    (dw1 >> 32) as u16
}

/// The used bits of each doubleword, per command: everything else is RES0.
pub(crate) fn used_bits(opcode: u8) -> Option<[u64; 4]> {
    use opcode::*;
    const OP_DEV: u64 = 0xffff_ffff_0000_00ff;
    const OP: u64 = 0xff;
    const EVENT: u64 = 0xffff_ffff;
    const ICID: u64 = 0xffff;
    const VPE: u64 = 0xffff << 32;
    Some(match opcode {
        MOVI => [OP_DEV, EVENT, ICID, 0],
        INT | CLEAR | DISCARD | INV => [OP_DEV, EVENT, 0, 0],
        SYNC => [OP, 0, RDBASE_MASK, 0],
        MAPD => [OP_DEV, 0x1f, ITT_ADDR_MASK | 1 << 63, 0],
        MAPC => [OP, 0, ICID | RDBASE_MASK | 1 << 63, 0],
        MAPTI => [OP_DEV, u64::MAX, ICID, 0],
        MAPI => [OP_DEV, EVENT, ICID, 0],
        INVALL => [OP, 0, ICID, 0],
        MOVALL => [OP, 0, RDBASE_MASK, RDBASE_MASK],
        VMAPP => [OP, VPE, RDBASE_MASK | 1 << 63, RDBASE_MASK | 0x1f],
        VMAPTI => [OP_DEV, EVENT | VPE, u64::MAX, 0],
        VMAPI => [OP_DEV, EVENT | VPE, 0xffff_ffff << 32, 0],
        VMOVI => [OP_DEV, EVENT | VPE, 1 | 0xffff_ffff << 32, 0],
        VMOVP => [OP | 0xffff << 32, 0xffff | VPE, RDBASE_MASK, 0],
        VSYNC | VINVALL => [OP, VPE, 0, 0],
        _ => return None,
    })
}

impl Command {
    /// The command number.
    pub fn opcode(&self) -> u8 {
        use opcode::*;
        match self {
            Command::Mapd { .. } => MAPD,
            Command::Mapc { .. } => MAPC,
            Command::Mapti { .. } => MAPTI,
            Command::Mapi { .. } => MAPI,
            Command::Movi { .. } => MOVI,
            Command::Int { .. } => INT,
            Command::Clear { .. } => CLEAR,
            Command::Discard { .. } => DISCARD,
            Command::Inv { .. } => INV,
            Command::Invall { .. } => INVALL,
            Command::Sync { .. } => SYNC,
            Command::Movall { .. } => MOVALL,
            Command::Vmapp { .. } => VMAPP,
            Command::Vmapti { .. } => VMAPTI,
            Command::Vmapi { .. } => VMAPI,
            Command::Vmovi { .. } => VMOVI,
            Command::Vmovp { .. } => VMOVP,
            Command::Vsync { .. } => VSYNC,
            Command::Vinvall { .. } => VINVALL,
        }
    }

    /// The command's name as the GIC specification spells it.
    pub fn name(&self) -> &'static str {
        name_of(self.opcode()).unwrap_or("?")
    }

    /// The four doublewords of this command. Fields wider than their slot
    /// are truncated to it (a caller's bug, never a guest's input).
    pub fn encode(&self) -> [u64; 4] {
        let op = self.opcode() as u64;
        let dev = |d: u32| op | (d as u64) << 32;
        let rd = |r: RdBase| (r << 16) & RDBASE_MASK;
        let vpe = |v: u16| (v as u64) << 32;
        match *self {
            Command::Mapd { device, size, itt_addr, valid } => {
                [dev(device), (size & 0x1f) as u64, (itt_addr & ITT_ADDR_MASK) | (valid as u64) << 63, 0]
            }
            Command::Mapc { icid, rdbase, valid } => [op, 0, icid as u64 | rd(rdbase) | (valid as u64) << 63, 0],
            Command::Mapti { device, event, pintid, icid } => {
                [dev(device), event as u64 | (pintid as u64) << 32, icid as u64, 0]
            }
            Command::Mapi { device, event, icid } | Command::Movi { device, event, icid } => {
                [dev(device), event as u64, icid as u64, 0]
            }
            Command::Int { device, event }
            | Command::Clear { device, event }
            | Command::Discard { device, event }
            | Command::Inv { device, event } => [dev(device), event as u64, 0, 0],
            Command::Invall { icid } => [op, 0, icid as u64, 0],
            Command::Sync { rdbase } => [op, 0, rd(rdbase), 0],
            Command::Movall { from, to } => [op, 0, rd(from), rd(to)],
            Command::Vmapp { vpe: v, rdbase, vpt_addr, vpt_size, valid } => {
                [op, vpe(v), rd(rdbase) | (valid as u64) << 63, (vpt_addr & RDBASE_MASK) | (vpt_size & 0x1f) as u64]
            }
            Command::Vmapti { device, event, vpe: v, vintid, doorbell } => {
                [dev(device), event as u64 | vpe(v), vintid as u64 | (doorbell as u64) << 32, 0]
            }
            Command::Vmapi { device, event, vpe: v, doorbell } => {
                [dev(device), event as u64 | vpe(v), (doorbell as u64) << 32, 0]
            }
            Command::Vmovi { device, event, vpe: v, set_doorbell, doorbell } => {
                [dev(device), event as u64 | vpe(v), set_doorbell as u64 | (doorbell as u64) << 32, 0]
            }
            Command::Vmovp { sequence, its_list, vpe: v, rdbase } => {
                [op | (sequence as u64) << 32, its_list as u64 | vpe(v), rd(rdbase), 0]
            }
            Command::Vsync { vpe: v } | Command::Vinvall { vpe: v } => [op, vpe(v), 0, 0],
        }
    }

    /// The command in `dw`, or why it is not one: strict, a set RES0 bit
    /// is an error.
    pub fn decode(dw: [u64; 4]) -> Result<Command, CommandError> {
        let op = dw[0] as u8;
        let used = used_bits(op).ok_or(CommandError::UnknownOpcode(op))?;
        for (i, (&w, &u)) in dw.iter().zip(used.iter()).enumerate() {
            if w & !u != 0 {
                return Err(CommandError::ReservedBits { opcode: op, dw: i as u8, bits: w & !u });
            }
        }
        Self::fields(op, dw).ok_or(CommandError::UnknownOpcode(op))
    }

    /// The command in a guest's queue slot `dw`, decoded from the fields
    /// the command defines, and whether any of its RES0 bits was set (and
    /// ignored). Only an unknown command number is an error.
    pub fn decode_guest(dw: [u64; 4]) -> Result<(Command, bool), UnknownOpcode> {
        let op = dw[0] as u8;
        let used = used_bits(op).ok_or(UnknownOpcode(op))?;
        let reserved = dw.iter().zip(used.iter()).any(|(&w, &u)| w & !u != 0);
        let masked = core::array::from_fn(|i| dw[i] & used[i]);
        Ok((Self::fields(op, masked).ok_or(UnknownOpcode(op))?, reserved))
    }

    /// The fields of command `op` from `dw`, whose RES0 bits the caller has
    /// checked or cleared; `None` for an unknown command number.
    fn fields(op: u8, dw: [u64; 4]) -> Option<Command> {
        use opcode::*;
        let device = high32(dw[0]);
        let event = low32(dw[1]);
        let icid = dw[2] as u16;
        let rdbase = (dw[2] & RDBASE_MASK) >> 16;
        let valid = dw[2] >> 63 != 0;
        Some(match op {
            MOVI => Command::Movi { device, event, icid },
            INT => Command::Int { device, event },
            CLEAR => Command::Clear { device, event },
            DISCARD => Command::Discard { device, event },
            INV => Command::Inv { device, event },
            SYNC => Command::Sync { rdbase },
            MAPD => Command::Mapd { device, size: dw[1] as u8 & 0x1f, itt_addr: dw[2] & ITT_ADDR_MASK, valid },
            MAPC => Command::Mapc { icid, rdbase, valid },
            MAPTI => Command::Mapti { device, event, pintid: high32(dw[1]), icid },
            MAPI => Command::Mapi { device, event, icid },
            INVALL => Command::Invall { icid },
            MOVALL => Command::Movall { from: rdbase, to: (dw[3] & RDBASE_MASK) >> 16 },
            VMAPP => Command::Vmapp {
                vpe: vpe_of(dw[1]),
                rdbase,
                vpt_addr: dw[3] & RDBASE_MASK,
                vpt_size: dw[3] as u8 & 0x1f,
                valid,
            },
            VMAPTI => {
                Command::Vmapti { device, event, vpe: vpe_of(dw[1]), vintid: low32(dw[2]), doorbell: high32(dw[2]) }
            }
            VMAPI => Command::Vmapi { device, event, vpe: vpe_of(dw[1]), doorbell: high32(dw[2]) },
            VMOVI => Command::Vmovi {
                device,
                event,
                vpe: vpe_of(dw[1]),
                set_doorbell: dw[2] & 1 != 0,
                doorbell: high32(dw[2]),
            },
            VMOVP => {
                Command::Vmovp { sequence: (dw[0] >> 32) as u16, its_list: dw[1] as u16, vpe: vpe_of(dw[1]), rdbase }
            }
            VSYNC => Command::Vsync { vpe: vpe_of(dw[1]) },
            VINVALL => Command::Vinvall { vpe: vpe_of(dw[1]) },
            _ => return None,
        })
    }

    /// The command as the 32 little-endian bytes of a queue slot.
    pub fn to_bytes(&self) -> [u8; COMMAND_BYTES] {
        let mut b = [0u8; COMMAND_BYTES];
        for (chunk, w) in b.chunks_exact_mut(8).zip(self.encode()) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// The four doublewords of a queue slot's 32 little-endian bytes.
    pub fn words(b: &[u8; COMMAND_BYTES]) -> [u64; 4] {
        let mut dw = [0u64; 4];
        for (w, chunk) in dw.iter_mut().zip(b.chunks_exact(8)) {
            *w = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        }
        dw
    }

    /// Decodes a queue slot's 32 little-endian bytes, strictly.
    pub fn from_bytes(b: &[u8; COMMAND_BYTES]) -> Result<Command, CommandError> {
        Command::decode(Command::words(b))
    }
}

/// Bytes per command.
pub const COMMAND_BYTES: usize = super::COMMAND_SIZE as usize;

/// The specification's name of command number `op`.
pub fn name_of(op: u8) -> Option<&'static str> {
    use opcode::*;
    Some(match op {
        MOVI => "MOVI",
        INT => "INT",
        CLEAR => "CLEAR",
        SYNC => "SYNC",
        MAPD => "MAPD",
        MAPC => "MAPC",
        MAPTI => "MAPTI",
        MAPI => "MAPI",
        INV => "INV",
        INVALL => "INVALL",
        MOVALL => "MOVALL",
        DISCARD => "DISCARD",
        VMOVI => "VMOVI",
        VMOVP => "VMOVP",
        VSYNC => "VSYNC",
        VMAPP => "VMAPP",
        VMAPTI => "VMAPTI",
        VMAPI => "VMAPI",
        VINVALL => "VINVALL",
        _ => return None,
    })
}
