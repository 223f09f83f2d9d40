//! The module dependency graph of a crate, read from its source
//! (`cargo xtask deps`, and the architecture test's direction check).
//!
//! Cargo enforces the direction between crates; inside one crate nothing
//! does, so this reads every `crate::`, `super::` and module-alias path of
//! the non-test code and finds the modules that depend on each other in a
//! circle. A dependency counts between siblings: an edge from file `a` to
//! file `b` joins the two children of their deepest common module that hold
//! them (a module using its own parent or child does not count, as a
//! `mod.rs` declaring and re-exporting its children is no cycle).
//!
//! It reads paths as text: a name spelled through a `use` of a whole module
//! (`use crate::vgic; vgic::lr::encode_lr`) is followed, a glob import is
//! not. Test code (`tests.rs`, `*_tests.rs`, and everything from a
//! `#[cfg(test)]` module on) is left out: tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The crates whose module graphs are checked, by directory.
pub const CRATES: &[&str] = &["hypervisor", "hypervisor/arch", "hypervisor/core", "hypervisor/machine", "xtask"];

/// A module path (`["runtime", "vcpu"]`; the crate root is empty).
pub type ModPath = Vec<String>;

/// Files as modules and the modules each one names.
#[derive(Debug, Default)]
pub struct Graph {
    /// Every module with a file, with the modules (files) it uses.
    pub edges: BTreeMap<ModPath, BTreeSet<ModPath>>,
}

/// A circle of sibling modules under `parent`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cycle {
    pub parent: ModPath,
    pub members: BTreeSet<String>,
}

impl std::fmt::Display for Cycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = if self.parent.is_empty() { "crate".to_string() } else { self.parent.join("::") };
        let m: Vec<&str> = self.members.iter().map(String::as_str).collect();
        write!(f, "{p}::{{{}}}", m.join(", "))
    }
}

fn is_test_file(name: &str) -> bool {
    name == "tests.rs" || name.ends_with("_tests.rs") || name == "testrng.rs"
}

/// The module path of `file` (relative to the crate's `src`): `foo.rs` and
/// `foo/mod.rs` are module `foo`, `lib.rs` and `main.rs` the crate root.
pub(crate) fn mod_path(rel: &Path) -> ModPath {
    let mut segs: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let last = segs.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        segs.push(stem.to_string());
    }
    segs
}

fn rs_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    let mut v: Vec<_> = rd.map_while(Result::ok).map(|e| e.path()).collect();
    v.sort();
    for p in v {
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The non-test code of a source file: comments dropped, and the file cut at
/// its first `#[cfg(test)]` module.
fn code_of(src: &str) -> String {
    let mut out = String::new();
    let mut lines = src.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") && lines.peek().is_some_and(|n| n.trim_start().starts_with("mod ")) {
            break;
        }
        out.push_str(&without_strings(line));
        out.push('\n');
    }
    out
}

/// A line with its `//` comment and the text of its string literals
/// dropped (a path spelled inside a string is no dependency).
fn without_strings(line: &str) -> String {
    let c: Vec<char> = line.chars().collect();
    let mut out = String::new();
    let (mut i, mut in_str) = (0, false);
    while i < c.len() {
        match (in_str, c[i]) {
            (false, '/') if c.get(i + 1) == Some(&'/') => break,
            // A char literal `'"'` or `'\"'` opens no string.
            (false, '\'') if c.get(i + 1) == Some(&'"') && c.get(i + 2) == Some(&'\'') => i += 2,
            (false, '\'') if c.get(i + 1) == Some(&'\\') && c.get(i + 3) == Some(&'\'') => i += 3,
            (false, '"') => in_str = true,
            (true, '\\') => i += 1,
            (true, '"') => in_str = false,
            (false, ch) => out.push(ch),
            (true, _) => {}
        }
        i += 1;
    }
    out
}

pub(crate) fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths spelled from position `i` of `s` (just after a `prefix::`):
/// `a::b::c`, `a::{b, c::d}`, each as its segments.
fn paths_at(s: &[char], mut i: usize, prefix: &[String], out: &mut Vec<ModPath>) -> usize {
    let mut cur: ModPath = prefix.to_vec();
    loop {
        while i < s.len() && s[i].is_whitespace() {
            i += 1;
        }
        if i < s.len() && s[i] == '{' {
            i += 1;
            loop {
                i = paths_at(s, i, &cur, out);
                while i < s.len() && (s[i].is_whitespace() || s[i] == ',') {
                    i += 1;
                }
                if i >= s.len() || s[i] == '}' {
                    return i + 1;
                }
            }
        }
        let start = i;
        while i < s.len() && is_ident(s[i]) {
            i += 1;
        }
        if i == start {
            // `*` or the end of a group: what was named so far.
            if i < s.len() && s[i] == '*' {
                i += 1;
            }
            out.push(cur);
            return i;
        }
        let seg: String = s[start..i].iter().collect();
        if seg == "self" {
            out.push(cur);
            return i;
        }
        cur.push(seg);
        if s.get(i) == Some(&':') && s.get(i + 1) == Some(&':') {
            i += 2;
        } else {
            // ` as alias` is skipped by the caller's scan.
            out.push(cur);
            return i;
        }
    }
}

/// Every path `file_mod`'s code names through `crate::`, `super::` or a
/// module alias, as absolute module paths (items included).
fn named_paths(code: &str, file_mod: &[String], modules: &BTreeSet<ModPath>) -> Vec<ModPath> {
    let s: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    // A `foo.rs` or `foo/mod.rs` file is module `foo`; `super` is its parent
    // either way.
    let parent: ModPath = file_mod[..file_mod.len().saturating_sub(1)].to_vec();
    // A path starts here, not inside another path or a macro's `$crate`.
    let starts_path = |i: usize| i == 0 || !(is_ident(s[i - 1]) || s[i - 1] == '$' || s[i - 1] == ':');
    let mut i = 0;
    while i < s.len() {
        let before_ok = starts_path(i);
        if before_ok && starts_with(&s, i, "crate::") {
            i = paths_at(&s, i + 7, &[], &mut out);
            continue;
        }
        if before_ok && starts_with(&s, i, "super::") {
            let mut base = parent.clone();
            let mut j = i + 7;
            while starts_with(&s, j, "super::") {
                base.pop();
                j += 7;
            }
            i = paths_at(&s, j, &base, &mut out);
            continue;
        }
        i += 1;
    }
    // Names of whole modules brought in by `use`, followed where spelled.
    let aliases: BTreeMap<String, ModPath> = out
        .iter()
        .filter(|p| !p.is_empty() && modules.contains(*p))
        .map(|p| (p.last().cloned().unwrap_or_default(), p.clone()))
        .collect();
    let mut more = Vec::new();
    let mut i = 0;
    while i < s.len() {
        if starts_path(i) && is_ident(s[i]) {
            let start = i;
            while i < s.len() && is_ident(s[i]) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            if starts_with(&s, i, "::") {
                if let Some(base) = aliases.get(&word) {
                    i = paths_at(&s, i + 2, base, &mut more);
                }
            }
            continue;
        }
        i += 1;
    }
    out.extend(more);
    out
}

fn starts_with(s: &[char], i: usize, pat: &str) -> bool {
    pat.chars().enumerate().all(|(k, c)| s.get(i + k) == Some(&c))
}

/// The module graph of the crate whose sources are under `src`.
pub fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rs_files(src, &mut files);
    let files: Vec<_> = files
        .into_iter()
        .filter(|p| !p.file_name().is_some_and(|n| is_test_file(&n.to_string_lossy())))
        .filter(|p| !p.components().any(|c| c.as_os_str() == "testdata"))
        .collect();
    let files: Vec<(ModPath, &std::path::PathBuf)> =
        files.iter().map(|p| (mod_path(p.strip_prefix(src).unwrap_or(p)), p)).collect();
    let modules: BTreeSet<ModPath> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut g = Graph::default();
    for (m, p) in files {
        let code = code_of(&std::fs::read_to_string(p).unwrap_or_default());
        let mut to = BTreeSet::new();
        for path in named_paths(&code, &m, &modules) {
            // The deepest module the path lies in.
            let target = (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|q| modules.contains(q));
            if let Some(t) = target {
                if t != m {
                    to.insert(t);
                }
            }
        }
        g.edges.insert(m, to);
    }
    g
}

/// The circles among sibling modules, each under its parent, sorted.
pub fn cycles(g: &Graph) -> Vec<Cycle> {
    // parent -> child -> children it depends on.
    let mut sib: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (a, tos) in &g.edges {
        for b in tos {
            let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
            if common == a.len() || common == b.len() {
                continue; // a parent and its descendant
            }
            let parent = a[..common].to_vec();
            sib.entry(parent).or_default().entry(a[common].clone()).or_default().insert(b[common].clone());
        }
    }
    let mut out = Vec::new();
    for (parent, adj) in sib {
        for members in scc(&adj) {
            if members.len() > 1 {
                out.push(Cycle { parent: parent.clone(), members });
            }
        }
    }
    out.sort();
    out
}

/// Strongly connected components (Tarjan), each as its set of nodes.
fn scc(adj: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct T<'a> {
        adj: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        if let Some(ws) = t.adj.get(v) {
            for w in ws {
                if !t.index.contains_key(w.as_str()) {
                    visit(t, w);
                    let lw = t.low[w.as_str()];
                    let lv = t.low[v];
                    t.low.insert(v, lv.min(lw));
                } else if t.on.contains(w.as_str()) {
                    let iw = t.index[w.as_str()];
                    let lv = t.low[v];
                    t.low.insert(v, lv.min(iw));
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = BTreeSet::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            t.out.push(comp);
        }
    }
    let mut t = T {
        adj,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in adj.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// `cargo xtask deps`: each crate's circles and the edges that close them.
pub fn report(crates: &[&str]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for c in crates {
        let g = graph(&crate::root().join(c).join("src"));
        let cyc = cycles(&g);
        let files = g.edges.len();
        let edges: usize = g.edges.values().map(BTreeSet::len).sum();
        let _ = writeln!(s, "{c}: {files} modules, {edges} edges, {} circle(s) among siblings", cyc.len());
        for k in &cyc {
            let _ = writeln!(s, "  {k}");
            for (a, tos) in &g.edges {
                if a.len() <= k.parent.len()
                    || a[..k.parent.len()] != k.parent[..]
                    || !k.members.contains(&a[k.parent.len()])
                {
                    continue;
                }
                for b in tos {
                    let inside = b.len() > k.parent.len()
                        && b[..k.parent.len()] == k.parent[..]
                        && k.members.contains(&b[k.parent.len()])
                        && b[k.parent.len()] != a[k.parent.len()];
                    if inside {
                        let _ = writeln!(s, "    {} -> {}", a.join("::"), b.join("::"));
                    }
                }
            }
        }
    }
    s
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    fn paths(code: &str, m: &[&str]) -> Vec<String> {
        let m: ModPath = m.iter().map(|s| s.to_string()).collect();
        let mods: BTreeSet<ModPath> = [vec!["vgic".to_string()]].into_iter().collect();
        let mut v: Vec<String> = named_paths(&code_of(code), &m, &mods).iter().map(|p| p.join("::")).collect();
        v.sort();
        v
    }

    #[test]
    fn reads_crate_super_groups_and_aliases() {
        assert_eq!(paths("use crate::a::{b, c::{d, e}};", &["x"]), ["a::b", "a::c::d", "a::c::e"]);
        assert_eq!(paths("let x = super::y::Z;", &["p", "q"]), ["p::y::Z"]);
        assert_eq!(paths("super::super::k()", &["p", "q"]), ["k"]);
        assert_eq!(paths("use crate::vgic; vgic::lr::f()", &["x"]), ["vgic", "vgic::lr::f"]);
        assert_eq!(paths("$crate::a // crate::b\n", &["x"]), Vec::<String>::new());
        assert_eq!(paths("use crate::a::{self, B};", &["x"]), ["a", "a::B"]);
        assert_eq!(paths("let s = \"crate::{a, b} \\\" crate::c\"; crate::d::E", &["x"]), ["d::E"]);
        assert_eq!(paths("f('\"', crate::g::H, '\\\"', \"crate::i\")", &["x"]), ["g::H"]);
    }

    #[test]
    fn test_modules_are_left_out() {
        let c = code_of("use crate::a;\n#[cfg(test)]\nmod tests {\n use crate::b;\n}\n");
        assert!(c.contains("crate::a") && !c.contains("crate::b"));
    }

    #[test]
    fn cycles_are_found_among_siblings_only() {
        let p = |s: &str| -> ModPath { s.split("::").filter(|x| !x.is_empty()).map(String::from).collect() };
        let mut g = Graph::default();
        g.edges.insert(p("a::x"), [p("b")].into());
        g.edges.insert(p("b"), [p("a")].into());
        g.edges.insert(p("a"), [p("a::x")].into());
        g.edges.insert(p("a::x"), [p("a"), p("b")].into());
        let c = cycles(&g);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].to_string(), "crate::{a, b}");
    }
}
