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

use super::{find_redistributor_frames, rd_base, GIC, GICR_TYPER, GICR_TYPER_OFF};
use crate::arch::aarch64::cache;
use crate::arch::aarch64::sysreg;
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
use alloc::alloc::{alloc_zeroed, dealloc, Layout};
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};
use tock_registers::interfaces::Readable;
use tock_registers::LocalRegisterCopy;

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

/// A heap allocation handed to the GIC: physical address (VA == PA) and
/// its layout, for freeing.
#[derive(Clone, Copy)]
struct Frame {
    pa: u64,
    layout: Layout,
}

impl Frame {
    /// A zeroed block of `bytes` aligned to `align`, cleaned to PoC when
    /// `clean` (a non-snooping reader).
    fn new(bytes: usize, align: usize, clean: bool) -> Result<Frame, ItsError> {
        let layout = Layout::from_size_align(bytes, align).map_err(|_| ItsError::OutOfMemory)?;
        // SAFETY: `layout` has a non-zero size (every caller asks for at
        // least 256 bytes); the block is only handed to the GIC and freed
        // with the same layout.
        let p = unsafe { alloc_zeroed(layout) };
        if p.is_null() {
            return Err(ItsError::OutOfMemory);
        }
        if clean {
            cache::clean_to_poc(p as u64, bytes as u64);
        }
        Ok(Frame { pa: p as u64, layout })
    }

    /// Gives the block back. The GIC must no longer use it.
    fn free(self) {
        // SAFETY: allocated by `Frame::new` with this layout; the caller has
        // unmapped it from the ITS (MAPD Valid = 0 has completed).
        unsafe { dealloc(self.pa as *mut u8, self.layout) };
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

static LPIS_TAKEN: AtomicU64 = AtomicU64::new(0);
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

/// Counts an LPI acknowledged on this pCPU (called by `gic::ack`).
pub fn count_lpi() {
    LPIS_TAKEN.fetch_add(1, Ordering::Relaxed);
}

/// Whether a physical ITS is set up and host LPIs can be mapped.
pub fn its_present() -> bool {
    ITS.lock().is_some()
}

/// The driver's counters, for the stats block.
pub fn stats() -> HostItsStats {
    let mut s = HostItsStats {
        lpis_taken: LPIS_TAKEN.load(Ordering::Relaxed),
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
    let cpus = cpus.min(crate::boot::pcpus::MAX_PCPUS);
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
        crate::sync::cpu_relax();
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

impl Its {
    fn init_cpu(&mut self, cpu: usize) -> Result<(), ItsError> {
        let rd = rd_base(cpu);
        if rd == 0 || cpu >= self.rdbase.len() {
            return Err(ItsError::BadPcpu(cpu));
        }
        let typer = LocalRegisterCopy::<u64, GICR_TYPER::Register>::new(read64(rd + GICR_TYPER_OFF));
        if read32(rd) & gicr::CTLR_ENABLE_LPIS != 0 {
            // PROPBASER/PENDBASER are fixed once LPIs are on (firmware did it).
            return Err(ItsError::Table("GICR_CTLR.EnableLPIs already set"));
        }
        let mut prop = LocalRegisterCopy::<u64, GICR_PROPBASER::Register>::new(0);
        prop.modify(
            GICR_PROPBASER::Physical_Address.val(self.prop.pa >> 12)
                + GICR_PROPBASER::InnerCache.val(CACHE_RAWAWB)
                + GICR_PROPBASER::Shareability.val(SH_INNER)
                + GICR_PROPBASER::IDbits.val(u64::from(HOST_LPI_ID_BITS) - 1),
        );
        write64(rd + gicr::GICR_PROPBASER, prop.get());
        let back = LocalRegisterCopy::<u64, GICR_PROPBASER::Register>::new(read64(rd + gicr::GICR_PROPBASER));
        if non_shareable(back.read(GICR_PROPBASER::Shareability)) {
            prop.modify(GICR_PROPBASER::InnerCache.val(CACHE_NC) + GICR_PROPBASER::Shareability.val(0));
            write64(rd + gicr::GICR_PROPBASER, prop.get());
            self.prop_clean = true;
            cache::clean_to_poc(self.prop.pa, PROP_TABLE_BYTES as u64);
        }
        // Never freed: the redistributor owns it while LPIs are enabled.
        let pend = Frame::new(PEND_TABLE_BYTES, PEND_TABLE_ALIGN, false)?;
        let mut pv = LocalRegisterCopy::<u64, GICR_PENDBASER::Register>::new(0);
        pv.modify(
            GICR_PENDBASER::Physical_Address.val(pend.pa >> 16)
                + GICR_PENDBASER::InnerCache.val(CACHE_RAWAWB)
                + GICR_PENDBASER::Shareability.val(SH_INNER)
                + GICR_PENDBASER::PTZ::SET,
        );
        write64(rd + gicr::GICR_PENDBASER, pv.get());
        let back = LocalRegisterCopy::<u64, GICR_PENDBASER::Register>::new(read64(rd + gicr::GICR_PENDBASER));
        if non_shareable(back.read(GICR_PENDBASER::Shareability)) {
            pv.modify(GICR_PENDBASER::InnerCache.val(CACHE_NC) + GICR_PENDBASER::Shareability.val(0));
            write64(rd + gicr::GICR_PENDBASER, pv.get());
            cache::clean_to_poc(pend.pa, PEND_TABLE_BYTES as u64);
        }
        sysreg::dsb_sy();
        write32(rd, read32(rd) | gicr::CTLR_ENABLE_LPIS);
        sysreg::dsb_sy();
        let rdbase = if self.pta { rd >> 16 } else { typer.read(GICR_TYPER::Processor_Number) };
        self.rdbase[cpu] = Some(rdbase);
        let icid = cpu as u16;
        self.send(&[Command::Mapc { icid, rdbase, valid: true }, Command::Invall { icid }, Command::Sync { rdbase }])
    }

    fn rdbase(&self, pcpu: usize) -> Result<u64, ItsError> {
        self.rdbase.get(pcpu).copied().flatten().ok_or(ItsError::BadPcpu(pcpu))
    }

    /// Writes `cmds` to the queue, advances GITS_CWRITER and waits (bounded)
    /// until GITS_CREADR has consumed them.
    fn send(&mut self, cmds: &[Command]) -> Result<(), ItsError> {
        let r = self.send_inner(cmds);
        if let Err(e) = r {
            match e {
                ItsError::Timeout { .. } => TIMEOUTS.fetch_add(1, Ordering::Relaxed),
                _ => ERRORS.fetch_add(1, Ordering::Relaxed),
            };
            let first = cmds.first().map_or("-", Command::name);
            log::error!("ITS: {} command(s) starting with {first}: {e}", cmds.len());
        }
        r
    }

    fn send_inner(&mut self, cmds: &[Command]) -> Result<(), ItsError> {
        if self.wedged {
            return Err(ItsError::Stalled { creadr: self.cwriter });
        }
        if cmds.len() >= CMD_QUEUE_BYTES / COMMAND_BYTES {
            return Err(ItsError::QueueOverflow(cmds.len()));
        }
        let start = self.cwriter as usize;
        let mut off = start;
        for c in cmds {
            let slot = self.cmdq.pa + off as u64;
            // SAFETY: `slot` is a 32-byte-aligned command slot inside the
            // command queue this driver allocated (off < CMD_QUEUE_BYTES);
            // the ITS only reads slots between CREADR and CWRITER, and
            // CREADR == CWRITER here (the previous batch completed).
            unsafe { core::ptr::write_volatile(slot as *mut [u64; 4], c.encode()) };
            if self.cmdq_clean {
                cache::clean_to_poc(slot, COMMAND_BYTES as u64);
            }
            COMMANDS[command_slot(c.opcode())].fetch_add(1, Ordering::Relaxed);
            off = (off + COMMAND_BYTES) % CMD_QUEUE_BYTES;
        }
        sysreg::dsb_sy();
        let mut cw = LocalRegisterCopy::<u64, GITS_CQ_OFFSET::Register>::new(0);
        cw.modify(GITS_CQ_OFFSET::Offset.val(off as u64 >> 5));
        write64(self.base + offset::GITS_CWRITER, cw.get());
        self.cwriter = off as u32;
        for _ in 0..POLL_LIMIT {
            match queue_progress(read64(self.base + offset::GITS_CREADR), self.cwriter) {
                QueueProgress::Done => return Ok(()),
                QueueProgress::Stalled(creadr) => {
                    self.wedged = true;
                    return Err(ItsError::Stalled { creadr });
                }
                QueueProgress::Busy => crate::sync::cpu_relax(),
            }
        }
        self.wedged = true;
        let creadr = (read64(self.base + offset::GITS_CREADR) & 0xf_ffe0) as u32;
        Err(ItsError::Timeout { creadr, cwriter: self.cwriter })
    }

    /// Writes LPI `lpi`'s configuration byte (and cleans it when the
    /// redistributors do not snoop).
    fn set_config(&mut self, lpi: IntId, enabled: bool) {
        let idx = u64::from(u32::from(lpi) - LPI_BASE);
        let byte = self.prop.pa + idx;
        // SAFETY: `idx` < HOST_LPI_COUNT (the allocator only hands out
        // those), so `byte` is inside the configuration table this driver
        // allocated; the redistributors only read it.
        unsafe { core::ptr::write_volatile(byte as *mut u8, lpi_config_byte(LPI_PRIORITY, enabled)) };
        if self.prop_clean {
            cache::clean_to_poc(byte, 1);
        }
        sysreg::dsb_sy();
    }

    /// Makes sure the Device table can hold `device`: in a two-level table,
    /// allocates its second-level page on first use.
    fn device_slot(&mut self, device: u32) -> Result<(), ItsError> {
        let Some(t) = self.devices.as_mut() else {
            return Ok(()); // an ITS that keeps the Device table itself
        };
        if !t.plan.indirect {
            return Ok(());
        }
        let i = t.plan.l1_index(device);
        let slot = t.l2.get_mut(i).ok_or(ItsError::DeviceOutOfRange(device))?;
        if slot.is_some() {
            return Ok(());
        }
        let page = t.plan.page.bytes() as usize;
        let l2 = Frame::new(page, page, t.clean)?;
        let desc = t.frame.pa + 8 * i as u64;
        // SAFETY: slot `i` of the first-level table this driver allocated
        // (`l2` has one entry per slot); the ITS reads it only for DeviceIDs
        // in this range, none of which is mapped yet.
        unsafe { core::ptr::write_volatile(desc as *mut u64, l1_descriptor(l2.pa)) };
        if t.clean {
            cache::clean_to_poc(desc, 8);
        }
        sysreg::dsb_sy();
        *slot = Some(l2);
        Ok(())
    }
}

fn with_its<T>(f: impl FnOnce(&mut Its) -> Result<T, ItsError>) -> Result<T, ItsError> {
    ITS.lock().as_mut().map_or(Err(ItsError::NoIts), f)
}

/// What MAPD of a device with `event_bits` takes from the heap (its ITT as
/// the buddy allocator rounds it), for the VM's quota.
pub fn itt_cost(event_bits: u8) -> Result<u64, ItsError> {
    with_its(|its| Ok(crate::quota::heap_cost(itt_bytes(event_bits, its.itt_entry_size), ITT_ALIGN)))
}

/// What `device`'s ITT takes from the heap, while it is mapped.
pub fn device_itt_cost(device: u32) -> Option<u64> {
    with_its(|its| Ok(crate::quota::heap_cost(its.map.device(device)?.itt_bytes, ITT_ALIGN))).ok()
}

/// MAPD: gives `device` an ITT of 2^`event_bits` events (from the heap,
/// freed by [`unmap_device`]). A DeviceID beyond 16 bits (or the ITS's
/// Devbits), a device mapped already or an unsupported ITT size is refused.
pub fn map_device(device: u32, event_bits: u8) -> Result<(), ItsError> {
    with_its(|its| {
        its.map.check_new_device(device, event_bits)?;
        let rdbase = its.rdbase(0)?;
        its.device_slot(device)?;
        let bytes = itt_bytes(event_bits, its.itt_entry_size);
        let clean = its.devices.as_ref().map_or(its.cmdq_clean, |t| t.clean);
        let itt = Frame::new(bytes, ITT_ALIGN, clean)?;
        // On failure the ITS may still point at the ITT: it is not freed.
        its.send(&[
            Command::Mapd { device, size: event_bits - 1, itt_addr: itt.pa, valid: true },
            Command::Sync { rdbase },
        ])?;
        its.map.add_device(device, event_bits, itt.pa, bytes)?;
        its.itts.push((device, itt));
        Ok(())
    })
}

/// Unmaps `device`: DISCARD of each event still mapped (no LPI stays
/// pending), MAPD Valid = 0, SYNC; then its LPIs are disabled and freed, and
/// its ITT. An unknown device is refused.
pub fn unmap_device(device: u32) -> Result<(), ItsError> {
    with_its(|its| {
        let mut events: Vec<u32> = its.map.device(device)?.events.keys().copied().collect();
        events.extend(its.map.vevents_of(device));
        let rdbase = its.rdbase(0)?;
        for chunk in events.chunks(DISCARD_BATCH) {
            let mut cmds: Vec<Command> = chunk.iter().map(|&event| Command::Discard { device, event }).collect();
            cmds.push(Command::Sync { rdbase });
            its.send(&cmds)?;
        }
        its.send(&[Command::Mapd { device, size: 0, itt_addr: 0, valid: false }, Command::Sync { rdbase }])?;
        let d = its.map.remove_device(device)?;
        for e in d.events.values() {
            its.set_config(e.lpi, false);
            let _ = its.lpis.free(e.lpi);
        }
        if let Some(i) = its.itts.iter().position(|(dev, _)| *dev == device) {
            its.itts.swap_remove(i).1.free();
        }
        Ok(())
    })
}

/// Maps (`device`, `event`) to a newly allocated host LPI, enabled at the
/// priority of the other forwarded interrupts, in the collection of `pcpu`
/// (MAPTI, INV, SYNC). Returns the LPI.
pub fn map_event(device: u32, event: u32, pcpu: usize) -> Result<IntId, ItsError> {
    with_its(|its| {
        its.map.check_new_event(device, event, pcpu)?;
        let rdbase = its.rdbase(pcpu)?;
        let lpi = its.lpis.alloc()?;
        its.set_config(lpi, true);
        let icid = pcpu as u16;
        let pintid = u32::from(lpi);
        let r = its.send(&[
            Command::Mapti { device, event, pintid, icid },
            Command::Inv { device, event },
            Command::Sync { rdbase },
        ]);
        if let Err(e) = r {
            its.set_config(lpi, false);
            let _ = its.lpis.free(lpi);
            return Err(e);
        }
        its.map.add_event(device, event, lpi, pcpu)?;
        Ok(lpi)
    })
}

/// DISCARD of (`device`, `event`): unmapped, its pending state cleared, its
/// LPI disabled and freed. Returns that LPI.
pub fn unmap_event(device: u32, event: u32) -> Result<IntId, ItsError> {
    with_its(|its| {
        let e = its.map.event(device, event)?;
        let rdbase = its.rdbase(e.pcpu)?;
        its.send(&[Command::Discard { device, event }, Command::Sync { rdbase }])?;
        its.map.remove_event(device, event)?;
        its.set_config(e.lpi, false);
        its.lpis.free(e.lpi)?;
        Ok(e.lpi)
    })
}

/// MOVI: (`device`, `event`)'s LPI now fires on `pcpu`.
pub fn move_event(device: u32, event: u32, pcpu: usize) -> Result<(), ItsError> {
    with_its(|its| {
        let e = its.map.check_move(device, event, pcpu)?;
        let from = its.rdbase(e.pcpu)?;
        let to = its.rdbase(pcpu)?;
        its.send(&[Command::Movi { device, event, icid: pcpu as u16 }, Command::Sync { rdbase: from }])?;
        if to != from {
            its.send(&[Command::Sync { rdbase: to }])?;
        }
        its.map.set_pcpu(device, event, pcpu)
    })
}

/// INT: makes (`device`, `event`)'s LPI pending as if the device had written
/// GITS_TRANSLATER (tests, the boot self-test).
pub fn send_int(device: u32, event: u32) -> Result<(), ItsError> {
    with_its(|its| {
        let e = its.map.event(device, event)?;
        let rdbase = its.rdbase(e.pcpu)?;
        its.send(&[Command::Int { device, event }, Command::Sync { rdbase }])
    })
}

/// What the boot self-test found.
pub struct SelfTest {
    pub arch_rev: u8,
    pub base: u64,
    pub lpis: u32,
    pub lpi: IntId,
}

/// Boot self-test on the boot pCPU (0), before it enables any interrupt:
/// maps the highest DeviceID, one event → an LPI on pCPU 0 (with more
/// than one pCPU moved to the last and back: MOVI both ways), sends INT and polls
/// ICC_IAR1_EL1 (interrupts stay masked at EL2) until that LPI is
/// acknowledged, then unmaps. `Err` when it never arrives.
pub fn self_test(pcpus: usize) -> Result<SelfTest, ItsError> {
    let (device, arch_rev, base) = {
        let g = ITS.lock();
        let its = g.as_ref().ok_or(ItsError::NoIts)?;
        ((1u32 << its.map.device_bits()) - 1, its.arch_rev, its.base)
    };
    map_device(device, 1)?;
    let r = map_event(device, 0, 0).and_then(|lpi| {
        if pcpus > 1 {
            move_event(device, 0, pcpus - 1)?;
            move_event(device, 0, 0)?;
        }
        send_int(device, 0)?;
        let got = wait_for(lpi);
        unmap_event(device, 0)?;
        if got {
            Ok(lpi)
        } else {
            ERRORS.fetch_add(1, Ordering::Relaxed);
            Err(ItsError::Table("self-test LPI never arrived"))
        }
    });
    let u = unmap_device(device);
    let lpi = r?;
    u?;
    Ok(SelfTest { arch_rev, base, lpis: HOST_LPI_COUNT, lpi })
}

/// Polls the CPU interface (bounded) until `lpi` is acknowledged; anything
/// else acknowledged meanwhile is ended (nothing else is enabled yet).
fn wait_for(lpi: IntId) -> bool {
    for _ in 0..SELF_TEST_POLLS {
        if let Some(id) = super::ack() {
            super::eoi(id);
            if id == lpi {
                return true;
            }
            super::deactivate(id);
            log::warn!("ITS self-test: unexpected interrupt {}", u32::from(id));
        }
        crate::sync::cpu_relax();
    }
    false
}

/// A vPE as the ITS knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VpeHw {
    pub vpe: u16,
    /// The host LPI rung for a vLPI while the vPE is not resident.
    pub doorbell: IntId,
    /// The virtual pending table (hypervisor memory, zeroed, 64 KiB aligned).
    pub vpt: u64,
}

/// Creates vPE `vpe`: a zeroed virtual pending table for 2^14 vINTIDs, a
/// doorbell LPI (enabled), VMAPP to the redistributor of `pcpu`, VSYNC.
pub fn create_vpe(vpe: u16, pcpu: usize) -> Result<VpeHw, ItsError> {
    with_its(|its| {
        if its.v4.is_none() {
            return Err(ItsError::NoVlpis);
        }
        if u64::from(vpe) >> VPE_ID_BITS != 0 {
            return Err(ItsError::Table("vPE ID beyond the vPE table"));
        }
        let rdbase = its.rdbase(pcpu)?;
        let vpt = Frame::new(VPT_BYTES, VPT_ALIGN, its.cmdq_clean)?;
        let doorbell = match its.lpis.alloc() {
            Ok(l) => l,
            Err(e) => {
                vpt.free();
                return Err(e);
            }
        };
        its.set_config(doorbell, true);
        // On failure the ITS may still point at the table: it is not freed.
        its.send(&v4::vmapp(vpe, rdbase, vpt.pa))?;
        if let Some(v) = its.v4.as_mut() {
            v.vpes.push((vpe, vpt, pcpu));
        }
        Ok(VpeHw { vpe, doorbell, vpt: vpt.pa })
    })
}

/// Sends the physical commands for one guest mapping change of a VM whose
/// vPEs are `vpes`: `its::v4::check_and_plan` against what is mapped, the
/// commands, then `its::v4::record`.
pub fn vlpi_change(change: GuestChange, vpes: &VpeMap) -> Result<(), ItsError> {
    with_its(|its| {
        if its.v4.is_none() {
            return Err(ItsError::NoVlpis);
        }
        let cmds = v4::check_and_plan(&its.map, change, vpes)?;
        if cmds.is_empty() {
            return Ok(());
        }
        its.send(&cmds)?;
        v4::record(&mut its.map, change, vpes)
    })
}

/// Events mapped to vLPIs now.
pub fn vlpis_mapped() -> usize {
    ITS.lock().as_ref().map_or(0, |i| i.map.vevent_count())
}

/// VMOVP of `vpe` to `pcpu`'s redistributor (its doorbell and direct
/// vLPIs go there from now on). Nothing when it is there already.
pub fn vmovp(vpe: u16, pcpu: usize) -> Result<bool, ItsError> {
    with_its(|its| {
        let rdbase = its.rdbase(pcpu)?;
        let v = its.v4.as_ref().ok_or(ItsError::NoVlpis)?;
        let (typer, number) = (v.typer, v.its_number);
        let at = v.vpes.iter().position(|e| e.0 == vpe).ok_or(ItsError::Table("unknown vPE"))?;
        if v4::needs_vmovp(v.vpes[at].2, pcpu).is_none() {
            return Ok(false);
        }
        its.send(&v4::vmovp(vpe, rdbase, typer, number))?;
        if let Some(v) = its.v4.as_mut() {
            v.vpes[at].2 = pcpu;
        }
        Ok(true)
    })
}

/// Polls of GICR_VPENDBASER.Dirty after Valid 1 → 0.
const DIRTY_POLLS: u32 = 1 << 16;

/// Makes a vPE resident on `pcpu`'s redistributor (call it on `pcpu`):
/// GICR_VPROPBASER = `vpropbaser` (the guest's configuration table), then
/// GICR_VPENDBASER = its pending table with Valid = 1. The redistributor
/// then scans the pending table; the guest may run meanwhile (GICv4.0).
pub fn vpe_resident(pcpu: usize, vpropbaser: u64, vpt: u64) -> Result<(), ItsError> {
    let rd = rd_base(pcpu);
    if rd == 0 {
        return Err(ItsError::BadPcpu(pcpu));
    }
    write64(rd + gicr::GICR_VPROPBASER, vpropbaser);
    sysreg::dsb_sy();
    write64(rd + gicr::GICR_VPENDBASER, v4::vpendbaser(vpt, true, true));
    sysreg::dsb_sy();
    Ok(())
}

/// Makes the vPE on `pcpu`'s redistributor non-resident: Valid = 0, then
/// waits (bounded) for Dirty to clear. Returns PendingLast: an enabled vLPI
/// was pending as it left (the vCPU has an interrupt to take).
pub fn vpe_nonresident(pcpu: usize, vpt: u64) -> Result<bool, ItsError> {
    let rd = rd_base(pcpu);
    if rd == 0 {
        return Err(ItsError::BadPcpu(pcpu));
    }
    write64(rd + gicr::GICR_VPENDBASER, v4::vpendbaser(vpt, false, true));
    sysreg::dsb_sy();
    for _ in 0..DIRTY_POLLS {
        if let v4::Residency::Settled { pending_last, .. } = v4::residency(read64(rd + gicr::GICR_VPENDBASER)) {
            return Ok(pending_last);
        }
        crate::sync::cpu_relax();
    }
    ERRORS.fetch_add(1, Ordering::Relaxed);
    Err(ItsError::VpeDirty { pcpu })
}
