//! The UEFI boot path (`cargo xtask run --firmware uefi`, Graviton's on
//! QEMU): EDK2 with ACPI starts the hypervisor as an EFI application from
//! the ESP (`EFI/BOOT/BOOTAA64.EFI`); it finds the ACPI RSDP, reads its
//! configuration file and Dom0's kernel and initrd from the ESP, leaves
//! boot services, describes the machine from ACPI, plans Dom0's layout and
//! boots Dom0 with ACPI (`firmware::dom0_efi`: a `/chosen`-only DT, a fake
//! EFI system table and memory map, Dom0's FADT/MADT/STAO/XSDT/RSDP).

use integration_tests::*;
use std::time::Duration;
use xtask::firmware::Firmware;

#[test]
fn edk2_starts_the_hypervisor_which_boots_dom0_with_acpi() {
    let r = run(&RunOptions {
        firmware: Some(Firmware::Uefi),
        pcpus: 2,
        vcpus: 2,
        echo: false,
        cmd: Some(
            r#"ls /sys/firmware/acpi/tables; dmesg | grep -E "started at EL|ACPI: (RSDP|STAO)"; cat /proc/cmdline"#
                .into(),
        ),
        timeout: Duration::from_secs(400),
        ..Default::default()
    });
    // EDK2 booted the removable-media path of the ESP.
    assert_console(&r, "BdsDxe: starting Boot");
    // The EFI half: banner and RSDP on ConOut, at EL2 (it refuses otherwise).
    assert_console(&r, "hypervisor 0.1.0: EFI application at ");
    assert_console(&r, "EFI: ACPI 2.0 RSDP at 0x");
    // The configuration file xtask put next to the application, read
    // through LoadedImage + SimpleFileSystem, parsed after the restart.
    assert_console(&r, r"EFI: read \EFI\BOOT\hypervisor.cfg (");
    assert_console(&r, r#"(HV) INFO  EFI config [dom0]: options "dom0_mem=1024M dom0_max_vcpus=2", kernel vmlinuz ""#);
    assert_console(&r, "ramdisk initrd");
    // Dom0's kernel and initrd named there, loaded from the ESP, and the
    // boot-layout plan placing Dom0's RAM (1 GiB) in the EFI memory map's RAM.
    assert_console(&r, "EFI: loaded kernel vmlinuz at 0x");
    assert_console(&r, "EFI: loaded ramdisk initrd at 0x");
    let layout = r.console.lines().find(|l| l.contains("EFI boot: layout: ")).expect("no layout line");
    let guest = layout.split("guest RAM ").nth(1).and_then(|s| s.split(',').next()).expect(layout);
    let (lo, hi) = guest.split_once('-').expect(layout);
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).expect(layout);
    assert_eq!(hex(hi) - hex(lo), 1 << 30, "{layout}");
    // The hypervisor proper, after ExitBootServices and the restart.
    assert_console(&r, "(HV) INFO  EFI boot: RSDP 0x");
    assert_console(
        &r,
        "(HV) INFO  ACPI machine: 2 CPUs, GICv3 GICD 0x8000000 GICR 0x80a0000, ITS 0x8080000, \
         UART arm,pl011 0x9000000 INTID 33, PCIe ECAM 0x4010000000 buses 0-255, PSCI smc",
    );
    // Dom0 with ACPI: the hypervisor's tables at the end of Dom0's RAM,
    // Linux took the ACPI path through the fake system table and memory
    // map, and sees the tables the hypervisor wrote or passed on.
    assert_console(&r, "(HV) INFO  dom0 ACPI: RSDP 0x");
    assert_console(&r, "efi: EFI v2.70 by hypervisor");
    assert_console(&r, "ACPI: STAO 0x");
    // `ls` prints the tables in columns, ending with the `data` and
    // `dynamic` directories.
    let ls: Vec<&str> = r
        .console
        .lines()
        .filter(|l| matches!(l.split_whitespace().last(), Some("data" | "dynamic")))
        .flat_map(|l| l.split_whitespace())
        .collect();
    for t in ["APIC", "FACP", "GTDT", "SPCR", "MCFG", "IORT", "DSDT", "STAO"] {
        assert!(ls.contains(&t), "{t} not in /sys/firmware/acpi/tables: {ls:?}");
    }
    assert_console(&r, "CPU: All CPU(s) started at EL1");
    assert_console(&r, "efi=noruntime acpi=force");
    assert_eq!(r.guest_exit, Some(0), "{}", tail(&r.console, 30));
    // Both vCPUs ran and the guest's PSCI SYSTEM_OFF ended the run.
    assert!(stat(&r.console, 1, "exits").unwrap() > 0);
    assert_eq!(r.hv_fatal, None, "{}", tail(&r.console, 30));
    assert_eq!(r.qemu_status, Some(0), "{}", tail(&r.console, 30));
    assert!(!r.timed_out);
}
