//! Linux boots as a guest under the hypervisor, and misbehaviour is contained.

use integration_tests::*;

#[test]
fn linux_boots_at_el1_under_the_hypervisor_gicv3() {
    let r = run_cmd(
        r#"dmesg | grep -E "started at EL"; uname -m; echo sve=$(grep -c -w -E "sve|sme" /proc/cpuinfo)"#,
        |_| {},
    );
    assert_console(&r, "CPU: All CPU(s) started at EL1");
    assert_console(&r, "aarch64");
    // SVE/SME state is not switched between vCPUs: the guest must not see them.
    assert_console(&r, "sve=0");
    assert_eq!(r.guest_exit, Some(0));
    // The hypervisor saw the guest work: traps, injected interrupts.
    assert!(stat(&r.console, 0, "mmio").unwrap() > 100);
    assert!(stat(&r.console, 0, "irqs_injected").unwrap() > 10);
    // Physical interrupts went through the route table: the forwarded
    // virtual timer and the EL2 timer, and nothing fell to the default.
    assert!(stat_line(&r.console, "irq.virtual_timer").unwrap() > 0);
    assert!(stat_line(&r.console, "irq.hyp_timer").unwrap() > 0);
    assert_eq!(stat_line(&r.console, "irq.unrouted"), Some(0));
}

#[test]
fn linux_boots_on_a_gicv4_machine() {
    let r = run_cmd(r#"dmesg | grep -E "started at EL"; uname -m"#, |o| o.gic = 4);
    assert_console(&r, "CPU: All CPU(s) started at EL1");
    assert_console(&r, "aarch64");
    assert_eq!(r.guest_exit, Some(0));
}

#[test]
fn guest_exit_status_and_timer_wakeups() {
    // `sleep` idles the vCPU: WFI traps, and the virtual timer wakes it.
    let r = run_cmd("sleep 1; grep -c arch_timer /proc/interrupts; exit 7", |_| {});
    assert_eq!(r.guest_exit, Some(7));
    assert!(stat(&r.console, 0, "wfi_traps").unwrap() > 0, "no WFI traps recorded");
}

#[test]
fn interactive_shell_on_the_console() {
    let o = RunOptions {
        echo: false,
        // Ctrl-\ asks the hypervisor for its statistics on the console.
        input: Some("echo shell-$((6*7))\n\x1c\npoweroff -f\n".into()),
        timeout: std::time::Duration::from_secs(420),
        ..Default::default()
    };
    let r = run(&o);
    assert_console(&r, "shell-42");
    assert_console(&r, "dom0 powered off");
    // Printed once on request and once at power-off.
    assert_eq!(r.console.matches("(HV) stats begin vcpu0").count(), 2, "{}", tail(&r.console, 30));
    // Ctrl-\ also dumps the flight recorder (on request only: no threshold).
    let dumps = xtask::trace::parse_dumps(&r.console).expect("the dump parses");
    assert_eq!(dumps.len(), 1);
    assert_eq!(dumps[0].reason, xtask::trace::Reason::Key);
    assert!(dumps[0].events.iter().any(|(_, e)| matches!(e.ev, hypervisor::trace::Event::SchedIn { .. })));
    // The typed input arrived through the UART's route.
    assert!(stat_line(&r.console, "irq.console").unwrap() > 0);
}

#[test]
fn console_flood_before_the_shell_reads_still_gets_a_command_answered() {
    // 16 KiB of shell comments, far more than the emulated UART's 64-byte
    // FIFO, typed before the guest's shell reads: once before the hypervisor
    // runs (input already waiting when it enables its UART interrupt) and
    // once while Linux boots (the FIFO fills up while nothing reads it). The
    // flood must neither livelock the pCPU taking the UART interrupt nor
    // wedge or lose the input; the command typed afterwards is answered.
    let line = format!("#{}\n", "flood".repeat(12));
    let flood = line.repeat(16 * 1024 / line.len()).into_bytes();
    for after in ["", "Booting Linux"] {
        let o = RunOptions {
            echo: false,
            early_input: Some(EarlyInput { after: after.into(), bytes: flood.clone() }),
            input: Some("\necho flood-$((6*7))\npoweroff -f\n".into()),
            timeout: std::time::Duration::from_secs(420),
            ..Default::default()
        };
        let r = run(&o);
        assert_console(&r, "flood-42");
        assert_console(&r, "dom0 powered off");
        // The input waited in the hypervisor's ring while the FIFO was full
        // (a hold), and none was lost.
        let held = stat_line(&r.console, "uart0.rx_holds").expect("uart0 stats");
        assert!(held >= 1, "flood after {after:?}: it never filled the guest's FIFO");
        assert!(stat_line(&r.console, "uart0.rx_bytes").unwrap() >= flood.len() as u64);
        assert_eq!(stat_line(&r.console, "uart0.rx_overruns"), Some(0));
    }
}

#[test]
fn unmapped_guest_access_gets_an_external_abort() {
    // 0x0c000000 is no RAM and no device: the guest process gets SIGBUS,
    // the hypervisor logs one line and the guest keeps running.
    let r = run_cmd("devmem 0x0c000000 32; echo status=$?; echo still-alive", |_| {});
    assert_console(&r, "at IPA 0xc000000");
    assert_console(&r, "injecting an external abort");
    assert_console(&r, "still-alive");
    assert!(stat(&r.console, 0, "aborts_injected").unwrap() >= 1);
    assert_eq!(r.guest_exit, Some(0));
}

#[test]
fn bad_gic_register_accesses_are_contained() {
    // A 64-bit read of a 32-bit GICD register is an access-size error (abort);
    // writes to read-only and reserved distributor registers are ignored.
    let cmd = "devmem 0x08000000 64; \
               devmem 0x08000004 32 0xffffffff; \
               devmem 0x08000040 32 0xdeadbeef; \
               devmem 0x0800fff0 32 0x12345678; \
               echo typer=$(devmem 0x08000004 32); \
               echo still-alive";
    // iomem=relaxed: Linux's IO_STRICT_DEVMEM otherwise blocks /dev/mem on
    // the GIC, which its driver has claimed.
    let r = run_cmd(cmd, |o| o.append = Some("console=ttyAMA0 iomem=relaxed".into()));
    assert_console(&r, "bad MMIO access at IPA 0x8000000");
    assert_console(&r, "still-alive");
    // GICD_TYPER is read-only: the wild write did not change it.
    let typer = r.console.lines().find_map(|l| l.strip_prefix("typer=")).expect("typer line");
    assert_ne!(typer.trim(), "0xFFFFFFFF");
    assert_eq!(r.guest_exit, Some(0));
}

#[test]
fn unknown_smccc_calls_return_not_supported() {
    // Linux probes vendor hypervisor services and TRNG at boot with calls we
    // do not implement; they must be answered NOT_SUPPORTED (and counted),
    // and boot continues.
    let r = run_cmd("cat /proc/cpuinfo | grep -c processor", |_| {});
    assert!(stat(&r.console, 0, "unsupported_calls").unwrap() >= 1);
    assert_eq!(r.guest_exit, Some(0));
}

/// The guest's `/sys/devices/system/cpu/vulnerabilities/spectre_v2` and
/// `spec_store_bypass` under the hypervisor, for a QEMU CPU model.
fn guest_vulnerabilities(cpu: &str) -> (RunResult, String, String) {
    let r = run_cmd(
        "cd /sys/devices/system/cpu/vulnerabilities; echo v2=$(cat spectre_v2); echo v4=$(cat spec_store_bypass)",
        |o| {
            o.cpu = cpu.into();
        },
    );
    let get = |k: &str| {
        let line = r.console.lines().find_map(|l| l.trim().strip_prefix(k).map(str::to_string));
        line.unwrap_or_else(|| panic!("{cpu}: no {k} line:\n{}", tail(&r.console, 40)))
    };
    let (v2, v4) = (get("v2="), get("v4="));
    (r, v2, v4)
}

#[test]
fn spectre_reporting_matches_bare_qemu() {
    // What the same guest image reports on bare QEMU 10.0 with the same CPU
    // model (no hypervisor: `-machine virt,gic-version=3 -cpu <model>`,
    // Linux at EL1 with QEMU's own PSCI, which has no SMCCC 1.1): the
    // hypervisor's SMCCC_ARCH_FEATURES answers and exit mitigations must
    // not make a guest look safer, or more exposed, than the hardware is.
    for (cpu, v2, v4, log) in [
        // Vulnerable to Spectre-v2 without firmware's WA1, no SSBS: the
        // hypervisor answers NOT_SUPPORTED and has nothing to run at exit.
        (
            "cortex-a72",
            "Vulnerable",
            "Vulnerable",
            "mitigations: spectre-v2 Vulnerable, spectre-v4 Vulnerable, spectre-BHB Vulnerable; on exit nothing",
        ),
        // CSV2 and SSBS; Spectre-BHB mitigated by the guest's own branch
        // loop, and the hypervisor runs the same loop on every exit.
        (
            "neoverse-n1",
            "Mitigation: CSV2, BHB",
            "Mitigation: Speculative Store Bypass disabled via prctl",
            "mitigations: spectre-v2 Unaffected, spectre-v4 Mitigated (SSBS), spectre-BHB Mitigated; on exit BHB loop of 24",
        ),
        (
            "max,pauth-impdef=on",
            "Not affected",
            "Mitigation: Speculative Store Bypass disabled via prctl",
            "mitigations: spectre-v2 Unaffected, spectre-v4 Mitigated (SSBS), spectre-BHB Unaffected; on exit nothing",
        ),
    ] {
        let (r, got_v2, got_v4) = guest_vulnerabilities(cpu);
        assert_eq!((got_v2.as_str(), got_v4.as_str()), (v2, v4), "{cpu}");
        assert_console(&r, log);
        assert_eq!(r.guest_exit, Some(0), "{cpu}");
        // The new traps (ACTLR_EL1, IMPLEMENTATION DEFINED registers, RAS
        // records, LORegions, fine-grained) cost Linux nothing: no UNDEF,
        // no SError.
        assert_eq!(stat(&r.console, 0, "undef_injected"), Some(0), "{cpu}");
        assert_eq!(stat(&r.console, 0, "serrors"), Some(0), "{cpu}");
    }
}
