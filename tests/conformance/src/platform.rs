//! What the guest learns from its DTB: RAM, CPUs, GIC frames, ITS, timer
//! and PMU interrupts, the PSCI conduit, the UART and the command line.

use crate::arch::MAX_CPUS;
use fdt::Fdt;

pub const MAX_RAM: usize = 8;
pub const MAX_GICR_REGIONS: usize = 4;

pub struct Platform {
    /// RAM ranges (base, size).
    pub ram: [(u64, u64); MAX_RAM],
    pub nram: usize,
    /// MPIDR affinity of each CPU, in DT order.
    pub mpidr: [u64; MAX_CPUS],
    pub ncpus: usize,
    /// CPUs the DT lists beyond MAX_CPUS (left off).
    pub extra_cpus: usize,
    pub gicd: u64,
    pub gicr: [(u64, u64); MAX_GICR_REGIONS],
    pub ngicr: usize,
    pub its: Option<u64>,
    pub uart: Option<u64>,
    /// The UART's interrupt (an SPI every platform here has).
    pub uart_intid: Option<u32>,
    /// INTIDs of the EL1 physical (non-secure) and virtual timers.
    pub ptimer_intid: u32,
    pub vtimer_intid: u32,
    pub pmu_intid: Option<u32>,
    /// PSCI through SMC (else HVC).
    pub psci_smc: bool,
    /// `conformance.linger_ms=` on the command line: how long to wait
    /// before SYSTEM_OFF (a Dom0 that must outlive a DomU).
    pub linger_ms: u64,
    /// `conformance.skip_checks` on the command line: run no check (a
    /// Dom0 that only hosts a DomU under test and must not print over it).
    pub skip_checks: bool,
    /// `conformance.exits`: time the exiting operations instead of the
    /// checks (`crate::exits`).
    pub exits: bool,
}

fn be32(b: &[u8], i: usize) -> Option<u32> {
    b.get(i * 4..i * 4 + 4).map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

/// The INTID of entry `n` of an `interrupts` list of GIC triples (type:
/// 0 SPI, 1 PPI; number; flags).
fn ppi(prop: &[u8], n: usize) -> Option<u32> {
    let (ty, num) = (be32(prop, n * 3)?, be32(prop, n * 3 + 1)?);
    Some(if ty == 1 { num + 16 } else { num + 32 })
}

impl Platform {
    /// Reads the DTB at `dtb`.
    ///
    /// # Safety
    /// `dtb` is the address the loader passed in x0, mapped as normal memory.
    pub unsafe fn from_dtb(dtb: usize) -> Result<Platform, &'static str> {
        // SAFETY: the caller's contract; the crate checks the header and size.
        let fdt = unsafe { Fdt::from_ptr(dtb as *const u8) }.map_err(|_| "no valid DTB in x0")?;
        let mut p = Platform {
            ram: [(0, 0); MAX_RAM],
            nram: 0,
            mpidr: [0; MAX_CPUS],
            ncpus: 0,
            extra_cpus: 0,
            gicd: 0,
            gicr: [(0, 0); MAX_GICR_REGIONS],
            ngicr: 0,
            its: None,
            uart: None,
            uart_intid: None,
            ptimer_intid: 30,
            vtimer_intid: 27,
            pmu_intid: None,
            psci_smc: false,
            linger_ms: 0,
            skip_checks: false,
            exits: false,
        };
        for node in fdt.all_nodes() {
            let is_mem = node.property("device_type").and_then(|v| v.as_str()) == Some("memory");
            if !is_mem {
                continue;
            }
            for r in node.reg().into_iter().flatten() {
                if p.nram < MAX_RAM {
                    p.ram[p.nram] = (r.starting_address as u64, r.size.unwrap_or(0) as u64);
                    p.nram += 1;
                }
            }
        }
        if let Some(cpus) = fdt.find_node("/cpus") {
            for cpu in cpus.children() {
                if cpu.property("device_type").and_then(|v| v.as_str()) != Some("cpu") {
                    continue;
                }
                let Some(reg) = cpu.property("reg") else { continue };
                let id = match reg.value.len() {
                    4 => be32(reg.value, 0).unwrap_or(0) as u64,
                    8 => ((be32(reg.value, 0).unwrap_or(0) as u64) << 32) | be32(reg.value, 1).unwrap_or(0) as u64,
                    _ => continue,
                };
                if p.ncpus < MAX_CPUS {
                    p.mpidr[p.ncpus] = id;
                    p.ncpus += 1;
                } else {
                    p.extra_cpus += 1;
                }
            }
        }
        let gic = fdt.find_compatible(&["arm,gic-v3"]).ok_or("no arm,gic-v3 node")?;
        let nregions =
            gic.property("#redistributor-regions").and_then(|v| v.as_usize()).unwrap_or(1).min(MAX_GICR_REGIONS);
        let mut regs = gic.reg().ok_or("GIC node without reg")?;
        p.gicd = regs.next().ok_or("GIC node without a distributor")?.starting_address as u64;
        for r in regs.take(nregions) {
            p.gicr[p.ngicr] = (r.starting_address as u64, r.size.unwrap_or(0) as u64);
            p.ngicr += 1;
        }
        for child in gic.children() {
            if child.compatible().is_some_and(|c| c.all().any(|s| s == "arm,gic-v3-its")) {
                p.its = child.reg().and_then(|mut r| r.next()).map(|r| r.starting_address as u64);
            }
        }
        if let Some(uart) = fdt.find_compatible(&["arm,pl011"]) {
            p.uart = uart.reg().and_then(|mut r| r.next()).map(|r| r.starting_address as u64);
            p.uart_intid = uart.property("interrupts").and_then(|i| ppi(i.value, 0));
        }
        if let Some(t) = fdt.find_compatible(&["arm,armv8-timer", "arm,armv7-timer"]) {
            if let Some(i) = t.property("interrupts") {
                p.ptimer_intid = ppi(i.value, 1).unwrap_or(30);
                p.vtimer_intid = ppi(i.value, 2).unwrap_or(27);
            }
        }
        if let Some(pmu) = fdt.find_compatible(&["arm,armv8-pmuv3"]) {
            p.pmu_intid = pmu.property("interrupts").and_then(|i| ppi(i.value, 0));
        }
        if let Some(psci) = fdt.find_compatible(&["arm,psci-1.0", "arm,psci-0.2", "arm,psci"]) {
            p.psci_smc = psci.property("method").and_then(|m| m.as_str()) == Some("smc");
        }
        if let Some(args) = fdt.find_node("/chosen").and_then(|c| c.property("bootargs")).and_then(|b| b.as_str()) {
            for w in args.split_whitespace() {
                if let Some(v) = w.strip_prefix("conformance.linger_ms=") {
                    p.linger_ms = v.parse().unwrap_or(0);
                }
                if w == "conformance.skip_checks" {
                    p.skip_checks = true;
                }
                if w == "conformance.exits" {
                    p.exits = true;
                }
            }
        }
        Ok(p)
    }

    /// This CPU's index in the DT's list, from MPIDR_EL1.
    pub fn cpu_index(&self, mpidr: u64) -> Option<usize> {
        let aff = mpidr & 0xff_00ff_ffff;
        self.mpidr[..self.ncpus].iter().position(|&m| m == aff)
    }

    /// The end of the highest RAM range.
    pub fn ram_end(&self) -> u64 {
        self.ram[..self.nram].iter().map(|r| r.0 + r.1).max().unwrap_or(0)
    }

    /// Whether [base, base + size) overlaps RAM.
    pub fn overlaps_ram(&self, base: u64, size: u64) -> bool {
        self.ram[..self.nram].iter().any(|r| r.0 < base + size && base < r.0 + r.1)
    }
}
