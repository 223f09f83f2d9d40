//! The conformance guest (tests/conformance): the same EL1 kernel checked
//! on bare QEMU, as Dom0 under the hypervisor on GICv3 and GICv4 with 1 and
//! 2 pCPUs, and as a DomU; and in the other kernel formats the hypervisor
//! boots (`boot::image`): as a raw binary at a load address (Dom0), as an
//! ELF linked at a fixed address (a DomU, with Dom0 an ELF too). Every check must pass, except those named in
//! [`KNOWN_FAILING`] under the hypervisor, which must still fail (fixing one
//! means removing it from the list).

use integration_tests::*;
use xtask::conformance::{checks, summary, KernelFormat, Placement, Verdict};

/// Checks the hypervisor fails today, with why: none.
const KNOWN_FAILING: &[&str] = &[];

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

/// Asserts the guest behind `prefix` ran every check once and finished:
/// those in `failing` failed, those in `skipped` were skipped, every other
/// one passed, and the summary line agrees.
#[track_caller]
fn assert_checks(r: &RunResult, prefix: &str, failing: &[&str], skipped: &[&str]) {
    let got = checks(&r.console, prefix);
    let names: Vec<&str> = got.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, CHECKS, "checks run; console tail:\n{}", tail(&r.console, 60));
    let mut wrong = Vec::new();
    for c in &got {
        let want = if failing.contains(&c.name.as_str()) {
            Verdict::Fail
        } else if skipped.contains(&c.name.as_str()) {
            Verdict::Skip
        } else {
            Verdict::Ok
        };
        if c.verdict != want {
            wrong.push(format!("want {want:?}: {}", c.line));
        }
    }
    assert!(wrong.is_empty(), "checks with another outcome than expected:\n{}", wrong.join("\n"));
    let want = (CHECKS.len() - failing.len() - skipped.len(), failing.len(), skipped.len());
    let want = (want.0 as u32, want.1 as u32, want.2 as u32);
    assert_eq!(summary(&r.console, prefix), Some(want), "the summary line");
}

/// The guest at `at` (`xtask::conformance::options`: 2 vCPUs; Dom0 with
/// the vITS); the console is echoed with `CONFORMANCE_ECHO=1` (and
/// `--nocapture`). Asserts it powered the machine off.
fn run_guest(at: Placement, gic: u8, pcpus: u32) -> RunResult {
    run_guest_as(at, gic, pcpus, KernelFormat::Image)
}

/// [`run_guest`] with the kernel handed over as `format`.
fn run_guest_as(at: Placement, gic: u8, pcpus: u32, format: KernelFormat) -> RunResult {
    let mut o = xtask::conformance::options(at, gic, pcpus, format).expect("building the conformance guest");
    o.echo = std::env::var_os("CONFORMANCE_ECHO").is_some();
    let r = run(&o);
    assert!(r.hv_fatal.is_none(), "{:?}", r.hv_fatal);
    assert_eq!(r.qemu_status, Some(0), "QEMU did not exit through SYSTEM_OFF; tail:\n{}", tail(&r.console, 40));
    r
}

/// Bare QEMU (no EL2, no EL3): SMC is UNDEFINED, so that check is skipped
/// (QEMU's own PSCI answers HVC); everything else passes.
#[test]
fn bare_qemu_passes_every_check() {
    let r = run_guest(Placement::Bare, 3, 2);
    assert_checks(&r, "", &[], &["smc-unknown"]);
}

#[test]
fn dom0_gicv3_one_pcpu() {
    assert_checks(&run_guest(Placement::Dom0, 3, 1), "", KNOWN_FAILING, &[]);
}

#[test]
fn dom0_gicv3_two_pcpus() {
    assert_checks(&run_guest(Placement::Dom0, 3, 2), "", KNOWN_FAILING, &[]);
}

#[test]
fn dom0_gicv4_one_pcpu() {
    assert_checks(&run_guest(Placement::Dom0, 4, 1), "", KNOWN_FAILING, &[]);
}

#[test]
fn dom0_gicv4_two_pcpus() {
    assert_checks(&run_guest(Placement::Dom0, 4, 2), "", KNOWN_FAILING, &[]);
}

/// The guest as a 2-vCPU DomU (no ITS in its DT: those checks skip) beside
/// a Dom0 running the same kernel without checks.
#[test]
fn domu_passes_its_checks() {
    assert_domu_checks(3, 2);
}

/// Every check of the DomU passes but the vITS ones, which skip; Dom0 ran
/// none.
fn assert_domu_checks(gic: u8, pcpus: u32) {
    let r = run_guest(Placement::Domu, gic, pcpus);
    assert!(checks(&r.console, "").is_empty(), "Dom0 ran checks");
    let its: Vec<&str> = CHECKS.iter().copied().filter(|c| c.starts_with("its-")).collect();
    assert_checks(&r, "(d1) ", KNOWN_FAILING, &its);
}

/// The same on a GICv4 machine with one pCPU: the DomU's two vCPUs and
/// Dom0's share it, so every switch moves timers, PMU and debug state
/// between VMs.
#[test]
fn domu_gicv4_one_pcpu_passes_its_checks() {
    assert_domu_checks(4, 1);
}

/// The flat image as a raw binary that the hypervisor copies to
/// `dom0_kernel_load_addr=` and enters there: every check as for the Image.
#[test]
fn dom0_raw_binary_at_a_load_address() {
    let r = run_guest_as(Placement::Dom0, 3, 1, KernelFormat::Raw);
    assert!(r.console.contains("dom0: 2 vCPU(s)"), "no Dom0 line; tail:\n{}", tail(&r.console, 40));
    assert!(r.console.contains(&format!("kernel entry {:#x}", xtask::conformance::DOM0_LOAD_ADDR)));
    assert_checks(&r, "", KNOWN_FAILING, &[]);
}

/// ELF executables linked at fixed addresses, loaded by their program
/// headers: the DomU's passes its checks, Dom0's (without checks) finishes.
#[test]
fn domu_and_dom0_elf_kernels() {
    let r = run_guest_as(Placement::Domu, 3, 2, KernelFormat::Elf);
    assert!(r.console.contains(&format!("kernel entry {:#x}", xtask::conformance::DOM0_LOAD_ADDR)), "Dom0's entry");
    assert!(r.console.contains(&format!("kernel entry {:#x}", xtask::conformance::DOMU_LOAD_ADDR)), "the DomU's entry");
    assert!(r.console.lines().any(|l| l.starts_with("conformance: no checks")), "Dom0's closing line");
    let its: Vec<&str> = CHECKS.iter().copied().filter(|c| c.starts_with("its-")).collect();
    assert_checks(&r, "(d1) ", KNOWN_FAILING, &its);
}

/// The exit path's budget in guest instructions per round trip as Dom0:
/// a null hypercall (an SMCCC function answered NOT_SUPPORTED) and a read
/// of an emulated distributor register (GICD_IIDR), as `cargo xtask bench
/// exits` measures them (docs/benchmarks/exits-qemu10.md: 364 and 455).
/// Under `-icount shift=0` guest time is instructions executed at every
/// exception level, so the figures are path lengths: the same on any host.
const NULL_HVC_INSNS: f64 = 400.0;
const GICD_READ_INSNS: f64 = 500.0;

/// The exit path's length stays pinned: each operation may cost at most
/// 1.5× its budget; a change that makes every exit slower fails here (one
/// that makes it much faster lowers the budget).
#[test]
fn null_hypercall_path_length_is_pinned() {
    let mut o = xtask::conformance::options(Placement::Dom0, 3, 2, KernelFormat::Image)
        .expect("building the conformance guest");
    o.icount = true;
    o.echo = std::env::var_os("CONFORMANCE_ECHO").is_some();
    o.append = Some("conformance.exits".into());
    let r = run(&o);
    assert!(r.hv_fatal.is_none(), "{:?}", r.hv_fatal);
    let got = xtask::bench::exits::parse(&r.console);
    for (name, budget) in [("smccc-unknown", NULL_HVC_INSNS), ("gicd-iidr-read", GICD_READ_INSNS)] {
        let got = got.iter().find(|(n, _)| n == name).map(|x| x.1);
        let got = got.unwrap_or_else(|| panic!("no {name} figure; tail:\n{}", tail(&r.console, 40)));
        assert!(got <= budget * 1.5, "{name}: {got} instructions per round trip, budget {budget} (limit 1.5×)");
    }
}
