//! `cargo xtask <command>`: the project's single driver.
//!
//! - `build [--platform P]`: build the hypervisor image
//! - `guest-image`: build the guest kernel + initramfs
//! - `run [options]`: boot Linux under the hypervisor in QEMU (or, with
//!   `--platform fvp`, on Arm's FVP)
//! - `test`: host unit tests and integration tests that boot real guests
//! - `sim wakeup [options]`: the scheduler's discrete-event simulator
//! - `sim conformance`: the scheduler's figures against Xen's Credit2
//! - `bench wakeup|timer [options]`: benchmarks in Linux guests
//! - `bench sched-scale [--pcpus 16,64,192]`: the scheduler's work per call, host threads
//! - `conformance [--at bare|dom0|domu] [--gic N] [--pcpus N] [--kernel-format F]`: the
//!   conformance guest's checks (tests/conformance)
//! - `doctor`: the toolchain in use, what is ready, the caches' size
//! - `clean [--caches]`: cargo clean, and the caches
//!
//! The options are parsed with clap (`xtask::cli`); `--help` on any command
//! lists them.

mod sim;

use anyhow::{anyhow, bail, Context};
use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use std::process::exit;
use xtask::cli::{BenchCommand, Cli, Command, PlatformKind, RunArgs, SimCommand, TestArgs};
use xtask::platform::fvp::{self, FVP_NAME, GET_FVP, TFA_ENV, TFA_HOWTO};

fn cmd_run(args: &RunArgs) -> anyhow::Result<i32> {
    if args.platform == PlatformKind::FvpBaseRevc {
        return cmd_run_fvp(args);
    }
    let o = args.run_options(xtask::run::qemu::scratch_disk)?;
    let r = xtask::run::qemu::run(&o)?;
    xtask::run::qemu::exit_code(&o, &r)
}

/// `cargo xtask run --platform fvp [--dry-run]`: builds the hypervisor for
/// fvp-base-revc and the guest image, writes the DTB ([`fvp::plan`]), then
/// prints the model's command line and the `shrinkwrap run` line
/// (`--dry-run`) or runs the model with the console here. It lives here, above
/// both [`fvp`] and [`xtask::platform::shrinkwrap`], which builds on `fvp`'s layout.
fn cmd_run_fvp(args: &RunArgs) -> anyhow::Result<i32> {
    let hv = xtask::build::hypervisor(hypervisor::platform_desc::known::fvp_base_revc::PLATFORM.name)?;
    let (kernel, initrd) = match &args.kernel {
        Some(k) => (k.clone(), args.initrd.clone()),
        None => {
            let g = xtask::build::image::guest_flavour(args.kernel_flavour)?;
            let initrd = match &args.initrd {
                Some(i) => i.clone(),
                None => g.dom0_initrd()?,
            };
            (g.kernel, Some(initrd))
        }
    };
    let o = || args.run_options(|| Ok(std::path::PathBuf::new()));
    let p = fvp::plan(&args.fvp_args(), o, hv, kernel, initrd, &xtask::out_dir().join("fvp"))?;
    let line = fvp::command_line(&p.run);
    if args.dry_run {
        if !p.have_fvp {
            println!("# {FVP_NAME} not found: {GET_FVP}");
        }
        if !p.have_tfa {
            println!("# ${TFA_ENV} (or --tf-a) not set: {TFA_HOWTO}");
        }
        println!("{}", fvp::printable(&line));
        println!("# with Shrinkwrap ({}):", xtask::platform::shrinkwrap::OVERLAY);
        println!("{}", xtask::platform::shrinkwrap::run_line(&p.run));
        return Ok(0);
    }
    if !p.have_fvp {
        bail!("{FVP_NAME} not found: {GET_FVP} (`--dry-run` prints the command line without it)");
    }
    if !p.have_tfa {
        bail!("no TF-A build: pass --tf-a DIR or set {TFA_ENV}; {TFA_HOWTO}");
    }
    for f in ["bl1.bin", "fip.bin"] {
        if !p.run.tfa.join(f).is_file() {
            bail!("{}: no {f} there; {TFA_HOWTO}", p.run.tfa.display());
        }
    }
    eprintln!("xtask: {}", line.join(" "));
    let st = std::process::Command::new(&line[0]).args(&line[1..]).status().with_context(|| line[0].clone())?;
    Ok(st.code().unwrap_or(1))
}

fn cmd_test(args: &TestArgs) -> anyhow::Result<i32> {
    // Prepare everything the integration tests need, so their output is
    // about the tests, not about installs.
    xtask::toolchain::qemu()?;
    xtask::checks::lint::ensure_components()?;
    // Both platforms' EL2 images build (only QEMU's boots here).
    xtask::build::hypervisor("fvp-base-revc")?;
    xtask::build::hypervisor("qemu-virt")?;
    xtask::build::image::guest()?;
    xtask::build::image::guest_flavour(xtask::build::image::Flavour::Generic)?;
    // The conformance guest for tests/conformance.rs.
    xtask::build::conformance()?;
    // TF-A for tests/firmware.rs (built once, then cached).
    for gic in [3, 4] {
        xtask::firmware::tf_a::tf_a(gic)?;
    }
    // EDK2 for tests/uefi.rs.
    xtask::toolchain::edk2()?;
    let mut child = std::process::Command::new(env!("CARGO"))
        .current_dir(xtask::root())
        .args(args.cargo_test_args())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    // Echo the output and add up the per-binary results into one closing line.
    let (mut passed, mut failed) = (0u64, 0u64);
    let out = child.stdout.take().unwrap();
    for line in std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok) {
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            let num = |key: &str| {
                rest.split(';').find_map(|part| {
                    part.trim().strip_suffix(key).and_then(|n| n.trim().rsplit(' ').next()?.parse::<u64>().ok())
                })
            };
            passed += num(" passed").unwrap_or(0);
            failed += num(" failed").unwrap_or(0);
        }
    }
    let st = child.wait()?;
    let mut code = st.code().unwrap_or(1);
    // The fuzz targets (virtqueue parser, vITS, SMMU events), each for a bounded time, when
    // cargo-fuzz and a nightly toolchain are installed.
    for target in FUZZ_TARGETS {
        match fuzz_target(target) {
            Some(true) => passed += 1,
            Some(false) => {
                failed += 1;
                code = if code == 0 { 1 } else { code };
            }
            None => {
                println!("fuzz: skipped (cargo-fuzz or a nightly toolchain is not installed)");
                break;
            }
        }
    }
    // Formatting and clippy, warnings as errors (host and EL2 builds).
    let (lint_ok, lint_failed) = xtask::checks::lint::run();
    passed += lint_ok;
    failed += lint_failed;
    if lint_failed > 0 && code == 0 {
        code = 1;
    }
    // The Shrinkwrap overlay for FVP (skipped when PyPI is out of reach).
    match xtask::platform::shrinkwrap::check() {
        Ok(Some(())) => passed += 1,
        Ok(None) => {}
        Err(e) => {
            println!("shrinkwrap: FAILED: {e:#}");
            failed += 1;
            code = if code == 0 { 1 } else { code };
        }
    }
    println!("tests: {passed} passed, {failed} failed");
    Ok(code)
}

/// The cargo-fuzz targets in fuzz/fuzz_targets that `cargo xtask test` runs.
const FUZZ_TARGETS: [&str; 5] = ["virtqueue", "vits", "smmu", "vpci", "control"];

/// Runs `cargo +nightly fuzz run <target>` for XTASK_FUZZ_SECONDS (default
/// 30), starting from `fuzz/seeds-<target>.tar.gz` when the repository has
/// one; `None` when cargo-fuzz is not available.
fn fuzz_target(target: &str) -> Option<bool> {
    let have = std::process::Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        return None;
    }
    let secs = std::env::var("XTASK_FUZZ_SECONDS").ok().and_then(|v| v.parse::<u32>().ok()).unwrap_or(30);
    println!("fuzz: cargo +nightly fuzz run {target} for {secs} s");
    // Start from the minimized corpus the repository carries.
    let corpus = xtask::root().join("fuzz").join("corpus").join(target);
    let seeds = xtask::root().join("fuzz").join(format!("seeds-{target}.tar.gz"));
    if !corpus.exists() && seeds.exists() {
        let _ = std::fs::create_dir_all(&corpus);
        let _ = std::process::Command::new("tar").arg("-C").arg(&corpus).arg("-xzf").arg(&seeds).status();
    }
    let ok = std::process::Command::new("cargo")
        .current_dir(xtask::root().join("fuzz"))
        .args([
            "+nightly",
            "fuzz",
            "run",
            target,
            "--",
            &format!("-max_total_time={secs}"),
            "-max_len=4096",
            "-rss_limit_mb=2048",
        ])
        .status()
        .is_ok_and(|s| s.success());
    println!("fuzz: {target} {}", if ok { "ok" } else { "FAILED (crash artifact in fuzz/artifacts/)" });
    Some(ok)
}

fn main() {
    let cli = Cli::parse();
    // `--qemu` reaches every run (and the test binaries) as XTASK_QEMU; set
    // before any thread starts.
    if let Some(q) = &cli.qemu {
        let abs = std::fs::canonicalize(q).unwrap_or_else(|_| q.clone());
        std::env::set_var(xtask::toolchain::QEMU_ENV, abs);
    }
    // Checks between options, reported like clap's own errors.
    if let Command::Run(args) = &cli.command {
        if let Err(e) = args.check() {
            let mut cmd = Cli::command();
            cmd.build();
            let run = cmd.find_subcommand_mut("run").expect("the run command");
            run.error(ErrorKind::ArgumentConflict, format!("{e:#}")).exit();
        }
    }
    let result = match &cli.command {
        Command::Run(args) => cmd_run(args),
        Command::Test(args) => cmd_test(args),
        Command::Build(args) => xtask::build::hypervisor(args.platform.dir()).map(|p| {
            println!("{}", p.display());
            0
        }),
        Command::GuestImage => xtask::build::image::guest().map(|g| {
            println!("{}\n{}", g.kernel.display(), g.initrd.display());
            0
        }),
        Command::Sim(SimCommand::Wakeup(args)) => sim::main(args).map(|_| 0),
        Command::Sim(SimCommand::Conformance) => sim::conformance(),
        Command::Bench(BenchCommand::Wakeup(args)) => xtask::bench::runner::wakeup(&args.options()).map(|_| 0),
        Command::Bench(BenchCommand::Timer(args)) => xtask::bench::timer::run(&args.options()).map(|_| 0),
        Command::Bench(BenchCommand::Exits) => xtask::bench::exits::run().map(|_| 0),
        Command::Bench(BenchCommand::SchedScale(a)) => xtask::bench::sched_scale::run(&a.pcpus, a.seconds).map(|_| 0),
        Command::Conformance(a) => {
            if a.at == xtask::conformance::Placement::Bare && a.gic == 4 {
                Err(anyhow!("--gic 4 needs EL2 (virtualization=on): not with --at bare"))
            } else {
                xtask::conformance::run(a.at, a.gic, a.pcpus, a.kernel_format)
            }
        }
        Command::Deps => {
            print!("{}", xtask::checks::deps::report(xtask::checks::deps::CRATES));
            Ok(0)
        }
        Command::Doctor => xtask::doctor::doctor().map(|_| 0),
        Command::Clean(args) => xtask::doctor::clean(args.caches).map(|_| 0),
    };
    match result {
        Ok(code) => exit(code),
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            exit(1);
        }
    }
}
