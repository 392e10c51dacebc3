//! Two stacks back to back over the in-memory link.

use corelane_xsk::{FrameIo, MemLink, MemPort};
use smoltcp::socket::tcp::State;
use smoltcp::time::Instant;
use smoltcp::wire::IpCidr;

use crate::{Stack, StackConfig};

fn pair() -> (Stack<MemPort>, Stack<MemPort>) {
    let (a, b) = MemLink::default().pair();
    let cfg = StackConfig::default();
    let server = Stack::new(
        a,
        [2, 0, 0, 0, 0, 1],
        &[IpCidr::new("10.9.0.1".parse().unwrap(), 24)],
        1500,
        cfg,
    );
    let client = Stack::new(
        b,
        [2, 0, 0, 0, 0, 2],
        &[IpCidr::new("10.9.0.2".parse().unwrap(), 24)],
        1500,
        cfg,
    );
    (server, client)
}

/// Runs an echo server on `server` and pushes `data` from `client`, returning what came back.
fn echo_through(server: &mut Stack<MemPort>, client: &mut Stack<MemPort>, data: &[u8]) -> Vec<u8> {
    let l = server.listen_tcp(7).unwrap();
    let c = client
        .connect_tcp("10.9.0.1:7".parse().unwrap(), 40000)
        .unwrap();
    let mut conns = Vec::new();
    let (mut sent, mut back) = (0usize, Vec::with_capacity(data.len()));
    let mut buf = vec![0u8; 64 * 1024];
    let mut now = Instant::from_millis(0);
    for _ in 0..2_000_000 {
        now += smoltcp::time::Duration::from_micros(50);
        server.poll(now).unwrap();
        while let Some(h) = server.accept(l) {
            conns.push(h);
        }
        for &h in &conns {
            let s = server.tcp(h);
            while s.can_recv() && s.send_capacity() > s.send_queue() {
                let room = (s.send_capacity() - s.send_queue()).min(buf.len());
                let n = s.recv_slice(&mut buf[..room]).unwrap();
                if n == 0 {
                    break;
                }
                assert_eq!(s.send_slice(&buf[..n]).unwrap(), n);
            }
        }
        server.egress(now).unwrap();
        client.poll(now).unwrap();
        let s = client.tcp(c);
        if s.state() == State::Established && sent < data.len() {
            sent += s.send_slice(&data[sent..]).unwrap();
        }
        while s.can_recv() {
            let n = s.recv_slice(&mut buf).unwrap();
            back.extend_from_slice(&buf[..n]);
        }
        client.egress(now).unwrap();
        if back.len() == data.len() {
            break;
        }
    }
    back
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn tcp_echo_over_the_in_memory_link() {
    let (mut server, mut client) = pair();
    let data = pattern(4 << 20);
    let back = echo_through(&mut server, &mut client, &data);
    assert_eq!(back.len(), data.len());
    assert!(back == data, "echoed bytes differ");
    let s = server.device_stats();
    assert_eq!(s.rx_bad_checksum + s.rx_malformed, 0);
    for st in [&mut server, &mut client] {
        let c = st.shutdown(Instant::from_millis(0)).unwrap();
        assert_eq!(c.in_use, 0, "{c:?}");
        assert_eq!(c.sum(), c.total);
    }
}

#[test]
fn tcp_echo_survives_loss() {
    let (mut server, mut client) = pair();
    server.io_mut().set_loss_every(101);
    client.io_mut().set_loss_every(103);
    let data = pattern(1 << 20);
    let back = echo_through(&mut server, &mut client, &data);
    assert!(
        back == data,
        "echoed {} of {} bytes",
        back.len(),
        data.len()
    );
    assert!(server.io().stats().lost > 0 && client.io().stats().lost > 0);
}

#[test]
fn syns_past_the_backlog_are_dropped_not_reset() {
    let (a, b) = MemLink::default().pair();
    let cfg = StackConfig {
        backlog: 4,
        ..StackConfig::default()
    };
    let mut server = Stack::new(
        a,
        [2, 0, 0, 0, 0, 1],
        &[IpCidr::new("10.9.0.1".parse().unwrap(), 24)],
        1500,
        cfg,
    );
    let mut client = Stack::new(
        b,
        [2, 0, 0, 0, 0, 2],
        &[IpCidr::new("10.9.0.2".parse().unwrap(), 24)],
        1500,
        StackConfig::default(),
    );
    let l = server.listen_tcp(7).unwrap();
    let conns: Vec<_> = (0..10)
        .map(|i| {
            client
                .connect_tcp("10.9.0.1:7".parse().unwrap(), 41000 + i)
                .unwrap()
        })
        .collect();
    let mut now = Instant::from_millis(0);
    for _ in 0..200 {
        now += smoltcp::time::Duration::from_millis(1);
        client.poll(now).unwrap();
        server.poll(now).unwrap();
    }
    assert_eq!(server.accept_queue_len(l), 4);
    assert!(server.device_stats().rx_syn_dropped >= 6);
    // Nobody was reset: the six left over are still trying.
    let states: Vec<State> = conns.iter().map(|&h| client.tcp(h).state()).collect();
    assert_eq!(
        states.iter().filter(|s| **s == State::Established).count(),
        4
    );
    assert_eq!(states.iter().filter(|s| **s == State::SynSent).count(), 6);
    // Accepting makes room: the retransmitted SYNs get in.
    while server.accept(l).is_some() {}
    for _ in 0..5000 {
        now += smoltcp::time::Duration::from_millis(1);
        client.poll(now).unwrap();
        server.poll(now).unwrap();
        while server.accept(l).is_some() {}
    }
    let established = conns
        .iter()
        .filter(|&&h| client.tcp(h).state() == State::Established)
        .count();
    assert!(established >= 8, "{established} of 10 established");
}

#[test]
fn frames_are_all_accounted_after_shutdown_with_open_connections() {
    let (mut server, mut client) = pair();
    let _ = echo_through(&mut server, &mut client, &pattern(100_000));
    let c = server.shutdown(Instant::from_millis(0)).unwrap();
    assert_eq!((c.in_use, c.sum()), (0, c.total));
    let c = client.io_mut().counts();
    assert_eq!(c.sum(), c.total);
}
