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
            r#"ls /sys/firmware/acpi/tables; dmesg | grep -E "started at EL|ACPI: (RSDP|STAO)"; cat /proc/cmdline; hvctl list; echo hvctl-rc=$?"#
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
    assert_dom0_acpi_at_el1(&r, &["APIC", "FACP", "GTDT", "SPCR", "MCFG", "IORT", "DSDT", "STAO"]);
    // hvctl finds the control device in the flat DT of an ACPI boot
    // (/sys/firmware/fdt) and lists Dom0, both vCPUs on.
    assert!(
        r.console.lines().any(|l| l.starts_with("Dom0 ") && l.contains(" 1024     2 ")),
        "{}",
        tail(&r.console, 30)
    );
    assert_console(&r, "hvctl-rc=0");
    assert_eq!(r.guest_exit, Some(0), "{}", tail(&r.console, 30));
    // Both vCPUs ran and the guest's PSCI SYSTEM_OFF ended the run.
    assert!(stat(&r.console, 1, "exits").unwrap() > 0);
    assert_eq!(r.hv_fatal, None, "{}", tail(&r.console, 30));
    assert_eq!(r.qemu_status, Some(0), "{}", tail(&r.console, 30));
    assert!(!r.timed_out);
}

/// Graviton's storage on the ACPI path: QEMU's NVMe controller beside the
/// ESP's virtio-blk-pci, both behind the host bridge Dom0 finds through the
/// MCFG and the DSDT. EDK2 puts 64-bit BARs in QEMU virt's high window at
/// 0x80_0000_0000, so the IPA space is wider than 39 bits; the BARs, like
/// every DSDT device, are mapped when Dom0 first touches them (no list of
/// QEMU's devices in the hypervisor); the queues' MSI-X go through the
/// IORT to the vITS at the host ITS's address. fio writes and verifies
/// 16 MiB. Then a hostile access: the hypervisor's heap (RAM outside
/// Dom0's) and the physical ITS's translation frame are refused with an
/// injected abort, and Dom0 goes on.
#[test]
fn nvme_over_its_msi_on_the_acpi_path() {
    let cmd = "fio --name=v --filename=/dev/nvme0n1 --rw=randwrite --bs=4k --size=16M --ioengine=libaio \
               --iodepth=8 --direct=1 --verify=crc32c --do_verify=1; s=$?; echo fio-status=$s; \
               sed 's/^/IRQ /' /proc/interrupts; \
               devmem 0x40000000 32; echo heap-status=$?; devmem 0x08090040 32; echo its-status=$?; \
               echo still-alive; exit $s";
    let img = xtask::run::qemu::scratch_disk().expect("scratch disk image");
    let nvme = xtask::cli::DiskKind::Nvme;
    let r = run(&RunOptions {
        firmware: Some(Firmware::Uefi),
        hv_args: format!("dom0_disk={}", nvme.as_str()),
        extra: vec![
            "-drive".into(),
            format!("if=none,file={},format=raw,id=d0", img.display()),
            "-device".into(),
            nvme.qemu_device().expect("QEMU's NVMe device").into(),
        ],
        pcpus: 2,
        vcpus: 2,
        echo: false,
        cmd: Some(cmd.into()),
        timeout: Duration::from_secs(500),
        ..Default::default()
    });
    assert_eq!(r.hv_fatal, None, "{}", tail(&r.console, 30));
    // A wide IPA space (QEMU's `max` CPU has 48 bits of PA), every SPI but
    // the hypervisor's UART forwarded, the ITS kept for Dom0.
    let ipa = r.console.lines().find_map(|l| l.split("dom0 stage 2: ").nth(1)).expect("no stage-2 line");
    let bits: u32 = ipa.split('-').next().unwrap().parse().expect(ipa);
    assert!(bits >= 40, "{ipa}");
    assert_console(&r, "SPIs forwarded (all but the hypervisor's UART");
    assert_console(&r, "dom0 ITS: virtual GITS control frame at 0x8080000");
    assert_console(&r, "nvme nvme0: pci function ");
    // The ITS driver records its LPI tables in the memreserve table of the
    // hypervisor's fake system table, without a warning.
    assert_console(&r, "MEMRESERVE=0x");
    assert!(!r.console.contains("WARNING: CPU"), "{}", tail(&r.console, 40));
    // fio: no error, the verify pass found every block intact.
    let job = r.console.lines().find(|l| l.starts_with("v: (groupid=")).expect("no fio job line");
    assert!(job.contains("err= 0"), "{job}");
    assert!(!r.console.contains("verify: bad") && !r.console.contains("fio: verify"), "{}", tail(&r.console, 40));
    assert_console(&r, "fio-status=0");
    assert_eq!(r.guest_exit, Some(0), "{}", tail(&r.console, 40));
    // The NVMe queues' interrupts are MSIs through the (virtual) ITS, and
    // they fired.
    let nvme = proc_interrupts(&r.console, "IRQ ", "nvme0q", 2);
    assert!(nvme.len() >= 2, "admin + I/O queues: {nvme:?}");
    for l in &nvme {
        assert_eq!(l.chip(), "ITS-MSI", "{l:?}");
    }
    let total = irq_total(&nvme);
    assert!(total >= 1000, "nvme interrupts: {nvme:?}");
    // The hypervisor took host LPIs for them and had nothing unrouted.
    let lpis = stat_line(&r.console, "irq.guest_lpi").expect("irq.guest_lpi in the stats");
    assert!(lpis >= total, "host LPIs {lpis} < guest MSIs {total}");
    assert_eq!(stat_line(&r.console, "irq.unrouted"), Some(0));
    assert_eq!(stat_line(&r.console, "vits0.lpis_dropped"), Some(0));
    // Device memory mapped on demand (the BARs at least); the two hostile
    // reads refused, aborted, and Dom0 still running.
    assert!(stat_line(&r.console, "iomem.maps").unwrap() >= 1);
    assert_eq!(stat_line(&r.console, "iomem.denied"), Some(2));
    assert_console(&r, "at IPA 0x40000000");
    assert_console(&r, "at IPA 0x8090040");
    assert_console(&r, "still-alive");
    let aborts = stat(&r.console, 0, "aborts_injected").unwrap() + stat(&r.console, 1, "aborts_injected").unwrap();
    assert_eq!(aborts, 2, "only the hostile reads aborted");
    assert!(!r.timed_out);
}
