//! The ACPI boot, after the EFI half restarted the image: the hand-off's
//! memory map and ACPI tables describe the machine, and Dom0 boots with
//! ACPI.

use super::*;

/// The hypervisor proper after an EFI boot: the machine from ACPI, then
/// Dom0 with ACPI.
pub fn acpi_main(h: &'static Handoff) -> ! {
    let map = match h.memory_map() {
        Ok(m) => m,
        Err(e) => hv_fatal!("{e}"),
    };
    let ram = match map.ram() {
        Ok(r) => r,
        Err(e) => hv_fatal!("{e}"),
    };
    info!(
        "EFI boot: RSDP {:#x}, memory map of {} descriptors, {} MiB of RAM in {} ranges",
        h.rsdp,
        map.len(),
        ram.iter().map(|r| r.size).sum::<u64>() >> 20,
        ram.len()
    );
    let mem = EfiMem(map);
    let machine: Machine =
        match Tables::from_rsdp(&mem, h.rsdp).and_then(|t| AcpiMachine::parse(&t)).and_then(|m| m.to_machine(ram)) {
            Ok(p) => p,
            Err(e) => hv_fatal!("{e}"),
        };
    info!("ACPI machine: {}", machine_line(&machine));
    let efi_cfg = match h.config().map(EfiConfig::parse) {
        None => {
            info!("EFI boot: no configuration file");
            EfiConfig::default()
        }
        Some(Ok(c)) => c,
        Some(Err(e)) => hv_fatal!("{e}"),
    };
    info!(
        "EFI config [{}]: options \"{}\", kernel {} \"{}\", ramdisk {}",
        efi_cfg.section,
        efi_cfg.options,
        efi_cfg.kernel.as_deref().unwrap_or("(none)"),
        efi_cfg.kernel_args,
        efi_cfg.ramdisk.as_deref().unwrap_or("(none)")
    );
    let cfg = crate::runtime::boot::parse_options(&efi_cfg.options);
    let module = |r: Region, args: Option<String>| {
        (r.size > 0).then_some(BootModule { base: r.base, size: r.size, bootargs: args })
    };
    // Dom0 boots with ACPI from the tables of `firmware::dom0_efi`, and
    // never calls the fake system table's (absent) runtime services.
    let dom0_args = alloc::format!("{} efi=noruntime acpi=force", efi_cfg.kernel_args);
    let boot = BootInfo {
        bootargs: Some(efi_cfg.options.clone()),
        kernel: module(h.kernel, Some(dom0_args)),
        ramdisk: module(h.ramdisk, None),
        domus: alloc::vec::Vec::new(),
    };
    // Where Dom0 would go: the same boot-layout plan as the DTB path, on
    // the RAM of the EFI memory map. The RSDP stands where the DTB would
    // (the firmware's description of the machine, kept).
    let Some(kernel) = boot.kernel.clone() else {
        info!("EFI boot: no Dom0 kernel in the configuration file; powering off");
        crate::runtime::console::flush();
        smc::psci_system_off()
    };
    let plan = {
        let Some(rsdp) = mem.read(h.rsdp, 36) else { hv_fatal!("ACPI RSDP at {:#x} is not readable", h.rsdp) };
        let image = Region {
            base: core::ptr::addr_of!(__image_start) as u64,
            size: core::ptr::addr_of!(__image_end) as u64 - core::ptr::addr_of!(__image_start) as u64,
        };
        let plan = match crate::runtime::boot::plan_layout(&machine, &boot, &kernel, &cfg, image, rsdp) {
            Ok(plan) => plan,
            Err(e) => hv_fatal!("boot layout: {e}"),
        };
        info!(
            "EFI boot: layout: heap {:#x}-{:#x}, guest RAM {:#x}-{:#x}, kernel {:#x} -> entry {:#x}, initrd {:#x} -> {:#x}",
            plan.heap.base,
            plan.heap.end(),
            plan.guest_ram.base,
            plan.guest_ram.end(),
            kernel.base,
            plan.entry,
            plan.initrd.map_or(0, |c| c.src.base),
            plan.initrd.map_or(0, |c| c.dst.base)
        );
        plan
    };
    // Dom0 with ACPI: the same bring-up as the DT path, then Dom0 with the
    // firmware view of `firmware::dom0_efi`.
    let nr_pcpus = crate::runtime::boot::bring_up(&machine, &cfg, &plan);
    let tables = match Tables::from_rsdp(&mem, h.rsdp) {
        Ok(t) => t,
        Err(e) => hv_fatal!("{e}"),
    };
    let firmware: alloc::vec::Vec<_> = mem
        .0
        .iter()
        .filter(|d| matches!(d.ty, uefi::memory_type::ACPI_RECLAIM | uefi::memory_type::ACPI_NVS))
        .collect();
    // Dom0's devices (the DSDT's, which the hypervisor does not interpret)
    // are mapped on demand outside this memory (`crate::iomem`), and every
    // SPI but the hypervisor's is Dom0's (`runtime::vm`).
    let memory = mem.0.iter().filter(|d| !matches!(d.ty, uefi::memory_type::MMIO | uefi::memory_type::MMIO_PORT_SPACE));
    let acpi = AcpiDom0 { tables: &tables, firmware, memory: memory.filter_map(|d| d.region()).collect() };
    crate::runtime::boot::run_dom0(&machine, &boot, &cfg, &plan, &GuestFirmware::Acpi(acpi), nr_pcpus)
}
