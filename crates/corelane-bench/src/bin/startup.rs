//! Start-up time: from a server's first line of code to its first answered request, corelane
//! against a tokio server on the kernel's stack, on the same veth pair.
//!
//! Each run takes a fresh veth pair. corelane: `Runtime::builder(..).build()` (which loads and
//! attaches the XDP program and opens the AF_XDP sockets), then `run` up to a bound listener;
//! tokio: a current-thread runtime and a bound `TcpListener`. Then a kernel client in the other
//! namespace connects and exchanges one byte. Reports the medians of `--runs`, and the ratio.
//!
//! ```text
//! cargo run --release -p corelane-bench --bin startup -- --runs 5
//! ```
//!
//! Needs root (network namespaces, XDP, AF_XDP).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Parser;
use corelane_bench::{markdown_table, median};
use corelane_testnet::VethPair;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The kernel's address on the server end (tokio's), and corelane's beside it.
const SERVER: &str = "10.88.0.1";
const CORELANE: &str = "10.88.0.3";
const CLIENT: &str = "10.88.0.2";
const PORT: u16 = 7300;

#[derive(Parser, Debug)]
#[command(about = "Start-up time to the first answered request, corelane against tokio")]
struct Args {
    /// Runs of each server.
    #[arg(long, default_value_t = 5)]
    runs: usize,
}

/// One start: until the listener was bound, and until the first request was answered.
#[derive(Debug, Clone, Copy)]
struct Start {
    built: Duration,
    bound: Duration,
    answered: Duration,
}

fn net() -> Result<VethPair, String> {
    VethPair::builder()
        .server_addr(&format!("{SERVER}/24"))
        .client_addr(&format!("{CLIENT}/24"))
        .build()
        .map_err(|e| e.to_string())
}

/// One byte there and back from the client namespace, the clock read when it came back.
fn first_request(net: &VethPair, to: SocketAddr, t0: Instant) -> Result<Duration, String> {
    net.client_ns()
        .run(move || -> std::io::Result<Duration> {
            let mut s = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(10))?;
            s.write_all(b"x")?;
            let mut b = [0u8; 1];
            s.read_exact(&mut b)?;
            Ok(t0.elapsed())
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the first request: {e}"))
}

async fn echo_one(mut s: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin) {
    let mut b = [0u8; 1];
    if s.read_exact(&mut b).await.is_ok() {
        let _ = s.write_all(&b).await;
    }
}

/// The rest of one start, either server's: its times until built and bound (from `ready`),
/// then the first request to `ip`, then the server's end.
fn finish(
    net: &VethPair,
    name: &str,
    thread: corelane_testnet::NsThread<Result<(), String>>,
    ready: &mpsc::Receiver<(Duration, Duration)>,
    ip: &str,
    t0: Instant,
) -> Result<Start, String> {
    let Ok((built, bound)) = ready.recv_timeout(Duration::from_secs(20)) else {
        return Err(match thread.join() {
            Ok(Err(e)) => format!("the {name} server did not start: {e}"),
            _ => format!("the {name} server did not start"),
        });
    };
    let to = SocketAddr::new(ip.parse().map_err(|_| "addr")?, PORT);
    let answered = first_request(net, to, t0)?;
    thread.join().map_err(|e| e.to_string())??;
    Ok(Start {
        built,
        bound,
        answered,
    })
}

fn corelane_start(net: &VethPair) -> Result<Start, String> {
    let ifname = net.server_if().to_string();
    let (tx, rx) = mpsc::channel::<(Duration, Duration)>();
    let t0 = Instant::now();
    let thread = net
        .server_ns()
        .spawn(move || -> Result<(), String> {
            let rt = corelane::Runtime::builder(&ifname)
                .addr(format!("{CORELANE}/24").as_str())
                .cores(1)
                .build()
                .map_err(|e| e.to_string())?;
            let built = t0.elapsed();
            rt.run(move |_| {
                let tx = tx.clone();
                async move {
                    let Ok(l) = corelane::net::TcpListener::bind(PORT).await else {
                        return;
                    };
                    let _ = tx.send((built, t0.elapsed()));
                    if let Ok((s, _)) = l.accept().await {
                        echo_one(s).await;
                    }
                }
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
        })
        .map_err(|e| e.to_string())?;
    finish(net, "corelane", thread, &rx, CORELANE, t0)
}

fn tokio_start(net: &VethPair) -> Result<Start, String> {
    let (tx, rx) = mpsc::channel::<(Duration, Duration)>();
    let t0 = Instant::now();
    let thread = net
        .server_ns()
        .spawn(move || -> Result<(), String> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let built = t0.elapsed();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind((SERVER, PORT))
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = tx.send((built, t0.elapsed()));
                if let Ok((s, _)) = l.accept().await {
                    echo_one(s).await;
                }
                Ok(())
            })
        })
        .map_err(|e| e.to_string())?;
    finish(net, "tokio", thread, &rx, SERVER, t0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("startup: {e}");
        std::process::exit(1);
    }
}

fn run(a: Args) -> Result<(), String> {
    if a.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let mut rows = Vec::new();
    let mut firsts = Vec::new();
    for (name, start) in [
        (
            "corelane",
            corelane_start as fn(&VethPair) -> Result<Start, String>,
        ),
        ("tokio (kernel)", tokio_start),
    ] {
        let mut runs = Vec::new();
        for _ in 0..a.runs {
            runs.push(start(&net()?)?);
        }
        let med =
            |f: fn(&Start) -> Duration| median(&runs.iter().map(|s| ms(f(s))).collect::<Vec<_>>());
        let first = med(|s| s.answered);
        firsts.push(first);
        rows.push(vec![
            name.to_string(),
            format!("{:.1}", med(|s| s.built)),
            format!("{:.1}", med(|s| s.bound)),
            format!("{first:.1}"),
        ]);
    }
    println!(
        "{}",
        markdown_table(
            &[
                "server",
                "built ms",
                "listening ms",
                "first request answered ms"
            ],
            &rows
        )
    );
    println!(
        "corelane / tokio, first request answered: {:.1}x (medians of {} runs)",
        firsts[0] / firsts[1].max(1e-3),
        a.runs
    );
    Ok(())
}
