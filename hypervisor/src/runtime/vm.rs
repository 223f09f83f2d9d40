//! The Dom0-style VM and its vCPUs: creation (memory, kernel, initrd, DTB,
//! vGIC, stage 2) and the run loop that handles every guest exit.
//!
//! Guest RAM is identity-mapped (IPA == PA), as Xen does for Dom0 on Arm
//! without an IOMMU, so passthrough devices can DMA to guest addresses.

use super::console;
use super::heap::HeapFrames;
use crate::arch::context::{El1Context, FpContext};
use crate::arch::exception::{run_guest, ExitKind, GuestRegs};
use crate::arch::gic::{self, VcpuIfState};
use crate::arch::{smc, sysreg};
use crate::config::Config;
use crate::dtb::{self, GuestDtbConfig, Platform, Region};
use crate::esr::{self, Exit, MmioAccess};
use crate::psci::{self, Call};
use crate::stage2::{self, MemType, Stage2, Stage2Error};
use crate::vgic::{Vgic, VgicConfig, VgicError};
use crate::vpl011::VPl011;
use crate::{read_sysreg, write_sysreg};
use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use log::{info, warn};

const MB: u64 = 1 << 20;
const PAGE: u64 = 4096;

#[derive(Debug)]
pub enum VmError {
    NoKernel,
    /// The kernel module is not an arm64 Image.
    BadKernelImage,
    /// Guest RAM does not fit where it must go.
    Memory(&'static str),
    Stage2(Stage2Error),
    Dtb(dtb::DtbError),
    Vgic(VgicError),
}

impl From<Stage2Error> for VmError {
    fn from(e: Stage2Error) -> Self {
        VmError::Stage2(e)
    }
}
impl From<dtb::DtbError> for VmError {
    fn from(e: dtb::DtbError) -> Self {
        VmError::Dtb(e)
    }
}
impl From<VgicError> for VmError {
    fn from(e: VgicError) -> Self {
        VmError::Vgic(e)
    }
}

/// Per-vCPU counters printed at power-off.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub exits: u64,
    pub wfi_traps: u64,
    pub wfe_traps: u64,
    pub hvc: u64,
    pub smc: u64,
    pub mmio: u64,
    pub sysreg: u64,
    pub irq_exits: u64,
    pub injections: u64,
    pub aborts_injected: u64,
    pub undef_injected: u64,
    pub sgis_sent: u64,
    /// HVC/SMC calls answered with SMCCC NOT_SUPPORTED.
    pub unsupported_calls: u64,
}

pub struct Vcpu {
    pub id: usize,
    pub regs: GuestRegs,
    pub el1: El1Context,
    pub fp: FpContext,
    pub gicif: VcpuIfState,
    pub lrs: [u64; crate::vgic::NUM_LRS_MAX],
    pub online: bool,
    pub counters: Counters,
}

pub struct Vm {
    pub vmid: u16,
    pub ram: Region,
    stage2: Stage2,
    vgic: Vgic,
    uart: VPl011,
    uart_region: Option<Region>,
    uart_intid: u32,
    virt_timer_intid: u32,
    maintenance_intid: u32,
    hyp_timer_intid: u32,
    /// Physical SPIs forwarded to the guest as HW interrupts.
    forwarded: Vec<u32>,
    pub vcpus: Vec<Vcpu>,
    nr_lrs: usize,
    /// Guest data aborts we reported (the log is rate-limited).
    bad_accesses: u64,
}

fn align_up(v: u64, a: u64) -> u64 {
    (v + a - 1) & !(a - 1)
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// Reads `image_size` from an arm64 Image header (0 means "unknown").
fn arm64_image_size(kernel: &[u8]) -> Result<u64, VmError> {
    if kernel.len() < 64 || kernel[0x38..0x3c] != *b"ARM\x64" {
        return Err(VmError::BadKernelImage);
    }
    let size = u64::from_le_bytes(kernel[16..24].try_into().unwrap());
    Ok(if size == 0 { kernel.len() as u64 } else { size })
}

/// vMPIDR of vCPU `i`: Aff0 = i % 16, Aff1 = i / 16.
pub fn vcpu_mpidr(i: usize) -> u64 {
    ((i as u64 / 16) << 8) | (i as u64 % 16)
}

/// Cleans a range to the point of coherency so a guest running with its MMU
/// and caches off sees what the hypervisor wrote.
fn clean_dcache(start: u64, len: u64) {
    let line = 4u64 << ((read_sysreg!("ctr_el0") >> 16) & 0xf);
    let mut p = start & !(line - 1);
    while p < start + len {
        // SAFETY: cache maintenance by VA on identity-mapped RAM.
        unsafe { core::arch::asm!("dc cvac, {0}", in(reg) p, options(nostack)) };
        p += line;
    }
    sysreg::dsb_sy();
}

impl Vm {
    /// Builds the Dom0-style guest from the boot modules.
    pub fn create_dom0(plat: &Platform, cfg: &Config, host_dtb: &[u8], hyp_end: u64) -> Result<Box<Vm>, VmError> {
        let kernel_mod = plat.kernel.as_ref().ok_or(VmError::NoKernel)?;
        let ram0 = *plat.memory.first().ok_or(VmError::Memory("no memory node"))?;
        let nr_vcpus = cfg.dom0_max_vcpus.unwrap_or(1) as usize;

        // Guest RAM: the top of the first bank, above everything we keep.
        let reserved_top = [
            Some((ram0.base, hyp_end)),
            Some((kernel_mod.base, kernel_mod.base + kernel_mod.size)),
            plat.ramdisk.as_ref().map(|r| (r.base, r.base + r.size)),
        ]
        .into_iter()
        .flatten()
        .filter(|r| r.0 >= ram0.base && r.0 < ram0.end())
        .map(|r| r.1)
        .max()
        .unwrap_or(ram0.base);
        let floor = align_up(reserved_top.max(ram0.base + crate::platform::HYP_RESERVED.min(ram0.size / 2)), 2 * MB);
        let size = match cfg.dom0_mem {
            Some(m) => align_up(m, 2 * MB),
            None => ram0.end().saturating_sub(floor) & !(2 * MB - 1),
        };
        if size < 64 * MB || ram0.end() < floor + size {
            return Err(VmError::Memory("not enough RAM above the hypervisor and boot modules for dom0_mem"));
        }
        let ram = Region { base: (ram0.end() - size) & !(2 * MB - 1), size };

        // Kernel at the bottom of guest RAM (2 MiB aligned, text_offset 0).
        // SAFETY: boot modules are in RAM, identity-mapped, and described by
        // the bootloader's DTB; their ranges were bounded above.
        let kernel = unsafe { core::slice::from_raw_parts(kernel_mod.base as *const u8, kernel_mod.size as usize) };
        let image_size = arm64_image_size(kernel)?;
        let kernel_at = ram.base;
        let mut next = align_up(kernel_at + image_size, 2 * MB);
        let initrd = match &plat.ramdisk {
            Some(r) => {
                let at = next;
                next = align_up(at + r.size, 2 * MB);
                Some(Region { base: at, size: r.size })
            }
            None => None,
        };
        let dtb_at = ram.end() - 2 * MB;
        if next > dtb_at {
            return Err(VmError::Memory("kernel and initrd do not fit in guest RAM"));
        }
        // The copies go into guest RAM, which must not overlap the sources.
        let guest = (ram.base, ram.end());
        if overlaps(guest, (kernel_mod.base, kernel_mod.base + kernel_mod.size))
            || plat.ramdisk.as_ref().is_some_and(|r| overlaps(guest, (r.base, r.base + r.size)))
        {
            return Err(VmError::Memory("boot modules overlap guest RAM"));
        }
        // SAFETY: destination is guest RAM we own, source is the module; they
        // do not overlap (checked above).
        unsafe {
            core::ptr::copy_nonoverlapping(kernel.as_ptr(), kernel_at as *mut u8, kernel.len());
            if let (Some(src), Some(dst)) = (&plat.ramdisk, &initrd) {
                core::ptr::copy_nonoverlapping(src.base as *const u8, dst.base as *mut u8, src.size as usize);
            }
        }
        clean_dcache(kernel_at, kernel.len() as u64);
        if let Some(i) = &initrd {
            clean_dcache(i.base, i.size);
        }

        // Passthrough: the virtio-mmio devices QEMU gives us (Dom0-style).
        let passthrough: Vec<_> = if cfg.passthrough_virtio { plat.virtio_mmio.clone() } else { Vec::new() };

        // Device tree.
        let mut remove = dtb::default_removals(host_dtb)?;
        if !cfg.passthrough_virtio {
            remove.extend(plat.virtio_mmio.iter().map(|d| d.path.clone()));
        }
        let bootargs = kernel_mod.bootargs.clone().unwrap_or_else(|| String::from("console=ttyAMA0"));
        let vcpu_mpidrs: Vec<u64> = (0..nr_vcpus).map(vcpu_mpidr).collect();
        let guest_dtb = dtb::build_guest_dtb(
            host_dtb,
            &GuestDtbConfig {
                memory: ram,
                vcpu_mpidrs: vcpu_mpidrs.clone(),
                bootargs,
                initrd,
                remove_paths: remove,
                extra_virtio_mmio: Vec::new(),
            },
        )?;
        if guest_dtb.len() as u64 > 2 * MB {
            return Err(VmError::Memory("guest DTB larger than 2 MiB"));
        }
        // SAFETY: the last 2 MiB of guest RAM, reserved for the DTB above.
        unsafe { core::ptr::copy_nonoverlapping(guest_dtb.as_ptr(), dtb_at as *mut u8, guest_dtb.len()) };
        clean_dcache(dtb_at, guest_dtb.len() as u64);

        // Stage 2: RAM, and the passthrough device frames (page granular).
        let mut frames = HeapFrames;
        let mut s2 = Stage2::new(&mut frames)?;
        s2.map(&mut frames, ram.base, ram.base, ram.size, MemType::Normal)?;
        let mut mapped_pages: Vec<u64> = Vec::new();
        for d in &passthrough {
            let mut p = d.base & !(PAGE - 1);
            while p < d.base + d.size {
                if !mapped_pages.contains(&p) {
                    s2.map(&mut frames, p, p, PAGE, MemType::Device)?;
                    mapped_pages.push(p);
                }
                p += PAGE;
            }
        }

        // vGIC at the host's addresses.
        // SAFETY: GICD_TYPER of the identity-mapped physical distributor.
        let typer = unsafe { core::ptr::read_volatile((plat.gic.gicd.base + 4) as *const u32) };
        let nr_spis = ((typer & 0x1f) + 1) * 32 - 32;
        let gicr_base = plat.gic.gicr.first().map_or(0, |r| r.base);
        let mut vgic = Vgic::try_new(VgicConfig {
            gicd_base: plat.gic.gicd.base,
            gicr_base,
            nr_spis: nr_spis.min(988),
            vcpu_mpidrs,
        })?;
        let vt = plat.timer.virt_intid;
        for v in 0..nr_vcpus {
            vgic.set_hw_private(v, vt, Some(vt))?;
        }
        let mut forwarded = Vec::new();
        for d in &passthrough {
            if vgic.set_hw(d.intid, Some(d.intid)).is_ok() {
                forwarded.push(d.intid);
            }
        }

        let el1 = El1Context::reset(0);
        let vcpus = (0..nr_vcpus)
            .map(|i| Vcpu {
                id: i,
                regs: GuestRegs::default(),
                el1: El1Context::reset(vcpu_mpidr(i)),
                fp: FpContext::default(),
                gicif: VcpuIfState::default(),
                lrs: [0; crate::vgic::NUM_LRS_MAX],
                online: false,
                counters: Counters::default(),
            })
            .collect();
        let _ = el1;
        let mut vm = Box::new(Vm {
            vmid: 1,
            ram,
            stage2: s2,
            vgic,
            uart: VPl011::new(),
            uart_region: plat.uart.as_ref().map(|u| Region { base: u.base, size: u.size.max(0x1000) }),
            uart_intid: plat.uart.as_ref().map_or(33, |u| u.intid),
            virt_timer_intid: vt,
            maintenance_intid: plat.gic.maintenance_intid.unwrap_or(25),
            hyp_timer_intid: plat.timer.hyp_intid,
            forwarded,
            vcpus,
            nr_lrs: gic::nr_lrs().min(crate::vgic::NUM_LRS_MAX),
            bad_accesses: 0,
        });
        // vCPU 0 enters the kernel per the arm64 boot protocol.
        let v0 = &mut vm.vcpus[0];
        v0.online = true;
        v0.regs.x[0] = dtb_at;
        v0.regs.elr = kernel_at;
        v0.regs.spsr = SPSR_EL1H_MASKED;
        info!(
            "dom0: {} vCPU(s), RAM {:#x}-{:#x}, kernel {:#x} ({} KiB), initrd {:?}, dtb {:#x}, {} passthrough device(s)",
            nr_vcpus,
            ram.base,
            ram.end(),
            kernel_at,
            image_size / 1024,
            initrd.map(|r| (r.base, r.size)),
            dtb_at,
            passthrough.len()
        );
        Ok(vm)
    }

    fn contains_ram(&self, ipa: u64, len: u64) -> bool {
        ipa >= self.ram.base && ipa.checked_add(len).is_some_and(|e| e <= self.ram.end())
    }
}

/// EL1h with D, A, I, F masked: the state Linux expects at entry.
const SPSR_EL1H_MASKED: u64 = 0x3c5;

/// HCR_EL2 for guests: stage 2 on, IRQ/FIQ/SError to EL2, WFI and SMC
/// trapped, EL1 is AArch64, broadcast maintenance inner shareable.
fn guest_hcr() -> u64 {
    let mut hcr: u64 = (1 << 0) // VM
        | (1 << 1) // SWIO
        | (1 << 3) // FMO
        | (1 << 4) // IMO
        | (1 << 5) // AMO
        | (1 << 9) // FB
        | (1 << 10) // BSU = inner shareable
        | (1 << 13) // TWI
        | (1 << 19) // TSC
        | (1 << 31); // RW
    // Pointer authentication: let the guest use its keys and instructions.
    let isar1 = read_sysreg!("id_aa64isar1_el1");
    if isar1 & 0xff0_0ff0 != 0 {
        hcr |= (1 << 40) | (1 << 41); // APK, API
    }
    hcr
}

/// Configures this pCPU's EL2 controls for running `vm`.
fn load_vm(vm: &Vm) {
    write_sysreg!("hcr_el2", guest_hcr());
    // CPTR_EL2: no FP/SIMD/SVE trap; SME untrapped when present (TSM is RES1
    // otherwise).
    let sme = (read_sysreg!("id_aa64pfr1_el1") >> 24) & 0xf != 0;
    write_sysreg!("cptr_el2", 0x22ff | if sme { 0 } else { 1 << 12 });
    // Counter readable at EL1/EL0; the EL1 physical timer is trapped.
    write_sysreg!("cnthctl_el2", 1);
    write_sysreg!("cntvoff_el2", 0);
    write_sysreg!("vpidr_el2", read_sysreg!("midr_el1"));
    let parange = read_sysreg!("id_aa64mmfr0_el1") & 0xf;
    write_sysreg!("vtcr_el2", stage2::vtcr(parange.min(2)));
    write_sysreg!("vttbr_el2", stage2::vttbr(vm.stage2.root(), vm.vmid));
    sysreg::isb();
    sysreg::tlbi_vmalls12e1is();
}

fn load_vcpu(v: &Vcpu) {
    v.el1.restore();
    v.fp.restore();
    v.gicif.restore();
}

/// Runs the VM on this pCPU until it powers off.
pub fn run(vm: Box<Vm>) -> ! {
    let vm: &'static mut Vm = Box::leak(vm);
    load_vm(vm);
    // Physical interrupts the hypervisor takes.
    gic::enable(vm.maintenance_intid, 0, false);
    gic::enable(vm.hyp_timer_intid, 0, false);
    gic::enable(vm.virt_timer_intid, 0, false);
    gic::enable(vm.uart_intid, 0, false);
    for &i in &vm.forwarded {
        gic::enable(i, 0, true);
    }
    console::enable_rx_irq();
    let cur = 0;
    load_vcpu(&vm.vcpus[cur]);
    info!("starting dom0 vCPU0 at {:#x}", vm.vcpus[cur].regs.elr);
    loop {
        let n = vm.nr_lrs;
        let v = &mut vm.vcpus[cur];
        let fr = vm.vgic.flush_lrs(cur, &mut v.lrs[..n]);
        v.counters.injections += fr.filled as u64;
        for i in 0..n {
            gic::write_lr(i, v.lrs[i]);
        }
        gic::write_ich_hcr(gic::ICH_HCR_EN | if fr.overflow { gic::ICH_HCR_UIE } else { 0 });
        let kind = run_guest(&mut v.regs);
        for i in 0..n {
            v.lrs[i] = gic::read_lr(i);
        }
        gic::write_ich_hcr(0);
        let _ = vm.vgic.sync_lrs(cur, &mut vm.vcpus[cur].lrs[..n]);
        vm.vcpus[cur].counters.exits += 1;
        match kind {
            ExitKind::Sync => handle_sync(vm, cur),
            ExitKind::Irq | ExitKind::Fiq => {
                vm.vcpus[cur].counters.irq_exits += 1;
                handle_irqs(vm, cur);
            }
            ExitKind::SError => {
                warn!("vCPU{cur}: SError from the guest (ESR {:#x}); injecting it", read_sysreg!("esr_el2"));
                write_sysreg!("hcr_el2", guest_hcr() | (1 << 8));
            }
        }
    }
}

/// Takes every pending physical interrupt.
fn handle_irqs(vm: &mut Vm, cur: usize) {
    while let Some(id) = gic::ack() {
        if id == vm.virt_timer_intid {
            // Forwarded: stays active until the guest deactivates it.
            gic::eoi(id);
            let _ = vm.vgic.inject_edge(id, cur);
        } else if vm.forwarded.contains(&id) {
            gic::eoi(id);
            let _ = vm.vgic.inject_edge(id, cur);
        } else if id == vm.uart_intid {
            while vm.uart.rx_space() > 0 {
                match console::getc() {
                    Some(b) => {
                        vm.uart.receive(b);
                    }
                    None => break,
                }
            }
            gic::eoi(id);
            gic::deactivate(id);
            let _ = vm.vgic.set_level(vm.uart_intid, cur, vm.uart.irq_level());
        } else {
            // Maintenance, hypervisor timer, SGIs: nothing more to do here;
            // the run loop syncs and refills the list registers.
            gic::eoi(id);
            gic::deactivate(id);
        }
    }
}

fn reg_read(regs: &GuestRegs, r: u8) -> u64 {
    if r == 31 {
        0
    } else {
        regs.x[r as usize]
    }
}

fn reg_write(regs: &mut GuestRegs, r: u8, v: u64) {
    if r != 31 {
        regs.x[r as usize] = v;
    }
}

fn handle_sync(vm: &mut Vm, cur: usize) {
    let esr = read_sysreg!("esr_el2");
    let far = read_sysreg!("far_el2");
    let hpfar = read_sysreg!("hpfar_el2");
    let ilen = esr::instruction_length(esr);
    match esr::decode(esr, far, hpfar) {
        Exit::Wfx { wfe } => {
            vm.vcpus[cur].regs.elr += ilen;
            if wfe {
                vm.vcpus[cur].counters.wfe_traps += 1;
            } else {
                vm.vcpus[cur].counters.wfi_traps += 1;
                block(vm, cur);
            }
        }
        Exit::Hvc { .. } => {
            vm.vcpus[cur].counters.hvc += 1;
            psci_call(vm, cur);
        }
        Exit::Smc { .. } => {
            vm.vcpus[cur].counters.smc += 1;
            vm.vcpus[cur].regs.elr += ilen;
            psci_call(vm, cur);
        }
        Exit::SysReg(s) => {
            vm.vcpus[cur].counters.sysreg += 1;
            if !s.read && s.key() == esr::ICC_SGI1R_EL1 {
                let value = reg_read(&vm.vcpus[cur].regs, s.reg);
                vm.vcpus[cur].counters.sgis_sent += 1;
                let _ = vm.vgic.send_sgi(cur, value);
                vm.vcpus[cur].regs.elr += ilen;
            } else if !s.read && (s.key() == esr::ICC_ASGI1R_EL1 || s.key() == esr::ICC_SGI0R_EL1) {
                // Group 0 / alternate-group SGIs do not exist for this guest.
                vm.vcpus[cur].regs.elr += ilen;
            } else {
                inject_undef(vm, cur);
            }
        }
        Exit::Mmio(a) => {
            vm.vcpus[cur].counters.mmio += 1;
            if mmio(vm, cur, &a).is_ok() {
                vm.vcpus[cur].regs.elr += ilen;
            } else {
                report_bad_access(vm, cur, a.ipa, "bad MMIO access");
                inject_abort(vm, cur, true, far);
            }
        }
        Exit::DataAbort { ipa, iss } => {
            report_bad_access(vm, cur, ipa, if iss & (1 << 24) == 0 { "data abort without syndrome" } else { "data abort" });
            inject_abort(vm, cur, true, far);
        }
        Exit::InstructionAbort { ipa } => {
            report_bad_access(vm, cur, ipa, "instruction abort");
            inject_abort(vm, cur, false, far);
        }
        Exit::Undefined { .. } | Exit::Unknown { .. } => inject_undef(vm, cur),
    }
}

fn report_bad_access(vm: &mut Vm, cur: usize, ipa: u64, what: &str) {
    vm.bad_accesses += 1;
    if vm.bad_accesses <= 16 {
        warn!(
            "vCPU{cur}: {what} at IPA {ipa:#x} (PC {:#x}); injecting an external abort",
            vm.vcpus[cur].regs.elr
        );
    }
}

/// Emulated device access. Err: the access is not valid (abort the guest).
fn mmio(vm: &mut Vm, cur: usize, a: &MmioAccess) -> Result<(), ()> {
    let value = esr::store_value(a, reg_read(&vm.vcpus[cur].regs, a.reg));
    if vm.vgic.decode(a.ipa).is_some() {
        if a.write {
            vm.vgic.mmio_write(cur, a.ipa, a.size, value).map_err(|_| ())?;
        } else {
            let v = vm.vgic.mmio_read(cur, a.ipa, a.size).map_err(|_| ())?;
            reg_write(&mut vm.vcpus[cur].regs, a.reg, esr::load_value(a, v));
        }
        return Ok(());
    }
    if let Some(u) = vm.uart_region {
        if a.ipa >= u.base && a.ipa < u.base + crate::vpl011::FRAME_SIZE {
            let off = a.ipa - u.base;
            if a.write {
                vm.uart.write(off, a.size, value as u32, &mut console::guest_putc).map_err(|_| ())?;
            } else {
                let v = vm.uart.read(off, a.size).map_err(|_| ())? as u64;
                reg_write(&mut vm.vcpus[cur].regs, a.reg, esr::load_value(a, v));
            }
            let _ = vm.vgic.set_level(vm.uart_intid, cur, vm.uart.irq_level());
            return Ok(());
        }
    }
    Err(())
}

/// WFI: wait until this vCPU has an interrupt to take.
fn block(vm: &mut Vm, cur: usize) {
    while !vm.vgic.has_deliverable(cur) {
        sysreg::wfi();
        handle_irqs(vm, cur);
    }
}

/// Delivers a synchronous exception to the guest's EL1 vector table.
fn inject_exception(vm: &mut Vm, cur: usize, esr_el1: u64, far: Option<u64>) {
    let regs = &mut vm.vcpus[cur].regs;
    let mode = regs.spsr & 0x1f;
    let offset = match mode {
        0b00100 => 0x000, // EL1t
        0b00101 => 0x200, // EL1h
        m if m & 0x10 != 0 => 0x600, // AArch32 EL0
        _ => 0x400, // AArch64 EL0
    };
    write_sysreg!("esr_el1", esr_el1);
    if let Some(f) = far {
        write_sysreg!("far_el1", f);
    }
    write_sysreg!("elr_el1", regs.elr);
    write_sysreg!("spsr_el1", regs.spsr);
    regs.elr = read_sysreg!("vbar_el1") + offset;
    regs.spsr = SPSR_EL1H_MASKED;
}

/// A synchronous external abort for a data (or instruction) access.
fn inject_abort(vm: &mut Vm, cur: usize, data: bool, far: u64) {
    vm.vcpus[cur].counters.aborts_injected += 1;
    let same_el = vm.vcpus[cur].regs.spsr & 0x1f != 0 && vm.vcpus[cur].regs.spsr & 0x10 == 0;
    let ec: u64 = match (data, same_el) {
        (true, true) => 0x25,
        (true, false) => 0x24,
        (false, true) => 0x21,
        (false, false) => 0x20,
    };
    // IL=1, FSC = 0b010000 synchronous external abort.
    inject_exception(vm, cur, (ec << 26) | (1 << 25) | 0x10, Some(far));
}

fn inject_undef(vm: &mut Vm, cur: usize) {
    vm.vcpus[cur].counters.undef_injected += 1;
    inject_exception(vm, cur, 1 << 25, None);
}

fn psci_call(vm: &mut Vm, cur: usize) {
    let x = vm.vcpus[cur].regs.x;
    let ret: i64 = match psci::decode(x[0], x[1], x[2], x[3]) {
        Call::Version => psci::VERSION_1_1 as i64,
        Call::Features { function } => psci::features(function),
        Call::SmcccVersion => psci::SMCCC_VERSION_1_1 as i64,
        Call::SmcccArchFeatures { .. } => psci::NOT_SUPPORTED,
        Call::MigrateInfoType => psci::MIGRATE_NOT_REQUIRED,
        Call::CpuSuspend => {
            block(vm, cur);
            psci::SUCCESS
        }
        Call::CpuOn { target, entry, .. } => match vm.vcpus.iter().position(|v| v.el1.vmpidr & 0xff_00ff_ffff == target & 0xff_00ff_ffff) {
            None => psci::INVALID_PARAMETERS,
            Some(t) if vm.vcpus[t].online => psci::ALREADY_ON,
            Some(_) if !vm.contains_ram(entry, 4) || entry % 4 != 0 => psci::INVALID_ADDRESS,
            // Secondary vCPUs need the scheduler (SMP); until then they
            // cannot be started.
            Some(_) => psci::DENIED,
        },
        Call::AffinityInfo { target, .. } => match vm.vcpus.iter().find(|v| v.el1.vmpidr & 0xff_00ff_ffff == target & 0xff_00ff_ffff) {
            None => psci::INVALID_PARAMETERS,
            Some(v) if v.online => psci::AFF_ON,
            Some(_) => psci::AFF_OFF,
        },
        Call::CpuOff => {
            vm.vcpus[cur].online = false;
            power_off(vm)
        }
        Call::SystemOff => power_off(vm),
        Call::SystemReset => {
            print_counters(vm);
            info!("dom0 requested a system reset");
            smc::psci_system_reset()
        }
        Call::Unknown { function } => {
            vm.vcpus[cur].counters.unsupported_calls += 1;
            log::debug!("vCPU{cur}: unsupported SMCCC function {function:#x}");
            psci::NOT_SUPPORTED
        }
    };
    vm.vcpus[cur].regs.x[0] = ret as u64;
}

fn print_counters(vm: &Vm) {
    for v in &vm.vcpus {
        let c = &v.counters;
        crate::hvprintln!(
            "(HV) stats vcpu{}: exits={} wfi_traps={} wfe_traps={} hvc={} smc={} mmio={} sysreg={} irq_exits={} injections={} sgis_sent={} aborts_injected={} undef_injected={} unsupported_calls={}",
            v.id, c.exits, c.wfi_traps, c.wfe_traps, c.hvc, c.smc, c.mmio, c.sysreg, c.irq_exits, c.injections, c.sgis_sent, c.aborts_injected, c.undef_injected, c.unsupported_calls
        );
    }
}

fn power_off(vm: &mut Vm) -> ! {
    print_counters(vm);
    info!("dom0 powered off; no VM left, powering off the machine");
    smc::psci_system_off()
}
