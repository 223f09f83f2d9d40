//! The boot-layout plan in real boots: Linux boots wherever QEMU's
//! guest-loader puts the modules, and a bad layout stops the hypervisor
//! with one `(HV) fatal:` line and fails the run (QEMU itself exits 0 on
//! PSCI SYSTEM_OFF).

use integration_tests::*;
use std::time::Duration;

/// Where QEMU loads the hypervisor (platforms/qemu-virt/platform.ld).
const LOAD_ADDRESS: u64 = 0x4020_0000;
/// QEMU virt's DTB with `-m` ≥ 256 MiB: RAM base + 128 MiB, 1 MiB long.
const QEMU_DTB: u64 = 0x4800_0000;

/// The hypervisor binary's arm64 header `image_size` (BSS included).
fn hypervisor_image_size() -> u64 {
    let bin = xtask::build::hypervisor("qemu-virt").expect("building the hypervisor");
    let data = std::fs::read(bin).expect("reading the hypervisor image");
    assert_eq!(&data[0x38..0x3c], b"ARM\x64");
    u64::from_le_bytes(data[16..24].try_into().unwrap())
}

fn file_len(p: &std::path::Path) -> u64 {
    std::fs::metadata(p).expect("module file").len()
}

/// The initrd a run without `--initrd` boots Dom0 with: the guest image's
/// initramfs with hvctl appended.
fn dom0_initrd_len(g: &xtask::build::image::GuestImage) -> u64 {
    file_len(&g.dom0_initrd().expect("Dom0's initrd with hvctl"))
}

/// Linux never started.
fn assert_no_guest(r: &RunResult) {
    assert!(!r.console.contains("Booting Linux"), "the guest ran:\n{}", tail(&r.console, 30));
    assert_eq!(r.guest_exit, None);
}

/// A run that must stop on one fatal line, with `cargo xtask run`'s status
/// non-zero.
fn assert_fatal(o: &RunOptions, r: &RunResult, line: &str) {
    assert_eq!(r.hv_fatal.as_deref(), Some(line), "console tail:\n{}", tail(&r.console, 30));
    assert_eq!(r.console.matches("(HV) fatal:").count(), 1, "{}", tail(&r.console, 30));
    assert_no_guest(r);
    assert!(!r.timed_out);
    // QEMU exits cleanly (PSCI SYSTEM_OFF), the run fails.
    assert_eq!(r.qemu_status, Some(0));
    let e = format!("{:#}", xtask::run::qemu::exit_code(o, r).unwrap_err());
    assert!(e.contains(line), "{e}");
}

fn opts(kernel_addr: u64, initrd_addr: u64) -> RunOptions {
    RunOptions {
        cmd: Some(r#"dmesg | grep -E "started at EL"; uname -m"#.into()),
        echo: false,
        timeout: Duration::from_secs(300),
        kernel_addr: Some(kernel_addr),
        initrd_addr: Some(initrd_addr),
        ..Default::default()
    }
}

#[test]
fn linux_boots_with_modules_at_qemus_documented_addresses() {
    // QEMU's guest-loader documentation (and Xen's QEMU recipe): kernel at
    // 0x42000000, initrd at 0x47000000, close behind the hypervisor. The
    // initrd must end below QEMU's DTB: the small one does.
    let initrd = small_initrd();
    assert!(0x4700_0000 + file_len(&initrd) <= QEMU_DTB);
    // The heap is the hypervisor's 48 MiB and Dom0's quota: 1 MiB here (no
    // disk of the hypervisor's), so it fits the 52 MiB between the kernel
    // and the initrd, rounded up to 2 MiB.
    let o = RunOptions { initrd: Some(initrd), hv_args: "dom0_heap_quota=1M".into(), ..opts(0x4200_0000, 0x4700_0000) };
    let r = run(&o);
    assert_console(&r, "CPU: All CPU(s) started at EL1");
    assert_console(&r, "aarch64");
    assert_eq!(r.guest_exit, Some(0));
    assert_eq!(r.hv_fatal, None);
    // The heap went into the gap after the kernel, not onto it.
    assert_console(&r, "layout: heap 0x43c00000-0x46e00000");
}

#[test]
fn linux_boots_with_modules_right_after_the_image() {
    let g = xtask::build::image::guest().expect("guest image");
    let kernel = LOAD_ADDRESS + hypervisor_image_size();
    let initrd = (kernel + file_len(&g.kernel)).div_ceil(4096) * 4096;
    assert!(initrd + dom0_initrd_len(&g) <= QEMU_DTB, "the image grew: the initrd would reach QEMU's DTB");
    let r = run(&opts(kernel, initrd));
    assert_console(&r, "CPU: All CPU(s) started at EL1");
    assert_eq!(r.guest_exit, Some(0));
    assert_eq!(r.hv_fatal, None);
}

#[test]
fn an_initrd_under_qemus_dtb_stops_the_boot_with_one_line() {
    // The full 83 MiB initramfs at 0x47000000: QEMU writes its DTB into
    // the middle of it (QEMU checks its ROM regions against each other, not
    // against the DTB), so the initrd is corrupt.
    let g = xtask::build::image::guest().expect("guest image");
    let o = opts(0x4200_0000, 0x4700_0000);
    let r = run(&o);
    let end = 0x4700_0000 + dom0_initrd_len(&g);
    assert_fatal(
        &o,
        &r,
        &format!(
            "(HV) fatal: boot layout: initrd [0x47000000, {end:#x}) overlaps device tree [0x48000000, 0x48100000)"
        ),
    );
}

#[test]
fn a_kernel_in_the_hypervisor_bss_stops_the_boot_with_one_line() {
    // QEMU knows only the hypervisor's file, not its BSS: a module there
    // loads without complaint and is wiped when the BSS is zeroed.
    let hv = xtask::build::hypervisor("qemu-virt").expect("building the hypervisor");
    let size = hypervisor_image_size();
    let kernel = (LOAD_ADDRESS + file_len(&hv)).div_ceil(1 << 16) * (1 << 16);
    assert!(kernel < LOAD_ADDRESS + size);
    let o = opts(kernel, 0x5800_0000);
    let r = run(&o);
    let g = xtask::build::image::guest().expect("guest image");
    let line = format!(
        "(HV) fatal: boot layout: kernel [{kernel:#x}, {:#x}) overlaps hypervisor image [{LOAD_ADDRESS:#x}, {:#x})",
        kernel + file_len(&g.kernel),
        LOAD_ADDRESS + size
    );
    assert_fatal(&o, &r, &line);
}

#[test]
fn a_module_outside_ram_stops_the_boot_with_one_line() {
    // -m 1536M: RAM ends at 0xa0000000.
    let g = xtask::build::image::guest().expect("guest image");
    let o = opts(0x5000_0000, 0x1_0000_0000);
    let r = run(&o);
    let end = 0x1_0000_0000 + dom0_initrd_len(&g);
    assert_fatal(&o, &r, &format!("(HV) fatal: boot layout: initrd [0x100000000, {end:#x}) is not inside RAM"));
}

#[test]
fn dom0_mem_larger_than_ram_fails_cargo_xtask_run() {
    // Through the real command: its exit status is what users and CI see.
    let _q = qemu_lock();
    let out = std::process::Command::new(env!("CARGO"))
        .current_dir(xtask::root())
        .args(["xtask", "run", "--cmd", "true", "--hv-args", "dom0_mem=4G", "--timeout", "300"])
        .output()
        .expect("running cargo xtask run");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let line = "(HV) fatal: boot layout: dom0_mem (4096 MiB) is larger than RAM (1536 MiB)";
    assert!(!out.status.success(), "cargo xtask run succeeded:\n{}", tail(&text, 30));
    assert!(text.contains(line), "{}", tail(&text, 30));
    assert!(text.contains(&format!("xtask: error: the hypervisor stopped: {line}")), "{}", tail(&text, 30));
    assert!(!text.contains("Booting Linux"), "{}", tail(&text, 30));
}

/// The console's banner line, `(HV) INFO  hypervisor ... (image A-B, dtb D, convention)`.
fn banner(r: &RunResult) -> &str {
    let line = r.console.lines().find(|l| l.contains("(HV) INFO  hypervisor "));
    line.unwrap_or_else(|| panic!("no hypervisor banner:\n{}", tail(&r.console, 30))).trim_end()
}

fn moved(addr: u64, entry: xtask::run::hvload::HvEntry) -> RunResult {
    let o = RunOptions {
        cmd: Some(r#"dmesg | grep -E "started at EL"; uname -m"#.into()),
        echo: false,
        timeout: Duration::from_secs(300),
        hv_boot: xtask::run::hvload::HvBoot { addr: Some(addr), entry },
        ..Default::default()
    };
    let r = run(&o);
    assert_eq!(r.hv_fatal, None, "{}", tail(&r.console, 30));
    assert_eq!(xtask::run::qemu::exit_code(&o, &r).map_err(|e| format!("{e:#}")), Ok(0), "{}", tail(&r.console, 30));
    assert_console(&r, "CPU: All CPU(s) started at EL1");
    assert_console(&r, "aarch64");
    r
}

#[test]
fn the_hypervisor_runs_loaded_at_another_address() {
    // `-kernel` with the Image header's text_offset = 160 MiB: QEMU loads
    // it at 0x4a000000 and passes the DTB in x0 (it puts the DTB right
    // behind the image). The image relocates itself (entry.rs), and the
    // layout plan works around where it really is.
    let r = moved(0x4a00_0000, xtask::run::hvload::HvEntry::Linux);
    let b = banner(&r);
    assert!(b.contains("(image 0x4a000000-0x4a"), "{b}");
    assert!(b.ends_with(", x0 = dtb)"), "{b}");
}

#[test]
fn the_hypervisor_accepts_tf_as_bl33_hand_off_at_a_third_address() {
    // TF-A's default BL33 hand-off (x0 = MPIDR & 0xffff, x1 = DTB), with
    // the image where QEMU's DTB would be for -kernel: generic loaders put
    // it at 0x48000000 and a stub enters it; QEMU leaves the DTB at RAM base.
    let r = moved(0x4800_0000, xtask::run::hvload::HvEntry::TfaMpidr);
    let b = banner(&r);
    assert!(b.contains("(image 0x48000000-0x48"), "{b}");
    assert!(b.ends_with("dtb 0x40000000, x0 = mpidr, x1 = dtb)"), "{b}");
}
