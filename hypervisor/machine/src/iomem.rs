//! On-demand device memory for an ACPI Dom0: which physical addresses Dom0
//! may have mapped 1:1 when it touches them.
//!
//! Why: an ACPI Dom0 learns its devices from the DSDT, whose AML the
//! hypervisor does not interpret, and on a real machine (Graviton) nothing
//! else lists them. Xen's answer for its ACPI hardware domain is to give it
//! every MMIO address except what Xen keeps (`iomem_deny_access` on its own
//! frames) and to map a page when the domain first touches it. This module
//! is that decision as plain data: a deny list of ranges and the IPA limit,
//! and [`IoMemPolicy::decide`] from a faulting address to
//! [`IoMemDecision::Map`] (the page, or the enclosing 2 MiB block when all of
//! it is permitted, so a device's register file costs one fault and one
//! block descriptor) or [`IoMemDecision::Deny`] (the guest gets the
//! injected abort it got before). `runtime::vcpu` asks it on a stage-2
//! translation fault at an address that is neither RAM nor on the VM's MMIO
//! bus, maps as device memory and retries the instruction.
//!
//! What is denied is the caller's list (`runtime::vm`): all RAM the firmware
//! describes (the hypervisor's image, heap and the other VMs live there;
//! Dom0's own RAM is mapped already), the GIC's frames (distributor,
//! redistributors, ITS: Dom0 sees them only through the vGIC and vITS), the
//! hypervisor's UART and every emulated device's range. Addresses at or
//! beyond the IPA limit are out of range.

use crate::region::Region;
use alloc::vec::Vec;

const PAGE: u64 = 4096;
const BLOCK: u64 = 2 << 20;

/// What to do with a stage-2 translation fault at an unmapped address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMemDecision {
    /// Map this range 1:1 as device memory and retry the access.
    Map(Region),
    /// Refused: the reason (the deny entry's name, or the IPA limit).
    Deny(&'static str),
}

/// The deny list and IPA limit of one VM.
#[derive(Clone, Debug, Default)]
pub struct IoMemPolicy {
    deny: Vec<(&'static str, Region)>,
    limit: u64,
}

impl IoMemPolicy {
    /// Nothing denied yet; addresses at or above `limit` (the IPA space's
    /// end) are out of range.
    pub fn new(limit: u64) -> Self {
        Self { deny: Vec::new(), limit }
    }

    /// Denies `r` (named `what` in the decision). Empty ranges are ignored.
    pub fn deny(&mut self, what: &'static str, r: Region) {
        if r.size != 0 {
            self.deny.push((what, r));
        }
    }

    /// The deny entry overlapping `[base, end)`, if any.
    fn denied(&self, base: u64, end: u64) -> Option<&'static str> {
        self.deny.iter().find(|(_, r)| r.base < end && base < r.base.saturating_add(r.size)).map(|(w, _)| *w)
    }

    /// The decision for an access at `ipa`.
    pub fn decide(&self, ipa: u64) -> IoMemDecision {
        let page = ipa & !(PAGE - 1);
        if ipa >= self.limit {
            return IoMemDecision::Deny("beyond the IPA space");
        }
        if let Some(what) = self.denied(page, page + PAGE) {
            return IoMemDecision::Deny(what);
        }
        let block = ipa & !(BLOCK - 1);
        if block + BLOCK <= self.limit && self.denied(block, block + BLOCK).is_none() {
            return IoMemDecision::Map(Region { base: block, size: BLOCK });
        }
        IoMemDecision::Map(Region { base: page, size: PAGE })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(base: u64, size: u64) -> Region {
        Region { base, size }
    }

    /// QEMU virt as an ACPI Dom0 sees it: RAM at 1 GiB, the GIC's frames,
    /// the hypervisor's PL011, a 40-bit IPA space.
    fn qemu_virt() -> IoMemPolicy {
        let mut p = IoMemPolicy::new(1 << 40);
        p.deny("RAM", r(0x4000_0000, 0x8000_0000));
        p.deny("GIC distributor", r(0x0800_0000, 0x1_0000));
        p.deny("GIC ITS", r(0x0808_0000, 0x2_0000));
        p.deny("GIC redistributors", r(0x080a_0000, 0x4_0000));
        p.deny("hypervisor UART", r(0x0900_0000, 0x1000));
        p.deny("nothing", r(0x1234_5000, 0));
        p
    }

    #[test]
    fn a_device_in_a_free_2mib_block_gets_the_block() {
        let p = qemu_virt();
        // A virtio-mmio slot: its 2 MiB block holds nothing denied.
        assert_eq!(p.decide(0x0a00_3e10), IoMemDecision::Map(r(0x0a00_0000, 2 << 20)));
        // A BAR in QEMU's 64-bit PCIe window at 512 GiB.
        assert_eq!(p.decide(0x80_0000_4008), IoMemDecision::Map(r(0x80_0000_0000, 2 << 20)));
        // The last block below the limit.
        assert_eq!(p.decide((1 << 40) - 1), IoMemDecision::Map(r((1 << 40) - (2 << 20), 2 << 20)));
    }

    #[test]
    fn a_device_next_to_a_denied_range_gets_only_its_page() {
        let p = qemu_virt();
        // The PL031 RTC shares the 2 MiB block of the hypervisor's UART.
        assert_eq!(p.decide(0x0901_0000), IoMemDecision::Map(r(0x0901_0000, 0x1000)));
        assert_eq!(p.decide(0x0902_0ffc), IoMemDecision::Map(r(0x0902_0000, 0x1000)));
        // Just past the redistributors, inside the GIC's block.
        assert_eq!(p.decide(0x080e_0000), IoMemDecision::Map(r(0x080e_0000, 0x1000)));
        // The block right below RAM ends where RAM starts: whole.
        assert_eq!(p.decide(0x3fff_fff8), IoMemDecision::Map(r(0x3fe0_0000, 2 << 20)));
    }

    /// A hostile Dom0 reaching for the hypervisor's memory, the GIC's real
    /// frames, the hypervisor's UART or beyond the IPA space gets refused.
    #[test]
    fn denied_and_out_of_range_addresses_are_refused() {
        let p = qemu_virt();
        assert_eq!(p.decide(0x4000_0000), IoMemDecision::Deny("RAM"));
        assert_eq!(p.decide(0xbfff_ffff), IoMemDecision::Deny("RAM"));
        assert_eq!(p.decide(0x0800_0000), IoMemDecision::Deny("GIC distributor"));
        // The ITS translation frame (the control frame is the vITS's).
        assert_eq!(p.decide(0x0809_0040), IoMemDecision::Deny("GIC ITS"));
        assert_eq!(p.decide(0x080d_fffc), IoMemDecision::Deny("GIC redistributors"));
        assert_eq!(p.decide(0x0900_0018), IoMemDecision::Deny("hypervisor UART"));
        assert_eq!(p.decide(1 << 40), IoMemDecision::Deny("beyond the IPA space"));
        assert_eq!(p.decide(u64::MAX), IoMemDecision::Deny("beyond the IPA space"));
        // An empty entry denies nothing.
        assert_eq!(p.decide(0x1234_5000), IoMemDecision::Map(r(0x1220_0000, 2 << 20)));
    }

    #[test]
    fn a_block_crossing_the_limit_is_not_mapped_whole() {
        // A 39-bit space plus 1 MiB: the last block would cross it.
        let p = IoMemPolicy::new((1 << 39) + (1 << 20));
        assert_eq!(p.decide(1 << 39), IoMemDecision::Map(r(1 << 39, 0x1000)));
        assert_eq!(p.decide((1 << 39) + (1 << 20)), IoMemDecision::Deny("beyond the IPA space"));
        // Nothing at all when the limit is 0.
        assert_eq!(IoMemPolicy::new(0).decide(0), IoMemDecision::Deny("beyond the IPA space"));
    }
}
