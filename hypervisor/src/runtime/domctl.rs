//! DomUs made and reaped while the machine runs: `hvctl create`'s three
//! steps (`CREATE` reserves a domain's memory in the DomU pool, `LOAD`s
//! copy its kernel and ramdisk out of Dom0's pages, `START` builds it with
//! `Vm::create_domu` and publishes it) and `hvctl destroy`'s end (the
//! reaper: once a stopped DomU's vCPUs are all offline, it leaves the
//! scheduler and the VM table, and after a grace period its memory goes
//! back to the heap and the pool).
//!
//! Why a reaper rather than freeing at `DESTROY`: the DomU's vCPUs stop at
//! their next exit, which may be on other pCPUs and later, and other pCPUs
//! may hold the VM (a table they read, a vCPU they ran last) until their
//! next quiescent point (`runloop::grace`), as Xen frees a domain after an
//! RCU grace period. The reaper runs at the run loop's top
//! ([`reap`], when [`pending`]), and retries until the grace period ends.
//!
//! Lock order: the control device's, then [`STATE`], then the scheduler's.
//! Everything here allocates with `try_reserve` or in room reserved at
//! boot ([`init`]), so a create/destroy cycle returns the heap to where it
//! was; failure is a `Status`, not a panic.

use super::percpu::{self, now_ns};
use super::vm::{self, vms, DomuSlot, Host, Vm, VmError};
use crate::boot::plan::{ALIGN, MIN_GUEST_RAM};
use crate::control::create::{CreateSpec, Fnv64, Module, PAGE};
use crate::control::Status;
use crate::domain::pool::{self, Pool};
use crate::domain::{DomainId, DomuPlacement, VmSpec, DEFAULT_WEIGHT};
use crate::dtb::Machine;
use crate::region::Region;
use crate::runloop::grace;
use crate::sync::Mutex;
use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};
use log::{info, warn};

/// A claim on the next `START` older than this is dropped by a new `CREATE`
/// (its `hvctl` died between the steps).
const BUILD_LAPSE_NS: u64 = 2_000_000_000;
/// Most domains stopping or waiting for a grace period at once.
const MAX_DYING: usize = 16;
/// vCPUs per pool domain the scheduler's tables have room for from boot.
const RESERVED_VCPUS: u32 = 4;

/// A domain between `CREATE` and `START`.
struct Building {
    domid: DomainId,
    name: String,
    extra: String,
    memory: u64,
    vcpus: u32,
    /// `cpus=`: vCPU i's pCPU (empty: they float).
    cpus: Vec<u32>,
    weight: u32,
    cap: Option<u32>,
    ram: Region,
    disk: Option<Region>,
    /// Where the kernel and then the ramdisk (at the next 2 MiB) are loaded.
    stage: Region,
    sizes: [u64; 2],
    /// Per file, the pages below this have all been loaded.
    filled: [u64; 2],
    touched: u64,
}

impl Building {
    fn file_base(&self, m: Module) -> u64 {
        match m {
            Module::Kernel => self.stage.base,
            Module::Ramdisk => self.stage.base + align(self.sizes[0]),
        }
    }
}

/// The memory a DomU made from the pool gives back when it is reaped.
#[derive(Clone, Copy)]
struct Made {
    domid: DomainId,
    ram: Region,
    disk: Option<Region>,
}

/// A stopped DomU on its way out.
struct Dying {
    vm: &'static Vm,
    /// The memory it gives back to the pool.
    give: [Option<Region>; 2],
    /// It was a boot-time DomU: its RAM was never the pool's and joins it.
    grows: bool,
    /// Once unpublished: the table it was in and every pCPU's quiescent
    /// count after that (`runloop::grace`).
    retired: Option<(*mut Vec<&'static Vm>, Vec<u64>)>,
}

/// A VM table `START` replaced, freed after a grace period.
struct OldTable {
    table: *mut Vec<&'static Vm>,
    snap: Vec<u64>,
}

/// Makes a DomU (`Vm::create_domu`, handed in by the boot code: it sits
/// above the devices, which call this module).
pub type Builder =
    fn(&VmSpec, &DomuPlacement, &Machine, usize, &'static Host, DomuSlot, &Vm) -> Result<Box<Vm>, VmError>;

struct State {
    build: Builder,
    machine: Machine,
    nr_pcpus: usize,
    pool: Pool,
    /// Pool domains at once ([`pool::max_domains`]): the heap holds each
    /// one's share.
    max_made: usize,
    made: Vec<Made>,
    building: Option<Building>,
    next_domid: DomainId,
    dying: Vec<Dying>,
    old_tables: Vec<OldTable>,
    /// VMIDs in use (bit n: VMID n), up to 255.
    vmids: [u64; 4],
}

// SAFETY: the raw pointers are tables `vm::publish` handed over, owned by
// the state alone (nobody else frees them) and touched only under its lock.
unsafe impl Send for State {}

static STATE: Mutex<Option<State>> = Mutex::new(None);
/// The run loop's one word about this module, read at every iteration:
/// bit 0, something for [`reap`] to do; above it, the reaper's generation,
/// bumped when a reaped VM's tables are freed (each pCPU then forgets which
/// VMIDs it has flushed, `runtime::vcpu`, so a VMID used again is flushed
/// again before it runs there).
static WORD: AtomicU64 = AtomicU64::new(0);
const PENDING: u64 = 1;
const GENERATION: u64 = 2;

fn set_pending(on: bool) {
    if on {
        WORD.fetch_or(PENDING, Ordering::AcqRel);
    } else {
        WORD.fetch_and(!PENDING, Ordering::AcqRel);
    }
}

fn align(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// Sets up the pool (`plan.domu_pool`) once every boot-time VM is made
/// (`boot_vms`, Dom0 first), with room reserved for everything a
/// create/destroy cycle tracks.
pub fn init(machine: &Machine, nr_pcpus: usize, pool_region: Option<Region>, boot_vms: &[&'static Vm], build: Builder) {
    super::console::reserve();
    let max_made = pool::max_domains(pool_region.map_or(0, |r| r.size)) as usize;
    let mut made = Vec::new();
    let mut dying = Vec::new();
    let mut old = Vec::new();
    let pool = Pool::new(pool_region);
    let reserved = made.try_reserve_exact(max_made).is_ok()
        && dying.try_reserve_exact(MAX_DYING).is_ok()
        && old.try_reserve_exact(MAX_DYING).is_ok();
    let Ok(pool) = pool.map_err(|_| ()).and_then(|p| reserved.then_some(p).ok_or(())) else {
        warn!("domctl: no heap for the DomU pool's records; hvctl create is off");
        return;
    };
    let mut vmids = [0u64; 4];
    for vm in boot_vms {
        vmids[usize::from(vm.vmid / 64) % 4] |= 1 << (vm.vmid % 64);
    }
    // The scheduler's room for the pool's domains, so that they come and go
    // without growing its tables: [`RESERVED_VCPUS`] each (every runqueue
    // keeps a record per vCPU, so room for the most vCPUs a domain may have
    // would be tens of MiB on a large machine). Larger domains grow the
    // tables once, within the heap's share for them.
    if let Some(h) = Host::get() {
        let ids = boot_vms.iter().map(|v| v.vcpu_base + v.vcpus.len() as u32).max().unwrap_or(0);
        let room = ids + (max_made as u32) * RESERVED_VCPUS;
        if let Err(e) = h.sched.reserve(room, boot_vms.len() + max_made) {
            warn!("domctl: scheduler room for pool domains: {e}");
        }
    }
    if let Some(r) = pool_region {
        info!("DomU pool: {:#x}+{:#x} ({} MiB), room for {max_made} domain(s)", r.base, r.size, r.size >> 20);
    }
    let next_domid = boot_vms.iter().map(|v| v.domid).max().unwrap_or(0) + 1;
    *STATE.lock() = Some(State {
        build,
        machine: machine.clone(),
        nr_pcpus,
        pool,
        max_made,
        made,
        building: None,
        next_domid,
        dying,
        old_tables: old,
        vmids,
    });
}

fn with_state<T>(f: impl FnOnce(&mut State) -> Result<T, Status>) -> Result<T, Status> {
    match STATE.lock().as_mut() {
        Some(s) => f(s),
        None => Err(Status::NoMem),
    }
}

/// The pool's figures for the stats: size, free bytes, domains made from it.
pub fn pool_stats() -> Option<(u64, u64, usize)> {
    STATE.lock().as_ref().map(|s| (s.pool.size(), s.pool.free_bytes(), s.made.len()))
}

/// `CREATE`: reserves `spec`'s memory and a domain id, returned.
pub fn create(spec: &CreateSpec<'_>) -> Result<DomainId, Status> {
    let now = now_ns();
    with_state(|s| {
        if s.pool.size() == 0 {
            warn!("hvctl create: no DomU pool (boot with domu_pool=SIZE)");
            return Err(Status::NoMem);
        }
        if let Some(b) = &s.building {
            if now.saturating_sub(b.touched) < BUILD_LAPSE_NS {
                return Err(Status::Busy);
            }
            let b = s.building.take();
            s.discard(b);
        }
        if s.made.len() >= s.max_made {
            warn!("hvctl create: the pool holds at most {} domain(s)", s.max_made);
            return Err(Status::NoMem);
        }
        // `cpus=`: a pCPU for each vCPU (the scheduler pins to one).
        let mut cpus = Vec::new();
        if spec.cpus.is_some() {
            cpus.try_reserve_exact(spec.vcpus as usize).map_err(|_| Status::NoMem)?;
            cpus.extend((0..spec.vcpus).filter_map(|v| spec.pcpu_of(v)));
            if let Some(p) = cpus.iter().find(|&&p| p as usize >= s.nr_pcpus) {
                warn!("hvctl create: cpus: no pCPU {p} (the machine has {})", s.nr_pcpus);
                return Err(Status::Range);
            }
        }
        let memory = u64::from(spec.memory_mib) << 20;
        if memory < MIN_GUEST_RAM || !memory.is_multiple_of(ALIGN) {
            return Err(Status::Range);
        }
        let stage_size = align(spec.kernel_bytes) + align(spec.ramdisk_bytes);
        let ram = s.alloc(memory)?;
        let disk = match spec.disk_mib {
            0 => None,
            d => match s.alloc(u64::from(d) << 20) {
                Ok(r) => Some(r),
                Err(e) => return Err(s.give_back(&[Some(ram)], e)),
            },
        };
        let stage = s.alloc(stage_size).map_err(|e| s.give_back(&[Some(ram), disk], e))?;
        let strings = copy_str(spec.name).and_then(|n| Ok((n, copy_str(spec.extra)?)));
        let Ok((name, extra)) = strings else {
            return Err(s.give_back(&[Some(ram), disk, Some(stage)], Status::NoMem));
        };
        let domid = s.new_domid();
        s.building = Some(Building {
            domid,
            name,
            extra,
            memory,
            vcpus: spec.vcpus,
            cpus,
            weight: spec.weight.unwrap_or(DEFAULT_WEIGHT),
            cap: spec.cap,
            ram,
            disk,
            stage,
            sizes: [spec.kernel_bytes, spec.ramdisk_bytes],
            filled: [0, 0],
            touched: now,
        });
        info!("d{domid}: being made for hvctl create ({}, {} MiB)", spec.name, spec.memory_mib);
        Ok(domid)
    })
}

/// `Box::new` that fails instead of aborting when the heap is full.
fn try_box<T>(v: T) -> Option<Box<T>> {
    let layout = core::alloc::Layout::new::<T>();
    if layout.size() == 0 {
        return Some(Box::new(v));
    }
    // SAFETY: a layout of non-zero size.
    let p = unsafe { alloc::alloc::alloc(layout) } as *mut T;
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is a fresh, suitably aligned block for one `T`, which
    // `Box::from_raw` then owns and frees with the same layout.
    unsafe {
        p.write(v);
        Some(Box::from_raw(p))
    }
}

fn copy_str(s: &str) -> Result<String, Status> {
    let mut out = String::new();
    out.try_reserve_exact(s.len()).map_err(|_| Status::NoMem)?;
    out.push_str(s);
    Ok(out)
}

/// `LOAD`: copies the Dom0 pages listed in `pages` into file `m` of the
/// domain being made, from its page `first` on; returns the checksum of
/// the bytes copied.
pub fn load(dom: DomainId, m: Module, first: u32, pages: &[u8]) -> Result<u64, Status> {
    let dom0 = vms()[0];
    with_state(|s| {
        let b = s.building.as_mut().filter(|b| b.domid == dom).ok_or(Status::NoDom)?;
        let size = b.sizes[m as usize];
        let first = u64::from(first);
        // In order (a batch may be sent again): every page below `filled`
        // has been written.
        if first > b.filled[m as usize] {
            return Err(Status::Inval);
        }
        let n = (pages.len() / 8) as u64;
        if (first + n - 1) * PAGE >= size {
            return Err(Status::Range);
        }
        // Every page must be Dom0's RAM, identity-mapped: never the
        // hypervisor's, the pool's or another VM's.
        let in_dom0 = |pa: u64| dom0.ram_host == dom0.ram.base && crate::control::create::page_in(&dom0.ram, pa);
        let base = b.file_base(m);
        let mut sum = Fnv64::default();
        for (i, entry) in pages.chunks_exact(8).enumerate() {
            let pa = crate::control::create::page_addr(entry);
            if !in_dom0(pa) {
                warn!("hvctl create: page {pa:#x} is not Dom0's RAM");
                return Err(Status::Range);
            }
            let off = (first + i as u64) * PAGE;
            let len = PAGE.min(size - off) as usize;
            let dst = base + off;
            // SAFETY: `pa` is a page of Dom0's RAM (checked above),
            // identity-mapped normal memory; `dst` lies in the staging
            // range the pool handed this domain alone (`off + len` is
            // within the file, which `create` sized the range for). The two
            // are disjoint: the pool is never Dom0's RAM. Dom0 may change
            // its page meanwhile: the checksum tells its tool.
            let bytes = unsafe {
                core::ptr::copy_nonoverlapping(pa as *const u8, dst as *mut u8, len);
                core::slice::from_raw_parts(dst as *const u8, len)
            };
            sum.update(bytes);
        }
        b.filled[m as usize] = b.filled[m as usize].max(first + n);
        b.touched = now_ns();
        Ok(sum.0)
    })
}

/// `START`: builds the domain from its loaded files and runs its vCPU 0.
pub fn start(me: usize, dom: DomainId) -> Result<(), Status> {
    let Some(host) = Host::get() else { return Err(Status::NoMem) };
    let mut st = STATE.lock();
    let s = st.as_mut().ok_or(Status::NoMem)?;
    let b = s.building.as_ref().filter(|b| b.domid == dom).ok_or(Status::NoDom)?;
    let complete = |i: usize| b.filled[i] * PAGE >= b.sizes[i];
    if !complete(0) || !complete(1) {
        return Err(Status::Inval);
    }
    let Some(b) = s.building.take() else { return Err(Status::NoDom) };
    let table = vms();
    let vcpu_base = s.free_vcpu_ids(table, b.vcpus);
    let Some(vmid) = s.new_vmid() else {
        s.discard(Some(b));
        return Err(Status::NoMem);
    };
    let vm = match build(s, host, &b, vcpu_base, vmid) {
        Ok(vm) => vm,
        Err(e) => {
            s.free_vmid(vmid);
            s.discard(Some(b));
            return Err(e);
        }
    };
    // In the table before its vCPU 0 may run: a pCPU the scheduler gives
    // it to must find it.
    let room = s.old_tables.len() < s.old_tables.capacity();
    let Some((boxed, mut snap)) = replacement(table, Some(vm), None).filter(|_| room) else {
        s.unmake(vm, &b);
        return Err(Status::NoMem);
    };
    let retired = vm::publish(boxed);
    grace::take(percpu::all(), &mut snap);
    s.old_tables.push(OldTable { table: retired, snap });
    set_pending(true);
    s.made.push(Made { domid: dom, ram: b.ram, disk: b.disk });
    let _ = s.pool.free(b.stage);
    drop(st);
    let now = now_ns();
    vm.shared[0].online.store(true, Ordering::Release);
    match host.sched.power_on(now, vm.gid(0)) {
        Ok(a) => super::wake::do_wake_action(me, a),
        Err(e) => warn!("d{dom}: vCPU 0 did not start: {e}"),
    }
    info!("d{dom}: {} started ({} vCPU(s), {} MiB)", vm.name, vm.vcpus.len(), vm.ram.size >> 20);
    Ok(())
}

/// `Vm::create_domu` for the domain `b` describes, vCPU 0 not yet on.
fn build(s: &State, host: &'static Host, b: &Building, vcpu_base: u32, vmid: u16) -> Result<&'static Vm, Status> {
    let spec = VmSpec {
        id: b.domid,
        name: b.name.clone(),
        memory: b.memory,
        vcpus: b.vcpus,
        vpl011: true,
        kernel: Region { base: b.stage.base, size: b.sizes[0] },
        ramdisk: (b.sizes[1] > 0).then(|| Region { base: b.file_base(Module::Ramdisk), size: b.sizes[1] }),
        bootargs: b.extra.clone(),
        weight: b.weight,
        cap_percent: b.cap,
        disk_size: b.disk.map_or(0, |d| d.size),
        heap_quota: crate::quota::DEFAULT_DOMU_HEAP_QUOTA,
        kernel_load_addr: None,
        pin_vcpus: false,
        cpus: b.cpus.clone(),
        pci: Vec::new(),
    };
    let placement = DomuPlacement { id: b.domid, ram: b.ram, disk: b.disk };
    let dom0 = vms()[0];
    // The VMID may have run before: whatever any pCPU cached under it goes.
    crate::arch::sysreg::tlbi_alle1is();
    let slot = DomuSlot { vcpu_base, vmid, power_on: false };
    match (s.build)(&spec, &placement, &s.machine, s.nr_pcpus, host, slot, dom0) {
        Ok(mut vm) => {
            let total: usize = vms().iter().map(|v| v.vcpus.len()).sum::<usize>() + vm.vcpus.len();
            vm.overcommitted = total > s.nr_pcpus;
            Ok(Box::leak(vm))
        }
        Err(e) => {
            warn!("hvctl create: d{}: {e}", b.domid);
            // Undo what the scheduler took (the domain, its vCPUs, offline).
            let _ = host.sched.remove_domain(b.domid);
            Err(match e {
                VmError::Layout(_) => Status::Format,
                VmError::Sched(_) => Status::Range,
                _ => Status::NoMem,
            })
        }
    }
}

impl State {
    fn alloc(&mut self, size: u64) -> Result<Region, Status> {
        self.pool.alloc(size).map_err(|e| {
            warn!("hvctl create: {e}");
            Status::NoMem
        })
    }

    /// Gives `regions` back to the pool and returns `e`.
    fn give_back(&mut self, regions: &[Option<Region>], e: Status) -> Status {
        for r in regions.iter().flatten() {
            let _ = self.pool.free(*r);
        }
        e
    }

    /// Drops a domain that never started.
    fn discard(&mut self, b: Option<Building>) {
        if let Some(b) = b {
            info!("d{}: dropped before it started", b.domid);
            self.give_back(&[Some(b.ram), b.disk, Some(b.stage)], Status::NoMem);
        }
    }

    /// Frees a VM `start` made but could not publish.
    fn unmake(&mut self, vm: &'static Vm, b: &Building) {
        if let Some(h) = Host::get() {
            let _ = h.sched.remove_domain(b.domid);
        }
        self.free_vmid(vm.vmid);
        // SAFETY: `vm` came from `Box::leak` in `build` and was never
        // published: nothing else refers to it.
        drop(unsafe { Box::from_raw(vm as *const Vm as *mut Vm) });
        self.give_back(&[Some(b.ram), b.disk, Some(b.stage)], Status::NoMem);
    }

    fn new_domid(&mut self) -> DomainId {
        let live = |d: DomainId| vms().iter().any(|v| v.domid == d) || self.dying.iter().any(|x| x.vm.domid == d);
        let mut d = self.next_domid.max(1);
        while live(d) {
            d = d.checked_add(1).unwrap_or(1);
        }
        self.next_domid = d.checked_add(1).unwrap_or(1);
        d
    }

    fn new_vmid(&mut self) -> Option<u16> {
        let v = (1u16..256).find(|&v| self.vmids[usize::from(v / 64)] & (1 << (v % 64)) == 0)?;
        self.vmids[usize::from(v / 64)] |= 1 << (v % 64);
        Some(v)
    }

    fn free_vmid(&mut self, v: u16) {
        self.vmids[usize::from(v / 64) % 4] &= !(1 << (v % 64));
    }

    /// The lowest `n` consecutive scheduler ids no VM (live or dying) uses.
    fn free_vcpu_ids(&self, table: &[&Vm], n: u32) -> u32 {
        let used = |base: u32| {
            let end = base + n;
            table.iter().chain(self.dying.iter().map(|d| &d.vm)).any(|v| {
                let (b, e) = (v.vcpu_base, v.vcpu_base + v.vcpus.len() as u32);
                base < e && b < end
            })
        };
        let mut base = 0;
        while used(base) {
            base += 1;
        }
        base
    }
}

/// `DESTROY` of a DomU: a domain being made is dropped; a running one
/// stops (`runtime::wake::stop_vm`) and, unless it has passthrough
/// devices, is reaped: its memory goes back.
pub fn destroy(me: usize, vm: Option<&'static Vm>, dom: DomainId) -> Result<(), Status> {
    let mut st = STATE.lock();
    if let Some(s) = st.as_mut() {
        if s.building.as_ref().is_some_and(|b| b.domid == dom) {
            let b = s.building.take();
            s.discard(b);
            return Ok(());
        }
    }
    let vm = vm.ok_or(Status::NoDom)?;
    super::wake::stop_vm(vm, me, "destroyed (hvctl destroy)");
    let Some(s) = st.as_mut() else { return Ok(()) };
    let reapable = vm.vits.is_none() && vm.vlpi.is_none() && vm.pci_functions.is_empty();
    if !reapable || s.dying.iter().any(|d| core::ptr::eq(d.vm, vm)) {
        return Ok(());
    }
    if s.dying.len() == s.dying.capacity() {
        warn!("d{dom}: stopped; too many domains on their way out to reap it now");
        return Ok(());
    }
    // A pool domain stays in `made` until it is freed: its heap share is
    // in use until then.
    let (give, grows) = match s.made.iter().find(|m| m.domid == dom) {
        Some(m) => ([Some(m.ram), m.disk], false),
        // A boot-time DomU's RAM joins the pool (its disk stays reserved).
        None => ([Some(Region { base: vm.ram_host, size: vm.ram.size }), None], true),
    };
    s.dying.push(Dying { vm, give, grows, retired: None });
    set_pending(true);
    Ok(())
}

/// A DomU that powered off or asked for a reset (PSCI): one `hvctl create`
/// made is destroyed as by `DESTROY`, which is xl's default
/// (`on_poweroff="destroy"`; `on_reboot="restart"` is not supported, so a
/// reset destroys it too). A boot-time DomU stays, stopped, as Xen's
/// dom0less ones do with no toolstack watching them.
pub fn stopped_itself(me: usize, dom: DomainId) {
    let made = STATE.lock().as_ref().is_some_and(|s| s.made.iter().any(|m| m.domid == dom));
    let Some(vm) = made.then(|| vms().iter().copied().find(|vm| vm.domid == dom)).flatten() else { return };
    info!("d{dom}: destroyed (on_poweroff=destroy)");
    if let Err(e) = destroy(me, Some(vm), dom) {
        warn!("d{dom}: stays stopped: {e}");
    }
}

/// The run loop's word ([`WORD`]): one load at every iteration; while it
/// equals the one the pCPU saw last, there is nothing to do.
#[inline(always)]
pub fn word() -> u64 {
    WORD.load(Ordering::Acquire)
}

/// Whether `word` says [`reap`] has work.
#[inline(always)]
pub fn pending(word: u64) -> bool {
    word & PENDING != 0
}

/// `word`'s generation.
#[inline(always)]
pub fn generation(word: u64) -> u64 {
    word / GENERATION
}

/// Moves every dying DomU on: out of the scheduler and the table once its
/// vCPUs are all offline, freed once every other pCPU has passed a
/// quiescent point since. Called by pCPU `me` at its run loop's top, where
/// it holds nothing from the table. Asks to run again in a millisecond
/// while anything is left.
#[cold]
#[inline(never)]
pub fn reap(me: usize) {
    let Some(mut st) = STATE.try_lock() else { return };
    let Some(s) = st.as_mut() else { return };
    let pcpus = percpu::all();
    let grace = |snap: &[u64]| grace::elapsed(pcpus, snap, me);
    let mut i = 0;
    while i < s.old_tables.len() {
        if grace(&s.old_tables[i].snap) {
            let t = s.old_tables.swap_remove(i);
            // SAFETY: a table `vm::publish` replaced; every pCPU has passed
            // a quiescent point since, so none still reads it.
            drop(unsafe { Box::from_raw(t.table) });
        } else {
            i += 1;
        }
    }
    let mut freed = false;
    let mut i = 0;
    while i < s.dying.len() {
        match &s.dying[i].retired {
            None => {
                unpublish(s, i);
                i += 1;
            }
            Some((_, snap)) if grace(snap) => {
                let d = s.dying.swap_remove(i);
                s.free(d);
                freed = true;
            }
            Some(_) => i += 1,
        }
    }
    if freed {
        WORD.fetch_add(GENERATION, Ordering::AcqRel);
    }
    let left = !s.dying.is_empty() || !s.old_tables.is_empty();
    set_pending(left);
    if left {
        // A pCPU running one vCPU may stay in it for long (its exits do not
        // pass the loop's top): the ones the grace period waits for are made
        // to reschedule, which is a quiescent point.
        let waited =
            s.old_tables.iter().map(|t| &t.snap).chain(s.dying.iter().filter_map(|d| d.retired.as_ref().map(|r| &r.1)));
        for snap in waited {
            for p in grace::lagging(pcpus, snap, me) {
                super::percpu::request_resched(me, p);
            }
        }
        super::percpu::request_rearm(me, me, now_ns() + 1_000_000);
    }
}

/// Takes dying VM `i` out of the scheduler and the table once its vCPUs are
/// all offline.
fn unpublish(s: &mut State, i: usize) {
    let vm = s.dying[i].vm;
    let offline = (0..vm.vcpus.len()).all(|k| {
        !vm.shared[k].online.load(Ordering::Acquire)
            && vm.shared[k].running_on.load(Ordering::Acquire) == usize::MAX
            && matches!(vm.sched.state(vm.gid(k)), Some(crate::sched::RunState::Offline) | None)
    });
    if !offline {
        return;
    }
    let Some((boxed, mut snap)) = replacement(vms(), None, Some(vm)) else { return };
    if let Err(e) = vm.sched.remove_domain(vm.domid) {
        warn!("d{}: the scheduler keeps it for now: {e}", vm.domid);
        return;
    }
    let old = vm::publish(boxed);
    grace::take(percpu::all(), &mut snap);
    s.dying[i].retired = Some((old, snap));
}

/// A VM table to replace `table` with (`add` appended, `leave` left out),
/// and room for the grace-period snapshot taken once it is published: all
/// the memory a replacement needs, made before anything changes (`None`:
/// the heap could not give it).
// The Box is the point: the table is published through one thin pointer
// (`vm::publish`, an `AtomicPtr`).
#[allow(clippy::box_collection)]
fn replacement(
    table: &[&'static Vm],
    add: Option<&'static Vm>,
    leave: Option<&'static Vm>,
) -> Option<(Box<Vec<&'static Vm>>, Vec<u64>)> {
    let keep = |v: &&&'static Vm| !leave.is_some_and(|d| core::ptr::eq(**v, d));
    let len = table.iter().filter(keep).count() + usize::from(add.is_some());
    let mut new: Vec<&'static Vm> = Vec::new();
    new.try_reserve_exact(len).ok()?;
    new.extend(table.iter().filter(keep).copied().chain(add));
    let snap = grace::room(percpu::all().len()).ok()?;
    Some((try_box(new)?, snap))
}

impl State {
    /// Frees a dying VM after its grace period: every pCPU's TLB entries
    /// of its VMID, its table, its memory, its console's held line.
    fn free(&mut self, d: Dying) {
        let Dying { vm, give, grows, retired } = d;
        let domid = vm.domid;
        crate::arch::sysreg::tlbi_alle1is();
        if let Some((table, _)) = retired {
            // SAFETY: replaced when the VM was unpublished; a grace period
            // has passed since.
            drop(unsafe { Box::from_raw(table) });
        }
        self.free_vmid(vm.vmid);
        self.made.retain(|m| m.domid != domid);
        super::console::forget(domid);
        // SAFETY: every VM is made by `Box::leak` (boot, `build`); this one
        // is in no table, the scheduler no longer has its vCPUs, and every
        // pCPU has passed a quiescent point since it was unpublished: no
        // reference to it is left.
        drop(unsafe { Box::from_raw(vm as *const Vm as *mut Vm) });
        for r in give.into_iter().flatten() {
            let done = if grows { self.pool.grow(r) } else { self.pool.free(r) };
            if let Err(e) = done {
                warn!("d{domid}: its memory stays out of the pool: {e}");
            }
        }
        info!("d{domid}: reaped");
    }
}
