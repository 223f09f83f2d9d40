//! The hypervisor's pure core: the models and decisions that need no EL2
//! access and no knowledge of how the machine was described, as plain Rust
//! that builds and is tested on the host. The `hypervisor` crate re-exports
//! every module under the same name (`hypervisor::vgic` is `hv_core::vgic`).
//!
//! - `ids`: the identifiers every layer shares (`DomainId`); `region`:
//!   `Region`, the physical address range every layer shares; `intid`: the
//!   GIC's interrupt IDs as a checked type (`IntId`)
//! - `time`: counter-tick/ns arithmetic that saturates, timer slop;
//!   `ptimer`: the emulated EL1 physical timer (CNTP_*_EL0)
//! - `regs`: register layouts `aarch64-cpu` lacks; `traps`: the EL2 trap
//!   configuration over them; `idregs`: the guest's ID registers; `vdebug`:
//!   its debug registers (breakpoints switched lazily, the rest emulated);
//!   `vpmu`: its virtual PMU, switched lazily
//! - `esr`: trap decoding; `psci`: PSCI/SMCCC decoding; `mitigations`:
//!   Spectre-v2/v4/BHB decisions and the SMCCC workaround answers; `stage2`:
//!   stage-2 table building
//! - `limits`: the pCPU count bound and the EL2 stack size every layer
//!   sizes its tables by; `gicr`: the redistributor frames a GICR region
//!   holds and which serves which CPU
//! - `its`: the ITS register layouts, command format and GICv4 planning
//!   (physical driver and vITS)
//! - `irq`: the physical IRQ route table (INTID → what the hypervisor does)
//! - `smmu`: the SMMUv3's register fields, stream table entries, commands,
//!   queues and event records, and the fault policy (the EL2 driver's
//!   decisions)
//! - `mmio_bus`: a VM's emulated MMIO ranges (guest-physical range → device)
//! - `control`: Dom0's control device (`hvctl`): its requests decoded, its
//!   one-client claim, long responses in pages
//! - `vgic`: the virtual GICv3 register model, list registers and the vITS
//! - `virtio`: the hypervisor's virtio-blk device and its backends
//! - `vpci`: a PCIe function assigned to a guest: its configuration space
//!   as the guest sees it, and the probe, BARs and reset of the physical one
//! - `vpl011`: the emulated PL011
//! - `quota`: per-VM heap quotas (what a guest's actions may allocate)
//! - `sched`: the Credit2-compatible scheduler and its simulator
//! - `stats`: per-vCPU counters and histograms in a stable text format
//! - `sync`: the hypervisor's locks (`spin`'s, waiting with the EL2
//!   layer's YIELD once it is registered)
//! - `trace`: the scheduling flight recorder (per-pCPU event rings, dump format)
//! - `testrng` (tests, or the `testrng` feature): a deterministic generator
//!   for randomized host tests
//!
//! `unsafe` is denied here but for two modules, each block with its
//! `// SAFETY:`: `virtio` (guest RAM read at VA == PA by
//! `IdentityMappedRam`, and the physical virtio-blk backend's driver
//! queue) and `sync::ticket` (the runqueue lock's `lock_api::RawMutex`, an
//! unsafe trait). Instructions (the locks' YIELD included) belong to the EL2 layer.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
extern crate alloc;
// The host stress bench's per-thread operation count (never at EL2).
#[cfg(feature = "sched-opcount")]
extern crate std;

pub mod control;
pub mod esr;
pub mod gicr;
pub mod idregs;
pub mod ids;
pub mod intid;
pub mod irq;
pub mod its;
pub mod limits;
pub mod mitigations;
pub mod mmio_bus;
pub mod psci;
pub mod ptimer;
pub mod quota;
pub mod region;
pub mod regs;
pub mod sched;
pub mod smmu;
pub mod stage2;
pub mod stats;
pub mod sync;
#[cfg(any(test, feature = "testrng"))]
pub mod testrng;
pub mod time;
pub mod trace;
pub mod traps;
pub mod vdebug;
pub mod vgic;
#[allow(unsafe_code)]
pub mod virtio;
pub mod vpci;
pub mod vpl011;
pub mod vpmu;
