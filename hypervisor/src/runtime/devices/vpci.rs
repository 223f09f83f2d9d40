//! PCIe configuration space, trapped:
//! * a DomU's virtual host bridge ([`Device::Vpci`]): one bus whose device
//!   N is its Nth assigned function, each answered by `vpci`'s model over
//!   the physical function's ECAM page (`runtime::pci::EcamFunction`);
//!   every other slot is empty;
//! * in Dom0's view of the host bridge, the ECAM page of each function
//!   assigned to a DomU ([`Device::PciHidden`]): an empty slot.

use super::claim;
use crate::domain::vmplan::{AssignedPci, VmPlan};
use crate::esr::{self, MmioAccess};
use crate::mmio_bus::{BusError, Device};
use crate::runtime::pci::EcamFunction;
use crate::runtime::vm::{inc, Bus, MmioFault, Vcpu, Vm};
use crate::sync::Mutex;
use crate::vpci::{AssignedFunction, CfgWrite, GuestBar};
use alloc::vec::Vec;
use log::warn;

/// The guest's view of `functions` (a DomU's), `None` without any.
pub fn virtual_ecam(functions: &[AssignedPci]) -> Option<Mutex<Vec<AssignedFunction>>> {
    if functions.is_empty() {
        return None;
    }
    let v = functions
        .iter()
        .map(|f| {
            // SAFETY: the function's ECAM page, checked by
            // `runtime::pci::prepare`; only this VM's model drives it.
            let mut phys = unsafe { EcamFunction::new(f.config) };
            let bars = f.bars.iter().map(|b| GuestBar { phys: b.bar, guest: b.ipa }).collect();
            AssignedFunction::new(&mut phys, bars)
        })
        .collect();
    Some(Mutex::new(v))
}

/// Claims the DomU's ECAM and Dom0's hidden pages.
pub fn register(bus: &mut Bus, vp: &VmPlan) -> Result<(), BusError> {
    claim(bus, vp, Device::Vpci, vpci_mmio)?;
    claim(bus, vp, Device::PciHidden, hidden_mmio)
}

/// All-ones of an access's size: what an empty slot reads.
fn all_ones(size: u8) -> u64 {
    match size {
        8 => u64::MAX,
        s => (1u64 << (u32::from(s) * 8)) - 1,
    }
}

/// A trapped access to the DomU's ECAM at offset `off`.
fn vpci_mmio(vm: &Vm, _me: usize, v: &mut Vcpu, a: &MmioAccess, off: u64, value: u64) -> Result<(), MmioFault> {
    let (bus, dev, func, reg) = (off >> 20, (off >> 15) & 31, (off >> 12) & 7, (off & 0xfff) as u16);
    let functions = vm.vpci.as_ref().ok_or(MmioFault::NoDevice)?;
    let slot = (bus == 0 && func == 0).then_some(dev as usize);
    let size = a.size;
    let mut fs = functions.lock();
    let target = slot.and_then(|s| Some((fs.get_mut(s)?, vm.pci_functions.get(s)?.config)));
    let Some((f, config)) = target.filter(|_| size <= 4) else {
        // An empty slot, another bus or function, or a 64-bit access (a
        // configuration access is at most a dword): nothing answers.
        if size > 4 {
            inc(&vm.pci_counters.cfg_bad);
        }
        if !a.write {
            v.regs.set_reg(a.reg, esr::load_value(a, all_ones(size)));
        }
        return Ok(());
    };
    // SAFETY: the function's ECAM page, checked by `runtime::pci::prepare`.
    let mut phys = unsafe { EcamFunction::new(config) };
    if a.write {
        match f.write(&mut phys, reg, size, value as u32) {
            CfgWrite::Applied => {}
            CfgWrite::Ignored => inc(&vm.pci_counters.cfg_ignored),
            CfgWrite::Bad => inc(&vm.pci_counters.cfg_bad),
            CfgWrite::BarMoved { index, to } => {
                inc(&vm.pci_counters.bar_moves);
                warn!(
                    "d{}: BAR{index} of {} moved to {to:#x}: not followed (it stays at its address)",
                    vm.domid, vm.pci_functions[dev as usize].bdf
                );
            }
        }
    } else {
        let r = f.read(&mut phys, reg, size);
        v.regs.set_reg(a.reg, esr::load_value(a, u64::from(r)));
    }
    Ok(())
}

/// Dom0 touched the ECAM page of a function it does not own: an empty slot.
fn hidden_mmio(vm: &Vm, _me: usize, v: &mut Vcpu, a: &MmioAccess, _off: u64, _value: u64) -> Result<(), MmioFault> {
    inc(&vm.pci_counters.hidden);
    if !a.write {
        v.regs.set_reg(a.reg, esr::load_value(a, all_ones(a.size)));
    }
    Ok(())
}
