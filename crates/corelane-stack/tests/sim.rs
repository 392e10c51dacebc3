//! The deterministic simulation's fixed slice: every scenario (a bidirectional workload through
//! an impaired path) with a fixed set of seeds, every invariant checked after every step. The
//! long sweep is `cargo run --release -p corelane-bench --bin sim -- --seeds 100000`.

use corelane_stack::sim::{Impair, SimConfig, hold_scenarios, run_scenario, run_with, scenarios};

/// Seeds per scenario here: 180 x 56 scenarios = 10,080 runs, about a minute and a half in
/// release mode on two cores. `CORELANE_SIM_SEEDS` sets another count (the checked-profile
/// run in CI takes fewer: its overflow checks make each run slower).
const SEEDS: u64 = 180;

fn seeds() -> u64 {
    std::env::var("CORELANE_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SEEDS)
}

#[test]
fn every_scenario_keeps_its_invariants_over_a_fixed_set_of_seeds() {
    let seeds = seeds();
    let all = scenarios();
    let jobs: Vec<(usize, u64)> = (0..all.len())
        .flat_map(|i| (0..seeds).map(move |seed| (i, seed)))
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&(i, seed)) = jobs.get(k) else {
                        break;
                    };
                    if let Err(f) = run_scenario(&all[i], seed) {
                        failures.lock().unwrap().push(f.to_string());
                    }
                }
            });
        }
    });
    let runs = jobs.len();
    let failures = failures.into_inner().unwrap();
    assert!(runs as u64 >= 50 * seeds, "{runs} runs");
    assert!(
        failures.is_empty(),
        "{} of {runs} runs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    println!("{runs} runs of {} scenarios passed", all.len());
}

/// The reordering sweep's slice (the whole sweep: `cargo run --release -p corelane-bench --bin
/// sim -- --hold-depths 1,2,4,8,16`): every shape through a lossless path holding 5% and 40%
/// of the frames behind 1, 4 and 16 later ones. Every run keeps its invariants (the stall
/// limit of a path that loses nothing among them), and none ever waits for the retransmission
/// timer: however deep the reordering, a held segment is found by ACKs, probes and the
/// reordering timer, or not needed at all.
#[test]
fn the_reordering_sweep_keeps_its_invariants_and_never_times_out() {
    let all = hold_scenarios(&[1, 4, 16], &[5.0, 40.0]);
    assert_eq!(all.len(), 4 * 7);
    let (mut failures, mut rtos, mut undos) = (Vec::new(), 0, 0);
    for s in &all {
        for seed in 0..seeds().min(12) {
            match run_scenario(s, seed) {
                Ok(r) => {
                    rtos += r.rtos;
                    undos += r.undos;
                    assert_eq!(r.wire[0].lost + r.wire[1].lost, 0);
                }
                Err(f) => failures.push(f.to_string()),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(rtos, 0, "timeouts on a path that loses nothing");
    assert!(
        undos > 0,
        "no recovery was found spurious on a path that loses nothing"
    );
}

#[test]
fn a_seed_replays_exactly() {
    let s = scenarios()
        .into_iter()
        .find(|s| s.name == "bulk-both/mix")
        .expect("the scenario exists");
    let a = run_scenario(&s, 42).expect("the run passes");
    let b = run_scenario(&s, 42).expect("the run passes");
    assert_eq!(a, b);
    let c = run_scenario(&s, 43).expect("the run passes");
    assert_ne!(a.wire, c.wire, "another seed, another run");
    // The mix of impairments happened, both ways.
    for w in a.wire {
        assert!(w.lost > 0 && w.duplicated > 0 && w.reordered > 0, "{w:?}");
    }
}

#[test]
fn data_segments_carrying_sack_blocks_stay_within_the_mtu() {
    // Heavy loss both ways while both sides send full-size segments: most data segments carry
    // SACK blocks for the other direction's holes. The run fails on any frame over the MTU.
    let s = scenarios()
        .into_iter()
        .find(|s| s.name == "bulk-both/loss-5%")
        .expect("the scenario exists");
    for seed in 100..110 {
        let r = run_scenario(&s, seed).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(r.oversize, 0);
        let longest = r.wire[0].longest.max(r.wire[1].longest);
        assert_eq!(longest, 1514, "full-size frames were sent, none longer");
    }
}

#[test]
fn a_stall_past_the_limit_fails_the_run_with_its_seed() {
    // A path that loses every data segment from the server (its ARP answers, handshake and
    // ACKs pass): the connections open and nothing is ever delivered back.
    let s = scenarios()
        .into_iter()
        .find(|s| s.name == "echo/clean")
        .expect("the scenario exists");
    let cfg = SimConfig {
        down: Impair {
            data_loss_ppm: 1_000_000,
            ..Impair::delay_ms(1)
        },
        ..SimConfig::new(5, s.up, s.down)
    };
    let f = run_with(&s, &cfg).expect_err("nothing can be delivered");
    assert_eq!(f.seed, 5);
    assert!(f.what.contains("stalled"), "{}", f.what);
    assert!(
        f.to_string().contains("--scenario echo/clean --seed 5"),
        "{f}"
    );
}

/// Seeds that found faults on paths that lose nothing, each replayed: on such a path no
/// timeout has anything to recover, so the run must finish within its round-trip bound
/// (`SimConfig::lossless_limit`) rather than after a 200 ms timer or a 1 s SYN timeout.
#[test]
fn runs_that_once_waited_for_a_timer_with_nothing_lost_finish_in_round_trips() {
    for (name, seed, fault) in [
        // A window update overtaken by the older, smaller window it replaced: the server
        // took the stale window and waited 200 ms for its persist timer.
        (
            "echo/short-reorder-20%",
            9_000_015,
            "a stale window taken as new",
        ),
        // The client took a port it had just closed: the server still held the last
        // incarnation in TIME-WAIT and ignored the new SYN, which waited 1 s to be sent again.
        (
            "churn/short-reorder-20%",
            9_000_056,
            "a port reused at once",
        ),
    ] {
        let s = scenarios()
            .into_iter()
            .find(|s| s.name == name)
            .expect("the scenario exists");
        let cfg = SimConfig::new(seed, s.up, s.down);
        let limit = cfg.lossless_limit().expect("the path loses nothing");
        let r = run_with(&s, &cfg).unwrap_or_else(|f| panic!("{fault}: {f}"));
        assert!(
            r.elapsed < limit * 4 && r.worst_stall <= limit,
            "{fault}: {r:?}"
        );
    }
}
