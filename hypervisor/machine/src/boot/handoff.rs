//! Which boot register holds the device tree.
//!
//! Firmware enters the hypervisor (as BL33, or as an arm64 Image) at EL2 in
//! one of two ways:
//! - the Linux arm64 boot protocol, which TF-A follows with
//!   `ARM_LINUX_KERNEL_AS_BL33=1` and QEMU's `-kernel` uses: x0 = DTB,
//!   x1..x3 = 0;
//! - TF-A's default FIP flow (BL2 loads BL33): x0 = MPIDR & 0xffff, x1 = DTB.
//!
//! [`find_dtb`] tells them apart by looking for a flattened device tree
//! header (magic 0xd00dfeed) at x0, then at x1. It is pure: the caller
//! says which addresses it may read (`readable`) and reads big-endian
//! 32-bit words (`read_be32`). A candidate is only read once it is non-zero,
//! 8-byte aligned and its 40-byte header lies in readable memory; the whole
//! `totalsize` must be readable too before it is accepted. The EL2 caller
//! (`runtime::boot`) runs this with the MMU on and only calls normal memory
//! of its identity map readable, never a device window: with the MMU off
//! every access is Device-nGnRnE, so a stray pointer could read a device
//! register (with side effects) — that is why the detection is not done in
//! the entry assembly.

/// The FDT header's magic (big-endian at offset 0).
pub const FDT_MAGIC: u32 = 0xd00d_feed;
/// The FDT header's size (version 17).
pub const FDT_HEADER_SIZE: u64 = 40;
/// The largest device tree accepted (QEMU's is 1 MiB, padded).
pub const MAX_DTB_SIZE: u64 = 2 << 20;

/// How the firmware passed the device tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Convention {
    /// x0 = DTB, x1..x3 = 0 (Linux's arm64 boot protocol).
    Linux,
    /// x0 = MPIDR & 0xffff, x1 = DTB (TF-A's default BL33 hand-off).
    TfaMpidr,
}

impl core::fmt::Display for Convention {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Convention::Linux => "x0 = dtb",
            Convention::TfaMpidr => "x0 = mpidr, x1 = dtb",
        })
    }
}

/// Where the device tree is and how it was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handoff {
    pub dtb: u64,
    /// The header's `totalsize`.
    pub size: u64,
    pub convention: Convention,
}

/// Why a device tree address was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reject {
    Null,
    Misaligned,
    /// The header is not in memory the caller may read.
    NotRam,
    BadMagic(u32),
    BadSize(u64),
}

/// Neither convention's register points at a device tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoDtb {
    pub x0: u64,
    pub x1: u64,
    pub why_x0: Reject,
    /// `None`: x0 is not an MPIDR & 0xffff value, so x1 was not tried.
    pub why_x1: Option<Reject>,
}

impl core::fmt::Display for NoDtb {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "no device tree at x0 = {:#x} ({:?})", self.x0, self.why_x0)?;
        if let Some(w) = self.why_x1 {
            write!(f, " nor at x1 = {:#x} ({w:?})", self.x1)?;
        }
        Ok(())
    }
}

/// Checks that a valid FDT header is at `addr` and returns its `totalsize`.
pub fn check_fdt(
    addr: u64,
    readable: &impl Fn(u64, u64) -> bool,
    read_be32: &impl Fn(u64) -> u32,
) -> Result<u64, Reject> {
    if addr == 0 {
        return Err(Reject::Null);
    }
    if !addr.is_multiple_of(8) {
        return Err(Reject::Misaligned);
    }
    if addr.checked_add(FDT_HEADER_SIZE).is_none() || !readable(addr, FDT_HEADER_SIZE) {
        return Err(Reject::NotRam);
    }
    let magic = read_be32(addr);
    if magic != FDT_MAGIC {
        return Err(Reject::BadMagic(magic));
    }
    let size = u64::from(read_be32(addr + 4));
    if !(FDT_HEADER_SIZE..=MAX_DTB_SIZE).contains(&size) {
        return Err(Reject::BadSize(size));
    }
    // The structure and strings blocks must start inside the blob.
    let (off_struct, off_strings) = (u64::from(read_be32(addr + 8)), u64::from(read_be32(addr + 12)));
    if off_struct >= size || off_strings > size {
        return Err(Reject::BadSize(size));
    }
    if addr.checked_add(size).is_none() || !readable(addr, size) {
        return Err(Reject::NotRam);
    }
    Ok(size)
}

/// Finds the device tree among the boot registers `x` (x0..x3).
/// A device tree at x0 wins (the Linux convention; nonzero x1..x3 are
/// tolerated); otherwise x1 is tried if x0 looks like MPIDR & 0xffff.
pub fn find_dtb(
    x: [u64; 4],
    readable: impl Fn(u64, u64) -> bool,
    read_be32: impl Fn(u64) -> u32,
) -> Result<Handoff, NoDtb> {
    let why_x0 = match check_fdt(x[0], &readable, &read_be32) {
        Ok(size) => return Ok(Handoff { dtb: x[0], size, convention: Convention::Linux }),
        Err(e) => e,
    };
    if x[0] > 0xffff {
        return Err(NoDtb { x0: x[0], x1: x[1], why_x0, why_x1: None });
    }
    match check_fdt(x[1], &readable, &read_be32) {
        Ok(size) => Ok(Handoff { dtb: x[1], size, convention: Convention::TfaMpidr }),
        Err(e) => Err(NoDtb { x0: x[0], x1: x[1], why_x0, why_x1: Some(e) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RAM: u64 = 0x8000_0000;
    const RAM_SIZE: u64 = 64 << 20;

    /// RAM at 0x8000_0000 holding `blobs` at their addresses; reads outside
    /// it panic (the EL2 caller would fault), so the tests prove that
    /// `find_dtb` never reads where `readable` says no.
    struct Mem(Vec<(u64, Vec<u8>)>);

    impl Mem {
        fn readable(&self, a: u64, len: u64) -> bool {
            a >= RAM && a.checked_add(len).is_some_and(|e| e <= RAM + RAM_SIZE)
        }
        fn read_be32(&self, a: u64) -> u32 {
            assert!(self.readable(a, 4), "read outside RAM at {a:#x}");
            for (base, b) in &self.0 {
                if a >= *base && a + 4 <= base + b.len() as u64 {
                    let o = (a - base) as usize;
                    return u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
                }
            }
            0
        }
        fn find(&self, x: [u64; 4]) -> Result<Handoff, NoDtb> {
            find_dtb(x, |a, l| self.readable(a, l), |a| self.read_be32(a))
        }
    }

    fn real_dtb() -> Vec<u8> {
        let mut w = vm_fdt::FdtWriter::new().unwrap();
        let root = w.begin_node("").unwrap();
        w.property_string("compatible", "linux,dummy-virt").unwrap();
        w.end_node(root).unwrap();
        w.finish().unwrap()
    }

    #[test]
    fn linux_convention_x0_is_the_dtb() {
        let dtb = real_dtb();
        let len = dtb.len() as u64;
        let m = Mem(vec![(0x8200_0000, dtb)]);
        let h = m.find([0x8200_0000, 0, 0, 0]).unwrap();
        assert_eq!(h, Handoff { dtb: 0x8200_0000, size: len, convention: Convention::Linux });
    }

    #[test]
    fn tfa_convention_x0_is_mpidr_x1_is_the_dtb() {
        let m = Mem(vec![(0x8200_0000, real_dtb())]);
        for mpidr in [0, 0x100, 0x0103] {
            let h = m.find([mpidr, 0x8200_0000, 0, 0]).unwrap();
            assert_eq!((h.dtb, h.convention), (0x8200_0000, Convention::TfaMpidr), "x0 = {mpidr:#x}");
        }
    }

    #[test]
    fn x0_wins_when_both_point_at_device_trees() {
        let m = Mem(vec![(0x8200_0000, real_dtb()), (0x8300_0000, real_dtb())]);
        assert_eq!(m.find([0x8300_0000, 0x8200_0000, 0, 0]).unwrap().dtb, 0x8300_0000);
    }

    #[test]
    fn pointers_outside_ram_are_never_read() {
        let m = Mem(vec![(0x8200_0000, real_dtb())]);
        // x0 in a device window (0x1c09_0000 is FVP's UART), x1 likewise.
        let e = m.find([0x1c09_0000, 0, 0, 0]).unwrap_err();
        assert_eq!((e.why_x0, e.why_x1), (Reject::NotRam, None));
        let e = m.find([0, 0x1c09_0000, 0, 0]).unwrap_err();
        assert_eq!((e.why_x0, e.why_x1), (Reject::Null, Some(Reject::NotRam)));
        // A header that would run past the end of RAM, and address overflow.
        let e = m.find([RAM + RAM_SIZE - 8, 0, 0, 0]).unwrap_err();
        assert_eq!(e.why_x0, Reject::NotRam);
        let e = m.find([u64::MAX - 7, 0, 0, 0]).unwrap_err();
        assert_eq!(e.why_x0, Reject::NotRam);
    }

    #[test]
    fn x1_is_only_tried_when_x0_looks_like_an_mpidr() {
        let m = Mem(vec![(0x8200_0000, real_dtb())]);
        // x0 is a RAM address without a DTB: not TF-A's MPIDR value.
        let e = m.find([0x8100_0000, 0x8200_0000, 0, 0]).unwrap_err();
        assert_eq!((e.why_x0, e.why_x1), (Reject::BadMagic(0), None));
    }

    #[test]
    fn bad_headers_are_refused() {
        let mut dtb = real_dtb();
        // Misaligned.
        let m = Mem(vec![(0x8200_0000, dtb.clone())]);
        assert_eq!(m.find([0x8200_0004, 0, 0, 0]).unwrap_err().why_x0, Reject::Misaligned);
        // Wrong magic.
        dtb[0] = 0xd1;
        let m = Mem(vec![(0x8200_0000, dtb.clone())]);
        assert_eq!(m.find([0x8200_0000, 0, 0, 0]).unwrap_err().why_x0, Reject::BadMagic(0xd10d_feed));
        dtb[0] = 0xd0;
        // totalsize too small, too big, and reaching past RAM.
        for (size, why) in [(8u32, Reject::BadSize(8)), (4 << 20, Reject::BadSize(4 << 20)), (2 << 20, Reject::NotRam)]
        {
            dtb[4..8].copy_from_slice(&size.to_be_bytes());
            let at = RAM + RAM_SIZE - 0x1000;
            let m = Mem(vec![(at, dtb.clone())]);
            assert_eq!(m.find([at, 0, 0, 0]).unwrap_err().why_x0, why, "totalsize {size:#x}");
        }
        // The structure block outside the blob.
        let mut dtb = real_dtb();
        let len = dtb.len() as u32;
        dtb[8..12].copy_from_slice(&len.to_be_bytes());
        let m = Mem(vec![(0x8200_0000, dtb.clone())]);
        assert_eq!(m.find([0x8200_0000, 0, 0, 0]).unwrap_err().why_x0, Reject::BadSize(dtb.len() as u64));
    }

    #[test]
    fn the_error_names_both_registers() {
        let m = Mem(vec![]);
        let e = m.find([0, 0x8200_0000, 0, 0]).unwrap_err();
        assert_eq!(e.to_string(), "no device tree at x0 = 0x0 (Null) nor at x1 = 0x82000000 (BadMagic(0))");
    }
}
