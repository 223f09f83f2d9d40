//! The EL2 runtime, built only for the bare-metal aarch64 target:
//! - `boot`: the boot flow, from the primary CPU's entry to the VM
//! - `heap`: the bootstrap and planned heap, stage-2 table frames
//! - `console`: log and guest output on the physical UART
//! - `mitigations`: each pCPU's Spectre mitigations and what guests are told
//! - `percpu`: per-pCPU shared state, run blocks, kicks, the EL2 timer
//! - `vm`: a VM, its vCPUs, the VM table, the host-wide scheduler
//! - `create`: making a VM from its plan (the appliers, `Vm::from_plan`)
//! - `dom0`: Dom0's creation (`Vm::create_dom0`) and its firmware view
//! - `domctl`: DomUs made (`hvctl create`, from the DomU pool) and reaped
//!   (`hvctl destroy`) while the machine runs
//! - `domu`: a DomU's creation from its spec and placement; `domu_selftest`
//! - `vcpu`: the per-pCPU scheduling loop and every trap and interrupt
//! - `wake`: waking a vCPU (scheduler, kick, reschedule) for every injector
//! - `vlpi`: GICv4 direct injection: the VM's vPEs and their vITS backend
//! - `vpe`: vPE residency on vCPU load/put, doorbells
//! - `devices`: the emulated devices' EL2 glue (vGIC, vITS, virtio-blk,
//!   vPL011, vPCI, Dom0's control device), each registering its MMIO
//!   handlers on the VM's bus
//! - `stats`: every VM's counters as text, for the console and `hvctl`
//! - `vblk`: the guest's virtio-blk wired to traps, timer and vGIC
//! - `physblk`: the physical virtio-blk as that device's backend
//! - `pci`: PCIe functions assigned to DomUs: probe, BARs, reset
//! - `smmu`: the SMMUs brought up, VMs' DMA confined, their interrupts,
//!   the checksum of the hypervisor's code
//! - `uefi`: the EFI application (UEFI boot) and the ACPI boot after it

pub mod boot;
pub mod console;
pub mod create;
pub mod devices;
pub mod dom0;
pub mod domctl;
pub mod domu;
pub mod heap;
pub mod mitigations;
pub mod pci;
pub mod percpu;
pub mod physblk;
pub mod smmu;
pub mod stats;
pub mod uefi;
pub mod vblk;
pub mod vcpu;
pub mod vlpi;
pub mod vm;
pub mod vpe;
pub mod wake;

use crate::arch::smc;

#[no_mangle]
extern "C" fn hv_primary_main(x0: u64, x1: u64, x2: u64, x3: u64) -> ! {
    boot::early_init();
    // Started as an EFI application (`uefi`): the machine is described by
    // ACPI, not by a DTB.
    if let Some(h) = uefi::take_handoff() {
        uefi::acpi_main(h)
    }
    boot::primary_main([x0, x1, x2, x3])
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
    console::flush();
    smc::psci_system_off()
}

/// `hv_fatal!("...", ...)`: [`fatal_error`] with `format!` arguments.
#[macro_export]
macro_rules! hv_fatal {
    ($($arg:tt)*) => { $crate::runtime::fatal_error(format_args!($($arg)*)) };
}

/// An exception taken at EL2: a hypervisor bug. Report it and stop the
/// machine. The EL2 vectors (`arch::aarch64::exception`) branch here by name.
#[no_mangle]
extern "C" fn el2_fatal(kind: u64, esr: u64, elr: u64, far: u64) -> ! {
    fatal_error(format_args!("EL2 exception kind={kind} ESR={esr:#x} ELR={elr:#x} FAR={far:#x}"))
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    fatal_error(format_args!("panic: {info}"))
}
