//! Two stacks back to back over the in-memory link, on a clock that jumps to the next deadline.

use std::task::Poll;

use corelane_frame::FrameIo;
use smoltcp::time::Duration;

use crate::{FlowId, Pair, StackConfig, TcpConfig, TcpState};

/// Fixed seeds: every run of these tests sees the same sequence numbers and ports.
fn cfg() -> StackConfig {
    StackConfig {
        seed: Some(0xc0de),
        ..StackConfig::default()
    }
}

fn pair_with(server: StackConfig, client: StackConfig) -> Pair {
    Pair::with(corelane_frame::MemLink::default(), server, client)
}

fn pair() -> Pair {
    pair_with(cfg(), cfg())
}

fn server_ep() -> std::net::SocketAddr {
    Pair::A_ADDR.parse().unwrap()
}

fn ready<T>(p: Poll<std::io::Result<T>>) -> Option<T> {
    match p {
        Poll::Ready(r) => Some(r.expect("socket call")),
        Poll::Pending => None,
    }
}

/// Moves whatever the server's connections received back to them.
fn echo_pass(p: &mut Pair, conns: &[FlowId], buf: &mut [u8]) {
    let stack = &mut p.a.stack;
    for &h in conns {
        loop {
            let room = stack.tcp_send_room(h).min(buf.len());
            if room == 0 {
                break;
            }
            let n = match ready(stack.tcp_read(h, &mut buf[..room], None)) {
                Some(n) if n > 0 => n,
                _ => break,
            };
            assert_eq!(ready(stack.tcp_write(h, &buf[..n], None)), Some(n));
        }
    }
}

/// Runs an echo server on `a` and pushes `data` from `b`, returning what came back.
fn echo_through(p: &mut Pair, data: &[u8]) -> Vec<u8> {
    p.a.stack.listen_tcp(7, None).unwrap();
    let (c, _) = p.b.stack.connect_tcp(server_ep()).unwrap();
    let mut conns = Vec::new();
    let (mut sent, mut back) = (0usize, Vec::with_capacity(data.len()));
    let mut buf = vec![0u8; 64 * 1024];
    let done = p
        .drive(Duration::from_secs(100), |p| {
            while let Some(h) = p.a.stack.accept(7) {
                conns.push(h);
            }
            echo_pass(p, &conns, &mut buf);
            let client = &mut p.b.stack;
            if client.tcp_state(c) == Some(TcpState::Established) && sent < data.len() {
                sent += ready(client.tcp_write(c, &data[sent..], None)).unwrap_or(0);
            }
            while let Some(n @ 1..) = ready(client.tcp_read(c, &mut buf, None)) {
                back.extend_from_slice(&buf[..n]);
            }
            back.len() == data.len()
        })
        .unwrap();
    assert!(done, "echoed {} of {} bytes", back.len(), data.len());
    back
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn tcp_echo_over_the_in_memory_link() {
    let mut p = pair();
    let data = pattern(4 << 20);
    let back = echo_through(&mut p, &data);
    assert_eq!(back.len(), data.len());
    assert!(back == data, "echoed bytes differ");
    let s = p.a.dev().stats();
    assert_eq!(s.rx_bad_checksum + s.rx_malformed, 0);
    let now = p.now();
    for n in [&mut p.a, &mut p.b] {
        let c = n.shutdown(now).unwrap();
        assert_eq!(c.in_use, 0, "{c:?}");
        assert_eq!(c.sum(), c.total);
    }
}

#[test]
fn tcp_echo_with_checksums_left_to_the_device_survives_loss_both_ways() {
    let mut p = pair();
    for n in [&mut p.a, &mut p.b] {
        n.dev_mut().io_mut().set_checksum_offload(true);
    }
    p.a.dev_mut().io_mut().set_loss_every(97);
    p.b.dev_mut().io_mut().set_loss_every(89);
    let data = pattern(1 << 20);
    let back = echo_through(&mut p, &data);
    assert!(back == data, "echoed bytes differ");
    for n in [&p.a, &p.b] {
        let s = n.dev().stats();
        // Every TCP segment but the few written by other paths (a SYN cookie, a reset).
        assert!(
            s.tx_checksum_offloaded * 100 >= s.tx_frames * 99,
            "{} of {} offloaded",
            s.tx_checksum_offloaded,
            s.tx_frames
        );
        // The receiving stack checks every checksum.
        assert_eq!(s.rx_bad_checksum + s.rx_malformed, 0, "{s:?}");
    }
}

#[test]
fn tcp_echo_survives_loss() {
    let mut p = pair();
    p.a.dev_mut().io_mut().set_loss_every(101);
    p.b.dev_mut().io_mut().set_loss_every(103);
    let data = pattern(1 << 20);
    let back = echo_through(&mut p, &data);
    assert!(
        back == data,
        "echoed {} of {} bytes",
        back.len(),
        data.len()
    );
    assert!(p.a.dev().io().stats().lost > 0 && p.b.dev().io().stats().lost > 0);
}

#[test]
fn tcp_echo_over_a_zero_copy_link_survives_loss_both_ways() {
    let mut p = Pair::zero_copy(corelane_frame::MemLink::default(), cfg(), cfg());
    p.a.dev_mut().io_mut().set_loss_every(97);
    p.b.dev_mut().io_mut().set_loss_every(89);
    let data = pattern(2 << 20);
    let back = echo_through(&mut p, &data);
    assert!(back == data, "echoed bytes differ");
    assert!(p.a.dev().io().stats().lost > 0 && p.b.dev().io().stats().lost > 0);
    let now = p.now();
    for n in [&mut p.a, &mut p.b] {
        let c = n.shutdown(now).unwrap();
        assert_eq!(c.in_use, 0, "{c:?}");
        assert_eq!(c.sum(), c.total);
    }
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let run = || {
        let mut p = pair();
        let _ = echo_through(&mut p, &pattern(200_000));
        (p.now(), p.a.dev().stats(), p.b.dev().stats())
    };
    assert_eq!(run(), run());
}

fn run(p: &mut Pair, ms: u64, accept: bool) {
    p.drive_for(Duration::from_millis(ms), |p| {
        while accept && p.a.stack.accept(7).is_some() {}
    })
    .unwrap();
}

#[test]
fn syns_past_the_backlog_are_dropped_not_reset() {
    let tcp = TcpConfig {
        syn_cookies: false,
        ..TcpConfig::default()
    };
    let mut p = pair_with(
        StackConfig {
            backlog: 4,
            tcp,
            ..cfg()
        },
        cfg(),
    );
    p.a.stack.listen_tcp(7, None).unwrap();
    let conns: Vec<_> = (0..10)
        .map(|_| p.b.stack.connect_tcp(server_ep()).unwrap().0)
        .collect();
    run(&mut p, 200, false);
    assert_eq!(p.a.stack.accept_queue_len(7), 4);
    assert!(p.a.stack.stats().syn_dropped >= 6);
    // Nobody was reset: the six left over are still trying.
    let states: Vec<TcpState> = conns
        .iter()
        .map(|&h| p.b.stack.tcp_state(h).unwrap())
        .collect();
    let count = |st: TcpState| states.iter().filter(|s| **s == st).count();
    assert_eq!(
        (count(TcpState::Established), count(TcpState::SynSent)),
        (4, 6)
    );
    // Accepting makes room: the retransmitted SYNs get in.
    run(&mut p, 5000, true);
    let established = conns
        .iter()
        .filter(|&&h| p.b.stack.tcp_state(h) == Some(TcpState::Established))
        .count();
    assert!(established >= 8, "{established} of 10 established");
}

#[test]
fn syns_past_the_syn_backlog_get_cookies_and_their_acks_open_connections() {
    let mut p = pair_with(
        StackConfig {
            backlog: 4,
            ..cfg()
        },
        cfg(),
    );
    p.a.stack.listen_tcp(7, None).unwrap();
    // Each client speaks first, as an HTTP client does.
    let conns: Vec<_> = (0..10)
        .map(|_| {
            let c = p.b.stack.connect_tcp(server_ep()).unwrap().0;
            assert_eq!(ready(p.b.stack.tcp_write(c, b"x", None)), Some(1));
            c
        })
        .collect();
    // Four SYNs fill the SYN backlog; the other six get cookies. The ACKs that come back while
    // the accept queue is full are dropped, and the clients' retransmitted data opens the
    // rest once the application has accepted: nothing is reset, nothing was kept for the six.
    let mut accepted = Vec::new();
    p.drive_for(Duration::from_secs(3), |p| {
        while let Some(h) = p.a.stack.accept(7) {
            accepted.push(h);
        }
    })
    .unwrap();
    let s = p.a.stack.stats();
    assert_eq!(accepted.len(), 10);
    assert_eq!((s.tcp.cookies_sent, s.tcp.cookies_ok), (6, 6));
    let mut buf = [0u8; 4];
    for &h in &accepted {
        assert_eq!(ready(p.a.stack.tcp_read(h, &mut buf, None)), Some(1));
    }
    assert!(
        conns
            .iter()
            .all(|&h| p.b.stack.tcp_state(h) == Some(TcpState::Established))
    );
}

#[test]
fn per_frame_work_does_not_grow_with_open_connections() {
    // Small buffers: only the count of connections matters here.
    let small = StackConfig {
        tcp_rx_buffer: 4096,
        tcp_tx_buffer: 4096,
        backlog: 4096,
        ..cfg()
    };
    let mut p = pair_with(small, small);
    p.a.stack.listen_tcp(7, None).unwrap();
    let conns: Vec<_> = (0..2000)
        .map(|_| p.b.stack.connect_tcp(server_ep()).unwrap().0)
        .collect();
    let mut accepted = Vec::new();
    p.drive(Duration::from_secs(5), |p| {
        while let Some(h) = p.a.stack.accept(7) {
            accepted.push(h);
        }
        accepted.len() == conns.len()
    })
    .unwrap();
    assert_eq!(accepted.len(), conns.len());
    run(&mut p, 50, false);
    // Everything idle now. One segment on one connection:
    let before = p.a.stack.stats();
    let dev_before = p.a.dev().stats();
    assert_eq!(ready(p.b.stack.tcp_write(conns[1234], b"x", None)), Some(1));
    let now = p.now() + Duration::from_millis(1);
    p.b.poll(now).unwrap();
    p.a.poll(now).unwrap();
    let after = p.a.stack.stats();
    assert_eq!(p.a.dev().stats().rx_delivered - dev_before.rx_delivered, 1);
    assert_eq!(after.demux_hits - before.demux_hits, 1);
    assert_eq!(
        after.egress_polls - before.egress_polls,
        1,
        "egress polled more than the one flow that received"
    );
    assert_eq!(after.flows, 2000);
}

#[test]
fn accept_wakes_exactly_one_waiter_per_connection() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let mut p = pair();
    p.a.stack.listen_tcp(7, None).unwrap();
    let counters: Vec<Arc<Count>> = (0..50)
        .map(|_| Arc::new(Count(AtomicUsize::new(0))))
        .collect();
    for (k, c) in counters.iter().enumerate() {
        p.a.stack.accept_wait(7, k as u64, &Waker::from(c.clone()));
    }
    for _ in 0..3 {
        p.b.stack.connect_tcp(server_ep()).unwrap();
    }
    run(&mut p, 20, false);
    let woken: Vec<usize> = counters
        .iter()
        .map(|c| c.0.load(Ordering::SeqCst))
        .collect();
    assert_eq!(woken.iter().sum::<usize>(), 3, "{woken:?}");
    assert_eq!(&woken[..3], &[1, 1, 1], "first waiters first: {woken:?}");
    assert_eq!(p.a.stack.stats().accept_wakeups, 3);
}

#[test]
fn frames_are_all_accounted_after_shutdown_with_open_connections() {
    let mut p = pair();
    let _ = echo_through(&mut p, &pattern(100_000));
    let c = p.a.shutdown(p.now()).unwrap();
    assert_eq!((c.in_use, c.sum()), (0, c.total));
    let c = p.b.dev_mut().io_mut().counts();
    assert_eq!(c.sum(), c.total);
}

#[test]
fn abort_then_release_sends_the_reset_and_frees_the_flow() {
    let mut p = pair();
    p.a.stack.listen_tcp(7, None).unwrap();
    let (c, _) = p.b.stack.connect_tcp(server_ep()).unwrap();
    run(&mut p, 10, false);
    let s = p.a.stack.accept(7).expect("accepted");
    assert_eq!(p.a.stack.tcp_state(s), Some(TcpState::Established));
    // What a load generator does to avoid TIME_WAIT: abort, then let go at once.
    p.b.stack.abort(c);
    p.b.stack.release(c);
    run(&mut p, 10, false);
    assert_eq!(
        p.a.stack.tcp_state(s),
        Some(TcpState::Closed),
        "the server never saw the reset"
    );
    assert_eq!(p.b.stack.stats().flows, 0, "the aborted flow was not freed");
}

#[test]
fn a_closed_flow_still_held_does_not_capture_a_new_connection_on_its_ports() {
    let mut p = pair();
    p.a.stack.listen_tcp(7, None).unwrap();
    let (c, port) = p.b.stack.connect_tcp(server_ep()).unwrap();
    run(&mut p, 10, false);
    // The server's application keeps holding the connection after the peer reset it.
    let held = p.a.stack.accept(7).expect("accepted");
    p.b.stack.abort(c);
    p.b.stack.release(c);
    run(&mut p, 10, false);
    assert_eq!(p.a.stack.tcp_state(held), Some(TcpState::Closed));
    // The peer opens a new connection from the same port (as after a port wrap).
    let (c2, port2) = loop {
        let (id, q) = p.b.stack.connect_tcp(server_ep()).unwrap();
        if q == port {
            break (id, q);
        }
        p.b.stack.abort(id);
        p.b.stack.release(id);
        p.step().unwrap();
    };
    assert_eq!(port2, port);
    run(&mut p, 20, false);
    assert_eq!(p.b.stack.tcp_state(c2), Some(TcpState::Established));
    assert!(p.a.stack.accept(7).is_some());
}

#[test]
fn a_peer_that_never_answers_costs_a_few_turns_not_a_million() {
    // The SYN goes nowhere (every frame lost, the peer's hardware address known from an
    // earlier connection): the clock jumps from one retransmission to the next, so a minute
    // of simulated time is a handful of steps.
    let mut p = pair();
    p.a.stack.listen_tcp(7, None).unwrap();
    p.b.stack.connect_tcp(server_ep()).unwrap();
    run(&mut p, 10, false);
    p.b.dev_mut().io_mut().set_loss_every(1);
    let (c, _) = p.b.stack.connect_tcp(server_ep()).unwrap();
    let mut steps = 0;
    p.drive_for(Duration::from_secs(60), |_| steps += 1)
        .unwrap();
    assert_eq!(p.b.stack.tcp_state(c), Some(TcpState::SynSent));
    assert!(p.now().total_millis() >= 60_000);
    assert!(
        steps < 1000,
        "{steps} steps for a minute of retransmissions"
    );
}

#[test]
fn an_off_link_peer_needs_a_route_and_is_reached_through_the_gateway()
-> Result<(), Box<dyn std::error::Error>> {
    let any = |s: &str| {
        s.parse::<smoltcp::wire::IpCidr>()
            .map_err(|()| s.to_string())
    };
    let mut p = pair();
    let off: std::net::SocketAddr = "192.0.2.7:80".parse()?;
    let e = p.b.stack.connect_tcp(off).err().ok_or("refused")?;
    assert!(e.to_string().contains("no route to 192.0.2.7"), "{e}");
    assert_eq!(
        std::io::Error::from(e).kind(),
        std::io::ErrorKind::NetworkUnreachable
    );
    // Node A is the gateway: the SYN goes to its hardware address (after asking for it), and
    // A, which has no such connection, resets it.
    let gw = server_ep().ip();
    p.b.stack.add_route(any("0.0.0.0/0")?, Some(gw.into()))?;
    assert_eq!(p.b.stack.routes()[0].to_string(), "default via 10.9.0.1");
    let (c, _) = p.b.stack.connect_tcp(off)?;
    let refused = p.drive(Duration::from_secs(5), |p| {
        matches!(p.b.stack.tcp_connected(c, None), Poll::Ready(Err(_)))
    })?;
    assert!(refused, "the gateway's reset ends the attempt");
    assert_eq!(p.a.stack.stats().tcp.resets_out, 1);
    // Without the route, new connections are refused again; the longest prefix wins.
    assert!(p.b.stack.remove_route(any("0.0.0.0/0")?).is_some());
    assert!(p.b.stack.connect_tcp(off).is_err());
    p.b.stack.add_route(any("192.0.2.0/24")?, Some(gw.into()))?;
    assert!(p.b.stack.connect_tcp(off).is_ok());
    Ok(())
}

#[test]
fn udp_datagrams_of_every_size_cross_whole_or_in_fragments_and_a_closed_port_answers()
-> Result<(), Box<dyn std::error::Error>> {
    let mut p = pair();
    let (a, _) = p.a.stack.bind_udp(9)?;
    let (b, bport) = p.b.stack.bind_udp(0)?;
    let to_a: std::net::SocketAddr = "10.9.0.1:9".parse()?;
    let sizes = [
        0usize,
        1,
        1472,
        1473,
        8 * 1024,
        60 * 1024,
        crate::udp::MAX_PAYLOAD,
    ];
    let mut buf = vec![0u8; 70_000];
    for &n in &sizes {
        let data = pattern(n);
        assert!(matches!(
            p.b.stack.udp_send_to(b, &data, to_a, None),
            Poll::Ready(Ok(m)) if m == n
        ));
        // a echoes it back.
        let mut got = None;
        p.drive(Duration::from_secs(5), |p| {
            if let Poll::Ready(Ok((m, from))) = p.a.stack.udp_recv_from(a, &mut buf, None) {
                assert_eq!(&buf[..m], &data[..], "{n} bytes arrived whole");
                assert_eq!(from.port(), bport);
                assert!(matches!(
                    p.a.stack.udp_send_to(a, &buf[..m], from, None),
                    Poll::Ready(Ok(_))
                ));
            }
            if let Poll::Ready(Ok((m, _))) = p.b.stack.udp_recv_from(b, &mut buf, None) {
                got = Some(buf[..m].to_vec());
            }
            got.is_some()
        })?;
        assert_eq!(got.as_deref(), Some(&data[..]), "{n} bytes echoed");
    }
    let s = p.a.stack.stats();
    assert!(
        s.frag.reassembled >= 3 && s.frag.fragmented >= 3,
        "{:?}",
        s.frag
    );
    assert_eq!(
        (s.udp.rx, s.udp.tx),
        (sizes.len() as u64, sizes.len() as u64)
    );
    // Too big for UDP: refused at once.
    let huge = vec![0u8; crate::udp::MAX_PAYLOAD + 1];
    assert!(matches!(
        p.b.stack.udp_send_to(b, &huge, to_a, None),
        Poll::Ready(Err(_))
    ));
    // A closed port: ICMP port unreachable comes back.
    let closed: std::net::SocketAddr = "10.9.0.1:10".parse()?;
    assert!(matches!(
        p.b.stack.udp_send_to(b, b"anyone?", closed, None),
        Poll::Ready(Ok(7))
    ));
    p.drive_for(Duration::from_millis(50), |_| {})?;
    assert_eq!(p.a.stack.stats().icmp_unreachable_sent, 1);
    // A burst to closed ports: a burst of 50 answers at most (the clock barely moves).
    for _ in 0..200 {
        let _ = p.b.stack.udp_send_to(b, b"x", closed, None);
        p.drive_for(Duration::from_micros(1), |_| {})?;
    }
    let s = p.a.stack.stats();
    assert!(
        s.icmp_unreachable_sent <= 52,
        "{} sent",
        s.icmp_unreachable_sent
    );
    assert!(s.icmp_limited >= 148, "{} limited", s.icmp_limited);
    Ok(())
}

#[test]
fn a_closed_listener_keeps_its_port_until_its_last_connection_is_freed()
-> Result<(), Box<dyn std::error::Error>> {
    let mut p = pair();
    p.a.stack.listen_tcp(7, None)?;
    let (c, _) = p.b.stack.connect_tcp(server_ep())?;
    let mut accepted = None;
    p.drive(Duration::from_secs(5), |p| {
        accepted = accepted.or_else(|| p.a.stack.accept(7));
        accepted.is_some()
    })?;
    let h = accepted.ok_or("accepted")?;
    // The listener goes; its connection is open: the port must stay steered.
    assert!(!p.a.stack.close_listener(7));
    let mut freed = Vec::new();
    p.a.stack.take_freed_ports(&mut freed);
    assert!(freed.is_empty());
    // Both sides close; once the connection is freed, the port is given back.
    p.a.stack.release(h);
    p.b.stack.release(c);
    p.drive_for(Duration::from_secs(20), |_| {})?;
    p.a.stack.take_freed_ports(&mut freed);
    assert_eq!(freed, vec![(crate::Proto::Tcp, 7)]);
    // A listener with no connection gives its port back at once.
    p.a.stack.listen_tcp(8, None)?;
    assert!(p.a.stack.close_listener(8));
    Ok(())
}

/// Counts its wake-ups.
struct CountWakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for CountWakes {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[test]
fn a_memory_cap_holds_writers_back_and_wakes_them_when_memory_is_given_back() {
    // The client's TCP buffers may hold 64 KiB; four connections write 256 KiB each.
    let cap = 64 * 1024;
    let client = StackConfig {
        tcp_mem_limit: Some(cap),
        ..cfg()
    };
    let mut p = pair_with(cfg(), client);
    p.a.stack.listen_tcp(7, None).unwrap();
    let conns: Vec<FlowId> = (0..4)
        .map(|_| p.b.stack.connect_tcp(server_ep()).unwrap().0)
        .collect();
    let data = pattern(256 * 1024);
    let wakes = std::sync::Arc::new(CountWakes(Default::default()));
    let waker = std::task::Waker::from(wakes.clone());
    let (mut sent, mut received, mut most) = (vec![0usize; 4], 0usize, 0u64);
    let mut accepted = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let done = p
        .drive(Duration::from_secs(100), |p| {
            while let Some(h) = p.a.stack.accept(7) {
                accepted.push(h);
            }
            for &h in &accepted {
                while let Some(n @ 1..) = ready(p.a.stack.tcp_read(h, &mut buf, None)) {
                    received += n;
                }
            }
            for (c, s) in conns.iter().zip(sent.iter_mut()) {
                if p.b.stack.tcp_state(*c) == Some(TcpState::Established) && *s < data.len() {
                    *s += ready(p.b.stack.tcp_write(*c, &data[*s..], Some(&waker))).unwrap_or(0);
                }
            }
            most = most.max(p.b.stack.stats().tcp_mem);
            received == 4 * data.len()
        })
        .unwrap();
    assert!(done, "received {received} of {}", 4 * data.len());
    let st = p.b.stack.stats();
    assert!(
        most <= cap as u64,
        "the buffers held {most} bytes, over {cap}"
    );
    assert!(st.tcp_mem_limited > 0, "no write was held back: {st:?}");
    assert!(
        wakes.0.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "a writer held back for memory was never woken"
    );
    // Everything acknowledged and idle: every buffer given back (large ones after a while).
    p.drive_for(Duration::from_secs(2), |_| {}).unwrap();
    assert_eq!(p.b.stack.stats().tcp_mem, 0);
}

/// Connections and datagrams from a stack to its own address never reach the wire: their
/// frames come back through the device (as the kernel's loopback), on a VLAN too, and the
/// bytes echo whole.
#[test]
fn a_stack_reaches_its_own_address_through_the_device_not_the_wire() {
    for vid in [0u16, 10] {
        let mut p = pair();
        p.a.dev_mut().set_vlan(vid);
        let data = pattern(300_000);
        p.a.stack.listen_tcp(7, None).unwrap();
        let (c, _) = p.a.stack.connect_tcp(server_ep()).unwrap();
        let (u, uport) = p.a.stack.bind_udp(9).unwrap();
        let mut conns = Vec::new();
        let (mut sent, mut back) = (0usize, Vec::new());
        let mut buf = vec![0u8; 64 * 1024];
        let mut datagram = None;
        let to_self: std::net::SocketAddr = "10.9.0.1:9".parse().unwrap();
        assert!(matches!(
            p.a.stack.udp_send_to(u, b"to myself", to_self, None),
            Poll::Ready(Ok(9))
        ));
        let done = p
            .drive(Duration::from_secs(30), |p| {
                while let Some(h) = p.a.stack.accept(7) {
                    conns.push(h);
                }
                echo_pass(p, &conns, &mut buf);
                let s = &mut p.a.stack;
                if s.tcp_state(c) == Some(TcpState::Established) && sent < data.len() {
                    sent += ready(s.tcp_write(c, &data[sent..], None)).unwrap_or(0);
                }
                while let Some(n @ 1..) = ready(s.tcp_read(c, &mut buf, None)) {
                    back.extend_from_slice(&buf[..n]);
                }
                if let Poll::Ready(Ok((n, from))) = s.udp_recv_from(u, &mut buf, None) {
                    datagram = Some((buf[..n].to_vec(), from));
                }
                back.len() == data.len() && datagram.is_some()
            })
            .unwrap();
        assert!(done, "vlan {vid}: echoed {} of {}", back.len(), data.len());
        assert!(back == data, "vlan {vid}: the bytes came back changed");
        assert_eq!(
            datagram,
            Some((b"to myself".to_vec(), ([10, 9, 0, 1], uport).into()))
        );
        let (a, b) = (p.a.dev().stats(), p.b.dev().stats());
        assert_eq!(b.rx_frames, 0, "vlan {vid}: the other node saw {b:?}");
        assert_eq!(
            a.tx_batches, 0,
            "vlan {vid}: nothing left for the wire: {a:?}"
        );
        assert!(a.looped > 200, "vlan {vid}: {a:?}");
        assert_eq!(a.rx_bad_checksum + a.rx_malformed, 0, "vlan {vid}: {a:?}");
    }
}
