//! Fuzz what a guest does to the configuration space of a PCIe function
//! assigned to it: any sequence of reads and writes (offset, size, value
//! from the input) through `vpci::AssignedFunction` over a fake function
//! with a 64-bit BAR and MSI-X, MSI and PCI Express capabilities, whose
//! capability list the input may also corrupt (loops, pointers into the
//! header). Nothing may panic; the physical BARs are never written on the
//! guest's behalf; I/O space is never enabled; the PCI Express capability
//! (where FLR is started) is never written; the walk of the capability
//! list stays bounded.
//!
//! Run: `cargo +nightly fuzz run vpci -- -max_total_time=600`
#![no_main]

use hypervisor::vpci::{capabilities, AssignedFunction, ConfigSpace, GuestBar, PhysBar};
use libfuzzer_sys::fuzz_target;

struct Fake {
    cfg: [u32; 1024],
    bar_writes: u32,
    pcie_writes: u32,
}

impl ConfigSpace for Fake {
    fn read32(&mut self, off: u16) -> u32 {
        self.cfg[usize::from(off & 0xffc) / 4]
    }
    fn write32(&mut self, off: u16, val: u32) {
        let k = usize::from(off & 0xffc) / 4;
        if (4..10).contains(&k) {
            self.bar_writes += 1;
        }
        if (0x60 / 4..0x60 / 4 + 15).contains(&k) {
            self.pcie_writes += 1;
        }
        self.cfg[k] = val;
    }
}

fuzz_target!(|data: &[u8]| {
    let mut f = Fake { cfg: [0; 1024], bar_writes: 0, pcie_writes: 0 };
    f.cfg[0] = 0x0010_1b36;
    f.cfg[1] = 0x0010_0000;
    f.cfg[4] = 0x1000_0004;
    f.cfg[0x34 / 4] = 0x40;
    f.cfg[0x40 / 4] = 0x0180_5005; // MSI, 64-bit, maskable → 0x50
    f.cfg[0x50 / 4] = 0x0040_6011; // MSI-X → 0x60
    f.cfg[0x60 / 4] = 0x0002_0010; // PCI Express
    f.cfg[0x64 / 4] = 1 << 28;
    // The first bytes may corrupt the capability list.
    if let [a, b, ..] = data {
        f.cfg[0x34 / 4] = u32::from(*a);
        f.cfg[0x40 / 4] = (f.cfg[0x40 / 4] & !0xff00) | (u32::from(*b) << 8);
    }
    assert!(capabilities(&mut f).len() <= 48);
    let bar = PhysBar { index: 0, size: 0x4000, is64: true, prefetchable: false };
    let mut a = AssignedFunction::new(&mut f, vec![GuestBar { phys: bar, guest: 0x1000_0000 }]);
    for op in data.get(2..).unwrap_or(&[]).chunks(8) {
        let mut w = [0u8; 8];
        w[..op.len()].copy_from_slice(op);
        let off = u16::from_le_bytes([w[0], w[1]]) & 0x1fff;
        let size = [1u8, 2, 4, 3, 8][usize::from(w[2]) % 5];
        let val = u32::from_le_bytes([w[3], w[4], w[5], w[6]]);
        if w[7] & 1 == 0 {
            let _ = a.read(&mut f, off, size);
        } else {
            let _ = a.write(&mut f, off, size, val);
        }
        assert_eq!(f.bar_writes, 0, "a guest write reached a physical BAR");
        assert_eq!(f.cfg[1] & 1, 0, "a guest enabled I/O space");
    }
    // The capability at 0x60 is the PCI Express one only while the list
    // still leads there; the guest never writes inside it either way.
    assert_eq!(f.pcie_writes, 0, "a guest write reached the PCI Express capability");
});
