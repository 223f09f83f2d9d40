//! Moving interrupt state between the model and the `ICH_LR<n>_EL2` values.
//!
//! Protocol: `sync_lrs` on every exit (folds back and zeroes every LR the
//! model filled), `flush_lrs` on every entry (fills free LRs). Each vCPU keeps
//! a shadow of which INTID it put in which slot, so sync never trusts the
//! vINTID field of an LR value it is handed, and an interrupt sits in at most
//! one vCPU's LRs (the `in_lr` field of the interrupt).

use super::regs::*;
use super::{Irq, Kicks, Vgic, NO_INTID, NO_VCPU, NR_PRIVATE, NUM_LRS_MAX};
use crate::intid::IntId;

/// What `flush_lrs` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlushResult {
    /// Number of LRs written by this flush.
    pub filled: usize,
    /// Bitmap of the LR slots this vCPU's model owns after the flush (bit n =
    /// `ICH_LR<n>_EL2` holds a model interrupt).
    pub used_mask: u16,
    /// Some deliverable or active interrupts did not fit: set ICH_HCR_EL2.UIE
    /// so an underflow maintenance interrupt makes the vCPU exit once the LRs
    /// drain, then sync and flush again.
    pub overflow: bool,
    /// At least one LR has EOI = 1 (a level-sensitive software interrupt):
    /// its deactivation raises a maintenance interrupt; the caller only needs
    /// that interrupt to cause an exit (then sync resamples the line).
    pub eoi_maintenance: bool,
    /// Nothing for this vCPU: no LR holds one of its interrupts and none
    /// is pending or active for it. A later flush finds the same unless the
    /// vGIC changes in between (`VgicCell` relies on this).
    pub idle: bool,
}

/// Decoded state bits of an LR.
fn lr_state(v: u64) -> (bool, bool) {
    (v & LR_PENDING != 0, v & LR_ACTIVE != 0)
}

/// Whether a model INTID (an LR shadow entry) is an LPI.
pub(super) fn is_lpi(intid: u32) -> bool {
    intid != NO_INTID && intid >= crate::intid::LPI_START
}

/// Encodes one `ICH_LR<n>_EL2` value (`hw`: the pINTID of a HW = 1 LR).
pub fn encode_lr(intid: u32, priority: u8, hw: Option<u32>, eoi: bool, pending: bool, active: bool) -> u64 {
    let mut v = u64::from(intid) & LR_VINTID_MASK;
    v |= u64::from(priority) << LR_PRIORITY_SHIFT;
    v |= LR_GROUP1;
    match hw {
        Some(p) => v |= LR_HW | (u64::from(p) & LR_PINTID_MASK) << LR_PINTID_SHIFT,
        None if eoi => v |= LR_EOI,
        None => {}
    }
    if pending {
        v |= LR_PENDING;
    }
    if active {
        v |= LR_ACTIVE;
    }
    v
}

/// The most interrupts one flush puts in the LRs: the platforms' CPUs have
/// 4 LRs (QEMU's `max`, Neoverse N1/V1). A CPU with more free LRs (up to
/// 16) gets the rest at the next entry: the flush reports the overflow, so
/// the underflow maintenance interrupt brings that entry about. Four keeps
/// [`Best`] small enough to be set up in registers, not by a call to
/// `memset` at every flush.
const BEST_MAX: usize = 4;

/// Up to [`BEST_MAX`] best candidates, kept sorted by key (lower is better).
struct Best {
    items: [(u32, u32); BEST_MAX],
    len: usize,
    cap: usize,
}

impl Best {
    fn offer(&mut self, key: u32, intid: u32) {
        if self.cap == 0 {
            return;
        }
        if self.len == self.cap {
            match self.items.get(self.len - 1) {
                Some(&(worst, _)) if worst > key => self.len -= 1,
                _ => return,
            }
        }
        let mut i = self.len;
        while i > 0 && self.items[i - 1].0 > key {
            self.items[i] = self.items[i - 1];
            i -= 1;
        }
        self.items[i] = (key, intid);
        self.len += 1;
    }
}

impl Vgic {
    /// What an LR of the vCPU that owns this interrupt would get for it:
    /// (pending, active), or `None` when it has nothing to show.
    fn lr_candidate(&self, irq: &Irq) -> Option<(bool, bool)> {
        if irq.in_flight() {
            return None;
        }
        let pend = irq.model_pending() && irq.enabled && self.grp1_enabled();
        // A forwarded interrupt never goes in as pending+active: its pending
        // state will come from the physical GIC after deactivation.
        let pend = pend && !(irq.active && irq.hw.is_some());
        (pend || irq.active).then_some((pend, irq.active))
    }

    /// While `on`, an active software interrupt of `vcpu` (one the guest
    /// acknowledged, not forwarded hardware) goes into its LR with EOI
    /// maintenance, so the guest's deactivation is an exit: the trap code
    /// learns when the handler it interrupted ends (a lock-holder grace
    /// opened inside that handler, `sched::GraceWatch`). Takes effect at the
    /// next `flush_lrs`, as LRs are filled afresh after each sync. Returns
    /// whether the setting changed.
    pub fn watch_active_eoi(&mut self, vcpu: usize, on: bool) -> bool {
        match self.vcpus.get_mut(vcpu) {
            Some(vs) if vs.eoi_watch != on => {
                vs.eoi_watch = on;
                true
            }
            _ => false,
        }
    }

    /// Before entering `vcpu`: fills free list registers (state 0 and not
    /// owned by an un-synced interrupt) with the best work for this vCPU:
    /// active interrupts first, then pending ones by priority, then by INTID.
    /// Pending LPIs compete with the others by the priority of their
    /// configuration byte.
    /// `lrs` holds the caller's `nr_lrs` LR values (at most [`NUM_LRS_MAX`]
    /// are used); write them all to `ICH_LR<n>_EL2` afterwards.
    pub fn flush_lrs(&mut self, vcpu: usize, lrs: &mut [u64]) -> FlushResult {
        let Some(vs) = self.vcpus.get(vcpu) else {
            return FlushResult::default();
        };
        let n = lrs.len().min(NUM_LRS_MAX);
        debug_assert_eq!(vs.lr_held, vs.shadow_mask(), "lr_held follows lr_shadow");
        if vs.lr_held == 0 && self.spi_live_words == 0 && !self.lpis_pending(vcpu) {
            // No LR held and nothing live: no candidate, nothing to fill or
            // report (the common case of an exit that touched no interrupt).
            if vs.private_live == 0 {
                return FlushResult { idle: true, ..FlushResult::default() };
            }
            // One private interrupt changed (an IPI or a timer tick after
            // a switch): no candidates to rank.
            if vs.private_live.is_power_of_two() {
                return self.flush_one_private(vcpu, &mut lrs[..n], vs.private_live.trailing_zeros());
            }
        }
        self.flush_ranked(vcpu, &mut lrs[..n])
    }

    /// [`Vgic::flush_lrs`] when private interrupt `intid` is the only one
    /// live and no LR is held: the same result as ranking it alone.
    fn flush_one_private(&mut self, vcpu: usize, lrs: &mut [u64], intid: u32) -> FlushResult {
        let mut res = FlushResult::default();
        let irq = &self.vcpus[vcpu].private[intid as usize];
        if irq.idle() {
            self.vcpus[vcpu].private_live = 0;
            res.idle = true;
            return res;
        }
        let Some((pend, act)) = self.lr_candidate(irq) else {
            res.idle = true;
            return res;
        };
        match lrs.iter().position(|&lr| lr & LR_STATE_MASK == 0) {
            Some(slot) => {
                res.eoi_maintenance = self.fill_lr(vcpu, lrs, slot, intid, pend, act);
                res.filled = 1;
                res.used_mask = 1 << slot;
            }
            None => res.overflow = true,
        }
        res
    }

    /// Puts model interrupt `intid` (not an LPI) of `vcpu` in free LR
    /// `slot` with state (`pend`, `act`); returns whether the LR asks for
    /// EOI maintenance.
    fn fill_lr(&mut self, vcpu: usize, lrs: &mut [u64], slot: usize, intid: u32, pend: bool, act: bool) -> bool {
        let eoi_watch = self.vcpus[vcpu].eoi_watch;
        let Some(irq) = self.irq_mut(vcpu, intid) else {
            return false;
        };
        let eoi = irq.is_sw_level() || (act && irq.hw.is_none() && eoi_watch);
        lrs[slot] = encode_lr(intid, irq.priority, irq.hw.map(u32::from), eoi, pend, act);
        irq.in_lr = vcpu as u16;
        irq.lr_pend = pend;
        irq.lr_latch = pend && irq.latch;
        irq.clr_pend = false;
        irq.clr_act = false;
        irq.set_act = false;
        if pend {
            // The pending edge now lives in the LR.
            irq.latch = false;
        }
        self.vcpus[vcpu].lr_shadow[slot] = intid;
        self.vcpus[vcpu].lr_held |= 1 << slot;
        eoi
    }

    /// [`Vgic::flush_lrs`] in general: every live candidate ranked.
    pub(super) fn flush_ranked(&mut self, vcpu: usize, lrs: &mut [u64]) -> FlushResult {
        let mut res = FlushResult::default();
        let n = lrs.len();
        let vs = &self.vcpus[vcpu];
        // Free: not holding one of ours (`lr_held` mirrors `lr_shadow`) and
        // empty in the hardware's copy.
        let free = lrs[..n]
            .iter()
            .enumerate()
            .filter(|&(s, &lr)| vs.lr_held & (1 << s) == 0 && lr & LR_STATE_MASK == 0)
            .count();
        let mut best = Best { items: [(0, 0); BEST_MAX], len: 0, cap: free.min(BEST_MAX) };
        let mut total = 0usize;
        // Active first, then by priority, then by INTID (14 bits with LPIs).
        let key = |priority: u8, intid: u32, active: bool| -> u32 {
            u32::from(!active) << 24 | u32::from(priority) << 14 | intid
        };
        // Only private interrupts changed since last found idle.
        let mut private_idle = 0u32;
        for i in super::set_bits(vs.private_live.into()) {
            let irq = &vs.private[i];
            if irq.idle() {
                private_idle |= 1 << i;
                continue;
            }
            if let Some((_, act)) = self.lr_candidate(irq) {
                total += 1;
                best.offer(key(irq.priority, i as u32, act), i as u32);
            }
        }
        total += self.spi_candidates(vcpu, |prio, intid, act| best.offer(key(prio, intid, act), intid));
        total += self.lpi_candidates(vcpu, |prio, intid| best.offer(key(prio, intid, false), intid));
        self.vcpus[vcpu].private_live &= !private_idle;

        let mut slot = 0usize;
        for &(_, intid) in &best.items[..best.len] {
            // Next free slot.
            while slot < n && (self.vcpus[vcpu].lr_shadow[slot] != NO_INTID || lrs[slot] & LR_STATE_MASK != 0) {
                slot += 1;
            }
            if slot >= n {
                break;
            }
            if is_lpi(intid) {
                if let Some(v) = self.lpi_fill(vcpu, slot, intid) {
                    lrs[slot] = v;
                    res.filled += 1;
                    slot += 1;
                }
                continue;
            }
            let Some((pend, act)) = self.irq(vcpu, intid).and_then(|irq| self.lr_candidate(irq)) else {
                continue;
            };
            res.eoi_maintenance |= self.fill_lr(vcpu, lrs, slot, intid, pend, act);
            res.filled += 1;
            slot += 1;
        }
        res.overflow = total > res.filled;
        res.idle = total == 0 && self.vcpus[vcpu].lr_held == 0;
        for (s, &lr) in lrs.iter().enumerate().take(n) {
            if self.vcpus[vcpu].lr_shadow[s] != NO_INTID {
                res.used_mask |= 1 << s;
                if lr & LR_EOI != 0 && lr & LR_HW == 0 {
                    res.eoi_maintenance = true;
                }
            }
        }
        res
    }

    /// The SPIs changed since they were last found idle (`spi_live`) that
    /// could go in `vcpu`'s LRs, offered to `offer` (priority, INTID,
    /// active), a word of `spi_live` at a time: the ones found idle leave
    /// the word at its end (no scratch array to clear and fold back at every
    /// flush). Returns how many were offered.
    fn spi_candidates(&mut self, vcpu: usize, mut offer: impl FnMut(u8, u32, bool)) -> usize {
        let mut offered = 0;
        for w in super::set_bits(self.spi_live_words.into()) {
            let Some(&word) = self.spi_live.get(w) else {
                continue;
            };
            let mut bits = word;
            let mut idle = 0u64;
            while bits != 0 {
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let i = w * 64 + b;
                let Some(irq) = self.spis.get(i) else {
                    continue;
                };
                if irq.idle() {
                    idle |= 1 << b;
                    continue;
                }
                let intid = NR_PRIVATE + i as u32;
                let mine = if irq.active && irq.active_on != NO_VCPU {
                    irq.active_on as usize == vcpu
                } else {
                    self.spi_target.get(i).is_some_and(|&t| t as usize == vcpu)
                };
                if !mine {
                    continue;
                }
                if let Some((_, act)) = self.lr_candidate(irq) {
                    offered += 1;
                    offer(irq.priority, intid, act);
                }
            }
            let left = word & !idle;
            self.spi_live[w] = left;
            if left == 0 {
                self.spi_live_words &= !(1 << w);
            }
        }
        offered
    }

    /// After an exit of `vcpu`: folds the state of every LR this model filled
    /// back into the model and zeroes those LRs (write them back, or just
    /// rewrite all LRs at the next entry after `flush_lrs`). An LR with state 0
    /// means the guest deactivated the interrupt: it is done (a level software
    /// interrupt whose line is still high is pending again; a hardware one
    /// is not re-pended; an LPI found not pending was acknowledged and is
    /// done). Returns vCPUs to kick: targets of SPIs (and moved LPIs) that remain
    /// pending but belong elsewhere now (re-routed while in flight). A HW
    /// interrupt whose LR state a guest ICPENDR/ICACTIVER write emptied is
    /// queued for [`Vgic::take_hw_deactivations`].
    pub fn sync_lrs(&mut self, vcpu: usize, lrs: &mut [u64]) -> Kicks {
        let mut kicks = Kicks::none();
        if vcpu >= self.vcpus.len() {
            return kicks;
        }
        // Only the slots this model filled (`lr_held` mirrors `lr_shadow`).
        for s in super::set_bits(self.vcpus[vcpu].lr_held.into()) {
            let intid = self.vcpus[vcpu].lr_shadow[s];
            if intid == NO_INTID {
                continue;
            }
            self.vcpus[vcpu].lr_shadow[s] = NO_INTID;
            self.vcpus[vcpu].lr_held &= !(1 << s);
            let val = match lrs.get_mut(s) {
                Some(v) => core::mem::take(v),
                None => 0,
            };
            if is_lpi(intid) {
                if let Some(owner) = self.lpi_sync(vcpu, s, intid, val) {
                    kicks.add(owner);
                }
                continue;
            }
            let (pend_lr, act_lr) = lr_state(val);
            let Some(irq) = self.irq_mut(vcpu, intid) else {
                continue;
            };
            if irq.in_lr as usize != vcpu {
                continue;
            }
            let keep_pend = pend_lr && !irq.clr_pend && (!irq.is_sw_level() || irq.lr_latch);
            irq.latch |= keep_pend;
            let active = irq.set_act || (act_lr && !irq.clr_act);
            irq.active = active;
            // A HW LR still pending or active that the guest's ICPENDR or
            // ICACTIVER emptied: zeroing it never reaches the physical GIC.
            let hw_dropped = match irq.hw {
                Some(p) if (pend_lr || act_lr) && !irq.latch && !active => Some(p),
                _ => None,
            };
            if active && intid >= NR_PRIVATE {
                irq.active_on = vcpu as u16;
            }
            irq.in_lr = NO_VCPU;
            irq.lr_pend = false;
            irq.lr_latch = false;
            irq.clr_pend = false;
            irq.clr_act = false;
            irq.set_act = false;
            if let Some(p) = hw_dropped {
                self.note_hw_deactivation(vcpu, intid, p);
            }
            if intid >= NR_PRIVATE {
                if let Some(owner) = self.owner(vcpu, intid) {
                    if owner != vcpu {
                        if let Some(irq) = self.irq(vcpu, intid) {
                            if self.deliverable(irq) {
                                kicks.add(owner);
                            }
                        }
                    }
                }
            }
        }
        kicks
    }

    /// The INTIDs currently in `vcpu`'s list registers, by slot (test/debug aid).
    pub fn lr_contents(&self, vcpu: usize) -> [Option<IntId>; NUM_LRS_MAX] {
        let mut out = [None; NUM_LRS_MAX];
        if let Some(vs) = self.vcpus.get(vcpu) {
            for (o, &i) in out.iter_mut().zip(vs.lr_shadow.iter()) {
                // NO_INTID (u32::MAX) is no INTID.
                *o = IntId::try_from(i).ok();
            }
        }
        out
    }
}
