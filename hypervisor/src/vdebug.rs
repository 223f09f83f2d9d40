//! The guest's debug registers, trapped by MDCR_EL2.TDA/TDOSA/TDRA
//! ([`crate::traps`]) and emulated here.
//!
//! The breakpoint and watchpoint registers, the debug communications
//! channel and the claim tags are not switched between vCPUs, so the guest
//! gets Xen's treatment: they read as zero and ignore writes. Linux writes
//! them at boot (`hw_breakpoint_reset`, the OS lock in `clear_os_lock`,
//! MDSCR_EL1 in `__cpu_setup` with the MMU off and no vector table yet), so
//! none of these may raise an exception.
//!
//! MDSCR_EL1 is part of the switched EL1 context, so a guest's write reaches
//! the hardware register, except MDE: it only arms the (RAZ/WI) breakpoints
//! and watchpoints, whose hardware registers hold whatever the last owner
//! left. Single-step (SS with KDE) works inside the guest.
//!
//! The OS lock is a per-vCPU bit here; the hardware lock stays clear.

use crate::esr::{sysreg_key, SysRegAccess};
use crate::regs::OSLSR_EL1;
use aarch64_cpu::registers::MDSCR_EL1;
use tock_registers::LocalRegisterCopy;

/// A trapped debug register, by what the emulation does with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DebugReg {
    /// MDSCR_EL1: through to the (switched) hardware register, MDE masked.
    Mdscr,
    /// OSLAR_EL1 (write-only): sets or clears the vCPU's OS lock.
    Oslar,
    /// OSLSR_EL1 (read-only): the vCPU's OS lock status.
    Oslsr,
    /// Read as zero, writes ignored.
    RazWi,
    /// Read-only, reads as zero (MDRAR_EL1, DBGAUTHSTATUS_EL1, MDCCSR_EL0).
    Raz,
}

/// Which debug register a trapped access names, or `None` when it is not
/// one of the registers MDCR_EL2.TDA/TDOSA/TDRA trap.
pub fn classify(s: &SysRegAccess) -> Option<DebugReg> {
    if s.op0 != 2 {
        return None;
    }
    const MDSCR: u32 = sysreg_key(2, 0, 0, 2, 2);
    const OSLAR: u32 = sysreg_key(2, 0, 1, 0, 4);
    const OSLSR: u32 = sysreg_key(2, 0, 1, 1, 4);
    const RAZ_WI: [u32; 10] = [
        sysreg_key(2, 0, 0, 0, 2), // OSDTRRX_EL1
        sysreg_key(2, 0, 0, 2, 0), // MDCCINT_EL1
        sysreg_key(2, 0, 0, 3, 2), // OSDTRTX_EL1
        sysreg_key(2, 0, 0, 6, 2), // OSECCR_EL1
        sysreg_key(2, 0, 1, 3, 4), // OSDLR_EL1
        sysreg_key(2, 0, 1, 4, 4), // DBGPRCR_EL1
        sysreg_key(2, 0, 7, 8, 6), // DBGCLAIMSET_EL1
        sysreg_key(2, 0, 7, 9, 6), // DBGCLAIMCLR_EL1
        sysreg_key(2, 3, 0, 4, 0), // DBGDTR_EL0
        sysreg_key(2, 3, 0, 5, 0), // DBGDTRRX_EL0 (read) / DBGDTRTX_EL0 (write)
    ];
    const RAZ: [u32; 3] = [
        sysreg_key(2, 0, 1, 0, 0),  // MDRAR_EL1
        sysreg_key(2, 0, 7, 14, 6), // DBGAUTHSTATUS_EL1
        sysreg_key(2, 3, 0, 1, 0),  // MDCCSR_EL0
    ];
    let key = s.key();
    // DBGBVR<n>_EL1 (op2 4), DBGBCR<n>_EL1 (5), DBGWVR<n>_EL1 (6),
    // DBGWCR<n>_EL1 (7): op1 = 0, CRn = 0, CRm = n.
    let bp_wp = s.op1 == 0 && s.crn == 0 && (4..=7).contains(&s.op2);
    match key {
        MDSCR => Some(DebugReg::Mdscr),
        OSLAR => Some(DebugReg::Oslar),
        OSLSR => Some(DebugReg::Oslsr),
        _ if bp_wp || RAZ_WI.contains(&key) => Some(DebugReg::RazWi),
        _ if RAZ.contains(&key) => Some(DebugReg::Raz),
        _ => None,
    }
}

/// What the trap handler does for an emulated access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Put this value in the transfer register.
    Read(u64),
    /// A read of MDSCR_EL1: the hardware value goes to the register.
    ReadMdscr,
    /// Write this value to the hardware MDSCR_EL1.
    WriteMdscr(u64),
    /// Nothing (write ignored or absorbed into the emulated state).
    Ignore,
    /// The access is not allowed (a read of a write-only register or the
    /// reverse): UNDEFINED.
    Undefined,
}

/// The debug state of one vCPU that is not in the hardware.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VDebug {
    /// OSLSR_EL1.OSLK: locked at reset, as on hardware.
    pub os_lock: bool,
}

impl Default for VDebug {
    fn default() -> Self {
        Self { os_lock: true }
    }
}

impl VDebug {
    /// Emulates an access to `reg`; `value` is the written value (ignored
    /// for reads).
    pub fn access(&mut self, reg: DebugReg, read: bool, value: u64) -> Action {
        match (reg, read) {
            (DebugReg::Mdscr, true) => Action::ReadMdscr,
            (DebugReg::Mdscr, false) => {
                let mut v = LocalRegisterCopy::<u64, MDSCR_EL1::Register>::new(value);
                v.modify(MDSCR_EL1::MDE::CLEAR);
                Action::WriteMdscr(v.get())
            }
            (DebugReg::Oslar, false) => {
                self.os_lock = value & 1 != 0;
                Action::Ignore
            }
            (DebugReg::Oslsr, true) => {
                let v = OSLSR_EL1::OSLM1::SET + OSLSR_EL1::OSLK.val(u64::from(self.os_lock));
                Action::Read(v.value)
            }
            (DebugReg::RazWi | DebugReg::Raz, true) => Action::Read(0),
            (DebugReg::RazWi, false) => Action::Ignore,
            (DebugReg::Oslar, true) | (DebugReg::Oslsr | DebugReg::Raz, false) => Action::Undefined,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acc(op0: u8, op1: u8, crn: u8, crm: u8, op2: u8, read: bool) -> SysRegAccess {
        SysRegAccess { op0, op1, crn, crm, op2, reg: 1, read }
    }

    #[test]
    fn linux_boot_accesses_are_emulated() {
        // __cpu_setup: msr mdscr_el1, (1 << 12) (TDCC), before VBAR_EL1 is set.
        let mut d = VDebug::default();
        let mdscr = classify(&acc(2, 0, 0, 2, 2, false)).unwrap();
        assert_eq!(d.access(mdscr, false, 1 << 12), Action::WriteMdscr(1 << 12));
        assert_eq!(d.access(mdscr, true, 0), Action::ReadMdscr);
        // clear_os_lock: OSDLR_EL1 = 0, OSLAR_EL1 = 0.
        let osdlr = classify(&acc(2, 0, 1, 3, 4, false)).unwrap();
        assert_eq!(d.access(osdlr, false, 0), Action::Ignore);
        assert!(d.os_lock, "locked at reset");
        let oslar = classify(&acc(2, 0, 1, 0, 4, false)).unwrap();
        assert_eq!(d.access(oslar, false, 0), Action::Ignore);
        assert!(!d.os_lock);
        let oslsr = classify(&acc(2, 0, 1, 1, 4, true)).unwrap();
        assert_eq!(d.access(oslsr, true, 0), Action::Read(0b1000), "OSLM = 0b10, unlocked");
        d.access(oslar, false, 1);
        assert_eq!(d.access(oslsr, true, 0), Action::Read(0b1010), "locked");
        // hw_breakpoint_reset: every DBGB/DBGW register written with 0.
        for crm in 0..16 {
            for op2 in 4..=7 {
                let r = classify(&acc(2, 0, 0, crm, op2, false)).unwrap();
                assert_eq!(r, DebugReg::RazWi);
                assert_eq!(d.access(r, false, 0x1234), Action::Ignore);
                assert_eq!(d.access(r, true, 0), Action::Read(0));
            }
        }
    }

    #[test]
    fn mde_never_reaches_the_hardware() {
        let mut d = VDebug::default();
        // MDE (15) | KDE (13) | SS (0): breakpoints off, single-step kept.
        let v = (1 << 15) | (1 << 13) | 1;
        assert_eq!(d.access(DebugReg::Mdscr, false, v), Action::WriteMdscr((1 << 13) | 1));
    }

    #[test]
    fn read_only_and_write_only_registers() {
        let mut d = VDebug::default();
        for (enc, reg) in [
            ((2, 0, 1, 0, 0), DebugReg::Raz),   // MDRAR_EL1
            ((2, 0, 7, 14, 6), DebugReg::Raz),  // DBGAUTHSTATUS_EL1
            ((2, 3, 0, 1, 0), DebugReg::Raz),   // MDCCSR_EL0
            ((2, 3, 0, 5, 0), DebugReg::RazWi), // DBGDTRRX/TX_EL0
            ((2, 0, 7, 8, 6), DebugReg::RazWi), // DBGCLAIMSET_EL1
        ] {
            let (op0, op1, crn, crm, op2) = enc;
            assert_eq!(classify(&acc(op0, op1, crn, crm, op2, true)), Some(reg), "{enc:?}");
        }
        assert_eq!(d.access(DebugReg::Raz, false, 1), Action::Undefined);
        assert_eq!(d.access(DebugReg::Oslsr, false, 1), Action::Undefined);
        assert_eq!(d.access(DebugReg::Oslar, true, 0), Action::Undefined);
    }

    #[test]
    fn other_registers_are_not_debug() {
        // PMU (op0 3, CRn 9), ID registers, trace (op0 2, op1 1), SGI1R.
        for (op0, op1, crn, crm, op2) in
            [(3, 3, 9, 12, 0), (3, 0, 0, 5, 0), (2, 1, 0, 0, 0), (3, 0, 12, 11, 5), (3, 0, 1, 2, 1)]
        {
            assert_eq!(classify(&acc(op0, op1, crn, crm, op2, true)), None);
        }
    }
}
