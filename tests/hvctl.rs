//! `hvctl` in Dom0 against the running hypervisor (docs/hvctl.md): the
//! domain list, a cap set while the domains run and the share it moves,
//! bad requests and accesses answered with errors and counters, a DomU
//! that has no control device; the wake path switched off and on in one
//! boot, with the seed fio experiment's figures after each.

use integration_tests::*;
use std::time::Duration;
use xtask::run::domu::DomuOptions;

/// `hvctl list -l` snapshots printed as `L<n> <line>`: each domain's
/// `run_ns` per snapshot, by domain id.
fn snapshots(console: &str, n: usize) -> Vec<Vec<u64>> {
    (0..n)
        .map(|s| {
            let prefix = format!("L{s} ");
            let mut by_dom: Vec<(u64, u64)> = console
                .lines()
                .filter_map(|l| l.trim().strip_prefix(&prefix))
                .map(|l| {
                    let field = |k: &str| -> u64 {
                        l.split_whitespace()
                            .find_map(|kv| kv.strip_prefix(k)?.parse().ok())
                            .unwrap_or_else(|| panic!("no {k} in {l:?}"))
                    };
                    (field("domid="), field("run_ns="))
                })
                .collect();
            by_dom.sort();
            by_dom.into_iter().map(|(_, ns)| ns).collect()
        })
        .collect()
}

/// Whether DomU `d` printed a kernel line (`(dN) [ time] ...`) ending in
/// `text`.
fn guest_line(console: &str, d: u32, text: &str) -> bool {
    let prefix = format!("(d{d}) [");
    console.lines().any(|l| l.starts_with(&prefix) && l.trim_end().ends_with(text))
}

/// Domain `d`'s share of everything run between snapshots `a` and `b` (one
/// pCPU, every domain hogging: the pCPU's time).
fn share(s: &[Vec<u64>], d: usize, a: usize, b: usize) -> f64 {
    let total: u64 = (0..s[a].len()).map(|i| s[b][i] - s[a][i]).sum();
    (s[b][d] - s[a][d]) as f64 / total as f64
}

#[test]
fn hvctl_lists_domains_caps_one_live_and_refuses_bad_requests() {
    // Dom0 and two DomUs hog one pCPU; with d2 paused, Dom0 snapshots the
    // run times, caps d1 at 25 % and snapshots again. Then the error paths.
    let dom0 = "\
        hvctl list; hvctl pause domU2; (while :; do :; done) & sleep 2; \
        hvctl list -l > /tmp/l0; sleep 3; hvctl list -l > /tmp/l1; \
        hvctl sched-credit2 -d 1 -c 25; echo cap-rc=$?; hvctl sched-credit2 -d 1; \
        sleep 1; hvctl list -l > /tmp/l2; sleep 3; hvctl list -l > /tmp/l3; hvctl unpause domU2; \
        for f in 0 1 2 3; do sed \"s/^/L$f /\" /tmp/l$f; done; \
        hvctl sched-credit2 -d 1 -w 70000; echo weight-rc=$?; \
        hvctl sched-credit2 -d 7 -c 10; echo nodom-rc=$?; \
        hvctl destroy 0; echo destroy-rc=$?; hvctl shutdown 0; echo shutdown-rc=$?; \
        r1() { hvctl list -l | sed -n 's/^domid=1 .*run_ns=\\([0-9]*\\).*/\\1/p'; }; \
        hvctl pause 1; echo pause-rc=$?; hvctl list | grep '^domU1 '; sleep 1; p0=$(r1); sleep 2; p1=$(r1); \
        hvctl unpause 1; echo unpause-rc=$?; sleep 1; u0=$(r1); sleep 2; u1=$(r1); \
        echo paused-ran=$((p1 - p0)) unpaused-ran=$((u1 - u0)); \
        a=$(ls /proc/device-tree/hypervisor | sed -n 's/^control@//p'); echo control-at=$a; \
        devmem 0x$(printf %x $((0x$a + 0x38))) 32; echo badreg-rc=$?; \
        hvctl stats | grep -E '^control\\.(requests|bad_accesses|err\\.(range|no_dom|perm))='; \
        hvctl top -b -n 2 -d 1; \
        hvctl trace dump > /tmp/trace; head -n 1 /tmp/trace; echo trace-lines=$(grep -c . /tmp/trace); \
        hvctl destroy domU2; r=$?; sleep 1; echo destroy2-rc=$r; hvctl list -l | sed 's/^/F /'; hvctl vcpu-list; \
        timeout 120 hvctl shutdown -w domU1; echo shutdown1-rc=$?; hvctl list -l | sed 's/^/G /'"
        .to_string();
    let domus = DomuOptions {
        count: 2,
        mem_mb: 256,
        cmd: Some("hvctl list; echo domu-hvctl-rc=$?; while :; do :; done".into()),
        ..Default::default()
    };
    let r = run(&RunOptions {
        cmd: Some("sh /etc/hvctl-test-list.sh".into()),
        pcpus: 1,
        vcpus: 1,
        domus: Some(domus),
        icount: true,
        echo: false,
        // Busybox with hvctl: three domains boot in a fraction of the time.
        initrd: Some(
            xtask::build::hvctl::initrd_with_script(
                &xtask::build::hvctl::initrd_with_hvctl(&small_initrd(), "small").expect("initrd with hvctl"),
                "hvctl-test-list",
                &dom0,
            )
            .expect("initrd with the script"),
        ),
        timeout: Duration::from_secs(600),
        ..Default::default()
    });
    assert!(r.hv_fatal.is_none(), "{:?}", r.hv_fatal);
    let c = &r.console;
    // `xl list`'s shape, the three domains.
    for row in ["Dom0 ", "domU1 ", "domU2 "] {
        assert!(c.lines().any(|l| l.starts_with(row)), "no {row:?} row:\n{}", tail(c, 80));
    }
    assert_console(&r, "Name                                        ID   Mem VCPUs");
    assert_console(&r, "cap-rc=0");
    assert!(c.lines().any(|l| l.starts_with("domU1 ") && l.trim_end().ends_with("256   25")), "{}", tail(c, 60));
    // d1's share of the pCPU: half beside Dom0's hog (d2 paused), a
    // quarter capped.
    let s = snapshots(c, 4);
    assert!(s.iter().all(|v| v.len() == 3), "three domains in each snapshot: {s:?}\n{}", tail(c, 60));
    let (before, after) = (share(&s, 1, 0, 1), share(&s, 1, 2, 3));
    eprintln!("d1's share: {before:.3} uncapped, {after:.3} capped at 25 %");
    assert!((before - 0.5).abs() <= 0.03, "uncapped beside Dom0's hog: {before:.3}");
    assert!((after - 0.25).abs() <= 0.02, "capped at 25 %: {after:.3}");
    // Bad requests: one line from hvctl, a non-zero status, a counter.
    assert_console(&r, "hvctl: weight 70000 out of range");
    assert_console(&r, "weight-rc=2");
    assert_console(&r, "hvctl: no domain `7`");
    assert_console(&r, "nodom-rc=1");
    assert_console(&r, "hvctl: not permitted");
    assert_console(&r, "destroy-rc=1");
    assert_console(&r, "shutdown-rc=1");
    // `hvctl pause`: d1 (a hog) runs no more, shows `p`; unpaused, it runs.
    assert_console(&r, "pause-rc=0");
    assert_console(&r, "unpause-rc=0");
    assert!(c.lines().any(|l| l.starts_with("domU1 ") && l.contains("--p---")), "{}", tail(c, 60));
    let ran = |k: &str| -> u64 {
        c.split(k).nth(1).and_then(|s| s.split_whitespace().next()?.parse().ok()).unwrap_or_else(|| panic!("no {k}"))
    };
    assert_eq!(ran("paused-ran="), 0, "a paused domain runs no more");
    assert!(ran("unpaused-ran=") > 200_000_000, "unpaused, it runs again: {}", ran("unpaused-ran="));
    // An access the page does not decode: an external abort (SIGBUS).
    assert_console(&r, "badreg-rc=135");
    assert_console(&r, "control.bad_accesses=1");
    assert_console(&r, "control.err.perm=2");
    check_top(&r);
    check_trace_destroy_and_shutdown(&r);
    assert_eq!(r.guest_exit, Some(0), "{}", tail(c, 40));
}

/// `hvctl top -b -n 2 -d 1`'s frames: CPU % of the three domains within
/// one pCPU's 100, the interval's rates.
fn check_top(r: &RunResult) {
    let c = &r.console;
    // `top`: two frames, CPU % of the three domains within one pCPU's 100.
    let frames: Vec<f64> = c
        .split("hvctl top - 3 domains")
        .skip(1)
        .map(|f| {
            f.lines()
                .filter(|l| ["Dom0 ", "domU1 ", "domU2 "].iter().any(|n| l.starts_with(n)))
                .take(3)
                .map(|l| l.split_whitespace().nth(2).and_then(|v| v.parse::<f64>().ok()).expect("a CPU(%) column"))
                .sum()
        })
        .collect();
    assert_eq!(frames.len(), 2, "{}", tail(c, 30));
    assert_console(r, "IRQS/s     IOPS KICK-P50(us) KICK-P99(us)");
    let dom0_irqs: Vec<f64> = c
        .split("hvctl top - 3 domains")
        .skip(1)
        .filter_map(|f| f.lines().find(|l| l.starts_with("Dom0 "))?.split_whitespace().nth(4)?.parse().ok())
        .collect();
    assert!(dom0_irqs.len() == 2 && dom0_irqs.iter().all(|&n| n > 0.0), "Dom0's IRQs/s: {dom0_irqs:?}");
    assert!(frames.iter().all(|&sum| sum > 90.0 && sum <= 100.5), "CPU % per frame: {frames:?}");
}

/// The flight recorder's dump, `hvctl destroy domU2`, `hvctl shutdown -w
/// domU1`, and DomUs' own `hvctl` finding no device.
fn check_trace_destroy_and_shutdown(r: &RunResult) {
    let c = &r.console;
    // The flight recorder, read whole through the pages.
    assert_console(r, "(HV) trace begin reason=hvctl");
    let lines: u64 =
        c.split("trace-lines=").nth(1).and_then(|s| s.lines().next()?.trim().parse().ok()).expect("a count");
    assert!(lines > 20, "{lines} lines of trace");
    // `hvctl destroy domU2`: it stops, its vCPU goes offline, it is reaped
    // and leaves the lists (as `xl destroy` does); the others run on.
    assert_console(r, "destroy2-rc=0");
    assert_console(r, "d2 destroyed (hvctl destroy): the domain stops");
    assert_console(r, "d2: reaped");
    let fin = |d: u32| c.lines().find(|l| l.starts_with(&format!("F domid={d} ")));
    assert!(fin(2).is_none(), "{:?}", fin(2));
    let d1 = fin(1).expect("a final line for d1");
    assert!(d1.contains(" state=running ") || d1.contains(" state=blocked "), "{d1}");
    let after = c.split("F domid=0 ").nth(1).expect("the final list");
    assert!(!after.lines().any(|l| l.starts_with("domU2 ")), "{}", tail(c, 20));
    // `hvctl shutdown -w domU1`: its kernel syncs and powers off (SysRq
    // on its console), it stays listed as shut down (a boot-time DomU).
    assert_console(r, "d1: shutdown requested (hvctl shutdown)");
    for what in ["Emergency Sync", "Emergency Remount R/O", "Power Off"] {
        assert!(guest_line(c, 1, &format!("sysrq: {what}")), "no (d1) sysrq: {what}:\n{}", tail(c, 60));
    }
    assert_console(r, "d1 powered off: the domain stops");
    assert_console(r, "d1: shut down");
    assert_console(r, "shutdown1-rc=0");
    let g1 = c.lines().find(|l| l.starts_with("G domid=1 ")).expect("a last line for d1");
    assert!(g1.contains(" state=shutdown "), "{g1}");
    // A DomU has no control device.
    for d in 1..=2 {
        assert_console(r, &format!("(d{d}) hvctl: no control device"));
        assert_console(r, &format!("(d{d}) domu-hvctl-rc=1"));
    }
}

/// fio's read IOPS from its `read: IOPS=N` line after `marker`.
fn iops_after(console: &str, marker: &str) -> f64 {
    let rest = console.split(marker).nth(1).unwrap_or_else(|| panic!("no {marker}:\n{}", tail(console, 60)));
    let v = rest.split("IOPS=").nth(1).and_then(|s| s.split(',').next()).expect("an IOPS= figure");
    match v.strip_suffix('k') {
        Some(k) => k.parse::<f64>().expect("IOPS") * 1000.0,
        None => v.parse().expect("IOPS"),
    }
}

#[test]
fn hvctl_switches_the_wake_path_in_one_boot() {
    // The seed experiment (1 pCPU, Dom0's 2 vCPUs: a hog on vCPU0, fio
    // 4 KiB randread qd1 on the RAM disk on vCPU1) twice in one boot: with
    // the extensions switched off by hvctl (Xen's Credit2: the hog's 1 ms
    // ratelimit window holds each completion, ~100 IOPS), then on again.
    let fio = xtask::bench::fio_command(3, "/dev/vda").replace(" --output-format=json", "");
    let cmd = format!(
        "taskset -c 0 sh -c 'while :; do :; done' & \
         hvctl set sched_wake_preempt=off; echo off-rc=$?; hvctl sched-credit2 -s; echo run-off; taskset -c 1 {fio}; \
         hvctl set sched_wake_preempt=on; echo on-rc=$?; hvctl sched-credit2 -s; echo run-on; taskset -c 1 {fio}; \
         hvctl set sched_credit2_max_cpus_runqueue=4; echo boot-only-rc=$?"
    );
    let r = run(&RunOptions {
        cmd: Some(cmd),
        pcpus: 1,
        vcpus: 2,
        icount: true,
        echo: false,
        hv_args: format!("dom0_disk=ram dom0_disk_latency_us={}", xtask::bench::RAM_DISK_LATENCY_US),
        timeout: Duration::from_secs(900),
        ..Default::default()
    });
    assert!(r.hv_fatal.is_none(), "{:?}", r.hv_fatal);
    assert_console(&r, "off-rc=0");
    assert_console(&r, "wake_preempt=off");
    assert_console(&r, "on-rc=0");
    let (off, on) = (iops_after(&r.console, "run-off"), iops_after(&r.console, "run-on"));
    eprintln!("same boot: {off:.0} IOPS with sched_wake_preempt=off, {on:.0} with =on");
    assert!((80.0..=130.0).contains(&off), "xen-compat: {off} IOPS, want ~100");
    assert!(on >= 10.0 * off, "wake-preempt: {on} IOPS vs {off}");
    assert_console(&r, "hvctl: unknown option, or not settable while running");
    assert_console(&r, "boot-only-rc=1");
    assert_eq!(r.guest_exit, Some(0), "{}", tail(&r.console, 40));
}

/// The value of `key=` on the last console line that starts with `prefix`
/// and holds it.
fn last_value(console: &str, prefix: &str, key: &str) -> u64 {
    console
        .lines()
        .rev()
        .filter_map(|l| l.trim().strip_prefix(prefix))
        .find_map(|l| l.trim().strip_prefix(key)?.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix}{key}:\n{}", tail(console, 60)))
}

#[test]
fn hvctl_creates_domus_from_the_pool_and_destroy_gives_everything_back() {
    // Dom0 (1 pCPU) makes a DomU from the kernel and initrd in its own
    // initramfs, which prints and powers off (and so is destroyed); one
    // that would run on, shut down by `hvctl shutdown -w`; then makes and
    // destroys 19 more while they boot. The pool's and the heap's figures
    // at the end must be the ones before the first.
    let domu_cmd = xtask::text::base64(b"echo created-domu-says-$((6*7))");
    let long_cmd = xtask::text::base64(b"echo long-job-up; sleep 600");
    let cfg = format!(
        "name = \"job\"\\nkernel = \"/boot/domu/Image\"\\nramdisk = \"/boot/domu/initrd\"\\n\
         extra = \"console=ttyAMA0 guestcmd={domu_cmd}\"\\nmemory = 128\\nvcpus = 1\\ncpus = \"1\"\\ndisk_size = 16\\n"
    );
    // The reaper logs from another pCPU, whenever the grace period ends:
    // Dom0 prints a status only once it waited for that (a hypervisor line
    // breaks an open guest line).
    let dom0 = format!(
        "figures() {{ hvctl stats | grep -E '^(heap\\.used|pool\\.(size|free|domains))=' | sed \"s/^/$1 /\"; }}; \
         gone() {{ for i in $(seq 120); do hvctl list -l | grep -q ' name=job ' || return 0; sleep 0.5; done; return 1; }}; \
         figures S0; printf '{cfg}' > /tmp/job.cfg; \
         hvctl create /tmp/job.cfg; echo create-rc=$?; hvctl list; \
         d=$(hvctl list -l | sed -n 's/^domid=\\([0-9]*\\) name=job .*/\\1/p'); echo job-domid=$d; \
         sleep 1; gone; echo gone-rc=$?; \
         sed 's|guestcmd=[^ \"]*|guestcmd={long_cmd}|' /tmp/job.cfg > /tmp/long.cfg; \
         hvctl create /tmp/long.cfg; sleep 2; timeout 120 hvctl shutdown -w job; r=$?; gone; g=$?; \
         echo shutdown-rc=$r gone2-rc=$g; figures S1; \
         n=0; for c in $(seq 19); do hvctl create /tmp/job.cfg >/dev/null && sleep 1 && \
           d=$(hvctl list -l | sed -n 's/^domid=\\([0-9]*\\) name=job .*/\\1/p') && hvctl destroy $d && gone && n=$((n+1)); done; \
         echo cycles-ok=$n; figures S2; hvctl list -l | sed 's/^/F /'; \
         sed 's|/boot/domu/Image|/etc/hvctl/domu.cfg|' /tmp/job.cfg > /tmp/bad.cfg; hvctl create /tmp/bad.cfg; echo notimage-rc=$?; \
         sed 's/memory = 128/memory = 4096/' /tmp/job.cfg > /tmp/big.cfg; hvctl create /tmp/big.cfg; echo big-rc=$?; \
         sed 's/^cpus = .*/cpus = \"5\"/' /tmp/job.cfg > /tmp/pin.cfg; hvctl create /tmp/pin.cfg; echo pin-rc=$?; \
         figures S3; hvctl stats | grep -E '^control\\.err\\.(format|no_mem)='"
    );
    let g = xtask::build::image::guest().expect("guest image");
    let small = small_initrd();
    let dom0_initrd = xtask::build::hvctl::initrd_with_hvctl(&small, "small").expect("initrd with hvctl");
    let initrd = xtask::build::hvctl::initrd_with_domu_files(&dom0_initrd, &g.kernel, &small, "small-test")
        .expect("initrd with the DomU's files");
    // Longer than the kernel command line holds: a file in the initrd.
    let initrd = xtask::build::hvctl::initrd_with_script(&initrd, "hvctl-test-create", &dom0).expect("the script");
    let r = run(&RunOptions {
        cmd: Some("sh /etc/hvctl-test-create.sh".into()),
        pcpus: 2,
        vcpus: 2,
        domu_pool_mb: 192,
        echo: false,
        initrd: Some(initrd),
        timeout: Duration::from_secs(900),
        ..Default::default()
    });
    assert!(r.hv_fatal.is_none(), "{:?}", r.hv_fatal);
    let c = &r.console;
    assert_console(&r, "create-rc=0");
    // Its console, with its prefix, and its command's output.
    assert!(c.contains("(d1) created-domu-says-42"), "{}", tail(c, 80));
    assert!(c.lines().any(|l| l.starts_with("job ")), "`hvctl list` shows it:\n{}", tail(c, 80));
    // It powered off by itself: destroyed as xl's on_poweroff="destroy".
    assert_console(&r, "job-domid=1");
    assert_console(&r, "d1: destroyed (on_poweroff=destroy)");
    assert_console(&r, "gone-rc=0");
    assert_console(&r, "d1: reaped");
    // `hvctl shutdown -w` of one that would run for 10 minutes: its kernel
    // syncs and powers off, and it is destroyed and reaped.
    assert_console(&r, "(d2) long-job-up");
    assert!(guest_line(c, 2, "sysrq: Power Off"), "{}", tail(c, 60));
    assert_console(&r, "d2: shut down and destroyed");
    assert_console(&r, "shutdown-rc=0 gone2-rc=0");
    assert_console(&r, "d2: reaped");
    assert_console(&r, "cycles-ok=19");
    for l in c.lines().filter(|l| l.starts_with('S') && l.contains(" heap.used=")) {
        eprintln!("{l}");
    }
    // Everything back: the pool whole, the heap exactly where it was.
    let pool = last_value(c, "S0 ", "pool.size=");
    assert_eq!(pool, 192 << 20);
    for s in ["S1 ", "S2 ", "S3 "] {
        assert_eq!(last_value(c, s, "pool.free="), pool, "{s}pool.free");
        assert_eq!(last_value(c, s, "pool.domains="), 0, "{s}pool.domains");
        assert_eq!(last_value(c, s, "heap.used="), last_value(c, "S0 ", "heap.used="), "{s}heap.used");
    }
    assert_eq!(last_value(c, "S0 ", "pool.free="), pool);
    // Only Dom0 is left.
    let fin: Vec<&str> = c.lines().filter(|l| l.starts_with("F domid=")).collect();
    assert_eq!(fin.len(), 1, "{fin:?}");
    // Bad input: one line and a status, nothing taken.
    assert_console(&r, "notimage-rc=");
    assert!(!c.contains("notimage-rc=0"), "{}", tail(c, 40));
    assert!(!c.contains("big-rc=0"), "{}", tail(c, 40));
    assert_console(&r, "hvctl: not enough memory");
    // `cpus = "1"` pinned each of them; a pCPU the machine lacks is refused.
    assert_console(&r, "pin-rc=1");
    assert_console(&r, "hvctl create: cpus: no pCPU 5 (the machine has 2)");
    assert_console(&r, "hvctl: value out of range");
    assert_eq!(r.guest_exit, Some(0), "{}", tail(c, 40));
}
