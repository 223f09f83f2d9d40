//! How many pCPUs the hypervisor runs on, and what their per-pCPU state
//! costs in the main heap.
//!
//! There is no fixed CPU count in the image: the machine description (the
//! DT's `/cpus`, or the MADT's enabled GICC entries on the ACPI path) says
//! how many CPUs there are, and `runtime::boot::bring_up` allocates each
//! secondary pCPU's stack, and `runtime::percpu` each pCPU's shared state
//! and run block, from the heap for that many. The scheduler's per-pCPU
//! queues, the flight-recorder rings and the physical ITS's collections
//! are sized by the same count. Graviton4 has 192 CPUs; [`MAX_PCPUS`] is
//! only a sanity bound on a machine description that lists absurdly many.
//!
//! One more bound: a CPU needs a redistributor. The physical GIC driver
//! walks every GICR region the machine description lists (`crate::gicr`:
//! QEMU virt puts CPUs 123 and up in a second region, an MADT may give one
//! GICR base per GICC) and finds each CPU's frame by its affinity; a
//! described CPU that no frame serves stays off, with a warning.
//!
//! The heap grows with the count ([`heap_size`]), so 192 pCPUs get their
//! stacks and rings without starving the guest-facing allocations that the
//! fixed 48 MiB was sized for.

pub use crate::limits::{MAX_PCPUS, STACK_SIZE};

/// The main heap for up to [`BASE_HEAP_PCPUS`] pCPUs.
pub const BASE_HEAP: u64 = 48 << 20;

/// The pCPUs [`BASE_HEAP`] was sized for (the former fixed limit).
pub const BASE_HEAP_PCPUS: usize = 8;

/// What each further pCPU adds to the heap: its stack, its flight-recorder
/// ring (`trace::RING_EVENTS` records), its LPI pending table and the
/// allocator's alignment slack, rounded up (a host test checks the sum).
pub const PER_PCPU_HEAP: u64 = 512 << 10;

/// The pCPU count the hypervisor uses for a machine description that
/// lists `described` CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PcpuCount {
    /// pCPUs brought up (at most [`MAX_PCPUS`], at most the CPUs a
    /// redistributor serves).
    pub used: usize,
    /// CPUs described beyond those bounds, left off.
    pub ignored: usize,
}

/// What is wrong with the machine description's CPU list.
#[derive(thiserror::Error, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PcpuError {
    /// No usable CPU at all (the boot CPU must be listed).
    #[error("the machine description lists no usable CPU")]
    NoCpus,
}

/// The pCPU count for `described` CPUs of which `redistributors` have a
/// redistributor frame (over all GICR regions): all of them up to
/// [`MAX_PCPUS`] and up to `redistributors` (the boot CPU always counts).
pub fn count(described: usize, redistributors: usize) -> Result<PcpuCount, PcpuError> {
    if described == 0 {
        return Err(PcpuError::NoCpus);
    }
    let used = described.min(MAX_PCPUS).min(redistributors.max(1));
    Ok(PcpuCount { used, ignored: described - used })
}

/// The main heap for `pcpus` pCPUs: [`BASE_HEAP`] up to
/// [`BASE_HEAP_PCPUS`], plus [`PER_PCPU_HEAP`] for each one beyond.
pub fn heap_size(pcpus: usize) -> u64 {
    let extra = pcpus.min(MAX_PCPUS).saturating_sub(BASE_HEAP_PCPUS) as u64;
    BASE_HEAP + extra * PER_PCPU_HEAP
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_described_cpu_up_to_the_bound() {
        assert_eq!(count(0, 8), Err(PcpuError::NoCpus));
        assert_eq!(count(1, 1), Ok(PcpuCount { used: 1, ignored: 0 }));
        // More than the former fixed 8; Graviton4's 192.
        assert_eq!(count(12, 12), Ok(PcpuCount { used: 12, ignored: 0 }));
        assert_eq!(count(192, 192), Ok(PcpuCount { used: 192, ignored: 0 }));
        assert_eq!(count(MAX_PCPUS, 1000), Ok(PcpuCount { used: MAX_PCPUS, ignored: 0 }));
        assert_eq!(count(100_000, 100_000), Ok(PcpuCount { used: MAX_PCPUS, ignored: 100_000 - MAX_PCPUS }));
    }

    #[test]
    fn cpus_without_a_redistributor_stay_off() {
        // QEMU virt with 192 CPUs: 123 + 69 redistributors in two regions.
        assert_eq!(count(192, 192), Ok(PcpuCount { used: 192, ignored: 0 }));
        // Only the first region's 123 serve a CPU.
        assert_eq!(count(192, 123), Ok(PcpuCount { used: 123, ignored: 69 }));
        // A region that reads as empty still runs the boot CPU.
        assert_eq!(count(4, 0), Ok(PcpuCount { used: 1, ignored: 3 }));
        // More frames than CPUs: the CPUs decide.
        assert_eq!(count(2, 123), Ok(PcpuCount { used: 2, ignored: 0 }));
    }

    #[test]
    fn the_heap_grows_with_the_pcpus() {
        // Unchanged for the machines the 48 MiB was sized for.
        for n in 0..=8 {
            assert_eq!(heap_size(n), 48 << 20);
        }
        assert_eq!(heap_size(12), (48 << 20) + 4 * (512 << 10));
        assert_eq!(heap_size(192), (48 << 20) + 184 * (512 << 10));
        // Bounded like the count.
        assert_eq!(heap_size(usize::MAX), heap_size(MAX_PCPUS));
        assert!(heap_size(MAX_PCPUS) < 1 << 30);
    }

    #[test]
    fn per_pcpu_heap_covers_what_each_pcpu_allocates() {
        let ring = crate::trace::RING_EVENTS * core::mem::size_of::<crate::trace::Record>();
        // The pending table is allocated 64 KiB-aligned.
        let pend = crate::its::host::PEND_TABLE_BYTES.next_multiple_of(64 << 10);
        let need = (STACK_SIZE + ring + pend) as u64;
        assert!(need + (64 << 10) <= PER_PCPU_HEAP, "{need} bytes per pCPU");
    }
}
