//! What the two processes of an upgrade say, written and read back.

use super::{Extras, RunSecret, Word};

#[test]
fn every_word_reads_back_as_written_and_anything_else_is_other() {
    for w in [
        Word::Joined,
        Word::Switched,
        Word::Error("the application does not listen on [7]".into()),
        Word::Error(String::new()),
        Word::Other("ready".into()),
    ] {
        assert_eq!(Word::parse(&w.to_text()), w, "{w:?}");
    }
    // What another version may say is never taken for one of the words acted on.
    for t in ["Joined", "joined ", " switched", "switch", "errors", ""] {
        assert_eq!(Word::parse(t), Word::Other(t.to_string()), "{t:?}");
    }
    // Arbitrary text (seeded): read without a panic, and written back as it came unless it
    // is a word.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..2000 {
        let len = (x % 24) as usize;
        let t: String = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b" aeijnorsdtwchxl"[(x % 16) as usize])
            })
            .collect();
        let w = Word::parse(&t);
        match &w {
            Word::Other(o) => assert_eq!(o, &t),
            Word::Error(why) => assert_eq!(format!("error {why}").trim_end(), t.trim_end()),
            Word::Joined | Word::Switched => assert_eq!(w.to_text(), t),
        }
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    }
}

#[test]
fn the_secret_the_generation_the_ports_and_the_queues_travel_whole() {
    let channels = crate::host::data::Channels {
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
