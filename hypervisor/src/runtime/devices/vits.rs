//! The guest's virtual ITS wired to the physical one.
//!
//! `vgic::its::Vits` decodes the guest's commands; this file is its EL2
//! side:
//! * [`HostBackend`] is the `ItsBackend` that backs every (DeviceID,
//!   EventID) the guest maps with a host LPI in the physical ITS
//!   (`gic::its::map_event`) and enters it in the VM's IRQ route table as
//!   `Route::GuestLpi`. A passthrough PCIe device writes its MSI straight
//!   into the physical GITS_TRANSLATER (Dom0 is identity-mapped, the
//!   guest-visible DeviceIDs are the requester IDs), so the host LPI fires
//!   at EL2 and [`guest_lpi`] turns it into the guest's LPI.
//! * `vits_mmio` is the trapped GITS control frame, registered on the
//!   VM's bus by [`register`].
//! * [`Backend`] picks, per VM, that backend or GICv4's
//!   (`runtime::vlpi::DirectBackend`).
//!
//! Lock order: vITS → vGIC → (IRQ routes | physical ITS), the last two
//! leaves. The interrupt path takes the vITS lock alone, then the vGIC
//! lock alone.
//!
//! Host LPIs fire on the pCPU of the vCPU the guest targets (vCPU `v` →
//! pCPU `v % nr_pcpus`, where the scheduler starts it); the injection
//! itself kicks the vCPU wherever it runs.

use super::claim;
use crate::arch::gic;
use crate::domain::vmplan::VmPlan;
use crate::esr::{self, MmioAccess};
use crate::intid::IntId;
use crate::irq::Route;
use crate::its::host::ItsError;
use crate::mmio_bus::{BusError, Device};
use crate::runtime::vlpi::{DirectBackend, PhysIts};
use crate::runtime::vm::{inc, Bus, MmioFault, Vcpu, Vm};
use crate::runtime::wake::process_kicks;
use crate::sched::WakeCause;
use crate::vgic::its::{BackendError, ItsBackend};
use crate::vgic::VgicError;
use crate::virtio::IdentityMappedRam;
use log::warn;

/// The guest's RAM as the vITS and the vGIC read it (the command queue and
/// the LPI configuration table).
pub fn guest_ram(vm: &Vm) -> IdentityMappedRam {
    // SAFETY: the VM's RAM (Dom0's at its own address, a DomU's at
    // `ram_host`) is identity-mapped at EL2 as Normal memory for the whole
    // life of the VM, and the hypervisor keeps nothing in it.
    unsafe { IdentityMappedRam::at(vm.ram.base, vm.ram.size, vm.ram_host) }
}

/// The table physical interrupts are routed by: Dom0's, for every VM
/// (`runtime::vcpu::handle_irqs`); `vm`'s own while the VM table is not
/// yet made (only Dom0 exists then).
fn host_routes(vm: &Vm) -> &crate::sync::RwLock<crate::irq::IrqRoutes> {
    crate::runtime::vm::try_vms().and_then(|t| t.first()).map_or(&vm.routes, |d0| &d0.routes)
}

/// The VM whose device `devid` is: the DomU it is assigned to, else Dom0.
pub fn lpi_owner(dom0: &'static Vm, devid: u32) -> &'static Vm {
    crate::runtime::vm::vms()
        .iter()
        .skip(1)
        .find(|v| v.pci_functions.iter().any(|f| f.devid == devid))
        .copied()
        .unwrap_or(dom0)
}

/// Backs the guest's ITS mappings with host LPIs.
pub struct HostBackend<'a> {
    pub vm: &'a Vm,
}

impl HostBackend<'_> {
    fn pcpu(&self, vcpu: Option<usize>) -> usize {
        vcpu.unwrap_or(0) % self.vm.nr_pcpus.max(1)
    }
}

fn refused(what: &str, device: u32, e: ItsError) -> BackendError {
    warn!("vITS: physical ITS refused {what} for DeviceID {device:#x}: {e}");
    match e {
        ItsError::NoFreeLpi | ItsError::OutOfMemory => BackendError::NoResources,
        ItsError::DeviceOutOfRange(d) => BackendError::BadDevice(d),
        _ => BackendError::Hardware,
    }
}

impl ItsBackend for HostBackend<'_> {
    fn map_device(&mut self, device: u32, event_bits: u8) -> Result<(), BackendError> {
        gic::its::map_device(device, event_bits).map_err(|e| refused("MAPD", device, e))
    }

    fn unmap_device(&mut self, device: u32) {
        if let Err(e) = gic::its::unmap_device(device) {
            refused("MAPD V=0", device, e);
        }
    }

    fn map_event(&mut self, device: u32, event: u32, _vintid: IntId, vcpu: Option<usize>) -> Result<(), BackendError> {
        let lpi = gic::its::map_event(device, event, self.pcpu(vcpu)).map_err(|e| refused("MAPTI", device, e))?;
        if let Err(e) = host_routes(self.vm).write().insert(lpi, Route::GuestLpi { devid: device, eventid: event }) {
            warn!("vITS: {e}");
            let _ = gic::its::unmap_event(device, event);
            return Err(BackendError::NoResources);
        }
        Ok(())
    }

    fn unmap_event(&mut self, device: u32, event: u32) {
        match gic::its::unmap_event(device, event) {
            Ok(lpi) => {
                let _ = host_routes(self.vm).write().remove(lpi);
            }
            Err(e) => {
                refused("DISCARD", device, e);
            }
        }
    }

    fn move_event(&mut self, device: u32, event: u32, vcpu: Option<usize>) {
        if let Err(e) = gic::its::move_event(device, event, self.pcpu(vcpu)) {
            refused("MOVI", device, e);
        }
    }
}

/// How the vITS's mappings are backed, chosen when the VM was made: GICv4
/// vLPIs (`runtime::vlpi`) when it has vPEs, host LPIs otherwise.
enum How<'a> {
    Emulated(HostBackend<'a>),
    Direct(DirectBackend<'a>),
}

/// The vITS backend of `vm`. Either way MAPD gives the device a physical
/// ITT from the heap: charged to the VM's quota first (a VM at its quota
/// has its MAPD refused, which the vITS counts), given back at MAPD V=0.
pub struct Backend<'a> {
    vm: &'a Vm,
    how: How<'a>,
}

impl<'a> Backend<'a> {
    pub fn of(vm: &'a Vm) -> Self {
        let how = match vm.vlpi.as_ref() {
            Some(v4) => How::Direct(DirectBackend { its: PhysIts, vpes: &v4.vpes }),
            None => How::Emulated(HostBackend { vm }),
        };
        Backend { vm, how }
    }

    fn get(&mut self) -> &mut dyn ItsBackend {
        match &mut self.how {
            How::Emulated(b) => b,
            How::Direct(b) => b,
        }
    }
}

impl ItsBackend for Backend<'_> {
    fn map_device(&mut self, device: u32, event_bits: u8) -> Result<(), BackendError> {
        let cost = gic::its::itt_cost(event_bits).map_err(|e| refused("MAPD", device, e))?;
        if let Err(e) = self.vm.quota.try_charge(cost) {
            warn!("vITS: MAPD of DeviceID {device:#x} refused: {e}");
            return Err(BackendError::NoResources);
        }
        let r = self.get().map_device(device, event_bits);
        if r.is_err() {
            self.vm.quota.release(cost);
        }
        r
    }
    fn unmap_device(&mut self, device: u32) {
        let cost = gic::its::device_itt_cost(device);
        self.get().unmap_device(device);
        if let Some(cost) = cost.filter(|_| gic::its::device_itt_cost(device).is_none()) {
            self.vm.quota.release(cost);
        }
    }
    fn map_event(&mut self, device: u32, event: u32, vintid: IntId, vcpu: Option<usize>) -> Result<(), BackendError> {
        self.get().map_event(device, event, vintid, vcpu)
    }
    fn unmap_event(&mut self, device: u32, event: u32) {
        self.get().unmap_event(device, event)
    }
    fn move_event(&mut self, device: u32, event: u32, vcpu: Option<usize>) {
        self.get().move_event(device, event, vcpu)
    }
    fn inv_event(&mut self, device: u32, event: u32, vcpu: usize) {
        self.get().inv_event(device, event, vcpu)
    }
    fn invall(&mut self, vcpu: usize) {
        self.get().invall(vcpu)
    }
    fn int_event(&mut self, device: u32, event: u32, vcpu: usize) -> bool {
        self.get().int_event(device, event, vcpu)
    }
    fn clear_event(&mut self, device: u32, event: u32, vcpu: usize) {
        self.get().clear_event(device, event, vcpu)
    }
}

/// A host LPI routed to the guest fired: the priority drop ends it (LPIs
/// have no active state), then the guest's LPI for (`device`, `event`) is
/// made pending on the vCPU its collection names, which is woken through
/// the scheduler's wake path like any other interrupt.
pub fn guest_lpi(vm: &Vm, me: usize, id: IntId, device: u32, event: u32) {
    gic::eoi(id);
    let Some(vits) = vm.vits.as_ref() else { return };
    let Some((vintid, vcpu)) = vits.lock().translate(device, event) else {
        // Unmapped since, or its collection is: the MSI goes nowhere.
        inc(&vm.lpis_dropped);
        return;
    };
    let kicks = vm.vgic.lock().inject_lpi(vintid, vcpu);
    match kicks {
        Ok(k) => {
            if let Some(s) = vm.shared.get(vcpu) {
                inc(&s.counters.lpis_injected);
            }
            process_kicks(vm, me, k, WakeCause::Interrupt);
        }
        Err(_) => inc(&vm.lpis_dropped),
    }
}

/// Claims the GITS control frame.
pub fn register(bus: &mut Bus, vp: &VmPlan) -> Result<(), BusError> {
    claim(bus, vp, Device::Vits, vits_mmio)
}

/// A trapped access to the GITS control frame. Err: not a valid access
/// (the caller injects an abort).
fn vits_mmio(vm: &Vm, me: usize, v: &mut Vcpu, a: &MmioAccess, _off: u64, value: u64) -> Result<(), MmioFault> {
    let vits = vm.vits.as_ref().ok_or(VgicError::OutOfRange)?;
    let mem = guest_ram(vm);
    let mut backend = Backend::of(vm);
    let kicks = {
        let mut its = vits.lock();
        let mut vgic = vm.vgic.lock();
        if a.write {
            its.mmio_write(a.ipa, a.size, value, &mem, &mut *vgic, &mut backend)?
        } else {
            let (r, k) = its.mmio_read(a.ipa, a.size, &mem, &mut *vgic, &mut backend)?;
            v.regs.set_reg(a.reg, esr::load_value(a, r));
            k
        }
    };
    process_kicks(vm, me, kicks, WakeCause::Interrupt);
    Ok(())
}

/// After a vGIC write: redistributors whose EnableLPIs went 0 → 1 read the
/// guest's LPI configuration table now (the vGIC model cannot read memory
/// from inside its MMIO handler).
pub fn lpis_enabled(vm: &Vm, me: usize, vcpus: alloc::vec::Vec<usize>) {
    if vcpus.is_empty() {
        return;
    }
    let mem = guest_ram(vm);
    for v in vcpus {
        let r = vm.vgic.lock().load_lpi_config(&mem, v);
        match r {
            Ok(k) => process_kicks(vm, me, k, WakeCause::Interrupt),
            Err(e) => warn!("vCPU{v}: LPI configuration table: {e}"),
        }
    }
}
