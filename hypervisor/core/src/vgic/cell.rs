//! The vGIC behind its lock, with a lock-free note of the vCPUs it has
//! nothing for, so that a guest entry after an exit that touched no
//! interrupt (a hypercall, a trapped register, most MMIO) takes no lock.
//!
//! Contract: bit `i` of `idle` is set only by [`VgicCell::flush`] for vCPU
//! `i`, under the lock, when `flush_lrs` found nothing for it
//! ([`FlushResult::idle`]); every other way into the model ([`VgicCell::lock`])
//! clears all the bits before the guard is handed out (an SGI,
//! [`VgicCell::send_sgi`], all but the sender's when nothing of the sender's
//! changes; a change of one vCPU's private interrupts,
//! [`VgicCell::lock_private`], that vCPU's; the fold of one vCPU's LRs,
//! [`VgicCell::sync`], that vCPU's and those it kicks), so a set bit means
//! "no change since a flush found nothing". A reader that sees a bit an
//! instant before a change clears it is in the same place as one that
//! flushed an instant before the change: the change's kick (an SGI to the
//! pCPU the vCPU runs on) makes it exit and look again, and the SGI is
//! sent after the lock that cleared the bit is released.
//! [`VgicCell::read`] hands out the model for reading only and keeps the
//! bits: reads change no delivery state.

use super::{FlushResult, HwDeactivation, Kicks, Vgic, VgicError};
use crate::sync::{Mutex, MutexGuard};
use alloc::vec::Vec;
use core::ops::Deref;
use core::sync::atomic::{AtomicU64, Ordering};

pub struct VgicCell {
    vgic: Mutex<Vgic>,
    /// Bit `i`: vCPU `i`'s last flush found nothing and the model has not
    /// been locked for a change since. vCPUs from 64 on are never noted.
    idle: AtomicU64,
}

/// The model, for reading only ([`VgicCell::read`]).
pub struct VgicRead<'a>(MutexGuard<'a, Vgic>);

impl Deref for VgicRead<'_> {
    type Target = Vgic;
    fn deref(&self) -> &Vgic {
        &self.0
    }
}

/// vCPU `id`'s bit among the idle notes; none (0) for vCPUs from 64 on,
/// which are never noted.
#[inline(always)]
fn note_bit(id: usize) -> u64 {
    if id < 64 {
        1 << id
    } else {
        0
    }
}

impl VgicCell {
    pub fn new(vgic: Vgic) -> Self {
        Self { vgic: Mutex::new(vgic), idle: AtomicU64::new(0) }
    }

    /// The model, to change or read: every vCPU's idle note is dropped
    /// (whatever the guard changes, each vCPU's next entry flushes).
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, Vgic> {
        let g = self.vgic.lock();
        self.idle.store(0, Ordering::Release);
        g
    }

    /// The model, to change vCPU `id`'s private interrupts only (resampling
    /// its forwarded PPIs against their sources at a switch or a WFI): only
    /// `id`'s note is dropped, as no other vCPU's delivery can change.
    #[inline]
    pub fn lock_private(&self, id: usize) -> MutexGuard<'_, Vgic> {
        let g = self.vgic.lock();
        self.idle.store(self.idle.load(Ordering::Relaxed) & !note_bit(id), Ordering::Release);
        g
    }

    /// `Vgic::sync_lrs` for vCPU `id` and the HW deactivations it queued.
    /// Only the notes of `id` and of the vCPUs it returns to kick are
    /// dropped: an interrupt the fold makes deliverable elsewhere is always
    /// a kick (the vCPU must notice it wherever it runs), and the kick is
    /// sent after the lock is released, as for every change.
    pub fn sync(&self, id: usize, lrs: &mut [u64]) -> (Kicks, Vec<HwDeactivation>) {
        let mut g = self.vgic.lock();
        let kicks = g.sync_lrs(id, lrs);
        let mut drop = note_bit(id);
        for k in kicks.iter().take_while(|&k| k < 64) {
            drop |= note_bit(k);
        }
        self.idle.store(self.idle.load(Ordering::Relaxed) & !drop, Ordering::Release);
        let hw = g.take_hw_deactivations();
        (kicks, hw)
    }

    /// The model, for reading only: the idle notes stay.
    #[inline]
    pub fn read(&self) -> VgicRead<'_> {
        VgicRead(self.vgic.lock())
    }

    /// [`Vgic::send_sgi`] from vCPU `from`, with its EOI watch set to
    /// `watch` first ([`Vgic::watch_active_eoi`]). Every idle note is dropped
    /// before the change, as by [`VgicCell::lock`], except `from`'s: that
    /// one goes only when the watch changed or the SGI made something
    /// deliverable to `from` (a kick of `from`), still under the lock. `from`
    /// is the vCPU running this call, so nobody reads its note meanwhile; an
    /// SGI that reaches `from` undeliverable (disabled) leaves it nothing to
    /// put in an LR. An IPI to other vCPUs thus leaves the sender's next
    /// entry nothing to flush.
    pub fn send_sgi(&self, from: usize, icc_sgi1r: u64, watch: bool) -> Result<Kicks, VgicError> {
        let mut g = self.vgic.lock();
        let mine = note_bit(from);
        // The notes are written under the lock only: no RMW needed.
        self.idle.store(self.idle.load(Ordering::Relaxed) & mine, Ordering::Release);
        let watch_changed = g.watch_active_eoi(from, watch);
        let r = g.send_sgi(from, icc_sgi1r);
        if watch_changed || r.as_ref().map_or(true, |k| k.contains(from)) {
            self.idle.store(self.idle.load(Ordering::Relaxed) & !mine, Ordering::Release);
        }
        r
    }

    /// Whether vCPU `id`'s last flush found nothing and nothing changed
    /// since: its next flush would find nothing either (see the module's
    /// contract for a change that races with this load).
    #[inline(always)]
    pub fn is_idle(&self, id: usize) -> bool {
        self.idle.load(Ordering::Acquire) & note_bit(id) != 0
    }

    /// `Vgic::flush_lrs` for vCPU `id`, noting whether it found nothing.
    /// A flush changes only `id`'s interrupts (it moves them into LRs and
    /// forgets idle ones), so it keeps the other vCPUs' notes.
    pub fn flush(&self, id: usize, lrs: &mut [u64]) -> FlushResult {
        let mut g = self.vgic.lock();
        let fr = g.flush_lrs(id, lrs);
        let bit = note_bit(id);
        if bit != 0 {
            let was = self.idle.load(Ordering::Relaxed) & bit != 0;
            // Under the lock, so that a change after it clears the note.
            if fr.idle && !was {
                self.idle.fetch_or(bit, Ordering::Release);
            } else if !fr.idle && was {
                self.idle.fetch_and(!bit, Ordering::Release);
            }
        }
        drop(g);
        fr
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intid::IntId;
    use crate::vgic::regs::*;
    use crate::vgic::VgicConfig;

    const GICD: u64 = 0x0800_0000;
    const GICR: u64 = 0x080A_0000;

    /// Two vCPUs, distributor on, SPI 40 enabled and Group 1 (routed to
    /// vCPU 0).
    fn cell() -> VgicCell {
        let mut g = Vgic::new(VgicConfig {
            gicd_base: GICD,
            gicr_base: GICR,
            nr_spis: 64,
            vcpu_mpidrs: (0..2).collect(),
            lpis: false,
        });
        g.mmio_write(0, GICD + GICD_CTLR, 4, 0x13).unwrap();
        g.mmio_write(0, GICD + IGROUPR + 4, 4, 0xffff_ffff).unwrap();
        g.mmio_write(0, GICD + ISENABLER + 4, 4, 1 << 8).unwrap();
        VgicCell::new(g)
    }

    #[test]
    fn an_sgi_to_others_keeps_the_senders_note_only() {
        let c = cell();
        for v in 0..2u64 {
            // SGI 1: Group 1, enabled, in each vCPU's SGI_base frame.
            let sgi = GICR + v * GICR_STRIDE + SGI_FRAME;
            c.lock().mmio_write(v as usize, sgi + IGROUPR, 4, 0xffff_ffff).unwrap();
            c.lock().mmio_write(v as usize, sgi + ISENABLER, 4, 1 << 1).unwrap();
        }
        let mut lrs = [0u64; 4];
        assert!(c.flush(0, &mut lrs).idle && c.flush(1, &mut lrs).idle);
        // SGI 1 from vCPU 0 to vCPU 1 (Aff0 = 1 in the target list).
        let to_1 = 1u64 << 24 | 1 << 1;
        assert!(!c.send_sgi(0, to_1, false).unwrap().is_empty(), "vCPU 1 is kicked");
        assert!(c.is_idle(0), "the sender's note stays");
        assert!(!c.is_idle(1), "the target's goes");
        let mut l1 = [0u64; 4];
        assert_eq!(c.flush(1, &mut l1).filled, 1, "and its flush finds the SGI");
        // To itself: the sender's note goes too.
        let _ = c.send_sgi(0, 1 << 24 | 1, false).unwrap();
        assert!(!c.is_idle(0));
        assert_eq!(c.flush(0, &mut lrs).filled, 1);
        // Broadcast (IRM) reaches every vCPU but the sender: vCPU 1 alone
        // (its LR still holds the first SGI, nothing new to fill).
        let mut l0 = [0u64; 4];
        let _ = c.flush(0, &mut l0);
        let _ = c.send_sgi(1, 1 << 24 | 1 << 40, false).unwrap();
        assert!(!c.is_idle(0));
        // A change of the sender's EOI watch drops its note as well, even
        // for an SGI to others.
        let c = cell();
        assert!(c.flush(0, &mut [0u64; 4]).idle);
        let _ = c.send_sgi(0, to_1, false).unwrap();
        assert!(c.is_idle(0));
        let _ = c.send_sgi(0, to_1, true).unwrap();
        assert!(!c.is_idle(0), "the watch changed");
    }

    #[test]
    fn a_sync_drops_its_own_note_and_keeps_the_others() {
        let c = cell();
        c.lock().inject_edge(IntId::try_from(40).unwrap(), 0).unwrap();
        let mut lrs = [0u64; 4];
        assert_eq!(c.flush(0, &mut lrs).filled, 1);
        assert!(c.flush(1, &mut [0u64; 4]).idle);
        // The guest took and deactivated it: state 0 in its LR.
        lrs[0] &= !(3 << 62);
        let (kicks, hw) = c.sync(0, &mut lrs);
        assert!(kicks.is_empty() && hw.is_empty());
        assert!(!c.is_idle(0), "the synced vCPU looks again");
        assert!(c.is_idle(1), "a vCPU the fold did not kick keeps its note");
        assert!(c.flush(0, &mut lrs).idle, "and finds nothing");
    }

    #[test]
    fn a_flush_that_finds_nothing_notes_its_vcpu_idle_until_a_change() {
        let c = cell();
        let mut lrs = [0u64; 4];
        assert!(!c.is_idle(0), "nothing is noted before the first flush");
        assert!(c.flush(0, &mut lrs).idle);
        assert!(c.is_idle(0));
        assert!(!c.is_idle(1), "a flush notes its own vCPU only");
        assert!(c.flush(1, &mut lrs).idle);
        assert!(c.is_idle(0) && c.is_idle(1));
        // Reading keeps the notes.
        assert!(c.read().mmio_read(0, GICD + GICD_IIDR, 4).is_ok());
        assert!(c.is_idle(0) && c.is_idle(1));
        // A lock for a change drops every note, whatever it changes.
        c.lock().inject_edge(IntId::try_from(40).unwrap(), 0).unwrap();
        assert!(!c.is_idle(0) && !c.is_idle(1));
        let fr = c.flush(0, &mut lrs);
        assert_eq!((fr.idle, fr.filled), (false, 1), "the SPI is in an LR: {fr:?}");
        assert!(!c.is_idle(0), "an LR in use is not idle");
        // vCPU 1 has nothing, and vCPU 0's flush did not change that.
        assert!(c.flush(1, &mut lrs[..0]).idle);
        assert!(c.is_idle(1) && !c.is_idle(0));
    }

    #[test]
    fn vcpus_from_64_on_are_never_noted() {
        let c = cell();
        assert!(!c.is_idle(64) && !c.is_idle(usize::MAX));
    }
}
