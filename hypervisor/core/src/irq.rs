//! The physical IRQ route table: what the hypervisor does with each physical
//! INTID it acknowledges.
//!
//! Why a table and not a chain that tests every acknowledged INTID against
//! each source in turn: each source (virtual timer, the backend disk,
//! forwarded SPIs, the UART, the EL2 timer, host LPIs that back guest MSIs,
//! GICv4 doorbells) is one [`Route`] here and one arm in
//! `runtime::vcpu::handle_irqs`'s `match`, not another branch in a chain.
//!
//! Layout: SGIs, PPIs and SPIs (INTIDs 0-1019) are a dense array indexed by
//! INTID. LPIs (INTID ≥ 8192) are sparse — a guest MSI maps one host LPI at a
//! time — so they live in a sorted vector searched by binary search, with a
//! capacity fixed when the table is made: inserting never allocates, and a
//! guest cannot grow the table beyond that bound ([`RouteError::LpiTableFull`]).
//! Extended PPIs/SPIs and the special INTIDs cannot be routed.
//!
//! Locking (in `runtime`): the table is read on every physical interrupt on
//! every pCPU and written rarely (VM creation, the vITS mapping or unmapping
//! a device's events while the guest runs), so the runtime keeps it under a
//! spin `RwLock`; this module is plain data.
//!
//! An INTID with no route gets the default: priority drop and deactivation,
//! counted as unrouted ([`IrqCounters`]).

use crate::intid::IntId;
use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering};

/// What the hypervisor does with a physical interrupt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The EL1 virtual timer PPI, forwarded to the running vCPU as a HW
    /// interrupt (priority drop only; the guest's deactivation ends it).
    VirtualTimer,
    /// The PMU's overflow PPI, forwarded to the running vCPU as a HW
    /// interrupt like the virtual timer (`crate::vpmu`).
    Pmu,
    /// A passthrough device's SPI, injected as HW interrupt `vintid`
    /// (priority drop only; the guest's deactivation ends it).
    ForwardedSpi { vintid: IntId },
    /// The physical disk behind the hypervisor's virtio-blk finished work.
    PhysDisk,
    /// Physical UART receive: console input for the vPL011.
    Console,
    /// The EL2 physical timer (CNTHP): scheduler and device deadlines.
    HypTimer,
    /// An SGI kick or the maintenance interrupt: the exit is the point.
    Kick,
    /// A host LPI backing the guest MSI (DeviceID, EventID) of the vITS.
    GuestLpi { devid: u32, eventid: u32 },
    /// A GICv4 vPE's doorbell: a vLPI arrived for `vcpu` (the host-wide
    /// scheduler id: Dom0's vCPU i is i) while its vPE was not resident
    /// (blocked or descheduled); wake it.
    Doorbell { vcpu: usize },
    /// An SMMU's event queue or global error interrupt.
    Smmu,
}

/// The kinds of [`Route`], without their data: what the counters count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteKind {
    VirtualTimer,
    Pmu,
    ForwardedSpi,
    PhysDisk,
    Console,
    HypTimer,
    Kick,
    GuestLpi,
    Doorbell,
    Smmu,
}

impl RouteKind {
    /// Every kind, in the order the counters are printed.
    pub const ALL: [RouteKind; 10] = [
        RouteKind::VirtualTimer,
        RouteKind::Pmu,
        RouteKind::ForwardedSpi,
        RouteKind::PhysDisk,
        RouteKind::Console,
        RouteKind::HypTimer,
        RouteKind::Kick,
        RouteKind::GuestLpi,
        RouteKind::Doorbell,
        RouteKind::Smmu,
    ];

    /// The counter's name in the statistics text.
    pub const fn name(self) -> &'static str {
        match self {
            RouteKind::VirtualTimer => "virtual_timer",
            RouteKind::Pmu => "pmu",
            RouteKind::ForwardedSpi => "forwarded_spi",
            RouteKind::PhysDisk => "phys_disk",
            RouteKind::Console => "console",
            RouteKind::HypTimer => "hyp_timer",
            RouteKind::Kick => "kick",
            RouteKind::GuestLpi => "guest_lpi",
            RouteKind::Doorbell => "doorbell",
            RouteKind::Smmu => "smmu",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

impl Route {
    pub const fn kind(self) -> RouteKind {
        match self {
            Route::VirtualTimer => RouteKind::VirtualTimer,
            Route::Pmu => RouteKind::Pmu,
            Route::ForwardedSpi { .. } => RouteKind::ForwardedSpi,
            Route::PhysDisk => RouteKind::PhysDisk,
            Route::Console => RouteKind::Console,
            Route::HypTimer => RouteKind::HypTimer,
            Route::Kick => RouteKind::Kick,
            Route::GuestLpi { .. } => RouteKind::GuestLpi,
            Route::Doorbell { .. } => RouteKind::Doorbell,
            Route::Smmu => RouteKind::Smmu,
        }
    }
}

/// Why a route was not added or removed.
#[derive(thiserror::Error, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteError {
    /// The INTID already has a route; the table keeps `existing`.
    #[error("{intid} is already routed to {existing:?}; refusing {refused:?}")]
    AlreadyRouted { intid: IntId, existing: Route, refused: Route },
    /// Remove of an INTID that has no route.
    #[error("{0} has no route")]
    NotRouted(IntId),
    /// Special and extended INTIDs are never routed.
    #[error("{0} cannot be routed (only SGIs, PPIs, SPIs and LPIs)")]
    NotRoutable(IntId),
    /// Every LPI slot is taken.
    #[error("all {capacity} LPI routes are taken")]
    LpiTableFull { capacity: usize },
}

/// SGIs, PPIs and SPIs: INTIDs 0-1019.
const DENSE: usize = (IntId::PRIVATE_COUNT + IntId::MAX_SPI_COUNT) as usize;

/// Physical INTID → [`Route`].
pub struct IrqRoutes {
    dense: alloc::vec::Vec<Option<Route>>,
    /// Sorted by INTID; never longer than `lpi_capacity`.
    lpis: alloc::vec::Vec<(IntId, Route)>,
    lpi_capacity: usize,
}

impl IrqRoutes {
    /// An empty table with room for `lpi_capacity` LPI routes (allocated now).
    pub fn new(lpi_capacity: usize) -> Self {
        Self { dense: alloc::vec![None; DENSE], lpis: alloc::vec::Vec::with_capacity(lpi_capacity), lpi_capacity }
    }

    /// The route of `intid`, `None` for an unrouted (or unroutable) one.
    pub fn lookup(&self, intid: IntId) -> Option<Route> {
        if intid.is_lpi() {
            let i = self.lpis.binary_search_by_key(&intid, |e| e.0).ok()?;
            Some(self.lpis[i].1)
        } else {
            self.dense.get(intid.raw() as usize).copied().flatten()
        }
    }

    /// Adds a route; an INTID that has one keeps it.
    pub fn insert(&mut self, intid: IntId, route: Route) -> Result<(), RouteError> {
        if intid.is_lpi() {
            return self.insert_lpi(intid, route);
        }
        let slot = self.dense_slot(intid)?;
        if let Some(existing) = *slot {
            return Err(RouteError::AlreadyRouted { intid, existing, refused: route });
        }
        *slot = Some(route);
        Ok(())
    }

    fn insert_lpi(&mut self, intid: IntId, route: Route) -> Result<(), RouteError> {
        match self.lpis.binary_search_by_key(&intid, |e| e.0) {
            Ok(i) => Err(RouteError::AlreadyRouted { intid, existing: self.lpis[i].1, refused: route }),
            Err(_) if self.lpis.len() >= self.lpi_capacity => {
                Err(RouteError::LpiTableFull { capacity: self.lpi_capacity })
            }
            Err(i) => {
                self.lpis.insert(i, (intid, route));
                Ok(())
            }
        }
    }

    /// Removes the route of `intid` and returns it.
    pub fn remove(&mut self, intid: IntId) -> Result<Route, RouteError> {
        if intid.is_lpi() {
            let i = self.lpis.binary_search_by_key(&intid, |e| e.0).map_err(|_| RouteError::NotRouted(intid))?;
            return Ok(self.lpis.remove(i).1);
        }
        self.dense_slot(intid)?.take().ok_or(RouteError::NotRouted(intid))
    }

    fn dense_slot(&mut self, intid: IntId) -> Result<&mut Option<Route>, RouteError> {
        if intid.is_special() {
            return Err(RouteError::NotRoutable(intid));
        }
        self.dense.get_mut(intid.raw() as usize).ok_or(RouteError::NotRoutable(intid))
    }

    /// How many LPIs are routed.
    pub fn lpi_count(&self) -> usize {
        self.lpis.len()
    }

    /// Builds a VM's table from the interrupts the hypervisor takes for it.
    /// A clash (two sources on one INTID) is refused: the run loop could
    /// serve only one of them.
    pub fn build(src: &HostIrqs<'_>, lpi_capacity: usize) -> Result<Self, RouteError> {
        let mut t = Self::new(lpi_capacity);
        t.insert(src.virt_timer, Route::VirtualTimer)?;
        if let Some(i) = src.pmu {
            t.insert(i, Route::Pmu)?;
        }
        if let Some(i) = src.phys_disk {
            t.insert(i, Route::PhysDisk)?;
        }
        for &i in src.forwarded {
            t.insert(i, Route::ForwardedSpi { vintid: i })?;
        }
        t.insert(src.uart, Route::Console)?;
        t.insert(src.hyp_timer, Route::HypTimer)?;
        t.insert(src.kick, Route::Kick)?;
        t.insert(src.maintenance, Route::Kick)?;
        for &i in src.smmu {
            t.insert(i, Route::Smmu)?;
        }
        Ok(t)
    }
}

/// The SPIs an ACPI Dom0 gets as forwarded HW interrupts (Xen's
/// `acpi_route_spis`): every SPI of a distributor with `nr_spis` of them
/// (INTIDs 32 up, below the special range) except those in `keep`, the
/// hypervisor's own. The DSDT tells Dom0 which device uses which; the
/// hypervisor does not read it.
pub fn acpi_dom0_spis(nr_spis: u32, keep: &[IntId]) -> alloc::vec::Vec<IntId> {
    (32..32u32.saturating_add(nr_spis).min(IntId::SPECIAL_FIRST.raw()))
        .filter_map(|raw| IntId::try_from(raw).ok())
        .filter(|i| !keep.contains(i))
        .collect()
}

/// The physical interrupts a VM's run loop takes, as `runtime::vm` knows them.
pub struct HostIrqs<'a> {
    pub virt_timer: IntId,
    /// The PMU's overflow PPI, with a vPMU.
    pub pmu: Option<IntId>,
    pub hyp_timer: IntId,
    pub maintenance: IntId,
    /// The SGI one pCPU sends another to make it exit.
    pub kick: IntId,
    pub uart: IntId,
    /// The physical virtio-blk's SPI in backend mode.
    pub phys_disk: Option<IntId>,
    /// Passthrough SPIs, injected under the same INTID.
    pub forwarded: &'a [IntId],
    /// The SMMUs' event queue and global error SPIs.
    pub smmu: &'a [IntId],
}

/// Physical interrupts taken, per route kind and unrouted; updated by every
/// pCPU, read at power-off.
#[derive(Default)]
pub struct IrqCounters {
    taken: [AtomicU64; RouteKind::ALL.len()],
    unrouted: AtomicU64,
}

impl IrqCounters {
    /// Counts one interrupt taken with `route` (`None`: unrouted).
    pub fn record(&self, route: Option<Route>) {
        let c = match route {
            Some(r) => &self.taken[r.kind().index()],
            None => &self.unrouted,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn taken(&self, kind: RouteKind) -> u64 {
        self.taken[kind.index()].load(Ordering::Relaxed)
    }

    pub fn unrouted(&self) -> u64 {
        self.unrouted.load(Ordering::Relaxed)
    }

    /// `irq.<kind>=N` lines, every kind in [`RouteKind::ALL`] order, then
    /// `irq.unrouted=N`. Not `vcpuN.` lines, so `stats::parse_text` skips them.
    pub fn write_text(&self, out: &mut dyn fmt::Write) -> fmt::Result {
        for k in RouteKind::ALL {
            writeln!(out, "irq.{}={}", k.name(), self.taken(k))?;
        }
        writeln!(out, "irq.unrouted={}", self.unrouted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::String;

    fn id(v: u32) -> IntId {
        IntId::try_from(v).unwrap()
    }

    #[test]
    fn an_acpi_dom0_gets_every_spi_but_the_hypervisors() {
        // QEMU virt: 224 SPIs, the hypervisor's PL011 on INTID 33.
        let spis = acpi_dom0_spis(224, &[id(33)]);
        assert_eq!(spis.len(), 223);
        assert_eq!((spis[0], spis[1], spis[222]), (id(32), id(34), id(255)));
        // A full distributor stops below the special INTIDs; private
        // INTIDs in `keep` change nothing.
        let spis = acpi_dom0_spis(988, &[id(27), id(26)]);
        assert_eq!((spis.len(), spis.last()), (988, Some(&id(1019))));
        assert_eq!(acpi_dom0_spis(u32::MAX, &[]).len(), 988);
        assert!(acpi_dom0_spis(0, &[]).is_empty());
        // The result routes without a clash next to the hypervisor's own.
        let spis = acpi_dom0_spis(224, &[IntId::spi(1).unwrap()]);
        assert!(IrqRoutes::build(&host(&spis), 4).is_ok());
    }

    fn host(forwarded: &[IntId]) -> HostIrqs<'_> {
        HostIrqs {
            virt_timer: IntId::VIRT_TIMER,
            pmu: IntId::try_from(23).ok(),
            hyp_timer: IntId::HYP_TIMER,
            maintenance: IntId::MAINTENANCE,
            kick: IntId::sgi(1).unwrap(),
            uart: IntId::spi(1).unwrap(),
            phys_disk: None,
            forwarded,
            smmu: &[],
        }
    }

    #[test]
    fn insert_lookup_remove_in_every_routable_range() {
        let mut t = IrqRoutes::new(4);
        let cases = [
            (id(0), Route::Kick),
            (id(31), Route::VirtualTimer),
            (id(32), Route::Console),
            (id(1019), Route::ForwardedSpi { vintid: id(1019) }),
            (id(8192), Route::GuestLpi { devid: 8, eventid: 0 }),
            (id((1 << 24) - 1), Route::GuestLpi { devid: 8, eventid: 1 }),
        ];
        for (i, r) in cases {
            assert_eq!(t.lookup(i), None);
            t.insert(i, r).unwrap();
        }
        for (i, r) in cases {
            assert_eq!(t.lookup(i), Some(r), "{i}");
        }
        assert_eq!(t.lookup(id(33)), None);
        assert_eq!(t.lookup(id(8193)), None);
        assert_eq!(t.lpi_count(), 2);
        for (i, r) in cases {
            assert_eq!(t.remove(i), Ok(r));
            assert_eq!(t.lookup(i), None);
            assert_eq!(t.remove(i), Err(RouteError::NotRouted(i)));
        }
        assert_eq!(t.lpi_count(), 0);
    }

    #[test]
    fn duplicates_are_refused_and_the_first_route_stays() {
        let mut t = IrqRoutes::new(2);
        t.insert(id(48), Route::PhysDisk).unwrap();
        let e = t.insert(id(48), Route::Console);
        assert_eq!(
            e,
            Err(RouteError::AlreadyRouted { intid: id(48), existing: Route::PhysDisk, refused: Route::Console })
        );
        assert_eq!(t.lookup(id(48)), Some(Route::PhysDisk));
        let lpi = id(9000);
        t.insert(lpi, Route::GuestLpi { devid: 1, eventid: 2 }).unwrap();
        assert!(matches!(
            t.insert(lpi, Route::GuestLpi { devid: 3, eventid: 4 }),
            Err(RouteError::AlreadyRouted { .. })
        ));
        assert_eq!(t.lookup(lpi), Some(Route::GuestLpi { devid: 1, eventid: 2 }));
        assert_eq!(t.lpi_count(), 1);
    }

    #[test]
    fn special_and_extended_intids_are_not_routable() {
        let mut t = IrqRoutes::new(1);
        for v in [1020, 1023, 1056, 1119, 4096, 5119] {
            let i = id(v);
            assert_eq!(t.insert(i, Route::Kick), Err(RouteError::NotRoutable(i)), "{i}");
            assert_eq!(t.lookup(i), None);
            assert_eq!(t.remove(i), Err(RouteError::NotRoutable(i)));
        }
    }

    #[test]
    fn the_lpi_table_is_bounded_and_reusable() {
        let mut t = IrqRoutes::new(3);
        for n in [7, 1, 4] {
            t.insert(IntId::lpi(n).unwrap(), Route::GuestLpi { devid: 0, eventid: n }).unwrap();
        }
        let extra = IntId::lpi(2).unwrap();
        assert_eq!(t.insert(extra, Route::Kick), Err(RouteError::LpiTableFull { capacity: 3 }));
        // Dense INTIDs do not count against it.
        t.insert(id(40), Route::Console).unwrap();
        t.remove(IntId::lpi(4).unwrap()).unwrap();
        t.insert(extra, Route::GuestLpi { devid: 0, eventid: 2 }).unwrap();
        for n in [1, 2, 7] {
            assert_eq!(t.lookup(IntId::lpi(n).unwrap()), Some(Route::GuestLpi { devid: 0, eventid: n }));
        }
        assert_eq!(t.lookup(IntId::lpi(4).unwrap()), None);
    }

    #[test]
    fn lpi_lookups_agree_with_a_model_under_random_inserts_and_removes() {
        let mut rng = crate::testrng::Rng(9);
        let mut t = IrqRoutes::new(64);
        let mut model = alloc::collections::BTreeMap::new();
        for _ in 0..5000 {
            let n = rng.below(100) as u32;
            let i = IntId::lpi(n).unwrap();
            let r = Route::GuestLpi { devid: n, eventid: 0 };
            if rng.below(2) == 0 {
                let want = if model.contains_key(&n) {
                    Err(RouteError::AlreadyRouted { intid: i, existing: r, refused: r })
                } else if model.len() >= 64 {
                    Err(RouteError::LpiTableFull { capacity: 64 })
                } else {
                    model.insert(n, r);
                    Ok(())
                };
                assert_eq!(t.insert(i, r), want);
            } else {
                assert_eq!(t.remove(i), model.remove(&n).ok_or(RouteError::NotRouted(i)));
            }
            assert_eq!(t.lookup(i), model.get(&n).copied());
        }
        assert_eq!(t.lpi_count(), model.len());
    }

    #[test]
    fn a_vm_table_routes_every_source() {
        let fwd = [id(48), id(49)];
        let mut h = host(&fwd);
        h.phys_disk = Some(id(79));
        let t = IrqRoutes::build(&h, 0).unwrap();
        assert_eq!(t.lookup(IntId::VIRT_TIMER), Some(Route::VirtualTimer));
        assert_eq!(t.lookup(IntId::HYP_TIMER), Some(Route::HypTimer));
        assert_eq!(t.lookup(IntId::MAINTENANCE), Some(Route::Kick));
        assert_eq!(t.lookup(id(1)), Some(Route::Kick));
        assert_eq!(t.lookup(id(33)), Some(Route::Console));
        assert_eq!(t.lookup(id(79)), Some(Route::PhysDisk));
        assert_eq!(t.lookup(id(49)), Some(Route::ForwardedSpi { vintid: id(49) }));
        // Other SGIs, PPIs and SPIs take the default.
        for v in [0, 2, 15, 30, 34, 50] {
            assert_eq!(t.lookup(id(v)), None, "{v}");
        }
        // Room for no LPI was asked for.
        let mut t = t;
        assert_eq!(t.insert(id(8192), Route::Kick), Err(RouteError::LpiTableFull { capacity: 0 }));
    }

    #[test]
    fn a_clash_between_sources_is_an_error() {
        let fwd = [id(33)];
        let e = IrqRoutes::build(&host(&fwd), 0).err();
        let refused = Route::Console;
        let existing = Route::ForwardedSpi { vintid: id(33) };
        assert_eq!(e, Some(RouteError::AlreadyRouted { intid: id(33), existing, refused }));
        assert_eq!(
            alloc::format!("{}", e.unwrap()),
            "SPI 1 (INTID 33) is already routed to ForwardedSpi { vintid: SPI 1 (INTID 33) }; refusing Console"
        );
    }

    #[test]
    fn counters_count_per_kind_and_print_every_line() {
        let c = IrqCounters::default();
        c.record(Some(Route::Kick));
        c.record(Some(Route::Kick));
        c.record(Some(Route::GuestLpi { devid: 1, eventid: 1 }));
        c.record(None);
        assert_eq!(c.taken(RouteKind::Kick), 2);
        assert_eq!(c.taken(RouteKind::GuestLpi), 1);
        c.record(Some(Route::Doorbell { vcpu: 1 }));
        assert_eq!(c.taken(RouteKind::Doorbell), 1);
        assert_eq!(c.taken(RouteKind::Console), 0);
        assert_eq!(c.unrouted(), 1);
        let mut s = String::new();
        c.write_text(&mut s).unwrap();
        assert_eq!(
            s,
            "irq.virtual_timer=0\nirq.pmu=0\nirq.forwarded_spi=0\nirq.phys_disk=0\nirq.console=0\nirq.hyp_timer=0\n\
             irq.kick=2\nirq.guest_lpi=1\nirq.doorbell=1\nirq.smmu=0\nirq.unrouted=1\n"
        );
        // The vCPU stats parser skips these lines.
        assert!(crate::stats::parse_text(&s).unwrap().is_empty());
    }

    #[test]
    fn every_kind_is_listed_once_at_its_index() {
        for (i, k) in RouteKind::ALL.iter().enumerate() {
            assert_eq!(k.index(), i);
        }
    }
}
