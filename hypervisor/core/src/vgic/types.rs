//! The vGIC's public vocabulary: list-register and interrupt-count limits
//! ([`NUM_LRS_MAX`], [`usable_lrs`], [`active_priority_regs`],
//! [`MAX_SPIS`], [`NR_PRIVATE`]), the configuration a VM's vGIC is built
//! from ([`VgicConfig`]), its errors ([`VgicError`]) and which frame an
//! address falls in ([`MmioTarget`]).

use crate::intid::IntId;
use alloc::vec::Vec;

/// The most list registers any GICv3 implementation has (ICH_VTR_EL2.ListRegs + 1 ≤ 16).
pub const NUM_LRS_MAX: usize = 16;
/// The fewest list registers the flush protocol works with: on overflow it
/// sets ICH_HCR_EL2.UIE, whose maintenance interrupt fires while at most one
/// LR is valid, so with a single LR it would fire on every entry before the
/// guest could run (and deactivate what fills the LR).
pub const NUM_LRS_MIN: usize = 2;

/// How many list registers to use on a CPU that implements `implemented`
/// (ICH_VTR_EL2.ListRegs + 1), or an error when it has too few.
pub fn usable_lrs(implemented: usize) -> Result<usize, VgicError> {
    if implemented < NUM_LRS_MIN {
        return Err(VgicError::TooFewListRegisters(implemented));
    }
    Ok(implemented.min(NUM_LRS_MAX))
}
/// How many `ICH_AP0R<n>_EL2` (and as many `ICH_AP1R<n>_EL2`) registers hold
/// a vCPU's active priorities on a CPU whose ICH_VTR_EL2 is `vtr`: one
/// 32-bit register per 32 preemption levels, so 1 for 5 preemption bits
/// (PREbits + 1), 2 for 6 and 4 for 7 (the architecture's maximum). Every
/// one of them is the vCPU's state and must be switched with it: a guest
/// using more than 32 preemption levels has active priorities in `AP<n>R1`-3
/// too.
pub fn active_priority_regs(vtr: u64) -> usize {
    let pre_bits = ((vtr >> 26) & 0x7) + 1;
    1 << pre_bits.saturating_sub(5).min(2)
}

/// Largest number of SPIs (INTIDs 32..=1019).
pub const MAX_SPIS: u32 = 988;
/// Number of private interrupts (SGIs 0..15, PPIs 16..31) per vCPU.
pub const NR_PRIVATE: u32 = 32;

/// Static description of a VM's interrupt controller.
#[derive(Clone, Debug)]
pub struct VgicConfig {
    /// Guest-physical base of the distributor (64 KiB).
    pub gicd_base: u64,
    /// Guest-physical base of the first redistributor (128 KiB per vCPU).
    pub gicr_base: u64,
    /// Number of SPIs; rounded up to a multiple of 32, at most [`MAX_SPIS`].
    pub nr_spis: u32,
    /// The MPIDR_EL1 value each vCPU sees (VMPIDR_EL2), indexed by vCPU number.
    pub vcpu_mpidrs: Vec<u64>,
    /// Whether the guest sees LPIs (GICD_TYPER.LPIS, GICR_TYPER.PLPIS,
    /// EnableLPIs, PROPBASER/PENDBASER): INTIDs [`LPI_BASE`](super::LPI_BASE) up to
    /// 2^[`LPI_ID_BITS`](super::LPI_ID_BITS) - 1, injected by a virtual ITS. `false` presents a
    /// GICv3 without LPIs.
    pub lpis: bool,
}

/// Errors the caller turns into guest aborts or reports as bugs.
#[derive(thiserror::Error, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VgicError {
    /// The access size or alignment does not fit the register (inject an abort).
    #[error("bad GIC access size or alignment")]
    BadAccessSize,
    /// The INTID does not exist in this vGIC or is not valid for the call.
    #[error("bad interrupt: {0}")]
    BadIntid(IntId),
    /// No such vCPU.
    #[error("bad vCPU {0}")]
    BadVcpu(usize),
    /// The address is not inside a GIC frame of this VM, or a configuration
    /// value is out of range.
    #[error("out of range")]
    OutOfRange,
    /// The CPU interface has fewer list registers than [`NUM_LRS_MIN`].
    #[error("the GIC CPU interface has {0} list register(s); at least {NUM_LRS_MIN} are needed")]
    TooFewListRegisters(usize),
    /// The vGIC has no LPIs, or this vCPU's GICR_CTLR.EnableLPIs is 0.
    #[error("LPIs are not enabled on vCPU {0}")]
    LpisDisabled(usize),
    /// A guest table (the LPI configuration table) is not readable guest RAM.
    #[error("LPI table at {gpa:#x} ({len} bytes) is not guest RAM")]
    TableOutsideRam { gpa: u64, len: u64 },
}

/// Which emulated frame an address falls in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmioTarget {
    Distributor,
    /// The redistributor of this vCPU (offset is within its 128 KiB).
    Redistributor(usize),
}
