//! The backend contract: what the device asks a block backend to do
//! ([`BackendRequest`], [`BackendOp`]), how the backend answers
//! ([`Completion`], [`BackendError`]) and the [`BlockBackend`] trait that
//! `RamBackend` and `PhysDisk` implement. Completion is asynchronous: the
//! backend returns the token it was given, later.

use super::super::buf::DataBuf;

/// What a backend is asked to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendOp {
    /// Read `len` bytes (a multiple of 512) from `sector`.
    Read { sector: u64, len: u32 },
    /// Write `data` (a multiple of 512 bytes, already copied out of the
    /// guest) at `sector`.
    Write { sector: u64, data: DataBuf },
    /// Make every completed write durable.
    Flush,
}

/// One request for a backend; `token` comes back in its [`Completion`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendRequest {
    pub token: u64,
    pub op: BackendOp,
    /// The `now_ns` the caller passed to `process_queue` (for backends with
    /// a service time).
    pub submit_ns: u64,
}

/// A backend failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendError {
    /// The device reported an I/O error.
    Io,
    /// The request lies past the end of the backing store.
    OutOfRange,
    /// Write to a read-only backing store.
    ReadOnly,
    /// No room for another request (should not happen when `free_slots` is
    /// honest; the request gets IOERR).
    Busy,
    /// The hypervisor had no heap for the request's data (the request gets
    /// IOERR; with quotas sized by the boot plan this does not happen).
    NoMemory,
}

/// A finished backend request. For `Read`, `Ok` carries exactly the bytes
/// read; for `Write` and `Flush`, an empty buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub token: u64,
    pub result: Result<DataBuf, BackendError>,
}

/// Where requests go. Completion is asynchronous: `submit` only starts the
/// request; its [`Completion`] reaches the device later through the EL2 code
/// calling [`VirtioBlk::complete`](super::VirtioBlk::complete) (from the physical device's interrupt, or
/// the EL2 timer for [`RamBackend`](crate::virtio::RamBackend)).
pub trait BlockBackend {
    fn submit(&mut self, req: BackendRequest) -> Result<(), BackendError>;
    /// How many more requests `submit` accepts now.
    fn free_slots(&self) -> usize {
        usize::MAX
    }
}
