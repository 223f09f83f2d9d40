//! Transient-execution mitigations: what this CPU needs (from its MIDR and
//! ID registers, and what firmware says), what the hypervisor does on every
//! guest exit, and what guests are told through SMCCC_ARCH_FEATURES.
//!
//! The decisions follow Linux's (`arch/arm64/kernel/proton-pack.c`), and
//! the answers to guests KVM's (`arch/arm64/kvm/hypercalls.c`), so a Linux
//! guest reports in `/sys/devices/system/cpu/vulnerabilities/` what it
//! would report on the bare CPU with the same firmware:
//!
//! - Spectre-v2 (ARCH_WORKAROUND_1): unaffected with ID_AA64PFR0_EL1.CSV2
//!   or on a CPU known to be safe; otherwise mitigated only if firmware
//!   implements the workaround (it invalidates the branch predictor, which
//!   EL2 cannot do itself on those CPUs), in which case EL2 calls it on
//!   every guest exit, before its first indirect branch, and a guest's own
//!   call needs nothing more (its trap already did it).
//! - Spectre-v4 (ARCH_WORKAROUND_2): unaffected on known-safe CPUs;
//!   mitigated by PSTATE.SSBS where the CPU has it (guests see SSBS in
//!   their ID registers and are told the firmware call is not there, as
//!   KVM does); otherwise firmware's dynamic mitigation, if any, is turned
//!   on for good at each pCPU's init and guests are told it is not required.
//! - Spectre-BHB (ARCH_WORKAROUND_3): unaffected with CSV2 = 3; mitigated
//!   by hardware with ECBHB, by the CLRBHB instruction, by a branchy loop
//!   of a CPU-specific length, or by firmware's WA3 call on the CPUs that
//!   need it; the hypervisor runs that mitigation on every guest exit.
//!   Without a Spectre-v2 mitigation, mitigating BHB alone is pointless
//!   (Linux's rule): the state is then vulnerable.
//!
//! Firmware is asked once at boot over SMC, and only the way Linux asks:
//! PSCI_FEATURES(SMCCC_VERSION) first, then SMCCC_VERSION ≥ 1.1, then
//! SMCCC_ARCH_FEATURES. QEMU's built-in PSCI (no EL3) answers the first
//! with NOT_SUPPORTED, so nothing else is asked there (an unknown SMC
//! would be UNDEFINED).

/// SMCCC function IDs and return values (Arm DEN 0028).
pub const ARCH_WORKAROUND_1: u32 = 0x8000_8000;
pub const ARCH_WORKAROUND_2: u32 = 0x8000_7fff;
pub const ARCH_WORKAROUND_3: u32 = 0x8000_3fff;
pub const SMCCC_RET_SUCCESS: i64 = 0;
pub const SMCCC_RET_NOT_SUPPORTED: i64 = -1;
pub const SMCCC_RET_NOT_REQUIRED: i64 = -2;
/// ARCH_WORKAROUND_1/3 feature answer: this CPU is not affected.
pub const SMCCC_RET_UNAFFECTED: i64 = 1;

/// How one vulnerability stands, ordered from best to worst.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum State {
    Unaffected,
    Mitigated,
    Vulnerable,
}

impl State {
    /// The machine's state from two CPUs' states: the worse one (a
    /// heterogeneous machine is as exposed as its weakest CPU).
    pub fn combine(self, other: State) -> State {
        self.max(other)
    }
}

/// What the hypervisor runs on every guest exit, before anything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitMitigation {
    None,
    /// SMC to firmware with this function ID (ARCH_WORKAROUND_1 or _3).
    Firmware(u32),
    /// The CLRBHB instruction.
    ClearBhb,
    /// A branchy loop of this many taken branches, then a barrier.
    BhbLoop(u8),
}

impl core::fmt::Display for ExitMitigation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ExitMitigation::None => write!(f, "nothing"),
            ExitMitigation::Firmware(id) => write!(f, "firmware call {id:#x}"),
            ExitMitigation::ClearBhb => write!(f, "CLRBHB"),
            ExitMitigation::BhbLoop(k) => write!(f, "BHB loop of {k}"),
        }
    }
}

impl ExitMitigation {
    /// The word the exit path reads (`CpuRun`): 0 = none, bit 63 + a
    /// function ID = SMC, 1 = CLRBHB, k ≥ 2 = loop of k branches.
    pub fn encode(self) -> u64 {
        match self {
            ExitMitigation::None => 0,
            ExitMitigation::Firmware(f) => (1 << 63) | u64::from(f),
            ExitMitigation::ClearBhb => 1,
            ExitMitigation::BhbLoop(k) => u64::from(k.max(2)),
        }
    }
}

/// Firmware's SMCCC_ARCH_FEATURES answers (x0 as a signed value); `None`
/// when it could not be asked (no SMCCC 1.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Firmware {
    pub wa1: Option<i64>,
    pub wa2: Option<i64>,
    pub wa3: Option<i64>,
}

/// The registers the decision reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuId {
    pub midr: u64,
    pub pfr0: u64,
    pub pfr1: u64,
    pub isar2: u64,
    pub mmfr1: u64,
}

/// One CPU's mitigations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mitigations {
    pub v2: State,
    pub v4: State,
    pub bhb: State,
    /// PSTATE.SSBS exists (the Spectre-v4 mitigation is the guest's own).
    pub ssbs: bool,
    /// Firmware's dynamic Spectre-v4 mitigation is to be turned on for
    /// good at init (ARCH_WORKAROUND_2 with argument 1).
    pub enable_fw_ssbd: bool,
    pub on_exit: ExitMitigation,
}

// MIDR_EL1: implementer [31:24], part number [15:4].
const ARM: u64 = 0x41;
const BRCM: u64 = 0x42;
const HISI: u64 = 0x48;
const QCOM: u64 = 0x51;
const AMPERE: u64 = 0xc0;

const fn model(implementer: u64, part: u64) -> (u64, u64) {
    (implementer, part)
}

const CORTEX_A35: (u64, u64) = model(ARM, 0xd04);
const CORTEX_A53: (u64, u64) = model(ARM, 0xd03);
const CORTEX_A55: (u64, u64) = model(ARM, 0xd05);
const CORTEX_A57: (u64, u64) = model(ARM, 0xd07);
const CORTEX_A72: (u64, u64) = model(ARM, 0xd08);
const CORTEX_A73: (u64, u64) = model(ARM, 0xd09);
const CORTEX_A75: (u64, u64) = model(ARM, 0xd0a);
const CORTEX_A76: (u64, u64) = model(ARM, 0xd0b);
const CORTEX_A77: (u64, u64) = model(ARM, 0xd0d);
const NEOVERSE_N1: (u64, u64) = model(ARM, 0xd0c);
const CORTEX_A78: (u64, u64) = model(ARM, 0xd41);
const CORTEX_X1: (u64, u64) = model(ARM, 0xd44);
const CORTEX_A710: (u64, u64) = model(ARM, 0xd47);
const CORTEX_X2: (u64, u64) = model(ARM, 0xd48);
const NEOVERSE_N2: (u64, u64) = model(ARM, 0xd49);
const CORTEX_A78AE: (u64, u64) = model(ARM, 0xd42);
const CORTEX_A78C: (u64, u64) = model(ARM, 0xd4b);
const NEOVERSE_V1: (u64, u64) = model(ARM, 0xd40);
const BRAHMA_B53: (u64, u64) = model(BRCM, 0x100);
const HISI_TSV110: (u64, u64) = model(HISI, 0xd01);
const KRYO_2XX_SILVER: (u64, u64) = model(QCOM, 0x801);
const KRYO_3XX_SILVER: (u64, u64) = model(QCOM, 0x803);
const KRYO_4XX_SILVER: (u64, u64) = model(QCOM, 0x805);
const AMPERE1: (u64, u64) = model(AMPERE, 0xac3);

/// CPUs without Spectre-v2 (branch target injection).
const V2_SAFE: &[(u64, u64)] =
    &[CORTEX_A35, CORTEX_A53, CORTEX_A55, BRAHMA_B53, HISI_TSV110, KRYO_2XX_SILVER, KRYO_3XX_SILVER, KRYO_4XX_SILVER];
/// CPUs without Spectre-v4 (speculative store bypass).
const V4_SAFE: &[(u64, u64)] = &[CORTEX_A35, CORTEX_A53, CORTEX_A55, BRAHMA_B53, KRYO_3XX_SILVER, KRYO_4XX_SILVER];
/// Spectre-BHB: the branchy loop's length per CPU.
const BHB_LOOP: &[(&[(u64, u64)], u8)] = &[
    (&[CORTEX_A78, CORTEX_A78AE, CORTEX_A78C, CORTEX_X1, CORTEX_A710, CORTEX_X2, NEOVERSE_N2, NEOVERSE_V1], 32),
    (&[CORTEX_A76, CORTEX_A77, NEOVERSE_N1], 24),
    (&[AMPERE1], 11),
    (&[CORTEX_A72, CORTEX_A57], 8),
];
/// Spectre-BHB: CPUs only firmware's ARCH_WORKAROUND_3 mitigates.
const BHB_FIRMWARE: &[(u64, u64)] = &[CORTEX_A73, CORTEX_A75];

fn field(v: u64, shift: u32) -> u64 {
    (v >> shift) & 0xf
}

fn is_one_of(midr: u64, list: &[(u64, u64)]) -> bool {
    let m = ((midr >> 24) & 0xff, (midr >> 4) & 0xfff);
    list.contains(&m)
}

/// A firmware ARCH_WORKAROUND_1/3 feature answer as a state.
fn fw_state(answer: Option<i64>) -> State {
    match answer {
        Some(SMCCC_RET_SUCCESS) => State::Mitigated,
        Some(SMCCC_RET_UNAFFECTED) => State::Unaffected,
        _ => State::Vulnerable,
    }
}

/// The Spectre-BHB loop length for this CPU (0: not a loop CPU).
fn bhb_loop_k(midr: u64) -> u8 {
    BHB_LOOP.iter().find(|(list, _)| is_one_of(midr, list)).map_or(0, |&(_, k)| k)
}

/// Decides one CPU's mitigations.
pub fn decide(id: &CpuId, fw: &Firmware) -> Mitigations {
    let csv2 = field(id.pfr0, 56);
    let ssbs = field(id.pfr1, 4) != 0;
    let clrbhb = field(id.isar2, 28) != 0;
    let ecbhb = field(id.mmfr1, 60) != 0;

    // Spectre-v2.
    let (v2, wa1_at_exit) = if csv2 != 0 || is_one_of(id.midr, V2_SAFE) {
        (State::Unaffected, false)
    } else {
        let s = fw_state(fw.wa1);
        (s, s == State::Mitigated)
    };

    // Spectre-v4.
    let (v4, enable_fw_ssbd) = if is_one_of(id.midr, V4_SAFE) {
        (State::Unaffected, false)
    } else if ssbs {
        (State::Mitigated, false)
    } else {
        match fw.wa2 {
            Some(SMCCC_RET_SUCCESS) => (State::Mitigated, true),
            Some(SMCCC_RET_NOT_REQUIRED) | Some(SMCCC_RET_UNAFFECTED) => (State::Unaffected, false),
            _ => (State::Vulnerable, false),
        }
    };

    // Spectre-BHB.
    let k = bhb_loop_k(id.midr);
    let fw_bhb = is_one_of(id.midr, BHB_FIRMWARE) || fw.wa3 == Some(SMCCC_RET_SUCCESS);
    let affected = csv2 != 3 && (clrbhb || k != 0 || fw_bhb);
    let (bhb, bhb_exit) = if !affected {
        (State::Unaffected, ExitMitigation::None)
    } else if v2 == State::Vulnerable {
        (State::Vulnerable, ExitMitigation::None)
    } else if ecbhb {
        (State::Mitigated, ExitMitigation::None)
    } else if clrbhb {
        (State::Mitigated, ExitMitigation::ClearBhb)
    } else if k != 0 {
        (State::Mitigated, ExitMitigation::BhbLoop(k))
    } else if fw.wa3 == Some(SMCCC_RET_SUCCESS) {
        (State::Mitigated, ExitMitigation::Firmware(ARCH_WORKAROUND_3))
    } else {
        (State::Vulnerable, ExitMitigation::None)
    };

    // One mitigation at exit: WA3 also does WA1's work (Linux drops the
    // WA1 callback when WA3 is in the vectors); the BHB loop and CLRBHB do
    // not invalidate the predictor, so where firmware's WA1 is needed too,
    // the firmware call wins (it is the costlier and the broader).
    let on_exit = match (wa1_at_exit, bhb_exit) {
        (_, ExitMitigation::Firmware(f)) => ExitMitigation::Firmware(f),
        (true, _) => ExitMitigation::Firmware(ARCH_WORKAROUND_1),
        (false, m) => m,
    };
    Mitigations { v2, v4, bhb, ssbs, enable_fw_ssbd, on_exit }
}

/// The machine's states (every pCPU's, combined) that guests are told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestView {
    pub v2: State,
    pub v4: State,
    pub bhb: State,
    /// Every pCPU has SSBS.
    pub ssbs: bool,
}

impl GuestView {
    pub fn of(m: &Mitigations) -> Self {
        GuestView { v2: m.v2, v4: m.v4, bhb: m.bhb, ssbs: m.ssbs }
    }

    pub fn combine(self, other: GuestView) -> Self {
        GuestView {
            v2: self.v2.combine(other.v2),
            v4: self.v4.combine(other.v4),
            bhb: self.bhb.combine(other.bhb),
            ssbs: self.ssbs && other.ssbs,
        }
    }

    /// SMCCC_ARCH_FEATURES(`function`) for ARCH_WORKAROUND_1/2/3; `None`
    /// for any other function.
    pub fn arch_features(&self, function: u32) -> Option<i64> {
        let wa13 = |s: State| match s {
            State::Vulnerable => SMCCC_RET_NOT_SUPPORTED,
            State::Mitigated => SMCCC_RET_SUCCESS,
            State::Unaffected => SMCCC_RET_UNAFFECTED,
        };
        Some(match function {
            ARCH_WORKAROUND_1 => wa13(self.v2),
            ARCH_WORKAROUND_3 => wa13(self.bhb),
            ARCH_WORKAROUND_2 => match self.v4 {
                State::Vulnerable => SMCCC_RET_NOT_SUPPORTED,
                // SSBS everywhere: the guest uses it; no firmware call.
                State::Mitigated if self.ssbs => SMCCC_RET_NOT_SUPPORTED,
                // Firmware's mitigation is on for good, or none is needed.
                State::Mitigated | State::Unaffected => SMCCC_RET_NOT_REQUIRED,
            },
            _ => return None,
        })
    }

    /// What a guest's ARCH_WORKAROUND_n call returns: done (0) where the
    /// feature answer was SUCCESS or NOT_REQUIRED (the exit that carried
    /// the call already ran the hypervisor's mitigation; a permanent one
    /// needs nothing); NOT_SUPPORTED otherwise. `None`: not a workaround.
    pub fn workaround_call(&self, function: u32) -> Option<i64> {
        match self.arch_features(function)? {
            SMCCC_RET_SUCCESS | SMCCC_RET_NOT_REQUIRED => Some(SMCCC_RET_SUCCESS),
            _ => Some(SMCCC_RET_NOT_SUPPORTED),
        }
    }
}

/// Which SMCCC calls to make to ask firmware, in order; the caller stops
/// at the first that says no. PSCI_VERSION first (`psci_version`: its
/// answer): PSCI_FEATURES exists from PSCI 1.0.
pub fn may_ask_firmware(psci_version: u64, smccc_version_feature: i64, smccc_version: i64) -> bool {
    psci_version >= 0x1_0000 && smccc_version_feature >= 0 && smccc_version >= 0x1_0001
}

#[cfg(test)]
mod tests {
    use super::*;

    // MIDRs as QEMU's CPU models report them.
    const A57: u64 = 0x411f_d070;
    const A72: u64 = 0x410f_d083;
    const A53: u64 = 0x410f_d034;
    const A73: u64 = 0x410f_d090;
    const N1: u64 = 0x414f_d0c1;
    const V1: u64 = 0x411f_d402;
    /// QEMU `max`: implementer 0, so in no list; CSV2 = 3 (and CSV3), SSBS.
    const MAX: CpuId = CpuId { midr: 0x000f_0510, pfr0: 3 << 56 | 1 << 60, pfr1: 2 << 4, isar2: 0, mmfr1: 0 };

    fn cpu(midr: u64) -> CpuId {
        CpuId { midr, ..CpuId::default() }
    }

    const NO_FW: Firmware = Firmware { wa1: None, wa2: None, wa3: None };
    /// TF-A on an affected Arm core: WA1 and WA2 (dynamic) implemented.
    const TF_A: Firmware = Firmware { wa1: Some(0), wa2: Some(0), wa3: Some(-1) };

    #[test]
    fn cortex_a72_without_firmware_is_vulnerable_and_says_so() {
        let m = decide(&cpu(A72), &NO_FW);
        assert_eq!((m.v2, m.v4, m.bhb), (State::Vulnerable, State::Vulnerable, State::Vulnerable));
        assert_eq!(m.on_exit, ExitMitigation::None, "nothing EL2 alone can do on an A72");
        let g = GuestView::of(&m);
        for f in [ARCH_WORKAROUND_1, ARCH_WORKAROUND_2, ARCH_WORKAROUND_3] {
            assert_eq!(g.arch_features(f), Some(SMCCC_RET_NOT_SUPPORTED), "{f:#x}");
            assert_eq!(g.workaround_call(f), Some(SMCCC_RET_NOT_SUPPORTED));
        }
    }

    #[test]
    fn cortex_a57_with_tf_a_calls_firmware_at_exit() {
        let m = decide(&cpu(A57), &TF_A);
        assert_eq!(m.v2, State::Mitigated);
        // BHB: an A57 is a loop CPU (k = 8), but the predictor needs the
        // firmware call anyway; that one call covers both.
        assert_eq!(m.bhb, State::Mitigated);
        assert_eq!(m.on_exit, ExitMitigation::Firmware(ARCH_WORKAROUND_1));
        assert_eq!((m.v4, m.enable_fw_ssbd), (State::Mitigated, true), "firmware SSBD on for good");
        let g = GuestView::of(&m);
        assert_eq!(g.arch_features(ARCH_WORKAROUND_1), Some(SMCCC_RET_SUCCESS));
        assert_eq!(g.arch_features(ARCH_WORKAROUND_2), Some(SMCCC_RET_NOT_REQUIRED));
        assert_eq!(g.arch_features(ARCH_WORKAROUND_3), Some(SMCCC_RET_SUCCESS));
        assert_eq!(g.workaround_call(ARCH_WORKAROUND_1), Some(0));
    }

    #[test]
    fn safe_and_fixed_cpus() {
        // Cortex-A53: in every safe list.
        let m = decide(&cpu(A53), &NO_FW);
        assert_eq!(
            (m.v2, m.v4, m.bhb, m.on_exit),
            (State::Unaffected, State::Unaffected, State::Unaffected, ExitMitigation::None)
        );
        let g = GuestView::of(&m);
        assert_eq!(g.arch_features(ARCH_WORKAROUND_1), Some(SMCCC_RET_UNAFFECTED));
        assert_eq!(g.arch_features(ARCH_WORKAROUND_2), Some(SMCCC_RET_NOT_REQUIRED));
        assert_eq!(g.arch_features(ARCH_WORKAROUND_3), Some(SMCCC_RET_UNAFFECTED));
        // QEMU max: CSV2 = 3, SSBS.
        let m = decide(&MAX, &NO_FW);
        assert_eq!(
            (m.v2, m.v4, m.bhb, m.on_exit),
            (State::Unaffected, State::Mitigated, State::Unaffected, ExitMitigation::None)
        );
        let g = GuestView::of(&m);
        assert_eq!(g.arch_features(ARCH_WORKAROUND_2), Some(SMCCC_RET_NOT_SUPPORTED), "SSBS: the guest's own");
    }

    #[test]
    fn bhb_loop_clearbhb_ecbhb_and_firmware() {
        // Neoverse N1: CSV2 = 1, SSBS; BHB by a 24-branch loop at exit.
        let n1 = CpuId { midr: N1, pfr0: 1 << 56, pfr1: 2 << 4, ..CpuId::default() };
        let m = decide(&n1, &NO_FW);
        assert_eq!((m.v2, m.bhb, m.on_exit), (State::Unaffected, State::Mitigated, ExitMitigation::BhbLoop(24)));
        assert_eq!(GuestView::of(&m).arch_features(ARCH_WORKAROUND_3), Some(SMCCC_RET_SUCCESS));
        // Neoverse V1: 32.
        assert_eq!(decide(&CpuId { midr: V1, pfr0: 1 << 56, ..n1 }, &NO_FW).on_exit, ExitMitigation::BhbLoop(32));
        // CLRBHB beats the loop; ECBHB needs nothing; CSV2 = 3 unaffected.
        let clr = CpuId { isar2: 1 << 28, ..n1 };
        assert_eq!(decide(&clr, &NO_FW).on_exit, ExitMitigation::ClearBhb);
        let ec = CpuId { mmfr1: 1 << 60, ..clr };
        assert_eq!((decide(&ec, &NO_FW).bhb, decide(&ec, &NO_FW).on_exit), (State::Mitigated, ExitMitigation::None));
        let csv2_3 = CpuId { pfr0: 3 << 56, ..n1 };
        assert_eq!(decide(&csv2_3, &NO_FW).bhb, State::Unaffected);
        // Cortex-A73: firmware's WA3, or vulnerable without it.
        let a73_fw = Firmware { wa1: Some(0), wa2: None, wa3: Some(0) };
        let m = decide(&cpu(A73), &a73_fw);
        assert_eq!(
            (m.v2, m.bhb, m.on_exit),
            (State::Mitigated, State::Mitigated, ExitMitigation::Firmware(ARCH_WORKAROUND_3))
        );
        let m = decide(&cpu(A73), &Firmware { wa3: None, ..a73_fw });
        assert_eq!((m.bhb, m.on_exit), (State::Vulnerable, ExitMitigation::Firmware(ARCH_WORKAROUND_1)));
    }

    #[test]
    fn firmware_answers() {
        // Firmware says the CPU is unaffected.
        let m = decide(
            &cpu(A72),
            &Firmware { wa1: Some(SMCCC_RET_UNAFFECTED), wa2: Some(SMCCC_RET_NOT_REQUIRED), wa3: None },
        );
        assert_eq!((m.v2, m.v4), (State::Unaffected, State::Unaffected));
        // A72 is BHB-affected (loop); with v2 unaffected, the loop runs.
        assert_eq!((m.bhb, m.on_exit), (State::Mitigated, ExitMitigation::BhbLoop(8)));
        // Anything unexpected is "not supported".
        assert_eq!(decide(&cpu(A72), &Firmware { wa1: Some(-3), ..NO_FW }).v2, State::Vulnerable);
    }

    #[test]
    fn machine_is_its_weakest_cpu() {
        let big = GuestView::of(&decide(&cpu(A72), &NO_FW));
        let little = GuestView::of(&decide(&cpu(A53), &NO_FW));
        let g = little.combine(big);
        assert_eq!(g, big);
        assert!(!GuestView { ssbs: true, ..big }.combine(GuestView { ssbs: false, ..big }).ssbs);
        assert_eq!(State::Unaffected.combine(State::Mitigated), State::Mitigated);
    }

    #[test]
    fn other_functions_and_exit_words() {
        let g = GuestView::of(&decide(&MAX, &NO_FW));
        assert_eq!(g.arch_features(0x8000_0000), None);
        assert_eq!(g.workaround_call(0x8400_0000), None);
        assert_eq!(ExitMitigation::None.encode(), 0);
        assert_eq!(ExitMitigation::ClearBhb.encode(), 1);
        assert_eq!(ExitMitigation::BhbLoop(24).encode(), 24);
        assert_eq!(ExitMitigation::Firmware(ARCH_WORKAROUND_1).encode(), 0x8000_0000_8000_8000);
        let shown = alloc::format!("{}", ExitMitigation::Firmware(ARCH_WORKAROUND_1));
        assert_eq!(shown, "firmware call 0x80008000");
        assert_eq!(alloc::format!("{}", ExitMitigation::BhbLoop(24)), "BHB loop of 24");
    }

    #[test]
    fn asking_firmware_like_linux() {
        // QEMU's built-in PSCI 1.1: PSCI_FEATURES(SMCCC_VERSION) = -1.
        assert!(!may_ask_firmware(0x1_0001, -1, -1));
        // PSCI 0.2 has no PSCI_FEATURES.
        assert!(!may_ask_firmware(0x2, 0, 0x1_0001));
        // SMCCC 1.0 has no ARCH_FEATURES.
        assert!(!may_ask_firmware(0x1_0001, 0, 0x1_0000));
        // TF-A: PSCI 1.1, SMCCC 1.2.
        assert!(may_ask_firmware(0x1_0001, 0, 0x1_0002));
    }
}
