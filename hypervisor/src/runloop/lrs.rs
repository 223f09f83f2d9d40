//! The list registers around one guest entry. The vGIC model decides what
//! they hold (`Vgic::flush_lrs`, `Vgic::sync_lrs`); this is when they are
//! written and read, which the exit path's cost depends on: an exit that
//! touched no interrupt writes, reads and locks nothing.

use crate::arch::gic;
use crate::vgic::{HwDeactivation, Kicks, VgicCell};
use alloc::vec::Vec;

/// What an entry put in the list registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loaded {
    /// Whether any LR holds an interrupt: the exit must read them back.
    pub used: bool,
    /// LRs this entry filled with an interrupt (the vCPU's injection
    /// count; one still pending from the last entry counts again).
    pub filled: usize,
}

/// Entry: vCPU `id`'s pending interrupts into `lrs` (one per hardware LR),
/// written to the hardware unless they and the hardware are all zero
/// (`dirty`: the hardware may hold something: the last entry here used the
/// LRs, whichever vCPU it was); then the virtual CPU interface on, asking
/// for the underflow maintenance interrupt when more were pending than fit.
pub fn load(vgic: &VgicCell, id: usize, lrs: &mut [u64], dirty: bool) -> Loaded {
    if !dirty && vgic.is_idle(id) {
        // The LRs are zeros and the model has nothing for this vCPU since
        // its last flush found nothing: no lock, no flush, no LR write.
        gic::vcpu_if_on(false);
        return Loaded { used: false, filled: 0 };
    }
    let fr = vgic.flush(id, lrs);
    // Only the slots the model holds are not zero: the others were zeroed
    // by the last sync or never filled, and the hardware leaves an empty LR
    // empty.
    let used = fr.used_mask != 0;
    debug_assert_eq!(used, lrs.iter().any(|&lr| lr != 0), "LRs not held by the model are zeros");
    if used || dirty {
        for (i, &lr) in lrs.iter().enumerate() {
            gic::write_lr(i, lr);
        }
    }
    gic::vcpu_if_on(fr.overflow);
    Loaded { used, filled: fr.filled }
}

/// What an exit found in the list registers.
pub struct Saved {
    /// vCPUs whose interrupts changed state and must notice.
    pub kicks: Kicks,
    /// Physical interrupts the guest deactivated through a HW=1 LR.
    pub hw: Vec<HwDeactivation>,
}

/// Exit: the virtual CPU interface off; when the entry `used` the LRs,
/// they are read back into `lrs` and folded into the vGIC. With no LR in
/// use the model is as `flush_lrs` left it: `sync_lrs` would find no LR to
/// fold back, queue no deactivation and kick nobody (the vGIC's MMIO
/// writes take their own deactivations), so the vGIC lock is not taken.
pub fn save(vgic: &VgicCell, id: usize, lrs: &mut [u64], used: bool) -> Option<Saved> {
    if used {
        for (i, lr) in lrs.iter_mut().enumerate() {
            *lr = gic::read_lr(i);
        }
    }
    gic::vcpu_if_off();
    used.then(|| {
        let (kicks, hw) = vgic.sync(id, lrs);
        Saved { kicks, hw }
    })
}
