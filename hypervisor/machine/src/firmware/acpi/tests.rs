//! Host tests on QEMU's real tables (`testdata/`, see its README) and on
//! tables built and corrupted here.

use alloc::vec;
use alloc::vec::Vec;

use super::dom0::{build_dom0_tables, stao_hides_uart, Dom0AcpiConfig};
use super::tables::*;
use super::*;
use crate::dtb::MsiMapEntry;
use crate::region::Region;
use crate::testrng::Rng;

/// 64 KiB of QEMU virt's guest-physical memory from 0x7713_0000 (EDK2 put
/// the RSDP at 0x7713_0018 and every table after it).
const MEM: &[u8] = include_bytes!("testdata/qemu-virt-mem-77130000.bin");
const MEM_BASE: u64 = 0x7713_0000;
const RSDP_ADDR: u64 = 0x7713_0018;
const APIC: &[u8] = include_bytes!("testdata/APIC.bin");
const FACP: &[u8] = include_bytes!("testdata/FACP.bin");
const GTDT: &[u8] = include_bytes!("testdata/GTDT.bin");
const SPCR: &[u8] = include_bytes!("testdata/SPCR.bin");
const MCFG: &[u8] = include_bytes!("testdata/MCFG.bin");
const IORT: &[u8] = include_bytes!("testdata/IORT.bin");
const DSDT: &[u8] = include_bytes!("testdata/DSDT.bin");

fn mem(bytes: &[u8]) -> MemImage<'_> {
    MemImage { base: MEM_BASE, bytes }
}

fn host() -> Tables<'static> {
    Tables::from_rsdp(&MemImage { base: MEM_BASE, bytes: MEM }, RSDP_ADDR).unwrap()
}

/// Sets a table's length and checksum after an edit.
fn fix(t: &mut [u8]) {
    let len = t.len() as u32;
    t[4..8].copy_from_slice(&len.to_le_bytes());
    t[9] = 0;
    t[9] = 0u8.wrapping_sub(checksum(t));
}

/// A table from a header template (`sig` replaced) and a body.
fn table(sig: &[u8; 4], body: &[u8]) -> Vec<u8> {
    let mut t = APIC[..HEADER_LEN].to_vec();
    t[0..4].copy_from_slice(sig);
    t.extend_from_slice(body);
    fix(&mut t);
    t
}

fn gicc(mpidr: u64, flags: u32, gicr: u64) -> Vec<u8> {
    let mut g = vec![0u8; GICC_LEN];
    g[0] = MADT_GICC;
    g[1] = GICC_LEN as u8;
    g[12..16].copy_from_slice(&flags.to_le_bytes());
    g[56..60].copy_from_slice(&25u32.to_le_bytes());
    g[60..68].copy_from_slice(&gicr.to_le_bytes());
    g[68..76].copy_from_slice(&mpidr.to_le_bytes());
    g
}

fn gicd(base: u64, version: u8) -> Vec<u8> {
    let mut g = vec![0u8; 24];
    g[0] = MADT_GICD;
    g[1] = 24;
    g[8..16].copy_from_slice(&base.to_le_bytes());
    g[20] = version;
    g
}

fn gicr(base: u64, len: u32) -> Vec<u8> {
    let mut g = vec![MADT_GICR, 16, 0, 0];
    g.extend_from_slice(&base.to_le_bytes());
    g.extend_from_slice(&len.to_le_bytes());
    g
}

fn its(id: u32, base: u64) -> Vec<u8> {
    let mut g = vec![MADT_GIC_ITS, 20, 0, 0];
    g.extend_from_slice(&id.to_le_bytes());
    g.extend_from_slice(&base.to_le_bytes());
    g.extend_from_slice(&[0; 4]);
    g
}

fn madt(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut body = vec![0u8; 8];
    for e in entries {
        body.extend_from_slice(e);
    }
    table(b"APIC", &body)
}

// ------------------------------------------------------------ real tables

#[test]
fn qemu_tables_from_rsdp() {
    let t = host();
    assert_eq!(t.rsdp.xsdt_addr, 0x7713_fe98);
    assert_eq!(&t.rsdp.oem_id, b"BOCHS ");
    let sigs: Vec<Signature> = t.tables.iter().map(|t| t.signature()).collect();
    let want: Vec<Signature> = [b"FACP", b"APIC", b"PPTT", b"GTDT", b"MCFG", b"SPCR", b"DBG2", b"IORT", b"DSDT"]
        .map(|s| Signature(*s))
        .to_vec();
    assert_eq!(sigs, want);
    // The sysfs dumps are the same bytes as the tables in memory.
    for (sig, bytes) in [
        (Signature::MADT, APIC),
        (Signature::FADT, FACP),
        (Signature::GTDT, GTDT),
        (Signature::SPCR, SPCR),
        (Signature::MCFG, MCFG),
        (Signature::IORT, IORT),
        (Signature::DSDT, DSDT),
    ] {
        assert_eq!(t.find(sig).unwrap().data, bytes, "{sig}");
    }
}

#[test]
fn qemu_tables_decode() {
    let m = AcpiMachine::parse(&host()).unwrap();
    assert!(m.fadt.hw_reduced());
    assert_eq!(m.fadt.version, (6, 0));
    assert_eq!(m.fadt.dsdt, 0x7713_7518);
    assert_eq!(m.madt.gic_version, 3);
    assert_eq!(m.madt.gicd, Region { base: 0x0800_0000, size: 0x1_0000 });
    assert_eq!(
        m.madt.giccs.iter().map(|g| (g.mpidr, g.flags, g.vgic_maint_gsiv)).collect::<Vec<_>>(),
        [(0, 1, 25), (1, 1, 25)]
    );
    assert_eq!(m.madt.gicr_ranges, [Region { base: 0x080a_0000, size: 0xf6_0000 }]);
    assert_eq!(m.madt.its, [(0, Region { base: 0x0808_0000, size: 0x2_0000 })]);
    assert_eq!(m.madt.skipped, 0);
    assert_eq!((m.gtdt.non_secure_el1.gsiv, m.gtdt.virtual_el1.gsiv, m.gtdt.non_secure_el2.gsiv), (30, 27, 26));
    assert_eq!(m.gtdt.non_secure_el1.flags & GTDT_EDGE, 0);
    let spcr = m.spcr.unwrap();
    assert_eq!((spcr.interface_type, spcr.base, spcr.gsiv, spcr.gic_interrupt), (SPCR_PL011, 0x0900_0000, 33, true));
    assert_eq!(m.mcfg, [McfgEntry { base: 0x40_1000_0000, segment: 0, start_bus: 0, end_bus: 255 }]);
    let iort = m.iort.clone().unwrap();
    assert_eq!(iort.its_groups, [ItsGroup { offset: 0x30, its_ids: vec![0] }]);
    assert_eq!(iort.root_complexes.len(), 1);
    assert_eq!(iort.root_complexes[0].segment, 0);
    assert_eq!(
        iort.root_complexes[0].id_maps,
        [RcIdMap { rid_base: 0, count: 0x1_0000, device_id_base: 0, its_group: 0x30 }]
    );
    // No SMMU on this machine (`iommu=smmuv3` adds one).
    assert!(iort.smmus.is_empty() && iort.root_complexes[0].stream_maps.is_empty());
}

/// The ACPI path describes QEMU virt as the DTB path does.
#[test]
fn qemu_platform_matches_dtb() {
    let m = AcpiMachine::parse(&host()).unwrap();
    let ram = vec![Region { base: 0x4000_0000, size: 0x4000_0000 }];
    let p = m.to_machine(ram.clone()).unwrap();
    let (dt, _) = crate::dtb::discover(include_bytes!("../../dtb/testdata/qemu-virt-gicv3-smp2.dtb")).unwrap();
    assert_eq!(p.memory, ram);
    assert_eq!(p.cpus, dt.cpus);
    assert_eq!(p.timer, dt.timer);
    assert_eq!((p.gic.version, p.gic.gicd, p.gic.its), (dt.gic.version, dt.gic.gicd, dt.gic.its));
    assert_eq!(p.gic.maintenance_intid, dt.gic.maintenance_intid);
    assert_eq!(p.gic.gicr, dt.gic.gicr);
    let (u, du) = (p.uart.unwrap(), dt.uart.unwrap());
    assert_eq!((u.base, u.size, u.intid, u.compatible.as_str()), (du.base, du.size, du.intid, "arm,pl011"));
    assert_eq!(p.pcie.len(), 1);
    let (h, dh) = (&p.pcie[0], &dt.pcie[0]);
    assert_eq!((h.ecam, h.bus_range), (dh.ecam, dh.bus_range));
    assert_eq!(h.msi_map, [MsiMapEntry { rid_base: 0, msi_controller: 0, msi_base: 0, length: 0x1_0000 }]);
    // QEMU with virtualization=on hands PSCI to EL3 firmware: SMC.
    assert_eq!(p.psci_method.as_deref(), Some("smc"));
    // PCIe windows and INTx are in the DSDT's AML, which is not read.
    assert!(h.windows.is_empty() && h.intx.is_empty());
}

// ------------------------------------------------------------ bad input

#[test]
fn bad_rsdp() {
    let mut m = MEM.to_vec();
    m[0x18] = b'X';
    assert_eq!(Tables::from_rsdp(&mem(&m), RSDP_ADDR), Err(AcpiError::BadRsdp("signature is not \"RSD PTR \"")));
    let mut m = MEM.to_vec();
    m[0x18 + 30] ^= 1; // XSDT address, extended checksum now wrong
    assert_eq!(Tables::from_rsdp(&mem(&m), RSDP_ADDR), Err(AcpiError::BadRsdp("bad extended checksum")));
    assert_eq!(Tables::from_rsdp(&mem(MEM), 0x1000), Err(AcpiError::Unmapped { table: Signature::RSDP, addr: 0x1000 }));
}

#[test]
fn bad_checksum_names_the_table() {
    for (sig, addr) in
        [(Signature::XSDT, 0x7713_fe98u64), (Signature::MADT, 0x7713_fc18), (Signature::DSDT, 0x7713_7518)]
    {
        let mut m = MEM.to_vec();
        m[(addr - MEM_BASE) as usize + 20] ^= 0x40;
        assert_eq!(Tables::from_rsdp(&mem(&m), RSDP_ADDR), Err(AcpiError::BadChecksum { table: sig }));
    }
}

#[test]
fn table_beyond_memory_is_unmapped() {
    // The MCFG is the last table in the image: cut it off.
    let cut = &MEM[..0xff98 + 40];
    assert_eq!(
        Tables::from_rsdp(&mem(cut), RSDP_ADDR),
        Err(AcpiError::Unmapped { table: Signature::MCFG, addr: 0x7713_ff98 })
    );
    // A length field shorter than the header.
    let mut m = MEM.to_vec();
    m[0xff98 + 4..0xff98 + 8].copy_from_slice(&8u32.to_le_bytes());
    assert!(matches!(Tables::from_rsdp(&mem(&m), RSDP_ADDR), Err(AcpiError::BadLength { .. })));
}

/// Every prefix of every real table is an error or a value, never a panic.
#[test]
fn truncated_tables() {
    for n in 0..APIC.len() {
        assert!(parse_madt(&APIC[..n]).is_err(), "MADT prefix {n}");
    }
    for n in 0..GTDT.len() {
        assert!(parse_gtdt(&GTDT[..n]).is_err(), "GTDT prefix {n}");
    }
    for n in 0..IORT.len() {
        assert!(parse_iort(&IORT[..n]).is_err(), "IORT prefix {n}");
    }
    for n in 0..FACP.len() {
        assert!(parse_fadt(&FACP[..n]).is_err(), "FADT prefix {n}");
    }
    for n in 0..SPCR.len() {
        assert!(parse_spcr(&SPCR[..n]).is_err(), "SPCR prefix {n}");
    }
    for n in 0..MCFG.len() {
        assert!(parse_mcfg(&MCFG[..n]).is_err(), "MCFG prefix {n}");
    }
    // Cut short with the length field repaired: the layout checks still hold.
    let mut f = FACP[..100].to_vec();
    fix(&mut f);
    assert!(matches!(parse_fadt(&f), Err(AcpiError::Truncated { table: Signature::FADT, .. })));
    let mut m = MCFG[..50].to_vec();
    fix(&mut m);
    assert!(matches!(parse_mcfg(&m), Err(AcpiError::BadLength { table: Signature::MCFG, .. })));
    let mut g = GTDT[..60].to_vec();
    fix(&mut g);
    assert!(matches!(parse_gtdt(&g), Err(AcpiError::Truncated { table: Signature::GTDT, .. })));
    let mut a = APIC[..148].to_vec(); // GICD and one GICC: a valid MADT
    fix(&mut a);
    assert_eq!(parse_madt(&a).unwrap().giccs.len(), 1);
    let mut a = APIC[..150].to_vec();
    fix(&mut a);
    assert!(matches!(parse_madt(&a), Err(AcpiError::Truncated { table: Signature::MADT, .. })));
}

#[test]
fn madt_unknown_entries_skipped() {
    let unknown = vec![0x7f, 6, 1, 2, 3, 4];
    let m = parse_madt(&madt(&[gicd(0x800_0000, 3), unknown, gicc(0, 1, 0), gicr(0x80a_0000, 0x4_0000)])).unwrap();
    assert_eq!((m.skipped, m.giccs.len()), (1, 1));
    // A GIC MSI frame (GICv2m) is a known type we do not use: skipped too.
    let msi_frame = {
        let mut f = vec![0u8; 24];
        f[0] = MADT_GIC_MSI_FRAME;
        f[1] = 24;
        f
    };
    assert_eq!(parse_madt(&madt(&[gicd(0x800_0000, 3), msi_frame, gicc(0, 1, 0)])).unwrap().skipped, 1);
}

#[test]
fn madt_bad_entries() {
    let base = [gicd(0x800_0000, 3), gicc(0, 1, 0)];
    // Zero-length entry: would loop forever.
    let zero = madt(&[base[0].clone(), vec![0x7f, 0, 0, 0], base[1].clone()]);
    assert!(matches!(parse_madt(&zero), Err(AcpiError::BadValue { table: Signature::MADT, what: "entry length", .. })));
    // Entry overrunning the table.
    let mut over = madt(&base);
    let last = over.len() - GICC_LEN;
    over[last + 1] = 200;
    fix(&mut over);
    assert!(matches!(parse_madt(&over), Err(AcpiError::Truncated { table: Signature::MADT, .. })));
    // A GICC shorter than its layout.
    let mut short = gicc(0, 1, 0);
    short.truncate(40);
    short[1] = 40;
    assert!(matches!(parse_madt(&madt(&[base[0].clone(), short])), Err(AcpiError::Truncated { .. })));
}

#[test]
fn madt_counts_and_overlaps() {
    let d = gicd(0x800_0000, 3);
    let none = AcpiError::BadCount { table: Signature::MADT, what: "usable GICC structures (none)" };
    assert_eq!(parse_madt(&madt(core::slice::from_ref(&d))), Err(none));
    assert_eq!(parse_madt(&madt(&[d.clone(), gicc(0, 0, 0)])), Err(none));
    assert!(matches!(parse_madt(&madt(&[gicc(0, 1, 0)])), Err(AcpiError::BadCount { .. })));
    assert!(matches!(parse_madt(&madt(&[d.clone(), d.clone(), gicc(0, 1, 0)])), Err(AcpiError::BadCount { .. })));
    let dup = madt(&[d.clone(), gicc(0x100, 1, 0), gicc(0x100, 1, 0)]);
    assert!(matches!(parse_madt(&dup), Err(AcpiError::Overlap { what: "GICC MPIDRs (duplicate)", .. })));
    let gicr_over_its = madt(&[d.clone(), gicc(0, 1, 0), gicr(0x80a_0000, 0x4_0000), its(0, 0x80c_0000)]);
    assert!(matches!(parse_madt(&gicr_over_its), Err(AcpiError::Overlap { table: Signature::MADT, .. })));
    let gicr_over_gicd = madt(&[d.clone(), gicc(0, 1, 0), gicr(0x800_8000, 0x4_0000)]);
    assert!(matches!(parse_madt(&gicr_over_gicd), Err(AcpiError::Overlap { .. })));
    let wraps = madt(&[d.clone(), gicc(0, 1, 0), gicr(u64::MAX - 0xfff, 0x4_0000)]);
    assert!(parse_madt(&wraps).is_err());
    assert!(matches!(parse_madt(&madt(&[d, gicc(0, 1, 0), gicr(0x80a_0000, 0)])), Err(AcpiError::BadValue { .. })));
}

/// QEMU's FADT and GTDT, no SPCR, MCFG or IORT, and the MADT `madt_bytes`.
fn machine_with_madt(madt_bytes: &[u8]) -> AcpiMachine {
    AcpiMachine {
        fadt: parse_fadt(FACP).unwrap(),
        madt: parse_madt(madt_bytes).unwrap(),
        gtdt: parse_gtdt(GTDT).unwrap(),
        spcr: None,
        mcfg: vec![],
        iort: None,
    }
}

/// Many CPUs (Graviton4 has 192), GICR bases per GICC, GICv4 stride.
#[test]
fn many_cpus_with_gicc_gicr_bases() {
    let mut entries = vec![gicd(0x1000_0000, 4)];
    let mpidr = |i: u64| ((i / 64) << 16) | ((i % 64) << 8);
    entries.extend((0..192).map(|i| gicc(mpidr(i), 1, 0x2000_0000 + i * GICR_V4_STRIDE)));
    let madt_bytes = madt(&entries);
    let m = machine_with_madt(&madt_bytes);
    assert_eq!(m.madt.giccs.len(), 192);
    let p = m.to_machine(vec![]).unwrap();
    assert_eq!(p.cpus.len(), 192);
    assert_eq!(p.cpus[191], mpidr(191));
    assert_eq!(p.gic.gicr[5], Region { base: 0x2000_0000 + 5 * 0x4_0000, size: 0x4_0000 });
}

/// QEMU virt's MADT with 192 CPUs (what `-smp 192` with `acpi=on` lists:
/// GICCs with GICR base 0, one GICR structure per redistributor region):
/// both regions reach the machine description, and the redistributor walk
/// over them serves every CPU.
#[test]
fn qemu_192_cpus_two_gicr_structures() {
    let mpidr = |i: u64| ((i / 16) << 8) | (i % 16);
    let mut entries = vec![gicd(0x800_0000, 3)];
    entries.extend((0..192).map(|i| gicc(mpidr(i), 1, 0)));
    entries.push(gicr(0x80a_0000, 0xf6_0000));
    entries.push(gicr(0x40_0000_0000, 0x400_0000));
    entries.push(its(0, 0x808_0000));
    entries.push(its(1, 0x40_1000_0000));
    let madt_bytes = madt(&entries);
    let m = machine_with_madt(&madt_bytes);
    let p = m.to_machine(vec![]).unwrap();
    assert_eq!(p.cpus.len(), 192);
    // The first ITS is the one the hypervisor drives; the others are
    // listed so that no guest can map them.
    assert_eq!(p.gic.its, Some(Region { base: 0x808_0000, size: 0x2_0000 }));
    assert_eq!(p.gic.other_its, [Region { base: 0x40_1000_0000, size: 0x2_0000 }]);
    assert_eq!(
        p.gic.gicr,
        [Region { base: 0x80a_0000, size: 0xf6_0000 }, Region { base: 0x40_0000_0000, size: 0x400_0000 }]
    );
    // QEMU's redistributors: 123 in the low region, 69 in the high one.
    let frame = |i: u64| if i < 123 { 0x80a_0000 + i * 0x2_0000 } else { 0x40_0000_0000 + (i - 123) * 0x2_0000 };
    let typer = |a: u64| {
        let i = (0..192).find(|&i| frame(i) + crate::gicr::GICR_TYPER == a).expect("a GICR_TYPER");
        (u64::from(crate::gicr::mpidr_affinity(mpidr(i))) << 32) | if i == 122 || i == 191 { 1 << 4 } else { 0 }
    };
    let frames = crate::gicr::walk(&p.gic.gicr, typer);
    assert_eq!(crate::gicr::served(&frames, &p.cpus), 192);
    assert_eq!(crate::gicr::find(&frames, p.cpus[150]).unwrap().rd_base, 0x40_0000_0000 + 27 * 0x2_0000);
    // The per-GICC form of the same machine (no GICR structures).
    let mut per_cpu = vec![gicd(0x800_0000, 3)];
    per_cpu.extend((0..192).map(|i| gicc(mpidr(i), 1, frame(i))));
    let madt_bytes = madt(&per_cpu);
    let m = machine_with_madt(&madt_bytes);
    let p = m.to_machine(vec![]).unwrap();
    assert_eq!(p.gic.gicr.len(), 192);
    let frames = crate::gicr::walk(&p.gic.gicr, typer);
    assert_eq!(crate::gicr::served(&frames, &p.cpus), 192);
    assert_eq!(crate::gicr::find(&frames, p.cpus[191]).unwrap().rd_base, frame(191));
}

#[test]
fn mcfg_bad_entries() {
    let entry = |base: u64, seg: u16, start: u8, end: u8| {
        let mut e = base.to_le_bytes().to_vec();
        e.extend_from_slice(&seg.to_le_bytes());
        e.extend_from_slice(&[start, end, 0, 0, 0, 0]);
        e
    };
    let mcfg = |es: &[Vec<u8>]| {
        let mut body = vec![0u8; 8];
        es.iter().for_each(|e| body.extend_from_slice(e));
        table(b"MCFG", &body)
    };
    let two = mcfg(&[entry(0x4000_0000, 0, 0, 15), entry(0x5000_0000, 1, 16, 31)]);
    let es = parse_mcfg(&two).unwrap();
    assert_eq!(es[1].ecam(), Region { base: 0x5100_0000, size: 16 << 20 });
    let over = mcfg(&[entry(0x4000_0000, 0, 0, 15), entry(0x4080_0000, 1, 0, 7)]);
    assert_eq!(parse_mcfg(&over), Err(AcpiError::Overlap { table: Signature::MCFG, what: "ECAM regions" }));
    assert!(matches!(parse_mcfg(&mcfg(&[entry(0, 0, 9, 3)])), Err(AcpiError::BadValue { .. })));
    assert!(parse_mcfg(&mcfg(&[entry(u64::MAX - 0xfff, 0, 0, 3)])).is_err());
    assert_eq!(parse_mcfg(&mcfg(&[])), Ok(vec![]));
}

/// An IORT node: type, mappings (input, count-1, output, target, flags), data.
fn iort_node(ty: u8, data: &[u8], maps: &[[u32; 5]]) -> Vec<u8> {
    let len = 16 + data.len() + 20 * maps.len();
    let mut n = vec![ty];
    n.extend_from_slice(&(len as u16).to_le_bytes());
    n.push(0);
    n.extend_from_slice(&0u32.to_le_bytes());
    n.extend_from_slice(&(maps.len() as u32).to_le_bytes());
    n.extend_from_slice(&((16 + data.len()) as u32).to_le_bytes());
    n.extend_from_slice(data);
    for m in maps {
        m.iter().for_each(|w| n.extend_from_slice(&w.to_le_bytes()));
    }
    n
}

fn iort(nodes: &[Vec<u8>]) -> Vec<u8> {
    let mut body = (nodes.len() as u32).to_le_bytes().to_vec();
    body.extend_from_slice(&48u32.to_le_bytes());
    body.extend_from_slice(&[0; 4]);
    nodes.iter().for_each(|n| body.extend_from_slice(n));
    table(b"IORT", &body)
}

/// RC → SMMUv3 → ITS with a real-looking SMMUv3 node (base, COHACC,
/// event and GERR GSIVs) and its own MSI as a single mapping.
fn iort_with_smmu() -> (Vec<u8>, u32) {
    let its_group = iort_node(IORT_ITS_GROUP, &[1, 0, 0, 0, 7, 0, 0, 0], &[]); // at 48, 24 bytes
    let smmu_off = 48 + its_group.len() as u32;
    let mut smmu_data = vec![0u8; 52];
    smmu_data[0..8].copy_from_slice(&0x0905_0000u64.to_le_bytes());
    smmu_data[8..12].copy_from_slice(&1u32.to_le_bytes()); // COHACC
    smmu_data[28..32].copy_from_slice(&106u32.to_le_bytes()); // event GSIV
    smmu_data[36..40].copy_from_slice(&109u32.to_le_bytes()); // GERR GSIV
                                                              // The SMMU's own MSI (single mapping) and its stream IDs 0x1000.. → DeviceIDs 0x20000..
    let smmu = iort_node(IORT_SMMU_V3, &smmu_data, &[[0, 0, 0x9999, 48, 1], [0x1000, 0xfff, 0x2_0000, 48, 0]]);
    let rc_off = smmu_off + smmu.len() as u32;
    let mut rc_data = vec![0u8; 20];
    rc_data[12..16].copy_from_slice(&3u32.to_le_bytes()); // segment 3
                                                          // RIDs 0x100..0x1ff → stream IDs 0x1f80.. : half falls outside the SMMU's range.
    let rc = iort_node(IORT_ROOT_COMPLEX, &rc_data, &[[0x100, 0xff, 0x1f80, smmu_off, 0]]);
    (iort(&[its_group, smmu, rc]), rc_off)
}

/// RC → SMMUv3 → ITS: the requester IDs are composed through the SMMU; the
/// SMMU node and the RC's stream mapping into it are read.
#[test]
fn iort_through_smmu() {
    let (t, rc_off) = iort_with_smmu();
    let parsed = parse_iort(&t).unwrap();
    assert_eq!(parsed.its_groups, [ItsGroup { offset: 48, its_ids: vec![7] }]);
    assert_eq!(
        parsed.root_complexes,
        [RootComplex {
            offset: rc_off,
            segment: 3,
            id_maps: vec![RcIdMap { rid_base: 0x100, count: 0x80, device_id_base: 0x2_0f80, its_group: 48 }],
            stream_maps: vec![RcStreamMap { rid_base: 0x100, count: 0x100, sid_base: 0x1f80, smmu: 72 }],
        }]
    );
    assert_eq!(
        parsed.smmus,
        [IortSmmuV3 { offset: 72, base: 0x0905_0000, coherent: true, event_gsiv: 106, gerr_gsiv: 109 }]
    );
}

/// Dom0's IORT: no SMMU node, the root complex's mapping composed straight
/// to the ITS group (at its new offset), which keeps its ITS IDs; parsed
/// back, the MSI view is what the host's was. A table without SMMUs is
/// passed on as it is.
#[test]
fn dom0_iort_hides_the_smmu() {
    let (t, _) = iort_with_smmu();
    let host = parse_iort(&t).unwrap();
    let mut out = iort_without_smmus(&t).unwrap().expect("a new IORT");
    fix(&mut out);
    let dom0 = parse_iort(&out).unwrap();
    assert!(dom0.smmus.is_empty());
    assert_eq!(dom0.its_groups, host.its_groups);
    assert_eq!(dom0.root_complexes.len(), 1);
    assert_eq!(dom0.root_complexes[0].id_maps, host.root_complexes[0].id_maps);
    assert!(dom0.root_complexes[0].stream_maps.is_empty());
    assert_eq!(dom0.root_complexes[0].segment, 3);
    let group = iort_node(IORT_ITS_GROUP, &[1, 0, 0, 0, 7, 0, 0, 0], &[]);
    let plain = iort(&[group.clone(), iort_node(IORT_ROOT_COMPLEX, &[0; 20], &[[0, 0xff, 0, 48, 0]])]);
    assert_eq!(iort_without_smmus(&plain), Ok(None));
    // A root complex with no mappings at all keeps its node.
    let bare = iort(&[group, iort_node(IORT_SMMU_V3, &[0; 52], &[]), iort_node(IORT_ROOT_COMPLEX, &[0; 20], &[])]);
    let mut out = iort_without_smmus(&bare).unwrap().unwrap();
    fix(&mut out);
    let p = parse_iort(&out).unwrap();
    assert_eq!((p.its_groups.len(), p.root_complexes.len(), p.smmus.len()), (1, 1, 0));
}

#[test]
fn iort_bad_counts_and_targets() {
    let group = iort_node(IORT_ITS_GROUP, &[1, 0, 0, 0, 0, 0, 0, 0], &[]);
    let mut t = iort(core::slice::from_ref(&group));
    t[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&0x1000_0000u32.to_le_bytes());
    fix(&mut t);
    assert_eq!(parse_iort(&t), Err(AcpiError::BadCount { table: Signature::IORT, what: "nodes" }));
    let empty_group = iort_node(IORT_ITS_GROUP, &[0; 8], &[]);
    assert!(matches!(parse_iort(&iort(&[empty_group])), Err(AcpiError::BadCount { .. })));
    let mut many_maps = iort_node(IORT_ROOT_COMPLEX, &[0; 20], &[[0, 0, 0, 48, 0]]);
    many_maps[8..12].copy_from_slice(&0xffff_ffffu32.to_le_bytes());
    assert!(matches!(parse_iort(&iort(&[group.clone(), many_maps])), Err(AcpiError::BadCount { .. })));
    let dangling = iort_node(IORT_ROOT_COMPLEX, &[0; 20], &[[0, 0xff, 0, 0x999, 0]]);
    assert!(matches!(parse_iort(&iort(&[group.clone(), dangling])), Err(AcpiError::BadValue { .. })));
    // An SMMU mapping to itself: bounded, not a stack overflow.
    let smmu_loop = iort_node(IORT_SMMU_V3, &[0; 52], &[[0, 0xff, 0, 72, 0]]);
    let rc = iort_node(IORT_ROOT_COMPLEX, &[0; 20], &[[0, 0xff, 0, 72, 0]]);
    assert!(matches!(parse_iort(&iort(&[group, smmu_loop, rc])), Err(AcpiError::BadCount { .. })));
    let zero_len = iort_node(IORT_ITS_GROUP, &[], &[]);
    let mut z = zero_len;
    z[1] = 0;
    assert!(parse_iort(&iort(&[z])).is_err());
}

#[test]
fn fadt_requirements() {
    let mut tables = host();
    let mut f = FACP.to_vec();
    f[FADT_FLAGS + 2] &= !0x10; // clear HW_REDUCED_ACPI (bit 20)
    fix(&mut f);
    let idx = tables.tables.iter().position(|t| t.signature() == Signature::FADT).unwrap();
    tables.tables[idx].data = &f;
    assert!(matches!(AcpiMachine::parse(&tables), Err(AcpiError::Unsupported { table: Signature::FADT, .. })));
    tables.tables.remove(idx);
    assert_eq!(AcpiMachine::parse(&tables), Err(AcpiError::Missing(Signature::FADT)));
}

#[test]
fn spcr_and_gtdt_values() {
    let mut s = SPCR.to_vec();
    s[40] = 1; // I/O space
    fix(&mut s);
    assert!(matches!(parse_spcr(&s), Err(AcpiError::Unsupported { .. })));
    let mut s = SPCR.to_vec();
    s[44..52].fill(0);
    fix(&mut s);
    assert!(matches!(parse_spcr(&s), Err(AcpiError::BadValue { .. })));
    // A GSIV that is no INTID gives an error when turned into a Platform.
    let mut m = AcpiMachine::parse(&host()).unwrap();
    for gsiv in [1030, 33] {
        m.gtdt.virtual_el1.gsiv = gsiv; // reserved; an SPI
        assert!(matches!(m.to_machine(vec![]), Err(AcpiError::BadValue { table: Signature::GTDT, .. })));
    }
}

/// Random corruption (checksums repaired, so the decoders see it): errors or
/// values, never a panic.
#[test]
fn randomly_corrupted_tables() {
    let mut rng = Rng(0x00ac_01da_7a5e_ed01);
    for round in 0..3000 {
        let src: &[u8] = [APIC, GTDT, SPCR, MCFG, IORT, FACP][round % 6];
        let mut t = src.to_vec();
        for _ in 0..1 + rng.index(4) {
            let i = HEADER_LEN.min(t.len() - 1) + rng.index(t.len() - HEADER_LEN);
            t[i] = rng.next() as u8;
        }
        let _ = parse_madt(&t);
        let _ = parse_gtdt(&t);
        let _ = parse_spcr(&t);
        let _ = parse_mcfg(&t);
        let _ = parse_iort(&t);
        let _ = parse_fadt(&t);
    }
    // And whole memory images with random bytes flipped.
    for _ in 0..300 {
        let mut m = MEM.to_vec();
        for _ in 0..8 {
            let i = rng.index(m.len());
            m[i] ^= 1 << rng.index(8);
        }
        if let Ok(t) = Tables::from_rsdp(&mem(&m), RSDP_ADDR) {
            let _ = AcpiMachine::parse(&t).map(|a| a.to_machine(vec![]));
        }
    }
}

// ------------------------------------------------------------ Dom0 tables

const DOM0_BASE: u64 = 0x4800_0000;

#[test]
fn dom0_tables_parse_back() {
    let host = host();
    let vcpus = vec![0x0, 0x1, 0x100];
    let cfg = Dom0AcpiConfig {
        vcpu_mpidrs: vcpus.clone(),
        base: DOM0_BASE,
        remove: vec![Signature(*b"DBG2")],
        ..Default::default()
    };
    let d = build_dom0_tables(&host, &cfg).unwrap();
    let mems = [MemImage { base: MEM_BASE, bytes: MEM }, MemImage { base: DOM0_BASE, bytes: &d.blob }];
    // Every checksum is checked on the way.
    let t = Tables::from_rsdp(&mems[..], d.rsdp).unwrap();
    assert_eq!(t.rsdp.xsdt_addr, d.xsdt);
    assert_eq!(t.find(Signature::FADT).unwrap().addr, d.fadt);
    assert_eq!(t.find(Signature::MADT).unwrap().addr, d.madt);
    assert!(t.find(Signature(*b"DBG2")).is_none());
    // Untouched host tables are passed on by address, the DSDT through the FADT.
    for sig in [Signature::GTDT, Signature::MCFG, Signature::SPCR, Signature::IORT, Signature::DSDT] {
        assert_eq!(t.find(sig), host.find(sig), "{sig}");
    }
    let stao = t.find(Signature::STAO).unwrap();
    assert_eq!(stao.addr, d.stao);
    assert!(stao_hides_uart(stao.data));

    let m = AcpiMachine::parse(&t).unwrap();
    assert_eq!(m.fadt.psci_method(), Some("hvc"));
    assert!(m.fadt.hw_reduced());
    assert_eq!(m.madt.giccs.iter().map(|g| g.mpidr).collect::<Vec<_>>(), vcpus);
    assert!(m.madt.giccs.iter().enumerate().all(|(i, g)| g.acpi_processor_uid == i as u32
        && g.cpu_interface_number == i as u32
        && g.flags == GICC_ENABLED
        && g.vgic_maint_gsiv == 0));
    let hm = AcpiMachine::parse(&host).unwrap();
    assert_eq!((m.madt.gicd, &m.madt.gicr_ranges, &m.madt.its), (hm.madt.gicd, &hm.madt.gicr_ranges, &hm.madt.its));
    assert_eq!(m.madt.gic_version, hm.madt.gic_version);
    assert_eq!(m.to_machine(vec![]).unwrap().cpus, vcpus);
}

#[test]
fn dom0_per_cpu_gicr_and_errors() {
    // A host MADT without GICR structures: vCPU i gets host GICC i's GICR base.
    let host_madt = madt(&[gicd(0x800_0000, 3), gicc(0, 1, 0x80a_0000), gicc(1, 1, 0x80c_0000)]);
    let mut tables = host();
    let idx = tables.tables.iter().position(|t| t.signature() == Signature::MADT).unwrap();
    tables.tables[idx].data = &host_madt;
    let cfg = |v: Vec<u64>| Dom0AcpiConfig { vcpu_mpidrs: v, base: DOM0_BASE, remove: vec![], ..Default::default() };
    let d = build_dom0_tables(&tables, &cfg(vec![0x10, 0x11])).unwrap();
    let mems = [MemImage { base: MEM_BASE, bytes: MEM }, MemImage { base: DOM0_BASE, bytes: &d.blob }];
    let t = Tables::from_rsdp(&mems[..], d.rsdp).unwrap();
    let m = parse_madt(t.find(Signature::MADT).unwrap().data).unwrap();
    assert_eq!(
        m.giccs.iter().map(|g| (g.mpidr, g.gicr_base)).collect::<Vec<_>>(),
        [(0x10, 0x80a_0000), (0x11, 0x80c_0000)]
    );
    assert!(matches!(build_dom0_tables(&tables, &cfg(vec![0, 1, 2])), Err(AcpiError::BadCount { .. })));
    assert!(matches!(build_dom0_tables(&tables, &cfg(vec![])), Err(AcpiError::BadCount { .. })));
    // A GICv4 host's frames are 256 KiB apart; the vGIC's stay GICv3
    // frames from the first one, and Dom0's MADT says where they are.
    let v4_madt = madt(&[gicd(0x800_0000, 4), gicc(0, 1, 0x80a_0000), gicc(1, 1, 0x80e_0000), gicc(2, 1, 0x812_0000)]);
    tables.tables[idx].data = &v4_madt;
    let d = build_dom0_tables(&tables, &cfg(vec![0x10, 0x11])).unwrap();
    let mems = [MemImage { base: MEM_BASE, bytes: MEM }, MemImage { base: DOM0_BASE, bytes: &d.blob }];
    let t = Tables::from_rsdp(&mems[..], d.rsdp).unwrap();
    let m = parse_madt(t.find(Signature::MADT).unwrap().data).unwrap();
    assert_eq!(m.giccs.iter().map(|g| g.gicr_base).collect::<Vec<_>>(), [0x80a_0000, 0x80c_0000]);
    tables.tables[idx].data = &host_madt;
    assert!(matches!(build_dom0_tables(&tables, &cfg(vec![1, 1])), Err(AcpiError::Overlap { .. })));
    let no_spcr = Dom0AcpiConfig { remove: vec![Signature::SPCR], ..cfg(vec![0]) };
    assert!(matches!(build_dom0_tables(&tables, &no_spcr), Err(AcpiError::Unsupported { .. })));
}

/// A host with two GICR regions (QEMU virt with more than 123 CPUs): Dom0's
/// MADT keeps only the first, where the vGIC emulates its redistributors.
#[test]
fn dom0_madt_keeps_the_first_gicr_region_only() {
    let host_madt = madt(&[
        gicd(0x800_0000, 3),
        gicc(0, 1, 0),
        gicr(0x80a_0000, 0xf6_0000),
        gicr(0x40_0000_0000, 0x400_0000),
        its(0, 0x808_0000),
    ]);
    let mut tables = host();
    let idx = tables.tables.iter().position(|t| t.signature() == Signature::MADT).unwrap();
    tables.tables[idx].data = &host_madt;
    assert_eq!(parse_madt(&host_madt).unwrap().gicr_ranges.len(), 2);
    let cfg = Dom0AcpiConfig { vcpu_mpidrs: vec![0, 1], base: DOM0_BASE, remove: vec![], ..Default::default() };
    let d = build_dom0_tables(&tables, &cfg).unwrap();
    let mems = [MemImage { base: MEM_BASE, bytes: MEM }, MemImage { base: DOM0_BASE, bytes: &d.blob }];
    let t = Tables::from_rsdp(&mems[..], d.rsdp).unwrap();
    let m = parse_madt(t.find(Signature::MADT).unwrap().data).unwrap();
    assert_eq!(m.gicr_ranges, [Region { base: 0x80a_0000, size: 0xf6_0000 }]);
    assert_eq!(m.its.len(), 1);
    assert_eq!(m.giccs.len(), 2);
}

/// ACPI 6.5 GICCs are 82 bytes: Dom0's are written the host's length.
#[test]
fn dom0_gicc_length_follows_host() {
    let mut g = gicc(0, 1, 0);
    g.extend_from_slice(&[0, 0]);
    g[1] = 82;
    let host_madt = madt(&[gicd(0x800_0000, 3), g, gicr(0x80a_0000, 0x4_0000)]);
    let mut tables = host();
    let idx = tables.tables.iter().position(|t| t.signature() == Signature::MADT).unwrap();
    tables.tables[idx].data = &host_madt;
    let cfg = Dom0AcpiConfig { vcpu_mpidrs: vec![0, 1], base: DOM0_BASE, remove: vec![], ..Default::default() };
    let d = build_dom0_tables(&tables, &cfg).unwrap();
    let mems = [MemImage { base: MEM_BASE, bytes: MEM }, MemImage { base: DOM0_BASE, bytes: &d.blob }];
    let t = Tables::from_rsdp(&mems[..], d.rsdp).unwrap();
    let data = t.find(Signature::MADT).unwrap().data;
    let giccs: Vec<_> = super::tables::madt_entries(data).unwrap().into_iter().filter(|e| e.0 == MADT_GICC).collect();
    assert_eq!(giccs.iter().map(|e| e.2.len()).collect::<Vec<_>>(), [82, 82]);
    assert_eq!(parse_madt(data).unwrap().giccs.len(), 2);
}

#[test]
fn dom0_tables_keep_uart_and_drop_its() {
    let cfg =
        Dom0AcpiConfig { vcpu_mpidrs: vec![0], base: DOM0_BASE, keep_uart: true, drop_its: true, ..Default::default() };
    let d = build_dom0_tables(&host(), &cfg).unwrap();
    let mems = [MemImage { base: MEM_BASE, bytes: MEM }, MemImage { base: DOM0_BASE, bytes: &d.blob }];
    let t = Tables::from_rsdp(&mems[..], d.rsdp).unwrap();
    assert!(!stao_hides_uart(t.find(Signature::STAO).unwrap().data));
    let madt = parse_madt(t.find(Signature::MADT).unwrap().data).unwrap();
    assert!(madt.its.is_empty());
    assert!(!madt.gicr_ranges.is_empty());
    // The default still hides the UART and keeps the ITS.
    let d = build_dom0_tables(&host(), &Dom0AcpiConfig { keep_uart: false, drop_its: false, ..cfg }).unwrap();
    let mems = [MemImage { base: MEM_BASE, bytes: MEM }, MemImage { base: DOM0_BASE, bytes: &d.blob }];
    let t = Tables::from_rsdp(&mems[..], d.rsdp).unwrap();
    assert!(stao_hides_uart(t.find(Signature::STAO).unwrap().data));
    assert_eq!(parse_madt(t.find(Signature::MADT).unwrap().data).unwrap().its.len(), 1);
}
