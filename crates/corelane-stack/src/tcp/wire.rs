//! Segments to and from Ethernet frames. Parsing uses smoltcp's wire types (the classify stage
//! has already checked lengths and checksums). Building writes the Ethernet, IP and TCP headers
//! in place and copies the payload into the frame while summing it, so the checksum costs no
//! second pass over the data.

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, IpAddress, IpEndpoint, IpProtocol, Ipv4Packet, Ipv6Packet,
    TcpControl, TcpPacket, TcpRepr,
};

use super::ecn::EcnIn;
use super::seq::Seq;

/// TCP flag bits.
pub(crate) const FIN: u8 = 0x01;
/// SYN.
pub(crate) const SYN: u8 = 0x02;
/// RST.
pub(crate) const RST: u8 = 0x04;
/// PSH.
pub(crate) const PSH: u8 = 0x08;
/// ACK.
pub(crate) const ACK: u8 = 0x10;

const ETH: usize = 14;
/// The ECN field's ECT(0) codepoint.
const ECT0: u8 = 0b10;

/// Where a connection's frames go: both hardware addresses and both endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Path {
    /// This side's hardware address.
    pub(crate) src_mac: [u8; 6],
    /// The next hop's hardware address.
    pub(crate) dst_mac: [u8; 6],
    /// This side's address and port.
    pub(crate) local: IpEndpoint,
    /// The peer's.
    pub(crate) remote: IpEndpoint,
    /// IPv4 TTL or IPv6 hop limit.
    pub(crate) ttl: u8,
}

/// One segment to send.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Out<'a> {
    /// Sequence number.
    pub(crate) seq: Seq,
    /// Acknowledgment number (sets ACK).
    pub(crate) ack: Option<Seq>,
    /// SYN, FIN, RST, PSH, ECE, CWR bits.
    pub(crate) flags: u8,
    /// ECN-capable transport: the IP header says ECT(0) (RFC 3168).
    pub(crate) ect: bool,
    /// Window field (already scaled down).
    pub(crate) window: u16,
    /// MSS option.
    pub(crate) mss: Option<u16>,
    /// Window scale option.
    pub(crate) wscale: Option<u8>,
    /// SACK-permitted option.
    pub(crate) sack_perm: bool,
    /// Timestamps option: TSval, TSecr.
    pub(crate) ts: Option<(u32, u32)>,
    /// SACK blocks (the first `nsack`).
    pub(crate) sack: [(Seq, Seq); 3],
    /// How many SACK blocks.
    pub(crate) nsack: usize,
    /// Payload, as the two halves of a ring.
    pub(crate) payload: (&'a [u8], &'a [u8]),
}

impl Out<'_> {
    /// Payload bytes.
    pub(crate) fn payload_len(&self) -> usize {
        self.payload.0.len() + self.payload.1.len()
    }

    fn options_len(&self) -> usize {
        let mut n = 0;
        if self.mss.is_some() {
            n += 4;
        }
        if self.ts.is_some() {
            // SACK-permitted rides in the two NOPs before the timestamps.
            n += 12;
        } else if self.sack_perm {
            n += 4;
        }
        if self.wscale.is_some() {
            n += 4;
        }
        if self.nsack > 0 {
            n += 4 + 8 * self.nsack;
        }
        n
    }

    /// TCP header length.
    pub(crate) fn header_len(&self) -> usize {
        20 + self.options_len()
    }

    /// The whole frame's length on `path`.
    pub(crate) fn frame_len(&self, path: &Path) -> usize {
        ETH + ip_header_len(path) + self.header_len() + self.payload_len()
    }
}

fn ip_header_len(path: &Path) -> usize {
    match path.remote.addr {
        IpAddress::Ipv4(_) => 20,
        IpAddress::Ipv6(_) => 40,
    }
}

/// Ones' complement sum of `data` as native-order words (RFC 1071: the order of the bytes in
/// a word does not matter as long as it is the same throughout), not folded. 32-bit words into
/// a 64-bit accumulator: a multiple of 65536 is 1 modulo 65535, so folding gives the 16-bit sum.
#[inline]
fn sum(data: &[u8]) -> u64 {
    let (words, rest) = data.as_chunks::<4>();
    let mut acc = 0u64;
    for w in words {
        acc += u64::from(u32::from_ne_bytes(*w));
    }
    if !rest.is_empty() {
        let mut last = [0u8; 4];
        last[..rest.len()].copy_from_slice(rest);
        acc += u64::from(u32::from_ne_bytes(last));
    }
    acc
}

/// Copies `src` into `dst` (same length) and returns the sum of the bytes copied, in one pass
/// over 32-byte blocks (each block is summed from the registers it was copied through).
#[inline]
fn copy_sum(dst: &mut [u8], src: &[u8]) -> u64 {
    let (dc, dr) = dst.as_chunks_mut::<32>();
    let (sc, sr) = src.as_chunks::<32>();
    let mut acc = 0u64;
    for (d, s) in dc.iter_mut().zip(sc) {
        *d = *s;
        for w in s.as_chunks::<4>().0 {
            acc += u64::from(u32::from_ne_bytes(*w));
        }
    }
    dr.copy_from_slice(sr);
    acc + sum(sr)
}

/// Folds a sum to 16 bits.
#[inline]
fn fold(mut s: u64) -> u16 {
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// The Internet checksum of `data` alone (an IPv4 header, an ICMP message), ready to store
/// with `to_ne_bytes`; 0 over data whose checksum field is right.
pub(crate) fn inet_checksum(data: &[u8]) -> u16 {
    !fold(sum(data))
}

/// The Internet checksum of an upper-layer `data` (its checksum field zero) between `src` and
/// `dst` (4 or 16 bytes each) with protocol `proto`, ready to store with `to_ne_bytes`.
pub(crate) fn checksum(src: &[u8], dst: &[u8], proto: u8, data: &[u8]) -> u16 {
    let mut tail = [0u8; 8];
    tail[..4].copy_from_slice(&(data.len() as u32).to_be_bytes());
    tail[7] = proto;
    !fold(sum(src) + sum(dst) + sum(&tail) + sum(data))
}

fn pseudo_sum(path: &Path, tcp_len: usize) -> u64 {
    let mut p = [0u8; 40];
    let n = match (path.local.addr, path.remote.addr) {
        (IpAddress::Ipv4(l), IpAddress::Ipv4(r)) => {
            p[..4].copy_from_slice(&l.octets());
            p[4..8].copy_from_slice(&r.octets());
            8
        }
        (IpAddress::Ipv6(l), IpAddress::Ipv6(r)) => {
            p[..16].copy_from_slice(&l.octets());
            p[16..32].copy_from_slice(&r.octets());
            32
        }
        // Mixed families never make a path.
        _ => 0,
    };
    let mut tail = [0u8; 8];
    tail[..4].copy_from_slice(&(tcp_len as u32).to_be_bytes());
    tail[7] = 6;
    sum(&p[..n]) + sum(&tail)
}

/// Writes the frame of `seg` on `path` into `buf` (exactly [`Out::frame_len`] bytes).
pub(crate) fn write(buf: &mut [u8], path: &Path, seg: &Out<'_>) {
    buf[..6].copy_from_slice(&path.dst_mac);
    buf[6..12].copy_from_slice(&path.src_mac);
    let ip_len = ip_header_len(path);
    let tcp_len = seg.header_len() + seg.payload_len();
    match (path.local.addr, path.remote.addr) {
        (IpAddress::Ipv4(l), IpAddress::Ipv4(r)) => {
            buf[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
            let ip = &mut buf[ETH..ETH + 20];
            ip[0] = 0x45;
            ip[1] = if seg.ect { ECT0 } else { 0 };
            ip[2..4].copy_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
            // An atomic datagram (DF set): identification 0 (RFC 6864 section 4.1), so the
            // field says nothing about this stack's other traffic.
            ip[4..6].copy_from_slice(&[0, 0]);
            // Don't fragment: path MTU discovery (RFC 1191).
            ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes());
            ip[8] = path.ttl;
            ip[9] = 6;
            ip[10..12].copy_from_slice(&[0, 0]);
            ip[12..16].copy_from_slice(&l.octets());
            ip[16..20].copy_from_slice(&r.octets());
            let c = !fold(sum(ip));
            ip[10..12].copy_from_slice(&c.to_ne_bytes());
        }
        (IpAddress::Ipv6(l), IpAddress::Ipv6(r)) => {
            buf[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
            let ip = &mut buf[ETH..ETH + 40];
            let ecn = if seg.ect { u32::from(ECT0) << 20 } else { 0 };
            ip[..4].copy_from_slice(&(0x6000_0000u32 | ecn).to_be_bytes());
            ip[4..6].copy_from_slice(&(tcp_len as u16).to_be_bytes());
            ip[6] = 6;
            ip[7] = path.ttl;
            ip[8..24].copy_from_slice(&l.octets());
            ip[24..40].copy_from_slice(&r.octets());
        }
        _ => {}
    }
    let t = &mut buf[ETH + ip_len..];
    let hl = seg.header_len();
    let (hdr, body) = t.split_at_mut(hl);
    hdr[..2].copy_from_slice(&path.local.port.to_be_bytes());
    hdr[2..4].copy_from_slice(&path.remote.port.to_be_bytes());
    hdr[4..8].copy_from_slice(&seg.seq.0.to_be_bytes());
    hdr[8..12].copy_from_slice(&seg.ack.map_or(0, |a| a.0).to_be_bytes());
    hdr[12] = ((hl / 4) as u8) << 4;
    hdr[13] = seg.flags | if seg.ack.is_some() { ACK } else { 0 };
    hdr[14..16].copy_from_slice(&seg.window.to_be_bytes());
    hdr[16..20].copy_from_slice(&[0, 0, 0, 0]);
    let mut o = 20;
    if let Some(m) = seg.mss {
        hdr[o..o + 4].copy_from_slice(&[2, 4, (m >> 8) as u8, m as u8]);
        o += 4;
    }
    if let Some((val, ecr)) = seg.ts {
        if seg.sack_perm {
            hdr[o..o + 2].copy_from_slice(&[4, 2]);
        } else {
            hdr[o..o + 2].copy_from_slice(&[1, 1]);
        }
        hdr[o + 2..o + 4].copy_from_slice(&[8, 10]);
        hdr[o + 4..o + 8].copy_from_slice(&val.to_be_bytes());
        hdr[o + 8..o + 12].copy_from_slice(&ecr.to_be_bytes());
        o += 12;
    } else if seg.sack_perm {
        hdr[o..o + 4].copy_from_slice(&[1, 1, 4, 2]);
        o += 4;
    }
    if let Some(w) = seg.wscale {
        hdr[o..o + 4].copy_from_slice(&[1, 3, 3, w]);
        o += 4;
    }
    if seg.nsack > 0 {
        hdr[o..o + 4].copy_from_slice(&[1, 1, 5, (2 + 8 * seg.nsack) as u8]);
        o += 4;
        for &(l, r) in &seg.sack[..seg.nsack] {
            hdr[o..o + 4].copy_from_slice(&l.0.to_be_bytes());
            hdr[o + 4..o + 8].copy_from_slice(&r.0.to_be_bytes());
            o += 8;
        }
    }
    debug_assert_eq!(o, hl);
    let (a, b) = seg.payload;
    let (da, db) = body.split_at_mut(a.len());
    let sa = fold(copy_sum(da, a));
    let mut sb = fold(copy_sum(&mut db[..b.len()], b));
    if a.len() % 2 == 1 {
        // The second half starts in the middle of a 16-bit word.
        sb = sb.swap_bytes();
    }
    let total = pseudo_sum(path, tcp_len) + sum(hdr) + u64::from(sa) + u64::from(sb);
    let c = !fold(total);
    hdr[16..18].copy_from_slice(&c.to_ne_bytes());
}

/// A received TCP segment and where it came from.
#[derive(Debug)]
pub(crate) struct In<'a> {
    /// The hardware address it came from (the next hop back).
    pub(crate) src_mac: [u8; 6],
    /// This side's endpoint (the destination).
    pub(crate) local: IpEndpoint,
    /// The peer's.
    pub(crate) remote: IpEndpoint,
    /// The segment.
    pub(crate) seg: TcpRepr<'a>,
    /// Its IP header's ECN field and its ECE and CWR flags (which TcpRepr leaves out).
    pub(crate) ecn: EcnIn,
}

/// Parses a frame the classify stage called TCP. None for what smoltcp's parser refuses (a SYN
/// with FIN, a zero port, a bad option).
pub(crate) fn parse(frame: &[u8]) -> Option<In<'_>> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    let mut src_mac = [0u8; 6];
    src_mac.copy_from_slice(&frame[6..12]);
    let (src, dst, payload, ip_ecn) = match eth.ethertype() {
        EthernetProtocol::Ipv4 => {
            let ip = Ipv4Packet::new_checked(&frame[ETH..]).ok()?;
            if ip.next_header() != IpProtocol::Tcp {
                return None;
            }
            let (s, d) = (ip.src_addr(), ip.dst_addr());
            let hl = usize::from(ip.header_len());
            let total = usize::from(ip.total_len());
            (
                IpAddress::Ipv4(s),
                IpAddress::Ipv4(d),
                frame.get(ETH + hl..ETH + total)?,
                frame[ETH + 1] & 3,
            )
        }
        EthernetProtocol::Ipv6 => {
            let ip = Ipv6Packet::new_checked(&frame[ETH..]).ok()?;
            if ip.next_header() != IpProtocol::Tcp {
                return None;
            }
            let (s, d) = (ip.src_addr(), ip.dst_addr());
            let len = usize::from(ip.payload_len());
            (
                IpAddress::Ipv6(s),
                IpAddress::Ipv6(d),
                frame.get(ETH + 40..ETH + 40 + len)?,
                // The traffic class spans bytes 0 and 1; its low two bits are the ECN field.
                (frame[ETH + 1] >> 4) & 3,
            )
        }
        _ => return None,
    };
    let pkt = TcpPacket::new_checked(payload).ok()?;
    let seg = TcpRepr::parse(&pkt, &src, &dst, &ChecksumCapabilities::ignored()).ok()?;
    Some(In {
        src_mac,
        local: IpEndpoint::new(dst, seg.dst_port),
        remote: IpEndpoint::new(src, seg.src_port),
        seg,
        // new_checked made sure the fixed header is there.
        ecn: EcnIn::of(ip_ecn, payload[13]),
    })
}

/// True for a segment carrying SYN.
pub(crate) fn is_syn(s: &TcpRepr<'_>) -> bool {
    s.control == TcpControl::Syn
}

/// True for a segment carrying RST.
pub(crate) fn is_rst(s: &TcpRepr<'_>) -> bool {
    s.control == TcpControl::Rst
}

/// True for a segment carrying FIN.
pub(crate) fn is_fin(s: &TcpRepr<'_>) -> bool {
    s.control == TcpControl::Fin
}

/// The reset answering a segment for no connection (RFC 9293 section 3.10.7.1), or None for
/// a segment that is itself a reset.
pub(crate) fn reset_for(seg: &TcpRepr<'_>) -> Option<Out<'static>> {
    if is_rst(seg) {
        return None;
    }
    Some(match seg.ack_number {
        Some(a) => Out {
            seq: Seq(a.0 as u32),
            flags: RST,
            ..Out::default()
        },
        None => {
            let len = seg.payload.len() + usize::from(is_syn(seg)) + usize::from(is_fin(seg));
            Out {
                seq: Seq(0),
                ack: Some(Seq(seg.seq_number.0 as u32).plus(len)),
                flags: RST,
                ..Out::default()
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::{Class, classify};

    type Result = std::result::Result<(), Box<dyn std::error::Error>>;

    fn path(v6: bool) -> std::result::Result<Path, std::net::AddrParseError> {
        let (l, r) = if v6 {
            ("[fd00::1]:80", "[fd00::2]:40000")
        } else {
            ("10.0.0.1:80", "10.0.0.2:40000")
        };
        Ok(Path {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            local: l.parse::<std::net::SocketAddr>()?.into(),
            remote: r.parse::<std::net::SocketAddr>()?.into(),
            ttl: 64,
        })
    }

    #[test]
    fn built_frames_pass_the_checksum_checks_and_parse_back() -> Result {
        let data: Vec<u8> = (0..3001u32).map(|i| (i * 31 + 7) as u8).collect();
        for v6 in [false, true] {
            // Odd and even splits of the payload across the ring's halves.
            for split in [0usize, 1, 2, 999, 1000, 3001] {
                let p = path(v6)?;
                let seg = Out {
                    seq: Seq(123_456),
                    ack: Some(Seq(u32::MAX - 3)),
                    flags: PSH,
                    window: 4321,
                    ts: Some((77, 88)),
                    sack: [(Seq(10), Seq(20)), (Seq(30), Seq(40)), (Seq(0), Seq(0))],
                    nsack: 2,
                    payload: (&data[..split], &data[split..]),
                    ..Out::default()
                };
                let mut buf = vec![0u8; seg.frame_len(&p)];
                write(&mut buf, &p, &seg);
                assert!(
                    matches!(classify(&buf), Class::Tcp { syn: false, .. }),
                    "v6 {v6} split {split}: {:?}",
                    classify(&buf)
                );
                let inn = parse(&buf).ok_or("does not parse")?;
                assert_eq!(inn.local, p.remote);
                assert_eq!(inn.remote, p.local);
                assert_eq!(inn.seg.payload, &data[..]);
                assert_eq!(
                    inn.seg.timestamp.map(|t| (t.tsval, t.tsecr)),
                    Some((77, 88))
                );
                assert_eq!(inn.seg.sack_ranges[1], Some((30, 40)));
                assert_eq!(inn.seg.window_len, 4321);
            }
        }
        Ok(())
    }

    #[test]
    fn syn_options_round_trip() -> Result {
        let p = path(false)?;
        let seg = Out {
            seq: Seq(1),
            flags: SYN,
            window: 65535,
            mss: Some(1460),
            wscale: Some(7),
            sack_perm: true,
            ts: Some((1, 0)),
            ..Out::default()
        };
        let mut buf = vec![0u8; seg.frame_len(&p)];
        write(&mut buf, &p, &seg);
        assert!(matches!(classify(&buf), Class::Tcp { syn: true, .. }));
        let s = parse(&buf).ok_or("does not parse")?.seg;
        assert_eq!(
            (s.max_seg_size, s.window_scale, s.sack_permitted),
            (Some(1460), Some(7), true)
        );
        Ok(())
    }

    #[test]
    fn resets_follow_rfc_9293() -> Result {
        let p = path(false)?;
        let syn = Out {
            seq: Seq(500),
            flags: SYN,
            ..Out::default()
        };
        let mut buf = vec![0u8; syn.frame_len(&p)];
        write(&mut buf, &p, &syn);
        let inn = parse(&buf).ok_or("does not parse")?;
        let r = reset_for(&inn.seg).ok_or("no reset")?;
        assert_eq!((r.seq, r.ack, r.flags), (Seq(0), Some(Seq(501)), RST));
        Ok(())
    }

    #[test]
    fn ecn_fields_round_trip_and_a_router_mark_reads_as_ce() -> Result {
        use crate::tcp::ecn::{CWR, ECE, EcnIn};
        for v6 in [false, true] {
            let p = path(v6)?;
            let seg = Out {
                seq: Seq(1),
                ack: Some(Seq(2)),
                flags: ECE | CWR,
                ect: true,
                payload: (b"data", b""),
                ..Out::default()
            };
            let mut buf = vec![0u8; seg.frame_len(&p)];
            write(&mut buf, &p, &seg);
            assert!(matches!(classify(&buf), Class::Tcp { .. }), "v6 {v6}");
            let inn = parse(&buf).ok_or("does not parse")?;
            assert_eq!(
                inn.ecn,
                EcnIn {
                    ce: false,
                    ece: true,
                    cwr: true
                },
                "v6 {v6}"
            );
            // A router marks it CE (ECN field 0b11) and fixes the IPv4 header checksum.
            if v6 {
                buf[ETH + 1] |= 0b11 << 4;
            } else {
                buf[ETH + 1] |= 0b11;
                buf[ETH + 10..ETH + 12].copy_from_slice(&[0, 0]);
                let c = !fold(sum(&buf[ETH..ETH + 20]));
                buf[ETH + 10..ETH + 12].copy_from_slice(&c.to_ne_bytes());
            }
            assert!(matches!(classify(&buf), Class::Tcp { .. }), "v6 {v6}");
            assert!(parse(&buf).ok_or("does not parse")?.ecn.ce, "v6 {v6}");
        }
        Ok(())
    }
}
