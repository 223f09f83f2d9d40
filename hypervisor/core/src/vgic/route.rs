//! Routing and deliverability: the vCPU an SPI goes to (IROUTER, cached
//! per SPI), the vCPU that owns an interrupt's state now (its list-register
//! holder, the vCPU it is active on, else its route), whether an interrupt
//! can be signalled, and the [`Kicks`] that follow a change.

use super::regs::*;
use super::{set_bits, Irq, Kicks, Vgic, NO_VCPU, NR_PRIVATE};
use crate::intid::IntId;

impl Vgic {
    /// The vCPU an IROUTER value selects (see [`Vgic::route_of`]).
    pub(super) fn compute_target(&self, router: u64) -> u16 {
        if router & IROUTER_IRM != 0 {
            return 0;
        }
        let want = router & AFFINITY_MASK;
        self.vcpus.iter().position(|v| v.mpidr & AFFINITY_MASK == want).map_or(NO_VCPU, |v| v as u16)
    }

    pub(super) fn retarget(&mut self, spi_idx: usize) {
        self.route_gen = self.route_gen.wrapping_add(1);
        if let Some(&r) = self.irouter.get(spi_idx) {
            let t = self.compute_target(r);
            if let Some(slot) = self.spi_target.get_mut(spi_idx) {
                *slot = t;
            }
        }
    }

    pub(super) fn retarget_all(&mut self) {
        for i in 0..self.spis.len() {
            self.retarget(i);
        }
    }

    /// The vCPU an SPI is delivered to: the IROUTER target (IRM = 0), or with
    /// IRM = 1 vCPU 0 (any participating PE is allowed; the model picks one
    /// fixed vCPU so the route stays stable). `None` for non-SPIs and for IROUTER values that match no
    /// vCPU. Use it to set the physical affinity of a forwarded SPI.
    pub fn route_of(&self, intid: IntId) -> Option<usize> {
        self.route_of_raw(u32::from(intid))
    }

    /// [`Vgic::route_of`] for an index the model computed itself.
    pub(super) fn route_of_raw(&self, intid: u32) -> Option<usize> {
        let idx = intid.checked_sub(NR_PRIVATE)? as usize;
        match *self.spi_target.get(idx)? {
            NO_VCPU => None,
            v => Some(v as usize),
        }
    }

    /// The vCPU that currently owns an interrupt's state: its LR holder, else
    /// (SPIs) the vCPU it is active on, else its route.
    pub(super) fn owner(&self, ctx_vcpu: usize, intid: u32) -> Option<usize> {
        let irq = self.irq(ctx_vcpu, intid)?;
        if irq.in_flight() {
            return Some(irq.in_lr as usize);
        }
        if intid < NR_PRIVATE {
            return Some(ctx_vcpu);
        }
        if irq.active && irq.active_on != NO_VCPU {
            return Some(irq.active_on as usize);
        }
        self.route_of_raw(intid)
    }

    /// Whether this interrupt could be signalled to the vCPU that owns it now.
    pub(super) fn deliverable(&self, irq: &Irq) -> bool {
        irq.pending_view() && !irq.active_view() && irq.enabled && self.grp1_enabled()
    }

    /// Kick the owner if the interrupt is deliverable to it, or if it sits in
    /// the owner's LRs (which must then be refreshed).
    pub(super) fn kick_for(&self, ctx_vcpu: usize, intid: u32) -> Kicks {
        let mut k = Kicks::none();
        if let (Some(owner), Some(irq)) = (self.owner(ctx_vcpu, intid), self.irq(ctx_vcpu, intid)) {
            if irq.in_flight() || self.deliverable(irq) {
                k.add(owner);
            }
        }
        k
    }

    /// Every vCPU that has something deliverable (after global changes).
    pub(super) fn kick_all_deliverable(&self) -> Kicks {
        let mut k = Kicks::none();
        for v in 0..self.vcpus.len() {
            if self.has_deliverable(v) {
                k.add(v);
            }
        }
        k
    }

    /// Whether `vcpu` has an interrupt that is pending, enabled, not active,
    /// in an enabled group and targeted at it.
    /// The priority mask is the CPU interface's business and not checked.
    /// Use it to decide whether WFI blocks (after `sync_lrs`).
    pub fn has_deliverable(&self, vcpu: usize) -> bool {
        let Some(vs) = self.vcpus.get(vcpu) else {
            return false;
        };
        if !self.grp1_enabled() {
            return false;
        }
        if set_bits(vs.private_live.into()).any(|i| self.deliverable(&vs.private[i])) {
            return true;
        }
        if self.lpi_has_deliverable(vcpu) {
            return true;
        }
        self.live_spis().any(|i| {
            let intid = NR_PRIVATE + i as u32;
            self.owner(vcpu, intid) == Some(vcpu) && self.deliverable(&self.spis[i])
        })
    }
}
