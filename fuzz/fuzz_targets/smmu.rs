//! Fuzz what the SMMU driver reads from the SMMU and acts on: event
//! records (any 32 bytes an SMMU, or a device making it fault, could
//! produce) through `Event::decode` and the fault policy, and queue
//! pointers (any value CMDQ_CONS or EVENTQ_PROD could read) through the
//! queue arithmetic. Nothing may panic; the policy must stay bounded and
//! switch a stream to abort at most once; the pointer predicates must
//! agree with each other; a command that decodes must encode to itself.
//!
//! Run: `cargo +nightly fuzz run smmu -- -max_total_time=600`
#![no_main]

use hypervisor::smmu::cmd::Command;
use hypervisor::smmu::event::{Event, FaultAction, FaultLog};
use hypervisor::smmu::queue::{cons_error, QueuePtrs, MAX_LOG2};
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;

fn word(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w[..b.len().min(8)].copy_from_slice(&b[..b.len().min(8)]);
    u64::from_le_bytes(w)
}

fuzz_target!(|data: &[u8]| {
    let mut log = FaultLog::new();
    let mut aborts: HashMap<u32, u32> = HashMap::new();
    for rec in data.chunks(32) {
        let raw = [0, 8, 16, 24].map(|o| word(rec.get(o..).unwrap_or(&[])));
        let ev = Event::decode(&raw);
        let _ = (ev.kind.name(), ev.kind.has_address());
        if FaultAction::Abort == log.record(ev.sid) {
            *aborts.entry(ev.sid).or_default() += 1;
        }
        // Queue pointers: the first word as PROD/CONS pairs.
        let log2 = (rec.first().copied().unwrap_or(0) as u32) % (MAX_LOG2 + 1);
        let q = QueuePtrs::new(log2);
        let (prod, cons) = (raw[1] as u32, raw[2] as u32);
        let used = q.used(prod, cons);
        assert!(used <= q.entries() * 2);
        assert!(q.index(prod) < q.entries());
        if q.is_empty(prod, cons) {
            assert_eq!(used, 0);
        }
        if q.is_full(prod, cons) {
            assert_eq!(used, q.entries());
        }
        let n = q.next(prod);
        assert!(q.index(n) < q.entries());
        let _ = cons_error(cons);
        // Commands: whatever decodes re-encodes to the same command.
        if let Some(c) = Command::decode([raw[0], raw[3]]) {
            assert_eq!(Command::decode(c.encode()), Some(c));
        }
    }
    let _ = log.end_batch();
    assert!(aborts.values().all(|&n| n == 1), "a stream switched to abort twice");
});
