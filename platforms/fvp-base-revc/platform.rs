// Arm FVP Base RevC (`FVP_Base_RevC-2xAEMvA`), the hypervisor entered by
// TF-A's BL31 at EL2 as BL33. The type is
// `hypervisor::platform_desc::Platform`.
//
// What the DT cannot say (or says only after it is parsed):
// - the early console: PL011 UART0 at 0x1C09_0000 (under the IOFPGA bus
//   in the DT, reachable only through two levels of `ranges`);
// - the load address: 0x8800_0000 is where TF-A's BL2 loads BL33 from the
//   FIP by default (PLAT_ARM_NS_IMAGE_BASE) and where `cargo xtask run
//   --platform fvp` preloads the image; it is 2 MiB aligned and leaves
//   0x8000_0000..0x8800_0000 for TF-A's DTB (0x8200_0000) and the
//   /memreserve/ at 0x8000_0000;
// - the device windows: everything below DRAM (2 GiB) is devices: flash,
//   IOFPGA, GIC (0x2F00_0000), PCIe ECAM (0x4000_0000) and 32-bit window;
// - the top 16 MiB of DRAM bank 0 is secure: the DTB must reserve it (a
//   /reserved-memory or /memreserve/ entry, or a memory node that stops
//   short of it).

pub const PLATFORM: Platform = Platform {
    name: "fvp-base-revc",
    early_uart: 0x1C09_0000,
    load_address: 0x8800_0000,
    device_gib: &[(0, 2)],
    hyp_reserved: 512 << 20,
    // UART0 is SPI 5 (INTID 37) on FVP Base.
    uart_intid: spi(5),
    // GIC maintenance interrupt: PPI 9 (INTID 25).
    maintenance_intid: ppi(9),
    notes: "TF-A enters BL33 at EL2 with x0 = DTB (ARM_LINUX_KERNEL_AS_BL33) or x1 = DTB at 0x82000000.",
};
