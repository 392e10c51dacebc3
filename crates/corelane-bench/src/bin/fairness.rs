//! Sharing a bottleneck: corelane's CUBIC flows against the kernel's, through the lossy path's
//! router with a `--rate` Mbit/s token bucket toward the client (no random loss: the queue's
//! own drops are the signal). Scenarios, each `--seconds` long:
//! - `kernel-first`: a kernel CUBIC flow, joined after `--join` seconds by a corelane flow;
//! - `corelane-first`: the same the other way round;
//! - `corelane-4`: four corelane flows started together;
//! - `kernel-2`: two kernel flows, the kernel's own fairness for reference.
//!
//! For each it reports every flow's goodput over the time all flows ran (the first second
//! after the last joined left out) and Jain's fairness index, (sum x)^2 / (n sum x^2).
//!
//! ```text
//! cargo run --release -p corelane-bench --bin fairness -- --rate 200 --seconds 20
//! ```

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Parser;
use corelane_bench::markdown_table;
use corelane_testnet::LossyPath;
use tokio::io::AsyncWriteExt;

const KERNEL: &str = "10.86.0.1";
const CORELANE: &str = "10.86.0.3";
const PORT: u16 = 5020;

#[derive(Parser, Debug)]
#[command(about = "corelane's CUBIC against the kernel's on a shared bottleneck")]
struct Args {
    /// The bottleneck toward the client, Mbit/s.
    #[arg(long, default_value_t = 200)]
    rate: u32,
    /// Seconds each scenario lasts.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Seconds before the second flow joins.
    #[arg(long, default_value_t = 2)]
    join: u64,
    /// Scenarios: kernel-first, corelane-first, corelane-4, kernel-2.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kernel-first,corelane-first,corelane-4,kernel-2"
    )]
    scenarios: Vec<String>,
    /// Where fairness.md goes.
    #[arg(long, default_value = "target/fairness")]
    out: PathBuf,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("fairness: {e}");
        std::process::exit(1);
    }
}

/// Sends until the peer goes away.
fn kernel_server(net: &LossyPath) -> Result<(), String> {
    let l = corelane_bench::kernel_listener(net.server_ns(), KERNEL, PORT, "cubic")?;
    net.server_ns()
        .spawn(move || {
            while let Ok((mut s, _)) = l.accept() {
                std::thread::spawn(move || {
                    let buf = vec![0x5au8; 64 * 1024];
                    while s.write_all(&buf).is_ok() {}
                });
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn corelane_server(net: &LossyPath) -> Result<corelane_bench::CorelaneServer, String> {
    corelane_bench::corelane_server(
        net.server_ns(),
        net.server_if(),
        &format!("{CORELANE}/24"),
        PORT,
        |b| b,
        |mut s| async move {
            let buf = vec![0x5au8; 64 * 1024];
            while s.write_all(&buf).await.is_ok() {}
        },
    )
}

/// A receiving flow: its byte counter, and a flag that ends it.
struct Flow {
    label: String,
    bytes: Arc<AtomicU64>,
}

fn start_flow(
    net: &LossyPath,
    label: &str,
    ip: &'static str,
    done: Arc<AtomicBool>,
) -> Result<Flow, String> {
    let bytes = Arc::new(AtomicU64::new(0));
    let b = bytes.clone();
    let (tx, rx) = mpsc::channel();
    let addr: std::net::SocketAddr = format!("{ip}:{PORT}").parse().map_err(|_| "address")?;
    net.client_ns()
        .spawn(move || {
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5));
            let mut s = match s {
                Ok(s) => {
                    let _ = tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = tx.send(Err(format!("connect {ip}: {e}")));
                    return;
                }
            };
            let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
            let mut buf = vec![0u8; 256 * 1024];
            while !done.load(Ordering::Relaxed) {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        b.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => break,
                }
            }
        })
        .map_err(|e| e.to_string())?;
    rx.recv_timeout(Duration::from_secs(10))
        .map_err(|_| format!("{label}: no connection"))??;
    Ok(Flow {
        label: label.into(),
        bytes,
    })
}

fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let q: f64 = x.iter().map(|v| v * v).sum();
    if q == 0.0 {
        0.0
    } else {
        s * s / (x.len() as f64 * q)
    }
}

/// Runs one scenario: flows as (label, address, seconds after the start it joins).
fn scenario(
    net: &LossyPath,
    args: &Args,
    flows: &[(&str, &'static str, u64)],
) -> Result<(Vec<(String, f64)>, f64), String> {
    let done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut running: Vec<Flow> = Vec::new();
    let last_join = flows.iter().map(|f| f.2).max().unwrap_or(0);
    let measure_from = Duration::from_secs(last_join + 1);
    let total = Duration::from_secs(args.seconds);
    let mut at_from: Option<Vec<u64>> = None;
    let mut pending: Vec<_> = flows.to_vec();
    while start.elapsed() < total {
        let now = start.elapsed();
        let (due, later): (Vec<_>, Vec<_>) = pending
            .into_iter()
            .partition(|f| Duration::from_secs(f.2) <= now);
        pending = later;
        for (label, ip, _) in due {
            running.push(start_flow(net, label, ip, done.clone())?);
        }
        if at_from.is_none() && now >= measure_from {
            at_from = Some(
                running
                    .iter()
                    .map(|f| f.bytes.load(Ordering::Relaxed))
                    .collect(),
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let secs = (total - measure_from).as_secs_f64();
    let from = at_from.unwrap_or_else(|| vec![0; running.len()]);
    let rates: Vec<(String, f64)> = running
        .iter()
        .zip(from)
        .map(|(f, b0)| {
            let b = f.bytes.load(Ordering::Relaxed) - b0;
            (f.label.clone(), b as f64 * 8.0 / secs / 1e6)
        })
        .collect();
    done.store(true, Ordering::Relaxed);
    // Let the readers see the flag and close.
    std::thread::sleep(Duration::from_millis(500));
    let x: Vec<f64> = rates.iter().map(|r| r.1).collect();
    Ok((rates, jain(&x)))
}

fn run(args: &Args) -> Result<(), String> {
    if !corelane_testnet::is_root() {
        return Err("needs root (network namespaces, XDP)".into());
    }
    let net = LossyPath::builder()
        .server_addr(&format!("{KERNEL}/24"))
        .client_addr("10.86.0.2/24")
        .build()
        .map_err(|e| e.to_string())?;
    net.set_rate(None, Some(args.rate))
        .map_err(|e| e.to_string())?;
    kernel_server(&net)?;
    let stop = corelane_server(&net)?;
    let j = args.join;
    let mut rows = Vec::new();
    for name in &args.scenarios {
        let flows: Vec<(&str, &'static str, u64)> = match name.as_str() {
            "kernel-first" => vec![("kernel", KERNEL, 0), ("corelane", CORELANE, j)],
            "corelane-first" => vec![("corelane", CORELANE, 0), ("kernel", KERNEL, j)],
            "corelane-4" => (0..4).map(|_| ("corelane", CORELANE, 0)).collect(),
            "kernel-2" => vec![("kernel", KERNEL, 0), ("kernel", KERNEL, 0)],
            other => {
                return Err(format!(
                    "unknown scenario {other:?} (kernel-first, corelane-first, corelane-4, kernel-2)"
                ));
            }
        };
        let (rates, index) = scenario(&net, args, &flows)?;
        let shown = rates
            .iter()
            .map(|(l, r)| format!("{l} {r:.1}"))
            .collect::<Vec<_>>()
            .join(", ");
        let sum: f64 = rates.iter().map(|r| r.1).sum();
        println!("{name:<15} {shown} Mbit/s (sum {sum:.1}), Jain {index:.3}");
        rows.push(vec![
            name.clone(),
            shown,
            format!("{sum:.1}"),
            format!("{index:.3}"),
        ]);
    }
    stop.stop();
    let table = markdown_table(
        &["scenario", "flows, Mbit/s", "sum Mbit/s", "Jain's index"],
        &rows,
    );
    let md = format!(
        "# Sharing a {} Mbit/s bottleneck\n\nThe lossy path's router with a token bucket \
         toward the client (about 5 ms of queue), no random loss. Each scenario {} s; the \
         second flow of the two-flow scenarios joins after {} s; goodput is measured from a \
         second after the last flow joined. The kernel runs CUBIC, corelane CUBIC.\n\n{table}\n\n\
         Reproduce: `cargo run --release -p corelane-bench --bin fairness -- --rate {} --seconds {}`\n",
        args.rate, args.seconds, args.join, args.rate, args.seconds
    );
    println!("\n{md}");
    std::fs::create_dir_all(&args.out).map_err(|e| e.to_string())?;
    std::fs::write(args.out.join("fairness.md"), &md).map_err(|e| e.to_string())?;
    println!("wrote {}/fairness.md", args.out.display());
    Ok(())
}
