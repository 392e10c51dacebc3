//! TCP and UDP echo on one port, served by corelane over AF_XDP.
//!
//! Run it inside the network namespace that holds the interface, as root:
//!
//! ```text
//! ip netns exec NS target/release/examples/echo --iface IF --addr 10.77.0.3/24
//! ```
//!
//! The address must be one the kernel does not hold on that interface (corelane answers ARP and
//! NDP for it). Ctrl-C (or SIGTERM) stops it: connections are reset, the XDP program is detached,
//! and the frame accounting is printed.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant as StdInstant};

use clap::Parser;
use corelane::smoltcp::iface::SocketHandle;
use corelane::smoltcp::socket::tcp::State;
use corelane::smoltcp::wire::IpCidr;
use corelane::{AttachMode, Endpoint, StackConfig, XskConfig, ZeroCopy};

#[derive(Parser, Debug)]
#[command(about = "TCP and UDP echo served by corelane over AF_XDP")]
struct Args {
    /// Interface to serve (in the current network namespace).
    #[arg(long)]
    iface: String,
    /// Address the server owns, with prefix (IPv4 or IPv6); may repeat.
    #[arg(long = "addr", required = true, value_parser = parse_cidr)]
    addrs: Vec<IpCidr>,
    /// Port for both TCP and UDP echo.
    #[arg(long, default_value_t = 7)]
    port: u16,
    /// Cores to serve on. This release serves every queue of the interface from one core; one
    /// core per queue comes with the per-core runtime.
    #[arg(long, default_value_t = 1)]
    cores: usize,
    /// XDP attach mode: auto (native, else generic), native, generic.
    #[arg(long, default_value = "auto")]
    xdp_mode: String,
    /// Zero-copy: try (fall back to copy), off, require.
    #[arg(long, default_value = "try")]
    zero_copy: String,
    /// TCP listen backlog.
    #[arg(long, default_value_t = 256)]
    backlog: usize,
    /// Print counters every N seconds (0: only at exit).
    #[arg(long, default_value_t = 0)]
    stats_every: u64,
}

fn parse_cidr(s: &str) -> Result<IpCidr, String> {
    s.parse::<IpCidr>()
        .map_err(|_| format!("`{s}` is not an address with prefix, like 10.0.0.1/24 or fd00::1/64"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("echo: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.cores != 1 {
        return Err(format!(
            "--cores {}: this release serves all queues from one core; run with --cores 1",
            args.cores
        )
        .into());
    }
    let attach = match args.xdp_mode.as_str() {
        "auto" => AttachMode::Auto,
        "native" => AttachMode::Native,
        "generic" => AttachMode::Generic,
        m => return Err(format!("--xdp-mode {m}: use auto, native or generic").into()),
    };
    let zero_copy = match args.zero_copy.as_str() {
        "try" => ZeroCopy::Try,
        "off" => ZeroCopy::Off,
        "require" => ZeroCopy::Require,
        m => return Err(format!("--zero-copy {m}: use try, off or require").into()),
    };
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))?;
    }
    let mut builder = Endpoint::builder(&args.iface)
        .attach_mode(attach)
        .xsk(XskConfig {
            zero_copy,
            ..XskConfig::default()
        })
        .stack(StackConfig {
            backlog: args.backlog,
            ..StackConfig::default()
        });
    for a in &args.addrs {
        builder = builder.addr(*a);
    }
    let mut ep = builder.build()?;
    let listener = ep.listen_tcp(args.port)?;
    let udp = ep.bind_udp(args.port)?;
    println!("{}", ep.describe());
    println!(
        "echo: serving TCP and UDP port {} on 1 core; Ctrl-C stops",
        args.port
    );

    let mut conns: Vec<SocketHandle> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let (mut accepted, mut tcp_bytes, mut udp_datagrams) = (0u64, 0u64, 0u64);
    let mut idle_since = StdInstant::now();
    let mut last_stats = StdInstant::now();
    while !stop.load(Ordering::Relaxed) {
        let mut busy = ep.poll()?;
        while let Some(h) = ep.stack_mut().accept(listener) {
            accepted += 1;
            conns.push(h);
        }
        // TCP echo: move what arrived into the send buffer, as much as fits.
        conns.retain(|&h| {
            let s = ep.stack_mut().tcp(h);
            while s.can_recv() && s.send_queue() < s.send_capacity() {
                let room = (s.send_capacity() - s.send_queue()).min(buf.len());
                match s.recv_slice(&mut buf[..room]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let _ = s.send_slice(&buf[..n]);
                        tcp_bytes += n as u64;
                        busy = true;
                    }
                }
            }
            if s.state() == State::CloseWait && !s.can_recv() && s.send_queue() == 0 {
                s.close();
            }
            if matches!(s.state(), State::Closed | State::TimeWait) {
                ep.stack_mut().remove(h);
                return false;
            }
            true
        });
        // UDP echo.
        loop {
            let s = ep.stack_mut().udp(udp);
            if !s.can_send() {
                break;
            }
            let Ok((n, meta)) = s.recv_slice(&mut buf) else {
                break;
            };
            if s.send_slice(&buf[..n], meta.endpoint).is_ok() {
                udp_datagrams += 1;
            }
            busy = true;
        }
        ep.egress()?;
        if args.stats_every > 0 && last_stats.elapsed() >= Duration::from_secs(args.stats_every) {
            last_stats = StdInstant::now();
            print_stats(&ep, accepted, tcp_bytes, udp_datagrams, conns.len());
        }
        if busy {
            idle_since = StdInstant::now();
        } else if idle_since.elapsed() > Duration::from_micros(200) {
            ep.wait(Duration::from_millis(50))?;
        }
    }
    println!("echo: stopping");
    print_stats(&ep, accepted, tcp_bytes, udp_datagrams, conns.len());
    let counts = ep.shutdown()?;
    println!(
        "frames: {} total = {} free + {} fill + {} rx + {} in use + {} tx + {} completion",
        counts.total,
        counts.free,
        counts.fill,
        counts.rx,
        counts.in_use,
        counts.tx,
        counts.completion
    );
    if counts.sum() != counts.total || counts.in_use != 0 {
        return Err("frame accounting does not add up after shutdown".into());
    }
    println!("echo: XDP program detached");
    Ok(())
}

fn print_stats(ep: &Endpoint, accepted: u64, tcp_bytes: u64, udp: u64, open: usize) {
    let d = ep.device_stats();
    let x = ep.xdp_counters().unwrap_or_default();
    println!(
        "stats: connections {accepted} accepted, {open} open; echoed {tcp_bytes} TCP bytes, {udp} UDP datagrams; \
         rx {} frames ({} bad checksum, {} malformed, {} SYN dropped); tx {} frames in {} batches; \
         xdp steered {} passed {} malformed {} no-socket {}",
        d.rx_frames,
        d.rx_bad_checksum,
        d.rx_malformed,
        d.rx_syn_dropped,
        d.tx_frames,
        d.tx_batches,
        x.steered,
        x.passed,
        x.malformed,
        x.no_socket
    );
}
