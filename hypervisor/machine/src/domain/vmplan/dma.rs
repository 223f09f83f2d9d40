//! A VM's DMA under the SMMU ([`plan_dma`]): which StreamIDs are its
//! devices' and what those devices may reach.
//!
//! The devices get a stage 2 of their own, a *mirror* of the VM's RAM
//! mappings plus the ITS doorbell page, rather than the CPU's stage 2
//! shared with the SMMU (Xen's `sharept`). The CPU's tables also map the
//! device windows the VM drives (its PCIe bridges' ECAM and BARs, an ACPI
//! Dom0's on-demand MMIO), which a device must not reach (peer-to-peer
//! writes into another device's registers), and lack the doorbell, which
//! the CPU must not reach (a CPU write to GITS_TRANSLATER would inject any
//! host LPI). A VM's RAM mappings are fixed when it is made, so the mirror
//! never goes stale.
//!
//! Streams: every requester ID of the first [`DMA_BUSES`] buses of each
//! bridge the VM is given, through the bridge's `iommu-map` (and
//! `iommu-map-mask`). Buses beyond those are not attached: their DMA
//! aborts, as an unknown stream's does. A map naming an SMMU the
//! description lacks is a boot error.

use super::error::PlanError;
use super::{MapWhy, Mapping, PAGE};
use crate::config::IommuMode;
use crate::dtb::{Machine, PcieHost};
use crate::region::Region;
use crate::stage2::MemType;
use alloc::vec::Vec;

/// Buses per bridge whose streams a VM's devices get: the root bus and
/// the first bridges Linux numbers below it. Each costs a 16 KiB level-2
/// stream table per SMMU.
pub const DMA_BUSES: u32 = 16;

/// The GITS_TRANSLATER page: the second 64 KiB frame of the ITS.
pub const ITS_TRANSLATER_OFFSET: u64 = 0x1_0000;

/// StreamIDs `[first, first + count)` of SMMU `smmu` (an index into
/// `Machine::smmus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamRange {
    pub smmu: usize,
    pub first: u32,
    pub count: u32,
}

/// What a VM's devices are confined to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DmaPlan {
    /// The VM's streams, sorted, each range within one SMMU.
    pub streams: Vec<StreamRange>,
    /// The devices' stage 2: the VM's RAM and the ITS doorbell page.
    pub mappings: Vec<Mapping>,
}

/// Plans the DMA of a VM given `bridges`, whose CPU stage 2 is `cpu` and
/// whose MSIs go to the ITS at `its` (the guest's vITS sits at the host's
/// address, so the doorbell's IPA is its PA). `None`: `iommu=off`, no SMMU
/// described, or no bridge behind one. `not_ours(bridge, rid)`: requester
/// `rid` of `bridges[bridge]` is another VM's (assigned to a DomU).
pub fn plan_dma(
    machine: &Machine,
    mode: IommuMode,
    bridges: &[PcieHost],
    cpu: &[Mapping],
    its: Option<Region>,
    not_ours: &dyn Fn(usize, u32) -> bool,
) -> Result<Option<DmaPlan>, PlanError> {
    if mode == IommuMode::Off || machine.smmus.is_empty() {
        return Ok(None);
    }
    let mut sids: Vec<(usize, u32)> = Vec::new();
    for (bi, b) in bridges.iter().enumerate() {
        for e in &b.iommu_map {
            if !machine.smmus.iter().any(|s| s.phandle == Some(e.iommu)) {
                return Err(PlanError::IommuMapMissing { bridge: b.path.clone(), phandle: e.iommu });
            }
        }
        let first = u32::from(b.bus_range.0) << 8;
        let last = (u32::from(b.bus_range.1) + 1).min(u32::from(b.bus_range.0) + DMA_BUSES) << 8;
        let mask = b.iommu_map_mask.unwrap_or(u32::MAX);
        for rid in (first..last).filter(|&rid| !not_ours(bi, rid)) {
            let masked = rid & mask;
            if let Some((smmu, sid)) = b.iommu_map.iter().find_map(|e| {
                let sid = e.stream_of(masked)?;
                Some((machine.smmus.iter().position(|s| s.phandle == Some(e.iommu))?, sid))
            }) {
                sids.push((smmu, sid));
            }
        }
    }
    if sids.is_empty() {
        return Ok(None);
    }
    let streams = stream_ranges(sids);
    let mut mappings: Vec<Mapping> = cpu.iter().filter(|m| m.why == MapWhy::Ram).copied().collect();
    if let Some(its) = its {
        let page = its.base + ITS_TRANSLATER_OFFSET;
        mappings.push(Mapping { ipa: page, pa: page, size: PAGE, mem: MemType::Device, why: MapWhy::Doorbell });
    }
    Ok(Some(DmaPlan { streams, mappings }))
}

/// The DMA of a DomU's assigned functions: their streams, its RAM
/// (`ram`, its CPU mapping) and its vITS's doorbell page at `doorbell_ipa`,
/// backed by the physical ITS's GITS_TRANSLATER page (`its`).
pub fn plan_dma_assigned(
    functions: &[&super::AssignedPci],
    ram: Mapping,
    doorbell_ipa: u64,
    its: Region,
) -> Option<DmaPlan> {
    if functions.is_empty() {
        return None;
    }
    let streams = stream_ranges(functions.iter().map(|f| f.stream).collect());
    let doorbell = Mapping {
        ipa: doorbell_ipa,
        pa: its.base + ITS_TRANSLATER_OFFSET,
        size: PAGE,
        mem: MemType::Device,
        why: MapWhy::Doorbell,
    };
    Some(DmaPlan { streams, mappings: Vec::from([ram, doorbell]) })
}

/// (SMMU, StreamID) pairs as sorted ranges.
fn stream_ranges(mut sids: Vec<(usize, u32)>) -> Vec<StreamRange> {
    sids.sort_unstable();
    sids.dedup();
    let mut streams: Vec<StreamRange> = Vec::new();
    for (smmu, sid) in sids {
        match streams.last_mut() {
            Some(r) if r.smmu == smmu && r.first + r.count == sid => r.count += 1,
            _ => streams.push(StreamRange { smmu, first: sid, count: 1 }),
        }
    }
    streams
}

/// The SMMUs' wired interrupts the hypervisor takes (`irq::Route::Smmu`):
/// none with `iommu=off`.
pub fn smmu_irqs(machine: &Machine, mode: IommuMode) -> Vec<crate::intid::IntId> {
    if mode == IommuMode::Off {
        return Vec::new();
    }
    machine.smmus.iter().flat_map(|s| [s.eventq, s.gerror]).flatten().collect()
}
