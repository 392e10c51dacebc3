//! A SYN flood against a corelane listener and against a kernel listener (SYN cookies on, the
//! same backlog), one after the other on the same veth pair: spoofed SYNs from random sources
//! as fast as the client end takes them for `--seconds`, while a real client connects (and
//! echoes a line) every `--every-ms`. Reports the flood's rate, how many real connections
//! completed, their connect times (median, 99th percentile, worst), and the server's memory
//! growth (corelane: this process's RSS; kernel: the machine's slab). corelane runs twice:
//! with its XDP program answering the flooded listener's SYNs with cookies (`corelane`, the
//! default off veth, asked for here) and with its stack answering them (`corelane-stack`).
//!
//! ```text
//! cargo run --release -p corelane-bench --bin synflood -- --seconds 20
//! ```

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use corelane_bench::{markdown_table, pin};
use corelane_testnet::{SynFlood, VethPair};

const KERNEL: &str = "10.85.0.1";
const CORELANE: &str = "10.85.0.3";
const PORT: u16 = 7;
const XDP_OBJECT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../corelane-xsk/xdp/corelane.bpf.o"
);

#[derive(Parser, Debug)]
#[command(about = "A SYN flood against corelane and against the kernel")]
struct Args {
    /// Seconds each flood lasts.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// At most this many SYNs per flood.
    #[arg(long, default_value_t = 50_000_000)]
    max_syns: u64,
    /// A real connection every this many milliseconds during the flood.
    #[arg(long, default_value_t = 100)]
    every_ms: u64,
    /// The listeners' backlog.
    #[arg(long, default_value_t = 128)]
    backlog: usize,
    /// Setups: kernel, corelane (the XDP program answers a flooded listener's SYNs with
    /// cookies), corelane-stack (the stack answers them).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kernel,corelane,corelane-stack"
    )]
    setups: Vec<String>,
    /// Where synflood.md goes.
    #[arg(long, default_value = "target/synflood")]
    out: PathBuf,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("synflood: {e}");
        std::process::exit(1);
    }
}

/// One setup's figures.
#[derive(Debug, Default)]
struct Outcome {
    setup: String,
    syns: u64,
    rate: f64,
    ok: usize,
    failed: usize,
    first_error: Option<String>,
    connect_us: Vec<f64>,
    echo_us: Vec<f64>,
    mem_kib: i64,
}

fn meminfo(key: &str) -> i64 {
    let file = if key == "VmRSS:" {
        "/proc/self/status"
    } else {
        "/proc/meminfo"
    };
    std::fs::read_to_string(file)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Connects and echoes a line: the connect time and the whole exchange's.
fn echo_once(addr: SocketAddr) -> Result<(Duration, Duration), String> {
    let t = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    let took = t.elapsed();
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"ping\n").map_err(|e| format!("write: {e}"))?;
    let mut buf = [0u8; 5];
    s.read_exact(&mut buf).map_err(|e| format!("read: {e}"))?;
    Ok((took, t.elapsed()))
}

fn kernel_server(net: &VethPair, backlog: usize) -> Result<(), String> {
    corelane_bench::kernel_echo(net.server_ns(), KERNEL, PORT, Some(backlog))
}

fn corelane_server(
    net: &VethPair,
    backlog: usize,
    xdp_cookies: bool,
) -> Result<corelane_bench::CorelaneServer, String> {
    corelane_bench::corelane_echo(
        net.server_ns(),
        net.server_if(),
        &format!("{CORELANE}/24"),
        PORT,
        move |b| b.backlog(backlog).xdp_syn_cookies(xdp_cookies),
    )
}

/// Floods `ip` while a real client connects to it; returns the figures.
fn flood(net: &VethPair, args: &Args, setup: &str, ip: &str) -> Result<Outcome, String> {
    let addr: SocketAddr = format!("{ip}:{PORT}").parse().map_err(|_| "address")?;
    net.client_ns()
        .run(move || echo_once(addr))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("{setup} before the flood: {e}"))?;
    let mem_key = if setup == "corelane" {
        "VmRSS:"
    } else {
        "Slab:"
    };
    let mem_before = meminfo(mem_key);
    let mac = net
        .server_ns()
        .mac(net.server_if())
        .map_err(|e| e.to_string())?;
    let target = format!("{ip}:{PORT}").parse().map_err(|_| "address")?;
    let seconds = Duration::from_secs(args.seconds);
    let f = SynFlood::builder(target, mac)
        .limit(args.max_syns, seconds)
        .start(net.client_ns(), net.client_if())
        .map_err(|e| e.to_string())?;
    let every = Duration::from_millis(args.every_ms);
    let tries = net
        .client_ns()
        .run(move || {
            pin(1);
            let begun = Instant::now();
            let mut v = Vec::new();
            while begun.elapsed() + Duration::from_millis(200) < seconds {
                v.push(echo_once(addr));
                std::thread::sleep(every);
            }
            v
        })
        .map_err(|e| e.to_string())?;
    let mem_peak = meminfo(mem_key);
    let report = f.join().map_err(|e| e.to_string())?;
    let mut o = Outcome {
        setup: setup.into(),
        syns: report.sent,
        rate: report.rate(),
        mem_kib: mem_peak - mem_before,
        ..Outcome::default()
    };
    for t in tries {
        match t {
            Ok((c, e)) => {
                o.ok += 1;
                o.connect_us.push(c.as_secs_f64() * 1e6);
                o.echo_us.push(e.as_secs_f64() * 1e6);
            }
            Err(e) => {
                o.failed += 1;
                o.first_error.get_or_insert(e);
            }
        }
    }
    o.connect_us.sort_by(f64::total_cmp);
    o.echo_us.sort_by(f64::total_cmp);
    println!(
        "{setup:<9} {} SYNs ({:.0}/s): {} of {} connections, connect p50 {:.0} us p99 {:.0} us max {:.0} us, connect+echo p50 {:.0} us max {:.0} us, memory {:+} KiB{}",
        o.syns,
        o.rate,
        o.ok,
        o.ok + o.failed,
        pct(&o.connect_us, 0.5),
        pct(&o.connect_us, 0.99),
        o.connect_us.last().copied().unwrap_or(0.0),
        pct(&o.echo_us, 0.5),
        o.echo_us.last().copied().unwrap_or(0.0),
        o.mem_kib,
        o.first_error
            .as_ref()
            .map_or(String::new(), |e| format!(" (first failure: {e})"))
    );
    Ok(o)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn run(args: &Args) -> Result<(), String> {
    if !corelane_testnet::is_root() {
        return Err("needs root (network namespaces, XDP)".into());
    }
    let net = VethPair::builder()
        .server_addr(&format!("{KERNEL}/24"))
        .client_addr("10.85.0.2/24")
        .build()
        .map_err(|e| e.to_string())?;
    // veth delivers XDP_TX (corelane's SYN-ACKs under a flood) only to a peer that runs an XDP
    // program itself: corelane's, owning nothing, passes everything. Every setup has it.
    net.client_ns()
        .attach_xdp(net.client_if(), XDP_OBJECT)
        .map_err(|e| format!("an XDP program on the client end: {e}"))?;
    let mut outcomes = Vec::new();
    for setup in &args.setups {
        match setup.as_str() {
            "kernel" => {
                net.server_ns()
                    .run(|| std::fs::write("/proc/sys/net/ipv4/tcp_syncookies", "1"))
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("tcp_syncookies: {e}"))?;
                kernel_server(&net, args.backlog)?;
                outcomes.push(flood(&net, args, "kernel", KERNEL)?);
            }
            "corelane" | "corelane-stack" => {
                let stop = corelane_server(&net, args.backlog, setup == "corelane")?;
                let o = flood(&net, args, setup, CORELANE);
                stop.stop();
                outcomes.push(o?);
            }
            other => {
                return Err(format!(
                    "unknown setup {other:?} (kernel, corelane, corelane-stack)"
                ));
            }
        }
    }
    let rows: Vec<Vec<String>> = outcomes
        .iter()
        .map(|o| {
            vec![
                o.setup.clone(),
                o.syns.to_string(),
                format!("{:.0}", o.rate),
                format!("{} / {}", o.ok, o.ok + o.failed),
                format!("{:.0}", pct(&o.connect_us, 0.5)),
                format!("{:.0}", pct(&o.connect_us, 0.99)),
                format!("{:.0}", o.connect_us.last().copied().unwrap_or(0.0)),
                format!("{:.0}", pct(&o.echo_us, 0.5)),
                format!("{:.0}", o.echo_us.last().copied().unwrap_or(0.0)),
                format!("{:+}", o.mem_kib),
            ]
        })
        .collect();
    let table = markdown_table(
        &[
            "server",
            "spoofed SYNs",
            "SYNs/s",
            "real connections ok",
            "connect p50 us",
            "connect p99 us",
            "connect max us",
            "connect + echo p50 us",
            "connect + echo max us",
            "memory growth KiB",
        ],
        &rows,
    );
    let md = format!(
        "# A SYN flood against corelane and the kernel\n\n{} s of spoofed SYNs from random \
         10.200.0.0/16 sources, as fast as the client end of a veth pair takes them, while a \
         real client connects and echoes a line every {} ms. Backlog {} for all; the kernel \
         with `tcp_syncookies=1`; `corelane`: its XDP program answers the flooded listener's \
         SYNs with cookies, `corelane-stack`: its stack does. The client end runs an XDP \
         program that passes everything (veth delivers XDP_TX only to such a peer). Memory: \
         corelane's process RSS, the kernel's slab, peak during the flood minus \
         before.\n\n{table}\n\nReproduce: `cargo run --release -p \
         corelane-bench --bin synflood -- --seconds {}`\n",
        args.seconds, args.every_ms, args.backlog, args.seconds
    );
    println!("\n{md}");
    std::fs::create_dir_all(&args.out).map_err(|e| e.to_string())?;
    std::fs::write(args.out.join("synflood.md"), &md).map_err(|e| e.to_string())?;
    println!("wrote {}/synflood.md", args.out.display());
    Ok(())
}
