//! The QEMU command line for running the hypervisor with a Linux guest, and
//! a runner that streams the console, enforces a timeout and reads the
//! guest command's exit status (`@@GUEST-EXIT N@@`, printed by the guest
//! image's /init).

pub use crate::text::{base64, printable_args};
use crate::Result;
use anyhow::{bail, Context};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where the boot modules go in host RAM: below the guest's RAM, which the
/// hypervisor places above `HYP_RESERVED` (512 MiB) from the RAM base.
const KERNEL_ADDR: u64 = 0x5000_0000;
const MODULE_GAP: u64 = 2 << 20;
const RESERVED_MB: u64 = hypervisor::platform_desc::known::qemu_virt::PLATFORM.hyp_reserved >> 20;

/// QEMU's CPU model when none is named (`--cpu`): `max` with the cheap
/// pointer-authentication algorithm (the default one makes Linux boot 3×
/// slower).
pub const DEFAULT_CPU: &str = "max,pauth-impdef=on";

/// The guest kernel's command line when `RunOptions::append` is `None`.
pub const DEFAULT_GUEST_ARGS: &str = "console=ttyAMA0 earlycon=pl011,0x09000000";

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub gic: u8,
    pub pcpus: u32,
    pub vcpus: u32,
    pub mem_mb: u64,
    pub cpu: String,
    pub hv_args: String,
    pub timeout: Duration,
    pub cmd: Option<String>,
    pub kernel: Option<PathBuf>,
    pub initrd: Option<PathBuf>,
    pub append: Option<String>,
    pub icount: bool,
    /// The PCIe root complex behind an SMMUv3 doing stage 2 (`--iommu`).
    pub iommu: bool,
    /// Extra QEMU arguments (e.g. a disk).
    pub extra: Vec<String>,
    /// Echo the console to stdout while running.
    pub echo: bool,
    /// Typed on the guest console once /init is up (interactive-shell tests).
    pub input: Option<String>,
    /// Where QEMU's guest-loader puts the kernel (default 0x50000000).
    pub kernel_addr: Option<u64>,
    /// Where it puts the initrd (default: the next 2 MiB boundary after
    /// the kernel file, plus 2 MiB).
    pub initrd_addr: Option<u64>,
    /// Dom0's kernel is a raw binary the hypervisor loads (and enters) at
    /// this address (`--kernel-load-addr`: `dom0_kernel_load_addr=`).
    pub kernel_load_addr: Option<u64>,
    /// Typed on the console before the guest's shell reads (console-flood
    /// tests).
    pub early_input: Option<EarlyInput>,
    /// Typed after `early_input`, once the console shows its own marker (a
    /// second stage: e.g. after one domain stopped).
    pub then_input: Option<EarlyInput>,
    /// Boot through firmware (`--firmware`) instead of QEMU's direct
    /// `-kernel` entry.
    pub firmware: Option<crate::firmware::Firmware>,
    /// Where the hypervisor is loaded and how it is entered (`hvload`).
    pub hv_boot: crate::run::hvload::HvBoot,
    /// DomUs described in the DTB (`--domu N`, see [`crate::run::domu`]).
    pub domus: Option<crate::run::domu::DomuOptions>,
    /// RAM for DomUs `hvctl create` makes (`--domu-pool`: QEMU's RAM grows
    /// by it, the hypervisor gets `domu_pool=`, and Dom0's default initrd
    /// carries a DomU's files); 0 = none.
    pub domu_pool_mb: u64,
    /// The kernel flavour of the built guest image, used when `kernel` is
    /// `None` (`--kernel-flavour`; its initramfs carries that kernel's
    /// modules).
    pub flavour: crate::build::image::Flavour,
    /// No hypervisor: QEMU's `-kernel` starts `kernel` at EL1 itself
    /// (`virt` without `virtualization=on`), for guests checked against
    /// bare QEMU (the conformance guest).
    pub bare: bool,
}

/// Console input written before the guest reads its console.
#[derive(Clone, Debug, Default)]
pub struct EarlyInput {
    /// Written once the console shows this text (each of its lines, when
    /// it has several: markers of several domains); "" = as soon as QEMU
    /// starts, before even the hypervisor runs.
    pub after: String,
    /// QEMU takes them as fast as the UART accepts them.
    pub bytes: Vec<u8>,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            gic: 3,
            pcpus: 1,
            vcpus: 1,
            mem_mb: 1024,
            cpu: DEFAULT_CPU.into(),
            hv_args: String::new(),
            timeout: Duration::from_secs(600),
            cmd: None,
            kernel: None,
            initrd: None,
            append: None,
            icount: false,
            iommu: false,
            extra: Vec::new(),
            echo: true,
            input: None,
            kernel_addr: None,
            initrd_addr: None,
            kernel_load_addr: None,
            early_input: None,
            then_input: None,
            firmware: None,
            hv_boot: Default::default(),
            domus: None,
            domu_pool_mb: 0,
            flavour: Default::default(),
            bare: false,
        }
    }
}

/// What a run produced.
#[derive(Debug)]
pub struct RunResult {
    pub console: String,
    /// The guest command's exit status, when /init reported it.
    pub guest_exit: Option<i32>,
    pub qemu_status: Option<i32>,
    pub timed_out: bool,
    /// The hypervisor's `(HV) fatal: ` line, when it stopped on an error.
    pub hv_fatal: Option<String>,
}

/// How the hypervisor starts the one line it prints before it powers off
/// on an error it cannot continue from (`hv_fatal!`). PSCI SYSTEM_OFF makes
/// QEMU exit 0 whatever the reason, so this line is how a run tells.
pub const HV_FATAL: &str = "(HV) fatal: ";

/// The hypervisor's fatal line in a console transcript, if any.
pub fn fatal_line(console: &str) -> Option<String> {
    console.lines().map(str::trim).find(|l| l.starts_with(HV_FATAL)).map(String::from)
}

/// What `cargo xtask run` exits with: the guest command's status (with a
/// command) or QEMU's (interactive); an error when the hypervisor stopped
/// on a fatal error, the run timed out, or the guest never reported.
pub fn exit_code(o: &RunOptions, r: &RunResult) -> Result<i32> {
    if let Some(line) = &r.hv_fatal {
        bail!("the hypervisor stopped: {line}");
    }
    if o.cmd.is_none() {
        return Ok(r.qemu_status.unwrap_or(1));
    }
    if r.timed_out {
        bail!("timed out");
    }
    r.guest_exit.context("the guest did not report its command's exit status (see the console above)")
}

/// The guest's disk (`--disk`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DiskKind {
    /// QEMU's virtio-blk device (a scratch image) mapped into the guest, Dom0-style
    Passthrough,
    /// The hypervisor's virtio-blk over a RAM image
    Ram,
    /// The hypervisor's virtio-blk in front of QEMU's device
    Backend,
    /// No disk
    None,
    /// QEMU's virtio-blk-pci (a scratch image) behind the PCIe host bridge, passed through with INTx
    VirtioPci,
    /// QEMU's NVMe controller (a scratch image) behind the PCIe host bridge, passed through with INTx
    Nvme,
}

impl DiskKind {
    /// The spelling of `dom0_disk=` (the same as on the command line).
    pub fn as_str(self) -> &'static str {
        match self {
            DiskKind::Passthrough => "passthrough",
            DiskKind::Ram => "ram",
            DiskKind::Backend => "backend",
            DiskKind::None => "none",
            DiskKind::VirtioPci => "virtio-pci",
            DiskKind::Nvme => "nvme",
        }
    }

    /// The QEMU device in front of the scratch image (drive `d0`), if any.
    pub fn qemu_device(self) -> Option<&'static str> {
        match self {
            DiskKind::Passthrough | DiskKind::Backend => Some("virtio-blk-device,drive=d0"),
            DiskKind::VirtioPci => Some("virtio-blk-pci,drive=d0"),
            DiskKind::Nvme => Some("nvme,drive=d0,serial=hvdisk0"),
            DiskKind::Ram | DiskKind::None => None,
        }
    }
}

/// The QEMU argument vector (without the program name).
pub fn command_line(hv_bin: &Path, kernel: &Path, initrd: Option<&PathBuf>, o: &RunOptions) -> Vec<String> {
    let mut guest_args = o.append.clone().unwrap_or_else(|| DEFAULT_GUEST_ARGS.into());
    if let Some(cmd) = &o.cmd {
        guest_args.push_str(&format!(" guestcmd={}", base64(cmd.as_bytes())));
    }
    let hv_args = hypervisor_args(o);
    let kernel_len = std::fs::metadata(kernel).map(|m| m.len()).unwrap_or(64 << 20);
    let base_mb = base_ram_mb(o);
    let domus = domu_layout(kernel, initrd, o, base_mb);
    let kernel_addr = o.kernel_addr.unwrap_or(KERNEL_ADDR);
    let initrd_addr = o.initrd_addr.unwrap_or((kernel_addr + kernel_len + MODULE_GAP) & !(MODULE_GAP - 1));
    let mut a: Vec<String> = vec![
        "-machine".into(),
        format!("virt,virtualization=on,gic-version={}{}", o.gic, if o.iommu { ",iommu=smmuv3" } else { "" }),
        "-cpu".into(),
        o.cpu.clone(),
        "-smp".into(),
        o.pcpus.to_string(),
        "-m".into(),
        format!("{}M", base_mb + domus.as_ref().map_or(0, |d| d.extra_mb) + o.domu_pool_mb),
        "-nographic".into(),
        "-nic".into(),
        "none".into(),
        "-no-reboot".into(),
    ];
    a.extend(crate::run::hvload::qemu_args(hv_bin, o.hv_boot, &hv_args));
    a.extend([
        "-device".into(),
        format!(
            "guest-loader,addr={:#x},kernel={},bootargs={}",
            kernel_addr,
            kernel.display(),
            guest_args.replace(',', ",,")
        ),
    ]);
    if let Some(i) = initrd {
        a.push("-device".into());
        a.push(format!("guest-loader,addr={:#x},initrd={}", initrd_addr, i.display()));
    }
    if let Some(d) = domus {
        a.extend(d.loader_args);
    }
    if o.icount {
        a.push("-icount".into());
        a.push("shift=0,sleep=on".into());
    }
    if o.iommu {
        // Stage-2 only on machine types up to virt-9.1; virt 10.0 makes its
        // SMMU nested (stage 1 and 2) whatever this says. The hypervisor's
        // STEs use stage 2 alone either way.
        a.extend(["-global".into(), "arm-smmuv3.stage=2".into()]);
    }
    a.extend(o.extra.iter().cloned());
    a
}

/// The QEMU argument vector of a run without the hypervisor: `kernel` at
/// EL1 through `-kernel` (x0 = QEMU's DTB), `append` as its command line.
pub fn bare_command_line(kernel: &Path, o: &RunOptions) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "-machine".into(),
        format!("virt,gic-version={}", o.gic),
        "-cpu".into(),
        o.cpu.clone(),
        "-smp".into(),
        o.pcpus.to_string(),
        "-m".into(),
        format!("{}M", o.mem_mb),
        "-nographic".into(),
        "-nic".into(),
        "none".into(),
        "-no-reboot".into(),
        "-kernel".into(),
        kernel.display().to_string(),
    ];
    if let Some(args) = &o.append {
        a.extend(["-append".into(), args.clone()]);
    }
    if o.icount {
        a.extend(["-icount".into(), "shift=0,sleep=on".into()]);
    }
    a.extend(o.extra.iter().cloned());
    a
}

/// The hypervisor's options: `dom0_mem`, `dom0_max_vcpus`,
/// `dom0_kernel_load_addr` (`kernel_load_addr`), then `--hv-args`.
fn hypervisor_args(o: &RunOptions) -> String {
    let mut hv_args = format!("dom0_mem={}M dom0_max_vcpus={}", o.mem_mb, o.vcpus);
    if let Some(a) = o.kernel_load_addr {
        hv_args.push_str(&format!(" dom0_kernel_load_addr={a:#x}"));
    }
    if o.domu_pool_mb > 0 {
        hv_args.push_str(&format!(" domu_pool={}M", o.domu_pool_mb));
    }
    if !o.hv_args.is_empty() {
        hv_args.push(' ');
        hv_args.push_str(&o.hv_args);
    }
    hv_args
}

/// QEMU's RAM in MiB without the DomUs' share: the hypervisor's low
/// reserve, Dom0's RAM and a RAM disk (`dom0_disk=ram`, in host RAM below
/// the guest's).
fn base_ram_mb(o: &RunOptions) -> u64 {
    let hv_args = hypervisor_args(o);
    let disk_mb = if hv_args.split_whitespace().any(|w| w == "dom0_disk=ram") {
        hv_args
            .split_whitespace()
            .find_map(|w| w.strip_prefix("dom0_disk_size="))
            .and_then(|v| {
                v.strip_suffix('M')
                    .and_then(|n| n.parse::<u64>().ok())
                    .or_else(|| v.strip_suffix('G').and_then(|n| n.parse::<u64>().ok()).map(|g| g * 1024))
            })
            .unwrap_or(128)
    } else {
        0
    };
    o.mem_mb + RESERVED_MB + disk_mb
}

/// Where the DomUs of `o` go (`None` without `--domu`), on QEMU virt's RAM
/// of `base_mb` MiB before they are added.
pub fn domu_layout(
    kernel: &Path,
    initrd: Option<&PathBuf>,
    o: &RunOptions,
    base_mb: u64,
) -> Option<crate::run::domu::DomuLayout> {
    let d = o.domus.as_ref().filter(|d| d.count > 0)?;
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(64 << 20);
    let initrd = initrd.map(|i| (i.as_path(), len(i)));
    let kernel = d.kernel.as_deref().unwrap_or(kernel);
    Some(crate::run::domu::layout(d, crate::run::hvload::RAM_BASE, base_mb, (kernel, len(kernel)), initrd))
}

/// Builds everything needed and runs one QEMU session.
pub fn run(o: &RunOptions) -> Result<RunResult> {
    let qemu = crate::toolchain::qemu()?;
    qemu.require_cpu(&o.cpu)?;
    if o.bare {
        let kernel = o.kernel.as_ref().context("a run without the hypervisor needs a kernel")?;
        return run_args(bare_command_line(kernel, o), o);
    }
    let hv = crate::run::hvload::prepare(&crate::build::hypervisor("qemu-virt")?, o.hv_boot)?;
    let (kernel, initrd) = match (&o.kernel, &o.initrd) {
        (Some(k), i) => (k.clone(), i.clone()),
        (None, _) => {
            let g = crate::build::image::guest_flavour(o.flavour)?;
            let initrd = match &o.initrd {
                Some(i) => i.clone(),
                None if o.domu_pool_mb > 0 => g.dom0_initrd_with_domu()?,
                None => g.dom0_initrd()?,
            };
            (g.kernel, Some(initrd))
        }
    };
    let mut args = command_line(&hv, &kernel, initrd.as_ref(), o);
    let domu_nodes = domu_layout(&kernel, initrd.as_ref(), o, base_ram_mb(o)).map(|l| l.nodes);
    // Under firmware the hypervisor's options travel in a DTB made for this
    // run (removed afterwards).
    let mut dtb = None;
    if let Some(crate::firmware::Firmware::TfA) = o.firmware {
        let flash = crate::firmware::tf_a::tf_a(o.gic)?;
        let file = crate::out_dir().join(format!("firmware-{}.dtb", std::process::id()));
        let (a, hv_args) = crate::firmware::tf_a::boot_args(&args, &flash, &file)?;
        crate::firmware::tf_a::write_dtb(&a, &file, &hv_args)?;
        if let Some(nodes) = &domu_nodes {
            crate::run::domu::add_to_file(&file, nodes)?;
        }
        args = a;
        dtb = Some(file);
    } else if let Some(nodes) = &domu_nodes {
        // DomUs: QEMU's own DTB with the dom0less nodes, passed with -dtb.
        if o.firmware.is_some() {
            bail!("--domu needs a device tree: not with --firmware uefi");
        }
        let file = crate::out_dir().join(format!("domu-{}.dtb", std::process::id()));
        crate::run::domu::write_dtb(&args, &file, nodes)?;
        args.extend(["-dtb".into(), file.display().to_string()]);
        dtb = Some(file);
    }
    // UEFI: EDK2 boots the hypervisor from an ESP made for this run.
    let mut esp = None;
    if let Some(crate::firmware::Firmware::Uefi) = o.firmware {
        let edk2 = crate::toolchain::edk2()?;
        let dir = crate::out_dir().join(format!("esp-{}", std::process::id()));
        let guest_args = args
            .iter()
            .find_map(|a| a.strip_prefix("guest-loader,").and_then(|d| d.split_once(",bootargs=")).map(|x| x.1))
            .unwrap_or_default()
            .replace(",,", ",");
        let (a, hv_args) = crate::firmware::uefi::boot_args(&args, &dir, &edk2)?;
        let initrd_name = initrd.as_ref().map(|_| "initrd");
        let cfg = crate::firmware::uefi::config_file(&hv_args, "vmlinuz", &guest_args, initrd_name);
        crate::firmware::uefi::make_esp(&dir, &hv, &kernel, initrd.as_ref(), &cfg)?;
        args = a;
        esp = Some(dir);
    }
    let r = run_args(args, o);
    if let Some(f) = dtb {
        let _ = std::fs::remove_file(f);
    }
    if let Some(d) = esp {
        let _ = std::fs::remove_dir_all(d);
    }
    r
}

/// Runs QEMU with `args`: interactive or captured, as `o` says.
fn run_args(mut args: Vec<String>, o: &RunOptions) -> Result<RunResult> {
    let qemu = crate::toolchain::qemu()?;
    if o.cmd.is_none() && o.echo && o.input.is_none() && o.early_input.is_none() {
        // Interactive: the console is this terminal (Ctrl-A x quits QEMU),
        // and a copy goes to a log so the run can tell a fatal hypervisor
        // error from a clean power-off.
        std::fs::create_dir_all(crate::out_dir()).with_context(|| crate::out_dir().display().to_string())?;
        let log = crate::out_dir().join(format!("console-{}.log", std::process::id()));
        args.extend(interactive_console(&log));
        eprintln!("xtask: {}", qemu.printable(&args));
        let st = qemu.command().args(&args).status().with_context(|| qemu.bin.display().to_string())?;
        let console = std::fs::read(&log).map(|b| String::from_utf8_lossy(&b).replace('\r', "")).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        return Ok(RunResult {
            hv_fatal: fatal_line(&console),
            console,
            guest_exit: None,
            qemu_status: st.code(),
            timed_out: false,
        });
    }
    eprintln!("xtask: {}", qemu.printable(&args));
    let early: Vec<EarlyInput> = o.early_input.iter().chain(&o.then_input).cloned().collect();
    run_captured(&args, o.timeout, o.echo, o.input.as_deref(), &early)
}

/// The console on this terminal with the monitor multiplexed (what
/// `-serial mon:stdio` gives: Ctrl-A x quits, Ctrl-C goes to the guest),
/// also written to `log`.
pub fn interactive_console(log: &std::path::Path) -> Vec<String> {
    vec![
        "-chardev".into(),
        format!("stdio,id=con,mux=on,signal=off,logfile={}", log.display()),
        "-serial".into(),
        "chardev:con".into(),
        "-mon".into(),
        "chardev=con,mode=readline".into(),
    ]
}

/// Runs QEMU with the console captured (and echoed), killing it after
/// `timeout`. Each `early_input` is written to the console in turn, when it
/// says, `input` line by line once the guest's /init is up.
pub fn run_captured(
    args: &[String],
    timeout: Duration,
    echo: bool,
    input: Option<&str>,
    early_input: &[EarlyInput],
) -> Result<RunResult> {
    let piped = input.is_some() || !early_input.is_empty();
    let qemu = crate::toolchain::qemu()?;
    let mut child = qemu
        .command()
        .args(args)
        .stdin(if piped { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| qemu.bin.display().to_string())?;
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let console = Arc::new(Mutex::new(String::new()));
    let c2 = console.clone();
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf).replace('\r', "");
                    if echo {
                        print!("{line}");
                    }
                    c2.lock().unwrap().push_str(&line);
                }
            }
        }
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    // The console input is written by its own thread: QEMU reads stdin only
    // as fast as the guest's UART takes it, so a write may block for long.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = child.stdin.take().map(|w| {
        let (console, done) = (console.clone(), done.clone());
        let (input, early) = (input.map(|s| s.as_bytes().to_vec()), early_input.to_vec());
        std::thread::spawn(move || write_console_input(w, early, input, &console, &done))
    });
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if start.elapsed() > timeout {
            timed_out = true;
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    done.store(true, std::sync::atomic::Ordering::Release);
    if let Some(w) = writer {
        let _ = w.join();
    }
    let _ = reader.join();
    let err = err_reader.join().unwrap_or_default();
    if !err.trim().is_empty() {
        eprintln!("qemu: {}", err.trim());
    }
    let console = console.lock().unwrap().clone();
    let guest_exit = console.lines().rev().find_map(|l| {
        let l = l.trim();
        l.strip_prefix("@@GUEST-EXIT ").and_then(|r| r.strip_suffix("@@")).and_then(|n| n.trim().parse().ok())
    });
    if timed_out {
        eprintln!("xtask: QEMU killed after {} s", timeout.as_secs());
    }
    Ok(RunResult {
        hv_fatal: fatal_line(&console),
        console,
        guest_exit,
        qemu_status: status.and_then(|s| s.code()),
        timed_out,
    })
}

/// Feeds QEMU's stdin: each of `early` when the console shows its marker, then
/// `input` line by line once the guest's /init is up. Returns when done,
/// when QEMU is gone (writes fail) or when `done` is set.
fn write_console_input(
    mut w: std::process::ChildStdin,
    early: Vec<EarlyInput>,
    input: Option<Vec<u8>>,
    console: &Mutex<String>,
    done: &std::sync::atomic::AtomicBool,
) {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    let wait_for = |marker: &str| loop {
        if marker.split('\n').all(|m| console.lock().unwrap().contains(m)) {
            return true;
        }
        if done.load(Ordering::Acquire) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for e in early {
        if !wait_for(&e.after) || w.write_all(&e.bytes).and_then(|_| w.flush()).is_err() {
            return;
        }
    }
    let Some(bytes) = input else { return };
    if !wait_for("guest: init ready") {
        return;
    }
    std::thread::sleep(Duration::from_millis(500));
    // Line by line, so the guest's 64-byte UART FIFO keeps up.
    for line in bytes.split_inclusive(|&b| b == b'\n') {
        if done.load(Ordering::Acquire) || w.write_all(line).and_then(|_| w.flush()).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A sparse 256 MiB scratch image for QEMU's virtio-blk device
/// (`target/xtask/disk.img`).
pub fn scratch_disk() -> std::io::Result<PathBuf> {
    sparse_image(crate::out_dir().join("disk.img"))
}

/// Creates (or keeps) a sparse 256 MiB raw image at `path`.
pub fn sparse_image(path: PathBuf) -> std::io::Result<PathBuf> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path)?;
    f.set_len(256 << 20)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_has_modules_and_options() {
        let o = RunOptions { cmd: Some("true".into()), gic: 4, pcpus: 2, ..Default::default() };
        let a = command_line(Path::new("hv.bin"), Path::new("/nonexistent/Image"), Some(&"initrd".into()), &o);
        let s = a.join(" ");
        assert!(s.contains("virt,virtualization=on,gic-version=4"));
        assert!(s.contains("-smp 2"));
        assert!(s.contains("guest-loader,addr=0x50000000,kernel=/nonexistent/Image"));
        assert!(s.contains("guestcmd=dHJ1ZQ=="));
        assert!(s.contains("initrd=initrd"));
        assert!(s.contains("dom0_mem=1024M dom0_max_vcpus=1"));
        // Module addresses of QEMU's guest-loader documentation.
        let o = RunOptions { kernel_addr: Some(0x4200_0000), initrd_addr: Some(0x4700_0000), ..o };
        let s =
            command_line(Path::new("hv.bin"), Path::new("/nonexistent/Image"), Some(&"initrd".into()), &o).join(" ");
        assert!(s.contains("guest-loader,addr=0x42000000,kernel=/nonexistent/Image"), "{s}");
        assert!(s.contains("guest-loader,addr=0x47000000,initrd=initrd"), "{s}");
        // A raw Dom0 kernel: its load address becomes a hypervisor option.
        let o = RunOptions { kernel_load_addr: Some(0x6000_0000), ..o };
        let s =
            command_line(Path::new("hv.bin"), Path::new("/nonexistent/Image"), Some(&"initrd".into()), &o).join(" ");
        assert!(s.contains("dom0_mem=1024M dom0_max_vcpus=1 dom0_kernel_load_addr=0x60000000"), "{s}");
    }

    fn result(console: &str, guest_exit: Option<i32>) -> RunResult {
        RunResult {
            console: console.into(),
            guest_exit,
            qemu_status: Some(0),
            timed_out: false,
            hv_fatal: fatal_line(console),
        }
    }

    #[test]
    fn a_fatal_hypervisor_line_fails_the_run() {
        let bad = "(HV) INFO  options: dom0_mem=4G\r\n(HV) fatal: boot layout: dom0_mem (4096 MiB) is larger than RAM (1536 MiB)\r\n";
        assert_eq!(
            fatal_line(bad).as_deref(),
            Some("(HV) fatal: boot layout: dom0_mem (4096 MiB) is larger than RAM (1536 MiB)")
        );
        // Interactive: QEMU exits 0 after PSCI SYSTEM_OFF, the run must not.
        let interactive = RunOptions::default();
        let e = format!("{:#}", exit_code(&interactive, &result(bad, None)).unwrap_err());
        assert!(e.contains("dom0_mem (4096 MiB) is larger than RAM"), "{e}");
        assert_eq!(exit_code(&interactive, &result("(HV) INFO  dom0 powered off\n", None)).unwrap(), 0);
        // With a command: a fatal line wins even over a reported status.
        let cmd = RunOptions { cmd: Some("true".into()), ..Default::default() };
        assert!(exit_code(&cmd, &result(bad, None)).is_err());
        assert!(exit_code(&cmd, &result(&format!("@@GUEST-EXIT 0@@\n{bad}"), Some(0))).is_err());
        assert_eq!(exit_code(&cmd, &result("@@GUEST-EXIT 3@@\n", Some(3))).unwrap(), 3);
        assert!(exit_code(&cmd, &result("", None)).is_err());
        // The guest printing the words is not the hypervisor's line.
        assert_eq!(fatal_line("guest: echo (HV) fatal: x\n"), None);
    }

    #[test]
    fn the_interactive_console_is_logged() {
        let a = interactive_console(std::path::Path::new("/tmp/c.log")).join(" ");
        assert_eq!(a, "-chardev stdio,id=con,mux=on,signal=off,logfile=/tmp/c.log -serial chardev:con -mon chardev=con,mode=readline");
    }
}
