//! Decoding of ESR_EL2 syndromes for traps taken from a guest.
//!
//! Pure functions over the raw register values so the host tests cover every
//! path. The EL2 trap handler reads ESR_EL2/FAR_EL2/HPFAR_EL2 and calls
//! [`decode`]; what comes back is a typed [`Exit`] that the VM layer acts on.

/// Exception classes (ESR_ELx.EC) we handle; Arm ARM D17.2.37.
pub mod ec {
    pub const UNKNOWN: u8 = 0x00;
    pub const WFX: u8 = 0x01;
    pub const FP_ASIMD: u8 = 0x07;
    pub const HVC64: u8 = 0x16;
    pub const SMC64: u8 = 0x17;
    pub const SYSREG: u8 = 0x18;
    pub const SVE: u8 = 0x19;
    pub const SME: u8 = 0x1d;
    pub const IABT_LOWER: u8 = 0x20;
    pub const DABT_LOWER: u8 = 0x24;
}

/// A guest data abort that may be an MMIO access to an emulated device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmioAccess {
    /// Intermediate physical address (HPFAR page + FAR offset).
    pub ipa: u64,
    /// Access size in bytes: 1, 2, 4 or 8.
    pub size: u8,
    pub write: bool,
    /// Transfer register number; 31 means XZR/WZR.
    pub reg: u8,
    /// Sign-extend a load (SSE).
    pub sign_extend: bool,
    /// The destination is a 64-bit register (SF).
    pub reg64: bool,
}

/// A trapped system-register access (EC 0x18).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SysRegAccess {
    pub op0: u8,
    pub op1: u8,
    pub crn: u8,
    pub crm: u8,
    pub op2: u8,
    pub reg: u8,
    pub read: bool,
}

impl SysRegAccess {
    /// The encoding as one comparable value (op0, op1, CRn, CRm, op2).
    pub const fn key(&self) -> u32 {
        sysreg_key(self.op0, self.op1, self.crn, self.crm, self.op2)
    }
}

/// Packs a system register encoding into one comparable value.
pub const fn sysreg_key(op0: u8, op1: u8, crn: u8, crm: u8, op2: u8) -> u32 {
    ((op0 as u32) << 16) | ((op1 as u32) << 12) | ((crn as u32) << 8) | ((crm as u32) << 4) | op2 as u32
}

/// ICC_SGI1R_EL1: op0=3, op1=0, CRn=12, CRm=11, op2=5.
pub const ICC_SGI1R_EL1: u32 = sysreg_key(3, 0, 12, 11, 5);
/// ICC_ASGI1R_EL1 and ICC_SGI0R_EL1 (trapped together with SGI1R).
pub const ICC_ASGI1R_EL1: u32 = sysreg_key(3, 0, 12, 11, 6);
pub const ICC_SGI0R_EL1: u32 = sysreg_key(3, 0, 12, 11, 7);

/// The timeout of a trapped WFx instruction (ESR ISS.TI, RV, RN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WfxTimeout {
    /// WFI or WFE: wait without a limit.
    None,
    /// WFIT or WFET: the wait ends when CNTVCT_EL0 reaches the value of
    /// this register (31 is XZR, i.e. 0: already passed).
    Reg(u8),
    /// WFIT or WFET whose syndrome does not name the register (ISS.RV = 0):
    /// the limit is unknown, so the wait must end at once (a spurious
    /// wake-up is always allowed; waiting past the limit is not).
    Unknown,
}

impl WfxTimeout {
    /// Until when (ns of the counter, CNTVOFF = 0) the wait may last:
    /// `u64::MAX` without a limit, 0 when it must end at once. `reg` reads a
    /// guest register (31 reads as 0).
    pub fn limit_ns(self, reg: impl Fn(u8) -> u64, freq_hz: u64) -> u64 {
        match self {
            WfxTimeout::None => u64::MAX,
            WfxTimeout::Reg(r) => crate::time::ticks_to_ns(reg(r), freq_hz),
            WfxTimeout::Unknown => 0,
        }
    }
}

/// Why the guest exited, as far as the syndrome tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// WFI/WFIT (`wfe == false`) or WFE/WFET, with the timeout of WFIT/WFET.
    Wfx {
        wfe: bool,
        timeout: WfxTimeout,
    },
    Hvc {
        imm: u16,
    },
    Smc {
        imm: u16,
    },
    SysReg(SysRegAccess),
    /// A stage-2 data abort with a valid instruction syndrome.
    Mmio(MmioAccess),
    /// A stage-2 data abort we cannot emulate (ISV=0, or not a translation
    /// or access fault): the guest gets an external abort.
    DataAbort {
        ipa: u64,
        iss: u32,
    },
    /// A stage-2 instruction abort: the guest executed from a hole.
    InstructionAbort {
        ipa: u64,
    },
    /// An FP/SIMD, SVE or SME access the configuration traps.
    Undefined {
        ec: u8,
    },
    Unknown {
        ec: u8,
        iss: u32,
    },
}

/// The exit's exception class.
pub const fn exception_class(esr: u64) -> u8 {
    ((esr >> 26) & 0x3f) as u8
}

/// 32-bit instruction (IL=1) or 16-bit; traps from AArch64 are always 32-bit.
pub const fn instruction_length(esr: u64) -> u64 {
    if esr & (1 << 25) != 0 {
        4
    } else {
        2
    }
}

/// The faulting IPA from HPFAR_EL2 (bits \[43:4\] hold IPA\[51:12\]) and the
/// page offset from FAR_EL2.
pub const fn fault_ipa(hpfar: u64, far: u64) -> u64 {
    ((hpfar & 0x0000_0fff_ffff_fff0) << 8) | (far & 0xfff)
}

/// Decodes a syndrome for a trap from a lower exception level.
pub fn decode(esr: u64, far: u64, hpfar: u64) -> Exit {
    let ec = exception_class(esr);
    let iss = (esr & 0x01ff_ffff) as u32;
    match ec {
        ec::WFX => decode_wfx(iss),
        ec::HVC64 => Exit::Hvc { imm: iss as u16 },
        ec::SMC64 => Exit::Smc { imm: iss as u16 },
        ec::SYSREG => Exit::SysReg(SysRegAccess {
            op0: ((iss >> 20) & 3) as u8,
            op2: ((iss >> 17) & 7) as u8,
            op1: ((iss >> 14) & 7) as u8,
            crn: ((iss >> 10) & 0xf) as u8,
            reg: ((iss >> 5) & 0x1f) as u8,
            crm: ((iss >> 1) & 0xf) as u8,
            read: iss & 1 == 1,
        }),
        ec::DABT_LOWER => decode_dabt(iss, far, hpfar),
        ec::IABT_LOWER => Exit::InstructionAbort { ipa: fault_ipa(hpfar, far) },
        ec::FP_ASIMD | ec::SVE | ec::SME => Exit::Undefined { ec },
        _ => Exit::Unknown { ec, iss },
    }
}

/// ISS of EC 0x01: TI\[1:0\] (0b00 WFI, 0b01 WFE, 0b10 WFIT, 0b11 WFET),
/// RV\[2\] (RN valid, WFIT/WFET only), RN\[9:5\].
fn decode_wfx(iss: u32) -> Exit {
    let ti = iss & 0b11;
    let timeout = if ti & 0b10 == 0 {
        WfxTimeout::None
    } else if iss & (1 << 2) != 0 {
        WfxTimeout::Reg(((iss >> 5) & 0x1f) as u8)
    } else {
        WfxTimeout::Unknown
    };
    Exit::Wfx { wfe: ti & 1 == 1, timeout }
}

/// A data abort's ISS says a stage-2 translation fault (DFSC 0b0001LL, any
/// level) on the access itself, not on a stage-1 table walk (S1PTW): the
/// IPA has no mapping, so one may be added (on-demand device memory).
pub const fn is_translation_fault(iss: u32) -> bool {
    iss & 0x3c == 0x04 && iss & (1 << 7) == 0
}

/// The access an abort delivered to a guest reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortKind {
    /// An instruction fetch.
    Fetch,
    /// A data access: ISS.WnR (a store) and ISS.CM (cache maintenance), as
    /// the trap reported them.
    Data { write: bool, cache_maint: bool },
}

impl AbortKind {
    /// A data abort's WnR and CM from the ISS of the trap (valid for every
    /// data abort, with or without ISV).
    pub const fn from_dabt_iss(iss: u32) -> AbortKind {
        AbortKind::Data { write: iss & (1 << 6) != 0, cache_maint: iss & (1 << 8) != 0 }
    }
}

/// ESR_EL1 of the synchronous external abort a guest gets for an access
/// the hypervisor cannot complete (`same_el`: the access came from EL1):
/// EC for a data or instruction abort from the current or a lower EL, IL
/// set, FSC = synchronous external abort, and for data the trap's WnR and
/// CM, so the guest tells a faulting store from a load as on hardware.
pub const fn injected_abort_esr(kind: AbortKind, same_el: bool) -> u64 {
    let ec: u64 = match (kind, same_el) {
        (AbortKind::Data { .. }, true) => 0x25,
        (AbortKind::Data { .. }, false) => 0x24,
        (AbortKind::Fetch, true) => 0x21,
        (AbortKind::Fetch, false) => 0x20,
    };
    let mut iss: u64 = 0x10;
    if let AbortKind::Data { write, cache_maint } = kind {
        if write {
            iss |= 1 << 6;
        }
        if cache_maint {
            iss |= 1 << 8;
        }
    }
    (ec << 26) | (1 << 25) | iss
}

fn decode_dabt(iss: u32, far: u64, hpfar: u64) -> Exit {
    let ipa = fault_ipa(hpfar, far);
    let isv = iss & (1 << 24) != 0;
    let dfsc = iss & 0x3f;
    // Translation faults (0b0001LL) and access-flag faults (0b0010LL) at any
    // level are what unmapped (emulated) regions raise. Anything else, e.g. a
    // permission fault or a fault on a stage-1 walk (S1PTW), is not MMIO.
    let s1ptw = iss & (1 << 7) != 0;
    let translation = matches!(dfsc & 0x3c, 0x04 | 0x08);
    if !isv || s1ptw || !translation {
        return Exit::DataAbort { ipa, iss };
    }
    let sas = (iss >> 22) & 3;
    Exit::Mmio(MmioAccess {
        ipa,
        size: 1 << sas,
        sign_extend: iss & (1 << 21) != 0,
        reg: ((iss >> 16) & 0x1f) as u8,
        reg64: iss & (1 << 15) != 0,
        write: iss & (1 << 6) != 0,
    })
}

/// Applies sign extension and register width to a value loaded by an MMIO
/// read, as the load instruction would have.
pub fn load_value(access: &MmioAccess, raw: u64) -> u64 {
    // The loaded bytes moved to the top and back: zero- or sign-extended
    // by the shift's kind, with no branch on the size.
    let unused = 64u32.saturating_sub(u32::from(access.size) * 8);
    let top = raw.checked_shl(unused).unwrap_or(0);
    let v = if access.sign_extend {
        ((top as i64).checked_shr(unused).unwrap_or(0)) as u64
    } else {
        top.checked_shr(unused).unwrap_or(0)
    };
    if access.reg64 {
        v
    } else {
        v & 0xffff_ffff
    }
}

/// The value a store writes: the low `size` bytes of the register.
pub fn store_value(access: &MmioAccess, reg: u64) -> u64 {
    let bits = access.size as u32 * 8;
    if bits >= 64 {
        reg
    } else {
        reg & ((1u64 << bits) - 1)
    }
}

#[cfg(test)]
// Register values are written field by field, zero fields included.
#[allow(clippy::identity_op)]
mod tests {
    use super::*;

    fn esr(ec: u8, il: bool, iss: u32) -> u64 {
        ((ec as u64) << 26) | ((il as u64) << 25) | iss as u64
    }

    #[test]
    fn injected_aborts_keep_the_access_direction() {
        let load = AbortKind::Data { write: false, cache_maint: false };
        let store = AbortKind::Data { write: true, cache_maint: false };
        assert_eq!(injected_abort_esr(load, true), 0x9600_0010);
        assert_eq!(injected_abort_esr(store, true), 0x9600_0050);
        assert_eq!(injected_abort_esr(store, false), 0x9200_0050);
        assert_eq!(injected_abort_esr(AbortKind::Fetch, true), 0x8600_0010);
        assert_eq!(injected_abort_esr(AbortKind::Fetch, false), 0x8200_0010);
        // From a trapped ISS (ISV = 0, a store; a DC maintenance op): WnR and
        // CM carried over, nothing else (SAS, SRT, FSC of the stage-2 fault).
        let store_iss = (1 << 6) | 0x07;
        assert_eq!(AbortKind::from_dabt_iss(store_iss), store);
        let dc = (1 << 8) | (1 << 6) | 0x06;
        assert_eq!(injected_abort_esr(AbortKind::from_dabt_iss(dc), true), 0x9600_0150);
        let isv_load = (1 << 24) | (2 << 22) | (3 << 16) | 0x05;
        assert_eq!(injected_abort_esr(AbortKind::from_dabt_iss(isv_load), true), 0x9600_0010);
    }

    #[test]
    fn wfi_and_wfe() {
        assert_eq!(decode(esr(ec::WFX, true, 0), 0, 0), Exit::Wfx { wfe: false, timeout: WfxTimeout::None });
        assert_eq!(decode(esr(ec::WFX, true, 1), 0, 0), Exit::Wfx { wfe: true, timeout: WfxTimeout::None });
    }

    #[test]
    fn wfit_and_wfet_carry_their_timeout_register() {
        // WFIT X5: TI = 0b10, RV = 1, RN = 5.
        let wfit = (5 << 5) | (1 << 2) | 0b10;
        assert_eq!(decode(esr(ec::WFX, true, wfit), 0, 0), Exit::Wfx { wfe: false, timeout: WfxTimeout::Reg(5) });
        // WFET X30: TI = 0b11.
        let wfet = (30 << 5) | (1 << 2) | 0b11;
        assert_eq!(decode(esr(ec::WFX, true, wfet), 0, 0), Exit::Wfx { wfe: true, timeout: WfxTimeout::Reg(30) });
        // WFIT XZR: a limit of 0, already passed.
        let wfit_xzr = (31 << 5) | (1 << 2) | 0b10;
        assert_eq!(decode(esr(ec::WFX, true, wfit_xzr), 0, 0), Exit::Wfx { wfe: false, timeout: WfxTimeout::Reg(31) });
        // RV = 0: the register is not known, the wait may not block.
        assert_eq!(
            decode(esr(ec::WFX, true, (7 << 5) | 0b10), 0, 0),
            Exit::Wfx { wfe: false, timeout: WfxTimeout::Unknown }
        );
        assert_eq!(decode(esr(ec::WFX, true, 0b11), 0, 0), Exit::Wfx { wfe: true, timeout: WfxTimeout::Unknown });
        // Limits in ns of the 62.5 MHz QEMU counter.
        let regs = |r: u8| if r == 31 { 0 } else { 625 * u64::from(r) };
        assert_eq!(WfxTimeout::None.limit_ns(regs, 62_500_000), u64::MAX);
        assert_eq!(WfxTimeout::Reg(5).limit_ns(regs, 62_500_000), 50_000);
        assert_eq!(WfxTimeout::Reg(31).limit_ns(regs, 62_500_000), 0);
        assert_eq!(WfxTimeout::Unknown.limit_ns(regs, 62_500_000), 0);
        assert_eq!(WfxTimeout::Reg(1).limit_ns(|_| u64::MAX, 62_500_000), u64::MAX);
        // RN and RV are RES0 for WFI/WFE: ignored.
        assert_eq!(
            decode(esr(ec::WFX, true, (3 << 5) | (1 << 2)), 0, 0),
            Exit::Wfx { wfe: false, timeout: WfxTimeout::None }
        );
    }

    #[test]
    fn hvc_smc_immediates() {
        assert_eq!(decode(esr(ec::HVC64, true, 0x1234), 0, 0), Exit::Hvc { imm: 0x1234 });
        assert_eq!(decode(esr(ec::SMC64, true, 0), 0, 0), Exit::Smc { imm: 0 });
    }

    #[test]
    fn mmio_word_store() {
        // ISV, SAS=2 (word), SRT=3, WnR, DFSC translation level 3.
        let iss = (1 << 24) | (2 << 22) | (3 << 16) | (1 << 6) | 0x07;
        let hpfar = (0x0900_0000u64 >> 12) << 4;
        match decode(esr(ec::DABT_LOWER, true, iss), 0xffff_0000_0900_0018, hpfar) {
            Exit::Mmio(a) => {
                assert_eq!(a.ipa, 0x0900_0018);
                assert_eq!(a.size, 4);
                assert!(a.write);
                assert_eq!(a.reg, 3);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn mmio_byte_load_sign_extended() {
        let iss = (1 << 24) | (0 << 22) | (1 << 21) | (5 << 16) | (1 << 15) | 0x06;
        let Exit::Mmio(a) = decode(esr(ec::DABT_LOWER, true, iss), 0x10, 0x80) else { panic!() };
        assert_eq!(a.size, 1);
        assert!(!a.write);
        assert_eq!(load_value(&a, 0x80), 0xffff_ffff_ffff_ff80);
        assert_eq!(load_value(&a, 0x1_7f), 0x7f);
    }

    #[test]
    fn w_register_load_is_truncated() {
        let a = MmioAccess { ipa: 0, size: 8, write: false, reg: 0, sign_extend: false, reg64: false };
        assert_eq!(load_value(&a, 0x1234_5678_9abc_def0), 0x9abc_def0);
        let b = MmioAccess { size: 2, ..a };
        assert_eq!(store_value(&b, 0xffff_1234), 0x1234);
    }

    #[test]
    fn no_isv_is_not_guessed() {
        let iss = 0x07 | (1 << 6);
        assert!(matches!(decode(esr(ec::DABT_LOWER, true, iss), 0, 0), Exit::DataAbort { .. }));
    }

    #[test]
    fn translation_faults_only_on_the_access_itself() {
        for level in 0..4 {
            assert!(is_translation_fault(0x04 | level), "level {level}");
            assert!(is_translation_fault((1 << 24) | (1 << 6) | 0x04 | level), "with ISV and WnR");
            assert!(!is_translation_fault((1 << 7) | 0x04 | level), "S1PTW");
            assert!(!is_translation_fault(0x08 | level), "access flag");
            assert!(!is_translation_fault(0x0c | level), "permission");
        }
        assert!(!is_translation_fault(0x10), "synchronous external abort");
        assert!(!is_translation_fault(0x21), "alignment");
    }

    #[test]
    fn permission_fault_and_s1ptw_are_not_mmio() {
        let perm = (1 << 24) | (2 << 22) | 0x0f;
        assert!(matches!(decode(esr(ec::DABT_LOWER, true, perm), 0, 0), Exit::DataAbort { .. }));
        let ptw = (1 << 24) | (2 << 22) | (1 << 7) | 0x07;
        assert!(matches!(decode(esr(ec::DABT_LOWER, true, ptw), 0, 0), Exit::DataAbort { .. }));
    }

    #[test]
    fn sysreg_sgi1r_write() {
        // op0=3 op2=5 op1=0 CRn=12 Rt=2 CRm=11 write.
        let iss = (3 << 20) | (5 << 17) | (0 << 14) | (12 << 10) | (2 << 5) | (11 << 1);
        let Exit::SysReg(s) = decode(esr(ec::SYSREG, true, iss), 0, 0) else { panic!() };
        assert_eq!(s.key(), ICC_SGI1R_EL1);
        assert!(!s.read);
        assert_eq!(s.reg, 2);
    }

    #[test]
    fn every_syndrome_decodes_without_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let e = decode(x & 0xffff_ffff, x.rotate_left(17), x.rotate_left(31));
            if let Exit::Mmio(a) = e {
                assert!(matches!(a.size, 1 | 2 | 4 | 8));
                let _ = load_value(&a, x);
            }
        }
    }
}
