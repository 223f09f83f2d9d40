//! Host tests: the DomU device tree read back by the crate's own parser,
//! DomU layouts (good and impossible), the self-test carve, the console's
//! prefixes, whole lines and the Ctrl-A switch.

use super::console::{next_domain, ConsoleMux, Input, InputSwitch, LINE_MAX, SWITCH_KEY};
use super::domu_dt::{build_domu_dtb, DomuDtConfig};
use super::layout::*;
use super::{DomuPlacement, VmSpec, DEFAULT_WEIGHT};
use crate::boot::image::KernelLoad;
use crate::region::Region;
use alloc::string::String;
use alloc::vec::Vec;

/// An arm64 Image of `size` bytes (`image_size`).
fn img(size: u64) -> KernelLoad {
    KernelLoad::Image { size }
}

const MIB: u64 = 1 << 20;

fn r(base: u64, size: u64) -> Region {
    Region { base, size }
}

#[test]
fn domu_dtb_reads_back_with_the_crates_parser() {
    let ram = r(DOMU_RAM_BASE, 256 * MIB);
    let cfg = DomuDtConfig {
        ram,
        vcpus: 2,
        bootargs: "console=ttyAMA0 guestcmd=dHJ1ZQ==",
        initrd: Some(r(DOMU_RAM_BASE + 64 * MIB, 10 * MIB)),
        vpl011: true,
        disk: true,
        pmu_intid: crate::intid::IntId::try_from(23).ok(),
        pci: Vec::new(),
    };
    let blob = build_domu_dtb(&cfg).expect("builds");
    let (p, boot) = crate::dtb::discover(&blob).expect("parses");
    assert_eq!(p.memory, [ram]);
    assert_eq!(p.cpus, [0, 1]);
    assert_eq!(p.gic.version, 3);
    assert_eq!(p.gic.gicd, r(DOMU_GICD, 0x1_0000));
    assert_eq!(p.gic.gicr, [r(DOMU_GICR, 2 * GICR_STRIDE)]);
    assert_eq!(p.gic.its, None);
    let uart = p.uart.expect("a PL011");
    assert_eq!(uart.base, DOMU_UART);
    assert_eq!(u32::from(uart.intid), 32 + DOMU_UART_SPI);
    assert_eq!(p.virtio_mmio.len(), 1);
    assert_eq!(p.virtio_mmio[0].base, DOMU_VIRTIO);
    assert_eq!(u32::from(p.virtio_mmio[0].intid), 32 + DOMU_VIRTIO_SPI);
    assert_eq!(u32::from(p.timer.virt_intid), 27);
    assert_eq!(u32::from(p.timer.hyp_intid), 26);
    assert_eq!(p.pmu_intid.map(u32::from), Some(23), "the vPMU's overflow PPI");
    assert_eq!(p.psci_method.as_deref(), Some("hvc"));
    assert_eq!(boot.bootargs.as_deref(), Some(cfg.bootargs));
    assert!(p.pcie.is_empty());
    let fdt = fdt::Fdt::new(&blob).expect("fdt");
    let chosen = fdt.find_node("/chosen").expect("chosen");
    let stdout = chosen.property("stdout-path").and_then(|p| p.as_str());
    assert_eq!(stdout, Some("/pl011@9000000"));
    let start = chosen.property("linux,initrd-start").and_then(|p| p.as_usize());
    assert_eq!(start, Some((DOMU_RAM_BASE + 64 * MIB) as usize));
}

#[test]
fn domu_dtb_without_uart_or_disk_has_neither() {
    let cfg = DomuDtConfig {
        ram: r(DOMU_RAM_BASE, 128 * MIB),
        vcpus: 17,
        bootargs: "",
        initrd: None,
        vpl011: false,
        disk: false,
        pmu_intid: None,
        pci: Vec::new(),
    };
    let (p, _) = crate::dtb::discover(&build_domu_dtb(&cfg).unwrap()).unwrap();
    assert!(p.uart.is_none());
    assert!(p.pmu_intid.is_none(), "no vPMU, no PMU node");
    assert!(p.virtio_mmio.is_empty());
    assert_eq!(p.cpus.len(), 17);
    assert_eq!(p.cpus[16], 0x100, "vCPU 16 is Aff1 = 1");
}

#[test]
fn domu_dtb_refuses_bad_inputs() {
    let base = DomuDtConfig {
        ram: r(DOMU_RAM_BASE, 128 * MIB),
        vcpus: 1,
        bootargs: "",
        initrd: None,
        vpl011: true,
        disk: true,
        pmu_intid: None,
        pci: Vec::new(),
    };
    assert!(build_domu_dtb(&DomuDtConfig { vcpus: 0, ..base.clone() }).is_err());
    assert!(build_domu_dtb(&DomuDtConfig { vcpus: 65, ..base.clone() }).is_err());
    let outside = Some(r(DOMU_RAM_BASE + 127 * MIB, 2 * MIB));
    assert!(build_domu_dtb(&DomuDtConfig { initrd: outside, ..base }).is_err());
}

fn spec(id: u16, memory: u64, kernel: u64, ramdisk: Option<u64>, disk_size: u64) -> VmSpec {
    VmSpec {
        id,
        name: alloc::format!("domU{id}"),
        memory,
        vcpus: 1,
        vpl011: true,
        kernel: r(0x4800_0000, kernel),
        ramdisk: ramdisk.map(|s| r(0x4a00_0000, s)),
        bootargs: String::new(),
        weight: DEFAULT_WEIGHT,
        cap_percent: None,
        disk_size,
        heap_quota: crate::quota::DEFAULT_DOMU_HEAP_QUOTA,
        kernel_load_addr: None,
        pin_vcpus: false,
        cpus: alloc::vec::Vec::new(),
        pci: Vec::new(),
    }
}

#[test]
fn domu_layout_puts_kernel_initrd_and_dtb_in_its_ram() {
    let s = spec(1, 256 * MIB, 30 * MIB, Some(17 * MIB), 32 * MIB);
    let p = DomuPlacement { id: 1, ram: r(0x1_0000_0000, 256 * MIB), disk: Some(r(0x1_1000_0000, 32 * MIB)) };
    let l = layout_domu(&s, &p, &img(40 * MIB)).expect("fits");
    assert_eq!(l.ram, Placed { ipa: r(DOMU_RAM_BASE, 256 * MIB), host: 0x1_0000_0000 });
    assert_eq!(l.kernel[0].dst, Placed { ipa: r(DOMU_RAM_BASE, 40 * MIB), host: 0x1_0000_0000 });
    let i = l.initrd.expect("initrd");
    assert_eq!(i.ipa, r(DOMU_RAM_BASE + 40 * MIB, 17 * MIB));
    assert_eq!(i.host, 0x1_0000_0000 + 40 * MIB);
    assert_eq!(l.dtb.ipa, r(DOMU_RAM_BASE + 254 * MIB, 2 * MIB));
    assert_eq!(l.dtb.host, 0x1_0000_0000 + 254 * MIB);
    assert_eq!(l.disk, Some(r(0x1_1000_0000, 32 * MIB)));
}

#[test]
fn impossible_domu_layouts_are_errors() {
    let p = DomuPlacement { id: 1, ram: r(0x1_0000_0000, 128 * MIB), disk: None };
    let e = layout_domu(&spec(1, 128 * MIB, 100 * MIB, Some(30 * MIB), 0), &p, &img(0)).unwrap_err();
    assert!(matches!(e, DomainError::ModulesDoNotFit { id: 1, .. }), "{e}");
    let e = layout_domu(&spec(1, 32 * MIB, MIB, None, 0), &p, &img(0)).unwrap_err();
    assert!(matches!(e, DomainError::BadMemory { .. }), "{e}");
    let e = layout_domu(&spec(1, 129 * MIB, MIB, None, 0), &p, &img(0)).unwrap_err();
    assert!(matches!(e, DomainError::BadMemory { .. }), "{e}");
    let e = layout_domu(&spec(1, 256 * MIB, MIB, None, 0), &p, &img(0)).unwrap_err();
    assert!(matches!(e, DomainError::PlacementTooSmall { .. }), "{e}");
    let e = layout_domu(&spec(1, 128 * MIB, MIB, None, MIB), &p, &img(0)).unwrap_err();
    assert!(matches!(e, DomainError::NoDisk { .. }), "{e}");
    let mut s = spec(1, 128 * MIB, MIB, None, 0);
    s.vcpus = 0;
    assert!(matches!(layout_domu(&s, &p, &img(0)), Err(DomainError::BadVcpus { .. })));
    let s = spec(1, MAX_DOMU_RAM + 2 * MIB, MIB, None, 0);
    assert!(matches!(layout_domu(&s, &p, &img(0)), Err(DomainError::BadMemory { .. })));
}

#[test]
fn selftest_carves_disjoint_domus_from_the_top_of_dom0() {
    let dom0 = r(0x6000_0000, 1024 * MIB);
    let (left, ps) = selftest_carve(dom0, 2, 256 * MIB, 32 * MIB, 256 * MIB).expect("fits");
    assert_eq!(left, r(0x6000_0000, 1024 * MIB - 2 * 288 * MIB));
    assert_eq!(ps.len(), 2);
    assert_eq!(ps[0].id, 1);
    assert_eq!(ps[1].id, 2);
    assert_eq!(ps[0].ram.base, left.end());
    assert_eq!(ps[0].disk, Some(r(left.end() + 256 * MIB, 32 * MIB)));
    assert_eq!(ps[1].ram.base, ps[0].disk.unwrap().end());
    assert_eq!(ps[1].disk.unwrap().end(), dom0.end());
    let e = selftest_carve(dom0, 4, 256 * MIB, 32 * MIB, 256 * MIB).unwrap_err();
    assert!(matches!(e, DomainError::SelftestNoRoom { n: 4, .. }), "{e}");
    assert!(selftest_carve(dom0, u32::MAX, u64::MAX / 2, 0, 0).is_err());
}

fn text(v: &[u8]) -> &str {
    core::str::from_utf8(v).unwrap()
}

#[test]
fn domu_lines_are_prefixed_and_dom0_writes_through() {
    let mut m = ConsoleMux::new();
    let mut out = Vec::new();
    for b in b"dom0 $ " {
        m.putc(0, *b, &mut out);
    }
    assert_eq!(text(&out), "dom0 $ ", "the focus writes through");
    for b in b"hello from d1\r\n" {
        m.putc(1, *b, &mut out);
    }
    assert_eq!(text(&out), "dom0 $ ", "d1's line waits while dom0 is mid-line");
    m.putc(0, b'\n', &mut out);
    assert_eq!(text(&out), "dom0 $ \n(d1) hello from d1\r\n");
    for b in b"a\nb\n" {
        m.putc(2, *b, &mut out);
    }
    assert!(text(&out).ends_with("(d2) a\n(d2) b\n"));
}

#[test]
fn hypervisor_lines_end_an_open_line_and_release_held_ones() {
    let mut m = ConsoleMux::new();
    let mut out = Vec::new();
    m.putc(0, b'x', &mut out);
    for b in b"l1\n" {
        m.putc(1, *b, &mut out);
    }
    m.break_line(&mut out);
    out.extend_from_slice(b"(HV) log\n");
    m.after_hv_line(&mut out);
    assert_eq!(text(&out), "x\n(HV) log\n(d1) l1\n");
}

#[test]
fn an_endless_held_line_is_printed_on_its_own() {
    let mut m = ConsoleMux::new();
    let mut out = Vec::new();
    m.putc(0, b'$', &mut out);
    for _ in 0..LINE_MAX {
        m.putc(1, b'z', &mut out);
    }
    let s = text(&out);
    assert!(s.starts_with("$\n(d1) zzz"), "{s}");
    assert!(s.ends_with("z\n"));
    m.putc(0, b'!', &mut out);
    assert!(text(&out).ends_with("z\n!"), "dom0 continues on a fresh line without a prefix");
}

#[test]
fn held_lines_forced_out_keep_one_prefix_each() {
    let mut m = ConsoleMux::new();
    let mut out = Vec::new();
    m.putc(0, b'$', &mut out);
    let line = [b'y'; 99];
    let mut n = 0;
    while n + 100 < LINE_MAX {
        for &b in line.iter().chain(b"\n") {
            m.putc(1, b, &mut out);
        }
        n += 100;
    }
    assert_eq!(text(&out), "$", "held while dom0 is mid-line");
    for _ in n..LINE_MAX {
        m.putc(1, b'y', &mut out);
    }
    let s = text(&out);
    assert!(s.starts_with("$\n(d1) y"));
    assert!(s.lines().skip(1).all(|l| l.starts_with("(d1) ")), "every forced line has its prefix");
    assert_eq!(s.lines().count(), 1 + n / 100, "the unfinished rest stays held");
}

#[test]
fn focus_switch_prints_what_the_new_focus_held() {
    let mut m = ConsoleMux::new();
    let mut out = Vec::new();
    for b in b"login: " {
        m.putc(1, *b, &mut out);
    }
    assert!(out.is_empty());
    m.set_focus(1, &mut out);
    assert_eq!(text(&out), "(d1) login: ");
    m.putc(1, b'r', &mut out);
    assert_eq!(text(&out), "(d1) login: r");
    assert_eq!(m.focus(), 1);
}

#[test]
fn ctrl_a_three_times_switches_and_other_keys_reset_the_count() {
    let mut s = InputSwitch::new();
    assert_eq!(s.feed(SWITCH_KEY), Input::Byte(SWITCH_KEY));
    assert_eq!(s.feed(b'x'), Input::Byte(b'x'));
    assert_eq!(s.feed(SWITCH_KEY), Input::Byte(SWITCH_KEY));
    assert_eq!(s.feed(SWITCH_KEY), Input::Byte(SWITCH_KEY));
    assert_eq!(s.feed(SWITCH_KEY), Input::Switch);
    assert_eq!(s.feed(SWITCH_KEY), Input::Byte(SWITCH_KEY), "counting starts again");
    assert_eq!(next_domain(0, &[0, 1, 2]), 1);
    assert_eq!(next_domain(2, &[0, 1, 2]), 0);
    assert_eq!(next_domain(1, &[0, 2]), 2);
    assert_eq!(next_domain(0, &[]), 0);
}

#[test]
fn selftest_specs_reuse_dom0s_modules_and_pass_the_command() {
    let k = r(0x4800_0000, 30 * MIB);
    let i = Some(r(0x4a00_0000, 80 * MIB));
    let specs = selftest_specs(2, k, i, (512 * MIB, 2, 32 * MIB), Some("dHJ1ZQ=="));
    assert_eq!(specs.len(), 2);
    assert_eq!((specs[0].id, specs[1].id), (1, 2));
    assert_eq!(specs[1].name, "domU2");
    assert_eq!(specs[0].vcpus, 2);
    assert_eq!((specs[0].kernel, specs[0].ramdisk), (k, i));
    assert!(specs[0].bootargs.starts_with("console=ttyAMA0 "));
    assert!(specs[0].bootargs.ends_with(" guestcmd=dHJ1ZQ=="));
    let p = selftest_carve(r(0x6000_0000, 2048 * MIB), 2, 512 * MIB, 32 * MIB, 256 * MIB).unwrap().1;
    let l = layout_domu(&specs[1], &p[1], &img(40 * MIB)).expect("a self-test DomU fits its placement");
    assert_eq!(l.ram.host, p[1].ram.base);
    assert!(selftest_specs(0, k, None, (512 * MIB, 1, 0), None).is_empty());
}

#[test]
fn domu_fixed_address_kernels_load_in_its_ram_around_the_dtb_and_initrd() {
    use crate::boot::image::{read_kernel, FixedLoad, Piece};
    let p = DomuPlacement { id: 1, ram: r(0x1_0000_0000, 128 * MIB), disk: None };
    let mut s = spec(1, 128 * MIB, MIB, Some(3 * MIB), 0);
    // A raw binary at the top 2 MiB of its RAM: the DTB goes below it, the
    // initrd at the bottom; the copy comes from the module's first byte.
    s.kernel_load_addr = Some(DOMU_RAM_BASE + 126 * MIB);
    let load = read_kernel(&alloc::vec![0u8; MIB as usize], s.kernel_load_addr).unwrap();
    let l = layout_domu(&s, &p, &load).expect("fits");
    assert_eq!(l.entry, DOMU_RAM_BASE + 126 * MIB);
    assert_eq!(l.kernel.len(), 1);
    assert_eq!(l.kernel[0].src, r(0x4800_0000, MIB));
    assert_eq!(l.kernel[0].dst, Placed { ipa: r(DOMU_RAM_BASE + 126 * MIB, MIB), host: 0x1_0000_0000 + 126 * MIB });
    assert_eq!(l.dtb.ipa, r(DOMU_RAM_BASE + 124 * MIB, 2 * MIB));
    assert_eq!(l.initrd.unwrap().ipa, r(DOMU_RAM_BASE, 3 * MIB));

    // ELF pieces: copied from their offsets in the module.
    let pieces = Vec::from([
        Piece { offset: 0x1000, size: 0x2000, at: r(DOMU_RAM_BASE + 0x8_0000, 0x2000) },
        Piece { offset: 0x3000, size: 0x100, at: r(DOMU_RAM_BASE + 0x10_0000, 0x1_0000) },
    ]);
    let load = KernelLoad::Fixed(FixedLoad { pieces, entry: DOMU_RAM_BASE + 0x8_0000 });
    let l = layout_domu(&s, &p, &load).expect("fits");
    assert_eq!(l.kernel[1].src, r(0x4800_3000, 0x100));
    assert_eq!(l.kernel[1].dst.host, 0x1_0010_0000);
    assert_eq!(l.initrd.unwrap().ipa, r(DOMU_RAM_BASE + 2 * MIB, 3 * MIB));

    // Outside its RAM: below its base, past its end.
    for at in [0x3fff_f000, DOMU_RAM_BASE + 128 * MIB - 0x1000] {
        let load = read_kernel(&[0u8; 0x2000], Some(at)).unwrap();
        let e = layout_domu(&s, &p, &load).unwrap_err();
        assert_eq!(e, DomainError::KernelOutsideRam { id: 1, range: r(at, 0x2000), ram: r(DOMU_RAM_BASE, 128 * MIB) });
    }
    // Filling its RAM: no room for the DTB.
    let load = read_kernel(&alloc::vec![0u8; 127 * MIB as usize], Some(DOMU_RAM_BASE)).unwrap();
    assert!(matches!(layout_domu(&s, &p, &load), Err(DomainError::ModulesDoNotFit { .. })));
}
