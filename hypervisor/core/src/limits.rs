//! The machine-wide bounds every layer sizes its tables by: how many pCPUs
//! the hypervisor brings up and each one's EL2 stack. The boot plan sizes
//! the heap from them (`boot::pcpus` in hv-machine), the physical GIC and
//! ITS drivers their per-pCPU tables, the entry code its stacks.

/// The most pCPUs the hypervisor brings up; CPUs a machine description
/// lists beyond it stay off (and are reported).
pub const MAX_PCPUS: usize = 512;

// At least as many pCPUs as the vGIC allows vCPUs.
const _: () = assert!(MAX_PCPUS >= crate::vgic::MAX_VCPUS);

/// Each pCPU's hypervisor stack (pCPU 0's is in the image, the others' in
/// the heap).
pub const STACK_SIZE: usize = 64 * 1024;
