//! The virtual ITS (Interrupt Translation Service) a guest sees: a GICv3 ITS
//! with physical LPIs only, its command queue in guest memory, and the
//! translation of (DeviceID, EventID) into the guest's LPI and target vCPU.
//!
//! # What the guest sees
//!
//! One ITS control frame (64 KiB) at the platform's ITS address, with:
//! * GITS_TYPER: Physical = 1, Virtual = 0 (GICv4 commands are command
//!   errors), PTA = 0 (RDbase is the processor number, the guest's
//!   GICR_TYPER.Processor_Number = vCPU index), ITT entries of 8 bytes,
//!   16 EventID bits, 16 DeviceID bits (PCIe requester IDs, as QEMU's
//!   `msi-map` gives them), CIL = 1 with at least 16 collections (more with
//!   more vCPUs), HCC = 0, SEIS = 0.
//! * GITS_BASER0 = Devices, GITS_BASER1 = Collections, flat only: Indirect
//!   reads 0 whatever is written, so Linux falls back to a flat table. Type
//!   and Entry_Size are read-only; every other field reads back as written
//!   (page sizes 4K/16K/64K, 64K at reset; the reserved encoding reads as 64K), because
//!   Linux checks that its value "sticks". The model keeps its own state
//!   ([`tables`]) and never reads or writes these tables or the ITTs, as the
//!   architecture allows; it only checks that they lie in guest RAM (a table
//!   outside RAM is logged and counted, an ITT outside RAM fails its MAPD).
//! * GITS_CBASER, GITS_CWRITER, GITS_CREADR: the command queue. CBASER and
//!   the BASERs are read-only while the ITS is enabled. Writing CBASER sets
//!   CREADR to 0. GITS_CTLR.Quiescent reads 1 while the ITS is disabled:
//!   commands run synchronously, so it is never busy.
//!
//! # The command queue and errors
//!
//! A CWRITER write (or enabling the ITS with CWRITER ≠ CREADR) runs the
//! commands from CREADR up to CWRITER at once, reading each 32-byte command
//! from guest memory ([`cmdq`]), within a [`WORK_BUDGET`] per access (the
//! rest runs on the next CREADR read). Commands written while the ITS is disabled
//! are not an error: they wait until it is enabled, as the architecture says.
//! With SEIS = 0 the architecture leaves a command error's effect a
//! CONSTRAINED UNPREDICTABLE choice that includes "ignore the command"; the
//! model takes it: a refused command (bad opcode, IDs out of range,
//! unmapped device/event/collection, ...) is skipped, counted by
//! [`CommandFault`], logged once (up to [`LOG_LIMIT`] lines per vITS), and
//! CREADR moves on. Set RES0 bits are not an error: the command is decoded
//! from the fields it defines and carried out, as hardware ITSs do, and
//! counted in [`ItsCounters::reserved_ignored`] (a guest that reuses queue
//! slots without clearing them leaves stale bits there). Errors of the queue itself — CBASER not Valid, the queue
//! not entirely in guest RAM, CWRITER at or beyond the queue size — stall it
//! instead: CREADR.Stalled reads 1 and nothing more runs until the guest
//! writes CWRITER with Retry = 1 or rewrites CBASER. One call runs at most
//! one queue's worth of commands and [`WORK_BUDGET`] work, so it always
//! terminates, and soon.
//!
//! # Who calls what
//!
//! The runtime owns one [`Vits`] per VM that has an ITS, under its own lock
//! taken *before* the vGIC's (the vITS calls into the vGIC through
//! [`LpiSink`]), and calls:
//! * [`Vits::mmio_read`] / [`Vits::mmio_write`] for stage-2 data aborts in
//!   the control frame (a [`VgicError::BadAccessSize`] becomes an abort);
//!   kick the returned [`Kicks`] (a CREADR read can return some too, as it
//!   resumes commands left over by the [`WORK_BUDGET`]);
//! * [`Vits::translate`] when the host LPI that backs a guest (DeviceID,
//!   EventID) fires, then `inject_lpi` on the vGIC.
//!
//! The vITS tells an [`ItsBackend`] about every mapping change: the physical
//! ITS backend keeps a host LPI per guest event, a GICv4 backend (later)
//! turns them into VMAPTI/VMOVI. [`NoBackend`] serves purely emulated use.
//!
//! Guest memory is only ever read (`&impl GuestMemory`): nothing the guest
//! writes into the queue can make the model write anywhere.

pub mod cmdq;
pub mod direct;
pub mod tables;
#[cfg(test)]
mod tests;

use crate::intid::IntId;
use crate::its::cmd::Icid;
use crate::its::{offset, COMMAND_SIZE, GITS_BASER, GITS_CBASER, GITS_CQ_OFFSET, GITS_CTLR, GITS_TYPER};
use crate::vgic::{Kicks, VgicError, MAX_VCPUS};
use crate::virtio::GuestMemory;
use alloc::vec::Vec;
use core::fmt;
use tables::{Tables, DEVICE_ID_BITS, EVENT_ID_BITS, ITT_ENTRY_SIZE, MIN_COLLECTIONS};
use tock_registers::fields::FieldValue;

/// Lines of `log::warn!` per vITS for guest errors; the counters keep counting.
pub const LOG_LIMIT: u64 = 16;
/// Work one register access may spend on commands, in units of one per
/// command plus one per mapped event a command has to visit (MAPC, MOVALL,
/// a MAPD that replaces or removes a device). What is left stays queued and
/// runs on the next GITS_CREADR read or GITS_CWRITER write, as Linux polls
/// CREADR until the ITS has passed its commands. This bounds the time one
/// trap spends at EL2 to a fraction of a millisecond, where a full 1 MiB
/// queue of MAPCs over 8192 mapped events would otherwise take seconds.
pub const WORK_BUDGET: u64 = 1 << 16;

/// GITS_IIDR: the same implementer and product as the vGIC's GICD_IIDR
/// (Arm's JEP106 code 0x43B, product 0x7A), matching no Linux ITS quirk.
pub const GITS_IIDR_VALUE: u32 = crate::vgic::regs::IIDR_VALUE;
/// GITS_PIDR2: ArchRev 3 (GICv3) in bits 7:4, JEDEC-assigned, JEP106 bits.
pub const GITS_PIDR2_VALUE: u32 = 0x3B;
/// Entry size of both GITS_BASER tables (only for read-back; never used).
pub const BASER_ENTRY_SIZE: u64 = 8;

/// The vGIC operations the vITS needs for LPIs, implemented by
/// [`crate::vgic::Vgic`] (and by fakes in tests).
pub trait LpiSink {
    /// Whether vCPU `vcpu`'s redistributor has GICR_CTLR.EnableLPIs set.
    fn lpis_enabled(&self, vcpu: usize) -> bool;
    /// The guest's LPI configuration table of `vcpu`'s redistributor:
    /// (GICR_PROPBASER address, number of configuration bytes, from LPI 8192).
    fn lpi_prop_table(&self, vcpu: usize) -> Option<(u64, u32)>;
    /// Sets one LPI's configuration byte (priority, enable) as INV read it.
    fn set_lpi_config(&mut self, intid: IntId, config: u8) -> Result<Kicks, VgicError>;
    /// Re-reads the whole LPI configuration table of `vcpu` (INVALL).
    fn load_lpi_config(&mut self, mem: &impl GuestMemory, vcpu: usize) -> Result<Kicks, VgicError>;
    /// Makes LPI `intid` pending on `vcpu`.
    fn inject_lpi(&mut self, intid: IntId, vcpu: usize) -> Result<Kicks, VgicError>;
    /// Clears LPI `intid`'s pending state on `vcpu`.
    fn clear_lpi(&mut self, intid: IntId, vcpu: usize) -> Result<(), VgicError>;
    /// Moves LPI `intid`'s pending state from vCPU `from` to `to`.
    fn move_lpi(&mut self, intid: IntId, from: usize, to: usize) -> Result<Kicks, VgicError>;
}

/// Why a backend refused a mapping (the command is then a command error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendError {
    /// No host LPI (or vLPI) is left to back the event.
    NoResources,
    /// The backend cannot take this device (not assigned to the VM, DeviceID
    /// beyond the physical ITS's Devbits, ...).
    BadDevice(u32),
    /// The physical ITS did not complete the command.
    Hardware,
}

/// Where the vITS reports mapping changes, so the host can back them: the
/// physical ITS driver (a host LPI per guest event) or, later, GICv4 direct
/// injection (VMAPTI/VMOVI). Calls come in command order; `map_*` may fail,
/// which refuses the guest's command, so a backend that has nothing to do
/// for a device must return `Ok`. `vcpu` is `None` while the event's
/// collection is unmapped (the event then goes nowhere).
pub trait ItsBackend {
    /// MAPD V=1: DeviceID `device` with 2^`event_bits` EventIDs.
    fn map_device(&mut self, device: u32, event_bits: u8) -> Result<(), BackendError>;
    /// MAPD V=0, or a MAPD replacing a mapping (after `unmap_event` of each event).
    fn unmap_device(&mut self, device: u32);
    /// MAPTI/MAPI: the event becomes guest LPI `vintid` for `vcpu`.
    fn map_event(&mut self, device: u32, event: u32, vintid: IntId, vcpu: Option<usize>) -> Result<(), BackendError>;
    /// DISCARD, or the event's device was unmapped.
    fn unmap_event(&mut self, device: u32, event: u32);
    /// MOVI, or a MAPC changed the vCPU of the event's collection.
    fn move_event(&mut self, device: u32, event: u32, vcpu: Option<usize>);
    /// INV of a mapped event, after the vGIC re-read its configuration byte
    /// (GICv4: the hardware re-reads it too).
    fn inv_event(&mut self, _device: u32, _event: u32, _vcpu: usize) {}
    /// INVALL of a collection on `vcpu`, after the vGIC re-read the table.
    fn invall(&mut self, _vcpu: usize) {}
    /// INT of a mapped event: `true` when the backend made it pending in
    /// hardware (GICv4: a vLPI), so the vGIC must not inject it as well.
    fn int_event(&mut self, _device: u32, _event: u32, _vcpu: usize) -> bool {
        false
    }
    /// CLEAR of a mapped event, after the vGIC cleared its own pending state.
    fn clear_event(&mut self, _device: u32, _event: u32, _vcpu: usize) {}
}

/// The backend of a purely emulated vITS: nothing to back.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoBackend;

impl ItsBackend for NoBackend {
    fn map_device(&mut self, _device: u32, _event_bits: u8) -> Result<(), BackendError> {
        Ok(())
    }
    fn unmap_device(&mut self, _device: u32) {}
    fn map_event(&mut self, _: u32, _: u32, _: IntId, _: Option<usize>) -> Result<(), BackendError> {
        Ok(())
    }
    fn unmap_event(&mut self, _device: u32, _event: u32) {}
    fn move_event(&mut self, _device: u32, _event: u32, _vcpu: Option<usize>) {}
}

macro_rules! faults {
    ($($(#[$m:meta])* $v:ident = $name:literal,)*) => {
        /// Why the vITS refused a command or stalled its queue (one counter each).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum CommandFault { $($(#[$m])* $v,)* }
        impl CommandFault {
            /// Every fault, in counter order.
            pub const ALL: &'static [CommandFault] = &[$(CommandFault::$v,)*];
            /// The counter's name in the stats text.
            pub const fn name(self) -> &'static str {
                match self { $(CommandFault::$v => $name,)* }
            }
        }
    };
}

faults! {
    /// A command number no ITS has.
    UnknownCommand = "unknown_command",
    /// A GICv4 command (VMAPP, VMAPTI, ...) on this GICv3 ITS (Virtual = 0).
    Virtual = "virtual",
    /// DeviceID ≥ 2^Devbits.
    DeviceOutOfRange = "device_out_of_range",
    /// The DeviceID is not mapped (no MAPD).
    DeviceUnmapped = "device_unmapped",
    /// More than `tables::MAX_MAPPED_DEVICES` devices.
    TooManyDevices = "too_many_devices",
    /// MAPD Size + 1 > IDbits.
    IttSize = "itt_size",
    /// The ITT is not entirely in guest RAM.
    IttOutsideRam = "itt_outside_ram",
    /// EventID ≥ 2^(MAPD Size + 1) of its device.
    EventOutOfRange = "event_out_of_range",
    /// The event is not mapped (no MAPTI/MAPI).
    EventUnmapped = "event_unmapped",
    /// MAPTI/MAPI of an event already mapped (DISCARD it first).
    EventMapped = "event_mapped",
    /// More than `tables::MAX_MAPPED_EVENTS` events.
    TooManyEvents = "too_many_events",
    /// pINTID not an LPI the vGIC implements (8192..2^14).
    LpiOutOfRange = "lpi_out_of_range",
    /// ICID ≥ the number of collections.
    IcidOutOfRange = "icid_out_of_range",
    /// The collection is not mapped (no MAPC).
    CollectionUnmapped = "collection_unmapped",
    /// RDbase is no vCPU's processor number.
    RdbaseOutOfRange = "rdbase_out_of_range",
    /// INV of an LPI beyond the redistributor's GICR_PROPBASER.IDbits.
    LpiBeyondPropTable = "lpi_beyond_prop_table",
    /// INV could not read the LPI configuration table.
    PropTableUnreadable = "prop_table_unreadable",
    /// The vGIC refused the LPI operation.
    Vgic = "vgic",
    /// The backend refused the mapping.
    Backend = "backend",
    /// A GITS_BASER was made Valid with its table not entirely in guest RAM
    /// (stored anyway: the model never touches the table).
    TableOutsideRam = "table_outside_ram",
    /// Stall: commands to run while GITS_CBASER.Valid = 0.
    QueueInvalid = "queue_invalid",
    /// Stall: the command queue is not entirely in guest RAM.
    QueueOutsideRam = "queue_outside_ram",
    /// Stall: GITS_CWRITER at or beyond the queue size.
    CwriterOutOfRange = "cwriter_out_of_range",
    /// Stall: a command could not be read from guest memory.
    QueueUnreadable = "queue_unreadable",
    /// MAPD of a DeviceID that is no device of this VM's
    /// ([`VitsConfig::devices`]): its MSIs are another domain's, or nobody's.
    DeviceNotOwned = "device_not_owned",
}

impl CommandFault {
    /// Number of faults (size of [`ItsCounters::errors`]).
    pub const COUNT: usize = Self::ALL.len();

    /// Whether this fault stalls the queue (instead of skipping one command).
    pub const fn stalls(self) -> bool {
        matches!(
            self,
            CommandFault::QueueInvalid
                | CommandFault::QueueOutsideRam
                | CommandFault::CwriterOutOfRange
                | CommandFault::QueueUnreadable
        )
    }
}

/// The physical-LPI commands, in the order the stats text lists them.
pub const COUNTED_COMMANDS: [u8; 12] = {
    use crate::its::cmd::opcode::*;
    [MAPD, MAPC, MAPTI, MAPI, MOVI, INT, CLEAR, DISCARD, INV, INVALL, MOVALL, SYNC]
};

/// The vITS's counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItsCounters {
    /// Commands carried out, by command number (only 0..=0x0F occur: the
    /// others are errors).
    pub commands: [u64; 16],
    /// Refused commands and queue stalls, indexed like [`CommandFault::ALL`].
    pub errors: [u64; CommandFault::COUNT],
    /// LPIs made pending by INT.
    pub int_lpis: u64,
    /// Times the queue stalled.
    pub stalls: u64,
    /// Commands carried out (or refused for another reason) with RES0 bits
    /// set, which were ignored.
    pub reserved_ignored: u64,
}

impl Default for ItsCounters {
    fn default() -> Self {
        ItsCounters { commands: [0; 16], errors: [0; CommandFault::COUNT], int_lpis: 0, stalls: 0, reserved_ignored: 0 }
    }
}

impl ItsCounters {
    /// Commands of number `op` carried out.
    pub fn command(&self, op: u8) -> u64 {
        self.commands.get(usize::from(op)).copied().unwrap_or(0)
    }
    /// Count of fault `f`.
    pub fn error(&self, f: CommandFault) -> u64 {
        CommandFault::ALL.iter().position(|&x| x == f).and_then(|i| self.errors.get(i)).copied().unwrap_or(0)
    }
    /// All faults together.
    pub fn total_errors(&self) -> u64 {
        self.errors.iter().sum()
    }
}

/// Two lines, never starting with `vcpuN.` (so `stats::parse_text` and the
/// bench parser skip them), every counter always present:
/// ```text
/// its: MAPD=1 MAPC=2 MAPTI=3 MAPI=0 MOVI=0 INT=1 CLEAR=0 DISCARD=0 INV=3 INVALL=2 MOVALL=0 SYNC=9 int_lpis=1 stalls=0 errors=0 reserved_ignored=0
/// its.errors: unknown_command=0 virtual=0 ... queue_unreadable=0
/// ```
impl fmt::Display for ItsCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "its:")?;
        for op in COUNTED_COMMANDS {
            write!(f, " {}={}", crate::its::cmd::name_of(op).unwrap_or("?"), self.command(op))?;
        }
        writeln!(
            f,
            " int_lpis={} stalls={} errors={} reserved_ignored={}",
            self.int_lpis,
            self.stalls,
            self.total_errors(),
            self.reserved_ignored
        )?;
        write!(f, "its.errors:")?;
        for (fault, n) in CommandFault::ALL.iter().zip(self.errors.iter()) {
            write!(f, " {}={}", fault.name(), n)?;
        }
        writeln!(f)
    }
}

/// One mapped event, for a backend that replays them (GICv4 setup).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub device: u32,
    pub event: u32,
    pub intid: IntId,
    pub icid: Icid,
    /// The vCPU of the collection, `None` while it is unmapped.
    pub vcpu: Option<usize>,
}

/// Static description of a vITS.
#[derive(Clone, Debug)]
pub struct VitsConfig {
    /// Guest-physical base of the control frame (GITS_TRANSLATER is at +64 KiB + 0x40).
    pub base: u64,
    /// vCPUs of the VM (RDbase 0..nr_vcpus).
    pub nr_vcpus: usize,
    /// Benchmark knob (`dom0_msi_vcpu=`): deliver every LPI to this vCPU,
    /// whatever vCPU the guest mapped the collection to (see
    /// [`Tables::steer_to`](tables::Tables::steer_to)). Must be below `nr_vcpus`.
    pub msi_vcpu: Option<usize>,
    /// The DeviceIDs the VM's devices have (`(first, count)` ranges, from
    /// its bridges' `msi-map`): a MAPD of any other is refused
    /// ([`CommandFault::DeviceNotOwned`]), since the physical ITS would
    /// turn that device's MSIs into this VM's interrupts. `None`: the
    /// description maps no IDs, every DeviceID the vITS implements goes.
    pub devices: Option<Vec<(u32, u32)>>,
}

/// One VM's virtual ITS.
#[derive(Clone, Debug)]
pub struct Vits {
    base: u64,
    nr_vcpus: usize,
    /// log2 of the number of collections.
    cid_bits: u8,
    enabled: bool,
    cbaser: u64,
    /// Byte offsets in the queue (bits [19:5]).
    cwriter: u64,
    creadr: u64,
    stalled: bool,
    baser: [u64; 2],
    tables: Tables,
    counters: ItsCounters,
    logged: u64,
    devices: Option<Vec<(u32, u32)>>,
}

/// Bits of GITS_CBASER the guest can set (the rest is RES0).
const CBASER_WRITABLE: u64 = (1 << 63) | (0b111 << 59) | (0b111 << 53) | 0x000f_ffff_ffff_f000 | (0b11 << 10) | 0xff;
/// Bits of GITS_BASER<n> the guest can set (Indirect, Type, Entry_Size are not).
const BASER_WRITABLE: u64 = (1 << 63) | (0b111 << 59) | (0b111 << 53) | 0x0000_ffff_ffff_f000 | (0b11 << 10) | 0x3ff;
/// GITS_CWRITER/CREADR offset bits [19:5].
const CQ_OFFSET_MASK: u64 = 0x000f_ffe0;

fn check_size(off: u64, size: u8, sizes: &[u8]) -> Result<(), VgicError> {
    if sizes.contains(&size) && off.is_multiple_of(u64::from(size)) {
        Ok(())
    } else {
        Err(VgicError::BadAccessSize)
    }
}

/// A 4- or 8-byte read of the 64-bit register at `base`.
fn read64(reg: u64, base: u64, off: u64, size: u8) -> Result<u64, VgicError> {
    check_size(off, size, &[4, 8])?;
    Ok(match (size, off - base) {
        (8, _) => reg,
        (_, 0) => reg & 0xffff_ffff,
        _ => reg >> 32,
    })
}

/// A 4- or 8-byte write merged into the 64-bit register at `base`.
fn write64(reg: u64, base: u64, off: u64, size: u8, value: u64) -> Result<u64, VgicError> {
    check_size(off, size, &[4, 8])?;
    Ok(match (size, off - base) {
        (8, _) => value,
        (_, 0) => (reg & !0xffff_ffff) | (value & 0xffff_ffff),
        _ => (reg & 0xffff_ffff) | (value << 32),
    })
}

impl Vits {
    /// Whether `device` is one of the VM's (see [`VitsConfig::devices`]).
    pub(super) fn owns_device(&self, device: u32) -> bool {
        self.devices.as_ref().is_none_or(|d| d.iter().any(|&(first, count)| device.wrapping_sub(first) < count))
    }

    /// A disabled vITS with nothing mapped; `nr_vcpus` must be 1..=[`MAX_VCPUS`].
    pub fn new(config: VitsConfig) -> Result<Self, VgicError> {
        if config.nr_vcpus == 0 || config.nr_vcpus > MAX_VCPUS || config.msi_vcpu.is_some_and(|v| v >= config.nr_vcpus)
        {
            return Err(VgicError::OutOfRange);
        }
        let collections = config.nr_vcpus.max(MIN_COLLECTIONS).next_power_of_two();
        let cid_bits = collections.trailing_zeros() as u8;
        // Page_Size resets to 64 KiB, as KVM and QEMU present it; the guest
        // may still write 4K or 16K.
        let baser = |ty: FieldValue<u64, GITS_BASER::Register>| {
            (ty + GITS_BASER::Entry_Size.val(BASER_ENTRY_SIZE - 1) + GITS_BASER::Page_Size::Size64K).value
        };
        Ok(Vits {
            base: config.base,
            nr_vcpus: config.nr_vcpus,
            cid_bits,
            enabled: false,
            cbaser: 0,
            cwriter: 0,
            creadr: 0,
            stalled: false,
            baser: [baser(GITS_BASER::Type::Devices), baser(GITS_BASER::Type::Collections)],
            tables: Tables::new(config.nr_vcpus, collections).steer_to(config.msi_vcpu),
            counters: ItsCounters::default(),
            logged: 0,
            devices: config.devices,
        })
    }

    /// Guest-physical base of the control frame.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Whether `ipa` is in the (trapped) control frame.
    pub fn contains(&self, ipa: u64) -> bool {
        ipa.checked_sub(self.base).is_some_and(|o| o < crate::its::CONTROL_FRAME_SIZE)
    }

    /// vCPUs this vITS serves.
    pub fn nr_vcpus(&self) -> usize {
        self.nr_vcpus
    }

    /// GITS_CTLR.Enabled.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// GITS_CREADR.Stalled.
    pub fn stalled(&self) -> bool {
        self.stalled
    }

    /// The counters.
    pub fn counters(&self) -> &ItsCounters {
        &self.counters
    }

    /// The translation state (read-only).
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    /// The guest LPI and target vCPU of (DeviceID, EventID), as a device's
    /// write of `event` to GITS_TRANSLATER would deliver it; `None` when the
    /// ITS is disabled, the event or its collection is unmapped.
    pub fn translate(&self, device: u32, event: u32) -> Option<(IntId, usize)> {
        if !self.enabled {
            return None;
        }
        let ite = self.tables.event(device, event).ok()?;
        let vcpu = self.tables.collection(ite.icid).ok()??;
        Some((ite.intid, vcpu))
    }

    /// Every mapped event, in DeviceID then EventID order.
    pub fn mappings(&self) -> impl Iterator<Item = Mapping> + '_ {
        self.tables.events().map(|(device, event, ite)| Mapping {
            device,
            event,
            intid: ite.intid,
            icid: ite.icid,
            vcpu: self.tables.collection(ite.icid).ok().flatten(),
        })
    }

    /// GITS_TYPER.
    pub fn typer(&self) -> u64 {
        (GITS_TYPER::Physical::SET
            + GITS_TYPER::ITT_entry_size.val(ITT_ENTRY_SIZE - 1)
            + GITS_TYPER::IDbits.val(u64::from(EVENT_ID_BITS) - 1)
            + GITS_TYPER::Devbits.val(u64::from(DEVICE_ID_BITS) - 1)
            + GITS_TYPER::CIDbits.val(u64::from(self.cid_bits) - 1)
            + GITS_TYPER::CIL::SET)
            .value
    }

    fn ctlr(&self) -> u32 {
        if self.enabled {
            GITS_CTLR::Enabled::SET.value as u32
        } else {
            GITS_CTLR::Quiescent::SET.value as u32
        }
    }

    fn creadr(&self) -> u64 {
        self.creadr | u64::from(self.stalled)
    }

    /// Emulates a guest read of `size` bytes at `ipa` in the control frame.
    /// A GITS_CREADR read first resumes commands an earlier access left
    /// queued (see [`WORK_BUDGET`]), hence the memory, vGIC and backend, and
    /// the returned vCPUs to kick.
    pub fn mmio_read<M: GuestMemory, S: LpiSink, B: ItsBackend>(
        &mut self,
        ipa: u64,
        size: u8,
        mem: &M,
        sink: &mut S,
        backend: &mut B,
    ) -> Result<(u64, Kicks), VgicError> {
        let off = self.frame_offset(ipa)?;
        let mut kicks = Kicks::none();
        if (0x90..=0x97).contains(&off) {
            check_size(off, size, &[4, 8])?;
            kicks = self.process(mem, sink, backend);
        }
        Ok((self.read_register(off, size)?, kicks))
    }

    fn read_register(&self, off: u64, size: u8) -> Result<u64, VgicError> {
        match off {
            offset::GITS_CTLR => check_size(off, size, &[4]).map(|_| u64::from(self.ctlr())),
            offset::GITS_IIDR => check_size(off, size, &[4]).map(|_| u64::from(GITS_IIDR_VALUE)),
            offset::GITS_PIDR2 => check_size(off, size, &[4]).map(|_| u64::from(GITS_PIDR2_VALUE)),
            0x08..=0x0f => read64(self.typer(), 0x08, off, size),
            0x80..=0x87 => read64(self.cbaser, 0x80, off, size),
            0x88..=0x8f => read64(self.cwriter, 0x88, off, size),
            0x90..=0x97 => read64(self.creadr(), 0x90, off, size),
            0x100..=0x10f => read64(self.baser[(off as usize - 0x100) / 8], off & !7, off, size),
            // MPIDR, STATUSR, UMSIR, BASER2..7, other ID registers: RAZ.
            _ => check_size(off, size, &[4, 8]).map(|_| 0),
        }
    }

    /// Emulates a guest write at `ipa`; returns the vCPUs to kick (INT,
    /// INV, MOVI... may make LPIs deliverable).
    pub fn mmio_write<M: GuestMemory, S: LpiSink, B: ItsBackend>(
        &mut self,
        ipa: u64,
        size: u8,
        value: u64,
        mem: &M,
        sink: &mut S,
        backend: &mut B,
    ) -> Result<Kicks, VgicError> {
        let off = self.frame_offset(ipa)?;
        let value = if size == 4 { value & 0xffff_ffff } else { value };
        match off {
            offset::GITS_CTLR => {
                check_size(off, size, &[4])?;
                let was = self.enabled;
                self.enabled = value & GITS_CTLR::Enabled::SET.value != 0;
                if self.enabled && !was {
                    return Ok(self.process(mem, sink, backend));
                }
            }
            0x80..=0x87 => {
                let v = write64(self.cbaser, 0x80, off, size, value)?;
                if !self.enabled {
                    self.cbaser = v & CBASER_WRITABLE;
                    self.creadr = 0;
                    self.stalled = false;
                }
            }
            0x88..=0x8f => {
                let v = write64(self.cwriter, 0x88, off, size, value)?;
                self.cwriter = v & CQ_OFFSET_MASK;
                if v & GITS_CQ_OFFSET::Stalled_Retry::SET.value != 0 {
                    self.stalled = false;
                }
                return Ok(self.process(mem, sink, backend));
            }
            0x100..=0x10f => {
                let i = (off as usize - 0x100) / 8;
                let v = write64(self.baser[i], off & !7, off, size, value)?;
                if !self.enabled {
                    self.write_baser(i, v, mem);
                }
            }
            // GITS_TYPER, IIDR, CREADR, PIDR: read-only; the rest RAZ/WI.
            0x08..=0x0f | 0x90..=0x97 => check_size(off, size, &[4, 8])?,
            offset::GITS_IIDR | offset::GITS_PIDR2 => check_size(off, size, &[4])?,
            _ => check_size(off, size, &[4, 8])?,
        }
        Ok(Kicks::none())
    }

    fn frame_offset(&self, ipa: u64) -> Result<u64, VgicError> {
        match ipa.checked_sub(self.base) {
            Some(off) if off < crate::its::CONTROL_FRAME_SIZE => Ok(off),
            _ => Err(VgicError::OutOfRange),
        }
    }

    fn write_baser<M: GuestMemory>(&mut self, i: usize, value: u64, mem: &M) {
        let Some(reg) = self.baser.get_mut(i) else { return };
        let fixed = *reg & ((0b111 << 56) | (0x1f << 48));
        let mut v = (value & BASER_WRITABLE) | fixed;
        let psz = GITS_BASER::Page_Size.read(v);
        if psz == 3 {
            // The reserved encoding: take 64 KiB, the largest size offered.
            v = GITS_BASER::Page_Size.val(2).modify(v);
        }
        *reg = v;
        if GITS_BASER::Valid.read(v) == 1 {
            let (addr, bytes) = baser_table(v);
            if !mem.contains(addr, bytes) {
                self.fault(CommandFault::TableOutsideRam, format_args!("GITS_BASER{i} table {addr:#x}+{bytes:#x}"));
            }
        }
    }

    /// Counts a fault and logs it (rate-limited). Stalling faults also stall.
    fn fault(&mut self, f: CommandFault, what: fmt::Arguments) {
        if let Some(n) = CommandFault::ALL.iter().position(|&x| x == f).and_then(|i| self.counters.errors.get_mut(i)) {
            *n += 1;
        }
        if f.stalls() {
            self.stalled = true;
            self.counters.stalls += 1;
        }
        if self.logged < LOG_LIMIT {
            self.logged += 1;
            let action = if f.stalls() { "queue stalled" } else { "command ignored" };
            log::warn!("vITS: {} ({what}): {action}", f.name());
        }
    }

    /// Queue geometry from CBASER: (address, bytes), `None` if not Valid.
    fn queue(&self) -> Option<(u64, u64)> {
        if GITS_CBASER::Valid.read(self.cbaser) == 0 {
            return None;
        }
        let addr = self.cbaser & 0x000f_ffff_ffff_f000;
        let bytes = (GITS_CBASER::Size.read(self.cbaser) + 1) * crate::its::CBASER_PAGE;
        Some((addr, bytes))
    }
}

/// The (address, bytes) a Valid GITS_BASER value describes.
fn baser_table(v: u64) -> (u64, u64) {
    let page: u64 = match GITS_BASER::Page_Size.read(v) {
        0 => 0x1000,
        1 => 0x4000,
        _ => 0x1_0000,
    };
    let field = v & 0x0000_ffff_ffff_f000;
    let addr = if page == 0x1_0000 { (field & !0xffff) | ((field & 0xf000) << 36) } else { field };
    (addr, (GITS_BASER::Size.read(v) + 1) * page)
}

/// Bytes per command, as a queue offset step.
const CMD: u64 = COMMAND_SIZE;
