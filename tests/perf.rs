//! `perf stat` in the guest counts with the PMU: on bare QEMU (the guest
//! image and the parser against QEMU's own PMU) and in Dom0 through the
//! vPMU, which the boot option `vpmu=off` turns off.

use integration_tests::*;

/// Enough work to count: 100000 read/write syscall pairs.
const PERF_CMD: &str = "perf stat -e cycles,instructions dd if=/dev/zero of=/dev/null count=100000";
/// dd's blocks: at least one instruction each.
const BLOCKS: u64 = 100_000;

/// What a failure shows: the kernel's PMU messages and the guest command's
/// output (the console's tail is the hypervisor's statistics).
fn perf_context(console: &str) -> String {
    let pmu = console.lines().filter(|l| {
        let l = l.to_ascii_lowercase();
        l.contains("perfevents") || l.contains("pmu")
    });
    let output =
        console.lines().skip_while(|l| !l.contains("guest: init ready")).take_while(|l| !l.contains("@@GUEST-EXIT"));
    pmu.chain(output).collect::<Vec<_>>().join("\n")
}

/// An event's count, when `perf stat` counted it; panics otherwise.
#[track_caller]
fn counted(r: &RunResult, event: &str) -> u64 {
    match perf_stat_count(&r.console, event) {
        Some(PerfCount::Counted(n)) => n,
        other => panic!("perf stat's {event}: {other:?}; console:\n{}", perf_context(&r.console)),
    }
}

/// `perf stat` counted both events, with a plausible number of
/// instructions, and exited 0.
#[track_caller]
fn assert_cycles_and_instructions_counted(r: &RunResult) {
    assert_eq!(r.hv_fatal, None, "{}", tail(&r.console, 40));
    assert_eq!(r.guest_exit, Some(0), "{}", perf_context(&r.console));
    let cycles = counted(r, "cycles");
    let instructions = counted(r, "instructions");
    assert!(cycles > 0, "cycles: {cycles}");
    assert!(instructions >= BLOCKS, "instructions: {instructions}");
}

#[test]
fn perf_stat_counts_cycles_and_instructions_on_bare_qemu() {
    // QEMU's PMU counts instructions only with precise icount (without it
    // perf prints `<not supported>` for them).
    let g = xtask::build::image::guest().expect("guest image");
    let o = RunOptions {
        bare: true,
        kernel: Some(g.kernel),
        append: Some(format!(
            "{} guestcmd={}",
            xtask::run::qemu::DEFAULT_GUEST_ARGS,
            xtask::run::qemu::base64(PERF_CMD.as_bytes())
        )),
        extra: vec!["-initrd".into(), perf_initrd().display().to_string()],
        icount: true,
        echo: false,
        timeout: std::time::Duration::from_secs(300),
        ..Default::default()
    };
    let r = run(&o);
    assert!(
        r.console.contains("hw perfevents: enabled with armv8_pmuv3"),
        "the kernel did not enable its PMU driver:\n{}",
        perf_context(&r.console)
    );
    assert_cycles_and_instructions_counted(&r);
}

#[test]
fn perf_stat_counts_cycles_and_instructions_in_dom0() {
    // The vPMU is on by default: each vCPU's PMU registers load on its
    // first PMU access (Linux's probe and its early PMUSERENR write among
    // them), and perf then counts on the real PMU. Debug registers trap
    // until a vCPU uses its breakpoints: Linux resets its breakpoints,
    // MDSCR and OS lock on every CPU at boot, and none of that may fault.
    // Two vCPUs on one pCPU, so the PMU state is switched between them.
    // -icount shift=0 because QEMU's PMU, under the guest's counters,
    // counts instructions only with precise icount.
    let cmd = format!(
        r#"echo pmus=$(ls /sys/bus/event_source/devices | grep -c armv8); dmesg | grep hw-breakpoint; echo cpus=$(nproc); {PERF_CMD}; echo oopses=$(dmesg | grep -ciE "oops|undefined instruction|internal error|call trace")"#
    );
    let r = run_cmd(&cmd, |o| {
        o.initrd = Some(perf_initrd());
        o.icount = true;
        o.pcpus = 1;
        o.vcpus = 2;
    });
    assert!(
        r.console.contains("hw perfevents: enabled with armv8_pmuv3"),
        "the kernel did not enable its PMU driver:\n{}",
        perf_context(&r.console)
    );
    assert_console(&r, "pmus=1");
    assert_console(&r, "oopses=0");
    assert_console(&r, "hw-breakpoint: found");
    assert_console(&r, "cpus=2");
    assert_cycles_and_instructions_counted(&r);
    for v in 0..2 {
        assert_eq!(stat(&r.console, v, "undef_injected"), Some(0), "vcpu{v} took an UNDEF");
        assert!(stat(&r.console, v, "debug_emulated").unwrap_or(0) > 0, "vcpu{v}: debug registers did not trap");
        assert!(stat(&r.console, v, "pmu_loads").unwrap_or(0) > 0, "vcpu{v}: its PMU was never loaded");
    }
    assert!(stat_line(&r.console, "irq.pmu").is_some(), "the PMU's PPI has no route");
}

#[test]
fn perf_stat_with_vpmu_off_reports_the_events_unsupported() {
    let r = run_cmd(PERF_CMD, |o| {
        o.initrd = Some(perf_initrd());
        o.icount = true;
        o.hv_args = "vpmu=off".into();
    });
    assert_eq!(r.hv_fatal, None, "{}", tail(&r.console, 40));
    // Linux found no PMU it could use, and touching the PMU did not crash
    // it: the command ran to its end.
    assert!(!r.console.contains("hw perfevents: enabled"), "the kernel found a PMU:\n{}", perf_context(&r.console));
    for bad in ["Internal error:", "Oops", "Kernel panic", "Unable to handle kernel"] {
        assert!(!r.console.contains(bad), "{bad:?} in the console:\n{}", tail(&r.console, 60));
    }
    let status = r.guest_exit.unwrap_or_else(|| panic!("no exit status; console tail:\n{}", tail(&r.console, 40)));
    // Either perf prints its table with neither event counted, or it
    // refuses with an error and a non-zero status (no table).
    for event in ["cycles", "instructions"] {
        match perf_stat_count(&r.console, event) {
            Some(PerfCount::NotSupported | PerfCount::NotCounted) => {}
            None if status != 0 => {}
            other => panic!("{event} with vpmu=off: {other:?} (perf status {status}):\n{}", perf_context(&r.console)),
        }
    }
}
