//! QUIC simulated over many seeds (`corelane_rt::quic::sim`): a client and a server of two
//! cores, each an endpoint's state over its own corelane stack, across a wire that delays,
//! loses, duplicates and reorders, with the client moving to a new port mid-transfer in three
//! runs in four. Prints every failure with the command that replays it, and a table of what
//! the runs did (to `--out`, Markdown).
//!
//! ```text
//! cargo run --release -p corelane-bench --bin quic-sim -- --seeds 100000
//! cargo run --release -p corelane-bench --bin quic-sim -- --seed 1234     # replay one
//! ```
//!
//! Needs no privilege: no device, no socket, no root.

use std::collections::BTreeMap;

use clap::Parser;
use corelane_bench::{SweepArgs, markdown_table};
use corelane_rt::quic::sim::run;

#[derive(Parser, Debug)]
#[command(about = "QUIC across a lossy, reordering wire and a client that moves, simulated")]
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
    for f in &failures {
        eprintln!("{f}");
    }
    // Per number of moves: runs, runs whose datagrams were handed to the other core,
    // datagrams so handed, bytes echoed, frames lost, duplicated, held back, simulated seconds.
    let mut by: BTreeMap<usize, [f64; 8]> = BTreeMap::new();
    for r in &reports {
        let e = by.entry(r.migrations).or_default();
        e[0] += 1.0;
        e[1] += f64::from(u8::from(r.steered > 0));
        e[2] += r.steered as f64;
        e[3] += r.bytes as f64;
        e[4] += r.lost as f64;
        e[5] += r.duplicated as f64;
        e[6] += r.reordered as f64;
        e[7] += r.took.as_secs_f64();
    }
    let rows: Vec<Vec<String>> = by
        .iter()
        .map(|(moves, e)| {
            let mut row = vec![moves.to_string()];
            row.extend(e[..7].iter().map(|v| format!("{v:.0}")));
            row.push(format!("{:.2}", e[7] / e[0]));
            row
        })
        .collect();
    let table = markdown_table(
        &[
            "client's moves",
            "runs",
            "runs handed between cores",
            "datagrams handed",
            "bytes echoed",
            "frames lost",
            "duplicated",
            "held back",
            "simulated s per run",
        ],
        &rows,
    );
    let summary = format!(
        "{} runs (seeds {}..{}), {} failed, {:.1} s on {threads} thread(s)",
        args.seeds,
        args.from,
        args.from + args.seeds,
        failures.len(),
        took.as_secs_f64()
    );
    println!("{summary}\n\n{table}");
    if let Some(out) = &args.out {
        let what = format!(
            "A QUIC client and a server of two cores, each core the endpoint state the runtime's \
             QUIC driver keeps (connection IDs naming their core) over its own corelane stack \
             (UDP socket, steering, the runtime's handoff rings between the cores), across a \
             wire that delays, loses (up to 5% each way), duplicates (up to 2%) and reorders \
             (up to 10%), and spreads the client's datagrams over the cores by a hash of their \
             addresses and ports. The client sends one to three streams of up to 96 KiB, each \
             echoed; in three runs in four it moves to a new port once or twice mid-transfer. \
             After every step the connection lives on one core and neither end lost it; at the \
             end every stream came back whole, no handoff was dropped and every frame is back. \
             Reproduce: `cargo run --release -p corelane-bench --bin quic-sim -- --seeds {} \
             --out {}`.",
            args.seeds,
            out.display()
        );
        corelane_bench::write_sweep(
            out,
            "QUIC across an impaired wire and a moving client, simulated",
            &summary,
            threads,
            &what,
            &table,
        );
    }
    if !failures.is_empty() {
        std::process::exit(1);
    }
}
