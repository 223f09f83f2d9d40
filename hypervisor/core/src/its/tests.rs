//! Host tests of the ITS command format.

use super::cmd::{opcode, Command, CommandError};
use super::*;
use crate::testrng::Rng;
use tock_registers::LocalRegisterCopy;

fn all_kinds() -> [Command; 19] {
    [
        Command::Mapd { device: 0x10, size: 4, itt_addr: 0x4123_4500, valid: true },
        Command::Mapc { icid: 3, rdbase: 1, valid: true },
        Command::Mapti { device: 0xffff_ffff, event: 7, pintid: 8192 + 5, icid: 0xffff },
        Command::Mapi { device: 1, event: 8200, icid: 0 },
        Command::Movi { device: 2, event: 3, icid: 1 },
        Command::Int { device: 4, event: 5 },
        Command::Clear { device: 6, event: 7 },
        Command::Discard { device: 8, event: 9 },
        Command::Inv { device: 10, event: 11 },
        Command::Invall { icid: 12 },
        Command::Sync { rdbase: 0x8_0a00 },
        Command::Movall { from: 1, to: 2 },
        Command::Vmapp { vpe: 9, rdbase: 1, vpt_addr: 0x4800_0000, vpt_size: 13, valid: true },
        Command::Vmapti { device: 3, event: 1, vpe: 9, vintid: 8193, doorbell: 8300 },
        Command::Vmapi { device: 3, event: 2, vpe: 9, doorbell: 1023 },
        Command::Vmovi { device: 3, event: 2, vpe: 10, set_doorbell: true, doorbell: 8301 },
        Command::Vmovp { sequence: 1, its_list: 1, vpe: 9, rdbase: 0 },
        Command::Vsync { vpe: 9 },
        Command::Vinvall { vpe: 9 },
    ]
}

#[test]
fn every_command_round_trips() {
    for c in all_kinds() {
        assert_eq!(Command::decode(c.encode()), Ok(c), "{}", c.name());
        assert_eq!(Command::from_bytes(&c.to_bytes()), Ok(c), "{}", c.name());
    }
}

#[test]
fn known_encodings_match_the_specification() {
    // MAPD DeviceID 0x10, 32 events (Size = 4), ITT at 0x41234500, valid.
    let w = Command::Mapd { device: 0x10, size: 4, itt_addr: 0x4123_4500, valid: true }.encode();
    assert_eq!(w, [0x0000_0010_0000_0008, 4, 0x8000_0000_4123_4500, 0]);
    // MAPC ICID 3 → processor 1.
    let w = Command::Mapc { icid: 3, rdbase: 1, valid: true }.encode();
    assert_eq!(w, [0x09, 0, 0x8000_0000_0001_0003, 0]);
    // MAPTI DeviceID 2, EventID 1 → LPI 8195 in collection 0.
    let w = Command::Mapti { device: 2, event: 1, pintid: 8195, icid: 0 }.encode();
    assert_eq!(w, [0x0000_0002_0000_000a, 0x0000_2003_0000_0001, 0, 0]);
    // SYNC on processor 1.
    assert_eq!(Command::Sync { rdbase: 1 }.encode(), [0x05, 0, 0x1_0000, 0]);
}

#[test]
fn unknown_numbers_and_reserved_bits_are_refused() {
    assert_eq!(Command::decode([0x02, 0, 0, 0]), Err(CommandError::UnknownOpcode(0x02)));
    assert_eq!(Command::decode([0xff, 0, 0, 0]), Err(CommandError::UnknownOpcode(0xff)));
    // MAPD with a bit in the RES0 part of DW1.
    assert_eq!(
        Command::decode([opcode::MAPD as u64, 1 << 5, 0, 0]),
        Err(CommandError::ReservedBits { opcode: opcode::MAPD, dw: 1, bits: 1 << 5 })
    );
    // INT with anything in DW3.
    assert!(matches!(Command::decode([opcode::INT as u64, 0, 0, 1]), Err(CommandError::ReservedBits { dw: 3, .. })));
    // DW0 bits [31:8] are RES0 for every command.
    assert!(matches!(
        Command::decode([opcode::SYNC as u64 | 0x100, 0, 0, 0]),
        Err(CommandError::ReservedBits { dw: 0, .. })
    ));
    // An ITT address below 256-byte alignment.
    assert!(Command::decode([opcode::MAPD as u64, 0, 0x80, 0]).is_err());
}

/// The guest decoder takes the defined fields and ignores RES0 bits (saying
/// whether any was set); only an unknown number is refused. The strict
/// decoder stays strict on the same words.
#[test]
fn guest_decoding_ignores_reserved_bits() {
    use super::cmd::UnknownOpcode;
    for c in all_kinds() {
        let clean = c.encode();
        assert_eq!(Command::decode_guest(clean), Ok((c, false)), "{}", c.name());
        let used = super::cmd::used_bits(c.opcode()).unwrap();
        let stale: [u64; 4] = core::array::from_fn(|i| clean[i] | !used[i]);
        assert_eq!(Command::decode_guest(stale), Ok((c, true)), "{}", c.name());
        assert!(matches!(Command::decode(stale), Err(CommandError::ReservedBits { .. })), "{}", c.name());
    }
    assert_eq!(Command::decode_guest([0x02, 0, 0, 0]), Err(UnknownOpcode(0x02)));
    assert_eq!(Command::decode_guest([!0, !0, !0, !0]), Err(UnknownOpcode(0xff)));
    let mut rng = Rng(0x26);
    for _ in 0..100_000 {
        let w: [u64; 4] = core::array::from_fn(|_| rng.next());
        let op = w[0] as u8;
        match (Command::decode_guest(w), super::cmd::used_bits(op)) {
            (Ok((c, reserved)), Some(used)) => {
                let masked: [u64; 4] = core::array::from_fn(|i| w[i] & used[i]);
                assert_eq!(Command::decode(masked), Ok(c));
                assert_eq!(reserved, masked != w);
            }
            (Err(UnknownOpcode(o)), None) => assert_eq!(o, op),
            (r, u) => panic!("{w:x?}: {r:?} with used bits {u:x?}"),
        }
    }
}

#[test]
fn random_words_never_panic_and_decoded_commands_reencode_identically() {
    let mut rng = Rng(0x175);
    let mut decoded = 0;
    for i in 0..200_000u32 {
        let op = [0x01u64, 0x03, 0x04, 0x05, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x21, 0x22, 0x25, 0x29]
            [i as usize % 16];
        // Sparse random words so that some decode.
        let mut w = [0u64; 4];
        for x in w.iter_mut() {
            *x = rng.next() & rng.next();
        }
        w[0] = (w[0] & !0xff) | op;
        // Half of them with only defined bits, so that they decode.
        if i % 2 == 0 {
            let used = super::cmd::used_bits(op as u8).unwrap();
            for (x, u) in w.iter_mut().zip(used) {
                *x &= u;
            }
        }
        if let Ok(c) = Command::decode(w) {
            decoded += 1;
            assert_eq!(c.encode(), w, "{c:?}");
        }
    }
    assert!(decoded > 1000, "only {decoded} random commands decoded");
}

#[test]
fn register_layouts() {
    // QEMU 7.2's GITS_TYPER on gic-version=4 (FACTS: Physical, Virtual,
    // VMOVP, PTA = 0, CIL, CIDbits 15, Devbits 15, IDbits 15, 12-byte ITEs).
    let typer: LocalRegisterCopy<u64, GITS_TYPER::Register> =
        LocalRegisterCopy::new(1 | 1 << 1 | 11 << 4 | 15 << 8 | 15 << 13 | 15 << 32 | 1 << 36 | 1 << 37);
    assert!(typer.is_set(GITS_TYPER::Virtual));
    assert_eq!(typer.read(GITS_TYPER::ITT_entry_size) + 1, 12);
    assert_eq!(typer.read(GITS_TYPER::Devbits) + 1, 16);
    assert!(!typer.is_set(GITS_TYPER::PTA));
    let cbaser = (GITS_CBASER::Valid::SET + GITS_CBASER::Size.val(15)).value | 0x4010_0000;
    let r: LocalRegisterCopy<u64, GITS_CBASER::Register> = LocalRegisterCopy::new(cbaser);
    assert_eq!(r.read(GITS_CBASER::Physical_Address) << 12, 0x4010_0000);
    assert_eq!((r.read(GITS_CBASER::Size) + 1) * CBASER_PAGE, 64 * 1024);
    let baser: LocalRegisterCopy<u64, GITS_BASER::Register> =
        LocalRegisterCopy::new((GITS_BASER::Type::Collections + GITS_BASER::Entry_Size.val(7)).value);
    assert_eq!(baser.read_as_enum(GITS_BASER::Type), Some(GITS_BASER::Type::Value::Collections));
    assert_eq!(lpi_config_byte(0xa0, true), 0xa3);
    assert_eq!(offset::GITS_TRANSLATER, 0x1_0040);
}
