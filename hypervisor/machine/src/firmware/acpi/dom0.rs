//! The ACPI tables Dom0 boots with, written from the host's.
//!
//! As Xen does for an ACPI Dom0 (a design followed, not code): Dom0 gets
//! new copies of the tables that describe what the hypervisor virtualizes
//! and the host's others by address (the hypervisor maps them 1:1):
//!
//! * FADT: the host's, with `ARM_BOOT_ARCH` = PSCI_COMPLIANT | PSCI_USE_HVC
//!   (Dom0's PSCI calls trap to us, not to firmware). `X_DSDT` still points
//!   at the host's DSDT.
//! * MADT: the host's header, GICD, first GICR and GIC ITS structures byte
//!   for byte (the vGIC sits at the host's addresses and emulates Dom0's
//!   redistributors in the host's first GICR region: a further region, e.g.
//!   QEMU virt's for CPUs 123 and up, is left out, or Linux would probe
//!   frames nothing emulates); one GICC per Dom0 vCPU
//!   with its virtual MPIDR, ACPI processor UID and CPU interface number =
//!   vCPU index, enabled, no virtualization or GICv2 fields. Without GICR
//!   structures, vCPU *i* gets the GICR base where the vGIC emulates its
//!   redistributor: the host's first usable GICC's base plus *i* vGIC
//!   frames (`vgic::regs::GICR_STRIDE`, a GICv3 frame even on a GICv4 host,
//!   whose own frames are twice as long), as many vCPUs as the host has
//!   such GICCs at most. GIC MSI frames and unknown structures are dropped.
//! * STAO (Status Override Table) with `UART` = 1: Linux then hides the
//!   DSDT device whose resources match the SPCR's base address (the
//!   hypervisor's console; Linux's `drivers/acpi/scan.c` reads that address
//!   from the SPCR, so the SPCR stays in the XSDT), so no name path is
//!   needed and the table works whatever the UART's DSDT name is. Linux
//!   still takes the SPCR as its preferred console unless the command line
//!   names another (`console=hvc0`, or the vPL011's). Not yet checked by a
//!   Dom0 boot.
//! * XSDT: the host's entries in order with FADT and MADT replaced, any
//!   host STAO and every signature in [`Dom0AcpiConfig::remove`] left out,
//!   the STAO appended; and an ACPI 2.0 RSDP pointing at it.
//!
//! All of it is one blob to be copied to guest-physical `base`; every
//! checksum is valid. The tests parse the result back with this module's
//! parser.

use alloc::vec;
use alloc::vec::Vec;

use super::tables::{
    self, ARM_BOOT_PSCI_COMPLIANT, ARM_BOOT_PSCI_USE_HVC, FADT_ARM_BOOT_ARCH, GICC_ENABLED, GICC_LEN, MADT_ENTRIES,
    MADT_GICC, MADT_GICD, MADT_GICR, MADT_GIC_ITS,
};
use super::{checksum, AcpiError, Signature, Tables, HEADER_LEN, RSDP_LEN};

/// What Dom0 is given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dom0AcpiConfig {
    /// Virtual MPIDR of each vCPU, in vCPU order.
    pub vcpu_mpidrs: Vec<u64>,
    /// Guest-physical address the blob will be copied to.
    pub base: u64,
    /// Host tables not to pass on (e.g. `DBG2`), by signature.
    pub remove: Vec<Signature>,
    /// Dom0 drives the SPCR UART itself (the hypervisor emulates a PL011
    /// at its address): the STAO's `UART` is 0 and the DSDT device stays.
    pub keep_uart: bool,
    /// Leave the MADT's GIC ITS structures out (Dom0 gets no ITS).
    pub drop_its: bool,
}

/// Dom0's new tables: `blob` belongs at `base`; the others are addresses in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dom0Tables {
    pub base: u64,
    pub blob: Vec<u8>,
    pub rsdp: u64,
    pub xsdt: u64,
    pub fadt: u64,
    pub madt: u64,
    pub stao: u64,
}

/// The creator ID written into the tables we make.
const CREATOR_ID: [u8; 4] = *b"HYPV";
/// Table alignment inside the blob.
const ALIGN: usize = 16;

/// Writes Dom0's tables from the host's (see the module doc).
pub fn build_dom0_tables(host: &Tables<'_>, cfg: &Dom0AcpiConfig) -> Result<Dom0Tables, AcpiError> {
    if cfg.remove.contains(&Signature::SPCR) {
        return Err(AcpiError::Unsupported {
            table: Signature::SPCR,
            what: "removing it (the STAO needs its address)",
        });
    }
    let fadt = dom0_fadt(host)?;
    let madt = dom0_madt(host, &cfg.vcpu_mpidrs, cfg.drop_its)?;
    let stao = dom0_stao(host, !cfg.keep_uart)?;
    // The SMMUs are the hypervisor's: Dom0's IORT has none, its root
    // complexes map straight to the ITS.
    let iort = match host.find(Signature::IORT) {
        Some(t) => match tables::iort_without_smmus(t.data)? {
            Some(mut iort) => {
                finish(&mut iort, Signature::IORT)?;
                Some(iort)
            }
            None => None,
        },
        None => None,
    };

    let mut blob = Vec::new();
    let rsdp_off = place(&mut blob, &[0u8; RSDP_LEN]);
    let fadt_off = place(&mut blob, &fadt);
    let madt_off = place(&mut blob, &madt);
    let stao_off = place(&mut blob, &stao);
    let iort_off = iort.as_ref().map(|t| place(&mut blob, t));
    let addr = |off: usize| cfg.base + off as u64;

    let mut entries = Vec::new();
    for t in &host.tables {
        let sig = t.signature();
        // The DSDT is reached through the FADT, not the XSDT.
        if sig == Signature::DSDT || sig == Signature::STAO || cfg.remove.contains(&sig) {
            continue;
        }
        entries.push(match sig {
            Signature::FADT => addr(fadt_off),
            Signature::MADT => addr(madt_off),
            Signature::IORT => iort_off.map_or(t.addr, addr),
            _ => t.addr,
        });
    }
    entries.push(addr(stao_off));
    let mut xsdt = host.xsdt.header()?.to_vec();
    for e in entries {
        xsdt.extend_from_slice(&e.to_le_bytes());
    }
    finish(&mut xsdt, Signature::XSDT)?;
    let xsdt_off = place(&mut blob, &xsdt);

    let rsdp = rsdp(host.rsdp.oem_id, addr(xsdt_off));
    blob[rsdp_off..rsdp_off + RSDP_LEN].copy_from_slice(&rsdp);
    Ok(Dom0Tables {
        base: cfg.base,
        blob,
        rsdp: addr(rsdp_off),
        xsdt: addr(xsdt_off),
        fadt: addr(fadt_off),
        madt: addr(madt_off),
        stao: addr(stao_off),
    })
}

/// Appends `bytes` at the next aligned offset, returning it.
fn place(blob: &mut Vec<u8>, bytes: &[u8]) -> usize {
    let off = blob.len().next_multiple_of(ALIGN);
    blob.resize(off, 0);
    blob.extend_from_slice(bytes);
    off
}

/// Sets the length field and checksum of a table built in `t`.
fn finish(t: &mut [u8], sig: Signature) -> Result<(), AcpiError> {
    let len = u32::try_from(t.len()).map_err(|_| AcpiError::TooLarge(sig))?;
    t[4..8].copy_from_slice(&len.to_le_bytes());
    t[9] = 0;
    t[9] = 0u8.wrapping_sub(checksum(t));
    Ok(())
}

fn dom0_fadt(host: &Tables<'_>) -> Result<Vec<u8>, AcpiError> {
    let t = host.find(Signature::FADT).ok_or(AcpiError::Missing(Signature::FADT))?;
    tables::parse_fadt(t.data)?;
    let mut fadt = t.data.to_vec();
    let flags = u16::from_le_bytes([fadt[FADT_ARM_BOOT_ARCH], fadt[FADT_ARM_BOOT_ARCH + 1]])
        | ARM_BOOT_PSCI_COMPLIANT
        | ARM_BOOT_PSCI_USE_HVC;
    fadt[FADT_ARM_BOOT_ARCH..FADT_ARM_BOOT_ARCH + 2].copy_from_slice(&flags.to_le_bytes());
    finish(&mut fadt, Signature::FADT)?;
    Ok(fadt)
}

fn dom0_madt(host: &Tables<'_>, mpidrs: &[u64], drop_its: bool) -> Result<Vec<u8>, AcpiError> {
    let t = host.find(Signature::MADT).ok_or(AcpiError::Missing(Signature::MADT))?;
    let parsed = tables::parse_madt(t.data)?;
    if mpidrs.is_empty() {
        return Err(AcpiError::BadCount { table: Signature::MADT, what: "Dom0 vCPUs (none)" });
    }
    let mut sorted = mpidrs.to_vec();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        return Err(AcpiError::Overlap { table: Signature::MADT, what: "Dom0 vCPU MPIDRs (duplicate)" });
    }
    let host_gicr: Vec<u64> = parsed.giccs.iter().filter(|g| g.usable()).map(|g| g.gicr_base).collect();
    let per_cpu_gicr = parsed.gicr_ranges.is_empty();
    if per_cpu_gicr && mpidrs.len() > host_gicr.len() {
        return Err(AcpiError::BadCount { table: Signature::MADT, what: "Dom0 vCPUs (more than GICC GICR bases)" });
    }

    let mut madt = t.data[..MADT_ENTRIES].to_vec();
    let entries = tables::madt_entries(t.data)?;
    // The host's GICC length (80 up to ACPI 6.4, 82 in 6.5), so the entries
    // match the MADT revision copied with the header; extra fields stay 0.
    let gicc_len = entries.iter().find(|e| e.0 == MADT_GICC).map_or(GICC_LEN, |e| e.2.len().max(GICC_LEN));
    // GICCs first, as firmware lists them, then the GIC's own structures.
    for (i, &mpidr) in mpidrs.iter().enumerate() {
        let mut g = vec![0u8; gicc_len];
        g[0] = MADT_GICC;
        g[1] = gicc_len as u8;
        let idx = i as u32;
        g[4..8].copy_from_slice(&idx.to_le_bytes());
        g[8..12].copy_from_slice(&idx.to_le_bytes());
        g[12..16].copy_from_slice(&GICC_ENABLED.to_le_bytes());
        let gicr = if per_cpu_gicr { host_gicr[0] + i as u64 * crate::vgic::regs::GICR_STRIDE } else { 0 };
        g[60..68].copy_from_slice(&gicr.to_le_bytes());
        g[68..76].copy_from_slice(&mpidr.to_le_bytes());
        madt.extend_from_slice(&g);
    }
    let mut gicr_kept = false;
    for (ty, _, e) in entries {
        let first_gicr = ty == MADT_GICR && !core::mem::replace(&mut gicr_kept, true);
        if ty == MADT_GICD || first_gicr || (ty == MADT_GIC_ITS && !drop_its) {
            madt.extend_from_slice(e);
        }
    }
    finish(&mut madt, Signature::MADT)?;
    Ok(madt)
}

/// STAO: the header (identity from the host XSDT) and `UART` = 1 when
/// `hide_uart`.
fn dom0_stao(host: &Tables<'_>, hide_uart: bool) -> Result<Vec<u8>, AcpiError> {
    let mut stao = host.xsdt.header()?.to_vec();
    stao[0..4].copy_from_slice(&Signature::STAO.0);
    stao[8] = 0;
    stao[28..32].copy_from_slice(&CREATOR_ID);
    stao.push(u8::from(hide_uart));
    finish(&mut stao, Signature::STAO)?;
    Ok(stao)
}

fn rsdp(oem_id: [u8; 6], xsdt: u64) -> [u8; RSDP_LEN] {
    let mut r = [0u8; RSDP_LEN];
    r[0..8].copy_from_slice(b"RSD PTR ");
    r[9..15].copy_from_slice(&oem_id);
    r[15] = 2;
    r[20..24].copy_from_slice(&(RSDP_LEN as u32).to_le_bytes());
    r[24..32].copy_from_slice(&xsdt.to_le_bytes());
    r[8] = 0u8.wrapping_sub(checksum(&r[..20]));
    r[32] = 0u8.wrapping_sub(checksum(&r));
    r
}

/// Whether a table's STAO asks the OS to hide the SPCR UART.
pub fn stao_hides_uart(stao: &[u8]) -> bool {
    stao.get(HEADER_LEN) == Some(&1)
}
