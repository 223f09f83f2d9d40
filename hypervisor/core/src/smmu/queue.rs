//! SMMU queue pointers and bases (IHI 0070, "SMMU circular queues").
//!
//! A queue of 2^log2 entries has PROD and CONS registers holding an index
//! in bits \[log2-1:0\] and a wrap bit at bit log2, which flips each time
//! the index goes round. Equal indexes mean empty when the wrap bits are
//! equal and full when they differ, so every slot is usable. The command
//! queue's CONS also holds ERR \[30:24\]; the event queue's PROD holds
//! OVFLG \[31\]: neither is part of the pointer.

/// The command queue entries the driver wants (2^8 × 16 bytes = 4 KiB).
pub const CMDQ_LOG2: u32 = 8;
/// The event queue entries the driver wants (2^7 × 32 bytes = 4 KiB).
pub const EVENTQ_LOG2: u32 = 7;
/// The largest log2 size the base registers' LOG2SIZE takes
/// (`IDR1.CMDQS`/`EVENTQS` are at most 19).
pub const MAX_LOG2: u32 = 19;
/// Bytes of a command queue entry.
pub const CMD_ENTRY_BYTES: usize = 16;
/// Bytes of an event queue entry.
pub const EVENT_ENTRY_BYTES: usize = 32;

/// `CMDQ_CONS.ERR` \[30:24\].
const CONS_ERR_SHIFT: u32 = 24;
const CONS_ERR_MASK: u32 = 0x7f;
/// `EVENTQ_PROD.OVFLG`: the SMMU dropped events because the queue was full;
/// it differs from `EVENTQ_CONS.OVACKFLG` until the driver copies it.
pub const EVENTQ_PROD_OVFLG: u32 = 1 << 31;

/// The log2 size to program: what the driver wants, capped by what
/// `IDR1` allows (`max`) and by [`MAX_LOG2`].
pub const fn clamp_log2(want: u32, max: u32) -> u32 {
    let m = if max < MAX_LOG2 { max } else { MAX_LOG2 };
    if want < m {
        want
    } else {
        m
    }
}

/// Bytes of a queue of 2^`log2` entries of `entry_bytes`; the queue is
/// aligned to this size (and at least 32 bytes).
pub const fn queue_bytes(log2: u32, entry_bytes: usize) -> usize {
    let b = entry_bytes << log2;
    if b < 32 {
        32
    } else {
        b
    }
}

/// `SMMU_CMDQ_BASE`/`SMMU_EVENTQ_BASE`: bit 62 (RA for the command queue,
/// WA for the event queue: the SMMU may allocate the queue in its caches),
/// ADDR \[51:5\], LOG2SIZE \[4:0\].
pub const fn queue_base(pa: u64, log2size: u32) -> u64 {
    1 << 62 | pa & 0x000f_ffff_ffff_ffe0 | (log2size & 0x1f) as u64
}

/// The pointer arithmetic of one queue of 2^log2 entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuePtrs {
    log2: u32,
}

impl QueuePtrs {
    /// A queue of 2^`log2` entries (`log2` capped at [`MAX_LOG2`]).
    pub const fn new(log2: u32) -> QueuePtrs {
        QueuePtrs { log2: if log2 < MAX_LOG2 { log2 } else { MAX_LOG2 } }
    }

    /// log2 of the entries.
    pub const fn log2(&self) -> u32 {
        self.log2
    }

    /// Entries.
    pub const fn entries(&self) -> u32 {
        1 << self.log2
    }

    /// The slot `p` points at.
    pub const fn index(&self, p: u32) -> u32 {
        p & (self.entries() - 1)
    }

    /// `p`'s wrap bit.
    pub const fn wrap(&self, p: u32) -> bool {
        p >> self.log2 & 1 != 0
    }

    /// The pointer after `p`: the index advanced, the wrap bit flipped when
    /// it goes round; bits above the wrap bit (ERR, OVFLG) are dropped.
    pub const fn next(&self, p: u32) -> u32 {
        let ptr_mask = (self.entries() << 1) - 1;
        (p & ptr_mask).wrapping_add(1) & ptr_mask
    }

    /// Whether a producer at `prod` must wait for the consumer at `cons`.
    pub const fn is_full(&self, prod: u32, cons: u32) -> bool {
        self.index(prod) == self.index(cons) && self.wrap(prod) != self.wrap(cons)
    }

    /// Whether there is nothing between `cons` and `prod`.
    pub const fn is_empty(&self, prod: u32, cons: u32) -> bool {
        self.index(prod) == self.index(cons) && self.wrap(prod) == self.wrap(cons)
    }

    /// Entries between `cons` and `prod`.
    pub const fn used(&self, prod: u32, cons: u32) -> u32 {
        let ptr_mask = (self.entries() << 1) - 1;
        (prod & ptr_mask).wrapping_sub(cons & ptr_mask) & ptr_mask
    }

    /// Whether the consumer at `cons` has passed the entry at `target` (as
    /// written at producer position `target`, with the queue not having
    /// gone round since): how the driver knows its `CMD_SYNC` completed.
    pub const fn passed(&self, target: u32, prod: u32, cons: u32) -> bool {
        self.used(prod, cons) < self.used(prod, target) || self.is_empty(prod, cons)
    }
}

/// `CMDQ_CONS.ERR`, if not zero (CERROR_NONE). Meaningful while
/// `GERROR.CMDQ_ERR` is active; CONS then points at the failed command.
pub const fn cons_error(cons: u32) -> Option<u8> {
    let e = cons >> CONS_ERR_SHIFT & CONS_ERR_MASK;
    if e == 0 {
        None
    } else {
        Some(e as u8)
    }
}
