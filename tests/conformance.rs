//! The conformance guest (tests/conformance): the same EL1 kernel checked
//! on bare QEMU, as Dom0 under the hypervisor on GICv3 and GICv4 with 1 and
//! 2 pCPUs, and as a DomU. Every check must pass, except those named in
//! [`KNOWN_FAILING`] under the hypervisor, which must still fail (fixing one
//! means removing it from the list).

use integration_tests::*;
use std::time::Duration;

/// Checks the hypervisor fails today, with why (issue 26): the EL1
/// physical timer is UNDEFINED, debug registers are RAZ/WI, there is no
/// vPMU.
const KNOWN_FAILING: &[&str] = &[
    "ptimer-fires",
    "ptimer-level-ctl",
    "ptimer-level-cval",
    "ptimer-no-stale",
    "ptimer-imask",
    "ptimer-tval-wfi",
    "ptimer-secondary",
    "debug-breakpoints",
    "debug-watchpoints",
    "pmu-cycle-counter",
    "pmu-event-counter",
    "pmu-overflow-irq",
];

/// Every check the guest runs, in its order.
const CHECKS: &[&str] = &[
    "psci-version",
    "psci-cpu-on",
    "psci-affinity-info",
    "psci-features",
    "psci-cpu-on-invalid",
    "psci-cpu-suspend",
    "sgi-self",
    "sgi-target-list",
    "sgi-broadcast",
    "sgi-icactiver",
    "sgi-pending-while-disabled",
    "sgi-ispendr",
    "sgi-icpendr",
    "icc-pmr-masks",
    "sgi-eoimode1-dir",
    "spi-ispendr-route",
    "vtimer-fires",
    "vtimer-level-ctl",
    "vtimer-level-cval",
    "vtimer-no-stale",
    "vtimer-imask",
    "vtimer-tval-wfi",
    "vtimer-secondary",
    "counter-cross-cpu",
    "hvc-unknown",
    "smc-unknown",
    "abort-unmapped",
    "abort-unmapped-store",
    "abort-unmapped-fetch",
    "its-baser-reset",
    "its-mapti-int",
    "its-movi",
    "its-inv",
    "its-invall",
    "its-clear",
    "its-5000-int",
    "its-discard",
    "ptimer-fires",
    "ptimer-level-ctl",
    "ptimer-level-cval",
    "ptimer-no-stale",
    "ptimer-imask",
    "ptimer-tval-wfi",
    "ptimer-secondary",
    "debug-breakpoints",
    "debug-watchpoints",
    "debug-single-step",
    "debug-brk",
    "pmu-cycle-counter",
    "pmu-event-counter",
    "pmu-overflow-irq",
    "psci-cpu-off",
    "no-unexpected-irq",
];

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Verdict {
    Ok,
    Fail,
    Skip,
}

/// The `check <name>: …` lines behind `prefix` (`""` for Dom0 or bare QEMU,
/// `"(d1) "` for the first DomU): (name, verdict, the whole line).
fn checks(console: &str, prefix: &str) -> Vec<(String, Verdict, String)> {
    console
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("check ")?.split_once(": ")?;
            let v = match rest.split_whitespace().next()? {
                "ok" => Verdict::Ok,
                "FAIL" => Verdict::Fail,
                "skip" => Verdict::Skip,
                _ => return None,
            };
            Some((name.to_string(), v, l.to_string()))
        })
        .collect()
}

/// Asserts the guest behind `prefix` ran every check once and finished:
/// those in `failing` failed, those in `skipped` were skipped, every other
/// one passed, and the summary line agrees.
#[track_caller]
fn assert_checks(r: &RunResult, prefix: &str, failing: &[&str], skipped: &[&str]) {
    let got = checks(&r.console, prefix);
    let names: Vec<&str> = got.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(names, CHECKS, "checks run; console tail:\n{}", tail(&r.console, 60));
    let mut wrong = Vec::new();
    for (name, v, line) in &got {
        let want = if failing.contains(&name.as_str()) {
            Verdict::Fail
        } else if skipped.contains(&name.as_str()) {
            Verdict::Skip
        } else {
            Verdict::Ok
        };
        if *v != want {
            wrong.push(format!("want {want:?}: {line}"));
        }
    }
    assert!(wrong.is_empty(), "checks with another outcome than expected:\n{}", wrong.join("\n"));
    let summary = format!(
        "{prefix}conformance: {} passed, {} failed, {} skipped",
        CHECKS.len() - failing.len() - skipped.len(),
        failing.len(),
        skipped.len()
    );
    assert!(r.console.lines().any(|l| l == summary), "no line {summary:?}");
}

fn guest() -> std::path::PathBuf {
    xtask::build::conformance().expect("building the conformance guest")
}

/// The guest with 2 vCPUs, as Dom0 unless `tweak` says otherwise; the
/// console is echoed with `CONFORMANCE_ECHO=1` (and `--nocapture`).
fn run_guest(tweak: impl FnOnce(&mut RunOptions)) -> RunResult {
    let mut o = RunOptions {
        kernel: Some(guest()),
        vcpus: 2,
        mem_mb: 256,
        echo: std::env::var_os("CONFORMANCE_ECHO").is_some(),
        timeout: Duration::from_secs(90),
        ..Default::default()
    };
    tweak(&mut o);
    let r = run(&o);
    assert!(r.hv_fatal.is_none(), "{:?}", r.hv_fatal);
    assert_eq!(r.qemu_status, Some(0), "QEMU did not exit through SYSTEM_OFF; tail:\n{}", tail(&r.console, 40));
    r
}

/// Bare QEMU (no EL2, no EL3): SMC is UNDEFINED, so that check is skipped
/// (QEMU's own PSCI answers HVC); everything else passes.
#[test]
fn bare_qemu_passes_every_check() {
    let r = run_guest(|o| {
        o.bare = true;
        o.pcpus = 2;
    });
    assert_checks(&r, "", &[], &["smc-unknown"]);
}

/// Dom0 gets a vITS (and the ITS in its DT) only with a PCIe disk: an
/// NVMe drive on the scratch image, which the guest never touches.
fn with_vits(o: &mut RunOptions) {
    let img = xtask::qemu::scratch_disk().expect("scratch disk image");
    o.hv_args = "dom0_disk=nvme".into();
    o.extra = vec![
        "-drive".into(),
        format!("if=none,file={},format=raw,id=d0", img.display()),
        "-device".into(),
        "nvme,drive=d0,serial=hvdisk0".into(),
    ];
}

#[test]
fn dom0_gicv3_one_pcpu() {
    let r = run_guest(|o| {
        with_vits(o);
        o.pcpus = 1;
    });
    assert_checks(&r, "", KNOWN_FAILING, &[]);
}

#[test]
fn dom0_gicv3_two_pcpus() {
    let r = run_guest(|o| {
        with_vits(o);
        o.pcpus = 2;
    });
    assert_checks(&r, "", KNOWN_FAILING, &[]);
}

#[test]
fn dom0_gicv4_one_pcpu() {
    let r = run_guest(|o| {
        with_vits(o);
        o.gic = 4;
        o.pcpus = 1;
    });
    assert_checks(&r, "", KNOWN_FAILING, &[]);
}

#[test]
fn dom0_gicv4_two_pcpus() {
    let r = run_guest(|o| {
        with_vits(o);
        o.gic = 4;
        o.pcpus = 2;
    });
    assert_checks(&r, "", KNOWN_FAILING, &[]);
}

/// The guest as a DomU (2 vCPUs, no ITS in its DT) beside a Dom0 running
/// the same kernel, which runs no check (Dom0 owns the UART: its bytes
/// would cut into the DomU's lines) and waits 10 s before powering the
/// machine off.
#[test]
fn domu_passes_its_checks() {
    let r = run_guest(|o| {
        o.pcpus = 2;
        o.append = Some("conformance.skip_checks conformance.linger_ms=10000".into());
        o.domus = Some(xtask::domu::DomuOptions { count: 1, vcpus: 2, mem_mb: 64, ..Default::default() });
    });
    assert!(checks(&r.console, "").is_empty(), "Dom0 ran checks");
    let its: Vec<&str> = CHECKS.iter().copied().filter(|c| c.starts_with("its-")).collect();
    assert_checks(&r, "(d1) ", KNOWN_FAILING, &its);
}
