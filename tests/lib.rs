//! Shared helpers for the integration tests: boot the real guest under the
//! hypervisor in QEMU (through the same code as `cargo xtask run`) and look
//! at what Linux and the hypervisor printed.

use std::sync::Mutex;
use std::time::Duration;
pub use xtask::qemu::{EarlyInput, RunOptions, RunResult};

/// QEMU runs one at a time: this host has two cores.
static QEMU: Mutex<()> = Mutex::new(());

/// Boots the guest and runs `cmd` in it.
pub fn run_cmd(cmd: &str, tweak: impl FnOnce(&mut RunOptions)) -> RunResult {
    let mut o = RunOptions { cmd: Some(cmd.into()), echo: false, timeout: Duration::from_secs(420), ..Default::default() };
    tweak(&mut o);
    run(&o)
}

pub fn run(o: &RunOptions) -> RunResult {
    let _g = QEMU.lock().unwrap_or_else(|e| e.into_inner());
    let r = xtask::qemu::run(o).expect("running QEMU");
    if r.timed_out {
        panic!("QEMU timed out; console:\n{}", tail(&r.console, 80));
    }
    r
}

/// The last `n` lines, for failure messages.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A counter from the statistics the hypervisor prints at power-off
/// (`vcpuN.key=value` lines, see `hypervisor::stats`).
pub fn stat(console: &str, vcpu: usize, key: &str) -> Option<u64> {
    let prefix = format!("vcpu{vcpu}.{key}=");
    console.lines().rev().find_map(|l| l.trim().strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
}

/// Asserts `needle` appears in the console, showing its tail otherwise.
#[track_caller]
pub fn assert_console(r: &RunResult, needle: &str) {
    assert!(r.console.contains(needle), "expected {needle:?} in the console; tail:\n{}", tail(&r.console, 60));
}

/// A `name=value` statistics line printed by the hypervisor (e.g. `blk0.writes`).
pub fn stat_line(console: &str, name: &str) -> Option<u64> {
    let prefix = format!("{name}=");
    console.lines().rev().find_map(|l| l.trim().strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
}

/// Attaches QEMU's virtio-blk device with the scratch image (the disk that
/// is passed through, or that the hypervisor drives in backend mode).
pub fn with_qemu_disk(o: &mut RunOptions) {
    let img = xtask::qemu::scratch_disk().expect("scratch disk image");
    o.extra = vec![
        "-drive".into(),
        format!("if=none,file={},format=raw,id=d0", img.display()),
        "-device".into(),
        "virtio-blk-device,drive=d0".into(),
    ];
}
