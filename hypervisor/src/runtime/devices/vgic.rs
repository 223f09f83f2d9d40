//! The vGIC's distributor and redistributor frames at EL2: the model
//! (`crate::vgic::Vgic`) answers the access; what it asks of the hardware
//! (physical deactivations, SPI trigger modes, LPI configuration loads) and
//! the vCPUs it kicks are done here, after its lock is released.

use super::claim;
use crate::arch::gic;
use crate::domain::vmplan::VmPlan;
use crate::esr::{self, MmioAccess};
use crate::mmio_bus::{BusError, Device};
use crate::runtime::percpu;
use crate::runtime::vm::{Bus, MmioFault, Vcpu, Vm};
use crate::runtime::wake::process_kicks;
use crate::sched::WakeCause;
use core::sync::atomic::Ordering;

/// Claims the distributor and the redistributor frames.
pub fn register(bus: &mut Bus, vp: &VmPlan) -> Result<(), BusError> {
    claim(bus, vp, Device::Vgic, mmio)
}

/// A trapped access to either frame; the model decodes it from the
/// absolute address. Reads are answered here, in a small frame; writes, with what they ask
/// of the hardware and the wakes, out of line.
fn mmio(vm: &Vm, me: usize, v: &mut Vcpu, a: &MmioAccess, _off: u64, value: u64) -> Result<(), MmioFault> {
    if a.write {
        mmio_write(vm, me, v, a, value)
    } else {
        // A read changes no delivery state: the vCPUs' idle notes stay.
        let r = vm.vgic.read().mmio_read(v.id, a.ipa, a.size)?;
        v.regs.set_reg(a.reg, esr::load_value(a, r));
        Ok(())
    }
}

/// A write: the model's answer, then the deactivations, trigger changes,
/// wakes and LPI enables it asks for, with the vGIC's lock released.
#[inline(never)]
fn mmio_write(vm: &Vm, me: usize, v: &mut Vcpu, a: &MmioAccess, value: u64) -> Result<(), MmioFault> {
    let mut vgic = vm.vgic.lock();
    let kicks = vgic.mmio_write(v.id, a.ipa, a.size, value)?;
    let hw = vgic.take_hw_deactivations();
    let triggers = vgic.take_hw_triggers();
    let lpis_on = vgic.take_lpi_enable_events();
    drop(vgic);
    deactivate_hw(vm, me, v.id, &hw);
    for (pintid, edge) in triggers {
        gic::set_spi_trigger(pintid, edge);
    }
    process_kicks(vm, me, kicks, WakeCause::Interrupt);
    super::vits::lpis_enabled(vm, me, lpis_on);
    Ok(())
}

/// Deactivates the physical side of forwarded interrupts whose virtual state
/// the guest ended by ICPENDR/ICACTIVER (`Vgic::take_hw_deactivations`);
/// `cur` is the vCPU running on this pCPU. An SPI is deactivated in the
/// distributor. A private interrupt (the virtual timer) is active on the
/// pCPU that runs its vCPU: here, or that pCPU re-derives it at its next
/// exit; a vCPU that is not running gets it derived when it is loaded.
pub fn deactivate_hw(vm: &Vm, me: usize, cur: usize, list: &[crate::vgic::HwDeactivation]) {
    for d in list {
        if d.intid.is_spi() {
            gic::clear_spi_active(d.pintid);
        } else if d.vcpu == cur {
            gic::set_private_active(me, d.pintid, false);
        } else if let Some(s) = vm.shared.get(d.vcpu) {
            s.ppi_resync.fetch_or(1 << u32::from(d.intid), Ordering::AcqRel);
            let p = s.running_on.load(Ordering::Acquire);
            if p != usize::MAX && p != me {
                percpu::kick(p);
            }
        }
    }
}
