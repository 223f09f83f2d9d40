use super::*;
use std::collections::BTreeMap;

#[test]
fn qemu_versions_ldd_and_cpu_lists_are_read() {
    assert_eq!(
        parse_qemu_version("QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)\nCopyright"),
        Some(Version(10, 0, 2))
    );
    assert_eq!(
        parse_qemu_version("QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u18)"),
        Some(Version(7, 2, 19))
    );
    assert_eq!(parse_qemu_version("QEMU emulator version 8.1\n"), Some(Version(8, 1, 0)));
    assert_eq!(parse_qemu_version("true (GNU coreutils) 9.1"), None);
    assert_eq!(parse_qemu_version(""), None);
    assert!(Version(7, 2, 19) >= MIN_QEMU && Version(7, 1, 0) < MIN_QEMU);
    let ldd = "\tlinux-vdso.so.1 (0x00007ffc)\n\tlibfdt.so.1 => not found\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x7f)\n\tlibslirp.so.0 => not found\n";
    assert_eq!(missing_libraries(ldd), ["libfdt.so.1", "libslirp.so.0"]);
    let cpus = "Available CPUs:\n  a64fx\n  cortex-a72\n  max\n  neoverse-n1\n  neoverse-v1\n";
    assert_eq!(parse_cpu_models(cpus), ["a64fx", "cortex-a72", "max", "neoverse-n1", "neoverse-v1"]);
}

// `LC_ALL=C apt-get -s install --no-install-recommends -t bookworm-backports
// qemu-system-arm=...` on a fresh machine of this kind (shortened).
const SIMULATION: &str = "Reading package lists...
The following NEW packages will be installed:
  libfdt1 qemu-system-arm
Inst libfdt1 (1.6.1-4+b1 Debian:12.15/oldstable [amd64])
Inst libbrlapi0.8 (6.7-3.1+deb13u3~bpo12+1 Debian Backports:oldstable-backports [amd64])
Inst libglib2.0-0 [2.74.6-2] (2.74.6-2+deb12u7 Debian-Security:12/oldstable-security [amd64])
Inst qemu-system-arm (1:10.0.2+ds-2+deb13u1~bpo12+1 Debian Backports:oldstable-backports [amd64])
Conf libfdt1 (1.6.1-4+b1 Debian:12.15/oldstable [amd64])
";

#[test]
fn apt_simulation_madison_and_pins_are_read() {
    assert_eq!(
        parse_simulation(SIMULATION),
        [
            ("libfdt1".to_string(), "1.6.1-4+b1".to_string()),
            ("libbrlapi0.8".into(), "6.7-3.1+deb13u3~bpo12+1".into()),
            ("libglib2.0-0".into(), "2.74.6-2+deb12u7".into()),
            ("qemu-system-arm".into(), "1:10.0.2+ds-2+deb13u1~bpo12+1".into()),
        ]
    );
    assert!(simulation_problems(SIMULATION).is_empty());
    let unmet = "The following packages have unmet dependencies:\n qemu-system-arm : Depends: libfoo (>= 2) but 1 is to be installed\nE: Unable to correct problems, you have held broken packages.\n";
    assert_eq!(simulation_problems(unmet).len(), 2);
    let madison = " qemu-system-arm | 1:10.0.3+ds-1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages\n qemu-system-arm | 1:7.2+dfsg-7+deb12u18 | http://deb.debian.org/debian bookworm/main amd64 Packages\n";
    let v = parse_madison(madison);
    assert_eq!(v, ["1:10.0.3+ds-1~bpo12+1", "1:7.2+dfsg-7+deb12u18"]);
    // The pin left the archive: the newest of its line, said out loud.
    let (got, note) = choose_version(&QEMU.pins[0], &v).unwrap();
    assert_eq!(got, "1:10.0.3+ds-1~bpo12+1");
    assert!(note.unwrap().contains("has left the archive"));
    let exact = [QEMU_VERSION.to_string()];
    assert_eq!(choose_version(&QEMU.pins[0], &exact).unwrap(), (QEMU_VERSION.to_string(), None));
    let e = format!("{:#}", choose_version(&QEMU.pins[0], &v[1..]).unwrap_err());
    assert!(e.contains("1:10.0.*") && e.contains("1:7.2"), "{e}");
}

/// An archive of real `.deb` files made by the test, counting its network
/// calls; `deps` says what else each package needs.
struct Fake {
    debs: BTreeMap<(String, String), PathBuf>,
    sha: BTreeMap<(String, String), String>,
    deps: BTreeMap<String, Vec<String>>,
    updates: u32,
    downloads: u32,
    fail_downloads: bool,
}

impl Archive for Fake {
    fn update(&mut self) -> Result<()> {
        self.updates += 1;
        Ok(())
    }
    fn versions(&mut self, package: &str) -> Result<Vec<String>> {
        Ok(self.debs.keys().filter(|(n, _)| n == package).map(|(_, v)| v.clone()).collect())
    }
    fn resolve(&mut self, wants: &[(String, String)], _release: Option<&str>) -> Result<Vec<(String, String)>> {
        let mut all = wants.to_vec();
        for (n, _) in wants {
            for d in self.deps.get(n).cloned().unwrap_or_default() {
                let v = self.versions(&d)?.first().cloned().with_context(|| format!("no {d}"))?;
                all.push((d.clone(), v));
            }
        }
        Ok(all)
    }
    fn sha256(&mut self, name: &str, version: &str) -> Result<Option<String>> {
        Ok(self.sha.get(&(name.into(), version.into())).cloned())
    }
    fn download(&mut self, name: &str, version: &str, dir: &Path) -> Result<PathBuf> {
        self.downloads += 1;
        if self.fail_downloads {
            bail!("apt-get download {name}={version} failed: Could not resolve 'deb.debian.org'");
        }
        let src = &self.debs[&(name.to_string(), version.to_string())];
        let dest = dir.join(src.file_name().unwrap());
        std::fs::copy(src, &dest)?;
        Ok(dest)
    }
}

fn sh(cmd: &mut Command) {
    let out = cmd.output().expect("running a test tool");
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A `.deb` of `name` `version` holding `files` (path, source file).
fn make_deb(dir: &Path, name: &str, version: &str, files: &[(&str, &Path)]) -> PathBuf {
    let tree = dir.join(format!("tree-{name}"));
    std::fs::create_dir_all(tree.join("DEBIAN")).unwrap();
    std::fs::write(
        tree.join("DEBIAN/control"),
        format!("Package: {name}\nVersion: {version}\nArchitecture: amd64\nMaintainer: t <t@t>\nDescription: test\n"),
    )
    .unwrap();
    for (p, src) in files {
        let to = tree.join(p);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(src, &to).unwrap();
    }
    let deb = dir.join(format!("{}amd64.deb", deb_prefix(name, version)));
    sh(Command::new("dpkg-deb").args(["--root-owner-group", "-Zgzip", "--build"]).arg(&tree).arg(&deb));
    deb
}

/// A fake QEMU (an ELF that prints QEMU's version line) that needs
/// `libhvfake.so.1`, shipped in its own package.
fn fake_archive(dir: &Path) -> Fake {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("lib.c"), "int hvfake_answer(void) { return 42; }\n").unwrap();
    std::fs::write(
        dir.join("main.c"),
        "#include <stdio.h>\nint hvfake_answer(void);\nint main(void) { printf(\"QEMU emulator version 10.0.2 (fake %d)\\n\", hvfake_answer()); return 0; }\n",
    )
    .unwrap();
    sh(Command::new("cc").current_dir(dir).args([
        "-shared",
        "-fPIC",
        "-Wl,-soname,libhvfake.so.1",
        "-o",
        "libhvfake.so.1",
        "lib.c",
    ]));
    sh(Command::new("cc").current_dir(dir).args(["-o", "qemu", "main.c", "-L.", "-l:libhvfake.so.1"]));
    let mut f = Fake {
        debs: BTreeMap::new(),
        sha: BTreeMap::new(),
        deps: BTreeMap::new(),
        updates: 0,
        downloads: 0,
        fail_downloads: false,
    };
    let q = make_deb(dir, "qemu-system-arm", "1:10.0.2", &[("usr/bin/qemu-system-aarch64", &dir.join("qemu"))]);
    let l =
        make_deb(dir, "libhvfake1", "1.0", &[("usr/lib/x86_64-linux-gnu/libhvfake.so.1", &dir.join("libhvfake.so.1"))]);
    for (n, v, d) in [("qemu-system-arm", "1:10.0.2", q), ("libhvfake1", "1.0", l)] {
        f.sha.insert((n.into(), v.into()), sha256_of(&d).unwrap());
        f.debs.insert((n.into(), v.into()), d);
    }
    f.deps.insert("qemu-system-arm".into(), vec!["libhvfake1".into()]);
    f
}

const TEST_BUNDLE: Bundle = Bundle {
    name: "qemu-test",
    what: "QEMU",
    release: None,
    pins: &[Pin { package: "qemu-system-arm", version: "1:10.0.2", line: "1:10.0." }],
    check: Check::Qemu,
};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xtask-toolchain-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn the_install_state_machine_against_a_fake_archive() {
    let d = scratch("sm");
    let mut a = fake_archive(&d.join("archive"));
    let cache = d.join("cache");
    let mut lines = Vec::new();
    let mut say = |s: &str| lines.push(s.to_string());

    // A half-written cache: an interrupted install and a tree without its
    // manifest. Neither is used; both are replaced.
    std::fs::create_dir_all(cache.join("qemu-test.tmp-999/usr/bin")).unwrap();
    std::fs::create_dir_all(cache.join("qemu-test/usr/bin")).unwrap();
    std::fs::write(cache.join("qemu-test/usr/bin/qemu-system-aarch64"), "#!/bin/sh\necho half\n").unwrap();
    let i = ensure(&TEST_BUNDLE, &cache, &mut a, &mut say).expect("a fresh install");
    assert!(!i.hit);
    assert_eq!(i.checked, "qemu-system-aarch64 10.0.2");
    assert_eq!(i.packages, ["qemu-system-arm=1:10.0.2", "libhvfake1=1.0"]);
    assert!(!cache.join("qemu-test.tmp-999").exists());
    assert!(cache.join("qemu-test/manifest.txt").is_file());
    assert_eq!((a.updates, a.downloads), (1, 2));
    // It runs, with the bundle's environment.
    let q = Qemu::user(&i.root.join("usr/bin/qemu-system-aarch64"), "test");
    assert!(q.is_err(), "without the bundle's libraries the binary must not start");
    assert_eq!(probe_qemu(&i.root.join("usr/bin/qemu-system-aarch64"), &env_for(&i.root)).unwrap(), Version(10, 0, 2));

    // The second time: a cache hit, no network.
    let i = ensure(&TEST_BUNDLE, &cache, &mut a, &mut say).unwrap();
    assert!(i.hit);
    assert_eq!((a.updates, a.downloads), (1, 2));

    // A cached tree that stopped working (a library gone) is fetched again,
    // from the verified .debs already downloaded.
    std::fs::remove_file(cache.join("qemu-test/usr/lib/x86_64-linux-gnu/libhvfake.so.1")).unwrap();
    let i = ensure(&TEST_BUNDLE, &cache, &mut a, &mut say).unwrap();
    assert!(!i.hit);
    assert_eq!((a.updates, a.downloads), (2, 2));
    assert!(lines.iter().any(|l| l.contains("fails its check")), "{lines:?}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_corrupt_package_a_missing_library_and_a_failed_download_install_nothing() {
    let d = scratch("bad");
    let mut a = fake_archive(&d.join("archive"));
    let cache = d.join("cache");
    let mut say = |_: &str| {};

    // A corrupt download (truncated): refused, removed, nothing installed.
    let q = a.debs[&("qemu-system-arm".to_string(), "1:10.0.2".to_string())].clone();
    let good = std::fs::read(&q).unwrap();
    std::fs::write(&q, &good[..good.len() / 2]).unwrap();
    let e = format!("{:#}", ensure(&TEST_BUNDLE, &cache, &mut a, &mut say).unwrap_err());
    assert!(e.contains("qemu-system-arm=1:10.0.2 is corrupt") && e.contains("SHA-256"), "{e}");
    assert!(!cache.join("qemu-test").exists());
    let left: Vec<_> =
        std::fs::read_dir(cache.join("debs")).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    assert!(!left.iter().any(|n| n.to_string_lossy().starts_with("qemu-system-arm")), "{left:?}");

    // A corrupt .deb already in the cache is downloaded again.
    std::fs::write(&q, &good).unwrap();
    std::fs::write(cache.join("debs").join(q.file_name().unwrap()), b"garbage").unwrap();
    let before = a.downloads;
    ensure(&TEST_BUNDLE, &cache, &mut a, &mut say).expect("the corrupt cached .deb is replaced");
    assert!(a.downloads > before);
    std::fs::remove_dir_all(&cache).unwrap();

    // A missing library (the resolution forgot it): the check names it and
    // nothing is left half-installed.
    a.deps.clear();
    let e = format!("{:#}", ensure(&TEST_BUNDLE, &cache, &mut a, &mut say).unwrap_err());
    assert!(e.contains("libhvfake.so.1") && e.contains("needs libraries"), "{e}");
    assert!(!cache.join("qemu-test").exists());
    assert!(std::fs::read_dir(&cache).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().contains(".tmp-")));

    // A download that fails (registry unreachable).
    std::fs::remove_dir_all(&cache).unwrap();
    a.deps.insert("qemu-system-arm".into(), vec!["libhvfake1".into()]);
    a.fail_downloads = true;
    let e = format!("{:#}", ensure(&TEST_BUNDLE, &cache, &mut a, &mut say).unwrap_err());
    assert!(e.contains("Could not resolve"), "{e}");
    assert!(!cache.join("qemu-test").exists());

    // A cache that cannot be written: one line saying what to do.
    let file = d.join("a-file");
    std::fs::write(&file, "").unwrap();
    let e = format!("{:#}", ensure(&TEST_BUNDLE, &file.join("cache"), &mut a, &mut say).unwrap_err());
    assert!(e.contains("cannot write the toolchain cache") && e.contains("XTASK_CACHE_DIR"), "{e}");

    // A pin with no version of its line in the archive.
    a.fail_downloads = false;
    a.debs.retain(|(n, _), _| n != "qemu-system-arm");
    let e = format!("{:#}", ensure(&TEST_BUNDLE, &cache, &mut a, &mut say).unwrap_err());
    assert!(e.contains("is not in the archive"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_user_qemu_that_is_not_qemu_or_too_old_is_refused() {
    let e = format!("{:#}", Qemu::user(Path::new("/bin/true"), "--qemu").unwrap_err());
    assert!(e.contains("is not QEMU"), "{e}");
    let e = format!("{:#}", Qemu::user(Path::new("/nonexistent/qemu"), "--qemu").unwrap_err());
    assert!(e.contains("cannot run it"), "{e}");
    let d = scratch("old");
    std::fs::create_dir_all(&d).unwrap();
    let old = d.join("qemu-system-aarch64");
    std::fs::write(&old, "#!/bin/sh\necho 'QEMU emulator version 6.2.0 (Debian 1:6.2+dfsg-2ubuntu6)'\n").unwrap();
    sh(Command::new("chmod").arg("+x").arg(&old));
    let e = format!("{:#}", Qemu::user(&old, "--qemu").unwrap_err());
    assert!(e.contains("QEMU 6.2.0 is too old") && e.contains("7.2.0 or newer"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}
