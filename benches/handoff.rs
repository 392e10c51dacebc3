//! What handing a frame to another core costs: one SPSC ring push (copy in) and pop (copy out),
//! on one thread (the copies alone) and across two threads pinned to different CPUs (the
//! cache-line transfers as well).

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use corelane_rt::handoff::channel;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("handoff");
    for len in [64usize, 1514] {
        let frame = vec![0xabu8; len];
        g.throughput(Throughput::Elements(1));
        let (mut p, mut q) = channel(1024, 0);
        g.bench_with_input(
            BenchmarkId::new("push_pop_same_thread", len),
            &len,
            |b, _| {
                b.iter(|| {
                    assert!(p.push(0, black_box(&frame)));
                    assert!(q.pop(|_, bytes| {
                        black_box(bytes);
                    }));
                })
            },
        );
        // Producer on another CPU keeps the ring fed; we measure the consumer's pops.
        let (mut p, mut q) = channel(1024, 0);
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let f = frame.clone();
        let cpus = corelane_rt::allowed_cpus();
        let producer_cpu = *cpus.last().unwrap_or(&0);
        let t = std::thread::spawn(move || {
            core_affinity::set_for_current(core_affinity::CoreId { id: producer_cpu });
            while !s.load(Ordering::Relaxed) {
                if !p.push(0, &f) {
                    std::hint::spin_loop();
                }
            }
        });
        core_affinity::set_for_current(core_affinity::CoreId { id: cpus[0] });
        g.bench_with_input(
            BenchmarkId::new("pop_fed_from_other_cpu", len),
            &len,
            |b, _| {
                b.iter(|| {
                    while !q.pop(|_, bytes| {
                        black_box(bytes);
                    }) {
                        std::hint::spin_loop();
                    }
                })
            },
        );
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
