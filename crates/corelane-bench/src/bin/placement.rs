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

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use corelane::{Placement, Runtime};
use corelane_bench::{
    Sink, SinkSample, load_name, markdown_table, median, offered_panels, parse_loads, write_report,
};
use corelane_testnet::VethPair;

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

/// One run: a kernel sender offering `load` to a one-lane corelane sink placed as `placement`.
fn one_run(
    net: &VethPair,
    placement: &Placement,
    load: Option<f64>,
    secs: f64,
) -> Result<SinkSample, String> {
    let sink = Sink {
        ip: SERVER.to_string(),
        port: PORT,
        conns: 1,
        gbit: load,
        client_cpu: *corelane::allowed_cpus().last().unwrap_or(&0),
        secs,
    };
    let p = placement.clone();
    sink.run(net, move |b| {
        b.placement(p)
            .cores(1)
            .bdp(10_000_000_000, Duration::from_micros(200))
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
    let loads = parse_loads(&cli.loads)?;
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
    let mut samples: Vec<Vec<Vec<SinkSample>>> =
        vec![vec![Vec::new(); loads.len()]; placements.len()];
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
                    s.cpu_s_per_gb()
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
            let cpg = median(&s.iter().map(|x| x.cpu_s_per_gb()).collect::<Vec<_>>());
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
    write_report(
        &cli.out,
        "placement",
        &md,
        &json,
        &offered_panels(good, cost, "server CPU per GB"),
    )?;
    Ok(())
}
