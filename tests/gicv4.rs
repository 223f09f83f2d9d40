//! GICv4.0 direct injection: an NVMe disk's MSIs reach Dom0 as
//! vLPIs the ITS makes pending for the target vCPU's vPE, and the vPE's
//! doorbell wakes that vCPU when it is blocked. One pCPU, two vCPUs: a busy
//! loop on vCPU0, fio (crc32c verify) on vCPU1, so every I/O completion
//! finds the fio vCPU blocked in WFI and must wake it. The same test passes
//! on a GICv3 machine and with `gic_vlpi=off`, on host LPIs injected
//! through list registers (the emulated path).

use integration_tests::*;
use xtask::cli::DiskKind;

/// vCPU0 (and every vCPU from 2 on) spins for the whole run; fio on vCPU1
/// writes 8 MiB in 4 KiB blocks at queue depth 1 and reads every block back
/// checking its crc32c.
const SCRIPT: &str = "dmesg | grep -F 'nvme nvme0: pci function'; \
    for c in $(seq 0 $(($(nproc) - 1))); do [ $c = 1 ] || \
        taskset -c $c sh -c 'while [ ! -e /tmp/stop ]; do :; done' & done; \
    taskset -c 1 fio --name=v --filename=/dev/nvme0n1 --rw=randwrite --bs=4k --size=8M --direct=1 \
        --ioengine=psync --verify=crc32c --do_verify=1 --output-format=terse --terse-version=3 >/tmp/out; \
    s=$?; touch /tmp/stop; wait; echo fio-status=$s; echo terse=$(cut -d';' -f1-5 /tmp/out); \
    grep nvme0q /proc/interrupts | sed 's/^/IRQ /'; exit $s";

/// Boots 1 pCPU / 2 vCPUs on GIC `gic` with the NVMe disk and `hv_extra`
/// hypervisor options, runs [`SCRIPT`] and checks fio passed.
fn fio_with_hog(gic: u8, hv_extra: &str) -> RunResult {
    fio_with_hogs(gic, 1, 2, hv_extra)
}

/// [`fio_with_hog`] on `pcpus` pCPUs and `vcpus` vCPUs.
fn fio_with_hogs(gic: u8, pcpus: u32, vcpus: u32, hv_extra: &str) -> RunResult {
    let r = run_cmd(SCRIPT, |o| {
        o.gic = gic;
        o.pcpus = pcpus;
        o.vcpus = vcpus;
        let img = xtask::run::qemu::scratch_disk().expect("scratch disk image");
        o.hv_args = format!("dom0_disk={} {hv_extra}", DiskKind::Nvme.as_str());
        o.extra = vec![
            "-drive".into(),
            format!("if=none,file={},format=raw,id=d0", img.display()),
            "-device".into(),
            DiskKind::Nvme.qemu_device().expect("a QEMU disk device").into(),
        ];
    });
    assert_console(&r, "nvme nvme0: pci function 0000:00:01.0");
    assert_console(&r, "fio-status=0");
    assert_console(&r, "terse=3;fio-3.33;v;0;0");
    assert_eq!(r.guest_exit, Some(0));
    assert_eq!(stat_line(&r.console, "its.cmd_errors"), Some(0));
    assert_console(&r, "int_lpis=0 stalls=0 errors=0");
    r
}

/// The NVMe interrupts the guest counted (all queues, all CPUs).
fn guest_msis(console: &str) -> u64 {
    console
        .lines()
        .filter_map(|l| l.strip_prefix("IRQ "))
        .flat_map(|l| l.split_whitespace().skip(1).take(2).filter_map(|c| c.parse::<u64>().ok()).collect::<Vec<_>>())
        .sum()
}

fn lpis_injected(console: &str) -> u64 {
    (0..2).map(|v| stat(console, v, "lpis_injected").expect("lpis_injected")).sum()
}

#[test]
fn gicv4_msis_arrive_as_vlpis_and_doorbells_wake_the_fio_vcpu() {
    let r = fio_with_hog(4, "");
    assert_console(&r, "ITS: guest MSIs by GICv4.0 direct vLPI injection, doorbells wake vCPUs");
    assert_console(&r, "MSIs backed by GICv4 vLPIs with doorbells");
    let msis = guest_msis(&r.console);
    // 2048 writes + 2048 verify reads at depth 1.
    assert!(msis >= 4000, "guest NVMe interrupts: {msis}\n{}", tail(&r.console, 40));
    // Interrupts arrive as vLPIs: the hypervisor injects (almost) none.
    let injected = lpis_injected(&r.console);
    assert!(injected * 100 < msis, "LPIs injected through list registers: {injected} of {msis}");
    assert_eq!(stat_line(&r.console, "irq.guest_lpi"), Some(0), "no host LPI per MSI");
    // The fio vCPU blocks on every I/O: its doorbell wakes it.
    let wakes = stat(&r.console, 1, "wakes_doorbell").unwrap();
    let doorbells = stat(&r.console, 1, "doorbells").unwrap();
    assert!(wakes > 0 && doorbells >= wakes, "vCPU1 doorbell wakes {wakes}, doorbells {doorbells}");
    // Every doorbell taken is classed once: woke a blocked vCPU, found it
    // runnable but descheduled (expected under GICv4.0, no wake), or found
    // it running (spurious).
    let classed: u64 = (0..2)
        .flat_map(|v| {
            ["doorbells", "doorbells_runnable", "doorbells_spurious"].map(|n| stat(&r.console, v, n).unwrap())
        })
        .sum();
    assert_eq!(stat_line(&r.console, "irq.doorbell"), Some(classed));
    assert!(stat_line(&r.console, "its.cmd.VMAPTI").unwrap() > 0);
    assert_eq!(stat_line(&r.console, "its.cmd.VMAPP"), Some(2), "one vPE per vCPU");
    assert_eq!(stat_line(&r.console, "vlpi0.vpes"), Some(2));
    assert!(stat_line(&r.console, "its.cmds_per_sec").is_some());
    // One pCPU: a vPE never moves.
    assert_eq!(stat(&r.console, 1, "vmovps"), Some(0));
    assert!(stat(&r.console, 1, "vpe_residency_switches").unwrap() > 0);
    for v in 0..2 {
        assert_residency_follows_switches(&r.console, v);
    }
}

/// A vPE stays resident across scheduler continuations of its vCPU: it is
/// made resident at a switch-in and leaves when the pCPU picks another
/// vCPU, or (one more pair) around a WFI that finds nothing in the vGIC.
/// The hog vCPUs' many slice ends that pick them again cost nothing.
fn assert_residency_follows_switches(console: &str, vcpu: usize) {
    let get = |n: &str| stat(console, vcpu, n).unwrap_or_else(|| panic!("vCPU{vcpu} {n}"));
    let (switches, ins, wfi) = (get("vpe_residency_switches"), get("schedule_ins"), get("wfi_traps"));
    eprintln!("vCPU{vcpu}: vpe_residency_switches={switches} schedule_ins={ins} wfi_traps={wfi}");
    assert!(
        switches <= 2 * (ins + wfi),
        "vCPU{vcpu}: {switches} vPE residency switches for {ins} schedule-ins and {wfi} WFI traps"
    );
}

/// Two pCPUs, three vCPUs (hogs on vCPU0 and vCPU2): the fio vCPU's
/// wake-preemptions land on either pCPU, so its vPE moves (VMOVP) and is
/// made resident on one redistributor only once the other pCPU released
/// it; every I/O still verifies.
#[test]
fn gicv4_vpes_follow_vcpus_between_pcpus() {
    let r = fio_with_hogs(4, 2, 3, "");
    assert_console(&r, "MSIs backed by GICv4 vLPIs with doorbells");
    assert!(guest_msis(&r.console) >= 4000, "guest NVMe interrupts\n{}", tail(&r.console, 40));
    assert_eq!(stat_line(&r.console, "irq.guest_lpi"), Some(0), "no host LPI per MSI");
    assert!(stat(&r.console, 1, "vmovps").unwrap() > 0, "the fio vCPU's vPE never moved");
    assert!(!r.console.contains("vPE still resident"), "{}", tail(&r.console, 40));
    for v in 0..3 {
        assert_residency_follows_switches(&r.console, v);
    }
}

#[test]
fn gicv3_takes_the_emulated_path_with_the_same_workload() {
    let r = fio_with_hog(3, "");
    assert_console(&r, "ITS: guest MSIs by host LPIs through list registers (the ITS has no virtual LPIs");
    let msis = guest_msis(&r.console);
    assert!(msis >= 4000, "guest NVMe interrupts: {msis}");
    assert!(lpis_injected(&r.console) >= msis, "every MSI injected through the list registers");
    assert_eq!(stat_line(&r.console, "irq.doorbell"), Some(0));
    assert_eq!(stat(&r.console, 1, "wakes_doorbell"), Some(0));
    assert!(stat(&r.console, 1, "wakes_interrupt").unwrap() > 0);
}

#[test]
fn gic_vlpi_off_keeps_gicv4_on_host_lpis() {
    let r = fio_with_hog(4, "gic_vlpi=off");
    assert_console(&r, "ITS: guest MSIs by host LPIs through list registers (gic_vlpi=off)");
    assert_console(&r, "MSIs backed by host LPIs");
    let msis = guest_msis(&r.console);
    assert!(msis >= 4000, "guest NVMe interrupts: {msis}");
    assert!(lpis_injected(&r.console) >= msis);
    assert_eq!(stat_line(&r.console, "irq.doorbell"), Some(0));
    assert_eq!(stat_line(&r.console, "its.cmd.VMAPP"), Some(0));
}
