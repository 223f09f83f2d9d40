//! Keeps `docs/ARCHITECTURE.md`, README's "Architecture" section and the
//! crates' module lists true to the tree (host tests only):
//!
//! - every `.rs` file and module directory under `hypervisor/src` and
//!   `xtask/src`, every integration test, fuzz target and platform directory
//!   is named in the document (as a code span with its full path);
//! - every repository path the document or README's section names exists,
//!   and every item path (`runtime::vcpu::run_vcpu`, `Vgic::sync_lrs`) is
//!   defined by a module of the hypervisor or xtask crate;
//! - README's section links the document and names every top-level
//!   directory;
//! - `lib.rs` and the module-index files name every module they declare;
//! - inline assembly and `unsafe` stay where the document says.
//!
//! Each failure names the path, item or module and what to do about it.

use crate::checks::deps::is_ident as is_ident_char;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const DOC: &str = "docs/ARCHITECTURE.md";

/// First segments of item paths that belong to other crates.
const EXTERNAL: &[&str] = &[
    "core",
    "alloc",
    "std",
    "aarch64_cpu",
    "tock_registers",
    "log",
    "spin",
    "arm_gic",
    "virtio_drivers",
    "fdt",
    "vm_fdt",
    "buddy_system_allocator",
    "clap",
    "serde",
    "serde_json",
    "clippy",
];

/// Files whose `//!` docs list the modules they declare.
const MODULE_INDEXES: &[&str] = &[
    "hypervisor/src/lib.rs",
    "hypervisor/core/src/lib.rs",
    "hypervisor/machine/src/lib.rs",
    "hypervisor/src/runtime/mod.rs",
    "hypervisor/src/runtime/vcpu/mod.rs",
    "hypervisor/src/runtime/devices/mod.rs",
    "hypervisor/arch/src/lib.rs",
    "hypervisor/arch/src/gic/mod.rs",
    "hypervisor/machine/src/boot/mod.rs",
    "hypervisor/machine/src/boot/plan/mod.rs",
    "hypervisor/machine/src/domain/vmplan/mod.rs",
    "hypervisor/src/runloop/mod.rs",
    "hypervisor/core/src/sched/mod.rs",
    "hypervisor/core/src/vgic/mod.rs",
    "hypervisor/core/src/virtio/blk/mod.rs",
    "xtask/src/lib.rs",
    "xtask/src/build/mod.rs",
    "xtask/src/checks/mod.rs",
    "xtask/src/firmware/mod.rs",
    "xtask/src/platform/mod.rs",
    "xtask/src/run/mod.rs",
];

fn read(rel: &str) -> String {
    std::fs::read_to_string(crate::root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Files and directories under `dir`, sorted, recursively.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<PathBuf> = rd.map_while(Result::ok).map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        let is_dir = p.is_dir();
        out.push(p.clone());
        if is_dir {
            walk(&p, out);
        }
    }
}

/// `p` relative to `root`, with `/` separators.
fn rel(root: &Path, p: &Path) -> String {
    let r = p.strip_prefix(root).unwrap_or(p);
    r.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("/")
}

fn is_rs(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "rs")
}

/// What the document must name: every `.rs` file and every directory that
/// holds one under the two crates' `src`, the integration tests, the fuzz
/// targets and the platform directories.
fn required_paths(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for base in ["hypervisor/src", "hypervisor/core/src", "hypervisor/machine/src", "xtask/src"] {
        let mut all = Vec::new();
        walk(&root.join(base), &mut all);
        for p in &all {
            if is_rs(p) {
                out.push(rel(root, p));
            } else if p.is_dir()
                && std::fs::read_dir(p).is_ok_and(|rd| rd.map_while(Result::ok).any(|e| is_rs(&e.path())))
            {
                out.push(format!("{}/", rel(root, p)));
            }
        }
    }
    for (dir, want_dirs) in [("tests", false), ("fuzz/fuzz_targets", false), ("platforms", true)] {
        let Ok(rd) = std::fs::read_dir(root.join(dir)) else { continue };
        let mut v: Vec<PathBuf> = rd.map_while(Result::ok).map(|e| e.path()).collect();
        v.sort();
        for p in v {
            if want_dirs && p.is_dir() {
                out.push(format!("{}/", rel(root, &p)));
            } else if !want_dirs && is_rs(&p) {
                out.push(rel(root, &p));
            }
        }
    }
    out
}

/// The text outside fenced code blocks.
fn prose(doc: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The inline code spans (`...`) outside fenced code blocks.
fn code_spans(doc: &str) -> Vec<String> {
    prose(doc).split('`').skip(1).step_by(2).map(|s| s.trim().to_string()).collect()
}

/// A code span that is a repository path: relative, with a `/`, no spaces
/// or pattern characters.
fn is_repo_path(s: &str) -> bool {
    s.contains('/')
        && !s.starts_with(['/', '-', '.'])
        && !s.contains("::")
        && !s.contains(|c: char| c.is_whitespace() || "<>{}*|=,@…".contains(c))
}

/// Paths the document must name but does not, as messages.
fn missing_paths(doc: &str, required: &[String], doc_name: &str) -> Vec<String> {
    let named: BTreeSet<String> = code_spans(doc).iter().map(|s| s.trim_end_matches('/').to_string()).collect();
    required
        .iter()
        .filter(|p| !named.contains(p.trim_end_matches('/')))
        .map(|p| format!("{doc_name} does not name `{p}`: add a line to its tables saying what it owns"))
        .collect()
}

/// Repository paths the text names (code spans, relative links) that do not exist.
fn dangling_paths(text: &str, root: &Path, doc_name: &str) -> Vec<String> {
    let mut paths: Vec<String> = code_spans(text).into_iter().filter(|s| is_repo_path(s)).collect();
    for link in prose(text).split("](").skip(1) {
        let target = link.split(')').next().unwrap_or("");
        if !target.contains("://") && !target.starts_with('#') && !target.is_empty() {
            paths.push(target.split('#').next().unwrap_or("").to_string());
        }
    }
    paths
        .into_iter()
        .filter(|p| !root.join(p).exists())
        .map(|p| format!("{doc_name} names `{p}`, which does not exist"))
        .collect()
}

/// One source file of a crate: its module path and the text of the files
/// that define its items (a `mod.rs` shares them with its siblings, which
/// hold its submodules' `impl` blocks).
struct Module {
    krate: &'static str,
    path: Vec<String>,
    texts: Vec<String>,
}

fn modules(root: &Path) -> Vec<Module> {
    let mut out = Vec::new();
    // hv-core's and hv-machine's modules are the hypervisor crate's too (re-exported).
    // hv-arch-aarch64 is the hypervisor crate's `arch`.
    for (krate, base, prefix) in [
        ("hypervisor", "hypervisor/src", None),
        ("hypervisor", "hypervisor/arch/src", Some("arch")),
        ("hypervisor", "hypervisor/core/src", None),
        ("hypervisor", "hypervisor/machine/src", None),
        ("xtask", "xtask/src", None),
    ] {
        let src = root.join(base);
        let mut all = Vec::new();
        walk(&src, &mut all);
        for p in all.iter().filter(|p| is_rs(p)) {
            let mut path = crate::checks::deps::mod_path(p.strip_prefix(&src).unwrap_or(p));
            if let Some(pre) = prefix {
                path.insert(0, pre.to_string());
            }
            let index = p.file_name().is_some_and(|n| n == "mod.rs");
            let mut files = vec![p.clone()];
            if index {
                let dir = p.parent().unwrap();
                files.extend(all.iter().filter(|q| is_rs(q) && q.parent() == Some(dir) && *q != p).cloned());
            }
            let texts = files.iter().map(|f| std::fs::read_to_string(f).unwrap_or_default()).collect();
            out.push(Module { krate, path, texts });
        }
    }
    out
}

/// Whether `text` defines `name`: an item (`fn`, `struct`, ... `name`), or
/// an enum variant or struct field at the start of a line.
fn defines(text: &str, name: &str) -> bool {
    let ends_ident = |rest: &str| !rest.starts_with(is_ident_char);
    for kw in
        ["fn ", "struct ", "enum ", "trait ", "type ", "const ", "static ", "static mut ", "mod ", "macro_rules! "]
    {
        let pat = format!("{kw}{name}");
        let mut from = 0;
        while let Some(i) = text[from..].find(&pat) {
            let at = from + i;
            let before_ok = text[..at].chars().next_back().is_none_or(|c| !is_ident_char(c));
            if before_ok && ends_ident(&text[at + pat.len()..]) {
                return true;
            }
            from = at + pat.len();
        }
    }
    text.lines().any(|l| {
        let t = l.trim_start();
        let t = t.strip_prefix("pub(crate) ").or_else(|| t.strip_prefix("pub ")).unwrap_or(t);
        t.strip_prefix(name).is_some_and(|rest| rest.starts_with([' ', '{', '(', ',', ':']) && !rest.starts_with("::"))
    })
}

/// Whether some module resolves `segs`: its path ends with the leading
/// segments and its files define the remaining ones (so `runtime::vcpu::run_vcpu`,
/// `vcpu::run_vcpu` and `Vgic::sync_lrs` all resolve).
fn resolves(mods: &[Module], krates: &[&str], segs: &[&str]) -> bool {
    mods.iter().filter(|m| krates.contains(&m.krate)).any(|m| {
        (0..=segs.len()).any(|k| {
            let (module, items) = segs.split_at(k);
            let tail_ok = module.len() <= m.path.len()
                && m.path[m.path.len() - module.len()..].iter().zip(module).all(|(a, b)| a == b);
            tail_ok && (k > 0 || !items.is_empty()) && items.iter().all(|it| m.texts.iter().any(|t| defines(t, it)))
        })
    })
}

/// Item paths (`a::b`, anywhere in the text, code blocks included) that no
/// module of the hypervisor or xtask crate defines.
fn unresolved_items(text: &str, mods: &[Module], doc_name: &str) -> Vec<String> {
    let mut tokens = BTreeSet::new();
    for raw in text.split(|c: char| !(is_ident_char(c) || c == ':')) {
        let tok = raw.trim_matches(':');
        if tok.contains("::") {
            tokens.insert(tok.to_string());
        }
    }
    let mut out = Vec::new();
    for tok in tokens {
        let mut segs: Vec<&str> = tok.split("::").collect();
        if segs.iter().any(|s| s.is_empty()) || EXTERNAL.contains(&segs[0]) {
            continue;
        }
        let krates: &[&str] = match segs[0] {
            "hypervisor" => &["hypervisor"],
            "xtask" => &["xtask"],
            _ => &["hypervisor", "xtask"],
        };
        if matches!(segs[0], "hypervisor" | "xtask" | "crate") {
            segs.remove(0);
        }
        if segs.is_empty() || !resolves(mods, krates, &segs) {
            out.push(format!("{doc_name} names `{tok}`, which no module of the hypervisor or xtask crate defines (renamed or removed?)"));
        }
    }
    out
}

/// Modules a file declares (`mod x;`, not `#[cfg(test)]`) that its `//!`
/// docs do not name as `` `x` ``.
fn undocumented_modules(src: &str, file: &str) -> Vec<String> {
    let docs: String = src.lines().filter(|l| l.starts_with("//!")).collect::<Vec<_>>().join("\n");
    let mut out = Vec::new();
    let mut prev = "";
    for line in src.lines().map(str::trim) {
        let decl = line.strip_prefix("pub ").unwrap_or(line);
        if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
            if prev != "#[cfg(test)]" && !docs.contains(&format!("`{name}`")) {
                out.push(format!("{file} declares `mod {name}` but its `//!` module list does not name `{name}`"));
            }
        }
        if !line.is_empty() {
            prev = line;
        }
    }
    out
}

fn report(problems: Vec<String>) {
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

#[test]
fn the_architecture_doc_names_every_source_file_and_module_directory() {
    let root = crate::root();
    report(missing_paths(&read(DOC), &required_paths(&root), DOC));
}

#[test]
fn every_path_and_item_the_architecture_doc_names_exists() {
    let root = crate::root();
    let doc = read(DOC);
    let mut problems = dangling_paths(&doc, &root, DOC);
    problems.extend(unresolved_items(&doc, &modules(&root), DOC));
    report(problems);
}

#[test]
fn readme_architecture_section_agrees_with_the_tree() {
    let root = crate::root();
    let readme = read("README.md");
    let start = readme.find("\n## Architecture\n").expect("README has an `## Architecture` section");
    let section = &readme[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let mut problems = Vec::new();
    if !section.contains("](docs/ARCHITECTURE.md)") {
        problems.push("README's Architecture section does not link docs/ARCHITECTURE.md".to_string());
    }
    problems.extend(dangling_paths(section, &root, "README's Architecture section"));
    problems.extend(unresolved_items(section, &modules(&root), "README's Architecture section"));
    let named: BTreeSet<String> = code_spans(section).iter().map(|s| s.trim_end_matches('/').to_string()).collect();
    let mut top: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map_while(Result::ok)
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.') && n != "target")
        .collect();
    top.sort();
    for d in top.iter().filter(|d| !named.contains(*d)) {
        problems.push(format!("README's Architecture table does not name the top-level directory `{d}/`"));
    }
    report(problems);
}

#[test]
fn module_lists_name_every_declared_module() {
    let mut problems = Vec::new();
    for f in MODULE_INDEXES {
        problems.extend(undocumented_modules(&read(f), f));
    }
    report(problems);
}

#[test]
fn unsafe_and_assembly_stay_where_the_architecture_doc_says() {
    let root = crate::root();
    let mut files = Vec::new();
    walk(&root.join("hypervisor/src"), &mut files);
    walk(&root.join("hypervisor/arch/src"), &mut files);
    walk(&root.join("hypervisor/core/src"), &mut files);
    walk(&root.join("hypervisor/machine/src"), &mut files);
    let mut problems = Vec::new();
    for f in files.iter().filter(|f| is_rs(f)) {
        let r = rel(&root, f);
        let asm_ok = r.starts_with("hypervisor/arch/src/") || r == "hypervisor/core/src/sync.rs";
        let unsafe_ok = asm_ok
            || r.starts_with("hypervisor/src/runtime/")
            || r == "hypervisor/core/src/sync/ticket.rs"
            || r == "hypervisor/core/src/virtio/mod.rs"
            || r == "hypervisor/core/src/virtio/phys.rs"
            || r == "hypervisor/core/src/virtio/tests/phys.rs";
        for (n, line) in std::fs::read_to_string(f).unwrap().lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if !asm_ok && code.contains("asm!") {
                problems.push(format!("{r}:{}: inline assembly outside hypervisor/arch/src/", n + 1));
            }
            let has_unsafe = code.match_indices("unsafe").any(|(i, _)| {
                let before = code[..i].chars().next_back().is_none_or(|c| !is_ident_char(c));
                before && code[i + 6..].starts_with([' ', '{'])
            });
            if !unsafe_ok && has_unsafe {
                problems.push(format!("{r}:{}: `unsafe` outside the places {DOC} lists", n + 1));
            }
        }
    }
    for lib in ["hypervisor/src/lib.rs", "hypervisor/arch/src/lib.rs", "hypervisor/core/src/lib.rs"] {
        let text = read(lib);
        for lint in ["#![deny(unsafe_op_in_unsafe_fn)]", "#![deny(clippy::undocumented_unsafe_blocks)]"] {
            if !text.contains(lint) {
                problems.push(format!("{lib} lost `{lint}`"));
            }
        }
    }
    // The hypervisor crate: the compiler keeps `unsafe` to `runtime`.
    let hv = read("hypervisor/src/lib.rs");
    if !hv.contains("#![deny(unsafe_code)]") || hv.matches("#[allow(unsafe_code)]").count() != 1 {
        problems.push(
            "hypervisor/src/lib.rs: `#![deny(unsafe_code)]` with one `#[allow(unsafe_code)]` module (runtime)".into(),
        );
    }
    // hv-core: the compiler keeps `unsafe` to the one module that allows it.
    let core = read("hypervisor/core/src/lib.rs");
    if !core.contains("#![deny(unsafe_code)]") || core.matches("#[allow(unsafe_code)]").count() != 1 {
        problems.push("hypervisor/core/src/lib.rs: `#![deny(unsafe_code)]` with exactly one `#[allow(unsafe_code)]` module (virtio)".into());
    }
    if !read("hypervisor/machine/src/lib.rs").contains("#![forbid(unsafe_code)]") {
        problems.push("hypervisor/machine/src/lib.rs lost `#![forbid(unsafe_code)]`".into());
    }
    report(problems);
}

/// The checker itself: a file the document forgets, a path and an item that
/// do not exist, and an undocumented module are each reported by name.
#[test]
fn the_checks_name_what_is_wrong() {
    let root = crate::root();
    let doc = "| `hypervisor/src/lib.rs` | root |\n| `hypervisor/src/gone.rs` | x |\n\
               ```\nruntime::vcpu::run_vcpu → Vgic::sync_lrs → vcpu::no_such_fn\n```\n";
    let required = vec!["hypervisor/src/lib.rs".to_string(), "hypervisor/core/src/virtio/new.rs".to_string()];
    assert_eq!(
        missing_paths(doc, &required, "D"),
        ["D does not name `hypervisor/core/src/virtio/new.rs`: add a line to its tables saying what it owns"]
    );
    assert_eq!(dangling_paths(doc, &root, "D"), ["D names `hypervisor/src/gone.rs`, which does not exist"]);
    let unresolved = unresolved_items(doc, &modules(&root), "D");
    assert_eq!(unresolved.len(), 1, "{unresolved:?}");
    assert!(unresolved[0].starts_with("D names `vcpu::no_such_fn`"), "{unresolved:?}");
    let src = "//! - `a`: one\npub mod a;\npub mod b;\n#[cfg(test)]\nmod tests;\n";
    assert_eq!(
        undocumented_modules(src, "f.rs"),
        ["f.rs declares `mod b` but its `//!` module list does not name `b`"]
    );
}

/// The circles among sibling modules the tree still has (`cargo xtask
/// deps` prints the edges that close each). The list only shrinks: a new
/// circle fails the test, and so does a listed one that is gone (strike it).
const KNOWN_CIRCLES: &[&str] = &[];

#[test]
fn modules_depend_on_each_other_only_in_the_known_circles() {
    let root = crate::root();
    let mut found = Vec::new();
    for c in crate::checks::deps::CRATES {
        for k in crate::checks::deps::cycles(&crate::checks::deps::graph(&root.join(c).join("src"))) {
            found.push(format!("{c}: {k}"));
        }
    }
    let known: Vec<String> = KNOWN_CIRCLES.iter().map(|s| s.to_string()).collect();
    let new: Vec<&String> = found.iter().filter(|f| !known.contains(f)).collect();
    let gone: Vec<&String> = known.iter().filter(|k| !found.contains(k)).collect();
    assert!(
        new.is_empty() && gone.is_empty(),
        "module circles changed (`cargo xtask deps` shows the edges).\nnew circles (cut an edge: move the item \
         down to the module both sides may use): {new:#?}\nno longer circles (strike from KNOWN_CIRCLES): {gone:#?}"
    );
}
