//! The command line of `cargo xtask`, parsed with clap (derive): every
//! subcommand has `--help`, and a misspelt option or subcommand gets a
//! suggestion. The option names, defaults and checks are the ones the
//! README documents; the doc comments below are the help text.
//!
//! The types here only describe and check the options; `main.rs` and the
//! modules that do the work ([`crate::run::qemu`], [`crate::bench`]) take them.

use crate::platform::fvp;
pub use crate::platform::PlatformKind;
use crate::run::hvload::{HvBoot, HvEntry};
pub use crate::run::qemu::DiskKind;
use crate::run::qemu::RunOptions;
use crate::Result;
use anyhow::{anyhow, bail, Context};
use clap::builder::TypedValueParser as _;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

/// The project's driver: build, run, test and benchmark the hypervisor.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", arg_required_else_help = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Use this qemu-system-aarch64 instead of the project's QEMU 10.0 (also $XTASK_QEMU); its version and the CPU model a run needs are checked
    #[arg(long, global = true, value_name = "PATH")]
    pub qemu: Option<PathBuf>,
}

// Parsed once per process: the size of the `run` variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Boot Linux under the hypervisor in QEMU (installs QEMU, builds the guest image)
    ///
    /// Without --cmd the console is this terminal: `poweroff -f` (or `exit`)
    /// in the guest shell powers it off, Ctrl-A x quits QEMU at any time.
    Run(RunArgs),
    /// Host unit tests + integration tests (boots real guests)
    Test(TestArgs),
    /// Build the hypervisor image (target/xtask/hypervisor-PLATFORM.bin)
    Build(BuildArgs),
    /// Build the guest kernel + initramfs (guest-images/out)
    GuestImage,
    /// The scheduler's discrete-event simulator
    #[command(subcommand, arg_required_else_help = true)]
    Sim(SimCommand),
    /// Benchmarks inside Linux guests
    #[command(subcommand, arg_required_else_help = true)]
    Bench(BenchCommand),
    /// Build the conformance guest (tests/conformance) and run it: bare QEMU, Dom0 or a DomU; exit 1 when a check fails
    Conformance(ConformanceArgs),
    /// What toolchain is in use, where it came from, which optional pieces are ready, what the caches take (fetches nothing)
    Doctor,
    /// The module circles inside each crate (modules that use each other), with the edges that close them
    Deps,
    /// Remove the build outputs (cargo clean); with --caches also the toolchain, guest-image and TF-A caches
    Clean(CleanArgs),
}

/// `cargo xtask conformance [--at bare|dom0|domu] [--gic 3|4] [--pcpus N] [--kernel-format image|elf|raw]`
#[derive(Clone, Debug, Args)]
pub struct ConformanceArgs {
    /// Where the guest runs: bare (QEMU at EL1, no hypervisor), dom0 (with the vITS), domu (beside a Dom0)
    #[arg(long, value_enum, default_value = "dom0")]
    pub at: crate::conformance::Placement,
    /// GIC version of the machine (4 needs the hypervisor)
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(3..=4))]
    pub gic: u8,
    /// Physical CPUs (under the hypervisor the guest has 2 vCPUs; on bare QEMU these are its CPUs)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub pcpus: u32,
    /// How the guest kernel is handed to the hypervisor: image (arm64 Image), elf (an ELF linked at a fixed address), raw (a raw binary at a load address)
    #[arg(long, value_enum, default_value = "image")]
    pub kernel_format: crate::conformance::KernelFormat,
}

/// `cargo xtask clean [--caches]`
#[derive(Clone, Debug, Args)]
pub struct CleanArgs {
    /// Also remove the caches: the project's QEMU, EDK2 and TF-A tools, the guest image's packages, TF-A builds, the Shrinkwrap venv
    #[arg(long)]
    pub caches: bool,
}

/// `cargo xtask build [--platform P]`
#[derive(Clone, Debug, Args)]
pub struct BuildArgs {
    /// The platform to build for
    #[arg(long, value_name = "PLATFORM", default_value = "qemu-virt")]
    pub platform: PlatformKind,
}

/// `cargo xtask run`: see [`RunArgs::run_options`] for how they map onto
/// [`RunOptions`].
#[derive(Clone, Debug, Args)]
pub struct RunArgs {
    /// Run a command in the guest after boot, print its output, power off, exit with its status
    #[arg(long, value_name = "SHELL", allow_hyphen_values = true)]
    pub cmd: Option<String>,
    /// GIC version of the QEMU machine
    #[arg(long, value_name = "VERSION", default_value = "3", value_parser = gic_parser())]
    pub gic: u8,
    /// Physical CPUs (0 counts as 1; default 1, 2 with `--platform graviton`)
    #[arg(long, value_name = "N")]
    pub pcpus: Option<u32>,
    /// Guest vCPUs (0 counts as 1; default 1, 2 with `--platform graviton`)
    #[arg(long, value_name = "M")]
    pub vcpus: Option<u32>,
    /// Guest RAM, e.g. 768M or 2G (a bare number is MiB; at least 128M)
    #[arg(long = "mem", value_name = "SIZE", default_value = "1G", value_parser = parse_mem)]
    pub mem_mb: u64,
    /// QEMU CPU model [default: max,pauth-impdef=on; neoverse-v1 with --platform graviton]
    #[arg(long, value_name = "MODEL")]
    pub cpu: Option<String>,
    /// Extra hypervisor boot arguments (e.g. "loglvl=debug sched_ratelimit_us=0")
    #[arg(long, value_name = "ARGS", default_value = "", hide_default_value = true, allow_hyphen_values = true)]
    pub hv_args: String,
    /// Kill QEMU after this long
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    pub timeout: u64,
    /// Boot your own guest kernel
    #[arg(long, value_name = "FILE")]
    pub kernel: Option<PathBuf>,
    /// Boot your own guest initrd [default: the guest image's initramfs with /usr/bin/hvctl appended]
    #[arg(long, value_name = "FILE")]
    pub initrd: Option<PathBuf>,
    /// Debian kernel flavour of the built guest image (guest-images/out, guest-images/out-generic)
    #[arg(long, value_name = "FLAVOUR", value_enum, default_value_t = crate::build::image::Flavour::Cloud)]
    pub kernel_flavour: crate::build::image::Flavour,
    /// Boot your own guest kernel command line
    #[arg(long, value_name = "CMDLINE", allow_hyphen_values = true)]
    pub append: Option<String>,
    /// Where QEMU's guest-loader puts the guest kernel [default: 0x50000000]
    #[arg(long, value_name = "ADDR", value_parser = parse_addr)]
    pub kernel_addr: Option<u64>,
    /// Where QEMU's guest-loader puts the initrd [default: after the kernel]
    #[arg(long, value_name = "ADDR", value_parser = parse_addr)]
    pub initrd_addr: Option<u64>,
    /// Dom0's kernel is a raw binary: the hypervisor copies it to ADDR (4 KiB aligned, in RAM) and enters it there (`dom0_kernel_load_addr=`) [default: an arm64 Image or ELF file]
    #[arg(long, value_name = "ADDR", value_parser = parse_addr)]
    pub kernel_load_addr: Option<u64>,
    /// Where QEMU loads the hypervisor, on a 2 MiB boundary [default: 0x40200000]
    #[arg(long, value_name = "ADDR", value_parser = parse_addr)]
    pub hv_addr: Option<u64>,
    /// How the hypervisor is entered
    #[arg(long, value_name = "CONVENTION", value_enum, default_value_t = HvEntry::Linux)]
    pub hv_entry: HvEntry,
    /// Deterministic guest time (-icount shift=0,sleep=on)
    #[arg(long)]
    pub icount: bool,
    /// The guest's disk [default: QEMU's devices passed through, no disk image; nvme with --platform graviton]
    #[arg(long, value_name = "KIND")]
    pub disk: Option<DiskKind>,
    /// Put QEMU's PCIe root complex behind an SMMUv3 with stage-2 translation (virt,iommu=smmuv3; arm-smmuv3.stage=2; in the IORT with --platform graviton): the hypervisor confines the devices' DMA (iommu=, default on)
    #[arg(long)]
    pub iommu: bool,
    /// Service time of every RAM-disk request, exact on the EL2 timer (guest virtual time under --icount); only with --disk ram
    #[arg(long, value_name = "N")]
    pub disk_latency_us: Option<u32>,
    /// Boot through firmware: tf-a = TF-A at EL3 (built once from Debian's source package), the hypervisor as BL33
    #[arg(long, value_name = "FW")]
    pub firmware: Option<crate::firmware::Firmware>,
    /// Where to run: QEMU virt, Arm's FVP Base RevC (`fvp`; needs the FVP and a TF-A build), or Graviton's UEFI + ACPI boot on QEMU (`graviton`)
    #[arg(long, value_name = "PLATFORM", default_value = "qemu-virt")]
    pub platform: PlatformKind,
    /// Print the simulator's command line instead of running it (--platform fvp)
    #[arg(long)]
    pub dry_run: bool,
    /// The FVP executable [default: $FVP_BIN, else in the package $FVP_BASE, else FVP_Base_RevC-2xAEMvA on PATH] (--platform fvp)
    #[arg(long, value_name = "FILE")]
    pub fvp: Option<PathBuf>,
    /// TF-A build directory with bl1.bin and fip.bin [default: $TFA_BUILD] (--platform fvp)
    #[arg(long = "tf-a", value_name = "DIR")]
    pub tfa: Option<PathBuf>,
    /// The guest's disk image on FVP (the virtio-blk device) [default: a sparse 256 MiB scratch image] (--platform fvp)
    #[arg(long, value_name = "FILE")]
    pub disk_image: Option<PathBuf>,
    /// DomUs beside Dom0, described in the DTB with Xen's dom0less binding (/chosen/domU1..N)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub domu: u32,
    /// Run a command in each DomU after boot (as --cmd does in Dom0)
    #[arg(long, value_name = "SHELL", allow_hyphen_values = true)]
    pub domu_cmd: Option<String>,
    /// Each DomU's RAM, e.g. 256M (a bare number is MiB; at least 128M)
    #[arg(long = "domu-mem", value_name = "SIZE", default_value = "256M", value_parser = parse_mem)]
    pub domu_mem_mb: u64,
    /// Each DomU's vCPUs (0 counts as 1)
    #[arg(long, value_name = "M", default_value_t = 1)]
    pub domu_vcpus: u32,
    /// Credit2 weight of each DomU (hv,sched-weight), in DomU order; one value is every DomU's [default: 256]
    #[arg(long = "domu-weight", value_name = "W[,W...]", value_delimiter = ',')]
    pub domu_weight: Vec<u32>,
    /// Credit2 cap of each DomU in percent of one pCPU (hv,sched-cap; 0 = uncapped), as --domu-weight [default: uncapped]
    #[arg(long = "domu-cap", value_name = "P[,P...]", value_delimiter = ',')]
    pub domu_cap: Vec<u32>,
    /// RAM for DomUs made while running (`hvctl create`): QEMU's RAM grows by SIZE, the hypervisor reserves it (domu_pool=), and Dom0's initrd gets a DomU kernel, initrd and /etc/hvctl/domu.cfg
    #[arg(long = "domu-pool", value_name = "SIZE", value_parser = parse_size_mb)]
    pub domu_pool_mb: Option<u64>,
    /// Give domU1 a PCIe function of its own (hv,pci-assigned): an NVMe controller QEMU puts at this root-bus address, e.g. 0000:00:02.0; turns on --iommu
    #[arg(long = "domu-pci", value_name = "BDF")]
    pub domu_pci: Option<String>,
}

/// `--gic`: 3 or 4 (listed in the help and in the error).
fn gic_parser() -> impl clap::builder::TypedValueParser<Value = u8> {
    clap::builder::PossibleValuesParser::new(["3", "4"]).map(|s| if s == "4" { 4 } else { 3 })
}

/// A size in MiB: `1G`, `768M`, or a bare number of MiB.
pub fn parse_size_mb(s: &str) -> Result<u64> {
    let (n, mul) = match s.chars().last() {
        Some('G' | 'g') => (&s[..s.len() - 1], 1024),
        Some('M' | 'm') => (&s[..s.len() - 1], 1),
        _ => (s, 1),
    };
    n.parse::<u64>().ok().and_then(|v| v.checked_mul(mul)).ok_or_else(|| anyhow!("bad size {s}"))
}

/// An address: hex with `0x`, or decimal.
pub fn parse_addr(s: &str) -> Result<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(&h.replace('_', ""), 16),
        None => s.parse(),
    }
    .map_err(|_| anyhow!("bad address {s}"))
}

/// `--mem`: a size of at least 128 MiB.
fn parse_mem(s: &str) -> Result<u64> {
    let mb = parse_size_mb(s)?;
    if mb < 128 {
        bail!("must be at least 128M");
    }
    Ok(mb)
}

impl RunArgs {
    /// The checks between options that clap does not express.
    pub fn check(&self) -> Result<()> {
        let hv_boot = HvBoot { addr: self.hv_addr, entry: self.hv_entry };
        hv_boot.check()?;
        let graviton = self.platform == PlatformKind::Graviton;
        if graviton && self.firmware == Some(crate::firmware::Firmware::TfA) {
            bail!("--platform graviton boots through UEFI (--firmware uefi is implied)");
        }
        if hv_boot != HvBoot::default()
            && (self.firmware.is_some() || graviton || self.platform == PlatformKind::FvpBaseRevc)
        {
            bail!(
                "--hv-addr and --hv-entry are for QEMU's direct boot (TF-A and FVP load the hypervisor as \
                 BL33, EDK2 as an EFI application)"
            );
        }
        if self.kernel.is_some() && self.kernel_flavour != crate::build::image::Flavour::default() {
            bail!("--kernel-flavour picks the built guest image's kernel; not with --kernel");
        }
        if self.iommu && self.platform == PlatformKind::FvpBaseRevc {
            bail!("--iommu is QEMU's SMMUv3 (qemu-virt, graviton); FVP's is the model's own");
        }
        if self.disk_latency_us.is_some() && self.disk != Some(DiskKind::Ram) {
            bail!("--disk-latency-us goes with --disk ram");
        }
        let fvp = self.platform == PlatformKind::FvpBaseRevc;
        if self.domu == 0
            && (self.domu_cmd.is_some()
                || self.domu_mem_mb != 256
                || self.domu_vcpus != 1
                || !self.domu_weight.is_empty()
                || !self.domu_cap.is_empty())
        {
            bail!("--domu-cmd, --domu-mem, --domu-vcpus, --domu-weight and --domu-cap go with --domu N");
        }
        if let Some(bdf) = &self.domu_pci {
            if self.domu == 0 {
                bail!("--domu-pci goes with --domu N (it is domU1's)");
            }
            if self.platform != PlatformKind::QemuVirt {
                bail!("--domu-pci is for --platform qemu-virt (its PCIe root bus)");
            }
            root_bus_slot(bdf)?;
        }
        let lists = crate::run::domu::DomuOptions {
            count: self.domu,
            weights: self.domu_weight.clone(),
            caps: self.domu_cap.clone(),
            ..Default::default()
        };
        lists.check()?;
        if self.domu > 0 && (fvp || self.firmware == Some(crate::firmware::Firmware::Uefi)) {
            bail!("--domu is for QEMU with a device tree (not --platform fvp or --firmware uefi)");
        }
        if !fvp && (self.dry_run || self.fvp.is_some() || self.tfa.is_some() || self.disk_image.is_some()) {
            bail!("--dry-run, --fvp, --tf-a and --disk-image go with --platform fvp");
        }
        if fvp
            && (self.cmd.is_some()
                || self.icount
                || self.gic != 3
                || self.kernel_addr.is_some()
                || self.initrd_addr.is_some()
                || self.kernel_load_addr.is_some()
                || self.firmware.is_some())
        {
            bail!(
                "--cmd, --icount, --gic, --kernel-addr, --initrd-addr, --kernel-load-addr and --firmware are QEMU \
                 options (FVP: GICv4.1, modules at fixed addresses, your TF-A build with --tf-a)"
            );
        }
        Ok(())
    }

    /// What `--platform fvp` takes from these options ([`fvp::plan`]).
    pub fn fvp_args(&self) -> fvp::FvpArgs {
        fvp::FvpArgs {
            mem_mb: self.mem_mb,
            pcpus: self.pcpus,
            append: self.append.clone(),
            fvp: self.fvp.clone(),
            tfa: self.tfa.clone(),
            disk_image: self.disk_image.clone(),
        }
    }

    /// The runner's options. `scratch_disk` makes the QEMU disk image that
    /// `--disk passthrough|backend|virtio-pci|nvme` attach (the caller passes
    /// [`crate::run::qemu::scratch_disk`]).
    /// `--platform graviton` adds the platform's firmware, CPU model and
    /// default disk ([`crate::platform::graviton`]).
    pub fn run_options(&self, scratch_disk: impl FnOnce() -> std::io::Result<PathBuf>) -> Result<RunOptions> {
        self.check()?;
        let graviton = self.platform == PlatformKind::Graviton;
        // Graviton's acceptance runs are SMP: 2 pCPUs and 2 vCPUs unless told.
        let default_cpus = if graviton { crate::platform::graviton::DEFAULT_CPUS } else { 1 };
        let mut o = RunOptions {
            gic: self.gic,
            pcpus: self.pcpus.unwrap_or(default_cpus).max(1),
            vcpus: self.vcpus.unwrap_or(default_cpus).max(1),
            mem_mb: self.mem_mb,
            cpu: self.cpu.clone().unwrap_or_else(|| crate::run::qemu::DEFAULT_CPU.into()),
            hv_args: self.hv_args.clone(),
            timeout: Duration::from_secs(self.timeout),
            cmd: self.cmd.clone(),
            kernel: self.kernel.clone(),
            initrd: self.initrd.clone(),
            append: self.append.clone(),
            kernel_addr: self.kernel_addr,
            initrd_addr: self.initrd_addr,
            kernel_load_addr: self.kernel_load_addr,
            icount: self.icount,
            iommu: self.iommu,
            firmware: self.firmware,
            hv_boot: HvBoot { addr: self.hv_addr, entry: self.hv_entry },
            flavour: self.kernel_flavour,
            domu_pool_mb: self.domu_pool_mb.unwrap_or(0),
            domus: (self.domu > 0).then(|| crate::run::domu::DomuOptions {
                count: self.domu,
                cmd: self.domu_cmd.clone(),
                mem_mb: self.domu_mem_mb,
                vcpus: self.domu_vcpus.max(1),
                weights: self.domu_weight.clone(),
                caps: self.domu_cap.clone(),
                append: None,
                kernel: None,
                kernel_load_addr: None,
                pci: self.domu_pci.clone(),
            }),
            ..Default::default()
        };
        if let Some(bdf) = &self.domu_pci {
            // domU1's NVMe controller at that address of QEMU's root bus,
            // behind the SMMU (assignment needs one).
            let img = crate::run::qemu::sparse_image(crate::out_dir().join("domu-pci.img")).context("disk image")?;
            o.iommu = true;
            o.extra.extend([
                "-drive".into(),
                format!("if=none,file={},format=raw,id=dpci0", img.display()),
                "-device".into(),
                format!("nvme,drive=dpci0,serial=hvdomupci0,bus=pcie.0,addr={}", root_bus_slot(bdf)?),
            ]);
        }
        if graviton {
            crate::platform::graviton::apply(&mut o, self.cpu.is_some());
        }
        if let Some(d) = self.disk.or(graviton.then_some(crate::platform::graviton::DEFAULT_DISK)) {
            let mut args = format!("dom0_disk={}", d.as_str());
            if d == DiskKind::Ram {
                args.push_str(&format!(" dom0_disk_latency_us={}", self.disk_latency_us.unwrap_or(0)));
            }
            if let Some(device) = d.qemu_device() {
                // A QEMU disk with a scratch image: virtio-mmio, or on the
                // PCIe root bus.
                let img = scratch_disk().context("disk image")?;
                o.extra.extend([
                    "-drive".into(),
                    format!("if=none,file={},format=raw,id=d0", img.display()),
                    "-device".into(),
                    device.into(),
                ]);
            }
            o.hv_args = if o.hv_args.is_empty() { args } else { format!("{args} {}", o.hv_args) };
        }
        Ok(o)
    }
}

/// QEMU's `addr=DD.F` for a function of segment 0, bus 0 ("0000:00:DD.F"
/// or "00:DD.F"), the only bus `--domu-pci` can place a device on.
fn root_bus_slot(bdf: &str) -> Result<String> {
    let b: hypervisor::vpci::Bdf = bdf.parse().map_err(|e| anyhow::anyhow!("--domu-pci {bdf}: {e}"))?;
    if b.seg != 0 || b.bus != 0 {
        bail!("--domu-pci {bdf}: QEMU's root bus is 0000:00");
    }
    Ok(format!("{:#x}.{}", b.dev, b.func))
}

/// `cargo xtask test [CARGO_TEST_ARGS]... [-- TEST_ARGS...]`
#[derive(Clone, Debug, Args)]
pub struct TestArgs {
    /// Passed on to `cargo test --workspace --lib --bins --tests` (e.g. `-p xtask`, a test name)
    #[arg(allow_hyphen_values = true, value_name = "CARGO_TEST_ARGS")]
    pub cargo_args: Vec<String>,
    /// Passed on to the test binaries, after --test-threads=1 (e.g. --nocapture)
    #[arg(last = true, value_name = "TEST_ARGS")]
    pub test_args: Vec<String>,
}

impl TestArgs {
    /// The arguments of `cargo test`: the workspace's lib, bin and test
    /// targets, the forwarded cargo arguments, and for the test binaries
    /// `--test-threads=1` (the integration tests boot QEMU one at a time)
    /// and whatever came after `--`.
    pub fn cargo_test_args(&self) -> Vec<String> {
        // clap leaves a `--` that follows a cargo argument among them.
        let (cargo, after) = match self.cargo_args.iter().position(|a| a == "--") {
            Some(i) => (&self.cargo_args[..i], &self.cargo_args[i + 1..]),
            None => (&self.cargo_args[..], &[][..]),
        };
        let mut v: Vec<String> = ["test", "--workspace", "--lib", "--bins", "--tests"].map(String::from).to_vec();
        v.extend(cargo.iter().cloned());
        v.extend(["--".to_string(), "--test-threads=1".to_string()]);
        v.extend(after.iter().chain(&self.test_args).cloned());
        v
    }
}

#[derive(Debug, Subcommand)]
pub enum SimCommand {
    /// Wake latency of an I/O vCPU beside a CPU hog, every scheduler mode and topology
    ///
    /// Runs the scheduler simulator (hypervisor::sched::sim, which drives the
    /// real scheduler) over the seed workload, prints a table and the
    /// lock-holder scenario, and with --json writes the JSON the benchmark
    /// harness reads.
    Wakeup(SimWakeupArgs),
    /// The scheduler against Xen 4.17's Credit2: switch rates, tails, floors, tickles
    ///
    /// Runs the conformance cases (hypervisor::sched::conformance, which
    /// drives the real scheduler on a virtual clock) in the control mode
    /// (sched_wake_preempt=off) and, where Credit2's figure is ours too, in
    /// both modes; prints each figure beside the range Xen's algorithm
    /// gives; exit 1 when one is outside.
    Conformance,
}

/// `cargo xtask sim wakeup`
#[derive(Clone, Debug, Args)]
pub struct SimWakeupArgs {
    /// Also write the results as JSON to FILE
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Virtual seconds to simulate
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = parse_positive)]
    pub seconds: u64,
    /// Disk service time of each request, µs
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub service_us: u64,
    /// CPU time the I/O vCPU spends submitting a request, µs
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = parse_positive)]
    pub submit_us: u64,
    /// Cost of a context switch, µs
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub switch_cost_us: u64,
    /// Wake-preempt granularity, µs [default: the scheduler's]
    #[arg(long, value_name = "N")]
    pub granularity_us: Option<u64>,
    /// Lock-holder grace, µs [default: the scheduler's]
    #[arg(long, value_name = "N")]
    pub grace_us: Option<u64>,
    /// Protected run of a vCPU preempted by a wake (sched_wake_min_run_us), µs [default: the scheduler's]
    #[arg(long, value_name = "N")]
    pub min_run_us: Option<u64>,
}

/// `--seconds`, `--submit-us`: a number > 0.
fn parse_positive(s: &str) -> Result<u64> {
    match s.parse::<u64>() {
        Ok(0) => Err(anyhow!("must be > 0")),
        Ok(v) => Ok(v),
        Err(e) => Err(e.into()),
    }
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// fio wake-latency benchmark in guests, xen-compat vs wake-preempt
    ///
    /// fio 4 KiB randread qd1 on the last vCPU beside a CPU hog, across
    /// topologies, IRQ placements, schedulers, disks and clocks.
    #[command(after_help = "Writes target/bench/wakeup/{report.md,results.json,latency.svg}.")]
    Wakeup(BenchWakeupArgs),
    /// cyclictest timer latency, timer_slop_ns 0 vs 50000
    #[command(after_help = "Writes target/bench/timer/{report.md,results.json}.")]
    Timer(BenchTimerArgs),
    /// the cost of one exit in instructions (-icount shift=0): the
    /// conformance guest's exit loops on bare QEMU and under the hypervisor
    #[command(after_help = "Writes target/bench/exits/report.md.")]
    Exits,
    /// the scheduler's work per call with a host thread per pCPU (16, 64, 192)
    #[command(after_help = "Writes target/bench/sched-scale/report.md.")]
    SchedScale(BenchSchedScaleArgs),
}

/// `cargo xtask bench sched-scale`
#[derive(Clone, Debug, Args)]
pub struct BenchSchedScaleArgs {
    /// pCPU counts to stand for, a thread each
    #[arg(long, value_delimiter = ',', default_values_t = [16usize, 64, 192])]
    pub pcpus: Vec<usize>,
    /// Seconds per count
    #[arg(long, default_value_t = 5, value_parser = parse_positive)]
    pub seconds: u64,
}

/// `cargo xtask bench wakeup`
#[derive(Clone, Debug, Args)]
pub struct BenchWakeupArgs {
    /// 1p1v, 1p2v and 1p1v+d1 (a DomU's hog), unpinned IRQ, xen-compat 1000 vs wake-preempt, ram disk, icount, 1 repeat (wins over --full)
    #[arg(long)]
    pub quick: bool,
    /// Also the real-time clock matrix (with 2p2v)
    #[arg(long)]
    pub full: bool,
    /// Run the quick matrix (1p1v/1p2v, unpinned, xen-compat 1000 vs wake-preempt, icount) on these disks: passthrough, backend, ram, virtio-pci, nvme; a PCIe disk (MSI) brings passthrough (SPI) along
    #[arg(long, value_name = "DISK,...", value_delimiter = ',', conflicts_with = "full")]
    pub disk: Vec<crate::bench::Disk>,
    /// With --disk: the GIC versions (3, 4) to run the PCIe disks on; 4 runs GICv4.0 direct vLPI injection, and also the emulated LPI path (gic_vlpi=off) unless 3 is listed
    #[arg(long, value_name = "VERSION,...", value_delimiter = ',', value_parser = gic_parser(), requires = "disk")]
    pub gic: Vec<u8>,
    /// fio runtime per case, seconds
    #[arg(long, value_name = "SECS", default_value_t = crate::bench::DEFAULT_RUNTIME_S)]
    pub runtime: u32,
    /// Repeats per case, the median is reported (0 counts as 1) [default: 3; 1 with --quick]
    #[arg(long, value_name = "N")]
    pub repeats: Option<u32>,
    /// Run only the cases whose label contains S
    #[arg(long, value_name = "S")]
    pub only: Option<String>,
    /// Extra hypervisor boot arguments for every case (e.g. sched_lhp_grace_us=20)
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    pub hv_args: Option<String>,
    /// Where to run: QEMU virt, or graviton (EDK2 + ACPI, Neoverse V1): the quick matrix on --disk, default nvme
    #[arg(long, value_name = "PLATFORM", default_value = "qemu-virt", conflicts_with = "full")]
    pub platform: PlatformKind,
    /// Also the seed case's two schedulers in one boot, switched with `hvctl set sched_wake_preempt=` (QEMU virt)
    #[arg(long)]
    pub same_boot: bool,
}

impl BenchWakeupArgs {
    /// Repeats per case: `--repeats` (at least 1), else 1 with `--quick`
    /// and [`crate::bench::DEFAULT_REPEATS`] without.
    pub fn repeats(&self) -> u32 {
        self.repeats.map(|r| r.max(1)).unwrap_or(if self.quick { 1 } else { crate::bench::DEFAULT_REPEATS })
    }

    /// The options as the runner takes them ([`crate::bench::runner::wakeup`]).
    pub fn options(&self) -> crate::bench::runner::WakeupOptions {
        crate::bench::runner::WakeupOptions {
            quick: self.quick,
            full: self.full,
            disk: self.disk.clone(),
            gic: self.gic.clone(),
            runtime: self.runtime,
            repeats: self.repeats(),
            only: self.only.clone(),
            hv_args: self.hv_args.clone(),
            platform: self.platform,
            same_boot: self.same_boot,
        }
    }
}

/// `cargo xtask bench timer`
#[derive(Clone, Debug, Args)]
pub struct BenchTimerArgs {
    /// cyclictest samples (loops) per case; 100000 gives p99.99 ten samples above it
    #[arg(long, value_name = "N", default_value_t = crate::bench::timer::DEFAULT_SAMPLES)]
    pub samples: u64,
    /// Also stop each case's cyclictest after SECS seconds (cyclictest -D)
    #[arg(long, value_name = "SECS")]
    pub runtime: Option<u32>,
    /// Run only the cases whose label contains S
    #[arg(long, value_name = "S", allow_hyphen_values = true)]
    pub only: Option<String>,
    /// Extra hypervisor boot arguments for every case (e.g. sched_trace_threshold_us=150)
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    pub hv_args: Option<String>,
    /// Stop cyclictest at the first sample above US µs (cyclictest -b) and
    /// dump the hypervisor's flight recorder right then (the case's
    /// *.trace.txt shows the events around that sample)
    #[arg(long, value_name = "US")]
    pub breaktrace: Option<u32>,
}

impl BenchTimerArgs {
    /// The options as the runner takes them ([`crate::bench::timer::run`]).
    pub fn options(&self) -> crate::bench::timer::TimerOptions {
        crate::bench::timer::TimerOptions {
            samples: self.samples,
            runtime: self.runtime,
            only: self.only.clone(),
            hv_args: self.hv_args.clone(),
            breaktrace: self.breaktrace,
        }
    }
}

#[cfg(test)]
mod tests;
