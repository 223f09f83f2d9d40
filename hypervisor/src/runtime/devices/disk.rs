//! The virtio-blk frame at EL2 (`Vm::disk`, a `runtime::vblk::VDisk`):
//! trapped accesses go to the device model, and its interrupt line is
//! mirrored into the vGIC, from here and from the disk's completions
//! (`runtime::vcpu`'s timer and physical-disk interrupt).

use super::claim;
use crate::domain::vmplan::VmPlan;
use crate::esr::{self, MmioAccess};
use crate::mmio_bus::{BusError, Device};
use crate::runtime::percpu::now_ns;
use crate::runtime::vblk::VDisk;
use crate::runtime::vm::{Bus, MmioFault, Vcpu, Vm};
use crate::runtime::wake::set_line;
use crate::sched::WakeCause;

/// Claims the virtio-mmio frame.
pub fn register(bus: &mut Bus, vp: &VmPlan) -> Result<(), BusError> {
    claim(bus, vp, Device::VirtioBlk, mmio)
}

/// A trapped access to the virtio-mmio frame.
fn mmio(vm: &Vm, me: usize, v: &mut Vcpu, a: &MmioAccess, _off: u64, value: u64) -> Result<(), MmioFault> {
    let disk = vm.disk.as_ref().ok_or(MmioFault::NoDevice)?;
    let level = if a.write {
        disk.write(a.ipa, a.size, value, now_ns(), me)?
    } else {
        let r = disk.read(a.ipa, a.size)?;
        v.regs.set_reg(a.reg, esr::load_value(a, r));
        None
    };
    if let Some(l) = level {
        disk_irq(vm, me, disk, l);
    }
    Ok(())
}

/// Mirrors the disk's interrupt line into the vGIC (and wakes its target).
pub fn disk_irq(vm: &Vm, me: usize, disk: &VDisk, level: bool) {
    set_line(vm, me, disk.intid, 0, level, WakeCause::Interrupt);
}
