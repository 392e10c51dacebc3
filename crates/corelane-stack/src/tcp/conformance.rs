//! Conformance scripts for the engine, in the manner of packetdrill: one connection, segments
//! scripted in, the segments it sends checked field by field, the clock moved by hand. No
//! frames, no stack: what the RFCs say a TCP does, case by case. `fuzz.rs` drives the same
//! scripts with random segments.

use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{IpEndpoint, TcpControl, TcpRepr, TcpSeqNumber, TcpTimestampRepr};

use super::conn::{Conn, Sizes, TcpState};
use super::rtt::Rtt;
use super::secret::Secret;
use super::seq::Seq;
use super::wire::{FIN, Out, PSH, RST, SYN};
use super::{Congestion, TcpConfig};

/// A segment the connection sent, kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Sent {
    pub(super) seq: u32,
    pub(super) ack: Option<u32>,
    pub(super) flags: u8,
    /// The IP header said ECT(0).
    pub(super) ect: bool,
    pub(super) window: u16,
    pub(super) len: usize,
    pub(super) sack: Vec<(u32, u32)>,
    pub(super) ts: Option<(u32, u32)>,
    mss: Option<u16>,
    wscale: Option<u8>,
    sack_perm: bool,
}

impl Sent {
    fn of(o: &Out<'_>) -> Sent {
        Sent {
            seq: o.seq.0,
            ack: o.ack.map(|a| a.0),
            flags: o.flags,
            ect: o.ect,
            window: o.window,
            len: o.payload_len(),
            sack: o.sack[..o.nsack].iter().map(|&(l, r)| (l.0, r.0)).collect(),
            ts: o.ts,
            mss: o.mss,
            wscale: o.wscale,
            sack_perm: o.sack_perm,
        }
    }
}

/// A segment to script in.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seg {
    pub(super) seq: u32,
    pub(super) ack: Option<u32>,
    pub(super) ctl: TcpControl,
    pub(super) window: u16,
    pub(super) len: usize,
    pub(super) ts: Option<(u32, u32)>,
    pub(super) sack: [Option<(u32, u32)>; 3],
    pub(super) syn_opts: bool,
    /// The window scale a SYN offers (with `syn_opts`).
    pub(super) wscale: u8,
}

pub(super) fn seg(seq: u32, ack: u32) -> Seg {
    Seg {
        seq,
        ack: Some(ack),
        ctl: TcpControl::None,
        window: 65535,
        len: 0,
        ts: None,
        sack: [None; 3],
        syn_opts: false,
        wscale: 0,
    }
}

pub(super) const PEER_ISN: u32 = 5000;
pub(super) const PAYLOAD: [u8; 4096] = [7u8; 4096];

/// One connection and its clock.
pub(super) struct Script {
    pub(super) c: Conn,
    pub(super) now: Instant,
}

pub(super) fn cfg() -> TcpConfig {
    TcpConfig {
        // Keep the tests about the protocol, not the pacing clock.
        pacing: false,
        ..TcpConfig::default()
    }
}

pub(super) fn sizes() -> Sizes {
    Sizes {
        mss: 1000,
        rx_max: 64 * 1024,
        tx_max: 256 * 1024,
    }
}

pub(super) fn ends() -> (IpEndpoint, IpEndpoint) {
    let ep =
        |last, port| IpEndpoint::new(smoltcp::wire::Ipv4Address::new(10, 0, 0, last).into(), port);
    (ep(1, 80), ep(2, 40000))
}

impl Script {
    pub(super) fn repr(s: &Seg) -> TcpRepr<'static> {
        let (local, remote) = ends();
        TcpRepr {
            src_port: remote.port,
            dst_port: local.port,
            control: s.ctl,
            seq_number: TcpSeqNumber(s.seq as i32),
            ack_number: s.ack.map(|a| TcpSeqNumber(a as i32)),
            window_len: s.window,
            window_scale: s.syn_opts.then_some(s.wscale),
            max_seg_size: s.syn_opts.then_some(1000),
            sack_permitted: s.syn_opts,
            sack_ranges: s.sack,
            timestamp: s.ts.map(|(v, e)| TcpTimestampRepr::new(v, e)),
            payload: &PAYLOAD[..s.len],
        }
    }

    /// A passive open: the peer's SYN (with MSS, window scale 0 and SACK-permitted; with
    /// timestamps when `ts`) arrives and the SYN-ACK goes out.
    fn passive(ts: bool) -> (Script, Sent) {
        let now = Instant::from_secs(100);
        let mut syn = seg(PEER_ISN, 0);
        syn.ack = None;
        syn.ctl = TcpControl::Syn;
        syn.syn_opts = true;
        syn.ts = ts.then_some((1, 0));
        let r = Script::repr(&syn);
        let c = Conn::accept(cfg(), &Secret::new(1), ends(), &r, sizes(), now);
        let mut s = Script { c, now };
        let out = s.out();
        assert_eq!(out.len(), 1, "{out:?}");
        (s, out[0].clone())
    }

    /// An active open, nothing sent yet.
    pub(super) fn active() -> Script {
        let now = Instant::from_secs(1);
        Script {
            c: Conn::connect(cfg(), &Secret::new(3), ends().0, ends().1, sizes(), now),
            now,
        }
    }

    /// A passive open carried to ESTABLISHED. Returns the script and our ISN + 1.
    pub(super) fn established(ts: bool) -> (Script, u32) {
        let (mut s, synack) = Script::passive(ts);
        let una = synack.seq.wrapping_add(1);
        let mut ack = seg(PEER_ISN + 1, una);
        ack.ts = ts.then_some((2, synack.ts.map_or(0, |t| t.0)));
        s.input(ack);
        assert_eq!(s.c.state(), TcpState::Established);
        (s, una)
    }

    pub(super) fn input(&mut self, s: Seg) {
        let r = Script::repr(&s);
        self.c.input(self.now, &r);
    }

    /// Timers due by now, then everything the connection sends.
    pub(super) fn out(&mut self) -> Vec<Sent> {
        self.c.on_time(self.now);
        let mut v = Vec::new();
        self.c.output(self.now, 1000, &mut |o| {
            v.push(Sent::of(o));
            true
        });
        v
    }

    pub(super) fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// A path whose only round trip seen is `rtt`: the estimator afresh (floor 200 ms,
    /// ceiling 60 s, initial 1 s) with that one sample (the scripted handshake took no time).
    pub(super) fn path_rtt(&mut self, rtt: Duration) {
        self.c.rtt = Rtt::new(
            Duration::from_millis(200),
            Duration::from_secs(60),
            Duration::from_secs(1),
        );
        self.c.rtt.sample(rtt);
    }

    /// Moves the clock to the connection's next deadline.
    pub(super) fn jump(&mut self) -> Duration {
        let t = self.c.poll_at().expect("a timer");
        let d = t - self.now;
        self.now = self.now.max(t);
        d
    }
}

#[test]
fn a_passive_open_answers_with_every_option_offered() {
    let (_, synack) = Script::passive(true);
    assert_eq!(synack.flags, SYN);
    assert_eq!(synack.ack, Some(PEER_ISN + 1));
    assert_eq!(synack.mss, Some(1000));
    // 64 KiB fits in 16 bits with a scale of 0... plus one: 65536 needs a shift of 1.
    assert_eq!(synack.wscale, Some(1));
    assert!(synack.sack_perm);
    assert_eq!(
        synack.ts.map(|t| t.1),
        Some(1),
        "TSecr echoes the SYN's TSval"
    );
}

#[test]
fn a_lost_syn_ack_is_sent_again_with_backoff_and_the_attempt_ends() {
    let (mut s, first) = Script::passive(false);
    let mut gaps = Vec::new();
    loop {
        let d = s.jump();
        let out = s.out();
        if s.c.state() == TcpState::Closed {
            // Given up: a reset tells the peer.
            assert!(out.iter().any(|o| o.flags & RST != 0), "{out:?}");
            break;
        }
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].seq, first.seq, "the same ISN every time");
        gaps.push(d.total_millis());
    }
    // RFC 6298: 1 s before a sample, doubling.
    assert_eq!(&gaps[..4], &[1000, 2000, 4000, 8000]);
    assert_eq!(s.c.error(), Some(std::io::ErrorKind::TimedOut));
}

#[test]
fn a_retransmitted_syn_in_syn_received_gets_the_syn_ack_again() {
    let (mut s, first) = Script::passive(false);
    let mut syn = seg(PEER_ISN, 0);
    syn.ack = None;
    syn.ctl = TcpControl::Syn;
    s.input(syn);
    let out = s.out();
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].flags, out[0].seq), (SYN, first.seq));
}

/// A burst of identical SYNs (a forged source's) in SYN-RECEIVED: one SYN-ACK per 500 ms, as
/// Linux rate-limits them (`tcp_oow_rate_limited`), never one each toward the source.
#[test]
fn a_burst_of_retransmitted_syns_gets_one_syn_ack_per_half_second() {
    let (mut s, first) = Script::passive(false);
    let syn = || {
        let mut syn = seg(PEER_ISN, 0);
        syn.ack = None;
        syn.ctl = TcpControl::Syn;
        syn
    };
    let mut answered = 0;
    for _ in 0..20 {
        s.input(syn());
        answered += s.out().iter().filter(|o| o.flags == SYN).count();
    }
    assert_eq!(answered, 1, "20 SYNs at once");
    s.advance(Duration::from_millis(500));
    s.input(syn());
    let out = s.out();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!((out[0].flags, out[0].seq), (SYN, first.seq));
    assert_eq!(s.c.state(), TcpState::SynReceived);
}

#[test]
fn simultaneous_open_goes_through_syn_received() {
    let mut s = Script::active();
    let syn = s.out();
    assert_eq!(syn[0].flags, SYN);
    assert_eq!(syn[0].ack, None);
    let mut theirs = seg(PEER_ISN, 0);
    theirs.ack = None;
    theirs.ctl = TcpControl::Syn;
    theirs.syn_opts = true;
    s.input(theirs);
    assert_eq!(s.c.state(), TcpState::SynReceived);
    let out = s.out();
    assert_eq!((out[0].flags, out[0].ack), (SYN, Some(PEER_ISN + 1)));
    assert_eq!(out[0].seq, syn[0].seq, "the same ISN");
    let mut synack = seg(PEER_ISN, syn[0].seq + 1);
    synack.ctl = TcpControl::Syn;
    s.input(synack);
    s.input(seg(PEER_ISN + 1, syn[0].seq + 1));
    assert_eq!(s.c.state(), TcpState::Established);
}

#[test]
fn a_reset_to_a_syn_refuses_the_connection_and_a_bad_ack_earns_a_reset() {
    let mut s = Script::active();
    let iss = s.out()[0].seq;
    // An ACK for something else: answered with a reset from its ACK number, state kept.
    s.input(seg(9, iss.wrapping_add(77)));
    let out = s.out();
    assert_eq!((out[0].flags, out[0].seq), (RST, iss.wrapping_add(77)));
    assert_eq!(s.c.state(), TcpState::SynSent);
    // A reset without an acceptable ACK is ignored; with one it refuses.
    let mut rst = seg(0, iss.wrapping_add(5));
    rst.ctl = TcpControl::Rst;
    s.input(rst);
    assert_eq!(s.c.state(), TcpState::SynSent);
    rst.ack = Some(iss.wrapping_add(1));
    s.input(rst);
    assert_eq!(s.c.state(), TcpState::Closed);
    assert_eq!(s.c.error(), Some(std::io::ErrorKind::ConnectionRefused));
}

#[test]
fn resets_are_checked_per_rfc_5961() {
    let (mut s, una) = Script::established(false);
    let mut rst = seg(PEER_ISN + 1 + 500, una);
    rst.ctl = TcpControl::Rst;
    // In the window but not at RCV.NXT: a challenge ACK, and the connection stays.
    s.input(rst);
    assert_eq!(s.c.state(), TcpState::Established);
    let out = s.out();
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].flags, out[0].ack), (0, Some(PEER_ISN + 1)));
    // Outside the window: silently dropped.
    rst.seq = PEER_ISN + 1 + 10_000_000;
    s.input(rst);
    assert!(s.out().is_empty());
    // Exactly at RCV.NXT: the connection is reset.
    rst.seq = PEER_ISN + 1;
    s.input(rst);
    assert_eq!(s.c.state(), TcpState::Closed);
    assert_eq!(s.c.error(), Some(std::io::ErrorKind::ConnectionReset));
}

#[test]
fn a_syn_on_an_open_connection_earns_a_challenge_ack_only() {
    let (mut s, una) = Script::established(false);
    let mut syn = seg(PEER_ISN + 300, una);
    syn.ctl = TcpControl::Syn;
    s.input(syn);
    assert_eq!(s.c.state(), TcpState::Established);
    let out = s.out();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].ack, Some(PEER_ISN + 1));
    assert_eq!(s.c.stats.get().challenge_acks, 1);
}

#[test]
fn an_ack_for_data_never_sent_is_answered_and_ignored() {
    let (mut s, una) = Script::established(false);
    s.c.write(&[1; 100]);
    s.out();
    s.input(seg(PEER_ISN + 1, una.wrapping_add(5000)));
    let out = s.out();
    assert_eq!(out.len(), 1, "an ACK back");
    assert_eq!(s.c.snd_una, Seq(una), "nothing acknowledged");
}

#[test]
fn paws_drops_an_old_timestamp_and_acks() {
    let (mut s, una) = Script::established(true);
    let mut data = seg(PEER_ISN + 1, una);
    data.len = 100;
    data.ts = Some((50, 0));
    s.input(data);
    assert_eq!(s.c.readable(), 100);
    s.out();
    // An old duplicate with an earlier TSval and the next sequence number.
    let mut old = seg(PEER_ISN + 101, una);
    old.len = 100;
    old.ts = Some((40, 0));
    s.input(old);
    assert_eq!(s.c.readable(), 100, "not taken");
    assert_eq!(s.c.stats.get().paws_dropped, 1);
    assert_eq!(s.out().len(), 1, "an ACK");
}

#[test]
fn out_of_order_data_is_sacked_newest_block_first_and_filled_in_place() {
    let (mut s, una) = Script::established(false);
    let mut a = seg(PEER_ISN + 1 + 1000, una);
    a.len = 1000;
    s.input(a);
    let out = s.out();
    assert_eq!(out[0].ack, Some(PEER_ISN + 1));
    assert_eq!(out[0].sack, vec![(PEER_ISN + 1001, PEER_ISN + 2001)]);
    let mut b = seg(PEER_ISN + 1 + 3000, una);
    b.len = 1000;
    s.input(b);
    let out = s.out();
    assert_eq!(
        out[0].sack,
        vec![
            (PEER_ISN + 3001, PEER_ISN + 4001),
            (PEER_ISN + 1001, PEER_ISN + 2001)
        ]
    );
    // The first hole fills: RCV.NXT jumps over the first block.
    let mut h = seg(PEER_ISN + 1, una);
    h.len = 1000;
    s.input(h);
    let out = s.out();
    assert_eq!(out[0].ack, Some(PEER_ISN + 2001));
    assert_eq!(out[0].sack, vec![(PEER_ISN + 3001, PEER_ISN + 4001)]);
    let mut buf = [0u8; 4096];
    assert_eq!(s.c.read(s.now, &mut buf).0, 2000);
}

#[test]
fn a_zero_window_is_probed_and_sending_resumes_when_it_opens() {
    let (mut s, una) = Script::established(false);
    let mut shut = seg(PEER_ISN + 1, una);
    shut.window = 0;
    s.input(shut);
    s.c.write(&[1u8; 3000]);
    assert!(s.out().is_empty(), "nothing fits a zero window");
    let mut probes = 0;
    for _ in 0..3 {
        s.jump();
        for o in s.out() {
            assert_eq!(o.len, 1, "a one-byte probe");
            probes += 1;
            // The peer still has no room: it ACKs without taking the byte.
            s.input(shut);
        }
    }
    assert!(probes >= 2, "{probes} probes");
    assert_ne!(s.c.state(), TcpState::Closed, "a peer that answers is kept");
    // The window opens: the peer takes what arrives from then on, and all 3000 bytes get
    // through (the window after the probes' timeouts starts at one segment and grows).
    let mut acked = una;
    for _ in 0..20 {
        let mut open = seg(PEER_ISN + 1, acked);
        open.window = 10_000;
        s.input(open);
        let out = s.out();
        if let Some(last) = out.iter().map(|o| o.seq.wrapping_add(o.len as u32)).max() {
            acked = acked.max(last);
        } else if acked == una.wrapping_add(3000) {
            break;
        } else {
            s.jump();
        }
    }
    assert_eq!(acked, una.wrapping_add(3000));
}

#[test]
fn simultaneous_close_passes_through_closing_to_time_wait_and_ends() {
    let (mut s, una) = Script::established(true);
    s.c.close();
    let out = s.out();
    assert_eq!(out[0].flags & FIN, FIN);
    assert_eq!(s.c.state(), TcpState::FinWait1);
    // The peer's FIN crosses ours, not acknowledging it.
    let mut fin = seg(PEER_ISN + 1, una);
    fin.ctl = TcpControl::Fin;
    fin.ts = Some((5, 0));
    s.input(fin);
    assert_eq!(s.c.state(), TcpState::Closing);
    s.out();
    let mut ack = seg(PEER_ISN + 2, una + 1);
    ack.ts = Some((6, 0));
    s.input(ack);
    assert_eq!(s.c.state(), TcpState::TimeWait);
    // With timestamps, TIME-WAIT is the short one, and buffers are gone.
    let d = s.jump();
    assert_eq!(d, cfg().time_wait.into());
    s.out();
    assert_eq!(s.c.state(), TcpState::Closed);
}

#[test]
fn a_half_close_still_delivers_data_the_other_way() {
    let (mut s, una) = Script::established(false);
    let mut fin = seg(PEER_ISN + 1, una);
    fin.ctl = TcpControl::Fin;
    s.input(fin);
    assert_eq!(s.c.state(), TcpState::CloseWait);
    assert!(s.c.at_eof());
    assert_eq!(s.c.write(&[3u8; 500]), 500);
    s.c.close();
    let out = s.out();
    assert_eq!(out[0].len, 500);
    assert_eq!(
        out[0].flags & (FIN | PSH),
        FIN | PSH,
        "the FIN rides on the data"
    );
    assert_eq!(s.c.state(), TcpState::LastAck);
    s.input(seg(PEER_ISN + 2, una + 501));
    assert_eq!(s.c.state(), TcpState::Closed);
    assert_eq!(s.c.error(), None);
}

#[test]
fn newreno_is_selectable_per_connection() {
    let (mut s, _) = Script::established(false);
    assert_eq!(s.c.congestion(), Congestion::Cubic);
    s.c.set_congestion(Congestion::NewReno);
    assert_eq!(s.c.congestion(), Congestion::NewReno);
}

#[test]
fn isns_of_one_four_tuple_move_with_the_clock() {
    let secret = Secret::new(9);
    let a = Conn::connect(
        cfg(),
        &secret,
        ends().0,
        ends().1,
        sizes(),
        Instant::from_secs(1),
    );
    let b = Conn::connect(
        cfg(),
        &secret,
        ends().0,
        ends().1,
        sizes(),
        Instant::from_secs(2),
    );
    // RFC 6528: M ticks every 4 µs.
    assert_eq!(b.iss.diff(a.iss), 250_000);
}

#[test]
fn a_cookie_connection_never_sends_a_timestamp_older_than_its_syn_ack() -> Result<(), &'static str>
{
    // The cookie's options ride in the SYN-ACK's low TSval bits; at every offset within the
    // 32 ms those bits span, the connection's later segments must not look older (the peer's
    // PAWS would drop them).
    let secret = Secret::new(7);
    for ms in 0..40i64 {
        let now = Instant::from_millis(100_000 + ms);
        let mut syn = seg(PEER_ISN, 0);
        syn.ack = None;
        syn.ctl = TcpControl::Syn;
        syn.syn_opts = true;
        syn.ts = Some((1, 0));
        let out = super::cookie_syn_ack(&cfg(), &secret, ends(), &Script::repr(&syn), sizes(), now);
        let (tsval, _) = out.ts.ok_or("no timestamp")?;
        let mut ack = seg(PEER_ISN + 1, out.seq.0.wrapping_add(1));
        ack.ts = Some((2, tsval));
        let r = Script::repr(&ack);
        let info = secret
            .check_cookie(ends().0, ends().1, Seq(PEER_ISN), out.seq, now)
            .ok_or("the cookie did not check")?;
        let c = Conn::from_cookie(cfg(), &secret, ends(), &r, info, sizes(), now);
        let mut s = Script { c, now };
        s.input(ack);
        s.c.write(b"hello");
        let sent = s.out();
        let first = sent.first().ok_or("nothing sent")?;
        let later = first.ts.ok_or("no timestamp")?.0;
        assert!(
            Seq(later).ge(Seq(tsval)),
            "at +{ms} ms the SYN-ACK said {tsval}, then {later}"
        );
    }
    Ok(())
}
