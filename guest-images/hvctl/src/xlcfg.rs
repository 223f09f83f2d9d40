//! The subset of Xen's xl.cfg that `hvctl create` reads: `key = value`
//! lines, `#` comments, strings in `"…"` or `'…'`, integers, and lists
//! `[ "a", "b" ]` (for `cpus`). Keys: `name`, `kernel`, `ramdisk`, `extra`
//! (or `cmdline`), `memory` (MiB), `vcpus`, `cpus`, `cpu_weight` (or
//! `weight`), `cap`, and our own `disk_size` (the RAM disk the hypervisor
//! serves, MiB). Keys xl knows that this hypervisor does not do are warned
//! about and ignored; anything else is an error naming its line.

use hv_core::control::create::{EXTRA_MAX, MAX_DISK_MIB, MAX_MEMORY_MIB, MAX_VCPUS, NAME_MAX};
use std::fmt;

/// A parsed configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XlCfg {
    pub name: String,
    pub kernel: String,
    pub ramdisk: Option<String>,
    pub extra: String,
    pub memory_mib: u32,
    pub vcpus: u32,
    /// `cpus`: `None` (or "all"): the vCPUs float; else the pCPUs, one for
    /// all or one per vCPU, comma-separated (the wire form).
    pub cpus: Option<String>,
    pub weight: Option<u32>,
    pub cap: Option<u32>,
    pub disk_mib: u32,
    /// Keys xl knows that are ignored here, for the warning.
    pub ignored: Vec<String>,
}

/// A configuration error: the line (1-based; 0 for the file as a whole)
/// and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CfgError {
    pub line: usize,
    pub what: String,
}

impl fmt::Display for CfgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            0 => write!(f, "{}", self.what),
            n => write!(f, "line {n}: {}", self.what),
        }
    }
}

/// Keys of xl.cfg this tool accepts and ignores (with a warning).
const IGNORED: &[&str] = &[
    "type",
    "builder",
    "on_poweroff",
    "on_reboot",
    "on_crash",
    "on_watchdog",
    "vif",
    "disk",
    "uuid",
    "maxmem",
    "maxvcpus",
    "device_tree",
    "dtdev",
    "iomem",
    "irqs",
    "gic_version",
    "tee",
    "vuart",
    "seclabel",
];

#[derive(Debug, PartialEq, Eq)]
enum Value {
    Str(String),
    Int(u64),
    List(Vec<String>),
}

/// One quoted string at the start of `s`: its contents and the rest.
fn quoted(s: &str) -> Option<(String, &str)> {
    let q = s.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let end = s[1..].find(q)? + 1;
    Some((s[1..end].to_string(), &s[end + 1..]))
}

/// Strips a `#` comment that is not inside quotes.
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') => return &line[..i],
            _ => {}
        }
    }
    line
}

fn value(s: &str) -> Result<Value, String> {
    let s = s.trim();
    if let Some(rest) = s.strip_prefix('[') {
        let inner = rest.strip_suffix(']').ok_or("a list must end with `]` on the same line")?;
        let mut items = Vec::new();
        let mut rest = inner.trim();
        while !rest.is_empty() {
            let (item, after) = quoted(rest).ok_or("list items must be quoted strings")?;
            items.push(item);
            rest = after.trim_start();
            rest = match rest.strip_prefix(',') {
                Some(r) => r.trim_start(),
                None if rest.is_empty() => rest,
                None => return Err("list items are separated by commas".into()),
            };
        }
        return Ok(Value::List(items));
    }
    if let Some((v, rest)) = quoted(s) {
        if !rest.trim().is_empty() {
            return Err(format!("unexpected `{}` after the string", rest.trim()));
        }
        return Ok(Value::Str(v));
    }
    s.parse().map(Value::Int).map_err(|_| format!("`{s}` is not a number, a quoted string or a list"))
}

fn string(key: &str, v: Value) -> Result<String, String> {
    match v {
        Value::Str(s) => Ok(s),
        _ => Err(format!("{key} must be a quoted string")),
    }
}

/// `name`: what the hypervisor accepts (`CreateSpec`), checked here so
/// that `create -n` and the line number show it.
fn name(v: Value) -> Result<String, String> {
    let n = string("name", v)?;
    let ok = n.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if n.is_empty() || n.len() > NAME_MAX || !ok {
        return Err(format!("name = \"{n}\": 1 to {NAME_MAX} of A-Z a-z 0-9 _ . -"));
    }
    Ok(n)
}

/// `extra`: printable ASCII (it travels as one `key=value` line).
fn extra(key: &str, v: Value) -> Result<String, String> {
    let e = string(key, v)?;
    if e.len() > EXTRA_MAX {
        return Err(format!("{key} is {} bytes long (at most {EXTRA_MAX})", e.len()));
    }
    if let Some(c) = e.chars().find(|c| !(' '..='~').contains(c)) {
        return Err(format!("{key} has {c:?}: only printable ASCII is passed"));
    }
    Ok(e)
}

fn int(key: &str, v: Value, max: u64) -> Result<u32, String> {
    match v {
        Value::Int(n) if n <= max => Ok(n as u32),
        Value::Int(n) => Err(format!("{key} = {n} is out of range (at most {max})")),
        _ => Err(format!("{key} must be a number")),
    }
}

/// `cpus`: "all", one pCPU, or a list with one pCPU per vCPU (with the
/// list's length, which must be `vcpus`). A set (`"0-3"`, `"0,2"`) would
/// let each vCPU run on several pCPUs, which this scheduler's pinning
/// cannot express.
fn cpus(v: Value) -> Result<(Option<String>, Option<usize>), String> {
    let one = |s: &str| s.trim().parse::<u32>().map_err(|_| s.to_string());
    let set_err = |s: &str| {
        format!("cpus = \"{s}\": only one pCPU (\"2\"), \"all\", or a list of one pCPU per vCPU ([\"0\", \"1\"]) is supported")
    };
    match v {
        Value::Str(s) if s.trim() == "all" => Ok((None, None)),
        Value::Str(s) => one(&s).map(|n| (Some(n.to_string()), None)).map_err(|s| set_err(&s)),
        Value::Int(n) => Ok((Some(n.to_string()), None)),
        Value::List(items) if items.is_empty() => Err("cpus = []: empty".into()),
        Value::List(items) => {
            let pcpus = items.iter().map(|i| one(i)).collect::<Result<Vec<u32>, String>>().map_err(|s| set_err(&s))?;
            Ok((Some(pcpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")), Some(pcpus.len())))
        }
    }
}

/// Parses an xl.cfg file's text.
pub fn parse(text: &str) -> Result<XlCfg, CfgError> {
    let mut c = XlCfg { vcpus: 1, ..Default::default() };
    let mut seen: Vec<&str> = Vec::new();
    // Checks across keys, made once every line is read: (line, value).
    let mut cpus_list: Option<(usize, usize)> = None;
    let mut cap_line = 0;
    for (i, raw) in text.lines().enumerate() {
        let err = |what: String| CfgError { line: i + 1, what };
        let line = strip_comment(raw).trim();
        if line.is_empty() {
            continue;
        }
        let (key, val) = line.split_once('=').ok_or_else(|| err(format!("expected `key = value`, got `{line}`")))?;
        let key = key.trim();
        let v = value(val).map_err(err)?;
        let canon = match key {
            "cmdline" => "extra",
            "weight" => "cpu_weight",
            k => k,
        };
        if seen.contains(&canon) {
            return Err(err(format!("{key} is given twice")));
        }
        match canon {
            "name" => c.name = name(v).map_err(err)?,
            "kernel" => c.kernel = string(key, v).map_err(err)?,
            "ramdisk" => c.ramdisk = Some(string(key, v).map_err(err)?),
            "extra" => c.extra = extra(key, v).map_err(err)?,
            "memory" => c.memory_mib = int(key, v, u64::from(MAX_MEMORY_MIB)).map_err(err)?,
            "vcpus" => c.vcpus = int(key, v, u64::from(MAX_VCPUS)).map_err(err)?,
            "cpus" => {
                let (pcpus, listed) = cpus(v).map_err(err)?;
                c.cpus = pcpus;
                cpus_list = listed.map(|n| (i + 1, n));
            }
            "cpu_weight" => c.weight = Some(int(key, v, 65535).map_err(err)?),
            "cap" => {
                c.cap = Some(int(key, v, 100 * u64::from(MAX_VCPUS)).map_err(err)?);
                cap_line = i + 1;
            }
            "disk_size" => c.disk_mib = int(key, v, u64::from(MAX_DISK_MIB)).map_err(err)?,
            k if IGNORED.contains(&k) => c.ignored.push(k.to_string()),
            k => return Err(err(format!("unknown key `{k}`"))),
        }
        if let Some(k) =
            ["name", "kernel", "ramdisk", "extra", "memory", "vcpus", "cpus", "cpu_weight", "cap", "disk_size"]
                .into_iter()
                .find(|k| *k == canon)
        {
            seen.push(k);
        }
    }
    let whole = |what: &str| CfgError { line: 0, what: what.into() };
    if c.name.is_empty() {
        return Err(whole("no `name`"));
    }
    if c.kernel.is_empty() {
        return Err(whole("no `kernel`"));
    }
    if c.memory_mib == 0 {
        return Err(whole("no `memory` (MiB)"));
    }
    if c.vcpus == 0 {
        return Err(whole("vcpus = 0"));
    }
    if c.weight == Some(0) {
        return Err(whole("cpu_weight = 0 (1..65535)"));
    }
    if let Some((line, n)) = cpus_list.filter(|&(_, n)| n != c.vcpus as usize) {
        let what = format!("cpus lists {n} pCPUs for {} vCPUs (one per vCPU, or one string for all)", c.vcpus);
        return Err(CfgError { line, what });
    }
    if let Some(cap) = c.cap.filter(|&cap| cap > 100 * c.vcpus) {
        let what = format!("cap = {cap} is out of range (at most 100 per vCPU: {})", 100 * c.vcpus);
        return Err(CfgError { line: cap_line, what });
    }
    Ok(c)
}

impl XlCfg {
    /// The `CREATE` payload's spec for files of these sizes.
    pub fn spec(&self, kernel_bytes: u64, ramdisk_bytes: u64) -> hv_core::control::create::CreateSpec<'_> {
        hv_core::control::create::CreateSpec {
            name: &self.name,
            memory_mib: self.memory_mib,
            vcpus: self.vcpus,
            weight: self.weight,
            cap: self.cap.filter(|&c| c > 0),
            cpus: self.cpus.as_deref(),
            extra: &self.extra,
            disk_mib: self.disk_mib,
            kernel_bytes,
            ramdisk_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
# A DomU.
name = "guest1"
kernel = "/boot/domu/Image"   # the kernel
ramdisk = '/boot/domu/initrd'
extra = "console=ttyAMA0 root=/dev/vda # not a comment"
memory = 256
vcpus = 2
cpus = ["0", "1"]
cpu_weight = 512
cap = 50
disk_size = 16
on_crash = "destroy"

type = "pvh"
vif = [ 'bridge=xenbr0' ]
disk = [ "phy:/dev/vg/guest1,xvda,w" ]
"#;

    #[test]
    fn a_config_parses_into_the_spec_the_hypervisor_reads() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.name, "guest1");
        assert_eq!(c.kernel, "/boot/domu/Image");
        assert_eq!(c.ramdisk.as_deref(), Some("/boot/domu/initrd"));
        assert_eq!(c.extra, "console=ttyAMA0 root=/dev/vda # not a comment");
        assert_eq!((c.memory_mib, c.vcpus, c.weight, c.cap, c.disk_mib), (256, 2, Some(512), Some(50), 16));
        assert_eq!(c.cpus.as_deref(), Some("0,1"));
        assert_eq!(c.ignored, ["on_crash", "type", "vif", "disk"]);
        let spec = c.spec(27 << 20, 7 << 20);
        let mut payload = String::new();
        spec.write(&mut payload).unwrap();
        assert_eq!(hv_core::control::create::CreateSpec::parse(payload.as_bytes()), Ok(spec));
        // The aliases xl also takes, and the defaults.
        let c = parse("name='a'\nkernel='k'\nmemory=64\ncmdline='x'\nweight=3\ncpus='all'\n").unwrap();
        assert_eq!((c.extra.as_str(), c.weight, c.vcpus, c.cpus, c.disk_mib), ("x", Some(3), 1, None, 0));
        assert_eq!(parse("name='a'\nkernel='k'\nmemory=64\ncpus=\"3\"").unwrap().cpus.as_deref(), Some("3"));
    }

    #[test]
    fn mistakes_name_their_line() {
        let base = "name = \"a\"\nkernel = \"k\"\nmemory = 64\n";
        for (extra, want) in [
            ("bogus = 1", "line 4: unknown key `bogus`"),
            ("memory = 65", "line 4: memory is given twice"),
            ("vcpus = \"2\"", "line 4: vcpus must be a number"),
            ("vcpus = 65", "line 4: vcpus = 65 is out of range (at most 64)"),
            ("cpus = \"0-3\"", "line 4: cpus = \"0-3\": only one pCPU"),
            ("cpus = [\"0\", 1]", "line 4: list items must be quoted strings"),
            ("cpus = [\"0\"", "line 4: a list must end with `]`"),
            ("extra = \"unterminated", "line 4: `\"unterminated` is not a number"),
            ("just words", "line 4: expected `key = value`"),
            ("cpu_weight = 70000", "line 4: cpu_weight = 70000 is out of range"),
            ("name = 'b' 'c'", "line 4: unexpected `'c'` after the string"),
        ] {
            let e = parse(&format!("{base}{extra}\n")).unwrap_err().to_string();
            assert!(e.starts_with(want), "{extra}: {e}");
        }
        // Exact wording of the checks that need the whole file or a value's
        // contents.
        for (text, want) in [
            (format!("{base}cpus = [\"0\", \"1\"]\n"), "line 4: cpus lists 2 pCPUs for 1 vCPUs (one per vCPU, or one string for all)"),
            (format!("{base}cap = 150\n"), "line 4: cap = 150 is out of range (at most 100 per vCPU: 100)"),
            (format!("{base}cpus = \"0,2\"\n"), "line 4: cpus = \"0,2\": only one pCPU (\"2\"), \"all\", or a list of one pCPU per vCPU ([\"0\", \"1\"]) is supported"),
            (format!("{base}kernel2 = 'x'\n"), "line 4: unknown key `kernel2`"),
            (format!("{base}ramdisk = [\"r\"]\n"), "line 4: ramdisk must be a quoted string"),
            (format!("{base}extra = \"a\tb\"\n"), "line 4: extra has '\\t': only printable ASCII is passed"),
            (format!("{base}cmdline = \"{}\"\n", "x".repeat(EXTRA_MAX + 1)), "line 4: cmdline is 1025 bytes long (at most 1024)"),
            (format!("{base}memory = -1\n"), "line 4: `-1` is not a number, a quoted string or a list"),
            ("name = 'a b'\n".into(), "line 1: name = \"a b\": 1 to 32 of A-Z a-z 0-9 _ . -"),
            (format!("name = '{}'\n", "n".repeat(NAME_MAX + 1)), "line 1: name = \"nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\": 1 to 32 of A-Z a-z 0-9 _ . -"),
            ("# c\n\nname = 'n'\nkernel = 'k'\nmemory = 64\nextra = 'a'\ncmdline = 'b'\n".into(), "line 7: cmdline is given twice"),
        ] {
            assert_eq!(parse(&text).unwrap_err().to_string(), want, "{text}");
        }
        // Cross-key checks hold whichever key comes first.
        assert!(parse(&format!("{base}cap = 150\nvcpus = 2\ncpus = ['3', \"4\"]\n")).is_ok());
        assert_eq!(parse("kernel='k'\nmemory=64").unwrap_err().to_string(), "no `name`");
        assert_eq!(parse("name='n'\nmemory=64").unwrap_err().to_string(), "no `kernel`");
        assert_eq!(parse("name='n'\nkernel='k'").unwrap_err().to_string(), "no `memory` (MiB)");
        assert_eq!(parse(&format!("{base}cpu_weight=0")).unwrap_err().to_string(), "cpu_weight = 0 (1..65535)");
    }
}
