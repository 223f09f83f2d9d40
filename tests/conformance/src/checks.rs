//! The checks, in the order they run. Each returns a `Verdict`; `report`
//! prints its line. Names are stable: the integration tests match them.

use crate::arch;
use crate::console::Msg;
use crate::exc::{self, guarded};
use crate::gic::{self, *};
use crate::its::{self, Its};
use crate::platform::Platform;
use crate::println;
use crate::{cpu_on, psci, CMD_OFF, CMD_READ_COUNTER, COUNTER_SEEN, MAILBOX, ONLINE, SGI_DOORBELL};
use core::sync::atomic::Ordering;

pub enum Verdict {
    Ok,
    Fail(Msg),
    Skip(Msg),
}

macro_rules! fail {
    ($($a:tt)*) => { return Verdict::Fail(Msg::new(format_args!($($a)*))) };
}
macro_rules! skip {
    ($($a:tt)*) => { return Verdict::Skip(Msg::new(format_args!($($a)*))) };
}

macro_rules! tryv {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(m) => fail!("{}", m),
        }
    };
}

#[derive(Default)]
pub struct Tally {
    pub passed: u32,
    pub failed: u32,
    pub skipped: u32,
}

fn report(t: &mut Tally, name: &str, v: Verdict) {
    match v {
        Verdict::Ok => {
            t.passed += 1;
            println!("check {name}: ok");
        }
        Verdict::Fail(m) => {
            t.failed += 1;
            println!("check {name}: FAIL {}", m.as_str());
        }
        Verdict::Skip(m) => {
            t.skipped += 1;
            println!("check {name}: skip {}", m.as_str());
        }
    }
}

pub fn now() -> u64 {
    arch::cntvct()
}

pub fn deadline_ms(ms: u64) -> u64 {
    now() + arch::cntfrq() / 1000 * ms
}

pub fn delay_ms(ms: u64) {
    let until = deadline_ms(ms);
    while now() < until {}
}

/// Waits up to `ms` for `cond`.
fn wait(ms: u64, mut cond: impl FnMut() -> bool) -> bool {
    let until = deadline_ms(ms);
    loop {
        if cond() {
            return true;
        }
        if now() > until {
            return false;
        }
    }
}

/// Waits up to `ms` for `cond`, then `settle` ms more in which it must hold
/// still (an interrupt taken once, not twice).
fn once(ms: u64, settle: u64, cond: impl Fn() -> bool) -> bool {
    wait(ms, &cond) && {
        delay_ms(settle);
        true
    }
}

pub fn run_all(p: &Platform, t: &mut Tally) {
    let second = p.ncpus >= 2;
    report(t, "psci-version", psci_version(p));
    report(t, "psci-cpu-on", if second { cpu_on_check(p, 1) } else { Verdict::Skip(one_cpu()) });
    report(t, "psci-affinity-info", if second { affinity(p, 1, 0) } else { Verdict::Skip(one_cpu()) });
    report(t, "psci-features", psci_features(p));
    report(t, "psci-cpu-on-invalid", cpu_on_invalid(p));
    report(t, "psci-cpu-suspend", cpu_suspend(p));
    let up = second && ONLINE[1].load(Ordering::SeqCst) == 1;
    report(t, "sgi-self", sgi_self(p));
    report(t, "sgi-target-list", sgi_list(p, up));
    report(t, "sgi-broadcast", if up { sgi_broadcast() } else { Verdict::Skip(no_second(second)) });
    report(t, "sgi-icactiver", sgi_icactiver(p));
    report(t, "sgi-pending-while-disabled", sgi_disabled(p));
    report(t, "sgi-ispendr", sgi_ispendr());
    report(t, "sgi-icpendr", sgi_icpendr());
    report(t, "icc-pmr-masks", pmr_masks(p));
    report(t, "sgi-eoimode1-dir", eoimode1(p));
    report(t, "spi-ispendr-route", spi_route(p, up));
    timer_checks(p, t, Timer::Virt, up, second);
    report(t, "counter-cross-cpu", if up { counter_cross_cpu(p) } else { Verdict::Skip(no_second(second)) });
    report(t, "hvc-unknown", unknown_call(false));
    report(t, "smc-unknown", unknown_call(true));
    report(t, "abort-unmapped", abort_unmapped(p));
    report(t, "abort-unmapped-store", abort_store(p));
    report(t, "abort-unmapped-fetch", abort_fetch(p));
    its_checks(p, t, up, second);
    timer_checks(p, t, Timer::Phys, up, second);
    report(t, "debug-breakpoints", breakpoints());
    report(t, "debug-watchpoints", watchpoints());
    report(t, "debug-single-step", single_step());
    report(t, "debug-brk", brk_insn());
    report(t, "pmu-cycle-counter", pmu_cycles());
    report(t, "pmu-event-counter", pmu_events());
    report(t, "pmu-overflow-irq", pmu_overflow(p));
    report(t, "psci-cpu-off", if up { cpu_off(p, 1) } else { Verdict::Skip(no_second(second)) });
    let other = OTHER.load(Ordering::SeqCst);
    report(
        t,
        "no-unexpected-irq",
        if other == 0 {
            Verdict::Ok
        } else {
            Verdict::Fail(Msg::new(format_args!(
                "{other} interrupt(s), last INTID {}",
                OTHER_LAST.load(Ordering::SeqCst)
            )))
        },
    );
}

fn one_cpu() -> Msg {
    Msg::new(format_args!("the DT lists one CPU"))
}

/// Why a check that needs CPU 1 online is skipped.
fn no_second(second: bool) -> Msg {
    if second {
        Msg::new(format_args!("CPU 1 is not online (see psci-cpu-on)"))
    } else {
        one_cpu()
    }
}

fn psci_version(p: &Platform) -> Verdict {
    let v = psci(p, 0x8400_0000, 0, 0, 0);
    if v < 0 {
        fail!("PSCI_VERSION returned {v}");
    }
    println!("info psci-version: {}.{}", v >> 16, v & 0xffff);
    if (v >> 16) < 1 && (v & 0xffff) < 2 {
        fail!("PSCI {}.{} is older than 0.2", v >> 16, v & 0xffff);
    }
    Verdict::Ok
}

fn cpu_on_check(p: &Platform, cpu: usize) -> Verdict {
    let r = cpu_on(p, cpu);
    if r != 0 {
        fail!("CPU_ON returned {r}");
    }
    if !wait(2000, || ONLINE[cpu].load(Ordering::SeqCst) != 0) {
        fail!("CPU {cpu} did not come up within 2 s");
    }
    match ONLINE[cpu].load(Ordering::SeqCst) {
        1 => {}
        s => fail!("CPU {cpu} came up in state {s} (no redistributor?)"),
    }
    let again = cpu_on(p, cpu);
    if again != -4 {
        fail!("CPU_ON of an online CPU returned {again}, not ALREADY_ON (-4)");
    }
    Verdict::Ok
}

/// AFFINITY_INFO of `cpu` must become `want` (0 on, 1 off).
fn affinity(p: &Platform, cpu: usize, want: i64) -> Verdict {
    let mut got = 0;
    if !wait(1000, || {
        got = psci(p, 0xc400_0004, p.mpidr[cpu], 0, 0);
        got == want
    }) {
        fail!("AFFINITY_INFO returned {got}, want {want}");
    }
    Verdict::Ok
}

fn sgi_self(p: &Platform) -> Verdict {
    let before = gic::count(0, 0);
    send_sgi(sgi1r(0, Some(&[p.mpidr[0]])));
    if !once(1000, 20, || gic::count(0, 0) != before) {
        fail!("SGI 0 to self not taken within 1 s");
    }
    let n = gic::count(0, 0) - before;
    if n != 1 {
        fail!("SGI 0 to self taken {n} times");
    }
    Verdict::Ok
}

fn sgi_list(p: &Platform, up: bool) -> Verdict {
    let targets: &[u64] = if up { &p.mpidr[..2] } else { &p.mpidr[..1] };
    if up && (targets[0] ^ targets[1]) & !0xf != 0 {
        skip!("CPUs 0 and 1 are in different target-list groups");
    }
    let before = [gic::count(0, 1), gic::count(1, 1)];
    send_sgi(sgi1r(1, Some(targets)));
    let done = || gic::count(0, 1) != before[0] && (!up || gic::count(1, 1) != before[1]);
    if !once(1000, 20, done) {
        fail!(
            "SGI 1 to the list not taken within 1 s (CPU0 {}, CPU1 {})",
            gic::count(0, 1) - before[0],
            gic::count(1, 1) - before[1]
        );
    }
    let n = [gic::count(0, 1) - before[0], gic::count(1, 1) - before[1]];
    if n[0] != 1 || (up && n[1] != 1) {
        fail!("SGI 1 taken {} times on CPU0, {} on CPU1", n[0], n[1]);
    }
    Verdict::Ok
}

fn sgi_broadcast() -> Verdict {
    let before = [gic::count(0, 2), gic::count(1, 2)];
    send_sgi(sgi1r(2, None));
    if !once(1000, 20, || gic::count(1, 2) != before[1]) {
        fail!("SGI 2 to all but self not taken by CPU1 within 1 s");
    }
    let n = [gic::count(0, 2) - before[0], gic::count(1, 2) - before[1]];
    if n != [0, 1] {
        fail!("SGI 2 to all but self taken {} times on self, {} on CPU1", n[0], n[1]);
    }
    Verdict::Ok
}

/// Takes SGI 4 by hand (IRQs masked, ICC_IAR1 polled) so it stays active,
/// clears it with GICR_ICACTIVER0, and checks a second one arrives.
fn sgi_icactiver(p: &Platform) -> Verdict {
    let sgi = sgi_frame(0);
    arch::irq_off();
    let v = (|| {
        let ack = |what: &str| -> Result<u64, Msg> {
            send_sgi(sgi1r(4, Some(&[p.mpidr[0]])));
            let mut iar = 1023;
            wait(1000, || {
                iar = arch::icc_iar1();
                iar & 0xff_ffff != 1023
            });
            if iar & 0xff_ffff != 4 {
                return Err(Msg::new(format_args!("{what}: ICC_IAR1_EL1 read {iar:#x}, want SGI 4")));
            }
            Ok(iar)
        };
        let iar = match ack("first SGI") {
            Ok(i) => i,
            Err(m) => return Verdict::Fail(m),
        };
        let active = sgi.read32(GICR_ISACTIVER0) & 1 << 4 != 0;
        sgi.write32(GICR_ICACTIVER0, 1 << 4);
        let still = sgi.read32(GICR_ISACTIVER0) & 1 << 4 != 0;
        arch::write_icc_eoir1(iar);
        if !active {
            fail!("an acknowledged SGI 4 is not active in GICR_ISACTIVER0");
        }
        if still {
            fail!("SGI 4 still active after GICR_ICACTIVER0");
        }
        match ack("second SGI") {
            Ok(i) => arch::write_icc_eoir1(i),
            Err(m) => return Verdict::Fail(m),
        }
        Verdict::Ok
    })();
    arch::irq_on();
    v
}

fn psci_features(p: &Platform) -> Verdict {
    let on = psci(p, 0x8400_000a, 0xc400_0003, 0, 0);
    if on < 0 {
        fail!("PSCI_FEATURES(CPU_ON_64) returned {on}");
    }
    let unknown = psci(p, 0x8400_000a, 0x8400_00ff, 0, 0);
    if unknown != -1 {
        fail!("PSCI_FEATURES(0x840000ff) returned {unknown}, not NOT_SUPPORTED (-1)");
    }
    Verdict::Ok
}

/// CPU_SUSPEND to standby with IRQs masked returns SUCCESS once the
/// virtual timer (armed 2 ms ahead) is pending; unmasking then takes it.
fn cpu_suspend(p: &Platform) -> Verdict {
    let vt = p.vtimer_intid;
    enable_ppi(vt, true);
    let before = gic::count(0, vt);
    arch::irq_off();
    arch::write_cntv_tval(arch::cntfrq() / 1000 * 2);
    arch::write_cntv_ctl(1);
    let r = psci(p, 0xc400_0001, 0, 0, 0);
    arch::irq_on();
    let taken = once(1000, 20, || gic::count(0, vt) != before);
    arch::write_cntv_ctl(0);
    if r != 0 {
        fail!("CPU_SUSPEND (standby) returned {r}");
    }
    if !taken {
        fail!("the virtual timer that ended the suspend was not taken");
    }
    Verdict::Ok
}

/// CPU_ON of an MPIDR no CPU has: INVALID_PARAMETERS (-2).
fn cpu_on_invalid(p: &Platform) -> Verdict {
    let bogus = 0xfe_00fe_fe00;
    if p.mpidr[..p.ncpus].contains(&bogus) {
        skip!("a CPU has MPIDR {bogus:#x}");
    }
    let r = psci(p, 0xc400_0003, bogus, crate::arch::secondary_entry(), 0);
    if r != -2 {
        fail!("CPU_ON({bogus:#x}) returned {r}, not INVALID_PARAMETERS (-2)");
    }
    Verdict::Ok
}

/// A disabled SGI stays pending (visible in GICR_ISPENDR0) and is taken
/// once when enabled.
fn sgi_disabled(p: &Platform) -> Verdict {
    let sgi = sgi_frame(0);
    sgi.write32(GICR_ICENABLER0, 1 << 7);
    let before = gic::count(0, 7);
    send_sgi(sgi1r(7, Some(&[p.mpidr[0]])));
    delay_ms(20);
    let taken = gic::count(0, 7) - before;
    let pend = pending(7);
    sgi.write32(GICR_ISENABLER0, 1 << 7);
    if taken != 0 {
        fail!("disabled SGI 7 taken {taken} times");
    }
    if !pend {
        fail!("disabled SGI 7 not pending in GICR_ISPENDR0");
    }
    if !once(1000, 20, || gic::count(0, 7) != before) {
        fail!("SGI 7 not taken after GICR_ISENABLER0");
    }
    let n = gic::count(0, 7) - before;
    if n != 1 {
        fail!("SGI 7 taken {n} times after enabling");
    }
    Verdict::Ok
}

/// GICR_ISPENDR0 pends an SGI from software: taken once.
fn sgi_ispendr() -> Verdict {
    let before = gic::count(0, 6);
    sgi_frame(0).write32(GICR_ISPENDR0, 1 << 6);
    if !once(1000, 20, || gic::count(0, 6) != before) {
        fail!("SGI 6 pended through GICR_ISPENDR0 not taken within 1 s");
    }
    let n = gic::count(0, 6) - before;
    if n != 1 {
        fail!("SGI 6 taken {n} times");
    }
    Verdict::Ok
}

/// GICR_ICPENDR0 removes a pending SGI before it is taken.
fn sgi_icpendr() -> Verdict {
    let sgi = sgi_frame(0);
    let before = gic::count(0, 8);
    arch::irq_off();
    sgi.write32(GICR_ISPENDR0, 1 << 8);
    let was = pending(8);
    sgi.write32(GICR_ICPENDR0, 1 << 8);
    let still = pending(8);
    arch::irq_on();
    delay_ms(20);
    if !was {
        fail!("SGI 8 not pending after GICR_ISPENDR0");
    }
    if still {
        fail!("SGI 8 still pending after GICR_ICPENDR0");
    }
    let n = gic::count(0, 8) - before;
    if n != 0 {
        fail!("SGI 8 taken {n} times after GICR_ICPENDR0 cleared it");
    }
    Verdict::Ok
}

/// ICC_PMR_EL1 below the SGI's priority (0xa0) holds it back; raising it
/// lets it through once.
fn pmr_masks(p: &Platform) -> Verdict {
    let before = gic::count(0, 5);
    arch::write_icc_pmr(0x80);
    send_sgi(sgi1r(5, Some(&[p.mpidr[0]])));
    delay_ms(20);
    let early = gic::count(0, 5) - before;
    arch::write_icc_pmr(0xff);
    if early != 0 {
        fail!("SGI 5 (priority 0xa0) taken {early} times with ICC_PMR_EL1 = 0x80");
    }
    if !once(1000, 20, || gic::count(0, 5) != before) {
        fail!("SGI 5 not taken after ICC_PMR_EL1 = 0xff");
    }
    let n = gic::count(0, 5) - before;
    if n != 1 {
        fail!("SGI 5 taken {n} times");
    }
    Verdict::Ok
}

/// ICC_CTLR_EL1.EOImode = 1: EOIR only drops the priority (the SGI stays
/// active), ICC_DIR_EL1 deactivates it.
fn eoimode1(p: &Platform) -> Verdict {
    let sgi = sgi_frame(0);
    arch::irq_off();
    arch::write_icc_ctlr(arch::icc_ctlr() | 1 << 1);
    let v = (|| {
        send_sgi(sgi1r(10, Some(&[p.mpidr[0]])));
        let mut iar = 1023;
        wait(1000, || {
            iar = arch::icc_iar1();
            iar & 0xff_ffff != 1023
        });
        if iar & 0xff_ffff != 10 {
            fail!("ICC_IAR1_EL1 read {iar:#x}, want SGI 10");
        }
        arch::write_icc_eoir1(iar);
        let after_eoi = sgi.read32(GICR_ISACTIVER0) & 1 << 10 != 0;
        arch::write_icc_dir(iar);
        let after_dir = sgi.read32(GICR_ISACTIVER0) & 1 << 10 != 0;
        if !after_eoi {
            fail!("with EOImode = 1, SGI 10 is not active after ICC_EOIR1_EL1");
        }
        if after_dir {
            fail!("SGI 10 still active after ICC_DIR_EL1");
        }
        Verdict::Ok
    })();
    arch::write_icc_ctlr(arch::icc_ctlr() & !(1 << 1));
    arch::irq_on();
    v
}

/// A store past RAM: a data abort with WnR set and FAR the address.
fn abort_store(p: &Platform) -> Verdict {
    let addr = p.ram_end() + 0x40;
    // SAFETY: as abort_unmapped: the store is expected to fault.
    let probe = unsafe { crate::mmio::Mmio::new(addr as usize) };
    let (_, f) = guarded(|| probe.write32(0, 0x5a5a_5a5a));
    if f.count != 1 {
        fail!("a store to {addr:#x} (past RAM) took {} exceptions, want 1", f.count);
    }
    if f.ec() != exc::EC_DABT_CUR {
        fail!("ESR {:#x}: EC {:#x}, not a data abort from EL1 (0x25)", f.esr, f.ec());
    }
    let dfsc = f.esr & 0x3f;
    if !(0x04..=0x07).contains(&dfsc) && dfsc != 0x10 {
        fail!("DFSC {dfsc:#x} is neither a translation fault nor an external abort");
    }
    if f.esr & 1 << 6 == 0 {
        fail!("ESR {:#x}: WnR clear for a store", f.esr);
    }
    if f.esr & 1 << 10 != 0 || f.far != addr {
        fail!("FAR {:#x} (FnV {}), want {addr:#x}", f.far, (f.esr >> 10) & 1);
    }
    Verdict::Ok
}

/// A branch past RAM: an instruction abort at EL1 (EC 0x21), FAR the address.
fn abort_fetch(p: &Platform) -> Verdict {
    let addr = p.ram_end() + 0x1000;
    let (_, f) = guarded(|| arch::call_addr(addr));
    if f.count != 1 {
        fail!("a branch to {addr:#x} (past RAM) took {} exceptions, want 1", f.count);
    }
    if f.ec() != exc::EC_IABT_CUR {
        fail!("ESR {:#x}: EC {:#x}, not an instruction abort from EL1 (0x21)", f.esr, f.ec());
    }
    let ifsc = f.esr & 0x3f;
    if !(0x04..=0x07).contains(&ifsc) && ifsc != 0x10 {
        fail!("IFSC {ifsc:#x} is neither a translation fault nor an external abort");
    }
    if f.far != addr {
        fail!("FAR {:#x}, want {addr:#x}", f.far);
    }
    Verdict::Ok
}

/// Collection 1 on CPU 1: an event mapped there is taken by CPU 1; MOVI
/// to collection 0 moves it to CPU 0.
fn its_movi(its: &Its) -> Verdict {
    let lpi = LPI_BASE + 2;
    let rd1 = its.lpis_on(1);
    its::set_prop(lpi, its::PROP_ON);
    tryv!(its.send_all(its::mapc(1, rd1)));
    tryv!(its.send_all(its::mapti(DEV, 2, lpi as u64, 1)));
    tryv!(its.send_all(its::inv(DEV, 2)));
    let before = gic::lpi_count(lpi);
    tryv!(its.send_all(its::int(DEV, 2)));
    if let Err(m) = lpi_once(lpi, before) {
        fail!("to collection 1: {}", m.as_str());
    }
    if gic::lpi_cpu(lpi) != 1 {
        fail!("LPI {lpi} mapped to CPU 1's collection taken by CPU {}", gic::lpi_cpu(lpi));
    }
    tryv!(its.send_all(its::movi(DEV, 2, ICID)));
    tryv!(its.send_all(its::sync(rd1)));
    let before = gic::lpi_count(lpi);
    tryv!(its.send_all(its::int(DEV, 2)));
    if let Err(m) = lpi_once(lpi, before) {
        fail!("after MOVI: {}", m.as_str());
    }
    if gic::lpi_cpu(lpi) != 0 {
        fail!("LPI {lpi} moved to CPU 0's collection taken by CPU {}", gic::lpi_cpu(lpi));
    }
    Verdict::Ok
}

/// The two EL1 timers: the virtual one (CNTV_*) and the physical one
/// (CNTP_*, which a hypervisor must emulate or pass through).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    Virt,
    Phys,
}

impl Timer {
    pub fn intid(self, p: &Platform) -> u32 {
        match self {
            Timer::Virt => p.vtimer_intid,
            Timer::Phys => p.ptimer_intid,
        }
    }
    fn prefix(self) -> &'static str {
        match self {
            Timer::Virt => "vtimer",
            Timer::Phys => "ptimer",
        }
    }
    fn reg(self) -> &'static str {
        match self {
            Timer::Virt => "CNTV",
            Timer::Phys => "CNTP",
        }
    }
    pub fn count(self) -> u64 {
        match self {
            Timer::Virt => arch::cntvct(),
            Timer::Phys => arch::cntpct(),
        }
    }
    pub fn ctl(self) -> u64 {
        match self {
            Timer::Virt => arch::cntv_ctl(),
            Timer::Phys => arch::cntp_ctl(),
        }
    }
    pub fn set_ctl(self, v: u64) {
        match self {
            Timer::Virt => arch::write_cntv_ctl(v),
            Timer::Phys => arch::write_cntp_ctl(v),
        }
    }
    pub fn set_cval(self, v: u64) {
        match self {
            Timer::Virt => arch::write_cntv_cval(v),
            Timer::Phys => arch::write_cntp_cval(v),
        }
    }
    pub fn set_tval(self, v: u64) {
        match self {
            Timer::Virt => arch::write_cntv_tval(v),
            Timer::Phys => arch::write_cntp_tval(v),
        }
    }
    /// Counter ticks in `ms` milliseconds.
    fn ticks(ms: u64) -> u64 {
        arch::cntfrq() / 1000 * ms
    }
}

const CTL_ENABLE: u64 = 1;
const CTL_IMASK: u64 = 1 << 1;
const CTL_ISTATUS: u64 = 1 << 2;

fn timer_checks(p: &Platform, t: &mut Tally, tm: Timer, up: bool, second: bool) {
    type Check = fn(&Platform, Timer) -> Verdict;
    let checks: [(&str, Check); 7] = [
        ("fires", timer_fires),
        ("level-ctl", |p, tm| timer_level(p, tm, false)),
        ("level-cval", |p, tm| timer_level(p, tm, true)),
        ("no-stale", timer_no_stale),
        ("imask", timer_imask),
        ("tval-wfi", timer_tval_wfi),
        ("secondary", timer_secondary),
    ];
    let (_, f) = guarded(|| tm.ctl());
    for (name, check) in checks {
        let full = Msg::new(format_args!("{}-{name}", tm.prefix()));
        let v = if f.count > 0 {
            Verdict::Fail(Msg::new(format_args!("{}_CTL_EL0 access raised an exception (ESR {:#x})", tm.reg(), f.esr)))
        } else if name == "secondary" && !up {
            Verdict::Skip(no_second(second))
        } else {
            check(p, tm)
        };
        report(t, full.as_str(), v);
    }
}

fn enable_ppi(intid: u32, on: bool) {
    let sgi = sgi_frame(0);
    sgi.write32(if on { GICR_ISENABLER0 } else { GICR_ICENABLER0 }, 1 << intid);
}

fn pending(intid: u32) -> bool {
    sgi_frame(0).read32(GICR_ISPENDR0) & 1 << intid != 0
}

/// The timer fires once, 1 ms after arming (the handler turns it off).
fn timer_fires(p: &Platform, tm: Timer) -> Verdict {
    let intid = tm.intid(p);
    let before = gic::count(0, intid);
    enable_ppi(intid, true);
    tm.set_cval(tm.count() + Timer::ticks(1));
    tm.set_ctl(CTL_ENABLE);
    if !once(1000, 20, || gic::count(0, intid) != before) {
        tm.set_ctl(0);
        fail!("INTID {intid} not taken within 1 s");
    }
    let n = gic::count(0, intid) - before;
    if n != 1 {
        fail!("INTID {intid} taken {n} times");
    }
    Verdict::Ok
}

/// With the PPI disabled: due → pending in GICR_ISPENDR0; then CTL = 0
/// (or, with `cval`, CVAL in the future) → no longer pending.
fn timer_level(p: &Platform, tm: Timer, cval: bool) -> Verdict {
    let intid = tm.intid(p);
    enable_ppi(intid, false);
    sgi_frame(0).write32(GICR_ICPENDR0, 1 << intid);
    tm.set_cval(tm.count());
    tm.set_ctl(CTL_ENABLE);
    if !wait(1000, || pending(intid)) {
        tm.set_ctl(0);
        fail!("enabled and due with the PPI disabled, not pending in GICR_ISPENDR0");
    }
    if cval {
        tm.set_cval(tm.count() + Timer::ticks(100_000));
    } else {
        tm.set_ctl(0);
    }
    let gone = wait(1000, || !pending(intid));
    tm.set_ctl(0);
    if !gone {
        if cval {
            fail!("still pending after {}_CVAL moved 100 s ahead", tm.reg());
        }
        fail!("still pending after {}_CTL = 0", tm.reg());
    }
    Verdict::Ok
}

/// After the level checks (timer off, PPI disabled), enabling the PPI
/// delivers nothing.
fn timer_no_stale(p: &Platform, tm: Timer) -> Verdict {
    let intid = tm.intid(p);
    tm.set_ctl(0);
    let before = gic::count(0, intid);
    enable_ppi(intid, true);
    delay_ms(30);
    let n = gic::count(0, intid) - before;
    if n != 0 {
        fail!("a stale timer interrupt was taken {n} time(s) after re-enabling the PPI");
    }
    Verdict::Ok
}

/// CTL.IMASK holds a due timer's interrupt back (ISTATUS still reads 1);
/// clearing IMASK delivers it once.
fn timer_imask(p: &Platform, tm: Timer) -> Verdict {
    let intid = tm.intid(p);
    enable_ppi(intid, true);
    let before = gic::count(0, intid);
    tm.set_cval(tm.count());
    tm.set_ctl(CTL_ENABLE | CTL_IMASK);
    delay_ms(20);
    let early = gic::count(0, intid) - before;
    let ctl = tm.ctl();
    if early != 0 {
        tm.set_ctl(0);
        fail!("taken {early} times with {}_CTL.IMASK set", tm.reg());
    }
    if ctl & CTL_ISTATUS == 0 {
        tm.set_ctl(0);
        fail!("{}_CTL.ISTATUS reads 0 for a due timer ({ctl:#x})", tm.reg());
    }
    tm.set_ctl(CTL_ENABLE);
    if !once(1000, 20, || gic::count(0, intid) != before) {
        tm.set_ctl(0);
        fail!("not taken within 1 s of clearing IMASK");
    }
    let n = gic::count(0, intid) - before;
    if n != 1 {
        fail!("taken {n} times after clearing IMASK");
    }
    Verdict::Ok
}

fn timer_tval_wfi(p: &Platform, tm: Timer) -> Verdict {
    let intid = tm.intid(p);
    enable_ppi(intid, true);
    let before = gic::count(0, intid);
    tm.set_tval(Timer::ticks(2));
    tm.set_ctl(CTL_ENABLE);
    let until = deadline_ms(1000);
    let mut wakes = 0;
    while gic::count(0, intid) == before {
        if now() > until {
            tm.set_ctl(0);
            fail!("no interrupt within 1 s of TVAL = 2 ms ({wakes} WFI wakeups)");
        }
        arch::wfi();
        wakes += 1;
    }
    Verdict::Ok
}

/// The UART's SPI (its device interrupts all masked, so its line is low),
/// pended from software with GICD_ISPENDR: taken once by the CPU its
/// GICD_IROUTER names, CPU 0 and then CPU 1.
fn spi_route(p: &Platform, up: bool) -> Verdict {
    let Some(intid) = p.uart_intid.filter(|&i| (32..COUNTED as u32).contains(&i)) else {
        skip!("no UART SPI below INTID {COUNTED} in the DT");
    };
    let d = gicd(p);
    let (word, bit) = (4 * (intid as usize / 32), 1u32 << (intid % 32));
    d.write32(GICD_IGROUPR + word, d.read32(GICD_IGROUPR + word) | bit);
    let prio = GICD_IPRIORITYR + (intid as usize & !3);
    let shift = 8 * (intid % 4);
    d.write32(prio, (d.read32(prio) & !(0xff << shift)) | 0xa0 << shift);
    let route = |mpidr: u64| (mpidr & 0xff_00ff_ffff) & !(1 << 31);
    let targets: &[usize] = if up { &[0, 1] } else { &[0] };
    let mut v = Verdict::Ok;
    for &cpu in targets {
        d.write64(GICD_IROUTER + 8 * intid as usize, route(p.mpidr[cpu]));
        d.write32(GICD_ISENABLER + word, bit);
        let before = gic::count(cpu, intid);
        d.write32(GICD_ISPENDR + word, bit);
        let taken = once(1000, 20, || gic::count(cpu, intid) != before);
        let n = gic::count(cpu, intid) - before;
        d.write32(GICD_ICENABLER + word, bit);
        d.write32(GICD_ICPENDR + word, bit);
        if !taken {
            v = Verdict::Fail(Msg::new(format_args!("SPI {intid} routed to CPU {cpu} not taken there within 1 s")));
            break;
        }
        if n != 1 {
            v = Verdict::Fail(Msg::new(format_args!("SPI {intid} taken {n} times by CPU {cpu}")));
            break;
        }
    }
    d.write64(GICD_IROUTER + 8 * intid as usize, route(p.mpidr[0]));
    v
}

/// CPU 1 arms its own timer and waits in WFI: the timer wakes it (under a
/// hypervisor, a descheduled vCPU's deadline must be kept).
fn timer_secondary(p: &Platform, tm: Timer) -> Verdict {
    let intid = tm.intid(p);
    let before = gic::count(1, intid);
    let cmd = if tm == Timer::Virt { crate::CMD_VTIMER } else { crate::CMD_PTIMER };
    MAILBOX[1].store(cmd, Ordering::SeqCst);
    send_sgi(sgi1r(SGI_DOORBELL, Some(&[p.mpidr[1]])));
    if !once(1000, 20, || gic::count(1, intid) != before) {
        fail!("CPU 1's timer (2 ms) not taken within 1 s");
    }
    let n = gic::count(1, intid) - before;
    if n != 1 {
        fail!("CPU 1's timer taken {n} times");
    }
    Verdict::Ok
}

/// CNTVCT_EL0 read on CPU 1 between two reads on CPU 0 lies between them
/// (the CPUs share one virtual counter), ten times.
fn counter_cross_cpu(p: &Platform) -> Verdict {
    for i in 0..10 {
        COUNTER_SEEN.store(0, Ordering::SeqCst);
        let t0 = arch::cntvct();
        MAILBOX[1].store(CMD_READ_COUNTER, Ordering::SeqCst);
        send_sgi(sgi1r(SGI_DOORBELL, Some(&[p.mpidr[1]])));
        if !wait(1000, || COUNTER_SEEN.load(Ordering::SeqCst) != 0) {
            fail!("CPU 1 did not answer within 1 s");
        }
        let t2 = arch::cntvct();
        let t1 = COUNTER_SEEN.load(Ordering::SeqCst);
        if !(t0 <= t1 && t1 <= t2) {
            fail!("round {i}: CPU 0 read {t0} and {t2}, CPU 1 in between read {t1}");
        }
    }
    Verdict::Ok
}

/// An SMCCC function no one implements (the vendor-hypervisor range, last
/// function) must return NOT_SUPPORTED.
fn unknown_call(smc: bool) -> Verdict {
    let fid = 0xc600_fffe;
    let (r, f) = guarded(|| arch::smccc(smc, fid, 0, 0, 0));
    let pfr0 = arch::id_aa64pfr0();
    let (el2, el3) = ((pfr0 >> 8) & 0xf != 0, (pfr0 >> 12) & 0xf != 0);
    let insn = if smc { "SMC" } else { "HVC" };
    if f.count > 0 {
        let undefined = f.ec() == exc::EC_UNKNOWN;
        if undefined && !el2 && (!smc || !el3) {
            skip!("{insn} is UNDEFINED here (no EL2{})", if smc { " or EL3" } else { "" });
        }
        fail!("{insn} {fid:#x} raised an exception (ESR {:#x})", f.esr);
    }
    if r as i64 != -1 {
        fail!("{insn} {fid:#x} returned {:#x}, not NOT_SUPPORTED (-1)", r);
    }
    Verdict::Ok
}

/// A load from the first address past RAM: a data abort at EL1 (EC 0x25)
/// with a translation fault or a synchronous external abort, FAR valid and
/// equal to the address.
fn abort_unmapped(p: &Platform) -> Verdict {
    let addr = p.ram_end();
    // SAFETY: the load is expected to fault, and `guarded` skips it; the
    // address is in this guest's stage-1 map (a plain `ldr`, so a
    // hypervisor sees a full syndrome).
    let probe = unsafe { crate::mmio::Mmio::new(addr as usize) };
    let (_, f) = guarded(|| probe.read32(0));
    if f.count != 1 {
        fail!("a load from {addr:#x} (past RAM) took {} exceptions, want 1", f.count);
    }
    let dfsc = f.esr & 0x3f;
    println!("info abort-unmapped: ESR {:#x} FAR {:#x} DFSC {dfsc:#x}", f.esr, f.far);
    if f.ec() != exc::EC_DABT_CUR {
        fail!("ESR {:#x}: EC {:#x}, not a data abort from EL1 (0x25)", f.esr, f.ec());
    }
    if !(0x04..=0x07).contains(&dfsc) && dfsc != 0x10 {
        fail!("DFSC {dfsc:#x} is neither a translation fault nor an external abort");
    }
    if f.esr & 1 << 10 != 0 {
        fail!("ESR.FnV set: FAR not valid");
    }
    if f.far != addr {
        fail!("FAR {:#x}, want {addr:#x}", f.far);
    }
    if f.esr & 1 << 6 != 0 {
        fail!("ESR.WnR set for a load");
    }
    Verdict::Ok
}

const DEV: u64 = 1;
const ICID: u64 = 0;

fn its_checks(p: &Platform, t: &mut Tally, up: bool, second: bool) {
    const NAMES: [&str; 8] = [
        "its-baser-reset",
        "its-mapti-int",
        "its-movi",
        "its-inv",
        "its-invall",
        "its-clear",
        "its-5000-int",
        "its-discard",
    ];
    let Some(base) = p.its else {
        for n in NAMES {
            report(t, n, Verdict::Skip(Msg::new(format_args!("no ITS in the DT"))));
        }
        return;
    };
    let typer = gicd(p).read32(GICD_TYPER);
    if typer & 1 << 17 == 0 {
        for n in NAMES {
            report(t, n, Verdict::Fail(Msg::new(format_args!("the DT has an ITS but GICD_TYPER.LPIS is 0"))));
        }
        return;
    }
    report(t, NAMES[0], baser_reset(base));
    let its = match Its::init(base) {
        Ok(i) => i,
        Err(e) => {
            for n in &NAMES[1..] {
                report(t, n, Verdict::Fail(Msg::new(format_args!("ITS setup: {e}"))));
            }
            return;
        }
    };
    report(t, NAMES[1], its_mapti(&its));
    report(t, NAMES[2], if up { its_movi(&its) } else { Verdict::Skip(no_second(second)) });
    report(t, NAMES[3], its_inv(&its, false));
    report(t, NAMES[4], its_inv(&its, true));
    report(t, NAMES[5], its_clear(&its));
    report(t, NAMES[6], its_many(&its));
    report(t, NAMES[7], its_discard(&its));
}

fn baser_reset(base: u64) -> Verdict {
    // SAFETY: the DT's ITS frame.
    let regs = unsafe { crate::mmio::Mmio::new(base as usize) };
    let mut seen = 0;
    for i in 0..8 {
        let b = regs.read64(its::GITS_BASER + 8 * i);
        let ty = (b >> 56) & 7;
        if ty == 0 {
            continue;
        }
        seen += 1;
        let ps = (b >> 8) & 3;
        if ps != 2 {
            fail!("GITS_BASER{i} (type {ty}) resets with Page_Size {} bytes, not 64K", its::page_bytes(ps));
        }
        if b >> 63 != 0 {
            fail!("GITS_BASER{i} is Valid at reset");
        }
    }
    if seen == 0 {
        fail!("no GITS_BASER names a table type");
    }
    Verdict::Ok
}

fn lpi_once(intid: u32, before: u32) -> Result<(), Msg> {
    if !once(1000, 10, || gic::lpi_count(intid) != before) {
        return Err(Msg::new(format_args!("LPI {intid} not taken within 1 s")));
    }
    let n = gic::lpi_count(intid) - before;
    if n != 1 {
        return Err(Msg::new(format_args!("LPI {intid} taken {n} times")));
    }
    Ok(())
}

fn its_mapti(its: &Its) -> Verdict {
    let lpi = LPI_BASE;
    its::set_prop(lpi, its::PROP_ON);
    tryv!(its.send_all(its::mapd(DEV, 4, its.itt_addr())));
    tryv!(its.send_all(its::mapc(ICID, its.rdbase)));
    tryv!(its.send_all(its::invall(ICID)));
    tryv!(its.send_all(its::mapti(DEV, 0, lpi as u64, ICID)));
    tryv!(its.send_all(its::mapti(DEV, 1, lpi as u64 + 1, ICID)));
    tryv!(its.send_all(its::inv(DEV, 0)));
    tryv!(its.send_all(its::sync(its.rdbase)));
    let before = gic::lpi_count(lpi);
    tryv!(its.send_all(its::int(DEV, 0)));
    if let Err(m) = lpi_once(lpi, before) {
        fail!("MAPD/MAPC/MAPTI + INT: {}", m.as_str());
    }
    Verdict::Ok
}

/// Disables the LPI in its configuration byte, makes the ITS read it (INV,
/// or INVALL), sends INT (nothing must arrive), enables it again: the
/// pending LPI arrives once.
fn its_inv(its: &Its, all: bool) -> Verdict {
    let lpi = LPI_BASE;
    let reload = |its: &Its| its.send_all(if all { its::invall(ICID) } else { its::inv(DEV, 0) });
    its::set_prop(lpi, its::PROP_OFF);
    tryv!(reload(its));
    let before = gic::lpi_count(lpi);
    tryv!(its.send_all(its::int(DEV, 0)));
    delay_ms(20);
    if gic::lpi_count(lpi) != before {
        fail!("LPI {lpi} taken while disabled in its configuration");
    }
    its::set_prop(lpi, its::PROP_ON);
    tryv!(reload(its));
    if let Err(m) = lpi_once(lpi, before) {
        fail!("after re-enabling: {}", m.as_str());
    }
    Verdict::Ok
}

/// CLEAR removes the pending state an INT set on a disabled LPI: enabling
/// it then delivers nothing; a new INT still does.
fn its_clear(its: &Its) -> Verdict {
    let lpi = LPI_BASE;
    its::set_prop(lpi, its::PROP_OFF);
    tryv!(its.send_all(its::inv(DEV, 0)));
    let before = gic::lpi_count(lpi);
    tryv!(its.send_all(its::int(DEV, 0)));
    tryv!(its.send_all(its::clear(DEV, 0)));
    its::set_prop(lpi, its::PROP_ON);
    tryv!(its.send_all(its::inv(DEV, 0)));
    delay_ms(20);
    let n = gic::lpi_count(lpi) - before;
    if n != 0 {
        fail!("LPI {lpi} taken {n} times after CLEAR");
    }
    tryv!(its.send_all(its::int(DEV, 0)));
    if let Err(m) = lpi_once(lpi, before) {
        fail!("INT after CLEAR: {}", m.as_str());
    }
    Verdict::Ok
}

/// 5 000 INTs, one at a time, through the 64 KiB queue (it wraps twice):
/// each written as DW0 and DW1's low word only, over whatever the slot held
/// (earlier commands' fields in its RES0 bits).
fn its_many(its: &Its) -> Verdict {
    let lpi = LPI_BASE + 1;
    its::set_prop(lpi, its::PROP_ON);
    tryv!(its.send_all(its::inv(DEV, 1)));
    let start = gic::lpi_count(lpi);
    for i in 0..5000u32 {
        let before = gic::lpi_count(lpi);
        if let Err(e) = its.send_reusing(its::int(DEV, 1)[0], 1) {
            fail!("INT {i}: {e}");
        }
        if !wait(1000, || gic::lpi_count(lpi) != before) {
            fail!("INT {i} of 5000: LPI {lpi} not taken within 1 s ({} taken)", gic::lpi_count(lpi) - start);
        }
    }
    delay_ms(10);
    let n = gic::lpi_count(lpi) - start;
    if n != 5000 {
        fail!("5000 INTs gave {n} LPIs");
    }
    Verdict::Ok
}

fn its_discard(its: &Its) -> Verdict {
    let lpi = LPI_BASE;
    tryv!(its.send_all(its::discard(DEV, 0)));
    let before = gic::lpi_count(lpi);
    if let Err(e) = its.send_all(its::int(DEV, 0)) {
        fail!("INT after DISCARD: {e}");
    }
    delay_ms(20);
    if gic::lpi_count(lpi) != before {
        fail!("LPI {lpi} taken after its event was discarded");
    }
    // The queue still works for the event left mapped.
    let b1 = gic::lpi_count(lpi + 1);
    tryv!(its.send_all(its::int(DEV, 1)));
    if let Err(m) = lpi_once(lpi + 1, b1) {
        fail!("after DISCARD, another event: {}", m.as_str());
    }
    Verdict::Ok
}

/// Breakpoint target: never inlined, so its address is a real instruction.
#[inline(never)]
extern "C" fn bp_target(x: u64) -> u64 {
    x.wrapping_mul(3) ^ 0x5a
}

static WATCHED: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(7);

fn debug_setup() -> (usize, usize) {
    let dfr0 = arch::id_aa64dfr0();
    let brps = ((dfr0 >> 12) & 0xf) as usize + 1;
    let wrps = ((dfr0 >> 20) & 0xf) as usize + 1;
    arch::write_oslar(0);
    arch::write_mdscr(arch::mdscr() | 1 << 15 | 1 << 13);
    (brps, wrps)
}

fn breakpoints() -> Verdict {
    let ((brps, _), f) = guarded(debug_setup);
    if f.count > 0 {
        fail!("debug setup (OSLAR/MDSCR) raised an exception (ESR {:#x})", f.esr);
    }
    let mdscr = arch::mdscr();
    if mdscr & 1 << 15 == 0 {
        println!("info debug: MDSCR_EL1.MDE reads 0 after being set ({mdscr:#x})");
    }
    let addr = bp_target as *const () as u64;
    let mut missed = 0u64;
    for slot in 0..brps {
        exc::ARMED_SLOT.store(slot, Ordering::SeqCst);
        let before = exc::BRK_HITS.load(Ordering::SeqCst);
        let (_, f) = guarded(|| {
            arch::write_dbgbvr(slot, addr);
            arch::write_dbgbcr(slot, 0xf << 5 | 0b11 << 1 | 1);
            arch::debug_on();
            // Through an opaque pointer: a direct call to a function the
            // compiler sees touching no memory may be moved across the
            // `asm!` that arms the breakpoint (it does at opt-level 3).
            let target: extern "C" fn(u64) -> u64 = core::hint::black_box(bp_target);
            let r = target(slot as u64);
            arch::debug_off();
            arch::write_dbgbcr(slot, 0);
            core::hint::black_box(r);
        });
        if f.count > 0 {
            fail!("breakpoint slot {slot}: register access raised an exception (ESR {:#x})", f.esr);
        }
        if exc::BRK_HITS.load(Ordering::SeqCst) != before + 1 {
            missed |= 1 << slot;
        }
    }
    if missed != 0 {
        fail!("{} of {brps} advertised breakpoints did not fire (slots mask {missed:#x})", missed.count_ones());
    }
    Verdict::Ok
}

fn watchpoints() -> Verdict {
    let ((_, wrps), f) = guarded(debug_setup);
    if f.count > 0 {
        fail!("debug setup (OSLAR/MDSCR) raised an exception (ESR {:#x})", f.esr);
    }
    let addr = &WATCHED as *const _ as u64;
    let mut missed = 0u64;
    for slot in 0..wrps {
        exc::ARMED_SLOT.store(slot, Ordering::SeqCst);
        let before = exc::WATCH_HITS.load(Ordering::SeqCst);
        let (_, f) = guarded(|| {
            arch::write_dbgwvr(slot, addr);
            arch::write_dbgwcr(slot, 0xff << 5 | 0b11 << 3 | 0b11 << 1 | 1);
            arch::debug_on();
            let v = WATCHED.load(Ordering::SeqCst);
            arch::debug_off();
            arch::write_dbgwcr(slot, 0);
            core::hint::black_box(v);
        });
        if f.count > 0 {
            fail!("watchpoint slot {slot}: register access raised an exception (ESR {:#x})", f.esr);
        }
        if exc::WATCH_HITS.load(Ordering::SeqCst) != before + 1 {
            missed |= 1 << slot;
        } else if exc::FAR.load(Ordering::SeqCst) != addr {
            fail!("watchpoint slot {slot}: FAR {:#x}, want {addr:#x}", exc::FAR.load(Ordering::SeqCst));
        }
    }
    if missed != 0 {
        fail!("{} of {wrps} advertised watchpoints did not fire (slots mask {missed:#x})", missed.count_ones());
    }
    Verdict::Ok
}

fn single_step() -> Verdict {
    let (_, f) = guarded(debug_setup);
    if f.count > 0 {
        fail!("debug setup (OSLAR/MDSCR) raised an exception (ESR {:#x})", f.esr);
    }
    let before = exc::STEP_HITS.load(Ordering::SeqCst);
    arch::irq_off();
    let (want, f) = guarded(arch::single_step);
    arch::write_mdscr(arch::mdscr() & !1);
    arch::irq_on();
    if f.count > 0 {
        fail!("single step raised an exception (ESR {:#x})", f.esr);
    }
    let hits = exc::STEP_HITS.load(Ordering::SeqCst) - before;
    if hits != 1 {
        fail!("{hits} software-step exceptions, want 1");
    }
    let elr = exc::ELR.load(Ordering::SeqCst);
    if elr != want {
        fail!("step exception at {elr:#x}, want {want:#x}");
    }
    Verdict::Ok
}

/// BRK at EL1 is taken at EL1 (EC 0x3c) with its immediate in the ISS.
fn brk_insn() -> Verdict {
    let (_, f) = guarded(arch::brk);
    if f.count != 1 {
        fail!("BRK took {} exceptions, want 1", f.count);
    }
    if f.ec() != exc::EC_BRK_INSN || f.esr & 0xffff != 0x42 {
        fail!("ESR {:#x}, want EC 0x3c with comment 0x42", f.esr);
    }
    Verdict::Ok
}

fn pmu_present() -> Result<(), Msg> {
    let v = (arch::id_aa64dfr0() >> 8) & 0xf;
    if v == 0 || v == 0xf {
        return Err(Msg::new(format_args!("no PMUv3 advertised (ID_AA64DFR0_EL1.PMUVer = {v:#x})")));
    }
    Ok(())
}

fn pmu_cycles() -> Verdict {
    tryv!(pmu_present());
    let ((a, b), f) = guarded(|| {
        arch::write_pmccfiltr(0);
        arch::write_pmcr(arch::pmcr() | 1 | 1 << 2);
        arch::write_pmcntenset(1 << 31);
        let a = arch::pmccntr();
        delay_ms(2);
        let b = arch::pmccntr();
        arch::write_pmcntenclr(1 << 31);
        (a, b)
    });
    if f.count > 0 {
        fail!("PMU register access raised an exception (ESR {:#x})", f.esr);
    }
    if b <= a {
        fail!("PMCCNTR_EL0 did not advance ({a} → {b})");
    }
    Verdict::Ok
}

fn pmu_events() -> Verdict {
    tryv!(pmu_present());
    let (n, f) = guarded(|| {
        arch::write_pmcr(arch::pmcr() | 1);
        arch::write_pmevtyper0(0); // SW_INCR
        arch::write_pmevcntr0(0);
        arch::write_pmcntenset(1);
        for _ in 0..10 {
            arch::write_pmswinc(1);
        }
        let n = arch::pmevcntr0();
        arch::write_pmcntenclr(1);
        n
    });
    if f.count > 0 {
        fail!("PMU register access raised an exception (ESR {:#x})", f.esr);
    }
    if n != 10 {
        fail!("event counter 0 counting SW_INCR reads {n} after 10 increments");
    }
    Verdict::Ok
}

fn pmu_overflow(p: &Platform) -> Verdict {
    tryv!(pmu_present());
    let Some(intid) = p.pmu_intid else { fail!("PMUv3 advertised but the DT has no arm,armv8-pmuv3 interrupt") };
    let before = gic::count(0, intid);
    enable_ppi(intid, true);
    let (_, f) = guarded(|| {
        arch::write_pmcr(arch::pmcr() | 1);
        arch::write_pmevtyper0(0);
        arch::write_pmevcntr0(0xffff_ffff);
        arch::write_pmovsclr(u32::MAX as u64);
        arch::write_pmintenset(1);
        arch::write_pmcntenset(1);
        arch::write_pmswinc(1);
    });
    if f.count > 0 {
        fail!("PMU register access raised an exception (ESR {:#x})", f.esr);
    }
    let ok = once(1000, 10, || gic::count(0, intid) != before);
    arch::write_pmcntenclr(1);
    if !ok {
        fail!("no overflow interrupt (INTID {intid}) within 1 s");
    }
    let n = gic::count(0, intid) - before;
    if n != 1 {
        fail!("overflow interrupt taken {n} times");
    }
    Verdict::Ok
}

/// Asks CPU `cpu` to CPU_OFF itself, waits for AFFINITY_INFO to say OFF,
/// then CPU_ON brings it back.
fn cpu_off(p: &Platform, cpu: usize) -> Verdict {
    MAILBOX[cpu].store(CMD_OFF, Ordering::SeqCst);
    send_sgi(sgi1r(SGI_DOORBELL, Some(&[p.mpidr[cpu]])));
    if let Verdict::Fail(m) = affinity(p, cpu, 1) {
        fail!("after CPU_OFF: {}", m.as_str());
    }
    if ONLINE[cpu].load(Ordering::SeqCst) == 3 {
        fail!("CPU_OFF returned");
    }
    let r = cpu_on(p, cpu);
    if r != 0 {
        fail!("CPU_ON after CPU_OFF returned {r}");
    }
    if !wait(2000, || ONLINE[cpu].load(Ordering::SeqCst) == 1) {
        fail!("CPU {cpu} did not come back after CPU_OFF + CPU_ON");
    }
    if let Verdict::Fail(m) = affinity(p, cpu, 0) {
        fail!("after CPU_ON again: {}", m.as_str());
    }
    Verdict::Ok
}

impl core::fmt::Display for Msg {
    fn fmt(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}
