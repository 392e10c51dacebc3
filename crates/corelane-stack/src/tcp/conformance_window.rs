//! Windows and SACK blocks: what a receiver advertises and promises (a window rounded up to
//! the scale's unit is honoured, an ACK from its right edge is taken), what a sender believes
//! (a newer ACK's window, a SYN-ACK's unscaled window, a stale small window probed), and SACK
//! blocks reported once each with an out-of-order FIN inside its block. On the same scripted
//! connection as `conformance.rs`.

use smoltcp::wire::TcpControl;

use super::conformance::{PEER_ISN, Script, seg};

/// A receive window filled to one byte short while this side has 3000 bytes in flight: the
/// window advertised is rounded up to the scale's unit (2 bytes with the scale of 1 these
/// scripts get) so that its right edge never moves back. Returns `RCV.NXT` and `SND.UNA`.
fn full_receive_window() -> (Script, u32, u32) {
    let (mut s, una) = Script::established(false);
    s.c.write(&[7u8; 3000]);
    assert_eq!(s.out().iter().map(|o| o.len).sum::<usize>(), 3000);
    let mut at = PEER_ISN + 1;
    let mut left = 65_535;
    while left > 0 {
        let mut d = seg(at, una);
        d.len = left.min(1000);
        s.input(d);
        at += d.len as u32;
        left -= d.len;
    }
    let out = s.out();
    let last = out.last().expect("an ACK");
    assert_eq!(
        (last.ack, last.window),
        (Some(at), 1),
        "2 bytes advertised, 1 free"
    );
    (s, at, una)
}

#[test]
fn each_range_is_reported_once_when_the_newest_is_not_the_highest() {
    let (mut s, una) = Script::established(false);
    for off in [3000, 1000] {
        let mut a = seg(PEER_ISN + 1 + off, una);
        a.len = 1000;
        s.input(a);
    }
    let out = s.out();
    assert_eq!(
        out[0].sack,
        vec![
            (PEER_ISN + 1001, PEER_ISN + 2001),
            (PEER_ISN + 3001, PEER_ISN + 4001)
        ]
    );
}

#[test]
fn a_fin_that_arrives_out_of_order_is_inside_its_sack_block() {
    let (mut s, una) = Script::established(false);
    let mut last = seg(PEER_ISN + 1 + 1000, una);
    last.len = 500;
    last.ctl = TcpControl::Fin;
    s.input(last);
    let out = s.out();
    // The data ends at 1500; the FIN takes 1501.
    assert_eq!(out[0].ack, Some(PEER_ISN + 1));
    assert_eq!(out[0].sack, vec![(PEER_ISN + 1001, PEER_ISN + 1502)]);
}

#[test]
fn data_inside_a_rounded_up_window_is_taken() {
    let (mut s, rcv_nxt, una) = full_receive_window();
    // The peer's persist probe fills what was advertised.
    let mut probe = seg(rcv_nxt, una);
    probe.len = 2;
    s.input(probe);
    assert_eq!(s.c.rcv_nxt.0, rcv_nxt + 2, "both bytes taken, as promised");
}

#[test]
fn an_ack_at_the_right_edge_of_the_window_is_processed() {
    let (mut s, rcv_nxt, una) = full_receive_window();
    // The peer sent the 2 bytes the window allowed (they were lost) and now acknowledges
    // this side's data: its sequence number is the window's right edge. Dropping such ACKs
    // (RFC 9293's strict test) left this side resending acknowledged data on a doubling
    // timer, moving only when the peer's persist timer fired.
    let ack = seg(rcv_nxt + 2, una + 3000);
    s.input(ack);
    assert_eq!(s.c.snd_una.0, una + 3000, "the ACK was taken");
    assert!(s.c.board.is_empty());
}

#[test]
fn a_retransmission_with_a_newer_ack_sets_the_window() {
    let (mut s, una) = Script::established(false);
    s.c.write(&[3u8; 4000]);
    s.out();
    // The peer's first 100 bytes are lost; its next 100 arrive (out of order) acking nothing,
    // with a window of 10,000.
    let mut d = seg(PEER_ISN + 101, una);
    d.len = 100;
    d.window = 10_000;
    s.input(d);
    s.out();
    // Its retransmission of the lost bytes (an older SEQ than the segment that set the
    // window) acknowledges 1000 bytes and offers 2000 from there: the right edge is
    // una + 3000, not una + 11000.
    let mut r = seg(PEER_ISN + 1, una + 1000);
    r.len = 100;
    r.window = 2000;
    s.input(r);
    assert_eq!(s.c.snd_window(), 2000);
}

#[test]
fn the_window_of_a_syn_ack_is_not_scaled() {
    let mut s = Script::active();
    let syn = s.out()[0].seq;
    let mut sa = seg(PEER_ISN, syn.wrapping_add(1));
    sa.ctl = TcpControl::Syn;
    sa.syn_opts = true;
    sa.wscale = 7;
    sa.window = 1000;
    s.input(sa);
    assert_eq!(s.c.snd_window(), 1000);
}

#[test]
fn a_small_window_whose_update_was_lost_is_probed_with_what_fits() {
    // The peer took 9700 bytes and said 300 were left; the update that reopened its window
    // was lost. Sender silly window avoidance holds back a 300-byte segment, so without a
    // probe neither side would ever send again.
    let (mut s, una) = Script::established(false);
    let mut big = seg(PEER_ISN + 1, una);
    big.window = 10_000;
    s.input(big);
    s.c.write(&[2u8; 9700]);
    let sent: usize = s.out().iter().map(|o| o.len).sum();
    assert_eq!(sent, 9700);
    let una = una.wrapping_add(9700);
    let mut small = seg(PEER_ISN + 1, una);
    small.window = 300;
    s.input(small);
    s.c.write(&[1u8; 3000]);
    assert!(s.out().is_empty(), "a runt is held back at first");
    s.jump();
    let out = s.out();
    assert_eq!(out.len(), 1, "the persist timer sends one segment");
    assert_eq!(
        (out[0].seq, out[0].len),
        (una, 300),
        "what the window takes"
    );
    // Its ACK carries the window as it is now: sending resumes.
    let mut open = seg(PEER_ISN + 1, una.wrapping_add(300));
    open.window = 10_000;
    s.input(open);
    let sent: usize = s.out().iter().map(|o| o.len).sum();
    assert!(sent > 1448, "{sent} bytes after the window opened");
}

#[test]
fn an_older_window_update_overtaken_on_the_path_does_not_shrink_the_window() {
    // The peer's buffer filled (300 bytes left), its reader took the data and it sent a
    // window update with the same SEQ and ACK; the two arrive the other way round. The
    // older, smaller window carries nothing newer: the data goes at once, not when the
    // persist timer fires.
    let (mut s, una) = Script::established(false);
    s.c.write(&[2u8; 9700]);
    let sent: usize = s.out().iter().map(|o| o.len).sum();
    assert_eq!(sent, 9700);
    let una = una.wrapping_add(9700);
    let mut update = seg(PEER_ISN + 1, una);
    update.window = 10_000;
    s.input(update);
    let mut stale = seg(PEER_ISN + 1, una);
    stale.window = 300;
    s.input(stale);
    assert_eq!(s.c.snd_window(), 10_000);
    s.c.write(&[1u8; 3000]);
    let sent: usize = s.out().iter().map(|o| o.len).sum();
    assert_eq!(sent, 3000, "sent without waiting for a timer");
    // A zero window with the same SEQ and ACK is taken (a receiver that closed its window
    // says so that way), and a smaller window with a newer ACK is taken too.
    let mut shut = seg(PEER_ISN + 1, una);
    shut.window = 0;
    s.input(shut);
    assert_eq!(s.c.snd_window(), 0);
    let mut newer = seg(PEER_ISN + 1, una.wrapping_add(1000));
    newer.window = 500;
    s.input(newer);
    assert_eq!(s.c.snd_window(), 500);
}

/// Segments outside the window are answered with an ACK (RFC 9293 section 3.10.7.4), but a
/// flood of them without data (an ACK loop between two ends that disagree, or a spoofer
/// driving one) earns at most one ACK per half second; one with data is always answered.
#[test]
fn acks_for_out_of_window_segments_without_data_are_rate_limited() {
    let (mut s, una) = Script::established(false);
    let far = PEER_ISN + 1 + 10_000_000;
    let mut answered = 0;
    for _ in 0..20 {
        s.input(seg(far, una));
        answered += s.out().len();
        s.advance(smoltcp::time::Duration::from_millis(10));
    }
    assert_eq!(answered, 1, "20 stray ACKs in 200 ms: one answer");
    let mut data = seg(far, una);
    data.len = 100;
    for _ in 0..3 {
        s.input(data);
        assert_eq!(
            s.out().len(),
            1,
            "data outside the window is always answered"
        );
    }
    s.advance(super::admit::OOW_ACK_GAP);
    s.input(seg(far, una));
    assert_eq!(s.out().len(), 1, "half a second later: answered again");
    assert!(s.c.stats.get().out_of_window >= 24);
}

/// A batch of out-of-order segments handled in one turn and answered together: every block
/// they created or grew is reported (the newest first), spread over as many ACKs as it takes
/// three blocks at a time. Reporting only the newest and the highest (one ACK per turn) left
/// the blocks between unreported, and the sender resent data that had arrived.
#[test]
fn every_block_a_batch_of_arrivals_changed_is_reported() {
    let (mut s, una) = Script::established(false);
    let base = PEER_ISN + 1;
    for off in [10_000, 20_000, 30_000, 40_000, 50_000, 11_000] {
        let mut d = seg(base + off, una);
        d.len = 1000;
        s.input(d);
    }
    let out = s.out();
    assert!(out.len() >= 2, "{out:?}");
    assert_eq!(
        out[0].sack[0],
        (base + 10_000, base + 12_000),
        "the newest first"
    );
    let mut told: Vec<(u32, u32)> = out.iter().flat_map(|o| o.sack.clone()).collect();
    told.sort_unstable();
    told.dedup();
    let want: Vec<(u32, u32)> = vec![
        (base + 10_000, base + 12_000),
        (base + 20_000, base + 21_000),
        (base + 30_000, base + 31_000),
        (base + 40_000, base + 41_000),
        (base + 50_000, base + 51_000),
    ];
    assert_eq!(told, want);
    assert!(out.iter().all(|o| o.ack == Some(base)));
    // Once reported, the next arrival's ACK is one segment again.
    let mut d = seg(base + 60_000, una);
    d.len = 1000;
    s.input(d);
    assert_eq!(s.out().len(), 1);
}

#[test]
fn reading_after_the_peer_s_fin_sends_no_window_update_and_a_later_reset_keeps_the_end() {
    let (mut s, una) = Script::established(false);
    let mut seq = PEER_ISN + 1;
    for _ in 0..4 {
        let mut d = seg(seq, una);
        d.len = 4000;
        s.input(d);
        seq += 4000;
    }
    let mut fin = seg(seq, una);
    fin.ctl = TcpControl::Fin;
    s.input(fin);
    let _ = s.out();
    // The application reads it all: the window grew by far more than a segment, but nothing
    // more can come, and a peer that closed all the way would answer an update with a reset.
    let mut buf = vec![0u8; 20_000];
    let (n, _) = s.c.read(s.now, &mut buf);
    assert_eq!(n, 16_000);
    let out = s.out();
    assert!(
        out.is_empty(),
        "a window update after the peer's FIN: {out:?}"
    );
    // A reset then (the peer gone) ends the connection, and the peer's FIN still came first.
    let mut rst = seg(seq + 1, una);
    rst.ctl = TcpControl::Rst;
    s.input(rst);
    assert!(s.c.fin_received(), "the FIN came before the reset");
}

#[test]
fn a_zero_window_overtaken_by_the_update_that_reopened_it_is_not_taken() {
    let (mut s, una) = Script::established(true);
    let m = s.c.smss as u32;
    s.c.write(&vec![9u8; 2 * m as usize]);
    assert_eq!(s.out().len(), 2);
    let sent = s.c.ts_now(s.now);
    // The peer's buffer filled ("zero"), its reader caught up ("open"), in the same tick and
    // with the same numbers; the path delivers the update first.
    let mut open = seg(PEER_ISN + 1, una + 2 * m);
    open.ts = Some((10, sent));
    let mut zero = open;
    zero.window = 0;
    s.input(open);
    s.input(zero);
    assert!(s.c.snd_wnd > 0, "a stale zero window was taken");
    // A zero window with a newer timestamp is the peer's word now.
    zero.ts = Some((11, sent));
    s.input(zero);
    assert_eq!(s.c.snd_wnd, 0);
    // And an update with the same numbers opens it again.
    open.ts = Some((11, sent));
    s.input(open);
    assert!(s.c.snd_wnd > 0);
}
