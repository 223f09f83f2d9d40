//! The hypervisor's locks: `spin`'s, waiting with YIELD instead of ISB.
//!
//! `spin`'s default relax strategy is `core::hint::spin_loop`, an ISB on
//! AArch64. Under QEMU's single-threaded TCG (`-icount`, how the latency
//! benchmarks and the fairness tests run) the emulated CPUs take turns, and
//! a CPU keeps its turn until the next virtual-clock deadline unless it
//! halts (WFI) or yields (YIELD/WFE). QEMU 7.2 starts each round with the
//! first CPU and gives the next one what is left of the time to that
//! deadline, which is nothing when the first CPU used it all: a pCPU
//! spinning with ISB on a lock held by another pCPU keeps the holder from
//! running, round after round (seen with Dom0 and three DomUs on 2 pCPUs:
//! pCPU1 stopped inside the scheduler with its lock held while pCPU0 spun
//! on it; guest time went on, no guest made progress). QEMU 8 and later
//! (the project runs 10.0) split each round's budget between the CPUs,
//! which bounds the damage but still lets a spinner burn its share.
//! Spinning with YIELD gives the holder its turn at once; on hardware YIELD
//! is the same hint Linux's `cpu_relax` gives.
//!
//! Every lock in the hypervisor is one of these (and the heap's, see
//! `runtime::heap`); the host build (unit tests) relaxes with `spin_loop`.

/// How a waiting pCPU spins: YIELD on the EL2 build, `spin_loop` on the host.
pub struct Relax;

impl spin::RelaxStrategy for Relax {
    #[inline(always)]
    fn relax() {
        cpu_relax();
    }
}

/// One spin-wait step, for hand-written waits: YIELD on the EL2 build (a
/// hint on hardware, Linux's `cpu_relax`; QEMU's single-threaded TCG
/// switches to its next vCPU on it, see above). The locks sit below `arch`,
/// whose drivers use them, so the one instruction is written here.
#[inline(always)]
pub fn cpu_relax() {
    #[cfg(all(target_arch = "aarch64", target_os = "none"))]
    // SAFETY: a hint instruction: no memory, register or flag effects.
    unsafe {
        core::arch::asm!("yield", options(nomem, nostack, preserves_flags))
    };
    #[cfg(not(all(target_arch = "aarch64", target_os = "none")))]
    core::hint::spin_loop();
}

pub type Mutex<T> = spin::mutex::Mutex<T, Relax>;
pub type RwLock<T> = spin::rwlock::RwLock<T, Relax>;
pub type Once<T> = spin::once::Once<T, Relax>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_work_with_the_yielding_relax_strategy() {
        static M: Mutex<u32> = Mutex::new(1);
        *M.lock() += 1;
        assert_eq!(*M.lock(), 2);
        let rw: RwLock<u32> = RwLock::new(3);
        assert_eq!(*rw.read(), 3);
        *rw.write() = 4;
        assert_eq!(*rw.read(), 4);
        let once: Once<u32> = Once::new();
        assert_eq!(*once.call_once(|| 5), 5);
        // Two threads contending for the lock both get through.
        let m = std::sync::Arc::new(Mutex::new(0u64));
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *m.lock() += 1;
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(*m.lock(), 20_000);
    }
}
