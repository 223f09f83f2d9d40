//! The machine a command is for (`--platform`): a plain value below the
//! command line ([`crate::cli`]) that the modules doing the work
//! ([`crate::bench`], `main.rs`) take; and the platforms beside QEMU virt:
//!
//! - [`fvp`]: the FVP Base RevC command line and DTB (`run --platform fvp`)
//! - [`shrinkwrap`]: the Shrinkwrap overlay fvp/hypervisor.yaml and its check
//! - [`graviton`]: `--platform graviton`: the UEFI + ACPI boot on a Neoverse
//!   core with NVMe, on QEMU

pub mod fvp;
pub mod graviton;
pub mod shrinkwrap;

use clap::ValueEnum;

/// The machine the hypervisor is built for (`--platform`): a directory under
/// `platforms/`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum PlatformKind {
    /// QEMU virt (runs here)
    #[default]
    #[value(name = "qemu-virt", alias = "qemu")]
    QemuVirt,
    /// Arm FVP Base RevC (FVP_Base_RevC-2xAEMvA, with TF-A)
    #[value(name = "fvp-base-revc", alias = "fvp")]
    FvpBaseRevc,
    /// AWS Graviton's boot path on QEMU: EDK2 + ACPI, Neoverse V1 (--cpu neoverse-n1 for Graviton2), GICv3 + ITS, NVMe (runs here)
    #[value(name = "graviton")]
    Graviton,
}

impl PlatformKind {
    /// The platform descriptor under `platforms/` the EL2 image is built
    /// with (`HV_PLATFORM`). Graviton on QEMU runs the qemu-virt image (see
    /// [`crate::platform::graviton`]).
    pub fn dir(self) -> &'static str {
        match self {
            PlatformKind::QemuVirt | PlatformKind::Graviton => "qemu-virt",
            PlatformKind::FvpBaseRevc => "fvp-base-revc",
        }
    }
}
