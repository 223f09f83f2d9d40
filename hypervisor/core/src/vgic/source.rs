//! Interrupt sources: device lines ([`Vgic::set_level`]), edges and
//! one-shots ([`Vgic::inject_edge`]) and the SGIs a vCPU sends through
//! ICC_SGI1R_EL1 ([`Vgic::send_sgi`]). Every source's INTID and vCPU is
//! checked before the model is touched, and each returns the vCPUs to kick.

use super::regs::*;
use super::{Kicks, Vgic, VgicError, NR_PRIVATE};
use crate::intid::IntId;

impl Vgic {
    /// Checks a source's INTID and vCPU; returns the INTID as a model index.
    pub(super) fn check_source_intid(&self, intid: IntId, vcpu: usize, allow_sgi: bool) -> Result<u32, VgicError> {
        let raw = u32::from(intid);
        if raw >= self.nr_irqs() || (!allow_sgi && intid.is_sgi()) {
            return Err(VgicError::BadIntid(intid));
        }
        if raw < NR_PRIVATE {
            self.check_vcpu(vcpu)?;
        }
        Ok(raw)
    }

    /// Drives the input line of a PPI or SPI (`vcpu_for_private` selects the
    /// PPI's vCPU; ignored for SPIs). On a level-configured software interrupt
    /// the line is the pending state (plus any ISPENDR latch). On an
    /// edge-configured or hardware-forwarded interrupt a rising level latches
    /// pending once.
    pub fn set_level(&mut self, intid: IntId, vcpu_for_private: usize, level: bool) -> Result<Kicks, VgicError> {
        let raw = self.check_source_intid(intid, vcpu_for_private, false)?;
        let Some(irq) = self.irq_mut(vcpu_for_private, raw) else {
            return Err(VgicError::BadIntid(intid));
        };
        let rising = level && !irq.line;
        irq.line = level;
        if rising && !irq.is_sw_level() {
            irq.latch = true;
        }
        Ok(self.kick_for(vcpu_for_private, raw))
    }

    /// Makes an interrupt pending (an edge, or a one-shot on a level
    /// interrupt, like an ISPENDR write). Use this for forwarded hardware
    /// interrupts too. SGIs are allowed (a pending SGI with no source).
    pub fn inject_edge(&mut self, intid: IntId, vcpu_for_private: usize) -> Result<Kicks, VgicError> {
        let raw = self.check_source_intid(intid, vcpu_for_private, true)?;
        let Some(irq) = self.irq_mut(vcpu_for_private, raw) else {
            return Err(VgicError::BadIntid(intid));
        };
        irq.latch = true;
        Ok(self.kick_for(vcpu_for_private, raw))
    }

    /// Emulates a write of `icc_sgi1r` to ICC_SGI1R_EL1 by `from_vcpu`:
    /// INTID\[27:24\]; IRM\[40\] = all but self; otherwise the vCPUs whose
    /// affinity is Aff3\[55:48\].Aff2\[39:32\].Aff1\[23:16\] and whose Aff0 is
    /// RS\[47:44\] * 16 + a bit index set in TargetList\[15:0\]. The targets
    /// are decoded once, not per vCPU looked at.
    pub fn send_sgi(&mut self, from_vcpu: usize, icc_sgi1r: u64) -> Result<Kicks, VgicError> {
        self.check_vcpu(from_vcpu)?;
        let intid = ((icc_sgi1r >> 24) & 0xF) as u32;
        let targets = SgiTargets::decode(icc_sgi1r);
        let mut kicks = Kicks::none();
        for v in 0..self.vcpus.len() {
            if targets.reaches(from_vcpu, v, self.vcpus[v].mpidr) {
                self.vcpus[v].private[intid as usize].latch = true;
                self.vcpus[v].private_live |= 1 << intid;
                kicks.merge(self.kick_for(v, intid));
            }
        }
        Ok(kicks)
    }
}

/// The vCPUs one ICC_SGI1R_EL1 write names (see [`Vgic::send_sgi`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SgiTargets {
    /// IRM = 1: every vCPU but the sender.
    AllButSelf,
    /// Aff3.Aff2.Aff1 in their MPIDR positions, the range selector RS and
    /// the target list: Aff0 = RS * 16 + each set bit's index.
    List { upper: u64, rs: u64, list: u64 },
}

impl SgiTargets {
    fn decode(icc_sgi1r: u64) -> Self {
        if icc_sgi1r & (1 << 40) != 0 {
            return SgiTargets::AllButSelf;
        }
        let upper = ((icc_sgi1r >> 48) & 0xFF) << 32 // Aff3
            | ((icc_sgi1r >> 32) & 0xFF) << 16 // Aff2
            | ((icc_sgi1r >> 16) & 0xFF) << 8; // Aff1
        SgiTargets::List { upper, rs: (icc_sgi1r >> 44) & 0xF, list: icc_sgi1r & 0xFFFF }
    }

    /// Whether vCPU `v`, whose MPIDR is `mpidr`, is one of them, the
    /// write coming from vCPU `from`.
    fn reaches(self, from: usize, v: usize, mpidr: u64) -> bool {
        match self {
            SgiTargets::AllButSelf => v != from,
            SgiTargets::List { upper, rs, list } => {
                let aff0 = mpidr & 0xFF;
                mpidr & (AFFINITY_MASK & !0xFF) == upper && aff0 >> 4 == rs && list & (1 << (aff0 & 0xF)) != 0
            }
        }
    }
}
