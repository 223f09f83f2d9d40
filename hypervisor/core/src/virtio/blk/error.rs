//! Why a request went wrong ([`RequestError`], kept as the device's last
//! error and logged) and why a device could not be made
//! ([`QuotaTooSmall`]).

use super::super::queue::{ChainError, QueueError};
use super::super::MemError;
use super::backend::BackendError;
use core::fmt;

/// Why a request was answered IOERR/UNSUPP or not at all (for the log and
/// for tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestError {
    Chain(ChainError),
    /// No device-writable byte for the status.
    NoStatus,
    /// The status byte is outside guest RAM (or its address wraps).
    StatusOutsideRam(u64),
    ShortHeader,
    /// Data in the wrong direction for the request type.
    WrongDirection,
    /// An IN or OUT without data.
    Empty,
    Misaligned(u64),
    TooLarge(u64),
    PastEnd {
        sector: u64,
        len: u64,
    },
    ReadOnly,
    /// A data segment outside guest RAM.
    Mem(MemError),
    Unsupported(u32),
    Backend(BackendError),
    /// The used ring or status could not be written at completion.
    Queue(QueueError),
}

/// A quota too small for even one request of the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaTooSmall {
    /// Bytes the device needs for its largest request.
    pub needed: u64,
    pub limit: u64,
}

impl fmt::Display for QuotaTooSmall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "heap quota of {} bytes leaves less than the {} bytes of the disk's largest request",
            self.limit, self.needed
        )
    }
}
