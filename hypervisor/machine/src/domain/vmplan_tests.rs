//! Host tests of the VM planner (`domain::vmplan`) on QEMU virt's real DTBs
//! (`dtb/testdata/`): Dom0 in every `dom0_disk` mode, an ACPI Dom0, several
//! DomUs, and requests that cannot be met.

use super::layout::{selftest_carve, selftest_specs, DOMU_RAM_BASE, DOMU_UART, DOMU_VIRTIO};
use super::vmplan::*;
use crate::boot::image::KernelLoad;
use crate::boot::plan::{ModuleCopy, Plan, GUEST_DTB_SIZE};
use crate::config::Config;
use crate::dtb::{self, BootInfo, BootModule, Machine, MmioDevice};
use crate::intid::IntId;
use crate::iomem::IoMemDecision;
use crate::irq::{Route, RouteError};
use crate::mmio_bus::Device;
use crate::region::Region;
use crate::stage2::MemType;
use alloc::string::String;
use alloc::vec::Vec;

const V3_SMP2: &[u8] = include_bytes!("../dtb/testdata/qemu-virt-gicv3-smp2.dtb");
const V4_SMP4: &[u8] = include_bytes!("../dtb/testdata/qemu-virt-gicv4-smp4.dtb");
const MIB: u64 = 1 << 20;
/// The last virtio-mmio slot of QEMU virt (SPI 47, INTID 79).
const SLOT31: u64 = 0x0a00_3e00;

fn id(n: u32) -> IntId {
    IntId::try_from(n).unwrap()
}

fn r(base: u64, size: u64) -> Region {
    Region { base, size }
}

/// QEMU virt's machine.
fn platform(dtb: &[u8]) -> Machine {
    dtb::discover(dtb).unwrap().0
}

/// A kernel module loaded, nothing else.
fn with_kernel() -> BootInfo {
    BootInfo { kernel: Some(BootModule { base: 0x4800_0000, size: 27 * MIB, bootargs: None }), ..BootInfo::default() }
}

/// A boot plan in QEMU virt's 1 GiB at 0x4000_0000: image, heap, Dom0's
/// RAM, and a RAM disk above it.
fn boot_plan() -> Plan {
    let guest_ram = r(0x5000_0000, 512 * MIB);
    Plan {
        image: r(0x4020_0000, 6 * MIB),
        heap: r(0x4080_0000, 48 * MIB),
        guest_ram,
        ram_disk: Some(r(0x7000_0000, 128 * MIB)),
        kernel: Vec::from([ModuleCopy { src: r(0x4800_0000, 27 * MIB), dst: r(guest_ram.base, 28 * MIB) }]),
        entry: guest_ram.base,
        initrd: None,
        guest_dtb: r(guest_ram.end() - GUEST_DTB_SIZE, GUEST_DTB_SIZE),
        domus: Vec::new(),
        domu_pool: None,
    }
}

/// QEMU virt's hardware: 40-bit PA, 288 SPIs (QEMU's default), a virtio-blk
/// in the last slot.
fn hw(its: bool) -> HwFacts {
    HwFacts {
        pa_bits: 40,
        nr_spis: 288,
        its_present: its,
        present: Vec::from([SLOT31]),
        uart_intid: id(33),
        maintenance_intid: id(25),
        kick: id(1),
        pmu_intid: Some(id(23)),
        iommu: crate::config::IommuMode::On,
        pci: Vec::new(),
    }
}

fn cfg(args: &str) -> Config {
    Config::parse(args).unwrap()
}

fn dom0(dtb: &[u8], args: &str) -> Result<VmPlan, PlanError> {
    plan_dom0(&platform(dtb), &with_kernel(), &boot_plan(), &cfg(args), Dom0Firmware::Dt, &hw(true))
}

fn devices(p: &VmPlan) -> Vec<Device> {
    p.bus.iter().map(|(_, d)| *d).collect()
}

/// No mapping overlaps another, and each ends inside the IPA space.
fn check_mappings(p: &VmPlan) {
    for (i, a) in p.mappings.iter().enumerate() {
        assert!(a.ipa + a.size <= p.ipa.limit(), "{a:x?} outside the IPA space");
        for b in &p.mappings[i + 1..] {
            assert!(a.ipa + a.size <= b.ipa || b.ipa + b.size <= a.ipa, "{a:x?} overlaps {b:x?}");
        }
    }
}

#[test]
fn passthrough_maps_every_virtio_page_and_forwards_their_spis() {
    let p = dom0(V3_SMP2, "dom0_disk=passthrough dom0_max_vcpus=2").unwrap();
    check_mappings(&p);
    assert_eq!(p.nr_vcpus(), 2);
    assert_eq!(p.passthrough.len(), 32);
    assert_eq!(
        p.mappings[0],
        Mapping { ipa: 0x5000_0000, pa: 0x5000_0000, size: 512 * MIB, mem: MemType::Normal, why: MapWhy::Ram }
    );
    // 32 slots of 0x200 bytes: four pages, each mapped once.
    let pages: Vec<u64> = p.mappings.iter().filter(|m| m.why == MapWhy::Passthrough).map(|m| m.ipa).collect();
    assert_eq!(pages, [0x0a00_0000, 0x0a00_1000, 0x0a00_2000, 0x0a00_3000]);
    assert!(p.mappings.iter().all(|m| m.why != MapWhy::Passthrough || m.mem == MemType::Device));
    // SPIs 16..47 (INTIDs 48..79), edge, forwarded as HW interrupts.
    assert_eq!(p.forwarded.len(), 32);
    assert!(p.forwarded.iter().all(|f| f.edge && (48..80).contains(&u32::from(f.intid))));
    let routes = p.routes().unwrap();
    assert_eq!(routes.lookup(id(79)), Some(Route::ForwardedSpi { vintid: id(79) }));
    assert_eq!(routes.lookup(id(33)), Some(Route::Console));
    assert_eq!(routes.lookup(id(27)), Some(Route::VirtualTimer));
    assert_eq!(routes.lookup(id(23)), Some(Route::Pmu), "the vPMU's overflow PPI");
    // The PCIe bridge is hidden, no virtio slot is.
    assert!(p.bridges.is_empty());
    assert_eq!(p.hidden_paths, [String::from("/pcie@10000000")]);
    assert!(p.disk.is_none() && p.its.is_none() && p.iomem.is_none());
    assert_eq!(p.ipa.bits(), 39);
    // vGIC at the host's addresses, two redistributors, the vPL011.
    assert_eq!(
        (p.vgic.gicd_base, p.vgic.gicr_base, p.vgic.nr_spis, p.vgic.lpis),
        (0x0800_0000, 0x080a_0000, 288, false)
    );
    assert_eq!(devices(&p), [Device::Vgic, Device::Vgic, Device::Vpl011, Device::Control]);
    assert_eq!(p.bus[1].0.size, 2 * 0x2_0000);
    let bus = p.mmio_bus().unwrap();
    assert_eq!(bus.lookup(0x0900_0018), Some((Device::Vpl011, 0x18)));
    // The control page: the hypervisor image's first page, which Dom0's
    // stage 2 leaves out and its DT gets a node for.
    let control = p.control.expect("Dom0 has the control device");
    assert_eq!(bus.lookup(control.base + 0x28), Some((Device::Control, 0x28)));
    assert!(!p.mappings.iter().any(|m| m.ipa < control.base + control.size && control.base < m.ipa + m.size));
}

#[test]
fn ram_disk_takes_the_last_present_slot_and_hides_its_page() {
    let p = dom0(V3_SMP2, "dom0_disk=ram dom0_disk_latency_us=50").unwrap();
    check_mappings(&p);
    let d = p.disk.unwrap();
    assert_eq!((d.base, d.intid), (SLOT31, id(79)));
    assert_eq!(d.backing, DiskBacking::Ram { image: r(0x7000_0000, 128 * MIB), latency_us: 50 });
    // Slots 24..31 share its page: not passed through, hidden from the guest.
    assert_eq!(p.passthrough.len(), 24);
    assert!(p.passthrough.iter().all(|m| m.base < 0x0a00_3000));
    assert!(p.mappings.iter().all(|m| m.ipa != 0x0a00_3000));
    assert_eq!(p.hidden_paths.len(), 1 + 7);
    assert!(!p.hidden_paths.iter().any(|h| h == "/virtio_mmio@a003e00"));
    assert!(!p.forwarded.iter().any(|f| f.intid == id(79)));
    assert_eq!(p.routes().unwrap().lookup(id(79)), None);
    assert_eq!(devices(&p), [Device::Vgic, Device::Vgic, Device::VirtioBlk, Device::Vpl011, Device::Control]);
    // No RAM disk in the boot plan: refused.
    let mut plan = boot_plan();
    plan.ram_disk = None;
    let e = plan_dom0(&platform(V3_SMP2), &with_kernel(), &plan, &cfg("dom0_disk=ram"), Dom0Firmware::Dt, &hw(false));
    assert_eq!(e.unwrap_err(), PlanError::NoRamDisk);
}

#[test]
fn backend_disk_routes_the_physical_spi_and_needs_a_device() {
    let p = dom0(V3_SMP2, "dom0_disk=backend").unwrap();
    let d = p.disk.unwrap();
    assert_eq!((d.base, d.backing), (SLOT31, DiskBacking::Phys { size: 0x200 }));
    assert_eq!(p.routes().unwrap().lookup(id(79)), Some(Route::PhysDisk));
    let mut empty = hw(false);
    empty.present.clear();
    let e = plan_dom0(
        &platform(V3_SMP2),
        &with_kernel(),
        &boot_plan(),
        &cfg("dom0_disk=backend"),
        Dom0Firmware::Dt,
        &empty,
    );
    assert_eq!(e.unwrap_err(), PlanError::NoPhysDisk);
}

#[test]
fn pcie_modes_pass_the_bridge_through_with_intx_and_the_vits() {
    for mode in ["dom0_disk=virtio-pci", "dom0_disk=nvme"] {
        let p = dom0(V4_SMP4, mode).unwrap();
        check_mappings(&p);
        assert_eq!(p.bridges.len(), 1);
        assert!(p.passthrough.is_empty());
        let ecam = p.bridges[0].ecam;
        assert!(p
            .mappings
            .iter()
            .any(|m| m.why == MapWhy::PcieBridge && m.ipa == ecam.base && m.mem == MemType::Device));
        // Every window inside the IPA space is mapped.
        assert!(p.mappings.iter().filter(|m| m.why == MapWhy::PcieBridge).count() >= 2);
        // INTx: level SPIs.
        assert_eq!(p.forwarded.len(), p.bridges[0].intx.len());
        assert!(!p.forwarded.is_empty() && p.forwarded.iter().all(|f| !f.edge));
        // The ITS backs MSIs: the vITS control frame on the bus, LPIs on.
        assert_eq!(p.its, Some(r(0x0808_0000, 0x2_0000)));
        // The DeviceIDs its vITS maps: what QEMU's msi-map gives the bus.
        assert_eq!(p.its_devices, Some(Vec::from([(0, 0x1_0000)])));
        assert!(p.vgic.lpis);
        assert_eq!(p.bus.iter().find(|(_, d)| *d == Device::Vits).unwrap().0.size, crate::its::CONTROL_FRAME_SIZE);
        // Every virtio slot hidden, the bridge kept.
        assert_eq!(p.hidden_paths.len(), 32);
        assert!(!p.hidden_paths.iter().any(|h| h.starts_with("/pcie")));
    }
    // Without a working physical ITS: INTx only.
    let p = plan_dom0(
        &platform(V4_SMP4),
        &with_kernel(),
        &boot_plan(),
        &cfg("dom0_disk=nvme"),
        Dom0Firmware::Dt,
        &hw(false),
    )
    .unwrap();
    assert!(p.its.is_none() && !p.vgic.lpis && !devices(&p).contains(&Device::Vits));
    // No bridge on the machine: refused.
    let mut plat = platform(V4_SMP4);
    plat.pcie.clear();
    let e = plan_dom0(&plat, &with_kernel(), &boot_plan(), &cfg("dom0_disk=nvme"), Dom0Firmware::Dt, &hw(true));
    assert_eq!(e.unwrap_err(), PlanError::NoPcieBridge);
}

#[test]
fn no_disk_passes_nothing_through() {
    let p = dom0(V3_SMP2, "dom0_disk=none").unwrap();
    assert!(p.passthrough.is_empty() && p.forwarded.is_empty() && p.disk.is_none());
    assert_eq!(p.mappings.len(), 1);
    assert_eq!(p.hidden_paths.len(), 33);
}

#[test]
fn acpi_dom0_gets_all_spis_but_the_uart_and_iomem_on_demand() {
    let firmware = [r(0x7c00_0000, 0x10_0000)];
    let memory = [r(0x4000_0000, 0x4000_0000), r(0x0400_0000, 0x0400_0000)];
    let fw = Dom0Firmware::Acpi { firmware: &firmware, memory: &memory };
    let h = HwFacts { pa_bits: 44, ..hw(true) };
    let p = plan_dom0(&platform(V4_SMP4), &with_kernel(), &boot_plan(), &cfg("dom0_disk=nvme"), fw, &h).unwrap();
    check_mappings(&p);
    // The whole PA space, the bridge always passed through, no DT hiding.
    assert_eq!(p.ipa.limit(), 1 << 44);
    assert_eq!(p.bridges.len(), 1);
    assert!(p.hidden_paths.is_empty());
    assert!(p.mappings.iter().any(|m| m.why == MapWhy::Firmware && m.ipa == 0x7c00_0000 && m.mem == MemType::Normal));
    // Every SPI of the distributor but the hypervisor's UART (33), level
    // unless INTx said otherwise.
    assert_eq!(p.forwarded.len(), 288 - 1);
    assert!(!p.forwarded.iter().any(|f| f.intid == id(33)));
    assert_eq!(p.routes().unwrap().lookup(id(33)), Some(Route::Console));
    let io = p.iomem.as_ref().unwrap();
    assert!(matches!(io.decide(0x0a00_0000), IoMemDecision::Map(_)));
    for denied in [0x0900_0000, 0x0800_0000, 0x080a_0000, 0x0808_0000, 0x0409_0000, 0x5000_0000, 0x7c00_0000] {
        assert!(matches!(io.decide(denied), IoMemDecision::Deny(_)), "{denied:#x} must be denied");
    }
    assert!(matches!(io.decide(1 << 44), IoMemDecision::Deny(_)));
    // An emulated disk has no DSDT entry: refused.
    let e = plan_dom0(&platform(V4_SMP4), &with_kernel(), &boot_plan(), &cfg("dom0_disk=ram"), fw, &hw(true));
    assert_eq!(e.unwrap_err(), PlanError::EmulatedDiskOnAcpi);
}

fn virtio(base: u64, intid: u32) -> MmioDevice {
    MmioDevice { base, size: 0x200, intid: id(intid), edge: true, path: alloc::format!("/virtio_mmio@{base:x}") }
}

#[test]
fn impossible_dom0_requests_are_typed_errors() {
    let plan = boot_plan();
    let try_with = |d: MmioDevice, hw: &HwFacts| {
        let mut plat = platform(V3_SMP2);
        plat.virtio_mmio.push(d);
        plan_dom0(&plat, &with_kernel(), &plan, &cfg("dom0_disk=passthrough"), Dom0Firmware::Dt, hw)
    };
    let h = hw(false);
    // Passthrough over RAM, the hypervisor's UART, the GIC, its heap.
    for base in [0x5000_0000, 0x0900_0000, 0x0800_0000, 0x080a_0000, 0x4080_0000] {
        let e = try_with(virtio(base, 100), &h).unwrap_err();
        assert!(matches!(e, PlanError::Layout(crate::boot::plan::LayoutError::Overlap { .. })), "{base:#x}: {e}");
    }
    // A range that wraps.
    let e = try_with(MmioDevice { size: 0x2000, ..virtio(u64::MAX - 0xfff, 100) }, &h).unwrap_err();
    assert!(matches!(e, PlanError::Layout(_)), "{e}");
    // Beyond a 32-bit CPU's IPA space (39 bits at least).
    let e = try_with(virtio(1 << 40, 100), &HwFacts { pa_bits: 32, ..hw(false) }).unwrap_err();
    assert!(matches!(e, PlanError::OutsideIpa { why: MapWhy::Passthrough, .. }), "{e}");
    // A device on the hypervisor's UART's INTID: two sources, one INTID.
    let e = try_with(virtio(0x0b00_0000, 33), &h).unwrap_err();
    assert!(matches!(e, PlanError::Routes(RouteError::AlreadyRouted { .. })), "{e}");
    // A device on the EL2 timer's PPI cannot be forwarded: the vGIC has no
    // such SPI, so it stays the hypervisor's.
    let p = try_with(virtio(0x0b00_0000, 26), &h).unwrap();
    assert!(!p.forwarded.iter().any(|f| f.intid == id(26)));
    // No kernel module, no vCPU.
    let no_kernel = BootInfo::default();
    assert_eq!(
        plan_dom0(&platform(V3_SMP2), &no_kernel, &plan, &cfg(""), Dom0Firmware::Dt, &h).unwrap_err(),
        PlanError::NoKernel
    );
}

#[test]
fn domus_get_their_ram_and_emulated_devices_only() {
    let plat = platform(V3_SMP2);
    let (left, placements) = selftest_carve(r(0x5000_0000, 1024 * MIB), 3, 128 * MIB, 16 * MIB, 256 * MIB).unwrap();
    let specs =
        selftest_specs(3, r(0x4800_0000, 27 * MIB), Some(r(0x4a00_0000, 80 * MIB)), (128 * MIB, 2, 16 * MIB), None);
    let mut hosts = Vec::new();
    for (s, pl) in specs.iter().zip(&placements) {
        let (p, l) = plan_domu(s, pl, &KernelLoad::Image { size: 28 * MIB }, &plat, &hw(true)).unwrap();
        check_mappings(&p);
        assert_eq!(p.spec, *s);
        assert_eq!(
            p.mappings,
            [Mapping { ipa: DOMU_RAM_BASE, pa: pl.ram.base, size: 128 * MIB, mem: MemType::Normal, why: MapWhy::Ram }]
        );
        assert!(pl.ram.base >= left.end());
        assert_eq!((p.ram.base, p.ram_host), (DOMU_RAM_BASE, pl.ram.base));
        assert_eq!(l.kernel[0].dst.ipa.base, DOMU_RAM_BASE);
        assert!(p.passthrough.is_empty() && p.bridges.is_empty() && p.forwarded.is_empty() && p.iomem.is_none());
        assert!(p.its.is_none() && !p.vgic.lpis);
        assert_eq!(p.ipa.bits(), 39);
        assert_eq!(devices(&p), [Device::Vgic, Device::Vgic, Device::VirtioBlk, Device::Vpl011]);
        let d = p.disk.unwrap();
        assert_eq!((d.base, d.intid), (DOMU_VIRTIO, id(48)));
        assert_eq!(d.backing, DiskBacking::Ram { image: pl.disk.unwrap(), latency_us: 0 });
        assert_eq!((p.uart, p.uart_intid), (Some(r(DOMU_UART, 0x1000)), id(33)));
        // Only the hypervisor's own interrupts are routed: no forwarded SPI.
        let routes = p.routes().unwrap();
        assert_eq!(routes.lookup(id(48)), None);
        assert_eq!(routes.lookup(id(27)), Some(Route::VirtualTimer));
        hosts.push((pl.ram, pl.disk.unwrap()));
    }
    // Distinct host memory per DomU.
    for (i, a) in hosts.iter().enumerate() {
        for b in &hosts[i + 1..] {
            for (x, y) in [(a.0, b.0), (a.1, b.1), (a.0, b.1), (a.1, b.0)] {
                assert!(x.end() <= y.base || y.end() <= x.base);
            }
        }
    }
}

#[test]
fn impossible_domus_are_typed_errors() {
    let plat = platform(V3_SMP2);
    let (_, pl) = selftest_carve(r(0x5000_0000, 1024 * MIB), 1, 128 * MIB, 16 * MIB, 256 * MIB).unwrap();
    let good = selftest_specs(1, r(0x4800_0000, 27 * MIB), None, (128 * MIB, 1, 16 * MIB), None).remove(0);
    let mut bad = good.clone();
    bad.vcpus = 0;
    let e = plan_domu(&bad, &pl[0], &KernelLoad::Image { size: 28 * MIB }, &plat, &hw(false)).unwrap_err();
    assert!(matches!(e, PlanError::Domain(super::layout::DomainError::BadVcpus { .. })), "{e}");
    let mut bad = good.clone();
    bad.memory = 256 * MIB;
    let e = plan_domu(&bad, &pl[0], &KernelLoad::Image { size: 28 * MIB }, &plat, &hw(false)).unwrap_err();
    assert!(matches!(e, PlanError::Domain(super::layout::DomainError::PlacementTooSmall { .. })), "{e}");
    let e = plan_domu(&good, &pl[0], &KernelLoad::Image { size: 200 * MIB }, &plat, &hw(false)).unwrap_err();
    assert!(matches!(e, PlanError::Domain(super::layout::DomainError::ModulesDoNotFit { .. })), "{e}");
    let mut no_disk = pl[0];
    no_disk.disk = None;
    let e = plan_domu(&good, &no_disk, &KernelLoad::Image { size: 28 * MIB }, &plat, &hw(false)).unwrap_err();
    assert!(matches!(e, PlanError::Domain(super::layout::DomainError::NoDisk { .. })), "{e}");
}

/// QEMU+EDK2's real ACPI tables (`firmware/acpi/testdata/`) as the machine:
/// the ACPI Dom0 of the EFI boot.
#[test]
fn acpi_dom0_on_qemu_edk2_tables() {
    use crate::firmware::acpi::{AcpiMachine, MemImage, Tables};
    const MEM: &[u8] = include_bytes!("../firmware/acpi/testdata/qemu-virt-mem-77130000.bin");
    let tables = Tables::from_rsdp(&MemImage { base: 0x7713_0000, bytes: MEM }, 0x7713_0018).unwrap();
    let mut plat = AcpiMachine::parse(&tables).unwrap().to_machine(Vec::from([r(0x4000_0000, 0x4000_0000)])).unwrap();
    // A second ITS (a machine with one per socket): never Dom0's either.
    let second_its = r(0x0a10_0000, 0x2_0000);
    plat.gic.other_its.push(second_its);
    let firmware = [r(0x7713_0000, 0x1_0000)];
    let memory = [r(0x4000_0000, 0x4000_0000)];
    let fw = Dom0Firmware::Acpi { firmware: &firmware, memory: &memory };
    let h = HwFacts { present: Vec::new(), ..hw(true) };
    for (mode, its) in [("dom0_disk=nvme", true), ("dom0_disk=virtio-pci", true), ("dom0_disk=none", false)] {
        let p = plan_dom0(&plat, &with_kernel(), &boot_plan(), &cfg(mode), fw, &h).unwrap();
        check_mappings(&p);
        // The MCFG's host bridge, always; the ITS only for a PCIe disk.
        assert_eq!(p.bridges.len(), 1);
        assert!(p.mappings.iter().any(|m| m.why == MapWhy::PcieBridge && m.ipa == plat.pcie[0].ecam.base));
        assert_eq!(p.its.is_some(), its);
        assert_eq!(p.forwarded.len(), 288 - 1);
        assert!(p.mappings.iter().any(|m| m.why == MapWhy::Firmware && m.ipa == 0x7713_0000));
        let io = p.iomem.as_ref().unwrap();
        // The GIC and the hypervisor's UART (SPCR) are never Dom0's.
        for denied in [plat.gic.gicd.base, plat.gic.gicr[0].base, plat.uart.as_ref().unwrap().base] {
            assert!(matches!(io.decide(denied), IoMemDecision::Deny(_)), "{denied:#x} must be denied");
        }
        for its_page in [plat.gic.its.unwrap().base, second_its.base, second_its.base + 0x1_0040] {
            assert_eq!(io.decide(its_page), IoMemDecision::Deny("GIC ITS"), "{its_page:#x} must be denied");
        }
        assert!(matches!(io.decide(0x0a00_0000), IoMemDecision::Map(_)));
    }
    for mode in ["dom0_disk=ram", "dom0_disk=backend"] {
        let e = plan_dom0(&plat, &with_kernel(), &boot_plan(), &cfg(mode), fw, &h).unwrap_err();
        assert_eq!(e, PlanError::EmulatedDiskOnAcpi);
    }
}

/// Dom0 is a `VmSpec` like any DomU: the `dom0_*` options, the boot
/// modules and the RAM the boot plan gave it, carried in its plan.
#[test]
fn dom0s_spec_comes_from_the_options_the_modules_and_the_boot_plan() {
    let args = "dom0_max_vcpus=2 dom0_weight=512 dom0_cap=50 dom0_vcpus_pin dom0_heap_quota=8M dom0_disk=ram \
                dom0_disk_size=64M";
    let plat = platform(V3_SMP2);
    let mut boot = with_kernel();
    boot.ramdisk = Some(BootModule { base: 0x4a00_0000, size: 3 * MIB, bootargs: None });
    boot.bootargs = Some(String::from("console=ttyAMA0"));
    let spec = dom0_spec(&plat, &boot, &boot_plan(), &cfg(args)).unwrap();
    assert_eq!((spec.id, spec.name.as_str()), (0, "Dom0"));
    assert_eq!((spec.memory, spec.vcpus), (512 * MIB, 2));
    assert_eq!((spec.weight, spec.cap_percent, spec.pin_vcpus), (512, Some(50), true));
    assert_eq!((spec.heap_quota, spec.disk_size), (8 * MIB, 64 * MIB));
    assert_eq!((spec.kernel, spec.ramdisk), (r(0x4800_0000, 27 * MIB), Some(r(0x4a00_0000, 3 * MIB))));
    assert_eq!(spec.bootargs, "console=ttyAMA0");
    let p = plan_dom0(&plat, &boot, &boot_plan(), &cfg(args), Dom0Firmware::Dt, &hw(true)).unwrap();
    assert_eq!(p.spec, spec);
    assert_eq!(p.nr_vcpus(), 2);

    // The defaults: one vCPU, Credit2's weight, uncapped, floating, no RAM disk.
    let d = dom0_spec(&platform(V3_SMP2), &with_kernel(), &boot_plan(), &cfg("")).unwrap();
    assert_eq!((d.vcpus, d.weight, d.cap_percent, d.pin_vcpus, d.disk_size), (1, 256, None, false, 0));

    let none = BootInfo::default();
    assert!(matches!(dom0_spec(&platform(V3_SMP2), &none, &boot_plan(), &cfg("")), Err(PlanError::NoKernel)));
}

const V3_SMMUV3: &[u8] = include_bytes!("../dtb/testdata/qemu-virt-gicv3-smmuv3.dtb");

/// QEMU virt with `iommu=smmuv3`: Dom0's NVMe bridge is behind the SMMU.
/// Its streams are the first `DMA_BUSES` buses' requester IDs, its devices'
/// stage 2 is its RAM and the ITS doorbell page and nothing else (no ECAM,
/// no BAR window, no hypervisor memory), and Dom0's route table takes the
/// SMMU's two interrupts for the hypervisor. `iommu=off` plans no DMA
/// confinement; a map naming a missing SMMU is a boot error.
#[test]
fn dom0_dma_behind_the_smmu() {
    let p = dom0(V3_SMMUV3, "dom0_disk=nvme").unwrap();
    let dma = p.dma.as_ref().expect("DMA plan");
    assert_eq!(dma.streams, [StreamRange { smmu: 0, first: 0, count: DMA_BUSES * 256 }]);
    let ram: Vec<_> = p.mappings.iter().filter(|m| m.why == MapWhy::Ram).copied().collect();
    assert_eq!(dma.mappings[..ram.len()], ram[..]);
    assert_eq!(dma.mappings.len(), ram.len() + 1);
    let bell = dma.mappings.last().unwrap();
    assert_eq!(
        (bell.ipa, bell.pa, bell.size, bell.mem, bell.why),
        (0x0809_0000, 0x0809_0000, 4096, MemType::Device, MapWhy::Doorbell)
    );
    let plan = boot_plan();
    let apart = |a: Region, b: Region| a.end() <= b.base || b.end() <= a.base;
    for m in &dma.mappings {
        let m = r(m.ipa, m.size);
        assert!(apart(m, plan.image) && apart(m, plan.heap) && apart(m, p.bridges[0].ecam));
    }
    assert_eq!(p.smmu_irqs, [id(106), id(109)]);
    let routes = p.routes().unwrap();
    assert_eq!(routes.lookup(id(106)), Some(Route::Smmu));
    assert_eq!(routes.lookup(id(109)), Some(Route::Smmu));

    let off = dom0(V3_SMMUV3, "dom0_disk=nvme iommu=off").unwrap();
    assert!(off.dma.is_none() && off.smmu_irqs.is_empty());
    // No bridge given to Dom0 (RAM disk): nothing to confine.
    assert!(dom0(V3_SMMUV3, "dom0_disk=ram").unwrap().dma.is_none());
    // No SMMU described: nothing either.
    assert!(dom0(V3_SMP2, "dom0_disk=nvme").unwrap().dma.is_none());

    // A bridge whose map names a phandle no SMMU has.
    let mut m = platform(V3_SMMUV3);
    m.pcie[0].iommu_map[0].iommu = 0xdead;
    let e =
        plan_dom0(&m, &with_kernel(), &boot_plan(), &cfg("dom0_disk=nvme"), Dom0Firmware::Dt, &hw(true)).unwrap_err();
    assert!(matches!(e, PlanError::IommuMapMissing { phandle: 0xdead, .. }), "{e}");
    assert!(e.to_string().contains("iommu-map"), "{e}");
}

/// QEMU's NVMe at 0000:00:02.0 as the EL2 probe reads it: BAR0, 64-bit,
/// 16 KiB.
fn nvme_probed(domid: u16, bdf: &str) -> ProbedPci {
    let bar = crate::vpci::PhysBar { index: 0, size: 0x4000, is64: true, prefetchable: false };
    ProbedPci { domid, bdf: bdf.parse().unwrap(), bars: Vec::from([bar]), flr: true }
}

/// A PCIe function assigned to DomU 1 (`hv,pci-assigned`), on QEMU virt
/// with the SMMU: Dom0 keeps the bridge but not the function's ECAM page
/// (an emulated empty slot), nor the top of the 32-bit window its BAR
/// takes, nor its DeviceID, nor its stream; the DomU gets a host bridge and
/// a vITS of its own, the BAR mapped where the plan put it, and its
/// device's DMA confined to its RAM and its vITS's doorbell, which is the
/// physical GITS_TRANSLATER.
#[test]
fn a_pcie_function_assigned_to_a_domu() {
    let plat = platform(V3_SMMUV3);
    let hw = HwFacts { pci: Vec::from([nvme_probed(1, "0000:00:02.0")]), ..hw(true) };
    let bridge = &plat.pcie[0];
    let window = bridge.windows.iter().find(|w| w.space == crate::dtb::PciSpace::Mem32).unwrap().cpu;
    let page = bridge.ecam.base + (2 << 15);

    let pci = plan_pci(&plat, crate::config::IommuMode::On, true, &hw.pci).unwrap();
    let f = &pci.functions[0];
    assert_eq!((f.config, f.rid, f.devid, f.stream, f.slot), (page, 0x10, 0x10, (0, 0x10), 0));
    assert_eq!(f.bars[0].pa, window.end() - 0x4000);
    assert_eq!(f.bars[0].bus, f.bars[0].pa, "QEMU's 32-bit window: PCI address = CPU address");
    assert_eq!(f.bars[0].ipa, DOMU_PCI_MMIO.base);
    assert_eq!(pci.carves, [(0, r(window.end() - 0x4000, 0x4000))]);

    let p = plan_dom0(&plat, &with_kernel(), &boot_plan(), &cfg("dom0_disk=nvme"), Dom0Firmware::Dt, &hw).unwrap();
    check_mappings(&p);
    let covers = |a: u64| p.mappings.iter().any(|m| m.ipa <= a && a < m.ipa + m.size);
    assert!(!covers(page) && covers(page - 1) && covers(page + 4096), "a one-page hole in the ECAM");
    assert!(!covers(window.end() - 1) && !covers(window.end() - 0x4000) && covers(window.end() - 0x4001));
    assert!(p.bus.iter().any(|(r, d)| *d == Device::PciHidden && r.base == page && r.size == 4096));
    assert_eq!(p.pci_carves, [r(window.end() - 0x4000, 0x4000)]);
    let streams = &p.dma.as_ref().unwrap().streams;
    assert_eq!(
        streams[..],
        [StreamRange { smmu: 0, first: 0, count: 0x10 }, StreamRange { smmu: 0, first: 0x11, count: 0xfef }]
    );
    let devs = p.its_devices.as_ref().unwrap();
    assert!(devs.iter().all(|&(b, n)| !(b..b + n).contains(&0x10)) && devs.iter().any(|&(b, _)| b == 0x11));

    let plat_domu = platform(V3_SMMUV3);
    let (left, placements) = selftest_carve(r(0x5000_0000, 1024 * MIB), 1, 256 * MIB, 16 * MIB, 256 * MIB).unwrap();
    assert!(left.size > 0);
    let mut spec = selftest_specs(1, r(0x4800_0000, 27 * MIB), None, (256 * MIB, 1, 16 * MIB), None).remove(0);
    spec.pci = Vec::from([f.bdf]);
    let (d, _) = plan_domu(&spec, &placements[0], &KernelLoad::Image { size: 28 * MIB }, &plat_domu, &hw).unwrap();
    check_mappings(&d);
    assert_eq!(d.its, Some(DOMU_ITS));
    assert!(d.vgic.lpis);
    assert_eq!(d.its_devices, Some(Vec::from([(0x10, 1)])));
    let bar = d.mappings.iter().find(|m| m.why == MapWhy::PciBar).unwrap();
    assert_eq!((bar.ipa, bar.pa, bar.size, bar.mem), (DOMU_PCI_MMIO.base, f.bars[0].pa, 0x4000, MemType::Device));
    assert!(d.bus.iter().any(|(r, dev)| *dev == Device::Vpci && r.base == DOMU_ECAM.base));
    let dma = d.dma.as_ref().unwrap();
    assert_eq!(dma.streams, [StreamRange { smmu: 0, first: 0x10, count: 1 }]);
    assert_eq!(dma.mappings[0], d.mappings[0], "its RAM");
    let bell = dma.mappings[1];
    assert_eq!((bell.ipa, bell.pa, bell.why), (DOMU_ITS.base + 0x1_0000, 0x0809_0000, MapWhy::Doorbell));
    assert_eq!(d.pci.len(), 1);
    // A DomU without functions has none of it.
    let (plain, _) = plan_domu(
        &selftest_specs(1, r(0x4800_0000, 27 * MIB), None, (256 * MIB, 1, 16 * MIB), None).remove(0),
        &placements[0],
        &KernelLoad::Image { size: 28 * MIB },
        &plat_domu,
        &hw,
    )
    .unwrap();
    assert!(plain.its.is_none() && plain.dma.is_none() && plain.pci.is_empty());
}

/// Assignments the machine cannot honour are one clear boot error each.
#[test]
fn impossible_pci_assignments_are_typed_errors() {
    use crate::config::IommuMode;
    let plat = platform(V3_SMMUV3);
    let plan = |probed: Vec<ProbedPci>, iommu, its| plan_pci(&plat, iommu, its, &probed);
    let one = || Vec::from([nvme_probed(1, "0000:00:02.0")]);
    assert!(matches!(plan(one(), IommuMode::Off, true), Err(PlanError::PciNeedsIommu(_))));
    assert!(matches!(plan(one(), IommuMode::On, false), Err(PlanError::PciNeedsIts(_))));
    assert!(matches!(
        plan(Vec::from([nvme_probed(1, "0000:01:00.0")]), IommuMode::On, true),
        Err(PlanError::PciNotRootBus(_))
    ));
    assert!(matches!(
        plan(Vec::from([nvme_probed(1, "0001:00:02.0")]), IommuMode::On, true),
        Err(PlanError::PciNoBridge(_))
    ));
    let twice = Vec::from([nvme_probed(1, "0000:00:02.0"), nvme_probed(2, "0000:00:02.0")]);
    assert!(matches!(plan(twice, IommuMode::On, true), Err(PlanError::PciTwice(_))));
    let mut huge = nvme_probed(1, "0000:00:02.0");
    huge.bars[0].size = 1 << 31;
    let e = plan(Vec::from([huge]), IommuMode::On, true).unwrap_err();
    assert!(matches!(e, PlanError::PciBarTooBig { index: 0, .. }), "{e}");
    assert!(e.to_string().contains("0000:00:02.0"), "{e}");
    // No SMMU on the machine.
    let e = plan_pci(&platform(V3_SMP2), IommuMode::On, true, &one()).unwrap_err();
    assert!(matches!(e, PlanError::PciNeedsIommu(_)), "{e}");
    // Two functions for one DomU: device slots 0 and 1, BARs apart.
    let two = Vec::from([nvme_probed(1, "0000:00:02.0"), nvme_probed(1, "0000:00:03.0")]);
    let p = plan(two, IommuMode::On, true).unwrap();
    assert_eq!(p.functions.iter().map(|f| f.slot).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(p.functions[1].bars[0].ipa, DOMU_PCI_MMIO.base + 0x4000);
    assert_eq!(p.functions[1].bars[0].pa + 0x4000, p.functions[0].bars[0].pa);
    assert_eq!(p.carves[0].1.size, 0x8000);
}
