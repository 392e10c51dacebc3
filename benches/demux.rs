//! Per-packet cost against the number of open connections.
//!
//! Two corelane stacks over the in-memory link hold N established, idle connections; one
//! 64-byte request/response round trip runs over one of them per iteration (RX, classify, demux,
//! TCP, egress, TX on both sides). With the flow table the time per round trip should not grow
//! with N. The same round trip through smoltcp's own `SocketSet` (every socket scanned per
//! packet) is measured alongside as the baseline. `_hot` runs every round trip on one
//! connection (caches warm); the others walk all N connections, so at large N each round trip
//! also pays the cache misses of a cold flow.

use std::hint::black_box;
use std::task::Poll;

use corelane_frame::{MemLink, MemPort};
use corelane_stack::smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use corelane_stack::smoltcp::phy::{Loopback, Medium};
use corelane_stack::smoltcp::socket::tcp;
use corelane_stack::smoltcp::time::{Duration, Instant};
use corelane_stack::smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr};
use corelane_stack::{FlowId, Node, StackConfig};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

const SIZES: [usize; 2] = [10, 10_000];

struct Pair {
    server: Node<MemPort>,
    client: Node<MemPort>,
    c: Vec<FlowId>,
    s: Vec<FlowId>,
    now: Instant,
}

fn pair(n: usize) -> Pair {
    let cfg = StackConfig {
        tcp_rx_buffer: 4096,
        tcp_tx_buffer: 4096,
        backlog: n + 1,
        flows: n + 16,
        ..StackConfig::default()
    };
    let (a, b) = MemLink::default().pair();
    let ip = |x: u8| [IpCidr::new(format!("10.9.0.{x}").parse().unwrap(), 24)];
    let mut server = Node::new(a, [2, 0, 0, 0, 0, 1], &ip(1), 1500, cfg);
    let mut client = Node::new(b, [2, 0, 0, 0, 0, 2], &ip(2), 1500, cfg);
    server.stack.listen_tcp(7, None).unwrap();
    let mut now = Instant::from_millis(0);
    let mut c = Vec::with_capacity(n);
    let mut s = Vec::with_capacity(n);
    while s.len() < n {
        // Open in waves the in-memory link can carry.
        while c.len() < n && c.len() < s.len() + 256 {
            c.push(
                client
                    .stack
                    .connect_tcp("10.9.0.1:7".parse().unwrap())
                    .unwrap()
                    .0,
            );
        }
        now += Duration::from_millis(1);
        client.poll(now).unwrap();
        server.poll(now).unwrap();
        while let Some(h) = server.stack.accept(7) {
            s.push(h);
        }
    }
    // Let delayed ACKs and timers settle so every connection is idle.
    for _ in 0..100 {
        now += Duration::from_millis(10);
        client.poll(now).unwrap();
        server.poll(now).unwrap();
    }
    Pair {
        server,
        client,
        c,
        s,
        now,
    }
}

/// The byte count of a socket call that must complete now.
fn ready(p: Poll<std::io::Result<usize>>) -> usize {
    match p {
        Poll::Ready(Ok(n)) => n,
        other => panic!("socket call did not complete: {other:?}"),
    }
}

fn round_trip(p: &mut Pair, k: usize, msg: &[u8], buf: &mut [u8]) {
    let (c, s) = (p.c[k], p.s[k]);
    assert_eq!(ready(p.client.stack.tcp_write(c, msg, None)), msg.len());
    p.now += Duration::from_micros(10);
    p.client.poll(p.now).unwrap();
    p.server.poll(p.now).unwrap();
    let n = ready(p.server.stack.tcp_read(s, buf, None));
    assert_eq!(ready(p.server.stack.tcp_write(s, &buf[..n], None)), n);
    p.server.poll(p.now).unwrap();
    p.client.poll(p.now).unwrap();
    let got = ready(p.client.stack.tcp_read(c, buf, None));
    assert_eq!(got, msg.len());
}

/// smoltcp alone: one interface on a Loopback, client and server sockets in one SocketSet.
struct Plain {
    iface: Interface,
    dev: Loopback,
    set: SocketSet<'static>,
    pairs: Vec<(SocketHandle, SocketHandle)>,
    now: Instant,
}

fn plain(n: usize) -> Plain {
    let mut dev = Loopback::new(Medium::Ethernet);
    let cfg = Config::new(HardwareAddress::Ethernet(EthernetAddress([
        2, 0, 0, 0, 0, 1,
    ])));
    let mut iface = Interface::new(cfg, &mut dev, Instant::ZERO);
    iface.update_ip_addrs(|a| {
        a.push(IpCidr::new("127.0.0.1".parse().unwrap(), 8))
            .unwrap()
    });
    let mut set = SocketSet::new(Vec::new());
    let sock = || {
        tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; 4096]),
            tcp::SocketBuffer::new(vec![0; 4096]),
        )
    };
    let mut pairs = Vec::with_capacity(n);
    let mut now = Instant::ZERO;
    for i in 0..n {
        let port = 1000 + i as u16;
        let mut srv = sock();
        srv.listen(port).unwrap();
        let sh = set.add(srv);
        let mut cli = sock();
        cli.connect(
            iface.context(),
            ("127.0.0.1".parse::<std::net::IpAddr>().unwrap(), port),
            20000 + i as u16,
        )
        .unwrap();
        let ch = set.add(cli);
        pairs.push((ch, sh));
        if i % 64 == 63 {
            now += Duration::from_millis(1);
            iface.poll(now, &mut dev, &mut set);
        }
    }
    for _ in 0..100 {
        now += Duration::from_millis(10);
        iface.poll(now, &mut dev, &mut set);
    }
    Plain {
        iface,
        dev,
        set,
        pairs,
        now,
    }
}

fn plain_round_trip(p: &mut Plain, k: usize, msg: &[u8], buf: &mut [u8]) {
    let (c, s) = p.pairs[k];
    p.set
        .get_mut::<tcp::Socket<'static>>(c)
        .send_slice(msg)
        .unwrap();
    p.now += Duration::from_micros(10);
    // One poll sends (egress), the next takes it in (ingress): Loopback has no second side.
    p.iface.poll(p.now, &mut p.dev, &mut p.set);
    p.iface.poll(p.now, &mut p.dev, &mut p.set);
    let sock = p.set.get_mut::<tcp::Socket<'static>>(s);
    let n = sock.recv_slice(buf).unwrap();
    sock.send_slice(&buf[..n]).unwrap();
    p.iface.poll(p.now, &mut p.dev, &mut p.set);
    p.iface.poll(p.now, &mut p.dev, &mut p.set);
    let got = p
        .set
        .get_mut::<tcp::Socket<'static>>(c)
        .recv_slice(buf)
        .unwrap();
    assert_eq!(got, msg.len());
}

fn bench(c: &mut Criterion) {
    let msg = [7u8; 64];
    let mut buf = [0u8; 4096];
    let mut g = c.benchmark_group("round_trip_64B_by_open_connections");
    for n in SIZES {
        let mut p = pair(n);
        let mut k = 0;
        g.bench_with_input(BenchmarkId::new("corelane_flow_table", n), &n, |b, _| {
            b.iter(|| {
                // Walk the connections so the cost of finding any of them is measured.
                k = (k + 7919) % n;
                round_trip(black_box(&mut p), k, &msg, &mut buf);
            })
        });
        // The same connection every time: what the lookup itself costs, caches warm.
        g.bench_with_input(
            BenchmarkId::new("corelane_flow_table_hot", n),
            &n,
            |b, _| b.iter(|| round_trip(black_box(&mut p), 0, &msg, &mut buf)),
        );
        let mut q = plain(n);
        g.bench_with_input(BenchmarkId::new("smoltcp_socketset", n), &n, |b, _| {
            b.iter(|| {
                k = (k + 7919) % n;
                plain_round_trip(black_box(&mut q), k, &msg, &mut buf);
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
