//! `cargo xtask run --platform fvp`: the hypervisor on Arm's FVP Base RevC
//! (`FVP_Base_RevC-2xAEMvA`), entered by the user's TF-A build as a
//! preloaded BL33 at EL2.
//!
//! What is loaded where (every address but the hypervisor's is this
//! module's choice; the hypervisor's is `platforms/fvp-base-revc`'s):
//!
//! | what | how | address |
//! |---|---|---|
//! | TF-A BL1 | `bp.secureflashloader.fname` | flash 0 |
//! | TF-A FIP (BL2, BL31) | `bp.flashloader0.fname` | flash |
//! | the hypervisor (BL33) | `--data cluster0.cpu0` | [`hv_addr`] (0x88000000) |
//! | the DTB made by [`make_dtb`] | `--data` | [`DTB_ADDR`] (TF-A's `ARM_PRELOADED_DTB_BASE`) |
//! | Dom0's kernel, initrd | `--data`, `/chosen/module@…` | [`KERNEL_ADDR`], next 2 MiB boundary + 2 MiB |
//! | the disk image | `bp.virtioblockdevice.image_path` | virtio-mmio 0x1C130000, SPI 42 |
//!
//! TF-A must be built for this: `make PLAT=fvp ARM_LINUX_KERNEL_AS_BL33=1
//! PRELOADED_BL33_BASE=0x88000000 ARM_PRELOADED_DTB_BASE=0x82000000 all fip`
//! (BL31 then enters BL33 at EL2 with x0 = the DTB).

use crate::run::qemu::RunOptions;
use crate::Result;
use anyhow::{anyhow, bail, Context};
use hypervisor::platform_desc::known::fvp_base_revc::PLATFORM;
use std::path::{Path, PathBuf};
use vm_fdt::{FdtReserveEntry, FdtWriter};

/// The model's executable name (looked up on PATH).
pub const FVP_NAME: &str = "FVP_Base_RevC-2xAEMvA";
/// Environment variable naming the model's executable.
pub const FVP_ENV: &str = "FVP_BIN";
/// Environment variable naming the TF-A build directory (bl1.bin, fip.bin).
pub const TFA_ENV: &str = "TFA_BUILD";
/// Where the DTB is preloaded (TF-A's default `ARM_PRELOADED_DTB_BASE`).
pub const DTB_ADDR: u64 = 0x8200_0000;
/// Dom0's kernel: 256 MiB above DRAM's base, below the RAM the hypervisor
/// gives the guest (it keeps `hyp_reserved`, 512 MiB, above the RAM base).
pub const KERNEL_ADDR: u64 = 0x9000_0000;
/// DRAM bank 0; its top 16 MiB is secure (TZC) and left out of /memory.
const DRAM0: (u64, u64) = (0x8000_0000, 0x8000_0000 - (16 << 20));
/// PL011 UART0: the descriptor's early console.
const UART0: u64 = PLATFORM.early_uart;
const VIRTIO_BLK: u64 = 0x1C13_0000;
const GICD: u64 = 0x2F00_0000;
const GICR: u64 = 0x2F10_0000;
const ITS: u64 = 0x2F02_0000;
/// FVP Base RevC has two clusters of four cores.
pub const MAX_CPUS: u32 = 8;
/// The guest's default command line on FVP.
pub const DEFAULT_GUEST_ARGS: &str = "console=ttyAMA0 earlycon=pl011,0x1c090000";
/// Where to get the model, for the error without one.
pub const GET_FVP: &str = "download \"Arm Architecture FVPs\" (Armv-A Base RevC AEM FVP) from Arm's Ecosystem FVPs page \
     (developer.arm.com > Tools and Software > Fixed Virtual Platforms), then put FVP_Base_RevC-2xAEMvA on PATH, set FVP_BIN \
     to its path or FVP_BASE to the unpacked package";

/// The hypervisor's load address on FVP (the platform descriptor's).
pub fn hv_addr() -> u64 {
    PLATFORM.load_address
}

/// Everything one FVP run names.
#[derive(Clone, Debug)]
pub struct FvpRun {
    /// The model's executable.
    pub fvp: PathBuf,
    /// TF-A's build directory (bl1.bin, fip.bin).
    pub tfa: PathBuf,
    pub hypervisor: PathBuf,
    pub dtb: PathBuf,
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    /// Where the initrd is preloaded (see [`initrd_addr`]).
    pub initrd_addr: u64,
    pub disk: PathBuf,
}

/// The initrd goes at the next 2 MiB boundary after the kernel, plus 2 MiB
/// (as the QEMU runner places it).
pub fn initrd_addr(kernel_size: u64) -> u64 {
    (KERNEL_ADDR + kernel_size).next_multiple_of(2 << 20) + (2 << 20)
}

/// The model's command line (the executable first). GICv4.1 with one ITS,
/// UART0 on standard output, only CPU 0 powered at reset (TF-A starts the
/// others through PSCI).
pub fn command_line(r: &FvpRun) -> Vec<String> {
    let data = |file: &Path, addr: u64| ["--data".to_string(), format!("cluster0.cpu0={}@{addr:#x}", file.display())];
    let mut v = vec![r.fvp.display().to_string()];
    for (k, val) in [
        ("bp.secureflashloader.fname", r.tfa.join("bl1.bin").display().to_string()),
        ("bp.flashloader0.fname", r.tfa.join("fip.bin").display().to_string()),
    ] {
        v.extend(["-C".to_string(), format!("{k}={val}")]);
    }
    v.extend(data(&r.hypervisor, hv_addr()));
    v.extend(data(&r.dtb, DTB_ADDR));
    v.extend(data(&r.kernel, KERNEL_ADDR));
    if let Some(i) = &r.initrd {
        v.extend(data(i, r.initrd_addr));
    }
    let params = [
        format!("bp.virtioblockdevice.image_path={}", r.disk.display()),
        // GICv4.1 with one ITS (the ITS table types are those Arm's GIC
        // examples use).
        "gic_distributor.virtual-lpi-support=1".into(),
        "has-gicv4.1=1".into(),
        "gic_distributor.ITS-count=1".into(),
        "gic_distributor.ITS-vmovp-bit=1".into(),
        "gic_distributor.GITS_BASER0-type=1".into(),
        "gic_distributor.GITS_BASER1-type=4".into(),
        "gic_distributor.GITS_BASER2-type=2".into(),
        "gic_distributor.common-lpi-configuration=2".into(),
        "gic_distributor.ITS-shared-vPE-table=2".into(),
        "cluster0.gicv3.cpuintf-mmap-access-level=2".into(),
        "cluster1.gicv3.cpuintf-mmap-access-level=2".into(),
        // Only CPU 0 runs at reset; no secure carve-out checks beyond TF-A's.
        "pctl.startup=0.0.0.0".into(),
        "bp.secure_memory=0".into(),
        "bp.refcounter.non_arch_start_at_default=1".into(),
        "bp.ve_sysregs.exit_on_shutdown=1".into(),
        "cache_state_modelled=0".into(),
        // The console: UART0 on standard output, no telnet window.
        "bp.vis.disable_visualisation=1".into(),
        "bp.terminal_0.start_telnet=0".into(),
        "bp.pl011_uart0.out_file=-".into(),
        "bp.pl011_uart0.unbuffered_output=1".into(),
    ];
    for p in params {
        v.extend(["-C".to_string(), p]);
    }
    v
}

/// The modules' placement and the options written into the DTB.
#[derive(Clone, Debug)]
pub struct DtbSpec {
    pub cpus: u32,
    /// The hypervisor's options (`/chosen/bootargs`).
    pub hv_args: String,
    pub kernel: (u64, u64),
    pub initrd: Option<(u64, u64)>,
    pub guest_args: String,
}

/// An FVP Base RevC device tree with the hypervisor's boot modules under
/// `/chosen` (Xen's multiboot binding). Flat: the UART and virtio-blk sit at
/// the root with 3-cell GIC interrupts (the real FVP trees nest them under
/// `ranges` buses with an `interrupt-map`; the hypervisor reads both).
pub fn make_dtb(s: &DtbSpec) -> Result<Vec<u8>> {
    let e = |e: vm_fdt::Error| anyhow!("dtb: {e}");
    let cpus = s.cpus.clamp(1, MAX_CPUS);
    // The first 64 KiB of DRAM: TF-A's secondary-CPU mailbox.
    let reserve = [FdtReserveEntry::new(DRAM0.0, 0x1_0000).map_err(e)?];
    let mut w = FdtWriter::new_with_mem_reserv(&reserve).map_err(e)?;
    let root = w.begin_node("").map_err(e)?;
    w.property_string_list("compatible", vec!["arm,fvp-base-revc".into(), "arm,vexpress".into()]).map_err(e)?;
    w.property_string("model", "FVP Base RevC").map_err(e)?;
    w.property_u32("#address-cells", 2).map_err(e)?;
    w.property_u32("#size-cells", 2).map_err(e)?;
    w.property_u32("interrupt-parent", 1).map_err(e)?;

    let chosen = w.begin_node("chosen").map_err(e)?;
    w.property_string("bootargs", &s.hv_args).map_err(e)?;
    w.property_string("stdout-path", &format!("/uart@{UART0:x}")).map_err(e)?;
    w.property_u32("#address-cells", 2).map_err(e)?;
    w.property_u32("#size-cells", 2).map_err(e)?;
    let k = w.begin_node(&format!("module@{:x}", s.kernel.0)).map_err(e)?;
    w.property_string_list("compatible", vec!["multiboot,kernel".into(), "multiboot,module".into()]).map_err(e)?;
    w.property_array_u64("reg", &[s.kernel.0, s.kernel.1]).map_err(e)?;
    w.property_string("bootargs", &s.guest_args).map_err(e)?;
    w.end_node(k).map_err(e)?;
    if let Some((base, size)) = s.initrd {
        let i = w.begin_node(&format!("module@{base:x}")).map_err(e)?;
        w.property_string_list("compatible", vec!["multiboot,ramdisk".into(), "multiboot,module".into()]).map_err(e)?;
        w.property_array_u64("reg", &[base, size]).map_err(e)?;
        w.end_node(i).map_err(e)?;
    }
    w.end_node(chosen).map_err(e)?;

    let mem = w.begin_node(&format!("memory@{:x}", DRAM0.0)).map_err(e)?;
    w.property_string("device_type", "memory").map_err(e)?;
    w.property_array_u64("reg", &[DRAM0.0, DRAM0.1]).map_err(e)?;
    w.end_node(mem).map_err(e)?;

    let cn = w.begin_node("cpus").map_err(e)?;
    w.property_u32("#address-cells", 2).map_err(e)?;
    w.property_u32("#size-cells", 0).map_err(e)?;
    for n in 0..cpus {
        // Shifted affinity: cluster in Aff2, core in Aff1.
        let mpidr = (u64::from(n / 4) << 16) | (u64::from(n % 4) << 8);
        let c = w.begin_node(&format!("cpu@{mpidr:x}")).map_err(e)?;
        w.property_string("device_type", "cpu").map_err(e)?;
        w.property_string("compatible", "arm,armv8").map_err(e)?;
        w.property_array_u64("reg", &[mpidr]).map_err(e)?;
        w.property_string("enable-method", "psci").map_err(e)?;
        w.end_node(c).map_err(e)?;
    }
    w.end_node(cn).map_err(e)?;

    let psci = w.begin_node("psci").map_err(e)?;
    w.property_string_list("compatible", vec!["arm,psci-1.0".into(), "arm,psci-0.2".into()]).map_err(e)?;
    w.property_string("method", "smc").map_err(e)?;
    w.end_node(psci).map_err(e)?;

    let gic = w.begin_node(&format!("interrupt-controller@{GICD:x}")).map_err(e)?;
    w.property_string("compatible", "arm,gic-v3").map_err(e)?;
    w.property_u32("#interrupt-cells", 3).map_err(e)?;
    w.property_u32("#address-cells", 2).map_err(e)?;
    w.property_u32("#size-cells", 2).map_err(e)?;
    w.property_null("ranges").map_err(e)?;
    w.property_null("interrupt-controller").map_err(e)?;
    // GICv4.1 redistributors: 256 KiB each, eight CPUs.
    w.property_array_u64("reg", &[GICD, 0x1_0000, GICR, u64::from(MAX_CPUS) * 0x4_0000]).map_err(e)?;
    w.property_array_u32("interrupts", &[1, 9, 4]).map_err(e)?;
    w.property_phandle(1).map_err(e)?;
    let its = w.begin_node(&format!("msi-controller@{ITS:x}")).map_err(e)?;
    w.property_string("compatible", "arm,gic-v3-its").map_err(e)?;
    w.property_null("msi-controller").map_err(e)?;
    w.property_u32("#msi-cells", 1).map_err(e)?;
    w.property_array_u64("reg", &[ITS, 0x2_0000]).map_err(e)?;
    w.end_node(its).map_err(e)?;
    w.end_node(gic).map_err(e)?;

    let t = w.begin_node("timer").map_err(e)?;
    w.property_string("compatible", "arm,armv8-timer").map_err(e)?;
    // Secure, non-secure physical, virtual, hypervisor PPIs; level, high.
    w.property_array_u32("interrupts", &[1, 13, 4, 1, 14, 4, 1, 11, 4, 1, 10, 4]).map_err(e)?;
    w.end_node(t).map_err(e)?;

    let clk = w.begin_node("clock-24000000").map_err(e)?;
    w.property_string("compatible", "fixed-clock").map_err(e)?;
    w.property_u32("#clock-cells", 0).map_err(e)?;
    w.property_u32("clock-frequency", 24_000_000).map_err(e)?;
    w.property_phandle(2).map_err(e)?;
    w.end_node(clk).map_err(e)?;

    let u = w.begin_node(&format!("uart@{UART0:x}")).map_err(e)?;
    w.property_string_list("compatible", vec!["arm,pl011".into(), "arm,primecell".into()]).map_err(e)?;
    w.property_array_u64("reg", &[UART0, 0x1000]).map_err(e)?;
    // The descriptor's UART SPI (5 on FVP Base), level high.
    w.property_array_u32("interrupts", &[0, PLATFORM.uart_intid.number(), 4]).map_err(e)?;
    w.property_array_u32("clocks", &[2, 2]).map_err(e)?;
    w.property_string_list("clock-names", vec!["uartclk".into(), "apb_pclk".into()]).map_err(e)?;
    w.end_node(u).map_err(e)?;

    let v = w.begin_node(&format!("virtio-block@{VIRTIO_BLK:x}")).map_err(e)?;
    w.property_string("compatible", "virtio,mmio").map_err(e)?;
    w.property_array_u64("reg", &[VIRTIO_BLK, 0x200]).map_err(e)?;
    w.property_array_u32("interrupts", &[0, 42, 4]).map_err(e)?;
    w.property_null("dma-coherent").map_err(e)?;
    w.end_node(v).map_err(e)?;

    w.end_node(root).map_err(e)?;
    w.finish().map_err(e)
}

/// The model: `explicit` (`--fvp`), else `$FVP_BIN`, else the model inside
/// the unpacked FVP package named by `$FVP_BASE` (`models/*/`), else the
/// first `FVP_Base_RevC-2xAEMvA` on PATH.
pub fn find_fvp(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os(FVP_ENV).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Some(base) = std::env::var_os(FVP_BASE_ENV).filter(|v| !v.is_empty()) {
        if let Some(p) = in_package(Path::new(&base)) {
            return Some(p);
        }
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(FVP_NAME)).find(|p| p.is_file())
}

/// Environment variable naming the unpacked FVP package (or the model).
pub const FVP_BASE_ENV: &str = "FVP_BASE";

/// The model in an FVP package: `dir` itself, `dir/FVP_…`, or
/// `dir/models/<host>/FVP_…` (the layout of Arm's tarball).
pub fn in_package(dir: &Path) -> Option<PathBuf> {
    if dir.is_file() {
        return Some(dir.to_path_buf());
    }
    let direct = dir.join(FVP_NAME);
    if direct.is_file() {
        return Some(direct);
    }
    let mut hosts: Vec<PathBuf> =
        std::fs::read_dir(dir.join("models")).ok()?.filter_map(|e| Some(e.ok()?.path())).collect();
    hosts.sort();
    hosts.into_iter().map(|h| h.join(FVP_NAME)).find(|p| p.is_file())
}

/// TF-A's build directory: `explicit` (`--tf-a`), else `$TFA_BUILD`.
pub fn find_tfa(explicit: Option<&Path>) -> Option<PathBuf> {
    explicit.map(Path::to_path_buf).or_else(|| std::env::var_os(TFA_ENV).filter(|v| !v.is_empty()).map(PathBuf::from))
}

/// Most of DRAM bank 0 the guest may have: the bank less the secure top
/// 16 MiB and the hypervisor's `hyp_reserved`.
pub fn max_guest_mb() -> u64 {
    (DRAM0.1 - PLATFORM.hyp_reserved) >> 20
}

/// A run's plan: the DTB written to `out/fvp.dtb`, the files named, and
/// whether the model and TF-A were found (a dry run prints placeholders).
#[derive(Debug)]
pub struct Plan {
    pub run: FvpRun,
    pub have_fvp: bool,
    pub have_tfa: bool,
}

/// What a run on FVP takes from the command line (`cargo xtask run
/// --platform fvp`, [`crate::cli::RunArgs::fvp_args`]), as plain values.
#[derive(Clone, Debug, Default)]
pub struct FvpArgs {
    /// `--mem`, in MiB.
    pub mem_mb: u64,
    /// `--pcpus`, as given.
    pub pcpus: Option<u32>,
    /// `--append`: the guest's command line.
    pub append: Option<String>,
    /// `--fvp`: the model.
    pub fvp: Option<PathBuf>,
    /// `--tf-a`: TF-A's build directory.
    pub tfa: Option<PathBuf>,
    /// `--disk-image`: the virtio-blk disk image.
    pub disk_image: Option<PathBuf>,
}

/// Plans a run from the command line and the built images: writes the DTB
/// (the hypervisor's options, Dom0's modules) into `out`. `run_options` are
/// the run's options as the QEMU runner composes them (the hypervisor's
/// options, `--disk` included), asked for once the files are checked.
pub fn plan(
    args: &FvpArgs,
    run_options: impl FnOnce() -> Result<RunOptions>,
    hypervisor: PathBuf,
    kernel: PathBuf,
    initrd: Option<PathBuf>,
    out: &Path,
) -> Result<Plan> {
    if args.mem_mb > max_guest_mb() {
        bail!("--mem {}M: FVP's first DRAM bank leaves at most {}M for the guest", args.mem_mb, max_guest_mb());
    }
    if let Some(n) = args.pcpus.filter(|&n| n > MAX_CPUS) {
        bail!("--pcpus {n}: FVP Base RevC has {MAX_CPUS} CPUs");
    }
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).with_context(|| p.display().to_string());
    let kernel_size = size(&kernel)?;
    let initrd_at = initrd_addr(kernel_size);
    let initrd_size = initrd.as_deref().map(size).transpose()?;
    if let Some(n) = initrd_size {
        if initrd_at + n > DRAM0.0 + DRAM0.1 {
            bail!("the initrd does not fit in FVP's first DRAM bank");
        }
    }
    // The hypervisor's options as the QEMU runner composes them (`--disk`
    // included; QEMU's own disk arguments are dropped).
    let o = run_options()?;
    let mut hv_args = format!("dom0_mem={}M dom0_max_vcpus={}", o.mem_mb, o.vcpus);
    if !o.hv_args.is_empty() {
        hv_args = format!("{hv_args} {}", o.hv_args);
    }
    let spec = DtbSpec {
        cpus: o.pcpus,
        hv_args,
        kernel: (KERNEL_ADDR, kernel_size),
        initrd: initrd_size.map(|n| (initrd_at, n)),
        guest_args: args.append.clone().unwrap_or_else(|| DEFAULT_GUEST_ARGS.into()),
    };
    std::fs::create_dir_all(out).with_context(|| out.display().to_string())?;
    let dtb = out.join("fvp.dtb");
    std::fs::write(&dtb, make_dtb(&spec)?).with_context(|| dtb.display().to_string())?;
    let fvp = find_fvp(args.fvp.as_deref());
    let tfa = find_tfa(args.tfa.as_deref());
    let disk = match &args.disk_image {
        Some(d) => d.clone(),
        None => crate::run::qemu::sparse_image(out.join("disk.img")).context("disk image")?,
    };
    Ok(Plan {
        have_fvp: fvp.is_some(),
        have_tfa: tfa.is_some(),
        run: FvpRun {
            fvp: fvp.unwrap_or_else(|| FVP_NAME.into()),
            tfa: tfa.unwrap_or_else(|| format!("${TFA_ENV}").into()),
            hypervisor,
            dtb,
            kernel,
            initrd,
            initrd_addr: initrd_at,
            disk,
        },
    })
}

/// How to build TF-A for this run.
pub const TFA_HOWTO: &str = "build TF-A (trusted-firmware-a) with `make PLAT=fvp ARM_LINUX_KERNEL_AS_BL33=1 \
     PRELOADED_BL33_BASE=0x88000000 ARM_PRELOADED_DTB_BASE=0x82000000 all fip` and name its build/fvp/release";

/// The command line for a shell, one option and its value a line.
pub fn printable(line: &[String]) -> String {
    let mut out = String::new();
    for (i, a) in line.iter().enumerate() {
        if i > 0 {
            out.push_str(if a.starts_with('-') { " \\\n    " } else { " " });
        }
        out.push_str(&shell_quote(a));
    }
    out
}

/// Shell-quotes one argument for the printed command line (`$` is kept
/// plain, so `$TFA_BUILD` in a dry run's line expands).
pub fn shell_quote(a: &str) -> String {
    if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=@:,+%$".contains(c)) {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> FvpRun {
        FvpRun {
            fvp: FVP_NAME.into(),
            tfa: "/tfa/build/fvp/release".into(),
            hypervisor: "/out/hypervisor-fvp-base-revc.bin".into(),
            dtb: "/out/fvp/fvp.dtb".into(),
            kernel: "/img/Image".into(),
            initrd: Some("/img/initramfs.cpio".into()),
            initrd_addr: initrd_addr(27 << 20),
            disk: "/out/disk.img".into(),
        }
    }

    #[test]
    fn command_line_names_every_image_at_its_address() {
        let line = command_line(&run()).join(" ");
        assert!(line.starts_with("FVP_Base_RevC-2xAEMvA "));
        for want in [
            "-C bp.secureflashloader.fname=/tfa/build/fvp/release/bl1.bin",
            "-C bp.flashloader0.fname=/tfa/build/fvp/release/fip.bin",
            "--data cluster0.cpu0=/out/hypervisor-fvp-base-revc.bin@0x88000000",
            "--data cluster0.cpu0=/out/fvp/fvp.dtb@0x82000000",
            "--data cluster0.cpu0=/img/Image@0x90000000",
            "--data cluster0.cpu0=/img/initramfs.cpio@0x91e00000",
            "-C bp.virtioblockdevice.image_path=/out/disk.img",
            "-C gic_distributor.virtual-lpi-support=1",
            "-C has-gicv4.1=1",
            "-C gic_distributor.ITS-count=1",
            "-C bp.pl011_uart0.out_file=-",
        ] {
            assert!(line.contains(want), "missing {want:?} in {line}");
        }
    }

    #[test]
    fn hypervisor_goes_where_the_fvp_platform_is_linked() {
        assert_eq!(hv_addr(), 0x8800_0000);
        // The DTB, the modules and the image do not overlap.
        let hv_end = hv_addr() + (32 << 20);
        assert!(DTB_ADDR + (2 << 20) <= hv_addr() && hv_end <= KERNEL_ADDR);
        assert_eq!(initrd_addr(1), KERNEL_ADDR + (4 << 20));
    }

    #[test]
    fn dtb_describes_the_machine_and_the_modules() {
        let spec = DtbSpec {
            cpus: 8,
            hv_args: "loglvl=debug".into(),
            kernel: (KERNEL_ADDR, 27 << 20),
            initrd: Some((initrd_addr(27 << 20), 80 << 20)),
            guest_args: DEFAULT_GUEST_ARGS.into(),
        };
        let blob = make_dtb(&spec).unwrap();
        let (p, boot) = hypervisor::dtb::discover(&blob).unwrap();
        assert_eq!(boot.bootargs.as_deref(), Some("loglvl=debug"));
        assert_eq!(p.uart.as_ref().map(|u| (u.base, u32::from(u.intid))), Some((0x1C09_0000, 37)));
        assert_eq!(p.virtio_mmio.len(), 1);
        assert_eq!(p.virtio_mmio[0].base, 0x1C13_0000);
        assert_eq!(u32::from(p.virtio_mmio[0].intid), 74);
        assert_eq!(p.cpus.len(), 8);
        assert_eq!(p.cpus.last().copied(), Some(0x10300));
        let k = boot.kernel.as_ref().unwrap();
        assert_eq!((k.base, k.size, k.bootargs.as_deref()), (KERNEL_ADDR, 27 << 20, Some(DEFAULT_GUEST_ARGS)));
        assert_eq!(boot.ramdisk.as_ref().map(|r| r.base), Some(0x91e0_0000));
        assert_eq!(p.memory.len(), 1);
        assert_eq!(u32::from(p.gic.maintenance_intid.unwrap()), 25);
    }

    #[test]
    fn dry_run_plan_writes_the_dtb_and_names_every_file() {
        use crate::cli::{Cli, Command};
        use clap::Parser;
        let dir = std::env::temp_dir().join(format!("xtask-fvp-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (k, i) = (dir.join("Image"), dir.join("initrd"));
        std::fs::write(&k, vec![0u8; 3 << 20]).unwrap();
        std::fs::write(&i, vec![0u8; 1 << 20]).unwrap();
        let cli = Cli::try_parse_from([
            "cargo xtask",
            "run",
            "--platform",
            "fvp",
            "--dry-run",
            "--pcpus",
            "2",
            "--vcpus",
            "2",
            "--fvp",
            "/opt/fvp/FVP_Base_RevC-2xAEMvA",
            "--tf-a",
            "/tfa",
            "--disk-image",
            "/img/disk.img",
            "--hv-args",
            "loglvl=debug",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else { panic!("run") };
        args.check().unwrap();
        let o = || args.run_options(|| Ok(PathBuf::new()));
        let p = plan(&args.fvp_args(), o, "/out/hv.bin".into(), k.clone(), Some(i.clone()), &dir).unwrap();
        assert!(p.have_fvp && p.have_tfa);
        let line = command_line(&p.run).join(" ");
        assert!(line.starts_with("/opt/fvp/FVP_Base_RevC-2xAEMvA "), "{line}");
        for want in [
            "--data cluster0.cpu0=/out/hv.bin@0x88000000".to_string(),
            format!("--data cluster0.cpu0={}@0x82000000", dir.join("fvp.dtb").display()),
            format!("--data cluster0.cpu0={}@0x90000000", k.display()),
            format!("--data cluster0.cpu0={}@0x90600000", i.display()),
            "-C bp.virtioblockdevice.image_path=/img/disk.img".to_string(),
            "-C bp.secureflashloader.fname=/tfa/bl1.bin".to_string(),
        ] {
            assert!(line.contains(&want), "missing {want:?} in {line}");
        }
        let dtb = std::fs::read(dir.join("fvp.dtb")).unwrap();
        let (m, boot) = hypervisor::dtb::discover(&dtb).unwrap();
        assert_eq!(boot.bootargs.as_deref(), Some("dom0_mem=1024M dom0_max_vcpus=2 loglvl=debug"));
        assert_eq!(m.cpus, vec![0, 0x100]);
        assert_eq!(boot.ramdisk.as_ref().map(|r| (r.base, r.size)), Some((0x9060_0000, 1 << 20)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn qemu_only_and_fvp_only_options_are_refused_across() {
        use crate::cli::{Cli, Command};
        use clap::Parser;
        let check = |line: &[&str]| {
            let mut v = vec!["cargo xtask", "run"];
            v.extend(line);
            let Command::Run(a) = Cli::try_parse_from(v).unwrap().command else { panic!("run") };
            a.check()
        };
        assert!(check(&["--dry-run"]).is_err());
        assert!(check(&["--platform", "fvp", "--cmd", "true"]).is_err());
        assert!(check(&["--platform", "fvp", "--gic", "4"]).is_err());
        assert!(check(&["--platform", "fvp-base-revc", "--dry-run"]).is_ok());
    }

    #[test]
    fn the_model_is_found_in_an_unpacked_package() {
        let dir = std::env::temp_dir().join(format!("xtask-fvp-pkg-{}", std::process::id()));
        let models = dir.join("models").join("Linux64_GCC-9.3");
        std::fs::create_dir_all(&models).unwrap();
        assert_eq!(in_package(&dir), None);
        std::fs::write(models.join(FVP_NAME), b"").unwrap();
        assert_eq!(in_package(&dir), Some(models.join(FVP_NAME)));
        assert_eq!(in_package(&models.join(FVP_NAME)), Some(models.join(FVP_NAME)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn shell_quote_keeps_plain_words() {
        assert_eq!(shell_quote("cluster0.cpu0=/a/b.bin@0x88000000"), "cluster0.cpu0=/a/b.bin@0x88000000");
        assert_eq!(shell_quote("a b"), "'a b'");
        let line: Vec<String> = ["FVP", "-C", "a=1", "--data", "x@0x1"].iter().map(|s| s.to_string()).collect();
        assert_eq!(printable(&line), "FVP \\\n    -C a=1 \\\n    --data x@0x1");
    }
}
