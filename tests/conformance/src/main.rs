//! The conformance guest: a bare-metal EL1 kernel with an arm64 Image
//! header (x0 = DTB), booted by QEMU's `-kernel` on bare QEMU and as Dom0 or
//! a DomU under the hypervisor. It prints one line per check
//! (`check <name>: ok`, `check <name>: FAIL <why>`, `check <name>: skip
//! <why>` where the platform lacks the feature), then
//! `conformance: N passed, M failed, K skipped`, and powers off with PSCI
//! SYSTEM_OFF.
//!
//! Modules:
//! - `arch`: assembly (Image header, entry, vectors, MMU switch), system
//!   registers, SMCCC
//! - `mmio`: device frames
//! - `console`: the PL011 and `println!`
//! - `platform`: the DTB
//! - `gic`: distributor, redistributors, ICC, the IRQ handler's counters
//! - `exc`: synchronous exceptions (expected faults, debug exceptions)
//! - `its`: a minimal ITS driver
//! - `checks`: the checks, in the order they run
//! - `exits`: with `conformance.exits`, the cost of exiting operations
//!   instead of the checks (`cargo xtask bench exits`)
//!
//! Built for `aarch64-unknown-none-softfloat` by `xtask::build::conformance`;
//! on the host the crate is a stub.
#![cfg_attr(target_os = "none", no_std, no_main)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!("the conformance guest runs at EL1 on aarch64 (built by `xtask::build::conformance`)");
}

#[cfg(target_os = "none")]
mod arch;
#[cfg(target_os = "none")]
mod checks;
#[cfg(target_os = "none")]
mod console;
#[cfg(target_os = "none")]
mod exc;
#[cfg(target_os = "none")]
mod exits;
#[cfg(target_os = "none")]
mod gic;
#[cfg(target_os = "none")]
mod its;
#[cfg(target_os = "none")]
mod mmio;
#[cfg(target_os = "none")]
mod platform;

#[cfg(target_os = "none")]
pub use guest::*;

#[cfg(target_os = "none")]
mod guest {
    use crate::arch::{self, BootBlock, MAX_CPUS, STACK_SIZE};
    use crate::platform::Platform;
    use crate::println;
    use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

    /// The level-1 translation table: 512 × 1 GiB blocks, identity.
    #[repr(C, align(4096))]
    struct Table([u64; 512]);
    static mut TABLE: Table = Table([0; 512]);

    const MAIR: u64 = 0xff << 8; // attr 0 Device-nGnRnE, attr 1 normal write-back
    const BLOCK_NORMAL: u64 = 1 | 1 << 2 | 3 << 8 | 1 << 10;
    const BLOCK_DEVICE: u64 = 1 | 1 << 10 | 1 << 53 | 1 << 54;

    static mut BOOT: [BootBlock; MAX_CPUS] =
        [const { BootBlock { stack_top: 0, ttbr0: 0, tcr: 0, mair: 0, cpu: 0 } }; MAX_CPUS];

    /// MPIDR affinity → CPU index (set before the secondaries start).
    static MPIDRS: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(u64::MAX) }; MAX_CPUS];
    static NCPUS: AtomicUsize = AtomicUsize::new(1);

    /// Secondary state: online flag and a mailbox (`CMD_*`).
    pub static ONLINE: [AtomicU32; MAX_CPUS] = [const { AtomicU32::new(0) }; MAX_CPUS];
    pub static MAILBOX: [AtomicU32; MAX_CPUS] = [const { AtomicU32::new(0) }; MAX_CPUS];
    pub const CMD_OFF: u32 = 1;
    /// Arm this CPU's virtual timer 2 ms ahead (its handler turns it off).
    pub const CMD_VTIMER: u32 = 2;
    /// The same with the EL1 physical timer.
    pub const CMD_PTIMER: u32 = 3;
    /// Store CNTVCT_EL0 in COUNTER_SEEN.
    pub const CMD_READ_COUNTER: u32 = 4;
    pub static COUNTER_SEEN: AtomicU64 = AtomicU64::new(0);
    /// The SGI that rings a secondary's mailbox.
    pub const SGI_DOORBELL: u32 = 15;

    static PLATFORM: AtomicUsize = AtomicUsize::new(0);

    pub fn platform() -> &'static Platform {
        // SAFETY: set once in conf_main to a value that lives forever (a
        // static), before any reader runs.
        unsafe { &*(PLATFORM.load(Ordering::Acquire) as *const Platform) }
    }

    /// This CPU's index (0 before the DT is read).
    pub fn this_cpu() -> usize {
        let aff = arch::mpidr() & 0xff_00ff_ffff;
        let n = NCPUS.load(Ordering::Relaxed);
        MPIDRS[..n].iter().position(|m| m.load(Ordering::Relaxed) == aff).unwrap_or(0)
    }

    fn tcr() -> u64 {
        let ips = (arch::id_aa64mmfr0() & 0xf).min(5);
        25 | 1 << 8 | 1 << 10 | 3 << 12 | 1 << 23 | ips << 32
    }

    /// Fills the identity map: the first GiB (devices) as device memory,
    /// the rest as normal memory until the DT says where RAM is.
    fn map(p: Option<&Platform>) {
        for i in 0..512u64 {
            let base = i << 30;
            let normal = match p {
                None => i > 0,
                // RAM, and the block just past it (the abort checks fetch
                // from there: it must be executable at stage 1).
                Some(p) => p.overlaps_ram(base, 1 << 30) || (base..base + (1 << 30)).contains(&p.ram_end()),
            };
            let desc = base | if normal { BLOCK_NORMAL } else { BLOCK_DEVICE };
            // SAFETY: the table is only written here, by CPU 0, before the
            // secondaries start; raw pointer writes, no reference kept.
            unsafe { (&raw mut TABLE.0[i as usize]).write_volatile(desc) };
        }
    }

    fn table_pa() -> u64 {
        (&raw const TABLE) as u64
    }

    static mut PLATFORM_STORE: Option<Platform> = None;

    #[no_mangle]
    extern "C" fn conf_main(dtb: usize) -> ! {
        map(None);
        // SAFETY: the map covers the image (RAM above 1 GiB on every
        // platform this runs on) and the devices below.
        unsafe { arch::enable_mmu(table_pa(), tcr(), MAIR) };
        // SAFETY: x0 from the loader; RAM is mapped normal.
        let p = match unsafe { Platform::from_dtb(dtb) } {
            Ok(p) => p,
            Err(e) => {
                println!("conformance: {e}");
                power_off();
            }
        };
        map(Some(&p));
        // SAFETY: the map now follows the DT's RAM; the same table, TLBs
        // invalidated by the routine.
        unsafe { arch::enable_mmu(table_pa(), tcr(), MAIR) };
        let slot: *mut Option<Platform> = &raw mut PLATFORM_STORE;
        // SAFETY: written once here, before anything reads PLATFORM; no
        // other reference to the static exists.
        let p: &'static Platform = unsafe { (*slot).insert(p) };
        PLATFORM.store(p as *const Platform as usize, Ordering::Release);
        if let Some(u) = p.uart {
            // SAFETY: the DT's PL011.
            unsafe { crate::console::set_base(u as usize) };
        }
        for (i, m) in p.mpidr[..p.ncpus].iter().enumerate() {
            MPIDRS[i].store(*m, Ordering::Relaxed);
        }
        NCPUS.store(p.ncpus.max(1), Ordering::Release);
        crate::gic::VTIMER.store(p.vtimer_intid, Ordering::Relaxed);
        crate::gic::PTIMER.store(p.ptimer_intid, Ordering::Relaxed);
        crate::gic::PMU.store(p.pmu_intid.unwrap_or(23), Ordering::Relaxed);
        println!(
            "conformance: EL{} cpus {} (+{} left off) ram_end {:#x} gicd {:#x} its {:#x} psci {}",
            (arch::current_el() >> 2) & 3,
            p.ncpus,
            p.extra_cpus,
            p.ram_end(),
            p.gicd,
            p.its.unwrap_or(0),
            if p.psci_smc { "smc" } else { "hvc" }
        );
        crate::gic::init_distributor(p);
        if let Err(e) = crate::gic::init_cpu(p, 0) {
            println!("conformance: {e}");
            power_off();
        }
        arch::irq_on();
        if p.skip_checks {
            println!("conformance: no checks (conformance.skip_checks)");
        } else if p.exits {
            crate::exits::run(p);
            println!("conformance: exits done");
        } else {
            let mut t = crate::checks::Tally::default();
            let start = arch::cntvct();
            crate::checks::run_all(p, &mut t);
            let ms = (arch::cntvct() - start) / (arch::cntfrq() / 1000).max(1);
            println!("info elapsed: {ms} ms");
            println!("conformance: {} passed, {} failed, {} skipped", t.passed, t.failed, t.skipped);
        }
        if p.linger_ms > 0 {
            println!("conformance: lingering {} ms", p.linger_ms);
            crate::checks::delay_ms(p.linger_ms);
        }
        power_off();
    }

    /// Starts CPU `cpu` with PSCI CPU_ON; returns PSCI's status.
    pub fn cpu_on(p: &Platform, cpu: usize) -> i64 {
        let boot: *mut [BootBlock; MAX_CPUS] = &raw mut BOOT;
        // SAFETY: CPU 0 writes the secondary's block before CPU_ON starts
        // it (the secondary is off), and this is the only reference to it.
        let block = unsafe { &mut (*boot)[cpu] };
        block.stack_top = (&raw const arch::CONF_STACKS) as u64 + ((cpu + 1) * STACK_SIZE) as u64;
        block.ttbr0 = table_pa();
        block.tcr = tcr();
        block.mair = MAIR;
        block.cpu = cpu as u64;
        let addr = block as *const BootBlock as usize;
        arch::clean_line(addr);
        arch::clean_line(table_pa() as usize);
        psci(p, 0xc400_0003, p.mpidr[cpu], arch::secondary_entry(), addr as u64)
    }

    /// A PSCI call through the DT's conduit.
    pub fn psci(p: &Platform, fid: u64, a1: u64, a2: u64, a3: u64) -> i64 {
        arch::smccc(p.psci_smc, fid, a1, a2, a3) as i64
    }

    #[no_mangle]
    extern "C" fn conf_secondary_main(cpu: usize) -> ! {
        let p = platform();
        if crate::gic::init_cpu(p, cpu).is_err() {
            ONLINE[cpu].store(2, Ordering::SeqCst);
            loop {
                arch::wfi();
            }
        }
        ONLINE[cpu].store(1, Ordering::SeqCst);
        loop {
            arch::irq_off();
            match MAILBOX[cpu].swap(0, Ordering::SeqCst) {
                CMD_OFF => {
                    ONLINE[cpu].store(0, Ordering::SeqCst);
                    psci(p, 0x8400_0002, 0, 0, 0);
                    ONLINE[cpu].store(3, Ordering::SeqCst);
                }
                CMD_READ_COUNTER => COUNTER_SEEN.store(arch::cntvct(), Ordering::SeqCst),
                c @ (CMD_VTIMER | CMD_PTIMER) => {
                    let tm = if c == CMD_VTIMER { crate::checks::Timer::Virt } else { crate::checks::Timer::Phys };
                    crate::gic::sgi_frame(cpu).write32(crate::gic::GICR_ISENABLER0, 1 << tm.intid(p));
                    tm.set_tval(arch::cntfrq() / 1000 * 2);
                    tm.set_ctl(1);
                }
                _ => {}
            }
            arch::wfi();
            arch::irq_on();
        }
    }

    /// PSCI SYSTEM_OFF; if it returns, says so and stops.
    pub fn power_off() -> ! {
        let smc = PLATFORM.load(Ordering::Acquire) != 0 && platform().psci_smc;
        arch::smccc(smc, 0x8400_0008, 0, 0, 0);
        println!("check psci-system-off: FAIL SYSTEM_OFF returned");
        loop {
            arch::wfi();
        }
    }

    #[panic_handler]
    fn panic(info: &core::panic::PanicInfo) -> ! {
        println!("conformance: panic: {info}");
        power_off();
    }
}
