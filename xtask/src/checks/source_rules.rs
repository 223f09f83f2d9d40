//! Rules on the source text itself (host tests only):
//!
//! - no function is longer than [`MAX_FN_LINES`] lines, counted from the
//!   line of its `fn` keyword to the line of its closing brace; `#[test]`
//!   functions count too;
//! - no comment cites an issue number (the word and a number): comments say why and
//!   state contracts, history belongs in commit messages.
//!
//! The scanner masks comments and string and char literals before it looks
//! for `fn` items and matches braces, so braces in those never count.

use std::path::{Path, PathBuf};

/// The longest a function may be, in lines.
const MAX_FN_LINES: usize = 120;

/// The trees both rules scan (every `.rs` file below them, recursively).
const SCANNED: &[&str] =
    &["hypervisor/src", "hypervisor/arch/src", "hypervisor/core/src", "hypervisor/machine/src", "xtask/src", "tests"];

/// Functions allowed over [`MAX_FN_LINES`], as `(file, fn name)`: only
/// generated tables would belong here, and there are none.
const LONG_FN_ALLOWED: &[(&str, &str)] = &[];

/// Files whose comments may still cite issue numbers (none: history
/// belongs in commit messages). The list only shrinks.
const ISSUE_COMMENTS_ALLOWED: &[&str] = &[];

/// A source file with its comments and literals blanked out.
struct Masked {
    /// The code, same length and line breaks as the source, with every
    /// comment and every string or char literal replaced by spaces.
    code: Vec<u8>,
    /// Each comment's text and the (1-based) line it starts on.
    comments: Vec<(usize, String)>,
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Blanks `src[from..to]` into `code`, keeping line breaks.
fn blank(src: &[u8], code: &mut [u8], from: usize, to: usize) {
    for i in from..to.min(src.len()) {
        if src[i] != b'\n' {
            code[i] = b' ';
        }
    }
}

/// Where the raw string starting at `i` (at its `r`) ends, if it is one.
fn raw_string_end(s: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    while s.get(j) == Some(&b'#') {
        j += 1;
    }
    if s.get(j) != Some(&b'"') {
        return None;
    }
    let hashes = j - i - 1;
    let mut k = j + 1;
    while k < s.len() {
        if s[k] == b'"' && s[k + 1..].iter().take(hashes).filter(|&&c| c == b'#').count() == hashes {
            return Some(k + 1 + hashes);
        }
        k += 1;
    }
    Some(s.len())
}

/// Where the quoted string starting at `i` (at its `"`) ends.
fn string_end(s: &[u8], i: usize) -> usize {
    let mut k = i + 1;
    while k < s.len() {
        match s[k] {
            b'\\' => k += 2,
            b'"' => return k + 1,
            _ => k += 1,
        }
    }
    s.len()
}

/// Where the char literal starting at `i` (at its `'`) ends, or `None` for
/// a lifetime or label.
fn char_end(s: &[u8], i: usize) -> Option<usize> {
    match s.get(i + 1) {
        Some(b'\\') => {
            let mut k = i + 2;
            while k < s.len() && s[k] != b'\'' && s[k] != b'\n' {
                k += 1;
            }
            Some(k + 1)
        }
        Some(&c) => {
            // One char (UTF-8: a lead byte and its continuation bytes).
            let len =
                if c < 0x80 { 1 } else { s[i + 1..].iter().skip(1).take_while(|&&b| b & 0xC0 == 0x80).count() + 1 };
            (s.get(i + 1 + len) == Some(&b'\'')).then_some(i + 2 + len)
        }
        None => None,
    }
}

/// Where the block comment starting at `i` (at its `/*`) ends; they nest.
fn block_comment_end(s: &[u8], i: usize) -> usize {
    let (mut depth, mut k) = (0usize, i);
    while k < s.len() {
        if s[k..].starts_with(b"/*") {
            depth += 1;
            k += 2;
        } else if s[k..].starts_with(b"*/") {
            depth -= 1;
            k += 2;
            if depth == 0 {
                return k;
            }
        } else {
            k += 1;
        }
    }
    s.len()
}

fn mask(src: &str) -> Masked {
    let s = src.as_bytes();
    let mut code = s.to_vec();
    let mut comments = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < s.len() {
        let prev_ident = i > 0 && is_ident(s[i - 1]);
        let end = if s[i..].starts_with(b"//") {
            let e = s[i..].iter().position(|&c| c == b'\n').map_or(s.len(), |p| i + p);
            comments.push((line, src[i..e].to_string()));
            Some(e)
        } else if s[i..].starts_with(b"/*") {
            let e = block_comment_end(s, i);
            comments.push((line, src[i..e].to_string()));
            Some(e)
        } else if s[i] == b'"' {
            Some(string_end(s, i))
        } else if s[i] == b'r' && (!prev_ident || (i == 1 || !is_ident(s[i - 2])) && s[i - 1] == b'b') {
            raw_string_end(s, i)
        } else if s[i] == b'\'' {
            char_end(s, i)
        } else {
            None
        };
        match end {
            Some(e) => {
                let e = e.min(s.len());
                blank(s, &mut code, i, e);
                line += s[i..e].iter().filter(|&&c| c == b'\n').count();
                i = e;
            }
            None => {
                line += usize::from(s[i] == b'\n');
                i += 1;
            }
        }
    }
    Masked { code, comments }
}

/// A function item found in a file.
#[derive(Debug, PartialEq)]
struct FnItem {
    name: String,
    /// The line of its `fn` keyword (1-based).
    line: usize,
    /// Lines from the `fn` keyword to the closing brace, both included.
    lines: usize,
    /// Whether a `#[test]` attribute precedes it.
    is_test: bool,
}

/// The 1-based line of byte offset `at`.
fn line_of(code: &[u8], at: usize) -> usize {
    code[..at].iter().filter(|&&c| c == b'\n').count() + 1
}

/// Where the body of the `fn` whose signature starts at `from` opens and
/// closes (byte offsets of its braces), or `None` for a declaration
/// without a body.
fn body(code: &[u8], from: usize) -> Option<(usize, usize)> {
    let mut depth = 0i32;
    let mut k = from;
    let open = loop {
        match *code.get(k)? {
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth -= 1,
            b';' if depth == 0 => return None,
            b'{' if depth == 0 => break k,
            _ => {}
        }
        k += 1;
    };
    let mut braces = 0i32;
    for (j, &c) in code.iter().enumerate().skip(open) {
        match c {
            b'{' => braces += 1,
            b'}' => {
                braces -= 1;
                if braces == 0 {
                    return Some((open, j));
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether the attribute lines just above `line` (1-based) include `#[test]`.
fn has_test_attr(src_lines: &[&str], line: usize) -> bool {
    src_lines[..line - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .take_while(|l| l.starts_with("#[") || l.starts_with("//") || l.ends_with(")]"))
        .any(|l| l == "#[test]" || l.starts_with("#[test]"))
}

/// Every function item with a body in `src`.
fn functions(src: &str) -> Vec<FnItem> {
    let code = mask(src).code;
    let src_lines: Vec<&str> = src.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 2 < code.len() {
        let keyword =
            code[i..].starts_with(b"fn") && (i == 0 || !is_ident(code[i - 1])) && code[i + 2].is_ascii_whitespace();
        if !keyword {
            i += 1;
            continue;
        }
        let mut n = i + 2;
        while n < code.len() && code[n].is_ascii_whitespace() {
            n += 1;
        }
        let name_end = n + code[n..].iter().take_while(|&&c| is_ident(c)).count();
        if name_end == n || code[n].is_ascii_digit() {
            i += 2;
            continue;
        }
        if let Some((_, close)) = body(&code, name_end) {
            let line = line_of(&code, i);
            out.push(FnItem {
                name: String::from_utf8_lossy(&code[n..name_end]).into_owned(),
                line,
                lines: line_of(&code, close) - line + 1,
                is_test: has_test_attr(&src_lines, line),
            });
        }
        i = name_end;
    }
    out
}

/// Every `.rs` file below the scanned trees, relative to the root, sorted.
fn scanned_files(root: &Path) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for p in rd.map_while(Result::ok).map(|e| e.path()) {
            if p.is_dir() && p.file_name().is_some_and(|n| n != "target") {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    for base in SCANNED {
        walk(&root.join(base), &mut files);
    }
    let mut rels: Vec<String> =
        files.iter().map(|p| p.strip_prefix(root).unwrap_or(p).to_string_lossy().replace('\\', "/")).collect();
    rels.sort();
    rels.dedup();
    rels
}

/// `file:line fn name (N lines)` for each function in `src` over the limit.
fn long_functions(src: &str, file: &str) -> Vec<String> {
    functions(src)
        .into_iter()
        .filter(|f| f.lines > MAX_FN_LINES && !LONG_FN_ALLOWED.contains(&(file, f.name.as_str())))
        .map(|f| format!("{file}:{} fn {} ({} lines)", f.line, f.name, f.lines))
        .collect()
}

/// Whether `text` cites an issue number: the word `issue` (any case, not
/// inside a longer word) then a number, optionally after spaces and `#`.
fn cites_issue(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.match_indices("issue").any(|(at, _)| {
        let before_ok = lower[..at].chars().next_back().is_none_or(|c| !c.is_alphanumeric());
        let rest = lower[at + "issue".len()..].trim_start_matches([' ', '#']);
        before_ok && rest.starts_with(|c: char| c.is_ascii_digit())
    })
}

/// `file:line` and the comment for each comment in `src` citing an issue.
fn issue_comments(src: &str, file: &str) -> Vec<String> {
    mask(src)
        .comments
        .into_iter()
        .flat_map(|(line, text)| {
            text.lines().enumerate().map(move |(k, l)| (line + k, l.to_string())).collect::<Vec<_>>()
        })
        .filter(|(_, l)| cites_issue(l))
        .map(|(line, l)| format!("{file}:{line}: {}", l.trim()))
        .collect()
}

fn read(root: &Path, rel: &str) -> String {
    std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let root = crate::root();
    let problems: Vec<String> = scanned_files(&root).iter().flat_map(|f| long_functions(&read(&root, f), f)).collect();
    assert!(
        problems.is_empty(),
        "\nfunctions over {MAX_FN_LINES} lines (split them into named phases):\n{}\n",
        problems.join("\n")
    );
}

#[test]
fn no_comment_cites_an_issue_number() {
    let root = crate::root();
    let problems: Vec<String> = scanned_files(&root)
        .iter()
        .filter(|f| !ISSUE_COMMENTS_ALLOWED.contains(&f.as_str()))
        .flat_map(|f| issue_comments(&read(&root, f), f))
        .collect();
    assert!(
        problems.is_empty(),
        "\ncomments citing issue numbers (say why in the present tense; history goes in commit messages):\n{}\n",
        problems.join("\n")
    );
}

#[test]
fn the_allowlists_name_existing_files() {
    let root = crate::root();
    let files = scanned_files(&root);
    for f in LONG_FN_ALLOWED.iter().map(|(f, _)| *f).chain(ISSUE_COMMENTS_ALLOWED.iter().copied()) {
        assert!(files.iter().any(|s| s == f), "allowlisted file {f} is not scanned (gone or moved?)");
    }
    for f in ISSUE_COMMENTS_ALLOWED {
        assert!(
            !issue_comments(&read(&root, f), f).is_empty(),
            "{f} no longer cites issues: drop it from ISSUE_COMMENTS_ALLOWED"
        );
    }
}

/// A function `fn name` of exactly `lines` lines whose body holds braces in
/// strings, chars and comments that would unbalance a naive count.
fn sample_fn(name: &str, lines: usize) -> String {
    let mut s = format!("fn {name}() {{\n");
    let tricky = [
        "    let _ = \"}}} {\";",
        "    let _ = '}';",
        "    // } closing brace in a comment",
        "    /* { nested /* } */ { */",
        "    let _ = r#\"}\"#;",
        "    let _: &'static str = \"\\\"}\";",
        "    let _ = b'{';",
    ];
    for k in 0..lines - 2 {
        s.push_str(tricky[k % tricky.len()]);
        s.push('\n');
    }
    s.push_str("}\n");
    s
}

#[test]
fn the_scanner_counts_lines_and_ignores_braces_in_literals_and_comments() {
    let src = format!(
        "//! fn not_a_fn() {{\n{}\n#[test]\n{}\ntrait T {{\n    fn decl(&self);\n}}\n{}",
        sample_fn("long", 121),
        sample_fn("limit", 120),
        sample_fn("after", 3)
    );
    let fns = functions(&src);
    let names: Vec<(&str, usize, bool)> = fns.iter().map(|f| (f.name.as_str(), f.lines, f.is_test)).collect();
    assert_eq!(names, [("long", 121, false), ("limit", 120, true), ("after", 3, false)]);
    assert_eq!(long_functions(&src, "x.rs"), ["x.rs:2 fn long (121 lines)"]);
}

#[test]
fn the_issue_rule_reads_only_comments() {
    let src = "/// See issue 12.\nfn f() { let _ = \"issue 3\"; } // tissue 4, issues\n/* two\n   Issue #7 */\n";
    assert_eq!(issue_comments(src, "x.rs"), ["x.rs:1: /// See issue 12.", "x.rs:4: Issue #7 */"]);
    assert!(!cites_issue("an issue with 2 fixes"));
}
