//! The runtime simulation's seeds: 10,000 by default (`CORELANE_RUNTIME_SIM_SEEDS` changes
//! it), over the machine's cores.

use super::{Outcome, run};

#[test]
fn whole_runtimes_upgrade_through_every_fault_the_seeds_pick() {
    let seeds: u64 = std::env::var("CORELANE_RUNTIME_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let results: Vec<Vec<Result<super::Report, super::Failure>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| s.spawn(move || (t..seeds).step_by(threads as usize).map(run).collect()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut outcomes = std::collections::BTreeMap::new();
    let mut failures = Vec::new();
    for r in results.into_iter().flatten() {
        match r {
            Ok(r) => *outcomes.entry(r.outcome).or_insert(0u64) += 1,
            Err(f) => failures.push(f.to_string()),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {seeds} runs failed; the first: {:?}",
        failures.len(),
        failures.iter().take(5).collect::<Vec<_>>()
    );
    let total: u64 = outcomes.values().sum();
    assert_eq!(total, seeds, "every seed ran");
    if seeds >= 200 {
        for o in [
            Outcome::Upgraded,
            Outcome::CalledOff,
            Outcome::NotStarted,
            Outcome::TakenOver,
            Outcome::Drained,
        ] {
            assert!(
                outcomes.get(&o).is_some_and(|&n| n > 0),
                "no run ended {o:?} in {seeds}: {outcomes:?}"
            );
        }
    }
}
