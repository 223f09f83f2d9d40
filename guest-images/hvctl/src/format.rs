//! The device's text answers parsed (`key=value` lines, unknown keys
//! tolerated) and printed the way Xen's `xl` prints them; the stats as
//! JSON. Pure: no device access.

use std::fmt::Write as _;

/// One response line's `key=value` pairs, in order (words without `=`
/// are skipped).
pub fn pairs(line: &str) -> Vec<(&str, &str)> {
    line.split_whitespace().filter_map(|w| w.split_once('=')).collect()
}

/// The value of `key` in `pairs`.
fn get<'a>(p: &[(&str, &'a str)], key: &str) -> Option<&'a str> {
    p.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

fn num<T: std::str::FromStr>(p: &[(&str, &str)], key: &str) -> Option<T> {
    get(p, key).and_then(|v| v.parse().ok())
}

/// A `LIST` line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Domain {
    pub domid: u32,
    pub name: String,
    pub vcpus: u32,
    pub memory_kib: u64,
    pub state: String,
    pub run_ns: u64,
    pub weight: Option<u32>,
    pub cap: Option<u32>,
}

/// The domains of a `LIST` response (lines without `domid=` are skipped).
pub fn domains(text: &str) -> Vec<Domain> {
    text.lines()
        .filter_map(|l| {
            let p = pairs(l);
            Some(Domain {
                domid: num(&p, "domid")?,
                name: get(&p, "name").unwrap_or("").to_string(),
                vcpus: num(&p, "vcpus").unwrap_or(0),
                memory_kib: num(&p, "memory_kib").unwrap_or(0),
                state: get(&p, "state").unwrap_or("").to_string(),
                run_ns: num(&p, "run_ns").unwrap_or(0),
                weight: num(&p, "weight"),
                cap: num(&p, "cap"),
            })
        })
        .collect()
}

/// xl's six state letters (`rbpscd`) for a domain's `state=`.
pub fn state_letters(state: &str) -> &'static str {
    match state {
        "running" => "r-----",
        "blocked" => "-b----",
        "paused" => "--p---",
        "shutdown" => "---s--",
        "crashed" => "---sc-",
        "dying" => "-----d",
        _ => "------",
    }
}

fn opt(v: Option<u32>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// `hvctl list`: `xl list`'s table plus `Weight` and `Cap`.
pub fn list(doms: &[Domain]) -> String {
    let mut s =
        String::from("Name                                        ID   Mem VCPUs\tState\tTime(s) Weight   Cap\n");
    for d in doms {
        let _ = writeln!(
            s,
            "{:<40} {:>5} {:>5} {:>5}     {}  {:>8.1} {:>6} {:>5}",
            d.name,
            d.domid,
            d.memory_kib / 1024,
            d.vcpus,
            state_letters(&d.state),
            d.run_ns as f64 / 1e9,
            opt(d.weight),
            opt(d.cap)
        );
    }
    s
}

/// The name of domain `domid` in `doms`, or its number.
pub fn name_of(doms: &[Domain], domid: u32) -> String {
    doms.iter().find(|d| d.domid == domid && !d.name.is_empty()).map_or_else(|| domid.to_string(), |d| d.name.clone())
}

/// `hvctl vcpu-list`: `xl vcpu-list`'s table with `Credit` where xl
/// prints the affinity.
pub fn vcpu_list(doms: &[Domain], text: &str) -> String {
    let mut s =
        format!("{:<32} {:>5} {:>5} {:>5} {:>5} {:>9} {}\n", "Name", "ID", "VCPU", "CPU", "State", "Time(s)", "Credit");
    for l in text.lines() {
        let p = pairs(l);
        let Some(domid) = num::<u32>(&p, "domid") else { continue };
        let name = get(&p, "name").map_or_else(|| name_of(doms, domid), str::to_string);
        let state = match get(&p, "state").unwrap_or("") {
            "running" => "r-",
            "blocked" => "-b",
            "offline" => "--p",
            _ => "--",
        };
        let _ = writeln!(
            s,
            "{:<32} {:>5} {:>5} {:>5} {:>5} {:>9.1}  {}",
            name,
            domid,
            get(&p, "vcpu").unwrap_or("-"),
            get(&p, "pcpu").unwrap_or("-"),
            state,
            num::<u64>(&p, "run_ns").unwrap_or(0) as f64 / 1e9,
            get(&p, "credit").unwrap_or("-")
        );
    }
    s
}

/// `SCHED_GET`'s scheduler-wide line (the one with `ratelimit_us=`), as
/// `xl sched-credit2` prints its pool line.
pub fn sched_global(text: &str) -> Option<String> {
    let line = text.lines().find(|l| pairs(l).iter().any(|(k, _)| *k == "ratelimit_us"))?;
    let mut s = String::from("Cpupool Pool-0:");
    for (k, v) in pairs(line) {
        match k {
            "ratelimit_us" => write!(s, " ratelimit={v}us"),
            "runqueue" => write!(s, " runq={v}"),
            _ => write!(s, " {k}={v}"),
        }
        .expect("writing to a String");
    }
    Some(s + "\n")
}

/// `SCHED_GET`'s per-domain lines as `xl sched-credit2`'s table.
pub fn sched_table(doms: &[Domain], text: &str) -> String {
    let mut s = format!("{:<33} {:>4} {:>6} {:>4}\n", "Name", "ID", "Weight", "Cap");
    for l in text.lines() {
        let p = pairs(l);
        let Some(domid) = num::<u32>(&p, "domid") else { continue };
        let name = get(&p, "name").map_or_else(|| name_of(doms, domid), str::to_string);
        let _ = writeln!(
            s,
            "{:<33} {:>4} {:>6} {:>4}",
            name,
            domid,
            get(&p, "weight").unwrap_or("-"),
            get(&p, "cap").unwrap_or("-")
        );
    }
    s
}

/// A JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The stats' `key=value` lines as one JSON object, in their order (a
/// repeated key keeps its last value): numbers where the value parses as
/// an integer, strings otherwise; the `(HV) stats …` markers and other
/// lines without `=` dropped.
pub fn stats_json(text: &str) -> String {
    let mut fields: Vec<(&str, String)> = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with("(HV)") {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else { continue };
        let value = if v.parse::<u64>().is_ok() || v.parse::<i64>().is_ok() { v.to_string() } else { json_str(v) };
        match fields.iter_mut().find(|(key, _)| *key == k) {
            Some(f) => f.1 = value,
            None => fields.push((k, value)),
        }
    }
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("{}:{v}", json_str(k))).collect();
    format!("{{{}}}", body.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &str = "domid=0 name=Dom0 vcpus=2 memory_kib=262144 state=running run_ns=123456789 weight=256 cap=0\n\
        domid=1 name=guest1 vcpus=4 memory_kib=524288 state=blocked run_ns=5000000000 weight=512 cap=150 future=x\n\
        domid=2 name=odd vcpus=1 memory_kib=1024 state=hibernating run_ns=0\n\
        garbage line\n";

    #[test]
    fn list_reads_known_keys_and_tolerates_others() {
        let d = domains(LIST);
        assert_eq!(d.len(), 3);
        assert_eq!(d[1].name, "guest1");
        assert_eq!((d[1].vcpus, d[1].memory_kib, d[1].weight, d[1].cap), (4, 524288, Some(512), Some(150)));
        assert_eq!((d[2].weight, d[2].cap), (None, None));
    }

    #[test]
    fn list_prints_like_xl() {
        let out = list(&domains(LIST));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "Name                                        ID   Mem VCPUs\tState\tTime(s) Weight   Cap");
        assert_eq!(
            lines[1],
            "Dom0                                         0   256     2     r-----       0.1    256     0"
        );
        assert_eq!(
            lines[2],
            "guest1                                       1   512     4     -b----       5.0    512   150"
        );
        assert!(lines[3].contains(" ------ ") && lines[3].ends_with("     -     -"), "{}", lines[3]);
        assert_eq!(state_letters("paused"), "--p---");
    }

    #[test]
    fn vcpu_list_prints_like_xl() {
        let doms = domains(LIST);
        let out = vcpu_list(
            &doms,
            "domid=0 vcpu=0 pcpu=1 state=running run_ns=2500000000 credit=10500000\n\
             domid=1 vcpu=3 pcpu=- state=offline run_ns=0 credit=0 new=1\n",
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "Name                                ID  VCPU   CPU State   Time(s) Credit");
        assert_eq!(lines[1], "Dom0                                 0     0     1    r-       2.5  10500000");
        assert_eq!(lines[2], "guest1                               1     3     -   --p       0.0  0");
    }

    #[test]
    fn sched_prints_the_pool_line_and_the_table() {
        let text = "ratelimit_us=1000 runqueue=all max_cpus_runqueue=16 wake_preempt=on\n\
                    domid=0 weight=256 cap=0\ndomid=1 weight=512 cap=50\n";
        assert_eq!(
            sched_global(text).unwrap(),
            "Cpupool Pool-0: ratelimit=1000us runq=all max_cpus_runqueue=16 wake_preempt=on\n"
        );
        let t = sched_table(&domains(LIST), text);
        assert_eq!(
            t,
            "Name                                ID Weight  Cap\n\
             Dom0                                 0    256    0\n\
             guest1                               1    512   50\n"
        );
        assert_eq!(sched_global("domid=0 weight=1 cap=0\n"), None);
    }

    #[test]
    fn stats_become_one_json_object() {
        let text = "(HV) stats begin 1\nexits=12\ndom0.exits=7\ntemp=-3\nmode=on \"x\"\nbig=18446744073709551615\n\
                    exits=13\nnoise\n(HV) stats end 1\n";
        assert_eq!(
            stats_json(text),
            r#"{"exits":13,"dom0.exits":7,"temp":-3,"mode":"on \"x\"","big":18446744073709551615}"#
        );
        assert_eq!(stats_json(""), "{}");
        assert_eq!(json_str("a\\b\u{1}"), r#""a\\b\u0001""#);
    }
}
