//! The vITS's translation state: devices with their interrupt translation
//! tables (ITTs) of events, and collections.
//!
//! The architecture lets an ITS keep this state wherever it likes (the
//! GITS_BASER tables and ITT memory are the ITS's own; software must not
//! touch them), so the model keeps it here, in hypervisor memory, and never
//! reads or writes the guest's tables. Every entry is stored sparsely and
//! the totals are capped, so a guest cannot make the hypervisor allocate
//! more than [`MAX_MAPPED_DEVICES`] devices and [`MAX_MAPPED_EVENTS`] events
//! however it programs the ITS.
//!
//! Every method checks its guest-supplied numbers and returns the
//! [`CommandFault`] the command fails with; a failed method changes nothing.

use super::CommandFault;
use crate::intid::IntId;
use crate::its::cmd::Icid;
use crate::its::LPI_BASE;
use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;

/// DeviceID bits (GITS_TYPER.Devbits + 1): PCIe requester IDs.
pub const DEVICE_ID_BITS: u8 = 16;
/// EventID bits (GITS_TYPER.IDbits + 1): MSI-X has at most 2048 vectors.
pub const EVENT_ID_BITS: u8 = 16;
/// LPI INTID bits the vGIC implements (GICD_TYPER.IDbits + 1): LPIs are
/// INTIDs `LPI_BASE..1 << LPI_ID_BITS`.
pub const LPI_ID_BITS: u8 = 14;
/// One past the largest LPI INTID a MAPTI may name.
pub const LPI_END: u32 = 1 << LPI_ID_BITS;
/// Bytes per ITT entry the guest must provide (GITS_TYPER.ITT_entry_size + 1).
pub const ITT_ENTRY_SIZE: u64 = 8;
/// The most events mapped at once in one vITS: as many as there are LPIs.
pub const MAX_MAPPED_EVENTS: usize = (LPI_END - LPI_BASE) as usize;
/// The most devices mapped at once in one vITS (of the 2^16 DeviceIDs).
pub const MAX_MAPPED_DEVICES: usize = 1024;
/// The fewest collections offered, whatever the number of vCPUs.
pub const MIN_COLLECTIONS: usize = 16;

/// An interrupt translation entry: the LPI an event becomes and the
/// collection it goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ite {
    pub intid: IntId,
    pub icid: Icid,
}

/// A mapped DeviceID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// The device has 2^`event_bits` EventIDs (MAPD Size + 1).
    pub event_bits: u8,
    /// Where the guest put the ITT (checked to be in its RAM; never accessed).
    pub itt_addr: u64,
    /// Mapped events by EventID.
    pub events: BTreeMap<u32, Ite>,
}

/// Devices, their events, and collections.
#[derive(Clone, Debug)]
pub struct Tables {
    devices: BTreeMap<u32, Device>,
    /// ICID → target vCPU (RDbase as a processor number), `None` = unmapped.
    collections: Vec<Option<usize>>,
    nr_vcpus: usize,
    events: usize,
    /// `dom0_msi_vcpu=`: the vCPU every mapped collection resolves to.
    steer: Option<usize>,
}

impl Tables {
    /// Empty tables for `nr_vcpus` vCPUs with `nr_collections` ICIDs.
    pub fn new(nr_vcpus: usize, nr_collections: usize) -> Self {
        Tables { devices: BTreeMap::new(), collections: vec![None; nr_collections], nr_vcpus, events: 0, steer: None }
    }

    /// Benchmark knob: every *mapped* collection resolves to vCPU `vcpu`
    /// (ignored when `None` or not a vCPU of the VM), so the guest's MAPC
    /// choices are kept but every LPI — emulated or a GICv4 vLPI — is
    /// delivered to that one vCPU. The guest cannot tell: it never reads a
    /// collection's target back.
    pub fn steer_to(mut self, vcpu: Option<usize>) -> Self {
        self.steer = vcpu.filter(|&v| v < self.nr_vcpus);
        self
    }

    /// The vCPU every LPI is steered to, if any.
    pub fn steered(&self) -> Option<usize> {
        self.steer
    }

    /// Number of ICIDs.
    pub fn nr_collections(&self) -> usize {
        self.collections.len()
    }

    /// Number of mapped events over all devices.
    pub fn nr_events(&self) -> usize {
        self.events
    }

    /// Number of mapped devices.
    pub fn nr_devices(&self) -> usize {
        self.devices.len()
    }

    /// Checks a DeviceID against Devbits.
    pub fn check_device_id(device: u32) -> Result<(), CommandFault> {
        if u64::from(device) >> DEVICE_ID_BITS != 0 {
            return Err(CommandFault::DeviceOutOfRange);
        }
        Ok(())
    }

    /// Checks a processor number (RDbase with GITS_TYPER.PTA = 0).
    pub fn check_rdbase(&self, rdbase: u64) -> Result<usize, CommandFault> {
        match usize::try_from(rdbase) {
            Ok(v) if v < self.nr_vcpus => Ok(v),
            _ => Err(CommandFault::RdbaseOutOfRange),
        }
    }

    /// The vCPU collection `icid` targets (`None`: in range but unmapped).
    pub fn collection(&self, icid: Icid) -> Result<Option<usize>, CommandFault> {
        let target = self.collections.get(usize::from(icid)).copied().ok_or(CommandFault::IcidOutOfRange)?;
        Ok(target.map(|v| self.steer.unwrap_or(v)))
    }

    /// The vCPU of a mapped collection.
    pub fn mapped_collection(&self, icid: Icid) -> Result<usize, CommandFault> {
        self.collection(icid)?.ok_or(CommandFault::CollectionUnmapped)
    }

    /// Maps (`Some`) or unmaps (`None`) collection `icid`.
    pub fn set_collection(&mut self, icid: Icid, vcpu: Option<usize>) -> Result<(), CommandFault> {
        if let Some(v) = vcpu {
            self.check_rdbase(v as u64)?;
        }
        let slot = self.collections.get_mut(usize::from(icid)).ok_or(CommandFault::IcidOutOfRange)?;
        *slot = vcpu;
        Ok(())
    }

    /// A mapped device.
    pub fn device(&self, device: u32) -> Result<&Device, CommandFault> {
        Self::check_device_id(device)?;
        self.devices.get(&device).ok_or(CommandFault::DeviceUnmapped)
    }

    /// Checks a new device mapping of 2^(`size` + 1) events with its ITT at
    /// `itt_addr`, without making it (the ITT's RAM check is the caller's).
    pub fn check_map_device(&self, device: u32, size: u8) -> Result<(), CommandFault> {
        Self::check_device_id(device)?;
        if size >= EVENT_ID_BITS {
            return Err(CommandFault::IttSize);
        }
        if !self.devices.contains_key(&device) && self.devices.len() >= MAX_MAPPED_DEVICES {
            return Err(CommandFault::TooManyDevices);
        }
        Ok(())
    }

    /// Bytes of the ITT a MAPD with `size` needs.
    pub fn itt_bytes(size: u8) -> u64 {
        ITT_ENTRY_SIZE << (u32::from(size.min(31)) + 1)
    }

    /// Maps `device` with no events, replacing any previous mapping (the
    /// caller unmaps that first with [`Self::unmap_device`], so its events
    /// are counted out and reported).
    pub fn insert_device(&mut self, device: u32, size: u8, itt_addr: u64) -> Result<(), CommandFault> {
        self.check_map_device(device, size)?;
        let new = Device { event_bits: size + 1, itt_addr, events: BTreeMap::new() };
        if let Some(old) = self.devices.insert(device, new) {
            self.events -= old.events.len();
        }
        Ok(())
    }

    /// Unmaps `device`, returning it with its events (if it was mapped).
    pub fn unmap_device(&mut self, device: u32) -> Option<Device> {
        let d = self.devices.remove(&device)?;
        self.events -= d.events.len();
        Some(d)
    }

    /// The translation entry of a mapped event.
    pub fn event(&self, device: u32, event: u32) -> Result<Ite, CommandFault> {
        let d = self.device(device)?;
        if u64::from(event) >> d.event_bits != 0 {
            return Err(CommandFault::EventOutOfRange);
        }
        d.events.get(&event).copied().ok_or(CommandFault::EventUnmapped)
    }

    /// Maps a new event of a mapped device to LPI `pintid` in collection
    /// `icid`; checks everything first and changes nothing on error.
    pub fn check_map_event(&self, device: u32, event: u32, pintid: u32, icid: Icid) -> Result<Ite, CommandFault> {
        let d = self.device(device)?;
        if u64::from(event) >> d.event_bits != 0 {
            return Err(CommandFault::EventOutOfRange);
        }
        if !(LPI_BASE..LPI_END).contains(&pintid) {
            return Err(CommandFault::LpiOutOfRange);
        }
        let intid = IntId::try_from(pintid).map_err(|_| CommandFault::LpiOutOfRange)?;
        self.collection(icid)?;
        if d.events.contains_key(&event) {
            return Err(CommandFault::EventMapped);
        }
        if self.events >= MAX_MAPPED_EVENTS {
            return Err(CommandFault::TooManyEvents);
        }
        Ok(Ite { intid, icid })
    }

    /// Inserts an entry [`Self::check_map_event`] returned.
    pub fn insert_event(&mut self, device: u32, event: u32, ite: Ite) -> Result<(), CommandFault> {
        self.check_map_event(device, event, ite.intid.into(), ite.icid)?;
        let d = self.devices.get_mut(&device).ok_or(CommandFault::DeviceUnmapped)?;
        d.events.insert(event, ite);
        self.events += 1;
        Ok(())
    }

    /// Unmaps a mapped event, returning its entry.
    pub fn remove_event(&mut self, device: u32, event: u32) -> Result<Ite, CommandFault> {
        let ite = self.event(device, event)?;
        if let Some(d) = self.devices.get_mut(&device) {
            d.events.remove(&event);
            self.events -= 1;
        }
        Ok(ite)
    }

    /// Moves a mapped event to collection `icid`, returning the old entry.
    pub fn set_event_icid(&mut self, device: u32, event: u32, icid: Icid) -> Result<Ite, CommandFault> {
        let old = self.event(device, event)?;
        self.collection(icid)?;
        if let Some(ite) = self.devices.get_mut(&device).and_then(|d| d.events.get_mut(&event)) {
            ite.icid = icid;
        }
        Ok(old)
    }

    /// Every mapped event: (DeviceID, EventID, entry), in DeviceID then EventID order.
    pub fn events(&self) -> impl Iterator<Item = (u32, u32, Ite)> + '_ {
        self.devices.iter().flat_map(|(&dev, d)| d.events.iter().map(move |(&ev, &ite)| (dev, ev, ite)))
    }
}
