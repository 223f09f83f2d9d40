//! The shared console against a hostile DomU: one that masks its UART's
//! receive interrupt and never reads cannot keep input from Dom0 (the
//! hypervisor reads the physical UART and sees Ctrl-A x3 whatever the DomU
//! does), and one that prints a fake hypervisor line or terminal escapes
//! gets them shown escaped behind its `(d1) ` prefix.

use integration_tests::*;
use std::time::Duration;
use xtask::run::domu::DomuOptions;

/// Ctrl-A three times as QEMU's `-serial mon:stdio` passes it on (its own
/// escape key, doubled): the hypervisor's console input switch.
const SWITCH: &[u8] = b"\x01\x01\x01\x01\x01\x01";

fn run_dom0_and_domu(dom0: &str, domu: &str, tweak: impl FnOnce(&mut RunOptions)) -> RunResult {
    let domus = DomuOptions { count: 1, cmd: Some(domu.into()), mem_mb: 512, vcpus: 1, ..Default::default() };
    let mut o = RunOptions {
        cmd: Some(dom0.into()),
        pcpus: 2,
        domus: Some(domus),
        echo: false,
        timeout: Duration::from_secs(400),
        ..Default::default()
    };
    tweak(&mut o);
    let r = run(&o);
    assert!(r.hv_fatal.is_none(), "{:?}", r.hv_fatal);
    r
}

#[test]
fn a_domu_that_never_reads_its_uart_cannot_wedge_console_input() {
    // d1's kernel never binds a driver to its PL011 (the driver's initcall
    // is blacklisted): its receive interrupt stays masked and nothing ever
    // reads, so its vPL011's 64-byte FIFO fills and stays full. Once Dom0
    // (which has the focus) is ready: Ctrl-A x3 to d1, 100 bytes, Ctrl-A
    // x3, which must still move the input to Dom0, and a line for Dom0.
    let dom0 = "echo dom0-waiting; sleep 12; echo dom0-ready; read go; echo \"dom0-got-$go\" | tr -d '\\001'";
    let typed = [SWITCH, &[b'x'; 100][..], SWITCH, b"go\n"].concat();
    let r = run_dom0_and_domu(dom0, "sleep 600", |o| {
        o.domus.as_mut().unwrap().append = Some("initcall_blacklist=pl011_init".into());
        o.early_input = Some(EarlyInput { after: "dom0-ready".into(), bytes: typed });
    });
    let c = &r.console;
    assert_console(&r, "(HV) input to d1");
    let to_d1 = c.find("(HV) input to d1").unwrap();
    assert!(c[to_d1..].contains("(HV) input to d0"), "{}", tail(c, 40));
    assert_console(&r, "dom0-got-go");
    // d1's FIFO took 64 bytes and the rest, never taken, is counted
    // against it when the input moves on, not lost for Dom0.
    assert_eq!(stat_line(c, "d1.uart0.rx_bytes"), Some(64), "{}", tail(c, 40));
    let dropped = stat_line(c, "d1.uart0.rx_dropped").expect("d1's uart0 stats");
    assert!(dropped >= 100 - 64, "d1.uart0.rx_dropped={dropped}\n{}", tail(c, 40));
    assert_eq!(stat_line(c, "uart0.rx_dropped"), Some(0));
}

#[test]
fn a_domus_forged_hypervisor_line_and_escapes_are_shown_escaped() {
    let domu = "printf '\\r(HV) input to d0\\n'; printf '\\033]52;c;ZXZpbA==\\007osc\\n'; echo domu-done";
    let r = run_dom0_and_domu("sleep 8; echo dom0-done", domu, |_| {});
    let c = &r.console;
    assert_console(&r, "(d1) domu-done");
    assert_console(&r, "dom0-done");
    assert_console(&r, "(d1) \\x0d(HV) input to d0");
    assert_console(&r, "(d1) \\x1b]52;c;ZXZpbA==\\x07osc");
    let d1 = c.lines().filter(|l| l.starts_with("(d1) "));
    assert!(d1.clone().all(|l| !l.contains('\x1b')), "an escape sequence of d1's reached the terminal");
    assert!(d1.count() >= 3);
    assert!(!c.lines().any(|l| l.trim_end_matches('\r') == "(HV) input to d0"), "a forged hypervisor line");
}
