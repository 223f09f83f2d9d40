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

/// Prints one line starting with `(HV) fatal: ` and powers the machine
/// off. Every stop on an error the hypervisor cannot continue from goes
/// through here, so the line is the same whatever the log level, and
/// `cargo xtask run` (which cannot see PSCI SYSTEM_OFF's reason: QEMU exits
/// 0) recognises it and fails.
pub fn fatal_error(args: core::fmt::Arguments) -> ! {
    crate::hvprintln!("(HV) fatal: {args}");
    smc::psci_system_off()
}

/// `hv_fatal!("...", ...)`: [`fatal_error`] with `format!` arguments.
#[macro_export]
macro_rules! hv_fatal {
    ($($arg:tt)*) => { $crate::runtime::fatal_error(format_args!($($arg)*)) };
}

/// An exception taken at EL2: a hypervisor bug. Report it and stop the machine.
pub fn fatal(kind: u64, esr: u64, elr: u64, far: u64) -> ! {
    fatal_error(format_args!("EL2 exception kind={kind} ESR={esr:#x} ELR={elr:#x} FAR={far:#x}"))
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    fatal_error(format_args!("panic: {info}"))
}
