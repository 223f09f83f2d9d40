//! Fuzz what Dom0's userspace does to the control device's register page:
//! any sequence of loads and stores (offset, size, value from the input)
//! through `control::Device`, with a doorbell's request decoded by
//! `control::decode` and answered by an executor that echoes it. Nothing
//! may panic, and every reply stays within the 64 KiB window.
//!
//! Run: `cargo +nightly fuzz run control -- -max_total_time=600`
#![no_main]

use hypervisor::control::{decode, reg, Device, Reply, Request, Status, WINDOW_BYTES};
use libfuzzer_sys::fuzz_target;

/// Answers with the request's debug text, padded to a length the input
/// picks, so that long and paged replies happen too.
fn answer(r: Request<'_>, pad: usize) -> Result<Reply, Status> {
    let mut text = format!("{r:?}").into_bytes();
    text.resize(text.len() + pad, b'.');
    match r {
        Request::Stats { offset } => Ok(Reply::paged(&text, offset)),
        Request::Destroy { dom: 0 } => Err(Status::Perm),
        _ => Ok(Reply { text, more: 0 }),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut d = Device::new();
    let mut now = 0u64;
    let mut tokens = Vec::new();
    for op in data.chunks(11) {
        if op.len() < 11 {
            break;
        }
        now += u64::from(op[0]) << 24;
        let off = u64::from(op[1] & 0x3c);
        let size = if op[2] & 1 == 0 { 4 } else { 8 };
        let mut value = u64::from_le_bytes(op[3..11].try_into().unwrap());
        // Often present a token that was handed out, so doorbells run.
        if op[2] & 6 != 0 {
            if let Some(&t) = tokens.get(usize::from(op[2] >> 3) % tokens.len().max(1)) {
                value = t;
            }
        }
        if op[2] & 0x80 == 0 {
            if let Ok(v) = d.read(now, off, size) {
                if off == reg::CLAIM && v != 0 {
                    tokens.push(v);
                }
                if off == reg::RESP_LEN {
                    assert!(v as usize <= WINDOW_BYTES);
                }
            }
        } else {
            let pad = usize::from(op[10]) * 300;
            let _ = d.write(now, off, size, value, |r| answer(r, pad));
        }
    }
    // The decoder alone, on the raw input.
    let _ = decode(data);
});
