//! corelane against the kernel's TCP stack on the same veth pair, the same CPUs and the same
//! load, in one run.
//!
//! The setups take turns within every repetition of every case:
//! - `kernel`: the kernel stack on both ends (a tokio server, one current_thread runtime per
//!   server CPU with SO_REUSEPORT listeners, and the kernel-socket load generator);
//! - `epoll-c`: the same load generator against a C epoll server (`c/epoll_server.c`: one
//!   thread per server CPU, no runtime: the kernel's best case);
//! - `monoio`: the same load generator against a monoio server (io_uring, thread per core);
//! - `corelane-server`: the same kernel-socket load generator against a corelane server;
//! - `corelane-both`: the same load generator running on corelane against a corelane server;
//! - `nginx`: Debian's nginx, in the HTTP case only (`http`).
//!
//! Cases: request/response with 1-byte and 64-byte messages at 1, 16 and 256 connections
//! (requests/s, latency p50/p99/p99.9), bulk transfer each way on one connection (Gbit/s), and
//! new connections per second (connect, 1-byte exchange, reset), and HTTP/1.1 `GET /` with wrk
//! as the load against hyper on either stack and nginx (`http.rs`). For each, the server's CPU
//! time (busy time of the server CPUs from /proc/stat: user, system, softirq, irq) and the whole
//! machine's, per million requests or per GB. corelane runs in adaptive poll mode, so idle time
//! is not spent spinning. The report gives medians over the repetitions and the corelane/kernel
//! ratios, as Markdown, JSON and PNG.
//!
//! ```text
//! cargo run --release -p corelane-bench --bin compare -- --repeat 3 --seconds 2
//! ```
//!
//! Needs root (network namespaces, XDP, AF_XDP).
//!
//! The files: `cases` (what is measured), `load` (the load generator), `hosts` (servers and
//! client threads on either stack), `runs` (one run and its CPU accounting), `report`
//! (Markdown, JSON, PNG).

#![forbid(unsafe_code)]

mod cases;
mod hosts;
mod http;
mod load;
mod monoio_host;
mod regress;
mod report;
mod runs;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use corelane_testnet::VethPair;

use crate::cases::{KERNEL_CLIENT, KERNEL_SERVER, Kind, Setup};
use crate::runs::{Ctx, one_run, progress};

#[derive(Parser, Debug)]
#[command(about = "corelane against the kernel TCP stack on the same veth pair")]
struct Cli {
    /// Seconds measured per run (after the warm-up).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Seconds of warm-up per run, not measured.
    #[arg(long, default_value_t = 0.5)]
    warmup: f64,
    /// Repetitions of every case (the setups alternate within each).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Cases: rr1, rr64 (request/response), bulk-in (client to server), bulk-out, connect,
    /// http (HTTP/1.1 GET with wrk as the load).
    #[arg(long, default_value = "rr1,rr64,bulk-in,bulk-out,connect,http")]
    cases: String,
    /// Connection counts for the request/response cases.
    #[arg(long, default_value = "1,16,256")]
    conns: String,
    /// Connection counts for the HTTP case (wrk's -c).
    #[arg(long, default_value = "1,64")]
    http_conns: String,
    /// Setups: kernel, epoll-c (the C epoll server), monoio (an io_uring thread-per-core
    /// server), nginx (Debian's, for the http case), corelane-server, corelane-both (and
    /// corelane-client: corelane's load generator against the kernel server).
    #[arg(
        long,
        default_value = "kernel,epoll-c,monoio,nginx,corelane-server,corelane-both"
    )]
    setups: String,
    /// Server CPUs, comma separated (default: every allowed CPU but the last).
    #[arg(long)]
    server_cpus: Option<String>,
    /// The load generator's CPU (default: the last allowed CPU).
    #[arg(long)]
    client_cpu: Option<usize>,
    /// Leave the veth's offloads (TSO, GSO, GRO, checksum) on; by default they are off on both
    /// ends, the setting corelane's copy-mode AF_XDP has.
    #[arg(long)]
    offloads: bool,
    /// Leave transmit checksum offload on at the server's end of the veth (off by default, as
    /// a corelane client cannot take partial checksums): both servers then leave their
    /// checksums to it, corelane's with `--corelane-tx-checksum on`.
    #[arg(long)]
    server_tx_checksum: bool,
    /// The kernel's congestion control in both namespaces, for every kernel-stack server and
    /// client (corelane runs CUBIC); `default` leaves the machine's (often BBR).
    #[arg(long, default_value = "cubic")]
    kernel_cc: String,
    /// The veth pair's MTU (9000: jumbo frames, which corelane carries in chains of UMEM
    /// frames).
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// corelane's poll mode: adaptive (the default: spin up to 200 us once idle, then sleep), adaptive:US
    /// (spin up to US microseconds), or busy (never sleep).
    #[arg(long, default_value = "adaptive")]
    corelane_poll: String,
    /// corelane's live statistics (the publisher that writes them every 100 ms): on or off.
    #[arg(long, default_value = "on")]
    corelane_publish: String,
    /// corelane's batch size: adaptive (Model-T batching) or fixed.
    #[arg(long, default_value = "adaptive")]
    corelane_batch: String,
    /// corelane's transmit checksums: summed in user space (off) or left to the kernel and
    /// the NIC through AF_XDP TX metadata (on; `XskConfig::tx_checksum_offload`).
    #[arg(long, default_value = "off")]
    corelane_tx_checksum: String,
    /// Where to write compare.md, compare.json and compare.png.
    #[arg(long, default_value = "target/compare")]
    out: PathBuf,
    /// The committed run to report the change against; `none` for no comparison.
    #[arg(long, default_value = "docs/results/compare.json")]
    baseline: String,
    /// Print every run's figures as well as the progress bar.
    #[arg(long, short)]
    verbose: bool,
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\ncompare: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn parse_list<T>(flag: &str, s: &str, f: impl Fn(&str) -> Option<T>) -> Result<Vec<T>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| f(x).ok_or_else(|| format!("{flag}: `{x}` is not understood")))
        .collect()
}

fn run(cli: Cli) -> Result<(), String> {
    if !corelane_testnet::is_root() {
        return Err("needs root: it makes network namespaces and attaches XDP programs".into());
    }
    let conns = parse_list("--conns", &cli.conns, |x| {
        x.parse::<usize>().ok().filter(|&n| n > 0)
    })?;
    let http_conns = parse_list("--http-conns", &cli.http_conns, |x| {
        x.parse::<usize>().ok().filter(|&n| n > 0)
    })?;
    let mut kinds = Vec::new();
    for c in parse_list("--cases", &cli.cases, |x| Some(x.to_string()))? {
        match c.as_str() {
            "rr1" | "rr64" => {
                let size = if c == "rr1" { 1 } else { 64 };
                kinds.extend(conns.iter().map(|&conns| Kind::Rr { size, conns }));
            }
            "bulk-in" => kinds.push(Kind::BulkIn),
            "bulk-out" => kinds.push(Kind::BulkOut),
            "connect" => kinds.push(Kind::Connect),
            "http" => kinds.extend(http_conns.iter().map(|&conns| Kind::Http { conns })),
            o => {
                return Err(format!(
                    "--cases: `{o}` is not rr1, rr64, bulk-in, bulk-out, connect or http"
                ));
            }
        }
    }
    let setups: Vec<Setup> = cli
        .setups
        .split(',')
        .map(|s| Setup::parse(s.trim()))
        .collect::<Result<_, _>>()?;
    let allowed = corelane::allowed_cpus();
    let client_cpu = cli
        .client_cpu
        .or_else(|| allowed.last().copied())
        .ok_or("no CPU allowed")?;
    let server_cpus = match &cli.server_cpus {
        Some(s) => parse_list("--server-cpus", s, |x| x.parse::<usize>().ok())?,
        None => allowed
            .iter()
            .copied()
            .filter(|&c| c != client_cpu)
            .collect(),
    };
    if server_cpus.is_empty() {
        return Err("no CPU left for the server: pass --server-cpus".into());
    }
    if server_cpus.contains(&client_cpu) {
        eprintln!("compare: warning: the load generator shares CPU {client_cpu} with the server");
    }
    let net = VethPair::builder()
        .queues(server_cpus.len() as u32)
        .server_addr(&format!("{KERNEL_SERVER}/24"))
        .client_addr(&format!("{KERNEL_CLIENT}/24"))
        .server_tx_checksum_off(!cli.server_tx_checksum)
        .mtu(cli.mtu)
        .build()
        .map_err(|e| format!("making the veth pair: {e}"))?;
    if !cli.offloads {
        for (ns, ifname) in [
            (net.server_ns(), net.server_if()),
            (net.client_ns(), net.client_if()),
        ] {
            ns.exec(
                "ethtool",
                &["-K", ifname, "tso", "off", "gso", "off", "gro", "off"],
            )
            .map_err(|e| format!("turning offloads off: {e}"))?;
        }
    }
    // Kept until the run ends: a namespace may only choose an allowed algorithm.
    let _allowed = if cli.kernel_cc == "default" {
        None
    } else {
        let allowed = AllowedCc::add(&cli.kernel_cc)?;
        // Per network namespace: every kernel socket made there from now on.
        let set = format!("net.ipv4.tcp_congestion_control={}", cli.kernel_cc);
        for ns in [net.server_ns(), net.client_ns()] {
            ns.exec("sysctl", &["-qw", &set])
                .map_err(|e| format!("--kernel-cc {}: {e}", cli.kernel_cc))?;
        }
        Some(allowed)
    };
    let knobs = runs::Knobs::parse(
        &cli.corelane_poll,
        &cli.corelane_publish,
        &cli.corelane_batch,
        &cli.corelane_tx_checksum,
    )?;
    let ctx = Ctx {
        knobs,
        net: &net,
        server_cpus: server_cpus.clone(),
        client_cpu,
        warmup: Duration::from_secs_f64(cli.warmup),
        seconds: Duration::from_secs_f64(cli.seconds),
    };
    println!(
        "compare: server on CPU(s) {server_cpus:?}, load generator on CPU {client_cpu}; {} case(s) x {} setup(s) x {} repetition(s) of {} s (+{} s warm-up); offloads {}; kernel congestion control {}",
        kinds.len(),
        setups.len(),
        cli.repeat,
        cli.seconds,
        cli.warmup,
        if cli.offloads { "on" } else { "off" },
        cli.kernel_cc
    );
    let total = cli.repeat
        * kinds
            .iter()
            .map(|k| setups.iter().filter(|s| k.runs_on(**s)).count())
            .sum::<usize>();
    let mut samples = vec![vec![Vec::new(); setups.len()]; kinds.len()];
    let started = Instant::now();
    let mut done = 0;
    for rep in 0..cli.repeat {
        for (ki, kind) in kinds.iter().enumerate() {
            for (si, setup) in setups.iter().enumerate() {
                if !kind.runs_on(*setup) {
                    continue;
                }
                progress(
                    done,
                    total,
                    started,
                    &format!("{} / {}", kind.name(), setup.name()),
                );
                let s = one_run(&ctx, *setup, *kind, cli.verbose)
                    .map_err(|e| format!("{} / {}: {e}", kind.name(), setup.name()))?;
                done += 1;
                if cli.verbose {
                    eprintln!(
                        "{}rep {} {:<30} {:<16} {:>10.0}/s {:>7.3} Gbit/s p99 {:>8.1} us server CPU {:.3} s",
                        runs::clear_line(),
                        rep + 1,
                        kind.name(),
                        setup.name(),
                        s.rate,
                        s.gbit,
                        s.p99_us,
                        s.server_cpu_s
                    );
                }
                samples[ki][si].push(s);
            }
        }
    }
    progress(done, total, started, "done");
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
    report::write(
        &cli.out,
        &report::Meta {
            server_cpus,
            client_cpu,
            offloads: cli.offloads,
            mtu: cli.mtu,
            kernel_cc: cli.kernel_cc.clone(),
            corelane: format!(
                "poll {}, live statistics {}, batch {}, transmit checksum offload {}",
                cli.corelane_poll,
                cli.corelane_publish,
                cli.corelane_batch,
                cli.corelane_tx_checksum
            ),
            seconds: cli.seconds,
            warmup: cli.warmup,
            repeat: cli.repeat,
            baseline: (cli.baseline != "none").then(|| PathBuf::from(&cli.baseline)),
        },
        &kinds,
        &setups,
        &samples,
    )
}

/// `net.ipv4.tcp_allowed_congestion_control` with one algorithm added for the run (a network
/// namespace other than the first may only make an allowed one its default); the list as it
/// was comes back on drop.
struct AllowedCc {
    before: Option<String>,
}

const ALLOWED_CC: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";

impl AllowedCc {
    fn add(algorithm: &str) -> Result<AllowedCc, String> {
        let available =
            std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
                .map_err(|e| format!("reading the available congestion controls: {e}"))?;
        if !available.split_whitespace().any(|a| a == algorithm) {
            return Err(format!(
                "--kernel-cc {algorithm}: not available here (available: {}; modprobe tcp_{algorithm}?)",
                available.trim()
            ));
        }
        let before = std::fs::read_to_string(ALLOWED_CC)
            .map_err(|e| format!("{ALLOWED_CC}: {e}"))?
            .trim()
            .to_string();
        if before.split_whitespace().any(|a| a == algorithm) {
            return Ok(AllowedCc { before: None });
        }
        std::fs::write(ALLOWED_CC, format!("{before} {algorithm}"))
            .map_err(|e| format!("{ALLOWED_CC}: {e}"))?;
        Ok(AllowedCc {
            before: Some(before),
        })
    }
}

impl Drop for AllowedCc {
    fn drop(&mut self) {
        if let Some(b) = &self.before
            && let Err(e) = std::fs::write(ALLOWED_CC, b)
        {
            eprintln!("compare: could not restore {ALLOWED_CC} to \"{b}\": {e}");
        }
    }
}
