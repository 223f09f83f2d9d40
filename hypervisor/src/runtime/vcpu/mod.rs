//! Running vCPUs on pCPUs: the per-pCPU scheduling loop, guest entry and
//! exit, and every trap (WFI/WFE, HVC/SMC PSCI, system registers, MMIO,
//! aborts, physical interrupts).
//!
//! Two tables dispatch: a physical interrupt goes where the VM's IRQ route
//! table (`Vm::routes`, `crate::irq`) says, each arm of that `match` one
//! small handler below; a trapped MMIO access goes to the handler its device
//! registered on the VM's MMIO bus (`Vm::bus`, `runtime::devices`).
//!
//! Locking: a pCPU holds a vCPU's context lock from load to save. The vGIC
//! lock is taken before the scheduler lock when both are needed (a WFI check
//! and the block that follows must be atomic against a concurrent injection,
//! or a wake could be lost), and never while waiting for a vCPU lock. The
//! route table's read lock is a leaf: taken for one lookup, released before
//! the interrupt is handled.
//!
//! Here: the pCPU loop, vCPU load and save, WFI blocking. The rest, each
//! file using only those after it: `run` (one vCPU's turn), `exit` (the
//! synchronous traps and MMIO), `psci` (PSCI/SMCCC), `irq` (physical
//! interrupts), `inject` (exceptions into the guest), `report` (counters,
//! dumps, stopping).

mod exit;
mod inject;
mod irq;
mod psci;
mod report;
mod run;

use self::exit::spin_watch;
use self::irq::{console_input, handle_irqs};
use self::report::dump_if_outlier;
use self::run::run_vcpu;
use super::console;
use super::percpu::{self, now_ns, pcpu, PcpuShared, SGI_KICK};
use super::vm::{inc, vcpu_of, vms, Vcpu, Vm, SPSR_EL1H_MASKED};
use super::wake::{do_wake_action, process_kicks, rec, set_line, wake_vcpu};
use crate::arch::exception::{run_guest, ExitKind, GuestExit, GuestRegs};
use crate::arch::{context, el2, gic, pmu, smc, sysreg};
use crate::domain::console::Key;
use crate::esr::{self, Exit, MmioAccess};
use crate::intid::IntId;
use crate::iomem::IoMemDecision;
use crate::irq::Route;
use crate::psci::Call;
use crate::regs::ISS_ABORT;
use crate::sched::spin::{self, SpinDetector};
use crate::sched::{CritEvidence, GraceWatch, WakeAction, WakeCause};
use crate::stage2::{MemType, Stage2Error};
use crate::trace::{DumpReason, Event, ExitClass};
use crate::traps::{self, VirtualSError};
use crate::vdebug::{self, DebugReg};
use crate::vpmu::Placement;
use aarch64_cpu::registers::{CNTV_CTL_EL0, CNTV_CVAL_EL0, ESR_EL1};
use core::sync::atomic::Ordering;
use log::{debug, info, warn};
use tock_registers::interfaces::Readable;

/// Typing Ctrl-\\ on the console prints the statistics (it is not passed
/// to the guest).
pub const STATS_KEY: u8 = crate::domain::console::DUMP_KEY;

/// What the run loop does after an exit.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Re-enter the guest.
    Enter,
    /// Leave the vCPU and call the scheduler.
    Schedule,
}

/// Configures this pCPU's EL2 controls for running `vm`: the trap
/// configuration for what this CPU implements (`crate::traps`: HCR_EL2,
/// CPTR_EL2, MDCR_EL2, CNTHCTL_EL2, host-tested), WFE trapped when vCPUs
/// outnumber pCPUs, and the VM's stage 2 with its VMID. `first`: this pCPU
/// has not run this VMID before (its TLB entries are invalidated, see
/// `el2::load_guest_config`).
fn load_vm(vm: &Vm, first: bool) {
    let t = traps::guest_traps(&el2::cpu_features(), vm.overcommitted);
    el2::load_guest_config(&t, vm.stage2_root, vm.vmid, vm.ipa, first);
}

/// Enables the physical interrupts this pCPU takes.
fn enable_irqs(vm: &Vm, me: usize) {
    gic::enable(SGI_KICK, me, true);
    gic::enable(vm.maintenance_intid, me, false);
    gic::enable(vm.hyp_timer_intid, me, false);
    gic::enable(vm.virt_timer_intid, me, false);
    if let Some(p) = vm.pmu_intid {
        // Whatever firmware left counting stops; no vCPU owns the PMU yet.
        pmu::quiesce(pmu_counters());
        gic::enable(p, me, false);
    }
    if me == 0 {
        gic::enable(vm.uart_intid, 0, false);
        for (&i, &edge) in vm.forwarded.iter().zip(&vm.forwarded_edge) {
            gic::enable(i, 0, edge);
        }
        if let Some(i) = vm.disk.as_ref().and_then(|d| d.phys_intid) {
            gic::enable(i, 0, false);
        }
        // The SMMUs' event-queue and global-error interrupts: edges.
        for i in crate::arch::smmu::irqs() {
            gic::enable(i, 0, true);
        }
        console::enable_rx_irq();
        // Input that arrived before: enabling the interrupt cleared its
        // pending state, and a full physical FIFO never raises it again.
        console_input(me);
    }
}

/// `VcpuShared::preempted` after a `schedule()` decided `d` and picked
/// `next`; `last` ran here before it, so it is the vCPU any switch-out is
/// about. Called under the pCPU's runqueue lock, so that the stores follow
/// the decisions' order (a vCPU that moves to another runqueue is
/// published here before that runqueue can pick it).
#[inline(always)]
fn publish_preempted(
    d: &crate::sched::Decision,
    last: Option<(&'static Vm, usize)>,
    next: Option<(&'static Vm, usize)>,
) {
    use crate::sched::SwitchReason;
    // `d.preempted` names the vCPU that left still runnable (one parked for
    // lack of budget is not, though `switch.out` reports a slice end); a
    // yield is no preemption.
    let involuntary = matches!(d.switch.out, Some((_, SwitchReason::SliceEnd | SwitchReason::WakePreempt, _)));
    if let (true, Some(g), Some((lvm, k))) = (involuntary, d.preempted, last) {
        debug_assert_eq!(g, lvm.gid(k), "the vCPU switched out is the one that ran here");
        lvm.shared[k].preempted.store(true, Ordering::Relaxed);
    }
    if let Some((gvm, k)) = next {
        gvm.shared[k].preempted.store(false, Ordering::Relaxed);
    }
}

/// The reschedule IPIs a `schedule()`'s balancing owes (after a credit
/// reset only: out of the loop's line).
#[cold]
#[inline(never)]
fn kick_balanced(vm: &Vm, me: usize, owed: crate::sched::OwedKicks) {
    for k in owed.iter() {
        rec(vm, me, Event::Kick { pcpu: k as u16 });
        percpu::kick(k);
    }
}

/// The pCPU's life: pick a vCPU of any VM from the host-wide scheduler,
/// switch to its VM's stage 2 when it is another VM's, run it until it
/// blocks, yields or is preempted, repeat; idle in WFI when there is nothing
/// to run.
pub fn pcpu_loop(me: usize) -> ! {
    let vm = vms()[0];
    enable_irqs(vm, me);
    let mut deadline: Option<u64>;
    // The VM whose stage 2 is loaded here, and the VMIDs this pCPU has run.
    let mut loaded: Option<u16> = None;
    // Room for every VMID up front: the list never grows, so VMs made and
    // reaped while running leave the heap as it was.
    let mut seen: alloc::vec::Vec<u16> = alloc::vec::Vec::with_capacity(256);
    // The reaper's word (`domctl::word`) as this pCPU last saw it: its
    // `loaded` and `seen` are of that generation.
    let mut seen_word = super::domctl::word();
    let mut quiescent = 0u64;
    // The vCPU that ran here last, whose vPE may still be resident here.
    let mut last: Option<(&'static Vm, usize)> = None;
    // Whether the hardware LRs may hold anything but zeros (`run_vcpu`):
    // unknown at first.
    let mut lrs_dirty = true;
    loop {
        pcpu(me).resched.store(false, Ordering::Relaxed);
        let now = now_ns();
        let mut owed = crate::sched::OwedKicks::default();
        let (d, next) = {
            let mut s = vm.sched.runqueue_for(me);
            let mut d = s.schedule(now, me).unwrap_or_else(|e| {
                warn!("pCPU{me}: scheduler: {e}");
                Default::default()
            });
            let next = d.next.and_then(vcpu_of);
            publish_preempted(&d, last, next);
            vm.sched.scheduled(now, me, s, &mut d, &mut owed);
            (d, next)
        };
        if owed.any() {
            kick_balanced(vm, me, owed);
        }
        // Its spin watch (`run_vcpu`), from the flags just published.
        let watch = next.and_then(|(g, v)| spin_watch(g, v));
        // First, as another pCPU may be waiting to load that vCPU.
        if let Some((lvm, lid)) = last.take() {
            if !next.is_some_and(|(g, v)| core::ptr::eq(g, lvm) && v == lid) {
                super::vpe::release(lvm, me, lid);
            }
        }
        // Nothing read from the VM table is held now but `next` and Dom0,
        // neither of them a dying VM.
        quiescent = quiescent.wrapping_add(1);
        crate::runloop::grace::quiescent(pcpu(me), quiescent);
        let w = super::domctl::word();
        if w != seen_word {
            if super::domctl::pending(w) {
                super::domctl::reap(me);
            }
            if super::domctl::generation(w) != super::domctl::generation(seen_word) {
                // A reaped VM's VMID may be used again: flushed again here
                // before it runs, and its tables reloaded.
                loaded = None;
                seen.clear();
            }
            // While the reaper has work the word stays different: it runs
            // again next time.
            seen_word = w & !1;
        }
        log::trace!("pCPU{me}: schedule -> {:?}", d);
        vm.trace[me].lock().decision(now, &d);
        dump_if_outlier(me, now, &d, next);
        if let Some(k) = d.kick {
            rec(vm, me, Event::Kick { pcpu: k as u16 });
            percpu::kick(k);
        }

        deadline = d.timer_at;
        match next {
            Some((guest, v)) => {
                if loaded != Some(guest.vmid) {
                    let first = !seen.contains(&guest.vmid);
                    load_vm(guest, first);
                    if first {
                        seen.push(guest.vmid);
                    }
                    loaded = Some(guest.vmid);
                }
                run_vcpu(guest, me, v, &mut deadline, &mut lrs_dirty, watch);
                last = Some((guest, v));
            }
            None => {
                arm_timer(me, pcpu(me), &mut deadline, None);
                if !pcpu(me).resched.load(Ordering::Acquire) {
                    crate::runloop::grace::idle(pcpu(me), true);
                    sysreg::wfi();
                    crate::runloop::grace::idle(pcpu(me), false);
                }
                handle_irqs(me, None, &mut deadline);
            }
        }
    }
}

/// Programs CNTHP for the earliest of the scheduler deadline, `sample` (the
/// next spin sample of the running vCPU, see `sched::spin`) and, in every
/// VM, the virtual timers of vCPUs saved on this pCPU and the disk
/// completions it watches.
fn arm_timer(me: usize, p: &PcpuShared, deadline: &mut Option<u64>, sample: Option<u64>) {
    // A plain load first: the swap (an exclusive-access loop) only when a
    // request is there. One that lands after the load is taken at the next
    // entry, as it would be had it landed after the swap.
    let req = match p.rearm_at.load(Ordering::Acquire) {
        u64::MAX => u64::MAX,
        _ => p.rearm_at.swap(u64::MAX, Ordering::AcqRel),
    };
    if req != u64::MAX {
        *deadline = Some(deadline.map_or(req, |d| d.min(req)));
    }
    let at = deadline.unwrap_or(u64::MAX).min(sample.unwrap_or(u64::MAX));
    // Every VM's deadlines are walked only when one was reported changed
    // (`percpu::note_timers_changed`), not at every guest entry.
    let watched = p.timers_min(|| {
        let mut at = u64::MAX;
        for vm in vms() {
            if let Some(disk) = &vm.disk {
                if disk.home.load(Ordering::Acquire) == me {
                    at = at.min(disk.deadline.load(Ordering::Acquire));
                }
            }
            for s in &vm.shared {
                if s.vtimer_home.load(Ordering::Relaxed) == me {
                    at = at.min(s.vtimer_deadline.load(Ordering::Acquire)).min(s.wake_at.load(Ordering::Acquire));
                    at = at.min(s.ptimer_deadline.load(Ordering::Acquire));
                }
            }
        }
        at
    });
    let at = at.min(watched);
    let at = (at != u64::MAX).then_some(at);
    // The recorder notes changes only; an unchanged deadline is the common
    // case and costs no trace lock.
    if p.arm_hyp_timer(at) {
        vms()[0].trace[me].lock().note_arm(now_ns(), at);
    }
}

fn load_vcpu(vm: &Vm, me: usize, v: &mut Vcpu) {
    let vt = vm.virt_timer_intid;
    // The deadlines the EL2 timer watched for the vCPU while it was away
    // end; the pCPU that watched recomputes its earliest only if there was
    // one (only the pCPU holding the vCPU writes them: no swap needed).
    let s = &vm.shared[v.id];
    let watched = s.vtimer_deadline.load(Ordering::Acquire)
        & s.wake_at.load(Ordering::Acquire)
        & s.ptimer_deadline.load(Ordering::Acquire);
    if watched != u64::MAX {
        s.vtimer_deadline.store(u64::MAX, Ordering::Release);
        s.wake_at.store(u64::MAX, Ordering::Release);
        s.ptimer_deadline.store(u64::MAX, Ordering::Release);
        percpu::note_timers_changed(s.vtimer_home.load(Ordering::Relaxed));
    }
    // The EL2 timer may have raised its physical timer's line while it was
    // away (`vm_timers_expired`): the model follows the timer again.
    ptimer_sync(vm, me, v, v.ptimer.ctl & 1 != 0);
    // Derived afresh below (running_on is already set: a later change by
    // another pCPU asks again, see `deactivate_hw`).
    vm.shared[v.id].ppi_resync.store(0, Ordering::Release);
    // The forwarded virtual timer: its output is a level, so a pending state
    // the guest has not acknowledged ends if the timer it saved is no longer
    // due (disabled, masked or CVAL moved on since it fired). Then, while its
    // virtual interrupt is pending or active, keep the physical PPI active so
    // it does not fire again.
    let line = crate::time::vtimer_line(v.el1.cntv_ctl, v.el1.cntv_cval, percpu::counter());
    {
        let mut vgic = vm.vgic.lock_private(v.id);
        load_forwarded_ppi(&mut vgic, me, v.id, vt, line);
        // The PMU's overflow line is a level too, as its saved registers
        // drive it; set before they go back on the PMU, which raises the
        // physical line again.
        if let Some(p) = vm.pmu_intid {
            v.pmu_ppi_set = load_forwarded_ppi(&mut vgic, me, v.id, p, v.pmu.regs.line());
        }
    }
    if vm.pmu_intid.is_some() && v.pmu.placement == Placement::Loaded {
        arm_pmu(v);
    }
    v.el1.restore();
    if v.el1.debug.dirty {
        arm_debug(v);
    }
    v.fp.restore();
    v.gicif.restore();
    // GICv4: the vPE follows its vCPU here and becomes resident.
    v.vpe_resident = super::vpe::load(vm, me, v.id);
    // A virtual SError the vCPU has not taken yet goes with it.
    if v.vserror.is_pending() {
        el2::set_vserror_syndrome(el2::cpu_features().ras);
        el2::set_hcr(v.vserror.on_entry(el2::hcr()));
    }
}

/// The vGIC, locked, with vCPU `v`'s level-driven private interrupts
/// resampled against their sources (its registers are live here): a
/// virtual timer interrupt the guest has not taken while its timer is no
/// longer due (disabled, masked or CVAL moved on) is not pending any more,
/// nor an overflow interrupt whose flag the guest cleared; ending the
/// virtual pending state also ends the physical PPI's active state, so it
/// can fire again.
fn resampled<'a>(vm: &'a Vm, me: usize, v: &Vcpu) -> crate::sync::MutexGuard<'a, crate::vgic::Vgic> {
    let mut vgic = vm.vgic.lock_private(v.id);
    let line = crate::time::vtimer_line(CNTV_CTL_EL0.get(), CNTV_CVAL_EL0.get(), percpu::counter());
    resample_forwarded_ppi(&mut vgic, me, v.id, vm.virt_timer_intid, line);
    if let (Some(p), Placement::Loaded) = (vm.pmu_intid, v.pmu.placement) {
        resample_forwarded_ppi(&mut vgic, me, v.id, p, pmu::line());
    }
    vgic
}

/// Switch-in of forwarded private interrupt `intid` of vCPU `id`, whose
/// source's output is the level `line`: a pending state the guest has not
/// acknowledged ends if the line dropped while the vCPU was away; then,
/// while its virtual interrupt is pending or active, the physical PPI is
/// kept active so it does not fire again. Otherwise it is left as the
/// last switch-out here left it: inactive (`save_vcpu` deactivates each
/// forwarded PPI of the vCPU it saves that may be active).
/// Returns whether it made the physical PPI active.
fn load_forwarded_ppi(vgic: &mut crate::vgic::Vgic, me: usize, id: usize, intid: IntId, line: bool) -> bool {
    let busy = vgic.load_hw_private(id, intid, line);
    if busy {
        gic::set_private_active(me, intid, true);
    }
    busy
}

/// PMCR_EL0.N of this machine's PMU (0 without one).
fn pmu_counters() -> u8 {
    el2::cpu_features().pmu.map_or(0, |p| p.counters)
}

fn save_vcpu(vm: &Vm, me: usize, v: &mut Vcpu) {
    if let Some(p) = vm.pmu_intid {
        let loaded = v.pmu.placement == Placement::Loaded;
        if loaded {
            pmu::save(&mut v.pmu.regs, pmu_counters());
            v.pmu.on_save();
            pmu::set_trap(true);
        }
        // Its overflow PPI fires only while the vPMU is on the hardware
        // (a saved one is quiesced), so it is active only then, or if the
        // switch-in or a resync made it so.
        if loaded || core::mem::take(&mut v.pmu_ppi_set) {
            gic::set_private_active(me, p, false);
        }
    }
    v.el1.save(); // also stops the guest's timer
    if v.el1.debug.dirty {
        context::save_break_watch(&mut v.el1.debug.regs, el2::debug_slots());
        el2::set_debug_trap(true);
        v.el1.debug.switched_out(v.el1.mdscr);
    }
    v.fp.save();
    v.gicif.save();
    // GICv4: a resident vPE stays so until this pCPU picks another vCPU or
    // idles (`pcpu_loop`, `vpe::release`).
    v.vpe_resident = false;
    if v.vserror.is_pending() {
        // Not taken yet: it stays the vCPU's, not the pCPU's.
        el2::set_hcr(VirtualSError::on_switch_out(el2::hcr()));
    }
    // The physical timer PPI is active only while its virtual interrupt is
    // pending or active (taken and injected; kept so at load; ended with
    // it by the guest's deactivation through the HW LR, a resample or a
    // queued deactivation): deactivated for the next vCPU only then.
    let busy = vm.vgic.read().is_pending_or_active(v.id, vm.virt_timer_intid);
    if busy {
        gic::set_private_active(me, vm.virt_timer_intid, false);
    }
    let (ctl, cval) = (v.el1.cntv_ctl, v.el1.cntv_cval);
    let deadline = crate::time::saved_vtimer_deadline_ns(ctl, cval, percpu::cntfrq(), vm.timer_slop_ns, busy);
    vm.shared[v.id].vtimer_home.store(me, Ordering::Relaxed);
    vm.shared[v.id].vtimer_deadline.store(deadline, Ordering::Release);
    let pt = v.ptimer.watch_ns(v.ptimer_level, percpu::cntfrq());
    vm.shared[v.id].ptimer_deadline.store(pt, Ordering::Release);
    // They and `wake_at` were cleared when the vCPU was loaded, and `wake_at`
    // (a WFIT limit `block` stored) was noted for the old `vtimer_home`,
    // which is this pCPU from now on: with nothing to watch, this pCPU's
    // earliest deadline has not changed.
    let wake_at = vm.shared[v.id].wake_at.load(Ordering::Acquire);
    if deadline & pt & wake_at != u64::MAX {
        percpu::note_timers_changed(me);
    }
}

/// Drives vCPU `v`'s EL1 physical timer line into the vGIC when it changed
/// (always when `force`), kicking whoever the interrupt concerns.
fn ptimer_sync(vm: &Vm, me: usize, v: &mut Vcpu, force: bool) {
    let line = v.ptimer.line(percpu::counter());
    if line == v.ptimer_level && !force {
        return;
    }
    v.ptimer_level = line;
    set_line(vm, me, vm.phys_timer_intid, v.id, line, WakeCause::Timer);
}

/// Resamples forwarded private interrupt `intid` of vCPU `id`, running
/// here, against its source's level `line`; ending its pending state also
/// ends the physical PPI's active state, so it can fire again.
fn resample_forwarded_ppi(vgic: &mut crate::vgic::Vgic, me: usize, id: usize, intid: IntId, line: bool) {
    if vgic.resample_hw_private(id, intid, line) == Ok(true) {
        gic::set_private_active(me, intid, vgic.is_pending_or_active(id, intid));
    }
}

/// Gives the loaded, debug-dirty vCPU `v` the hardware breakpoint and
/// watchpoint registers: its saved values in, MDCR_EL2.TDA clear.
fn arm_debug(v: &Vcpu) {
    context::load_break_watch(&v.el1.debug.regs, el2::debug_slots());
    el2::set_debug_trap(v.el1.debug.traps());
}

/// Gives the loaded vCPU `v`, whose vPMU is placed on the hardware, the
/// PMU: its saved registers in, the MDCR_EL2 PMU traps lifted.
fn arm_pmu(v: &Vcpu) {
    pmu::restore(&v.pmu.regs, pmu_counters());
    pmu::set_trap(false);
}

/// WFI: block unless an interrupt is already deliverable. The check and the
/// block happen under the vGIC lock so an injection cannot slip between.
/// `limit` (ns, u64::MAX = none) ends a WFIT's wait: the pCPU where the vCPU
/// is saved watches it on the EL2 timer (`arm_timer`, `timer_expired`).
/// GICv4: an interrupt the vGIC holds ends the wait with the vPE left
/// resident; otherwise the vPE is made non-resident first, and a vLPI
/// pending then (PendingLast), a doorbell since (`vlpi_pending`) or an
/// interrupt the vGIC got meanwhile wakes the vCPU as soon as it blocked:
/// it comes back through the scheduler, like any vCPU whose vPE was put.
fn block(vm: &Vm, me: usize, v: &mut Vcpu, limit: u64) -> Next {
    let id = v.id;
    let now = now_ns();
    if limit <= now {
        return Next::Enter;
    }
    // Its physical timer may have come due since the last exit.
    ptimer_sync(vm, me, v, false);
    let was_resident = v.vpe_resident;
    if was_resident {
        if resampled(vm, me, v).has_deliverable(id) {
            return Next::Enter;
        }
        crate::runtime::vpe::put(vm, me, id);
        v.vpe_resident = false;
    }
    let vgic = resampled(vm, me, v);
    let pending = vgic.has_deliverable(id) || vm.shared[id].vlpi_pending.load(Ordering::Acquire);
    if pending && !was_resident {
        return Next::Enter;
    }
    // No WFIT limit (a plain WFI) leaves `wake_at` as the load cleared it.
    if limit != u64::MAX {
        vm.shared[id].wake_at.store(limit, Ordering::Release);
        percpu::note_timers_changed(vm.shared[id].vtimer_home.load(Ordering::Relaxed));
    }
    let r = vm.sched.block(now_ns(), me);
    drop(vgic);
    match r {
        Ok(_) if pending => {
            // The vPE was just put and an interrupt is here already (its
            // PendingLast: a vLPI that came after the guest's WFI trapped,
            // or one emulated since the first look). The vCPU blocks and is
            // woken at once rather than loading the vPE again as it is: its
            // next turn is a schedule-in, so the vPE goes resident once per
            // schedule-in, whichever way the vCPU comes back. No doorbell
            // rang for it: the wake counts as an interrupt's.
            wake_vcpu(vm, me, id, now_ns(), WakeCause::Interrupt);
            Next::Schedule
        }
        Ok(_) => Next::Schedule,
        Err(e) => {
            warn!("vCPU{id}: block: {e}");
            vm.shared[id].wake_at.store(u64::MAX, Ordering::Release);
            if was_resident {
                v.vpe_resident = crate::runtime::vpe::load(vm, me, id);
            }
            Next::Enter
        }
    }
}
