//! `cargo xtask bench wakeup`: fio inside a Linux guest, across a matrix of
//! topologies, IRQ placements, schedulers, disks and clocks.
//!
//! Why this exists: the project's claim is that a guest's I/O latency does
//! not collapse when its vCPUs share a pCPU with a CPU hog. The proof is the
//! seed experiment (fio 4 KiB random read, iodepth 1, psync, on vCPU1; a busy
//! loop on vCPU0) run under the Xen-compatible wake path (the control) and
//! under preempt-on-wake, in one invocation, reported as *ratios within the
//! run* because this host is shared and emulated.
//!
//! This module is the host-side, testable part of the harness; the runner
//! that starts QEMU calls it in this order:
//!
//! 1. [`matrix`] lists the [`Case`]s ([`disk_matrix`] with `--disk`: MSI
//!    disks beside the SPI one);
//! 2. per case and repeat: [`run_options`] gives the QEMU/hypervisor
//!    configuration (topology, `-icount`, [`hypervisor_args`], the guest
//!    command from [`guest_command`], a disk), `crate::run::qemu::run_captured`
//!    (or `qemu::run`) boots it, and [`parse_console`] turns the console text
//!    into a [`Sample`]; [`Progress`] prints `case i/n (elapsed mm:ss)`;
//! 3. [`write_report`] takes one [`CaseResult`] per case (all its samples and
//!    the errors of failed repeats), takes medians ([`summarize`]) and writes
//!    `report.md`, `results.json` and `latency.svg` into the output directory
//!    ([`out_dir`]: `target/bench/wakeup/`).
//!
//! Files: [`parse`] (console → fio JSON and hypervisor stats), [`aggregate`]
//! (medians, histogram merging), [`report`] (markdown, targets, JSON),
//! [`svg`] (the latency plot), [`same_boot`] (`--same-boot`: the seed
//! case's two schedulers in one boot, switched with `hvctl`).

pub mod aggregate;
pub mod exits;
pub mod parse;
pub mod report;
pub mod runner;
pub mod same_boot;
pub mod sched_scale;
pub mod svg;
pub mod timer;

#[cfg(test)]
mod tests;

pub use aggregate::{median, summarize, Summary};
pub use parse::{extract_fio_json, parse_console, parse_fio_json, parse_irq_lines, FioResult, Sample};
pub use report::{
    check_targets, render_report, results_json, write_report, ReportFiles, ResultCase, ResultsFile, Status, TargetCheck,
};

use anyhow::{anyhow, bail};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// A fieldless enum with a stable lower-case spelling used on the command
/// line, in `results.json` and in the report (`Display`/`FromStr`/serde all
/// use the same string).
macro_rules! spelled_enum {
    ($(#[doc = $doc:literal])* $name:ident { $($(#[doc = $vdoc:literal])* $var:ident = $s:literal,)* }) => {
        $(#[doc = $doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub enum $name {
            $($(#[doc = $vdoc])* #[serde(rename = $s)] $var,)*
        }

        impl $name {
            /// Every value, in matrix order.
            pub const ALL: &'static [$name] = &[$($name::$var),*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$var => $s,)*
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = anyhow::Error;
            fn from_str(s: &str) -> anyhow::Result<Self> {
                match s {
                    $($s => Ok($name::$var),)*
                    _ => Err(anyhow!(
                        "unknown {} {s:?} (expected one of: {})",
                        stringify!($name).to_lowercase(),
                        [$($s),*].join(", ")
                    )),
                }
            }
        }
    };
}

spelled_enum! {
    /// pCPUs × vCPUs of the guest.
    Topology {
        /// fio alone on its own pCPU, no hog: the no-contention baseline.
        OneP1V = "1p1v",
        /// One pCPU, two vCPUs (hog on vCPU0, fio on vCPU1): the seed's overcommit.
        OneP2V = "1p2v",
        /// Two pCPUs, two vCPUs with the hog (real-time clock only: under
        /// `-icount` QEMU runs all pCPUs on one host thread).
        TwoP2V = "2p2v",
        /// One pCPU shared by two domains: Dom0's one vCPU runs
        /// fio, one DomU with one vCPU runs the CPU hog ([`DOMU_HOG_MEM_MB`],
        /// its default RAM disk, unused). Another tenant's hog, not a sibling.
        OneP1VD1 = "1p1v+d1",
    }
}

spelled_enum! {
    /// Where the disk's interrupt goes inside the guest.
    Irq {
        /// `/proc/irq/N/smp_affinity` set to the fio vCPU.
        Pinned = "pinned",
        /// Left where Linux puts it.
        Unpinned = "unpinned",
        /// PCIe disks: every MSI steered to the fio vCPU by the hypervisor
        /// (`dom0_msi_vcpu=`, a benchmark knob: Linux's managed MSI-X
        /// affinity cannot be changed from inside the guest).
        MsiFio = "msi-fio",
        /// PCIe disks: every MSI steered to the hog vCPU (vCPU0) by the
        /// hypervisor (`dom0_msi_vcpu=0`).
        MsiHog = "msi-hog",
    }
}

spelled_enum! {
    /// The hypervisor's wake path.
    Sched {
        /// Credit2 semantics (`sched_wake_preempt=off`): the control group.
        XenCompat = "xen-compat",
        /// Immediate preempt-on-wake (`sched_wake_preempt=on`).
        WakePreempt = "wake-preempt",
    }
}

spelled_enum! {
    /// What serves the guest's disk ([`Disk::device_path`]).
    Disk {
        /// QEMU's virtio-blk-device mapped into the guest (Dom0-style): a wired SPI.
        Passthrough = "passthrough",
        /// Our virtio-blk device model in front of QEMU's device.
        Backend = "backend",
        /// Our device model over an in-memory image with a fixed service time.
        Ram = "ram",
        /// QEMU's virtio-blk-pci behind the PCIe bridge passed through to
        /// Dom0: MSI-X through the ITS (INTx before the virtual ITS).
        VirtioPci = "virtio-pci",
        /// QEMU's NVMe controller behind the PCIe bridge: MSI-X, one vector
        /// per queue (INTx before the virtual ITS).
        Nvme = "nvme",
        /// The same NVMe with QEMU's PCIe root complex behind an SMMUv3
        /// (`cargo xtask run --iommu`): every DMA and MSI translated by
        /// Dom0's SMMU stage 2; beside `nvme` in one run it shows what the
        /// SMMU (its IOTLB misses and walks) costs.
        NvmeSmmu = "nvme-smmu",
    }
}

spelled_enum! {
    /// Where guest-visible time comes from.
    Clock {
        /// `-icount shift=0,sleep=on`: deterministic, 1 insn = 1 ns; the default for ratios.
        Icount = "icount",
        /// Host time (noisy on a shared host).
        Realtime = "realtime",
    }
}

spelled_enum! {
    /// What the guest's idle loop does (Linux's `nohlt`).
    Idle {
        /// WFI (the default): an idle vCPU blocks in the hypervisor, and
        /// under GICv4 its vPE is not resident while it does.
        Wfi = "wfi",
        /// `nohlt` on the guest's command line: the idle loop polls, so a
        /// vCPU never blocks and its vPE stays resident; interrupts arrive
        /// while it runs (the "fio vCPU resident" target).
        Poll = "poll",
    }
}

impl Idle {
    /// What cases (and `results.json` entries) without the field mean.
    pub fn wfi() -> Idle {
        Idle::Wfi
    }
}

spelled_enum! {
    /// The machine's GIC and how a PCIe disk's MSIs reach the guest.
    Delivery {
        /// `--gic 3`: a GICv3 machine; MSIs are host LPIs the hypervisor
        /// injects through list registers (the emulated path).
        V3Emulated = "v3-emulated",
        /// `--gic 4` with `gic_vlpi=off`: the same emulated LPI path on a
        /// GICv4 machine.
        V4Emulated = "v4-emulated",
        /// `--gic 4`: GICv4.0 direct vLPI injection, doorbells wake blocked vCPUs.
        V4Direct = "v4-direct",
    }
}

impl Delivery {
    /// The GIC version of the QEMU machine (`-machine virt,gic-version=N`).
    pub fn gic(self) -> u8 {
        match self {
            Delivery::V3Emulated => 3,
            Delivery::V4Emulated | Delivery::V4Direct => 4,
        }
    }

    /// Whether the hypervisor delivers the MSIs itself (list registers)
    /// rather than the ITS injecting vLPIs.
    pub fn emulated(self) -> bool {
        self != Delivery::V4Direct
    }

    /// The delivery modes of a `--gic` list, in order, duplicates dropped:
    /// 3 → v3-emulated; 4 → v4-direct, preceded by v4-emulated only when 3
    /// is not listed (so each run has one emulated-LPI reference, on the
    /// lowest GIC given). An empty list is `[3]`.
    pub fn of_gics(gics: &[u8]) -> Vec<Delivery> {
        let mut v = Vec::new();
        let mut push = |d: Delivery| {
            if !v.contains(&d) {
                v.push(d)
            }
        };
        if gics.is_empty() {
            push(Delivery::V3Emulated);
        }
        for &g in gics {
            match g {
                3 => push(Delivery::V3Emulated),
                _ => {
                    if !gics.contains(&3) {
                        push(Delivery::V4Emulated);
                    }
                    push(Delivery::V4Direct);
                }
            }
        }
        v
    }
}

impl Disk {
    /// The disks of the default and `--full` matrices: the virtio-mmio ones,
    /// whose interrupt is a wired SPI.
    pub const SPI: &'static [Disk] = &[Disk::Passthrough, Disk::Backend, Disk::Ram];

    /// A disk on QEMU's PCIe bus (MSI-capable), as opposed to virtio-mmio.
    pub fn is_pcie(self) -> bool {
        matches!(self, Disk::VirtioPci | Disk::Nvme | Disk::NvmeSmmu)
    }

    /// The PCIe root complex sits behind QEMU's SMMUv3.
    pub fn behind_smmu(self) -> bool {
        self == Disk::NvmeSmmu
    }

    /// The `cargo xtask run --disk` kind that boots this disk (the same
    /// `dom0_disk=` spelling and QEMU device).
    pub fn kind(self) -> crate::run::qemu::DiskKind {
        use crate::run::qemu::DiskKind;
        match self {
            Disk::Passthrough => DiskKind::Passthrough,
            Disk::Backend => DiskKind::Backend,
            Disk::Ram => DiskKind::Ram,
            Disk::VirtioPci => DiskKind::VirtioPci,
            Disk::Nvme | Disk::NvmeSmmu => DiskKind::Nvme,
        }
    }

    /// The guest's block device fio reads: virtio-blk (mmio or pci) is the
    /// only virtio disk, so `/dev/vda`; NVMe namespace 1 is `/dev/nvme0n1`.
    pub fn device_path(self) -> &'static str {
        match self {
            Disk::Nvme | Disk::NvmeSmmu => "/dev/nvme0n1",
            _ => "/dev/vda",
        }
    }

    /// What the disk's line(s) in the guest's /proc/interrupts contain (a
    /// grep pattern). virtio-mmio: one line ending in `virtio0`. PCIe, for
    /// INTx and MSI alike: `virtio0` (INTx), `virtio0-config` and
    /// `virtio0-req.0` (MSI-X); `nvme0q0, nvme0q1` (INTx, one shared line),
    /// `nvme0q0` (admin) and `nvme0qN` per I/O queue (MSI-X). The PCIe lines
    /// are all reported and summed per CPU.
    pub fn irq_name(self) -> &'static str {
        match self {
            Disk::Nvme | Disk::NvmeSmmu => "nvme0q",
            _ => DISK_IRQ_NAME,
        }
    }
}

impl Irq {
    /// The vCPU the hypervisor steers every MSI to (`dom0_msi_vcpu=`), if
    /// this placement asks for it.
    pub fn msi_vcpu(self, topology: Topology) -> Option<u32> {
        match self {
            Irq::MsiFio => Some(topology.fio_vcpu()),
            Irq::MsiHog => Some(0),
            Irq::Pinned | Irq::Unpinned => None,
        }
    }
}

impl Topology {
    pub fn pcpus(self) -> u32 {
        match self {
            Topology::OneP1V | Topology::OneP2V | Topology::OneP1VD1 => 1,
            Topology::TwoP2V => 2,
        }
    }
    /// Dom0's vCPUs (a DomU's are not counted).
    pub fn vcpus(self) -> u32 {
        match self {
            Topology::OneP1V | Topology::OneP1VD1 => 1,
            Topology::OneP2V | Topology::TwoP2V => 2,
        }
    }
    /// Whether a CPU hog runs on Dom0's vCPU0 (every topology with a second vCPU).
    pub fn has_hog(self) -> bool {
        self.vcpus() > 1
    }
    /// Whether the CPU hog runs in a DomU (`1p1v+d1`), on the fio vCPU's pCPU.
    pub fn domu_hog(self) -> bool {
        self == Topology::OneP1VD1
    }
    /// Whether fio shares its pCPU(s) with a hog, in Dom0 or in a DomU.
    pub fn contended(self) -> bool {
        self.has_hog() || self.domu_hog()
    }
    /// The vCPU fio (and a pinned disk IRQ) runs on: the last one.
    pub fn fio_vcpu(self) -> u32 {
        self.vcpus() - 1
    }
}

/// One configuration of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Case {
    pub topology: Topology,
    pub irq: Irq,
    pub sched: Sched,
    /// `sched_ratelimit_us`; wake-preempt cases use Xen's default 1000 (its
    /// wakes ignore the ratelimit; the value still bounds deferred wakes).
    pub ratelimit_us: u32,
    pub disk: Disk,
    pub clock: Clock,
    /// GIC version and MSI delivery mode (v3-emulated outside `--gic`).
    pub delivery: Delivery,
    /// The guest's idle loop (WFI except in the resident-vCPU cases).
    #[serde(default = "Idle::wfi")]
    pub idle: Idle,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.topology, self.irq, self.sched)?;
        if self.sched == Sched::XenCompat {
            write!(f, " rl={}", self.ratelimit_us)?;
        }
        write!(f, " {}", self.disk)?;
        if self.shows_delivery() {
            write!(f, " {}", self.delivery)?;
        }
        write!(f, " {}", self.clock)?;
        if self.idle != Idle::Wfi {
            write!(f, " idle={}", self.idle)?;
        }
        Ok(())
    }
}

impl Case {
    /// Whether labels name the delivery mode: for a PCIe (MSI) disk, and for
    /// any disk on a GICv4 machine (the labels of GICv3 SPI-disk cases
    /// leave it out, so they match results recorded without the field).
    pub fn shows_delivery(&self) -> bool {
        self.disk.is_pcie() || self.delivery != Delivery::V3Emulated
    }

    /// A short label for tables and the plot legend, e.g.
    /// `1p2v unp xen-1000 ram icount` or `1p2v unp preempt nvme v4-direct icount`.
    pub fn label(&self) -> String {
        let irq = match self.irq {
            Irq::Pinned => "pin",
            Irq::Unpinned => "unp",
            Irq::MsiFio => "msi-fio",
            Irq::MsiHog => "msi-hog",
        };
        let sched = match self.sched {
            Sched::XenCompat => format!("xen-{}", self.ratelimit_us),
            Sched::WakePreempt => "preempt".to_string(),
        };
        let delivery = if self.shows_delivery() { format!(" {}", self.delivery) } else { String::new() };
        let idle = if self.idle == Idle::Wfi { String::new() } else { format!(" idle-{}", self.idle) };
        format!("{} {irq} {sched} {}{delivery} {}{idle}", self.topology, self.disk, self.clock)
    }
}

/// Xen's default ratelimit, used by the wake-preempt cases.
pub const DEFAULT_RATELIMIT_US: u32 = 1000;
/// The xen-compat ratelimits of the full matrix.
pub const XEN_RATELIMITS_US: [u32; 3] = [1000, 100, 0];
/// Service time of the `ram` disk (below the 1 ms ratelimit, like NVMe).
pub const RAM_DISK_LATENCY_US: u32 = 200;
/// fio runtime per run, seconds (issue default).
pub const DEFAULT_RUNTIME_S: u32 = 10;
/// Repeats per case (issue default; `--quick` uses 1).
pub const DEFAULT_REPEATS: u32 = 3;
/// The guest's name of the virtio disks in /proc/interrupts (see [`Disk::irq_name`]).
pub const DISK_IRQ_NAME: &str = "virtio0";
/// Service time of every request of the QEMU disks (QEMU's `null-co` block
/// driver, `latency-ns`): the same figure as the `ram` disk's, but on QEMU's
/// host real-time clock (see [`qemu_disk_args`]).
pub const QEMU_DISK_LATENCY_US: u32 = 200;
/// Size of the QEMU disks (reads return zeroes).
pub const QEMU_DISK_SIZE: &str = "256M";

/// Marker lines around fio's JSON on the console.
pub const FIO_BEGIN: &str = "@@FIO-JSON-BEGIN@@";
pub const FIO_END: &str = "@@FIO-JSON-END@@";
/// Prefix of the line reporting the disk IRQ's /proc/interrupts line after fio.
pub const IRQ_MARK: &str = "@@BENCH-IRQ@@";
/// The line a `1p1v+d1` DomU prints as its hog starts (on the console as
/// `(d1) @@BENCH-HOG@@`).
pub const HOG_MARK: &str = "@@BENCH-HOG@@";
/// The line Dom0 prints just before fio starts, in the `1p1v+d1` cases: the
/// DomU's [`HOG_MARK`] must come before it (the hog ran during all of fio).
pub const FIO_START_MARK: &str = "@@BENCH-FIO-START@@";
/// RAM of the `1p1v+d1` DomU, MiB: the guest image's kernel (26 MiB) and
/// initramfs (83 MiB, held while it is unpacked into a tmpfs of the same
/// size) do not fit in 128 MiB; 256 MiB is what the DomU tests boot with.
pub const DOMU_HOG_MEM_MB: u64 = 256;
/// Seconds Dom0 sleeps before fio in the `1p1v+d1` cases, so the DomU
/// (booting on the same pCPU, alone while Dom0 sleeps) has started its hog
/// before fio starts; [`parse::check_domu_hog`] verifies it did.
pub const DOMU_BOOT_WAIT_S: u32 = 2;

/// The (scheduler, ratelimit) pairs: xen-compat at each ratelimit, then wake-preempt.
fn scheds(quick: bool) -> Vec<(Sched, u32)> {
    let xen: &[u32] = if quick { &[1000] } else { &XEN_RATELIMITS_US };
    let mut v: Vec<(Sched, u32)> = xen.iter().map(|&r| (Sched::XenCompat, r)).collect();
    v.push((Sched::WakePreempt, DEFAULT_RATELIMIT_US));
    v
}

/// The benchmark matrix.
///
/// - `quick` (wins over `full`): 1p1v, 1p2v and 1p1v+d1, unpinned IRQ,
///   xen-compat 1000 vs wake-preempt, ram disk, icount: 6 cases (run them
///   once).
/// - default (`!full`): the icount matrix, i.e. the deterministic one the
///   ratios come from: {1p1v, 1p2v, 1p1v+d1} × IRQ × {xen 1000, 100, 0,
///   preempt} × {passthrough, backend, ram}.
/// - `full`: the icount matrix plus the real-time one, which adds 2p2v
///   (and has no 1p1v+d1: the DomU's ratios are the icount ones).
///
/// 1p1v has one vCPU, so its IRQ can only be where fio runs: it appears
/// once, as `unpinned`, and is the baseline for both IRQ settings of 1p2v.
/// Order: clock, disk, scheduler, topology, IRQ; so consecutive cases
/// differ in the cheapest dimension and a run cut short has compared
/// like with like.
pub fn matrix(full: bool, quick: bool) -> Vec<Case> {
    if quick {
        let mut v = Vec::new();
        for (sched, ratelimit_us) in scheds(true) {
            for topology in [Topology::OneP1V, Topology::OneP2V, Topology::OneP1VD1] {
                v.push(Case {
                    topology,
                    irq: Irq::Unpinned,
                    sched,
                    ratelimit_us,
                    disk: Disk::Ram,
                    clock: Clock::Icount,
                    delivery: Delivery::V3Emulated,
                    idle: Idle::Wfi,
                });
            }
        }
        return v;
    }
    let clocks: &[Clock] = if full { &[Clock::Icount, Clock::Realtime] } else { &[Clock::Icount] };
    let mut v = Vec::new();
    for &clock in clocks {
        let topologies: &[Topology] = match clock {
            Clock::Icount => &[Topology::OneP1V, Topology::OneP2V, Topology::OneP1VD1],
            Clock::Realtime => &[Topology::OneP1V, Topology::OneP2V, Topology::TwoP2V],
        };
        for &disk in Disk::SPI {
            for (sched, ratelimit_us) in scheds(false) {
                for &topology in topologies {
                    let irqs: &[Irq] =
                        if topology.vcpus() == 1 { &[Irq::Unpinned] } else { &[Irq::Unpinned, Irq::Pinned] };
                    for &irq in irqs {
                        v.push(Case {
                            topology,
                            irq,
                            sched,
                            ratelimit_us,
                            disk,
                            clock,
                            delivery: Delivery::V3Emulated,
                            idle: Idle::Wfi,
                        });
                    }
                }
            }
        }
    }
    v
}

/// The matrix of `--disk D[,D...] [--gic G[,G...]]`: the quick matrix's
/// cases (1p1v and 1p2v, unpinned IRQ, xen-compat 1000 vs wake-preempt,
/// icount) for each listed disk, in the order given, duplicates dropped,
/// and for a PCIe disk once per delivery mode of `gics`, followed by the
/// two MSI-steering cases of that mode (1p2v wake-preempt, [`Irq::MsiFio`]
/// and [`Irq::MsiHog`]: every MSI at the fio vCPU vs at the hog vCPU)
/// ([`Delivery::of_gics`]: `--gic 3,4` gives v3-emulated and v4-direct,
/// `--gic 4` v4-emulated and v4-direct). When a PCIe disk is listed, the
/// SPI reference (`passthrough`, virtio-mmio) is run first unless it is
/// listed too, so the report puts MSI beside SPI from the same run. SPI
/// disks have no LPIs to deliver: they run once, on the first delivery
/// mode's GIC.
///
/// Pinned IRQs are not part of it: the I/O queue vectors of NVMe and
/// virtio-blk-pci are *managed* MSI-X vectors (Linux spreads them over the
/// CPUs itself and refuses `smp_affinity` writes), so only the INTx line
/// could be pinned.
pub fn disk_matrix(disks: &[Disk], gics: &[u8]) -> Vec<Case> {
    let mut order: Vec<Disk> = Vec::new();
    if disks.iter().any(|d| d.is_pcie()) && !disks.contains(&Disk::Passthrough) {
        order.push(Disk::Passthrough);
    }
    for &d in disks {
        if !order.contains(&d) {
            order.push(d);
        }
    }
    let modes = Delivery::of_gics(gics);
    let mut v = Vec::new();
    for disk in order {
        let deliveries: &[Delivery] = if disk.is_pcie() { &modes } else { &modes[..1] };
        for &delivery in deliveries {
            for (sched, ratelimit_us) in scheds(true) {
                for topology in [Topology::OneP1V, Topology::OneP2V] {
                    v.push(Case {
                        topology,
                        irq: Irq::Unpinned,
                        sched,
                        ratelimit_us,
                        disk,
                        clock: Clock::Icount,
                        delivery,
                        idle: Idle::Wfi,
                    });
                }
            }
            if disk.is_pcie() {
                for irq in [Irq::MsiFio, Irq::MsiHog] {
                    v.push(Case {
                        topology: Topology::OneP2V,
                        irq,
                        sched: Sched::WakePreempt,
                        ratelimit_us: DEFAULT_RATELIMIT_US,
                        disk,
                        clock: Clock::Icount,
                        delivery,
                        idle: Idle::Wfi,
                    });
                }
                if !gics.is_empty() {
                    v.push(resident_case(disk, delivery));
                }
            }
        }
    }
    v
}

/// The quick matrix's cases without a DomU (1p1v and 1p2v, unpinned IRQ,
/// xen-compat 1000 vs wake-preempt, icount, GICv3) on each of `disks`, in the order given,
/// duplicates dropped: what `bench wakeup --platform graviton` runs on the
/// platform's disks (default NVMe, [`crate::platform::graviton::DEFAULT_DISK`]).
pub fn quick_matrix_on(disks: &[Disk]) -> Vec<Case> {
    let mut order: Vec<Disk> = Vec::new();
    for &d in disks {
        if !order.contains(&d) {
            order.push(d);
        }
    }
    let mut v = Vec::new();
    for disk in order {
        // No DomU there: `--domu` needs a device tree (Graviton boots with ACPI).
        v.extend(matrix(false, true).into_iter().filter(|c| !c.topology.domu_hog()).map(|c| Case { disk, ..c }));
    }
    v
}

/// The "fio vCPU resident and alone on its pCPU" case (2p2v, real
/// time: two pCPUs need QEMU's MTTCG threads): the hog on vCPU0, which
/// starts on pCPU0, fio on vCPU1, which starts on pCPU1, every MSI steered
/// to vCPU1 (`msi-fio`), wake-preempt, and the guest's idle loop polling
/// (`nohlt`, [`Idle::Poll`]). fio stays psync at depth 1, the workload of
/// every other row: what changes is that vCPU1 no longer blocks in WFI
/// between two reads (its vPE stays resident), so each completion
/// interrupt arrives while it runs, and the exits it costs are interrupt
/// delivery's alone (the report's "MSI IRQ exits / I/O" column). A polled
/// fio (libaio at depth > 1) would not do: fio still sleeps in
/// io_getevents() for at least one completion once the queue is full.
pub fn resident_case(disk: Disk, delivery: Delivery) -> Case {
    Case {
        topology: Topology::TwoP2V,
        irq: Irq::MsiFio,
        sched: Sched::WakePreempt,
        ratelimit_us: DEFAULT_RATELIMIT_US,
        disk,
        clock: Clock::Realtime,
        delivery,
        idle: Idle::Poll,
    }
}

/// The hypervisor boot arguments of a case. Provisional names, kept in this
/// one function (`dom0_max_vcpus`/`dom0_mem` come from
/// `qemu::RunOptions`, see [`run_options`]).
pub fn hypervisor_args(case: &Case) -> String {
    let wake = match case.sched {
        Sched::XenCompat => "off",
        Sched::WakePreempt => "on",
    };
    let mut s = format!("sched=credit2 sched_wake_preempt={wake} sched_ratelimit_us={}", case.ratelimit_us);
    s.push_str(&format!(" dom0_disk={}", case.disk.kind().as_str()));
    if case.disk == Disk::Ram {
        s.push_str(&format!(" dom0_disk_latency_us={RAM_DISK_LATENCY_US}"));
    }
    if case.delivery == Delivery::V4Emulated {
        s.push_str(" gic_vlpi=off");
    }
    if let Some(v) = case.irq.msi_vcpu(case.topology) {
        s.push_str(&format!(" dom0_msi_vcpu={v}"));
    }
    s
}

/// The fio command line (4 KiB random read, qd 1, direct, psync, JSON) on
/// `dev` ([`Disk::device_path`]).
pub fn fio_command(runtime_s: u32, dev: &str) -> String {
    format!(
        "fio --name=randread --filename={dev} --rw=randread --bs=4k --iodepth=1 --direct=1 \
         --ioengine=psync --runtime={runtime_s} --time_based --output-format=json"
    )
}

/// The guest's shell script (busybox sh) for a case; pass it as
/// `RunOptions::cmd` (it travels base64-encoded in `guestcmd=`, so keep it
/// well under the 2048-byte kernel command line: at most ~600 bytes,
/// ~800 in base64).
///
/// 1. With two vCPUs, start the hog on vCPU0.
/// 2. `pinned`: find the disk's IRQ number in /proc/interrupts by
///    [`Disk::irq_name`] (virtio-mmio: the line ending in it; PCIe: the last
///    line containing it, an I/O queue under MSI-X) and write the fio vCPU's
///    mask to its `smp_affinity` (a failure, e.g. a managed MSI-X vector, is
///    printed as `bench: ...` and exits 3: a "pinned" result that is not
///    pinned would be a lie).
/// 3. `1p1v+d1` (the hog is the DomU's, [`domu_hog_command`]): sleep
///    [`DOMU_BOOT_WAIT_S`] so the DomU has booted and started it, then print
///    [`FIO_START_MARK`].
/// 4. Run fio on the last vCPU against [`Disk::device_path`], JSON into a
///    file (so the console carries nothing during the measurement), then
///    kill the hog (Dom0's; the DomU's runs until the machine powers off).
/// 5. Print the disk IRQ's /proc/interrupts line(s) (`@@BENCH-IRQ@@ ...`:
///    which vCPU took the interrupts, through which irqchip; PCIe disks get
///    one such line per matching line) and the JSON between [`FIO_BEGIN`]
///    and [`FIO_END`]; exit with fio's status.
pub fn guest_command(case: &Case, runtime_s: u32) -> String {
    let t = case.topology;
    let cpu = t.fio_vcpu();
    let name = case.disk.irq_name();
    let pcie = case.disk.is_pcie();
    let mut s = String::new();
    if t.has_hog() {
        s.push_str("taskset -c 0 sh -c 'while :; do :; done' & H=$!\n");
    }
    if case.irq == Irq::Pinned {
        if pcie {
            s.push_str(&format!("N=$(sed -n 's/^ *\\([0-9]*\\):.*{name}.*/\\1/p' /proc/interrupts | tail -n1)\n"));
        } else {
            s.push_str(&format!("N=$(sed -n 's/^ *\\([0-9]*\\):.*{name}$/\\1/p' /proc/interrupts | head -n1)\n"));
        }
        s.push_str(&format!(
            "[ -n \"$N\" ] && echo {:x} > /proc/irq/$N/smp_affinity || {{ echo \"bench: cannot pin IRQ '$N'\"; {}exit 3; }}\n",
            1u32 << cpu,
            if t.has_hog() { "kill $H; " } else { "" }
        ));
    }
    if t.domu_hog() {
        s.push_str(&format!("sleep {DOMU_BOOT_WAIT_S}; echo {FIO_START_MARK}\n"));
    }
    s.push_str(&format!(
        "taskset -c {cpu} {} > /tmp/fio.json; R=$?\n",
        fio_command(runtime_s, case.disk.device_path())
    ));
    if t.has_hog() {
        s.push_str("kill $H\n");
    }
    if pcie {
        s.push_str(&format!("grep '{name}' /proc/interrupts | sed 's/^/{IRQ_MARK} /'\n"));
    } else {
        s.push_str(&format!("echo \"{IRQ_MARK} $(grep '{name}$' /proc/interrupts)\"\n"));
    }
    s.push_str(&format!("echo {FIO_BEGIN}; cat /tmp/fio.json; echo; echo {FIO_END}\n"));
    s.push_str("exit $R\n");
    s
}

/// The `1p1v+d1` DomU's command: print [`HOG_MARK`], then spin until the
/// machine powers off with Dom0 (it never exits, so `dom1.stopped` stays 0).
pub fn domu_hog_command() -> String {
    format!("echo {HOG_MARK}; while :; do :; done")
}

/// How long one run may take before QEMU is killed: boot plus fio, with
/// room for icount's 10–60× slowdown of wall time (a DomU booting on the
/// same pCPU doubles the boot).
pub fn run_timeout(case: &Case, runtime_s: u32) -> Duration {
    let mut secs = match case.clock {
        Clock::Icount => 300 + 60 * runtime_s as u64,
        Clock::Realtime => 180 + 3 * runtime_s as u64,
    };
    if case.topology.domu_hog() {
        secs += 300 + 60 * DOMU_BOOT_WAIT_S as u64;
    }
    Duration::from_secs(secs)
}

/// The QEMU arguments of a case's disk: QEMU's `null-co` block driver
/// (reads return zeroes) with a fixed [`QEMU_DISK_LATENCY_US`] service time,
/// behind the case's device (`Disk::kind().qemu_device()`; the `ram` disk
/// does not use QEMU's device, but a virtio-blk-device is attached anyway so
/// the guest's device numbering is the same as with passthrough/backend).
///
/// Clock: QEMU 7.2's null-co sleeps `latency-ns` on `QEMU_CLOCK_REALTIME`
/// (block/null.c, `null_co_common`), i.e. host time, not the guest's
/// virtual clock. Under `-icount shift=0,sleep=on`, while a vCPU runs (1p2v:
/// the hog) virtual time advances with the instructions executed during
/// those host 200 µs, so clat stays near 200 µs. While the machine idles
/// (1p1v), `sleep=on` advances virtual time by the host time until the vCPU
/// is kicked, so a request takes longer than its service time (the figures
/// are in docs/benchmarks/wakeup-gicv4.md). So the QEMU
/// disks' service time is fixed in host time only; compare them at the same
/// topology (wake-preempt vs xen-compat, MSI vs SPI), not 1p2v against
/// 1p1v. Only the `ram` disk's is exact in guest time. A raw file would
/// have the host page cache's service time instead (a few µs of guest time).
pub fn qemu_disk_args(disk: Disk) -> Vec<String> {
    let device = disk.kind().qemu_device().unwrap_or("virtio-blk-device,drive=d0");
    vec![
        "-drive".into(),
        format!(
            "driver=null-co,read-zeroes=on,latency-ns={},size={QEMU_DISK_SIZE},if=none,id=d0",
            QEMU_DISK_LATENCY_US as u64 * 1000
        ),
        "-device".into(),
        device.into(),
    ]
}

/// The `qemu::RunOptions` of one run of a case, for the runner: topology,
/// clock, hypervisor arguments, guest command, timeout, the QEMU disk
/// ([`qemu_disk_args`]) and, for `1p1v+d1`, the DomU with the hog. The
/// console is not echoed: show [`Progress`].
pub fn run_options(case: &Case, runtime_s: u32) -> crate::run::qemu::RunOptions {
    crate::run::qemu::RunOptions {
        pcpus: case.topology.pcpus(),
        vcpus: case.topology.vcpus(),
        hv_args: hypervisor_args(case),
        cmd: Some(guest_command(case, runtime_s)),
        timeout: run_timeout(case, runtime_s),
        icount: case.clock == Clock::Icount,
        gic: case.delivery.gic(),
        append: (case.idle == Idle::Poll).then(|| format!("{} nohlt", crate::run::qemu::DEFAULT_GUEST_ARGS)),
        extra: qemu_disk_args(case.disk),
        iommu: case.disk.behind_smmu(),
        echo: false,
        domus: case.topology.domu_hog().then(|| crate::run::domu::DomuOptions {
            cmd: Some(domu_hog_command()),
            mem_mb: DOMU_HOG_MEM_MB,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `target/bench/wakeup/`.
pub fn out_dir() -> PathBuf {
    crate::root().join("target").join("bench").join("wakeup")
}

/// Where a platform's report goes: [`out_dir`] for QEMU virt,
/// `target/bench/wakeup-<platform>/` otherwise (`wakeup-graviton`), so the
/// two reports sit side by side.
pub fn platform_out_dir(platform: crate::platform::PlatformKind) -> PathBuf {
    match platform {
        crate::platform::PlatformKind::Graviton => crate::root().join("target").join("bench").join("wakeup-graviton"),
        _ => out_dir(),
    }
}

/// Progress line printer: `case i/n (elapsed mm:ss): <case>`.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// 1-based index of the case being run.
    pub i: usize,
    pub n: usize,
    pub started: Instant,
}

impl Progress {
    pub fn new(n: usize) -> Self {
        Self { i: 0, n, started: Instant::now() }
    }

    /// Formats the line for an elapsed time (testable without a clock).
    pub fn format(i: usize, n: usize, elapsed: Duration, case: &dyn fmt::Display) -> String {
        let s = elapsed.as_secs();
        format!("case {i}/{n} (elapsed {:02}:{:02}): {case}", s / 60, s % 60)
    }

    pub fn line(&self, case: &dyn fmt::Display) -> String {
        Self::format(self.i, self.n, self.started.elapsed(), case)
    }

    /// Advance to the next case and print its line to stderr.
    pub fn next(&mut self, case: &dyn fmt::Display) {
        self.i += 1;
        eprintln!("{}", self.line(case));
    }
}

/// Everything measured for one case: one [`Sample`] per successful repeat,
/// and a message per failed one (timeout, no fio JSON, ...).
#[derive(Clone, Debug, PartialEq)]
pub struct CaseResult {
    pub case: Case,
    pub samples: Vec<Sample>,
    pub errors: Vec<String>,
}

/// The console's last non-empty line, for failure messages.
pub fn last_console_line(console: &str) -> &str {
    console.lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or("(the console is empty)")
}

/// `Err` naming each case with a failed repeat and why, once the report is
/// written: a benchmark with a failure exits non-zero.
pub fn check_failures<E: fmt::Display>(failed: impl IntoIterator<Item = (String, E)>) -> crate::Result<()> {
    let lines: Vec<String> = failed.into_iter().map(|(case, e)| format!("  {case}: {e}")).collect();
    if lines.is_empty() {
        Ok(())
    } else {
        bail!("{} failure(s):\n{}", lines.len(), lines.join("\n"))
    }
}
