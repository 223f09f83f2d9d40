//! Boot-time decisions that need no EL2: finding the device tree among the
//! boot registers ([`handoff`]), reading the guest kernel's arm64
//! Image header ([`image`]) and planning where everything the hypervisor
//! writes goes in RAM ([`plan`]). The EL2 code (`runtime::boot`,
//! `runtime::vm`) only applies the plan.

pub mod handoff;
pub mod image;
pub mod plan;

#[cfg(test)]
mod tests;
