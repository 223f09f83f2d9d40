//! The PMU's registers as a vCPU's ([`crate::vpmu`]): moved between
//! [`PmuRegs`] and the hardware, and MDCR_EL2's PMU traps. Only called on
//! CPUs with FEAT_PMUv3p1 (`vpmu::supported`); the registers are UNDEFINED
//! without a PMU.

use crate::vpmu::{counter_mask, PmuRegs, MAX_COUNTERS};
use aarch64_cpu::registers::MDCR_EL2;
use tock_registers::interfaces::ReadWriteable;

macro_rules! read {
    ($name:literal) => {{
        let v: u64;
        // SAFETY: reads a PMU register: no memory access; the caller made
        // sure the CPU has a PMU.
        unsafe { core::arch::asm!(concat!("mrs {0}, ", $name), out(reg) v, options(nomem, nostack, preserves_flags)) };
        v
    }};
}

macro_rules! write {
    ($name:literal, $v:expr) => {{
        let v: u64 = $v;
        // SAFETY: writes a PMU register, which changes only what the PMU
        // counts and its interrupt line, never memory the hypervisor uses.
        unsafe { core::arch::asm!(concat!("msr ", $name, ", {0}"), in(reg) v, options(nomem, nostack, preserves_flags)) };
    }};
}

fn select(n: usize) {
    write!("pmselr_el0", n as u64);
    super::sysreg::isb();
}

/// Saves the loaded vCPU's PMU into `r` and quiesces the hardware: nothing
/// counts and the overflow line is low until [`restore`].
pub fn save(r: &mut PmuRegs, counters: u8) {
    let all = counter_mask(counters);
    r.pmcnten = read!("pmcntenset_el0");
    // Stopped first, so the values read below are the final ones.
    write!("pmcntenclr_el0", all);
    r.pmcr = PmuRegs::pmcr_state(read!("pmcr_el0"));
    r.pmselr = read!("pmselr_el0");
    r.pminten = read!("pmintenset_el1");
    r.pmovs = read!("pmovsset_el0");
    r.pmuserenr = read!("pmuserenr_el0");
    r.pmccfiltr = read!("pmccfiltr_el0");
    r.pmccntr = read!("pmccntr_el0");
    for n in 0..usize::from(counters).min(MAX_COUNTERS) {
        select(n);
        r.evcntr[n] = read!("pmxevcntr_el0");
        r.evtyper[n] = read!("pmxevtyper_el0");
    }
    silence(all);
}

/// Loads `r` onto the PMU (which [`save`] or [`quiesce`] left quiet).
pub fn restore(r: &PmuRegs, counters: u8) {
    let all = counter_mask(counters);
    for n in 0..usize::from(counters).min(MAX_COUNTERS) {
        select(n);
        write!("pmxevtyper_el0", r.evtyper[n]);
        write!("pmxevcntr_el0", r.evcntr[n]);
    }
    write!("pmselr_el0", r.pmselr);
    write!("pmccfiltr_el0", r.pmccfiltr);
    write!("pmccntr_el0", r.pmccntr);
    write!("pmuserenr_el0", r.pmuserenr);
    write!("pmovsset_el0", r.pmovs & all);
    write!("pmintenset_el1", r.pminten & all);
    write!("pmcr_el0", r.pmcr);
    // Last: counting starts with everything else in place.
    write!("pmcntenset_el0", r.pmcnten & all);
    super::sysreg::isb();
}

/// Stops every counter and lowers the overflow line; EL0 loses access.
pub fn quiesce(counters: u8) {
    let all = counter_mask(counters);
    write!("pmcntenclr_el0", all);
    silence(all);
}

/// The rest of [`quiesce`] once the counters in `all` are stopped.
fn silence(all: u64) {
    write!("pmintenclr_el1", all);
    write!("pmovsclr_el0", all);
    write!("pmcr_el0", 0);
    write!("pmuserenr_el0", 0);
    super::sysreg::isb();
}

/// The overflow interrupt request the loaded vCPU's PMU drives now.
pub fn line() -> bool {
    crate::vpmu::overflow_line(read!("pmcr_el0"), read!("pmintenset_el1"), read!("pmovsset_el0"))
}

/// Whether the guest's PMU accesses trap (MDCR_EL2.TPM and TPMCR).
pub fn set_trap(trap: bool) {
    if trap {
        MDCR_EL2.modify(MDCR_EL2::TPM::SET + MDCR_EL2::TPMCR::SET);
    } else {
        MDCR_EL2.modify(MDCR_EL2::TPM::CLEAR + MDCR_EL2::TPMCR::CLEAR);
    }
    super::sysreg::isb();
}
