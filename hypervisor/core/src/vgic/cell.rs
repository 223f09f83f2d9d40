//! The vGIC behind its lock, with a lock-free note of the vCPUs it has
//! nothing for, so that a guest entry after an exit that touched no
//! interrupt (a hypercall, a trapped register, most MMIO) takes no lock.
//!
//! Contract: bit `i` of `idle` is set only by [`VgicCell::flush`] for vCPU
//! `i`, under the lock, when `flush_lrs` found nothing for it
//! ([`FlushResult::idle`]); every other way into the model ([`VgicCell::lock`])
//! clears all the bits before the guard is handed out, so a set bit means
//! "no change since a flush found nothing". A reader that sees a bit an
//! instant before a change clears it is in the same place as one that
//! flushed an instant before the change: the change's kick (an SGI to the
//! pCPU the vCPU runs on) makes it exit and look again, and the SGI is
//! sent after the lock that cleared the bit is released.
//! [`VgicCell::read`] hands out the model for reading only and keeps the
//! bits: reads change no delivery state.

use super::{FlushResult, Vgic};
use crate::sync::{Mutex, MutexGuard};
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

    /// The model, for reading only: the idle notes stay.
    #[inline]
    pub fn read(&self) -> VgicRead<'_> {
        VgicRead(self.vgic.lock())
    }

    /// Whether vCPU `id`'s last flush found nothing and nothing changed
    /// since: its next flush would find nothing either (see the module's
    /// contract for a change that races with this load).
    #[inline(always)]
    pub fn is_idle(&self, id: usize) -> bool {
        id < 64 && self.idle.load(Ordering::Acquire) & (1 << id) != 0
    }

    /// `Vgic::flush_lrs` for vCPU `id`, noting whether it found nothing.
    /// A flush changes only `id`'s interrupts (it moves them into LRs and
    /// forgets idle ones), so it keeps the other vCPUs' notes.
    pub fn flush(&self, id: usize, lrs: &mut [u64]) -> FlushResult {
        let mut g = self.vgic.lock();
        let fr = g.flush_lrs(id, lrs);
        if id < 64 {
            let bit = 1u64 << id;
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
