//! Guest MMIO accesses to the distributor and redistributor frames.
//!
//! Access rules (GICv3 §12.1.3 in spirit):
//! * sizes other than 1, 2, 4, 8 and unaligned accesses: `BadAccessSize`;
//! * 64-bit registers (IROUTER, GICR_TYPER, PROPBASER, PENDBASER): 8 bytes,
//!   or 4 bytes for either half;
//! * IPRIORITYR: 1 or 4 bytes; all other registers: 4 bytes;
//! * reserved or unimplemented offsets: read as zero, writes ignored, for any
//!   natural size;
//! * registers that describe SGIs/PPIs in the distributor are RAZ/WI (with
//!   affinity routing they are banked in the redistributors), and so are bits
//!   for INTIDs beyond `nr_irqs`.

use super::lpi::{GICD_TYPER_LPIS, GICR_TYPER_PLPIS};
use super::regs::*;
use super::{Kicks, MmioTarget, Vgic, VgicError, LPI_ID_BITS, NO_VCPU, NR_PRIVATE};

/// The per-interrupt bit registers shared by GICD and the SGI frame.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum BitReg {
    Group,
    SetEnable,
    ClearEnable,
    SetPend,
    ClearPend,
    SetActive,
    ClearActive,
    GrpMod,
}

/// A register decoded from a bank offset.
enum BankReg {
    /// A 32-bit register with one bit per INTID, starting at `first`.
    Bits(BitReg, u32),
    /// IPRIORITYR bytes starting at `first` (1 or 4 of them).
    Priority(u32),
    /// ICFGR with two bits per INTID starting at `first`.
    Config(u32),
}

fn decode_bank(off: u64) -> Option<BankReg> {
    let bits = |base: u64, r: BitReg| Some(BankReg::Bits(r, ((off - base) / 4 * 32) as u32));
    match off {
        IGROUPR..=0x00FF => bits(IGROUPR, BitReg::Group),
        ISENABLER..=0x017F => bits(ISENABLER, BitReg::SetEnable),
        ICENABLER..=0x01FF => bits(ICENABLER, BitReg::ClearEnable),
        ISPENDR..=0x027F => bits(ISPENDR, BitReg::SetPend),
        ICPENDR..=0x02FF => bits(ICPENDR, BitReg::ClearPend),
        ISACTIVER..=0x037F => bits(ISACTIVER, BitReg::SetActive),
        ICACTIVER..=0x03FF => bits(ICACTIVER, BitReg::ClearActive),
        _ if (IPRIORITYR..IPRIORITYR_END).contains(&off) => Some(BankReg::Priority((off - IPRIORITYR) as u32)),
        _ if (ICFGR..ICFGR_END).contains(&off) => Some(BankReg::Config(((off - ICFGR) / 4 * 16) as u32)),
        _ if (IGRPMODR..IGRPMODR_END).contains(&off) => bits(IGRPMODR, BitReg::GrpMod),
        _ => None,
    }
}

/// Validates the generic size/alignment rules; `Ok` means the size is a
/// natural, aligned size (register-specific checks come later).
#[inline(always)]
fn natural(off: u64, size: u8) -> Result<(), VgicError> {
    // 1, 2, 4 or 8 bytes (a power of two up to 8), aligned to the size.
    if size.is_power_of_two() && size <= 8 && off & u64::from(size - 1) == 0 {
        Ok(())
    } else {
        Err(VgicError::BadAccessSize)
    }
}

/// `size` is one of `ok` (a list of one or two, inlined into compares).
#[inline(always)]
fn need(size: u8, ok: &[u8]) -> Result<(), VgicError> {
    if ok.contains(&size) {
        Ok(())
    } else {
        Err(VgicError::BadAccessSize)
    }
}

/// Reads a 64-bit register with a 4- or 8-byte access at `off` (register at `base`).
fn read64(reg: u64, base: u64, off: u64, size: u8) -> Result<u64, VgicError> {
    need(size, &[4, 8])?;
    Ok(match (size, off - base) {
        (8, _) => reg,
        (_, 0) => reg & 0xFFFF_FFFF,
        _ => reg >> 32,
    })
}

/// Merges a 4- or 8-byte write into a 64-bit register.
fn write64(reg: u64, base: u64, off: u64, size: u8, value: u64) -> Result<u64, VgicError> {
    need(size, &[4, 8])?;
    Ok(match (size, off - base) {
        (8, _) => value,
        (_, 0) => (reg & !0xFFFF_FFFF) | (value & 0xFFFF_FFFF),
        _ => (reg & 0xFFFF_FFFF) | (value << 32),
    })
}

impl Vgic {
    /// Emulates a guest read of `size` bytes at `ipa` by vCPU `vcpu`.
    pub fn mmio_read(&self, vcpu: usize, ipa: u64, size: u8) -> Result<u64, VgicError> {
        self.check_vcpu(vcpu)?;
        let (target, off) = self.decode(ipa).ok_or(VgicError::OutOfRange)?;
        natural(off, size)?;
        match target {
            MmioTarget::Distributor => self.dist_read(off, size),
            MmioTarget::Redistributor(rd) => self.redist_read(rd, off, size),
        }
    }

    /// Emulates a guest write; returns the vCPUs to kick.
    pub fn mmio_write(&mut self, vcpu: usize, ipa: u64, size: u8, value: u64) -> Result<Kicks, VgicError> {
        self.check_vcpu(vcpu)?;
        let (target, off) = self.decode(ipa).ok_or(VgicError::OutOfRange)?;
        natural(off, size)?;
        let value = match size {
            1 => value & 0xFF,
            2 => value & 0xFFFF,
            4 => value & 0xFFFF_FFFF,
            _ => value,
        };
        match target {
            MmioTarget::Distributor => self.dist_write(vcpu, off, size, value),
            MmioTarget::Redistributor(rd) => self.redist_write(rd, off, size, value),
        }
    }

    // ---- distributor ----

    fn gicd_typer(&self) -> u32 {
        let it_lines = self.nr_irqs().div_ceil(32) - 1;
        let cpus = (self.vcpus.len().clamp(1, 8) - 1) as u32;
        // 10 INTID bits (0..1023), or 14 with LPIs (8192..16383).
        let (idbits, lpis) = if self.lpis { (LPI_ID_BITS - 1, GICD_TYPER_LPIS) } else { (9, 0) };
        it_lines
            | cpus << 5
            | lpis
            | idbits << 19
            | 1 << 24 // A3V: Aff3 may be non-zero
            | 1 << 26 // RSS: SGI targets with Aff0 up to 255
    }

    fn dist_read(&self, off: u64, size: u8) -> Result<u64, VgicError> {
        let v = match off {
            GICD_CTLR => {
                need(size, &[4])?;
                u64::from(self.ctlr | CTLR_ARE | CTLR_DS)
            }
            GICD_TYPER => {
                need(size, &[4])?;
                u64::from(self.gicd_typer())
            }
            GICD_IIDR => {
                need(size, &[4])?;
                u64::from(IIDR_VALUE)
            }
            GICD_IROUTER..GICD_IROUTER_END => {
                let base = off & !7;
                let n = (base - GICD_IROUTER) / 8;
                let reg = n
                    .checked_sub(u64::from(NR_PRIVATE))
                    .and_then(|i| self.irouter.get(i as usize))
                    .copied()
                    .unwrap_or(0);
                read64(reg, base, off, size)?
            }
            ID_BLOCK.. => {
                need(size, &[4])?;
                u64::from(GICD_ID_REGS[((off - ID_BLOCK) / 4) as usize % GICD_ID_REGS.len()])
            }
            _ => match decode_bank(off) {
                // Private INTIDs are banked in the redistributor: RAZ here.
                Some(reg) => self.bank_read(0, reg, size, NR_PRIVATE, self.nr_irqs())?,
                None => 0, // TYPER2, STATUSR, SGIR, NSACR, ITARGETSR, reserved
            },
        };
        Ok(v)
    }

    fn dist_write(&mut self, vcpu: usize, off: u64, size: u8, value: u64) -> Result<Kicks, VgicError> {
        match off {
            GICD_CTLR => {
                need(size, &[4])?;
                let before = self.grp1_enabled();
                self.ctlr = (value as u32) & (CTLR_ENABLE_GRP0 | CTLR_ENABLE_GRP1);
                if !before && self.grp1_enabled() {
                    return Ok(self.kick_all_deliverable());
                }
                Ok(Kicks::none())
            }
            GICD_IROUTER..GICD_IROUTER_END => {
                let base = off & !7;
                let n = (base - GICD_IROUTER) / 8;
                let Some(idx) = n.checked_sub(u64::from(NR_PRIVATE)).map(|i| i as usize) else {
                    need(size, &[4, 8])?;
                    return Ok(Kicks::none());
                };
                let Some(&old) = self.irouter.get(idx) else {
                    need(size, &[4, 8])?;
                    return Ok(Kicks::none());
                };
                let new = write64(old, base, off, size, value)? & (AFFINITY_MASK | IROUTER_IRM);
                self.irouter[idx] = new;
                self.retarget(idx);
                Ok(self.kick_for(vcpu, n as u32))
            }
            // CTLR/TYPER/IIDR/TYPER2/STATUSR/SGIR and the ID block: read-only or WI.
            GICD_TYPER | GICD_IIDR | ID_BLOCK.. => {
                need(size, &[4])?;
                Ok(Kicks::none())
            }
            _ => match decode_bank(off) {
                Some(reg) => self.bank_write(vcpu, reg, size, value, NR_PRIVATE, self.nr_irqs()),
                None => Ok(Kicks::none()),
            },
        }
    }

    // ---- redistributor ----

    fn gicr_typer(&self, rd: usize) -> u64 {
        let mpidr = self.vcpus.get(rd).map_or(0, |v| v.mpidr);
        let aff = ((mpidr >> 32) & 0xFF) << 24 | (mpidr & 0xFF_FFFF);
        let last = if rd + 1 == self.vcpus.len() { GICR_TYPER_LAST } else { 0 };
        // DirectLPI (bit 3) stays 0: LPIs come only through the ITS.
        let plpis = if self.lpis { GICR_TYPER_PLPIS } else { 0 };
        aff << 32 | (rd as u64 & 0xFFFF) << 8 | last | plpis
    }

    fn redist_read(&self, rd: usize, off: u64, size: u8) -> Result<u64, VgicError> {
        if off >= SGI_FRAME {
            let off = off - SGI_FRAME;
            return match decode_bank(off) {
                Some(reg) => self.bank_read(rd, reg, size, 0, NR_PRIVATE),
                None => Ok(0),
            };
        }
        Ok(match off {
            GICR_CTLR => {
                need(size, &[4])?;
                u64::from(self.gicr_ctlr(rd))
            }
            GICR_STATUSR => {
                need(size, &[4])?;
                0
            }
            GICR_IIDR => {
                need(size, &[4])?;
                u64::from(IIDR_VALUE)
            }
            GICR_TYPER | 0x000C => read64(self.gicr_typer(rd), GICR_TYPER, off, size)?,
            // RAZ/WI: see the module docs.
            GICR_WAKER => {
                need(size, &[4])?;
                0
            }
            GICR_PROPBASER..=0x007F => {
                let base = off & !7;
                read64(self.gicr_baser(rd, base == GICR_PENDBASER), base, off, size)?
            }
            ID_BLOCK.. => {
                need(size, &[4])?;
                u64::from(GICR_ID_REGS[((off - ID_BLOCK) / 4) as usize % GICR_ID_REGS.len()])
            }
            _ => 0,
        })
    }

    fn redist_write(&mut self, rd: usize, off: u64, size: u8, value: u64) -> Result<Kicks, VgicError> {
        if off >= SGI_FRAME {
            let off = off - SGI_FRAME;
            return match decode_bank(off) {
                Some(reg) => self.bank_write(rd, reg, size, value, 0, NR_PRIVATE),
                None => Ok(Kicks::none()),
            };
        }
        match off {
            GICR_CTLR => {
                need(size, &[4])?;
                self.write_gicr_ctlr(rd, value as u32);
            }
            GICR_STATUSR | GICR_IIDR | GICR_WAKER | ID_BLOCK.. => need(size, &[4])?,
            GICR_TYPER | 0x000C => need(size, &[4, 8])?,
            GICR_PROPBASER..=0x007F => {
                let base = off & !7;
                let pend = base == GICR_PENDBASER;
                let new = write64(self.gicr_baser(rd, pend), base, off, size, value)?;
                self.set_gicr_baser(rd, pend, new);
            }
            _ => {}
        }
        Ok(Kicks::none())
    }

    // ---- per-interrupt register banks ----

    /// Reads a bank register; `rd` is the vCPU for private INTIDs and INTIDs
    /// outside `lo..hi` read as zero.
    fn bank_read(&self, rd: usize, reg: BankReg, size: u8, lo: u32, hi: u32) -> Result<u64, VgicError> {
        let in_range = |intid: u32| intid >= lo && intid < hi;
        let mut v: u64 = 0;
        match reg {
            BankReg::Bits(r, first) => {
                need(size, &[4])?;
                for bit in 0..32 {
                    let intid = first + bit;
                    if !in_range(intid) {
                        continue;
                    }
                    let Some(irq) = self.irq(rd, intid) else {
                        continue;
                    };
                    let set = match r {
                        BitReg::Group => irq.group1,
                        BitReg::GrpMod => irq.grpmod,
                        BitReg::SetEnable | BitReg::ClearEnable => irq.enabled,
                        BitReg::SetPend | BitReg::ClearPend => irq.pending_view(),
                        BitReg::SetActive | BitReg::ClearActive => irq.active_view(),
                    };
                    v |= u64::from(set) << bit;
                }
            }
            BankReg::Priority(first) => {
                need(size, &[1, 4])?;
                for byte in 0..u32::from(size) {
                    let intid = first + byte;
                    if in_range(intid) {
                        if let Some(irq) = self.irq(rd, intid) {
                            v |= u64::from(irq.priority) << (8 * byte);
                        }
                    }
                }
            }
            BankReg::Config(first) => {
                need(size, &[4])?;
                for i in 0..16 {
                    let intid = first + i;
                    if in_range(intid) {
                        if let Some(irq) = self.irq(rd, intid) {
                            v |= u64::from(irq.edge) << (2 * i + 1);
                        }
                    }
                }
            }
        }
        Ok(v)
    }

    fn bank_write(
        &mut self,
        rd: usize,
        reg: BankReg,
        size: u8,
        value: u64,
        lo: u32,
        hi: u32,
    ) -> Result<Kicks, VgicError> {
        let in_range = |intid: u32| intid >= lo && intid < hi;
        let mut kicks = Kicks::none();
        match reg {
            BankReg::Bits(r, first) => {
                need(size, &[4])?;
                for bit in 0..32 {
                    let intid = first + bit;
                    let one = value & (1 << bit) != 0;
                    let applies = matches!(r, BitReg::Group | BitReg::GrpMod) || one;
                    if !in_range(intid) || !applies {
                        continue;
                    }
                    let route = if intid >= NR_PRIVATE { self.route_of_raw(intid) } else { Some(rd) };
                    if intid >= NR_PRIVATE && matches!(r, BitReg::SetEnable | BitReg::ClearEnable) {
                        self.route_gen = self.route_gen.wrapping_add(1);
                    }
                    let Some(irq) = self.irq_mut(rd, intid) else {
                        continue;
                    };
                    let flying = irq.in_flight();
                    let busy_before = irq.latch || irq.active;
                    match r {
                        BitReg::Group => irq.group1 = one,
                        BitReg::GrpMod => irq.grpmod = one,
                        BitReg::SetEnable => irq.enabled = true,
                        BitReg::ClearEnable => irq.enabled = false,
                        BitReg::SetPend => irq.latch = true,
                        BitReg::ClearPend => {
                            irq.latch = false;
                            if flying {
                                irq.clr_pend = true;
                            }
                        }
                        BitReg::SetActive => {
                            if flying {
                                irq.set_act = true;
                            } else {
                                irq.active = true;
                                irq.active_on = route.map_or(0, |v| v as u16);
                            }
                        }
                        BitReg::ClearActive => {
                            if flying {
                                irq.clr_act = true;
                                irq.set_act = false;
                            } else {
                                irq.active = false;
                            }
                        }
                    }
                    // A forwarded interrupt not in an LR that this write
                    // made idle: its physical twin is still active. (In an
                    // LR, sync_lrs reports it once the write is applied.)
                    let dropped = match irq.hw {
                        Some(p) if !flying && busy_before && !irq.latch && !irq.active => Some(p),
                        _ => None,
                    };
                    if let Some(p) = dropped {
                        let vcpu = if intid < NR_PRIVATE {
                            rd
                        } else if irq.active_on != NO_VCPU {
                            irq.active_on as usize
                        } else {
                            route.unwrap_or(rd)
                        };
                        self.note_hw_deactivation(vcpu, intid, p);
                    }
                    if !matches!(r, BitReg::Group | BitReg::GrpMod) {
                        kicks.merge(self.kick_for(rd, intid));
                    }
                }
            }
            BankReg::Priority(first) => {
                need(size, &[1, 4])?;
                for byte in 0..u32::from(size) {
                    let intid = first + byte;
                    if in_range(intid) {
                        if let Some(irq) = self.irq_mut(rd, intid) {
                            irq.priority = (value >> (8 * byte)) as u8;
                        }
                    }
                }
            }
            BankReg::Config(first) => {
                need(size, &[4])?;
                for i in 0..16 {
                    let intid = first + i;
                    // SGIs are always edge-triggered (ICFGR0 read-only).
                    if in_range(intid) && intid >= 16 {
                        let edge = value & (1 << (2 * i + 1)) != 0;
                        let changed_hw = self.irq_mut(rd, intid).and_then(|irq| {
                            let was = core::mem::replace(&mut irq.edge, edge);
                            irq.hw.filter(|_| was != edge)
                        });
                        // A forwarded SPI's physical trigger follows the
                        // guest's (a PPI's is the hypervisor's: the timer).
                        if let Some(p) = changed_hw.filter(|_| intid >= 32) {
                            self.note_hw_trigger(p, edge);
                        }
                    }
                }
            }
        }
        Ok(kicks)
    }
}
