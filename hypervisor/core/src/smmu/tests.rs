use super::cmd::{cerror, cerror_name};
use super::event::{ABORT_AFTER, LOG_BURST, LOG_PER_STREAM, TRACKED_STREAMS};
use super::queue::cons_error;
use super::ste::*;
use super::*;
use alloc::vec::Vec;

fn s2(ipa_bits: u32, ps_bits: u32) -> S2Config {
    S2Config { vmid: 0x1234, root: 0x8_1234_5000, ipa_bits, start_level: S2Config::start_level_for(ipa_bits), ps_bits }
}

#[test]
fn ste_stage2_39_bits_level1() {
    let cfg = s2(39, 40);
    assert_eq!(cfg.check(), Ok(()));
    assert_eq!(cfg.start_level, 1);
    let ste = ste_stage2(&cfg);
    let f = ste_fields(&ste);
    assert!(f.valid);
    assert_eq!(f.config, config::S2_TRANS);
    assert_eq!(f.shcfg, 0b01);
    assert_eq!(f.vmid, 0x1234);
    assert_eq!(f.t0sz, 25);
    assert_eq!(f.sl0, 1);
    assert_eq!(f.ps, 2);
    assert_eq!(f.ttb, 0x8_1234_5000);
    // Known raw values: Config 0b110, V.
    assert_eq!(ste[0], 0xd);
    assert_eq!(ste[1], 1 << 44);
    // S2R | S2AFFD | S2AA64 | PS=2 | TG=0 | SH=3 | OR=1 | IR=1 | SL0=1 | T0SZ=25 | VMID.
    assert_eq!(ste[2], 0x042a_3559_0000_1234);
    assert_eq!(ste[3], 0x8_1234_5000);
    assert_eq!(&ste[4..], &[0; 4]);
}

#[test]
fn ste_stage2_48_bits_level0() {
    let cfg = s2(48, 48);
    assert_eq!(cfg.check(), Ok(()));
    assert_eq!(cfg.start_level, 0);
    let ste = ste_stage2(&cfg);
    let f = ste_fields(&ste);
    assert_eq!((f.t0sz, f.sl0, f.ps), (16, 2, 5));
    assert_eq!(ste[2], 0x042d_3590_0000_1234);
    // Bits that stay clear: S2ENDI, S2PTW, S2HD, S2HA, S2S, S2TG.
    for b in [52, 54, 55, 56, 57, 46, 47] {
        assert_eq!(ste[2] >> b & 1, 0, "bit {b}");
    }
    // EATS, STRW and the stage-1 fields are zero.
    assert_eq!(ste[0] & !0xf, 0);
    assert_eq!(ste[1] & !(0b11 << 44), 0);
}

#[test]
fn s2_config_checks() {
    assert_eq!(s2(38, 40).check(), Err(SmmuError::BadS2Config));
    assert_eq!(s2(49, 48).check(), Err(SmmuError::BadS2Config));
    assert_eq!(S2Config { start_level: 0, ..s2(39, 40) }.check(), Err(SmmuError::BadS2Config));
    assert_eq!(S2Config { start_level: 1, ..s2(44, 48) }.check(), Err(SmmuError::BadS2Config));
    assert_eq!(s2(40, 41).check(), Err(SmmuError::BadS2Config));
    assert_eq!(S2Config { root: 0x1000_0800, ..s2(40, 40) }.check(), Err(SmmuError::BadS2Config));
    assert_eq!(S2Config { root: 1 << 40, ..s2(40, 40) }.check(), Err(SmmuError::BadS2Config));
    for (bits, enc) in [(32, 0), (36, 1), (40, 2), (42, 3), (44, 4), (48, 5), (52, 6)] {
        assert_eq!(ps_encoding(bits), Some(enc));
    }
    assert_eq!(ps_encoding(39), None);
}

#[test]
fn abort_and_bypass_stes() {
    let a = ste_abort();
    assert_eq!(a, [1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(ste_fields(&a).config, config::ABORT);
    let b = ste_bypass();
    assert_eq!(b[0], 0b1001);
    assert_eq!(ste_fields(&b).config, config::BYPASS);
    assert_eq!(ste_fields(&b).shcfg, 0b01);
    assert_eq!(&b[2..], &[0; 6]);
}

#[test]
fn two_level_stream_table() {
    assert_eq!(L2_BYTES, 16 * 1024);
    assert_eq!(l1_descriptor(0x4_0000_4000), 0x4_0000_4000 | 9);
    assert_eq!(l1_l2_table(l1_descriptor(0x4000)), Some(0x4000));
    assert_eq!(l1_l2_table(0), None);
    assert_eq!((l1_index(0x0312), l2_index(0x0312)), (3, 0x12));
    assert_eq!((l1_index(0xffff), l2_index(0xffff)), (255, 255));
    assert_eq!(l1_entries(16), 256);
    assert_eq!(l1_entries(8), 1);
    assert_eq!(l1_entries(5), 1);
    assert_eq!(l1_table_bytes(16), 2048);
    assert_eq!(l1_table_bytes(8), 64);
    assert_eq!(strtab_base(0x8000_0040), 1 << 62 | 0x8000_0040);
    assert_eq!(strtab_base(0x8000_0047), 1 << 62 | 0x8000_0040);
    assert_eq!((strtab_log2size(5), strtab_log2size(16)), (8, 16));
    assert_eq!(strtab_base_cfg_2level(16), 0x1_0000 | 8 << 6 | 16);
}

#[test]
fn queue_wraps_over_full_rounds() {
    let q = QueuePtrs::new(3);
    assert_eq!(q.entries(), 8);
    let (mut prod, mut cons) = (0u32, 0u32);
    assert!(q.is_empty(prod, cons));
    for round in 0..3 {
        for i in 0..8 {
            assert!(!q.is_full(prod, cons), "round {round} slot {i}");
            assert_eq!(q.used(prod, cons), i);
            prod = q.next(prod);
        }
        assert!(q.is_full(prod, cons));
        assert!(!q.is_empty(prod, cons));
        assert_eq!(q.index(prod), q.index(cons));
        assert_ne!(q.wrap(prod), q.wrap(cons));
        for _ in 0..8 {
            cons = q.next(cons);
        }
        assert!(q.is_empty(prod, cons));
        assert_eq!(q.wrap(prod), round % 2 == 0);
    }
    // Pointers stay within index + wrap bit; ERR bits are dropped.
    assert_eq!(q.next(0b1111), 0);
    assert_eq!(q.next(0x7f00_0003), 4);
    assert!(q.passed(2, 5, 3));
    assert!(!q.passed(2, 5, 2));
    assert!(q.passed(6, 9, 9));
}

#[test]
fn queue_registers() {
    assert_eq!(queue_base(0x8010_0000, 8), 1 << 62 | 0x8010_0000 | 8);
    assert_eq!(queue_base(0x8010_001f, 40), 1 << 62 | 0x8010_0000 | 8);
    assert_eq!(clamp_log2(CMDQ_LOG2, 19), 8);
    assert_eq!(clamp_log2(CMDQ_LOG2, 5), 5);
    assert_eq!(clamp_log2(EVENTQ_LOG2, 31), 7);
    assert_eq!(clamp_log2(25, 31), 19);
    assert_eq!(queue::queue_bytes(CMDQ_LOG2, queue::CMD_ENTRY_BYTES), 4096);
    assert_eq!(queue::queue_bytes(0, queue::CMD_ENTRY_BYTES), 32);
    assert_eq!(cons_error(0x0000_0012), None);
    assert_eq!(cons_error(0x0100_0012), Some(cerror::ILL));
    assert_eq!(cons_error(0xff00_0000), Some(0x7f));
}

#[test]
fn commands_round_trip() {
    let cmds = [
        Command::CfgiSte { sid: 0, leaf: false },
        Command::CfgiSte { sid: 0xffff_ffff, leaf: true },
        Command::CfgiAll,
        Command::TlbiS12Vmall { vmid: 0xbeef },
        Command::TlbiNsnhAll,
        Command::Sync,
    ];
    for c in cmds {
        let raw = c.encode();
        assert_eq!(raw[0] & 0xff, u64::from(c.opcode()));
        assert_eq!(Command::decode(raw), Some(c), "{}", c.name());
        // Any stray bit is rejected.
        for b in 0..128 {
            let mut r = raw;
            r[b / 64] ^= 1 << (b % 64);
            if let Some(d) = Command::decode(r) {
                assert_ne!(d, c, "{} bit {b}", c.name());
            }
        }
    }
    assert_eq!(Command::decode([0x04, 5]), None, "CFGI_STE_RANGE other than all");
    assert_eq!(Command::decode([0x01, 0]), None);
}

#[test]
fn command_known_encodings() {
    assert_eq!(Command::Sync.encode(), [0x46, 0]);
    assert_eq!(Command::CfgiSte { sid: 0x1008, leaf: true }.encode(), [0x0000_1008_0000_0003, 1]);
    assert_eq!(Command::CfgiAll.encode(), [0x04, 31]);
    assert_eq!(Command::TlbiS12Vmall { vmid: 7 }.encode(), [0x0000_0007_0000_0028, 0]);
    assert_eq!(Command::TlbiNsnhAll.encode(), [0x30, 0]);
    assert_eq!(cerror_name(cerror::ATC_INV_SYNC), "CERROR_ATC_INV_SYNC");
    assert_eq!(cerror_name(cerror::ABT), "CERROR_ABT");
}

#[test]
fn event_decode_translation_fault() {
    let raw = [
        0x0000_0310_0000_0010, // StreamID 0x310, F_TRANSLATION
        1 << 35 | 1 << 39,     // read, stage 2
        0x1234_5678,
        0x0000_0001_2345_6abc, // IPA: low 12 bits not part of the field
    ];
    let e = Event::decode(&raw);
    assert_eq!(e.kind, EventKind::Translation);
    assert_eq!(e.kind.name(), "F_TRANSLATION");
    assert!(e.kind.has_address());
    assert_eq!(e.sid, 0x310);
    assert!(e.rnw && e.stage2);
    assert_eq!(e.input_addr, 0x1234_5678);
    assert_eq!(e.ipa, 0x1_2345_6000);
    let w = Event::decode(&[0x0000_0001_0000_0013, 0, 0, 0]);
    assert_eq!(w.kind, EventKind::Permission);
    assert!(!w.rnw && !w.stage2);
}

#[test]
fn event_kinds() {
    for code in 0..=255u8 {
        let k = EventKind::from_code(code);
        assert_eq!(k.code(), code);
    }
    assert_eq!(EventKind::from_code(0x02), EventKind::BadStreamId);
    assert_eq!(EventKind::from_code(0x04), EventKind::BadSte);
    assert_eq!(EventKind::from_code(0x06), EventKind::StreamDisabled);
    assert_eq!(EventKind::from_code(0x11).name(), "F_ADDR_SIZE");
    assert_eq!(EventKind::from_code(0x12), EventKind::AccessFlag);
    assert_eq!(EventKind::from_code(0x07), EventKind::Other(7));
    assert_eq!(EventKind::Other(7).name(), "F_TRANSL_FORBIDDEN");
    assert_eq!(EventKind::Other(0xee).name(), "UNKNOWN");
}

#[test]
fn fault_log_burst_count_and_abort_once() {
    let mut log = FaultLog::new();
    let mut actions = Vec::new();
    for _ in 0..200 {
        actions.push(log.record(5));
    }
    let logs = actions.iter().filter(|a| **a == FaultAction::Log).count();
    assert_eq!(logs as u32, LOG_PER_STREAM);
    assert!(actions[..LOG_PER_STREAM as usize].iter().all(|a| *a == FaultAction::Log));
    let aborts: Vec<_> = actions.iter().enumerate().filter(|(_, a)| **a == FaultAction::Abort).collect();
    assert_eq!(aborts.len(), 1);
    assert_eq!(aborts[0].0 as u32 + 1, ABORT_AFTER);
    assert_eq!(log.faults(5), Some(200));
    assert_eq!(log.end_batch(), 200 - u64::from(LOG_PER_STREAM) - 1);
    assert_eq!(log.end_batch(), 0);
    log.forget(5);
    assert_eq!(log.faults(5), None);
    assert_eq!(log.record(5), FaultAction::Log);
}

#[test]
fn fault_log_burst_is_global() {
    let mut log = FaultLog::new();
    let logged = (0..20u32).filter(|sid| log.record(*sid) == FaultAction::Log).count();
    assert_eq!(logged as u32, LOG_BURST);
    assert_eq!(log.end_batch(), 20 - u64::from(LOG_BURST));
    assert_eq!(log.record(100), FaultAction::Log);
}

#[test]
fn fault_log_bounded_under_many_streams() {
    let mut log = FaultLog::new();
    for round in 0..ABORT_AFTER {
        for sid in 0..10_000u32 {
            let a = log.record(sid.wrapping_mul(0x9e37_79b9));
            if a == FaultAction::Abort {
                assert_eq!(round + 1, ABORT_AFTER);
            }
        }
        log.end_batch();
    }
    let tracked = (0..10_000u32).filter(|s| log.faults(s.wrapping_mul(0x9e37_79b9)).is_some()).count();
    assert_eq!(tracked, TRACKED_STREAMS);
    assert_eq!(log.untracked(), u64::from(ABORT_AFTER) * (10_000 - TRACKED_STREAMS as u64));
    assert!(core::mem::size_of::<FaultLog>() < 1024);
    log.record(u32::MAX);
}

#[test]
fn features_qemu_like() {
    // QEMU's virt SMMUv3: S1P, TTF=AArch64, COHACC, ... two-level, 16-bit SIDs.
    let idr0 = 1 << 27 | 1 << 18 | 1 << 13 | 1 << 4 | 0b10 << 2 | 1 << 1 | 1;
    let idr1 = 19 << 21 | 19 << 16 | 16;
    let idr5 = 1 << 6 | 1 << 4 | 5;
    let f = Features::decode(idr0, idr1, idr5);
    assert_eq!(
        f,
        Features {
            s1p: true,
            s2p: true,
            two_level: true,
            vmid16: true,
            coherent: true,
            ttf_aarch64: true,
            msi: true,
            sid_bits: 16,
            cmdq_log2: 19,
            eventq_log2: 19,
            oas_bits: 48,
            gran4k: true,
        }
    );
    assert_eq!(f.check_stage2(), Ok(()));
    assert_eq!(f.check_sid(0xffff), Ok(()));
    assert_eq!(f.check_sid(0x1_0000), Err(SmmuError::StreamOutOfRange { sid: 0x1_0000 }));
    assert_eq!(f.max_vmid(), u16::MAX);
    assert_eq!(Features::decode(idr0 & !1, idr1, idr5).check_stage2(), Err(SmmuError::NoStage2));
    assert_eq!(
        Features::decode(idr0 & !(0b11 << 2) | 0b01 << 2, idr1, idr5).check_stage2(),
        Err(SmmuError::NoAArch64Tables)
    );
    assert_eq!(Features::decode(idr0, idr1, idr5 & !(1 << 4)).check_stage2(), Err(SmmuError::No4kGranule));
    assert_eq!(Features::decode(idr0 & !(0b11 << 27), idr1, idr5).check_stage2(), Err(SmmuError::NoTwoLevel));
    assert_eq!(Features::decode(idr0, idr1, 0b010).oas_bits, 40);
    assert_eq!(Features::decode(idr0, idr1, 0b111).oas_bits, 48);
    assert!(Features::decode(idr0 | 0b11 << 2, idr1, idr5).ttf_aarch64);
}

#[test]
fn control_register_values() {
    assert_eq!(cr1_value(true), 0xd75);
    assert_eq!(cr1_value(false), 0);
    assert_eq!(cr2::VALUE, 0b110);
    assert_eq!(cr0::SMMUEN | cr0::EVENTQEN | cr0::CMDQEN, 0b1101);
    assert_eq!(irq_ctrl::GERROR_IRQEN | irq_ctrl::EVENTQ_IRQEN, 0b101);
    assert_eq!(gbpa::UPDATE | gbpa::ABORT, 0x8010_0000);
    assert_eq!((EVENTQ_PROD, EVENTQ_CONS), (0x100a8, 0x100ac));
}

#[test]
fn gerror_decoding() {
    let active = gerror_active(0b1_0000_0101, 0b0_0000_0100);
    assert_eq!(active, 0b1_0000_0001);
    assert_eq!(gerror_names(active).collect::<Vec<_>>(), ["CMDQ_ERR", "SFM_ERR"]);
    assert_eq!(
        gerror_names(0x1fe).collect::<Vec<_>>(),
        [
            "RESERVED",
            "EVENTQ_ABT_ERR",
            "PRIQ_ABT_ERR",
            "MSI_CMDQ_ABT_ERR",
            "MSI_EVENTQ_ABT_ERR",
            "MSI_PRIQ_ABT_ERR",
            "MSI_GERROR_ABT_ERR",
            "SFM_ERR"
        ]
    );
    assert_eq!(gerror_names(0).count(), 0);
    assert_eq!(alloc::format!("{}", SmmuError::CmdqError { code: 1 }), "SMMU command queue error 0x1 (CERROR_ILL)");
}
