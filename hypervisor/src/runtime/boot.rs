//! Boot: EL2 MMU, console, heap, platform discovery from the DTB, the
//! physical GIC, and the Dom0-style VM.

use super::percpu::{self, PCPUS};
use super::{console, heap, vcpu, vm};
use crate::arch::entry::MAX_CPUS;
use crate::arch::{exception, gic, mmu, smc, sysreg};
use core::sync::atomic::Ordering;
use spin::Once;
use crate::config::Config;
use crate::dtb;
use crate::platform;
use alloc::boxed::Box;
use log::{error, info};

extern "C" {
    static __image_start: u8;
    static __image_end: u8;
}

/// Heap right after the image.
const HEAP_SIZE: usize = 48 << 20;

/// Reads the DTB's total size from its header (big-endian at offset 4).
fn dtb_slice(addr: u64) -> Option<&'static [u8]> {
    if addr == 0 || addr % 8 != 0 {
        return None;
    }
    // SAFETY: the boot protocol puts a DTB at `addr` in RAM (identity-mapped);
    // the header is checked before the length is trusted.
    unsafe {
        let hdr = core::slice::from_raw_parts(addr as *const u8, 8);
        if hdr[0..4] != [0xd0, 0x0d, 0xfe, 0xed] {
            return None;
        }
        let size = u32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]) as usize;
        if size > 2 << 20 {
            return None;
        }
        Some(core::slice::from_raw_parts(addr as *const u8, size))
    }
}

pub fn primary_main(dtb_addr: u64) -> ! {
    // SAFETY: the primary CPU, once, MMU off, before any secondary starts.
    unsafe { mmu::enable(platform::is_device_gib) };
    // SAFETY: the platform's early console is a PL011 only the console
    // module drives.
    unsafe { console::init(platform::EARLY_UART) };
    // SAFETY: the image symbols come from the linker script.
    let (img_start, img_end) =
        (core::ptr::addr_of!(__image_start) as usize, core::ptr::addr_of!(__image_end) as usize);
    // SAFETY: the range after the image is RAM reserved for the hypervisor
    // (HYP_RESERVED) and identity-mapped as normal memory.
    unsafe { heap::init(img_end, HEAP_SIZE) };
    console::init_log(log::LevelFilter::Info);
    // SAFETY: pCPU 0 takes its own run block, once.
    exception::init_cpu(unsafe { percpu::run_block(0) });
    info!("hypervisor {} on {} (image {:#x}-{:#x}, dtb {:#x})", env!("CARGO_PKG_VERSION"), platform::NAME, img_start, img_end, dtb_addr);

    let Some(host_dtb) = dtb_slice(dtb_addr) else {
        error!("no valid device tree at x0 = {dtb_addr:#x}; cannot continue");
        crate::arch::smc::psci_system_off();
    };
    // Keep a copy: the original may sit where guest memory goes.
    let host_dtb: &'static [u8] = Box::leak(host_dtb.to_vec().into_boxed_slice());
    let plat = match dtb::discover(host_dtb) {
        Ok(p) => p,
        Err(e) => {
            error!("device tree: {e:?}");
            crate::arch::smc::psci_system_off();
        }
    };
    let cfg = match Config::parse(plat.bootargs.as_deref().unwrap_or("")) {
        Ok(c) => c,
        Err(e) => {
            error!("bad hypervisor option: {e:?}; using defaults");
            Config::default()
        }
    };
    console::init_log(cfg.loglvl);
    if let Some(u) = &plat.uart {
        // SAFETY: the DTB's console UART (the same device as the early
        // console on the platforms we support), driven only by `console`.
        unsafe { console::init(u.base as usize) };
    }
    info!("options: {}", plat.bootargs.as_deref().unwrap_or(""));
    info!(
        "{} CPUs, RAM {:#x?}, GICv{} GICD {:#x} GICR {:#x}",
        plat.cpus.len(),
        plat.memory.iter().map(|r| (r.base, r.size)).collect::<alloc::vec::Vec<_>>(),
        plat.gic.version,
        plat.gic.gicd.base,
        plat.gic.gicr.first().map_or(0, |r| r.base)
    );
    let Some(gicr) = plat.gic.gicr.first() else {
        error!("no GIC redistributor region");
        crate::arch::smc::psci_system_off();
    };
    // SAFETY: the GIC frames the DTB names, inside the platform's device
    // windows (mapped as device memory); from here only `gic` touches them.
    if let Err(e) = unsafe { gic::init(plat.gic.gicd.base, gicr.base, plat.cpus.len()) } {
        error!("GIC: {e:?}");
        crate::arch::smc::psci_system_off();
    }
    gic::init_cpu(0);
    if let Err(e) = crate::vgic::usable_lrs(gic::nr_lrs()) {
        error!("GIC: {e}; cannot run guests");
        smc::psci_system_off();
    }
    register_pcpu(0);

    // Secondary pCPUs: PSCI CPU_ON to firmware; they wait for the VM.
    let me = sysreg::mpidr();
    let mut nr_pcpus = 1;
    for &mpidr in plat.cpus.iter().filter(|&&m| m & 0xff_00ff_ffff != me) {
        if nr_pcpus >= MAX_CPUS {
            break;
        }
        let entry = secondary_entry as *const () as u64;
        let r = smc::psci_cpu_on(mpidr, entry, nr_pcpus as u64);
        if r != 0 {
            error!("pCPU with MPIDR {mpidr:#x} did not start (PSCI {r})");
            continue;
        }
        while !PCPUS[nr_pcpus].online.load(Ordering::Acquire) {
            core::hint::spin_loop();
        }
        nr_pcpus += 1;
    }
    info!("{nr_pcpus} pCPU(s) online");

    let reserved_end = (img_end + HEAP_SIZE) as u64;
    match vm::Vm::create_dom0(&plat, &cfg, host_dtb, reserved_end, nr_pcpus) {
        Ok(vm) => {
            let vm: &'static vm::Vm = Box::leak(vm);
            VM.call_once(|| vm);
            vcpu::pcpu_loop(vm, 0)
        }
        Err(e) => {
            error!("cannot create the guest: {e:?}");
            smc::psci_system_off();
        }
    }
}

static VM: Once<&'static vm::Vm> = Once::new();

extern "C" {
    fn secondary_entry();
}

/// Records this pCPU's MPIDR for IPIs (`gic::init_cpu` found its
/// redistributor).
fn register_pcpu(cpu: usize) {
    PCPUS[cpu].mpidr.store(sysreg::mpidr(), Ordering::Relaxed);
    PCPUS[cpu].online.store(true, Ordering::Release);
}

pub fn secondary_main(cpu: usize) -> ! {
    mmu::enable_secondary();
    // SAFETY: this pCPU takes its own run block, once (PSCI CPU_ON passes
    // each secondary a distinct index).
    exception::init_cpu(unsafe { percpu::run_block(cpu) });
    gic::init_cpu(cpu);
    register_pcpu(cpu);
    let vm = *VM.wait();
    vcpu::pcpu_loop(vm, cpu)
}
