//! Parsing tests: the documented command lines parse to what they did
//! before clap, `--help` shows every option, mistakes get suggestions.

use super::*;
use clap::error::ErrorKind;
use clap::CommandFactory;

/// Splits a command line the way a POSIX shell does for the quoting the
/// README uses ('...' and "..." without escapes inside).
fn words(line: &str) -> Vec<String> {
    let (mut v, mut cur, mut quote, mut in_word) = (Vec::new(), String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    v.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    assert!(quote.is_none(), "unterminated quote in {line}");
    if in_word {
        v.push(cur);
    }
    v
}

/// Parses `cargo xtask <line>`.
fn parse(line: &str) -> std::result::Result<Cli, clap::Error> {
    let mut argv = vec!["cargo-xtask".to_string()];
    argv.extend(words(line));
    Cli::try_parse_from(argv)
}

fn ok(line: &str) -> Command {
    match parse(line) {
        Ok(c) => c.command,
        Err(e) => panic!("`cargo xtask {line}` does not parse:\n{e}"),
    }
}

fn err(line: &str) -> clap::Error {
    match parse(line) {
        Ok(c) => panic!("`cargo xtask {line}` parsed: {c:?}"),
        Err(e) => e,
    }
}

fn run_args(line: &str) -> RunArgs {
    match ok(line) {
        Command::Run(a) => a,
        c => panic!("{line}: {c:?}"),
    }
}

/// `RunArgs::run_options` with a fixed image path for the QEMU disk.
fn run_options(line: &str) -> Result<RunOptions> {
    run_args(line).run_options(|| Ok(PathBuf::from("/scratch/disk.img")))
}

fn bench_wakeup(line: &str) -> BenchWakeupArgs {
    match ok(line) {
        Command::Bench(BenchCommand::Wakeup(a)) => a,
        c => panic!("{line}: {c:?}"),
    }
}

fn sim_wakeup(line: &str) -> SimWakeupArgs {
    match ok(line) {
        Command::Sim(SimCommand::Wakeup(a)) => a,
        c => panic!("{line}: {c:?}"),
    }
}

#[test]
fn command_definition_is_consistent() {
    Cli::command().debug_assert();
}

/// Every command line the README and the docs show, and older spellings
/// that must keep parsing.
#[test]
fn documented_examples_parse() {
    for line in [
        "run",
        "test",
        "build",
        "guest-image",
        "run --cmd 'dmesg | grep -E \"started at EL\"; uname -m'",
        "run --cmd 'uname -m' --timeout 300",
        "run --gic 4 --pcpus 2 --vcpus 4 --mem 768M",
        "run --mem 2G --cpu max,pauth-impdef=on --hv-args \"loglvl=debug sched_ratelimit_us=0\"",
        "run --kernel /tmp/Image --initrd /tmp/initrd.cpio.gz --append \"console=ttyAMA0 earlycon=pl011,0x09000000\"",
        "run --icount --disk ram --disk-latency-us 200",
        "run --disk passthrough",
        "run --disk backend",
        "run --disk none",
        "run --disk virtio-pci --gic 4",
        "run --disk nvme",
        "run --kernel-flavour generic --cmd 'uname -r' --timeout 400",
        "run --platform graviton",
        "run --platform graviton --pcpus 2 --vcpus 2 --cmd 'ls /sys/firmware/acpi/tables; dmesg | grep \"started at EL\"; cat /proc/cmdline'",
        "run --platform graviton --disk passthrough --cpu max,pauth-impdef=on",
        "bench wakeup --platform graviton --quick",
        "bench wakeup --platform graviton --quick --disk passthrough --runtime 5",
        "bench wakeup --quick",
        "bench wakeup --quick --runtime 5",
        "bench wakeup --quick --only \"1p2v unp\" --hv-args sched_lhp_grace_us=20",
        "bench wakeup --repeats 1",
        "bench wakeup --full",
        "bench wakeup --disk nvme --runtime 5",
        "bench wakeup --quick --disk virtio-pci,nvme",
        "bench timer",
        "bench timer --runtime 5",
        "bench timer --samples 1000000",
        "bench timer --samples 200000 --only 'wake-preempt -i50 timer_slop_ns=0' --hv-args sched_trace_threshold_us=150",
        "conformance",
        "conformance --at bare --pcpus 2",
        "conformance --at dom0 --gic 4 --pcpus 2",
        "conformance --at domu --pcpus 2",
        "conformance --kernel-format raw",
        "conformance --at domu --pcpus 2 --kernel-format elf",
        "run --kernel conformance.bin --kernel-load-addr 0x60000000",
        "sim wakeup",
        "sim wakeup --json /tmp/sim.json",
        "sim wakeup --granularity-us 600",
        "sim wakeup --seconds 1 --service-us 100 --submit-us 10 --switch-cost-us 2 --grace-us 40",
        "sim wakeup --seconds 1 --min-run-us 0",
    ] {
        ok(line);
    }
}

#[test]
fn run_defaults_are_the_runners_defaults() {
    let o = run_options("run").unwrap();
    assert_eq!(format!("{o:?}"), format!("{:?}", RunOptions::default()));
}

#[test]
fn run_options_map_onto_the_runner() {
    let o = run_options(
        "run --cmd 'uname -m; nproc' --gic 4 --pcpus 2 --vcpus 0 --mem 768M --cpu cortex-a57 \
         --hv-args 'loglvl=debug' --timeout 300 --icount --kernel K --initrd I --append 'console=ttyAMA0'",
    )
    .unwrap();
    assert_eq!(o.cmd.as_deref(), Some("uname -m; nproc"));
    assert_eq!((o.gic, o.pcpus, o.vcpus, o.mem_mb), (4, 2, 1, 768));
    assert_eq!(o.cpu, "cortex-a57");
    assert_eq!(o.hv_args, "loglvl=debug");
    assert_eq!(o.timeout, Duration::from_secs(300));
    assert!(o.icount);
    assert_eq!(o.kernel, Some(PathBuf::from("K")));
    assert_eq!(o.initrd, Some(PathBuf::from("I")));
    assert_eq!(o.append.as_deref(), Some("console=ttyAMA0"));
    assert!(o.extra.is_empty());
    // Sizes: G, M, or MiB without a suffix.
    assert_eq!(run_args("run --mem 2G").mem_mb, 2048);
    assert_eq!(run_args("run --mem 1g").mem_mb, 1024);
    assert_eq!(run_args("run --mem 512").mem_mb, 512);
    // Values that start with a dash are values.
    assert_eq!(run_args("run --cmd --help").cmd.as_deref(), Some("--help"));
}

#[test]
fn run_kernel_flavour_picks_the_guest_image() {
    use crate::build::image::Flavour;
    assert_eq!(run_options("run").unwrap().flavour, Flavour::Cloud);
    assert_eq!(run_options("run --kernel-flavour cloud").unwrap().flavour, Flavour::Cloud);
    let o = run_options("run --kernel-flavour generic --disk nvme --icount").unwrap();
    assert_eq!((o.flavour, o.kernel, o.initrd), (Flavour::Generic, None, None));
    let e = err("run --kernel-flavour arm64").to_string();
    assert!(e.contains("[possible values: cloud, generic]"), "{e}");
    // Your own kernel has no flavour: the built image's would be ignored.
    assert_eq!(
        run_args("run --kernel K --kernel-flavour generic").check().unwrap_err().to_string(),
        "--kernel-flavour picks the built guest image's kernel; not with --kernel"
    );
    assert!(run_args("run --kernel K --kernel-flavour cloud").check().is_ok());
}

#[test]
fn run_disk_options_become_boot_arguments() {
    let o = run_options("run --disk ram --disk-latency-us 200 --hv-args loglvl=debug").unwrap();
    assert_eq!(o.hv_args, "dom0_disk=ram dom0_disk_latency_us=200 loglvl=debug");
    assert!(o.extra.is_empty());
    assert_eq!(run_options("run --disk ram").unwrap().hv_args, "dom0_disk=ram dom0_disk_latency_us=0");
    assert_eq!(run_options("run --disk none").unwrap().hv_args, "dom0_disk=none");
    for kind in ["passthrough", "backend"] {
        let o = run_options(&format!("run --disk {kind}")).unwrap();
        assert_eq!(o.hv_args, format!("dom0_disk={kind}"));
        assert_eq!(
            o.extra,
            ["-drive", "if=none,file=/scratch/disk.img,format=raw,id=d0", "-device", "virtio-blk-device,drive=d0"]
        );
    }
    // The PCIe disks: the same image on QEMU's PCIe root bus.
    for (kind, device) in [("virtio-pci", "virtio-blk-pci,drive=d0"), ("nvme", "nvme,drive=d0,serial=hvdisk0")] {
        let o = run_options(&format!("run --disk {kind}")).unwrap();
        assert_eq!(o.hv_args, format!("dom0_disk={kind}"));
        assert_eq!(o.extra, ["-drive", "if=none,file=/scratch/disk.img,format=raw,id=d0", "-device", device]);
    }
    // Only the QEMU-device kinds make a disk image.
    let o = run_args("run --disk ram").run_options(|| panic!("no image for the RAM disk")).unwrap();
    assert!(o.extra.is_empty());
    let e =
        format!("{:#}", run_args("run --disk backend").run_options(|| Err(std::io::Error::other("full"))).unwrap_err());
    assert_eq!(e, "disk image: full");
}

#[test]
fn run_domu_options() {
    let o = run_options("run --domu 2 --domu-cmd 'echo hi' --domu-mem 512M --domu-vcpus 0 --cmd true").unwrap();
    let d = o.domus.expect("DomUs");
    assert_eq!((d.count, d.cmd.as_deref(), d.mem_mb, d.vcpus), (2, Some("echo hi"), 512, 1));
    let d = run_options("run --domu 1").unwrap().domus.expect("DomUs");
    assert_eq!(d, crate::run::domu::DomuOptions::default());
    assert_eq!(run_options("run --domu 0").unwrap().domus, None);
    for line in
        ["run --domu-cmd true", "run --domu-mem 512M", "run --domu-vcpus 2", "run --domu-weight 5", "run --domu-cap 5"]
    {
        assert_eq!(
            run_args(line).check().unwrap_err().to_string(),
            "--domu-cmd, --domu-mem, --domu-vcpus, --domu-weight and --domu-cap go with --domu N"
        );
    }
    // Weights and caps: one per DomU, in order, or one for all.
    let d = run_options("run --domu 3 --domu-weight 512,256,128 --domu-cap 25").unwrap().domus.unwrap();
    assert_eq!((d.weights, d.caps), (vec![512, 256, 128], vec![25]));
    assert!(run_args("run --domu 3 --domu-weight 1,2")
        .check()
        .unwrap_err()
        .to_string()
        .starts_with("--domu-weight: 2 values"));
    assert!(err("run --domu 1 --domu-cap x").to_string().contains("--domu-cap"));
    for line in ["run --domu 1 --firmware uefi", "run --domu 1 --platform fvp"] {
        assert!(
            run_args(line).check().unwrap_err().to_string().starts_with("--domu is for QEMU with a device tree"),
            "{line}"
        );
    }
    assert!(run_args("run --domu 1 --firmware tf-a").check().is_ok());
    assert!(err("run --domu 1 --domu-mem 64M").to_string().contains("must be at least 128M"));
}

#[test]
fn run_rejects_bad_values() {
    let e = err("run --mem 64M").to_string();
    assert!(e.contains("must be at least 128M"), "{e}");
    assert!(err("run --mem 127").to_string().contains("must be at least 128M"));
    assert!(err("run --mem 1.5G").to_string().contains("bad size 1.5G"));
    assert!(err("run --mem 99999999999999999999G").to_string().contains("bad size"));
    let e = err("run --gic 5");
    assert_eq!(e.kind(), ErrorKind::InvalidValue);
    assert!(e.to_string().contains("[possible values: 3, 4]"), "{e}");
    let e = err("run --disk floppy").to_string();
    assert!(e.contains("[possible values: passthrough, ram, backend, none, virtio-pci, nvme]"), "{e}");
    assert_eq!(err("run --pcpus two").kind(), ErrorKind::ValueValidation);
    assert_eq!(err("run --cmd").kind(), ErrorKind::InvalidValue);
    assert_eq!(err("run extra").kind(), ErrorKind::UnknownArgument);
    // The RAM disk's service time needs the RAM disk.
    for line in ["run --disk-latency-us 5", "run --disk backend --disk-latency-us 5"] {
        assert_eq!(run_args(line).check().unwrap_err().to_string(), "--disk-latency-us goes with --disk ram");
        assert_eq!(run_options(line).unwrap_err().to_string(), "--disk-latency-us goes with --disk ram");
    }
    assert!(run_args("run --disk ram --disk-latency-us 5").check().is_ok());
    // The UEFI path boots Dom0 (with ACPI): it takes a command.
    assert!(run_args("run --firmware uefi --cmd true").check().is_ok());
    assert!(run_args("run --firmware uefi").check().is_ok());
}

/// `--platform graviton`: EDK2 + ACPI (`--firmware uefi`), Neoverse V1 and
/// NVMe unless `--cpu`/`--disk` say otherwise; the qemu-virt image.
#[test]
fn graviton_platform_is_uefi_neoverse_and_nvme() {
    use crate::firmware::Firmware;
    let o = run_options("run --platform graviton --pcpus 2 --vcpus 2 --cmd true").unwrap();
    assert_eq!(o.firmware, Some(Firmware::Uefi));
    assert_eq!(o.cpu, "neoverse-v1");
    assert_eq!((o.gic, o.pcpus, o.vcpus), (3, 2, 2));
    assert_eq!(o.hv_args, "dom0_disk=nvme");
    assert_eq!(
        o.extra,
        ["-drive", "if=none,file=/scratch/disk.img,format=raw,id=d0", "-device", "nvme,drive=d0,serial=hvdisk0"]
    );
    // --cpu and --disk still choose.
    let o = run_options("run --platform graviton --cpu cortex-a72 --disk passthrough").unwrap();
    assert_eq!((o.cpu.as_str(), o.hv_args.as_str()), ("cortex-a72", "dom0_disk=passthrough"));
    assert_eq!(o.extra[3], "virtio-blk-device,drive=d0");
    assert_eq!(run_options("run --platform graviton --disk none").unwrap().hv_args, "dom0_disk=none");
    // UEFI only; EDK2 loads the image where it likes.
    assert!(run_args("run --platform graviton --firmware uefi").check().is_ok());
    let e = format!("{:#}", run_args("run --platform graviton --firmware tf-a").check().unwrap_err());
    assert!(e.contains("boots through UEFI"), "{e}");
    assert!(run_args("run --platform graviton --hv-addr 0x48000000").check().is_err());
    assert!(run_args("run --platform graviton --dry-run").check().is_err());
    // The qemu-virt image; QEMU virt itself keeps its defaults.
    assert_eq!(PlatformKind::Graviton.dir(), "qemu-virt");
    let o = run_options("run").unwrap();
    assert_eq!((o.firmware, o.cpu.as_str()), (None, "max,pauth-impdef=on"));
}

#[test]
fn bench_on_graviton_runs_the_quick_matrix_on_its_disk() {
    use crate::bench::{runner::cases, Disk, Sched, Topology};
    let b = bench_wakeup("bench wakeup --platform graviton --quick");
    assert_eq!(b.platform, PlatformKind::Graviton);
    let c = cases(&b.options()).unwrap();
    assert_eq!(c.len(), 4);
    assert!(c.iter().all(|c| c.disk == Disk::Nvme && c.delivery.gic() == 3), "{c:?}");
    for t in [Topology::OneP1V, Topology::OneP2V] {
        for s in [Sched::XenCompat, Sched::WakePreempt] {
            assert!(c.iter().any(|c| c.topology == t && c.sched == s), "{t:?} {s:?} missing: {c:?}");
        }
    }
    let c = cases(&bench_wakeup("bench wakeup --platform graviton --quick --disk passthrough,nvme").options()).unwrap();
    assert_eq!(c.iter().filter(|c| c.disk == Disk::Passthrough).count(), 4);
    assert_eq!(c.iter().filter(|c| c.disk == Disk::Nvme).count(), 4);
    assert!(cases(&bench_wakeup("bench wakeup --platform fvp --quick").options()).is_err());
    assert_eq!(err("bench wakeup --platform graviton --full").kind(), ErrorKind::ArgumentConflict);
    // QEMU virt's quick matrix is unchanged (the RAM disk).
    assert!(cases(&bench_wakeup("bench wakeup --quick").options()).unwrap().iter().all(|c| c.disk == Disk::Ram));
}

#[test]
fn test_forwards_its_arguments_to_cargo_test() {
    let args = |line: &str| match ok(line) {
        Command::Test(a) => a.cargo_test_args().join(" "),
        c => panic!("{c:?}"),
    };
    // What `.ci/run` runs.
    assert_eq!(args("test"), "test --workspace --lib --bins --tests -- --test-threads=1");
    assert_eq!(args("test -p xtask"), "test --workspace --lib --bins --tests -p xtask -- --test-threads=1");
    assert_eq!(
        args("test --release -p hypervisor sched"),
        "test --workspace --lib --bins --tests --release -p hypervisor sched -- --test-threads=1"
    );
    // After `--`: the test binaries' arguments, wherever the `--` is.
    assert_eq!(args("test -- --nocapture"), "test --workspace --lib --bins --tests -- --test-threads=1 --nocapture");
    assert_eq!(
        args("test -p xtask -- --nocapture cli"),
        "test --workspace --lib --bins --tests -p xtask -- --test-threads=1 --nocapture cli"
    );
}

#[test]
fn bench_options_and_defaults() {
    let b = bench_wakeup("bench wakeup");
    assert!(!b.quick && !b.full);
    assert_eq!((b.runtime, b.repeats(), b.only.as_deref(), b.hv_args.as_deref()), (10, 3, None, None));
    assert_eq!(bench_wakeup("bench wakeup --quick").repeats(), 1);
    assert_eq!(bench_wakeup("bench wakeup --quick --repeats 3").repeats(), 3);
    assert_eq!(bench_wakeup("bench wakeup --repeats 0").repeats(), 1);
    // --quick wins over --full, as before: both are accepted.
    let b = bench_wakeup(
        "bench wakeup --quick --full --runtime 5 --only '1p2v unp' --hv-args 'sched_lhp_grace_us=20 loglvl=debug'",
    );
    assert!(b.quick && b.full);
    assert_eq!(b.runtime, 5);
    assert_eq!(b.only.as_deref(), Some("1p2v unp"));
    assert_eq!(b.hv_args.as_deref(), Some("sched_lhp_grace_us=20 loglvl=debug"));
    match ok("bench timer") {
        Command::Bench(BenchCommand::Timer(t)) => {
            assert_eq!((t.runtime, t.samples), (None, crate::bench::timer::DEFAULT_SAMPLES))
        }
        c => panic!("{c:?}"),
    }
    match ok("bench timer --runtime 2 --samples 1000000 --only -i50 --hv-args sched_trace_threshold_us=150") {
        Command::Bench(BenchCommand::Timer(t)) => {
            assert_eq!((t.runtime, t.samples), (Some(2), 1_000_000));
            assert_eq!(t.only.as_deref(), Some("-i50"));
            assert_eq!(t.hv_args.as_deref(), Some("sched_trace_threshold_us=150"));
        }
        c => panic!("{c:?}"),
    }
    assert_eq!(err("bench wakeup --runtime x").kind(), ErrorKind::ValueValidation);
    // --disk: a comma list of bench disks; quick-style, so not with --full.
    use crate::bench::Disk;
    assert!(bench_wakeup("bench wakeup").disk.is_empty());
    assert_eq!(bench_wakeup("bench wakeup --disk nvme --runtime 5").disk, [Disk::Nvme]);
    let b = bench_wakeup("bench wakeup --quick --disk nvme,virtio-pci --disk ram");
    assert_eq!(b.disk, [Disk::Nvme, Disk::VirtioPci, Disk::Ram]);
    assert_eq!(b.repeats(), 1);
    assert_eq!(err("bench wakeup --disk nvme --full").kind(), ErrorKind::ArgumentConflict);
    let e = err("bench wakeup --disk floppy");
    assert_eq!(e.kind(), ErrorKind::ValueValidation);
    assert!(e.to_string().contains("passthrough, backend, ram, virtio-pci, nvme"), "{e}");
    assert_eq!(err("bench").kind(), ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand);
    assert_eq!(err("bench nothing").kind(), ErrorKind::InvalidSubcommand);
}

#[test]
fn sim_options_and_defaults() {
    let s = sim_wakeup("sim wakeup");
    assert_eq!(
        (s.json, s.seconds, s.service_us, s.submit_us, s.switch_cost_us, s.granularity_us, s.grace_us),
        (None, 10, 200, 20, 5, None, None)
    );
    let s = sim_wakeup("sim wakeup --json out.json --seconds 2 --service-us 100 --submit-us 10 --switch-cost-us 0 --granularity-us 600 --grace-us 40");
    assert_eq!(
        (s.json, s.seconds, s.service_us, s.submit_us, s.switch_cost_us, s.granularity_us, s.grace_us),
        (Some(PathBuf::from("out.json")), 2, 100, 10, 0, Some(600), Some(40))
    );
    for line in ["sim wakeup --seconds 0", "sim wakeup --submit-us 0"] {
        let e = err(line).to_string();
        assert!(e.contains("must be > 0"), "{e}");
    }
    assert_eq!(err("sim").kind(), ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand);
}

/// Every (sub)command, with its path, e.g. `["bench", "wakeup"]`, less
/// clap's own `help` subcommands.
fn all_commands() -> Vec<(Vec<String>, clap::Command)> {
    fn walk(path: Vec<String>, cmd: &clap::Command, out: &mut Vec<(Vec<String>, clap::Command)>) {
        out.push((path.clone(), cmd.clone()));
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let mut p = path.clone();
            p.push(sub.get_name().to_string());
            walk(p, sub, out);
        }
    }
    let mut cmd = Cli::command();
    cmd.build();
    let mut out = Vec::new();
    walk(Vec::new(), &cmd, &mut out);
    out
}

#[test]
fn help_of_every_command_shows_every_option() {
    let cmds = all_commands();
    for want in ["run", "test", "build", "guest-image", "sim", "sim wakeup", "bench", "bench wakeup", "bench timer"] {
        assert!(cmds.iter().any(|(p, _)| p.join(" ") == want), "no command {want}");
    }
    for (path, mut cmd) in cmds {
        // What `cargo xtask <path> --help` and `-h` print.
        let e = parse(&format!("{} --help", path.join(" "))).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DisplayHelp, "{path:?}");
        let long = e.to_string();
        let short = cmd.render_help().to_string();
        for arg in cmd.get_arguments() {
            let name = match arg.get_long() {
                Some(l) => format!("--{l}"),
                None => arg.get_value_names().map(|v| v[0].to_string()).unwrap_or_else(|| arg.get_id().to_string()),
            };
            assert!(long.contains(&name), "`{} --help` lacks {name}:\n{long}", path.join(" "));
            assert!(short.contains(&name), "`{} -h` lacks {name}:\n{short}", path.join(" "));
        }
    }
}

/// The options documented before clap keep their names.
#[test]
fn option_names_are_the_documented_ones() {
    let longs = |path: &[&str]| -> Vec<String> {
        let cmds = all_commands();
        let (_, cmd) = cmds.iter().find(|(p, _)| p.iter().map(String::as_str).eq(path.iter().copied())).unwrap();
        let mut v: Vec<String> = cmd.get_arguments().filter_map(|a| a.get_long()).map(|l| format!("--{l}")).collect();
        v.sort();
        v
    };
    let sorted = |a: &[&str]| {
        let mut v: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    };
    assert_eq!(
        longs(&["run"]),
        sorted(&[
            "--cmd",
            "--gic",
            "--pcpus",
            "--vcpus",
            "--mem",
            "--cpu",
            "--hv-args",
            "--timeout",
            "--kernel",
            "--initrd",
            "--kernel-flavour",
            "--kernel-addr",
            "--initrd-addr",
            "--kernel-load-addr",
            "--append",
            "--icount",
            "--iommu",
            "--disk",
            "--disk-latency-us",
            "--firmware",
            "--platform",
            "--dry-run",
            "--fvp",
            "--tf-a",
            "--disk-image",
            "--hv-addr",
            "--hv-entry",
            "--domu",
            "--domu-cmd",
            "--domu-mem",
            "--domu-pci",
            "--domu-pool",
            "--domu-vcpus",
            "--domu-weight",
            "--domu-cap",
            "--qemu",
            "--help"
        ])
    );
    assert_eq!(
        longs(&["bench", "wakeup"]),
        sorted(&[
            "--same-boot",
            "--quick",
            "--full",
            "--disk",
            "--gic",
            "--runtime",
            "--repeats",
            "--only",
            "--hv-args",
            "--platform",
            "--qemu",
            "--help"
        ])
    );
    assert_eq!(
        longs(&["bench", "timer"]),
        sorted(&["--samples", "--runtime", "--only", "--hv-args", "--breaktrace", "--qemu", "--help"])
    );
    assert_eq!(
        longs(&["sim", "wakeup"]),
        sorted(&[
            "--json",
            "--seconds",
            "--service-us",
            "--submit-us",
            "--switch-cost-us",
            "--granularity-us",
            "--grace-us",
            "--min-run-us",
            "--qemu",
            "--help"
        ])
    );
}

/// The README's table of `cargo xtask run` options names exactly the
/// options `run` has.
#[test]
fn readme_run_table_matches_the_parser() {
    let readme = std::fs::read_to_string(crate::root().join("README.md")).unwrap();
    let start = readme.find("### `cargo xtask run` options").expect("README section");
    let table: Vec<&str> =
        readme[start..].lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')).collect();
    let mut documented: Vec<String> = table
        .iter()
        .filter_map(|row| row.split('|').nth(1))
        .flat_map(|cell| {
            cell.split(['`', ' ', '/'])
                .filter(|w| w.starts_with("--") && w[2..].starts_with(|c: char| c.is_ascii_lowercase()))
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect();
    documented.sort();
    documented.dedup();
    let cmds = all_commands();
    let (_, run) = cmds.iter().find(|(p, _)| p == &["run"]).unwrap();
    let mut parsed: Vec<String> =
        run.get_arguments().filter_map(|a| a.get_long()).filter(|l| *l != "help").map(|l| format!("--{l}")).collect();
    parsed.sort();
    assert_eq!(documented, parsed);
}

#[test]
fn misspelt_options_and_commands_get_suggestions() {
    for (line, tip) in [
        ("run --vcpu 2", "tip: a similar argument exists: '--vcpus'"),
        ("run --hvargs loglvl=debug", "tip: a similar argument exists: '--hv-args'"),
        ("run --disk-latency 5", "tip: a similar argument exists: '--disk-latency-us'"),
        ("bench wakeup --quik", "tip: a similar argument exists: '--quick'"),
        ("bench wakeup --repeat 2", "tip: a similar argument exists: '--repeats'"),
        ("bench timer --runtim 2", "tip: a similar argument exists: '--runtime'"),
        ("sim wakeup --grace 40", "tip: a similar argument exists: '--grace-us'"),
        ("runn", "tip: a similar subcommand exists: 'run'"),
        ("bulid", "tip: a similar subcommand exists: 'build'"),
        ("bench wakup", "tip: a similar subcommand exists: 'wakeup'"),
        ("guest-imag", "tip: a similar subcommand exists: 'guest-image'"),
    ] {
        let e = err(line);
        assert!(
            matches!(e.kind(), ErrorKind::UnknownArgument | ErrorKind::InvalidSubcommand),
            "{line}: {:?}",
            e.kind()
        );
        let msg = e.to_string();
        assert!(msg.contains(tip), "`cargo xtask {line}`:\n{msg}");
    }
    let e = err("run --disk backed").to_string();
    assert!(e.contains("tip: a similar value exists: 'backend'"), "{e}");
}

#[test]
fn no_command_prints_the_help() {
    let e = err("");
    assert_eq!(e.kind(), ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand);
    let help = e.to_string();
    for cmd in ["run", "test", "build", "guest-image", "sim", "bench"] {
        assert!(help.contains(&format!("  {cmd} ")), "{help}");
    }
    assert_eq!(err("help run").kind(), ErrorKind::DisplayHelp);
}
