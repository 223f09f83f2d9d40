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
//! `runtime::heap`). The instruction itself belongs to the EL2 layer, which
//! sits above this crate: it registers it once with [`set_relax`] as the
//! boot CPU's first step, before any other CPU runs. Until then (and on the
//! host, in the unit tests) a waiter relaxes with `spin_loop`, which is
//! correct everywhere, only slower to hand over under single-threaded TCG.
//!
//! The scheduler's runqueue locks are [`TicketMutex`]es: first come, first
//! served among running waiters (`ticket`). The others are `spin`'s
//! test-and-set locks, held briefly by few pCPUs.

/// The registered spin-wait step ([`set_relax`]). Its own waits (only
/// while `set_relax` runs, on one CPU) use `spin`'s default strategy.
static RELAX: spin::once::Once<fn()> = spin::once::Once::new();

/// Registers `step` as the locks' spin-wait step (the EL2 layer's YIELD).
/// The first registration wins; later ones are ignored.
pub fn set_relax(step: fn()) {
    RELAX.call_once(|| step);
}

/// The registered clock ([`set_clock`]): ns, monotonic, any origin.
static CLOCK: spin::once::Once<fn() -> u64> = spin::once::Once::new();

/// Registers the clock waiters measure their patience with
/// (`ticket::PATIENCE_NS`): the EL2 layer's counter in ns, or the host's
/// monotonic clock. The first registration wins.
pub fn set_clock(now_ns: fn() -> u64) {
    CLOCK.call_once(|| now_ns);
}

/// The registered clock's reading, if one is registered.
#[inline(always)]
fn clock_ns() -> Option<u64> {
    CLOCK.get().map(|f| f())
}

/// How a waiting pCPU spins: the registered step ([`set_relax`]), else
/// `spin_loop`.
pub struct Relax;

impl spin::RelaxStrategy for Relax {
    #[inline(always)]
    fn relax() {
        cpu_relax();
    }
}

/// One spin-wait step, for hand-written waits above the EL2 layer: the
/// registered step ([`set_relax`]), else `spin_loop`.
#[inline(always)]
pub fn cpu_relax() {
    match RELAX.get() {
        Some(step) => step(),
        None => core::hint::spin_loop(),
    }
}

#[allow(unsafe_code)]
mod ticket;
pub use ticket::{turns_passed as ticket_turns_passed, RawTicketLock, TicketMutex, TicketMutexGuard};

pub type Mutex<T> = spin::mutex::Mutex<T, Relax>;
pub type MutexGuard<'a, T> = spin::mutex::MutexGuard<'a, T>;
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

    #[test]
    fn the_registered_relax_step_is_what_waiters_run() {
        use core::sync::atomic::{AtomicU32, Ordering};
        static STEPS: AtomicU32 = AtomicU32::new(0);
        fn step() {
            STEPS.fetch_add(1, Ordering::Relaxed);
        }
        set_relax(step);
        // The first registration wins.
        set_relax(|| {});
        cpu_relax();
        <Relax as spin::RelaxStrategy>::relax();
        assert!(STEPS.load(Ordering::Relaxed) >= 2);
    }
}
