//! `hvctl`: Dom0's userspace control tool for the hypervisor. It finds the
//! control device in Dom0's device tree (`/hypervisor/control@…`,
//! `hvrust,control-1`), maps its register page through `/dev/mem` and runs
//! one request per claim (docs/hvctl.md; the device's model and constants
//! are `hv_core::control`). Verbs follow Xen's `xl`: `list`, `vcpu-list`,
//! `sched-credit2`, `destroy`/`pause`/`unpause`/`shutdown`, plus `stats`,
//! `trace dump`, `set` and `top`. Built statically for
//! `aarch64-unknown-linux-musl` and put in the guest initramfs as
//! `/usr/bin/hvctl` by `cargo xtask`.
//!
//! - `cli`: the command line, parsed into a `Cmd`; the help text
//! - `client`: one request over the register page (claim, DATA, doorbell,
//!   status, release) and paged responses
//! - `discover`: the device's address (device tree or `HVCTL_ADDR`)
//! - `format`: the answers parsed and printed like `xl`; stats as JSON
//! - `regs`: the register-access trait and its `/dev/mem` mapping (the
//!   only `unsafe` code)
//! - `top`: `hvctl top`'s CPU% and exits/s from two samples

#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod cli;
mod client;
mod discover;
mod format;
#[allow(unsafe_code)]
mod regs;
mod top;

use cli::Cmd;
use client::{Client, Error};
use hv_core::control::{op, UNCHANGED};
use std::io::Write;
use std::time::{Duration, Instant};

fn main() {
    let cmd = match cli::parse(std::env::args_os().skip(1)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hvctl: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(cmd) {
        eprintln!("hvctl: {e}");
        std::process::exit(1);
    }
}

/// Opens the device (found in the device tree or `HVCTL_ADDR`).
fn open() -> Result<Client<regs::DevMem>, Error> {
    let addr = discover::find().map_err(Error::Other)?;
    Ok(Client::new(regs::DevMem::open(addr).map_err(Error::Other)?))
}

fn text(b: Vec<u8>) -> String {
    String::from_utf8_lossy(&b).into_owned()
}

fn out(s: &str) -> Result<(), Error> {
    let mut o = std::io::stdout().lock();
    o.write_all(s.as_bytes()).and_then(|()| o.flush()).map_err(|e| Error::Other(format!("stdout: {e}")))
}

fn run(cmd: Cmd) -> Result<(), Error> {
    match cmd {
        Cmd::Help => return out(cli::HELP),
        Cmd::Version => return out(&format!("hvctl {}\n", env!("CARGO_PKG_VERSION"))),
        _ => {}
    }
    let c = open()?;
    match cmd {
        Cmd::Help | Cmd::Version => unreachable!("handled above"),
        Cmd::List => out(&format::list(&format::domains(&text(c.simple(op::LIST, 0)?)))),
        Cmd::VcpuList => {
            let doms = format::domains(&text(c.simple(op::LIST, 0)?));
            out(&format::vcpu_list(&doms, &text(c.simple(op::VCPU_LIST, 0)?)))
        }
        Cmd::Stats { json } => {
            let t = text(c.paged(op::STATS)?);
            if json {
                out(&(format::stats_json(&t) + "\n"))
            } else {
                out(&t)
            }
        }
        Cmd::TraceDump => out(&text(c.paged(op::TRACE_DUMP)?)),
        Cmd::SchedShow { dom, global } => sched_show(&c, dom.as_deref(), global),
        Cmd::SchedSet { dom, weight, cap } => sched_set(&c, &dom, weight, cap),
        Cmd::Set { name, value } => {
            let r = c.call(op::SET_OPTION, [0; 4], format!("{name}={value}").as_bytes())?;
            out(&text(r.text))
        }
        Cmd::DomOp { op, dom } => {
            let doms = format::domains(&text(c.simple(op::LIST, 0)?));
            let d = resolve(&doms, &dom)?;
            out(&text(c.simple(op, d.domid)?))
        }
        Cmd::Top { delay_s, frames } => top(&c, Duration::from_secs_f64(delay_s), frames),
    }
}

/// The domain `dom` names (an id or a name).
fn resolve<'a>(doms: &'a [format::Domain], dom: &str) -> Result<&'a format::Domain, Error> {
    let by_id = dom.parse::<u32>().ok();
    doms.iter()
        .find(|d| Some(d.domid) == by_id)
        .or_else(|| doms.iter().find(|d| d.name == dom))
        .ok_or_else(|| Error::Other(format!("no domain `{dom}`")))
}

fn sched_show(c: &Client<regs::DevMem>, dom: Option<&str>, global: bool) -> Result<(), Error> {
    let doms = format::domains(&text(c.simple(op::LIST, 0)?));
    if let Some(dom) = dom {
        let d = resolve(&doms, dom)?;
        return out(&format::sched_table(&doms, &text(c.simple(op::SCHED_GET, d.domid)?)));
    }
    let t = text(c.simple(op::SCHED_GET, UNCHANGED)?);
    let pool = format::sched_global(&t).unwrap_or_default();
    if global {
        return out(&pool);
    }
    out(&(pool + &format::sched_table(&doms, &t)))
}

fn sched_set(c: &Client<regs::DevMem>, dom: &str, weight: Option<u32>, cap: Option<u32>) -> Result<(), Error> {
    let doms = format::domains(&text(c.simple(op::LIST, 0)?));
    let d = resolve(&doms, dom)?;
    // The hypervisor checks too; a LIST without `vcpus=` leaves it to it.
    if let (Some(cap), true) = (cap, d.vcpus > 0) {
        let most = 100 * d.vcpus;
        if cap > most {
            return Err(Error::Other(format!("cap {cap} out of range (0..{most} for {} vCPUs)", d.vcpus)));
        }
    }
    let r = c.call(op::SCHED_SET_DOMAIN, [d.domid, weight.unwrap_or(UNCHANGED), cap.unwrap_or(UNCHANGED), 0], &[])?;
    out(&text(r.text))
}

/// One sample for `top` (the stats are optional: a refusal leaves them out).
fn sample(c: &Client<regs::DevMem>) -> Result<(top::Sample, Instant), Error> {
    let doms = format::domains(&text(c.simple(op::LIST, 0)?));
    let at = Instant::now();
    let exits = c.paged(op::STATS).ok().map(|s| top::exits(&text(s)));
    Ok((top::Sample { doms, exits }, at))
}

fn top(c: &Client<regs::DevMem>, delay: Duration, frames: Option<u64>) -> Result<(), Error> {
    let mut n = 0;
    let (mut before, mut t0) = sample(c)?;
    while frames.is_none_or(|f| n < f) {
        std::thread::sleep(delay);
        let (after, t1) = sample(c)?;
        let wall = u64::try_from(t1.duration_since(t0).as_nanos()).unwrap_or(u64::MAX);
        out(&(top::frame(&top::rows(&before, &after, wall)) + "\n"))?;
        (before, t0) = (after, t1);
        n += 1;
    }
    Ok(())
}
