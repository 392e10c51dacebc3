//! corelane against the kernel's TCP stack on the same veth pair, the same CPUs and the same
//! load, in one run.
//!
//! Three setups take turns within every repetition of every case:
//! - `kernel`: the kernel stack on both ends (a tokio server, one current_thread runtime per
//!   server CPU with SO_REUSEPORT listeners, and the kernel-socket load generator);
//! - `corelane-server`: the same kernel-socket load generator against a corelane server;
//! - `corelane-both`: the same load generator running on corelane against a corelane server.
//!
//! Cases: request/response with 1-byte and 64-byte messages at 1, 16 and 256 connections
//! (requests/s, latency p50/p99/p99.9), bulk transfer each way on one connection (Gbit/s), and
//! new connections per second (connect, 1-byte exchange, reset). For each, the server's CPU
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

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use corelane::Runtime;
use corelane_bench::{Panel, markdown_table, median, pin, plot_png};
use corelane_testnet::VethPair;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::task::spawn_local;

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
    /// Cases: rr1, rr64 (request/response), bulk-in (client to server), bulk-out, connect.
    #[arg(long, default_value = "rr1,rr64,bulk-in,bulk-out,connect")]
    cases: String,
    /// Connection counts for the request/response cases.
    #[arg(long, default_value = "1,16,256")]
    conns: String,
    /// Setups: kernel, corelane-server, corelane-both (and corelane-client: corelane's load
    /// generator against the kernel server).
    #[arg(long, default_value = "kernel,corelane-server,corelane-both")]
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
    /// Where to write compare.md, compare.json and compare.png.
    #[arg(long, default_value = "target/compare")]
    out: PathBuf,
    /// Print every run's figures as well as the progress bar.
    #[arg(long, short)]
    verbose: bool,
}

const ECHO: u16 = 7001;
const SINK: u16 = 7002;
const SOURCE: u16 = 7003;
const KERNEL_SERVER: &str = "10.77.0.1";
const KERNEL_CLIENT: &str = "10.77.0.2";
const CORELANE_SERVER: &str = "10.77.0.3";
const CORELANE_CLIENT: &str = "10.77.0.4";
const CHUNK: usize = 64 * 1024;
const CONNECT_CONNS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rr { size: usize, conns: usize },
    BulkIn,
    BulkOut,
    Connect,
}

impl Kind {
    fn name(self) -> String {
        match self {
            Kind::Rr { size, conns } => format!("rr {size} B x {conns} conn"),
            Kind::BulkIn => "bulk in (client to server)".into(),
            Kind::BulkOut => "bulk out (server to client)".into(),
            Kind::Connect => format!("connect ({CONNECT_CONNS} at a time)"),
        }
    }

    fn id(self) -> String {
        match self {
            Kind::Rr { size, conns } => format!("rr{size}_c{conns}"),
            Kind::BulkIn => "bulk_in".into(),
            Kind::BulkOut => "bulk_out".into(),
            Kind::Connect => "connect".into(),
        }
    }

    fn bulk(self) -> bool {
        matches!(self, Kind::BulkIn | Kind::BulkOut)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    Kernel,
    CorelaneServer,
    CorelaneBoth,
    CorelaneClient,
}

impl Setup {
    fn name(self) -> &'static str {
        match self {
            Setup::Kernel => "kernel",
            Setup::CorelaneServer => "corelane-server",
            Setup::CorelaneBoth => "corelane-both",
            Setup::CorelaneClient => "corelane-client",
        }
    }

    fn parse(s: &str) -> Result<Setup, String> {
        match s {
            "kernel" => Ok(Setup::Kernel),
            "corelane-server" => Ok(Setup::CorelaneServer),
            "corelane-both" => Ok(Setup::CorelaneBoth),
            "corelane-client" => Ok(Setup::CorelaneClient),
            o => Err(format!(
                "--setups: `{o}` is not kernel, corelane-server, corelane-both or corelane-client"
            )),
        }
    }

    fn corelane_server(self) -> bool {
        matches!(self, Setup::CorelaneServer | Setup::CorelaneBoth)
    }

    fn corelane_client(self) -> bool {
        matches!(self, Setup::CorelaneClient | Setup::CorelaneBoth)
    }
}

// ----- load phases --------------------------------------------------------------------------

const WARM: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

/// What one load generator measured.
#[derive(Debug, Default)]
struct ClientOut {
    ops: u64,
    bytes: u64,
    lat_ns: Vec<u32>,
    errors: u64,
    first_error: Option<String>,
}

impl ClientOut {
    fn merge(&mut self, o: ClientOut) {
        self.ops += o.ops;
        self.bytes += o.bytes;
        self.lat_ns.extend(o.lat_ns);
        self.errors += o.errors;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
    }

    fn error(&mut self, what: &str, e: impl std::fmt::Display) {
        self.errors += 1;
        self.first_error
            .get_or_insert_with(|| format!("{what}: {e}"));
    }
}

/// The sockets a load generator or server runs on.
trait Net: 'static {
    type S: AsyncRead + AsyncWrite + Unpin + 'static;
    fn connect(addr: SocketAddr) -> impl Future<Output = io::Result<Self::S>>;
    /// Closes with a reset, as load generators measuring connection rates do (no TIME_WAIT).
    fn reset(s: Self::S);
}

struct Kernel;

impl Net for Kernel {
    type S = tokio::net::TcpStream;
    async fn connect(addr: SocketAddr) -> io::Result<Self::S> {
        let s = tokio::net::TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(s)
    }
    fn reset(s: Self::S) {
        let _ = s.set_zero_linger();
    }
}

struct Corelane;

impl Net for Corelane {
    type S = corelane::net::TcpStream;
    async fn connect(addr: SocketAddr) -> io::Result<Self::S> {
        corelane::net::TcpStream::connect(addr).await
    }
    fn reset(s: Self::S) {
        s.abort();
    }
}

/// `f` with a time limit; the error names the step that ran out of time.
async fn timed<T>(
    limit: Duration,
    step: &str,
    f: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(|e| io::Error::new(e.kind(), format!("{step}: {e}"))),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{step}: no answer in {limit:?}"),
        )),
    }
}

async fn connect_retry<N: Net>(addr: SocketAddr) -> io::Result<N::S> {
    let mut last = None;
    for _ in 0..100 {
        match tokio::time::timeout(Duration::from_secs(1), N::connect(addr)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = Some(e),
            Err(_) => last = Some(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(last.unwrap_or_else(|| io::Error::other("no connection")))
}

/// Runs `kind`'s load against `addr` until the phase says stop.
async fn load<N: Net>(kind: Kind, addr: SocketAddr, phase: Arc<AtomicU8>) -> ClientOut {
    let step = Duration::from_secs(3);
    let tasks = match kind {
        Kind::Rr { conns, .. } => conns,
        Kind::Connect => CONNECT_CONNS,
        _ => 1,
    };
    let mut handles = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        let phase = phase.clone();
        handles.push(spawn_local(async move {
            let mut out = ClientOut::default();
            let measuring = || phase.load(Ordering::Relaxed) == MEASURE;
            let stopped = || phase.load(Ordering::Relaxed) == STOP;
            let port = match kind {
                Kind::BulkIn => SINK,
                Kind::BulkOut => SOURCE,
                _ => ECHO,
            };
            let addr = SocketAddr::new(addr.ip(), port);
            if kind == Kind::Connect {
                let mut b = [0u8; 1];
                while !stopped() {
                    let t = Instant::now();
                    let r = async {
                        let mut s = timed(step, "connect", N::connect(addr)).await?;
                        timed(step, "request", s.write_all(b"x")).await?;
                        timed(step, "response", s.read_exact(&mut b)).await?;
                        N::reset(s);
                        io::Result::Ok(())
                    }
                    .await;
                    match r {
                        Ok(()) if measuring() => {
                            out.ops += 1;
                            out.lat_ns
                                .push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                        }
                        Ok(()) => {}
                        Err(e) => out.error("connect, exchange, reset", e),
                    }
                }
                return out;
            }
            let s = match connect_retry::<N>(addr).await {
                Ok(s) => s,
                Err(e) => {
                    out.error("connect", e);
                    return out;
                }
            };
            if let Err(e) = stream_load::<N>(kind, s, step, &phase, &mut out).await {
                out.error("load", e);
            }
            out
        }));
    }
    let mut total = ClientOut::default();
    for h in handles {
        match h.await {
            Ok(o) => total.merge(o),
            Err(e) => total.error("load task", e),
        }
    }
    total
}

/// One connection's share of a request/response or bulk case, until the phase says stop.
async fn stream_load<N: Net>(
    kind: Kind,
    mut s: N::S,
    step: Duration,
    phase: &AtomicU8,
    out: &mut ClientOut,
) -> io::Result<()> {
    let measuring = || phase.load(Ordering::Relaxed) == MEASURE;
    let stopped = || phase.load(Ordering::Relaxed) == STOP;
    let mut buf = vec![0u8; CHUNK];
    match kind {
        Kind::Rr { size, .. } => {
            let msg = vec![0x42u8; size];
            while !stopped() {
                let t = Instant::now();
                timed(step, "request", s.write_all(&msg)).await?;
                timed(step, "response", s.read_exact(&mut buf[..size])).await?;
                if measuring() {
                    out.ops += 1;
                    out.bytes += size as u64;
                    out.lat_ns
                        .push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                }
            }
        }
        Kind::BulkIn => {
            buf.fill(0x5a);
            while !stopped() {
                let n = timed(step, "send", s.write(&buf)).await?;
                if measuring() {
                    out.bytes += n as u64;
                }
            }
            let _ = s.shutdown().await;
        }
        Kind::BulkOut => {
            while !stopped() {
                match timed(step, "receive", s.read(&mut buf)).await? {
                    0 => return Err(io::Error::other("receive: the server closed")),
                    n if measuring() => out.bytes += n as u64,
                    _ => {}
                }
            }
            N::reset(s);
        }
        Kind::Connect => {}
    }
    Ok(())
}

// ----- servers ------------------------------------------------------------------------------

/// Serves one accepted connection by the port it came in on.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(port: u16, mut s: S) {
    let mut buf = vec![0u8; CHUNK];
    match port {
        ECHO => {
            while let Ok(n @ 1..) = s.read(&mut buf).await {
                if s.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
        SINK => while let Ok(1..) = s.read(&mut buf).await {},
        _ => {
            buf.fill(0xa5);
            while s.write_all(&buf).await.is_ok() {}
        }
    }
}

/// A server running in its namespace, and how to stop it.
struct Server {
    stop: Box<dyn FnOnce() + Send>,
    thread: corelane_testnet::NsThread<Result<(), String>>,
    addr: &'static str,
}

impl Server {
    fn stop(self) -> Result<(), String> {
        (self.stop)();
        self.thread.join().map_err(|e| e.to_string())?
    }
}

fn kernel_server(net: &VethPair, cpus: &[usize]) -> Result<Server, String> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let cpus = cpus.to_vec();
    let n = cpus.len();
    let thread = net
        .server_ns()
        .spawn(move || -> Result<(), String> {
            let mut threads = Vec::new();
            for cpu in cpus {
                let (ready, mut stop) = (ready_tx.clone(), stop_rx.clone());
                threads.push(std::thread::spawn(move || {
                    pin(cpu);
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => return drop(ready.send(Err(e.to_string()))),
                    };
                    let local = tokio::task::LocalSet::new();
                    local.block_on(&rt, async move {
                        let mut listeners = Vec::new();
                        for port in [ECHO, SINK, SOURCE] {
                            match reuseport_listener(port) {
                                Ok(l) => listeners.push((port, l)),
                                Err(e) => {
                                    let _ = ready.send(Err(format!("port {port}: {e}")));
                                    return;
                                }
                            }
                        }
                        for (port, l) in listeners {
                            spawn_local(async move {
                                while let Ok((s, _)) = l.accept().await {
                                    let _ = s.set_nodelay(true);
                                    spawn_local(serve(port, s));
                                }
                            });
                        }
                        let _ = ready.send(Ok(()));
                        let _ = stop.wait_for(|s| *s).await;
                    });
                }));
            }
            for t in threads {
                t.join().map_err(|_| "a kernel server thread panicked")?;
            }
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    for _ in 0..n {
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| "the kernel server did not start".to_string())??;
    }
    Ok(Server {
        stop: Box::new(move || {
            let _ = stop_tx.send(true);
        }),
        thread,
        addr: KERNEL_SERVER,
    })
}

fn reuseport_listener(port: u16) -> io::Result<tokio::net::TcpListener> {
    let s = tokio::net::TcpSocket::new_v4()?;
    s.set_reuseport(true)?;
    s.set_reuseaddr(true)?;
    s.bind(SocketAddr::from(([0, 0, 0, 0], port)))?;
    s.listen(1024)
}

fn corelane_server(net: &VethPair, cpus: &[usize]) -> Result<Server, String> {
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let ifname = net.server_if().to_string();
    let cpus = cpus.to_vec();
    let n = cpus.len();
    let thread = net
        .server_ns()
        .spawn(move || -> Result<(), String> {
            let rt = Runtime::builder(&ifname)
                .addr(
                    format!("{CORELANE_SERVER}/24")
                        .parse()
                        .map_err(|_| "address")?,
                )
                .cpus(cpus)
                .build()
                .map_err(|e| e.to_string())?;
            let _ = stop_tx.send(rt.stop_handle());
            let ready_tx = Mutex::new(ready_tx);
            rt.run(|_core| {
                let bound: Result<Vec<_>, String> = [ECHO, SINK, SOURCE]
                    .into_iter()
                    .map(|p| {
                        corelane::net::TcpListener::bind(p)
                            .map(|l| (p, l))
                            .map_err(|e| format!("port {p}: {e}"))
                    })
                    .collect();
                let ok = bound.as_ref().map(|_| ()).map_err(Clone::clone);
                let _ = ready_tx.lock().map(|t| t.send(ok));
                async move {
                    let Ok(listeners) = bound else { return };
                    let mut tasks = Vec::new();
                    for (port, l) in listeners {
                        tasks.push(spawn_local(async move {
                            while let Ok((s, _)) = l.accept().await {
                                spawn_local(serve(port, s));
                            }
                        }));
                    }
                    for t in tasks {
                        let _ = t.await;
                    }
                }
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
        })
        .map_err(|e| e.to_string())?;
    let Ok(stop) = stop_rx.recv_timeout(Duration::from_secs(10)) else {
        return Err(match thread.join() {
            Ok(Err(e)) => e,
            _ => "the corelane server did not start".to_string(),
        });
    };
    for _ in 0..n {
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| "the corelane server did not start".to_string())??;
    }
    Ok(Server {
        stop: Box::new(move || stop.stop()),
        thread,
        addr: CORELANE_SERVER,
    })
}

// ----- clients ------------------------------------------------------------------------------

fn kernel_client(
    net: &VethPair,
    cpu: usize,
    kind: Kind,
    addr: SocketAddr,
    phase: Arc<AtomicU8>,
) -> Result<corelane_testnet::NsThread<Result<ClientOut, String>>, String> {
    net.client_ns()
        .spawn(move || {
            pin(cpu);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let local = tokio::task::LocalSet::new();
            Ok(local.block_on(&rt, load::<Kernel>(kind, addr, phase)))
        })
        .map_err(|e| e.to_string())
}

fn corelane_client(
    net: &VethPair,
    cpu: usize,
    kind: Kind,
    addr: SocketAddr,
    phase: Arc<AtomicU8>,
) -> Result<corelane_testnet::NsThread<Result<ClientOut, String>>, String> {
    let ifname = net.client_if().to_string();
    net.client_ns()
        .spawn(move || {
            let rt = Runtime::builder(&ifname)
                .addr(
                    format!("{CORELANE_CLIENT}/24")
                        .parse()
                        .map_err(|_| "address")?,
                )
                .cpus(vec![cpu])
                .build()
                .map_err(|e| format!("corelane client: {e}"))?;
            let result = Arc::new(Mutex::new(None));
            let r = result.clone();
            rt.run(move |_| {
                let (r, phase) = (r.clone(), phase.clone());
                async move {
                    let out = load::<Corelane>(kind, addr, phase).await;
                    if let Ok(mut g) = r.lock() {
                        *g = Some(out);
                    }
                }
            })
            .map_err(|e| format!("corelane client: {e}"))?;
            let out = result.lock().map_err(|_| "poisoned")?.take();
            out.ok_or_else(|| "the corelane client returned nothing".to_string())
        })
        .map_err(|e| e.to_string())
}

// ----- CPU accounting -----------------------------------------------------------------------

/// Busy time per CPU (user, nice, system, irq, softirq, steal) in seconds, from /proc/stat.
fn cpu_busy() -> Result<Vec<f64>, String> {
    let stat = std::fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut out = Vec::new();
    for line in stat.lines() {
        let mut f = line.split_whitespace();
        let Some(name) = f.next() else { continue };
        let Some(idx) = name
            .strip_prefix("cpu")
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let v: Vec<f64> = f.filter_map(|x| x.parse().ok()).collect();
        if v.len() < 8 {
            return Err(format!("/proc/stat: short line for {name}"));
        }
        if out.len() <= idx {
            out.resize(idx + 1, 0.0);
        }
        // user nice system idle iowait irq softirq steal
        out[idx] = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / hz;
    }
    Ok(out)
}

// ----- one run ------------------------------------------------------------------------------

/// One run's figures.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    /// Requests or connections per second.
    rate: f64,
    gbit: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    server_cpu_s: f64,
    machine_cpu_s: f64,
    /// Server CPU seconds per million operations, or per GB for bulk.
    server_cost: f64,
    machine_cost: f64,
    /// Operations that failed or timed out.
    errors: f64,
}

struct Ctx<'a> {
    net: &'a VethPair,
    server_cpus: Vec<usize>,
    client_cpu: usize,
    warmup: Duration,
    seconds: Duration,
}

fn one_run(ctx: &Ctx<'_>, setup: Setup, kind: Kind, verbose: bool) -> Result<Sample, String> {
    let server = if setup.corelane_server() {
        corelane_server(ctx.net, &ctx.server_cpus)?
    } else {
        kernel_server(ctx.net, &ctx.server_cpus)?
    };
    let addr: SocketAddr = format!("{}:{ECHO}", server.addr)
        .parse()
        .map_err(|_| "address")?;
    let phase = Arc::new(AtomicU8::new(WARM));
    let client = if setup.corelane_client() {
        corelane_client(ctx.net, ctx.client_cpu, kind, addr, phase.clone())
    } else {
        kernel_client(ctx.net, ctx.client_cpu, kind, addr, phase.clone())
    };
    let client = match client {
        Ok(c) => c,
        Err(e) => {
            let _ = server.stop();
            return Err(e);
        }
    };
    std::thread::sleep(ctx.warmup);
    let before = cpu_busy()?;
    let t = Instant::now();
    phase.store(MEASURE, Ordering::SeqCst);
    std::thread::sleep(ctx.seconds);
    phase.store(STOP, Ordering::SeqCst);
    let after = cpu_busy()?;
    let secs = t.elapsed().as_secs_f64();
    let out = client.join().map_err(|e| e.to_string());
    let stopped = server.stop();
    let mut out = out??;
    stopped?;
    if out.ops == 0 && out.bytes == 0 {
        return Err(format!(
            "{} / {}: nothing was measured ({} error(s){})",
            setup.name(),
            kind.name(),
            out.errors,
            out.first_error
                .map(|e| format!(", first: {e}"))
                .unwrap_or_default()
        ));
    }
    if let (Some(e), true) = (&out.first_error, verbose) {
        eprintln!(
            "\r\x1b[2K{} / {}: {} error(s), first: {e}",
            setup.name(),
            kind.name(),
            out.errors
        );
    }
    let busy = |cpus: &mut dyn Iterator<Item = usize>| -> f64 {
        cpus.map(|c| after.get(c).unwrap_or(&0.0) - before.get(c).unwrap_or(&0.0))
            .sum()
    };
    let server_cpu_s = busy(&mut ctx.server_cpus.iter().copied());
    let machine_cpu_s = busy(&mut (0..after.len()));
    out.lat_ns.sort_unstable();
    let pct = |q: f64| -> f64 {
        if out.lat_ns.is_empty() {
            return 0.0;
        }
        let i = ((q * out.lat_ns.len() as f64) as usize).min(out.lat_ns.len() - 1);
        out.lat_ns[i] as f64 / 1e3
    };
    let per = |cpu: f64| {
        if kind.bulk() {
            cpu / (out.bytes as f64 / 1e9).max(1e-12)
        } else {
            cpu / (out.ops as f64 / 1e6).max(1e-12)
        }
    };
    Ok(Sample {
        rate: out.ops as f64 / secs,
        gbit: out.bytes as f64 * 8.0 / secs / 1e9,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        p999_us: pct(0.999),
        server_cpu_s,
        machine_cpu_s,
        server_cost: per(server_cpu_s),
        machine_cost: per(machine_cpu_s),
        errors: out.errors as f64,
    })
}

// ----- report -------------------------------------------------------------------------------

fn med(v: &[Sample], f: impl Fn(&Sample) -> f64) -> f64 {
    median(&v.iter().map(f).collect::<Vec<_>>())
}

fn summary(v: &[Sample]) -> Sample {
    Sample {
        rate: med(v, |s| s.rate),
        gbit: med(v, |s| s.gbit),
        p50_us: med(v, |s| s.p50_us),
        p99_us: med(v, |s| s.p99_us),
        p999_us: med(v, |s| s.p999_us),
        server_cpu_s: med(v, |s| s.server_cpu_s),
        machine_cpu_s: med(v, |s| s.machine_cpu_s),
        server_cost: med(v, |s| s.server_cost),
        machine_cost: med(v, |s| s.machine_cost),
        errors: v.iter().map(|s| s.errors).sum(),
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { f64::NAN }
}

fn progress(done: usize, total: usize, started: Instant, what: &str) {
    let width = 30;
    let filled = width * done / total.max(1);
    let eta = if done > 0 {
        started.elapsed().as_secs_f64() / done as f64 * (total - done) as f64
    } else {
        0.0
    };
    eprint!(
        "\r\x1b[2K[{}{}] {done}/{total} eta {:>4.0} s  {what}",
        "#".repeat(filled),
        ".".repeat(width - filled),
        eta
    );
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
            o => {
                return Err(format!(
                    "--cases: `{o}` is not rr1, rr64, bulk-in, bulk-out or connect"
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
        .server_tx_checksum_off(true)
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
    let ctx = Ctx {
        net: &net,
        server_cpus: server_cpus.clone(),
        client_cpu,
        warmup: Duration::from_secs_f64(cli.warmup),
        seconds: Duration::from_secs_f64(cli.seconds),
    };
    println!(
        "compare: server on CPU(s) {server_cpus:?}, load generator on CPU {client_cpu}; {} case(s) x {} setup(s) x {} repetition(s) of {} s (+{} s warm-up); offloads {}",
        kinds.len(),
        setups.len(),
        cli.repeat,
        cli.seconds,
        cli.warmup,
        if cli.offloads { "on" } else { "off" }
    );
    let total = kinds.len() * setups.len() * cli.repeat;
    let mut samples = vec![vec![Vec::new(); setups.len()]; kinds.len()];
    let started = Instant::now();
    let mut done = 0;
    for rep in 0..cli.repeat {
        for (ki, kind) in kinds.iter().enumerate() {
            for (si, setup) in setups.iter().enumerate() {
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
                        "\r\x1b[2Krep {} {:<30} {:<16} {:>10.0}/s {:>7.3} Gbit/s p99 {:>8.1} us server CPU {:.3} s",
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
    eprintln!();

    // Medians and ratios.
    let mut rows = Vec::new();
    let mut json = Vec::new();
    let kernel = setups.iter().position(|s| *s == Setup::Kernel);
    for (ki, kind) in kinds.iter().enumerate() {
        let base = kernel.map(|k| summary(&samples[ki][k]));
        for (si, setup) in setups.iter().enumerate() {
            let m = summary(&samples[ki][si]);
            let (rate, unit) = if kind.bulk() {
                (m.gbit, "Gbit/s")
            } else if *kind == Kind::Connect {
                (m.rate, "conn/s")
            } else {
                (m.rate, "req/s")
            };
            let cost_unit = if kind.bulk() {
                "CPU s/GB"
            } else {
                "CPU s per M"
            };
            let r = base.map(|b| {
                let brate = if kind.bulk() { b.gbit } else { b.rate };
                (
                    ratio(rate, brate),
                    ratio(m.p99_us, b.p99_us),
                    ratio(m.server_cost, b.server_cost),
                    ratio(m.machine_cost, b.machine_cost),
                )
            });
            let lat = |x: f64| {
                if kind.bulk() {
                    "-".to_string()
                } else {
                    format!("{x:.1}")
                }
            };
            let fmt_ratio = |x: f64| {
                if *setup == Setup::Kernel || x.is_nan() {
                    "-".to_string()
                } else {
                    format!("{x:.2}")
                }
            };
            rows.push(vec![
                kind.name(),
                setup.name().to_string(),
                if kind.bulk() {
                    format!("{rate:.3} {unit}")
                } else {
                    format!("{rate:.0} {unit}")
                },
                lat(m.p50_us),
                lat(m.p99_us),
                lat(m.p999_us),
                format!("{:.3} {cost_unit}", m.server_cost),
                format!("{:.3}", m.machine_cost),
                r.map_or("-".into(), |r| fmt_ratio(r.0)),
                r.map_or("-".into(), |r| {
                    if kind.bulk() {
                        "-".into()
                    } else {
                        fmt_ratio(r.1)
                    }
                }),
                r.map_or("-".into(), |r| fmt_ratio(r.2)),
                r.map_or("-".into(), |r| fmt_ratio(r.3)),
            ]);
            let num = |x: f64| {
                if x.is_finite() {
                    format!("{x:.4}")
                } else {
                    "null".into()
                }
            };
            json.push(format!(
                "{{\"case\":\"{}\",\"setup\":\"{}\",\"runs\":{},\"rate\":{},\"unit\":\"{unit}\",\"p50_us\":{},\"p99_us\":{},\"p999_us\":{},\"server_cpu_s\":{},\"machine_cpu_s\":{},\"server_cost\":{},\"machine_cost\":{},\"cost_unit\":\"{cost_unit}\",\"vs_kernel\":{}}}",
                kind.id(),
                setup.name(),
                samples[ki][si].len(),
                num(rate),
                num(m.p50_us),
                num(m.p99_us),
                num(m.p999_us),
                num(m.server_cpu_s),
                num(m.machine_cpu_s),
                num(m.server_cost),
                num(m.machine_cost),
                match r {
                    Some(r) if *setup != Setup::Kernel => format!(
                        "{{\"rate\":{},\"p99\":{},\"server_cost\":{},\"machine_cost\":{}}}",
                        num(r.0),
                        num(r.1),
                        num(r.2),
                        num(r.3)
                    ),
                    _ => "null".into(),
                }
            ));
        }
    }
    let table = markdown_table(
        &[
            "case",
            "setup",
            "rate",
            "p50 us",
            "p99 us",
            "p99.9 us",
            "server CPU",
            "machine CPU",
            "rate / kernel",
            "p99 / kernel",
            "server CPU / kernel",
            "machine CPU / kernel",
        ],
        &rows,
    );
    println!("\n{table}");
    std::fs::create_dir_all(&cli.out).map_err(|e| format!("{}: {e}", cli.out.display()))?;
    let kernel_release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let md = format!(
        "# corelane against the kernel TCP stack (same veth, same CPUs)\n\n\
         Server on CPU(s) {server_cpus:?}, load generator on CPU {client_cpu}; kernel {kernel_release}; \
         veth offloads {}; medians of {} run(s) of {} s after {} s of warm-up; the setups alternate \
         within every repetition.\n\n\
         - `kernel`: kernel stack on both ends (tokio, one current_thread runtime per server CPU, \
         SO_REUSEPORT); `corelane-server`: the same kernel-socket load generator against corelane; \
         `corelane-both`: the load generator on corelane as well.\n\
         - Server CPU: busy time (user, system, irq, softirq) of the server CPUs; machine CPU: all \
         CPUs. Per million requests (or connections), or per GB for bulk. On veth the receive \
         side's softirq runs on the sender's CPU, so part of each stack's receive work is charged \
         to the other end's CPU: the machine column counts it wherever it ran.\n\
         - Ratios are corelane / kernel: above 1 is better for rate, below 1 better for latency \
         and CPU.\n\n{table}\n\nReproduce: `scripts/compare.sh` (or `cargo run --release -p \
         corelane-bench --bin compare -- --repeat {} --seconds {}`).\n",
        if cli.offloads {
            "on"
        } else {
            "off (TSO, GSO, GRO, TX checksum)"
        },
        cli.repeat,
        cli.seconds,
        cli.warmup,
        cli.repeat,
        cli.seconds
    );
    let write = |name: &str, text: &str| {
        let p = cli.out.join(name);
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
    };
    write("compare.md", &md)?;
    write(
        "compare.json",
        &format!(
            "{{\"server_cpus\":{server_cpus:?},\"client_cpu\":{client_cpu},\"kernel\":\"{kernel_release}\",\"offloads\":{},\"seconds\":{},\"repeat\":{},\"results\":[\n  {}\n]}}\n",
            cli.offloads,
            cli.seconds,
            cli.repeat,
            json.join(",\n  ")
        ),
    )?;
    // Plots: request/response against connections, one line per setup.
    let mut panels = Vec::new();
    for size in [1usize, 64] {
        let pick = |f: &dyn Fn(&Sample) -> f64| -> Vec<(String, Vec<(f64, f64)>)> {
            setups
                .iter()
                .enumerate()
                .map(|(si, s)| {
                    let pts = kinds
                        .iter()
                        .enumerate()
                        .filter_map(|(ki, k)| match k {
                            Kind::Rr { size: sz, conns } if *sz == size => {
                                Some((*conns as f64, f(&summary(&samples[ki][si]))))
                            }
                            _ => None,
                        })
                        .collect();
                    (s.name().to_string(), pts)
                })
                .filter(|(_, p): &(String, Vec<_>)| !p.is_empty())
                .collect()
        };
        let rate = pick(&|m| m.rate / 1e3);
        if rate.is_empty() {
            continue;
        }
        panels.push(Panel {
            title: format!("{size}-byte request/response"),
            x: "connections".into(),
            y: "thousand requests/s".into(),
            series: rate,
        });
        panels.push(Panel {
            title: format!("{size}-byte p99 latency"),
            x: "connections".into(),
            y: "p99 us".into(),
            series: pick(&|m| m.p99_us),
        });
        panels.push(Panel {
            title: format!("{size}-byte server CPU"),
            x: "connections".into(),
            y: "server CPU s per M requests".into(),
            series: pick(&|m| m.server_cost),
        });
    }
    let png = cli.out.join("compare.png");
    if !panels.is_empty() {
        plot_png(&png, &panels)?;
    }
    println!(
        "wrote {}, {}{}",
        cli.out.join("compare.md").display(),
        cli.out.join("compare.json").display(),
        if panels.is_empty() {
            String::new()
        } else {
            format!(" and {}", png.display())
        }
    );
    Ok(())
}
