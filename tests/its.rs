//! The physical ITS: host LPIs work end to end at boot (the self-test maps a
//! spare DeviceID, sends INT and takes the LPI at EL2), on GICv3 and GICv4
//! machines, and Linux still boots with the ITS owned by the hypervisor.

use integration_tests::*;

fn boots_with_host_lpis(gic: u8) {
    let r = run_cmd(r#"dmesg | grep -E "started at EL""#, |o| {
        o.gic = gic;
        o.pcpus = 2;
        o.vcpus = 2;
    });
    assert_console(&r, &format!("ITS: GICv{gic} ITS at 0x8080000, 8192 LPIs, self-test LPI 8192 delivered"));
    assert_console(&r, "CPU: All CPU(s) started at EL1");
    assert_eq!(r.guest_exit, Some(0));
    let s = |k: &str| stat_line(&r.console, k).unwrap_or_else(|| panic!("no {k} in\n{}", tail(&r.console, 40)));
    // One collection per pCPU, the self-test's device mapped and unmapped,
    // its event mapped, moved, fired and discarded.
    assert_eq!(s("its.cmd.MAPC"), 2);
    assert_eq!(s("its.cmd.MAPD"), 2);
    assert_eq!((s("its.cmd.MAPTI"), s("its.cmd.INT"), s("its.cmd.DISCARD")), (1, 1, 1));
    // Moved to pCPU 1 and back before it fired.
    assert_eq!(s("its.cmd.MOVI"), 2);
    assert!(s("its.cmd.SYNC") >= 5);
    assert!(s("its.lpis_taken") >= 1);
    assert_eq!((s("its.cmd_errors"), s("its.cmd_timeouts")), (0, 0));
}

#[test]
fn host_lpis_on_a_gicv3_machine() {
    boots_with_host_lpis(3);
}

#[test]
fn host_lpis_on_a_gicv4_machine() {
    boots_with_host_lpis(4);
}
