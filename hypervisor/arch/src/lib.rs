//! The hypervisor's AArch64 EL2 layer: the only crate with inline assembly
//! and system-register or GIC access. It sits on `hv_core` (register
//! layouts, the trap configuration, the ITS command planning it executes)
//! and knows nothing of VMs: the `hypervisor` crate above drives it.
//!
//! Each item has one owner file:
//! - `entry`: arm64 Image header, primary/secondary entry, stacks
//! - `exception`: EL2 vector table, guest entry/exit (trap frame)
//! - `mmu`: EL2 stage-1 identity map
//! - `sysreg`: typed accessors for the system registers `aarch64-cpu` lacks
//!   (layouts in `crate::regs`), barriers and hints (the locks' YIELD), ID
//!   registers by encoding
//! - `el2`: this pCPU's EL2 controls for guests (trap configuration from
//!   `crate::traps`, stage 2, exit syndrome, virtual SError)
//! - `cache`: data cache maintenance by address
//! - `frame`: zeroed heap blocks handed to devices that walk them (ITS,
//!   SMMU)
//! - `gic`: the physical GIC (distributor, redistributors, CPU interface)
//!   and the ICH (virtual interface) registers; nothing else touches them
//! - `context`: EL1 system registers and FP/SIMD state of a vCPU
//! - `pmu`: a vCPU's PMU registers moved on and off the PMU, the PMU traps
//! - `smc`: calls to firmware (PSCI)
//! - `smmu`: the physical SMMUv3s (stream tables, command and event
//!   queues, faults); nothing else touches them
//! - `pl011`: the physical console UART
//! - `fake` (feature `fakes`): the register file behind `sysreg` and the
//!   GIC CPU interface on the host
//!
//! Built for the bare-metal target everything is here. A host build with
//! the `fakes` feature (as google/arm-gic's) has `sysreg`'s accessors and
//! the GIC CPU interface (`gic::cpuif`: list registers, ICH_HCR_EL2, SGIs,
//! acknowledge/EOI/deactivate) with the same API over [`fake`]'s per-thread
//! register file, so the run loop's decisions above (which LRs it writes,
//! which pCPU it kicks) are host-tested through the code EL2 runs; a host
//! build without it is empty.
#![cfg_attr(not(feature = "fakes"), no_std)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
extern crate alloc;

#[cfg(target_os = "none")]
use hv_core::{gicr, its, limits, mitigations, psci, quota, region, stage2, sync, traps, vdebug, vpmu};
#[cfg(any(target_os = "none", feature = "fakes"))]
use hv_core::{intid, regs, vgic};

#[cfg(target_os = "none")]
pub mod cache;
#[cfg(target_os = "none")]
pub mod context;
#[cfg(target_os = "none")]
pub mod el2;
#[cfg(target_os = "none")]
pub mod entry;
#[cfg(target_os = "none")]
pub mod exception;
#[cfg(feature = "fakes")]
pub mod fake;
#[cfg(target_os = "none")]
pub mod frame;
#[cfg(any(target_os = "none", feature = "fakes"))]
pub mod gic;
#[cfg(target_os = "none")]
pub mod mmu;
#[cfg(target_os = "none")]
pub mod pl011;
#[cfg(target_os = "none")]
pub mod pmu;
#[cfg(target_os = "none")]
pub mod smc;
#[cfg(target_os = "none")]
pub mod smmu;
#[cfg(any(target_os = "none", feature = "fakes"))]
pub mod sysreg;
