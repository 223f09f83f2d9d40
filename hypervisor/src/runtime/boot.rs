//! Boot: EL2 MMU, console, heap, platform discovery from the DTB, the
//! physical GIC, and the Dom0-style VM.

use super::{console, heap, vm};
use crate::arch::{exception, gic, mmu};
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
    mmu::enable(platform::is_device_gib);
    console::init(platform::EARLY_UART);
    // SAFETY: the image symbols come from the linker script.
    let (img_start, img_end) =
        (core::ptr::addr_of!(__image_start) as usize, core::ptr::addr_of!(__image_end) as usize);
    // SAFETY: the range after the image is RAM reserved for the hypervisor
    // (HYP_RESERVED) and identity-mapped as normal memory.
    unsafe { heap::init(img_end, HEAP_SIZE) };
    console::init_log(log::LevelFilter::Info);
    static mut RUN0: exception::CpuRun = exception::CpuRun::new();
    // SAFETY: CPU 0's run block, used only by CPU 0.
    exception::init_cpu(unsafe { &mut *core::ptr::addr_of_mut!(RUN0) });
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
        console::init(u.base as usize);
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
    if let Err(e) = gic::init(plat.gic.gicd.base, gicr.base, plat.cpus.len()) {
        error!("GIC: {e:?}");
        crate::arch::smc::psci_system_off();
    }
    gic::init_cpu(0);

    let reserved_end = (img_end + HEAP_SIZE) as u64;
    match vm::Vm::create_dom0(&plat, &cfg, host_dtb, reserved_end) {
        Ok(vm) => vm::run(vm),
        Err(e) => {
            error!("cannot create the guest: {e:?}");
            crate::arch::smc::psci_system_off();
        }
    }
}

pub fn secondary_main(_cpu: usize) -> ! {
    mmu::enable_secondary();
    loop {
        crate::arch::sysreg::wfi();
    }
}
