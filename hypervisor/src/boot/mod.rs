//! Boot-time decisions that need no EL2: reading the guest kernel's arm64
//! Image header ([`image`]) and planning where everything the hypervisor
//! writes goes in RAM ([`plan`]). The EL2 code (`runtime::boot`,
//! `runtime::vm`) only applies the plan.

pub mod image;
pub mod plan;

#[cfg(test)]
mod tests;
