//! The per-core pipeline moving one TCP stream between two corelane stacks over an in-memory
//! ring pair on one core (RX batch, classify with checksum checks, flow lookup, TCP, egress, TX
//! batch, on both sides), next to smoltcp's own `Loopback` carrying the same stream between two
//! sockets of one interface as the baseline. Same MTU (1500), same socket buffers, checksums
//! computed and verified on both. Each iteration moves 256 KiB; criterion reports bytes/s and
//! data segments/s (ns per segment is its inverse).
//!
//! `cargo bench --bench pipeline -- --ratio` measures the goal's ratio instead: the two sides
//! interleaved round by round (see `ratio`), which a noisy host moves much less than runs
//! made one after the other.
//!
//! corelane's rows run over the zero-copy in-memory link (a sent frame's buffer becomes the
//! peer's received frame, as on a zero-copy NIC), so they measure the stacks' own work; the
//! `corelane_copy_link` row runs over the copying link (AF_XDP copy mode's extra copy per frame
//! included). smoltcp's `Loopback` hands its frame buffers over without a copy too (a fresh
//! allocation per frame).

use std::hint::black_box;
use std::task::Poll;

use corelane_frame::{MemLink, MemPort};
use corelane_stack::smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use corelane_stack::smoltcp::phy::{Device, DeviceCapabilities, Loopback, Medium};
use corelane_stack::smoltcp::socket::tcp;
use corelane_stack::smoltcp::time::{Duration, Instant};
use corelane_stack::smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr};
use corelane_stack::{BatchTuner, FlowId, Node, StackConfig, TuneConfig};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};

const CHUNK: usize = 256 * 1024;
const BUFFER: usize = 256 * 1024;
const MTU: usize = 1500;

/// Something that moves `CHUNK` bytes from one socket to the other and counts frames.
trait Pipe {
    /// Moves `data` across; returns data-carrying frames sent.
    fn transfer(&mut self, data: &[u8], sink: &mut [u8]) -> u64;
}

struct Corelane {
    a: Node<MemPort>,
    b: Node<MemPort>,
    tx: FlowId,
    rx: FlowId,
    now: Instant,
}

fn corelane(batch: usize, zero_copy: bool) -> Corelane {
    let cfg = StackConfig {
        tcp_rx_buffer: BUFFER,
        tcp_tx_buffer: BUFFER,
        batch,
        ..StackConfig::default()
    };
    let (pa, pb) = if zero_copy {
        MemLink::default().pair_zero_copy()
    } else {
        MemLink::default().pair()
    };
    let ip = |x: u8| {
        [IpCidr::new(
            format!("10.9.0.{x}").parse().expect("address"),
            24,
        )]
    };
    let mut a = Node::new(pa, [2, 0, 0, 0, 0, 1], &ip(1), MTU, cfg);
    let mut b = Node::new(pb, [2, 0, 0, 0, 0, 2], &ip(2), MTU, cfg);
    b.stack.listen_tcp(9, None).expect("listen");
    let tx = a
        .stack
        .connect_tcp("10.9.0.2:9".parse().expect("endpoint"))
        .expect("connect")
        .0;
    let mut now = Instant::from_millis(0);
    let rx = loop {
        now += Duration::from_millis(1);
        a.poll(now).expect("poll");
        b.poll(now).expect("poll");
        if let Some(id) = b.stack.accept(9) {
            break id;
        }
    };
    Corelane { a, b, tx, rx, now }
}

impl Pipe for Corelane {
    fn transfer(&mut self, data: &[u8], sink: &mut [u8]) -> u64 {
        let before = self.a.dev().stats().tx_frames;
        let (mut sent, mut got) = (0, 0);
        while got < data.len() {
            if sent < data.len()
                && let Poll::Ready(r) = self.a.stack.tcp_write(self.tx, &data[sent..], None)
            {
                sent += r.expect("send");
            }
            self.now += Duration::from_micros(5);
            self.a.poll(self.now).expect("poll");
            self.b.poll(self.now).expect("poll");
            while let Poll::Ready(Ok(n @ 1..)) = self.b.stack.tcp_read(self.rx, sink, None) {
                got += n;
            }
        }
        // ACKs sent by the receiver are not counted: data frames only.
        self.a.dev().stats().tx_frames - before
    }
}

/// smoltcp's Loopback with the MTU of an Ethernet link and a frame counter.
struct Counted {
    inner: Loopback,
    frames: u64,
}

impl Device for Counted {
    type RxToken<'a> = <Loopback as Device>::RxToken<'a>;
    type TxToken<'a> = <Loopback as Device>::TxToken<'a>;

    fn receive(&mut self, t: Instant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        self.inner.receive(t)
    }

    fn transmit(&mut self, t: Instant) -> Option<Self::TxToken<'_>> {
        self.frames += 1;
        self.inner.transmit(t)
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = self.inner.capabilities();
        c.max_transmission_unit = MTU + 14;
        c
    }
}

struct Plain {
    iface: Interface,
    dev: Counted,
    set: SocketSet<'static>,
    tx: SocketHandle,
    rx: SocketHandle,
    now: Instant,
}

fn plain() -> Plain {
    let mut dev = Counted {
        inner: Loopback::new(Medium::Ethernet),
        frames: 0,
    };
    let cfg = Config::new(HardwareAddress::Ethernet(EthernetAddress([
        2, 0, 0, 0, 0, 1,
    ])));
    let mut iface = Interface::new(cfg, &mut dev, Instant::ZERO);
    iface.update_ip_addrs(|a| {
        a.push(IpCidr::new("127.0.0.1".parse().expect("address"), 8))
            .expect("one address")
    });
    let sock = || {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; BUFFER]),
            tcp::SocketBuffer::new(vec![0; BUFFER]),
        );
        s.set_nagle_enabled(false);
        s
    };
    let mut set = SocketSet::new(Vec::new());
    let mut srv = sock();
    srv.listen(9).expect("listen");
    let rx = set.add(srv);
    let mut cli = sock();
    cli.connect(
        iface.context(),
        ("127.0.0.1".parse::<std::net::IpAddr>().expect("address"), 9),
        40000,
    )
    .expect("connect");
    let tx = set.add(cli);
    let mut now = Instant::ZERO;
    while !set.get::<tcp::Socket<'static>>(tx).may_send() {
        now += Duration::from_millis(1);
        iface.poll(now, &mut dev, &mut set);
    }
    Plain {
        iface,
        dev,
        set,
        tx,
        rx,
        now,
    }
}

impl Pipe for Plain {
    fn transfer(&mut self, data: &[u8], sink: &mut [u8]) -> u64 {
        let before = self.dev.frames;
        let (mut sent, mut got, mut acks) = (0, 0, 0u64);
        while got < data.len() {
            if sent < data.len() {
                let s = self.set.get_mut::<tcp::Socket<'static>>(self.tx);
                sent += s.send_slice(&data[sent..]).expect("send");
            }
            self.now += Duration::from_micros(5);
            // One poll transmits what is due and takes in what the loopback holds.
            self.iface.poll(self.now, &mut self.dev, &mut self.set);
            let r = self.set.get_mut::<tcp::Socket<'static>>(self.rx);
            let before_recv = got;
            while let Ok(n @ 1..) = r.recv_slice(sink) {
                got += n;
            }
            acks += u64::from(got > before_recv);
        }
        // Both sides share one device here: take away roughly one ACK per receive window
        // update so the count stays data frames (an upper bound on the cost per segment).
        (self.dev.frames - before).saturating_sub(acks)
    }
}

fn segments_per_chunk(p: &mut dyn Pipe, data: &[u8], sink: &mut [u8]) -> u64 {
    // Warm up, then count one transfer's data frames.
    for _ in 0..4 {
        p.transfer(data, sink);
    }
    p.transfer(data, sink).max(1)
}

fn bench(c: &mut Criterion) {
    let data: Vec<u8> = (0..CHUNK).map(|i| (i * 7) as u8).collect();
    let mut sink = vec![0u8; 64 * 1024];
    let mut g = c.benchmark_group("tcp_stream_256KiB");
    let mut q = plain();
    let segs = segments_per_chunk(&mut q, &data, &mut sink);
    g.throughput(Throughput::ElementsAndBytes {
        elements: segs,
        bytes: CHUNK as u64,
    });
    g.bench_function("smoltcp_loopback", |b| {
        b.iter(|| q.transfer(black_box(&data), &mut sink))
    });
    let mut p = corelane(64, false);
    let segs = segments_per_chunk(&mut p, &data, &mut sink);
    g.throughput(Throughput::ElementsAndBytes {
        elements: segs,
        bytes: CHUNK as u64,
    });
    g.bench_function("corelane_copy_link/64", |b| {
        b.iter(|| p.transfer(black_box(&data), &mut sink))
    });
    for batch in [4usize, 16, 64, 256] {
        let mut p = corelane(batch, true);
        let segs = segments_per_chunk(&mut p, &data, &mut sink);
        g.throughput(Throughput::ElementsAndBytes {
            elements: segs,
            bytes: CHUNK as u64,
        });
        g.bench_with_input(
            BenchmarkId::new("corelane_pipeline", batch),
            &batch,
            |b, _| b.iter(|| p.transfer(black_box(&data), &mut sink)),
        );
    }
    // Model-T: the batch adapts on both sides; where it settles and what each size cost.
    let mut p = corelane(256, true);
    let tune = TuneConfig {
        l2_bytes: corelane_rt::l2_bytes(0).unwrap_or(1 << 20),
        frame_bytes: 2048,
        ..TuneConfig::default()
    };
    p.a.pipe.tuner = Some(BatchTuner::new(tune));
    p.b.pipe.tuner = Some(BatchTuner::new(tune));
    let segs = segments_per_chunk(&mut p, &data, &mut sink);
    g.throughput(Throughput::ElementsAndBytes {
        elements: segs,
        bytes: CHUNK as u64,
    });
    g.bench_function("corelane_pipeline/adaptive", |b| {
        b.iter(|| p.transfer(black_box(&data), &mut sink))
    });
    g.finish();
    for (side, n) in [("sender", &p.a), ("receiver", &p.b)] {
        if let Some(t) = &n.pipe.tuner {
            println!(
                "adaptive batch, {side}: settled at {} (cap {} for {} KiB of L2, {} changes); per size: {}",
                t.settled(),
                t.cap(),
                tune.l2_bytes / 1024,
                t.changes(),
                t.levels()
                    .iter()
                    .map(|l| format!(
                        "{}: {:.0} ns/frame over {} frames",
                        l.batch, l.ns_per_frame, l.frames
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(3));
    targets = bench
}

/// `--ratio [ROUNDS]`: corelane's pipeline (batch 64) against smoltcp's Loopback, the two
/// interleaved: each round times a burst of transfers of one and then of the other (the order
/// alternating), so that a host that slows down or speeds up between runs, as a shared
/// virtual machine does, moves both sides of each round's ratio alike. Prints each side's
/// median time per 256 KiB and the median ratio with its spread over the rounds.
fn ratio(rounds: usize) {
    let data: Vec<u8> = (0..CHUNK).map(|i| (i * 7) as u8).collect();
    let mut sink = vec![0u8; 64 * 1024];
    let mut sides: [(&str, Box<dyn Pipe>); 2] = [
        ("smoltcp_loopback", Box::new(plain())),
        ("corelane_pipeline/64", Box::new(corelane(64, true))),
    ];
    for (_, p) in &mut sides {
        segments_per_chunk(p.as_mut(), &data, &mut sink);
    }
    // A burst of about 50 ms of the slower side.
    let burst = 400;
    let mut times = [Vec::new(), Vec::new()];
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let mut per = [0f64; 2];
        for k in 0..2 {
            let i = if round % 2 == 0 { k } else { 1 - k };
            let p = sides[i].1.as_mut();
            let t = std::time::Instant::now();
            for _ in 0..burst {
                p.transfer(black_box(&data), &mut sink);
            }
            per[i] = t.elapsed().as_secs_f64() * 1e6 / burst as f64;
            times[i].push(per[i]);
        }
        ratios.push(per[1] / per[0]);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for (i, (name, _)) in sides.iter().enumerate() {
        println!(
            "{name}: median {:.1} us per 256 KiB over {rounds} rounds of {burst}",
            median(&mut times[i])
        );
    }
    let m = median(&mut ratios);
    println!(
        "corelane / smoltcp: median {m:.3}x (rounds from {:.3}x to {:.3}x)",
        ratios[0],
        ratios[ratios.len() - 1]
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--ratio") {
        let rounds = args
            .get(at + 1)
            .and_then(|r| r.parse().ok())
            .unwrap_or(21usize)
            .max(1);
        ratio(rounds);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
