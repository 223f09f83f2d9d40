//! GICv3 interrupt identifiers (INTIDs) as one checked type.
//!
//! An [`IntId`] always holds a value in one of the architecture's INTID
//! ranges (GICv3.1 included):
//!
//! | kind | INTIDs | constructor |
//! |---|---|---|
//! | SGI | 0-15 | [`IntId::sgi`] |
//! | PPI | 16-31 | [`IntId::ppi`] |
//! | SPI | 32-1019 | [`IntId::spi`] |
//! | special | 1020-1023 | [`IntId::SPECIAL_NONE`] and friends |
//! | extended PPI | 1056-1119 | [`IntId::eppi`] |
//! | extended SPI | 4096-5119 | [`IntId::espi`] |
//! | LPI | 8192 up to 2^24 - 1 | [`IntId::lpi`] |
//!
//! Constructors take the number within the kind (`IntId::spi(40)` is
//! INTID 72, as in a device tree's `<0 40 4>`); values from guests, firmware
//! or the GIC itself go through `IntId::try_from(u32)`. Both return an
//! [`IntIdError`] instead of panicking. `u32::from(intid)` gives the raw
//! INTID for registers. Values in no range (1024-1055, 1120-4095,
//! 5120-8191, 2^24 and above) cannot be held.

use core::fmt;

/// One GICv3 INTID, known to lie in an architected range.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IntId(u32);

/// Which architected range an [`IntId`] is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntIdKind {
    Sgi,
    Ppi,
    Spi,
    /// 1020-1023: acknowledge results that name no interrupt.
    Special,
    ExtendedPpi,
    ExtendedSpi,
    Lpi,
}

/// Why a number is no INTID of the requested kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntIdError {
    /// Number `n` within `kind` is beyond that kind's range (e.g. SGI 16).
    OutOfRange { kind: IntIdKind, n: u32 },
    /// The raw value lies in no INTID range (a reserved gap, or ≥ 2^24).
    Reserved(u32),
}

const PPI_START: u32 = 16;
const SPI_START: u32 = 32;
const SPECIAL_START: u32 = 1020;
const SPECIAL_END: u32 = 1024;
const EPPI_START: u32 = 1056;
const EPPI_END: u32 = 1120;
const ESPI_START: u32 = 4096;
const ESPI_END: u32 = 5120;
/// The first LPI INTID.
pub const LPI_START: u32 = 8192;
/// GICv3 INTIDs have at most 24 bits (GICD_TYPER.IDbits ≤ 23).
const LPI_END: u32 = 1 << 24;

/// The first INTID and the count of each kind.
const fn span(kind: IntIdKind) -> (u32, u32) {
    match kind {
        IntIdKind::Sgi => (0, PPI_START),
        IntIdKind::Ppi => (PPI_START, SPI_START - PPI_START),
        IntIdKind::Spi => (SPI_START, SPECIAL_START - SPI_START),
        IntIdKind::Special => (SPECIAL_START, SPECIAL_END - SPECIAL_START),
        IntIdKind::ExtendedPpi => (EPPI_START, EPPI_END - EPPI_START),
        IntIdKind::ExtendedSpi => (ESPI_START, ESPI_END - ESPI_START),
        IntIdKind::Lpi => (LPI_START, LPI_END - LPI_START),
    }
}

/// For constants only: a bad literal fails the build, never a running system.
const fn known(r: Result<IntId, IntIdError>) -> IntId {
    match r {
        Ok(id) => id,
        Err(_) => panic!("not an INTID"),
    }
}

impl IntId {
    /// Number of SGIs (INTIDs 0-15).
    pub const SGI_COUNT: u32 = PPI_START;
    /// Number of SGIs and PPIs, the private interrupts of every PE (0-31).
    pub const PRIVATE_COUNT: u32 = SPI_START;
    /// Most SPIs a GIC can have (INTIDs 32-1019).
    pub const MAX_SPI_COUNT: u32 = SPECIAL_START - SPI_START;
    /// Special INTID 1020: the first of the four that name no interrupt.
    pub const SPECIAL_FIRST: IntId = IntId(SPECIAL_START);
    /// Special INTID 1023: no pending interrupt (a spurious acknowledge).
    pub const SPECIAL_NONE: IntId = IntId(SPECIAL_END - 1);
    /// PPI 9 (INTID 25): the virtual CPU interface's maintenance interrupt
    /// where SBSA's recommendation is followed (QEMU virt, FVP).
    pub const MAINTENANCE: IntId = known(IntId::ppi(9));
    /// PPI 10 (INTID 26): the EL2 physical timer (SBSA).
    pub const HYP_TIMER: IntId = known(IntId::ppi(10));
    /// PPI 11 (INTID 27): the EL1 virtual timer (SBSA).
    pub const VIRT_TIMER: IntId = known(IntId::ppi(11));
    /// PPI 14 (INTID 30): the EL1 non-secure physical timer (SBSA).
    pub const PHYS_TIMER: IntId = known(IntId::ppi(14));

    const fn of(kind: IntIdKind, n: u32) -> Result<Self, IntIdError> {
        let (first, count) = span(kind);
        if n < count {
            Ok(IntId(first + n))
        } else {
            Err(IntIdError::OutOfRange { kind, n })
        }
    }

    /// SGI `n` (0-15): INTID `n`.
    pub const fn sgi(n: u32) -> Result<Self, IntIdError> {
        Self::of(IntIdKind::Sgi, n)
    }

    /// PPI `n` (0-15): INTID 16 + `n`.
    pub const fn ppi(n: u32) -> Result<Self, IntIdError> {
        Self::of(IntIdKind::Ppi, n)
    }

    /// SPI `n` (0-987): INTID 32 + `n`.
    pub const fn spi(n: u32) -> Result<Self, IntIdError> {
        Self::of(IntIdKind::Spi, n)
    }

    /// Extended PPI `n` (0-63): INTID 1056 + `n`.
    pub const fn eppi(n: u32) -> Result<Self, IntIdError> {
        Self::of(IntIdKind::ExtendedPpi, n)
    }

    /// Extended SPI `n` (0-1023): INTID 4096 + `n`.
    pub const fn espi(n: u32) -> Result<Self, IntIdError> {
        Self::of(IntIdKind::ExtendedSpi, n)
    }

    /// LPI `n` (0 up to 2^24 - 8193): INTID 8192 + `n`.
    pub const fn lpi(n: u32) -> Result<Self, IntIdError> {
        Self::of(IntIdKind::Lpi, n)
    }

    /// The range this INTID is in.
    pub const fn kind(self) -> IntIdKind {
        match self.0 {
            0..PPI_START => IntIdKind::Sgi,
            PPI_START..SPI_START => IntIdKind::Ppi,
            SPI_START..SPECIAL_START => IntIdKind::Spi,
            SPECIAL_START..SPECIAL_END => IntIdKind::Special,
            EPPI_START..EPPI_END => IntIdKind::ExtendedPpi,
            ESPI_START..ESPI_END => IntIdKind::ExtendedSpi,
            // Construction admits nothing else.
            _ => IntIdKind::Lpi,
        }
    }

    /// The number within its kind: 40 for INTID 72 (SPI 40).
    pub const fn number(self) -> u32 {
        self.0 - span(self.kind()).0
    }

    /// The raw INTID (also `u32::from`).
    pub const fn raw(self) -> u32 {
        self.0
    }

    pub const fn is_sgi(self) -> bool {
        self.0 < PPI_START
    }

    /// A PPI in 16-31 (not an extended PPI, see [`IntId::is_eppi`]).
    pub const fn is_ppi(self) -> bool {
        PPI_START <= self.0 && self.0 < SPI_START
    }

    pub const fn is_eppi(self) -> bool {
        EPPI_START <= self.0 && self.0 < EPPI_END
    }

    /// Banked per PE: an SGI, a PPI or an extended PPI.
    pub const fn is_private(self) -> bool {
        self.0 < SPI_START || self.is_eppi()
    }

    /// An SPI in 32-1019 (not an extended SPI, see [`IntId::is_espi`]).
    pub const fn is_spi(self) -> bool {
        SPI_START <= self.0 && self.0 < SPECIAL_START
    }

    pub const fn is_espi(self) -> bool {
        ESPI_START <= self.0 && self.0 < ESPI_END
    }

    /// One of 1020-1023, which name no interrupt.
    pub const fn is_special(self) -> bool {
        SPECIAL_START <= self.0 && self.0 < SPECIAL_END
    }

    pub const fn is_lpi(self) -> bool {
        self.0 >= LPI_START
    }
}

impl TryFrom<u32> for IntId {
    type Error = IntIdError;

    /// Checks a raw INTID (from a guest, firmware or the GIC).
    fn try_from(v: u32) -> Result<Self, IntIdError> {
        match v {
            0..SPECIAL_END | EPPI_START..EPPI_END | ESPI_START..ESPI_END | LPI_START..LPI_END => Ok(IntId(v)),
            _ => Err(IntIdError::Reserved(v)),
        }
    }
}

impl From<IntId> for u32 {
    fn from(id: IntId) -> u32 {
        id.0
    }
}

impl fmt::Display for IntIdKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IntIdKind::Sgi => "SGI",
            IntIdKind::Ppi => "PPI",
            IntIdKind::Spi => "SPI",
            IntIdKind::Special => "special",
            IntIdKind::ExtendedPpi => "extended PPI",
            IntIdKind::ExtendedSpi => "extended SPI",
            IntIdKind::Lpi => "LPI",
        })
    }
}

/// "SPI 40 (INTID 72)"; a special one reads "special INTID 1023".
impl fmt::Display for IntId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind() {
            IntIdKind::Special => write!(f, "special INTID {}", self.0),
            k => write!(f, "{k} {} (INTID {})", self.number(), self.0),
        }
    }
}

/// The same readable form as `Display`, so assertions and logs say which
/// kind of interrupt they mean.
impl fmt::Debug for IntId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for IntIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            IntIdError::OutOfRange { kind, n } => {
                write!(f, "{kind} {n} does not exist (at most {})", span(kind).1 - 1)
            }
            IntIdError::Reserved(v) => write!(f, "INTID {v} is in no INTID range"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;

    fn id(v: u32) -> IntId {
        IntId::try_from(v).unwrap()
    }

    #[test]
    fn constructors_count_within_their_kind() {
        assert_eq!(u32::from(IntId::sgi(0).unwrap()), 0);
        assert_eq!(u32::from(IntId::sgi(15).unwrap()), 15);
        assert_eq!(u32::from(IntId::ppi(0).unwrap()), 16);
        assert_eq!(u32::from(IntId::ppi(15).unwrap()), 31);
        assert_eq!(u32::from(IntId::spi(0).unwrap()), 32);
        assert_eq!(u32::from(IntId::spi(987).unwrap()), 1019);
        assert_eq!(u32::from(IntId::eppi(0).unwrap()), 1056);
        assert_eq!(u32::from(IntId::eppi(63).unwrap()), 1119);
        assert_eq!(u32::from(IntId::espi(0).unwrap()), 4096);
        assert_eq!(u32::from(IntId::espi(1023).unwrap()), 5119);
        assert_eq!(u32::from(IntId::lpi(0).unwrap()), 8192);
        assert_eq!(u32::from(IntId::lpi((1 << 24) - 8193).unwrap()), (1 << 24) - 1);
    }

    #[test]
    fn constructors_reject_numbers_beyond_their_kind() {
        let out = |kind, n| Err(IntIdError::OutOfRange { kind, n });
        assert_eq!(IntId::sgi(16), out(IntIdKind::Sgi, 16));
        assert_eq!(IntId::ppi(16), out(IntIdKind::Ppi, 16));
        assert_eq!(IntId::spi(988), out(IntIdKind::Spi, 988));
        assert_eq!(IntId::eppi(64), out(IntIdKind::ExtendedPpi, 64));
        assert_eq!(IntId::espi(1024), out(IntIdKind::ExtendedSpi, 1024));
        assert_eq!(IntId::lpi(1 << 24), out(IntIdKind::Lpi, 1 << 24));
        assert_eq!(IntId::spi(u32::MAX), out(IntIdKind::Spi, u32::MAX));
    }

    #[test]
    fn raw_values_are_checked_at_every_range_edge() {
        for v in [0, 15, 16, 31, 32, 1019, 1020, 1023, 1056, 1119, 4096, 5119, 8192, (1 << 24) - 1] {
            assert_eq!(u32::from(id(v)), v);
        }
        for v in [1024, 1055, 1120, 4095, 5120, 8191, 1 << 24, u32::MAX] {
            assert_eq!(IntId::try_from(v), Err(IntIdError::Reserved(v)), "{v}");
        }
    }

    #[test]
    fn kinds_and_predicates_agree() {
        let cases = [
            (0, IntIdKind::Sgi, 0),
            (15, IntIdKind::Sgi, 15),
            (16, IntIdKind::Ppi, 0),
            (27, IntIdKind::Ppi, 11),
            (32, IntIdKind::Spi, 0),
            (72, IntIdKind::Spi, 40),
            (1019, IntIdKind::Spi, 987),
            (1023, IntIdKind::Special, 3),
            (1059, IntIdKind::ExtendedPpi, 3),
            (4100, IntIdKind::ExtendedSpi, 4),
            (8200, IntIdKind::Lpi, 8),
        ];
        for (v, kind, n) in cases {
            let i = id(v);
            assert_eq!((i.kind(), i.number(), i.raw()), (kind, n, v));
            assert_eq!(i.is_sgi(), kind == IntIdKind::Sgi, "{i}");
            assert_eq!(i.is_ppi(), kind == IntIdKind::Ppi, "{i}");
            assert_eq!(i.is_eppi(), kind == IntIdKind::ExtendedPpi, "{i}");
            assert_eq!(i.is_spi(), kind == IntIdKind::Spi, "{i}");
            assert_eq!(i.is_espi(), kind == IntIdKind::ExtendedSpi, "{i}");
            assert_eq!(i.is_special(), kind == IntIdKind::Special, "{i}");
            assert_eq!(i.is_lpi(), kind == IntIdKind::Lpi, "{i}");
            let private = matches!(kind, IntIdKind::Sgi | IntIdKind::Ppi | IntIdKind::ExtendedPpi);
            assert_eq!(i.is_private(), private, "{i}");
        }
    }

    #[test]
    fn well_known_constants() {
        assert_eq!(u32::from(IntId::SPECIAL_NONE), 1023);
        assert_eq!(u32::from(IntId::SPECIAL_FIRST), 1020);
        assert!(IntId::SPECIAL_NONE.is_special() && IntId::SPECIAL_FIRST.is_special());
        assert_eq!(u32::from(IntId::MAINTENANCE), 25);
        assert_eq!(u32::from(IntId::HYP_TIMER), 26);
        assert_eq!(u32::from(IntId::VIRT_TIMER), 27);
        assert_eq!(u32::from(IntId::PHYS_TIMER), 30);
        assert_eq!(IntId::SGI_COUNT + 16, IntId::PRIVATE_COUNT);
        assert_eq!(IntId::PRIVATE_COUNT + IntId::MAX_SPI_COUNT, 1020);
    }

    #[test]
    fn readable_forms() {
        assert_eq!(format!("{}", IntId::spi(40).unwrap()), "SPI 40 (INTID 72)");
        assert_eq!(format!("{:?}", IntId::VIRT_TIMER), "PPI 11 (INTID 27)");
        assert_eq!(format!("{}", IntId::sgi(1).unwrap()), "SGI 1 (INTID 1)");
        assert_eq!(format!("{}", IntId::SPECIAL_NONE), "special INTID 1023");
        assert_eq!(format!("{}", id(4096)), "extended SPI 0 (INTID 4096)");
        assert_eq!(format!("{}", id(1056)), "extended PPI 0 (INTID 1056)");
        assert_eq!(format!("{}", IntId::lpi(5).unwrap()), "LPI 5 (INTID 8197)");
        assert_eq!(format!("{}", IntId::sgi(16).unwrap_err()), "SGI 16 does not exist (at most 15)");
        assert_eq!(format!("{}", IntId::try_from(1030).unwrap_err()), "INTID 1030 is in no INTID range");
    }

    #[test]
    fn order_follows_the_raw_value() {
        assert!(IntId::sgi(15).unwrap() < IntId::ppi(0).unwrap());
        assert!(IntId::spi(987).unwrap() < IntId::SPECIAL_FIRST);
        assert!(IntId::espi(0).unwrap() < IntId::lpi(0).unwrap());
    }
}
