//! A PCIe function assigned to a guest: its configuration space as the
//! guest sees it ([`AssignedFunction`]), and what the EL2 side does to the
//! physical function around it ([`probe_bars`], [`program_bars`],
//! [`start_reset`]). Names as in the PCI Local Bus and PCIe Base
//! specifications.
//!
//! The physical function is reached through [`ConfigSpace`] (the EL2
//! runtime's ECAM page; tests' fake devices). The guest's view is a filter
//! over it, every value the guest writes treated as hostile:
//!
//! * **Reads** pass through, except: the BARs (0x10..0x27) read a virtual
//!   shadow; the Expansion ROM BAR (0x30) and the CardBus CIS pointer (0x28)
//!   read 0; Header Type (0x0e) has the multi-function bit cleared (the
//!   guest sees one function per slot); Interrupt Pin (0x3d) reads 0 (no
//!   INTx is offered: MSI-X and MSI only); Interrupt Line (0x3c) is a byte
//!   the guest may write.
//! * **Writes** reach the function only in these fields: the Command
//!   register's Memory Space Enable, Bus Master Enable and Interrupt
//!   Disable (I/O space is never enabled; Status is never written, its
//!   bits are write-1-to-clear); MSI-X Message Control's Enable and
//!   Function Mask; MSI's Enable, Multiple Message Enable, Message Address,
//!   Data and Mask Bits. The message addresses need no filter: the SMMU's
//!   stage 2 of that guest confines where the device's writes land.
//!   Everything else (IDs, class, BIST, other capabilities, the PCI Express
//!   capability with its Initiate FLR bit, extended space) is ignored and
//!   counted: resetting the function is the hypervisor's decision.
//! * **BARs** are the hypervisor's: it placed them (in host and guest
//!   address space) and stage 2 maps the guest address to the physical
//!   BAR. The guest can size a BAR (all-ones, then read the mask) and write
//!   it back; a write that leaves a BAR elsewhere is kept in the shadow
//!   (the guest reads what it wrote) but not followed, reported as
//!   [`CfgWrite::BarMoved`]: the BAR stays mapped where it was, so the
//!   guest's accesses at the new address abort. The physical BAR is never
//!   written on the guest's behalf.
//! * Malformed accesses (a size other than 1, 2 or 4, unaligned, beyond
//!   4 KiB) read all-ones and write nothing.
//!
//! The capability list is walked once, bounded ([`capabilities`]): a device
//! whose list loops cannot hang the hypervisor.

#[cfg(test)]
mod tests;

use alloc::vec::Vec;
use core::fmt;
use core::str::FromStr;

/// The physical function's 4 KiB of configuration space, dword access
/// (`off` is 4-byte aligned, below 4096).
pub trait ConfigSpace {
    fn read32(&mut self, off: u16) -> u32;
    fn write32(&mut self, off: u16, val: u32);
}

/// Configuration-space offsets (type 0 header).
pub mod reg {
    pub const VENDOR_ID: u16 = 0x00;
    pub const COMMAND: u16 = 0x04;
    pub const HEADER_TYPE: u16 = 0x0e;
    pub const BAR0: u16 = 0x10;
    pub const CARDBUS_CIS: u16 = 0x28;
    pub const ROM: u16 = 0x30;
    pub const CAP_PTR: u16 = 0x34;
    pub const INTERRUPT_LINE: u16 = 0x3c;
    pub const INTERRUPT_PIN: u16 = 0x3d;
}

/// Command register bits.
pub mod command {
    pub const IO_SPACE: u16 = 1 << 0;
    pub const MEMORY_SPACE: u16 = 1 << 1;
    pub const BUS_MASTER: u16 = 1 << 2;
    pub const INTX_DISABLE: u16 = 1 << 10;
    /// What a guest may change.
    pub const GUEST: u16 = MEMORY_SPACE | BUS_MASTER | INTX_DISABLE;
}

/// Capability IDs.
pub mod cap {
    pub const MSI: u8 = 0x05;
    pub const PCI_EXPRESS: u8 = 0x10;
    pub const MSIX: u8 = 0x11;
}

/// A function's address: segment (the host bridge), bus, device, function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bdf {
    pub seg: u16,
    pub bus: u8,
    pub dev: u8,
    pub func: u8,
}

impl Bdf {
    /// The requester ID on its segment: bus, device, function.
    pub fn rid(&self) -> u16 {
        (u16::from(self.bus) << 8) | (u16::from(self.dev) << 3) | u16::from(self.func)
    }
}

/// Why a string is not a function's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BdfError {
    /// Not `SSSS:BB:DD.F` (or `BB:DD.F`) in hex.
    Syntax,
    /// A device number above 31.
    Device(u32),
    /// A function number above 7.
    Function(u32),
}

impl fmt::Display for BdfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BdfError::Syntax => write!(f, "not a PCI address (SSSS:BB:DD.F in hex, e.g. 0000:00:02.0)"),
            BdfError::Device(d) => write!(f, "device {d:#x} (at most 0x1f)"),
            BdfError::Function(n) => write!(f, "function {n} (at most 7)"),
        }
    }
}

impl FromStr for Bdf {
    type Err = BdfError;

    /// `SSSS:BB:DD.F` as Linux and Xen print it, or `BB:DD.F` (segment 0).
    fn from_str(s: &str) -> Result<Self, BdfError> {
        let hex = |t: &str, max_len: usize| -> Result<u32, BdfError> {
            if t.is_empty() || t.len() > max_len {
                return Err(BdfError::Syntax);
            }
            u32::from_str_radix(t, 16).map_err(|_| BdfError::Syntax)
        };
        let (head, func) = s.rsplit_once('.').ok_or(BdfError::Syntax)?;
        let parts: Vec<&str> = head.split(':').collect();
        let (seg, bus, dev) = match parts[..] {
            [s, b, d] => (hex(s, 4)?, hex(b, 2)?, hex(d, 2)?),
            [b, d] => (0, hex(b, 2)?, hex(d, 2)?),
            _ => return Err(BdfError::Syntax),
        };
        let func = hex(func, 1)?;
        if dev > 31 {
            return Err(BdfError::Device(dev));
        }
        if func > 7 {
            return Err(BdfError::Function(func));
        }
        Ok(Bdf { seg: seg as u16, bus: bus as u8, dev: dev as u8, func: func as u8 })
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:02x}:{:02x}.{}", self.seg, self.bus, self.dev, self.func)
    }
}

/// One memory BAR of the physical function, as probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PhysBar {
    /// Its register, 0..6 (the low one of a 64-bit pair).
    pub index: u8,
    /// Bytes it decodes, a power of two.
    pub size: u64,
    pub is64: bool,
    pub prefetchable: bool,
}

impl PhysBar {
    /// The read-only low bits of its register: memory, type, prefetchable.
    fn flags(&self) -> u32 {
        (if self.is64 { 0b100 } else { 0 }) | (if self.prefetchable { 0b1000 } else { 0 })
    }
}

/// Why a function cannot be assigned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeError {
    /// Vendor ID 0xffff: nothing answers at that address.
    NoFunction,
    /// Not a type 0 header (a bridge), with the Header Type seen.
    NotType0(u8),
    /// An I/O BAR (an assigned function gets memory space only).
    IoBar(u8),
    /// A 64-bit BAR in the last register, or a BAR that reads back
    /// nonsense (no size).
    BadBar(u8),
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeError::NoFunction => write!(f, "no function there (vendor ID 0xffff)"),
            ProbeError::NotType0(t) => write!(f, "header type {t:#x}: only endpoints (type 0) can be assigned"),
            ProbeError::IoBar(i) => write!(f, "BAR{i} is an I/O BAR: only memory BARs can be assigned"),
            ProbeError::BadBar(i) => write!(f, "BAR{i} reads back no usable size"),
        }
    }
}

/// Reads `size` bytes at `off` out of the dword that holds them.
fn extract(dword: u32, off: u16, size: u8) -> u32 {
    let shift = u32::from(off & 3) * 8;
    match size {
        4 => dword,
        s => (dword >> shift) & ((1u32 << (u32::from(s) * 8)) - 1),
    }
}

/// `dword` with `size` bytes at `off` replaced by `val`.
fn merge(dword: u32, off: u16, size: u8, val: u32) -> u32 {
    if size == 4 {
        return val;
    }
    let shift = u32::from(off & 3) * 8;
    let mask = ((1u32 << (u32::from(size) * 8)) - 1) << shift;
    (dword & !mask) | ((val << shift) & mask)
}

/// Whether an access of `size` at `off` is one a function answers.
fn well_formed(off: u16, size: u8) -> bool {
    matches!(size, 1 | 2 | 4) && off < 4096 && off.is_multiple_of(u16::from(size))
}

/// The capability list: (ID, offset), in list order. At most 48 entries
/// (the most a 256-byte header can hold); a pointer below 0x40 (into the
/// header) ends the walk, and so does one seen before.
pub fn capabilities(phys: &mut dyn ConfigSpace) -> Vec<(u8, u16)> {
    let mut out: Vec<(u8, u16)> = Vec::new();
    let status = phys.read32(reg::COMMAND) >> 16;
    if status & (1 << 4) == 0 {
        return out;
    }
    let mut ptr = (phys.read32(reg::CAP_PTR) & 0xfc) as u16;
    while ptr >= 0x40 && out.len() < 48 && !out.iter().any(|&(_, o)| o == ptr) {
        let v = phys.read32(ptr);
        out.push(((v & 0xff) as u8, ptr));
        ptr = ((v >> 8) & 0xfc) as u16;
    }
    out
}

/// Probes the function's memory BARs: each is saved, written all-ones,
/// read back and restored (both halves of a 64-bit pair), with memory
/// decode off meanwhile (a half-written BAR must not decode) and the
/// Command register restored after. Unimplemented BARs are left out.
pub fn probe_bars(phys: &mut dyn ConfigSpace) -> Result<Vec<PhysBar>, ProbeError> {
    if phys.read32(reg::VENDOR_ID) & 0xffff == 0xffff {
        return Err(ProbeError::NoFunction);
    }
    let ht = extract(phys.read32(reg::HEADER_TYPE & !3), reg::HEADER_TYPE, 1) as u8;
    if ht & 0x7f != 0 {
        return Err(ProbeError::NotType0(ht));
    }
    let cmd = phys.read32(reg::COMMAND);
    phys.write32(reg::COMMAND, cmd & 0xffff & !u32::from(command::MEMORY_SPACE | command::IO_SPACE));
    let r = probe_with_decode_off(phys);
    phys.write32(reg::COMMAND, cmd & 0xffff);
    r
}

fn probe_with_decode_off(phys: &mut dyn ConfigSpace) -> Result<Vec<PhysBar>, ProbeError> {
    let mut bars = Vec::new();
    let mut i = 0u8;
    while i < 6 {
        let off = reg::BAR0 + 4 * u16::from(i);
        let orig = phys.read32(off);
        phys.write32(off, u32::MAX);
        let lo = phys.read32(off);
        phys.write32(off, orig);
        if lo & 1 != 0 {
            if lo != 0 && lo != u32::MAX {
                return Err(ProbeError::IoBar(i));
            }
            i += 1;
            continue;
        }
        let is64 = (lo >> 1) & 3 == 2;
        let mut mask = u64::from(lo & !0xf);
        if is64 {
            if i == 5 {
                return Err(ProbeError::BadBar(i));
            }
            let orig_hi = phys.read32(off + 4);
            phys.write32(off + 4, u32::MAX);
            let hi = phys.read32(off + 4);
            phys.write32(off + 4, orig_hi);
            mask |= u64::from(hi) << 32;
        } else if mask != 0 {
            mask |= 0xffff_ffff_0000_0000;
        }
        if mask != 0 {
            let size = (!mask).wrapping_add(1);
            if !size.is_power_of_two() {
                return Err(ProbeError::BadBar(i));
            }
            bars.push(PhysBar { index: i, size, is64, prefetchable: lo & 0b1000 != 0 });
        }
        i += if is64 { 2 } else { 1 };
    }
    Ok(bars)
}

/// Writes each BAR's bus address (low half, then the high half of a 64-bit
/// BAR). Memory decode stays as it was: the guest enables it.
pub fn program_bars(phys: &mut dyn ConfigSpace, bars: &[(PhysBar, u64)]) {
    for (b, addr) in bars {
        let off = reg::BAR0 + 4 * u16::from(b.index);
        phys.write32(off, (*addr as u32 & !0xf) | b.flags());
        if b.is64 {
            phys.write32(off + 4, (addr >> 32) as u32);
        }
    }
}

/// The PCI Express capability's offset.
fn pcie_cap(phys: &mut dyn ConfigSpace) -> Option<u16> {
    capabilities(phys).into_iter().find(|&(id, _)| id == cap::PCI_EXPRESS).map(|(_, o)| o)
}

/// Whether the function supports Function Level Reset (Device
/// Capabilities bit 28).
pub fn flr_capable(phys: &mut dyn ConfigSpace) -> bool {
    pcie_cap(phys).is_some_and(|o| phys.read32(o + 4) & (1 << 28) != 0)
}

/// Stops the function (Memory Space and Bus Master Enable cleared), then
/// starts a Function Level Reset when it supports one (Device Control bit
/// 15). Returns whether it did. The reset takes up to 100 ms and leaves the
/// BARs cleared: whoever uses the function next reprograms them.
pub fn start_reset(phys: &mut dyn ConfigSpace) -> bool {
    let cmd = phys.read32(reg::COMMAND) & 0xffff;
    phys.write32(reg::COMMAND, cmd & !u32::from(command::MEMORY_SPACE | command::BUS_MASTER));
    let Some(o) = pcie_cap(phys).filter(|&o| phys.read32(o + 4) & (1 << 28) != 0) else {
        return false;
    };
    // Device Control is the low half of the dword; Device Status (high
    // half) bits are write-1-to-clear: write zeros there.
    let ctl = phys.read32(o + 8) & 0xffff;
    phys.write32(o + 8, ctl | (1 << 15));
    true
}

/// A BAR as the guest sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestBar {
    pub phys: PhysBar,
    /// Its guest-physical address, a multiple of its size: what stage 2
    /// maps to the physical BAR.
    pub guest: u64,
}

/// What a guest's configuration write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CfgWrite {
    /// Passed on (filtered) or kept in a shadow.
    Applied,
    /// Nothing of it is writable: dropped.
    Ignored,
    /// BAR `index` now says `to`, which is not where it is mapped.
    BarMoved { index: u8, to: u64 },
    /// Malformed (size, alignment, offset).
    Bad,
}

/// What guests did, for the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VpciCounters {
    pub reads: u64,
    pub writes: u64,
    pub ignored: u64,
    pub bar_moves: u64,
    pub bad: u64,
}

/// What a BAR register holds in the guest's view.
#[derive(Clone, Copy, Debug)]
enum BarSlot {
    /// Not implemented: reads 0.
    None,
    /// The low register of BAR `i` (of `bars`).
    Low(usize),
    /// The high register of 64-bit BAR `i`.
    High(usize),
}

/// The function's configuration space as its guest sees it.
#[derive(Clone, Debug)]
pub struct AssignedFunction {
    bars: Vec<GuestBar>,
    /// The guest's view of each BAR: its address as last written (masked).
    shadow: Vec<u64>,
    slots: [BarSlot; 6],
    int_line: u8,
    msix: Option<u16>,
    /// MSI: offset, 64-bit addresses, per-vector masking.
    msi: Option<(u16, bool, bool)>,
    counters: VpciCounters,
}

impl AssignedFunction {
    /// The function with `bars` at their guest addresses; its capabilities
    /// are found on `phys` here, once.
    pub fn new(phys: &mut dyn ConfigSpace, bars: Vec<GuestBar>) -> Self {
        let mut slots = [BarSlot::None; 6];
        for (i, b) in bars.iter().enumerate() {
            let k = usize::from(b.phys.index);
            if k < 6 {
                slots[k] = BarSlot::Low(i);
            }
            if b.phys.is64 && k + 1 < 6 {
                slots[k + 1] = BarSlot::High(i);
            }
        }
        let caps = capabilities(phys);
        let msix = caps.iter().find(|c| c.0 == cap::MSIX).map(|c| c.1);
        let msi = caps.iter().find(|c| c.0 == cap::MSI).map(|&(_, o)| {
            let ctl = phys.read32(o) >> 16;
            (o, ctl & (1 << 7) != 0, ctl & (1 << 8) != 0)
        });
        let shadow = bars.iter().map(|b| b.guest).collect();
        AssignedFunction { bars, shadow, slots, int_line: 0, msix, msi, counters: VpciCounters::default() }
    }

    pub fn counters(&self) -> &VpciCounters {
        &self.counters
    }

    /// The guest's view of the dword at `off` (4-byte aligned).
    fn view(&self, phys: &mut dyn ConfigSpace, off: u16) -> u32 {
        match off {
            0x0c => phys.read32(off) & !(0x80 << 16),
            0x10..=0x27 => self.bar_value(usize::from((off - reg::BAR0) / 4)),
            reg::CARDBUS_CIS | reg::ROM => 0,
            reg::INTERRUPT_LINE => (phys.read32(off) & 0xffff_0000) | u32::from(self.int_line),
            _ => phys.read32(off),
        }
    }

    fn bar_value(&self, k: usize) -> u32 {
        match self.slots[k] {
            BarSlot::None => 0,
            BarSlot::Low(i) => (self.shadow[i] as u32 & !0xf) | self.bars[i].phys.flags(),
            BarSlot::High(i) => (self.shadow[i] >> 32) as u32,
        }
    }

    /// A guest read of `size` bytes at `off`.
    pub fn read(&mut self, phys: &mut dyn ConfigSpace, off: u16, size: u8) -> u32 {
        if !well_formed(off, size) {
            self.counters.bad += 1;
            return match size {
                1 => 0xff,
                2 => 0xffff,
                _ => u32::MAX,
            };
        }
        self.counters.reads += 1;
        let mut v = self.view(phys, off & !3);
        if off & !3 == reg::INTERRUPT_LINE {
            v &= !(0xff << 8);
        }
        extract(v, off, size)
    }

    /// A guest write of `size` bytes at `off`.
    pub fn write(&mut self, phys: &mut dyn ConfigSpace, off: u16, size: u8, val: u32) -> CfgWrite {
        if !well_formed(off, size) {
            self.counters.bad += 1;
            return CfgWrite::Bad;
        }
        self.counters.writes += 1;
        let base = off & !3;
        let r = match base {
            reg::COMMAND => {
                // Only the bytes of the Command register count; Status is
                // never written (write-1-to-clear).
                let cur = phys.read32(base);
                let new = merge(cur, off, size, val) & 0xffff;
                let keep = cur & 0xffff & !u32::from(command::GUEST);
                let guest = new & u32::from(command::GUEST);
                if off & 3 >= 2 {
                    CfgWrite::Ignored
                } else {
                    phys.write32(base, keep | guest);
                    CfgWrite::Applied
                }
            }
            0x10..=0x27 => self.write_bar(usize::from((base - reg::BAR0) / 4), off, size, val),
            reg::INTERRUPT_LINE if off == reg::INTERRUPT_LINE => {
                self.int_line = val as u8;
                CfgWrite::Applied
            }
            _ => self.write_cap(phys, base, off, size, val),
        };
        if r == CfgWrite::Ignored {
            self.counters.ignored += 1;
        }
        r
    }

    fn write_bar(&mut self, k: usize, off: u16, size: u8, val: u32) -> CfgWrite {
        let (i, high) = match self.slots[k] {
            BarSlot::None => return CfgWrite::Ignored,
            BarSlot::Low(i) => (i, false),
            BarSlot::High(i) => (i, true),
        };
        let mask = !(self.bars[i].phys.size - 1);
        let cur = if high { (self.shadow[i] >> 32) as u32 } else { self.shadow[i] as u32 };
        let new = merge(cur, off, size, val);
        let addr = if high {
            (self.shadow[i] & 0xffff_ffff) | (u64::from(new) << 32)
        } else {
            (self.shadow[i] & !0xffff_ffff) | u64::from(new)
        };
        let is64 = self.bars[i].phys.is64;
        let full = mask & if is64 { u64::MAX } else { 0xffff_ffff };
        let addr = addr & full;
        self.shadow[i] = addr;
        let guest = self.bars[i].guest;
        // Sizing: a half written all-ones reads back the mask; the guest
        // writes the address back next.
        let sizing = (addr & 0xffff_ffff) == (full & 0xffff_ffff) || (is64 && addr >> 32 == full >> 32);
        // A 64-bit BAR's low half written first: its high half comes next.
        let half_done = is64 && !high && addr >> 32 != guest >> 32;
        if addr == guest || sizing || half_done {
            return CfgWrite::Applied;
        }
        self.counters.bar_moves += 1;
        CfgWrite::BarMoved { index: self.bars[i].phys.index, to: addr }
    }

    /// Writes into a capability: MSI-X and MSI control fields pass,
    /// filtered; anything else is ignored.
    fn write_cap(&mut self, phys: &mut dyn ConfigSpace, base: u16, off: u16, size: u8, val: u32) -> CfgWrite {
        if let Some(o) = self.msix.filter(|&o| o == base) {
            // Message Control: Enable (15) and Function Mask (14).
            let cur = phys.read32(o);
            let new = merge(cur, off, size, val);
            let m = 0xc000u32 << 16;
            if off & 3 < 2 && size < 4 {
                // Only the ID and next-pointer bytes: read-only.
                return CfgWrite::Ignored;
            }
            phys.write32(o, (cur & !m) | (new & m));
            return CfgWrite::Applied;
        }
        if let Some((o, is64, maskable)) = self.msi {
            let data = if is64 { o + 12 } else { o + 8 };
            let mask_bits = if is64 { o + 16 } else { o + 12 };
            if base == o {
                // Message Control: Enable (0) and Multiple Message Enable (6:4).
                let cur = phys.read32(o);
                let new = merge(cur, off, size, val);
                let m = 0x0071u32 << 16;
                phys.write32(o, (cur & !m) | (new & m));
                return CfgWrite::Applied;
            }
            let writable = base == o + 4 || (is64 && base == o + 8) || base == data || (maskable && base == mask_bits);
            if writable {
                let cur = phys.read32(base);
                let new = merge(cur, off, size, val);
                // Message Data is 16 bits (the rest reserved or extended
                // data); pass the whole dword, the device masks it.
                phys.write32(base, new);
                return CfgWrite::Applied;
            }
        }
        CfgWrite::Ignored
    }
}
