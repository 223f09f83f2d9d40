//! [`Dump`], the human-readable summary of one vCPU's view of the vGIC
//! (its list registers and every interrupt that is not idle), for the EL2
//! debug console.

use super::{Irq, Vgic, NO_INTID, NR_PRIVATE};
use alloc::vec::Vec;
use core::fmt;

/// Display adapter returned by [`Vgic::dump`].
pub struct Dump<'a> {
    pub(super) vgic: &'a Vgic,
    pub(super) vcpu: usize,
}

impl fmt::Display for Dump<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.vgic;
        let Some(vs) = g.vcpus.get(self.vcpu) else {
            return writeln!(f, "vgic: no vCPU {}", self.vcpu);
        };
        writeln!(
            f,
            "vgic vcpu{} mpidr={:#x} ctlr={:#x} lrs={:?}",
            self.vcpu,
            vs.mpidr,
            g.ctlr,
            vs.lr_shadow.iter().filter(|&&i| i != NO_INTID).collect::<Vec<_>>()
        )?;
        let mut line = |intid: u32, irq: &Irq| -> fmt::Result {
            if !(irq.pending_view() || irq.active_view() || irq.in_flight() || irq.line) {
                return Ok(());
            }
            write!(
                f,
                "  irq {intid:4} prio={:#04x} {}{}{}{}{}",
                irq.priority,
                if irq.enabled { "E" } else { "-" },
                if irq.pending_view() { "P" } else { "-" },
                if irq.active_view() { "A" } else { "-" },
                if irq.edge { "e" } else { "l" },
                if irq.line { "^" } else { "_" },
            )?;
            if let Some(p) = irq.hw {
                write!(f, " hw={}", u32::from(p))?;
            }
            if irq.in_flight() {
                write!(f, " in_lr=vcpu{}", irq.in_lr)?;
            }
            writeln!(f)
        };
        for (i, irq) in vs.private.iter().enumerate() {
            line(i as u32, irq)?;
        }
        for (i, irq) in g.spis.iter().enumerate() {
            let intid = NR_PRIVATE + i as u32;
            if g.owner(self.vcpu, intid) == Some(self.vcpu) {
                line(intid, irq)?;
            }
        }
        g.dump_lpis(f, self.vcpu)
    }
}
