//! The hypervisor as an EFI application (UEFI firmware: EDK2 on QEMU,
//! AWS Graviton), in two halves.
//!
//! **In EFI context** ([`hv_efi_main`], called by `efi_entry` in
//! arch/aarch64/entry.rs once the image is relocated): the firmware's MMU
//! setup (identity map), its stack, its exception vectors. Through the
//! system table, and nothing else, it prints a banner on ConOut, finds the
//! ACPI 2.0 RSDP in the configuration table, reads the configuration file,
//! reads the memory map and calls
//! ExitBootServices. The tables are walked as raw `#[repr(C)]` structures
//! (UEFI 2.10 sections 4.3, 4.4, 7, 12.4): five calls do not justify the
//! `uefi` crate, and this code must build for the softfloat bare-metal
//! target like the rest. What it found goes into [`HANDOFF`] (in .data:
//! the restart below neither relocates nor clears it), then
//! `efi_to_primary` turns the firmware's MMU off and starts the image again
//! at `primary_entry`, as after `-kernel`.
//!
//! **In the hypervisor proper** ([`acpi_main`], called from
//! `hv_primary_main` when [`take_handoff`] finds the hand-off): the
//! hypervisor's own MMU, console and heap; it decodes the memory map and
//! the ACPI tables (`firmware::uefi`, `firmware::acpi`), logs the machine,
//! plans where Dom0 goes (`boot::plan`), brings up the GIC, ITS and
//! secondary pCPUs (`boot::bring_up`, as on the DT path) and boots Dom0
//! with ACPI (`firmware::dom0_efi`).
//!
//! Files come from the ESP through the LoadedImage and SimpleFileSystem
//! protocols: the configuration file (Xen's `xen.cfg` format) and the
//! kernel and initrd it names, loaded into `EfiLoaderData` pages. After
//! the restart the boot-layout plan places Dom0 in the memory map's RAM.

use alloc::string::String;
use core::ffi::c_void;
use core::fmt::{self, Write};

use super::dom0::{AcpiDom0, GuestFirmware};
use crate::arch::{cache, smc};
use crate::dtb::{BootInfo, BootModule, Machine};
use crate::firmware::acpi::{AcpiMachine, PhysMem, Tables};
use crate::firmware::uefi::{self, find_config_table, machine_line, EfiConfig, Guid, MemoryMap, ACPI_20_TABLE_GUID};
use crate::hv_fatal;
use crate::region::Region;
use log::info;

mod abi;
mod acpi_boot;

use abi::*;
pub use acpi_boot::acpi_main;

/// The directory files are read from: the removable-media directory
/// (`\EFI\BOOT\`), where xtask puts the application. A name starting
/// with `\` in the configuration file is a path from the volume's root.
const ESP_DIR: &str = "\\EFI\\BOOT\\";
/// The configuration file.
const CONFIG_PATH: &str = "\\EFI\\BOOT\\hypervisor.cfg";

/// Room for the configuration file (a few lines).
const CONFIG_BYTES: usize = 4096;

/// Room for the memory map (EDK2 on QEMU virt: ~60 descriptors of 48
/// bytes; a large server has a few hundred).
const MAP_BYTES: usize = 32 << 10;

/// What the EFI half hands to the hypervisor proper.
#[repr(C)]
pub struct Handoff {
    magic: u64,
    /// The ACPI 2.0 RSDP's address.
    pub rsdp: u64,
    map_size: usize,
    descriptor_size: usize,
    map: [u8; MAP_BYTES],
    /// Bytes of `config` read from [`CONFIG_PATH`] (0: none).
    config_size: usize,
    config: [u8; CONFIG_BYTES],
    /// Dom0's kernel and initrd as loaded into `EfiLoaderData` pages
    /// (size 0: not loaded).
    pub kernel: Region,
    pub ramdisk: Region,
}

impl Handoff {
    /// The memory map as the firmware returned it at ExitBootServices.
    pub fn memory_map(&self) -> Result<MemoryMap<'_>, uefi::EfiError> {
        MemoryMap::new(self.map.get(..self.map_size).unwrap_or(&[]), self.descriptor_size)
    }

    /// The configuration file's bytes, if it was read.
    pub fn config(&self) -> Option<&[u8]> {
        self.config.get(..self.config_size).filter(|c| !c.is_empty())
    }
}

/// `magic` before the EFI half ran (non-zero, so the static is in .data,
/// which the restart at `primary_entry` keeps), and after.
const NOT_EFI: u64 = 0x6e6f_7420_6566_6921;
const FROM_EFI: u64 = 0x6566_6920_626f_6f74;

#[link_section = ".data.efi_handoff"]
static mut HANDOFF: Handoff = Handoff {
    magic: NOT_EFI,
    rsdp: 0,
    map_size: 0,
    descriptor_size: 0,
    map: [0; MAP_BYTES],
    config_size: 0,
    config: [0; CONFIG_BYTES],
    kernel: Region { base: 0, size: 0 },
    ramdisk: Region { base: 0, size: 0 },
};

extern "C" {
    static __image_start: u8;
    static __image_end: u8;
    fn efi_to_primary() -> !;
}

/// ConOut as a `fmt::Write`: text goes out in UCS-2 pieces.
struct ConOut(*mut SimpleTextOutput);

impl Write for ConOut {
    fn write_str(&mut self, mut s: &str) -> fmt::Result {
        let mut buf = [0u16; 128];
        while !s.is_empty() {
            let used = uefi::encode_ucs2(s, &mut buf);
            // SAFETY: `self.0` is the system table's ConOut, valid until
            // ExitBootServices (this is only used before it); `buf` is
            // NUL-terminated UCS-2 that outlives the call.
            let st = unsafe { ((*self.0).output_string)(self.0, buf.as_ptr()) };
            if st & EFI_ERROR != 0 || used == 0 {
                return Err(fmt::Error);
            }
            s = &s[used..];
        }
        Ok(())
    }
}

/// The EFI half (see the module comment). Returns to the firmware only
/// with an error, before ExitBootServices (or when ExitBootServices itself
/// keeps failing).
#[no_mangle]
extern "C" fn hv_efi_main(image: *mut c_void, st: *const SystemTable) -> Status {
    // SAFETY: the firmware passes its system table (UEFI 2.10 section
    // 4.1); its header signature is checked before anything else is read.
    let Some(st) = (unsafe { st.as_ref() }) else { return EFI_INVALID_PARAMETER };
    if st.hdr.signature != SYSTEM_TABLE_SIGNATURE || st.con_out.is_null() {
        return EFI_INVALID_PARAMETER;
    }
    let mut out = ConOut(st.con_out);
    // The linker script's image symbols (addresses only).
    let (start, end) = (core::ptr::addr_of!(__image_start) as u64, core::ptr::addr_of!(__image_end) as u64);
    let _ = writeln!(out, "hypervisor {}: EFI application at {start:#x}-{end:#x}", env!("CARGO_PKG_VERSION"));
    let el = crate::arch::sysreg::current_el();
    if el != 2 {
        let _ = writeln!(out, "EFI: started at EL{el}, not EL2: the firmware must leave EL2 to OS loaders");
        return EFI_UNSUPPORTED;
    }
    // SAFETY: a checked system table's boot services table, valid until
    // ExitBootServices.
    let Some(bs) = (unsafe { st.boot_services.as_ref() }) else { return EFI_INVALID_PARAMETER };
    if bs.hdr.signature != BOOT_SERVICES_SIGNATURE {
        let _ = writeln!(out, "EFI: bad boot services table signature");
        return EFI_INVALID_PARAMETER;
    }
    let config: &[ConfigurationTable] = if st.configuration_table.is_null() {
        &[]
    } else {
        // SAFETY: the firmware's configuration table: this many entries.
        unsafe { core::slice::from_raw_parts(st.configuration_table, st.number_of_table_entries) }
    };
    let entries = config.iter().map(|e| (Guid(e.vendor_guid), e.vendor_table as u64));
    let Some(rsdp) = find_config_table(entries, ACPI_20_TABLE_GUID) else {
        let _ = writeln!(out, "EFI: no ACPI 2.0 RSDP in the configuration table ({} entries)", config.len());
        return EFI_UNSUPPORTED;
    };
    let _ = writeln!(out, "EFI: ACPI 2.0 RSDP at {rsdp:#x}");

    // SAFETY: only this CPU runs (boot services are single-threaded), and
    // nothing else refers to HANDOFF before `take_handoff`.
    let h = unsafe { &mut *core::ptr::addr_of_mut!(HANDOFF) };
    load_boot_files(&mut out, bs, image, h);
    let _ = writeln!(out, "EFI: ExitBootServices");
    // GetMemoryMap, then ExitBootServices with its key; nothing but these
    // two calls in between (no printing). A stale key (the map changed)
    // means: get the map again and retry.
    let mut status = EFI_LOAD_ERROR;
    for attempt in 0..4 {
        let (mut size, mut key, mut dsize, mut dversion) = (MAP_BYTES, 0usize, 0usize, 0u32);
        status = (bs.get_memory_map)(&mut size, h.map.as_mut_ptr(), &mut key, &mut dsize, &mut dversion);
        if status != EFI_SUCCESS {
            if attempt == 0 {
                // Still before any ExitBootServices: ConOut works.
                let _ = writeln!(out, "EFI: GetMemoryMap failed (status {status:#x}, {size} bytes needed)");
            }
            break;
        }
        h.map_size = size;
        h.descriptor_size = dsize;
        status = (bs.exit_boot_services)(image, key);
        if status != EFI_INVALID_PARAMETER {
            break;
        }
    }
    if status != EFI_SUCCESS {
        // Boot services may be gone: no more ConOut.
        return status;
    }
    h.rsdp = rsdp;
    h.magic = FROM_EFI;
    // The restart runs with the MMU and caches off: push every line of the
    // image (HANDOFF included) out to memory and drop it from the caches,
    // so nothing stale is hit when our own MMU turns the caches back on.
    cache::clean_inval_to_poc(start, end - start);
    // SAFETY: boot services are gone and the image is cleaned;
    // `efi_to_primary` never returns.
    unsafe { efi_to_primary() }
}

/// The root directory of the volume the application was loaded from.
struct Volume(*mut FileProtocol);

impl Volume {
    fn open(bs: &BootServices, image: *mut c_void) -> Result<Volume, EfiFail> {
        let mut li: *mut c_void = core::ptr::null_mut();
        check("LoadedImage", (bs.handle_protocol)(image, &LOADED_IMAGE_PROTOCOL_GUID, &mut li))?;
        // SAFETY: the firmware returned its LoadedImage protocol for our
        // image (valid until ExitBootServices); only `device_handle` is read.
        let device = unsafe { (*(li as *const LoadedImage)).device_handle };
        let mut fs: *mut c_void = core::ptr::null_mut();
        check("SimpleFileSystem", (bs.handle_protocol)(device, &SIMPLE_FILE_SYSTEM_PROTOCOL_GUID, &mut fs))?;
        let fs = fs as *mut SimpleFileSystem;
        let mut root: *mut FileProtocol = core::ptr::null_mut();
        // SAFETY: the device's SimpleFileSystem protocol, as the firmware
        // gave it.
        check("OpenVolume", unsafe { ((*fs).open_volume)(fs, &mut root) })?;
        Ok(Volume(root))
    }

    /// Runs `f` on the file `name` ([`ESP_DIR`]-relative unless it starts
    /// with `\`), closing it afterwards.
    fn with_file<T>(&self, name: &str, f: impl FnOnce(File) -> Result<T, EfiFail>) -> Result<T, EfiFail> {
        let mut path = [0u16; 256];
        let prefix = if name.starts_with('\\') { "" } else { ESP_DIR };
        for (n, c) in prefix.chars().chain(name.chars()).enumerate() {
            let c = if c == '/' { '\\' } else { c };
            match u16::try_from(u32::from(c)) {
                // Room for this and the NUL.
                Ok(v) if n + 1 < path.len() => path[n] = v,
                _ => return Err(("file name", EFI_INVALID_PARAMETER)),
            }
        }
        let mut file: *mut FileProtocol = core::ptr::null_mut();
        // SAFETY: `self.0` is the open root directory; `path` is a
        // NUL-terminated UCS-2 path that outlives the call.
        check("Open", unsafe { ((*self.0).open)(self.0, &mut file, path.as_ptr(), EFI_FILE_MODE_READ, 0) })?;
        let r = f(File(file));
        // SAFETY: closes the file opened above, once.
        unsafe { ((*file).close)(file) };
        r
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        // SAFETY: closes the root directory `Volume::open` opened, once.
        unsafe { ((*self.0).close)(self.0) };
    }
}

/// An open file.
struct File(*mut FileProtocol);

impl File {
    /// `FileSize` from `EFI_FILE_INFO` (UEFI 2.10 section 13.5.16).
    fn size(&self) -> Result<u64, EfiFail> {
        let mut info = [0u64; 64];
        let mut len = core::mem::size_of_val(&info);
        // SAFETY: an open file; `info` has `len` bytes, 8-byte aligned.
        check("GetInfo", unsafe { ((*self.0).get_info)(self.0, &FILE_INFO_GUID, &mut len, info.as_mut_ptr().cast()) })?;
        Ok(info[1])
    }

    /// Reads until `len` bytes are at `dst` or the file ends; returns the
    /// number read.
    ///
    /// # Safety
    ///
    /// `dst` must be valid for writes of `len` bytes.
    unsafe fn read(&self, dst: *mut u8, len: usize) -> Result<usize, EfiFail> {
        let mut done = 0;
        while done < len {
            let mut n = len - done;
            // SAFETY: the caller's `dst` range, from `done` on.
            check("Read", unsafe { ((*self.0).read)(self.0, &mut n, dst.add(done)) })?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }
}

fn check(what: &'static str, st: Status) -> Result<(), EfiFail> {
    if st == EFI_SUCCESS {
        Ok(())
    } else {
        Err((what, st))
    }
}

/// Reads the configuration file into `buf`; a file that fills it is too
/// large (its end would be cut off).
fn read_config(vol: &Volume, buf: &mut [u8]) -> Result<usize, EfiFail> {
    vol.with_file(&CONFIG_PATH[ESP_DIR.len()..], |f| {
        // SAFETY: `buf` is valid for its length.
        let n = unsafe { f.read(buf.as_mut_ptr(), buf.len()) }?;
        if n == buf.len() {
            return Err(("too large", EFI_ERROR | 5));
        }
        Ok(n)
    })
}

/// Loads the file `name` into new `EfiLoaderData` pages.
fn load_file(bs: &BootServices, vol: &Volume, name: &str) -> Result<Region, EfiFail> {
    vol.with_file(name, |f| {
        let size = f.size()?;
        let len = usize::try_from(size).map_err(|_| ("file size", EFI_UNSUPPORTED))?;
        if len == 0 {
            return Err(("empty file", EFI_LOAD_ERROR));
        }
        let mut base = 0u64;
        check("AllocatePages", (bs.allocate_pages)(ALLOCATE_ANY_PAGES, LOADER_DATA, len.div_ceil(4096), &mut base))?;
        // SAFETY: the firmware just gave us these pages (identity-mapped,
        // at least `len` bytes).
        let n = unsafe { f.read(base as *mut u8, len) }?;
        if n != len {
            return Err(("short read", EFI_LOAD_ERROR));
        }
        Ok(Region { base, size })
    })
}

/// Reads the configuration file and loads the kernel and initrd it names;
/// prints what it did or why not (the boot goes on without them).
fn load_boot_files(out: &mut ConOut, bs: &BootServices, image: *mut c_void, h: &mut Handoff) {
    let vol = match Volume::open(bs, image) {
        Ok(v) => v,
        Err((what, st)) => {
            let _ = writeln!(out, "EFI: cannot open the boot volume ({what}: status {st:#x})");
            return;
        }
    };
    match read_config(&vol, &mut h.config) {
        Ok(n) => {
            h.config_size = n;
            let _ = writeln!(out, "EFI: read {CONFIG_PATH} ({n} bytes)");
        }
        Err((what, st)) => {
            let _ = writeln!(out, "EFI: no {CONFIG_PATH} ({what}: status {st:#x}); going on without it");
            return;
        }
    }
    let config = &h.config[..h.config_size];
    let files = [
        ("kernel", uefi::config_lookup(config, "kernel").map(uefi::kernel_file)),
        ("ramdisk", uefi::config_lookup(config, "ramdisk")),
    ];
    for (key, name) in files {
        let Some(name) = name.filter(|n| !n.is_empty()) else { continue };
        match load_file(bs, &vol, name) {
            Ok(r) => {
                let _ = writeln!(out, "EFI: loaded {key} {name} at {:#x} ({} bytes)", r.base, r.size);
                *(if key == "kernel" { &mut h.kernel } else { &mut h.ramdisk }) = r;
            }
            Err((what, st)) => {
                let _ = writeln!(out, "EFI: cannot load {key} {name} ({what}: status {st:#x})");
            }
        }
    }
}

/// The EFI hand-off, when this boot came through [`hv_efi_main`]; `None`
/// on every other boot path. Call once, on the primary CPU.
pub fn take_handoff() -> Option<&'static Handoff> {
    // SAFETY: read once on the primary CPU before any secondary runs;
    // nothing writes HANDOFF after the EFI half.
    let h = unsafe { &*core::ptr::addr_of!(HANDOFF) };
    (h.magic == FROM_EFI).then_some(h)
}

/// Physical memory the firmware's map calls normal memory, read through
/// the hypervisor's identity map (normal memory below 512 GiB, outside the
/// platform's device windows).
struct EfiMem<'a>(MemoryMap<'a>);

impl PhysMem for EfiMem<'_> {
    fn read(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let end = addr.checked_add(len as u64)?;
        let mapped =
            end <= 1 << 39 && (addr >> 30..=end.saturating_sub(1) >> 30).all(|g| !crate::platform::is_device_gib(g));
        if len == 0 || !mapped || !self.0.contains_memory(addr, len as u64) {
            return None;
        }
        // SAFETY: the range is normal memory by the firmware's map, and
        // identity-mapped as normal memory; the hypervisor writes none of
        // the firmware's tables (ACPI reclaim/NVS, runtime data) so the
        // shared borrow holds.
        Some(unsafe { core::slice::from_raw_parts(addr as *const u8, len) })
    }
}
