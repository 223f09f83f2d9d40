//! A guest exit's synchronous traps: WFI/WFE, HVC/SMC, system registers
//! (debug, PMU, the EL1 physical timer), stage-2 aborts and the emulated
//! MMIO devices (vGIC, vITS, virtio-blk, vPL011).

use super::inject::{inject_abort, inject_undef};
use super::psci::psci_call;
use super::*;
use crate::runtime::vm::MmioFault;

/// A trapped read of an ID register (HCR_EL2.TID3): the CPU's value as
/// `crate::idregs` sanitizes it for the guest.
#[inline(never)]
fn id_reg_read(vm: &Vm, v: &mut Vcpu, s: &esr::SysRegAccess) {
    let reg = crate::idregs::IdReg { crm: s.crm, op2: s.op2 };
    let value = crate::idregs::sanitize(reg, sysreg::read_id_reg(s.crm, s.op2), vm.pmu_intid.is_some());
    v.regs.set_reg(s.reg, value);
}

/// A trapped CNTP_CTL/CVAL/TVAL access: the emulated timer's registers.
#[inline(never)]
pub(super) fn ptimer_access(vm: &Vm, me: usize, v: &mut Vcpu, s: &esr::SysRegAccess, reg: crate::ptimer::PtimerReg) {
    let cnt = percpu::counter();
    if s.read {
        let value = v.ptimer.read(reg, cnt);
        v.regs.set_reg(s.reg, value);
    } else {
        let value = v.regs.reg(s.reg);
        v.ptimer.write(reg, value, cnt);
        ptimer_sync(vm, me, v, false);
    }
}

/// A trapped ICC_SGI1R_EL1 write of `value` by vCPU `v`.
fn send_sgi(vm: &Vm, me: usize, v: &mut Vcpu, value: u64) {
    // A lock holder sends its wake-up IPIs with IRQs masked: only then does
    // a wake-preemption of this vCPU wait (a grace).
    // With no grace open (none since this vCPU's switch-in, or the last
    // one closed at an exit that noted it), unmasked evidence changes
    // nothing in the scheduler: it is not asked.
    // (Evidence is our extension: with it off no grace ever opens.)
    let evidence =
        if vm.extensions.load(Ordering::Relaxed) { CritEvidence::from_spsr(v.regs.spsr) } else { CritEvidence::None };
    if evidence == CritEvidence::IrqsMasked || v.lhp_grace.is_some() {
        let a = vm.sched.note_critical_exit(now_ns(), me, evidence);
        do_wake_action(me, a.unwrap_or(WakeAction::None));
    }
    v.lhp_grace = (evidence == CritEvidence::IrqsMasked).then(|| GraceWatch::open(gic::active_group1_priorities()));
    // Sent from an interrupt handler: its EOI will be an exit, where the
    // grace can end (`GraceWatch`).
    let kicks = vm.vgic.send_sgi(v.id, value, v.lhp_grace.is_some_and(GraceWatch::in_handler));
    if let Ok(k) = kicks {
        process_kicks(vm, me, k, WakeCause::Sgi);
    }
}

pub(super) fn handle_sync(vm: &Vm, me: usize, v: &mut Vcpu) -> Next {
    let el2::ExitSyndrome { esr, far, hpfar } = el2::exit_syndrome();
    let ilen = esr::instruction_length(esr);
    let c = &vm.shared[v.id].counters;
    let exit = esr::decode(esr, far, hpfar);
    rec(vm, me, Event::Exit { vcpu: vm.gid(v.id).0 as u16, class: ExitClass::of(&exit) });
    match exit {
        Exit::Wfx { wfe, timeout } => {
            v.regs.elr += ilen;
            if wfe {
                // WFE and WFET: never block, so WFET's limit cannot be missed.
                inc(&c.wfe_traps);
                yield_cpu(vm, me, v.id)
            } else {
                inc(&c.wfi_traps);
                let limit = timeout.limit_ns(|r| v.regs.reg(r), percpu::cntfrq());
                block(vm, me, v, limit)
            }
        }
        Exit::Hvc { .. } => {
            inc(&c.hvc);
            psci_call(vm, me, v)
        }
        Exit::Smc { .. } => {
            inc(&c.smc);
            v.regs.elr += ilen;
            psci_call(vm, me, v)
        }
        Exit::SysReg(s) => {
            inc(&c.sysreg);
            if !s.read && s.key() == esr::ICC_SGI1R_EL1 {
                let value = v.regs.reg(s.reg);
                inc(&c.sgis_sent);
                send_sgi(vm, me, v, value);
                v.regs.elr += ilen;
            } else if s.read && crate::idregs::is_id_space(s.op0, s.op1, s.crn, s.crm) {
                id_reg_read(vm, v, &s);
                v.regs.elr += ilen;
            } else if !s.read && (s.key() == esr::ICC_ASGI1R_EL1 || s.key() == esr::ICC_SGI0R_EL1) {
                // Group 0 / alternate-group SGIs do not exist for this guest.
                v.regs.elr += ilen;
            } else if let Some(reg) = crate::ptimer::PtimerReg::classify(&s) {
                ptimer_access(vm, me, v, &s, reg);
                v.regs.elr += ilen;
            } else if let Some(e) = traps::emulated(s.op0, s.op1, s.crn, s.crm, s.op2) {
                if s.read {
                    let value = match e {
                        traps::Emulated::Actlr => v.el1.actlr,
                        traps::Emulated::RasRecord => 0,
                    };
                    v.regs.set_reg(s.reg, value);
                }
                v.regs.elr += ilen;
            } else if let Some(reg) = vdebug::classify(&s) {
                debug_access(vm, v, &s, reg, ilen);
            } else if crate::vpmu::is_pmu_reg(&s) {
                pmu_access(vm, v);
            } else {
                // Everything else the configuration traps (PMU, AMU, SPE,
                // trace, LORegions, registers of later features): the guest
                // was told it is absent. And the IMPLEMENTATION DEFINED
                // registers (TIDCP), as on KVM.
                inject_undef(vm, v);
            }
            Next::Enter
        }
        Exit::Mmio(a) => {
            inc(&c.mmio);
            match mmio(vm, me, v, &a) {
                Ok(()) => v.regs.elr += ilen,
                Err(MmioFault::NoDevice) if vm.bus.lookup(a.ipa).is_none() && map_on_demand(vm, a.ipa) => {
                    // Mapped: the guest retries the access on the device itself.
                }
                Err(e) => {
                    report_bad_access(vm, v, a.ipa, "bad MMIO access", Some(&e));
                    inject_abort(vm, v, esr::AbortKind::Data { write: a.write, cache_maint: false }, far);
                }
            }
            Next::Enter
        }
        Exit::DataAbort { ipa, iss } if esr::is_translation_fault(iss) && map_on_demand(vm, ipa) => Next::Enter,
        Exit::DataAbort { ipa, iss } => {
            let isv = ISS_ABORT::ISV.is_set(u64::from(iss));
            report_bad_access(vm, v, ipa, if isv { "data abort" } else { "data abort without syndrome" }, None);
            inject_abort(vm, v, esr::AbortKind::from_dabt_iss(iss), far);
            Next::Enter
        }
        Exit::InstructionAbort { ipa } => {
            report_bad_access(vm, v, ipa, "instruction abort", None);
            inject_abort(vm, v, esr::AbortKind::Fetch, far);
            Next::Enter
        }
        Exit::Undefined { .. } | Exit::Unknown { .. } => {
            inject_undef(vm, v);
            Next::Enter
        }
    }
}

/// How closely vCPU `id` is watched for spinning (`sched::spin`): not at
/// all unless vCPUs outnumber pCPUs and a sibling is runnable but was
/// descheduled involuntarily (a lock holder `id` may be waiting for);
/// closely if that sibling left with IRQs masked.
/// Spin detection is our extension: off with `sched_wake_preempt=off`.
/// Reads only atomics (`VcpuShared::preempted`): no scheduler lock.
pub(super) fn spin_watch(vm: &Vm, id: usize) -> Option<spin::Watch> {
    if !vm.overcommitted || !vm.extensions.load(Ordering::Relaxed) {
        return None;
    }
    preempted_sibling(vm, id).map(|(_, masked)| if masked { spin::Watch::Critical } else { spin::Watch::Preempted })
}

/// A sibling of vCPU `id` that is runnable but was descheduled
/// involuntarily (`VcpuShared::preempted`), one that left inside a critical
/// section (IRQs masked: the likely holder of what `id` waits for) first,
/// and whether it did.
pub(super) fn preempted_sibling(vm: &Vm, id: usize) -> Option<(usize, bool)> {
    let mut found = None;
    for (k, sh) in vm.shared.iter().enumerate() {
        if k == id || !sh.preempted.load(Ordering::Relaxed) {
            continue;
        }
        if sh.left_masked.load(Ordering::Relaxed) {
            return Some((k, true));
        }
        found.get_or_insert((k, false));
    }
    found
}

/// WFE while vCPUs outnumber pCPUs: the vCPU probably spins on a lock whose
/// holder is preempted; yield, directly to a preempted sibling if any.
#[inline(never)]
pub(super) fn yield_cpu(vm: &Vm, me: usize, id: usize) -> Next {
    if !vm.overcommitted {
        return Next::Enter;
    }
    // Directed only with our extensions on; Credit2's own yield is undirected.
    let target =
        vm.extensions.load(Ordering::Relaxed).then(|| preempted_sibling(vm, id)).flatten().map(|(k, _)| vm.gid(k));
    match vm.sched.yield_to(now_ns(), me, target) {
        Ok(()) => Next::Schedule,
        Err(_) => Next::Enter,
    }
}

/// An ACPI Dom0 touched an unmapped address outside RAM and its MMIO bus:
/// maps the page (or its 2 MiB block) 1:1 as device memory when
/// `Vm::iomem` permits it, so the guest's retry reaches the device (Xen's
/// on-demand MMIO for its hardware domain). False: refused, abort the guest.
#[inline(never)]
pub(super) fn map_on_demand(vm: &Vm, ipa: u64) -> bool {
    let Some(policy) = &vm.iomem else { return false };
    let r = match policy.decide(ipa) {
        IoMemDecision::Map(r) => r,
        IoMemDecision::Deny(why) => {
            inc(&vm.iomem_denied);
            debug!("on-demand MMIO at {ipa:#x} refused: {why}");
            return false;
        }
    };
    let page = ipa & !0xfff;
    let mut guard = vm.stage2.lock();
    let (s2, frames) = &mut *guard;
    // The block overlaps something mapped (ECAM, firmware tables, an
    // earlier page): the page alone. Mapped already: another vCPU won the
    // race for this fault, retry.
    let res = match s2.map(frames, r.base, r.base, r.size, MemType::Device) {
        Err(Stage2Error::AlreadyMapped) if r.size > 0x1000 => s2.map(frames, page, page, 0x1000, MemType::Device),
        res => res,
    };
    match res {
        Ok(()) => {
            el2::stage2_updated();
            inc(&vm.iomem_maps);
            debug!("on-demand MMIO: mapped {:#x}+{:#x} for {ipa:#x}", r.base, r.size);
            true
        }
        Err(Stage2Error::AlreadyMapped) => s2.translate(frames, ipa).is_some(),
        Err(e) => {
            // Out of table frames is the VM's heap quota speaking: refused
            // and counted like a denied address, logged a few times only.
            if vm.iomem_denied.fetch_add(1, Ordering::Relaxed) < 8 {
                warn!("on-demand MMIO at {ipa:#x}: {e:?} (heap quota: {} of {})", vm.quota.used(), vm.quota.limit());
            }
            false
        }
    }
}

/// Logs (the first 16 of a VM's) a guest access that gets an external
/// abort: `what` it was, at which IPA and PC, and `why` when a device said.
#[cold]
#[inline(never)]
pub(super) fn report_bad_access(vm: &Vm, v: &Vcpu, ipa: u64, what: &str, why: Option<&dyn core::fmt::Display>) {
    if vm.bad_accesses.fetch_add(1, Ordering::Relaxed) < 16 {
        // Dom0's lines as they always were; a DomU's name it.
        let dom = if vm.domid == 0 { alloc::string::String::new() } else { alloc::format!("d{} ", vm.domid) };
        let why = why.map(|e| alloc::format!(": {e}")).unwrap_or_default();
        warn!("{dom}vCPU{}: {what} at IPA {ipa:#x} (PC {:#x}){why}; injecting an external abort", v.id, v.regs.elr);
    }
}

/// Emulated device access: the handler `Vm::bus` registered for the
/// address (`runtime::devices`). Err: the access is not valid (abort the
/// guest).
pub(super) fn mmio(vm: &Vm, me: usize, v: &mut Vcpu, a: &MmioAccess) -> Result<(), MmioFault> {
    let (h, off) = vm.bus.lookup_hinted(a.ipa, &mut v.mmio_hint).ok_or(MmioFault::NoDevice)?;
    // A read's handler gets 0: the register is read for stores only.
    let value = if a.write { esr::store_value(a, v.regs.reg(a.reg)) } else { 0 };
    (h.call)(vm, me, v, a, off, value)
}

/// A trapped debug-register access (MDCR_EL2.TDA/TDOSA/TDRA), emulated as
/// `crate::vdebug` says.
#[inline(never)]
pub(super) fn debug_access(vm: &Vm, v: &mut Vcpu, s: &esr::SysRegAccess, reg: DebugReg, ilen: u64) {
    let value = v.regs.reg(s.reg);
    match v.el1.debug.access(reg, s.read, value) {
        vdebug::Action::Read(x) => v.regs.set_reg(s.reg, x),
        vdebug::Action::ReadMdscr => v.regs.set_reg(s.reg, context::read_mdscr()),
        vdebug::Action::WriteMdscr(x) => context::write_mdscr(x),
        vdebug::Action::Arm => {
            // Not skipped: the access runs again, on the hardware.
            arm_debug(v);
            inc(&vm.shared[v.id].counters.debug_emulated);
            return;
        }
        vdebug::Action::Ignore => {}
        vdebug::Action::Undefined => return inject_undef(vm, v),
    }
    inc(&vm.shared[v.id].counters.debug_emulated);
    v.regs.elr += ilen;
}

/// A trapped PMU access (MDCR_EL2.TPM/TPMCR): with a vPMU, the vCPU's
/// registers go on the PMU, the traps are lifted and the instruction runs
/// again there (`crate::vpmu`); without one it is UNDEFINED.
#[inline(never)]
pub(super) fn pmu_access(vm: &Vm, v: &mut Vcpu) {
    match v.pmu.on_trap(vm.pmu_intid.is_some()) {
        crate::vpmu::TrapAction::LoadAndRetry => {
            arm_pmu(v);
            inc(&vm.shared[v.id].counters.pmu_loads);
        }
        crate::vpmu::TrapAction::Undefined => inject_undef(vm, v),
    }
}
