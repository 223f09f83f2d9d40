//! Dom0 and a DomU side by side (`domu_selftest=1`: the DomU runs Dom0's
//! kernel and initrd on 2 vCPUs in 512 MiB carved from Dom0's RAM, with the
//! hypervisor's RAM virtio-blk and a vPL011): the DomU's console lines are
//! prefixed `(d1) `, it reaches userspace, writes and reads back its disk,
//! gets an abort for every wild access and keeps running; console input
//! moves between the domains with Ctrl-A three times; the DomU's power-off
//! stops only it, and the machine powers off with Dom0's exit status. And
//! the real path: dom0less DomUs (`--domu 2`) run their commands.

use integration_tests::*;
use std::time::Duration;

/// What the DomU runs (its /init's `guestcmd=`).
const DOMU_CMD: &str = "head -c 8388608 /dev/urandom > /tmp/d; a=$(sha256sum < /tmp/d); \
    dd if=/tmp/d of=/dev/vda bs=1M oflag=direct 2>/dev/null; sync; echo 3 > /proc/sys/vm/drop_caches; \
    b=$(dd if=/dev/vda bs=1M count=8 iflag=direct 2>/dev/null | sha256sum); \
    [ \"$a\" = \"$b\" ] && echo domu-disk-SAME; \
    for x in 0x60000000 0x9e000000 0x08080000 0x0c000000 0x7f00000000 0x10000000000; do devmem $x 32; done; \
    echo domu-still-alive; echo domu-waiting; read k; echo domu-got-$k";

/// Ctrl-A as QEMU's `-serial mon:stdio` passes it on (its own escape key,
/// doubled), three times: the hypervisor's input switch.
const SWITCH: &[u8] = b"\x01\x01\x01\x01\x01\x01";

#[test]
fn a_domu_runs_beside_dom0_isolated_with_its_own_console_and_disk() {
    let mut to_d1 = SWITCH.to_vec();
    to_d1.extend_from_slice(b"fromkbd\n");
    // Once d1 stopped (input went back to Dom0 by itself): Ctrl-A x3 finds
    // no other live domain and stays on Dom0; then Dom0's line.
    let mut to_d0 = SWITCH.to_vec();
    to_d0.extend_from_slice(b"go\n");
    let o = RunOptions {
        cmd: Some("echo dom0-waiting; read go; echo \"dom0-got-$go\" | tr -d '\\001'; exit 3".into()),
        pcpus: 2,
        mem_mb: 1536,
        hv_args: format!(
            // A per-vCPU weight for a vCPU Dom0 does not have (host-wide id
            // 1 is d1's first vCPU): a warning, not a failed boot.
            "domu_selftest=1 domu_selftest_vcpus=2 sched_vcpu_weight=1:512 domu_selftest_cmd={}",
            xtask::run::qemu::base64(DOMU_CMD.as_bytes())
        ),
        // Both domains wait at their `read` (earlier input could reach a
        // console nobody has opened yet).
        early_input: Some(EarlyInput { after: "(d1) domu-waiting\ndom0-waiting".into(), bytes: to_d1 }),
        then_input: Some(EarlyInput { after: "d1 powered off: the domain stops".into(), bytes: to_d0 }),
        echo: false,
        timeout: Duration::from_secs(540),
        ..Default::default()
    };
    let r = run(&o);
    assert!(r.hv_fatal.is_none(), "{:?}", r.hv_fatal);
    let c = &r.console;
    assert_console(&r, "sched_vcpu_weight=1:512: Dom0 has 1 vCPU(s), no vCPU 1; ignored");
    // The DomU booted its own kernel to userspace, every line prefixed.
    assert_console(&r, "d1: 2 vCPU(s), RAM 0x40000000+0x20000000");
    // Its second vCPU came up by PSCI CPU_ON (over HVC, to the hypervisor).
    assert!(c.lines().any(|l| l.starts_with("(d1) ") && l.contains("smp: Brought up 1 node, 2 CPUs")));
    assert_console(&r, "(d1) [    0.000000] Machine model: linux,dummy-virt");
    assert_console(&r, "(d1) guest: init ready");
    assert_console(&r, "(d1) domu-disk-SAME");
    assert!(!c.lines().any(|l| l.contains("domu-") && !l.starts_with("(d1) ")), "an unprefixed DomU line");
    // Dom0's lines are not prefixed.
    assert!(c
        .lines()
        .any(|l| l.starts_with("[") && l.contains("Kernel command line: console=ttyAMA0 earlycon=pl011,0x09000000")));
    // Every wild access of the DomU was an abort it survived.
    for ipa in ["0x60000000", "0x9e000000", "0x8080000", "0xc000000", "0x7f00000000", "0x10000000000"] {
        let hit = |l: &&str| l.contains(" d1 vCPU") && l.contains(&format!(" at IPA {ipa} (PC "));
        assert!(c.lines().any(|l| hit(&l) && l.ends_with("injecting an external abort")), "no abort at {ipa}");
    }
    assert_console(&r, "(d1) domu-still-alive");
    assert!(stat_line(c, "dom1.aborts_injected").unwrap() >= 6);
    assert_eq!(stat_line(c, "dom0.aborts_injected"), Some(0));
    // Its disk is the hypervisor's, served from its RAM image.
    assert!(stat_line(c, "d1.blk0.bytes_written").unwrap() >= 8 << 20);
    assert!(stat_line(c, "d1.blk0.bytes_read").unwrap() >= 8 << 20);
    assert_eq!(stat_line(c, "d1.blk0.io_errors"), Some(0));
    assert!(stat_line(c, "dom1.disk_requests").unwrap() > 0);
    // Input: Ctrl-A x3 to d1, a line; d1 stops and input returns to Dom0.
    assert_console(&r, "(HV) input to d1");
    assert_console(&r, "(d1) domu-got-fromkbd");
    let stop = c.find("d1 powered off: the domain stops").expect("d1 stopped");
    assert!(c[stop..].contains("(HV) input to d0"), "input did not return to Dom0 when d1 stopped");
    assert_console(&r, "dom0-got-go");
    // The DomU's power-off stopped it alone; Dom0's stopped the machine
    // with Dom0's status.
    assert_console(&r, "(d1) @@GUEST-EXIT 0@@");
    assert_console(&r, "d1 powered off: the domain stops");
    assert_eq!(stat_line(c, "dom1.stopped"), Some(1));
    assert_console(&r, "dom0 powered off");
    assert_eq!(r.guest_exit, Some(3));
}

#[test]
fn dom0less_domus_run_their_commands_beside_dom0() {
    // The real path: `cargo xtask run --domu 2` (Xen's dom0less nodes in the
    // DTB, placed by the boot plan); Dom0 waits until both DomUs stopped.
    let domus = xtask::run::domu::DomuOptions {
        count: 2,
        cmd: Some("echo from-$((40 + 2))".into()),
        mem_mb: 256,
        vcpus: 1,
        ..Default::default()
    };
    let o = RunOptions {
        cmd: Some("echo dom0-waiting; read go; echo dom0-got-$go".into()),
        pcpus: 2,
        domus: Some(domus),
        early_input: Some(EarlyInput {
            after: "d1 powered off: the domain stops\nd2 powered off: the domain stops\ndom0-waiting".into(),
            bytes: b"go\n".to_vec(),
        }),
        echo: false,
        timeout: Duration::from_secs(540),
        ..Default::default()
    };
    let r = run(&o);
    assert!(r.hv_fatal.is_none(), "{:?}", r.hv_fatal);
    for d in 1..=2 {
        assert_console(&r, &format!("d{d}: 1 vCPU(s), RAM 0x40000000+0x10000000"));
        assert_console(&r, &format!("(d{d}) from-42"));
        assert_console(&r, &format!("(d{d}) @@GUEST-EXIT 0@@"));
        assert_eq!(stat_line(&r.console, &format!("dom{d}.stopped")), Some(1));
    }
    assert_console(&r, "dom0-got-go");
    assert_eq!(r.guest_exit, Some(0));
}
