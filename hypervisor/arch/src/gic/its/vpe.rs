//! GICv4.0 on the physical ITS: vPEs (VMAPP, VMOVP), guest mapping
//! changes as V-commands, vPE residency on a redistributor.

use super::queue::with_its;
use super::*;

/// A vPE as the ITS knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VpeHw {
    pub vpe: u16,
    /// The host LPI rung for a vLPI while the vPE is not resident.
    pub doorbell: IntId,
    /// The virtual pending table (hypervisor memory, zeroed, 64 KiB aligned).
    pub vpt: u64,
}

/// Creates vPE `vpe`: a zeroed virtual pending table for 2^14 vINTIDs, a
/// doorbell LPI (enabled), VMAPP to the redistributor of `pcpu`, VSYNC.
pub fn create_vpe(vpe: u16, pcpu: usize) -> Result<VpeHw, ItsError> {
    with_its(|its| {
        if its.v4.is_none() {
            return Err(ItsError::NoVlpis);
        }
        if u64::from(vpe) >> VPE_ID_BITS != 0 {
            return Err(ItsError::Table("vPE ID beyond the vPE table"));
        }
        let rdbase = its.rdbase(pcpu)?;
        let vpt = Frame::new(VPT_BYTES, VPT_ALIGN, its.cmdq_clean)?;
        let doorbell = match its.lpis.alloc() {
            Ok(l) => l,
            Err(e) => {
                vpt.free();
                return Err(e);
            }
        };
        its.set_config(doorbell, true);
        // On failure the ITS may still point at the table: it is not freed.
        its.send(&v4::vmapp(vpe, rdbase, vpt.pa))?;
        if let Some(v) = its.v4.as_mut() {
            v.vpes.push((vpe, vpt, pcpu));
        }
        Ok(VpeHw { vpe, doorbell, vpt: vpt.pa })
    })
}

/// Sends the physical commands for one guest mapping change of a VM whose
/// vPEs are `vpes`: `its::v4::check_and_plan` against what is mapped, the
/// commands, then `its::v4::record`.
pub fn vlpi_change(change: GuestChange, vpes: &VpeMap) -> Result<(), ItsError> {
    with_its(|its| {
        if its.v4.is_none() {
            return Err(ItsError::NoVlpis);
        }
        let cmds = v4::check_and_plan(&its.map, change, vpes)?;
        if cmds.is_empty() {
            return Ok(());
        }
        its.send(&cmds)?;
        v4::record(&mut its.map, change, vpes)
    })
}

/// Events mapped to vLPIs now.
pub fn vlpis_mapped() -> usize {
    ITS.lock().as_ref().map_or(0, |i| i.map.vevent_count())
}

/// VMOVP of `vpe` to `pcpu`'s redistributor (its doorbell and direct
/// vLPIs go there from now on). Nothing when it is there already.
pub fn vmovp(vpe: u16, pcpu: usize) -> Result<bool, ItsError> {
    with_its(|its| {
        let rdbase = its.rdbase(pcpu)?;
        let v = its.v4.as_ref().ok_or(ItsError::NoVlpis)?;
        let (typer, number) = (v.typer, v.its_number);
        let at = v.vpes.iter().position(|e| e.0 == vpe).ok_or(ItsError::Table("unknown vPE"))?;
        if v4::needs_vmovp(v.vpes[at].2, pcpu).is_none() {
            return Ok(false);
        }
        its.send(&v4::vmovp(vpe, rdbase, typer, number))?;
        if let Some(v) = its.v4.as_mut() {
            v.vpes[at].2 = pcpu;
        }
        Ok(true)
    })
}

/// Polls of GICR_VPENDBASER.Dirty after Valid 1 → 0.
const DIRTY_POLLS: u32 = 1 << 16;

/// Makes a vPE resident on `pcpu`'s redistributor (call it on `pcpu`):
/// GICR_VPROPBASER = `vpropbaser` (the guest's configuration table), then
/// GICR_VPENDBASER = its pending table with Valid = 1. The redistributor
/// then scans the pending table; the guest may run meanwhile (GICv4.0).
pub fn vpe_resident(pcpu: usize, vpropbaser: u64, vpt: u64) -> Result<(), ItsError> {
    let rd = rd_base(pcpu);
    if rd == 0 {
        return Err(ItsError::BadPcpu(pcpu));
    }
    write64(rd + gicr::GICR_VPROPBASER, vpropbaser);
    sysreg::dsb_sy();
    write64(rd + gicr::GICR_VPENDBASER, v4::vpendbaser(vpt, true, true));
    sysreg::dsb_sy();
    Ok(())
}

/// Makes the vPE on `pcpu`'s redistributor non-resident: Valid = 0, then
/// waits (bounded) for Dirty to clear. Returns PendingLast: an enabled vLPI
/// was pending as it left (the vCPU has an interrupt to take).
pub fn vpe_nonresident(pcpu: usize, vpt: u64) -> Result<bool, ItsError> {
    let rd = rd_base(pcpu);
    if rd == 0 {
        return Err(ItsError::BadPcpu(pcpu));
    }
    write64(rd + gicr::GICR_VPENDBASER, v4::vpendbaser(vpt, false, true));
    sysreg::dsb_sy();
    for _ in 0..DIRTY_POLLS {
        if let v4::Residency::Settled { pending_last, .. } = v4::residency(read64(rd + gicr::GICR_VPENDBASER)) {
            return Ok(pending_last);
        }
        crate::sysreg::cpu_relax();
    }
    ERRORS.fetch_add(1, Ordering::Relaxed);
    Err(ItsError::VpeDirty { pcpu })
}
