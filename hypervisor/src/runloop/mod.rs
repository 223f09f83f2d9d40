//! The run loop's decisions that reach the hardware only through the GIC
//! CPU interface, built for the host as well as for EL2:
//! - `lrs`: what a guest entry writes to the list registers and ICH_HCR_EL2,
//!   and what an exit reads back and folds into the vGIC (the injection)
//! - `grace`: when every pCPU has let go of what it read from the VM table
//!   (quiescent points, idling), so a replaced table or a reaped VM may go
//! - `pcpu`: each pCPU's state other pCPUs may set, and the SGI that makes
//!   it look (`kick`, `request_resched`, `request_rearm`)
//! - `wake`: what a wake does: the scheduler's answer, the pCPU to
//!   interrupt, the vCPUs a vGIC change must reach
//!
//! On the host `crate::arch` is `hv-arch-aarch64` with its `fakes`: the
//! tests here run this code and read back the `ICH_LR<n>_EL2`, ICH_HCR_EL2
//! and ICC_SGI1R_EL1 writes it made. `runtime::vcpu` and `runtime::wake`
//! call it with a VM's parts.

pub mod grace;
pub mod lrs;
pub mod pcpu;
pub mod wake;

#[cfg(test)]
mod tests;
