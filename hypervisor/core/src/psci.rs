//! PSCI 1.1 (Arm DEN 0022) and SMCCC (Arm DEN 0028) as the guest sees them.
//!
//! This module only decodes calls and defines the return codes; the VM layer
//! performs them (CPU_ON touches vCPU state, SYSTEM_OFF ends the VM).

pub const PSCI_VERSION: u32 = 0x8400_0000;
pub const CPU_SUSPEND_32: u32 = 0x8400_0001;
pub const CPU_SUSPEND_64: u32 = 0xc400_0001;
pub const CPU_OFF: u32 = 0x8400_0002;
pub const CPU_ON_32: u32 = 0x8400_0003;
pub const CPU_ON_64: u32 = 0xc400_0003;
pub const AFFINITY_INFO_32: u32 = 0x8400_0004;
pub const AFFINITY_INFO_64: u32 = 0xc400_0004;
pub const MIGRATE_INFO_TYPE: u32 = 0x8400_0006;
pub const SYSTEM_OFF: u32 = 0x8400_0008;
pub const SYSTEM_RESET: u32 = 0x8400_0009;
pub const PSCI_FEATURES: u32 = 0x8400_000a;
pub const SMCCC_VERSION: u32 = 0x8000_0000;
pub const SMCCC_ARCH_FEATURES: u32 = 0x8000_0001;

/// PSCI return codes.
pub const SUCCESS: i64 = 0;
pub const NOT_SUPPORTED: i64 = -1;
pub const INVALID_PARAMETERS: i64 = -2;
pub const DENIED: i64 = -3;
pub const ALREADY_ON: i64 = -4;
pub const ON_PENDING: i64 = -5;
pub const INTERNAL_FAILURE: i64 = -6;
pub const NOT_PRESENT: i64 = -7;
pub const DISABLED: i64 = -8;
pub const INVALID_ADDRESS: i64 = -9;

/// AFFINITY_INFO states.
pub const AFF_ON: i64 = 0;
pub const AFF_OFF: i64 = 1;
pub const AFF_ON_PENDING: i64 = 2;

/// PSCI 1.1 as (major << 16) | minor.
pub const VERSION_1_1: u64 = 0x0001_0001;
/// SMCCC 1.1.
pub const SMCCC_VERSION_1_1: u64 = 0x0001_0001;

/// A decoded guest call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Version,
    Features {
        function: u32,
    },
    CpuSuspend,
    CpuOff,
    CpuOn {
        target: u64,
        entry: u64,
        context: u64,
    },
    AffinityInfo {
        target: u64,
        level: u64,
    },
    MigrateInfoType,
    SystemOff,
    SystemReset,
    SmcccVersion,
    SmcccArchFeatures {
        function: u32,
    },
    /// SMCCC ARCH_WORKAROUND_1/2/3 (see `crate::mitigations`).
    ArchWorkaround {
        function: u32,
    },
    /// Anything else: answered with SMCCC NOT_SUPPORTED (-1).
    Unknown {
        function: u32,
    },
}

/// Decodes the function in x0 with arguments x1..x3. 32-bit calling
/// convention arguments are truncated to 32 bits as SMC32 requires.
pub fn decode(x0: u64, x1: u64, x2: u64, x3: u64) -> Call {
    let function = x0 as u32;
    if !in_known_ranges(function) {
        // Outside the two small ranges every known function lies in: no
        // comparison against each of them (the null hypercall's path).
        return Call::Unknown { function };
    }
    let smc32 = function & (1 << 30) == 0;
    let arg = |v: u64| if smc32 { v & 0xffff_ffff } else { v };
    match function {
        PSCI_VERSION => Call::Version,
        PSCI_FEATURES => Call::Features { function: x1 as u32 },
        CPU_SUSPEND_32 | CPU_SUSPEND_64 => Call::CpuSuspend,
        CPU_OFF => Call::CpuOff,
        CPU_ON_32 | CPU_ON_64 => Call::CpuOn { target: arg(x1), entry: arg(x2), context: arg(x3) },
        AFFINITY_INFO_32 | AFFINITY_INFO_64 => Call::AffinityInfo { target: arg(x1), level: arg(x2) },
        MIGRATE_INFO_TYPE => Call::MigrateInfoType,
        SYSTEM_OFF => Call::SystemOff,
        SYSTEM_RESET => Call::SystemReset,
        SMCCC_VERSION => Call::SmcccVersion,
        SMCCC_ARCH_FEATURES => Call::SmcccArchFeatures { function: x1 as u32 },
        crate::mitigations::ARCH_WORKAROUND_1
        | crate::mitigations::ARCH_WORKAROUND_2
        | crate::mitigations::ARCH_WORKAROUND_3 => Call::ArchWorkaround { function },
        _ => Call::Unknown { function },
    }
}

/// Whether `function` may be one `decode` knows: PSCI's numbers 0-31 (fast
/// calls, standard secure service, SMC32 or SMC64) or the Arm architecture
/// service's first 64 Ki numbers (SMC32). Every other value is unknown.
fn in_known_ranges(function: u32) -> bool {
    function & 0xbfff_ffe0 == 0x8400_0000 || function & 0xffff_0000 == 0x8000_0000
}

/// PSCI_FEATURES: which functions this implementation provides.
pub fn features(function: u32) -> i64 {
    match function {
        PSCI_VERSION | CPU_SUSPEND_32 | CPU_SUSPEND_64 | CPU_OFF | CPU_ON_32 | CPU_ON_64 | AFFINITY_INFO_32
        | AFFINITY_INFO_64 | MIGRATE_INFO_TYPE | SYSTEM_OFF | SYSTEM_RESET | PSCI_FEATURES | SMCCC_VERSION => SUCCESS,
        _ => NOT_SUPPORTED,
    }
}

/// MIGRATE_INFO_TYPE: 2 = no Trusted OS that needs migration.
pub const MIGRATE_NOT_REQUIRED: i64 = 2;

/// Checks a CPU_ON request against the VM's vCPUs (`mpidrs`, whether each
/// is `online`) and its RAM (`[ram_start, ram_end)`): the vCPU index to
/// start, or the PSCI error the caller returns.
pub fn validate_cpu_on(
    target: u64,
    entry: u64,
    mpidrs: &[u64],
    online: &[bool],
    ram_start: u64,
    ram_end: u64,
) -> Result<usize, i64> {
    const AFF_MASK: u64 = 0xff_00ff_ffff;
    let t = mpidrs.iter().position(|&m| m & AFF_MASK == target & AFF_MASK && target & !AFF_MASK & !(1 << 31) == 0);
    let t = t.ok_or(INVALID_PARAMETERS)?;
    if online.get(t).copied().unwrap_or(true) {
        return Err(ALREADY_ON);
    }
    if !entry.is_multiple_of(4) || entry < ram_start || entry.checked_add(4).is_none_or(|e| e > ram_end) {
        return Err(INVALID_ADDRESS);
    }
    Ok(t)
}

#[cfg(test)]
// Register values are written field by field, zero fields included.
#[allow(clippy::identity_op)]
mod tests {
    use super::*;

    #[test]
    fn cpu_on_validation() {
        let mpidrs = [0x0, 0x1, 0x100];
        let online = [true, false, false];
        let ram = (0x6000_0000, 0xa000_0000);
        assert_eq!(validate_cpu_on(0x1, 0x6008_0000, &mpidrs, &online, ram.0, ram.1), Ok(1));
        assert_eq!(validate_cpu_on(0x100, 0x6008_0000, &mpidrs, &online, ram.0, ram.1), Ok(2));
        // Twice: the caller marks it online after the first.
        assert_eq!(validate_cpu_on(0x0, 0x6008_0000, &mpidrs, &online, ram.0, ram.1), Err(ALREADY_ON));
        // No such vCPU, or junk in the non-affinity bits.
        assert_eq!(validate_cpu_on(0x7, 0x6008_0000, &mpidrs, &online, ram.0, ram.1), Err(INVALID_PARAMETERS));
        assert_eq!(
            validate_cpu_on(0x1 | (1 << 50), 0x6008_0000, &mpidrs, &online, ram.0, ram.1),
            Err(INVALID_PARAMETERS)
        );
        // Entry points outside RAM, misaligned, or wrapping.
        assert_eq!(validate_cpu_on(0x1, 0x1000, &mpidrs, &online, ram.0, ram.1), Err(INVALID_ADDRESS));
        assert_eq!(validate_cpu_on(0x1, 0x6008_0002, &mpidrs, &online, ram.0, ram.1), Err(INVALID_ADDRESS));
        assert_eq!(validate_cpu_on(0x1, 0x9fff_fffe, &mpidrs, &online, ram.0, ram.1), Err(INVALID_ADDRESS));
        assert_eq!(validate_cpu_on(0x1, u64::MAX & !3, &mpidrs, &online, ram.0, ram.1), Err(INVALID_ADDRESS));
    }

    #[test]
    fn decodes_cpu_on_32_truncates() {
        assert_eq!(
            decode(CPU_ON_32 as u64, 0xffff_ffff_0000_0001, 0x1_4000_0000, 7),
            Call::CpuOn { target: 1, entry: 0x4000_0000, context: 7 }
        );
        assert_eq!(
            decode(CPU_ON_64 as u64, 0x101, 0x1_4000_0000, 7),
            Call::CpuOn { target: 0x101, entry: 0x1_4000_0000, context: 7 }
        );
    }

    #[test]
    fn every_known_function_is_in_the_known_ranges() {
        let known = [
            PSCI_VERSION,
            CPU_SUSPEND_32,
            CPU_SUSPEND_64,
            CPU_OFF,
            CPU_ON_32,
            CPU_ON_64,
            AFFINITY_INFO_32,
            AFFINITY_INFO_64,
            MIGRATE_INFO_TYPE,
            SYSTEM_OFF,
            SYSTEM_RESET,
            PSCI_FEATURES,
            SMCCC_VERSION,
            SMCCC_ARCH_FEATURES,
            crate::mitigations::ARCH_WORKAROUND_1,
            crate::mitigations::ARCH_WORKAROUND_2,
            crate::mitigations::ARCH_WORKAROUND_3,
        ];
        for f in known {
            assert!(in_known_ranges(f), "{f:#x}");
            assert_ne!(decode(u64::from(f), 0, 0, 0), Call::Unknown { function: f }, "{f:#x}");
        }
        for f in [0x8400_00ff, 0x8400_0020, 0xc400_0020, 0x8001_0000, 0xc000_0000, 0x8600_0000, 0x0400_0000] {
            assert!(!in_known_ranges(f), "{f:#x}");
            assert_eq!(decode(u64::from(f), 0, 0, 0), Call::Unknown { function: f });
        }
    }

    #[test]
    fn unknown_calls_and_features() {
        assert_eq!(decode(0xc200_0000, 0, 0, 0), Call::Unknown { function: 0xc200_0000 });
        // The upper half of x0 is ignored: the function ID is W0.
        assert_eq!(decode(0xdead_0000_8400_0000, 0, 0, 0), Call::Version);
        assert_eq!(features(SYSTEM_OFF), SUCCESS);
        assert_eq!(features(0x8400_0012), NOT_SUPPORTED);
        assert_eq!(decode(0x8000_8000, 0, 0, 0), Call::ArchWorkaround { function: 0x8000_8000 });
        assert_eq!(decode(0x8000_7fff, 1, 0, 0), Call::ArchWorkaround { function: 0x8000_7fff });
        assert_eq!(decode(0x8000_3fff, 0, 0, 0), Call::ArchWorkaround { function: 0x8000_3fff });
        assert_eq!(decode(0x8000_0001, 0x8000_8000, 0, 0), Call::SmcccArchFeatures { function: 0x8000_8000 });
    }
}
