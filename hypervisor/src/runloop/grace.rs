//! Grace periods for the VM table (`runtime::vm::vms`): a replaced table
//! and a VM no table lists any more are freed only once every pCPU has let
//! go of what it read before the replacement.
//!
//! Contract for each pCPU: it calls [`quiescent`] only at points where it
//! holds nothing it read from the table (the run loop's top once the vCPU
//! that ran last is released), and brackets its WFI with
//! [`idle`]`(true)` / [`idle`]`(false)`, holding nothing while idle. Then,
//! once the table is replaced, a snapshot taken after that ([`take`], in
//! [`room`] made before it) shows the old one free to go when [`elapsed`]
//! says so.

use super::pcpu::PcpuShared;
use alloc::vec::Vec;
use core::sync::atomic::{fence, Ordering};

/// This pCPU passed its `n`th quiescent point (the caller counts them):
/// what it read from the table before is no longer used (the release
/// orders those reads before the count).
#[inline(always)]
pub fn quiescent(p: &PcpuShared, n: u64) {
    p.quiescent.store(n, Ordering::Release);
}

/// This pCPU goes idle (`true`, holding nothing) or leaves idling
/// (`false`; the fence orders its next table read after the flag, so a
/// reaper that saw it idle has published before that read).
#[inline(always)]
pub fn idle(p: &PcpuShared, on: bool) {
    p.idle.store(on, Ordering::Release);
    if !on {
        fence(Ordering::SeqCst);
    }
}

/// Room for a snapshot of `pcpus` pCPUs, made before the table is
/// replaced: once it is, the snapshot must be taken, not fail.
pub fn room(pcpus: usize) -> Result<Vec<u64>, alloc::collections::TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(pcpus)?;
    Ok(v)
}

/// Every pCPU's count into `snap` (room made by [`room`]), taken after the
/// table was replaced (the fence orders the replacement before these
/// reads).
pub fn take(pcpus: &[PcpuShared], snap: &mut Vec<u64>) {
    fence(Ordering::SeqCst);
    snap.clear();
    snap.extend(pcpus.iter().map(|p| p.quiescent.load(Ordering::Acquire)));
}

/// [`room`] and [`take`] at once.
pub fn snapshot(pcpus: &[PcpuShared]) -> Result<Vec<u64>, alloc::collections::TryReserveError> {
    let mut v = room(pcpus.len())?;
    take(pcpus, &mut v);
    Ok(v)
}

/// Whether every pCPU but `me` (the caller, at a quiescent point itself)
/// has passed a quiescent point since `snap`, or idles now.
pub fn elapsed(pcpus: &[PcpuShared], snap: &[u64], me: usize) -> bool {
    lagging(pcpus, snap, me).next().is_none()
}

/// The pCPUs the grace period since `snap` still waits for.
pub fn lagging<'a>(pcpus: &'a [PcpuShared], snap: &'a [u64], me: usize) -> impl Iterator<Item = usize> + 'a {
    fence(Ordering::SeqCst);
    // A pCPU the snapshot lacks has not been seen to pass one.
    pcpus.iter().enumerate().filter_map(move |(i, p)| {
        let done = i == me
            || !p.online.load(Ordering::Acquire)
            || p.idle.load(Ordering::Acquire)
            || snap.get(i).is_some_and(|&s| p.quiescent.load(Ordering::Acquire) != s);
        (!done).then_some(i)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn online(n: usize) -> Vec<PcpuShared> {
        (0..n)
            .map(|_| {
                let p = PcpuShared::new();
                p.online.store(true, Ordering::Relaxed);
                p
            })
            .collect()
    }

    #[test]
    fn a_grace_period_needs_every_other_pcpu_quiescent_or_idle() {
        let p = online(3);
        quiescent(&p[1], 1);
        let snap = snapshot(&p).unwrap();
        assert!(!elapsed(&p, &snap, 0));
        quiescent(&p[1], 2);
        assert!(!elapsed(&p, &snap, 0), "pCPU 2 has not passed one");
        idle(&p[2], true);
        assert!(elapsed(&p, &snap, 0));
        idle(&p[2], false);
        assert!(!elapsed(&p, &snap, 0), "it left idling and may read again");
        quiescent(&p[2], 1);
        assert!(elapsed(&p, &snap, 0));
        // The caller's own count does not matter.
        assert!(!elapsed(&p, &snapshot(&p).unwrap(), 0));
        assert_eq!(lagging(&p, &snapshot(&p).unwrap(), 0).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn a_snapshot_that_misses_a_pcpu_never_lets_the_grace_period_end() {
        let p = online(2);
        quiescent(&p[1], 5);
        assert!(!elapsed(&p, &[], 0));
        assert_eq!(lagging(&p, &[0], 0).collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn offline_pcpus_and_one_pcpu_need_nothing() {
        let p = online(1);
        assert!(elapsed(&p, &snapshot(&p).unwrap(), 0));
        let p = online(2);
        p[1].online.store(false, Ordering::Relaxed);
        assert!(elapsed(&p, &snapshot(&p).unwrap(), 0));
    }
}
