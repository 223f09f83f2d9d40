//! A VM's GICv4 vPEs at run time: residency on vCPU load and put, and the
//! doorbell of a vPE that is not resident (the why is in `runtime::vlpi`,
//! which builds the vPEs; the VM holds them, so these take the VM and sit
//! above it).

use super::vm::{inc, Vm};
use super::wake::wake_vcpu;
use crate::arch::gic;
use crate::intid::IntId;
use crate::its::v4::{self, DoorbellFor};
use crate::sched::WakeCause;
use core::sync::atomic::Ordering;
use log::warn;

/// GICR_VPROPBASER for vCPU `id`: the guest's LPI configuration table, when
/// its redistributor has EnableLPIs and the table's first 8192 bytes (the
/// vLPIs 8192..16383 the redistributor reads, by physical address: Dom0 is
/// identity-mapped) lie in guest RAM.
fn vpropbaser(vm: &Vm, id: usize) -> Option<u64> {
    let (pa, lpis) = vm.vgic.lock().lpi_prop_table(id)?;
    let bits = (u64::from(lpis) + u64::from(crate::its::LPI_BASE)).checked_ilog2()? as u8;
    // The redistributor reads one byte per vLPI below 2^14, whatever the
    // guest's table holds beyond.
    let end = pa.checked_add(v4::VPROP_TABLE_BYTES)?;
    if pa < vm.ram.base || end > vm.ram.end() {
        return None;
    }
    v4::vpropbaser(pa, bits, true)
}

/// vCPU `id` is being loaded on `me`: its vPE follows it (VMOVP if mapped
/// elsewhere) and becomes resident. Returns whether it is resident.
pub fn load(vm: &Vm, me: usize, id: usize) -> bool {
    let Some(v4) = vm.vlpi.as_ref() else { return false };
    let Some(hw) = v4.hw.get(id) else { return false };
    let c = &vm.shared[id].counters;
    match gic::its::vmovp(hw.vpe, me) {
        Ok(true) => inc(&c.vmovps),
        Ok(false) => {}
        Err(e) => warn!("vCPU{id}: VMOVP to pCPU{me}: {e}"),
    }
    // Before the guest enables LPIs there is nothing to deliver directly.
    let Some(prop) = vpropbaser(vm, id) else { return false };
    match gic::its::vpe_resident(me, prop, hw.vpt) {
        Ok(()) => {
            inc(&c.vpe_residency_switches);
            // The redistributor now scans the pending table itself.
            vm.shared[id].vlpi_pending.store(false, Ordering::Release);
            true
        }
        Err(e) => {
            warn!("vCPU{id}: vPE resident on pCPU{me}: {e}");
            false
        }
    }
}

/// vCPU `id`'s vPE leaves `me`'s redistributor. Returns PendingLast (an
/// enabled vLPI is pending); that is also kept in `vlpi_pending`.
pub fn put(vm: &Vm, me: usize, id: usize) -> bool {
    let Some(hw) = vm.vlpi.as_ref().and_then(|v| v.hw.get(id)) else { return false };
    inc(&vm.shared[id].counters.vpe_residency_switches);
    let pending = match gic::its::vpe_nonresident(me, hw.vpt) {
        Ok(p) => p,
        Err(e) => {
            // Assume the worst: the vCPU does not block on it.
            warn!("vCPU{id}: vPE non-resident on pCPU{me}: {e}");
            true
        }
    };
    if pending {
        vm.shared[id].vlpi_pending.store(true, Ordering::Release);
    }
    pending
}

/// The doorbell of vCPU `vcpu`'s vPE fired on `me`: a vLPI became pending
/// while the vPE was not resident. Priority drop ends it (an LPI has no
/// active state); a vCPU that is not running is woken as by any interrupt,
/// with cause `Doorbell`.
pub fn doorbell(vm: &Vm, me: usize, id: IntId, vcpu: usize) {
    gic::eoi(id);
    let Some(s) = vm.shared.get(vcpu) else { return };
    {
        // Under the vGIC lock: `block` checks this flag and blocks under it.
        let _g = vm.vgic.lock();
        s.vlpi_pending.store(true, Ordering::Release);
    }
    // Checked after the flag: a vCPU whose WFI blocked before the flag was
    // set is Blocked by now (it blocked under the vGIC lock).
    let state = vm.sched.lock().state(vm.gid(vcpu));
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
