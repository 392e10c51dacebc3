//! The old process's side of an upgrade in virtual time, without root: a stage the cores do
//! is stood in for here (the whole-runtime simulation runs the cores' own part).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::host::mem::{MemProgram, SimKernel, XskConfig, XskQueue};
use corelane_stack::smoltcp::wire::{IpCidr, Ipv4Address};

use super::OldSide;
use crate::clock::Clock;
use crate::control::Shared;
use crate::host::{Heard, Talk};
use crate::lock::lock;
use crate::queues::RestoreQueues;
use crate::sim::talk::{self, MemTalk};
use crate::upgrade::{JOIN_WAIT, Stage};
use crate::upgrade_old::OldRun;
use crate::upgrade_words::RunSecret;
use crate::upgrade_words::Word;

struct Setup {
    clock: Clock,
    shared: Arc<Shared>,
    restore: RestoreQueues,
    queue: XskQueue,
    old: MemTalk,
    new: MemTalk,
}

fn setup() -> Setup {
    let clock = Clock::virtual_clock();
    let program = MemProgram::new();
    let addr = IpCidr::new(Ipv4Address::new(10, 78, 0, 2).into(), 24);
    let shared = crate::sim::process::shared(&program, addr, &clock).expect("a control plane");
    let config = XskConfig {
        frames: 64,
        frame_size: 2048,
        ring_size: 16,
        ..XskConfig::default()
    };
    let (_kernel, queue) = SimKernel::open(&config).expect("an in-memory queue");
    let (old, new) = talk::pair(&clock, [Duration::ZERO; 2], [false; 2]);
    Setup {
        clock,
        shared,
        restore: RestoreQueues::new("sim0", None, None),
        queue,
        old,
        new,
    }
}

impl Setup {
    /// The one core does the stage asked, as `CoreUpgrade::turn` does, listening on `ports`.
    fn core_turn(&mut self, ports: &[u16]) {
        let up = &self.shared.upgrades;
        if up.listing.load(Ordering::Acquire) {
            lock(&up.listening)[0] = ports.to_vec();
        }
        if up.stage() == Stage::Offer && lock(&up.offers)[0].is_none() {
            lock(&up.offers)[0] = Some(self.queue.offer_upgrade().map_err(|e| e.to_string()));
            up.done.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn poll(&mut self, side: &mut OldSide) {
        let run = OldRun {
            shared: &self.shared,
            secret: RunSecret::Seed(3),
            grace: Duration::from_secs(1),
            restore: &self.restore,
        };
        side.poll(&run, &mut self.old, self.clock.now());
    }

    fn start(&mut self) -> OldSide {
        let run = OldRun {
            shared: &self.shared,
            secret: RunSecret::Seed(3),
            grace: Duration::from_secs(1),
            restore: &self.restore,
        };
        OldSide::start(&run, self.clock.now())
    }
}

#[test]
fn a_new_process_that_never_says_joined_is_called_off_after_the_wait_and_told_why() {
    let mut s = setup();
    let mut side = s.start();
    s.core_turn(&[7]);
    s.poll(&mut side);
    assert!(matches!(side, OldSide::AwaitingJoin { .. }), "{side:?}");
    let (offers, extras) = s.new.take_handover().expect("the hand-over");
    assert_eq!(offers.len(), 1);
    assert!(extras.contains("ports 7"), "{extras}");
    s.clock.advance(JOIN_WAIT - Duration::from_millis(1));
    s.poll(&mut side);
    assert!(
        matches!(side, OldSide::AwaitingJoin { .. }),
        "it waits: {side:?}"
    );
    s.clock.advance(Duration::from_millis(2));
    s.poll(&mut side);
    assert!(matches!(side, OldSide::CallingOff { .. }), "{side:?}");
    assert_eq!(s.shared.upgrades.stage(), Stage::Reclaim);
    match s.new.hear() {
        Heard::Word(Word::Error(why)) => assert!(why.contains("joined"), "{why}"),
        other => panic!("the new process heard {other:?}"),
    }
    // No deadline while the cores take their queues back; once they have, it is over.
    s.clock.advance(Duration::from_secs(600));
    s.poll(&mut side);
    assert!(matches!(side, OldSide::CallingOff { .. }), "{side:?}");
    s.shared.upgrades.done.fetch_add(1, Ordering::AcqRel);
    s.poll(&mut side);
    assert!(matches!(side.over(), Some(Err(_))), "{side:?}");
    assert_eq!(s.shared.upgrades.stage(), Stage::Idle);
}

#[test]
fn a_port_listened_on_after_the_offer_calls_the_upgrade_off_at_joined() {
    let mut s = setup();
    let mut side = s.start();
    s.core_turn(&[7]);
    s.poll(&mut side);
    assert!(s.new.take_handover().is_some());
    // The application listens on another port; the new process was told of 7 only.
    s.core_turn(&[7, 8]);
    s.new.say(&Word::Joined).unwrap();
    s.poll(&mut side);
    match &side {
        OldSide::CallingOff { why, .. } => assert!(why.contains("[8]"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(
        lock(&s.shared.life.drain_until).is_none(),
        "no drain was left set"
    );
}

#[test]
fn a_joined_new_process_is_switched_to_once_the_cores_recorded_their_connections() {
    let mut s = setup();
    let mut side = s.start();
    s.core_turn(&[7]);
    s.poll(&mut side);
    assert!(s.new.take_handover().is_some());
    s.new.say(&Word::Joined).unwrap();
    s.poll(&mut side);
    assert!(matches!(side, OldSide::Recording { .. }), "{side:?}");
    assert_eq!(s.shared.upgrades.stage(), Stage::Record);
    s.poll(&mut side);
    assert!(
        matches!(side, OldSide::Recording { .. }),
        "waits for the cores"
    );
    s.shared.upgrades.done.fetch_add(1, Ordering::AcqRel);
    s.poll(&mut side);
    assert_eq!(side.over(), Some(&Ok(())));
    assert_eq!(s.shared.upgrades.stage(), Stage::Switched);
    assert_eq!(s.new.hear(), Heard::Word(Word::Switched));
    assert!(s.shared.life.draining(), "this process drains");
}

#[test]
fn a_call_off_ends_when_the_cores_ended_before_taking_their_queues_back() {
    // A graceful shutdown whose cores finished (futures returned, no connection left) before
    // the call-off reached them: no core will take its queue back, and the run waits for
    // this machine to end.
    let mut s = setup();
    let mut side = s.start();
    s.core_turn(&[7]);
    s.poll(&mut side);
    assert!(matches!(side, OldSide::AwaitingJoin { .. }), "{side:?}");
    s.clock.advance(JOIN_WAIT + Duration::from_millis(1));
    s.poll(&mut side);
    assert!(matches!(side, OldSide::CallingOff { .. }), "{side:?}");
    s.clock.advance(Duration::from_secs(30));
    s.poll(&mut side);
    assert!(matches!(side, OldSide::CallingOff { .. }), "{side:?}");
    s.shared.upgrades.cores_ended.store(true, Ordering::Release);
    s.poll(&mut side);
    assert!(matches!(side.over(), Some(Err(_))), "{side:?}");
    assert_eq!(s.shared.upgrades.stage(), Stage::Idle);
}

#[test]
fn a_shutdown_that_ended_the_cores_while_waiting_for_the_join_calls_the_upgrade_off_at_once() {
    let mut s = setup();
    let mut side = s.start();
    s.core_turn(&[7]);
    s.poll(&mut side);
    assert!(matches!(side, OldSide::AwaitingJoin { .. }), "{side:?}");
    s.shared.upgrades.cores_ended.store(true, Ordering::Release);
    s.poll(&mut side);
    // Called off and over in the same poll, the new process told why.
    assert!(
        matches!(side.over(), Some(Err(w)) if w.contains("cores ended")),
        "{side:?}"
    );
    let _ = s.new.take_handover();
    match s.new.hear() {
        Heard::Word(Word::Error(why)) => assert!(why.contains("shut down"), "{why}"),
        other => panic!("the new process heard {other:?}"),
    }
}
