//! The hypervisor's statistics as text: every VM's counters in the stable
//! `key=value` format between `(HV) stats begin X` / `(HV) stats end X`
//! lines (see `crate::stats`). The power-off dump and Ctrl-\\ print it
//! (`runtime::vcpu`), `hvctl stats` reads it (`runtime::devices::control`).

use super::console;
use super::percpu::now_ns;
use super::vm::{vms, Vm};
use crate::arch::gic;
use core::sync::atomic::Ordering;

/// Every VM's statistics, as `print_stats` prints them and `hvctl stats`
/// reads them: Dom0's as they always were (`vcpuN.`,
/// `blk0.`, `uart0.`, ...), then one block per domain (`domN.` totals: exits,
/// aborts injected, disk requests) and each DomU's vCPUs, disk and UART with
/// a `dN.` prefix.
pub fn write_stats(out: &mut impl core::fmt::Write) {
    // The heap as the request found it, before this text takes any: the
    // figure a create/destroy cycle must leave unchanged.
    let heap = crate::runtime::heap::stats();
    let all = vms();
    // One instant for every domain's run time, and the host clock at it, so
    // shares over the time between two prints add up.
    let now = now_ns();
    let (boot_sum, now_sum) = crate::runtime::smmu::image_checksum();
    let _ = writeln!(
        out,
        "(HV) stats begin host\nhost.now_ns={now}\nhost.image_checksum_boot={boot_sum:#018x}\nhost.image_checksum_now={now_sum:#018x}\n(HV) stats end host"
    );
    {
        let mut text = alloc::string::String::new();
        let _ = all[0].sched.write_runqueue_stats(&mut text);
        let _ = writeln!(out, "(HV) stats begin sched\n{text}(HV) stats end sched");
    }
    if crate::arch::smmu::present() {
        let mut text = alloc::string::String::new();
        let _ = crate::arch::smmu::write_stats(&mut text);
        let _ = writeln!(out, "(HV) stats begin smmu\n{text}(HV) stats end smmu");
    }
    write_vm_stats(out, all[0]);
    for vm in all {
        write_domain_totals(out, vm, now);
        if vm.domid != 0 {
            write_domu_stats(out, vm);
        }
    }
    // The whole heap: what every VM's quota and the hypervisor's own part
    // use together, and the most they ever did.
    let h = heap;
    let _ = writeln!(
        out,
        "(HV) stats begin heap\nheap.used={}\nheap.hwm={}\nheap.size={}\n(HV) stats end heap",
        h.used, h.hwm, h.size
    );
    if let Some((size, free, domains)) = crate::runtime::domctl::pool_stats() {
        let _ = writeln!(
            out,
            "(HV) stats begin pool\npool.size={size}\npool.free={free}\npool.domains={domains}\n(HV) stats end pool"
        );
    }
}

/// `domN.name=value`: a domain's totals over its vCPUs and its disk, and its
/// run time (`run_ns`, the scheduler's [`crate::sched::DomainStats`]).
pub(crate) fn write_domain_totals(out: &mut impl core::fmt::Write, vm: &Vm, now: u64) {
    let sum = |f: fn(&crate::runtime::vm::TrapCounters) -> &core::sync::atomic::AtomicU64| -> u64 {
        vm.shared.iter().map(|s| f(&s.counters).load(Ordering::Relaxed)).sum()
    };
    let disk_requests = vm.disk.as_ref().map_or(0, |d| {
        let st = d.state.lock();
        let c = st.dev.counters();
        c.reads + c.writes + c.flushes + c.get_ids + c.unsupported
    });
    let n = vm.domid;
    // Run time as the scheduler charges it (Credit2's burn), all vCPUs, up
    // to `now`.
    let run_ns = vm.sched.domain_run_ns(n, now).unwrap_or(0);
    let _ = writeln!(
        out,
        "(HV) stats begin dom{n}\ndom{n}.vcpus={}\ndom{n}.exits={}\ndom{n}.aborts_injected={}\ndom{n}.undef_injected={}\ndom{n}.disk_requests={disk_requests}\ndom{n}.run_ns={run_ns}\ndom{n}.stopped={}\n(HV) stats end dom{n}",
        vm.vcpus.len(),
        sum(|c| &c.exits),
        sum(|c| &c.aborts_injected),
        sum(|c| &c.undef_injected),
        u8::from(vm.stopped.load(Ordering::Relaxed)),
    );
}

/// A DomU's vCPUs, disk and UART, every line prefixed `dN.`.
pub(crate) fn write_domu_stats(out: &mut impl core::fmt::Write, vm: &Vm) {
    let n = vm.domid;
    let prefixed =
        |text: &str| -> alloc::string::String { text.lines().map(|l| alloc::format!("d{n}.{l}\n")).collect() };
    for (i, s) in vm.shared.iter().enumerate() {
        let mut st = vm.sched.stats(vm.gid(i)).unwrap_or_default();
        s.counters.fill(&mut st.counters);
        let mut text = alloc::string::String::new();
        let _ = st.write_text(i as u32, &mut text);
        let _ = writeln!(out, "(HV) stats begin d{n}.vcpu{i}\n{}(HV) stats end d{n}.vcpu{i}", prefixed(&text));
    }
    if let Some(disk) = &vm.disk {
        let mut text = alloc::string::String::new();
        disk.write_text(&mut text);
        let _ = writeln!(out, "(HV) stats begin d{n}.blk0\n{}(HV) stats end d{n}.blk0", prefixed(&text));
    }
    let mut text = alloc::string::String::new();
    let _ = vm.quota.write_text("quota", &mut text);
    let _ = writeln!(out, "(HV) stats begin d{n}.quota\n{}(HV) stats end d{n}.quota", prefixed(&text));
    if let Some(vits) = &vm.vits {
        let text = alloc::format!("{}", vits.lock().counters());
        let dropped = vm.lpis_dropped.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "(HV) stats begin d{n}.vits0\n{}d{n}.vits0.lpis_dropped={dropped}\n(HV) stats end d{n}.vits0",
            prefixed(&text)
        );
    }
    if !vm.pci_functions.is_empty() {
        write_pci_stats(out, vm, &alloc::format!("d{n}."));
    }
    let u = vm.uart.lock();
    let (rx, holds, overruns) = (u.rx_bytes, u.rx_holds, u.rx_overruns);
    drop(u);
    let dropped = console::rx_dropped(n);
    let _ = writeln!(
        out,
        "(HV) stats begin d{n}.uart0\nd{n}.uart0.rx_bytes={rx}\nd{n}.uart0.rx_holds={holds}\nd{n}.uart0.rx_overruns={overruns}\nd{n}.uart0.rx_dropped={dropped}\n(HV) stats end d{n}.uart0"
    );
}

/// A VM's configuration-space counters (`runtime::devices::vpci`), keys
/// `<prefix>pci.*`, and its functions.
pub(crate) fn write_pci_stats(out: &mut impl core::fmt::Write, vm: &Vm, prefix: &str) {
    let c = &vm.pci_counters;
    let functions: alloc::vec::Vec<alloc::string::String> =
        vm.pci_functions.iter().map(|f| alloc::format!("{}", f.bdf)).collect();
    let _ = writeln!(
        out,
        "(HV) stats begin {prefix}pci\n{prefix}pci.functions={}\n{prefix}pci.cfg_ignored={}\n{prefix}pci.bar_moves={}\n{prefix}pci.cfg_bad={}\n{prefix}pci.hidden_accesses={}\n(HV) stats end {prefix}pci",
        functions.join(","),
        c.cfg_ignored.load(Ordering::Relaxed),
        c.bar_moves.load(Ordering::Relaxed),
        c.cfg_bad.load(Ordering::Relaxed),
        c.hidden.load(Ordering::Relaxed),
    );
}

/// Dom0's statistics in the stable `vcpuN.name=value` format (see
/// `crate::stats`).
pub(crate) fn write_vm_stats(out: &mut impl core::fmt::Write, vm: &Vm) {
    for (i, s) in vm.shared.iter().enumerate() {
        let mut st = vm.sched.stats(vm.gid(i)).unwrap_or_default();
        s.counters.fill(&mut st.counters);
        let mut text = alloc::string::String::new();
        let _ = st.write_text(i as u32, &mut text);
        let _ = writeln!(out, "(HV) stats begin vcpu{i}\n{}(HV) stats end vcpu{i}", text);
    }
    if let Some(disk) = &vm.disk {
        let mut text = alloc::string::String::new();
        disk.write_text(&mut text);
        let _ = writeln!(out, "(HV) stats begin blk0\n{}(HV) stats end blk0", text);
    }
    let (rx_bytes, rx_holds, rx_overruns) = {
        let u = vm.uart.lock();
        (u.rx_bytes, u.rx_holds, u.rx_overruns)
    };
    if gic::its::its_present() {
        let mut text = alloc::string::String::new();
        let st = gic::its::stats();
        let _ = st.write_text(&mut text);
        // Commands per second of hypervisor uptime (the GICv4 path sends a
        // few per guest mapping change and one VMOVP per vCPU migration).
        let total: u64 = st.commands.iter().sum();
        let per_s = total.saturating_mul(1_000_000_000) / now_ns().max(1);
        let _ = writeln!(out, "(HV) stats begin its\n{}its.cmds_per_sec={per_s}\n(HV) stats end its", text);
    }
    if let Some(vits) = &vm.vits {
        let text = alloc::format!("{}", vits.lock().counters());
        let dropped = vm.lpis_dropped.load(Ordering::Relaxed);
        let _ = writeln!(out, "(HV) stats begin vits0\n{text}vits0.lpis_dropped={dropped}\n(HV) stats end vits0");
    }
    if vm.pci_counters.hidden.load(Ordering::Relaxed) > 0 {
        write_pci_stats(out, vm, "");
    }
    if let Some(v4) = &vm.vlpi {
        let mapped = gic::its::vlpis_mapped();
        let _ = writeln!(
            out,
            "(HV) stats begin vlpi0\nvlpi0.vpes={}\nvlpi0.vlpis_mapped={mapped}\n(HV) stats end vlpi0",
            v4.vpes.len()
        );
    }
    let rx_dropped = console::rx_dropped(0);
    let _ = writeln!(
        out,
        "(HV) stats begin uart0\nuart0.rx_bytes={rx_bytes}\nuart0.rx_holds={rx_holds}\nuart0.rx_overruns={rx_overruns}\nuart0.rx_dropped={rx_dropped}\n(HV) stats end uart0"
    );
    // The physical console: input read and lost to a full ring, DomU
    // output dropped to a full ring, output written while waiting for the
    // UART.
    let (rx, rx_overruns, tx_dropped, tx_waited) = console::counters();
    let _ = writeln!(
        out,
        "(HV) stats begin console\nconsole.rx_bytes={rx}\nconsole.rx_overruns={rx_overruns}\nconsole.tx_dropped={tx_dropped}\nconsole.tx_waited={tx_waited}\n(HV) stats end console"
    );
    if vm.iomem.is_some() {
        let _ = writeln!(
            out,
            "(HV) stats begin iomem\niomem.maps={}\niomem.denied={}\n(HV) stats end iomem",
            vm.iomem_maps.load(Ordering::Relaxed),
            vm.iomem_denied.load(Ordering::Relaxed)
        );
    }
    let mut text = alloc::string::String::new();
    let _ = vm.irq_counters.write_text(&mut text);
    let _ = writeln!(out, "(HV) stats begin irq\n{}(HV) stats end irq", text);
    let mut text = alloc::string::String::new();
    let _ = vm.quota.write_text("quota", &mut text);
    let _ = writeln!(out, "(HV) stats begin quota\n{}(HV) stats end quota", text);
}
