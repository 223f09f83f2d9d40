//! UEFI, the plain part: what the EFI application (`runtime::uefi`) reads
//! from the firmware, decoded and checked here so it is host-tested.
//!
//! - [`Guid`] and the configuration-table GUID of the ACPI 2.0 RSDP;
//! - [`MemoryMap`]: the descriptors `GetMemoryMap` returns (UEFI 2.10
//!   section 7.2, `EFI_MEMORY_DESCRIPTOR`, stepped by the firmware's
//!   `DescriptorSize`), and the RAM they leave to the OS after
//!   ExitBootServices ([`MemoryMap::ram`]);
//! - [`encode_ucs2`]: text for `SIMPLE_TEXT_OUTPUT.OutputString`;
//! - [`EfiConfig`]: the configuration file next to the application, in
//!   Xen's `xen.cfg` format (sections, `default=`, `options=`, `kernel=`,
//!   `ramdisk=`);
//! - [`machine_line`]: the one log line describing the machine found.
//!
//! Everything here is input from firmware or from a file on the ESP: a bad
//! value is an [`EfiError`] or [`CfgError`], never a panic.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use crate::dtb::Machine;
use crate::region::Region;

/// An `EFI_GUID` as it lies in memory (Data1..Data3 little-endian).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct Guid(pub [u8; 16]);

impl Guid {
    /// Builds a GUID from its textual fields (`d1-d2-d3-d4[0..2]-d4[2..8]`).
    pub const fn new(d1: u32, d2: u16, d3: u16, d4: [u8; 8]) -> Guid {
        let a = d1.to_le_bytes();
        let b = d2.to_le_bytes();
        let c = d3.to_le_bytes();
        Guid([a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d4[0], d4[1], d4[2], d4[3], d4[4], d4[5], d4[6], d4[7]])
    }
}

/// `EFI_ACPI_20_TABLE_GUID` (8868e871-e4f1-11d3-bc22-0080c73c8881): the
/// configuration table entry pointing at the ACPI 2.0+ RSDP.
pub const ACPI_20_TABLE_GUID: Guid =
    Guid::new(0x8868_e871, 0xe4f1, 0x11d3, [0xbc, 0x22, 0x00, 0x80, 0xc7, 0x3c, 0x88, 0x81]);

/// The address of the configuration table entry with `guid`, if any.
pub fn find_config_table(entries: impl IntoIterator<Item = (Guid, u64)>, guid: Guid) -> Option<u64> {
    entries.into_iter().find(|e| e.0 == guid).map(|e| e.1)
}

/// `EFI_MEMORY_TYPE` values the hypervisor tells apart.
pub mod memory_type {
    pub const RESERVED: u32 = 0;
    pub const LOADER_CODE: u32 = 1;
    pub const LOADER_DATA: u32 = 2;
    pub const BOOT_SERVICES_CODE: u32 = 3;
    pub const BOOT_SERVICES_DATA: u32 = 4;
    pub const RUNTIME_SERVICES_CODE: u32 = 5;
    pub const RUNTIME_SERVICES_DATA: u32 = 6;
    pub const CONVENTIONAL: u32 = 7;
    pub const UNUSABLE: u32 = 8;
    pub const ACPI_RECLAIM: u32 = 9;
    pub const ACPI_NVS: u32 = 10;
    pub const MMIO: u32 = 11;
    pub const MMIO_PORT_SPACE: u32 = 12;
    pub const PAL_CODE: u32 = 13;
    pub const PERSISTENT: u32 = 14;
}

/// The UEFI page: `NumberOfPages` counts 4 KiB pages whatever the OS uses.
pub const EFI_PAGE_SIZE: u64 = 4096;

/// Size of the `EFI_MEMORY_DESCRIPTOR` fields (the firmware's stride,
/// `DescriptorSize`, may be larger: 48 on EDK2).
pub const MEMORY_DESCRIPTOR_LEN: usize = 40;

/// One `EFI_MEMORY_DESCRIPTOR`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryDescriptor {
    pub ty: u32,
    pub phys_start: u64,
    pub pages: u64,
    pub attribute: u64,
}

impl MemoryDescriptor {
    /// The region, or `None` when it is empty, unaligned or wraps.
    pub fn region(&self) -> Option<Region> {
        let size = self.pages.checked_mul(EFI_PAGE_SIZE)?;
        (size > 0 && self.phys_start.is_multiple_of(EFI_PAGE_SIZE) && self.phys_start.checked_add(size).is_some())
            .then_some(Region { base: self.phys_start, size })
    }

    /// Memory the OS may use once boot services are gone.
    pub fn is_ram_after_exit(&self) -> bool {
        use memory_type::*;
        matches!(self.ty, LOADER_CODE | LOADER_DATA | BOOT_SERVICES_CODE | BOOT_SERVICES_DATA | CONVENTIONAL)
    }

    /// Normal memory the firmware may have put tables in (RAM of any use,
    /// runtime services, ACPI): not MMIO, not reserved, not unusable.
    pub fn is_memory(&self) -> bool {
        use memory_type::*;
        matches!(
            self.ty,
            LOADER_CODE
                | LOADER_DATA
                | BOOT_SERVICES_CODE
                | BOOT_SERVICES_DATA
                | RUNTIME_SERVICES_CODE
                | RUNTIME_SERVICES_DATA
                | CONVENTIONAL
                | ACPI_RECLAIM
                | ACPI_NVS
        )
    }
}

/// Why firmware data was refused.
#[derive(thiserror::Error, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EfiError {
    /// `DescriptorSize` smaller than the descriptor or not 8-byte aligned.
    #[error("EFI memory map: bad descriptor size {0}")]
    BadDescriptorSize(usize),
    /// The map's size is not a whole number of descriptors.
    #[error("EFI memory map: {size} bytes is not a multiple of the descriptor size {descriptor_size}")]
    BadMapSize { size: usize, descriptor_size: usize },
    /// Descriptor `index` describes an empty, unaligned or wrapping range.
    #[error("EFI memory map: descriptor {index} is not a valid range")]
    BadDescriptor { index: usize },
}

/// The memory map as `GetMemoryMap` wrote it.
#[derive(Clone, Copy, Debug)]
pub struct MemoryMap<'a> {
    bytes: &'a [u8],
    descriptor_size: usize,
}

impl<'a> MemoryMap<'a> {
    /// Checks the descriptor size and that `bytes` holds whole descriptors.
    pub fn new(bytes: &'a [u8], descriptor_size: usize) -> Result<Self, EfiError> {
        if descriptor_size < MEMORY_DESCRIPTOR_LEN || !descriptor_size.is_multiple_of(8) || descriptor_size > 4096 {
            return Err(EfiError::BadDescriptorSize(descriptor_size));
        }
        if !bytes.len().is_multiple_of(descriptor_size) {
            return Err(EfiError::BadMapSize { size: bytes.len(), descriptor_size });
        }
        Ok(MemoryMap { bytes, descriptor_size })
    }

    pub fn len(&self) -> usize {
        self.bytes.len() / self.descriptor_size
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The descriptors, in the firmware's order.
    pub fn iter(&self) -> impl Iterator<Item = MemoryDescriptor> + 'a {
        let u32_at = |d: &[u8], o: usize| u32::from_le_bytes([d[o], d[o + 1], d[o + 2], d[o + 3]]);
        let u64_at = move |d: &[u8], o: usize| u64::from(u32_at(d, o)) | u64::from(u32_at(d, o + 4)) << 32;
        self.bytes.chunks_exact(self.descriptor_size).map(move |d| MemoryDescriptor {
            ty: u32_at(d, 0),
            phys_start: u64_at(d, 8),
            pages: u64_at(d, 24),
            attribute: u64_at(d, 32),
        })
    }

    /// The RAM the OS owns after ExitBootServices, sorted, adjacent
    /// descriptors merged. A descriptor that is not a valid range, or that
    /// overlaps another, is an error (firmware bug or corruption).
    pub fn ram(&self) -> Result<Vec<Region>, EfiError> {
        let mut all = Vec::new();
        for (index, d) in self.iter().enumerate() {
            let r = d.region().ok_or(EfiError::BadDescriptor { index })?;
            all.push((r, d.is_ram_after_exit(), index));
        }
        all.sort_by_key(|e| e.0.base);
        for w in all.windows(2) {
            if w[0].0.end() > w[1].0.base {
                return Err(EfiError::BadDescriptor { index: w[1].2 });
            }
        }
        let mut out: Vec<Region> = Vec::new();
        for (r, _, _) in all.into_iter().filter(|e| e.1) {
            match out.last_mut() {
                Some(last) if last.end() == r.base => last.size += r.size,
                _ => out.push(r),
            }
        }
        Ok(out)
    }

    /// Whether `[addr, addr + len)` lies inside one descriptor of normal
    /// memory ([`MemoryDescriptor::is_memory`]).
    pub fn contains_memory(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else { return false };
        self.iter().any(|d| d.is_memory() && d.region().is_some_and(|r| r.base <= addr && end <= r.end()))
    }
}

/// Writes `s` into `out` as NUL-terminated UCS-2 for `OutputString`, with
/// `\n` as `\r\n` and characters outside the BMP as `?`. Stops early (still
/// NUL-terminated) when `out` is full; returns the number of `s`'s bytes
/// consumed, so a caller prints a long string in pieces. `out` must hold at
/// least 3 elements.
pub fn encode_ucs2(s: &str, out: &mut [u16]) -> usize {
    let mut n = 0;
    let mut used = 0;
    for c in s.chars() {
        let need = if c == '\n' { 2 } else { 1 };
        if n + need + 1 > out.len() {
            break;
        }
        if c == '\n' {
            out[n] = u16::from(b'\r');
            n += 1;
        }
        out[n] = u16::try_from(u32::from(c)).ok().filter(|v| !(0xd800..0xe000).contains(v)).unwrap_or(u16::from(b'?'));
        n += 1;
        used += c.len_utf8();
    }
    if let Some(z) = out.get_mut(n) {
        *z = 0;
    }
    used
}

/// The configuration file's name next to the application (Xen: `xen.cfg`).
pub const CONFIG_FILE: &str = "hypervisor.cfg";

/// What the configuration file says (Xen's `xen.cfg`: a `[global]`
/// section whose `default=` names the section to use, else the first other
/// section; unknown keys are ignored, as Xen ignores the keys of features
/// it was built without).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EfiConfig {
    /// The section used.
    pub section: String,
    /// `options=`: the hypervisor's own command line.
    pub options: String,
    /// `kernel=`: Dom0's kernel file (first word) …
    pub kernel: Option<String>,
    /// … and the rest of that line: Dom0's command line.
    pub kernel_args: String,
    /// `ramdisk=`: Dom0's initrd file.
    pub ramdisk: Option<String>,
}

/// Why the configuration file was refused (1-based line numbers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CfgError {
    /// Not UTF-8 text.
    NotText,
    /// A line that is neither `[section]`, `key=value`, blank nor `#…`.
    BadLine(usize),
    /// `key=value` before the first section.
    OutsideSection(usize),
    /// A key given twice in one section.
    Duplicate { key: String, line: usize },
    /// `default=` names a section the file lacks (or there is none at all).
    NoSection(String),
}

impl fmt::Display for CfgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CfgError::NotText => write!(f, "{CONFIG_FILE}: not UTF-8 text"),
            CfgError::BadLine(l) => write!(f, "{CONFIG_FILE}:{l}: expected [section], key=value or # comment"),
            CfgError::OutsideSection(l) => write!(f, "{CONFIG_FILE}:{l}: key before the first [section]"),
            CfgError::Duplicate { key, line } => write!(f, "{CONFIG_FILE}:{line}: {key} given twice"),
            CfgError::NoSection(s) if s.is_empty() => write!(f, "{CONFIG_FILE}: no section to boot"),
            CfgError::NoSection(s) => write!(f, "{CONFIG_FILE}: no section [{s}]"),
        }
    }
}

/// One `key=value` of a section, with its line number.
type KeyLine = (String, String, usize);

impl EfiConfig {
    /// Parses the file's bytes (a UTF-8 BOM and CRLF line ends allowed).
    pub fn parse(bytes: &[u8]) -> Result<EfiConfig, CfgError> {
        let text = core::str::from_utf8(bytes).map_err(|_| CfgError::NotText)?;
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut sections: Vec<(String, Vec<KeyLine>)> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                sections.push((name.trim().to_string(), Vec::new()));
                continue;
            }
            let Some((k, v)) = line.split_once('=') else { return Err(CfgError::BadLine(i + 1)) };
            let k = k.trim();
            if k.is_empty() || k.contains(char::is_whitespace) {
                return Err(CfgError::BadLine(i + 1));
            }
            let Some((_, keys)) = sections.last_mut() else { return Err(CfgError::OutsideSection(i + 1)) };
            if keys.iter().any(|e| e.0 == k) {
                return Err(CfgError::Duplicate { key: k.to_string(), line: i + 1 });
            }
            keys.push((k.to_string(), v.trim().to_string(), i + 1));
        }
        let get = |keys: &[KeyLine], k: &str| keys.iter().find(|e| e.0 == k).map(|e| e.1.clone());
        let global = sections.iter().find(|s| s.0 == "global");
        let chosen = match global.and_then(|g| get(&g.1, "default")) {
            Some(name) => sections.iter().find(|s| s.0 == name && s.0 != "global").ok_or(CfgError::NoSection(name))?,
            None => sections.iter().find(|s| s.0 != "global").ok_or(CfgError::NoSection(String::new()))?,
        };
        let (kernel, kernel_args) = match get(&chosen.1, "kernel") {
            Some(k) => {
                let (file, args) = k.split_once(char::is_whitespace).unwrap_or((k.as_str(), ""));
                (Some(file.to_string()), args.trim().to_string())
            }
            None => (None, String::new()),
        };
        Ok(EfiConfig {
            section: chosen.0.clone(),
            options: get(&chosen.1, "options").unwrap_or_default(),
            kernel,
            kernel_args,
            ramdisk: get(&chosen.1, "ramdisk"),
        })
    }
}

/// `key`'s value in the section [`EfiConfig::parse`] would use, without
/// allocating (the EFI application looks up file names before the
/// hypervisor has a heap); `None` when the text, section or key is missing.
/// Errors are left to [`EfiConfig::parse`], which runs after the restart.
pub fn config_lookup<'a>(bytes: &'a [u8], key: &str) -> Option<&'a str> {
    let text = core::str::from_utf8(bytes).ok()?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // (section, key, value) of every `key=value` line.
    let entries = || {
        let mut section = None;
        text.lines().filter_map(move |l| {
            let l = l.trim();
            if let Some(name) = l.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = Some(name.trim());
                return None;
            }
            let (k, v) = l.split_once('=').filter(|_| !l.starts_with('#'))?;
            Some((section?, k.trim(), v.trim()))
        })
    };
    let sections = || text.lines().filter_map(|l| l.trim().strip_prefix('[')?.strip_suffix(']').map(str::trim));
    let chosen = match entries().find(|e| e.0 == "global" && e.1 == "default") {
        Some((_, _, name)) => sections().find(|&s| s == name && s != "global")?,
        None => sections().find(|&s| s != "global")?,
    };
    entries().find(|e| e.0 == chosen && e.1 == key).map(|e| e.2)
}

/// The file named by a `kernel=` value (its first word; the rest is Dom0's
/// command line).
pub fn kernel_file(value: &str) -> &str {
    value.split(char::is_whitespace).next().unwrap_or("")
}

/// One line describing the machine: CPUs, GIC, ITS, console UART, PCIe
/// ECAM, PSCI conduit and RAM.
pub fn machine_line(p: &Machine) -> String {
    let mut s = format!(
        "{} CPUs, GICv{} GICD {:#x} GICR {:#x}",
        p.cpus.len(),
        p.gic.version,
        p.gic.gicd.base,
        p.gic.gicr.first().map_or(0, |r| r.base)
    );
    match p.gic.its {
        Some(its) => s.push_str(&format!(", ITS {:#x}", its.base)),
        None => s.push_str(", no ITS"),
    }
    match &p.uart {
        Some(u) => s.push_str(&format!(", UART {} {:#x} INTID {}", u.compatible, u.base, u32::from(u.intid))),
        None => s.push_str(", no UART"),
    }
    for h in &p.pcie {
        s.push_str(&format!(", PCIe ECAM {:#x} buses {}-{}", h.ecam.base, h.bus_range.0, h.bus_range.1));
    }
    s.push_str(&format!(", PSCI {}", p.psci_method.as_deref().unwrap_or("none")));
    let ram: u64 = p.memory.iter().map(|r| r.size).sum();
    s.push_str(&format!(", RAM {} MiB in {} ranges", ram >> 20, p.memory.len()));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::firmware::acpi::{AcpiMachine, MemImage, Tables};
    use alloc::vec;

    fn desc(ty: u32, base: u64, pages: u64, stride: usize) -> Vec<u8> {
        let mut d = vec![0u8; stride];
        d[0..4].copy_from_slice(&ty.to_le_bytes());
        d[8..16].copy_from_slice(&base.to_le_bytes());
        d[16..24].copy_from_slice(&base.to_le_bytes());
        d[24..32].copy_from_slice(&pages.to_le_bytes());
        d[32..40].copy_from_slice(&0xfu64.to_le_bytes());
        d
    }

    #[test]
    fn acpi_guid_has_the_in_memory_byte_order() {
        assert_eq!(
            ACPI_20_TABLE_GUID.0,
            [0x71, 0xe8, 0x68, 0x88, 0xf1, 0xe4, 0xd3, 0x11, 0xbc, 0x22, 0x00, 0x80, 0xc7, 0x3c, 0x88, 0x81]
        );
        let other = Guid::new(1, 2, 3, [0; 8]);
        assert_eq!(
            find_config_table([(other, 1), (ACPI_20_TABLE_GUID, 0x7713_0018)], ACPI_20_TABLE_GUID),
            Some(0x7713_0018)
        );
        assert_eq!(find_config_table([(other, 1)], ACPI_20_TABLE_GUID), None);
    }

    #[test]
    fn memory_map_ram_is_sorted_merged_and_skips_firmware_memory() {
        use memory_type::*;
        let mut m = Vec::new();
        m.extend(desc(CONVENTIONAL, 0x4020_0000, 0x100, 48));
        m.extend(desc(LOADER_DATA, 0x4000_0000, 0x200, 48));
        m.extend(desc(RUNTIME_SERVICES_DATA, 0x4030_0000, 0x10, 48));
        m.extend(desc(BOOT_SERVICES_CODE, 0x4031_0000, 0x10, 48));
        m.extend(desc(ACPI_RECLAIM, 0x4032_0000, 0x10, 48));
        m.extend(desc(MMIO, 0x0400_0000, 0x1000, 48));
        let map = MemoryMap::new(&m, 48).unwrap();
        assert_eq!(map.len(), 6);
        assert_eq!(
            map.ram().unwrap(),
            vec![Region { base: 0x4000_0000, size: 0x30_0000 }, Region { base: 0x4031_0000, size: 0x1_0000 }]
        );
        assert!(map.contains_memory(0x4032_0018, 0x24));
        assert!(!map.contains_memory(0x4032_f000, 0x2000), "crosses into a hole");
        assert!(!map.contains_memory(0x0400_0000, 8), "MMIO is not memory");
        assert!(!map.contains_memory(u64::MAX, 2));
    }

    #[test]
    fn bad_memory_maps_are_errors() {
        assert_eq!(MemoryMap::new(&[0; 48], 36).unwrap_err(), EfiError::BadDescriptorSize(36));
        assert_eq!(MemoryMap::new(&[0; 48], 44).unwrap_err(), EfiError::BadDescriptorSize(44));
        assert_eq!(MemoryMap::new(&[0; 50], 48).unwrap_err(), EfiError::BadMapSize { size: 50, descriptor_size: 48 });
        let mut m = desc(memory_type::CONVENTIONAL, 0x4000_0000, 0x100, 40);
        m.extend(desc(memory_type::CONVENTIONAL, 0x400f_f000, 1, 40));
        assert_eq!(MemoryMap::new(&m, 40).unwrap().ram().unwrap_err(), EfiError::BadDescriptor { index: 1 });
        for bad in [desc(7, 0x4000_0800, 1, 40), desc(7, 0x4000_0000, 0, 40), desc(7, u64::MAX - 4095, 2, 40)] {
            assert_eq!(MemoryMap::new(&bad, 40).unwrap().ram().unwrap_err(), EfiError::BadDescriptor { index: 0 });
        }
        assert_eq!(
            MemoryMap::new(&desc(7, 0, u64::MAX, 40), 40).unwrap().ram().unwrap_err(),
            EfiError::BadDescriptor { index: 0 }
        );
    }

    #[test]
    fn ucs2_adds_carriage_returns_and_splits_long_text() {
        let mut out = [0u16; 8];
        assert_eq!(encode_ucs2("ab\n", &mut out), 3);
        assert_eq!(&out[..5], &[97, 98, 13, 10, 0]);
        assert_eq!(encode_ucs2("\u{1f600}é", &mut out), 6);
        assert_eq!(&out[..3], &[u16::from(b'?'), 0xe9, 0]);
        let long = "0123456789";
        assert_eq!(encode_ucs2(long, &mut out), 7);
        assert_eq!(out[7], 0);
        assert_eq!(encode_ucs2(&long[7..], &mut out), 3);
    }

    #[test]
    fn xen_style_config_picks_the_default_section() {
        let text = b"\xef\xbb\xbf# hypervisor.cfg\r\n[global]\ndefault=dom0\n\n[other]\nkernel=x\n\
                     [dom0]\noptions=loglvl=info dom0_mem=512M\nkernel=vmlinuz console=hvc0 root=/dev/vda\n\
                     ramdisk = initrd.cpio\nxsm=ignored\n";
        let c = EfiConfig::parse(text).unwrap();
        assert_eq!(c.section, "dom0");
        assert_eq!(c.options, "loglvl=info dom0_mem=512M");
        assert_eq!(c.kernel.as_deref(), Some("vmlinuz"));
        assert_eq!(c.kernel_args, "console=hvc0 root=/dev/vda");
        assert_eq!(c.ramdisk.as_deref(), Some("initrd.cpio"));
        let c = EfiConfig::parse(b"[global]\n[a]\nkernel=k\n[b]\n").unwrap();
        assert_eq!((c.section.as_str(), c.kernel.as_deref(), c.kernel_args.as_str()), ("a", Some("k"), ""));
    }

    #[test]
    fn lookup_without_a_heap_agrees_with_the_parser() {
        let texts: [&[u8]; 3] = [
            b"[global]\ndefault=b\n[a]\nkernel=ka x\n[b]\n# c\nkernel = kb y z\nramdisk=rb\n",
            b"[global]\n[a]\nkernel=k\n[b]\nramdisk=r\n",
            b"[only]\nramdisk=r\noptions=o=1\n",
        ];
        for t in texts {
            let c = EfiConfig::parse(t).unwrap();
            assert_eq!(config_lookup(t, "kernel").map(kernel_file), c.kernel.as_deref());
            assert_eq!(config_lookup(t, "ramdisk"), c.ramdisk.as_deref());
            assert_eq!(config_lookup(t, "options").unwrap_or(""), c.options);
        }
        assert_eq!(config_lookup(b"[global]\ndefault=zz\n[a]\nkernel=k\n", "kernel"), None);
        assert_eq!(config_lookup(b"\xff", "kernel"), None);
        assert_eq!(kernel_file("vmlinuz console=hvc0"), "vmlinuz");
    }

    #[test]
    fn bad_config_files_are_errors() {
        assert_eq!(EfiConfig::parse(b"[a]\n\xff=1\n"), Err(CfgError::NotText));
        assert_eq!(EfiConfig::parse(b"[a]\nkernel\n"), Err(CfgError::BadLine(2)));
        assert_eq!(EfiConfig::parse(b"[a]\na b=1\n"), Err(CfgError::BadLine(2)));
        assert_eq!(EfiConfig::parse(b"kernel=x\n[a]\n"), Err(CfgError::OutsideSection(1)));
        assert_eq!(
            EfiConfig::parse(b"[a]\nkernel=x\nkernel=y\n"),
            Err(CfgError::Duplicate { key: "kernel".into(), line: 3 })
        );
        assert_eq!(EfiConfig::parse(b"[global]\ndefault=z\n[a]\n"), Err(CfgError::NoSection("z".into())));
        assert_eq!(EfiConfig::parse(b"[global]\ndefault=global\n"), Err(CfgError::NoSection("global".into())));
        assert_eq!(EfiConfig::parse(b"# nothing\n"), Err(CfgError::NoSection(String::new())));
    }

    #[test]
    fn machine_line_of_qemu_virt_acpi_tables() {
        let mem = MemImage { base: 0x7713_0000, bytes: include_bytes!("acpi/testdata/qemu-virt-mem-77130000.bin") };
        let tables = Tables::from_rsdp(&mem, 0x7713_0018).unwrap();
        let m = AcpiMachine::parse(&tables).unwrap();
        let p = m.to_machine(vec![Region { base: 0x4000_0000, size: 1 << 30 }]).unwrap();
        let line = machine_line(&p);
        for want in [
            "2 CPUs",
            "GICv3 GICD 0x8000000 GICR 0x80a0000",
            "ITS 0x8080000",
            "0x9000000 INTID 33",
            "PCIe ECAM 0x4010000000",
            "RAM 1024 MiB in 1 ranges",
        ] {
            assert!(line.contains(want), "{want:?} not in {line:?}");
        }
    }
}
