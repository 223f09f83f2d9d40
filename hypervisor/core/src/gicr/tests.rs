//! Host tests of the redistributor walk over a fake GIC: QEMU virt's two
//! regions with 192 CPUs, per-GICC single-frame regions, GICv4 frames,
//! and regions that never say Last.

use super::*;
use alloc::collections::BTreeMap;
use alloc::vec;

/// QEMU virt's MPIDR for CPU `i` with GICv3: 16 CPUs per Aff1 cluster.
fn qemu_mpidr(i: u64) -> u64 {
    0x8000_0000 | ((i / 16) << 8) | (i % 16)
}

fn typer(mpidr: u64, last: bool, vlpis: bool) -> u64 {
    (u64::from(mpidr_affinity(mpidr)) << 32) | (u64::from(last) << 4) | (u64::from(vlpis) << 1)
}

/// A fake redistributor space: GICR_TYPER by address; reading anything
/// else fails the test.
struct FakeGic {
    typers: BTreeMap<u64, u64>,
    reads: usize,
}

impl FakeGic {
    fn new() -> Self {
        FakeGic { typers: BTreeMap::new(), reads: 0 }
    }

    /// `cpus` frames from `base`, the last one marked Last when `last`.
    fn region(&mut self, base: u64, cpus: core::ops::Range<u64>, stride: u64, last: bool) {
        let n = cpus.end - cpus.start;
        for (k, i) in cpus.enumerate() {
            let is_last = last && k as u64 == n - 1;
            self.typers
                .insert(base + k as u64 * stride + GICR_TYPER, typer(qemu_mpidr(i), is_last, stride == FRAME_V4));
        }
    }

    fn read(&mut self, addr: u64) -> u64 {
        self.reads += 1;
        *self.typers.get(&addr).unwrap_or_else(|| panic!("read outside the redistributors: {addr:#x}"))
    }
}

#[test]
fn qemu_virt_192_cpus_in_two_regions() {
    // QEMU virt: 123 frames fill the low region, the other 69 are at 256 GiB.
    let mut gic = FakeGic::new();
    gic.region(0x080a_0000, 0..123, FRAME_V3, true);
    gic.region(0x40_0000_0000, 123..192, FRAME_V3, true);
    let regions = [Region { base: 0x080a_0000, size: 0xf6_0000 }, Region { base: 0x40_0000_0000, size: 0x400_0000 }];
    let frames = walk(&regions, |a| gic.read(a));
    assert_eq!(frames.len(), 192);
    assert_eq!(gic.reads, 192);
    let mpidrs: Vec<u64> = (0..192).map(qemu_mpidr).collect();
    assert_eq!(served(&frames, &mpidrs), 192);
    assert_eq!(find(&frames, qemu_mpidr(0)).unwrap().rd_base, 0x080a_0000);
    assert_eq!(find(&frames, qemu_mpidr(122)).unwrap().rd_base, 0x080a_0000 + 122 * FRAME_V3);
    assert_eq!(find(&frames, qemu_mpidr(123)).unwrap().rd_base, 0x40_0000_0000);
    assert_eq!(find(&frames, qemu_mpidr(191)).unwrap().rd_base, 0x40_0000_0000 + 68 * FRAME_V3);
    // MPIDR bits outside the affinity fields (U, MT, RES1) do not matter.
    assert_eq!(find(&frames, qemu_mpidr(130) & 0xff_ffff).unwrap().rd_base, 0x40_0000_0000 + 7 * FRAME_V3);
    // A CPU the GIC does not serve has no frame.
    assert!(find(&frames, qemu_mpidr(192)).is_none());
    assert_eq!(served(&frames, &[qemu_mpidr(0), qemu_mpidr(500)]), 1);
}

#[test]
fn only_the_first_region_listed_finds_only_its_cpus() {
    let mut gic = FakeGic::new();
    gic.region(0x080a_0000, 0..123, FRAME_V3, true);
    gic.region(0x40_0000_0000, 123..192, FRAME_V3, true);
    let frames = walk(&[Region { base: 0x080a_0000, size: 0xf6_0000 }], |a| gic.read(a));
    let mpidrs: Vec<u64> = (0..192).map(qemu_mpidr).collect();
    assert_eq!(served(&frames, &mpidrs), 123);
}

#[test]
fn per_gicc_bases_are_single_frame_regions() {
    // An MADT without GICR structures: one base per GICC, each region one
    // frame long; a contiguous layout marks only the very last frame Last,
    // so the region's end must stop each walk.
    let mut gic = FakeGic::new();
    gic.region(0x2000_0000, 0..8, FRAME_V4, true);
    let regions: Vec<Region> = (0..8).map(|i| Region { base: 0x2000_0000 + i * FRAME_V4, size: FRAME_V4 }).collect();
    let frames = walk(&regions, |a| gic.read(a));
    assert_eq!(frames.len(), 8);
    assert_eq!(gic.reads, 8);
    for i in 0..8 {
        assert_eq!(find(&frames, qemu_mpidr(i)).unwrap().rd_base, 0x2000_0000 + i * FRAME_V4);
    }
    // A GICv3-sized base (the MADT's GICD said v3) on a GICv4 frame: still one read.
    let mut gic2 = FakeGic::new();
    gic2.region(0x2000_0000, 0..2, FRAME_V4, false);
    let frames = walk(&[Region { base: 0x2000_0000, size: FRAME_V3 }], |a| gic2.read(a));
    assert_eq!(frames.len(), 1);
}

#[test]
fn gicv4_frames_are_twice_as_long() {
    let mut gic = FakeGic::new();
    gic.region(0x080a_0000, 0..4, FRAME_V4, true);
    let frames = walk(&[Region { base: 0x080a_0000, size: 0xf6_0000 }], |a| gic.read(a));
    assert_eq!(
        frames.iter().map(|f| f.rd_base).collect::<Vec<_>>(),
        vec![0x080a_0000, 0x080e_0000, 0x0812_0000, 0x0816_0000]
    );
}

#[test]
fn hostile_regions_end_the_walk() {
    // No frame says Last: the region's end stops the walk.
    let mut gic = FakeGic::new();
    gic.region(0x1000_0000, 0..4, FRAME_V3, false);
    let frames = walk(&[Region { base: 0x1000_0000, size: 4 * FRAME_V3 + 0x1000 }], |a| gic.read(a));
    assert_eq!(frames.len(), 4);
    // ... and MAX_FRAMES a region as large as the address space.
    let frames = walk(&[Region { base: 0, size: u64::MAX }], |_| 0);
    assert_eq!(frames.len(), MAX_FRAMES);
    // A region at the top of the address space does not wrap.
    assert!(walk(&[Region { base: u64::MAX - 0xffff, size: 0x10000 }], |_| 0).is_empty());
    assert!(walk(&[Region { base: u64::MAX - FRAME_V3 + 1, size: FRAME_V3 }], |_| 0).is_empty());
    // Too small for one frame; empty.
    assert!(walk(&[Region { base: 0x1000_0000, size: 0x1_0000 }, Region { base: 0, size: 0 }], |_| 0).is_empty());
    // The same region twice (or overlapping): each frame read once.
    let mut gic = FakeGic::new();
    gic.region(0x1000_0000, 0..4, FRAME_V3, true);
    let r = Region { base: 0x1000_0000, size: 0x10_0000 };
    let frames = walk(&[r, r, Region { base: 0x1002_0000, size: FRAME_V3 }], |a| gic.read(a));
    assert_eq!((frames.len(), gic.reads), (4, 4));
}

#[test]
fn affinity_packing() {
    assert_eq!(mpidr_affinity(0x8000_0000), 0);
    assert_eq!(mpidr_affinity(0x0000_00ab_0001_0203), 0xab01_0203);
    // U (bit 30) and MT (bit 24) are not affinity.
    assert_eq!(mpidr_affinity(0x4100_0305), 0x0000_0305);
    assert_eq!(Frame { rd_base: 0, typer: 0xab01_0203_0000_0011 }.affinity(), 0xab01_0203);
}
