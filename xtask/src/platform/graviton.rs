//! `--platform graviton`: AWS Graviton's boot path, on QEMU. What makes a
//! QEMU `virt` run "Graviton" here (`platforms/graviton/README.md` says what
//! the real machines are and what only emulation checks):
//!
//! - UEFI firmware and ACPI: Debian's EDK2 (`qemu-efi-aarch64`) as `-bios`
//!   on `virt,acpi=on,virtualization=on`, the hypervisor an EFI application
//!   on an ESP ([`crate::firmware::uefi`], `--firmware uefi` implied);
//! - a Neoverse core: [`CPU`], QEMU's Neoverse V1 (Graviton3's core; Linux
//!   reads `CPU part 0xd40`), with `--cpu neoverse-n1` for Graviton2's
//!   (`0xd0c`); QEMU 10.0 has both, QEMU 7.2 only the N1 (a `--qemu` 7.2
//!   is told so), and no model of the V2 (Graviton4);
//! - GICv3 with an ITS (QEMU's `gic-version=3`, the default `--gic`);
//! - NVMe storage ([`DEFAULT_DISK`]): EBS volumes and instance storage are
//!   NVMe on Graviton.
//!
//! The EL2 image is the qemu-virt one (`cargo xtask build --platform
//! graviton` builds it): the machine under QEMU is `virt`, the image is
//! position-independent and EDK2 loads it wherever it likes.

use crate::firmware::Firmware;
use crate::run::qemu::{DiskKind, RunOptions};

/// QEMU's CPU model for the platform: Neoverse V1 (Graviton3).
pub const CPU: &str = "neoverse-v1";

/// The disk when `--disk` is not given: QEMU's NVMe controller on the PCIe
/// bus, as EBS volumes appear on Graviton.
pub const DEFAULT_DISK: DiskKind = DiskKind::Nvme;

/// pCPUs and Dom0 vCPUs when `--pcpus`/`--vcpus` are not given: every
/// Graviton is SMP, so its runs are too.
pub const DEFAULT_CPUS: u32 = 2;

/// The platform's firmware: EDK2 with ACPI.
pub const FIRMWARE: Firmware = Firmware::Uefi;

/// Makes QEMU-virt options the platform's: UEFI firmware and, unless
/// `keep_cpu` (the user named a model), the Neoverse CPU model. The disk is
/// the caller's (the command line's `--disk`, the bench case's).
pub fn apply(o: &mut RunOptions, keep_cpu: bool) {
    o.firmware = Some(FIRMWARE);
    if !keep_cpu {
        o.cpu = CPU.into();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graviton_is_uefi_on_a_neoverse_core() {
        let mut o = RunOptions::default();
        apply(&mut o, false);
        assert_eq!(o.firmware, Some(Firmware::Uefi));
        assert_eq!(o.cpu, "neoverse-v1");
        let mut o = RunOptions { cpu: "cortex-a72".into(), ..Default::default() };
        apply(&mut o, true);
        assert_eq!((o.firmware, o.cpu.as_str()), (Some(Firmware::Uefi), "cortex-a72"));
        assert_eq!(DEFAULT_DISK.qemu_device(), Some("nvme,drive=d0,serial=hvdisk0"));
    }
}
