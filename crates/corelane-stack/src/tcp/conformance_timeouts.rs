//! Conformance scripts for the timers that end a connection: keep-alive, RFC 5482's user
//! timeout (per socket, counted from the oldest unacknowledged data), on the same scripted
//! connection as `conformance.rs`.

use smoltcp::time::Duration;

use super::TcpState;
use super::conformance::{Script, cfg};

#[test]
fn keepalive_probes_a_quiet_peer_and_gives_up() {
    let (mut s, _) = Script::established(false);
    s.c.set_keepalive(Some(Duration::from_secs(10)), s.now);
    let mut probes = 0;
    while s.c.state() != TcpState::Closed {
        s.jump();
        probes += s.out().iter().filter(|o| o.len == 0).count();
        assert!(probes < 100);
    }
    assert_eq!(
        probes,
        cfg().keepalive_probes as usize + 1,
        "probes then a reset"
    );
    assert_eq!(s.c.error(), Some(std::io::ErrorKind::TimedOut));
}

#[test]
fn unacknowledged_data_ends_the_connection_after_the_user_timeout() {
    let (mut s, _) = Script::established(false);
    s.c.write(&[1u8; 100]);
    s.out();
    let start = s.now;
    while s.c.state() != TcpState::Closed {
        s.jump();
        s.out();
    }
    assert!(s.now - start >= cfg().user_timeout.into());
    assert_eq!(s.c.error(), Some(std::io::ErrorKind::TimedOut));
}

#[test]
fn a_socket_user_timeout_ends_the_connection_on_time_however_far_the_rto_backed_off() {
    let (mut s, _) = Script::established(false);
    s.c.set_user_timeout(Duration::from_secs(5));
    s.c.write(&[1u8; 100]);
    s.out();
    let start = s.now;
    let mut sends = 0;
    while s.c.state() != TcpState::Closed {
        s.jump();
        sends += s.out().len();
        assert!(sends < 100);
    }
    // 5 s, not the next backed-off RTO (1 s, 2 s, 4 s: the fourth would fire at 7 s).
    assert_eq!(s.now - start, Duration::from_secs(5));
    assert_eq!(s.c.error(), Some(std::io::ErrorKind::TimedOut));
}

#[test]
fn an_idle_spell_before_a_write_does_not_count_toward_the_user_timeout() {
    let (mut s, _) = Script::established(false);
    s.c.set_user_timeout(Duration::from_secs(5));
    // Quiet for a minute, nothing in flight: no timer at all.
    assert!(s.c.poll_at().is_none());
    s.advance(Duration::from_secs(60));
    s.c.write(&[1u8; 100]);
    assert_eq!(s.out().len(), 1);
    // The first retransmission timeout resends; the connection lives on.
    s.jump();
    assert_eq!(s.out().len(), 1, "a retransmission");
    assert_eq!(s.c.state(), TcpState::Established);
}

/// A SYN for a four-tuple in TIME-WAIT reopens it only as RFC 6191 allows: with a timestamp
/// newer than the last the connection saw (or, without timestamps, a sequence number above
/// all it received). An old duplicate or a blind forgery does not cut TIME-WAIT short.
#[test]
fn a_syn_reopens_time_wait_only_with_a_newer_timestamp_or_sequence_number() {
    use super::conformance::{PEER_ISN, seg};
    use smoltcp::wire::TcpControl;
    for ts in [true, false] {
        let (mut s, una) = Script::established(ts);
        // The peer closes first, then we do: TIME-WAIT is ours (we sent the last ACK).
        s.c.close();
        s.out();
        let mut fin = seg(PEER_ISN + 1, una + 1);
        fin.ctl = TcpControl::Fin;
        fin.ts = ts.then_some((50, 0));
        s.input(fin);
        s.out();
        assert_eq!(s.c.state(), TcpState::TimeWait, "timestamps {ts}");
        let syn = |seq: u32, tsval: u32| {
            let mut g = seg(seq, 0);
            g.ack = None;
            g.ctl = TcpControl::Syn;
            g.syn_opts = true;
            g.ts = ts.then_some((tsval, 0));
            g
        };
        let may = |s: &Script, g| s.c.syn_may_reopen(&Script::repr(&g));
        if ts {
            assert!(
                !may(&s, syn(PEER_ISN + 1_000_000, 49)),
                "an older timestamp"
            );
            assert!(
                !may(&s, syn(PEER_ISN + 1_000_000, 50)),
                "the same timestamp"
            );
            assert!(
                may(&s, syn(PEER_ISN - 5, 51)),
                "a newer timestamp, whatever the sequence"
            );
        } else {
            assert!(!may(&s, syn(PEER_ISN - 5, 0)), "below what was received");
            assert!(may(&s, syn(PEER_ISN + 1_000_000, 0)), "above it");
        }
    }
}

#[test]
fn a_syn_answered_by_an_old_connection_s_ack_is_reset_and_sent_again_once_at_once() {
    use super::conformance::seg;
    use super::wire::{RST, SYN};
    let mut s = Script::active();
    let iss = s.out()[0].seq;
    // A peer's TIME-WAIT that dropped the SYN for PAWS answers with its old connection's ACK.
    s.input(seg(9, iss.wrapping_add(77)));
    let out = s.out();
    let got: Vec<_> = out.iter().map(|o| (o.flags, o.seq)).collect();
    assert_eq!(got, [(RST, iss.wrapping_add(77)), (SYN, iss)], "{out:?}");
    assert_eq!(s.c.stats.get().syn_old_acks, 1);
    // Once only: the same answer again earns a reset, and the SYN waits for its timer.
    s.input(seg(9, iss.wrapping_add(77)));
    let out = s.out();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].flags, RST);
    assert_eq!(s.c.stats.get().syn_timeouts, 0);
    s.jump();
    let out = s.out();
    assert_eq!((out[0].flags, out[0].seq), (SYN, iss), "{out:?}");
    assert_eq!(
        s.c.stats.get().syn_timeouts,
        1,
        "the timer's SYN is counted"
    );
    assert_eq!(s.c.state(), TcpState::SynSent);
}
