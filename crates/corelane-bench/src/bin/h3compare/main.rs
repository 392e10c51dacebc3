//! HTTP/3 side by side: the same h3 server (one handler) over corelane's QUIC on a corelane
//! core, and over quinn on tokio and the kernel's UDP, each on CPU 0 of a veth pair's server
//! end, loaded by h3 over quinn on the kernel from the client end (CPU 1). The setups
//! alternate within each repetition; each figure is the median of the repetitions, and each
//! ratio is corelane / quinn.
//!
//! ```text
//! cargo build --release -p corelane-bench --bin h3compare
//! target/release/h3compare --repeat 3 --seconds 3
//! ```
//!
//! Cases: `handshake` (new connections per second, 8 loops of connect, one `GET /`, close),
//! `rr` (requests per second and p99 at each of `--conns`, `GET /bytes/100`), `bulk` (one
//! connection fetching 16 MiB bodies: Gbit/s). Server CPU is CPU 0's busy time from
//! /proc/stat over the measured seconds, per request and per GB.

mod load;
mod serve;

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use corelane_bench::{markdown_table, median, sys};
use corelane_testnet::VethPair;

const KERNEL_SERVER: &str = "10.79.0.1";
const KERNEL_CLIENT: &str = "10.79.0.2";
const CORELANE: &str = "10.79.0.3";
const PORT: u16 = 4433;

#[derive(Parser, Debug)]
#[command(about = "HTTP/3: h3 over corelane's QUIC against h3 over quinn on the kernel")]
struct Cli {
    /// Cases, comma-separated: handshake, rr, bulk.
    #[arg(long, default_value = "handshake,rr,bulk")]
    cases: String,
    /// Connections for the rr case, comma-separated.
    #[arg(long, default_value = "1,16,64")]
    conns: String,
    /// Setups, comma-separated: corelane, quinn.
    #[arg(long, default_value = "corelane,quinn")]
    setups: String,
    /// Repetitions (the setups alternate within each).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Measured seconds of each run.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Seconds of load before the measured ones.
    #[arg(long, default_value_t = 0.5)]
    warmup: f64,
    /// The load generator's CPU.
    #[arg(long, default_value_t = 1)]
    client_cpu: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Case {
    Handshake,
    Rr(usize),
    Bulk,
}

impl Case {
    fn name(self) -> String {
        match self {
            Case::Handshake => "handshake, 8 loops".into(),
            Case::Rr(c) => format!("rr 100 B, {c} conn"),
            Case::Bulk => "bulk 16 MiB, 1 conn".into(),
        }
    }

    fn load(self) -> load::Load {
        match self {
            Case::Handshake => load::Load::Handshakes { conns: 8 },
            Case::Rr(conns) => load::Load::Requests { conns, body: 100 },
            Case::Bulk => load::Load::Requests {
                conns: 1,
                body: 16 << 20,
            },
        }
    }
}

/// One run's figures.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    per_s: f64,
    p99_us: f64,
    gbit: f64,
    cpu_us_per_req: f64,
    cpu_s_per_gb: f64,
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("h3compare: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    let mut cases = Vec::new();
    for c in cli.cases.split(',') {
        match c.trim() {
            "handshake" => cases.push(Case::Handshake),
            "bulk" => cases.push(Case::Bulk),
            "rr" => {
                for n in cli.conns.split(',') {
                    let n: usize = n
                        .trim()
                        .parse()
                        .map_err(|_| format!("--conns: {n:?} is not a number"))?;
                    cases.push(Case::Rr(n));
                }
            }
            other => {
                return Err(format!(
                    "--cases: unknown case {other:?} (handshake, rr, bulk)"
                ));
            }
        }
    }
    let setups: Vec<String> = cli
        .setups
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    if let Some(s) = setups
        .iter()
        .find(|s| !["corelane", "quinn"].contains(&s.as_str()))
    {
        return Err(format!("--setups: unknown setup {s:?} (corelane, quinn)"));
    }
    let warmup = Duration::from_secs_f64(cli.warmup);
    let seconds = Duration::from_secs_f64(cli.seconds);
    let net = VethPair::builder()
        .queues(1)
        .server_addr(&format!("{KERNEL_SERVER}/24"))
        .client_addr(&format!("{KERNEL_CLIENT}/24"))
        .server_tx_checksum_off(true)
        .build()
        .map_err(|e| format!("making the veth pair: {e}"))?;
    let (cfg, cert) = serve::certificate().map_err(|e| e.to_string())?;
    println!(
        "h3compare: servers on CPU 0, load (h3 over quinn, kernel UDP) on CPU {}; {} case(s) x {} setup(s) x {} repetition(s) of {} s (+{} s warm-up)",
        cli.client_cpu,
        cases.len(),
        setups.len(),
        cli.repeat,
        cli.seconds,
        cli.warmup
    );
    // figures[case][setup] = one per repetition.
    let mut figures = vec![vec![Vec::<Figures>::new(); setups.len()]; cases.len()];
    for rep in 0..cli.repeat {
        // Alternate which setup goes first.
        let order: Vec<usize> = if rep % 2 == 0 {
            (0..setups.len()).collect()
        } else {
            (0..setups.len()).rev().collect()
        };
        for &si in &order {
            let setup = &setups[si];
            let (server, to): (serve::Server, SocketAddr) = if setup == "corelane" {
                let s = serve::corelane(
                    net.server_ns(),
                    net.server_if(),
                    &format!("{CORELANE}/24"),
                    PORT,
                    cfg.clone(),
                )?;
                (
                    s,
                    format!("{CORELANE}:{PORT}")
                        .parse()
                        .map_err(|e| format!("{e}"))?,
                )
            } else {
                let to: SocketAddr = format!("{KERNEL_SERVER}:{PORT}")
                    .parse()
                    .map_err(|e| format!("{e}"))?;
                (serve::quinn(net.server_ns(), to, cfg.clone())?, to)
            };
            for (ci, &case) in cases.iter().enumerate() {
                let f = one(
                    &net,
                    to,
                    cert.clone(),
                    case,
                    cli.client_cpu,
                    warmup,
                    seconds,
                )?;
                println!(
                    "  rep {} {setup:>8} {:<22} {:>10.0}/s p99 {:>8.0} us {:>6.2} Gbit/s cpu {:>7.1} us/req",
                    rep + 1,
                    case.name(),
                    f.per_s,
                    f.p99_us,
                    f.gbit,
                    f.cpu_us_per_req
                );
                figures[ci][si].push(f);
            }
            server.stop();
        }
    }
    print_table(&cases, &setups, &figures);
    Ok(())
}

/// One measured run of `case` against `to`: the load in the client's namespace, CPU 0's
/// busy time around it.
fn one(
    net: &VethPair,
    to: SocketAddr,
    cert: rustls::pki_types::CertificateDer<'static>,
    case: Case,
    client_cpu: usize,
    warmup: Duration,
    seconds: Duration,
) -> Result<Figures, String> {
    let l = case.load();
    let busy = std::sync::Arc::new(std::sync::Mutex::new(None::<(f64, f64)>));
    // CPU 0's busy time over the measured seconds (after the warm-up).
    let sampler = {
        let busy = busy.clone();
        std::thread::spawn(move || {
            std::thread::sleep(warmup);
            let a = sys::cpu_busy().ok().and_then(|v| v.first().copied());
            std::thread::sleep(seconds);
            let b = sys::cpu_busy().ok().and_then(|v| v.first().copied());
            if let (Some(a), Some(b)) = (a, b) {
                *busy.lock().unwrap_or_else(|p| p.into_inner()) = Some((a, b));
            }
        })
    };
    let got = net
        .client_ns()
        .run(move || {
            corelane_bench::pin(client_cpu);
            load::run(to, cert, l, warmup, seconds)
        })
        .map_err(|e| e.to_string())??;
    let _ = sampler.join();
    if got.done == 0 {
        return Err(format!(
            "{}: nothing answered ({} errors; first: {})",
            case.name(),
            got.errors,
            got.first_error.as_deref().unwrap_or("none")
        ));
    }
    let secs = seconds.as_secs_f64();
    let cpu = busy
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .map_or(f64::NAN, |(a, b)| b - a);
    Ok(Figures {
        per_s: got.done as f64 / secs,
        p99_us: got.quantile_us(0.99),
        gbit: got.bytes as f64 * 8.0 / secs / 1e9,
        cpu_us_per_req: cpu / got.done as f64 * 1e6,
        cpu_s_per_gb: if got.bytes > 0 {
            cpu / (got.bytes as f64 / 1e9)
        } else {
            f64::NAN
        },
    })
}

fn print_table(cases: &[Case], setups: &[String], figures: &[Vec<Vec<Figures>>]) {
    let ci = setups.iter().position(|s| s == "corelane");
    let qi = setups.iter().position(|s| s == "quinn");
    let mut rows = Vec::new();
    for (k, case) in cases.iter().enumerate() {
        let med = |si: usize, f: fn(&Figures) -> f64| -> f64 {
            median(&figures[k][si].iter().map(f).collect::<Vec<_>>())
        };
        let mut row = vec![case.name()];
        let mut pick = |f: fn(&Figures) -> f64, digits: usize| {
            let c = ci.map(|i| med(i, f));
            let q = qi.map(|i| med(i, f));
            let show = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.digits$}"));
            row.push(show(c));
            row.push(show(q));
            row.push(match (c, q) {
                (Some(c), Some(q)) if q > 0.0 => format!("{:.2}", c / q),
                _ => "-".into(),
            });
        };
        match case {
            Case::Bulk => {
                pick(|f| f.gbit, 2);
                pick(|f| f.cpu_s_per_gb, 2);
            }
            _ => {
                pick(|f| f.per_s, 0);
                pick(|f| f.p99_us, 0);
            }
        }
        pick(|f| f.cpu_us_per_req, 1);
        rows.push(row);
    }
    println!(
        "\nmedians; ratio = corelane / quinn (rate: higher is better; p99, CPU: lower is better)\n"
    );
    println!(
        "{}",
        markdown_table(
            &[
                "case",
                "corelane /s or Gbit/s",
                "quinn",
                "ratio",
                "corelane p99 us or CPU s/GB",
                "quinn",
                "ratio",
                "corelane CPU us/req",
                "quinn",
                "ratio",
            ],
            &rows
        )
    );
}
