//! Dom0's control device (docs/hvctl.md): the register page `hvctl` maps
//! through `/dev/mem`, trapped here, and the requests it carries, acted on
//! here. The page's protocol (claim, request in, doorbell, reply out) is
//! `crate::control::Device`'s; this is the glue and the executor.
//!
//! Only Dom0's bus has the page (`domain::vmplan`): a DomU's access to the
//! same IPA is a stage-2 fault like any unmapped address, answered with an
//! external abort. Lock order: the device's lock, then whatever a request
//! takes (the scheduler's admin and runqueue locks, a VM's devices).

use super::claim;
use crate::control::{self, BoundedText, Reply, Request, Status};
use crate::domain::vmplan::VmPlan;
use crate::domain::DomainId;
use crate::esr::{self, MmioAccess};
use crate::mmio_bus::{BusError, Device};
use crate::runtime::percpu::now_ns;
use crate::runtime::vm::{vms, Bus, MmioFault, Vcpu, Vm};
use crate::sched::{DomainParams, RunState, SchedError};
use crate::sync::Mutex;
use alloc::string::String;
use core::fmt::Write as _;
use core::sync::atomic::Ordering;

/// The one control device (one client at a time, see `control::Claim`).
static DEVICE: Mutex<control::Device> = Mutex::new(control::Device::new());

/// Claims the page on Dom0's bus.
pub fn register(bus: &mut Bus, vp: &VmPlan) -> Result<(), BusError> {
    claim(bus, vp, Device::Control, mmio)
}

/// A trapped access at offset `off` of the page.
fn mmio(_vm: &Vm, me: usize, v: &mut Vcpu, a: &MmioAccess, off: u64, value: u64) -> Result<(), MmioFault> {
    let now = now_ns();
    let mut dev = DEVICE.lock();
    if a.write {
        let counters = dev.counters();
        dev.write(now, off, a.size, value, |r| execute(me, now, r, counters)).map_err(|_| MmioFault::Control)
    } else {
        let r = dev.read(now, off, a.size).map_err(|_| MmioFault::Control)?;
        v.regs.set_reg(a.reg, esr::load_value(a, r));
        Ok(())
    }
}

/// The device's counters as `stats` lines (`control.*`), in a block of
/// their own.
pub fn write_counters(out: &mut impl core::fmt::Write, c: control::Counters) {
    let _ = write!(out, "(HV) stats begin control\n{c}(HV) stats end control\n");
}

/// The counters now (for the power-off dump; not under the device's lock).
pub fn counters() -> control::Counters {
    DEVICE.lock().counters()
}

/// Acts on a decoded request; `counters`: the device's, as the request
/// arrived (the device is locked while this runs).
fn execute(me: usize, now: u64, r: Request<'_>, counters: control::Counters) -> Result<Reply, Status> {
    let mut out = String::new();
    match r {
        Request::List => vms().iter().for_each(|vm| list_line(&mut out, vm, now)),
        Request::VcpuList => vms().iter().for_each(|vm| vcpu_lines(&mut out, vm)),
        Request::Stats { offset } => {
            return Ok(page_of(&STATS_TEXT, offset, STATS_MAX, |t| {
                crate::runtime::stats::write_stats(t);
                write_counters(t, counters);
            }))
        }
        Request::SchedGet { dom } => sched_get(&mut out, dom)?,
        Request::SchedSetDomain { dom, weight, cap } => sched_set(now, dom, weight, cap)?,
        Request::SetOption { name, value } => set_option(name, value)?,
        Request::TraceDump { offset } => {
            return Ok(page_of(&TRACE_TEXT, offset, TRACE_MAX, |t| {
                let _ = vms()[0].write_trace(t, crate::trace::DumpReason::Request, 0);
            }))
        }
        Request::Destroy { dom } => destroy(me, dom)?,
        Request::Create(spec) => {
            let dom = crate::runtime::domctl::create(&spec)?;
            let _ = writeln!(out, "domid={dom}");
        }
        Request::Load { dom, module, first_page, pages } => {
            let sum = crate::runtime::domctl::load(dom, module, first_page, pages)?;
            let _ = writeln!(out, "fnv={sum:016x}");
        }
        Request::Start { dom } => crate::runtime::domctl::start(me, dom)?,
        Request::Pause { dom } => pause(me, dom, true)?,
        Request::Unpause { dom } => pause(me, dom, false)?,
        Request::Shutdown { dom } => shutdown(me, dom)?,
    }
    Ok(Reply { text: out.into_bytes(), more: 0 })
}

/// A paged reply's text (the stats, the flight recorder), built at the
/// first page (offset 0) and kept until the last page is read: the
/// counters and rings move on meanwhile, the pages must still join up.
static STATS_TEXT: Mutex<String> = Mutex::new(String::new());
static TRACE_TEXT: Mutex<String> = Mutex::new(String::new());

/// The most of the stats' and the flight recorder's text a request builds
/// (the rest is left out, and the text says so): their size grows with the
/// machine's pCPUs and vCPUs, and it comes from the hypervisor's heap.
const STATS_MAX: usize = 4 << 20;
const TRACE_MAX: usize = 1 << 20;

/// The page at `offset` of the text `kept` holds, built by `build` (at
/// most `max` bytes) when `offset` is 0; freed after its last page.
fn page_of(kept: &Mutex<String>, offset: u32, max: usize, build: impl FnOnce(&mut BoundedText)) -> Reply {
    let mut text = kept.lock();
    if offset == 0 {
        let mut t = BoundedText::new(max);
        build(&mut t);
        *text = t.finish();
    }
    let reply = Reply::paged(text.as_bytes(), offset);
    if reply.more == 0 {
        *text = String::new();
    }
    reply
}

fn domain(dom: DomainId) -> Result<&'static Vm, Status> {
    vms().iter().copied().find(|vm| vm.domid == dom).ok_or(Status::NoDom)
}

/// `xl list`'s facts about `vm`, one line of `key=value`s.
fn list_line(out: &mut String, vm: &Vm, now: u64) {
    let n = vm.domid;
    let p = vm.sched.domain_params(n).unwrap_or_default();
    let running = (0..vm.shared.len()).any(|i| matches!(vm.sched.state(vm.gid(i)), Some(RunState::Running(_))));
    let state = match (vm.stopped.load(Ordering::Relaxed), vm.paused.load(Ordering::Relaxed), running) {
        (true, _, _) => "shutdown",
        (false, true, _) => "paused",
        (false, false, true) => "running",
        (false, false, false) => "blocked",
    };
    let name: String = vm.name.chars().map(|c| if c.is_whitespace() { '_' } else { c }).collect();
    let _ = writeln!(
        out,
        "domid={n} name={name} vcpus={} memory_kib={} state={state} run_ns={} weight={} cap={}",
        vm.shared.len(),
        vm.ram.size / 1024,
        vm.sched.domain_run_ns(n, now).unwrap_or(0),
        p.weight,
        p.cap_percent.unwrap_or(0),
    );
}

/// `xl vcpu-list`'s facts about each of `vm`'s vCPUs.
fn vcpu_lines(out: &mut String, vm: &Vm) {
    for i in 0..vm.shared.len() {
        let g = vm.gid(i);
        let (state, pcpu) = match vm.sched.state(g) {
            Some(RunState::Running(p)) => ("running", Some(p)),
            Some(RunState::Runnable) => ("runnable", None),
            Some(RunState::Blocked) => ("blocked", None),
            Some(RunState::Offline) | None => ("offline", None),
        };
        let pcpu = pcpu.map_or(String::from("-"), |p| alloc::format!("{p}"));
        let credit = vm.sched.credit(g).unwrap_or(0);
        let run_ns = vm.sched.stats(g).map_or(0, |s| s.counters.run_ns);
        let _ = writeln!(out, "domid={} vcpu={i} pcpu={pcpu} state={state} run_ns={run_ns} credit={credit}", vm.domid);
    }
}

/// `xl sched-credit2 [-d DOM]`: the scheduler's settings without a domain,
/// then each domain's (or the one's) weight and cap.
fn sched_get(out: &mut String, dom: Option<DomainId>) -> Result<(), Status> {
    let all = vms();
    let cfg = all[0].sched.config();
    if dom.is_none() {
        let _ = writeln!(
            out,
            "ratelimit_us={} runqueue={} max_cpus_runqueue={} runqueues={} wake_preempt={}",
            cfg.ratelimit_ns / 1000,
            cfg.runqueue.name(),
            cfg.max_cpus_runqueue,
            all[0].sched.nr_runqueues(),
            if cfg.extensions() { "on" } else { "off" },
        );
    }
    for vm in all.iter().filter(|vm| dom.is_none_or(|d| d == vm.domid)) {
        let p = vm.sched.domain_params(vm.domid).unwrap_or_default();
        let _ = writeln!(out, "domid={} weight={} cap={}", vm.domid, p.weight, p.cap_percent.unwrap_or(0));
    }
    match dom {
        Some(d) if domain(d).is_err() => Err(Status::NoDom),
        _ => Ok(()),
    }
}

/// `xl sched-credit2 -d DOM [-w W] [-c CAP]`: cap 0 removes the cap.
fn sched_set(now: u64, dom: DomainId, weight: Option<u32>, cap: Option<u32>) -> Result<(), Status> {
    let vm = domain(dom)?;
    let mut p: DomainParams = vm.sched.domain_params(dom).ok_or(Status::NoDom)?;
    if let Some(w) = weight {
        p.weight = w;
    }
    if let Some(c) = cap {
        p.cap_percent = (c != 0).then_some(c);
    }
    vm.sched.set_domain_params(now, dom, p).map_err(|e| match e {
        SchedError::UnknownDomain(_) => Status::NoDom,
        _ => Status::Range,
    })?;
    log::info!("hvctl: d{dom} weight {} cap {}", p.weight, p.cap_percent.unwrap_or(0));
    Ok(())
}

/// `hvctl set NAME=VALUE`: a scheduler option that may change while the
/// machine runs (`sched::LIVE_OPTIONS`), in every runqueue, and the VMs'
/// view of whether the extensions run.
fn set_option(name: &str, value: &str) -> Result<(), Status> {
    let all = vms();
    let cfg = all[0].sched.set_option(name, value).map_err(|e| match e {
        SchedError::UnknownOption | SchedError::NotLive => Status::NoOpt,
        SchedError::ExtensionOff(_) => Status::Perm,
        _ => Status::Range,
    })?;
    for vm in all {
        vm.extensions.store(cfg.extensions(), Ordering::Relaxed);
    }
    log::info!("hvctl: {name}={value}");
    Ok(())
}

/// `xl destroy DOM`: the DomU stops at once (`runtime::wake::stop_vm`); its
/// RAM stays reserved (the boot plan placed it; there is no pool to give it
/// back to yet) and `hvctl list` shows it as `shutdown`. Dom0 cannot be
/// destroyed from itself; destroying a stopped domain again changes nothing.
/// `hvctl pause` / `unpause` of a DomU (Dom0 runs the tool: not permitted).
fn pause(me: usize, dom: DomainId, on: bool) -> Result<(), Status> {
    if dom == 0 {
        return Err(Status::Perm);
    }
    crate::runtime::wake::pause_vm(domain(dom)?, me, on);
    Ok(())
}

/// `xl shutdown DOM`: asks the DomU's kernel to power off, as a serial
/// console asks Linux: Magic SysRq `s`, `u`, `o` (emergency sync, remount
/// read-only, power off), each after a break on its vPL011
/// (`VPl011::request_sysrq`). The guest then stops itself with PSCI
/// SYSTEM_OFF. Why SysRq: the other requests Linux acts on need Xen's PV
/// interface (xenstore's `control/shutdown`), ACPI (DomUs boot with a
/// device tree) or gpio-keys (not in Debian's cloud kernel); SysRq over a
/// PL011 console is in every Debian arm64 kernel and allowed by its
/// default mask (0x1b6). A guest that turned SysRq off ignores it;
/// `hvctl destroy` remains.
fn shutdown(me: usize, dom: DomainId) -> Result<(), Status> {
    if dom == 0 {
        return Err(Status::Perm);
    }
    let vm = domain(dom)?;
    if vm.uart_region.is_none() {
        // No console to ask through.
        return Err(Status::Unsupported);
    }
    if vm.stopped.load(Ordering::Acquire) {
        return Ok(());
    }
    let level = {
        let mut uart = vm.uart.lock();
        uart.request_sysrq(b"suo").map_err(|_| Status::Inval)?;
        uart.irq_level()
    };
    crate::runtime::wake::set_line(vm, me, vm.uart_intid, 0, level, crate::sched::WakeCause::Interrupt);
    log::info!("d{dom}: shutdown requested (hvctl shutdown)");
    Ok(())
}

fn destroy(me: usize, dom: DomainId) -> Result<(), Status> {
    if dom == 0 {
        return Err(Status::Perm);
    }
    // A domain still being made is not in the table yet.
    crate::runtime::domctl::destroy(me, domain(dom).ok(), dom)
}
