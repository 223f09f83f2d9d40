//! The run loop's decisions run against hv-arch-aarch64's fake CPU
//! interface: what reaches `ICH_LR<n>_EL2`, ICH_HCR_EL2 and ICC_SGI1R_EL1.

use super::pcpu::{self, PcpuShared, SGI_KICK};
use super::{lrs, wake};
use crate::arch::fake;
use crate::ids::DomainId;
use crate::intid::IntId;
use crate::sched::{DomainParams, RunState, Sched, SchedConfig, VcpuId, WakeAction, WakeCause};
use crate::vgic::regs::{GICD_CTLR, GICR_STRIDE, IGROUPR, ISENABLER, SGI_FRAME};
use crate::vgic::{Kicks, Vgic, VgicCell, VgicConfig};
use alloc::vec::Vec;
use core::sync::atomic::Ordering;

const GICD: u64 = 0x0800_0000;
const GICR: u64 = 0x080A_0000;
/// ICH_HCR_EL2.En and .UIE.
const HCR_EN: u64 = 1;
const HCR_UIE: u64 = 1 << 1;
/// `ICH_LR<n>_EL2`.State = pending, and the vINTID field.
const LR_PENDING: u64 = 1 << 62;
const LR_VINTID: u64 = 0xffff_ffff;

/// A booted guest's vGIC with `n` vCPUs: distributor on, every private
/// interrupt Group 1, SPIs `spis` enabled (all routed to vCPU 0).
fn vgic(n: usize, spis: &[u32]) -> VgicCell {
    let mut g = Vgic::new(VgicConfig {
        gicd_base: GICD,
        gicr_base: GICR,
        nr_spis: 64,
        vcpu_mpidrs: (0..n as u64).collect(),
        lpis: false,
    });
    g.mmio_write(0, GICD + GICD_CTLR, 4, 0x13).unwrap();
    for v in 0..n {
        g.mmio_write(v, GICR + v as u64 * GICR_STRIDE + SGI_FRAME + IGROUPR, 4, 0xffff_ffff).unwrap();
    }
    for &i in spis {
        g.mmio_write(0, GICD + IGROUPR + u64::from(i / 32) * 4, 4, 0xffff_ffff).unwrap();
        g.mmio_write(0, GICD + ISENABLER + u64::from(i / 32) * 4, 4, 1 << (i % 32)).unwrap();
    }
    VgicCell::new(g)
}

fn spi(g: &VgicCell, i: u32) -> Kicks {
    g.lock().inject_edge(IntId::try_from(i).unwrap(), 0).unwrap()
}

fn lr_writes() -> Vec<(&'static str, u64)> {
    fake::writes().into_iter().filter(|(r, _)| r.starts_with("ich_lr")).collect()
}

#[test]
fn an_entry_with_nothing_pending_and_clean_lrs_writes_no_list_register() {
    fake::reset();
    let g = vgic(1, &[]);
    let mut lrs = [0u64; 4];
    let l = lrs::load(&g, 0, &mut lrs, false);
    assert_eq!(l, lrs::Loaded { used: false, filled: 0 });
    assert_eq!(fake::writes(), [("ich_hcr_el2", HCR_EN)]);
}

#[test]
fn an_idle_vcpu_enters_without_a_flush_until_the_vgic_changes() {
    fake::reset();
    let g = vgic(1, &[40]);
    let mut lrs = [0u64; 4];
    assert_eq!(lrs::load(&g, 0, &mut lrs, false), lrs::Loaded { used: false, filled: 0 });
    assert!(g.is_idle(0), "the flush found nothing");
    // A later entry with clean LRs trusts the note; one with dirty LRs
    // still clears them.
    assert_eq!(lrs::load(&g, 0, &mut lrs, false), lrs::Loaded { used: false, filled: 0 });
    lrs::load(&g, 0, &mut lrs, true);
    assert_eq!(lr_writes().len(), 4, "dirty LRs are written: {:?}", lr_writes());
    // An injection locks the model for a change: the next entry flushes.
    spi(&g, 40);
    assert!(!g.is_idle(0));
    assert_eq!(lrs::load(&g, 0, &mut lrs, false), lrs::Loaded { used: true, filled: 1 });
    assert_eq!(fake::get("ich_lr0_el2") & LR_VINTID, 40);
}

#[test]
fn an_entry_after_another_vcpu_clears_every_list_register() {
    fake::reset();
    let g = vgic(1, &[]);
    let mut lrs = [0u64; 4];
    lrs::load(&g, 0, &mut lrs, true);
    assert_eq!(lr_writes(), [("ich_lr0_el2", 0), ("ich_lr1_el2", 0), ("ich_lr2_el2", 0), ("ich_lr3_el2", 0)]);
}

#[test]
fn a_pending_spi_reaches_a_list_register_and_its_eoi_is_folded_back() {
    fake::reset();
    let g = vgic(1, &[40]);
    spi(&g, 40);
    let mut lrs = [0u64; 4];
    let l = lrs::load(&g, 0, &mut lrs, false);
    assert_eq!(l, lrs::Loaded { used: true, filled: 1 });
    let lr0 = fake::get("ich_lr0_el2");
    assert_eq!(lr0 & LR_VINTID, 40);
    assert_eq!(lr0 >> 62, LR_PENDING >> 62, "pending");
    assert_eq!(fake::get("ich_hcr_el2"), HCR_EN, "no underflow interrupt: everything fit");

    // The guest takes and ends it: the hardware LR goes invalid.
    fake::set("ich_lr0_el2", 0);
    fake::take_reads();
    let saved = lrs::save(&g, 0, &mut lrs, l.used).expect("used LRs are folded back");
    assert!(saved.hw.is_empty());
    assert_eq!(fake::take_reads(), ["ich_lr0_el2", "ich_lr1_el2", "ich_lr2_el2", "ich_lr3_el2"]);
    assert_eq!(fake::get("ich_hcr_el2"), 0, "virtual CPU interface off at exit");

    // Nothing left: the next entry only clears the LR it used before.
    fake::take_writes();
    let l = lrs::load(&g, 0, &mut lrs, l.used);
    assert!(!l.used);
    assert!(lr_writes().iter().all(|&(_, v)| v == 0));
}

#[test]
fn an_spi_the_guest_has_not_taken_stays_pending_across_the_exit() {
    fake::reset();
    let g = vgic(1, &[41]);
    spi(&g, 41);
    let mut lrs = [0u64; 4];
    let l = lrs::load(&g, 0, &mut lrs, false);
    // The exit comes before the guest acknowledged it: the LR is unchanged.
    lrs::save(&g, 0, &mut lrs, l.used);
    fake::take_writes();
    let l = lrs::load(&g, 0, &mut lrs, true);
    assert!(l.used);
    let lr0 = fake::get("ich_lr0_el2");
    assert_eq!((lr0 & LR_VINTID, lr0 >> 62), (41, LR_PENDING >> 62), "written again, still pending");
}

#[test]
fn more_pending_interrupts_than_list_registers_ask_for_the_underflow_interrupt() {
    fake::reset();
    let ids = [40, 41, 42, 43, 44, 45];
    let g = vgic(1, &ids);
    for i in ids {
        spi(&g, i);
    }
    let mut lrs = [0u64; 4];
    let l = lrs::load(&g, 0, &mut lrs, false);
    assert_eq!(l.filled, 4);
    assert_eq!(fake::get("ich_hcr_el2"), HCR_EN | HCR_UIE);
}

#[test]
fn an_exit_with_unused_list_registers_reads_none_and_skips_the_vgic() {
    fake::reset();
    let g = vgic(1, &[]);
    let mut lrs = [0u64; 4];
    let _held = g.lock();
    // The vGIC is locked: were it taken, this would spin forever.
    assert!(lrs::save(&g, 0, &mut lrs, false).is_none());
    assert!(fake::reads().iter().all(|r| !r.starts_with("ich_lr")));
    assert_eq!(fake::writes(), [("ich_hcr_el2", 0)]);
}

/// `n` pCPUs whose MPIDR affinities are `mpidr(i)`.
fn pcpus(mpidr: impl Fn(usize) -> u64, n: usize) -> Vec<PcpuShared> {
    (0..n)
        .map(|i| {
            let p = PcpuShared::new();
            p.mpidr.store(mpidr(i), Ordering::Relaxed);
            p
        })
        .collect()
}

/// The SGI1R value that sends `intid` to affinity `aff3.aff2.aff1.aff0`.
fn sgi1r(intid: u32, aff3: u64, aff2: u64, aff1: u64, aff0: u64) -> u64 {
    aff3 << 48 | (aff0 / 16) << 44 | aff2 << 32 | u64::from(intid) << 24 | aff1 << 16 | 1 << (aff0 % 16)
}

#[test]
fn a_kick_is_sgi_1_to_the_pcpus_affinity() {
    fake::reset();
    let p = pcpus(|i| [0x0, 0x12, 0x1_0003, 0x2_0000_0005][i], 4);
    for cpu in 0..4 {
        pcpu::kick(&p, cpu);
    }
    let k = SGI_KICK.number();
    assert_eq!(
        fake::writes(),
        [
            ("icc_sgi1r_el1", sgi1r(k, 0, 0, 0, 0)),
            ("icc_sgi1r_el1", sgi1r(k, 0, 0, 0, 0x12)),
            ("icc_sgi1r_el1", sgi1r(k, 0, 1, 0, 3)),
            ("icc_sgi1r_el1", sgi1r(k, 2, 0, 0, 5)),
        ]
    );
    fake::take_writes();
    pcpu::kick(&p, 9);
    assert!(fake::writes().is_empty(), "no such pCPU: no SGI");
}

/// vCPU 0 of domain 0 with the given affinity, on `n` pCPUs.
fn sched(n: usize, affinity: Option<usize>) -> Sched {
    let s = Sched::new(SchedConfig::default(), n).unwrap();
    s.add_domain(0 as DomainId, DomainParams { weight: 256, cap_percent: None }).unwrap();
    s.add_vcpu(VcpuId(0), 0 as DomainId, affinity).unwrap();
    s.power_on(0, VcpuId(0)).unwrap();
    s
}

#[test]
fn waking_a_vcpu_running_on_another_pcpu_kicks_that_pcpu_only() {
    let s = sched(2, Some(1));
    let d = s.schedule(0, 1).unwrap().0;
    assert_eq!(d.next, Some(VcpuId(0)));
    assert_eq!(s.state(VcpuId(0)), Some(RunState::Running(1)));

    let w = wake::wake(&s, 0, 1_000, VcpuId(0), WakeCause::Interrupt);
    assert!(!w.blocked);
    assert_eq!(w.kick, Some(1));
    let w = wake::wake(&s, 1, 2_000, VcpuId(0), WakeCause::Interrupt);
    assert_eq!(w.kick, None, "it runs here: the next entry refills its LRs");
}

#[test]
fn waking_a_blocked_vcpu_asks_its_pcpu_to_reschedule_by_sgi_when_remote() {
    let s = sched(2, Some(1));
    s.schedule(0, 1).unwrap();
    s.block(10, 1).unwrap();
    s.schedule(10, 1).unwrap();
    let w = wake::wake(&s, 0, 1_000, VcpuId(0), WakeCause::Interrupt);
    assert!(w.blocked);
    assert_eq!(w.kick, None, "not running anywhere");
    assert_eq!(w.action, WakeAction::Reschedule { pcpu: 1 });

    let p = pcpus(|i| i as u64, 2);
    fake::reset();
    wake::act(&p, 0, w.action);
    assert!(p[1].resched.load(Ordering::Acquire));
    assert!(!p[0].resched.load(Ordering::Acquire));
    assert_eq!(fake::writes(), [("icc_sgi1r_el1", sgi1r(SGI_KICK.number(), 0, 0, 0, 1))]);

    // From pCPU 1 itself: the flag, no SGI.
    p[1].resched.store(false, Ordering::Release);
    fake::reset();
    wake::act(&p, 1, w.action);
    assert!(p[1].resched.load(Ordering::Acquire));
    assert!(fake::writes().is_empty());
}

#[test]
fn a_timer_rearm_request_keeps_the_earliest_deadline() {
    let p = pcpus(|i| i as u64, 2);
    fake::reset();
    wake::act(&p, 0, WakeAction::RearmTimer { pcpu: 1, at: 5_000 });
    wake::act(&p, 0, WakeAction::RearmTimer { pcpu: 1, at: 9_000 });
    assert_eq!(p[1].rearm_at.load(Ordering::Acquire), 5_000);
    assert_eq!(fake::writes().len(), 2, "each request kicks");
    fake::reset();
    wake::act(&p, 0, WakeAction::None);
    assert!(fake::writes().is_empty());
}

#[test]
fn a_vgic_change_wakes_every_kicked_vcpu_but_those_running_here() {
    let mut k = Kicks::none();
    for v in [0, 2, 3, 5] {
        k.add(v);
    }
    // vCPU 2 runs on this pCPU (0), 3 on pCPU 1, the others nowhere.
    let on = |v: usize| match v {
        2 => 0,
        3 => 1,
        _ => usize::MAX,
    };
    assert_eq!(wake::to_wake(k, 0, on).collect::<Vec<_>>(), [0, 3, 5]);
    assert_eq!(wake::to_wake(k, 1, on).collect::<Vec<_>>(), [0, 2, 5]);
}
