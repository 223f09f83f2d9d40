//! LPIs in the vGIC model: the redistributor's LPI registers, the LPI
//! configuration and pending state, and the API the virtual ITS calls.
//!
//! # What the guest sees (with `VgicConfig::lpis`)
//!
//! GICD_TYPER.LPIS = 1 and IDbits = 13 (14 INTID bits), GICR_TYPER.PLPIS = 1
//! (DirectLPI = 0: LPIs come only from an ITS, there is no GICR_SETLPIR), so
//! the LPIs are INTIDs [`LPI_BASE`] (8192) to 16383. Per redistributor:
//! * `GICR_CTLR.EnableLPIs` (bit 0). Clearing it is IMPLEMENTATION DEFINED in
//!   IHI 0069; like KVM, the model allows it and says so with
//!   `GICR_CTLR.CES` (bit 1) = 1: the vCPU's pending LPIs are dropped and
//!   PROPBASER/PENDBASER become writable again. RWP reads 0 (the model is
//!   synchronous).
//! * `GICR_PROPBASER` and `GICR_PENDBASER` keep their architectural fields
//!   (see [`PROPBASER_MASK`], [`PENDBASER_MASK`]; PENDBASER.PTZ is write-only
//!   and reads 0). Writes while EnableLPIs is 1 are UNPREDICTABLE in the
//!   architecture; the model ignores them.
//! * The number of LPI ID bits the guest's tables cover is
//!   min(PROPBASER.IDbits + 1, [`LPI_ID_BITS`]); with 14 bits the
//!   configuration table holds 2^14 - 8192 = 8192 bytes, with 13 or fewer no
//!   LPI is in range.
//!
//! # State
//!
//! One configuration byte per LPI, shared by every redistributor (Linux points
//! all PROPBASERs at one table), and one pending bit per LPI per vCPU, both
//! bounded arrays (8 KiB + 1 KiB per vCPU). LPIs are edge-like and have no
//! active state. The model reads the configuration table itself
//! ([`Vgic::load_lpi_config`]) but never the pending table: Linux 6.1
//! allocates its pending tables zeroed, so nothing is pending when it sets
//! EnableLPIs, and the model never writes pending state back to the table
//! (a guest that hands over a non-zero pending table loses those LPIs).
//!
//! # List registers
//!
//! `flush_lrs` puts pending, enabled LPIs of a vCPU into list registers like
//! any other pending interrupt (Group 1, HW = 0, EOI = 0, priority from the
//! configuration byte), at most once per vCPU. Acknowledging a virtual LPI
//! makes its LR invalid (LPIs have no active state), so `sync_lrs` treats an
//! LR found without the pending bit as done, and one still pending goes back
//! to the vCPU that owns it now (after a MOVI, the new one). An LR holds a
//! 32-bit vINTID and ICH_VTR_EL2.IDbits is at least 16 bits on every GICv3,
//! so INTIDs up to 16383 always fit.
//!
//! While an LPI sits in a vCPU's list register, `clear_lpi` and `move_lpi`
//! are recorded against that slot and applied at sync, as ICPENDR writes
//! are for other interrupts. The same LPI may then also be pending again,
//! or sit in another vCPU's LR after a MOVI: each vCPU holds it at most once.
//!
//! # Bad input
//!
//! INTIDs outside 8192..=16383, or (per vCPU) beyond the range its
//! PROPBASER.IDbits covers, are refused with [`VgicError::BadIntid`]; vCPU
//! numbers out of range with [`VgicError::BadVcpu`]. An LPI sent to a vCPU
//! whose EnableLPIs is 0 is not delivered (the architecture says a
//! redistributor with LPIs disabled ignores them): the call succeeds and
//! does nothing.

use super::lr::{encode_lr, is_lpi};
use super::regs::{LR_PENDING, LR_STATE_MASK};
use super::set_bits;
use super::{Kicks, Vgic, VgicError, NO_VCPU, NUM_LRS_MAX};
use crate::intid::IntId;
use crate::virtio::GuestMemory;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

/// The first LPI INTID.
pub const LPI_BASE: u32 = crate::intid::LPI_START;
/// INTID bits the vGIC implements with LPIs (GICD_TYPER.IDbits + 1).
pub const LPI_ID_BITS: u32 = 14;
/// Number of LPIs the model holds state for (INTIDs 8192..=16383).
pub const NR_LPIS: u32 = (1 << LPI_ID_BITS) - LPI_BASE;
/// Configuration byte: Enable bit.
pub const LPI_CONFIG_ENABLE: u8 = 1 << 0;
/// Configuration byte: priority bits \[7:2\] (bit 1 is RES1).
pub const LPI_CONFIG_PRIORITY: u8 = 0xFC;

/// Words of a per-vCPU pending bitmap.
const LPI_WORDS: usize = NR_LPIS as usize / 64;
const _: () = assert!(LPI_WORDS <= 128, "LpiRedist::pending_words has one bit per word");

/// GICD_TYPER.LPIS.
pub const GICD_TYPER_LPIS: u32 = 1 << 17;
/// GICR_TYPER.PLPIS.
pub const GICR_TYPER_PLPIS: u64 = 1 << 0;
/// GICR_CTLR.EnableLPIs.
pub const GICR_CTLR_ENABLE_LPIS: u32 = 1 << 0;
/// GICR_CTLR.CES: clearing EnableLPIs is supported.
pub const GICR_CTLR_CES: u32 = 1 << 1;

/// IDbits \[4:0\].
const PROPBASER_IDBITS: u64 = 0x1F;
/// InnerCache \[9:7\], Shareability \[11:10\], OuterCache \[58:56\].
const BASER_ATTRS: u64 = 0x7 << 7 | 0x3 << 10 | 0x7 << 56;
/// PA \[51:12\].
const PROPBASER_PA: u64 = ((1 << 52) - 1) & !0xFFF;
/// PA \[51:16\].
const PENDBASER_PA: u64 = ((1 << 52) - 1) & !0xFFFF;
/// The GICR_PROPBASER bits the model stores.
pub const PROPBASER_MASK: u64 = PROPBASER_IDBITS | BASER_ATTRS | PROPBASER_PA;
/// The GICR_PENDBASER bits the model stores (PTZ, bit 62, reads 0).
pub const PENDBASER_MASK: u64 = BASER_ATTRS | PENDBASER_PA;

/// One redistributor's LPI state.
#[derive(Clone, Debug)]
pub(super) struct LpiRedist {
    /// GICR_CTLR.EnableLPIs.
    enabled: bool,
    propbaser: u64,
    pendbaser: u64,
    /// Pending LPIs held by the model (not those in an LR), one bit per LPI
    /// ([`LPI_WORDS`] words with LPIs, empty without).
    pending: Vec<u64>,
    /// One bit per word of `pending` that is not zero: the entry and WFI
    /// paths visit those words only.
    pending_words: u128,
    /// LR slots whose LPI a `clear_lpi` (or EnableLPIs 1 -> 0) dropped.
    lr_clear: u16,
    /// Per LR slot: the vCPU a `move_lpi` moved its LPI to, or `NO_VCPU`.
    lr_moved: [u16; NUM_LRS_MAX],
}

impl LpiRedist {
    pub(super) fn new(lpis: bool) -> Self {
        LpiRedist {
            enabled: false,
            propbaser: 0,
            pendbaser: 0,
            pending: if lpis { vec![0; LPI_WORDS] } else { Vec::new() },
            pending_words: 0,
            lr_clear: 0,
            lr_moved: [NO_VCPU; NUM_LRS_MAX],
        }
    }

    fn is_pending(&self, idx: usize) -> bool {
        self.pending.get(idx / 64).is_some_and(|w| w & (1 << (idx % 64)) != 0)
    }

    fn set_pending(&mut self, idx: usize, on: bool) {
        if let Some(w) = self.pending.get_mut(idx / 64) {
            if on {
                *w |= 1 << (idx % 64);
            } else {
                *w &= !(1 << (idx % 64));
            }
            if *w != 0 {
                self.pending_words |= 1 << (idx / 64);
            } else {
                self.pending_words &= !(1 << (idx / 64));
            }
        }
    }

    fn clear_all_pending(&mut self) {
        self.pending.iter_mut().for_each(|w| *w = 0);
        self.pending_words = 0;
    }

    /// Tests: `pending_words` names exactly the non-zero words.
    #[cfg(test)]
    fn assert_summary(&self) {
        for (w, &bits) in self.pending.iter().enumerate() {
            assert_eq!(bits != 0, self.pending_words & (1 << w) != 0, "pending word {w}");
        }
    }

    /// The pending LPIs (indices from 0), in order.
    fn pending_lpis(&self) -> impl Iterator<Item = usize> + '_ {
        set_bits(self.pending_words).flat_map(move |w| set_bits(self.pending[w].into()).map(move |b| w * 64 + b))
    }

    /// Number of LPIs the configuration table covers (0 while disabled).
    fn table_lpis(&self) -> u32 {
        if !self.enabled {
            return 0;
        }
        let bits = ((self.propbaser & PROPBASER_IDBITS) as u32 + 1).min(LPI_ID_BITS);
        (1u32 << bits).saturating_sub(LPI_BASE)
    }
}

impl Vgic {
    /// Whether this vGIC has LPIs (`VgicConfig::lpis`).
    pub fn lpis_supported(&self) -> bool {
        self.lpis
    }

    /// Whether `vcpu`'s GICR_CTLR.EnableLPIs is 1 (false for a bad vCPU).
    pub fn lpis_enabled(&self, vcpu: usize) -> bool {
        self.vcpus.get(vcpu).is_some_and(|v| v.lpi.enabled)
    }

    /// While `vcpu` has EnableLPIs set: the guest-physical address of its LPI
    /// configuration table (PROPBASER.PA) and how many configuration bytes to
    /// read from it (2^min(IDbits + 1, 14) - 8192, possibly 0).
    pub fn lpi_prop_table(&self, vcpu: usize) -> Option<(u64, u32)> {
        let l = &self.vcpus.get(vcpu)?.lpi;
        l.enabled.then(|| (l.propbaser & PROPBASER_PA, l.table_lpis()))
    }

    /// While `vcpu` has EnableLPIs set: the guest-physical address of its LPI
    /// pending table (PENDBASER.PA). The model does not read it (see the
    /// module docs).
    pub fn lpi_pend_table(&self, vcpu: usize) -> Option<u64> {
        let l = &self.vcpus.get(vcpu)?.lpi;
        l.enabled.then_some(l.pendbaser & PENDBASER_PA)
    }

    /// The vCPUs whose EnableLPIs went 0 -> 1 since the last call, each once.
    /// After an `mmio_write`, call [`Vgic::load_lpi_config`] for each (the
    /// model cannot read guest memory from an MMIO write).
    pub fn take_lpi_enable_events(&mut self) -> Vec<usize> {
        core::mem::take(&mut self.lpi_enable_events)
    }

    /// The model index of an LPI INTID, or `BadIntid`.
    fn lpi_index(&self, intid: IntId) -> Result<usize, VgicError> {
        let raw = u32::from(intid);
        match raw.checked_sub(LPI_BASE) {
            Some(idx) if self.lpis && idx < NR_LPIS => Ok(idx as usize),
            _ => Err(VgicError::BadIntid(intid)),
        }
    }

    /// Checks an LPI for `vcpu`: `Ok(None)` when that vCPU has EnableLPIs 0
    /// (the LPI is not delivered), `BadIntid` when beyond its table.
    fn check_lpi(&self, intid: IntId, vcpu: usize) -> Result<Option<usize>, VgicError> {
        self.check_vcpu(vcpu)?;
        let idx = self.lpi_index(intid)?;
        let l = &self.vcpus[vcpu].lpi;
        if !l.enabled {
            return Ok(None);
        }
        if idx as u32 >= l.table_lpis() {
            return Err(VgicError::BadIntid(intid));
        }
        Ok(Some(idx))
    }

    fn lpi_priority(&self, idx: usize) -> u8 {
        self.lpi_config.get(idx).map_or(0xFF, |c| c & LPI_CONFIG_PRIORITY)
    }

    fn lpi_config_enabled(&self, idx: usize) -> bool {
        self.lpi_config.get(idx).is_some_and(|c| c & LPI_CONFIG_ENABLE != 0)
    }

    /// Whether `vcpu` may be signalled LPIs at all now.
    fn lpi_gate(&self, vcpu: usize) -> bool {
        self.lpis_enabled(vcpu) && self.grp1_enabled()
    }

    /// Whether the model holds LPI `idx` pending for `vcpu` and could signal it.
    fn lpi_deliverable(&self, vcpu: usize, idx: usize) -> bool {
        self.vcpus.get(vcpu).is_some_and(|v| v.lpi.is_pending(idx))
            && self.lpi_config_enabled(idx)
            && self.lpi_gate(vcpu)
    }

    /// The LR slot of `vcpu` that holds LPI `intid` (raw), if any.
    fn lpi_lr_slot(&self, vcpu: usize, intid: u32) -> Option<usize> {
        self.vcpus.get(vcpu)?.lr_shadow.iter().position(|&i| i == intid)
    }

    /// The vCPU whose pending state an LPI in `holder`'s slot `s` is.
    fn lr_owner(&self, holder: usize, s: usize) -> usize {
        match self.vcpus[holder].lpi.lr_moved[s] {
            NO_VCPU => holder,
            v => v as usize,
        }
    }

    /// The (holder, slot) pairs whose LR holds `intid` pending for `owner`.
    fn lpi_in_lrs_of(&self, intid: u32, owner: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (v, vs) in self.vcpus.iter().enumerate() {
            for (s, &i) in vs.lr_shadow.iter().enumerate() {
                if i == intid && self.lr_owner(v, s) == owner {
                    out.push((v, s));
                }
            }
        }
        out
    }

    /// Whether `vcpu` has any deliverable LPI (for [`Vgic::has_deliverable`]).
    /// Tests: every vCPU's pending-word summary is exact.
    #[cfg(test)]
    pub(crate) fn assert_lpi_summary_matches(&self) {
        for vs in &self.vcpus {
            vs.lpi.assert_summary();
        }
    }

    pub(super) fn lpi_has_deliverable(&self, vcpu: usize) -> bool {
        if !self.lpi_gate(vcpu) {
            return false;
        }
        self.vcpus[vcpu].lpi.pending_lpis().any(|idx| self.lpi_config_enabled(idx))
    }

    /// Kicks for a configuration change of LPI `idx`: vCPUs where it became
    /// deliverable, and vCPUs holding it in an LR (to refresh the LR).
    fn lpi_config_kicks(&self, idx: usize) -> Kicks {
        let mut k = Kicks::none();
        let intid = LPI_BASE + idx as u32;
        for v in 0..self.vcpus.len() {
            if self.lpi_deliverable(v, idx) || self.lpi_lr_slot(v, intid).is_some() {
                k.add(v);
            }
        }
        k
    }

    /// Sets the configuration byte of one LPI (priority bits \[7:2\], Enable
    /// bit 0), as read from the guest's configuration table (INV). Enabling
    /// an LPI that is pending kicks the vCPUs it is pending on; changing one
    /// that sits in an LR kicks its holder. `BadIntid` for non-LPIs, INTIDs
    /// beyond 16383 and without LPI support.
    pub fn set_lpi_config(&mut self, intid: IntId, config: u8) -> Result<Kicks, VgicError> {
        let idx = self.lpi_index(intid)?;
        let Some(c) = self.lpi_config.get_mut(idx) else {
            return Err(VgicError::BadIntid(intid));
        };
        if *c == config {
            return Ok(Kicks::none());
        }
        *c = config;
        Ok(self.lpi_config_kicks(idx))
    }

    /// Reads the whole LPI configuration table `vcpu`'s PROPBASER names
    /// (INVALL, or after EnableLPIs 0 -> 1) and applies it like
    /// [`Vgic::set_lpi_config`] for every byte. `LpisDisabled` when `vcpu`
    /// has EnableLPIs 0; `TableOutsideRam` when the table is not all guest
    /// RAM, and then nothing changes.
    pub fn load_lpi_config(&mut self, mem: &impl GuestMemory, vcpu: usize) -> Result<Kicks, VgicError> {
        self.check_vcpu(vcpu)?;
        let (gpa, n) = self.lpi_prop_table(vcpu).ok_or(VgicError::LpisDisabled(vcpu))?;
        let len = u64::from(n);
        if n == 0 {
            return Ok(Kicks::none());
        }
        let mut table = vec![0u8; n as usize];
        if !mem.contains(gpa, len) || mem.read(gpa, &mut table).is_err() {
            return Err(VgicError::TableOutsideRam { gpa, len });
        }
        let mut kicks = Kicks::none();
        for (idx, &byte) in table.iter().enumerate() {
            let Some(c) = self.lpi_config.get_mut(idx) else {
                break;
            };
            if *c != byte {
                *c = byte;
                kicks.merge(self.lpi_config_kicks(idx));
            }
        }
        Ok(kicks)
    }

    /// Makes an LPI pending on `vcpu` (an edge; pending again while one sits
    /// in an LR merges with it at sync). Kicks `vcpu` if it can take it now.
    /// Not delivered (and `Ok`) when `vcpu` has EnableLPIs 0.
    pub fn inject_lpi(&mut self, intid: IntId, vcpu: usize) -> Result<Kicks, VgicError> {
        let Some(idx) = self.check_lpi(intid, vcpu)? else {
            return Ok(Kicks::none());
        };
        self.vcpus[vcpu].lpi.set_pending(idx, true);
        let mut k = Kicks::none();
        if self.lpi_deliverable(vcpu, idx) {
            k.add(vcpu);
        }
        Ok(k)
    }

    /// Drops the pending state of an LPI on `vcpu` (ITS CLEAR, DISCARD),
    /// including an edge held in one of its LRs (applied at sync).
    pub fn clear_lpi(&mut self, intid: IntId, vcpu: usize) -> Result<(), VgicError> {
        let Some(idx) = self.check_lpi(intid, vcpu)? else {
            return Ok(());
        };
        self.vcpus[vcpu].lpi.set_pending(idx, false);
        for (holder, s) in self.lpi_in_lrs_of(u32::from(intid), vcpu) {
            self.vcpus[holder].lpi.lr_clear |= 1 << s;
        }
        Ok(())
    }

    /// Moves an LPI's pending state from vCPU `from` to `to` (ITS MOVI,
    /// MOVALL); one held in an LR of `from` moves when it comes back at sync.
    /// Kicks `to` if it can take it now. `BadIntid` when the LPI is beyond
    /// `to`'s table; the pending state is dropped when `to` has EnableLPIs 0.
    pub fn move_lpi(&mut self, intid: IntId, from: usize, to: usize) -> Result<Kicks, VgicError> {
        self.check_vcpu(from)?;
        let to_idx = self.check_lpi(intid, to)?;
        let idx = self.lpi_index(intid)?;
        if from == to {
            return Ok(Kicks::none());
        }
        let raw = u32::from(intid);
        let was = self.vcpus[from].lpi.is_pending(idx);
        self.vcpus[from].lpi.set_pending(idx, false);
        for (holder, s) in self.lpi_in_lrs_of(raw, from) {
            self.vcpus[holder].lpi.lr_moved[s] = to as u16;
        }
        let mut k = Kicks::none();
        if was && to_idx.is_some() {
            self.vcpus[to].lpi.set_pending(idx, true);
            if self.lpi_deliverable(to, idx) {
                k.add(to);
            }
        }
        Ok(k)
    }

    /// Whether an LPI is pending on `vcpu` as the guest would see it: held by
    /// the model, or put in one of the LRs and not cleared since. False for
    /// bad INTIDs and vCPUs.
    pub fn lpi_pending(&self, intid: IntId, vcpu: usize) -> bool {
        let Ok(idx) = self.lpi_index(intid) else {
            return false;
        };
        let Some(vs) = self.vcpus.get(vcpu) else {
            return false;
        };
        vs.lpi.is_pending(idx)
            || self
                .lpi_in_lrs_of(u32::from(intid), vcpu)
                .iter()
                .any(|&(holder, s)| self.vcpus[holder].lpi.lr_clear & (1 << s) == 0)
    }

    // ---- MMIO (called from mmio.rs) ----

    /// GICR_CTLR as `rd` reads it.
    pub(super) fn gicr_ctlr(&self, rd: usize) -> u32 {
        if !self.lpis {
            return 0;
        }
        GICR_CTLR_CES | if self.lpis_enabled(rd) { GICR_CTLR_ENABLE_LPIS } else { 0 }
    }

    /// A guest write to GICR_CTLR of `rd`.
    pub(super) fn write_gicr_ctlr(&mut self, rd: usize, value: u32) {
        if !self.lpis {
            return;
        }
        let Some(vs) = self.vcpus.get_mut(rd) else {
            return;
        };
        let on = value & GICR_CTLR_ENABLE_LPIS != 0;
        if on == vs.lpi.enabled {
            return;
        }
        vs.lpi.enabled = on;
        if on {
            if !self.lpi_enable_events.contains(&rd) {
                self.lpi_enable_events.push(rd);
            }
        } else {
            // Like KVM: disabling drops every pending LPI of this vCPU.
            vs.lpi.clear_all_pending();
            for s in 0..NUM_LRS_MAX {
                if is_lpi(vs.lr_shadow[s]) {
                    vs.lpi.lr_clear |= 1 << s;
                }
            }
            log::debug!("vgic: vCPU {rd} cleared GICR_CTLR.EnableLPIs");
        }
    }

    /// GICR_PROPBASER (`pend` false) or GICR_PENDBASER (true) of `rd`.
    pub(super) fn gicr_baser(&self, rd: usize, pend: bool) -> u64 {
        match self.vcpus.get(rd) {
            Some(v) if self.lpis => {
                if pend {
                    v.lpi.pendbaser
                } else {
                    v.lpi.propbaser
                }
            }
            _ => 0,
        }
    }

    /// Stores a (merged 64-bit) PROPBASER/PENDBASER value; ignored while
    /// EnableLPIs is 1.
    pub(super) fn set_gicr_baser(&mut self, rd: usize, pend: bool, value: u64) {
        if !self.lpis {
            return;
        }
        let Some(vs) = self.vcpus.get_mut(rd) else {
            return;
        };
        if vs.lpi.enabled {
            log::debug!(
                "vgic: vCPU {rd}: GICR_{}BASER write ignored, EnableLPIs is 1",
                if pend { "PEND" } else { "PROP" }
            );
            return;
        }
        if pend {
            vs.lpi.pendbaser = value & PENDBASER_MASK;
        } else {
            vs.lpi.propbaser = value & PROPBASER_MASK;
        }
    }

    // ---- list registers (called from lr.rs) ----

    /// Whether `vcpu` holds any LPI pending (enabled or not): without one,
    /// [`Vgic::lpi_candidates`] offers nothing.
    pub(super) fn lpis_pending(&self, vcpu: usize) -> bool {
        self.vcpus.get(vcpu).is_some_and(|vs| vs.lpi.pending_words != 0)
    }

    /// Offers `vcpu`'s deliverable LPIs that are not in its LRs already to
    /// `offer(priority, intid)`; returns how many there were.
    pub(super) fn lpi_candidates(&self, vcpu: usize, mut offer: impl FnMut(u8, u32)) -> usize {
        if !self.lpi_gate(vcpu) {
            return 0;
        }
        let vs = &self.vcpus[vcpu];
        let mut n = 0;
        for idx in vs.lpi.pending_lpis() {
            let intid = LPI_BASE + idx as u32;
            if self.lpi_config_enabled(idx) && !vs.lr_shadow.contains(&intid) {
                n += 1;
                offer(self.lpi_priority(idx), intid);
            }
        }
        n
    }

    /// Puts LPI `intid` (a candidate from [`Vgic::lpi_candidates`]) into
    /// `vcpu`'s slot `s`; returns the LR value, or `None` if it is no longer
    /// deliverable.
    pub(super) fn lpi_fill(&mut self, vcpu: usize, s: usize, intid: u32) -> Option<u64> {
        let idx = intid.checked_sub(LPI_BASE)? as usize;
        if !self.lpi_deliverable(vcpu, idx) || s >= NUM_LRS_MAX {
            return None;
        }
        let prio = self.lpi_priority(idx);
        let vs = &mut self.vcpus[vcpu];
        vs.lpi.set_pending(idx, false);
        vs.lpi.lr_clear &= !(1 << s);
        vs.lpi.lr_moved[s] = NO_VCPU;
        vs.lr_shadow[s] = intid;
        vs.lr_held |= 1 << s;
        Some(encode_lr(intid, prio, None, false, true, false))
    }

    /// Folds back the LR value `val` of `vcpu`'s slot `s`, which held LPI
    /// `intid` (the shadow is already cleared): pending goes back to the
    /// LPI's owner unless cleared; anything else is done. Returns the owner
    /// to kick when it is another vCPU that can take it now.
    pub(super) fn lpi_sync(&mut self, vcpu: usize, s: usize, intid: u32, val: u64) -> Option<usize> {
        let idx = intid.checked_sub(LPI_BASE)? as usize;
        if s >= NUM_LRS_MAX || vcpu >= self.vcpus.len() {
            return None;
        }
        let owner = self.lr_owner(vcpu, s);
        let cleared = self.vcpus[vcpu].lpi.lr_clear & (1 << s) != 0;
        self.vcpus[vcpu].lpi.lr_clear &= !(1 << s);
        self.vcpus[vcpu].lpi.lr_moved[s] = NO_VCPU;
        // Acknowledged (invalid), or active which an LPI cannot be: done.
        let still_pending = val & LR_STATE_MASK & LR_PENDING != 0;
        if !still_pending || cleared {
            return None;
        }
        let in_range = self.vcpus.get(owner).is_some_and(|o| (idx as u32) < o.lpi.table_lpis());
        if !in_range {
            return None; // The owner disabled LPIs or shrank its table.
        }
        self.vcpus[owner].lpi.set_pending(idx, true);
        (owner != vcpu && self.lpi_deliverable(owner, idx)).then_some(owner)
    }

    /// The LPI lines of [`Vgic::dump`].
    pub(super) fn dump_lpis(&self, f: &mut fmt::Formatter<'_>, vcpu: usize) -> fmt::Result {
        let Some(vs) = self.vcpus.get(vcpu) else {
            return Ok(());
        };
        if !self.lpis {
            return Ok(());
        }
        writeln!(
            f,
            "  lpis enabled={} propbaser={:#x} pendbaser={:#x}",
            vs.lpi.enabled, vs.lpi.propbaser, vs.lpi.pendbaser
        )?;
        for idx in 0..NR_LPIS as usize {
            let intid = LPI_BASE + idx as u32;
            let slot = vs.lr_shadow.iter().position(|&i| i == intid);
            if !vs.lpi.is_pending(idx) && slot.is_none() {
                continue;
            }
            write!(
                f,
                "  lpi {intid:5} prio={:#04x} {}{}",
                self.lpi_priority(idx),
                if self.lpi_config_enabled(idx) { "E" } else { "-" },
                if vs.lpi.is_pending(idx) { "P" } else { "-" },
            )?;
            if let Some(s) = slot {
                write!(f, " in_lr={s}")?;
                if vs.lpi.lr_clear & (1 << s) != 0 {
                    write!(f, " cleared")?;
                }
                if vs.lpi.lr_moved[s] != NO_VCPU {
                    write!(f, " moved_to=vcpu{}", vs.lpi.lr_moved[s])?;
                }
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// The vITS delivers its LPIs into this vGIC.
impl super::its::LpiSink for Vgic {
    fn lpis_enabled(&self, vcpu: usize) -> bool {
        Vgic::lpis_enabled(self, vcpu)
    }
    fn lpi_prop_table(&self, vcpu: usize) -> Option<(u64, u32)> {
        Vgic::lpi_prop_table(self, vcpu)
    }
    fn set_lpi_config(&mut self, intid: IntId, config: u8) -> Result<Kicks, VgicError> {
        Vgic::set_lpi_config(self, intid, config)
    }
    fn load_lpi_config(&mut self, mem: &impl GuestMemory, vcpu: usize) -> Result<Kicks, VgicError> {
        Vgic::load_lpi_config(self, mem, vcpu)
    }
    fn inject_lpi(&mut self, intid: IntId, vcpu: usize) -> Result<Kicks, VgicError> {
        Vgic::inject_lpi(self, intid, vcpu)
    }
    fn clear_lpi(&mut self, intid: IntId, vcpu: usize) -> Result<(), VgicError> {
        Vgic::clear_lpi(self, intid, vcpu)
    }
    fn move_lpi(&mut self, intid: IntId, from: usize, to: usize) -> Result<Kicks, VgicError> {
        Vgic::move_lpi(self, intid, from, to)
    }
}
