//! `hvctl create FILE.cfg` (Xen's `xl create`): the configuration read
//! (`xlcfg`), the kernel and ramdisk read into page-aligned, locked
//! buffers, then `CREATE`, the `LOAD`s (each batch of pages named by its
//! physical addresses from `/proc/self/pagemap`, the hypervisor's checksum
//! compared with ours) and `START` (docs/hvctl.md, "Creating a domain").
//! A failure after `CREATE` destroys the half-made domain, so its memory
//! goes back to the pool.

use crate::client::{Client, Error};
use crate::regs::Regs;
use crate::xlcfg::{self, XlCfg};
use hv_core::control::create::{CreateSpec, Fnv64, MAX_MODULE_BYTES, PAGE};
use hv_core::control::{op, UNCHANGED};

/// Most pages one `LOAD` names (32 KiB of addresses, within the window).
pub const BATCH: usize = 4096;

/// A file's bytes at a page-aligned address that does not move.
pub struct Image {
    buf: Vec<u8>,
    at: usize,
    len: usize,
}

impl Image {
    /// `len` zero bytes at a page-aligned address: a `Vec` with a page of
    /// slack, so that no `unsafe` allocation is needed.
    fn zeroed(len: usize) -> Image {
        let page = PAGE as usize;
        let buf = vec![0u8; len + page];
        let at = buf.as_ptr().align_offset(page).min(page);
        Image { buf, at, len }
    }

    /// An image of `data` (the tests' files).
    #[cfg(test)]
    pub fn new(data: &[u8]) -> Image {
        let mut img = Image::zeroed(data.len());
        img.buf[img.at..img.at + img.len].copy_from_slice(data);
        img
    }

    /// Reads the whole file at `path` straight into its aligned buffer
    /// (one copy of it in memory); `role` ("kernel", "ramdisk") names it
    /// in errors. A file the hypervisor would refuse for its size is
    /// refused before it is read.
    pub fn read(role: &str, path: &str) -> Result<Image, Error> {
        use std::io::Read;
        let err = |e: std::io::Error| Error::Usage(format!("{role} {path}: {e}"));
        let mut f = std::fs::File::open(path).map_err(err)?;
        let len = f.metadata().map_err(err)?.len();
        if len == 0 {
            return Err(Error::Usage(format!("{role} {path}: empty")));
        }
        if len > MAX_MODULE_BYTES {
            return Err(Error::Usage(format!("{role} {path}: {len} bytes (at most {MAX_MODULE_BYTES})")));
        }
        let mut img = Image::zeroed(len as usize);
        f.read_exact(&mut img.buf[img.at..img.at + img.len]).map_err(err)?;
        if f.read(&mut [0u8]).map_err(err)? != 0 {
            return Err(Error::Usage(format!("{role} {path}: it grew while being read")));
        }
        Ok(img)
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.at..self.at + self.len]
    }

    pub fn pages(&self) -> usize {
        self.len.div_ceil(PAGE as usize)
    }
}

/// Whether `k` is a kernel the hypervisor loads: an arm64 Image ("ARM\x64"
/// at byte 56) or an ELF file.
pub fn is_kernel(k: &[u8]) -> bool {
    k.get(56..60) == Some(b"ARM\x64") || k.starts_with(b"\x7fELF")
}

/// The `LOAD` batches of a file of `pages` pages: (first page, count).
pub fn batches(pages: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..pages).step_by(BATCH).map(move |f| (f, BATCH.min(pages - f)))
}

/// The checksum the hypervisor must answer for pages `first..first + n`
/// of `file` (the last page only up to the file's end).
pub fn expected(file: &[u8], first: usize, n: usize) -> u64 {
    let page = PAGE as usize;
    let end = ((first + n) * page).min(file.len());
    let mut h = Fnv64::default();
    h.update(&file[first * page..end]);
    h.0
}

/// Translates the page at `va` to a physical address.
pub type Translate<'a> = &'a dyn Fn(u64) -> Result<u64, Error>;

/// Loads `img` as file `module` of domain `dom`, batch by batch; a batch
/// whose checksum does not match is sent once more (its pages read
/// again: the kernel may have moved one), then it is an error.
pub fn load<R: Regs>(c: &Client<R>, dom: u32, module: u32, img: &Image, phys: Translate<'_>) -> Result<(), Error> {
    let base = img.bytes().as_ptr() as u64;
    for (first, n) in batches(img.pages()) {
        let want = expected(img.bytes(), first, n);
        let mut tries = 0;
        loop {
            let mut payload = Vec::with_capacity(8 * n);
            for p in first..first + n {
                payload.extend_from_slice(&phys(base + p as u64 * PAGE)?.to_le_bytes());
            }
            let r = c.call(op::LOAD, [dom, module, first as u32, UNCHANGED], &payload)?;
            let text = String::from_utf8_lossy(&r.text);
            let got = text.trim().strip_prefix("fnv=").and_then(|h| u64::from_str_radix(h, 16).ok());
            if got == Some(want) {
                break;
            }
            tries += 1;
            if tries == 2 {
                return Err(Error::Other(format!(
                    "the hypervisor read other bytes than the file's (pages {first}..{}): checksum {text:?}, want {want:016x}",
                    first + n
                )));
            }
        }
    }
    Ok(())
}

/// The `CREATE` payload of `cfg` for files of these sizes.
pub fn payload(cfg: &XlCfg, kernel: u64, ramdisk: u64) -> String {
    let mut p = String::new();
    // Writing to a String cannot fail.
    let _ = cfg.spec(kernel, ramdisk).write(&mut p);
    p
}

/// Reads and checks the configuration at `path` and its files. Every
/// error is [`Error::Usage`]: nothing has been asked of the hypervisor.
pub fn prepare(path: &str) -> Result<(XlCfg, Image, Option<Image>), Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Usage(format!("{path}: {e}")))?;
    let cfg = xlcfg::parse(&text).map_err(|e| Error::Usage(format!("{path}: {e}")))?;
    for k in &cfg.ignored {
        eprintln!("hvctl: {path}: `{k}` is not supported here; ignored");
    }
    let kernel = Image::read("kernel", &cfg.kernel)?;
    if !is_kernel(kernel.bytes()) {
        return Err(Error::Usage(format!("kernel {}: not an arm64 Image or ELF", cfg.kernel)));
    }
    let ramdisk = cfg.ramdisk.as_deref().map(|r| Image::read("ramdisk", r)).transpose()?;
    // The parser's checks are the hypervisor's; this catches any drift
    // between them before a request is made.
    let p = payload(&cfg, kernel.len as u64, ramdisk.as_ref().map_or(0, |r| r.len as u64));
    if let Err(s) = CreateSpec::parse(p.as_bytes()) {
        return Err(Error::Usage(format!("{path}: the hypervisor would refuse this domain ({s})")));
    }
    Ok((cfg, kernel, ramdisk))
}

/// The physical address of the page at `va` in this process, from
/// `/proc/self/pagemap` (bit 63: present; bits 0..55: the frame; a frame
/// of 0 means the kernel hides frames from non-root readers).
pub fn pagemap() -> Result<impl Fn(u64) -> Result<u64, Error>, Error> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap").map_err(|e| Error::Other(format!("/proc/self/pagemap: {e}")))?;
    Ok(move |va: u64| {
        let mut e = [0u8; 8];
        f.read_exact_at(&mut e, va / PAGE * 8).map_err(|e| Error::Other(format!("/proc/self/pagemap: {e}")))?;
        let e = u64::from_le_bytes(e);
        let pfn = e & ((1 << 55) - 1);
        match (e >> 63 != 0, pfn) {
            (false, _) => Err(Error::Other(format!("page {va:#x} is not in memory"))),
            (true, 0) => Err(Error::Other("pagemap gives no frame numbers (need root)".into())),
            (true, pfn) => Ok(pfn * PAGE),
        }
    })
}

/// `CREATE`, the `LOAD`s and `START`; on a failure after `CREATE`, the
/// domain is destroyed. Returns its id.
pub fn create<R: Regs>(
    c: &Client<R>,
    cfg: &XlCfg,
    kernel: &Image,
    ramdisk: Option<&Image>,
    phys: Translate<'_>,
) -> Result<u32, Error> {
    let spec = payload(cfg, kernel.len as u64, ramdisk.map_or(0, |r| r.len as u64));
    let r = c.call(op::CREATE, [UNCHANGED; 4], spec.as_bytes())?;
    let text = String::from_utf8_lossy(&r.text);
    let dom = text
        .trim()
        .strip_prefix("domid=")
        .and_then(|d| d.parse::<u32>().ok())
        .ok_or_else(|| Error::Other(format!("CREATE answered {text:?}")))?;
    let built = load(c, dom, 0, kernel, phys)
        .and_then(|()| ramdisk.map_or(Ok(()), |r| load(c, dom, 1, r, phys)))
        .and_then(|()| c.simple(op::START, dom).map(|_| ()));
    if let Err(e) = built {
        return Err(match c.simple(op::DESTROY, dom) {
            Ok(_) => e,
            Err(d) => Error::Other(format!("{e} (and destroying d{dom} failed: {d})")),
        });
    }
    Ok(dom)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::fake::FakeRegs;
    use hv_core::control::create::{page_addr, Module};
    use hv_core::control::{Reply, Request, Status};
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    use std::time::Duration;

    #[test]
    fn files_go_in_batches_of_pages_with_the_last_one_partial() {
        assert_eq!(batches(0).count(), 0);
        assert_eq!(batches(1).collect::<Vec<_>>(), [(0, 1)]);
        assert_eq!(batches(BATCH).collect::<Vec<_>>(), [(0, BATCH)]);
        assert_eq!(batches(BATCH * 2 + 3).collect::<Vec<_>>(), [(0, BATCH), (BATCH, BATCH), (2 * BATCH, 3)]);
        // The last page counts only up to the file's end: the zeros after
        // it in the buffer's page are not the file's.
        let file: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut h = Fnv64::default();
        h.update(&file[8192..]);
        assert_eq!(expected(&file, 2, 1), h.0);
        let mut padded = h;
        padded.update(&[0; 3 * 4096 - 10_000]);
        assert_ne!(expected(&file, 2, 1), padded.0);
        let mut h = Fnv64::default();
        h.update(&file);
        assert_eq!(expected(&file, 0, 3), h.0);
        let img = Image::new(&file);
        assert_eq!(img.bytes(), &file[..]);
        assert_eq!(img.bytes().as_ptr() as usize % 4096, 0);
        assert_eq!(img.pages(), 3);
        assert!(is_kernel(&[&[0u8; 56][..], b"ARM\x64"].concat()));
        assert!(is_kernel(b"\x7fELF\x02\x01"));
        assert!(!is_kernel(b"name = \"x\"\n"));
    }

    /// How the fake hypervisor misbehaves.
    #[derive(Clone, Copy, Default)]
    struct Faults {
        /// `LOAD`s answered with a wrong checksum, from the first.
        wrong: u32,
        /// `DESTROY` refused.
        destroy_fails: bool,
    }

    /// A fake hypervisor: records each request and answers each `LOAD`
    /// with the checksum of the pages it names in `files[module]`, whose
    /// "physical" addresses are offsets in that file.
    fn hypervisor(log: Rc<RefCell<Vec<String>>>, files: [Vec<u8>; 2], f: Faults) -> crate::client::fake::Exec {
        let wrong = Cell::new(f.wrong);
        Box::new(move |r| {
            let line = match &r {
                Request::Create(s) => format!("create {} {} {}", s.name, s.kernel_bytes, s.ramdisk_bytes),
                Request::Load { dom, module, first_page, pages } => {
                    format!("load {dom} {module:?} {first_page} {}", pages.len() / 8)
                }
                other => format!("{other:?}"),
            };
            log.borrow_mut().push(line);
            match r {
                Request::Create(_) => Ok(Reply { text: b"domid=7\n".to_vec(), more: 0 }),
                Request::Load { module, first_page, pages, .. } => {
                    let file = &files[module as usize];
                    let mut h = Fnv64::default();
                    for (i, e) in pages.chunks_exact(8).enumerate() {
                        let at = page_addr(e);
                        assert_eq!(at, (u64::from(first_page) + i as u64) * PAGE, "page {i} of the batch");
                        let end = (at + PAGE).min(file.len() as u64);
                        h.update(&file[at as usize..end as usize]);
                    }
                    if wrong.get() > 0 {
                        wrong.set(wrong.get() - 1);
                        h.update(b"x");
                    }
                    Ok(Reply { text: format!("fnv={:016x}\n", h.0).into_bytes(), more: 0 })
                }
                Request::Destroy { .. } if f.destroy_fails => Err(Status::Perm),
                _ => Ok(Reply::default()),
            }
        })
    }

    const TEST_LEN: usize = 3 * 4096 + 100;

    fn pattern(len: usize, m: usize) -> Vec<u8> {
        (0..len).map(|i| (i % m) as u8).collect()
    }

    /// The fake hypervisor for a kernel and a ramdisk and its log.
    fn client(kernel: &Image, ramdisk: Option<&Image>, f: Faults) -> (Client<FakeRegs>, Rc<RefCell<Vec<String>>>) {
        let log = Rc::new(RefCell::new(Vec::new()));
        let files = [kernel.bytes().to_vec(), ramdisk.map_or(Vec::new(), |r| r.bytes().to_vec())];
        let mut c = Client::new(FakeRegs::new(hypervisor(log.clone(), files, f)));
        c.retry = Duration::ZERO;
        (c, log)
    }

    /// "Physical" = offset in whichever image holds `va`.
    fn offsets<'a>(imgs: &'a [&'a Image]) -> impl Fn(u64) -> Result<u64, Error> + 'a {
        move |va| {
            let img = imgs.iter().find(|i| {
                let base = i.bytes().as_ptr() as u64;
                (base..base + i.pages() as u64 * PAGE).contains(&va)
            });
            Ok(va - img.expect("a page of a test image").bytes().as_ptr() as u64)
        }
    }

    fn cfg() -> XlCfg {
        xlcfg::parse("name='t'\nkernel='k'\nmemory=64\n").unwrap()
    }

    #[test]
    fn create_loads_every_page_then_starts_and_retries_a_bad_checksum_once() {
        let img = Image::new(&pattern(TEST_LEN, 251));
        let (c, log) = client(&img, None, Faults { wrong: 1, ..Faults::default() });
        let dom = create(&c, &cfg(), &img, None, &offsets(&[&img])).unwrap();
        assert_eq!(dom, 7);
        assert_eq!(
            *log.borrow(),
            [
                format!("create t {TEST_LEN} 0"),
                format!("load 7 {:?} 0 4", Module::Kernel),
                format!("load 7 {:?} 0 4", Module::Kernel),
                "Start { dom: 7 }".to_string(),
            ]
        );
    }

    #[test]
    fn a_big_kernel_goes_in_batches_and_the_ramdisk_after_it() {
        let kernel = Image::new(&pattern((BATCH + 1) * 4096 + 10, 253));
        let ramdisk = Image::new(&pattern(5000, 7));
        let (c, log) = client(&kernel, Some(&ramdisk), Faults::default());
        assert_eq!(create(&c, &cfg(), &kernel, Some(&ramdisk), &offsets(&[&kernel, &ramdisk])), Ok(7));
        let k = Module::Kernel;
        assert_eq!(
            *log.borrow(),
            [
                format!("create t {} 5000", kernel.bytes().len()),
                format!("load 7 {k:?} 0 {BATCH}"),
                format!("load 7 {k:?} {BATCH} 2"),
                format!("load 7 {:?} 0 2", Module::Ramdisk),
                "Start { dom: 7 }".to_string(),
            ]
        );
    }

    #[test]
    fn a_batch_wrong_twice_fails_and_destroys_the_domain() {
        let img = Image::new(&pattern(TEST_LEN, 251));
        let (c, log) = client(&img, None, Faults { wrong: 2, ..Faults::default() });
        let e = create(&c, &cfg(), &img, None, &offsets(&[&img])).unwrap_err();
        assert!(e.to_string().starts_with("the hypervisor read other bytes than the file's (pages 0..4)"), "{e}");
        assert_eq!(e.exit_status(), 1);
        let k = Module::Kernel;
        assert_eq!(
            *log.borrow(),
            [
                format!("create t {TEST_LEN} 0"),
                format!("load 7 {k:?} 0 4"),
                format!("load 7 {k:?} 0 4"),
                "Destroy { dom: 7 }".to_string()
            ]
        );
    }

    #[test]
    fn a_failure_after_create_destroys_the_domain() {
        let img = Image::new(&pattern(TEST_LEN, 251));
        let no_frames = |_va: u64| Err(Error::Other("pagemap gives no frame numbers (need root)".into()));
        let (c, log) = client(&img, None, Faults::default());
        let e = create(&c, &cfg(), &img, None, &no_frames).unwrap_err();
        assert_eq!(e.to_string(), "pagemap gives no frame numbers (need root)");
        assert_eq!(log.borrow().last().map(String::as_str), Some("Destroy { dom: 7 }"));
        // A refused DESTROY is reported with the first error.
        let (c, _) = client(&img, None, Faults { destroy_fails: true, ..Faults::default() });
        let e = create(&c, &cfg(), &img, None, &no_frames).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("pagemap gives no frame numbers (need root) (and destroying d7 failed: {})", Status::Perm)
        );
        assert_eq!(
            payload(&cfg(), 10, 0),
            "name=t\nmemory_mib=64\nvcpus=1\ndisk_mib=0\nkernel_bytes=10\nramdisk_bytes=0\n"
        );
    }

    /// A directory of its own for one test's files.
    fn scratch(test: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("hvctl-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn prepare_reads_the_files_and_refuses_what_it_cannot_use_as_usage_errors() {
        let d = scratch("prepare");
        let at = |f: &str| d.join(f).to_str().unwrap().to_string();
        let kernel = [&[0u8; 56][..], b"ARM\x64", &[1u8; 5000]].concat();
        std::fs::write(at("Image"), &kernel).unwrap();
        std::fs::write(at("initrd"), b"cpio").unwrap();
        std::fs::write(at("empty"), b"").unwrap();
        let cfg = |k: &str, rest: &str| {
            let p = at("d.cfg");
            std::fs::write(&p, format!("name = 'g'\nmemory = 64\nkernel = '{}'\n{rest}", at(k))).unwrap();
            p
        };
        let p = cfg("Image", &format!("ramdisk = '{}'\nvcpus = 2\ncpus = '1'\ndisk_size = 8\n", at("initrd")));
        let (c, k, r) = prepare(&p).unwrap();
        assert_eq!(k.bytes(), &kernel[..]);
        assert_eq!(r.as_ref().map(Image::bytes), Some(&b"cpio"[..]));
        assert_eq!(
            payload(&c, k.bytes().len() as u64, 4),
            "name=g\nmemory_mib=64\nvcpus=2\ncpus=1\ndisk_mib=8\nkernel_bytes=5060\nramdisk_bytes=4\n"
        );
        let usage = |p: &str| {
            let e = prepare(p).err().expect("refused");
            assert_eq!(e.exit_status(), 2, "{e}");
            e.to_string()
        };
        assert_eq!(usage(&cfg("initrd", "")), format!("kernel {}: not an arm64 Image or ELF", at("initrd")));
        assert_eq!(usage(&cfg("empty", "")), format!("kernel {}: empty", at("empty")));
        assert!(usage(&cfg("missing", "")).starts_with(&format!("kernel {}: ", at("missing"))));
        assert!(usage(&cfg("Image", &format!("ramdisk = '{}'\n", at("missing")))).starts_with("ramdisk "));
        assert_eq!(usage(&cfg("Image", "vcpus = 0\n")), format!("{p}: vcpus = 0"));
        assert_eq!(usage(&cfg("Image", "bogus = 1\n")), format!("{p}: line 4: unknown key `bogus`"));
        assert!(usage(&at("nothere.cfg")).starts_with(&at("nothere.cfg")));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
