//! The firmware `cargo xtask run --firmware` boots the hypervisor through
//! ([`Firmware`]), one module each:
//!
//! - [`tf_a`]: `--firmware tf-a`: TF-A from Debian's source package, cached;
//!   the DTB with the hypervisor's options
//! - [`uefi`]: `--firmware uefi`: EDK2 as -bios, the ESP with the hypervisor
//!   as BOOTAA64.EFI

pub mod tf_a;
pub mod uefi;

/// The firmware `cargo xtask run --firmware` boots the hypervisor through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Firmware {
    /// TF-A (BL1, BL2, BL31 at EL3) from Debian's source package, the hypervisor as BL33 at EL2
    TfA,
    /// EDK2 (qemu-efi-aarch64) with ACPI, the hypervisor an EFI application on an ESP; Dom0 boots with ACPI
    Uefi,
}
