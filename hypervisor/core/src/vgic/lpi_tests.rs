//! Host tests of the vGIC's LPIs: registers, configuration table, delivery
//! through list registers, and hostile values.

use super::lpi::{GICR_CTLR_CES, GICR_CTLR_ENABLE_LPIS, PENDBASER_MASK, PROPBASER_MASK};
use super::regs::*;
use super::*;
use crate::intid::IntId;
use crate::testrng::Rng;
use crate::virtio::VecMemory;
use alloc::format;
use alloc::vec;

const GICD: u64 = 0x0800_0000;
const GICR: u64 = 0x080A_0000;
const RAM: u64 = 0x4000_0000;
const RAM_SIZE: usize = 0x10_0000;
/// Where the tests put the LPI configuration table (64 KiB aligned).
const PROP: u64 = RAM + 0x1_0000;
/// Where the tests put the pending table.
const PEND: u64 = RAM + 0x3_0000;
/// PROPBASER as Linux writes it: IDbits = 13, InnerShareable, RaWaWb.
const PROPBASER_LINUX: u64 = PROP | 1 << 10 | 7 << 7 | 13;

fn cfg(n: usize, lpis: bool) -> VgicConfig {
    VgicConfig {
        gicd_base: GICD,
        gicr_base: GICR,
        nr_spis: 64,
        vcpu_mpidrs: (0..n as u64).map(|i| 0x8000_0000 | i).collect(),
        lpis,
    }
}

fn rd(v: usize) -> u64 {
    GICR + v as u64 * GICR_STRIDE
}

fn lpi(n: u32) -> IntId {
    IntId::try_from(LPI_BASE + n).unwrap()
}

/// A guest that booted with LPIs: distributor and redistributors on,
/// PROPBASER/PENDBASER set, EnableLPIs 1 on every vCPU, and the
/// configuration table loaded from `mem` (all LPIs disabled, priority 0xA0).
fn lpi_booted(n: usize) -> (Vgic, VecMemory) {
    let mut g = Vgic::new(cfg(n, true));
    let mut mem = VecMemory::new(RAM, RAM_SIZE);
    let off = (PROP - RAM) as usize;
    mem.bytes[off..off + NR_LPIS as usize].fill(0xA2);
    g.mmio_write(0, GICD + GICD_CTLR, 4, 0x12).unwrap();
    for v in 0..n {
        g.mmio_write(v, rd(v) + GICR_PROPBASER, 8, PROPBASER_LINUX).unwrap();
        g.mmio_write(v, rd(v) + GICR_PENDBASER, 8, PEND | 1 << 62).unwrap();
        g.mmio_write(v, rd(v) + GICR_CTLR, 4, 1).unwrap();
    }
    let events = g.take_lpi_enable_events();
    assert_eq!(events, (0..n).collect::<Vec<_>>());
    for v in events {
        g.load_lpi_config(&mem, v).unwrap();
    }
    assert!(g.take_lpi_enable_events().is_empty());
    (g, mem)
}

/// Enables LPI `n` with priority `prio`, as INV after a table write does.
fn enable_lpi(g: &mut Vgic, n: u32, prio: u8) -> Kicks {
    g.set_lpi_config(lpi(n), prio | 2 | LPI_CONFIG_ENABLE).unwrap()
}

fn lr_intid(v: u64) -> u32 {
    (v & LR_VINTID_MASK) as u32
}

fn kicks_of(k: Kicks) -> Vec<usize> {
    k.iter().collect()
}

#[test]
fn typer_bits_with_and_without_lpis() {
    let mut g = Vgic::new(cfg(2, false));
    let t = g.mmio_read(0, GICD + GICD_TYPER, 4).unwrap();
    assert_eq!(t & (1 << 17), 0, "no LPIS");
    assert_eq!((t >> 19) & 0x1F, 9, "IDbits");
    assert_eq!(g.mmio_read(0, rd(0) + GICR_TYPER, 8).unwrap() & 1, 0, "no PLPIS");
    assert_eq!(g.mmio_read(0, rd(0) + GICR_CTLR, 4).unwrap(), 0);
    assert!(!g.lpis_supported());
    // Without LPIs the LPI registers stay RAZ/WI and the API refuses.
    g.mmio_write(0, rd(0) + GICR_PROPBASER, 8, PROPBASER_LINUX).unwrap();
    g.mmio_write(0, rd(0) + GICR_CTLR, 4, 1).unwrap();
    assert_eq!(g.mmio_read(0, rd(0) + GICR_PROPBASER, 8).unwrap(), 0);
    assert!(!g.lpis_enabled(0));
    assert!(g.take_lpi_enable_events().is_empty());
    assert_eq!(g.inject_lpi(lpi(0), 0), Err(VgicError::BadIntid(lpi(0))));
    assert_eq!(g.set_lpi_config(lpi(0), 0xA3), Err(VgicError::BadIntid(lpi(0))));

    let g = Vgic::new(cfg(2, true));
    assert!(g.lpis_supported());
    let t = g.mmio_read(0, GICD + GICD_TYPER, 4).unwrap();
    assert_ne!(t & (1 << 17), 0, "LPIS");
    assert_eq!(t & (1 << 16), 0, "no MBIS");
    assert_eq!((t >> 19) & 0x1F, 13, "IDbits: 14 INTID bits");
    assert_eq!((t >> 19) & 0x1F, u64::from(LPI_ID_BITS - 1));
    assert_eq!((t >> 11) & 0x1F, 0, "num_LPIs: from IDbits");
    for v in 0..2 {
        let r = g.mmio_read(0, rd(v) + GICR_TYPER, 8).unwrap();
        assert_eq!(r & 1, 1, "PLPIS");
        assert_eq!(r & (1 << 3), 0, "no DirectLPI");
        assert_eq!(r & (1 << 1), 0, "no VLPIS");
    }
}

#[test]
fn propbaser_pendbaser_masks_and_wi_while_enabled() {
    let mut g = Vgic::new(cfg(2, true));
    let p = rd(1) + GICR_PROPBASER;
    let q = rd(1) + GICR_PENDBASER;
    g.mmio_write(1, p, 8, u64::MAX).unwrap();
    let prop = g.mmio_read(1, p, 8).unwrap();
    assert_eq!(prop, PROPBASER_MASK);
    assert_eq!(prop, 0x070F_FFFF_FFFF_FF9F, "IDbits, caches, shareability, PA[51:12]");
    g.mmio_write(1, q, 8, u64::MAX).unwrap();
    let pend = g.mmio_read(1, q, 8).unwrap();
    assert_eq!(pend, PENDBASER_MASK);
    assert_eq!(pend & (1 << 62), 0, "PTZ reads 0");
    assert_eq!(pend & 0xFFFF & !0xF80, 0, "PA below bit 16 is RES0");
    // 32-bit halves.
    g.mmio_write(1, p, 4, 0x1234_5F8D).unwrap();
    g.mmio_write(1, p + 4, 4, 0x0000_00AB).unwrap();
    assert_eq!(g.mmio_read(1, p, 8).unwrap(), 0xAB_1234_5F8D & PROPBASER_MASK);
    assert_eq!(g.mmio_read(1, p + 4, 4).unwrap(), 0xAB);
    assert_eq!(g.mmio_read(1, p, 4).unwrap(), 0x1234_5F8D & PROPBASER_MASK);
    assert_eq!(g.mmio_read(1, p, 2), Err(VgicError::BadAccessSize));
    assert_eq!(g.mmio_write(1, q, 1, 0), Err(VgicError::BadAccessSize));
    // Other redistributors are independent.
    assert_eq!(g.mmio_read(0, rd(0) + GICR_PROPBASER, 8).unwrap(), 0);
    assert_eq!(g.lpi_prop_table(1), None, "EnableLPIs 0");
    assert_eq!(g.lpi_pend_table(1), None);

    g.mmio_write(1, p, 8, PROPBASER_LINUX).unwrap();
    g.mmio_write(1, q, 8, PEND | 1 << 62).unwrap();
    g.mmio_write(1, rd(1) + GICR_CTLR, 4, 1).unwrap();
    assert_eq!(g.take_lpi_enable_events(), vec![1]);
    assert_eq!(g.lpi_prop_table(1), Some((PROP, NR_LPIS)));
    assert_eq!(g.lpi_pend_table(1), Some(PEND));
    // Writes ignored while EnableLPIs is 1.
    g.mmio_write(1, p, 8, 0x5000_0000 | 13).unwrap();
    g.mmio_write(1, q + 4, 4, 0xFFFF).unwrap();
    assert_eq!(g.mmio_read(1, p, 8).unwrap(), PROPBASER_LINUX);
    assert_eq!(g.mmio_read(1, q, 8).unwrap(), PEND);
}

#[test]
fn enable_lpis_and_idbits() {
    let mut g = Vgic::new(cfg(2, true));
    let c = rd(0) + GICR_CTLR;
    assert_eq!(g.mmio_read(0, c, 4).unwrap() as u32, GICR_CTLR_CES);
    // IDbits = 12: 13 bits, no LPI in range (and nothing to read).
    g.mmio_write(0, rd(0) + GICR_PROPBASER, 8, PROP | 12).unwrap();
    g.mmio_write(0, c, 4, 1).unwrap();
    assert!(g.lpis_enabled(0) && !g.lpis_enabled(1));
    assert_eq!(g.mmio_read(0, c, 4).unwrap() as u32, GICR_CTLR_CES | GICR_CTLR_ENABLE_LPIS);
    assert_eq!(g.lpi_prop_table(0), Some((PROP, 0)));
    assert_eq!(g.inject_lpi(lpi(0), 0), Err(VgicError::BadIntid(lpi(0))));
    // Writing 1 again is no new event.
    g.mmio_write(0, c, 4, 1).unwrap();
    assert_eq!(g.take_lpi_enable_events(), vec![0]);
    // Clearing it is allowed (CES = 1), like KVM: then PROPBASER is writable.
    g.mmio_write(0, c, 4, 0).unwrap();
    assert!(!g.lpis_enabled(0));
    // IDbits = 31: clamped to 14 bits.
    g.mmio_write(0, rd(0) + GICR_PROPBASER, 8, PROP | 31).unwrap();
    g.mmio_write(0, c, 4, 1).unwrap();
    assert_eq!(g.lpi_prop_table(0), Some((PROP, NR_LPIS)));
    assert_eq!(g.take_lpi_enable_events(), vec![0]);
}

#[test]
fn config_comes_from_the_guest_table() {
    let (mut g, mut mem) = lpi_booted(2);
    let mut lrs = [0u64; 4];
    g.inject_lpi(lpi(5), 1).unwrap();
    assert!(g.lpi_pending(lpi(5), 1));
    assert_eq!(g.flush_lrs(1, &mut lrs).filled, 0, "disabled in the table");
    // The guest enables LPI 5 (priority 0x40) in its table, then INVALL.
    mem.bytes[(PROP - RAM) as usize + 5] = 0x40 | 2 | 1;
    let k = g.load_lpi_config(&mem, 0).unwrap();
    assert_eq!(kicks_of(k), vec![1], "pending on vCPU 1");
    let r = g.flush_lrs(1, &mut lrs);
    assert_eq!(r.filled, 1);
    assert_eq!(lrs[0], encode_lr(LPI_BASE + 5, 0x40, None, false, true, false));
    // A table that is not all RAM: error, nothing changes.
    g.mmio_write(0, rd(0) + GICR_CTLR, 4, 0).unwrap();
    g.mmio_write(0, rd(0) + GICR_PROPBASER, 8, (RAM + RAM_SIZE as u64 - 0x1000) | 13).unwrap();
    g.mmio_write(0, rd(0) + GICR_CTLR, 4, 1).unwrap();
    mem.bytes.fill(0);
    assert_eq!(
        g.load_lpi_config(&mem, 0),
        Err(VgicError::TableOutsideRam { gpa: RAM + RAM_SIZE as u64 - 0x1000, len: u64::from(NR_LPIS) })
    );
    g.mmio_write(0, rd(0) + GICR_CTLR, 4, 0).unwrap();
    g.mmio_write(0, rd(0) + GICR_PROPBASER, 8, 0xFFFF_FFFF_F000 | 13).unwrap();
    g.mmio_write(0, rd(0) + GICR_CTLR, 4, 1).unwrap();
    assert!(matches!(g.load_lpi_config(&mem, 0), Err(VgicError::TableOutsideRam { .. })));
    assert_eq!(g.load_lpi_config(&mem, 7), Err(VgicError::BadVcpu(7)));
    g.mmio_write(0, rd(0) + GICR_CTLR, 4, 0).unwrap();
    assert_eq!(g.load_lpi_config(&mem, 0), Err(VgicError::LpisDisabled(0)));
    // LPI 5 is still enabled at 0x40 (in vCPU 1's LR) and 6 still disabled.
    // The guest takes LPI 5.
    lrs[0] &= !LR_STATE_MASK;
    g.sync_lrs(1, &mut lrs);
    g.inject_lpi(lpi(6), 1).unwrap();
    assert!(!g.has_deliverable(1));
    g.inject_lpi(lpi(5), 1).unwrap();
    assert!(g.has_deliverable(1));
}

#[test]
fn inject_flush_ack_sync() {
    let (mut g, _mem) = lpi_booted(2);
    enable_lpi(&mut g, 100, 0x80);
    enable_lpi(&mut g, 7, 0x20);
    assert!(!g.has_deliverable(0));
    assert_eq!(kicks_of(g.inject_lpi(lpi(100), 0).unwrap()), vec![0]);
    assert_eq!(kicks_of(g.inject_lpi(lpi(7), 0).unwrap()), vec![0]);
    assert!(g.has_deliverable(0) && !g.has_deliverable(1));
    assert!(g.is_pending_or_active(0, lpi(7)));
    let mut lrs = [0u64; 4];
    let r = g.flush_lrs(0, &mut lrs);
    assert_eq!((r.filled, r.overflow, r.eoi_maintenance), (2, false, false));
    // Sorted by priority: LPI 7 (0x20) first.
    assert_eq!(lrs[0], encode_lr(LPI_BASE + 7, 0x20, None, false, true, false));
    assert_eq!(lrs[1], encode_lr(LPI_BASE + 100, 0x80, None, false, true, false));
    assert_eq!(lrs[0] & (LR_HW | LR_EOI), 0);
    assert_ne!(lrs[0] & LR_GROUP1, 0);
    assert_eq!(g.lr_contents(0)[0], Some(lpi(7)));
    assert!(g.lpi_pending(lpi(7), 0), "in the LR, still pending as far as the model knows");
    // The guest acknowledges LPI 7: the LR becomes invalid. A new edge
    // arrives for LPI 100 while it still sits in the LR.
    lrs[0] &= !LR_STATE_MASK;
    g.inject_lpi(lpi(100), 0).unwrap();
    let r = g.flush_lrs(0, &mut lrs);
    assert_eq!(r.filled, 0, "never twice in one vCPU's LRs");
    assert!(g.sync_lrs(0, &mut lrs).is_empty());
    assert!(!g.lpi_pending(lpi(7), 0), "acknowledged: done");
    assert!(g.lpi_pending(lpi(100), 0), "merged with the new edge");
    assert_eq!(lrs, [0; 4]);
    let r = g.flush_lrs(0, &mut lrs);
    assert_eq!(r.filled, 1);
    assert_eq!(lr_intid(lrs[0]), LPI_BASE + 100);
    // Acknowledge and sync: nothing left.
    lrs[0] &= !LR_STATE_MASK;
    g.sync_lrs(0, &mut lrs);
    assert!(!g.has_deliverable(0));
    assert_eq!(g.flush_lrs(0, &mut lrs).filled, 0);
    // An LPI LR the guest made active (it cannot be) is done too.
    g.inject_lpi(lpi(7), 0).unwrap();
    g.flush_lrs(0, &mut lrs);
    lrs[0] = (lrs[0] & !LR_STATE_MASK) | LR_ACTIVE;
    g.sync_lrs(0, &mut lrs);
    assert!(!g.lpi_pending(lpi(7), 0));
}

#[test]
fn lpis_share_lrs_with_spis_by_priority() {
    let (mut g, _mem) = lpi_booted(1);
    for i in 0..3 {
        enable_lpi(&mut g, i, 0x10 + 0x40 * i as u8); // 0x10, 0x50, 0x90
        g.inject_lpi(lpi(i), 0).unwrap();
    }
    g.mmio_write(0, GICD + IGROUPR + 4, 4, 0xFFFF_FFFF).unwrap();
    g.mmio_write(0, GICD + ISENABLER + 4, 4, 1 << 8).unwrap(); // SPI 40
    g.mmio_write(0, GICD + IPRIORITYR + 40, 1, 0x30).unwrap();
    g.inject_edge(IntId::try_from(40).unwrap(), 0).unwrap();
    let mut lrs = [0u64; 2];
    let r = g.flush_lrs(0, &mut lrs);
    assert!(r.overflow, "four candidates, two LRs");
    assert_eq!([lr_intid(lrs[0]), lr_intid(lrs[1])], [LPI_BASE, 40]);
    lrs = [0; 2];
    g.sync_lrs(0, &mut lrs);
    let r = g.flush_lrs(0, &mut lrs);
    assert!(!r.overflow);
    assert_eq!([lr_intid(lrs[0]), lr_intid(lrs[1])], [LPI_BASE + 1, LPI_BASE + 2]);
    // The INTID never outweighs the priority: LPI 16383 at 0x00 goes
    // before SPI 40 at 0x02 (the sort key has room for 14 INTID bits).
    lrs = [0; 2];
    g.sync_lrs(0, &mut lrs);
    g.mmio_write(0, GICD + IPRIORITYR + 40, 1, 0x02).unwrap();
    g.inject_edge(IntId::try_from(40).unwrap(), 0).unwrap();
    enable_lpi(&mut g, NR_LPIS - 1, 0x00);
    g.inject_lpi(lpi(NR_LPIS - 1), 0).unwrap();
    g.flush_lrs(0, &mut lrs);
    assert_eq!([lr_intid(lrs[0]), lr_intid(lrs[1])], [16383, 40]);
}

#[test]
fn disabled_lpi_waits_until_enabled() {
    let (mut g, _mem) = lpi_booted(2);
    assert!(g.inject_lpi(lpi(3), 1).unwrap().is_empty(), "disabled: no kick");
    assert!(!g.has_deliverable(1));
    assert_eq!(g.flush_lrs(1, &mut [0; 4]).filled, 0);
    assert!(g.lpi_pending(lpi(3), 1));
    // Priority change while disabled: no kick.
    assert!(g.set_lpi_config(lpi(3), 0x62).unwrap().is_empty());
    assert_eq!(kicks_of(enable_lpi(&mut g, 3, 0x60)), vec![1]);
    assert!(enable_lpi(&mut g, 3, 0x60).is_empty(), "unchanged");
    let mut lrs = [0u64; 4];
    assert_eq!(g.flush_lrs(1, &mut lrs).filled, 1);
    // Disabling it while it sits in the LR kicks the holder; on sync it is
    // pending again in the model but not delivered.
    assert_eq!(kicks_of(g.set_lpi_config(lpi(3), 0x62).unwrap()), vec![1]);
    g.sync_lrs(1, &mut lrs);
    assert!(g.lpi_pending(lpi(3), 1) && !g.has_deliverable(1));
    // The distributor's Group 1 enable gates LPIs too; GICR_WAKER does not.
    enable_lpi(&mut g, 3, 0x60);
    g.mmio_write(0, GICD + GICD_CTLR, 4, 0).unwrap();
    assert!(!g.has_deliverable(1));
    assert_eq!(kicks_of(g.mmio_write(0, GICD + GICD_CTLR, 4, 2).unwrap()), vec![1]);
    g.mmio_write(1, rd(1) + GICR_WAKER, 4, WAKER_PROCESSOR_SLEEP as u64).unwrap();
    assert!(g.has_deliverable(1));
}

#[test]
fn clear_while_in_lr() {
    let (mut g, _mem) = lpi_booted(2);
    enable_lpi(&mut g, 9, 0xA0);
    g.inject_lpi(lpi(9), 0).unwrap();
    let mut lrs = [0u64; 4];
    g.flush_lrs(0, &mut lrs);
    g.clear_lpi(lpi(9), 0).unwrap();
    assert!(!g.lpi_pending(lpi(9), 0));
    // The guest did not take it yet: sync drops it.
    g.sync_lrs(0, &mut lrs);
    assert!(!g.lpi_pending(lpi(9), 0) && !g.has_deliverable(0));
    // Clear of a model-held one.
    g.inject_lpi(lpi(9), 0).unwrap();
    g.clear_lpi(lpi(9), 0).unwrap();
    assert!(!g.has_deliverable(0));
    // Clear, then a new edge while the old one is in the LR: one remains.
    g.inject_lpi(lpi(9), 0).unwrap();
    g.flush_lrs(0, &mut lrs);
    g.clear_lpi(lpi(9), 0).unwrap();
    g.inject_lpi(lpi(9), 0).unwrap();
    g.sync_lrs(0, &mut lrs);
    assert!(g.lpi_pending(lpi(9), 0));
    assert_eq!(g.flush_lrs(0, &mut lrs).filled, 1);
    // EnableLPIs 1 -> 0 drops the pending one in the LR and in the model.
    g.inject_lpi(lpi(9), 1).unwrap();
    g.mmio_write(0, rd(0) + GICR_CTLR, 4, 0).unwrap();
    g.mmio_write(1, rd(1) + GICR_CTLR, 4, 0).unwrap();
    g.sync_lrs(0, &mut lrs);
    assert!(!g.lpi_pending(lpi(9), 0) && !g.lpi_pending(lpi(9), 1));
    // Now not delivered, and not an error.
    assert!(g.inject_lpi(lpi(9), 0).unwrap().is_empty());
    assert!(!g.lpi_pending(lpi(9), 0));
    assert_eq!(g.clear_lpi(lpi(9), 0), Ok(()));
}

#[test]
fn move_between_vcpus() {
    let (mut g, _mem) = lpi_booted(3);
    enable_lpi(&mut g, 42, 0xA0);
    g.inject_lpi(lpi(42), 0).unwrap();
    assert_eq!(kicks_of(g.move_lpi(lpi(42), 0, 2).unwrap()), vec![2]);
    assert!(!g.lpi_pending(lpi(42), 0) && g.lpi_pending(lpi(42), 2));
    assert!(!g.has_deliverable(0) && g.has_deliverable(2));
    // Not pending: moving only changes nothing.
    assert!(g.move_lpi(lpi(43), 0, 1).unwrap().is_empty());
    assert!(!g.lpi_pending(lpi(43), 1));
    // Moved while in vCPU 2's LR and not acknowledged: at sync it goes to 1.
    let mut lrs = [0u64; 4];
    g.flush_lrs(2, &mut lrs);
    g.move_lpi(lpi(42), 2, 1).unwrap();
    assert!(g.lpi_pending(lpi(42), 1) && !g.lpi_pending(lpi(42), 2));
    assert_eq!(kicks_of(g.sync_lrs(2, &mut lrs)), vec![1]);
    assert!(g.lpi_pending(lpi(42), 1) && !g.lpi_pending(lpi(42), 2));
    // Moved while in the LR and acknowledged: done everywhere.
    let mut lrs1 = [0u64; 4];
    g.flush_lrs(1, &mut lrs1);
    g.move_lpi(lpi(42), 1, 0).unwrap();
    lrs1[0] &= !LR_STATE_MASK;
    assert!(g.sync_lrs(1, &mut lrs1).is_empty());
    assert!((0..3).all(|v| !g.lpi_pending(lpi(42), v)));
    // Into a vCPU with EnableLPIs 0: dropped.
    g.inject_lpi(lpi(42), 0).unwrap();
    g.mmio_write(1, rd(1) + GICR_CTLR, 4, 0).unwrap();
    assert!(g.move_lpi(lpi(42), 0, 1).unwrap().is_empty());
    assert!(!g.lpi_pending(lpi(42), 0) && !g.lpi_pending(lpi(42), 1));
    // Same vCPU: nothing happens.
    g.inject_lpi(lpi(42), 0).unwrap();
    g.move_lpi(lpi(42), 0, 0).unwrap();
    assert!(g.lpi_pending(lpi(42), 0));
}

#[test]
fn hostile_values() {
    let (mut g, mem) = lpi_booted(2);
    // 8191 and u32::MAX are no INTIDs at all: the type refuses them.
    assert!(IntId::try_from(8191).is_err() && IntId::try_from(u32::MAX).is_err());
    let beyond = IntId::try_from(16384).unwrap();
    let top = IntId::try_from((1 << 24) - 1).unwrap();
    let spi = IntId::try_from(40).unwrap();
    let sgi = IntId::try_from(1).unwrap();
    for bad in [beyond, top, spi, sgi] {
        let e = Err(VgicError::BadIntid(bad));
        assert_eq!(g.inject_lpi(bad, 0), e);
        assert_eq!(g.set_lpi_config(bad, 0xFF), e);
        assert_eq!(g.clear_lpi(bad, 0), e.map(|_| ()));
        assert_eq!(g.move_lpi(bad, 0, 1), e);
        assert!(!g.lpi_pending(bad, 0));
    }
    let last = lpi(NR_LPIS - 1);
    assert_eq!(u32::from(last), 16383);
    assert!(g.inject_lpi(last, 0).is_ok());
    for v in [2, 255, 256, usize::MAX] {
        assert_eq!(g.inject_lpi(lpi(0), v), Err(VgicError::BadVcpu(v)));
        assert_eq!(g.clear_lpi(lpi(0), v), Err(VgicError::BadVcpu(v)));
        assert_eq!(g.move_lpi(lpi(0), v, 0), Err(VgicError::BadVcpu(v)));
        assert_eq!(g.move_lpi(lpi(0), 0, v), Err(VgicError::BadVcpu(v)));
        assert_eq!(g.load_lpi_config(&mem, v), Err(VgicError::BadVcpu(v)));
        assert!(!g.lpi_pending(lpi(0), v) && !g.lpis_enabled(v));
        assert_eq!(g.lpi_prop_table(v), None);
        assert_eq!(g.lpi_pend_table(v), None);
        g.flush_lrs(v, &mut [0; 4]);
        g.sync_lrs(v, &mut [0; 4]);
    }
    // A PROPBASER with IDbits too small for the LPI.
    g.mmio_write(1, rd(1) + GICR_CTLR, 4, 0).unwrap();
    g.mmio_write(1, rd(1) + GICR_PROPBASER, 8, PROP | 5).unwrap();
    g.mmio_write(1, rd(1) + GICR_CTLR, 4, 1).unwrap();
    assert_eq!(g.inject_lpi(lpi(0), 1), Err(VgicError::BadIntid(lpi(0))));
    assert_eq!(g.move_lpi(lpi(0), 0, 1), Err(VgicError::BadIntid(lpi(0))));
    assert_eq!(g.load_lpi_config(&mem, 1), Ok(Kicks::none()), "an empty table");
    let s = format!("{}", VgicError::TableOutsideRam { gpa: 0x1000, len: 8192 });
    assert!(s.contains("0x1000") && s.contains("8192"), "{s}");
}

#[test]
fn dump_shows_lpis() {
    let (mut g, _mem) = lpi_booted(1);
    enable_lpi(&mut g, 1, 0x40);
    g.inject_lpi(lpi(1), 0).unwrap();
    g.inject_lpi(lpi(2), 0).unwrap();
    let mut lrs = [0u64; 4];
    g.flush_lrs(0, &mut lrs);
    g.clear_lpi(lpi(1), 0).unwrap();
    let s = format!("{}", g.dump(0));
    assert!(s.contains("lpis enabled=true"), "{s}");
    assert!(s.contains("lpi  8193 prio=0x40 E- in_lr=0 cleared"), "{s}");
    assert!(s.contains("lpi  8194 prio=0xa0 -P"), "{s}");
}

/// Random LPI traffic, register writes and LR activity: no panic, an LPI at
/// most once in one vCPU's LRs, and every LR the model fills is an LPI it
/// held pending.
#[test]
fn random_lpi_traffic() {
    let n = 3;
    let (mut g, mut mem) = lpi_booted(n);
    let mut rng = Rng(0x0005_EED0_F1D5);
    let mut lrs = vec![[0u64; 4]; n];
    let mut filled = 0;
    for _ in 0..100_000 {
        let v = rng.below(n as u64 + 1) as usize; // sometimes invalid
        let w = rng.below(n as u64) as usize;
        // Mostly LPIs 0..=63; sometimes anywhere, across the pending words.
        let raw = match rng.below(8) {
            0 => LPI_BASE + rng.below(8192) as u32,
            _ => LPI_BASE - 2 + rng.below(70) as u32,
        };
        let value = rng.next();
        g.assert_lpi_summary_matches();
        match (rng.below(14), IntId::try_from(raw)) {
            (0..=2, Ok(i)) => {
                let _ = g.inject_lpi(i, v);
            }
            (3, Ok(i)) => {
                let _ = g.clear_lpi(i, v);
            }
            (4, Ok(i)) => {
                let _ = g.move_lpi(i, v, w);
            }
            (5, Ok(i)) => {
                let _ = g.set_lpi_config(i, value as u8);
            }
            (6, _) => {
                let off = (PROP - RAM) as usize + rng.below(64) as usize;
                mem.bytes[off] = value as u8;
                let _ = g.load_lpi_config(&mem, v);
            }
            (7, _) => {
                // EnableLPIs / PROPBASER / PENDBASER / CTLR / WAKER writes.
                let off = [GICR_CTLR, GICR_PROPBASER, GICR_PENDBASER, GICR_WAKER][rng.below(4) as usize];
                let val = match off {
                    GICR_PROPBASER if value & 1 == 0 => PROPBASER_LINUX,
                    GICR_CTLR | GICR_WAKER => value & 3,
                    _ => value,
                };
                let _ = g.mmio_write(0, rd(w) + off, if off >= GICR_PROPBASER { 8 } else { 4 }, val);
                for e in g.take_lpi_enable_events() {
                    let _ = g.load_lpi_config(&mem, e);
                }
            }
            (8, _) => {
                let _ = g.mmio_write(0, GICD + GICD_CTLR, 4, value & 2);
            }
            (9..=10, _) => {
                if let Some(l) = lrs.get_mut(v) {
                    filled += g.flush_lrs(v, l).filled;
                    for &x in l.iter().filter(|&&x| x != 0) {
                        assert!(lr_intid(x) >= LPI_BASE && x & LR_PENDING != 0);
                    }
                }
            }
            (11..=12, _) => {
                if let Some(l) = lrs.get_mut(v) {
                    // The guest acknowledges some (or makes them active).
                    for x in l.iter_mut().filter(|x| **x != 0) {
                        *x = (*x & !LR_STATE_MASK) | (value & LR_STATE_MASK);
                    }
                    g.sync_lrs(v, l);
                }
            }
            _ => {
                let _ = g.has_deliverable(v);
                let _ = format!("{}", g.dump(v));
            }
        }
        for v in 0..n {
            let c = g.lr_contents(v);
            for (s, a) in c.iter().enumerate() {
                assert!(a.is_none() || !c[s + 1..].contains(a), "{a:?} twice in vCPU {v}'s LRs");
            }
        }
    }
    assert!(filled > 1_000, "{filled}");
}

/// Where the vITS tests put the ITS frame and its 64 KiB command queue.
const ITS: u64 = 0x0808_0000;
const QUEUE: u64 = RAM + 0x8_0000;

/// Two vCPUs with LPIs on ([`lpi_booted`]) and an enabled vITS over them,
/// its command queue at [`QUEUE`].
fn vits_booted() -> (Vgic, VecMemory, super::its::Vits) {
    use super::its::{NoBackend, Vits, VitsConfig};
    let (mut g, mem) = lpi_booted(2);
    let mut its = Vits::new(VitsConfig { base: ITS, nr_vcpus: 2, msi_vcpu: None, devices: None }).unwrap();
    its.mmio_write(ITS + 0x80, 8, QUEUE | 1 << 63 | 15, &mem, &mut g, &mut NoBackend).unwrap();
    its.mmio_write(ITS, 4, 1, &mem, &mut g, &mut NoBackend).unwrap();
    (g, mem, its)
}

/// The vITS over this vGIC, as the runtime wires them: Linux's commands
/// map an event, INV enables its LPI from the guest's table, and the
/// runtime's host-LPI path (`translate`, then `inject_lpi`) puts the guest
/// LPI into the target vCPU's list registers, kicking only that vCPU.
#[test]
fn the_vits_over_this_vgic_delivers_an_msi_to_a_list_register() {
    use super::its::NoBackend;
    use crate::its::cmd::Command;
    use crate::virtio::GuestMemory;
    let (mut g, mut mem, mut its) = vits_booted();
    let cmds = [
        Command::Mapc { icid: 0, rdbase: 0, valid: true },
        Command::Mapc { icid: 1, rdbase: 1, valid: true },
        Command::Invall { icid: 1 },
        Command::Mapd { device: 8, size: 1, itt_addr: RAM + 0xA_0000, valid: true },
        Command::Mapti { device: 8, event: 1, pintid: LPI_BASE + 5, icid: 1 },
        Command::Inv { device: 8, event: 1 },
        Command::Sync { rdbase: 1 },
    ];
    // LPI 8197 enabled at priority 0x80 in the guest's table, then queued.
    mem.write(PROP + 5, &[0x80 | 2 | 1]).unwrap();
    for (i, c) in cmds.iter().enumerate() {
        mem.write(QUEUE + 32 * i as u64, &c.to_bytes()).unwrap();
    }
    let k = its.mmio_write(ITS + 0x88, 8, 32 * cmds.len() as u64, &mem, &mut g, &mut NoBackend).unwrap();
    assert!(k.is_empty(), "nothing pending yet: {k:?}");
    assert_eq!(its.counters().total_errors(), 0);
    let (creadr, _) = its.mmio_read(ITS + 0x90, 8, &mem, &mut g, &mut NoBackend).unwrap();
    assert_eq!(creadr, 32 * cmds.len() as u64);
    // The device's MSI: the host LPI's route says (8, 1).
    let (intid, vcpu) = its.translate(8, 1).unwrap();
    assert_eq!((u32::from(intid), vcpu), (LPI_BASE + 5, 1));
    let k = g.inject_lpi(intid, vcpu).unwrap();
    assert_eq!(kicks_of(k), [1]);
    let mut lrs = [0u64; 4];
    g.flush_lrs(0, &mut lrs);
    assert!(lrs.iter().all(|&l| l == 0), "nothing for vCPU0: {lrs:x?}");
    g.flush_lrs(1, &mut lrs);
    let lr = lrs.iter().copied().find(|&l| l != 0).expect("an LR for vCPU1");
    assert_eq!(lr_intid(lr), LPI_BASE + 5);
    assert_eq!((lr >> 48) & 0xff, 0x80, "priority from the guest's table");
}

/// The vITS over this vGIC with a guest that leaves stale bytes in its
/// queue slots: an INT whose RES0 bits are all ones still makes the LPI
/// pending in the target redistributor.
#[test]
fn an_int_with_stale_reserved_bits_pends_the_lpi() {
    use super::its::NoBackend;
    use crate::its::cmd::{used_bits, Command};
    use crate::virtio::GuestMemory;
    let (mut g, mut mem, mut its) = vits_booted();
    let stale = |c: Command| -> [u8; 32] {
        let used = used_bits(c.opcode()).unwrap();
        let w = c.encode();
        let mut b = [0u8; 32];
        for i in 0..4 {
            b[8 * i..8 * i + 8].copy_from_slice(&(w[i] | !used[i]).to_le_bytes());
        }
        b
    };
    let cmds = [
        Command::Mapc { icid: 1, rdbase: 1, valid: true },
        Command::Mapd { device: 8, size: 1, itt_addr: RAM + 0xA_0000, valid: true },
        Command::Mapti { device: 8, event: 1, pintid: LPI_BASE + 5, icid: 1 },
        Command::Int { device: 8, event: 1 },
    ];
    for (i, c) in cmds.iter().enumerate() {
        mem.write(QUEUE + 32 * i as u64, &stale(*c)).unwrap();
    }
    its.mmio_write(ITS + 0x88, 8, 32 * cmds.len() as u64, &mem, &mut g, &mut NoBackend).unwrap();
    assert_eq!(its.counters().total_errors(), 0);
    assert_eq!(its.counters().reserved_ignored, cmds.len() as u64);
    assert!(g.lpi_pending(lpi(5), 1), "INT pended LPI 8197 on vCPU 1");
    assert!(!g.lpi_pending(lpi(5), 0));
}
