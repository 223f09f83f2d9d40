//! The virtual GICv3: a portable model of the distributor and redistributors a
//! guest sees, plus the bridge to the hardware list registers.
//!
//! # What the guest sees
//!
//! A GICv3 (ArchRev 3 even on GICv4 hosts) with affinity routing always on,
//! one security state (GICD_CTLR.DS reads 1, as KVM presents it), `nr_spis`
//! SPIs, LPIs only when [`VgicConfig::lpis`] is set (INTIDs 8192..=16383, see
//! the `lpi` module; the virtual ITS that injects them lives apart), no
//! DirectLPI, and one redistributor per vCPU at a 128 KiB stride
//! (RD_base, then SGI_base at +64 KiB). Every interrupt is treated as Group 1:
//! IGROUPR/IGRPMODR are stored for read-back only, list registers always carry
//! Group = 1, and delivery is gated by GICD_CTLR.EnableGrp1 (bit 1, which Linux
//! sets as "EnableGrp1A"). That gate applies to SGIs and PPIs too, as in KVM.
//! GICR_WAKER reads as zero (ProcessorSleep and ChildrenAsleep clear) and
//! ignores writes, as KVM presents it: a virtual redistributor has no power
//! state of its own, so delivery never waits for the guest's wake handshake
//! (a guest that never writes GICR_WAKER still gets its interrupts).
//!
//! # Who calls what
//!
//! This module is plain data plus logic; the EL2 code owns a spin lock around
//! one [`Vgic`] per VM and calls:
//! * [`Vgic::decode`] / [`Vgic::mmio_read`] / [`Vgic::mmio_write`] for
//!   stage-2 data aborts in the GIC windows;
//! * [`Vgic::set_level`], [`Vgic::inject_edge`], [`Vgic::send_sgi`] for
//!   interrupt sources (emulated devices, forwarded physical IRQs, trapped
//!   ICC_SGI1R_EL1 writes);
//! * with LPIs, from the virtual ITS: [`Vgic::inject_lpi`],
//!   [`Vgic::clear_lpi`], [`Vgic::move_lpi`], [`Vgic::set_lpi_config`] (INV)
//!   and [`Vgic::load_lpi_config`] (INVALL); after every `mmio_write` the
//!   caller takes [`Vgic::take_lpi_enable_events`] and loads the
//!   configuration table of each vCPU that just set EnableLPIs;
//! * [`Vgic::sync_lrs`] on **every** exit of a vCPU (before emulating the trap),
//!   and [`Vgic::flush_lrs`] on every entry. Between those two calls the
//!   interrupts in that vCPU's list registers belong to the hardware; the model
//!   remembers that they are "in flight" so no other vCPU gets them.
//!
//! Every call that may make an interrupt deliverable returns [`Kicks`]: the
//! vCPUs to wake (if blocked in WFI) or to IPI (if running, so they exit,
//! sync and re-flush their list registers).
//!
//! # List registers
//!
//! `sync_lrs` folds every LR this model filled back into the model and zeroes
//! it; `flush_lrs` then fills empty LRs with the highest-priority work, active
//! interrupts first (so the guest can always deactivate what it acknowledged).
//! Level-sensitive software interrupts get LR.EOI = 1, so the guest's
//! deactivation raises a maintenance interrupt and the line is resampled on
//! the following sync. Forwarded hardware interrupts get LR.HW = 1 with the
//! physical INTID; their deactivation reaches the physical GIC directly, and
//! an HW LR found empty on sync is simply done (never re-pended).
//!
//! Guest writes that change the state of an interrupt currently sitting in a
//! running vCPU's LRs (ICPENDR, ICACTIVER, ISACTIVER, ICENABLER) are recorded
//! and applied when that vCPU syncs; the owner is returned in `Kicks` so that
//! happens promptly. Until then, reads show the state as it was flushed.
//!
//! # Integration checklist (EL2 side)
//!
//! * Exit: save all `ICH_LR<n>_EL2` into a `[u64; nr_lrs]`, write
//!   ICH_HCR_EL2 = 0 (this also silences maintenance interrupts while EL2 runs),
//!   then `sync_lrs(vcpu, &mut lrs)` under the lock; kick what it returns.
//! * Trap handling: `mmio_*`, `send_sgi` (trapped ICC_SGI1R_EL1 writes), device
//!   `set_level`/`inject_edge`; IPI/wake every vCPU in the returned `Kicks`.
//!   A WFI blocks only if `has_deliverable(vcpu)` is false.
//! * Entry: `flush_lrs(vcpu, &mut lrs)`, write every LR back, then
//!   ICH_HCR_EL2 = En | (UIE if `overflow`). EOI maintenance needs no enable
//!   bit; the maintenance PPI (INTID 25) handler only has to let the vCPU exit
//!   (the exit path above does the rest). UIE fires when at most one LR is
//!   valid, so it needs at least two list registers to be useful.
//! * Forwarded SPIs: `set_hw(intid, Some(pintid))`, physical EOImode = 1; on the
//!   physical IRQ do a priority drop only (ICC_EOIR1) and call `inject_edge`;
//!   the guest's deactivation deactivates the physical interrupt. Program the
//!   physical route from `route_of(intid)` after IROUTER writes. If a
//!   guest ends the pending or active state of a forwarded interrupt with an
//!   ICPENDR/ICACTIVER write (distributor or redistributor), no HW list
//!   register deactivates the physical one: the model reports it, and after
//!   every `sync_lrs` and `mmio_write` the caller takes
//!   [`Vgic::take_hw_deactivations`] and deactivates each physical interrupt
//!   (an SPI in the distributor, a PPI on the pCPU where that vCPU runs).
//! * The trigger of a forwarded SPI is the guest's: a GICD_ICFGR write that
//!   changes it is reported by [`Vgic::take_hw_triggers`] (physical INTID,
//!   edge), and the caller programs the physical GICD_ICFGR (an ACPI Dom0
//!   learns its devices' triggers from the DSDT, the hypervisor does not).
//!
//! The model never panics on guest input: every index is checked, bad access
//! sizes give [`VgicError::BadAccessSize`], reserved offsets read as zero and
//! ignore writes.
//!
//! # Modules
//!
//! This file holds [`Vgic`] itself (its state, construction, frame decoding,
//! interrupt lookup that marks what changes as live, and
//! [`Vgic::is_pending_or_active`], asked when a vCPU is loaded) and
//! re-exports the public items of its children.
//!
//! - `types`: limits, [`VgicConfig`], [`VgicError`], [`MmioTarget`];
//! - `kicks`: [`Kicks`], the vCPUs to wake or interrupt;
//! - `irq`: the state of one interrupt and the views the guest reads;
//! - `route`: SPI routing, state ownership, deliverability, kicks;
//! - `source`: device lines, edges and SGIs;
//! - `hw`: forwarded interrupts and what the caller mirrors on the physical
//!   GIC ([`HwDeactivation`]);
//! - `mmio`: guest accesses to the distributor and redistributor frames;
//! - `lr`: list-register values, `flush_lrs` and `sync_lrs`;
//! - `cell`: [`VgicCell`], the model behind its lock with a lock-free note
//!   of the vCPUs a flush found nothing for (an entry after an exit that
//!   touched no interrupt takes no lock);
//! - `lpi`: LPIs and the API the virtual ITS calls;
//! - `its`: the virtual ITS;
//! - `regs`: emulated register offsets and ID values;
//! - `dump`: [`Dump`], one vCPU's view for the debug console.

mod cell;
mod dump;
mod hw;
mod irq;
pub mod its;
mod kicks;
mod lpi;
#[cfg(test)]
mod lpi_tests;
mod lr;
mod mmio;
pub mod regs;
mod route;
mod source;
#[cfg(test)]
mod tests;
mod types;

use crate::intid::IntId;
use alloc::vec;
use alloc::vec::Vec;

pub use cell::{VgicCell, VgicRead};
pub use dump::Dump;
pub use hw::HwDeactivation;
use irq::{set_bits, Irq, NO_INTID, NO_VCPU};
pub use kicks::{Kicks, KicksIter, MAX_VCPUS};
pub use lpi::{LPI_BASE, LPI_CONFIG_ENABLE, LPI_CONFIG_PRIORITY, LPI_ID_BITS, NR_LPIS};
pub use lr::{encode_lr, FlushResult};
use regs::*;
pub use types::{
    active_priority_regs, usable_lrs, MmioTarget, VgicConfig, VgicError, MAX_SPIS, NR_PRIVATE, NUM_LRS_MAX, NUM_LRS_MIN,
};

/// Per-vCPU state: affinity, private interrupts, and which INTID each list
/// register slot holds.
#[derive(Clone, Debug)]
struct VcpuState {
    mpidr: u64,
    private: [Irq; NR_PRIVATE as usize],
    /// One bit per private interrupt that may not be idle, as `spi_live`.
    private_live: u32,
    lr_shadow: [u32; NUM_LRS_MAX],
    /// One bit per `lr_shadow` slot that holds an INTID: the entry path's
    /// "no LR held" test is one load, not a scan of the slots.
    lr_held: u16,
    /// This redistributor's LPI registers and pending LPIs.
    lpi: lpi::LpiRedist,
    /// Active software interrupts go into LRs with EOI maintenance
    /// ([`Vgic::watch_active_eoi`]).
    eoi_watch: bool,
}

impl VcpuState {
    /// The `lr_shadow` slots that hold an INTID, one bit each: what
    /// `lr_held` must be.
    fn shadow_mask(&self) -> u16 {
        (0..NUM_LRS_MAX).filter(|&s| self.lr_shadow[s] != NO_INTID).fold(0, |m, s| m | 1 << s)
    }
}

/// The virtual GICv3 of one VM.
pub struct Vgic {
    gicd_base: u64,
    gicr_base: u64,
    nr_spis: u32,
    ctlr: u32,
    vcpus: Vec<VcpuState>,
    spis: Vec<Irq>,
    /// One bit per SPI that may not be idle: set whenever the SPI is changed
    /// (every change goes through `irq_mut`), cleared by `flush_lrs` once it
    /// finds the SPI idle. The entry and WFI paths look at these SPIs only,
    /// not at all of them (up to 988 on an ACPI Dom0).
    spi_live: Vec<u64>,
    /// One bit per word of `spi_live` that is not zero ([`MAX_SPIS`] fit in
    /// 16 words): the entry path's "no SPI live" test is one load, and the
    /// flush visits only the words with a live SPI.
    spi_live_words: u64,
    irouter: Vec<u64>,
    /// Cached delivery target of each SPI (from IROUTER).
    spi_target: Vec<u16>,
    /// Counts the changes of any SPI's route or enable ([`Vgic::route_gen`]).
    route_gen: u64,
    /// Physical deactivations the caller has not taken yet (one entry per
    /// interrupt at most, so bounded by the number of HW interrupts).
    hw_deactivations: Vec<HwDeactivation>,
    /// Forwarded SPIs whose trigger the guest changed, as (physical INTID,
    /// edge), not taken yet (one entry per SPI at most).
    hw_triggers: Vec<(IntId, bool)>,
    /// Whether LPIs exist (`VgicConfig::lpis`).
    lpis: bool,
    /// One configuration byte per LPI (priority in bits \[7:2\], Enable in
    /// bit 0), shared by all redistributors: [`NR_LPIS`] bytes with LPIs,
    /// empty without.
    lpi_config: Vec<u8>,
    /// vCPUs whose EnableLPIs went 0 -> 1 since the caller last asked (each
    /// at most once, so bounded by the number of vCPUs).
    lpi_enable_events: Vec<usize>,
}

impl Vgic {
    /// Builds a vGIC in its reset state. Out-of-range configuration values are
    /// clamped: `nr_spis` rounded up to a multiple of 32 and capped at
    /// [`MAX_SPIS`], vCPUs beyond [`MAX_VCPUS`] dropped. Use [`Vgic::try_new`]
    /// to get an error instead.
    pub fn new(cfg: VgicConfig) -> Self {
        let nr_spis = cfg.nr_spis.div_ceil(32).saturating_mul(32).min(MAX_SPIS);
        let nr_vcpus = cfg.vcpu_mpidrs.len().min(MAX_VCPUS);
        let mut private = [Irq::reset(false); NR_PRIVATE as usize];
        for sgi in private.iter_mut().take(16) {
            sgi.edge = true;
        }
        let vcpus = cfg.vcpu_mpidrs[..nr_vcpus]
            .iter()
            .map(|&mpidr| VcpuState {
                mpidr,
                private,
                private_live: u32::MAX,
                lr_shadow: [NO_INTID; NUM_LRS_MAX],
                eoi_watch: false,
                lr_held: 0,
                lpi: lpi::LpiRedist::new(cfg.lpis),
            })
            .collect();
        let mut v = Vgic {
            gicd_base: cfg.gicd_base,
            gicr_base: cfg.gicr_base,
            nr_spis,
            ctlr: 0,
            vcpus,
            spis: vec![Irq::reset(false); nr_spis as usize],
            spi_live: vec![0; (nr_spis as usize).div_ceil(64)],
            spi_live_words: 0,
            irouter: vec![0; nr_spis as usize],
            spi_target: vec![NO_VCPU; nr_spis as usize],
            route_gen: 0,
            hw_deactivations: Vec::new(),
            hw_triggers: Vec::new(),
            lpis: cfg.lpis,
            lpi_config: if cfg.lpis { vec![0; NR_LPIS as usize] } else { Vec::new() },
            lpi_enable_events: Vec::new(),
        };
        v.retarget_all();
        v
    }

    /// Like [`Vgic::new`] but rejects configurations it would have to clamp.
    pub fn try_new(cfg: VgicConfig) -> Result<Self, VgicError> {
        if cfg.nr_spis > MAX_SPIS
            || cfg.vcpu_mpidrs.is_empty()
            || cfg.vcpu_mpidrs.len() > MAX_VCPUS
            || !cfg.gicd_base.is_multiple_of(GICD_SIZE)
            || !cfg.gicr_base.is_multiple_of(GICR_STRIDE)
        {
            return Err(VgicError::OutOfRange);
        }
        Ok(Self::new(cfg))
    }

    /// Number of vCPUs (redistributors).
    pub fn nr_vcpus(&self) -> usize {
        self.vcpus.len()
    }

    /// Number of SPIs (after rounding).
    pub fn nr_spis(&self) -> u32 {
        self.nr_spis
    }

    /// One past the highest valid INTID.
    pub fn nr_irqs(&self) -> u32 {
        NR_PRIVATE + self.nr_spis
    }

    /// Size of the redistributor region (all vCPUs).
    pub fn gicr_size(&self) -> u64 {
        self.vcpus.len() as u64 * GICR_STRIDE
    }

    /// The guest-physical frames the vGIC emulates, as `(base, size)`: the
    /// distributor, then the redistributors of all vCPUs (what a VM's MMIO
    /// bus registers; [`Vgic::decode`] answers inside them).
    pub fn frames(&self) -> [(u64, u64); 2] {
        [(self.gicd_base, GICD_SIZE), (self.gicr_base, self.gicr_size())]
    }

    /// Whether `ipa` falls in the distributor or a redistributor frame, and at
    /// which offset (within the 64 KiB GICD frame or the vCPU's 128 KiB GICR).
    pub fn decode(&self, ipa: u64) -> Option<(MmioTarget, u64)> {
        if let Some(off) = ipa.checked_sub(self.gicd_base) {
            if off < GICD_SIZE {
                return Some((MmioTarget::Distributor, off));
            }
        }
        let off = ipa.checked_sub(self.gicr_base)?;
        let idx = off / GICR_STRIDE;
        if idx < self.vcpus.len() as u64 {
            return Some((MmioTarget::Redistributor(idx as usize), off % GICR_STRIDE));
        }
        None
    }

    // ---- interrupt lookup ----

    fn irq(&self, vcpu: usize, intid: u32) -> Option<&Irq> {
        if intid < NR_PRIVATE {
            self.vcpus.get(vcpu)?.private.get(intid as usize)
        } else {
            self.spis.get((intid - NR_PRIVATE) as usize)
        }
    }

    fn irq_mut(&mut self, vcpu: usize, intid: u32) -> Option<&mut Irq> {
        if intid < NR_PRIVATE {
            let vs = self.vcpus.get_mut(vcpu)?;
            let irq = vs.private.get_mut(intid as usize)?;
            vs.private_live |= 1 << intid;
            Some(irq)
        } else {
            let i = (intid - NR_PRIVATE) as usize;
            let irq = self.spis.get_mut(i)?;
            self.spi_live[i / 64] |= 1 << (i % 64);
            self.spi_live_words |= 1 << (i / 64);
            Some(irq)
        }
    }

    /// Tests: every SPI that is not idle is in `spi_live` (what makes
    /// skipping the others on entry correct).
    #[cfg(test)]
    pub(crate) fn assert_spi_live_covers_busy_spis(&self) {
        for (i, irq) in self.spis.iter().enumerate() {
            let live = self.spi_live[i / 64] & (1 << (i % 64)) != 0;
            assert!(live || irq.idle(), "SPI {} is busy but not live: {irq:?}", NR_PRIVATE as usize + i);
        }
        for (w, &bits) in self.spi_live.iter().enumerate() {
            assert_eq!(self.spi_live_words & (1 << w) != 0, bits != 0, "spi_live_words bit {w}");
        }
    }

    /// Tests: every busy private interrupt is in its vCPU's `private_live`.
    #[cfg(test)]
    pub(crate) fn assert_private_live_covers_busy(&self) {
        for (v, vs) in self.vcpus.iter().enumerate() {
            for (i, irq) in vs.private.iter().enumerate() {
                assert!(vs.private_live & (1 << i) != 0 || irq.idle(), "vCPU {v} INTID {i} busy but not live: {irq:?}");
            }
        }
    }

    /// Indices (into `spis`) of the SPIs that may not be idle.
    fn live_spis(&self) -> impl Iterator<Item = usize> + '_ {
        self.spi_live.iter().enumerate().flat_map(|(w, &bits)| set_bits(bits.into()).map(move |i| w * 64 + i))
    }

    fn check_vcpu(&self, vcpu: usize) -> Result<(), VgicError> {
        if vcpu < self.vcpus.len() {
            Ok(())
        } else {
            Err(VgicError::BadVcpu(vcpu))
        }
    }

    fn grp1_enabled(&self) -> bool {
        self.ctlr & CTLR_ENABLE_GRP1 != 0
    }

    /// Whether the guest enabled SPI `intid` (GICD_ISENABLER); false for
    /// other INTIDs.
    /// Changes with every write that may move an SPI's route or enable
    /// (IROUTER, ISENABLER/ICENABLER): the EL2 code re-follows the physical
    /// routes of forwarded SPIs only when it moved, or its vCPU did.
    pub fn route_gen(&self) -> u64 {
        self.route_gen
    }

    pub fn spi_enabled(&self, intid: IntId) -> bool {
        intid.is_spi() && self.irq(0, u32::from(intid)).is_some_and(|i| i.enabled)
    }

    /// Whether `intid` is pending or active for `vcpu` as the guest sees it.
    /// The EL2 code uses it when it loads a vCPU, to give a forwarded private
    /// interrupt (the virtual timer) the matching physical active state.
    pub fn is_pending_or_active(&self, vcpu: usize, intid: IntId) -> bool {
        if u32::from(intid) >= LPI_BASE {
            return self.lpi_pending(intid, vcpu);
        }
        self.irq(vcpu, u32::from(intid)).is_some_and(|i| i.pending_view() || i.active_view())
    }

    /// A human-readable summary of one vCPU's view (non-idle interrupts only).
    pub fn dump(&self, vcpu: usize) -> Dump<'_> {
        Dump { vgic: self, vcpu }
    }
}
