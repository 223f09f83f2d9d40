//! The transient-execution mitigations at EL2: each pCPU's, decided as it
//! comes up (`crate::mitigations::decide`), and what guests are told.

use crate::arch::{el2, smc};
use crate::mitigations;
use crate::sync::{Mutex, Once};
use log::info;

/// Firmware's transient-execution workarounds, asked once by pCPU 0.
static FIRMWARE: Once<mitigations::Firmware> = Once::new();
/// What guests are told: every pCPU's mitigations so far, combined.
static GUEST_VIEW: Mutex<Option<mitigations::GuestView>> = Mutex::new(None);

/// Decides this pCPU's transient-execution mitigations
/// (`crate::mitigations::decide`), turns firmware's Spectre-v4 mitigation
/// on for good where that is the one, adds the pCPU to what guests are
/// told, and returns the word the exit path runs.
pub fn init_cpu() -> u64 {
    let fw = FIRMWARE.call_once(smc::ask_workarounds);
    let m = mitigations::decide(&el2::mitigation_cpu_id(), fw);
    if m.enable_fw_ssbd {
        smc::enable_firmware_ssbd();
    }
    let mut g = GUEST_VIEW.lock();
    let mine = mitigations::GuestView::of(&m);
    if g.is_none() {
        info!(
            "mitigations: spectre-v2 {:?}, spectre-v4 {:?}{}, spectre-BHB {:?}; on exit {}; firmware {:?}",
            m.v2,
            m.v4,
            if m.ssbs { " (SSBS)" } else { "" },
            m.bhb,
            m.on_exit,
            fw
        );
    }
    *g = Some(g.map_or(mine, |v| v.combine(mine)));
    m.on_exit.encode()
}

/// The transient-execution states guests are told through
/// SMCCC_ARCH_FEATURES: the machine's, once every pCPU is up.
pub fn guest_mitigations() -> mitigations::GuestView {
    let g = *GUEST_VIEW.lock();
    g.unwrap_or(mitigations::GuestView {
        v2: mitigations::State::Vulnerable,
        v4: mitigations::State::Vulnerable,
        bhb: mitigations::State::Vulnerable,
        ssbs: false,
    })
}
