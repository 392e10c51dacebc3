//! The deterministic simulation swept over many seeds: every scenario (a bidirectional workload
//! through an impaired path, `corelane_stack::sim::scenarios`) run with seeds `--from` to
//! `--from + --seeds`, spread over the machine's cores. Prints every failure with the command
//! that replays it, and per scenario the runs, failures, and the distribution of completion
//! time and worst stall (simulated time), retransmissions and timeouts.
//!
//! ```text
//! cargo run --release -p corelane-bench --bin sim -- --seeds 2000            # every scenario
//! cargo run --release -p corelane-bench --bin sim -- --scenario echo/loss-5% --seeds 100000
//! cargo run --release -p corelane-bench --bin sim -- --scenario rpc/mix --seed 1234   # replay
//! # the reordering sweep: frames held behind 1..16 later ones, 1..40% of them, each way
//! cargo run --release -p corelane-bench --bin sim -- --hold-depths 1,2,4,8,16 --seeds 50
//! ```
//!
//! Needs no privilege: the two stacks run in this process over the in-memory link.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use clap::Parser;
use corelane_bench::markdown_table;
use corelane_stack::sim::{
    Scenario, SimConfig, SimFailure, SimReport, hold_scenarios, run_with, scenarios,
};

#[derive(Parser, Debug)]
#[command(about = "The deterministic TCP simulation swept over seeds")]
struct Args {
    /// Scenarios whose name starts with this (all when absent); `--list` shows them.
    #[arg(long)]
    scenario: Option<String>,
    /// Runs one seed and prints its report (a replay).
    #[arg(long)]
    seed: Option<u64>,
    /// Seeds per scenario.
    #[arg(long, default_value_t = 200)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Threads (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Lists the scenarios and exits.
    #[arg(long)]
    list: bool,
    /// Failures printed per scenario.
    #[arg(long, default_value_t = 5)]
    show: usize,
    /// Frames longer than the MTU are only dropped by the path, as a real link drops them,
    /// instead of failing the run.
    #[arg(long)]
    lenient_mtu: bool,
    /// The client delays its ACKs this long (milliseconds; Linux's delayed ACK is 40 ms and
    /// more), to see how the server's sender copes with a slow ACKer.
    #[arg(long)]
    client_ack_delay_ms: Option<u64>,
    /// One-way delay of both directions, microseconds, instead of the scenario's (a veth's
    /// round trip is a few hundred).
    #[arg(long)]
    delay_us: Option<u64>,
    /// With `--seed`: prints every frame offered to the path and what became of it.
    #[arg(long)]
    trace: bool,
    /// The reordering sweep instead of the scenarios: every shape through a lossless path of
    /// a veth's pace holding `--hold-shares` of the frames each way behind each of these many
    /// later ones (scenarios `<shape>/hold-D-P`), and through the same path holding none
    /// (`<shape>/hold-0-0`), whose median time the table divides by.
    #[arg(long, value_delimiter = ',')]
    hold_depths: Vec<u32>,
    /// The held shares (percent each way) of the reordering sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,5,10,20,40")]
    hold_shares: Vec<f64>,
}

/// What the runs of one scenario gave.
#[derive(Default)]
struct Tally {
    ok: Vec<SimReport>,
    failed: Vec<SimFailure>,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let args = Args::parse();
    // Panics are failures the runs report with their seeds; the default hook's output would
    // only repeat them.
    // A replay (`--seed`) keeps the hook, for the backtrace.
    if args.seed.is_none() {
        std::panic::set_hook(Box::new(|_| {}));
    }
    let lenient = args.lenient_mtu;
    let delack = args.client_ack_delay_ms;
    let delay_us = args.delay_us;
    let trace = args.trace && args.seed.is_some();
    let run_scenario = |s: &Scenario, seed: u64| {
        let mut cfg = SimConfig {
            strict_mtu: !lenient,
            trace,
            ..SimConfig::new(seed, s.up, s.down)
        };
        if let Some(us) = delay_us {
            cfg.up.delay = corelane_stack::smoltcp::time::Duration::from_micros(us);
            cfg.down.delay = cfg.up.delay;
        }
        if let Some(ms) = delack {
            cfg.client_tcp.ack_delay = std::time::Duration::from_millis(ms);
        }
        run_with(s, &cfg)
    };
    let listed = if args.hold_depths.is_empty() {
        scenarios()
    } else {
        hold_scenarios(&args.hold_depths, &args.hold_shares)
    };
    let all: Vec<Scenario> = listed
        .into_iter()
        .filter(|s| args.scenario.as_ref().is_none_or(|p| s.name.starts_with(p)))
        .collect();
    if args.list || all.is_empty() {
        for s in scenarios() {
            println!("{}", s.name);
        }
        if all.is_empty() {
            eprintln!("sim: no scenario starts with {:?}", args.scenario);
            std::process::exit(2);
        }
        return;
    }
    if let Some(seed) = args.seed {
        let mut failed = false;
        for s in &all {
            match run_scenario(s, seed) {
                Ok(r) => println!("{} seed {seed}: ok {r:#?}", s.name),
                Err(f) => {
                    failed = true;
                    println!("{f}\n{:#?}", f.report);
                }
            }
        }
        std::process::exit(i32::from(failed));
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let jobs: Vec<(usize, u64)> = (0..all.len())
        .flat_map(|i| (args.from..args.from + args.seeds).map(move |s| (i, s)))
        .collect();
    let next = AtomicU64::new(0);
    let tallies: Vec<Mutex<Tally>> = all.iter().map(|_| Mutex::new(Tally::default())).collect();
    let started = std::time::Instant::now();
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(&(i, seed)) = jobs.get(k) else {
                        break;
                    };
                    let r = run_scenario(&all[i], seed);
                    let mut t = tallies[i].lock().unwrap_or_else(|e| e.into_inner());
                    match r {
                        Ok(r) => t.ok.push(r),
                        Err(f) => t.failed.push(f),
                    }
                }
            });
        }
    });
    let mut rows = Vec::new();
    let mut failures = 0;
    // Per shape, the median time through the same path holding nothing (the sweep's baseline).
    let mut baseline: Vec<(String, f64)> = Vec::new();
    for (s, t) in all.iter().zip(tallies) {
        let mut t = t.into_inner().unwrap_or_else(|e| e.into_inner());
        t.failed.sort_by_key(|f| f.seed);
        for f in t.failed.iter().take(args.show) {
            println!("FAIL {f}");
        }
        failures += t.failed.len();
        let ms = |f: &dyn Fn(&SimReport) -> f64| t.ok.iter().map(f).collect::<Vec<f64>>();
        let mut done = ms(&|r| r.elapsed.total_micros() as f64 / 1000.0);
        let mut stall = ms(&|r| r.worst_stall.total_micros() as f64 / 1000.0);
        let retx: f64 = t.ok.iter().map(|r| r.retransmits as f64).sum::<f64>();
        let segs: f64 = t.ok.iter().map(|r| r.segments as f64).sum::<f64>();
        let rtos: u64 = t.ok.iter().map(|r| r.rtos).sum();
        let p50 = pct(&mut done, 0.5);
        let (shape, cell) = s.name.split_once('/').unwrap_or((&s.name, ""));
        if cell == "hold-0-0" {
            baseline.push((shape.to_string(), p50));
        }
        let base = baseline.iter().find(|(n, _)| n == shape).map(|b| b.1);
        rows.push(vec![
            s.name.clone(),
            format!("{}", t.ok.len() + t.failed.len()),
            format!("{}", t.failed.len()),
            format!("{p50:.1}"),
            base.map_or("-".into(), |b| format!("{:.2}", p50 / b)),
            format!("{:.1}", pct(&mut done, 0.99)),
            format!("{:.1}", pct(&mut done, 1.0)),
            format!("{:.1}", pct(&mut stall, 0.99)),
            format!("{:.1}", pct(&mut stall, 1.0)),
            format!("{:.2}%", 100.0 * retx / segs.max(1.0)),
            format!("{:.2}", rtos as f64 / t.ok.len().max(1) as f64),
        ]);
    }
    println!(
        "{}",
        markdown_table(
            &[
                "scenario",
                "runs",
                "failed",
                "done p50 ms",
                "/ held none",
                "p99",
                "max",
                "worst stall p99 ms",
                "max",
                "retransmitted",
                "RTOs per run",
            ],
            &rows
        )
    );
    println!(
        "{} runs in {:.1} s, {failures} failed",
        jobs.len(),
        started.elapsed().as_secs_f64()
    );
    if failures > 0 {
        std::process::exit(1);
    }
}
