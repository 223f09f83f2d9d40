//! Fuzz the virtual ITS: the input bytes become a script of guest actions —
//! register writes of any size and offset in the control frame, raw 32-byte
//! commands and well-formed commands with fuzzer-chosen fields put into the
//! command queue, CWRITER writes, changes of the fake vGIC's LPI tables —
//! against a Linux-like initial setup. The model must never panic, never
//! write guest memory (it only gets `&GuestMemory`, and the whole RAM is
//! compared after every call), keep its mapped events under the cap, and
//! translate exactly what its mappings say.
//!
//! Guest RAM starts at address 0 so that small fuzzer-made numbers are valid
//! addresses; everything beyond 64 KiB is "outside guest RAM".
//!
//! Run: `cargo +nightly fuzz run vits -- -max_total_time=600`
#![no_main]

use hypervisor::intid::IntId;
use hypervisor::its::cmd::Command;
use hypervisor::vgic::its::{tables, BackendError, ItsBackend, LpiSink, Vits, VitsConfig};
use hypervisor::vgic::{Kicks, VgicError};
use hypervisor::virtio::{GuestMemory, VecMemory};
use libfuzzer_sys::fuzz_target;

const RAM_SIZE: usize = 64 * 1024;
const ITS: u64 = 0x0808_0000;
const QUEUE_BYTES: u64 = 0x1000;
const VCPUS: usize = 3;

struct Input<'a>(&'a [u8]);
impl Input<'_> {
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }
    fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | (u16::from(self.u8()) << 8)
    }
    fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
}

/// A vGIC stand-in that checks what the vITS asks of it.
struct Sink {
    lpis: [bool; VCPUS],
    prop: Option<(u64, u32)>,
}

impl Sink {
    fn check(intid: IntId, vcpu: usize) -> Result<Kicks, VgicError> {
        let n = u32::from(intid);
        assert!((8192..1 << 14).contains(&n), "LPI {n} beyond the vGIC's IDbits");
        assert!(vcpu < VCPUS, "vCPU {vcpu}");
        let mut k = Kicks::none();
        k.add(vcpu);
        Ok(k)
    }
}

impl LpiSink for Sink {
    fn lpis_enabled(&self, vcpu: usize) -> bool {
        self.lpis.get(vcpu).copied().unwrap_or(false)
    }
    fn lpi_prop_table(&self, _vcpu: usize) -> Option<(u64, u32)> {
        self.prop
    }
    fn set_lpi_config(&mut self, intid: IntId, _config: u8) -> Result<Kicks, VgicError> {
        Sink::check(intid, 0)
    }
    fn load_lpi_config(&mut self, _mem: &impl GuestMemory, vcpu: usize) -> Result<Kicks, VgicError> {
        assert!(vcpu < VCPUS);
        Ok(Kicks::none())
    }
    fn inject_lpi(&mut self, intid: IntId, vcpu: usize) -> Result<Kicks, VgicError> {
        Sink::check(intid, vcpu)
    }
    fn clear_lpi(&mut self, intid: IntId, vcpu: usize) -> Result<(), VgicError> {
        Sink::check(intid, vcpu).map(|_| ())
    }
    fn move_lpi(&mut self, intid: IntId, from: usize, to: usize) -> Result<Kicks, VgicError> {
        assert!(from < VCPUS);
        Sink::check(intid, to)
    }
}

/// A backend that mirrors the events it was told about, to compare.
#[derive(Default)]
struct Mirror {
    events: std::collections::BTreeMap<(u32, u32), (u32, Option<usize>)>,
    refuse: bool,
}

impl ItsBackend for Mirror {
    fn map_device(&mut self, device: u32, _event_bits: u8) -> Result<(), BackendError> {
        if self.refuse {
            return Err(BackendError::BadDevice(device));
        }
        Ok(())
    }
    fn unmap_device(&mut self, device: u32) {
        assert!(self.events.keys().all(|&(d, _)| d != device), "device unmapped before its events");
    }
    fn map_event(&mut self, device: u32, event: u32, vintid: IntId, vcpu: Option<usize>) -> Result<(), BackendError> {
        if self.refuse {
            return Err(BackendError::NoResources);
        }
        assert!(self.events.insert((device, event), (vintid.into(), vcpu)).is_none(), "mapped twice");
        Ok(())
    }
    fn unmap_event(&mut self, device: u32, event: u32) {
        assert!(self.events.remove(&(device, event)).is_some(), "unmapped an unknown event");
    }
    fn move_event(&mut self, device: u32, event: u32, vcpu: Option<usize>) {
        let e = self.events.get_mut(&(device, event)).expect("moved an unknown event");
        e.1 = vcpu;
    }
}

fn command(inp: &mut Input) -> Command {
    let dev = u32::from(inp.u8() % 8);
    let ev = u32::from(inp.u8() % 16);
    let icid = u16::from(inp.u8() % 20);
    match inp.u8() % 13 {
        0 => Command::Mapd {
            device: dev,
            size: inp.u8() % 20,
            itt_addr: u64::from(inp.u16()) << 8,
            valid: inp.u8() & 1 == 0,
        },
        1 => Command::Mapc { icid, rdbase: u64::from(inp.u8() % 4), valid: inp.u8() & 1 == 0 },
        2 => Command::Mapti { device: dev, event: ev, pintid: 8190 + u32::from(inp.u16() % 8200), icid },
        3 => Command::Mapi { device: dev, event: inp.u32(), icid },
        4 => Command::Movi { device: dev, event: ev, icid },
        5 => Command::Int { device: dev, event: ev },
        6 => Command::Clear { device: dev, event: ev },
        7 => Command::Discard { device: dev, event: ev },
        8 => Command::Inv { device: dev, event: ev },
        9 => Command::Invall { icid },
        10 => Command::Movall { from: u64::from(inp.u8() % 4), to: u64::from(inp.u8() % 4) },
        11 => Command::Sync { rdbase: u64::from(inp.u8() % 4) },
        _ => Command::Vinvall { vpe: inp.u16() },
    }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let mut its = Vits::new(VitsConfig { base: ITS, nr_vcpus: VCPUS, msi_vcpu: None, devices: None }).unwrap();
    let mut mem = VecMemory::new(0, RAM_SIZE);
    let mut sink = Sink { lpis: [true; VCPUS], prop: Some((0x8000, 8192)) };
    let mut be = Mirror::default();
    let mut wr = 0u64;
    // Linux's setup: a 4 KiB queue at 0, CWRITER = 0, enabled.
    for (off, size, v) in [(0x80, 8, (1 << 63) | 0u64), (0x88, 8, 0), (0, 4, 1)] {
        its.mmio_write(ITS + off, size, v, &mem, &mut sink, &mut be).unwrap();
    }
    for _ in 0..256 {
        if inp.0.is_empty() {
            break;
        }
        match inp.u8() % 8 {
            0 => {
                // Any register, any size.
                let off = u64::from(inp.u16() & 0x1ff);
                let size = [1u8, 2, 4, 8][usize::from(inp.u8() % 4)];
                let v = inp.u64();
                let snapshot = mem.bytes.clone();
                let _ = its.mmio_write(ITS + off, size, v, &mem, &mut sink, &mut be);
                let _ = its.mmio_read(ITS + off, size, &mem, &mut sink, &mut be);
                assert!(mem.bytes == snapshot);
            }
            1 => {
                let raw = inp.bytes(32).to_vec();
                mem.bytes[wr as usize..wr as usize + raw.len()].copy_from_slice(&raw);
                wr = (wr + 32) % QUEUE_BYTES;
            }
            2..=5 => {
                let c = command(&mut inp);
                for (i, w) in c.encode().iter().enumerate() {
                    let at = wr as usize + 8 * i;
                    mem.bytes[at..at + 8].copy_from_slice(&w.to_le_bytes());
                }
                wr = (wr + 32) % QUEUE_BYTES;
            }
            6 => {
                let retry = u64::from(inp.u8() & 1);
                let snapshot = mem.bytes.clone();
                let _ = its.mmio_write(ITS + 0x88, 8, wr | retry, &mem, &mut sink, &mut be);
                assert!(mem.bytes == snapshot);
            }
            _ => {
                let v = inp.u8();
                sink.lpis[usize::from(v % 3)] = v & 4 == 0;
                sink.prop = if v & 8 == 0 { Some((u64::from(inp.u16()), u32::from(inp.u16()))) } else { None };
                be.refuse = v & 16 != 0;
            }
        }
        assert!(its.tables().nr_events() <= tables::MAX_MAPPED_EVENTS);
        assert!(its.tables().nr_devices() <= tables::MAX_MAPPED_DEVICES);
        // The backend was told exactly the mappings the vITS holds.
        let mut n = 0;
        for m in its.mappings() {
            n += 1;
            assert_eq!(be.events.get(&(m.device, m.event)), Some(&(u32::from(m.intid), m.vcpu)));
            let t = its.translate(m.device, m.event);
            assert_eq!(t, if its.enabled() { m.vcpu.map(|v| (m.intid, v)) } else { None });
        }
        assert_eq!(n, be.events.len());
    }
});
