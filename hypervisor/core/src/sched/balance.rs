//! Load balancing between runqueues, as Credit2's `balance_load`.
//!
//! * Load: each runqueue counts its runnable vCPUs (queued or running),
//!   and keeps an exponentially decaying average of that count over a
//!   window of 2^20 µs-ish units (Xen's `load_window_shift` 30 less its
//!   granularity 10: ~1.07 s), in fixed point with 18 fraction bits
//!   (`load_precision_shift`); each vCPU keeps the same average of its own
//!   runnable time. Both are updated whenever the count changes and when
//!   a balance reads them.
//! * When: right after a runqueue's credit reset, on the pCPU that reset
//!   it (never on every `schedule()`): a reset is when that runqueue's
//!   credits start afresh, so a vCPU moved then loses nothing it earned.
//! * What: the other runqueue whose average differs most from this one's;
//!   nothing if the difference is under one vCPU while both run below
//!   capacity (under 1/8 of a vCPU when either is over it). Then the push,
//!   pull or swap of one vCPU each way that leaves the smallest
//!   difference, if smaller than now.
//! * A moved vCPU that is running moves when it leaves its pCPU; a queued
//!   one is queued on the other runqueue at once and tickled there; a
//!   blocked one wakes there. A wake never changes a vCPU's runqueue.
//!
//! Contract: with several runqueues, `rq.load` is the number of the
//! runqueue's members that are runnable or running; whoever changes a
//! member's state between blocked or offline and runnable calls
//! [`Scheduler::note_load`] with the change. (With one runqueue nothing
//! reads the loads, and nothing keeps them.)
//! Uses runq.rs (queues, tickles via wake.rs's `tickle_requeued`).

use super::{RunState, Scheduler};
use alloc::vec::Vec;

/// Fraction bits of the load averages (Xen's `load_precision_shift`).
const PRECISION: u32 = 18;
/// Window of the averages, in units of 2^10 ns (Xen's `load_window_shift`
/// 30 less `LOADAVG_GRANULARITY_SHIFT` 10).
const WINDOW: u32 = 20;
pub(super) const GRANULARITY: u32 = 10;
/// Below capacity, balance only for a difference of a whole vCPU (2^0);
/// above it, for 1/8 (2^-3): Xen's balance tolerances.
const UNDERLOAD_TOLERANCE: i32 = 0;
const OVERLOAD_TOLERANCE: i32 = -3;

/// A decaying average over [`WINDOW`]: `load` held since `last`, to `now`
/// (both in granularity units).
fn decay(avg: u64, load: u64, last: u64, now: u64) -> u64 {
    if last.saturating_add(1 << WINDOW) < now {
        return load << PRECISION;
    }
    let delta = now.saturating_sub(last).min(1 << WINDOW);
    (delta * (load << PRECISION) + ((1 << WINDOW) - delta) * avg) >> WINDOW
}

fn tolerance(shift: i32) -> u64 {
    1u64 << (PRECISION as i32 + shift) as u32
}

/// The difference of two runqueues' averages `la` and `oa`, if it is worth
/// a balance: a whole vCPU while both run below capacity (`cpus_max`, the
/// larger one's pCPUs), 1/8 of one when either is over it.
pub(super) fn imbalance(la: u64, oa: u64, cpus_max: usize) -> Option<u64> {
    let shift = if la.max(oa) < (cpus_max as u64) << PRECISION { UNDERLOAD_TOLERANCE } else { OVERLOAD_TOLERANCE };
    let delta = la.abs_diff(oa);
    (delta >= tolerance(shift)).then_some(delta)
}

/// The balance's candidates: the members of the balancing runqueue that
/// may be pushed, as (average, slot) in membership order, and those of the
/// other runqueue that may be pulled, as (average, order, slot), sorted by
/// [`best_exchange`].
#[derive(Default)]
pub(super) struct Candidates {
    pub(super) push: Vec<(i64, usize)>,
    pub(super) pull: Vec<(i64, usize, usize)>,
}

/// Of pushing one vCPU of `push`, pulling one of `pull`, or swapping a
/// pair, the move that leaves the smallest difference between the
/// runqueues' averages `la` and `oa`, if under `delta` (now's): (push,
/// pull) slots. The choice is Credit2's: every push, pull and pair is
/// considered (each push with every pull then alone, then each pull alone,
/// in membership order) and the first with the smallest difference wins.
/// It is found without walking the pairs, which grow as the product of the
/// runqueues' sizes: `pull` is sorted by average, and for each push a
/// binary search finds the pull that comes nearest and then the first in
/// membership order that comes as near. Returns also the records visited
/// and compared (for [`Scheduler::op`]).
pub(super) fn best_exchange(
    delta: u64,
    la: i64,
    oa: i64,
    push: &[(i64, usize)],
    pull: &mut [(i64, usize, usize)],
) -> ((Option<usize>, Option<usize>), usize) {
    let d0 = la - oa;
    pull.sort_unstable();
    let log = (usize::BITS - pull.len().leading_zeros()) as usize;
    let work = push.len() + pull.len() * (2 + log) + 2 * push.len() * log;
    // A swap of `sa` for `sb` leaves |2·sb − (2·sa − d0)|.
    let nearest = |t: i64| {
        let k = pull.partition_point(|e| 2 * e.0 < t);
        [k.checked_sub(1), Some(k)]
            .into_iter()
            .flatten()
            .filter_map(|i| pull.get(i))
            .map(|e| (2 * e.0 - t).unsigned_abs())
            .min()
    };
    let mut best = delta;
    for &(sa, _) in push {
        best = best.min(nearest(2 * sa - d0).unwrap_or(u64::MAX)).min((d0 - 2 * sa).unsigned_abs());
    }
    for e in pull.iter() {
        best = best.min((d0 + 2 * e.0).unsigned_abs());
    }
    if best >= delta {
        return ((None, None), work);
    }
    // The first pull in membership order whose doubled average is `v2`.
    let first_at = |v2: i64| {
        let v = v2 / 2;
        let k = pull.partition_point(|e| e.0 < v);
        pull.get(k).filter(|e| v2 % 2 == 0 && e.0 == v).map(|e| (e.1, e.2))
    };
    let b = best as i64;
    for &(sa, a) in push {
        let t = 2 * sa - d0;
        if let Some((_, pb)) = first_at(t - b).into_iter().chain(first_at(t + b)).min() {
            return ((Some(a), Some(pb)), work);
        }
        if (d0 - 2 * sa).unsigned_abs() == best {
            return ((Some(a), None), work);
        }
    }
    let pb = pull.iter().filter(|e| (d0 + 2 * e.0).unsigned_abs() == best).min_by_key(|e| e.1).map(|e| e.2);
    ((None, pb), work)
}

impl Scheduler {
    /// The runnable count of `s`'s runqueue changes by `change` (+1: it
    /// became runnable; -1: it blocked or went offline; 0: no change, the
    /// averages brought up to `now`): both averages take the time since
    /// their last update at the old count.
    /// Nothing to do with one runqueue: only a balance reads them.
    #[inline(always)]
    pub(super) fn note_load(&mut self, s: usize, change: i32, now: u64) {
        if self.rqs.len() > 1 {
            self.note_load_now(s, change, now);
        }
    }

    fn note_load_now(&mut self, s: usize, change: i32, now: u64) {
        let t = now >> GRANULARITY;
        self.rq_load_add(self.vcpus[s].rq, change, t);
        let v = &mut self.vcpus[s];
        let was = match change {
            -1 => 1,
            1 => 0,
            _ => u64::from(matches!(v.state, RunState::Runnable | RunState::Running(_))),
        };
        v.avgload = decay(v.avgload, was, v.load_last, t);
        v.load_last = t;
    }

    pub(super) fn rq_load_add(&mut self, rq: usize, change: i32, t: u64) {
        let r = &mut self.rqs[rq];
        r.avgload = decay(r.avgload, u64::from(r.load), r.load_last, t);
        r.load_last = t;
        r.load = r.load.saturating_add_signed(change);
    }

    /// Credit2's `balance_load`, from `pcpu` just after its runqueue's
    /// reset (see the module doc).
    pub(super) fn balance_load(&mut self, now: u64, pcpu: usize) {
        if self.rqs.len() < 2 {
            return;
        }
        if self.shard.is_some() {
            // The other runqueues' records are not live here.
            self.reset_pending = true;
            return;
        }
        let t = now >> GRANULARITY;
        let l = self.pcpus[pcpu].rq;
        self.rq_load_add(l, 0, t);
        let mut other = None;
        let mut delta = 0u64;
        self.op(self.rqs.len());
        for o in (0..self.rqs.len()).filter(|&o| o != l) {
            self.rq_load_add(o, 0, t);
            let d = self.rqs[l].avgload.abs_diff(self.rqs[o].avgload);
            if d > delta {
                (delta, other) = (d, Some(o));
            }
        }
        let Some(o) = other else { return };
        let cpus_max = self.rqs[l].pcpus.len().max(self.rqs[o].pcpus.len());
        let Some(delta) = imbalance(self.rqs[l].avgload, self.rqs[o].avgload, cpus_max) else { return };
        self.note_members_load(l, now);
        self.note_members_load(o, now);
        let (la, oa) = (self.rqs[l].avgload as i64, self.rqs[o].avgload as i64);
        self.collect_push(l, o);
        self.collect_pull(o, l);
        let mut c = core::mem::take(&mut self.candidates);
        let ((push, pull), work) = best_exchange(delta, la, oa, &c.push, &mut c.pull);
        self.candidates = c;
        let (ml, mo) = (self.rqs[l].members.len(), self.rqs[o].members.len());
        self.op(ml + mo + work);
        if let Some(a) = push {
            self.migrate(now, a, o, pcpu);
        }
        if let Some(b) = pull {
            self.migrate(now, b, l, pcpu);
        }
    }

    /// Fills `candidates.push` with runqueue `r`'s members that may move to
    /// `to`, within the room reserved for them (a registration reserves
    /// room for every vCPU: nothing is left out but by a broken contract).
    pub(super) fn collect_push(&mut self, r: usize, to: usize) {
        let mut v = core::mem::take(&mut self.candidates.push);
        v.clear();
        for (s, load) in self.movable(r, to).take(v.capacity()) {
            v.push((load, s));
        }
        self.candidates.push = v;
    }

    /// [`Self::collect_push`] for the other side: `candidates.pull`, each
    /// with its place in membership order.
    pub(super) fn collect_pull(&mut self, r: usize, to: usize) {
        let mut v = core::mem::take(&mut self.candidates.pull);
        v.clear();
        for (i, (s, load)) in self.movable(r, to).take(v.capacity()).enumerate() {
            v.push((load, i, s));
        }
        self.candidates.pull = v;
    }

    /// The members of runqueue `r` that may move to `to`, with their
    /// averages. Parked ones stay with `Sched` (they are on their runqueue's
    /// parked list).
    pub(super) fn movable(&self, r: usize, to: usize) -> impl Iterator<Item = (usize, i64)> + '_ {
        let parked_stay = self.shard.is_some();
        self.rqs[r]
            .members
            .iter()
            .copied()
            .filter(move |&s| !(parked_stay && self.vcpus[s].parked) && self.may_move(s, to))
            .map(|s| (s, self.vcpus[s].avgload as i64))
    }

    /// Whether `s` may move to runqueue `to`: its affinity allows one of
    /// its pCPUs, and no move of it is pending.
    pub(super) fn may_move(&self, s: usize, to: usize) -> bool {
        let v = &self.vcpus[s];
        v.migrate_to.is_none() && self.rqs[to].pcpus.iter().any(|&p| v.allowed_on(p))
    }

    /// Move `s` to runqueue `to`: now if it is not running, else when it
    /// leaves its pCPU. A queued one is queued there and a pCPU other than
    /// `pcpu` (whose `schedule()` balances) tickled for it, which is owed a
    /// reschedule IPI ([`Scheduler::take_balance_kicks`]).
    pub(super) fn migrate(&mut self, now: u64, s: usize, to: usize, pcpu: usize) {
        if matches!(self.vcpus[s].state, RunState::Running(_)) {
            self.vcpus[s].migrate_to = Some(to);
            return;
        }
        let queued = self.rqs[self.vcpus[s].rq].queue.contains(&s);
        if queued {
            self.unqueue(s);
        }
        self.move_to_rq(now, s, to);
        if queued {
            self.enqueue(s);
            if let Some(p) = self.tickle_requeued(now, s, pcpu) {
                self.owed_kicks.push(p);
            }
        }
    }

    /// `s` (not queued, not running) joins runqueue `to`: membership,
    /// both runqueues' heaviest weight and load, and a last pCPU there
    /// (the first it may run on, from where it was).
    pub(super) fn move_to_rq(&mut self, now: u64, s: usize, to: usize) {
        if self.vcpus[s].rq != to {
            self.leave_rq(now, s);
            self.join_rq(now, s, to);
        }
    }

    /// `s` (not queued, not running) leaves its runqueue: membership, load
    /// and heaviest weight. Its record still names that runqueue.
    pub(super) fn leave_rq(&mut self, now: u64, s: usize) {
        let from = self.vcpus[s].rq;
        if matches!(self.vcpus[s].state, RunState::Runnable | RunState::Running(_)) {
            self.rq_load_add(from, -1, now >> GRANULARITY);
        }
        self.op(self.rqs[from].members.len());
        self.rqs[from].members.retain(|&x| x != s);
        // Incremental, as Credit2's `update_max_weight`: the runqueue it
        // leaves looks at its members again only if it was the heaviest.
        if self.vcpus[s].weight >= self.rqs[from].max_weight {
            self.update_max_weight(from);
        }
    }

    /// `s`, out of any runqueue, joins runqueue `to` (see `move_to_rq`).
    pub(super) fn join_rq(&mut self, now: u64, s: usize, to: usize) {
        if matches!(self.vcpus[s].state, RunState::Runnable | RunState::Running(_)) {
            self.rq_load_add(to, 1, now >> GRANULARITY);
        }
        self.rqs[to].members.push(s);
        let v = &mut self.vcpus[s];
        v.rq = to;
        v.migrate_to = None;
        // A reservation by a tickle on the old runqueue means nothing here.
        v.tickled_cpu = None;
        if !self.rqs[to].pcpus.contains(&self.vcpus[s].home) {
            let first = self.cycle_from_home(s).next();
            if let Some(p) = first {
                self.vcpus[s].home = p;
            }
        }
        let w = self.vcpus[s].weight;
        self.rqs[to].max_weight = self.rqs[to].max_weight.max(w);
    }

    /// A vCPU that leaves its pCPU with a move pending moves now: here, or
    /// as [`Sched`](super::Sched)'s emigrant when this scheduler holds one
    /// runqueue and the move is to another (returns true: it is that
    /// runqueue's to queue).
    #[inline(always)]
    pub(super) fn finish_migration(&mut self, now: u64, s: usize) -> bool {
        self.vcpus[s].migrate_to.is_some() && self.finish_migration_to(now, s)
    }

    #[inline(never)]
    fn finish_migration_to(&mut self, now: u64, s: usize) -> bool {
        let Some(to) = self.vcpus[s].migrate_to else { return false };
        if self.owns(to) {
            self.move_to_rq(now, s, to);
        } else if self.vcpus[s].parked {
            // On this runqueue's parked list: it stays (a later balance
            // may move it again).
            self.vcpus[s].migrate_to = None;
        } else {
            self.let_go(now, s, to);
            self.emigrant = Some(s);
            return true;
        }
        false
    }

    /// `s` (not queued, not running) leaves this scheduler's runqueue for
    /// runqueue `to` of another (`Sched`): its record here names `to`.
    pub(super) fn let_go(&mut self, now: u64, s: usize, to: usize) {
        self.leave_rq(now, s);
        self.vcpus[s].rq = to;
        self.vcpus[s].migrate_to = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_average_follows_the_load_over_the_window() {
        let one = 1u64 << PRECISION;
        // Long idle, then a whole window at 2: the average is 2.
        assert_eq!(decay(0, 2, 0, (1 << WINDOW) + 1), 2 * one);
        // Half a window at 1 from 0: halfway.
        assert_eq!(decay(0, 1, 0, 1 << (WINDOW - 1)), one / 2);
        // No time: no change.
        assert_eq!(decay(3 * one, 0, 5, 5), 3 * one);
        assert_eq!(tolerance(UNDERLOAD_TOLERANCE), one);
        assert_eq!(tolerance(OVERLOAD_TOLERANCE), one / 8);
    }

    /// Credit2's walk, every pair: the reference `best_exchange` must agree
    /// with, ties included.
    fn exhaustive(
        delta: u64,
        la: i64,
        oa: i64,
        push: &[(i64, usize)],
        pull: &[(i64, usize)],
    ) -> (Option<usize>, Option<usize>) {
        let (mut best, mut choice) = (delta, (None, None));
        let mut consider = |a: Option<usize>, b: Option<usize>, sa: i64, sb: i64| {
            let d = ((la - sa + sb) - (oa + sa - sb)).unsigned_abs();
            if d < best {
                (best, choice) = (d, (a, b));
            }
        };
        for &(sa, a) in push {
            for &(sb, b) in pull {
                consider(Some(a), Some(b), sa, sb);
            }
            consider(Some(a), None, sa, 0);
        }
        for &(sb, b) in pull {
            consider(None, Some(b), 0, sb);
        }
        choice
    }

    #[test]
    fn the_searched_exchange_is_the_one_every_pair_would_give() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let one = 1i64 << PRECISION;
        let mut visited = (0, 0);
        for case in 0..5_000 {
            // Few distinct averages (hogs sit at exactly one vCPU) make ties
            // common; odd ones make swaps that match no pull exactly.
            let spread = [3, 40, one as u64 + 1][case % 3];
            let (np, nq) = (next(48) as usize, next(48) as usize);
            let push: Vec<(i64, usize)> =
                (0..np).map(|i| ((next(spread) as i64) * (one / 3).max(1) % (3 * one), 100 + i)).collect();
            let pull_in: Vec<(i64, usize)> =
                (0..nq).map(|i| ((next(spread) as i64) * (one / 3).max(1) % (3 * one), 200 + i)).collect();
            let la: i64 = push.iter().map(|e| e.0).sum::<i64>() + next(one as u64) as i64;
            let oa: i64 = pull_in.iter().map(|e| e.0).sum::<i64>() + next(one as u64) as i64;
            let delta = la.abs_diff(oa);
            let mut pull: Vec<(i64, usize, usize)> = pull_in.iter().enumerate().map(|(i, &(l, s))| (l, i, s)).collect();
            let (got, work) = best_exchange(delta, la, oa, &push, &mut pull);
            assert_eq!(got, exhaustive(delta, la, oa, &push, &pull_in), "case {case}: {push:?} {pull_in:?} {la} {oa}");
            if np * nq > 900 {
                visited = (visited.0 + work, visited.1 + np * nq);
            }
        }
        // The search visits fewer records than the pairs, and far fewer on
        // long runqueues: n·log n against n².
        assert!(visited.0 * 3 < visited.1 * 2, "{visited:?}");
        let push: Vec<(i64, usize)> = (0..128).map(|i| (one + i as i64, i)).collect();
        let mut pull: Vec<(i64, usize, usize)> = (0..128).map(|i| (one - i as i64, i, 500 + i)).collect();
        let (_, work) = best_exchange(3 * one as u64, 200 * one, 197 * one, &push, &mut pull);
        assert!(work * 4 < 128 * 128, "{work}");
    }

    #[test]
    fn moves_keep_each_runqueues_heaviest_weight() {
        use crate::sched::{DomainParams, RunqueueLayout, SchedConfig, VcpuId};
        let cfg = SchedConfig { runqueue: RunqueueLayout::PerCpu, ..SchedConfig::default() };
        let mut s = Scheduler::new(cfg, 2).unwrap();
        for (d, w) in [(1u16, 512u32), (2, 256), (3, 128)] {
            s.add_domain(d, DomainParams { weight: w, cap_percent: None }).unwrap();
            s.add_vcpu(VcpuId(u32::from(d)), d, None).unwrap();
        }
        let exact = |s: &Scheduler, rq: usize| s.rqs[rq].members.iter().map(|&m| s.vcpus[m].weight).max().unwrap_or(1);
        // Every vCPU to runqueue 1 and back to 0, one at a time: the
        // incremental update agrees with a recount after each move.
        for to in [1, 0] {
            for slot in 0..3 {
                s.move_to_rq(0, slot, to);
                for rq in 0..2 {
                    assert_eq!(s.rqs[rq].max_weight, exact(&s, rq), "slot {slot} to rq{to}: rq{rq}");
                }
            }
        }
    }
}
