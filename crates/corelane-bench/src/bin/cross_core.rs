//! What a socket costs on another core than its own: 64-byte request-response round trips from
//! kernel clients to a two-core corelane server whose connections are served either on the
//! core that accepted them (`tokio::spawn` there) or handed to the other core's task, which
//! then works them through the owning core's stack. The kernel's stack serves beside them as
//! the baseline.
//!
//! ```text
//! cargo run --release -p corelane-bench --bin cross_core -- --round-trips 20000 --conns 4
//! ```
//!
//! Needs root (network namespaces, XDP, AF_XDP) and a machine with at least 2 CPUs.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use corelane_bench::{markdown_table, median};
use corelane_testnet::VethPair;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KERNEL: &str = "10.89.0.1";
const CORELANE: &str = "10.89.0.3";
const CLIENT: &str = "10.89.0.2";
const PORT: u16 = 7500;

#[derive(Parser, Debug)]
#[command(about = "A socket served on its own core against one served from the other core")]
struct Args {
    /// Round trips per connection.
    #[arg(long, default_value_t = 20_000)]
    round_trips: usize,
    /// Connections, each with its own kernel client thread.
    #[arg(long, default_value_t = 4)]
    conns: usize,
}

/// The cores' mailboxes: a stream sent to one is served by that core's task.
type Mailboxes =
    Arc<[Mutex<Option<tokio::sync::mpsc::UnboundedSender<corelane::net::TcpStream>>>; 2]>;

async fn echo<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S) {
    let mut b = [0u8; 64];
    while s.read_exact(&mut b).await.is_ok() {
        if s.write_all(&b).await.is_err() {
            break;
        }
    }
}

/// The round trips of `conns` kernel clients to `to`: every round trip's time, in µs, and the
/// seconds they took together.
fn load(net: &VethPair, to: SocketAddr, a: &Args) -> Result<(Vec<f64>, f64), String> {
    let n = a.round_trips;
    let started = Instant::now();
    let threads: Vec<_> = (0..a.conns)
        .map(|_| {
            net.client_ns().spawn(move || -> std::io::Result<Vec<f64>> {
                let mut s = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(10))?;
                s.set_nodelay(true)?;
                let mut b = [7u8; 64];
                let mut rtts = Vec::with_capacity(n);
                for _ in 0..n {
                    let t = Instant::now();
                    s.write_all(&b)?;
                    s.read_exact(&mut b)?;
                    rtts.push(t.elapsed().as_secs_f64() * 1e6);
                }
                Ok(rtts)
            })
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut all = Vec::new();
    for t in threads {
        all.extend(
            t.join()
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?,
        );
    }
    Ok((all, started.elapsed().as_secs_f64()))
}

/// A two-core corelane server; `across`: each connection is served by the other core's task.
fn corelane_run(net: &VethPair, across: bool, a: &Args) -> Result<(Vec<f64>, f64), String> {
    let ifname = net.server_if().to_string();
    let boxes: Mailboxes = Arc::new([Mutex::new(None), Mutex::new(None)]);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    let thread = net
        .server_ns()
        .spawn(move || -> Result<(), String> {
            let rt = corelane::Runtime::builder(&ifname)
                .addr(format!("{CORELANE}/24").as_str())
                .cores(2)
                .build()
                .map_err(|e| e.to_string())?;
            let _ = stop_tx.send(rt.stop_handle());
            let ready = Mutex::new(ready_tx);
            rt.run_with(boxes, |core, boxes| {
                let ready = ready.lock().ok().map(|r| r.clone());
                async move {
                    let me = core.index % 2;
                    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                    if let Ok(mut b) = boxes[me].lock() {
                        *b = Some(tx);
                    }
                    tokio::spawn(async move {
                        while let Some(s) = rx.recv().await {
                            tokio::spawn(echo(s));
                        }
                    });
                    let Ok(l) = corelane::net::TcpListener::bind(PORT).await else {
                        return;
                    };
                    if let Some(r) = ready {
                        let _ = r.send(());
                    }
                    while let Ok((s, _)) = l.accept().await {
                        let other = boxes[1 - me].lock().ok().and_then(|b| b.clone());
                        match other.filter(|_| across) {
                            Some(there) => {
                                let _ = there.send(s);
                            }
                            None => {
                                tokio::spawn(echo(s));
                            }
                        }
                    }
                }
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
        })
        .map_err(|e| e.to_string())?;
    let stop = stop_rx
        .recv_timeout(Duration::from_secs(20))
        .map_err(|_| "the corelane server did not start")?;
    for _ in 0..2 {
        ready_rx
            .recv_timeout(Duration::from_secs(20))
            .map_err(|_| "a core did not listen")?;
    }
    let to = SocketAddr::new(CORELANE.parse().map_err(|_| "addr")?, PORT);
    let rtts = load(net, to, a);
    stop.stop();
    thread.join().map_err(|e| e.to_string())??;
    rtts
}

/// The kernel's stack: a thread per connection, blocking reads and writes.
fn kernel_run(net: &VethPair, a: &Args) -> Result<(Vec<f64>, f64), String> {
    let l = net
        .server_ns()
        .run(|| std::net::TcpListener::bind((KERNEL, PORT)))
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let conns = a.conns;
    std::thread::spawn(move || {
        for s in l.incoming().take(conns) {
            let Ok(mut s) = s else { break };
            let _ = s.set_nodelay(true);
            std::thread::spawn(move || {
                let mut b = [0u8; 64];
                while s.read_exact(&mut b).is_ok() {
                    if s.write_all(&b).is_err() {
                        break;
                    }
                }
            });
        }
    });
    let to = SocketAddr::new(KERNEL.parse().map_err(|_| "addr")?, PORT);
    load(net, to, a)
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("cross_core: {e}");
        std::process::exit(1);
    }
}

fn run(a: Args) -> Result<(), String> {
    if a.round_trips == 0 || a.conns == 0 {
        return Err("--round-trips and --conns must be at least 1".into());
    }
    let net = || {
        VethPair::builder()
            .queues(2)
            .server_addr(&format!("{KERNEL}/24"))
            .client_addr(&format!("{CLIENT}/24"))
            .build()
            .map_err(|e| e.to_string())
    };
    let mut rows = Vec::new();
    let mut p50s = Vec::new();
    for (name, which) in [
        ("corelane, on the accepting core", 0),
        ("corelane, handed to the other core", 1),
        ("kernel (a thread per connection)", 2),
    ] {
        let n = net()?;
        let (mut rtts, secs) = match which {
            0 => corelane_run(&n, false, &a)?,
            1 => corelane_run(&n, true, &a)?,
            _ => kernel_run(&n, &a)?,
        };
        rtts.sort_by(f64::total_cmp);
        let p99 = rtts[(rtts.len() * 99 / 100).min(rtts.len() - 1)];
        let p50 = median(&rtts);
        p50s.push(p50);
        rows.push(vec![
            name.to_string(),
            format!("{p50:.1}"),
            format!("{p99:.1}"),
            format!("{:.0}", rtts.len() as f64 / secs),
        ]);
    }
    println!(
        "{}",
        markdown_table(
            &["server", "p50 µs", "p99 µs", "round trips/s (all conns)"],
            &rows
        )
    );
    println!(
        "handed to the other core / on its own core, p50: {:.2}x; on its own core / kernel: {:.2}x \
         ({} connections x {} round trips)",
        p50s[1] / p50s[0].max(1e-9),
        p50s[0] / p50s[2].max(1e-9),
        a.conns,
        a.round_trips
    );
    Ok(())
}
