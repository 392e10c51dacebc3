//! Seed 000's experiment on corelane: where the protocol and the application run (same core,
//! a cache-sharing pair, spread apart) against offered load, over a veth pair. A kernel TCP
//! sender in the peer namespace offers each load for a few seconds to a corelane sink; the
//! report gives the goodput the sink's application received and the server's CPU seconds per
//! GB (protocol and application threads, adaptive polling so idle time is not spent
//! spinning), medians over repetitions, as Markdown, JSON and a PNG plot.
//!
//! ```text
//! cargo run --release -p corelane-bench --bin placement -- --loads 0.5,1,2,max --repeat 3
//! ```
//!
//! Needs root (network namespaces, XDP, AF_XDP).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use corelane::net::TcpListener;
use corelane::{Placement, Runtime};
use corelane_bench::{Panel, markdown_table, median, paced_send, pin, plot_png};
use corelane_testnet::VethPair;
use tokio::io::AsyncReadExt;

#[derive(Parser, Debug)]
#[command(about = "Protocol/application placement against offered load (seed 000) on corelane")]
struct Cli {
    /// Offered loads in Gbit/s, comma separated; `max` sends as fast as the sender can.
    #[arg(long, default_value = "0.5,1,2,max")]
    loads: String,
    /// Placements to compare (see the topology example).
    #[arg(long, default_value = "same-core,shared-cache,spread")]
    placements: String,
    /// Seconds per run.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Repetitions of every case (the placements alternate within each).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Where to write placement.md, placement.json and placement.png.
    #[arg(long, default_value = "target/placement")]
    out: PathBuf,
}

const PORT: u16 = 5001;
const SERVER: &str = "10.77.0.3";

/// One run's outcome.
#[derive(Debug, Clone, Copy)]
struct Sample {
    gbit: f64,
    cpu_s_per_gb: f64,
    cpu_s: f64,
}

fn one_run(
    net: &VethPair,
    placement: &Placement,
    load: Option<f64>,
    secs: f64,
) -> Result<Sample, String> {
    let received = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    let ifname = net.server_if().to_string();
    let (p, rcv) = (placement.clone(), received.clone());
    let server = net
        .server_ns()
        .spawn(move || -> Result<corelane::RunReport, String> {
            let rt = Runtime::builder(&ifname)
                .addr(format!("{SERVER}/24"))
                .placement(p)
                .cores(1)
                .bdp(10_000_000_000, Duration::from_micros(200))
                .build()
                .map_err(|e| e.to_string())?;
            let _ = stop_tx.send(rt.stop_handle());
            rt.run(move |_core| {
                let rcv = rcv.clone();
                async move {
                    let l = match TcpListener::bind(PORT).await {
                        Ok(l) => l,
                        Err(e) => return eprintln!("placement: port {PORT}: {e}"),
                    };
                    loop {
                        let Ok((mut s, _)) = l.accept().await else {
                            return;
                        };
                        let rcv = rcv.clone();
                        tokio::task::spawn_local(async move {
                            let mut buf = vec![0u8; 64 * 1024];
                            while let Ok(n @ 1..) = s.read(&mut buf).await {
                                rcv.fetch_add(n as u64, Ordering::Relaxed);
                            }
                        });
                    }
                }
            })
            .map_err(|e| e.to_string())
        })
        .map_err(|e| e.to_string())?;
    let Ok(stop) = stop_rx.recv_timeout(Duration::from_secs(10)) else {
        return Err(match server.join() {
            Ok(Err(e)) => e,
            _ => "the server did not start".to_string(),
        });
    };
    let addr: SocketAddr = format!("{SERVER}:{PORT}").parse().map_err(|_| "address")?;
    let client_cpu = *corelane::allowed_cpus().last().unwrap_or(&0);
    let dur = Duration::from_secs_f64(secs);
    let (sent, elapsed) = net
        .client_ns()
        .run(move || {
            pin(client_cpu);
            // The first connection may race the listener's start: retry briefly.
            let mut last = None;
            for _ in 0..50 {
                match paced_send(addr, load.map(|g| g * 1e9), dur, 64 * 1024) {
                    Ok(n) => return Ok(n),
                    Err(e) => last = Some(e),
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(last.map(|e| e.to_string()).unwrap_or_default())
        })
        .map_err(|e| e.to_string())??;
    let elapsed = elapsed.as_secs_f64();
    stop.stop();
    let report = server.join().map_err(|e| e.to_string())??;
    let got = received.load(Ordering::Relaxed);
    if got < sent / 2 {
        return Err(format!("the sink received {got} of {sent} bytes"));
    }
    let cpu_s: f64 = report
        .cores
        .iter()
        .map(|c| (c.stats.cpu_time + c.stats.app_cpu_time).as_secs_f64())
        .sum();
    Ok(Sample {
        gbit: got as f64 * 8.0 / elapsed / 1e9,
        cpu_s_per_gb: cpu_s / (got as f64 / 1e9),
        cpu_s,
    })
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("placement: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    let loads: Vec<Option<f64>> = cli
        .loads
        .split(',')
        .map(|l| match l.trim() {
            "max" => Ok(None),
            v => v
                .parse::<f64>()
                .ok()
                .filter(|g| *g > 0.0)
                .map(Some)
                .ok_or_else(|| format!("--loads: `{v}` is not a rate in Gbit/s or `max`")),
        })
        .collect::<Result<_, _>>()?;
    let placements: Vec<Placement> = cli
        .placements
        .split(',')
        .map(|p| Placement::parse(p.trim()).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let net = VethPair::builder()
        .queues(1)
        .server_addr("10.77.0.1/24")
        .client_addr("10.77.0.2/24")
        .build()
        .map_err(|e| format!("making the veth pair: {e}"))?;
    // The plans, as the runtime makes them (printed once).
    let mut plans = Vec::new();
    for p in &placements {
        let ifname = net.server_if().to_string();
        let p2 = p.clone();
        let plan = net
            .server_ns()
            .run(move || Runtime::builder(&ifname).placement(p2).cores(1).plan())
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("{}: {e}", p.name()))?;
        println!("{plan}");
        plans.push(plan);
    }
    let total = cli.repeat * loads.len() * placements.len();
    let mut samples: Vec<Vec<Vec<Sample>>> = vec![vec![Vec::new(); loads.len()]; placements.len()];
    let mut done = 0;
    for rep in 0..cli.repeat {
        for (li, load) in loads.iter().enumerate() {
            for (pi, p) in placements.iter().enumerate() {
                done += 1;
                let s = one_run(&net, p, *load, cli.seconds)?;
                println!(
                    "[{done}/{total}] rep {} {:>12} offered {:>5}: {:6.3} Gbit/s, {:6.3} CPU s, {:6.3} CPU s/GB",
                    rep + 1,
                    p.name(),
                    load_name(*load),
                    s.gbit,
                    s.cpu_s,
                    s.cpu_s_per_gb
                );
                samples[pi][li].push(s);
            }
        }
    }
    let mut rows = Vec::new();
    let mut json = Vec::new();
    let (mut good, mut cost) = (Vec::new(), Vec::new());
    for (pi, p) in placements.iter().enumerate() {
        let lane = &plans[pi].lanes[0];
        let cpus = if lane.split() {
            format!(
                "{} + {} ({})",
                lane.protocol_cpu, lane.app_cpu, lane.sharing
            )
        } else {
            format!("{}", lane.protocol_cpu)
        };
        let (mut g, mut c) = (Vec::new(), Vec::new());
        for (li, load) in loads.iter().enumerate() {
            let s = &samples[pi][li];
            let gb = median(&s.iter().map(|x| x.gbit).collect::<Vec<_>>());
            let cpg = median(&s.iter().map(|x| x.cpu_s_per_gb).collect::<Vec<_>>());
            let cpu = median(&s.iter().map(|x| x.cpu_s).collect::<Vec<_>>());
            rows.push(vec![
                p.name().to_string(),
                cpus.clone(),
                load_name(*load),
                format!("{gb:.3}"),
                format!("{cpg:.3}"),
                format!("{cpu:.2}"),
            ]);
            json.push(format!(
                "{{\"placement\":\"{}\",\"cpus\":\"{}\",\"offered_gbit\":{},\"goodput_gbit\":{gb:.4},\"cpu_s_per_gb\":{cpg:.4},\"cpu_s\":{cpu:.4},\"runs\":{}}}",
                p.name(),
                cpus,
                load.map_or("null".to_string(), |l| l.to_string()),
                s.len()
            ));
            // "max" has no offered rate: it is drawn at the goodput it reached.
            g.push((load.unwrap_or(gb), gb));
            c.push((gb, cpg));
        }
        good.push((p.name().to_string(), g));
        cost.push((p.name().to_string(), c));
    }
    let table = markdown_table(
        &[
            "placement",
            "CPUs (protocol + application)",
            "offered Gbit/s",
            "goodput Gbit/s",
            "server CPU s/GB",
            "server CPU s",
        ],
        &rows,
    );
    println!("\n{table}");
    std::fs::create_dir_all(&cli.out).map_err(|e| format!("{}: {e}", cli.out.display()))?;
    let md = format!(
        "# Placement against offered load (seed 000 on corelane)\n\n{}\n\nMedians of {} run(s) of {} s each; one queue, one lane; the kernel sender pinned to CPU {}.\n\n{table}\n",
        plans
            .iter()
            .map(|p| format!("```\n{p}```"))
            .collect::<Vec<_>>()
            .join("\n\n"),
        cli.repeat,
        cli.seconds,
        corelane::allowed_cpus().last().unwrap_or(&0)
    );
    let write = |name: &str, text: &str| {
        let p = cli.out.join(name);
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
    };
    write("placement.md", &md)?;
    write(
        "placement.json",
        &format!("[\n  {}\n]\n", json.join(",\n  ")),
    )?;
    let png = cli.out.join("placement.png");
    plot_png(
        &png,
        &[
            Panel {
                title: "goodput against offered load".into(),
                x: "offered Gbit/s (max: as fast as possible)".into(),
                y: "goodput Gbit/s".into(),
                series: good,
            },
            Panel {
                title: "server CPU per GB".into(),
                x: "goodput Gbit/s".into(),
                y: "CPU seconds per GB".into(),
                series: cost,
            },
        ],
    )?;
    println!(
        "wrote {}, {} and {}",
        cli.out.join("placement.md").display(),
        cli.out.join("placement.json").display(),
        png.display()
    );
    Ok(())
}

fn load_name(l: Option<f64>) -> String {
    l.map_or("max".to_string(), |g| format!("{g}"))
}
