//! ECN (RFC 3168) on the scripted connection of `conformance.rs`: the handshake's negotiation,
//! the receiver's echo until CWR, and the sender's one reduction per window with CWR on the
//! next new data and ECT only on new data.

use smoltcp::time::Instant;
use smoltcp::wire::TcpControl;

use super::EcnMode;
use super::conformance::{PEER_ISN, Script, Seg, Sent, cfg, ends, seg, sizes};
use super::conn::Conn;
use super::ecn::{CWR, ECE, EcnIn};
use super::secret::Secret;
use super::wire::SYN;

const NONE: EcnIn = EcnIn {
    ce: false,
    ece: false,
    cwr: false,
};

/// A passive open whose SYN asks for ECN when `ask`, on a stack in `mode`, carried to
/// ESTABLISHED. Returns the script, our ISN + 1 and the SYN-ACK.
fn open(mode: EcnMode, ask: bool) -> (Script, u32, Sent) {
    let now = Instant::from_secs(100);
    let mut syn = seg(PEER_ISN, 0);
    syn.ack = None;
    syn.ctl = TcpControl::Syn;
    syn.syn_opts = true;
    let config = super::TcpConfig { ecn: mode, ..cfg() };
    let mut c = Conn::accept(
        config,
        &Secret::new(1),
        ends(),
        &Script::repr(&syn),
        sizes(),
        now,
    );
    c.ecn_on_syn(EcnIn {
        ece: ask,
        cwr: ask,
        ..NONE
    });
    let mut s = Script { c, now };
    let out = s.out();
    let synack = out.first().cloned().unwrap_or_else(|| panic!("no SYN-ACK"));
    let una = synack.seq.wrapping_add(1);
    s.input(seg(PEER_ISN + 1, una));
    (s, una, synack)
}

fn input(s: &mut Script, g: Seg, e: EcnIn) {
    let r = Script::repr(&g);
    s.c.input_ecn(s.now, &r, e);
}

#[test]
fn a_syn_asking_for_ecn_gets_ece_on_the_syn_ack_and_new_data_is_ect() {
    let (mut s, _, synack) = open(EcnMode::Accept, true);
    assert_eq!(synack.flags & (SYN | ECE | CWR), SYN | ECE, "ECE, not CWR");
    assert!(!synack.ect, "never ECT on a SYN-ACK");
    assert_eq!(s.c.write(&[1u8; 3000]), 3000);
    let out = s.out();
    assert_eq!(out.len(), 3);
    assert!(
        out.iter().all(|o| o.ect && o.flags & (ECE | CWR) == 0),
        "{out:?}"
    );
}

#[test]
fn ecn_is_declined_when_off_and_not_used_when_not_asked() {
    for (mode, ask) in [
        (EcnMode::Off, true),
        (EcnMode::Accept, false),
        (EcnMode::On, false),
    ] {
        let (mut s, _, synack) = open(mode, ask);
        assert_eq!(synack.flags & (ECE | CWR), 0, "{mode:?} {ask}");
        s.c.write(&[1u8; 100]);
        let out = s.out();
        assert!(out.iter().all(|o| !o.ect), "{mode:?} {ask}: {out:?}");
    }
}

#[test]
fn an_active_open_asks_when_on_and_uses_ecn_only_if_the_syn_ack_agrees() {
    for (agree, expect) in [(true, true), (false, false)] {
        let mut s = Script::active();
        std::sync::Arc::make_mut(&mut s.c.cfg).ecn = EcnMode::On;
        let syn = s.out();
        assert_eq!(syn[0].flags, SYN | ECE | CWR);
        assert!(!syn[0].ect);
        let mut synack = seg(PEER_ISN, syn[0].seq.wrapping_add(1));
        synack.ctl = TcpControl::Syn;
        synack.syn_opts = true;
        input(&mut s, synack, EcnIn { ece: agree, ..NONE });
        s.c.write(&[1u8; 100]);
        let out = s.out();
        let data = out.iter().find(|o| o.len > 0).cloned();
        assert_eq!(data.map(|d| d.ect), Some(expect), "{out:?}");
    }
}

#[test]
fn a_ce_mark_is_echoed_at_once_and_on_every_ack_until_cwr() {
    let (mut s, una, _) = open(EcnMode::Accept, true);
    let mut d = seg(PEER_ISN + 1, una);
    d.len = 100;
    input(&mut s, d, EcnIn { ce: true, ..NONE });
    assert_eq!(s.c.stats.get().ecn_ce, 1);
    let ack = s.out();
    assert_eq!(ack.len(), 1, "ACKed at once, not delayed");
    assert_eq!(ack[0].flags & ECE, ECE);
    // Unmarked data: still echoed.
    let mut d = seg(PEER_ISN + 101, una);
    d.len = 100;
    input(&mut s, d, NONE);
    s.advance(smoltcp::time::Duration::from_millis(50));
    let ack = s.out();
    assert!(ack.iter().all(|o| o.flags & ECE == ECE), "{ack:?}");
    assert!(!ack.is_empty());
    // The sender's CWR ends the echo.
    let mut d = seg(PEER_ISN + 201, una);
    d.len = 100;
    input(&mut s, d, EcnIn { cwr: true, ..NONE });
    s.advance(smoltcp::time::Duration::from_millis(50));
    let ack = s.out();
    assert!(!ack.is_empty());
    assert!(ack.iter().all(|o| o.flags & ECE == 0), "{ack:?}");
}

#[test]
fn an_ece_reduces_the_window_once_per_window_and_cwr_goes_on_the_next_new_data() {
    let (mut s, una, _) = open(EcnMode::Accept, true);
    assert_eq!(s.c.write(&[1u8; 60_000]), 60_000);
    let first = s.out();
    let cwnd = s.c.cc.cwnd;
    let flight: usize = first.iter().map(|o| o.len).sum();
    assert!(first.len() >= 4, "{first:?}");
    // The first two segments are acknowledged with ECE.
    let acked = una.wrapping_add(2000);
    input(
        &mut s,
        seg(PEER_ISN + 1, acked),
        EcnIn { ece: true, ..NONE },
    );
    assert_eq!(s.c.stats.get().ecn_reductions, 1);
    assert!(
        s.c.cc.ssthresh < cwnd,
        "ssthresh {} cwnd was {cwnd}",
        s.c.cc.ssthresh
    );
    // More ECEs for the same window: no further reduction.
    let ssthresh = s.c.cc.ssthresh;
    input(
        &mut s,
        seg(PEER_ISN + 1, acked.wrapping_add(1000)),
        EcnIn { ece: true, ..NONE },
    );
    assert_eq!(s.c.stats.get().ecn_reductions, 1);
    assert_eq!(s.c.cc.ssthresh, ssthresh);
    // Nothing is resent for a mark.
    assert_eq!(s.c.stats.get().retrans_segs, 0);
    // The window acknowledged in full, new data goes out: the first carries CWR, once.
    let end = una.wrapping_add(flight as u32);
    input(&mut s, seg(PEER_ISN + 1, end), NONE);
    let next = s.out();
    assert!(next.len() >= 2, "{next:?}");
    assert_eq!(next[0].flags & CWR, CWR);
    assert!(next[1..].iter().all(|o| o.flags & CWR == 0), "{next:?}");
    assert!(next.iter().all(|o| o.ect));
    // A new window, a new mark: a second reduction.
    let more: usize = next.iter().map(|o| o.len).sum();
    input(
        &mut s,
        seg(PEER_ISN + 1, end.wrapping_add(more as u32)),
        EcnIn { ece: true, ..NONE },
    );
    assert_eq!(s.c.stats.get().ecn_reductions, 2);
}

#[test]
fn retransmissions_are_not_ect() {
    let (mut s, _, _) = open(EcnMode::Accept, true);
    s.c.write(&[1u8; 1000]);
    let first = s.out();
    assert!(first[0].ect);
    // No ACK: the retransmission timer resends it, not ECN-capable.
    s.jump();
    let again = s.out();
    let resent = again.iter().find(|o| o.len > 0).cloned();
    assert_eq!(resent.map(|o| (o.seq, o.ect)), Some((first[0].seq, false)));
}
