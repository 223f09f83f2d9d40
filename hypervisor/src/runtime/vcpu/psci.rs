//! PSCI and SMCCC calls: CPU_ON/OFF, SYSTEM_OFF/RESET, the Arm
//! architecture calls (`crate::psci` decodes).

use super::report::{power_off, print_stats, stop_domain};
use super::*;

pub(super) fn find_vcpu(vm: &Vm, target: u64) -> Option<usize> {
    let mask = 0xff_00ff_ffff;
    (0..vm.vcpus.len()).find(|&i| crate::runtime::vm::vcpu_mpidr(i) & mask == target & mask)
}

pub(super) fn psci_call(vm: &Vm, me: usize, v: &mut Vcpu) -> Next {
    let [x0, x1, x2, x3, ..] = v.regs.x;
    // An unknown function is answered here, the known ones out of line:
    // this frame stays small for the call that does nothing.
    match crate::psci::decode(x0, x1, x2, x3) {
        Call::Unknown { function } => {
            v.regs.x[0] = unknown_call(vm, v, function) as u64;
            Next::Enter
        }
        call => known_call(vm, me, v, call),
    }
}

/// An SMCCC function this hypervisor does not implement: NOT_SUPPORTED.
#[inline]
fn unknown_call(vm: &Vm, v: &Vcpu, function: u32) -> i64 {
    inc(&vm.shared[v.id].counters.unsupported_calls);
    debug!("vCPU{}: unsupported SMCCC function {function:#x}", v.id);
    crate::psci::NOT_SUPPORTED
}

#[inline(never)]
fn known_call(vm: &Vm, me: usize, v: &mut Vcpu, call: Call) -> Next {
    let mut next = Next::Enter;
    let ret: i64 = match call {
        Call::Version => crate::psci::VERSION_1_1 as i64,
        Call::Features { function } => crate::psci::features(function),
        Call::SmcccVersion => crate::psci::SMCCC_VERSION_1_1 as i64,
        Call::SmcccArchFeatures { function } => crate::runtime::mitigations::guest_mitigations()
            .arch_features(function)
            .unwrap_or(crate::psci::NOT_SUPPORTED),
        // The exit that carried the call ran this pCPU's mitigation already.
        Call::ArchWorkaround { function } => crate::runtime::mitigations::guest_mitigations()
            .workaround_call(function)
            .unwrap_or(crate::psci::NOT_SUPPORTED),
        Call::MigrateInfoType => crate::psci::MIGRATE_NOT_REQUIRED,
        Call::CpuSuspend => {
            // Standby: like WFI.
            next = block(vm, me, v, u64::MAX);
            crate::psci::SUCCESS
        }
        Call::CpuOn { target, entry, context } => {
            let mpidrs: alloc::vec::Vec<u64> = (0..vm.vcpus.len()).map(crate::runtime::vm::vcpu_mpidr).collect();
            let online: alloc::vec::Vec<bool> = vm.shared.iter().map(|s| s.online.load(Ordering::Acquire)).collect();
            match crate::psci::validate_cpu_on(target, entry, &mpidrs, &online, vm.ram.base, vm.ram.end()) {
                Ok(t) => cpu_on(vm, me, t, entry, context),
                Err(e) => e,
            }
        }
        Call::AffinityInfo { target, level } => match find_vcpu(vm, target) {
            _ if level != 0 => crate::psci::INVALID_PARAMETERS,
            None => crate::psci::INVALID_PARAMETERS,
            Some(t) if vm.shared[t].online.load(Ordering::Acquire) => crate::psci::AFF_ON,
            Some(_) => crate::psci::AFF_OFF,
        },
        Call::CpuOff => {
            vm.shared[v.id].online.store(false, Ordering::Release);
            match vm.sched.power_off(now_ns(), me) {
                Ok(_) => next = Next::Schedule,
                Err(e) => warn!("vCPU{}: CPU_OFF: {e}", v.id),
            }
            crate::psci::SUCCESS
        }
        Call::SystemOff if vm.domid != 0 => return stop_domain(vm, me, v, "powered off"),
        Call::SystemReset if vm.domid != 0 => return stop_domain(vm, me, v, "asked for a reset"),
        Call::SystemOff => power_off(),
        Call::SystemReset => {
            print_stats();
            info!("dom0 requested a system reset");
            console::flush();
            smc::psci_system_reset()
        }
        Call::Unknown { function } => unknown_call(vm, v, function),
    };
    v.regs.x[0] = ret as u64;
    next
}

/// PSCI CPU_ON of an offline vCPU: reset its state, enter at `entry` with
/// `context` in x0, and let the scheduler run it.
pub(super) fn cpu_on(vm: &Vm, me: usize, t: usize, entry: u64, context: u64) -> i64 {
    if vm.shared[t].online.swap(true, Ordering::AcqRel) {
        return crate::psci::ALREADY_ON;
    }
    {
        // Offline vCPUs are not on any pCPU, but a CPU_OFF may still be
        // saving this one: the lock waits for it.
        let mut tv = vm.vcpus[t].lock();
        tv.regs = GuestRegs::default();
        tv.regs.x[0] = context;
        tv.regs.elr = entry;
        tv.regs.spsr = SPSR_EL1H_MASKED;
        tv.el1 = crate::arch::context::El1Context::reset(crate::runtime::vm::vcpu_mpidr(t));
        tv.ptimer = Default::default();
        tv.pmu = Default::default();
        tv.fp = Default::default();
        tv.gicif = Default::default();
        tv.vserror = Default::default();
    }
    let r = vm.sched.power_on(now_ns(), vm.gid(t));
    match r {
        Ok(a) => {
            do_wake_action(me, a);
            crate::psci::SUCCESS
        }
        Err(e) => {
            warn!("CPU_ON vCPU{t}: {e}");
            vm.shared[t].online.store(false, Ordering::Release);
            crate::psci::INTERNAL_FAILURE
        }
    }
}
