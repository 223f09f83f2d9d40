//! The vPL011 at EL2: the model (`crate::vpl011::VPl011`) wired to the
//! console (a guest's bytes go out as its `d<N>:` lines, its input comes
//! from the console ring) and to the vGIC (its interrupt line).

use super::claim;
use crate::domain::console::DUMP_KEY;
use crate::domain::vmplan::VmPlan;
use crate::esr::{self, MmioAccess};
use crate::mmio_bus::{BusError, Device};
use crate::runtime::console;
use crate::runtime::vm::{Bus, MmioFault, Vcpu, Vm};
use crate::runtime::wake::set_line;
use crate::sched::WakeCause;
use crate::trace::DumpReason;

/// Claims the vPL011's frame.
pub fn register(bus: &mut Bus, vp: &VmPlan) -> Result<(), BusError> {
    claim(bus, vp, Device::Vpl011, mmio)
}

/// A trapped access at offset `off` of the frame.
fn mmio(vm: &Vm, me: usize, v: &mut Vcpu, a: &MmioAccess, off: u64, value: u64) -> Result<(), MmioFault> {
    let mut guest_key = false;
    let dom = vm.domid;
    let level = {
        let mut uart = vm.uart.lock();
        if a.write {
            // With `sched_trace_dom0_key`, Dom0 writing Ctrl-\ dumps the
            // trace rings, as typing it does: a benchmark's guest asks right
            // after the sample it wants explained (cyclictest's breaktrace).
            // DomUs' bytes, and Dom0's without the option, go out as they are.
            let mut tx = |b: u8| {
                if dom == 0 && b == DUMP_KEY && vm.trace_trigger.dom0_key_on() {
                    guest_key |= vm.trace_trigger.dom0_key();
                } else {
                    console::domain_putc(dom, b);
                }
            };
            uart.write(off, a.size, value as u32, &mut tx)?;
        } else {
            let r = uart.read(off, a.size)? as u64;
            v.regs.set_reg(a.reg, esr::load_value(a, r));
            // Input waiting in the ring while the FIFO was full: the read
            // made room, take more if the input is still ours.
            if uart.rx_held() {
                uart.pump_rx(&mut console::RingRx { dom });
            }
        }
        uart.irq_level()
    };
    if guest_key {
        vm.dump_trace(DumpReason::Key, 0);
    }
    set_line(vm, me, vm.uart_intid, v.id, level, WakeCause::Interrupt);
    Ok(())
}
