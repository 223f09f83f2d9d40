//! Host tests against real QEMU DTBs.
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

fn check_qemu_platform(p: &Platform, ncpus: usize) {
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
    assert_eq!(p.virtio_mmio.len(), 32);
    let blk = p.virtio_mmio.iter().find(|d| d.base == 0x0a00_3e00).expect("virtio slot 31");
    assert_eq!((blk.size, blk.intid, blk.edge), (0x200, id(79), true));
    assert_eq!(blk.path, "/virtio_mmio@a003e00");
    assert_eq!(p.virtio_mmio[0].base, 0x0a00_0000);
    assert_eq!(p.virtio_mmio[0].intid, id(48));
    assert_eq!(p.psci_method.as_deref(), Some("smc"));
    assert_eq!(p.bootargs, None);
    let k = p.kernel.as_ref().expect("kernel module");
    assert_eq!(k.base, 0x5000_0000);
    assert!(k.size > 0);
    assert_eq!(k.bootargs.as_deref(), Some("console=ttyAMA0 root=x"));
    let rd = p.ramdisk.as_ref().expect("ramdisk module");
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
    let p = discover(SECURE_XEN_BOOTARGS).unwrap();
    assert_eq!(p.bootargs.as_deref(), Some("dom0_mem=512M dom0_max_vcpus=2 loglvl=debug"));
    // secure=on adds a secure-only UART (status "disabled"); the console stays UART0.
    assert_eq!(p.uart.as_ref().map(|u| u.base), Some(0x0900_0000));
    assert_eq!(p.kernel.as_ref().map(|k| k.base), Some(0x5000_0000));
    assert_eq!(p.ramdisk.as_ref().map(|r| r.base), Some(0x5800_0000));
    assert_eq!(p.cpus, [0, 1]);
    // Without xen,xen-bootargs: /chosen/bootargs.
    let cfg = guest_config(V3_SMP2);
    assert_eq!(
        discover(&build_guest_dtb(V3_SMP2, &cfg).unwrap()).unwrap().bootargs.as_deref(),
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
        remove_paths: default_removals(host).unwrap(),
        extra_virtio_mmio: vec![MmioDevice {
            base: 0x0a00_4000,
            size: 0x200,
            intid: id(80),
            edge: true,
            path: String::new(),
        }],
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
    let r = default_removals(V3_SMP2).unwrap();
    let mut sorted = r.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            "/flash@0",
            "/fw-cfg@9020000",
            "/gpio-keys",
            "/intc@8000000/its@8080000",
            "/pcie@10000000",
            "/pl031@9010000",
            "/pl061@9030000",
            "/platform-bus@c000000",
            "/pmu",
        ]
    );
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
        let p = discover(&out).unwrap();
        assert_eq!(p.memory, vec![cfg.memory]);
        assert_eq!(p.cpus, cfg.vcpu_mpidrs);
        assert_eq!(p.gic.gicd.base, 0x0800_0000);
        assert_eq!(p.gic.its, None);
        assert_eq!(p.gic.maintenance_intid, Some(id(25)));
        assert_eq!(p.psci_method.as_deref(), Some("hvc"));
        assert_eq!(p.bootargs.as_deref(), Some(cfg.bootargs.as_str()));
        assert_eq!(p.kernel, None);
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
    assert!(f.find_node("/intc@8000000/its@8080000").is_some());
    assert_eq!(f.find_node("/cpus").unwrap().children().count(), 1);
}

#[test]
fn guest_dtb_replaces_host_node_at_same_path() {
    let mut cfg = guest_config(V3_SMP2);
    cfg.extra_virtio_mmio[0].base = 0x0a00_3e00;
    cfg.extra_virtio_mmio[0].intid = id(79);
    cfg.extra_virtio_mmio[0].edge = false;
    let out = build_guest_dtb(V3_SMP2, &cfg).unwrap();
    let p = discover(&out).unwrap();
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
    let p = discover(&blob).unwrap();
    assert_eq!(p, discover(V3_SMP2).unwrap());
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
    assert!(default_removals(&[]).is_err());
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn exercise(blob: &[u8], cfg: &GuestDtbConfig) {
    let _ = discover(blob);
    let _ = default_removals(blob);
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
        match rng.below(4) {
            // A few random bytes anywhere.
            0 => {
                for _ in 0..1 + rng.below(8) {
                    let i = rng.below(b.len());
                    b[i] = rng.next() as u8;
                }
            }
            // A random big-endian word, often a token or small length.
            1 => {
                let i = rng.below(b.len() / 4) * 4;
                let v = [1u32, 2, 3, 4, 9, 0, 0xffff_ffff, rng.next() as u32, rng.below(64) as u32][rng.below(9)];
                b[i..i + 4].copy_from_slice(&v.to_be_bytes());
            }
            // A header field.
            2 => {
                let i = rng.below(10) * 4;
                let v = if rng.below(2) == 0 { rng.next() as u32 } else { rng.below(b.len() + 64) as u32 };
                b[i..i + 4].copy_from_slice(&v.to_be_bytes());
            }
            // Pure noise of random length.
            _ => {
                let n = rng.below(512);
                b = (0..n).map(|_| rng.next() as u8).collect();
                if n >= 4 && rng.below(2) == 0 {
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
