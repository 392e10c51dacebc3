//! Where a connection's replies go, and with which TTL: to the hardware address its peer's segments come from,
//! learnt only from segments that pass the sequence checks. A replayed old segment with
//! another source address (an attacker on the link forging the peer) turns nothing.

use std::collections::VecDeque;
use std::task::Poll;

use smoltcp::time::Duration;

use crate::{Pair, StackConfig};

fn cfg() -> StackConfig {
    StackConfig {
        seed: Some(0x7e57),
        ..StackConfig::default()
    }
}

/// The TCP payload length of an IPv4 frame (0 for anything else).
fn tcp_payload(f: &[u8]) -> usize {
    if f.len() < 34 || u16::from_be_bytes([f[12], f[13]]) != 0x0800 || f[23] != 6 {
        return 0;
    }
    let ihl = usize::from(f[14] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let doff = f.get(14 + ihl + 12).map_or(0, |b| usize::from(b >> 4) * 4);
    total.saturating_sub(ihl + doff)
}

#[test]
fn a_replayed_segment_from_another_hardware_address_does_not_move_the_replies()
-> Result<(), Box<dyn std::error::Error>> {
    let mut p = Pair::with(corelane_frame::MemLink::default(), cfg(), cfg());
    p.a.stack.listen_tcp(7, None)?;
    let (c, _) = p.b.stack.connect_tcp(Pair::A_ADDR.parse()?)?;
    let mut server = None;
    p.drive(Duration::from_secs(2), |p| {
        server = server.or_else(|| p.a.stack.accept(7));
        server.is_some()
    })?;
    let s = server.ok_or("accepted")?;
    // The client sends 1000 bytes; the wire (this test) keeps a copy of the data segment.
    p.b.dev_mut().io_mut().set_capture(true);
    assert!(matches!(
        p.b.stack.tcp_write(c, &[5u8; 1000], None),
        Poll::Ready(Ok(1000))
    ));
    p.drive_for(Duration::from_millis(2), |_| {})?;
    let mut sent = VecDeque::new();
    p.b.dev_mut().io_mut().take_sent(&mut sent);
    let data = sent
        .iter()
        .find(|f| tcp_payload(f) == 1000)
        .cloned()
        .ok_or("the data segment")?;
    let peer_mac: [u8; 6] = data[6..12].try_into()?;
    for f in &sent {
        assert!(p.b.dev_mut().io_mut().inject(f));
    }
    p.b.dev_mut().io_mut().set_capture(false);
    let mut buf = [0u8; 2000];
    let mut got = 0;
    p.drive(Duration::from_secs(1), |p| {
        if let Poll::Ready(Ok(n)) = p.a.stack.tcp_read(s, &mut buf, None) {
            got += n;
        }
        got == 1000
    })?;
    assert_eq!(got, 1000);
    // The same segment again, from another hardware address: a duplicate, which earns a
    // (D-SACK) ACK, sent to the peer as before.
    let mut forged = data.clone();
    forged[6..12].copy_from_slice(&[2, 0x66, 0x66, 0x66, 0x66, 0x66]);
    p.a.dev_mut().io_mut().set_capture(true);
    assert!(p.b.dev_mut().io_mut().inject(&forged));
    p.drive_for(Duration::from_millis(2), |_| {})?;
    // And data the server sends next.
    assert!(matches!(
        p.a.stack.tcp_write(s, b"reply", None),
        Poll::Ready(Ok(5))
    ));
    p.drive_for(Duration::from_millis(2), |_| {})?;
    let mut answers = VecDeque::new();
    p.a.dev_mut().io_mut().take_sent(&mut answers);
    assert!(
        answers.len() >= 2,
        "an ACK for the duplicate and the reply: {}",
        answers.len()
    );
    for f in &answers {
        assert_eq!(f[0..6], peer_mac, "sent to the peer, not to the forger");
    }
    Ok(())
}

/// The IPv4 TTL of a frame, with its header checksum checked.
fn ttl_of(f: &[u8]) -> Option<u8> {
    if f.len() < 34 || u16::from_be_bytes([f[12], f[13]]) != 0x0800 {
        return None;
    }
    let ihl = usize::from(f[14] & 0x0f) * 4;
    (crate::tcp::wire::inet_checksum(&f[14..14 + ihl]) == 0).then_some(f[22])
}

#[test]
fn a_udp_socket_s_and_a_listener_s_ttl_and_tos_are_on_the_wire()
-> Result<(), Box<dyn std::error::Error>> {
    let mut p = Pair::with(corelane_frame::MemLink::default(), cfg(), cfg());
    // UDP: a datagram from a socket whose TTL is 9.
    let (ua, _) = p.a.stack.bind_udp(9)?;
    let (_ub, _) = p.b.stack.bind_udp(10)?;
    p.a.stack.udp_set_ttl(ua, 9)?;
    assert_eq!(p.a.stack.udp_ttl(ua)?, 9);
    // And type of service 0x61 (UDP: all eight bits, ECN's included, as the kernel's).
    p.a.stack.udp_set_tos(ua, 0x61)?;
    assert_eq!(p.a.stack.udp_tos(ua)?, 0x61);
    assert!(p.a.stack.udp_set_tos(ua, 256).is_err());
    assert!(p.a.stack.udp_set_ttl(ua, 0).is_err());
    p.a.dev_mut().io_mut().set_capture(true);
    let to = "10.9.0.2:10".parse()?;
    assert!(matches!(
        p.a.stack.udp_send_to(ua, b"dgram", to, None),
        Poll::Ready(Ok(5))
    ));
    let mut sent = VecDeque::new();
    let mut udp_ttl = None;
    let mut udp_tos = None;
    p.drive(Duration::from_millis(500), |p| {
        p.a.dev_mut().io_mut().take_sent(&mut sent);
        // ARP first; deliver everything so the neighbour resolves.
        while let Some(f) = sent.pop_front() {
            if f.len() > 23 && f[23] == 17 {
                udp_ttl = ttl_of(&f);
                udp_tos = Some(f[15]);
            }
            p.a.dev_mut().io_mut().inject(&f);
        }
        udp_ttl.is_some()
    })?;
    assert_eq!(udp_ttl, Some(9));
    assert_eq!(udp_tos, Some(0x61));
    // TCP: a listener whose accepted connections get TTL 33.
    p.a.dev_mut().io_mut().set_capture(false);
    p.a.stack.listen_tcp(7, None)?;
    let mut o = p.a.stack.accept_options(7).ok_or("options")?;
    o.ttl = Some(33);
    o.tos = 0x60;
    p.a.stack.set_accept_options(7, o)?;
    let (_c, _) = p.b.stack.connect_tcp(Pair::A_ADDR.parse()?)?;
    let mut server = None;
    p.drive(Duration::from_secs(2), |p| {
        server = server.or_else(|| p.a.stack.accept(7));
        server.is_some()
    })?;
    let s = server.ok_or("accepted")?;
    assert_eq!(p.a.stack.tcp_ttl(s)?, 33);
    p.a.dev_mut().io_mut().set_capture(true);
    assert!(matches!(
        p.a.stack.tcp_write(s, b"reply", None),
        Poll::Ready(Ok(5))
    ));
    p.drive_for(Duration::from_millis(2), |_| {})?;
    p.a.dev_mut().io_mut().take_sent(&mut sent);
    let data = sent
        .iter()
        .find(|f| tcp_payload(f) == 5)
        .ok_or("the data")?;
    assert_eq!(ttl_of(data), Some(33));
    // DSCP 24 from the listener; the ECN bits are the connection's own (no ECN here).
    assert_eq!(data[15] & !3, 0x60);
    assert_eq!(p.a.stack.tos(s)?, 0x60);
    Ok(())
}

#[test]
fn connecting_to_an_on_link_address_nobody_holds_fails_once_arp_goes_unanswered()
-> Result<(), Box<dyn std::error::Error>> {
    let mut p = Pair::with(corelane_frame::MemLink::default(), cfg(), cfg());
    // 10.9.0.77 is on the link, and nobody answers ARP for it.
    let (c, _) = p.b.stack.connect_tcp("10.9.0.77:80".parse()?)?;
    let mut result = None;
    p.drive(Duration::from_secs(10), |p| {
        if let Poll::Ready(r) = p.b.stack.tcp_connected(c, None) {
            result = Some((r, p.now()));
        }
        result.is_some()
    })?;
    let (r, at) = result.ok_or("the connect never ended")?;
    let e = r.err().ok_or("connected to nobody")?;
    assert_eq!(e.kind(), std::io::ErrorKind::HostUnreachable, "{e}");
    assert!(e.to_string().contains("10.9.0.77:80"), "{e}");
    // After the neighbour probes (3 s), not after every SYN retry.
    assert!(at.total_millis() < 4_000, "failed after {at}");
    Ok(())
}

/// A next hop learnt from outside the stack (the runtime reads what a shared address's
/// neighbours told the kernel, whose ARP replies the stack never sees): the flows waiting for
/// it go out at once.
#[test]
fn a_neighbour_told_from_outside_lets_the_flows_waiting_for_it_go()
-> Result<(), Box<dyn std::error::Error>> {
    let mut p = Pair::with(corelane_frame::MemLink::default(), cfg(), cfg());
    p.a.stack.listen_tcp(7, None)?;
    // A's answers are all lost: its ARP reply never reaches B.
    p.a.dev_mut().io_mut().set_loss_every(1);
    let (c, _) = p.b.stack.connect_tcp(Pair::A_ADDR.parse()?)?;
    p.drive_for(Duration::from_millis(50), |_| {})?;
    let a_ip: std::net::IpAddr = "10.9.0.1".parse()?;
    assert_eq!(p.b.stack.neighbors_wanted(16), vec![a_ip]);
    assert!(
        p.a.stack.neighbors_wanted(16).is_empty(),
        "nothing waits on A"
    );
    let before = p.a.stack.flow_count();
    assert!(p.b.stack.learn_neighbor(a_ip, [2, 0, 0, 0, 0, 1]));
    assert!(
        !p.b.stack.learn_neighbor(a_ip, [2, 0, 0, 0, 0, 1]),
        "no news"
    );
    p.drive_for(Duration::from_millis(5), |_| {})?;
    assert!(p.b.stack.neighbors_wanted(16).is_empty());
    assert_eq!(
        p.a.stack.flow_count(),
        before + 1,
        "B's SYN reached A as soon as B learnt where A is"
    );
    // With A's answers back, the connection opens.
    p.a.dev_mut().io_mut().set_loss_every(0);
    let open = p.drive(Duration::from_secs(5), |p| {
        matches!(p.b.stack.tcp_connected(c, None), Poll::Ready(Ok(())))
    })?;
    assert!(open);
    Ok(())
}

/// One UDP socket answering two peers: one on the link that never answers ARP (a spoofed
/// source), one that does. The second one's datagrams never wait behind the first's: each
/// arrives within milliseconds, every 2.5 s of twenty rounds with a new silent source, where
/// the socket's one queue held them for the 3 s the silent hop had to answer.
#[test]
fn a_next_hop_that_never_answers_holds_no_other_peer_s_datagrams()
-> Result<(), Box<dyn std::error::Error>> {
    let mut p = Pair::with(corelane_frame::MemLink::default(), cfg(), cfg());
    let (ua, _) = p.a.stack.bind_udp(9)?;
    let (ub, _) = p.b.stack.bind_udp(10)?;
    let to_b: std::net::SocketAddr = "10.9.0.2:10".parse()?;
    let mut worst = Duration::ZERO;
    for round in 0..20u8 {
        // A reply to a source nobody on the link holds, then one to B.
        let silent: std::net::SocketAddr = format!("10.9.0.{}:53", 100 + round).parse()?;
        assert!(matches!(
            p.a.stack.udp_send_to(ua, b"to nobody", silent, None),
            Poll::Ready(Ok(9))
        ));
        assert!(matches!(
            p.a.stack.udp_send_to(ua, &[round; 16], to_b, None),
            Poll::Ready(Ok(16))
        ));
        let sent_at = p.now();
        let mut buf = [0u8; 64];
        let mut got = None;
        p.drive(Duration::from_secs(5), |p| {
            if let Poll::Ready(Ok((n, _))) = p.b.stack.udp_recv_from(ub, &mut buf, None) {
                got = Some((n, buf[0], p.now()));
            }
            got.is_some()
        })?;
        let (n, first, at) = got.ok_or("B's datagram never came")?;
        assert_eq!((n, first), (16, round));
        worst = worst.max(at - sent_at);
        p.drive_for(Duration::from_millis(2500), |_| {})?;
    }
    assert!(
        worst < Duration::from_millis(10),
        "B's datagram waited {worst} behind a silent next hop's"
    );
    // Each datagram to nobody was dropped once its hop had had its time, and counted.
    p.drive_for(Duration::from_secs(1), |_| {})?;
    assert_eq!(p.a.stack.stats().udp.tx_dropped, 20);
    Ok(())
}
