//! Host LPIs for (DeviceID, EventID): MAPD/MAPTI/MOVI/DISCARD/INT on the
//! guests' behalf, and the boot self-test.

use super::queue::with_its;
use super::*;

/// What MAPD of a device with `event_bits` takes from the heap (its ITT as
/// the buddy allocator rounds it), for the VM's quota.
pub fn itt_cost(event_bits: u8) -> Result<u64, ItsError> {
    with_its(|its| Ok(crate::quota::heap_cost(itt_bytes(event_bits, its.itt_entry_size), ITT_ALIGN)))
}

/// What `device`'s ITT takes from the heap, while it is mapped.
pub fn device_itt_cost(device: u32) -> Option<u64> {
    with_its(|its| Ok(crate::quota::heap_cost(its.map.device(device)?.itt_bytes, ITT_ALIGN))).ok()
}

/// MAPD: gives `device` an ITT of 2^`event_bits` events (from the heap,
/// freed by [`unmap_device`]). A DeviceID beyond 16 bits (or the ITS's
/// Devbits), a device mapped already or an unsupported ITT size is refused.
pub fn map_device(device: u32, event_bits: u8) -> Result<(), ItsError> {
    with_its(|its| {
        its.map.check_new_device(device, event_bits)?;
        let rdbase = its.rdbase(0)?;
        its.device_slot(device)?;
        let bytes = itt_bytes(event_bits, its.itt_entry_size);
        let clean = its.devices.as_ref().map_or(its.cmdq_clean, |t| t.clean);
        let itt = Frame::new(bytes, ITT_ALIGN, clean)?;
        // On failure the ITS may still point at the ITT: it is not freed.
        its.send(&[
            Command::Mapd { device, size: event_bits - 1, itt_addr: itt.pa, valid: true },
            Command::Sync { rdbase },
        ])?;
        its.map.add_device(device, event_bits, itt.pa, bytes)?;
        its.itts.push((device, itt));
        Ok(())
    })
}

/// Unmaps `device`: DISCARD of each event still mapped (no LPI stays
/// pending), MAPD Valid = 0, SYNC; then its LPIs are disabled and freed, and
/// its ITT. An unknown device is refused.
pub fn unmap_device(device: u32) -> Result<(), ItsError> {
    with_its(|its| {
        let mut events: Vec<u32> = its.map.device(device)?.events.keys().copied().collect();
        events.extend(its.map.vevents_of(device));
        let rdbase = its.rdbase(0)?;
        for chunk in events.chunks(DISCARD_BATCH) {
            let mut cmds: Vec<Command> = chunk.iter().map(|&event| Command::Discard { device, event }).collect();
            cmds.push(Command::Sync { rdbase });
            its.send(&cmds)?;
        }
        its.send(&[Command::Mapd { device, size: 0, itt_addr: 0, valid: false }, Command::Sync { rdbase }])?;
        let d = its.map.remove_device(device)?;
        for e in d.events.values() {
            its.set_config(e.lpi, false);
            let _ = its.lpis.free(e.lpi);
        }
        if let Some(i) = its.itts.iter().position(|(dev, _)| *dev == device) {
            its.itts.swap_remove(i).1.free();
        }
        Ok(())
    })
}

/// Maps (`device`, `event`) to a newly allocated host LPI, enabled at the
/// priority of the other forwarded interrupts, in the collection of `pcpu`
/// (MAPTI, INV, SYNC). Returns the LPI.
pub fn map_event(device: u32, event: u32, pcpu: usize) -> Result<IntId, ItsError> {
    with_its(|its| {
        its.map.check_new_event(device, event, pcpu)?;
        let rdbase = its.rdbase(pcpu)?;
        let lpi = its.lpis.alloc()?;
        its.set_config(lpi, true);
        let icid = pcpu as u16;
        let pintid = u32::from(lpi);
        let r = its.send(&[
            Command::Mapti { device, event, pintid, icid },
            Command::Inv { device, event },
            Command::Sync { rdbase },
        ]);
        if let Err(e) = r {
            its.set_config(lpi, false);
            let _ = its.lpis.free(lpi);
            return Err(e);
        }
        its.map.add_event(device, event, lpi, pcpu)?;
        Ok(lpi)
    })
}

/// DISCARD of (`device`, `event`): unmapped, its pending state cleared, its
/// LPI disabled and freed. Returns that LPI.
pub fn unmap_event(device: u32, event: u32) -> Result<IntId, ItsError> {
    with_its(|its| {
        let e = its.map.event(device, event)?;
        let rdbase = its.rdbase(e.pcpu)?;
        its.send(&[Command::Discard { device, event }, Command::Sync { rdbase }])?;
        its.map.remove_event(device, event)?;
        its.set_config(e.lpi, false);
        its.lpis.free(e.lpi)?;
        Ok(e.lpi)
    })
}

/// MOVI: (`device`, `event`)'s LPI now fires on `pcpu`.
pub fn move_event(device: u32, event: u32, pcpu: usize) -> Result<(), ItsError> {
    with_its(|its| {
        let e = its.map.check_move(device, event, pcpu)?;
        let from = its.rdbase(e.pcpu)?;
        let to = its.rdbase(pcpu)?;
        its.send(&[Command::Movi { device, event, icid: pcpu as u16 }, Command::Sync { rdbase: from }])?;
        if to != from {
            its.send(&[Command::Sync { rdbase: to }])?;
        }
        its.map.set_pcpu(device, event, pcpu)
    })
}

/// INT: makes (`device`, `event`)'s LPI pending as if the device had written
/// GITS_TRANSLATER (tests, the boot self-test).
pub fn send_int(device: u32, event: u32) -> Result<(), ItsError> {
    with_its(|its| {
        let e = its.map.event(device, event)?;
        let rdbase = its.rdbase(e.pcpu)?;
        its.send(&[Command::Int { device, event }, Command::Sync { rdbase }])
    })
}

/// What the boot self-test found.
pub struct SelfTest {
    pub arch_rev: u8,
    pub base: u64,
    pub lpis: u32,
    pub lpi: IntId,
}

/// Boot self-test on the boot pCPU (0), before it enables any interrupt:
/// maps the highest DeviceID, one event → an LPI on pCPU 0 (with more
/// than one pCPU moved to the last and back: MOVI both ways), sends INT and polls
/// ICC_IAR1_EL1 (interrupts stay masked at EL2) until that LPI is
/// acknowledged, then unmaps. `Err` when it never arrives.
pub fn self_test(pcpus: usize) -> Result<SelfTest, ItsError> {
    let (device, arch_rev, base) = {
        let g = ITS.lock();
        let its = g.as_ref().ok_or(ItsError::NoIts)?;
        ((1u32 << its.map.device_bits()) - 1, its.arch_rev, its.base)
    };
    map_device(device, 1)?;
    let r = map_event(device, 0, 0).and_then(|lpi| {
        if pcpus > 1 {
            move_event(device, 0, pcpus - 1)?;
            move_event(device, 0, 0)?;
        }
        send_int(device, 0)?;
        let got = wait_for(lpi);
        unmap_event(device, 0)?;
        if got {
            Ok(lpi)
        } else {
            ERRORS.fetch_add(1, Ordering::Relaxed);
            Err(ItsError::Table("self-test LPI never arrived"))
        }
    });
    let u = unmap_device(device);
    let lpi = r?;
    u?;
    Ok(SelfTest { arch_rev, base, lpis: HOST_LPI_COUNT, lpi })
}

/// Polls the CPU interface (bounded) until `lpi` is acknowledged; anything
/// else acknowledged meanwhile is ended (nothing else is enabled yet).
pub(super) fn wait_for(lpi: IntId) -> bool {
    for _ in 0..SELF_TEST_POLLS {
        if let Some(id) = super::super::ack() {
            super::super::eoi(id);
            if id == lpi {
                return true;
            }
            super::super::deactivate(id);
            log::warn!("ITS self-test: unexpected interrupt {}", u32::from(id));
        }
        crate::sysreg::cpu_relax();
    }
    false
}
