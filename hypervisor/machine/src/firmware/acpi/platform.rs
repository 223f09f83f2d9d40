//! The decoded tables ([`AcpiMachine`]) and their translation into the
//! firmware-neutral [`Machine`] the DTB path also produces.
//!
//! What does not fit `Machine` (yet): RAM comes from the EFI memory map,
//! not from ACPI (a parameter here); PCIe windows and INTx routing live in
//! the DSDT's AML (`_CRS`, `_PRT` of the PNP0A08 host bridge), which we do
//! not interpret, so [`PcieHost::windows`] and [`PcieHost::intx`] stay empty
//! and a PCIe host has no DT path; virtio-mmio devices are DSDT devices
//! (LNRO0005) and are not listed; the IORT's `msi-map` targets are named by
//! GIC ITS ID, not by a phandle.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use super::tables::{self, Fadt, Gtdt, Iort, Madt, McfgEntry, Spcr, GICR_V3_STRIDE, GICR_V4_STRIDE};
use super::{AcpiError, Signature, Tables};
use crate::dtb::{GicInfo, IommuMapEntry, Machine, MsiMapEntry, PcieHost, SmmuInfo, TimerInfo, UartInfo};
use crate::intid::IntId;
use crate::region::Region;

/// Size given to the SPCR UART's MMIO frame (SPCR has no size; PL011 and
/// SBSA UART frames are 4 KiB).
pub const UART_SIZE: u64 = 0x1000;

/// Everything the hypervisor decodes from the host's ACPI tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcpiMachine {
    pub fadt: Fadt,
    pub madt: Madt,
    pub gtdt: Gtdt,
    pub spcr: Option<Spcr>,
    pub mcfg: Vec<McfgEntry>,
    pub iort: Option<Iort>,
}

impl AcpiMachine {
    /// Decodes FADT, MADT, GTDT (required) and SPCR, MCFG, IORT (optional).
    pub fn parse(tables: &Tables<'_>) -> Result<Self, AcpiError> {
        let need = |sig| tables.find(sig).ok_or(AcpiError::Missing(sig));
        let fadt = tables::parse_fadt(need(Signature::FADT)?.data)?;
        if !fadt.hw_reduced() {
            return Err(AcpiError::Unsupported { table: Signature::FADT, what: "full (not hardware-reduced) ACPI" });
        }
        if fadt.version < (5, 1) {
            return Err(AcpiError::Unsupported {
                table: Signature::FADT,
                what: "FADT older than 5.1 (no ARM_BOOT_ARCH)",
            });
        }
        Ok(AcpiMachine {
            fadt,
            madt: tables::parse_madt(need(Signature::MADT)?.data)?,
            gtdt: tables::parse_gtdt(need(Signature::GTDT)?.data)?,
            spcr: tables.find(Signature::SPCR).map(|t| tables::parse_spcr(t.data)).transpose()?,
            mcfg: tables.find(Signature::MCFG).map(|t| tables::parse_mcfg(t.data)).transpose()?.unwrap_or_default(),
            iort: tables.find(Signature::IORT).map(|t| tables::parse_iort(t.data)).transpose()?,
        })
    }

    /// The machine as a [`Machine`]; `memory` comes from the EFI memory map.
    pub fn to_machine(&self, memory: Vec<Region>) -> Result<Machine, AcpiError> {
        Ok(Machine {
            memory,
            reserved: Vec::new(),
            cpus: self.madt.giccs.iter().filter(|g| g.usable()).map(|g| g.mpidr).collect(),
            gic: self.gic()?,
            uart: self.uart()?,
            timer: self.timer()?,
            pmu_intid: self.pmu(),
            virtio_mmio: Vec::new(),
            pcie: self.pcie(),
            smmus: self.smmus(),
            psci_method: self.fadt.psci_method().map(String::from),
        })
    }

    fn gic(&self) -> Result<GicInfo, AcpiError> {
        let madt = &self.madt;
        // Version 0 means "ask the hardware": GICD_PIDR2 tells v3 from v4.
        let version = if madt.gic_version == 0 { 3 } else { madt.gic_version };
        if version < 3 {
            return Err(AcpiError::Unsupported { table: Signature::MADT, what: "GIC older than v3" });
        }
        let gicr = if madt.gicr_ranges.is_empty() {
            let stride = if version >= 4 { GICR_V4_STRIDE } else { GICR_V3_STRIDE };
            let frames: Vec<Region> =
                madt.giccs.iter().filter(|g| g.usable()).map(|g| Region { base: g.gicr_base, size: stride }).collect();
            if frames.iter().any(|f| f.base == 0) {
                return Err(AcpiError::BadValue {
                    table: Signature::MADT,
                    offset: 0,
                    what: "GICC GICR base 0 without GICR structures",
                });
            }
            frames
        } else {
            madt.gicr_ranges.clone()
        };
        let maint = madt.giccs.iter().find(|g| g.usable()).map(|g| g.vgic_maint_gsiv).filter(|&v| v != 0);
        Ok(GicInfo {
            version,
            gicd: madt.gicd,
            gicr,
            its: madt.its.first().map(|&(_, r)| r),
            other_its: madt.its.iter().skip(1).map(|&(_, r)| r).collect(),
            maintenance_intid: maint.map(|v| intid(Signature::MADT, v)).transpose()?,
            phandle: None,
        })
    }

    fn uart(&self) -> Result<Option<UartInfo>, AcpiError> {
        let Some(spcr) = self.spcr else { return Ok(None) };
        if !spcr.gic_interrupt {
            return Err(AcpiError::Unsupported { table: Signature::SPCR, what: "UART interrupt not on the GIC" });
        }
        Ok(Some(UartInfo {
            base: spcr.base,
            size: UART_SIZE,
            intid: intid(Signature::SPCR, spcr.gsiv)?,
            path: String::new(),
            compatible: String::from(spcr.compatible().unwrap_or("")),
        }))
    }

    fn timer(&self) -> Result<TimerInfo, AcpiError> {
        let ppi = |gsiv| {
            let id = intid(Signature::GTDT, gsiv)?;
            if id.is_ppi() || id.is_eppi() {
                Ok(id)
            } else {
                Err(AcpiError::BadValue { table: Signature::GTDT, offset: 0, what: "timer GSIV (not a PPI)" })
            }
        };
        let g = &self.gtdt;
        Ok(TimerInfo {
            phys_intid: ppi(g.non_secure_el1.gsiv)?,
            virt_intid: ppi(g.virtual_el1.gsiv)?,
            hyp_intid: ppi(g.non_secure_el2.gsiv)?,
        })
    }

    /// The first usable GICC's performance interrupt, if it is a PPI (0:
    /// none; anything else is not one overflow line per CPU, and the vPMU
    /// is left out).
    fn pmu(&self) -> Option<IntId> {
        let gsiv = self.madt.giccs.iter().find(|g| g.usable()).map(|g| g.perf_gsiv).filter(|&v| v != 0)?;
        intid(Signature::MADT, gsiv).ok().filter(|i| i.is_ppi())
    }

    /// The IORT's SMMUv3s. The node's offset stands for the DT's phandle
    /// (what a root complex's `iommu_map` names); its registers are the
    /// architected 128 KiB; a GSIV that is no SPI is no interrupt (the
    /// driver then sees events only when something else drains them).
    fn smmus(&self) -> Vec<SmmuInfo> {
        let spi = |g: u32| intid(Signature::IORT, g).ok().filter(|i| i.is_spi());
        self.iort
            .iter()
            .flat_map(|i| &i.smmus)
            .map(|s| SmmuInfo {
                path: format!("IORT SMMUv3 node at {:#x}", s.offset),
                regs: Region { base: s.base, size: crate::smmu::MMIO_SIZE as u64 },
                phandle: Some(s.offset),
                eventq: spi(s.event_gsiv),
                gerror: spi(s.gerr_gsiv),
                coherent: s.coherent,
            })
            .collect()
    }

    /// One host per MCFG entry, `msi-map` from the IORT root complex of the
    /// same segment (`msi_controller` = the ITS group's first GIC ITS ID),
    /// `iommu-map` from its mappings into SMMUv3 nodes (`iommu` = the
    /// node's offset, as [`Self::smmus`] names them).
    fn pcie(&self) -> Vec<PcieHost> {
        self.mcfg
            .iter()
            .map(|e| {
                let msi_map = self
                    .iort
                    .iter()
                    .flat_map(|i| i.root_complexes.iter().filter(|rc| rc.segment == u32::from(e.segment)))
                    .flat_map(|rc| rc.id_maps.iter())
                    .map(|m| MsiMapEntry {
                        rid_base: m.rid_base,
                        msi_controller: self.its_id_of_group(m.its_group).unwrap_or(0),
                        msi_base: m.device_id_base,
                        length: m.count,
                    })
                    .collect();
                PcieHost {
                    path: format!("ACPI MCFG segment {}", e.segment),
                    ecam: e.ecam(),
                    bus_range: (e.start_bus, e.end_bus),
                    windows: Vec::new(),
                    intx: Vec::new(),
                    msi_map,
                    msi_map_mask: None,
                    msi_parent: Vec::new(),
                    iommu_map: self
                        .iort
                        .iter()
                        .flat_map(|i| i.root_complexes.iter().filter(|rc| rc.segment == u32::from(e.segment)))
                        .flat_map(|rc| rc.stream_maps.iter())
                        .map(|m| IommuMapEntry {
                            rid_base: m.rid_base,
                            iommu: m.smmu,
                            sid_base: m.sid_base,
                            length: m.count,
                        })
                        .collect(),
                    iommu_map_mask: None,
                }
            })
            .collect()
    }

    fn its_id_of_group(&self, offset: u32) -> Option<u32> {
        let iort = self.iort.as_ref()?;
        iort.its_groups.iter().find(|g| g.offset == offset).and_then(|g| g.its_ids.first().copied())
    }
}

fn intid(table: Signature, gsiv: u32) -> Result<IntId, AcpiError> {
    IntId::try_from(gsiv).map_err(|_| AcpiError::BadValue { table, offset: 0, what: "GSIV (not an INTID)" })
}
