//! Fuzz targets for everything that reads bytes from the wire, and a seeded, structure-aware
//! mutator that feeds them. Stable Rust, no coverage guidance: the depth comes from the
//! seeds (real frames recorded from a session between two stacks, so a replayed handshake
//! really opens a connection) and from fixing the checksums of most mutated frames, so they
//! reach the parsers behind the checksum check.
//!
//! Targets: [`Target::Parse`] (classification and the TCP wire parser on one frame),
//! [`Target::Reassemble`] (a sequence of frames into a [`Reassembler`]
//! with small limits) and [`Target::Node`] (a sequence of timed frames into a whole node that
//! listens on TCP port 7 and UDP port 9, owns an IPv4 and an IPv6 address, echoes what it
//! reads and answers ARP, NDP, ICMP; frames it builds longer than the MTU panic). The test
//! suite replays the committed corpus (`crates/corelane-stack/fuzz/corpus/TARGET/`) and a few
//! thousand mutations; `cargo run --release -p corelane-fuzz` runs them for as
//! long as asked and saves what panics.
//!
//! ```
//! use corelane_stack::fuzzing::{Mutator, Target};
//! let seeds = Target::Node.seeds();
//! let mut m = Mutator::new(1);
//! for _ in 0..10 {
//!     let input = m.mutate(Target::Node, &seeds[0], &seeds[seeds.len() - 1]);
//!     Target::Node.run(&input); // panics on a bug
//! }
//! ```

use std::collections::VecDeque;

use corelane_frame::{MemLink, MemPort};
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{IpAddress, IpCidr, Ipv4Address, Ipv6Address};

use crate::frag::{FragLimits, Reassembler};
use crate::{Node, Pair, StackConfig};

#[cfg(test)]
mod tests;

/// What a fuzz input is fed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// One frame: `classify` and the TCP wire parser.
    Parse,
    /// Frames, each `[len: u16 BE][bytes]`, into a reassembler with small limits; a whole
    /// datagram it returns is parsed again.
    Reassemble,
    /// Timed frames, each `[microseconds since the last: u32 BE][len: u16 BE][bytes]`, into a
    /// node with a listener, a UDP socket and an echoing application.
    Node,
}

impl Target {
    /// Every target.
    pub const ALL: [Target; 3] = [Target::Parse, Target::Reassemble, Target::Node];

    /// The target's name (its corpus directory).
    pub fn name(self) -> &'static str {
        match self {
            Target::Parse => "parse",
            Target::Reassemble => "reassemble",
            Target::Node => "node",
        }
    }

    /// The target named `name`.
    pub fn from_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Feeds `input` to the target. Returns normally whatever the input; a panic is a bug.
    pub fn run(self, input: &[u8]) {
        match self {
            Target::Parse => parse_one(input),
            Target::Reassemble => reassemble(input),
            Target::Node => {
                node(input);
            }
        }
    }

    /// Seed inputs made now from a recorded session (the committed corpus adds what earlier
    /// runs found).
    pub fn seeds(self) -> Vec<Vec<u8>> {
        let session = record();
        match self {
            Target::Parse => session.into_iter().map(|(_, f)| f).collect(),
            Target::Reassemble => {
                let mut out = Vec::new();
                let pairs: [(IpAddress, IpAddress); 2] =
                    [(V4_B.into(), V4_A.into()), (V6_B.into(), V6_A.into())];
                for (src, dst) in pairs {
                    let data: Vec<u8> = (0..5000u32).map(|i| (i * 13) as u8).collect();
                    let frames = crate::frag::fragment(MAC_A, MAC_B, src, dst, 17, 77, &data, 1280);
                    out.push(frames.iter().flat_map(|f| lengthed(f)).collect());
                }
                out
            }
            Target::Node => {
                let whole = timed(&session);
                // The session, and each of its first frames alone (shallow but quick seeds).
                let mut out = vec![whole];
                out.extend(
                    session
                        .iter()
                        .take(8)
                        .map(|s| timed(std::slice::from_ref(s))),
                );
                out
            }
        }
    }
}

const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 1];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 2];
const V4_A: Ipv4Address = Ipv4Address::new(10, 9, 0, 1);
const V4_B: Ipv4Address = Ipv4Address::new(10, 9, 0, 2);
const V6_A: Ipv6Address = Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 1);
const V6_B: Ipv6Address = Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 2);
const SEED: u64 = 0xf022;

fn cfg() -> StackConfig {
    StackConfig {
        seed: Some(SEED),
        ..StackConfig::default()
    }
}

fn node_at(io: MemPort, mac: [u8; 6], last: u16) -> Node<MemPort> {
    let v4 = Ipv4Address::new(10, 9, 0, last as u8);
    let v6 = Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, last);
    let addrs = [
        IpCidr::new(IpAddress::Ipv4(v4), 24),
        IpCidr::new(IpAddress::Ipv6(v6), 64),
    ];
    let cfg = StackConfig {
        seed: Some(SEED.wrapping_add(u64::from(last))),
        ..cfg()
    };
    let mut n = Node::new(io, mac, &addrs, 1500, cfg);
    n.dev_mut().set_strict(true);
    n
}

fn lengthed(f: &[u8]) -> Vec<u8> {
    let mut v = (f.len().min(0xffff) as u16).to_be_bytes().to_vec();
    v.extend_from_slice(&f[..f.len().min(0xffff)]);
    v
}

fn timed(frames: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let mut v = Vec::new();
    for (dt, f) in frames {
        v.extend_from_slice(&dt.to_be_bytes());
        v.extend_from_slice(&lengthed(f));
    }
    v
}

/// Splits `[len: u16][bytes]...` (the last frame may be short).
fn split_lengthed(mut input: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while input.len() >= 2 {
        let n = usize::from(u16::from_be_bytes([input[0], input[1]]));
        let rest = &input[2..];
        let n = n.min(rest.len());
        out.push(&rest[..n]);
        input = &rest[n..];
    }
    out
}

/// Splits `[dt: u32][len: u16][bytes]...`.
fn split_timed(mut input: &[u8]) -> Vec<(u32, &[u8])> {
    let mut out = Vec::new();
    while input.len() >= 6 {
        let dt = u32::from_be_bytes([input[0], input[1], input[2], input[3]]);
        let n = usize::from(u16::from_be_bytes([input[4], input[5]]));
        let rest = &input[6..];
        let n = n.min(rest.len());
        out.push((dt, &rest[..n]));
        input = &rest[n..];
    }
    out
}

fn parse_one(frame: &[u8]) {
    let _ = crate::classify::classify(frame);
    let _ = crate::tcp::wire::parse(frame);
    let _ = Reassembler::is_fragment(frame);
}

fn reassemble(input: &[u8]) {
    let limits = FragLimits {
        max_bytes: 64 * 1024,
        max_datagrams: 8,
        max_pieces: 16,
        timeout: std::time::Duration::from_millis(50),
    };
    let mut r = Reassembler::keyed(limits, crate::keyed::KeyedState::new((SEED, 1)));
    for (k, f) in split_lengthed(input).into_iter().enumerate() {
        if let Some(whole) = r.push(f, Instant::from_millis(k as i64)) {
            parse_one(&whole);
        }
        assert!(r.in_progress() <= limits.max_datagrams);
        assert!(r.bytes_held() <= limits.max_bytes + 2048);
    }
}

/// The node under test: `a` of a pair whose `b` side is driven by the input. Returns the
/// connections it accepted and the bytes it echoed.
fn node(input: &[u8]) -> (usize, usize) {
    let mut seen = (0, 0);
    let (a_io, mut wire) = MemLink::default().pair();
    let mut a = node_at(a_io, MAC_A, 1);
    a.dev_mut().io_mut().set_capture(true);
    wire.set_capture(true);
    let _ = a.stack.listen_tcp(7, Some(16));
    let udp = a.stack.bind_udp(9).ok().map(|(id, _)| id);
    let mut now = Instant::ZERO;
    let mut conns = Vec::new();
    let mut buf = vec![0u8; 4096];
    let mut sent = VecDeque::new();
    for (dt, f) in split_timed(input) {
        // At most a minute between frames: timers fire, the run stays short.
        now += Duration::from_micros(u64::from(dt % 60_000_000));
        let _ = wire.inject(f);
        let _ = a.poll(now);
        echo(&mut a, udp, &mut conns, &mut buf, &mut seen);
        let _ = a.poll(now);
        a.dev_mut().io_mut().take_sent(&mut sent);
        sent.clear();
    }
    // The timers run out: retransmissions, keepalives, TIME-WAIT, everything given back.
    for _ in 0..64 {
        let Some(next) = a.stack.next_deadline() else {
            break;
        };
        now = now.max(next);
        let _ = a.poll(now);
        echo(&mut a, udp, &mut conns, &mut buf, &mut seen);
        a.dev_mut().io_mut().take_sent(&mut sent);
        sent.clear();
    }
    seen
}

/// The application of the node under test: accepts, echoes what it reads (TCP and UDP), and
/// closes a connection whose peer finished.
fn echo(
    a: &mut Node<MemPort>,
    udp: Option<crate::FlowId>,
    conns: &mut Vec<crate::FlowId>,
    buf: &mut [u8],
    seen: &mut (usize, usize),
) {
    while let Some(c) = a.stack.accept(7) {
        conns.push(c);
        seen.0 += 1;
    }
    conns.retain(|&c| match a.stack.tcp_read(c, buf, None) {
        std::task::Poll::Ready(Ok(0)) | std::task::Poll::Ready(Err(_)) => {
            a.stack.release(c);
            false
        }
        std::task::Poll::Ready(Ok(n)) => {
            seen.1 += n;
            let _ = a.stack.tcp_write(c, &buf[..n], None);
            true
        }
        std::task::Poll::Pending => true,
    });
    if let Some(u) = udp
        && let std::task::Poll::Ready(Ok((n, from))) = a.stack.udp_recv_from(u, buf, None)
    {
        let _ = a.stack.udp_send_to(u, &buf[..n.min(buf.len())], from, None);
    }
}

/// A session between two nodes, as `a` received it: (microseconds since the previous frame,
/// the frame) for every frame `b` sent. TCP over IPv4 and IPv6 (handshake, data both ways
/// with one segment lost so SACK blocks flow, FIN), a UDP datagram large enough to be
/// fragmented, ARP and NDP.
fn record() -> Vec<(u32, Vec<u8>)> {
    let (x, y) = MemLink::default().pair();
    let mut p = Pair::from_nodes(node_at(x, MAC_A, 1), node_at(y, MAC_B, 2));
    p.b.dev_mut().io_mut().set_capture(true);
    let mut out = Vec::new();
    let mut last = Instant::ZERO;
    let mut pass = |p: &mut Pair<MemPort>, out: &mut Vec<(u32, Vec<u8>)>, lose: Option<usize>| {
        let mut sent = VecDeque::new();
        p.b.dev_mut().io_mut().take_sent(&mut sent);
        for (k, f) in sent.into_iter().enumerate() {
            if Some(k) == lose {
                continue;
            }
            let dt = (p.now() - last).total_micros().min(u64::from(u32::MAX)) as u32;
            last = p.now();
            let _ = p.b.dev_mut().io_mut().inject(&f);
            out.push((dt, f));
        }
    };
    // `a` runs what the node under test runs (the same listener, socket and echo), so a
    // replay of `b`'s frames meets the same sequence numbers.
    let _ = p.a.stack.listen_tcp(7, Some(16));
    let udp_a = p.a.stack.bind_udp(9).ok().map(|(id, _)| id);
    let (mut conns, mut seen) = (Vec::new(), (0, 0));
    let udp_b = p.b.stack.bind_udp(4000).ok().map(|(id, _)| id);
    let mut clients = Vec::new();
    for remote in ["10.9.0.1:7", "[fd00::1]:7"] {
        if let Ok(r) = remote.parse()
            && let Ok((c, _)) = p.b.stack.connect_tcp(r)
        {
            clients.push(c);
        }
    }
    if let (Some(u), Ok(to)) = (udp_b, "10.9.0.1:9".parse()) {
        let _ = p.b.stack.udp_send_to(u, &[9u8; 3000], to, None);
    }
    let data = vec![5u8; 20_000];
    let mut buf = vec![0u8; 65536];
    let mut round = 0;
    let mut written = vec![0usize; clients.len()];
    let _ = p.drive(Duration::from_secs(3), |p| {
        round += 1;
        pass(p, &mut out, (round == 40).then_some(1));
        echo(&mut p.a, udp_a, &mut conns, &mut buf, &mut seen);
        for (k, &c) in clients.iter().enumerate() {
            if written[k] < data.len()
                && let std::task::Poll::Ready(Ok(n)) =
                    p.b.stack.tcp_write(c, &data[written[k]..], None)
            {
                written[k] += n;
            }
            while let std::task::Poll::Ready(Ok(1..)) = p.b.stack.tcp_read(c, &mut buf, None) {}
            if round == 300 {
                let _ = p.b.stack.tcp_shutdown(c);
            }
        }
        round > 400 && out.len() > 40
    });
    out
}

/// A seeded mutator of fuzz inputs (xorshift; the same seed gives the same inputs).
#[derive(Debug)]
pub struct Mutator {
    rng: u64,
}

impl Mutator {
    /// A mutator whose choices follow `seed`.
    pub fn new(seed: u64) -> Self {
        Mutator {
            rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
        }
    }

    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// A new input for `target` from `base`, with pieces of `other` spliced in sometimes.
    pub fn mutate(&mut self, target: Target, base: &[u8], other: &[u8]) -> Vec<u8> {
        match target {
            Target::Parse => {
                let mut f = base.to_vec();
                let o = other.to_vec();
                for _ in 0..=self.below(3) {
                    self.mutate_frame(&mut f, &o);
                }
                f
            }
            Target::Reassemble => {
                let mut frames: Vec<Vec<u8>> = split_lengthed(base)
                    .into_iter()
                    .map(<[u8]>::to_vec)
                    .collect();
                let others: Vec<Vec<u8>> = split_lengthed(other)
                    .into_iter()
                    .map(<[u8]>::to_vec)
                    .collect();
                self.mutate_sequence(&mut frames, &others);
                frames.iter().flat_map(|f| lengthed(f)).collect()
            }
            Target::Node => {
                let mut frames: Vec<(u32, Vec<u8>)> = split_timed(base)
                    .into_iter()
                    .map(|(t, f)| (t, f.to_vec()))
                    .collect();
                let others: Vec<Vec<u8>> = split_timed(other)
                    .into_iter()
                    .map(|(_, f)| f.to_vec())
                    .collect();
                let mut just: Vec<Vec<u8>> = frames.iter().map(|(_, f)| f.clone()).collect();
                let times: Vec<u32> = frames.iter().map(|(t, _)| *t).collect();
                self.mutate_sequence(&mut just, &others);
                frames = just
                    .into_iter()
                    .enumerate()
                    .map(|(k, f)| {
                        let t = times.get(k).copied().unwrap_or(1000);
                        let t = match self.below(16) {
                            0 => self.next() as u32 % 2_000_000,
                            1 => 0,
                            _ => t,
                        };
                        (t, f)
                    })
                    .collect();
                timed(&frames)
            }
        }
    }

    fn mutate_sequence(&mut self, frames: &mut Vec<Vec<u8>>, others: &[Vec<u8>]) {
        if frames.is_empty() {
            frames.push(vec![0u8; 60]);
        }
        for _ in 0..=self.below(4) {
            let k = self.below(frames.len());
            match self.below(8) {
                0 if frames.len() > 1 => {
                    frames.remove(k);
                }
                1 if frames.len() < 256 => {
                    let f = frames[k].clone();
                    frames.insert(k, f);
                }
                2 => {
                    let j = self.below(frames.len());
                    frames.swap(k, j);
                }
                3 if !others.is_empty() && frames.len() < 256 => {
                    let o = others[self.below(others.len())].clone();
                    frames.insert(k, o);
                }
                _ => {
                    let o = others.get(self.below(others.len().max(1))).cloned();
                    self.mutate_frame(&mut frames[k], &o.unwrap_or_default());
                }
            }
        }
    }

    /// One change to a frame, then (most of the time) its checksums made right again.
    fn mutate_frame(&mut self, f: &mut Vec<u8>, other: &[u8]) {
        const INTERESTING: [u8; 10] = [0, 1, 0x7f, 0x80, 0xff, 0x40, 0x20, 5, 6, 44];
        if f.is_empty() {
            f.push(0);
        }
        let n = f.len();
        match self.below(9) {
            0 => {
                let i = self.below(n);
                f[i] ^= 1 << self.below(8);
            }
            1 => {
                let i = self.below(n);
                f[i] = INTERESTING[self.below(INTERESTING.len())];
            }
            2 => {
                let i = self.below(n);
                f[i] = self.next() as u8;
            }
            3 => f.truncate(self.below(n + 1)),
            4 if n < 2000 => {
                let extra = self.below(64);
                for _ in 0..extra {
                    f.push(self.next() as u8);
                }
            }
            5 if !other.is_empty() => {
                // The same bytes from another frame (a field of another valid header).
                let i = self.below(n.min(other.len()));
                let len = self.below(16).min(n - i).min(other.len() - i);
                f[i..i + len].copy_from_slice(&other[i..i + len]);
            }
            6 => {
                // A 16-bit field in the headers set to an edge value.
                let i = self.below(n.min(80)) & !1;
                if i + 2 <= n {
                    let v: u16 = match self.below(5) {
                        0 => 0,
                        1 => 0xffff,
                        2 => n as u16,
                        3 => (n as u16).wrapping_sub(14 + self.below(60) as u16),
                        _ => 0x8000,
                    };
                    f[i..i + 2].copy_from_slice(&v.to_be_bytes());
                }
            }
            7 => {
                // Bytes in the options region of a TCP header.
                let i = 54 + self.below(40);
                if i < n {
                    f[i] = INTERESTING[self.below(INTERESTING.len())];
                }
            }
            _ => {
                let i = self.below(n);
                let j = self.below(n);
                let len = self.below(32).min(n - i.max(j));
                f.copy_within(i..i + len, j);
            }
        }
        if self.below(8) != 0 {
            fix_checksums(f);
        }
    }
}

/// Sets the IPv4 header checksum and the TCP, UDP or ICMP(v6) checksum of an Ethernet frame
/// to the right values for its bytes, as far as its headers can be read (nothing otherwise).
pub fn fix_checksums(f: &mut [u8]) {
    let (ip, proto, src, dst, payload_at, len) = match f.get(12..14) {
        Some([0x08, 0x00]) => {
            let Some(&b) = f.get(14) else { return };
            let ihl = usize::from(b & 0x0f) * 4;
            if ihl < 20 || f.len() < 14 + ihl {
                return;
            }
            f[24] = 0;
            f[25] = 0;
            let c = crate::tcp::wire::inet_checksum(&f[14..14 + ihl]);
            f[24..26].copy_from_slice(&c.to_ne_bytes());
            let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
            let flags = u16::from_be_bytes([f[20], f[21]]);
            if flags & 0x3fff != 0 {
                return; // a fragment: the checksum covers the whole datagram
            }
            let len = total.saturating_sub(ihl).min(f.len() - 14 - ihl);
            (4, f[23], 26..30, 30..34, 14 + ihl, len)
        }
        Some([0x86, 0xdd]) if f.len() >= 54 => {
            let plen = usize::from(u16::from_be_bytes([f[18], f[19]]));
            (6, f[20], 22..38, 38..54, 54, plen.min(f.len() - 54))
        }
        _ => return,
    };
    let at = match proto {
        6 => 16,
        17 => 6,
        1 if ip == 4 => 2,
        58 if ip == 6 => 2,
        _ => return,
    };
    if len < at + 2 {
        return;
    }
    f[payload_at + at] = 0;
    f[payload_at + at + 1] = 0;
    let c = if proto == 1 {
        crate::tcp::wire::inet_checksum(&f[payload_at..payload_at + len])
    } else {
        let (s, d) = (f[src].to_vec(), f[dst].to_vec());
        crate::tcp::wire::checksum(&s, &d, proto, &f[payload_at..payload_at + len])
    };
    f[payload_at + at..payload_at + at + 2].copy_from_slice(&c.to_ne_bytes());
}
