//! The host tools every run uses are the project's own: QEMU 10.0, EDK2 and
//! the TF-A build tools (the aarch64 cross compiler, `fdtput`), fetched as
//! Debian packages with a private apt state and unpacked without dpkg into a
//! cache outside the work tree. Nothing needs root and nothing on the
//! machine changes: no package is installed or removed, the machine's apt
//! sources and state are only read (apt resolves against the installed
//! packages, so only the libraries the machine lacks are fetched).
//!
//! Each [`Bundle`] is a pinned set of packages. [`ensure`] is its state
//! machine:
//!
//! 1. `<cache>/<bundle>/manifest.txt` present and the bundle's check passes:
//!    a cache hit, no network access.
//! 2. Otherwise leftovers of an interrupted install (`<bundle>.tmp-*`, a
//!    directory without its manifest) are removed, apt resolves the pinned
//!    packages and the missing libraries, each `.deb` is downloaded into
//!    `<cache>/debs` (through a temporary name) and verified against the
//!    archive's SHA-256 and its own control fields (a corrupt one is
//!    removed), everything is unpacked into `<bundle>.tmp-<pid>`, checked
//!    (the binary runs, `ldd` finds every library), the manifest written,
//!    and the directory renamed into place. Nothing half-installed is ever
//!    used.
//!
//! The cache is `$XTASK_CACHE_DIR`, else `$XDG_CACHE_HOME/hv-aarch64`, else
//! `~/.cache/hv-aarch64`; `cargo xtask clean --caches` removes it. The apt
//! access is behind [`Archive`] so host tests drive the state machine with a
//! fake archive of real `.deb` files.

use crate::Result;
use anyhow::{anyhow, bail, Context};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A pinned package: `version` from `release`; when the archive no longer
/// has it, the newest version starting with `line` (a newer point release
/// of the same version line) is taken and the run says so.
#[derive(Clone, Copy, Debug)]
pub struct Pin {
    pub package: &'static str,
    pub version: &'static str,
    pub line: &'static str,
}

/// What a bundle's check is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// `usr/bin/qemu-system-aarch64` runs and prints its version.
    Qemu,
    /// The file (relative to the root) exists and is not empty.
    File(&'static str),
    /// The aarch64 cross compiler compiles a C file and `fdtput` runs.
    CrossTools,
}

/// A set of packages unpacked together into `<cache>/<name>`.
#[derive(Clone, Copy, Debug)]
pub struct Bundle {
    /// Directory name in the cache, e.g. `qemu-10.0`.
    pub name: &'static str,
    /// For messages, e.g. "QEMU".
    pub what: &'static str,
    /// apt's target release for the resolution (`-t`), when the pins come
    /// from a release apt does not prefer by default (backports).
    pub release: Option<&'static str>,
    pub pins: &'static [Pin],
    pub check: Check,
}

const QEMU_VERSION: &str = "1:10.0.2+ds-2+deb13u1~bpo12+1";

/// QEMU 10.0 from bookworm-backports: the emulator, its data files
/// (firmware blobs, keymaps) and what both need.
pub const QEMU: Bundle = Bundle {
    name: "qemu-10.0",
    what: "QEMU",
    release: Some("bookworm-backports"),
    pins: &[
        Pin { package: "qemu-system-arm", version: QEMU_VERSION, line: "1:10.0." },
        Pin { package: "qemu-system-common", version: QEMU_VERSION, line: "1:10.0." },
        Pin { package: "qemu-system-data", version: QEMU_VERSION, line: "1:10.0." },
    ],
    check: Check::Qemu,
};

/// EDK2 for `--firmware uefi` (Debian 12's `qemu-efi-aarch64`).
pub const EDK2: Bundle = Bundle {
    name: "edk2-2022.11",
    what: "EDK2",
    release: None,
    pins: &[Pin { package: "qemu-efi-aarch64", version: "2022.11-6+deb12u2", line: "2022.11-" }],
    check: Check::File(EDK2_FD),
};

/// EDK2's firmware image inside the bundle.
pub const EDK2_FD: &str = "usr/share/qemu-efi-aarch64/QEMU_EFI.fd";

/// TF-A's cross tools: Debian 12's aarch64 GCC and binutils, `fdtput`.
pub const TFA_TOOLS: Bundle = Bundle {
    name: "tf-a-tools-gcc12",
    what: "the TF-A build tools",
    release: None,
    pins: &[
        Pin { package: "gcc-aarch64-linux-gnu", version: "4:12.2.0-3", line: "4:12.2." },
        Pin { package: "device-tree-compiler", version: "1.6.1-4+b1", line: "1.6.1-" },
    ],
    check: Check::CrossTools,
};

/// Every bundle, for `doctor` and `clean`.
pub const BUNDLES: [Bundle; 3] = [QEMU, EDK2, TFA_TOOLS];

/// The oldest QEMU the runs are known to work on (Debian 12's).
pub const MIN_QEMU: Version = Version(7, 2, 0);

/// A QEMU version, major.minor.micro.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// The version in `qemu-system-aarch64 --version`'s first line
/// (`QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2...)`).
pub fn parse_qemu_version(out: &str) -> Option<Version> {
    let rest = out.lines().next()?.strip_prefix("QEMU emulator version ")?;
    let v = rest.split(|c: char| !(c.is_ascii_digit() || c == '.')).next()?;
    let mut n = v.split('.').map(|x| x.parse::<u32>().ok());
    Some(Version(n.next()??, n.next()??, n.next().flatten().unwrap_or(0)))
}

/// The libraries `ldd` reports as `not found`.
pub fn missing_libraries(ldd: &str) -> Vec<String> {
    ldd.lines()
        .filter(|l| l.contains("=> not found"))
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}

/// The packages `apt-get -s install` (with `LC_ALL=C`) would unpack:
/// its `Inst name [old] (version release [arch])` lines, as (name, version).
pub fn parse_simulation(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("Inst ")?;
            let (name, rest) = rest.split_once(' ')?;
            let rest = rest.trim_start();
            // An upgrade names the installed version first: `[1.0] (1.1 ...)`.
            let rest = if rest.starts_with('[') { rest.split_once("] ")?.1 } else { rest };
            let ver = rest.strip_prefix('(')?.split_whitespace().next()?;
            Some((name.to_string(), ver.to_string()))
        })
        .collect()
}

/// Why apt cannot resolve: its `E:` lines and the unmet dependencies.
pub fn simulation_problems(out: &str) -> Vec<String> {
    let mut unmet = false;
    let mut p = Vec::new();
    for line in out.lines() {
        if let Some(e) = line.strip_prefix("E: ") {
            p.push(e.trim().to_string());
        } else if !line.starts_with(' ') {
            unmet = line.starts_with("The following packages have unmet dependencies");
        } else if unmet {
            p.push(line.trim().to_string());
        }
    }
    p
}

/// The versions `apt-cache madison` lists (newest first, as apt sorts them).
pub fn parse_madison(out: &str) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for l in out.lines() {
        let mut cols = l.split('|').map(str::trim);
        if let (Some(_), Some(ver)) = (cols.next(), cols.next()) {
            if !ver.is_empty() && !v.iter().any(|x| x == ver) {
                v.push(ver.to_string());
            }
        }
    }
    v
}

/// The version to fetch for `pin` among `available`: the pinned one, else
/// the first (newest) of its line, with a note saying so.
pub fn choose_version(pin: &Pin, available: &[String]) -> Result<(String, Option<String>)> {
    if available.iter().any(|v| v == pin.version) {
        return Ok((pin.version.to_string(), None));
    }
    match available.iter().find(|v| v.starts_with(pin.line)) {
        Some(v) => Ok((
            v.clone(),
            Some(format!(
                "{} {} has left the archive; using {v}, a newer release of the same line",
                pin.package, pin.version
            )),
        )),
        None => Err(anyhow!(
            "{} {} is not in the archive, nor any {}* (available: {})",
            pin.package,
            pin.version,
            pin.line,
            if available.is_empty() { "none".into() } else { available.join(", ") }
        )),
    }
}

/// Packages whose private copy cannot be used beside the machine's own
/// C library: when apt wants a newer one, the machine is too old.
const SYSTEM_ONLY: [&str; 2] = ["libc6", "libc-bin"];

/// Where the packages come from: apt with a private state, or a fake in
/// the host tests.
pub trait Archive {
    /// Refresh the package lists (network).
    fn update(&mut self) -> Result<()>;
    /// The versions of `package` the archive has, newest first.
    fn versions(&mut self, package: &str) -> Result<Vec<String>>;
    /// Every package (name, version) to unpack so that `wants` (exact
    /// versions) run on this machine, `wants` included.
    fn resolve(&mut self, wants: &[(String, String)], release: Option<&str>) -> Result<Vec<(String, String)>>;
    /// The SHA-256 the archive's index gives for the package, if any.
    fn sha256(&mut self, name: &str, version: &str) -> Result<Option<String>>;
    /// Downloads the package into `dir` (empty), returning the file.
    fn download(&mut self, name: &str, version: &str, dir: &Path) -> Result<PathBuf>;
}

/// A bundle ready to use.
#[derive(Clone, Debug)]
pub struct Installed {
    pub root: PathBuf,
    /// Found complete in the cache: no network access was made.
    pub hit: bool,
    /// The check's one-line result (e.g. the QEMU version).
    pub checked: String,
    /// The packages (name=version) in it.
    pub packages: Vec<String>,
    /// Pins that fell back to a newer point release.
    pub notes: Vec<String>,
}

const MANIFEST: &str = "manifest.txt";

/// The cache root (see the module doc).
pub fn cache_root() -> PathBuf {
    if let Some(d) = std::env::var_os("XTASK_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("hv-aarch64");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".cache").join("hv-aarch64")
}

/// The environment that makes the unpacked programs under `root` find
/// their libraries (before the machine's: see [`apply_env`]), QEMU's
/// modules and the bundle's tools.
pub fn env_for(root: &Path) -> Vec<(String, OsString)> {
    let mut libs: Vec<PathBuf> = Vec::new();
    for base in ["usr/lib", "lib"] {
        if let Ok(rd) = std::fs::read_dir(root.join(base)) {
            let mut dirs: Vec<PathBuf> = rd
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n.to_string_lossy().ends_with("-linux-gnu")))
                .collect();
            dirs.sort();
            libs.extend(dirs);
        }
    }
    let mut env = Vec::new();
    if !libs.is_empty() {
        let modules = libs.iter().map(|l| l.join("qemu")).find(|m| m.is_dir());
        env.push(("LD_LIBRARY_PATH".to_string(), std::env::join_paths(libs).unwrap_or_default()));
        if let Some(m) = modules {
            env.push(("QEMU_MODULE_DIR".to_string(), m.into_os_string()));
        }
    }
    env.push(("PATH".to_string(), root.join("usr/bin").into_os_string()));
    env
}

/// Adds `env` (from [`env_for`]) to `cmd`: the search paths go before the
/// ones this process has, other variables are set.
pub fn apply_env<'a>(cmd: &'a mut Command, env: &[(String, OsString)]) -> &'a mut Command {
    for (k, v) in env {
        match (k.as_str(), std::env::var_os(k)) {
            ("PATH" | "LD_LIBRARY_PATH", Some(old)) if !old.is_empty() => {
                let mut all: Vec<PathBuf> = std::env::split_paths(v).collect();
                all.extend(std::env::split_paths(&old));
                cmd.env(k, std::env::join_paths(all).unwrap_or_default());
            }
            _ => {
                cmd.env(k, v);
            }
        }
    }
    cmd
}

fn run_with(root: &Path, prog: &Path, args: &[&str]) -> Result<std::process::Output> {
    apply_env(&mut Command::new(prog), &env_for(root))
        .args(args)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .output()
        .with_context(|| prog.display().to_string())
}

/// `ldd` on `bin` with the bundle's libraries: an error naming the ones
/// still missing.
fn check_libraries(root: &Path, bin: &Path) -> Result<()> {
    let out = run_with(root, Path::new("ldd"), &[&bin.display().to_string()])?;
    let missing = missing_libraries(&String::from_utf8_lossy(&out.stdout));
    if missing.is_empty() {
        Ok(())
    } else {
        Err(anyhow!("{} needs libraries neither the machine nor the bundle has: {}", bin.display(), missing.join(", ")))
    }
}

/// QEMU's version, running `bin --version` with `env`.
pub fn probe_qemu(bin: &Path, env: &[(String, OsString)]) -> Result<Version> {
    let out = apply_env(&mut Command::new(bin), env)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("{}: cannot run it", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match parse_qemu_version(&text) {
        Some(v) if out.status.success() => Ok(v),
        _ => Err(anyhow!(
            "{} is not QEMU: `--version` printed {:?}{}",
            bin.display(),
            text.lines().next().unwrap_or(""),
            String::from_utf8_lossy(&out.stderr).lines().next().map(|l| format!(" ({l})")).unwrap_or_default()
        )),
    }
}

/// Runs the bundle's check on `root`: its one-line result, or why not.
pub fn check(bundle: &Bundle, root: &Path) -> Result<String> {
    match bundle.check {
        Check::Qemu => {
            let bin = root.join("usr/bin/qemu-system-aarch64");
            if !bin.is_file() {
                bail!("{} is missing", bin.display());
            }
            check_libraries(root, &bin)?;
            let v = probe_qemu(&bin, &env_for(root))?;
            Ok(format!("qemu-system-aarch64 {v}"))
        }
        Check::File(f) => {
            let p = root.join(f);
            match std::fs::metadata(&p) {
                Ok(m) if m.len() > 0 => Ok(format!("{f} ({} KiB)", m.len() >> 10)),
                _ => Err(anyhow!("{} is missing or empty", p.display())),
            }
        }
        Check::CrossTools => {
            let gcc = root.join("usr/bin/aarch64-linux-gnu-gcc");
            let fdtput = root.join("usr/bin/fdtput");
            for b in [&gcc, &fdtput] {
                if !b.exists() {
                    bail!("{} is missing", b.display());
                }
            }
            check_libraries(root, &fdtput)?;
            let src = root.join(".check.c");
            std::fs::write(&src, "int check(int x) { return x + 1; }\n").with_context(|| src.display().to_string())?;
            let obj = root.join(".check.o");
            let out = run_with(root, &gcc, &["-c", &src.display().to_string(), "-o", &obj.display().to_string()])?;
            let _ = std::fs::remove_file(&src);
            let _ = std::fs::remove_file(&obj);
            if !out.status.success() {
                bail!("the cross compiler does not compile: {}", String::from_utf8_lossy(&out.stderr).trim());
            }
            let v = run_with(root, &gcc, &["-dumpfullversion"])?;
            Ok(format!("aarch64-linux-gnu-gcc {}, fdtput", String::from_utf8_lossy(&v.stdout).trim()))
        }
    }
}

fn read_manifest(dir: &Path) -> Option<(Vec<String>, Vec<String>)> {
    let text = std::fs::read_to_string(dir.join(MANIFEST)).ok()?;
    let pick = |key: &str| -> Vec<String> {
        text.lines().filter_map(|l| l.strip_prefix(key)).map(|s| s.trim().to_string()).collect()
    };
    Some((pick("package:"), pick("note:")))
}

/// The bundle as the cache holds it, without checking or fetching
/// anything: its packages when complete.
pub fn cached(bundle: &Bundle, cache: &Path) -> Option<Vec<String>> {
    read_manifest(&cache.join(bundle.name)).map(|m| m.0)
}

/// `name_version_arch.deb` as apt names it (the epoch colon as `%3a`).
fn deb_prefix(name: &str, version: &str) -> String {
    format!("{name}_{}_", version.replace(':', "%3a"))
}

fn sha256_of(file: &Path) -> Result<String> {
    let out = Command::new("sha256sum").arg(file).output().context("sha256sum")?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .map(String::from)
        .filter(|_| out.status.success())
        .ok_or_else(|| anyhow!("sha256sum {} failed", file.display()))
}

/// Whether `deb` is the package `name` `version` the archive lists.
fn verify_deb(deb: &Path, name: &str, version: &str, sha: Option<&str>) -> Result<()> {
    if let Some(want) = sha {
        let got = sha256_of(deb)?;
        if got != want {
            bail!("SHA-256 {got}, the archive lists {want}");
        }
    }
    let out = Command::new("dpkg-deb")
        .args(["--field"])
        .arg(deb)
        .args(["Package", "Version"])
        .env("LC_ALL", "C")
        .output()
        .context("dpkg-deb")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| text.lines().find_map(|l| l.strip_prefix(k)).map(str::trim).unwrap_or("");
    if !out.status.success() {
        bail!("not a Debian package ({})", String::from_utf8_lossy(&out.stderr).trim());
    }
    if field("Package:") != name || field("Version:") != version {
        bail!("it holds {}={}", field("Package:"), field("Version:"));
    }
    Ok(())
}

/// The verified `.deb` of `name` `version` in `debs`, downloading it when
/// it is not there (or is corrupt: then it is removed and fetched again).
fn fetch_deb(archive: &mut dyn Archive, debs: &Path, name: &str, version: &str) -> Result<PathBuf> {
    let sha = archive.sha256(name, version)?;
    let prefix = deb_prefix(name, version);
    let cached = std::fs::read_dir(debs).ok().and_then(|rd| {
        rd.filter_map(|e| e.ok()).map(|e| e.path()).find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix) && n.to_string_lossy().ends_with(".deb"))
        })
    });
    if let Some(p) = cached {
        if verify_deb(&p, name, version, sha.as_deref()).is_ok() {
            return Ok(p);
        }
        eprintln!("xtask: cached {} is corrupt; removing it and downloading it again", p.display());
        let _ = std::fs::remove_file(&p);
    }
    let tmp = debs.join(format!(".download-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| tmp.display().to_string())?;
    let result = archive.download(name, version, &tmp).and_then(|file| {
        verify_deb(&file, name, version, sha.as_deref())
            .map_err(|e| anyhow!("the downloaded {name}={version} is corrupt ({e:#}); it was removed: run again"))?;
        let dest = debs.join(file.file_name().context("download without a file name")?);
        std::fs::rename(&file, &dest).with_context(|| dest.display().to_string())?;
        Ok(dest)
    });
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// Takes the cache's lock for this process (released when the file drops):
/// two xtask processes never install into one cache at once.
fn lock(cache: &Path) -> Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(cache.join(".lock"))
        .with_context(|| cache.join(".lock").display().to_string())?;
    f.lock().with_context(|| format!("locking {}", cache.join(".lock").display()))?;
    Ok(f)
}

fn writable_cache(cache: &Path) -> Result<()> {
    std::fs::create_dir_all(cache.join("debs")).map_err(|e| {
        anyhow!(
            "cannot write the toolchain cache {} ({e}); set XTASK_CACHE_DIR to a writable directory, \
             or pass --qemu with a QEMU of your own",
            cache.display()
        )
    })
}

/// Makes `bundle` ready in `cache` (see the module doc for the steps):
/// from the cache when it is complete and passes its check, else fetched
/// from `archive`. `say` gets the progress lines.
pub fn ensure(
    bundle: &Bundle,
    cache: &Path,
    archive: &mut dyn Archive,
    say: &mut dyn FnMut(&str),
) -> Result<Installed> {
    writable_cache(cache)?;
    let _lock = lock(cache)?;
    let dir = cache.join(bundle.name);
    if let Some((packages, notes)) = read_manifest(&dir) {
        match check(bundle, &dir) {
            Ok(checked) => return Ok(Installed { root: dir, hit: true, checked, packages, notes }),
            Err(e) => say(&format!(
                "the cached {} in {} fails its check ({e:#}); fetching it again",
                bundle.what,
                dir.display()
            )),
        }
    }
    // Leftovers: this bundle's interrupted installs and an incomplete tree.
    if let Ok(rd) = std::fs::read_dir(cache) {
        let tmp_prefix = format!("{}.tmp-", bundle.name);
        for e in rd.filter_map(|e| e.ok()) {
            if e.file_name().to_string_lossy().starts_with(&tmp_prefix) {
                say(&format!("removing {} (an interrupted install)", e.path().display()));
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| dir.display().to_string())?;
    }
    say(&format!("fetching {} ({}) into {}", bundle.what, bundle.name, dir.display()));
    archive.update()?;
    let mut wants = Vec::new();
    let mut notes = Vec::new();
    for pin in bundle.pins {
        let (v, note) = choose_version(pin, &archive.versions(pin.package)?)?;
        if let Some(n) = note {
            say(&n);
            notes.push(n);
        }
        wants.push((pin.package.to_string(), v));
    }
    let all = archive.resolve(&wants, bundle.release)?;
    if let Some((n, v)) = all.iter().find(|(n, _)| SYSTEM_ONLY.contains(&n.as_str())) {
        bail!(
            "{} needs {n} {v}, newer than this machine's C library; update the machine's packages, \
             or pass --qemu with a QEMU of your own",
            bundle.what
        );
    }
    let debs = cache.join("debs");
    let mut files = Vec::new();
    for (n, v) in &all {
        files.push(fetch_deb(archive, &debs, n, v)?);
    }
    let tmp = cache.join(format!("{}.tmp-{}", bundle.name, std::process::id()));
    let result = (|| {
        std::fs::create_dir_all(&tmp).with_context(|| tmp.display().to_string())?;
        for f in &files {
            let out = Command::new("dpkg-deb").arg("-x").arg(f).arg(&tmp).output().context("dpkg-deb")?;
            if !out.status.success() {
                let _ = std::fs::remove_file(f);
                bail!(
                    "{} does not unpack ({}); it was removed: run again",
                    f.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        let checked = check(bundle, &tmp).with_context(|| format!("{} does not work after unpacking", bundle.what))?;
        let packages: Vec<String> = all.iter().map(|(n, v)| format!("{n}={v}")).collect();
        let mut m =
            format!("# {} for this project, unpacked by cargo xtask (see xtask/src/toolchain.rs)\n", bundle.what);
        m += &format!("checked: {checked}\n");
        for p in &packages {
            m += &format!("package: {p}\n");
        }
        for n in &notes {
            m += &format!("note: {n}\n");
        }
        std::fs::write(tmp.join(MANIFEST), m).with_context(|| tmp.join(MANIFEST).display().to_string())?;
        std::fs::rename(&tmp, &dir).with_context(|| dir.display().to_string())?;
        Ok(Installed { root: dir.clone(), hit: false, checked, packages, notes: notes.clone() })
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// apt's options for a private state under `dir` (sources list, lists,
/// cache; the status file too when `status` is given, else the machine's,
/// read only): the machine's apt configuration and state are not changed.
pub fn apt_opts(dir: &Path, status: Option<&Path>) -> Vec<String> {
    let d = dir.display();
    let mut o = vec![
        format!("-oDir::State::Lists={d}/lists"),
        format!("-oDir::Cache={d}/cache"),
        format!("-oDir::Etc::SourceList={d}/sources.list"),
        format!("-oDir::Etc::SourceParts={d}/sources.list.d"),
        format!("-oDir::Etc::Preferences={d}/preferences"),
        format!("-oDir::Etc::PreferencesParts={d}/preferences.d"),
        "-oAPT::Sandbox::User=root".into(),
        "-oAcquire::Languages=none".into(),
        // A slow or dead mirror fails in bounded time.
        "-oAcquire::Retries=2".into(),
        "-oAcquire::http::Timeout=30".into(),
    ];
    if let Some(s) = status {
        o.push(format!("-oDir::State::status={}", s.display()));
    }
    o
}

/// Makes the private apt directory (`sources` is the sources list's text).
pub fn apt_dir(dir: &Path, sources: &str) -> Result<()> {
    for d in ["lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"] {
        std::fs::create_dir_all(dir.join(d)).with_context(|| dir.join(d).display().to_string())?;
    }
    std::fs::write(dir.join("sources.list"), sources).with_context(|| dir.join("sources.list").display().to_string())
}

/// Debian's mirrors (overridable as for guest-images/build.sh).
pub fn mirrors() -> (String, String) {
    (
        std::env::var("DEBIAN_MIRROR").unwrap_or_else(|_| "http://deb.debian.org/debian".into()),
        std::env::var("DEBIAN_SECURITY").unwrap_or_else(|_| "http://deb.debian.org/debian-security".into()),
    )
}

/// The real archive: Debian bookworm (with updates, security and
/// backports) through apt with a private state in `<cache>/apt`, resolving
/// against the machine's installed packages.
pub struct Apt {
    dir: PathBuf,
}

impl Apt {
    pub fn new(cache: &Path) -> Self {
        Apt { dir: cache.join("apt") }
    }

    fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new(prog);
        c.args(apt_opts(&self.dir, None)).env("LC_ALL", "C").stdin(Stdio::null());
        c
    }

    fn output(&self, mut c: Command, what: &str) -> Result<String> {
        let out = c.output().map_err(|e| anyhow!("{what}: {e} (apt is needed to fetch the toolchain)"))?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if out.status.success() {
            Ok(text)
        } else {
            Err(anyhow!("{what} failed:\n{}", text.trim()))
        }
    }
}

impl Archive for Apt {
    fn update(&mut self) -> Result<()> {
        let key = "/usr/share/keyrings/debian-archive-keyring.gpg";
        let (m, s) = mirrors();
        let sources = format!(
            "deb [signed-by={key}] {m} bookworm main\n\
             deb [signed-by={key}] {m} bookworm-updates main\n\
             deb [signed-by={key}] {m} bookworm-backports main\n\
             deb [signed-by={key}] {s} bookworm-security main\n"
        );
        apt_dir(&self.dir, &sources)?;
        let mut c = self.cmd("apt-get");
        c.args(["-q", "update"]);
        let out = self.output(c, "apt-get update (private lists)").map_err(|e| {
            anyhow!("{e:#}\nThe Debian archive could not be reached; the toolchain cannot be fetched. Run again when it can, or pass --qemu")
        })?;
        // apt-get update exits 0 when some index failed: say so.
        if let Some(l) = out.lines().find(|l| l.starts_with("E: ") || l.starts_with("W: Failed to fetch")) {
            bail!("apt-get update (private lists): {l}; the toolchain cannot be fetched now");
        }
        Ok(())
    }

    fn versions(&mut self, package: &str) -> Result<Vec<String>> {
        let mut c = self.cmd("apt-cache");
        c.args(["madison", package]);
        Ok(parse_madison(&self.output(c, "apt-cache madison")?))
    }

    fn resolve(&mut self, wants: &[(String, String)], release: Option<&str>) -> Result<Vec<(String, String)>> {
        let mut c = self.cmd("apt-get");
        c.args(["-s", "install", "--no-install-recommends"]);
        if let Some(r) = release {
            c.args(["-t", r]);
        }
        c.args(wants.iter().map(|(n, v)| format!("{n}={v}")));
        let out = c.output().context("apt-get")?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let problems = simulation_problems(&text);
        if !out.status.success() || !problems.is_empty() {
            bail!("apt cannot resolve {:?} on this machine: {}", wants, problems.join("; "));
        }
        let mut all = parse_simulation(&text);
        // Wanted packages already installed at that version: unpack them too.
        for w in wants {
            if !all.iter().any(|(n, _)| n == &w.0) {
                all.push(w.clone());
            }
        }
        Ok(all)
    }

    fn sha256(&mut self, name: &str, version: &str) -> Result<Option<String>> {
        let mut c = self.cmd("apt-cache");
        c.args(["show", &format!("{name}={version}")]);
        let out = self.output(c, "apt-cache show")?;
        Ok(out.lines().find_map(|l| l.strip_prefix("SHA256:")).map(|s| s.trim().to_string()))
    }

    fn download(&mut self, name: &str, version: &str, dir: &Path) -> Result<PathBuf> {
        let mut c = self.cmd("apt-get");
        c.current_dir(dir).args(["-q", "download", &format!("{name}={version}")]);
        self.output(c, &format!("apt-get download {name}={version}"))?;
        std::fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .ok_or_else(|| anyhow!("apt-get download {name}={version} left no .deb"))
    }
}

/// Makes `bundle` ready in the project's cache with the real archive,
/// printing one line saying where it came from.
pub fn ensure_project(bundle: &Bundle) -> Result<Installed> {
    let cache = cache_root();
    let mut say = |s: &str| eprintln!("xtask: {s}");
    let start = std::time::Instant::now();
    let i = ensure(bundle, &cache, &mut Apt::new(&cache), &mut say)?;
    if i.hit {
        eprintln!("xtask: {}: {} from the cache {} (no download)", bundle.what, i.checked, i.root.display());
    } else {
        eprintln!(
            "xtask: {}: {} fetched in {:.0} s into {}",
            bundle.what,
            i.checked,
            start.elapsed().as_secs_f64(),
            i.root.display()
        );
    }
    for n in &i.notes {
        eprintln!("xtask: note: {n}");
    }
    Ok(i)
}

/// The QEMU every run uses: the project's (fetched into the cache) or the
/// user's (`--qemu PATH` or `XTASK_QEMU`).
#[derive(Debug)]
pub struct Qemu {
    pub bin: PathBuf,
    pub version: Version,
    /// Environment the binary needs (the bundle's libraries and modules).
    pub env: Vec<(String, OsString)>,
    /// Where it came from, for the first line of every run.
    pub origin: String,
    cpu_models: std::sync::OnceLock<Vec<String>>,
}

/// The environment variable naming a QEMU of the user's (`--qemu` sets it).
pub const QEMU_ENV: &str = "XTASK_QEMU";

impl Qemu {
    /// The user's QEMU at `bin`: it must run, say it is QEMU, and be
    /// [`MIN_QEMU`] or newer.
    pub fn user(bin: &Path, how: &str) -> Result<Qemu> {
        let version = probe_qemu(bin, &[]).with_context(|| how.to_string())?;
        if version < MIN_QEMU {
            bail!(
                "{how} {}: QEMU {version} is too old; the runs need QEMU {MIN_QEMU} or newer (the project's own is 10.0: drop {how})",
                bin.display()
            );
        }
        Ok(Qemu {
            bin: bin.to_path_buf(),
            version,
            env: Vec::new(),
            origin: format!("{how} {}", bin.display()),
            cpu_models: Default::default(),
        })
    }

    /// The project's QEMU from the cache (fetched when missing).
    pub fn project() -> Result<Qemu> {
        let i = ensure_project(&QEMU)?;
        let bin = i.root.join("usr/bin/qemu-system-aarch64");
        let env = env_for(&i.root);
        let version = probe_qemu(&bin, &env)?;
        let origin =
            format!("the project's, {}{}", i.root.display(), if i.hit { ", cache hit" } else { ", just fetched" });
        Ok(Qemu { bin, version, env, origin, cpu_models: Default::default() })
    }

    /// A command running this QEMU.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        apply_env(&mut c, &self.env);
        c
    }

    /// The command line as a user can paste it, the environment first.
    pub fn printable(&self, args: &[String]) -> String {
        let mut s = String::new();
        for (k, v) in &self.env {
            if k != "PATH" {
                s += &format!("{k}={} ", v.to_string_lossy());
            }
        }
        s += &self.bin.display().to_string();
        s + &crate::text::printable_args(args)
    }

    /// The CPU models `-cpu help` lists (asked once).
    pub fn cpu_models(&self) -> &[String] {
        self.cpu_models.get_or_init(|| {
            let out = self.command().args(["-machine", "virt", "-cpu", "help"]).stdin(Stdio::null()).output();
            out.map(|o| parse_cpu_models(&String::from_utf8_lossy(&o.stdout))).unwrap_or_default()
        })
    }

    /// Whether this QEMU has what a run with CPU model `cpu` (QEMU's
    /// `-cpu` value) needs; an error naming what is missing.
    pub fn require_cpu(&self, cpu: &str) -> Result<()> {
        let model = cpu.split(',').next().unwrap_or(cpu);
        if self.cpu_models().iter().any(|m| m == model) {
            return Ok(());
        }
        Err(anyhow!(
            "QEMU {} ({}) has no CPU model {model}; use the project's QEMU 10.0 (drop --qemu / {QEMU_ENV}) or another --cpu",
            self.version, self.origin
        ))
    }
}

/// The model names in `qemu-system-aarch64 -cpu help`'s output
/// (`Available CPUs:` then one `  name` a line).
pub fn parse_cpu_models(out: &str) -> Vec<String> {
    out.lines().filter(|l| l.starts_with(' ')).filter_map(|l| l.split_whitespace().next()).map(String::from).collect()
}

static QEMU_SELECTED: std::sync::Mutex<Option<&'static Qemu>> = std::sync::Mutex::new(None);

/// The QEMU of this process: `XTASK_QEMU` when set, else the project's.
/// Chosen (and, the first time, fetched) once; its origin and version are
/// printed then.
pub fn qemu() -> Result<&'static Qemu> {
    let mut g = QEMU_SELECTED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(q) = *g {
        return Ok(q);
    }
    let q = match std::env::var_os(QEMU_ENV).filter(|v| !v.is_empty()) {
        Some(p) => Qemu::user(Path::new(&p), "--qemu (XTASK_QEMU)")?,
        None => Qemu::project()?,
    };
    if q.env.is_empty() {
        // The project's said where it came from when it was made ready.
        eprintln!("xtask: QEMU {} ({})", q.version, q.origin);
    }
    let q: &'static Qemu = Box::leak(Box::new(q));
    *g = Some(q);
    Ok(q)
}

/// EDK2's firmware image: `XTASK_EDK2` when set, else the project's.
pub fn edk2() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("XTASK_EDK2").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() { Ok(p) } else { Err(anyhow!("XTASK_EDK2 {}: no such file", p.display())) };
    }
    static FD: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(p) = FD.get() {
        return Ok(p.clone());
    }
    let i = ensure_project(&EDK2)?;
    Ok(FD.get_or_init(|| i.root.join(EDK2_FD)).clone())
}

/// The TF-A build tools' root (its `usr/bin` goes first on PATH, see
/// [`env_for`]).
pub fn tfa_tools() -> Result<PathBuf> {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(p) = ROOT.get() {
        return Ok(p.clone());
    }
    let i = ensure_project(&TFA_TOOLS)?;
    Ok(ROOT.get_or_init(|| i.root).clone())
}

#[cfg(test)]
mod tests;
