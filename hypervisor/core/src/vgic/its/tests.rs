//! Host tests of the vITS: Linux's probe, the command sequences Linux sends,
//! every bad input the vITS must refuse, and random queues.

use super::tables::{MAX_MAPPED_DEVICES, MAX_MAPPED_EVENTS};
use super::*;
use crate::its::cmd::{opcode, Command};
use crate::testrng::Rng;
use crate::virtio::VecMemory;
use alloc::collections::BTreeMap;
use alloc::vec::Vec;

const RAM: u64 = 0x4000_0000;
const RAM_SIZE: usize = 0x20_0000;
const ITS: u64 = 0x0808_0000;
const QUEUE: u64 = RAM;
const QUEUE_PAGES: u64 = 16;
const PROP: u64 = RAM + 0x10_0000;
const ITT: u64 = RAM + 0x12_0000;
const DEV_TABLE: u64 = RAM + 0x14_0000;

#[derive(Clone, Debug, PartialEq, Eq)]
enum SinkCall {
    Config(u32, u8),
    LoadAll(usize),
    Inject(u32, usize),
    Clear(u32, usize),
    Move(u32, usize, usize),
}

struct FakeSink {
    lpis: Vec<bool>,
    prop: Option<(u64, u32)>,
    calls: Vec<SinkCall>,
    fail: bool,
}

impl FakeSink {
    fn new(vcpus: usize) -> Self {
        FakeSink { lpis: alloc::vec![true; vcpus], prop: Some((PROP, 8192)), calls: Vec::new(), fail: false }
    }
    fn result<T>(&self, t: T) -> Result<T, VgicError> {
        if self.fail {
            Err(VgicError::OutOfRange)
        } else {
            Ok(t)
        }
    }
}

fn kick(v: usize) -> Kicks {
    let mut k = Kicks::none();
    k.add(v);
    k
}

impl LpiSink for FakeSink {
    fn lpis_enabled(&self, vcpu: usize) -> bool {
        self.lpis.get(vcpu).copied().unwrap_or(false)
    }
    fn lpi_prop_table(&self, _vcpu: usize) -> Option<(u64, u32)> {
        self.prop
    }
    fn set_lpi_config(&mut self, intid: IntId, config: u8) -> Result<Kicks, VgicError> {
        self.calls.push(SinkCall::Config(intid.into(), config));
        self.result(Kicks::none())
    }
    fn load_lpi_config(&mut self, mem: &impl GuestMemory, vcpu: usize) -> Result<Kicks, VgicError> {
        assert!(mem.contains(PROP, 1));
        self.calls.push(SinkCall::LoadAll(vcpu));
        self.result(Kicks::none())
    }
    fn inject_lpi(&mut self, intid: IntId, vcpu: usize) -> Result<Kicks, VgicError> {
        self.calls.push(SinkCall::Inject(intid.into(), vcpu));
        self.result(kick(vcpu))
    }
    fn clear_lpi(&mut self, intid: IntId, vcpu: usize) -> Result<(), VgicError> {
        self.calls.push(SinkCall::Clear(intid.into(), vcpu));
        self.result(())
    }
    fn move_lpi(&mut self, intid: IntId, from: usize, to: usize) -> Result<Kicks, VgicError> {
        self.calls.push(SinkCall::Move(intid.into(), from, to));
        self.result(kick(to))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum BeCall {
    MapDevice(u32, u8),
    UnmapDevice(u32),
    MapEvent(u32, u32, u32, Option<usize>),
    UnmapEvent(u32, u32),
    MoveEvent(u32, u32, Option<usize>),
}

#[derive(Default)]
struct FakeBackend {
    calls: Vec<BeCall>,
    refuse: bool,
    /// INV/INVALL/INT/CLEAR as a GICv4 backend hears them: (name, device, event, vCPU).
    hw: Vec<(&'static str, u32, u32, usize)>,
    /// Answer INT as a GICv4 backend does (made pending in hardware).
    direct_int: bool,
}

impl ItsBackend for FakeBackend {
    fn map_device(&mut self, device: u32, event_bits: u8) -> Result<(), BackendError> {
        if self.refuse {
            return Err(BackendError::NoResources);
        }
        self.calls.push(BeCall::MapDevice(device, event_bits));
        Ok(())
    }
    fn unmap_device(&mut self, device: u32) {
        self.calls.push(BeCall::UnmapDevice(device));
    }
    fn map_event(&mut self, device: u32, event: u32, vintid: IntId, vcpu: Option<usize>) -> Result<(), BackendError> {
        if self.refuse {
            return Err(BackendError::NoResources);
        }
        self.calls.push(BeCall::MapEvent(device, event, vintid.into(), vcpu));
        Ok(())
    }
    fn unmap_event(&mut self, device: u32, event: u32) {
        self.calls.push(BeCall::UnmapEvent(device, event));
    }
    fn move_event(&mut self, device: u32, event: u32, vcpu: Option<usize>) {
        self.calls.push(BeCall::MoveEvent(device, event, vcpu));
    }
    fn inv_event(&mut self, device: u32, event: u32, vcpu: usize) {
        self.hw.push(("INV", device, event, vcpu));
    }
    fn invall(&mut self, vcpu: usize) {
        self.hw.push(("INVALL", 0, 0, vcpu));
    }
    fn int_event(&mut self, device: u32, event: u32, vcpu: usize) -> bool {
        self.hw.push(("INT", device, event, vcpu));
        self.direct_int
    }
    fn clear_event(&mut self, device: u32, event: u32, vcpu: usize) {
        self.hw.push(("CLEAR", device, event, vcpu));
    }
}

/// A vITS with guest RAM, a fake vGIC and a recording backend.
struct Rig {
    its: Vits,
    mem: VecMemory,
    sink: FakeSink,
    be: FakeBackend,
    /// Next free byte offset in the queue.
    wr: u64,
    kicks: Kicks,
}

impl Rig {
    fn new(vcpus: usize) -> Self {
        Rig::owning(vcpus, None)
    }

    /// A rig whose VM owns only the DeviceIDs `devices` says.
    fn owning(vcpus: usize, devices: Option<Vec<(u32, u32)>>) -> Self {
        let its = Vits::new(VitsConfig { base: ITS, nr_vcpus: vcpus, msi_vcpu: None, devices }).unwrap();
        Rig {
            its,
            mem: VecMemory::new(RAM, RAM_SIZE),
            sink: FakeSink::new(vcpus),
            be: FakeBackend::default(),
            wr: 0,
            kicks: Kicks::none(),
        }
    }

    /// A rig after Linux's probe: queue set up and the ITS enabled.
    fn enabled(vcpus: usize) -> Self {
        let mut r = Rig::new(vcpus);
        r.write(0x80, 8, QUEUE | (1 << 63) | (QUEUE_PAGES - 1)).unwrap();
        r.write(0x88, 8, 0).unwrap();
        r.write(0, 4, 1).unwrap();
        r
    }

    fn read(&mut self, off: u64, size: u8) -> Result<u64, VgicError> {
        let (v, k) = self.its.mmio_read(ITS + off, size, &self.mem, &mut self.sink, &mut self.be)?;
        self.kicks.merge(k);
        Ok(v)
    }

    fn write(&mut self, off: u64, size: u8, v: u64) -> Result<(), VgicError> {
        let k = self.its.mmio_write(ITS + off, size, v, &self.mem, &mut self.sink, &mut self.be)?;
        self.kicks.merge(k);
        Ok(())
    }

    /// Puts raw commands into the queue (wrapping) without posting them.
    fn put_raw(&mut self, dws: &[[u64; 4]]) {
        let size = QUEUE_PAGES * 0x1000;
        for dw in dws {
            for (i, w) in dw.iter().enumerate() {
                self.mem.write(QUEUE + self.wr + 8 * i as u64, &w.to_le_bytes()).unwrap();
            }
            self.wr = (self.wr + 32) % size;
        }
    }

    /// Queues commands and writes CWRITER.
    fn post_raw(&mut self, dws: &[[u64; 4]]) {
        self.put_raw(dws);
        self.write(0x88, 8, self.wr).unwrap();
    }

    fn post(&mut self, cmds: &[Command]) {
        let dws: Vec<[u64; 4]> = cmds.iter().map(|c| c.encode()).collect();
        self.post_raw(&dws);
    }

    fn creadr(&mut self) -> u64 {
        self.read(0x90, 8).unwrap()
    }

    fn errors(&self, f: CommandFault) -> u64 {
        self.its.counters().error(f)
    }

    /// MAPC per vCPU, MAPD of `device` with 2^(size+1) events.
    fn setup_device(&mut self, device: u32, size: u8) {
        let vcpus = self.its.nr_vcpus();
        let mapc: Vec<Command> =
            (0..vcpus).map(|v| Command::Mapc { icid: v as u16, rdbase: v as u64, valid: true }).collect();
        self.post(&mapc);
        self.post(&[Command::Mapd { device, size, itt_addr: ITT, valid: true }]);
    }
}

fn mapti(device: u32, event: u32, lpi: u32, icid: u16) -> Command {
    Command::Mapti { device, event, pintid: LPI_BASE_U + lpi, icid }
}
const LPI_BASE_U: u32 = crate::its::LPI_BASE;

fn lpi(n: u32) -> IntId {
    IntId::lpi(n).unwrap()
}

#[test]
fn linux_probe_sequence() {
    let mut r = Rig::new(2);
    // its_probe_one: PIDR2 architecture revision, then force quiescent.
    assert_eq!(r.read(0xffe8, 4).unwrap() & 0xf0, 0x30);
    let ctlr = r.read(0, 4).unwrap();
    assert_eq!(ctlr, 1 << 31, "Quiescent and disabled");
    let typer = r.read(0x08, 8).unwrap();
    assert_eq!(typer & 1, 1, "Physical");
    assert_eq!(typer >> 1 & 1, 0, "Virtual");
    assert_eq!(typer >> 19 & 1, 0, "PTA");
    assert_eq!((typer >> 4 & 0xf) + 1, 8, "ITT entry size");
    assert_eq!((typer >> 8 & 0x1f) + 1, 16, "IDbits");
    assert_eq!((typer >> 13 & 0x1f) + 1, 16, "Devbits");
    assert_eq!(typer >> 36 & 1, 1, "CIL");
    assert!((typer >> 32 & 0xf) + 1 >= 4, "at least 16 collections");
    assert_eq!(typer >> 24 & 0xff, 0, "HCC");
    assert_eq!(r.read(0x08, 4).unwrap(), typer & 0xffff_ffff);
    assert_eq!(r.read(0x0c, 4).unwrap(), typer >> 32);
    assert_eq!(r.read(0x04, 4).unwrap() as u32, GITS_IIDR_VALUE);
    // its_alloc_tables: BASER0 = Devices, BASER1 = Collections, others none.
    for i in 0..8u64 {
        let v = r.read(0x100 + 8 * i, 8).unwrap();
        let ty = v >> 56 & 7;
        match i {
            0 => assert_eq!(ty, 1),
            1 => assert_eq!(ty, 4),
            _ => {
                assert_eq!(v, 0);
                continue;
            }
        }
        assert_eq!((v >> 48 & 0x1f) + 1, 8, "entry size");
        // Two-level probe: Indirect does not stick, so Linux uses a flat table.
        r.write(0x100 + 8 * i, 8, v | 1 << 62).unwrap();
        assert_eq!(r.read(0x100 + 8 * i, 8).unwrap() >> 62 & 1, 0);
        // Page size probe: 64K sticks.
        r.write(0x100 + 8 * i, 8, v | 2 << 8).unwrap();
        assert_eq!(r.read(0x100 + 8 * i, 8).unwrap() >> 8 & 3, 2);
        // The final value sticks exactly (RaWaWb, InnerShareable, 64K pages, 8 pages).
        let val = DEV_TABLE | ty << 56 | 7 << 48 | 7 << 59 | 1 << 10 | 2 << 8 | 7 | 1 << 63;
        r.write(0x100 + 8 * i, 8, val).unwrap();
        assert_eq!(r.read(0x100 + 8 * i, 8).unwrap(), val);
    }
    // The command queue: 64 KiB, RaWaWb, InnerShareable, Valid.
    let cbaser = QUEUE | 7 << 59 | 1 << 10 | 15 | 1 << 63;
    r.write(0x80, 8, cbaser).unwrap();
    assert_eq!(r.read(0x80, 8).unwrap(), cbaser);
    r.write(0x88, 8, 0).unwrap();
    let ctlr = r.read(0, 4).unwrap();
    r.write(0, 4, ctlr | 1).unwrap();
    assert_eq!(r.read(0, 4).unwrap(), 1, "Enabled, not Quiescent");
    // its_cpu_init_collection: MAPC, then INVALL, each followed by SYNC; Linux
    // writes CWRITER with 32-bit accesses and polls CREADR.
    for cpu in 0..2u64 {
        let cmds = [
            Command::Mapc { icid: cpu as u16, rdbase: cpu, valid: true },
            Command::Sync { rdbase: cpu },
            Command::Invall { icid: cpu as u16 },
            Command::Sync { rdbase: cpu },
        ];
        r.put_raw(&cmds.map(|c| c.encode()));
        r.write(0x88, 4, r.wr).unwrap();
        assert_eq!(r.read(0x90, 4).unwrap(), r.wr);
    }
    assert_eq!(r.sink.calls, [SinkCall::LoadAll(0), SinkCall::LoadAll(1)]);
    let c = r.its.counters();
    assert_eq!((c.command(opcode::MAPC), c.command(opcode::SYNC), c.command(opcode::INVALL)), (2, 4, 2));
    assert_eq!(c.total_errors(), 0);
    // While enabled, CBASER and BASER are read-only.
    r.write(0x80, 8, 0).unwrap();
    assert_eq!(r.read(0x80, 8).unwrap(), cbaser);
    r.write(0x100, 8, 0).unwrap();
    assert_ne!(r.read(0x100, 8).unwrap() & (1 << 63), 0);
}

/// Every implemented GITS_BASER resets to 64 KiB pages (what KVM and QEMU
/// present); the sizes the guest may write (4K, 16K, 64K) all stick, and
/// Linux's flow (its_setup_baser: write its value, read it back, keep it
/// when it sticks) ends with exactly the value written.
#[test]
fn baser_page_size_resets_to_64k_and_accepts_every_size() {
    let mut r = Rig::new(2);
    for (i, ty) in [(0u64, 1u64), (1, 4)] {
        let off = 0x100 + 8 * i;
        let reset = r.read(off, 8).unwrap();
        assert_eq!(reset >> 8 & 3, 2, "BASER{i} resets to 64K pages: {reset:#x}");
        assert_eq!(reset, ty << 56 | 7 << 48 | 2 << 8, "BASER{i} reset value");
        assert_eq!(r.read(off, 4).unwrap(), reset & 0xffff_ffff);
        for psz in [0u64, 1, 2] {
            let val = DEV_TABLE | ty << 56 | 7 << 48 | 7 << 59 | 1 << 10 | psz << 8 | 1 | 1 << 63;
            r.write(off, 8, val).unwrap();
            assert_eq!(r.read(off, 8).unwrap(), val, "BASER{i} page size {psz}");
        }
        // Linux starts from the value it read and keeps the page size when it sticks.
        let val = (reset & !0xff) | DEV_TABLE | 7 << 59 | 1 << 10 | 3 | 1 << 63;
        r.write(off, 8, val).unwrap();
        assert_eq!(r.read(off, 8).unwrap(), val);
        assert_eq!(r.read(off, 8).unwrap() >> 8 & 3, 2);
    }
    assert_eq!(r.errors(CommandFault::TableOutsideRam), 0);
}

#[test]
fn access_sizes() {
    let mut r = Rig::new(1);
    assert_eq!(r.read(0, 8), Err(VgicError::BadAccessSize));
    assert_eq!(r.read(0, 2), Err(VgicError::BadAccessSize));
    assert_eq!(r.read(0x08, 1), Err(VgicError::BadAccessSize));
    assert_eq!(r.read(0x0a, 4), Err(VgicError::BadAccessSize));
    assert_eq!(r.read(0x0c, 8), Err(VgicError::BadAccessSize));
    assert_eq!(r.write(0, 8, 1), Err(VgicError::BadAccessSize));
    assert!(!r.its.enabled());
    assert_eq!(r.write(0x88, 2, 0), Err(VgicError::BadAccessSize));
    assert_eq!(r.its.mmio_read(ITS + 0x1_0040, 4, &r.mem, &mut r.sink, &mut r.be), Err(VgicError::OutOfRange));
    assert_eq!(r.its.mmio_read(ITS - 4, 4, &r.mem, &mut r.sink, &mut r.be), Err(VgicError::OutOfRange));
    // Reserved offsets read as zero.
    assert_eq!(r.read(0x200, 4), Ok(0));
    assert_eq!(r.read(0x18, 8), Ok(0));
    // 32-bit halves of a 64-bit register.
    r.write(0x80, 4, 0x4000_000f).unwrap();
    r.write(0x84, 4, 0x8000_0000).unwrap();
    assert_eq!(r.read(0x80, 8).unwrap(), 0x8000_0000_4000_000f);
}

#[test]
fn linux_sequence_injects_on_the_right_vcpu() {
    let mut r = Rig::enabled(2);
    r.setup_device(0x10, 1);
    r.post(&[
        mapti(0x10, 0, 0, 0),
        mapti(0x10, 1, 1, 1),
        Command::Sync { rdbase: 1 },
        Command::Inv { device: 0x10, event: 1 },
        Command::Sync { rdbase: 1 },
    ]);
    assert_eq!(r.be.calls[0], BeCall::MapDevice(0x10, 2));
    assert_eq!(r.be.calls[1..], [BeCall::MapEvent(0x10, 0, 8192, Some(0)), BeCall::MapEvent(0x10, 1, 8193, Some(1))]);
    // INV read the configuration byte of LPI 8193 from the guest's table.
    r.mem.write(PROP + 1, &[0xa3]).unwrap();
    r.post(&[Command::Inv { device: 0x10, event: 1 }]);
    assert_eq!(r.sink.calls.last(), Some(&SinkCall::Config(8193, 0xa3)));
    r.kicks = Kicks::none();
    r.post(&[Command::Int { device: 0x10, event: 1 }, Command::Sync { rdbase: 1 }]);
    assert_eq!(r.sink.calls.last(), Some(&SinkCall::Inject(8193, 1)));
    assert!(r.kicks.contains(1) && !r.kicks.contains(0));
    assert_eq!(r.its.counters().int_lpis, 1);
    assert_eq!(r.its.translate(0x10, 1), Some((lpi(1), 1)));
    assert_eq!(r.its.translate(0x10, 0), Some((lpi(0), 0)));
    assert_eq!(r.its.translate(0x10, 2), None);
    assert_eq!(r.its.translate(0x11, 0), None);
    let m: Vec<Mapping> = r.its.mappings().collect();
    assert_eq!(m.len(), 2);
    assert_eq!(m[1], Mapping { device: 0x10, event: 1, intid: lpi(1), icid: 1, vcpu: Some(1) });
    r.post(&[Command::Clear { device: 0x10, event: 1 }]);
    assert_eq!(r.sink.calls.last(), Some(&SinkCall::Clear(8193, 1)));
    // MAPI: the LPI is the EventID... which must be an LPI.
    r.post(&[Command::Mapi { device: 0x10, event: 2, icid: 0 }]);
    assert_eq!(r.errors(CommandFault::LpiOutOfRange), 1);
    assert_eq!(r.its.counters().total_errors(), 1);
    // Disabling the ITS stops translation, keeps the mappings.
    r.write(0, 4, 0).unwrap();
    assert_eq!(r.its.translate(0x10, 1), None);
    r.write(0, 4, 1).unwrap();
    assert_eq!(r.its.translate(0x10, 1), Some((lpi(1), 1)));
}

#[test]
fn dom0_msi_vcpu_steers_every_mapped_collection() {
    let its = Vits::new(VitsConfig { base: ITS, nr_vcpus: 2, msi_vcpu: Some(0), devices: None }).unwrap();
    let mut r = Rig { its, ..Rig::new(2) };
    r.write(0x80, 8, QUEUE | (1 << 63) | (QUEUE_PAGES - 1)).unwrap();
    r.write(0x88, 8, 0).unwrap();
    r.write(0, 4, 1).unwrap();
    r.setup_device(0x10, 1);
    // The guest aims event 1 at vCPU1: it is delivered to vCPU0.
    r.post(&[mapti(0x10, 0, 0, 0), mapti(0x10, 1, 1, 1)]);
    assert_eq!(r.be.calls[1..], [BeCall::MapEvent(0x10, 0, 8192, Some(0)), BeCall::MapEvent(0x10, 1, 8193, Some(0))]);
    assert_eq!(r.its.translate(0x10, 1), Some((lpi(1), 0)));
    r.kicks = Kicks::none();
    r.post(&[Command::Int { device: 0x10, event: 1 }]);
    assert_eq!(r.sink.calls.last(), Some(&SinkCall::Inject(8193, 0)));
    assert!(r.kicks.contains(0) && !r.kicks.contains(1));
    // MOVI, MAPC and MOVALL keep everything on vCPU0; unmapping still unmaps.
    let n = r.sink.calls.len();
    r.post(&[Command::Movi { device: 0x10, event: 0, icid: 1 }, Command::Movall { from: 0, to: 1 }]);
    assert_eq!(r.sink.calls.len(), n, "no pending state moves");
    assert_eq!(r.be.calls.last(), Some(&BeCall::MoveEvent(0x10, 0, Some(0))));
    r.post(&[Command::Mapc { icid: 1, rdbase: 1, valid: true }]);
    assert_eq!(r.be.calls.last(), Some(&BeCall::MoveEvent(0x10, 1, Some(0))));
    r.post(&[Command::Mapc { icid: 1, rdbase: 0, valid: false }]);
    assert_eq!(r.its.translate(0x10, 1), None);
    assert_eq!(r.its.counters().total_errors(), 0);
    // A vCPU the VM does not have is refused at creation.
    assert!(Vits::new(VitsConfig { base: ITS, nr_vcpus: 2, msi_vcpu: Some(2), devices: None }).is_err());
}

#[test]
fn movi_and_movall_move_pending_state() {
    let mut r = Rig::enabled(2);
    r.setup_device(7, 2);
    r.post(&[mapti(7, 3, 5, 0), mapti(7, 4, 6, 0)]);
    r.kicks = Kicks::none();
    r.post(&[Command::Movi { device: 7, event: 3, icid: 1 }]);
    assert_eq!(r.sink.calls.last(), Some(&SinkCall::Move(8197, 0, 1)));
    assert_eq!(r.be.calls.last(), Some(&BeCall::MoveEvent(7, 3, Some(1))));
    assert!(r.kicks.contains(1));
    assert_eq!(r.its.translate(7, 3), Some((lpi(5), 1)));
    // MOVI to the same vCPU moves no pending state.
    let n = r.sink.calls.len();
    r.post(&[Command::Movi { device: 7, event: 3, icid: 1 }]);
    assert_eq!(r.sink.calls.len(), n);
    // MOVI to an unmapped collection is refused.
    r.post(&[Command::Movi { device: 7, event: 3, icid: 5 }]);
    assert_eq!(r.errors(CommandFault::CollectionUnmapped), 1);
    assert_eq!(r.its.translate(7, 3), Some((lpi(5), 1)));
    // MOVALL 0 -> 1: every LPI this ITS maps is asked to move.
    r.sink.calls.clear();
    r.post(&[Command::Movall { from: 0, to: 1 }]);
    assert_eq!(r.sink.calls, [SinkCall::Move(8197, 0, 1), SinkCall::Move(8198, 0, 1)]);
    r.post(&[Command::Movall { from: 0, to: 2 }]);
    assert_eq!(r.errors(CommandFault::RdbaseOutOfRange), 1);
    // MAPC remapping a collection tells the backend about its events.
    r.be.calls.clear();
    r.post(&[Command::Mapc { icid: 0, rdbase: 1, valid: true }]);
    assert_eq!(r.be.calls, [BeCall::MoveEvent(7, 4, Some(1))]);
    assert_eq!(r.its.translate(7, 4), Some((lpi(6), 1)));
    r.post(&[Command::Mapc { icid: 0, rdbase: 0, valid: false }]);
    assert_eq!(r.be.calls.last(), Some(&BeCall::MoveEvent(7, 4, None)));
    assert_eq!(r.its.translate(7, 4), None);
    r.post(&[Command::Int { device: 7, event: 4 }]);
    assert_eq!(r.errors(CommandFault::CollectionUnmapped), 2);
}

#[test]
fn inv_invall_int_clear_reach_a_gicv4_backend_and_a_hardware_int_is_not_injected_twice() {
    let mut r = Rig::enabled(2);
    r.setup_device(1, 2);
    r.post(&[mapti(1, 0, 0, 1)]);
    r.post(&[
        Command::Inv { device: 1, event: 0 },
        Command::Invall { icid: 1 },
        Command::Clear { device: 1, event: 0 },
    ]);
    assert_eq!(r.be.hw, [("INV", 1, 0, 1), ("INVALL", 0, 0, 1), ("CLEAR", 1, 0, 1)]);
    // The emulated backend answers INT with false: the vGIC injects it.
    r.be.hw.clear();
    r.post(&[Command::Int { device: 1, event: 0 }]);
    assert_eq!(r.sink.calls.last(), Some(&SinkCall::Inject(8192, 1)));
    // A GICv4 backend made the vLPI pending in hardware: no list-register copy.
    r.be.direct_int = true;
    r.sink.calls.clear();
    r.post(&[Command::Int { device: 1, event: 0 }]);
    assert!(!r.sink.calls.iter().any(|c| matches!(c, SinkCall::Inject(..))));
    assert_eq!(r.be.hw, [("INT", 1, 0, 1), ("INT", 1, 0, 1)]);
    assert_eq!(r.its.counters().int_lpis, 2);
    // Commands on unmapped events never reach the backend.
    r.be.hw.clear();
    r.post(&[Command::Inv { device: 1, event: 1 }, Command::Int { device: 7, event: 0 }]);
    assert!(r.be.hw.is_empty());
}

#[test]
fn discard_and_mapd_unmap_tell_the_backend() {
    let mut r = Rig::enabled(1);
    r.setup_device(1, 3);
    r.post(&[mapti(1, 0, 0, 0), mapti(1, 1, 1, 0), mapti(1, 2, 2, 0)]);
    assert_eq!(r.its.tables().nr_events(), 3);
    r.be.calls.clear();
    r.post(&[Command::Discard { device: 1, event: 1 }]);
    assert_eq!(r.sink.calls.last(), Some(&SinkCall::Clear(8193, 0)));
    assert_eq!(r.be.calls, [BeCall::UnmapEvent(1, 1)]);
    assert_eq!(r.its.translate(1, 1), None);
    // The event can be mapped again after DISCARD.
    r.post(&[mapti(1, 1, 9, 0)]);
    assert_eq!(r.its.translate(1, 1), Some((lpi(9), 0)));
    r.be.calls.clear();
    r.post(&[Command::Mapd { device: 1, size: 0, itt_addr: 0, valid: false }]);
    assert_eq!(
        r.be.calls,
        [BeCall::UnmapEvent(1, 0), BeCall::UnmapEvent(1, 1), BeCall::UnmapEvent(1, 2), BeCall::UnmapDevice(1)]
    );
    assert_eq!(r.its.tables().nr_events(), 0);
    assert_eq!(r.its.tables().nr_devices(), 0);
    assert_eq!(r.its.translate(1, 0), None);
    // Unmapping an unmapped device is harmless; DISCARD of it is an error.
    r.post(&[Command::Mapd { device: 1, size: 0, itt_addr: 0, valid: false }]);
    r.post(&[Command::Discard { device: 1, event: 0 }]);
    assert_eq!(r.errors(CommandFault::DeviceUnmapped), 1);
    assert_eq!(r.its.counters().total_errors(), 1);
    // MAPD over a mapped device replaces its ITT and drops its events.
    r.setup_device(2, 1);
    r.post(&[mapti(2, 0, 0, 0)]);
    r.be.calls.clear();
    r.post(&[Command::Mapd { device: 2, size: 4, itt_addr: ITT, valid: true }]);
    assert_eq!(r.be.calls, [BeCall::UnmapEvent(2, 0), BeCall::UnmapDevice(2), BeCall::MapDevice(2, 5)]);
    assert_eq!(r.its.translate(2, 0), None);
}

/// A VM maps only DeviceIDs of its own devices: a MAPD of another is
/// refused and counted, never reaches the physical ITS, and the queue
/// goes on; the VM's own device maps as usual.
#[test]
fn mapd_of_a_device_the_vm_does_not_own_is_refused() {
    let mut r = Rig::owning(2, Some(vec![(0x8, 1), (0x100, 0x100)]));
    r.write(0x80, 8, QUEUE | (1 << 63) | (QUEUE_PAGES - 1)).unwrap();
    r.write(0x88, 8, 0).unwrap();
    r.write(0, 4, 1).unwrap();
    for device in [0x7, 0x9, 0xff, 0x200, 0xffff] {
        let before = r.errors(CommandFault::DeviceNotOwned);
        r.post(&[Command::Mapd { device, size: 1, itt_addr: ITT, valid: true }]);
        assert_eq!(r.errors(CommandFault::DeviceNotOwned), before + 1, "device {device:#x}");
        assert!(!r.its.stalled());
    }
    assert!(r.be.calls.is_empty(), "the backend saw {:?}", r.be.calls);
    for device in [0x8, 0x100, 0x1ff] {
        r.post(&[Command::Mapd { device, size: 1, itt_addr: ITT, valid: true }]);
    }
    assert_eq!(r.be.calls, [BeCall::MapDevice(0x8, 2), BeCall::MapDevice(0x100, 2), BeCall::MapDevice(0x1ff, 2)]);
    assert_eq!(r.its.counters().total_errors(), 5);
}

#[test]
fn bad_ids_are_ignored_and_counted() {
    let mut r = Rig::enabled(2);
    r.setup_device(3, 1); // 4 events
    let snapshot = r.mem.bytes.clone();
    let cases: [(Command, CommandFault); 14] = [
        (Command::Mapd { device: 1 << 16, size: 1, itt_addr: ITT, valid: true }, CommandFault::DeviceOutOfRange),
        (Command::Mapd { device: 4, size: 16, itt_addr: ITT, valid: true }, CommandFault::IttSize),
        (Command::Mapd { device: 4, size: 31, itt_addr: ITT, valid: true }, CommandFault::IttSize),
        (Command::Mapd { device: 4, size: 1, itt_addr: 0x1000, valid: true }, CommandFault::IttOutsideRam),
        (
            Command::Mapd { device: 4, size: 15, itt_addr: RAM + RAM_SIZE as u64 - 0x100, valid: true },
            CommandFault::IttOutsideRam,
        ),
        (mapti(4, 0, 0, 0), CommandFault::DeviceUnmapped),
        (mapti(1 << 20, 0, 0, 0), CommandFault::DeviceOutOfRange),
        (mapti(3, 4, 0, 0), CommandFault::EventOutOfRange),
        (mapti(3, 0, 0, 16), CommandFault::IcidOutOfRange),
        (Command::Mapti { device: 3, event: 0, pintid: 8191, icid: 0 }, CommandFault::LpiOutOfRange),
        (Command::Mapti { device: 3, event: 0, pintid: 1 << 14, icid: 0 }, CommandFault::LpiOutOfRange),
        (Command::Mapc { icid: 0, rdbase: 2, valid: true }, CommandFault::RdbaseOutOfRange),
        (Command::Invall { icid: 9 }, CommandFault::CollectionUnmapped),
        (Command::Int { device: 3, event: 0 }, CommandFault::EventUnmapped),
    ];
    for (i, (cmd, fault)) in cases.iter().enumerate() {
        let before = r.errors(*fault);
        let creadr = r.creadr();
        r.post(&[*cmd]);
        assert_eq!(r.errors(*fault), before + 1, "case {i}: {cmd:?}");
        assert_eq!(r.creadr(), creadr + 32, "case {i}: CREADR advanced past the refused command");
        assert!(!r.its.stalled());
    }
    assert_eq!(r.its.counters().total_errors(), cases.len() as u64);
    assert_eq!(r.its.tables().nr_events(), 0);
    // The MAPC with a bad RDbase did not change collection 0.
    r.post(&[mapti(3, 0, 0, 0)]);
    assert_eq!(r.its.translate(3, 0), Some((lpi(0), 0)));
    // Remapping a mapped event is refused and keeps the first mapping.
    r.post(&[mapti(3, 0, 7, 1)]);
    assert_eq!(r.errors(CommandFault::EventMapped), 1);
    assert_eq!(r.its.translate(3, 0), Some((lpi(0), 0)));
    // GICv4 commands on this GICv3 ITS.
    r.post(&[Command::Vmapp { vpe: 0, rdbase: 0, vpt_addr: 0, vpt_size: 0, valid: true }]);
    r.post(&[Command::Vsync { vpe: 0 }]);
    assert_eq!(r.errors(CommandFault::Virtual), 2);
    // Backend and vGIC refusals.
    r.be.refuse = true;
    r.post(&[mapti(3, 1, 1, 0), Command::Mapd { device: 9, size: 1, itt_addr: ITT, valid: true }]);
    assert_eq!(r.errors(CommandFault::Backend), 2);
    assert_eq!(r.its.translate(3, 1), None);
    assert!(r.its.tables().device(9).is_err());
    r.be.refuse = false;
    r.sink.fail = true;
    r.post(&[Command::Int { device: 3, event: 0 }]);
    assert_eq!(r.errors(CommandFault::Vgic), 1);
    assert_eq!(r.its.counters().int_lpis, 0);
    r.sink.fail = false;
    // The queue is the only memory that changed: commands never write.
    r.mem.bytes[..(QUEUE_PAGES * 0x1000) as usize].copy_from_slice(&snapshot[..(QUEUE_PAGES * 0x1000) as usize]);
    assert!(r.mem.bytes == snapshot);
}

#[test]
fn unknown_commands_are_skipped_and_reserved_bits_ignored() {
    let mut r = Rig::enabled(1);
    let mut sync = Command::Sync { rdbase: 0 }.encode();
    sync[3] = 1;
    r.post_raw(&[sync, [0x02, 0, 0, 0], [0xff, 0, 0, 0], [0; 4]]);
    assert_eq!(r.errors(CommandFault::UnknownCommand), 3);
    assert_eq!(r.its.counters().total_errors(), 3);
    assert_eq!((r.its.counters().command(opcode::SYNC), r.its.counters().reserved_ignored), (1, 1));
    assert_eq!(r.creadr(), 4 * 32);
    // MAPD with ITT address bits [7:0] set: RES0 (the ITT is 256-byte
    // aligned), so the ITT is at the aligned address.
    let mut mapd = Command::Mapd { device: 0, size: 1, itt_addr: ITT, valid: true }.encode();
    mapd[2] |= 0x80;
    r.post_raw(&[mapd]);
    assert_eq!(r.its.counters().reserved_ignored, 2);
    assert_eq!(r.its.tables().nr_devices(), 1);
    assert_eq!(r.its.counters().total_errors(), 3);
}

/// A guest that reuses queue slots without clearing them: 5000 INTs through
/// the 64 KiB queue (2048 slots, so it wraps twice), each slot written over
/// stale bytes that leave every RES0 bit set. Every INT is carried out (the
/// fields it uses are decoded, the rest ignored) and counted.
#[test]
fn stale_reserved_bits_in_reused_slots_are_ignored_and_counted() {
    const N: usize = 5000;
    let mut r = Rig::enabled(1);
    r.setup_device(7, 15);
    r.post(&[mapti(7, 3, 42, 0)]);
    let slots = QUEUE_PAGES * 0x1000 / 32;
    assert!(N as u64 > 2 * slots);
    // Whatever the queue held before: all ones.
    let queue = (QUEUE - RAM) as usize..(QUEUE - RAM + QUEUE_PAGES * 0x1000) as usize;
    r.mem.bytes[queue].fill(0xff);
    let used = crate::its::cmd::used_bits(opcode::INT).unwrap();
    r.sink.calls.clear();
    let mut sent = 0;
    while sent < N {
        let batch = (N - sent).min(300);
        let mut dws = Vec::new();
        for _ in 0..batch {
            let at = QUEUE + (r.wr + 32 * dws.len() as u64) % (QUEUE_PAGES * 0x1000);
            let mut stale = [0u64; 4];
            for (i, w) in stale.iter_mut().enumerate() {
                let mut b = [0u8; 8];
                r.mem.read(at + 8 * i as u64, &mut b).unwrap();
                *w = u64::from_le_bytes(b);
            }
            let int = Command::Int { device: 7, event: 3 }.encode();
            let mut dw = [0u64; 4];
            for i in 0..4 {
                dw[i] = (stale[i] & !used[i]) | int[i];
            }
            assert_ne!(dw, int, "the slot's RES0 bits are set");
            dws.push(dw);
        }
        r.post_raw(&dws);
        assert_eq!(r.creadr(), r.wr, "the queue drained");
        sent += batch;
    }
    let injected = r.sink.calls.iter().filter(|c| **c == SinkCall::Inject(LPI_BASE_U + 42, 0)).count();
    assert_eq!(injected, N, "every INT delivered");
    let c = r.its.counters();
    assert_eq!((c.int_lpis, c.command(opcode::INT)), (N as u64, N as u64));
    assert_eq!(c.total_errors(), 0);
    assert_eq!(c.reserved_ignored, N as u64);
    let text = alloc::format!("{c}");
    assert!(text.contains(&alloc::format!(" reserved_ignored={N}\n")), "{text}");
}

#[test]
fn inv_reads_only_inside_the_prop_table() {
    let mut r = Rig::enabled(1);
    r.setup_device(0, 15);
    r.post(&[mapti(0, 0, 100, 0)]);
    r.sink.prop = Some((PROP, 64));
    r.post(&[Command::Inv { device: 0, event: 0 }]);
    assert_eq!(r.errors(CommandFault::LpiBeyondPropTable), 1);
    r.sink.prop = Some((RAM + RAM_SIZE as u64 - 50, 8192));
    r.post(&[Command::Inv { device: 0, event: 0 }]);
    assert_eq!(r.errors(CommandFault::PropTableUnreadable), 1);
    r.sink.prop = Some((u64::MAX - 10, 8192));
    r.post(&[Command::Inv { device: 0, event: 0 }]);
    assert_eq!(r.errors(CommandFault::PropTableUnreadable), 2);
    // LPIs disabled on the redistributor: INV and INVALL have nothing to do.
    r.sink.lpis[0] = false;
    r.sink.calls.clear();
    r.post(&[Command::Inv { device: 0, event: 0 }, Command::Invall { icid: 0 }]);
    assert!(r.sink.calls.is_empty());
    assert_eq!(r.its.counters().total_errors(), 3);
}

#[test]
fn commands_wait_until_the_its_is_enabled() {
    let mut r = Rig::new(1);
    r.write(0x80, 8, QUEUE | (1 << 63) | (QUEUE_PAGES - 1)).unwrap();
    r.post(&[Command::Mapc { icid: 0, rdbase: 0, valid: true }, Command::Sync { rdbase: 0 }]);
    assert_eq!(r.creadr(), 0, "nothing runs while disabled");
    assert_eq!(r.its.counters().command(opcode::MAPC), 0);
    r.write(0, 4, 1).unwrap();
    assert_eq!(r.creadr(), 64);
    assert_eq!(r.its.counters().command(opcode::MAPC), 1);
    assert_eq!(r.its.counters().total_errors(), 0);
}

#[test]
fn queue_errors_stall() {
    // CBASER not Valid.
    let mut r = Rig::new(1);
    r.write(0x80, 8, QUEUE | (QUEUE_PAGES - 1)).unwrap();
    r.write(0, 4, 1).unwrap();
    r.post(&[Command::Sync { rdbase: 0 }]);
    assert!(r.its.stalled());
    assert_eq!(r.creadr(), 1, "Stalled, offset 0");
    assert_eq!(r.errors(CommandFault::QueueInvalid), 1);

    // CBASER outside guest RAM (and rewriting CBASER while enabled is ignored).
    let mut r = Rig::new(1);
    r.write(0x80, 8, 0x1000 | (1 << 63)).unwrap();
    r.write(0, 4, 1).unwrap();
    r.write(0x88, 8, 32).unwrap();
    assert!(r.its.stalled());
    assert_eq!(r.errors(CommandFault::QueueOutsideRam), 1);
    // Straddling the end of RAM.
    let mut r = Rig::new(1);
    r.write(0x80, 8, (RAM + RAM_SIZE as u64 - 0x1000) | (1 << 63) | 1).unwrap();
    r.write(0, 4, 1).unwrap();
    r.write(0x88, 8, 32).unwrap();
    assert_eq!(r.errors(CommandFault::QueueOutsideRam), 1);

    // CWRITER beyond the queue; RES0 bits of CWRITER and CBASER are dropped.
    let mut r = Rig::enabled(1);
    r.write(0x88, 8, QUEUE_PAGES * 0x1000).unwrap();
    assert!(r.its.stalled());
    assert_eq!(r.errors(CommandFault::CwriterOutOfRange), 1);
    // Stalled: further CWRITER writes do nothing until Retry.
    r.post(&[Command::Mapc { icid: 0, rdbase: 0, valid: true }]);
    assert_eq!(r.creadr(), 1);
    assert_eq!(r.its.counters().command(opcode::MAPC), 0);
    r.write(0x88, 8, 32 | 0x1e).unwrap();
    assert_eq!(r.read(0x88, 8).unwrap(), 32, "RES0 bits [4:1] read as zero");
    assert!(r.its.stalled());
    r.write(0x88, 8, 32 | 1).unwrap(); // Retry
    assert!(!r.its.stalled());
    assert_eq!(r.creadr(), 32);
    assert_eq!(r.its.counters().command(opcode::MAPC), 1);
    assert_eq!(r.its.counters().stalls, 1);
    // A stall also ends when the guest disables the ITS and rewrites CBASER,
    // which resets CREADR to 0.
    r.write(0x88, 8, QUEUE_PAGES * 0x1000 + 32).unwrap();
    assert!(r.its.stalled());
    r.write(0, 4, 0).unwrap();
    assert_eq!(r.read(0, 4).unwrap(), 1 << 31, "disabled and quiescent");
    r.write(0x80, 8, QUEUE | (1 << 63) | (QUEUE_PAGES - 1)).unwrap();
    assert_eq!(r.creadr(), 0);
    r.wr = 0;
    r.post(&[Command::Mapc { icid: 2, rdbase: 0, valid: true }]);
    assert_eq!(r.creadr(), 0, "disabled: waits");
    r.write(0, 4, 1).unwrap();
    assert_eq!(r.creadr(), 32);
    assert_eq!(r.its.counters().command(opcode::MAPC), 2);
    // Unaligned CBASER bits cannot be set: bits [9:8] and [52] are RES0.
    let mut r = Rig::new(1);
    r.write(0x80, 8, QUEUE | 0x300 | (1 << 52) | (1 << 63)).unwrap();
    assert_eq!(r.read(0x80, 8).unwrap(), QUEUE | (1 << 63));
}

#[test]
fn queue_wraps_and_a_call_is_bounded() {
    let mut r = Rig::enabled(1);
    let size = QUEUE_PAGES * 0x1000;
    // Fill up to 2 commands before the end, then post 4 commands that wrap.
    let n = size / 32 - 2;
    let syncs: Vec<Command> = (0..n).map(|_| Command::Sync { rdbase: 0 }).collect();
    r.post(&syncs);
    assert_eq!(r.creadr(), size - 64);
    r.post(&[
        Command::Mapc { icid: 0, rdbase: 0, valid: true },
        Command::Sync { rdbase: 0 },
        Command::Mapc { icid: 1, rdbase: 0, valid: true },
        Command::Sync { rdbase: 0 },
    ]);
    assert_eq!(r.creadr(), 64);
    assert_eq!(r.its.counters().command(opcode::MAPC), 2);
    assert_eq!(r.its.counters().total_errors(), 0);
}

#[test]
fn table_outside_ram_is_counted_and_kept() {
    let mut r = Rig::new(1);
    let v = 1 << 56 | 7 << 48 | 0x1000 | 1 << 63;
    r.write(0x100, 8, v).unwrap();
    assert_eq!(r.read(0x100, 8).unwrap(), v);
    assert_eq!(r.errors(CommandFault::TableOutsideRam), 1);
    // 64 KiB pages: PA[51:48] in bits [15:12].
    assert_eq!(baser_table(RAM | 0x1000 | 2 << 8 | 1), (RAM | 1 << 48, 0x2_0000));
    // Reserved page size encoding reads back as 64K; Type/Entry_Size are read-only.
    r.write(0x108, 8, 3 << 8 | 0x1f << 48 | 7 << 56).unwrap();
    let b1 = r.read(0x108, 8).unwrap();
    assert_eq!((b1 >> 8 & 3, b1 >> 48 & 0x1f, b1 >> 56 & 7), (2, 7, 4));
}

#[test]
fn capacity_is_bounded() {
    let mut r = Rig::enabled(1);
    r.post(&[Command::Mapc { icid: 0, rdbase: 0, valid: true }]);
    let devs: Vec<Command> = (0..MAX_MAPPED_DEVICES as u32 + 1)
        .map(|d| Command::Mapd { device: d, size: 3, itt_addr: ITT, valid: true })
        .collect();
    for chunk in devs.chunks(256) {
        r.post(chunk);
    }
    assert_eq!(r.its.tables().nr_devices(), MAX_MAPPED_DEVICES);
    assert_eq!(r.errors(CommandFault::TooManyDevices), 1);
    // Events: 16 per device, until past MAX_MAPPED_EVENTS in total.
    for d in 0..(MAX_MAPPED_EVENTS / 16 + 1) as u32 {
        let cmds: Vec<Command> = (0..16).map(|e| mapti(d, e, (d * 16 + e) % 8192, 0)).collect();
        r.post(&cmds);
    }
    assert_eq!(r.its.tables().nr_events(), MAX_MAPPED_EVENTS);
    assert_eq!(r.errors(CommandFault::TooManyEvents), 16);
}

#[test]
fn counters_text_is_stable_and_ignored_by_the_stats_parser() {
    let mut r = Rig::enabled(1);
    r.setup_device(0, 0);
    r.post(&[mapti(0, 0, 0, 0), Command::Int { device: 0, event: 0 }]);
    let text = alloc::format!("{}", r.its.counters());
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(lines[0].starts_with("its: MAPD=1 MAPC=1 MAPTI=1 MAPI=0 MOVI=0 INT=1 CLEAR=0 DISCARD=0 INV=0 INVALL=0"));
    assert!(lines[0].ends_with(" int_lpis=1 stalls=0 errors=0 reserved_ignored=0"));
    assert!(lines[1].starts_with("its.errors: unknown_command=0 virtual=0"));
    assert_eq!(lines[1].matches('=').count(), CommandFault::COUNT);
    let parsed = crate::stats::parse_text(&text).unwrap();
    assert!(parsed.is_empty());
}

#[test]
fn work_per_access_is_bounded_and_creadr_reads_resume() {
    let mut r = Rig::enabled(2);
    r.post(&[Command::Mapc { icid: 0, rdbase: 0, valid: true }]);
    let devs: Vec<Command> =
        (0..512).map(|d| Command::Mapd { device: d, size: 3, itt_addr: ITT, valid: true }).collect();
    r.post(&devs);
    for d in 0..512 {
        let cmds: Vec<Command> = (0..16).map(|e| mapti(d, e, (d * 16 + e) % 8192, 0)).collect();
        r.post(&cmds);
    }
    assert_eq!(r.its.tables().nr_events(), MAX_MAPPED_EVENTS);
    let start = r.creadr();
    // Each MAPC visits every event: WORK_BUDGET / 8193 rounded up = 8 per access.
    let mapcs: Vec<Command> = (0..20).map(|i| Command::Mapc { icid: 0, rdbase: i % 2, valid: true }).collect();
    r.post(&mapcs);
    let per_access = WORK_BUDGET.div_ceil(1 + MAX_MAPPED_EVENTS as u64);
    assert_eq!(r.its.counters().command(opcode::MAPC), 1 + per_access);
    // Linux's polling of CREADR finishes the rest, a budget per read.
    let mut reads = 1;
    while r.creadr() != r.wr {
        reads += 1;
        assert!(reads < 10);
    }
    assert_eq!(reads, 20u64.div_ceil(per_access) - 1);
    assert_eq!(r.creadr(), start + 20 * 32);
    assert_eq!(r.its.counters().command(opcode::MAPC), 21);
    assert_eq!(r.its.translate(0, 0), Some((lpi(0), 1)));
    assert_eq!(r.its.counters().total_errors(), 0);
}

/// A random but valid command over small ID ranges, so that many hit mapped state.
fn random_command(rng: &mut Rng) -> Command {
    let dev = rng.below(3) as u32;
    let ev = rng.below(4) as u32;
    let icid = if rng.below(8) == 0 { rng.below(20) as u16 } else { rng.below(2) as u16 };
    match rng.below(14) {
        // Rarely: a MAPD drops every event of its device.
        0 if rng.below(4) == 0 => {
            Command::Mapd { device: dev, size: rng.below(3) as u8, itt_addr: ITT, valid: rng.below(4) != 0 }
        }
        0 => Command::Sync { rdbase: 0 },
        1 => Command::Mapc { icid, rdbase: rng.below(3), valid: rng.below(4) != 0 },
        2 | 12 => mapti(dev, ev, rng.below(16) as u32, icid),
        3 => Command::Mapi { device: dev, event: 8192 + ev, icid },
        4 => Command::Movi { device: dev, event: ev, icid },
        5 => Command::Int { device: dev, event: ev },
        6 => Command::Clear { device: dev, event: ev },
        7 => Command::Discard { device: dev, event: ev },
        8 => Command::Inv { device: dev, event: ev },
        9 => Command::Invall { icid },
        10 => Command::Movall { from: rng.below(3), to: rng.below(3) },
        11 => Command::Sync { rdbase: rng.below(3) },
        _ => Command::Vmovp { sequence: 0, its_list: 0, vpe: 1, rdbase: 0 },
    }
}

/// The event mappings a backend holds after `calls`.
fn replay(calls: &[BeCall]) -> BTreeMap<(u32, u32), (u32, Option<usize>)> {
    let mut m = BTreeMap::new();
    for c in calls {
        match *c {
            BeCall::MapEvent(d, e, i, v) => assert!(m.insert((d, e), (i, v)).is_none(), "{c:?} twice"),
            BeCall::UnmapEvent(d, e) => assert!(m.remove(&(d, e)).is_some(), "{c:?} unknown"),
            BeCall::MoveEvent(d, e, v) => m.get_mut(&(d, e)).expect("move of an unknown event").1 = v,
            BeCall::UnmapDevice(d) => assert!(m.keys().all(|k| k.0 != d), "{c:?} with events left"),
            BeCall::MapDevice(..) => {}
        }
    }
    m
}

#[test]
fn random_queues_never_panic_nor_write_memory() {
    let mut rng = Rng(0x1e57_0f17_5c0d_e5e5);
    let (mut mapped, mut injected, mut moved) = (0, 0, 0);
    for round in 0..200 {
        let mut r = Rig::enabled(2);
        r.post(&[Command::Mapc { icid: 0, rdbase: 0, valid: true }, Command::Mapc { icid: 1, rdbase: 1, valid: true }]);
        let mapd: Vec<Command> =
            (0..3).map(|device| Command::Mapd { device, size: 1, itt_addr: ITT, valid: true }).collect();
        r.post(&mapd);
        if round % 3 == 0 {
            r.sink.prop = Some((PROP, rng.below(9000) as u32));
        }
        for _ in 0..8 {
            let mut dws = Vec::new();
            for _ in 0..rng.below(40) {
                dws.push(match rng.below(4) {
                    0 => [rng.next(), rng.next(), rng.next(), rng.next()],
                    1 => {
                        let mut d = random_command(&mut rng).encode();
                        d[rng.index(4)] ^= 1 << rng.below(64);
                        d
                    }
                    _ => random_command(&mut rng).encode(),
                });
            }
            r.put_raw(&dws);
            r.be.refuse = rng.below(8) == 0;
            r.sink.fail = rng.below(8) == 0;
            let snapshot = r.mem.bytes.clone();
            let before = r.its.counters().total_errors() + r.its.counters().commands.iter().sum::<u64>();
            // Random register writes now and then, CWRITER most of the time.
            let (off, size, val) = match rng.below(10) {
                0 => (rng.below(0x200) & !3, 4, rng.next()),
                1 => (0x100 + 8 * rng.below(8), 8, rng.next()),
                2 => (0x88, 8, rng.next()),
                3 => (0x00, 4, u64::from(rng.below(4) != 0)),
                _ => (0x88, 4, r.wr | rng.below(2)),
            };
            let _ = r.write(off, size, val);
            assert!(r.mem.bytes == snapshot, "round {round}: guest memory written");
            let c = r.its.counters();
            assert!(r.its.tables().nr_events() <= MAX_MAPPED_EVENTS);
            // One call runs at most one queue's worth of commands (+ a BASER fault).
            let after = c.total_errors() + c.commands.iter().sum::<u64>();
            assert!(after - before <= QUEUE_PAGES * 0x1000 / 32 + 1);
            let creadr = r.creadr();
            assert!(creadr & !1 < QUEUE_PAGES * 0x1000 || r.its.queue().is_none_or(|q| creadr & !1 < q.1));
            // The backend was told exactly the mappings the vITS holds.
            let told = replay(&r.be.calls);
            let held: BTreeMap<(u32, u32), (u32, Option<usize>)> =
                r.its.mappings().map(|m| ((m.device, m.event), (u32::from(m.intid), m.vcpu))).collect();
            assert_eq!(told, held, "round {round}");
            // translate agrees with the tables.
            for m in r.its.mappings() {
                let t = r.its.translate(m.device, m.event);
                assert_eq!(t, if r.its.enabled() { m.vcpu.map(|v| (m.intid, v)) } else { None });
                assert!(u32::from(m.intid) < 1 << 14);
            }
        }
        let c = r.its.counters();
        mapped += c.command(opcode::MAPTI) + c.command(opcode::MAPI);
        injected += c.int_lpis;
        moved += c.command(opcode::MOVI);
    }
    // The random commands did reach mapped state, not only errors.
    assert!(mapped > 200 && injected > 50 && moved > 50, "{mapped} {injected} {moved}");
}
