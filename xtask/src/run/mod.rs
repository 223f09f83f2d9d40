//! Running the hypervisor and its guests on QEMU:
//!
//! - [`qemu`]: composes the QEMU command line and runs it with a timeout
//! - [`hvload`]: where QEMU loads the hypervisor and which register
//!   convention enters it (`--hv-addr`, `--hv-entry`)
//! - [`domu`]: `--domu N`: the DomUs' dom0less DTB nodes, their modules and RAM

pub mod domu;
pub mod hvload;
pub mod qemu;
