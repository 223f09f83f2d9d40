//! Forwarded (hardware) interrupts: the virtual-to-physical INTID mapping
//! that list registers carry as HW = 1, the resample of a forwarded private
//! interrupt whose source is a level, and what the caller must mirror on the
//! physical GIC: deactivations the guest made without a HW list register
//! ([`HwDeactivation`]) and trigger changes of forwarded SPIs.

use super::{Vgic, VgicError, NR_PRIVATE};
use crate::intid::IntId;
use alloc::vec::Vec;

/// A forwarded (HW) interrupt whose virtual pending and active state the
/// guest ended with an ICPENDR/ICACTIVER write rather than through a HW list
/// register: the physical interrupt is still active and, unless the caller
/// deactivates it, the device or timer behind it never interrupts again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HwDeactivation {
    /// For a private interrupt, the vCPU it belongs to (its physical twin is
    /// active on the pCPU that runs that vCPU); for an SPI, the vCPU whose
    /// state it was.
    pub vcpu: usize,
    /// The virtual INTID.
    pub intid: IntId,
    /// The physical INTID to deactivate.
    pub pintid: IntId,
}

impl Vgic {
    /// Maps (or with `None` unmaps) an SPI to a physical INTID: its LRs get
    /// HW = 1 and pINTID, so the guest's deactivation deactivates the physical
    /// interrupt. Errors for non-SPIs (use [`Vgic::set_hw_private`]) and for
    /// physical INTIDs ≥ 1020.
    pub fn set_hw(&mut self, intid: IntId, pintid: Option<IntId>) -> Result<(), VgicError> {
        if u32::from(intid) < NR_PRIVATE {
            return Err(VgicError::BadIntid(intid));
        }
        self.set_hw_private(0, intid, pintid)
    }

    /// Maps a private interrupt (e.g. the virtual timer PPI 27) of one vCPU,
    /// or an SPI (then `vcpu` is ignored), to a physical INTID.
    pub fn set_hw_private(&mut self, vcpu: usize, intid: IntId, pintid: Option<IntId>) -> Result<(), VgicError> {
        let raw = u32::from(intid);
        if raw < NR_PRIVATE {
            self.check_vcpu(vcpu)?;
        }
        if let Some(p) = pintid {
            // A HW list register's pINTID: an SGI, PPI or SPI (below 1020).
            if p >= IntId::SPECIAL_FIRST {
                return Err(VgicError::BadIntid(p));
            }
        }
        let irq = self.irq_mut(vcpu, raw).ok_or(VgicError::BadIntid(intid))?;
        irq.hw = pintid;
        Ok(())
    }

    /// Resamples the input line of a forwarded private interrupt whose
    /// source is a level (the virtual timer, injected with
    /// [`Vgic::inject_edge`] when the physical PPI fires). With `level` low,
    /// a pending state the guest has not acknowledged ends, as it does for a
    /// level-sensitive interrupt whose line drops; an active state stays (the
    /// guest's deactivation ends it). A high `level` changes nothing: the
    /// physical interrupt reports rising edges. An interrupt sitting in the
    /// vCPU's list registers belongs to the hardware and is left alone, so
    /// call this between `sync_lrs` and `flush_lrs`, or while the vCPU is
    /// not running. The physical interrupt is the caller's: afterwards it
    /// makes it active exactly when [`Vgic::is_pending_or_active`] says so
    /// (nothing goes to [`Vgic::take_hw_deactivations`]). Returns whether a
    /// pending state ended; errors for an interrupt that is not a forwarded
    /// PPI or SGI of `vcpu`.
    pub fn resample_hw_private(&mut self, vcpu: usize, intid: IntId, level: bool) -> Result<bool, VgicError> {
        self.check_vcpu(vcpu)?;
        let raw = u32::from(intid);
        if raw >= NR_PRIVATE {
            return Err(VgicError::BadIntid(intid));
        }
        // Looked at before it is taken for a change: taking it marks it
        // live for the next flush, and nearly always there is nothing to end.
        let irq = self.irq(vcpu, raw).ok_or(VgicError::BadIntid(intid))?;
        if irq.hw.is_none() {
            return Err(VgicError::BadIntid(intid));
        }
        if !irq.hw_resample_ends(level) {
            return Ok(false);
        }
        let irq = self.irq_mut(vcpu, raw).ok_or(VgicError::BadIntid(intid))?;
        Ok(irq.end_hw_pending())
    }

    /// The switch-in of forwarded private interrupt `intid` of `vcpu`, whose
    /// source's output is `level`: [`Vgic::resample_hw_private`], then
    /// whether it is pending or active ([`Vgic::is_pending_or_active`]),
    /// which the caller's physical interrupt's active state follows. One
    /// lookup; false for an INTID that is not private.
    pub fn load_hw_private(&mut self, vcpu: usize, intid: IntId, level: bool) -> bool {
        let raw = u32::from(intid) as usize;
        let Some(vs) = self.vcpus.get_mut(vcpu) else {
            return false;
        };
        let Some(irq) = vs.private.get_mut(raw) else {
            return false;
        };
        if irq.in_flight() {
            // In an LR: the hardware's, left alone.
            return irq.pending_view() || irq.active_view();
        }
        if irq.hw_resample_ends(level) {
            irq.end_hw_pending();
            vs.private_live |= 1 << raw;
        }
        // Not in an LR: the model's own state is the guest's view.
        irq.model_pending() || irq.active
    }

    /// The physical INTID an interrupt is forwarded from, if any.
    pub fn hw_of(&self, vcpu: usize, intid: IntId) -> Option<IntId> {
        self.irq(vcpu, u32::from(intid))?.hw
    }

    /// The physical interrupts to deactivate because the guest ended their
    /// virtual state without a HW list register (see [`HwDeactivation`]).
    /// Call after every `sync_lrs` and `mmio_write`; the list is then empty.
    pub fn take_hw_deactivations(&mut self) -> Vec<HwDeactivation> {
        core::mem::take(&mut self.hw_deactivations)
    }

    /// Forwarded SPIs whose trigger the guest changed through GICD_ICFGR
    /// since the last call, as (physical INTID, edge-triggered): the caller
    /// configures the physical SPI the same way. Call after `mmio_write`.
    pub fn take_hw_triggers(&mut self) -> Vec<(IntId, bool)> {
        core::mem::take(&mut self.hw_triggers)
    }

    /// Records that forwarded SPI `pintid` is now `edge` (or level).
    pub(super) fn note_hw_trigger(&mut self, pintid: IntId, edge: bool) {
        match self.hw_triggers.iter_mut().find(|(p, _)| *p == pintid) {
            Some(t) => t.1 = edge,
            None => self.hw_triggers.push((pintid, edge)),
        }
    }

    /// Records that `intid` (forwarded from `pintid`) went idle behind the
    /// physical GIC's back.
    pub(super) fn note_hw_deactivation(&mut self, vcpu: usize, intid: u32, pintid: IntId) {
        // Every model index is an INTID below 1020.
        let Ok(intid) = IntId::try_from(intid) else {
            return;
        };
        let d = HwDeactivation { vcpu, intid, pintid };
        if !self.hw_deactivations.contains(&d) {
            self.hw_deactivations.push(d);
        }
    }
}
