//! corelane's TCP against the kernel's through a lossy router, in the same run.
//!
//! Client namespace - router namespace (a bridge that drops a share of the frames each way and
//! can duplicate some) - server namespace, where a kernel server and a corelane server each
//! send the same `--mib` MiB to a kernel client that hashes what arrives. For each scenario
//! (loss in the data direction, loss on the ACK path, loss with duplication, reordering) and
//! each setup it
//! reports goodput, the longest stall between two reads that brought data, the sender's
//! retransmitted segments against the data frames the router dropped, and whether the SHA-256
//! of what arrived matches.
//!
//! With `--delay-us` the router's holding stage delays every ACK, for the same scenarios on a
//! longer path.
//!
//! ```text
//! cargo run --release -p corelane-bench --bin lossy -- --mib 64 --loss 0,0.1,1,2,5,10
//! cargo run --release -p corelane-bench --bin lossy -- --loss 0,0.1,1 --delay-us 5000
//! ```

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Parser;
use corelane_bench::{markdown_table, pin};
use corelane_testnet::{Loss, LossyPath};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KERNEL: &str = "10.81.0.1";
const CORELANE: &str = "10.81.0.3";
const PORT: u16 = 5010;
const PATTERN: usize = 1 << 20;

#[derive(Parser, Debug)]
#[command(about = "corelane's TCP against the kernel's through a lossy router")]
struct Args {
    /// MiB sent per transfer.
    #[arg(long, default_value_t = 64)]
    mib: usize,
    /// Loss rates in the data direction, percent.
    #[arg(long, value_delimiter = ',', default_value = "0,0.1,1,2,5,10")]
    loss: Vec<f64>,
    /// Loss on the ACK path for the ACK-loss scenario, percent (0: no such scenario).
    #[arg(long, default_value_t = 5.0)]
    ack_loss: f64,
    /// Duplication in the data direction for the duplication scenario (with 1% loss), percent
    /// (0: no such scenario).
    #[arg(long, default_value_t = 2.0)]
    dup: f64,
    /// Share of data frames held back by the router for the reordering scenario, percent (0:
    /// no such scenario).
    #[arg(long, default_value_t = 2.0)]
    reorder: f64,
    /// How long the router holds a reordered frame, microseconds (at 1 Gbit/s, 100 us is about
    /// 8 full-size frames).
    #[arg(long, default_value_t = 200)]
    reorder_delay_us: u64,
    /// Holds every frame toward the server (the ACKs) this long in every scenario,
    /// microseconds: a longer path, whose bandwidth-delay product the buffers must follow (0:
    /// none). The router has one holding stage, so with it the reordering scenario is left out.
    #[arg(long, default_value_t = 0)]
    delay_us: u64,
    /// Share of the ECN-capable data frames the router marks Congestion Experienced instead of
    /// dropping, for the ECN scenario (the client asks for ECN in it), percent (0: no such
    /// scenario).
    #[arg(long, default_value_t = 2.0)]
    mark: f64,
    /// A bottleneck toward the client, Mbit/s (none by default).
    #[arg(long)]
    rate: Option<u32>,
    /// Repetitions of each scenario and setup (the median goodput is reported).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Seconds a transfer may take before it counts as failed.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// The kernel server's congestion control (TCP_CONGESTION on its listener): corelane runs
    /// CUBIC, so CUBIC is the like-for-like baseline; `default` keeps the machine's own.
    #[arg(long, default_value = "cubic")]
    kernel_cc: String,
    /// Setups: kernel, corelane.
    #[arg(long, value_delimiter = ',', default_value = "kernel,corelane")]
    setups: Vec<String>,
    /// Where lossy.md and lossy.json go.
    #[arg(long, default_value = "target/lossy")]
    out: PathBuf,
}

/// The bytes every server sends: a repeating 1 MiB pattern.
fn pattern() -> Vec<u8> {
    (0..PATTERN)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 9)) as u8)
        .collect()
}

fn expected_hash(total: usize, pat: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut left = total;
    while left > 0 {
        let n = left.min(pat.len());
        h.update(&pat[..n]);
        left -= n;
    }
    h.finalize().into()
}

/// What the sender reports after a transfer.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
struct Sent {
    retrans_segs: u64,
    rto: u64,
    /// The sender's smoothed RTT at the end, microseconds.
    srtt_us: u64,
    /// Loss recoveries (window reductions for a loss) the sender entered; corelane only.
    recoveries: u64,
}

/// One transfer's figures.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct Run {
    setup: String,
    data_loss: f64,
    ack_loss: f64,
    dup: f64,
    reorder: f64,
    mark: f64,
    ok: bool,
    error: Option<String>,
    mbit: f64,
    seconds: f64,
    max_stall_ms: f64,
    retrans_segs: u64,
    rto: u64,
    srtt_us: u64,
    recoveries: u64,
    dropped_data_frames: u64,
    dropped_ack_frames: u64,
}

fn kernel_server(
    net: &LossyPath,
    total: usize,
    cc: &str,
    tx: mpsc::Sender<Sent>,
) -> Result<(), String> {
    let l = corelane_bench::kernel_listener(net.server_ns(), KERNEL, PORT, cc)?;
    net.server_ns()
        .spawn(move || {
            pin(0);
            let pat = pattern();
            while let Ok((mut s, _)) = l.accept() {
                let mut left = total;
                while left > 0 {
                    let n = left.min(pat.len());
                    if s.write_all(&pat[..n]).is_err() {
                        break;
                    }
                    left -= n;
                }
                let _ = s.shutdown(Shutdown::Write);
                let _ = s.read(&mut [0u8; 64]);
                let _ = tx.send(kernel_retrans(&s));
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// The kernel's retransmission counters of `s` (TCP_INFO).
fn kernel_retrans(s: &TcpStream) -> Sent {
    corelane_bench::sys::tcp_retrans(s).map_or(Sent::default(), |(retrans_segs, srtt_us)| Sent {
        retrans_segs,
        rto: 0,
        srtt_us,
        recoveries: 0,
    })
}

fn corelane_server(
    net: &LossyPath,
    total: usize,
    tx: mpsc::Sender<Sent>,
) -> Result<corelane_bench::CorelaneServer, String> {
    let pat = std::sync::Arc::new(pattern());
    corelane_bench::corelane_server(
        net.server_ns(),
        net.server_if(),
        &format!("{CORELANE}/24"),
        PORT,
        |b| b,
        move |mut s| {
            let (pat, tx) = (pat.clone(), tx.clone());
            async move {
                let mut left = total;
                while left > 0 {
                    let n = left.min(pat.len());
                    if s.write_all(&pat[..n]).await.is_err() {
                        break;
                    }
                    left -= n;
                }
                let _ = s.shutdown().await;
                let _ = s.read(&mut [0u8; 64]).await;
                let sent = s.info().map_or(Sent::default(), |i| Sent {
                    retrans_segs: i.stats.retrans_segs,
                    rto: i.stats.rto_expiries,
                    srtt_us: i.srtt.map_or(0, |d| d.as_micros() as u64),
                    recoveries: i.stats.fast_recoveries,
                });
                let _ = tx.send(sent);
            }
        },
    )
}

/// Receives one transfer from `addr`: bytes, seconds, longest stall, hash.
fn receive(addr: SocketAddr, timeout: Duration) -> Result<(usize, f64, f64, [u8; 32]), String> {
    pin(1);
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    // Goodput counts from the end of the handshake: a SYN the path dropped costs both stacks
    // the same second.
    let start = Instant::now();
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let (mut total, mut last, mut stall) = (0usize, Instant::now(), Duration::ZERO);
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                h.update(&buf[..n]);
                total += n;
                stall = stall.max(last.elapsed());
                last = Instant::now();
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if start.elapsed() > timeout {
                    return Err(format!("{total} bytes after {timeout:?}: gave up"));
                }
            }
            Err(e) => return Err(format!("after {total} bytes: {e}")),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok((total, secs, stall.as_secs_f64() * 1e3, h.finalize().into()))
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("lossy: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    if !corelane_testnet::is_root() {
        return Err("needs root (network namespaces, XDP)".into());
    }
    let total = args.mib << 20;
    let want = expected_hash(total, &pattern());
    let net = LossyPath::builder()
        .server_addr(&format!("{KERNEL}/24"))
        .client_addr("10.81.0.2/24")
        .build()
        .map_err(|e| e.to_string())?;
    net.set_rate(None, args.rate).map_err(|e| e.to_string())?;
    let (ktx, krx) = mpsc::channel();
    let (ctx, crx) = mpsc::channel();
    kernel_server(&net, total, &args.kernel_cc, ktx)?;
    let stop = corelane_server(&net, total, ctx)?;
    let mut scenarios: Vec<Scenario> = args
        .loss
        .iter()
        .map(|&p| Scenario {
            data: p,
            ..Scenario::default()
        })
        .collect();
    if args.ack_loss > 0.0 {
        scenarios.push(Scenario {
            ack: args.ack_loss,
            ..Scenario::default()
        });
    }
    if args.dup > 0.0 {
        scenarios.push(Scenario {
            data: 1.0,
            dup: args.dup,
            ..Scenario::default()
        });
    }
    if args.reorder > 0.0 && args.delay_us == 0 {
        scenarios.push(Scenario {
            reorder: args.reorder,
            ..Scenario::default()
        });
    }
    if args.mark > 0.0 {
        scenarios.push(Scenario {
            mark: args.mark,
            ..Scenario::default()
        });
    }
    let delay = Duration::from_micros(args.reorder_delay_us);
    let mut runs = Vec::new();
    for sc in &scenarios {
        let Scenario {
            data,
            ack,
            dup,
            reorder,
            mark,
        } = *sc;
        // The kernel client asks for ECN where the router marks (servers accept by default).
        let ecn = if mark > 0.0 { "1" } else { "2" };
        net.client_ns()
            .exec("sysctl", &["-qw", &format!("net.ipv4.tcp_ecn={ecn}")])
            .map_err(|e| e.to_string())?;
        for rep in 0..args.repeat {
            for setup in &args.setups {
                let (ip, rx) = match setup.as_str() {
                    "kernel" => (KERNEL, &krx),
                    "corelane" => (CORELANE, &crx),
                    other => return Err(format!("unknown setup {other:?} (kernel, corelane)")),
                };
                net.set_loss(Loss::percent(ack), Loss::percent(data))
                    .map_err(|e| e.to_string())?;
                net.set_duplicate(Loss::NONE, Loss::percent(dup))
                    .map_err(|e| e.to_string())?;
                if args.delay_us > 0 {
                    net.set_reorder(Loss::ALL, Loss::NONE, Duration::from_micros(args.delay_us))
                } else {
                    net.set_reorder(Loss::NONE, Loss::percent(reorder), delay)
                }
                .map_err(|e| e.to_string())?;
                net.set_mark(Loss::NONE, Loss::percent(mark))
                    .map_err(|e| e.to_string())?;
                let addr: SocketAddr = format!("{ip}:{PORT}").parse().map_err(|_| "address")?;
                let timeout = Duration::from_secs(args.timeout);
                let got = net
                    .client_ns()
                    .run(move || receive(addr, timeout))
                    .map_err(|e| e.to_string())?;
                let sent = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_default();
                let c = net.counters().map_err(|e| e.to_string())?;
                let mut r = Run {
                    setup: setup.clone(),
                    data_loss: data,
                    ack_loss: ack,
                    dup,
                    reorder,
                    mark,
                    retrans_segs: sent.retrans_segs,
                    rto: sent.rto,
                    srtt_us: sent.srtt_us,
                    recoveries: sent.recoveries,
                    dropped_data_frames: c.dropped_to_client,
                    dropped_ack_frames: c.dropped_to_server,
                    ..Run::default()
                };
                match got {
                    Ok((n, secs, stall, hash)) => {
                        r.ok = n == total && hash == want;
                        if !r.ok {
                            r.error = Some(format!("{n} bytes, hash match {}", hash == want));
                        }
                        r.seconds = secs;
                        r.mbit = n as f64 * 8.0 / secs / 1e6;
                        r.max_stall_ms = stall;
                    }
                    Err(e) => r.error = Some(e),
                }
                println!(
                    "rep {} data {data}% ack {ack}% dup {dup}% reorder {reorder}% mark {mark}% {:<9} {:>8.1} Mbit/s {:>6.2} s stall {:>6.1} ms retrans {} (dropped {}) rto {} recoveries {} srtt {:.1} ms {}",
                    rep + 1,
                    r.setup,
                    r.mbit,
                    r.seconds,
                    r.max_stall_ms,
                    r.retrans_segs,
                    r.dropped_data_frames,
                    r.rto,
                    r.recoveries,
                    r.srtt_us as f64 / 1000.0,
                    if r.ok {
                        "sha256 ok".to_string()
                    } else {
                        format!("FAILED: {:?}", r.error)
                    }
                );
                runs.push(r);
            }
        }
    }
    stop.stop();
    report(args, &scenarios, &runs)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

/// One path condition: loss each way, duplication and reordering toward the client, percent.
#[derive(Debug, Clone, Copy, Default)]
struct Scenario {
    data: f64,
    ack: f64,
    dup: f64,
    reorder: f64,
    mark: f64,
}

fn report(args: &Args, scenarios: &[Scenario], runs: &[Run]) -> Result<(), String> {
    let mut rows = Vec::new();
    for sc in scenarios {
        let of = |setup: &str| -> Vec<&Run> {
            runs.iter()
                .filter(|r| {
                    r.setup == setup
                        && r.data_loss == sc.data
                        && r.ack_loss == sc.ack
                        && r.dup == sc.dup
                        && r.reorder == sc.reorder
                        && r.mark == sc.mark
                })
                .collect()
        };
        let (k, c) = (of("kernel"), of("corelane"));
        let rate = |v: &[&Run]| {
            median(
                &mut v
                    .iter()
                    .map(|r| if r.ok { r.mbit } else { 0.0 })
                    .collect::<Vec<_>>(),
            )
        };
        let stall = |v: &[&Run]| v.iter().map(|r| r.max_stall_ms).fold(0.0, f64::max);
        let retx = |v: &[&Run]| {
            let (r, d): (u64, u64) = v.iter().fold((0, 0), |a, x| {
                (a.0 + x.retrans_segs, a.1 + x.dropped_data_frames)
            });
            if d == 0 {
                format!("{r} / 0")
            } else {
                format!("{r} / {d} ({:.2})", r as f64 / d as f64)
            }
        };
        let ok = |v: &[&Run]| v.iter().all(|r| r.ok);
        let (kr, cr) = (rate(&k), rate(&c));
        rows.push(vec![
            format!("{}%", sc.data),
            format!("{}%", sc.ack),
            format!("{}%", sc.dup),
            format!("{}%", sc.reorder),
            format!("{}%", sc.mark),
            format!("{kr:.0}"),
            format!("{cr:.0}"),
            if kr > 0.0 {
                format!("{:.2}", cr / kr)
            } else {
                "-".into()
            },
            format!("{:.0} / {:.0}", stall(&k), stall(&c)),
            retx(&k),
            retx(&c),
            format!("{} / {}", ok(&k), ok(&c)),
        ]);
    }
    let table = markdown_table(
        &[
            "data loss",
            "ACK loss",
            "dup",
            "reordered",
            "CE-marked",
            "kernel Mbit/s",
            "corelane Mbit/s",
            "corelane / kernel",
            "max stall ms (kernel / corelane)",
            "kernel retrans / dropped",
            "corelane retrans / dropped",
            "sha256 ok (kernel / corelane)",
        ],
        &rows,
    );
    let md = format!(
        "# corelane against the kernel through a lossy router\n\n{} MiB per transfer from a \
         server in the server namespace to a kernel client, through a bridge that drops the \
         given share of frames (data: toward the client; ACK: toward the server){}{}; reordered \
         frames are held {} us; CE-marked: the share of ECN-capable data frames the router marks \
         Congestion Experienced (the client asks for ECN in that scenario); median of {} run(s). The kernel server runs {}, corelane CUBIC. Retransmissions are the sender's \
         segments; dropped are the data frames the router dropped.\n\n{table}\n\nReproduce: \
         `cargo run --release -p corelane-bench --bin lossy -- --mib {} --loss {}{}{} --ack-loss {} \
         --dup {} --reorder {} --mark {} --repeat {} --kernel-cc {}`\n",
        args.mib,
        args.rate
            .map_or(String::new(), |r| format!(", a {r} Mbit/s bottleneck")),
        if args.delay_us > 0 {
            format!(
                ", every ACK held {:.1} ms (a longer path; no reordering scenario then)",
                args.delay_us as f64 / 1000.0
            )
        } else {
            String::new()
        },
        args.reorder_delay_us,
        args.repeat,
        args.kernel_cc,
        args.mib,
        args.loss
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join(","),
        args.rate.map_or(String::new(), |r| format!(" --rate {r}")),
        if args.delay_us > 0 {
            format!(" --delay-us {}", args.delay_us)
        } else {
            String::new()
        },
        args.ack_loss,
        args.dup,
        args.reorder,
        args.mark,
        args.repeat,
        args.kernel_cc,
    );
    println!("\n{md}");
    std::fs::create_dir_all(&args.out).map_err(|e| e.to_string())?;
    std::fs::write(args.out.join("lossy.md"), &md).map_err(|e| e.to_string())?;
    let json = serde_json::to_string_pretty(runs).map_err(|e| e.to_string())?;
    std::fs::write(args.out.join("lossy.json"), json).map_err(|e| e.to_string())?;
    println!("wrote {}/lossy.md, lossy.json", args.out.display());
    Ok(())
}
