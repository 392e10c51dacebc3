//! Two stacks back to back over the in-memory link.

use corelane_xsk::{FrameIo, MemLink, MemPort};
use smoltcp::socket::tcp::State;
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{IpCidr, IpEndpoint};

use crate::{FlowId, Node, StackConfig};

type N = Node<MemPort>;

fn node(io: MemPort, last: u8, cfg: StackConfig) -> N {
    Node::new(
        io,
        [2, 0, 0, 0, 0, last],
        &[IpCidr::new(format!("10.9.0.{last}").parse().unwrap(), 24)],
        1500,
        cfg,
    )
}

fn pair_with(server: StackConfig, client: StackConfig) -> (N, N) {
    let (a, b) = MemLink::default().pair();
    (node(a, 1, server), node(b, 2, client))
}

fn pair() -> (N, N) {
    pair_with(StackConfig::default(), StackConfig::default())
}

fn server_ep() -> IpEndpoint {
    "10.9.0.1:7".parse().unwrap()
}

/// Moves whatever the server's connections received back to them.
fn echo_pass(server: &mut N, conns: &[FlowId], buf: &mut [u8]) {
    for &h in conns {
        let Some(s) = server.stack.tcp(h) else {
            continue;
        };
        let mut moved = false;
        while s.can_recv() && s.send_capacity() > s.send_queue() {
            let room = (s.send_capacity() - s.send_queue()).min(buf.len());
            let n = s.recv_slice(&mut buf[..room]).unwrap();
            if n == 0 {
                break;
            }
            assert_eq!(s.send_slice(&buf[..n]).unwrap(), n);
            moved = true;
        }
        if moved {
            server.stack.touch(h);
        }
    }
}

/// Runs an echo server on `server` and pushes `data` from `client`, returning what came back.
fn echo_through(server: &mut N, client: &mut N, data: &[u8]) -> Vec<u8> {
    server.stack.listen_tcp(7, None).unwrap();
    let (c, _) = client.stack.connect_tcp(server_ep()).unwrap();
    let mut conns = Vec::new();
    let (mut sent, mut back) = (0usize, Vec::with_capacity(data.len()));
    let mut buf = vec![0u8; 64 * 1024];
    let mut now = Instant::from_millis(0);
    for _ in 0..2_000_000 {
        now += Duration::from_micros(50);
        server.poll(now).unwrap();
        while let Some(h) = server.stack.accept(7) {
            conns.push(h);
        }
        echo_pass(server, &conns, &mut buf);
        client.poll(now).unwrap();
        let s = client.stack.tcp(c).unwrap();
        if s.state() == State::Established && sent < data.len() {
            sent += s.send_slice(&data[sent..]).unwrap();
        }
        while s.can_recv() {
            let n = s.recv_slice(&mut buf).unwrap();
            back.extend_from_slice(&buf[..n]);
        }
        client.stack.touch(c);
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
    let s = server.dev.stats();
    assert_eq!(s.rx_bad_checksum + s.rx_malformed, 0);
    for n in [&mut server, &mut client] {
        let c = n.shutdown(Instant::from_millis(0)).unwrap();
        assert_eq!(c.in_use, 0, "{c:?}");
        assert_eq!(c.sum(), c.total);
    }
}

#[test]
fn tcp_echo_survives_loss() {
    let (mut server, mut client) = pair();
    server.dev.io_mut().set_loss_every(101);
    client.dev.io_mut().set_loss_every(103);
    let data = pattern(1 << 20);
    let back = echo_through(&mut server, &mut client, &data);
    assert!(
        back == data,
        "echoed {} of {} bytes",
        back.len(),
        data.len()
    );
    assert!(server.dev.io().stats().lost > 0 && client.dev.io().stats().lost > 0);
}

fn run(server: &mut N, client: &mut N, now: &mut Instant, ms: u64, accept: bool) {
    for _ in 0..ms {
        *now += Duration::from_millis(1);
        client.poll(*now).unwrap();
        server.poll(*now).unwrap();
        while accept && server.stack.accept(7).is_some() {}
    }
}

#[test]
fn syns_past_the_backlog_are_dropped_not_reset() {
    let (mut server, mut client) = pair_with(
        StackConfig {
            backlog: 4,
            ..StackConfig::default()
        },
        StackConfig::default(),
    );
    server.stack.listen_tcp(7, None).unwrap();
    let conns: Vec<_> = (0..10)
        .map(|_| client.stack.connect_tcp(server_ep()).unwrap().0)
        .collect();
    let mut now = Instant::from_millis(0);
    run(&mut server, &mut client, &mut now, 200, false);
    assert_eq!(server.stack.accept_queue_len(7), 4);
    assert!(server.stack.stats().syn_dropped >= 6);
    // Nobody was reset: the six left over are still trying.
    let mut states: Vec<State> = conns
        .iter()
        .map(|&h| client.stack.tcp(h).unwrap().state())
        .collect();
    states.sort_by_key(|s| format!("{s}"));
    let count = |st: State| states.iter().filter(|s| **s == st).count();
    assert_eq!((count(State::Established), count(State::SynSent)), (4, 6));
    // Accepting makes room: the retransmitted SYNs get in.
    run(&mut server, &mut client, &mut now, 5000, true);
    let established = conns
        .iter()
        .filter(|&&h| client.stack.tcp(h).unwrap().state() == State::Established)
        .count();
    assert!(established >= 8, "{established} of 10 established");
}

#[test]
fn per_frame_work_does_not_grow_with_open_connections() {
    // Small buffers: only the count of connections matters here.
    let cfg = StackConfig {
        tcp_rx_buffer: 4096,
        tcp_tx_buffer: 4096,
        backlog: 4096,
        ..StackConfig::default()
    };
    let (mut server, mut client) = pair_with(cfg, cfg);
    server.stack.listen_tcp(7, None).unwrap();
    let conns: Vec<_> = (0..2000)
        .map(|_| client.stack.connect_tcp(server_ep()).unwrap().0)
        .collect();
    let mut now = Instant::from_millis(0);
    let mut accepted = Vec::new();
    for _ in 0..50 {
        run(&mut server, &mut client, &mut now, 100, false);
        while let Some(h) = server.stack.accept(7) {
            accepted.push(h);
        }
    }
    assert_eq!(accepted.len(), conns.len());
    run(&mut server, &mut client, &mut now, 50, false);
    // Everything idle now. One segment on one connection:
    let before = server.stack.stats();
    let dev_before = server.dev.stats();
    client
        .stack
        .tcp(conns[1234])
        .unwrap()
        .send_slice(b"x")
        .unwrap();
    client.stack.touch(conns[1234]);
    now += Duration::from_millis(1);
    client.poll(now).unwrap();
    server.poll(now).unwrap();
    let after = server.stack.stats();
    assert_eq!(server.dev.stats().rx_delivered - dev_before.rx_delivered, 1);
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
    let (mut server, mut client) = pair();
    server.stack.listen_tcp(7, None).unwrap();
    let counters: Vec<Arc<Count>> = (0..50)
        .map(|_| Arc::new(Count(AtomicUsize::new(0))))
        .collect();
    for (k, c) in counters.iter().enumerate() {
        server
            .stack
            .accept_wait(7, k as u64, &Waker::from(c.clone()));
    }
    for _ in 0..3 {
        client.stack.connect_tcp(server_ep()).unwrap();
    }
    let mut now = Instant::from_millis(0);
    run(&mut server, &mut client, &mut now, 20, false);
    let woken: Vec<usize> = counters
        .iter()
        .map(|c| c.0.load(Ordering::SeqCst))
        .collect();
    assert_eq!(woken.iter().sum::<usize>(), 3, "{woken:?}");
    assert_eq!(&woken[..3], &[1, 1, 1], "first waiters first: {woken:?}");
    assert_eq!(server.stack.stats().accept_wakeups, 3);
}

#[test]
fn frames_are_all_accounted_after_shutdown_with_open_connections() {
    let (mut server, mut client) = pair();
    let _ = echo_through(&mut server, &mut client, &pattern(100_000));
    let c = server.shutdown(Instant::from_millis(0)).unwrap();
    assert_eq!((c.in_use, c.sum()), (0, c.total));
    let c = client.dev.io_mut().counts();
    assert_eq!(c.sum(), c.total);
}

#[test]
fn abort_then_release_sends_the_reset_and_frees_the_flow() {
    let (mut server, mut client) = pair();
    server.stack.listen_tcp(7, None).unwrap();
    let (c, _) = client.stack.connect_tcp(server_ep()).unwrap();
    let mut now = Instant::from_millis(0);
    run(&mut server, &mut client, &mut now, 10, false);
    let s = server.stack.accept(7).expect("accepted");
    assert_eq!(server.stack.tcp(s).unwrap().state(), State::Established);
    // What a load generator does to avoid TIME_WAIT: abort, then let go at once.
    client.stack.abort(c);
    client.stack.release(c);
    run(&mut server, &mut client, &mut now, 10, false);
    assert_eq!(
        server.stack.tcp(s).unwrap().state(),
        State::Closed,
        "the server never saw the reset"
    );
    assert_eq!(
        client.stack.stats().flows,
        0,
        "the aborted flow was not freed"
    );
}

#[test]
fn a_closed_flow_still_held_does_not_capture_a_new_connection_on_its_ports() {
    let (mut server, mut client) = pair();
    server.stack.listen_tcp(7, None).unwrap();
    let (c, port) = client.stack.connect_tcp(server_ep()).unwrap();
    let mut now = Instant::from_millis(0);
    run(&mut server, &mut client, &mut now, 10, false);
    // The server's application keeps holding the connection after the peer reset it.
    let held = server.stack.accept(7).expect("accepted");
    client.stack.abort(c);
    client.stack.release(c);
    run(&mut server, &mut client, &mut now, 10, false);
    assert_eq!(server.stack.tcp(held).unwrap().state(), State::Closed);
    // The peer opens a new connection from the same port (as after a port wrap).
    let (c2, port2) = loop {
        let (id, p) = client.stack.connect_tcp(server_ep()).unwrap();
        if p == port {
            break (id, p);
        }
        client.stack.abort(id);
        client.stack.release(id);
        client.poll(now).unwrap();
        server.poll(now).unwrap();
    };
    assert_eq!(port2, port);
    run(&mut server, &mut client, &mut now, 20, false);
    assert_eq!(client.stack.tcp(c2).unwrap().state(), State::Established);
    assert!(server.stack.accept(7).is_some());
}
