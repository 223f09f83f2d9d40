//! Host tests of the console against hostile DomUs: output that tries to
//! forge hypervisor lines or drive the operator's terminal, a DomU that
//! never reads its console, output bursts bounded per trap.

use super::console::{
    input_targets, next_domain, ConsoleOut, InputRing, Key, TxPort, DUMP_KEY, INPUT_RING, LINE_MAX, SWITCH_KEY,
    TX_BUDGET, TX_RING,
};
use super::DomainId;
use crate::vpl011::{RxSource, VPl011, RX_FIFO};
use alloc::collections::VecDeque;

/// A UART whose transmit FIFO never fills (as under QEMU): records every
/// byte and whether it was written without waiting.
#[derive(Default)]
struct Port {
    out: Vec<u8>,
    /// Bytes written by the current call, waited for or not.
    burst: usize,
}

impl TxPort for Port {
    fn try_put(&mut self, b: u8) -> bool {
        self.out.push(b);
        self.burst += 1;
        true
    }
    fn put(&mut self, b: u8) {
        self.try_put(b);
    }
}

impl Port {
    fn text(&self) -> String {
        String::from_utf8(self.out.clone()).unwrap()
    }
    /// Bytes written since the last call.
    fn take_burst(&mut self) -> usize {
        core::mem::take(&mut self.burst)
    }
}

fn write(c: &mut ConsoleOut, dom: DomainId, bytes: &[u8], port: &mut Port) {
    for &b in bytes {
        c.putc(dom, b, port);
    }
}

/// The transmit interrupt until nothing waits.
fn drain(c: &mut ConsoleOut, port: &mut Port) {
    while c.pending() {
        assert!(c.transmit(port) <= TX_BUDGET);
    }
}

#[test]
fn a_domu_cannot_forge_a_hypervisor_line_or_drive_the_terminal() {
    let mut c = ConsoleOut::new();
    let mut port = Port::default();
    // Focus on d1 so its bytes write through, as an interactive console's do.
    c.set_focus(1, &mut port);
    write(&mut c, 1, b"\r(HV) input to d0\n", &mut port);
    // OSC 52 (set the clipboard), a colour, the cursor moved up, BEL, DEL,
    // bytes >= 0x80 (a UTF-8 "é" and a C1 CSI), a tab.
    write(&mut c, 1, b"\x1b]52;c;cm0gLXJmIC8K\x07\x1b[31mred\x1b[1A\x7f\xc3\xa9\x9b2J\tok\r\n", &mut port);
    // A lone \r twice in a row, and one at the end of the output.
    write(&mut c, 1, b"a\r\rb\n\r", &mut port);
    drain(&mut c, &mut port);
    let s = port.text();
    assert!(s.starts_with("(d1) \\x0d(HV) input to d0\n"), "{s}");
    assert!(s.contains("(d1) \\x1b]52;c;cm0gLXJmIC8K\\x07\\x1b[31mred\\x1b[1A\\x7f\\xc3\\xa9\\x9b2J\tok\r\n"), "{s}");
    assert!(s.contains("(d1) a\\x0d\\x0db\n"), "{s}");
    for line in s.split('\n').filter(|l| !l.is_empty()) {
        assert!(line.starts_with("(d1) "), "{line:?}");
        assert!(line.bytes().all(|b| (0x20..0x7f).contains(&b) || b == b'\t' || b == b'\r'), "{line:?}");
        assert!(!line.trim_end_matches('\r').contains('\r'), "a CR only before the line end: {line:?}");
    }
    // The pending \r shows once the next byte proves it is not a line end.
    write(&mut c, 1, b"x\n", &mut port);
    assert!(port.text().ends_with("(d1) \\x0dx\n"), "{}", port.text());
    // Held (not focused) DomU lines are filtered the same way.
    c.set_focus(0, &mut port);
    write(&mut c, 2, b"\r(HV) fake\n", &mut port);
    drain(&mut c, &mut port);
    assert!(port.text().ends_with("(d2) \\x0d(HV) fake\n"), "{}", port.text());
    // Dom0 owns the UART: its bytes pass as they are.
    write(&mut c, 0, b"\x1b[1mdom0\r\n", &mut port);
    assert!(port.text().ends_with("\x1b[1mdom0\r\n"));
}

/// The input path as the runtime drives it: the physical UART (`phys`) into
/// the ring, the ring into the focused domain's vPL011.
struct Machine {
    phys: VecDeque<u8>,
    ring: InputRing,
    /// (id, vPL011 if it has one, stopped)
    doms: Vec<(DomainId, Option<VPl011>)>,
    focus: DomainId,
    announced: Vec<DomainId>,
    dumps: usize,
}

struct FromRing<'a>(&'a mut InputRing);

impl RxSource for FromRing<'_> {
    fn getc(&mut self) -> Option<u8> {
        self.0.pop()
    }
    fn pending(&mut self) -> bool {
        !self.0.is_empty()
    }
}

impl Machine {
    fn new(doms: &[(DomainId, bool)]) -> Self {
        Machine {
            phys: VecDeque::new(),
            ring: InputRing::new(INPUT_RING),
            doms: doms.iter().map(|&(d, u)| (d, u.then(VPl011::new))).collect(),
            focus: 0,
            announced: Vec::new(),
            dumps: 0,
        }
    }
    fn uart(&mut self, d: DomainId) -> &mut VPl011 {
        self.doms.iter_mut().find(|(i, _)| *i == d).and_then(|(_, u)| u.as_mut()).unwrap()
    }
    fn deliver(&mut self) {
        let f = self.focus;
        if let Some((_, Some(u))) = self.doms.iter_mut().find(|(i, _)| *i == f) {
            u.pump_rx(&mut FromRing(&mut self.ring));
        }
    }
    /// `runtime::vcpu::console_input`.
    fn type_in(&mut self, bytes: &[u8]) {
        self.phys.extend(bytes);
        loop {
            let phys = &mut self.phys;
            let key = self.ring.fill(&mut || phys.pop_front(), self.focus, 1024);
            self.deliver();
            match key {
                None if self.phys.is_empty() => break,
                None => {}
                Some(Key::Dump) => self.dumps += 1,
                Some(Key::Switch) => {
                    let doms: Vec<_> = self.doms.iter().map(|(d, u)| (*d, u.is_some(), false)).collect();
                    let to = next_domain(self.focus, &input_targets(&doms));
                    self.ring.discard(self.focus);
                    self.focus = to;
                    self.announced.push(to);
                }
            }
        }
    }
    /// The guest reads its FIFO empty (the vPL011's MMIO handler,
    /// `runtime::devices::uart`, pumps while held).
    fn guest_reads(&mut self, d: DomainId) -> Vec<u8> {
        let mut got = Vec::new();
        loop {
            let u = self.uart(d);
            if u.read(0x18, 4).unwrap() & (1 << 4) != 0 {
                break;
            }
            got.push(u.read(0, 4).unwrap() as u8);
            if u.rx_held() && self.focus == d {
                self.deliver();
            }
        }
        got
    }
}

#[test]
fn a_domu_that_never_reads_cannot_wedge_console_input() {
    let mut m = Machine::new(&[(0, true), (1, true)]);
    m.type_in(&[SWITCH_KEY; 3]);
    assert_eq!((m.focus, &m.announced[..]), (1, &[1][..]));
    // d1 masks its receive interrupt and never reads: 100 bytes fill its
    // FIFO, the rest waits in the ring; the UART is still read.
    m.type_in(&[b'q'; 100]);
    assert!(m.phys.is_empty(), "the physical UART is drained");
    assert!(m.uart(1).rx_held());
    // Ctrl-\ and Ctrl-A x3 are seen behind the stuck input.
    m.type_in(&[DUMP_KEY]);
    assert_eq!(m.dumps, 1);
    m.type_in(&[SWITCH_KEY; 3]);
    assert_eq!((m.focus, &m.announced[..]), (0, &[1, 0][..]));
    // What d1 never took is dropped and counted against it, not Dom0.
    // (The first two Ctrl-A of the switch were typed for d1, as in Xen.)
    assert_eq!(m.ring.dropped(1), (2 + 100 - RX_FIFO) as u64);
    assert_eq!(m.ring.dropped(0), 0);
    // The ring accepts Dom0's input, and Dom0 gets exactly it.
    // (Dom0 also got the first two Ctrl-A of the first switch.)
    m.type_in(b"echo hi\n");
    assert_eq!(m.guest_reads(0), b"\x01\x01echo hi\n");
    // d1's FIFO still holds the first 64 bytes typed for it.
    assert_eq!(m.guest_reads(1), vec![b'q'; RX_FIFO]);
}

#[test]
fn a_flood_into_a_stuck_domain_is_bounded_and_the_keys_still_work() {
    let mut m = Machine::new(&[(0, true), (1, true)]);
    m.type_in(&[SWITCH_KEY; 3]);
    let flood = vec![b'z'; INPUT_RING + 5000];
    m.type_in(&flood);
    assert_eq!(m.ring.overruns, 5000 - RX_FIFO as u64);
    assert_eq!(m.ring.dropped(1), 5000 - RX_FIFO as u64);
    m.type_in(&[DUMP_KEY, SWITCH_KEY, SWITCH_KEY, SWITCH_KEY]);
    assert_eq!((m.dumps, m.focus), (1, 0));
    assert_eq!(m.ring.dropped(1), (2 + flood.len() - RX_FIFO) as u64);
    m.type_in(b"ok\n");
    assert_eq!(m.guest_reads(0), b"\x01\x01ok\n");
}

#[test]
fn a_paste_into_a_slow_reader_waits_in_the_ring_and_is_not_lost() {
    let mut m = Machine::new(&[(0, true)]);
    let paste: Vec<u8> = (0..16 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
    m.type_in(&paste);
    assert!(m.uart(0).rx_held());
    assert_eq!(m.guest_reads(0), paste);
    assert_eq!((m.ring.overruns, m.ring.dropped(0), m.uart(0).rx_overruns), (0, 0, 0));
    assert_eq!(m.uart(0).rx_holds, 1);
}

#[test]
fn switching_skips_domus_without_a_console_and_stopped_ones() {
    // d1 has no vPL011, d3 has stopped: Ctrl-A x3 goes 0 -> 2 -> 0.
    let doms = [(0, true, false), (1, false, false), (2, true, false), (3, true, true)];
    let targets = input_targets(&doms);
    assert_eq!(targets, [0, 2]);
    assert_eq!(next_domain(0, &targets), 2);
    assert_eq!(next_domain(2, &targets), 0);
    // Only Dom0 with a console: the focus stays there.
    assert_eq!(next_domain(0, &input_targets(&[(0, true, false), (1, false, false)])), 0);
    let mut m = Machine::new(&[(0, true), (1, false), (2, true)]);
    m.type_in(&[SWITCH_KEY; 3]);
    assert_eq!(m.focus, 2);
    m.type_in(b"x");
    assert_eq!(m.guest_reads(2), b"x");
}

#[test]
fn a_trap_writes_at_most_a_budget_of_held_output() {
    let mut c = ConsoleOut::new();
    let mut port = Port::default();
    // Dom0 is mid-line: three DomUs hold almost LINE_MAX of complete lines
    // each, 99-byte lines.
    write(&mut c, 0, b"$ ", &mut port);
    let line = [b'y'; 98];
    for d in 1..=3 {
        let mut n = 0;
        while n + 200 < LINE_MAX {
            for &b in line.iter().chain(b"\n") {
                c.putc(d, b, &mut port);
                assert!(port.take_burst() <= TX_BUDGET);
            }
            n += 99;
        }
    }
    assert_eq!(port.text(), "$ ");
    // Dom0's newline releases them all: this trap writes its own byte and
    // one budget, the ring keeps what fits, the rest is dropped and counted.
    port.take_burst();
    c.putc(0, b'\n', &mut port);
    assert!(port.take_burst() <= 1 + TX_BUDGET);
    assert!(c.tx.len() <= TX_RING);
    assert!(c.tx.dropped > 0);
    // Later traps each write a budget at most, Dom0's bytes are never lost.
    write(&mut c, 0, b"# ", &mut port);
    assert!(port.take_burst() <= 2 * (TX_BUDGET + 1));
    drain(&mut c, &mut port);
    let s = port.text();
    assert!(s.starts_with("$ \n(d1) yyy"), "{}", &s[..40]);
    assert!(s.contains("# "));
    // Whole lines were dropped: every line printed carries its prefix and
    // is complete.
    let printed = s.lines().filter(|l| l.starts_with("(d")).count() as u64;
    for l in s.lines().skip(1).filter(|l| *l != "# ") {
        let body = l.strip_prefix("(d1) ").or(l.strip_prefix("(d2) ")).or(l.strip_prefix("(d3) "));
        let body = body.unwrap_or_else(|| panic!("{l:?}"));
        assert!(body == "y".repeat(98) || body == format!("# {}", "y".repeat(98)), "{l:?}");
    }
    let held = 3 * (LINE_MAX - 200).div_ceil(99) as u64;
    let prefix = "(d1) ".len() as u64;
    assert_eq!(printed + c.tx.dropped / (99 + prefix), held, "every held line printed or dropped whole");
}

#[test]
fn the_hypervisor_s_lines_are_never_dropped_and_go_out_at_once_when_nothing_waits() {
    let mut c = ConsoleOut::new();
    let mut port = Port::default();
    c.hv_begin(&mut port);
    c.hv_bytes(&[b'h'; 300], &mut port);
    c.hv_end(&mut port);
    assert_eq!(port.out.len(), 300, "written at once (boot logs, fatal errors)");
    // Behind a full ring: queued, room made by waiting for the UART.
    c.set_focus(0, &mut port);
    write(&mut c, 0, b"$", &mut port);
    for _ in 0..TX_RING / 100 + 10 {
        write(&mut c, 1, &[b'k'; 99], &mut port);
        write(&mut c, 1, b"\n", &mut port);
    }
    write(&mut c, 0, b"\n", &mut port);
    let before = c.tx.dropped;
    c.hv_begin(&mut port);
    c.hv_bytes(b"(HV) stats\r\n", &mut port);
    c.hv_end(&mut port);
    assert_eq!(c.tx.dropped, before);
    c.flush(&mut port);
    assert!(port.text().ends_with("(HV) stats\r\n"), "in order, after what waited");
}

#[test]
fn a_gone_domains_held_output_is_printed_once_and_dropped() {
    let mut c = ConsoleOut::new();
    let mut port = Port::default();
    // d0 is mid-line: d2's lines are held, the last one partial.
    write(&mut c, 0, b"dom0 typing", &mut port);
    write(&mut c, 2, b"line one\npartial", &mut port);
    c.forget(2, &mut port);
    drain(&mut c, &mut port);
    let s = port.text();
    assert!(s.contains("(d2) line one\n(d2) partial\n"), "{s}");
    assert_eq!(s.matches("partial").count(), 1, "{s}");
    // Nothing of it is left to print later.
    let before = port.out.len();
    c.forget(2, &mut port);
    write(&mut c, 0, b"\n", &mut port);
    drain(&mut c, &mut port);
    assert!(!port.text()[before..].contains("(d2)"), "{}", port.text());
}
