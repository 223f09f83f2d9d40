//! The readable and writable byte streams of a chain (virtio 1.2 §2.6.4:
//! the device assumes nothing about how a request's bytes are split into
//! descriptors). Copies between those streams and the device's buffers go
//! through [`GuestMemory`], never through a reference into guest RAM.

use super::super::buf::DataBuf;
use super::super::queue::Segment;
use super::super::{GuestMemory, MemError};

pub(super) fn stream_len(segs: &[Segment], writable: bool) -> u64 {
    segs.iter().filter(|s| s.writable == writable).map(|s| u64::from(s.len)).sum()
}

/// Copy `buf.len()` bytes starting at byte `skip` of the readable stream.
pub(super) fn gather(mem: &dyn GuestMemory, segs: &[Segment], mut skip: u64, buf: &mut [u8]) -> Result<(), MemError> {
    let mut done = 0usize;
    for s in segs.iter().filter(|s| !s.writable) {
        if done == buf.len() {
            break;
        }
        let len = u64::from(s.len);
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = ((len - skip) as usize).min(buf.len() - done);
        let gpa = s.addr.checked_add(skip).ok_or(MemError::OutOfRange { gpa: s.addr, len })?;
        mem.read(gpa, &mut buf[done..done + n])?;
        done += n;
        skip = 0;
    }
    Ok(())
}

/// Copy `data` to the writable stream from its byte `skip`.
pub(super) fn scatter(mem: &mut dyn GuestMemory, segs: &[Segment], mut skip: u64, data: &[u8]) -> Result<(), MemError> {
    let mut done = 0usize;
    for s in segs.iter().filter(|s| s.writable) {
        if done == data.len() {
            break;
        }
        let len = u64::from(s.len);
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = ((len - skip) as usize).min(data.len() - done);
        let gpa = s.addr.checked_add(skip).ok_or(MemError::OutOfRange { gpa: s.addr, len })?;
        mem.write(gpa, &data[done..done + n])?;
        done += n;
        skip = 0;
    }
    Ok(())
}

/// Copy all of `data` to the start of the writable stream.
pub(super) fn scatter_buf(mem: &mut dyn GuestMemory, segs: &[Segment], data: &DataBuf) -> Result<(), MemError> {
    let mut at = 0u64;
    for c in data.chunks() {
        scatter(mem, segs, at, c)?;
        at += c.len() as u64;
    }
    Ok(())
}

/// Copy the readable stream from byte `skip` into `data`.
pub(super) fn gather_buf(
    mem: &dyn GuestMemory,
    segs: &[Segment],
    skip: u64,
    data: &mut DataBuf,
) -> Result<(), MemError> {
    let mut at = skip;
    for c in data.chunks_mut() {
        gather(mem, segs, at, c)?;
        at += c.len() as u64;
    }
    Ok(())
}
