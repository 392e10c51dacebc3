//! Seed 003's experiment on corelane: does a second core pay? One lane (one queue, one core)
//! against two at the same offered load, over a veth pair with two queues. Kernel TCP senders
//! in the peer namespace (several connections, so the veth spreads them over both queues)
//! offer each load for a few seconds to a corelane sink; the report gives the goodput, the
//! runtime's CPU seconds per GB and the whole machine's, and how the frames split between the
//! lanes, medians over repetitions, as Markdown, JSON and a PNG plot.
//!
//! ```text
//! cargo run --release -p corelane-bench --bin lanes -- --loads 1,2,4,max --repeat 3
//! ```
//!
//! Needs root (network namespaces, XDP, AF_XDP).

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use corelane::Runtime;
use corelane_bench::{
    Sink, SinkSample, load_name, markdown_table, median, offered_panels, parse_loads, write_report,
};
use corelane_testnet::VethPair;

#[derive(Parser, Debug)]
#[command(about = "One lane against two at the same offered load (seed 003) on corelane")]
struct Cli {
    /// Offered loads in Gbit/s over all connections, comma separated; `max`: as fast as the
    /// senders can.
    #[arg(long, default_value = "1,2,4,max")]
    loads: String,
    /// Lane counts to compare (the veth gets as many queues as the largest).
    #[arg(long, default_value = "1,2", value_delimiter = ',',
          value_parser = clap::value_parser!(u16).range(1..))]
    lanes: Vec<u16>,
    /// Sender connections (the load is split evenly between them).
    #[arg(long, default_value_t = 4)]
    conns: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Repetitions of every case (the lane counts alternate within each).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Where to write lanes.md, lanes.json and lanes.png.
    #[arg(long, default_value = "target/lanes")]
    out: PathBuf,
}

const PORT: u16 = 5001;
const SERVER: &str = "10.77.0.3";

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lanes: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    let loads = parse_loads(&cli.loads)?;
    let lanes: Vec<usize> = cli.lanes.iter().map(|&n| usize::from(n)).collect();
    let queues = lanes.iter().copied().max().unwrap_or(1);
    let net = VethPair::builder()
        .queues(queues as u32)
        .server_addr("10.77.0.1/24")
        .client_addr("10.77.0.2/24")
        .build()
        .map_err(|e| format!("making the veth pair: {e}"))?;
    let client_cpu = *corelane::allowed_cpus().last().unwrap_or(&0);
    // Each lane count's CPUs, as the runtime plans them (printed once).
    let mut cpus = Vec::new();
    for &n in &lanes {
        let ifname = net.server_if().to_string();
        let plan = net
            .server_ns()
            .run(move || Runtime::builder(&ifname).cores(n).plan())
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("{n} lane(s): {e}"))?;
        println!("{plan}");
        let list: Vec<String> = plan
            .lanes
            .iter()
            .map(|l| l.protocol_cpu.to_string())
            .collect();
        cpus.push(list.join(" + "));
    }
    let total = cli.repeat * loads.len() * lanes.len();
    let mut samples: Vec<Vec<Vec<SinkSample>>> = vec![vec![Vec::new(); loads.len()]; lanes.len()];
    let mut done = 0;
    for rep in 0..cli.repeat {
        for (li, load) in loads.iter().enumerate() {
            for (ni, &n) in lanes.iter().enumerate() {
                done += 1;
                let sink = Sink {
                    ip: SERVER.to_string(),
                    port: PORT,
                    conns: cli.conns,
                    gbit: *load,
                    client_cpu,
                    secs: cli.seconds,
                };
                let s = sink.run(&net, move |b| {
                    b.cores(n).bdp(10_000_000_000, Duration::from_micros(200))
                })?;
                println!(
                    "[{done}/{total}] rep {} {n} lane(s) offered {:>5}: {:6.3} Gbit/s, {:6.3} CPU s/GB, machine {:6.3} CPU s/GB, frames per lane {:?}",
                    rep + 1,
                    load_name(*load),
                    s.gbit,
                    s.cpu_s_per_gb(),
                    s.machine_cpu_s_per_gb(),
                    s.lane_frames
                );
                samples[ni][li].push(s);
            }
        }
    }
    let med =
        |s: &[SinkSample], f: fn(&SinkSample) -> f64| median(&s.iter().map(f).collect::<Vec<_>>());
    let mut rows = Vec::new();
    let mut json = Vec::new();
    let (mut good, mut cost) = (Vec::new(), Vec::new());
    for (ni, &n) in lanes.iter().enumerate() {
        let (mut g, mut c) = (Vec::new(), Vec::new());
        for (li, load) in loads.iter().enumerate() {
            let s = &samples[ni][li];
            let gb = med(s, |x| x.gbit);
            let cpg = med(s, SinkSample::cpu_s_per_gb);
            let mpg = med(s, SinkSample::machine_cpu_s_per_gb);
            // The busiest lane's share of the frames: 1/n is an even spread.
            let busiest = med(s, |x| {
                let all: u64 = x.lane_frames.iter().sum();
                x.lane_frames.iter().copied().max().unwrap_or(0) as f64 / all.max(1) as f64
            });
            // Against the first lane count at the same load.
            let base = &samples[0][li];
            let vs = if ni == 0 {
                "-".to_string()
            } else {
                format!(
                    "{:.2} / {:.2}",
                    gb / med(base, |x| x.gbit).max(1e-12),
                    cpg / med(base, SinkSample::cpu_s_per_gb).max(1e-12)
                )
            };
            rows.push(vec![
                n.to_string(),
                cpus[ni].clone(),
                load_name(*load),
                format!("{gb:.3}"),
                format!("{cpg:.3}"),
                format!("{mpg:.3}"),
                format!("{:.0}%", busiest * 100.0),
                vs,
            ]);
            json.push(format!(
                "{{\"lanes\":{n},\"cpus\":\"{}\",\"offered_gbit\":{},\"goodput_gbit\":{gb:.4},\"cpu_s_per_gb\":{cpg:.4},\"machine_cpu_s_per_gb\":{mpg:.4},\"busiest_lane_share\":{busiest:.3},\"runs\":{}}}",
                cpus[ni],
                load.map_or("null".to_string(), |l| l.to_string()),
                s.len()
            ));
            // "max" has no offered rate: it is drawn at the goodput it reached.
            g.push((load.unwrap_or(gb), gb));
            c.push((gb, cpg));
        }
        good.push((format!("{n} lane(s)"), g));
        cost.push((format!("{n} lane(s)"), c));
    }
    let first = lanes.first().copied().unwrap_or(1);
    let vs_header = format!("goodput / CPU per GB vs {first} lane(s)");
    let table = markdown_table(
        &[
            "lanes",
            "lane CPUs",
            "offered Gbit/s",
            "goodput Gbit/s",
            "runtime CPU s/GB",
            "machine CPU s/GB",
            "busiest lane's frames",
            &vs_header,
        ],
        &rows,
    );
    println!("\n{table}");
    let md = format!(
        "# One lane against two (seed 003 on corelane)\n\nMedians of {} run(s) of {} s each; {} kernel sender connection(s) pinned to CPU {client_cpu}, the load split evenly between them; the veth has {queues} queue(s), the runtime lowers them to its lane count for a run. Runtime CPU: the runtime's threads (protocol and application); machine CPU: every CPU's busy time while the senders ran, theirs included.\n\n{table}\n",
        cli.repeat, cli.seconds, cli.conns,
    );
    write_report(
        &cli.out,
        "lanes",
        &md,
        &json,
        &offered_panels(good, cost, "runtime CPU per GB"),
    )?;
    Ok(())
}
