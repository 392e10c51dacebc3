//! Seed sweeps of the simulations (`runtime-sim`, `upgrade-sim`, `quic-sim`, `sim`): their
//! common arguments, the sweep over threads, and the results file.

use std::path::Path;

/// What a seed sweep's program takes (`runtime-sim`, `upgrade-sim`, `quic-sim`): flattened
/// into its own arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct SweepArgs {
    /// Runs one seed and prints its report (a replay).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seeds.
    #[arg(long, default_value_t = 10_000)]
    pub seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    pub from: u64,
    /// Threads (default: the machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Writes the table here (Markdown).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

impl SweepArgs {
    /// The threads to sweep on.
    pub fn threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// With `--seed`: runs it, prints its report, and ends the process (status 1 when it
    /// failed, its failure printed). Without: nothing.
    pub fn replay<R: std::fmt::Debug, E: std::fmt::Display>(
        &self,
        run: impl FnOnce(u64) -> Result<R, E>,
    ) {
        let Some(seed) = self.seed else {
            return;
        };
        match run(seed) {
            Ok(r) => {
                println!("{r:#?}");
                std::process::exit(0);
            }
            Err(f) => {
                eprintln!("{f}");
                std::process::exit(1);
            }
        }
    }
}

/// Runs `run` for each seed of `from..from + seeds` on `threads` threads, each failure printed
/// as it comes. Returns the reports (in no order), the failures and the time taken.
pub fn sweep<R: Send>(
    from: u64,
    seeds: u64,
    threads: usize,
    run: impl Fn(u64) -> Result<R, String> + Sync,
) -> (Vec<R>, Vec<String>, std::time::Duration) {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};
    let next = AtomicU64::new(from);
    let end = from + seeds;
    let reports: Mutex<Vec<R>> = Mutex::new(Vec::new());
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let started = std::time::Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end {
                        break;
                    }
                    match run(seed) {
                        Ok(r) => reports.lock().unwrap_or_else(|p| p.into_inner()).push(r),
                        Err(f) => {
                            eprintln!("{f}");
                            failures.lock().unwrap_or_else(|p| p.into_inner()).push(f);
                        }
                    }
                }
            });
        }
    });
    (
        reports.into_inner().unwrap_or_else(|p| p.into_inner()),
        failures.into_inner().unwrap_or_else(|p| p.into_inner()),
        started.elapsed(),
    )
}

/// The commit checked out (short), and the CPU's model name, for a results file's header.
pub fn commit_and_cpu() -> (String, String) {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(
            || "unknown".to_string(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_string(),
        );
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    (commit, cpu)
}

/// Writes a sweep's results file: `# {title}: {summary}`, the commit and CPU it was measured
/// at, what the runs do, the command that reproduces it, and the tables. Exits with an error
/// when it cannot be written.
pub fn write_sweep(
    out: &Path,
    title: &str,
    summary: &str,
    threads: usize,
    what: &str,
    tables: &str,
) {
    let (commit, cpu) = commit_and_cpu();
    let text = format!(
        "# {title}: {summary}\n\nMeasured at commit `{commit}` on {threads} core(s) of {cpu}.\n\n\
         {what}\n\nA failing seed prints the command that replays it.\n\n{tables}"
    );
    if let Err(e) = std::fs::write(out, text) {
        eprintln!("{}: {e}", out.display());
        std::process::exit(1);
    }
}
