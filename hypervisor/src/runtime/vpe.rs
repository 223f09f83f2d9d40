//! A VM's GICv4 vPEs at run time: residency on vCPU load and put, and the
//! doorbell of a vPE that is not resident (the why is in `runtime::vlpi`,
//! which builds the vPEs; the VM holds them, so these take the VM and sit
//! above it).

use super::vm::{inc, VcpuShared, Vm};
use super::wake::wake_vcpu;
use crate::arch::gic;
use crate::intid::IntId;
use crate::its::v4::{self, DoorbellFor};
use crate::sched::WakeCause;
use core::sync::atomic::Ordering;
use log::warn;

/// GICR_VPROPBASER for vCPU `id`: the guest's LPI configuration table, when
/// its redistributor has EnableLPIs and the table's first 8192 bytes (the
/// vLPIs 8192..16383 the redistributor reads, by physical address: the
/// guest's address translated to the host's) lie in guest RAM.
fn vpropbaser(vm: &Vm, id: usize) -> Option<u64> {
    let (pa, lpis) = vm.vgic.read().lpi_prop_table(id)?;
    let bits = (u64::from(lpis) + u64::from(crate::its::LPI_BASE)).checked_ilog2()? as u8;
    // The redistributor reads one byte per vLPI below 2^14, whatever the
    // guest's table holds beyond.
    let end = pa.checked_add(v4::VPROP_TABLE_BYTES)?;
    if pa < vm.ram.base || end > vm.ram.end() {
        return None;
    }
    v4::vpropbaser(pa - vm.ram.base + vm.ram_host, bits, true)
}

/// How long a load waits for the pCPU that last ran the vCPU to release its
/// vPE. That pCPU releases it a few hundred instructions after its
/// scheduler picked another vCPU, with interrupts masked, so on hardware
/// the wait is short; the bound is in time, not polls, because under TCG
/// that pCPU is a host thread the host may deschedule for milliseconds
/// (a count of polls ran out after ~10 ms on a loaded 2-core host).
const RELEASE_WAIT_NS: u64 = 1_000_000_000;

/// vCPU `id` is being loaded on `me`: its vPE follows it (VMOVP if mapped
/// elsewhere) and becomes resident. Returns whether it is resident. A vPE
/// still resident here from the vCPU's previous turn (a continuation) is
/// left as it is: no command, no register write.
pub fn load(vm: &Vm, me: usize, id: usize) -> bool {
    let Some(v4) = vm.vlpi.as_ref() else { return false };
    let Some(hw) = v4.hw.get(id) else { return false };
    let s = &vm.shared[id];
    if s.vpe_on.load(Ordering::Acquire) == me {
        return true;
    }
    // GICv4.0: a vPE is resident on one redistributor at a time, and VMOVP
    // moves a vPE that is resident nowhere. The pCPU that ran this vCPU
    // last releases it as soon as its scheduler picks another vCPU.
    if !released(s) {
        warn!(
            "vCPU{id}: vPE still resident on pCPU{}: not made resident on pCPU{me}",
            s.vpe_on.load(Ordering::Relaxed)
        );
        // Its vLPIs may be pending where it is: the vCPU must not block.
        s.vlpi_pending.store(true, Ordering::Release);
        return false;
    }
    let c = &s.counters;
    // The ITS command queue's lock only when the vPE moves.
    if s.vpe_mapped.load(Ordering::Relaxed) != me {
        match gic::its::vmovp(hw.vpe, me) {
            Ok(moved) => {
                if moved {
                    inc(&c.vmovps);
                }
                s.vpe_mapped.store(me, Ordering::Relaxed);
            }
            Err(e) => warn!("vCPU{id}: VMOVP to pCPU{me}: {e}"),
        }
    }
    // Before the guest enables LPIs there is nothing to deliver directly.
    let Some(prop) = vpropbaser(vm, id) else { return false };
    match gic::its::vpe_resident(me, prop, hw.vpt) {
        Ok(()) => {
            inc(&c.vpe_residency_switches);
            s.vpe_on.store(me, Ordering::Release);
            // The redistributor now scans the pending table itself.
            s.vlpi_pending.store(false, Ordering::Release);
            true
        }
        Err(e) => {
            warn!("vCPU{id}: vPE resident on pCPU{me}: {e}");
            false
        }
    }
}

/// Waits (at most `RELEASE_WAIT_NS`) until vCPU `s`'s vPE is resident
/// nowhere (YIELD between polls: under single-threaded TCG the releasing
/// pCPU then runs).
fn released(s: &VcpuShared) -> bool {
    let mut deadline = None;
    loop {
        if s.vpe_on.load(Ordering::Acquire) == usize::MAX {
            return true;
        }
        let now = super::percpu::now_ns();
        if now >= *deadline.get_or_insert(now.saturating_add(RELEASE_WAIT_NS)) {
            return false;
        }
        crate::arch::sysreg::cpu_relax();
    }
}

/// vCPU `id`'s vPE leaves `me`'s redistributor. Returns PendingLast (an
/// enabled vLPI is pending); that is also kept in `vlpi_pending`.
pub fn put(vm: &Vm, me: usize, id: usize) -> bool {
    let Some(hw) = vm.vlpi.as_ref().and_then(|v| v.hw.get(id)) else { return false };
    let s = &vm.shared[id];
    inc(&s.counters.vpe_residency_switches);
    let pending = match gic::its::vpe_nonresident(me, hw.vpt) {
        Ok(p) => p,
        Err(e) => {
            // Assume the worst: the vCPU does not block on it.
            warn!("vCPU{id}: vPE non-resident on pCPU{me}: {e}");
            true
        }
    };
    if pending {
        s.vlpi_pending.store(true, Ordering::Release);
    }
    // After `vlpi_pending`: whoever loads the vCPU next sees both.
    s.vpe_on.store(usize::MAX, Ordering::Release);
    pending
}

/// `me` is done with vCPU `id` (its scheduler picked another vCPU, or
/// none): the vPE it kept resident after the vCPU's turn leaves.
pub fn release(vm: &Vm, me: usize, id: usize) {
    if vm.shared.get(id).is_some_and(|s| s.vpe_on.load(Ordering::Acquire) == me) {
        put(vm, me, id);
    }
}

/// The doorbell of vCPU `vcpu`'s vPE fired on `me`: a vLPI became pending
/// while the vPE was not resident. Priority drop ends it (an LPI has no
/// active state); a vCPU that is not running is woken as by any interrupt,
/// with cause `Doorbell`.
pub fn doorbell(vm: &Vm, me: usize, id: IntId, vcpu: usize) {
    gic::eoi(id);
    let Some(s) = vm.shared.get(vcpu) else { return };
    {
        // Under the vGIC's lock: `block` checks this flag and blocks under
        // it. The flag is not the model's: nothing for a flush to find, so
        // the idle notes stay (`read` takes the same lock).
        let _g = vm.vgic.read();
        s.vlpi_pending.store(true, Ordering::Release);
    }
    // Checked after the flag: a vCPU whose WFI blocked before the flag was
    // set is Blocked by now (it blocked under the vGIC lock).
    let state = vm.sched.state(vm.gid(vcpu));
    match v4::doorbell_for(state) {
        DoorbellFor::Wake => {
            inc(&s.counters.doorbells);
            wake_vcpu(vm, me, vcpu, super::percpu::now_ns(), WakeCause::Doorbell);
        }
        // Descheduled: made resident when loaded, which rescans the table.
        DoorbellFor::Runnable => inc(&s.counters.doorbells_runnable),
        // Running: its vPE is resident again, or it is leaving and sees the flag.
        DoorbellFor::Spurious => inc(&s.counters.doorbells_spurious),
    }
}
