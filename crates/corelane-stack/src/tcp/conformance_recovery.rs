//! Conformance scripts for loss recovery: SACK holes, the tail loss probe, the RTO's backoff,
//! RACK's reordering window and path MTU discovery's resends, on the same scripted connection
//! as `conformance.rs`.

use smoltcp::time::Duration;

use super::conformance::{PEER_ISN, Script, seg};
use super::due::Due;
use super::{IcmpError, Seq, TcpState};

/// Ten full segments sent from an established connection; returns the script and SND.UNA.
fn ten_in_flight() -> (Script, u32) {
    let (mut s, una) = Script::established(false);
    // The handshake's RTT sample: one second (the clock did not move), floor 200 ms.
    s.c.write(&[9u8; 10_000]);
    let out = s.out();
    assert_eq!(out.len(), 10);
    assert!(out.iter().all(|o| o.len == 1000));
    (s, una)
}

#[test]
fn sack_recovery_resends_only_the_holes() {
    let (mut s, una) = ten_in_flight();
    s.advance(Duration::from_millis(10));
    // Segments 0 and 1 lost; 2..10 arrive: the peer's ACKs say so.
    let mut ack = seg(PEER_ISN + 1, una);
    ack.sack[0] = Some((una + 2000, una + 10_000));
    s.input(ack);
    let out = s.out();
    let resent: Vec<(u32, usize)> = out.iter().map(|o| (o.seq, o.len)).collect();
    assert_eq!(resent, vec![(una, 1000), (una + 1000, 1000)]);
    assert_eq!(s.c.stats.get().fast_recoveries, 1);
    assert_eq!(s.c.stats.get().retrans_segs, 2);
    // Both arrive: everything is acknowledged, recovery ends, nothing else is sent.
    s.advance(Duration::from_millis(10));
    s.input(seg(PEER_ISN + 1, una + 10_000));
    assert!(s.out().is_empty());
    assert!(s.c.recovery.is_none());
    assert!(s.c.cwnd() >= 2 * 1000);
}

#[test]
fn a_tail_loss_is_probed_before_the_retransmission_timer() {
    let (mut s, una) = ten_in_flight();
    s.advance(Duration::from_millis(10));
    // Everything but the last two segments arrives (with one segment left, the probe would
    // wait for the peer's delayed ACK as long as the RTO).
    s.input(seg(PEER_ISN + 1, una + 8000));
    assert!(s.out().is_empty());
    let d = s.jump();
    let out = s.out();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (out[0].seq, out[0].len),
        (una + 9000, 1000),
        "the last segment again"
    );
    assert_eq!(s.c.stats.get().tail_probes, 1);
    assert!(d < s.c.rtt.rto(), "the probe ({d}) came before the RTO");
}

#[test]
fn the_retransmission_timer_backs_off_from_a_200_ms_floor() {
    let (mut s, una) = ten_in_flight();
    // The timer alone (the recovery probe would send the next hole between expiries).
    std::sync::Arc::make_mut(&mut s.c.cfg).recovery_probe = false;
    // A fast path: SRTT far below the floor.
    s.c.rtt.sample(Duration::from_micros(50));
    s.c.probe.exhaust();
    s.c.rto_at = Due::from(Some(s.now + s.c.rtt.rto()));
    let mut gaps = Vec::new();
    for _ in 0..4 {
        let d = s.jump();
        let out = s.out();
        assert_eq!(out[0].seq, una, "go back to the first unacknowledged byte");
        gaps.push(d.total_millis());
    }
    assert_eq!(gaps, vec![200, 400, 800, 1600]);
    assert_eq!(s.c.cwnd(), 1000, "one segment after a timeout");
    assert_eq!(s.c.stats.get().rto_expiries, 4);
}

#[test]
fn a_d_sack_widens_the_reordering_window_and_undoes_the_spurious_reduction() {
    let (mut s, una) = ten_in_flight();
    let cwnd = s.c.cwnd();
    s.advance(Duration::from_millis(10));
    // The first segment looks lost (2..10 SACKed) and is resent...
    let mut ack = seg(PEER_ISN + 1, una);
    ack.sack[0] = Some((una + 1000, una + 10_000));
    s.input(ack);
    assert_eq!(s.out().len(), 1);
    assert!(s.c.cwnd() < cwnd, "the window is reduced");
    // ...but the original was only late: the peer acks everything and reports the copy as a
    // duplicate (RFC 2883), twice in the same round.
    for _ in 0..2 {
        let mut dup = seg(PEER_ISN + 1, una + 10_000);
        dup.sack[0] = Some((una, una + 1000));
        s.input(dup);
    }
    assert_eq!(s.c.stats.get().dsacks, 2);
    assert!(s.c.reordering);
    assert_eq!(s.c.reo_mult, 2, "widened once for the round");
    // The one retransmission was reported as a duplicate: the reduction is undone, once.
    assert_eq!(s.c.stats.get().undos, 1);
    assert!(s.c.cwnd() >= cwnd, "{} < {cwnd}", s.c.cwnd());
}

#[test]
fn a_packet_too_big_cuts_what_is_in_flight_and_resends_it_without_a_congestion_response() {
    let (mut s, una) = ten_in_flight();
    let ssthresh = s.c.cc.ssthresh;
    // A message quoting a sequence number not in flight (a blind forgery) changes nothing,
    // and neither does an MTU no smaller than the one in use.
    let stale = Seq(una.wrapping_sub(5000));
    assert!(!s.c.on_icmp(s.now, IcmpError::TooBig(600), stale));
    assert!(!s.c.on_icmp(s.now, IcmpError::TooBig(1500), Seq(una + 1000)));
    assert_eq!(s.c.mss(), 1000);
    // A 600-byte hop: 560-byte segments (IPv4, no timestamps).
    assert!(s.c.on_icmp(s.now, IcmpError::TooBig(600), Seq(una + 1000)));
    assert_eq!(s.c.mss(), 560);
    let out = s.out();
    assert!(!out.is_empty());
    assert!(out.iter().all(|o| o.len <= 560), "{out:?}");
    let mut next = una;
    for o in &out {
        assert_eq!(o.seq, next, "the cut pieces go out in order from SND.UNA");
        next = next.wrapping_add(o.len as u32);
    }
    assert_eq!(s.c.stats.get().pmtu_updates, 1);
    assert_eq!(s.c.stats.get().fast_recoveries, 0, "not a congestion loss");
    assert_eq!(s.c.cc.ssthresh, ssthresh);
    // An MTU under the floor is raised to it (552 bytes: 512-byte segments).
    assert!(s.c.on_icmp(s.now, IcmpError::TooBig(68), Seq(una + 1000)));
    assert_eq!(s.c.mss(), 512);
}

#[test]
fn icmp_unreachable_refuses_an_opening_connection_or_is_reported_when_it_times_out() {
    // A hard error (port unreachable) to a SYN: refused at once.
    let mut s = Script::active();
    let iss = Seq(s.out()[0].seq);
    assert!(s.c.on_icmp(s.now, IcmpError::Refused, iss));
    assert_eq!(s.c.state(), TcpState::Closed);
    assert_eq!(s.c.error(), Some(std::io::ErrorKind::ConnectionRefused));
    // A soft error (host unreachable): the SYNs go on; the timeout reports it.
    let mut s = Script::active();
    let iss = Seq(s.out()[0].seq);
    assert!(!s.c.on_icmp(s.now, IcmpError::Unreachable, Seq(iss.0.wrapping_add(7))));
    assert!(s.c.on_icmp(s.now, IcmpError::Unreachable, iss));
    assert_eq!(s.c.state(), TcpState::SynSent);
    while s.c.state() != TcpState::Closed {
        s.jump();
        s.out();
    }
    assert_eq!(s.c.error(), Some(std::io::ErrorKind::HostUnreachable));
}

/// `ten_in_flight` on a 1 ms path.
fn ten_in_flight_1ms() -> (Script, u32) {
    let (mut s, una) = ten_in_flight();
    for _ in 0..16 {
        s.c.rtt.sample(Duration::from_millis(1));
    }
    s.c.arm_tlp(s.now);
    (s, una)
}

#[test]
fn a_silent_recovery_is_probed_and_the_lost_retransmission_found_before_the_timer() {
    let (mut s, una) = ten_in_flight_1ms();
    s.c.write(&[9u8; 3000]);
    s.advance(Duration::from_millis(2));
    // Segment 0 lost, 1..10 arrive: it is resent, with the new data PRR allows.
    let mut ack = seg(PEER_ISN + 1, una);
    ack.sack[0] = Some((una + 1000, una + 10_000));
    s.input(ack);
    let out = s.out();
    let seqs: Vec<u32> = out.iter().map(|o| o.seq).collect();
    assert_eq!(seqs, vec![una, una + 10_000, una + 11_000, una + 12_000]);
    // All of that is lost: nothing comes back. Two SRTT later (2 ms at least), one probe:
    // no hole is left and no data is new, so the newest segment in flight goes again.
    let two_srtt = s.c.rtt.srtt().map(|r| r * 2);
    let d = s.jump();
    assert_eq!(Some(d), two_srtt);
    assert!(d >= Duration::from_millis(2));
    let out = s.out();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].seq, una + 12_000);
    assert_eq!(s.c.stats.get().recovery_probes, 1);
    assert_eq!(s.c.stats.get().tail_probes, 0);
    // If that brings nothing either, a second probe twice as late.
    assert_eq!(s.c.probe.deadline(), Some(s.now + d * 2));
    // The probe arrives: its SACK tells RACK that everything sent before it is lost, the
    // retransmission of segment 0 included, long before the 200 ms timer.
    s.advance(Duration::from_millis(1));
    let mut ack = seg(PEER_ISN + 1, una);
    ack.sack[0] = Some((una + 12_000, una + 13_000));
    ack.sack[1] = Some((una + 1000, una + 10_000));
    s.input(ack);
    let out = s.out();
    assert_eq!(out.first().map(|o| o.seq), Some(una), "{out:?}");
    assert_eq!(s.c.stats.get().rto_expiries, 0);
    // Without the probe the timer would have been the only way out.
    let (mut s, una) = ten_in_flight_1ms();
    std::sync::Arc::make_mut(&mut s.c.cfg).recovery_probe = false;
    s.advance(Duration::from_millis(2));
    let mut ack = seg(PEER_ISN + 1, una);
    ack.sack[0] = Some((una + 1000, una + 10_000));
    s.input(ack);
    assert_eq!(s.out().len(), 1);
    let d = s.jump();
    // Armed when the flight went out, 2 ms before the SACK.
    assert_eq!(d, Duration::from_millis(198));
    assert_eq!(s.out()[0].seq, una);
    assert_eq!(s.c.stats.get().rto_expiries, 1);
    assert_eq!(s.c.stats.get().recovery_probes, 0);
}

#[test]
fn after_a_timeout_probes_send_the_next_holes_and_a_lost_retransmission_waits_no_doubled_timer() {
    let (mut s, una) = ten_in_flight_1ms();
    s.c.probe.exhaust();
    // The whole flight is lost: the timer, then the first segment alone (a window of one).
    let d = s.jump();
    assert_eq!(d, Duration::from_millis(200));
    let out = s.out();
    assert_eq!(out.iter().map(|o| o.seq).collect::<Vec<_>>(), vec![una]);
    assert_eq!(s.c.rtt.rto(), Duration::from_millis(400), "backed off");
    // That is lost too. 2 ms on (the floor of the probe timeout), the probe: the next hole;
    // lost as well, and 4 ms later a second probe, the hole after.
    for (i, wait) in [(1, 2), (2, 4)] {
        let d = s.jump();
        assert_eq!(d, Duration::from_millis(wait));
        let out = s.out();
        let seqs: Vec<u32> = out.iter().map(|o| o.seq).collect();
        assert_eq!(seqs, vec![una + 1000 * i]);
        assert_eq!(s.c.stats.get().recovery_probes, u64::from(i));
    }
    // No third: the timer is next, a backed-off RTO after the last probe.
    assert!(s.c.probe.deadline().is_none());
    assert_eq!(s.c.poll_at(), Some(s.now + Duration::from_millis(400)));
    // The second probe arrives; RACK finds the first segment's retransmission lost and sends
    // it again without waiting for the timer.
    s.advance(Duration::from_millis(1));
    let mut ack = seg(PEER_ISN + 1, una);
    ack.sack[0] = Some((una + 2000, una + 3000));
    s.input(ack);
    let out = s.out();
    assert_eq!(out.first().map(|o| o.seq), Some(una), "{out:?}");
    assert_eq!(s.c.stats.get().rto_expiries, 1);
}

#[test]
fn an_ack_echoing_a_retransmission_s_timestamp_is_a_sample_and_ends_the_backoff() {
    for echo_retransmission in [true, false] {
        let (mut s, una) = Script::established(true);
        for _ in 0..16 {
            s.c.rtt.sample(Duration::from_millis(1));
        }
        s.c.write(&[9u8; 2000]);
        let first = s.out();
        assert!(first.len() >= 2, "{first:?}");
        s.c.probe.exhaust();
        s.jump();
        let again = s.out();
        assert_eq!(again[0].seq, una);
        assert_eq!(s.c.rtt.rto(), Duration::from_millis(400));
        // The peer acknowledges the first segment. Its echo names the transmission it
        // answers: the retransmission (a sample: the backoff ends) or the original (it is
        // ambiguous which one arrived, so Karn's rule holds and the backoff stays).
        s.advance(Duration::from_millis(1));
        let echoed = if echo_retransmission {
            &again[0]
        } else {
            &first[0]
        };
        let mut ack = seg(PEER_ISN + 1, una.wrapping_add(again[0].len as u32));
        ack.ts = Some((3, echoed.ts.expect("timestamps").0));
        s.input(ack);
        let rto = if echo_retransmission { 200 } else { 400 };
        assert_eq!(
            s.c.rtt.rto(),
            Duration::from_millis(rto),
            "{echo_retransmission}"
        );
    }
}

#[test]
fn a_recovery_probe_waits_out_a_delayed_ack_when_the_peer_may_have_no_hole() {
    let (mut s, _) = Script::established(false);
    for _ in 0..16 {
        s.c.rtt.sample(Duration::from_millis(1));
    }
    s.c.write(&[9u8; 1000]);
    assert_eq!(s.out().len(), 1);
    // A reduction with nothing lost (what an ECN-Echo brings): one segment out, the peer
    // holds nothing out of order and may delay its ACK, so no probe within 200 ms.
    s.c.enter_recovery();
    s.c.arm_tlp(s.now);
    let probe = s.c.probe.deadline().expect("armed");
    assert!(
        probe - s.now >= Duration::from_millis(200),
        "{}",
        probe - s.now
    );
}
