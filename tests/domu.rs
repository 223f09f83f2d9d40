//! `cargo xtask run --domu N`: DomUs described in the DTB with Xen's
//! dom0less binding: the hypervisor parses them, places their RAM and
//! disks, logs both, and runs them beside Dom0 (consoles, input and the
//! self-test DomUs are tests/domu_selftest.rs's subject). And the
//! multi-domain acceptance runs: fio verify in three domains at once, a DomU's wild
//! accesses while Dom0's fio verifies, and Credit2 weights and caps across
//! domains measured in real guests.

use integration_tests::*;
use std::time::Duration;
use xtask::run::domu::DomuOptions;

/// fio writes `size` of /dev/vda in 4 KiB random blocks and verifies every
/// block's crc32c; prints its `err=` line and `fio-status=N`.
fn fio_verify(size: &str) -> String {
    format!(
        "fio --name=v --filename=/dev/vda --rw=randwrite --bs=4k --size={size} --direct=1 --ioengine=psync \
         --verify=crc32c --do_verify=1 </dev/null >/tmp/fio.out 2>&1; s=$?; grep 'err=' /tmp/fio.out; \
         echo fio-status=$s"
    )
}

/// `0x…-0x…` in a log line, as numbers.
fn range(s: &str) -> (u64, u64) {
    let (a, b) = s.split_once('-').expect("a range");
    let hex = |x: &str| u64::from_str_radix(x.trim().trim_start_matches("0x"), 16).expect("hex");
    (hex(a), hex(b))
}

/// Runs Dom0's `cmd` beside `domus` on 2 pCPUs (540 s at most) and types
/// `bytes` once the console has shown each of the `after` lines; `tweak`
/// sets the rest. Asserts the hypervisor printed no fatal line.
fn run_with_domus(
    cmd: String,
    domus: DomuOptions,
    after: &str,
    bytes: Vec<u8>,
    tweak: impl FnOnce(&mut RunOptions),
) -> RunResult {
    let mut o = RunOptions {
        cmd: Some(cmd),
        pcpus: 2,
        domus: Some(domus),
        early_input: Some(EarlyInput { after: after.into(), bytes }),
        echo: false,
        timeout: Duration::from_secs(540),
        ..Default::default()
    };
    tweak(&mut o);
    let r = run(&o);
    assert!(r.hv_fatal.is_none(), "{:?}", r.hv_fatal);
    r
}

#[test]
fn two_domus_are_parsed_and_placed_and_dom0_still_runs_its_command() {
    let domus =
        DomuOptions { count: 2, cmd: Some("echo from-domu".into()), mem_mb: 256, vcpus: 1, ..Default::default() };
    let r = run_cmd("echo dom0-says-$((6 * 7)); cat /proc/cmdline", |o| o.domus = Some(domus));
    assert_eq!(r.hv_fatal, None, "{}", tail(&r.console, 40));
    assert_eq!(r.guest_exit, Some(0), "{}", tail(&r.console, 40));
    // Dom0's command ran, with its own command line (no DomU guestcmd).
    assert_console(&r, "dom0-says-42");
    // One line per parsed DomU, as the DT says.
    for d in 1..=2 {
        let line = r
            .console
            .lines()
            .find(|l| l.contains(&format!("domU{d} (d{d}): 256 MiB, 1 vCPU, kernel 0x")))
            .unwrap_or_else(|| panic!("no line for domU{d}:\n{}", tail(&r.console, 80)));
        assert!(line.contains("weight 256, cap none, disk 64 MiB, vpl011"), "{line}");
        assert!(line.contains("bootargs \"console=ttyAMA0 guestcmd=ZWNobyBmcm9tLWRvbXU=\""), "{line}");
    }
    // Both placed: 2 MiB aligned, disjoint, outside Dom0's RAM.
    let dom0 = r
        .console
        .lines()
        .find_map(|l| l.split_once("guest RAM ").map(|(_, rest)| range(rest.split(',').next().unwrap())))
        .expect("Dom0's layout line");
    let mut placed = vec![dom0];
    for d in 1..=2 {
        let line = r
            .console
            .lines()
            .find(|l| l.contains(&format!("layout: d{d}: RAM ")))
            .unwrap_or_else(|| panic!("no placement for d{d}:\n{}", tail(&r.console, 80)));
        let rest = line.split_once(": RAM ").unwrap().1;
        let (ram, disk) = rest.split_once(", disk ").expect("a disk");
        let ram = range(ram);
        let disk = range(disk.split(';').next().unwrap());
        assert_eq!(ram.1 - ram.0, 256 << 20, "{line}");
        assert_eq!(disk.1 - disk.0, 64 << 20, "{line}");
        placed.extend([ram, disk]);
    }
    for (i, a) in placed.iter().enumerate() {
        assert_eq!(a.0 % (2 << 20), 0);
        for b in &placed[i + 1..] {
            assert!(a.1 <= b.0 || b.1 <= a.0, "{a:x?} overlaps {b:x?}");
        }
    }
    // Dom0 does not see the DomU nodes.
    assert!(!r.console.contains("xen,domain"));
}

#[test]
fn a_domu_too_small_for_its_modules_stops_the_boot_with_one_line() {
    // The CLI wants at least 128M; the runner takes what it is given.
    let domus = DomuOptions { count: 1, cmd: None, mem_mb: 64, vcpus: 1, ..Default::default() };
    let o = RunOptions { cmd: Some("true".into()), echo: false, domus: Some(domus), ..Default::default() };
    let r = run(&o);
    // The need depends on the guest image's sizes.
    let line = r.hv_fatal.clone().unwrap_or_else(|| panic!("no fatal line:\n{}", tail(&r.console, 30)));
    assert!(line.starts_with("(HV) fatal: boot layout: DomU d1's kernel, initrd and DTB need "), "{line}");
    assert!(line.ends_with(" MiB but its memory is 64 MiB"), "{line}");
    assert_eq!(r.console.matches("(HV) fatal:").count(), 1);
    assert!(!r.console.contains("Booting Linux"));
    assert!(xtask::run::qemu::exit_code(&o, &r).unwrap_err().to_string().contains(&line));
}

#[test]
fn fio_verifies_in_dom0_and_two_domus_at_once() {
    // The first multi-domain acceptance line: Dom0 on its disk (QEMU's virtio-blk,
    // passed through), each DomU on its own /dev/vda (the hypervisor's
    // virtio-blk over its RAM disk), all at the same time.
    // 512 MiB: in less the guest image's initramfs (85 MiB) does not unpack whole.
    let domus = DomuOptions { count: 2, cmd: Some(fio_verify("4M")), mem_mb: 512, vcpus: 1, ..Default::default() };
    let r = run_with_domus(
        format!("{}; echo dom0-fio-done; read go; exit $s", fio_verify("4M")),
        domus,
        "d1 powered off: the domain stops\nd2 powered off: the domain stops\ndom0-fio-done",
        b"go\n".to_vec(),
        with_qemu_disk,
    );
    let c = &r.console;
    assert_eq!(fio_errs(c, ""), [0], "Dom0's fio:\n{}", tail(c, 60));
    assert_console(&r, "\nfio-status=0");
    for d in 1..=2 {
        let p = format!("(d{d}) ");
        assert_eq!(fio_errs(c, &p), [0], "d{d}'s fio:\n{}", tail(c, 60));
        assert_console(&r, &format!("{p}fio-status=0"));
        // Served by the hypervisor's disk: 4 MiB written, 4 MiB verified.
        assert!(stat_line(c, &format!("d{d}.blk0.bytes_written")).unwrap() >= 4 << 20);
        assert!(stat_line(c, &format!("d{d}.blk0.bytes_read")).unwrap() >= 4 << 20);
        assert_eq!(stat_line(c, &format!("d{d}.blk0.io_errors")), Some(0));
        assert_eq!(stat_line(c, &format!("dom{d}.aborts_injected")), Some(0));
        // Its disk's requests were charged to its heap quota and given back.
        let q = |k: &str| stat_line(c, &format!("d{d}.quota.{k}")).unwrap_or_else(|| panic!("no d{d}.quota.{k}"));
        // The disk's largest request (4 MiB and its bookkeeping) stays
        // charged; what requests charged beyond it came back.
        let floor = q("used");
        assert!(floor > 4 << 20 && floor < (4 << 20) + 65536, "d{d} quota.used={floor}");
        assert!(q("hwm") <= q("limit"), "d{d} quota");
    }
    // The heap holds every quota and never came near its end.
    let heap = |k: &str| stat_line(c, &format!("heap.{k}")).unwrap_or_else(|| panic!("no heap.{k}"));
    assert!(heap("hwm") <= heap("size"));
    // Every DomU line is prefixed: no unprefixed fio line but Dom0's one.
    assert_eq!(c.lines().filter(|l| l.contains("v: (groupid=")).count(), 3);
    assert_eq!(r.guest_exit, Some(0));
}

/// Addresses a DomU with 512 MiB (guest-physical 0x40000000-0x60000000) on
/// QEMU virt's layout has nothing at, where the host has: the ITS, the
/// second pCPU's redistributor (the DomU has one vCPU: one GICR frame), the
/// RTC, the virtio-mmio slot of Dom0's passed-through disk, and Dom0's RAM
/// (identity-mapped, host 0x60000000-0xa0000000 here: its kernel, its
/// middle, its DTB; the test checks they are in Dom0's RAM). The
/// hypervisor's image (host 0x40200000) is inside the DomU's own RAM IPA
/// range, so the DomU cannot even name it. The hypervisor logs 16 bad
/// accesses per domain: 8 addresses, read and written.
const WILD: [u64; 8] =
    [0x0808_0000, 0x080c_0000, 0x0901_0000, 0x0a00_3e00, 0x6000_0000, 0x7000_0000, 0x8000_0000, 0x9fe0_0000];
const IN_DOM0_RAM: usize = 4;

/// Ctrl-A three times as QEMU's `-serial mon:stdio` passes it on (its own
/// escape key, doubled): the hypervisor's console input switch.
const SWITCH: &[u8] = b"\x01\x01\x01\x01\x01\x01";

#[test]
fn a_domus_wild_accesses_abort_while_dom0s_fio_verifies() {
    // The second multi-domain acceptance line. The DomU reads each address, then
    // writes it (devmem: a SIGBUS each), and goes on; meanwhile Dom0 runs
    // fio verify in a loop, still running when the DomU is done.
    let mut probe = String::new();
    for a in WILD {
        probe.push_str(&format!("devmem {a:#x} 32; devmem {a:#x} 32 0x5a5a5a5a; "));
    }
    // It starts when the test types a line to it, once Dom0's fio loop runs.
    let domu_cmd = format!("echo domu-waiting; read go; echo domu-probing; {probe}echo domu-still-alive");
    let domus = DomuOptions { count: 1, cmd: Some(domu_cmd), mem_mb: 512, vcpus: 1, ..Default::default() };
    let dom0 = format!(
        "(n=0; e=0; while [ ! -e /tmp/stop ]; do {} | grep -q 'fio-status=0' || e=$((e + 1)); n=$((n + 1)); \
         done; echo dom0-fio-runs=$n failed=$e) & \
         echo dom0-fio-looping; read go; [ -e /proc/$! ] && echo dom0-fio-still-running; touch /tmp/stop; wait",
        fio_verify("4M").replace("grep 'err=' /tmp/fio.out; ", "")
    );
    // Ctrl-A three times (doubled for QEMU's mon:stdio) moves the console
    // input to d1, then back to Dom0.
    let r = run_with_domus(dom0, domus, "(d1) domu-waiting\ndom0-fio-looping", [SWITCH, b"go\n"].concat(), |o| {
        o.then_input = Some(EarlyInput { after: "(d1) domu-still-alive".into(), bytes: [SWITCH, b"go\n"].concat() });
        with_qemu_disk(o);
    });
    let c = &r.console;
    // Dom0's RAM (identity-mapped: host-physical) is among the addresses.
    let line = c.lines().find(|l| l.contains("guest RAM ")).expect("Dom0's layout line");
    let (lo, hi) = range(line.split_once("guest RAM ").unwrap().1.split(',').next().unwrap());
    let inside = WILD.iter().filter(|&&a| (lo..hi).contains(&a)).count();
    assert!(inside >= IN_DOM0_RAM, "{inside} probes inside Dom0's RAM {lo:#x}-{hi:#x}");
    // Every access, read and write, was an abort the DomU survived.
    for a in WILD {
        let hit = |l: &&str| l.contains(" d1 vCPU") && l.contains(&format!(" at IPA {a:#x} (PC "));
        let n = c.lines().filter(|l| hit(l) && l.ends_with("injecting an external abort")).count();
        assert!(n >= 2, "{n} aborts at {a:#x}:\n{}", tail(c, 80));
    }
    assert_console(&r, "(d1) domu-still-alive");
    // The probing began after Dom0's fio loop had started.
    assert!(c.find("dom0-fio-looping").unwrap() < c.find("(d1) domu-probing").unwrap());
    assert!(stat_line(c, "dom1.aborts_injected").unwrap() >= 2 * WILD.len() as u64);
    assert_eq!(stat_line(c, "dom0.aborts_injected"), Some(0));
    // Dom0's fio ran across the DomU's probing and never failed.
    assert_console(&r, "dom0-fio-still-running");
    let runs = c.lines().find_map(|l| l.strip_prefix("dom0-fio-runs=")).expect("Dom0's fio summary");
    let (n, failed) = runs.split_once(" failed=").unwrap();
    assert!(n.parse::<u32>().unwrap() >= 1, "{runs}");
    assert_eq!(failed, "0", "{runs}");
    assert_eq!(r.guest_exit, Some(0));
}

/// Every `domN.run_ns=` value the console shows, in order (one per stats
/// print: Ctrl-\ and power-off).
fn run_ns(console: &str, dom: u32) -> Vec<u64> {
    run_ns_key(console, &format!("dom{dom}.run_ns="))
}

fn run_ns_key(console: &str, key: &str) -> Vec<u64> {
    console.lines().filter_map(|l| l.trim().strip_prefix(key)?.parse().ok()).collect()
}

/// Every domain runs a CPU hog (Dom0 one in the background); once all run,
/// the test types Ctrl-\ (stats) and a line, Dom0 sleeps `secs` of guest
/// time (`--icount`) and powers off. Returns each domain's share of a pCPU
/// between the two stats prints (Ctrl-\ and power-off), from the
/// scheduler's per-domain run time and the host clock (`host.now_ns`), both
/// read at one instant in each print.
fn hog_shares(domus: DomuOptions, hv_args: &str, secs: u32) -> (Vec<f64>, RunResult) {
    let n = domus.count;
    let dom0 = format!("(while :; do :; done) & echo dom0-hogging; read go; sleep {secs}; echo slept");
    let after: Vec<String> =
        (1..=n).map(|d| format!("(d{d}) domu-hogging")).chain(["dom0-hogging".to_string()]).collect();
    let domus = DomuOptions { cmd: Some("echo domu-hogging; while :; do :; done".into()), ..domus };
    let r = run_with_domus(dom0, domus, &after.join("\n"), b"\x1cgo\n".to_vec(), |o| {
        o.icount = true;
        o.hv_args = hv_args.into();
        // Busybox alone: four domains boot in a fraction of the time.
        o.initrd = Some(small_initrd());
    });
    assert!(r.console.contains("slept"), "{}", tail(&r.console, 80));
    let now = run_ns_key(&r.console, "host.now_ns=");
    assert_eq!(now.len(), 2, "host.now_ns printed {} times", now.len());
    let window = now[1] - now[0];
    assert!(window >= u64::from(secs) * 1_000_000_000, "window {window} ns");
    let shares = (0..=n)
        .map(|d| {
            let v = run_ns(&r.console, d);
            assert_eq!(v.len(), 2, "dom{d}.run_ns printed {} times:\n{}", v.len(), tail(&r.console, 80));
            (v[1] - v[0]) as f64 / window as f64
        })
        .collect();
    (shares, r)
}

#[test]
fn weights_512_256_256_256_share_two_pcpus_across_four_domains() {
    // The fairness line in a real guest run: 2 pCPUs, one unpinned
    // 1-vCPU hog per domain, Dom0 weight 512 and the DomUs 256.
    let domus = DomuOptions { count: 3, mem_mb: 256, weights: vec![256], ..Default::default() };
    let (s, r) = hog_shares(domus, "dom0_weight=512", 5);
    eprintln!("shares: {s:.3?}");
    for (d, want) in [0.80, 0.40, 0.40, 0.40].into_iter().enumerate() {
        assert!((s[d] - want).abs() <= 0.05, "dom{d}: {:.3} of a pCPU, want {want} ± 0.05 (all: {s:.3?})", s[d]);
    }
    assert_eq!(r.guest_exit, Some(0));
}

#[test]
fn weights_hold_across_a_runqueue_per_pcpu() {
    // As above with `credit2_runqueue=cpu`: two runqueues, so the weights
    // hold only if our mode's balance takes turns (Credit2's count balance
    // keeps a pairing: 0.667/0.5/0.333/0.5).
    let domus = DomuOptions { count: 3, mem_mb: 256, weights: vec![256], ..Default::default() };
    let (s, r) = hog_shares(domus, "dom0_weight=512 credit2_runqueue=cpu", 5);
    eprintln!("shares: {s:.3?}");
    assert!(r.console.contains("sched.rq1.pcpus=1-1"), "two runqueues:\n{}", tail(&r.console, 80));
    // Taking turns is the balance moving vCPUs between them.
    let last = |key: &str| run_ns_key(&r.console, key).last().copied().unwrap_or(0);
    let arrivals = last("sched.rq0.arrivals=") + last("sched.rq1.arrivals=");
    assert!(arrivals >= 10, "vCPUs moved between the runqueues {arrivals} times:\n{}", tail(&r.console, 80));
    for (d, want) in [0.80, 0.40, 0.40, 0.40].into_iter().enumerate() {
        assert!((s[d] - want).abs() <= 0.05, "dom{d}: {:.3} of a pCPU, want {want} ± 0.05 (all: {s:.3?})", s[d]);
    }
    assert_eq!(r.guest_exit, Some(0));
}

#[test]
fn three_equal_hogs_get_two_thirds_of_a_pcpu_each() {
    // Dom0 and two DomUs, default weights, one hog each on 2 pCPUs.
    let domus = DomuOptions { count: 2, mem_mb: 256, ..Default::default() };
    let (s, r) = hog_shares(domus, "", 5);
    eprintln!("shares: {s:.3?}");
    for (d, share) in s.iter().enumerate() {
        assert!((share - 2.0 / 3.0).abs() <= 0.03, "dom{d}: {share:.3} of a pCPU, want 0.667 ± 0.03 (all: {s:.3?})");
    }
    assert_eq!(r.guest_exit, Some(0));
}

#[test]
fn a_domu_capped_at_25_percent_gets_a_quarter_beside_hogs() {
    // d1 capped at 25 %, d2 and Dom0 uncapped hogs: on 2 pCPUs d1 gets
    // 0.25 of a pCPU, the others share the rest.
    let domus = DomuOptions { count: 2, mem_mb: 256, caps: vec![25, 0], ..Default::default() };
    let (s, r) = hog_shares(domus, "", 5);
    eprintln!("shares: {s:.3?}");
    assert!((s[1] - 0.25).abs() <= 0.01, "d1: {:.4} of a pCPU (all: {s:.3?})", s[1]);
    // The uncapped hogs share the rest: (2 - 0.25) / 2 each.
    for d in [0, 2] {
        assert!((s[d] - 0.875).abs() <= 0.05, "dom{d}: {:.3} (all: {s:.3?})", s[d]);
    }
    assert_eq!(r.guest_exit, Some(0));
}
