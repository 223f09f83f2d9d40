//! GICv4.0 direct injection of the guest's MSIs: the EL2 side.
//!
//! * [`VlpiVm`]: the VM's vPEs, one per vCPU (vPE ID = the vCPU's
//!   host-wide scheduler id, so Dom0's vCPU i is vPE i and a DomU's follow; a
//!   virtual pending table and a doorbell LPI each, VMAPPed at VM creation
//!   to the pCPU the vCPU starts on), made by [`VlpiVm::create`] when
//!   `gic::its::lpi_path()` is `Direct` (else the VM keeps the
//!   emulated path, host LPIs through list registers: the choice is the `Vm::vlpi` field, data).
//! * [`DirectBackend`]: the vITS backend for that case, `its::v4`'s
//!   (host-tested) over the physical driver ([`PhysIts`]). Guest MAPD →
//!   MAPD; MAPTI/MAPI → VMAPTI/VMAPI with the target vCPU's vPE and
//!   doorbell; MOVI → VMOVI; DISCARD → DISCARD; INV → INV and INVALL →
//!   VINVALL, so the redistributor re-reads the guest's configuration table
//!   (it reads it through GICR_VPROPBASER); INT → INT (the vLPI becomes
//!   pending in the virtual pending table, never also in a list register);
//!   CLEAR → CLEAR. Every change is checked by the vITS model first and
//!   then by `gic::its::vlpi_change` against this VM's vPEs only.
//! * Residency (`runtime::vpe::load`, `runtime::vpe::put`): on vCPU load the vPE is moved (VMOVP) to
//!   this pCPU's redistributor if it is mapped elsewhere — vLPIs and the
//!   doorbell go where VMAPP/VMOVP said, so the vPE follows its vCPU, and a
//!   VMOVP happens only on migration — then GICR_VPROPBASER = the guest's
//!   LPI configuration table, GICR_VPENDBASER.Valid = 1. On put: Valid = 0,
//!   Dirty polled (bounded), PendingLast read. The vPE stays resident after
//!   its vCPU's turn until that pCPU's scheduler picks another vCPU or idles
//!   (`runtime::vpe::release`, as Xen and KVM switch lazily): a
//!   continuation that picks the same vCPU costs no register write and no
//!   ITS command. A pCPU that loads the vCPU meanwhile waits (bounded) for
//!   that release (`VcpuShared::vpe_on`): a vPE is resident on one
//!   redistributor at a time and VMOVP moves a vPE resident nowhere.
//! * `runtime::vpe::doorbell`: GICv4.0 raises the doorbell for every vLPI that arrives
//!   while the vPE is not resident, so it comes for blocked vCPUs and for
//!   runnable but descheduled ones alike (`its::v4::doorbell_for`). A
//!   blocked vCPU is woken with `WakeCause::Doorbell` through the
//!   scheduler's wake path (so `sched_wake_preempt=off` stays the
//!   Xen-compatible control), counted in `doorbells`. A runnable one is
//!   expected and gets no extra wake (it is on a runqueue already, not a
//!   wake in Credit2 terms; loading it rescans its pending table): counted
//!   in `doorbells_runnable`. Only a doorbell for a running (or offline)
//!   vCPU is spurious (`doorbells_spurious`): its vPE was in the short
//!   non-resident window of a load, put or WFI check, which `vlpi_pending`
//!   covers.
//!
//! WFI: `runtime::vcpu::block` returns to the guest at once, the vPE left
//! resident, when the vGIC holds a deliverable interrupt; otherwise it puts
//! the vPE and blocks only when PendingLast is clear and no doorbell came
//! since (the `vlpi_pending` flag, set under the vGIC lock, which `block`
//! holds from its check to the scheduler's block: a doorbell cannot slip
//! between).

use crate::arch::gic;
use crate::arch::gic::its::VpeHw;
use crate::irq::{IrqRoutes, Route};
use crate::its::host::ItsError;
use crate::its::v4::{GuestChange, VlpiIts, Vpe, VpeMap};
use alloc::vec::Vec;
use log::{info, warn};

/// The VM's vPEs.
pub struct VlpiVm {
    pub vpes: VpeMap,
    pub hw: Vec<VpeHw>,
}

impl VlpiVm {
    /// One vPE per vCPU, vCPU `i` VMAPPed to pCPU `i % nr_pcpus`, each
    /// doorbell routed to its vCPU in `routes` (the table physical
    /// interrupts go by: Dom0's). vPE IDs and the doorbells' routes are the
    /// vCPUs' host-wide scheduler ids (`vcpu_base + i`), unique across VMs.
    /// `None` (and a log line) when any step fails: the VM then uses host
    /// LPIs.
    pub fn create(nr_vcpus: usize, nr_pcpus: usize, vcpu_base: u32, routes: &mut IrqRoutes) -> Option<VlpiVm> {
        let mut hw = Vec::new();
        for i in 0..nr_vcpus {
            let gid = vcpu_base as usize + i;
            let Ok(id) = u16::try_from(gid) else {
                warn!("GICv4: vCPU{i}: no vPE ID for scheduler id {gid}; using host LPIs");
                return None;
            };
            let r = gic::its::create_vpe(id, i % nr_pcpus.max(1));
            match r {
                Ok(h) => {
                    if let Err(e) = routes.insert(h.doorbell, Route::Doorbell { vcpu: gid }) {
                        warn!("GICv4: doorbell of vCPU{i}: {e}; using host LPIs");
                        return None;
                    }
                    hw.push(h);
                }
                Err(e) => {
                    warn!("GICv4: vPE for vCPU{i}: {e}; using host LPIs");
                    return None;
                }
            }
        }
        let vpes = VpeMap::new(hw.iter().map(|h| Vpe { vpe: h.vpe, doorbell: u32::from(h.doorbell) }).collect());
        info!(
            "GICv4: {} vPE(s), doorbells {:?}",
            hw.len(),
            hw.iter().map(|h| u32::from(h.doorbell)).collect::<Vec<_>>()
        );
        Some(VlpiVm { vpes, hw })
    }
}

/// The physical ITS as the GICv4 backend sees it.
pub struct PhysIts;

impl VlpiIts for PhysIts {
    fn map_device(&mut self, device: u32, event_bits: u8) -> Result<(), ItsError> {
        gic::its::map_device(device, event_bits)
    }
    fn unmap_device(&mut self, device: u32) -> Result<(), ItsError> {
        gic::its::unmap_device(device)
    }
    fn change(&mut self, c: GuestChange, vpes: &VpeMap) -> Result<(), ItsError> {
        gic::its::vlpi_change(c, vpes)
    }
}

/// The vITS backend of a VM with vPEs.
pub type DirectBackend<'a> = crate::vgic::its::direct::DirectBackend<'a, PhysIts>;
