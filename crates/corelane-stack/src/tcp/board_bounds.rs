//! The work a hostile receiver can make one ACK cost (the CVE-2019-11477/11478 class): an
//! 80,000-segment board of the smallest segments, SACK and RACK driven the ways that made
//! scoreboards walk everything in flight on every ACK, with the board's operation counter
//! (segments looked at) held to a bound that does not grow with the board.

use smoltcp::time::{Duration, Instant};

use super::board::{Board, Delivered};
use super::seq::Seq;

const SEGS: u32 = 80_000;
/// The smallest segment the stack sends (its floor on the peer's MSS).
const MSS: u32 = 64;
const BASE: Seq = Seq(7_000);

fn t(us: i64) -> Instant {
    Instant::from_micros(us)
}

/// `SEGS` segments, one a microsecond.
fn full_board() -> Board {
    let mut b = Board::default();
    for k in 0..SEGS {
        let s = BASE.plus((k * MSS) as usize);
        b.push(s, s.plus(MSS as usize), false, t(i64::from(k)));
    }
    b
}

fn at(k: u32) -> Seq {
    BASE.plus((k * MSS) as usize)
}

#[test]
fn a_sack_block_over_what_is_already_sacked_costs_a_search_not_a_walk() {
    let mut b = full_board();
    let mut d = Delivered::default();
    // Everything but the first segment arrived: the one walk that marks them.
    b.sack(at(1), at(SEGS), BASE, t(100_000), &mut d);
    assert_eq!(b.sacked(), ((SEGS - 1) * MSS) as usize);
    // Then 10,000 ACKs repeat blocks inside it from every left edge the receiver likes.
    let before = b.ops();
    for k in 0..10_000u32 {
        let left = at(1 + (k * 7919) % (SEGS - 2));
        b.sack(left, at(SEGS), BASE, t(100_001), &mut Delivered::default());
        b.sack(at(1), at(SEGS), BASE, t(100_001), &mut Delivered::default());
    }
    let per_block = (b.ops() - before) / 20_000;
    assert!(per_block <= 4, "{per_block} segments looked at per block");
}

#[test]
fn every_other_segment_sacked_one_ack_at_a_time_costs_each_ack_little() {
    let mut b = full_board();
    let before = b.ops();
    let mut acks = 0u64;
    // The receiver SACKs odd segments one by one, each ACK repeating the three newest
    // blocks (as a real one does): 40,000 holes, and no ACK may walk them.
    for k in (1..SEGS).step_by(2) {
        for j in [k, k.saturating_sub(2).max(1), k.saturating_sub(4).max(1)] {
            b.sack(
                at(j),
                at(j + 1),
                BASE,
                t(100_000),
                &mut Delivered::default(),
            );
        }
        acks += 1;
    }
    let per_ack = (b.ops() - before) / acks;
    assert!(per_ack <= 6, "{per_ack} segments looked at per ACK");
    assert_eq!(b.sacked(), ((SEGS / 2) * MSS) as usize);
}

#[test]
fn rack_looks_at_each_transmission_once_not_at_every_segment_on_every_ack()
-> Result<(), &'static str> {
    let mut b = full_board();
    let mut d = Delivered::default();
    // The newest segment arrives, long after the others were due: all are lost.
    b.sack(at(SEGS - 1), at(SEGS), BASE, t(10_000_000), &mut d);
    let rack = d.newest.ok_or("delivered")?;
    let rtt = Duration::from_micros(100);
    let (lost, timer) = b.rack_detect(rack, rtt, Duration::ZERO, t(10_000_000));
    assert_eq!(lost, ((SEGS - 1) * MSS) as usize);
    assert_eq!(timer, None);
    // 40,000 ACKs more, the holes still unfilled (nothing resent yet): RACK has nothing to
    // look at again.
    let before = b.ops();
    for k in 0..40_000 {
        b.rack_detect(rack, rtt, Duration::ZERO, t(10_000_000 + k));
    }
    assert!(b.ops() - before <= 40_000, "{}", b.ops() - before);
    // Those resent and SACKed every other one: each RACK pass stops at the first not due.
    for _ in 0..(SEGS - 1) {
        let (i, _) = b.next_lost().ok_or("a hole")?;
        b.resent(i, t(20_000_000));
    }
    let before = b.ops();
    for k in (0..SEGS - 1).step_by(2) {
        let mut d = Delivered::default();
        b.sack(at(k), at(k + 1), BASE, t(20_000_050), &mut d);
        let rack = d.newest.ok_or("delivered")?;
        b.rack_detect(rack, rtt, Duration::from_micros(25), t(20_000_050));
    }
    let per_ack = (b.ops() - before) / u64::from(SEGS / 2);
    assert!(per_ack <= 6, "{per_ack} segments looked at per ACK");
    Ok(())
}

#[test]
fn without_sack_the_time_order_does_not_grow_past_the_board() {
    let mut b = Board::default();
    let mut next = BASE;
    for k in 0..200_000i64 {
        b.push(next, next.plus(100), false, t(k));
        assert!(
            b.order_len() <= 2 * b.len() + 64,
            "{} entries",
            b.order_len()
        );
        next = next.plus(100);
        if k % 10 == 9 {
            b.ack(next.minus(500), t(k), &mut Delivered::default());
        }
    }
}
