//! Host tests of the boot-layout planner and the arm64 Image header.

use super::image::{arm64_image_size, KernelError};
use super::plan::*;
use crate::domain::{DomuPlacement, VmSpec, DEFAULT_WEIGHT};
use crate::region::Region;
use crate::testrng::Rng;
use alloc::format;
use alloc::string::ToString;
use alloc::vec::Vec;

const MIB: u64 = 1 << 20;

fn r(base: u64, size: u64) -> Region {
    Region { base, size }
}

fn end(x: Region) -> u64 {
    x.base + x.size
}

fn disjoint(a: Region, b: Region) -> bool {
    a.size == 0 || b.size == 0 || end(a) <= b.base || end(b) <= a.base
}

/// QEMU virt with `-m 1536M`: one bank at 1 GiB.
const RAM: [Region; 1] = [Region { base: 0x4000_0000, size: 1536 * MIB }];
/// The Debian cloud kernel of the guest image: file and `image_size`.
const KERNEL_FILE: u64 = 27_303_872;
const KERNEL_IMAGE_SIZE: u64 = 0x1ab_0000;
/// The guest image's initramfs.
const INITRD_FILE: u64 = 86_894_080;

/// The hypervisor loaded at 0x40200000 (6 MiB with BSS), QEMU's 1 MiB DTB
/// at 0x48000000, the modules where the runner puts them, `dom0_mem=1024M`.
fn inputs(kernel_at: u64, initrd: Option<Region>) -> Inputs<'static> {
    Inputs {
        ram: &RAM,
        image: r(0x4020_0000, 6 * MIB),
        dtb: r(0x4800_0000, MIB),
        reserved: &[],
        kernel: Kernel { module: r(kernel_at, KERNEL_FILE), image_size: KERNEL_IMAGE_SIZE, fixed: None },
        initrd,
        dom0_mem: Some(1024 * MIB),
        ram_disk: 0,
        heap_size: 48 * MIB,
        keep_low: 512 * MIB,
        domus: &[],
        domu_pool: 0,
    }
}

/// Everything the planner was told to keep.
fn kept(i: &Inputs<'_>) -> Vec<Region> {
    let mut k = Vec::from([i.image, i.dtb, i.kernel.module]);
    k.extend(i.initrd);
    k.extend(i.reserved.iter().copied());
    for d in i.domus {
        k.push(d.kernel);
        k.extend(d.ramdisk);
    }
    k
}

/// The invariants every plan must satisfy.
fn check_plan(i: &Inputs<'_>, p: &Plan) {
    let mut written: Vec<Region> = [Some(p.heap), Some(p.guest_ram), p.ram_disk].into_iter().flatten().collect();
    assert_eq!(p.domus.len(), i.domus.len());
    for (d, placed) in i.domus.iter().zip(&p.domus) {
        assert_eq!(placed.id, d.id);
        assert_eq!(placed.ram.size, d.memory.div_ceil(ALIGN) * ALIGN);
        assert_eq!(placed.disk.map_or(0, |x| x.size), d.disk_size.div_ceil(ALIGN) * ALIGN);
        written.push(placed.ram);
        written.extend(placed.disk);
    }
    for (n, w) in written.iter().enumerate() {
        assert_eq!(w.base % ALIGN, 0, "{w:x?} not aligned in {p:x?}");
        assert!(i.ram.iter().any(|b| b.base <= w.base && end(*w) <= end(*b)), "{w:x?} outside RAM in {p:x?}");
        for k in kept(i) {
            assert!(disjoint(*w, k), "{w:x?} overlaps kept {k:x?} in {p:x?} for {i:x?}");
        }
        for o in &written[n + 1..] {
            assert!(disjoint(*w, *o), "{w:x?} overlaps {o:x?}");
        }
    }
    assert!(p.heap.size >= i.heap_size);
    let g = p.guest_ram;
    let mut inside = Vec::from([p.kernel[0].dst, p.guest_dtb]);
    inside.extend(p.initrd.map(|c| c.dst));
    for (n, x) in inside.iter().enumerate() {
        assert!(g.base <= x.base && end(*x) <= end(g), "{x:x?} outside guest RAM {g:x?}");
        for o in &inside[n + 1..] {
            assert!(disjoint(*x, *o), "{x:x?} overlaps {o:x?} in guest RAM");
        }
    }
    assert_eq!(p.kernel[0].dst.base % ALIGN, 0);
    assert_eq!(p.kernel[0].src, i.kernel.module);
    assert!(p.kernel[0].dst.size >= i.kernel.image_size.max(i.kernel.module.size));
    assert_eq!(p.initrd.map(|c| c.src), i.initrd);
    assert_eq!(p.initrd.map(|c| c.dst.size), i.initrd.map(|r| r.size));
    if let Some(m) = i.dom0_mem {
        assert_eq!(g.size, m.div_ceil(ALIGN) * ALIGN);
    }
    assert_eq!(p.ram_disk.map_or(0, |d| d.size), i.ram_disk.div_ceil(ALIGN) * ALIGN);
}

fn plan_ok(i: &Inputs<'_>) -> Plan {
    let p = plan(i).unwrap_or_else(|e| panic!("{e}"));
    check_plan(i, &p);
    p
}

#[test]
fn qemu_documented_addresses_plan_the_heap_around_the_modules() {
    // QEMU's guest-loader documentation: kernel at 0x42000000, initrd at
    // 0x47000000 (an initrd that ends below QEMU's DTB at 0x48000000).
    let i = inputs(0x4200_0000, Some(r(0x4700_0000, 8 * MIB)));
    let p = plan_ok(&i);
    // A heap at the image end (a fixed layout) would cover the kernel.
    assert!(!disjoint(r(end(i.image), 48 * MIB), i.kernel.module));
    // The first 48 MiB gap: after the kernel file, before the initrd.
    assert_eq!(p.heap, r(0x43c0_0000, 48 * MIB));
    assert_eq!(p.guest_ram, r(0x6000_0000, 1024 * MIB));
    assert_eq!(p.kernel[0].dst.base, 0x6000_0000);
    assert_eq!(p.guest_dtb, r(0x9fe0_0000, 2 * MIB));
}

#[test]
fn qemu_dtb_inside_a_large_initrd_at_0x47000000_is_an_overlap() {
    // QEMU puts its DTB at RAM + 128 MiB whatever the guest-loader modules
    // are: an 83 MiB initrd at 0x47000000 has the DTB written over it.
    let i = inputs(0x4200_0000, Some(r(0x4700_0000, INITRD_FILE)));
    let e = plan(&i).unwrap_err();
    assert_eq!(
        e,
        LayoutError::Overlap { a: ("initrd", r(0x4700_0000, INITRD_FILE)), b: ("device tree", r(0x4800_0000, MIB)) }
    );
    assert_eq!(e.to_string(), "initrd [0x47000000, 0x4c2de600) overlaps device tree [0x48000000, 0x48100000)");
}

#[test]
fn modules_right_after_the_image() {
    let k = 0x4080_0000;
    let initrd = r((k + KERNEL_FILE).div_ceil(4096) * 4096, INITRD_FILE);
    let i = inputs(k, Some(initrd));
    let p = plan_ok(&i);
    // The heap skips the modules and the DTB.
    assert_eq!(p.heap, r(0x4820_0000, 48 * MIB));
}

#[test]
fn the_runners_default_layout_is_unchanged() {
    // `cargo xtask run`: modules from 0x50000000, guest RAM at the top.
    let i = inputs(0x5000_0000, Some(r(0x51c0_0000, INITRD_FILE)));
    let p = plan_ok(&i);
    assert_eq!(p.heap, r(0x4080_0000, 48 * MIB));
    assert_eq!(p.guest_ram, r(0x6000_0000, 1024 * MIB));
    let ram = [r(0x4000_0000, (1536 + 128) * MIB)];
    let i = Inputs { ram: &ram, ram_disk: 128 * MIB, ..i };
    let p = plan_ok(&i);
    assert_eq!(p.guest_ram, r(0x6800_0000, 1024 * MIB));
    assert_eq!(p.ram_disk, Some(r(0x6000_0000, 128 * MIB)));
}

#[test]
fn wrapping_ranges_are_errors() {
    let i = inputs(0x5000_0000, Some(r(0xffff_ffff_ffff_f000, 0x2000)));
    let e = plan(&i).unwrap_err();
    assert_eq!(e, LayoutError::Wraps { name: "initrd", base: 0xffff_ffff_ffff_f000, size: 0x2000 });
    assert_eq!(e.to_string(), "initrd at 0xfffffffffffff000 of size 0x2000 wraps past the end of the address space");
    let i = Inputs { kernel: Kernel { module: r(u64::MAX, 2), image_size: 0, fixed: None }, ..inputs(0, None) };
    assert!(matches!(plan(&i), Err(LayoutError::Wraps { name: "kernel", .. })));
    let reserved = [r(0x8000_0000, u64::MAX)];
    let i = Inputs { reserved: &reserved, ..inputs(0x5000_0000, None) };
    assert!(matches!(plan(&i), Err(LayoutError::Wraps { name: "reserved region", .. })));
    let ram = [r(0x4000_0000, u64::MAX - 0x1000)];
    let i = Inputs { ram: &ram, ..inputs(0x5000_0000, None) };
    assert!(matches!(plan(&i), Err(LayoutError::Wraps { name: "RAM", .. })));
}

#[test]
fn modules_outside_ram_are_errors() {
    let i = inputs(0x5000_0000, Some(r(0x2_0000_0000, INITRD_FILE)));
    let e = plan(&i).unwrap_err();
    assert_eq!(e, LayoutError::OutsideRam { name: "initrd", range: r(0x2_0000_0000, INITRD_FILE) });
    assert_eq!(e.to_string(), "initrd [0x200000000, 0x2052de600) is not inside RAM");
    // Straddling the end of RAM, or below it (a device window).
    let i = inputs(0xa000_0000 - MIB, None);
    assert!(matches!(plan(&i), Err(LayoutError::OutsideRam { name: "kernel", .. })));
    let i = inputs(0x0c00_0000, None);
    assert!(matches!(plan(&i), Err(LayoutError::OutsideRam { name: "kernel", .. })));
    // Empty modules say so.
    let i = inputs(0x5000_0000, Some(r(0x5800_0000, 0)));
    assert_eq!(plan(&i), Err(LayoutError::Empty { name: "initrd", base: 0x5800_0000 }));
}

#[test]
fn overlapping_kept_ranges_are_errors() {
    let i = inputs(0x5000_0000, Some(r(0x5100_0000, INITRD_FILE)));
    let e = plan(&i).unwrap_err();
    assert_eq!(
        e,
        LayoutError::Overlap { a: ("kernel", r(0x5000_0000, KERNEL_FILE)), b: ("initrd", r(0x5100_0000, INITRD_FILE)) }
    );
    assert_eq!(e.to_string(), "kernel [0x50000000, 0x51a09fc0) overlaps initrd [0x51000000, 0x562de600)");
    // A module in the image's BSS, which QEMU does not know about.
    let i = inputs(0x4030_0000, None);
    assert!(matches!(plan(&i), Err(LayoutError::Overlap { a: ("kernel", _), b: ("hypervisor image", _) })));
    // `check` (run before the kernel header is read) finds the same.
    assert!(matches!(check(&i), Err(LayoutError::Overlap { a: ("kernel", _), b: ("hypervisor image", _) })));
    let fine = Inputs { kernel: Kernel { module: r(0x5000_0000, KERNEL_FILE), image_size: 0, fixed: None }, ..i };
    assert_eq!(check(&fine), Ok(()));
    // The DTB over the image.
    let i = Inputs { dtb: r(0x4070_0000, MIB), ..inputs(0x5000_0000, None) };
    assert!(matches!(plan(&i), Err(LayoutError::Overlap { a: ("device tree", _), b: ("hypervisor image", _) })));
}

#[test]
fn reserved_memory_is_avoided_and_never_holds_a_module() {
    // Reserved right behind the image and at the top of RAM.
    let reserved = [r(0x4080_0000, 64 * MIB), r(0x9f00_0000, 16 * MIB), r(0x4800_0000, 4096)];
    let i = Inputs { reserved: &reserved, ..inputs(0x5000_0000, Some(r(0x51c0_0000, INITRD_FILE))) };
    let p = plan_ok(&i);
    assert_eq!(p.heap.base, 0x4480_0000);
    assert_eq!(p.guest_ram, r(0x5f00_0000, 1024 * MIB));
    // A module in reserved memory is an error; the DTB may be reserved
    // (the third entry above: firmware often reserves its DTB).
    let reserved = [r(0x5100_0000, MIB)];
    let i = Inputs { reserved: &reserved, ..inputs(0x5000_0000, None) };
    let e = plan(&i).unwrap_err();
    assert_eq!(e.to_string(), "kernel [0x50000000, 0x51a09fc0) overlaps reserved region [0x51000000, 0x51100000)");
}

#[test]
fn dom0_mem_larger_than_ram_is_an_error() {
    let i = Inputs { dom0_mem: Some(4096 * MIB), ..inputs(0x5000_0000, None) };
    let e = plan(&i).unwrap_err();
    assert_eq!(e, LayoutError::Dom0MemTooLarge { dom0_mem: 4096 * MIB, ram_disk: 0, ram: 1536 * MIB });
    assert_eq!(e.to_string(), "dom0_mem (4096 MiB) is larger than RAM (1536 MiB)");
    let i = Inputs { dom0_mem: Some(1500 * MIB), ram_disk: 128 * MIB, ..inputs(0x5000_0000, None) };
    assert_eq!(
        plan(&i).unwrap_err().to_string(),
        "dom0_mem (1500 MiB) plus the RAM disk (128 MiB) is larger than RAM (1536 MiB)"
    );
    // Smaller than RAM but larger than any free range.
    let i = Inputs { dom0_mem: Some(1400 * MIB), ..inputs(0x5000_0000, None) };
    let e = plan(&i).unwrap_err();
    assert!(matches!(e, LayoutError::NoRoom { what: "guest RAM (dom0_mem)", size, .. } if size == 1400 * MIB), "{e}");
    // Absurd values do not overflow.
    let i = Inputs { dom0_mem: Some(u64::MAX), ram_disk: u64::MAX, ..inputs(0x5000_0000, None) };
    assert!(matches!(plan(&i), Err(LayoutError::Dom0MemTooLarge { .. })));
}

#[test]
fn kernel_image_size_beyond_the_file_is_reserved_in_guest_ram() {
    let i = inputs(0x5000_0000, Some(r(0x51c0_0000, INITRD_FILE)));
    let p = plan_ok(&i);
    assert_eq!(p.kernel[0].src, r(0x5000_0000, KERNEL_FILE));
    assert_eq!(p.kernel[0].dst, r(0x6000_0000, KERNEL_IMAGE_SIZE));
    // BSS that crosses a 2 MiB boundary the file does not: the initrd goes
    // after image_size, not after the file (which ends below 0x61c00000).
    let big_bss = 0x1c0_1000;
    let i = Inputs { kernel: Kernel { module: r(0x5000_0000, KERNEL_FILE), image_size: big_bss, fixed: None }, ..i };
    let p = plan_ok(&i);
    assert_eq!(p.kernel[0].dst, r(0x6000_0000, big_bss));
    assert_eq!(p.initrd.unwrap().dst, r(0x61e0_0000, INITRD_FILE));
    // A header that claims less than the file reserves the file.
    let i = Inputs { kernel: Kernel { module: r(0x5000_0000, KERNEL_FILE), image_size: 4096, fixed: None }, ..i };
    assert_eq!(plan_ok(&i).kernel[0].dst.size, KERNEL_FILE);
}

#[test]
fn arm64_image_header() {
    let mut h = [0u8; 64];
    h[0x38..0x3c].copy_from_slice(b"ARM\x64");
    h[16..24].copy_from_slice(&KERNEL_IMAGE_SIZE.to_le_bytes());
    assert_eq!(arm64_image_size(&h, KERNEL_FILE), Ok(KERNEL_IMAGE_SIZE));
    // image_size 0 (kernels before 3.17) or below the file: the file.
    assert_eq!(arm64_image_size(&h, KERNEL_IMAGE_SIZE + 1), Ok(KERNEL_IMAGE_SIZE + 1));
    h[16..24].fill(0);
    assert_eq!(arm64_image_size(&h, KERNEL_FILE), Ok(KERNEL_FILE));
    assert!(matches!(arm64_image_size(&h, 10), Err(KernelError::Image(_))));
    assert!(matches!(arm64_image_size(&h[..32], KERNEL_FILE), Err(KernelError::Image(_))));
    h[0x38] = b'X';
    let e = arm64_image_size(&h, KERNEL_FILE).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the kernel module is not an arm64 Image: no arm64 Image magic (ARM\\x64 at offset 0x38)"
    );
}

#[test]
fn no_room_for_the_heap_or_the_modules() {
    // 128 MiB of RAM with 80 MiB of initrd: no 48 MiB gap for the heap.
    let ram = [r(0x4000_0000, 128 * MIB)];
    let i = Inputs { ram: &ram, dom0_mem: None, ..inputs(0x4080_0000, Some(r(0x4280_0000, 80 * MIB))) };
    let e = plan(&i).unwrap_err();
    assert!(matches!(e, LayoutError::NoRoom { what: "hypervisor heap", .. }), "{e}");
    assert!(e.to_string().starts_with("no free RAM range of 48 MiB for the hypervisor heap"), "{e}");
    // Guest RAM too small for the kernel, initrd and DTB.
    let i = Inputs { dom0_mem: Some(64 * MIB), ..inputs(0x5000_0000, Some(r(0x51c0_0000, INITRD_FILE))) };
    let e = plan(&i).unwrap_err();
    assert_eq!(
        e,
        LayoutError::ModulesDoNotFit { need: 28 * MIB + 84 * MIB + 2 * MIB, guest_ram: r(0x9c00_0000, 64 * MIB) }
    );
    // A header image_size near 2^64 does not overflow.
    let i =
        Inputs { kernel: Kernel { module: r(0x5000_0000, KERNEL_FILE), image_size: u64::MAX - 10, fixed: None }, ..i };
    assert!(matches!(plan(&i), Err(LayoutError::ModulesDoNotFit { .. })));
    // Below the minimum guest RAM.
    let i = Inputs { dom0_mem: Some(32 * MIB), ..inputs(0x5000_0000, None) };
    assert_eq!(plan(&i), Err(LayoutError::GuestTooSmall { size: 32 * MIB }));
}

#[test]
fn without_dom0_mem_the_guest_gets_the_largest_range_above_keep_low() {
    let ram = [r(0x4000_0000, 2048 * MIB)];
    let i = Inputs {
        ram: &ram,
        dom0_mem: None,
        ram_disk: 128 * MIB,
        ..inputs(0x5000_0000, Some(r(0x51c0_0000, INITRD_FILE)))
    };
    let p = plan_ok(&i);
    assert_eq!(p.guest_ram, r(0x6800_0000, 2048 * MIB - 512 * MIB - 128 * MIB));
    assert_eq!(p.ram_disk, Some(r(0x6000_0000, 128 * MIB)));
    // Modules above keep_low push the guest above them.
    let i = Inputs {
        kernel: Kernel { module: r(0x7000_0000, KERNEL_FILE), image_size: KERNEL_IMAGE_SIZE, fixed: None },
        initrd: None,
        ram_disk: 0,
        ..i
    };
    let p = plan_ok(&i);
    assert_eq!(p.guest_ram, r(0x71c0_0000, 0xc000_0000 - 0x71c0_0000));
}

#[test]
fn passthrough_devices_must_not_touch_ram_or_the_hypervisor() {
    let uart = ("hypervisor UART", r(0x0900_0000, 0x1000));
    let slots = [r(0x0a00_3e00, 0x200), r(0x0a00_0000, 0x200)];
    assert_eq!(check_passthrough(&RAM, &[uart], &slots), Ok(()));
    let e = check_passthrough(&RAM, &[uart], &[r(0x5000_0100, 0x200)]).unwrap_err();
    assert_eq!(e.to_string(), "passthrough device [0x50000000, 0x50001000) overlaps RAM [0x40000000, 0xa0000000)");
    let e = check_passthrough(&RAM, &[uart], &[r(0x0900_0800, 0x200)]).unwrap_err();
    assert_eq!(e, LayoutError::Overlap { a: ("passthrough device", r(0x0900_0000, 0x1000)), b: uart });
    assert!(matches!(check_passthrough(&RAM, &[], &[r(u64::MAX - 0x100, 0x200)]), Err(LayoutError::Wraps { .. })));
    assert!(matches!(check_passthrough(&RAM, &[], &[r(u64::MAX - 0x100, 0x100)]), Err(LayoutError::Wraps { .. })));
}

/// QEMU virt's PCIe bridge, as passed through: ECAM and the two windows
/// below 4 GiB are clear of RAM, the GIC and the UART; the same frames
/// moved onto RAM or the GIC are refused.
#[test]
fn pcie_bridge_frames_are_checked_like_devices() {
    let (plat, _) = crate::dtb::discover(include_bytes!("../dtb/testdata/qemu-virt-gicv3-smp2.dtb")).unwrap();
    let frames = plat.pcie[0].passthrough_frames(crate::stage2::IpaSize::DEFAULT.limit());
    assert_eq!(frames, [r(0x40_1000_0000, 0x1000_0000), r(0x3eff_0000, 0x1_0000), r(0x1000_0000, 0x2eff_0000)]);
    let hyp = [
        ("GIC distributor", plat.gic.gicd),
        ("GIC redistributors", plat.gic.gicr[0]),
        ("hypervisor UART", r(0x0900_0000, 0x1000)),
    ];
    assert_eq!(check_passthrough(&plat.memory, &hyp, &frames), Ok(()));
    let e = check_passthrough(&plat.memory, &hyp, &[r(0x3fff_0000, 0x2_0000)]).unwrap_err();
    assert!(matches!(e, LayoutError::Overlap { b: ("RAM", _), .. }), "{e}");
    let e = check_passthrough(&plat.memory, &hyp, &[r(0x0800_0000, 0x1000_0000)]).unwrap_err();
    assert!(matches!(e, LayoutError::Overlap { b: ("GIC distributor", _), .. }), "{e}");
    // A larger IPA space keeps the 64-bit window.
    assert_eq!(plat.pcie[0].passthrough_frames(1 << 40).len(), 4);
}

/// A random page-aligned region inside `within`, at most `max` long.
fn region_in(rng: &mut Rng, within: Region, max: u64) -> Region {
    let size = 4096 * (1 + rng.below(max / 4096));
    let base = within.base + 4096 * rng.below(within.size / 4096);
    r(base, size)
}

#[test]
fn random_layouts_plan_disjointly_or_fail_with_one_line() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let (mut ok, mut failed) = (0, 0);
    for _ in 0..20_000 {
        let mut ram = Vec::from([r(0x4000_0000, MIB * (128 + rng.below(3000)))]);
        if rng.below(3) == 0 {
            ram.push(r(0x1_0000_0000 + MIB * rng.below(4096), MIB * (64 + rng.below(2048))));
        }
        let anywhere = r(0x3000_0000, 0x1_0000_0000);
        let pick = |rng: &mut Rng, max: u64| {
            if rng.below(8) == 0 {
                region_in(rng, anywhere, max)
            } else {
                let bank = ram[rng.below(ram.len() as u64) as usize];
                region_in(rng, bank, max)
            }
        };
        let dtb = pick(&mut rng, 2 * MIB);
        let module = pick(&mut rng, 64 * MIB);
        let initrd = (rng.below(4) != 0).then(|| pick(&mut rng, 128 * MIB));
        let reserved: Vec<Region> = (0..rng.below(4)).map(|_| pick(&mut rng, 32 * MIB)).collect();
        let mut domus: Vec<VmSpec> = Vec::new();
        for id in 1..=rng.below(4) as u16 {
            // Sometimes the same kernel file as the DomU before.
            let kernel = match domus.last() {
                Some(prev) if rng.below(2) == 0 => prev.kernel,
                _ => pick(&mut rng, 32 * MIB),
            };
            let ramdisk = (rng.below(2) == 0).then(|| pick(&mut rng, 64 * MIB));
            domus.push(domu(id, MIB * (1 + rng.below(512)), kernel, ramdisk, MIB * rng.below(3) * 16));
        }
        let i = Inputs {
            ram: &ram,
            image: r(0x4020_0000, 2 * MIB * (1 + rng.below(4))),
            dtb,
            reserved: &reserved,
            kernel: Kernel { module, image_size: module.size + 4096 * rng.below(2048), fixed: None },
            initrd,
            dom0_mem: (rng.below(3) != 0).then(|| MIB * (32 + rng.below(4096))),
            ram_disk: if rng.below(3) == 0 { MIB * (1 + rng.below(512)) } else { 0 },
            heap_size: 48 * MIB,
            keep_low: 512 * MIB,
            domus: &domus,
            domu_pool: 0,
        };
        match plan(&i) {
            Ok(p) => {
                check_plan(&i, &p);
                ok += 1;
            }
            Err(e) => {
                let line = format!("{e}");
                assert!(!line.is_empty() && !line.contains('\n'), "{line:?}");
                failed += 1;
            }
        }
    }
    // Both outcomes are exercised.
    assert!(ok > 1000 && failed > 1000, "ok {ok}, failed {failed}");
}

/// A DomU as the parser would describe it.
fn domu(id: u16, memory: u64, kernel: Region, ramdisk: Option<Region>, disk_size: u64) -> VmSpec {
    VmSpec {
        id,
        name: format!("domU{id}"),
        memory,
        vcpus: 1,
        vpl011: true,
        kernel,
        ramdisk,
        bootargs: "console=ttyAMA0".to_string(),
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

/// QEMU virt as `cargo xtask run --domu 2` makes it: 1 GiB for Dom0, 512
/// MiB kept low, 2 × (256 MiB RAM + 64 MiB disk) and 128 MiB of DomU
/// modules at the top, shared by both DomUs.
const DOMU_RAM: [Region; 1] = [Region { base: 0x4000_0000, size: (1024 + 512 + 2 * 320 + 128) * MIB }];

fn domu_inputs(domus: &[VmSpec]) -> Inputs<'_> {
    Inputs { ram: &DOMU_RAM, domus, ..inputs(0x5000_0000, Some(r(0x51c0_0000, INITRD_FILE))) }
}

#[test]
fn domus_are_placed_at_the_top_and_dom0_below_them() {
    let top = end(DOMU_RAM[0]);
    let kernel = r(top - 128 * MIB, KERNEL_FILE);
    let initrd = r(top - 96 * MIB, INITRD_FILE);
    let d = [domu(1, 256 * MIB, kernel, Some(initrd), 64 * MIB), domu(2, 256 * MIB, kernel, Some(initrd), 64 * MIB)];
    let i = domu_inputs(&d);
    let p = plan_ok(&i);
    // Below the modules: d1's RAM, its disk, d2's RAM, its disk, then Dom0.
    let below = top - 128 * MIB;
    assert_eq!(
        p.domus,
        [
            DomuPlacement { id: 1, ram: r(below - 256 * MIB, 256 * MIB), disk: Some(r(below - 320 * MIB, 64 * MIB)) },
            DomuPlacement { id: 2, ram: r(below - 576 * MIB, 256 * MIB), disk: Some(r(below - 640 * MIB, 64 * MIB)) },
        ]
    );
    assert_eq!(p.guest_ram, r(below - 640 * MIB - 1024 * MIB, 1024 * MIB));
    // Without dom0_mem Dom0 takes the largest range left: everything
    // between the low 512 MiB and the DomUs.
    let p = plan_ok(&Inputs { dom0_mem: None, ..i });
    assert_eq!(p.guest_ram, r(0x6000_0000, below - 640 * MIB - 0x6000_0000));
    // No disk: only RAM.
    let d = [domu(1, 100 * MIB + 1, kernel, None, 0)];
    let p = plan_ok(&domu_inputs(&d));
    assert_eq!(p.domus, [DomuPlacement { id: 1, ram: r(below - 102 * MIB, 102 * MIB), disk: None }]);
    assert_eq!(p.domu_pool, None);
}

#[test]
fn the_domu_pool_sits_below_the_domus_and_dom0_below_it() {
    let top = end(DOMU_RAM[0]);
    let kernel = r(top - 128 * MIB, KERNEL_FILE);
    let d = [domu(1, 256 * MIB, kernel, None, 0)];
    let p = plan_ok(&Inputs { domu_pool: 300 * MIB, ..domu_inputs(&d) });
    let below = top - 128 * MIB - 256 * MIB;
    assert_eq!(p.domu_pool, Some(r(below - 300 * MIB, 300 * MIB)));
    assert_eq!(p.guest_ram, r(below - 300 * MIB - 1024 * MIB, 1024 * MIB));
    // A pool the RAM cannot hold is an error that names it.
    let e = plan(&Inputs { domu_pool: 1 << 40, ..domu_inputs(&d) }).unwrap_err();
    assert!(e.to_string().contains("DomU pool (domu_pool)"), "{e}");
}

#[test]
fn impossible_domus_are_errors_naming_the_domain() {
    let top = end(DOMU_RAM[0]);
    let kernel = r(top - 128 * MIB, KERNEL_FILE);
    let initrd = r(top - 96 * MIB, INITRD_FILE);
    let ok = domu(1, 256 * MIB, kernel, Some(initrd), 64 * MIB);
    let err = |d: &[VmSpec]| plan(&domu_inputs(d)).unwrap_err();
    // Too much memory for the second DomU.
    let e = err(&[ok.clone(), domu(2, 4096 * MIB, kernel, None, 0)]);
    assert!(matches!(e, LayoutError::DomuNoRoom { id: 2, what: "RAM", size, .. } if size == 4096 * MIB), "{e:?}");
    assert!(e.to_string().starts_with("no free RAM range of 4096 MiB for DomU d2's RAM (largest free range: "), "{e}");
    // A disk that does not fit.
    let e = err(&[domu(1, 256 * MIB, kernel, None, 8192 * MIB)]);
    assert!(matches!(e, LayoutError::DomuNoRoom { id: 1, what: "disk", .. }), "{e:?}");
    // DomUs that fit alone but leave Dom0's 1 GiB no room.
    let e = err(&[ok.clone(), domu(2, 700 * MIB, kernel, None, 0)]);
    assert!(matches!(e, LayoutError::NoRoom { what: "guest RAM (dom0_mem)", .. }), "{e:?}");
    // Modules outside RAM.
    let e = err(&[domu(1, 256 * MIB, r(top, MIB), None, 0)]);
    assert_eq!(e, LayoutError::DomuOutsideRam { id: 1, what: "kernel", range: r(top, MIB) });
    assert_eq!(e.to_string(), format!("DomU d1's kernel module [{top:#x}, {:#x}) is not inside RAM", top + MIB));
    let e = err(&[domu(1, 256 * MIB, kernel, Some(r(top - MIB, 2 * MIB)), 0)]);
    assert!(matches!(e, LayoutError::DomuOutsideRam { id: 1, what: "ramdisk", .. }), "{e:?}");
    // A DomU module over Dom0's kernel, the image, the DTB, another DomU's.
    let dom0_kernel = r(0x5000_0000, KERNEL_FILE);
    let e = err(&[domu(1, 256 * MIB, r(0x5010_0000, MIB), None, 0)]);
    assert_eq!(
        e,
        LayoutError::DomuOverlap {
            a: Kept { domain: None, name: "kernel", range: dom0_kernel },
            b: Kept { domain: Some(1), name: "kernel", range: r(0x5010_0000, MIB) },
        }
    );
    assert_eq!(
        e.to_string(),
        format!("kernel [0x50000000, {:#x}) overlaps DomU d1's kernel [0x50100000, 0x50200000)", end(dom0_kernel))
    );
    let e = err(&[domu(1, 256 * MIB, r(0x4030_0000, MIB), None, 0)]);
    assert!(matches!(e, LayoutError::DomuOverlap { a: Kept { name: "hypervisor image", .. }, .. }), "{e:?}");
    let e = err(&[domu(1, 256 * MIB, r(0x4800_0000, MIB), None, 0)]);
    assert!(matches!(e, LayoutError::DomuOverlap { a: Kept { name: "device tree", .. }, .. }), "{e:?}");
    // Two DomUs may share a file exactly, not partly, and not across kinds.
    let e = err(&[ok.clone(), domu(2, 256 * MIB, r(kernel.base + MIB, MIB), None, 0)]);
    assert!(
        matches!(e, LayoutError::DomuOverlap { a: Kept { domain: Some(1), .. }, b: Kept { domain: Some(2), .. } }),
        "{e:?}"
    );
    let e = err(&[ok.clone(), domu(2, 256 * MIB, initrd, Some(kernel), 0)]);
    assert!(matches!(e, LayoutError::DomuOverlap { .. }), "{e:?}");
    // Reserved memory under a DomU module.
    let reserved = [r(top - 110 * MIB, MIB)];
    let d = [ok.clone()];
    let e = plan(&Inputs { reserved: &reserved, ..domu_inputs(&d) }).unwrap_err();
    assert!(matches!(e, LayoutError::DomuOverlap { b: Kept { name: "reserved region", .. }, .. }), "{e:?}");
    // Memory too small for its own kernel, initrd and DTB.
    let e = err(&[domu(1, 64 * MIB, kernel, Some(initrd), 0)]);
    assert_eq!(e, LayoutError::DomuModulesDoNotFit { id: 1, need: (28 + 84 + 2) * MIB, memory: 64 * MIB });
    assert_eq!(e.to_string(), "DomU d1's kernel, initrd and DTB need 114 MiB but its memory is 64 MiB");
    // Memory of u64::MAX: no room, no overflow.
    let e = err(&[domu(1, u64::MAX, kernel, None, 0)]);
    assert!(matches!(e, LayoutError::DomuNoRoom { id: 1, what: "RAM", .. }), "{e:?}");
}

// ---- Kernel formats: ELF, raw binary at a load address, Image ----

use super::elf::{ElfError, EM_AARCH64, ET_EXEC, PF_X, PT_LOAD};
use super::image::{read_kernel, FixedLoad, KernelLoad, Piece};

/// One program header for [`elf_file`]: type, flags, offset, vaddr,
/// paddr, filesz, memsz.
#[derive(Clone, Copy)]
struct Ph(u32, u32, u64, u64, u64, u64, u64);

/// An ELF64 little-endian AArch64 executable with `phs`, entry `entry`,
/// `len` bytes long (at least the headers; file bytes are 0xAA).
fn elf_file(phs: &[Ph], entry: u64, len: usize) -> Vec<u8> {
    let mut f = alloc::vec![0xAAu8; len.max(64 + 56 * phs.len())];
    f[..64].fill(0);
    f[0..4].copy_from_slice(b"\x7fELF");
    f[4] = 2;
    f[5] = 1;
    f[6] = 1;
    f[16..18].copy_from_slice(&ET_EXEC.to_le_bytes());
    f[18..20].copy_from_slice(&EM_AARCH64.to_le_bytes());
    f[24..32].copy_from_slice(&entry.to_le_bytes());
    f[32..40].copy_from_slice(&64u64.to_le_bytes());
    f[52..54].copy_from_slice(&64u16.to_le_bytes());
    f[54..56].copy_from_slice(&56u16.to_le_bytes());
    f[56..58].copy_from_slice(&(phs.len() as u16).to_le_bytes());
    for (i, p) in phs.iter().enumerate() {
        let o = 64 + 56 * i;
        f[o..o + 56].fill(0);
        f[o..o + 4].copy_from_slice(&p.0.to_le_bytes());
        f[o + 4..o + 8].copy_from_slice(&p.1.to_le_bytes());
        for (k, v) in [p.2, p.3, p.4, p.5, p.6].into_iter().enumerate() {
            f[o + 8 + 8 * k..o + 16 + 8 * k].copy_from_slice(&v.to_le_bytes());
        }
    }
    f
}

const RX: u32 = PF_X | 4;
const RW: u32 = 6;

/// A kernel like a bare-metal guest linked at 0x6000_0000: text, then data
/// with BSS.
fn good_elf() -> Vec<u8> {
    elf_file(
        &[
            Ph(PT_LOAD, RX, 0x1000, 0x6000_0000, 0x6000_0000, 0x3000, 0x3000),
            Ph(6, 4, 64, 0, 0, 112, 112), // PT_PHDR: not loaded
            Ph(PT_LOAD, RW, 0x4000, 0x6001_0000, 0x6001_0000, 0x800, 0x2_0000),
        ],
        0x6000_0010,
        0x5000,
    )
}

fn elf_err(f: &[u8]) -> ElfError {
    match read_kernel(f, None) {
        Err(KernelError::Elf(e)) => e,
        other => panic!("want an ELF error, got {other:x?}"),
    }
}

#[test]
fn elf_kernel_loads_its_pt_load_segments_at_paddr() {
    let KernelLoad::Fixed(f) = read_kernel(&good_elf(), None).unwrap() else { panic!("not fixed") };
    assert_eq!(f.entry, 0x6000_0010);
    assert_eq!(
        f.pieces,
        [
            Piece { offset: 0x1000, size: 0x3000, at: r(0x6000_0000, 0x3000) },
            Piece { offset: 0x4000, size: 0x800, at: r(0x6001_0000, 0x2_0000) },
        ]
    );
    // Linked at a virtual address, loaded at a physical one (Linux's
    // vmlinux, a linker script's AT()): the entry goes through its segment.
    let f = elf_file(
        &[Ph(PT_LOAD, RX, 0x1000, 0xffff_8000_1000_0000, 0x4020_0000, 0x100, 0x100)],
        0xffff_8000_1000_0040,
        0x1100,
    );
    let KernelLoad::Fixed(f) = read_kernel(&f, None).unwrap() else { panic!("not fixed") };
    assert_eq!(f.entry, 0x4020_0040);
    assert_eq!(f.pieces[0].at, r(0x4020_0000, 0x100));
}

#[test]
fn bad_elf_kernels_are_one_clear_error_each() {
    let good = good_elf();
    let with = |o: usize, bytes: &[u8]| {
        let mut f = good.clone();
        f[o..o + bytes.len()].copy_from_slice(bytes);
        f
    };
    assert_eq!(elf_err(&good[..40]), ElfError::TruncatedHeader { len: 40 });
    assert_eq!(elf_err(&with(4, &[1])), ElfError::NotElf64 { class: 1 });
    assert_eq!(elf_err(&with(5, &[2])), ElfError::NotLittleEndian { data: 2 });
    assert_eq!(elf_err(&with(18, &62u16.to_le_bytes())), ElfError::WrongMachine { machine: 62 });
    assert_eq!(elf_err(&with(16, &3u16.to_le_bytes())), ElfError::NotExecutable { e_type: 3 });
    assert_eq!(elf_err(&with(54, &32u16.to_le_bytes())), ElfError::BadProgramHeaders { phentsize: 32, phnum: 3 });
    // The program headers run past the end of the file.
    assert_eq!(elf_err(&good[..200]), ElfError::TruncatedProgramHeaders { phoff: 64, phnum: 3, len: 200 });
    // A segment's file bytes run past the module.
    assert_eq!(
        elf_err(&good[..0x4400]),
        ElfError::SegmentPastFile { index: 2, offset: 0x4000, filesz: 0x800, len: 0x4400 }
    );
    let one = |ph: Ph, entry: u64| elf_err(&elf_file(&[ph], entry, 0x2000));
    assert_eq!(
        one(Ph(PT_LOAD, RX, 0x1000, 0x4000_0000, 0x4000_0000, 0x200, 0x100), 0x4000_0000),
        ElfError::FileSizeAboveMemSize { index: 0, filesz: 0x200, memsz: 0x100 }
    );
    assert_eq!(
        one(Ph(PT_LOAD, RX, 0x1000, 0, u64::MAX - 0xff, 0x100, 0x200), 0),
        ElfError::SegmentWraps { index: 0, paddr: u64::MAX - 0xff, memsz: 0x200 }
    );
    // No PT_LOAD (or only empty ones).
    assert_eq!(one(Ph(6, 4, 64, 0, 0, 56, 56), 0), ElfError::NoLoadSegment);
    assert_eq!(one(Ph(PT_LOAD, RX, 0x1000, 0x4000_0000, 0x4000_0000, 0, 0), 0x4000_0000), ElfError::NoLoadSegment);
    assert_eq!(elf_err(&elf_file(&[], 0, 0x100)), ElfError::NoLoadSegment);
    // Entry outside, or only in a segment that is not executable.
    assert_eq!(
        one(Ph(PT_LOAD, RX, 0x1000, 0x4000_0000, 0x4000_0000, 0x100, 0x100), 0x4000_0100),
        ElfError::EntryOutside { entry: 0x4000_0100 }
    );
    assert_eq!(
        one(Ph(PT_LOAD, RW, 0x1000, 0x4000_0000, 0x4000_0000, 0x100, 0x100), 0x4000_0000),
        ElfError::EntryOutside { entry: 0x4000_0000 }
    );
    // Two segments sharing physical bytes (BSS reaching into the next).
    let f = elf_file(
        &[
            Ph(PT_LOAD, RX, 0x1000, 0x4000_0000, 0x4000_0000, 0x100, 0x2000),
            Ph(PT_LOAD, RW, 0x1100, 0x4000_1000, 0x4000_1000, 0x100, 0x100),
        ],
        0x4000_0000,
        0x2000,
    );
    assert_eq!(elf_err(&f), ElfError::SegmentsOverlap { a: 0, b: 1 });
    // Each is one line naming the defect.
    let e = KernelError::Elf(ElfError::WrongMachine { machine: 62 }).to_string();
    assert_eq!(e, "the ELF kernel cannot be loaded: ELF machine 62, not AArch64 (183)");
}

#[test]
fn kernel_format_is_chosen_by_load_address_then_magic() {
    // Neither magic, no load address: refused, saying how to boot a raw binary.
    let e = read_kernel(&[0u8; 4096], None).unwrap_err();
    assert_eq!(e, KernelError::UnknownFormat);
    assert!(e.to_string().contains("dom0_kernel_load_addr="), "{e}");
    assert!(matches!(read_kernel(&[0u8; 10], None), Err(KernelError::Image(_))));
    // An Image.
    let mut h = [0u8; 4096];
    h[0x38..0x3c].copy_from_slice(b"ARM\x64");
    h[16..24].copy_from_slice(&(2 * MIB).to_le_bytes());
    assert_eq!(read_kernel(&h, None), Ok(KernelLoad::Image { size: 2 * MIB }));
    // A load address makes any file a raw binary, entered at its first byte.
    let raw = read_kernel(&h, Some(0x6000_0000)).unwrap();
    let want = FixedLoad {
        pieces: Vec::from([Piece { offset: 0, size: 4096, at: r(0x6000_0000, 4096) }]),
        entry: 0x6000_0000,
    };
    assert_eq!(raw, KernelLoad::Fixed(want));
    assert_eq!(
        read_kernel(&good_elf(), Some(0x6000_0000)).map(|k| matches!(k, KernelLoad::Fixed(f) if f.pieces.len() == 1)),
        Ok(true)
    );
    assert_eq!(read_kernel(&h, Some(0x6000_0800)), Err(KernelError::RawUnaligned { addr: 0x6000_0800 }));
    assert_eq!(read_kernel(&h, Some(!0xfff_u64)), Err(KernelError::RawWraps { addr: !0xfff_u64, size: 4096 }));
}

/// [`inputs`] with a fixed-address kernel instead of the Image.
fn fixed_inputs(load: &FixedLoad) -> Inputs<'_> {
    Inputs { kernel: Kernel { module: r(0x5000_0000, 0x10_0000), image_size: 0, fixed: Some(load) }, ..inputs(0, None) }
}

fn fixed(pieces: &[(u64, u64)], entry: u64) -> FixedLoad {
    let pieces =
        pieces.iter().map(|&(base, size)| Piece { offset: 0, size: size.min(0x1000), at: r(base, size) }).collect();
    FixedLoad { pieces, entry }
}

#[test]
fn dom0_ram_covers_a_fixed_address_kernel_and_the_dtb_and_initrd_avoid_it() {
    // The ELF above, in RAM above the module at 0x50000000: Dom0's 1 GiB
    // starts at its 2 MiB-aligned base, the pieces are copied from the
    // module, the entry is the ELF's.
    let KernelLoad::Fixed(load) = read_kernel(&good_elf(), None).unwrap() else { panic!() };
    let i = Inputs { initrd: Some(r(0x4a00_0000, 8 * MIB)), ..fixed_inputs(&load) };
    let p = plan(&i).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.guest_ram, r(0x6000_0000, 1024 * MIB));
    assert_eq!(p.entry, 0x6000_0010);
    assert_eq!(
        p.kernel,
        [
            ModuleCopy { src: r(0x5000_1000, 0x3000), dst: r(0x6000_0000, 0x3000) },
            ModuleCopy { src: r(0x5000_4000, 0x800), dst: r(0x6001_0000, 0x2_0000) },
        ]
    );
    assert_eq!(p.initrd.map(|c| c.dst), Some(r(0x6020_0000, 8 * MIB)));
    assert_eq!(p.guest_dtb, r(0x9fe0_0000, 2 * MIB));
    // The heap stays out of the kernel's span.
    assert!(disjoint(p.heap, r(0x6000_0000, 2 * MIB)));

    // A kernel at the top of RAM: Dom0's RAM ends with it, the DTB goes
    // below it, the initrd at the bottom.
    let top = fixed(&[(0x9fdf_f000, 0x1000), (0x9fe0_0000, 2 * MIB)], 0x9fe0_0000);
    let i = Inputs { initrd: Some(r(0x4a00_0000, 8 * MIB)), dom0_mem: Some(256 * MIB), ..fixed_inputs(&top) };
    let p = plan(&i).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.guest_ram, r(0x9000_0000, 256 * MIB));
    assert_eq!(p.guest_dtb, r(0x9fa0_0000, 2 * MIB));
    assert_eq!(p.initrd.map(|c| c.dst), Some(r(0x9000_0000, 8 * MIB)));
    assert_eq!(p.entry, 0x9fe0_0000);

    // Without dom0_mem: the whole free range that holds the kernel.
    let i = Inputs { dom0_mem: None, ..fixed_inputs(&load) };
    let p = plan(&i).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.guest_ram, r(0x5020_0000, 0xa000_0000 - 0x5020_0000));
}

#[test]
fn fixed_address_kernels_outside_ram_or_over_kept_ranges_are_errors() {
    let at = |base, size| fixed(&[(base, size)], base);
    let e = |l: &FixedLoad| plan(&fixed_inputs(l)).unwrap_err();
    // Outside RAM.
    let l = at(0x3000_0000, 0x1000);
    assert_eq!(e(&l), LayoutError::OutsideRam { name: "kernel load range", range: r(0x3000_0000, 0x1000) });
    let l = at(0x9fff_f000, 0x2000);
    assert!(matches!(e(&l), LayoutError::OutsideRam { .. }));
    // Over the hypervisor, the boot DTB, its own module.
    let l = at(0x4030_0000, 0x1000);
    assert_eq!(
        e(&l),
        LayoutError::Overlap {
            a: ("kernel load range", r(0x4030_0000, 0x1000)),
            b: ("hypervisor image", r(0x4020_0000, 6 * MIB))
        }
    );
    let l = at(0x4800_0000, 0x1000);
    assert!(matches!(e(&l), LayoutError::Overlap { b: ("device tree", _), .. }), "{}", e(&l));
    let l = at(0x5000_0000, 0x1000);
    assert!(matches!(e(&l), LayoutError::Overlap { b: ("kernel", _), .. }));
    // Clear of everything, but its 2 MiB block shares the module's.
    let l = at(0x5010_0000, 0x1000);
    assert_eq!(e(&l), LayoutError::KernelSpanNotFree { span: r(0x5000_0000, 2 * MIB) });
    // dom0_mem cannot cover it, or is smaller than it.
    let l = fixed(&[(0x6000_0000, 0x1000), (0x9000_0000, 0x1000)], 0x6000_0000);
    let i = Inputs { dom0_mem: Some(256 * MIB), ..fixed_inputs(&l) };
    assert_eq!(
        plan(&i).unwrap_err(),
        LayoutError::KernelSpanVsDom0Mem { span: r(0x6000_0000, 0x3020_0000), dom0_mem: 256 * MIB }
    );
    // A kernel filling guest RAM leaves no room for the DTB.
    let l = at(0x6000_0000, 64 * MIB);
    let i = Inputs { dom0_mem: Some(64 * MIB), ..fixed_inputs(&l) };
    assert!(matches!(plan(&i).unwrap_err(), LayoutError::ModulesDoNotFit { .. }));
    assert!(plan(&fixed_inputs(&l)).is_ok());
}

#[test]
fn place_modules_puts_the_dtb_and_initrd_around_the_kernel() {
    let ram = r(0x4000_0000, 64 * MIB);
    // An Image at the base: initrd above it, DTB at the top.
    let (i, d) = place_modules(ram, &[r(0x4000_0000, 3 * MIB)], Some(5 * MIB)).unwrap();
    assert_eq!((i, d), (Some(r(0x4040_0000, 5 * MIB)), r(0x43e0_0000, 2 * MIB)));
    // A kernel in the top 2 MiB and one in the middle: the DTB below the
    // top one, the initrd skips the middle one.
    let k = [r(0x43f0_0000, 0x1000), r(0x4008_0000, 0x1000)];
    let (i, d) = place_modules(ram, &k, Some(MIB)).unwrap();
    assert_eq!((i, d), (Some(r(0x4020_0000, MIB)), r(0x43c0_0000, 2 * MIB)));
    // No slot for the initrd, or none for the DTB.
    assert_eq!(place_modules(ram, &[r(0x4000_0000, 60 * MIB)], Some(3 * MIB)), None);
    assert_eq!(place_modules(ram, &[r(0x4000_0000, 64 * MIB)], None), None);
    assert_eq!(place_modules(ram, &[r(0x4000_0000, 62 * MIB)], None), Some((None, r(0x43e0_0000, 2 * MIB))));
}

#[test]
fn without_dom0_mem_a_fixed_address_kernels_range_shares_room_with_the_ram_disk() {
    let load = fixed(&[(0x6000_0000, 0x1000)], 0x6000_0000);
    // The disk fits below the kernel module: Dom0 gets the whole range.
    let i = Inputs { dom0_mem: None, ram_disk: 64 * MIB, ..fixed_inputs(&load) };
    let p = plan(&i).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.guest_ram, r(0x5020_0000, 0xa000_0000 - 0x5020_0000));
    assert_eq!(p.ram_disk, Some(r(0x4c00_0000, 64 * MIB)));
    // It fits nowhere else: it comes off the top of Dom0's range.
    let i = Inputs { dom0_mem: None, ram_disk: 128 * MIB, ..fixed_inputs(&load) };
    let p = plan(&i).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.guest_ram, r(0x5020_0000, 0x9800_0000 - 0x5020_0000));
    assert_eq!(p.ram_disk, Some(r(0x9800_0000, 128 * MIB)));
    // Not even there, past the kernel: no room.
    let top = fixed(&[(0x9ff0_0000, 0x1000)], 0x9ff0_0000);
    let i = Inputs { dom0_mem: None, ram_disk: 128 * MIB, ..fixed_inputs(&top) };
    assert!(matches!(plan(&i).unwrap_err(), LayoutError::NoRoom { what: "RAM disk (dom0_disk_size)", .. }));
}

/// Corrupted and truncated ELF files never make the parser read outside
/// the file or panic, and whatever it accepts keeps its contract: pieces
/// inside the file, no two overlapping, the entry inside an executable one.
#[test]
fn corrupted_elf_files_are_refused_or_loadable() {
    let good = good_elf();
    let mut rng = Rng(0x0e1f_0e1f_5eed_0001);
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..20_000 {
        let mut f = good.clone();
        // Corrupt a few bytes of the headers (where the parser looks).
        for _ in 0..1 + rng.below(4) {
            let at = rng.index(64 + 56 * 3);
            f[at] = rng.next() as u8;
        }
        if rng.below(4) == 0 {
            f.truncate(rng.index(f.len() + 1));
        }
        match read_kernel(&f, None) {
            Ok(KernelLoad::Fixed(l)) => {
                ok += 1;
                for (n, p) in l.pieces.iter().enumerate() {
                    assert!(p.offset + p.size <= f.len() as u64 && p.size <= p.at.size);
                    assert!(l.pieces[n + 1..].iter().all(|q| disjoint(p.at, q.at)));
                }
                assert!(l.pieces.iter().any(|p| p.at.base <= l.entry && l.entry < end(p.at)));
            }
            Ok(KernelLoad::Image { .. }) => panic!("an ELF read as an Image"),
            Err(_) => refused += 1,
        }
    }
    assert!(ok > 100 && refused > 1000, "ok {ok}, refused {refused}");
}
