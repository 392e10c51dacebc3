//! The upgrade of one queue simulated over many seeds (`corelane_xsk::sim::upgrade`): the old
//! and the new process's queues on the in-memory kernel, each step chosen by the seed, with a
//! call-off or an end of the new process injected at every stage, and every frame checked to
//! be in at most one place after every step. Prints every failure with the command that
//! replays it, and a table of what the runs did (to `--out`, Markdown).
//!
//! ```text
//! cargo run --release -p corelane-bench --bin upgrade-sim -- --seeds 100000
//! cargo run --release -p corelane-bench --bin upgrade-sim -- --seed 1234     # replay one
//! ```
//!
//! Needs no privilege: no device, no socket, no root.

use std::collections::BTreeMap;

use clap::Parser;
use corelane_bench::{SweepArgs, markdown_table};
use corelane_xsk::sim::upgrade::{Outcome, run};

#[derive(Parser, Debug)]
#[command(about = "The upgrade of a queue simulated over seeds")]
struct Args {
    #[command(flatten)]
    sweep: SweepArgs,
    /// Steps per run before the upgrade is settled.
    #[arg(long, default_value_t = 300)]
    steps: usize,
}

fn main() {
    let Args { sweep: args, steps } = Args::parse();
    args.replay(|seed| run(seed, steps));
    let threads = args.threads();
    let end = args.from + args.seeds;
    let (reports, failures, took) = corelane_bench::sweep(args.from, args.seeds, threads, |seed| {
        run(seed, steps).map_err(|f| f.to_string())
    });
    // Per outcome: runs, runs with a call-off first, requests delivered and answered.
    let mut by: BTreeMap<Outcome, (u64, u64, u64, u64)> = BTreeMap::new();
    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    for r in &reports {
        let e = by.entry(r.outcome).or_default();
        e.0 += 1;
        e.1 += u64::from(r.call_offs > 0);
        e.2 += r.delivered as u64;
        e.3 += r.echoed as u64;
        for f in &r.faults {
            *faults.entry(f).or_default() += 1;
        }
    }
    let rows: Vec<Vec<String>> = by
        .iter()
        .map(|(o, (n, off, d, e))| {
            vec![
                format!("{o:?}"),
                n.to_string(),
                off.to_string(),
                d.to_string(),
                e.to_string(),
            ]
        })
        .collect();
    let table = markdown_table(
        &[
            "how the run ended",
            "runs",
            "of them with a call-off first",
            "requests delivered",
            "answered",
        ],
        &rows,
    );
    let fault_rows: Vec<Vec<String>> = faults
        .iter()
        .map(|(f, n)| vec![f.to_string(), n.to_string()])
        .collect();
    let fault_table = markdown_table(&["fault or move injected", "times"], &fault_rows);
    let summary = format!(
        "{} runs (seeds {}..{}), {} failed, {:.1} s on {threads} thread(s)",
        args.seeds,
        args.from,
        end,
        failures.len(),
        took.as_secs_f64()
    );
    println!("{summary}\n\n{table}\n{fault_table}");
    if let Some(out) = &args.out {
        let what = format!(
            "The old and the new process's queues (`XskQueue`, the code the runtime runs) on \
             the in-memory kernel of `crates/corelane-xsk/src/socket/sim.rs`, each step chosen \
             by the seed: requests delivered, a turn of either process, the upgrade's next move \
             (offer, bind, ask, take over, switch, leave) or a fault (a call-off by the old \
             process at every stage, the new process standing down, giving up before its cores \
             start, its queue ending, a crash). After every step every frame is in at most one \
             place across both ledgers, the exchange's rings and the kernel's rings, and every \
             answer on the wire is a request delivered, once, its bytes intact; at the end \
             every frame is in exactly one place and the survivor answers a last batch. Reproduce: `cargo run --release -p corelane-bench --bin upgrade-sim -- --seeds {} \
             --out {}`.",
            args.seeds,
            out.display()
        );
        corelane_bench::write_sweep(
            out,
            "The upgrade of a queue, simulated",
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
