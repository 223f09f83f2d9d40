//! A VM and its vCPUs: their state. Dom0 is made in `runtime::dom0`,
//! DomUs in `runtime::domu`, both with `runtime::create`'s appliers.
//! VMs are data: a table (`vms`, Dom0 = index 0, then the DomUs), each VM
//! with its own VMID, stage 2, vGIC, vPL011 and disk, and one host-wide
//! scheduler (`Host`) in which every vCPU of every VM has its own
//! `VcpuId` (`Vm::gid`). The run loop that handles every guest exit is in
//! `runtime::vcpu`.
//!
//! Dom0's RAM is identity-mapped (IPA == PA), as Xen does for Dom0 on Arm
//! without an IOMMU, so passthrough devices can DMA to guest addresses.
//!
//! Plan/apply: what Dom0 is made of (IPA size, stage-2 mappings, passthrough
//! devices and PCIe bridges, the disk slot, forwarded SPIs, vGIC, vITS, MMIO
//! bus, IRQ route sources, the iomem policy) is decided by the pure,
//! host-tested `domain::vmplan::plan_dom0`; `Vm::create_dom0` only reads the
//! hardware facts the planner needs (`runtime::create::hw_facts`) and
//! applies the plan. Dom0 and the DomUs share the appliers and one
//! constructor, `Vm::from_plan`, which makes the VM from its plan and what
//! applying it made (`runtime::create::VmParts`).

use super::heap::HeapFrames;
use super::vblk::VDisk;
use crate::arch::context::{El1Context, FpContext};
use crate::arch::exception::GuestRegs;
use crate::arch::gic::VcpuIfState;
use crate::boot::plan::LayoutError;
use crate::config::Config;
use crate::domain::vmplan::PlanError;
use crate::domain::DomainId;
use crate::dtb::{self};
use crate::esr::MmioAccess;
use crate::intid::IntId;
use crate::iomem::IoMemPolicy;
use crate::irq::{IrqCounters, IrqRoutes, RouteError};
use crate::mmio_bus::{BusEntry, BusError, Device, MmioBus};
use crate::quota::Quota;
use crate::region::Region;
use crate::sched::{Sched, SchedError, VcpuId};
use crate::stage2::{IpaSize, Stage2, Stage2Error};
use crate::sync::{Mutex, Once, RwLock};
use crate::trace::{DumpReason, Ring, Trigger, RING_EVENTS};
use crate::vgic::its::Vits;
use crate::vgic::{VgicCell, VgicError};
use crate::vpl011::VPl011;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::AtomicPtr;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

#[derive(Debug)]
pub enum VmError {
    NoKernel,
    /// Something the guest needs is missing or does not fit.
    Memory(&'static str),
    /// A passthrough device overlaps RAM or the hypervisor's own ranges.
    Layout(LayoutError),
    Stage2(Stage2Error),
    Dtb(dtb::DtbError),
    Vgic(VgicError),
    Sched(SchedError),
    /// Two of the VM's physical interrupt sources share an INTID.
    Routes(RouteError),
    /// Two emulated devices claim one guest-physical address.
    Bus(BusError),
    /// An ACPI Dom0's tables, system table or memory map.
    Efi(crate::firmware::dom0_efi::Dom0EfiError),
    /// A DomU that cannot be laid out.
    Domain(crate::domain::layout::DomainError),
    /// The VM planner refused the request (`domain::vmplan::PlanError`).
    Plan(PlanError),
}

impl core::fmt::Display for VmError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            VmError::Memory(why) => write!(f, "{why}"),
            VmError::Layout(e) => write!(f, "{e}"),
            VmError::Routes(e) => write!(f, "IRQ routes: {e}"),
            VmError::Bus(e) => write!(f, "MMIO bus: {e}"),
            VmError::Efi(e) => write!(f, "{e}"),
            VmError::Domain(e) => write!(f, "{e}"),
            VmError::Plan(e) => write!(f, "{e}"),
            other => write!(f, "{other:?}"),
        }
    }
}

impl From<Stage2Error> for VmError {
    fn from(e: Stage2Error) -> Self {
        VmError::Stage2(e)
    }
}
impl From<dtb::DtbError> for VmError {
    fn from(e: dtb::DtbError) -> Self {
        VmError::Dtb(e)
    }
}
impl From<RouteError> for VmError {
    fn from(e: RouteError) -> Self {
        VmError::Routes(e)
    }
}
impl From<BusError> for VmError {
    fn from(e: BusError) -> Self {
        VmError::Bus(e)
    }
}
impl From<VgicError> for VmError {
    fn from(e: VgicError) -> Self {
        VmError::Vgic(e)
    }
}

/// Why an emulated MMIO access was refused: the guest gets an external
/// abort, and the log line says which device said no and why.
#[derive(thiserror::Error, Debug)]
pub enum MmioFault {
    #[error("no emulated device there")]
    NoDevice,
    #[error("vGIC: {0}")]
    Vgic(#[from] VgicError),
    #[error("{0}")]
    Disk(#[from] crate::virtio::mmio::MmioError),
    #[error("vPL011: {0}")]
    Uart(#[from] crate::vpl011::Pl011Error),
    #[error("control device: not an access its registers decode")]
    Control,
}

/// A device's answer to a trapped access (`runtime::devices`): `(vm, pcpu,
/// vcpu, access, offset inside the range, value a store writes, 0 for a load)`. Ok: the
/// access is done (a load's register written); Err: abort the guest.
pub type MmioFn = fn(&Vm, usize, &mut Vcpu, &MmioAccess, u64, u64) -> Result<(), MmioFault>;

/// What a range of `Vm::bus` maps to: a plain function pointer (no
/// allocation, one indirect call per access) and the device it belongs
/// to, which overlap errors name. Here and not in `runtime::devices`: the
/// type names `Vm`, and `Vm` holds the bus.
#[derive(Clone, Copy)]
pub struct Handler {
    pub device: Device,
    pub call: MmioFn,
}

impl BusEntry for Handler {
    fn device(&self) -> Device {
        self.device
    }
}

/// A VM's MMIO bus at run time: guest-physical range → its handler.
pub type Bus = MmioBus<Handler>;

/// Per-vCPU trap counters, updated by whichever pCPU runs the vCPU and read
/// at power-off while other pCPUs may still run: atomics.
macro_rules! trap_counters {
    ($($name:ident),* $(,)?) => {
        #[derive(Default)]
        pub struct TrapCounters {
            $(pub $name: AtomicU64,)*
        }
        impl TrapCounters {
            /// Copies the counts into the stats record printed at power-off.
            pub fn fill(&self, c: &mut crate::stats::Counters) {
                $(c.$name = self.$name.load(Ordering::Relaxed);)*
            }
        }
    };
}

trap_counters!(
    exits,
    irq_exits,
    irq_exits_msi,
    mmio,
    hvc,
    smc,
    sysreg,
    sgis_sent,
    unsupported_calls,
    aborts_injected,
    undef_injected,
    debug_emulated,
    pmu_loads,
    serrors,
    wfi_traps,
    wfe_traps,
    spin_yields,
    irqs_injected,
    lpis_injected,
    kicks,
    doorbells,
    doorbells_runnable,
    doorbells_spurious,
    vpe_residency_switches,
    vmovps,
);

/// Adds one to a counter.
pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A vCPU's register state; locked by the pCPU that runs it, from load to
/// save, so a vCPU never runs on two pCPUs and is never loaded half-saved.
pub struct Vcpu {
    pub id: usize,
    pub regs: GuestRegs,
    pub el1: El1Context,
    pub fp: FpContext,
    pub gicif: VcpuIfState,
    pub lrs: [u64; crate::vgic::NUM_LRS_MAX],
    /// A virtual SError waiting for the guest to take it.
    pub vserror: crate::traps::VirtualSError,
    /// An SGI trap showed critical-section evidence and opened a lock-holder
    /// grace; the first exit that `GraceWatch::ends` closes it.
    pub lhp_grace: Option<crate::sched::GraceWatch>,
    /// Its GICv4 vPE is resident on the pCPU running it (`runtime::vlpi`).
    pub vpe_resident: bool,
    /// The PMU's physical overflow PPI may be active on the pCPU running it
    /// although its vPMU is not on the hardware: made so at switch-in or by
    /// a resync (`vcpu::save_vcpu` deactivates it then).
    pub pmu_ppi_set: bool,
    /// The emulated EL1 physical timer (`crate::ptimer::PhysTimer`) and the
    /// level last driven into the vGIC as its PPI.
    pub ptimer: crate::ptimer::PhysTimer,
    pub ptimer_level: bool,
    /// Its virtual PMU (`crate::vpmu`), used when the VM has one.
    pub pmu: crate::vpmu::VPmu,
    /// The index of the MMIO bus range its last trapped access hit
    /// (`MmioBus::lookup_hinted`).
    pub mmio_hint: usize,
    /// The pCPU and the vGIC's `route_gen` when the physical routes of its
    /// forwarded SPIs were last followed (`vcpu::run::follow_routes`).
    pub routes_followed: Option<(usize, u64)>,
}

/// What other pCPUs may look at without the vCPU's lock.
pub struct VcpuShared {
    pub online: AtomicBool,
    /// Virtual timer deadline (ns) while the vCPU is not on a CPU; u64::MAX = none.
    pub vtimer_deadline: AtomicU64,
    /// The pCPU that watches that deadline (where the vCPU was saved).
    pub vtimer_home: AtomicUsize,
    /// While it is blocked in WFIT: when (ns) the wait ends even without an
    /// interrupt, watched like `vtimer_deadline`; u64::MAX = none.
    pub wake_at: AtomicU64,
    /// When (ns) its EL1 physical timer's line rises while it is not on a
    /// CPU, watched like `vtimer_deadline`; u64::MAX = none.
    pub ptimer_deadline: AtomicU64,
    /// The deadline (ns) of the virtual timer `timer_expired` injected while
    /// this vCPU was saved; taken at its next switch-in to measure how late
    /// the timer wake ran (`trace::Event::TimerWake`); u64::MAX = none.
    pub vtimer_fired: AtomicU64,
    /// The pCPU running it, usize::MAX = none.
    pub running_on: AtomicUsize,
    /// Bit n: the physical active state of forwarded private INTID n (the
    /// virtual timer) must be re-derived from the vGIC by the pCPU that runs
    /// this vCPU, at its next exit (another vCPU changed it by MMIO).
    pub ppi_resync: AtomicU32,
    /// GICv4: a vLPI may be pending while its vPE is not resident (a
    /// doorbell rang, or PendingLast was set when it left): do not block in
    /// WFI. Cleared when the vPE is resident again. Set under the vGIC lock.
    pub vlpi_pending: AtomicBool,
    /// GICv4: the pCPU whose redistributor holds its vPE resident,
    /// usize::MAX = none. A vPE stays resident after its vCPU's turn until
    /// that pCPU picks another vCPU or idles (`runtime::vpe::release`), so
    /// a continuation that picks the same vCPU costs no residency switch;
    /// another pCPU loading the vCPU first waits for that release.
    pub vpe_on: AtomicUsize,
    /// The pCPU whose redistributor its vPE was last moved to (VMOVP), or
    /// `usize::MAX` before the first load: only the pCPU loading the vCPU
    /// reads or writes it (`runtime::vpe::load`).
    pub vpe_mapped: AtomicUsize,
    /// It last left its pCPU with the guest's IRQs masked (at EL1: inside
    /// a critical section, maybe holding a lock a sibling will spin on);
    /// while it is preempted so, siblings are watched closely for spinning
    /// (`sched::spin::Watch::Critical`).
    pub left_masked: AtomicBool,
    /// The scheduler's `is_preempted`, published for readers that do not
    /// take its lock (the spin watch, the yield target): set when a
    /// `schedule()` takes it off its pCPU, still runnable, at a slice end
    /// or a wake-preemption; cleared when one switches it in; both stores
    /// under the scheduler's lock, in the order of the decisions. A reader
    /// may act on a value that changed since: a preempted vCPU parked since
    /// for lack of its domain's budget, or one switched in meanwhile. The
    /// scheduler's pick checks a directed yield's target again under its
    /// lock (runnable, unparked, preempted), so a stale hint costs at most
    /// an undirected yield.
    pub preempted: AtomicBool,
    pub counters: TrapCounters,
}

/// Where a DomU goes among the host's VMs.
#[derive(Clone, Copy, Debug)]
pub struct DomuSlot {
    /// Its vCPUs are the host-wide scheduler's `vcpu_base..`.
    pub vcpu_base: u32,
    /// Its stage-2 tag, unique among live VMs (at boot: its id + 1, VMID 1
    /// being Dom0's).
    pub vmid: u16,
    /// vCPU 0 is powered on here (at boot); `false` leaves that to the
    /// caller, once the VM is in the table (`runtime::domctl`).
    pub power_on: bool,
}

/// What every VM shares: the one host-wide scheduler (every vCPU of every
/// VM has a globally unique `VcpuId`, `Vm::gid`) and the flight recorder
/// (one ring per pCPU). Made once, before the first VM.
pub struct Host {
    pub sched: Sched,
    /// The flight recorder: one ring per pCPU, written only by that pCPU
    /// (the lock is contended only by a dump copying it).
    pub trace: Vec<Mutex<Ring>>,
    /// When a wake→run latency dumps the rings (`sched_trace_threshold_us`).
    pub trace_trigger: Trigger,
    /// Guests get a virtual PMU where the CPU allows (`vpmu=`).
    pub vpmu: bool,
    /// `iommu=`: DomUs' planners need it too (assigned PCIe functions).
    pub iommu: crate::config::IommuMode,
}

impl Vm {
    /// The host-wide scheduler id of local vCPU `local`.
    pub fn gid(&self, local: usize) -> VcpuId {
        VcpuId(self.vcpu_base + local as u32)
    }

    /// Prints the flight recorder's rings (`crate::trace`): each pCPU's
    /// copied under its lock, one after another, events from `from` (ns) on.
    pub fn dump_trace(&self, why: DumpReason, from: u64) {
        let _ = self.write_trace(&mut super::console::LineWriter::default(), why, from);
        self.trace_trigger.dumped(super::percpu::now_ns());
    }

    /// The flight recorder's rings as [`Vm::dump_trace`] prints them, into
    /// `out` (`hvctl trace dump`).
    pub fn write_trace(&self, out: &mut impl core::fmt::Write, why: DumpReason, from: u64) -> core::fmt::Result {
        let rings: Vec<_> = self
            .trace
            .iter()
            .enumerate()
            .map(|(p, r)| {
                let r = r.lock();
                (p, r.snapshot(), r.overwritten())
            })
            .collect();
        crate::trace::write_dump(out, why, &rings, from)
    }
}

static HOST: Once<Host> = Once::new();

impl Host {
    /// The host-wide state, once made.
    pub fn get() -> Option<&'static Host> {
        HOST.get()
    }

    /// Makes the host-wide state once; later calls return the first.
    pub fn init(cfg: &Config, nr_pcpus: usize) -> Result<&'static Host, VmError> {
        if let Some(h) = HOST.get() {
            return Ok(h);
        }
        let sched = Sched::new(cfg.sched, nr_pcpus).map_err(VmError::Sched)?;
        Ok(HOST.call_once(|| Host {
            sched,
            trace: (0..nr_pcpus).map(|_| Mutex::new(Ring::new(RING_EVENTS))).collect(),
            trace_trigger: Trigger::new(cfg.sched_trace_threshold_us, cfg.sched_trace_max_dumps)
                .with_dom0_key(cfg.sched_trace_dom0_key),
            vpmu: cfg.vpmu,
            iommu: cfg.iommu,
        }))
    }
}

/// The VM table: Dom0 at index 0, then the DomUs in domain-id order. First
/// published when every boot-time VM is made, before any vCPU runs; then
/// replaced whole (`publish`) when a DomU is made or reaped while running.
///
/// Readers (`vms`) get the table of the moment with a `'static` lifetime
/// that is a promise, not a fact: a pCPU must not keep a table, or a VM it
/// found in one, past its next quiescent point (`runloop::grace`: the top
/// of its run loop, idling), because a table replaced and a
/// VM unpublished are freed once every pCPU has passed one
/// (`runtime::domctl`'s reaper). Every use today is local to one exit or
/// one loop iteration.
static TABLE: AtomicPtr<Vec<&'static Vm>> = AtomicPtr::new(core::ptr::null_mut());

/// Publishes the first VM table (Dom0 first), once, at boot.
pub fn set_vms(vms: Vec<&'static Vm>) -> &'static [&'static Vm] {
    let t: &'static Vec<&'static Vm> = alloc::boxed::Box::leak(alloc::boxed::Box::new(vms));
    TABLE.store(t as *const _ as *mut _, Ordering::SeqCst);
    t
}

/// Replaces the table with `new` (Dom0 still first); returns the old one,
/// which the caller frees after a grace period (`runloop::grace`).
pub fn publish(new: alloc::boxed::Box<Vec<&'static Vm>>) -> *mut Vec<&'static Vm> {
    TABLE.swap(alloc::boxed::Box::into_raw(new), Ordering::SeqCst)
}

/// The VM table; waits until it is published (secondary pCPUs).
#[inline]
pub fn vms() -> &'static [&'static Vm] {
    // Every exit asks: once published, one load answers.
    loop {
        if let Some(v) = try_vms() {
            return v;
        }
        core::hint::spin_loop();
    }
}

/// The VM table if it is published already.
#[inline]
pub fn try_vms() -> Option<&'static [&'static Vm]> {
    // SAFETY: a non-null pointer is a table `set_vms` or `publish` made
    // from a Box; it is freed only after every pCPU has passed a quiescent
    // point since it was replaced, and callers keep what they read no
    // longer than that (see `TABLE`).
    unsafe { TABLE.load(Ordering::Acquire).as_ref().map(|v| v.as_slice()) }
}

/// The VM and local vCPU index of a host-wide scheduler id.
pub fn vcpu_of(g: VcpuId) -> Option<(&'static Vm, usize)> {
    vms().iter().find_map(|vm| {
        let local = g.0.checked_sub(vm.vcpu_base)? as usize;
        (local < vm.vcpus.len()).then_some((*vm, local))
    })
}

pub struct Vm {
    /// Domain id: 0 for Dom0, its index in the VM table.
    pub domid: DomainId,
    /// Its name (`xl list`'s: "Dom0", a dom0less node's or xl.cfg's).
    pub name: alloc::string::String,
    pub vmid: u16,
    /// Guest-physical RAM (identity-mapped for Dom0; at
    /// `DOMU_RAM_BASE` for a DomU).
    pub ram: Region,
    /// Host-physical address of `ram.base` (equal for Dom0).
    pub ram_host: u64,
    /// The host-wide scheduler id of local vCPU 0 (`Vm::gid`).
    pub vcpu_base: u32,
    /// The domain stopped (a DomU's SYSTEM_OFF/RESET): its vCPUs power off
    /// at their next switch-in or exit.
    pub stopped: AtomicBool,
    /// `hvctl pause`: its vCPUs block at their next switch-in or exit and
    /// stay so, whatever wakes them, until `hvctl unpause`.
    pub paused: AtomicBool,
    pub stage2_root: u64,
    /// The IPA space of its stage 2 (VTCR_EL2.T0SZ/SL0).
    pub ipa: IpaSize,
    /// Its stage-2 tables and their frames, for mappings added while the
    /// guest runs (`iomem`); a leaf lock.
    pub stage2: Mutex<(Stage2, HeapFrames)>,
    /// An ACPI Dom0's on-demand device memory (`runtime::vcpu`); `None`:
    /// every unmapped access aborts.
    pub iomem: Option<IoMemPolicy>,
    /// Pages or blocks mapped on demand, and accesses the policy refused.
    pub iomem_maps: AtomicU64,
    pub iomem_denied: AtomicU64,
    pub vgic: VgicCell,
    pub uart: Mutex<VPl011>,
    pub uart_region: Option<Region>,
    pub uart_intid: IntId,
    pub virt_timer_intid: IntId,
    /// The EL1 physical timer's PPI (emulated, `crate::ptimer::PhysTimer`).
    pub phys_timer_intid: IntId,
    /// With a virtual PMU (`crate::vpmu`): its overflow PPI, forwarded.
    pub pmu_intid: Option<IntId>,
    pub maintenance_intid: IntId,
    pub hyp_timer_intid: IntId,
    /// Physical SPIs forwarded to the guest as HW interrupts.
    pub forwarded: Vec<IntId>,
    /// Whether each forwarded SPI is edge-triggered (same order); PCI INTx
    /// lines are level.
    pub forwarded_edge: Vec<bool>,
    /// The pCPU each forwarded SPI is physically routed to (same order).
    pub forwarded_pcpu: Vec<AtomicUsize>,
    /// What `runtime::vcpu::handle_irqs` does with each physical INTID. Read
    /// on every physical interrupt, written when routes change (the vITS
    /// mapping host LPIs): a leaf lock, never held while handling.
    pub routes: RwLock<IrqRoutes>,
    /// Physical interrupts taken, per route kind.
    pub irq_counters: IrqCounters,
    /// The guest's virtual ITS (`runtime::devices::vits`), when it has one.
    pub vits: Option<Mutex<Vits>>,
    /// Host LPIs whose guest mapping was gone (or refused) when they fired.
    pub lpis_dropped: AtomicU64,
    /// GICv4 direct injection (`runtime::vlpi`): the guest's MSIs are vLPIs
    /// of these vPEs. `None`: host LPIs through list registers (`runtime::devices::vits`).
    pub vlpi: Option<super::vlpi::VlpiVm>,
    /// The handler each emulated device registered for its ranges
    /// (`runtime::devices::attach`), called by `runtime::vcpu::mmio`;
    /// read-only once the VM is made.
    pub bus: Bus,
    pub vcpus: Vec<Mutex<Vcpu>>,
    pub shared: Vec<VcpuShared>,
    /// The host-wide scheduler (`Host::sched`), keyed by `Vm::gid`.
    pub sched: &'static Sched,
    pub nr_pcpus: usize,
    pub nr_lrs: usize,
    /// More vCPUs than pCPUs: trap WFE so spinning vCPUs yield.
    pub overcommitted: bool,
    /// The scheduler's extensions of Credit2 are on (`SchedConfig::extensions`;
    /// `hvctl set sched_wake_preempt=` changes it while running): only then
    /// does an SGI trap open a lock-holder grace, an overcommitted VM's
    /// spin watch run, or a yield have a target.
    pub extensions: AtomicBool,
    /// Guest data aborts reported (the log is rate-limited).
    pub bad_accesses: AtomicU64,
    /// The hypervisor's virtio-blk device, when the guest has one.
    pub disk: Option<VDisk>,
    /// The PCIe functions assigned to it (a DomU's, `runtime::pci`).
    pub pci_functions: Vec<crate::domain::vmplan::AssignedPci>,
    /// Their configuration space as the guest sees it (`vpci`), behind its
    /// virtual host bridge (`runtime::devices::vpci`).
    pub vpci: Option<Mutex<Vec<crate::vpci::AssignedFunction>>>,
    /// Guest accesses to configuration space the vPCI model refused or
    /// ignored, BAR moves it did not follow, and Dom0's reads of hidden
    /// functions.
    pub pci_counters: super::pci::PciCounters,
    /// What the hypervisor may allocate at run time on the VM's behalf
    /// (`crate::quota`): its disk's requests, on-demand stage-2 tables, the
    /// physical ITTs of its vITS's devices.
    pub quota: Arc<Quota>,
    /// `timer_slop_ns`.
    pub timer_slop_ns: u64,
    /// The host-wide flight recorder (`Host::trace`).
    pub trace: &'static [Mutex<Ring>],
    pub trace_trigger: &'static Trigger,
}

/// `n` vCPUs in reset state, all offline, and what other pCPUs see of them.
pub(super) fn new_vcpus(n: usize) -> (Vec<Mutex<Vcpu>>, Vec<VcpuShared>) {
    let mut vcpus = Vec::new();
    let mut shared = Vec::new();
    for i in 0..n {
        vcpus.push(Mutex::new(Vcpu {
            id: i,
            regs: GuestRegs::default(),
            el1: El1Context::reset(vcpu_mpidr(i)),
            fp: FpContext::default(),
            gicif: VcpuIfState::default(),
            lrs: [0; crate::vgic::NUM_LRS_MAX],
            vserror: Default::default(),
            lhp_grace: None,
            vpe_resident: false,
            pmu_ppi_set: false,
            ptimer: Default::default(),
            ptimer_level: false,
            pmu: Default::default(),
            mmio_hint: 0,
            routes_followed: None,
        }));
        shared.push(VcpuShared {
            online: AtomicBool::new(false),
            vtimer_deadline: AtomicU64::new(u64::MAX),
            vtimer_home: AtomicUsize::new(0),
            wake_at: AtomicU64::new(u64::MAX),
            ptimer_deadline: AtomicU64::new(u64::MAX),
            vtimer_fired: AtomicU64::new(u64::MAX),
            ppi_resync: AtomicU32::new(0),
            vlpi_pending: AtomicBool::new(false),
            vpe_on: AtomicUsize::new(usize::MAX),
            vpe_mapped: AtomicUsize::new(usize::MAX),
            left_masked: AtomicBool::new(false),
            preempted: AtomicBool::new(false),
            running_on: AtomicUsize::new(usize::MAX),
            counters: TrapCounters::default(),
        });
    }
    (vcpus, shared)
}

/// EL1h with D, A, I, F masked: the state Linux expects at entry.
pub const SPSR_EL1H_MASKED: u64 = 0x3c5;

/// vMPIDR of vCPU `i` (`domain::vcpu_mpidr`).
pub fn vcpu_mpidr(i: usize) -> u64 {
    crate::domain::vcpu_mpidr(i)
}
