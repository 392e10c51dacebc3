//! Ring produce and consume through the frame I/O interface the pipeline uses, over the
//! in-memory link (the same ring discipline as AF_XDP: fill, RX, TX, completion, with every
//! frame's state checked by the ledger). One iteration moves a batch of `n` frames: allocate,
//! write a header, send with one kick (the link copies each frame into the peer's fill frame
//! and produces it on the peer's RX ring), receive the batch, release it to the fill ring, and
//! reclaim the sent frames from the completion ring. Reported per frame.

use std::collections::VecDeque;
use std::hint::black_box;

use corelane_frame::{FrameIo, MemFrame, MemLink};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring_produce_consume");
    for len in [64usize, 1514] {
        for n in [1usize, 16, 64] {
            let (mut a, mut b) = MemLink::default().pair();
            let mut tx: Vec<MemFrame> = Vec::with_capacity(n);
            let mut rx: VecDeque<MemFrame> = VecDeque::with_capacity(n);
            let mut done: Vec<MemFrame> = Vec::with_capacity(n);
            g.throughput(Throughput::Elements(n as u64));
            g.bench_with_input(BenchmarkId::new(format!("{len}B"), n), &n, |bench, &n| {
                bench.iter(|| {
                    a.alloc(&mut tx, n);
                    for f in tx.iter_mut() {
                        a.bytes_mut(f, len)[..14].fill(0xab);
                    }
                    let sent = a.send(&mut tx).unwrap_or(0);
                    let got = b.recv(&mut rx, n);
                    for f in rx.iter() {
                        black_box(b.bytes(f)[0]);
                    }
                    done.extend(rx.drain(..));
                    b.release(&mut done);
                    let _ = a.complete();
                    black_box((sent, got))
                })
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
