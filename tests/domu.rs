//! `cargo xtask run --domu N`: DomUs described in the DTB with Xen's
//! dom0less binding: the hypervisor parses them, places their RAM and
//! disks, logs both, and runs them beside Dom0 (what they do is
//! tests/domu_selftest.rs's subject).

use integration_tests::*;
use xtask::domu::DomuOptions;

/// `0x…-0x…` in a log line, as numbers.
fn range(s: &str) -> (u64, u64) {
    let (a, b) = s.split_once('-').expect("a range");
    let hex = |x: &str| u64::from_str_radix(x.trim().trim_start_matches("0x"), 16).expect("hex");
    (hex(a), hex(b))
}

#[test]
fn two_domus_are_parsed_and_placed_and_dom0_still_runs_its_command() {
    let domus = DomuOptions { count: 2, cmd: Some("echo from-domu".into()), mem_mb: 256, vcpus: 1 };
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
    let domus = DomuOptions { count: 1, cmd: None, mem_mb: 64, vcpus: 1 };
    let o = RunOptions { cmd: Some("true".into()), echo: false, domus: Some(domus), ..Default::default() };
    let r = run(&o);
    // The need depends on the guest image's sizes.
    let line = r.hv_fatal.clone().unwrap_or_else(|| panic!("no fatal line:\n{}", tail(&r.console, 30)));
    assert!(line.starts_with("(HV) fatal: boot layout: DomU d1's kernel, initrd and DTB need "), "{line}");
    assert!(line.ends_with(" MiB but its memory is 64 MiB"), "{line}");
    assert_eq!(r.console.matches("(HV) fatal:").count(), 1);
    assert!(!r.console.contains("Booting Linux"));
    assert!(xtask::qemu::exit_code(&o, &r).unwrap_err().contains(&line));
}
