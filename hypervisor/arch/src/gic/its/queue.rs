//! The ITS's command queue and tables at run time: commands sent and waited
//! for, second-level Device table pages, per-pCPU setup.

use super::*;

impl Its {
    pub(super) fn init_cpu(&mut self, cpu: usize) -> Result<(), ItsError> {
        let rd = rd_base(cpu);
        if rd == 0 || cpu >= self.rdbase.len() {
            return Err(ItsError::BadPcpu(cpu));
        }
        let typer = LocalRegisterCopy::<u64, GICR_TYPER::Register>::new(read64(rd + GICR_TYPER_OFF));
        if read32(rd) & gicr::CTLR_ENABLE_LPIS != 0 {
            // PROPBASER/PENDBASER are fixed once LPIs are on (firmware did it).
            return Err(ItsError::Table("GICR_CTLR.EnableLPIs already set"));
        }
        let mut prop = LocalRegisterCopy::<u64, GICR_PROPBASER::Register>::new(0);
        prop.modify(
            GICR_PROPBASER::Physical_Address.val(self.prop.pa >> 12)
                + GICR_PROPBASER::InnerCache.val(CACHE_RAWAWB)
                + GICR_PROPBASER::Shareability.val(SH_INNER)
                + GICR_PROPBASER::IDbits.val(u64::from(HOST_LPI_ID_BITS) - 1),
        );
        write64(rd + gicr::GICR_PROPBASER, prop.get());
        let back = LocalRegisterCopy::<u64, GICR_PROPBASER::Register>::new(read64(rd + gicr::GICR_PROPBASER));
        if non_shareable(back.read(GICR_PROPBASER::Shareability)) {
            prop.modify(GICR_PROPBASER::InnerCache.val(CACHE_NC) + GICR_PROPBASER::Shareability.val(0));
            write64(rd + gicr::GICR_PROPBASER, prop.get());
            self.prop_clean = true;
            cache::clean_to_poc(self.prop.pa, PROP_TABLE_BYTES as u64);
        }
        // Never freed: the redistributor owns it while LPIs are enabled.
        let pend = Frame::new(PEND_TABLE_BYTES, PEND_TABLE_ALIGN, false)?;
        let mut pv = LocalRegisterCopy::<u64, GICR_PENDBASER::Register>::new(0);
        pv.modify(
            GICR_PENDBASER::Physical_Address.val(pend.pa >> 16)
                + GICR_PENDBASER::InnerCache.val(CACHE_RAWAWB)
                + GICR_PENDBASER::Shareability.val(SH_INNER)
                + GICR_PENDBASER::PTZ::SET,
        );
        write64(rd + gicr::GICR_PENDBASER, pv.get());
        let back = LocalRegisterCopy::<u64, GICR_PENDBASER::Register>::new(read64(rd + gicr::GICR_PENDBASER));
        if non_shareable(back.read(GICR_PENDBASER::Shareability)) {
            pv.modify(GICR_PENDBASER::InnerCache.val(CACHE_NC) + GICR_PENDBASER::Shareability.val(0));
            write64(rd + gicr::GICR_PENDBASER, pv.get());
            cache::clean_to_poc(pend.pa, PEND_TABLE_BYTES as u64);
        }
        sysreg::dsb_sy();
        write32(rd, read32(rd) | gicr::CTLR_ENABLE_LPIS);
        sysreg::dsb_sy();
        let rdbase = if self.pta { rd >> 16 } else { typer.read(GICR_TYPER::Processor_Number) };
        self.rdbase[cpu] = Some(rdbase);
        let icid = cpu as u16;
        self.send(&[Command::Mapc { icid, rdbase, valid: true }, Command::Invall { icid }, Command::Sync { rdbase }])
    }

    pub(super) fn rdbase(&self, pcpu: usize) -> Result<u64, ItsError> {
        self.rdbase.get(pcpu).copied().flatten().ok_or(ItsError::BadPcpu(pcpu))
    }

    /// Writes `cmds` to the queue, advances GITS_CWRITER and waits (bounded)
    /// until GITS_CREADR has consumed them.
    pub(super) fn send(&mut self, cmds: &[Command]) -> Result<(), ItsError> {
        let r = self.send_inner(cmds);
        if let Err(e) = r {
            match e {
                ItsError::Timeout { .. } => TIMEOUTS.fetch_add(1, Ordering::Relaxed),
                _ => ERRORS.fetch_add(1, Ordering::Relaxed),
            };
            let first = cmds.first().map_or("-", Command::name);
            log::error!("ITS: {} command(s) starting with {first}: {e}", cmds.len());
        }
        r
    }

    pub(super) fn send_inner(&mut self, cmds: &[Command]) -> Result<(), ItsError> {
        if self.wedged {
            return Err(ItsError::Stalled { creadr: self.cwriter });
        }
        if cmds.len() >= CMD_QUEUE_BYTES / COMMAND_BYTES {
            return Err(ItsError::QueueOverflow(cmds.len()));
        }
        let start = self.cwriter as usize;
        let mut off = start;
        for c in cmds {
            let slot = self.cmdq.pa + off as u64;
            // SAFETY: `slot` is a 32-byte-aligned command slot inside the
            // command queue this driver allocated (off < CMD_QUEUE_BYTES);
            // the ITS only reads slots between CREADR and CWRITER, and
            // CREADR == CWRITER here (the previous batch completed).
            unsafe { core::ptr::write_volatile(slot as *mut [u64; 4], c.encode()) };
            if self.cmdq_clean {
                cache::clean_to_poc(slot, COMMAND_BYTES as u64);
            }
            COMMANDS[command_slot(c.opcode())].fetch_add(1, Ordering::Relaxed);
            off = (off + COMMAND_BYTES) % CMD_QUEUE_BYTES;
        }
        sysreg::dsb_sy();
        let mut cw = LocalRegisterCopy::<u64, GITS_CQ_OFFSET::Register>::new(0);
        cw.modify(GITS_CQ_OFFSET::Offset.val(off as u64 >> 5));
        write64(self.base + offset::GITS_CWRITER, cw.get());
        self.cwriter = off as u32;
        for _ in 0..POLL_LIMIT {
            match queue_progress(read64(self.base + offset::GITS_CREADR), self.cwriter) {
                QueueProgress::Done => return Ok(()),
                QueueProgress::Stalled(creadr) => {
                    self.wedged = true;
                    return Err(ItsError::Stalled { creadr });
                }
                QueueProgress::Busy => crate::sysreg::cpu_relax(),
            }
        }
        self.wedged = true;
        let creadr = (read64(self.base + offset::GITS_CREADR) & 0xf_ffe0) as u32;
        Err(ItsError::Timeout { creadr, cwriter: self.cwriter })
    }

    /// Writes LPI `lpi`'s configuration byte (and cleans it when the
    /// redistributors do not snoop).
    pub(super) fn set_config(&mut self, lpi: IntId, enabled: bool) {
        let idx = u64::from(u32::from(lpi) - LPI_BASE);
        let byte = self.prop.pa + idx;
        // SAFETY: `idx` < HOST_LPI_COUNT (the allocator only hands out
        // those), so `byte` is inside the configuration table this driver
        // allocated; the redistributors only read it.
        unsafe { core::ptr::write_volatile(byte as *mut u8, lpi_config_byte(LPI_PRIORITY, enabled)) };
        if self.prop_clean {
            cache::clean_to_poc(byte, 1);
        }
        sysreg::dsb_sy();
    }

    /// Makes sure the Device table can hold `device`: in a two-level table,
    /// allocates its second-level page on first use.
    pub(super) fn device_slot(&mut self, device: u32) -> Result<(), ItsError> {
        let Some(t) = self.devices.as_mut() else {
            return Ok(()); // an ITS that keeps the Device table itself
        };
        if !t.plan.indirect {
            return Ok(());
        }
        let i = t.plan.l1_index(device);
        let slot = t.l2.get_mut(i).ok_or(ItsError::DeviceOutOfRange(device))?;
        if slot.is_some() {
            return Ok(());
        }
        let page = t.plan.page.bytes() as usize;
        let l2 = Frame::new(page, page, t.clean)?;
        let desc = t.frame.pa + 8 * i as u64;
        // SAFETY: slot `i` of the first-level table this driver allocated
        // (`l2` has one entry per slot); the ITS reads it only for DeviceIDs
        // in this range, none of which is mapped yet.
        unsafe { core::ptr::write_volatile(desc as *mut u64, l1_descriptor(l2.pa)) };
        if t.clean {
            cache::clean_to_poc(desc, 8);
        }
        sysreg::dsb_sy();
        *slot = Some(l2);
        Ok(())
    }
}

pub(super) fn with_its<T>(f: impl FnOnce(&mut Its) -> Result<T, ItsError>) -> Result<T, ItsError> {
    ITS.lock().as_mut().map_or(Err(ItsError::NoIts), f)
}
