//! The host's stand-in for the system registers (feature `fakes`): every
//! accessor of `crate::sysreg` reads and writes a register file of the
//! calling thread, keyed by the register's assembler name
//! (`"ich_lr0_el2"`), so tests running in parallel do not see each other.
//!
//! A test sets what the hardware would hold ([`set`]: ICH_VTR_EL2's list
//! register count, an LR the guest changed), runs the code under test, and
//! reads back what it wrote and read ([`get`], [`writes`], [`reads`]). Reading ICC_IAR1_EL1
//! takes the next interrupt [`raise`]d, or 1023 (none pending), as the
//! GIC's acknowledge does.

extern crate std;

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::vec::Vec;

/// The acknowledge register, whose read has a side effect.
const IAR: &str = "icc_iar1_el1";
/// The special INTID an acknowledge returns with nothing pending.
const SPURIOUS: u64 = 1023;

#[derive(Default)]
struct Regs {
    values: BTreeMap<&'static str, u64>,
    writes: Vec<(&'static str, u64)>,
    reads: Vec<&'static str>,
    pending: VecDeque<u32>,
}

std::thread_local! {
    static REGS: RefCell<Regs> = RefCell::new(Regs::default());
}

/// What the accessors' `get` does.
pub(crate) fn read(name: &'static str) -> u64 {
    REGS.with_borrow_mut(|r| {
        r.reads.push(name);
        if name == IAR {
            return r.pending.pop_front().map_or(SPURIOUS, u64::from);
        }
        r.values.get(name).copied().unwrap_or(0)
    })
}

/// What the accessors' `set` does.
pub(crate) fn write(name: &'static str, v: u64) {
    REGS.with_borrow_mut(|r| {
        r.values.insert(name, v);
        r.writes.push((name, v));
    })
}

/// Forgets every value, write, read and pending interrupt of this thread.
pub fn reset() {
    REGS.with_borrow_mut(|r| *r = Regs::default());
}

/// Sets register `name` as the hardware would (not counted as a write).
pub fn set(name: &'static str, v: u64) {
    REGS.with_borrow_mut(|r| {
        r.values.insert(name, v);
    })
}

/// Register `name`'s value now (0 if never set or written).
pub fn get(name: &'static str) -> u64 {
    REGS.with_borrow(|r| r.values.get(name).copied().unwrap_or(0))
}

/// Every write since the last [`reset`] or [`take_writes`], in order.
pub fn writes() -> Vec<(&'static str, u64)> {
    REGS.with_borrow(|r| r.writes.clone())
}

/// [`writes`], and forgets them.
pub fn take_writes() -> Vec<(&'static str, u64)> {
    REGS.with_borrow_mut(|r| core::mem::take(&mut r.writes))
}

/// Every register read since the last [`reset`] or [`take_reads`], in
/// order.
pub fn reads() -> Vec<&'static str> {
    REGS.with_borrow(|r| r.reads.clone())
}

/// [`reads`], and forgets them.
pub fn take_reads() -> Vec<&'static str> {
    REGS.with_borrow_mut(|r| core::mem::take(&mut r.reads))
}

/// Makes `intid` pending: the next acknowledge returns it.
pub fn raise(intid: u32) {
    REGS.with_borrow_mut(|r| r.pending.push_back(intid))
}
