// QEMU `virt` (`-machine virt,virtualization=on,gic-version=3|4`).
//
// Only what cannot be discovered before the device tree is read, and the
// fallbacks for what QEMU's DTB may leave out (everything else is
// discovered from the DTB QEMU passes in x0). The type is
// `hypervisor::platform_desc::Platform`.

pub const PLATFORM: Platform = Platform {
    name: "qemu-virt",
    // PL011 UART0, usable before the DTB is parsed.
    early_uart: 0x0900_0000,
    // QEMU's -kernel puts an arm64 Image at RAM base (1 GiB) + 2 MiB.
    load_address: 0x4020_0000,
    // Devices live below RAM (0x4000_0000), and at 256 GiB: the second
    // GICR region (0x40_0000_0000, CPUs 123 and up) and the high PCIe ECAM
    // (0x40_1000_0000). PCIe's 64-bit window (512 GiB and up) is never
    // touched by the hypervisor.
    device_gib: &[(0, 1), (256, 257)],
    // Without dom0_mem, guest RAM starts at least this far above the lowest
    // RAM (the boot-layout plan, boot::plan, places the heap and avoids the
    // DTB and modules wherever they are).
    hyp_reserved: 512 << 20,
    // QEMU virt's PL011 is SPI 1 (INTID 33).
    uart_intid: spi(1),
    // SBSA's PPI 9 (INTID 25), as QEMU's GIC node says.
    maintenance_intid: ppi(9),
    notes: "QEMU passes its DTB in x0; guest-loader modules appear as /chosen/module@ nodes.",
};
