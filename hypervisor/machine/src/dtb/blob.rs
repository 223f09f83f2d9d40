//! Structural check of a flattened device tree before the `fdt` crate sees it.
//!
//! `fdt` 0.1.5 trusts its input: it slices with header offsets unchecked,
//! `expect`s NUL-terminated names, `assert`s node nesting, keeps a fixed
//! 64-entry parent stack, and skips `FDT_NOP` tokens only in some places. On
//! the EL2 target a panic halts the machine, and the host DTB comes from
//! firmware or a boot loader we do not control. So every blob goes through
//! [`check`] first, which walks the whole structure block once with bounds
//! checks and enforces the invariants the crate assumes:
//!
//! * header offsets and sizes lie inside `totalsize`, which lies inside the
//!   buffer; version >= 17 (so `size_dt_struct` is meaningful);
//! * exactly one root node, with an empty name, followed by `FDT_END`;
//! * every node name and property name is NUL-terminated UTF-8 inside its
//!   block; every property value lies inside the structure block;
//! * properties come before child nodes (the crate stops at the first child);
//! * nesting depth at most [`MAX_DEPTH`];
//! * `#address-cells`, `#size-cells` and `#interrupt-cells` are one cell
//!   (the crate `expect`s four bytes).
//!
//! `FDT_NOP` tokens are legal (libfdt's `fdt_nop_node` leaves them) but the
//! crate mishandles them between properties, so a blob that contains any is
//! rewritten without them into an owned copy: callers get a [`Cow`].
//!
//! The memory reservation block is also read here, because the crate's reader
//! for it slices unchecked.

use alloc::borrow::Cow;
use alloc::vec::Vec;

use super::{DtbError, Region};

const MAGIC: u32 = 0xd00d_feed;
const HEADER_LEN: usize = 40;
const TOKEN_BEGIN_NODE: u32 = 1;
const TOKEN_END_NODE: u32 = 2;
const TOKEN_PROP: u32 = 3;
const TOKEN_NOP: u32 = 4;
const TOKEN_END: u32 = 9;

/// Deepest node nesting accepted (root = 1). Real trees stay below 10; the
/// `fdt` crate breaks beyond 63, and our own walks recurse this deep.
pub const MAX_DEPTH: usize = 32;

/// Most memory-reservation entries accepted (a guard against a missing
/// terminator making us scan the whole blob as reservations).
const MAX_RESERVATIONS: usize = 64;

fn be32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

fn be64(bytes: &[u8], at: usize) -> Option<u64> {
    Some((u64::from(be32(bytes, at)?) << 32) | u64::from(be32(bytes, at + 4)?))
}

fn align4(n: usize) -> Option<usize> {
    Some(n.checked_add(3)? & !3)
}

/// A NUL-terminated UTF-8 string starting at `at` inside `block`.
fn cstr(block: &[u8], at: usize) -> Result<&str, DtbError> {
    let rest = block.get(at..).ok_or(DtbError::Parse)?;
    let len = rest.iter().position(|&b| b == 0).ok_or(DtbError::Parse)?;
    core::str::from_utf8(&rest[..len]).map_err(|_| DtbError::Parse)
}

/// The header fields we use.
struct Header {
    totalsize: usize,
    off_struct: usize,
    size_struct: usize,
    off_strings: usize,
    size_strings: usize,
    off_rsvmap: usize,
}

fn header(dtb: &[u8]) -> Result<Header, DtbError> {
    if dtb.len() < HEADER_LEN {
        return Err(if dtb.len() >= 4 && be32(dtb, 0) != Some(MAGIC) { DtbError::Parse } else { DtbError::Truncated });
    }
    let field = |i: usize| be32(dtb, i * 4).ok_or(DtbError::Truncated);
    if field(0)? != MAGIC {
        return Err(DtbError::Parse);
    }
    let h = Header {
        totalsize: field(1)? as usize,
        off_struct: field(2)? as usize,
        off_strings: field(3)? as usize,
        off_rsvmap: field(4)? as usize,
        size_strings: field(8)? as usize,
        size_struct: field(9)? as usize,
    };
    let version = field(5)?;
    let last_comp = field(6)?;
    if version < 17 || last_comp > 17 {
        return Err(DtbError::Unsupported("device tree version (need 17)"));
    }
    if h.totalsize < HEADER_LEN {
        return Err(DtbError::Parse);
    }
    if h.totalsize > dtb.len() {
        return Err(DtbError::Truncated);
    }
    let within = |off: usize, size: usize| off.checked_add(size).is_some_and(|end| end <= h.totalsize);
    if !within(h.off_struct, h.size_struct)
        || !within(h.off_strings, h.size_strings)
        || !h.off_struct.is_multiple_of(4)
        || !h.size_struct.is_multiple_of(4)
        || !h.off_rsvmap.is_multiple_of(8)
        || h.off_rsvmap < HEADER_LEN
        || h.off_rsvmap >= h.totalsize
    {
        return Err(DtbError::Parse);
    }
    Ok(h)
}

/// Reads the memory reservation block (up to its all-zero terminator).
fn reservations(dtb: &[u8], h: &Header) -> Result<Vec<Region>, DtbError> {
    let block = &dtb[h.off_rsvmap..h.totalsize];
    let mut out = Vec::new();
    for i in 0..=MAX_RESERVATIONS {
        let base = be64(block, i * 16).ok_or(DtbError::Parse)?;
        let size = be64(block, i * 16 + 8).ok_or(DtbError::Parse)?;
        if base == 0 && size == 0 {
            return Ok(out);
        }
        out.push(Region { base, size });
    }
    Err(DtbError::Unsupported("too many memory reservations"))
}

/// Walks the structure block, checking it; when `out` is given, appends every
/// token except `FDT_NOP` to it. Returns whether any `FDT_NOP` was seen.
fn walk(st: &[u8], strings: &[u8], mut out: Option<&mut Vec<u8>>) -> Result<bool, DtbError> {
    // For each open node: may it still take properties (no child seen yet)?
    let mut props_allowed = [false; MAX_DEPTH];
    let mut depth = 0usize;
    let mut root_done = false;
    let mut saw_nop = false;
    let mut p = 0usize;
    loop {
        let token = be32(st, p).ok_or(DtbError::Parse)?;
        let next = match token {
            TOKEN_BEGIN_NODE => {
                if root_done {
                    return Err(DtbError::Parse);
                }
                let name = cstr(st, p + 4)?;
                if depth == 0 && !name.is_empty() {
                    return Err(DtbError::Parse);
                }
                if depth == MAX_DEPTH {
                    return Err(DtbError::Unsupported("device tree nested too deep"));
                }
                if depth > 0 {
                    props_allowed[depth - 1] = false;
                }
                props_allowed[depth] = true;
                depth += 1;
                align4(p + 4 + name.len() + 1).ok_or(DtbError::Parse)?
            }
            TOKEN_END_NODE => {
                if depth == 0 {
                    return Err(DtbError::Parse);
                }
                depth -= 1;
                root_done = depth == 0;
                p + 4
            }
            TOKEN_PROP => {
                if depth == 0 || !props_allowed[depth - 1] {
                    return Err(DtbError::Parse);
                }
                let len = be32(st, p + 4).ok_or(DtbError::Parse)? as usize;
                let name_off = be32(st, p + 8).ok_or(DtbError::Parse)? as usize;
                let name = cstr(strings, name_off)?;
                if name.is_empty() {
                    return Err(DtbError::Parse);
                }
                let end = (p + 12).checked_add(len).ok_or(DtbError::Parse)?;
                if end > st.len() {
                    return Err(DtbError::Parse);
                }
                if matches!(name, "#address-cells" | "#size-cells" | "#interrupt-cells") && len != 4 {
                    return Err(DtbError::BadValue("#*-cells property is not one cell"));
                }
                align4(end).ok_or(DtbError::Parse)?
            }
            TOKEN_NOP => {
                saw_nop = true;
                p + 4
            }
            TOKEN_END => {
                if !root_done {
                    return Err(DtbError::Parse);
                }
                if let Some(out) = out.as_deref_mut() {
                    out.extend_from_slice(&st[p..p + 4]);
                }
                return Ok(saw_nop);
            }
            _ => return Err(DtbError::Parse),
        };
        // Padding after a name or value must still be inside the block.
        if next > st.len() {
            return Err(DtbError::Parse);
        }
        if token != TOKEN_NOP {
            if let Some(out) = out.as_deref_mut() {
                out.extend_from_slice(&st[p..next]);
            }
        }
        p = next;
    }
}

/// What [`check`] learned besides "the blob is sound".
pub struct Checked<'a> {
    /// The blob to hand to the `fdt` crate: the input, or a NOP-free copy.
    pub blob: Cow<'a, [u8]>,
    /// Entries of the memory reservation block.
    pub reserved: Vec<Region>,
}

/// Checks `dtb` so that the `fdt` crate can read it without panicking; see
/// the module documentation for what is enforced.
pub fn check(dtb: &[u8]) -> Result<Checked<'_>, DtbError> {
    let h = header(dtb)?;
    let st = &dtb[h.off_struct..h.off_struct + h.size_struct];
    let strings = &dtb[h.off_strings..h.off_strings + h.size_strings];
    let reserved = reservations(dtb, &h)?;
    let saw_nop = walk(st, strings, None)?;
    let blob = if saw_nop { Cow::Owned(without_nops(dtb, &h, st, strings, &reserved)?) } else { Cow::Borrowed(dtb) };
    Ok(Checked { blob, reserved })
}

/// Re-lays the blob out as header, reservations, structure (NOPs dropped),
/// strings.
fn without_nops(dtb: &[u8], h: &Header, st: &[u8], strings: &[u8], reserved: &[Region]) -> Result<Vec<u8>, DtbError> {
    let mut out = Vec::with_capacity(h.totalsize);
    out.extend_from_slice(&dtb[..HEADER_LEN]);
    let off_rsvmap = out.len();
    for r in reserved.iter().chain(core::iter::once(&Region { base: 0, size: 0 })) {
        out.extend_from_slice(&r.base.to_be_bytes());
        out.extend_from_slice(&r.size.to_be_bytes());
    }
    let off_struct = out.len();
    walk(st, strings, Some(&mut out))?;
    let size_struct = out.len() - off_struct;
    let off_strings = out.len();
    out.extend_from_slice(strings);
    let total = out.len();
    let put = |out: &mut Vec<u8>, field: usize, v: usize| -> Result<(), DtbError> {
        let v = u32::try_from(v).map_err(|_| DtbError::TooBig)?;
        out[field * 4..field * 4 + 4].copy_from_slice(&v.to_be_bytes());
        Ok(())
    };
    put(&mut out, 1, total)?;
    put(&mut out, 2, off_struct)?;
    put(&mut out, 3, off_strings)?;
    put(&mut out, 4, off_rsvmap)?;
    put(&mut out, 8, strings.len())?;
    put(&mut out, 9, size_struct)?;
    Ok(out)
}
