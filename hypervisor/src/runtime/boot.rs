//! Boot: EL2 MMU, console, bootstrap heap, platform discovery from the DTB,
//! the boot-layout plan (`crate::boot::plan`), the main heap, the physical
//! GIC, and the Dom0-style VM. Every stop on an error is one `(HV) fatal:`
//! line (`hv_fatal!`) and PSCI SYSTEM_OFF.

use super::percpu::{self, pcpu};
use super::{console, heap, vcpu, vm};
use crate::arch::entry::STACK_SIZE;
use crate::arch::{cache, el2, exception, gic, mmu, smc, sysreg};
use crate::boot::handoff::{self, Convention, NoDtb};
use crate::boot::image::{self as boot_image, KernelLoad};
use crate::boot::pcpus;
use crate::boot::plan::{self, LayoutError, Plan};
use crate::config::{Config, ConfigError, DiskMode};
use crate::domain::pool;
use crate::dtb::{self, BootInfo, BootModule, Machine};
use crate::hv_fatal;
use crate::its::v4::LpiPath;
use crate::platform;
use crate::region::Region;
use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::Ordering;
use log::{error, info, warn};

extern "C" {
    static __image_start: u8;
    static __image_end: u8;
}

/// Finds the DTB among the boot registers (either BL33 convention,
/// `boot::handoff`). Runs with the MMU on: only normal memory of the
/// identity map (39 bits, outside the platform's device windows) is read,
/// never a device register.
fn find_dtb(regs: [u64; 4]) -> Result<(&'static [u8], Convention), NoDtb> {
    let normal = |a: u64| a >> 30 < 512 && !platform::is_device_gib(a >> 30);
    let readable = |a: u64, len: u64| len > 0 && a.checked_add(len - 1).is_some_and(|e| normal(a) && normal(e));
    // SAFETY: `find_dtb` reads only 4-byte-aligned words (the candidate is
    // 8-byte aligned) inside ranges `readable` accepted: identity-mapped
    // normal memory, where a read has no side effect.
    let read_be32 = |a: u64| u32::from_be(unsafe { core::ptr::read_volatile(a as *const u32) });
    let h = handoff::find_dtb(regs, readable, read_be32)?;
    // SAFETY: a checked FDT header whose whole `totalsize` lies in normal
    // memory; the plan keeps everything the hypervisor writes off it.
    Ok((unsafe { core::slice::from_raw_parts(h.dtb as *const u8, h.size as usize) }, h.convention))
}

/// Checks the boot inputs, reads the kernel module (once it is known to
/// lie in RAM and overlap nothing: an arm64 Image, an ELF file, or a raw
/// binary at `dom0_kernel_load_addr=`) and plans the layout.
pub(super) fn plan_layout(
    machine: &Machine,
    boot: &BootInfo,
    kernel: &BootModule,
    cfg: &Config,
    image: Region,
    dtb: &[u8],
) -> Result<Plan, LayoutError> {
    let mut inputs = plan::Inputs {
        ram: &machine.memory,
        image,
        dtb: Region { base: dtb.as_ptr() as u64, size: dtb.len() as u64 },
        reserved: &machine.reserved,
        kernel: plan::Kernel { module: Region { base: kernel.base, size: kernel.size }, image_size: 0, fixed: None },
        initrd: boot.initrd(),
        dom0_mem: cfg.dom0_mem,
        ram_disk: if cfg.disk == DiskMode::Ram { cfg.disk_size } else { 0 },
        // Grows with the pCPUs (their stacks, rings, LPI tables) and holds
        // every VM's heap quota, so no guest can exhaust it.
        heap_size: crate::quota::heap_size(
            pcpus::heap_size(machine.cpus.len()),
            core::iter::once(cfg.dom0_heap_quota)
                .chain(boot.domus.iter().map(|d| d.heap_quota))
                .chain(core::iter::once(pool::max_domains(cfg.domu_pool) * pool::POOL_DOMAIN_HEAP)),
        ),
        keep_low: platform::PLATFORM.hyp_reserved,
        domus: &boot.domus,
        domu_pool: cfg.domu_pool,
    };
    plan::check(&inputs)?;
    // SAFETY: the module lies in RAM (checked just above), identity-mapped
    // as normal memory, and nothing has written it.
    let file = unsafe { core::slice::from_raw_parts(kernel.base as *const u8, kernel.size as usize) };
    let load = boot_image::read_kernel(file, cfg.dom0_kernel_load_addr)?;
    match &load {
        KernelLoad::Image { size } => inputs.kernel.image_size = *size,
        KernelLoad::Fixed(f) => inputs.kernel.fixed = Some(f),
    }
    plan::plan(&inputs)
}

/// The hypervisor's options. A malformed one is reported and the defaults
/// used (the machine still boots, as Xen's does); a bad scheduler option
/// stops the boot, as the scheduler would run otherwise than asked.
pub(super) fn parse_options(args: &str) -> Config {
    match Config::parse(args) {
        Ok(c) => c,
        Err(ConfigError::Sched(e)) => hv_fatal!("scheduler: {e}"),
        Err(e) => {
            error!("bad hypervisor option: {e:?}; using defaults");
            Config::default()
        }
    }
}

/// The primary pCPU's first steps, however it was started: MMU, early
/// console, bootstrap heap, its run block and mitigations. Nothing outside
/// the image is written until the layout is planned: the bootstrap heap (in
/// .bss) serves discovery and planning; then the planned main heap is added
/// and the guest built where the plan says.
pub fn early_init() {
    // The locks' spin-wait step is the EL2 layer's YIELD from here on,
    // before any other CPU runs.
    crate::sync::set_relax(crate::arch::sysreg::cpu_relax);
    // And their clock: the counter (frequency from CNTFRQ_EL0 until the
    // timer's setup refines it).
    crate::sync::set_clock(super::percpu::now_ns);
    // SAFETY: the primary CPU, once, MMU off, before any secondary starts.
    unsafe { mmu::enable(platform::is_device_gib) };
    // SAFETY: the platform's early console is a PL011 only the console
    // module drives.
    unsafe { console::init(platform::PLATFORM.early_uart as usize) };
    heap::init_bootstrap();
    console::init_log(log::LevelFilter::Info);
    // SAFETY: pCPU 0 takes its own run block, once.
    exception::init_cpu(unsafe { percpu::run_block(0) }, super::mitigations::init_cpu());
    el2::init_extended_controls();
}

/// The device-tree boot, after [`early_init`]: the DTB `regs` point at
/// (`boot::handoff`) describes the machine and carries Dom0's modules.
pub fn primary_main(regs: [u64; 4]) -> ! {
    // SAFETY: the image symbols come from the linker script.
    let (img_start, img_end) = (core::ptr::addr_of!(__image_start) as usize, core::ptr::addr_of!(__image_end) as usize);
    let (dtb, convention) = match find_dtb(regs) {
        Ok(d) => d,
        Err(e) => hv_fatal!("{e}"),
    };
    info!(
        "hypervisor {} on {} (image {:#x}-{:#x}, dtb {:#x}, {convention})",
        env!("CARGO_PKG_VERSION"),
        platform::PLATFORM.name,
        img_start,
        img_end,
        dtb.as_ptr() as usize,
    );

    let (machine, boot) = match dtb::discover(dtb) {
        Ok(p) => p,
        Err(e) => hv_fatal!("device tree: {e}"),
    };
    let cfg = parse_options(boot.options());
    console::init_log(cfg.loglvl);
    if let Some(u) = &machine.uart {
        // SAFETY: the DTB's console UART (the same device as the early
        // console on the platforms we support), driven only by `console`.
        unsafe { console::init(u.base as usize) };
    }
    info!("options: {}", boot.options());
    info!(
        "{} CPUs, RAM {:#x?}, GICv{} GICD {:#x} GICR {:#x}",
        machine.cpus.len(),
        machine.memory.iter().map(|r| (r.base, r.size)).collect::<alloc::vec::Vec<_>>(),
        machine.gic.version,
        machine.gic.gicd.base,
        machine.gic.gicr.first().map_or(0, |r| r.base)
    );
    for d in &boot.domus {
        info!("{d}");
    }
    let Some(kernel) = &boot.kernel else {
        hv_fatal!("no guest kernel: the device tree has no /chosen/module@... (multiboot,kernel)");
    };
    let image = Region { base: img_start as u64, size: (img_end - img_start) as u64 };
    let plan = match plan_layout(&machine, &boot, kernel, &cfg, image, dtb) {
        Ok(p) => p,
        Err(e) => hv_fatal!("boot layout: {e}"),
    };
    info!(
        "layout: heap {:#x}-{:#x}, guest RAM {:#x}-{:#x}, RAM disk {:#x?}",
        plan.heap.base,
        plan.heap.end(),
        plan.guest_ram.base,
        plan.guest_ram.end(),
        plan.ram_disk.map(|d| (d.base, d.end()))
    );
    for d in &plan.domus {
        info!("layout: {d}");
    }
    let nr_pcpus = bring_up(&machine, &cfg, &plan);
    // Keep a copy, though the plan keeps guest memory off the original.
    let host_dtb: &'static [u8] = Box::leak(dtb.to_vec().into_boxed_slice());
    run_dom0(&machine, &boot, &cfg, &plan, &super::dom0::GuestFirmware::Dtb(host_dtb), nr_pcpus)
}

/// Once the layout is planned, on either boot path (DT, EFI): the main
/// heap, the per-pCPU state for every CPU the machine describes (up to
/// `pcpus::MAX_PCPUS`), the physical GIC and ITS, the secondary pCPUs.
/// Returns how many pCPUs are online.
pub(super) fn bring_up(machine: &Machine, cfg: &Config, plan: &Plan) -> usize {
    // SAFETY: the plan put the heap in RAM that holds nothing the
    // hypervisor keeps (image, DTB, modules, reserved regions) and that is
    // identity-mapped normal memory; it is added once.
    unsafe { heap::add(plan.heap.base as usize, plan.heap.size as usize) };

    // Redistributor regions outside the platform's device windows are not
    // mapped as device memory: left out, with their CPUs.
    let regions: Vec<Region> = machine.gic.gicr.iter().copied().filter(|r| device_mapped(*r)).collect();
    for r in machine.gic.gicr.iter().filter(|r| !device_mapped(**r)) {
        warn!("GICR region {:#x}+{:#x} is outside the platform's device windows; its CPUs stay off", r.base, r.size);
    }
    let described = machine.cpus.len().min(pcpus::MAX_PCPUS);
    // SAFETY: the GIC frames the firmware names, inside the platform's
    // device windows (mapped as device memory, checked above); from here
    // only `gic` touches them.
    let frames = match unsafe { gic::init(machine.gic.gicd.base, &regions, described) } {
        Ok(n) => n,
        Err(e) => hv_fatal!("GIC: {e:?}"),
    };
    let count = match pcpus::count(machine.cpus.len(), gic::served(&machine.cpus)) {
        Ok(c) => c,
        Err(e) => hv_fatal!("{e}"),
    };
    info!("GIC: {frames} redistributors in {} GICR region(s)", regions.len());
    if count.ignored > 0 {
        warn!(
            "{} CPUs described, {} with a redistributor; bringing up {} (bound {})",
            machine.cpus.len(),
            gic::served(&machine.cpus),
            count.used,
            pcpus::MAX_PCPUS
        );
    }
    percpu::init(count.used);

    init_its(machine, cfg, count.used);
    super::smmu::init_smmus(machine, cfg, device_mapped);
    gic::init_cpu(0);
    if let Err(e) = crate::vgic::usable_lrs(gic::nr_lrs()) {
        hv_fatal!("GIC: {e}; cannot run guests");
    }
    register_pcpu(0);

    // Secondary pCPUs: PSCI CPU_ON to firmware; they wait for the VM.
    let me = sysreg::mpidr();
    let mut nr_pcpus = 1;
    // A stack a CPU did not take (CPU_ON failed) goes to the next one.
    let mut stack = None;
    for &mpidr in machine.cpus.iter().filter(|&&m| m & 0xff_00ff_ffff != me) {
        if nr_pcpus >= count.used {
            break;
        }
        if !gic::has_redistributor(mpidr) {
            // Counted out by `pcpus::count` already.
            continue;
        }
        let top = *stack.get_or_insert_with(secondary_stack);
        let r = start_secondary(mpidr, top, nr_pcpus);
        if r != 0 {
            error!("pCPU with MPIDR {mpidr:#x} did not start (PSCI {r})");
            continue;
        }
        stack = None;
        while !pcpu(nr_pcpus).online.load(Ordering::Acquire) {
            crate::arch::sysreg::cpu_relax();
        }
        info!("pCPU{nr_pcpus} online (MPIDR {mpidr:#x})");
        nr_pcpus += 1;
    }
    info!("{nr_pcpus} pCPU(s) online");
    its_self_test(nr_pcpus);
    nr_pcpus
}

/// Whether `r` lies in the platform's device windows (below 512 GiB),
/// which the boot identity map maps as device memory.
fn device_mapped(r: Region) -> bool {
    let Some(last) = r.base.checked_add(r.size.max(1) - 1) else {
        return false;
    };
    last >> 30 < 512 && (r.base >> 30..=last >> 30).all(platform::is_device_gib)
}

/// A secondary pCPU's stack, from the heap (it runs on it for good);
/// returns its top.
fn secondary_stack() -> u64 {
    let Ok(layout) = core::alloc::Layout::from_size_align(STACK_SIZE, 4096) else {
        hv_fatal!("pCPU stack layout");
    };
    // SAFETY: a layout of non-zero size; the block is never freed.
    let base = unsafe { alloc::alloc::alloc_zeroed(layout) };
    if base.is_null() {
        hv_fatal!("no heap left for a pCPU stack");
    }
    base as u64 + STACK_SIZE as u64
}

/// PSCI CPU_ON for the CPU `mpidr` as pCPU `index`, on the stack whose top
/// is `top`: `secondary_entry` gets `top` as its context ID and reads the
/// index from the 16 bytes below it. Returns the PSCI status.
fn start_secondary(mpidr: u64, top: u64, index: usize) -> i64 {
    // SAFETY: the 16 bytes below `top` belong to the stack block
    // `secondary_stack` allocated, which no one else uses.
    unsafe { core::ptr::write_volatile((top - 16) as *mut u64, index as u64) };
    // The secondary starts with its MMU off: it reads the index from memory
    // and its first stack writes go to memory, so no line of the block may
    // stay in this CPU's cache (a later write-back would overwrite them).
    cache::clean_inval_to_poc(top - STACK_SIZE as u64, STACK_SIZE as u64);
    smc::psci_cpu_on(mpidr, secondary_entry as *const () as u64, top)
}

/// Creates Dom0 and runs pCPU 0's loop.
pub(super) fn run_dom0(
    machine: &Machine,
    boot: &BootInfo,
    cfg: &Config,
    plan: &Plan,
    firmware: &super::dom0::GuestFirmware<'_>,
    nr_pcpus: usize,
) -> ! {
    let host = match vm::Host::init(cfg, nr_pcpus) {
        Ok(h) => h,
        Err(e) => hv_fatal!("scheduler: {e}"),
    };
    // DomUs: the dom0less ones (`BootInfo::domus`, placed in `Plan::domus`),
    // or the `domu_selftest=N` test aid, carved from Dom0's RAM before Dom0
    // is built.
    let (plan, domus) = match cfg.domu_selftest {
        0 => (plan.clone(), boot.domus.iter().cloned().zip(plan.domus.iter().copied()).collect()),
        _ => match super::domu::selftest(boot, cfg, plan) {
            Ok(p) => p,
            Err(e) => hv_fatal!("domu_selftest: {e}"),
        },
    };
    // PCIe functions assigned to DomUs: probed, planned and their BARs
    // programmed before Dom0 exists.
    if let Err(e) = super::pci::prepare(machine, cfg.iommu, &domus) {
        hv_fatal!("{e}");
    }
    let dom0: &'static vm::Vm = match vm::Vm::create_dom0(machine, boot, cfg, &plan, firmware, nr_pcpus, host) {
        Ok(mut vm) => {
            // WFE traps (a spinning vCPU yields) when the vCPUs of all VMs
            // together outnumber the pCPUs: a sibling holding the lock may
            // be preempted by another VM's vCPU.
            let total = vm.vcpus.len() + domus.iter().map(|(s, _)| s.vcpus as usize).sum::<usize>();
            vm.overcommitted |= total > nr_pcpus;
            Box::leak(vm)
        }
        Err(e) => hv_fatal!("cannot create the guest: {e}"),
    };
    let mut table = alloc::vec![dom0];
    let mut vcpu_base = dom0.vcpus.len() as u32;
    for (spec, placement) in &domus {
        // VMID 1 is Dom0's; DomU N gets N + 1.
        let slot = vm::DomuSlot { vcpu_base, vmid: spec.id + 1, power_on: true };
        match vm::Vm::create_domu(spec, placement, machine, nr_pcpus, host, slot, dom0) {
            Ok(mut vm) => {
                vm.overcommitted |= dom0.overcommitted;
                vcpu_base += vm.vcpus.len() as u32;
                table.push(Box::leak(vm));
            }
            Err(e) => hv_fatal!("cannot create d{}: {e}", spec.id),
        }
    }
    table.shrink_to_fit();
    let table = vm::set_vms(table);
    super::domctl::init(machine, nr_pcpus, plan.domu_pool, table, vm::Vm::create_domu);
    vcpu::pcpu_loop(0)
}

/// Sets up the physical ITS, if the DTB names one; without it (or when
/// its setup fails) the hypervisor runs as before, without host LPIs.
fn init_its(machine: &Machine, cfg: &Config, pcpus: usize) {
    let Some(its) = machine.gic.its else {
        info!("ITS: none in the device tree; no host LPIs");
        return;
    };
    if let Err(e) = gic::its::init(its.base, pcpus, cfg.gic_vlpi) {
        info!("ITS: at {:#x} not used ({e}); no host LPIs", its.base);
        return;
    }
    match gic::its::lpi_path() {
        LpiPath::Direct => info!("ITS: guest MSIs by GICv4.0 direct vLPI injection, doorbells wake vCPUs"),
        LpiPath::Emulated(why) => info!("ITS: guest MSIs by host LPIs through list registers ({why})"),
    }
}

/// The boot self-test of host LPIs (`gic::its::self_test`), on pCPU 0
/// once every pCPU has its collection, before pCPU 0 enables any other
/// interrupt: polled, so it needs neither the run loop nor a VM.
fn its_self_test(pcpus: usize) {
    if !gic::its::its_present() {
        return;
    }
    match gic::its::self_test(pcpus) {
        Ok(t) => info!(
            "ITS: GICv{} ITS at {:#x}, {} LPIs, self-test LPI {} delivered",
            t.arch_rev,
            t.base,
            t.lpis,
            u32::from(t.lpi)
        ),
        Err(e) => error!("ITS: self-test failed: {e}"),
    }
}

extern "C" {
    fn secondary_entry();
}

/// Records this pCPU's MPIDR for IPIs (`gic::init_cpu` found its
/// redistributor).
fn register_pcpu(cpu: usize) {
    pcpu(cpu).mpidr.store(sysreg::mpidr(), Ordering::Relaxed);
    pcpu(cpu).online.store(true, Ordering::Release);
}

pub fn secondary_main(cpu: usize) -> ! {
    mmu::enable_secondary();
    // SAFETY: this pCPU takes its own run block, once (PSCI CPU_ON passes
    // each secondary a distinct index).
    exception::init_cpu(unsafe { percpu::run_block(cpu) }, super::mitigations::init_cpu());
    el2::init_extended_controls();
    gic::init_cpu(cpu);
    register_pcpu(cpu);
    vm::vms();
    vcpu::pcpu_loop(cpu)
}
