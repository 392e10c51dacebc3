//! The urgent mechanism (RFC 9293 section 3.8.5, MUST-30 and MUST-31): urgent data of any
//! length is delivered inline, in order with the rest, and the application can learn how much
//! of what it has still to read is urgent. The urgent pointer is read as RFC 6093 (and
//! Linux) do: the sequence number of the octet after the urgent data. On the same scripted
//! connection as `conformance.rs`.

use super::conformance::{PEER_ISN, Script, ends, seg};
use super::ecn::EcnIn;
use super::wire::In;

/// The peer's data segment at `seq` of `len` bytes with urgent pointer `up` (None: URG off).
fn urgent_seg(seq: u32, ack: u32, len: usize, up: Option<u16>) -> In<'static> {
    let mut d = seg(seq, ack);
    d.len = len;
    let (local, remote) = ends();
    In {
        src_mac: [2, 0, 0, 0, 0, 2],
        local,
        remote,
        seg: Script::repr(&d),
        ecn: EcnIn::default(),
        urgent: up,
    }
}

#[test]
fn urgent_data_of_any_length_is_read_inline_and_its_end_is_known() {
    let (mut s, una) = Script::established(false);
    let now = s.now;
    assert_eq!(s.c.urgent_unread(), 0, "none before the peer marks any");
    // 100 bytes, the first 10 urgent.
    assert!(s.c.input_in(now, &urgent_seg(PEER_ISN + 1, una, 100, Some(10))));
    assert_eq!(s.c.urgent_unread(), 10);
    assert_eq!(s.c.stats.get().urgent_pointers, 1);
    let mut buf = [0u8; 4];
    assert_eq!(s.c.read(now, &mut buf).0, 4);
    assert_eq!(s.c.urgent_unread(), 6, "four of the urgent bytes read");
    // The next segment points past its own data (urgent data longer than a segment,
    // MUST-30): the urgent point moves on to 150 bytes after its start.
    assert!(s.c.input_in(now, &urgent_seg(PEER_ISN + 101, una, 100, Some(150))));
    assert_eq!(s.c.urgent_unread(), 96 + 150);
    // An older pointer (a retransmission, a reordered segment) never moves it back.
    let _ =
        s.c.input_in(now, &urgent_seg(PEER_ISN + 101, una, 0, Some(5)));
    assert_eq!(s.c.urgent_unread(), 96 + 150);
    // Nor does one past what the window allowed.
    let _ =
        s.c.input_in(now, &urgent_seg(PEER_ISN + 201, una, 0, Some(u16::MAX)));
    assert_eq!(s.c.urgent_unread(), 96 + 150);
    assert_eq!(s.c.stats.get().urgent_pointers, 2);
    // Every byte is read in order, urgent or not; once past the urgent point none is pending.
    let mut rest = vec![0u8; 1000];
    assert_eq!(s.c.read(now, &mut rest).0, 196);
    assert_eq!(
        s.c.urgent_unread(),
        50,
        "50 urgent bytes have not arrived yet"
    );
    assert!(s.c.input_in(now, &urgent_seg(PEER_ISN + 201, una, 60, None)));
    assert_eq!(s.c.read(now, &mut rest).0, 60);
    assert_eq!(s.c.urgent_unread(), 0);
    assert_eq!(s.c.rcv_up, None, "forgotten once read past");
}

#[test]
fn an_urgent_pointer_in_an_unacceptable_segment_is_not_taken() {
    let (mut s, una) = Script::established(false);
    let now = s.now;
    // Far outside the window: dropped (and answered with an ACK), its pointer with it.
    let _ =
        s.c.input_in(now, &urgent_seg(PEER_ISN + 1 + (1 << 30), una, 10, Some(5)));
    assert_eq!(s.c.urgent_unread(), 0);
    assert_eq!(s.c.stats.get().urgent_pointers, 0);
}
