//! Synchronous exceptions and the vector dispatch. A check that expects a
//! fault arms `expect`; the handler records the syndrome and steps over the
//! faulting instruction, so an UNDEF or an abort becomes a FAIL line, never
//! a hang. Debug exceptions disarm the slot that fired and retry.

use crate::arch::{self, Frame};
use crate::println;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

pub const EC_UNKNOWN: u64 = 0x00;
pub const EC_IABT_CUR: u64 = 0x21;
pub const EC_DABT_CUR: u64 = 0x25;
pub const EC_BRK_CUR: u64 = 0x31;
pub const EC_BRK_INSN: u64 = 0x3c;
pub const EC_STEP_CUR: u64 = 0x33;
pub const EC_WATCH_CUR: u64 = 0x35;

static EXPECT: AtomicBool = AtomicBool::new(false);
/// Faults taken while armed, and the last one's ESR, FAR and ELR.
pub static FAULTS: AtomicU64 = AtomicU64::new(0);
pub static ESR: AtomicU64 = AtomicU64::new(0);
pub static FAR: AtomicU64 = AtomicU64::new(0);
pub static ELR: AtomicU64 = AtomicU64::new(0);
/// Debug exceptions: breakpoint, watchpoint and step hits, and the slot the
/// current breakpoint or watchpoint check armed.
pub static BRK_HITS: AtomicU64 = AtomicU64::new(0);
pub static WATCH_HITS: AtomicU64 = AtomicU64::new(0);
pub static STEP_HITS: AtomicU64 = AtomicU64::new(0);
pub static ARMED_SLOT: AtomicUsize = AtomicUsize::new(0);

/// What `guarded` saw: the faults taken while it ran, the last syndrome.
pub struct Faults {
    pub count: u64,
    pub esr: u64,
    pub far: u64,
}

impl Faults {
    pub fn ec(&self) -> u64 {
        self.esr >> 26
    }
}

/// Runs `f` with faults recorded and skipped rather than fatal.
pub fn guarded<R>(f: impl FnOnce() -> R) -> (R, Faults) {
    FAULTS.store(0, Ordering::SeqCst);
    EXPECT.store(true, Ordering::SeqCst);
    let r = f();
    EXPECT.store(false, Ordering::SeqCst);
    let faults = Faults {
        count: FAULTS.load(Ordering::SeqCst),
        esr: ESR.load(Ordering::SeqCst),
        far: FAR.load(Ordering::SeqCst),
    };
    (r, faults)
}

fn esr() -> u64 {
    let v;
    // SAFETY: reads the syndrome of the exception being handled.
    unsafe { core::arch::asm!("mrs {}, esr_el1", out(reg) v, options(nostack)) };
    v
}

fn far() -> u64 {
    let v;
    // SAFETY: as esr().
    unsafe { core::arch::asm!("mrs {}, far_el1", out(reg) v, options(nostack)) };
    v
}

/// Called by the vector code: `kind` is the vector's index (4 = synchronous
/// from the current EL with SP_ELx, 5 = IRQ from there).
#[no_mangle]
extern "C" fn conf_exception(kind: u64, frame: &mut Frame) {
    let cpu = crate::this_cpu();
    match kind {
        5 => crate::gic::handle_irq(cpu),
        4 => sync(frame),
        _ => {
            println!("conformance: unexpected exception kind {kind} ESR {:#x} ELR {:#x}", esr(), frame.elr);
            crate::power_off();
        }
    }
}

fn sync(frame: &mut Frame) {
    let (esr, far) = (esr(), far());
    match esr >> 26 {
        EC_BRK_CUR => {
            arch::write_dbgbcr(ARMED_SLOT.load(Ordering::SeqCst), 0);
            BRK_HITS.fetch_add(1, Ordering::SeqCst);
        }
        EC_WATCH_CUR => {
            arch::write_dbgwcr(ARMED_SLOT.load(Ordering::SeqCst), 0);
            FAR.store(far, Ordering::SeqCst);
            WATCH_HITS.fetch_add(1, Ordering::SeqCst);
        }
        EC_STEP_CUR => {
            arch::write_mdscr(arch::mdscr() & !1);
            frame.spsr &= !(1 << 21);
            ELR.store(frame.elr, Ordering::SeqCst);
            STEP_HITS.fetch_add(1, Ordering::SeqCst);
        }
        _ if EXPECT.load(Ordering::SeqCst) => {
            ESR.store(esr, Ordering::SeqCst);
            FAR.store(far, Ordering::SeqCst);
            ELR.store(frame.elr, Ordering::SeqCst);
            FAULTS.fetch_add(1, Ordering::SeqCst);
            // An instruction abort came from a branch (`arch::call_addr`):
            // return to its caller; anything else: skip the instruction.
            if esr >> 26 == EC_IABT_CUR {
                frame.elr = frame.x[30];
            } else {
                frame.elr += 4;
            }
        }
        _ => {
            println!("conformance: unexpected synchronous exception ESR {esr:#x} FAR {far:#x} ELR {:#x}", frame.elr);
            crate::power_off();
        }
    }
}
