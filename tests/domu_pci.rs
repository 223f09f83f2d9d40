//! A PCIe function assigned to a DomU (`--domu-pci`, `hv,pci-assigned`):
//! QEMU puts a second NVMe controller at 0000:00:02.0 behind the SMMU.
//! The DomU drives it through its own host bridge and vITS (fio verify,
//! MSI-X through its vITS), Dom0 drives its own NVMe beside it and never
//! sees the DomU's, and the DomU's controller pointed at memory outside
//! the DomU's RAM faults in the SMMU while Dom0 runs on.

use integration_tests::*;

/// fio verify on /dev/nvme0n1: its `err=` line and `fio-status=N`.
fn fio_verify(size: &str) -> String {
    format!(
        "fio --name=v --filename=/dev/nvme0n1 --rw=randwrite --bs=4k --size={size} --direct=1 --ioengine=libaio \
         --iodepth=8 --verify=crc32c --do_verify=1 </dev/null >/tmp/fio.out 2>&1; s=$?; grep 'err=' /tmp/fio.out; \
         echo fio-status=$s"
    )
}

/// Host RAM of Dom0's (the DomU's own RAM is guest-physical
/// 0x40000000-0x60000000, so this IPA is not the DomU's): where the DomU
/// aims its controller's admin queues (`nvme_admin_queue_attack`).
const OUTSIDE: u64 = 0x9000_0000;

#[test]
fn a_domu_drives_its_own_nvme_beside_dom0s_and_its_dma_stays_in_its_ram() {
    let r = domu_with_nvme("3");
    assert_console(&r, "d1 ITS: virtual GITS control frame at 0x8080000, MSIs backed by host LPIs");
}

/// On a GICv4 machine the DomU's MSIs are vLPIs of its own vPEs (IDs after
/// Dom0's), their doorbells routed in the host's table, exactly as Dom0's.
#[test]
fn on_gicv4_the_domus_msis_are_vlpis_with_doorbells() {
    let r = domu_with_nvme("4");
    assert_console(&r, "d1 ITS: virtual GITS control frame at 0x8080000, MSIs backed by GICv4 vLPIs with doorbells");
    assert_console(&r, "dom0 ITS: virtual GITS control frame at 0x8080000, MSIs backed by GICv4 vLPIs with doorbells");
}

/// One boot on 2 pCPUs with GIC version `gic`: Dom0 on its NVMe, domU1 on
/// the one at 0000:00:02.0; every check both versions share.
fn domu_with_nvme(gic: &str) -> RunResult {
    use clap::Parser;
    let domu_cmd = format!(
        "ls /sys/bus/pci/devices | tr '\\n' ' ' | sed 's/^/domu-pci: /'; echo; {}; \
         echo domu-msis=$(grep nvme /proc/interrupts | awk '{{s+=$2}} END {{print s+0}}'); \
         echo domu-its=$(grep -c ITS-MSI /proc/interrupts); {}; \
         printf '\\000\\000\\000\\010' | dd of=$D/config bs=4 seek=4 count=1 conv=notrunc 2>/dev/null; \
         echo bar-moved",
        fio_verify("16M"),
        nvme_admin_queue_attack("0000:00:00.0", OUTSIDE)
    );
    let dom0_cmd = format!(
        "ls /sys/bus/pci/devices | tr '\\n' ' ' | sed 's/^/dom0-pci: /'; echo; {}; echo dom0-fio-done; read go; exit $s",
        fio_verify("16M")
    );
    let argv = [
        "cargo-xtask",
        "run",
        "--pcpus",
        "2",
        "--gic",
        gic,
        "--disk",
        "nvme",
        "--domu",
        "1",
        "--domu-mem",
        "512M",
        "--domu-pci",
        "0000:00:02.0",
        "--domu-cmd",
        &domu_cmd,
        "--cmd",
        &dom0_cmd,
    ];
    let xtask::cli::Command::Run(args) = xtask::cli::Cli::parse_from(argv).command else { panic!("not a run command") };
    let mut o = args.run_options(xtask::run::qemu::scratch_disk).expect("run options");
    o.echo = false;
    o.timeout = std::time::Duration::from_secs(540);
    o.early_input =
        Some(EarlyInput { after: "d1 powered off: the domain stops\ndom0-fio-done".into(), bytes: b"go\n".to_vec() });
    let r = run(&o);
    let c = &r.console;
    assert!(r.hv_fatal.is_none(), "{:?}\n{}", r.hv_fatal, tail(c, 60));
    assert_console(&r, "pci 0000:00:02.0 → d1: BARs");
    // Dom0 sees its own controller and not the DomU's.
    let dom0_pci = c.lines().find_map(|l| l.strip_prefix("dom0-pci: ")).unwrap_or_else(|| panic!("{}", tail(c, 80)));
    assert!(dom0_pci.contains("0000:00:01.0"), "{dom0_pci}");
    assert!(!dom0_pci.contains("0000:00:02.0"), "Dom0 sees the DomU's function: {dom0_pci}");
    assert!(stat_line(c, "pci.hidden_accesses").unwrap_or(0) > 0, "Dom0's bus scan read the hidden slot");
    // The DomU sees exactly its function, at 0000:00:00.0 of its own bridge:
    // its bus scan read the other 31 slots as empty.
    assert_console(&r, "(d1) domu-pci: 0000:00:00.0 \n");
    // Both fio runs read back what they wrote.
    assert_eq!(fio_errs(c, ""), [0], "Dom0's fio:\n{}", tail(c, 60));
    assert_eq!(fio_errs(c, "(d1) "), [0], "d1's fio:\n{}", tail(c, 60));
    assert_console(&r, "(d1) fio-status=0");
    // The DomU's MSI-X arrived through its vITS.
    let msis: u64 = c
        .lines()
        .find_map(|l| l.strip_prefix("(d1) domu-msis=")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{}", tail(c, 60)));
    assert!(msis > 100, "d1's NVMe interrupts: {msis}");
    assert!(stat_line(c, "d1.vits0.lpis_dropped").is_some(), "d1 has a vITS");
    // Its DMA: its stream under its own VMID; the attack faulted in the
    // SMMU, counted for d1, and Dom0 ran on to its prompt.
    assert_console(&r, "d1: DMA of SMMU0 streams 0x10..0x10 confined to its RAM and the ITS doorbell");
    assert_console(&r, "(d1) attack-done");
    assert_console(&r, &format!("SMMU0: F_TRANSLATION on stream 0x10 (d1), read of IPA {OUTSIDE:#x}"));
    assert!(stat_line(c, "smmu0.d1.faults").unwrap_or(0) >= 1, "{}", tail(c, 60));
    assert_eq!(stat_line(c, "smmu0.d0.faults"), Some(0));
    // Moving its BAR over the GIC (0x08000000) is counted and not followed.
    assert_console(&r, "(d1) bar-moved");
    assert_console(&r, "d1: BAR0 of 0000:00:02.0 moved to 0x8000000: not followed");
    assert_eq!(stat_line(c, "d1.pci.bar_moves"), Some(1));
    // The DomU stopped: its function was reset.
    assert_console(&r, "d1: pci 0000:00:02.0 reset (FLR)");
    assert_eq!(r.guest_exit, Some(0), "tail:\n{}", tail(c, 40));
    r
}
