//! The GIC CPU interface as the hypervisor uses it: acknowledge, priority
//! drop and deactivation of physical interrupts (ICC_*_EL1), SGIs, and the
//! virtual CPU interface of the vCPU being run (`ICH_LR<n>_EL2`,
//! ICH_HCR_EL2, the VMCR and active priorities). System registers only, so
//! with the `fakes` feature the same code runs on the host over
//! `crate::fake`'s register file.

use crate::intid::IntId;
use crate::regs;
use crate::sysreg::{
    self, ICC_DIR_EL1, ICC_EOIR1_EL1, ICC_IAR1_EL1, ICC_SGI1R_EL1, ICH_AP0R0_EL2, ICH_AP0R1_EL2, ICH_AP0R2_EL2,
    ICH_AP0R3_EL2, ICH_AP1R0_EL2, ICH_AP1R1_EL2, ICH_AP1R2_EL2, ICH_AP1R3_EL2, ICH_HCR_EL2, ICH_LR0_EL2, ICH_LR10_EL2,
    ICH_LR11_EL2, ICH_LR12_EL2, ICH_LR13_EL2, ICH_LR14_EL2, ICH_LR15_EL2, ICH_LR1_EL2, ICH_LR2_EL2, ICH_LR3_EL2,
    ICH_LR4_EL2, ICH_LR5_EL2, ICH_LR6_EL2, ICH_LR7_EL2, ICH_LR8_EL2, ICH_LR9_EL2, ICH_VMCR_EL2, ICH_VTR_EL2,
};
use aarch64_cpu::registers::{ICH_HCR_EL2 as HCR, ICH_VTR_EL2 as VTR, MPIDR_EL1};
use core::sync::atomic::{AtomicU64, Ordering};
use tock_registers::interfaces::{Readable, Writeable};
use tock_registers::LocalRegisterCopy;

/// LPIs acknowledged on any pCPU ([`ack`]), for the ITS driver's stats.
static LPIS_TAKEN: AtomicU64 = AtomicU64::new(0);

/// How many LPIs [`ack`] has taken.
pub fn lpis_taken() -> u64 {
    LPIS_TAKEN.load(Ordering::Relaxed)
}

/// Acknowledges the highest-priority pending group-1 interrupt; `None` when
/// the GIC answers with a special INTID (nothing pending).
pub fn ack() -> Option<IntId> {
    loop {
        let v = ICC_IAR1_EL1.read(regs::ICC_INTID::INTID) as u32;
        match IntId::try_from(v) {
            Ok(id) if id.is_special() => return None,
            Ok(id) => {
                if id.is_lpi() {
                    LPIS_TAKEN.fetch_add(1, Ordering::Relaxed);
                }
                return Some(id);
            }
            Err(e) => {
                // No GIC returns a reserved INTID; should one, end it and
                // look for the next.
                log::warn!("GIC acknowledge: {e}");
                ICC_EOIR1_EL1.write(regs::ICC_INTID::INTID.val(u64::from(v)));
                ICC_DIR_EL1.write(regs::ICC_INTID::INTID.val(u64::from(v)));
            }
        }
    }
}

/// Priority drop (EOImode=1: does not deactivate).
pub fn eoi(intid: IntId) {
    ICC_EOIR1_EL1.write(regs::ICC_INTID::INTID.val(u64::from(u32::from(intid))));
}

/// Deactivates an interrupt the hypervisor handled itself. LPIs have no
/// active state (the priority drop of `eoi` ends them): nothing to do.
pub fn deactivate(intid: IntId) {
    if intid.is_lpi() {
        return;
    }
    ICC_DIR_EL1.write(regs::ICC_INTID::INTID.val(u64::from(u32::from(intid))));
}

/// Sends SGI `intid` to the CPU with affinity `mpidr` (nothing for a non-SGI),
/// after this CPU's earlier stores.
pub fn send_sgi(intid: IntId, mpidr: u64) {
    use regs::ICC_SGI1R_EL1 as S;
    if !intid.is_sgi() {
        return;
    }
    let m = LocalRegisterCopy::<u64, MPIDR_EL1::Register>::new(mpidr);
    let aff0 = m.read(MPIDR_EL1::Aff0);
    // What this CPU stored before the SGI is visible to the target when it
    // takes it (a flag, a cleared note the target reads without a lock):
    // a system-register write is not ordered after stores otherwise.
    sysreg::dsb_ishst();
    // TargetList is a bitmap of Aff0 values within the range RS * 16.
    ICC_SGI1R_EL1.write(
        S::Aff3.val(m.read(MPIDR_EL1::Aff3))
            + S::Aff2.val(m.read(MPIDR_EL1::Aff2))
            + S::Aff1.val(m.read(MPIDR_EL1::Aff1))
            + S::RS.val(aff0 / 16)
            + S::INTID.val(u64::from(intid.number()))
            + S::TargetList.val(1 << (aff0 % 16)),
    );
    sysreg::isb();
}

/// Number of list registers (ICH_VTR_EL2.ListRegs + 1).
pub fn nr_lrs() -> usize {
    ICH_VTR_EL2.read(VTR::ListRegs) as usize + 1
}

macro_rules! lr_access {
    ($($n:literal => $reg:ident),*) => {
        /// Reads list register `n`.
        pub fn read_lr(n: usize) -> u64 {
            match n {
                $($n => $reg.get(),)*
                _ => 0,
            }
        }
        /// Writes list register `n`.
        pub fn write_lr(n: usize, v: u64) {
            match n {
                $($n => $reg.set(v),)*
                _ => {}
            }
        }
    };
}
lr_access!(
    0 => ICH_LR0_EL2, 1 => ICH_LR1_EL2, 2 => ICH_LR2_EL2, 3 => ICH_LR3_EL2,
    4 => ICH_LR4_EL2, 5 => ICH_LR5_EL2, 6 => ICH_LR6_EL2, 7 => ICH_LR7_EL2,
    8 => ICH_LR8_EL2, 9 => ICH_LR9_EL2, 10 => ICH_LR10_EL2, 11 => ICH_LR11_EL2,
    12 => ICH_LR12_EL2, 13 => ICH_LR13_EL2, 14 => ICH_LR14_EL2, 15 => ICH_LR15_EL2
);

/// Turns the virtual CPU interface on for entering a vCPU, with the
/// underflow maintenance interrupt when `underflow` (the LRs overflowed).
pub fn vcpu_if_on(underflow: bool) {
    ICH_HCR_EL2.write(HCR::En::SET + HCR::UIE.val(u64::from(underflow)));
}

/// Turns the virtual CPU interface off after an exit (this also silences
/// maintenance interrupts while EL2 runs).
pub fn vcpu_if_off() {
    ICH_HCR_EL2.set(0);
}

/// The virtual CPU interface state of a vCPU that is not on a CPU.
#[derive(Clone, Copy, Debug, Default)]
pub struct VcpuIfState {
    pub vmcr: u64,
    /// `ICH_AP0R<n>_EL2` and `ICH_AP1R<n>_EL2`: the first
    /// `vgic::active_priority_regs(ICH_VTR_EL2)` of each are the vCPU's
    /// (the others do not exist on this CPU and stay 0).
    pub ap0r: [u64; 4],
    pub ap1r: [u64; 4],
}

/// How many `ICH_AP<m>R<n>_EL2` registers of each group this CPU implements.
fn nr_ap_regs() -> usize {
    crate::vgic::active_priority_regs(ICH_VTR_EL2.get())
}

/// The running vCPU's active Group 1 priorities (`ICH_AP1R<n>_EL2`, the
/// implemented ones, R0 in the low 32 bits): bit n set while an interrupt
/// of priority group n is acknowledged and its priority not dropped.
pub fn active_group1_priorities() -> u128 {
    let n = nr_ap_regs();
    let mut bits = u128::from(ICH_AP1R0_EL2.get() as u32);
    if n >= 2 {
        bits |= u128::from(ICH_AP1R1_EL2.get() as u32) << 32;
    }
    if n >= 4 {
        bits |= u128::from(ICH_AP1R2_EL2.get() as u32) << 64;
        bits |= u128::from(ICH_AP1R3_EL2.get() as u32) << 96;
    }
    bits
}

impl VcpuIfState {
    pub fn save(&mut self) {
        self.vmcr = ICH_VMCR_EL2.get();
        let n = nr_ap_regs();
        self.ap0r[0] = ICH_AP0R0_EL2.get();
        self.ap1r[0] = ICH_AP1R0_EL2.get();
        if n >= 2 {
            self.ap0r[1] = ICH_AP0R1_EL2.get();
            self.ap1r[1] = ICH_AP1R1_EL2.get();
        }
        if n >= 4 {
            self.ap0r[2] = ICH_AP0R2_EL2.get();
            self.ap1r[2] = ICH_AP1R2_EL2.get();
            self.ap0r[3] = ICH_AP0R3_EL2.get();
            self.ap1r[3] = ICH_AP1R3_EL2.get();
        }
    }
    pub fn restore(&self) {
        ICH_VMCR_EL2.set(self.vmcr);
        let n = nr_ap_regs();
        ICH_AP0R0_EL2.set(self.ap0r[0]);
        ICH_AP1R0_EL2.set(self.ap1r[0]);
        if n >= 2 {
            ICH_AP0R1_EL2.set(self.ap0r[1]);
            ICH_AP1R1_EL2.set(self.ap1r[1]);
        }
        if n >= 4 {
            ICH_AP0R2_EL2.set(self.ap0r[2]);
            ICH_AP1R2_EL2.set(self.ap1r[2]);
            ICH_AP0R3_EL2.set(self.ap0r[3]);
            ICH_AP1R3_EL2.set(self.ap1r[3]);
        }
    }
}
