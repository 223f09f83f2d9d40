//! The scheduling flight recorder: a fixed-size ring per pCPU of compact
//! scheduler and interrupt events, and its stable text format.
//!
//! Why: cyclictest's max is decided by single scheduling decisions that the
//! counters and histograms of `crate::stats` average away. Like cyclictest's
//! `--breaktrace` with ftrace, the rings are always on, and when a vCPU's
//! wake→schedule-in latency exceeds `sched_trace_threshold_us` the runtime
//! dumps them, so the events that explain the outlier are on the console.
//!
//! Cost: recording is a store of a few words into the pCPU's own ring (each
//! pCPU writes only its own; the runtime's per-ring lock is only contended
//! by a dump copying it), no allocation after [`Ring::new`]; the oldest
//! event is overwritten when the ring is full.
//!
//! Text format, one event per line (parsed back by `xtask::trace`):
//!
//! ```text
//! (HV) trace begin reason=outlier vcpu1 latency_ns=2104000
//! (HV) trace ring pcpu0 events=4096 overwritten=81234 from_t=123000000
//! trace pcpu0 t=123456789 wake vcpu1 cause=timer action=resched pcpu=0
//! trace pcpu0 t=123456900 defer kind=ratelimit until=123500000
//! trace pcpu0 t=123457000 sched_out vcpu0 credit=1234 reason=wake_preempt
//! trace pcpu0 t=123457000 sched_in vcpu1 credit=9000 wake_ns=211
//! trace pcpu0 t=123460000 exit vcpu1 class=wfi
//! trace pcpu0 t=123460100 timer_arm at=123500000
//! trace pcpu0 t=123460200 vtimer_late vcpu1 late_ns=52000
//! trace pcpu0 t=123470000 exit vcpu0 class=irq
//! trace pcpu0 t=123470000 irqs_off vcpu0 pc=0xffff800008123456
//! (HV) trace end
//! ```
//!
//! `vtimer_late` follows the `sched_in` of a vCPU whose virtual timer the
//! hypervisor injected while the vCPU was not running: the switch-in came
//! `late_ns` after the timer's deadline (as armed, i.e. with the slop). That
//! is the hypervisor's part of what cyclictest measures, also when the vCPU
//! was runnable (a no-op wake, no `wake_ns`); the begin line of a dump it
//! triggers says `reason=vtimer vcpuN late_ns=N`.
//!
//! Times are the scheduler's clock (ns). `wake ... action=` is `noop` (the
//! vCPU was not blocked), `none`, `resched pcpu=N` or `rearm pcpu=N at=T`.
//! `sched_in` has `wake_ns=` only when a wake made the vCPU runnable.

use crate::esr::{self, Exit};
use crate::sched::{Decision, Deferral, SwitchReason, VcpuId, WakeAction, WakeCause};
use alloc::vec::Vec;
use core::fmt;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Events each pCPU's ring holds.
pub const RING_EVENTS: usize = 4096;
/// Threshold dumps per boot by default (`sched_trace_max_dumps`); Ctrl-\\ always dumps.
pub const MAX_DUMPS: u32 = 8;

/// What a guest exit was, coarsely.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitClass {
    Irq,
    Wfi,
    Wfe,
    Mmio,
    /// A trapped ICC_SGI1R_EL1 write.
    Sgi,
    Hvc,
    Smc,
    Sysreg,
    Abort,
    SError,
    Other,
}

impl ExitClass {
    /// The class of a decoded synchronous exit.
    pub fn of(e: &Exit) -> Self {
        match e {
            Exit::Wfx { wfe: true, .. } => ExitClass::Wfe,
            Exit::Wfx { wfe: false, .. } => ExitClass::Wfi,
            Exit::Hvc { .. } => ExitClass::Hvc,
            Exit::Smc { .. } => ExitClass::Smc,
            Exit::SysReg(s) if !s.read && s.key() == esr::ICC_SGI1R_EL1 => ExitClass::Sgi,
            Exit::SysReg(_) => ExitClass::Sysreg,
            Exit::Mmio(_) => ExitClass::Mmio,
            Exit::DataAbort { .. } | Exit::InstructionAbort { .. } => ExitClass::Abort,
            Exit::Undefined { .. } | Exit::Unknown { .. } => ExitClass::Other,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ExitClass::Irq => "irq",
            ExitClass::Wfi => "wfi",
            ExitClass::Wfe => "wfe",
            ExitClass::Mmio => "mmio",
            ExitClass::Sgi => "sgi",
            ExitClass::Hvc => "hvc",
            ExitClass::Smc => "smc",
            ExitClass::Sysreg => "sysreg",
            ExitClass::Abort => "abort",
            ExitClass::SError => "serror",
            ExitClass::Other => "other",
        }
    }
}

/// What a wake asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakeOutcome {
    /// The vCPU was not blocked (runnable or running: only a kick).
    Noop,
    /// Blocked, now runnable; it waits for the pCPU's current timer.
    None,
    /// A `schedule()` on that pCPU now.
    Resched { pcpu: u16 },
    /// That pCPU's scheduling timer moved to `at`.
    Rearm { pcpu: u16, at: u64 },
}

/// One recorded event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Wake {
        vcpu: u16,
        cause: WakeCause,
        outcome: WakeOutcome,
    },
    /// A pending switch deferred until `until` (after a wake, or at a
    /// `schedule()` that kept the runner).
    Defer {
        kind: Deferral,
        until: u64,
    },
    /// A kick SGI sent to another pCPU.
    Kick {
        pcpu: u16,
    },
    SchedOut {
        vcpu: u16,
        credit: i64,
        reason: SwitchReason,
    },
    /// `wake_ns` is `u64::MAX` when no wake made the vCPU runnable.
    SchedIn {
        vcpu: u16,
        credit: i64,
        wake_ns: u64,
    },
    /// The pCPU has nothing to run.
    Idle,
    /// The EL2 timer programmed to `at` (`u64::MAX`: stopped).
    TimerArm {
        at: u64,
    },
    TimerFire,
    Exit {
        vcpu: u16,
        class: ExitClass,
    },
    /// At the IRQ exit just recorded, `vcpu` was at EL1 with IRQs masked
    /// (PSTATE.I): a pending virtual interrupt could not be taken. `pc` is
    /// where (the guest's ELR_EL2 at the exit), to look up in the guest's
    /// `/proc/kallsyms`: a run of these at one place is a guest spin loop.
    IrqsOff {
        vcpu: u16,
        pc: u64,
    },
    /// `vcpu` switched in `late_ns` after the deadline of the virtual timer
    /// injected while it was not running.
    TimerWake {
        vcpu: u16,
        late_ns: u64,
    },
}

/// An event and when it happened (ns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub t: u64,
    pub ev: Event,
}

fn cause_name(c: WakeCause) -> &'static str {
    match c {
        WakeCause::Interrupt => "irq",
        WakeCause::Sgi => "sgi",
        WakeCause::Timer => "timer",
        WakeCause::Doorbell => "doorbell",
    }
}

fn deferral_name(d: Deferral) -> &'static str {
    match d {
        Deferral::Ratelimit => "ratelimit",
        Deferral::LhpGrace => "lhp_grace",
        Deferral::MinRun => "min_run",
    }
}

fn reason_name(r: SwitchReason) -> &'static str {
    match r {
        SwitchReason::SliceEnd => "slice_end",
        SwitchReason::WakePreempt => "wake_preempt",
        SwitchReason::Block => "block",
        SwitchReason::Yield => "yield",
        SwitchReason::Off => "off",
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Event::Wake { vcpu, cause, outcome } => {
                write!(f, "wake vcpu{vcpu} cause={} action=", cause_name(cause))?;
                match outcome {
                    WakeOutcome::Noop => write!(f, "noop"),
                    WakeOutcome::None => write!(f, "none"),
                    WakeOutcome::Resched { pcpu } => write!(f, "resched pcpu={pcpu}"),
                    WakeOutcome::Rearm { pcpu, at } => write!(f, "rearm pcpu={pcpu} at={at}"),
                }
            }
            Event::Defer { kind, until } => write!(f, "defer kind={} until={until}", deferral_name(kind)),
            Event::Kick { pcpu } => write!(f, "kick pcpu={pcpu}"),
            Event::SchedOut { vcpu, credit, reason } => {
                write!(f, "sched_out vcpu{vcpu} credit={credit} reason={}", reason_name(reason))
            }
            Event::SchedIn { vcpu, credit, wake_ns } => {
                write!(f, "sched_in vcpu{vcpu} credit={credit}")?;
                if wake_ns != u64::MAX {
                    write!(f, " wake_ns={wake_ns}")?;
                }
                Ok(())
            }
            Event::Idle => write!(f, "idle"),
            Event::TimerArm { at: u64::MAX } => write!(f, "timer_arm off"),
            Event::TimerArm { at } => write!(f, "timer_arm at={at}"),
            Event::TimerFire => write!(f, "timer_fire"),
            Event::Exit { vcpu, class } => write!(f, "exit vcpu{vcpu} class={}", class.name()),
            Event::IrqsOff { vcpu, pc } => write!(f, "irqs_off vcpu{vcpu} pc={pc:#x}"),
            Event::TimerWake { vcpu, late_ns } => write!(f, "vtimer_late vcpu{vcpu} late_ns={late_ns}"),
        }
    }
}

/// A record as one line of the text format, for pCPU `pcpu`.
pub struct Line<'a> {
    pub pcpu: usize,
    pub rec: &'a Record,
}

impl fmt::Display for Line<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "trace pcpu{} t={} {}", self.pcpu, self.rec.t, self.rec.ev)
    }
}

fn vcpu16(v: VcpuId) -> u16 {
    v.0.min(u16::MAX as u32) as u16
}

/// One pCPU's ring of the most recent events.
pub struct Ring {
    buf: Vec<Record>,
    /// Where the next event goes.
    next: usize,
    /// Events overwritten since creation.
    overwritten: u64,
    /// The EL2 timer value last recorded (`note_arm` records changes only).
    armed: u64,
}

impl Ring {
    /// A ring of `cap` events (at least 1), allocated once here.
    pub fn new(cap: usize) -> Self {
        Self { buf: Vec::with_capacity(cap.max(1)), next: 0, overwritten: 0, armed: u64::MAX }
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn overwritten(&self) -> u64 {
        self.overwritten
    }

    /// Records `ev` at `t`, overwriting the oldest event when full.
    pub fn push(&mut self, t: u64, ev: Event) {
        let r = Record { t, ev };
        if self.buf.len() < self.buf.capacity() {
            self.buf.push(r);
        } else {
            self.buf[self.next] = r;
            self.overwritten += 1;
        }
        // A wrap, not a remainder: no division per event.
        self.next += 1;
        if self.next == self.buf.capacity() {
            self.next = 0;
        }
    }

    /// The events, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Record> {
        let (new, old) = self.buf.split_at(if self.buf.len() < self.buf.capacity() { 0 } else { self.next });
        old.iter().chain(new.iter())
    }

    /// A copy of the events, oldest first.
    pub fn snapshot(&self) -> Vec<Record> {
        self.iter().copied().collect()
    }

    /// The EL2 timer was (re)programmed to `at` (`None`: stopped); recorded
    /// only when it differs from the last value recorded, as the run loop
    /// re-arms it at every guest entry.
    pub fn note_arm(&mut self, t: u64, at: Option<u64>) {
        let at = at.unwrap_or(u64::MAX);
        if at != self.armed {
            self.armed = at;
            self.push(t, Event::TimerArm { at });
        }
    }

    /// The EL2 timer fired (it is stopped until re-armed).
    pub fn note_fire(&mut self, t: u64) {
        self.armed = u64::MAX;
        self.push(t, Event::TimerFire);
    }

    /// A wake of `vcpu` that was `blocked` (or not), what the scheduler
    /// answered, and how it deferred the switch (`Scheduler::wake_deferral`).
    pub fn wake(
        &mut self,
        t: u64,
        vcpu: VcpuId,
        cause: WakeCause,
        blocked: bool,
        action: WakeAction,
        deferral: Option<(Deferral, u64)>,
    ) {
        let outcome = match action {
            _ if !blocked => WakeOutcome::Noop,
            WakeAction::None => WakeOutcome::None,
            WakeAction::Reschedule { pcpu } => WakeOutcome::Resched { pcpu: pcpu as u16 },
            WakeAction::RearmTimer { pcpu, at } => WakeOutcome::Rearm { pcpu: pcpu as u16, at },
        };
        self.push(t, Event::Wake { vcpu: vcpu16(vcpu), cause, outcome });
        if let Some((kind, until)) = deferral {
            self.push(t, Event::Defer { kind, until });
        }
    }

    /// What a `schedule()` decided: a deferral, the switch out, the switch in, or idle.
    pub fn decision(&mut self, t: u64, d: &Decision) {
        let s = &d.switch;
        if let Some((kind, until)) = s.deferred {
            self.push(t, Event::Defer { kind, until });
        }
        if let Some((v, reason, credit)) = s.out {
            self.push(t, Event::SchedOut { vcpu: vcpu16(v), credit, reason });
        }
        if let Some((v, credit, wake)) = s.into {
            self.push(t, Event::SchedIn { vcpu: vcpu16(v), credit, wake_ns: wake.unwrap_or(u64::MAX) });
        }
        if d.next.is_none() && s.out.is_some() {
            self.push(t, Event::Idle);
        }
    }
}

/// Why the rings are dumped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpReason {
    /// `vcpu` waited `latency_ns` from its wake to its schedule-in.
    Outlier { vcpu: VcpuId, latency_ns: u64 },
    /// `vcpu` switched in `late_ns` after its virtual timer's deadline.
    TimerLate { vcpu: VcpuId, late_ns: u64 },
    /// Ctrl-\\ on the console.
    Key,
    /// `hvctl trace dump` (read by the tool, not printed).
    Request,
}

/// When to dump: the threshold, how many dumps are left, and when the last
/// one ended (a dump stalls its pCPU for milliseconds: a wait that overlaps
/// it is the dump's doing, and must not start a cascade of dumps).
pub struct Trigger {
    threshold_ns: Option<u64>,
    left: AtomicU32,
    last_dump_end: AtomicU64,
    dom0_key: bool,
}

impl Trigger {
    /// `threshold_us`: `sched_trace_threshold_us` (`None`: never); at most
    /// `max_dumps` dumps.
    pub fn new(threshold_us: Option<u64>, max_dumps: u32) -> Self {
        Self {
            threshold_ns: threshold_us.map(|u| u.saturating_mul(1000)),
            left: AtomicU32::new(max_dumps),
            last_dump_end: AtomicU64::new(0),
            dom0_key: false,
        }
    }

    /// Whether Dom0 writing Ctrl-\\ to its console dumps
    /// (`sched_trace_dom0_key`).
    pub fn with_dom0_key(self, on: bool) -> Self {
        Self { dom0_key: on, ..self }
    }

    /// Whether Ctrl-\\ written by Dom0 is a dump request (then it is not
    /// printed, whether or not a dump is left).
    pub fn dom0_key_on(&self) -> bool {
        self.dom0_key
    }

    /// Dom0 wrote Ctrl-\\: whether that dumps (enabled, and a dump is left;
    /// it counts).
    pub fn dom0_key(&self) -> bool {
        self.dom0_key && self.take()
    }

    /// Counts one dump against `max_dumps`; false when none is left.
    fn take(&self) -> bool {
        self.left.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok()
    }

    /// Whether a wait of `latency_ns` that ended at `now` dumps (and counts
    /// it). A wait that began before the last dump ended does not.
    pub fn fire(&self, now: u64, latency_ns: u64) -> bool {
        match self.threshold_ns {
            Some(_) if now.saturating_sub(latency_ns) < self.last_dump_end.load(Ordering::Acquire) => false,
            Some(th) if latency_ns > th => self.take(),
            _ => false,
        }
    }
}

impl Trigger {
    /// A dump ended at `now`.
    pub fn dumped(&self, now: u64) {
        self.last_dump_end.fetch_max(now, Ordering::AcqRel);
    }
}

/// The start of the window an outlier's dump shows: its wake, and as long
/// again before it (at least 2 ms), so the runner's switch-in is there too.
pub fn outlier_window_start(now: u64, latency_ns: u64) -> u64 {
    now.saturating_sub(latency_ns.saturating_mul(2).max(2_000_000))
}

/// Writes a dump: the `begin` line, per pCPU a `ring` line and its events at
/// or after `from`, the `end` line. `rings` are `(pcpu, events oldest first,
/// events overwritten)`, each copied consistently (under its own lock); they
/// are copied one after another, so a later ring may have newer events.
pub fn write_dump<W: fmt::Write>(
    w: &mut W,
    why: DumpReason,
    rings: &[(usize, Vec<Record>, u64)],
    from: u64,
) -> fmt::Result {
    match why {
        DumpReason::Outlier { vcpu, latency_ns } => {
            writeln!(w, "(HV) trace begin reason=outlier vcpu{} latency_ns={latency_ns}", vcpu.0)?
        }
        DumpReason::TimerLate { vcpu, late_ns } => {
            writeln!(w, "(HV) trace begin reason=vtimer vcpu{} late_ns={late_ns}", vcpu.0)?
        }
        DumpReason::Key => writeln!(w, "(HV) trace begin reason=key")?,
        DumpReason::Request => writeln!(w, "(HV) trace begin reason=hvctl")?,
    }
    for (p, recs, lost) in rings {
        writeln!(w, "(HV) trace ring pcpu{p} events={} overwritten={lost} from_t={from}", recs.len())?;
        for r in recs.iter().filter(|r| r.t >= from) {
            writeln!(w, "{}", Line { pcpu: *p, rec: r })?;
        }
    }
    writeln!(w, "(HV) trace end")
}

#[cfg(test)]
mod tests;
