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
    // Runs whose wire only marked CE: how many, how many CE marks, congestion events; and
    // runs whose wire did nothing at all: their congestion events.
    let (mut ce_runs, mut ce_marks, mut ce_events, mut clean_events) = (0u64, 0u64, 0u64, 0u64);
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
        if r.clean && r.ce_marked > 0 {
            ce_runs += 1;
            ce_marks += r.ce_marked;
            ce_events += r.congestion_events;
        } else if r.clean {
            clean_events += r.congestion_events;
        }
    }
    eprintln!(
        "quic sim: {seeds} seeds, {bytes} bytes echoed, {moved_runs} runs moved ({steered_runs} \
         steered), homes {homes:?}, frames lost {lost}, duplicated {dup}, reordered {reordered}, \
         {timed_out} servers saw only their idle timeout; {ce_runs} runs only marked CE \
         ({ce_marks} marks, {ce_events} congestion events), clean runs' congestion events \
         {clean_events}"
    );
    // Nothing on a clean wire looks like congestion; a CE mark does, once the receiver has
    // read it off the frame and reported it (ECN counts in its ACKs) and the sender reacted.
    assert_eq!(clean_events, 0, "no congestion on a clean wire");
    if seeds >= 100 {
        assert!(steered_runs > 0, "some move landed on the other core");
        assert!(
            homes[0] > 0 && homes[1] > 0,
            "connections on both cores: {homes:?}"
        );
        assert!(lost > 0 && dup > 0 && reordered > 0);
        assert!(
            ce_runs > 0 && ce_events > 0,
            "CE marks were read and answered"
        );
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
