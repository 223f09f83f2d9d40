//! What both planners share: which SPIs a vGIC can forward, the passthrough
//! check against RAM and the hypervisor's own ranges, the MMIO bus list of
//! the emulated devices, the IPA-space check of the mappings and an ACPI
//! Dom0's on-demand device memory policy.

use super::error::PlanError;
use super::{DiskPlan, Forward, Mapping, VgicPlan, PAGE};
use crate::boot::plan::{self, LayoutError, Plan};
use crate::dtb::{Machine, MmioDevice, PcieHost};
use crate::intid::IntId;
use crate::iomem::IoMemPolicy;
use crate::mmio_bus::{Device, MmioRange};
use crate::region::Region;
use crate::stage2::IpaSize;
use crate::vgic::{MAX_SPIS, NR_PRIVATE};
use alloc::vec::Vec;

/// Host LPIs a Dom0's route table has room for (allocated when the VM is
/// made: adding a route never allocates). Each backs one guest MSI.
pub const LPI_ROUTES: usize = 1024;

/// Whether a vGIC with `nr_spis` SPIs can HW-link `intid` (an SPI it has,
/// below the special range): what `Vgic::set_hw` accepts.
pub(super) fn vgic_has_spi(nr_spis: u32, intid: IntId) -> bool {
    let top = NR_PRIVATE + nr_spis.div_ceil(32).saturating_mul(32).min(MAX_SPIS);
    let raw = u32::from(intid);
    raw >= NR_PRIVATE && raw < top && intid < IntId::SPECIAL_FIRST
}

/// Pushes a forwarded SPI unless already there or the vGIC lacks it.
pub(super) fn forward(out: &mut Vec<Forward>, nr_spis: u32, intid: IntId, edge: bool) {
    if !out.iter().any(|f| f.intid == intid) && vgic_has_spi(nr_spis, intid) {
        out.push(Forward { intid, edge });
    }
}

/// The end of the highest range a DT Dom0 must reach: its RAM, the
/// passthrough devices and the PCIe bridges' ECAM and windows.
pub(super) fn needed_ipa_top(ram: Region, passthrough: &[MmioDevice], bridges: &[PcieHost]) -> u64 {
    let devices = passthrough.iter().map(|d| d.base.saturating_add(d.size));
    let pcie = bridges.iter().flat_map(|b| core::iter::once(b.ecam).chain(b.windows.iter().map(|w| w.cpu)));
    devices.chain(pcie.map(|r| r.base.saturating_add(r.size))).fold(ram.end(), u64::max)
}

/// Passthrough device frames must not reach RAM or anything the hypervisor
/// owns (its memory, the GIC, its UART and virtio-blk slot): the guest would
/// map them through stage 2.
pub(super) fn check_passthrough(
    machine: &Machine,
    plan: &Plan,
    ranges: &[Region],
    own_disk: Option<&MmioDevice>,
) -> Result<(), LayoutError> {
    let mut hyp: Vec<(&'static str, Region)> = Vec::from([
        ("hypervisor image", plan.image),
        ("hypervisor heap", plan.heap),
        ("GIC distributor", machine.gic.gicd),
    ]);
    hyp.extend(plan.ram_disk.map(|r| ("RAM disk", r)));
    hyp.extend(machine.gic.gicr.iter().map(|r| ("GIC redistributors", *r)));
    hyp.extend(machine.gic.its.iter().chain(&machine.gic.other_its).map(|r| ("GIC ITS", *r)));
    hyp.extend(machine.uart.as_ref().map(|u| ("hypervisor UART", Region { base: u.base, size: u.size })));
    hyp.extend(own_disk.map(|d| ("hypervisor virtio-blk", Region { base: d.base, size: d.size })));
    for d in plan.domus.iter() {
        hyp.push(("DomU RAM", d.ram));
        hyp.extend(d.disk.map(|r| ("DomU RAM disk", r)));
    }
    plan::check_passthrough(&machine.memory, &hyp, ranges)
}

/// What an ACPI Dom0 may get mapped on demand: everything in the IPA space
/// but memory (any firmware memory-map entry that is not MMIO, the RAM the
/// machine description lists, the hypervisor's image, heap and RAM disk),
/// the GIC's frames, the hypervisor's UART and the emulated devices.
pub(super) fn iomem_policy(
    machine: &Machine,
    plan: &Plan,
    memory: &[Region],
    bus: &[(MmioRange, Device)],
    ipa: IpaSize,
) -> IoMemPolicy {
    let mut p = IoMemPolicy::new(ipa.limit());
    for r in memory {
        p.deny("firmware memory", *r);
    }
    for r in &machine.memory {
        p.deny("RAM", *r);
    }
    for r in [plan.image, plan.heap].into_iter().chain(plan.ram_disk) {
        p.deny("hypervisor memory", r);
    }
    p.deny("GIC distributor", machine.gic.gicd);
    for r in &machine.gic.gicr {
        p.deny("GIC redistributors", *r);
    }
    for r in machine.gic.its.iter().chain(&machine.gic.other_its) {
        // The control frame and the translation frame after it.
        p.deny("GIC ITS", Region { base: r.base, size: r.size.max(2 * crate::its::CONTROL_FRAME_SIZE) });
    }
    if let Some(u) = &machine.uart {
        p.deny("hypervisor UART", Region { base: u.base, size: u.size.max(PAGE) });
    }
    // The SMMUs are the hypervisor's, driven or not (`iommu=off`).
    for s in &machine.smmus {
        p.deny("SMMU", s.regs);
    }
    for (r, _) in bus {
        p.deny("emulated device", Region { base: r.base, size: r.size });
    }
    p
}

/// The MMIO bus list: the vGIC's distributor and redistributors, the
/// virtio-blk frame, the vPL011's (one `vpl011::FRAME_SIZE` frame, whatever
/// the UART region's size) and the vITS control frame (the translation
/// frame above it stays out of stage 2: devices write the physical one).
pub(super) fn bus_of(
    vgic: &VgicPlan,
    nr_vcpus: usize,
    disk: Option<&DiskPlan>,
    uart: Option<Region>,
    its: Option<Region>,
) -> Vec<(MmioRange, Device)> {
    let mut bus = Vec::from([
        (MmioRange::new(vgic.gicd_base, crate::vgic::regs::GICD_SIZE), Device::Vgic),
        (MmioRange::new(vgic.gicr_base, nr_vcpus as u64 * crate::vgic::regs::GICR_STRIDE), Device::Vgic),
    ]);
    bus.extend(disk.map(|d| (MmioRange::new(d.base, crate::virtio::mmio::FRAME_SIZE), Device::VirtioBlk)));
    bus.extend(uart.map(|u| (MmioRange::new(u.base, crate::vpl011::FRAME_SIZE), Device::Vpl011)));
    bus.extend(its.map(|r| (MmioRange::new(r.base, crate::its::CONTROL_FRAME_SIZE), Device::Vits)));
    bus
}

/// Refuses a mapping that ends beyond the IPA space.
pub(super) fn check_ipa(mappings: &[Mapping], ipa: IpaSize) -> Result<(), PlanError> {
    for m in mappings {
        if m.ipa.checked_add(m.size).is_none_or(|e| e > ipa.limit()) {
            return Err(PlanError::OutsideIpa { why: m.why, base: m.ipa, size: m.size, limit: ipa.limit() });
        }
    }
    Ok(())
}
