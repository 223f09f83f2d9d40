//! Generic-timer arithmetic: counter ticks to nanoseconds and back, the
//! deadline a guest's virtual timer asks for, and the emulated EL1 physical
//! timer ([`PhysTimer`]).
//!
//! Every deadline in the hypervisor is a `u64` of nanoseconds where
//! `u64::MAX` means "never". A guest chooses CNTV_CVAL freely, so a value near
//! 2^64 ticks must not wrap into a small number of nanoseconds (that would be
//! a spurious, immediate timer interrupt): the conversions saturate at
//! `u64::MAX`, which a deadline that far away honestly is.

/// `ticks` of a counter running at `freq_hz` (0 is treated as 1 Hz), in
/// nanoseconds, rounded down; `u64::MAX` when it does not fit.
pub fn ticks_to_ns(ticks: u64, freq_hz: u64) -> u64 {
    let f = freq_hz.max(1);
    // A whole number of ns per tick (QEMU's 62.5 MHz, FVP's 100 MHz, 1 GHz,
    // 25 MHz): one multiplication, no 128-bit division (a library call
    // of a hundred instructions or more, on every exit's clock reads).
    if NS_PER_S.is_multiple_of(f) {
        return ticks.saturating_mul(NS_PER_S / f);
    }
    let ns = u128::from(ticks) * u128::from(NS_PER_S) / u128::from(f);
    u64::try_from(ns).unwrap_or(u64::MAX)
}

const NS_PER_S: u64 = 1_000_000_000;

/// `ns` nanoseconds in ticks of a counter running at `freq_hz`, rounded up
/// (a timer armed with it never fires early); `u64::MAX` when it does not fit.
pub fn ns_to_ticks(ns: u64, freq_hz: u64) -> u64 {
    let f = freq_hz.max(1);
    if NS_PER_S.is_multiple_of(f) {
        return ns.div_ceil(NS_PER_S / f);
    }
    let ticks = (u128::from(ns) * u128::from(f)).div_ceil(u128::from(NS_PER_S));
    u64::try_from(ticks).unwrap_or(u64::MAX)
}

/// CNTV_CTL_EL0.ENABLE and IMASK.
const CTL_ENABLE: u64 = 1 << 0;
const CTL_IMASK: u64 = 1 << 1;

/// When (ns of the counter, CNTVOFF = 0) the virtual timer of a vCPU that is
/// not running would raise its interrupt: `u64::MAX` if it is disabled or
/// masked, or so far away that the time does not fit.
pub fn vtimer_deadline_ns(cntv_ctl: u64, cntv_cval: u64, freq_hz: u64) -> u64 {
    if cntv_ctl & CTL_ENABLE != 0 && cntv_ctl & CTL_IMASK == 0 {
        ticks_to_ns(cntv_cval, freq_hz)
    } else {
        u64::MAX
    }
}

/// The virtual timer's output line (CNTVOFF = 0, so CNTVCT is the physical
/// counter `cntvct`): high while the timer is enabled, not masked and due
/// (CNTVCT ≥ CVAL). It is a level: disabling, masking or moving CVAL to the
/// future lowers it.
pub fn vtimer_line(cntv_ctl: u64, cntv_cval: u64, cntvct: u64) -> bool {
    cntv_ctl & CTL_ENABLE != 0 && cntv_ctl & CTL_IMASK == 0 && cntvct >= cntv_cval
}

/// The deadline the EL2 timer watches for a vCPU switched out with this
/// virtual timer (`vtimer_deadline_ns`, rounded up by `slop`), or `u64::MAX`
/// when its interrupt is already pending or active in the vGIC
/// (`irq_pending_or_active`): injecting it again changes nothing the guest
/// can see, but the EL2 timer would fire at every switch-out of a vCPU that
/// has not yet taken its expired timer (a preempted hog in its tick), an
/// extra exit of whichever vCPU runs meanwhile. The guest reprograms the
/// timer when it handles the interrupt, and the next switch-out reads it.
pub fn saved_vtimer_deadline_ns(
    cntv_ctl: u64,
    cntv_cval: u64,
    freq_hz: u64,
    slop: u64,
    irq_pending_or_active: bool,
) -> u64 {
    if irq_pending_or_active {
        return u64::MAX;
    }
    crate::config::apply_slop(vtimer_deadline_ns(cntv_ctl, cntv_cval, freq_hz), slop)
}

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
    pub fn classify(a: &crate::esr::SysRegAccess) -> Option<Self> {
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
    fn whole_ns_per_tick_fast_path_agrees_with_the_exact_formula() {
        let exact_ns =
            |t: u64, f: u64| u64::try_from(u128::from(t) * 1_000_000_000 / u128::from(f)).unwrap_or(u64::MAX);
        let exact_ticks =
            |n: u64, f: u64| u64::try_from((u128::from(n) * u128::from(f)).div_ceil(1_000_000_000)).unwrap_or(u64::MAX);
        let mut x = crate::testrng::Rng(42);
        for f in [62_500_000, 100_000_000, 1_000_000_000, 25_000_000, 24_000_000, 121_875_000, 1, 3] {
            for i in 0..20_000u64 {
                let v = match i % 4 {
                    0 => x.next(),
                    1 => x.next() >> 20,
                    2 => u64::MAX - x.below(1000),
                    _ => x.below(100_000),
                };
                assert_eq!(ticks_to_ns(v, f), exact_ns(v, f), "ticks {v} at {f} Hz");
                assert_eq!(ns_to_ticks(v, f), exact_ticks(v, f), "ns {v} at {f} Hz");
            }
        }
    }

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
        let a = |op1, crn, crm, op2| crate::esr::SysRegAccess { op0: 3, op1, crn, crm, op2, reg: 0, read: true };
        assert_eq!(PtimerReg::classify(&a(3, 14, 2, 0)), Some(PtimerReg::Tval));
        assert_eq!(PtimerReg::classify(&a(3, 14, 2, 1)), Some(PtimerReg::Ctl));
        assert_eq!(PtimerReg::classify(&a(3, 14, 2, 2)), Some(PtimerReg::Cval));
        assert_eq!(PtimerReg::classify(&a(3, 14, 3, 1)), None, "CNTV_CTL_EL0 is not ours");
        assert_eq!(PtimerReg::classify(&a(3, 14, 0, 1)), None, "CNTPCT_EL0");
        assert_eq!(PtimerReg::classify(&a(0, 14, 2, 1)), None);
    }

    const QEMU_HZ: u64 = 62_500_000;

    #[test]
    fn a_saved_timer_whose_interrupt_is_pending_is_not_watched() {
        let (on, cval) = (CTL_ENABLE, 62_500_000);
        assert_eq!(saved_vtimer_deadline_ns(on, cval, QEMU_HZ, 0, false), 1_000_000_000);
        assert_eq!(saved_vtimer_deadline_ns(on, cval, QEMU_HZ, 0, true), u64::MAX);
        // Slop rounds up; masked or disabled timers are never watched.
        assert_eq!(saved_vtimer_deadline_ns(on, cval + 1, QEMU_HZ, 50_000, false), 1_000_050_000);
        assert_eq!(saved_vtimer_deadline_ns(on | CTL_IMASK, cval, QEMU_HZ, 0, false), u64::MAX);
        assert_eq!(saved_vtimer_deadline_ns(0, cval, QEMU_HZ, 0, false), u64::MAX);
    }

    #[test]
    fn the_timer_line_is_high_only_when_enabled_unmasked_and_due() {
        let cval = 1_000;
        assert!(vtimer_line(CTL_ENABLE, cval, cval));
        assert!(vtimer_line(CTL_ENABLE, cval, cval + 1));
        assert!(!vtimer_line(CTL_ENABLE, cval, cval - 1), "CVAL in the future");
        assert!(!vtimer_line(CTL_ENABLE | CTL_IMASK, cval, cval + 1), "masked");
        assert!(!vtimer_line(0, cval, cval + 1), "disabled");
        // ISTATUS (bit 2) is the hardware's output, not an input: ignored.
        assert!(!vtimer_line(1 << 2, cval, cval + 1));
        assert!(vtimer_line(CTL_ENABLE, 0, 0));
    }

    #[test]
    fn conversions_are_exact_for_ordinary_values() {
        assert_eq!(ticks_to_ns(62_500_000, QEMU_HZ), 1_000_000_000);
        assert_eq!(ticks_to_ns(1, QEMU_HZ), 16);
        assert_eq!(ns_to_ticks(16, QEMU_HZ), 1);
        // Rounded up: 17 ns is two ticks, never an early timer.
        assert_eq!(ns_to_ticks(17, QEMU_HZ), 2);
        assert_eq!(ticks_to_ns(123, 0), 123_000_000_000);
    }

    #[test]
    fn huge_counter_values_saturate_instead_of_wrapping() {
        // 2^60 ticks at 62.5 MHz is 2^64 ns: a plain `as u64` made it 0,
        // a deadline in the past, i.e. an immediate spurious timer.
        assert_eq!(ticks_to_ns(1 << 60, QEMU_HZ), u64::MAX);
        assert_eq!(ticks_to_ns(u64::MAX, QEMU_HZ), u64::MAX);
        assert_eq!(ticks_to_ns(u64::MAX - 5, 1), u64::MAX);
        assert_eq!(ns_to_ticks(u64::MAX, 2_000_000_000), u64::MAX);
        // Monotonic all the way up.
        let ticks = (0..64).flat_map(|s| [1u64 << s, (1u64 << s) | 1]).chain([u64::MAX]);
        let ns: Vec<u64> = ticks.map(|t| ticks_to_ns(t, QEMU_HZ)).collect();
        assert!(ns.windows(2).all(|w| w[0] <= w[1]), "{ns:?}");
    }

    #[test]
    fn vtimer_deadline_of_a_cval_near_2_pow_64_is_never() {
        assert_eq!(vtimer_deadline_ns(CTL_ENABLE, 1 << 60, QEMU_HZ), u64::MAX);
        assert_eq!(vtimer_deadline_ns(CTL_ENABLE, u64::MAX - 1, QEMU_HZ), u64::MAX);
        // With timer slop on top, still never (and never earlier).
        let d = vtimer_deadline_ns(CTL_ENABLE, (1 << 60) - 1, QEMU_HZ);
        assert!(d > u64::MAX - 32, "{d}");
        assert_eq!(crate::config::apply_slop(d, 50_000), u64::MAX);
        // Ordinary values, and disabled or masked timers.
        assert_eq!(vtimer_deadline_ns(CTL_ENABLE, 625, QEMU_HZ), 10_000);
        assert_eq!(vtimer_deadline_ns(0, 625, QEMU_HZ), u64::MAX);
        assert_eq!(vtimer_deadline_ns(CTL_ENABLE | CTL_IMASK, 625, QEMU_HZ), u64::MAX);
    }
}
