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
//! boot CPU's first step, before any other CPU runs. Until then a waiter
//! relaxes with `spin_loop`, which is correct everywhere, only slower to
//! hand over under single-threaded TCG (this crate's unit tests yield the
//! host thread instead, see [`cpu_relax`]).
//!
//! The scheduler's runqueue locks are [`TicketMutex`]es, fair; the others
//! are `spin`'s test-and-set locks, held briefly by few pCPUs.

/// The registered spin-wait step ([`set_relax`]). Its own waits (only
/// while `set_relax` runs, on one CPU) use `spin`'s default strategy.
static RELAX: spin::once::Once<fn()> = spin::once::Once::new();

/// Registers `step` as the locks' spin-wait step (the EL2 layer's YIELD).
/// The first registration wins; later ones are ignored.
pub fn set_relax(step: fn()) {
    RELAX.call_once(|| step);
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
        // This crate's own threaded tests run more threads than the host
        // has cores: a ticket lock's next holder may be a thread the host
        // switched out, and a waiter that spins burns its whole time slice
        // before that thread runs. Yielding hands the core over.
        #[cfg(test)]
        None => std::thread::yield_now(),
        #[cfg(not(test))]
        None => core::hint::spin_loop(),
    }
}

pub type Mutex<T> = spin::mutex::Mutex<T, Relax>;
pub type MutexGuard<'a, T> = spin::mutex::MutexGuard<'a, T>;
pub type RwLock<T> = spin::rwlock::RwLock<T, Relax>;
pub type Once<T> = spin::once::Once<T, Relax>;

use core::sync::atomic::{AtomicU16, Ordering};

/// A ticket lock: waiters take numbered tickets and are served in the
/// order they arrived, so no pCPU of a runqueue shared by up to 16 can be
/// passed over indefinitely by the others (a test-and-set lock lets
/// whichever waiter's exclusive access lands first win, every time).
///
/// Why our own rather than `spin::mutex::TicketMutex`: `cargo xtask bench
/// exits` measured that one at +49 instructions on the 1-pCPU
/// SGI → handler path, mostly its `usize` counters updated with
/// read-modify-write loops on release and a `SeqCst` `fetch_update` in
/// `try_lock`. Here the owner's count is only ever written by the holder,
/// so release is a plain load and a store-release; the ticket counters
/// are 16 bits, enough for 65 535 waiters.
pub struct RawTicketLock {
    /// The next ticket to hand out.
    next: AtomicU16,
    /// The ticket being served (held, or free when equal to `next`).
    owner: AtomicU16,
}

// SAFETY: `lock` returns only once this caller's ticket is the owner,
// `try_lock` succeeds only by taking the ticket that is being served (see
// there), and only the holder advances `owner`: one holder at a time. The
// `Acquire` on `owner` pairs with the `Release` in `unlock`, so the
// critical sections are ordered.
unsafe impl lock_api::RawMutex for RawTicketLock {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = Self { next: AtomicU16::new(0), owner: AtomicU16::new(0) };
    type GuardMarker = lock_api::GuardSend;

    #[inline(always)]
    fn lock(&self) {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        while self.owner.load(Ordering::Acquire) != ticket {
            cpu_relax();
        }
    }

    #[inline(always)]
    fn try_lock(&self) -> bool {
        // Free when the ticket served is the next one handed out. `owner`
        // only grows, and only while a ticket past it is out, so if `next`
        // still equals the `owner` read here, taking that ticket takes the
        // lock at once.
        let owner = self.owner.load(Ordering::Acquire);
        self.next.compare_exchange(owner, owner.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    #[inline(always)]
    unsafe fn unlock(&self) {
        // Only the holder writes `owner`: no read-modify-write needed.
        let next = self.owner.load(Ordering::Relaxed).wrapping_add(1);
        self.owner.store(next, Ordering::Release);
    }

    #[inline(always)]
    fn is_locked(&self) -> bool {
        self.next.load(Ordering::Relaxed) != self.owner.load(Ordering::Relaxed)
    }
}

/// A fair (first come, first served) mutex: the scheduler's runqueue locks.
pub type TicketMutex<T> = lock_api::Mutex<RawTicketLock, T>;
pub type TicketMutexGuard<'a, T> = lock_api::MutexGuard<'a, RawTicketLock, T>;

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
    fn the_ticket_lock_excludes_and_serves_in_order() {
        let m: TicketMutex<u64> = TicketMutex::new(0);
        {
            let g = m.lock();
            assert!(m.is_locked());
            assert!(m.try_lock().is_none(), "held: try_lock fails");
            drop(g);
        }
        assert!(!m.is_locked());
        // The counters wrap: 70 000 acquisitions pass 65 535.
        for _ in 0..70_000 {
            *m.try_lock().expect("free") += 1;
        }
        assert_eq!(*m.lock(), 70_000);
        // Threads contending lose no increment.
        let m = std::sync::Arc::new(TicketMutex::new(0u64));
        let hs: Vec<_> = (0..3)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000 {
                        if i % 2 == 0 {
                            *m.lock() += 1;
                        } else {
                            loop {
                                if let Some(mut g) = m.try_lock() {
                                    *g += 1;
                                    break;
                                }
                                std::thread::yield_now();
                            }
                        }
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(*m.lock(), 30_000);
    }

    #[test]
    fn ticket_lock_waiters_are_served_in_arrival_order() {
        use std::sync::atomic::AtomicUsize;
        use std::sync::Arc;
        let m = Arc::new(TicketMutex::new(std::vec::Vec::new()));
        let queued = Arc::new(AtomicUsize::new(0));
        let g = m.lock();
        let hs: Vec<_> = (0..4)
            .map(|i| {
                let (m2, queued) = (m.clone(), queued.clone());
                // Each waiter takes its ticket before the next one starts.
                let h = std::thread::spawn(move || {
                    queued.fetch_add(1, Ordering::SeqCst);
                    m2.lock().push(i);
                });
                // SAFETY: only reads the ticket counter; nothing unlocks.
                while unsafe { m.raw() }.next.load(Ordering::SeqCst) < i as u16 + 2 {
                    std::thread::yield_now();
                }
                h
            })
            .collect();
        assert_eq!(queued.load(Ordering::SeqCst), 4);
        drop(g);
        hs.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(*m.lock(), [0, 1, 2, 3]);
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
