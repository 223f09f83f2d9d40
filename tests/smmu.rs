//! The SMMUv3 confines DMA (`--iommu`: QEMU virt's PCIe root complex
//! behind an SMMUv3 doing stage 2). Dom0's NVMe works through it (data
//! verified end to end), Dom0 never sees the SMMU, and a Dom0 that points
//! the NVMe controller's admin queues at the hypervisor's own image gets a
//! translation fault counted by the hypervisor while the image stays as it
//! was. The same attack with `iommu=off` does change the image, which is
//! what shows the first test can fail.

use integration_tests::*;
use xtask::cli::DiskKind;

/// Where `cargo xtask run` loads the hypervisor by default (its image
/// starts there: the arm64 Image header, inside the checksummed range).
const HV_IMAGE: u64 = 0x4020_0000;

/// NVMe on the PCIe root bus behind the SMMU, the hypervisor told so.
fn with_nvme_behind_smmu(o: &mut RunOptions, hv_args: &str) {
    let img = xtask::run::qemu::scratch_disk().expect("scratch disk image");
    o.hv_args = format!("dom0_disk=nvme {hv_args}");
    o.iommu = true;
    o.extra = vec![
        "-drive".into(),
        format!("if=none,file={},format=raw,id=d0", img.display()),
        "-device".into(),
        DiskKind::Nvme.qemu_device().expect("NVMe").into(),
    ];
}

/// The stats line `name=0x...` as a number.
fn hex_stat(console: &str, name: &str) -> Option<u64> {
    let prefix = format!("{name}=0x");
    console
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix(&prefix).and_then(|v| u64::from_str_radix(v.trim(), 16).ok()))
}

/// One boot: Dom0's fio verify through the SMMU, then the attack.
#[test]
fn dom0_nvme_through_the_smmu_and_an_admin_queue_aimed_at_the_hypervisor() {
    let cmd = format!(
        "dmesg | grep -ci 'smmu' | sed 's/^/smmu-lines=/'; \
         echo smmu-nodes=$(find /proc/device-tree -name 'smmu*' | wc -l); \
         echo iommu-map=$(find /proc/device-tree -name 'iommu-map' | wc -l); \
         echo iommu-groups=$(ls /sys/kernel/iommu_groups 2>/dev/null | wc -l); \
         fio --name=v --filename=/dev/nvme0n1 --rw=randwrite --bs=4k --size=32M --direct=1 --ioengine=libaio \
             --iodepth=8 --verify=crc32c --do_verify=1 --output-format=terse --terse-version=3 >/tmp/out; \
         s=$?; echo fio-status=$s; echo terse=$(cut -d';' -f1-5 /tmp/out); \
         {}; exit $s",
        admin_queue_attack()
    );
    let r = run_cmd(&cmd, |o| {
        o.pcpus = 2;
        o.vcpus = 2;
        with_nvme_behind_smmu(o, "");
    });
    assert_console(&r, "SMMU0: SMMUv3 at 0x9050000, stage 2 for DMA");
    assert_console(&r, "d0: DMA of SMMU0 streams 0x0..0xfff confined to its RAM and the ITS doorbell");
    // Dom0 sees no SMMU: no node, no map, no driver line, no IOMMU group.
    assert_console(&r, "smmu-lines=0");
    assert_console(&r, "smmu-nodes=0");
    assert_console(&r, "iommu-map=0");
    assert_console(&r, "iommu-groups=0");
    // fio through the SMMU: every block read back as written; its MSIs
    // reached the ITS through the doorbell page.
    assert_console(&r, "fio-status=0");
    assert_console(&r, "terse=3;fio-3.33;v;0;0");
    assert_eq!(r.guest_exit, Some(0), "tail:\n{}", tail(&r.console, 40));
    assert!(stat_line(&r.console, "irq.guest_lpi").unwrap() > 1000, "MSIs reached the ITS through the SMMU");
    // The streams are Dom0's, under its VMID.
    assert_console(&r, "smmu0.d0.streams=0x0+0x1000");
    assert_eq!(stat_line(&r.console, "smmu0.d0.vmid"), Some(1));
    assert_eq!(stat_line(&r.console, "smmu0.streams_attached"), Some(0x1000));
    assert_eq!(stat_line(&r.console, "smmu0.cmdq_errors"), Some(0));
    // The attack: the controller's read of its command from the
    // hypervisor's image faulted, was counted for Dom0 and logged; the
    // image is as it was at boot; Dom0 ran on.
    assert_console(&r, "attack-done");
    assert_console(&r, "still-running");
    assert!(stat_line(&r.console, "smmu0.events_translation").unwrap() >= 1, "tail:\n{}", tail(&r.console, 60));
    assert!(stat_line(&r.console, "smmu0.d0.faults").unwrap() >= 1);
    assert_console(&r, "SMMU0: F_TRANSLATION on stream 0x8 (d0), read of IPA 0x40200000");
    let (boot, now) =
        (hex_stat(&r.console, "host.image_checksum_boot"), hex_stat(&r.console, "host.image_checksum_now"));
    assert!(boot.is_some());
    assert_eq!(boot, now, "the hypervisor's image changed");
}

/// Dom0 aims its NVMe controller's admin queues at the hypervisor's image.
fn admin_queue_attack() -> String {
    format!("{}; echo still-running", nvme_admin_queue_attack("0000:00:01.0", HV_IMAGE))
}

/// The control: without the SMMU the same attack writes a completion into
/// the hypervisor's image, and the checksum sees it.
#[test]
fn without_the_smmu_the_same_attack_reaches_the_hypervisor() {
    let r = run_cmd(&admin_queue_attack(), |o| with_nvme_behind_smmu(o, "iommu=off"));
    assert_console(&r, "attack-done");
    assert_console(&r, "iommu=off: 1 SMMU(s) not used");
    let (boot, now) =
        (hex_stat(&r.console, "host.image_checksum_boot"), hex_stat(&r.console, "host.image_checksum_now"));
    assert!(boot.is_some() && now.is_some(), "tail:\n{}", tail(&r.console, 60));
    assert_ne!(boot, now, "the attack did not reach the image: the SMMU test above proves nothing");
}

/// The ACPI path (`--platform graviton --iommu`: EDK2, QEMU's IORT with
/// RC → SMMUv3 → ITS): the hypervisor drives the SMMU the IORT names,
/// Dom0's IORT has no SMMU node (its root complex maps straight to the
/// ITS, so Linux probes no SMMU and makes no IOMMU group), and its NVMe
/// works through the SMMU with its MSIs.
#[test]
fn acpi_dom0_nvme_through_the_smmu_the_iort_names() {
    use clap::Parser;
    let argv = [
        "cargo-xtask",
        "run",
        "--platform",
        "graviton",
        "--iommu",
        "--cmd",
        "dmesg | grep -ci 'smmu' | sed 's/^/smmu-lines=/'; \
         echo iommu-groups=$(ls /sys/kernel/iommu_groups 2>/dev/null | wc -l); \
         fio --name=v --filename=/dev/nvme0n1 --rw=randwrite --bs=4k --size=8M --direct=1 --ioengine=libaio \
             --iodepth=8 --verify=crc32c --do_verify=1 --output-format=terse --terse-version=3 >/tmp/out; \
         s=$?; echo fio-status=$s; echo terse=$(cut -d';' -f1-5 /tmp/out); exit $s",
    ];
    let xtask::cli::Command::Run(args) = xtask::cli::Cli::parse_from(argv).command else { panic!("not a run command") };
    let mut o = args.run_options(xtask::run::qemu::scratch_disk).expect("run options");
    o.echo = false;
    o.timeout = std::time::Duration::from_secs(420);
    let r = run(&o);
    assert_console(&r, "SMMU0: SMMUv3 at 0x9050000, stage 2 for DMA");
    assert_console(&r, "d0: DMA of SMMU0 streams 0x0..0xff confined to its RAM and the ITS doorbell");
    assert_console(&r, "smmu-lines=0");
    assert_console(&r, "iommu-groups=0");
    assert_console(&r, "fio-status=0");
    assert_console(&r, "terse=3;fio-3.33;v;0;0");
    assert_eq!(r.guest_exit, Some(0));
    assert_console(&r, "smmu0.d0.streams=0x0+0x100");
    assert_eq!(stat_line(&r.console, "smmu0.events"), Some(0));
    assert!(stat_line(&r.console, "irq.guest_lpi").unwrap() > 100, "MSIs reached the ITS through the SMMU");
}
