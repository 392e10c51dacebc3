//! corelane against the kernel's TCP, workload by impairment by path, in one run.
//!
//! Client namespace - router namespace (a bridge that drops, duplicates and reorders a share
//! of the frames each way) - server namespace, where a kernel server and a corelane server
//! answer the same kernel client. Workloads: the server sends (`send`), the client sends
//! (`receive`), an echo written and read at once (`echo`), requests answered one at a time
//! with 16 KiB and 1 MiB bodies both ways (`rpc-16k`, `rpc-1m`), and both sending at once
//! (`both`). Impairments: loss one way and both ways, reordering (frames held 200 us), and
//! duplication, alone and mixed. Paths: the link as it is (`plain`), a 1 Gbit/s bottleneck
//! each way (`1g`), and 5 ms added toward the server (`5ms`; the router's one holding stage
//! then delays instead of reordering, and a duplicate would skip it and arrive 5 ms before
//! its original, so no reordering or duplication cells there). Every byte is checked both
//! ways; a transfer stuck longer than `--timeout` counts as failed.
//!
//! ```text
//! cargo run --release -p corelane-bench --bin matrix -- --mib 16
//! cargo run --release -p corelane-bench --bin matrix -- --paths plain --work echo,both --impair loss-1,mix --repeat 5
//! ```

mod proto;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use clap::Parser;
use corelane_bench::{markdown_table, median, pin};
use corelane_testnet::{Loss, LossyPath};
use proto::Work;

const KERNEL: &str = "10.82.0.1";
const CORELANE: &str = "10.82.0.3";
const PORT: u16 = 5020;
/// How long a reordered frame is held.
const REORDER_HOLD: Duration = Duration::from_micros(200);

#[derive(Parser, Debug)]
#[command(about = "corelane's TCP against the kernel's: workload x impairment x path")]
struct Args {
    /// About this many MiB per transfer (each way for send, receive, echo and both; both ways
    /// together for the RPCs).
    #[arg(long, default_value_t = 16)]
    mib: usize,
    /// Workloads: send, receive, echo, rpc-16k, rpc-1m, both.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "send,receive,echo,rpc-16k,rpc-1m,both"
    )]
    work: Vec<String>,
    /// Impairments (see --list), or `hold-D-P`: P% of the frames each way held behind D later
    /// ones.
    #[arg(long, value_delimiter = ',')]
    impair: Vec<String>,
    /// Adds a `hold-D-P` cell for every depth D of these (with `--hold-shares`): the
    /// reordering sweep, e.g. `--hold-depths 1,2,4,8,16 --hold-shares 1,5,10,20,40`.
    #[arg(long, value_delimiter = ',')]
    hold_depths: Vec<u32>,
    /// The held shares (percent each way) of the `--hold-depths` sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,5,10,20,40")]
    hold_shares: Vec<f64>,
    /// Paths: plain, 1g, 5ms.
    #[arg(long, value_delimiter = ',', default_value = "plain,1g,5ms")]
    paths: Vec<String>,
    /// Runs of each cell and setup; the median time is reported.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Seconds a read or write may wait before the transfer counts as failed.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// The kernel server's congestion control (corelane runs CUBIC).
    #[arg(long, default_value = "cubic")]
    kernel_cc: String,
    /// Where matrix.md and matrix.json go.
    #[arg(long, default_value = "target/matrix")]
    out: PathBuf,
    /// Lists the impairments and exits.
    #[arg(long)]
    list: bool,
    /// Prints each corelane connection's TCP counters when it ends (retransmissions, RTOs,
    /// out-of-window segments, ...).
    #[arg(long)]
    conn_stats: bool,
}

/// One impairment: percent of frames dropped, duplicated and reordered, toward the server and
/// toward the client.
#[derive(Debug, Clone)]
struct Impairment {
    name: Cow<'static, str>,
    loss: (f64, f64),
    dup: (f64, f64),
    reorder: (f64, f64),
    /// Reordering by depth: each reordered frame held behind this many later ones (0: held
    /// for a time, `REORDER_HOLD`).
    depth: u32,
}

const fn imp(
    name: &'static str,
    loss: (f64, f64),
    dup: (f64, f64),
    reorder: (f64, f64),
) -> Impairment {
    Impairment {
        name: Cow::Borrowed(name),
        loss,
        dup,
        reorder,
        depth: 0,
    }
}

const IMPAIRMENTS: [Impairment; 14] = [
    imp("clean", (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)),
    imp("loss-1-to-client", (0.0, 1.0), (0.0, 0.0), (0.0, 0.0)),
    // Nothing toward the server is lost: every segment the client resends is spurious,
    // prompted by the server's ACKs lost on their way (or by their pattern).
    imp("loss-5-to-client", (0.0, 5.0), (0.0, 0.0), (0.0, 0.0)),
    imp("loss-5-to-server", (5.0, 0.0), (0.0, 0.0), (0.0, 0.0)),
    imp("loss-0.1", (0.1, 0.1), (0.0, 0.0), (0.0, 0.0)),
    imp("loss-1", (1.0, 1.0), (0.0, 0.0), (0.0, 0.0)),
    imp("loss-5", (5.0, 5.0), (0.0, 0.0), (0.0, 0.0)),
    imp("loss-10", (10.0, 10.0), (0.0, 0.0), (0.0, 0.0)),
    imp("reorder-1", (0.0, 0.0), (0.0, 0.0), (1.0, 1.0)),
    imp("reorder-5", (0.0, 0.0), (0.0, 0.0), (5.0, 5.0)),
    imp("reorder-20", (0.0, 0.0), (0.0, 0.0), (20.0, 20.0)),
    Impairment {
        name: Cow::Borrowed("reorder-deep"),
        loss: (0.0, 0.0),
        dup: (0.0, 0.0),
        reorder: (20.0, 20.0),
        depth: 8,
    },
    imp("dup-5", (0.0, 0.0), (5.0, 5.0), (0.0, 0.0)),
    imp("mix", (1.0, 1.0), (10.0, 10.0), (10.0, 10.0)),
];

impl Impairment {
    /// A listed impairment, or `hold-D-P`: P% of the frames each way (0 < P <= 100) held
    /// behind D later ones (1 <= D <= 64).
    fn parse(n: &str) -> Result<Impairment, String> {
        if let Some(im) = IMPAIRMENTS.iter().find(|i| i.name == n) {
            return Ok(im.clone());
        }
        let bad = || format!("unknown impairment {n:?} (see --list; or hold-DEPTH-PERCENT)");
        let (d, p) = n
            .strip_prefix("hold-")
            .and_then(|r| r.split_once('-'))
            .ok_or_else(bad)?;
        let depth: u32 = d.parse().map_err(|_| bad())?;
        let share: f64 = p.parse().map_err(|_| bad())?;
        Impairment::hold(depth, share)
    }

    /// `share`% of the frames each way held behind `depth` later ones.
    fn hold(depth: u32, share: f64) -> Result<Impairment, String> {
        if !((1..=64).contains(&depth) && share > 0.0 && share <= 100.0) {
            return Err(format!(
                "a held share of {share}% behind {depth} frames: the depth goes 1..=64, the \
                 share above 0 up to 100"
            ));
        }
        Ok(Impairment {
            name: Cow::Owned(format!("hold-{depth}-{share}")),
            depth,
            ..imp("", (0.0, 0.0), (0.0, 0.0), (share, share))
        })
    }

    fn describe(&self) -> String {
        let two = |(s, c): (f64, f64)| {
            if s == c {
                format!("{s}% both ways")
            } else if s == 0.0 {
                format!("{c}% toward the client")
            } else if c == 0.0 {
                format!("{s}% toward the server")
            } else {
                format!("{s}% toward the server, {c}% toward the client")
            }
        };
        let mut parts = Vec::new();
        for (what, v) in [
            ("lost", self.loss),
            ("duplicated", self.dup),
            ("reordered", self.reorder),
        ] {
            if v != (0.0, 0.0) {
                parts.push(format!("{} {what}", two(v)));
            }
        }
        if self.depth > 0 {
            parts.push(format!(
                "each held behind {} later frames (every frame through the relay)",
                self.depth
            ));
        }
        if parts.is_empty() {
            "nothing".into()
        } else {
            parts.join(", ")
        }
    }
}

/// The path beyond the impairments.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Path {
    Plain,
    Gbit,
    Delay5ms,
}

impl Path {
    fn parse(s: &str) -> Result<Path, String> {
        match s {
            "plain" => Ok(Path::Plain),
            "1g" => Ok(Path::Gbit),
            "5ms" => Ok(Path::Delay5ms),
            _ => Err(format!("unknown path {s:?} (plain, 1g, 5ms)")),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Path::Plain => "plain",
            Path::Gbit => "1g",
            Path::Delay5ms => "5ms",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Path::Plain => "the veth links as they are (no rate limit, about 100 us round trip)",
            Path::Gbit => "a 1 Gbit/s token bucket each way (queue about 5 ms)",
            Path::Delay5ms => {
                "every frame toward the server held 5 ms (no reordering or duplication cells)"
            }
        }
    }

    /// Whether the path can make `im`: on the delayed path the holding stage is taken, and a
    /// duplicate (made at the router's ingress) would skip the delay.
    fn takes(self, im: &Impairment) -> bool {
        self != Path::Delay5ms || (im.reorder == (0.0, 0.0) && im.dup == (0.0, 0.0))
    }

    fn apply(self, net: &LossyPath, im: &Impairment) -> Result<(), String> {
        let pct = Loss::percent;
        net.set_loss(pct(im.loss.0), pct(im.loss.1))
            .and_then(|()| net.set_duplicate(pct(im.dup.0), pct(im.dup.1)))
            .and_then(|()| match self {
                Path::Delay5ms => net.set_reorder(Loss::ALL, Loss::NONE, Duration::from_millis(5)),
                _ if im.depth > 0 => net.set_reorder_depth(pct(im.reorder.0), im.depth),
                _ => net.set_reorder(pct(im.reorder.0), pct(im.reorder.1), REORDER_HOLD),
            })
            .map_err(|e| e.to_string())
    }
}

/// One transfer's figures.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct Run {
    path: String,
    impairment: String,
    work: String,
    setup: String,
    ok: bool,
    error: Option<String>,
    seconds: f64,
    mbit: f64,
    max_stall_ms: f64,
    server_retrans: u64,
    client_retrans: u64,
    dropped_frames: u64,
}

fn main() {
    let args = Args::parse();
    if args.list {
        for im in &IMPAIRMENTS {
            println!("{:<18} {}", im.name, im.describe());
        }
        println!(
            "{:<18} P% of the frames each way held behind D later ones",
            "hold-D-P"
        );
        return;
    }
    proto::CONN_STATS.store(args.conn_stats, std::sync::atomic::Ordering::Relaxed);
    if let Err(e) = run(&args) {
        eprintln!("matrix: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    if !corelane_testnet::is_root() {
        return Err("needs root (network namespaces, XDP)".into());
    }
    let works = args
        .work
        .iter()
        .map(|w| Work::parse(w))
        .collect::<Result<Vec<_>, _>>()?;
    let paths = args
        .paths
        .iter()
        .map(|p| Path::parse(p))
        .collect::<Result<Vec<_>, _>>()?;
    let mut impairments: Vec<Impairment> = args
        .impair
        .iter()
        .map(|n| Impairment::parse(n))
        .collect::<Result<_, _>>()?;
    for &d in &args.hold_depths {
        for &p in &args.hold_shares {
            impairments.push(Impairment::hold(d, p)?);
        }
    }
    if impairments.is_empty() {
        impairments = IMPAIRMENTS.to_vec();
    }
    let net = LossyPath::builder()
        .server_addr(&format!("{KERNEL}/24"))
        .client_addr("10.82.0.2/24")
        .build()
        .map_err(|e| e.to_string())?;
    let (ktx, krx) = mpsc::channel();
    let (ctx, crx) = mpsc::channel();
    kernel_server(&net, &args.kernel_cc, ktx)?;
    let stop = corelane_bench::corelane_server(
        net.server_ns(),
        net.server_if(),
        &format!("{CORELANE}/24"),
        PORT,
        |b| b,
        move |s| {
            let tx = ctx.clone();
            async move {
                let _ = tx.send(proto::serve_corelane(s).await.unwrap_or(0));
            }
        },
    )?;
    let total = args.mib << 20;
    let timeout = Duration::from_secs(args.timeout);
    let mut runs = Vec::new();
    for &path in &paths {
        net.set_rate(
            (path == Path::Gbit).then_some(1000),
            (path == Path::Gbit).then_some(1000),
        )
        .map_err(|e| e.to_string())?;
        for im in &impairments {
            if !path.takes(im) {
                continue;
            }
            for &work in &works {
                for _ in 0..args.repeat {
                    for (setup, ip, rx) in [("kernel", KERNEL, &krx), ("corelane", CORELANE, &crx)]
                    {
                        path.apply(&net, im)?;
                        let addr: SocketAddr =
                            format!("{ip}:{PORT}").parse().map_err(|_| "address")?;
                        let got = net
                            .client_ns()
                            .run(move || {
                                pin(1);
                                proto::client(addr, work, total, timeout)
                            })
                            .map_err(|e| e.to_string())?;
                        let server_retrans =
                            rx.recv_timeout(Duration::from_secs(10)).unwrap_or_default();
                        let c = net.counters().map_err(|e| e.to_string())?;
                        let mut r = Run {
                            path: path.name().into(),
                            impairment: im.name.to_string(),
                            work: work.name().into(),
                            setup: setup.into(),
                            server_retrans,
                            dropped_frames: c.dropped_to_client + c.dropped_to_server,
                            ..Run::default()
                        };
                        match got {
                            Ok(m) => {
                                r.ok = true;
                                r.seconds = m.seconds;
                                r.mbit = m.bytes as f64 * 8.0 / m.seconds / 1e6;
                                r.max_stall_ms = m.stall_ms;
                                r.client_retrans = m.client_retrans;
                            }
                            Err(e) => r.error = Some(e),
                        }
                        println!(
                            "{:<5} {:<16} {:<8} {:<8} {:>7.1} Mbit/s {:>6.2} s stall {:>6.1} ms retrans {}+{} (dropped {}) {}",
                            r.path,
                            r.impairment,
                            r.work,
                            r.setup,
                            r.mbit,
                            r.seconds,
                            r.max_stall_ms,
                            r.server_retrans,
                            r.client_retrans,
                            r.dropped_frames,
                            r.error.as_deref().unwrap_or("ok")
                        );
                        runs.push(r);
                    }
                }
            }
        }
    }
    stop.stop();
    report(args, &paths, &impairments, &works, &runs)
}

fn kernel_server(net: &LossyPath, cc: &str, tx: mpsc::Sender<u64>) -> Result<(), String> {
    let l = corelane_bench::kernel_listener(net.server_ns(), KERNEL, PORT, cc)?;
    net.server_ns()
        .spawn(move || {
            pin(0);
            while let Ok((s, _)) = l.accept() {
                let _ = s.set_nodelay(true);
                let _ = tx.send(proto::serve_kernel(s).unwrap_or(0));
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn report(
    args: &Args,
    paths: &[Path],
    impairments: &[Impairment],
    works: &[Work],
    runs: &[Run],
) -> Result<(), String> {
    let cell = |p: Path, im: &str, w: Work, setup: &str| -> Vec<&Run> {
        runs.iter()
            .filter(|r| {
                r.path == p.name() && r.impairment == im && r.work == w.name() && r.setup == setup
            })
            .collect()
    };
    // Median goodput, a failed run counting as 0.
    let rate = |v: &[&Run]| {
        median(
            &v.iter()
                .map(|r| if r.ok { r.mbit } else { 0.0 })
                .collect::<Vec<_>>(),
        )
    };
    let stall = |v: &[&Run]| v.iter().map(|r| r.max_stall_ms).fold(0.0, f64::max);
    let (mut at_least, mut cells, mut failed) = (0, 0, 0);
    let mut md = format!(
        "# corelane against the kernel: workload x impairment x path\n\n\
         A kernel client in one namespace, a kernel server and a corelane server (one core, \
         CUBIC) in another, a bridge between them that loses, duplicates and reorders frames \
         (reordered frames are held {} us). About {} MiB per transfer; every byte checked both \
         ways. Each cell: kernel Mbit/s / corelane Mbit/s (corelane / kernel), the median of {} \
         run(s), both directions' payload counted. The kernel server runs {}.\n",
        REORDER_HOLD.as_micros(),
        args.mib,
        args.repeat,
        args.kernel_cc
    );
    let mut detail = Vec::new();
    for &p in paths {
        let mut rows = Vec::new();
        for im in impairments {
            if !p.takes(im) {
                continue;
            }
            let mut row = vec![format!("{} ({})", im.name, im.describe())];
            for &w in works {
                let (k, c) = (
                    cell(p, &im.name, w, "kernel"),
                    cell(p, &im.name, w, "corelane"),
                );
                if k.is_empty() || c.is_empty() {
                    row.push("-".into());
                    continue;
                }
                let (kr, cr) = (rate(&k), rate(&c));
                cells += 1;
                at_least += usize::from(cr >= kr && cr > 0.0);
                failed += c.iter().filter(|r| !r.ok).count();
                row.push(format!(
                    "{kr:.0} / {cr:.0} ({})",
                    if kr > 0.0 {
                        format!("{:.2}", cr / kr)
                    } else {
                        "-".into()
                    }
                ));
                let retx = |v: &[&Run]| {
                    v.iter()
                        .map(|r| r.server_retrans + r.client_retrans)
                        .sum::<u64>()
                };
                detail.push(vec![
                    p.name().into(),
                    im.name.to_string(),
                    w.name().into(),
                    format!("{:.0} / {:.0}", stall(&k), stall(&c)),
                    format!("{} / {}", retx(&k), retx(&c)),
                    format!(
                        "{} / {}",
                        k.iter().map(|r| r.dropped_frames).sum::<u64>(),
                        c.iter().map(|r| r.dropped_frames).sum::<u64>()
                    ),
                    format!(
                        "{} / {}",
                        k.iter().filter(|r| r.ok).count(),
                        c.iter().filter(|r| r.ok).count()
                    ),
                ]);
            }
            rows.push(row);
        }
        let mut header = vec!["impairment"];
        header.extend(works.iter().map(|w| w.name()));
        md += &format!(
            "\n## Path `{}`: {}\n\n{}",
            p.name(),
            p.describe(),
            markdown_table(&header, &rows)
        );
    }
    md += &format!(
        "\n**corelane at or above the kernel in {at_least} of {cells} cells; {failed} corelane \
         transfer(s) failed.**\n\n## Details\n\nWorst stall: the longest the client waited for \
         any progress. Retransmitted: server's and client's segments together. Dropped: frames \
         the router dropped. Each pair kernel / corelane.\n\n{}\n\nReproduce: `cargo run \
         --release -p corelane-bench --bin matrix -- --mib {} --paths {} --work {}{} --repeat \
         {} --kernel-cc {}`\n",
        markdown_table(
            &[
                "path",
                "impairment",
                "workload",
                "worst stall ms",
                "retransmitted",
                "dropped",
                "runs ok"
            ],
            &detail
        ),
        args.mib,
        args.paths.join(","),
        args.work.join(","),
        if args.impair.is_empty() {
            String::new()
        } else {
            format!(" --impair {}", args.impair.join(","))
        },
        args.repeat,
        args.kernel_cc,
    );
    println!("\n{md}");
    std::fs::create_dir_all(&args.out).map_err(|e| e.to_string())?;
    std::fs::write(args.out.join("matrix.md"), &md).map_err(|e| e.to_string())?;
    let json = serde_json::to_string_pretty(runs).map_err(|e| e.to_string())?;
    std::fs::write(args.out.join("matrix.json"), json).map_err(|e| e.to_string())?;
    println!("wrote {}/matrix.md, matrix.json", args.out.display());
    Ok(())
}
