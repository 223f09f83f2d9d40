//! Boot-time decisions that need no EL2: finding the device tree among the
//! boot registers ([`handoff`]), reading the guest kernel module (an
//! arm64 Image, an ELF file ([`elf`]) or a raw binary at a load address:
//! [`image`]), planning where everything the hypervisor
//! writes goes in RAM ([`plan`]) and how many pCPUs it runs on with how
//! much heap ([`pcpus`]). The EL2 code (`runtime::boot`,
//! `runtime::vm`) only applies the plan.

pub mod elf;
pub mod handoff;
pub mod image;
pub mod pcpus;
pub mod plan;

#[cfg(test)]
mod tests;
