//! What firmware tells the hypervisor about the machine.
//!
//! Two sources describe the same machine: a device tree (QEMU `-kernel`,
//! TF-A; today still in [`crate::dtb`]) and ACPI ([`acpi`]: UEFI firmware,
//! EDK2 on QEMU, AWS Graviton). Both end in the same
//! [`crate::dtb::Machine`] value, so the rest of the hypervisor does not
//! care which firmware booted it.

pub mod acpi;
pub mod dom0_efi;
pub mod uefi;
