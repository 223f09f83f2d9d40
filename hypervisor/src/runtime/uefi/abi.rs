//! The UEFI structures and constants the EFI half uses, as raw
//! `#[repr(C)]` layouts (UEFI 2.10 sections 4.3, 4.4, 7, 12.4).

use crate::firmware::uefi::Guid;
use core::ffi::c_void;

pub(super) type Status = usize;
pub(super) const EFI_SUCCESS: Status = 0;
pub(super) const EFI_ERROR: Status = 1 << 63;
pub(super) const EFI_LOAD_ERROR: Status = EFI_ERROR | 1;
pub(super) const EFI_INVALID_PARAMETER: Status = EFI_ERROR | 2;
pub(super) const EFI_UNSUPPORTED: Status = EFI_ERROR | 3;

/// "IBI SYST" and "BOOTSERV": the tables' header signatures.
pub(super) const SYSTEM_TABLE_SIGNATURE: u64 = 0x5453_5953_2049_4249;
pub(super) const BOOT_SERVICES_SIGNATURE: u64 = 0x5652_4553_544f_4f42;

#[repr(C)]
pub(super) struct TableHeader {
    pub(super) signature: u64,
    pub(super) revision: u32,
    pub(super) header_size: u32,
    pub(super) crc32: u32,
    pub(super) reserved: u32,
}

#[repr(C)]
pub(super) struct SystemTable {
    pub(super) hdr: TableHeader,
    pub(super) firmware_vendor: *const u16,
    pub(super) firmware_revision: u32,
    pub(super) console_in_handle: *mut c_void,
    pub(super) con_in: *mut c_void,
    pub(super) console_out_handle: *mut c_void,
    pub(super) con_out: *mut SimpleTextOutput,
    pub(super) standard_error_handle: *mut c_void,
    pub(super) std_err: *mut c_void,
    pub(super) runtime_services: *mut c_void,
    pub(super) boot_services: *const BootServices,
    pub(super) number_of_table_entries: usize,
    pub(super) configuration_table: *const ConfigurationTable,
}

#[repr(C)]
pub(super) struct ConfigurationTable {
    pub(super) vendor_guid: [u8; 16],
    pub(super) vendor_table: *const c_void,
}

#[repr(C)]
pub(super) struct SimpleTextOutput {
    pub(super) reset: usize,
    pub(super) output_string: extern "efiapi" fn(*mut SimpleTextOutput, *const u16) -> Status,
}

/// `EFI_BOOT_SERVICES` up to ExitBootServices; the entries this module
/// does not call are `usize` placeholders.
#[repr(C)]
pub(super) struct BootServices {
    pub(super) hdr: TableHeader,
    pub(super) raise_tpl: usize,
    pub(super) restore_tpl: usize,
    pub(super) allocate_pages: extern "efiapi" fn(u32, u32, usize, *mut u64) -> Status,
    pub(super) free_pages: usize,
    pub(super) get_memory_map: extern "efiapi" fn(*mut usize, *mut u8, *mut usize, *mut usize, *mut u32) -> Status,
    pub(super) allocate_pool: usize,
    pub(super) free_pool: usize,
    pub(super) create_event: usize,
    pub(super) set_timer: usize,
    pub(super) wait_for_event: usize,
    pub(super) signal_event: usize,
    pub(super) close_event: usize,
    pub(super) check_event: usize,
    pub(super) install_protocol_interface: usize,
    pub(super) reinstall_protocol_interface: usize,
    pub(super) uninstall_protocol_interface: usize,
    pub(super) handle_protocol: extern "efiapi" fn(*mut c_void, *const Guid, *mut *mut c_void) -> Status,
    pub(super) reserved: usize,
    pub(super) register_protocol_notify: usize,
    pub(super) locate_handle: usize,
    pub(super) locate_device_path: usize,
    pub(super) install_configuration_table: usize,
    pub(super) load_image: usize,
    pub(super) start_image: usize,
    pub(super) exit: usize,
    pub(super) unload_image: usize,
    pub(super) exit_boot_services: extern "efiapi" fn(*mut c_void, usize) -> Status,
}

/// `EFI_LOADED_IMAGE_PROTOCOL` up to the device the image was loaded from.
#[repr(C)]
pub(super) struct LoadedImage {
    pub(super) revision: u32,
    pub(super) parent_handle: *mut c_void,
    pub(super) system_table: *const SystemTable,
    pub(super) device_handle: *mut c_void,
}

#[repr(C)]
pub(super) struct SimpleFileSystem {
    pub(super) revision: u64,
    pub(super) open_volume: extern "efiapi" fn(*mut SimpleFileSystem, *mut *mut FileProtocol) -> Status,
}

/// `EFI_FILE_PROTOCOL` up to Read.
#[repr(C)]
pub(super) struct FileProtocol {
    pub(super) revision: u64,
    pub(super) open: extern "efiapi" fn(*mut FileProtocol, *mut *mut FileProtocol, *const u16, u64, u64) -> Status,
    pub(super) close: extern "efiapi" fn(*mut FileProtocol) -> Status,
    pub(super) delete: usize,
    pub(super) read: extern "efiapi" fn(*mut FileProtocol, *mut usize, *mut u8) -> Status,
    pub(super) write: usize,
    pub(super) get_position: usize,
    pub(super) set_position: usize,
    pub(super) get_info: extern "efiapi" fn(*mut FileProtocol, *const Guid, *mut usize, *mut u8) -> Status,
}

pub(super) const LOADED_IMAGE_PROTOCOL_GUID: Guid =
    Guid::new(0x5b1b_31a1, 0x9562, 0x11d2, [0x8e, 0x3f, 0x00, 0xa0, 0xc9, 0x69, 0x72, 0x3b]);
pub(super) const SIMPLE_FILE_SYSTEM_PROTOCOL_GUID: Guid =
    Guid::new(0x964e_5b22, 0x6459, 0x11d2, [0x8e, 0x39, 0x00, 0xa0, 0xc9, 0x69, 0x72, 0x3b]);
pub(super) const FILE_INFO_GUID: Guid =
    Guid::new(0x0957_6e92, 0x6d3f, 0x11d2, [0x8e, 0x39, 0x00, 0xa0, 0xc9, 0x69, 0x72, 0x3b]);
pub(super) const EFI_FILE_MODE_READ: u64 = 1;
/// AllocatePages: `AllocateAnyPages`, memory type `EfiLoaderData` (the OS
/// owns it after ExitBootServices).
pub(super) const ALLOCATE_ANY_PAGES: u32 = 0;
pub(super) const LOADER_DATA: u32 = 2;

/// A failed firmware call: what was being done, and the status.
pub(super) type EfiFail = (&'static str, Status);
