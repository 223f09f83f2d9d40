//! The SMMUs at run time: brought up at boot as `iommu=` says
//! ([`init_smmus`]), a VM's devices attached to a stage 2 that mirrors its
//! RAM and the ITS doorbell ([`attach_dma`], the plan's
//! `domain::vmplan::DmaPlan`), their interrupts ([`smmu_irq`]), and the
//! checksum of the hypervisor's own code that shows no device wrote it
//! ([`image_checksum`]).

use super::heap::HeapFrames;
use super::vm::VmError;
use crate::arch::smmu;
use crate::config::{Config, IommuMode};
use crate::domain::vmplan::VmPlan;
use crate::dtb::Machine;
use crate::region::Region;
use crate::smmu::ste::{ste_stage2, S2Config};
use crate::stage2::{IpaSize, Stage2};
use core::sync::atomic::{AtomicU64, Ordering};
use log::{error, info, warn};

/// Brings up every SMMU the description names, unless `iommu=off`. One
/// that cannot be brought up (or whose registers are not `device_mapped`
/// by the boot map) stops the boot with `iommu=required`, else it is
/// logged and what is behind it is not confined.
pub(super) fn init_smmus(machine: &Machine, cfg: &Config, device_mapped: fn(Region) -> bool) {
    // The boot value, before any guest or device runs.
    image_checksum();
    if machine.smmus.is_empty() {
        return;
    }
    if cfg.iommu == IommuMode::Off {
        warn!(
            "iommu=off: {} SMMU(s) not used; devices' DMA is not confined (the SMMUs stay hidden from Dom0)",
            machine.smmus.len()
        );
        return;
    }
    for (i, s) in machine.smmus.iter().enumerate() {
        if !device_mapped(s.regs) {
            fail(cfg, i, s.regs.base, "its registers are outside the platform's device windows");
            continue;
        }
        // SAFETY: the SMMU's two register pages as the description names
        // them, inside the device windows (checked above, identity-mapped
        // as device memory); the guest DTB hides the node and no stage 2
        // maps it, so only the driver touches them.
        match unsafe { smmu::init(i, s.regs.base, s.coherent, [s.eventq, s.gerror]) } {
            Ok(sum) => info!(
                "SMMU{i}: SMMUv3 at {:#x}, stage 2 for DMA, {}-bit StreamIDs (2-level table), {}-bit output, {} \
                 commands / {} events, {}, interrupts {:?}/{:?}; unknown streams abort",
                s.regs.base,
                sum.sid_bits,
                sum.features.oas_bits,
                sum.cmdq_entries,
                sum.eventq_entries,
                if sum.coherent { "coherent" } else { "non-coherent (tables cleaned)" },
                s.eventq.map(u32::from),
                s.gerror.map(u32::from),
            ),
            Err(e) => fail(cfg, i, s.regs.base, &alloc::format!("{e}")),
        }
    }
}

fn fail(cfg: &Config, i: usize, base: u64, why: &str) {
    if cfg.iommu == IommuMode::Required {
        crate::hv_fatal!("SMMU{i} at {base:#x}: {why} (iommu=required)");
    }
    error!("SMMU{i} at {base:#x}: {why}; the DMA behind it is NOT confined (iommu=required stops the boot instead)");
}

/// Confines the DMA of the VM `vp` plans (VMID `vmid`): a stage 2 of its
/// own mapping what the plan's `DmaPlan` lists, every stream of the plan
/// attached to it. Nothing to do without a DMA plan; an SMMU that did not
/// come up was reported by [`init_smmus`] and is skipped.
pub(super) fn attach_dma(vp: &VmPlan, vmid: u16) -> Result<(), VmError> {
    let Some(dma) = &vp.dma else {
        return Ok(());
    };
    let top = dma.mappings.iter().map(|m| m.ipa + m.size).max().unwrap_or(0);
    let pa_bits = crate::stage2::pa_bits(crate::arch::el2::parange());
    let mut attached = 0u64;
    // The SMMU walks these tables for as long as the streams stay attached,
    // which is for good: never freed, even on an error after some attached.
    let mut frames = core::mem::ManuallyDrop::new(HeapFrames::default());
    let mut tables: Option<Stage2> = None;
    for r in &dma.streams {
        let Some(feat) = smmu::features(r.smmu) else {
            continue;
        };
        let ipa = IpaSize::choose(pa_bits.min(feat.oas_bits), top);
        let s2 = match &tables {
            Some(s) if s.ipa() == ipa => s,
            _ => {
                let mut s = Stage2::new(&mut *frames, ipa)?;
                for m in &dma.mappings {
                    s.map(&mut *frames, m.ipa, m.pa, m.size, m.mem)?;
                }
                frames.clean_to_poc();
                tables.insert(s)
            }
        };
        let entry = ste_stage2(&S2Config {
            vmid,
            root: s2.root(),
            ipa_bits: ipa.bits(),
            start_level: ipa.start_level() as u8,
            ps_bits: pa_bits.min(feat.oas_bits),
        });
        smmu::attach(r.smmu, r.first, r.count, &entry, u32::from(vp.spec.id), vmid).map_err(|e| {
            error!("SMMU{}: streams {:#x}+{:#x}: {e}", r.smmu, r.first, r.count);
            VmError::Memory("the SMMU did not take the VM's streams")
        })?;
        attached += u64::from(r.count);
        info!(
            "d{}: DMA of SMMU{} streams {:#x}..{:#x} confined to its RAM and the ITS doorbell ({}-bit stage 2, VMID {vmid})",
            vp.spec.id,
            r.smmu,
            r.first,
            r.first + r.count - 1,
            ipa.bits()
        );
    }
    if attached == 0 {
        warn!("d{}: its devices' DMA is not confined (no SMMU up)", vp.spec.id);
    }
    Ok(())
}

/// An SMMU's interrupt (the caller ends it): one line per event the fault
/// policy lets through, one per global error.
pub(super) fn smmu_irq() {
    smmu::handle_irq(
        |i, ev, owner, aborted| {
            let who = owner.map_or_else(|| alloc::string::String::from("no domain"), |(d, _)| alloc::format!("d{d}"));
            warn!(
                "SMMU{i}: {} on stream {:#x} ({who}), {} of IPA {:#x}{}",
                ev.kind.name(),
                ev.sid,
                if ev.rnw { "read" } else { "write" },
                ev.ipa,
                if aborted { "; the stream keeps faulting: it now aborts" } else { "" }
            );
        },
        |i, active| {
            let names: alloc::vec::Vec<&str> = crate::smmu::gerror_names(active).collect();
            error!("SMMU{i}: global error {}", names.join(", "));
        },
    );
}

/// FNV-1a over 64-bit words (each word is one step): enough to see a
/// device's write, cheap enough for 2 MiB at boot.
fn fnv64(start: u64, end: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut p = start & !7;
    while p < end {
        // SAFETY: `p` walks the hypervisor's own text and read-only data
        // (`image_checksum`), identity-mapped normal memory nothing writes.
        let w = unsafe { core::ptr::read_volatile(p as *const u64) };
        h = (h ^ w).wrapping_mul(0x0000_0100_0000_01b3);
        p += 8;
    }
    h
}

extern "C" {
    static __image_start: u8;
    static __rela_start: u8;
}

/// The checksum at boot.
static BOOT_CHECKSUM: AtomicU64 = AtomicU64::new(0);

/// The checksum of the hypervisor's code and read-only data (from the
/// image's start to its relocations): the first call's value is kept as
/// the boot value. Returns (boot, now).
pub(super) fn image_checksum() -> (u64, u64) {
    // Linker symbols: only their addresses are taken.
    let (start, end) = (core::ptr::addr_of!(__image_start) as u64, core::ptr::addr_of!(__rela_start) as u64);
    let now = fnv64(start, end);
    let _ = BOOT_CHECKSUM.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
    (BOOT_CHECKSUM.load(Ordering::Relaxed), now)
}
