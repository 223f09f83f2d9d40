//! The emulated EL1 physical timer ([`PhysTimer`]): a guest's CNTP_*_EL0
//! accesses trap (CNTHCTL_EL2.EL1PCEN = 0) and are answered from the model,
//! against the physical counter.

use crate::esr::SysRegAccess;
use crate::time::{vtimer_deadline_ns, vtimer_line, CTL_ENABLE, CTL_IMASK};

/// The EL1 physical timer's registers a guest may access (CNTP_*_EL0; the
/// counter CNTPCT_EL0 itself is not trapped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtimerReg {
    Tval,
    Ctl,
    Cval,
}

impl PtimerReg {
    /// CNTP_TVAL_EL0 / CNTP_CTL_EL0 / CNTP_CVAL_EL0 (op0 3, op1 3, CRn 14,
    /// CRm 2, op2 0 / 1 / 2), trapped by CNTHCTL_EL2.EL1PCEN = 0.
    pub fn classify(a: &SysRegAccess) -> Option<Self> {
        if (a.op0, a.op1, a.crn, a.crm) != (3, 3, 14, 2) {
            return None;
        }
        match a.op2 {
            0 => Some(PtimerReg::Tval),
            1 => Some(PtimerReg::Ctl),
            2 => Some(PtimerReg::Cval),
            _ => None,
        }
    }
}

/// CNTP_CTL_EL0.ISTATUS (read-only, the timer condition).
const CTL_ISTATUS: u64 = 1 << 2;

/// A vCPU's EL1 physical timer, emulated: the registers live here, the
/// counter is the physical one (the guest reads CNTPCT_EL0 untrapped), and
/// the output line is the level [`PhysTimer::line`] that the caller drives
/// into the vGIC as the timer's PPI (a software level interrupt). What KVM
/// does for a guest that uses the physical timer beside the virtual one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhysTimer {
    /// ENABLE and IMASK (ISTATUS is computed).
    pub ctl: u64,
    pub cval: u64,
}

impl PhysTimer {
    /// The value a read of `reg` returns at counter value `cnt`.
    pub fn read(&self, reg: PtimerReg, cnt: u64) -> u64 {
        match reg {
            PtimerReg::Ctl => {
                let met = if cnt >= self.cval { CTL_ISTATUS } else { 0 };
                // ISTATUS shows the condition while enabled, whatever IMASK.
                (self.ctl & (CTL_ENABLE | CTL_IMASK)) | if self.ctl & CTL_ENABLE != 0 { met } else { 0 }
            }
            PtimerReg::Cval => self.cval,
            // TimerValue: the low 32 bits of CVAL - CNTPCT, a signed
            // count down; bits 63:32 are RES0.
            PtimerReg::Tval => u64::from(self.cval.wrapping_sub(cnt) as u32),
        }
    }

    /// A write of `value` to `reg` at counter value `cnt`.
    pub fn write(&mut self, reg: PtimerReg, value: u64, cnt: u64) {
        match reg {
            PtimerReg::Ctl => self.ctl = value & (CTL_ENABLE | CTL_IMASK),
            PtimerReg::Cval => self.cval = value,
            // CVAL = CNTPCT + SignExtend(TimerValue[31:0]).
            PtimerReg::Tval => self.cval = cnt.wrapping_add(i64::from(value as u32 as i32) as u64),
        }
    }

    /// The output line at counter value `cnt`: enabled, not masked, due.
    pub fn line(&self, cnt: u64) -> bool {
        vtimer_line(self.ctl, self.cval, cnt)
    }

    /// When (ns of the counter) the line rises, `u64::MAX` if it never
    /// does on its own (disabled or masked).
    pub fn deadline_ns(&self, freq_hz: u64) -> u64 {
        vtimer_deadline_ns(self.ctl, self.cval, freq_hz)
    }

    /// When the EL2 timer must next look at it: its deadline while the line
    /// the vGIC has (`level`) is low, never once it is high.
    pub fn watch_ns(&self, level: bool, freq_hz: u64) -> u64 {
        if level {
            u64::MAX
        } else {
            self.deadline_ns(freq_hz)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptimer_registers_behave_like_the_architecture() {
        let mut t = PhysTimer::default();
        assert_eq!(t.read(PtimerReg::Ctl, 100), 0, "reset: disabled, no ISTATUS");
        // TVAL sets CVAL relative to now, and counts down.
        t.write(PtimerReg::Tval, 50, 1000);
        assert_eq!(t.cval, 1050);
        assert_eq!(t.read(PtimerReg::Tval, 1020), 30);
        assert_eq!(t.read(PtimerReg::Tval, 1060), u64::from((-10i32) as u32), "negative once due");
        // A negative TVAL puts CVAL in the past.
        t.write(PtimerReg::Tval, u64::from((-5i32) as u32) | 0xdead_0000_0000, 1000);
        assert_eq!(t.cval, 995, "bits 63:32 of the written value are ignored");
        // The line: enabled, unmasked, due; ISTATUS regardless of IMASK.
        t.write(PtimerReg::Ctl, 0b1, 1000);
        assert!(t.line(1000));
        assert_eq!(t.read(PtimerReg::Ctl, 1000), 0b101);
        t.write(PtimerReg::Ctl, 0b11, 1000);
        assert!(!t.line(1000), "masked");
        assert_eq!(t.read(PtimerReg::Ctl, 1000), 0b111);
        t.write(PtimerReg::Ctl, 0b1 | 0b100, 1000);
        assert_eq!(t.ctl, 0b1, "ISTATUS is read-only");
        // A future CVAL lowers the line.
        t.write(PtimerReg::Cval, 5000, 1000);
        assert!(!t.line(1000));
        assert_eq!(t.read(PtimerReg::Ctl, 1000), 0b1);
        assert_eq!(t.deadline_ns(1_000_000_000), 5000);
        t.write(PtimerReg::Ctl, 0, 1000);
        assert_eq!(t.deadline_ns(1_000_000_000), u64::MAX);
    }

    #[test]
    fn ptimer_classify_names_only_the_cntp_registers() {
        let a = |op1, crn, crm, op2| SysRegAccess { op0: 3, op1, crn, crm, op2, reg: 0, read: true };
        assert_eq!(PtimerReg::classify(&a(3, 14, 2, 0)), Some(PtimerReg::Tval));
        assert_eq!(PtimerReg::classify(&a(3, 14, 2, 1)), Some(PtimerReg::Ctl));
        assert_eq!(PtimerReg::classify(&a(3, 14, 2, 2)), Some(PtimerReg::Cval));
        assert_eq!(PtimerReg::classify(&a(3, 14, 3, 1)), None, "CNTV_CTL_EL0 is not ours");
        assert_eq!(PtimerReg::classify(&a(3, 14, 0, 1)), None, "CNTPCT_EL0");
        assert_eq!(PtimerReg::classify(&a(0, 14, 2, 1)), None);
    }
}
