//! The QUIC simulation's seeds: 10,000 by default (`CORELANE_QUIC_SIM_SEEDS` changes it), and
//! the sweep must have covered what it claims: moves that landed on the other core and were
//! handed over, connections on both cores, every impairment.

use super::*;

#[test]
fn quic_through_every_impairment_and_port_move_the_seeds_pick() {
    let seeds: u64 = std::env::var("CORELANE_QUIC_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let (mut steered_runs, mut moved_runs, mut homes) = (0u64, 0u64, [0u64; 2]);
    let (mut lost, mut dup, mut reordered, mut bytes) = (0u64, 0u64, 0u64, 0u64);
    let mut timed_out = 0u64;
    for seed in 0..seeds {
        let r = run(seed).unwrap_or_else(|f| panic!("{f}"));
        moved_runs += u64::from(r.migrations > 0);
        steered_runs += u64::from(r.steered > 0);
        homes[r.home] += 1;
        lost += r.lost;
        dup += r.duplicated;
        reordered += r.reordered;
        bytes += r.bytes;
        timed_out += u64::from(r.server_end.contains("timed out"));
    }
    eprintln!(
        "quic sim: {seeds} seeds, {bytes} bytes echoed, {moved_runs} runs moved ({steered_runs} \
         steered), homes {homes:?}, frames lost {lost}, duplicated {dup}, reordered {reordered}, \
         {timed_out} servers saw only their idle timeout"
    );
    if seeds >= 100 {
        assert!(steered_runs > 0, "some move landed on the other core");
        assert!(
            homes[0] > 0 && homes[1] > 0,
            "connections on both cores: {homes:?}"
        );
        assert!(lost > 0 && dup > 0 && reordered > 0);
    }
}

#[test]
fn a_seed_replays_what_it_draws() {
    let (a, b) = (run(42), run(42));
    let (a, b) = (a.map_err(|f| f.to_string()), b.map_err(|f| f.to_string()));
    let (a, b) = (a.unwrap_or_default(), b.unwrap_or_default());
    assert_eq!(
        (a.frames, a.lost, a.migrations, a.steered, a.home, a.took),
        (b.frames, b.lost, b.migrations, b.steered, b.home, b.took)
    );
    assert!(a.frames > 0);
}
