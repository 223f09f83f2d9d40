//! Physical interrupts taken at EL2: each goes where Dom0's route table
//! says (`crate::irq::Route`); the EL2 timer, the console's input, the
//! emulated disks' completions.

use super::report::print_stats;
use super::*;
use crate::runtime::devices::disk::disk_irq;

/// Takes every pending physical interrupt. `cur` is the VM and vCPU on this
/// pCPU. Physical interrupts belong to Dom0 or to the hypervisor (DomUs get
/// none), so each goes where Dom0's `Vm::routes` says, except the virtual
/// timer, which is the running vCPU's. Forwarded interrupts (virtual timer,
/// passthrough SPIs) only get a priority drop here, the guest's deactivation
/// ends them; everything else is dropped and deactivated. Returns whether
/// one of them delivered a guest MSI (its host LPI, or a GICv4 doorbell).
pub(super) fn handle_irqs(me: usize, cur: Option<(&Vm, usize)>, deadline: &mut Option<u64>) -> bool {
    let mut msi = false;
    let vm = vms()[0];
    // Dom0's vCPU here, if it is Dom0's.
    let cur0 = cur.filter(|(g, _)| g.domid == 0).map(|(_, v)| v);
    while let Some(id) = gic::ack() {
        // The kick, the commonest interrupt here, has one route for good
        // (set before any pCPU runs a guest): no route-table lock for it.
        if id == SGI_KICK {
            vm.irq_counters.record(Some(Route::Kick));
            eoi_deactivate(id);
            continue;
        }
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
            Some(Route::GuestLpi { devid, eventid }) => {
                let owner = crate::runtime::devices::vits::lpi_owner(vm, devid);
                crate::runtime::devices::vits::guest_lpi(owner, me, id, devid, eventid)
            }
            Some(Route::Doorbell { vcpu }) => match vcpu_of(crate::sched::VcpuId(vcpu as u32)) {
                Some((owner, local)) => crate::runtime::vpe::doorbell(owner, me, id, local),
                None => gic::eoi(id),
            },
            Some(Route::Smmu) => {
                crate::runtime::smmu::smmu_irq();
                eoi_deactivate(id);
            }
            // SGI_KICK, maintenance: the exit itself was the point; requests
            // are in pcpu(me), list registers are refilled at entry.
            // Unrouted: the default.
            Some(Route::Kick) | None => eoi_deactivate(id),
        }
    }
    msi
}

/// Priority drop and deactivation (EOImode = 1).
pub(super) fn eoi_deactivate(id: IntId) {
    gic::eoi(id);
    gic::deactivate(id);
}

/// The virtual timer's or the PMU's PPI, forwarded to the vCPU running
/// here: it stays active until the guest deactivates it. With no vCPU here
/// there is nobody to give it to.
pub(super) fn forwarded_ppi_irq(id: IntId, cur: Option<(&Vm, usize)>) {
    gic::eoi(id);
    match cur {
        Some((vm, v)) => {
            let _ = vm.vgic.lock().inject_edge(id, v);
        }
        None => gic::deactivate(id),
    }
}

/// The physical disk behind the guest's virtio-blk finished work.
pub(super) fn phys_disk_irq(vm: &Vm, me: usize, id: IntId) {
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
pub(super) fn forwarded_spi_irq(vm: &Vm, me: usize, id: IntId, vintid: IntId, cur: Option<usize>) {
    gic::eoi(id);
    let kicks = vm.vgic.lock().inject_edge(vintid, cur.unwrap_or(0));
    if let Ok(k) = kicks {
        process_kicks(vm, me, k, WakeCause::Interrupt);
    }
}

/// The EL2 timer: stopped here, re-armed by the run loop (`arm_timer`).
pub(super) fn hyp_timer_irq(me: usize, id: IntId, deadline: &mut Option<u64>) {
    eoi_deactivate(id);
    pcpu(me).arm_hyp_timer(None);
    vms()[0].trace[me].lock().note_fire(now_ns());
    timer_expired(me, deadline);
}

/// Bytes [`console_input`] reads from the physical UART per call: an endless
/// flood cannot keep pCPU0 in one interrupt (the level-sensitive line brings
/// it back for the rest).
pub(super) const CONSOLE_RX_BATCH: usize = 1024;

/// Physical console input: the UART is read into the hypervisor's input
/// ring whatever the domains do (`console::receive`), the focused domain's
/// emulated UART takes what fits in its FIFO (the rest waits in the ring
/// until the guest reads, see `runtime::devices::uart`) and its interrupt
/// line is mirrored. Ctrl-\ prints the statistics and dumps the flight recorder;
/// Ctrl-A three times moves the focus to the next domain with a console and
/// the rest of the input goes there. Neither waits for any guest.
pub(super) fn console_input(me: usize) {
    let mut budget = CONSOLE_RX_BATCH;
    loop {
        let (focus, key, read) = console::receive(budget);
        let vm = deliver_input(focus, me);
        match key {
            None => break,
            Some(Key::Dump) => {
                print_stats();
                vm.dump_trace(DumpReason::Key, 0);
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
pub(super) fn deliver_input(dom: crate::domain::DomainId, me: usize) -> &'static Vm {
    let all = vms();
    let vm = all.iter().copied().find(|v| v.domid == dom).unwrap_or(all[0]);
    let level = {
        let mut u = vm.uart.lock();
        u.pump_rx(&mut console::RingRx { dom });
        u.irq_level()
    };
    set_line(vm, me, vm.uart_intid, 0, level, WakeCause::Interrupt);
    vm
}

/// The third Ctrl-A: console input goes to the next domain that can take
/// it (`domain::console::input_targets`: Dom0, and running DomUs with a
/// vPL011); what the old focus has not taken is dropped.
pub(super) fn switch_input(from: crate::domain::DomainId) {
    let doms: alloc::vec::Vec<_> =
        vms().iter().map(|v| (v.domid, v.uart_region.is_some(), v.stopped.load(Ordering::Acquire))).collect();
    let to = crate::domain::console::next_domain(from, &crate::domain::console::input_targets(&doms));
    crate::hvprintln!("(HV) input to d{to}");
    console::set_input_focus(to);
}

/// The EL2 timer fired: in every VM, virtual timers of saved vCPUs and disk
/// completions; then the scheduler.
pub(super) fn timer_expired(me: usize, deadline: &mut Option<u64>) {
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
pub(super) fn vm_timers_expired(vm: &Vm, me: usize, now: u64) {
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
            set_line(vm, me, vm.phys_timer_intid, v, true, WakeCause::Timer);
        }
        // The limit of a WFIT: the vCPU runs again, with nothing injected.
        let w = s.wake_at.load(Ordering::Acquire);
        if w <= now && s.wake_at.compare_exchange(w, u64::MAX, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            wake_vcpu(vm, me, v, now, WakeCause::Timer);
        }
    }
}
