//! `conformance.exits`: instead of the checks, the cost of the operations
//! that exit to a hypervisor, each timed over many iterations on the
//! virtual counter. Under `-icount shift=0` guest time is instructions
//! executed (all exception levels together, one per nanosecond), so the
//! figures are exact path lengths; `cargo xtask bench exits` runs this on
//! bare QEMU and under the hypervisor and prints them side by side.
//!
//! One line per operation: `exit <name>: <ns> ns/op over <n>` (`ns` with
//! one decimal), or `exit <name>: skip <why>`.

use crate::arch;
use crate::gic::{self, send_sgi, sgi1r};
use crate::platform::Platform;
use crate::println;
use crate::{cpu_on, ONLINE};
use core::sync::atomic::Ordering;

/// Prints the per-operation time of `n` runs of `op` (tenths of a ns).
fn time(name: &str, n: u64, mut op: impl FnMut()) {
    let start = arch::cntvct();
    for _ in 0..n {
        op();
    }
    let ticks = arch::cntvct() - start;
    let tenths = u128::from(ticks) * 10_000_000_000 / u128::from(arch::cntfrq().max(1)) / u128::from(n);
    println!("exit {name}: {}.{} ns/op over {n}", tenths / 10, tenths % 10);
}

/// Waits (a bounded spin) until `cond`; false when it never came.
fn spin_until(mut cond: impl FnMut() -> bool) -> bool {
    spin_until_with(&mut cond, || {})
}

/// [`spin_until`], running `relax` between tests.
fn spin_until_with(mut cond: impl FnMut() -> bool, relax: impl Fn()) -> bool {
    let until = arch::cntvct() + arch::cntfrq();
    while !cond() {
        if arch::cntvct() > until {
            return false;
        }
        relax();
    }
    true
}

pub fn run(p: &Platform) {
    // An SMCCC call no service implements (a null hypercall): PSCI's range,
    // an unused function number; the answer is NOT_SUPPORTED.
    time("smccc-unknown", 20_000, || {
        arch::smccc(p.psci_smc, 0x8400_00ff, 0, 0, 0);
    });
    // SAFETY: the DT's distributor, mapped as device memory.
    let gicd = unsafe { crate::mmio::Mmio::new(p.gicd as usize) };
    // GICD_IIDR: an emulated register under a hypervisor.
    time("gicd-iidr-read", 20_000, || {
        gicd.read32(0x8);
    });
    match p.uart {
        Some(u) => {
            // SAFETY: the DT's PL011 (UARTFR has no side effects).
            let uart = unsafe { crate::mmio::Mmio::new(u as usize) };
            time("uart-fr-read", 20_000, || {
                uart.read32(0x18);
            });
        }
        None => println!("exit uart-fr-read: skip no UART in the DT"),
    }
    // The virtual timer: armed already due, until its handler ran.
    let vt = gic::VTIMER.load(Ordering::Relaxed);
    gic::sgi_frame(0).write32(gic::GICR_ISENABLER0, 1 << vt);
    let mut lost = false;
    time("vtimer-expiry", 2_000, || {
        let before = gic::count(0, vt);
        arch::write_cntv_tval(0);
        arch::write_cntv_ctl(1);
        lost |= !spin_until(|| gic::count(0, vt) != before);
    });
    arch::write_cntv_ctl(0);
    if lost {
        println!("exit vtimer-expiry: FAIL an expiry was not taken within 1 s");
    }
    // An SGI to this CPU, until its handler ran.
    let mut lost = false;
    time("sgi-to-self", 2_000, || {
        let before = gic::count(0, 1);
        send_sgi(sgi1r(1, Some(&[p.mpidr[0]])));
        lost |= !spin_until(|| gic::count(0, 1) != before);
    });
    if lost {
        println!("exit sgi-to-self: FAIL an SGI was not taken within 1 s");
    }
    // An SGI to CPU 1, until its handler ran (CPU 1 waits in WFI). Under
    // icount the CPUs take turns on one host thread, and a CPU's turn ends
    // when it halts, its time budget runs out, or at a YIELD: this CPU
    // waits with YIELD (as Linux's cpu_relax), so CPU 1 runs as soon as the
    // SGI is sent and its path is counted, not QEMU's time slice. A lost
    // SGI ends the loop.
    if p.ncpus < 2 || cpu_on(p, 1) != 0 || !spin_until(|| ONLINE[1].load(Ordering::SeqCst) == 1) {
        println!("exit sgi-to-other-cpu: skip no second CPU");
        return;
    }
    let mut lost = false;
    // The one-way part: from the ICC_SGI1R write until CPU 1's handler
    // read the clock (it stamps `gic::TAKEN_AT`), each iteration's.
    let mut to_handler = [0u64; SGI_OTHER_ITERATIONS];
    let mut n = 0usize;
    time("sgi-to-other-cpu", SGI_OTHER_ITERATIONS as u64, || {
        if lost {
            return;
        }
        let before = gic::count(1, 1);
        let sent = arch::cntvct();
        send_sgi(sgi1r(1, Some(&[p.mpidr[1]])));
        lost = !spin_until_with(|| gic::count(1, 1) != before, arch::yield_hint);
        if !lost && n < to_handler.len() {
            to_handler[n] = gic::taken_at(1, 1).saturating_sub(sent);
            n += 1;
        }
    });
    if lost {
        println!("exit sgi-to-other-cpu: FAIL an SGI was not taken within 1 s");
    } else if n > 0 {
        // The mean, and the median: the path's length. Where the vCPUs
        // share a pCPU, an SGI preempts the sender only when the scheduler
        // says so (a woken vCPU with no more credit than the runner waits
        // for the runner's ratelimit window): a rare wait of ~1 ms that the
        // mean carries and the median does not.
        let d = &mut to_handler[..n];
        let mean = d.iter().sum::<u64>() / n as u64;
        d.sort_unstable();
        print_ns("sgi-to-other-handler", mean, n);
        print_ns("sgi-to-other-handler-median", d[n / 2], n);
    }
}

/// Iterations of the SGI to the other CPU.
const SGI_OTHER_ITERATIONS: usize = 200;

/// `exit <name>: <ns> ns/op over <n>` for `ticks` of the counter.
fn print_ns(name: &str, ticks: u64, n: usize) {
    let tenths = u128::from(ticks) * 10_000_000_000 / u128::from(arch::cntfrq().max(1));
    println!("exit {name}: {}.{} ns/op over {n}", tenths / 10, tenths % 10);
}
