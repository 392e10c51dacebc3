//! Flow lookup against the number of open flows: the stack's table (FxHash over both endpoints)
//! holding 10, 1,000 and 100,000 TCP connections. `hot` looks up one key again and again (what
//! the hash costs); `walk` looks up every flow in a scrambled order (at 100,000 flows the table
//! no longer fits in L2, so this also pays its cache misses); `miss` looks up keys that are not
//! there (the SYN and stray-segment path).

use std::hint::black_box;

use corelane_stack::FlowKey;
use corelane_stack::FlowTable;
use corelane_stack::smoltcp::wire::{IpAddress, IpEndpoint};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn key(i: u32, local_port: u16) -> FlowKey {
    FlowKey {
        local: IpEndpoint::new(IpAddress::v4(10, 0, 0, 1), local_port),
        remote: IpEndpoint::new(
            IpAddress::v4(10, 1 + (i >> 16) as u8, (i >> 8) as u8, i as u8),
            32768 + (i.wrapping_mul(2654435761) >> 17) as u16,
        ),
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("flow_lookup");
    g.throughput(Throughput::Elements(1));
    for n in [10u32, 1_000, 100_000] {
        let mut t = FlowTable::with_capacity(n as usize);
        let keys: Vec<FlowKey> = (0..n).map(|i| key(i, 80)).collect();
        for (i, k) in keys.iter().enumerate() {
            t.insert(*k, i as u32);
        }
        // A fixed scrambled order (multiplicative step, coprime with n for these n).
        let order: Vec<FlowKey> = (0..n as u64)
            .map(|i| keys[((i * 7919) % n as u64) as usize])
            .collect();
        let missing: Vec<FlowKey> = (0..n.min(1024)).map(|i| key(i, 81)).collect();
        g.bench_with_input(BenchmarkId::new("hot", n), &n, |b, _| {
            let k = keys[0];
            b.iter(|| black_box(t.get(black_box(&k))))
        });
        g.bench_with_input(BenchmarkId::new("walk", n), &n, |b, _| {
            let mut i = 0;
            b.iter(|| {
                i = if i + 1 == order.len() { 0 } else { i + 1 };
                black_box(t.get(&order[i]))
            })
        });
        g.bench_with_input(BenchmarkId::new("miss", n), &n, |b, _| {
            let mut i = 0;
            b.iter(|| {
                i = if i + 1 == missing.len() { 0 } else { i + 1 };
                black_box(t.get(&missing[i]))
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
