use super::*;

/// A function shaped like QEMU's NVMe controller: vendor 0x1b36 device
/// 0x0010, class 0x010802, multi-function header (to see the bit cleared),
/// BAR0 64-bit non-prefetchable 16 KiB with real sizing, capabilities PM
/// (0x40) → MSI-X (0x50) → PCI Express (0x60, FLR capable), an extended
/// capability at 0x100. Every write is logged.
struct FakeNvme {
    cfg: [u32; 1024],
    /// BAR sizes by register (0 = unimplemented); an I/O BAR when `io`.
    bar_mask: [u32; 6],
    writes: Vec<(u16, u32)>,
}

const BAR0: u32 = 0x1000_0000;

impl FakeNvme {
    fn new() -> Self {
        let mut cfg = [0u32; 1024];
        cfg[0] = 0x0010_1b36;
        cfg[1] = 0x0010_0000; // Status: capability list
        cfg[2] = 0x0108_0202;
        cfg[3] = 0x0080_0000; // header type 0x80
        cfg[4] = BAR0 | 0b100;
        cfg[5] = 0;
        cfg[0x2c / 4] = 0x1100_1af4;
        cfg[0x34 / 4] = 0x40;
        cfg[0x3c / 4] = 0x0000_0100; // pin A
        cfg[0x40 / 4] = 0x0003_5001; // PM → 0x50
        cfg[0x50 / 4] = 0x0040_6011; // MSI-X, 65 vectors → 0x60
        cfg[0x54 / 4] = 0x0000_2000;
        cfg[0x60 / 4] = 0x0002_0010; // PCIe → end
        cfg[0x64 / 4] = 1 << 28; // DevCap: FLR
        cfg[0x100 / 4] = 0x0001_0001;
        FakeNvme { cfg, bar_mask: [0xffff_c000, 0xffff_ffff, 0, 0, 0, 0], writes: Vec::new() }
    }
}

impl ConfigSpace for FakeNvme {
    fn read32(&mut self, off: u16) -> u32 {
        self.cfg[usize::from(off / 4)]
    }
    fn write32(&mut self, off: u16, val: u32) {
        self.writes.push((off, val));
        let k = usize::from(off / 4);
        if (4..10).contains(&k) {
            let m = self.bar_mask[k - 4];
            let ro = self.cfg[k] & 0xf & if k == 4 { 0xf } else { 0 };
            self.cfg[k] = (val & m) | ro;
            return;
        }
        if k == 1 {
            // Status: read-only or write-1-to-clear; nothing here clears.
            self.cfg[k] = (self.cfg[k] & 0xffff_0000) | (val & 0xffff);
            return;
        }
        self.cfg[k] = val;
    }
}

fn nvme_bar() -> PhysBar {
    PhysBar { index: 0, size: 0x4000, is64: true, prefetchable: false }
}

fn assigned(f: &mut FakeNvme) -> AssignedFunction {
    AssignedFunction::new(f, Vec::from([GuestBar { phys: nvme_bar(), guest: 0x1000_0000 }]))
}

#[test]
fn probing_finds_the_64_bit_bar_and_leaves_the_function_as_it_was() {
    let mut f = FakeNvme::new();
    f.cfg[1] |= 0x6;
    let before = f.cfg;
    assert_eq!(probe_bars(&mut f).unwrap(), [nvme_bar()]);
    assert_eq!(f.cfg[..], before[..], "BARs and command restored");
    // Memory decode was off while a BAR held all-ones.
    let first_all_ones = f.writes.iter().position(|w| w.1 == u32::MAX).unwrap();
    assert!(f.writes[..first_all_ones].iter().any(|&(o, v)| o == 4 && v & 2 == 0));
    assert!(flr_capable(&mut f));
}

#[test]
fn what_cannot_be_assigned_is_refused_by_name() {
    let mut f = FakeNvme::new();
    f.cfg[0] = 0xffff_ffff;
    assert_eq!(probe_bars(&mut f), Err(ProbeError::NoFunction));
    let mut f = FakeNvme::new();
    f.cfg[3] = 0x0001_0000;
    assert_eq!(probe_bars(&mut f), Err(ProbeError::NotType0(1)));
    let mut f = FakeNvme::new();
    f.cfg[6] = 0xc001;
    f.bar_mask[2] = 0xffff_ff01;
    assert_eq!(probe_bars(&mut f), Err(ProbeError::IoBar(2)));
    assert!(ProbeError::IoBar(2).to_string().contains("BAR2"));
}

#[test]
fn programming_writes_both_halves_and_leaves_decode_off() {
    let mut f = FakeNvme::new();
    program_bars(&mut f, &[(nvme_bar(), 0x80_3eff_c000)]);
    assert_eq!(f.cfg[4], 0x3eff_c004);
    assert_eq!(f.cfg[5], 0x80);
    assert_eq!(f.cfg[1] & 2, 0);
}

#[test]
fn the_guest_sizes_its_bar_and_writes_it_back_without_moving_it() {
    let mut f = FakeNvme::new();
    let mut a = assigned(&mut f);
    f.writes.clear();
    assert_eq!(a.read(&mut f, 0x10, 4), 0x1000_0004);
    assert_eq!(a.read(&mut f, 0x14, 4), 0);
    assert_eq!(a.write(&mut f, 0x10, 4, u32::MAX), CfgWrite::Applied);
    assert_eq!(a.read(&mut f, 0x10, 4), 0xffff_c004, "the size mask and the 64-bit type");
    assert_eq!(a.write(&mut f, 0x14, 4, u32::MAX), CfgWrite::Applied);
    assert_eq!(a.read(&mut f, 0x14, 4), u32::MAX);
    assert_eq!(a.write(&mut f, 0x10, 4, 0x1000_0004), CfgWrite::Applied);
    assert_eq!(a.write(&mut f, 0x14, 4, 0), CfgWrite::Applied);
    assert_eq!(a.read(&mut f, 0x10, 4), 0x1000_0004);
    assert!(f.writes.is_empty(), "the physical BAR is never written for the guest: {:x?}", f.writes);
    assert_eq!(a.counters().bar_moves, 0);
}

#[test]
fn a_bar_move_is_reported_and_never_reaches_the_device() {
    let mut f = FakeNvme::new();
    let mut a = assigned(&mut f);
    f.writes.clear();
    // Over the GIC, say.
    assert_eq!(a.write(&mut f, 0x10, 4, 0x0800_0000), CfgWrite::BarMoved { index: 0, to: 0x0800_0000 });
    assert_eq!(a.read(&mut f, 0x10, 4), 0x0800_0004, "the guest reads what it wrote");
    // Into high memory through the upper half.
    assert!(matches!(a.write(&mut f, 0x14, 4, 0x1), CfgWrite::BarMoved { index: 0, .. }));
    assert!(f.writes.is_empty());
    assert_eq!(a.counters().bar_moves, 2);
    // Unimplemented BARs and the ROM: 0, writes dropped.
    assert_eq!(a.read(&mut f, 0x18, 4), 0);
    assert_eq!(a.write(&mut f, 0x18, 4, u32::MAX), CfgWrite::Ignored);
    assert_eq!(a.write(&mut f, 0x30, 4, u32::MAX), CfgWrite::Ignored);
    assert_eq!(a.read(&mut f, 0x30, 4), 0);
}

#[test]
fn the_command_register_passes_decode_mastering_and_intx_disable_only() {
    let mut f = FakeNvme::new();
    f.cfg[1] |= 0xffff << 16; // Status bits set (RW1C)
    let mut a = assigned(&mut f);
    assert_eq!(a.write(&mut f, 0x04, 2, 0x0407), CfgWrite::Applied);
    assert_eq!(f.cfg[1] & 0xffff, 0x0406, "I/O space never enabled");
    assert_eq!(f.writes.last().unwrap().1 >> 16, 0, "Status is never written");
    // A byte write of the low byte keeps INTx disable.
    assert_eq!(a.write(&mut f, 0x04, 1, 0x02), CfgWrite::Applied);
    assert_eq!(f.cfg[1] & 0xffff, 0x0402);
    // A write to Status alone is dropped.
    assert_eq!(a.write(&mut f, 0x06, 2, 0xffff), CfgWrite::Ignored);
}

#[test]
fn msix_enable_and_mask_pass_and_nothing_else_of_its_control() {
    let mut f = FakeNvme::new();
    let mut a = assigned(&mut f);
    assert_eq!(a.write(&mut f, 0x52, 2, 0xffff), CfgWrite::Applied);
    assert_eq!(f.cfg[0x50 / 4] >> 16, 0xc040, "Enable and Function Mask set, table size untouched");
    assert_eq!(a.write(&mut f, 0x52, 2, 0x0000), CfgWrite::Applied);
    assert_eq!(f.cfg[0x50 / 4] >> 16, 0x0040);
    assert_eq!(a.write(&mut f, 0x50, 1, 0x77), CfgWrite::Ignored);
    assert_eq!(f.cfg[0x50 / 4] & 0xffff, 0x6011);
}

#[test]
fn identity_header_and_reset_fields_are_read_only() {
    let mut f = FakeNvme::new();
    let before = f.cfg;
    let mut a = assigned(&mut f);
    for (off, size) in [(0x00, 4), (0x08, 4), (0x0c, 4), (0x2c, 4), (0x68, 2), (0x100, 4), (0x40, 4)] {
        assert_eq!(a.write(&mut f, off, size, u32::MAX), CfgWrite::Ignored, "{off:#x}");
    }
    assert_eq!(f.cfg[..], before[..], "the guest cannot start an FLR or change an ID");
    assert_eq!(a.counters().ignored, 7);
    assert_eq!(a.read(&mut f, 0x0e, 1), 0, "one function per slot");
    assert_eq!(a.read(&mut f, 0x3d, 1), 0, "no INTx");
    assert_eq!(a.read(&mut f, 0x00, 2), 0x1b36);
    assert_eq!(a.read(&mut f, 0x02, 2), 0x0010);
    assert_eq!(a.read(&mut f, 0x100, 4), 0x0001_0001);
    assert_eq!(a.write(&mut f, 0x3c, 1, 0x2a), CfgWrite::Applied);
    assert_eq!(a.read(&mut f, 0x3c, 2), 0x002a);
}

#[test]
fn malformed_accesses_read_all_ones_and_write_nothing() {
    let mut f = FakeNvme::new();
    let mut a = assigned(&mut f);
    f.writes.clear();
    assert_eq!(a.read(&mut f, 0x01, 2), 0xffff);
    assert_eq!(a.read(&mut f, 0x02, 4), u32::MAX);
    assert_eq!(a.read(&mut f, 4096, 4), u32::MAX);
    assert_eq!(a.read(&mut f, 0, 3), u32::MAX);
    assert_eq!(a.write(&mut f, 0x05, 2, 0), CfgWrite::Bad);
    assert_eq!(a.write(&mut f, 4092, 8, 0), CfgWrite::Bad);
    assert!(f.writes.is_empty());
    assert_eq!(a.counters().bad, 6);
}

#[test]
fn a_capability_list_that_loops_ends() {
    let mut f = FakeNvme::new();
    f.cfg[0x60 / 4] = 0x0002_4010; // PCIe → back to PM
    assert_eq!(capabilities(&mut f), [(0x01, 0x40), (0x11, 0x50), (0x10, 0x60)]);
    f.cfg[0x40 / 4] = 0x0003_4001; // PM → itself
    assert_eq!(capabilities(&mut f), [(0x01, 0x40)]);
    f.cfg[0x34 / 4] = 0x10; // into the header
    assert!(capabilities(&mut f).is_empty());
}

#[test]
fn reset_stops_the_function_then_starts_an_flr() {
    let mut f = FakeNvme::new();
    f.cfg[1] |= 0x6;
    f.cfg[0x68 / 4] = 0x000f_2810; // DevStatus bits set, DevCtl
    assert!(start_reset(&mut f));
    assert_eq!(f.cfg[1] & 0x6, 0);
    assert_eq!(f.cfg[0x68 / 4], 0x0000_a810, "Initiate FLR, Device Status not written back");
    let mut f = FakeNvme::new();
    f.cfg[0x64 / 4] = 0;
    f.cfg[1] |= 0x6;
    assert!(!start_reset(&mut f));
    assert_eq!(f.cfg[1] & 0x6, 0, "stopped even without FLR");
}

#[test]
fn bdfs_parse_as_linux_and_xen_print_them() {
    let b: Bdf = "0000:00:02.0".parse().unwrap();
    assert_eq!(b, Bdf { seg: 0, bus: 0, dev: 2, func: 0 });
    assert_eq!(b.rid(), 0x10);
    assert_eq!(b.to_string(), "0000:00:02.0");
    let b: Bdf = "01:1f.7".parse().unwrap();
    assert_eq!((b.seg, b.bus, b.dev, b.func, b.rid()), (0, 1, 31, 7, 0x1ff));
    assert_eq!("0000:00:20.0".parse::<Bdf>(), Err(BdfError::Device(0x20)));
    assert_eq!("0000:00:02.8".parse::<Bdf>(), Err(BdfError::Function(8)));
    for bad in ["", "0000:00:02", "x:00:02.0", "00000:00:02.0", "0:0:0:0.0", "0000:00:02.0 "] {
        assert_eq!(bad.parse::<Bdf>(), Err(BdfError::Syntax), "{bad:?}");
    }
}

#[test]
fn random_guest_accesses_never_reach_bars_io_enable_status_or_device_control() {
    let mut rng = crate::testrng::Rng(0x5eed_0f7c);
    let mut f = FakeNvme::new();
    // MSI (64-bit, per-vector masking) where PM was, then MSI-X, PCIe.
    f.cfg[0x40 / 4] = 0x0180_5005;
    let mut a = assigned(&mut f);
    f.writes.clear();
    let offsets =
        [0x00, 0x04, 0x06, 0x0c, 0x10, 0x14, 0x18, 0x30, 0x3c, 0x40, 0x44, 0x48, 0x4c, 0x50, 0x60, 0x68, 0x100];
    for _ in 0..20_000 {
        let off = offsets[rng.index(offsets.len())] + rng.below(4) as u16;
        let size = [1u8, 2, 4, 3, 8][rng.index(5)];
        let val = rng.next() as u32;
        if rng.below(2) == 0 {
            let _ = a.read(&mut f, off, size);
        } else {
            let _ = a.write(&mut f, off, size, val);
        }
    }
    for &(off, val) in &f.writes {
        assert!(!(0x10..0x28).contains(&off), "a guest write reached BAR register {off:#x}");
        assert!(off != 0x68, "a guest write reached Device Control");
        if off == 0x04 {
            assert_eq!(val & 1, 0, "I/O space enabled");
            assert_eq!(val >> 16, 0, "Status written");
        }
        assert!(off == 0x04 || (0x40..0x60).contains(&off), "write outside the writable fields: {off:#x}");
    }
    assert!(!f.writes.is_empty(), "the run exercised the writable fields");
}
