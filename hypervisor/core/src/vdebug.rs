//! The guest's debug registers: the breakpoint and watchpoint registers
//! switched per vCPU, lazily; the rest trapped by MDCR_EL2.TDA/TDOSA/TDRA
//! ([`crate::traps`]) and emulated here.
//!
//! A vCPU starts *clean*: MDCR_EL2.TDA traps every breakpoint, watchpoint
//! and MDSCR_EL1 access it makes, so the hardware registers may hold
//! another vCPU's values (of any VM) and nothing needs saving for it. Its
//! first access to a `DBGBVR/BCR/WVR/WCR<n>_EL1`, or an MDSCR_EL1 write
//! setting MDE, makes it *dirty* ([`Action::Arm`]): its saved values go
//! into the hardware, TDA is cleared while it runs, and the access runs
//! again on the hardware. At switch-out a dirty vCPU's registers are saved;
//! it goes back to clean when its MDSCR_EL1.MDE is clear
//! ([`VDebug::switched_out`]), so a guest that only reset its registers
//! (Linux's `hw_breakpoint_reset` at boot) pays one save, not one per
//! switch. Loading and saving touch every implemented slot
//! ([`Slots`], ID_AA64DFR0_EL1.BRPs/WRPs, which the guest is shown as is).
//! A clean vCPU costs a branch on [`VDebug::dirty`] per switch and nothing
//! per exit.
//!
//! Why a clean vCPU cannot fire another's breakpoints: breakpoint and
//! watchpoint exceptions need MDSCR_EL1.MDE, and a clean vCPU's MDE is
//! always clear in the hardware. MDSCR_EL1 is switched with the EL1
//! context, its accesses trap while the vCPU is clean (TDA), a write with
//! MDE set arms the vCPU instead of reaching the hardware, and a vCPU only
//! becomes clean again with MDE clear. So the hardware enable bits another
//! vCPU left need not be cleared.
//!
//! While TDA is clear, a dirty vCPU also reaches the debug communications
//! channel (DBGDTR*, OSDTR*, MDCCINT_EL1, MDCCSR_EL0), OSECCR_EL1 and the
//! claim tags on the hardware; they are not switched (there is no external
//! debugger, and they change nothing in how another vCPU runs). For a clean
//! vCPU they read as zero and ignore writes (Xen's treatment), as Linux
//! writes some of them at boot (the OS lock in `clear_os_lock`, MDSCR_EL1 in
//! `__cpu_setup` with the MMU off and no vector table yet), so none may
//! raise an exception.
//!
//! The OS lock is a per-vCPU bit here (MDCR_EL2.TDOSA traps it for dirty
//! vCPUs too); the hardware lock stays clear, so single-step (SS with KDE)
//! and, once armed, breakpoints and watchpoints work inside the guest.

use crate::esr::{sysreg_key, SysRegAccess};
use crate::regs::OSLSR_EL1;
use aarch64_cpu::registers::MDSCR_EL1;
use tock_registers::LocalRegisterCopy;

/// A trapped debug register, by what the emulation does with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DebugReg {
    /// MDSCR_EL1: reads and writes reach the (switched) hardware register
    /// while the vCPU is clean, except a write setting MDE, which arms it.
    Mdscr,
    /// `DBGBVR/DBGBCR/DBGWVR/DBGWCR<n>_EL1`: the first one arms the vCPU.
    BreakWatch,
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
        _ if bp_wp => Some(DebugReg::BreakWatch),
        _ if RAZ_WI.contains(&key) => Some(DebugReg::RazWi),
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
    /// Write this value to the hardware MDSCR_EL1 (MDE is clear in it).
    WriteMdscr(u64),
    /// The vCPU is now dirty: load its breakpoint and watchpoint registers
    /// ([`VDebug::regs`]) into the hardware, clear MDCR_EL2.TDA, and return
    /// to the trapped instruction without skipping it, so the access runs
    /// on the hardware.
    Arm,
    /// Nothing (write ignored or absorbed into the emulated state).
    Ignore,
    /// The access is not allowed (a read of a write-only register or the
    /// reverse): UNDEFINED.
    Undefined,
}

/// How many breakpoints and watchpoints the CPU implements: every one is
/// switched, and the guest's ID_AA64DFR0_EL1 shows the same counts
/// ([`crate::idregs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slots {
    pub brps: usize,
    pub wrps: usize,
}

impl Slots {
    /// From ID_AA64DFR0_EL1 (BRPs \[15:12\] and WRPs \[23:20\] hold the count
    /// minus one, so 1..=16).
    pub fn from_dfr0(dfr0: u64) -> Self {
        let count = |shift: u32| ((dfr0 >> shift) & 0xf) as usize + 1;
        Self { brps: count(12), wrps: count(20) }
    }
}

/// One breakpoint/watchpoint register bank: DBG{B,W}{V,C}`R<n>_EL1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bank {
    /// `DBGBVR<n>_EL1`, breakpoint value.
    Bvr,
    /// `DBGBCR<n>_EL1`, breakpoint control.
    Bcr,
    /// `DBGWVR<n>_EL1`, watchpoint value.
    Wvr,
    /// `DBGWCR<n>_EL1`, watchpoint control.
    Wcr,
}

impl Bank {
    pub const ALL: [Bank; 4] = [Bank::Bvr, Bank::Bcr, Bank::Wvr, Bank::Wcr];

    /// How many registers of this bank `s` implements.
    pub fn len(self, s: Slots) -> usize {
        match self {
            Bank::Bvr | Bank::Bcr => s.brps,
            Bank::Wvr | Bank::Wcr => s.wrps,
        }
    }
}

/// A vCPU's breakpoint and watchpoint registers as last saved (all zero at
/// reset: every breakpoint and watchpoint disabled).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BreakWatchRegs {
    pub bvr: [u64; 16],
    pub bcr: [u64; 16],
    pub wvr: [u64; 16],
    pub wcr: [u64; 16],
}

impl BreakWatchRegs {
    pub fn bank(&self, b: Bank) -> &[u64; 16] {
        match b {
            Bank::Bvr => &self.bvr,
            Bank::Bcr => &self.bcr,
            Bank::Wvr => &self.wvr,
            Bank::Wcr => &self.wcr,
        }
    }

    pub fn bank_mut(&mut self, b: Bank) -> &mut [u64; 16] {
        match b {
            Bank::Bvr => &mut self.bvr,
            Bank::Bcr => &mut self.bcr,
            Bank::Wvr => &mut self.wvr,
            Bank::Wcr => &mut self.wcr,
        }
    }

    /// Every implemented register, as (bank, n): what loading and saving
    /// transfer.
    pub fn slots(s: Slots) -> impl Iterator<Item = (Bank, usize)> {
        Bank::ALL.into_iter().flat_map(move |b| (0..b.len(s)).map(move |n| (b, n)))
    }
}

/// The debug state of one vCPU that is not in the hardware.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VDebug {
    /// OSLSR_EL1.OSLK: locked at reset, as on hardware.
    pub os_lock: bool,
    /// The vCPU owns the hardware breakpoint and watchpoint registers while
    /// it runs: they are loaded at switch-in and saved at switch-out, and
    /// MDCR_EL2.TDA is clear. When false its MDSCR_EL1.MDE is clear.
    pub dirty: bool,
    /// The saved registers (current only while not loaded).
    pub regs: BreakWatchRegs,
}

impl Default for VDebug {
    fn default() -> Self {
        Self { os_lock: true, dirty: false, regs: BreakWatchRegs::default() }
    }
}

/// MDSCR_EL1.MDE in `mdscr`.
fn mde(mdscr: u64) -> bool {
    LocalRegisterCopy::<u64, MDSCR_EL1::Register>::new(mdscr).is_set(MDSCR_EL1::MDE)
}

impl VDebug {
    /// Emulates an access to `reg`; `value` is the written value (ignored
    /// for reads).
    pub fn access(&mut self, reg: DebugReg, read: bool, value: u64) -> Action {
        match (reg, read) {
            (DebugReg::Mdscr, true) => Action::ReadMdscr,
            (DebugReg::Mdscr, false) if mde(value) => self.arm(),
            (DebugReg::Mdscr, false) => Action::WriteMdscr(value),
            (DebugReg::BreakWatch, _) => self.arm(),
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

    fn arm(&mut self) -> Action {
        self.dirty = true;
        Action::Arm
    }

    /// Whether MDCR_EL2.TDA traps this vCPU's accesses while it runs.
    pub fn traps(&self) -> bool {
        !self.dirty
    }

    /// A dirty vCPU was switched out: its registers were saved into
    /// [`Self::regs`] and `mdscr` is its saved MDSCR_EL1. With MDE clear
    /// none of them can fire, so it becomes clean (its next access traps
    /// and loads them again) and costs nothing at its next switches.
    pub fn switched_out(&mut self, mdscr: u64) {
        self.dirty = mde(mdscr);
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
        assert!(!d.dirty, "MDSCR without MDE, the OS lock: still clean");
        // hw_breakpoint_reset: every DBGB/DBGW register written with 0. The
        // first arms the vCPU (the access is retried on the hardware).
        for crm in 0..16 {
            for op2 in 4..=7 {
                let r = classify(&acc(2, 0, 0, crm, op2, false)).unwrap();
                assert_eq!(r, DebugReg::BreakWatch);
                assert_eq!(d.access(r, false, 0x1234), Action::Arm);
                assert!(d.dirty && !d.traps());
            }
        }
        assert_eq!(d.regs, BreakWatchRegs::default(), "nothing emulated: the hardware takes the write");
        // Switched out with MDE clear: clean again, its next access traps.
        d.switched_out(1 << 12);
        assert!(!d.dirty && d.traps());
    }

    #[test]
    fn mde_write_arms_the_vcpu() {
        let mut d = VDebug::default();
        // KDE (13) | SS (0): single-step needs no breakpoint registers.
        assert_eq!(d.access(DebugReg::Mdscr, false, (1 << 13) | 1), Action::WriteMdscr((1 << 13) | 1));
        assert!(!d.dirty);
        // MDE (15): never written to the hardware by a clean vCPU.
        assert_eq!(d.access(DebugReg::Mdscr, false, (1 << 15) | (1 << 13)), Action::Arm);
        assert!(d.dirty);
        // Breakpoints in use across a switch: it stays dirty.
        d.switched_out((1 << 15) | (1 << 13));
        assert!(d.dirty && !d.traps());
        d.switched_out(1 << 13);
        assert!(!d.dirty);
        // A read is emulated from the (switched) hardware value.
        assert_eq!(d.access(DebugReg::Mdscr, true, 0), Action::ReadMdscr);
        assert!(!d.dirty);
    }

    #[test]
    fn a_clean_vcpu_never_has_mde_in_the_hardware() {
        // Every MDSCR write a clean vCPU can make, from every state a vCPU
        // reaches: what reaches the hardware has MDE clear unless the vCPU
        // is dirty (and then owns the breakpoint registers).
        let (mde, kde, ss, tdcc) = (1u64 << 15, 1u64 << 13, 1u64, 1u64 << 12);
        let values = [0, mde, kde, ss, tdcc, mde | kde, mde | kde | ss, kde | ss | tdcc];
        for first in values {
            for then in values {
                let mut d = VDebug::default();
                for (i, w) in [first, then].into_iter().enumerate() {
                    let hw_mdscr = if d.dirty {
                        // Not trapped: the write reaches the hardware.
                        w
                    } else {
                        match d.access(DebugReg::Mdscr, false, w) {
                            Action::WriteMdscr(x) => x,
                            Action::Arm => w, // retried on the hardware, now dirty
                            a => panic!("{a:?}"),
                        }
                    };
                    assert!(d.dirty || hw_mdscr & mde == 0, "write {i} of {first:#x}, {then:#x}");
                    d.switched_out(hw_mdscr);
                    assert!(d.dirty || hw_mdscr & mde == 0, "switched out after write {i}");
                }
            }
        }
    }

    #[test]
    fn reads_arm_too() {
        // A debugger reading the registers first (a Linux ptrace GETREGSET)
        // must see the vCPU's own values: they are loaded before it runs.
        let mut d = VDebug::default();
        d.regs.bcr[3] = 0x1e7;
        assert_eq!(d.access(classify(&acc(2, 0, 0, 3, 5, true)).unwrap(), true, 0), Action::Arm);
        assert!(d.dirty);
        assert_eq!(d.regs.bank(Bank::Bcr)[3], 0x1e7);
    }

    #[test]
    fn slots_follow_the_id_register() {
        // QEMU `max`: BRPs 5, WRPs 3 (6 breakpoints, 4 watchpoints).
        let s = Slots::from_dfr0(0x0000_0000_1030_5606);
        assert_eq!(s, Slots { brps: 6, wrps: 4 });
        let all: Vec<_> = BreakWatchRegs::slots(s).collect();
        assert_eq!(all.len(), 2 * 6 + 2 * 4);
        assert_eq!(all[0], (Bank::Bvr, 0));
        assert_eq!(all[6], (Bank::Bcr, 0));
        assert_eq!(all[19], (Bank::Wcr, 3));
        // The largest: 16 of each.
        let max = Slots::from_dfr0(0xf0_f000);
        assert_eq!(max, Slots { brps: 16, wrps: 16 });
        assert_eq!(BreakWatchRegs::slots(max).count(), 64);
        let mut r = BreakWatchRegs::default();
        for (b, n) in BreakWatchRegs::slots(max) {
            r.bank_mut(b)[n] = n as u64 + 1;
        }
        assert_eq!(r.wvr[15], 16);
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
