//! Host tests of the bench harness: parsing a real console (plain QEMU, fio
//! 3.33, recorded with [`guest_command`]'s script), aggregation, the matrix,
//! and the three report files.

use super::*;
use hypervisor::stats::Log2Histogram;

const CONSOLE: &str = include_str!("testdata/console-1p2v.txt");

fn fixture_case() -> Case {
    Case {
        topology: Topology::OneP2V,
        irq: Irq::Unpinned,
        sched: Sched::XenCompat,
        ratelimit_us: 1000,
        disk: Disk::Ram,
        clock: Clock::Realtime,
        delivery: Delivery::V3Emulated,
        idle: Idle::Wfi,
    }
}

fn b64decode(s: &str) -> Vec<u8> {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().take_while(|&c| c != b'=') {
        acc = acc << 6 | A.iter().position(|&a| a == c).expect("base64") as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

#[test]
fn fixture_was_recorded_with_the_current_guest_command() {
    let arg = CONSOLE
        .lines()
        .find_map(|l| l.split_once("Kernel command line: ").map(|x| x.1))
        .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("guestcmd=")))
        .expect("guestcmd on the recorded kernel command line");
    let script = String::from_utf8(b64decode(arg)).unwrap();
    assert_eq!(
        script,
        guest_command(&fixture_case(), 5),
        "guest_command() changed: re-record testdata/console-1p2v.txt (see record_console_fixture)"
    );
}

#[test]
fn parses_the_recorded_console() {
    assert!(CONSOLE.contains("[    0.000000] Booting Linux"), "real kernel lines are part of the fixture");
    let s = parse_console(CONSOLE).unwrap();
    let f = &s.fio;
    // The figures in the recorded JSON.
    let want_iops: f64 = CONSOLE
        .lines()
        .find_map(|l| l.trim().strip_prefix("\"iops\" : "))
        .unwrap()
        .trim_end_matches(',')
        .parse()
        .unwrap();
    assert_eq!(f.iops, want_iops);
    assert!(f.iops > 10.0);
    assert!(f.total_ios > 0);
    assert_eq!(f.clat_percentiles_us.len(), 17, "fio's default percentile list");
    assert!(f.clat_p50_us > 0.0 && f.clat_p50_us <= f.clat_p99_us && f.clat_p99_us <= f.clat_p999_us);
    assert_eq!(f.clat_percentiles_us.iter().find(|p| p.0 == 99.0).unwrap().1, f.clat_p99_us);
    // The tail beyond p99.9 (testdata: 1p2v, clat_ns 99.99 = 7897088, max = 11426171).
    assert_eq!((f.clat_p9999_us, f.clat_max_us), (7897.088, 11426.171));
    assert!(f.clat_p999_us <= f.clat_p9999_us && f.clat_p9999_us <= f.clat_max_us);
    // psync: fio records no slat; the proxy is lat - clat, small but > 0.
    assert!(!f.slat_measured);
    assert!(f.slat_mean_us > 0.0 && f.slat_mean_us < f.clat_p50_us, "{}", f.slat_mean_us);
    // Unpinned: the disk IRQ went to one CPU; the line has both CPUs' counts.
    let irqs = s.disk_irqs_per_cpu.as_ref().unwrap();
    assert_eq!(irqs.len(), 2);
    assert!(irqs.iter().sum::<u64>() >= f.total_ios);
    // No hypervisor there, so no stats.
    assert!(s.stats.is_empty() && s.stats_error.is_none());
}

/// Kernel lines inside the JSON block, whole and in the middle of a line.
#[test]
fn kernel_lines_inside_the_block_are_removed() {
    let clean = parse_console(CONSOLE).unwrap();
    let mut noisy = String::new();
    let mut in_block = false;
    for line in CONSOLE.lines() {
        if line == FIO_BEGIN {
            in_block = true;
        }
        if in_block && line.trim_start().starts_with("\"iops\" : ") {
            // printk lands in the middle of the number.
            let (a, b) = line.split_at(line.len() - 5);
            noisy.push_str(a);
            noisy.push_str("[  123.456789] virtio_blk virtio0: cut in\n");
            noisy.push_str(b);
            noisy.push('\n');
            continue;
        }
        noisy.push_str(line);
        noisy.push('\n');
        if in_block && line.trim() == "\"jobs\" : [" {
            noisy.push_str("[   99.000001] rcu: INFO: rcu_sched self-detected stall on CPU\n");
            noisy.push_str("[   99.000002]  { 1} } ] \"not json\"\n");
        }
        if line == FIO_END {
            in_block = false;
        }
    }
    assert_eq!(noisy.matches("[  123.456789] virtio_blk virtio0: cut in").count(), 3, "read, write, trim iops lines");
    // The noise does break a naive reading of the block.
    let raw = noisy.split(FIO_BEGIN).nth(1).unwrap().split(FIO_END).next().unwrap();
    assert!(serde_json::from_str::<serde_json::Value>(raw).is_err());
    let parsed = parse_console(&noisy).unwrap();
    assert_eq!(parsed, clean);
}

#[test]
fn console_errors_are_explained() {
    assert!(parse_console("no markers here").unwrap_err().to_string().contains(FIO_BEGIN));
    let cut = CONSOLE.split(FIO_END).next().unwrap();
    assert!(parse_console(cut).unwrap_err().to_string().contains("never ends"));
    let empty = format!("{FIO_BEGIN}\nfio: failed to open /dev/vda\n\n{FIO_END}\n");
    assert!(parse_console(&empty).unwrap_err().to_string().contains("no JSON"));
    let failed = format!("{FIO_BEGIN}\n{{\"jobs\":[{{\"error\":5,\"read\":{{}}}}]}}\n{FIO_END}\n");
    assert!(parse_console(&failed).unwrap_err().to_string().contains("error 5"));
}

#[test]
fn the_last_fio_block_wins() {
    let first = format!("{FIO_BEGIN}\n{{\"jobs\":[{{\"error\":5}}]}}\n{FIO_END}\n");
    let s = parse_console(&format!("{first}{CONSOLE}")).unwrap();
    assert_eq!(s, parse_console(CONSOLE).unwrap());
}

const STATS: &str = "\
vcpu0.wakes_interrupt=3
vcpu0.kicks=5
vcpu0.kick_to_run_ns.count=0
vcpu0.kick_to_run_ns.sum=0
vcpu0.kick_to_run_ns.min=0
vcpu0.kick_to_run_ns.max=0
vcpu1.wakes_interrupt=1000
vcpu1.ratelimit_deferrals=990
vcpu1.preempt_wake=0
vcpu1.kick_to_run_ns.count=1000
vcpu1.kick_to_run_ns.sum=5000000000
vcpu1.kick_to_run_ns.min=3000
vcpu1.kick_to_run_ns.max=9900000
vcpu1.kick_to_run_ns.bucket[2048,4096)=10
vcpu1.kick_to_run_ns.bucket[4194304,8388608)=700
vcpu1.kick_to_run_ns.bucket[8388608,16777216)=290
";

#[test]
fn parses_hypervisor_stats_text() {
    let console = format!("{CONSOLE}[   30.1] reboot: Power down\n{STATS}hv: bye\n");
    let s = parse_console(&console).unwrap();
    assert_eq!(s.stats.len(), 2);
    let v1 = &s.stats[&1];
    assert_eq!(v1.counters.wakes_interrupt, 1000);
    assert_eq!(v1.counters.ratelimit_deferrals, 990);
    let h = &v1.kick_to_run_ns;
    assert_eq!(h.count(), 1000);
    assert_eq!(h.bucket(Log2Histogram::bucket_of(5_000_000)), 700);
    assert_eq!(h.max(), Some(9_900_000));
    assert!(h.quantile(99, 100).unwrap() > 8_000_000);
    // A corrupted stats line costs the stats, not the fio figures.
    let bad = format!("{CONSOLE}vcpu1.kick_to_run_ns.count=1000[  1.0] x\n");
    let s = parse_console(&bad).unwrap();
    assert!(s.stats.is_empty() && s.stats_error.is_some());
}

fn sample_with(iops: f64, p99: f64, slat: f64) -> Sample {
    let mut s = parse_console(CONSOLE).unwrap();
    s.fio.iops = iops;
    s.fio.clat_p99_us = p99;
    s.fio.slat_mean_us = slat;
    s
}

#[test]
fn median_and_summary() {
    assert_eq!(median(&[]), None);
    assert_eq!(median(&[3.0]), Some(3.0));
    assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
    assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    assert_eq!(median(&[f64::NAN, 2.0, 9.0, 1.0]), Some(2.0));

    let mut a = sample_with(100.0, 9000.0, 1.0);
    let b = sample_with(300.0, 1000.0, 3.0);
    let c = sample_with(200.0, 5000.0, 50.0);
    a.stats = hypervisor::stats::parse_text(STATS).unwrap();
    let mut c2 = c.clone();
    c2.stats = a.stats.clone();
    let r = CaseResult { case: fixture_case(), samples: vec![a, b, c2], errors: vec!["timeout".into()] };
    let s = summarize(&r).unwrap();
    assert_eq!(s.repeats, 3);
    assert_eq!(s.fio.iops, 200.0);
    assert_eq!(s.fio.clat_p99_us, 5000.0);
    assert_eq!(s.fio.slat_mean_us, 3.0);
    assert_eq!(s.errors, vec!["timeout".to_string()]);
    // Histograms of the fio vCPU (vcpu1) add up over repeats.
    assert_eq!(s.kick_to_run.as_ref().unwrap().count(), 2000);
    assert_eq!(s.fio_vcpu_counters.as_ref().unwrap().ratelimit_deferrals, 1980);
    assert!(summarize(&CaseResult { case: fixture_case(), samples: vec![], errors: vec!["x".into()] }).is_none());
}

#[test]
fn matrix_sizes() {
    let quick = matrix(false, true);
    assert_eq!(quick.len(), 6);
    assert_eq!(matrix(true, true), quick, "quick wins over full");
    for c in &quick {
        assert_eq!((c.irq, c.disk, c.clock), (Irq::Unpinned, Disk::Ram, Clock::Icount));
        assert!(c.sched == Sched::WakePreempt || c.ratelimit_us == 1000);
        assert_ne!(c.topology, Topology::TwoP2V);
    }
    // Each scheduler of quick has the DomU case beside 1p1v and 1p2v.
    for sched in [Sched::XenCompat, Sched::WakePreempt] {
        let t: Vec<Topology> = quick.iter().filter(|c| c.sched == sched).map(|c| c.topology).collect();
        assert_eq!(t, [Topology::OneP1V, Topology::OneP2V, Topology::OneP1VD1]);
    }
    // icount: 3 disks x 4 schedulers x (1p1v + 1p2v x 2 IRQ + 1p1v+d1) = 48.
    let default = matrix(false, false);
    assert_eq!(default.len(), 48);
    assert!(matrix(true, false).iter().all(|c| Disk::SPI.contains(&c.disk)), "PCIe disks only with --disk");
    assert!(default.iter().all(|c| c.clock == Clock::Icount));
    // full adds real time with 2p2v (no DomU): 3 x 4 x (1 + 2 + 2) = 60.
    let full = matrix(true, false);
    assert_eq!(full.len(), 108);
    assert!(full.iter().filter(|c| c.topology == Topology::OneP1VD1).all(|c| c.clock == Clock::Icount));
    assert!(full.iter().filter(|c| c.topology.vcpus() == 1).all(|c| c.irq == Irq::Unpinned));
    assert!(full.iter().filter(|c| c.topology == Topology::TwoP2V).all(|c| c.clock == Clock::Realtime));
    assert_eq!(full.iter().filter(|c| c.topology == Topology::TwoP2V).count(), 24);
    let mut uniq = full.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), full.len());
    assert!(full.iter().all(|c| !(c.topology == Topology::OneP1V && c.irq == Irq::Pinned)));
}

#[test]
fn spellings_round_trip() {
    for c in matrix(true, false) {
        assert_eq!(c.topology.to_string().parse::<Topology>().unwrap(), c.topology);
        assert_eq!(c.irq.to_string().parse::<Irq>().unwrap(), c.irq);
        assert_eq!(c.sched.to_string().parse::<Sched>().unwrap(), c.sched);
        assert_eq!(c.disk.to_string().parse::<Disk>().unwrap(), c.disk);
        assert_eq!(c.clock.to_string().parse::<Clock>().unwrap(), c.clock);
    }
    assert!("3p3v".parse::<Topology>().unwrap_err().to_string().contains("1p1v, 1p2v, 2p2v"));
    assert_eq!(fixture_case().to_string(), "1p2v unpinned xen-compat rl=1000 ram realtime");
}

#[test]
fn guest_commands() {
    let base = Case { clock: Clock::Icount, ..fixture_case() };
    let two = guest_command(&base, 10);
    assert!(two.starts_with("taskset -c 0 sh -c 'while :; do :; done' &"));
    assert!(two.contains("taskset -c 1 fio --name=randread --filename=/dev/vda --rw=randread --bs=4k --iodepth=1 --direct=1 --ioengine=psync --runtime=10 --time_based --output-format=json"));
    assert!(two.contains("kill $H"));
    assert!(!two.contains("smp_affinity"));
    let pinned = guest_command(&Case { irq: Irq::Pinned, ..base }, 10);
    assert!(pinned.contains("echo 2 > /proc/irq/$N/smp_affinity"));
    assert!(pinned.contains("virtio0$"));
    let one = guest_command(&Case { topology: Topology::OneP1V, ..base }, 10);
    assert!(!one.contains("while :") && !one.contains("kill"));
    assert!(one.contains("taskset -c 0 fio"));
    // Fits the 2048-byte kernel command line with room to spare.
    for c in matrix(true, false) {
        let arg = crate::run::qemu::base64(guest_command(&c, 600).as_bytes());
        assert!(arg.len() < 1400, "{c}: {} bytes", arg.len());
    }
}

#[test]
fn hypervisor_args_parse_as_scheduler_options() {
    use hypervisor::sched::{SchedConfig, WakeMode};
    for c in matrix(true, false) {
        let a = hypervisor_args(&c);
        let cfg = SchedConfig::from_bootargs(&a).unwrap_or_else(|e| panic!("{a}: {e:?}"));
        assert_eq!(cfg.ratelimit_ns, c.ratelimit_us as u64 * 1000);
        let want = if c.sched == Sched::WakePreempt { WakeMode::Preempt } else { WakeMode::XenCompat };
        assert_eq!(cfg.wake_mode, want);
    }
    let ram = hypervisor_args(&Case { sched: Sched::WakePreempt, ..fixture_case() });
    assert_eq!(
        ram,
        "sched=credit2 sched_wake_preempt=on sched_ratelimit_us=1000 dom0_disk=ram dom0_disk_latency_us=200"
    );
    let o = run_options(&Case { topology: Topology::TwoP2V, ..fixture_case() }, 10);
    assert_eq!((o.pcpus, o.vcpus, o.icount), (2, 2, false));
    assert_eq!(
        o.extra,
        [
            "-drive",
            "driver=null-co,read-zeroes=on,latency-ns=200000,size=256M,if=none,id=d0",
            "-device",
            "virtio-blk-device,drive=d0"
        ]
    );
}

/// Every disk: the hypervisor's `dom0_disk=` (parsed by the hypervisor's
/// own parser), QEMU's device on the null-co drive, the guest's device.
#[test]
fn per_disk_configuration() {
    use hypervisor::config::{Config, DiskMode};
    let want = [
        (Disk::Passthrough, DiskMode::Passthrough, "virtio-blk-device,drive=d0", "/dev/vda", "virtio0"),
        (Disk::Backend, DiskMode::Backend, "virtio-blk-device,drive=d0", "/dev/vda", "virtio0"),
        (Disk::Ram, DiskMode::Ram, "virtio-blk-device,drive=d0", "/dev/vda", "virtio0"),
        (Disk::VirtioPci, DiskMode::VirtioPci, "virtio-blk-pci,drive=d0", "/dev/vda", "virtio0"),
        (Disk::Nvme, DiskMode::Nvme, "nvme,drive=d0,serial=hvdisk0", "/dev/nvme0n1", "nvme0q"),
        (Disk::NvmeSmmu, DiskMode::Nvme, "nvme,drive=d0,serial=hvdisk0", "/dev/nvme0n1", "nvme0q"),
    ];
    assert_eq!(want.len(), Disk::ALL.len());
    for (disk, mode, device, path, irq) in want {
        let case = Case { disk, clock: Clock::Icount, ..fixture_case() };
        let cfg = Config::parse(&hypervisor_args(&case)).unwrap();
        assert_eq!(cfg.disk, mode, "{disk}");
        let o = run_options(&case, 5);
        assert_eq!(o.extra[1], "driver=null-co,read-zeroes=on,latency-ns=200000,size=256M,if=none,id=d0");
        assert_eq!(o.extra[3], device, "{disk}");
        assert_eq!((disk.device_path(), disk.irq_name()), (path, irq));
        assert_eq!(disk.is_pcie(), matches!(disk, Disk::VirtioPci | Disk::Nvme | Disk::NvmeSmmu));
        // Only nvme-smmu puts the root complex behind the SMMU.
        assert_eq!(o.iommu, disk == Disk::NvmeSmmu, "{disk}");
        assert!(o.cmd.unwrap().contains(&format!("--filename={path} ")));
    }
    assert_eq!(Disk::SPI, [Disk::Passthrough, Disk::Backend, Disk::Ram]);
}

#[test]
fn disk_matrix_puts_msi_beside_spi() {
    // The quick matrix without its DomU cases (not part of `--disk`).
    let quick_of = |disk: Disk| -> Vec<Case> {
        matrix(false, true).into_iter().filter(|c| !c.topology.domu_hog()).map(|c| Case { disk, ..c }).collect()
    };
    // A PCIe disk brings the SPI reference along, first.
    let nvme = disk_matrix(&[Disk::Nvme], &[]);
    assert_eq!(nvme.len(), 10);
    assert_eq!(nvme[..4], quick_of(Disk::Passthrough)[..]);
    assert_eq!(nvme[4..8], quick_of(Disk::Nvme)[..]);
    // Then the MSI-steering cases.
    assert_eq!((nvme[8].irq, nvme[9].irq), (Irq::MsiFio, Irq::MsiHog));
    for c in &nvme[..8] {
        assert_eq!((c.irq, c.clock), (Irq::Unpinned, Clock::Icount));
        assert!(c.sched == Sched::WakePreempt || c.ratelimit_us == 1000);
    }
    let both = disk_matrix(&[Disk::Nvme, Disk::VirtioPci, Disk::Nvme], &[]);
    assert_eq!(both.len(), 16, "duplicates dropped");
    assert_eq!(both.iter().map(|c| c.disk).collect::<std::collections::BTreeSet<_>>().len(), 3);
    assert_eq!(both[10..14], quick_of(Disk::VirtioPci)[..]);
    // Passthrough listed: not added twice, the order given is kept.
    let given = disk_matrix(&[Disk::VirtioPci, Disk::Passthrough], &[]);
    assert_eq!(given.len(), 10);
    assert_eq!((given[0].disk, given[6].disk), (Disk::VirtioPci, Disk::Passthrough));
    // An SPI disk alone: just its cases.
    assert_eq!(disk_matrix(&[Disk::Ram], &[]), quick_of(Disk::Ram));
    assert!(disk_matrix(&[], &[]).is_empty());
}

#[test]
fn guest_commands_of_the_pcie_disks() {
    let nvme = Case { disk: Disk::Nvme, clock: Clock::Icount, ..fixture_case() };
    let s = guest_command(&nvme, 5);
    assert!(s.contains("taskset -c 1 fio --name=randread --filename=/dev/nvme0n1 --rw=randread"));
    // Every nvme0q line (admin + I/O queues under MSI-X, the shared INTx line).
    assert!(s.contains("grep 'nvme0q' /proc/interrupts | sed 's/^/@@BENCH-IRQ@@ /'\n"), "{s}");
    assert!(!s.contains("smp_affinity"));
    let pinned = guest_command(&Case { irq: Irq::Pinned, ..nvme }, 5);
    assert!(
        pinned.contains("N=$(sed -n 's/^ *\\([0-9]*\\):.*nvme0q.*/\\1/p' /proc/interrupts | tail -n1)"),
        "{pinned}"
    );
    assert!(pinned
        .contains("echo 2 > /proc/irq/$N/smp_affinity || { echo \"bench: cannot pin IRQ '$N'\"; kill $H; exit 3; }"));
    let vpci = guest_command(&Case { disk: Disk::VirtioPci, ..nvme }, 5);
    assert!(vpci.contains("--filename=/dev/vda "));
    assert!(vpci.contains("grep 'virtio0' /proc/interrupts | sed 's/^/@@BENCH-IRQ@@ /'"));
    // virtio-mmio disks keep the single, anchored line.
    let mmio = guest_command(&Case { disk: Disk::Passthrough, ..nvme }, 5);
    assert!(mmio.contains("echo \"@@BENCH-IRQ@@ $(grep 'virtio0$' /proc/interrupts)\""));
    for c in disk_matrix(&[Disk::Nvme, Disk::VirtioPci], &[]) {
        for irq in Irq::ALL {
            let arg = crate::run::qemu::base64(guest_command(&Case { irq: *irq, ..c }, 600).as_bytes());
            assert!(arg.len() < 1400, "{c}: {} bytes", arg.len());
        }
    }
}

#[test]
fn irq_lines_are_summed_with_their_irqchips() {
    // INTx (today): one shared level line.
    let intx = "@@BENCH-IRQ@@  14:        16       4000     GICv3  36 Level     nvme0q0, nvme0q1\n";
    assert_eq!(parse_irq_lines(intx), (Some(vec![16, 4000]), vec!["GICv3".to_string()]));
    // MSI-X through the ITS: one line per queue, kernel noise in between.
    let msi = "@@BENCH-IRQ@@  20:         9          0   ITS-MSI 16384 Edge      nvme0q0\n\
               [   40.1] random: crng init done\n\
               @@BENCH-IRQ@@  21:        30          0   ITS-MSI 16385 Edge      nvme0q1\n\
               @@BENCH-IRQ@@  22:         0       5000   ITS-MSI 16386 Edge      nvme0q2\n";
    assert_eq!(parse_irq_lines(msi), (Some(vec![39, 5000]), vec!["ITS-MSI".to_string()]));
    // The IRQ was not found: the guest's echo printed the mark alone.
    assert_eq!(parse_irq_lines("@@BENCH-IRQ@@ \n"), (None, vec![]));
    assert_eq!(parse_irq_lines("nothing"), (None, vec![]));
    // The recorded virtio-mmio console: one SPI line.
    let (counts, chips) = parse_irq_lines(CONSOLE);
    assert_eq!(counts.unwrap().len(), 2);
    assert_eq!(chips, ["GICv3"]);
}

/// `--disk nvme` with made-up figures: SPI as in [`quick_results`], the NVMe
/// cases at half the IOPS and twice the p99, through the ITS.
fn nvme_results() -> Vec<CaseResult> {
    let spi = quick_results();
    let mut out = Vec::new();
    for case in disk_matrix(&[Disk::Nvme], &[]).into_iter().filter(|c| c.irq == Irq::Unpinned) {
        let like = Case { disk: Disk::Ram, ..case };
        let mut r = spi.iter().find(|r| r.case == like).unwrap().clone();
        r.case = case;
        if case.disk == Disk::Nvme {
            let s = &mut r.samples[0];
            s.fio.iops /= 2.0;
            s.fio.clat_p99_us *= 2.0;
            s.disk_irqs_per_cpu = Some(vec![7, 4321]);
            s.disk_irq_chips = vec!["ITS-MSI".into()];
        }
        out.push(r);
    }
    out
}

#[test]
fn report_shows_msi_beside_spi() {
    let r = nvme_results();
    let md = render_report(&r);
    assert!(md.contains("8 case(s), 0 failed"));
    // The targets are evaluated per disk.
    let checks = check_targets(&r.iter().filter_map(summarize).collect::<Vec<_>>());
    let groups = |n: usize| checks.iter().filter(|c| c.target == n).map(|c| c.group.as_str()).collect::<Vec<_>>();
    assert_eq!(groups(1), ["passthrough/icount", "nvme v3-emulated/icount"]);
    assert_eq!(groups(2), ["passthrough/icount", "nvme v3-emulated/icount"]);
    // Results: the SPI rows, then the NVMe rows with their irqchip.
    let row = |label: &str| md.lines().position(|l| l.starts_with(&format!("| {label} |"))).unwrap();
    assert!(
        row("1p2v unpinned wake-preempt passthrough icount")
            < row("1p1v unpinned xen-compat rl=1000 nvme v3-emulated icount")
    );
    assert!(md.contains("| 1p2v unpinned wake-preempt nvme v3-emulated icount | 475 |"), "{md}");
    assert!(md.contains("| 7 / 4321 (ITS-MSI) | 1 |"), "{md}");
    assert!(md.contains("| 12453 / 0 (GICv3) | 1 |"), "{md}");
    // Ratios within the NVMe disk, the same as within the SPI one.
    assert!(md.contains("| 1p2v unpinned wake-preempt nvme v3-emulated icount | 0.95× | 1.33× | 2.50× |"), "{md}");
    assert!(
        md.contains("| 1p2v unpinned wake-preempt nvme v3-emulated icount | 1000 µs | 9.50× | 0.20× | 2.00× |"),
        "{md}"
    );
    // And MSI / SPI, case by case.
    assert!(md.contains("### PCIe disk (MSI) / passthrough virtio-mmio disk (SPI)"));
    assert!(
        md.contains(
            "| 1p2v unpinned wake-preempt nvme v3-emulated icount | ITS-MSI vs GICv3 | 0.50× | 2.00× | 1.00× |"
        ),
        "{md}"
    );
    assert_eq!(md.matches(" | ITS-MSI vs GICv3 | ").count(), 4);
    // Without a PCIe disk there is no such table.
    assert!(!render_report(&quick_results()).contains("PCIe disk (MSI)"));
    let sums: Vec<Summary> = r.iter().filter_map(summarize).collect();
    let back: ResultsFile = serde_json::from_str(&results_json(&sums)).unwrap();
    assert_eq!(back.cases.iter().filter(|c| c.disk == Disk::Nvme).count(), 4);
    let v: serde_json::Value = serde_json::from_str(&results_json(&sums)).unwrap();
    assert_eq!(v["cases"][4]["disk"], "nvme");
}

#[test]
fn progress_line() {
    let l = Progress::format(3, 12, std::time::Duration::from_secs(65), &fixture_case());
    assert_eq!(l, "case 3/12 (elapsed 01:05): 1p2v unpinned xen-compat rl=1000 ram realtime");
}

/// The quick matrix with made-up figures around the recorded sample:
/// baseline 1000 IOPS, wake-preempt 950, the control 100; with the DomU's
/// hog 920 and 80, the hog charged 3/4 of the pCPU.
fn quick_results() -> Vec<CaseResult> {
    let mut out = Vec::new();
    for case in matrix(false, true) {
        let (iops, p99, slat) = match (case.topology, case.sched) {
            (Topology::OneP1V, _) => (1000.0, 1500.0, 2.0),
            (Topology::OneP1VD1, Sched::WakePreempt) => (920.0, 1800.0, 4.0),
            (Topology::OneP1VD1, _) => (80.0, 12000.0, 2.5),
            (_, Sched::WakePreempt) => (950.0, 2000.0, 5.0),
            _ => (100.0, 10158.0, 2.5),
        };
        let mut s = sample_with(iops, p99, slat);
        if case.topology == Topology::OneP2V {
            s.stats = hypervisor::stats::parse_text(STATS).unwrap();
        }
        if case.topology == Topology::OneP1VD1 {
            s.stats = hypervisor::stats::parse_text("vcpu0.run_ns=1000\n").unwrap();
            s.domu_stats = hypervisor::stats::parse_text("vcpu0.run_ns=3000\n").unwrap();
        }
        out.push(CaseResult { case, samples: vec![s], errors: vec![] });
    }
    out
}

#[test]
fn report_has_targets_and_ratios() {
    let r = quick_results();
    let md = render_report(&r);
    assert!(md.contains("## Targets"));
    for t in report::TARGETS {
        assert!(md.contains(t), "{t}");
    }
    let checks = check_targets(&r.iter().filter_map(summarize).collect::<Vec<_>>());
    let status = |n: usize| checks.iter().filter(|c| c.target == n).map(|c| c.status).collect::<Vec<_>>();
    assert_eq!(status(1), vec![Status::Met]); // 0.95x IOPS, 1.33x p99
    assert_eq!(status(2), vec![Status::Met]); // 9.5x
    assert_eq!(status(3), vec![Status::NotMeasured]); // quick has no pinned cases
    assert_eq!(status(4), vec![Status::Missed]); // slat 5 vs 2 = 2.5x
    assert!(
        md.contains("| **met** | IOPS 950 vs 1000 = 0.95× (≥ 0.90×); p99 2000 vs 1500 µs = 1.33× (≤ 2×) |"),
        "{md}"
    );
    assert!(md.contains("**not measured**"));
    assert!(md.contains("**missed** | mean slat 5.00 vs 2.00 µs = 2.50× (≤ 2×) (lat−clat, see note)"));
    assert!(md.contains("### 1p2v, 1p1v+d1 and 2p2v / 1p1v"));
    assert!(md.contains("| 1p2v unpinned wake-preempt ram icount | 0.95× | 1.33× | 2.50× |"), "{md}");
    assert!(md.contains("| 1p2v unpinned xen-compat rl=1000 ram icount | 0.10× |"));
    assert!(md.contains("### unpinned / pinned IRQ"));
    assert!(md.contains("### wake-preempt / xen-compat"));
    assert!(md.contains("| 1p2v unpinned wake-preempt ram icount | 1000 µs | 9.50× | 0.20× | 2.00× |"), "{md}");
    // Per-case histogram from the stats text; cases without stats say so.
    assert!(md.contains("1000 wakes; p50"));
    assert!(md.contains("| [4194, 8389) | 700 |"), "{md}");
    assert!(md.contains("no kick→schedule-in samples"));
    assert!(md.contains("latency.svg"));
}

#[test]
fn failed_cases_are_listed_not_exported() {
    let mut r = quick_results();
    r[0].samples.clear();
    r[0].errors.push("QEMU killed after 900 s\nmore".into());
    let md = render_report(&r);
    assert!(md.contains("6 case(s), 1 failed"));
    assert!(md.contains(&format!("- {}: QEMU killed after 900 s", r[0].case)));
    let sums: Vec<Summary> = r.iter().filter_map(summarize).collect();
    let back: ResultsFile = serde_json::from_str(&results_json(&sums)).unwrap();
    assert_eq!(back.cases.len(), 5);
}

#[test]
fn results_json_matches_the_issue_schema() {
    let r = quick_results();
    let sums: Vec<Summary> = r.iter().filter_map(summarize).collect();
    let text = results_json(&sums);
    // Typed read-back (unknown fields rejected)...
    let back: ResultsFile = serde_json::from_str(&text).unwrap();
    assert_eq!(back.cases.len(), 6);
    let c = &back.cases[1];
    assert_eq!(
        (c.topology, c.irq, c.sched, c.ratelimit_us, c.disk, c.clock),
        (Topology::OneP2V, Irq::Unpinned, Sched::XenCompat, 1000, Disk::Ram, Clock::Icount)
    );
    assert_eq!((c.iops, c.clat_p99_us, c.slat_mean_us, c.repeats), (100.0, 10158.0, 2.5, 1));
    // ...and the exact key set and spellings of the issue's example.
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let obj = v["cases"][1].as_object().unwrap();
    let mut keys: Vec<&str> = obj.keys().map(|k| k.as_str()).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "clat_p50_us",
            "clat_p999_us",
            "clat_p99_us",
            "clock",
            "disk",
            "iops",
            "irq",
            "ratelimit_us",
            "repeats",
            "sched",
            "slat_mean_us",
            "topology"
        ]
    );
    assert_eq!(obj["topology"], "1p2v");
    assert_eq!(obj["sched"], "xen-compat");
    assert_eq!(obj["clock"], "icount");
    assert!(obj["iops"].is_number() && obj["repeats"].is_u64());
    assert_eq!(v.as_object().unwrap().len(), 1);
}

/// A minimal XML well-formedness check: tags nest and close, quotes balance.
fn check_xml(s: &str) -> Result<(), String> {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find('<') {
        let text = &rest[..i];
        if text.contains('>') {
            return Err(format!("stray '>' in {text:?}"));
        }
        let end = rest[i..].find('>').ok_or("unterminated tag")? + i;
        let tag = &rest[i + 1..end];
        if !tag.matches('"').count().is_multiple_of(2) {
            return Err(format!("unbalanced quotes in <{tag}>"));
        }
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack.pop().ok_or(format!("</{name}> without opening tag"))?;
            if open != name {
                return Err(format!("<{open}> closed by </{name}>"));
            }
        } else if !tag.ends_with('/') {
            stack.push(tag.split_whitespace().next().unwrap_or("").to_string());
        }
        rest = &rest[end + 1..];
    }
    if !stack.is_empty() {
        return Err(format!("unclosed: {stack:?}"));
    }
    Ok(())
}

#[test]
fn svg_is_well_formed_with_one_curve_per_case() {
    let r = quick_results();
    let sums: Vec<Summary> = r.iter().filter_map(summarize).collect();
    let svg = svg::latency_plot(&sums);
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.trim_end().ends_with("</svg>"));
    check_xml(&svg).unwrap();
    assert_eq!(svg.matches("<polyline class=\"clat\"").count(), sums.len());
    // Two 1p2v cases carry stats: their kick->run curves are dashed.
    assert_eq!(svg.matches("<polyline class=\"kick\"").count(), 2);
    for s in &sums {
        assert!(svg.contains(&s.case.to_string()));
    }
    // Log axis labels in decades, and every point inside the canvas.
    assert!(svg.contains("100 µs") && svg.contains("1 ms"));
    for pl in svg.split("points=\"").skip(1) {
        for pt in pl.split('"').next().unwrap().split_whitespace() {
            let (x, y) = pt.split_once(',').unwrap();
            let (x, y): (f64, f64) = (x.parse().unwrap(), y.parse().unwrap());
            assert!((0.0..=860.0).contains(&x) && (0.0..=600.0).contains(&y), "{pt}");
        }
    }
    assert!(check_xml("<svg><g></svg>").is_err());
    // No cases: still a valid (empty) plot.
    check_xml(&svg::latency_plot(&[])).unwrap();
}

#[test]
fn write_report_writes_three_files() {
    // BENCH_REPORT_DIR keeps the files for a look (e.g. /tmp/bench-report).
    let keep = std::env::var_os("BENCH_REPORT_DIR");
    let dir = keep
        .clone()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("bench-report-test-{}", std::process::id())));
    let files = write_report(&dir, &quick_results()).unwrap();
    let md = std::fs::read_to_string(&files.report_md).unwrap();
    assert!(md.starts_with("# Wake-latency benchmark"));
    let json: ResultsFile = serde_json::from_str(&std::fs::read_to_string(&files.results_json).unwrap()).unwrap();
    assert_eq!(json.cases.len(), 6);
    assert!(std::fs::read_to_string(&files.latency_svg).unwrap().starts_with("<svg"));
    if keep.is_none() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Re-records `testdata/console-1p2v.txt` with plain QEMU (no hypervisor):
/// `GUEST_IMAGE_DIR=/tmp/gi-bench cargo test -p xtask bench::tests::record_console_fixture -- --ignored`
#[test]
#[ignore]
fn record_console_fixture() {
    let dir = std::env::var("GUEST_IMAGE_DIR").unwrap_or_else(|_| "/tmp/gi-bench".into());
    let out = std::env::var("FIXTURE_OUT").unwrap_or_else(|_| "/tmp/console-1p2v.txt".into());
    let disk = "/tmp/bench-disk.img";
    let st = std::process::Command::new("truncate").args(["-s", "256M", disk]).status().unwrap();
    assert!(st.success());
    let irq: Irq = std::env::var("FIXTURE_IRQ").unwrap_or_else(|_| "unpinned".into()).parse().unwrap();
    let case = Case {
        topology: Topology::OneP2V,
        irq,
        sched: Sched::XenCompat,
        ratelimit_us: 1000,
        disk: Disk::Ram,
        clock: Clock::Realtime,
        delivery: Delivery::V3Emulated,
        idle: Idle::Wfi,
    };
    let cmd = guest_command(&case, 5);
    eprintln!("{cmd}");
    let append = format!("console=ttyAMA0 guestcmd={}", crate::run::qemu::base64(cmd.as_bytes()));
    let o = std::process::Command::new("timeout")
        .args([
            "300",
            "qemu-system-aarch64",
            "-machine",
            "virt,gic-version=3",
            "-cpu",
            "max,pauth-impdef=on",
            "-smp",
            "2",
            "-m",
            "1G",
            "-nographic",
            "-nic",
            "none",
        ])
        .arg("-kernel")
        .arg(format!("{dir}/Image"))
        .arg("-initrd")
        .arg(format!("{dir}/initramfs.cpio"))
        .arg("-append")
        .arg(&append)
        .args(["-drive", &format!("if=none,file={disk},format=raw,id=d0"), "-device", "virtio-blk-device,drive=d0"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let console = String::from_utf8_lossy(&o.stdout).replace('\r', "");
    std::fs::write(&out, &console).unwrap();
    assert!(console.contains(FIO_END), "no fio output; console in {out}");
}

#[test]
fn gic_list_gives_the_delivery_modes() {
    use Delivery::*;
    assert_eq!(Delivery::of_gics(&[]), [V3Emulated]);
    assert_eq!(Delivery::of_gics(&[3]), [V3Emulated]);
    assert_eq!(Delivery::of_gics(&[4]), [V4Emulated, V4Direct]);
    assert_eq!(Delivery::of_gics(&[3, 4]), [V3Emulated, V4Direct]);
    assert_eq!(Delivery::of_gics(&[4, 3, 4]), [V4Direct, V3Emulated]);
    assert_eq!((V3Emulated.gic(), V4Emulated.gic(), V4Direct.gic()), (3, 4, 4));
    assert!(V3Emulated.emulated() && V4Emulated.emulated() && !V4Direct.emulated());
    assert_eq!("v4-direct".parse::<Delivery>().unwrap(), V4Direct);
}

#[test]
fn gic_matrix_labels_and_arguments() {
    let m = disk_matrix(&[Disk::Nvme], &[3, 4]);
    // SPI reference once (on the first mode), then per mode: the quick
    // cases, the two MSI-steering cases and the resident-vCPU case.
    assert_eq!(m.len(), 4 + 2 * 7);
    assert!(m[..4].iter().all(|c| c.disk == Disk::Passthrough && c.delivery == Delivery::V3Emulated));
    assert!(m[4..11].iter().all(|c| c.disk == Disk::Nvme && c.delivery == Delivery::V3Emulated));
    assert!(m[11..].iter().all(|c| c.disk == Disk::Nvme && c.delivery == Delivery::V4Direct));
    assert_eq!(m[8].irq, Irq::MsiFio);
    assert_eq!(m[9].irq, Irq::MsiHog);
    for c in [m[8], m[9]] {
        assert_eq!((c.topology, c.sched), (Topology::OneP2V, Sched::WakePreempt));
    }
    // Labels: SPI rows unchanged, PCIe rows name their delivery.
    assert_eq!(m[3].label(), "1p2v unp preempt passthrough icount");
    assert_eq!(m[14].label(), "1p2v unp preempt nvme v4-direct icount");
    assert_eq!(m[16].label(), "1p2v msi-hog preempt nvme v4-direct icount");
    assert_eq!(m[5].to_string(), "1p2v unpinned xen-compat rl=1000 nvme v3-emulated icount");
    // Arguments: GIC version, gic_vlpi=off, dom0_msi_vcpu.
    assert_eq!(run_options(&m[14], 5).gic, 4);
    assert_eq!(run_options(&m[5], 5).gic, 3);
    assert!(!hypervisor_args(&m[14]).contains("gic_vlpi") && !hypervisor_args(&m[14]).contains("dom0_msi_vcpu"));
    assert!(hypervisor_args(&m[15]).ends_with(" dom0_msi_vcpu=1"));
    assert!(hypervisor_args(&m[16]).ends_with(" dom0_msi_vcpu=0"));
    // Steering cases run the unpinned guest script (no smp_affinity write).
    assert_eq!(guest_command(&m[16], 5), guest_command(&m[14], 5));
    // The resident-vCPU case: 2p2v, real time, MSIs at vCPU1,
    // the guest's idle loop polling; once per delivery mode.
    for c in [m[10], m[17]] {
        assert_eq!(c, resident_case(Disk::Nvme, c.delivery));
        assert_eq!((c.topology, c.irq, c.clock, c.idle), (Topology::TwoP2V, Irq::MsiFio, Clock::Realtime, Idle::Poll));
        let o = run_options(&c, 5);
        assert_eq!((o.pcpus, o.vcpus, o.icount), (2, 2, false));
        assert_eq!(o.append.as_deref(), Some("console=ttyAMA0 earlycon=pl011,0x09000000 nohlt"));
        assert!(hypervisor_args(&c).ends_with(" dom0_msi_vcpu=1"));
        // The same fio (psync, depth 1) and hog as every other row.
        assert_eq!(guest_command(&c, 5), guest_command(&Case { topology: Topology::OneP2V, ..m[14] }, 5));
    }
    assert_eq!(m[17].label(), "2p2v msi-fio preempt nvme v4-direct realtime idle-poll");
    assert_eq!(m[10].to_string(), "2p2v msi-fio wake-preempt nvme v3-emulated realtime idle=poll");
    assert!(m.iter().filter(|c| c.idle == Idle::Wfi).all(|c| run_options(c, 5).append.is_none()));
    // --gic 4 alone: the emulated path on the GICv4 machine is the reference.
    let v4 = disk_matrix(&[Disk::Nvme], &[4]);
    assert_eq!(v4.len(), 18);
    assert!(v4[..4].iter().all(|c| c.disk == Disk::Passthrough && c.delivery == Delivery::V4Emulated));
    assert_eq!(v4[4].label(), "1p1v unp xen-1000 nvme v4-emulated icount");
    assert!(hypervisor_args(&v4[4]).ends_with(" dom0_disk=nvme gic_vlpi=off"));
    assert_eq!(run_options(&v4[4], 5).gic, 4);
    // Without --gic the matrix is the GICv3 emulated one (plus the steering rows).
    let plain = disk_matrix(&[Disk::Nvme], &[]);
    assert_eq!(plain.len(), 10);
    assert!(plain.iter().all(|c| c.delivery == Delivery::V3Emulated && run_options(c, 5).gic == 3));
}

/// The issue-10 counters of a 1p2v run with `ios` reads: vCPU1 (fio) and
/// vCPU0 (hog).
fn gicv4_stats(exits: u64, irq_exits: u64, injected: u64, wakes: u64) -> String {
    format!(
        "{STATS}vcpu1.exits={exits}\nvcpu1.irq_exits={irq_exits}\nvcpu0.irq_exits={irq_exits}\n\
         vcpu1.irq_exits_msi={}\nvcpu0.lpis_injected={injected}\nvcpu1.doorbells={}\n\
         vcpu1.doorbells_runnable=3\nvcpu1.doorbells_spurious=2\nvcpu1.wakes_doorbell={wakes}\n",
        irq_exits / 2,
        wakes + 2
    )
}

#[test]
fn parses_gicv4_counters_per_io() {
    let mut s = sample_with(1000.0, 300.0, 1.0);
    s.fio.total_ios = 1000;
    s.stats = hypervisor::stats::parse_text(&gicv4_stats(3000, 50, 0, 990)).unwrap();
    let r = CaseResult { case: disk_matrix(&[Disk::Nvme], &[3, 4])[14], samples: vec![s.clone(), s], errors: vec![] };
    let sum = summarize(&r).unwrap();
    assert_eq!(sum.ios_with_stats, 2000);
    let fc = sum.fio_vcpu_counters.as_ref();
    assert_eq!(fc.and_then(|c| c.get("wakes_doorbell")), Some(1980));
    assert_eq!(fc.and_then(|c| c.get("doorbells")), Some(1984));
    assert_eq!(fc.and_then(|c| c.get("doorbells_runnable")), Some(6));
    assert_eq!(report::per_io(fc, "irq_exits_msi", sum.ios_with_stats), 0.025);
    assert_eq!(report::per_io(fc, "exits", sum.ios_with_stats), 3.0);
    // IRQ exits of both vCPUs: (50 + 50) × 2 repeats / 2000 reads.
    assert_eq!(report::per_io(sum.all_vcpu_counters.as_ref(), "irq_exits", 2000), 0.1);
    assert_eq!(report::per_io(sum.all_vcpu_counters.as_ref(), "lpis_injected", 2000), 0.0);
    assert!(report::per_io(None, "exits", 2000).is_nan());
    assert!(report::per_io(fc, "exits", 0).is_nan());
}

/// `--gic 3,4 --disk nvme` with made-up figures: 1p1v 1000 IOPS, 1p2v
/// xen-compat 90 (v3) / 80 (v4), wake-preempt 950 (v3) / 1000 (v4), the
/// hog-steered case 500; v3 injects an LPI per read, v4 none.
fn gic_results() -> Vec<CaseResult> {
    disk_matrix(&[Disk::Nvme], &[3, 4])
        .into_iter()
        .map(|case| {
            let v4 = case.delivery == Delivery::V4Direct;
            let iops = match (case.topology, case.sched, case.irq) {
                (Topology::OneP1V, _, _) => 1000.0,
                (_, _, Irq::MsiHog) => 500.0,
                (_, Sched::WakePreempt, _) => {
                    if v4 {
                        1000.0
                    } else {
                        950.0
                    }
                }
                _ => {
                    if v4 {
                        80.0
                    } else {
                        90.0
                    }
                }
            };
            let mut s = sample_with(iops, 400.0, 1.0);
            s.fio.total_ios = 1000;
            s.fio.clat_p50_us = 210.0;
            if case.topology == Topology::OneP2V {
                let (injected, wakes) = if v4 { (0, 990) } else { (1000, 0) };
                s.stats = hypervisor::stats::parse_text(&gicv4_stats(2500, 40, injected, wakes)).unwrap();
            }
            if case.idle == Idle::Poll {
                // Resident: v4 takes 10 MSI exits in 1000 reads, v3 one per read.
                let (irq_exits, injected) = if v4 { (20, 0) } else { (2000, 1000) };
                s.stats = hypervisor::stats::parse_text(&gicv4_stats(irq_exits + 5, irq_exits, injected, 0)).unwrap();
            }
            CaseResult { case, samples: vec![s], errors: vec![] }
        })
        .collect()
}

#[test]
fn report_shows_delivery_modes_and_issue10_targets() {
    let r = gic_results();
    let md = render_report(&r);
    assert!(md.contains("## Interrupt delivery: GICv3 emulated LPIs vs GICv4 direct vLPIs"), "{md}");
    // Per case: IOPS, p99, kick→run, exits/IO, fio vCPU IRQ exits/IO and its
    // MSI share, all IRQ exits/IO, LPIs/IO, doorbell wakes, doorbells by class.
    assert!(
        md.contains("| 1p2v unp preempt nvme v4-direct icount | 1000 | 400.0 | 7127 / 9845 | 2.500 | 0.040 | 0.020 | 0.080 | 0.000 | 990 | 992 / 3 / 2 |"),
        "{md}"
    );
    assert!(md.contains("| 1p2v unp preempt nvme v3-emulated icount | 950 | 400.0 | 7127 / 9845 | 2.500 | 0.040 | 0.020 | 0.080 | 1.000 | 0 | 2 / 3 / 2 |"), "{md}");
    assert!(
        md.contains(
            "| 1p1v unp xen-1000 nvme v4-direct icount | 1000 | 400.0 | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a / n/a / n/a |"
        ),
        "{md}"
    );
    // The resident-vCPU line: judged on MSI IRQ exits per I/O, v4 only.
    assert!(md.contains("### fio vCPU resident and alone on its pCPU (2p2v)"), "{md}");
    assert!(
        md.contains("| 2p2v msi-fio preempt nvme v4-direct realtime idle-poll | 1000 | 0.025 | 0.020 | 0.010 | 0.000 | 2 / 3 / 2 | met |"),
        "{md}"
    );
    assert!(
        md.contains("| 2p2v msi-fio preempt nvme v3-emulated realtime idle-poll | 950 | 2.005 | 2.000 | 1.000 | 0.000 | 2 / 3 / 2 | n/a (emulated: one exit per MSI) |"),
        "{md}"
    );
    assert_eq!(report::resident_status(0.099), Status::Met);
    assert_eq!(report::resident_status(0.1), Status::Missed);
    assert_eq!(report::resident_status(f64::NAN), Status::NotMeasured);
    // Steering: hog / fio.
    assert!(md.contains("### MSI aimed at the hog vCPU / at the fio vCPU"));
    assert!(
        md.contains("| 1p2v msi-hog preempt nvme v4-direct icount | 0.50× | 1.00× | 2.500 vs 2.500 | 990 / 990 |"),
        "{md}"
    );
    // The delivery targets per delivery mode; 1p1v not judged for a QEMU disk.
    let t = report::delivery_targets(&r.iter().filter_map(summarize).collect::<Vec<_>>());
    let verdicts: Vec<(Status, Status)> = t.iter().map(|x| (x.1, x.2)).collect();
    assert_eq!(
        verdicts,
        [
            (Status::NotMeasured, Status::Met), // passthrough (SPI on GICv3): 950 vs 90
            (Status::NotMeasured, Status::Met), // nvme v3-emulated: 950 vs 90
            (Status::NotMeasured, Status::Met), // nvme v4-direct: 1000 vs 80
        ]
    );
    assert!(md.contains("| nvme v4-direct | 1000 vs 1p1v 1000 = 1.00× **not meaningful (icount, QEMU disk)** | vs xen-compat 80 = 12.50× **met** | 210.0 µs (1.05×) |"), "{md}");
    assert!(md.contains("the 1p1v baseline is not meaningful under `-icount`"));
    // results.json names the delivery of the GICv4 cases only.
    let json = results_json(&r.iter().filter_map(summarize).collect::<Vec<_>>());
    let back: ResultsFile = serde_json::from_str(&json).unwrap();
    assert_eq!(back.cases.len(), 18);
    assert_eq!(back.cases[11].delivery, Delivery::V4Direct);
    assert_eq!((back.cases[17].idle, back.cases[16].idle), (Idle::Poll, Idle::Wfi));
    assert_eq!(back.cases[4].delivery, Delivery::V3Emulated);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["cases"][11]["delivery"], "v4-direct");
    assert_eq!(v["cases"][17]["idle"], "poll");
    assert!(v["cases"][16].get("idle").is_none());
    assert!(v["cases"][4].get("delivery").is_none());
}

/// A `1p1v+d1` console: the DomU's boot and hog lines (prefixed by the
/// hypervisor's console mux), Dom0's start mark, the recorded fio run with a
/// DomU line landing inside its JSON, and both domains' stats.
fn domu_console(hog_first: bool, stopped: u8, d1_run_ns: u64) -> String {
    let hog = format!("(d1) [    3.100000] Run /init as init process\n(d1) {HOG_MARK}\n");
    let start = format!("{FIO_START_MARK}\n");
    let mut c = if hog_first { format!("{hog}{start}") } else { format!("{start}{hog}") };
    let fio = CONSOLE.replacen("\"jobs\" : [", "\"jobs\" : [\n(d1) [   40.000001] random: crng init done", 1);
    assert_ne!(fio, CONSOLE);
    c.push_str(&fio);
    c.push_str("(HV) stats begin vcpu0\nvcpu0.run_ns=1000000000\n(HV) stats end vcpu0\n");
    c.push_str(&format!("(HV) stats begin dom1\ndom1.vcpus=1\ndom1.stopped={stopped}\n(HV) stats end dom1\n"));
    c.push_str(&format!(
        "(HV) stats begin d1.vcpu0\nd1.vcpu0.run_ns={d1_run_ns}\nd1.vcpu0.kick_to_run_ns.count=0\n(HV) stats end d1.vcpu0\n"
    ));
    c
}

#[test]
fn the_domu_case_runs_fio_in_dom0_and_the_hog_in_a_domu() {
    let case = Case { topology: Topology::OneP1VD1, sched: Sched::WakePreempt, clock: Clock::Icount, ..fixture_case() };
    assert_eq!(case.to_string(), "1p1v+d1 unpinned wake-preempt ram icount");
    assert_eq!(case.label(), "1p1v+d1 unp preempt ram icount");
    assert_eq!("1p1v+d1".parse::<Topology>().unwrap(), Topology::OneP1VD1);
    let t = case.topology;
    assert_eq!(
        (t.pcpus(), t.vcpus(), t.fio_vcpu(), t.has_hog(), t.domu_hog(), t.contended()),
        (1, 1, 0, false, true, true)
    );
    assert!(!Topology::OneP1V.contended() && Topology::OneP2V.contended() && !Topology::OneP2V.domu_hog());
    // Dom0 spins nothing; it waits for the DomU, marks fio's start, runs fio on its one vCPU.
    let cmd = guest_command(&case, 5);
    assert!(!cmd.contains("while :") && !cmd.contains("kill"), "{cmd}");
    let wait = cmd.find(&format!("sleep {DOMU_BOOT_WAIT_S}; echo {FIO_START_MARK}")).expect("waits, then marks");
    assert!(wait < cmd.find("taskset -c 0 fio --name=randread").unwrap());
    // The DomU: one, one vCPU, its hog behind the mark.
    let o = run_options(&case, 5);
    assert_eq!((o.pcpus, o.vcpus, o.icount), (1, 1, true));
    let d = o.domus.expect("a DomU");
    assert_eq!((d.count, d.vcpus, d.mem_mb), (1, 1, DOMU_HOG_MEM_MB));
    assert_eq!(d.cmd.as_deref(), Some("echo @@BENCH-HOG@@; while :; do :; done"));
    assert!(run_timeout(&case, 5) > run_timeout(&Case { topology: Topology::OneP1V, ..case }, 5));
    assert_eq!(run_options(&Case { topology: Topology::OneP2V, ..case }, 5).domus, None);
    assert_eq!(hypervisor_args(&case), hypervisor_args(&Case { topology: Topology::OneP1V, ..case }));
}

#[test]
fn a_domu_hog_run_counts_only_when_the_hog_ran_all_along() {
    let good = domu_console(true, 0, 3_000_000_000);
    // The DomU's line inside fio's JSON is dropped like a kernel line.
    let s = parse_console(&good).unwrap();
    assert_eq!(s.fio, parse_console(CONSOLE).unwrap().fio);
    assert_eq!(s.domu_stats[&0].counters.run_ns, 3_000_000_000);
    assert_eq!(s.stats[&0].counters.run_ns, 1_000_000_000);
    assert_eq!(parse::hog_share(Topology::OneP1VD1, &s), Some(0.75));
    assert_eq!(parse::hog_share(Topology::OneP1V, &s), None);
    assert_eq!(parse::check_domu_hog(&good, &s).unwrap(), 0.75);
    let err = |c: &str| format!("{:#}", parse::check_domu_hog(c, &parse_console(c).unwrap()).unwrap_err());
    let no_hog = good.replace(&format!("(d1) {HOG_MARK}"), "(d1) Kernel panic - not syncing");
    assert!(err(&no_hog).contains("never started"), "{}", err(&no_hog));
    // Dom0's copy of the mark (its own script's output) is not the DomU's.
    assert!(err(&good.replace(&format!("(d1) {HOG_MARK}"), HOG_MARK)).contains("never started"));
    assert!(err(&domu_console(false, 0, 3_000_000_000)).contains("started after fio"));
    assert!(err(&domu_console(true, 1, 3_000_000_000)).contains("stopped before Dom0"));
    assert!(err(&domu_console(true, 0, 10_000_000)).contains("did not run"));
    assert!(err(&good.replace("dom1.stopped=0", "")).contains("no dom1 stats"));
    assert!(err(&good.replace(FIO_START_MARK, "")).contains("never printed"));
    assert_eq!(parse::domu_line("(d12) x"), Some(12));
    for l in ["(d) x", "(dx) y", "d1) z", "(d1)x", "[ 1.0] (d1) x"] {
        assert_eq!(parse::domu_line(l), None, "{l}");
    }
    // 1p2v: the sibling hog (Dom0's vCPU0) over Dom0's vCPUs.
    let mut two = s.clone();
    two.stats = hypervisor::stats::parse_text("vcpu0.run_ns=600\nvcpu1.run_ns=400\n").unwrap();
    assert_eq!(parse::hog_share(Topology::OneP2V, &two), Some(0.6));
}

#[test]
fn the_report_judges_the_domu_case() {
    let r = quick_results();
    let sums: Vec<Summary> = r.iter().filter_map(summarize).collect();
    let d1 = sums.iter().find(|s| s.case.topology == Topology::OneP1VD1).unwrap();
    assert_eq!(d1.hog_share, Some(0.75));
    let checks = check_targets(&sums);
    let of = |n: usize| checks.iter().filter(|c| c.target == n).collect::<Vec<_>>();
    assert_eq!(of(5).len(), 1);
    assert_eq!((of(5)[0].status, of(5)[0].group.as_str()), (Status::Met, "ram/icount"));
    assert_eq!(of(5)[0].detail, "IOPS 920 vs 1p1v 1000 = 0.92× (≥ 0.90×); DomU hog's CPU share 75 %");
    assert_eq!(of(6)[0].status, Status::Met);
    assert_eq!(of(6)[0].detail, "IOPS 920 vs xen-compat 80 = 11.50× (≥ 10.00×); DomU hog's CPU share 75 %");
    // Below the lines: missed; without the DomU cases: not measured.
    let mut low = r.clone();
    for c in low.iter_mut().filter(|c| c.case.topology == Topology::OneP1VD1 && c.case.sched == Sched::WakePreempt) {
        c.samples[0].fio.iops = 700.0;
    }
    let checks = check_targets(&low.iter().filter_map(summarize).collect::<Vec<_>>());
    assert!(checks.iter().filter(|c| c.target >= 5).all(|c| c.status == Status::Missed));
    let without: Vec<Summary> = sums.iter().filter(|s| !s.case.topology.domu_hog()).cloned().collect();
    assert!(check_targets(&without).iter().filter(|c| c.target >= 5).all(|c| c.status == Status::NotMeasured));
    let md = render_report(&r);
    assert!(md.contains(report::TARGETS[4]) && md.contains(report::TARGETS[5]));
    assert!(md.contains("| 1p1v+d1 unpinned wake-preempt ram icount | 920 |"), "{md}");
    assert!(md.contains("| 4.00¹ | 75 % | "), "{md}");
    assert!(md.contains("| 1p1v+d1 unpinned wake-preempt ram icount | 0.92× | 1.20× | 2.00× |"), "{md}");
    assert!(md.contains("### A DomU's hog (1p1v+d1) / a sibling vCPU's hog (1p2v unpinned)"));
    assert!(md.contains("| 1p1v+d1 unpinned wake-preempt ram icount | 0.97× | 0.90× | 0.80× | 75 % vs - |"), "{md}");
    assert!(md.contains("| 1p1v+d1 unpinned wake-preempt ram icount | 1000 µs | 11.50× |"), "{md}");
    let back: ResultsFile = serde_json::from_str(&results_json(&sums)).unwrap();
    let c = back.cases.iter().find(|c| c.topology == Topology::OneP1VD1).unwrap();
    assert_eq!(c.hog_share, Some(0.75));
    assert_eq!(back.cases[0].hog_share, None);
}

/// A benchmark with a failed repeat exits non-zero, naming the case and
/// the console's last line; one without failures exits 0.
#[test]
fn a_failed_repeat_makes_the_bench_fail_naming_the_case_and_the_last_line() {
    let console = "guest: init ready\nCPU features: detected: CRC32 instructions\n\n";
    assert_eq!(last_console_line(console), "CPU features: detected: CRC32 instructions");
    assert_eq!(last_console_line(""), "(the console is empty)");
    let e = format!("repeat 1: QEMU timed out; last console line: {}", last_console_line(console));
    let err = format!("{:#}", check_failures([("1p2v wake-preempt".to_string(), e.as_str())]).unwrap_err());
    assert!(err.starts_with("1 failure(s):"), "{err}");
    assert!(
        err.contains("1p2v wake-preempt: repeat 1: QEMU timed out; last console line: CPU features: detected: CRC32"),
        "{err}"
    );
    assert!(check_failures(std::iter::empty::<(String, &str)>()).is_ok());
}
