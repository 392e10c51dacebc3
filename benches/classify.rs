//! The classify stage per frame: parse Ethernet, IPv4 and TCP or UDP once and verify every
//! checksum (the stage every received frame goes through before the protocol). Bytes/s and time
//! per frame for a small segment, a full-size one and a UDP datagram.

use std::hint::black_box;

use corelane_stack::classify::{Class, classify};
use corelane_stack::frames::{tcp_v4, udp_v4};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn bench(c: &mut Criterion) {
    let cases = [
        ("tcp", 64usize, tcp_v4(false, &[7u8; 64])),
        ("tcp", 1448, tcp_v4(false, &[7u8; 1448])),
        ("udp", 64, udp_v4(&[7u8; 64])),
        ("udp", 1472, udp_v4(&[7u8; 1472])),
    ];
    let mut g = c.benchmark_group("classify");
    for (proto, payload, frame) in &cases {
        assert!(
            matches!(classify(frame), Class::Tcp { .. } | Class::Udp { .. }),
            "the benchmark frame must classify as good"
        );
        g.throughput(Throughput::Bytes(frame.len() as u64));
        g.bench_with_input(BenchmarkId::new(*proto, payload), frame, |b, f| {
            b.iter(|| classify(black_box(f)))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
