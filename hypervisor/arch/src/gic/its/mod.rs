//! The physical ITS: host LPIs for (DeviceID, EventID) pairs.
//!
//! [`init`] finds a GICv3 or GICv4 ITS (GITS_PIDR2.ArchRev), checks that the
//! distributor (GICD_TYPER.LPIS) and every redistributor (GICR_TYPER.PLPIS)
//! do LPIs, gives the ITS a 64 KiB command queue and its Device and
//! Collection tables from the heap (page size and two-level support probed
//! by writing GITS_BASER<n> and reading it back, `its::host::plan_table`),
//! and enables it. [`init_cpu`] then gives each pCPU's redistributor the one
//! shared LPI configuration table (14 INTID bits: LPIs 8192..16383) and its
//! own pending table, sets GICR_CTLR.EnableLPIs and maps collection ICID =
//! pCPU index to it (MAPC, RDbase as GITS_TYPER.PTA says).
//!
//! The Device table is two-level when the ITS supports it: the first level
//! covers all 2^16 DeviceIDs (PCIe requester IDs), and a second-level page
//! is allocated on the first MAPD that lands in it. Without two-level
//! support it is flat, sized for min(16, GITS_TYPER.Devbits + 1) bits.
//!
//! Tables are programmed Inner-shareable write-back. When a register reads
//! back non-shareable the ITS or redistributor does not snoop: the table
//! goes non-cacheable, and everything written to it (zeroed tables, LPI
//! configuration bytes, first-level descriptors, commands) is cleaned to
//! the point of coherency first.
//!
//! Every command batch is followed by waiting, bounded, for GITS_CREADR to
//! reach GITS_CWRITER; a stall or timeout is an `ItsError`, one log line and
//! a counter. All state is under the `ITS` lock, a leaf like `GIC`.
//!
//! Here: the state, [`init`] and [`init_cpu`]. Then `queue` (commands and
//! tables at run time), `lpi` (host LPIs on the guests' behalf, the self
//! test) and `vpe` (GICv4.0 vPEs), the last two over `queue`.

mod lpi;
mod queue;
mod vpe;

use super::dist::{find_redistributor_frames, rd_base, GIC, GICR_TYPER, GICR_TYPER_OFF};
use crate::cache;
use crate::frame::{Frame, NoMemory};
use crate::intid::IntId;
use crate::its::cmd::{Command, COMMAND_BYTES};
pub use crate::its::host::ItsError;
use crate::its::host::{
    command_slot, itt_bytes, l1_descriptor, plan_table, probe_page_size, queue_progress, HostItsStats, LpiAllocator,
    Mappings, QueueProgress, TablePlan, CMD_QUEUE_BYTES, COUNTED_COMMANDS, HOST_LPI_COUNT, HOST_LPI_ID_BITS, ITT_ALIGN,
    MAX_DEVICE_ID_BITS, PEND_TABLE_ALIGN, PEND_TABLE_BYTES, PROP_TABLE_BYTES,
};
use crate::its::v4::{self, GuestChange, LpiPath, V4Probe, VpeMap, VPE_ID_BITS, VPT_ALIGN, VPT_BYTES};
use crate::its::{
    gicr, lpi_config_byte, offset, CBASER_PAGE, GICR_PENDBASER, GICR_PROPBASER, GITS_BASER, GITS_CBASER,
    GITS_CQ_OFFSET, GITS_CTLR, GITS_TYPER, LPI_BASE,
};
use crate::sync::Mutex;
use crate::sysreg;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};
pub use lpi::*;
use tock_registers::interfaces::Readable;
use tock_registers::LocalRegisterCopy;
pub use vpe::*;

/// Priority of host LPIs: that of every other interrupt the hypervisor
/// enables (`gic::enable`).
const LPI_PRIORITY: u8 = 0x80;
/// Polls of GITS_CREADR (or GITS_CTLR.Quiescent) before giving up.
const POLL_LIMIT: u32 = 1 << 22;
/// DISCARDs per command batch when a device is unmapped.
const DISCARD_BATCH: usize = 64;
/// Polls of ICC_IAR1_EL1 the boot self-test waits for its LPI.
const SELF_TEST_POLLS: u32 = 1 << 16;
/// Inner/OuterCache encoding: Normal, read- and write-allocate write-back.
const CACHE_RAWAWB: u64 = 0b111;
/// Inner/OuterCache encoding: Normal non-cacheable.
const CACHE_NC: u64 = 0b001;
/// Shareability encoding: Inner Shareable.
const SH_INNER: u64 = 0b01;
/// GITS_PIDR2.ArchRev, bits [7:4].
const PIDR2_ARCHREV_SHIFT: u32 = 4;

impl From<NoMemory> for ItsError {
    fn from(_: NoMemory) -> ItsError {
        ItsError::OutOfMemory
    }
}

/// A GITS_BASER<n> table: where, how, and the second-level pages so far.
struct Table {
    frame: Frame,
    plan: TablePlan,
    clean: bool,
    l2: Vec<Option<Frame>>,
}

struct Its {
    base: u64,
    arch_rev: u8,
    pta: bool,
    itt_entry_size: u8,
    cmdq: Frame,
    cmdq_clean: bool,
    /// Byte offset of the next command (== GITS_CREADR when idle).
    cwriter: u32,
    /// A stall or timeout left the queue unusable.
    wedged: bool,
    devices: Option<Table>,
    /// Kept for as long as the ITS runs (never freed).
    _collections: Option<Table>,
    prop: Frame,
    prop_clean: bool,
    lpis: LpiAllocator,
    map: Mappings,
    /// The RDbase field of each pCPU's collection (None until `init_cpu`).
    rdbase: Vec<Option<u64>>,
    itts: Vec<(u32, Frame)>,
    /// GICv4.0 direct injection, when `init` chose it.
    v4: Option<V4>,
    path: LpiPath,
}

/// What direct injection keeps: the vPE table, each vPE's pending table and
/// the pCPU its VMAPP/VMOVP named.
struct V4 {
    _vpe_table: Table,
    typer: u64,
    its_number: u8,
    vpes: Vec<(u16, Frame, usize)>,
}

static ITS: Mutex<Option<Its>> = Mutex::new(None);

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
static COMMANDS: [AtomicU64; COUNTED_COMMANDS.len() + 1] = [ZERO; COUNTED_COMMANDS.len() + 1];
static ERRORS: AtomicU64 = AtomicU64::new(0);
static TIMEOUTS: AtomicU64 = AtomicU64::new(0);

fn read64(addr: u64) -> u64 {
    // SAFETY: `addr` is a register of the ITS control frame or of a
    // redistributor RD_base frame: device memory inside the platform's
    // device windows, identity-mapped; `init` checked the frames exist.
    unsafe { core::ptr::read_volatile(addr as *const u64) }
}

fn write64(addr: u64, v: u64) {
    // SAFETY: as in `read64`; only this module writes these registers.
    unsafe { core::ptr::write_volatile(addr as *mut u64, v) }
}

fn read32(addr: u64) -> u32 {
    // SAFETY: as in `read64`.
    unsafe { core::ptr::read_volatile(addr as *const u32) }
}

fn write32(addr: u64, v: u32) {
    // SAFETY: as in `write64`.
    unsafe { core::ptr::write_volatile(addr as *mut u32, v) }
}

/// Whether a physical ITS is set up and host LPIs can be mapped.
pub fn its_present() -> bool {
    ITS.lock().is_some()
}

/// The driver's counters, for the stats block.
pub fn stats() -> HostItsStats {
    let mut s = HostItsStats {
        lpis_taken: super::cpuif::lpis_taken(),
        errors: ERRORS.load(Ordering::Relaxed),
        timeouts: TIMEOUTS.load(Ordering::Relaxed),
        ..Default::default()
    };
    for (c, a) in s.commands.iter_mut().zip(COMMANDS.iter()) {
        *c = a.load(Ordering::Relaxed);
    }
    s
}

/// Sets up the ITS whose control frame is at `base` for `cpus` pCPUs.
/// `Err(NoIts)` (and nothing changed) when there is no usable ITS.
pub fn init(base: u64, cpus: usize, want_vlpi: bool) -> Result<(), ItsError> {
    let (lpis, gicr_typers) = GIC.lock().as_ref().map_or((false, Vec::new()), |g| {
        let typers = find_redistributor_frames(g);
        (g.gicd.typer().lpis_supported() && typers.iter().all(|&t| t & gicr::TYPER_PLPIS != 0), typers)
    });
    if !lpis {
        return Err(ItsError::NoIts);
    }
    let arch_rev = ((read32(base + offset::GITS_PIDR2) >> PIDR2_ARCHREV_SHIFT) & 0xf) as u8;
    let typer = LocalRegisterCopy::<u64, GITS_TYPER::Register>::new(read64(base + offset::GITS_TYPER));
    if !(3..=4).contains(&arch_rev) || !typer.is_set(GITS_TYPER::Physical) {
        return Err(ItsError::NoIts);
    }
    disable(base)?;
    let cpus = cpus.min(crate::limits::MAX_PCPUS);
    let device_bits = (typer.read(GITS_TYPER::Devbits) as u8 + 1).min(MAX_DEVICE_ID_BITS);
    let event_bits = typer.read(GITS_TYPER::IDbits) as u8 + 1;
    let cid_bits = if typer.is_set(GITS_TYPER::CIL) { typer.read(GITS_TYPER::CIDbits) as u8 + 1 } else { 16 };
    if (cpus as u64) >> cid_bits != 0 {
        return Err(ItsError::Table("fewer collection IDs than pCPUs"));
    }
    let probe = V4Probe {
        its_arch_rev: arch_rev,
        its_typer: typer.get(),
        gicr_typers,
        ich_vtr: aarch64_cpu::registers::ICH_VTR_EL2.get(),
    };
    let mut path = v4::choose_path(&probe, want_vlpi);
    let (cmdq, cmdq_clean) = setup_cmdq(base)?;
    let (mut devices, mut collections, mut vpe_table) = (None, None, None);
    for n in 0..offset::GITS_BASER_COUNT {
        let reg = base + offset::GITS_BASER + 8 * n;
        let v = LocalRegisterCopy::<u64, GITS_BASER::Register>::new(read64(reg));
        match v.read_as_enum(GITS_BASER::Type) {
            Some(GITS_BASER::Type::Value::Devices) => devices = Some(setup_table(reg, device_bits, true)?),
            Some(GITS_BASER::Type::Value::Collections) => {
                let bits = (usize::BITS - (cpus.max(2) - 1).leading_zeros()) as u8;
                collections = Some(setup_table(reg, bits, false)?);
            }
            Some(GITS_BASER::Type::Value::VPEs) if path == LpiPath::Direct => {
                match setup_table(reg, VPE_ID_BITS, false) {
                    Ok(t) => vpe_table = Some(t),
                    Err(e) => {
                        log::warn!("ITS: vPE table: {e}; GICv4 direct injection off");
                        write64(reg, v.get() & !GITS_BASER::Valid::SET.value);
                    }
                }
            }
            _ => write64(reg, v.get() & !GITS_BASER::Valid::SET.value),
        }
    }
    if path == LpiPath::Direct && vpe_table.is_none() {
        path = LpiPath::Emulated(v4::EmulatedWhy::NoVirtualIts);
    }
    let its_number = ((read32(base + offset::GITS_CTLR) >> 4) & 0xf) as u8;
    let v4state = vpe_table.map(|t| V4 { _vpe_table: t, typer: typer.get(), its_number, vpes: Vec::new() });
    if probe.is_v41() {
        log::info!("ITS: GICv4.1 features (vSGIs / vPE configuration table) found; not used");
    }
    let prop = Frame::new(PROP_TABLE_BYTES, 0x1000, false)?;
    let mut ctlr = LocalRegisterCopy::<u64, GITS_CTLR::Register>::new(u64::from(read32(base + offset::GITS_CTLR)));
    ctlr.modify(GITS_CTLR::Enabled::SET);
    write32(base + offset::GITS_CTLR, ctlr.get() as u32);
    *ITS.lock() = Some(Its {
        base,
        arch_rev,
        pta: typer.is_set(GITS_TYPER::PTA),
        itt_entry_size: typer.read(GITS_TYPER::ITT_entry_size) as u8 + 1,
        cmdq,
        cmdq_clean,
        cwriter: 0,
        wedged: false,
        devices,
        _collections: collections,
        prop,
        prop_clean: false,
        lpis: LpiAllocator::new(),
        map: Mappings::new(device_bits, event_bits, cpus),
        rdbase: alloc::vec![None; cpus],
        itts: Vec::new(),
        v4: v4state,
        path,
    });
    Ok(())
}

/// Which way guest MSIs go: GICv4 direct injection or host LPIs.
pub fn lpi_path() -> LpiPath {
    ITS.lock().as_ref().map_or(LpiPath::Emulated(v4::EmulatedWhy::NoVirtualIts), |i| i.path)
}

/// GITS_CTLR.Enabled = 0, then waits (bounded) for Quiescent: BASER and
/// CBASER may only be written then.
fn disable(base: u64) -> Result<(), ItsError> {
    let reg = base + offset::GITS_CTLR;
    let mut ctlr = LocalRegisterCopy::<u64, GITS_CTLR::Register>::new(u64::from(read32(reg)));
    ctlr.modify(GITS_CTLR::Enabled::CLEAR);
    write32(reg, ctlr.get() as u32);
    for _ in 0..POLL_LIMIT {
        if LocalRegisterCopy::<u64, GITS_CTLR::Register>::new(u64::from(read32(reg))).is_set(GITS_CTLR::Quiescent) {
            return Ok(());
        }
        crate::sysreg::cpu_relax();
    }
    Err(ItsError::Table("the ITS never became quiescent"))
}

/// Whether a Shareability field read back as non-shareable (the reader
/// does not snoop: clean what we write to PoC).
fn non_shareable(sh: u64) -> bool {
    sh == 0
}

fn setup_cmdq(base: u64) -> Result<(Frame, bool), ItsError> {
    let q = Frame::new(CMD_QUEUE_BYTES, CMD_QUEUE_BYTES, false)?;
    let pages = CMD_QUEUE_BYTES as u64 / CBASER_PAGE - 1;
    let mut v = LocalRegisterCopy::<u64, GITS_CBASER::Register>::new(0);
    v.modify(
        GITS_CBASER::Valid::SET
            + GITS_CBASER::InnerCache.val(CACHE_RAWAWB)
            + GITS_CBASER::Shareability.val(SH_INNER)
            + GITS_CBASER::Physical_Address.val(q.pa >> 12)
            + GITS_CBASER::Size.val(pages),
    );
    write64(base + offset::GITS_CBASER, v.get());
    let back = LocalRegisterCopy::<u64, GITS_CBASER::Register>::new(read64(base + offset::GITS_CBASER));
    let clean = non_shareable(back.read(GITS_CBASER::Shareability));
    if clean {
        v.modify(GITS_CBASER::InnerCache.val(CACHE_NC) + GITS_CBASER::Shareability.val(0));
        write64(base + offset::GITS_CBASER, v.get());
        cache::clean_to_poc(q.pa, CMD_QUEUE_BYTES as u64);
    }
    write64(base + offset::GITS_CWRITER, 0);
    Ok((q, clean))
}

/// Probes, allocates and programs the table of GITS_BASER at `reg` for
/// 2^`bits` IDs, two-level when `try_indirect` and the ITS can.
fn setup_table(reg: u64, bits: u8, try_indirect: bool) -> Result<Table, ItsError> {
    let cur = LocalRegisterCopy::<u64, GITS_BASER::Register>::new(read64(reg));
    let entry_size = cur.read(GITS_BASER::Entry_Size) + 1;
    let mut attrs = LocalRegisterCopy::<u64, GITS_BASER::Register>::new(0);
    attrs.modify(
        GITS_BASER::InnerCache.val(CACHE_RAWAWB)
            + GITS_BASER::Shareability.val(SH_INNER)
            + GITS_BASER::Indirect.val(u64::from(try_indirect)),
    );
    let mut last = 0;
    let page = probe_page_size(attrs.get(), |v| {
        write64(reg, v);
        last = read64(reg);
        last
    })
    .ok_or(ItsError::Table("no page size accepted"))?;
    let indirect_ok = LocalRegisterCopy::<u64, GITS_BASER::Register>::new(last).is_set(GITS_BASER::Indirect);
    let plan = plan_table(entry_size, bits, page, indirect_ok)?;
    let frame = Frame::new(plan.bytes as usize, page.bytes() as usize, false)?;
    let mut v = attrs;
    v.modify(
        GITS_BASER::Valid::SET
            + GITS_BASER::Indirect.val(u64::from(plan.indirect))
            + GITS_BASER::Page_Size.val(page.field())
            + GITS_BASER::Physical_Address.val(frame.pa >> 12)
            + GITS_BASER::Size.val(plan.size_field()),
    );
    write64(reg, v.get());
    let back = LocalRegisterCopy::<u64, GITS_BASER::Register>::new(read64(reg));
    let clean = non_shareable(back.read(GITS_BASER::Shareability));
    if clean {
        v.modify(GITS_BASER::InnerCache.val(CACHE_NC) + GITS_BASER::Shareability.val(0));
        write64(reg, v.get());
        cache::clean_to_poc(frame.pa, plan.bytes);
    }
    log::debug!(
        "ITS: table at {:#x}: {} ID bits, {}, {} KiB pages, {} bytes{}",
        frame.pa,
        bits,
        if plan.indirect { "two-level" } else { "flat" },
        page.bytes() >> 10,
        plan.bytes,
        if clean { ", non-shareable" } else { "" }
    );
    let l1_slots = if plan.indirect { (plan.bytes / 8) as usize } else { 0 };
    let mut l2 = Vec::new();
    l2.try_reserve_exact(l1_slots).map_err(|_| ItsError::OutOfMemory)?;
    l2.resize(l1_slots, None);
    Ok(Table { frame, plan, clean, l2 })
}

/// Per-pCPU LPI setup on `cpu`'s redistributor: the shared configuration
/// table, a pending table, EnableLPIs, MAPC ICID = `cpu`. Called from
/// `gic::init_cpu`; nothing when there is no ITS.
pub fn init_cpu(cpu: usize) {
    let mut guard = ITS.lock();
    let Some(its) = guard.as_mut() else {
        return;
    };
    if let Err(e) = its.init_cpu(cpu) {
        ERRORS.fetch_add(1, Ordering::Relaxed);
        log::error!("ITS: pCPU {cpu}: no LPIs: {e}");
    }
}
