//! The payloads of making a DomU while the machine runs (`hvctl create`,
//! docs/hvctl.md "Creating a domain"): `CREATE`'s `key=value` lines
//! ([`CreateSpec`]), `LOAD`'s list of Dom0 pages, and the checksum both
//! sides compute over what a `LOAD` copied ([`Fnv64`]).
//!
//! Contract: [`CreateSpec::parse`] accepts only what [`CreateSpec::write`]
//! can produce for valid values, bounded in every field; anything else is
//! [`Status::Inval`] or [`Status::Range`], never a panic.

use super::Status;
use core::fmt;

/// Longest domain name (`xl.cfg`'s `name`): `[A-Za-z0-9_.-]`.
pub const NAME_MAX: usize = 32;
/// Longest kernel command line (`extra`): printable ASCII.
pub const EXTRA_MAX: usize = 1024;
/// Most vCPUs of a created domain (the vGIC's limit is higher; this keeps
/// one request's memory small).
pub const MAX_VCPUS: u32 = 64;
/// Most RAM of a created domain, in MiB (the pool bounds it first).
pub const MAX_MEMORY_MIB: u32 = 1 << 20;
/// Most RAM disk, in MiB.
pub const MAX_DISK_MIB: u32 = 1 << 16;
/// Largest kernel or ramdisk file a `LOAD` may fill (1 GiB).
pub const MAX_MODULE_BYTES: u64 = 1 << 30;
/// The unit `LOAD` names: a 4 KiB page of Dom0's RAM.
pub const PAGE: u64 = 4096;

/// Which file a `LOAD` fills (`arg1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Module {
    Kernel = 0,
    Ramdisk = 1,
}

impl Module {
    pub fn from_arg(a: u32) -> Result<Module, Status> {
        match a {
            0 => Ok(Module::Kernel),
            1 => Ok(Module::Ramdisk),
            _ => Err(Status::Inval),
        }
    }
}

/// A domain to make, as `CREATE` carries it: one `key=value` per line, in
/// any order, each key at most once. `name`, `memory_mib`, `vcpus` and
/// `kernel_bytes` are required.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreateSpec<'a> {
    pub name: &'a str,
    pub memory_mib: u32,
    pub vcpus: u32,
    /// Credit2 weight (`cpu_weight`); `None`: the default.
    pub weight: Option<u32>,
    /// Cap in percent of one pCPU; `None`: uncapped.
    pub cap: Option<u32>,
    /// `cpus`: one pCPU for every vCPU, or one per vCPU, comma-separated
    /// (checked here: numbers, and as many as that); `None`: they float.
    pub cpus: Option<&'a str>,
    /// The kernel's command line.
    pub extra: &'a str,
    /// The RAM disk the hypervisor serves it, 0 for none.
    pub disk_mib: u32,
    /// The sizes of the files the `LOAD`s will fill.
    pub kernel_bytes: u64,
    /// 0: no ramdisk.
    pub ramdisk_bytes: u64,
}

/// The pCPUs in `cpus` (see [`CreateSpec::cpus`]).
fn cpu_list(cpus: &str) -> impl Iterator<Item = Option<u32>> + '_ {
    cpus.split(',').map(|c| c.parse::<u32>().ok())
}

impl<'a> CreateSpec<'a> {
    /// Decodes `CREATE`'s payload.
    pub fn parse(payload: &'a [u8]) -> Result<Self, Status> {
        let text = core::str::from_utf8(payload).map_err(|_| Status::Inval)?;
        let mut s = CreateSpec {
            name: "",
            memory_mib: 0,
            vcpus: 0,
            weight: None,
            cap: None,
            cpus: None,
            extra: "",
            disk_mib: 0,
            kernel_bytes: 0,
            ramdisk_bytes: 0,
        };
        let mut seen = 0u16;
        for line in text.lines().filter(|l| !l.is_empty()) {
            let (key, val) = line.split_once('=').ok_or(Status::Inval)?;
            let bit = s.set(key, val)?;
            if seen & bit != 0 {
                return Err(Status::Inval);
            }
            seen |= bit;
        }
        s.check()?;
        Ok(s)
    }

    /// Takes one `key=value`; returns the key's bit (each key once).
    fn set(&mut self, key: &str, val: &'a str) -> Result<u16, Status> {
        let num = |v: &str| v.parse::<u64>().map_err(|_| Status::Inval);
        let small = |v: &str, max: u32| match num(v)? {
            n if n > u64::from(max) => Err(Status::Range),
            n => Ok(n as u32),
        };
        Ok(match key {
            "name" => {
                self.name = val;
                1
            }
            "memory_mib" => {
                self.memory_mib = small(val, MAX_MEMORY_MIB)?;
                2
            }
            "vcpus" => {
                self.vcpus = small(val, MAX_VCPUS)?;
                4
            }
            "weight" => {
                self.weight = Some(small(val, crate::sched::domain::MAX_WEIGHT)?);
                8
            }
            "cap" => {
                self.cap = Some(small(val, 100 * MAX_VCPUS)?).filter(|&c| c > 0);
                16
            }
            "cpus" => {
                self.cpus = Some(val);
                32
            }
            "extra" => {
                self.extra = val;
                64
            }
            "disk_mib" => {
                self.disk_mib = small(val, MAX_DISK_MIB)?;
                128
            }
            "kernel_bytes" => {
                self.kernel_bytes = num(val)?;
                256
            }
            "ramdisk_bytes" => {
                self.ramdisk_bytes = num(val)?;
                512
            }
            _ => return Err(Status::Inval),
        })
    }

    /// Every field in its range.
    fn check(&self) -> Result<(), Status> {
        let name_ok = (1..=NAME_MAX).contains(&self.name.len())
            && self.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        let extra_ok = self.extra.len() <= EXTRA_MAX && self.extra.bytes().all(|b| (b' '..=b'~').contains(&b));
        if !name_ok || !extra_ok || self.memory_mib == 0 || self.vcpus == 0 || self.kernel_bytes == 0 {
            return Err(Status::Inval);
        }
        if self.weight == Some(0) || self.kernel_bytes > MAX_MODULE_BYTES || self.ramdisk_bytes > MAX_MODULE_BYTES {
            return Err(Status::Range);
        }
        if self.cap.is_some_and(|c| c > 100 * self.vcpus) {
            return Err(Status::Range);
        }
        if let Some(c) = self.cpus {
            let n = cpu_list(c).count();
            if cpu_list(c).any(|p| p.is_none()) || (n != 1 && n != self.vcpus as usize) {
                return Err(Status::Inval);
            }
        }
        Ok(())
    }

    /// The pCPU vCPU `v` is pinned to, if `cpus` pins it.
    pub fn pcpu_of(&self, v: u32) -> Option<u32> {
        let c = self.cpus?;
        let n = cpu_list(c).count();
        cpu_list(c).nth(if n == 1 { 0 } else { v as usize }).flatten()
    }

    /// `CREATE`'s payload for this spec ([`CreateSpec::parse`] reads it back).
    pub fn write(&self, out: &mut impl fmt::Write) -> fmt::Result {
        writeln!(out, "name={}", self.name)?;
        writeln!(out, "memory_mib={}", self.memory_mib)?;
        writeln!(out, "vcpus={}", self.vcpus)?;
        if let Some(w) = self.weight {
            writeln!(out, "weight={w}")?;
        }
        if let Some(c) = self.cap {
            writeln!(out, "cap={c}")?;
        }
        if let Some(c) = self.cpus {
            writeln!(out, "cpus={c}")?;
        }
        if !self.extra.is_empty() {
            writeln!(out, "extra={}", self.extra)?;
        }
        writeln!(out, "disk_mib={}", self.disk_mib)?;
        writeln!(out, "kernel_bytes={}", self.kernel_bytes)?;
        writeln!(out, "ramdisk_bytes={}", self.ramdisk_bytes)
    }
}

/// Whether the page at `pa` lies wholly in `ram` (Dom0's RAM, which `LOAD`
/// reads through its identity map): never the hypervisor's memory, the
/// pool's or another VM's, and no address that wraps.
pub fn page_in(ram: &crate::region::Region, pa: u64) -> bool {
    pa >= ram.base && pa.checked_add(PAGE).is_some_and(|e| e <= ram.end())
}

/// `LOAD`'s payload: little-endian u64 addresses of 4 KiB pages of Dom0's
/// RAM (each aligned), at least one.
pub fn load_pages(payload: &[u8]) -> Result<&[u8], Status> {
    if payload.is_empty() || !payload.len().is_multiple_of(8) {
        return Err(Status::Inval);
    }
    let aligned = payload.chunks_exact(8).all(|c| page_addr(c).is_multiple_of(PAGE));
    if !aligned {
        return Err(Status::Inval);
    }
    Ok(payload)
}

/// The page address in one 8-byte entry of a `LOAD` payload.
pub fn page_addr(entry: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&entry[..8]);
    u64::from_le_bytes(w)
}

/// FNV-1a, 64 bits: what `LOAD` answers over the bytes it copied
/// (`fnv=<16 hex digits>`), so that the tool sees the hypervisor read what
/// it meant to give (a page Dom0's kernel moved meanwhile would not match).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fnv64(pub u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv64 {
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::String;

    fn spec() -> CreateSpec<'static> {
        CreateSpec {
            name: "guest-1",
            memory_mib: 256,
            vcpus: 2,
            weight: Some(512),
            cap: Some(50),
            cpus: Some("0,1"),
            extra: "console=ttyAMA0 guestcmd=ZWNobyBoaQ==",
            disk_mib: 16,
            kernel_bytes: 27 << 20,
            ramdisk_bytes: 7 << 20,
        }
    }

    #[test]
    fn a_written_spec_parses_back() {
        let mut s = String::new();
        spec().write(&mut s).unwrap();
        assert_eq!(CreateSpec::parse(s.as_bytes()), Ok(spec()));
        let bare = CreateSpec { weight: None, cap: None, cpus: None, extra: "", ramdisk_bytes: 0, ..spec() };
        let mut s = String::new();
        bare.write(&mut s).unwrap();
        assert_eq!(CreateSpec::parse(s.as_bytes()), Ok(bare));
    }

    #[test]
    fn bad_specs_are_refused() {
        let base = "name=a\nmemory_mib=64\nvcpus=1\nkernel_bytes=10\n";
        assert!(CreateSpec::parse(base.as_bytes()).is_ok());
        for (extra, want) in [
            ("name=b\n", Status::Inval),
            ("bogus=1\n", Status::Inval),
            ("weight=0\n", Status::Range),
            ("weight=70000\n", Status::Range),
            ("cap=101\n", Status::Range),
            ("cpus=0,1\n", Status::Inval),
            ("cpus=x\n", Status::Inval),
            ("ramdisk_bytes=99999999999\n", Status::Range),
            ("extra=\u{7f}\n", Status::Inval),
            ("disk_mib=-1\n", Status::Inval),
            ("no equals sign\n", Status::Inval),
        ] {
            let text = alloc::format!("{base}{extra}");
            assert_eq!(CreateSpec::parse(text.as_bytes()), Err(want), "{extra:?}");
        }
        for missing in ["name=a\n", "memory_mib=64\n", "vcpus=1\n", "kernel_bytes=10\n"] {
            assert_eq!(CreateSpec::parse(base.replace(missing, "").as_bytes()), Err(Status::Inval), "{missing}");
        }
        assert_eq!(CreateSpec::parse(b"name=\xff\n"), Err(Status::Inval));
        assert_eq!(CreateSpec::parse(base.replace("name=a", "name=a b").as_bytes()), Err(Status::Inval));
        assert_eq!(CreateSpec::parse(base.replace("vcpus=1", "vcpus=65").as_bytes()), Err(Status::Range));
    }

    #[test]
    fn cpus_pins_every_vcpu_or_each() {
        let one = CreateSpec { cpus: Some("3"), ..spec() };
        assert_eq!((one.pcpu_of(0), one.pcpu_of(1)), (Some(3), Some(3)));
        assert_eq!((spec().pcpu_of(0), spec().pcpu_of(1)), (Some(0), Some(1)));
        assert_eq!(CreateSpec { cpus: None, ..spec() }.pcpu_of(0), None);
    }

    #[test]
    fn loaded_pages_must_be_dom0s_ram() {
        let ram = crate::region::Region { base: 0x4000_0000, size: 0x4000_0000 };
        assert!(page_in(&ram, 0x4000_0000));
        assert!(page_in(&ram, 0x7fff_f000), "the last page");
        assert!(!page_in(&ram, 0x8000_0000), "just past its end (the hypervisor, the pool)");
        assert!(!page_in(&ram, 0x3fff_f000), "below it");
        assert!(!page_in(&ram, 0x7fff_f800), "straddling its end");
        assert!(!page_in(&ram, !(PAGE - 1)), "the top page");
        let top = crate::region::Region { base: u64::MAX - 2 * PAGE + 1, size: 2 * PAGE - 1 };
        assert!(!page_in(&top, u64::MAX - PAGE + 1));
    }

    #[test]
    fn load_pages_are_aligned_words() {
        let mut p = alloc::vec::Vec::new();
        p.extend_from_slice(&0x4000_0000u64.to_le_bytes());
        p.extend_from_slice(&0x4000_1000u64.to_le_bytes());
        assert_eq!(load_pages(&p).map(|b| b.len()), Ok(16));
        assert_eq!(page_addr(&p[8..]), 0x4000_1000);
        assert_eq!(load_pages(&p[..12]), Err(Status::Inval));
        assert_eq!(load_pages(&[]), Err(Status::Inval));
        p[8] = 8;
        assert_eq!(load_pages(&p), Err(Status::Inval));
    }

    #[test]
    fn fnv_matches_the_reference_vectors() {
        let mut h = Fnv64::default();
        h.update(b"");
        assert_eq!(h.0, 0xcbf2_9ce4_8422_2325);
        let mut h = Fnv64::default();
        h.update(b"a");
        assert_eq!(h.0, 0xaf63_dc4c_8601_ec8c);
        let mut h = Fnv64::default();
        h.update(b"foobar");
        assert_eq!(h.0, 0x8594_4171_f739_67e8);
    }
}
