//! Shared helpers for the integration tests: boot the real guest under the
//! hypervisor in QEMU (through the same code as `cargo xtask run`) and look
//! at what Linux and the hypervisor printed.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
pub use xtask::run::qemu::{EarlyInput, RunOptions, RunResult};

/// QEMU runs one at a time: this host has two cores.
static QEMU: Mutex<()> = Mutex::new(());

/// Boots the guest and runs `cmd` in it.
pub fn run_cmd(cmd: &str, tweak: impl FnOnce(&mut RunOptions)) -> RunResult {
    let mut o =
        RunOptions { cmd: Some(cmd.into()), echo: false, timeout: Duration::from_secs(420), ..Default::default() };
    tweak(&mut o);
    run(&o)
}

pub fn run(o: &RunOptions) -> RunResult {
    let _g = QEMU.lock().unwrap_or_else(|e| e.into_inner());
    let r = xtask::run::qemu::run(o).expect("running QEMU");
    if r.timed_out {
        panic!("QEMU timed out; console:\n{}", tail(&r.console, 80));
    }
    r
}

/// The last `n` lines, for failure messages.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A counter from the statistics the hypervisor prints at power-off
/// (`vcpuN.key=value` lines, see `hypervisor::stats`).
pub fn stat(console: &str, vcpu: usize, key: &str) -> Option<u64> {
    let prefix = format!("vcpu{vcpu}.{key}=");
    console.lines().rev().find_map(|l| l.trim().strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
}

/// Asserts `needle` appears in the console, showing its tail otherwise.
#[track_caller]
pub fn assert_console(r: &RunResult, needle: &str) {
    assert!(r.console.contains(needle), "expected {needle:?} in the console; tail:\n{}", tail(&r.console, 60));
}

/// A `name=value` statistics line printed by the hypervisor (e.g. `blk0.writes`).
pub fn stat_line(console: &str, name: &str) -> Option<u64> {
    let prefix = format!("{name}=");
    console.lines().rev().find_map(|l| l.trim().strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
}

/// One `/proc/interrupts` line: the IRQ number, the per-CPU counts, and
/// the rest ("ITS-MSI 16385 Edge nvme0q1": chip, hwirq, trigger, name).
#[derive(Debug)]
pub struct IrqLine {
    pub irq: u32,
    pub counts: Vec<u64>,
    pub desc: Vec<String>,
}

impl IrqLine {
    /// The interrupt chip (`ITS-MSI`, `GICv3`).
    pub fn chip(&self) -> &str {
        &self.desc[0]
    }

    /// The counts of every CPU, summed.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// The `/proc/interrupts` lines the guest printed after `tag` (e.g. with
/// `grep nvme /proc/interrupts | sed 's/^/IRQ /'`) that contain `name`
/// (`""`: every tagged line), with `cpus` count columns
/// (`tag 15: 12 0 ITS-MSI 16384 Edge nvme0q0`). Panics on a line of
/// another shape.
pub fn proc_interrupts(console: &str, tag: &str, name: &str, cpus: usize) -> Vec<IrqLine> {
    console
        .lines()
        .filter_map(|l| l.strip_prefix(tag))
        .filter(|l| l.contains(name))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(f.len() > cpus + 2, "short /proc/interrupts line: {l}");
            IrqLine {
                irq: f[0].trim_end_matches(':').parse().unwrap_or_else(|_| panic!("{l}")),
                counts: f[1..=cpus].iter().map(|c| c.parse().unwrap_or_else(|_| panic!("{l}"))).collect(),
                desc: f[cpus + 1..].iter().map(|s| s.to_string()).collect(),
            }
        })
        .collect()
}

/// The interrupts counted in `lines`, every CPU's, summed.
pub fn irq_total(lines: &[IrqLine]) -> u64 {
    lines.iter().map(IrqLine::total).sum()
}

/// Dom0 booted with ACPI (the UEFI path): `ls /sys/firmware/acpi/tables`
/// (in columns, ending with the `data` and `dynamic` directories) lists
/// every one of `tables`, every CPU started at EL1, and the command line
/// has the hypervisor's `efi=noruntime acpi=force`.
#[track_caller]
pub fn assert_dom0_acpi_at_el1(r: &RunResult, tables: &[&str]) {
    let ls: Vec<&str> = r
        .console
        .lines()
        .filter(|l| matches!(l.split_whitespace().last(), Some("data" | "dynamic")))
        .flat_map(|l| l.split_whitespace())
        .collect();
    for t in tables {
        assert!(ls.contains(t), "{t} not in /sys/firmware/acpi/tables: {ls:?}");
    }
    assert_console(r, "CPU: All CPU(s) started at EL1");
    assert_console(r, "efi=noruntime acpi=force");
}

/// Attaches QEMU's virtio-blk device with the scratch image (the disk that
/// is passed through, or that the hypervisor drives in backend mode).
pub fn with_qemu_disk(o: &mut RunOptions) {
    let img = xtask::run::qemu::scratch_disk().expect("scratch disk image");
    o.extra = vec![
        "-drive".into(),
        format!("if=none,file={},format=raw,id=d0", img.display()),
        "-device".into(),
        "virtio-blk-device,drive=d0".into(),
    ];
}

/// Holds the one-QEMU-at-a-time lock (for tests that start QEMU through
/// `cargo xtask run` rather than [`run`]).
pub fn qemu_lock() -> std::sync::MutexGuard<'static, ()> {
    QEMU.lock().unwrap_or_else(|e| e.into_inner())
}

/// The guest image's initramfs without the shared libraries and the large
/// programs (fio, cyclictest): /init, busybox and the kernel modules, a few
/// MiB. For layouts with little room for the initrd (QEMU's documented
/// 0x47000000 leaves 16 MiB below QEMU's DTB at 0x48000000).
pub fn small_initrd() -> std::path::PathBuf {
    let full = xtask::build::image::guest().expect("guest image").initrd;
    xtask::build::image::small_initrd(&full).expect("the small initramfs")
}

/// The shell functions that drive a virtio-mmio virtio-blk device by hand
/// with busybox devmem (tests/guest/virtq.sh).
pub const VIRTQ_SH: &str = include_str!("guest/virtq.sh");

/// Guest RAM Linux uses when [`with_virtq`] is applied: the rest of the
/// guest's RAM (`mem_mb` above it) is free for hand-made virtqueues.
pub const VIRTQ_LINUX_MB: u64 = 768;

/// Makes [`VIRTQ_SH`] available in the guest as `/tests/virtq.sh` (in an
/// initramfs built from the guest image's plus this file) and boots Linux
/// with `mem=` [`VIRTQ_LINUX_MB`], so the RAM above is free for the rings
/// and buffers and /dev/mem may map it (CONFIG_STRICT_DEVMEM only refuses
/// System RAM).
pub fn with_virtq(o: &mut RunOptions) {
    static INITRD: OnceLock<PathBuf> = OnceLock::new();
    let initrd = INITRD.get_or_init(|| {
        initrd_with(&[("tests/virtq.sh", VIRTQ_SH.as_bytes())]).expect("initramfs with the test scripts")
    });
    assert!(o.mem_mb > VIRTQ_LINUX_MB + 64, "with_virtq needs guest RAM above mem=");
    o.initrd = Some(initrd.clone());
    o.append = Some(format!("{} mem={}M", xtask::run::qemu::DEFAULT_GUEST_ARGS, VIRTQ_LINUX_MB));
}

/// The guest image's initramfs followed by a second cpio archive holding
/// `files` (path inside the guest, contents), which Linux unpacks over the
/// first; written to target/xtask/initramfs-tests.cpio.
fn initrd_with(files: &[(&str, &[u8])]) -> std::io::Result<PathBuf> {
    let base = xtask::build::image::guest().map_err(std::io::Error::other)?.initrd;
    let mut data = std::fs::read(base)?;
    // The next archive must start 4-byte aligned; zeros between archives
    // are skipped.
    data.resize(data.len().next_multiple_of(512), 0);
    let mut dirs: Vec<&str> = Vec::new();
    for (path, _) in files {
        let mut d = *path;
        while let Some((parent, _)) = d.rsplit_once('/') {
            if !dirs.contains(&parent) {
                dirs.push(parent);
            }
            d = parent;
        }
    }
    dirs.sort();
    for (i, d) in dirs.iter().enumerate() {
        cpio_entry(&mut data, 0x7000_0000 + i as u32, d, 0o040755, &[]);
    }
    for (i, (path, body)) in files.iter().enumerate() {
        cpio_entry(&mut data, 0x7100_0000 + i as u32, path, 0o100755, body);
    }
    cpio_entry(&mut data, 0, "TRAILER!!!", 0, &[]);
    data.resize(data.len().next_multiple_of(512), 0);
    let out = xtask::out_dir().join("initramfs-tests.cpio");
    std::fs::create_dir_all(xtask::out_dir())?;
    std::fs::write(&out, data)?;
    Ok(out)
}

/// One "newc" cpio entry.
fn cpio_entry(out: &mut Vec<u8>, ino: u32, name: &str, mode: u32, body: &[u8]) {
    let fields = [ino, mode, 0, 0, 1, 0, body.len() as u32, 0, 0, 0, 0, name.len() as u32 + 1, 0];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08x}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    out.resize(out.len().next_multiple_of(4), 0);
    out.extend_from_slice(body);
    out.resize(out.len().next_multiple_of(4), 0);
}

/// The guest image's initramfs with `perf.cpio` appended (Linux unpacks
/// both archives): the initramfs for guests that run `perf`, written to
/// target/xtask/initramfs-perf.cpio.
pub fn perf_initrd() -> PathBuf {
    static INITRD: OnceLock<PathBuf> = OnceLock::new();
    INITRD
        .get_or_init(|| {
            let g = xtask::build::image::guest().expect("guest image");
            let mut data = std::fs::read(&g.initrd).expect("reading the initramfs");
            // build.sh pads each archive to 512 bytes, so the second starts
            // aligned as the kernel's unpacker needs.
            assert_eq!(data.len() % 4, 0);
            data.extend(std::fs::read(&g.perf).expect("reading perf.cpio"));
            let out = xtask::out_dir().join("initramfs-perf.cpio");
            std::fs::create_dir_all(xtask::out_dir()).expect("creating target/xtask");
            std::fs::write(&out, data).expect("writing the initramfs with perf");
            out
        })
        .clone()
}

/// One event's result in `perf stat`'s default output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerfCount {
    Counted(u64),
    /// `<not supported>`: the kernel has no such event (no PMU, or the PMU
    /// lacks it).
    NotSupported,
    /// `<not counted>`: the event exists but never got onto a counter.
    NotCounted,
}

/// The result `perf stat` printed for `event` (e.g. `cycles`) in `console`:
/// the line `   <count>      <event>   [# comment]` of its table, where the
/// count is an integer (perf's thousands separators removed),
/// `<not supported>` or `<not counted>`. `None` when no such line is there
/// (perf did not get to print its table). Kernel messages may be
/// interleaved; other lines are skipped. With several tables, the last one
/// counts.
pub fn perf_stat_count(console: &str, event: &str) -> Option<PerfCount> {
    console.lines().rev().find_map(|line| {
        // Only the table part: perf's `#` comment (ratios) may hold anything.
        let line = line.split('#').next().unwrap_or("").trim();
        let (value, name) = if let Some(rest) = line.strip_prefix("<not supported>") {
            (Some(PerfCount::NotSupported), rest)
        } else if let Some(rest) = line.strip_prefix("<not counted>") {
            (Some(PerfCount::NotCounted), rest)
        } else {
            let (n, rest) = line.split_once(char::is_whitespace)?;
            (n.replace(',', "").parse().ok().map(PerfCount::Counted), rest)
        };
        // The event's name is the next word; perf may add a PMU prefix
        // (`armv8_pmuv3_0/cycles/`) or modifiers (`cycles:u`).
        let name = name.split_whitespace().next()?;
        let bare = name.trim_end_matches('/').rsplit('/').next()?.split(':').next()?;
        if bare == event {
            value
        } else {
            None
        }
    })
}

/// fio's error counts from its job lines (`v: (groupid=0, jobs=1): err= 0:
/// pid=…`) among the console lines that start with `prefix` (`""` for
/// Dom0, `"(dN) "` for a DomU).
pub fn fio_errs(console: &str, prefix: &str) -> Vec<u64> {
    console
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter(|l| l.starts_with("v: (groupid="))
        .filter_map(|l| l.split_once("err=")?.1.split(':').next()?.trim().parse().ok())
        .collect()
}

/// A guest's shell command that takes the NVMe controller at `bdf` from
/// its driver, points both admin queues at `target` (a bus address) and
/// rings the doorbell: the controller reads its first command from there
/// (and writes a completion there, if it gets that far). Ends with
/// `attack-done`.
pub fn nvme_admin_queue_attack(bdf: &str, target: u64) -> String {
    format!(
        "D=/sys/bus/pci/devices/{bdf}; B=$(cut -d' ' -f1 $D/resource | head -1); \
         echo {bdf} > /sys/bus/pci/drivers/nvme/unbind; \
         printf '\\006\\000' | dd of=$D/config bs=1 seek=4 count=2 conv=notrunc 2>/dev/null; \
         devmem $((B+0x14)) 32 0; sleep 1; \
         devmem $((B+0x24)) 32 0x000f000f; \
         devmem $((B+0x28)) 64 {target:#x}; devmem $((B+0x30)) 64 {target:#x}; \
         devmem $((B+0x14)) 32 0x00460001; sleep 1; \
         devmem $((B+0x1000)) 32 1; sleep 2; \
         echo csts=$(devmem $((B+0x1c)) 32); echo attack-done"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real consoles of `perf stat -e cycles,instructions dd if=/dev/zero
    // of=/dev/null count=100000` in the guest image on bare QEMU 10.0
    // (-cpu max), from `guest: init ready` to the exit line.
    /// Without -icount: QEMU's PMU counts cycles, and instructions only
    /// with precise icount. A kernel message sits before the table.
    const BARE: &str = include_str!("testdata/perf-stat-bare-qemu.txt");
    /// With -icount shift=0: both counted.
    const BARE_ICOUNT: &str = include_str!("testdata/perf-stat-bare-qemu-icount.txt");
    /// With -cpu max,pmu=off: the kernel has no PMU.
    const BARE_NO_PMU: &str = include_str!("testdata/perf-stat-bare-qemu-pmu-off.txt");

    #[test]
    fn perf_stat_counts_of_real_bare_qemu_runs() {
        assert_eq!(perf_stat_count(BARE, "cycles"), Some(PerfCount::Counted(3_280_457_626)));
        assert_eq!(perf_stat_count(BARE, "instructions"), Some(PerfCount::NotSupported));
        assert_eq!(perf_stat_count(BARE_ICOUNT, "cycles"), Some(PerfCount::Counted(204_920_482)));
        assert_eq!(perf_stat_count(BARE_ICOUNT, "instructions"), Some(PerfCount::Counted(204_920_482)));
        assert_eq!(perf_stat_count(BARE_NO_PMU, "cycles"), Some(PerfCount::NotSupported));
        assert_eq!(perf_stat_count(BARE_NO_PMU, "instructions"), Some(PerfCount::NotSupported));
    }

    #[test]
    fn perf_stat_count_takes_only_the_events_table_line() {
        // Not an event line, though it has a number and the word: dd's
        // output, the header, kernel messages.
        for console in ["100000+0 records in", "[    9.614755] perf: interrupt took too long (3717 > 2500)"] {
            assert_eq!(perf_stat_count(console, "records"), None);
            assert_eq!(perf_stat_count(console, "perf:"), None);
        }
        assert_eq!(perf_stat_count(BARE, "branches"), None);
        assert_eq!(perf_stat_count("", "cycles"), None);
        // perf stopped before its table (e.g. an error message).
        assert_eq!(perf_stat_count("Error:\nThe sys_perf_event_open() syscall returned with 2", "cycles"), None);
        // Other forms perf prints.
        assert_eq!(perf_stat_count("  1,234,567      cycles:u", "cycles"), Some(PerfCount::Counted(1_234_567)));
        assert_eq!(
            perf_stat_count("  42      armv8_pmuv3_0/instructions/   # 0.5 insn per cycle", "instructions"),
            Some(PerfCount::Counted(42))
        );
        assert_eq!(perf_stat_count("   <not counted>      cycles", "cycles"), Some(PerfCount::NotCounted));
        // Another event's line.
        assert_eq!(perf_stat_count("  42      instructions", "cycles"), None);
    }
}
