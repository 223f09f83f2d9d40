//! Host tests of the vGIC model.

use super::lr::encode_lr;
use super::regs::*;
use super::*;
use crate::intid::IntId;
use alloc::format;
use alloc::vec;

const GICD: u64 = 0x0800_0000;
const GICR: u64 = 0x080A_0000;

fn cfg(n: usize, nr_spis: u32) -> VgicConfig {
    VgicConfig {
        gicd_base: GICD,
        gicr_base: GICR,
        nr_spis,
        vcpu_mpidrs: (0..n as u64).map(|i| 0x8000_0000 | i).collect(),
        lpis: false,
    }
}

/// A raw INTID the test knows is valid.
fn id(v: u32) -> IntId {
    IntId::try_from(v).unwrap()
}

fn rd(v: usize) -> u64 {
    GICR + v as u64 * GICR_STRIDE
}
fn sgi(v: usize) -> u64 {
    rd(v) + SGI_FRAME
}

fn r32(g: &mut Vgic, a: u64) -> u64 {
    g.mmio_read(0, a, 4).unwrap()
}
fn w32(g: &mut Vgic, a: u64, v: u64) -> Kicks {
    g.mmio_write(0, a, 4, v).unwrap()
}

/// A booted guest: distributor enabled, every interrupt Group 1.
fn booted(n: usize, nr_spis: u32) -> Vgic {
    let mut g = Vgic::new(cfg(n, nr_spis));
    w32(&mut g, GICD + GICD_CTLR, 0x13);
    for v in 0..n {
        w32(&mut g, sgi(v) + IGROUPR, 0xFFFF_FFFF);
    }
    g
}

fn enable(g: &mut Vgic, vcpu: usize, intid: u32) {
    let a = if intid < 32 { sgi(vcpu) + ISENABLER } else { GICD + ISENABLER + u64::from(intid / 32) * 4 };
    g.mmio_write(vcpu, a, 4, 1 << (intid % 32)).unwrap();
}

fn set_prio(g: &mut Vgic, vcpu: usize, intid: u32, p: u8) {
    let a = if intid < 32 { sgi(vcpu) + IPRIORITYR + u64::from(intid) } else { GICD + IPRIORITYR + u64::from(intid) };
    g.mmio_write(vcpu, a, 1, u64::from(p)).unwrap();
}

fn set_irouter(g: &mut Vgic, intid: u32, val: u64) -> Kicks {
    g.mmio_write(0, GICD + GICD_IROUTER + 8 * u64::from(intid), 8, val).unwrap()
}

fn lr_intid(v: u64) -> u32 {
    (v & LR_VINTID_MASK) as u32
}

#[test]
fn distributor_reset_values() {
    let mut g = Vgic::new(cfg(4, 64));
    let typer = r32(&mut g, GICD + GICD_TYPER) as u32;
    assert_eq!(typer & 0x1F, 2, "ITLinesNumber for 96 INTIDs");
    assert_eq!((typer >> 5) & 7, 3, "CPUNumber");
    assert_eq!((typer >> 19) & 0x1F, 9, "IDbits");
    assert_eq!(typer & (1 << 16 | 1 << 17), 0, "no MBIS/LPIS");
    assert_ne!(typer & (1 << 26), 0, "RSS");
    let ctlr = r32(&mut g, GICD + GICD_CTLR) as u32;
    assert_eq!(ctlr, CTLR_ARE | CTLR_DS);
    assert_eq!(r32(&mut g, GICD + GICD_IIDR) as u32, IIDR_VALUE);
    assert_eq!(r32(&mut g, GICD + GICD_TYPER2), 0);
    assert_eq!(r32(&mut g, GICD + GICD_STATUSR), 0);
    let pidr2 = r32(&mut g, GICD + 0xFFE8);
    assert_eq!((pidr2 >> 4) & 0xF, 3, "ArchRev");
    assert_eq!(r32(&mut g, GICD + 0xFFF0), 0x0D);
    assert_eq!(r32(&mut g, GICD + 0xFFFC), 0xB1);
    // Maximum SPI count: ITLinesNumber 31.
    let mut big = Vgic::new(cfg(1, 2000));
    assert_eq!(big.nr_spis(), 988);
    assert_eq!(r32(&mut big, GICD + GICD_TYPER) & 0x1F, 31);
    // Rounding.
    assert_eq!(Vgic::new(cfg(1, 33)).nr_spis(), 64);
    assert!(Vgic::try_new(cfg(1, 2000)).is_err());
    assert!(Vgic::try_new(cfg(0, 32)).is_err());
    assert!(Vgic::try_new(cfg(2, 32)).is_ok());
}

#[test]
fn ctlr_are_rao_wi_and_enables() {
    let mut g = Vgic::new(cfg(1, 32));
    w32(&mut g, GICD + GICD_CTLR, 0xFFFF_FFFF);
    assert_eq!(r32(&mut g, GICD + GICD_CTLR) as u32, 0x53);
    w32(&mut g, GICD + GICD_CTLR, 0);
    assert_eq!(r32(&mut g, GICD + GICD_CTLR) as u32, CTLR_ARE | CTLR_DS);
}

#[test]
fn redistributor_typer_and_ids() {
    let mut g = Vgic::new(VgicConfig {
        gicd_base: GICD,
        gicr_base: GICR,
        nr_spis: 32,
        vcpu_mpidrs: vec![0x8000_0000, 0x01_8001_0203, 0x0000_0100],
        lpis: false,
    });
    for v in 0..3 {
        let t = g.mmio_read(0, rd(v) + GICR_TYPER, 8).unwrap();
        assert_eq!((t >> 8) & 0xFFFF, v as u64, "Processor_Number");
        assert_eq!(t & GICR_TYPER_LAST != 0, v == 2, "Last");
        assert_eq!(t & 1, 0, "no PLPIS");
        let lo = g.mmio_read(0, rd(v) + GICR_TYPER, 4).unwrap();
        let hi = g.mmio_read(0, rd(v) + GICR_TYPER + 4, 4).unwrap();
        assert_eq!(hi << 32 | lo, t);
    }
    assert_eq!(g.mmio_read(0, rd(0) + GICR_TYPER, 8).unwrap() >> 32, 0);
    assert_eq!(g.mmio_read(0, rd(1) + GICR_TYPER, 8).unwrap() >> 32, 0x0101_0203);
    assert_eq!(g.mmio_read(0, rd(2) + GICR_TYPER, 8).unwrap() >> 32, 0x0000_0100);
    assert_eq!((r32(&mut g, rd(1) + 0xFFE8) >> 4) & 0xF, 3);
    assert_eq!(r32(&mut g, rd(1) + GICR_IIDR) as u32, IIDR_VALUE);
    // LPI registers RAZ/WI.
    g.mmio_write(0, rd(0) + GICR_PROPBASER, 8, u64::MAX).unwrap();
    assert_eq!(g.mmio_read(0, rd(0) + GICR_PROPBASER, 8).unwrap(), 0);
    assert_eq!(g.mmio_read(0, rd(0) + GICR_PENDBASER, 8).unwrap(), 0);
    w32(&mut g, rd(0) + GICR_CTLR, 1);
    assert_eq!(r32(&mut g, rd(0) + GICR_CTLR), 0);
    // TYPER is read-only.
    g.mmio_write(0, rd(0) + GICR_TYPER, 8, u64::MAX).unwrap();
    assert_eq!(g.mmio_read(0, rd(0) + GICR_TYPER, 8).unwrap() >> 32, 0);
}

#[test]
fn decode_windows() {
    let g = Vgic::new(cfg(2, 32));
    assert_eq!(g.decode(GICD + 0x104), Some((MmioTarget::Distributor, 0x104)));
    assert_eq!(g.decode(GICD + 0x1_0000), None);
    assert_eq!(g.decode(GICR + 0x2_0014), Some((MmioTarget::Redistributor(1), 0x14)));
    assert_eq!(g.decode(GICR + 0x3_0100), Some((MmioTarget::Redistributor(1), 0x1_0100)));
    assert_eq!(g.decode(GICR + 0x4_0000), None);
    assert_eq!(g.decode(0), None);
    // `frames` names exactly what `decode` answers.
    assert_eq!(g.frames(), [(GICD, 0x1_0000), (GICR, 0x4_0000)]);
    for (base, size) in g.frames() {
        assert!(g.decode(base).is_some() && g.decode(base + size - 1).is_some());
        assert_eq!(g.decode(base + size), None);
    }
    assert_eq!(g.mmio_read(0, 0x1234, 4), Err(VgicError::OutOfRange));
    assert_eq!(g.mmio_read(7, GICD, 4), Err(VgicError::BadVcpu(7)));
}

#[test]
fn waker_is_raz_wi() {
    let mut g = Vgic::new(cfg(2, 32));
    assert_eq!(r32(&mut g, rd(1) + GICR_WAKER), 0, "awake at reset");
    let k = w32(&mut g, rd(1) + GICR_WAKER, u64::from(WAKER_PROCESSOR_SLEEP));
    assert!(k.is_empty());
    assert_eq!(r32(&mut g, rd(1) + GICR_WAKER), 0, "ProcessorSleep = 1 ignored");
    w32(&mut g, rd(1) + GICR_WAKER, u64::from(WAKER_PROCESSOR_SLEEP | WAKER_CHILDREN_ASLEEP));
    assert_eq!(r32(&mut g, rd(1) + GICR_WAKER), 0);
    assert_eq!(r32(&mut g, rd(0) + GICR_WAKER), 0);
    assert_eq!(g.mmio_write(0, rd(0) + GICR_WAKER, 2, 0), Err(VgicError::BadAccessSize));
}

/// A guest that never writes GICR_WAKER (only enables the distributor and
/// its interrupts) gets an SGI to itself, a targeted SGI, a broadcast SGI
/// and a PPI; writing ProcessorSleep = 1 later changes nothing.
#[test]
fn delivery_never_waits_for_waker() {
    let mut g = Vgic::new(cfg(3, 32));
    w32(&mut g, GICD + GICD_CTLR, 2);
    for v in 0..3 {
        g.mmio_write(v, sgi(v) + IGROUPR, 4, 0xFFFF_FFFF).unwrap();
        g.mmio_write(v, sgi(v) + ISENABLER, 4, 0xFFFF_FFFF).unwrap();
    }
    let delivered = |g: &mut Vgic, v: usize, intid: u32| -> bool {
        let mut lrs = [0u64; 4];
        let ok = g.has_deliverable(v) && g.flush_lrs(v, &mut lrs).filled == 1 && lr_intid(lrs[0]) == intid;
        // The guest acknowledges and deactivates it: the LR comes back empty.
        g.sync_lrs(v, &mut [0u64; 4]);
        ok
    };
    for round in 0..2 {
        // SGI 1 to self (vCPU 1: Aff0 = 1, TargetList bit 1).
        let k = g.send_sgi(1, 1 << 24 | 0b10).unwrap();
        assert_eq!(k.iter().collect::<Vec<_>>(), vec![1], "round {round}");
        assert!(delivered(&mut g, 1, 1), "self SGI, round {round}");
        // SGI 2 from vCPU 0 to vCPU 2.
        let k = g.send_sgi(0, 2 << 24 | 0b100).unwrap();
        assert_eq!(k.iter().collect::<Vec<_>>(), vec![2], "round {round}");
        assert!(delivered(&mut g, 2, 2), "targeted SGI, round {round}");
        // SGI 3 from vCPU 0 to all but self.
        let k = g.send_sgi(0, 3 << 24 | 1 << 40).unwrap();
        assert_eq!(k.iter().collect::<Vec<_>>(), vec![1, 2], "round {round}");
        assert!(delivered(&mut g, 1, 3) && delivered(&mut g, 2, 3), "broadcast SGI, round {round}");
        assert!(!g.has_deliverable(0), "the sender is left out");
        // PPI 27 on vCPU 0.
        let k = g.inject_edge(id(27), 0).unwrap();
        assert_eq!(k.iter().collect::<Vec<_>>(), vec![0], "round {round}");
        assert!(delivered(&mut g, 0, 27), "PPI, round {round}");
        for v in 0..3 {
            w32(&mut g, rd(v) + GICR_WAKER, u64::from(WAKER_PROCESSOR_SLEEP));
        }
    }
}

#[test]
fn enable_pending_active_round_trip() {
    let mut g = booted(2, 64);
    // SPIs in the distributor.
    w32(&mut g, GICD + ISENABLER + 4, 0x8000_0001);
    assert_eq!(r32(&mut g, GICD + ISENABLER + 4), 0x8000_0001);
    assert_eq!(r32(&mut g, GICD + ICENABLER + 4), 0x8000_0001);
    w32(&mut g, GICD + ICENABLER + 4, 1);
    assert_eq!(r32(&mut g, GICD + ISENABLER + 4), 0x8000_0000);
    w32(&mut g, GICD + ISPENDR + 8, 0x10);
    assert_eq!(r32(&mut g, GICD + ICPENDR + 8), 0x10);
    w32(&mut g, GICD + ICPENDR + 8, 0x10);
    assert_eq!(r32(&mut g, GICD + ISPENDR + 8), 0);
    w32(&mut g, GICD + ISACTIVER + 4, 0x4);
    assert_eq!(r32(&mut g, GICD + ICACTIVER + 4), 0x4);
    w32(&mut g, GICD + ICACTIVER + 4, 0x4);
    assert_eq!(r32(&mut g, GICD + ISACTIVER + 4), 0);
    // Private interrupts are banked per redistributor and RAZ/WI in GICD.
    w32(&mut g, GICD + ISENABLER, 0xFFFF_FFFF);
    assert_eq!(r32(&mut g, GICD + ISENABLER), 0);
    w32(&mut g, sgi(1) + ISENABLER, 0x0800_FFFF);
    assert_eq!(r32(&mut g, sgi(1) + ISENABLER), 0x0800_FFFF);
    assert_eq!(r32(&mut g, sgi(0) + ISENABLER), 0);
    w32(&mut g, sgi(1) + ICENABLER, 0xFFFF_0000);
    assert_eq!(r32(&mut g, sgi(1) + ISENABLER), 0xFFFF);
    // Beyond nr_irqs: RAZ/WI.
    w32(&mut g, GICD + ISENABLER + 12, 0xFFFF_FFFF);
    assert_eq!(r32(&mut g, GICD + ISENABLER + 12), 0);
    // Groups and group modifiers are stored.
    w32(&mut g, GICD + IGROUPR + 4, 0xFFFF_FFFF);
    assert_eq!(r32(&mut g, GICD + IGROUPR + 4), 0xFFFF_FFFF);
    w32(&mut g, GICD + IGRPMODR + 4, 0x5);
    assert_eq!(r32(&mut g, GICD + IGRPMODR + 4), 0x5);
    assert_eq!(r32(&mut g, sgi(1) + IGROUPR), 0xFFFF_FFFF);
}

#[test]
fn priority_byte_and_word_access() {
    let mut g = booted(1, 32);
    g.mmio_write(0, GICD + IPRIORITYR + 33, 1, 0xA0).unwrap();
    assert_eq!(g.mmio_read(0, GICD + IPRIORITYR + 33, 1).unwrap(), 0xA0);
    assert_eq!(r32(&mut g, GICD + IPRIORITYR + 32), 0xA000);
    w32(&mut g, GICD + IPRIORITYR + 36, 0x1122_3344);
    assert_eq!(g.mmio_read(0, GICD + IPRIORITYR + 38, 1).unwrap(), 0x22);
    // SGI/PPI priorities in the SGI frame; RAZ/WI in GICD.
    w32(&mut g, sgi(0) + IPRIORITYR + 4, 0x8070_6050);
    assert_eq!(g.mmio_read(0, sgi(0) + IPRIORITYR + 7, 1).unwrap(), 0x80);
    w32(&mut g, GICD + IPRIORITYR, 0xFFFF_FFFF);
    assert_eq!(r32(&mut g, GICD + IPRIORITYR), 0);
    // Halfword access to IPRIORITYR is not allowed.
    assert_eq!(g.mmio_read(0, GICD + IPRIORITYR + 32, 2), Err(VgicError::BadAccessSize));
    // SPIs beyond nr_irqs: RAZ/WI.
    g.mmio_write(0, GICD + IPRIORITYR + 100, 1, 0xFF).unwrap();
    assert_eq!(g.mmio_read(0, GICD + IPRIORITYR + 100, 1).unwrap(), 0);
}

#[test]
fn icfgr() {
    let mut g = booted(1, 32);
    // SGIs always edge, read-only.
    assert_eq!(r32(&mut g, sgi(0) + ICFGR) as u32, 0xAAAA_AAAA);
    w32(&mut g, sgi(0) + ICFGR, 0);
    assert_eq!(r32(&mut g, sgi(0) + ICFGR) as u32, 0xAAAA_AAAA);
    // PPIs configurable, level at reset; low bits RES0.
    assert_eq!(r32(&mut g, sgi(0) + ICFGR + 4), 0);
    w32(&mut g, sgi(0) + ICFGR + 4, 0xFFFF_FFFF);
    assert_eq!(r32(&mut g, sgi(0) + ICFGR + 4) as u32, 0xAAAA_AAAA);
    // SPIs in GICD; GICD ICFGR0/1 RAZ/WI.
    w32(&mut g, GICD + ICFGR + 8, 0x0000_0003);
    assert_eq!(r32(&mut g, GICD + ICFGR + 8), 0x2);
    assert_eq!(r32(&mut g, GICD + ICFGR), 0);
}

#[test]
fn irouter_64_and_halves() {
    let mut g = booted(2, 64);
    let a = GICD + GICD_IROUTER + 8 * 40;
    g.mmio_write(0, a, 8, 0xFFFF_FFFF_FFFF_FFFF).unwrap();
    // RES0 bits dropped: only IRM, Aff3, Aff2..Aff0 remain.
    assert_eq!(g.mmio_read(0, a, 8).unwrap(), 0xFF_80FF_FFFF);
    g.mmio_write(0, a, 4, 0x0000_0001).unwrap();
    assert_eq!(g.mmio_read(0, a, 8).unwrap(), 0xFF_0000_0001);
    g.mmio_write(0, a + 4, 4, 0).unwrap();
    assert_eq!(g.mmio_read(0, a, 8).unwrap(), 1);
    assert_eq!(g.mmio_read(0, a, 4).unwrap(), 1);
    assert_eq!(g.mmio_read(0, a + 4, 4).unwrap(), 0);
    assert_eq!(g.route_of(id(40)), Some(1));
    // IROUTER for private INTIDs and beyond nr_irqs: RAZ/WI.
    g.mmio_write(0, GICD + GICD_IROUTER + 8 * 5, 8, 1).unwrap();
    assert_eq!(g.mmio_read(0, GICD + GICD_IROUTER + 8 * 5, 8).unwrap(), 0);
    g.mmio_write(0, GICD + GICD_IROUTER + 8 * 200, 8, 1).unwrap();
    assert_eq!(g.mmio_read(0, GICD + GICD_IROUTER + 8 * 200, 8).unwrap(), 0);
    // Byte access to IROUTER is an error.
    assert_eq!(g.mmio_read(0, a, 1), Err(VgicError::BadAccessSize));
}

#[test]
fn bad_sizes_and_reserved_offsets() {
    let mut g = booted(1, 32);
    // 64-bit access to 32-bit registers.
    assert_eq!(g.mmio_read(0, GICD + GICD_CTLR, 8), Err(VgicError::BadAccessSize));
    assert_eq!(g.mmio_write(0, GICD + ISENABLER + 4, 8, 0), Err(VgicError::BadAccessSize));
    assert_eq!(g.mmio_read(0, GICD + ISENABLER + 4, 1), Err(VgicError::BadAccessSize));
    assert_eq!(g.mmio_read(0, rd(0) + GICR_WAKER, 2), Err(VgicError::BadAccessSize));
    // Odd sizes and misalignment.
    assert_eq!(g.mmio_read(0, GICD + GICD_CTLR, 3), Err(VgicError::BadAccessSize));
    assert_eq!(g.mmio_read(0, GICD + GICD_CTLR, 0), Err(VgicError::BadAccessSize));
    assert_eq!(g.mmio_read(0, GICD + 0x102, 4), Err(VgicError::BadAccessSize));
    assert_eq!(g.mmio_read(0, GICD + GICD_IROUTER + 8 * 33 + 4, 8), Err(VgicError::BadAccessSize));
    // Reserved offsets: RAZ/WI.
    for off in [0x0014u64, 0x0040, 0x0800, 0x0E00, 0x0F00, 0x0F10, 0x5000, 0x8000, 0xC000] {
        g.mmio_write(0, GICD + off, 4, 0xFFFF_FFFF).unwrap();
        assert_eq!(g.mmio_read(0, GICD + off, 4).unwrap(), 0, "GICD {off:#x}");
    }
    for off in [0x0020u64, 0x0100, 0x8000, 0x1_0004, 0x1_0E00, 0x1_0C08, 0x1_0084, 0x1_0420, 0x1_FFE8] {
        g.mmio_write(0, rd(0) + off, 4, 0xFFFF_FFFF).unwrap();
        assert_eq!(g.mmio_read(0, rd(0) + off, 4).unwrap(), 0, "GICR {off:#x}");
    }
    // Read-only registers ignore writes.
    let typer = r32(&mut g, GICD + GICD_TYPER);
    w32(&mut g, GICD + GICD_TYPER, 0);
    assert_eq!(r32(&mut g, GICD + GICD_TYPER), typer);
    w32(&mut g, GICD + GICD_IIDR, 0);
    assert_eq!(r32(&mut g, GICD + GICD_IIDR) as u32, IIDR_VALUE);
}

#[test]
fn sgi_targeting() {
    let mpidrs = vec![0x8000_0000, 0x8000_0001, 0x8000_0100, 0x8000_0011, 0x8001_0000_0000];
    let mut g =
        Vgic::new(VgicConfig { gicd_base: GICD, gicr_base: GICR, nr_spis: 32, vcpu_mpidrs: mpidrs, lpis: false });
    w32(&mut g, GICD + GICD_CTLR, 2);
    for v in 0..5 {
        g.mmio_write(v, sgi(v) + ISENABLER, 4, 0xFFFF).unwrap();
    }
    let pend = |g: &mut Vgic, v: usize| g.mmio_read(0, sgi(v) + ISPENDR, 4).unwrap();
    // List: Aff1 = 0, targets Aff0 0 and 1, SGI 3.
    let k = g.send_sgi(0, 3 << 24 | 0b11).unwrap();
    assert_eq!(k.iter().collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(pend(&mut g, 0), 1 << 3);
    assert_eq!(pend(&mut g, 1), 1 << 3);
    assert_eq!(pend(&mut g, 2), 0);
    // Aff1 = 1, Aff0 = 0.
    let k = g.send_sgi(0, 5 << 24 | 1 << 16 | 1).unwrap();
    assert_eq!(k.iter().collect::<Vec<_>>(), vec![2]);
    // RS = 1 selects Aff0 16..31: Aff0 = 0x11 is bit 1.
    let k = g.send_sgi(0, 6 << 24 | 1 << 44 | 0b10).unwrap();
    assert_eq!(k.iter().collect::<Vec<_>>(), vec![3]);
    assert_eq!(pend(&mut g, 3), 1 << 6);
    assert_eq!(pend(&mut g, 1) & (1 << 6), 0);
    // Aff3 = 1.
    let k = g.send_sgi(0, 7 << 24 | 1 << 48 | 1).unwrap();
    assert_eq!(k.iter().collect::<Vec<_>>(), vec![4]);
    // IRM broadcast excludes the sender.
    let k = g.send_sgi(2, 9 << 24 | 1 << 40).unwrap();
    assert_eq!(k.iter().collect::<Vec<_>>(), vec![0, 1, 3, 4]);
    assert_eq!(pend(&mut g, 2) & (1 << 9), 0);
    assert_ne!(pend(&mut g, 4) & (1 << 9), 0);
    assert_eq!(g.send_sgi(9, 0), Err(VgicError::BadVcpu(9)));
}

#[test]
fn spi_routing_follows_irouter() {
    let mut g = booted(3, 32);
    enable(&mut g, 0, 40);
    assert_eq!(g.route_of(id(40)), Some(0), "IROUTER resets to 0 = vCPU 0's affinity");
    let k = set_irouter(&mut g, 40, 2);
    assert!(k.is_empty());
    assert_eq!(g.route_of(id(40)), Some(2));
    let k = g.inject_edge(id(40), 0).unwrap();
    assert_eq!(k.iter().collect::<Vec<_>>(), vec![2]);
    assert!(g.has_deliverable(2));
    assert!(!g.has_deliverable(0));
    let mut lrs = [0u64; 4];
    assert_eq!(g.flush_lrs(0, &mut lrs).filled, 0);
    assert_eq!(g.flush_lrs(2, &mut lrs).filled, 1);
    assert_eq!(lr_intid(lrs[0]), 40);
    // Re-route while pending in vCPU 2's LR: stays there until it syncs.
    set_irouter(&mut g, 40, 1);
    let mut lrs1 = [0u64; 4];
    assert_eq!(g.flush_lrs(1, &mut lrs1).filled, 0, "never in two vCPUs' LRs");
    let k = g.sync_lrs(2, &mut lrs);
    assert_eq!(k.iter().collect::<Vec<_>>(), vec![1]);
    assert_eq!(lrs[0], 0);
    assert_eq!(g.flush_lrs(1, &mut lrs1).filled, 1);
    // IRM = 1: vCPU 0, whatever its GICR_WAKER says.
    set_irouter(&mut g, 41, IROUTER_IRM);
    assert_eq!(g.route_of(id(41)), Some(0));
    w32(&mut g, rd(0) + GICR_WAKER, u64::from(WAKER_PROCESSOR_SLEEP));
    assert_eq!(g.route_of(id(41)), Some(0));
    // No matching affinity: undeliverable.
    set_irouter(&mut g, 42, 0x55);
    assert_eq!(g.route_of(id(42)), None);
    assert_eq!(g.route_of(id(5)), None);
    assert_eq!(g.route_of(id(5000)), None);
}

#[test]
fn distributor_enable_gates_delivery() {
    let mut g = booted(1, 32);
    w32(&mut g, GICD + GICD_CTLR, 0x10);
    enable(&mut g, 0, 33);
    let k = g.inject_edge(id(33), 0).unwrap();
    assert!(k.is_empty());
    assert!(!g.has_deliverable(0));
    let mut lrs = [0u64; 4];
    assert_eq!(g.flush_lrs(0, &mut lrs).filled, 0);
    let k = w32(&mut g, GICD + GICD_CTLR, 0x12);
    assert!(k.contains(0));
    assert!(g.has_deliverable(0));
}

/// A CPU with 16 LRs gets at most four interrupts per flush (the
/// candidates one flush keeps); the rest are reported as overflow and come
/// at the next entries, highest priority first.
#[test]
fn sixteen_lrs_take_four_per_flush_and_the_rest_next() {
    let mut g = booted(1, 64);
    for intid in 32..44u32 {
        enable(&mut g, 0, intid);
        set_prio(&mut g, 0, intid, 0x80 - (intid as u8 - 32) * 8);
        g.inject_edge(id(intid), 0).unwrap();
    }
    let mut lrs = [0u64; 16];
    let mut want: Vec<u32> = (32..44).rev().collect();
    for round in 0..3 {
        let r = g.flush_lrs(0, &mut lrs);
        assert_eq!((r.filled, r.overflow), (4, round < 2), "round {round}");
        let got: Vec<u32> = lrs[round * 4..round * 4 + 4].iter().map(|&v| lr_intid(v)).collect();
        assert_eq!(got, want.drain(..4).collect::<Vec<u32>>(), "round {round}: the four of highest priority left");
        assert!(lrs[round * 4 + 4..].iter().all(|&v| v == 0));
    }
}

#[test]
fn flush_by_priority_with_overflow() {
    let mut g = booted(1, 64);
    for (intid, prio) in [(40u32, 0xA0u8), (41, 0x20), (42, 0x80), (43, 0x20), (20, 0x10), (3, 0xF0)] {
        enable(&mut g, 0, intid);
        set_prio(&mut g, 0, intid, prio);
        g.inject_edge(id(intid), 0).unwrap();
    }
    let mut lrs = [0u64; 4];
    let r = g.flush_lrs(0, &mut lrs);
    assert_eq!(r.filled, 4);
    assert!(r.overflow);
    assert_eq!(r.used_mask, 0xF);
    let got: Vec<u32> = lrs.iter().map(|&v| lr_intid(v)).collect();
    assert_eq!(got, vec![20, 41, 43, 42]);
    for &v in &lrs {
        assert_eq!(v & LR_STATE_MASK, LR_PENDING);
        assert_ne!(v & LR_GROUP1, 0);
        assert_eq!(v & LR_HW, 0);
    }
    assert_eq!((lrs[0] >> 48) & 0xFF, 0x10);
    // Guest handles all four (deactivated: state 0); the rest come next.
    for v in lrs.iter_mut() {
        *v &= !LR_STATE_MASK;
    }
    g.sync_lrs(0, &mut lrs);
    assert_eq!(lrs, [0; 4]);
    let r = g.flush_lrs(0, &mut lrs);
    assert_eq!(r.filled, 2);
    assert!(!r.overflow);
    assert_eq!(lr_intid(lrs[0]), 40);
    assert_eq!(lr_intid(lrs[1]), 3);
    // LRs the caller holds non-empty are not touched, and shadowed slots are skipped.
    let mut g2 = booted(1, 32);
    enable(&mut g2, 0, 33);
    g2.inject_edge(id(33), 0).unwrap();
    let mut lrs = [LR_PENDING | 99, 0];
    let r = g2.flush_lrs(0, &mut lrs);
    assert_eq!(r.filled, 1);
    assert_eq!(lrs[0], LR_PENDING | 99);
    assert_eq!(lr_intid(lrs[1]), 33);
    // Flushing again without a sync does not duplicate.
    let r = g2.flush_lrs(0, &mut lrs);
    assert_eq!(r.filled, 0);
}

#[test]
fn active_first_and_pending_active() {
    let mut g = booted(1, 32);
    enable(&mut g, 0, 33);
    enable(&mut g, 0, 34);
    set_prio(&mut g, 0, 33, 0xF0);
    set_prio(&mut g, 0, 34, 0x00);
    g.inject_edge(id(33), 0).unwrap();
    let mut lrs = [0u64; 1];
    g.flush_lrs(0, &mut lrs);
    // Guest acknowledges 33: LR becomes active.
    lrs[0] = (lrs[0] & !LR_STATE_MASK) | LR_ACTIVE;
    g.sync_lrs(0, &mut lrs);
    // A higher-priority interrupt arrives, but the active one must go back in.
    g.inject_edge(id(34), 0).unwrap();
    let r = g.flush_lrs(0, &mut lrs);
    assert!(r.overflow);
    assert_eq!(lr_intid(lrs[0]), 33);
    assert_eq!(lrs[0] & LR_STATE_MASK, LR_ACTIVE);
    // Edge pending again while active (and in flight): owner is kicked, then P+A.
    let k = g.inject_edge(id(33), 0).unwrap();
    assert!(k.contains(0));
    g.sync_lrs(0, &mut lrs);
    let mut lrs = [0u64; 2];
    g.flush_lrs(0, &mut lrs);
    assert_eq!(lr_intid(lrs[0]), 33);
    assert_eq!(lrs[0] & LR_STATE_MASK, LR_PENDING | LR_ACTIVE);
    assert_eq!(lr_intid(lrs[1]), 34);
    // Active interrupts are not "deliverable" for WFI purposes.
    g.sync_lrs(0, &mut lrs);
    assert!(g.has_deliverable(0));
    w32(&mut g, GICD + ICPENDR + 4, 1 << 2); // 34
    w32(&mut g, GICD + ICPENDR + 4, 1 << 1); // 33 (still active)
    assert!(!g.has_deliverable(0));
}

#[test]
fn watched_active_interrupts_get_eoi_maintenance() {
    let mut g = booted(1, 32);
    enable(&mut g, 0, 34);
    w32(&mut g, GICD + ICFGR + 8, 0b10 << 4); // 34 edge
    g.inject_edge(id(34), 0).unwrap();
    let mut lrs = [0u64; 4];
    g.flush_lrs(0, &mut lrs);
    assert_eq!(lrs[0] & LR_EOI, 0, "an edge interrupt needs no EOI maintenance");
    // The guest acknowledged it; its handler is running when it exits.
    lrs[0] = (lrs[0] & !LR_STATE_MASK) | LR_ACTIVE;
    g.sync_lrs(0, &mut lrs);
    g.watch_active_eoi(0, true);
    assert!(g.flush_lrs(0, &mut lrs).eoi_maintenance);
    assert_eq!(lrs[0] & LR_STATE_MASK, LR_ACTIVE);
    assert_ne!(lrs[0] & LR_EOI, 0, "its deactivation is an exit now");
    // A pending (not yet acknowledged) interrupt is not watched.
    g.inject_edge(id(34), 0).unwrap();
    g.sync_lrs(0, &mut lrs);
    g.flush_lrs(0, &mut lrs);
    assert_eq!(lrs[0] & LR_STATE_MASK, LR_PENDING | LR_ACTIVE);
    lrs[0] = (lrs[0] & !LR_STATE_MASK) | LR_PENDING; // the active one deactivated
    g.sync_lrs(0, &mut lrs);
    g.flush_lrs(0, &mut lrs);
    assert_eq!(lrs[0] & LR_STATE_MASK, LR_PENDING);
    assert_eq!(lrs[0] & LR_EOI, 0);
    // Off again: active interrupts go in as before.
    lrs[0] = (lrs[0] & !LR_STATE_MASK) | LR_ACTIVE;
    g.sync_lrs(0, &mut lrs);
    g.watch_active_eoi(0, false);
    g.flush_lrs(0, &mut lrs);
    assert_eq!(lrs[0] & (LR_STATE_MASK | LR_EOI), LR_ACTIVE);
}

#[test]
fn level_vs_edge_repend() {
    let mut g = booted(1, 32);
    enable(&mut g, 0, 33); // level (reset)
    enable(&mut g, 0, 34);
    w32(&mut g, GICD + ICFGR + 8, 0b10 << 4); // 34 edge
    let k = g.set_level(id(33), 0, true).unwrap();
    assert!(k.contains(0));
    g.inject_edge(id(34), 0).unwrap();
    let mut lrs = [0u64; 4];
    let r = g.flush_lrs(0, &mut lrs);
    assert!(r.eoi_maintenance);
    let (l33, l34) = if lr_intid(lrs[0]) == 33 { (0, 1) } else { (1, 0) };
    assert_ne!(lrs[l33] & LR_EOI, 0, "level SW irq requests EOI maintenance");
    assert_eq!(lrs[l34] & LR_EOI, 0);
    // Guest acks and deactivates both; the level line is still high.
    lrs[l33] &= !LR_STATE_MASK;
    lrs[l34] &= !LR_STATE_MASK;
    g.sync_lrs(0, &mut lrs);
    assert_eq!(r32(&mut g, GICD + ISPENDR + 4), 1 << 1, "level re-pends, edge does not");
    let r = g.flush_lrs(0, &mut lrs);
    assert_eq!(r.filled, 1);
    // Line goes low (device handled) before the guest acks: no longer pending.
    g.set_level(id(33), 0, false).unwrap();
    g.sync_lrs(0, &mut lrs);
    assert_eq!(r32(&mut g, GICD + ISPENDR + 4), 0);
    assert_eq!(g.flush_lrs(0, &mut lrs).filled, 0);
    // ISPENDR on a level interrupt latches until acknowledged.
    w32(&mut g, GICD + ISPENDR + 4, 1 << 1);
    g.flush_lrs(0, &mut lrs);
    g.sync_lrs(0, &mut lrs); // not acked yet: still pending
    assert_eq!(r32(&mut g, GICD + ISPENDR + 4), 1 << 1);
    g.flush_lrs(0, &mut lrs);
    lrs[0] = (lrs[0] & !LR_STATE_MASK) | LR_ACTIVE; // acked: latch consumed
    g.sync_lrs(0, &mut lrs);
    assert_eq!(r32(&mut g, GICD + ISPENDR + 4), 0);
    assert_eq!(r32(&mut g, GICD + ISACTIVER + 4), 1 << 1);
    // Level line high while active: pending + active.
    g.set_level(id(33), 0, true).unwrap();
    g.flush_lrs(0, &mut lrs);
    assert_eq!(lrs[0] & LR_STATE_MASK, LR_PENDING | LR_ACTIVE);
    // Edge-configured source driven by set_level pends once per rising edge.
    g.sync_lrs(0, &mut lrs);
    g.set_level(id(34), 0, true).unwrap();
    g.set_level(id(34), 0, true).unwrap();
    assert_eq!(r32(&mut g, GICD + ISPENDR + 4) & (1 << 2), 1 << 2);
    assert_eq!(g.set_level(id(3), 0, true), Err(VgicError::BadIntid(id(3))));
    assert_eq!(g.set_level(id(64), 0, true), Err(VgicError::BadIntid(id(64))));
    assert_eq!(g.set_level(id(20), 5, true), Err(VgicError::BadVcpu(5)));
}

#[test]
fn hw_lr_encoding_and_sync() {
    let mut g = booted(2, 32);
    g.set_hw(id(40), Some(id(72))).unwrap();
    g.set_hw_private(1, id(27), Some(id(27))).unwrap();
    assert_eq!(g.hw_of(0, id(40)), Some(id(72)));
    assert_eq!(g.hw_of(1, id(27)), Some(id(27)));
    assert_eq!(g.hw_of(0, id(27)), None);
    assert_eq!(g.set_hw(id(20), Some(id(20))), Err(VgicError::BadIntid(id(20))));
    assert_eq!(g.set_hw(id(40), Some(id(1020))), Err(VgicError::BadIntid(id(1020))));
    enable(&mut g, 0, 40);
    enable(&mut g, 1, 27);
    set_prio(&mut g, 0, 40, 0xA0);
    g.inject_edge(id(40), 0).unwrap();
    g.set_level(id(27), 1, true).unwrap();
    let mut lrs = [0u64; 4];
    let r = g.flush_lrs(0, &mut lrs);
    assert!(!r.eoi_maintenance);
    assert_eq!(lrs[0], encode_lr(40, 0xA0, Some(72), false, true, false));
    assert_eq!(lrs[0], LR_PENDING | LR_HW | LR_GROUP1 | 0xA0 << 48 | 72 << 32 | 40);
    let mut l1 = [0u64; 4];
    g.flush_lrs(1, &mut l1);
    assert_eq!(l1[0] & (LR_HW | LR_PINTID_MASK << 32 | LR_VINTID_MASK), LR_HW | 27 << 32 | 27);
    assert_eq!(l1[0] & LR_EOI, 0);
    // Guest deactivated (physical deactivation done by hardware): done, never re-pended,
    // even though the model's line for the timer is still "high".
    lrs[0] &= !LR_STATE_MASK;
    l1[0] &= !LR_STATE_MASK;
    g.sync_lrs(0, &mut lrs);
    g.sync_lrs(1, &mut l1);
    assert_eq!(r32(&mut g, GICD + ISPENDR + 4), 0);
    assert_eq!(g.mmio_read(1, sgi(1) + ISPENDR, 4).unwrap(), 0);
    assert!(!g.has_deliverable(0) && !g.has_deliverable(1));
    // Active HW interrupt with a new pending: never P+A in the LR.
    g.inject_edge(id(40), 0).unwrap();
    g.flush_lrs(0, &mut lrs);
    lrs[0] = (lrs[0] & !LR_STATE_MASK) | LR_ACTIVE;
    g.sync_lrs(0, &mut lrs);
    g.inject_edge(id(40), 0).unwrap();
    g.flush_lrs(0, &mut lrs);
    assert_eq!(lrs[0] & LR_STATE_MASK, LR_ACTIVE);
    lrs[0] &= !LR_STATE_MASK;
    g.sync_lrs(0, &mut lrs);
    g.flush_lrs(0, &mut lrs);
    assert_eq!(lrs[0] & LR_STATE_MASK, LR_PENDING);
    // Unmap.
    g.sync_lrs(0, &mut lrs);
    g.set_hw(id(40), None).unwrap();
    g.flush_lrs(0, &mut lrs);
    assert_eq!(lrs[0] & LR_HW, 0);
}

#[test]
fn clear_pending_and_active_while_in_flight() {
    let mut g = booted(2, 32);
    enable(&mut g, 0, 33);
    g.inject_edge(id(33), 0).unwrap();
    let mut lrs = [0u64; 2];
    g.flush_lrs(0, &mut lrs);
    assert_eq!(r32(&mut g, GICD + ISPENDR + 4), 1 << 1, "in-flight state visible");
    // vCPU 1 clears it while vCPU 0 runs with it in an LR.
    let k = g.mmio_write(1, GICD + ICPENDR + 4, 4, 1 << 1).unwrap();
    assert!(k.contains(0), "owner kicked to drop it from its LR");
    assert_eq!(r32(&mut g, GICD + ISPENDR + 4), 0);
    g.sync_lrs(0, &mut lrs); // LR still says pending: dropped
    assert_eq!(g.flush_lrs(0, &mut lrs).filled, 0);
    // Same for active.
    g.inject_edge(id(33), 0).unwrap();
    g.flush_lrs(0, &mut lrs);
    lrs[0] = (lrs[0] & !LR_STATE_MASK) | LR_ACTIVE;
    let k = g.mmio_write(1, GICD + ICACTIVER + 4, 4, 1 << 1).unwrap();
    assert!(k.contains(0));
    g.sync_lrs(0, &mut lrs);
    assert_eq!(r32(&mut g, GICD + ISACTIVER + 4), 0);
    // ISACTIVER while in flight.
    g.inject_edge(id(33), 0).unwrap();
    g.flush_lrs(0, &mut lrs);
    g.mmio_write(1, GICD + ISACTIVER + 4, 4, 1 << 1).unwrap();
    assert_eq!(r32(&mut g, GICD + ISACTIVER + 4), 1 << 1);
    lrs[0] &= !LR_STATE_MASK;
    g.sync_lrs(0, &mut lrs);
    assert_eq!(r32(&mut g, GICD + ISACTIVER + 4), 1 << 1);
}

#[test]
fn active_spi_stays_with_its_vcpu() {
    let mut g = booted(2, 32);
    enable(&mut g, 0, 33);
    g.inject_edge(id(33), 0).unwrap();
    let mut l0 = [0u64; 2];
    g.flush_lrs(0, &mut l0);
    l0[0] = (l0[0] & !LR_STATE_MASK) | LR_ACTIVE;
    g.sync_lrs(0, &mut l0);
    set_irouter(&mut g, 33, 1);
    g.inject_edge(id(33), 0).unwrap();
    let mut l1 = [0u64; 2];
    assert_eq!(g.flush_lrs(1, &mut l1).filled, 0);
    g.flush_lrs(0, &mut l0);
    assert_eq!(l0[0] & LR_STATE_MASK, LR_PENDING | LR_ACTIVE);
    // After deactivation the pending one goes to the new target.
    l0[0] = (l0[0] & !LR_STATE_MASK) | LR_PENDING;
    // (the guest would have deactivated; model P only, not acked)
    let k = g.sync_lrs(0, &mut l0);
    assert!(k.contains(1));
    assert_eq!(g.flush_lrs(1, &mut l1).filled, 1);
}

#[test]
fn kicks_from_enable_and_pending() {
    let mut g = booted(2, 32);
    set_irouter(&mut g, 35, 1);
    g.inject_edge(id(35), 0).unwrap();
    let k = w32(&mut g, GICD + ISENABLER + 4, 1 << 3);
    assert_eq!(k.iter().collect::<Vec<_>>(), vec![1]);
    let k = g.mmio_write(0, sgi(1) + ISPENDR, 4, 1 << 5).unwrap();
    assert!(k.is_empty(), "SGI 5 not enabled");
    let k = g.mmio_write(0, sgi(1) + ISENABLER, 4, 1 << 5).unwrap();
    assert_eq!(k.iter().collect::<Vec<_>>(), vec![1]);
}

#[test]
fn dump_is_readable() {
    let mut g = booted(1, 32);
    enable(&mut g, 0, 33);
    g.inject_edge(id(33), 0).unwrap();
    let s = format!("{}", g.dump(0));
    assert!(s.contains("irq   33"), "{s}");
    assert!(s.contains("EP-"), "{s}");
    let s = format!("{}", g.dump(9));
    assert!(s.contains("no vCPU"));
}

/// Tiny xorshift64 PRNG for the fuzz test.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn guest_writes_garbage_everywhere() {
    // From reset, and from a booted guest (so delivery paths are exercised).
    let (w, e, f) = fuzz(Vgic::new(cfg(3, 96)), 3, 0x9E37_79B9_7F4A_7C15);
    assert!(w > 10_000 && e > 1_000 && f > 100, "{w} {e} {f}");
    let mut g = booted(3, 96);
    for intid in 0..128 {
        enable(&mut g, intid as usize % 3, intid);
    }
    let (w, e, f) = fuzz(g, 3, 0x1234_5678_9ABC_DEF1);
    assert!(w > 10_000 && e > 1_000 && f > 2_000, "{w} {e} {f}");
    // With LPIs: the same traffic plus LPI injection (vgic/lpi_tests.rs
    // has the LPI-specific random test).
    let mut g = Vgic::new(VgicConfig { lpis: true, ..cfg(3, 96) });
    w32(&mut g, GICD + GICD_CTLR, 0x13);
    let (w, e, _) = fuzz(g, 3, 0x00DD_BA11_CAFE);
    assert!(w > 10_000 && e > 1_000, "{w} {e}");
}

/// Random guest accesses and interrupt traffic; returns (writes accepted,
/// accesses rejected, LRs filled). Panics only on a broken invariant.
fn fuzz(mut g: Vgic, n: usize, seed: u64) -> (u32, u32, usize) {
    let mut rng = Rng(seed);
    let mut lrs: Vec<[u64; 4]> = vec![[0; 4]; n];
    let (mut ok_writes, mut filled, mut errors) = (0u32, 0usize, 0u32);
    for _ in 0..200_000 {
        let vcpu = rng.below(n as u64 + 1) as usize; // sometimes invalid
        let size = [1u8, 2, 4, 8, 0, 3, 16][rng.below(7) as usize];
        let ipa = match rng.below(4) {
            0 => GICD + rng.below(0x1_0000),
            1 => GICR + rng.below(n as u64 * GICR_STRIDE + 0x100),
            2 => GICD + (rng.below(0x1000) & !3),
            _ => GICD + GICD_IROUTER + (rng.below(0x2000) & !3),
        };
        let value = rng.next();
        g.assert_spi_live_covers_busy_spis();
        g.assert_private_live_covers_busy();
        match rng.below(12) {
            0..=3 => {
                let _ = g.mmio_read(vcpu, ipa, size);
            }
            4..=7 => match g.mmio_write(vcpu, ipa, size, value) {
                Ok(_) => ok_writes += 1,
                Err(_) => errors += 1,
            },
            8 => {
                // 1024-1055 are no INTIDs: the type rejects them before the vGIC.
                let intid = IntId::try_from(rng.below(1100) as u32);
                let _ = match (rng.below(3), intid) {
                    (0, Ok(_)) if value & 6 == 0 => {
                        // An LPI (or an INTID just around the LPI range).
                        match IntId::try_from(LPI_BASE - 1 + rng.below(130) as u32) {
                            Ok(lpi) if value & 8 == 0 => g.inject_lpi(lpi, vcpu),
                            Ok(lpi) => g.set_lpi_config(lpi, value as u8 >> 4 | 1),
                            Err(_) => Ok(Kicks::none()),
                        }
                    }
                    (0, Ok(intid)) => g.set_level(intid, vcpu, value & 1 != 0),
                    (1, Ok(intid)) => g.inject_edge(intid, vcpu),
                    (0 | 1, Err(_)) => Ok(Kicks::none()),
                    _ => g.send_sgi(vcpu, value),
                };
            }
            9 => {
                if let Some(l) = lrs.get_mut(vcpu) {
                    filled += g.flush_lrs(vcpu, l).filled;
                } else {
                    g.flush_lrs(vcpu, &mut [0; 4]);
                }
            }
            10 => {
                if let Some(l) = lrs.get_mut(vcpu) {
                    // The guest moves LR state around arbitrarily.
                    for v in l.iter_mut() {
                        *v = (*v & !LR_STATE_MASK) | (value & LR_STATE_MASK);
                    }
                    g.sync_lrs(vcpu, l);
                } else {
                    g.sync_lrs(vcpu, &mut []);
                }
            }
            _ => {
                let intid = IntId::try_from(rng.below(1100) as u32);
                let p = (value & 1 != 0).then_some(IntId::try_from(rng.below(1100) as u32));
                if let Ok(intid) = intid {
                    let _ = match p {
                        None => g.set_hw_private(vcpu, intid, None),
                        Some(Ok(p)) => g.set_hw_private(vcpu, intid, Some(p)),
                        Some(Err(_)) => Ok(()),
                    };
                    let _ = g.route_of(intid);
                }
                let _ = g.has_deliverable(vcpu);
            }
        }
        // Invariant: an interrupt sits in at most one vCPU's LRs.
        let mut seen = [0u8; 128];
        for v in 0..n {
            for intid in g.lr_contents(v).into_iter().flatten().map(u32::from) {
                if (32..LPI_BASE).contains(&intid) {
                    let i = (intid - 32) as usize;
                    seen[i] += 1;
                    assert!(seen[i] <= 1, "SPI {intid} in two vCPUs' LRs");
                }
            }
        }
    }
    for v in 0..n {
        let _ = format!("{}", g.dump(v));
    }
    std::println!("fuzz: {ok_writes} writes ok, {errors} rejected, {filled} LRs filled");
    (ok_writes, errors, filled)
}

#[test]
fn one_list_register_is_rejected() {
    // With one LR an active interrupt and a pending one overflow, and the
    // overflow's underflow maintenance interrupt (UIE: at most one LR
    // valid) would fire on every entry: the guest could never run to
    // deactivate the active one.
    let mut g = booted(1, 32);
    enable(&mut g, 0, 33);
    enable(&mut g, 0, 34);
    g.inject_edge(id(33), 0).unwrap();
    let mut one = [0u64; 1];
    g.flush_lrs(0, &mut one);
    one[0] = (one[0] & !LR_STATE_MASK) | LR_ACTIVE;
    g.sync_lrs(0, &mut one);
    g.inject_edge(id(34), 0).unwrap();
    let r = g.flush_lrs(0, &mut one);
    let valid = one.iter().filter(|&&v| v & LR_STATE_MASK != 0).count();
    assert!(r.overflow && valid <= 1, "UIE would be asserted at entry");
    g.sync_lrs(0, &mut one);
    // Two LRs hold both: no overflow, no UIE.
    let mut two = [0u64; 2];
    let r = g.flush_lrs(0, &mut two);
    assert!(!r.overflow);
    assert_eq!(r.filled, 2);

    assert_eq!(usable_lrs(1), Err(VgicError::TooFewListRegisters(1)));
    assert_eq!(usable_lrs(0), Err(VgicError::TooFewListRegisters(0)));
    assert_eq!(usable_lrs(2), Ok(2));
    assert_eq!(usable_lrs(4), Ok(4));
    assert_eq!(usable_lrs(32), Ok(NUM_LRS_MAX));
    let msg = format!("{}", VgicError::TooFewListRegisters(1));
    assert!(msg.contains("1 list register") && msg.contains("at least 2"), "{msg}");
}

#[test]
fn active_priority_registers_follow_preemption_bits() {
    // ICH_VTR_EL2.PREbits [28:26] = preemption bits - 1.
    let vtr = |pre_bits: u64| ((pre_bits - 1) << 26) | (4 << 29) | 3;
    assert_eq!(active_priority_regs(vtr(5)), 1, "32 levels: AP<n>R0 only");
    assert_eq!(active_priority_regs(vtr(6)), 2, "64 levels: AP<n>R0-1");
    assert_eq!(active_priority_regs(vtr(7)), 4, "128 levels: AP<n>R0-3");
    // QEMU's GICv3 CPU interface: PREbits = 4 (5 bits), ListRegs = 3.
    assert_eq!(active_priority_regs(0x9000_0003), 1);
    // Other fields do not matter.
    assert_eq!(active_priority_regs(vtr(7) | 0xffff), 4);
}

/// A forwarded SPI 40 (physical 72) and the virtual timer PPI 27 of vCPU 1
/// (physical 27), both enabled.
fn hw_booted() -> Vgic {
    let mut g = booted(2, 32);
    g.set_hw(id(40), Some(id(72))).unwrap();
    g.set_hw_private(1, id(27), Some(id(27))).unwrap();
    enable(&mut g, 0, 40);
    enable(&mut g, 1, 27);
    g
}

fn hw_done(vcpu: usize, intid: u32, pintid: u32) -> HwDeactivation {
    HwDeactivation { vcpu, intid: id(intid), pintid: id(pintid) }
}

#[test]
fn icactiver_on_a_forwarded_interrupt_in_an_lr_deactivates_the_physical_one() {
    let mut g = hw_booted();
    g.inject_edge(id(40), 0).unwrap();
    let mut lrs = [0u64; 4];
    g.flush_lrs(0, &mut lrs);
    lrs[0] = (lrs[0] & !LR_STATE_MASK) | LR_ACTIVE; // the guest acked it
                                                    // Another vCPU clears its active state while it sits in vCPU 0's LR.
    g.mmio_write(1, GICD + ICACTIVER + 4, 4, 1 << 8).unwrap();
    assert!(g.take_hw_deactivations().is_empty(), "applied at sync, not before");
    g.sync_lrs(0, &mut lrs);
    assert_eq!(g.take_hw_deactivations(), vec![hw_done(0, 40, 72)]);
    assert!(g.take_hw_deactivations().is_empty(), "taken once");
    assert_eq!(g.flush_lrs(0, &mut lrs).filled, 0, "nothing left to show");
    // The device interrupts again (the physical one was deactivated): delivered.
    g.inject_edge(id(40), 0).unwrap();
    assert!(g.has_deliverable(0));
}

#[test]
fn icpendr_on_a_pending_forwarded_interrupt_deactivates_the_physical_one() {
    let mut g = hw_booted();
    // Pending in the model (not in an LR): reported by the write itself.
    g.inject_edge(id(40), 0).unwrap();
    g.mmio_write(0, GICD + ICPENDR + 4, 4, 1 << 8).unwrap();
    assert_eq!(g.take_hw_deactivations(), vec![hw_done(0, 40, 72)]);
    assert!(!g.has_deliverable(0));
    // Pending in an LR (the LR is dropped at sync): reported by sync.
    g.inject_edge(id(40), 0).unwrap();
    let mut lrs = [0u64; 4];
    g.flush_lrs(0, &mut lrs);
    assert_eq!(lrs[0] & LR_STATE_MASK, LR_PENDING);
    g.mmio_write(0, GICD + ICPENDR + 4, 4, 1 << 8).unwrap();
    assert!(g.take_hw_deactivations().is_empty());
    g.sync_lrs(0, &mut lrs);
    assert_eq!(g.take_hw_deactivations(), vec![hw_done(0, 40, 72)]);
}

#[test]
fn redistributor_icactiver0_on_the_virtual_timer_names_its_vcpu() {
    let mut g = hw_booted();
    // The timer fired for vCPU 1, which acked it; then it was saved.
    g.inject_edge(id(27), 1).unwrap();
    let mut lrs = [0u64; 4];
    g.flush_lrs(1, &mut lrs);
    lrs[0] = (lrs[0] & !LR_STATE_MASK) | LR_ACTIVE;
    g.sync_lrs(1, &mut lrs);
    assert!(g.take_hw_deactivations().is_empty(), "still active: nothing to do");
    // vCPU 0 clears it through vCPU 1's redistributor.
    g.mmio_write(0, sgi(1) + ICACTIVER, 4, 1 << 27).unwrap();
    assert_eq!(g.take_hw_deactivations(), vec![hw_done(1, 27, 27)]);
    assert!(!g.is_pending_or_active(1, id(27)));
    // Same through GICR_ICPENDR0 while pending in vCPU 1's LR.
    g.inject_edge(id(27), 1).unwrap();
    g.flush_lrs(1, &mut lrs);
    g.mmio_write(1, sgi(1) + ICPENDR, 4, 1 << 27).unwrap();
    g.sync_lrs(1, &mut lrs);
    assert_eq!(g.take_hw_deactivations(), vec![hw_done(1, 27, 27)]);
}

#[test]
fn no_physical_deactivation_when_hardware_or_nothing_needs_it() {
    let mut g = hw_booted();
    let mut lrs = [0u64; 4];
    // The guest deactivated through the HW LR: the GIC did it already.
    g.inject_edge(id(40), 0).unwrap();
    g.flush_lrs(0, &mut lrs);
    lrs[0] &= !LR_STATE_MASK;
    g.sync_lrs(0, &mut lrs);
    // Clearing an idle forwarded interrupt, or a software one.
    g.mmio_write(0, GICD + ICACTIVER + 4, 4, 1 << 8).unwrap();
    g.mmio_write(0, GICD + ICPENDR + 4, 4, 1 << 8).unwrap();
    enable(&mut g, 0, 41);
    g.inject_edge(id(41), 0).unwrap();
    g.mmio_write(0, GICD + ICPENDR + 4, 4, 1 << 9).unwrap();
    // Active with a software re-pend (ISPENDR): clearing active leaves it
    // pending, so the physical one stays active until the guest's next EOI.
    g.inject_edge(id(40), 0).unwrap();
    g.flush_lrs(0, &mut lrs);
    lrs[0] = (lrs[0] & !LR_STATE_MASK) | LR_ACTIVE;
    g.sync_lrs(0, &mut lrs);
    g.mmio_write(0, GICD + ISPENDR + 4, 4, 1 << 8).unwrap();
    g.mmio_write(0, GICD + ICACTIVER + 4, 4, 1 << 8).unwrap();
    assert!(g.take_hw_deactivations().is_empty());
    assert!(g.has_deliverable(0));
}

/// The guest's GICD_ICFGR decides a forwarded SPI's trigger: a change is
/// reported once per SPI with the physical INTID (the last value wins), an
/// unchanged write or a software SPI reports nothing, and a forwarded PPI's
/// trigger (the virtual timer) stays the hypervisor's.
#[test]
fn icfgr_on_a_forwarded_spi_reports_the_physical_trigger() {
    let mut g = hw_booted();
    // ICFGR2 holds INTIDs 32-47: SPI 40 is bits [17:16], 41 bits [19:18].
    w32(&mut g, GICD + ICFGR + 8, (1 << 17) | (1 << 19));
    assert_eq!(g.take_hw_triggers(), vec![(id(72), true)]);
    assert!(g.take_hw_triggers().is_empty(), "taken once");
    w32(&mut g, GICD + ICFGR + 8, 1 << 17);
    assert!(g.take_hw_triggers().is_empty(), "no change for 40; 41 is not forwarded");
    w32(&mut g, GICD + ICFGR + 8, 0);
    w32(&mut g, GICD + ICFGR + 8, 1 << 17);
    w32(&mut g, GICD + ICFGR + 8, 0);
    assert_eq!(g.take_hw_triggers(), vec![(id(72), false)], "one entry, the last trigger");
    w32(&mut g, sgi(1) + ICFGR + 4, 0xFFFF_FFFF);
    assert!(g.take_hw_triggers().is_empty(), "PPI 27 is not reported");
}

#[test]
fn spi_enabled_follows_isenabler_and_icenabler() {
    let mut g = hw_booted();
    assert!(g.spi_enabled(id(40)));
    assert!(!g.spi_enabled(id(41)));
    enable(&mut g, 0, 41);
    assert!(g.spi_enabled(id(41)));
    g.mmio_write(0, GICD + ICENABLER + 4, 4, 1 << 8).unwrap();
    assert!(!g.spi_enabled(id(40)));
    // Private and out-of-range INTIDs are never "enabled SPIs".
    assert!(!g.spi_enabled(id(27)));
    assert!(!g.spi_enabled(id(1000)));
}

/// The virtual timer's output is a level: once the guest disables or masks
/// the timer (or moves CVAL to the future) before acknowledging its
/// interrupt, resampling the line ends the pending state (GICR_ISPENDR0
/// bit 27 reads 0 and nothing is left to deliver).
#[test]
fn a_low_timer_line_ends_a_pending_unacknowledged_vtimer() {
    let mut g = booted(2, 32);
    g.set_hw_private(1, id(27), Some(id(27))).unwrap();
    enable(&mut g, 1, 27);
    let pend = |g: &mut Vgic| g.mmio_read(1, sgi(1) + ISPENDR, 4).unwrap() & (1 << 27) != 0;
    // The timer fired while the vCPU was away; the line is still high.
    g.inject_edge(id(27), 1).unwrap();
    assert_eq!(g.resample_hw_private(1, id(27), true), Ok(false));
    assert!(pend(&mut g) && g.has_deliverable(1));
    // The guest disabled it before taking the interrupt: the line dropped.
    assert_eq!(g.resample_hw_private(1, id(27), false), Ok(true));
    assert!(!pend(&mut g), "ISPENDR0 bit 27 clear");
    assert_eq!(g.resample_hw_private(1, id(27), false), Ok(false), "nothing left to end");
    assert!(!g.is_pending_or_active(1, id(27)) && !g.has_deliverable(1));
    let mut lrs = [0u64; 4];
    assert_eq!(g.flush_lrs(1, &mut lrs).filled, 0);
    // It fires again: pending again, delivered.
    g.inject_edge(id(27), 1).unwrap();
    assert!(pend(&mut g));
    assert_eq!(g.flush_lrs(1, &mut lrs).filled, 1);
    assert_eq!(lr_intid(lrs[0]), 27);
    // While in the vCPU's list registers it is the hardware's: unchanged.
    assert_eq!(g.resample_hw_private(1, id(27), false), Ok(false));
    assert!(pend(&mut g));
    // Acknowledged (active): stays active, only a pending state would go.
    lrs[0] = (lrs[0] & !LR_STATE_MASK) | LR_ACTIVE;
    g.sync_lrs(1, &mut lrs);
    g.inject_edge(id(27), 1).unwrap();
    assert_eq!(g.resample_hw_private(1, id(27), false), Ok(true));
    assert!(!pend(&mut g));
    assert!(g.is_pending_or_active(1, id(27)), "still active");
    assert_ne!(g.mmio_read(1, sgi(1) + ISACTIVER, 4).unwrap() & (1 << 27), 0);
    // vCPU 0's timer is not forwarded: not a line the model resamples.
    assert_eq!(g.resample_hw_private(0, id(27), false), Err(VgicError::BadIntid(id(27))));
    assert_eq!(g.resample_hw_private(1, id(40), false), Err(VgicError::BadIntid(id(40))));
    assert_eq!(g.resample_hw_private(7, id(27), false), Err(VgicError::BadVcpu(7)));
    assert!(g.take_hw_deactivations().is_empty(), "the caller sets the physical state");
}

/// `route_gen` moves with every write that can move an SPI's physical
/// route (IROUTER, an SPI's enable) and with nothing else.
#[test]
fn route_gen_moves_with_spi_routes_and_enables_only() {
    let mut g = booted(2, 64);
    let g0 = g.route_gen();
    enable(&mut g, 0, 3);
    assert_eq!(g.route_gen(), g0, "a private interrupt's enable");
    set_prio(&mut g, 0, 40, 0x80);
    assert_eq!(g.route_gen(), g0, "a priority");
    enable(&mut g, 0, 40);
    let g1 = g.route_gen();
    assert_ne!(g1, g0, "an SPI's enable");
    let _ = set_irouter(&mut g, 40, 1);
    assert_ne!(g.route_gen(), g1, "an SPI's route");
}

/// One live private interrupt takes the short flush; it fills, reports and
/// leaves the model as ranking it would (pending, active, disabled, level
/// with EOI maintenance, no free LR, and found idle).
#[test]
fn single_private_flush_matches_ranked_flush() {
    // Each case: the setup, then the LRs as the entry finds them.
    type Setup = fn(&mut Vgic);
    let cases: [(&str, Setup, [u64; 4]); 6] = [
        ("pending SGI", |g| assert!(g.send_sgi(0, 3 << 24 | 0b10).is_ok()), [0; 4]),
        (
            "active SGI",
            |g| {
                assert!(g.send_sgi(0, 3 << 24 | 0b10).is_ok());
                let mut lrs = [0u64; 4];
                g.flush_lrs(1, &mut lrs);
                lrs[0] = lrs[0] & !LR_STATE_MASK | LR_ACTIVE;
                g.sync_lrs(1, &mut lrs);
            },
            [0; 4],
        ),
        ("disabled PPI", |g| assert!(g.set_level(id(20), 1, true).is_ok()), [0; 4]),
        (
            "level PPI",
            |g| {
                enable(g, 1, 20);
                assert!(g.set_level(id(20), 1, true).is_ok());
            },
            [0; 4],
        ),
        ("no free LR", |g| assert!(g.send_sgi(0, 3 << 24 | 0b10).is_ok()), [LR_PENDING; 4]),
        (
            "idle again",
            |g| {
                assert!(g.send_sgi(0, 3 << 24 | 0b10).is_ok());
                let mut lrs = [0u64; 4];
                g.flush_lrs(1, &mut lrs);
                lrs[0] &= !LR_STATE_MASK;
                g.sync_lrs(1, &mut lrs);
            },
            [0, LR_PENDING, 0, 0],
        ),
    ];
    for (what, setup, start) in cases {
        let (mut fast, mut ranked) = (booted(2, 32), booted(2, 32));
        for g in [&mut fast, &mut ranked] {
            enable(g, 1, 3);
            // Boot's writes leave everything live; a flush finds it idle.
            g.flush_lrs(1, &mut [0; 4]);
            setup(g);
        }
        assert!(fast.vcpus[1].private_live.is_power_of_two(), "{what}: one live private interrupt");
        let (mut a, mut b) = (start, start);
        let fa = fast.flush_lrs(1, &mut a);
        let fb = ranked.flush_ranked(1, &mut b);
        assert_eq!((fa, a), (fb, b), "{what}");
        assert_eq!(fast.vcpus[1].private_live, ranked.vcpus[1].private_live, "{what}");
        assert_eq!(fast.vcpus[1].lr_shadow, ranked.vcpus[1].lr_shadow, "{what}");
        assert_eq!(format!("{:?}", fast.vcpus[1].private), format!("{:?}", ranked.vcpus[1].private), "{what}");
    }
}

/// The switch-in of a forwarded PPI does in one lookup what a resample
/// and a look at its state do: the same answer, the same model after.
#[test]
fn load_hw_private_is_resample_then_state() {
    type Setup = fn(&mut Vgic);
    let cases: [(&str, Setup, bool); 6] = [
        ("idle, line low", |_| {}, false),
        ("pending, line dropped", |g| assert!(g.inject_edge(id(27), 1).is_ok()), false),
        ("pending, line still high", |g| assert!(g.inject_edge(id(27), 1).is_ok()), true),
        (
            "in an LR",
            |g| {
                assert!(g.inject_edge(id(27), 1).is_ok());
                g.flush_lrs(1, &mut [0; 4]);
            },
            false,
        ),
        (
            "active",
            |g| {
                assert!(g.inject_edge(id(27), 1).is_ok());
                let mut lrs = [0u64; 4];
                g.flush_lrs(1, &mut lrs);
                lrs[0] = lrs[0] & !LR_STATE_MASK | LR_ACTIVE;
                g.sync_lrs(1, &mut lrs);
            },
            false,
        ),
        ("not forwarded", |g| assert!(g.set_hw_private(1, id(27), None).is_ok()), false),
    ];
    for (what, setup, level) in cases {
        let (mut one, mut two) = (booted(2, 32), booted(2, 32));
        for g in [&mut one, &mut two] {
            g.set_hw_private(1, id(27), Some(id(27))).unwrap();
            enable(g, 1, 27);
            setup(g);
        }
        let busy = one.load_hw_private(1, id(27), level);
        let _ = two.resample_hw_private(1, id(27), level);
        assert_eq!(busy, two.is_pending_or_active(1, id(27)), "{what}");
        assert_eq!(one.vcpus[1].private_live, two.vcpus[1].private_live, "{what}");
        assert_eq!(format!("{:?}", one.vcpus[1].private[27]), format!("{:?}", two.vcpus[1].private[27]), "{what}");
    }
    assert!(!booted(2, 32).load_hw_private(1, id(40), false), "an SPI is not private");
}
