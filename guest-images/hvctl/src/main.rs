//! `hvctl`: Dom0's userspace control tool for the hypervisor. It finds the
//! control device in Dom0's device tree (`/hypervisor/control@…`,
//! `hvrust,control-1`), maps its register page through `/dev/mem` and runs
//! one request per claim (docs/hvctl.md; the device's model and constants
//! are `hv_core::control`). Verbs follow Xen's `xl`: `list`, `vcpu-list`,
//! `sched-credit2`, `create`, `destroy`/`pause`/`unpause`/`shutdown`, plus `stats`,
//! `trace dump`, `set` and `top`. Built statically for
//! `aarch64-unknown-linux-musl` and put in the guest initramfs as
//! `/usr/bin/hvctl` by `cargo xtask`.
//!
//! - `cli`: the command line, parsed into a `Cmd`; the help text
//! - `client`: one request over the register page (claim, DATA, doorbell,
//!   status, release) and paged responses
//! - `create`: `hvctl create`: the files in locked, page-aligned buffers,
//!   named to the hypervisor by physical address, checksums compared
//! - `discover`: the device's address (device tree or `HVCTL_ADDR`)
//! - `format`: the answers parsed and printed like `xl`; stats as JSON
//! - `regs`: the register-access trait and its `/dev/mem` mapping (the
//!   only `unsafe` code)
//! - `top`: `hvctl top`'s CPU% and exits/s from two samples
//! - `verbs`: each verb's requests and output, over any register page
//! - `xlcfg`: the xl.cfg subset `create` reads

#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod cli;
mod client;
mod create;
mod discover;
mod format;
#[allow(unsafe_code)]
mod regs;
mod top;
mod verbs;
mod xlcfg;

use cli::Cmd;
use client::{Client, Error};
use std::io::{IsTerminal, Write};
use std::time::Duration;

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
        std::process::exit(e.exit_status());
    }
}

/// Opens the device (found in the device tree or `HVCTL_ADDR`).
fn open() -> Result<Client<regs::DevMem>, Error> {
    let addr = discover::find().map_err(Error::Other)?;
    Ok(Client::new(regs::DevMem::open(addr).map_err(Error::Other)?))
}

fn out(s: &str) -> Result<(), Error> {
    let mut o = std::io::stdout().lock();
    o.write_all(s.as_bytes()).and_then(|()| o.flush()).map_err(|e| Error::Other(format!("stdout: {e}")))
}

fn run(cmd: Cmd) -> Result<(), Error> {
    match cmd {
        Cmd::Help => out(cli::HELP),
        Cmd::Version => out(&format!("hvctl {}\n", env!("CARGO_PKG_VERSION"))),
        Cmd::Shutdown { dom, wait: true } => verbs::shutdown_wait(&open()?, &dom, Duration::from_millis(200), out),
        Cmd::Top { delay_s, frames, batch } => {
            // Interactive: each frame over the last (cursor home, clear the
            // screen), as top and xentop redraw; Ctrl-C quits.
            let redraw = !batch && std::io::stdout().is_terminal();
            let show = |f: &str| if redraw { out(&format!("\x1b[H\x1b[2J{f}")) } else { out(f) };
            verbs::top(&open()?, Duration::from_secs_f64(delay_s), frames, show)
        }
        Cmd::Create { cfg, dry_run } => {
            // On stderr, as xl does: stdout is the result (the payload, or
            // one line naming the domain).
            eprintln!("Parsing config from {cfg}");
            let (c, kernel, ramdisk) = create::prepare(&cfg)?;
            if dry_run {
                let r = ramdisk.as_ref().map_or(0, |r| r.bytes().len() as u64);
                return out(&create::payload(&c, kernel.bytes().len() as u64, r));
            }
            let dev = open()?;
            for img in std::iter::once(&kernel).chain(ramdisk.as_ref()) {
                regs::lock(img.bytes()).map_err(Error::Other)?;
            }
            let phys = create::pagemap()?;
            let dom = create::create(&dev, &c, &kernel, ramdisk.as_ref(), &phys)?;
            out(&format!("d{dom}: {} created\n", c.name))
        }
        cmd => out(&verbs::exec(&open()?, cmd)?),
    }
}
