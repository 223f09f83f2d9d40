//! Finding each CPU's redistributor across several GICR regions, as plain
//! logic over a register-read callback (the physical driver passes a
//! volatile read; the host tests pass a fake GIC).
//!
//! A machine describes its redistributors as one or more regions: the DT's
//! `#redistributor-regions` `reg` entries, the MADT's GICR structures, or,
//! when the MADT has none, one GICR base address per GICC entry (a region
//! holding a single redistributor). QEMU virt with more than 123 CPUs puts
//! the first 123 redistributors at 0x080A_0000 and the others in a second
//! region at 256 GiB. Which frame serves which CPU is not positional: the
//! frame's GICR_TYPER.Affinity names the CPU's MPIDR affinity (IHI 0069,
//! 12.11.39). So the driver walks every region as Linux's
//! `gic_iterate_rdists` does: frame after frame, each RD_base + SGI_base
//! (two 64 KiB pages) plus VLPI_base + reserved when GICR_TYPER.VLPIS, until
//! the frame marked GICR_TYPER.Last — and, our addition, never past the
//! region's end (a region sized for one frame, as a per-GICC base is, ends
//! the walk even when its frame is not marked Last), at most
//! [`MAX_FRAMES`] frames in all.

use alloc::vec::Vec;

use crate::region::Region;

/// RD_base + SGI_base.
pub const FRAME_V3: u64 = 0x2_0000;
/// RD_base + SGI_base + VLPI_base + reserved (GICR_TYPER.VLPIS).
pub const FRAME_V4: u64 = 0x4_0000;
/// Offset of GICR_TYPER in RD_base.
pub const GICR_TYPER: u64 = 0x8;
/// The most frames a walk reads over all regions (a bound on a region
/// whose frames never say Last).
pub const MAX_FRAMES: usize = 2 * crate::limits::MAX_PCPUS;

/// GICR_TYPER.Last: the last frame of its region.
const TYPER_LAST: u64 = 1 << 4;
/// GICR_TYPER.VLPIS: the frame has the two GICv4 pages.
const TYPER_VLPIS: u64 = 1 << 1;
/// GICR_TYPER.Affinity: Aff3.Aff2.Aff1.Aff0 of the PE it serves.
const TYPER_AFFINITY_SHIFT: u32 = 32;

/// One redistributor frame found by [`walk`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Its RD_base.
    pub rd_base: u64,
    /// Its GICR_TYPER as read.
    pub typer: u64,
}

impl Frame {
    /// The affinity (Aff3.Aff2.Aff1.Aff0, 32 bits) of the PE it serves.
    pub fn affinity(&self) -> u32 {
        (self.typer >> TYPER_AFFINITY_SHIFT) as u32
    }
}

/// MPIDR_EL1's affinity fields packed as GICR_TYPER.Affinity packs them
/// (Aff3 at bits 31:24, Aff2, Aff1, Aff0 at 7:0).
pub fn mpidr_affinity(mpidr: u64) -> u32 {
    let aff3 = (mpidr >> 32) & 0xff;
    ((aff3 << 24) | (mpidr & 0xff_ffff)) as u32
}

/// Every redistributor frame of `regions`, in region order, reading each
/// frame's GICR_TYPER with `read_typer(rd_base)`. A frame whose RD_base
/// was already found (regions that overlap, or per-GICC bases listed
/// twice) is not read again.
pub fn walk(regions: &[Region], mut read_typer: impl FnMut(u64) -> u64) -> Vec<Frame> {
    let mut out: Vec<Frame> = Vec::new();
    for r in regions {
        let end = r.base.saturating_add(r.size);
        let mut rd = r.base;
        while out.len() < MAX_FRAMES && rd.checked_add(FRAME_V3).is_some_and(|e| e <= end) {
            if out.iter().any(|f| f.rd_base == rd) {
                break;
            }
            let typer = read_typer(rd + GICR_TYPER);
            out.push(Frame { rd_base: rd, typer });
            if typer & TYPER_LAST != 0 {
                break;
            }
            let Some(next) = rd.checked_add(if typer & TYPER_VLPIS != 0 { FRAME_V4 } else { FRAME_V3 }) else {
                break;
            };
            rd = next;
        }
    }
    out
}

/// The frame serving the CPU with `mpidr` (the first whose
/// GICR_TYPER.Affinity matches).
pub fn find(frames: &[Frame], mpidr: u64) -> Option<&Frame> {
    let want = mpidr_affinity(mpidr);
    frames.iter().find(|f| f.affinity() == want)
}

/// How many of the CPUs `mpidrs` have a redistributor among `frames`.
pub fn served(frames: &[Frame], mpidrs: &[u64]) -> usize {
    mpidrs.iter().filter(|&&m| find(frames, m).is_some()).count()
}

#[cfg(test)]
mod tests;
