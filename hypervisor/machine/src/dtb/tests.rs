//! Host tests against real QEMU DTBs and FVP-like trees (built at the end
//! of this file with `vm-fdt`).
//!
//! The fixtures in `testdata/` were dumped by QEMU 7.2 (Debian) with
//!
//! ```text
//! qemu-system-aarch64 -machine virt,virtualization=on,gic-version=G,dumpdtb=F \
//!   -cpu max -smp N -m 1G \
//!   -device guest-loader,addr=0x50000000,kernel=/etc/hostname,bootargs="console=ttyAMA0 root=x" \
//!   -device guest-loader,addr=0x58000000,initrd=/etc/hostname \
//!   -device virtio-blk-device,drive=d0 -drive if=none,id=d0,file=/tmp/x.img,format=raw -nographic
//! dtc -I dtb -O dtb -o testdata/qemu-virt-gicvG-smpN.dtb F
//! ```
//!
//! for (G, N) = (3, 2) and (4, 4); the `dtc` pass only drops QEMU's padding
//! to 1 MiB (the decompiled sources are identical).

use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use fdt::Fdt;

use super::*;
use crate::testrng::Rng;

/// A raw INTID the test knows is valid.
fn id(v: u32) -> IntId {
    IntId::try_from(v).unwrap()
}

const V3_SMP2: &[u8] = include_bytes!("testdata/qemu-virt-gicv3-smp2.dtb");
const V4_SMP4: &[u8] = include_bytes!("testdata/qemu-virt-gicv4-smp4.dtb");
/// What a firmware boot (`cargo xtask run --firmware tf-a`) hands over: QEMU's
/// DTB for `virt,secure=on,virtualization=on,gic-version=3`, `-smp 2 -m 1G`
/// and the two guest-loader modules above, dumped and then given
/// `fdtput -t s F /chosen xen,xen-bootargs "dom0_mem=512M dom0_max_vcpus=2 loglvl=debug"`
/// and `fdtput -t s F /chosen bootargs "console=hvc0 not-for-the-hypervisor"`
/// (then `dtc -I dtb -O dtb`, as above).
const SECURE_XEN_BOOTARGS: &[u8] = include_bytes!("testdata/qemu-virt-secure-xen-bootargs.dtb");
/// QEMU 10.0 `-machine virt,gic-version=3,virtualization=on,iommu=smmuv3`:
/// the PCIe root complex behind an SMMUv3.
const V3_SMMUV3: &[u8] = include_bytes!("testdata/qemu-virt-gicv3-smmuv3.dtb");

fn check_qemu_platform((p, boot): &(Machine, BootInfo), ncpus: usize) {
    assert_eq!(p.memory, vec![Region { base: 0x4000_0000, size: 0x4000_0000 }]);
    assert_eq!(p.cpus, (0..ncpus as u64).collect::<Vec<_>>());
    assert_eq!(p.gic.version, 3);
    assert_eq!(p.gic.gicd, Region { base: 0x0800_0000, size: 0x1_0000 });
    assert_eq!(p.gic.gicr.len(), 1);
    assert_eq!(p.gic.gicr[0].base, 0x080a_0000);
    assert_eq!(p.gic.its, Some(Region { base: 0x0808_0000, size: 0x2_0000 }));
    assert_eq!(p.gic.maintenance_intid, Some(id(25)));
    assert!(p.gic.phandle.is_some());
    let uart = p.uart.as_ref().expect("uart");
    assert_eq!((uart.base, uart.size, uart.intid), (0x0900_0000, 0x1000, id(33)));
    assert_eq!(uart.path, "/pl011@9000000");
    assert_eq!(uart.compatible, "arm,pl011");
    assert_eq!(p.timer, TimerInfo { phys_intid: id(30), virt_intid: id(27), hyp_intid: id(26) });
    assert_eq!(p.pmu_intid, Some(id(23)), "QEMU's arm,armv8-pmuv3 node: PPI 7");
    assert_eq!(p.virtio_mmio.len(), 32);
    let blk = p.virtio_mmio.iter().find(|d| d.base == 0x0a00_3e00).expect("virtio slot 31");
    assert_eq!((blk.size, blk.intid, blk.edge), (0x200, id(79), true));
    assert_eq!(blk.path, "/virtio_mmio@a003e00");
    assert_eq!(p.virtio_mmio[0].base, 0x0a00_0000);
    assert_eq!(p.virtio_mmio[0].intid, id(48));
    assert_eq!(p.psci_method.as_deref(), Some("smc"));
    assert_eq!(boot.bootargs, None);
    let k = boot.kernel.as_ref().expect("kernel module");
    assert_eq!(k.base, 0x5000_0000);
    assert!(k.size > 0);
    assert_eq!(k.bootargs.as_deref(), Some("console=ttyAMA0 root=x"));
    let rd = boot.ramdisk.as_ref().expect("ramdisk module");
    assert_eq!(rd.base, 0x5800_0000);
    assert_eq!(rd.bootargs, None);
    assert!(p.reserved.is_empty());
}

#[test]
fn discover_qemu_gicv3_smp2() {
    check_qemu_platform(&discover(V3_SMP2).unwrap(), 2);
}

#[test]
fn discover_qemu_gicv4_smp4() {
    check_qemu_platform(&discover(V4_SMP4).unwrap(), 4);
}

#[test]
fn the_hypervisor_reads_xen_bootargs_first_and_keeps_them_from_dom0() {
    let (p, boot) = discover(SECURE_XEN_BOOTARGS).unwrap();
    assert_eq!(boot.bootargs.as_deref(), Some("dom0_mem=512M dom0_max_vcpus=2 loglvl=debug"));
    // secure=on adds a secure-only UART (status "disabled"); the console stays UART0.
    assert_eq!(p.uart.as_ref().map(|u| u.base), Some(0x0900_0000));
    assert_eq!(boot.kernel.as_ref().map(|k| k.base), Some(0x5000_0000));
    assert_eq!(boot.ramdisk.as_ref().map(|r| r.base), Some(0x5800_0000));
    assert_eq!(p.cpus, [0, 1]);
    // Without xen,xen-bootargs: /chosen/bootargs.
    let cfg = guest_config(V3_SMP2);
    assert_eq!(
        discover(&build_guest_dtb(V3_SMP2, &cfg).unwrap()).unwrap().1.bootargs.as_deref(),
        Some(cfg.bootargs.as_str())
    );
    // Dom0's DTB has its own bootargs and not the hypervisor's options.
    let cfg = guest_config(SECURE_XEN_BOOTARGS);
    let out = build_guest_dtb(SECURE_XEN_BOOTARGS, &cfg).unwrap();
    let f = Fdt::new(&out).unwrap();
    let chosen = f.find_node("/chosen").unwrap();
    assert_eq!(chosen.property("bootargs").unwrap().as_str(), Some(cfg.bootargs.as_str()));
    assert!(chosen.property("xen,xen-bootargs").is_none());
}

#[test]
fn discover_accepts_padding_like_qemu_writes() {
    // QEMU's own dump is the tree plus zeroes up to 1 MiB in totalsize.
    let mut padded = V3_SMP2.to_vec();
    padded.resize(64 * 1024, 0);
    padded[4..8].copy_from_slice(&(64u32 * 1024).to_be_bytes());
    assert_eq!(discover(&padded).unwrap(), discover(V3_SMP2).unwrap());
}

fn guest_config(host: &[u8]) -> GuestDtbConfig {
    GuestDtbConfig {
        memory: Region { base: 0x4800_0000, size: 0x1000_0000 },
        vcpu_mpidrs: vec![0, 1],
        bootargs: "console=ttyAMA0 earlycon rdinit=/init".to_string(),
        initrd: Some(Region { base: 0x5000_0000, size: 0x0123_4000 }),
        remove_paths: default_removals(host, false).unwrap(),
        extra_virtio_mmio: vec![MmioDevice {
            base: 0x0a00_4000,
            size: 0x200,
            intid: id(80),
            edge: true,
            path: String::new(),
        }],
        keep_its: false,
        ipa_size: Some(1 << 39),
        pci_carves: Vec::new(),
        control: None,
    }
}

/// Every node path in a (valid) tree, depth first.
fn all_paths(dtb: &[u8]) -> Vec<String> {
    fn walk(n: fdt::node::FdtNode<'_, '_>, path: &str, out: &mut Vec<String>) {
        out.push(path.to_string());
        for c in n.children() {
            let p = if path == "/" { alloc::format!("/{}", c.name) } else { alloc::format!("{path}/{}", c.name) };
            walk(c, &p, out);
        }
    }
    let f = Fdt::new(dtb).unwrap();
    let mut out = Vec::new();
    walk(f.all_nodes().next().unwrap(), "/", &mut out);
    out
}

fn u64_prop(f: &Fdt<'_>, path: &str, name: &str) -> u64 {
    let v = f.find_node(path).unwrap().property(name).unwrap().value;
    u64::from_be_bytes(v.try_into().unwrap())
}

#[test]
fn default_removals_on_qemu_virt() {
    let r = default_removals(V3_SMP2, false).unwrap();
    let mut sorted = r.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            "/flash@0",
            "/fw-cfg@9020000",
            "/gpio-keys",
            "/pl031@9010000",
            "/pl061@9030000",
            "/platform-bus@c000000",
            "/pmu",
        ]
    );
    let with_vpmu = default_removals(V3_SMP2, true).unwrap();
    assert_eq!(with_vpmu.len(), r.len() - 1);
    assert!(!with_vpmu.iter().any(|p| p == "/pmu"), "a guest with a vPMU keeps the PMU node");
}

#[test]
fn guest_dtb_round_trip() {
    for (host, ncpus) in [(V3_SMP2, 2usize), (V4_SMP4, 4)] {
        let cfg = guest_config(host);
        let out = build_guest_dtb(host, &cfg).unwrap();
        let f = Fdt::new(&out).unwrap();

        // Memory: exactly one node, the guest's.
        let mems: Vec<_> =
            f.all_nodes().filter(|n| n.property("device_type").and_then(|p| p.as_str()) == Some("memory")).collect();
        assert_eq!(mems.len(), 1);
        assert_eq!(mems[0].name, "memory@48000000");
        let reg: Vec<_> = mems[0].reg().unwrap().collect();
        assert_eq!(reg.len(), 1);
        assert_eq!(reg[0].starting_address as u64, 0x4800_0000);
        assert_eq!(reg[0].size, Some(0x1000_0000));

        // CPUs: the vCPUs only, no cpu-map.
        let cpus = f.find_node("/cpus").unwrap();
        let names: Vec<_> = cpus.children().map(|c| c.name).collect();
        assert_eq!(names, ["cpu@0", "cpu@1"]);
        let cpu1 = f.find_node("/cpus/cpu@1").unwrap();
        assert_eq!(cpu1.property("reg").unwrap().as_usize(), Some(1));
        assert_eq!(cpu1.property("enable-method").unwrap().as_str(), Some("psci"));
        assert_eq!(cpu1.compatible().unwrap().first(), "arm,cortex-a57");

        // PSCI over HVC.
        let psci = f.find_node("/psci").unwrap();
        assert_eq!(psci.property("method").unwrap().as_str(), Some("hvc"));
        assert_eq!(psci.compatible().unwrap().all().collect::<Vec<_>>(), ["arm,psci-1.0", "arm,psci-0.2"]);

        // Chosen: command line, initrd, stdout kept, modules gone.
        let chosen = f.find_node("/chosen").unwrap();
        assert_eq!(chosen.property("bootargs").unwrap().as_str(), Some(cfg.bootargs.as_str()));
        assert_eq!(chosen.property("stdout-path").unwrap().as_str(), Some("/pl011@9000000"));
        assert_eq!(u64_prop(&f, "/chosen", "linux,initrd-start"), 0x5000_0000);
        assert_eq!(u64_prop(&f, "/chosen", "linux,initrd-end"), 0x5123_4000);
        assert_eq!(chosen.children().count(), 0);

        // Removed nodes are gone, and so is every phandle reference to them.
        let paths = all_paths(&out);
        for r in &cfg.remove_paths {
            assert!(!paths.contains(r), "{r} still present");
        }
        assert!(f.all_nodes().all(|n| n.property("msi-map").is_none() && n.property("gpios").is_none()));
        assert!(!paths.iter().any(|p| p.contains("module")));

        // Extra device added, host slots and the GIC kept.
        let v = f.find_node("/virtio_mmio@a004000").unwrap();
        assert_eq!(v.compatible().unwrap().first(), "virtio,mmio");
        // (fdt's interrupts() does not follow an inherited interrupt-parent.)
        let irq: Vec<u8> = [0u32, 48, 1].iter().flat_map(|c| c.to_be_bytes()).collect();
        assert_eq!(v.property("interrupts").unwrap().value, &irq[..]);
        assert!(v.property("interrupt-parent").is_none());
        assert!(v.property("dma-coherent").is_some());

        // And our own reader agrees with all of it.
        let (p, boot) = discover(&out).unwrap();
        assert_eq!(p.memory, vec![cfg.memory]);
        assert_eq!(p.cpus, cfg.vcpu_mpidrs);
        assert_eq!(p.gic.gicd.base, 0x0800_0000);
        assert_eq!(p.gic.its, None);
        assert_eq!(p.gic.maintenance_intid, Some(id(25)));
        assert_eq!(p.psci_method.as_deref(), Some("hvc"));
        assert_eq!(boot.bootargs.as_deref(), Some(cfg.bootargs.as_str()));
        assert_eq!(boot.kernel, None);
        assert_eq!(p.virtio_mmio.len(), 33);
        assert_eq!(p.virtio_mmio[32].intid, id(80));
        assert_eq!(p.uart.unwrap().base, 0x0900_0000);
        assert_eq!(p.timer.virt_intid, id(27));
        let _ = ncpus;
    }
}

#[test]
fn guest_dtb_keeps_phandles() {
    let out = build_guest_dtb(V3_SMP2, &guest_config(V3_SMP2)).unwrap();
    let f = Fdt::new(&out).unwrap();
    let root_parent = f.all_nodes().next().unwrap().property("interrupt-parent").unwrap().as_usize().unwrap();
    let gic = f.find_node("/intc@8000000").unwrap();
    assert_eq!(gic.property("phandle").unwrap().as_usize(), Some(root_parent));
    // The clock the UART references survives too.
    let clk = f.find_node("/apb-pclk").unwrap().property("phandle").unwrap().as_usize().unwrap();
    let uart_clocks = f.find_node("/pl011@9000000").unwrap().property("clocks").unwrap().value;
    assert_eq!(&uart_clocks[..4], &(clk as u32).to_be_bytes());
}

#[test]
fn guest_dtb_without_removals_or_initrd() {
    let cfg = GuestDtbConfig {
        memory: Region { base: 0x4000_0000, size: 0x2000_0000 },
        vcpu_mpidrs: vec![0],
        bootargs: String::new(),
        ..Default::default()
    };
    let out = build_guest_dtb(V4_SMP4, &cfg).unwrap();
    let f = Fdt::new(&out).unwrap();
    assert!(f.find_node("/chosen").unwrap().property("linux,initrd-start").is_none());
    assert!(f.find_node("/pcie@10000000").is_some());
    // The ITS goes unless asked for (no vITS yet), with the MSI properties.
    assert!(f.find_node("/intc@8000000/its@8080000").is_none());
    assert!(f.find_node("/pcie@10000000").unwrap().property("msi-map").is_none());
    assert_eq!(f.find_node("/cpus").unwrap().children().count(), 1);
    let out = build_guest_dtb(V4_SMP4, &GuestDtbConfig { keep_its: true, ..cfg }).unwrap();
    let f = Fdt::new(&out).unwrap();
    assert!(f.find_node("/intc@8000000/its@8080000").is_some());
    assert!(f.find_node("/pcie@10000000").unwrap().property("msi-map").is_some());
}

#[test]
fn guest_dtb_replaces_host_node_at_same_path() {
    let mut cfg = guest_config(V3_SMP2);
    cfg.extra_virtio_mmio[0].base = 0x0a00_3e00;
    cfg.extra_virtio_mmio[0].intid = id(79);
    cfg.extra_virtio_mmio[0].edge = false;
    let out = build_guest_dtb(V3_SMP2, &cfg).unwrap();
    let (p, _) = discover(&out).unwrap();
    assert_eq!(p.virtio_mmio.len(), 32);
    let d = p.virtio_mmio.iter().find(|d| d.base == 0x0a00_3e00).unwrap();
    assert!(!d.edge);
}

#[test]
fn guest_config_is_checked() {
    let good = guest_config(V3_SMP2);
    let mut c = good.clone();
    c.vcpu_mpidrs.clear();
    assert_eq!(build_guest_dtb(V3_SMP2, &c), Err(DtbError::BadValue("no vCPUs")));
    let mut c = good.clone();
    c.initrd = Some(Region { base: 0x1000, size: 0x1000 });
    assert!(matches!(build_guest_dtb(V3_SMP2, &c), Err(DtbError::BadValue(_))));
    let mut c = good.clone();
    c.extra_virtio_mmio[0].intid = id(27);
    assert!(matches!(build_guest_dtb(V3_SMP2, &c), Err(DtbError::BadValue(_))));
    let mut c = good.clone();
    c.remove_paths.push("/".to_string());
    assert!(build_guest_dtb(V3_SMP2, &c).is_err());
    // An MPIDR with Aff3 set does not fit QEMU's one-cell /cpus.
    let mut c = good;
    c.vcpu_mpidrs = vec![0x1_0000_0000];
    assert_eq!(build_guest_dtb(V3_SMP2, &c), Err(DtbError::TooBig));
}

#[test]
fn nop_tokens_are_tolerated() {
    // Turn the gpio-keys "label" property into NOPs, as libfdt's
    // fdt_nop_property would.
    let mut blob = V3_SMP2.to_vec();
    let value = b"GPIO Key Poweroff\0";
    let at = blob.windows(value.len()).position(|w| w == value).unwrap();
    let start = at - 12;
    assert_eq!(&blob[start..start + 4], &3u32.to_be_bytes());
    let end = (at + value.len() + 3) & !3;
    for word in blob[start..end].chunks_exact_mut(4) {
        word.copy_from_slice(&4u32.to_be_bytes());
    }
    assert_eq!(discover(&blob).unwrap(), discover(V3_SMP2).unwrap());
    let out = build_guest_dtb(&blob, &GuestDtbConfig { vcpu_mpidrs: vec![0], ..guest_config(&blob) }).unwrap();
    assert!(Fdt::new(&out).is_ok());
}

#[test]
fn malformed_input_is_an_error() {
    assert_eq!(discover(&[]), Err(DtbError::Truncated));
    assert_eq!(discover(&[0xd0, 0x0d, 0xfe, 0xed]), Err(DtbError::Truncated));
    assert_eq!(discover(&[0u8; 64]), Err(DtbError::Parse));
    assert_eq!(discover(b"this is certainly not a device tree blob at all"), Err(DtbError::Parse));
    assert_eq!(discover(&V3_SMP2[..V3_SMP2.len() - 1]), Err(DtbError::Truncated));
    // A struct block size that runs past totalsize.
    let mut bad = V3_SMP2.to_vec();
    bad[36..40].copy_from_slice(&0x7fff_ffffu32.to_be_bytes());
    assert_eq!(discover(&bad), Err(DtbError::Parse));
    // Version 16 headers lack size_dt_struct.
    let mut old = V3_SMP2.to_vec();
    old[20..24].copy_from_slice(&16u32.to_be_bytes());
    assert!(matches!(discover(&old), Err(DtbError::Unsupported(_))));
    assert!(build_guest_dtb(&[1, 2, 3], &guest_config(V3_SMP2)).is_err());
    assert!(default_removals(&[], false).is_err());
}

fn exercise(blob: &[u8], cfg: &GuestDtbConfig) {
    let _ = discover(blob);
    let _ = default_removals(blob, false);
    let _ = build_guest_dtb(blob, cfg);
}

#[test]
fn truncated_inputs_never_panic() {
    let cfg = guest_config(V3_SMP2);
    for len in 0..V3_SMP2.len() {
        let b = &V3_SMP2[..len];
        assert!(discover(b).is_err());
        exercise(b, &cfg);
        // Same prefix, but with totalsize claiming exactly what is there:
        // now the structure itself is cut.
        if len >= 40 {
            let mut t = b.to_vec();
            t[4..8].copy_from_slice(&(len as u32).to_be_bytes());
            exercise(&t, &cfg);
        }
    }
}

#[test]
fn corrupted_inputs_never_panic() {
    let cfg = guest_config(V3_SMP2);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // `DTB_FUZZ_ITERS` runs a longer campaign by hand.
    let iters = std::env::var("DTB_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(4000);
    for _ in 0..iters {
        let mut b = V3_SMP2.to_vec();
        match rng.index(4) {
            // A few random bytes anywhere.
            0 => {
                for _ in 0..1 + rng.index(8) {
                    let i = rng.index(b.len());
                    b[i] = rng.next() as u8;
                }
            }
            // A random big-endian word, often a token or small length.
            1 => {
                let i = rng.index(b.len() / 4) * 4;
                let v = [1u32, 2, 3, 4, 9, 0, 0xffff_ffff, rng.next() as u32, rng.index(64) as u32][rng.index(9)];
                b[i..i + 4].copy_from_slice(&v.to_be_bytes());
            }
            // A header field.
            2 => {
                let i = rng.index(10) * 4;
                let v = if rng.index(2) == 0 { rng.next() as u32 } else { rng.index(b.len() + 64) as u32 };
                b[i..i + 4].copy_from_slice(&v.to_be_bytes());
            }
            // Pure noise of random length.
            _ => {
                let n = rng.index(512);
                b = (0..n).map(|_| rng.next() as u8).collect();
                if n >= 4 && rng.index(2) == 0 {
                    b[..4].copy_from_slice(&0xd00d_feedu32.to_be_bytes());
                }
            }
        }
        exercise(&b, &cfg);
    }
}

#[test]
fn guest_dtb_is_deterministic() {
    let cfg = guest_config(V4_SMP4);
    assert_eq!(build_guest_dtb(V4_SMP4, &cfg).unwrap(), build_guest_dtb(V4_SMP4, &cfg).unwrap());
}

#[test]
fn interrupt_specifiers() {
    use super::tree::{gic_irq, Irq};
    assert_eq!(gic_irq(&[0, 1, 4]), Ok(Irq { intid: id(33), edge: false }));
    assert_eq!(gic_irq(&[1, 9, 4]), Ok(Irq { intid: id(25), edge: false }));
    assert_eq!(gic_irq(&[0, 47, 1]), Ok(Irq { intid: id(79), edge: true }));
    assert_eq!(gic_irq(&[2, 0, 4]), Ok(Irq { intid: id(4096), edge: false }));
    assert!(gic_irq(&[1, 16, 4]).is_err());
    assert!(gic_irq(&[0, 988, 4]).is_err());
    assert!(gic_irq(&[7, 0, 4]).is_err());
    assert!(gic_irq(&[0, 1]).is_err());
}

/// With `DTB_DUMP_DIR` set, writes the guest trees there so they can be
/// checked with `dtc -I dtb -O dts` (not needed by the test suite).
#[test]
fn dump_guest_dtbs_when_asked() {
    let Ok(dir) = std::env::var("DTB_DUMP_DIR") else {
        return;
    };
    for (name, host) in [("guest-gicv3-smp2.dtb", V3_SMP2), ("guest-gicv4-smp4.dtb", V4_SMP4)] {
        let out = build_guest_dtb(host, &guest_config(host)).unwrap();
        std::fs::write(std::path::Path::new(&dir).join(name), out).unwrap();
    }
}

// ---------------------------------------------------------------------------
// FVP-like trees, written here (not copied from any upstream source) to
// reproduce what matters about Arm FVP Base RevC's device tree: UART and
// virtio-mmio sit two buses down (`bus@8000000` → `ranges` → an iofpga bus →
// `ranges`), their interrupts are one cell wide and reach the GIC through the
// outer bus's `interrupt-map`, RAM has two banks, the top 16 MiB of the first
// is reserved (plus a `/memreserve/` at 0x80000000), and the CPUs' MPIDRs
// use Aff1/Aff2 (0x0, 0x100, …, 0x10300).

/// Which file the tree imitates: the parent unit-address width in the
/// interrupt map (the GIC's own `#address-cells`) is 2 cells in Linux's
/// flavour and 1 in TF-A's; the two also differ in `/cpus` cell counts, how
/// the GIC's children are addressed, and how the memory banks are written.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Flavour {
    /// GIC `#address-cells = <2>`, identity `ranges`; `/cpus` 2 cells; one
    /// memory node with both banks; interrupt parent found by walking up.
    Linux,
    /// GIC `#address-cells = <1>` with a real `ranges` (its ITS child is at
    /// 0x20000 inside it); `/cpus` 1 cell; a memory node per bank; the
    /// iofpga bus names the nexus with an explicit `interrupt-parent`.
    TfA,
}

const FVP_GIC_PHANDLE: u32 = 1;
const FVP_BUS_PHANDLE: u32 = 2;
const FVP_MPIDRS: [u64; 8] = [0x0, 0x100, 0x200, 0x300, 0x1_0000, 0x1_0100, 0x1_0200, 0x1_0300];
const FVP_BANK0: Region = Region { base: 0x8000_0000, size: 0x8000_0000 };
const FVP_BANK1: Region = Region { base: 0x8_8000_0000, size: 0x8000_0000 };
/// The secure top 16 MiB of bank 0.
const FVP_SECURE: Region = Region { base: 0xff00_0000, size: 0x0100_0000 };
const FVP_MEMRESERVE: Region = Region { base: 0x8000_0000, size: 0x1_0000 };

fn cells(v: &[u64], n: u32) -> Vec<u32> {
    v.iter()
        .flat_map(|&x| if n == 2 { vec![(x >> 32) as u32, x as u32] } else { vec![u32::try_from(x).unwrap()] })
        .collect()
}

/// One `interrupt-map` entry of the outer bus: child `<0 0 n>` → GIC SPI n,
/// level, with the GIC's unit address as wide as `flavour` makes it.
fn fvp_map_entry(flavour: Flavour, n: u32) -> Vec<u32> {
    let mut e = vec![0, 0, n, FVP_GIC_PHANDLE];
    e.extend(if flavour == Flavour::Linux { &[0u32, 0][..] } else { &[0u32][..] });
    e.extend([0, n, 4]);
    e
}

fn fvp_dtb(flavour: Flavour) -> Vec<u8> {
    use vm_fdt::{FdtReserveEntry, FdtWriter};
    let rsv = [FdtReserveEntry::new(FVP_MEMRESERVE.base, FVP_MEMRESERVE.size).unwrap()];
    let mut w = FdtWriter::new_with_mem_reserv(&rsv).unwrap();
    let root = w.begin_node("").unwrap();
    w.property_string("compatible", "arm,fvp-base-revc").unwrap();
    w.property_u32("#address-cells", 2).unwrap();
    w.property_u32("#size-cells", 2).unwrap();
    w.property_u32("interrupt-parent", FVP_GIC_PHANDLE).unwrap();

    let aliases = w.begin_node("aliases").unwrap();
    w.property_string("serial0", "/bus@8000000/iofpga-bus@300000000/serial@90000").unwrap();
    w.end_node(aliases).unwrap();
    let chosen = w.begin_node("chosen").unwrap();
    w.property_string("stdout-path", "serial0:115200n8").unwrap();
    w.end_node(chosen).unwrap();

    let (cpu_cells, cpus) = (if flavour == Flavour::Linux { 2 } else { 1 }, w.begin_node("cpus").unwrap());
    w.property_u32("#address-cells", cpu_cells).unwrap();
    w.property_u32("#size-cells", 0).unwrap();
    for m in FVP_MPIDRS {
        let cpu = w.begin_node(&alloc::format!("cpu@{m:x}")).unwrap();
        w.property_string("device_type", "cpu").unwrap();
        w.property_string("compatible", "arm,armv8").unwrap();
        w.property_array_u32("reg", &cells(&[m], cpu_cells)).unwrap();
        w.property_string("enable-method", "psci").unwrap();
        w.end_node(cpu).unwrap();
    }
    w.end_node(cpus).unwrap();

    if flavour == Flavour::Linux {
        let mem = w.begin_node("memory@80000000").unwrap();
        w.property_string("device_type", "memory").unwrap();
        let banks = [FVP_BANK0.base, FVP_BANK0.size, FVP_BANK1.base, FVP_BANK1.size];
        w.property_array_u64("reg", &banks).unwrap();
        w.end_node(mem).unwrap();
    } else {
        for bank in [FVP_BANK0, FVP_BANK1] {
            let mem = w.begin_node(&alloc::format!("memory@{:x}", bank.base)).unwrap();
            w.property_string("device_type", "memory").unwrap();
            w.property_array_u64("reg", &[bank.base, bank.size]).unwrap();
            w.end_node(mem).unwrap();
        }
    }

    let rm = w.begin_node("reserved-memory").unwrap();
    w.property_u32("#address-cells", 2).unwrap();
    w.property_u32("#size-cells", 2).unwrap();
    w.property_null("ranges").unwrap();
    let sec = w.begin_node("secure-firmware@ff000000").unwrap();
    w.property_array_u64("reg", &[FVP_SECURE.base, FVP_SECURE.size]).unwrap();
    w.property_null("no-map").unwrap();
    w.end_node(sec).unwrap();
    w.end_node(rm).unwrap();

    let psci = w.begin_node("psci").unwrap();
    w.property_string_list("compatible", vec!["arm,psci-1.0".into(), "arm,psci-0.2".into()]).unwrap();
    w.property_string("method", "smc").unwrap();
    w.end_node(psci).unwrap();

    let timer = w.begin_node("timer").unwrap();
    w.property_string("compatible", "arm,armv8-timer").unwrap();
    w.property_array_u32("interrupts", &[1, 13, 0xff08, 1, 14, 0xff08, 1, 11, 0xff08, 1, 10, 0xff08]).unwrap();
    w.end_node(timer).unwrap();

    fvp_gic(&mut w, flavour);
    fvp_buses(&mut w, flavour);
    w.end_node(root).unwrap();
    w.finish().unwrap()
}

/// The FVP's GICv3 and its ITS, whose `reg` and `ranges` are as wide as
/// `flavour` makes them.
fn fvp_gic(w: &mut vm_fdt::FdtWriter, flavour: Flavour) {
    let gic = w.begin_node("interrupt-controller@2f000000").unwrap();
    w.property_string("compatible", "arm,gic-v3").unwrap();
    w.property_u32("#interrupt-cells", 3).unwrap();
    w.property_null("interrupt-controller").unwrap();
    w.property_array_u64("reg", &[0x2f00_0000, 0x1_0000, 0x2f10_0000, 0x20_0000]).unwrap();
    w.property_array_u32("interrupts", &[1, 9, 4]).unwrap();
    w.property_u32("phandle", FVP_GIC_PHANDLE).unwrap();
    if flavour == Flavour::Linux {
        w.property_u32("#address-cells", 2).unwrap();
        w.property_u32("#size-cells", 2).unwrap();
        w.property_null("ranges").unwrap();
        let its = w.begin_node("msi-controller@2f020000").unwrap();
        w.property_string("compatible", "arm,gic-v3-its").unwrap();
        w.property_array_u64("reg", &[0x2f02_0000, 0x2_0000]).unwrap();
        w.end_node(its).unwrap();
    } else {
        w.property_u32("#address-cells", 1).unwrap();
        w.property_u32("#size-cells", 1).unwrap();
        // child 0 → parent 0x2f000000 (2 cells), 1 MiB.
        w.property_array_u32("ranges", &[0, 0, 0x2f00_0000, 0x10_0000]).unwrap();
        let its = w.begin_node("msi-controller@20000").unwrap();
        w.property_string("compatible", "arm,gic-v3-its").unwrap();
        w.property_array_u32("reg", &[0x2_0000, 0x2_0000]).unwrap();
        w.end_node(its).unwrap();
    }
    w.end_node(gic).unwrap();
}

/// The FVP's outer bus (chip selects, `interrupt-map`) and the iofpga bus
/// below it with the UARTs and virtio-mmio devices.
fn fvp_buses(w: &mut vm_fdt::FdtWriter, flavour: Flavour) {
    // The outer bus: child space <chip-select offset> (2 cells), 1 size cell.
    let bus = w.begin_node("bus@8000000").unwrap();
    w.property_string("compatible", "simple-bus").unwrap();
    w.property_u32("#address-cells", 2).unwrap();
    w.property_u32("#size-cells", 1).unwrap();
    let mut ranges = Vec::new();
    // <cs 0> → <0 window>, 64 MiB each; the windows are not evenly spaced.
    for (cs, window) in [0x0800_0000u32, 0x1400_0000, 0x1800_0000, 0x1c00_0000].into_iter().enumerate() {
        ranges.extend([cs as u32, 0, 0, window, 0x0400_0000]);
    }
    w.property_array_u32("ranges", &ranges).unwrap();
    w.property_u32("#interrupt-cells", 1).unwrap();
    w.property_array_u32("interrupt-map-mask", &[0, 0, 63]).unwrap();
    let map: Vec<u32> =
        [0u32, 1, 2, 3, 4, 5, 6, 40, 41, 42, 43].iter().flat_map(|&n| fvp_map_entry(flavour, n)).collect();
    w.property_array_u32("interrupt-map", &map).unwrap();
    w.property_u32("phandle", FVP_BUS_PHANDLE).unwrap();

    // The iofpga bus: chip select 3, 1+1 cells.
    let io = w.begin_node("iofpga-bus@300000000").unwrap();
    w.property_string("compatible", "simple-bus").unwrap();
    w.property_u32("#address-cells", 1).unwrap();
    w.property_u32("#size-cells", 1).unwrap();
    w.property_array_u32("ranges", &[0, 3, 0, 0x20_0000]).unwrap();
    if flavour == Flavour::TfA {
        w.property_u32("interrupt-parent", FVP_BUS_PHANDLE).unwrap();
    }
    for (name, reg, irq, compatible) in [
        ("serial@90000", 0x9_0000u32, 5u32, "arm,pl011"),
        ("serial@a0000", 0xa_0000, 6, "arm,pl011"),
        ("virtio@130000", 0x13_0000, 42, "virtio,mmio"),
        ("virtio@200000", 0x20_0000, 43, "virtio,mmio"),
    ] {
        let n = w.begin_node(name).unwrap();
        w.property_string("compatible", compatible).unwrap();
        w.property_array_u32("reg", &[reg, if compatible == "virtio,mmio" { 0x200 } else { 0x1000 }]).unwrap();
        w.property_u32("interrupts", irq).unwrap();
        if name == "virtio@200000" {
            // Outside the iofpga bus's 2 MiB window: not translatable.
            w.property_string("status", "disabled").unwrap();
        }
        w.end_node(n).unwrap();
    }
    w.end_node(io).unwrap();
    w.end_node(bus).unwrap();
}

fn check_fvp_platform(p: &Machine) {
    assert_eq!(p.memory, vec![FVP_BANK0, FVP_BANK1]);
    assert_eq!(p.reserved, vec![FVP_MEMRESERVE, FVP_SECURE]);
    assert_eq!(p.cpus, FVP_MPIDRS.to_vec());
    assert_eq!(p.gic.gicd, Region { base: 0x2f00_0000, size: 0x1_0000 });
    assert_eq!(p.gic.gicr, vec![Region { base: 0x2f10_0000, size: 0x20_0000 }]);
    assert_eq!(p.gic.its, Some(Region { base: 0x2f02_0000, size: 0x2_0000 }));
    assert_eq!(p.gic.maintenance_intid, Some(id(25)));
    assert_eq!(p.gic.phandle, Some(FVP_GIC_PHANDLE));
    let uart = p.uart.as_ref().expect("uart");
    assert_eq!((uart.base, uart.size, uart.intid), (0x1c09_0000, 0x1000, id(37)));
    assert_eq!(uart.path, "/bus@8000000/iofpga-bus@300000000/serial@90000");
    assert_eq!(p.virtio_mmio.len(), 1);
    let blk = &p.virtio_mmio[0];
    assert_eq!((blk.base, blk.size, blk.intid, blk.edge), (0x1c13_0000, 0x200, id(74), false));
    assert_eq!(p.timer, TimerInfo { phys_intid: id(30), virt_intid: id(27), hyp_intid: id(26) });
    assert_eq!(p.psci_method.as_deref(), Some("smc"));
}

#[test]
fn discover_fvp_linux_flavour() {
    check_fvp_platform(&discover(&fvp_dtb(Flavour::Linux)).unwrap().0);
}

#[test]
fn discover_fvp_tfa_flavour() {
    check_fvp_platform(&discover(&fvp_dtb(Flavour::TfA)).unwrap().0);
}

#[test]
fn fvp_guest_dtb_reads_back() {
    for flavour in [Flavour::Linux, Flavour::TfA] {
        let host = fvp_dtb(flavour);
        let cfg = GuestDtbConfig {
            memory: Region { base: 0x9000_0000, size: 0x1000_0000 },
            vcpu_mpidrs: vec![0, 1],
            bootargs: "console=ttyAMA0".to_string(),
            initrd: None,
            remove_paths: default_removals(&host, false).unwrap(),
            extra_virtio_mmio: vec![],
            keep_its: false,
            ipa_size: None,
            pci_carves: Vec::new(),
            control: None,
        };
        let (p, _) = discover(&build_guest_dtb(&host, &cfg).unwrap()).unwrap();
        assert_eq!(p.memory, vec![cfg.memory]);
        assert_eq!(p.cpus, vec![0, 1]);
        assert_eq!(p.gic.its, None);
        // The kept devices still translate and map through the buses.
        assert_eq!(p.uart.map(|u| (u.base, u.intid)), Some((0x1c09_0000, id(37))));
        assert_eq!(p.virtio_mmio.iter().map(|d| (d.base, d.intid)).collect::<Vec<_>>(), [(0x1c13_0000, id(74))]);
    }
}

/// The boot planner fed the FVP platform: nothing it places touches the
/// `/memreserve/` entry or the secure top of bank 0.
#[test]
fn fvp_reserved_memory_is_never_ram_for_the_heap_or_dom0() {
    use crate::boot::plan::{plan, Inputs, Kernel};
    let (p, _) = discover(&fvp_dtb(Flavour::Linux)).unwrap();
    let base = Inputs {
        ram: &p.memory,
        // TF-A's BL33 address, its DTB address.
        image: Region { base: 0x8800_0000, size: 0x60_0000 },
        dtb: Region { base: 0x8200_0000, size: 0x1_0000 },
        reserved: &p.reserved,
        kernel: Kernel { module: Region { base: 0x9000_0000, size: 0x1a0_0000 }, image_size: 0x1b0_0000, fixed: None },
        initrd: Some(Region { base: 0x9400_0000, size: 0x500_0000 }),
        dom0_mem: Some(0x1000_0000),
        ram_disk: 0,
        heap_size: 0x100_0000,
        keep_low: 0x2000_0000,
        domus: &[],
        domu_pool: 0,
    };
    let overlaps = |a: Region, b: Region| a.base < b.end() && b.base < a.end();
    // Only bank 0: dom0 goes to the top of it, which must stop below the
    // secure 16 MiB; the heap goes to the bottom, above the memreserve.
    let bank0 = [p.memory[0]];
    let plan0 = plan(&Inputs { ram: &bank0, ..base }).unwrap();
    assert_eq!(plan0.heap.base, 0x8020_0000);
    assert_eq!(plan0.guest_ram.end(), FVP_SECURE.base);
    // Both banks: dom0 goes to the top of bank 1.
    let plan2 = plan(&base).unwrap();
    assert_eq!(plan2.guest_ram.end(), FVP_BANK1.end());
    for pl in [plan0, plan2] {
        for placed in [pl.heap, pl.guest_ram, pl.guest_dtb] {
            for r in &p.reserved {
                assert!(!overlaps(placed, *r), "{placed:x?} overlaps reserved {r:x?}");
            }
        }
    }
    // A module inside the secure region is refused.
    let bad = Inputs { initrd: Some(Region { base: 0xff10_0000, size: 0x1000 }), ..base };
    assert!(plan(&bad).is_err());
}

/// `blob` (an FVP-like tree) with property `name` of node `path` replaced
/// by `value`, or removed when `value` is `None`.
fn edit(blob: &[u8], path: &str, name: &str, value: Option<&[u8]>) -> Vec<u8> {
    fn copy(w: &mut vm_fdt::FdtWriter, n: fdt::node::FdtNode<'_, '_>, at: &str, edit: (&str, &str, Option<&[u8]>)) {
        let (path, name, value) = edit;
        let node = w.begin_node(if at == "/" { "" } else { n.name }).unwrap();
        for p in n.properties().filter(|p| at != path || p.name != name) {
            w.property(p.name, p.value).unwrap();
        }
        if let (true, Some(v)) = (at == path, value) {
            w.property(name, v).unwrap();
        }
        for c in n.children() {
            let sub = if at == "/" { alloc::format!("/{}", c.name) } else { alloc::format!("{at}/{}", c.name) };
            copy(w, c, &sub, edit);
        }
        w.end_node(node).unwrap();
    }
    let f = Fdt::new(blob).unwrap();
    let rsv = [vm_fdt::FdtReserveEntry::new(FVP_MEMRESERVE.base, FVP_MEMRESERVE.size).unwrap()];
    let mut w = vm_fdt::FdtWriter::new_with_mem_reserv(&rsv).unwrap();
    copy(&mut w, f.all_nodes().next().unwrap(), "/", (path, name, value));
    w.finish().unwrap()
}

fn fvp_with(flavour: Flavour, path: &str, name: &str, value: Option<&[u8]>) -> Vec<u8> {
    edit(&fvp_dtb(flavour), path, name, value)
}

fn be(cells: &[u32]) -> Vec<u8> {
    cells.iter().flat_map(|c| c.to_be_bytes()).collect()
}

const FVP_BUS: &str = "/bus@8000000";
const FVP_IOFPGA: &str = "/bus@8000000/iofpga-bus@300000000";

#[test]
fn fvp_bad_translations_and_maps_are_errors() {
    for flavour in [Flavour::Linux, Flavour::TfA] {
        // The copy itself changes nothing.
        assert_eq!(discover(&fvp_with(flavour, "/none", "x", None)).unwrap(), discover(&fvp_dtb(flavour)).unwrap());
        // A bus without `ranges` is not memory-mapped: its virtio device is
        // an error, its UART no console (not one at 0x90000).
        let t = fvp_with(flavour, FVP_IOFPGA, "ranges", None);
        assert_eq!(discover(&t), Err(DtbError::Unsupported("reg behind a bus without ranges")));
        // Empty `ranges` on the iofpga bus is the identity: 0x130000 is then
        // <0 0x130000> on the outer bus, i.e. in chip select 0's window.
        let t = fvp_with(flavour, FVP_IOFPGA, "ranges", Some(&[]));
        assert_eq!(discover(&t).unwrap().0.virtio_mmio[0].base, 0x0813_0000);
        // A bus address no window covers.
        let t = fvp_with(flavour, FVP_IOFPGA, "ranges", Some(&be(&[0, 7, 0, 0x20_0000])));
        assert_eq!(discover(&t), Err(DtbError::BadValue("reg outside its bus's ranges")));
        // A ranges window too small for the device.
        let t = fvp_with(flavour, FVP_IOFPGA, "ranges", Some(&be(&[0x13_0000, 3, 0, 0x100])));
        assert_eq!(discover(&t), Err(DtbError::BadValue("reg outside its bus's ranges")));
        // A ranges value that is not whole entries.
        let t = fvp_with(flavour, FVP_IOFPGA, "ranges", Some(&be(&[0, 3, 0])));
        assert_eq!(discover(&t), Err(DtbError::BadValue("ranges")));
        // No map entry for SPI 42.
        let map: Vec<u32> = [0u32, 5].iter().flat_map(|&n| fvp_map_entry(flavour, n)).collect();
        let t = fvp_with(flavour, FVP_BUS, "interrupt-map", Some(&be(&map)));
        assert_eq!(discover(&t), Err(DtbError::BadValue("interrupt-map has no entry for an interrupt")));
        // A map whose last entry is cut short.
        let mut map: Vec<u32> = [5u32, 42].iter().flat_map(|&n| fvp_map_entry(flavour, n)).collect();
        map.pop();
        let t = fvp_with(flavour, FVP_BUS, "interrupt-map", Some(&be(&map)));
        assert_eq!(discover(&t), Err(DtbError::BadValue("interrupt-map entry")));
        // A map naming a phandle no node has.
        let mut map = fvp_map_entry(flavour, 42);
        map[3] = 99;
        let t = fvp_with(flavour, FVP_BUS, "interrupt-map", Some(&be(&map)));
        assert_eq!(discover(&t), Err(DtbError::BadValue("interrupt-map names no node")));
        // A mask of the wrong width.
        let t = fvp_with(flavour, FVP_BUS, "interrupt-map-mask", Some(&be(&[0, 63])));
        assert_eq!(discover(&t), Err(DtbError::BadValue("interrupt-map-mask width")));
        // Without the mask, every cell must match: the devices' addresses
        // are not <0 0>, so nothing does.
        let t = fvp_with(flavour, FVP_BUS, "interrupt-map-mask", None);
        assert_eq!(discover(&t), Err(DtbError::BadValue("interrupt-map has no entry for an interrupt")));
        // Without a map, the bus would be an interrupt controller we do not
        // know; with neither map nor controller the specifier would go to the
        // GIC as one cell.
        let t = fvp_with(flavour, FVP_BUS, "interrupt-map", None);
        assert!(discover(&t).is_err());
    }
}

#[test]
fn fvp_interrupt_parent_loops_are_errors() {
    // The iofpga bus names itself as interrupt parent without having
    // `#interrupt-cells`: the walk must stop, not spin.
    let t = fvp_with(Flavour::Linux, FVP_IOFPGA, "phandle", Some(&be(&[7])));
    let t = edit(&t, FVP_IOFPGA, "interrupt-parent", Some(&be(&[7])));
    assert_eq!(discover(&t), Err(DtbError::Unsupported("interrupt-parent chain too long")));
    // A tree that names no interrupt parent for the timer: the GIC, as
    // before interrupt-parent was read.
    let t = fvp_with(Flavour::Linux, "/", "interrupt-parent", None);
    assert_eq!(discover(&t).unwrap(), discover(&fvp_dtb(Flavour::Linux)).unwrap());
    // An interrupt-parent naming no node.
    let t = fvp_with(Flavour::Linux, FVP_IOFPGA, "interrupt-parent", Some(&be(&[99])));
    assert_eq!(discover(&t), Err(DtbError::BadValue("interrupt-parent names no node")));
}

#[test]
fn interrupts_extended_goes_through_the_named_parent() {
    const UART: &str = "/bus@8000000/iofpga-bus@300000000/serial@90000";
    for flavour in [Flavour::Linux, Flavour::TfA] {
        // Straight to the GIC (three cells), overriding `interrupts`.
        let t = fvp_with(flavour, UART, "interrupts-extended", Some(&be(&[FVP_GIC_PHANDLE, 0, 40, 4])));
        assert_eq!(discover(&t).unwrap().0.uart.map(|u| u.intid), Some(id(72)));
        // Through the bus nexus (one cell).
        let t = fvp_with(flavour, UART, "interrupts-extended", Some(&be(&[FVP_BUS_PHANDLE, 41])));
        assert_eq!(discover(&t).unwrap().0.uart.map(|u| u.intid), Some(id(73)));
        // Cut short, or naming no node: no console rather than a wrong one.
        for bad in [&[FVP_GIC_PHANDLE, 0, 40][..], &[99, 5], &[]] {
            let t = fvp_with(flavour, UART, "interrupts-extended", Some(&be(bad)));
            assert_eq!(discover(&t).unwrap().0.uart.map(|u| u.base), Some(0x1c0a_0000), "{bad:?}");
        }
    }
}

#[test]
fn corrupted_fvp_trees_never_panic() {
    let mut rng = Rng(0x51ed_2701_f00d_cafe);
    for flavour in [Flavour::Linux, Flavour::TfA] {
        let good = fvp_dtb(flavour);
        let cfg = GuestDtbConfig { vcpu_mpidrs: vec![0], ..Default::default() };
        for _ in 0..2000 {
            let mut b = good.clone();
            let i = rng.index(b.len() / 4) * 4;
            let v = [0u32, 1, 2, 3, 5, 42, 63, 0xffff_ffff, rng.next() as u32][rng.index(9)];
            b[i..i + 4].copy_from_slice(&v.to_be_bytes());
            exercise(&b, &cfg);
        }
    }
}

/// QEMU virt's ECAM bridge: every `ranges` window, the INTx SPIs its
/// `interrupt-map` reaches, the raw `msi-map`.
#[test]
fn discover_pcie_host_on_qemu_virt() {
    for host in [V3_SMP2, V4_SMP4] {
        let (p, _) = discover(host).unwrap();
        assert_eq!(p.pcie.len(), 1);
        let b = &p.pcie[0];
        assert_eq!(b.path, "/pcie@10000000");
        assert_eq!(b.ecam, Region { base: 0x40_1000_0000, size: 0x1000_0000 });
        assert_eq!(b.bus_range, (0, 255));
        assert_eq!(
            b.windows,
            [
                PciWindow {
                    space: PciSpace::Io,
                    prefetchable: false,
                    pci_addr: 0,
                    cpu: Region { base: 0x3eff_0000, size: 0x1_0000 }
                },
                PciWindow {
                    space: PciSpace::Mem32,
                    prefetchable: false,
                    pci_addr: 0x1000_0000,
                    cpu: Region { base: 0x1000_0000, size: 0x2eff_0000 }
                },
                PciWindow {
                    space: PciSpace::Mem64,
                    prefetchable: false,
                    pci_addr: 0x80_0000_0000,
                    cpu: Region { base: 0x80_0000_0000, size: 0x80_0000_0000 }
                },
            ]
        );
        // INTA..INTD of slot 0 are SPIs 3..6; the other slots swizzle them.
        assert_eq!(
            b.intx,
            [35, 36, 37, 38].map(|n| crate::dtb::Irq { intid: id(n), edge: false }),
            "level-triggered SPIs 3..6"
        );
        let f = Fdt::new(host).unwrap();
        let its = f.find_node("/intc@8000000/its@8080000").unwrap();
        let its = its.property("phandle").unwrap().as_usize().unwrap() as u32;
        assert_eq!(b.msi_map, [MsiMapEntry { rid_base: 0, msi_controller: its, msi_base: 0, length: 0x1_0000 }]);
        assert_eq!(b.msi_map_mask, None);
        assert!(b.msi_parent.is_empty());
    }
}

/// The guest's bridge: the 64-bit window at 512 GiB is gone from `ranges`
/// under a 39-bit IPA space, the MSI properties go with the ITS, and what
/// is left still reads back (same ECAM, same INTx).
#[test]
fn guest_pcie_bridge_is_trimmed_to_the_ipa_space() {
    let out = build_guest_dtb(V3_SMP2, &guest_config(V3_SMP2)).unwrap();
    let f = Fdt::new(&out).unwrap();
    let node = f.find_node("/pcie@10000000").unwrap();
    assert!(node.property("msi-map").is_none());
    assert!(node.property("interrupt-map").is_some());
    assert!(f.find_node("/intc@8000000/its@8080000").is_none());
    let (p, _) = discover(&out).unwrap();
    assert_eq!(p.gic.its, None);
    let host = &discover(V3_SMP2).unwrap().0.pcie[0];
    let b = &p.pcie[0];
    assert_eq!(b.windows, host.windows[..2]);
    assert_eq!((b.ecam, b.bus_range, &b.intx), (host.ecam, host.bus_range, &host.intx));
    assert!(b.msi_map.is_empty());

    // A larger IPA space keeps the 64-bit window; the ITS switch keeps the
    // MSI properties byte for byte.
    let cfg = GuestDtbConfig { keep_its: true, ipa_size: Some(1 << 40), ..guest_config(V3_SMP2) };
    let (p, _) = discover(&build_guest_dtb(V3_SMP2, &cfg).unwrap()).unwrap();
    assert_eq!(p.pcie[0].windows, host.windows);
    assert_eq!(p.pcie[0].msi_map, host.msi_map);
    assert_eq!(p.gic.its, Some(Region { base: 0x0808_0000, size: 0x2_0000 }));
    // A bridge removed by path is gone whole.
    let mut cfg = guest_config(V3_SMP2);
    cfg.remove_paths.push(host.path.clone());
    assert!(discover(&build_guest_dtb(V3_SMP2, &cfg).unwrap()).unwrap().0.pcie.is_empty());
}

/// QEMU virt with `iommu=smmuv3`: the SMMU's frames, its named interrupts
/// (edge SPIs 74 and 77), coherence; the bridge's `iommu-map` maps every
/// requester ID 1:1 to a StreamID of that SMMU. The guest's tree has
/// neither the SMMU nor a property naming it, and keeps the bridge.
#[test]
fn smmuv3_and_iommu_map_on_qemu_virt() {
    let (m, _) = discover(V3_SMMUV3).unwrap();
    assert_eq!(m.smmus.len(), 1);
    let s = &m.smmus[0];
    assert_eq!(s.path, "/smmuv3@9050000");
    assert_eq!(s.regs, Region { base: 0x0905_0000, size: 0x2_0000 });
    assert_eq!((s.eventq, s.gerror, s.coherent), (Some(id(106)), Some(id(109)), true));
    let b = &m.pcie[0];
    assert_eq!(b.iommu_map, [IommuMapEntry { rid_base: 0, iommu: s.phandle.unwrap(), sid_base: 0, length: 0x1_0000 }]);
    assert_eq!(b.iommu_map[0].stream_of(0x10), Some(0x10));
    assert_eq!(b.iommu_map[0].stream_of(0x1_0000), None);
    // Without the option the other QEMU trees have no SMMU.
    assert!(discover(V3_SMP2).unwrap().0.smmus.is_empty());
    assert!(discover(V3_SMP2).unwrap().0.pcie[0].iommu_map.is_empty());

    let out = build_guest_dtb(V3_SMMUV3, &guest_config(V3_SMMUV3)).unwrap();
    assert!(!all_paths(&out).iter().any(|p| p.contains("smmu")));
    let f = Fdt::new(&out).unwrap();
    assert!(f.find_node("/pcie@10000000").unwrap().property("iommu-map").is_none());
    let (g, _) = discover(&out).unwrap();
    assert!(g.smmus.is_empty());
    assert!(g.pcie[0].iommu_map.is_empty());
}

/// Bad bridge properties are errors naming them, never panics.
#[test]
fn malformed_pcie_bridge_properties_are_errors() {
    let set = |name: &str, value: &[u8]| {
        let mut t = V3_SMP2.to_vec();
        patch_prop(&mut t, "/pcie@10000000", name, value);
        discover(&t)
    };
    assert_eq!(set("bus-range", &[0, 0, 0, 2, 0, 0, 0, 1]), Err(DtbError::BadValue("bus-range")));
    assert_eq!(set("bus-range", &[0, 0, 1, 0, 0, 0, 1, 0]), Err(DtbError::BadValue("bus-range")));
    assert_eq!(set("msi-map", &[0; 12]), Err(DtbError::BadValue("msi-map (want 4-cell entries)")));
    assert_eq!(set("ranges", &[0; 20]), Err(DtbError::BadValue("pci ranges")));
    assert_eq!(set("interrupt-map", &[0; 8]), Err(DtbError::BadValue("interrupt-map entry")));
}

/// `dtb` rewritten with property `name` of the node at `path` set to
/// `value` (added when absent).
fn patch_prop(dtb: &mut Vec<u8>, path: &str, name: &str, value: &[u8]) {
    fn copy(w: &mut vm_fdt::FdtWriter, n: fdt::node::FdtNode<'_, '_>, at: &str, want: (&str, &str, &[u8])) {
        let node = w.begin_node(if at == "/" { "" } else { n.name }).unwrap();
        let hit = at == want.0;
        for p in n.properties().filter(|p| !(hit && p.name == want.1)) {
            w.property(p.name, p.value).unwrap();
        }
        if hit {
            w.property(want.1, want.2).unwrap();
        }
        for c in n.children() {
            let p = if at == "/" { alloc::format!("/{}", c.name) } else { alloc::format!("{at}/{}", c.name) };
            copy(w, c, &p, want);
        }
        w.end_node(node).unwrap();
    }
    let f = Fdt::new(dtb).unwrap();
    let mut w = vm_fdt::FdtWriter::new().unwrap();
    copy(&mut w, f.all_nodes().next().unwrap(), "/", (path, name, value));
    *dtb = w.finish().unwrap();
}

/// QEMU virt's GIC node with a second redistributor region, as QEMU writes
/// it for more than 123 CPUs: `#redistributor-regions = <2>`, the high
/// region at 256 GiB after the low one.
fn qemu_two_gicr_regions() -> Vec<u8> {
    let mut dtb = V3_SMP2.to_vec();
    let reg: Vec<u64> = vec![0x0800_0000, 0x1_0000, 0x080a_0000, 0xf6_0000, 0x40_0000_0000, 0x400_0000];
    let reg: Vec<u8> = reg.iter().flat_map(|c| c.to_be_bytes()).collect();
    patch_prop(&mut dtb, "/intc@8000000", "reg", &reg);
    patch_prop(&mut dtb, "/intc@8000000", "#redistributor-regions", &2u32.to_be_bytes());
    dtb
}

#[test]
fn discover_two_redistributor_regions() {
    let (p, _) = discover(&qemu_two_gicr_regions()).unwrap();
    assert_eq!(p.gic.gicd, Region { base: 0x0800_0000, size: 0x1_0000 });
    assert_eq!(
        p.gic.gicr,
        vec![Region { base: 0x080a_0000, size: 0xf6_0000 }, Region { base: 0x40_0000_0000, size: 0x400_0000 }]
    );
    // More regions declared than `reg` holds: an error, not a panic.
    let mut bad = qemu_two_gicr_regions();
    patch_prop(&mut bad, "/intc@8000000", "#redistributor-regions", &3u32.to_be_bytes());
    assert!(matches!(discover(&bad), Err(DtbError::BadValue(_))));
}

#[test]
fn dom0_sees_one_redistributor_region() {
    // The vGIC emulates Dom0's redistributors in the host's first region;
    // Linux would read the second region's GICR_PIDR2 and take an abort.
    let host = qemu_two_gicr_regions();
    let guest = build_guest_dtb(&host, &guest_config(&host)).unwrap();
    let f = Fdt::new(&guest).unwrap();
    let gic = f.find_node("/intc@8000000").unwrap();
    assert_eq!(gic.property("#redistributor-regions").unwrap().as_usize(), Some(1));
    let reg: Vec<u8> =
        [0x0800_0000u64, 0x1_0000, 0x080a_0000, 0xf6_0000].iter().flat_map(|c| c.to_be_bytes()).collect();
    assert_eq!(gic.property("reg").unwrap().value, &reg[..]);
    let (p, _) = discover(&guest).unwrap();
    assert_eq!(p.gic.gicr, vec![Region { base: 0x080a_0000, size: 0xf6_0000 }]);
    // The ITS child and the rest of the node are kept as they were.
    assert_eq!(p.gic.maintenance_intid, Some(id(25)));
    // One region on the host: the node is copied byte for byte.
    let guest1 = build_guest_dtb(V3_SMP2, &guest_config(V3_SMP2)).unwrap();
    let f1 = Fdt::new(&guest1).unwrap();
    let h = Fdt::new(V3_SMP2).unwrap();
    assert_eq!(
        f1.find_node("/intc@8000000").unwrap().property("reg").unwrap().value,
        h.find_node("/intc@8000000").unwrap().property("reg").unwrap().value
    );
}

#[test]
fn gic_reg_trimming_checks_its_input() {
    let cells = tree::Cells { addr: 2, size: 2 };
    let reg = be(&[0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0, 8]);
    // GICD, GICR0, GICR1, then a GICC entry: GICR1 goes, GICC stays.
    assert_eq!(guest::gic_reg_first_region(&reg, 2, cells).unwrap(), be(&[0, 1, 0, 2, 0, 3, 0, 4, 0, 7, 0, 8]));
    assert!(guest::gic_reg_first_region(&reg, 4, cells).is_err());
    assert!(guest::gic_reg_first_region(&reg, u32::MAX, cells).is_err());
    assert!(guest::gic_reg_first_region(&reg, 2, tree::Cells { addr: 0, size: 0 }).is_err());
}

#[test]
fn the_control_device_is_a_node_under_hypervisor() {
    let page = Region { base: 0x4020_0000, size: 0x1000 };
    let out = build_guest_dtb(V3_SMP2, &GuestDtbConfig { control: Some(page), ..guest_config(V3_SMP2) }).unwrap();
    let fdt = fdt::Fdt::new(&out).unwrap();
    let node = fdt.find_node("/hypervisor/control@40200000").expect("the control node");
    assert_eq!(node.compatible().unwrap().first(), "hvrust,control-1");
    let reg = node.reg().unwrap().next().unwrap();
    assert_eq!((reg.starting_address as u64, reg.size), (page.base, Some(page.size as usize)));
    let without = build_guest_dtb(V3_SMP2, &guest_config(V3_SMP2)).unwrap();
    assert!(fdt::Fdt::new(&without).unwrap().find_node("/hypervisor").is_none(), "no node without a page");
}
