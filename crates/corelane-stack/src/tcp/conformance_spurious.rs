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
    s.c.rtt = Rtt::new(
        Duration::from_millis(200),
        Duration::from_secs(60),
        Duration::from_secs(1),
    );
    s.c.rtt.sample(Duration::from_micros(100));
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
