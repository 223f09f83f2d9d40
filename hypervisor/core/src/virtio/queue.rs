//! The split virtqueue (virtio 1.2 §2.7), device side.
//!
//! Three guest-owned areas, located by the addresses the driver programmed:
//!
//! ```text
//! descriptor table  16 B × size : addr u64, len u32, flags u16, next u16
//! available ring    flags u16, idx u16, ring[size] u16   (driver → device)
//! used ring         flags u16, idx u16, ring[size] {id u32, len u32}
//! ```
//!
//! Everything read from these areas is untrusted. The walker enforces:
//! head and `next` indices inside the table; a chain no longer than the table
//! it lives in (so a loop ends as [`ChainError::TooLong`] after at most
//! `size` steps); indirect descriptors only when negotiated, only as the last
//! descriptor of a direct chain, never nested, never combined with NEXT, with a
//! length that is a non-zero multiple of 16 and at most [`MAX_INDIRECT`]
//! entries; a total chain length that fits in `u32`. Whether each segment is
//! inside guest RAM is left to the request layer, which can then still report
//! an error in the status byte when only a data segment is bad.
//!
//! Publishing a used element writes the element, then [`GuestMemory::fence`]
//! (`dmb ish` at EL2), then the used index; then another fence before the
//! avail flags are read for the interrupt-suppression decision, so the
//! driver's "re-enable callbacks, then re-check used idx" cannot race us into
//! a lost interrupt.

use super::{GuestMemory, GuestMemoryExt, MemError};
use alloc::vec::Vec;

pub const DESC_F_NEXT: u16 = 1;
pub const DESC_F_WRITE: u16 = 2;
pub const DESC_F_INDIRECT: u16 = 4;
/// In the avail ring's flags: the driver does not want used-buffer interrupts.
pub const AVAIL_F_NO_INTERRUPT: u16 = 1;
/// The largest split queue (§2.7: a power of two, at most 32768).
pub const MAX_QUEUE_SIZE: u16 = 32768;
/// The most entries the device accepts in one indirect table.
pub const MAX_INDIRECT: u32 = 1024;
const DESC_SIZE: u64 = 16;

/// Why a queue cannot be used at all (the device then needs a reset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueError {
    /// QueueReady with a size that is 0, not a power of two, or above the max.
    BadSize(u16),
    /// A ring address not aligned as §2.7 requires (16 / 2 / 4).
    Misaligned { area: &'static str, addr: u64 },
    /// A ring area not entirely inside guest RAM.
    OutsideRam { area: &'static str, addr: u64 },
    /// The avail index moved by more than the queue size since we last looked.
    AvailIdxJump { last_seen: u16, now: u16 },
    /// A ring access failed (the guest RAM shrank? never on a validated queue).
    Mem(MemError),
}

impl From<MemError> for QueueError {
    fn from(e: MemError) -> Self {
        QueueError::Mem(e)
    }
}

/// Why one descriptor chain is unusable (the chain is answered, the queue
/// keeps working).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainError {
    HeadOutOfRange(u16),
    NextOutOfRange(u16),
    /// More descriptors than the table holds: a loop, or a runaway chain.
    TooLong,
    IndirectNotNegotiated,
    NestedIndirect,
    IndirectWithNext,
    BadIndirectLen(u32),
    /// The descriptor (or indirect table) itself is not in guest RAM.
    Mem(MemError),
    /// The segment lengths add up to more than 4 GiB.
    LengthOverflow,
}

impl From<MemError> for ChainError {
    fn from(e: MemError) -> Self {
        ChainError::Mem(e)
    }
}

/// One buffer of a chain, as the driver described it (not yet checked
/// against guest RAM).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub addr: u64,
    pub len: u32,
    /// Device-writable (VIRTQ_DESC_F_WRITE).
    pub writable: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

fn read_desc(mem: &dyn GuestMemory, table: u64, idx: u16) -> Result<Desc, MemError> {
    let gpa =
        table.checked_add(u64::from(idx) * DESC_SIZE).ok_or(MemError::OutOfRange { gpa: table, len: DESC_SIZE })?;
    let mut b = [0u8; 16];
    mem.read(gpa, &mut b)?;
    Ok(Desc {
        addr: u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        len: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
        flags: u16::from_le_bytes([b[12], b[13]]),
        next: u16::from_le_bytes([b[14], b[15]]),
    })
}

/// One split virtqueue's configuration (written by the driver through the
/// transport) and the device's private ring positions.
#[derive(Clone, Debug, Default)]
pub struct SplitQueue {
    /// QueueNum: entries in each ring.
    pub size: u16,
    pub ready: bool,
    /// QueueDesc: descriptor table.
    pub desc: u64,
    /// QueueDriver: available ring.
    pub driver: u64,
    /// QueueDevice: used ring.
    pub device: u64,
    /// Next avail ring position the device will consume.
    last_avail: u16,
    /// Next used ring position the device will fill (= the used idx it last
    /// published).
    used_idx: u16,
}

impl SplitQueue {
    /// A fresh queue with `size` preset to the maximum, as after reset.
    pub fn new(max: u16) -> Self {
        Self { size: max, ..Self::default() }
    }

    /// Check what the driver programmed, at QueueReady = 1.
    pub fn validate(&self, max: u16, mem: &dyn GuestMemory) -> Result<(), QueueError> {
        let n = self.size;
        if n == 0 || !n.is_power_of_two() || n > max || n > MAX_QUEUE_SIZE {
            return Err(QueueError::BadSize(n));
        }
        let n = u64::from(n);
        let areas = [
            ("desc", self.desc, 16, 16 * n),
            ("avail", self.driver, 2, 6 + 2 * n),
            ("used", self.device, 4, 6 + 8 * n),
        ];
        for (area, addr, align, len) in areas {
            if addr % align != 0 {
                return Err(QueueError::Misaligned { area, addr });
            }
            if !mem.contains(addr, len) {
                return Err(QueueError::OutsideRam { area, addr });
            }
        }
        Ok(())
    }

    /// Start consuming from the rings' beginning (QueueReady 0 → 1).
    pub fn activate(&mut self) {
        self.last_avail = 0;
        self.used_idx = 0;
        self.ready = true;
    }

    /// How many new chains the driver has made available. Reads the avail
    /// index once, then fences so that ring entries read afterwards are at
    /// least as new as the index.
    pub fn pending(&self, mem: &dyn GuestMemory) -> Result<u16, QueueError> {
        let idx = mem.read_u16(self.driver.wrapping_add(2))?;
        mem.fence();
        let n = idx.wrapping_sub(self.last_avail);
        if n > self.size {
            return Err(QueueError::AvailIdxJump { last_seen: self.last_avail, now: idx });
        }
        Ok(n)
    }

    /// Read the next head index from the avail ring without consuming it
    /// (call only when [`pending`](Self::pending) is non-zero). The value is
    /// unchecked.
    pub fn peek_head(&self, mem: &dyn GuestMemory) -> Result<u16, QueueError> {
        let slot = u64::from(self.last_avail % self.size.max(1));
        Ok(mem.read_u16(self.driver.wrapping_add(4 + 2 * slot))?)
    }

    /// Consume the avail entry [`peek_head`](Self::peek_head) returned.
    pub fn advance(&mut self) {
        self.last_avail = self.last_avail.wrapping_add(1);
    }

    /// [`peek_head`](Self::peek_head) then [`advance`](Self::advance).
    pub fn pop_head(&mut self, mem: &dyn GuestMemory) -> Result<u16, QueueError> {
        let head = self.peek_head(mem)?;
        self.advance();
        Ok(head)
    }

    /// Walk the chain starting at `head` into `segs` (cleared first).
    pub fn walk_chain(
        &self,
        mem: &dyn GuestMemory,
        head: u16,
        indirect_ok: bool,
        segs: &mut Vec<Segment>,
    ) -> Result<(), ChainError> {
        segs.clear();
        if head >= self.size {
            return Err(ChainError::HeadOutOfRange(head));
        }
        let mut table = self.desc;
        let mut table_len = u32::from(self.size);
        let mut in_indirect = false;
        let mut idx = head;
        let mut steps: u32 = 0;
        let mut total: u32 = 0;
        loop {
            steps += 1;
            if steps > table_len {
                return Err(ChainError::TooLong);
            }
            let d = read_desc(mem, table, idx)?;
            if d.flags & DESC_F_INDIRECT != 0 {
                if !indirect_ok {
                    return Err(ChainError::IndirectNotNegotiated);
                }
                if in_indirect {
                    return Err(ChainError::NestedIndirect);
                }
                if d.flags & DESC_F_NEXT != 0 {
                    return Err(ChainError::IndirectWithNext);
                }
                if d.len == 0 || d.len % DESC_SIZE as u32 != 0 || d.len / DESC_SIZE as u32 > MAX_INDIRECT {
                    return Err(ChainError::BadIndirectLen(d.len));
                }
                if !mem.contains(d.addr, u64::from(d.len)) {
                    return Err(ChainError::Mem(MemError::OutOfRange { gpa: d.addr, len: u64::from(d.len) }));
                }
                table = d.addr;
                table_len = d.len / DESC_SIZE as u32;
                in_indirect = true;
                idx = 0;
                steps = 0;
                continue;
            }
            total = total.checked_add(d.len).ok_or(ChainError::LengthOverflow)?;
            segs.push(Segment { addr: d.addr, len: d.len, writable: d.flags & DESC_F_WRITE != 0 });
            if d.flags & DESC_F_NEXT == 0 {
                return Ok(());
            }
            if u32::from(d.next) >= table_len {
                return Err(ChainError::NextOutOfRange(d.next));
            }
            idx = d.next;
        }
    }

    /// Publish a used element `{id, len}` and return whether the driver
    /// wants an interrupt for it (avail flags without NO_INTERRUPT).
    pub fn push_used(&mut self, mem: &mut dyn GuestMemory, id: u16, len: u32) -> Result<bool, QueueError> {
        let slot = u64::from(self.used_idx % self.size.max(1));
        let elem = self.device.wrapping_add(4 + 8 * slot);
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&u32::from(id).to_le_bytes());
        b[4..].copy_from_slice(&len.to_le_bytes());
        mem.write(elem, &b)?;
        // The element (and the data and status written before it) must be
        // visible before the index that publishes it.
        mem.fence();
        self.used_idx = self.used_idx.wrapping_add(1);
        mem.write_u16(self.device.wrapping_add(2), self.used_idx)?;
        // The index must be visible before we sample the driver's flags.
        mem.fence();
        let flags = mem.read_u16(self.driver)?;
        Ok(flags & AVAIL_F_NO_INTERRUPT == 0)
    }

    /// The used index the device last published.
    pub fn used_idx(&self) -> u16 {
        self.used_idx
    }

    /// The avail ring position the device will consume next.
    pub fn last_avail(&self) -> u16 {
        self.last_avail
    }
}
