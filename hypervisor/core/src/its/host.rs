//! The physical ITS driver's decisions, in plain Rust so the host tests
//! them: which host LPIs are free, how large an ITT is, how a `GITS_BASER<n>`
//! table is laid out once the ITS has said which page size and format it
//! accepts, and which (DeviceID, EventID) pairs are mapped where.
//!
//! The EL2 driver (`arch::aarch64::gic::its`) does the register writes and
//! the allocations; it asks [`Mappings`] first, so that an unknown device or
//! event, a double map or an out-of-range ID is a typed [`ItsError`] before
//! any command reaches the hardware.

use super::{GITS_BASER, LPI_BASE};
use crate::intid::IntId;
use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::fmt;
use tock_registers::LocalRegisterCopy;

/// INTID bits of the host's LPI space (GICR_PROPBASER.IDbits + 1): LPIs
/// 8192..16383.
pub const HOST_LPI_ID_BITS: u8 = 14;
/// Host LPIs available.
pub const HOST_LPI_COUNT: u32 = (1 << HOST_LPI_ID_BITS) - LPI_BASE;
/// Bytes of the LPI configuration table: one byte per LPI (the table starts
/// at LPI 8192).
pub const PROP_TABLE_BYTES: usize = HOST_LPI_COUNT as usize;
/// Bytes of a pending table: one bit per INTID, the first 1 KiB (INTIDs
/// below 8192) included.
pub const PEND_TABLE_BYTES: usize = (1 << HOST_LPI_ID_BITS) / 8;
/// GICR_PENDBASER wants 64 KiB alignment.
pub const PEND_TABLE_ALIGN: usize = 0x1_0000;
/// The DeviceIDs the driver accepts: PCIe requester IDs are 16 bits.
pub const MAX_DEVICE_ID_BITS: u8 = 16;
/// The command queue: 64 KiB (GITS_CBASER.Size = 15 pages of 4 KiB, + 1).
pub const CMD_QUEUE_BYTES: usize = 0x1_0000;
/// An ITT's alignment (MAPD's ITT_addr holds bits \[51:8\]).
pub const ITT_ALIGN: usize = 256;

/// Why the physical ITS refused or failed an operation.
#[derive(thiserror::Error, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItsError {
    /// There is no usable ITS (none in the DTB, no physical LPIs, or its
    /// setup failed); the hypervisor runs without host LPIs.
    #[error("no usable ITS")]
    NoIts,
    /// A DeviceID beyond the bits the driver supports.
    #[error("DeviceID {0:#x} out of range")]
    DeviceOutOfRange(u32),
    /// An EventID beyond the device's ITT.
    #[error("EventID {event:#x} beyond the ITT of DeviceID {device:#x}")]
    EventOutOfRange { device: u32, event: u32 },
    /// ITT size in EventID bits: must be 1..= GITS_TYPER.IDbits + 1.
    #[error("ITT of {0} EventID bits not supported")]
    EventBits(u8),
    /// The device is mapped already.
    #[error("DeviceID {0:#x} already mapped")]
    DeviceMapped(u32),
    /// The device is not mapped.
    #[error("DeviceID {0:#x} not mapped")]
    UnknownDevice(u32),
    /// The event is mapped already.
    #[error("DeviceID {device:#x} EventID {event:#x} already mapped")]
    EventMapped { device: u32, event: u32 },
    /// The event is not mapped.
    #[error("DeviceID {device:#x} EventID {event:#x} not mapped")]
    UnknownEvent { device: u32, event: u32 },
    /// All host LPIs are in use.
    #[error("no free host LPI")]
    NoFreeLpi,
    /// An LPI the allocator did not hand out.
    #[error("LPI {0} was not allocated")]
    LpiNotAllocated(u32),
    /// A pCPU without a collection.
    #[error("pCPU {0} has no collection")]
    BadPcpu(usize),
    /// The heap could not give a table.
    #[error("out of memory for an ITS table")]
    OutOfMemory,
    /// The ITS accepts none of the page sizes for a `GITS_BASER<n>`, or the
    /// table does not fit its Size field.
    #[error("ITS table: {0}")]
    Table(&'static str),
    /// More commands than the queue holds.
    #[error("{0} commands do not fit the queue")]
    QueueOverflow(usize),
    /// CREADR did not reach CWRITER in the bounded wait.
    #[error("command queue timeout (CREADR {creadr:#x}, CWRITER {cwriter:#x})")]
    Timeout { creadr: u32, cwriter: u32 },
    /// GITS_CREADR.Stalled: the ITS stopped at a command error.
    #[error("command queue stalled at {creadr:#x}")]
    Stalled { creadr: u32 },
    /// GICv4: the change names no vPE of this VM, or a bad vINTID.
    #[error("{0}")]
    Vlpi(super::VlpiError),
    /// GICv4: direct injection is not set up (the emulated path is in use).
    #[error("no GICv4 direct injection")]
    NoVlpis,
    /// GICR_VPENDBASER.Dirty stayed set in the bounded wait.
    #[error("pCPU {pcpu}: GICR_VPENDBASER.Dirty never cleared")]
    VpeDirty { pcpu: usize },
}

/// The host LPIs 8192..16383 as a bitmap.
pub struct LpiAllocator {
    used: [u64; HOST_LPI_COUNT as usize / 64],
    in_use: u32,
}

impl Default for LpiAllocator {
    fn default() -> Self {
        Self::new()
    }
}

impl LpiAllocator {
    pub const fn new() -> Self {
        Self { used: [0; HOST_LPI_COUNT as usize / 64], in_use: 0 }
    }

    /// The lowest free LPI, now taken.
    pub fn alloc(&mut self) -> Result<IntId, ItsError> {
        let (w, word) = self.used.iter_mut().enumerate().find(|(_, w)| **w != u64::MAX).ok_or(ItsError::NoFreeLpi)?;
        let bit = word.trailing_ones();
        *word |= 1 << bit;
        self.in_use += 1;
        IntId::lpi(w as u32 * 64 + bit).map_err(|_| ItsError::NoFreeLpi)
    }

    /// Gives `lpi` back; an LPI that is not ours or not taken is refused.
    pub fn free(&mut self, lpi: IntId) -> Result<(), ItsError> {
        let raw = u32::from(lpi);
        let n = raw.checked_sub(LPI_BASE).filter(|&n| n < HOST_LPI_COUNT).ok_or(ItsError::LpiNotAllocated(raw))?;
        let word = &mut self.used[n as usize / 64];
        let mask = 1u64 << (n % 64);
        if *word & mask == 0 {
            return Err(ItsError::LpiNotAllocated(raw));
        }
        *word &= !mask;
        self.in_use -= 1;
        Ok(())
    }

    /// LPIs handed out and not freed.
    pub fn in_use(&self) -> u32 {
        self.in_use
    }
}

/// Bytes of an ITT for 2^`event_bits` events of `entry_size` bytes
/// (GITS_TYPER.ITT_entry_size + 1), rounded up to its 256-byte alignment.
pub fn itt_bytes(event_bits: u8, entry_size: u8) -> usize {
    let raw = (1usize << event_bits).saturating_mul(usize::from(entry_size.max(1)));
    raw.div_ceil(ITT_ALIGN).max(1) * ITT_ALIGN
}

/// A `GITS_BASER<n>` page size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageSize {
    K4,
    K16,
    K64,
}

impl PageSize {
    /// Largest first: fewer pages for the Size field, as Linux tries them.
    pub const ALL: [PageSize; 3] = [PageSize::K64, PageSize::K16, PageSize::K4];

    pub const fn bytes(self) -> u64 {
        match self {
            PageSize::K4 => 0x1000,
            PageSize::K16 => 0x4000,
            PageSize::K64 => 0x1_0000,
        }
    }

    /// The GITS_BASER.Page_Size encoding.
    pub const fn field(self) -> u64 {
        match self {
            PageSize::K4 => 0,
            PageSize::K16 => 1,
            PageSize::K64 => 2,
        }
    }
}

/// Finds a page size the ITS accepts for one `GITS_BASER<n>`:
/// `write_read(value)` writes `value` (Valid = 0) and returns what reads
/// back. `base` holds the type, attributes and, when wanted, Indirect.
pub fn probe_page_size(base: u64, mut write_read: impl FnMut(u64) -> u64) -> Option<PageSize> {
    PageSize::ALL.into_iter().find(|&p| {
        let mut v = LocalRegisterCopy::<u64, GITS_BASER::Register>::new(base);
        v.modify(GITS_BASER::Valid::CLEAR + GITS_BASER::Page_Size.val(p.field()));
        let back = LocalRegisterCopy::<u64, GITS_BASER::Register>::new(write_read(v.get()));
        back.read(GITS_BASER::Page_Size) == p.field()
    })
}

/// How one Device or Collection table is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TablePlan {
    pub page: PageSize,
    /// Two-level: the allocation is the first level (64-bit descriptors),
    /// each naming one second-level page of `ids_per_page` entries.
    pub indirect: bool,
    /// Bytes of the (first-level) allocation: a whole number of pages.
    pub bytes: u64,
    /// IDs one second-level page covers (indirect only).
    pub ids_per_page: u64,
}

impl TablePlan {
    /// GITS_BASER.Size: pages minus one.
    pub fn size_field(&self) -> u64 {
        self.bytes / self.page.bytes() - 1
    }

    /// The first-level slot of `id` (indirect tables).
    pub fn l1_index(&self, id: u32) -> usize {
        (u64::from(id) / self.ids_per_page.max(1)) as usize
    }
}

/// Lays out a table of 2^`id_bits` entries of `entry_size` bytes on `page`:
/// flat when that fits one page or the ITS has no two-level support
/// (`indirect_ok`), else two-level. Either must fit the 8-bit Size field.
pub fn plan_table(entry_size: u64, id_bits: u8, page: PageSize, indirect_ok: bool) -> Result<TablePlan, ItsError> {
    if entry_size == 0 || id_bits > 32 {
        return Err(ItsError::Table("zero entry size or too many ID bits"));
    }
    let ps = page.bytes();
    let ids = 1u64 << id_bits;
    let flat = (ids * entry_size).div_ceil(ps) * ps;
    let (indirect, bytes, ids_per_page) = if flat > ps && indirect_ok {
        let per_page = (ps / entry_size).max(1);
        let l1 = ids.div_ceil(per_page) * 8;
        (true, l1.div_ceil(ps) * ps, per_page)
    } else {
        (false, flat, 0)
    };
    if bytes / ps > 256 {
        return Err(ItsError::Table("larger than 256 pages"));
    }
    Ok(TablePlan { page, indirect, bytes, ids_per_page })
}

/// A first-level descriptor of a two-level table: Valid and the address of
/// the second-level page.
pub const fn l1_descriptor(page_pa: u64) -> u64 {
    (1 << 63) | (page_pa & 0x000F_FFFF_FFFF_F000)
}

/// Where the command queue stands after a GITS_CWRITER write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueProgress {
    /// GITS_CREADR reached GITS_CWRITER: every command ran.
    Done,
    /// Still working.
    Busy,
    /// GITS_CREADR.Stalled: stopped at the command at this offset.
    Stalled(u32),
}

/// Reads GITS_CREADR (`creadr`, raw) against the offset written to
/// GITS_CWRITER.
pub fn queue_progress(creadr: u64, cwriter: u32) -> QueueProgress {
    let r = LocalRegisterCopy::<u64, super::GITS_CQ_OFFSET::Register>::new(creadr);
    let at = (r.read(super::GITS_CQ_OFFSET::Offset) << 5) as u32;
    if r.is_set(super::GITS_CQ_OFFSET::Stalled_Retry) {
        QueueProgress::Stalled(at)
    } else if at == cwriter {
        QueueProgress::Done
    } else {
        QueueProgress::Busy
    }
}

/// One mapped event: its host LPI and the collection (= pCPU) it targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventMap {
    pub lpi: IntId,
    pub pcpu: usize,
}

/// One mapped device: its ITT (address and bytes, for freeing) and events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceMap {
    pub itt: u64,
    pub itt_bytes: usize,
    pub event_bits: u8,
    pub events: BTreeMap<u32, EventMap>,
}

/// One event mapped to a vLPI of a vPE (GICv4 VMAPTI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VEventMap {
    pub vpe: u16,
    pub vintid: u32,
}

/// What the driver has mapped in the ITS, checked before every command.
pub struct Mappings {
    devices: BTreeMap<u32, DeviceMap>,
    /// Events mapped to vLPIs, by (DeviceID, EventID); their devices are in
    /// `devices`.
    vevents: BTreeMap<(u32, u32), VEventMap>,
    device_bits: u8,
    max_event_bits: u8,
    cpus: usize,
}

impl Mappings {
    /// DeviceIDs below 2^`device_bits`, ITTs up to 2^`max_event_bits`
    /// events, collections for pCPUs below `cpus`.
    pub const fn new(device_bits: u8, max_event_bits: u8, cpus: usize) -> Self {
        Self { devices: BTreeMap::new(), vevents: BTreeMap::new(), device_bits, max_event_bits, cpus }
    }

    pub fn device_bits(&self) -> u8 {
        self.device_bits
    }

    /// Whether MAPD of `device` with 2^`event_bits` events may be sent.
    pub fn check_new_device(&self, device: u32, event_bits: u8) -> Result<(), ItsError> {
        if u64::from(device) >> self.device_bits != 0 {
            return Err(ItsError::DeviceOutOfRange(device));
        }
        if event_bits == 0 || event_bits > self.max_event_bits {
            return Err(ItsError::EventBits(event_bits));
        }
        if self.devices.contains_key(&device) {
            return Err(ItsError::DeviceMapped(device));
        }
        Ok(())
    }

    /// Records a device MAPD mapped.
    pub fn add_device(&mut self, device: u32, event_bits: u8, itt: u64, itt_bytes: usize) -> Result<(), ItsError> {
        self.check_new_device(device, event_bits)?;
        self.devices.insert(device, DeviceMap { itt, itt_bytes, event_bits, events: BTreeMap::new() });
        Ok(())
    }

    /// Forgets a device; its events (whose LPIs the caller frees) come back.
    /// Its vLPI events are forgotten with it.
    pub fn remove_device(&mut self, device: u32) -> Result<DeviceMap, ItsError> {
        let d = self.devices.remove(&device).ok_or(ItsError::UnknownDevice(device))?;
        self.vevents.retain(|&(dev, _), _| dev != device);
        Ok(d)
    }

    pub fn device(&self, device: u32) -> Result<&DeviceMap, ItsError> {
        self.devices.get(&device).ok_or(ItsError::UnknownDevice(device))
    }

    fn check_pcpu(&self, pcpu: usize) -> Result<(), ItsError> {
        if pcpu < self.cpus {
            Ok(())
        } else {
            Err(ItsError::BadPcpu(pcpu))
        }
    }

    /// Whether MAPTI of (`device`, `event`) to `pcpu` may be sent.
    pub fn check_new_event(&self, device: u32, event: u32, pcpu: usize) -> Result<(), ItsError> {
        let d = self.device(device)?;
        if u64::from(event) >> d.event_bits != 0 {
            return Err(ItsError::EventOutOfRange { device, event });
        }
        if d.events.contains_key(&event) || self.vevents.contains_key(&(device, event)) {
            return Err(ItsError::EventMapped { device, event });
        }
        self.check_pcpu(pcpu)
    }

    /// Records an event VMAPTI mapped to `vintid` of `vpe`.
    pub fn add_vevent(&mut self, device: u32, event: u32, vpe: u16, vintid: u32) -> Result<(), ItsError> {
        self.check_new_event(device, event, 0)?;
        self.vevents.insert((device, event), VEventMap { vpe, vintid });
        Ok(())
    }

    pub fn vevent(&self, device: u32, event: u32) -> Result<VEventMap, ItsError> {
        self.device(device)?;
        self.vevents.get(&(device, event)).copied().ok_or(ItsError::UnknownEvent { device, event })
    }

    /// Forgets a vLPI event.
    pub fn remove_vevent(&mut self, device: u32, event: u32) -> Result<VEventMap, ItsError> {
        self.device(device)?;
        self.vevents.remove(&(device, event)).ok_or(ItsError::UnknownEvent { device, event })
    }

    /// Records a VMOVI.
    pub fn set_vpe(&mut self, device: u32, event: u32, vpe: u16) -> Result<(), ItsError> {
        self.vevent(device, event)?;
        if let Some(e) = self.vevents.get_mut(&(device, event)) {
            e.vpe = vpe;
        }
        Ok(())
    }

    /// The vLPI events of `device`.
    pub fn vevents_of(&self, device: u32) -> Vec<u32> {
        self.vevents.range((device, 0)..=(device, u32::MAX)).map(|(&(_, e), _)| e).collect()
    }

    /// Events mapped to vLPIs.
    pub fn vevent_count(&self) -> usize {
        self.vevents.len()
    }

    /// Records an event MAPTI mapped.
    pub fn add_event(&mut self, device: u32, event: u32, lpi: IntId, pcpu: usize) -> Result<(), ItsError> {
        self.check_new_event(device, event, pcpu)?;
        if let Some(d) = self.devices.get_mut(&device) {
            d.events.insert(event, EventMap { lpi, pcpu });
        }
        Ok(())
    }

    pub fn event(&self, device: u32, event: u32) -> Result<EventMap, ItsError> {
        self.device(device)?.events.get(&event).copied().ok_or(ItsError::UnknownEvent { device, event })
    }

    /// Forgets an event; its mapping (whose LPI the caller frees) comes back.
    pub fn remove_event(&mut self, device: u32, event: u32) -> Result<EventMap, ItsError> {
        let d = self.devices.get_mut(&device).ok_or(ItsError::UnknownDevice(device))?;
        d.events.remove(&event).ok_or(ItsError::UnknownEvent { device, event })
    }

    /// Checks a MOVI of a mapped event to `pcpu`.
    pub fn check_move(&self, device: u32, event: u32, pcpu: usize) -> Result<EventMap, ItsError> {
        let e = self.event(device, event)?;
        self.check_pcpu(pcpu)?;
        Ok(e)
    }

    /// Records a MOVI.
    pub fn set_pcpu(&mut self, device: u32, event: u32, pcpu: usize) -> Result<(), ItsError> {
        self.check_move(device, event, pcpu)?;
        if let Some(e) = self.devices.get_mut(&device).and_then(|d| d.events.get_mut(&event)) {
            e.pcpu = pcpu;
        }
        Ok(())
    }

    /// Every mapped (DeviceID, EventID, mapping), for diagnostics.
    pub fn events(&self) -> Vec<(u32, u32, EventMap)> {
        self.devices.iter().flat_map(|(&d, m)| m.events.iter().map(move |(&e, &v)| (d, e, v))).collect()
    }
}

/// The ITS commands the driver counts, by kind.
pub const COUNTED_COMMANDS: [u8; 14] = {
    use super::cmd::opcode::*;
    [MAPD, MAPC, MAPTI, MOVI, DISCARD, INT, INV, SYNC, VMAPP, VMAPTI, VMOVI, VMOVP, VINVALL, VSYNC]
};

/// Index of `opcode` in [`COUNTED_COMMANDS`] (the last slot counts others).
pub fn command_slot(opcode: u8) -> usize {
    COUNTED_COMMANDS.iter().position(|&o| o == opcode).unwrap_or(COUNTED_COMMANDS.len())
}

/// Driver counters, as the stats block prints them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostItsStats {
    pub lpis_taken: u64,
    pub commands: [u64; COUNTED_COMMANDS.len() + 1],
    pub errors: u64,
    pub timeouts: u64,
}

impl HostItsStats {
    /// The `(HV) stats` block body: one `its.<name>=<value>` line each.
    pub fn write_text(&self, out: &mut impl fmt::Write) -> fmt::Result {
        writeln!(out, "its.lpis_taken={}", self.lpis_taken)?;
        for (i, op) in COUNTED_COMMANDS.iter().enumerate() {
            let name = super::cmd::name_of(*op).unwrap_or("?");
            writeln!(out, "its.cmd.{name}={}", self.commands[i])?;
        }
        writeln!(out, "its.cmd.other={}", self.commands[COUNTED_COMMANDS.len()])?;
        writeln!(out, "its.cmd_errors={}", self.errors)?;
        writeln!(out, "its.cmd_timeouts={}", self.timeouts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lpi(n: u32) -> IntId {
        IntId::lpi(n).unwrap()
    }

    #[test]
    fn lpi_allocator_hands_out_each_lpi_once_and_takes_back_only_its_own() {
        let mut a = LpiAllocator::new();
        assert_eq!(u32::from(a.alloc().unwrap()), 8192);
        assert_eq!(u32::from(a.alloc().unwrap()), 8193);
        a.free(lpi(0)).unwrap();
        assert_eq!(a.free(lpi(0)), Err(ItsError::LpiNotAllocated(8192)), "double free");
        assert_eq!(u32::from(a.alloc().unwrap()), 8192, "lowest free first");
        assert_eq!(a.free(lpi(HOST_LPI_COUNT)), Err(ItsError::LpiNotAllocated(16384)), "beyond the host range");
        assert_eq!(a.free(IntId::spi(40).unwrap()), Err(ItsError::LpiNotAllocated(72)), "not an LPI");
        for _ in 2..HOST_LPI_COUNT {
            a.alloc().unwrap();
        }
        assert_eq!(a.in_use(), HOST_LPI_COUNT);
        assert_eq!(a.alloc(), Err(ItsError::NoFreeLpi));
        a.free(lpi(5000)).unwrap();
        assert_eq!(u32::from(a.alloc().unwrap()), 8192 + 5000);
    }

    #[test]
    fn itt_is_entries_times_entry_size_in_256_byte_units() {
        assert_eq!(itt_bytes(1, 12), 256, "2 × 12 bytes, one 256-byte unit");
        assert_eq!(itt_bytes(5, 8), 256);
        assert_eq!(itt_bytes(6, 12), 768, "64 × 12 = 768");
        assert_eq!(itt_bytes(7, 12), 1536);
        assert_eq!(itt_bytes(8, 3), 768);
        assert_eq!(itt_bytes(16, 12) % ITT_ALIGN, 0);
    }

    #[test]
    fn page_size_probe_takes_the_first_size_that_reads_back() {
        // An ITS that only does 4 KiB pages: the field reads back 0.
        let mut writes = Vec::new();
        let p = probe_page_size(0, |v| {
            writes.push(v);
            v & !(0b11 << 8)
        });
        assert_eq!(p, Some(PageSize::K4));
        assert_eq!(writes.len(), 3, "64K, 16K, then 4K");
        assert!(writes.iter().all(|w| w >> 63 == 0), "probed with Valid = 0");
        // One that accepts 64 KiB at once keeps the rest of the value.
        let base = (GITS_BASER::Type::Devices + GITS_BASER::Indirect::SET).value;
        let p = probe_page_size(base, |v| {
            let r = LocalRegisterCopy::<u64, GITS_BASER::Register>::new(v);
            assert!(r.is_set(GITS_BASER::Indirect) && r.read(GITS_BASER::Type) == 1);
            v
        });
        assert_eq!(p, Some(PageSize::K64));
        // One that accepts nothing (e.g. reads as zero with a stuck field).
        assert_eq!(probe_page_size(0, |_| 3 << 8), None);
    }

    #[test]
    fn tables_are_flat_when_small_and_two_level_when_large_and_supported() {
        // QEMU: 8-byte DTEs, 16 DeviceID bits → 512 KiB flat.
        let flat = plan_table(8, 16, PageSize::K64, false).unwrap();
        assert_eq!((flat.indirect, flat.bytes, flat.size_field()), (false, 0x8_0000, 7));
        let two = plan_table(8, 16, PageSize::K64, true).unwrap();
        assert!(two.indirect);
        assert_eq!((two.bytes, two.ids_per_page, two.size_field()), (0x1_0000, 8192, 0));
        assert_eq!(two.l1_index(8191), 0);
        assert_eq!(two.l1_index(0xffff), 7);
        // A small collection table stays flat even where two-level exists.
        let ct = plan_table(8, 3, PageSize::K4, true).unwrap();
        assert_eq!((ct.indirect, ct.bytes), (false, 0x1000));
        // 4 KiB pages, 16 bits, 12-byte entries, flat: 768 KiB = 192 pages.
        assert_eq!(plan_table(12, 16, PageSize::K4, false).unwrap().size_field(), 191);
        // Too big for the Size field without two levels.
        assert!(matches!(plan_table(16, 20, PageSize::K4, false), Err(ItsError::Table(_))));
        assert!(matches!(plan_table(0, 4, PageSize::K4, false), Err(ItsError::Table(_))));
        assert_eq!(l1_descriptor(0x4123_0000), (1 << 63) | 0x4123_0000);
    }

    #[test]
    fn mappings_refuse_unknown_double_and_out_of_range() {
        let mut m = Mappings::new(16, 15, 2);
        assert_eq!(m.check_new_device(0x1_0000, 1), Err(ItsError::DeviceOutOfRange(0x1_0000)));
        assert_eq!(m.check_new_device(1, 0), Err(ItsError::EventBits(0)));
        assert_eq!(m.check_new_device(1, 16), Err(ItsError::EventBits(16)));
        m.add_device(0xffff, 2, 0x1000, 256).unwrap();
        assert_eq!(m.add_device(0xffff, 2, 0x2000, 256), Err(ItsError::DeviceMapped(0xffff)));
        assert_eq!(m.check_new_event(7, 0, 0), Err(ItsError::UnknownDevice(7)));
        assert_eq!(m.check_new_event(0xffff, 4, 0), Err(ItsError::EventOutOfRange { device: 0xffff, event: 4 }));
        assert_eq!(m.check_new_event(0xffff, 3, 2), Err(ItsError::BadPcpu(2)));
        m.add_event(0xffff, 3, lpi(0), 0).unwrap();
        assert_eq!(m.add_event(0xffff, 3, lpi(1), 0), Err(ItsError::EventMapped { device: 0xffff, event: 3 }));
        assert_eq!(m.event(0xffff, 3).unwrap(), EventMap { lpi: lpi(0), pcpu: 0 });
        assert_eq!(m.event(0xffff, 2), Err(ItsError::UnknownEvent { device: 0xffff, event: 2 }));
        assert_eq!(m.check_move(0xffff, 3, 5), Err(ItsError::BadPcpu(5)));
        m.set_pcpu(0xffff, 3, 1).unwrap();
        assert_eq!(m.event(0xffff, 3).unwrap().pcpu, 1);
        assert_eq!(m.set_pcpu(0xffff, 1, 1), Err(ItsError::UnknownEvent { device: 0xffff, event: 1 }));
        m.add_event(0xffff, 0, lpi(1), 1).unwrap();
        assert_eq!(m.events().len(), 2);
        assert_eq!(m.remove_event(0xffff, 0).unwrap().lpi, lpi(1));
        assert_eq!(m.remove_event(0xffff, 0), Err(ItsError::UnknownEvent { device: 0xffff, event: 0 }));
        // Unmapping the device hands back what is still mapped, for freeing.
        let d = m.remove_device(0xffff).unwrap();
        assert_eq!((d.itt, d.itt_bytes, d.events.len()), (0x1000, 256, 1));
        assert_eq!(m.remove_device(0xffff), Err(ItsError::UnknownDevice(0xffff)));
        assert_eq!(m.remove_event(0xffff, 3), Err(ItsError::UnknownDevice(0xffff)));
    }

    #[test]
    fn vlpi_events_share_the_event_space_and_go_with_their_device() {
        let mut m = Mappings::new(16, 15, 1);
        assert_eq!(m.add_vevent(5, 0, 0, 8192), Err(ItsError::UnknownDevice(5)));
        m.add_device(5, 2, 0x1000, 256).unwrap();
        m.add_vevent(5, 1, 0, 8192).unwrap();
        assert_eq!(m.add_vevent(5, 1, 1, 8193), Err(ItsError::EventMapped { device: 5, event: 1 }));
        assert_eq!(m.add_event(5, 1, lpi(0), 0), Err(ItsError::EventMapped { device: 5, event: 1 }), "a vLPI event");
        m.add_event(5, 2, lpi(0), 0).unwrap();
        assert_eq!(m.add_vevent(5, 2, 0, 8194), Err(ItsError::EventMapped { device: 5, event: 2 }), "a host LPI event");
        assert_eq!(m.add_vevent(5, 4, 0, 8194), Err(ItsError::EventOutOfRange { device: 5, event: 4 }));
        m.add_vevent(5, 3, 1, 8195).unwrap();
        m.set_vpe(5, 3, 0).unwrap();
        assert_eq!(m.vevent(5, 3), Ok(VEventMap { vpe: 0, vintid: 8195 }));
        assert_eq!(m.set_vpe(5, 0, 0), Err(ItsError::UnknownEvent { device: 5, event: 0 }));
        assert_eq!(m.vevents_of(5), [1, 3]);
        assert_eq!(m.remove_vevent(5, 1).unwrap().vintid, 8192);
        assert_eq!(m.remove_vevent(5, 1), Err(ItsError::UnknownEvent { device: 5, event: 1 }));
        m.remove_device(5).unwrap();
        assert_eq!(m.vevent_count(), 0, "gone with the device");
        assert_eq!(m.vevent(5, 3), Err(ItsError::UnknownDevice(5)));
    }

    #[test]
    fn queue_progress_reads_creadr_offset_and_stall() {
        assert_eq!(queue_progress(0x40, 0x40), QueueProgress::Done);
        assert_eq!(queue_progress(0x20, 0x40), QueueProgress::Busy);
        assert_eq!(queue_progress(0x20 | 1, 0x40), QueueProgress::Stalled(0x20));
        // Wrapped to the start of the 64 KiB queue.
        assert_eq!(queue_progress(0, 0), QueueProgress::Done);
        assert_eq!(queue_progress(0xffe0, 0), QueueProgress::Busy);
        // Bits above the offset field are not part of it.
        assert_eq!(queue_progress((1 << 20) | 0x40, 0x40), QueueProgress::Done);
    }

    #[test]
    fn stats_text_names_every_counted_command() {
        let mut s = HostItsStats { lpis_taken: 1, errors: 0, timeouts: 0, ..Default::default() };
        s.commands[command_slot(super::super::cmd::opcode::MAPD)] = 2;
        s.commands[command_slot(0x0E)] = 1; // MOVALL: not counted by name
        s.commands[command_slot(0x2A)] = 3;
        let mut t = alloc::string::String::new();
        s.write_text(&mut t).unwrap();
        assert!(t.contains("its.lpis_taken=1\n"));
        assert!(t.contains("its.cmd.MAPD=2\n"));
        assert!(t.contains("its.cmd.SYNC=0\n"));
        assert!(t.contains("its.cmd.other=1\n"));
        assert!(t.contains("its.cmd.VMAPTI=3\n"));
        assert!(t.ends_with("its.cmd_errors=0\nits.cmd_timeouts=0\n"));
    }
}
