//! The physical SMMUv3s: the hypervisor's, never a guest's.
//!
//! [`init`] brings one up from nothing: a two-level stream table whose
//! level-1 descriptors are all invalid (every stream aborts, its
//! transactions recorded as events), a command queue and an event queue
//! from the heap, GBPA.ABORT (should the SMMU ever be disabled, nothing
//! bypasses it), the event-queue and global-error interrupts on, then
//! SMMUEN. [`attach`] gives a range of StreamIDs one Stream Table Entry
//! (stage-2 translation through a VM's tables), allocating the level-2
//! tables it needs, and makes the SMMU forget what it cached (CFGI_ALL,
//! TLBI_S12_VMALL, CMD_SYNC).
//!
//! Commands are posted by writing entries and CMDQ_PROD, then waiting,
//! bounded, for CMDQ_CONS to catch up: CMD_SYNC with no signal
//! (`CS = SIG_NONE`) is complete once CONS has passed it. A command the
//! SMMU refuses (GERROR.CMDQ_ERR) is replaced in place by a CMD_SYNC so the
//! queue moves on, and reported.
//!
//! [`handle_irq`] drains every SMMU's event queue (each record decoded by
//! `crate::smmu`, counted per kind and per stream owner, logged at a
//! bounded rate; a stream that keeps faulting is switched to abort) and
//! acknowledges global errors. Everything is under the `SMMUS` lock, a
//! leaf like the ITS's.
//!
//! The pure half (register fields, STE and command encodings, queue
//! arithmetic, event decoding, the fault policy) is `hv_core::smmu`,
//! host-tested; this file is its MMIO.

use crate::cache;
use crate::frame::Frame;
use crate::intid::IntId;
use crate::sync::Mutex;
use crate::sysreg;
use alloc::vec::Vec;
use core::fmt::Write;
use hv_core::smmu::cmd::Command;
use hv_core::smmu::event::{Event, EventKind, FaultAction, FaultLog};
use hv_core::smmu::queue::{self, QueuePtrs};
use hv_core::smmu::ste;
use hv_core::smmu::{self as model, Features, SmmuError};

/// Polls of a register before an operation counts as timed out.
const POLL_LIMIT: u32 = 1 << 22;
/// StreamID bits the stream table covers: PCI requester IDs.
const MAX_SID_BITS: u32 = 16;
/// Bytes of one command, one event record, one STE, one L1 descriptor.
const CMD_BYTES: usize = 16;
const EVENT_BYTES: usize = 32;

/// Who a range of streams belongs to, for the per-owner counters.
#[derive(Clone, Copy)]
struct Owner {
    first: u32,
    count: u32,
    domid: u32,
    vmid: u16,
}

/// Counters of one SMMU, printed as `smmuN.*`.
#[derive(Clone, Copy, Default)]
pub struct SmmuCounters {
    pub events: u64,
    pub events_translation: u64,
    pub events_permission: u64,
    pub events_addr_size: u64,
    pub events_access: u64,
    pub events_bad_stream: u64,
    pub events_other: u64,
    pub event_overflows: u64,
    /// Events the fault policy counted without a log line.
    pub events_unlogged: u64,
    pub gerrors: u64,
    pub cmdq_errors: u64,
    pub timeouts: u64,
    pub commands: u64,
    pub streams_attached: u64,
    pub streams_aborted: u64,
}

/// A command or event queue in memory.
struct Queue {
    frame: Frame,
    ptrs: QueuePtrs,
    /// The driver's side: PROD of the command queue, CONS of the event
    /// queue (index and wrap bit).
    mine: u32,
}

struct Smmu {
    base: u64,
    feat: Features,
    /// The SMMU does not snoop: everything it reads is cleaned to PoC.
    clean: bool,
    l1: Frame,
    sid_bits: u32,
    l2: Vec<Option<Frame>>,
    cmdq: Queue,
    evtq: Queue,
    owners: Vec<Owner>,
    faults: FaultLog,
    /// Faults per owner (same order as `owners`).
    owner_faults: Vec<u64>,
    irqs: [Option<IntId>; 2],
    counters: SmmuCounters,
}

static SMMUS: Mutex<Vec<Option<Smmu>>> = Mutex::new(Vec::new());

fn read32(addr: u64) -> u32 {
    // SAFETY: `addr` is a register of an SMMU's two 64 KiB pages, which
    // the machine description names inside the platform's device windows
    // (identity-mapped as device memory); only this module touches them.
    unsafe { core::ptr::read_volatile(addr as *const u32) }
}

fn write32(addr: u64, v: u32) {
    // SAFETY: as in `read32`.
    unsafe { core::ptr::write_volatile(addr as *mut u32, v) }
}

fn write64(addr: u64, v: u64) {
    // SAFETY: as in `read32`; the 64-bit registers are 8-byte aligned.
    unsafe { core::ptr::write_volatile(addr as *mut u64, v) }
}

/// Writes `words` at `pa` (heap memory the SMMU reads, VA == PA).
fn write_words(pa: u64, words: &[u64]) {
    for (i, w) in words.iter().enumerate() {
        // SAFETY: `pa` is inside a `Frame` this module allocated and sized
        // for these words (a queue slot, an STE, an L1 descriptor).
        unsafe { core::ptr::write_volatile((pa + 8 * i as u64) as *mut u64, *w) };
    }
}

fn read_words<const N: usize>(pa: u64) -> [u64; N] {
    let mut out = [0u64; N];
    for (i, w) in out.iter_mut().enumerate() {
        // SAFETY: as in `write_words`: an event record slot of our queue.
        *w = unsafe { core::ptr::read_volatile((pa + 8 * i as u64) as *const u64) };
    }
    out
}

/// Waits until `done(read32(addr))`, bounded.
fn poll(addr: u64, done: impl Fn(u32) -> bool) -> Result<(), SmmuError> {
    for _ in 0..POLL_LIMIT {
        if done(read32(addr)) {
            return Ok(());
        }
        sysreg::cpu_relax();
    }
    Err(SmmuError::AckTimeout)
}

impl Smmu {
    fn reg(&self, off: usize) -> u64 {
        self.base + off as u64
    }

    /// Makes memory writes the SMMU will read visible to it.
    fn publish(&self, pa: u64, bytes: usize) {
        if self.clean {
            cache::clean_to_poc(pa, bytes as u64);
        }
    }

    /// Sets CR0 and waits for CR0ACK to say so.
    fn set_cr0(&self, v: u32) -> Result<(), SmmuError> {
        write32(self.reg(model::CR0), v);
        poll(self.reg(model::CR0ACK), |a| a == v)
    }

    /// Posts `cmds` and a CMD_SYNC, and waits for the SMMU to consume them.
    fn submit(&mut self, cmds: &[Command]) -> Result<(), SmmuError> {
        for c in cmds.iter().chain(core::iter::once(&Command::Sync)) {
            // A full queue: wait for the SMMU to take some.
            let cons_reg = self.reg(model::CMDQ_CONS);
            let (ptrs, prod) = (self.cmdq.ptrs, self.cmdq.mine);
            if ptrs.is_full(prod, read32(cons_reg)) {
                self.kick();
                poll(cons_reg, |c| !ptrs.is_full(prod, c))?;
            }
            let slot = self.cmdq.frame.pa + (ptrs.index(prod) as usize * CMD_BYTES) as u64;
            write_words(slot, &c.encode());
            self.publish(slot, CMD_BYTES);
            self.cmdq.mine = ptrs.next(prod);
            self.counters.commands += 1;
        }
        self.kick();
        let target = self.cmdq.mine;
        let ptrs = self.cmdq.ptrs;
        for _ in 0..POLL_LIMIT {
            let cons = read32(self.reg(model::CMDQ_CONS));
            if ptrs.is_empty(target, cons) {
                return Ok(());
            }
            let active = model::gerror_active(read32(self.reg(model::GERROR)), read32(self.reg(model::GERRORN)));
            if active & model::GERROR_CMDQ_ERR != 0 {
                return Err(self.skip_bad_command(cons));
            }
            sysreg::cpu_relax();
        }
        self.counters.timeouts += 1;
        Err(SmmuError::CmdqTimeout)
    }

    /// CMDQ_PROD := the driver's producer index, after the entries.
    fn kick(&mut self) {
        sysreg::dsb_sy();
        write32(self.reg(model::CMDQ_PROD), self.cmdq.mine);
    }

    /// The command at `cons` was refused: it becomes a CMD_SYNC, the error
    /// is acknowledged and the queue resumes.
    fn skip_bad_command(&mut self, cons: u32) -> SmmuError {
        let code = queue::cons_error(cons).unwrap_or(0);
        let slot = self.cmdq.frame.pa + (self.cmdq.ptrs.index(cons) as usize * CMD_BYTES) as u64;
        write_words(slot, &Command::Sync.encode());
        self.publish(slot, CMD_BYTES);
        sysreg::dsb_sy();
        self.ack_gerror();
        self.counters.cmdq_errors += 1;
        SmmuError::CmdqError { code }
    }

    /// Acknowledges every active global error (GERRORN := GERROR).
    fn ack_gerror(&mut self) -> u32 {
        let g = read32(self.reg(model::GERROR));
        let active = model::gerror_active(g, read32(self.reg(model::GERRORN)));
        if active != 0 {
            write32(self.reg(model::GERRORN), g);
            self.counters.gerrors += 1;
        }
        active
    }

    /// The level-2 table of `sid`'s bus, made (and linked from level 1)
    /// when it is first needed.
    fn l2_for(&mut self, sid: u32) -> Result<u64, SmmuError> {
        let i = ste::l1_index(sid);
        let slot = self.l2.get_mut(i).ok_or(SmmuError::StreamOutOfRange { sid })?;
        if let Some(f) = slot {
            return Ok(f.pa);
        }
        let bytes = ste::L2_BYTES;
        let f = Frame::new(bytes, bytes, self.clean).map_err(|_| SmmuError::OutOfMemory)?;
        *slot = Some(f);
        let desc_pa = self.l1.pa + (i * 8) as u64;
        write_words(desc_pa, &[ste::l1_descriptor(f.pa)]);
        self.publish(desc_pa, 8);
        Ok(f.pa)
    }

    /// Writes `entry` as `sid`'s STE: the words after the first, then the
    /// first (with V), so the SMMU never reads half an entry as valid.
    fn write_ste(&mut self, sid: u32, entry: &[u64; 8]) -> Result<(), SmmuError> {
        let l2 = self.l2_for(sid)?;
        let pa = l2 + (ste::l2_index(sid) * ste::STE_BYTES) as u64;
        write_words(pa + 8, &entry[1..]);
        sysreg::dsb_sy();
        write_words(pa, &entry[..1]);
        self.publish(pa, ste::STE_BYTES);
        Ok(())
    }

    /// Drains the event queue.
    fn drain_events(&mut self, log: &mut impl FnMut(&Event, Option<Owner>, bool)) {
        let prod_reg = self.reg(model::EVENTQ_PROD);
        let cons_reg = self.reg(model::EVENTQ_CONS);
        let ptrs = self.evtq.ptrs;
        // At most one queue's worth per call: a device faulting faster
        // than we drain cannot keep this pCPU here.
        for _ in 0..ptrs.entries() {
            let prod = read32(prod_reg);
            // PROD.OVFLG toggles when records were lost; CONS.OVACKFLG
            // (the same bit) acknowledges it.
            if (prod ^ self.evtq.mine) & queue::EVENTQ_PROD_OVFLG != 0 {
                self.counters.event_overflows += 1;
                self.evtq.mine = (self.evtq.mine & !queue::EVENTQ_PROD_OVFLG) | (prod & queue::EVENTQ_PROD_OVFLG);
                write32(cons_reg, self.evtq.mine);
            }
            if ptrs.is_empty(prod, self.evtq.mine) {
                break;
            }
            let slot = self.evtq.frame.pa + (ptrs.index(self.evtq.mine) as usize * EVENT_BYTES) as u64;
            if self.clean {
                cache::clean_inval_to_poc(slot, EVENT_BYTES as u64);
            }
            let ev = Event::decode(&read_words::<4>(slot));
            self.evtq.mine = ptrs.next(self.evtq.mine) | (self.evtq.mine & queue::EVENTQ_PROD_OVFLG);
            write32(cons_reg, self.evtq.mine);
            self.count(&ev, log);
        }
        let quiet = self.faults.end_batch();
        if quiet > 0 {
            self.counters.events_unlogged += quiet;
        }
    }

    fn count(&mut self, ev: &Event, log: &mut impl FnMut(&Event, Option<Owner>, bool)) {
        let c = &mut self.counters;
        c.events += 1;
        match ev.kind {
            EventKind::Translation => c.events_translation += 1,
            EventKind::Permission => c.events_permission += 1,
            EventKind::AddrSize => c.events_addr_size += 1,
            EventKind::AccessFlag => c.events_access += 1,
            EventKind::BadStreamId | EventKind::BadSte | EventKind::StreamDisabled => c.events_bad_stream += 1,
            _ => c.events_other += 1,
        }
        let owner = self.owners.iter().position(|o| ev.sid.wrapping_sub(o.first) < o.count);
        if let Some(i) = owner {
            self.owner_faults[i] += 1;
        }
        let owner = owner.map(|i| self.owners[i]);
        match self.faults.record(ev.sid) {
            FaultAction::Log => log(ev, owner, false),
            FaultAction::Count => {}
            // A stream no domain owns aborts already (no valid STE); only
            // an attached one is switched, so a device faulting on many
            // unknown StreamIDs makes no level-2 table be allocated.
            FaultAction::Abort if owner.is_none() => log(ev, owner, false),
            FaultAction::Abort => {
                log(ev, owner, true);
                // The stream keeps faulting: it gets nothing any more.
                if self.write_ste(ev.sid, &ste::ste_abort()).is_ok()
                    && self.submit(&[Command::CfgiSte { sid: ev.sid, leaf: true }]).is_ok()
                {
                    self.counters.streams_aborted += 1;
                }
            }
        }
    }
}

/// What [`init`] found.
#[derive(Clone, Copy, Debug)]
pub struct SmmuSummary {
    pub features: Features,
    /// Its walks snoop the caches (IDR0.COHACC and `dma-coherent`).
    pub coherent: bool,
    pub sid_bits: u32,
    pub cmdq_entries: u32,
    pub eventq_entries: u32,
}

/// Brings up the SMMU at `base` as SMMU `index` (its place in the machine
/// description) with every stream aborting. `coherent`: the description
/// says its walks snoop (`dma-coherent`); IDR0.COHACC must agree.
/// `irqs`: its event-queue and global-error interrupts.
///
/// # Safety
/// `base` must be an SMMUv3's two register pages, inside the platform's
/// device windows, used by nothing else from now on.
pub unsafe fn init(
    index: usize,
    base: u64,
    coherent: bool,
    irqs: [Option<IntId>; 2],
) -> Result<SmmuSummary, SmmuError> {
    let id = |off: usize| read32(base + off as u64);
    let feat = Features::decode(id(model::IDR0), id(model::IDR1), id(model::IDR5));
    feat.check_stage2()?;
    let clean = !(coherent && feat.coherent);
    let sid_bits = feat.sid_bits.min(MAX_SID_BITS);
    let cmdq_log2 = queue::clamp_log2(queue::CMDQ_LOG2, feat.cmdq_log2);
    let eventq_log2 = queue::clamp_log2(queue::EVENTQ_LOG2, feat.eventq_log2);

    let l1_entries = ste::l1_entries(sid_bits);
    // Aligned to its size: the SMMU ignores STRTAB_BASE bits below it.
    let l1_bytes = ste::l1_table_bytes(sid_bits);
    let nomem = |_| SmmuError::OutOfMemory;
    let l1 = Frame::new(l1_bytes, l1_bytes, clean).map_err(nomem)?;
    let cmdq_bytes = (CMD_BYTES << cmdq_log2).max(32);
    let cmdq = Frame::new(cmdq_bytes, cmdq_bytes, clean).map_err(nomem)?;
    let evtq_bytes = (EVENT_BYTES << eventq_log2).max(32);
    let evtq = Frame::new(evtq_bytes, evtq_bytes, clean).map_err(nomem)?;
    let mut l2 = Vec::new();
    l2.try_reserve_exact(l1_entries).map_err(|_| SmmuError::OutOfMemory)?;
    l2.resize_with(l1_entries, || None);

    let mut s = Smmu {
        base,
        feat,
        clean,
        l1,
        sid_bits,
        l2,
        cmdq: Queue { frame: cmdq, ptrs: QueuePtrs::new(cmdq_log2), mine: 0 },
        evtq: Queue { frame: evtq, ptrs: QueuePtrs::new(eventq_log2), mine: 0 },
        owners: Vec::new(),
        faults: FaultLog::new(),
        owner_faults: Vec::new(),
        irqs,
        counters: SmmuCounters::default(),
    };
    // Whatever firmware left running stops first (CR0 = 0: no
    // translation, no queues); GBPA then aborts anything that arrives
    // before SMMUEN.
    s.set_cr0(0)?;
    write32(s.reg(model::GBPA), model::gbpa::UPDATE | model::gbpa::ABORT);
    poll(s.reg(model::GBPA), |g| g & model::gbpa::UPDATE == 0)?;
    write32(s.reg(model::IRQ_CTRL), 0);
    poll(s.reg(model::IRQ_CTRLACK), |a| a == 0)?;
    write32(s.reg(model::CR1), model::cr1_value(!clean));
    write32(s.reg(model::CR2), model::cr2::VALUE);
    write64(s.reg(model::STRTAB_BASE), ste::strtab_base(s.l1.pa));
    write32(s.reg(model::STRTAB_BASE_CFG), ste::strtab_base_cfg_2level(ste::strtab_log2size(sid_bits)));
    write64(s.reg(model::CMDQ_BASE), queue::queue_base(s.cmdq.frame.pa, cmdq_log2));
    write32(s.reg(model::CMDQ_PROD), 0);
    write32(s.reg(model::CMDQ_CONS), 0);
    write64(s.reg(model::EVENTQ_BASE), queue::queue_base(s.evtq.frame.pa, eventq_log2));
    write32(s.reg(model::EVENTQ_PROD), 0);
    write32(s.reg(model::EVENTQ_CONS), 0);
    sysreg::dsb_sy();

    let mut cr0 = model::cr0::CMDQEN;
    s.set_cr0(cr0)?;
    // Nothing the SMMU may have cached from firmware's tables survives.
    s.submit(&[Command::CfgiAll, Command::TlbiNsnhAll])?;
    cr0 |= model::cr0::EVENTQEN;
    s.set_cr0(cr0)?;
    let irq_ctrl = model::irq_ctrl::GERROR_IRQEN | model::irq_ctrl::EVENTQ_IRQEN;
    write32(s.reg(model::IRQ_CTRL), irq_ctrl);
    poll(s.reg(model::IRQ_CTRLACK), |a| a == irq_ctrl)?;
    cr0 |= model::cr0::SMMUEN;
    s.set_cr0(cr0)?;

    let summary = SmmuSummary {
        features: feat,
        coherent: !clean,
        sid_bits,
        cmdq_entries: 1 << cmdq_log2,
        eventq_entries: 1 << eventq_log2,
    };
    let mut all = SMMUS.lock();
    if all.len() <= index {
        let more = index + 1 - all.len();
        all.try_reserve(more).map_err(|_| SmmuError::OutOfMemory)?;
        all.resize_with(index + 1, || None);
    }
    all[index] = Some(s);
    Ok(summary)
}

/// Gives StreamIDs `first..first + count` of SMMU `index` the entry
/// `entry` (e.g. `ste::ste_stage2`), on behalf of domain `domid` whose
/// stage 2 has VMID `vmid`, and makes the SMMU drop what it cached.
pub fn attach(index: usize, first: u32, count: u32, entry: &[u64; 8], domid: u32, vmid: u16) -> Result<(), SmmuError> {
    let mut all = SMMUS.lock();
    let s = all.get_mut(index).and_then(|s| s.as_mut()).ok_or(SmmuError::NotUp)?;
    let end = first.checked_add(count).ok_or(SmmuError::StreamOutOfRange { sid: first })?;
    if s.sid_bits < 32 && end > 1 << s.sid_bits {
        return Err(SmmuError::StreamOutOfRange { sid: end - 1 });
    }
    s.owners.try_reserve(1).map_err(|_| SmmuError::OutOfMemory)?;
    s.owner_faults.try_reserve(1).map_err(|_| SmmuError::OutOfMemory)?;
    for sid in first..end {
        s.write_ste(sid, entry)?;
    }
    s.owners.push(Owner { first, count, domid, vmid });
    s.owner_faults.push(0);
    s.counters.streams_attached += u64::from(count);
    s.submit(&[Command::CfgiAll, Command::TlbiS12Vmall { vmid }])
}

/// The wired interrupts of every SMMU brought up.
pub fn irqs() -> Vec<IntId> {
    SMMUS.lock().iter().flatten().flat_map(|s| s.irqs).flatten().collect()
}

/// One of the SMMUs' interrupts: every event queue drained, every global
/// error acknowledged. `log` gets the events the fault policy lets
/// through (the stream's owner if known, and whether the stream was just
/// switched to abort); it runs under the SMMU lock, so it must only log.
pub fn handle_irq(mut log: impl FnMut(usize, &Event, Option<(u32, u16)>, bool), mut gerror: impl FnMut(usize, u32)) {
    let mut all = SMMUS.lock();
    for (i, s) in all.iter_mut().enumerate() {
        let Some(s) = s else { continue };
        s.drain_events(&mut |ev, owner, aborted| log(i, ev, owner.map(|o| (o.domid, o.vmid)), aborted));
        let active = s.ack_gerror();
        if active != 0 {
            gerror(i, active);
        }
    }
}

/// What SMMU `index` implements, if it is up.
pub fn features(index: usize) -> Option<Features> {
    SMMUS.lock().get(index).and_then(|s| s.as_ref()).map(|s| s.feat)
}

/// Whether any SMMU is up.
pub fn present() -> bool {
    SMMUS.lock().iter().any(Option::is_some)
}

/// Every SMMU's counters as `smmuN.name=value` lines, with each owner's
/// streams and faults (`smmuN.dD.streams`, `.vmid`, `.faults`).
pub fn write_stats(out: &mut impl Write) -> core::fmt::Result {
    let all = SMMUS.lock();
    for (i, s) in all.iter().enumerate() {
        let Some(s) = s else { continue };
        let c = &s.counters;
        for (name, v) in [
            ("events", c.events),
            ("events_translation", c.events_translation),
            ("events_permission", c.events_permission),
            ("events_addr_size", c.events_addr_size),
            ("events_access", c.events_access),
            ("events_bad_stream", c.events_bad_stream),
            ("events_other", c.events_other),
            ("event_overflows", c.event_overflows),
            ("events_unlogged", c.events_unlogged),
            ("gerrors", c.gerrors),
            ("cmdq_errors", c.cmdq_errors),
            ("timeouts", c.timeouts),
            ("commands", c.commands),
            ("streams_attached", c.streams_attached),
            ("streams_aborted", c.streams_aborted),
            ("l2_tables", s.l2.iter().flatten().count() as u64),
        ] {
            writeln!(out, "smmu{i}.{name}={v}")?;
        }
        for (o, f) in s.owners.iter().zip(&s.owner_faults) {
            writeln!(out, "smmu{i}.d{}.streams={:#x}+{:#x}", o.domid, o.first, o.count)?;
            writeln!(out, "smmu{i}.d{}.vmid={}", o.domid, o.vmid)?;
            writeln!(out, "smmu{i}.d{}.faults={f}", o.domid)?;
        }
    }
    Ok(())
}
