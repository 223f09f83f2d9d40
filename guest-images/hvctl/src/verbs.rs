//! Each verb: the requests it makes and the text it prints, over any
//! [`Regs`] page (host-tested against hv-core's device model).

use crate::cli::Cmd;
use crate::client::{Client, Error};
use crate::format::{self, Domain};
use crate::regs::Regs;
use crate::top;
use hv_core::control::{op, UNCHANGED};
use std::time::{Duration, Instant};

fn text(b: Vec<u8>) -> String {
    String::from_utf8_lossy(&b).into_owned()
}

fn domains<R: Regs>(c: &Client<R>) -> Result<Vec<Domain>, Error> {
    Ok(format::domains(&text(c.simple(op::LIST, 0)?)))
}

/// The output of `cmd` (not `help`, `--version` or `top`).
pub fn exec<R: Regs>(c: &Client<R>, cmd: Cmd) -> Result<String, Error> {
    match cmd {
        Cmd::Help | Cmd::Version | Cmd::Top { .. } | Cmd::Create { .. } | Cmd::Shutdown { wait: true, .. } => {
            Err(Error::Other("not a device verb".into()))
        }
        Cmd::List { long: false } => Ok(format::list(&domains(c)?)),
        Cmd::List { long: true } => Ok(text(c.simple(op::LIST, 0)?)),
        Cmd::VcpuList => {
            let doms = domains(c)?;
            Ok(format::vcpu_list(&doms, &text(c.simple(op::VCPU_LIST, 0)?)))
        }
        Cmd::Stats { json } => {
            let t = text(c.paged(op::STATS)?);
            Ok(if json { format::stats_json(&t) + "\n" } else { t })
        }
        Cmd::TraceDump => Ok(text(c.paged(op::TRACE_DUMP)?)),
        Cmd::SchedShow { dom, global } => sched_show(c, dom.as_deref(), global),
        Cmd::SchedSet { dom, weight, cap } => sched_set(c, &dom, weight, cap),
        Cmd::Set { name, value } => {
            Ok(text(c.call(op::SET_OPTION, [0; 4], format!("{name}={value}").as_bytes())?.text))
        }
        Cmd::Shutdown { dom, wait: false } => {
            let doms = domains(c)?;
            Ok(text(c.simple(op::SHUTDOWN, resolve(&doms, &dom)?.domid)?))
        }
        Cmd::DomOp { op, dom } => {
            let doms = domains(c)?;
            Ok(text(c.simple(op, resolve(&doms, &dom)?.domid)?))
        }
    }
}

/// The domain `dom` names (an id or a name).
fn resolve<'a>(doms: &'a [Domain], dom: &str) -> Result<&'a Domain, Error> {
    let by_id = dom.parse::<u32>().ok();
    doms.iter()
        .find(|d| Some(d.domid) == by_id)
        .or_else(|| doms.iter().find(|d| d.name == dom))
        .ok_or_else(|| Error::Other(format!("no domain `{dom}`")))
}

fn sched_show<R: Regs>(c: &Client<R>, dom: Option<&str>, global: bool) -> Result<String, Error> {
    let doms = domains(c)?;
    if let Some(dom) = dom {
        let d = resolve(&doms, dom)?;
        return Ok(format::sched_table(&doms, &text(c.simple(op::SCHED_GET, d.domid)?)));
    }
    let t = text(c.simple(op::SCHED_GET, UNCHANGED)?);
    let pool = format::sched_global(&t).unwrap_or_default();
    Ok(if global { pool } else { pool + &format::sched_table(&doms, &t) })
}

fn sched_set<R: Regs>(c: &Client<R>, dom: &str, weight: Option<u32>, cap: Option<u32>) -> Result<String, Error> {
    let doms = domains(c)?;
    let d = resolve(&doms, dom)?;
    // The hypervisor checks too; a LIST without `vcpus=` leaves it to it.
    if let (Some(cap), true) = (cap, d.vcpus > 0) {
        let most = 100 * d.vcpus;
        if cap > most {
            return Err(Error::Other(format!("cap {cap} out of range (0..{most} for {} vCPUs)", d.vcpus)));
        }
    }
    let r = c.call(op::SCHED_SET_DOMAIN, [d.domid, weight.unwrap_or(UNCHANGED), cap.unwrap_or(UNCHANGED), 0], &[])?;
    Ok(text(r.text))
}

/// One sample for `top` (the stats are optional: a refusal leaves them out).
fn sample<R: Regs>(c: &Client<R>) -> Result<(top::Sample, Instant), Error> {
    let doms = domains(c)?;
    let at = Instant::now();
    let counters = c.paged(op::STATS).ok().map(|s| top::counters(&text(s)));
    Ok((top::Sample { doms, counters }, at))
}

/// `hvctl top`: `frames` frames (or forever) `delay` apart, each handed
/// to `out`.
pub fn top<R: Regs>(
    c: &Client<R>,
    delay: Duration,
    frames: Option<u64>,
    mut out: impl FnMut(&str) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut n = 0;
    let (mut before, mut t0) = sample(c)?;
    while frames.is_none_or(|f| n < f) {
        std::thread::sleep(delay);
        let (after, t1) = sample(c)?;
        let wall = u64::try_from(t1.duration_since(t0).as_nanos()).unwrap_or(u64::MAX);
        out(&(top::frame(&top::rows(&before, &after, wall)) + "\n"))?;
        (before, t0) = (after, t1);
        n += 1;
    }
    Ok(())
}

/// `hvctl shutdown -w` asks again this often while the domain runs: a
/// request that reached a kernel before its console driver started
/// waits for that driver's first interrupt, which an idle guest may
/// never take (`hv_core::vpl011`); asking again delivers it.
pub const SHUTDOWN_REPEAT: u32 = 25;

/// `hvctl shutdown -w DOM`: asks, then polls `LIST` every `poll` until
/// the domain is `shutdown` or gone (a domain `hvctl create` made is
/// destroyed when it powers off), as `xl shutdown -w` waits, with no time
/// limit; asks again every [`SHUTDOWN_REPEAT`] polls. Says which on `out`.
pub fn shutdown_wait<R: Regs>(
    c: &Client<R>,
    dom: &str,
    poll: Duration,
    mut out: impl FnMut(&str) -> Result<(), Error>,
) -> Result<(), Error> {
    let domid = resolve(&domains(c)?, dom)?.domid;
    c.simple(op::SHUTDOWN, domid)?;
    eprintln!("Waiting for d{domid} to shut down");
    let mut n: u32 = 0;
    loop {
        n = n.wrapping_add(1);
        std::thread::sleep(poll);
        match domains(c)?.iter().find(|d| d.domid == domid) {
            None => return out(&format!("d{domid}: shut down and destroyed\n")),
            Some(d) if d.state == "shutdown" => return out(&format!("d{domid}: shut down\n")),
            Some(_) if n.is_multiple_of(SHUTDOWN_REPEAT) => {
                c.simple(op::SHUTDOWN, domid)?;
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::fake::FakeRegs;
    use hv_core::control::{Reply, Request, Status};
    use std::cell::RefCell;
    use std::rc::Rc;

    const LIST: &str = "domid=0 name=Dom0 vcpus=2 memory_kib=262144 state=running run_ns=1000000000 weight=256 cap=0\n\
                        domid=1 name=guest1 vcpus=1 memory_kib=131072 state=blocked run_ns=0 weight=256 cap=0\n";

    /// A client over the device model whose executor answers LIST and
    /// records every other request it runs.
    fn client(seen: Rc<RefCell<Vec<String>>>) -> Client<FakeRegs> {
        let exec = move |r: Request<'_>| -> Result<Reply, Status> {
            let reply = |t: &str| Ok(Reply { text: t.as_bytes().to_vec(), more: 0 });
            match r {
                Request::List => reply(LIST),
                Request::SchedGet { dom: None } => reply("ratelimit_us=1000 runqueue=all\ndomid=0 weight=256 cap=0\n"),
                Request::Destroy { dom: 0 } => Err(Status::Perm),
                other => {
                    seen.borrow_mut().push(format!("{other:?}"));
                    reply("")
                }
            }
        };
        let mut c = Client::new(FakeRegs::new(Box::new(exec)));
        c.retry = Duration::ZERO;
        c
    }

    #[test]
    fn verbs_send_what_they_mean() {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let c = client(seen.clone());
        let s = |dom: &str, weight, cap| Cmd::SchedSet { dom: dom.into(), weight, cap };
        exec(&c, s("guest1", Some(512), None)).unwrap();
        exec(&c, s("0", None, Some(0))).unwrap();
        exec(&c, Cmd::DomOp { op: op::PAUSE, dom: "guest1".into() }).unwrap();
        exec(&c, Cmd::Set { name: "sched_ratelimit_us".into(), value: "500".into() }).unwrap();
        assert_eq!(
            *seen.borrow(),
            [
                "SchedSetDomain { dom: 1, weight: Some(512), cap: None }",
                "SchedSetDomain { dom: 0, weight: None, cap: Some(0) }",
                "Pause { dom: 1 }",
                "SetOption { name: \"sched_ratelimit_us\", value: \"500\" }",
            ]
        );
    }

    #[test]
    fn mistakes_and_refusals_are_one_line() {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let c = client(seen.clone());
        let e = exec(&c, Cmd::SchedSet { dom: "guest1".into(), weight: None, cap: Some(101) }).unwrap_err();
        assert_eq!(e.to_string(), "cap 101 out of range (0..100 for 1 vCPUs)");
        let e = exec(&c, Cmd::Shutdown { dom: "nobody".into(), wait: false }).unwrap_err();
        assert_eq!(e.to_string(), "no domain `nobody`");
        let e = exec(&c, Cmd::DomOp { op: op::DESTROY, dom: "Dom0".into() }).unwrap_err();
        assert_eq!(e.to_string(), "not permitted");
        assert!(seen.borrow().is_empty(), "nothing was sent: {:?}", seen.borrow());
    }

    #[test]
    fn shutdown_waits_until_the_domain_is_gone() {
        // The domain runs for SHUTDOWN_REPEAT + 1 more LISTs after the
        // request (asked again once), then is gone (a created one is
        // destroyed when it powers off).
        let lists = Rc::new(RefCell::new(0));
        let (asked, n) = (Rc::new(RefCell::new(Vec::new())), lists.clone());
        let a = asked.clone();
        let exec = move |r: Request<'_>| -> Result<Reply, Status> {
            let t = match r {
                Request::List => {
                    *n.borrow_mut() += 1;
                    if *n.borrow() <= SHUTDOWN_REPEAT + 2 {
                        LIST
                    } else {
                        &LIST[..LIST.find("domid=1").unwrap()]
                    }
                }
                other => {
                    a.borrow_mut().push(format!("{other:?}"));
                    ""
                }
            };
            Ok(Reply { text: t.as_bytes().to_vec(), more: 0 })
        };
        let mut c = Client::new(FakeRegs::new(Box::new(exec)));
        c.retry = Duration::ZERO;
        let mut said = String::new();
        shutdown_wait(&c, "guest1", Duration::ZERO, |s| {
            said.push_str(s);
            Ok(())
        })
        .unwrap();
        assert_eq!(*asked.borrow(), ["Shutdown { dom: 1 }", "Shutdown { dom: 1 }"]);
        assert_eq!(*lists.borrow(), SHUTDOWN_REPEAT + 3);
        assert_eq!(said, "d1: shut down and destroyed\n");
        // An unknown domain: an error before any request.
        let c = client(Rc::default());
        assert!(shutdown_wait(&c, "nobody", Duration::ZERO, |_| Ok(())).is_err());
    }

    #[test]
    fn tables_come_from_the_answers() {
        let c = client(Rc::default());
        let list = exec(&c, Cmd::List { long: false }).unwrap();
        assert!(list.lines().nth(2).unwrap().starts_with("guest1 "), "{list}");
        let sched = exec(&c, Cmd::SchedShow { dom: None, global: false }).unwrap();
        assert!(sched.starts_with("Cpupool Pool-0: ratelimit=1000us runq=all\nName "), "{sched}");
        let mut frames = Vec::new();
        top(&c, Duration::ZERO, Some(2), |f| {
            frames.push(f.to_string());
            Ok(())
        })
        .unwrap();
        assert_eq!(frames.len(), 2);
        assert!(frames[0].starts_with("hvctl top - 2 domains\n"), "{}", frames[0]);
    }
}
