//! The protocol crate's fuzz targets (`corelane_stack::fuzzing`) run for as long as asked: a
//! seeded mutator over the committed corpus and fresh seeds, every input checked for panics.
//! A panicking input is saved under `target/fuzz-failures/` with the command that replays it;
//! once fixed, move it into `crates/corelane-stack/fuzz/corpus/TARGET/` so the test suite
//! replays it from then on.
//!
//! ```text
//! cargo run --release -p corelane-bench --bin fuzz -- --seconds 600             # every target
//! cargo run --release -p corelane-bench --bin fuzz -- --target node --seconds 60 --seed 7
//! cargo run --release -p corelane-bench --bin fuzz -- --replay target/fuzz-failures/node-....bin
//! cargo run --release -p corelane-bench --bin fuzz -- --write-seeds             # refresh the corpus
//! ```
//!
//! Needs no privilege: everything runs in this process.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use corelane_stack::fuzzing::{Mutator, Target};

#[derive(Parser, Debug)]
#[command(about = "The protocol crate's fuzz targets, for as long as asked")]
struct Args {
    /// A target (parse, reassemble, node) or all.
    #[arg(long, default_value = "all")]
    target: String,
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// The mutator's seed (a run is reproducible from it).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Runs one saved input (its target from the file name's prefix) and reports.
    #[arg(long)]
    replay: Option<PathBuf>,
    /// Writes the seeds as the committed corpus and exits.
    #[arg(long)]
    write_seeds: bool,
}

fn corpus_dir(t: Target) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../corelane-stack/fuzz/corpus")
        .join(t.name())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if let Some(path) = &args.replay {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let t = Target::ALL
            .into_iter()
            .find(|t| name.starts_with(t.name()))
            .or_else(|| Target::from_name(&args.target))
            .ok_or("name the target with --target (the file name does not start with one)")?;
        let input = std::fs::read(path)?;
        t.run(&input);
        println!("{}: {} bytes ran without a panic", t.name(), input.len());
        return Ok(());
    }
    let targets: Vec<Target> = if args.target == "all" {
        Target::ALL.to_vec()
    } else {
        vec![
            Target::from_name(&args.target)
                .ok_or("unknown target: parse, reassemble, node or all")?,
        ]
    };
    if args.write_seeds {
        for t in targets {
            let dir = corpus_dir(t);
            std::fs::create_dir_all(&dir)?;
            for (k, s) in t.seeds().iter().enumerate() {
                std::fs::write(dir.join(format!("seed-{k:02}.bin")), s)?;
            }
            println!("{}: seeds written to {}", t.name(), dir.display());
        }
        return Ok(());
    }
    // The panics are reported here, with the input; the default hook would print each twice.
    std::panic::set_hook(Box::new(|_| {}));
    let failures_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-failures");
    let mut failed = 0;
    for t in targets {
        let mut pool = t.seeds();
        if let Ok(rd) = std::fs::read_dir(corpus_dir(t)) {
            pool.extend(rd.flatten().filter_map(|e| std::fs::read(e.path()).ok()));
        }
        let mut m = Mutator::new(args.seed);
        let (start, mut runs, mut panics) = (Instant::now(), 0u64, 0u64);
        while start.elapsed() < Duration::from_secs(args.seconds) {
            let base = &pool[(runs as usize) % pool.len()];
            let other = &pool[(runs as usize * 7 + 3) % pool.len()];
            let input = m.mutate(t, base, other);
            runs += 1;
            if std::panic::catch_unwind(|| t.run(&input)).is_err() {
                panics += 1;
                std::fs::create_dir_all(&failures_dir)?;
                let path = failures_dir.join(format!("{}-{runs:08}.bin", t.name()));
                std::fs::write(&path, &input)?;
                println!(
                    "{}: PANIC on run {runs}; saved {} (replay: cargo run --release -p corelane-bench --bin fuzz -- --replay {})",
                    t.name(),
                    path.display(),
                    path.display()
                );
            }
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{}: {runs} inputs in {secs:.0} s ({:.0}/s), {panics} panicked",
            t.name(),
            runs as f64 / secs.max(1e-9)
        );
        failed += panics;
    }
    if failed > 0 {
        return Err(format!("{failed} input(s) panicked").into());
    }
    Ok(())
}
