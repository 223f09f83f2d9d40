//! `--platform graviton`: AWS Graviton's boot path on QEMU,
//! started through the same command-line code as `cargo xtask run
//! --platform graviton`: EDK2 + ACPI (`--firmware uefi` implied), a
//! Neoverse V1 core (Graviton3's; the N1, Graviton2's, with `--cpu`), GICv3 + ITS, NVMe the default disk. And more pCPUs
//! than the former fixed 8 on this path (the DT path: tests/smp.rs).

use clap::Parser;
use integration_tests::*;
use std::time::Duration;
use xtask::cli::{Cli, Command};

/// The runner's options for `cargo xtask run <line...>` (a command line
/// without shell quoting: `cmd` is passed as one word).
fn xtask_run(args: &[&str], cmd: &str) -> RunOptions {
    let mut argv = vec!["cargo-xtask", "run"];
    argv.extend_from_slice(args);
    argv.extend(["--cmd", cmd]);
    let Command::Run(run) = Cli::parse_from(argv).command else { panic!("not a run command") };
    let mut o = run.run_options(xtask::run::qemu::scratch_disk).expect("run options");
    o.echo = false;
    o.timeout = Duration::from_secs(420);
    o
}

/// The issue's first two acceptance lines, with 2 pCPUs and 2 vCPUs (the
/// platform's default, no `--pcpus`/`--vcpus` given), on
/// the platform's default disk (NVMe): the ACPI tables, EL1, the command
/// line, and fio with crc32c verification (libaio, iodepth 8) on
/// `/dev/nvme0n1` with the NVMe queues' MSIs in `/proc/interrupts`.
#[test]
fn graviton_platform_boots_dom0_with_acpi_at_el1() {
    let o = xtask_run(
        &["--platform", "graviton"],
        concat!(
            r#"ls /sys/firmware/acpi/tables; dmesg | grep "started at EL"; cat /proc/cmdline; "#,
            r#"grep -m1 "CPU part" /proc/cpuinfo; "#,
            "fio --name=v --filename=/dev/nvme0n1 --rw=randwrite --bs=4k --size=8M --ioengine=libaio --iodepth=8 ",
            "--direct=1 --verify=crc32c --do_verify=1 | grep -E 'err=|verify'; ",
            "grep nvme /proc/interrupts | sed 's/^/IRQ /'"
        ),
    );
    let r = run(&o);
    // EDK2 started the hypervisor as an EFI application at EL2, with the
    // disk in its options.
    assert_console(&r, "hypervisor 0.1.0: EFI application at ");
    assert_console(&r, r#"(HV) INFO  EFI config [dom0]: options "dom0_mem=1024M dom0_max_vcpus=2 dom0_disk=nvme""#);
    assert_console(&r, "(HV) INFO  ACPI machine: 2 CPUs, GICv3 GICD 0x8000000 GICR 0x80a0000, ITS 0x8080000");
    assert_console(&r, "(HV) INFO  2 pCPU(s) online");
    assert_console(&r, "dom0: 2 vCPU(s) on 2 pCPU(s)");
    // Dom0 sees the MADT (APIC), FADT (FACP) and GTDT, runs at EL1, booted
    // with ACPI, on QEMU's Neoverse V1 (MIDR part number 0xd40).
    assert_dom0_acpi_at_el1(&r, &["APIC", "FACP", "GTDT"]);
    assert!(r.console.lines().any(|l| l.starts_with("CPU part") && l.ends_with("0xd40")), "{}", tail(&r.console, 30));
    // fio wrote and read back 8 MiB with checksums, without an error, and
    // the NVMe queues' MSI-X interrupts arrived through the vITS.
    assert!(r.console.lines().any(|l| l.contains(": pid=") && l.contains("err= 0")), "{}", tail(&r.console, 30));
    assert!(!r.console.contains("verify: bad"), "{}", tail(&r.console, 30));
    let nvme = proc_interrupts(&r.console, "IRQ ", "nvme0q", 2);
    let nvme_irqs: u64 = nvme.iter().filter(|l| l.chip() == "ITS-MSI").map(IrqLine::total).sum();
    assert!(nvme_irqs >= 1000, "NVMe queue interrupts: {nvme_irqs}\n{}", tail(&r.console, 30));
    assert_eq!(r.guest_exit, Some(0), "{}", tail(&r.console, 30));
    assert_eq!(r.hv_fatal, None, "{}", tail(&r.console, 30));
}

/// 12 pCPUs described by the MADT: every one comes online (its stack, run
/// block and state allocated at boot), and Dom0 runs on them; on
/// Graviton2's core, the Neoverse N1 (MIDR part number 0xd0c).
#[test]
fn twelve_pcpus_come_online_on_the_uefi_path_on_neoverse_n1() {
    let o = xtask_run(
        &["--platform", "graviton", "--cpu", "neoverse-n1", "--pcpus", "12", "--vcpus", "2", "--disk", "none"],
        r#"nproc; grep -m1 "CPU part" /proc/cpuinfo"#,
    );
    let r = run(&o);
    assert_console(&r, "(HV) INFO  ACPI machine: 12 CPUs, ");
    for cpu in 1..12 {
        assert_console(&r, &format!("(HV) INFO  pCPU{cpu} online (MPIDR "));
    }
    assert_console(&r, "(HV) INFO  12 pCPU(s) online");
    assert_console(&r, "dom0: 2 vCPU(s) on 12 pCPU(s)");
    assert!(r.console.lines().any(|l| l.trim() == "2"), "nproc did not print 2:\n{}", tail(&r.console, 30));
    assert!(r.console.lines().any(|l| l.starts_with("CPU part") && l.ends_with("0xd0c")), "{}", tail(&r.console, 30));
    assert_eq!(r.guest_exit, Some(0), "{}", tail(&r.console, 30));
    assert_eq!(r.hv_fatal, None, "{}", tail(&r.console, 30));
}
