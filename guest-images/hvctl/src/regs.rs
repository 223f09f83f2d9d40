//! The control device's register page: the [`Regs`] trait the transaction
//! logic is written against, and its real implementation over a `/dev/mem`
//! mapping ([`DevMem`]), the crate's only `unsafe` code.
//!
//! The mapping is Device memory and every access traps to the hypervisor,
//! which decodes only single aligned 32- and 64-bit loads and stores: each
//! access here is one `read_volatile`/`write_volatile` of exactly that
//! size, never a slice copy.

use hv_core::control::FRAME_SIZE;
use std::ffi::CString;

/// One access to the register page at byte offset `off` (a `reg::*`).
pub trait Regs {
    /// An aligned 32-bit load.
    fn read32(&self, off: u64) -> u32;
    /// An aligned 64-bit load.
    fn read64(&self, off: u64) -> u64;
    /// An aligned 64-bit store.
    fn write64(&self, off: u64, v: u64);
}

/// The register page mapped from `/dev/mem` (`O_RDWR | O_SYNC`).
pub struct DevMem {
    /// The start of the mapping (page aligned).
    base: *mut u8,
    /// The mapping's length.
    len: usize,
    /// Where the register page starts inside the mapping.
    at: usize,
    fd: libc::c_int,
}

impl DevMem {
    /// Maps [`FRAME_SIZE`] bytes at physical address `phys`.
    pub fn open(phys: u64) -> Result<DevMem, String> {
        let page = 4096u64;
        let map_at = phys & !(page - 1);
        let at = (phys - map_at) as usize;
        let len = at + FRAME_SIZE as usize;
        let path = CString::new("/dev/mem").expect("no NUL in the path");
        let off = libc::off_t::try_from(map_at).map_err(|_| format!("address {phys:#x} out of range"))?;
        // SAFETY: `path` is a NUL-terminated string that outlives the call.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_SYNC | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(format!("/dev/mem: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: a fresh shared mapping of an open descriptor; the kernel
        // picks the address, nothing else in the process aliases it.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, off)
        };
        if base == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            // SAFETY: `fd` was opened above and is not used again.
            unsafe { libc::close(fd) };
            return Err(format!("mapping /dev/mem at {phys:#x}: {e}"));
        }
        Ok(DevMem { base: base.cast(), len, at, fd })
    }

    /// The address of register `off`, checked to lie in the page and be
    /// aligned to `size`.
    fn reg(&self, off: u64, size: u64) -> *mut u8 {
        assert!(off.is_multiple_of(size) && off + size <= FRAME_SIZE, "register access at {off:#x} (size {size})");
        // SAFETY: `at + off + size <= len`, inside the mapping.
        unsafe { self.base.add(self.at + off as usize) }
    }
}

impl Regs for DevMem {
    fn read32(&self, off: u64) -> u32 {
        let p = self.reg(off, 4).cast::<u32>();
        // SAFETY: `p` is 4-byte aligned inside the live mapping (`reg`);
        // one volatile load, the access the device decodes.
        unsafe { p.read_volatile() }
    }

    fn read64(&self, off: u64) -> u64 {
        let p = self.reg(off, 8).cast::<u64>();
        // SAFETY: `p` is 8-byte aligned inside the live mapping (`reg`).
        unsafe { p.read_volatile() }
    }

    fn write64(&self, off: u64, v: u64) {
        let p = self.reg(off, 8).cast::<u64>();
        // SAFETY: `p` is 8-byte aligned inside the live mapping (`reg`).
        unsafe { p.write_volatile(v) }
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        // SAFETY: the mapping and descriptor `open` made; no reference
        // into the mapping outlives `self`.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
            libc::close(self.fd);
        }
    }
}

/// Locks `bytes` in memory (`mlock`): its pages are present and stay so
/// while the hypervisor copies them by physical address.
pub fn lock(bytes: &[u8]) -> Result<(), String> {
    // SAFETY: `bytes` is a live slice; mlock only changes the pages'
    // residency, not their contents.
    let r = unsafe { libc::mlock(bytes.as_ptr().cast(), bytes.len()) };
    if r != 0 {
        return Err(format!("mlock: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}
