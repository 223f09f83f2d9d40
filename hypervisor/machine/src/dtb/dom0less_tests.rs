//! Host tests of the dom0less parser, on trees built here with `vm-fdt` and
//! on QEMU's own DTB with DomU nodes grafted into its `/chosen`.

use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use fdt::Fdt;
use vm_fdt::FdtWriter;

use super::{parse, DomainError, DomainProblem, NodeName};
use crate::domain::*;
use crate::dtb::{build_guest_dtb, default_removals, discover, DtbError, GuestDtbConfig};
use crate::region::Region;
use crate::testrng::Rng;

const MIB: u64 = 1 << 20;

/// A property value.
enum V<'a> {
    U32(u32),
    U64(u64),
    Cells(&'a [u32]),
    Str(&'a str),
    Strs(&'a [&'a str]),
    Empty,
    Raw(&'a [u8]),
}

fn put(w: &mut FdtWriter, name: &str, v: &V<'_>) {
    match v {
        V::U32(x) => w.property_u32(name, *x),
        V::U64(x) => w.property_u64(name, *x),
        V::Cells(c) => w.property_array_u32(name, c),
        V::Str(s) => w.property_string(name, s),
        V::Strs(s) => w.property_string_list(name, s.iter().map(|s| s.to_string()).collect()),
        V::Empty => w.property_null(name),
        V::Raw(b) => w.property(name, b),
    }
    .unwrap();
}

/// A module child: name, then properties.
type Module<'a> = (&'a str, Vec<(&'a str, V<'a>)>);

fn kernel_at(base: u64, size: u64, bootargs: Option<&'static str>) -> Module<'static> {
    let mut p = vec![
        ("compatible", V::Strs(&["multiboot,kernel", "multiboot,module"])),
        ("reg", V::Raw(Vec::leak([base.to_be_bytes(), size.to_be_bytes()].concat()))),
    ];
    if let Some(b) = bootargs {
        p.push(("bootargs", V::Str(b)));
    }
    ("module@k", p)
}

fn ramdisk_at(base: u64, size: u64) -> Module<'static> {
    let reg = Vec::leak([base.to_be_bytes(), size.to_be_bytes()].concat());
    ("module@r", vec![("compatible", V::Strs(&["multiboot,ramdisk", "multiboot,module"])), ("reg", V::Raw(reg))])
}

/// A domain node under `/chosen`.
fn domu(w: &mut FdtWriter, name: &str, props: &[(&str, V<'_>)], modules: &[Module<'_>]) {
    let n = w.begin_node(name).unwrap();
    for (k, v) in props {
        put(w, k, v);
    }
    for (mname, mprops) in modules {
        let m = w.begin_node(mname).unwrap();
        for (k, v) in mprops {
            put(w, k, v);
        }
        w.end_node(m).unwrap();
    }
    w.end_node(n).unwrap();
}

/// A root with 2/2 cells and a `/chosen` that `chosen` fills.
fn tree(chosen: impl FnOnce(&mut FdtWriter)) -> Vec<u8> {
    let mut w = FdtWriter::new().unwrap();
    let root = w.begin_node("").unwrap();
    w.property_u32("#address-cells", 2).unwrap();
    w.property_u32("#size-cells", 2).unwrap();
    let c = w.begin_node("chosen").unwrap();
    w.property_string("bootargs", "dom0_mem=512M").unwrap();
    chosen(&mut w);
    w.end_node(c).unwrap();
    w.end_node(root).unwrap();
    w.finish().unwrap()
}

/// The usual domain: 256 MiB (as Xen writes it, two cells), 1 vCPU, vpl011.
fn basic() -> (Vec<(&'static str, V<'static>)>, Vec<Module<'static>>) {
    (
        vec![
            ("compatible", V::Str("xen,domain")),
            ("memory", V::Cells(&[0, 256 * 1024])),
            ("cpus", V::U32(1)),
            ("vpl011", V::Empty),
        ],
        vec![kernel_at(0x7000_0000, 0x1a0_0000, Some("console=ttyAMA0")), ramdisk_at(0x7200_0000, 0x500_0000)],
    )
}

/// One domain `domU1` with `basic` properties, `edit` applied.
fn one(edit: impl FnOnce(&mut Vec<(&'static str, V<'static>)>, &mut Vec<Module<'static>>)) -> Vec<u8> {
    let (mut p, mut m) = basic();
    edit(&mut p, &mut m);
    tree(|w| domu(w, "domU1", &p, &m))
}

fn set(props: &mut Vec<(&'static str, V<'static>)>, name: &'static str, v: Option<V<'static>>) {
    props.retain(|(k, _)| *k != name);
    if let Some(v) = v {
        props.push((name, v));
    }
}

fn problem(dtb: &[u8]) -> DomainProblem {
    match parse(dtb) {
        Err(DtbError::Domain(e)) => e.problem,
        other => panic!("expected a domain error, got {other:?}"),
    }
}

#[test]
fn two_domains_as_xen_describes_them() {
    let dtb = tree(|w| {
        let (p, m) = basic();
        domu(w, "domU1", &p, &m);
        // Not a domain: ignored.
        domu(w, "module@40000000", &[("compatible", V::Str("multiboot,module"))], &[]);
        // 1+1 cells on the domain node, memory in one cell, bootargs on
        // the node, our own properties, unknown ones ignored.
        domu(
            w,
            "web",
            &[
                ("compatible", V::Str("xen,domain")),
                ("#address-cells", V::U32(1)),
                ("#size-cells", V::U32(1)),
                ("memory", V::U32(512 * 1024)),
                ("cpus", V::U32(2)),
                ("bootargs", V::Str("console=ttyAMA0 quiet")),
                ("hv,sched-weight", V::U32(512)),
                ("hv,sched-cap", V::U32(150)),
                ("hv,disk-size", V::U64(64 * MIB)),
                ("xen,enhanced", V::Str("enabled")),
                ("direct-map", V::Empty),
            ],
            &[
                (
                    "module@78000000",
                    vec![("compatible", V::Str("multiboot,kernel")), ("reg", V::Cells(&[0x7800_0000, 0x100_0000]))],
                ),
                (
                    "module@7a000000",
                    vec![("compatible", V::Str("multiboot,device-tree")), ("reg", V::Cells(&[0x7a00_0000, 0x1000]))],
                ),
            ],
        );
        // Disabled: ignored, and takes no id.
        let (mut p, m) = basic();
        p.push(("status", V::Str("disabled")));
        domu(w, "domU9", &p, &m);
        domu(
            w,
            "domU3",
            &[
                ("compatible", V::Str("xen,domain")),
                ("memory", V::Cells(&[0, 128 * 1024])),
                ("cpus", V::U32(1)),
                ("hv,disk-size", V::U32(1 << 20)),
                ("hv,sched-cap", V::U32(0)),
            ],
            &[kernel_at(0x7900_0000, 0x10_0000, None)],
        );
    });
    let d = parse(&dtb).unwrap();
    assert_eq!(d.len(), 3);
    assert_eq!(
        d[0],
        VmSpec {
            id: 1,
            name: "domU1".into(),
            memory: 256 * MIB,
            vcpus: 1,
            vpl011: true,
            kernel: Region { base: 0x7000_0000, size: 0x1a0_0000 },
            ramdisk: Some(Region { base: 0x7200_0000, size: 0x500_0000 }),
            bootargs: "console=ttyAMA0".into(),
            weight: DEFAULT_WEIGHT,
            cap_percent: None,
            disk_size: 0,
            heap_quota: crate::quota::DEFAULT_DOMU_HEAP_QUOTA,
            kernel_load_addr: None,
            pin_vcpus: false,
            cpus: alloc::vec::Vec::new(),
            pci: Vec::new(),
        }
    );
    assert_eq!(
        d[1],
        VmSpec {
            id: 2,
            name: "web".into(),
            memory: 512 * MIB,
            vcpus: 2,
            vpl011: false,
            kernel: Region { base: 0x7800_0000, size: 0x100_0000 },
            ramdisk: None,
            bootargs: "console=ttyAMA0 quiet".into(),
            weight: 512,
            cap_percent: Some(150),
            disk_size: 64 * MIB,
            heap_quota: crate::quota::DEFAULT_DOMU_HEAP_QUOTA,
            kernel_load_addr: None,
            pin_vcpus: false,
            cpus: alloc::vec::Vec::new(),
            pci: Vec::new(),
        }
    );
    assert_eq!((d[2].id, d[2].name.as_str(), d[2].memory, d[2].disk_size), (3, "domU3", 128 * MIB, MIB));
    assert_eq!((d[2].cap_percent, d[2].bootargs.as_str()), (None, ""));
}

#[test]
fn no_domains_is_an_empty_list() {
    assert_eq!(parse(&tree(|_| {})).unwrap(), []);
    let mut w = FdtWriter::new().unwrap();
    let root = w.begin_node("").unwrap();
    w.end_node(root).unwrap();
    assert_eq!(parse(&w.finish().unwrap()).unwrap(), []);
}

#[test]
fn bad_domains_are_typed_errors_naming_the_node() {
    use DomainProblem as P;
    let cases: Vec<(Vec<u8>, DomainProblem)> = vec![
        (one(|_, m| m.retain(|(n, _)| *n != "module@k")), P::NoKernel),
        (one(|p, _| set(p, "memory", None)), P::Missing("memory")),
        (one(|p, _| set(p, "cpus", None)), P::Missing("cpus")),
        (one(|p, _| set(p, "memory", Some(V::Cells(&[0, 0])))), P::ZeroMemory),
        (one(|p, _| set(p, "memory", Some(V::U32(0)))), P::ZeroMemory),
        (one(|p, _| set(p, "memory", Some(V::U64(u64::MAX)))), P::MemoryTooLarge { kib: u64::MAX }),
        (one(|p, _| set(p, "memory", Some(V::Raw(&[0, 1, 0])))), P::BadValue("memory")),
        (one(|p, _| set(p, "memory", Some(V::Cells(&[0, 0, 1])))), P::BadValue("memory")),
        (one(|p, _| set(p, "cpus", Some(V::U32(0)))), P::ZeroCpus),
        (one(|p, _| set(p, "cpus", Some(V::U32(257)))), P::TooManyCpus(257)),
        (one(|p, _| set(p, "cpus", Some(V::U64(1)))), P::BadValue("cpus")),
        (one(|p, _| set(p, "hv,sched-weight", Some(V::U32(0)))), P::BadValue("hv,sched-weight (1..=65535)")),
        (one(|p, _| set(p, "hv,sched-weight", Some(V::U32(70000)))), P::BadValue("hv,sched-weight (1..=65535)")),
        (one(|p, _| set(p, "hv,sched-cap", Some(V::U32(101)))), P::BadValue("hv,sched-cap (at most 100 per vCPU)")),
        (one(|p, _| set(p, "hv,disk-size", Some(V::U32(1000)))), P::BadValue("hv,disk-size (whole 512-byte sectors)")),
        (one(|p, _| set(p, "hv,disk-size", Some(V::Str("huge!")))), P::BadValue("hv,disk-size")),
        (one(|_, m| m.push(kernel_at(0x7a00_0000, 0x1000, None))), P::DuplicateModule("kernel")),
        (one(|_, m| m.push(ramdisk_at(0x7a00_0000, 0x1000))), P::DuplicateModule("ramdisk")),
        (one(|_, m| m[0] = kernel_at(0x7000_0000, 0, None)), P::EmptyModule("kernel")),
        (one(|_, m| m[1] = ramdisk_at(u64::MAX - 0xfff, 0x2000)), P::ModuleWraps("ramdisk")),
        (
            one(|_, m| m[1] = ramdisk_at(0x7100_0000, 0x200_0000)),
            P::ModulesOverlap {
                kernel: Region { base: 0x7000_0000, size: 0x1a0_0000 },
                ramdisk: Region { base: 0x7100_0000, size: 0x200_0000 },
            },
        ),
        // Two regions, or a reg in the wrong cells.
        (
            one(|_, m| m[0].1[1] = ("reg", V::Raw(Vec::leak([1u64, 2, 3, 4].map(u64::to_be_bytes).concat())))),
            P::BadValue("module reg (one region in the domain's cells)"),
        ),
        (
            one(|_, m| m[0].1[1] = ("reg", V::Cells(&[0x7000_0000, 0x1000]))),
            P::BadValue("module reg (one region in the domain's cells)"),
        ),
        (one(|_, m| m[0].1.retain(|(k, _)| *k != "reg")), P::Missing("module reg")),
    ];
    for (n, (dtb, want)) in cases.iter().enumerate() {
        assert_eq!(problem(dtb), *want, "case {n}");
    }
    // The error names the node and the id it would have had.
    let dtb = tree(|w| {
        let (p, m) = basic();
        domu(w, "domU1", &p, &m);
        domu(w, "domU2", &[("compatible", V::Str("xen,domain")), ("memory", V::U32(1024)), ("cpus", V::U32(1))], &[]);
    });
    let Err(DtbError::Domain(e)) = parse(&dtb) else { panic!("domU2 has no kernel") };
    assert_eq!(e, DomainError { id: 2, name: NodeName::new("domU2"), problem: DomainProblem::NoKernel });
    assert_eq!(
        DtbError::Domain(e).to_string(),
        "dom0less domain /chosen/domU2 (d2): no module with compatible \"multiboot,kernel\""
    );
    // Discovery stops on it too (the boot's one fatal line).
    let host = graft(V3_SMP2, |w| domu(w, "domU2", &[("compatible", V::Str("xen,domain")), ("cpus", V::U32(1))], &[]));
    assert_eq!(discover(&host).unwrap_err().to_string(), "dom0less domain /chosen/domU2 (d1): no memory");
}

#[test]
fn too_many_domains() {
    let dtb = tree(|w| {
        for i in 0..=super::MAX_DOMUS {
            let (p, m) = basic();
            domu(w, &alloc::format!("domU{}", i + 1), &p, &m);
        }
    });
    assert_eq!(problem(&dtb), DomainProblem::TooManyDomains);
}

#[test]
fn long_node_names_are_cut_on_a_char_boundary() {
    let n = NodeName::new("dömU-with-a-name-far-longer-than-thirty-two-bytes");
    assert!(n.as_str().len() <= 32 && "dömU-with-a-name-far-longer-than-thirty-two-bytes".starts_with(n.as_str()));
    assert_eq!(NodeName::new("domU1").as_str(), "domU1");
}

const V3_SMP2: &[u8] = include_bytes!("../dtb/testdata/qemu-virt-gicv3-smp2.dtb");

/// A copy of `blob` with `extra` writing more children at the end of `/chosen`.
fn graft(blob: &[u8], extra: impl Fn(&mut FdtWriter)) -> Vec<u8> {
    fn copy(w: &mut FdtWriter, n: fdt::node::FdtNode<'_, '_>, at: &str, extra: &dyn Fn(&mut FdtWriter)) {
        let node = w.begin_node(if at == "/" { "" } else { n.name }).unwrap();
        for p in n.properties() {
            w.property(p.name, p.value).unwrap();
        }
        for c in n.children() {
            let sub = if at == "/" { alloc::format!("/{}", c.name) } else { alloc::format!("{at}/{}", c.name) };
            copy(w, c, &sub, extra);
        }
        if at == "/chosen" {
            extra(w);
        }
        w.end_node(node).unwrap();
    }
    let f = Fdt::new(blob).unwrap();
    let mut w = FdtWriter::new().unwrap();
    copy(&mut w, f.all_nodes().next().unwrap(), "/", &extra);
    w.finish().unwrap()
}

#[test]
fn discovery_carries_the_domus_and_dom0_does_not_see_them() {
    let host = graft(V3_SMP2, |w| {
        let (p, m) = basic();
        domu(w, "domU1", &p, &m);
        domu(w, "domU2", &p, &m);
    });
    let (plat, boot) = discover(&host).unwrap();
    assert_eq!(boot.domus.len(), 2);
    assert_eq!(boot.domus, parse(&host).unwrap());
    assert_eq!(boot.domus[1].id, 2);
    // Dom0's own modules are unchanged by the DomU modules beside them.
    assert_eq!(boot.kernel.as_ref().map(|k| k.base), Some(0x5000_0000));
    assert_eq!(boot.ramdisk.as_ref().map(|k| k.base), Some(0x5800_0000));
    let (without, without_boot) = discover(V3_SMP2).unwrap();
    assert_eq!(without_boot.domus, []);
    assert_eq!(plat, without);
    assert_eq!(crate::dtb::BootInfo { domus: Vec::new(), ..boot }, without_boot);
    // Dom0's DTB: no xen,domain node left under /chosen.
    let cfg = GuestDtbConfig {
        memory: Region { base: 0x6000_0000, size: 0x2000_0000 },
        vcpu_mpidrs: vec![0],
        bootargs: "console=ttyAMA0".to_string(),
        remove_paths: default_removals(&host, false).unwrap(),
        ..Default::default()
    };
    let guest = build_guest_dtb(&host, &cfg).unwrap();
    let f = Fdt::new(&guest).unwrap();
    let chosen: Vec<String> = f.find_node("/chosen").unwrap().children().map(|c| c.name.to_string()).collect();
    assert!(chosen.is_empty(), "{chosen:?}");
    assert_eq!(parse(&guest).unwrap(), []);
}

#[test]
fn corrupted_domain_trees_never_panic() {
    let host = graft(V3_SMP2, |w| {
        let (p, m) = basic();
        domu(w, "domU1", &p, &m);
    });
    let mut rng = Rng(0xd0d0_1e55_5151);
    for _ in 0..3000 {
        let mut b = host.clone();
        for _ in 0..1 + rng.index(6) {
            let i = rng.index(b.len());
            b[i] = rng.next() as u8;
        }
        let _ = parse(&b);
        let _ = discover(&b);
    }
    for len in (0..host.len()).step_by(7) {
        assert!(parse(&host[..len]).is_err());
    }
}

#[test]
fn the_boot_log_lines() {
    let (p, m) = basic();
    let d = &parse(&tree(|w| domu(w, "domU1", &p, &m))).unwrap()[0];
    assert_eq!(
        d.to_string(),
        "domU1 (d1): 256 MiB, 1 vCPU, kernel 0x70000000 (27262976 bytes), ramdisk 0x72000000 (83886080 bytes), \
         weight 256, cap none, no disk, vpl011, bootargs \"console=ttyAMA0\""
    );
    let d = VmSpec { vcpus: 2, ramdisk: None, cap_percent: Some(25), disk_size: 64 * MIB, vpl011: false, ..d.clone() };
    assert!(d.to_string().contains(" 2 vCPUs, "), "{d}");
    assert!(d.to_string().contains(", no ramdisk, weight 256, cap 25%, disk 64 MiB, bootargs"), "{d}");
    let p = DomuPlacement {
        id: 1,
        ram: Region { base: 0xb000_0000, size: 256 * MIB },
        disk: Some(Region { base: 0xac00_0000, size: 64 * MIB }),
    };
    assert_eq!(p.to_string(), "d1: RAM 0xb0000000-0xc0000000, disk 0xac000000-0xb0000000");
    assert_eq!(DomuPlacement { disk: None, ..p }.to_string(), "d1: RAM 0xb0000000-0xc0000000, no disk");
}

#[test]
fn hv_kernel_load_addr_makes_the_kernel_a_raw_binary() {
    let d = parse(&one(|_, _| ())).unwrap();
    assert_eq!(d[0].kernel_load_addr, None);
    let d = parse(&one(|p, _| set(p, "hv,kernel-load-addr", Some(V::U64(0x4008_0000))))).unwrap();
    assert_eq!(d[0].kernel_load_addr, Some(0x4008_0000));
    assert!(d[0].to_string().contains("raw kernel at 0x40080000"), "{}", d[0]);
    let d = parse(&one(|p, _| set(p, "hv,kernel-load-addr", Some(V::U32(0x4000_0000))))).unwrap();
    assert_eq!(d[0].kernel_load_addr, Some(0x4000_0000));
    assert_eq!(
        problem(&one(|p, _| set(p, "hv,kernel-load-addr", Some(V::U32(0x4000_0800))))),
        DomainProblem::BadValue("hv,kernel-load-addr (4 KiB aligned)")
    );
    assert_eq!(
        problem(&one(|p, _| set(p, "hv,kernel-load-addr", Some(V::Str("x"))))),
        DomainProblem::BadValue("hv,kernel-load-addr")
    );
}
