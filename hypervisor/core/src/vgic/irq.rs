//! [`Irq`], the state of one interrupt as the model keeps it (one per SPI,
//! one per private INTID per vCPU), with the views the guest reads
//! (pending, active) derived from it, the sentinels of the compact fields,
//! and [`set_bits`], the bitmap walk behind the live-interrupt sets.

use crate::intid::IntId;

/// Sentinel for "no vCPU" in compact u16 fields.
pub(super) const NO_VCPU: u16 = u16::MAX;
/// Sentinel for an empty list-register shadow slot.
pub(super) const NO_INTID: u32 = u32::MAX;

/// State of one interrupt (one per SPI, one per private INTID per vCPU).
///
/// While `in_lr` names a vCPU, the pending/active state the model put into the
/// list register belongs to the hardware: `lr_pend` and `active` are snapshots
/// of what was written, `latch` collects pending edges that arrived since,
/// and `clr_pend`/`clr_act`/`set_act` record guest MMIO writes to apply at sync.
#[derive(Clone, Copy, Debug)]
pub(super) struct Irq {
    pub(super) priority: u8,
    pub(super) enabled: bool,
    pub(super) group1: bool,
    pub(super) grpmod: bool,
    /// ICFGR: true = edge-triggered.
    pub(super) edge: bool,
    /// Pending latch: edge pending, or ISPENDR / inject on a level interrupt.
    pub(super) latch: bool,
    /// Input line level (level-sensitive sources).
    pub(super) line: bool,
    pub(super) active: bool,
    /// Physical INTID when forwarded as a hardware interrupt (an SGI, PPI
    /// or SPI: [`Vgic::set_hw_private`](super::Vgic::set_hw_private) checks).
    pub(super) hw: Option<IntId>,
    /// vCPU whose list registers hold this interrupt.
    pub(super) in_lr: u16,
    /// For SPIs: the vCPU it was last active on.
    pub(super) active_on: u16,
    pub(super) lr_pend: bool,
    pub(super) lr_latch: bool,
    pub(super) clr_pend: bool,
    pub(super) clr_act: bool,
    pub(super) set_act: bool,
}

impl Irq {
    pub(super) const fn reset(edge: bool) -> Self {
        Irq {
            priority: 0,
            enabled: false,
            group1: false,
            grpmod: false,
            edge,
            latch: false,
            line: false,
            active: false,
            hw: None,
            in_lr: NO_VCPU,
            active_on: NO_VCPU,
            lr_pend: false,
            lr_latch: false,
            clr_pend: false,
            clr_act: false,
            set_act: false,
        }
    }

    /// Level semantics apply (line sampled): a level-configured software interrupt.
    pub(super) fn is_sw_level(&self) -> bool {
        !self.edge && self.hw.is_none()
    }

    /// Pending state held by the model (excluding what sits in an LR).
    pub(super) fn model_pending(&self) -> bool {
        self.latch || (self.is_sw_level() && self.line)
    }

    pub(super) fn in_flight(&self) -> bool {
        self.in_lr != NO_VCPU
    }

    /// A forwarded interrupt outside the list registers whose source's
    /// output is now `level`: whether its pending state ends (the source
    /// went low while the model still holds a line or a latched edge).
    pub(super) fn hw_resample_ends(&self, level: bool) -> bool {
        self.hw.is_some() && !level && !self.in_flight() && (self.line || self.latch)
    }

    /// Ends it as [`Irq::hw_resample_ends`] said: the line down, the latch
    /// taken (returned: whether an edge was still latched).
    pub(super) fn end_hw_pending(&mut self) -> bool {
        self.line = false;
        core::mem::take(&mut self.latch)
    }

    /// Nothing can make it a list-register candidate without a change to
    /// it: not pending in any way, not active, not in a list register.
    pub(super) fn idle(&self) -> bool {
        !self.latch && !self.line && !self.active && !self.in_flight()
    }

    /// Pending as the guest should see it.
    pub(super) fn pending_view(&self) -> bool {
        self.model_pending() || (self.in_flight() && self.lr_pend && !self.clr_pend)
    }

    /// Active as the guest should see it.
    pub(super) fn active_view(&self) -> bool {
        if self.in_flight() {
            self.set_act || (self.active && !self.clr_act)
        } else {
            self.active
        }
    }
}

/// The set bits of `x`, lowest first (a bitmap word of any width, widened).
pub(super) fn set_bits(mut x: u128) -> impl Iterator<Item = usize> {
    core::iter::from_fn(move || {
        if x == 0 {
            return None;
        }
        let b = x.trailing_zeros() as usize;
        x &= x - 1;
        Some(b)
    })
}
