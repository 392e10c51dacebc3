//! An output pass shares one header template and one pacing rate among its data segments and
//! arms the loss probe's timer once: the frames on the wire must be the very frames that
//! segments working each out for themselves would send (sequence numbers, lengths, options,
//! checksums, order), through every impairment of the simulation, both directions, and through
//! deep reordering (a slice of the hold sweep).

use crate::sim::{Scenario, SimReport, hold_scenarios, run_scenario, scenarios};
use crate::tcp::output::{FROM_TEMPLATE, PER_SEGMENT};

fn run(s: &Scenario, seed: u64, per_segment: bool) -> SimReport {
    PER_SEGMENT.set(per_segment);
    let r = run_scenario(s, seed);
    PER_SEGMENT.set(false);
    r.unwrap_or_else(|e| panic!("{} seed {seed}: {e:?}", s.name))
}

#[test]
fn a_pass_sends_the_frames_each_segment_would_have_sent_alone() {
    let mut all = scenarios();
    all.extend(hold_scenarios(&[2, 16], &[5.0, 40.0]));
    let mut shared = 0;
    for s in &all {
        FROM_TEMPLATE.set(0);
        let pass = run(s, 7, false);
        shared += FROM_TEMPLATE.get();
        let alone = run(s, 7, true);
        for w in pass.wire {
            assert!(w.frames > 0 && w.digest != 0, "{}: {w:?}", s.name);
        }
        assert_eq!(pass, alone, "{}: the wire differs", s.name);
    }
    // The comparison is between two paths: most data segments came from a template.
    assert!(shared > 10_000, "{shared} segments from a template");
}

#[test]
fn the_digest_tells_two_runs_apart() -> Result<(), String> {
    let s = scenarios()
        .into_iter()
        .find(|s| s.name.ends_with("/loss-1%"))
        .ok_or("no lossy scenario")?;
    let (a, b) = (run(&s, 1, false), run(&s, 2, false));
    assert_ne!(a.wire[0].digest, b.wire[0].digest);
    assert_eq!(a, run(&s, 1, false), "a seed replays exactly");
    Ok(())
}
