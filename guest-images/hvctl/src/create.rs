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
use hv_core::control::create::{Fnv64, PAGE};
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
    pub fn new(data: &[u8]) -> Image {
        let page = PAGE as usize;
        let mut buf = vec![0u8; data.len() + page];
        let at = buf.as_ptr().align_offset(page).min(page);
        buf[at..at + data.len()].copy_from_slice(data);
        Image { buf, at, len: data.len() }
    }

    pub fn read(path: &str) -> Result<Image, Error> {
        let data = std::fs::read(path).map_err(|e| Error::Other(format!("{path}: {e}")))?;
        if data.is_empty() {
            return Err(Error::Other(format!("{path}: empty")));
        }
        Ok(Image::new(&data))
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

/// Reads and checks the configuration at `path` and its files.
pub fn prepare(path: &str) -> Result<(XlCfg, Image, Option<Image>), Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Other(format!("{path}: {e}")))?;
    let cfg = xlcfg::parse(&text).map_err(|e| Error::Other(format!("{path}: {e}")))?;
    for k in &cfg.ignored {
        eprintln!("hvctl: {path}: `{k}` is not supported here; ignored");
    }
    let kernel = Image::read(&cfg.kernel)?;
    if !is_kernel(kernel.bytes()) {
        return Err(Error::Other(format!("kernel {}: not an arm64 Image or ELF", cfg.kernel)));
    }
    let ramdisk = cfg.ramdisk.as_deref().map(Image::read).transpose()?;
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
        let _ = c.simple(op::DESTROY, dom);
        return Err(e);
    }
    Ok(dom)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::fake::FakeRegs;
    use hv_core::control::create::Module;
    use hv_core::control::{Reply, Request};
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::time::Duration;

    #[test]
    fn files_go_in_batches_of_pages_with_the_last_one_partial() {
        assert_eq!(batches(0).count(), 0);
        assert_eq!(batches(1).collect::<Vec<_>>(), [(0, 1)]);
        assert_eq!(batches(BATCH * 2 + 3).collect::<Vec<_>>(), [(0, BATCH), (BATCH, BATCH), (2 * BATCH, 3)]);
        let file: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut h = Fnv64::default();
        h.update(&file[8192..]);
        assert_eq!(expected(&file, 2, 1), h.0);
        let img = Image::new(&file);
        assert_eq!(img.bytes(), &file[..]);
        assert_eq!(img.bytes().as_ptr() as usize % 4096, 0);
        assert_eq!(img.pages(), 3);
        assert!(is_kernel(&[&[0u8; 56][..], b"ARM\x64"].concat()));
        assert!(is_kernel(b"\x7fELF\x02\x01"));
        assert!(!is_kernel(b"name = \"x\"\n"));
    }

    /// A fake hypervisor: records each request, answers each `LOAD` with
    /// the checksum of the pages it names (`pa` = the test's address), the
    /// first one of a batch wrong when `flaky`.
    fn hypervisor(log: Rc<RefCell<Vec<String>>>, flaky: bool) -> crate::client::fake::Exec {
        let wrong_once = RefCell::new(flaky);
        Box::new(move |r| {
            let line = match &r {
                Request::Create(s) => format!("create {} {}", s.name, s.kernel_bytes),
                Request::Load { dom, module, first_page, pages } => {
                    format!("load {dom} {module:?} {first_page} {}", pages.len() / 8)
                }
                other => format!("{other:?}"),
            };
            log.borrow_mut().push(line);
            match r {
                Request::Create(_) => Ok(Reply { text: b"domid=7\n".to_vec(), more: 0 }),
                Request::Load { pages, .. } => {
                    let mut h = Fnv64::default();
                    let n = (pages.len() / 8) as u64;
                    let first = hv_core::control::create::page_addr(pages);
                    // The "physical" addresses are offsets in the test's
                    // file, the counting pattern.
                    let len = TEST_LEN as u64;
                    let start = first / PAGE * PAGE;
                    let end = (start + n * PAGE).min(len);
                    h.update(&pattern()[start as usize..end as usize]);
                    if wrong_once.replace(false) {
                        h.update(b"x");
                    }
                    Ok(Reply { text: format!("fnv={:016x}\n", h.0).into_bytes(), more: 0 })
                }
                _ => Ok(Reply::default()),
            }
        })
    }

    const TEST_LEN: usize = 3 * 4096 + 100;

    fn pattern() -> Vec<u8> {
        (0..TEST_LEN).map(|i| (i % 251) as u8).collect()
    }

    fn client(log: Rc<RefCell<Vec<String>>>, flaky: bool) -> Client<FakeRegs> {
        let mut c = Client::new(FakeRegs::new(hypervisor(log, flaky)));
        c.retry = Duration::ZERO;
        c
    }

    fn cfg() -> XlCfg {
        xlcfg::parse("name='t'\nkernel='k'\nmemory=64\n").unwrap()
    }

    #[test]
    fn create_loads_every_page_then_starts_and_retries_a_bad_checksum_once() {
        let img = Image::new(&pattern());
        let base = img.bytes().as_ptr() as u64;
        // "Physical" = offset in the file, so the fake can checksum it.
        let phys = move |va: u64| Ok(va - base);
        let log = Rc::new(RefCell::new(Vec::new()));
        let dom = create(&client(log.clone(), true), &cfg(), &img, None, &phys).unwrap();
        assert_eq!(dom, 7);
        let log = log.borrow();
        assert_eq!(
            *log,
            [
                format!("create t {TEST_LEN}"),
                format!("load 7 {:?} 0 4", Module::Kernel),
                format!("load 7 {:?} 0 4", Module::Kernel),
                "Start { dom: 7 }".to_string(),
            ]
        );
    }

    #[test]
    fn a_failure_after_create_destroys_the_domain() {
        let img = Image::new(&pattern());
        let log = Rc::new(RefCell::new(Vec::new()));
        let no_frames = |_va: u64| Err(Error::Other("pagemap gives no frame numbers (need root)".into()));
        let e = create(&client(log.clone(), false), &cfg(), &img, None, &no_frames).unwrap_err();
        assert_eq!(e.to_string(), "pagemap gives no frame numbers (need root)");
        assert_eq!(log.borrow().last().map(String::as_str), Some("Destroy { dom: 7 }"));
        assert_eq!(
            payload(&cfg(), 10, 0),
            "name=t\nmemory_mib=64\nvcpus=1\ndisk_mib=0\nkernel_bytes=10\nramdisk_bytes=0\n"
        );
    }
}
