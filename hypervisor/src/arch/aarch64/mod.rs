//! AArch64 EL2 specifics: the only place with inline assembly and
//! system-register access. Each item has one owner file:
//! - `entry`: arm64 Image header, primary/secondary entry, stacks
//! - `exception`: EL2 vector table, guest entry/exit (trap frame)
//! - `mmu`: EL2 stage-1 identity map
//! - `sysreg`: typed accessors for the system registers `aarch64-cpu` lacks
//!   (layouts in `crate::regs`), barriers, ID registers by encoding
//! - `el2`: this pCPU's EL2 controls for guests (trap configuration from
//!   `crate::traps`, stage 2, exit syndrome, virtual SError)
//! - `cache`: data cache maintenance by address
//! - `gic`: the physical GIC (distributor, redistributors, CPU interface)
//!   and the ICH (virtual interface) registers; nothing else touches them
//! - `context`: EL1 system registers and FP/SIMD state of a vCPU
//! - `pmu`: a vCPU's PMU registers moved on and off the PMU, the PMU traps
//! - `smc`: calls to firmware (PSCI)
//! - `pl011`: the physical console UART

pub mod cache;
pub mod context;
pub mod el2;
pub mod entry;
pub mod exception;
pub mod gic;
pub mod mmu;
pub mod pl011;
pub mod pmu;
pub mod smc;
pub mod sysreg;
