//! The vITS command queue: reading commands from guest memory between
//! GITS_CREADR and GITS_CWRITER, and carrying them out.
//!
//! Decoding is `its::cmd::Command::decode_guest` (an unknown number is an
//! error; set RES0 bits are ignored and counted in
//! `ItsCounters::reserved_ignored`); the checks of IDs against the tables are
//! `tables.rs`'s. This file only sequences: per command, check everything,
//! then tell the backend, then change the tables and the vGIC, so that a
//! refused command changes nothing (one exception: a MAPD that remaps a
//! mapped device drops the old mapping first, so if the backend then refuses
//! the new one, the device ends up unmapped). The effects are synchronous, which makes
//! SYNC a no-op (after its RDbase check).

use super::{CommandFault, ItsBackend, LpiSink, Vits, CMD, WORK_BUDGET};
use crate::intid::IntId;
use crate::its::cmd::{Command, Icid, COMMAND_BYTES};
use crate::its::LPI_BASE;
use crate::vgic::Kicks;
use crate::virtio::GuestMemory;
use alloc::collections::BTreeSet;

impl Vits {
    /// Runs the commands from CREADR up to CWRITER if the ITS is enabled and
    /// not stalled; stalls on a queue error (see the module docs). At most
    /// one queue's worth of commands and [`WORK_BUDGET`] per call.
    pub(super) fn process<M: GuestMemory, S: LpiSink, B: ItsBackend>(
        &mut self,
        mem: &M,
        sink: &mut S,
        backend: &mut B,
    ) -> Kicks {
        let mut kicks = Kicks::none();
        if !self.enabled || self.stalled || self.creadr == self.cwriter {
            return kicks;
        }
        let Some((addr, bytes)) = self.queue() else {
            self.fault(CommandFault::QueueInvalid, format_args!("GITS_CBASER.Valid = 0"));
            return kicks;
        };
        if self.cwriter >= bytes || self.creadr >= bytes {
            let (w, r) = (self.cwriter, self.creadr);
            self.fault(CommandFault::CwriterOutOfRange, format_args!("CWRITER {w:#x} CREADR {r:#x}, queue {bytes:#x}"));
            return kicks;
        }
        if !mem.contains(addr, bytes) {
            self.fault(CommandFault::QueueOutsideRam, format_args!("queue {addr:#x}+{bytes:#x}"));
            return kicks;
        }
        let mut budget = WORK_BUDGET;
        for _ in 0..bytes / CMD {
            if self.creadr == self.cwriter || budget == 0 {
                break;
            }
            let mut raw = [0u8; COMMAND_BYTES];
            let at = addr.wrapping_add(self.creadr);
            if mem.read(at, &mut raw).is_err() {
                self.fault(CommandFault::QueueUnreadable, format_args!("command at {at:#x}"));
                return kicks;
            }
            let decoded = Command::decode_guest(Command::words(&raw));
            budget = budget.saturating_sub(decoded.map_or(1, |(c, _)| self.cost(&c)));
            match decoded {
                Ok((cmd, reserved)) => {
                    if reserved {
                        self.counters.reserved_ignored += 1;
                    }
                    match self.execute(cmd, mem, sink, backend) {
                        Ok(k) => {
                            kicks.merge(k);
                            if let Some(n) = self.counters.commands.get_mut(usize::from(cmd.opcode())) {
                                *n += 1;
                            }
                        }
                        Err(f) => self.fault(f, format_args!("{cmd:?}")),
                    }
                }
                Err(e) => self.fault(CommandFault::UnknownCommand, format_args!("{e}")),
            }
            self.creadr = (self.creadr + CMD) % bytes;
        }
        kicks
    }

    /// The work units `cmd` takes out of [`WORK_BUDGET`].
    fn cost(&self, cmd: &Command) -> u64 {
        let visited = match *cmd {
            Command::Mapc { .. } | Command::Movall { .. } => self.tables.nr_events(),
            Command::Mapd { device, .. } => self.tables.device(device).map_or(0, |d| d.events.len()),
            _ => 0,
        };
        1 + visited as u64
    }

    /// Carries out one decoded command, or says why it is refused.
    pub(super) fn execute<M: GuestMemory, S: LpiSink, B: ItsBackend>(
        &mut self,
        cmd: Command,
        mem: &M,
        sink: &mut S,
        backend: &mut B,
    ) -> Result<Kicks, CommandFault> {
        let none = Ok(Kicks::none());
        match cmd {
            Command::Mapd { device, size, itt_addr, valid: true } => self.mapd(device, size, itt_addr, mem, backend),
            Command::Mapd { device, valid: false, .. } => {
                self.tables.device(device).map(|_| ()).or_else(|f| match f {
                    CommandFault::DeviceUnmapped => Ok(()),
                    f => Err(f),
                })?;
                self.unmap_device(device, backend);
                none
            }
            // Remapping a collection whose LPIs are pending is UNPREDICTABLE
            // (software MOVALLs first): their pending state stays where it is.
            Command::Mapc { icid, rdbase, valid } => {
                let vcpu = if valid { Some(self.tables.check_rdbase(rdbase)?) } else { None };
                self.tables.collection(icid)?;
                self.tables.set_collection(icid, vcpu)?;
                // The target as resolved (`dom0_msi_vcpu=` may steer it).
                let target = self.tables.collection(icid)?;
                for (d, e, ite) in self.tables.events() {
                    if ite.icid == icid {
                        backend.move_event(d, e, target);
                    }
                }
                none
            }
            Command::Mapti { device, event, pintid, icid } => self.map_event(device, event, pintid, icid, backend),
            Command::Mapi { device, event, icid } => self.map_event(device, event, event, icid, backend),
            Command::Int { device, event } => {
                let (intid, vcpu) = self.target(device, event)?;
                let k = if backend.int_event(device, event, vcpu) {
                    Kicks::none()
                } else {
                    sink.inject_lpi(intid, vcpu).map_err(|_| CommandFault::Vgic)?
                };
                self.counters.int_lpis += 1;
                Ok(k)
            }
            Command::Clear { device, event } => {
                let (intid, vcpu) = self.target(device, event)?;
                sink.clear_lpi(intid, vcpu).map_err(|_| CommandFault::Vgic)?;
                backend.clear_event(device, event, vcpu);
                none
            }
            Command::Discard { device, event } => {
                let ite = self.tables.event(device, event)?;
                if let Some(vcpu) = self.tables.collection(ite.icid)? {
                    sink.clear_lpi(ite.intid, vcpu).map_err(|_| CommandFault::Vgic)?;
                }
                self.tables.remove_event(device, event)?;
                backend.unmap_event(device, event);
                none
            }
            Command::Inv { device, event } => {
                let (intid, vcpu) = self.target(device, event)?;
                let k = self.inv(intid, vcpu, mem, sink)?;
                backend.inv_event(device, event, vcpu);
                Ok(k)
            }
            Command::Invall { icid } => {
                let vcpu = self.tables.mapped_collection(icid)?;
                if !sink.lpis_enabled(vcpu) {
                    return none;
                }
                let k = sink.load_lpi_config(mem, vcpu).map_err(|_| CommandFault::Vgic)?;
                backend.invall(vcpu);
                Ok(k)
            }
            Command::Movi { device, event, icid } => self.movi(device, event, icid, sink, backend),
            Command::Movall { from, to } => {
                let from = self.tables.check_rdbase(from)?;
                let to = self.tables.check_rdbase(to)?;
                let mut kicks = Kicks::none();
                // Steered (`dom0_msi_vcpu=`): every LPI is on the steered
                // vCPU whatever the collections say, and stays there.
                if from == to || self.tables.steered().is_some() {
                    return Ok(kicks);
                }
                // LPIs pend only through this ITS (no direct LPIs), so the
                // LPIs it has mapped are every LPI that can be pending.
                let lpis: BTreeSet<IntId> = self.tables.events().map(|(_, _, ite)| ite.intid).collect();
                for intid in lpis {
                    kicks.merge(sink.move_lpi(intid, from, to).map_err(|_| CommandFault::Vgic)?);
                }
                Ok(kicks)
            }
            Command::Sync { rdbase } => {
                self.tables.check_rdbase(rdbase)?;
                none
            }
            Command::Vmapp { .. }
            | Command::Vmapti { .. }
            | Command::Vmapi { .. }
            | Command::Vmovi { .. }
            | Command::Vmovp { .. }
            | Command::Vsync { .. }
            | Command::Vinvall { .. } => Err(CommandFault::Virtual),
        }
    }

    /// The LPI of a mapped event and the vCPU of its (mapped) collection.
    fn target(&self, device: u32, event: u32) -> Result<(IntId, usize), CommandFault> {
        let ite = self.tables.event(device, event)?;
        Ok((ite.intid, self.tables.mapped_collection(ite.icid)?))
    }

    fn mapd<M: GuestMemory, B: ItsBackend>(
        &mut self,
        device: u32,
        size: u8,
        itt_addr: u64,
        mem: &M,
        backend: &mut B,
    ) -> Result<Kicks, CommandFault> {
        self.tables.check_map_device(device, size)?;
        if !self.owns_device(device) {
            return Err(CommandFault::DeviceNotOwned);
        }
        if !mem.contains(itt_addr, super::tables::Tables::itt_bytes(size)) {
            return Err(CommandFault::IttOutsideRam);
        }
        // Remapping a mapped device replaces its ITT: its events are gone.
        self.unmap_device(device, backend);
        backend.map_device(device, size + 1).map_err(|_| CommandFault::Backend)?;
        self.tables.insert_device(device, size, itt_addr)?;
        Ok(Kicks::none())
    }

    /// Unmaps a device and its events, telling the backend (no-op if unmapped).
    /// Pending LPIs stay pending: they belong to the redistributors.
    fn unmap_device<B: ItsBackend>(&mut self, device: u32, backend: &mut B) {
        if let Some(d) = self.tables.unmap_device(device) {
            for &event in d.events.keys() {
                backend.unmap_event(device, event);
            }
            backend.unmap_device(device);
        }
    }

    fn map_event<B: ItsBackend>(
        &mut self,
        device: u32,
        event: u32,
        pintid: u32,
        icid: Icid,
        backend: &mut B,
    ) -> Result<Kicks, CommandFault> {
        let ite = self.tables.check_map_event(device, event, pintid, icid)?;
        let vcpu = self.tables.collection(icid)?;
        backend.map_event(device, event, ite.intid, vcpu).map_err(|_| CommandFault::Backend)?;
        self.tables.insert_event(device, event, ite)?;
        Ok(Kicks::none())
    }

    fn inv<M: GuestMemory, S: LpiSink>(
        &mut self,
        intid: IntId,
        vcpu: usize,
        mem: &M,
        sink: &mut S,
    ) -> Result<Kicks, CommandFault> {
        if !sink.lpis_enabled(vcpu) {
            return Ok(Kicks::none());
        }
        let Some((table, entries)) = sink.lpi_prop_table(vcpu) else { return Ok(Kicks::none()) };
        let idx = u32::from(intid) - LPI_BASE;
        if idx >= entries {
            return Err(CommandFault::LpiBeyondPropTable);
        }
        let mut byte = [0u8; 1];
        let at = table.checked_add(u64::from(idx)).ok_or(CommandFault::PropTableUnreadable)?;
        mem.read(at, &mut byte).map_err(|_| CommandFault::PropTableUnreadable)?;
        sink.set_lpi_config(intid, byte[0]).map_err(|_| CommandFault::Vgic)
    }

    fn movi<S: LpiSink, B: ItsBackend>(
        &mut self,
        device: u32,
        event: u32,
        icid: Icid,
        sink: &mut S,
        backend: &mut B,
    ) -> Result<Kicks, CommandFault> {
        let ite = self.tables.event(device, event)?;
        let to = self.tables.mapped_collection(icid)?;
        let from = self.tables.collection(ite.icid)?;
        let mut kicks = Kicks::none();
        if let Some(from) = from.filter(|&f| f != to) {
            kicks = sink.move_lpi(ite.intid, from, to).map_err(|_| CommandFault::Vgic)?;
        }
        self.tables.set_event_icid(device, event, icid)?;
        backend.move_event(device, event, Some(to));
        Ok(kicks)
    }
}
