//! The command line (xl's verb shapes), parsed with `lexopt` into a
//! [`Cmd`]; the `--help` text.

use lexopt::prelude::*;
use std::ffi::OsString;

/// `--help`.
pub const HELP: &str = "\
hvctl: Dom0's control tool for the hypervisor (xl-style verbs)

Usage: hvctl <VERB> [ARGS]

Verbs:
  list [-l]                     domains (like `xl list`), plus Weight and Cap;
                                -l: the hypervisor's key=value lines, run_ns exact
  vcpu-list                     vCPUs (like `xl vcpu-list`), plus Credit
  stats [--json]                the hypervisor's counters (raw, or one JSON object)
  trace dump                    the scheduling flight recorder's dump
  sched-credit2                 the pool line and every domain's weight and cap
  sched-credit2 -s              the scheduler-wide settings only
  sched-credit2 -d DOM          one domain's weight and cap
  sched-credit2 -d DOM [-w W] [-c CAP]
                                set them (W 1..65535, CAP 0..100*vCPUs, 0: no cap)
  set NAME=VALUE                a hypervisor option
  create [-n] FILE.cfg          make a DomU from an xl.cfg (name, kernel, ramdisk,
                                extra, memory, vcpus, cpus, cpu_weight, cap, and
                                disk_size: its RAM disk in MiB) with memory from
                                the DomU pool; -n/--dry-run: check it and print
                                the CREATE request, without the device
  destroy|pause|unpause DOM
  shutdown [-w] DOM             ask the DomU's kernel to power off (Magic SysRq
                                on its console); -w: wait until it has
  top [-b] [-d SECS] [-n N]     CPU%, exits/s, IRQs/s, IOPS, kick-to-run p50/p99
                                per domain every SECS (default 3)
                                for N frames (default: forever); on a terminal
                                each frame replaces the last (Ctrl-C quits),
                                -b: frames one after another

DOM is a domain id or name. Options: -h/--help, -V/--version.
Errors: one line, exit status 1; 2 for a bad command line or xl.cfg.
The device is found in the device tree (/hypervisor/control@...) or at
HVCTL_ADDR=0x...; hvctl needs /dev/mem (root, in Dom0).
";

/// What to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Cmd {
    Help,
    Version,
    List {
        /// `-l`: the raw `key=value` lines.
        long: bool,
    },
    VcpuList,
    Stats {
        json: bool,
    },
    TraceDump,
    /// `-s`: the scheduler-wide line only.
    SchedShow {
        dom: Option<String>,
        global: bool,
    },
    SchedSet {
        dom: String,
        weight: Option<u32>,
        cap: Option<u32>,
    },
    Set {
        name: String,
        value: String,
    },
    /// `destroy`, `pause`, `unpause`.
    DomOp {
        op: u32,
        dom: String,
    },
    /// `-w`: until the domain has shut down.
    Shutdown {
        dom: String,
        wait: bool,
    },
    /// `batch`: `-b`, frames one after another (without it, on a
    /// terminal, each frame replaces the last).
    Top {
        delay_s: f64,
        frames: Option<u64>,
        batch: bool,
    },
    Create {
        cfg: String,
        dry_run: bool,
    },
}

/// Parses `args` (without the program name).
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Cmd, String> {
    parse_inner(args).map_err(|e| e.to_string())
}

fn parse_inner(args: impl IntoIterator<Item = OsString>) -> Result<Cmd, lexopt::Error> {
    let mut p = lexopt::Parser::from_args(args);
    let verb = match p.next()? {
        None | Some(Short('h') | Long("help")) => return Ok(Cmd::Help),
        Some(Short('V') | Long("version")) => return Ok(Cmd::Version),
        Some(Value(v)) => v.string()?,
        Some(other) => return Err(other.unexpected()),
    };
    let cmd = match verb.as_str() {
        "list" => match p.next()? {
            None => Cmd::List { long: false },
            Some(Short('l') | Long("long")) => Cmd::List { long: true },
            Some(other) => return Err(other.unexpected()),
        },
        "vcpu-list" => Cmd::VcpuList,
        "stats" => match p.next()? {
            None => Cmd::Stats { json: false },
            Some(Long("json")) => Cmd::Stats { json: true },
            Some(other) => return Err(other.unexpected()),
        },
        "trace" => match p.next()? {
            Some(Value(v)) if v == "dump" => Cmd::TraceDump,
            Some(other) => return Err(other.unexpected()),
            None => return Err("`trace` needs a subcommand: `trace dump`".into()),
        },
        "sched-credit2" => return sched(&mut p),
        "set" => {
            let v = p.value()?.string()?;
            let (name, value) = v.split_once('=').ok_or_else(|| format!("`set {v}`: expected NAME=VALUE"))?;
            Cmd::Set { name: name.into(), value: value.into() }
        }
        "destroy" | "pause" | "unpause" => {
            let op = match verb.as_str() {
                "destroy" => hv_core::control::op::DESTROY,
                "pause" => hv_core::control::op::PAUSE,
                _ => hv_core::control::op::UNPAUSE,
            };
            Cmd::DomOp { op, dom: p.value()?.string()? }
        }
        "shutdown" => {
            let (mut dom, mut wait) = (None, false);
            while let Some(arg) = p.next()? {
                match arg {
                    Short('w') | Long("wait") => wait = true,
                    Value(v) if dom.is_none() => dom = Some(v.string()?),
                    other => return Err(other.unexpected()),
                }
            }
            let dom = dom.ok_or("`shutdown` needs a domain")?;
            return Ok(Cmd::Shutdown { dom, wait });
        }
        "top" => return top(&mut p),
        "create" => {
            let (mut cfg, mut dry_run) = (None, false);
            while let Some(arg) = p.next()? {
                match arg {
                    Short('n') | Long("dry-run") => dry_run = true,
                    Value(v) if cfg.is_none() => cfg = Some(v.string()?),
                    other => return Err(other.unexpected()),
                }
            }
            let cfg = cfg.ok_or("`create` needs a configuration file")?;
            return Ok(Cmd::Create { cfg, dry_run });
        }
        other => return Err(format!("unknown verb `{other}` (hvctl --help lists them)").into()),
    };
    match p.next()? {
        None => Ok(cmd),
        Some(other) => Err(other.unexpected()),
    }
}

fn sched(p: &mut lexopt::Parser) -> Result<Cmd, lexopt::Error> {
    let (mut dom, mut weight, mut cap, mut global) = (None, None, None, false);
    while let Some(arg) = p.next()? {
        match arg {
            Short('d') | Long("domain") => dom = Some(p.value()?.string()?),
            Short('w') | Long("weight") => weight = Some(p.value()?.parse()?),
            Short('c') | Long("cap") => cap = Some(p.value()?.parse()?),
            Short('s') | Long("schedparam") => global = true,
            other => return Err(other.unexpected()),
        }
    }
    if let Some(w) = weight {
        if !(1..=65535).contains(&w) {
            return Err(format!("weight {w} out of range (1..65535)").into());
        }
    }
    match (dom, weight.is_some() || cap.is_some()) {
        (Some(dom), true) => Ok(Cmd::SchedSet { dom, weight, cap }),
        (None, true) => Err("-w and -c need -d DOM".into()),
        (dom, false) => Ok(Cmd::SchedShow { dom, global }),
    }
}

fn top(p: &mut lexopt::Parser) -> Result<Cmd, lexopt::Error> {
    let (mut delay_s, mut frames, mut batch) = (3.0f64, None, false);
    while let Some(arg) = p.next()? {
        match arg {
            Short('b') | Long("batch") => batch = true,
            Short('d') | Long("delay") => delay_s = p.value()?.parse()?,
            Short('n') | Long("iterations") => frames = Some(p.value()?.parse()?),
            other => return Err(other.unexpected()),
        }
    }
    if !(delay_s > 0.0 && delay_s <= 3600.0) {
        return Err(format!("delay {delay_s} out of range (0..3600 seconds)").into());
    }
    Ok(Cmd::Top { delay_s, frames, batch })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Cmd, String> {
        parse(s.split_whitespace().map(OsString::from))
    }

    #[test]
    fn verbs_parse() {
        assert_eq!(p(""), Ok(Cmd::Help));
        assert_eq!(p("--version"), Ok(Cmd::Version));
        assert_eq!(p("list"), Ok(Cmd::List { long: false }));
        assert_eq!(p("list -l"), Ok(Cmd::List { long: true }));
        assert_eq!(p("vcpu-list"), Ok(Cmd::VcpuList));
        assert_eq!(p("stats --json"), Ok(Cmd::Stats { json: true }));
        assert_eq!(p("trace dump"), Ok(Cmd::TraceDump));
        assert_eq!(
            p("set sched_wake_preempt=off"),
            Ok(Cmd::Set { name: "sched_wake_preempt".into(), value: "off".into() })
        );
        assert_eq!(p("pause guest1"), Ok(Cmd::DomOp { op: 9, dom: "guest1".into() }));
        assert_eq!(p("top -b -d 0.5 -n 2"), Ok(Cmd::Top { delay_s: 0.5, frames: Some(2), batch: true }));
        assert_eq!(p("top"), Ok(Cmd::Top { delay_s: 3.0, frames: None, batch: false }));
        assert_eq!(p("create /etc/d.cfg"), Ok(Cmd::Create { cfg: "/etc/d.cfg".into(), dry_run: false }));
        assert_eq!(p("create -n d.cfg"), Ok(Cmd::Create { cfg: "d.cfg".into(), dry_run: true }));
        assert_eq!(p("create d.cfg --dry-run"), Ok(Cmd::Create { cfg: "d.cfg".into(), dry_run: true }));
        assert!(p("create a.cfg b.cfg").is_err());
        assert!(p("create").unwrap_err().contains("configuration file"));
        assert_eq!(p("shutdown -w job"), Ok(Cmd::Shutdown { dom: "job".into(), wait: true }));
        assert_eq!(p("shutdown 3"), Ok(Cmd::Shutdown { dom: "3".into(), wait: false }));
        assert!(p("shutdown").unwrap_err().contains("needs a domain"));
        assert!(p("shutdown 1 2").is_err());
    }

    #[test]
    fn sched_credit2_shapes() {
        assert_eq!(p("sched-credit2"), Ok(Cmd::SchedShow { dom: None, global: false }));
        assert_eq!(p("sched-credit2 -s"), Ok(Cmd::SchedShow { dom: None, global: true }));
        assert_eq!(p("sched-credit2 -d 1"), Ok(Cmd::SchedShow { dom: Some("1".into()), global: false }));
        assert_eq!(
            p("sched-credit2 -d Dom0 -w 512 -c 50"),
            Ok(Cmd::SchedSet { dom: "Dom0".into(), weight: Some(512), cap: Some(50) })
        );
        assert!(p("sched-credit2 -d 1 -w 0").unwrap_err().contains("out of range"));
        assert!(p("sched-credit2 -d 1 -w 65536").unwrap_err().contains("out of range"));
        assert!(p("sched-credit2 -w 5").unwrap_err().contains("need -d"));
    }

    #[test]
    fn mistakes_are_named() {
        assert!(p("frobnicate").unwrap_err().contains("unknown verb"));
        assert!(p("list extra").is_err());
        assert!(p("set novalue").unwrap_err().contains("NAME=VALUE"));
        assert!(p("destroy").is_err());
        assert!(p("trace").unwrap_err().contains("trace dump"));
        assert!(p("top -d 0").is_err());
    }
}
