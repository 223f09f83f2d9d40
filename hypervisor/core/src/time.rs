//! Generic-timer arithmetic: counter ticks to nanoseconds and back, the
//! deadline a guest's virtual timer asks for and its slop. (The emulated EL1
//! physical timer built on it is `ptimer`.)
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

/// Nanoseconds per tick of a counter running at `freq_hz`, when that is a
/// whole number (QEMU's 62.5 MHz, FVP's 100 MHz, 1 GHz, 25 MHz): then
/// [`ticks_to_ns`] is one multiplication by it, which a clock read on every
/// exit can do with the factor computed once.
pub fn whole_ns_per_tick(freq_hz: u64) -> Option<u64> {
    let f = freq_hz.max(1);
    NS_PER_S.is_multiple_of(f).then_some(NS_PER_S / f)
}

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
pub const CTL_ENABLE: u64 = 1 << 0;
pub const CTL_IMASK: u64 = 1 << 1;

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
    apply_slop(vtimer_deadline_ns(cntv_ctl, cntv_cval, freq_hz), slop)
}

/// A virtual-timer deadline (ns) as armed with `slop`: rounded up to a
/// multiple of it (never earlier than asked).
pub fn apply_slop(deadline: u64, slop: u64) -> u64 {
    if slop == 0 || deadline == u64::MAX {
        deadline
    } else {
        deadline.div_ceil(slop).saturating_mul(slop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_ns_per_tick_fast_path_agrees_with_the_exact_formula() {
        assert_eq!(whole_ns_per_tick(62_500_000), Some(16));
        assert_eq!(whole_ns_per_tick(24_000_000), None);
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
                // What the EL2 clock does with the factor computed once.
                if let Some(k) = whole_ns_per_tick(f) {
                    assert_eq!(v.saturating_mul(k), exact_ns(v, f), "factor {k}: ticks {v} at {f} Hz");
                    assert_eq!(v.div_ceil(k), exact_ticks(v, f), "factor {k}: ns {v} at {f} Hz");
                }
            }
        }
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
    fn slop_rounds_up_never_down() {
        assert_eq!(apply_slop(123_456, 0), 123_456);
        assert_eq!(apply_slop(123_456, 50_000), 150_000);
        assert_eq!(apply_slop(150_000, 50_000), 150_000);
        assert_eq!(apply_slop(u64::MAX, 50_000), u64::MAX);
        assert!(apply_slop(u64::MAX - 10, 50_000) >= u64::MAX - 10);
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
        assert_eq!(apply_slop(d, 50_000), u64::MAX);
        // Ordinary values, and disabled or masked timers.
        assert_eq!(vtimer_deadline_ns(CTL_ENABLE, 625, QEMU_HZ), 10_000);
        assert_eq!(vtimer_deadline_ns(0, 625, QEMU_HZ), u64::MAX);
        assert_eq!(vtimer_deadline_ns(CTL_ENABLE | CTL_IMASK, 625, QEMU_HZ), u64::MAX);
    }
}
