//! What packet capture costs a running server: a one-core corelane echo server under kernel
//! clients, measured with no capture, with a capture whose filter matches nothing (the filter's
//! cost alone), and with a capture of every frame whole (snap 65535, written to a file), the
//! modes alternating in each repetition. Two loads: 16 connections doing 64-byte
//! request/response (the most frames per byte) and one connection echoing a bulk stream. Reports
//! the median rate of each mode, its ratio to no capture, the frames captured and the copies a
//! full ring dropped (the frames themselves are never dropped).
//!
//! ```text
//! cargo run --release -p corelane-bench --bin capture -- --repeat 3 --seconds 3
//! ```
//!
//! Needs root (network namespaces, XDP, AF_XDP).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use corelane_bench::{markdown_table, median, pin};
use corelane_testnet::VethPair;

const SERVER: &str = "10.87.0.1";
const CLIENT: &str = "10.87.0.2";
const PORT: u16 = 7;

#[derive(Parser, Debug)]
#[command(about = "What packet capture costs a corelane server")]
struct Args {
    /// Repetitions (the modes alternate within each).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Where capture.md goes.
    #[arg(long, default_value = "target/capture")]
    out: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Off,
    NoMatch,
    All,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Off => "no capture",
            Mode::NoMatch => "capture, filter matching nothing",
            Mode::All => "capture of every frame, whole",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Load {
    Rr,
    Bulk,
}

/// One measurement: the rate (round trips or bytes echoed per second), frames captured,
/// copies dropped.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    rate: f64,
    captured: u64,
    dropped: u64,
}

fn load(net: &VethPair, load: Load, secs: f64) -> Result<f64, String> {
    let addr: SocketAddr = format!("{SERVER}:{PORT}").parse().map_err(|_| "addr")?;
    let done = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let conns = if load == Load::Rr { 16 } else { 1 };
    let mut threads = Vec::new();
    for _ in 0..conns {
        let (done, count) = (done.clone(), count.clone());
        let t = net
            .client_ns()
            .spawn(move || -> std::io::Result<()> {
                pin(1);
                let mut s = TcpStream::connect(addr)?;
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                match load {
                    Load::Rr => {
                        let mut buf = [0u8; 64];
                        while !done.load(Ordering::Relaxed) {
                            s.write_all(&buf)?;
                            s.read_exact(&mut buf)?;
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Load::Bulk => {
                        let mut r = s.try_clone()?;
                        let c = count.clone();
                        let reader = std::thread::spawn(move || {
                            let mut buf = vec![0u8; 1 << 16];
                            while let Ok(n) = r.read(&mut buf) {
                                if n == 0 {
                                    break;
                                }
                                c.fetch_add(n as u64, Ordering::Relaxed);
                            }
                        });
                        let chunk = vec![7u8; 1 << 16];
                        while !done.load(Ordering::Relaxed) {
                            s.write_all(&chunk)?;
                        }
                        s.shutdown(std::net::Shutdown::Write)?;
                        let _ = reader.join();
                    }
                }
                Ok(())
            })
            .map_err(|e| e.to_string())?;
        threads.push(t);
    }
    std::thread::sleep(Duration::from_millis(300));
    let (c0, t0) = (count.load(Ordering::Relaxed), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(secs));
    let (c1, t1) = (count.load(Ordering::Relaxed), Instant::now());
    done.store(true, Ordering::Relaxed);
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("client: {e}")),
            Err(_) => return Err("client thread".into()),
        }
    }
    Ok((c1 - c0) as f64 / (t1 - t0).as_secs_f64())
}

fn measure(
    net: &VethPair,
    stats: &std::path::Path,
    mode: Mode,
    what: Load,
    secs: f64,
) -> Result<Run, String> {
    if mode == Mode::Off {
        return Ok(Run {
            rate: load(net, what, secs)?,
            ..Run::default()
        });
    }
    let filter = corelane_stat::Filter {
        port: (mode == Mode::NoMatch).then_some(1),
        ..corelane_stat::Filter::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let path = stats.to_path_buf();
    let file = std::env::temp_dir().join(format!(
        "corelane-capture-bench-{}.pcapng",
        std::process::id()
    ));
    let out = file.clone();
    let (s2, started) = (stop.clone(), Arc::new(AtomicBool::new(false)));
    let st = started.clone();
    let reader = std::thread::spawn(move || -> Result<corelane_stat::Recorded, String> {
        let stats = corelane_stat::Stats::open(&path).map_err(|e| e.to_string())?;
        let w = std::io::BufWriter::new(std::fs::File::create(&out).map_err(|e| e.to_string())?);
        let cap = stats.capture(filter, 65535).map_err(|e| e.to_string())?;
        st.store(true, Ordering::Relaxed);
        corelane_stat::record(cap, None, None, &s2, w).map_err(|e| e.to_string())
    });
    while !started.load(Ordering::Relaxed) && !reader.is_finished() {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    let rate = load(net, what, secs);
    stop.store(true, Ordering::Relaxed);
    let done = reader.join().map_err(|_| "capture thread")??;
    let _ = std::fs::remove_file(&file);
    Ok(Run {
        rate: rate?,
        captured: done.frames,
        dropped: done.dropped,
    })
}

fn main() -> Result<(), String> {
    let args = Args::parse();
    let net = VethPair::builder()
        .server_addr("10.87.0.9/24")
        .client_addr(&format!("{CLIENT}/24"))
        .build()
        .map_err(|e| e.to_string())?;
    let server = corelane_bench::corelane_echo(
        net.server_ns(),
        net.server_if(),
        &format!("{SERVER}/24"),
        PORT,
        |b| b,
    )?;
    let stats = corelane_stat::find(&corelane_stat::run_dir(), None)
        .into_iter()
        .find(|p| p.parent().and_then(|d| d.file_name()) == Some(net.server_if().as_ref()))
        .ok_or("the server publishes no stats file")?;
    let modes = [Mode::Off, Mode::NoMatch, Mode::All];
    let mut rows = Vec::new();
    for what in [Load::Rr, Load::Bulk] {
        let mut runs: Vec<Vec<Run>> = vec![Vec::new(); modes.len()];
        for _ in 0..args.repeat {
            for (i, &m) in modes.iter().enumerate() {
                let r = measure(&net, &stats, m, what, args.seconds)?;
                eprintln!(
                    "{what:?} {:<36} {:>12.0}/s captured {} dropped {}",
                    m.name(),
                    r.rate,
                    r.captured,
                    r.dropped
                );
                runs[i].push(r);
            }
        }
        let base = median(&runs[0].iter().map(|r| r.rate).collect::<Vec<_>>());
        for (i, &m) in modes.iter().enumerate() {
            let rate = median(&runs[i].iter().map(|r| r.rate).collect::<Vec<_>>());
            let (unit, shown) = match what {
                Load::Rr => ("round trips/s", format!("{rate:.0}")),
                Load::Bulk => ("Mbit/s echoed", format!("{:.0}", rate * 8.0 / 1e6)),
            };
            let captured: u64 = runs[i].iter().map(|r| r.captured).sum();
            let dropped: u64 = runs[i].iter().map(|r| r.dropped).sum();
            rows.push(vec![
                match what {
                    Load::Rr => "64 B request/response, 16 conns".to_string(),
                    Load::Bulk => "bulk echo, 1 conn".to_string(),
                },
                m.name().to_string(),
                format!("{shown} {unit}"),
                format!("{:.2}", rate / base),
                captured.to_string(),
                dropped.to_string(),
            ]);
        }
    }
    server.stop();
    let table = markdown_table(
        &[
            "load",
            "mode",
            "rate (median)",
            "/ no capture",
            "frames captured",
            "copies dropped (ring full)",
        ],
        &rows,
    );
    let md = format!(
        "# What packet capture costs\n\nA one-core corelane echo server on a veth pair, kernel clients on the other CPU; the \
         capture reader (`corelane_stat::record`, as `corelane-stat capture` runs it) in the same process, writing pcapng \
         to a file. Median of {} run(s) of {} s, the modes alternating.\n\n{table}\n\nReproduce: `cargo run --release -p \
         corelane-bench --bin capture -- --repeat {} --seconds {}`\n",
        args.repeat, args.seconds, args.repeat, args.seconds
    );
    print!("{md}");
    std::fs::create_dir_all(&args.out).map_err(|e| e.to_string())?;
    std::fs::write(args.out.join("capture.md"), md).map_err(|e| e.to_string())?;
    Ok(())
}
