//! corelane's own cost per request, without the kernel: two corelane stacks on one core over
//! the in-memory link exchange requests and responses (1 B and 64 B, on 1, 16 and 256
//! connections at once), next to smoltcp carrying the same exchange between two sockets of one
//! interface on its `Loopback`, in the same run. Prints ns per request per side (the run's time
//! over the requests answered, halved: each stack does one side's work) and writes
//! docs/results/reqresp.md.
//!
//! ```sh
//! cargo run --release -p corelane-bench --bin reqresp            # the table
//! cargo run --release -p corelane-bench --bin reqresp -- --quick # fewer requests
//! cargo run --release -p corelane-bench --bin reqresp -- --profile 16 1 corelane # one row, for perf
//! ```
//!
//! corelane's stacks are joined by the zero-copy in-memory link (`MemLink::pair_zero_copy`: a
//! sent frame's buffer becomes the peer's received frame, as on a zero-copy NIC), so the figure
//! is the stacks' own work; smoltcp's `Loopback` hands its frames over without a copy too.

use std::task::Poll;
use std::time::Instant as Wall;

use corelane_frame::{MemLink, MemPort};
use corelane_stack::smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use corelane_stack::smoltcp::phy::{Loopback, Medium};
use corelane_stack::smoltcp::socket::tcp;
use corelane_stack::smoltcp::time::{Duration, Instant};
use corelane_stack::smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr, Ipv4Address};
use corelane_stack::{FlowId, Node, StackConfig};

const MTU: usize = 1500;

type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;
const BUFFER: usize = 16 * 1024;

/// One side of the exchange: `n` connections, each sending `size` bytes and reading `size` back.
trait Exchange {
    /// One round: a request on every connection, answered; returns when every response is in.
    fn round(&mut self, size: usize) -> Result<()>;
}

struct Corelane {
    a: Node<MemPort>,
    b: Node<MemPort>,
    clients: Vec<FlowId>,
    servers: Vec<FlowId>,
    now: Instant,
    buf: Vec<u8>,
    /// Bytes of the round's request each server has, and of the response each client has.
    at_server: Vec<usize>,
    at_client: Vec<usize>,
}

fn corelane(n: usize) -> Result<Corelane> {
    let cfg = StackConfig {
        tcp_rx_buffer: BUFFER,
        tcp_tx_buffer: BUFFER,
        seed: Some(7),
        ..StackConfig::default()
    };
    let (pa, pb) = MemLink::default().pair_zero_copy();
    let ip = |x: u8| [IpCidr::new(Ipv4Address::new(10, 9, 0, x).into(), 24)];
    let mut a = Node::new(pa, [2, 0, 0, 0, 0, 1], &ip(1), MTU, cfg);
    let mut b = Node::new(pb, [2, 0, 0, 0, 0, 2], &ip(2), MTU, cfg);
    b.stack.listen_tcp(9, None)?;
    let mut clients = Vec::new();
    for _ in 0..n {
        let (c, _) = a.stack.connect_tcp("10.9.0.2:9".parse()?)?;
        a.stack.tcp_set_nodelay(c, true)?;
        clients.push(c);
    }
    let mut now = Instant::from_millis(0);
    let mut servers = Vec::new();
    while servers.len() < n {
        now += Duration::from_millis(1);
        a.poll(now)?;
        b.poll(now)?;
        while let Some(s) = b.stack.accept(9) {
            b.stack.tcp_set_nodelay(s, true)?;
            servers.push(s);
        }
    }
    Ok(Corelane {
        a,
        b,
        clients,
        servers,
        now,
        buf: vec![0; 4096],
        at_server: vec![0; n],
        at_client: vec![0; n],
    })
}

impl Exchange for Corelane {
    fn round(&mut self, size: usize) -> Result<()> {
        let req = vec![b'q'; size];
        for &c in &self.clients {
            if !matches!(self.a.stack.tcp_write(c, &req, None), Poll::Ready(Ok(n)) if n == size) {
                return Err("a request did not fit the send buffer".into());
            }
        }
        self.at_server.fill(0);
        self.at_client.fill(0);
        let mut done = 0;
        while done < self.clients.len() {
            self.now += Duration::from_micros(1);
            self.a.poll(self.now)?;
            self.b.poll(self.now)?;
            for (k, &s) in self.servers.iter().enumerate() {
                if self.at_server[k] == size {
                    continue;
                }
                while let Poll::Ready(Ok(n @ 1..)) = self.b.stack.tcp_read(s, &mut self.buf, None) {
                    self.at_server[k] += n;
                }
                if self.at_server[k] == size {
                    let _ = self.b.stack.tcp_write(s, &req, None);
                }
            }
            for (k, &c) in self.clients.iter().enumerate() {
                if self.at_client[k] == size {
                    continue;
                }
                while let Poll::Ready(Ok(n @ 1..)) = self.a.stack.tcp_read(c, &mut self.buf, None) {
                    self.at_client[k] += n;
                }
                done += usize::from(self.at_client[k] == size);
            }
        }
        Ok(())
    }
}

struct Smol {
    iface: Interface,
    dev: Loopback,
    set: SocketSet<'static>,
    clients: Vec<SocketHandle>,
    servers: Vec<SocketHandle>,
    now: Instant,
    buf: Vec<u8>,
    at_server: Vec<usize>,
    at_client: Vec<usize>,
}

fn smol(n: usize) -> Result<Smol> {
    let mut dev = Loopback::new(Medium::Ethernet);
    let cfg = Config::new(HardwareAddress::Ethernet(EthernetAddress([
        2, 0, 0, 0, 0, 1,
    ])));
    let mut iface = Interface::new(cfg, &mut dev, Instant::ZERO);
    iface.update_ip_addrs(|a| {
        let _ = a.push(IpCidr::new(Ipv4Address::new(127, 0, 0, 1).into(), 8));
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
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for k in 0..n {
        // smoltcp takes one connection per listening socket.
        let mut srv = sock();
        srv.listen(9)?;
        servers.push(set.add(srv));
        let mut cli = sock();
        cli.connect(
            iface.context(),
            (std::net::IpAddr::from([127, 0, 0, 1]), 9),
            40000 + k as u16,
        )?;
        clients.push(set.add(cli));
    }
    let mut now = Instant::ZERO;
    while !clients
        .iter()
        .all(|&c| set.get::<tcp::Socket<'static>>(c).may_send())
    {
        now += Duration::from_millis(1);
        iface.poll(now, &mut dev, &mut set);
    }
    Ok(Smol {
        iface,
        dev,
        set,
        clients,
        servers,
        now,
        buf: vec![0; 4096],
        at_server: vec![0; n],
        at_client: vec![0; n],
    })
}

impl Exchange for Smol {
    fn round(&mut self, size: usize) -> Result<()> {
        let req = vec![b'q'; size];
        for &c in &self.clients {
            let s = self.set.get_mut::<tcp::Socket<'static>>(c);
            if s.send_slice(&req)? != size {
                return Err("a request did not fit the send buffer".into());
            }
        }
        self.at_server.fill(0);
        self.at_client.fill(0);
        let mut done = 0;
        while done < self.clients.len() {
            self.now += Duration::from_micros(1);
            self.iface.poll(self.now, &mut self.dev, &mut self.set);
            for (k, &h) in self.servers.iter().enumerate() {
                if self.at_server[k] == size {
                    continue;
                }
                let s = self.set.get_mut::<tcp::Socket<'static>>(h);
                while let Ok(n @ 1..) = s.recv_slice(&mut self.buf) {
                    self.at_server[k] += n;
                }
                if self.at_server[k] == size {
                    let _ = s.send_slice(&req);
                }
            }
            for (k, &h) in self.clients.iter().enumerate() {
                if self.at_client[k] == size {
                    continue;
                }
                let s = self.set.get_mut::<tcp::Socket<'static>>(h);
                while let Ok(n @ 1..) = s.recv_slice(&mut self.buf) {
                    self.at_client[k] += n;
                }
                done += usize::from(self.at_client[k] == size);
            }
        }
        Ok(())
    }
}

/// ns per request per side: `requests` answered in `rounds` rounds after a warm-up.
fn measure(x: &mut dyn Exchange, n: usize, size: usize, requests: usize) -> Result<f64> {
    let rounds = requests.div_ceil(n).max(10);
    for _ in 0..rounds / 10 {
        x.round(size)?;
    }
    let t = Wall::now();
    for _ in 0..rounds {
        x.round(size)?;
    }
    Ok(t.elapsed().as_nanos() as f64 / (rounds * n) as f64 / 2.0)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let requests = if quick { 20_000 } else { 300_000 };
    // `--profile N SIZE corelane|smoltcp`: one row, one side, ten times the requests (for perf).
    if let Some(at) = args.iter().position(|a| a == "--profile") {
        let get = |k: usize| args.get(at + k).cloned().unwrap_or_default();
        let (n, size) = (get(1).parse().unwrap_or(16), get(2).parse().unwrap_or(1));
        let ns = if get(3) == "smoltcp" {
            measure(&mut smol(n)?, n, size, requests * 10)?
        } else {
            let mut c = corelane(n)?;
            let ns = measure(&mut c, n, size, requests * 10)?;
            let (a, b) = (c.a.pipe.stats(), c.b.pipe.stats());
            println!(
                "turns: {} and {} ({} and {} busy), segments out {} and {}",
                a.turns,
                b.turns,
                a.busy_turns,
                b.busy_turns,
                c.a.stack.stats().tcp.segs_out,
                c.b.stack.stats().tcp.segs_out
            );
            ns
        };
        println!(
            "{} {n} connections {size} B: {ns:.0} ns per request per side",
            get(3)
        );
        return Ok(());
    }
    let mut rows = Vec::new();
    println!("connections  size  corelane ns  smoltcp ns  ratio");
    for n in [1usize, 16, 256] {
        for size in [1usize, 64] {
            let c = measure(&mut corelane(n)?, n, size, requests)?;
            let s = measure(&mut smol(n)?, n, size, requests)?;
            println!("{n:>11}  {size:>4}  {c:>11.0}  {s:>10.0}  {:>5.2}x", c / s);
            rows.push(vec![
                n.to_string(),
                format!("{size} B"),
                format!("{c:.0}"),
                format!("{s:.0}"),
                format!("{:.2}x", c / s),
            ]);
        }
    }
    let table = corelane_bench::markdown_table(
        &[
            "connections",
            "request and response",
            "corelane ns per request per side",
            "smoltcp Loopback ns",
            "corelane / smoltcp",
        ],
        &rows,
    );
    let out =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/results/reqresp.md");
    let (commit, cpu) = corelane_bench::commit_and_cpu();
    let text = format!(
        "# Request/response in memory: corelane's own cost per request\n\n\
         Measured at commit `{commit}` on one core of {cpu}, {requests} requests per row.\n\n\
         Two corelane stacks on one core over the zero-copy in-memory link (every stage of the \
         pipeline, checksums computed and verified; a sent frame's buffer becomes the peer's \
         received frame, as on a zero-copy NIC, so no copy between the rings), each \
         connection sending a request and reading the response, all connections at once; \
         smoltcp's two sockets of one interface on its `Loopback` carry the same exchange in \
         the same run. The figure is the run's time over the requests answered, halved (each \
         stack does one side's work).\n\n\
         `cargo run --release -p corelane-bench --bin reqresp`\n\n{table}"
    );
    if !quick {
        std::fs::write(&out, text).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    Ok(())
}
