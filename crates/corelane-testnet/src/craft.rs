//! Hand-made frames for attack scripts, and the reading of what comes back: Ethernet, IPv4,
//! TCP and ICMP with their checksums right, and a raw link to send them on and listen with.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use crate::Netns;
use crate::packet::PacketSocket;

/// TCP flag bit FIN.
pub const FIN: u8 = 0x01;
/// TCP flag bit SYN.
pub const SYN: u8 = 0x02;
/// TCP flag bit RST.
pub const RST: u8 = 0x04;
/// TCP flag bit PSH.
pub const PSH: u8 = 0x08;
/// TCP flag bit ACK.
pub const ACK: u8 = 0x10;

/// The ones'-complement sum of `data` as big-endian 16-bit words, added to `acc`.
pub(crate) fn sum16(data: &[u8], mut acc: u32) -> u32 {
    for c in data.chunks(2) {
        acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    acc
}

pub(crate) fn checksum(data: &[u8], acc: u32) -> u16 {
    let mut s = sum16(data, acc);
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// An IPv4 packet's addresses and the fields an attack sets.
#[derive(Debug, Clone, Copy)]
pub struct Ip4 {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Identification.
    pub id: u16,
    /// Time to live.
    pub ttl: u8,
}

impl Ip4 {
    /// From `src` to `dst`, ID 0, TTL 64.
    pub fn new(src: Ipv4Addr, dst: Ipv4Addr) -> Self {
        Ip4 {
            src,
            dst,
            id: 0,
            ttl: 64,
        }
    }
}

/// A TCP segment.
#[derive(Debug, Clone, Default)]
pub struct Tcp {
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// Flag bits ([`SYN`], [`ACK`], ...).
    pub flags: u8,
    /// Window field.
    pub window: u16,
    /// Data.
    pub payload: Vec<u8>,
}

/// An IPv4 header for `proto` and `len` bytes after it, checksummed; `frag` is the flags and
/// offset word.
pub(crate) fn ipv4_header(ip: &Ip4, proto: u8, len: usize, frag: u16) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&((20 + len) as u16).to_be_bytes());
    h[4..6].copy_from_slice(&ip.id.to_be_bytes());
    h[6..8].copy_from_slice(&frag.to_be_bytes());
    h[8] = ip.ttl;
    h[9] = proto;
    h[12..16].copy_from_slice(&ip.src.octets());
    h[16..20].copy_from_slice(&ip.dst.octets());
    let c = checksum(&h, 0);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h
}

fn ethernet(dst: [u8; 6], src: [u8; 6], ethertype: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(1514);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// The TCP segment `t`, checksummed with the pseudo-header `pseudo`.
fn tcp_segment(t: &Tcp, pseudo: &[u8]) -> Vec<u8> {
    let mut seg = vec![0u8; 20];
    seg[0..2].copy_from_slice(&t.sport.to_be_bytes());
    seg[2..4].copy_from_slice(&t.dport.to_be_bytes());
    seg[4..8].copy_from_slice(&t.seq.to_be_bytes());
    seg[8..12].copy_from_slice(&t.ack.to_be_bytes());
    seg[12] = 5 << 4;
    seg[13] = t.flags;
    seg[14..16].copy_from_slice(&t.window.to_be_bytes());
    seg.extend_from_slice(&t.payload);
    let mut p = pseudo.to_vec();
    p.extend_from_slice(&(seg.len() as u32).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 6]);
    let c = checksum(&seg, sum16(&p, 0));
    seg[16..18].copy_from_slice(&c.to_be_bytes());
    seg
}

/// The TCP segment `t` in IPv4 `ip` in an Ethernet frame from `src` to `dst`.
pub fn tcp4(dst: [u8; 6], src: [u8; 6], ip: &Ip4, t: &Tcp) -> Vec<u8> {
    tcp4_with_ip_options(dst, src, ip, t, &[])
}

/// [`tcp4`] with IP options `opts` in the IPv4 header (up to 40 bytes, padded with zeros to
/// a multiple of 4).
pub fn tcp4_with_ip_options(dst: [u8; 6], src: [u8; 6], ip: &Ip4, t: &Tcp, opts: &[u8]) -> Vec<u8> {
    let mut pseudo = Vec::with_capacity(8);
    pseudo.extend_from_slice(&ip.src.octets());
    pseudo.extend_from_slice(&ip.dst.octets());
    let seg = tcp_segment(t, &pseudo);
    let mut f = ethernet(dst, src, 0x0800);
    if opts.is_empty() {
        f.extend_from_slice(&ipv4_header(ip, 6, seg.len(), 0x4000));
    } else {
        let mut o = opts[..opts.len().min(40)].to_vec();
        o.resize(o.len().next_multiple_of(4), 0);
        let mut h = ipv4_header(ip, 6, seg.len() + o.len(), 0x4000).to_vec();
        h[0] = 0x40 | ((20 + o.len()) / 4) as u8;
        h[10..12].fill(0);
        h.extend_from_slice(&o);
        let c = checksum(&h, 0);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&h);
    }
    f.extend_from_slice(&seg);
    f
}

/// The TCP segment `t` in IPv6 from `from` to `to` (hop limit 64) in an Ethernet frame from
/// `src` to `dst`.
pub fn tcp6(dst: [u8; 6], src: [u8; 6], from: Ipv6Addr, to: Ipv6Addr, t: &Tcp) -> Vec<u8> {
    let mut pseudo = Vec::with_capacity(32);
    pseudo.extend_from_slice(&from.octets());
    pseudo.extend_from_slice(&to.octets());
    let seg = tcp_segment(t, &pseudo);
    let mut f = ethernet(dst, src, 0x86dd);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(seg.len() as u16).to_be_bytes());
    f.extend_from_slice(&[6, 64]);
    f.extend_from_slice(&from.octets());
    f.extend_from_slice(&to.octets());
    f.extend_from_slice(&seg);
    f
}

/// ICMP `kind`/`code` (with the 4 bytes after the checksum, `rest`) quoting `quote`, in IPv4
/// `ip`.
pub fn icmp4(
    dst: [u8; 6],
    src: [u8; 6],
    ip: &Ip4,
    kind: u8,
    code: u8,
    rest: [u8; 4],
    quote: &[u8],
) -> Vec<u8> {
    let mut m = vec![kind, code, 0, 0];
    m.extend_from_slice(&rest);
    m.extend_from_slice(quote);
    let c = checksum(&m, 0);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    let mut f = ethernet(dst, src, 0x0800);
    f.extend_from_slice(&ipv4_header(ip, 1, m.len(), 0));
    f.extend_from_slice(&m);
    f
}

/// The IPv4 header and first 8 bytes of TCP a router would quote for segment `t` of `ip`.
pub fn quote_tcp4(ip: &Ip4, t: &Tcp, len: usize) -> Vec<u8> {
    let mut q = ipv4_header(ip, 6, 20 + len, 0x4000).to_vec();
    q.extend_from_slice(&t.sport.to_be_bytes());
    q.extend_from_slice(&t.dport.to_be_bytes());
    q.extend_from_slice(&t.seq.to_be_bytes());
    q
}

/// An ICMP echo request of `payload` bytes, cut into fragments of at most `mtu` bytes of IP.
pub fn echo4_fragments(
    dst: [u8; 6],
    src: [u8; 6],
    ip: &Ip4,
    ident: u16,
    seq: u16,
    payload: usize,
    mtu: usize,
) -> Vec<Vec<u8>> {
    let mut m = vec![8, 0, 0, 0];
    m.extend_from_slice(&ident.to_be_bytes());
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend((0..payload).map(|i| i as u8));
    let c = checksum(&m, 0);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    let step = (mtu - 20) / 8 * 8;
    let mut out = Vec::new();
    let mut at = 0;
    while at < m.len() {
        let end = (at + step).min(m.len());
        let more = if end < m.len() { 0x2000 } else { 0 };
        let mut f = ethernet(dst, src, 0x0800);
        f.extend_from_slice(&ipv4_header(ip, 1, end - at, more | (at / 8) as u16));
        f.extend_from_slice(&m[at..end]);
        out.push(f);
        at = end;
    }
    out
}

/// What a neighbour advertisement says.
#[derive(Debug, Clone, Copy)]
pub struct Advert {
    /// The address advertised.
    pub target: Ipv6Addr,
    /// Where it is (the target link-layer address option).
    pub lladdr: [u8; 6],
    /// The R, S and O bits, as the top bits of the first word (O alone: 0x2000_0000).
    pub flags: u32,
}

/// Neighbour advertisement `na` (RFC 4861 section 4.4) from `src` to `dst` with hop limit
/// `hops`.
pub fn na6(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: Ipv6Addr,
    dst: Ipv6Addr,
    hops: u8,
    na: &Advert,
) -> Vec<u8> {
    let mut m = vec![136, 0, 0, 0];
    m.extend_from_slice(&na.flags.to_be_bytes());
    m.extend_from_slice(&na.target.octets());
    // Target link-layer address option: type 2, length 1 (8 bytes).
    m.extend_from_slice(&[2, 1]);
    m.extend_from_slice(&na.lladdr);
    let mut pseudo = Vec::with_capacity(40);
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&(m.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 58]);
    let c = checksum(&m, sum16(&pseudo, 0));
    m[2..4].copy_from_slice(&c.to_be_bytes());
    let mut f = ethernet(dst_mac, src_mac, 0x86dd);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(m.len() as u16).to_be_bytes());
    f.extend_from_slice(&[58, hops]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&m);
    f
}

/// A TCP segment read from a frame (IPv4, no VLAN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// Flag bits.
    pub flags: u8,
    /// Window field.
    pub window: u16,
    /// Bytes of data.
    pub len: usize,
}

impl Seen {
    /// The sequence number after this segment.
    pub fn end(&self) -> u32 {
        self.seq
            .wrapping_add(self.len as u32)
            .wrapping_add(u32::from(self.flags & (SYN | FIN) != 0))
    }
}

/// The TCP segment in an IPv4 frame, if it is one.
pub fn parse_tcp4(f: &[u8]) -> Option<Seen> {
    if f.len() < 54 || f[12..14] != [0x08, 0x00] || f[14] >> 4 != 4 || f[23] != 6 {
        return None;
    }
    let ihl = usize::from(f[14] & 0x0f) * 4;
    let tot = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let t = 14 + ihl;
    if f.len() < t + 20 || tot < ihl + 20 {
        return None;
    }
    let doff = usize::from(f[t + 12] >> 4) * 4;
    let be32 = |i: usize| u32::from_be_bytes([f[i], f[i + 1], f[i + 2], f[i + 3]]);
    Some(Seen {
        src: Ipv4Addr::new(f[26], f[27], f[28], f[29]),
        dst: Ipv4Addr::new(f[30], f[31], f[32], f[33]),
        sport: u16::from_be_bytes([f[t], f[t + 1]]),
        dport: u16::from_be_bytes([f[t + 2], f[t + 3]]),
        seq: be32(t + 4),
        ack: be32(t + 8),
        flags: f[t + 13],
        window: u16::from_be_bytes([f[t + 14], f[t + 15]]),
        len: tot.saturating_sub(ihl + doff),
    })
}

/// An IPv4 frame's identification field and source, if it is IPv4.
pub fn ipv4_id(f: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr, u16, u8)> {
    if f.len() < 34 || f[12..14] != [0x08, 0x00] {
        return None;
    }
    Some((
        Ipv4Addr::new(f[26], f[27], f[28], f[29]),
        Ipv4Addr::new(f[30], f[31], f[32], f[33]),
        u16::from_be_bytes([f[18], f[19]]),
        f[23],
    ))
}

/// A raw link on one interface: whole frames out, and every frame arriving there (not those
/// this host sends) in.
#[derive(Debug)]
pub struct RawLink {
    sock: PacketSocket,
}

impl RawLink {
    /// Opens it on `ifname` of namespace `ns`.
    pub fn open(ns: &Netns, ifname: &str) -> crate::Result<RawLink> {
        let name = ifname.to_string();
        let sock = ns
            .run(move || PacketSocket::open(&name, true))?
            .map_err(|source| crate::Error::Io {
                what: format!("packet socket on {ifname}"),
                source,
            })?;
        Ok(RawLink { sock })
    }

    /// Sends one frame.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        if self.sock.send(frame)? {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the link's queue is full",
            ))
        }
    }

    /// Every frame that arrives within `time`.
    pub fn listen(&self, time: Duration) -> io::Result<Vec<Vec<u8>>> {
        let end = Instant::now() + time;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        loop {
            while let Some(n) = self.sock.recv(&mut buf)? {
                out.push(buf[..n].to_vec());
            }
            let now = Instant::now();
            if now >= end {
                return Ok(out);
            }
            self.sock.wait(end - now);
        }
    }
}
