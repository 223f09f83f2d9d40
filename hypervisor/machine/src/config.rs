//! Hypervisor options from `/chosen/bootargs`, named like Xen's.
//!
//! Example: `console=dtuart loglvl=info dom0_mem=512M dom0_max_vcpus=2`.
//! The one parser of the hypervisor's command line: the scheduler's
//! options (`sched*`, `credit2_runqueue`, `sched_vcpu_weight`) are handed
//! to [`SchedConfig::set`] word by word, so every option is read here, once.
//! Unknown options are kept in [`Config::raw`]; a malformed value is an error
//! naming it.

use crate::sched::{SchedConfig, SchedError, VcpuId};
use alloc::string::String;
use alloc::vec::Vec;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    BadValue {
        key: String,
        value: String,
    },
    /// A scheduler option's value, or the scheduler options together
    /// (`SchedConfig::validate`).
    Sched(SchedError),
}

/// Where the guest's disk comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskMode {
    /// QEMU's virtio-mmio devices are mapped into the guest (Dom0-style).
    Passthrough,
    /// The hypervisor's virtio-blk device over a RAM image with a fixed
    /// service time (`dom0_disk_latency_us`).
    Ram,
    /// The hypervisor's virtio-blk device over the physical virtio-blk
    /// device, driven by the hypervisor.
    Backend,
    /// No disk, and no passthrough devices.
    None,
    /// The PCIe host bridge passed through (Dom0-style), with a virtio-blk
    /// PCI device behind it; no virtio-mmio device is passed through.
    VirtioPci,
    /// The same with an NVMe controller behind the bridge.
    Nvme,
}

impl DiskMode {
    /// Whether the hypervisor emulates the guest's disk.
    pub fn emulated(self) -> bool {
        matches!(self, DiskMode::Ram | DiskMode::Backend)
    }

    /// Whether the guest gets the PCIe host bridge (and its disk is on it).
    pub fn pcie(self) -> bool {
        matches!(self, DiskMode::VirtioPci | DiskMode::Nvme)
    }
}

/// What to do with the machine's SMMUs (`iommu=`, as Xen takes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IommuMode {
    /// `iommu=off` (or `no`, `0`, ...): SMMUs left as firmware left them;
    /// devices' DMA is not confined. Still hidden from Dom0.
    Off,
    /// `iommu=on` (default): every SMMU the description names confines
    /// the DMA behind it; one that cannot be brought up is logged and the
    /// boot goes on.
    On,
    /// `iommu=required` or `iommu=force`: as `On`, but an SMMU that cannot
    /// be brought up stops the boot (Xen's semantics).
    Required,
}

/// Parsed hypervisor options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Guest RAM in bytes (`dom0_mem=`); `None`: all RAM not kept for us.
    pub dom0_mem: Option<u64>,
    /// vCPUs of the guest (`dom0_max_vcpus=`); `None`: one per pCPU.
    pub dom0_max_vcpus: Option<u32>,
    /// Log level (`loglvl=error|warn|info|debug|trace`).
    pub loglvl: log::LevelFilter,
    /// Scheduler weight of the guest's vCPUs (`dom0_weight=`, Credit2 default 256).
    pub dom0_weight: u32,
    /// Credit2 cap of the guest in percent of one pCPU (`dom0_cap=`, 1 to
    /// 100 per pCPU, checked by the scheduler; default uncapped).
    pub dom0_cap: Option<u32>,
    /// Pin vCPU i to pCPU i mod N (`dom0_vcpus_pin`).
    pub dom0_vcpus_pin: bool,
    /// The guest's disk (`dom0_disk=`).
    pub disk: DiskMode,
    /// RAM disk size (`dom0_disk_size=`, default 128M).
    pub disk_size: u64,
    /// Dom0's kernel is a raw binary loaded at this (4 KiB-aligned,
    /// host-physical) address and entered there (`dom0_kernel_load_addr=`,
    /// hex with `0x` or decimal); `None`: an arm64 Image or ELF file
    /// (`boot::image`).
    pub dom0_kernel_load_addr: Option<u64>,
    /// Heap the hypervisor may allocate at run time on Dom0's behalf
    /// (`dom0_heap_quota=`, 1M to 1G; default
    /// [`crate::quota::DEFAULT_DOM0_HEAP_QUOTA`]).
    pub dom0_heap_quota: u64,
    /// Service time of each RAM-disk request (`dom0_disk_latency_us=`).
    pub disk_latency_us: u64,
    /// How late a blocked vCPU's virtual-timer wake may be (`timer_slop_ns=`):
    /// deadlines are rounded up to a multiple of it so nearby timers share
    /// one EL2 timer interrupt, as Xen's `timer_slop`. 0 = exact.
    pub timer_slop_ns: u64,
    /// GICv4 direct injection of the guest's MSIs as vLPIs when the GIC can
    /// (`gic_vlpi=on|off`, Xen's name; default on). Off: host LPIs injected
    /// through list registers, as on a GICv3.
    pub gic_vlpi: bool,
    /// Confine devices' DMA with the machine's SMMUv3s (`iommu=`, Xen's
    /// name and values; default on where the description has an SMMU).
    pub iommu: IommuMode,
    /// A virtual PMU for every domain when the CPU's PMU allows it
    /// (`vpmu=on|off`, Xen's name; default on): see [`crate::vpmu`]. Off:
    /// the PMU is hidden and its registers are UNDEFINED, as before KVM's
    /// vPMU.
    pub vpmu: bool,
    /// Benchmark knob (`dom0_msi_vcpu=N`): every guest MSI goes to vCPU N,
    /// whatever collection the guest mapped its event to (Linux's managed
    /// MSI affinity is read-only, so the benchmark cannot aim a device's
    /// interrupts at the hog vCPU from inside the guest). Not for
    /// production: it overrides the guest's choice. A vCPU the VM does not
    /// have is ignored with a warning.
    pub dom0_msi_vcpu: Option<u32>,
    /// Dump the scheduling flight recorder (`crate::trace`) when a vCPU's
    /// wake→schedule-in latency exceeds this many µs
    /// (`sched_trace_threshold_us=`; default off).
    pub sched_trace_threshold_us: Option<u64>,
    /// At most this many threshold dumps per boot (`sched_trace_max_dumps=`,
    /// default `crate::trace::MAX_DUMPS`; at most 1000).
    pub sched_trace_max_dumps: u32,
    /// Dom0 writing Ctrl-\\ (0x1c) to its console dumps the recorder
    /// (`sched_trace_dom0_key=on`, default off: a Dom0 printing binary data
    /// would otherwise stall its pCPU for every such byte); counted against
    /// `sched_trace_max_dumps`.
    pub sched_trace_dom0_key: bool,
    /// Host RAM set aside for DomUs made while running (`domu_pool=SIZE`,
    /// 2 MiB multiples, default 0: none; `hvctl create` then says so).
    pub domu_pool: u64,
    /// Test aid (`domu_selftest=N`, at most 8): N DomUs running Dom0's
    /// kernel and initrd, with RAM and a RAM disk carved from the top of
    /// Dom0's RAM, until the dom0less device tree describes real ones.
    pub domu_selftest: u32,
    /// RAM of each self-test DomU (`domu_selftest_mem=`, default 512M).
    pub domu_selftest_mem: u64,
    /// vCPUs of each self-test DomU (`domu_selftest_vcpus=`, 1 to 8, default 1).
    pub domu_selftest_vcpus: u32,
    /// Its RAM disk (`domu_selftest_disk=`, default 32M; 0 = none).
    pub domu_selftest_disk: u64,
    /// Base64 of the shell command each self-test DomU runs
    /// (`domu_selftest_cmd=`, passed on as the guest image's `guestcmd=`).
    pub domu_selftest_cmd: Option<String>,
    /// The scheduler's tunables (`sched=credit2`, `sched_ratelimit_us=`,
    /// `sched_wake_preempt=`, ...: see [`SchedConfig::set`]).
    pub sched: SchedConfig,
    /// Per-vCPU weights of Dom0 (`sched_vcpu_weight=<vcpu>:<weight>`,
    /// repeatable), in order.
    pub sched_vcpu_weights: Vec<(VcpuId, u32)>,
    /// All `key=value` pairs in order, for other subsystems.
    pub raw: Vec<(String, String)>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            dom0_mem: None,
            dom0_max_vcpus: None,
            loglvl: log::LevelFilter::Info,
            dom0_weight: 256,
            dom0_cap: None,
            dom0_vcpus_pin: false,
            disk: DiskMode::Passthrough,
            disk_size: 128 << 20,
            dom0_heap_quota: crate::quota::DEFAULT_DOM0_HEAP_QUOTA,
            dom0_kernel_load_addr: None,
            disk_latency_us: 0,
            timer_slop_ns: 0,
            gic_vlpi: true,
            iommu: IommuMode::On,
            vpmu: true,
            dom0_msi_vcpu: None,
            sched_trace_threshold_us: None,
            sched_trace_max_dumps: crate::trace::MAX_DUMPS,
            sched_trace_dom0_key: false,
            domu_pool: 0,
            domu_selftest: 0,
            domu_selftest_mem: 512 << 20,
            domu_selftest_vcpus: 1,
            domu_selftest_disk: 32 << 20,
            domu_selftest_cmd: None,
            sched: SchedConfig::default(),
            sched_vcpu_weights: Vec::new(),
            raw: Vec::new(),
        }
    }
}

impl Config {
    /// `dom0_msi_vcpu=` for a VM of `nr_vcpus` vCPUs: the vCPU, or `None`
    /// (not given, or not a vCPU of the VM: warned about and ignored).
    pub fn msi_vcpu(&self, nr_vcpus: usize) -> Option<usize> {
        let v = self.dom0_msi_vcpu? as usize;
        if v >= nr_vcpus {
            log::warn!("dom0_msi_vcpu={v}: Dom0 has {nr_vcpus} vCPU(s), ignored");
            return None;
        }
        log::warn!("dom0_msi_vcpu={v}: every guest MSI goes to vCPU {v} (benchmark knob)");
        Some(v)
    }
}

/// A boolean option's value, Xen's spellings; a bare key means on.
fn on_off(v: &str) -> Option<bool> {
    match v {
        "" | "1" | "on" | "true" | "yes" => Some(true),
        "0" | "off" | "false" | "no" => Some(false),
        _ => None,
    }
}

/// Parses a size like `512M`, `2G`, `4096K` or plain bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1u64 << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        b'G' | b'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mul)
}

/// Parses an address: hex with `0x` or decimal. (Alignment and whether it
/// lies in RAM are the boot plan's to check.)
pub fn parse_addr(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(&h.replace('_', ""), 16).ok(),
        None => s.parse().ok(),
    }
}

impl Config {
    pub fn parse(args: &str) -> Result<Self, ConfigError> {
        let mut c = Config::default();
        for word in args.split_ascii_whitespace() {
            let (k, v) = word.split_once('=').unwrap_or((word, ""));
            let bad = || ConfigError::BadValue { key: k.into(), value: v.into() };
            match k {
                "dom0_mem" => c.dom0_mem = Some(parse_size(v).filter(|&m| m >= 32 << 20).ok_or_else(bad)?),
                "dom0_max_vcpus" => {
                    c.dom0_max_vcpus = Some(v.parse().ok().filter(|&n: &u32| (1..=64).contains(&n)).ok_or_else(bad)?)
                }
                "loglvl" => {
                    c.loglvl = match v {
                        "error" => log::LevelFilter::Error,
                        "warn" | "warning" => log::LevelFilter::Warn,
                        "info" => log::LevelFilter::Info,
                        "debug" => log::LevelFilter::Debug,
                        "trace" | "all" => log::LevelFilter::Trace,
                        _ => return Err(bad()),
                    }
                }
                "dom0_weight" => {
                    c.dom0_weight = v.parse().ok().filter(|&w: &u32| (1..=65535).contains(&w)).ok_or_else(bad)?
                }
                "dom0_heap_quota" => {
                    c.dom0_heap_quota =
                        parse_size(v).filter(|q| crate::quota::QUOTA_RANGE.contains(q)).ok_or_else(bad)?
                }
                "dom0_kernel_load_addr" => c.dom0_kernel_load_addr = Some(parse_addr(v).ok_or_else(bad)?),
                "dom0_cap" => c.dom0_cap = Some(v.parse().ok().filter(|&n: &u32| n >= 1).ok_or_else(bad)?),
                "dom0_vcpus_pin" => c.dom0_vcpus_pin = matches!(v, "" | "1" | "true" | "on"),
                "dom0_disk" => {
                    c.disk = match v {
                        "passthrough" => DiskMode::Passthrough,
                        "ram" => DiskMode::Ram,
                        "backend" => DiskMode::Backend,
                        "none" => DiskMode::None,
                        "virtio-pci" => DiskMode::VirtioPci,
                        "nvme" => DiskMode::Nvme,
                        _ => return Err(bad()),
                    }
                }
                "timer_slop_ns" => {
                    c.timer_slop_ns = v.parse().ok().filter(|&n: &u64| n <= 10_000_000).ok_or_else(bad)?
                }
                "sched_trace_threshold_us" => {
                    c.sched_trace_threshold_us =
                        Some(v.parse().ok().filter(|&n: &u64| n <= 10_000_000).ok_or_else(bad)?)
                }
                "sched_trace_max_dumps" => {
                    c.sched_trace_max_dumps = v.parse().ok().filter(|&n: &u32| n <= 1000).ok_or_else(bad)?
                }
                "domu_pool" => c.domu_pool = parse_size(v).filter(|&m| m.is_multiple_of(2 << 20)).ok_or_else(bad)?,
                "domu_selftest" => c.domu_selftest = v.parse().ok().filter(|&n: &u32| n <= 8).ok_or_else(bad)?,
                "domu_selftest_mem" => {
                    c.domu_selftest_mem =
                        parse_size(v).filter(|&m| m >= 64 << 20 && m.is_multiple_of(2 << 20)).ok_or_else(bad)?
                }
                "domu_selftest_vcpus" => {
                    c.domu_selftest_vcpus = v.parse().ok().filter(|n: &u32| (1..=8).contains(n)).ok_or_else(bad)?
                }
                "domu_selftest_disk" => {
                    c.domu_selftest_disk =
                        parse_size(v).filter(|&s| s.is_multiple_of(512) && s <= 1 << 30).ok_or_else(bad)?
                }
                "domu_selftest_cmd" => {
                    let ok = !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b));
                    c.domu_selftest_cmd = Some(String::from(v)).filter(|_| ok);
                    if !ok {
                        return Err(bad());
                    }
                }
                "dom0_disk_size" => {
                    c.disk_size =
                        parse_size(v).filter(|&s| s >= 1 << 20 && s % 512 == 0 && s <= 4 << 30).ok_or_else(bad)?
                }
                "sched_trace_dom0_key" => c.sched_trace_dom0_key = on_off(v).ok_or_else(bad)?,
                "gic_vlpi" => c.gic_vlpi = on_off(v).ok_or_else(bad)?,
                "iommu" => {
                    c.iommu = match v {
                        "force" | "required" => IommuMode::Required,
                        _ => on_off(v).map(|on| if on { IommuMode::On } else { IommuMode::Off }).ok_or_else(bad)?,
                    }
                }
                "vpmu" => c.vpmu = on_off(v).ok_or_else(bad)?,
                "dom0_msi_vcpu" => c.dom0_msi_vcpu = Some(v.parse().ok().filter(|&n: &u32| n < 256).ok_or_else(bad)?),
                "dom0_disk_latency_us" => {
                    c.disk_latency_us = v.parse().ok().filter(|&l: &u64| l <= 10_000_000).ok_or_else(bad)?
                }
                "sched_vcpu_weight" => {
                    c.sched_vcpu_weights.push(SchedConfig::parse_vcpu_weight(v).map_err(ConfigError::Sched)?)
                }
                _ => {
                    c.sched.set(k, v).map_err(ConfigError::Sched)?;
                }
            }
            c.raw.push((k.into(), v.into()));
        }
        c.sched.validate().map_err(ConfigError::Sched)?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("99999999999999G"), None);
    }

    #[test]
    fn options() {
        let c = Config::parse("dom0_mem=768M dom0_max_vcpus=2 loglvl=debug sched_ratelimit_us=0").unwrap();
        assert_eq!(c.dom0_mem, Some(768 << 20));
        assert_eq!(c.dom0_max_vcpus, Some(2));
        assert_eq!(c.loglvl, log::LevelFilter::Debug);
        assert!(c.raw.iter().any(|(k, v)| k == "sched_ratelimit_us" && v == "0"));
        assert!(Config::parse("dom0_mem=12").is_err());
        let c = Config::parse("dom0_kernel_load_addr=0x6000_0000").unwrap();
        assert_eq!(c.dom0_kernel_load_addr, Some(0x6000_0000));
        assert_eq!(Config::parse("dom0_kernel_load_addr=4096").unwrap().dom0_kernel_load_addr, Some(4096));
        assert!(Config::parse("dom0_kernel_load_addr=0xzz").is_err());
        assert!(Config::parse("dom0_kernel_load_addr=").is_err());
        assert!(Config::parse("dom0_max_vcpus=0").is_err());
        assert!(Config::parse("dom0_weight=0").is_err());
        let p = Config::parse("dom0_vcpus_pin dom0_weight=512").unwrap();
        assert!(p.dom0_vcpus_pin);
        assert_eq!(p.dom0_weight, 512);
        assert_eq!(p.dom0_cap, None);
        assert_eq!(Config::parse("dom0_cap=50").unwrap().dom0_cap, Some(50));
        assert!(Config::parse("dom0_cap=0").is_err() && Config::parse("dom0_cap=x").is_err());
        assert!(Config::parse("loglvl=loud").is_err());
        assert_eq!(Config::parse("").unwrap(), Config::default());
        let d = Config::parse("dom0_disk=ram dom0_disk_latency_us=200 dom0_disk_size=64M").unwrap();
        assert_eq!(d.disk, DiskMode::Ram);
        assert_eq!(d.disk_latency_us, 200);
        assert_eq!(d.disk_size, 64 << 20);
        assert!(Config::parse("dom0_disk=floppy").is_err());
        assert_eq!(Config::parse("dom0_disk=virtio-pci").unwrap().disk, DiskMode::VirtioPci);
        assert_eq!(Config::parse("dom0_disk=nvme").unwrap().disk, DiskMode::Nvme);
        assert!(DiskMode::Nvme.pcie() && !DiskMode::Nvme.emulated() && !DiskMode::Passthrough.pcie());
        assert!(Config::parse("dom0_disk_size=100").is_err());
        assert_eq!(Config::parse("timer_slop_ns=50000").unwrap().timer_slop_ns, 50_000);
        assert!(Config::parse("timer_slop_ns=x").is_err());
        assert_eq!(Config::default().iommu, IommuMode::On);
        assert_eq!(Config::parse("iommu=off").unwrap().iommu, IommuMode::Off);
        assert_eq!(Config::parse("iommu=0").unwrap().iommu, IommuMode::Off);
        assert_eq!(Config::parse("iommu=required").unwrap().iommu, IommuMode::Required);
        assert_eq!(Config::parse("iommu=force").unwrap().iommu, IommuMode::Required);
        assert!(Config::parse("iommu=sharept").is_err());
        assert!(Config::default().gic_vlpi);
        assert!(!Config::parse("gic_vlpi=off").unwrap().gic_vlpi);
        assert!(!Config::parse("gic_vlpi=0").unwrap().gic_vlpi);
        assert!(Config::parse("gic_vlpi=on").unwrap().gic_vlpi);
        assert!(Config::parse("gic_vlpi=maybe").is_err());
        assert!(Config::default().vpmu);
        assert!(!Config::parse("vpmu=off").unwrap().vpmu);
        assert!(Config::parse("vpmu").unwrap().vpmu);
        assert!(Config::parse("vpmu=2").is_err());
        assert_eq!(Config::default().dom0_msi_vcpu, None);
        let c = Config::parse("dom0_msi_vcpu=1").unwrap();
        assert_eq!((c.dom0_msi_vcpu, c.msi_vcpu(2), c.msi_vcpu(1)), (Some(1), Some(1), None));
        assert!(Config::parse("dom0_msi_vcpu=x").is_err());
        assert!(Config::parse("dom0_msi_vcpu=-1").is_err());
        assert_eq!(Config::parse("sched_trace_threshold_us=150").unwrap().sched_trace_threshold_us, Some(150));
        assert!(!Config::parse("").unwrap().sched_trace_dom0_key);
        assert!(Config::parse("sched_trace_dom0_key=on").unwrap().sched_trace_dom0_key);
        assert!(Config::parse("sched_trace_dom0_key=maybe").is_err());
        assert_eq!(Config::default().sched_trace_threshold_us, None);
        assert!(Config::parse("sched_trace_threshold_us=-1").is_err());
        assert_eq!(Config::parse("sched_trace_max_dumps=64").unwrap().sched_trace_max_dumps, 64);
        assert!(Config::parse("sched_trace_max_dumps=1001").is_err());
    }

    #[test]
    fn domu_selftest_options() {
        let c = Config::parse("domu_selftest=2 domu_selftest_mem=256M domu_selftest_cmd=dHJ1ZQ==").unwrap();
        assert_eq!((c.domu_selftest, c.domu_selftest_mem, c.domu_selftest_disk), (2, 256 << 20, 32 << 20));
        assert_eq!(c.domu_selftest_cmd.as_deref(), Some("dHJ1ZQ=="));
        assert_eq!(Config::default().domu_selftest, 0);
        assert!(Config::parse("domu_selftest=9").is_err());
        assert_eq!(Config::parse("domu_selftest_vcpus=2").unwrap().domu_selftest_vcpus, 2);
        assert!(Config::parse("domu_selftest_vcpus=0").is_err());
        assert!(Config::parse("domu_selftest_mem=63M").is_err());
        assert!(Config::parse("domu_selftest_cmd=a,b").is_err());
        assert!(Config::parse("domu_selftest_disk=0").unwrap().domu_selftest_disk == 0);
    }

    /// The scheduler's options are read by the same parser, with the
    /// scheduler's own checks.
    #[test]
    fn scheduler_options() {
        use crate::sched::WakeMode;
        let c = Config::parse(
            "dom0_mem=512M sched=credit2 sched_ratelimit_us=0 sched_wake_preempt=off credit2_runqueue=cpu \
             sched_vcpu_weight=1:1024 sched_vcpu_weight=0:128 console=ttyAMA0",
        )
        .unwrap();
        assert_eq!(c.sched.ratelimit_ns, 0);
        assert_eq!(c.sched.wake_mode, WakeMode::XenCompat);
        assert_eq!(c.sched.runqueue, crate::sched::RunqueueLayout::PerCpu);
        assert_eq!(c.sched_vcpu_weights, [(VcpuId(1), 1024), (VcpuId(0), 128)]);
        assert_eq!(
            c.sched,
            SchedConfig::from_bootargs("sched_ratelimit_us=0 sched_wake_preempt=off credit2_runqueue=cpu").unwrap()
        );
        assert_eq!(Config::parse("").unwrap().sched, SchedConfig::default());
        let bad = |args: &str| Config::parse(args).unwrap_err();
        assert_eq!(bad("sched=credit"), ConfigError::Sched(SchedError::BadBootArg("sched")));
        assert_eq!(bad("sched_ratelimit_us=5O"), ConfigError::Sched(SchedError::BadBootArg("sched_ratelimit_us")));
        // Out of Xen's range: warned about, the default used (as Xen does).
        assert_eq!(Config::parse("sched_ratelimit_us=50").unwrap().sched, SchedConfig::default());
        assert_eq!(bad("sched_min_slice_us=0"), ConfigError::Sched(SchedError::BadConfig));
        assert_eq!(bad("sched_vcpu_weight=1:0"), ConfigError::Sched(SchedError::BadWeight(0)));
        assert_eq!(bad("sched_vcpu_weight=1"), ConfigError::Sched(SchedError::BadBootArg("sched_vcpu_weight")));
    }
}
