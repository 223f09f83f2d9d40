//! PCIe functions assigned to DomUs, the EL2 side: the physical
//! functions' configuration space through the host bridge's ECAM
//! ([`EcamFunction`]), the boot probe and BAR programming ([`prepare`]),
//! and the function-level reset when a DomU stops ([`reset_domain`]).
//!
//! The decisions are `vpci` (what a BAR is, what a guest may write) and
//! `domain::vmplan::plan_pci` (where everything goes), both host-tested;
//! this file only moves the bytes.

use crate::domain::vmplan::{self, AssignedPci, PciPlan, ProbedPci};
use crate::domain::{DomuPlacement, VmSpec};
use crate::dtb::Machine;
use crate::ids::DomainId;
use crate::region::Region;
use crate::vpci::{self, ConfigSpace};
use alloc::vec::Vec;
use core::sync::atomic::AtomicU64;
use log::{info, warn};
use spin::Once;

/// One physical function's 4 KiB of ECAM.
pub struct EcamFunction {
    base: u64,
}

impl EcamFunction {
    /// # Safety
    /// `base` is the 4 KiB ECAM page of one function, inside the platform's
    /// device windows (mapped Device-nGnRE by the boot identity map), and
    /// only the hypervisor drives that function's configuration space.
    pub unsafe fn new(base: u64) -> Self {
        EcamFunction { base }
    }
}

impl ConfigSpace for EcamFunction {
    fn read32(&mut self, off: u16) -> u32 {
        let off = u64::from(off & 0xffc);
        // SAFETY: inside the function's ECAM page (`new`'s contract),
        // aligned; ECAM reads have no side effects beyond the device's own.
        unsafe { core::ptr::read_volatile((self.base + off) as *const u32) }
    }
    fn write32(&mut self, off: u16, val: u32) {
        let off = u64::from(off & 0xffc);
        // SAFETY: as for `read32`; the value is what `vpci` decided to
        // write to this function.
        unsafe { core::ptr::write_volatile((self.base + off) as *mut u32, val) }
    }
}

/// What guests did to configuration space that the vPCI model did not
/// pass on (`runtime::devices::vpci`).
#[derive(Default)]
pub struct PciCounters {
    /// Writes the model ignored (read-only or hidden fields).
    pub cfg_ignored: AtomicU64,
    /// BAR writes that would move a BAR (not followed: the BAR stays mapped
    /// where the hypervisor put it).
    pub bar_moves: AtomicU64,
    /// Malformed accesses (size, alignment).
    pub cfg_bad: AtomicU64,
    /// Dom0's accesses to a hidden function's page.
    pub hidden: AtomicU64,
}

/// What [`prepare`] found and decided, read by the planners
/// (`runtime::create::hw_facts`) and the DomUs' devices.
static PROBED: Once<(Vec<ProbedPci>, PciPlan)> = Once::new();

/// The probe's findings (empty before [`prepare`] or without assignments).
pub fn probed() -> &'static [ProbedPci] {
    PROBED.get().map_or(&[], |p| &p.0)
}

/// Whether `[base, base + size)` is in the platform's device windows.
fn device_mapped(r: Region) -> bool {
    let last = r.base + r.size - 1;
    last >> 30 < 512 && (r.base >> 30..=last >> 30).all(crate::platform::is_device_gib)
}

/// Probes every function the DomUs are given (`hv,pci-assigned`), plans
/// where their BARs go (`plan_pci`) and programs the physical BARs, with
/// Memory Space and Bus Master disabled until the DomU enables them. Any
/// problem is one boot error. Before any VM is made: Dom0 never sees the
/// functions as they were.
pub fn prepare(
    machine: &Machine,
    iommu: crate::config::IommuMode,
    domus: &[(VmSpec, DomuPlacement)],
) -> Result<(), alloc::string::String> {
    use alloc::format;
    let mut probed = Vec::new();
    for (spec, _) in domus {
        for &bdf in &spec.pci {
            let (_, page) = vmplan::locate(machine, bdf).map_err(|e| format!("{e}"))?;
            if !device_mapped(Region { base: page, size: 0x1000 }) {
                return Err(format!(
                    "hv,pci-assigned {bdf}: its ECAM at {page:#x} is outside the platform's device windows"
                ));
            }
            // SAFETY: the function's ECAM page, in the device windows
            // (checked above); nothing else drives it before the VMs run.
            let mut f = unsafe { EcamFunction::new(page) };
            let bars = vpci::probe_bars(&mut f).map_err(|e| format!("hv,pci-assigned {bdf}: {e}"))?;
            let flr = vpci::flr_capable(&mut f);
            info!(
                "pci {bdf} → d{}: BARs {:?}, FLR {}",
                spec.id,
                bars.iter().map(|b| (b.index, b.size)).collect::<Vec<_>>(),
                if flr { "yes" } else { "no" }
            );
            probed.push(ProbedPci { domid: spec.id, bdf, bars, flr });
        }
    }
    if probed.is_empty() {
        return Ok(());
    }
    let plan =
        vmplan::plan_pci(machine, iommu, crate::arch::gic::its::its_present(), &probed).map_err(|e| format!("{e}"))?;
    for f in &plan.functions {
        if crate::arch::smmu::features(f.stream.0).is_none() {
            return Err(format!(
                "hv,pci-assigned {}: SMMU{} is not working, so its DMA cannot be confined",
                f.bdf, f.stream.0
            ));
        }
        // SAFETY: as above; `plan_pci` located the same page.
        let mut phys = unsafe { EcamFunction::new(f.config) };
        let bars: Vec<_> = f.bars.iter().map(|b| (b.bar, b.bus)).collect();
        vpci::program_bars(&mut phys, &bars);
        info!(
            "pci {}: BARs at host {:x?}, guest {:x?}; DeviceID {:#x}, StreamID {:#x} of SMMU{}",
            f.bdf,
            f.bars.iter().map(|b| b.pa).collect::<Vec<_>>(),
            f.bars.iter().map(|b| b.ipa).collect::<Vec<_>>(),
            f.devid,
            f.stream.1,
            f.stream.0
        );
    }
    for (bridge, carve) in &plan.carves {
        info!("pci: {:#x}+{:#x} of bridge {bridge}'s window is for assigned BARs", carve.base, carve.size);
    }
    PROBED.call_once(|| (probed, plan));
    Ok(())
}

/// A DomU stopped: each of its functions stops decoding and mastering,
/// and is reset (Function Level Reset) when it can be, so nothing it was
/// doing outlives the domain. Nobody uses the function afterwards, so
/// nothing waits for the reset to end.
pub fn reset_domain(domid: DomainId, functions: &[AssignedPci]) {
    for f in functions {
        // SAFETY: the function's ECAM page, checked at `prepare`.
        let mut phys = unsafe { EcamFunction::new(f.config) };
        let flr = vpci::start_reset(&mut phys);
        info!("d{domid}: pci {} {}", f.bdf, if flr { "reset (FLR)" } else { "disabled (no FLR)" });
        if !flr {
            warn!("d{domid}: pci {} cannot be reset; its state stays as the domain left it", f.bdf);
        }
    }
}
