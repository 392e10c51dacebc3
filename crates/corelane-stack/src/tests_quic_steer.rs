//! A UDP socket marked for QUIC, on core 0 of a two-core run, over the in-memory link: a
//! short-header datagram whose connection ID names core 1 is offered to the peers for core 1,
//! everything else is delivered here.

use std::task::Poll;

use smoltcp::time::Duration;
use smoltcp::wire::{IpCidr, Ipv4Address};

use crate::{Disposition, Pair, Peers, Stack, StackConfig, Unclaimed};

/// What the stack handed on, and what the peers answer.
struct Recorder {
    answer: Disposition,
    handed: Vec<(usize, usize)>,
}

impl Peers for Recorder {
    fn take_inbound(&mut self, _max: usize, _inject: &mut dyn FnMut(u8, &[u8])) -> usize {
        0
    }
    fn unclaimed(&mut self, _frame: Unclaimed<'_>) -> Disposition {
        Disposition::Answer
    }
    fn neighbor_reply(&mut self, _bytes: &[u8], _hops: u8) -> (u64, u64) {
        (0, 0)
    }
    fn end_turn(&mut self) {}
    fn hand_to(&mut self, core: usize, bytes: &[u8]) -> Disposition {
        self.handed.push((core, bytes.len()));
        self.answer
    }
}

/// Sends `payload` from b to a's port 4433 and runs a's turns with `peers`: what a's socket
/// `sock` then reads.
fn send_and_read(
    p: &mut Pair,
    sock: crate::FlowId,
    peers: &mut Recorder,
    payload: &[u8],
) -> Option<Vec<u8>> {
    let (b, _) = p.b.stack.bind_udp(0).ok()?;
    let to: std::net::SocketAddr = "10.9.0.1:4433".parse().ok()?;
    assert!(matches!(
        p.b.stack.udp_send_to(b, payload, to, None),
        Poll::Ready(Ok(_))
    ));
    let mut buf = vec![0u8; 2048];
    let mut got = None;
    for _ in 0..50 {
        let now = p.now();
        p.b.poll(now).ok()?;
        p.a.pipe.turn(&mut p.a.stack, now, peers);
        if let Poll::Ready(Ok((n, _))) = p.a.stack.udp_recv_from(sock, &mut buf, None) {
            got = Some(buf[..n].to_vec());
            break;
        }
        p.drive_for(Duration::from_millis(1), |_| {}).ok()?;
    }
    p.b.stack.release(b);
    got
}

#[test]
fn a_quic_socket_hands_short_headers_naming_another_core_and_keeps_the_rest()
-> Result<(), Box<dyn std::error::Error>> {
    let cfg = StackConfig {
        seed: Some(0x51ee),
        ..StackConfig::default()
    };
    let mut p = Pair::new(cfg);
    // a becomes core 0 of two.
    p.a.stack = Stack::new(
        &mut p.a.pipe.dev,
        [2, 0, 0, 0, 0, 1],
        &[IpCidr::new(Ipv4Address::new(10, 9, 0, 1).into(), 24)],
        StackConfig {
            core: 0,
            cores: 2,
            ..cfg
        },
    );
    let (sock, _) = p.a.stack.bind_udp(4433)?;
    let mut peers = Recorder {
        answer: Disposition::HandedOff,
        handed: Vec::new(),
    };
    let mine = p.a.stack.quic_cid_steer();
    assert_eq!(mine.core(), 0);
    let theirs = mine.for_core(1);
    let short = |cid: [u8; 8]| [&[0x43][..], &cid, &[0xaa; 40]].concat();
    let to_core1 = short(theirs.cid([1, 2, 3, 4, 5, 6, 7]));

    // Not yet marked: delivered here, whatever it names.
    let got = send_and_read(&mut p, sock, &mut peers, &to_core1);
    assert_eq!(got.as_deref(), Some(&to_core1[..]));
    assert!(peers.handed.is_empty());

    p.a.stack.udp_steer_quic(sock, true)?;
    // Naming core 1: handed to it, not delivered here.
    assert_eq!(send_and_read(&mut p, sock, &mut peers, &to_core1), None);
    assert_eq!(peers.handed.len(), 1);
    assert_eq!(peers.handed[0].0, 1, "handed to core 1");
    assert_eq!(
        peers.handed[0].1,
        14 + 20 + 8 + to_core1.len(),
        "the whole frame"
    );
    assert_eq!(p.a.stack.stats().handed_off, 1);

    // Naming this core, a long header, an ID of no core: delivered here.
    let here = short(mine.cid([7, 6, 5, 4, 3, 2, 1]));
    let long = [&[0xc3][..], &theirs.cid([1, 1, 1, 1, 1, 1, 1]), &[0; 40]].concat();
    for payload in [here, long, vec![0x40, 9, 9], Vec::new()] {
        let got = send_and_read(&mut p, sock, &mut peers, &payload);
        assert_eq!(got.as_deref(), Some(&payload[..]), "{payload:?}");
    }
    assert_eq!(peers.handed.len(), 1, "nothing more handed on");

    // Core 1 cannot take it now: dropped and counted; a peer that keeps it: delivered.
    peers.answer = Disposition::Dropped;
    assert_eq!(send_and_read(&mut p, sock, &mut peers, &to_core1), None);
    assert_eq!(p.a.stack.stats().handoff_dropped, 1);
    peers.answer = Disposition::Answer;
    let got = send_and_read(&mut p, sock, &mut peers, &to_core1);
    assert_eq!(got.as_deref(), Some(&to_core1[..]));

    // Unmarked again: kept.
    p.a.stack.udp_steer_quic(sock, false)?;
    let before = peers.handed.len();
    let got = send_and_read(&mut p, sock, &mut peers, &to_core1);
    assert_eq!(got.as_deref(), Some(&to_core1[..]));
    assert_eq!(peers.handed.len(), before);
    Ok(())
}
