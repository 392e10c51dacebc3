//! What the old process tells the new one besides the hand-over, written and read back.

use super::{Extras, RunSecret};

#[test]
fn the_secret_the_generation_the_ports_and_the_queues_travel_whole() {
    let channels = corelane_xsk::Channels {
        rx: 0,
        tx: 0,
        combined: 4,
        max_rx: 0,
        max_tx: 0,
        max_combined: 8,
    };
    let e = Extras {
        secret: RunSecret::Key([0xdead_beef_0123_4567, 0x0fed_cba9_8765_4321]),
        generation: 1,
        channels: Some(channels),
        ports: vec![7, 443],
    };
    let back = Extras::parse(&e.to_text()).expect("its own text");
    assert_eq!(
        (back.secret, back.generation, back.channels, back.ports),
        (e.secret, 1, Some(channels), vec![7, 443])
    );
    let none = Extras {
        secret: RunSecret::Seed(1),
        generation: 0,
        channels: None,
        ports: Vec::new(),
    };
    let back = Extras::parse(&none.to_text()).expect("its own text");
    assert_eq!(
        (back.secret, back.channels, back.ports),
        (RunSecret::Seed(1), None, Vec::new())
    );
}

#[test]
fn a_garbled_or_foreign_message_is_refused() {
    for bad in [
        "",
        "joined",
        "error the cores did not offer",
        "runtime seed zz generation 1 ports -",
        "runtime seed 1 generation 2 ports -",
        "runtime seed 1 generation 1",
        "runtime seed 1 generation 1 ports 7,x",
        "runtime seed 1 generation 1 ports 70000",
        "runtime seed 1 generation 1 ports - channels 1 2 3",
        "runtime seed 1 generation 1 ports - channels 1 2 3 4 5 6 7",
        "runtime seed 1 generation 1 ports - queues 4",
        "runtime key 0123 generation 1 ports -",
        "runtime key 0123456789abcdef0123456789abcdeg generation 1 ports -",
        "runtime pepper 1 generation 1 ports -",
    ] {
        assert!(Extras::parse(bad).is_none(), "accepted `{bad}`");
    }
}
