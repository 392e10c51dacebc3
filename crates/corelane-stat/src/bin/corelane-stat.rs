//! `corelane-stat`: what a running corelane server is doing, from outside the process.
//!
//! ```text
//! corelane-stat [--iface IF] [--all] [--json] [COMMAND]
//!   list                 runtimes publishing statistics (default when several)
//!   conns [--state S] [--port P]
//!                        connections, like `ss -tn` (asks each core for a snapshot)
//!   cores                per-core totals, once
//!   top [--interval S] [--count N]
//!                        per-core rates every S seconds (default 1), the slowest stage marked
//!   prometheus           the metrics in Prometheus' text format
//!   capture -w FILE [-c N] [-s SNAP] [--seconds S] [--host H] [--port P] [--proto P]
//!                        frames received and sent, as pcapng (Wireshark, tcpdump -r),
//!                        every core's merged by time; until N frames, S seconds or Ctrl-C
//! ```
//!
//! It finds runtimes under `/run/corelane` (or `CORELANE_RUN_DIR`) in its own network namespace
//! (run it with `ip netns exec NS` beside a server in a namespace), or in all with `--all`. It
//! may start before or after the server and follows it across restarts.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use corelane_stat::{ConnSnapshot, CoreCounters, Stats};

const USAGE: &str = "usage: corelane-stat [--iface IF] [--all] [--json] \
[list | conns [--state S] [--port P] | cores | top [--interval S] [--count N] | prometheus \
| capture -w FILE [-c N] [-s SNAP] [--seconds S] [--host H] [--port P] [--proto tcp|udp|icmp|icmp6|N]]";

#[derive(Debug, Default)]
struct Args {
    iface: Option<String>,
    all: bool,
    json: bool,
    command: String,
    state: Option<String>,
    port: Option<u16>,
    interval: f64,
    count: Option<u64>,
    write: Option<String>,
    snap: Option<usize>,
    seconds: Option<f64>,
    host: Option<std::net::IpAddr>,
    proto: Option<u8>,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        interval: 1.0,
        ..Args::default()
    };
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--iface" | "-i" => a.iface = Some(value("--iface")?),
            "--all" => a.all = true,
            "--json" => a.json = true,
            "--state" => a.state = Some(value("--state")?.to_uppercase().replace('_', "-")),
            "--port" => {
                a.port = Some(
                    value("--port")?
                        .parse()
                        .map_err(|_| "--port takes a number")?,
                )
            }
            "--interval" => {
                a.interval = value("--interval")?
                    .parse()
                    .ok()
                    .filter(|s: &f64| *s >= 0.1)
                    .ok_or("--interval takes seconds, at least 0.1")?
            }
            "-w" | "--write" => a.write = Some(value("-w")?),
            "-s" | "--snap" => {
                a.snap = Some(
                    value("-s")?
                        .parse()
                        .ok()
                        .filter(|s| (14..=65535).contains(s))
                        .ok_or("-s takes bytes, 14 to 65535")?,
                )
            }
            "--seconds" => {
                a.seconds = Some(
                    value("--seconds")?
                        .parse()
                        .ok()
                        .filter(|s: &f64| *s > 0.0)
                        .ok_or("--seconds takes a positive number")?,
                )
            }
            "--host" => {
                a.host = Some(
                    value("--host")?
                        .parse()
                        .map_err(|_| "--host takes an IPv4 or IPv6 address")?,
                )
            }
            "--proto" => {
                a.proto = Some(match value("--proto")?.as_str() {
                    "tcp" => 6,
                    "udp" => 17,
                    "icmp" => 1,
                    "icmp6" | "icmpv6" => 58,
                    n => n
                        .parse()
                        .map_err(|_| "--proto takes tcp, udp, icmp, icmp6 or a number")?,
                })
            }
            "--count" | "-c" => {
                a.count = Some(
                    value("--count")?
                        .parse()
                        .map_err(|_| "--count takes a number")?,
                )
            }
            "-h" | "--help" => return Err(USAGE.into()),
            c if !c.starts_with('-') && a.command.is_empty() => a.command = c.to_string(),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    Ok(a)
}

/// The stats files this invocation is about.
fn targets(a: &Args) -> Result<Vec<PathBuf>, String> {
    let ns = if a.all {
        None
    } else {
        Some(corelane_stat::netns_id().map_err(|e| format!("network namespace: {e}"))?)
    };
    let run = corelane_stat::run_dir();
    let mut found = corelane_stat::find(&run, ns.as_deref());
    if let Some(i) = &a.iface {
        found.retain(|p| p.parent().and_then(|d| d.file_name()) == Some(i.as_ref()));
    }
    Ok(found)
}

fn open_one(a: &Args) -> Result<Stats, String> {
    let found = targets(a)?;
    match found.as_slice() {
        [] => Err(format!(
            "no corelane runtime publishes statistics{} under {} in this network namespace \
             (is the server running, and is this the namespace it runs in? `ip netns exec NS \
             corelane-stat`, or --all)",
            a.iface
                .as_ref()
                .map(|i| format!(" for {i}"))
                .unwrap_or_default(),
            corelane_stat::run_dir().display()
        )),
        [one] => Stats::open(one).map_err(|e| format!("{}: {e}", one.display())),
        many => Err(format!(
            "{} runtimes publish here; pick one with --iface ({})",
            many.len(),
            many.iter()
                .filter_map(|p| p.parent()?.file_name()?.to_str().map(String::from))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn list(a: &Args) -> Result<(), String> {
    let mut rows = Vec::new();
    for p in targets(a)? {
        match Stats::open(&p) {
            Ok(s) => rows.push((p, Some(s))),
            Err(_) => rows.push((p, None)),
        }
    }
    if a.json {
        let items: Vec<String> = rows
            .iter()
            .filter_map(|(p, s)| {
                let s = s.as_ref()?;
                Some(format!(
                    "{{\"path\":{},\"iface\":{},\"pid\":{},\"alive\":{},\"cores\":{}}}",
                    json_str(&p.display().to_string()),
                    json_str(&s.ifname()),
                    s.pid(),
                    s.alive(),
                    s.cores().len()
                ))
            })
            .collect();
        println!("[{}]", items.join(","));
        return Ok(());
    }
    println!(
        "{:<16} {:>8} {:>6} {:>6}  PATH",
        "IFACE", "PID", "CORES", "ALIVE"
    );
    for (p, s) in rows {
        match s {
            Some(s) => println!(
                "{:<16} {:>8} {:>6} {:>6}  {}",
                s.ifname(),
                s.pid(),
                s.cores().len(),
                if s.alive() { "yes" } else { "no" },
                p.display()
            ),
            None => println!(
                "{:<16} {:>8} {:>6} {:>6}  {}",
                "?",
                "?",
                "?",
                "?",
                p.display()
            ),
        }
    }
    Ok(())
}

fn fmt_dur(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.3}", d.as_secs_f64() * 1000.0))
}

fn conns(a: &Args) -> Result<(), String> {
    let s = open_one(a)?;
    let snap: ConnSnapshot = s.connections(Duration::from_millis(1500));
    shrunk(&s)?;
    let shown: Vec<_> = snap
        .conns
        .iter()
        .filter(|c| a.state.as_ref().is_none_or(|st| c.state_name() == st))
        .filter(|c| {
            a.port
                .is_none_or(|p| c.local.port() == p || c.remote.port() == p)
        })
        .collect();
    if a.json {
        let items: Vec<String> = shown
            .iter()
            .map(|c| {
                format!(
                    "{{\"core\":{},\"state\":{},\"local\":{},\"remote\":{},\"bytes_in\":{},\
                     \"bytes_out\":{},\"retrans\":{},\"srtt_us\":{},\"rttvar_us\":{},\"cwnd\":{},\
                     \"send_queue\":{},\"recv_queue\":{}}}",
                    c.core,
                    json_str(c.state_name()),
                    json_str(&c.local.to_string()),
                    json_str(&c.remote.to_string()),
                    c.bytes_in,
                    c.bytes_out,
                    c.retrans,
                    c.srtt.map_or("null".into(), |d| d.as_micros().to_string()),
                    c.rttvar
                        .map_or("null".into(), |d| d.as_micros().to_string()),
                    c.cwnd,
                    c.send_queue,
                    c.recv_queue
                )
            })
            .collect();
        println!(
            "{{\"total\":{},\"stale_cores\":{:?},\"connections\":[{}]}}",
            snap.total,
            snap.stale_cores,
            items.join(",")
        );
        return Ok(());
    }
    println!(
        "{:<12} {:>7} {:>7} {:<40} {:<40} {:>12} {:>12} {:>6} {:>9} {:>9} {:>8} {:>4}",
        "STATE",
        "RECV-Q",
        "SEND-Q",
        "LOCAL",
        "PEER",
        "BYTES-IN",
        "BYTES-OUT",
        "RETR",
        "SRTT-MS",
        "RTTVAR",
        "CWND",
        "CORE"
    );
    for c in &shown {
        println!(
            "{:<12} {:>7} {:>7} {:<40} {:<40} {:>12} {:>12} {:>6} {:>9} {:>9} {:>8} {:>4}",
            c.state_name(),
            c.recv_queue,
            c.send_queue,
            c.local.to_string(),
            c.remote.to_string(),
            c.bytes_in,
            c.bytes_out,
            c.retrans,
            fmt_dur(c.srtt),
            fmt_dur(c.rttvar),
            c.cwnd,
            c.core
        );
    }
    let listed = snap.conns.len() as u64;
    println!(
        "{} shown, {} listed, {} in all{}",
        shown.len(),
        listed,
        snap.total,
        if snap.stale_cores.is_empty() {
            String::new()
        } else {
            format!(
                "; cores {:?} did not answer (their last snapshot is shown)",
                snap.stale_cores
            )
        }
    );
    Ok(())
}

const STAGES: [&str; 7] = [
    "rx",
    "classify",
    "handoff_in",
    "protocol",
    "egress",
    "tx",
    "tasks",
];

fn cores_json(cores: &[CoreCounters], rates: Option<&BTreeMap<(usize, String), f64>>) -> String {
    let items: Vec<String> = cores
        .iter()
        .map(|c| {
            let vals: Vec<String> = c
                .values
                .iter()
                .map(|(n, v)| format!("{}:{v}", json_str(n)))
                .collect();
            let mut o = format!("{{\"core\":{},\"counters\":{{{}}}", c.index, vals.join(","));
            if let Some(r) = rates {
                let rs: Vec<String> = r
                    .iter()
                    .filter(|((i, _), _)| *i == c.index)
                    .map(|((_, n), v)| format!("{}:{v:.1}", json_str(n)))
                    .collect();
                o.push_str(&format!(",\"per_second\":{{{}}}", rs.join(",")));
            }
            o.push('}');
            o
        })
        .collect();
    format!("[{}]", items.join(","))
}

fn cores(a: &Args) -> Result<(), String> {
    let s = open_one(a)?;
    let cores = s.cores();
    shrunk(&s)?;
    if a.json {
        println!("{}", cores_json(&cores, None));
        return Ok(());
    }
    for c in &cores {
        println!("core {}:", c.index);
        for (n, v) in &c.values {
            println!("  {n:<24} {v}");
        }
    }
    Ok(())
}

/// The stage that took the most time per second on a core, with its share.
fn slowest(rates: &BTreeMap<(usize, String), f64>, core: usize) -> Option<(&'static str, f64)> {
    STAGES
        .iter()
        .map(|st| {
            let ns = rates
                .get(&(core, format!("stage_{st}_ns")))
                .copied()
                .unwrap_or(0.0);
            (*st, ns / 1e9)
        })
        .filter(|(_, share)| *share > 0.0)
        .max_by(|x, y| x.1.total_cmp(&y.1))
}

/// A stats file truncated while it was read holds zeros, not counters: said, not shown.
fn shrunk(s: &Stats) -> Result<(), String> {
    if s.shrunk() {
        return Err(format!(
            "{}: truncated while it was read (by the user of the runtime that writes it): \
             what it holds now is not the runtime's counters",
            s.path().display()
        ));
    }
    Ok(())
}

fn top(a: &Args) -> Result<(), String> {
    let mut prev: Option<(Instant, u32, Vec<CoreCounters>)> = None;
    let mut rounds = 0u64;
    loop {
        // Re-open every round: a restarted server writes a new file.
        match open_one(a) {
            Ok(s) if s.alive() => {
                let now = Instant::now();
                let cores = s.cores();
                shrunk(&s)?;
                if let Some((t, pid, before)) = &prev
                    && *pid == s.pid()
                {
                    let dt = now.duration_since(*t).as_secs_f64();
                    let mut rates = BTreeMap::new();
                    for (c, b) in cores.iter().zip(before) {
                        for (n, r) in c.rates_since(b, dt) {
                            rates.insert((c.index, n), r);
                        }
                    }
                    print_rates(a, &s, &cores, &rates);
                    rounds += 1;
                    if a.count.is_some_and(|n| rounds >= n) {
                        return Ok(());
                    }
                }
                prev = Some((now, s.pid(), cores));
            }
            Ok(s) => {
                eprintln!(
                    "corelane-stat: pid {} on {} has ended; waiting",
                    s.pid(),
                    s.ifname()
                );
                prev = None;
            }
            Err(e) => {
                eprintln!("corelane-stat: {e}; waiting");
                prev = None;
            }
        }
        std::thread::sleep(Duration::from_secs_f64(a.interval));
    }
}

fn print_rates(
    a: &Args,
    s: &Stats,
    cores: &[CoreCounters],
    rates: &BTreeMap<(usize, String), f64>,
) {
    if a.json {
        println!("{}", cores_json(cores, Some(rates)));
        return;
    }
    let r = |c: usize, n: &str| rates.get(&(c, n.to_string())).copied().unwrap_or(0.0);
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (h, m, sec) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    // A title line, then the columns: rates per second over the last interval.
    println!(
        "{} pid {} at {h:02}:{m:02}:{sec:02} UTC, per second over the last {} s",
        s.ifname(),
        s.pid(),
        a.interval
    );
    println!(
        "{:>4} {:>10} {:>10} {:>10} {:>10} {:>8} {:>7} {:>9}  SLOWEST STAGE",
        "CORE", "RX/S", "TX/S", "RXMB/S", "TXMB/S", "FLOWS", "RETR/S", "SYNWAIT/S"
    );
    for c in cores {
        let slow = slowest(rates, c.index).map_or("-".into(), |(st, share)| {
            format!("{st} ({:.0}% of the core)", share * 100.0)
        });
        println!(
            "{:>4} {:>10.0} {:>10.0} {:>10.1} {:>10.1} {:>8} {:>7.0} {:>9.1}  {slow}",
            c.index,
            r(c.index, "rx_frames"),
            r(c.index, "tx_frames"),
            r(c.index, "tcp_bytes_in") / 1e6,
            r(c.index, "tcp_bytes_out") / 1e6,
            c.get("flows").unwrap_or(0),
            r(c.index, "tcp_retrans_segs"),
            r(c.index, "tcp_syn_timeouts"),
        );
    }
}

fn capture(a: &Args) -> Result<(), String> {
    let Some(path) = &a.write else {
        return Err(format!(
            "capture needs -w FILE (- for standard output)\n{USAGE}"
        ));
    };
    let s = open_one(a)?;
    if !s.alive() {
        return Err(format!("the runtime on {} has ended", s.ifname()));
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| format!("signals: {e}"))?;
    }
    let filter = corelane_stat::Filter {
        proto: a.proto,
        port: a.port,
        host: a.host,
    };
    let until = a
        .seconds
        .map(|s| Instant::now() + Duration::from_secs_f64(s));
    let snap = a.snap.unwrap_or(65535);
    let cap = s
        .capture(filter, snap)
        .map_err(|e| format!("capture on {}: {e}", s.ifname()))?;
    // As tcpdump does: from here on every frame a core handles is seen.
    eprintln!(
        "capturing on {} ({} core(s)), snap length {} bytes",
        s.ifname(),
        s.cores().len(),
        cap.snap()
    );
    let done = if path == "-" {
        let out = std::io::BufWriter::new(std::io::stdout().lock());
        corelane_stat::record(cap, a.count, until, &stop, out)
    } else {
        // The frames are the traffic: the file is this user's alone (as the ring is), and
        // never written through a link.
        let file = corelane_stat::open_file(std::path::Path::new(path), true, Some(0o600))
            .and_then(|f| {
                f.set_len(0)?;
                Ok(f)
            })
            .map_err(|e| format!("{path}: {e}"))?;
        let out = std::io::BufWriter::new(file);
        corelane_stat::record(cap, a.count, until, &stop, out)
    }
    .map_err(|e| format!("capture on {}: {e}", s.ifname()))?;
    eprintln!(
        "{} frame(s) captured on {}{}",
        done.frames,
        s.ifname(),
        if done.dropped > 0 {
            format!(
                "; {} more dropped from a full capture ring (the frames themselves went on: \
                 narrow the filter or lower -s)",
                done.dropped
            )
        } else {
            String::new()
        }
    );
    Ok(())
}

fn run(a: &Args) -> Result<(), String> {
    match a.command.as_str() {
        "" => {
            if targets(a)?.len() == 1 {
                top(a)
            } else {
                list(a)
            }
        }
        "list" => list(a),
        "conns" | "connections" => conns(a),
        "cores" => cores(a),
        "top" => top(a),
        "capture" => capture(a),
        "prometheus" | "metrics" => {
            let s = open_one(a)?;
            let text = corelane_stat::prometheus(&s);
            shrunk(&s).map(|()| print!("{text}"))
        }
        other => Err(format!("unknown command `{other}`\n{USAGE}")),
    }
}

fn main() -> ExitCode {
    let outcome = parse(std::env::args().skip(1)).and_then(|a| run(&a));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corelane-stat: {e}");
            ExitCode::FAILURE
        }
    }
}
