//! Conformance scripts for a path that holds segments back behind later ones: the receiver
//! reports every duplicate of a batch (RFC 2883), the sender undoes a recovery the echoed
//! timestamps prove spurious (RFC 3522's detection), and SRTT learns how long the path holds
//! a segment. Each is what a deeply reordering path needs to keep its window.

use smoltcp::time::Duration;

use super::conformance::{PEER_ISN, Script, seg};
use super::rtt::Rtt;

#[test]
fn two_duplicates_in_one_batch_are_each_reported_first_in_an_ack() {
    let (mut s, una) = Script::established(false);
    for off in [0u32, 1000, 2000, 3000] {
        let mut a = seg(PEER_ISN + 1 + off, una);
        a.len = 1000;
        s.input(a);
    }
    s.out();
    // Two copies apart from each other and one beside the first, in one batch.
    for off in [0u32, 2000, 1000] {
        let mut again = seg(PEER_ISN + 1 + off, una);
        again.len = 1000;
        s.input(again);
    }
    let out = s.out();
    let firsts: Vec<(u32, u32)> = out.iter().filter_map(|o| o.sack.first().copied()).collect();
    assert_eq!(
        firsts,
        vec![
            (PEER_ISN + 1, PEER_ISN + 2001),
            (PEER_ISN + 2001, PEER_ISN + 3001)
        ],
        "{out:?}"
    );
    assert!(out.iter().all(|o| o.ack == Some(PEER_ISN + 4001)));
    // All reported: the next ACK carries no block.
    s.c.ack_now = true;
    assert!(s.out().iter().all(|o| o.sack.is_empty()));
}

/// Five full segments in flight with timestamps, the first deemed lost and resent ten
/// milliseconds (ten ticks) later. Returns the script, SND.UNA, the segment size, the window
/// before the loss and the TSvals of the first transmission and of the retransmission.
fn first_resent_later() -> (Script, u32, u32, usize, u32, u32) {
    let (mut s, una) = Script::established(true);
    let m = s.c.smss as u32;
    s.c.write(&vec![9u8; 5 * m as usize]);
    assert_eq!(s.out().len(), 5);
    let cwnd = s.c.cwnd();
    let first = s.c.ts_now(s.now);
    s.advance(Duration::from_millis(10));
    let mut sack = seg(PEER_ISN + 1, una);
    sack.ts = Some((3, first));
    sack.sack = [Some((una + m, una + 5 * m)), None, None];
    s.input(sack);
    let again = s.out();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!((again[0].seq, again[0].len), (una, m as usize));
    let retx = again[0].ts.map_or(0, |t| t.0);
    assert!(retx > first, "the retransmission's TSval is later");
    assert!(s.c.cwnd() < cwnd, "the window is reduced");
    (s, una, m, cwnd, first, retx)
}

#[test]
fn a_recovery_whose_last_ack_echoes_the_first_transmission_is_undone_without_a_dsack() {
    let (mut s, una, m, cwnd, first, _) = first_resent_later();
    // The original was only held back: the ACK for everything echoes its timestamp, and the
    // D-SACK for the copy never comes (its ACK was held back and overtaken too).
    s.advance(Duration::from_micros(100));
    let mut all = seg(PEER_ISN + 1, una + 5 * m);
    all.ts = Some((4, first));
    s.input(all);
    assert!(s.c.recovery.is_none());
    assert_eq!(s.c.stats.get().dsacks, 0);
    assert_eq!(s.c.stats.get().undos, 1);
    assert!(s.c.cwnd() >= cwnd, "{} < {cwnd}", s.c.cwnd());
}

#[test]
fn a_recovery_whose_last_ack_echoes_the_retransmission_keeps_its_reduction() {
    let (mut s, una, m, cwnd, _, retx) = first_resent_later();
    // The retransmission closed the hole: the loss was real.
    s.advance(Duration::from_micros(100));
    let mut all = seg(PEER_ISN + 1, una + 5 * m);
    all.ts = Some((4, retx));
    s.input(all);
    assert!(s.c.recovery.is_none());
    assert_eq!(s.c.stats.get().undos, 0);
    assert!(s.c.cwnd() < cwnd);
}

#[test]
fn an_earlier_ack_echoing_a_retransmission_keeps_the_reduction_whatever_the_last_echoes() {
    // Two holes resent; the first is filled by its retransmission (a real loss), the second
    // by its late original. The last ACK echoes that original, but an ACK before it covered
    // a retransmission and echoed it: not every retransmission was needless.
    let (mut s, una) = Script::established(true);
    let m = s.c.smss as u32;
    s.c.write(&vec![9u8; 6 * m as usize]);
    assert_eq!(s.out().len(), 6);
    let cwnd = s.c.cwnd();
    let first = s.c.ts_now(s.now);
    s.advance(Duration::from_millis(10));
    let mut sack = seg(PEER_ISN + 1, una);
    sack.ts = Some((3, first));
    sack.sack = [Some((una + 2 * m, una + 6 * m)), None, None];
    s.input(sack);
    let again = s.out();
    assert_eq!(again.len(), 2, "{again:?}");
    let retx = again[0].ts.map_or(0, |t| t.0);
    s.advance(Duration::from_micros(100));
    let mut one = seg(PEER_ISN + 1, una + m);
    one.ts = Some((4, retx));
    one.sack = [Some((una + 2 * m, una + 6 * m)), None, None];
    s.input(one);
    let mut all = seg(PEER_ISN + 1, una + 6 * m);
    all.ts = Some((5, first));
    s.input(all);
    assert!(s.c.recovery.is_none());
    assert_eq!(s.c.stats.get().undos, 0);
    assert!(s.c.cwnd() < cwnd);
}

#[test]
fn srtt_takes_the_oldest_segment_an_ack_covers_and_the_minimum_the_newest() {
    let (mut s, una) = Script::established(false);
    s.c.rtt = Rtt::new(
        Duration::from_millis(200),
        Duration::from_secs(60),
        Duration::from_secs(1),
    );
    s.c.write(&[9u8; 2000]);
    assert_eq!(s.out().len(), 2);
    s.advance(Duration::from_millis(5));
    s.c.write(&[9u8; 1000]);
    assert_eq!(s.out().len(), 1);
    // The first two were held back on the path: one ACK covers all three a millisecond
    // after the third left.
    s.advance(Duration::from_millis(1));
    s.input(seg(PEER_ISN + 1, una + 3000));
    assert_eq!(s.c.rtt.srtt(), Some(Duration::from_millis(6)));
    assert_eq!(s.c.rtt.min_rtt(), Some(Duration::from_millis(1)));
}

#[test]
fn an_original_arriving_late_widens_the_reordering_window_to_its_lateness() {
    let (mut s, una) = Script::established(false);
    s.path_rtt(Duration::from_micros(100));
    s.c.write(&[9u8; 5000]);
    assert_eq!(s.out().len(), 5);
    // The second segment arrives 100 us after it left...
    s.advance(Duration::from_micros(100));
    let mut ack = seg(PEER_ISN + 1, una);
    ack.sack[0] = Some((una + 1000, una + 2000));
    s.input(ack);
    let before = s.c.reo_wnd();
    assert!(before < Duration::from_micros(100), "{before}");
    // ...and the first, sent with it, 3 ms after: 2.9 ms later than the round trip of the
    // one that overtook it. No quarter-of-the-minimum-RTT step (nor SRTT, 100 us) would
    // reach that; the window now does.
    s.advance(Duration::from_micros(2900));
    s.input(seg(PEER_ISN + 1, una + 2000));
    assert!(s.c.reordering);
    assert_eq!(s.c.stats.get().retrans_segs, 0);
    assert!(
        s.c.reo_wnd() >= Duration::from_micros(2900),
        "{}",
        s.c.reo_wnd()
    );
    // A segment held a second is not waited for: the window stops at its bound.
    s.advance(Duration::from_millis(100));
    let mut ack = seg(PEER_ISN + 1, una + 2000);
    ack.sack[0] = Some((una + 3000, una + 4000));
    s.input(ack);
    s.advance(Duration::from_secs(1));
    s.input(seg(PEER_ISN + 1, una + 4000));
    assert_eq!(s.c.reo_wnd(), super::reorder::REO_LATE_MAX);
}

#[test]
fn paws_takes_new_data_held_a_few_ticks_behind_but_not_a_duplicate_or_older_data() {
    let (mut s, una) = Script::established(true);
    // A retransmission fills the hole at the left edge and moves TS.Recent to 60...
    let mut filler = seg(PEER_ISN + 1, una);
    filler.len = 100;
    filler.ts = Some((60, 0));
    s.input(filler);
    // ...and the original above it, sent five ticks earlier and held on the path, arrives.
    let mut held = seg(PEER_ISN + 101, una);
    held.len = 100;
    held.ts = Some((55, 0));
    s.input(held);
    assert_eq!(s.c.readable(), 200, "taken");
    assert_eq!(s.c.stats.get().paws_dropped, 0);
    // A copy of data already received, two ticks behind, is an old duplicate.
    let mut dup = seg(PEER_ISN + 1, una);
    dup.len = 100;
    dup.ts = Some((58, 0));
    s.input(dup);
    assert_eq!(s.c.stats.get().paws_dropped, 1);
    // New data further behind than the reordering allowance is too.
    let mut old = seg(PEER_ISN + 201, una);
    old.len = 100;
    old.ts = Some((60 - super::admit::PAWS_REORDER_TICKS - 1, 0));
    s.input(old);
    assert_eq!(s.c.stats.get().paws_dropped, 2);
    assert_eq!(s.c.readable(), 200);
}

#[test]
fn a_sacked_retransmission_moves_rack_on_whatever_the_echo() {
    // The left edge's echo is what an ACK of out-of-order data carries (RFC 7323 section
    // 4.3): a retransmission SACKed a round trip after it left is news to RACK.
    let (mut s, una) = Script::established(true);
    s.path_rtt(Duration::from_micros(100));
    let m = s.c.smss as u32;
    s.c.write(&vec![9u8; 4 * m as usize]);
    assert_eq!(s.out().len(), 4);
    let first = s.c.ts_now(s.now);
    // The second and fourth arrive; the first and third are deemed lost when the
    // reordering timer fires, and resent.
    s.advance(Duration::from_millis(1));
    let mut ack = seg(PEER_ISN + 1, una);
    ack.ts = Some((3, first));
    ack.sack = [
        Some((una + 3 * m, una + 4 * m)),
        Some((una + m, una + 2 * m)),
        None,
    ];
    s.input(ack);
    s.jump();
    let again: Vec<u32> = s.out().iter().map(|o| o.seq).collect();
    assert_eq!(again, vec![una, una + 2 * m]);
    let resent_at = s.now;
    // The third's copy is SACKed 200 us later (the first still missing): the echo is the
    // left edge's, from before the retransmissions.
    s.advance(Duration::from_micros(200));
    let mut sack = seg(PEER_ISN + 1, una);
    sack.ts = Some((4, first));
    sack.sack = [Some((una + m, una + 4 * m)), None, None];
    s.input(sack);
    assert_eq!(
        s.c.rack.map(|r| r.0),
        Some(resent_at),
        "RACK took the SACKed retransmission"
    );
}

#[test]
fn a_recovery_begun_by_the_reordering_timer_has_its_probe_armed() {
    // A recovery that cannot send at once (its window full of segments the peer will not
    // take) must not be left to the retransmission timer: its probe is armed when it begins,
    // not only after a transmission or an ACK's progress.
    let (mut s, una) = Script::established(false);
    s.path_rtt(Duration::from_micros(100));
    s.c.write(&[9u8; 10_000]);
    assert_eq!(s.out().len(), 10);
    s.advance(Duration::from_micros(100));
    let mut ack = seg(PEER_ISN + 1, una);
    ack.sack[0] = Some((una + 1000, una + 2000));
    s.input(ack);
    assert!(s.c.recovery.is_none(), "the first is not due yet");
    // The reordering timer deems the first lost: recovery, before anything is sent.
    s.jump();
    s.c.on_time(s.now);
    assert!(s.c.recovery.is_some());
    assert!(
        s.c.probe.deadline().is_some(),
        "no probe armed when the recovery began"
    );
}
