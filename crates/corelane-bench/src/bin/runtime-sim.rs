//! Whole runtimes simulated over many seeds (`corelane_rt::sim`): the old and the new process
//! of an upgrade, each a runtime's control plane and core over the in-memory kernel and
//! program, a peer's connections to their echo server throughout, and a fault in one run in
//! two. Prints every failure with the command that replays it, and a table of what the runs
//! did (to `--out`, Markdown).
//!
//! ```text
//! cargo run --release -p corelane-bench --bin runtime-sim -- --seeds 100000
//! cargo run --release -p corelane-bench --bin runtime-sim -- --seed 1234     # replay one
//! ```
//!
//! Needs no privilege: no device, no socket, no root.

use std::collections::BTreeMap;

use clap::Parser;
use corelane_bench::{SweepArgs, markdown_table};
use corelane_rt::sim::{Fault, Outcome, run};

#[derive(Parser, Debug)]
#[command(about = "Whole runtimes, upgraded under faults, simulated over seeds")]
struct Args {
    #[command(flatten)]
    sweep: SweepArgs,
}

fn main() {
    let Args { sweep: args } = Args::parse();
    args.replay(run);
    let threads = args.threads();
    let (reports, failures, took) = corelane_bench::sweep(args.from, args.seeds, threads, |s| {
        run(s).map_err(|f| f.to_string())
    });
    // Per outcome: runs, connections, connections reset, simulated seconds.
    let mut by: BTreeMap<Outcome, (u64, u64, u64, f64)> = BTreeMap::new();
    // Per fault: runs, and how they ended.
    let mut faults: BTreeMap<Option<Fault>, BTreeMap<Outcome, u64>> = BTreeMap::new();
    for r in &reports {
        let e = by.entry(r.outcome).or_default();
        e.0 += 1;
        e.1 += r.connections as u64;
        e.2 += r.reset as u64;
        e.3 += r.simulated.as_secs_f64();
        let f = faults.entry(r.faults.first().copied()).or_default();
        *f.entry(r.outcome).or_default() += 1;
    }
    let rows: Vec<Vec<String>> = by
        .iter()
        .map(|(o, (n, c, reset, t))| {
            vec![
                format!("{o:?}"),
                n.to_string(),
                c.to_string(),
                reset.to_string(),
                format!("{:.1}", t / *n as f64),
            ]
        })
        .collect();
    let table = markdown_table(
        &[
            "how the run ended",
            "runs",
            "connections",
            "of them ended with an error (a process killed, or refused by a shutdown)",
            "simulated s per run",
        ],
        &rows,
    );
    let fault_rows: Vec<Vec<String>> = faults
        .iter()
        .map(|(f, outcomes)| {
            let ended: Vec<String> = outcomes.iter().map(|(o, n)| format!("{o:?} {n}")).collect();
            vec![
                f.map_or_else(|| "none".to_string(), |f| format!("{f:?}")),
                outcomes.values().sum::<u64>().to_string(),
                ended.join(", "),
            ]
        })
        .collect();
    let fault_table = markdown_table(&["fault injected", "runs", "how they ended"], &fault_rows);
    let summary = format!(
        "{} runs (seeds {}..{}), {} failed, {:.1} s on {threads} thread(s)",
        args.seeds,
        args.from,
        args.from + args.seeds,
        failures.len(),
        took.as_secs_f64()
    );
    println!("{summary}\n\n{table}\n{fault_table}");
    if let Some(out) = &args.out {
        let what = format!(
            "Two runtimes (the old and the new process of an upgrade: each a control plane and a \
             core running the runtime's own `Driver`, upgrade stages and the two sides' \
             machines) over one queue of the in-memory kernel and the in-memory XDP program, \
             which steers every frame by the maps the runtimes write; a peer host opens \
             connections to their echo server at seeded times throughout. In half the runs \
             without an upgrade the process is shut down gracefully under its connections. Virtual time: the \
             old process's 20 s wait for `joined` costs nothing. After every step no frame is \
             in two places across both ledgers, the kernel's rings and the exchange; at the end \
             every frame is in one place, every byte of every connection came back once and in \
             order (a connection may be reset only where a process was killed), and the program \
             has one generation and keeps no connection. Reproduce: `cargo run --release -p corelane-bench --bin runtime-sim -- --seeds {} \
             --out {}`.",
            args.seeds,
            out.display()
        );
        corelane_bench::write_sweep(
            out,
            "Whole runtimes upgraded under faults, simulated",
            &summary,
            threads,
            &what,
            &format!("{table}\n{fault_table}"),
        );
    }
    if !failures.is_empty() {
        std::process::exit(1);
    }
}
