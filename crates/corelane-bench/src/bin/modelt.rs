//! Seed 004 (Model-T) re-run on corelane: the pipeline's cost per frame as the batch's working
//! set (batch x frame size) crosses the L1 data cache and then L2, and where the adaptive batch
//! settles next to that. One TCP stream between two stacks over an in-memory ring pair on one
//! core (every stage of both sides: RX, classify with checksums, flow lookup, TCP, egress, TX),
//! fixed batch sizes from 1 to 1024 at MTU 1500 (2 KiB frames) and MTU 9000 (16 KiB frames),
//! then the tuner from 256.
//!
//! ```text
//! cargo run --release -p corelane-bench --bin modelt -- --mib 64
//! ```

use std::path::PathBuf;
use std::task::Poll;
use std::time::Instant as StdInstant;

use clap::Parser;
use corelane_bench::{markdown_table, pin};
use corelane_frame::{MemLink, MemPort};
use corelane_stack::smoltcp::time::{Duration, Instant};
use corelane_stack::smoltcp::wire::IpCidr;
use corelane_stack::{BatchTuner, FlowId, Node, StackConfig, TuneConfig};

#[derive(Parser, Debug)]
#[command(about = "Cost per frame against the batch's working set (seed 004, Model-T)")]
struct Args {
    /// MiB moved per measurement.
    #[arg(long, default_value_t = 64)]
    mib: usize,
    /// Batch sizes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4,8,16,32,64,128,256,512,1024"
    )]
    batches: Vec<usize>,
    /// MTUs.
    #[arg(long, value_delimiter = ',', default_value = "1500,9000")]
    mtus: Vec<usize>,
    /// Where modelt.md goes.
    #[arg(long, default_value = "target/modelt")]
    out: PathBuf,
}

struct Pair {
    a: Node<MemPort>,
    b: Node<MemPort>,
    tx: FlowId,
    rx: FlowId,
    now: Instant,
}

fn frame_size(mtu: usize) -> usize {
    (mtu + 14).next_power_of_two().max(2048)
}

fn pair(mtu: usize, batch: usize) -> Result<Pair, String> {
    // Buffers that hold more than the largest batch of segments, so batches fill.
    let buffer = (1024 * mtu * 2).next_power_of_two();
    let mut cfg = StackConfig {
        tcp_rx_buffer: buffer,
        tcp_tx_buffer: buffer,
        batch,
        ..StackConfig::default()
    };
    cfg.tcp.rx_initial = buffer;
    let link = MemLink {
        frames: (3 * buffer / mtu).next_power_of_two().max(4096),
        frame_size: frame_size(mtu),
        ring_size: 2048,
    };
    let (pa, pb) = link.pair();
    let ip = |x: u8| -> Result<[IpCidr; 1], String> {
        Ok([IpCidr::new(
            format!("10.9.0.{x}").parse().map_err(|_| "address")?,
            24,
        )])
    };
    let mut a = Node::new(pa, [2, 0, 0, 0, 0, 1], &ip(1)?, mtu, cfg);
    let mut b = Node::new(pb, [2, 0, 0, 0, 0, 2], &ip(2)?, mtu, cfg);
    b.stack.listen_tcp(9, None).map_err(|e| e.to_string())?;
    let tx = a
        .stack
        .connect_tcp("10.9.0.2:9".parse().map_err(|_| "endpoint")?)
        .map_err(|e| e.to_string())?
        .0;
    let mut now = Instant::from_millis(0);
    for _ in 0..1000 {
        now += Duration::from_millis(1);
        a.poll(now).map_err(|e| e.to_string())?;
        b.poll(now).map_err(|e| e.to_string())?;
        if let Some(rx) = b.stack.accept(9) {
            return Ok(Pair { a, b, tx, rx, now });
        }
    }
    Err("the connection did not open".into())
}

impl Pair {
    /// Moves `bytes`; returns the data frames sent and the time it took.
    fn transfer(&mut self, bytes: usize) -> Result<(u64, std::time::Duration), String> {
        let data = vec![0x6bu8; 1 << 20];
        let mut sink = vec![0u8; 1 << 20];
        let frames = self.a.dev().stats().tx_frames;
        let t0 = StdInstant::now();
        let (mut sent, mut got) = (0usize, 0usize);
        while got < bytes {
            if sent < bytes {
                let off = sent % data.len();
                let end = data.len().min(off + (bytes - sent));
                if let Poll::Ready(r) = self.a.stack.tcp_write(self.tx, &data[off..end], None) {
                    sent += r.map_err(|e| e.to_string())?;
                }
            }
            self.now += Duration::from_micros(5);
            self.a.poll(self.now).map_err(|e| e.to_string())?;
            self.b.poll(self.now).map_err(|e| e.to_string())?;
            while let Poll::Ready(Ok(n @ 1..)) = self.b.stack.tcp_read(self.rx, &mut sink, None) {
                got += n;
            }
        }
        Ok((self.a.dev().stats().tx_frames - frames, t0.elapsed()))
    }
}

fn cache_size(index: u32) -> Option<usize> {
    let s = std::fs::read_to_string(format!(
        "/sys/devices/system/cpu/cpu0/cache/index{index}/size"
    ))
    .ok()?;
    let s = s.trim();
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: usize = n.parse().ok()?;
    Some(match unit {
        "K" => n << 10,
        "M" => n << 20,
        _ => n,
    })
}

fn main() -> Result<(), String> {
    let args = Args::parse();
    pin(0);
    let l1 = cache_size(0).unwrap_or(32 << 10);
    // index0 is the L1 data cache, index2 the L2 on x86.
    let l2 = cache_size(2).unwrap_or(1 << 20);
    let bytes = args.mib << 20;
    let mut rows = Vec::new();
    let mut settled = Vec::new();
    for &mtu in &args.mtus {
        let fs = frame_size(mtu);
        for &batch in &args.batches {
            let mut p = pair(mtu, batch)?;
            p.transfer(bytes / 8)?; // warm-up: the window opens
            let (frames, took) = p.transfer(bytes)?;
            let ns = took.as_nanos() as f64 / frames.max(1) as f64;
            let ws = batch * fs;
            let place = if ws <= l1 {
                "L1"
            } else if ws <= l2 {
                "L2"
            } else {
                "beyond L2"
            };
            eprintln!(
                "MTU {mtu} batch {batch:>4}: {ns:>6.0} ns/frame, working set {} KiB ({place})",
                ws >> 10
            );
            rows.push(vec![
                mtu.to_string(),
                batch.to_string(),
                format!("{}", ws >> 10),
                place.to_string(),
                format!("{ns:.0}"),
                format!("{:.2}", bytes as f64 * 8.0 / took.as_secs_f64() / 1e9),
            ]);
        }
        let mut p = pair(mtu, 256)?;
        let tune = TuneConfig {
            l2_bytes: l2,
            frame_bytes: fs,
            ..TuneConfig::default()
        };
        p.a.pipe.tuner = Some(BatchTuner::new(tune));
        p.b.pipe.tuner = Some(BatchTuner::new(tune));
        p.transfer(bytes / 8)?;
        let (frames, took) = p.transfer(bytes)?;
        let ns = took.as_nanos() as f64 / frames.max(1) as f64;
        for (side, n) in [("sender", &p.a), ("receiver", &p.b)] {
            if let Some(t) = &n.pipe.tuner {
                settled.push(format!(
                    "- MTU {mtu}, {side}: settled at {} (cap {} = half of L2 / {} KiB frames), {ns:.0} ns/frame overall",
                    t.settled(),
                    t.cap(),
                    fs >> 10
                ));
            }
        }
    }
    let table = markdown_table(
        &[
            "MTU",
            "batch",
            "working set KiB",
            "fits",
            "ns per data frame",
            "Gbit/s",
        ],
        &rows,
    );
    let md = format!(
        "# Cost per frame against the batch's working set (seed 004, Model-T)\n\nOne TCP stream between two corelane stacks over an \
         in-memory ring pair, both on one core (CPU 0): every stage of both sides per data frame (the ACKs included). \
         {} MiB per cell after a warm-up. L1d {} KiB, L2 {} KiB on this machine. The working set is the batch's frames \
         (batch x frame size); the flows' state and the stack's code come on top.\n\n{table}\n\nThe adaptive batch \
         (starting at 256):\n\n{}\n\nReproduce: `cargo run --release -p corelane-bench --bin modelt -- --mib {}`\n",
        args.mib,
        l1 >> 10,
        l2 >> 10,
        settled.join("\n"),
        args.mib
    );
    print!("{md}");
    std::fs::create_dir_all(&args.out).map_err(|e| e.to_string())?;
    std::fs::write(args.out.join("modelt.md"), md).map_err(|e| e.to_string())?;
    Ok(())
}
