//! An iperf-like bulk source and sink over corelane, printing Gbit/s.
//!
//! Server side (on every core): `--mode sink` reads and discards what each connection sends;
//! `--mode source` sends to each connection until it closes or `--seconds` pass. Client side:
//! `--connect ADDR:PORT` opens `--streams` connections from core 0 to a (kernel) server and sends
//! (source) or receives (sink) for `--seconds`.
//!
//! ```text
//! ip netns exec NS target/release/examples/bulk --iface IF --addr 10.77.0.3/24 --mode sink
//! ```

#[path = "../common/mod.rs"]
mod common;

use std::cell::Cell;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::{Duration, Instant};

use clap::Parser;
use corelane::net::{TcpListener, TcpStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Parser, Debug)]
#[command(about = "Bulk TCP source and sink over corelane, printing Gbit/s")]
struct Args {
    #[command(flatten)]
    common: common::Common,
    /// sink: receive and discard; source: send.
    #[arg(long, default_value = "sink")]
    mode: String,
    /// Connect to this server instead of listening (client mode, from core 0).
    #[arg(long)]
    connect: Option<SocketAddr>,
    /// Connections to open in client mode.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// How long to send (source) or, in client mode, to run.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
}

fn main() -> ExitCode {
    common::exit("bulk", run(Args::parse()))
}

fn gbit(bytes: u64, secs: f64) -> f64 {
    bytes as f64 * 8.0 / secs.max(1e-9) / 1e9
}

async fn transfer(mut s: TcpStream, source: bool, seconds: u64) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 256 * 1024];
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut moved = 0u64;
    if source {
        while Instant::now() < until {
            let n = s.write(&buf).await?;
            moved += n as u64;
        }
        s.shutdown().await?;
        // Wait for the peer to close so everything sent is acknowledged.
        while s.read(&mut buf).await? > 0 {}
    } else {
        loop {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            moved += n as u64;
        }
    }
    Ok(moved)
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let source = match args.mode.as_str() {
        "source" => true,
        "sink" => false,
        m => return Err(format!("--mode {m}: use sink or source").into()),
    };
    let c = &args.common;
    let port = c.port_or(5001);
    common::init_logging();
    let rt = c.builder()?.build()?;
    println!("{}", rt.describe());
    common::handle_signals("bulk", &rt)?;
    let cores = rt.cores();
    let stop = rt.stop_handle();
    let ready = std::sync::Arc::new(common::Ready::new(cores));
    let (seconds, streams, connect) = (args.seconds, args.streams, args.connect);
    let mode = args.mode;
    let report = rt.run(|core| {
        let (stop, ready, mode) = (stop.clone(), ready.clone(), mode.clone());
        async move {
            let listener = if connect.is_none() {
                Some(TcpListener::bind(port).await)
            } else {
                None
            };
            ready.core_ready(|| {
                match connect {
                    Some(to) => println!("bulk: {mode} {streams} stream(s) to {to} for {seconds} s"),
                    None => println!("bulk: serving ({mode}) on port {port} on {cores} core(s), AF_XDP sockets in {} mode; Ctrl-C stops", core.bind_mode),
                }
            });
            if let Some(to) = connect {
                if core.index != 0 {
                    return;
                }
                let t0 = Instant::now();
                let total = Rc::new(Cell::new(0u64));
                let mut tasks = Vec::new();
                for _ in 0..streams {
                    let total = total.clone();
                    tasks.push(tokio::task::spawn_local(async move {
                        let s = TcpStream::connect(to).await?;
                        let n = transfer(s, source, seconds).await?;
                        total.set(total.get() + n);
                        Ok::<_, std::io::Error>(())
                    }));
                }
                for t in tasks {
                    if let Ok(Err(e)) = t.await {
                        eprintln!("bulk: stream: {e}");
                    }
                }
                let secs = t0.elapsed().as_secs_f64();
                println!(
                    "bulk: {} bytes in {secs:.2} s = {:.2} Gbit/s",
                    total.get(),
                    gbit(total.get(), secs)
                );
                stop.stop();
                return;
            }
            let listener = match listener.expect("server mode") {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("bulk: error: core {}: port {port}: {e}", core.index);
                    return;
                }
            };
            while let Ok((s, peer)) = listener.accept().await {
                let idx = core.index;
                tokio::task::spawn_local(async move {
                    let t0 = Instant::now();
                    match transfer(s, source, seconds).await {
                        Ok(n) => {
                            let secs = t0.elapsed().as_secs_f64();
                            println!(
                                "bulk: core {idx}: {peer}: {n} bytes in {secs:.2} s = {:.2} Gbit/s",
                                gbit(n, secs)
                            );
                        }
                        Err(e) => eprintln!("bulk: core {idx}: {peer}: {e}"),
                    }
                });
            }
        }
    })?;
    common::print_report("bulk", &report)?;
    Ok(())
}
