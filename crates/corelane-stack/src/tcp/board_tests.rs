//! The scoreboard, case by case: SACK marking, cumulative ACKs, RACK's loss marking, the
//! retransmission timer's marking, cuts and splits.

use smoltcp::time::{Duration, Instant};

use super::board::{Board, Delivered};
use super::seq::Seq;

fn t(ms: i64) -> Instant {
    Instant::from_millis(ms)
}

/// Ten segments of 100 bytes from 1000, sent 1 ms apart.
fn board() -> Board {
    let mut b = Board::default();
    for k in 0..10 {
        let s = Seq(1000 + 100 * k as u32);
        b.push(s, s.plus(100), false, t(k));
    }
    b
}

#[test]
fn sack_marks_whole_segments_and_ack_pops_them() {
    let mut b = board();
    assert_eq!(b.in_flight(), 1000);
    let mut d = Delivered::default();
    // Blocks covering segments 3..5 and half of 6.
    b.sack(Seq(1300), Seq(1650), Seq(1000), t(20), &mut d);
    assert_eq!((d.bytes, b.sacked(), b.in_flight()), (300, 300, 700));
    assert_eq!(d.newest, Some((t(5), Seq(1600))));
    let mut d = Delivered::default();
    b.ack(Seq(1400), t(21), &mut d);
    // Three unsacked segments acknowledged, plus one already sacked (not counted again).
    assert_eq!(d.bytes, 300);
    assert_eq!(d.rtt, Some(Duration::from_millis(19)));
    assert_eq!((b.sacked(), b.in_flight(), b.len()), (200, 400, 6));
}

#[test]
fn rack_marks_what_was_sent_before_the_newest_delivery_once_its_time_is_up()
-> Result<(), &'static str> {
    let mut b = board();
    let mut d = Delivered::default();
    b.sack(Seq(1500), Seq(1600), Seq(1000), t(30), &mut d);
    let rack = d.newest.ok_or("nothing delivered")?;
    // At 30 ms, with an RTT of 25 ms: segments sent at 0..=4 ms are due at 25..=29.
    let (lost, timer) = b.rack_detect(rack, Duration::from_millis(25), Duration::ZERO, t(30));
    assert_eq!(lost, 500);
    assert_eq!(timer, None);
    // With a reordering window of 3 ms, those sent at 3 and 4 ms are not yet due.
    let mut b = board();
    let mut d = Delivered::default();
    b.sack(Seq(1500), Seq(1600), Seq(1000), t(30), &mut d);
    let (lost, timer) = b.rack_detect(
        d.newest.ok_or("nothing delivered")?,
        Duration::from_millis(25),
        Duration::from_millis(3),
        t(30),
    );
    assert_eq!(lost, 300);
    assert_eq!(timer, Some(t(31)));
    assert_eq!(
        b.next_lost().map(|(i, s)| (i, s.start)),
        Some((0, Seq(1000)))
    );
    b.resent(0, t(30));
    assert_eq!(b.next_lost().map(|(i, _)| i), Some(1));
    assert_eq!((b.lost(), b.in_flight()), (200, 700));
    Ok(())
}

#[test]
fn a_split_segment_keeps_its_state_and_the_counts() {
    let mut b = board();
    b.mark_all_lost();
    b.split(9, Seq(1960));
    assert_eq!((b.len(), b.lost(), b.in_flight()), (11, 1000, 0));
    let (i, s) = b.next_lost().unwrap();
    assert_eq!((i, s.start, s.end), (0, Seq(1000), Seq(1100)));
    b.resent(0, t(50));
    b.split(0, Seq(1040));
    assert_eq!((b.lost(), b.in_flight(), b.len()), (900, 100, 12));
    // Out of range: nothing changes.
    b.split(0, Seq(1000));
    assert_eq!(b.len(), 12);
}

#[test]
fn a_timeout_marks_everything_not_sacked_lost() {
    let mut b = board();
    let mut d = Delivered::default();
    b.sack(Seq(1200), Seq(1300), Seq(1000), t(30), &mut d);
    b.mark_all_lost();
    assert_eq!((b.lost(), b.in_flight(), b.sacked()), (900, 0, 100));
    let mut d = Delivered::default();
    b.ack(Seq(1050), t(40), &mut d);
    assert_eq!((d.bytes, b.lost()), (50, 850));
}
