//! `cargo xtask run --firmware uefi`: QEMU virt with ACPI and Debian's EDK2
//! (`qemu-efi-aarch64`, the project's copy: [`crate::toolchain::EDK2`]) as `-bios`, the hypervisor started by EDK2 as an
//! EFI application from an EFI system partition (ESP). This is the boot
//! path of AWS Graviton (UEFI + ACPI), on QEMU.
//!
//! The ESP is a host directory QEMU shows as a FAT disk (`fat:rw:`, vvfat)
//! on a virtio-blk PCI device with `bootindex=0`. It holds the hypervisor
//! as `EFI/BOOT/BOOTAA64.EFI` (the removable-media path, so EDK2 boots it
//! without a boot entry) and, next to it, [`CONFIG_FILE`] in Xen's
//! `xen.cfg` format with the hypervisor's options and Dom0's kernel, command
//! line and initrd (copied next to it). The hypervisor does not read the
//! file yet (see README).

use crate::Result;
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};

/// The configuration file's name (hypervisor/machine/src/firmware/uefi.rs
/// `CONFIG_FILE`).
pub const CONFIG_FILE: &str = "hypervisor.cfg";

/// The configuration file: one `[global]` section naming the `[dom0]`
/// section (Xen's layout).
pub fn config_file(hv_args: &str, kernel: &str, guest_args: &str, initrd: Option<&str>) -> String {
    let mut s = format!(
        "# Written by cargo xtask run --firmware uefi.\n[global]\ndefault=dom0\n\n[dom0]\noptions={hv_args}\n\
         kernel={kernel} {guest_args}\n"
    );
    if let Some(i) = initrd {
        s.push_str(&format!("ramdisk={i}\n"));
    }
    s
}

/// Turns the direct-boot QEMU arguments of [`crate::run::qemu::command_line`]
/// into the UEFI boot: `acpi=on`, no `-kernel`/`-append` (the text of
/// `-append`, the hypervisor's options, is returned), no guest-loader
/// devices (the kernel and initrd go on the ESP), EDK2's image `edk2` as
/// `-bios` and the ESP directory `esp` as the boot disk.
pub fn boot_args(args: &[String], esp: &Path, edk2: &Path) -> Result<(Vec<String>, String)> {
    let mut out = Vec::new();
    let (mut hv_args, mut kernel) = (String::new(), false);
    let mut it = args.iter();
    while let Some(x) = it.next() {
        match (x.as_str(), it.clone().next()) {
            ("-machine", Some(m)) if m.starts_with("virt,") => {
                it.next();
                out.push(x.clone());
                out.push(format!("virt,acpi=on,{}", &m["virt,".len()..]));
            }
            ("-kernel", Some(_)) => {
                it.next();
                kernel = true;
            }
            ("-append", Some(a)) => {
                it.next();
                hv_args = a.clone();
            }
            ("-device", Some(d)) if d.starts_with("guest-loader,") => {
                it.next();
            }
            _ => out.push(x.clone()),
        }
    }
    if !kernel {
        bail!("no -kernel (the hypervisor) in the QEMU arguments");
    }
    out.extend([
        "-bios".into(),
        edk2.display().to_string(),
        "-drive".into(),
        format!("if=none,id=esp,format=raw,file=fat:rw:{}", esp.display()),
        "-device".into(),
        "virtio-blk-pci,drive=esp,bootindex=0".into(),
    ]);
    Ok((out, hv_args))
}

/// Fills the ESP directory `esp` (made empty first): the hypervisor as
/// `EFI/BOOT/BOOTAA64.EFI`, the configuration file, the kernel and initrd
/// (hard links when possible: they are large).
pub fn make_esp(esp: &Path, hv: &Path, kernel: &Path, initrd: Option<&PathBuf>, cfg: &str) -> Result<()> {
    let boot = esp.join("EFI").join("BOOT");
    let _ = std::fs::remove_dir_all(esp);
    std::fs::create_dir_all(&boot).with_context(|| boot.display().to_string())?;
    let put = |from: &Path, name: &str| -> Result<()> {
        let to = boot.join(name);
        std::fs::hard_link(from, &to)
            .or_else(|_| std::fs::copy(from, &to).map(|_| ()))
            .with_context(|| format!("{} -> {}", from.display(), to.display()))
    };
    // A copy, not a link: QEMU's vvfat may write the ESP back.
    std::fs::copy(hv, boot.join("BOOTAA64.EFI")).with_context(|| hv.display().to_string())?;
    put(kernel, "vmlinuz")?;
    if let Some(i) = initrd {
        put(i, "initrd")?;
    }
    std::fs::write(boot.join(CONFIG_FILE), cfg).with_context(|| boot.join(CONFIG_FILE).display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_boot_arguments_become_the_uefi_boot() {
        let args: Vec<String> = [
            "-machine",
            "virt,virtualization=on,gic-version=3",
            "-kernel",
            "/x/hv.bin",
            "-append",
            "dom0_mem=512M",
            "-device",
            "guest-loader,addr=0x48000000,kernel=/k,bootargs=console=hvc0",
            "-nic",
            "none",
        ]
        .map(String::from)
        .to_vec();
        let (a, hv) = boot_args(&args, Path::new("/tmp/esp"), Path::new("/c/QEMU_EFI.fd")).unwrap();
        assert_eq!(hv, "dom0_mem=512M");
        assert_eq!(
            a,
            [
                "-machine",
                "virt,acpi=on,virtualization=on,gic-version=3",
                "-nic",
                "none",
                "-bios",
                "/c/QEMU_EFI.fd",
                "-drive",
                "if=none,id=esp,format=raw,file=fat:rw:/tmp/esp",
                "-device",
                "virtio-blk-pci,drive=esp,bootindex=0"
            ]
        );
        assert!(boot_args(&args[..2], Path::new("/e"), Path::new("/c/QEMU_EFI.fd")).is_err());
    }

    #[test]
    fn config_file_is_xen_style() {
        let c = config_file("dom0_mem=512M", "vmlinuz", "console=hvc0", Some("initrd"));
        assert!(c.contains("[global]\ndefault=dom0\n"), "{c}");
        assert!(c.contains("[dom0]\noptions=dom0_mem=512M\nkernel=vmlinuz console=hvc0\nramdisk=initrd\n"), "{c}");
        assert!(!config_file("", "k", "", None).contains("ramdisk"));
    }
}
