//! The physical GICv3/v4 as the hypervisor uses it: the only code that
//! touches the distributor, the redistributors and the CPU interface.
//!
//! Distributor and redistributors are set up with the `arm-gic` crate, each
//! pCPU's redistributor at the frame `crate::gicr` found for its MPIDR in
//! whichever GICR region holds it (not at an index into one region); the
//! CPU interface runs with ICC_CTLR_EL1.EOImode = 1 so that a write to
//! ICC_EOIR1_EL1 only drops priority and a forwarded interrupt stays active
//! until the guest deactivates it through a HW=1 list register. The virtual
//! CPU interface (ICH_*_EL2) is reached through `cpuif`'s accessors; what to
//! put in the list registers is decided by the portable `vgic` model.
//!
//! The ITS and host LPIs are in `its`; `ack` counts the LPIs it takes
//! and `deactivate` leaves them alone (LPIs have no active state: the
//! priority drop of `eoi` ends them).
//!
//! Distributor accesses go through the `GIC` lock. A pCPU's own
//! redistributor SGI frame (the active state of its private interrupts)
//! is written without it: those registers are write-1-to-set/clear and only
//! that pCPU writes them.
//!
//! - `cpuif`: the CPU interface (acknowledge, EOI, SGIs) and the virtual
//!   CPU interface's list registers; the only part a host build has
//! - `dist`: the distributor and redistributors
//! - `its`: the physical ITS, host LPIs and GICv4 vPEs

pub mod cpuif;
#[cfg(target_os = "none")]
mod dist;
#[cfg(target_os = "none")]
pub mod its;

pub use cpuif::*;
#[cfg(target_os = "none")]
pub use dist::*;

/// Per-CPU setup, on each pCPU as it comes up: its redistributor and CPU
/// interface, then its LPI tables on the physical ITS.
#[cfg(target_os = "none")]
pub fn init_cpu(cpu: usize) {
    dist::setup_cpu(cpu);
    its::init_cpu(cpu);
}
