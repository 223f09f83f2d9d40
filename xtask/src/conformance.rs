//! `cargo xtask conformance`: the conformance guest (tests/conformance)
//! built and booted on bare QEMU, as Dom0 or as a DomU, and its output read
//! back. tests/conformance.rs uses the same options and parser.

use crate::run::qemu::RunOptions;
use crate::Result;
use anyhow::{anyhow, bail, Context};
use std::time::Duration;

/// Where the guest runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Placement {
    /// QEMU's `-kernel` at EL1, no hypervisor.
    Bare,
    /// Dom0 under the hypervisor, with an NVMe disk it never touches so
    /// that Dom0 gets the vITS (and the ITS in its DT).
    Dom0,
    /// A 2-vCPU DomU; Dom0 runs the same kernel without checks
    /// (`conformance.skip_checks`: Dom0 owns the UART, its bytes would cut
    /// into the DomU's lines) and waits 6 s before powering off (the DomU needs under 1 s).
    Domu,
}

/// How the guest's kernel is handed to the hypervisor (`--kernel-format`).
/// In a DomU run, Dom0 (which runs the same guest without checks) gets the
/// same format, at its own address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelFormat {
    /// The arm64 Image (relocatable, placed by the hypervisor).
    #[default]
    Image,
    /// An ELF executable linked at a fixed address ([`crate::build::conformance_elf`]):
    /// [`DOM0_LOAD_ADDR`] for Dom0, [`DOMU_LOAD_ADDR`] for the DomU.
    Elf,
    /// The flat image as a raw binary at a load address (`dom0_kernel_load_addr=`,
    /// `hv,kernel-load-addr`): the same two addresses.
    Raw,
}

/// Where a fixed-address Dom0 kernel goes: the base of the RAM the
/// hypervisor gives Dom0 on these runs (QEMU's 512 MiB low reserve, then
/// `dom0_mem=256M`), so Dom0's RAM stays where it is for the Image.
pub const DOM0_LOAD_ADDR: u64 = 0x6000_0000;
/// Where a fixed-address DomU kernel goes: the base of its RAM.
pub const DOMU_LOAD_ADDR: u64 = hypervisor::domain::layout::DOMU_RAM_BASE;

/// The console prefix of the guest's lines.
pub fn prefix(at: Placement) -> &'static str {
    match at {
        Placement::Domu => "(d1) ",
        _ => "",
    }
}

/// The run: 2 vCPUs (the SGI broadcast, CPU_OFF and second-CPU checks need
/// them), 256 MiB, `gic`, `pcpus`, the kernel as `format` (an Image on
/// bare QEMU).
pub fn options(at: Placement, gic: u8, pcpus: u32, format: KernelFormat) -> Result<RunOptions> {
    if at == Placement::Bare && format != KernelFormat::Image {
        bail!("--kernel-format elf|raw needs the hypervisor: not with --at bare");
    }
    let dom0_kernel = match format {
        KernelFormat::Elf => crate::build::conformance_elf(DOM0_LOAD_ADDR)?,
        KernelFormat::Image | KernelFormat::Raw => crate::build::conformance()?,
    };
    let raw = format == KernelFormat::Raw;
    let mut o = RunOptions {
        kernel: Some(dom0_kernel),
        kernel_load_addr: raw.then_some(DOM0_LOAD_ADDR),
        gic,
        pcpus,
        vcpus: 2,
        mem_mb: 256,
        timeout: Duration::from_secs(90),
        ..Default::default()
    };
    match at {
        Placement::Bare => o.bare = true,
        Placement::Dom0 => {
            let img = crate::run::qemu::scratch_disk().context("scratch disk")?;
            o.hv_args = "dom0_disk=nvme".into();
            o.extra = vec![
                "-drive".into(),
                format!("if=none,file={},format=raw,id=d0", img.display()),
                "-device".into(),
                "nvme,drive=d0,serial=hvdisk0".into(),
            ];
        }
        Placement::Domu => {
            o.append = Some("conformance.skip_checks conformance.linger_ms=6000".into());
            let kernel = match format {
                KernelFormat::Elf => Some(crate::build::conformance_elf(DOMU_LOAD_ADDR)?),
                KernelFormat::Image | KernelFormat::Raw => None,
            };
            o.domus = Some(crate::run::domu::DomuOptions {
                count: 1,
                vcpus: 2,
                mem_mb: 64,
                kernel,
                kernel_load_addr: raw.then_some(DOMU_LOAD_ADDR),
                ..Default::default()
            });
        }
    }
    Ok(o)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    Fail,
    Skip,
}

/// One `check <name>: …` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub verdict: Verdict,
    pub line: String,
}

/// The check lines behind `prefix` (`""`: Dom0 or bare QEMU, `"(d1) "`: the
/// first DomU), in order.
pub fn checks(console: &str, prefix: &str) -> Vec<Check> {
    console
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("check ")?.split_once(": ")?;
            let verdict = match rest.split_whitespace().next()? {
                "ok" => Verdict::Ok,
                "FAIL" => Verdict::Fail,
                "skip" => Verdict::Skip,
                _ => return None,
            };
            Some(Check { name: name.to_string(), verdict, line: l.to_string() })
        })
        .collect()
}

/// The guest's closing line behind `prefix`: (passed, failed, skipped).
pub fn summary(console: &str, prefix: &str) -> Option<(u32, u32, u32)> {
    console.lines().filter_map(|l| l.strip_prefix(prefix)).find_map(|l| {
        let r = l.strip_prefix("conformance: ")?;
        let n: Vec<u32> = r.split(", ").filter_map(|p| p.split_whitespace().next()?.parse().ok()).collect();
        (n.len() == 3 && r.ends_with(" skipped")).then(|| (n[0], n[1], n[2]))
    })
}

/// `cargo xtask conformance`: runs the guest with its console on this
/// terminal; 0 when it finished with no check failed.
pub fn run(at: Placement, gic: u8, pcpus: u32, format: KernelFormat) -> Result<i32> {
    let o = options(at, gic, pcpus, format)?;
    let r = crate::run::qemu::run(&o)?;
    if r.timed_out {
        bail!("QEMU timed out");
    }
    let p = prefix(at);
    match summary(&r.console, p) {
        Some((passed, failed, skipped)) => {
            eprintln!("xtask: conformance: {passed} passed, {failed} failed, {skipped} skipped");
            Ok(i32::from(failed > 0))
        }
        None => Err(anyhow!("the guest printed no summary line (see the console above)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_summary_parse() {
        let c = "check a: ok\n(d1) check b: FAIL why: because\ncheck c: skip no ITS\n\
                 check bad line\nconformance: 1 passed, 0 failed, 1 skipped\n(d1) conformance: 0 passed, 1 failed, 0 skipped\n";
        let names = |p| checks(c, p).into_iter().map(|c| (c.name, c.verdict)).collect::<Vec<_>>();
        assert_eq!(names(""), [("a".to_string(), Verdict::Ok), ("c".to_string(), Verdict::Skip)]);
        assert_eq!(names("(d1) "), [("b".to_string(), Verdict::Fail)]);
        assert_eq!(summary(c, ""), Some((1, 0, 1)));
        assert_eq!(summary(c, "(d1) "), Some((0, 1, 0)));
        assert_eq!(summary("conformance: EL1 cpus 2", ""), None);
    }
}
