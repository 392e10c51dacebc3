//! Memory per idle connection: a corelane server and a kernel (tokio) server, each in the server
//! namespace, hold `--conns` connections from kernel clients that each exchanged one 64-byte
//! message (so every buffer was touched) and then went quiet. Both servers run the same
//! application: a task per connection reading into a 64-byte buffer and echoing. The corelane
//! server is one process on one core; the kernel server and the clients are as many processes
//! as the open-file limit asks (`--per-process` sockets each; SO_REUSEPORT spreads the kernel
//! server's connections), all counted. Reports per connection:
//! - the server process's resident memory (VmRSS) and virtual size (VmSize) growth;
//! - the machine's kernel socket memory growth (its slab, and the pages of TCP's buffers that
//!   `/proc/net/sockstat` counts: queued data lives there, not in the slab): for the kernel
//!   server it counts both ends; for corelane, only the kernel clients. The kernel server's own
//!   socket memory is the difference of the two (same clients, same run). Each run first waits
//!   for the last one's orphaned sockets to go.
//!
//! With `--inflight BYTES` each client then sends that many bytes more, which the server's
//! application never reads: the memory of a connection holding data (16 KiB in flight), not an
//! idle one.
//!
//! ```text
//! cargo run --release -p corelane-bench --bin idle -- --conns 10000
//! cargo run --release -p corelane-bench --bin idle -- --conns 10000 --inflight 16384
//! ```
//!
//! Needs root (network namespaces, XDP, AF_XDP).

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use corelane_bench::markdown_table;
use corelane_testnet::VethPair;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const KERNEL: &str = "10.86.0.2";
const CORELANE: &str = "10.86.0.1";
const CLIENT: &str = "10.86.0.3";
const FIRST_PORT: u16 = 6000;
/// Connections per server port: half the client's ports (1024-65000), so that the kernel
/// finds a free one quickly.
const PER_PORT: usize = 30_000;

#[derive(Parser, Debug)]
#[command(about = "Memory per idle connection, corelane against the kernel")]
struct Args {
    #[command(subcommand)]
    serve: Option<Serve>,
    /// Idle connections to hold.
    #[arg(long, default_value_t = 10_000)]
    conns: usize,
    /// Setups: kernel, corelane.
    #[arg(long, value_delimiter = ',', default_value = "kernel,corelane")]
    setups: Vec<String>,
    /// Connections being opened at once, per client process.
    #[arg(long, default_value_t = 128)]
    parallel: usize,
    /// Most sockets per kernel process (clients and the kernel server): below the open-file
    /// limit, which an unprivileged hard limit may cap.
    #[arg(long, default_value_t = 15_000)]
    per_process: usize,
    /// The server's CPU.
    #[arg(long, default_value_t = 0)]
    cpu: usize,
    /// Bytes each client sends after the first exchange, which the server never reads (0:
    /// idle connections).
    #[arg(long, default_value_t = 0)]
    inflight: usize,
    /// Where idle.md (idle-inflight.md with `--inflight`) goes.
    #[arg(long, default_value = "target/idle")]
    out: PathBuf,
}

#[derive(Subcommand, Debug)]
enum Serve {
    /// (internal) Runs one server until its standard input closes.
    Serve {
        #[arg(long)]
        stack: String,
        #[arg(long)]
        ifname: String,
        #[arg(long)]
        ports: u16,
        #[arg(long)]
        conns: usize,
        #[arg(long)]
        cpu: usize,
        #[arg(long, default_value_t = 0)]
        inflight: usize,
    },
    /// (internal) Opens connections and holds them until its standard input closes.
    Hold {
        #[arg(long)]
        ip: String,
        #[arg(long)]
        first: usize,
        #[arg(long)]
        count: usize,
        #[arg(long)]
        parallel: usize,
        #[arg(long, default_value_t = 0)]
        inflight: usize,
    },
}

fn main() {
    let args = Args::parse();
    let r = match &args.serve {
        Some(Serve::Serve {
            stack,
            ifname,
            ports,
            conns,
            cpu,
            inflight,
        }) => serve(stack, ifname, *ports, *conns, *cpu, *inflight > 0),
        Some(Serve::Hold {
            ip,
            first,
            count,
            parallel,
            inflight,
        }) => hold(ip, *first, *count, *parallel, *inflight),
        None => run(&args),
    };
    if let Err(e) = r {
        eprintln!("idle: {e}");
        std::process::exit(1);
    }
}

// ----- the servers (child processes) --------------------------------------------------------

/// Echoes; with `once`, echoes the first message only and then holds the connection without
/// reading (what arrives after stays in the server's receive buffer).
async fn echo<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, once: bool) {
    let mut buf = [0u8; 64];
    let mut got = 0;
    while let Ok(n @ 1..) = s.read(&mut buf[got..]).await {
        if !once {
            if s.write_all(&buf[..n]).await.is_err() {
                return;
            }
            continue;
        }
        got += n;
        if got == buf.len() {
            if s.write_all(&buf).await.is_ok() {
                std::future::pending::<()>().await;
            }
            return;
        }
    }
}

/// Tells the parent the server listens, then waits for stdin to close.
fn ready_then_wait() {
    println!("ready");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    while matches!(std::io::stdin().read_line(&mut line), Ok(1..)) {
        line.clear();
    }
}

fn serve(
    stack: &str,
    ifname: &str,
    ports: u16,
    conns: usize,
    cpu: usize,
    once: bool,
) -> Result<(), String> {
    corelane_bench::pin(cpu);
    match stack {
        "kernel" => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, async move {
                for p in 0..ports {
                    let addr = SocketAddr::from(([0, 0, 0, 0], FIRST_PORT + p));
                    let s = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
                    s.set_reuseaddr(true).map_err(|e| e.to_string())?;
                    s.set_reuseport(true).map_err(|e| e.to_string())?;
                    s.bind(addr).map_err(|e| e.to_string())?;
                    let l = s.listen(4096).map_err(|e| e.to_string())?;
                    tokio::task::spawn_local(async move {
                        while let Ok((s, _)) = l.accept().await {
                            tokio::task::spawn_local(echo(s, once));
                        }
                    });
                }
                tokio::task::spawn_blocking(ready_then_wait)
                    .await
                    .map_err(|e| e.to_string())
            })
        }
        "corelane" => {
            let rt = corelane::Runtime::builder(ifname)
                .addr(format!("{CORELANE}/24"))
                .cpus(vec![cpu])
                .stack(corelane::StackConfig {
                    flows: conns + 1024,
                    ..corelane::StackConfig::default()
                })
                .backlog(4096)
                .build()
                .map_err(|e| e.to_string())?;
            let stop = rt.stop_handle();
            let waiter = std::thread::spawn(move || {
                ready_then_wait();
                stop.stop();
            });
            rt.run(move |_| async move {
                for p in 0..ports {
                    let Ok(l) = corelane::net::TcpListener::bind(FIRST_PORT + p).await else {
                        eprintln!("idle: port {} not bound", FIRST_PORT + p);
                        return;
                    };
                    tokio::task::spawn_local(async move {
                        while let Ok((s, _)) = l.accept().await {
                            tokio::task::spawn_local(echo(s, once));
                        }
                    });
                }
                std::future::pending::<()>().await
            })
            .map_err(|e| e.to_string())?;
            let _ = waiter.join();
            Ok(())
        }
        other => Err(format!("unknown stack {other:?} (kernel or corelane)")),
    }
}

// ----- the parent -------------------------------------------------------------------------

/// A field of a /proc status-like file, in KiB.
fn kib(file: &str, key: &str) -> Result<i64, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no {key} in {file}"))
}

#[derive(Debug, Clone, Copy)]
struct Mem {
    rss: i64,
    virt: i64,
    slab: i64,
}

/// Opens connections `first..first + count` (connection `i` goes to port
/// `FIRST_PORT + i / PER_PORT`), each exchanging 64 bytes, and returns them open.
async fn connect_all(
    ip: &str,
    first: usize,
    count: usize,
    parallel: usize,
    inflight: usize,
) -> Result<Vec<tokio::net::TcpStream>, String> {
    let mut out = Vec::with_capacity(count);
    let mut set = tokio::task::JoinSet::new();
    let mut next = first;
    let end = first + count;
    while out.len() < count {
        while next < end && set.len() < parallel.max(1) {
            let port = FIRST_PORT + (next / PER_PORT) as u16;
            let addr: SocketAddr = format!("{ip}:{port}").parse().map_err(|_| "address")?;
            next += 1;
            set.spawn(async move {
                let mut s = tokio::time::timeout(
                    Duration::from_secs(10),
                    tokio::net::TcpStream::connect(addr),
                )
                .await
                .map_err(|_| format!("connect to {addr} timed out"))?
                .map_err(|e| format!("connect to {addr}: {e}"))?;
                let msg = [0x5au8; 64];
                s.write_all(&msg).await.map_err(|e| e.to_string())?;
                let mut back = [0u8; 64];
                tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut back))
                    .await
                    .map_err(|_| format!("echo from {addr} timed out"))?
                    .map_err(|e| e.to_string())?;
                if back != msg {
                    return Err("echo differs".to_string());
                }
                if inflight > 0 {
                    // Left unread by the server: the connection holds it.
                    let more = vec![0xa5u8; inflight];
                    tokio::time::timeout(Duration::from_secs(10), s.write_all(&more))
                        .await
                        .map_err(|_| format!("sending {inflight} bytes to {addr} timed out"))?
                        .map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(s)
            });
        }
        match set.join_next().await {
            Some(Ok(Ok(s))) => out.push(s),
            Some(Ok(Err(e))) => return Err(e),
            Some(Err(e)) => return Err(e.to_string()),
            None => break,
        }
    }
    Ok(out)
}

/// The client process: opens its connections, says `open`, holds them until stdin closes.
fn hold(
    ip: &str,
    first: usize,
    count: usize,
    parallel: usize,
    inflight: usize,
) -> Result<(), String> {
    corelane_bench::sys::raise_nofile(count as u64 + 64)
        .map_err(|e| format!("RLIMIT_NOFILE to {}: {e}", count + 64))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let streams = rt.block_on(connect_all(ip, first, count, parallel, inflight))?;
    ready_then_wait();
    drop(streams);
    Ok(())
}

/// A child process that says `ready` (or `open`) on its first line, and ends when its standard
/// input closes.
struct Proc {
    child: Child,
}

impl Proc {
    fn spawn(mut cmd: std::process::Command, what: &str) -> Result<Proc, String> {
        let child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {what}: {e}"))?;
        Ok(Proc { child })
    }

    /// Waits for the first line.
    fn ready(&mut self, what: &str) -> Result<(), String> {
        let mut line = String::new();
        let stdout = self.child.stdout.take().ok_or("no stdout")?;
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        if line.trim() != "ready" {
            return Err(format!("{what} failed (see above)"));
        }
        Ok(())
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

struct Row {
    setup: String,
    conns: usize,
    open_s: f64,
    rss: f64,
    virt: f64,
    slab: f64,
}

/// The kernel's TCP buffer memory in KiB: `/proc/net/sockstat`'s TCP `mem`, in pages. Data
/// queued on a socket lives in pages the slab does not count.
fn tcp_mem_kib() -> Result<i64, String> {
    let pages = sockstat_tcp("mem").ok_or("no TCP mem in /proc/net/sockstat")?;
    // The kernel counts these in 4 KiB pages on the machines the bench runs on (x86-64).
    Ok(pages * 4)
}

/// The memory of the servers' processes, summed, and the machine's kernel memory for sockets:
/// its slab and the TCP buffers' pages.
fn mem_of(pids: &[u32]) -> Result<Mem, String> {
    let mut m = Mem {
        rss: 0,
        virt: 0,
        slab: kib("/proc/meminfo", "Slab:")? + tcp_mem_kib()?,
    };
    for &pid in pids {
        let status = format!("/proc/{pid}/status");
        m.rss += kib(&status, "VmRSS:")?;
        m.virt += kib(&status, "VmSize:")?;
    }
    Ok(m)
}

/// `/proc/net/sockstat`'s TCP counter `what`.
fn sockstat_tcp(what: &str) -> Option<i64> {
    let text = std::fs::read_to_string("/proc/net/sockstat").ok()?;
    let l = text.lines().find_map(|l| l.strip_prefix("TCP:"))?;
    let w: Vec<&str> = l.split_whitespace().collect();
    w.windows(2)
        .find(|p| p[0] == what)
        .and_then(|p| p[1].parse().ok())
}

/// Waits (up to three minutes) until the last run's orphaned kernel sockets are gone: their
/// memory going back during a run would be counted against it.
fn wait_for_orphans() {
    let deadline = Instant::now() + Duration::from_secs(180);
    while sockstat_tcp("orphan").is_some_and(|n| n > 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    if let Some(n) = sockstat_tcp("orphan").filter(|&n| n > 0) {
        eprintln!("idle: {n} orphaned TCP sockets remain; the kernel figures may be off");
    }
}

fn one(net: &VethPair, args: &Args, setup: &str, ports: u16) -> Result<Row, String> {
    wait_for_orphans();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let exe = exe.to_string_lossy();
    let n = args.conns;
    let per = args.per_process.max(1);
    let servers = if setup == "kernel" {
        n.div_ceil(per)
    } else {
        1
    };
    let mut procs = Vec::new();
    for _ in 0..servers {
        let mut cmd = net.server_ns().command(&exe);
        cmd.args(["serve", "--stack", setup, "--ifname", net.server_if()])
            .args(["--ports", &ports.to_string(), "--conns", &n.to_string()])
            .args(["--cpu", &args.cpu.to_string()])
            .args(["--inflight", &args.inflight.to_string()]);
        let mut c = Proc::spawn(cmd, &format!("the {setup} server"))?;
        c.ready(&format!("the {setup} server"))?;
        procs.push(c);
    }
    let pids: Vec<u32> = procs.iter().map(Proc::pid).collect();
    let ip = if setup == "kernel" { KERNEL } else { CORELANE };
    // One connection first, so the servers' one-time allocations are in the baseline.
    let mut warm = net.client_ns().command(&exe);
    warm.args(["hold", "--ip", ip, "--first", "0", "--count", "1"])
        .args(["--parallel", "1"])
        .args(["--inflight", &args.inflight.to_string()]);
    Proc::spawn(warm, "a client")?.ready("a client")?;
    std::thread::sleep(Duration::from_millis(300));
    let before = mem_of(&pids)?;
    let started = Instant::now();
    let mut clients = Vec::new();
    for first in (0..n).step_by(per) {
        let mut cmd = net.client_ns().command(&exe);
        cmd.args(["hold", "--ip", ip, "--first", &first.to_string()])
            .args(["--count", &per.min(n - first).to_string()])
            .args(["--parallel", &args.parallel.to_string()])
            .args(["--inflight", &args.inflight.to_string()]);
        // One client process at a time: its connections are open before the next starts.
        let mut c = Proc::spawn(cmd, "a client")?;
        c.ready("a client")?;
        clients.push(c);
    }
    let open_s = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(1));
    let after = mem_of(&pids)?;
    let per_conn = |a: i64, b: i64| (a - b) as f64 * 1024.0 / n as f64;
    let row = Row {
        setup: setup.to_string(),
        conns: n,
        open_s,
        rss: per_conn(after.rss, before.rss),
        virt: per_conn(after.virt, before.virt),
        slab: per_conn(after.slab, before.slab),
    };
    drop(clients);
    drop(procs);
    Ok(row)
}

fn run(args: &Args) -> Result<(), String> {
    if !corelane_testnet::is_root() {
        return Err("needs root (network namespaces, XDP, AF_XDP)".into());
    }
    let ports = args.conns.div_ceil(PER_PORT).max(1) as u16;
    let net = VethPair::builder()
        .server_addr(&format!("{KERNEL}/24"))
        .client_addr(&format!("{CLIENT}/24"))
        .build()
        .map_err(|e| e.to_string())?;
    net.client_ns()
        .exec(
            "sysctl",
            &["-qw", "net.ipv4.ip_local_port_range=1024 65000"],
        )
        .map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for setup in &args.setups {
        let row = one(&net, args, setup, ports)?;
        eprintln!(
            "{setup}: {} connections opened in {:.1} s: {:.0} B RSS, {:.0} B virtual, {:.0} B slab per connection",
            row.conns, row.open_s, row.rss, row.virt, row.slab
        );
        rows.push(row);
    }
    let kernel_slab = rows.iter().find(|r| r.setup == "kernel").map(|r| r.slab);
    let client_slab = rows.iter().find(|r| r.setup == "corelane").map(|r| r.slab);
    let mut table = Vec::new();
    for r in &rows {
        // The server's own kernel memory: for the kernel server, its slab growth less the
        // clients' (measured in the corelane run, where the server holds no kernel sockets).
        let server_kernel = match (r.setup.as_str(), kernel_slab, client_slab) {
            ("kernel", Some(k), Some(c)) => k - c,
            ("corelane", _, _) => 0.0,
            _ => f64::NAN,
        };
        table.push(vec![
            r.setup.clone(),
            r.conns.to_string(),
            format!("{:.0}", r.rss),
            format!("{:.0}", server_kernel),
            format!("{:.0}", r.rss + server_kernel),
            format!("{:.0}", r.virt),
            format!("{:.1}", r.open_s),
        ]);
    }
    let (title, what, flag) = if args.inflight > 0 {
        (
            format!(
                "Memory per connection with {} bytes in flight",
                args.inflight
            ),
            format!(
                "each connection exchanged one 64-byte message, then the client sent {} bytes \
                 more that the server's application never reads (they stay in its receive \
                 buffer, acknowledged)",
                args.inflight
            ),
            format!(" --inflight {}", args.inflight),
        )
    } else {
        (
            "Memory per idle connection".to_string(),
            "each connection exchanged one 64-byte message and went quiet".to_string(),
            String::new(),
        )
    };
    let md = format!(
        "# {title}\n\n`cargo run --release -p corelane-bench --bin idle -- \
         --conns {}{flag}`: {what}; the server \
         runs one task per connection (a 64-byte buffer). Bytes per connection: the server \
         process's RSS growth, the server's kernel socket memory (slab and TCP page growth with the kernel \
         server less the clients' own, from the corelane run), their sum, and the process's \
         virtual size growth.\n\n{}",
        args.conns,
        markdown_table(
            &[
                "server",
                "connections",
                "RSS B/conn",
                "kernel B/conn",
                "total B/conn",
                "virtual B/conn",
                "open s",
            ],
            &table
        )
    );
    std::fs::create_dir_all(&args.out).map_err(|e| e.to_string())?;
    let path = args.out.join(if args.inflight > 0 {
        "idle-inflight.md"
    } else {
        "idle.md"
    });
    std::fs::write(&path, &md).map_err(|e| e.to_string())?;
    println!("{md}");
    eprintln!("idle: wrote {}", path.display());
    Ok(())
}
