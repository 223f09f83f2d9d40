//! Discrete-event simulator that drives the real [`Scheduler`] on a virtual clock.
//!
//! Why: the seed experiment's collapse (Xen Credit2, 1 pCPU, a hog and an
//! I/O vCPU) is a property of the wake path, so we can measure both wake
//! modes exactly, in virtual nanoseconds, without QEMU noise. Nothing in
//! here models the scheduler: every decision comes from [`Scheduler`], called
//! exactly as the EL2 code calls it (`wake` → [`WakeAction`], `block`,
//! `yield_to`, `note_critical_exit`, `schedule` at the times it asks for).
//!
//! Workload: vCPU 0 is a hog (always runnable); vCPU 1 does synchronous
//! (queue depth 1) I/O: it spends `submit_ns` of CPU per request, the device
//! completes `service_ns` later, the completion interrupt wakes it. A switch
//! to a different vCPU (or from idle) costs `switch_ns` before the guest
//! runs; the wake→run latency reported is wake time → guest running again,
//! so it includes that cost. Reschedule requests (local or IPI) take effect
//! immediately: IPI delivery is folded into the switch cost. The switch
//! is EL2 time on the pCPU after `schedule()`, so the scheduler charges it
//! to the incoming vCPU's run time (as on the real pCPU); the guest makes no
//! progress during it. [`SimResult::hog_guest_ns`] counts only the hog's
//! own progress, so the switches show in its share.
//!
//! [`Scenario::LockHolder`] models the lock-holder preemption of FACTS: the
//! completion interrupt lands on the hog vCPU, whose handler takes the
//! queue lock, sends the SGI that wakes the I/O vCPU (an SGI trap), and
//! releases the lock a little later. The I/O vCPU needs that lock to submit;
//! while the holder is descheduled it spins (busy, or with WFE traps that
//! yield to the holder). Submission latency (slat) is measured from the first
//! lock attempt to the request's submission.

use alloc::vec;
use alloc::vec::Vec;

use super::{CritEvidence, DomainId, DomainParams, SchedConfig, SchedError, Scheduler, VcpuId, WakeAction, WakeCause};

pub const HOG: VcpuId = VcpuId(0);
pub const IO: VcpuId = VcpuId(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// One pCPU shared by the hog and the I/O vCPU.
    OneP2V,
    /// Baseline: the hog pinned on pCPU 0, the I/O vCPU on pCPU 1.
    TwoP2V,
}

impl Topology {
    pub fn name(self) -> &'static str {
        match self {
            Topology::OneP2V => "1p2v",
            Topology::TwoP2V => "2p2v",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// The device interrupt wakes the I/O vCPU directly.
    Wakeup,
    /// The device interrupt goes to the hog, whose handler holds the queue
    /// lock for `pre_sgi_ns`, sends the waking SGI, holds it `post_sgi_ns` more.
    LockHolder { pre_sgi_ns: u64, post_sgi_ns: u64, wfe: Option<u64> },
    /// The hog writes the SGI register (an empty target list: it wakes
    /// nobody) every `sgi_every_ns` of its run time, showing `evidence`;
    /// the I/O vCPU is woken by its timer on a fixed `wake_every_ns` grid
    /// and runs `submit_ns` each time (`service_ns` is unused).
    SgiFlood { sgi_every_ns: u64, evidence: CritEvidence, wake_every_ns: u64 },
}

#[derive(Clone, Copy, Debug)]
pub struct SimParams {
    pub cfg: SchedConfig,
    pub topology: Topology,
    pub scenario: Scenario,
    pub duration_ns: u64,
    pub service_ns: u64,
    pub submit_ns: u64,
    pub switch_ns: u64,
}

impl SimParams {
    pub fn wakeup(cfg: SchedConfig, topology: Topology) -> Self {
        Self {
            cfg,
            topology,
            scenario: Scenario::Wakeup,
            duration_ns: 10_000_000_000,
            service_ns: 200_000,
            submit_ns: 20_000,
            switch_ns: 5_000,
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct SimResult {
    pub completions: u64,
    pub duration_ns: u64,
    /// I/O vCPU wake → running again, sorted, ns.
    pub wake_to_run_ns: Vec<u64>,
    /// First lock attempt → submitted, sorted, ns.
    pub slat_ns: Vec<u64>,
    /// Run time the scheduler charged (context switches included).
    pub hog_run_ns: u64,
    pub io_run_ns: u64,
    /// Time the vCPU's guest code ran (context switches excluded).
    pub hog_guest_ns: u64,
    pub io_guest_ns: u64,
    /// Times the hog was preempted by a wake.
    pub hog_preempt_wake: u64,
}

impl SimResult {
    pub fn iops(&self) -> f64 {
        if self.duration_ns == 0 {
            return 0.0;
        }
        self.completions as f64 * 1e9 / self.duration_ns as f64
    }
    /// Exact nearest-rank `num/den` quantile of the wake→run latency.
    pub fn wake_to_run(&self, num: u64, den: u64) -> u64 {
        quantile(&self.wake_to_run_ns, num, den)
    }
    pub fn slat(&self, num: u64, den: u64) -> u64 {
        quantile(&self.slat_ns, num, den)
    }
    /// The hog's share of the pCPU, counting its guest progress only.
    pub fn hog_share(&self) -> f64 {
        if self.duration_ns == 0 {
            return 0.0;
        }
        self.hog_guest_ns as f64 / self.duration_ns as f64
    }
    /// Wake-preemptions of the hog per second.
    pub fn hog_preempts_per_s(&self) -> f64 {
        if self.duration_ns == 0 {
            return 0.0;
        }
        self.hog_preempt_wake as f64 * 1e9 / self.duration_ns as f64
    }
}

/// Nearest-rank quantile of sorted samples (0 when empty).
pub fn quantile(sorted: &[u64], num: u64, den: u64) -> u64 {
    if sorted.is_empty() || den == 0 {
        return 0;
    }
    let n = sorted.len() as u64;
    let rank = (n as u128 * num.min(den) as u128).div_ceil(den as u128).max(1) as u64;
    sorted[(rank - 1).min(n - 1) as usize]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HogPhase {
    Spin,
    IrqBeforeSgi,
    IrqAfterSgi,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IoPhase {
    Blocked,
    /// Wants the lock (zero-length: resolved as soon as it runs).
    Acquire,
    /// Waiting for the lock held by a descheduled vCPU.
    SpinOnLock,
    Submit,
}

const INFINITE: u64 = u64::MAX;

struct Engine {
    p: SimParams,
    sched: Scheduler,
    now: u64,
    /// Guest vCPU on each pCPU and when it (re)starts making progress.
    on: Vec<Option<VcpuId>>,
    guest_from: Vec<u64>,
    timer: Vec<Option<u64>>,
    resched: Vec<Option<u64>>,
    device_done: Option<u64>,
    /// Remaining CPU time of the current phase, per vCPU (0 = hog, 1 = io).
    left: [u64; 2],
    /// Guest progress so far, per vCPU.
    guest_ns: [u64; 2],
    hog: HogPhase,
    hog_irq_pending: bool,
    io: IoPhase,
    io_woken_at: Option<u64>,
    slat_from: Option<u64>,
    lock_held_by: Option<VcpuId>,
    res: SimResult,
}

fn ix(v: VcpuId) -> usize {
    v.0 as usize
}

/// The hog's "spin" phase: forever, or until its next SGI write.
fn hog_spin_ns(p: &SimParams) -> u64 {
    match p.scenario {
        Scenario::SgiFlood { sgi_every_ns, .. } => sgi_every_ns.max(1),
        _ => INFINITE,
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Device,
    PhaseEnd(usize),
    Resched(usize),
    Timer(usize),
}

/// Run one case, both vCPUs in Dom0 (weight 256, uncapped).
pub fn run(p: &SimParams) -> Result<SimResult, SchedError> {
    run_in_domains(p, &[(0, DomainParams::default())], [0, 0])
}

/// Run one case in Dom0 with the I/O vCPU's own weight
/// ([`Scheduler::set_vcpu_weight`], `sched_vcpu_weight=1:<w>`).
pub fn run_with_io_weight(p: &SimParams, io_weight: u32) -> Result<SimResult, SchedError> {
    run_full(p, &[(0, DomainParams::default())], [0, 0], Some(io_weight))
}

/// Run one case with the vCPUs in domains: `domains` are registered, the
/// hog goes into `of[0]`, the I/O vCPU into `of[1]`.
pub fn run_in_domains(
    p: &SimParams,
    domains: &[(DomainId, DomainParams)],
    of: [DomainId; 2],
) -> Result<SimResult, SchedError> {
    run_full(p, domains, of, None)
}

fn run_full(
    p: &SimParams,
    domains: &[(DomainId, DomainParams)],
    of: [DomainId; 2],
    io_weight: Option<u32>,
) -> Result<SimResult, SchedError> {
    let nr = match p.topology {
        Topology::OneP2V => 1,
        Topology::TwoP2V => 2,
    };
    let mut sched = Scheduler::new(p.cfg, nr)?;
    let (hog_aff, io_aff) = match p.topology {
        Topology::OneP2V => (Some(0), Some(0)),
        Topology::TwoP2V => (Some(0), Some(1)),
    };
    for &(d, params) in domains {
        sched.add_domain(d, params)?;
    }
    sched.add_vcpu(HOG, of[0], hog_aff)?;
    sched.add_vcpu(IO, of[1], io_aff)?;
    if io_weight.is_some() {
        sched.set_vcpu_weight(0, IO, io_weight)?;
    }
    let mut e = Engine {
        p: *p,
        sched,
        now: 0,
        on: vec![None; nr],
        guest_from: vec![0; nr],
        timer: vec![None; nr],
        resched: vec![None; nr],
        device_done: None,
        left: [hog_spin_ns(p), 0],
        guest_ns: [0, 0],
        hog: HogPhase::Spin,
        hog_irq_pending: false,
        io: IoPhase::Acquire,
        io_woken_at: None,
        slat_from: None,
        lock_held_by: None,
        res: SimResult { duration_ns: p.duration_ns, ..SimResult::default() },
    };
    let a = e.sched.power_on(0, HOG)?;
    e.apply(a);
    let a = e.sched.power_on(0, IO)?;
    e.apply(a);
    e.run_loop()?;
    e.now = e.now.max(p.duration_ns);
    for pc in 0..nr {
        e.progress(pc);
        e.sched.schedule(e.now, pc)?; // burn the runners' time up to the end
    }
    e.res.hog_run_ns = e.sched.stats(HOG).map_or(0, |s| s.counters.run_ns);
    e.res.io_run_ns = e.sched.stats(IO).map_or(0, |s| s.counters.run_ns);
    e.res.hog_preempt_wake = e.sched.stats(HOG).map_or(0, |s| s.counters.preempt_wake);
    e.res.hog_guest_ns = e.guest_ns[ix(HOG)];
    e.res.io_guest_ns = e.guest_ns[ix(IO)];
    e.res.wake_to_run_ns.sort_unstable();
    e.res.slat_ns.sort_unstable();
    Ok(e.res)
}

impl Engine {
    fn apply(&mut self, a: WakeAction) {
        match a {
            WakeAction::None => {}
            WakeAction::Reschedule { pcpu } => {
                let t = self.resched[pcpu].map_or(self.now, |t| t.min(self.now));
                self.resched[pcpu] = Some(t);
            }
            WakeAction::RearmTimer { pcpu, at } => self.timer[pcpu] = Some(at),
        }
    }

    fn next_event(&self) -> Option<(u64, Ev)> {
        let mut best: Option<(u64, Ev)> = None;
        let mut offer = |t: u64, ev: Ev| {
            if best.is_none_or(|b| (t, ev) < b) {
                best = Some((t, ev));
            }
        };
        if let Some(t) = self.device_done {
            offer(t, Ev::Device);
        }
        for pc in 0..self.on.len() {
            if let Some(t) = self.resched[pc] {
                offer(t, Ev::Resched(pc));
            }
            if let Some(t) = self.timer[pc] {
                offer(t, Ev::Timer(pc));
            }
            if let Some(v) = self.on[pc] {
                let l = self.left[ix(v)];
                if l != INFINITE {
                    offer(self.guest_from[pc].max(self.now).saturating_add(l), Ev::PhaseEnd(pc));
                }
            }
        }
        best
    }

    fn run_loop(&mut self) -> Result<(), SchedError> {
        for pc in 0..self.on.len() {
            self.resched[pc] = Some(0);
        }
        let mut steps: u64 = 0;
        while let Some((t, ev)) = self.next_event() {
            if t > self.p.duration_ns {
                break;
            }
            steps += 1;
            if steps > 1_000_000_000 {
                break; // a livelock would be a scheduler bug; stop rather than hang
            }
            self.now = t.max(self.now);
            match ev {
                Ev::Device => self.device(),
                Ev::PhaseEnd(pc) => self.phase_end(pc)?,
                Ev::Resched(pc) | Ev::Timer(pc) => self.schedule(pc)?,
            }
        }
        Ok(())
    }

    /// Account the guest progress of whatever runs on `pc` up to now.
    fn progress(&mut self, pc: usize) {
        if let Some(v) = self.on[pc] {
            if self.now > self.guest_from[pc] {
                let d = self.now - self.guest_from[pc];
                self.guest_ns[ix(v)] += d;
                let l = &mut self.left[ix(v)];
                if *l != INFINITE {
                    *l = l.saturating_sub(d);
                }
                self.guest_from[pc] = self.now;
            }
        }
    }

    fn schedule(&mut self, pc: usize) -> Result<(), SchedError> {
        self.progress(pc);
        let d = self.sched.schedule(self.now, pc)?;
        self.resched[pc] = None;
        self.timer[pc] = d.timer_at;
        for k in d.kick.into_iter().chain(self.sched.take_balance_kicks()) {
            self.apply(WakeAction::Reschedule { pcpu: k });
        }
        if d.next != self.on[pc] {
            self.on[pc] = d.next;
            self.guest_from[pc] = self.now + self.p.switch_ns;
            match d.next {
                Some(IO) => {
                    if let Some(w) = self.io_woken_at.take() {
                        self.res.wake_to_run_ns.push(self.guest_from[pc] - w);
                    }
                    if self.io == IoPhase::SpinOnLock {
                        self.io = IoPhase::Acquire;
                        self.left[ix(IO)] = 0;
                    }
                }
                Some(HOG) if self.hog_irq_pending && self.hog == HogPhase::Spin => {
                    self.start_irq();
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn pcpu_of(&self, v: VcpuId) -> Option<usize> {
        self.on.iter().position(|&x| x == Some(v))
    }

    fn start_irq(&mut self) {
        if let Scenario::LockHolder { pre_sgi_ns, .. } = self.p.scenario {
            self.hog_irq_pending = false;
            self.hog = HogPhase::IrqBeforeSgi;
            self.left[ix(HOG)] = pre_sgi_ns;
            self.lock_held_by = Some(HOG);
        }
    }

    fn wake_io(&mut self, cause: WakeCause) -> Result<(), SchedError> {
        self.io_woken_at = Some(self.now);
        self.io = IoPhase::Acquire;
        self.left[ix(IO)] = 0;
        let a = self.sched.wake(self.now, IO, cause)?;
        self.apply(a);
        Ok(())
    }

    fn device(&mut self) {
        self.device_done = None;
        self.res.completions += 1;
        match self.p.scenario {
            Scenario::Wakeup => {
                if let Some(s) = self.sched.stats_mut(IO) {
                    s.counters.irqs_injected += 1;
                }
                // Errors cannot happen for a registered vCPU; keep going if one did.
                let _ = self.wake_io(WakeCause::Interrupt);
            }
            Scenario::SgiFlood { .. } => {
                let _ = self.wake_io(WakeCause::Timer);
            }
            Scenario::LockHolder { .. } => {
                if let Some(s) = self.sched.stats_mut(HOG) {
                    s.counters.irqs_injected += 1;
                }
                // The hog never blocks, so the kick is a no-op wake; the
                // handler starts when the hog is (or next is) on a pCPU.
                let _ = self.sched.wake(self.now, HOG, WakeCause::Interrupt);
                if let Some(pc) = self.pcpu_of(HOG) {
                    self.progress(pc);
                    if self.hog == HogPhase::Spin {
                        self.start_irq();
                        // Not yet running its guest code (mid-switch)? It starts then.
                        self.guest_from[pc] = self.guest_from[pc].max(self.now);
                    } else {
                        self.hog_irq_pending = true;
                    }
                } else {
                    self.hog_irq_pending = true;
                }
            }
        }
    }

    fn phase_end(&mut self, pc: usize) -> Result<(), SchedError> {
        self.progress(pc);
        let Some(v) = self.on[pc] else { return Ok(()) };
        if self.left[ix(v)] != 0 {
            return Ok(());
        }
        if v == HOG {
            match self.hog {
                HogPhase::IrqBeforeSgi => {
                    // SGI trap inside the IRQ handler (IRQs masked): the EL2
                    // code passes that evidence, then wakes the target.
                    let a = self.sched.note_critical_exit(self.now, pc, CritEvidence::IrqsMasked)?;
                    self.apply(a);
                    self.wake_io(WakeCause::Sgi)?;
                    self.hog = HogPhase::IrqAfterSgi;
                    self.left[ix(HOG)] = match self.p.scenario {
                        Scenario::LockHolder { post_sgi_ns, .. } => post_sgi_ns,
                        _ => 0,
                    };
                }
                HogPhase::IrqAfterSgi => {
                    self.lock_held_by = None;
                    self.hog = HogPhase::Spin;
                    self.left[ix(HOG)] = hog_spin_ns(&self.p);
                    if self.hog_irq_pending {
                        self.start_irq();
                    }
                }
                HogPhase::Spin => {
                    if let Scenario::SgiFlood { evidence, .. } = self.p.scenario {
                        // An SGI write with an empty target list: a trap, no wake.
                        if let Some(s) = self.sched.stats_mut(HOG) {
                            s.counters.sgis_sent += 1;
                        }
                        let a = self.sched.note_critical_exit(self.now, pc, evidence)?;
                        self.apply(a);
                    }
                    self.left[ix(HOG)] = hog_spin_ns(&self.p);
                }
            }
            return Ok(());
        }
        match self.io {
            IoPhase::Acquire => {
                if self.slat_from.is_none() {
                    self.slat_from = Some(self.now);
                }
                if self.lock_held_by.is_none() || self.lock_held_by == Some(IO) {
                    if matches!(self.p.scenario, Scenario::LockHolder { .. }) {
                        self.lock_held_by = Some(IO);
                    }
                    self.io = IoPhase::Submit;
                    self.left[ix(IO)] = self.p.submit_ns;
                } else {
                    self.io = IoPhase::SpinOnLock;
                    self.left[ix(IO)] = match self.p.scenario {
                        Scenario::LockHolder { wfe: Some(period), .. } => period.max(1),
                        _ => INFINITE,
                    };
                }
            }
            IoPhase::SpinOnLock => {
                // WFE trap: directed yield to the holder if it is preempted.
                if let Some(s) = self.sched.stats_mut(IO) {
                    s.counters.wfe_traps += 1;
                }
                let target = self.lock_held_by.filter(|&h| self.sched.is_preempted(h));
                self.sched.yield_to(self.now, pc, target)?;
                self.io = IoPhase::Acquire;
                self.left[ix(IO)] = 0;
                self.schedule(pc)?;
            }
            IoPhase::Submit => {
                if self.lock_held_by == Some(IO) {
                    self.lock_held_by = None;
                }
                if let Some(f) = self.slat_from.take() {
                    self.res.slat_ns.push(self.now - f);
                }
                self.device_done = Some(match self.p.scenario {
                    // The next tick of the I/O vCPU's periodic timer.
                    Scenario::SgiFlood { wake_every_ns, .. } => {
                        let period = wake_every_ns.max(1);
                        (self.now / period + 1) * period
                    }
                    _ => self.now + self.p.service_ns,
                });
                // Wait for the completion: WFI with nothing pending.
                if let Some(s) = self.sched.stats_mut(IO) {
                    s.counters.wfi_traps += 1;
                }
                self.io = IoPhase::Blocked;
                self.left[ix(IO)] = INFINITE;
                self.sched.block(self.now, pc)?;
                self.schedule(pc)?;
            }
            IoPhase::Blocked => {}
        }
        Ok(())
    }
}
