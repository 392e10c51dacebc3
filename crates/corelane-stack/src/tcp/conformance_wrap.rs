//! Long and ending transfers. Sequence space wraps (RFC 9293 section 3.4): nothing may compare a sequence number with
//! one from the start of the connection after 2 GiB have passed. On the same scripted
//! connection as `conformance.rs`, with the initial send sequence number moved to where it
//! would be 2 GiB into a transfer.

use super::conformance::{PEER_ISN, Script, seg};
use super::seq::Seq;

#[test]
fn two_gib_into_a_transfer_the_send_ring_still_starts_at_snd_una() {
    let (mut s, una) = Script::established(false);
    // As if 2 GiB and 1000 bytes had been sent and acknowledged.
    s.c.iss = Seq(una).minus((1 << 31) + 1000);
    assert_eq!(s.c.data_base(), Seq(una));
    assert_eq!(s.c.write(&[7u8; 3000]), 3000);
    let out = s.out();
    assert_eq!(out.iter().map(|o| o.len).sum::<usize>(), 3000);
    assert_eq!(out[0].seq, una, "the first new byte goes out at SND.NXT");
    // Half of it acknowledged: the ring gives up exactly that much.
    s.input(seg(PEER_ISN + 1, una.wrapping_add(1448)));
    assert_eq!(s.c.snd.len(), 3000 - 1448);
    assert_eq!(s.c.data_base(), Seq(una.wrapping_add(1448)));
    assert_eq!(s.c.unsent(), 0);
}

/// What arrived and was not read yet survives the connection's end: a half-closed side whose
/// reader is behind when the peer's FIN moves it to TIME-WAIT, and a passive closer whose FIN
/// is acknowledged (LAST-ACK to CLOSED), still read every byte, then the end.
#[test]
fn unread_data_stays_readable_through_time_wait_and_closed() {
    // Active close: our FIN first (FIN-WAIT), then 3000 bytes and the peer's FIN.
    let (mut s, una) = Script::established(false);
    s.c.close();
    s.out();
    s.input(seg(PEER_ISN + 1, una.wrapping_add(1)));
    assert_eq!(s.c.state(), super::TcpState::FinWait2);
    let mut data = seg(PEER_ISN + 1, una.wrapping_add(1));
    data.len = 3000;
    s.input(data);
    let mut fin = seg(PEER_ISN + 3001, una.wrapping_add(1));
    fin.ctl = smoltcp::wire::TcpControl::Fin;
    s.input(fin);
    assert_eq!(s.c.state(), super::TcpState::TimeWait);
    let mut buf = [0u8; 4096];
    assert_eq!(
        s.c.read(s.now, &mut buf).0,
        3000,
        "read after TIME-WAIT began"
    );
    assert!(s.c.at_eof());
    assert_eq!(s.c.rcv.capacity(), 0, "given back once read");

    // Passive close: the peer's data and FIN, our FIN acknowledged, then the read.
    let (mut s, una) = Script::established(false);
    let mut data = seg(PEER_ISN + 1, una);
    data.len = 2000;
    data.ctl = smoltcp::wire::TcpControl::Fin;
    s.input(data);
    assert_eq!(s.c.state(), super::TcpState::CloseWait);
    s.c.close();
    s.out();
    s.input(seg(PEER_ISN + 2002, una.wrapping_add(1)));
    assert_eq!(s.c.state(), super::TcpState::Closed);
    assert_eq!(s.c.error(), None);
    assert_eq!(
        s.c.read(s.now, &mut buf).0,
        2000,
        "read after the connection closed"
    );
}
