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
//! * What (the control mode, Credit2's): the other runqueue whose average
//!   differs most from this one's; nothing if the difference is under one
//!   vCPU while both run below capacity (under 1/8 of a vCPU when either
//!   is over it). Then the push, pull or swap of one vCPU each way that
//!   leaves the smallest difference, if smaller than now.
//! * What (our mode): weights hold across runqueues. The other runqueue is
//!   the one Credit2 would take if its difference is worth a balance, else
//!   each other runqueue in turn; then the push, pull or swap that most
//!   helps the vCPU that got least per weight over the last ~0.27 s, if it
//!   slows only vCPUs that got more ([`weighted_move`]). Where no fixed
//!   placement is fair (512/256/256/256 on two one-pCPU runqueues) this
//!   takes turns.
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
    decay_over(WINDOW, avg, load << PRECISION, last, now)
}

/// [`decay`] of a value already in fixed point, over a window of
/// 2^`window` units.
fn decay_over(window: u32, avg: u64, value: u64, last: u64, now: u64) -> u64 {
    if last.saturating_add(1 << window) < now {
        return value;
    }
    let delta = now.saturating_sub(last).min(1 << window);
    (delta * value + ((1 << window) - delta) * avg) >> window
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
/// [`best_exchange`]; and our mode's weighted balance's view of both runqueues' members,
/// `mine` (the balancing runqueue's) and `theirs`.
#[derive(Default)]
pub(super) struct Candidates {
    pub(super) push: Vec<(i64, usize)>,
    pub(super) pull: Vec<(i64, usize, usize)>,
    pub(super) mine: Vec<Served>,
    pub(super) theirs: Vec<Served>,
}

/// A runqueue member as our mode's weighted balance sees it (its figures
/// worked out once, when collected).
#[derive(Clone, Copy, Debug)]
pub(super) struct Served {
    pub(super) slot: usize,
    pub(super) weight: u32,
    /// It may move to the other runqueue.
    pub(super) movable: bool,
    /// Judged: runnable at least [`JUDGED_LOAD`] of both windows, and not
    /// capped.
    judged: bool,
    /// What it got: run time per runnable time per unit of weight
    /// (fraction bits [`RATE_SHIFT`]).
    got: u64,
    /// What it asks of its runqueue: weight × runnable fraction (fraction
    /// bits [`PRECISION`]).
    demand: u64,
}

/// Fraction bits of the service rates the weighted balance compares.
/// (With [`PRECISION`], weights of 16 bits and at most 32 pCPUs a
/// runqueue, every figure fits 64 bits: one hardware division each; a
/// weight of 65535 sharing one pCPU with 4 096 others still has 8 bits.)
const RATE_SHIFT: u32 = 40;
const _: () = assert!(((super::config::MAX_CPUS_RUNQUEUE as u128) << (RATE_SHIFT + PRECISION)) <= u64::MAX as u128);
/// The weighted balance's margin: a move must raise the most lagging
/// vCPU's rate by 1/8, and may slow only vCPUs served 1/8 better than it.
const MARGIN_SHIFT: u32 = 3;
/// Window of the served averages that judge who got least (units as
/// [`WINDOW`]'s, ~0.27 s): long enough that taking turns is worth a move,
/// short enough that what a vCPU lacked a second ago is not paid back now.
const SERVED_WINDOW: u32 = 18;
/// Judged: runnable at least 1/16 of the window (a vCPU that mostly
/// sleeps is served when it wakes, not by where it sits).
const JUDGED_LOAD: u64 = 1 << (PRECISION - 4);
const ONE: u64 = 1 << PRECISION;

impl Served {
    /// From its served averages of runnable (`load`) and running (`run`)
    /// time, and `runnable`, how much of the time its load average has
    /// seen it was runnable (all fixed point). A capped vCPU's service is
    /// its cap's doing: it is not judged, and it asks for what it ran.
    pub(super) fn new(
        slot: usize,
        weight: u32,
        (load, run, runnable): (u64, u64, u64),
        movable: bool,
        capped: bool,
    ) -> Self {
        let (w, runnable) = (u64::from(weight.max(1)), runnable.min(ONE));
        let ran = run.min(load) * runnable / load.max(1);
        let got = (run.min(load) << RATE_SHIFT) / (load.max(1) * w);
        let demand = w * if capped { ran } else { runnable };
        // Judged on both windows: a vCPU that slept through the short one
        // has no figure of what it got there (its averages decay to 0).
        let judged = !capped && runnable >= JUDGED_LOAD && load >= JUDGED_LOAD;
        Served { slot, weight, movable, judged, got, demand }
    }
}

/// What a vCPU of `weight` would get (as [`Served`]'s `got`) on a runqueue
/// of `pcpus` whose members ask `demand`: the pCPUs shared by weight, at
/// most one pCPU.
fn rate(pcpus: usize, demand: u64, weight: u32) -> u64 {
    let shared = ((pcpus as u64) << (RATE_SHIFT + PRECISION)) / demand.max(1);
    shared.min((1u64 << RATE_SHIFT) / u64::from(weight.max(1)))
}

fn with_margin(x: u64) -> u64 {
    x + (x >> MARGIN_SHIFT)
}

/// The two extremes of a runqueue's figures, so that the extreme without
/// one given member is one look: (figure, index), extreme first.
#[derive(Clone, Copy, Default)]
struct Two([Option<(u64, usize)>; 2]);

impl Two {
    /// Keeps `(x, i)` if it is among the two least (the first seen on ties).
    fn offer(&mut self, x: u64, i: usize) {
        match self.0 {
            [Some(a), _] if x >= a.0 => {
                if self.0[1].is_none_or(|b| x < b.0) {
                    self.0[1] = Some((x, i));
                }
            }
            [first, _] => self.0 = [Some((x, i)), first],
        }
    }

    /// The least but `except`'s.
    fn without(&self, except: usize) -> Option<(u64, usize)> {
        self.0.into_iter().flatten().find(|e| e.1 != except)
    }
}

/// A move that helps a vCPU: its new rate, the index on its side to move
/// over, the index on the other side to move over.
type Help = (u64, Option<usize>, Option<usize>);

/// Our mode's balance between runqueue `l` (members `mine`, `pl` pCPUs)
/// and `o` (`theirs`, `po`): by service per weight, not runnable counts.
///
/// Credit2's credits are per runqueue, so weights hold only among a
/// runqueue's members, and Credit2 balances unweighted counts: 512/256/
/// 256/256 hogs on two one-pCPU runqueues stay paired as 0.667/0.333 and
/// 0.5/0.5. No fixed pairing gives 0.8/0.4/0.4/0.4; taking turns does.
/// So this looks, among the judged vCPUs of both (runnable 1/16 of the
/// time their load average has seen, not capped), for the one that got
/// least per weight over the last window (first in order on ties) that a
/// move helps: moving it to the other runqueue, moving the best-served
/// judged movable member of its runqueue out, or swapping it with the
/// other's best-served judged movable member. A move
/// helps if it raises that vCPU's rate by the margin and slows only vCPUs
/// that got more than it by the margin (the judged members of a runqueue
/// whose demand grows, and a vCPU that moves to less). Of the moves that
/// help, the one that raises its rate most, the first on ties. The
/// averages' window makes the turns last long enough to be worth a move.
/// Returns the (push, pull) slots, as [`best_exchange`], and the records
/// visited.
pub(super) fn weighted_move(
    mine: &[Served],
    pl: usize,
    theirs: &[Served],
    po: usize,
) -> ((Option<usize>, Option<usize>), usize) {
    let sides = [(mine, pl), (theirs, po)];
    let work = 3 * (mine.len() + theirs.len());
    let mut d = [0u64; 2];
    // Per side: the judged members served least, and the judged movable
    // ones best (as the inverse of what they got, to keep the least; one
    // that is not judged asks too little for its move to help).
    let (mut least, mut best) = ([Two::default(); 2], [Two::default(); 2]);
    // Per side, the heaviest judged member: the first a growing demand
    // slows (the others may still get a whole pCPU each).
    let mut heaviest = [0u32; 2];
    for (k, (m, _)) in sides.iter().enumerate() {
        for (i, v) in m.iter().enumerate() {
            d[k] += v.demand;
            if v.judged {
                least[k].offer(v.got, i);
                heaviest[k] = heaviest[k].max(v.weight);
            }
            if v.movable && v.judged {
                best[k].offer(u64::MAX - v.got, i);
            }
        }
    }
    // The move that helps `a` (side `x`, index `ia`) most.
    let help = |x: usize, ia: usize| -> Option<Help> {
        let (y, (xs, px), (ys, py)) = (1 - x, sides[x], sides[1 - x]);
        let a = &xs[ia];
        let ahead_of_a = with_margin(a.got);
        let ahead = |v: &Served| v.got >= ahead_of_a;
        // Side k's judged members (but `except`) are all ahead of `a`, or
        // none gets less when the side's demand grows to `to`.
        let all_ahead = |k: usize, except: usize, to: u64| {
            let pk = sides[k].1;
            to <= d[k]
                || rate(pk, to, heaviest[k]) >= rate(pk, d[k], heaviest[k])
                || least[k].without(except).is_none_or(|e| e.0 >= ahead_of_a)
        };
        let best_but = |k: usize, except: usize| best[k].without(except).map(|e| e.1);
        let slowed = |v: &Served, from: (usize, u64), to: (usize, u64)| {
            rate(to.0, to.1, v.weight) < rate(from.0, from.1, v.weight)
        };
        let floor = with_margin(rate(px, d[x], a.weight));
        let mut found: Option<Help> = None;
        let mut consider = |r: u64, from_x: Option<usize>, from_y: Option<usize>| {
            if r > floor && found.is_none_or(|b| r > b.0) {
                found = Some((r, from_x, from_y));
            }
        };
        if a.movable && all_ahead(y, usize::MAX, d[y] + a.demand) {
            consider(rate(py, d[y] + a.demand, a.weight), Some(ia), None);
        }
        if let Some(ib) = best_but(x, ia) {
            let b = &xs[ib];
            let moves_ok = ahead(b) || !slowed(b, (px, d[x]), (py, d[y] + b.demand));
            if moves_ok && all_ahead(y, usize::MAX, d[y] + b.demand) {
                consider(rate(px, d[x].saturating_sub(b.demand), a.weight), Some(ib), None);
            }
        }
        if let Some(ic) = best_but(y, usize::MAX).filter(|_| a.movable) {
            let c = &ys[ic];
            let dx = d[x].saturating_sub(a.demand) + c.demand;
            let dy = d[y].saturating_sub(c.demand) + a.demand;
            let moves_ok = ahead(c) || !slowed(c, (py, d[y]), (px, dx));
            let stay_ok = all_ahead(y, ic, dy) && all_ahead(x, ia, dx);
            if moves_ok && stay_ok {
                consider(rate(py, dy, a.weight), Some(ia), Some(ic));
            }
        }
        found
    };
    // The judged vCPU served least that a move helps.
    let mut chosen: Option<(u64, usize, Help)> = None;
    for (x, (m, _)) in sides.iter().enumerate() {
        for (i, v) in m.iter().enumerate().filter(|e| e.1.judged) {
            let g = v.got;
            if chosen.as_ref().is_none_or(|c| g < c.0) {
                if let Some(h) = help(x, i) {
                    chosen = Some((g, x, h));
                }
            }
        }
    }
    let Some((_, x, (_, from_x, from_y))) = chosen else { return ((None, None), work) };
    let (xs, ys) = (sides[x].0, sides[1 - x].0);
    let (from_x, from_y) = (from_x.map(|i| xs[i].slot), from_y.map(|i| ys[i].slot));
    (if x == 0 { (from_x, from_y) } else { (from_y, from_x) }, work)
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
        v.load_seen = decay(v.load_seen, 1, v.load_last, t);
        v.runnable_units += was * t.saturating_sub(v.load_last);
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
        let cpus = |s: &Self, o: usize| s.rqs[l].pcpus.len().max(s.rqs[o].pcpus.len());
        let counted =
            other.and_then(|o| Some((o, imbalance(self.rqs[l].avgload, self.rqs[o].avgload, cpus(self, o))?)));
        if self.cfg.extensions() {
            let o = counted.map_or_else(|| self.next_partner(l), |c| c.0);
            self.note_members_served(l, now);
            self.note_members_served(o, now);
            let mut c = core::mem::take(&mut self.candidates);
            self.collect_served(l, o, &mut c.mine);
            self.collect_served(o, l, &mut c.theirs);
            let ((push, pull), work) =
                weighted_move(&c.mine, self.rqs[l].pcpus.len(), &c.theirs, self.rqs[o].pcpus.len());
            self.candidates = c;
            self.op(work);
            self.carry_out(now, pcpu, (push, o), (pull, l));
            return;
        }
        let Some((o, delta)) = counted else { return };
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
        self.carry_out(now, pcpu, (push, o), (pull, l));
    }

    /// A balance's decision: `push` to runqueue `o`, `pull` to `l`.
    fn carry_out(
        &mut self,
        now: u64,
        pcpu: usize,
        (push, o): (Option<usize>, usize),
        (pull, l): (Option<usize>, usize),
    ) {
        if let Some(a) = push {
            self.rqs[o].arrivals += 1;
            self.migrate(now, a, o, pcpu);
        }
        if let Some(b) = pull {
            self.rqs[l].arrivals += 1;
            self.migrate(now, b, l, pcpu);
        }
    }

    /// The runqueue our mode's balance from `l` compares with when no
    /// count imbalance names one: each other runqueue in turn.
    pub(super) fn next_partner(&mut self, l: usize) -> usize {
        let n = self.rqs.len();
        let k = self.rqs[l].partner % (n - 1);
        self.rqs[l].partner = k + 1;
        (l + 1 + k) % n
    }

    /// `s`'s served averages brought to `now` from its run and runnable
    /// time since their last update (its load brought to `now` first). The
    /// first update only starts the count: until then it is taken to have
    /// run whenever runnable, which judges it well served.
    fn note_served(&mut self, s: usize, now: u64) {
        let v = &mut self.vcpus[s];
        let running = if matches!(v.state, RunState::Running(_)) { now.saturating_sub(v.last_burn) } else { 0 };
        let ran = v.stats.counters.run_ns.saturating_add(running);
        let runnable = v.runnable_units << GRANULARITY;
        let (t, last) = (now >> GRANULARITY, v.served_last >> GRANULARITY);
        if v.served_last == 0 {
            (v.served_run, v.served_load) = (ONE, ONE);
        } else if now > v.served_last {
            let dt = now - v.served_last;
            // As a fraction of `dt` (at most 1), in 64 bits: both shifted
            // down as far as `dt` needs.
            let drop = (u64::BITS - dt.leading_zeros()).saturating_sub(u64::BITS - 1 - PRECISION);
            let frac = |x: u64| ((x.min(dt) >> drop) << PRECISION) / (dt >> drop).max(1);
            let (r, l) = (frac(ran.saturating_sub(v.served_seen.0)), frac(runnable.saturating_sub(v.served_seen.1)));
            v.served_run = decay_over(SERVED_WINDOW, v.served_run, r, last, t);
            v.served_load = decay_over(SERVED_WINDOW, v.served_load, l, last, t);
        }
        v.served_seen = (ran, runnable);
        v.served_last = now.max(1);
    }

    /// Every member of runqueue `rq` has its load and run averages
    /// brought to `now`.
    pub(super) fn note_members_served(&mut self, rq: usize, now: u64) {
        for i in 0..self.rqs[rq].members.len() {
            let v = self.rqs[rq].members[i];
            self.note_load(v, 0, now);
            self.note_served(v, now);
        }
    }

    /// Fills `into` with runqueue `r`'s members as the weighted balance
    /// towards `to` sees them, within the room reserved for them.
    pub(super) fn collect_served(&self, r: usize, to: usize, into: &mut Vec<Served>) {
        into.clear();
        let room = into.capacity();
        for &s in self.rqs[r].members.iter().take(room) {
            let v = &self.vcpus[s];
            let runnable = (v.avgload << PRECISION) / v.load_seen.max(1);
            let movable = self.may_balance(s, to);
            let served = (v.served_load, v.served_run, runnable);
            into.push(Served::new(s, v.weight, served, movable, self.domains[v.dom].capped()));
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
        self.rqs[r]
            .members
            .iter()
            .copied()
            .filter(move |&s| self.may_balance(s, to))
            .map(|s| (s, self.vcpus[s].avgload as i64))
    }

    /// Whether a balance may move `s` to runqueue `to`: [`Self::may_move`],
    /// and not parked when this scheduler holds one runqueue (a parked
    /// vCPU stays on its runqueue's parked list, with `Sched`).
    fn may_balance(&self, s: usize, to: usize) -> bool {
        !(self.shard.is_some() && self.vcpus[s].parked) && self.may_move(s, to)
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

    /// A hog of `weight` that ran `ran` of its runnable time.
    fn hog(slot: usize, weight: u32, ran: f64) -> Served {
        Served::new(slot, weight, (ONE, (ran * ONE as f64) as u64, ONE), true, false)
    }

    #[test]
    fn the_two_least_leave_the_least_but_one_member_in_one_look() {
        let mut t = Two::default();
        for (x, i) in [(5, 0), (3, 1), (3, 2), (9, 3), (4, 4)] {
            t.offer(x, i);
        }
        assert_eq!(t.without(usize::MAX), Some((3, 1)), "first of the ties");
        assert_eq!(t.without(1), Some((3, 2)));
        assert_eq!(t.without(2), Some((3, 1)));
        assert_eq!(Two::default().without(0), None);
    }

    #[test]
    fn the_weighted_balance_takes_turns_where_no_pairing_is_fair() {
        // 512 + 256 on one pCPU, 256 + 256 on the other, as Credit2 leaves
        // them: the light one beside the heavy one got least per weight
        // (0.333 of 256, a shade under the heavy one's 0.667 of 512), and
        // a swap with a light one of the other pCPU, served better (0.5),
        // helps it most.
        let mine = [hog(0, 512, 0.667), hog(1, 256, 0.333)];
        let theirs = [hog(2, 256, 0.5), hog(3, 256, 0.5)];
        assert_eq!(weighted_move(&mine, 1, &theirs, 1).0, (Some(1), Some(2)));
        // The same seen from the other side.
        assert_eq!(weighted_move(&theirs, 1, &mine, 1).0, (Some(2), Some(1)));
        // When the heavy one got least, no swap helps it (it would share
        // with a light one again): the light one beside it moves out, as
        // it got more, and so did those it joins.
        let mine = [hog(0, 512, 0.6), hog(1, 256, 0.4)];
        let theirs = [hog(2, 256, 0.45), hog(3, 256, 0.45)];
        assert_eq!(weighted_move(&mine, 1, &theirs, 1).0, (Some(1), None));
        // Once the averages are even, nothing moves: every move would slow
        // someone served no better than the one it helps.
        let mine = [hog(0, 512, 0.8), hog(1, 256, 0.4)];
        let theirs = [hog(2, 256, 0.4), hog(3, 256, 0.4)];
        assert_eq!(weighted_move(&mine, 1, &theirs, 1).0, (None, None));
        // Nor under the margin (1/8).
        let theirs = [hog(2, 256, 0.44), hog(3, 256, 0.44)];
        assert_eq!(weighted_move(&mine, 1, &theirs, 1).0, (None, None));
    }

    #[test]
    fn the_weighted_balance_spares_the_capped_the_sleepy_and_the_pinned() {
        // A crowded runqueue (three hogs on a pCPU) beside an idle one.
        let crowded = [hog(0, 256, 0.333), hog(1, 256, 0.333), hog(2, 256, 0.333)];
        assert_eq!(weighted_move(&crowded, 1, &[], 1).0, (Some(0), None));
        // Capped: what they get is the cap's doing; not judged.
        let third = ONE / 3;
        let capped: Vec<Served> = (0..3).map(|i| Served::new(i, 256, (ONE, third, ONE), true, true)).collect();
        assert_eq!(weighted_move(&capped, 1, &[], 1).0, (None, None));
        // Runnable under 1/16 of the window: served when they wake.
        let sleepy: Vec<Served> = (0..3).map(|i| Served::new(i, 256, (ONE, third, ONE / 32), true, false)).collect();
        assert_eq!(weighted_move(&sleepy, 1, &[], 1).0, (None, None));
        // Asleep through the short window (its averages decayed to 0) but
        // runnable over the long one: no figure of what it got, not judged.
        assert!(!Served::new(3, 256, (0, 0, ONE), true, false).judged);
        assert!(Served::new(3, 256, (ONE / 8, 0, ONE), true, false).judged);
        // Pinned: the first may not move, the second does for it.
        let mut pinned = crowded;
        pinned[0].movable = false;
        assert_eq!(weighted_move(&pinned, 1, &[], 1).0, (Some(1), None));
        // Idle pCPUs with room: a vCPU that has a whole pCPU is not slowed
        // by a newcomer, however little it got before it came.
        let roomy = [hog(5, 256, 0.2)];
        assert_eq!(weighted_move(&crowded, 1, &roomy, 2).0, (Some(0), None));
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
