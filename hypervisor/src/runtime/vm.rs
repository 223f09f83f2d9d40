//! A VM and its vCPUs: their state, and Dom0's creation (memory, kernel,
//! initrd, DTB, vGIC, stage 2, disk); DomUs are made in `runtime::domu`.
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
//! hardware facts the planner needs (`hw_facts`) and applies the plan.
//! Dom0 and the DomUs share the appliers (`apply_stage2`, `apply_vgic`,
//! `start_vcpus`, `apply_disk`) and one constructor, `Vm::from_plan`, which
//! makes the VM from its plan and what applying it made (`VmParts`).

use super::heap::HeapFrames;
use super::vblk::VDisk;
use crate::arch::cache;
use crate::arch::context::{El1Context, FpContext};
use crate::arch::exception::GuestRegs;
use crate::arch::gic::{self, VcpuIfState};
use crate::boot::plan::{LayoutError, ModuleCopy, Plan};
use crate::config::Config;
use crate::domain::vmplan::{self, DiskBacking, DiskPlan, Dom0Firmware, HwFacts, PlanError, VmPlan};
use crate::domain::DomainId;
use crate::dtb::{self, GuestDtbConfig, Platform};
use crate::intid::IntId;
use crate::iomem::IoMemPolicy;
use crate::irq::{IrqCounters, IrqRoutes, RouteError};
use crate::its::v4::LpiPath;
use crate::mmio_bus::{BusError, MmioBus};
use crate::platform;
use crate::quota::Quota;
use crate::region::Region;
use crate::sched::{DomainParams, SchedConfig, SchedError, Scheduler, VcpuId};
use crate::stage2::{IpaSize, Stage2, Stage2Error};
use crate::sync::{Mutex, Once, RwLock};
use crate::trace::{Ring, Trigger, RING_EVENTS};
use crate::vgic::its::{Vits, VitsConfig};
use crate::vgic::{Vgic, VgicConfig, VgicError};
use crate::vpl011::VPl011;
use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use log::{info, warn};

const MB: u64 = 1 << 20;

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
    /// grace; the next exit without that evidence closes it.
    pub lhp_grace: bool,
    /// Its GICv4 vPE is resident on the pCPU running it (`runtime::vlpi`).
    pub vpe_resident: bool,
    /// The emulated EL1 physical timer (`crate::ptimer::PhysTimer`) and the
    /// level last driven into the vGIC as its PPI.
    pub ptimer: crate::ptimer::PhysTimer,
    pub ptimer_level: bool,
    /// Its virtual PMU (`crate::vpmu`), used when the VM has one.
    pub pmu: crate::vpmu::VPmu,
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
    /// It last left its pCPU with the guest's IRQs masked (at EL1: inside
    /// a critical section, maybe holding a lock a sibling will spin on);
    /// while it is preempted so, siblings are watched closely for spinning
    /// (`sched::spin::Watch::Critical`).
    pub left_masked: AtomicBool,
    pub counters: TrapCounters,
}

/// What every VM shares: the one host-wide scheduler (every vCPU of every
/// VM has a globally unique `VcpuId`, `Vm::gid`) and the flight recorder
/// (one ring per pCPU). Made once, before the first VM.
pub struct Host {
    pub sched: Mutex<Scheduler>,
    /// The flight recorder: one ring per pCPU, written only by that pCPU
    /// (the lock is contended only by a dump copying it).
    pub trace: Vec<Mutex<Ring>>,
    /// When a wake→run latency dumps the rings (`sched_trace_threshold_us`).
    pub trace_trigger: Trigger,
    /// Guests get a virtual PMU where the CPU allows (`vpmu=`).
    pub vpmu: bool,
}

impl Vm {
    /// The host-wide scheduler id of local vCPU `local`.
    pub fn gid(&self, local: usize) -> VcpuId {
        VcpuId(self.vcpu_base + local as u32)
    }
}

static HOST: Once<Host> = Once::new();

impl Host {
    /// Makes the host-wide state once; later calls return the first.
    pub fn init(bootargs: &str, cfg: &Config, nr_pcpus: usize) -> Result<&'static Host, VmError> {
        if let Some(h) = HOST.get() {
            return Ok(h);
        }
        let sched_cfg = SchedConfig::from_bootargs(bootargs).map_err(VmError::Sched)?;
        let sched = Scheduler::new(sched_cfg, nr_pcpus).map_err(VmError::Sched)?;
        Ok(HOST.call_once(|| Host {
            sched: Mutex::new(sched),
            trace: (0..nr_pcpus).map(|_| Mutex::new(Ring::new(RING_EVENTS))).collect(),
            trace_trigger: Trigger::new(cfg.sched_trace_threshold_us, cfg.sched_trace_max_dumps)
                .with_dom0_key(cfg.sched_trace_dom0_key),
            vpmu: cfg.vpmu,
        }))
    }
}

/// The VM table: Dom0 at index 0, then the DomUs in domain-id order. Set
/// once when every VM is made, before any vCPU runs.
static VMS: Once<Vec<&'static Vm>> = Once::new();

/// Publishes the VM table (once; Dom0 first).
pub fn set_vms(vms: Vec<&'static Vm>) -> &'static [&'static Vm] {
    VMS.call_once(|| vms)
}

/// The VM table; waits until it is published (secondary pCPUs).
pub fn vms() -> &'static [&'static Vm] {
    // Every exit asks: once published, one load answers.
    match VMS.get() {
        Some(v) => v,
        None => VMS.wait(),
    }
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
    pub vgic: Mutex<Vgic>,
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
    /// The guest's virtual ITS (`runtime::its`), when it has one.
    pub vits: Option<Mutex<Vits>>,
    /// Host LPIs whose guest mapping was gone (or refused) when they fired.
    pub lpis_dropped: AtomicU64,
    /// GICv4 direct injection (`runtime::vlpi`): the guest's MSIs are vLPIs
    /// of these vPEs. `None`: host LPIs through list registers (issue 9).
    pub vlpi: Option<super::vlpi::VlpiVm>,
    /// Which emulated device answers a trapped access (`runtime::vcpu::mmio`);
    /// read-only once the VM is made.
    pub bus: MmioBus,
    pub vcpus: Vec<Mutex<Vcpu>>,
    pub shared: Vec<VcpuShared>,
    /// The host-wide scheduler (`Host::sched`), keyed by `Vm::gid`.
    pub sched: &'static Mutex<Scheduler>,
    pub nr_pcpus: usize,
    pub nr_lrs: usize,
    /// More vCPUs than pCPUs: trap WFE so spinning vCPUs yield.
    pub overcommitted: bool,
    /// Guest data aborts reported (the log is rate-limited).
    pub bad_accesses: AtomicU64,
    /// The hypervisor's virtio-blk device, when the guest has one.
    pub disk: Option<VDisk>,
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

/// Whether a virtio-mmio slot holds a device (MagicValue "virt" and a
/// non-zero DeviceID).
fn virtio_mmio_present(base: u64) -> bool {
    // SAFETY: virtio-mmio registers from the platform's DTB, identity-mapped
    // as device memory; reading MagicValue and DeviceID has no side effects.
    unsafe {
        core::ptr::read_volatile(base as *const u32) == 0x7472_6976
            && core::ptr::read_volatile((base + 8) as *const u32) != 0
    }
}

/// Copies a boot module into guest RAM and zeroes the rest of its room
/// (the kernel's BSS beyond the file).
pub(super) fn copy_module(c: &ModuleCopy) {
    let len = c.src.size.min(c.dst.size);
    // SAFETY: the plan checked that `src` lies in RAM and `dst` in guest
    // RAM, which overlaps nothing the hypervisor keeps (the modules among
    // them), so the two do not overlap; both are identity-mapped normal
    // memory and the guest does not run yet.
    unsafe {
        core::ptr::copy_nonoverlapping(c.src.base as *const u8, c.dst.base as *mut u8, len as usize);
        core::ptr::write_bytes((c.dst.base + len) as *mut u8, 0, (c.dst.size - len) as usize);
    }
    cache::clean_to_poc(c.dst.base, c.dst.size);
}

/// What the planner needs from the hardware (`domain::vmplan::HwFacts`):
/// the PA size, the distributor's SPIs, whether the physical ITS works,
/// which virtio-mmio slots hold a device (read only when `probe_virtio`:
/// a DomU gets none), the platform's fallback INTIDs, the PMU interrupt
/// when guests get a vPMU (`vpmu`, and the CPU's PMU allows it).
pub(super) fn hw_facts(plat: &Platform, probe_virtio: bool, vpmu: bool) -> HwFacts {
    let pmu_ok = vpmu && crate::vpmu::supported(crate::arch::el2::cpu_features().pmu);
    HwFacts {
        pa_bits: crate::stage2::pa_bits(crate::arch::el2::parange()),
        nr_spis: gic::nr_spis(),
        its_present: gic::its::its_present(),
        present: if probe_virtio {
            plat.virtio_mmio.iter().filter(|d| virtio_mmio_present(d.base)).map(|d| d.base).collect()
        } else {
            Vec::new()
        },
        uart_intid: platform::PLATFORM.uart_intid,
        maintenance_intid: platform::PLATFORM.maintenance_intid,
        kick: super::percpu::SGI_KICK,
        pmu_intid: plat.pmu_intid.filter(|_| pmu_ok),
    }
}

/// Applies a plan's stage 2: a new table, every mapping it lists.
pub(super) fn apply_stage2(vp: &VmPlan) -> Result<(Stage2, HeapFrames), VmError> {
    let mut frames = HeapFrames::default();
    let mut s2 = Stage2::new(&mut frames, vp.ipa)?;
    for m in &vp.mappings {
        s2.map(&mut frames, m.ipa, m.pa, m.size, m.mem)?;
    }
    Ok((s2, frames))
}

/// Applies a plan's vGIC: the virtual timer (and the PMU's overflow
/// interrupt, with a vPMU) HW-linked on every vCPU, the
/// forwarded SPIs HW-linked to the same physical INTIDs.
pub(super) fn apply_vgic(vp: &VmPlan) -> Result<Vgic, VmError> {
    let mut vgic = Vgic::try_new(VgicConfig {
        gicd_base: vp.vgic.gicd_base,
        gicr_base: vp.vgic.gicr_base,
        nr_spis: vp.vgic.nr_spis,
        vcpu_mpidrs: (0..vp.nr_vcpus).map(vcpu_mpidr).collect(),
        lpis: vp.vgic.lpis,
    })?;
    let vt = vp.virt_timer_intid;
    for v in 0..vp.nr_vcpus {
        vgic.set_hw_private(v, vt, Some(vt))?;
        if let Some(p) = vp.pmu_intid {
            vgic.set_hw_private(v, p, Some(p))?;
        }
    }
    for f in &vp.forwarded {
        vgic.set_hw(f.intid, Some(f.intid))?;
    }
    Ok(vgic)
}

/// What Dom0 learns the machine from.
pub enum GuestFirmware<'a> {
    /// A DT derived from the host's (the `-kernel` and TF-A boots).
    Dtb(&'a [u8]),
    /// ACPI (the EFI boot): `firmware::dom0_efi` in the guest DTB area.
    Acpi(AcpiDom0<'a>),
}

/// The host's ACPI side of an ACPI Dom0.
pub struct AcpiDom0<'a> {
    pub tables: &'a crate::firmware::acpi::Tables<'a>,
    /// Host firmware memory Dom0 reads (ACPI reclaim/NVS), identity-mapped
    /// as normal memory and passed on in Dom0's memory map.
    pub firmware: Vec<crate::firmware::uefi::MemoryDescriptor>,
    /// Every range of the firmware's memory map that is not MMIO: never
    /// mapped on demand (Dom0's devices are, `crate::iomem`).
    pub memory: Vec<Region>,
}

/// vMPIDR of vCPU `i` (`domain::vcpu_mpidr`).
pub fn vcpu_mpidr(i: usize) -> u64 {
    crate::domain::vcpu_mpidr(i)
}

/// Writes Dom0's firmware view into the plan's guest DTB slot: a DT
/// derived from the host's without the nodes the plan hides, or an ACPI
/// Dom0's tables, EFI system table and memory map.
fn write_dom0_firmware(plat: &Platform, plan: &Plan, vp: &VmPlan, firmware: &GuestFirmware<'_>) -> Result<(), VmError> {
    let kernel_mod = plat.kernel.as_ref().ok_or(VmError::NoKernel)?;
    let (ram, nr_vcpus) = (vp.ram, vp.nr_vcpus);
    let initrd = plan.initrd.map(|c| c.dst);
    let bootargs = kernel_mod.bootargs.clone().unwrap_or_else(|| String::from("console=ttyAMA0"));
    let vcpu_mpidrs: Vec<u64> = (0..nr_vcpus).map(vcpu_mpidr).collect();
    let keep_its = vp.its.is_some();
    let guest_dtb = match firmware {
        GuestFirmware::Dtb(host_dtb) => {
            let mut remove = dtb::default_removals(host_dtb, vp.pmu_intid.is_some())?;
            remove.extend(vp.hidden_paths.iter().cloned());
            dtb::build_guest_dtb(
                host_dtb,
                &GuestDtbConfig {
                    memory: ram,
                    vcpu_mpidrs,
                    bootargs,
                    initrd,
                    remove_paths: remove,
                    extra_virtio_mmio: Vec::new(),
                    keep_its,
                    ipa_size: Some(vp.ipa.limit()),
                },
            )?
        }
        GuestFirmware::Acpi(a) => {
            use crate::firmware::acpi::dom0::Dom0AcpiConfig;
            use crate::firmware::dom0_efi::{build_dom0_efi, Dom0EfiConfig};
            let acpi_cfg =
                Dom0AcpiConfig { vcpu_mpidrs, base: 0, remove: Vec::new(), keep_uart: true, drop_its: !keep_its };
            let efi = build_dom0_efi(
                a.tables,
                &acpi_cfg,
                &Dom0EfiConfig {
                    ram,
                    area: plan.guest_dtb,
                    bootargs,
                    initrd,
                    firmware: a.firmware.clone(),
                    mmio: vp.mmio.clone(),
                },
            )
            .map_err(VmError::Efi)?;
            info!(
                "dom0 ACPI: RSDP {:#x}, EFI system table {:#x}, memory map {:#x} ({} bytes)",
                efi.tables.rsdp, efi.system_table, efi.memory_map.base, efi.memory_map.size
            );
            efi.blob
        }
    };
    write_firmware_blob(&guest_dtb, plan.guest_dtb, "guest DTB (or ACPI Dom0 firmware area) larger than 2 MiB")
}

/// Copies a VM's firmware view (its DTB, or an ACPI Dom0's tables) into
/// `slot`, host memory at the top of its RAM; `too_big` says whose blob did
/// not fit.
pub(super) fn write_firmware_blob(blob: &[u8], slot: Region, too_big: &'static str) -> Result<(), VmError> {
    if blob.len() as u64 > slot.size {
        return Err(VmError::Memory(too_big));
    }
    // SAFETY: `slot` is the last 2 MiB of the VM's RAM, reserved for its
    // DTB by the plan: host memory nothing else uses, identity-mapped as
    // normal memory, and the guest does not run yet.
    unsafe { core::ptr::copy_nonoverlapping(blob.as_ptr(), slot.base as *mut u8, blob.len()) };
    cache::clean_to_poc(slot.base, blob.len() as u64);
    Ok(())
}

/// Makes the hypervisor's virtio-blk the plan gives the VM: a RAM image
/// (any VM; Dom0's is logged, a DomU's shows in its `d<N>:` line) or the
/// physical virtio-blk device (Dom0 only: its RAM is identity-mapped).
pub(super) fn apply_disk(vp: &VmPlan, quota: &Arc<Quota>) -> Result<Option<VDisk>, VmError> {
    let ram = vp.ram;
    let too_small = |_| VmError::Memory("the heap quota cannot hold the disk's largest request");
    Ok(match vp.disk {
        Some(DiskPlan { base, intid, backing: DiskBacking::Ram { image, latency_us } }) => {
            // SAFETY: the plan put the RAM disk in host RAM that holds
            // nothing the hypervisor keeps, lies outside every VM's RAM and
            // the heap, and that no stage 2 maps: it is ours alone,
            // identity-mapped. The guest's RAM is `ram` at `ram_host` in the
            // hypervisor's identity map.
            let bytes = unsafe {
                core::ptr::write_bytes(image.base as *mut u8, 0, image.size as usize);
                core::slice::from_raw_parts_mut(image.base as *mut u8, image.size as usize)
            };
            if vp.domid == 0 {
                info!(
                    "dom0 disk: virtio-blk at {:#x}, {}, RAM image {} MiB, service time {} us",
                    base,
                    intid,
                    image.size / MB,
                    latency_us
                );
            }
            // SAFETY: as above.
            let disk = unsafe {
                VDisk::new_ram_at(base, intid, bytes, latency_us * 1000, ram.base, ram.size, vp.ram_host, quota)
            };
            Some(disk.map_err(too_small)?)
        }
        // A DomU's disk is a RAM image (`domain::vmplan::plan_domu`).
        Some(DiskPlan { backing: DiskBacking::Phys { .. }, .. }) if vp.domid != 0 || vp.ram_host != ram.base => {
            return Err(VmError::Memory("a DomU cannot drive a physical disk"))
        }
        Some(DiskPlan { base, intid, backing: DiskBacking::Phys { size } }) => {
            // SAFETY: the device is not passed through (its page is not
            // in stage 2): only the hypervisor drives it.
            let phys = unsafe { super::physblk::open(base, size as usize) }.map_err(|e| {
                log::error!("physical virtio-blk: {e:?}");
                VmError::Memory("the physical virtio-blk device did not initialise")
            })?;
            info!(
                "dom0 disk: virtio-blk at {:#x}, {}, over the physical virtio-blk ({} sectors)",
                base,
                intid,
                phys.capacity_sectors()
            );
            // SAFETY: Dom0's RAM is identity-mapped (checked above).
            Some(unsafe { VDisk::new_phys(base, intid, phys, ram.base, ram.size, quota) }.map_err(too_small)?)
        }
        None => None,
    })
}

/// How a VM's vCPUs join the host-wide scheduler, and where vCPU 0 enters
/// its kernel.
pub(super) struct VcpuStart<'a> {
    /// The domain's Credit2 weight and cap.
    pub params: DomainParams,
    /// The host-wide scheduler id of local vCPU 0 (`Vm::gid`).
    pub vcpu_base: u32,
    /// `Some(nr_pcpus)`: vCPU i is pinned to pCPU i % nr_pcpus
    /// (`dom0_vcpus_pin`); `None`: unpinned.
    pub pin_to: Option<usize>,
    /// Per-vCPU weights, by host-wide id (`sched_vcpu_weight`).
    pub weights: &'a [(VcpuId, u32)],
    /// vCPU 0's x0 (the DTB's IPA) and entry point (the kernel's IPA).
    pub dtb: u64,
    pub kernel: u64,
}

/// Makes the plan's vCPUs and adds them to the host-wide scheduler in
/// domain `vp.domid`; vCPU 0 is online at its kernel's entry per the arm64
/// boot protocol and powered on, the others wait for PSCI CPU_ON.
pub(super) fn start_vcpus(
    vp: &VmPlan,
    host: &Host,
    s: &VcpuStart<'_>,
) -> Result<(Vec<Mutex<Vcpu>>, Vec<VcpuShared>), VmError> {
    let mut sched = host.sched.lock();
    sched.add_domain(vp.domid, s.params).map_err(VmError::Sched)?;
    for i in 0..vp.nr_vcpus {
        let pin = s.pin_to.map(|n| i % n);
        sched.add_vcpu(VcpuId(s.vcpu_base + i as u32), vp.domid, pin).map_err(VmError::Sched)?;
    }
    // Our extension of Credit2: a vCPU's own weight.
    for &(v, w) in s.weights {
        match sched.set_vcpu_weight(0, v, Some(w)) {
            Ok(()) => info!("sched: {v} weight {w} (sched_vcpu_weight)"),
            // A vCPU Dom0 does not have: Xen's way with a boot option that
            // does not apply, a warning.
            Err(crate::sched::SchedError::UnknownVcpu(_)) => {
                warn!("sched_vcpu_weight={}:{w}: Dom0 has {} vCPU(s), no vCPU {}; ignored", v.0, vp.nr_vcpus, v.0)
            }
            Err(e) => return Err(VmError::Sched(e)),
        }
    }
    let (vcpus, shared) = new_vcpus(vp.nr_vcpus);
    {
        let mut v0 = vcpus[0].lock();
        v0.regs.x[0] = s.dtb;
        v0.regs.elr = s.kernel;
        v0.regs.spsr = SPSR_EL1H_MASKED;
    }
    shared[0].online.store(true, Ordering::Release);
    sched.power_on(0, VcpuId(s.vcpu_base)).map_err(VmError::Sched)?;
    Ok((vcpus, shared))
}

/// What a VM is made of beyond its plan: what applying the plan made, and
/// its place among the host's VMs.
pub(super) struct VmParts {
    /// Its stage-2 tag, unique per VM (Dom0's is 1, DomU N's is N + 1).
    pub vmid: u16,
    /// The host-wide scheduler id of local vCPU 0 (`Vm::gid`).
    pub vcpu_base: u32,
    /// `apply_stage2`'s tables.
    pub stage2: (Stage2, HeapFrames),
    /// `apply_vgic`'s vGIC.
    pub vgic: Vgic,
    /// `start_vcpus`' vCPUs.
    pub vcpus: (Vec<Mutex<Vcpu>>, Vec<VcpuShared>),
    /// `apply_disk`'s disk.
    pub disk: Option<VDisk>,
    /// The guest's vITS, when the plan gives it one (`vp.its`).
    pub vits: Option<Mutex<Vits>>,
    /// `timer_slop_ns` (Dom0's; 0 for a DomU).
    pub timer_slop_ns: u64,
    /// Its heap quota (`vp.heap_quota`), already charged by its disk.
    pub quota: Arc<Quota>,
}

impl Vm {
    /// The VM a plan describes, from the parts applying it made: its IRQ
    /// route table and MMIO bus from the plan, GICv4 vLPIs when it has a
    /// vITS and the physical ITS injects directly, the host-wide scheduler
    /// and flight recorder from `host`.
    pub(super) fn from_plan(
        vp: &VmPlan,
        parts: VmParts,
        host: &'static Host,
        nr_pcpus: usize,
    ) -> Result<Box<Vm>, VmError> {
        let VmParts {
            vmid,
            vcpu_base,
            stage2: (s2, mut frames),
            vgic,
            vcpus: (vcpus, shared),
            disk,
            vits,
            timer_slop_ns,
            quota,
        } = parts;
        // Tables from now on are mapped on the guest's behalf (on-demand
        // device memory): charged to it.
        frames.charge_to(quota.clone());
        let nr_vcpus = vp.nr_vcpus;
        let nr_lrs = crate::vgic::usable_lrs(gic::nr_lrs())?;
        let mut routes = vp.routes()?;
        let bus = vp.mmio_bus()?;
        let vlpi = match vp.its {
            Some(_) if gic::its::lpi_path() == LpiPath::Direct => {
                super::vlpi::VlpiVm::create(nr_vcpus, nr_pcpus, &mut routes)
            }
            _ => None,
        };
        if let Some(r) = vp.its {
            let how = if vlpi.is_some() { "GICv4 vLPIs with doorbells" } else { "host LPIs" };
            let who = if vp.domid == 0 { String::from("dom0") } else { alloc::format!("d{}", vp.domid) };
            info!("{who} ITS: virtual GITS control frame at {:#x}, MSIs backed by {how}", r.base);
        }
        Ok(Box::new(Vm {
            domid: vp.domid,
            vmid,
            ram: vp.ram,
            ram_host: vp.ram_host,
            vcpu_base,
            stopped: AtomicBool::new(false),
            stage2_root: s2.root(),
            ipa: vp.ipa,
            stage2: Mutex::new((s2, frames)),
            // `None` (every DomU, a DT Dom0): every access outside its RAM
            // and devices aborts.
            iomem: vp.iomem.clone(),
            iomem_maps: AtomicU64::new(0),
            iomem_denied: AtomicU64::new(0),
            vgic: Mutex::new(vgic),
            uart: Mutex::new(VPl011::new()),
            uart_region: vp.uart,
            uart_intid: vp.uart_intid,
            virt_timer_intid: vp.virt_timer_intid,
            phys_timer_intid: vp.phys_timer_intid,
            pmu_intid: vp.pmu_intid,
            maintenance_intid: vp.maintenance_intid,
            hyp_timer_intid: vp.hyp_timer_intid,
            forwarded_pcpu: vp.forwarded.iter().map(|_| AtomicUsize::new(0)).collect(),
            forwarded: vp.forwarded.iter().map(|f| f.intid).collect(),
            forwarded_edge: vp.forwarded.iter().map(|f| f.edge).collect(),
            // A DomU's is not consulted (physical interrupts go by Dom0's
            // table); kept so every VM has the same shape.
            routes: RwLock::new(routes),
            vits,
            lpis_dropped: AtomicU64::new(0),
            vlpi,
            irq_counters: IrqCounters::default(),
            bus,
            vcpus,
            shared,
            sched: &host.sched,
            nr_pcpus,
            nr_lrs,
            overcommitted: nr_vcpus > nr_pcpus,
            bad_accesses: AtomicU64::new(0),
            disk,
            quota,
            timer_slop_ns,
            trace: &host.trace,
            trace_trigger: &host.trace_trigger,
        }))
    }

    /// Builds the Dom0-style guest from the boot modules, where `plan` says:
    /// `domain::vmplan::plan_dom0` decides its machine, this applies it
    /// (copies the modules, writes the guest DTB or ACPI tables, maps stage
    /// 2, makes the vGIC, vCPUs, disk and vITS) and makes the VM
    /// (`Vm::from_plan`). Dom0's vCPUs are host-wide ids 0..nr_vcpus (made
    /// first), in scheduler domain 0; its VMID is 1.
    pub fn create_dom0(
        plat: &Platform,
        cfg: &Config,
        plan: &Plan,
        firmware: &GuestFirmware<'_>,
        nr_pcpus: usize,
        host: &'static Host,
    ) -> Result<Box<Vm>, VmError> {
        let hw = hw_facts(plat, true, host.vpmu);
        let fw_regions: Vec<Region> = match firmware {
            GuestFirmware::Acpi(a) => a.firmware.iter().filter_map(|d| d.region()).collect(),
            GuestFirmware::Dtb(_) => Vec::new(),
        };
        let fw = match firmware {
            GuestFirmware::Acpi(a) => Dom0Firmware::Acpi { firmware: &fw_regions, memory: &a.memory },
            GuestFirmware::Dtb(_) => Dom0Firmware::Dt,
        };
        let vp = vmplan::plan_dom0(plat, plan, cfg, fw, &hw).map_err(VmError::Plan)?;
        info!("dom0 stage 2: {}-bit IPA ({}-bit PA)", vp.ipa.bits(), hw.pa_bits);
        let nr_vcpus = vp.nr_vcpus;
        // The kernel (an Image at the bottom of guest RAM with image_size
        // reserved, or its pieces at their fixed addresses), the initrd
        // and the DTB around it: see `boot::plan`.
        for c in &plan.kernel {
            copy_module(c);
        }
        if let Some(c) = &plan.initrd {
            copy_module(c);
        }
        write_dom0_firmware(plat, plan, &vp, firmware)?;
        let stage2 = apply_stage2(&vp)?;
        let vgic = apply_vgic(&vp)?;
        log_dom0_devices(&vp, firmware);

        let weights =
            SchedConfig::vcpu_weights_from_bootargs(plat.bootargs.as_deref().unwrap_or("")).map_err(VmError::Sched)?;
        let vcpus = start_vcpus(
            &vp,
            host,
            &VcpuStart {
                params: DomainParams { weight: cfg.dom0_weight, cap_percent: cfg.dom0_cap },
                vcpu_base: 0,
                pin_to: cfg.dom0_vcpus_pin.then_some(nr_pcpus),
                weights: &weights,
                dtb: plan.guest_dtb.base,
                kernel: plan.entry,
            },
        )?;
        let quota = Arc::new(Quota::new(vp.heap_quota));
        let disk = apply_disk(&vp, &quota)?;
        info!(
            "dom0: {} vCPU(s) on {} pCPU(s), RAM {:#x}-{:#x}, kernel entry {:#x} ({} KiB in {} piece(s)), initrd {:?}, dtb {:#x}, {} passthrough device(s)",
            nr_vcpus,
            nr_pcpus,
            vp.ram.base,
            vp.ram.end(),
            plan.entry,
            plan.kernel.iter().map(|c| c.dst.size).sum::<u64>() / 1024,
            plan.kernel.len(),
            plan.initrd.map(|c| (c.dst.base, c.dst.size)),
            plan.guest_dtb.base,
            vp.passthrough.len()
        );
        let vits = match vp.its {
            Some(r) => {
                Some(Mutex::new(Vits::new(VitsConfig { base: r.base, nr_vcpus, msi_vcpu: cfg.msi_vcpu(nr_vcpus) })?))
            }
            None => None,
        };
        let parts =
            VmParts { vmid: 1, vcpu_base: 0, stage2, vgic, vcpus, disk, vits, timer_slop_ns: cfg.timer_slop_ns, quota };
        Vm::from_plan(&vp, parts, host, nr_pcpus)
    }
}

/// Logs what Dom0 is given beyond RAM: an ACPI Dom0's forwarded SPIs, the
/// PCIe host bridges passed through.
fn log_dom0_devices(vp: &VmPlan, firmware: &GuestFirmware<'_>) {
    if matches!(firmware, GuestFirmware::Acpi(_)) {
        info!(
            "dom0 ACPI: {} SPIs forwarded (all but the hypervisor's UART, {})",
            vp.forwarded
                .iter()
                .filter(|f| !vp.bridges.iter().flat_map(|b| &b.intx).any(|i| i.intid == f.intid))
                .count(),
            vp.console_intid
        );
    }
    for b in &vp.bridges {
        info!(
            "dom0 PCIe: {} ECAM {:#x}+{:#x}, {} window(s) mapped, INTx {:?}",
            b.path,
            b.ecam.base,
            b.ecam.size,
            b.passthrough_frames(vp.ipa.limit()).len() - 1,
            b.intx.iter().map(|i| u32::from(i.intid)).collect::<Vec<_>>()
        );
    }
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
            lhp_grace: false,
            vpe_resident: false,
            ptimer: Default::default(),
            ptimer_level: false,
            pmu: Default::default(),
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
            left_masked: AtomicBool::new(false),
            running_on: AtomicUsize::new(usize::MAX),
            counters: TrapCounters::default(),
        });
    }
    (vcpus, shared)
}

/// EL1h with D, A, I, F masked: the state Linux expects at entry.
pub const SPSR_EL1H_MASKED: u64 = 0x3c5;
