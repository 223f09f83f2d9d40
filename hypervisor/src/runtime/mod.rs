//! The EL2 runtime: boot flow (`boot`), the VM and its vCPUs (`vm`), the
//! console (`console`) and the heap (`heap`). Built only for the bare-metal
//! aarch64 target.

pub mod boot;
pub mod console;
pub mod heap;
pub mod percpu;
pub mod physblk;
pub mod vblk;
pub mod vcpu;
pub mod vm;

use crate::arch::smc;

#[no_mangle]
extern "C" fn hv_primary_main(dtb: u64) -> ! {
    boot::primary_main(dtb)
}

#[no_mangle]
extern "C" fn hv_secondary_main(cpu: u64) -> ! {
    boot::secondary_main(cpu as usize)
}

/// An exception taken at EL2: a hypervisor bug. Report it and stop the machine.
pub fn fatal(kind: u64, esr: u64, elr: u64, far: u64) -> ! {
    crate::hvprintln!("(HV) FATAL: EL2 exception kind={kind} ESR={esr:#x} ELR={elr:#x} FAR={far:#x}");
    smc::psci_system_off()
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    crate::hvprintln!("(HV) PANIC: {info}");
    smc::psci_system_off()
}
