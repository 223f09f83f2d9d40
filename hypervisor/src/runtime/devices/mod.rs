//! The emulated devices' EL2 glue, each registering its own MMIO handlers
//! on the VM's bus (`Vm::bus`), as Bao's `vm_emul_add_mem` does:
//! - `vgic`: the vGIC's distributor and redistributor frames
//! - `vits`: the guest's virtual ITS backed by host LPIs of the physical ITS
//! - `disk`: the virtio-blk frame (`runtime::vblk::VDisk`) and its interrupt
//! - `uart`: the vPL011 wired to the console and the vGIC
//! - `vpci`: a DomU's virtual PCIe host bridge over its assigned functions,
//!   and the functions' ECAM pages hidden from Dom0
//! - `control`: Dom0's control device, which `hvctl` drives
//!
//! The devices' state is the VM's (`Vm::vgic`, `Vm::vits`, `Vm::disk`,
//! `Vm::uart`) and the handler type is `runtime::vm::Handler`, so `vm`
//! never depends on this module: the glue sits above the VM, the state
//! below it.
//!
//! The plan (`domain::vmplan::VmPlan::bus`) says which ranges each device
//! owns and refuses overlaps before anything is applied; [`attach`] lets
//! every device claim its planned ranges with its handler, so a trapped
//! access is one bus lookup and one call (`runtime::vcpu::mmio`). A new
//! emulated device is its module here and one line in [`attach`].

pub mod control;
pub mod disk;
pub mod uart;
pub mod vgic;
pub mod vits;
pub mod vpci;

use super::vm::{Bus, Handler, MmioFn};
use crate::domain::vmplan::VmPlan;
use crate::mmio_bus::{BusError, Device};

/// Registers `call` for every range the plan gives `device`.
fn claim(bus: &mut Bus, vp: &VmPlan, device: Device, call: MmioFn) -> Result<(), BusError> {
    for &(r, _) in vp.bus.iter().filter(|(_, d)| *d == device) {
        bus.register(r, Handler { device, call })?;
    }
    Ok(())
}

/// The VM's bus: every device registers its handlers. Err: two devices
/// claim one address, or the plan lists a range no device claimed.
pub fn attach(vp: &VmPlan) -> Result<Bus, BusError> {
    let mut bus = Bus::new();
    vgic::register(&mut bus, vp)?;
    disk::register(&mut bus, vp)?;
    uart::register(&mut bus, vp)?;
    vits::register(&mut bus, vp)?;
    vpci::register(&mut bus, vp)?;
    control::register(&mut bus, vp)?;
    for &(range, device) in &vp.bus {
        if bus.lookup(range.base).map(|(h, _)| h.device) != Some(device) {
            return Err(BusError::Unclaimed { range, device });
        }
    }
    Ok(bus)
}
