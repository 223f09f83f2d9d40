// QEMU `virt` (`-machine virt,virtualization=on,gic-version=3|4`).
//
// Only what cannot be discovered before the device tree is read: the early
// console and which 1 GiB windows of the physical address space hold
// devices (everything else is discovered from the DTB QEMU passes in x0).

pub const NAME: &str = "qemu-virt";
/// PL011 UART0, usable before the DTB is parsed.
pub const EARLY_UART: usize = 0x0900_0000;
/// Devices live below RAM (0x4000_0000); PCIe's high window (256 GiB and up)
/// is never touched by the hypervisor.
pub fn is_device_gib(gib: u64) -> bool {
    gib == 0
}
/// Without `dom0_mem`, guest RAM starts at least this far above the lowest
/// RAM (the boot-layout plan, `boot::plan`, places the heap and avoids the
/// DTB and modules wherever they are).
pub const HYP_RESERVED: u64 = 512 << 20;
