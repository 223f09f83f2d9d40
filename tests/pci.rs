//! PCIe passthrough to Dom0 (`dom0_disk=virtio-pci|nvme`): QEMU's PCIe host
//! bridge with a virtio-blk-pci or NVMe disk behind it, handed to the guest
//! Dom0-style, with the ITS. The devices' MSIs go to the physical ITS, which
//! raises host LPIs the hypervisor turns into the guest's LPIs through its
//! virtual ITS; on a GICv4 machine the ITS injects them as vLPIs
//! itself. Data is checked end to end (fio crc32c verify) on
//! GICv3 and GICv4 machines; INTx still works when the guest turns MSIs off.

use integration_tests::*;
use xtask::build::image::Flavour;
use xtask::cli::DiskKind;

/// The disk `kind` on QEMU's PCIe bus with the scratch image, and the
/// hypervisor told so.
fn with_pci_disk(o: &mut RunOptions, kind: DiskKind) {
    let img = xtask::run::qemu::scratch_disk().expect("scratch disk image");
    o.hv_args = format!("dom0_disk={}", kind.as_str());
    o.extra = vec![
        "-drive".into(),
        format!("if=none,file={},format=raw,id=d0", img.display()),
        "-device".into(),
        kind.qemu_device().expect("a QEMU disk device").into(),
    ];
}

/// The guest script: the device's interrupt lines (each prefixed `tag`)
/// before and after 32 MiB of verified 4 KiB random writes (libaio, queue
/// depth 8).
fn fio_script(found: &str, dev: &str, irq_name: &str) -> String {
    format!(
        "dmesg | grep -F '{found}'; ls {dev}; \
         echo its=$(ls -d /proc/device-tree/intc@*/its@* 2>/dev/null | wc -l); \
         grep -E '{irq_name}' /proc/interrupts | sed 's/^/IRQ-A /'; \
         fio --name=v --filename={dev} --rw=randwrite --bs=4k --size=32M --direct=1 --ioengine=libaio \
             --iodepth=8 --verify=crc32c --do_verify=1 --output-format=terse --terse-version=3 >/tmp/out; \
         s=$?; echo fio-status=$s; echo terse=$(cut -d';' -f1-5 /tmp/out); \
         grep -E '{irq_name}' /proc/interrupts | sed 's/^/IRQ-B /'; exit $s"
    )
}

fn assert_fio_ok(r: &RunResult, found: &str) {
    assert_console(r, found);
    assert_console(r, "fio-status=0");
    assert_eq!(r.guest_exit, Some(0));
    // Terse v3: version;fio version;job;group;error.
    assert_console(r, "terse=3;fio-3.33;v;0;0");
    assert_console(r, "dom0 PCIe: /pcie@10000000 ECAM 0x4010000000+0x10000000, 3 window(s) mapped");
}

/// MSIs through the vITS: the device's interrupts are `ITS-MSI` in the
/// guest, their counts grow with the I/O, the hypervisor took host LPIs
/// for them and injected guest LPIs (GICv3) or the ITS injected them as
/// vLPIs (GICv4), and its vITS refused no command.
fn fio_verify_over_msi(kind: DiskKind, gic: u8, dev: &str, irq_name: &str, found: &str) {
    let r = run_cmd(&fio_script(found, dev, irq_name), |o| {
        o.gic = gic;
        o.pcpus = 2;
        o.vcpus = 2;
        with_pci_disk(o, kind);
    });
    assert_fio_ok(&r, found);
    assert_console(&r, "its=1");
    assert_console(&r, "dom0 ITS: virtual GITS control frame at 0x8080000");
    let (before, after) = (proc_interrupts(&r.console, "IRQ-A ", "", 2), proc_interrupts(&r.console, "IRQ-B ", "", 2));
    assert!(!after.is_empty(), "no {irq_name} line:\n{}", tail(&r.console, 40));
    for l in &after {
        assert_eq!(l.desc[0], "ITS-MSI", "IRQ {} is an MSI through the ITS: {:?}", l.irq, l.desc);
    }
    // 8192 writes and 8192 verify reads at depth 8: even with every batch
    // of 8 completions coalesced into one interrupt, more than 1000.
    let (b, a) = (irq_total(&before), irq_total(&after));
    assert!(a >= b + 1000, "{irq_name} interrupts {b} -> {a}");
    let lpis = stat_line(&r.console, "irq.guest_lpi").expect("irq.guest_lpi in the stats");
    let injected = stat(&r.console, 0, "lpis_injected").unwrap() + stat(&r.console, 1, "lpis_injected").unwrap();
    if gic == 4 {
        // GICv4 direct injection (the default there): the ITS
        // makes the guest's vLPIs pending itself; no host LPI, no list register.
        assert_eq!(lpis, 0, "host LPIs on the GICv4 path");
        assert!(injected * 100 < a - b, "guest LPIs injected {injected} of {} MSIs", a - b);
        assert!(stat_line(&r.console, "its.cmd.VMAPTI").unwrap() > 0);
    } else {
        assert!(lpis >= a - b, "host LPIs {lpis} < guest MSIs {}", a - b);
        assert!(injected >= a - b, "guest LPIs injected {injected} < guest MSIs {}", a - b);
    }
    assert_console(&r, "int_lpis=0 stalls=0 errors=0");
    assert_eq!(stat_line(&r.console, "vits0.lpis_dropped"), Some(0));
    assert_eq!(stat_line(&r.console, "its.cmd_errors"), Some(0));
    assert_eq!(stat_line(&r.console, "irq.forwarded_spi"), Some(0), "no INTx with MSIs on");
}

#[test]
fn virtio_blk_pci_fio_verify_over_msi_gicv3() {
    fio_verify_over_msi(DiskKind::VirtioPci, 3, "/dev/vda", "virtio0", "virtio_blk virtio0: [vda]");
}

#[test]
fn virtio_blk_pci_fio_verify_over_msi_gicv4() {
    fio_verify_over_msi(DiskKind::VirtioPci, 4, "/dev/vda", "virtio0", "virtio_blk virtio0: [vda]");
}

#[test]
fn nvme_fio_verify_over_msi_gicv3() {
    fio_verify_over_msi(DiskKind::Nvme, 3, "/dev/nvme0n1", "nvme0q", "nvme nvme0: pci function 0000:00:01.0");
}

#[test]
fn nvme_fio_verify_over_msi_gicv4() {
    fio_verify_over_msi(DiskKind::Nvme, 4, "/dev/nvme0n1", "nvme0q", "nvme nvme0: pci function 0000:00:01.0");
}

/// With `pci=nomsi` the guest falls back to INTx: the bridge's
/// level-triggered SPIs (35..=38 on QEMU virt), forwarded as hardware
/// interrupts.
#[test]
fn nvme_fio_verify_over_intx_when_the_guest_turns_msi_off() {
    let found = "nvme nvme0: pci function 0000:00:01.0";
    let r = run_cmd(&fio_script(found, "/dev/nvme0n1", "nvme0q"), |o| {
        with_pci_disk(o, DiskKind::Nvme);
        o.append = Some(format!("{} pci=nomsi", xtask::run::qemu::DEFAULT_GUEST_ARGS));
    });
    assert_fio_ok(&r, found);
    assert_console(&r, "INTx [35, 36, 37, 38]");
    let (before, after) = (proc_interrupts(&r.console, "IRQ-A ", "", 1), proc_interrupts(&r.console, "IRQ-B ", "", 1));
    assert_eq!(after.len(), 1, "one INTx line:\n{}", tail(&r.console, 40));
    // "14: 16 GICv3 36 Level nvme0q0, nvme0q1".
    let d = &after[0].desc;
    assert_eq!((d[0].as_str(), d[2].as_str()), ("GICv3", "Level"), "{d:?}");
    let intid: u32 = d[1].parse().unwrap();
    assert!((35..=38).contains(&intid), "INTx is SPI 3..6 on QEMU virt, got INTID {intid}");
    let (b, a) = (irq_total(&before), irq_total(&after));
    assert!(a >= b + 1000, "INTx interrupts {b} -> {a}");
    assert!(stat_line(&r.console, "irq.forwarded_spi").unwrap() >= a - b);
}

/// A non-managed MSI follows `/proc/irq/N/smp_affinity`: NVMe's admin
/// queue (nvme0q0) interrupts on vCPU0; after the guest moves it to vCPU1
/// (the vITS gets a MOVI, the host LPI follows), a namespace rescan's
/// admin commands interrupt vCPU1 and vCPU0's count stands still.
#[test]
fn moving_an_msi_with_smp_affinity_moves_its_interrupts() {
    let r = moved_msi(3);
    assert!(stat_line(&r.console, "its.cmd.MOVI").unwrap() >= 3, "the self-test's two MOVIs and the guest's");
}

/// The same on GICv4: the guest's MOVI becomes a VMOVI to vCPU1's vPE.
#[test]
fn moving_an_msi_with_smp_affinity_moves_its_vlpi_on_gicv4() {
    let r = moved_msi(4);
    assert_console(&r, "MSIs backed by GICv4 vLPIs with doorbells");
    assert!(stat_line(&r.console, "its.cmd.VMOVI").unwrap() >= 1, "the guest's MOVI as a VMOVI");
}

fn moved_msi(gic: u8) -> RunResult {
    let cmd = "N=$(sed -n 's/^ *\\([0-9]*\\):.*nvme0q0$/\\1/p' /proc/interrupts); \
               echo 1 > /sys/class/nvme/nvme0/rescan_controller; sleep 1; \
               grep nvme0q0 /proc/interrupts | sed 's/^/IRQ-A /'; \
               echo 2 > /proc/irq/$N/smp_affinity || exit 3; \
               echo 1 > /sys/class/nvme/nvme0/rescan_controller; sleep 1; \
               echo 1 > /sys/class/nvme/nvme0/rescan_controller; sleep 1; \
               grep nvme0q0 /proc/interrupts | sed 's/^/IRQ-B /'";
    let r = run_cmd(cmd, |o| {
        o.gic = gic;
        o.pcpus = 2;
        o.vcpus = 2;
        with_pci_disk(o, DiskKind::Nvme);
    });
    assert_eq!(r.guest_exit, Some(0), "{}", tail(&r.console, 40));
    let (a, b) = (proc_interrupts(&r.console, "IRQ-A ", "", 2), proc_interrupts(&r.console, "IRQ-B ", "", 2));
    assert_eq!((a.len(), b.len()), (1, 1), "{}", tail(&r.console, 40));
    let (a, b) = (&a[0], &b[0]);
    assert_eq!(a.desc[0], "ITS-MSI");
    assert!(a.counts[0] > 0, "admin queue interrupts on vCPU0 first: {:?}", a.counts);
    assert_eq!(b.counts[0], a.counts[0], "vCPU0 took none after the move: {:?} -> {:?}", a.counts, b.counts);
    assert!(b.counts[1] > a.counts[1], "vCPU1 took the admin queue's interrupts: {:?} -> {:?}", a.counts, b.counts);
    r
}

/// One pCPU, two vCPUs, guest time by instruction count, the NVMe disk
/// with its vITS: Dom0 boots through the kernel's stop_machine calls (both
/// vCPUs spinning for each other with IRQs masked, the spin detector
/// yielding between them) to the shell and verifies its writes. The entry
/// path with a vITS is longer than the spin detector's 10 us sampling
/// period; the guest must still run a whole period between two samples
/// (`sched::spin`). The kernel that ran is of `flavour` (`uname -r`).
fn one_pcpu_two_vcpus_nvme_under_icount(gic: u8, flavour: Flavour) {
    let r = run_cmd(
        "echo booted-to-shell; echo kernel-release=$(uname -r); \
         fio --name=v --filename=/dev/nvme0n1 --rw=randwrite --bs=4k --size=4M --direct=1 \
         --ioengine=libaio --iodepth=4 --verify=crc32c --do_verify=1 --output-format=terse --terse-version=3 >/tmp/out; \
         s=$?; echo fio-status=$s; echo terse=$(cut -d';' -f1-5 /tmp/out); exit $s",
        |o| {
            o.gic = gic;
            o.pcpus = 1;
            o.vcpus = 2;
            o.icount = true;
            o.flavour = flavour;
            with_pci_disk(o, DiskKind::Nvme);
        },
    );
    assert_console(&r, "booted-to-shell");
    assert_console(&r, "dom0: 2 vCPU(s) on 1 pCPU(s)");
    assert_console(&r, "fio-status=0");
    assert_console(&r, "terse=3;fio-3.33;v;0;0");
    assert_eq!(r.guest_exit, Some(0), "{}", tail(&r.console, 30));
    assert_eq!(r.hv_fatal, None);
    let release = r
        .console
        .lines()
        .find_map(|l| l.trim_end().strip_prefix("kernel-release="))
        .unwrap_or_else(|| panic!("no kernel-release line\n{}", tail(&r.console, 30)))
        .to_string();
    // The flavour asked for is the kernel that ran.
    let cloud = release.ends_with("-cloud-arm64");
    assert!(release.ends_with("-arm64") && cloud == (flavour == Flavour::Cloud), "{flavour:?}: uname -r = {release}");
}

#[test]
fn one_pcpu_two_vcpus_nvme_boot_under_icount_gicv3() {
    one_pcpu_two_vcpus_nvme_under_icount(3, Flavour::Cloud);
}

/// The same with Debian's generic kernel flavour, whose NVMe driver (and
/// its CRC and T10-PI dependencies) and virtio transports are modules the
/// initramfs loads.
#[test]
fn one_pcpu_two_vcpus_nvme_boot_under_icount_gicv3_generic_kernel() {
    one_pcpu_two_vcpus_nvme_under_icount(3, Flavour::Generic);
}

#[test]
fn one_pcpu_two_vcpus_nvme_boot_under_icount_gicv4() {
    one_pcpu_two_vcpus_nvme_under_icount(4, Flavour::Cloud);
}

#[test]
fn one_pcpu_two_vcpus_nvme_boot_under_icount_gicv4_generic_kernel() {
    one_pcpu_two_vcpus_nvme_under_icount(4, Flavour::Generic);
}
