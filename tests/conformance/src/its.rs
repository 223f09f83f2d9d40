//! A minimal ITS driver for the checks: flat Device and Collection tables,
//! a 64 KiB command queue, LPIs on CPU 0's redistributor (IDbits 14: LPIs
//! 8192..16383). The tables live in the image's BSS (zeroed, 64 KiB aligned).

use crate::arch;
use crate::gic::{self, GICR_CTLR, GICR_PENDBASER, GICR_PROPBASER, GICR_TYPER, LPI_BASE};
use crate::mmio::Mmio;
use core::sync::atomic::{AtomicU64, Ordering};

pub const GITS_CTLR: usize = 0x0;
pub const GITS_TYPER: usize = 0x8;
pub const GITS_CBASER: usize = 0x80;
pub const GITS_CWRITER: usize = 0x88;
pub const GITS_CREADR: usize = 0x90;
pub const GITS_BASER: usize = 0x100;

pub const QUEUE_BYTES: usize = 64 * 1024;
const SLOTS: usize = QUEUE_BYTES / 32;
/// LPI configuration: priority 0xa0, group 1 (bit 1, RES1), enabled.
pub const PROP_ON: u8 = 0xa0 | 0b10 | 1;
pub const PROP_OFF: u8 = 0xa0 | 0b10;

#[repr(C, align(65536))]
pub struct Page64K([u8; 65536]);

/// Pages for: the command queue, Device table, Collection table, LPI
/// configuration table, LPI pending table, ITTs.
#[repr(C, align(65536))]
struct Memory {
    queue: Page64K,
    device: Page64K,
    collection: Page64K,
    prop: Page64K,
    pend: Page64K,
    itt: Page64K,
    pend1: Page64K,
}

static mut MEM: Memory = Memory {
    queue: Page64K([0; 65536]),
    device: Page64K([0; 65536]),
    collection: Page64K([0; 65536]),
    prop: Page64K([0; 65536]),
    pend: Page64K([0; 65536]),
    itt: Page64K([0; 65536]),
    pend1: Page64K([0; 65536]),
};

/// The next free queue slot (the driver is used by CPU 0 only).
static NEXT: AtomicU64 = AtomicU64::new(0);

fn mem() -> *mut Memory {
    &raw mut MEM
}

pub struct Its {
    pub regs: Mmio,
    /// The target of the checks' collection: RD address >> 16 (PTA) or the
    /// processor number.
    pub rdbase: u64,
    /// GITS_TYPER.PTA: collections target redistributor addresses.
    pta: bool,
}

/// A Page_Size field value → bytes.
pub fn page_bytes(field: u64) -> u64 {
    match field & 3 {
        0 => 4096,
        1 => 16384,
        _ => 65536,
    }
}

impl Its {
    /// Points the ITS at its tables and queue and enables it, and CPU 0's
    /// redistributor at its LPI tables (LPI_BASE.. configured `PROP_OFF`).
    pub fn init(base: u64) -> Result<Its, &'static str> {
        // SAFETY: the DT's ITS control frame.
        let regs = unsafe { Mmio::new(base as usize) };
        let m = mem();
        let pa = |p: *const Page64K| p as u64;
        // SAFETY: raw field addresses of the static; no reference made.
        let (queue, device, collection) =
            unsafe { (pa(&raw const (*m).queue), pa(&raw const (*m).device), pa(&raw const (*m).collection)) };
        for i in 0..8 {
            let b = regs.read64(GITS_BASER + 8 * i);
            let ty = (b >> 56) & 7;
            let table = match ty {
                1 => device,
                4 => collection,
                _ => continue,
            };
            // 64 KiB of table: one 64K page, or sixteen 4K/four 16K pages.
            let keep = b & (7 << 56 | 0x1f << 48);
            let want = |ps: u64| {
                let pages = 65536 / page_bytes(ps) - 1;
                1 << 63 | 7 << 59 | keep | table | 1 << 10 | ps << 8 | pages
            };
            regs.write64(GITS_BASER + 8 * i, want(2));
            let got = regs.read64(GITS_BASER + 8 * i);
            if (got >> 8) & 3 != 2 {
                let ps = (got >> 8) & 3;
                regs.write64(GITS_BASER + 8 * i, want(ps));
            }
            if regs.read64(GITS_BASER + 8 * i) >> 63 == 0 {
                return Err("a GITS_BASER did not take Valid");
            }
        }
        // The queue as a guest reusing it finds it: every slot holding an
        // earlier command's fields (here a MAPTI's pINTID, ICID and DW3
        // junk), which commands that do not use them leave in place.
        // SAFETY: the queue page, before the ITS is pointed at it.
        let q = unsafe { (&raw mut (*m).queue.0) as *mut u64 };
        for slot in 0..SLOTS {
            for (i, v) in [0x0a, 0x2000_0000_0000_0000, 0x3f, 0x5a5a_0000_0000_a5a5].into_iter().enumerate() {
                // SAFETY: inside the 64 KiB page.
                unsafe { q.add(slot * 4 + i).write_volatile(v) };
            }
        }
        regs.write64(GITS_CBASER, 1 << 63 | 7 << 59 | queue | 1 << 10 | (QUEUE_BYTES as u64 / 4096 - 1));
        regs.write64(GITS_CWRITER, 0);
        NEXT.store(0, Ordering::SeqCst);
        regs.write32(GITS_CTLR, regs.read32(GITS_CTLR) | 1);

        for i in 0..gic::LPI_COUNTED {
            set_prop(LPI_BASE + i as u32, PROP_OFF);
        }
        let pta = regs.read64(GITS_TYPER) & (1 << 19) != 0;
        let its = Its { regs, rdbase: 0, pta };
        let rdbase = its.lpis_on(0);
        Ok(Its { rdbase, ..its })
    }

    /// Points CPU `cpu`'s redistributor (0 or 1) at the shared LPI
    /// configuration table and a pending table of its own and enables
    /// LPIs there; returns its collection target (see `rdbase`).
    pub fn lpis_on(&self, cpu: usize) -> u64 {
        let m = mem();
        // SAFETY: raw field addresses of the static; no reference made.
        let (prop, pend) = unsafe {
            (
                (&raw const (*m).prop) as u64,
                if cpu == 0 { (&raw const (*m).pend) as u64 } else { (&raw const (*m).pend1) as u64 },
            )
        };
        let rd = gic::rd(cpu);
        rd.write64(GICR_PROPBASER, prop | 7 << 7 | 1 << 10 | 13);
        rd.write64(GICR_PENDBASER, pend | 7 << 7 | 1 << 10 | 1 << 62);
        arch::dsb();
        rd.write32(GICR_CTLR, rd.read32(GICR_CTLR) | 1);
        if self.pta {
            rd.base() as u64 >> 16
        } else {
            (rd.read64(GICR_TYPER) >> 8) & 0xffff
        }
    }

    /// The ITT of the checks' one device (a 64 KiB page: room for any
    /// entry size and the few events used).
    pub fn itt_addr(&self) -> u64 {
        // SAFETY: the raw address of the static page.
        unsafe { (&raw const (*mem()).itt) as u64 }
    }

    /// Writes a command into the next slot: only the double words given
    /// (`None` leaves whatever the slot held), then moves CWRITER and waits
    /// for CREADR to catch up. Err: the ITS stalled or did not advance.
    pub fn send(&self, dw: [Option<u64>; 4]) -> Result<(), &'static str> {
        self.send_with(|q| {
            for (i, d) in dw.iter().enumerate() {
                if let Some(v) = d {
                    // SAFETY: i < 4: inside the slot `q` points at.
                    unsafe { q.add(i).write_volatile(*v) };
                }
            }
        })
    }

    /// A command that uses DW0 and DW1's low word only (INT, CLEAR, INV,
    /// DISCARD): written as such, the rest of the slot left as it was.
    pub fn send_reusing(&self, dw0: u64, dw1_low: u32) -> Result<(), &'static str> {
        self.send_with(|q| {
            // SAFETY: the slot's first double word and the next one's low
            // word (little endian), inside the slot.
            unsafe {
                q.write_volatile(dw0);
                (q.add(1) as *mut u32).write_volatile(dw1_low);
            }
        })
    }

    /// Lets `write` fill the next slot (given its address), then moves
    /// CWRITER and waits for CREADR.
    fn send_with(&self, write: impl FnOnce(*mut u64)) -> Result<(), &'static str> {
        let slot = NEXT.load(Ordering::SeqCst) as usize;
        // SAFETY: the queue page is only written through here, by CPU 0;
        // slot < SLOTS keeps the slot inside it.
        let q = unsafe { ((&raw mut (*mem()).queue.0) as *mut u64).add(slot * 4) };
        write(q);
        let next = (slot + 1) % SLOTS;
        NEXT.store(next as u64, Ordering::SeqCst);
        arch::dsb();
        self.regs.write64(GITS_CWRITER, (next * 32) as u64);
        let until = crate::checks::deadline_ms(1000);
        loop {
            let r = self.regs.read64(GITS_CREADR);
            if r & 1 != 0 {
                return Err("GITS_CREADR.Stalled");
            }
            if r & 0xf_ffe0 == (next * 32) as u64 {
                return Ok(());
            }
            if crate::checks::now() > until {
                return Err("CREADR did not reach CWRITER in 1 s");
            }
        }
    }

    pub fn send_all(&self, dw: [u64; 4]) -> Result<(), &'static str> {
        self.send(dw.map(Some))
    }
}

/// Writes LPI `intid`'s configuration byte.
pub fn set_prop(intid: u32, v: u8) {
    // SAFETY: the configuration page; intid - 8192 < 64 KiB.
    unsafe { (&raw mut (*mem()).prop.0[(intid - LPI_BASE) as usize]).write_volatile(v) };
    arch::dsb();
}

pub const fn mapd(dev: u64, bits: u64, itt: u64) -> [u64; 4] {
    [0x08 | dev << 32, bits - 1, 1 << 63 | itt, 0]
}
pub const fn mapc(icid: u64, rdbase: u64) -> [u64; 4] {
    [0x09, 0, 1 << 63 | rdbase << 16 | icid, 0]
}
pub const fn mapti(dev: u64, ev: u64, intid: u64, icid: u64) -> [u64; 4] {
    [0x0a | dev << 32, ev | intid << 32, icid, 0]
}
pub const fn movi(dev: u64, ev: u64, icid: u64) -> [u64; 4] {
    [0x01 | dev << 32, ev, icid, 0]
}
pub const fn clear(dev: u64, ev: u64) -> [u64; 4] {
    [0x04 | dev << 32, ev, 0, 0]
}
pub const fn int(dev: u64, ev: u64) -> [u64; 4] {
    [0x03 | dev << 32, ev, 0, 0]
}
pub const fn inv(dev: u64, ev: u64) -> [u64; 4] {
    [0x0c | dev << 32, ev, 0, 0]
}
pub const fn invall(icid: u64) -> [u64; 4] {
    [0x0d, 0, icid, 0]
}
pub const fn discard(dev: u64, ev: u64) -> [u64; 4] {
    [0x0f | dev << 32, ev, 0, 0]
}
pub const fn sync(rdbase: u64) -> [u64; 4] {
    [0x05, 0, rdbase << 16, 0]
}
