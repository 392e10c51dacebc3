//! The seeds' multi-core experiments at any core count: corelane on 1..=N cores (one queue of
//! an N-queue veth each) against kernel clients on the CPUs left over, in one run.
//!
//! - `rr`: 64-byte requests answered one at a time on `--conns-per-core` connections per
//!   serving core: requests per second, per core, the runtime's CPU per request, and the
//!   scaling efficiency (rate at k cores over k times the rate at one).
//! - `bulk`: kernel senders (four connections per serving core) into a corelane sink as fast as
//!   they can: Gbit/s, per core, the runtime's CPU seconds per GB, the efficiency.
//!   One lane against two (seed 003) is the k = 1 and k = 2 rows of both.
//! - `placement` (seed 000): the request/response case at N / 2 lanes (at least one) with the
//!   protocol and the application on one core, on two sharing a cache, and spread apart.
//! - `accept` (seed 002): `--accept` connections opened at once against N cores: how long until
//!   every one was accepted, and how evenly the cores took them (each core listens for itself,
//!   so no accept wakes more than the core it lands on).
//!
//! ```text
//! cargo run --release -p corelane-bench --bin scale -- --cores 8
//! cargo run --release -p corelane-bench --bin scale -- --cores 2 --seconds 0.5 --accept 1000
//! ```
//!
//! The clients get the allowed CPUs after the first N; when none are left they share the
//! servers' CPUs, and the report says so (its scaling figures then understate). Needs root
//! (network namespaces, XDP, AF_XDP).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use corelane::{Placement, Runtime};
use corelane_bench::{Sink, markdown_table, pin};
use corelane_testnet::VethPair;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Parser, Debug)]
#[command(about = "corelane on 1..=N cores against kernel clients on the rest")]
struct Cli {
    /// Serving cores at most (N): the rows go 1..=N.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=MAX_CORES as i64))]
    cores: u16,
    /// Cases: rr, bulk, placement, accept.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "rr,bulk,placement,accept"
    )]
    cases: Vec<String>,
    /// Seconds per request/response and bulk run.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Request/response connections per serving core.
    #[arg(long, default_value_t = 16)]
    conns_per_core: usize,
    /// Connections the accept case opens at once.
    #[arg(long, default_value_t = 10_000)]
    accept: usize,
    /// Where scale.md and scale.json go.
    #[arg(long, default_value = "target/scale")]
    out: PathBuf,
}

const SERVER: &str = "10.78.0.3";
const PORT: u16 = 5030;

/// One row of the report.
#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    case: String,
    cores: usize,
    /// Placement (for `placement` rows) or "same-core".
    placement: String,
    /// Requests or accepts per second, or Gbit/s.
    rate: f64,
    unit: &'static str,
    per_core: f64,
    /// Runtime CPU microseconds per request, or CPU seconds per GB.
    cpu: f64,
    /// rate / (cores x the one-core rate), where there is one.
    efficiency: Option<f64>,
    /// Accepted (or frames) per core, in core order.
    split: Vec<u64>,
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scale: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    if !corelane_testnet::is_root() {
        return Err("needs root (network namespaces, XDP)".into());
    }
    let n = usize::from(cli.cores);
    let allowed = corelane::allowed_cpus();
    if allowed.len() < n {
        return Err(format!(
            "{n} cores asked for, {} CPUs allowed",
            allowed.len()
        ));
    }
    let (servers, rest) = allowed.split_at(n);
    let shared = rest.is_empty();
    let clients: Vec<usize> = if shared {
        allowed.clone()
    } else {
        rest.to_vec()
    };
    corelane_bench::sys::raise_nofile(cli.accept as u64 + 4096).map_err(|e| e.to_string())?;
    let net = VethPair::builder()
        .queues(n as u32)
        .server_addr("10.78.0.1/24")
        .client_addr("10.78.0.2/24")
        .build()
        .map_err(|e| format!("making the veth pair: {e}"))?;
    let mut rows: Vec<Row> = Vec::new();
    let wants = |c: &str| cli.cases.iter().any(|x| x == c);
    for c in &cli.cases {
        if !["rr", "bulk", "placement", "accept"].contains(&c.as_str()) {
            return Err(format!("unknown case {c:?} (rr, bulk, placement, accept)"));
        }
    }
    let secs = Duration::from_secs_f64(cli.seconds);
    if wants("rr") {
        for k in 1..=n {
            peer_tx(&net, k)?;
            let cpus = servers[..k].to_vec();
            let conns = cli.conns_per_core * k;
            let r = rr(&net, &clients, conns, secs, move |b| b.cpus(cpus.clone()))?;
            rows.push(row("rr", k, "same-core", r, &rows));
        }
    }
    if wants("bulk") {
        for k in 1..=n {
            peer_tx(&net, k)?;
            let cpus = servers[..k].to_vec();
            let sink = Sink {
                ip: SERVER.into(),
                port: PORT,
                conns: 4 * k,
                gbit: None,
                client_cpu: clients[0],
                secs: cli.seconds,
            };
            let s = sink.run(&net, move |b| {
                b.cpus(cpus).bdp(10_000_000_000, Duration::from_micros(200))
            })?;
            let m = Measured {
                rate: s.gbit,
                cpu: s.cpu_s_per_gb(),
                split: s.lane_frames.clone(),
            };
            rows.push(row("bulk", k, "same-core", m, &rows));
        }
    }
    if wants("placement") {
        let lanes = (n / 2).max(1);
        peer_tx(&net, lanes)?;
        for p in [
            Placement::SameCore,
            Placement::SharedCache,
            Placement::Spread,
        ] {
            let name = p.name().to_string();
            let conns = cli.conns_per_core * lanes;
            let r = rr(&net, &clients, conns, secs, move |b| {
                b.placement(p.clone()).cores(lanes)
            });
            match r {
                Ok(r) => rows.push(row("placement", lanes, &name, r, &rows)),
                // A machine without two CPUs per lane cannot split them.
                Err(e) => println!("placement {name} at {lanes} lane(s): {e}"),
            }
        }
    }
    if wants("accept") {
        peer_tx(&net, n)?;
        let cpus = servers.to_vec();
        let r = accept(&net, &clients, cli.accept, move |b| b.cpus(cpus.clone()))?;
        rows.push(row("accept", n, "same-core", r, &rows));
    }
    report(&cli, servers, &clients, shared, &rows)
}

/// Gives the client's end of the veth `k` transmit queues, one for each queue a run of `k`
/// cores serves: a veth takes native XDP only with at least as many receive queues as its
/// peer transmits on, and the runtime lowers its side's to the cores it serves.
fn peer_tx(net: &VethPair, k: usize) -> Result<(), String> {
    net.client_ns()
        .exec("ethtool", &["-L", net.client_if(), "tx", &k.to_string()])
        .map(|_| ())
        .map_err(|e| format!("ethtool -L {} tx {k}: {e}", net.client_if()))
}

/// What one run measured.
struct Measured {
    rate: f64,
    cpu: f64,
    split: Vec<u64>,
}

fn row(case: &str, k: usize, placement: &str, m: Measured, before: &[Row]) -> Row {
    let one = before
        .iter()
        .find(|r| r.case == case && r.cores == 1 && r.placement == placement)
        .map(|r| r.rate);
    let efficiency = match (case, one) {
        ("accept" | "placement", _) => None,
        (_, Some(one)) if one > 0.0 => Some(m.rate / (k as f64 * one)),
        (_, None) if k == 1 => Some(1.0),
        _ => None,
    };
    let unit = match case {
        "bulk" => "Gbit/s",
        "accept" => "accepts/s",
        _ => "requests/s",
    };
    let r = Row {
        case: case.into(),
        cores: k,
        placement: placement.into(),
        rate: m.rate,
        unit,
        per_core: m.rate / k as f64,
        cpu: m.cpu,
        efficiency,
        split: m.split,
    };
    println!(
        "{:<9} {:>2} core(s) {:<12} {:>12.1} {:<10} per core {:>12.1}  cpu {:>8.3}  efficiency {}  split {:?}",
        r.case,
        r.cores,
        r.placement,
        r.rate,
        r.unit,
        r.per_core,
        r.cpu,
        r.efficiency.map_or("-".into(), |e| format!("{e:.2}")),
        r.split
    );
    r
}

/// A running server: its stop handle and the thread that ends with the run's report.
type Server = (
    corelane::StopHandle,
    corelane_testnet::NsThread<Result<corelane::RunReport, String>>,
);

/// Cores the per-core accept counters cover (the most `--cores` takes).
const MAX_CORES: usize = 64;

/// A corelane runtime on `net`'s server side, each core accepting on `PORT` and counting in
/// `accepted[core]`; each connection is echoed (`echo`) or held open until the client closes.
fn start(
    net: &VethPair,
    tune: impl FnOnce(corelane::Builder) -> corelane::Builder + Send + 'static,
    accepted: Arc<Vec<AtomicU64>>,
    echo: bool,
) -> Result<Server, String> {
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    let ifname = net.server_if().to_string();
    let thread = net
        .server_ns()
        .spawn(move || -> Result<corelane::RunReport, String> {
            let b = Runtime::builder(&ifname)
                .addr(format!("{SERVER}/24").as_str())
                .backlog(4096);
            let rt = tune(b).build().map_err(|e| e.to_string())?;
            let _ = stop_tx.send(rt.stop_handle());
            rt.run(move |core| {
                let accepted = accepted.clone();
                async move {
                    let l = match corelane::net::TcpListener::bind(PORT).await {
                        Ok(l) => l,
                        Err(e) => return eprintln!("scale: port {PORT}: {e}"),
                    };
                    while let Ok((mut s, _)) = l.accept().await {
                        if let Some(a) = accepted.get(core.index) {
                            a.fetch_add(1, Ordering::Relaxed);
                        }
                        if echo {
                            tokio::task::spawn_local(async move {
                                let mut buf = [0u8; 256];
                                while let Ok(n @ 1..) = s.read(&mut buf).await {
                                    if s.write_all(&buf[..n]).await.is_err() {
                                        break;
                                    }
                                }
                            });
                        } else {
                            // Held open until the client closes (the accept case).
                            tokio::task::spawn_local(async move {
                                let mut buf = [0u8; 16];
                                while let Ok(1..) = s.read(&mut buf).await {}
                            });
                        }
                    }
                }
            })
            .map_err(|e| e.to_string())
        })
        .map_err(|e| e.to_string())?;
    let Ok(stop) = stop_rx.recv_timeout(Duration::from_secs(10)) else {
        return Err(match thread.join() {
            Ok(Err(e)) => e,
            _ => "the server did not start".into(),
        });
    };
    Ok((stop, thread))
}

fn addr() -> SocketAddr {
    SocketAddr::from(([10, 78, 0, 3], PORT))
}

/// Connects, retrying while the listeners come up.
fn connect() -> std::io::Result<TcpStream> {
    let mut last = None;
    for _ in 0..100 {
        match TcpStream::connect_timeout(&addr(), Duration::from_secs(2)) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no attempt")))
}

/// The request/response case: `conns` client threads (pinned round-robin over `clients`),
/// each sending 64 bytes and reading them back for `secs`.
fn rr(
    net: &VethPair,
    clients: &[usize],
    conns: usize,
    secs: Duration,
    tune: impl FnOnce(corelane::Builder) -> corelane::Builder + Send + 'static,
) -> Result<Measured, String> {
    let accepted = Arc::new(
        (0..MAX_CORES)
            .map(|_| AtomicU64::new(0))
            .collect::<Vec<_>>(),
    );
    let (stop, thread) = start(net, tune, accepted.clone(), true)?;
    let clients = clients.to_vec();
    let done = net
        .client_ns()
        .run(move || -> Result<(u64, Duration), String> {
            let go = Arc::new(AtomicBool::new(false));
            let end = Arc::new(AtomicBool::new(false));
            let threads: Vec<_> = (0..conns)
                .map(|i| {
                    let (go, end, cpu) = (go.clone(), end.clone(), clients[i % clients.len()]);
                    std::thread::spawn(move || -> Result<u64, String> {
                        pin(cpu);
                        let mut s = connect().map_err(|e| format!("connect: {e}"))?;
                        let _ = s.set_nodelay(true);
                        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                        let mut buf = [7u8; 64];
                        while !go.load(Ordering::Relaxed) {
                            std::thread::yield_now();
                        }
                        let mut n = 0;
                        while !end.load(Ordering::Relaxed) {
                            s.write_all(&buf).map_err(|e| format!("write: {e}"))?;
                            s.read_exact(&mut buf).map_err(|e| format!("read: {e}"))?;
                            n += 1;
                        }
                        Ok(n)
                    })
                })
                .collect();
            // Every connection made before the clock starts.
            std::thread::sleep(Duration::from_millis(200));
            let t0 = Instant::now();
            go.store(true, Ordering::Relaxed);
            std::thread::sleep(secs);
            end.store(true, Ordering::Relaxed);
            let mut total = 0;
            for t in threads {
                total += t.join().map_err(|_| "a client panicked")??;
            }
            Ok((total, t0.elapsed()))
        })
        .map_err(|e| e.to_string())?;
    stop.stop();
    let report = thread.join().map_err(|e| e.to_string())??;
    let (requests, took) = done?;
    if requests == 0 {
        return Err("no request was answered".into());
    }
    let cpu_s: f64 = report
        .cores
        .iter()
        .map(|c| (c.stats.cpu_time + c.stats.app_cpu_time).as_secs_f64())
        .sum();
    let split = report
        .cores
        .iter()
        .map(|c| c.stats.device.rx_frames)
        .collect();
    Ok(Measured {
        rate: requests as f64 / took.as_secs_f64(),
        cpu: cpu_s * 1e6 / requests as f64,
        split,
    })
}

/// The accept case: `total` connections opened at once from one thread per client CPU, held
/// until every one was accepted.
fn accept(
    net: &VethPair,
    clients: &[usize],
    total: usize,
    tune: impl FnOnce(corelane::Builder) -> corelane::Builder + Send + 'static,
) -> Result<Measured, String> {
    let accepted = Arc::new(
        (0..MAX_CORES)
            .map(|_| AtomicU64::new(0))
            .collect::<Vec<_>>(),
    );
    let (stop, thread) = start(net, tune, accepted.clone(), false)?;
    // The listeners up: one connection first, closed.
    let warm = net.client_ns().run(connect).map_err(|e| e.to_string())?;
    drop(warm.map_err(|e| format!("connect: {e}"))?);
    let base: u64 = accepted.iter().map(|a| a.load(Ordering::Relaxed)).sum();
    let clients = clients.to_vec();
    let acc = accepted.clone();
    let took = net
        .client_ns()
        .run(move || -> Result<Duration, String> {
            let per = total.div_ceil(clients.len());
            let t0 = Instant::now();
            let threads: Vec<_> = clients
                .iter()
                .enumerate()
                .map(|(i, &cpu)| {
                    let count = per.min(total.saturating_sub(i * per));
                    std::thread::spawn(move || -> Result<Vec<TcpStream>, String> {
                        pin(cpu);
                        (0..count)
                            .map(|_| connect().map_err(|e| format!("connect: {e}")))
                            .collect()
                    })
                })
                .collect();
            let mut held = Vec::new();
            for t in threads {
                held.push(t.join().map_err(|_| "a client panicked")??);
            }
            // Until the servers' tasks have taken every one.
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let got: u64 = acc.iter().map(|a| a.load(Ordering::Relaxed)).sum();
                if got - base >= total as u64 {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("{} of {total} accepted in 30 s", got - base));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let took = t0.elapsed();
            drop(held);
            Ok(took)
        })
        .map_err(|e| e.to_string())?;
    stop.stop();
    let report = thread.join().map_err(|e| e.to_string())??;
    let took = took?;
    let cores = report.cores.len();
    let cpu_s: f64 = report
        .cores
        .iter()
        .map(|c| (c.stats.cpu_time + c.stats.app_cpu_time).as_secs_f64())
        .sum();
    Ok(Measured {
        rate: total as f64 / took.as_secs_f64(),
        cpu: cpu_s * 1e6 / total as f64,
        split: accepted[..cores]
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect(),
    })
}

fn report(
    cli: &Cli,
    servers: &[usize],
    clients: &[usize],
    shared: bool,
    rows: &[Row],
) -> Result<(), String> {
    let table = markdown_table(
        &[
            "case",
            "cores",
            "placement",
            "rate",
            "per core",
            "runtime CPU (us/request, s/GB)",
            "scaling efficiency",
            "split over cores",
        ],
        &rows
            .iter()
            .map(|r| {
                vec![
                    r.case.clone(),
                    r.cores.to_string(),
                    r.placement.clone(),
                    format!("{:.1} {}", r.rate, r.unit),
                    format!("{:.1}", r.per_core),
                    format!("{:.3}", r.cpu),
                    r.efficiency.map_or("-".into(), |e| format!("{e:.2}")),
                    format!("{:?}", r.split),
                ]
            })
            .collect::<Vec<_>>(),
    );
    let md = format!(
        "# corelane on 1..={} cores\n\nServing CPUs {servers:?}; kernel clients on {clients:?}{}. \
         {} s per request/response and bulk run, {} request/response connections per core, \
         {} connections in the accept case. Efficiency: the rate at k cores over k times the \
         rate at one. Split: frames each core received (rr, bulk), connections each accepted \
         (accept).\n\n{table}\nReproduce: `cargo run --release -p corelane-bench --bin scale -- \
         --cores {} --seconds {} --conns-per-core {} --accept {}`\n",
        servers.len(),
        if shared {
            " (no CPU left over: the clients share the servers' CPUs, so the scaling figures \
             understate)"
        } else {
            ""
        },
        cli.seconds,
        cli.conns_per_core,
        cli.accept,
        servers.len(),
        cli.seconds,
        cli.conns_per_core,
        cli.accept,
    );
    println!("\n{md}");
    std::fs::create_dir_all(&cli.out).map_err(|e| e.to_string())?;
    std::fs::write(cli.out.join("scale.md"), &md).map_err(|e| e.to_string())?;
    let json = serde_json::to_string_pretty(rows).map_err(|e| e.to_string())?;
    std::fs::write(cli.out.join("scale.json"), json).map_err(|e| e.to_string())?;
    println!("wrote {}/scale.md, scale.json", cli.out.display());
    Ok(())
}
