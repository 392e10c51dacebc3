//! The frame rules of an upgrade, simulated: an old and a new process share one queue's UMEM,
//! the new one takes the fill and completion rings over, packets land on either's RX ring at
//! random, both send, and the old one leaves. At every step each frame is in exactly one place
//! (a kernel ring, an exchange ring between the two, or the hands of one process), no frame is
//! held by both, and once the old process is gone every frame comes back to the new one.

use crate::{FramePool, FrameState};
use std::collections::VecDeque;

/// The kernel and the two exchange rings, as queues of frame indices.
#[derive(Default)]
struct Wire {
    fill: VecDeque<u32>,
    rx_old: VecDeque<u32>,
    rx_new: VecDeque<u32>,
    completion: VecDeque<u32>,
    /// Frames the old process gives back to the new one.
    to_new: VecDeque<u32>,
    /// Completions of the old process's sends, forwarded by the new one.
    to_old: VecDeque<u32>,
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

const FRAMES: usize = 64;
/// Free frames the old process keeps to send from after the hand-over.
const KEEP: usize = 8;

/// Where each frame is; panics when one is in no place or in two.
fn check(old: Option<&FramePool>, new: &FramePool, w: &Wire, step: usize) {
    let mut places = vec![Vec::new(); FRAMES];
    let rings = [
        ("fill", &w.fill),
        ("rx old", &w.rx_old),
        ("rx new", &w.rx_new),
        ("completion", &w.completion),
        ("to new", &w.to_new),
        ("to old", &w.to_old),
    ];
    for (name, ring) in rings {
        for &i in ring {
            places[i as usize].push(name);
        }
    }
    let held = |p: &FramePool, i: usize| {
        matches!(p.ledger().state(i), FrameState::Free | FrameState::InUse)
    };
    for (i, place) in places.iter_mut().enumerate() {
        if old.is_some_and(|o| held(o, i)) {
            place.push("old");
        }
        if held(new, i) {
            place.push("new");
        }
        assert_eq!(place.len(), 1, "step {step}: frame {i} is in {place:?}");
    }
}

/// One process's turn: take what its RX ring holds and, for each, maybe write a reply into a
/// frame of its own (into `replies`, for the caller to send); then let go of the received
/// frames: free here, or given `back` to the other process.
fn serve(
    p: &mut FramePool,
    rx: &mut VecDeque<u32>,
    replies: &mut VecDeque<u32>,
    back: Option<&mut VecDeque<u32>>,
    rng: &mut Rng,
) {
    let mut held = Vec::new();
    while let Some(i) = rx.pop_front() {
        p.received_shared(i).unwrap();
        // An answer written over the request and sent back out in the same frame.
        if rng.below(3) == 0 {
            replies.push_back(i);
        } else {
            held.push(i);
        }
    }
    for _ in 0..held.len() {
        if rng.below(2) == 0 {
            p.alloc(1, |t| replies.push_back(t));
        }
    }
    match back {
        Some(back) => {
            for i in held {
                p.give_back(i).unwrap();
                back.push_back(i);
            }
        }
        None => {
            for i in held {
                p.free(i).unwrap();
            }
        }
    }
}

#[test]
fn frames_cross_between_the_two_processes_and_all_come_home() {
    for seed in 1..=20u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut w = Wire::default();
        let mut old = FramePool::new(FRAMES, 16);
        // The old process alone: frames posted, received, some replies sent and completed.
        for _ in 0..50 {
            old.post_for_receive(16, |i| w.fill.push_back(i));
            for _ in 0..rng.below(8) {
                if let Some(i) = w.fill.pop_front() {
                    w.rx_old.push_back(i);
                }
            }
            let mut sent = VecDeque::new();
            serve(&mut old, &mut w.rx_old, &mut sent, None, &mut rng);
            for t in sent {
                old.sent(t).unwrap();
                w.completion.push_back(t);
            }
            while let Some(c) = w.completion.pop_front() {
                old.completed(c).unwrap();
            }
        }

        // The new process joins: every frame away; the old one lends it all but KEEP of its
        // free frames and passes it the fill ring.
        let mut new = FramePool::joining(FRAMES, 16);
        let lend = old.count(FrameState::Free).saturating_sub(KEEP);
        old.lend(lend, |i| w.to_new.push_back(i));
        old.hand_over_receive();
        check(Some(&old), &new, &w, 0);

        let mut step = 1;
        let mut old_alive = true;
        for round in 0..400 {
            // The old process drains: after round 200 the program steers nothing more to it.
            let to_old_share = if round < 200 { 2 } else { 0 };
            // The new process: takes back what the old one returned, posts for receive.
            while let Some(i) = w.to_new.pop_front() {
                new.returned(i).unwrap();
            }
            new.post_for_receive(16, |i| w.fill.push_back(i));
            check(old_alive.then_some(&old), &new, &w, step);
            step += 1;
            // Packets: each takes the fill ring's first frame to one RX ring.
            for _ in 0..rng.below(10) {
                let Some(i) = w.fill.pop_front() else { break };
                if old_alive && rng.below(4) < to_old_share {
                    w.rx_old.push_back(i);
                } else {
                    w.rx_new.push_back(i);
                }
            }
            check(old_alive.then_some(&old), &new, &w, step);
            step += 1;
            // Both serve; the kernel completes some of what was sent, in order.
            let mut sent_new = VecDeque::new();
            serve(&mut new, &mut w.rx_new, &mut sent_new, None, &mut rng);
            for t in sent_new {
                new.sent(t).unwrap();
                w.completion.push_back(t);
            }
            if old_alive {
                let mut sent_old = VecDeque::new();
                serve(
                    &mut old,
                    &mut w.rx_old,
                    &mut sent_old,
                    Some(&mut w.to_new),
                    &mut rng,
                );
                for t in sent_old {
                    old.sent(t).unwrap();
                    w.completion.push_back(t);
                }
            }
            for _ in 0..rng.below(6) {
                let Some(c) = w.completion.pop_front() else {
                    break;
                };
                // The new process consumes the completion ring: its own sends, or the old
                // one's (from its own frames, or in place in frames the new one posted),
                // forwarded.
                match new.ledger().state(c as usize) {
                    FrameState::Transmit => new.completed(c).unwrap(),
                    s => {
                        assert!(matches!(s, FrameState::Away | FrameState::Receive), "{s:?}");
                        w.to_old.push_back(c);
                    }
                }
            }
            if old_alive {
                while let Some(c) = w.to_old.pop_front() {
                    old.completed(c).unwrap();
                }
                // Past the frames it keeps to send from, the old process gives back.
                let extra = old.count(FrameState::Free).saturating_sub(KEEP);
                old.lend(extra, |i| w.to_new.push_back(i));
            }
            check(old_alive.then_some(&old), &new, &w, step);
            step += 1;
            // The old process leaves once nothing is steered to it, its RX ring is empty and
            // every frame it sent has completed: it gives back every free frame it holds.
            if old_alive
                && round >= 200
                && w.rx_old.is_empty()
                && old.count(FrameState::Transmit) == 0
            {
                old.lend(FRAMES, |i| w.to_new.push_back(i));
                let c = old.counts(0, 0);
                assert_eq!((c.free, c.in_use, c.away), (0, 0, FRAMES), "seed {seed}");
                old_alive = false;
            }
        }
        assert!(
            !old_alive,
            "seed {seed}: the old process never finished draining"
        );
        // Settle: the rest comes back, and the frames posted before the hand-over cycle
        // through the fill ring to the new process.
        while let Some(c) = w.completion.pop_front() {
            new.completed(c).unwrap();
        }
        while let Some(i) = w.to_new.pop_front() {
            new.returned(i).unwrap();
        }
        while let Some(i) = w.fill.pop_front() {
            new.received_shared(i).unwrap();
            new.free(i).unwrap();
        }
        check(None, &new, &w, step);
        let c = new.counts(0, 0);
        assert_eq!(c.away, 0, "seed {seed}: every frame is the new process's");
        assert_eq!(c.free, FRAMES, "seed {seed}");
        assert!(new.ledger().verify().is_ok());
    }
}
