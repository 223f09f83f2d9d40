//! What a Dom0 booted with ACPI is handed instead of the host's device tree
//! (Xen's `efi-dom0.c` design, our code).
//!
//! Linux arm64 takes the ACPI path when its DT has only `/chosen`, and reads
//! the firmware through the `linux,uefi-*` properties there: a system table
//! (whose configuration table gives the ACPI 2.0 RSDP) and a memory map. It
//! never calls into that "firmware" (`efi=noruntime`), so the system table
//! is data only: no boot or runtime services, no console.
//!
//! Everything is one blob for a reserved area at the end of Dom0's RAM
//! (`boot::plan`'s guest DTB area, 2 MiB):
//!
//! | offset | what |
//! |---|---|
//! | 0 | the DT: `/chosen` only (bootargs, initrd, `linux,uefi-*`) |
//! | [`SYSTAB_OFF`] | `EFI_SYSTEM_TABLE`, its configuration table (ACPI 2.0 → Dom0's RSDP; Linux's memreserve table → an empty list root after it), the vendor string |
//! | [`MMAP_OFF`] | the memory map |
//! | [`ACPI_OFF`] | Dom0's ACPI tables (`acpi::dom0::build_dom0_tables`) |
//!
//! The memory map: Dom0's RAM as conventional memory, the area itself as
//! ACPI reclaim (Linux keeps it reserved and maps it cacheable), the host's
//! ACPI reclaim and NVS regions (where the tables Dom0 gets by address
//! live: DSDT, GTDT, SPCR, ...) as they are, and MMIO regions Dom0 may map.
//!
//! The memreserve table (`LINUX_EFI_MEMRESERVE_TABLE_GUID`, a linked list
//! root Linux writes into) is where Linux's ITS driver records its LPI
//! tables for a kexec'd kernel; without it `efi_mem_reserve_persistent`
//! fails and the driver warns once per CPU (Dom0 has the ITS with a PCIe
//! disk).

use alloc::string::String;
use alloc::vec::Vec;

use super::acpi::dom0::{build_dom0_tables, Dom0AcpiConfig, Dom0Tables};
use super::acpi::{AcpiError, Tables};
use super::uefi::{memory_type, Guid, MemoryDescriptor, ACPI_20_TABLE_GUID, EFI_PAGE_SIZE, MEMORY_DESCRIPTOR_LEN};
use crate::region::Region;
use vm_fdt::FdtWriter;

/// Offsets in the area (see the module doc).
pub const SYSTAB_OFF: u64 = 0x1_0000;
pub const MMAP_OFF: u64 = 0x1_1000;
pub const ACPI_OFF: u64 = 0x2_0000;
/// The memory map's room.
const MMAP_MAX: u64 = ACPI_OFF - MMAP_OFF;

/// `EFI_MEMORY_WB` and `EFI_MEMORY_UC` (UEFI 2.10 section 7.2).
pub const EFI_MEMORY_WB: u64 = 0x8;
pub const EFI_MEMORY_UC: u64 = 0x1;
/// `EFI_MEMORY_DESCRIPTOR_VERSION`.
pub const MEMORY_DESCRIPTOR_VERSION: u32 = 1;

/// "IBI SYST", revision 2.70, 120-byte header + fields (64-bit).
const SYSTEM_TABLE_SIGNATURE: u64 = 0x5453_5953_2049_4249;
const SYSTEM_TABLE_REVISION: u32 = (2 << 16) | 70;
const SYSTEM_TABLE_LEN: usize = 120;
/// Where the configuration table (two 24-byte entries), the vendor string
/// and the memreserve list root go, after it.
const CONFIG_TABLE_OFF: usize = 128;
const CONFIG_ENTRIES: u64 = 2;
const VENDOR_OFF: usize = 176;
const MEMRESERVE_OFF: usize = 0x200;
/// `struct linux_efi_memreserve` with no entries and no next: size, count
/// (32 bits each), next (64).
const MEMRESERVE_LEN: usize = 16;
/// Linux's `LINUX_EFI_MEMRESERVE_TABLE_GUID`.
pub const LINUX_EFI_MEMRESERVE_TABLE_GUID: Guid =
    Guid::new(0x888e_b0c6, 0x8ede, 0x4ff5, [0xa8, 0xf0, 0x9a, 0xee, 0x5c, 0xb9, 0x77, 0xc2]);
const VENDOR: &str = "hypervisor";

/// What Dom0's firmware view is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dom0EfiConfig {
    /// Dom0's RAM (identity-mapped), containing `area`.
    pub ram: Region,
    /// Where the blob goes (guest-physical; at least 2 MiB is expected).
    pub area: Region,
    pub bootargs: String,
    pub initrd: Option<Region>,
    /// Host firmware memory Dom0 reads (ACPI reclaim/NVS), passed on as is.
    pub firmware: Vec<MemoryDescriptor>,
    /// Device memory Dom0 may map (listed as MMIO, uncached).
    pub mmio: Vec<Region>,
    /// The control device's page, described in the DT (`/hypervisor`):
    /// Linux keeps an ACPI boot's DT flat, `hvctl` reads it from
    /// `/sys/firmware/fdt`.
    pub control: Option<Region>,
}

/// The blob for `area.base` and what is where in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dom0Efi {
    pub blob: Vec<u8>,
    /// The DT's address: Dom0's x0.
    pub dtb: u64,
    pub system_table: u64,
    pub memory_map: Region,
    pub tables: Dom0Tables,
}

#[derive(thiserror::Error, Debug, PartialEq, Eq)]
pub enum Dom0EfiError {
    #[error("{0}")]
    Acpi(AcpiError),
    #[error("Dom0 /chosen DT: {0:?}")]
    Dtb(vm_fdt::Error),
    /// A part does not fit its room in the area (named).
    #[error("Dom0 EFI: the {0} does not fit its room")]
    TooLarge(&'static str),
    /// The area is not page-aligned, or not inside the RAM.
    #[error("Dom0 EFI: the firmware area is not page-aligned RAM of Dom0")]
    BadArea,
}

impl From<AcpiError> for Dom0EfiError {
    fn from(e: AcpiError) -> Self {
        Dom0EfiError::Acpi(e)
    }
}
impl From<vm_fdt::Error> for Dom0EfiError {
    fn from(e: vm_fdt::Error) -> Self {
        Dom0EfiError::Dtb(e)
    }
}

/// Builds the DT, system table, memory map and ACPI tables (module doc).
/// `acpi.base` is ignored: the tables go at [`ACPI_OFF`].
pub fn build_dom0_efi(host: &Tables<'_>, acpi: &Dom0AcpiConfig, cfg: &Dom0EfiConfig) -> Result<Dom0Efi, Dom0EfiError> {
    let area = cfg.area;
    let page_aligned = area.base.is_multiple_of(EFI_PAGE_SIZE) && area.size.is_multiple_of(EFI_PAGE_SIZE);
    if !page_aligned || area.base < cfg.ram.base || area.end() > cfg.ram.end() || area.size <= ACPI_OFF {
        return Err(Dom0EfiError::BadArea);
    }
    let tables = build_dom0_tables(host, &Dom0AcpiConfig { base: area.base + ACPI_OFF, ..acpi.clone() })?;
    if tables.blob.len() as u64 > area.size - ACPI_OFF {
        return Err(Dom0EfiError::TooLarge("ACPI tables"));
    }
    let systab_at = area.base + SYSTAB_OFF;
    let systab = system_table(systab_at, tables.rsdp);
    let mmap = memory_map(cfg)?;
    if mmap.len() as u64 > MMAP_MAX {
        return Err(Dom0EfiError::TooLarge("memory map"));
    }
    let memory_map = Region { base: area.base + MMAP_OFF, size: mmap.len() as u64 };
    let dtb = chosen_dtb(&cfg.bootargs, cfg.initrd, systab_at, memory_map, cfg.control)?;
    if dtb.len() as u64 > SYSTAB_OFF {
        return Err(Dom0EfiError::TooLarge("DT"));
    }
    let mut blob = alloc::vec![0u8; ACPI_OFF as usize + tables.blob.len()];
    blob[..dtb.len()].copy_from_slice(&dtb);
    blob[SYSTAB_OFF as usize..][..systab.len()].copy_from_slice(&systab);
    blob[MMAP_OFF as usize..][..mmap.len()].copy_from_slice(&mmap);
    blob[ACPI_OFF as usize..].copy_from_slice(&tables.blob);
    Ok(Dom0Efi { blob, dtb: area.base, system_table: systab_at, memory_map, tables })
}

/// The DT with only `/chosen` (Linux's `drivers/firmware/efi/fdtparams.c`
/// reads the `linux,uefi-*` properties: the table and map addresses as
/// 64-bit cells, the sizes and version as 32-bit ones), and
/// `linux,uefi-secure-boot` (0), which Debian's kernels require; and the
/// control device's `/hypervisor` node when there is one.
pub fn chosen_dtb(
    bootargs: &str,
    initrd: Option<Region>,
    systab: u64,
    mmap: Region,
    control: Option<Region>,
) -> Result<Vec<u8>, vm_fdt::Error> {
    let mut w = FdtWriter::new()?;
    let root = w.begin_node("")?;
    w.property_u32("#address-cells", 2)?;
    w.property_u32("#size-cells", 2)?;
    let chosen = w.begin_node("chosen")?;
    w.property_string("bootargs", bootargs)?;
    if let Some(i) = initrd {
        w.property_u64("linux,initrd-start", i.base)?;
        w.property_u64("linux,initrd-end", i.end())?;
    }
    w.property_u64("linux,uefi-system-table", systab)?;
    w.property_u64("linux,uefi-mmap-start", mmap.base)?;
    w.property_u32("linux,uefi-mmap-size", mmap.size as u32)?;
    w.property_u32("linux,uefi-mmap-desc-size", MEMORY_DESCRIPTOR_LEN as u32)?;
    w.property_u32("linux,uefi-mmap-desc-ver", MEMORY_DESCRIPTOR_VERSION)?;
    // Debian's kernels (secure-boot lockdown patch) want it among the
    // others, or take the machine for a non-EFI one: 0 = not in secure boot.
    w.property_u32("linux,uefi-secure-boot", 0)?;
    w.end_node(chosen)?;
    if let Some(page) = control {
        crate::dtb::control_node(&mut w, page)?;
    }
    w.end_node(root)?;
    w.finish()
}

/// `EFI_SYSTEM_TABLE` at `at`, with two configuration table entries (ACPI
/// 2.0 → `rsdp`, Linux's memreserve table → an empty list root), the vendor
/// string and that root after it; no services, no console.
pub fn system_table(at: u64, rsdp: u64) -> Vec<u8> {
    let mut t = alloc::vec![0u8; MEMRESERVE_OFF + MEMRESERVE_LEN];
    let put = |t: &mut [u8], off: usize, bytes: &[u8]| t[off..off + bytes.len()].copy_from_slice(bytes);
    put(&mut t, 0, &SYSTEM_TABLE_SIGNATURE.to_le_bytes());
    put(&mut t, 8, &SYSTEM_TABLE_REVISION.to_le_bytes());
    put(&mut t, 12, &(SYSTEM_TABLE_LEN as u32).to_le_bytes());
    put(&mut t, 24, &(at + VENDOR_OFF as u64).to_le_bytes());
    put(&mut t, 104, &CONFIG_ENTRIES.to_le_bytes());
    put(&mut t, 112, &(at + CONFIG_TABLE_OFF as u64).to_le_bytes());
    put(&mut t, CONFIG_TABLE_OFF, &ACPI_20_TABLE_GUID.0);
    put(&mut t, CONFIG_TABLE_OFF + 16, &rsdp.to_le_bytes());
    put(&mut t, CONFIG_TABLE_OFF + 24, &LINUX_EFI_MEMRESERVE_TABLE_GUID.0);
    put(&mut t, CONFIG_TABLE_OFF + 40, &(at + MEMRESERVE_OFF as u64).to_le_bytes());
    for (i, c) in VENDOR.bytes().enumerate() {
        put(&mut t, VENDOR_OFF + 2 * i, &u16::from(c).to_le_bytes());
    }
    let crc = crc32(&t[..SYSTEM_TABLE_LEN]);
    put(&mut t, 16, &crc.to_le_bytes());
    t
}

/// CRC-32 (IEEE 802.3, reflected), as the table header's `CRC32` field.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// The memory map (module doc), sorted by address, in
/// [`MEMORY_DESCRIPTOR_LEN`]-byte descriptors. Host firmware regions and
/// MMIO that overlap Dom0's RAM are refused.
pub fn memory_map(cfg: &Dom0EfiConfig) -> Result<Vec<u8>, Dom0EfiError> {
    let ram = cfg.ram;
    let area = cfg.area;
    let desc = |ty, r: Region, attribute| MemoryDescriptor {
        ty,
        phys_start: r.base,
        pages: r.size.div_ceil(EFI_PAGE_SIZE),
        attribute,
    };
    let mut all = Vec::new();
    if area.base > ram.base {
        all.push(desc(memory_type::CONVENTIONAL, Region { base: ram.base, size: area.base - ram.base }, EFI_MEMORY_WB));
    }
    all.push(desc(memory_type::ACPI_RECLAIM, area, EFI_MEMORY_WB));
    if ram.end() > area.end() {
        all.push(desc(
            memory_type::CONVENTIONAL,
            Region { base: area.end(), size: ram.end() - area.end() },
            EFI_MEMORY_WB,
        ));
    }
    let overlaps_ram = |r: Region| r.base < ram.end() && ram.base < r.end();
    for d in &cfg.firmware {
        let r = d.region().ok_or(Dom0EfiError::BadArea)?;
        if overlaps_ram(r) {
            return Err(Dom0EfiError::BadArea);
        }
        all.push(*d);
    }
    for &r in &cfg.mmio {
        if overlaps_ram(r) {
            return Err(Dom0EfiError::BadArea);
        }
        let base = r.base & !(EFI_PAGE_SIZE - 1);
        all.push(desc(memory_type::MMIO, Region { base, size: r.end() - base }, EFI_MEMORY_UC));
    }
    all.sort_by_key(|d| d.phys_start);
    let mut out = Vec::with_capacity(all.len() * MEMORY_DESCRIPTOR_LEN);
    for d in all {
        out.extend_from_slice(&d.ty.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&d.phys_start.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(&d.pages.to_le_bytes());
        out.extend_from_slice(&d.attribute.to_le_bytes());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::firmware::acpi::MemImage;
    use crate::firmware::uefi::MemoryMap;

    #[test]
    fn system_table_points_at_the_rsdp() {
        let t = system_table(0x1000, 0xdead_0000);
        assert_eq!(u64::from_le_bytes(t[0..8].try_into().unwrap()), SYSTEM_TABLE_SIGNATURE);
        assert_eq!(u64::from_le_bytes(t[104..112].try_into().unwrap()), 2);
        assert_eq!(u64::from_le_bytes(t[112..120].try_into().unwrap()), 0x1000 + CONFIG_TABLE_OFF as u64);
        assert_eq!(&t[CONFIG_TABLE_OFF..CONFIG_TABLE_OFF + 16], &ACPI_20_TABLE_GUID.0);
        assert_eq!(
            u64::from_le_bytes(t[CONFIG_TABLE_OFF + 16..CONFIG_TABLE_OFF + 24].try_into().unwrap()),
            0xdead_0000
        );
        // Linux's memreserve table: an empty list root inside the blob.
        assert_eq!(&t[CONFIG_TABLE_OFF + 24..CONFIG_TABLE_OFF + 40], &LINUX_EFI_MEMRESERVE_TABLE_GUID.0);
        let root = u64::from_le_bytes(t[CONFIG_TABLE_OFF + 40..CONFIG_TABLE_OFF + 48].try_into().unwrap());
        assert_eq!(root, 0x1000 + MEMRESERVE_OFF as u64);
        assert_eq!(t.len(), MEMRESERVE_OFF + MEMRESERVE_LEN);
        assert!(t[MEMRESERVE_OFF..].iter().all(|&b| b == 0), "size 0, count 0, next 0");
        assert!(VENDOR_OFF + 2 * (VENDOR.len() + 1) <= MEMRESERVE_OFF);
        assert_eq!(LINUX_EFI_MEMRESERVE_TABLE_GUID.0[..4], [0xc6, 0xb0, 0x8e, 0x88]);
        // The header CRC: recomputed with the field zeroed.
        let mut h = t[..SYSTEM_TABLE_LEN].to_vec();
        let crc = u32::from_le_bytes(h[16..20].try_into().unwrap());
        h[16..20].fill(0);
        assert_eq!(crc32(&h), crc);
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    fn cfg() -> Dom0EfiConfig {
        Dom0EfiConfig {
            ram: Region { base: 0x4000_0000, size: 0x4000_0000 },
            area: Region { base: 0x7fe0_0000, size: 0x20_0000 },
            bootargs: String::from("console=ttyAMA0 acpi=force"),
            initrd: Some(Region { base: 0x4800_0000, size: 0x10_0000 }),
            firmware: alloc::vec![MemoryDescriptor {
                ty: memory_type::ACPI_RECLAIM,
                phys_start: 0x1_3f00_0000,
                pages: 4,
                attribute: EFI_MEMORY_WB
            }],
            mmio: alloc::vec![Region { base: 0x0a00_0000, size: 0x200 }],
            control: Some(Region { base: 0x4020_0000, size: 0x1000 }),
        }
    }

    #[test]
    fn memory_map_has_ram_the_area_firmware_and_mmio() {
        let m = memory_map(&cfg()).unwrap();
        let map = MemoryMap::new(&m, MEMORY_DESCRIPTOR_LEN).unwrap();
        let d: Vec<_> = map.iter().map(|d| (d.ty, d.phys_start, d.pages)).collect();
        assert_eq!(
            d,
            [
                (memory_type::MMIO, 0x0a00_0000, 1),
                (memory_type::CONVENTIONAL, 0x4000_0000, (0x7fe0_0000 - 0x4000_0000) / 4096),
                (memory_type::ACPI_RECLAIM, 0x7fe0_0000, 0x200),
                (memory_type::ACPI_RECLAIM, 0x1_3f00_0000, 4),
            ]
        );
        // Linux's view: the RAM the OS owns is Dom0's RAM below the area.
        assert_eq!(map.ram().unwrap(), [Region { base: 0x4000_0000, size: 0x3fe0_0000 }]);
    }

    #[test]
    fn firmware_or_mmio_inside_dom0_ram_is_refused() {
        let mut c = cfg();
        c.mmio.push(Region { base: 0x5000_0000, size: 0x1000 });
        assert_eq!(memory_map(&c), Err(Dom0EfiError::BadArea));
        let mut c = cfg();
        c.firmware[0].phys_start = 0x7fff_f000;
        assert_eq!(memory_map(&c), Err(Dom0EfiError::BadArea));
    }

    #[test]
    fn chosen_dt_has_the_uefi_properties() {
        let mmap = Region { base: 0x7fe1_1000, size: 200 };
        let b = chosen_dtb("acpi=force", Some(Region { base: 0x4800_0000, size: 0x1000 }), 0x7fe1_0000, mmap, None)
            .unwrap();
        let fdt = fdt::Fdt::new(&b).unwrap();
        let chosen = fdt.find_node("/chosen").unwrap();
        let u64p = |n: &str| u64::from_be_bytes(chosen.property(n).unwrap().value.try_into().unwrap());
        let u32p = |n: &str| u32::from_be_bytes(chosen.property(n).unwrap().value.try_into().unwrap());
        assert_eq!(u64p("linux,uefi-system-table"), 0x7fe1_0000);
        assert_eq!(u64p("linux,uefi-mmap-start"), 0x7fe1_1000);
        assert_eq!(u32p("linux,uefi-mmap-size"), 200);
        assert_eq!(u32p("linux,uefi-mmap-desc-size"), 40);
        assert_eq!(u32p("linux,uefi-mmap-desc-ver"), 1);
        assert_eq!(u32p("linux,uefi-secure-boot"), 0);
        assert_eq!(u64p("linux,initrd-end"), 0x4800_1000);
        assert_eq!(chosen.property("bootargs").unwrap().as_str(), Some("acpi=force"));
        // Only /chosen under the root (Linux then picks ACPI).
        assert_eq!(fdt.find_node("/").unwrap().children().count(), 1);
    }

    fn host() -> Tables<'static> {
        const MEM: &[u8] = include_bytes!("acpi/testdata/qemu-virt-mem-77130000.bin");
        Tables::from_rsdp(&MemImage { base: 0x7713_0000, bytes: MEM }, 0x7713_0018).unwrap()
    }

    #[test]
    fn whole_blob_on_qemu_tables() {
        let acpi = Dom0AcpiConfig { vcpu_mpidrs: alloc::vec![0, 1], ..Default::default() };
        let e = build_dom0_efi(&host(), &acpi, &cfg()).unwrap();
        let area = cfg().area;
        assert_eq!(e.dtb, area.base);
        assert_eq!(e.system_table, area.base + SYSTAB_OFF);
        assert_eq!(e.tables.base, area.base + ACPI_OFF);
        // The RSDP the configuration table names parses back from the blob.
        let at = |a: u64| (a - area.base) as usize;
        let st = &e.blob[at(e.system_table)..];
        let rsdp = u64::from_le_bytes(st[CONFIG_TABLE_OFF + 16..CONFIG_TABLE_OFF + 24].try_into().unwrap());
        assert_eq!(rsdp, e.tables.rsdp);
        assert_eq!(&e.blob[at(rsdp)..at(rsdp) + 8], b"RSD PTR ");
        let fdt = fdt::Fdt::new(&e.blob).unwrap();
        let chosen = fdt.find_node("/chosen").unwrap();
        let mmap = u64::from_be_bytes(chosen.property("linux,uefi-mmap-start").unwrap().value.try_into().unwrap());
        assert_eq!(mmap, e.memory_map.base);
        let m = &e.blob[at(mmap)..at(mmap) + e.memory_map.size as usize];
        assert_eq!(MemoryMap::new(m, MEMORY_DESCRIPTOR_LEN).unwrap().len(), 4);
        // The control device, for hvctl (from /sys/firmware/fdt).
        let control = fdt.find_node("/hypervisor/control@40200000").expect("the control node");
        assert_eq!(control.compatible().unwrap().first(), "hvrust,control-1");
    }

    #[test]
    fn bad_area_is_refused() {
        let acpi = Dom0AcpiConfig { vcpu_mpidrs: alloc::vec![0], ..Default::default() };
        let mut c = cfg();
        c.area.base += 0x800;
        assert_eq!(build_dom0_efi(&host(), &acpi, &c), Err(Dom0EfiError::BadArea));
        let mut c = cfg();
        c.area.base = c.ram.end();
        assert_eq!(build_dom0_efi(&host(), &acpi, &c), Err(Dom0EfiError::BadArea));
    }
}
