//! AArch64 EL2 specifics: the only place with inline assembly and
//! system-register access. Each item has one owner file:
//! - `entry`: arm64 Image header, primary/secondary entry, stacks
//! - `exception`: EL2 vector table, guest entry/exit (trap frame)
//! - `mmu`: EL2 stage-1 identity map
//! - `sysreg`: `mrs`/`msr` helpers for registers the crates do not type
//! - `gic`: physical GICv3 CPU interface and ICH (virtual interface) access
//! - `context`: EL1 system registers and FP/SIMD state of a vCPU
//! - `smc`: calls to firmware (PSCI)
//! - `pl011`: the physical console UART

pub mod context;
pub mod entry;
pub mod exception;
pub mod gic;
pub mod mmu;
pub mod pl011;
pub mod smc;
pub mod sysreg;
