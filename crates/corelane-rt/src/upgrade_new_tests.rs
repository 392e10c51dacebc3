//! The new process's side of an upgrade in virtual time, without root: its deadlines and what
//! it does when the old process dies (the whole-runtime simulation runs it among everything
//! else; these pin each decision down).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::host::mem::MemProgram;
use corelane_stack::smoltcp::wire::{IpCidr, Ipv4Address};

use super::{DEATH_WAIT, NewSide};
use crate::clock::Clock;
use crate::control::Shared;
use crate::host::{Heard, Talk};
use crate::sim::SimProcess;
use crate::sim::talk::{self, MemTalk};
use crate::upgrade_new::LISTEN_WAIT;
use crate::upgrade_words::Word;
use crate::upgrade_words::{Extras, RunSecret};

struct Setup {
    clock: Clock,
    program: MemProgram,
    shared: Arc<Shared>,
    extras: Extras,
    old: MemTalk,
    new: MemTalk,
    old_gone: Arc<AtomicBool>,
}

fn setup() -> Setup {
    let clock = Clock::virtual_clock();
    let program = MemProgram::new();
    let addr = IpCidr::new(Ipv4Address::new(10, 78, 0, 2).into(), 24);
    let shared = crate::sim::process::shared(&program, addr, &clock).expect("a control plane");
    let old_gone = Arc::new(AtomicBool::new(false));
    *crate::lock::lock(&shared.upgrades.partner_process) =
        Some(Box::new(SimProcess(old_gone.clone())));
    shared.upgrades.start_listing(1);
    let (old, new) = talk::pair(&clock, [Duration::ZERO; 2], [false; 2]);
    Setup {
        clock,
        program,
        shared,
        extras: Extras {
            secret: RunSecret::Seed(1),
            generation: 1,
            channels: None,
            ports: vec![7],
        },
        old,
        new,
        old_gone,
    }
}

#[test]
fn an_application_that_never_listens_where_the_old_one_did_calls_the_upgrade_off() {
    let mut s = setup();
    let mut side = NewSide::Listening {
        since: s.clock.now(),
    };
    side.poll(&s.shared, &s.extras, &mut s.new, s.clock.now());
    assert!(
        matches!(side, NewSide::Listening { .. }),
        "it waits: {side:?}"
    );
    s.clock.advance(LISTEN_WAIT - Duration::from_millis(1));
    side.poll(&s.shared, &s.extras, &mut s.new, s.clock.now());
    assert!(matches!(side, NewSide::Listening { .. }), "still: {side:?}");
    assert_eq!(
        s.old.hear(),
        Heard::Nothing,
        "no `joined` for a port nobody listens on"
    );
    s.clock.advance(Duration::from_millis(2));
    side.poll(&s.shared, &s.extras, &mut s.new, s.clock.now());
    assert_eq!(side, NewSide::StoodDown);
    match s.old.hear() {
        Heard::Word(Word::Error(why)) => assert!(why.contains("[7]"), "{why}"),
        other => panic!("the old process heard {other:?}"),
    }
    assert!(s.shared.upgrades.stand_down.load(Ordering::Acquire));
}

#[test]
fn an_application_listening_in_time_is_joined_and_switched_to() {
    let mut s = setup();
    let mut side = NewSide::Listening {
        since: s.clock.now(),
    };
    *crate::lock::lock(&s.shared.upgrades.listening) = vec![vec![7]];
    side.poll(&s.shared, &s.extras, &mut s.new, s.clock.now());
    assert_eq!(side, NewSide::AwaitingSwitch);
    assert_eq!(s.old.hear(), Heard::Word(Word::Joined));
    // Words heard twice and others are ignored; `switched` moves it on.
    s.old.say(&Word::Other("something".into())).unwrap();
    s.old.say(&Word::Switched).unwrap();
    s.old.say(&Word::Switched).unwrap();
    side.poll(&s.shared, &s.extras, &mut s.new, s.clock.now());
    assert_eq!(side, NewSide::AwaitingSwitch);
    side.poll(&s.shared, &s.extras, &mut s.new, s.clock.now());
    assert_eq!(side, NewSide::Serving);
    side.poll(&s.shared, &s.extras, &mut s.new, s.clock.now());
    assert_eq!(side, NewSide::Serving, "the old process drains meanwhile");
    // The old process leaves and exits: the split ends, and nothing is taken back.
    s.old.close();
    side.poll(&s.shared, &s.extras, &mut s.new, s.clock.now());
    assert!(matches!(side, NewSide::Watching { .. }), "{side:?}");
    assert_eq!(s.program.upgrade(), (1, false));
    s.clock.advance(DEATH_WAIT + Duration::from_millis(1));
    side.poll(&s.shared, &s.extras, &mut s.new, s.clock.now());
    assert_eq!(side, NewSide::Ended);
    assert!(!s.shared.upgrades.old_died.load(Ordering::Acquire));
}

#[test]
fn an_old_process_that_dies_before_the_switch_is_taken_over_from() {
    let mut s = setup();
    let mut side = NewSide::AwaitingSwitch;
    s.old.close();
    side.poll(&s.shared, &s.extras, &mut s.new, s.clock.now());
    assert!(matches!(side, NewSide::OldGone { .. }), "{side:?}");
    assert_eq!(
        s.program.upgrade(),
        (0, false),
        "not yet: only its connection ended"
    );
    s.old_gone.store(true, Ordering::Release);
    side.poll(&s.shared, &s.extras, &mut s.new, s.clock.now());
    assert_eq!(side, NewSide::Ended);
    assert_eq!(s.program.upgrade(), (1, false), "every frame comes here");
    assert!(s.shared.upgrades.old_died.load(Ordering::Acquire));
    assert!(!s.shared.upgrades.stand_down.load(Ordering::Acquire));
}

#[test]
fn a_connection_that_ends_while_the_old_process_lives_is_a_call_off() {
    let mut s = setup();
    let mut side = NewSide::AwaitingSwitch;
    s.old.close();
    side.poll(&s.shared, &s.extras, &mut s.new, s.clock.now());
    s.clock.advance(DEATH_WAIT + Duration::from_millis(1));
    side.poll(&s.shared, &s.extras, &mut s.new, s.clock.now());
    assert_eq!(side, NewSide::StoodDown);
    assert!(s.shared.upgrades.stand_down.load(Ordering::Acquire));
    assert_eq!(
        s.program.upgrade(),
        (0, false),
        "the program stays the old process's"
    );
}

#[test]
fn an_error_from_the_old_process_is_a_call_off_at_once() {
    let mut s = setup();
    let mut side = NewSide::AwaitingSwitch;
    s.old
        .say(&Word::Error("the new process did not say it joined".into()))
        .unwrap();
    side.poll(&s.shared, &s.extras, &mut s.new, s.clock.now());
    assert_eq!(side, NewSide::StoodDown);
}
