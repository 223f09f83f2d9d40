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
//! `boot::primary_main` when [`take_handoff`] finds the hand-off): the
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
use crate::config::Config;
use crate::dtb::{BootModule, Platform};
use crate::firmware::acpi::{AcpiMachine, PhysMem, Tables};
use crate::firmware::uefi::{self, find_config_table, machine_line, EfiConfig, Guid, MemoryMap, ACPI_20_TABLE_GUID};
use crate::hv_fatal;
use crate::region::Region;
use log::{error, info};

type Status = usize;
const EFI_SUCCESS: Status = 0;
const EFI_ERROR: Status = 1 << 63;
const EFI_LOAD_ERROR: Status = EFI_ERROR | 1;
const EFI_INVALID_PARAMETER: Status = EFI_ERROR | 2;
const EFI_UNSUPPORTED: Status = EFI_ERROR | 3;

/// "IBI SYST" and "BOOTSERV": the tables' header signatures.
const SYSTEM_TABLE_SIGNATURE: u64 = 0x5453_5953_2049_4249;
const BOOT_SERVICES_SIGNATURE: u64 = 0x5652_4553_544f_4f42;

#[repr(C)]
struct TableHeader {
    signature: u64,
    revision: u32,
    header_size: u32,
    crc32: u32,
    reserved: u32,
}

#[repr(C)]
struct SystemTable {
    hdr: TableHeader,
    firmware_vendor: *const u16,
    firmware_revision: u32,
    console_in_handle: *mut c_void,
    con_in: *mut c_void,
    console_out_handle: *mut c_void,
    con_out: *mut SimpleTextOutput,
    standard_error_handle: *mut c_void,
    std_err: *mut c_void,
    runtime_services: *mut c_void,
    boot_services: *const BootServices,
    number_of_table_entries: usize,
    configuration_table: *const ConfigurationTable,
}

#[repr(C)]
struct ConfigurationTable {
    vendor_guid: [u8; 16],
    vendor_table: *const c_void,
}

#[repr(C)]
struct SimpleTextOutput {
    reset: usize,
    output_string: extern "efiapi" fn(*mut SimpleTextOutput, *const u16) -> Status,
}

/// `EFI_BOOT_SERVICES` up to ExitBootServices; the entries this module
/// does not call are `usize` placeholders.
#[repr(C)]
struct BootServices {
    hdr: TableHeader,
    raise_tpl: usize,
    restore_tpl: usize,
    allocate_pages: extern "efiapi" fn(u32, u32, usize, *mut u64) -> Status,
    free_pages: usize,
    get_memory_map: extern "efiapi" fn(*mut usize, *mut u8, *mut usize, *mut usize, *mut u32) -> Status,
    allocate_pool: usize,
    free_pool: usize,
    create_event: usize,
    set_timer: usize,
    wait_for_event: usize,
    signal_event: usize,
    close_event: usize,
    check_event: usize,
    install_protocol_interface: usize,
    reinstall_protocol_interface: usize,
    uninstall_protocol_interface: usize,
    handle_protocol: extern "efiapi" fn(*mut c_void, *const Guid, *mut *mut c_void) -> Status,
    reserved: usize,
    register_protocol_notify: usize,
    locate_handle: usize,
    locate_device_path: usize,
    install_configuration_table: usize,
    load_image: usize,
    start_image: usize,
    exit: usize,
    unload_image: usize,
    exit_boot_services: extern "efiapi" fn(*mut c_void, usize) -> Status,
}

/// `EFI_LOADED_IMAGE_PROTOCOL` up to the device the image was loaded from.
#[repr(C)]
struct LoadedImage {
    revision: u32,
    parent_handle: *mut c_void,
    system_table: *const SystemTable,
    device_handle: *mut c_void,
}

#[repr(C)]
struct SimpleFileSystem {
    revision: u64,
    open_volume: extern "efiapi" fn(*mut SimpleFileSystem, *mut *mut FileProtocol) -> Status,
}

/// `EFI_FILE_PROTOCOL` up to Read.
#[repr(C)]
struct FileProtocol {
    revision: u64,
    open: extern "efiapi" fn(*mut FileProtocol, *mut *mut FileProtocol, *const u16, u64, u64) -> Status,
    close: extern "efiapi" fn(*mut FileProtocol) -> Status,
    delete: usize,
    read: extern "efiapi" fn(*mut FileProtocol, *mut usize, *mut u8) -> Status,
    write: usize,
    get_position: usize,
    set_position: usize,
    get_info: extern "efiapi" fn(*mut FileProtocol, *const Guid, *mut usize, *mut u8) -> Status,
}

const LOADED_IMAGE_PROTOCOL_GUID: Guid =
    Guid::new(0x5b1b_31a1, 0x9562, 0x11d2, [0x8e, 0x3f, 0x00, 0xa0, 0xc9, 0x69, 0x72, 0x3b]);
const SIMPLE_FILE_SYSTEM_PROTOCOL_GUID: Guid =
    Guid::new(0x964e_5b22, 0x6459, 0x11d2, [0x8e, 0x39, 0x00, 0xa0, 0xc9, 0x69, 0x72, 0x3b]);
const FILE_INFO_GUID: Guid = Guid::new(0x0957_6e92, 0x6d3f, 0x11d2, [0x8e, 0x39, 0x00, 0xa0, 0xc9, 0x69, 0x72, 0x3b]);
const EFI_FILE_MODE_READ: u64 = 1;
/// AllocatePages: `AllocateAnyPages`, memory type `EfiLoaderData` (the OS
/// owns it after ExitBootServices).
const ALLOCATE_ANY_PAGES: u32 = 0;
const LOADER_DATA: u32 = 2;

/// A failed firmware call: what was being done, and the status.
type EfiFail = (&'static str, Status);

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

/// The hypervisor proper after an EFI boot: the machine from ACPI, then
/// Dom0 with ACPI.
pub fn acpi_main(h: &'static Handoff) -> ! {
    let map = match h.memory_map() {
        Ok(m) => m,
        Err(e) => hv_fatal!("{e}"),
    };
    let ram = match map.ram() {
        Ok(r) => r,
        Err(e) => hv_fatal!("{e}"),
    };
    info!(
        "EFI boot: RSDP {:#x}, memory map of {} descriptors, {} MiB of RAM in {} ranges",
        h.rsdp,
        map.len(),
        ram.iter().map(|r| r.size).sum::<u64>() >> 20,
        ram.len()
    );
    let mem = EfiMem(map);
    let mut plat: Platform =
        match Tables::from_rsdp(&mem, h.rsdp).and_then(|t| AcpiMachine::parse(&t)).and_then(|m| m.to_platform(ram)) {
            Ok(p) => p,
            Err(e) => hv_fatal!("{e}"),
        };
    info!("ACPI machine: {}", machine_line(&plat));
    let efi_cfg = match h.config().map(EfiConfig::parse) {
        None => {
            info!("EFI boot: no configuration file");
            EfiConfig::default()
        }
        Some(Ok(c)) => c,
        Some(Err(e)) => hv_fatal!("{e}"),
    };
    info!(
        "EFI config [{}]: options \"{}\", kernel {} \"{}\", ramdisk {}",
        efi_cfg.section,
        efi_cfg.options,
        efi_cfg.kernel.as_deref().unwrap_or("(none)"),
        efi_cfg.kernel_args,
        efi_cfg.ramdisk.as_deref().unwrap_or("(none)")
    );
    let cfg = match Config::parse(&efi_cfg.options) {
        Ok(c) => c,
        Err(e) => {
            error!("bad hypervisor option: {e:?}; using defaults");
            Config::default()
        }
    };
    let module = |r: Region, args: Option<String>| {
        (r.size > 0).then_some(BootModule { base: r.base, size: r.size, bootargs: args })
    };
    // Dom0 boots with ACPI from the tables of `firmware::dom0_efi`, and
    // never calls the fake system table's (absent) runtime services.
    let dom0_args = alloc::format!("{} efi=noruntime acpi=force", efi_cfg.kernel_args);
    plat.kernel = module(h.kernel, Some(dom0_args));
    plat.ramdisk = module(h.ramdisk, None);
    plat.bootargs = Some(efi_cfg.options.clone());
    // Where Dom0 would go: the same boot-layout plan as the DTB path, on
    // the RAM of the EFI memory map. The RSDP stands where the DTB would
    // (the firmware's description of the machine, kept).
    let Some(kernel) = plat.kernel.clone() else {
        info!("EFI boot: no Dom0 kernel in the configuration file; powering off");
        super::console::flush();
        smc::psci_system_off()
    };
    let plan = {
        let Some(rsdp) = mem.read(h.rsdp, 36) else { hv_fatal!("ACPI RSDP at {:#x} is not readable", h.rsdp) };
        let image = Region {
            base: core::ptr::addr_of!(__image_start) as u64,
            size: core::ptr::addr_of!(__image_end) as u64 - core::ptr::addr_of!(__image_start) as u64,
        };
        let plan = match super::boot::plan_layout(&plat, &kernel, &cfg, image, rsdp) {
            Ok(plan) => plan,
            Err(e) => hv_fatal!("boot layout: {e}"),
        };
        info!(
            "EFI boot: layout: heap {:#x}-{:#x}, guest RAM {:#x}-{:#x}, kernel {:#x} -> entry {:#x}, initrd {:#x} -> {:#x}",
            plan.heap.base,
            plan.heap.end(),
            plan.guest_ram.base,
            plan.guest_ram.end(),
            kernel.base,
            plan.entry,
            plan.initrd.map_or(0, |c| c.src.base),
            plan.initrd.map_or(0, |c| c.dst.base)
        );
        plan
    };
    // Dom0 with ACPI: the same bring-up as the DT path, then Dom0 with the
    // firmware view of `firmware::dom0_efi`.
    let nr_pcpus = super::boot::bring_up(&plat, &cfg, &plan);
    let tables = match Tables::from_rsdp(&mem, h.rsdp) {
        Ok(t) => t,
        Err(e) => hv_fatal!("{e}"),
    };
    let firmware: alloc::vec::Vec<_> = mem
        .0
        .iter()
        .filter(|d| matches!(d.ty, uefi::memory_type::ACPI_RECLAIM | uefi::memory_type::ACPI_NVS))
        .collect();
    // Dom0's devices (the DSDT's, which the hypervisor does not interpret)
    // are mapped on demand outside this memory (`crate::iomem`), and every
    // SPI but the hypervisor's is Dom0's (`runtime::vm`).
    let memory = mem.0.iter().filter(|d| !matches!(d.ty, uefi::memory_type::MMIO | uefi::memory_type::MMIO_PORT_SPACE));
    let acpi = AcpiDom0 { tables: &tables, firmware, memory: memory.filter_map(|d| d.region()).collect() };
    super::boot::run_dom0(&plat, &cfg, &plan, &GuestFirmware::Acpi(acpi), nr_pcpus)
}
