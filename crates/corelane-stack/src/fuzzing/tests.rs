//! The fuzz targets in the test suite: the committed corpus and the fresh seeds replayed,
//! then a few thousand seeded mutations per target. A panic names the input's file.

use super::{Mutator, Target};

/// The committed corpus of `target` (what earlier runs saved, and the seeds as they were).
fn corpus(target: Target) -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target.name());
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd.flatten() {
            if let Ok(bytes) = std::fs::read(e.path()) {
                out.push((e.path().display().to_string(), bytes));
            }
        }
    }
    out.sort();
    out
}

/// Runs `input`; on a panic saves it under target/fuzz-failures and fails naming the file.
fn check(target: Target, input: &[u8], what: &str) {
    let r = std::panic::catch_unwind(|| target.run(input));
    if r.is_err() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-failures");
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!("{}-{:016x}.bin", target.name(), fnv(input)));
        let _ = std::fs::write(&path, input);
        panic!(
            "{} panicked on {what}; the input is saved as {} (replay: cargo run --release -p corelane-fuzz -- --replay {})",
            target.name(),
            path.display(),
            path.display()
        );
    }
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
    })
}

fn fuzz(target: Target, rounds: usize) {
    let committed = corpus(target);
    assert!(
        !committed.is_empty(),
        "no committed corpus for {} (write it: cargo run --release -p corelane-fuzz -- --write-seeds)",
        target.name()
    );
    for (name, input) in &committed {
        check(target, input, name);
    }
    let mut pool: Vec<Vec<u8>> = target.seeds();
    assert!(!pool.is_empty());
    for (k, s) in pool.iter().enumerate() {
        check(target, s, &format!("seed {k}"));
    }
    pool.extend(committed.into_iter().map(|(_, b)| b));
    let mut m = Mutator::new(0xc0ffee);
    for round in 0..rounds {
        let base = &pool[round % pool.len()];
        let other = &pool[(round * 7 + 3) % pool.len()];
        let input = m.mutate(target, base, other);
        check(
            target,
            &input,
            &format!("mutation {round} (Mutator::new(0xc0ffee))"),
        );
    }
}

#[test]
fn parsing_single_frames_never_panics() {
    fuzz(Target::Parse, 100_000);
}

#[test]
fn reassembling_fragment_sequences_never_panics_and_stays_within_limits() {
    fuzz(Target::Reassemble, 20_000);
}

#[test]
fn a_node_fed_mutated_sessions_never_panics_nor_sends_past_the_mtu() {
    fuzz(Target::Node, 3_000);
}

#[test]
fn a_recorded_session_replays_into_connections_that_carry_data() {
    // The seeds reach past the handshake: replayed into the node, the session opens both
    // connections (IPv4 and IPv6) and delivers their data, so mutations of it go deep.
    let seeds = Target::Node.seeds();
    let (accepted, echoed) = super::node(&seeds[0]);
    assert_eq!(accepted, 2, "connections opened by the replay");
    assert!(echoed >= 2 * 20_000 - 2 * 1448, "{echoed} bytes echoed");
}
