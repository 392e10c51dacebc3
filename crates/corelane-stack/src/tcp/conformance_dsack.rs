//! Conformance scripts for duplicates, reordering and the ACK's timing: the D-SACK blocks a
//! receiver sends for data that arrived twice (RFC 2883), the sender's reading of both D-SACK
//! forms, PAWS's one-tick leniency toward a reordered segment, RACK's reordering evidence, and
//! the ACK for every second segment when segments arrive in a batch.

use super::conformance::{PEER_ISN, Script, seg};
use super::reorder::REO_TIMER_FLOOR;
use smoltcp::time::Duration;

#[test]
fn data_that_arrives_twice_is_reported_in_a_dsack_block_first() {
    let (mut s, una) = Script::established(false);
    let mut a = seg(PEER_ISN + 1, una);
    a.len = 1000;
    s.input(a);
    s.out();
    // The same segment again (the peer's retransmission was spurious): an ACK at once, whose
    // first block lies below the cumulative ACK (RFC 2883 section 4.1.1).
    s.input(a);
    let out = s.out();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].ack, Some(PEER_ISN + 1001));
    assert_eq!(out[0].sack, vec![(PEER_ISN + 1, PEER_ISN + 1001)]);
    // Reported once: the next ACK carries no block.
    let mut b = seg(PEER_ISN + 1001, una);
    b.len = 1000;
    s.input(b);
    s.c.ack_now = true;
    let out = s.out();
    assert!(out.iter().all(|o| o.sack.is_empty()), "{out:?}");
}

#[test]
fn a_segment_overlapping_rcv_nxt_reports_only_its_old_part() {
    let (mut s, una) = Script::established(false);
    let mut a = seg(PEER_ISN + 1, una);
    a.len = 1000;
    s.input(a);
    s.out();
    // 500 old bytes and 500 new ones.
    let mut b = seg(PEER_ISN + 501, una);
    b.len = 1000;
    s.input(b);
    assert_eq!(s.c.readable(), 1500);
    let out = s.out();
    assert_eq!(out[0].ack, Some(PEER_ISN + 1501));
    assert_eq!(out[0].sack, vec![(PEER_ISN + 501, PEER_ISN + 1001)]);
}

#[test]
fn a_duplicate_above_rcv_nxt_is_followed_by_the_block_holding_it() {
    let (mut s, una) = Script::established(false);
    for off in [1000, 2000, 4000] {
        let mut a = seg(PEER_ISN + 1 + off, una);
        a.len = 1000;
        s.input(a);
    }
    s.out();
    let mut again = seg(PEER_ISN + 2001, una);
    again.len = 1000;
    s.input(again);
    let out = s.out();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].ack, Some(PEER_ISN + 1));
    // RFC 2883 section 4.1.2: the duplicate, the block that holds it, then the others.
    assert_eq!(
        out[0].sack,
        vec![
            (PEER_ISN + 2001, PEER_ISN + 3001),
            (PEER_ISN + 1001, PEER_ISN + 3001),
            (PEER_ISN + 4001, PEER_ISN + 5001),
        ]
    );
}

#[test]
fn a_first_block_inside_the_second_counts_as_a_dsack() {
    let (mut s, una) = Script::established(false);
    s.c.write(&[9u8; 5000]);
    assert_eq!(s.out().len(), 5);
    let mut ack = seg(PEER_ISN + 1, una);
    ack.sack = [
        Some((una + 2000, una + 3000)),
        Some((una + 1000, una + 4000)),
        None,
    ];
    s.input(ack);
    assert_eq!(s.c.stats.get().dsacks, 1);
    // A block below the cumulative ACK: the other form.
    let mut ack = seg(PEER_ISN + 1, una + 1000);
    ack.sack = [
        Some((una, una + 1000)),
        Some((una + 1000, una + 4000)),
        None,
    ];
    s.input(ack);
    assert_eq!(s.c.stats.get().dsacks, 2);
    // Two ordinary blocks are no D-SACK.
    let mut ack = seg(PEER_ISN + 1, una + 1000);
    ack.sack = [
        Some((una + 4000, una + 5000)),
        Some((una + 2000, una + 3000)),
        None,
    ];
    s.input(ack);
    assert_eq!(s.c.stats.get().dsacks, 2);
}

#[test]
fn an_older_ack_overtaken_on_the_path_is_not_a_dsack() {
    // The peer SACKed 2000..3000, then acknowledged everything to 4000; the older ACK
    // arrives last. Its block lies below SND.UNA now, but not below its own ACK field: stale
    // SACK information, not a duplicate (RFC 2883 section 4: a D-SACK block is the first
    // one, below the cumulative ACK of the same segment or inside the second block).
    let (mut s, una) = Script::established(false);
    s.c.write(&[9u8; 5000]);
    assert_eq!(s.out().len(), 5);
    let newer = seg(PEER_ISN + 1, una + 4000);
    let mut older = seg(PEER_ISN + 1, una + 1000);
    older.sack = [Some((una + 2000, una + 3000)), None, None];
    s.input(newer);
    s.input(older);
    assert_eq!(s.c.stats.get().dsacks, 0, "{:?}", s.c.stats.get());
    assert!(
        !s.c.reordering,
        "no evidence of reordering from a stale block"
    );
    // Nor is any block but the first, whatever it covers.
    let mut late = seg(PEER_ISN + 1, una + 4000);
    late.sack = [
        Some((una + 4000, una + 4500)),
        Some((una + 1000, una + 2000)),
        None,
    ];
    s.input(late);
    assert_eq!(s.c.stats.get().dsacks, 0);
}

#[test]
fn paws_lets_a_segment_one_tick_behind_through() {
    let (mut s, una) = Script::established(true);
    let mut a = seg(PEER_ISN + 1, una);
    a.len = 100;
    a.ts = Some((50, 0));
    s.input(a);
    // New data sent in the tick before (reordered behind the segment that set TS.Recent).
    let mut b = seg(PEER_ISN + 201, una);
    b.len = 100;
    b.ts = Some((49, 0));
    s.input(b);
    assert_eq!(s.c.stats.get().paws_dropped, 0);
    assert_eq!(s.c.ooo.len(), 1, "taken, out of order");
    // Two ticks behind is an old duplicate still, and is reported as one.
    s.out();
    let mut old = seg(PEER_ISN + 1, una);
    old.len = 100;
    old.ts = Some((48, 0));
    s.input(old);
    assert_eq!(s.c.stats.get().paws_dropped, 1);
    assert_eq!(s.c.readable(), 100);
    let out = s.out();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].sack[0], (PEER_ISN + 1, PEER_ISN + 101));
}

#[test]
fn an_original_delivered_late_is_reordering_and_slows_the_reordering_timer()
-> Result<(), &'static str> {
    let (mut s, una) = Script::established(false);
    // A 100 us path (the scripted handshake took no time).
    s.path_rtt(Duration::from_micros(100));
    s.c.write(&[9u8; 5000]);
    assert_eq!(s.out().len(), 5);
    s.advance(Duration::from_micros(100));
    // The second segment arrives before the first: a hole the reordering timer watches,
    // as precise as RACK's window before any reordering was seen.
    let mut ack = seg(PEER_ISN + 1, una);
    ack.sack[0] = Some((una + 1000, una + 2000));
    s.input(ack);
    assert!(!s.c.reordering);
    let first = s.c.reo_at.get().ok_or("the reordering timer")? - s.now;
    assert!(first < REO_TIMER_FLOOR, "{first}");
    // The first arrives (it was never resent): the path reorders (RFC 8985 section 6.2).
    s.input(seg(PEER_ISN + 1, una + 2000));
    assert!(s.c.reordering);
    assert_eq!(s.c.stats.get().retrans_segs, 0);
    // A later hole: the timer now waits at least the floor.
    let mut ack = seg(PEER_ISN + 1, una + 2000);
    ack.sack[0] = Some((una + 3000, una + 4000));
    s.input(ack);
    let later = s.c.reo_at.get().ok_or("the reordering timer")? - s.now;
    assert!(later >= REO_TIMER_FLOOR, "{later}");
    // When it fires with nothing heard, the hole is resent.
    let d = s.jump();
    assert!(d >= REO_TIMER_FLOOR);
    let out = s.out();
    assert_eq!((out[0].seq, out[0].len), (una + 2000, 1000), "{out:?}");
    Ok(())
}

#[test]
fn an_odd_last_segment_of_a_batch_waits_while_the_ack_covers_those_before_it() {
    let (mut s, una) = Script::established(false);
    // Three full segments arrive in one batch (before the connection sends anything).
    for k in 0..3u32 {
        let mut a = seg(PEER_ISN + 1 + 1000 * k, una);
        a.len = 1000;
        s.input(a);
    }
    let out = s.out();
    assert_eq!(out.len(), 1, "{out:?}");
    // What an ACK at the second segment would have said: the third waits, so that a
    // sender whose fourth was lost still has two out and probes it soon.
    assert_eq!(out[0].ack, Some(PEER_ISN + 2001));
    assert_eq!(s.c.readable(), 3000, "all three are taken");
    // Nothing more until the held ACK's time.
    s.advance(Duration::from_millis(5));
    assert!(s.out().is_empty());
    let d = s.jump();
    assert!(d >= Duration::from_millis(30), "{d}");
    let out = s.out();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].ack, Some(PEER_ISN + 3001));
}

#[test]
fn a_second_segment_or_data_to_send_acknowledges_the_held_one_at_once() {
    let (mut s, una) = Script::established(false);
    for k in 0..3u32 {
        let mut a = seg(PEER_ISN + 1 + 1000 * k, una);
        a.len = 1000;
        s.input(a);
    }
    assert_eq!(s.out()[0].ack, Some(PEER_ISN + 2001));
    // The fourth arrives: two unacknowledged, an ACK for all.
    let mut d = seg(PEER_ISN + 3001, una);
    d.len = 1000;
    s.input(d);
    assert_eq!(s.out()[0].ack, Some(PEER_ISN + 4001));
    for k in 4..7u32 {
        let mut a = seg(PEER_ISN + 1 + 1000 * k, una);
        a.len = 1000;
        s.input(a);
    }
    // A reply carries the ACK of everything.
    s.c.write(b"reply");
    let out = s.out();
    assert!(
        out.iter()
            .any(|o| o.len == 5 && o.ack == Some(PEER_ISN + 7001)),
        "{out:?}"
    );
}

/// A batch of arrivals that mostly extends the highest block but also changed a lower one
/// (a retransmission landing there, say) reports that lower block too: each block an
/// arrival changed is fresh once, however many arrivals extended the highest. Counted per
/// arrival, the highest block's forty pushed the lower one out of the list, it was never
/// reported, and a kernel sender through 5% loss resent what had arrived (1.5-2x the frames
/// the path lost).
#[test]
fn a_lower_block_changed_in_a_batch_is_reported_beside_the_growing_highest_one() {
    let (mut s, una) = Script::established(false);
    // Five blocks with holes between: 2000, 4000, 6000, 8000, 10000 (1000 bytes each).
    for off in [2000u32, 4000, 6000, 8000, 10_000] {
        let mut a = seg(PEER_ISN + 1 + off, una);
        a.len = 1000;
        s.input(a);
    }
    s.out();
    // One batch: the second block grows by 500 bytes, then the highest by forty segments.
    let mut low = seg(PEER_ISN + 1 + 5000, una);
    low.len = 500;
    s.input(low);
    for k in 0..40u32 {
        let mut a = seg(PEER_ISN + 1 + 11_000 + 1000 * k, una);
        a.len = 1000;
        s.input(a);
    }
    let out = s.out();
    let blocks: Vec<(u32, u32)> = out.iter().flat_map(|o| o.sack.clone()).collect();
    assert!(
        blocks.contains(&(PEER_ISN + 1 + 4000, PEER_ISN + 1 + 5500)),
        "the grown second block was not reported: {blocks:?}"
    );
}

#[test]
fn an_ack_for_a_first_transmission_in_the_same_tick_is_no_rtt_sample() -> Result<(), &'static str> {
    // Timestamps tick in milliseconds: a segment sent again within the tick of its first
    // transmission carries the same value, so the ACK of the first (which was only late)
    // echoes the retransmission's too. Its time since the retransmission is no round trip
    // (RFC 8985 section 6.2, step 2): neither the RTT estimator nor RACK may take it.
    let (mut s, una) = Script::established(true);
    s.path_rtt(Duration::from_micros(300));
    let into_tick = (s.now.total_micros() % 1000) as u64;
    s.advance(Duration::from_micros((1000 - into_tick) % 1000));
    let m = s.c.smss as u32;
    s.c.write(&vec![9u8; 5 * m as usize]);
    assert_eq!(s.out().len(), 5);
    let tick = s.c.ts_now(s.now);
    s.advance(Duration::from_micros(300));
    // The last four are SACKed: the first is deemed lost and sent again, in the same tick.
    let mut sack = seg(PEER_ISN + 1, una);
    sack.ts = Some((3, tick));
    sack.sack = [Some((una + m, una + 5 * m)), None, None];
    s.input(sack);
    let again = s.out();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!((again[0].seq, again[0].len), (una, m as usize));
    assert_eq!(s.c.ts_now(s.now), tick, "still the same tick");
    assert_eq!(s.c.rtt.min_rtt(), Some(Duration::from_micros(300)));
    // 50 us later the first transmission's ACK: the same echo.
    s.advance(Duration::from_micros(50));
    let mut late = seg(PEER_ISN + 1, una + 5 * m);
    late.ts = Some((4, tick));
    s.input(late);
    assert_eq!(s.c.rtt.min_rtt(), Some(Duration::from_micros(300)));
    assert_eq!(s.c.rack_rtt, Duration::from_micros(300));
    Ok(())
}
