//! One vCPU's turn on this pCPU: entry, exit, the list registers and the
//! physical interrupts around it, until it blocks, yields or is preempted.

use super::exit::{handle_sync, spin_watch, yield_cpu};
use super::inject::serror_from_guest;
use super::irq::handle_irqs;
use super::*;
use crate::runloop::lrs;
use crate::runtime::devices::vgic::deactivate_hw;

/// `lrs_dirty`: whether the hardware LRs may hold anything but zeros
/// (the last entry on this pCPU used them); updated at the vCPU's last exit.
/// `watch`: its spin watch as the scheduler left it (`exit::spin_watch`).
/// `hvctl pause`: the vCPU blocks without running; a wake brings it back
/// to `run_vcpu`, `hvctl unpause` wakes it for good. Out of the entry
/// path's line.
#[cold]
#[inline(never)]
fn block_paused(vm: &Vm, me: usize, id: usize) {
    if let Err(e) = vm.sched.block(now_ns(), me) {
        warn!("d{} vCPU{id}: pausing: {e}", vm.domid);
    }
}

pub(super) fn run_vcpu(
    vm: &'static Vm,
    me: usize,
    id: usize,
    deadline: &mut Option<u64>,
    lrs_dirty: &mut bool,
    mut watch: Option<crate::sched::spin::Watch>,
) {
    if vm.stopped.load(Ordering::Acquire) {
        // Its domain stopped while this vCPU was away: it goes offline.
        vm.shared[id].online.store(false, Ordering::Release);
        if let Err(e) = vm.sched.power_off(now_ns(), me) {
            warn!("d{} vCPU{id}: stopping: {e}", vm.domid);
        }
        return;
    }
    if vm.paused.load(Ordering::Acquire) {
        return block_paused(vm, me, id);
    }
    let mut guard = vm.vcpus[id].lock();
    let v: &mut Vcpu = &mut guard;
    let here = pcpu(me);
    vm.shared[id].running_on.store(me, Ordering::Release);
    here.running.store(id, Ordering::Release);
    load_vcpu(vm, me, v);
    follow_routes(vm, me, v);
    // Sampled for spinning while a sibling is preempted (`sched::spin`).
    let mut spin = SpinDetector::new();
    // The hardware LRs keep what the last entry here put there.
    let mut dirty = *lrs_dirty;
    loop {
        dirty = load_lrs(vm, v, id, dirty);
        // The sampling period starts after the entry work: however long
        // that work takes (flushing many LPIs, a slow exit path), the guest
        // runs for a whole period between two samples. Armed before it, a
        // period shorter than the work would expire before the guest ran
        // an instruction, every time: a vCPU that never progresses, found
        // "spinning" at one PC and yielded forever.
        let sample = watch.map(|w| now_ns().saturating_add(w.sample_ns()));
        // Its physical timer's line rises while it runs: an exit then.
        let pt = v.ptimer.watch_ns(v.ptimer_level, percpu::cntfrq());
        let wake = sample.into_iter().chain((pt != u64::MAX).then_some(pt)).min();
        arm_timer(me, here, deadline, wake);
        // In counter ticks: converted only for the spin watch, on IRQ exits.
        let entered = percpu::counter();
        let GuestExit { kind, serror } = run_guest(&mut v.regs);
        let ran = percpu::counter().saturating_sub(entered);
        if v.vserror.is_pending() {
            v.vserror.on_exit(el2::hcr());
        }
        if let Some(disr) = serror {
            // Pending when this vCPU exited: its own, whatever the exit.
            serror_from_guest(vm, v, disr);
        }
        save_lrs(vm, me, v, id, dirty);
        after_exit(vm, me, v, id);
        let next = match kind {
            ExitKind::Sync => {
                spin.reset();
                handle_sync(vm, me, v)
            }
            ExitKind::Irq | ExitKind::Fiq => irq_exit(vm, me, v, deadline, ran, &mut spin, &mut watch),
            ExitKind::SError => {
                rec(vm, me, Event::Exit { vcpu: vm.gid(id).0 as u16, class: ExitClass::SError });
                serror_from_guest(vm, v, el2::exit_syndrome().esr);
                Next::Enter
            }
        };
        if next == Next::Schedule || here.resched.load(Ordering::Acquire) || vm.stopped.load(Ordering::Acquire) {
            break;
        }
        if let Some(d) = *deadline {
            // The clock is read only once the EL2 timer, armed at or before
            // `d`, fired. A deadline moved earlier by this exit's handling
            // is taken at the next entry, whose timer fires at once.
            if percpu::hyp_timer_fired() && now_ns() >= d {
                break;
            }
        }
    }
    *lrs_dirty = dirty;
    // Where the guest was at its last exit: inside a critical section or not.
    let masked = CritEvidence::from_spsr(v.regs.spsr) == CritEvidence::IrqsMasked;
    vm.shared[id].left_masked.store(masked, Ordering::Relaxed);
    save_vcpu(vm, me, v);
    here.running.store(usize::MAX, Ordering::Release);
    vm.shared[id].running_on.store(usize::MAX, Ordering::Release);
}

/// Entry: the vGIC's pending interrupts into the LRs (`runloop::lrs::load`).
/// Returns whether the LRs hold anything now.
#[inline(always)]
fn load_lrs(vm: &Vm, v: &mut Vcpu, id: usize, lrs_dirty: bool) -> bool {
    let l = lrs::load(&vm.vgic, id, &mut v.lrs[..vm.nr_lrs], lrs_dirty);
    if l.filled != 0 {
        vm.shared[id].counters.irqs_injected.fetch_add(l.filled as u64, Ordering::Relaxed);
    }
    l.used
}

/// Exit: the LRs read back and folded into the vGIC when they held
/// anything (`runloop::lrs::save`), EOIed HW interrupts deactivated, kicks
/// sent.
#[inline(always)]
fn save_lrs(vm: &Vm, me: usize, v: &mut Vcpu, id: usize, lrs_used: bool) {
    let saved = lrs::save(&vm.vgic, id, &mut v.lrs[..vm.nr_lrs], lrs_used);
    if let Some(s) = &saved {
        if !s.hw.is_empty() {
            deactivate_hw(vm, me, id, &s.hw);
        }
    }
    v.pmu_ppi_set |= resync_private_active(vm, me, id);
    if let Some(s) = saved {
        process_kicks(vm, me, s.kicks, WakeCause::Interrupt);
    }
}

/// Every exit's bookkeeping: the count, the emulated physical timer's
/// line, the end of a lock holder's grace.
#[inline(always)]
fn after_exit(vm: &Vm, me: usize, v: &mut Vcpu, id: usize) {
    inc(&vm.shared[id].counters.exits);
    if v.ptimer.ctl & 1 != 0 {
        ptimer_sync(vm, me, v, false);
    }
    if let Some(g) = v.lhp_grace.filter(|&g| grace_ends(g, v.regs.spsr)) {
        // The critical section the SGI trap's grace was for is over.
        v.lhp_grace = None;
        if g.in_handler() {
            vm.vgic.lock().watch_active_eoi(id, false);
        }
        let a = vm.sched.note_critical_exit(now_ns(), me, CritEvidence::None);
        do_wake_action(me, a.unwrap_or(WakeAction::None));
    }
}

/// Whether this exit ends the lock-holder grace `g` (the guest's active
/// priorities are read only when its IRQs are still masked and the grace
/// was opened inside a handler).
#[inline(always)]
fn grace_ends(g: GraceWatch, spsr: u64) -> bool {
    let evidence = CritEvidence::from_spsr(spsr);
    if evidence == CritEvidence::None || !g.in_handler() {
        return evidence == CritEvidence::None;
    }
    g.ends(evidence, gic::active_group1_priorities())
}

/// An IRQ exit: the physical interrupts taken, then the spin watch's
/// sample (`ran`: counter ticks the guest ran) — a vCPU found spinning
/// while a sibling is preempted yields.
#[inline(always)]
fn irq_exit(
    vm: &Vm,
    me: usize,
    v: &mut Vcpu,
    deadline: &mut Option<u64>,
    ran: u64,
    spin: &mut SpinDetector,
    watch: &mut Option<crate::sched::spin::Watch>,
) -> Next {
    let id = v.id;
    rec(vm, me, Event::Exit { vcpu: vm.gid(id).0 as u16, class: ExitClass::Irq });
    let evidence = CritEvidence::from_spsr(v.regs.spsr);
    if evidence == CritEvidence::IrqsMasked {
        rec(vm, me, Event::IrqsOff { vcpu: vm.gid(id).0 as u16, pc: v.regs.elr });
    }
    inc(&vm.shared[id].counters.irq_exits);
    if handle_irqs(me, Some((vm, id)), deadline) {
        inc(&vm.shared[id].counters.irq_exits_msi);
    }
    *watch = spin_watch(vm, id);
    let ran_ns = percpu::ticks_to_ns(ran);
    if watch.is_some_and(|w| spin.sample(ran_ns, v.regs.elr, evidence, w.spin_ns())) {
        // A lock or flag wait whose WFE did not trap: as on WFE.
        inc(&vm.shared[id].counters.spin_yields);
        yield_cpu(vm, me, id)
    } else {
        Next::Enter
    }
}

/// Passthrough SPIs that the guest routes to vCPU `v` are routed
/// physically to this pCPU while `v` runs here, so they arrive where they
/// are injected (no IPI to another pCPU). Only changes are written, and only
/// for SPIs the guest enabled: an ACPI Dom0 has every SPI forwarded and
/// routed to one vCPU, most of them never used. Nothing is walked when `v`
/// comes back to the pCPU it last followed them on and no SPI's route or
/// enable changed since (`Vgic::route_gen`): only its own walk moves the
/// SPIs routed to it.
pub(super) fn follow_routes(vm: &Vm, me: usize, v: &mut Vcpu) {
    if vm.nr_pcpus < 2 || vm.forwarded.is_empty() {
        return;
    }
    let id = v.id;
    let vgic = vm.vgic.read();
    let seen = Some((me, vgic.route_gen()));
    if v.routes_followed == seen {
        return;
    }
    v.routes_followed = seen;
    for (i, &intid) in vm.forwarded.iter().enumerate() {
        // A plain load first: the swap (an exclusive-access loop) only for
        // a route that moves.
        if vm.forwarded_pcpu[i].load(Ordering::Acquire) != me
            && vgic.route_of(intid) == Some(id)
            && vgic.spi_enabled(intid)
            && vm.forwarded_pcpu[i].swap(me, Ordering::AcqRel) != me
        {
            gic::route_spi(intid, pcpu(me).mpidr.load(Ordering::Relaxed));
        }
    }
}

/// The `ppi_resync` requests for vCPU `id`, running here: set each forwarded
/// private interrupt's physical active state to the vGIC's view.
/// Checked at every exit, inline; the work (rare) is out of line.
/// Returns whether there were any.
#[inline]
pub(super) fn resync_private_active(vm: &Vm, me: usize, id: usize) -> bool {
    let any = vm.shared[id].ppi_resync.load(Ordering::Relaxed) != 0;
    if any {
        resync_private_active_now(vm, me, id);
    }
    any
}

#[inline(never)]
fn resync_private_active_now(vm: &Vm, me: usize, id: usize) {
    let bits = vm.shared[id].ppi_resync.swap(0, Ordering::AcqRel);
    let vgic = vm.vgic.read();
    let private = (0..IntId::PRIVATE_COUNT).filter(|i| bits & (1 << i) != 0);
    for intid in private.filter_map(|i| IntId::try_from(i).ok()) {
        if let Some(p) = vgic.hw_of(id, intid) {
            let busy = vgic.is_pending_or_active(id, intid);
            gic::set_private_active(me, p, busy);
        }
    }
}
