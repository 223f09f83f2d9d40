//! Exceptions injected into the guest: synchronous (aborts, UNDEFINED)
//! and SError.

use super::*;

/// Delivers a synchronous exception to the guest's EL1 vector table.
pub(super) fn inject_exception(v: &mut Vcpu, esr_el1: u64, far: Option<u64>) {
    let regs = &mut v.regs;
    let mode = regs.spsr & 0x1f;
    let offset = match mode {
        0b00100 => 0x000,            // EL1t
        0b00101 => 0x200,            // EL1h
        m if m & 0x10 != 0 => 0x600, // AArch32 EL0
        _ => 0x400,                  // AArch64 EL0
    };
    regs.elr = context::enter_el1_exception(esr_el1, far, regs.elr, regs.spsr) + offset;
    regs.spsr = SPSR_EL1H_MASKED;
}

/// A synchronous external abort for a data access (a store or a load, as
/// the trap said) or an instruction fetch (`esr::injected_abort_esr`).
#[cold]
#[inline(never)]
pub(super) fn inject_abort(vm: &Vm, v: &mut Vcpu, kind: esr::AbortKind, far: u64) {
    inc(&vm.shared[v.id].counters.aborts_injected);
    let same_el = v.regs.spsr & 0x1f != 0 && v.regs.spsr & 0x10 == 0;
    inject_exception(v, esr::injected_abort_esr(kind, same_el), Some(far));
}

/// A physical SError the running vCPU caused (taken from it, or found
/// pending at its exit, `syndrome` = ESR_EL2 or DISR_EL1): counted and
/// reflected to it as a virtual SError, never to whoever runs next.
#[cold]
#[inline(never)]
pub(super) fn serror_from_guest(vm: &Vm, v: &mut Vcpu, syndrome: u64) {
    let c = &vm.shared[v.id].counters;
    inc(&c.serrors);
    if c.serrors.load(Ordering::Relaxed) <= 8 {
        warn!("d{} vCPU{}: SError from the guest (syndrome {syndrome:#x}); injecting it", vm.domid, v.id);
    }
    v.vserror.raise();
    el2::set_vserror_syndrome(el2::cpu_features().ras);
    el2::set_hcr(v.vserror.on_entry(el2::hcr()));
}

#[cold]
#[inline(never)]
pub(super) fn inject_undef(vm: &Vm, v: &mut Vcpu) {
    inc(&vm.shared[v.id].counters.undef_injected);
    inject_exception(v, (ESR_EL1::EC::Unknown + ESR_EL1::IL::SET).value, None);
}
