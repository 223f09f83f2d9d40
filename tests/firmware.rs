//! The firmware boot flow (`cargo xtask run --firmware tf-a`): TF-A's BL1,
//! BL2 and BL31 at EL3, the hypervisor entered by BL31 at EL2 as BL33 with
//! x0 = the DTB, its options from `/chosen/xen,xen-bootargs`, secondary
//! pCPUs through the firmware's PSCI, power-off through the firmware.

use integration_tests::*;
use xtask::firmware::Firmware;

fn boots_through_tf_a(gic: u8) {
    let r = run_cmd(r#"nproc; dmesg | grep "started at EL""#, |o| {
        o.firmware = Some(Firmware::TfA);
        o.gic = gic;
        o.pcpus = 2;
        o.vcpus = 2;
    });
    // TF-A ran at EL3 and handed over to the hypervisor preloaded at the
    // BL33 address, with QEMU's DTB (patched by BL2) at the base of RAM.
    assert_console(&r, "NOTICE:  BL31: v2.8");
    assert_console(&r, "(HV) INFO  hypervisor 0.1.0 on qemu-virt (image 0x40200000-");
    assert_console(&r, "dtb 0x40000000, x0 = dtb)");
    // The options came through the DTB (QEMU has no -append here).
    assert_console(&r, "(HV) INFO  options: dom0_mem=1024M dom0_max_vcpus=2");
    // pCPU 1 came up through TF-A's PSCI CPU_ON.
    assert_console(&r, "2 pCPU(s) online");
    assert_eq!(r.guest_exit, Some(0), "{}", tail(&r.console, 40));
    assert!(r.console.lines().any(|l| l.trim() == "2"), "nproc did not print 2:\n{}", tail(&r.console, 40));
    assert_console(&r, "CPU: All CPU(s) started at EL1");
    // SYSTEM_OFF went to the firmware, which powered QEMU off.
    assert_console(&r, "QEMU System Power off: with GPIO");
    assert_eq!(r.qemu_status, Some(0));
    assert_eq!(r.hv_fatal, None);
}

#[test]
fn tf_a_gicv3_two_pcpus_two_vcpus() {
    boots_through_tf_a(3);
}

#[test]
fn tf_a_gicv4_two_pcpus_two_vcpus() {
    boots_through_tf_a(4);
}

#[test]
fn tf_a_workarounds_are_forwarded_on_cortex_a72() {
    // TF-A 2.8 implements ARCH_WORKAROUND_1 (and _3) for the Cortex-A72:
    // the hypervisor asks it at boot, calls WA1 on every guest exit and
    // tells the guest the workaround is there, so the guest reports the
    // mitigation a bare-metal Linux on this firmware reports.
    let r = run_cmd("cat /sys/devices/system/cpu/vulnerabilities/spectre_v2", |o| {
        o.firmware = Some(Firmware::TfA);
        o.cpu = "cortex-a72".into();
    });
    assert_console(&r, "firmware Firmware { wa1: Some(0), wa2: Some(-2), wa3: Some(0) }");
    assert_console(&r, "on exit firmware call 0x80008000");
    assert_console(&r, "Mitigation: Branch predictor hardening, BHB");
    assert_eq!(r.guest_exit, Some(0), "{}", tail(&r.console, 40));
    assert_eq!(stat(&r.console, 0, "serrors"), Some(0));
}
