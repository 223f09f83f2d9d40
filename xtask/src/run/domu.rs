//! `cargo xtask run --domu N`: DomUs described with Xen's dom0less binding
//! in the DTB QEMU hands the hypervisor.
//!
//! How a run with DomUs is made:
//! - RAM: QEMU's `-m` grows by N × (`--domu-mem` + [`DOMU_DISK_MB`]) for
//!   the DomUs' RAM and disks (the hypervisor places them, `boot::plan`),
//!   plus room for one copy of the DomU kernel and initramfs at the top of
//!   RAM, far from what QEMU places itself (the hypervisor at RAM + 2 MiB,
//!   its DTB at RAM + 128 MiB, Dom0's modules from 0x50000000).
//! - Modules: QEMU's generic loader puts the kernel and initramfs there
//!   (`-device loader,file=…,addr=…,force-raw=on`); every DomU's module
//!   nodes name the same two ranges (the plan allows DomUs to share a module
//!   exactly).
//! - DTB: QEMU dumps its own tree for the same command line (`-machine
//!   dumpdtb=`, [`crate::firmware::tf_a::dump_args`]); [`add_domus`] copies it
//!   with one `/chosen/domU<i>` node per DomU added, and the run passes it
//!   with `-dtb`. Under `--firmware tf-a` the DTB that run writes anyway gets
//!   the same nodes.
//! - Command: each DomU's kernel command line is `console=ttyAMA0` plus
//!   `guestcmd=<base64 of --domu-cmd>`, the guest image's /init protocol, so
//!   the same initramfs runs Dom0's `--cmd` and the DomUs' `--domu-cmd`.

use crate::Result;
use anyhow::{anyhow, bail, Context};
use std::path::Path;

/// Each DomU's RAM disk (`hv,disk-size`).
pub const DOMU_DISK_MB: u64 = 64;
/// The DomU kernel's command line before `guestcmd=`.
pub const DOMU_ARGS: &str = "console=ttyAMA0";
const MIB: u64 = 1 << 20;
const ALIGN: u64 = 2 * MIB;

/// What `--domu N --domu-cmd … --domu-mem … --domu-vcpus … --domu-weight …
/// --domu-cap …` ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomuOptions {
    pub count: u32,
    pub cmd: Option<String>,
    pub mem_mb: u64,
    pub vcpus: u32,
    /// Credit2 weights (`hv,sched-weight`), DomU 1, 2, …; one value is
    /// every DomU's, none leaves the property out (the hypervisor's 256).
    pub weights: Vec<u32>,
    /// Credit2 caps in percent of a pCPU (`hv,sched-cap`), as `weights`.
    pub caps: Vec<u32>,
    /// Extra kernel arguments for every DomU (tests).
    pub append: Option<String>,
    /// The DomUs' own kernel file instead of Dom0's (tests: another format).
    pub kernel: Option<std::path::PathBuf>,
    /// `hv,kernel-load-addr`: the DomUs' kernel is a raw binary loaded (and
    /// entered) at this guest-physical address.
    pub kernel_load_addr: Option<u64>,
    /// `hv,pci-assigned` of domU1: a PCIe function, "SSSS:BB:DD.F".
    pub pci: Option<String>,
}

impl Default for DomuOptions {
    fn default() -> Self {
        DomuOptions {
            count: 1,
            cmd: None,
            mem_mb: 256,
            vcpus: 1,
            weights: Vec::new(),
            caps: Vec::new(),
            append: None,
            kernel: None,
            kernel_load_addr: None,
            pci: None,
        }
    }
}

impl DomuOptions {
    /// DomU `i`'s (1-based) value in `list`: its own, else the one value
    /// given for all, else none.
    fn nth(list: &[u32], i: u32) -> Option<u32> {
        match list {
            [] => None,
            [all] => Some(*all),
            l => l.get(i as usize - 1).copied(),
        }
    }

    /// Checks that `weights` and `caps` have one value or one per DomU.
    pub fn check(&self) -> Result<()> {
        for (name, l) in [("--domu-weight", &self.weights), ("--domu-cap", &self.caps)] {
            if l.len() > 1 && l.len() != self.count as usize {
                bail!("{name}: {} values for {} DomUs (give one, or one per DomU)", l.len(), self.count);
            }
        }
        Ok(())
    }
}

/// One `/chosen/domU<i>` node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomuNode {
    pub name: String,
    pub memory_kib: u64,
    pub cpus: u32,
    pub disk_size: u64,
    /// `hv,sched-weight` / `hv,sched-cap` (absent when `None`).
    pub weight: Option<u32>,
    pub cap: Option<u32>,
    /// (base, size) of the kernel and the initramfs in host RAM.
    pub kernel: (u64, u64),
    pub ramdisk: Option<(u64, u64)>,
    pub bootargs: String,
    /// `hv,kernel-load-addr` (absent when `None`).
    pub kernel_load_addr: Option<u64>,
    /// `hv,pci-assigned` (absent when `None`).
    pub pci: Option<String>,
}

/// Where a run with DomUs puts things.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomuLayout {
    /// MiB added to QEMU's `-m`.
    pub extra_mb: u64,
    pub nodes: Vec<DomuNode>,
    /// QEMU arguments that load the modules.
    pub loader_args: Vec<String>,
}

fn align_up(v: u64) -> u64 {
    v.div_ceil(ALIGN) * ALIGN
}

/// The layout for `o` on a machine whose RAM, before the DomUs' share is
/// added, is `base_mb` MiB from `ram_base`; `kernel` and `initrd` are the
/// files (with their lengths).
pub fn layout(
    o: &DomuOptions,
    ram_base: u64,
    base_mb: u64,
    kernel: (&Path, u64),
    initrd: Option<(&Path, u64)>,
) -> DomuLayout {
    let modules = align_up(kernel.1) + initrd.map_or(0, |i| align_up(i.1));
    let extra_mb = u64::from(o.count) * (o.mem_mb + DOMU_DISK_MB) + modules / MIB;
    let top = ram_base + (base_mb + extra_mb) * MIB;
    let kernel_at = top - modules;
    let initrd_at = kernel_at + align_up(kernel.1);
    let mut bootargs = String::from(DOMU_ARGS);
    if let Some(a) = &o.append {
        bootargs.push(' ');
        bootargs.push_str(a);
    }
    if let Some(cmd) = &o.cmd {
        bootargs.push_str(&format!(" guestcmd={}", crate::text::base64(cmd.as_bytes())));
    }
    let nodes = (1..=o.count)
        .map(|i| DomuNode {
            name: format!("domU{i}"),
            memory_kib: o.mem_mb * 1024,
            cpus: o.vcpus.max(1),
            disk_size: DOMU_DISK_MB * MIB,
            weight: DomuOptions::nth(&o.weights, i),
            cap: DomuOptions::nth(&o.caps, i),
            kernel: (kernel_at, kernel.1),
            ramdisk: initrd.map(|i| (initrd_at, i.1)),
            bootargs: bootargs.clone(),
            kernel_load_addr: o.kernel_load_addr,
            pci: o.pci.clone().filter(|_| i == 1),
        })
        .collect();
    let loader = |file: &Path, at: u64| {
        [
            "-device".to_string(),
            format!("loader,file={},addr={at:#x},force-raw=on", file.display().to_string().replace(',', ",,")),
        ]
    };
    let mut loader_args = loader(kernel.0, kernel_at).to_vec();
    if let Some(i) = initrd {
        loader_args.extend(loader(i.0, initrd_at));
    }
    DomuLayout { extra_mb, nodes, loader_args }
}

/// `dtb` with the DomU nodes added at the end of `/chosen` (created when
/// absent). Everything else is copied byte for byte, the memory
/// reservations included.
pub fn add_domus(dtb: &[u8], domus: &[DomuNode]) -> Result<Vec<u8>> {
    use vm_fdt::{FdtReserveEntry, FdtWriter};
    let f = fdt::Fdt::new(dtb).map_err(|e| anyhow!("QEMU's DTB: {e:?}"))?;
    let rsv: Vec<FdtReserveEntry> = f
        .memory_reservations()
        .map(|r| FdtReserveEntry::new(r.address() as u64, r.size() as u64))
        .collect::<std::result::Result<_, _>>()
        .context("memory reservation")?;
    let mut w = FdtWriter::new_with_mem_reserv(&rsv)?;
    let root = f.all_nodes().next().context("QEMU's DTB has no root node")?;
    let top = w.begin_node("")?;
    for p in root.properties() {
        w.property(p.name, p.value)?;
    }
    let mut chosen_seen = false;
    for c in root.children() {
        if c.name == "chosen" {
            chosen_seen = true;
            let n = w.begin_node(c.name)?;
            for p in c.properties() {
                w.property(p.name, p.value)?;
            }
            for cc in c.children() {
                copy(&mut w, cc)?;
            }
            write_domus(&mut w, domus)?;
            w.end_node(n)?;
        } else {
            copy(&mut w, c)?;
        }
    }
    if !chosen_seen {
        let n = w.begin_node("chosen")?;
        write_domus(&mut w, domus)?;
        w.end_node(n)?;
    }
    w.end_node(top)?;
    Ok(w.finish()?)
}

fn copy(w: &mut vm_fdt::FdtWriter, n: fdt::node::FdtNode<'_, '_>) -> Result<()> {
    let node = w.begin_node(n.name)?;
    for p in n.properties() {
        w.property(p.name, p.value)?;
    }
    for c in n.children() {
        copy(w, c)?;
    }
    Ok(w.end_node(node)?)
}

fn write_domus(w: &mut vm_fdt::FdtWriter, domus: &[DomuNode]) -> Result<()> {
    let e = anyhow::Error::new::<vm_fdt::Error>;
    for d in domus {
        let n = w.begin_node(&d.name).map_err(e)?;
        w.property_string("compatible", "xen,domain").map_err(e)?;
        w.property_u32("#address-cells", 2).map_err(e)?;
        w.property_u32("#size-cells", 2).map_err(e)?;
        // Xen writes `memory` as two cells.
        w.property_u64("memory", d.memory_kib).map_err(e)?;
        w.property_u32("cpus", d.cpus).map_err(e)?;
        w.property_null("vpl011").map_err(e)?;
        w.property_u64("hv,disk-size", d.disk_size).map_err(e)?;
        if let Some(v) = d.weight {
            w.property_u32("hv,sched-weight", v).map_err(e)?;
        }
        if let Some(v) = d.cap {
            w.property_u32("hv,sched-cap", v).map_err(e)?;
        }
        if let Some(a) = d.kernel_load_addr {
            w.property_u64("hv,kernel-load-addr", a).map_err(e)?;
        }
        if let Some(bdf) = &d.pci {
            w.property_string("hv,pci-assigned", bdf).map_err(e)?;
        }
        let modules = [Some(("multiboot,kernel", d.kernel)), d.ramdisk.map(|r| ("multiboot,ramdisk", r))];
        for (kind, (base, size)) in modules.into_iter().flatten() {
            let m = w.begin_node(&format!("module@{base:x}")).map_err(e)?;
            w.property_string_list("compatible", vec![kind.into(), "multiboot,module".into()]).map_err(e)?;
            w.property_array_u64("reg", &[base, size]).map_err(e)?;
            if kind == "multiboot,kernel" {
                w.property_string("bootargs", &d.bootargs).map_err(e)?;
            }
            w.end_node(m).map_err(e)?;
        }
        w.end_node(n).map_err(e)?;
    }
    Ok(())
}

/// Writes `dtb`: QEMU's own tree for `run_args` (dumped with
/// `-machine dumpdtb=`) plus the DomU nodes.
pub fn write_dtb(run_args: &[String], dtb: &Path, domus: &[DomuNode]) -> Result<()> {
    if let Some(d) = dtb.parent() {
        std::fs::create_dir_all(d).with_context(|| d.display().to_string())?;
    }
    let qemu = crate::toolchain::qemu()?;
    let out = qemu
        .command()
        .args(crate::firmware::tf_a::dump_args(run_args, dtb))
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| qemu.bin.display().to_string())?;
    if !out.status.success() || !dtb.is_file() {
        bail!("QEMU did not dump its DTB: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    add_to_file(dtb, domus)
}

/// Adds the DomU nodes to the DTB file `dtb` in place.
pub fn add_to_file(dtb: &Path, domus: &[DomuNode]) -> Result<()> {
    let blob = std::fs::read(dtb).with_context(|| dtb.display().to_string())?;
    let out = add_domus(&blob, domus)?;
    std::fs::write(dtb, out).with_context(|| dtb.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hypervisor::dtb::dom0less;
    use hypervisor::dtb::{discover, Region};

    /// QEMU 7.2's virt DTB (GICv3, 2 CPUs, 1 GiB, Dom0's modules at
    /// 0x50000000/0x58000000), from the hypervisor's test data.
    const QEMU_DTB: &[u8] = include_bytes!("../../../hypervisor/machine/src/dtb/testdata/qemu-virt-gicv3-smp2.dtb");

    fn two() -> DomuLayout {
        let o = DomuOptions { count: 2, cmd: Some("echo hi".into()), mem_mb: 256, vcpus: 2, ..Default::default() };
        layout(&o, 0x4000_0000, 1536, (Path::new("/g/Image"), 27_303_872), Some((Path::new("/g/init,rd"), 86_978_560)))
    }

    #[test]
    fn the_layout_puts_the_modules_at_the_top_of_the_grown_ram() {
        let l = two();
        // 2 × (256 + 64) MiB, then 28 + 84 MiB of modules.
        assert_eq!(l.extra_mb, 640 + 112);
        let top = 0x4000_0000 + (1536 + 752) * MIB;
        assert_eq!(l.nodes[0].kernel, (top - 112 * MIB, 27_303_872));
        assert_eq!(l.nodes[0].ramdisk, Some((top - 84 * MIB, 86_978_560)));
        assert_eq!(l.nodes[1].kernel, l.nodes[0].kernel);
        assert_eq!(l.nodes[1].name, "domU2");
        assert_eq!(l.nodes[0].bootargs, "console=ttyAMA0 guestcmd=ZWNobyBoaQ==");
        assert_eq!(
            l.loader_args.join(" "),
            format!(
                "-device loader,file=/g/Image,addr={:#x},force-raw=on -device loader,file=/g/init,,rd,addr={:#x},force-raw=on",
                top - 112 * MIB,
                top - 84 * MIB
            )
        );
    }

    #[test]
    fn the_domus_round_trip_through_the_hypervisors_parser() {
        let l = two();
        let dtb = add_domus(QEMU_DTB, &l.nodes).unwrap();
        let d = dom0less::parse(&dtb).unwrap();
        assert_eq!(d.len(), 2);
        for (i, d) in d.iter().enumerate() {
            assert_eq!(d.id as usize, i + 1);
            assert_eq!(d.name, format!("domU{}", i + 1));
            assert_eq!((d.memory, d.vcpus, d.vpl011, d.disk_size), (256 * MIB, 2, true, 64 * MIB));
            assert_eq!(d.kernel, Region { base: l.nodes[0].kernel.0, size: l.nodes[0].kernel.1 });
            assert_eq!(d.ramdisk.map(|r| (r.base, r.size)), l.nodes[0].ramdisk);
            assert_eq!(d.bootargs, "console=ttyAMA0 guestcmd=ZWNobyBoaQ==");
            assert_eq!((d.weight, d.cap_percent), (256, None));
        }
        // The rest of the machine is what QEMU described.
        let (machine_before, before) = discover(QEMU_DTB).unwrap();
        let (machine_after, after) = discover(&dtb).unwrap();
        assert_eq!(machine_after, machine_before);
        assert_eq!(after.domus, d);
        assert!(d.iter().all(|d| d.kernel_load_addr.is_none()));
        // A raw DomU kernel: hv,kernel-load-addr reaches the parser.
        let o = DomuOptions { kernel_load_addr: Some(0x4000_0000), ..Default::default() };
        let l = layout(&o, 0x4000_0000, 1536, (Path::new("/g/conformance.bin"), 80_000), None);
        let d = dom0less::parse(&add_domus(QEMU_DTB, &l.nodes).unwrap()).unwrap();
        assert_eq!(d[0].kernel_load_addr, Some(0x4000_0000));
        assert_eq!(hypervisor::dtb::BootInfo { domus: Vec::new(), ..after }, before);
        // No DomU: the same tree.
        assert_eq!(discover(&add_domus(QEMU_DTB, &[]).unwrap()).unwrap(), (machine_before, before));
    }

    #[test]
    fn weights_and_caps_reach_the_hypervisors_parser() {
        let with = |weights: Vec<u32>, caps: Vec<u32>| {
            let o = DomuOptions { count: 3, mem_mb: 256, weights, caps, ..Default::default() };
            o.check().map(|()| {
                let l = layout(&o, 0x4000_0000, 1024, (Path::new("/g/Image"), 1 << 20), None);
                let d = dom0less::parse(&add_domus(QEMU_DTB, &l.nodes).unwrap()).unwrap();
                d.iter().map(|d| (d.weight, d.cap_percent)).collect::<Vec<_>>()
            })
        };
        // One value per DomU, in order.
        assert_eq!(
            with(vec![512, 256, 128], vec![25, 0, 100]).unwrap(),
            [(512, Some(25)), (256, None), (128, Some(100))]
        );
        // One value for all; none: the properties are left out.
        assert_eq!(with(vec![1000], vec![]).unwrap(), [(1000, None); 3]);
        assert_eq!(with(vec![], vec![50]).unwrap(), [(256, Some(50)); 3]);
        let l = layout(&DomuOptions::default(), 0x4000_0000, 1024, (Path::new("/g/Image"), 1 << 20), None);
        let dtb = add_domus(QEMU_DTB, &l.nodes).unwrap();
        let f = fdt::Fdt::new(&dtb).unwrap();
        let n = f.find_node("/chosen/domU1").unwrap();
        assert!(n.property("hv,sched-weight").is_none() && n.property("hv,sched-cap").is_none());
        // The cells as written: one big-endian u32 each.
        let o = DomuOptions { weights: vec![512], caps: vec![25], ..Default::default() };
        let l = layout(&o, 0x4000_0000, 1024, (Path::new("/g/Image"), 1 << 20), None);
        let dtb = add_domus(QEMU_DTB, &l.nodes).unwrap();
        let f = fdt::Fdt::new(&dtb).unwrap();
        let n = f.find_node("/chosen/domU1").unwrap();
        assert_eq!(n.property("hv,sched-weight").unwrap().value, 512u32.to_be_bytes());
        assert_eq!(n.property("hv,sched-cap").unwrap().value, 25u32.to_be_bytes());
        // Neither one nor one per DomU.
        let e = format!("{:#}", with(vec![1, 2], vec![]).unwrap_err());
        assert!(e.contains("--domu-weight: 2 values for 3 DomUs"), "{e}");
        assert!(with(vec![], vec![1, 2, 3, 4]).unwrap_err().to_string().starts_with("--domu-cap: 4 values"));
    }

    #[test]
    fn a_tree_without_chosen_gets_one() {
        let mut w = vm_fdt::FdtWriter::new().unwrap();
        let root = w.begin_node("").unwrap();
        w.property_u32("#address-cells", 2).unwrap();
        w.end_node(root).unwrap();
        let l = two();
        let d = dom0less::parse(&add_domus(&w.finish().unwrap(), &l.nodes[..1]).unwrap()).unwrap();
        assert_eq!(d.len(), 1);
        assert!(add_domus(b"not a tree", &l.nodes).is_err());
    }
}
