//! `cargo xtask <command>`: the project's single driver.
//!
//! - `build`: build the hypervisor image
//! - `guest-image`: build the guest kernel + initramfs
//! - `run [options]`: boot Linux under the hypervisor in QEMU
//! - `test`: host unit tests and integration tests that boot real guests
//! - `sim wakeup [options]`: the scheduler's discrete-event simulator

mod sim;

use std::path::PathBuf;
use std::process::{exit, Command};
use std::time::Duration;
use xtask::qemu::RunOptions;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  run [options]        boot Linux under the hypervisor in QEMU (installs QEMU, builds the guest image)
      --cmd \"<shell>\"    run a command in the guest, print its output, exit with its status
      --gic 3|4            GIC version of the machine (default 3)
      --pcpus N            physical CPUs (default 1)
      --vcpus M            guest vCPUs (default 1)
      --mem SIZE           guest RAM, e.g. 1G or 768M (default 1G)
      --cpu MODEL          QEMU CPU model (default max,pauth-impdef=on)
      --hv-args \"...\"      hypervisor boot arguments (e.g. \"loglvl=debug sched_ratelimit_us=0\")
      --timeout SECS       kill QEMU after this long (default 600)
      --kernel FILE --initrd FILE --append \"<cmdline>\"   boot your own guest
      --kernel-addr ADDR --initrd-addr ADDR   where QEMU's guest-loader puts them (default 0x50000000, after the kernel)
      --icount             deterministic guest time (-icount shift=0,sleep=on)
      --disk passthrough|ram|backend|none   the guest's disk (default: QEMU's devices passed through)
      --disk-latency-us N  service time of each request on the RAM disk
  test                 host unit tests + integration tests (boots real guests)
  build                build the hypervisor image (target/xtask/hypervisor-qemu-virt.bin)
  guest-image          build the guest kernel + initramfs (guest-images/out)
  sim wakeup [--json FILE] ...   scheduler simulator (see `cargo xtask sim wakeup --help`)
  bench wakeup [--quick] ...     fio wake-latency benchmark in guests (see `cargo xtask bench wakeup --help`)
  bench timer [--runtime S]      cyclictest timer latency, timer_slop_ns 0 vs 50000";

fn parse_size_mb(s: &str) -> Result<u64, String> {
    let (n, mul) = match s.chars().last() {
        Some('G' | 'g') => (&s[..s.len() - 1], 1024),
        Some('M' | 'm') => (&s[..s.len() - 1], 1),
        _ => (s, 1),
    };
    n.parse::<u64>().map(|v| v * mul).map_err(|_| format!("bad size {s}"))
}

fn parse_run(args: &[String]) -> Result<RunOptions, String> {
    let mut o = RunOptions::default();
    let (mut disk, mut latency): (Option<String>, Option<u32>) = (None, None);
    let mut i = 0;
    while i < args.len() {
        let flag = args[i].as_str();
        if flag == "--icount" {
            o.icount = true;
            i += 1;
            continue;
        }
        let val = args.get(i + 1).ok_or_else(|| format!("{flag} needs a value"))?.clone();
        let num = |v: &str| v.parse::<u32>().map_err(|_| format!("{flag}: bad number {v}"));
        match flag {
            "--cmd" => o.cmd = Some(val),
            "--gic" => {
                o.gic = match val.as_str() {
                    "3" => 3,
                    "4" => 4,
                    _ => return Err("--gic takes 3 or 4".into()),
                }
            }
            "--pcpus" => o.pcpus = num(&val)?.max(1),
            "--vcpus" => o.vcpus = num(&val)?.max(1),
            "--mem" => o.mem_mb = parse_size_mb(&val)?,
            "--cpu" => o.cpu = val,
            "--hv-args" => o.hv_args = val,
            "--timeout" => o.timeout = Duration::from_secs(num(&val)? as u64),
            "--kernel" => o.kernel = Some(PathBuf::from(val)),
            "--initrd" => o.initrd = Some(PathBuf::from(val)),
            "--append" => o.append = Some(val),
            "--kernel-addr" => o.kernel_addr = Some(parse_addr(&val)?),
            "--initrd-addr" => o.initrd_addr = Some(parse_addr(&val)?),
            "--disk" => {
                disk = match val.as_str() {
                    "passthrough" | "ram" | "backend" | "none" => Some(val),
                    _ => return Err("--disk takes passthrough, ram, backend or none".into()),
                }
            }
            "--disk-latency-us" => latency = Some(num(&val)?),
            _ => return Err(format!("unknown option {flag}\n{USAGE}")),
        }
        i += 2;
    }
    if o.mem_mb < 128 {
        return Err("--mem must be at least 128M".into());
    }
    if let Some(d) = disk {
        let mut args = format!("dom0_disk={d}");
        if d == "ram" {
            args.push_str(&format!(" dom0_disk_latency_us={}", latency.unwrap_or(0)));
        }
        if d == "passthrough" || d == "backend" {
            // A QEMU virtio-blk device with a scratch image.
            let img = xtask::qemu::scratch_disk().map_err(|e| format!("disk image: {e}"))?;
            o.extra.extend(["-drive".into(), format!("if=none,file={},format=raw,id=d0", img.display()), "-device".into(), "virtio-blk-device,drive=d0".into()]);
        }
        o.hv_args = if o.hv_args.is_empty() { args } else { format!("{args} {}", o.hv_args) };
    } else if latency.is_some() {
        return Err("--disk-latency-us goes with --disk ram".into());
    }
    Ok(o)
}

fn cmd_run(args: &[String]) -> Result<i32, String> {
    let o = parse_run(args)?;
    let r = xtask::qemu::run(&o)?;
    xtask::qemu::exit_code(&o, &r)
}

/// An address: hex with `0x`, or decimal.
fn parse_addr(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(&h.replace('_', ""), 16),
        None => s.parse(),
    }
    .map_err(|_| format!("bad address {s}"))
}

fn cmd_test(args: &[String]) -> Result<i32, String> {
    // Prepare everything the integration tests need, so their output is
    // about the tests, not about installs.
    xtask::setup::ensure_qemu()?;
    xtask::build::hypervisor("qemu-virt")?;
    xtask::image::guest()?;
    let mut child = Command::new(env!("CARGO"))
        .current_dir(xtask::root())
        .args(["test", "--workspace", "--lib", "--bins", "--tests"])
        .args(args)
        .args(["--", "--test-threads=1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    // Echo the output and add up the per-binary results into one closing line.
    let (mut passed, mut failed) = (0u64, 0u64);
    let out = child.stdout.take().unwrap();
    for line in std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok) {
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            let num = |key: &str| {
                rest.split(';').find_map(|part| part.trim().strip_suffix(key).and_then(|n| n.trim().rsplit(' ').next()?.parse::<u64>().ok()))
            };
            passed += num(" passed").unwrap_or(0);
            failed += num(" failed").unwrap_or(0);
        }
    }
    let st = child.wait().map_err(|e| e.to_string())?;
    let mut code = st.code().unwrap_or(1);
    // The virtqueue parser's fuzz target, for a bounded time, when cargo-fuzz
    // and a nightly toolchain are installed.
    match fuzz_virtqueue() {
        Some(true) => passed += 1,
        Some(false) => {
            failed += 1;
            code = if code == 0 { 1 } else { code };
        }
        None => println!("fuzz: skipped (cargo-fuzz or a nightly toolchain is not installed)"),
    }
    println!("tests: {passed} passed, {failed} failed");
    Ok(code)
}

/// Runs `cargo +nightly fuzz run virtqueue` for XTASK_FUZZ_SECONDS (default
/// 30); `None` when cargo-fuzz is not available.
fn fuzz_virtqueue() -> Option<bool> {
    let have = Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        return None;
    }
    let secs = std::env::var("XTASK_FUZZ_SECONDS").ok().and_then(|v| v.parse::<u32>().ok()).unwrap_or(30);
    println!("fuzz: cargo +nightly fuzz run virtqueue for {secs} s");
    // Start from the minimized corpus the repository carries.
    let corpus = xtask::root().join("fuzz").join("corpus").join("virtqueue");
    if !corpus.exists() {
        let _ = std::fs::create_dir_all(&corpus);
        let _ = Command::new("tar").arg("-C").arg(&corpus).arg("-xzf").arg(xtask::root().join("fuzz").join("seeds-virtqueue.tar.gz")).status();
    }
    let ok = Command::new("cargo")
        .current_dir(xtask::root().join("fuzz"))
        .args(["+nightly", "fuzz", "run", "virtqueue", "--", &format!("-max_total_time={secs}"), "-max_len=4096", "-rss_limit_mb=2048"])
        .status()
        .is_ok_and(|s| s.success());
    println!("fuzz: virtqueue {}", if ok { "ok" } else { "FAILED (crash artifact in fuzz/artifacts/)" });
    Some(ok)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprintln!("{USAGE}");
        exit(2);
    };
    let rest = &args[1..];
    let result = match cmd.as_str() {
        "run" => cmd_run(rest),
        "test" => cmd_test(rest),
        "build" => xtask::build::hypervisor("qemu-virt").map(|p| {
            println!("{}", p.display());
            0
        }),
        "guest-image" => xtask::image::guest().map(|g| {
            println!("{}\n{}", g.kernel.display(), g.initrd.display());
            0
        }),
        "sim" => sim::main(rest).map(|_| 0),
        "bench" => match rest.first().map(String::as_str) {
            Some("wakeup") => xtask::bench::runner::wakeup(&rest[1..]).map(|_| 0),
            Some("timer") => xtask::bench::timer::run(&rest[1..]).map(|_| 0),
            _ => Err(format!("usage: cargo xtask bench wakeup [options]\n{}", xtask::bench::runner::USAGE)),
        },
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(0)
        }
        other => Err(format!("unknown command {other}\n{USAGE}")),
    };
    match result {
        Ok(code) => exit(code),
        Err(e) => {
            eprintln!("xtask: error: {e}");
            exit(1);
        }
    }
}
