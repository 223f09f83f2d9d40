//! The typed platform descriptor: what the hypervisor must know about a
//! machine before (or besides) reading its device tree. Each directory under
//! `platforms/` fills in one [`Platform`] const in its `platform.rs`; the
//! EL2 build includes the chosen one (`HV_PLATFORM`), and the host tests
//! below include all of them, so the compiler and [`Platform::check`] see
//! every platform on every host test run.

use crate::intid::IntId;

/// A half-open range of 1 GiB windows `[first, end)` of the physical
/// address space (window n covers `n << 30 .. (n + 1) << 30`).
pub type GibRange = (u64, u64);

#[derive(Clone, Copy, Debug)]
pub struct Platform {
    /// The directory name under `platforms/` (`HV_PLATFORM`).
    pub name: &'static str,
    /// A PL011 the hypervisor may print to before the DTB is parsed.
    pub early_uart: u64,
    /// Where the image is linked and must be loaded (the platform's
    /// `platform.ld` says the same; a host test checks that).
    pub load_address: u64,
    /// The 1 GiB windows below 512 GiB that hold devices: mapped
    /// Device-nGnRnE by the boot identity map, never read as RAM.
    pub device_gib: &'static [GibRange],
    /// Without `dom0_mem`, guest RAM starts at least this far above the
    /// lowest RAM.
    pub hyp_reserved: u64,
    /// The console UART's interrupt when the DTB names no UART interrupt.
    pub uart_intid: IntId,
    /// The GIC maintenance interrupt when the GIC node does not name one.
    pub maintenance_intid: IntId,
    /// Where the firmware or loader is expected to put things the DT does
    /// not describe (documentation for users and for xtask's runners).
    pub notes: &'static str,
}

/// A const-context INTID: the platform files name their fallbacks as SPI or
/// PPI numbers, and a wrong number fails the build.
pub const fn spi(n: u32) -> IntId {
    match IntId::spi(n) {
        Ok(id) => id,
        Err(_) => panic!("not an SPI number"),
    }
}

/// Like [`spi`], for a PPI number.
pub const fn ppi(n: u32) -> IntId {
    match IntId::ppi(n) {
        Ok(id) => id,
        Err(_) => panic!("not a PPI number"),
    }
}

/// What [`Platform::check`] finds wrong.
#[derive(Debug, PartialEq, Eq)]
pub enum PlatformError {
    /// The load address is not 2 MiB aligned (arm64 Image / BL33 rule).
    LoadAlignment,
    /// The load address falls in a device window.
    LoadInDevices,
    /// The early UART is not in a device window (the boot map would map it
    /// as normal memory).
    UartNotDevice,
    /// A device window range is empty or reaches past 512 GiB.
    BadWindow,
}

impl Platform {
    /// Whether 1 GiB window `gib` holds devices.
    pub const fn is_device_gib(&self, gib: u64) -> bool {
        let mut i = 0;
        while i < self.device_gib.len() {
            let (first, end) = self.device_gib[i];
            if gib >= first && gib < end {
                return true;
            }
            i += 1;
        }
        false
    }

    /// The consistency rules every platform must keep.
    pub fn check(&self) -> Result<(), PlatformError> {
        if self.device_gib.iter().any(|&(f, e)| f >= e || e > 512) {
            return Err(PlatformError::BadWindow);
        }
        if !self.load_address.is_multiple_of(2 << 20) {
            return Err(PlatformError::LoadAlignment);
        }
        if self.is_device_gib(self.load_address >> 30) {
            return Err(PlatformError::LoadInDevices);
        }
        if !self.is_device_gib(self.early_uart >> 30) {
            return Err(PlatformError::UartNotDevice);
        }
        Ok(())
    }
}

/// Every platform's descriptor, whichever one this build is for: the host
/// tests check them all, and xtask's runners take their addresses from here.
pub mod known {
    /// `platforms/qemu-virt/platform.rs`.
    pub mod qemu_virt {
        use crate::platform_desc::*;
        include!("../../../platforms/qemu-virt/platform.rs");
    }
    /// `platforms/fvp-base-revc/platform.rs`.
    pub mod fvp_base_revc {
        use crate::platform_desc::*;
        include!("../../../platforms/fvp-base-revc/platform.rs");
    }

    /// All of them, in `platforms/` order.
    pub const ALL: &[&super::Platform] = &[&qemu_virt::PLATFORM, &fvp_base_revc::PLATFORM];
}

#[cfg(test)]
mod tests {
    use super::known::{fvp_base_revc, qemu_virt, ALL};
    use super::*;

    /// `LOAD_ADDRESS = 0x...;` from the platform's linker-script fragment.
    fn ld_load_address(name: &str) -> u64 {
        let path = format!("{}/../../platforms/{name}/platform.ld", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        let line = text.lines().find(|l| l.trim_start().starts_with("LOAD_ADDRESS")).expect("LOAD_ADDRESS line");
        let hex = line.split('=').nth(1).unwrap().trim().trim_end_matches(';').trim();
        u64::from_str_radix(hex.trim_start_matches("0x"), 16).unwrap()
    }

    #[test]
    fn every_platform_is_consistent_with_its_linker_script() {
        for p in ALL {
            assert_eq!(p.check(), Ok(()), "{}", p.name);
            assert_eq!(ld_load_address(p.name), p.load_address, "{}: platform.ld vs platform.rs", p.name);
            let dir = format!("{}/../../platforms/{}", env!("CARGO_MANIFEST_DIR"), p.name);
            assert!(std::path::Path::new(&dir).is_dir(), "{} names its directory", p.name);
        }
    }

    #[test]
    fn qemu_virt_keeps_its_historic_values() {
        let q = &qemu_virt::PLATFORM;
        assert_eq!(q.early_uart, 0x0900_0000);
        assert_eq!(q.load_address, 0x4020_0000);
        assert_eq!(q.hyp_reserved, 512 << 20);
        assert_eq!(u32::from(q.uart_intid), 33);
        assert_eq!(u32::from(q.maintenance_intid), 25);
        assert!(q.is_device_gib(0));
        // The second GICR region and the high ECAM at 256 GiB.
        assert!(q.is_device_gib(256));
        assert!(!q.is_device_gib(1) && !q.is_device_gib(255) && !q.is_device_gib(257));
    }

    #[test]
    fn fvp_base_revc_descriptor() {
        let f = &fvp_base_revc::PLATFORM;
        assert_eq!(f.early_uart, 0x1C09_0000);
        assert_eq!(f.load_address, 0x8800_0000);
        // UART0 is SPI 5 on FVP; the GIC maintenance interrupt PPI 9.
        assert_eq!(u32::from(f.uart_intid), 37);
        assert_eq!(u32::from(f.maintenance_intid), 25);
        // Devices (flash, IOFPGA, GIC, PCIe ECAM and 32-bit window) below
        // 2 GiB; DRAM at 2 GiB and 34 GiB is normal memory.
        assert!(f.is_device_gib(0) && f.is_device_gib(1));
        assert!(!f.is_device_gib(2) && !f.is_device_gib(34));
    }

    #[test]
    fn check_rejects_bad_descriptors() {
        let good = qemu_virt::PLATFORM;
        assert_eq!(Platform { load_address: 0x4010_0000, ..good }.check(), Err(PlatformError::LoadAlignment));
        assert_eq!(Platform { load_address: 0x0020_0000, ..good }.check(), Err(PlatformError::LoadInDevices));
        assert_eq!(Platform { early_uart: 0x4000_0000, ..good }.check(), Err(PlatformError::UartNotDevice));
        assert_eq!(Platform { device_gib: &[(1, 1)], ..good }.check(), Err(PlatformError::BadWindow));
    }
}
