//! PCIe functions assigned to DomUs (`hv,pci-assigned`, [`plan_pci`]):
//! where each one's configuration page is, where its BARs go in host and
//! guest address space, and which IDs its MSIs and DMA carry.
//!
//! The function stays where it is on the host's bridge. What changes:
//! * Dom0 no longer sees it: its ECAM page is cut out of Dom0's stage 2 and
//!   emulated as an empty slot (all-ones reads), and the part of the
//!   bridge's 32-bit window its BARs take (the *carve*, at the window's top)
//!   is cut out of Dom0's stage 2 and of the window Dom0's DT describes, so
//!   Dom0 never places another device's BAR over it.
//! * The DomU gets a host bridge of its own ([`DOMU_ECAM`], one bus) whose
//!   device `slot` is the function, its BARs at fixed guest addresses in
//!   [`DOMU_PCI_MMIO`] mapped to the physical BARs (the guest is told
//!   `linux,pci-probe-only`, so it keeps them), and a vITS at [`DOMU_ITS`]
//!   whose `msi-map` gives the function its physical ITS DeviceID.
//! * Its DMA is confined by the SMMU to the DomU's RAM and its vITS's
//!   doorbell page (mapped to the physical GITS_TRANSLATER): an MSI-X
//!   entry naming any other address faults in the SMMU.
//!
//! Only functions on a bridge's root bus can be assigned (below a switch
//! the BARs would have to fit the switch's windows, which Dom0 programs),
//! only with an SMMU in front of the bridge and an ITS behind it, and only
//! with memory BARs (the EL2 probe refuses I/O BARs).

use super::error::PlanError;
use super::{MapWhy, Mapping, MAX_ASSIGNED, PAGE};
use crate::config::IommuMode;
use crate::dtb::{Machine, PciSpace, PcieHost};
use crate::ids::DomainId;
use crate::region::Region;
use crate::stage2::MemType;
use crate::vpci::{Bdf, PhysBar};
use alloc::vec::Vec;

/// The DomU's virtual ECAM: one bus, as QEMU virt's low ECAM.
pub const DOMU_ECAM: Region = Region { base: 0x3f00_0000, size: 0x10_0000 };
/// The DomU's virtual 32-bit memory window, as QEMU virt's.
pub const DOMU_PCI_MMIO: Region = Region { base: 0x1000_0000, size: 0x2eff_0000 };
/// The DomU's vITS (control and translation frames), as QEMU virt's ITS.
pub const DOMU_ITS: Region = Region { base: 0x0808_0000, size: 0x2_0000 };

/// What the EL2 probe read from one assigned function (`runtime::pci`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbedPci {
    pub domid: DomainId,
    pub bdf: Bdf,
    /// Its memory BARs (`vpci::probe_bars`).
    pub bars: Vec<PhysBar>,
    /// It supports Function Level Reset.
    pub flr: bool,
}

/// One BAR of an assigned function, placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacedBar {
    pub bar: PhysBar,
    /// Host physical address (in the carve).
    pub pa: u64,
    /// What the physical BAR register holds: the PCI bus address of `pa`.
    pub bus: u64,
    /// Guest-physical address (in [`DOMU_PCI_MMIO`]).
    pub ipa: u64,
}

/// One function assigned to a DomU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AssignedPci {
    pub domid: DomainId,
    pub bdf: Bdf,
    /// Index of its host bridge in `Machine::pcie`.
    pub bridge: usize,
    /// Host physical address of its 4 KiB ECAM page.
    pub config: u64,
    /// Its requester ID on the bridge.
    pub rid: u32,
    /// The ITS DeviceID its MSIs carry (the bridge's `msi-map`).
    pub devid: u32,
    /// The SMMU (index into `Machine::smmus`) and StreamID its DMA carries.
    pub stream: (usize, u32),
    pub bars: Vec<PlacedBar>,
    pub flr: bool,
    /// Its device number on the DomU's bus (function 0).
    pub slot: u8,
}

impl AssignedPci {
    /// The DomU's guest-physical address of this function's ECAM page.
    pub fn guest_config(&self) -> u64 {
        DOMU_ECAM.base + (u64::from(self.slot) << 15)
    }
}

/// Every assignment on the machine.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PciPlan {
    pub functions: Vec<AssignedPci>,
    /// Per bridge (index into `Machine::pcie`), the top of its 32-bit
    /// window the assigned BARs take.
    pub carves: Vec<(usize, Region)>,
}

impl PciPlan {
    /// The functions DomU `domid` is given.
    pub fn of(&self, domid: DomainId) -> impl Iterator<Item = &AssignedPci> {
        self.functions.iter().filter(move |f| f.domid == domid)
    }

    /// Whether Dom0's DMA and MSIs must leave out requester `rid` of
    /// bridge `bridge`.
    pub fn takes_rid(&self, bridge: usize, rid: u32) -> bool {
        self.functions.iter().any(|f| f.bridge == bridge && f.rid == rid)
    }
}

/// The bridge and ECAM page of `bdf`: segment N is the Nth host bridge of
/// the description (QEMU virt and the FVP have one, segment 0).
pub fn locate(machine: &Machine, bdf: Bdf) -> Result<(usize, u64), PlanError> {
    let b = machine.pcie.get(usize::from(bdf.seg)).ok_or(PlanError::PciNoBridge(bdf))?;
    if bdf.bus != b.bus_range.0 {
        return Err(PlanError::PciNotRootBus(bdf));
    }
    let off = (u64::from(bdf.bus - b.bus_range.0) << 20) | (u64::from(bdf.dev) << 15) | (u64::from(bdf.func) << 12);
    if off + PAGE > b.ecam.size {
        return Err(PlanError::PciNoBridge(bdf));
    }
    Ok((usize::from(bdf.seg), b.ecam.base + off))
}

/// Plans every assignment `probed` lists: checks each function is assignable
/// (a root-bus function of a bridge behind an SMMU, with an ITS DeviceID,
/// given once), carves its BARs from the top of its bridge's 32-bit window
/// and places them in its DomU's window. No function: an empty plan.
pub fn plan_pci(
    machine: &Machine,
    iommu: IommuMode,
    its_present: bool,
    probed: &[ProbedPci],
) -> Result<PciPlan, PlanError> {
    let mut plan = PciPlan::default();
    if probed.is_empty() {
        return Ok(plan);
    }
    // Per bridge: (bridge, its window's end, the carve's lowest address so
    // far). Per DomU: (domid, its next free IPA, its next device number).
    let mut carve_by_bridge: Vec<(usize, u64, u64)> = Vec::new();
    let mut guest_next: Vec<(DomainId, u64, u8)> = Vec::new();
    for p in probed {
        let bdf = p.bdf;
        if plan.functions.iter().any(|f| f.bdf == bdf) {
            return Err(PlanError::PciTwice(bdf));
        }
        let (bridge, config) = locate(machine, bdf)?;
        let host = &machine.pcie[bridge];
        if iommu == IommuMode::Off {
            return Err(PlanError::PciNeedsIommu(bdf));
        }
        let rid = u32::from(bdf.rid());
        let stream = stream_of(machine, host, rid).ok_or(PlanError::PciNeedsIommu(bdf))?;
        let devid = devid_of(host, rid).filter(|_| its_present).ok_or(PlanError::PciNeedsIts(bdf))?;
        let window = host
            .windows
            .iter()
            .find(|w| w.space == PciSpace::Mem32 && !w.prefetchable)
            .ok_or(PlanError::PciNoWindow(bdf))?;
        let state = match carve_by_bridge.iter_mut().find(|c| c.0 == bridge) {
            Some(c) => c,
            None => {
                carve_by_bridge.push((bridge, window.cpu.end(), window.cpu.end()));
                carve_by_bridge.last_mut().expect("just pushed")
            }
        };
        let g = match guest_next.iter_mut().find(|g| g.0 == p.domid) {
            Some(g) => g,
            None => {
                guest_next.push((p.domid, DOMU_PCI_MMIO.base, 0));
                guest_next.last_mut().expect("just pushed")
            }
        };
        if usize::from(g.2) >= MAX_ASSIGNED {
            return Err(PlanError::PciTooMany(p.domid));
        }
        // Largest first, each naturally aligned (a BAR's address is a
        // multiple of its size) and at least a page, so that stage 2 maps
        // nothing of anybody else's.
        let mut bars = p.bars.clone();
        bars.sort_by(|a, b| b.size.cmp(&a.size).then(a.index.cmp(&b.index)));
        let mut placed = Vec::new();
        for bar in bars {
            let size = bar.size.max(PAGE);
            if !bar.size.is_power_of_two() || size > window.cpu.size / 2 {
                return Err(PlanError::PciBarTooBig { bdf, index: bar.index, size: bar.size });
            }
            let pa = state
                .2
                .checked_sub(size)
                .map(|t| t & !(size - 1))
                .filter(|&pa| pa >= window.cpu.base + window.cpu.size / 2);
            let Some(pa) = pa else {
                return Err(PlanError::PciBarTooBig { bdf, index: bar.index, size: bar.size });
            };
            state.2 = pa;
            let ipa = g.1.next_multiple_of(size);
            if ipa + size > DOMU_PCI_MMIO.end() {
                return Err(PlanError::PciBarTooBig { bdf, index: bar.index, size: bar.size });
            }
            g.1 = ipa + size;
            placed.push(PlacedBar { bar, pa, bus: window.pci_addr + (pa - window.cpu.base), ipa });
        }
        placed.sort_by_key(|b| b.bar.index);
        plan.functions.push(AssignedPci {
            domid: p.domid,
            bdf,
            bridge,
            config,
            rid,
            devid,
            stream,
            bars: placed,
            flr: p.flr,
            slot: g.2,
        });
        g.2 += 1;
    }
    plan.carves = carve_by_bridge
        .iter()
        .filter(|&&(_, end, low)| low < end)
        .map(|&(bridge, end, low)| (bridge, Region { base: low, size: end - low }))
        .collect();
    Ok(plan)
}

/// The StreamID (and SMMU) of requester `rid` on `host`, through its
/// `iommu-map`.
fn stream_of(machine: &Machine, host: &PcieHost, rid: u32) -> Option<(usize, u32)> {
    let masked = rid & host.iommu_map_mask.unwrap_or(u32::MAX);
    host.iommu_map.iter().find_map(|e| {
        let sid = e.stream_of(masked)?;
        Some((machine.smmus.iter().position(|s| s.phandle == Some(e.iommu))?, sid))
    })
}

/// The ITS DeviceID of requester `rid` on `host`, through its `msi-map`.
fn devid_of(host: &PcieHost, rid: u32) -> Option<u32> {
    let masked = rid & host.msi_map_mask.unwrap_or(u32::MAX);
    host.msi_map.iter().find_map(|m| {
        let off = masked.checked_sub(m.rid_base)?;
        (off < m.length).then(|| m.msi_base.wrapping_add(off))
    })
}

/// The DomU's stage-2 mappings of its functions' BARs (device memory).
pub fn bar_mappings(functions: &[&AssignedPci]) -> Vec<Mapping> {
    functions
        .iter()
        .flat_map(|f| f.bars.iter())
        .map(|b| Mapping {
            ipa: b.ipa,
            pa: b.pa,
            size: b.bar.size.max(PAGE),
            mem: MemType::Device,
            why: MapWhy::PciBar,
        })
        .collect()
}

/// `ranges` minus `holes`: what is left of each, in order (a hole is
/// inside or outside a range, never straddling more than its ends).
pub fn cut(ranges: &[Region], holes: &[Region]) -> Vec<Region> {
    let mut out: Vec<Region> = ranges.to_vec();
    for h in holes {
        let mut next = Vec::new();
        for r in out {
            if h.end() <= r.base || h.base >= r.end() {
                next.push(r);
                continue;
            }
            if h.base > r.base {
                next.push(Region { base: r.base, size: h.base - r.base });
            }
            if h.end() < r.end() {
                next.push(Region { base: h.end(), size: r.end() - h.end() });
            }
        }
        out = next;
    }
    out
}
