//! PCIe passthrough to Dom0 (`dom0_disk=virtio-pci|nvme`): QEMU's PCIe host
//! bridge with a virtio-blk-pci or NVMe disk behind it, handed to the guest
//! Dom0-style. The guest DTB has no ITS yet, so the devices use INTx: the
//! bridge's level-triggered SPIs, forwarded as hardware interrupts. Data is
//! checked end to end (fio crc32c verify) on GICv3 and GICv4 machines.

use integration_tests::*;
use xtask::cli::DiskKind;

/// The disk `kind` on QEMU's PCIe bus with the scratch image, and the
/// hypervisor told so.
fn with_pci_disk(o: &mut RunOptions, kind: DiskKind) {
    let img = xtask::qemu::scratch_disk().expect("scratch disk image");
    o.hv_args = format!("dom0_disk={}", kind.as_str());
    o.extra = vec![
        "-drive".into(),
        format!("if=none,file={},format=raw,id=d0", img.display()),
        "-device".into(),
        kind.qemu_device().expect("a QEMU disk device").into(),
    ];
}

/// Boots with the PCIe disk, prints the device's `/proc/interrupts` line
/// before and after 32 MiB of verified 4 KiB random writes (libaio, queue
/// depth 8), and checks: the device was found, fio reports no error, the
/// interrupt is a GIC INTx SPI (35..=38, level) whose count grew with the
/// I/O, and the guest saw no ITS.
fn fio_verify_over_intx(kind: DiskKind, gic: u8, dev: &str, irq_name: &str, found: &str) {
    let cmd = format!(
        "dmesg | grep -F '{found}'; ls {dev}; \
         echo its=$(ls -d /proc/device-tree/intc@*/its@* 2>/dev/null | wc -l); \
         echo IRQ-A $(grep -E '{irq_name}' /proc/interrupts); \
         fio --name=v --filename={dev} --rw=randwrite --bs=4k --size=32M --direct=1 --ioengine=libaio \
             --iodepth=8 --verify=crc32c --do_verify=1 --output-format=terse --terse-version=3 >/tmp/out; \
         s=$?; echo fio-status=$s; echo terse=$(cut -d';' -f1-5 /tmp/out); \
         echo IRQ-B $(grep -E '{irq_name}' /proc/interrupts); exit $s"
    );
    let r = run_cmd(&cmd, |o| {
        o.gic = gic;
        with_pci_disk(o, kind);
    });
    assert_console(&r, found);
    assert_console(&r, "fio-status=0");
    assert_eq!(r.guest_exit, Some(0));
    // Terse v3: version;fio version;job;group;error.
    assert_console(&r, "terse=3;fio-3.33;v;0;0");
    assert_console(&r, "its=0");
    // The hypervisor passed the bridge through with its INTx SPIs.
    assert_console(
        &r,
        "dom0 PCIe: /pcie@10000000 ECAM 0x4010000000+0x10000000, 2 window(s) mapped, INTx [35, 36, 37, 38]",
    );
    let irq = |tag: &str| -> (u64, u32, String) {
        let line = r
            .console
            .lines()
            .find(|l| l.starts_with(tag))
            .unwrap_or_else(|| panic!("no {tag} line:\n{}", tail(&r.console, 40)));
        // "IRQ-A 14: 16 GICv3 36 Level nvme0q0, nvme0q1" (one CPU).
        let f: Vec<&str> = line.split_whitespace().collect();
        assert!(f.len() >= 6, "{line}");
        (f[2].parse().unwrap(), f[4].parse().unwrap(), format!("{} {}", f[3], f[5]))
    };
    let (before, intid, how) = irq("IRQ-A ");
    let (after, intid_b, _) = irq("IRQ-B ");
    assert_eq!(intid, intid_b);
    assert!((35..=38).contains(&intid), "INTx is SPI 3..6 on QEMU virt, got INTID {intid}");
    assert_eq!(how, "GICv3 Level", "a level-triggered GIC interrupt, not an MSI");
    // 8192 writes and 8192 verify reads at depth 8: even with every batch
    // of 8 completions coalesced into one interrupt, more than 1000.
    assert!(after >= before + 1000, "{irq_name} interrupts {before} -> {after}");
}

#[test]
fn virtio_blk_pci_fio_verify_over_intx_gicv3() {
    fio_verify_over_intx(DiskKind::VirtioPci, 3, "/dev/vda", "virtio0", "virtio_blk virtio0: [vda]");
}

#[test]
fn virtio_blk_pci_fio_verify_over_intx_gicv4() {
    fio_verify_over_intx(DiskKind::VirtioPci, 4, "/dev/vda", "virtio0", "virtio_blk virtio0: [vda]");
}

#[test]
fn nvme_fio_verify_over_intx_gicv3() {
    fio_verify_over_intx(DiskKind::Nvme, 3, "/dev/nvme0n1", "nvme0q", "nvme nvme0: pci function 0000:00:01.0");
}

#[test]
fn nvme_fio_verify_over_intx_gicv4() {
    fio_verify_over_intx(DiskKind::Nvme, 4, "/dev/nvme0n1", "nvme0q", "nvme nvme0: pci function 0000:00:01.0");
}
