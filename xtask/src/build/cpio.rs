//! "newc" cpio archives (`070701`), the format Linux unpacks an initramfs
//! from: a writer for the small archives xtask appends to the guest
//! image's initramfs, and a reader to check them.
//!
//! Each entry is a 110-byte header (the magic and 13 fields of 8 hex
//! digits), the NUL-terminated name padded to 4 bytes, then the data padded
//! to 4 bytes (offsets counted from the start of the archive); the
//! archive ends with the `TRAILER!!!` entry and is padded to 512 bytes, so
//! another archive can follow it (Linux unpacks concatenated archives).

use anyhow::{bail, Context};

/// A directory's mode (`S_IFDIR | 0755`).
pub const DIR_755: u32 = 0o040755;
/// An executable's mode (`S_IFREG | 0755`).
pub const FILE_755: u32 = 0o100755;
/// A data file's mode (`S_IFREG | 0644`).
pub const FILE_644: u32 = 0o100644;

/// One archive member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The path inside the guest, relative (`usr/bin/hvctl`).
    pub name: String,
    pub mode: u32,
    pub data: Vec<u8>,
}

fn pad4(out: &mut Vec<u8>) {
    out.resize(out.len().next_multiple_of(4), 0);
}

fn header(out: &mut Vec<u8>, ino: u32, name: &str, mode: u32, nlink: u32, size: usize) {
    // ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor
    // rdevminor namesize check (owner root, mtime 0: reproducible)
    let fields = [ino, mode, 0, 0, nlink, 0, size as u32, 0, 0, 0, 0, name.len() as u32 + 1, 0];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08x}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    pad4(out);
}

/// The archive of `entries` (parents before children), with the trailer,
/// padded to 512 bytes.
pub fn write(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let nlink = if e.mode & 0o170000 == 0o040000 { 2 } else { 1 };
        header(&mut out, i as u32 + 1, &e.name, e.mode, nlink, e.data.len());
        out.extend_from_slice(&e.data);
        pad4(&mut out);
    }
    header(&mut out, 0, "TRAILER!!!", 0, 1, 0);
    out.resize(out.len().next_multiple_of(512), 0);
    out
}

/// The entries of the newc archive at the start of `data`, up to its
/// trailer (excluded).
pub fn read(data: &[u8]) -> crate::Result<Vec<Entry>> {
    let mut at = 0;
    let mut out = Vec::new();
    loop {
        let h = data.get(at..at + 110).context("truncated cpio header")?;
        if &h[..6] != b"070701" {
            bail!("no newc magic at byte {at}");
        }
        let field = |i: usize| -> crate::Result<usize> {
            let hex = std::str::from_utf8(&h[6 + 8 * i..14 + 8 * i])?;
            Ok(usize::from_str_radix(hex, 16)?)
        };
        let (mode, size, namesize) = (field(1)? as u32, field(6)?, field(11)?);
        let name_at = at + 110;
        let name = data.get(name_at..name_at + namesize).context("truncated cpio name")?;
        if name.last() != Some(&0) {
            bail!("cpio name at byte {name_at} lacks its NUL");
        }
        let name = std::str::from_utf8(&name[..namesize - 1])?.to_string();
        let data_at = (name_at + namesize).next_multiple_of(4);
        let body = data.get(data_at..data_at + size).context("truncated cpio data")?;
        if name == "TRAILER!!!" {
            return Ok(out);
        }
        out.push(Entry { name, mode, data: body.to_vec() });
        at = (data_at + size).next_multiple_of(4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Entry> {
        vec![
            Entry { name: "usr".into(), mode: DIR_755, data: vec![] },
            Entry { name: "usr/bin".into(), mode: DIR_755, data: vec![] },
            Entry { name: "usr/bin/hvctl".into(), mode: FILE_755, data: b"\x7fELF and 5".to_vec() },
        ]
    }

    #[test]
    fn writes_newc_that_reads_back() {
        let a = write(&sample());
        assert_eq!(a.len() % 512, 0);
        assert_eq!(read(&a).unwrap(), sample());
        // The first header, byte for byte: ino 1, mode 040755, nlink 2,
        // namesize 4 ("usr\0"); 110 + 4 bytes, already aligned.
        let first = b"07070100000001000041ed00000000000000000000000200000000\
                      000000000000000000000000000000000000000000000004\
                      00000000usr\0";
        assert_eq!(&a[..first.len()], &first[..]);
        // The file's data starts 4-byte aligned: header 110 + "usr/bin/hvctl\0" 14 = 124.
        let file_at = a.windows(13).position(|w| w == b"usr/bin/hvctl").unwrap() - 110;
        let data_at = (file_at + 110 + 14).next_multiple_of(4);
        assert_eq!(&a[data_at..data_at + 10], b"\x7fELF and 5");
        assert_eq!(&a[data_at + 10..data_at + 12], &[0, 0], "data padded to 4");
        assert_eq!(&a[(data_at + 12)..(data_at + 18)], b"070701", "the trailer follows");
        assert!(a.windows(10).any(|w| w == b"TRAILER!!!"));
    }

    #[test]
    fn a_concatenation_starts_aligned_and_reads_from_its_offset() {
        let first = write(&sample()[..1]);
        let mut both = first.clone();
        both.extend(write(&sample()));
        assert_eq!(read(&both).unwrap(), sample()[..1]);
        assert_eq!(read(&both[first.len()..]).unwrap(), sample());
        assert!(read(b"070702").is_err());
        assert!(read(&both[..200]).is_err(), "truncated");
    }
}
