//! The scheduler's runqueue lock: a ticket lock that passes over a turn
//! nobody claims.
//!
//! Waiters take numbered tickets and are served in the order they arrived,
//! so no pCPU of a runqueue shared by up to 16 is passed over again and
//! again, as a test-and-set lock allows (whichever waiter's exclusive
//! access lands first wins, every time).
//!
//! Strict order has a cost where a waiter may not be running: the next
//! ticket's holder must run before anyone else gets the lock. Under QEMU's
//! multi-threaded TCG with more emulated pCPUs than host cores that waiter
//! is usually a host thread the host switched out, and everyone behind it
//! spins (YIELD does not give up the host thread) until the host runs it:
//! a plain ticket lock stalled a 48-pCPU guest that way. Paravirtual
//! sleeping (WFI, woken by the unlocker's SGI) was tried and hung that run.
//! So here the lock being free is a separate bit from whose turn it is: the
//! waiter whose turn it is claims the lock by setting the bit, and a waiter
//! behind it that sees the turn stay unclaimed for [`PATIENCE_NS`]
//! passes over it (the turn moves on, the bit stays clear). Claim and pass
//! are compare-and-swaps of the same word, so exactly one of them happens;
//! a waiter that finds its turn passed takes a new ticket at the back.
//!
//! On hardware, where a waiting pCPU is not switched out, the waiter whose
//! turn comes claims it within a spin step or two, long before anyone's
//! patience ends: the order is first come, first served. Under emulation
//! the order is that among the waiters that are running, and the lock
//! never waits for one that is not. [`turns_passed`] counts the turns
//! passed over.
//!
//! The word: bits 1..32 the next ticket to hand out (31 bits, wrapping;
//! bit 0 clear), bit 32 held, bits 33..64 the ticket being served (31
//! bits). So the lock is free with nobody waiting exactly when the word's
//! halves are equal (one compare on the uncontended path), and releasing
//! adds 2^32: held clears and its carry advances the turn, one atomic add.

use super::{clock_ns, cpu_relax};
use core::sync::atomic::{AtomicU64, Ordering};

/// How long a waiter watches an unclaimed turn before it passes over it,
/// by the registered clock (`sync::set_clock`). A running waiter sees its
/// turn come when the releasing store reaches it, as everyone behind it
/// does, and claims it one compare-and-swap later: well under a
/// microsecond on hardware, cache line transfers included.
pub const PATIENCE_NS: u64 = 2_000;

/// The same in spin steps, while no clock is registered (the boot CPU's
/// first steps, and host tests).
pub const PATIENCE_SPINS: u32 = 256;

const TICKET_MASK: u64 = (1 << 31) - 1;
const HELD: u64 = 1 << 32;
const TURN_SHIFT: u32 = 33;
const LOW: u64 = 0xffff_ffff;

fn next_of(w: u64) -> u64 {
    (w & LOW) >> 1
}

/// `w` with one more ticket handed out (the low half wraps on its own).
fn with_ticket_taken(w: u64) -> u64 {
    (w & !LOW) | u64::from((w as u32).wrapping_add(2))
}

/// Free, and nobody waiting: the next ticket is the turn.
fn free_for_next(w: u64) -> bool {
    w == w.rotate_left(32)
}

fn turn_of(w: u64) -> u64 {
    w >> TURN_SHIFT
}

/// How far `ticket` is behind the turn being served: 0 when it is its
/// turn, below 2^30 while it waits, otherwise it was passed over.
fn behind(ticket: u64, turn: u64) -> u64 {
    ticket.wrapping_sub(turn) & TICKET_MASK
}

/// Turns passed over by every ticket lock so far.
static PASSED: AtomicU64 = AtomicU64::new(0);

/// Turns the ticket locks passed over so far because their waiters did
/// not claim them (were not running).
pub fn turns_passed() -> u64 {
    PASSED.load(Ordering::Relaxed)
}

/// The raw lock behind [`TicketMutex`].
pub struct RawTicketLock {
    word: AtomicU64,
}

impl RawTicketLock {
    /// Takes a ticket: the next one handed out.
    #[inline(always)]
    fn take_ticket(&self) -> u64 {
        let mut w = self.word.load(Ordering::Relaxed);
        loop {
            match self.word.compare_exchange_weak(w, with_ticket_taken(w), Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return next_of(w),
                Err(now) => w = now,
            }
        }
    }

    /// Waits for `ticket`'s turn and claims it; false if the turn was
    /// passed over first (take a new ticket).
    fn wait_turn(&self, ticket: u64) -> bool {
        // The unclaimed turn being watched, since when (clock, else spins).
        let mut watched: Option<(u64, u64)> = None;
        loop {
            let w = self.word.load(Ordering::Acquire);
            let turn = turn_of(w);
            let held = w & HELD != 0;
            let d = behind(ticket, turn);
            if d == 0 && !held {
                if self.word.compare_exchange_weak(w, w | HELD, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    return true;
                }
                continue;
            }
            if d >= 1 << 30 {
                return false;
            }
            if held {
                watched = None;
            } else {
                // Someone else's turn, unclaimed: watch it, then pass over it.
                let clock = clock_ns();
                match watched {
                    Some((t, since)) if t == turn => {
                        let waited = match clock {
                            Some(now) => now.saturating_sub(since) >= PATIENCE_NS,
                            None => since >= u64::from(PATIENCE_SPINS),
                        };
                        if waited {
                            let skip = w + (1 << TURN_SHIFT);
                            if self.word.compare_exchange(w, skip, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                                PASSED.fetch_add(1, Ordering::Relaxed);
                            }
                            watched = None;
                            continue;
                        }
                        if clock.is_none() {
                            watched = Some((t, since + 1));
                        }
                    }
                    _ => watched = Some((turn, clock.unwrap_or(0))),
                }
            }
            cpu_relax();
        }
    }
}

// SAFETY: the lock is held while the word's held bit is set. It is set
// only by a compare-and-swap from a word whose bit was clear (by the
// waiter whose turn the word names, or by `try_lock`/`take_ticket` when the
// next ticket is the turn), and cleared only by `unlock`, which the holder
// alone calls: one holder at a time. Passing over a turn is a
// compare-and-swap from a word with the bit clear, so it never races a
// holder. The setting swaps are `Acquire` and the clearing add `Release`,
// so the critical sections are ordered.
unsafe impl lock_api::RawMutex for RawTicketLock {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = Self { word: AtomicU64::new(0) };
    type GuardMarker = lock_api::GuardSend;

    #[inline(always)]
    fn lock(&self) {
        if self.try_lock() {
            return;
        }
        self.lock_slow();
    }

    #[inline(always)]
    fn try_lock(&self) -> bool {
        let w = self.word.load(Ordering::Relaxed);
        free_for_next(w)
            && self.word.compare_exchange(w, with_ticket_taken(w) | HELD, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    #[inline(always)]
    unsafe fn unlock(&self) {
        // Held clears and its carry advances the turn; the turn's top bit
        // falls off the word's end.
        self.word.fetch_add(HELD, Ordering::Release);
    }

    #[inline(always)]
    fn is_locked(&self) -> bool {
        self.word.load(Ordering::Relaxed) & HELD != 0
    }
}

impl RawTicketLock {
    #[cold]
    #[inline(never)]
    fn lock_slow(&self) {
        while !self.wait_turn(self.take_ticket()) {}
    }
}

/// A value behind a [`RawTicketLock`].
pub type TicketMutex<T> = lock_api::Mutex<RawTicketLock, T>;
pub type TicketMutexGuard<'a, T> = lock_api::MutexGuard<'a, RawTicketLock, T>;

#[cfg(test)]
mod tests {
    use super::*;
    use lock_api::RawMutex as _;
    use std::sync::Arc;

    #[test]
    fn the_word_releases_with_one_add_and_wraps() {
        let l = RawTicketLock::INIT;
        for _ in 0..5 {
            assert!(l.try_lock());
            assert!(!l.try_lock());
            assert!(l.is_locked());
            // SAFETY: held by this test.
            unsafe { l.unlock() };
            assert!(!l.is_locked());
        }
        let w = l.word.load(Ordering::Relaxed);
        assert_eq!((next_of(w), turn_of(w)), (5, 5));
        // At the tickets' wrap: the turn's carry falls off the end.
        let top = TICKET_MASK;
        l.word.store((top << TURN_SHIFT) | (top << 1), Ordering::Relaxed);
        assert_eq!((next_of(l.word.load(Ordering::Relaxed)), turn_of(l.word.load(Ordering::Relaxed))), (top, top));
        assert!(l.try_lock());
        // SAFETY: held by this test.
        unsafe { l.unlock() };
        let w = l.word.load(Ordering::Relaxed);
        assert_eq!((next_of(w), turn_of(w), w & HELD), (0, 0, 0));
        assert!(l.try_lock());
    }

    #[test]
    fn an_unclaimed_turn_is_passed_over_and_its_waiter_queues_again() {
        let l = RawTicketLock::INIT;
        assert!(l.try_lock());
        // Ticket 1 is out to a waiter that is not running; ticket 2 waits.
        let t1 = l.take_ticket();
        let t2 = l.take_ticket();
        assert_eq!((t1, t2), (1, 2));
        // SAFETY: held since the try_lock above.
        unsafe { l.unlock() };
        // Turn 1 is unclaimed: ticket 2 passes over it and claims its own.
        let before = turns_passed();
        assert!(l.wait_turn(t2));
        assert!(turns_passed() > before);
        // Ticket 1's waiter finds its turn gone.
        assert!(!l.wait_turn(t1));
        // SAFETY: held by ticket 2.
        unsafe { l.unlock() };
        l.lock();
        assert!(l.is_locked());
    }

    #[test]
    fn waiters_are_served_in_the_order_of_their_tickets() {
        let l = RawTicketLock::INIT;
        let w0 = l.word.load(Ordering::Relaxed);
        assert!(l.try_lock());
        let tickets: Vec<u64> = (0..3).map(|_| l.take_ticket()).collect();
        assert_eq!(tickets, [1, 2, 3]);
        // SAFETY: held since the try_lock above.
        unsafe { l.unlock() };
        // A newcomer does not overtake the waiters.
        assert!(!l.try_lock());
        for t in tickets {
            // Each claims its turn at once, none passed over.
            assert!(l.wait_turn(t));
            // SAFETY: held by ticket `t`.
            unsafe { l.unlock() };
        }
        // The turn moved by the four holders, one each: nobody passed over.
        let w = l.word.load(Ordering::Relaxed);
        assert_eq!((turn_of(w) - turn_of(w0), next_of(w)), (4, 4));
        assert!(l.try_lock());
    }

    #[test]
    fn threads_lose_no_update() {
        let m = Arc::new(TicketMutex::new(0u64));
        let n = 4;
        let hs: Vec<_> = (0..n)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        *m.lock() += 1;
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(*m.lock(), 20_000 * n as u64);
    }
}
