//! Reads the hypervisor's flight-recorder dumps (`hypervisor::trace`) back
//! from a console log and renders them as a per-pCPU timeline.
//!
//! A dump is the lines between `(HV) trace begin ...` and `(HV) trace end`;
//! each `trace pcpuN t=T ...` line parses into the hypervisor's own
//! [`Record`], so a dump read back is exactly what was recorded. Other lines
//! inside a dump (guest output on another pCPU) are skipped; a malformed
//! `trace` line is an error naming it.

use hypervisor::sched::{Deferral, SwitchReason, VcpuId, WakeCause};
use hypervisor::trace::{Event, ExitClass, Record, WakeOutcome};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Why a dump was taken, as its `begin` line says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    Outlier {
        vcpu: u32,
        latency_ns: u64,
    },
    /// A virtual-timer wake switched in `late_ns` after the timer's deadline.
    TimerLate {
        vcpu: u32,
        late_ns: u64,
    },
    Key,
}

/// One pCPU's ring as dumped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingInfo {
    pub pcpu: usize,
    pub events: usize,
    pub overwritten: u64,
    pub from_t: u64,
}

/// One dump: why, the rings' headers, and every event with its pCPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dump {
    pub reason: Reason,
    pub rings: Vec<RingInfo>,
    pub events: Vec<(usize, Record)>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: String,
    pub what: &'static str,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "trace: {}: {:?}", self.what, self.line)
    }
}

impl std::error::Error for ParseError {}

fn err(line: &str, what: &'static str) -> ParseError {
    ParseError { line: line.to_string(), what }
}

/// `key=value` words of a line, by key.
fn fields<'a>(words: &[&'a str]) -> BTreeMap<&'a str, &'a str> {
    words.iter().filter_map(|w| w.split_once('=')).collect()
}

fn num<T: std::str::FromStr>(m: &BTreeMap<&str, &str>, k: &str, line: &str) -> Result<T, ParseError> {
    m.get(k).and_then(|v| v.parse().ok()).ok_or_else(|| err(line, "missing or bad number"))
}

fn vcpu_word(w: Option<&&str>, line: &str) -> Result<u16, ParseError> {
    w.and_then(|w| w.strip_prefix("vcpu")).and_then(|n| n.parse().ok()).ok_or_else(|| err(line, "bad vcpuN"))
}

/// Parses one `trace pcpuN t=T <event>` line (`None`: not such a line).
pub fn parse_line(line: &str) -> Option<Result<(usize, Record), ParseError>> {
    let rest = line.trim().strip_prefix("trace pcpu")?;
    Some(parse_event(line, rest))
}

fn parse_event(line: &str, rest: &str) -> Result<(usize, Record), ParseError> {
    let words: Vec<&str> = rest.split_ascii_whitespace().collect();
    let pcpu: usize = words.first().and_then(|p| p.parse().ok()).ok_or_else(|| err(line, "bad pcpu"))?;
    let t: u64 = words
        .get(1)
        .and_then(|w| w.strip_prefix("t="))
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| err(line, "bad t="))?;
    let kind = *words.get(2).ok_or_else(|| err(line, "no event"))?;
    let args = &words[3..];
    let m = fields(args);
    let ev = match kind {
        "wake" => {
            let cause = match m.get("cause").copied() {
                Some("irq") => WakeCause::Interrupt,
                Some("sgi") => WakeCause::Sgi,
                Some("timer") => WakeCause::Timer,
                Some("doorbell") => WakeCause::Doorbell,
                _ => return Err(err(line, "bad cause")),
            };
            let outcome = match m.get("action").copied() {
                Some("noop") => WakeOutcome::Noop,
                Some("none") => WakeOutcome::None,
                Some("resched") => WakeOutcome::Resched { pcpu: num(&m, "pcpu", line)? },
                Some("rearm") => WakeOutcome::Rearm { pcpu: num(&m, "pcpu", line)?, at: num(&m, "at", line)? },
                _ => return Err(err(line, "bad action")),
            };
            Event::Wake { vcpu: vcpu_word(args.first(), line)?, cause, outcome }
        }
        "defer" => {
            let kind = match m.get("kind").copied() {
                Some("ratelimit") => Deferral::Ratelimit,
                Some("lhp_grace") => Deferral::LhpGrace,
                Some("min_run") => Deferral::MinRun,
                _ => return Err(err(line, "bad deferral kind")),
            };
            Event::Defer { kind, until: num(&m, "until", line)? }
        }
        "kick" => Event::Kick { pcpu: num(&m, "pcpu", line)? },
        "sched_out" => {
            let reason = match m.get("reason").copied() {
                Some("slice_end") => SwitchReason::SliceEnd,
                Some("wake_preempt") => SwitchReason::WakePreempt,
                Some("block") => SwitchReason::Block,
                Some("yield") => SwitchReason::Yield,
                Some("off") => SwitchReason::Off,
                _ => return Err(err(line, "bad reason")),
            };
            Event::SchedOut { vcpu: vcpu_word(args.first(), line)?, credit: num(&m, "credit", line)?, reason }
        }
        "sched_in" => {
            let wake_ns = if m.contains_key("wake_ns") { num(&m, "wake_ns", line)? } else { u64::MAX };
            Event::SchedIn { vcpu: vcpu_word(args.first(), line)?, credit: num(&m, "credit", line)?, wake_ns }
        }
        "idle" => Event::Idle,
        "timer_arm" if args.first() == Some(&"off") => Event::TimerArm { at: u64::MAX },
        "timer_arm" => Event::TimerArm { at: num(&m, "at", line)? },
        "timer_fire" => Event::TimerFire,
        "exit" => {
            let class = match m.get("class").copied() {
                Some("irq") => ExitClass::Irq,
                Some("wfi") => ExitClass::Wfi,
                Some("wfe") => ExitClass::Wfe,
                Some("mmio") => ExitClass::Mmio,
                Some("sgi") => ExitClass::Sgi,
                Some("hvc") => ExitClass::Hvc,
                Some("smc") => ExitClass::Smc,
                Some("sysreg") => ExitClass::Sysreg,
                Some("abort") => ExitClass::Abort,
                Some("serror") => ExitClass::SError,
                Some("other") => ExitClass::Other,
                _ => return Err(err(line, "bad exit class")),
            };
            Event::Exit { vcpu: vcpu_word(args.first(), line)?, class }
        }
        "irqs_off" => {
            let pc = m.get("pc").and_then(|v| v.strip_prefix("0x")).and_then(|h| u64::from_str_radix(h, 16).ok());
            Event::IrqsOff { vcpu: vcpu_word(args.first(), line)?, pc: pc.ok_or_else(|| err(line, "bad pc"))? }
        }
        "vtimer_late" => Event::TimerWake { vcpu: vcpu_word(args.first(), line)?, late_ns: num(&m, "late_ns", line)? },
        _ => return Err(err(line, "unknown event")),
    };
    Ok((pcpu, Record { t, ev }))
}

fn parse_begin(line: &str, rest: &str) -> Result<Reason, ParseError> {
    let words: Vec<&str> = rest.split_ascii_whitespace().collect();
    let m = fields(&words);
    match m.get("reason").copied() {
        Some("key") => Ok(Reason::Key),
        Some("outlier") => {
            let vcpu = words.iter().find_map(|w| w.strip_prefix("vcpu")).and_then(|n| n.parse().ok());
            let vcpu = vcpu.ok_or_else(|| err(line, "bad vcpuN"))?;
            Ok(Reason::Outlier { vcpu, latency_ns: num(&m, "latency_ns", line)? })
        }
        Some("vtimer") => {
            let vcpu = words.iter().find_map(|w| w.strip_prefix("vcpu")).and_then(|n| n.parse().ok());
            let vcpu = vcpu.ok_or_else(|| err(line, "bad vcpuN"))?;
            Ok(Reason::TimerLate { vcpu, late_ns: num(&m, "late_ns", line)? })
        }
        _ => Err(err(line, "bad reason")),
    }
}

/// Every complete dump in a console log, in order. A dump cut off by the
/// end of the log is left out.
pub fn parse_dumps(console: &str) -> Result<Vec<Dump>, ParseError> {
    let mut out = Vec::new();
    let mut cur: Option<Dump> = None;
    for raw in console.lines() {
        let line = raw.trim();
        if let Some(rest) = line.strip_prefix("(HV) trace begin ") {
            cur = Some(Dump { reason: parse_begin(line, rest)?, rings: Vec::new(), events: Vec::new() });
        } else if line == "(HV) trace end" {
            out.extend(cur.take());
        } else if let Some(d) = cur.as_mut() {
            if let Some(rest) = line.strip_prefix("(HV) trace ring pcpu") {
                let words: Vec<&str> = rest.split_ascii_whitespace().collect();
                let m = fields(&words);
                d.rings.push(RingInfo {
                    pcpu: words.first().and_then(|p| p.parse().ok()).ok_or_else(|| err(line, "bad pcpu"))?,
                    events: num(&m, "events", line)?,
                    overwritten: num(&m, "overwritten", line)?,
                    from_t: num(&m, "from_t", line)?,
                });
            } else if let Some(r) = parse_line(line) {
                d.events.push(r?);
            }
        }
    }
    Ok(out)
}

impl Dump {
    /// How long the dump's vCPU waited (ns), as its begin line says.
    pub fn latency_ns(&self) -> u64 {
        match self.reason {
            Reason::Outlier { latency_ns, .. } => latency_ns,
            Reason::TimerLate { late_ns, .. } => late_ns,
            Reason::Key => 0,
        }
    }

    /// The outlier vCPU's last wake and schedule-in in the dump (what the
    /// dump is about): `(wake time, schedule-in time)`. For a late timer,
    /// the wake is the timer's deadline.
    pub fn outlier_span(&self) -> Option<(u64, u64)> {
        if let Reason::TimerLate { vcpu, late_ns } = self.reason {
            let v = vcpu as u16;
            let (_, r) =
                self.events.iter().rev().find(
                    |(_, r)| matches!(r.ev, Event::TimerWake { vcpu, late_ns: l } if vcpu == v && l == late_ns),
                )?;
            return Some((r.t.saturating_sub(late_ns), r.t));
        }
        let Reason::Outlier { vcpu, .. } = self.reason else { return None };
        let v = vcpu as u16;
        // The latest by time: the events are grouped by ring (pCPU), not sorted.
        let sin = self
            .events
            .iter()
            .filter(|(_, r)| matches!(r.ev, Event::SchedIn { vcpu, .. } if vcpu == v))
            .max_by_key(|(_, r)| r.t)?;
        let wake = self
            .events
            .iter()
            .filter(|(_, r)| {
                r.t <= sin.1.t
                    && matches!(r.ev, Event::Wake { vcpu, outcome, .. } if vcpu == v && outcome != WakeOutcome::Noop)
            })
            .max_by_key(|(_, r)| r.t)?;
        Some((wake.1.t, sin.1.t))
    }

    /// Demand before the outlier (is the late wake a fairness matter?): how long
    /// the dump's vCPU ran, from its `sched_in`/`sched_out` events on any
    /// pCPU, in the `window_ns` before its wake (the window starts no
    /// earlier than the first event of the dump). `(run_ns, window_ns)`.
    pub fn demand(&self, window_ns: u64) -> Option<(u64, u64)> {
        let v = outlier_vcpu(self)?.0 as u16;
        let (end, _) = self.outlier_span()?;
        let mut ev: Vec<&Record> = self.events.iter().map(|(_, r)| r).filter(|r| r.t <= end).collect();
        ev.sort_by_key(|r| r.t);
        let start = end.saturating_sub(window_ns).max(ev.first()?.t);
        // Running at `start` if its first switch at or after it is a switch-out.
        let mut since = ev
            .iter()
            .filter(|r| r.t >= start)
            .find_map(|r| match r.ev {
                Event::SchedIn { vcpu, .. } if vcpu == v => Some(None),
                Event::SchedOut { vcpu, .. } if vcpu == v => Some(Some(start)),
                _ => None,
            })
            .flatten();
        let mut run = 0;
        for r in ev.iter().filter(|r| r.t >= start) {
            match r.ev {
                Event::SchedIn { vcpu, .. } if vcpu == v => since = Some(r.t),
                Event::SchedOut { vcpu, .. } if vcpu == v => run += r.t - since.take().unwrap_or(r.t),
                _ => {}
            }
        }
        run += since.map_or(0, |s| end - s);
        Some((run, end - start))
    }

    /// A per-pCPU timeline: one row per event in time order, times in µs
    /// from the first event, each pCPU in its own column; the outlier's
    /// wake and schedule-in are marked `<<`.
    pub fn timeline(&self) -> String {
        let mut ev: Vec<&(usize, Record)> = self.events.iter().collect();
        ev.sort_by_key(|(p, r)| (r.t, *p));
        let ncols = self.rings.iter().map(|r| r.pcpu + 1).chain(ev.iter().map(|(p, _)| p + 1)).max().unwrap_or(1);
        let t0 = ev.first().map_or(0, |(_, r)| r.t);
        let mark = self.outlier_span();
        const W: usize = 56;
        let mut s = String::new();
        let _ = match &self.reason {
            Reason::Outlier { vcpu, latency_ns } => writeln!(s, "outlier: vcpu{vcpu} waited {} µs", latency_ns / 1000),
            Reason::TimerLate { vcpu, late_ns } => {
                writeln!(s, "outlier: vcpu{vcpu} ran {} µs after its virtual timer's deadline", late_ns / 1000)
            }
            Reason::Key => writeln!(s, "dump on demand"),
        };
        if let Some((run, win)) = self.demand(DEMAND_WINDOW_NS).filter(|&(_, w)| w > 0) {
            let _ = writeln!(
                s,
                "demand: it ran {} µs of the {} µs before its wake ({} %)",
                run / 1000,
                win / 1000,
                run * 100 / win
            );
        }
        let _ = write!(s, "{:>12}", "t (µs)");
        for p in 0..ncols {
            let _ = write!(s, "  {:<W$}", format!("pcpu{p}"));
        }
        s.push('\n');
        for (p, r) in ev {
            let text = r.ev.to_string();
            let marked = mark.is_some_and(|(w, i)| {
                (r.t == w && matches!(r.ev, Event::Wake { .. }))
                    || (r.t == i && matches!(r.ev, Event::SchedIn { .. } | Event::TimerWake { .. }))
            });
            let text = if marked { format!("{text} <<") } else { text };
            let dt = r.t - t0;
            let _ = write!(s, "{:>8}.{:03}", dt / 1000, dt % 1000);
            for _ in 0..*p {
                let _ = write!(s, "  {:<W$}", "");
            }
            let _ = writeln!(s, "  {text}");
        }
        s
    }
}

/// The window [`Dump::timeline`] reports the outlier vCPU's demand over
/// (Credit2's `CSCHED2_CREDIT_INIT`: one epoch's worth of credit).
pub const DEMAND_WINDOW_NS: u64 = 10_000_000;

/// The vCPU of a [`Reason::Outlier`] as the scheduler names it.
pub fn outlier_vcpu(d: &Dump) -> Option<VcpuId> {
    match d.reason {
        Reason::Outlier { vcpu, .. } | Reason::TimerLate { vcpu, .. } => Some(VcpuId(vcpu)),
        Reason::Key => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hypervisor::trace::{write_dump, DumpReason};

    fn all_events() -> Vec<Event> {
        let w = |cause, outcome| Event::Wake { vcpu: 1, cause, outcome };
        vec![
            w(WakeCause::Interrupt, WakeOutcome::Noop),
            w(WakeCause::Sgi, WakeOutcome::None),
            w(WakeCause::Timer, WakeOutcome::Resched { pcpu: 1 }),
            w(WakeCause::Doorbell, WakeOutcome::Rearm { pcpu: 0, at: 77 }),
            Event::Defer { kind: Deferral::Ratelimit, until: 5 },
            Event::Defer { kind: Deferral::LhpGrace, until: 6 },
            Event::Defer { kind: Deferral::MinRun, until: 7 },
            Event::Kick { pcpu: 1 },
            Event::SchedOut { vcpu: 0, credit: -123, reason: SwitchReason::SliceEnd },
            Event::SchedOut { vcpu: 0, credit: 1, reason: SwitchReason::WakePreempt },
            Event::SchedOut { vcpu: 0, credit: 1, reason: SwitchReason::Block },
            Event::SchedOut { vcpu: 0, credit: 1, reason: SwitchReason::Yield },
            Event::SchedOut { vcpu: 0, credit: 1, reason: SwitchReason::Off },
            Event::SchedIn { vcpu: 1, credit: 10_500_000, wake_ns: 2_104_000 },
            Event::SchedIn { vcpu: 1, credit: 0, wake_ns: u64::MAX },
            Event::Idle,
            Event::TimerArm { at: 1_000_000 },
            Event::TimerArm { at: u64::MAX },
            Event::TimerFire,
            Event::Exit { vcpu: 3, class: ExitClass::Irq },
            Event::Exit { vcpu: 3, class: ExitClass::Wfi },
            Event::Exit { vcpu: 3, class: ExitClass::Wfe },
            Event::Exit { vcpu: 3, class: ExitClass::Mmio },
            Event::Exit { vcpu: 3, class: ExitClass::Sgi },
            Event::Exit { vcpu: 3, class: ExitClass::Hvc },
            Event::Exit { vcpu: 3, class: ExitClass::Smc },
            Event::Exit { vcpu: 3, class: ExitClass::Sysreg },
            Event::Exit { vcpu: 3, class: ExitClass::Abort },
            Event::Exit { vcpu: 3, class: ExitClass::SError },
            Event::Exit { vcpu: 3, class: ExitClass::Other },
            Event::TimerWake { vcpu: 1, late_ns: 500 },
            Event::IrqsOff { vcpu: 1, pc: 0xffff_8000_0812_3456 },
        ]
    }

    /// The hypervisor's writer and this parser agree on every event.
    #[test]
    fn round_trip_every_event() {
        let recs: Vec<Record> =
            all_events().into_iter().enumerate().map(|(i, ev)| Record { t: 1000 + i as u64, ev }).collect();
        let rings = vec![(0, recs[..10].to_vec(), 3), (1, recs[10..].to_vec(), 0)];
        let mut text = String::from("guest noise\n");
        let why = DumpReason::Outlier { vcpu: VcpuId(1), latency_ns: 2_104_000 };
        write_dump(&mut text, why, &rings, 0).unwrap();
        text.push_str("[  1.0] more guest output\n");
        write_dump(&mut text, DumpReason::Key, &rings[..1], 1005).unwrap();
        let late = DumpReason::TimerLate { vcpu: VcpuId(1), late_ns: 500 };
        write_dump(&mut text, late, &rings, 0).unwrap();
        let dumps = parse_dumps(&text).unwrap();
        assert_eq!(dumps.len(), 3);
        assert_eq!(dumps[2].reason, Reason::TimerLate { vcpu: 1, late_ns: 500 });
        let end = 1000 + all_events().len() as u64 - 2;
        assert_eq!(dumps[2].outlier_span(), Some((end - 500, end)));
        assert_eq!(dumps[0].reason, Reason::Outlier { vcpu: 1, latency_ns: 2_104_000 });
        assert_eq!(outlier_vcpu(&dumps[0]), Some(VcpuId(1)));
        let back: Vec<Record> = dumps[0].events.iter().map(|(_, r)| *r).collect();
        assert_eq!(back, recs);
        assert!(
            dumps[0].events[..10].iter().all(|(p, _)| *p == 0) && dumps[0].events[10..].iter().all(|(p, _)| *p == 1)
        );
        assert_eq!(dumps[0].rings[0], RingInfo { pcpu: 0, events: 10, overwritten: 3, from_t: 0 });
        assert_eq!(dumps[1].reason, Reason::Key);
        assert_eq!(dumps[1].events.len(), 5, "from_t filters");
    }

    #[test]
    fn malformed_and_cut_off() {
        let bad = "(HV) trace begin reason=key\ntrace pcpu0 t=1 wake vcpu1 cause=cosmic action=none\n(HV) trace end\n";
        let e = parse_dumps(bad).unwrap_err();
        assert_eq!(e.what, "bad cause");
        let cut = "(HV) trace begin reason=key\ntrace pcpu0 t=1 idle\n";
        assert_eq!(parse_dumps(cut).unwrap(), vec![]);
        assert!(parse_line("trace pcpu0 t=x idle").unwrap().is_err());
        assert!(parse_line("not a trace line").is_none());
    }

    #[test]
    fn timeline_marks_the_outlier() {
        let text = "\
(HV) trace begin reason=outlier vcpu1 latency_ns=1000000
(HV) trace ring pcpu0 events=3 overwritten=0 from_t=0
trace pcpu0 t=1000 wake vcpu1 cause=timer action=none
trace pcpu0 t=1000 defer kind=ratelimit until=1001000
trace pcpu0 t=1001000 sched_in vcpu1 credit=5 wake_ns=1000000
(HV) trace ring pcpu1 events=1 overwritten=0 from_t=0
trace pcpu1 t=2000 exit vcpu0 class=mmio
(HV) trace end
";
        let d = &parse_dumps(text).unwrap()[0];
        assert_eq!(d.outlier_span(), Some((1000, 1_001_000)));
        let tl = d.timeline();
        let lines: Vec<&str> = tl.lines().collect();
        assert_eq!(lines[0], "outlier: vcpu1 waited 1000 µs");
        assert!(lines[1].contains("pcpu0") && lines[1].contains("pcpu1"));
        assert!(lines[2].starts_with("       0.000  wake vcpu1") && lines[2].ends_with("<<"), "{tl}");
        assert!(lines[4].starts_with("       1.000  ") && lines[4].contains("exit vcpu0 class=mmio"), "{tl}");
        assert!(lines[4].find("exit").unwrap() > 60, "pcpu1's column: {tl}");
        assert!(lines[5].starts_with("    1000.000  sched_in vcpu1") && lines[5].ends_with("<<"), "{tl}");
    }

    #[test]
    fn demand_before_the_wake() {
        // vcpu1 runs from before the window on pcpu0 until 3000, again
        // 5000..6000 on pcpu1; woken at 9000 after blocking at 6000.
        let text = "\
(HV) trace begin reason=outlier vcpu1 latency_ns=500
(HV) trace ring pcpu0 events=4 overwritten=9 from_t=1000
trace pcpu0 t=1000 exit vcpu1 class=irq
trace pcpu0 t=3000 sched_out vcpu1 credit=5 reason=slice_end
trace pcpu0 t=3000 sched_in vcpu0 credit=9
trace pcpu0 t=9000 wake vcpu1 cause=timer action=none
trace pcpu0 t=9500 sched_in vcpu1 credit=5 wake_ns=500
(HV) trace ring pcpu1 events=2 overwritten=0 from_t=5000
trace pcpu1 t=5000 sched_in vcpu1 credit=4 wake_ns=0
trace pcpu1 t=6000 sched_out vcpu1 credit=3 reason=block
(HV) trace end
";
        let d = &parse_dumps(text).unwrap()[0];
        assert_eq!(d.demand(10_000), Some((2000 + 1000, 8000)), "window clipped to the first event");
        assert_eq!(d.demand(4000), Some((1000, 4000)));
        assert_eq!(d.demand(7000), Some((1000 + 1000, 7000)), "running at the window's start");
        assert!(d.timeline().lines().nth(1).unwrap().starts_with("demand: it ran 3 µs of the 8 µs"));
    }
}
