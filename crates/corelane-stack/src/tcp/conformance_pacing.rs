//! Pacing: at a low rate a connection sends `burst` segments back to back and waits; at a high
//! rate a turn may send about a millisecond of the rate, so a path whose turns are slow is not
//! held to `burst` segments per turn. On the same scripted connection as `conformance.rs`.

use smoltcp::time::Duration;

use super::conformance::{PEER_ISN, Script, seg};

/// An established connection with pacing on, a window `cwnd` bytes wide (congestion
/// avoidance), an RTT of `rtt`, and what the send buffer takes of 200 KB written (two
/// windows).
fn paced(cwnd: usize, rtt: Duration) -> Script {
    let (mut s, _) = Script::established(false);
    std::sync::Arc::make_mut(&mut s.c.cfg).pacing = true;
    // The handshake's sample was 0: enough samples that the smoothed RTT is `rtt`.
    for _ in 0..64 {
        s.c.rtt.sample(rtt);
    }
    s.c.cc.cwnd = cwnd;
    s.c.cc.ssthresh = cwnd;
    let data = vec![9u8; 200_000];
    assert_eq!(s.c.write(&data), data.len().min(2 * cwnd));
    s
}

#[test]
fn at_a_low_rate_a_burst_is_the_configured_count() {
    // 60 KB per 100 ms: 1.2 segments per millisecond.
    let mut s = paced(60_000, Duration::from_millis(100));
    let burst = s.c.cfg.burst;
    let first = s.out().len();
    assert!(
        (burst..=burst + 1).contains(&first),
        "{first} segments, burst {burst}"
    );
    // Then one segment per 1.5 ms (1,064 bytes at 720 bytes per millisecond): 3 ms later,
    // about two more.
    s.advance(Duration::from_millis(3));
    let next = s.out().len();
    assert!((1..=3).contains(&next), "{next} segments");
}

#[test]
fn at_a_high_rate_a_turn_sends_a_millisecond_of_the_rate() {
    // 200 KB per 100 us: far more than the peer's 64 KiB window in a millisecond.
    let mut s = paced(200_000, Duration::from_micros(100));
    let burst = s.c.cfg.burst;
    let sent = s.out();
    let bytes: usize = sent.iter().map(|o| o.len).sum();
    assert!(sent.len() > 2 * burst, "{} segments", sent.len());
    assert_eq!(
        bytes, 65_000,
        "the peer's whole window (in full segments) in one turn"
    );
    // Acknowledged: the next turn goes on at once.
    let una = sent[0].seq;
    s.input(seg(PEER_ISN + 1, una.wrapping_add(bytes as u32)));
    assert!(s.out().len() > burst);
}

#[test]
fn a_delayed_ack_sample_does_not_slow_the_pace_to_its_round_trip() {
    // SRTT lifted to 5 ms by a peer that held an ACK for its delayed-ACK timer, on a path whose
    // deliveries take 150 us: the pace follows the deliveries, not the held ACK.
    let mut held = paced(60_000, Duration::from_millis(5));
    let at_srtt = held.out().len();
    let mut s = paced(60_000, Duration::from_millis(5));
    s.c.rack_rtt = Duration::from_micros(150);
    let sent = s.out().len();
    assert!(
        sent >= 2 * at_srtt,
        "{sent} segments, {at_srtt} at SRTT's pace"
    );
    // A path that really is 5 ms long is paced as before.
    let mut long = paced(60_000, Duration::from_millis(5));
    long.c.rack_rtt = Duration::from_millis(5);
    assert_eq!(long.out().len(), at_srtt);
}
