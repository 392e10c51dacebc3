//! Seed 001 re-run on corelane: on a long path, a receiver's window caps the throughput at
//! window / RTT (the bandwidth-delay product read the other way), whatever the link can do.
//! A kernel client sends bulk through a router that holds every frame toward the server 5 ms;
//! the receiver is corelane with its receive buffer capped at each size in turn, its window
//! either grown toward the measured bandwidth-delay product (autotune, the default: it starts
//! at `rx_initial`) or fixed at the cap from the start, and the kernel with SO_RCVBUF at the
//! same size (fixed) or left to autotune. Each row shows the formula's ceiling next to what
//! each receiver got.
//!
//! ```text
//! cargo run --release -p corelane-bench --bin window -- --seconds 4
//! ```
//!
//! Needs root (network namespaces, XDP, AF_XDP).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Parser;
use corelane_bench::{markdown_table, median, pin};
use corelane_testnet::{Loss, LossyPath};
use tokio::io::AsyncReadExt;

const KERNEL: &str = "10.88.0.1";
const CORELANE: &str = "10.88.0.3";
const PORT: u16 = 5050;

#[derive(Parser, Debug)]
#[command(about = "Throughput against the receive window on a 5 ms path (seed 001)")]
struct Args {
    /// Receive buffer caps, KiB.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "64,128,256,512,1024,2048,4096"
    )]
    caps: Vec<usize>,
    /// Seconds each transfer runs (the first second is not counted: the window grows).
    #[arg(long, default_value_t = 4.0)]
    seconds: f64,
    /// Repetitions of each cell.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// The delay toward the server, ms.
    #[arg(long, default_value_t = 5)]
    delay_ms: u64,
    /// Where window.md goes.
    #[arg(long, default_value = "target/window")]
    out: PathBuf,
}

/// Sends for `secs` to `to` from the client namespace; returns the bytes the receiver counted
/// after the first second, over the time after it, in Mbit/s (the receiver's count comes back
/// on `got`).
fn send(
    net: &LossyPath,
    to: SocketAddr,
    secs: f64,
    got: &mpsc::Receiver<(u64, f64)>,
) -> Result<f64, String> {
    net.client_ns()
        .run(move || -> std::io::Result<()> {
            pin(1);
            let mut s = TcpStream::connect(to)?;
            let chunk = vec![0x42u8; 256 << 10];
            let end = Instant::now() + Duration::from_secs_f64(secs);
            while Instant::now() < end {
                s.write_all(&chunk)?;
            }
            s.shutdown(std::net::Shutdown::Write)?;
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            Ok(())
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("client: {e}"))?;
    let (bytes, secs) = got
        .recv_timeout(Duration::from_secs(20))
        .map_err(|_| "the receiver reported nothing")?;
    Ok(bytes as f64 * 8.0 / secs / 1e6)
}

/// Counts what arrives after the first second; reports (bytes, seconds) at the end.
fn count_after_warmup(mut read: impl FnMut(&mut [u8]) -> std::io::Result<usize>) -> (u64, f64) {
    let start = Instant::now();
    let mut buf = vec![0u8; 256 << 10];
    let (mut bytes, mut from) = (0u64, None);
    while let Ok(n) = read(&mut buf) {
        if n == 0 {
            break;
        }
        if start.elapsed() >= Duration::from_secs(1) {
            from.get_or_insert_with(Instant::now);
            bytes += n as u64;
        }
    }
    (
        bytes,
        from.map_or(1.0, |t| t.elapsed().as_secs_f64().max(1e-3)),
    )
}

fn kernel_receiver(
    net: &LossyPath,
    rcvbuf: Option<usize>,
) -> Result<mpsc::Receiver<(u64, f64)>, String> {
    let l = corelane_bench::kernel_listener(net.server_ns(), KERNEL, PORT, "default")?;
    if let Some(b) = rcvbuf {
        corelane_bench::sys::set_rcvbuf(&l, b).map_err(|e| e.to_string())?;
    }
    let (tx, rx) = mpsc::channel();
    net.server_ns()
        .spawn(move || {
            pin(0);
            if let Ok((mut s, _)) = l.accept() {
                let _ = tx.send(count_after_warmup(|b| s.read(b)));
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(rx)
}

fn main() -> Result<(), String> {
    let args = Args::parse();
    let net = LossyPath::builder()
        .server_addr(&format!("{KERNEL}/24"))
        .client_addr("10.88.0.2/24")
        .build()
        .map_err(|e| e.to_string())?;
    net.set_reorder(Loss::ALL, Loss::NONE, Duration::from_millis(args.delay_ms))
        .map_err(|e| e.to_string())?;
    let rtt_ms = args.delay_ms as f64 + 0.1;
    let kernel_to: SocketAddr = format!("{KERNEL}:{PORT}").parse().map_err(|_| "addr")?;
    let corelane_to: SocketAddr = format!("{CORELANE}:{PORT}").parse().map_err(|_| "addr")?;
    let mut rows = Vec::new();
    let mut kernel_auto = Vec::new();
    for _ in 0..args.repeat {
        let rx = kernel_receiver(&net, None)?;
        kernel_auto.push(send(&net, kernel_to, args.seconds, &rx)?);
    }
    let kernel_auto = median(&kernel_auto);
    for &cap_kib in &args.caps {
        let cap = cap_kib << 10;
        let ceiling = cap as f64 * 8.0 / (rtt_ms / 1000.0) / 1e6;
        let mut cells = Vec::new();
        for fixed in [false, true] {
            let mut got = Vec::new();
            for _ in 0..args.repeat {
                let (tx, rx) = mpsc::channel();
                let server = corelane_bench::corelane_server(
                    net.server_ns(),
                    net.server_if(),
                    &format!("{CORELANE}/24"),
                    PORT,
                    move |b| {
                        let mut st = corelane::StackConfig {
                            tcp_rx_buffer: cap,
                            ..Default::default()
                        };
                        if fixed {
                            st.tcp.rx_initial = cap;
                        }
                        b.stack(st)
                    },
                    move |mut s| {
                        let tx = tx.clone();
                        async move {
                            let start = Instant::now();
                            let mut buf = vec![0u8; 256 << 10];
                            let (mut bytes, mut from) = (0u64, None);
                            while let Ok(n) = s.read(&mut buf).await {
                                if n == 0 {
                                    break;
                                }
                                if start.elapsed() >= Duration::from_secs(1) {
                                    from.get_or_insert_with(Instant::now);
                                    bytes += n as u64;
                                }
                            }
                            let secs =
                                from.map_or(1.0, |t: Instant| t.elapsed().as_secs_f64().max(1e-3));
                            let _ = tx.send((bytes, secs));
                        }
                    },
                )?;
                let r = send(&net, corelane_to, args.seconds, &rx);
                server.stop();
                got.push(r?);
            }
            cells.push(median(&got));
        }
        let mut k = Vec::new();
        for _ in 0..args.repeat {
            let rx = kernel_receiver(&net, Some(cap))?;
            k.push(send(&net, kernel_to, args.seconds, &rx)?);
        }
        let kernel_fixed = median(&k);
        eprintln!(
            "cap {cap_kib} KiB: ceiling {ceiling:.0}, corelane autotune {:.0}, fixed {:.0}, kernel SO_RCVBUF {kernel_fixed:.0} Mbit/s",
            cells[0], cells[1]
        );
        rows.push(vec![
            format!("{cap_kib} KiB"),
            format!("{ceiling:.0}"),
            format!("{:.0} ({:.2})", cells[0], cells[0] / ceiling),
            format!("{:.0} ({:.2})", cells[1], cells[1] / ceiling),
            format!("{kernel_fixed:.0} ({:.2})", kernel_fixed / ceiling),
        ]);
    }
    let table = markdown_table(
        &[
            "receive buffer cap",
            "window / RTT, Mbit/s",
            "corelane, window grown (autotune)",
            "corelane, window fixed at the cap",
            "kernel, SO_RCVBUF = cap",
        ],
        &rows,
    );
    let md = format!(
        "# Throughput against the receive window (seed 001)\n\nA kernel client sends bulk to the receiver through a router holding every frame toward \
         the server {} ms (round trip about {rtt_ms:.1} ms, no loss, no rate limit). Goodput after the first second of {} s, \
         Mbit/s (its fraction of the window / RTT ceiling), median of {}. The kernel receiver left to autotune (tcp_rmem's \
         maximum) got {kernel_auto:.0} Mbit/s in the same run.\n\n{table}\n\nReproduce: `cargo run --release -p corelane-bench --bin window -- --seconds {} --repeat {}`\n",
        args.delay_ms, args.seconds, args.repeat, args.seconds, args.repeat
    );
    print!("{md}");
    std::fs::create_dir_all(&args.out).map_err(|e| e.to_string())?;
    std::fs::write(args.out.join("window.md"), md).map_err(|e| e.to_string())?;
    Ok(())
}
