//! Running vCPUs on pCPUs: the per-pCPU scheduling loop, guest entry and
//! exit, and every trap (WFI/WFE, HVC/SMC PSCI, system registers, MMIO,
//! aborts, physical interrupts).
//!
//! Two tables dispatch: a physical interrupt goes where the VM's IRQ route
//! table (`Vm::routes`, `crate::irq`) says, a trapped MMIO access to the
//! device the VM's MMIO bus (`Vm::bus`, `crate::mmio_bus`) names; each arm of
//! those `match`es is one small handler below.
//!
//! Locking: a pCPU holds a vCPU's context lock from load to save. The vGIC
//! lock is taken before the scheduler lock when both are needed (a WFI check
//! and the block that follows must be atomic against a concurrent injection,
//! or a wake could be lost), and never while waiting for a vCPU lock. The
//! route table's read lock is a leaf: taken for one lookup, released before
//! the interrupt is handled.

use super::console;
use super::percpu::{self, now_ns, pcpu, SGI_KICK};
use super::vm::{inc, vcpu_of, vms, Vcpu, Vm, SPSR_EL1H_MASKED};
use super::wake::{do_wake_action, process_kicks, rec, wake_vcpu};
use crate::arch::exception::{run_guest, ExitKind, GuestExit, GuestRegs};
use crate::arch::{context, el2, gic, pmu, smc, sysreg};
use crate::domain::console::Key;
use crate::esr::{self, Exit, MmioAccess};
use crate::intid::IntId;
use crate::iomem::IoMemDecision;
use crate::irq::Route;
use crate::mmio_bus::Device;
use crate::psci::{self, Call};
use crate::regs::ISS_ABORT;
use crate::sched::spin::{self, SpinDetector};
use crate::sched::{CritEvidence, WakeAction, WakeCause};
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
        console::enable_rx_irq();
        // Input that arrived before: enabling the interrupt cleared its
        // pending state, and a full physical FIFO never raises it again.
        console_input(me);
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
    let mut seen: alloc::vec::Vec<u16> = alloc::vec::Vec::new();
    loop {
        pcpu(me).resched.store(false, Ordering::Relaxed);
        let now = now_ns();
        let d = vm.sched.lock().schedule(now, me);
        let d = match d {
            Ok(d) => d,
            Err(e) => {
                warn!("pCPU{me}: scheduler: {e}");
                Default::default()
            }
        };
        log::trace!("pCPU{me}: schedule -> {:?}", d);
        vm.trace[me].lock().decision(now, &d);
        dump_if_outlier(me, now, &d);
        if let Some(k) = d.kick {
            rec(vm, me, Event::Kick { pcpu: k as u16 });
            percpu::kick(k);
        }
        deadline = d.timer_at;
        match d.next.and_then(vcpu_of) {
            Some((guest, v)) => {
                if loaded != Some(guest.vmid) {
                    let first = !seen.contains(&guest.vmid);
                    load_vm(guest, first);
                    if first {
                        seen.push(guest.vmid);
                    }
                    loaded = Some(guest.vmid);
                }
                run_vcpu(guest, me, v, &mut deadline)
            }
            None => {
                arm_timer(me, &mut deadline, None);
                if !pcpu(me).resched.load(Ordering::Acquire) {
                    sysreg::wfi();
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
fn arm_timer(me: usize, deadline: &mut Option<u64>, sample: Option<u64>) {
    let p = pcpu(me);
    let req = p.rearm_at.swap(u64::MAX, Ordering::AcqRel);
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
    vm.shared[v.id].vtimer_deadline.store(u64::MAX, Ordering::Release);
    vm.shared[v.id].wake_at.store(u64::MAX, Ordering::Release);
    vm.shared[v.id].ptimer_deadline.store(u64::MAX, Ordering::Release);
    percpu::note_timers_changed(vm.shared[v.id].vtimer_home.load(Ordering::Relaxed));
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
        let mut vgic = vm.vgic.lock();
        load_forwarded_ppi(&mut vgic, me, v.id, vt, line);
        // The PMU's overflow line is a level too, as its saved registers
        // drive it; set before they go back on the PMU, which raises the
        // physical line again.
        if let Some(p) = vm.pmu_intid {
            load_forwarded_ppi(&mut vgic, me, v.id, p, v.pmu.regs.line());
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

/// Switch-in of forwarded private interrupt `intid` of vCPU `id`, whose
/// source's output is the level `line`: a pending state the guest has not
/// acknowledged ends if the line dropped while the vCPU was away; then,
/// while its virtual interrupt is pending or active, the physical PPI is
/// kept active so it does not fire again.
fn load_forwarded_ppi(vgic: &mut crate::vgic::Vgic, me: usize, id: usize, intid: IntId, line: bool) {
    // Err: not forwarded for this VM, nothing to resample.
    let _ = vgic.resample_hw_private(id, intid, line);
    gic::set_private_active(me, intid, vgic.is_pending_or_active(id, intid));
}

/// PMCR_EL0.N of this machine's PMU (0 without one).
fn pmu_counters() -> u8 {
    el2::cpu_features().pmu.map_or(0, |p| p.counters)
}

fn save_vcpu(vm: &Vm, me: usize, v: &mut Vcpu) {
    if let Some(p) = vm.pmu_intid {
        if v.pmu.placement == Placement::Loaded {
            pmu::save(&mut v.pmu.regs, pmu_counters());
            v.pmu.on_save();
            pmu::set_trap(true);
        }
        gic::set_private_active(me, p, false);
    }
    v.el1.save(); // also stops the guest's timer
    if v.el1.debug.dirty {
        context::save_break_watch(&mut v.el1.debug.regs, el2::debug_slots());
        el2::set_debug_trap(true);
        v.el1.debug.switched_out(v.el1.mdscr);
    }
    v.fp.save();
    v.gicif.save();
    if v.vpe_resident {
        super::vpe::put(vm, me, v.id);
        v.vpe_resident = false;
    }
    if v.vserror.is_pending() {
        // Not taken yet: it stays the vCPU's, not the pCPU's.
        el2::set_hcr(VirtualSError::on_switch_out(el2::hcr()));
    }
    gic::set_private_active(me, vm.virt_timer_intid, false);
    let busy = vm.vgic.lock().is_pending_or_active(v.id, vm.virt_timer_intid);
    let (ctl, cval) = (v.el1.cntv_ctl, v.el1.cntv_cval);
    let deadline = crate::time::saved_vtimer_deadline_ns(ctl, cval, percpu::cntfrq(), vm.timer_slop_ns, busy);
    vm.shared[v.id].vtimer_home.store(me, Ordering::Relaxed);
    vm.shared[v.id].vtimer_deadline.store(deadline, Ordering::Release);
    let pt = v.ptimer.watch_ns(v.ptimer_level, percpu::cntfrq());
    vm.shared[v.id].ptimer_deadline.store(pt, Ordering::Release);
    percpu::note_timers_changed(me);
}

/// Drives vCPU `v`'s EL1 physical timer line into the vGIC when it changed
/// (always when `force`), kicking whoever the interrupt concerns.
fn ptimer_sync(vm: &Vm, me: usize, v: &mut Vcpu, force: bool) {
    let line = v.ptimer.line(percpu::counter());
    if line == v.ptimer_level && !force {
        return;
    }
    v.ptimer_level = line;
    let k = vm.vgic.lock().set_level(vm.phys_timer_intid, v.id, line);
    if let Ok(k) = k {
        process_kicks(vm, me, k, WakeCause::Timer);
    }
}

/// A trapped CNTP_CTL/CVAL/TVAL access: the emulated timer's registers.
fn ptimer_access(vm: &Vm, me: usize, v: &mut Vcpu, s: &esr::SysRegAccess, reg: crate::ptimer::PtimerReg) {
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

fn run_vcpu(vm: &'static Vm, me: usize, id: usize, deadline: &mut Option<u64>) {
    if vm.stopped.load(Ordering::Acquire) {
        // Its domain stopped while this vCPU was away: it goes offline.
        vm.shared[id].online.store(false, Ordering::Release);
        if let Err(e) = vm.sched.lock().power_off(now_ns(), me) {
            warn!("d{} vCPU{id}: stopping: {e}", vm.domid);
        }
        return;
    }
    let mut guard = vm.vcpus[id].lock();
    let v: &mut Vcpu = &mut guard;
    let here = pcpu(me);
    vm.shared[id].running_on.store(me, Ordering::Release);
    here.running.store(id, Ordering::Release);
    load_vcpu(vm, me, v);
    follow_routes(vm, me, id);
    let n = vm.nr_lrs;
    // Sampled for spinning while a sibling is preempted (`sched::spin`).
    let mut spin = SpinDetector::new();
    let mut watch = spin_watch(vm, id);
    // Whether the hardware LRs may hold anything but zeros: they keep what
    // the vCPU that last ran here left, so the first entry writes them all.
    let mut lrs_dirty = true;
    loop {
        let fr = vm.vgic.lock().flush_lrs(id, &mut v.lrs[..n]);
        if fr.filled != 0 {
            vm.shared[id].counters.irqs_injected.fetch_add(fr.filled as u64, Ordering::Relaxed);
        }
        // All-zero LRs that are already zero in hardware need no write, and
        // then the exit has nothing to read back or fold into the model.
        let lrs_used = v.lrs[..n].iter().any(|&lr| lr != 0);
        if lrs_used || lrs_dirty {
            for i in 0..n {
                gic::write_lr(i, v.lrs[i]);
            }
        }
        lrs_dirty = lrs_used;
        gic::vcpu_if_on(fr.overflow);
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
        arm_timer(me, deadline, wake);
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
        // With no LR in use the model's state is as `flush_lrs` left it:
        // `sync_lrs` would find no LR to fold back, queue no deactivation
        // and kick nobody (the vGIC's MMIO writes take their own
        // deactivations), so the exit skips the vGIC lock.
        if lrs_dirty {
            for i in 0..n {
                v.lrs[i] = gic::read_lr(i);
            }
        }
        gic::vcpu_if_off();
        let kicks = lrs_dirty.then(|| {
            let (kicks, hw) = {
                let mut vgic = vm.vgic.lock();
                (vgic.sync_lrs(id, &mut v.lrs[..n]), vgic.take_hw_deactivations())
            };
            if !hw.is_empty() {
                deactivate_hw(vm, me, id, hw);
            }
            kicks
        });
        resync_private_active(vm, me, id);
        if let Some(kicks) = kicks {
            process_kicks(vm, me, kicks, WakeCause::Interrupt);
        }
        inc(&vm.shared[id].counters.exits);
        if v.ptimer.ctl & 1 != 0 {
            ptimer_sync(vm, me, v, false);
        }
        if v.lhp_grace && CritEvidence::from_spsr(v.regs.spsr) == CritEvidence::None {
            // The critical section the SGI trap's grace was for is over.
            v.lhp_grace = false;
            let a = vm.sched.lock().note_critical_exit(now_ns(), me, CritEvidence::None);
            do_wake_action(me, a.unwrap_or(WakeAction::None));
        }
        let next = match kind {
            ExitKind::Sync => {
                spin.reset();
                handle_sync(vm, me, v)
            }
            ExitKind::Irq | ExitKind::Fiq => {
                rec(vm, me, Event::Exit { vcpu: vm.gid(id).0 as u16, class: ExitClass::Irq });
                let evidence = CritEvidence::from_spsr(v.regs.spsr);
                if evidence == CritEvidence::IrqsMasked {
                    rec(vm, me, Event::IrqsOff { vcpu: vm.gid(id).0 as u16, pc: v.regs.elr });
                }
                inc(&vm.shared[id].counters.irq_exits);
                if handle_irqs(me, Some((vm, id)), deadline) {
                    inc(&vm.shared[id].counters.irq_exits_msi);
                }
                watch = spin_watch(vm, id);
                let ran_ns = percpu::ticks_to_ns(ran);
                if watch.is_some_and(|w| spin.sample(ran_ns, v.regs.elr, evidence, w.spin_ns())) {
                    // A lock or flag wait whose WFE did not trap: as on WFE.
                    inc(&vm.shared[id].counters.spin_yields);
                    yield_cpu(vm, me, id)
                } else {
                    Next::Enter
                }
            }
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
            if now_ns() >= d {
                break;
            }
        }
    }
    // Where the guest was at its last exit: inside a critical section or not.
    let masked = CritEvidence::from_spsr(v.regs.spsr) == CritEvidence::IrqsMasked;
    vm.shared[id].left_masked.store(masked, Ordering::Relaxed);
    save_vcpu(vm, me, v);
    pcpu(me).running.store(usize::MAX, Ordering::Release);
    vm.shared[id].running_on.store(usize::MAX, Ordering::Release);
}

/// Passthrough SPIs that the guest routes to vCPU `id` are routed
/// physically to this pCPU while `id` runs here, so they arrive where they
/// are injected (no IPI to another pCPU). Only changes are written, and only
/// for SPIs the guest enabled: an ACPI Dom0 has every SPI forwarded and
/// routed to one vCPU, most of them never used.
fn follow_routes(vm: &Vm, me: usize, id: usize) {
    if vm.nr_pcpus < 2 || vm.forwarded.is_empty() {
        return;
    }
    let vgic = vm.vgic.lock();
    for (i, &intid) in vm.forwarded.iter().enumerate() {
        if vgic.route_of(intid) == Some(id)
            && vgic.spi_enabled(intid)
            && vm.forwarded_pcpu[i].swap(me, Ordering::AcqRel) != me
        {
            gic::route_spi(intid, pcpu(me).mpidr.load(Ordering::Relaxed));
        }
    }
}

/// Deactivates the physical side of forwarded interrupts whose virtual state
/// the guest ended by ICPENDR/ICACTIVER (`Vgic::take_hw_deactivations`);
/// `cur` is the vCPU running on this pCPU. An SPI is deactivated in the
/// distributor. A private interrupt (the virtual timer) is active on the
/// pCPU that runs its vCPU: here, or that pCPU re-derives it at its next
/// exit; a vCPU that is not running gets it derived when it is loaded.
fn deactivate_hw(vm: &Vm, me: usize, cur: usize, list: alloc::vec::Vec<crate::vgic::HwDeactivation>) {
    for d in list {
        if d.intid.is_spi() {
            gic::clear_spi_active(d.pintid);
        } else if d.vcpu == cur {
            gic::set_private_active(me, d.pintid, false);
        } else if let Some(s) = vm.shared.get(d.vcpu) {
            s.ppi_resync.fetch_or(1 << u32::from(d.intid), Ordering::AcqRel);
            let p = s.running_on.load(Ordering::Acquire);
            if p != usize::MAX && p != me {
                percpu::kick(p);
            }
        }
    }
}

/// The `ppi_resync` requests for vCPU `id`, running here: set each forwarded
/// private interrupt's physical active state to the vGIC's view.
fn resync_private_active(vm: &Vm, me: usize, id: usize) {
    let s = &vm.shared[id];
    if s.ppi_resync.load(Ordering::Relaxed) == 0 {
        return;
    }
    let bits = s.ppi_resync.swap(0, Ordering::AcqRel);
    let vgic = vm.vgic.lock();
    let private = (0..IntId::PRIVATE_COUNT).filter(|i| bits & (1 << i) != 0);
    for intid in private.filter_map(|i| IntId::try_from(i).ok()) {
        if let Some(p) = vgic.hw_of(id, intid) {
            let busy = vgic.is_pending_or_active(id, intid);
            gic::set_private_active(me, p, busy);
        }
    }
}

/// Takes every pending physical interrupt. `cur` is the VM and vCPU on this
/// pCPU. Physical interrupts belong to Dom0 or to the hypervisor (DomUs get
/// none), so each goes where Dom0's `Vm::routes` says, except the virtual
/// timer, which is the running vCPU's. Forwarded interrupts (virtual timer,
/// passthrough SPIs) only get a priority drop here, the guest's deactivation
/// ends them; everything else is dropped and deactivated. Returns whether
/// one of them delivered a guest MSI (its host LPI, or a GICv4 doorbell).
fn handle_irqs(me: usize, cur: Option<(&Vm, usize)>, deadline: &mut Option<u64>) -> bool {
    let mut msi = false;
    let vm = vms()[0];
    // Dom0's vCPU here, if it is Dom0's.
    let cur0 = cur.filter(|(g, _)| g.domid == 0).map(|(_, v)| v);
    while let Some(id) = gic::ack() {
        let route = vm.routes.read().lookup(id);
        vm.irq_counters.record(route);
        msi |= matches!(route, Some(Route::GuestLpi { .. } | Route::Doorbell { .. }));
        match route {
            Some(Route::VirtualTimer | Route::Pmu) => forwarded_ppi_irq(id, cur),
            Some(Route::PhysDisk) => phys_disk_irq(vm, me, id),
            Some(Route::ForwardedSpi { vintid }) => forwarded_spi_irq(vm, me, id, vintid, cur0),
            Some(Route::Console) => {
                console::transmit();
                console_input(me);
                eoi_deactivate(id);
            }
            Some(Route::HypTimer) => hyp_timer_irq(me, id, deadline),
            Some(Route::GuestLpi { devid, eventid }) => super::its::guest_lpi(vm, me, id, devid, eventid),
            Some(Route::Doorbell { vcpu }) => super::vpe::doorbell(vm, me, id, vcpu),
            // SGI_KICK, maintenance: the exit itself was the point; requests
            // are in pcpu(me), list registers are refilled at entry.
            // Unrouted: the default.
            Some(Route::Kick) | None => eoi_deactivate(id),
        }
    }
    msi
}

/// Priority drop and deactivation (EOImode = 1).
fn eoi_deactivate(id: IntId) {
    gic::eoi(id);
    gic::deactivate(id);
}

/// The virtual timer's or the PMU's PPI, forwarded to the vCPU running
/// here: it stays active until the guest deactivates it. With no vCPU here
/// there is nobody to give it to.
fn forwarded_ppi_irq(id: IntId, cur: Option<(&Vm, usize)>) {
    gic::eoi(id);
    match cur {
        Some((vm, v)) => {
            let _ = vm.vgic.lock().inject_edge(id, v);
        }
        None => gic::deactivate(id),
    }
}

/// The physical disk behind the guest's virtio-blk finished work.
fn phys_disk_irq(vm: &Vm, me: usize, id: IntId) {
    let Some(disk) = vm.disk.as_ref() else {
        return eoi_deactivate(id);
    };
    let level = disk.collect(now_ns(), me);
    eoi_deactivate(id);
    if let Some(l) = level {
        disk_irq(vm, me, disk, l);
    }
}

/// A passthrough device's SPI: injected as HW interrupt `vintid`, so the
/// guest's deactivation deactivates the physical one.
fn forwarded_spi_irq(vm: &Vm, me: usize, id: IntId, vintid: IntId, cur: Option<usize>) {
    gic::eoi(id);
    let kicks = vm.vgic.lock().inject_edge(vintid, cur.unwrap_or(0));
    if let Ok(k) = kicks {
        process_kicks(vm, me, k, WakeCause::Interrupt);
    }
}

/// The EL2 timer: stopped here, re-armed by the run loop (`arm_timer`).
fn hyp_timer_irq(me: usize, id: IntId, deadline: &mut Option<u64>) {
    eoi_deactivate(id);
    pcpu(me).arm_hyp_timer(None);
    vms()[0].trace[me].lock().note_fire(now_ns());
    timer_expired(me, deadline);
}

/// Bytes [`console_input`] reads from the physical UART per call: an endless
/// flood cannot keep pCPU0 in one interrupt (the level-sensitive line brings
/// it back for the rest).
const CONSOLE_RX_BATCH: usize = 1024;

/// Physical console input: the UART is read into the hypervisor's input
/// ring whatever the domains do (`console::receive`), the focused domain's
/// emulated UART takes what fits in its FIFO (the rest waits in the ring
/// until the guest reads, see `uart_mmio`) and its interrupt line is
/// mirrored. Ctrl-\ prints the statistics and dumps the flight recorder;
/// Ctrl-A three times moves the focus to the next domain with a console and
/// the rest of the input goes there. Neither waits for any guest.
fn console_input(me: usize) {
    let mut budget = CONSOLE_RX_BATCH;
    loop {
        let (focus, key, read) = console::receive(budget);
        let vm = deliver_input(focus, me);
        match key {
            None => break,
            Some(Key::Dump) => {
                print_stats();
                dump_trace(vm, DumpReason::Key, 0);
            }
            Some(Key::Switch) => switch_input(focus),
        }
        budget = budget.saturating_sub(read);
        if budget == 0 {
            break;
        }
    }
}

/// Moves input from the ring into domain `dom`'s emulated UART while its
/// FIFO has room, and mirrors its interrupt line; returns its VM.
fn deliver_input(dom: crate::domain::DomainId, me: usize) -> &'static Vm {
    let all = vms();
    let vm = all.iter().copied().find(|v| v.domid == dom).unwrap_or(all[0]);
    let level = {
        let mut u = vm.uart.lock();
        u.pump_rx(&mut console::RingRx { dom });
        u.irq_level()
    };
    if let Ok(k) = vm.vgic.lock().set_level(vm.uart_intid, 0, level) {
        process_kicks(vm, me, k, WakeCause::Interrupt);
    }
    vm
}

/// The third Ctrl-A: console input goes to the next domain that can take
/// it (`domain::console::input_targets`: Dom0, and running DomUs with a
/// vPL011); what the old focus has not taken is dropped.
fn switch_input(from: crate::domain::DomainId) {
    let doms: alloc::vec::Vec<_> =
        vms().iter().map(|v| (v.domid, v.uart_region.is_some(), v.stopped.load(Ordering::Acquire))).collect();
    let to = crate::domain::console::next_domain(from, &crate::domain::console::input_targets(&doms));
    crate::hvprintln!("(HV) input to d{to}");
    console::set_input_focus(to);
}

/// Mirrors the disk's interrupt line into the vGIC (and wakes its target).
fn disk_irq(vm: &Vm, me: usize, disk: &super::vblk::VDisk, level: bool) {
    if let Ok(k) = vm.vgic.lock().set_level(disk.intid, 0, level) {
        process_kicks(vm, me, k, WakeCause::Interrupt);
    }
}

/// The EL2 timer fired: in every VM, virtual timers of saved vCPUs and disk
/// completions; then the scheduler.
fn timer_expired(me: usize, deadline: &mut Option<u64>) {
    let now = now_ns();
    for vm in vms() {
        vm_timers_expired(vm, me, now);
    }
    // Deadlines that passed were consumed: the next arm looks again.
    percpu::note_timers_changed(me);
    if deadline.is_some_and(|d| d <= now) {
        *deadline = None;
        pcpu(me).resched.store(true, Ordering::Release);
    }
}

/// One VM's part of `timer_expired`.
fn vm_timers_expired(vm: &Vm, me: usize, now: u64) {
    if let Some(disk) = &vm.disk {
        if disk.home.load(Ordering::Acquire) == me {
            if let Some(level) = disk.poll(now, me) {
                disk_irq(vm, me, disk, level);
            }
        }
    }
    for (v, s) in vm.shared.iter().enumerate() {
        if s.vtimer_home.load(Ordering::Relaxed) != me || s.running_on.load(Ordering::Acquire) != usize::MAX {
            continue;
        }
        let d = s.vtimer_deadline.load(Ordering::Acquire);
        if d <= now && s.vtimer_deadline.compare_exchange(d, u64::MAX, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            s.vtimer_fired.fetch_min(d, Ordering::AcqRel);
            if let Ok(k) = vm.vgic.lock().inject_edge(vm.virt_timer_intid, v) {
                process_kicks(vm, me, k, WakeCause::Timer);
            }
        }
        let p = s.ptimer_deadline.load(Ordering::Acquire);
        if p <= now && s.ptimer_deadline.compare_exchange(p, u64::MAX, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            // Its physical timer's line rose; `load_vcpu` takes it from here.
            if let Ok(k) = vm.vgic.lock().set_level(vm.phys_timer_intid, v, true) {
                process_kicks(vm, me, k, WakeCause::Timer);
            }
        }
        // The limit of a WFIT: the vCPU runs again, with nothing injected.
        let w = s.wake_at.load(Ordering::Acquire);
        if w <= now && s.wake_at.compare_exchange(w, u64::MAX, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            wake_vcpu(vm, me, v, now, WakeCause::Timer);
        }
    }
}

fn handle_sync(vm: &Vm, me: usize, v: &mut Vcpu) -> Next {
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
                // A lock holder sends its wake-up IPIs with IRQs masked: only
                // then does a wake-preemption of this vCPU wait (a grace).
                let evidence = CritEvidence::from_spsr(v.regs.spsr);
                let a = vm.sched.lock().note_critical_exit(now_ns(), me, evidence);
                v.lhp_grace = evidence == CritEvidence::IrqsMasked;
                do_wake_action(me, a.unwrap_or(WakeAction::None));
                let kicks = vm.vgic.lock().send_sgi(v.id, value);
                if let Ok(k) = kicks {
                    process_kicks(vm, me, k, WakeCause::Sgi);
                }
                v.regs.elr += ilen;
            } else if s.read && crate::idregs::is_id_space(s.op0, s.op1, s.crn, s.crm) {
                let reg = crate::idregs::IdReg { crm: s.crm, op2: s.op2 };
                let value = crate::idregs::sanitize(reg, sysreg::read_id_reg(s.crm, s.op2), vm.pmu_intid.is_some());
                v.regs.set_reg(s.reg, value);
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
            if mmio(vm, me, v, &a).is_ok() {
                v.regs.elr += ilen;
            } else if vm.bus.lookup(a.ipa).is_none() && map_on_demand(vm, a.ipa) {
                // Mapped: the guest retries the access on the device itself.
            } else {
                report_bad_access(vm, v, a.ipa, "bad MMIO access");
                inject_abort(vm, v, esr::AbortKind::Data { write: a.write, cache_maint: false }, far);
            }
            Next::Enter
        }
        Exit::DataAbort { ipa, iss } if esr::is_translation_fault(iss) && map_on_demand(vm, ipa) => Next::Enter,
        Exit::DataAbort { ipa, iss } => {
            let isv = ISS_ABORT::ISV.is_set(u64::from(iss));
            report_bad_access(vm, v, ipa, if isv { "data abort" } else { "data abort without syndrome" });
            inject_abort(vm, v, esr::AbortKind::from_dabt_iss(iss), far);
            Next::Enter
        }
        Exit::InstructionAbort { ipa } => {
            report_bad_access(vm, v, ipa, "instruction abort");
            inject_abort(vm, v, esr::AbortKind::Fetch, far);
            Next::Enter
        }
        Exit::Undefined { .. } | Exit::Unknown { .. } => {
            inject_undef(vm, v);
            Next::Enter
        }
    }
}

/// WFI: block unless an interrupt is already deliverable. The check and the
/// block happen under the vGIC lock so an injection cannot slip between.
/// `limit` (ns, u64::MAX = none) ends a WFIT's wait: the pCPU where the vCPU
/// is saved watches it on the EL2 timer (`arm_timer`, `timer_expired`).
/// GICv4: the vPE is made non-resident first, and a vLPI pending then
/// (PendingLast) or a doorbell since (`vlpi_pending`) keeps the vCPU running.
fn block(vm: &Vm, me: usize, v: &mut Vcpu, limit: u64) -> Next {
    let id = v.id;
    let now = now_ns();
    if limit <= now {
        return Next::Enter;
    }
    let was_resident = v.vpe_resident;
    if was_resident {
        super::vpe::put(vm, me, id);
        v.vpe_resident = false;
    }
    // Its physical timer may have come due since the last exit.
    ptimer_sync(vm, me, v, false);
    let mut vgic = vm.vgic.lock();
    // A virtual timer interrupt the guest has not taken while its timer is no
    // longer due (the guest disabled or masked it, or moved CVAL on, before
    // this WFI) is not pending any more: the timer's output is a level. The
    // guest's timer registers are live here; ending the virtual pending
    // state also ends the physical PPI's active state, so it can fire again.
    let vt = vm.virt_timer_intid;
    let line = crate::time::vtimer_line(CNTV_CTL_EL0.get(), CNTV_CVAL_EL0.get(), percpu::counter());
    resample_forwarded_ppi(&mut vgic, me, id, vt, line);
    // Likewise an overflow interrupt whose flag the guest cleared.
    if let (Some(p), Placement::Loaded) = (vm.pmu_intid, v.pmu.placement) {
        resample_forwarded_ppi(&mut vgic, me, id, p, pmu::line());
    }
    if vgic.has_deliverable(id) || vm.shared[id].vlpi_pending.load(Ordering::Acquire) {
        drop(vgic);
        if was_resident {
            v.vpe_resident = super::vpe::load(vm, me, id);
        }
        return Next::Enter;
    }
    vm.shared[id].wake_at.store(limit, Ordering::Release);
    percpu::note_timers_changed(vm.shared[id].vtimer_home.load(Ordering::Relaxed));
    let r = vm.sched.lock().block(now_ns(), me);
    drop(vgic);
    match r {
        Ok(_) => Next::Schedule,
        Err(e) => {
            warn!("vCPU{id}: block: {e}");
            vm.shared[id].wake_at.store(u64::MAX, Ordering::Release);
            if was_resident {
                v.vpe_resident = super::vpe::load(vm, me, id);
            }
            Next::Enter
        }
    }
}

/// Resamples forwarded private interrupt `intid` of vCPU `id`, running
/// here, against its source's level `line`; ending its pending state also
/// ends the physical PPI's active state, so it can fire again.
fn resample_forwarded_ppi(vgic: &mut crate::vgic::Vgic, me: usize, id: usize, intid: IntId, line: bool) {
    if vgic.resample_hw_private(id, intid, line) == Ok(true) {
        gic::set_private_active(me, intid, vgic.is_pending_or_active(id, intid));
    }
}

/// How closely vCPU `id` is watched for spinning (`sched::spin`): not at
/// all unless vCPUs outnumber pCPUs and a sibling is runnable but was
/// descheduled involuntarily (a lock holder `id` may be waiting for);
/// closely if that sibling left with IRQs masked.
fn spin_watch(vm: &Vm, id: usize) -> Option<spin::Watch> {
    if !vm.overcommitted {
        return None;
    }
    preempted_sibling(vm, &vm.sched.lock(), id)
        .map(|(_, masked)| if masked { spin::Watch::Critical } else { spin::Watch::Preempted })
}

/// A sibling of vCPU `id` that is runnable but was descheduled
/// involuntarily, one that left inside a critical section (IRQs masked: the
/// likely holder of what `id` waits for) first, and whether it did.
fn preempted_sibling(vm: &Vm, s: &crate::sched::Scheduler, id: usize) -> Option<(usize, bool)> {
    let mut found = None;
    for k in (0..vm.shared.len()).filter(|&k| k != id && s.is_preempted(vm.gid(k))) {
        if vm.shared[k].left_masked.load(Ordering::Relaxed) {
            return Some((k, true));
        }
        found.get_or_insert((k, false));
    }
    found
}

/// WFE while vCPUs outnumber pCPUs: the vCPU probably spins on a lock whose
/// holder is preempted; yield, directly to a preempted sibling if any.
fn yield_cpu(vm: &Vm, me: usize, id: usize) -> Next {
    if !vm.overcommitted {
        return Next::Enter;
    }
    let mut s = vm.sched.lock();
    let target = preempted_sibling(vm, &s, id).map(|(k, _)| vm.gid(k));
    match s.yield_to(now_ns(), me, target) {
        Ok(()) => Next::Schedule,
        Err(_) => Next::Enter,
    }
}

/// An ACPI Dom0 touched an unmapped address outside RAM and its MMIO bus:
/// maps the page (or its 2 MiB block) 1:1 as device memory when
/// `Vm::iomem` permits it, so the guest's retry reaches the device (Xen's
/// on-demand MMIO for its hardware domain). False: refused, abort the guest.
fn map_on_demand(vm: &Vm, ipa: u64) -> bool {
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

fn report_bad_access(vm: &Vm, v: &Vcpu, ipa: u64, what: &str) {
    if vm.bad_accesses.fetch_add(1, Ordering::Relaxed) < 16 {
        // Dom0's lines as they always were; a DomU's name it.
        let dom = if vm.domid == 0 { alloc::string::String::new() } else { alloc::format!("d{} ", vm.domid) };
        warn!("{dom}vCPU{}: {what} at IPA {ipa:#x} (PC {:#x}); injecting an external abort", v.id, v.regs.elr);
    }
}

/// Emulated device access, to the device `Vm::bus` names. Err: the access
/// is not valid (abort the guest).
fn mmio(vm: &Vm, me: usize, v: &mut Vcpu, a: &MmioAccess) -> Result<(), ()> {
    let value = esr::store_value(a, v.regs.reg(a.reg));
    match vm.bus.lookup(a.ipa) {
        Some((Device::Vgic, _)) => vgic_mmio(vm, me, v, a, value),
        Some((Device::VirtioBlk, _)) => disk_mmio(vm, me, v, a, value),
        Some((Device::Vpl011, off)) => uart_mmio(vm, me, v, a, off, value),
        Some((Device::Vits, _)) => super::its::vits_mmio(vm, me, &mut v.regs, a, value).map_err(|_| ()),
        None => Err(()),
    }
}

/// The vGIC's distributor and redistributor frames.
fn vgic_mmio(vm: &Vm, me: usize, v: &mut Vcpu, a: &MmioAccess, value: u64) -> Result<(), ()> {
    let mut vgic = vm.vgic.lock();
    if a.write {
        let kicks = vgic.mmio_write(v.id, a.ipa, a.size, value).map_err(|_| ())?;
        let hw = vgic.take_hw_deactivations();
        let triggers = vgic.take_hw_triggers();
        let lpis_on = vgic.take_lpi_enable_events();
        drop(vgic);
        deactivate_hw(vm, me, v.id, hw);
        for (pintid, edge) in triggers {
            gic::set_spi_trigger(pintid, edge);
        }
        process_kicks(vm, me, kicks, WakeCause::Interrupt);
        super::its::lpis_enabled(vm, me, lpis_on);
    } else {
        let r = vgic.mmio_read(v.id, a.ipa, a.size).map_err(|_| ())?;
        v.regs.set_reg(a.reg, esr::load_value(a, r));
    }
    Ok(())
}

/// The hypervisor's virtio-blk frame.
fn disk_mmio(vm: &Vm, me: usize, v: &mut Vcpu, a: &MmioAccess, value: u64) -> Result<(), ()> {
    let disk = vm.disk.as_ref().ok_or(())?;
    let level = if a.write {
        disk.write(a.ipa, a.size, value, now_ns(), me).map_err(|_| ())?
    } else {
        let r = disk.read(a.ipa, a.size).map_err(|_| ())?;
        v.regs.set_reg(a.reg, esr::load_value(a, r));
        None
    };
    if let Some(l) = level {
        disk_irq(vm, me, disk, l);
    }
    Ok(())
}

/// The vPL011 at offset `off` of its frame.
fn uart_mmio(vm: &Vm, me: usize, v: &mut Vcpu, a: &MmioAccess, off: u64, value: u64) -> Result<(), ()> {
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
                if dom == 0 && b == STATS_KEY && vm.trace_trigger.dom0_key_on() {
                    guest_key |= vm.trace_trigger.dom0_key();
                } else {
                    console::domain_putc(dom, b);
                }
            };
            uart.write(off, a.size, value as u32, &mut tx).map_err(|_| ())?;
        } else {
            let r = uart.read(off, a.size).map_err(|_| ())? as u64;
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
        dump_trace(vm, DumpReason::Key, 0);
    }
    if let Ok(k) = vm.vgic.lock().set_level(vm.uart_intid, v.id, level) {
        process_kicks(vm, me, k, WakeCause::Interrupt);
    }
    Ok(())
}

/// Delivers a synchronous exception to the guest's EL1 vector table.
fn inject_exception(v: &mut Vcpu, esr_el1: u64, far: Option<u64>) {
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
fn inject_abort(vm: &Vm, v: &mut Vcpu, kind: esr::AbortKind, far: u64) {
    inc(&vm.shared[v.id].counters.aborts_injected);
    let same_el = v.regs.spsr & 0x1f != 0 && v.regs.spsr & 0x10 == 0;
    inject_exception(v, esr::injected_abort_esr(kind, same_el), Some(far));
}

/// A physical SError the running vCPU caused (taken from it, or found
/// pending at its exit, `syndrome` = ESR_EL2 or DISR_EL1): counted and
/// reflected to it as a virtual SError, never to whoever runs next.
fn serror_from_guest(vm: &Vm, v: &mut Vcpu, syndrome: u64) {
    let c = &vm.shared[v.id].counters;
    inc(&c.serrors);
    if c.serrors.load(Ordering::Relaxed) <= 8 {
        warn!("d{} vCPU{}: SError from the guest (syndrome {syndrome:#x}); injecting it", vm.domid, v.id);
    }
    v.vserror.raise();
    el2::set_vserror_syndrome(el2::cpu_features().ras);
    el2::set_hcr(v.vserror.on_entry(el2::hcr()));
}

fn inject_undef(vm: &Vm, v: &mut Vcpu) {
    inc(&vm.shared[v.id].counters.undef_injected);
    inject_exception(v, (ESR_EL1::EC::Unknown + ESR_EL1::IL::SET).value, None);
}

/// A trapped debug-register access (MDCR_EL2.TDA/TDOSA/TDRA), emulated as
/// `crate::vdebug` says.
fn debug_access(vm: &Vm, v: &mut Vcpu, s: &esr::SysRegAccess, reg: DebugReg, ilen: u64) {
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
fn pmu_access(vm: &Vm, v: &mut Vcpu) {
    match v.pmu.on_trap(vm.pmu_intid.is_some()) {
        crate::vpmu::TrapAction::LoadAndRetry => {
            arm_pmu(v);
            inc(&vm.shared[v.id].counters.pmu_loads);
        }
        crate::vpmu::TrapAction::Undefined => inject_undef(vm, v),
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

fn find_vcpu(vm: &Vm, target: u64) -> Option<usize> {
    let mask = 0xff_00ff_ffff;
    (0..vm.vcpus.len()).find(|&i| super::vm::vcpu_mpidr(i) & mask == target & mask)
}

fn psci_call(vm: &Vm, me: usize, v: &mut Vcpu) -> Next {
    let [x0, x1, x2, x3, ..] = v.regs.x;
    let mut next = Next::Enter;
    let ret: i64 = match psci::decode(x0, x1, x2, x3) {
        Call::Version => psci::VERSION_1_1 as i64,
        Call::Features { function } => psci::features(function),
        Call::SmcccVersion => psci::SMCCC_VERSION_1_1 as i64,
        Call::SmcccArchFeatures { function } => {
            super::mitigations::guest_mitigations().arch_features(function).unwrap_or(psci::NOT_SUPPORTED)
        }
        // The exit that carried the call ran this pCPU's mitigation already.
        Call::ArchWorkaround { function } => {
            super::mitigations::guest_mitigations().workaround_call(function).unwrap_or(psci::NOT_SUPPORTED)
        }
        Call::MigrateInfoType => psci::MIGRATE_NOT_REQUIRED,
        Call::CpuSuspend => {
            // Standby: like WFI.
            next = block(vm, me, v, u64::MAX);
            psci::SUCCESS
        }
        Call::CpuOn { target, entry, context } => {
            let mpidrs: alloc::vec::Vec<u64> = (0..vm.vcpus.len()).map(super::vm::vcpu_mpidr).collect();
            let online: alloc::vec::Vec<bool> = vm.shared.iter().map(|s| s.online.load(Ordering::Acquire)).collect();
            match psci::validate_cpu_on(target, entry, &mpidrs, &online, vm.ram.base, vm.ram.end()) {
                Ok(t) => cpu_on(vm, me, t, entry, context),
                Err(e) => e,
            }
        }
        Call::AffinityInfo { target, level } => match find_vcpu(vm, target) {
            _ if level != 0 => psci::INVALID_PARAMETERS,
            None => psci::INVALID_PARAMETERS,
            Some(t) if vm.shared[t].online.load(Ordering::Acquire) => psci::AFF_ON,
            Some(_) => psci::AFF_OFF,
        },
        Call::CpuOff => {
            vm.shared[v.id].online.store(false, Ordering::Release);
            match vm.sched.lock().power_off(now_ns(), me) {
                Ok(_) => next = Next::Schedule,
                Err(e) => warn!("vCPU{}: CPU_OFF: {e}", v.id),
            }
            psci::SUCCESS
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
        Call::Unknown { function } => {
            inc(&vm.shared[v.id].counters.unsupported_calls);
            debug!("vCPU{}: unsupported SMCCC function {function:#x}", v.id);
            psci::NOT_SUPPORTED
        }
    };
    v.regs.x[0] = ret as u64;
    next
}

/// PSCI CPU_ON of an offline vCPU: reset its state, enter at `entry` with
/// `context` in x0, and let the scheduler run it.
fn cpu_on(vm: &Vm, me: usize, t: usize, entry: u64, context: u64) -> i64 {
    if vm.shared[t].online.swap(true, Ordering::AcqRel) {
        return psci::ALREADY_ON;
    }
    {
        // Offline vCPUs are not on any pCPU, but a CPU_OFF may still be
        // saving this one: the lock waits for it.
        let mut tv = vm.vcpus[t].lock();
        tv.regs = GuestRegs::default();
        tv.regs.x[0] = context;
        tv.regs.elr = entry;
        tv.regs.spsr = SPSR_EL1H_MASKED;
        tv.el1 = crate::arch::context::El1Context::reset(super::vm::vcpu_mpidr(t));
        tv.ptimer = Default::default();
        tv.pmu = Default::default();
        tv.fp = Default::default();
        tv.gicif = Default::default();
        tv.vserror = Default::default();
    }
    let r = vm.sched.lock().power_on(now_ns(), vm.gid(t));
    match r {
        Ok(a) => {
            do_wake_action(me, a);
            psci::SUCCESS
        }
        Err(e) => {
            warn!("CPU_ON vCPU{t}: {e}");
            vm.shared[t].online.store(false, Ordering::Release);
            psci::INTERNAL_FAILURE
        }
    }
}

/// `sched_trace_threshold_us`: dumps the rings when the vCPU `d` switched
/// in waited longer than that since its wake (rate-limited by the trigger).
/// The same for a virtual-timer wake: how late after the timer's deadline
/// the vCPU switched in (what cyclictest sees, less the guest's own part).
fn dump_if_outlier(me: usize, now: u64, d: &crate::sched::Decision) {
    let Some((vcpu, _, lat)) = d.switch.into else { return };
    let Some((vm, local)) = vcpu_of(vcpu) else { return };
    let due = vm.shared[local].vtimer_fired.swap(u64::MAX, Ordering::AcqRel);
    let late = (due != u64::MAX).then(|| now.saturating_sub(due));
    if let Some(l) = late {
        vm.trace[me].lock().push(now, Event::TimerWake { vcpu: vcpu.0 as u16, late_ns: l });
    }
    let why = match (lat, late) {
        (Some(lat), _) if vm.trace_trigger.fire(now, lat) => DumpReason::Outlier { vcpu, latency_ns: lat },
        (_, Some(l)) if vm.trace_trigger.fire(now, l) => DumpReason::TimerLate { vcpu, late_ns: l },
        _ => return,
    };
    let span = match why {
        DumpReason::Outlier { latency_ns, .. } => latency_ns,
        DumpReason::TimerLate { late_ns, .. } => late_ns,
        DumpReason::Key => 0,
    };
    dump_trace(vm, why, crate::trace::outlier_window_start(now, span));
}

/// Prints the flight recorder's rings (`crate::trace`): each pCPU's copied
/// under its lock, one after another, events from `from` (ns) on.
pub fn dump_trace(vm: &Vm, why: DumpReason, from: u64) {
    let rings: alloc::vec::Vec<_> = vm
        .trace
        .iter()
        .enumerate()
        .map(|(p, r)| {
            let r = r.lock();
            (p, r.snapshot(), r.overwritten())
        })
        .collect();
    let _ = crate::trace::write_dump(&mut console::LineWriter::default(), why, &rings, from);
    vm.trace_trigger.dumped(now_ns());
}

/// Prints every VM's statistics: Dom0's as they always were (`vcpuN.`,
/// `blk0.`, `uart0.`, ...), then one block per domain (`domN.` totals: exits,
/// aborts injected, disk requests) and each DomU's vCPUs, disk and UART with
/// a `dN.` prefix.
pub fn print_stats() {
    let all = vms();
    // One instant for every domain's run time, and the host clock at it, so
    // shares over the time between two prints add up.
    let now = now_ns();
    crate::hvprintln!("(HV) stats begin host\nhost.now_ns={now}\n(HV) stats end host");
    print_vm_stats(all[0]);
    for vm in all {
        print_domain_totals(vm, now);
        if vm.domid != 0 {
            print_domu_stats(vm);
        }
    }
}

/// `domN.name=value`: a domain's totals over its vCPUs and its disk, and its
/// run time (`run_ns`, the scheduler's [`crate::sched::DomainStats`]).
fn print_domain_totals(vm: &Vm, now: u64) {
    let sum = |f: fn(&super::vm::TrapCounters) -> &core::sync::atomic::AtomicU64| -> u64 {
        vm.shared.iter().map(|s| f(&s.counters).load(Ordering::Relaxed)).sum()
    };
    let disk_requests = vm.disk.as_ref().map_or(0, |d| {
        let st = d.state.lock();
        let c = st.dev.counters();
        c.reads + c.writes + c.flushes + c.get_ids + c.unsupported
    });
    let n = vm.domid;
    // Run time as the scheduler charges it (Credit2's burn), all vCPUs, up
    // to `now`.
    let run_ns = vm.sched.lock().domain_run_ns(n, now).unwrap_or(0);
    crate::hvprintln!(
        "(HV) stats begin dom{n}\ndom{n}.vcpus={}\ndom{n}.exits={}\ndom{n}.aborts_injected={}\ndom{n}.undef_injected={}\ndom{n}.disk_requests={disk_requests}\ndom{n}.run_ns={run_ns}\ndom{n}.stopped={}\n(HV) stats end dom{n}",
        vm.vcpus.len(),
        sum(|c| &c.exits),
        sum(|c| &c.aborts_injected),
        sum(|c| &c.undef_injected),
        u8::from(vm.stopped.load(Ordering::Relaxed)),
    );
}

/// A DomU's vCPUs, disk and UART, every line prefixed `dN.`.
fn print_domu_stats(vm: &Vm) {
    let n = vm.domid;
    let prefixed =
        |text: &str| -> alloc::string::String { text.lines().map(|l| alloc::format!("d{n}.{l}\n")).collect() };
    for (i, s) in vm.shared.iter().enumerate() {
        let mut st = vm.sched.lock().stats(vm.gid(i)).cloned().unwrap_or_default();
        s.counters.fill(&mut st.counters);
        let mut text = alloc::string::String::new();
        let _ = st.write_text(i as u32, &mut text);
        crate::hvprintln!("(HV) stats begin d{n}.vcpu{i}\n{}(HV) stats end d{n}.vcpu{i}", prefixed(&text));
    }
    if let Some(disk) = &vm.disk {
        let mut text = alloc::string::String::new();
        disk.write_text(&mut text);
        crate::hvprintln!("(HV) stats begin d{n}.blk0\n{}(HV) stats end d{n}.blk0", prefixed(&text));
    }
    let mut text = alloc::string::String::new();
    let _ = vm.quota.write_text("quota", &mut text);
    crate::hvprintln!("(HV) stats begin d{n}.quota\n{}(HV) stats end d{n}.quota", prefixed(&text));
    let u = vm.uart.lock();
    let (rx, holds, overruns) = (u.rx_bytes, u.rx_holds, u.rx_overruns);
    drop(u);
    let dropped = console::rx_dropped(n);
    crate::hvprintln!(
        "(HV) stats begin d{n}.uart0\nd{n}.uart0.rx_bytes={rx}\nd{n}.uart0.rx_holds={holds}\nd{n}.uart0.rx_overruns={overruns}\nd{n}.uart0.rx_dropped={dropped}\n(HV) stats end d{n}.uart0"
    );
}

/// Dom0's statistics in the stable `vcpuN.name=value` format (see
/// `crate::stats`).
fn print_vm_stats(vm: &Vm) {
    for (i, s) in vm.shared.iter().enumerate() {
        let mut st = vm.sched.lock().stats(vm.gid(i)).cloned().unwrap_or_default();
        s.counters.fill(&mut st.counters);
        let mut text = alloc::string::String::new();
        let _ = st.write_text(i as u32, &mut text);
        crate::hvprintln!("(HV) stats begin vcpu{i}\n{}(HV) stats end vcpu{i}", text);
    }
    if let Some(disk) = &vm.disk {
        let mut text = alloc::string::String::new();
        disk.write_text(&mut text);
        crate::hvprintln!("(HV) stats begin blk0\n{}(HV) stats end blk0", text);
    }
    let (rx_bytes, rx_holds, rx_overruns) = {
        let u = vm.uart.lock();
        (u.rx_bytes, u.rx_holds, u.rx_overruns)
    };
    if gic::its::its_present() {
        let mut text = alloc::string::String::new();
        let st = gic::its::stats();
        let _ = st.write_text(&mut text);
        // Commands per second of hypervisor uptime (the GICv4 path sends a
        // few per guest mapping change and one VMOVP per vCPU migration).
        let total: u64 = st.commands.iter().sum();
        let per_s = total.saturating_mul(1_000_000_000) / now_ns().max(1);
        crate::hvprintln!("(HV) stats begin its\n{}its.cmds_per_sec={per_s}\n(HV) stats end its", text);
    }
    if let Some(vits) = &vm.vits {
        let text = alloc::format!("{}", vits.lock().counters());
        let dropped = vm.lpis_dropped.load(Ordering::Relaxed);
        crate::hvprintln!("(HV) stats begin vits0\n{text}vits0.lpis_dropped={dropped}\n(HV) stats end vits0");
    }
    if let Some(v4) = &vm.vlpi {
        let mapped = gic::its::vlpis_mapped();
        crate::hvprintln!(
            "(HV) stats begin vlpi0\nvlpi0.vpes={}\nvlpi0.vlpis_mapped={mapped}\n(HV) stats end vlpi0",
            v4.vpes.len()
        );
    }
    let rx_dropped = console::rx_dropped(0);
    crate::hvprintln!(
        "(HV) stats begin uart0\nuart0.rx_bytes={rx_bytes}\nuart0.rx_holds={rx_holds}\nuart0.rx_overruns={rx_overruns}\nuart0.rx_dropped={rx_dropped}\n(HV) stats end uart0"
    );
    // The physical console: input read and lost to a full ring, DomU
    // output dropped to a full ring, output written while waiting for the
    // UART.
    let (rx, rx_overruns, tx_dropped, tx_waited) = console::counters();
    crate::hvprintln!(
        "(HV) stats begin console\nconsole.rx_bytes={rx}\nconsole.rx_overruns={rx_overruns}\nconsole.tx_dropped={tx_dropped}\nconsole.tx_waited={tx_waited}\n(HV) stats end console"
    );
    if vm.iomem.is_some() {
        crate::hvprintln!(
            "(HV) stats begin iomem\niomem.maps={}\niomem.denied={}\n(HV) stats end iomem",
            vm.iomem_maps.load(Ordering::Relaxed),
            vm.iomem_denied.load(Ordering::Relaxed)
        );
    }
    let mut text = alloc::string::String::new();
    let _ = vm.irq_counters.write_text(&mut text);
    crate::hvprintln!("(HV) stats begin irq\n{}(HV) stats end irq", text);
    let mut text = alloc::string::String::new();
    let _ = vm.quota.write_text("quota", &mut text);
    crate::hvprintln!("(HV) stats begin quota\n{}(HV) stats end quota", text);
    // The whole heap: what every VM's quota and the hypervisor's own part
    // use together, and the most they ever did.
    let h = super::heap::stats();
    crate::hvprintln!(
        "(HV) stats begin heap\nheap.used={}\nheap.hwm={}\nheap.size={}\n(HV) stats end heap",
        h.used,
        h.hwm,
        h.size
    );
}

/// Dom0's SYSTEM_OFF: the machine powers off (whatever DomUs still run).
fn power_off() -> ! {
    print_stats();
    info!("dom0 powered off; powering off the machine");
    console::flush();
    smc::psci_system_off()
}

/// A DomU's SYSTEM_OFF or SYSTEM_RESET: only that domain stops. Its vCPUs go
/// offline (the caller's now; the others at their next switch-in or exit,
/// see `run_vcpu`); its memory and devices stay as they are, unused.
fn stop_domain(vm: &Vm, me: usize, v: &Vcpu, what: &str) -> Next {
    if !vm.stopped.swap(true, Ordering::AcqRel) {
        info!("d{} {what}: the domain stops (the machine powers off with dom0)", vm.domid);
        if console::input_focus() == vm.domid {
            // Nobody reads its console any more: input goes back to Dom0.
            crate::hvprintln!("(HV) input to d0");
            console::set_input_focus(0);
        }
    }
    vm.shared[v.id].online.store(false, Ordering::Release);
    if let Err(e) = vm.sched.lock().power_off(now_ns(), me) {
        warn!("d{} vCPU{}: stopping: {e}", vm.domid, v.id);
    }
    let now = now_ns();
    // Others, even blocked ones, must run once to go offline.
    for k in (0..vm.shared.len()).filter(|&k| k != v.id && vm.shared[k].online.load(Ordering::Acquire)) {
        wake_vcpu(vm, me, k, now, WakeCause::Interrupt);
    }
    Next::Schedule
}
