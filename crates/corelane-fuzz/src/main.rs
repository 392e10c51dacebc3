//! The protocol crate's fuzz targets (`corelane_stack::fuzzing`), and the stats file
//! `corelane-stat` reads (`stat`), run for as long as asked: a seeded structure-aware mutator
//! over the committed corpus and fresh seeds, every input checked for panics. Built with SanitizerCoverage (`scripts/fuzz-coverage.sh`, stable Rust), it is
//! coverage-guided: an input that takes an edge, or an edge a number of times, no input took
//! before joins the pool the mutator draws from, and `--found DIR` keeps those inputs to review
//! and commit into the corpus. A panicking input is saved under `target/fuzz-failures/` with
//! the command that replays it; once fixed, move it into
//! `crates/corelane-stack/fuzz/corpus/TARGET/` so the test suite replays it from then on.
//!
//! ```text
//! scripts/fuzz-coverage.sh --seconds 600                               # coverage-guided, every target
//! cargo run --release -p corelane-fuzz -- --seconds 600                # blind mutation
//! cargo run --release -p corelane-fuzz -- --target node --seconds 60 --seed 7
//! cargo run --release -p corelane-fuzz -- --replay target/fuzz-failures/node-....bin
//! cargo run --release -p corelane-fuzz -- --write-seeds                # refresh the corpus
//! ```
//!
//! Needs no privilege: everything runs in this process.

mod coverage;
mod quic;
mod stat;
mod words;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use corelane_stack::fuzzing::{Mutator, Target};

#[derive(Parser, Debug)]
#[command(about = "The protocol crate's fuzz targets, for as long as asked")]
struct Args {
    /// A target (parse, reassemble, node, stat, grant, upgrade-words, quic) or all.
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
    /// Coverage-guided runs: also write every input that found new coverage here, under
    /// TARGET/ (to review and commit into the corpus).
    #[arg(long)]
    found: Option<PathBuf>,
    /// In a coverage build, measure coverage but do not let it guide (to compare).
    #[arg(long)]
    blind: bool,
    /// In a coverage build: instead of fuzzing, reduce the committed corpus plus the inputs in
    /// DIR/TARGET (what `--found` kept) to a smallest-first subset taking the same edges, and
    /// write it as the committed corpus.
    #[arg(long)]
    minimize_with: Option<PathBuf>,
    /// Coverage-guided runs: fail unless at least this many edges were taken (CI's check that
    /// the instrumentation works).
    #[arg(long, default_value_t = 0)]
    min_edges: usize,
}

/// A fuzz target: one of the protocol crate's, the stats file `corelane-stat` reads, or one
/// of the line protocols between processes (`words`).
#[derive(Debug, Clone, Copy)]
enum Fuzz {
    Stack(Target),
    Stat,
    Words(words::Words),
    Quic,
}

impl Fuzz {
    fn all() -> Vec<Fuzz> {
        let mut v: Vec<Fuzz> = Target::ALL.into_iter().map(Fuzz::Stack).collect();
        v.push(Fuzz::Stat);
        v.push(Fuzz::Words(words::Words::Grant));
        v.push(Fuzz::Words(words::Words::Upgrade));
        v.push(Fuzz::Quic);
        v
    }

    fn from_name(name: &str) -> Option<Fuzz> {
        Fuzz::all().into_iter().find(|t| t.name() == name)
    }

    fn name(self) -> &'static str {
        match self {
            Fuzz::Stack(t) => t.name(),
            Fuzz::Stat => "stat",
            Fuzz::Words(w) => w.name(),
            Fuzz::Quic => "quic",
        }
    }

    fn run(self, input: &[u8]) {
        match self {
            Fuzz::Stack(t) => t.run(input),
            Fuzz::Stat => stat::run(input),
            Fuzz::Words(w) => w.run(input),
            Fuzz::Quic => quic::run(input),
        }
    }

    fn seeds(self) -> Vec<Vec<u8>> {
        match self {
            Fuzz::Stack(t) => t.seeds(),
            Fuzz::Stat => stat::seeds(),
            Fuzz::Words(w) => w.seeds(),
            Fuzz::Quic => quic::seeds(),
        }
    }

    fn mutate(
        self,
        m: &mut Mutator,
        r: &mut impl FnMut(usize) -> usize,
        base: &[u8],
        other: &[u8],
    ) -> Vec<u8> {
        match self {
            Fuzz::Stack(t) => m.mutate(t, base, other),
            Fuzz::Stat => stat::mutate(r, base, other),
            Fuzz::Words(w) => w.mutate(r, base, other),
            Fuzz::Quic => quic::mutate(r, base, other),
        }
    }
}

/// Set while a target runs: its panics are the findings, reported with their input.
static IN_TARGET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn corpus_dir(t: Fuzz) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    match t {
        Fuzz::Stack(t) => root.join("../corelane-stack/fuzz/corpus").join(t.name()),
        Fuzz::Stat | Fuzz::Words(_) | Fuzz::Quic => root.join("corpus").join(t.name()),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if let Some(path) = &args.replay {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let t = Fuzz::all()
            .into_iter()
            .find(|t| name.starts_with(t.name()))
            .or_else(|| Fuzz::from_name(&args.target))
            .ok_or("name the target with --target (the file name does not start with one)")?;
        let input = std::fs::read(path)?;
        t.run(&input);
        println!("{}: {} bytes ran without a panic", t.name(), input.len());
        return Ok(());
    }
    let targets: Vec<Fuzz> = if args.target == "all" {
        Fuzz::all()
    } else {
        vec![Fuzz::from_name(&args.target).ok_or(
            "unknown target: parse, reassemble, node, stat, grant, upgrade-words, quic or all",
        )?]
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
    if let Some(found) = &args.minimize_with {
        if !coverage::instrumented() {
            return Err(
                "--minimize-with needs a build with SanitizerCoverage (scripts/fuzz-coverage.sh)"
                    .into(),
            );
        }
        for t in targets {
            minimize(t, &found.join(t.name()))?;
        }
        return Ok(());
    }
    // A target's panics are reported here, with the input (the default hook would print each
    // twice); a panic of the driver itself is printed as usual.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !IN_TARGET.load(std::sync::atomic::Ordering::Relaxed) {
            default_hook(info);
        }
    }));
    let failures_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-failures");
    let mut failed = 0;
    for t in targets {
        let mut pool = t.seeds();
        if let Ok(rd) = std::fs::read_dir(corpus_dir(t)) {
            pool.extend(rd.flatten().filter_map(|e| std::fs::read(e.path()).ok()));
        }
        let mut m = Mutator::new(args.seed);
        let guided = coverage::instrumented() && !args.blind;
        let measured = coverage::instrumented();
        let mut seen = coverage::Seen::default();
        let pool_start = pool.len();
        if measured {
            seen.merge();
            for input in &pool {
                let _ = std::panic::catch_unwind(|| t.run(input));
            }
            seen.merge();
        }
        let baseline = seen.edges();
        let mut pick = args.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move |n: usize| {
            pick ^= pick << 13;
            pick ^= pick >> 7;
            pick ^= pick << 17;
            (pick % n.max(1) as u64) as usize
        };
        let (start, mut runs, mut panics) = (Instant::now(), 0u64, 0u64);
        while start.elapsed() < Duration::from_secs(args.seconds) {
            let base = next(pool.len());
            let other = next(pool.len());
            let input = t.mutate(&mut m, &mut next, &pool[base], &pool[other]);
            runs += 1;
            IN_TARGET.store(true, std::sync::atomic::Ordering::Relaxed);
            let outcome = std::panic::catch_unwind(|| t.run(&input));
            IN_TARGET.store(false, std::sync::atomic::Ordering::Relaxed);
            if measured && seen.merge() > 0 && guided {
                if let Some(dir) = &args.found {
                    let dir = dir.join(t.name());
                    std::fs::create_dir_all(&dir)?;
                    std::fs::write(
                        dir.join(format!("found-{:04}.bin", pool.len() - pool_start)),
                        &input,
                    )?;
                }
                pool.push(input.clone());
            }
            if outcome.is_err() {
                panics += 1;
                std::fs::create_dir_all(&failures_dir)?;
                let path = failures_dir.join(format!("{}-{runs:08}.bin", t.name()));
                std::fs::write(&path, &input)?;
                println!(
                    "{}: PANIC on run {runs}; saved {} (replay: cargo run --release -p corelane-fuzz -- --replay {})",
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
        if measured {
            println!(
                "{}: {}: edges taken {baseline} by the corpus -> {} of {}; {} inputs found new coverage (pool {} -> {})",
                t.name(),
                if guided {
                    "coverage-guided"
                } else {
                    "blind, coverage measured"
                },
                seen.edges(),
                coverage::edges(),
                pool.len() - pool_start,
                pool_start,
                pool.len()
            );
            if seen.edges() < args.min_edges {
                return Err(format!(
                    "{}: only {} edges taken (at least {} expected): is the instrumentation on?",
                    t.name(),
                    seen.edges(),
                    args.min_edges
                )
                .into());
            }
        } else if args.min_edges > 0 {
            return Err(
                "--min-edges needs a build with SanitizerCoverage (scripts/fuzz-coverage.sh)"
                    .into(),
            );
        }
        failed += panics;
    }
    stat::cleanup();
    if failed > 0 {
        return Err(format!("{failed} input(s) panicked").into());
    }
    Ok(())
}

/// Found inputs longer than this stay out of the committed corpus (it lives in the repository;
/// a long timed session mostly repeats what a short one covers).
const MAX_FOUND_LEN: usize = 4096;

/// Rewrites `t`'s committed corpus as the smallest-first subset of it and of the inputs in
/// `found` that takes every edge they take (hit counts aside: the corpus stays small).
fn minimize(t: Fuzz, found: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let dir = corpus_dir(t);
    let mut inputs: Vec<Vec<u8>> = Vec::new();
    for (d, cap) in [(dir.as_path(), usize::MAX), (found, MAX_FOUND_LEN)] {
        if let Ok(rd) = std::fs::read_dir(d) {
            inputs.extend(
                rd.flatten()
                    .filter_map(|e| std::fs::read(e.path()).ok())
                    .filter(|i| i.len() <= cap),
            );
        }
    }
    let before = inputs.len();
    inputs.sort_by_key(Vec::len);
    inputs.dedup();
    std::panic::set_hook(Box::new(|_| {}));
    let mut seen = coverage::Seen::default();
    seen.merge();
    let mut keep = Vec::new();
    for input in inputs {
        let _ = std::panic::catch_unwind(|| t.run(&input));
        if seen.merge_edges() > 0 {
            keep.push(input);
        }
    }
    std::fs::create_dir_all(&dir)?;
    for e in std::fs::read_dir(&dir)?.flatten() {
        std::fs::remove_file(e.path())?;
    }
    for (k, input) in keep.iter().enumerate() {
        std::fs::write(dir.join(format!("{k:04}.bin")), input)?;
    }
    println!(
        "{}: {before} inputs -> {} kept ({} bytes), {} edges, in {}",
        t.name(),
        keep.len(),
        keep.iter().map(Vec::len).sum::<usize>(),
        seen.edges(),
        dir.display()
    );
    Ok(())
}
