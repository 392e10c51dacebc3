//! Segments to and from Ethernet frames. Parsing uses smoltcp's wire types (the classify stage
//! has checked lengths and checksums). Building writes the headers in place and copies the
//! payload while summing it (no second pass for the checksum), or leaves the sum to the device.

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, IpAddress, IpEndpoint, IpProtocol, Ipv4Packet, Ipv6Packet,
    TcpControl, TcpPacket, TcpRepr,
};

use super::ecn::EcnIn;
use super::seq::Seq;

/// TCP flag bits: FIN, SYN, RST, PSH, ACK.
pub(crate) const FIN: u8 = 0x01;
pub(crate) const SYN: u8 = 0x02;
pub(crate) const RST: u8 = 0x04;
pub(crate) const PSH: u8 = 0x08;
pub(crate) const ACK: u8 = 0x10;
/// The URG flag: the urgent pointer field is significant.
pub(crate) const URG: u8 = 0x20;

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
    /// IPv4 type of service or IPv6 traffic class; its two ECN bits are ignored (the
    /// segment's `ect` sets them).
    pub(crate) tos: u8,
}

/// One segment to send.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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

/// Writes the frame of `seg` on `path` into `buf` (exactly [`Out::frame_len`] bytes).
/// `partial`: the device finishes the checksum, the field holds the pseudo-header's sum.
pub(crate) fn write(buf: &mut [u8], path: &Path, seg: &Out<'_>, partial: bool) {
    buf[..6].copy_from_slice(&path.dst_mac);
    buf[6..12].copy_from_slice(&path.src_mac);
    let ip_len = ip_header_len(path);
    let hl = seg.header_len();
    let tcp_len = hl + seg.payload_len();
    match (path.local.addr, path.remote.addr) {
        (IpAddress::Ipv4(l), IpAddress::Ipv4(r)) => {
            buf[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
            let tos = u32::from(path.tos & !3) | if seg.ect { u32::from(ECT0) } else { 0 };
            let mut ip = Words::new(&mut buf[ETH..ETH + 20]);
            ip.be(0x4500_0000 | tos << 16 | (20 + tcp_len) as u32);
            // An atomic datagram (DF set): identification 0 (RFC 6864 section 4.1), so the
            // field says nothing about this stack's other traffic; DF for path MTU discovery
            // (RFC 1191).
            ip.be(0x0000_4000);
            // TTL, protocol, and the checksum (zero while summing).
            ip.be(u32::from(path.ttl) << 24 | 6 << 16);
            ip.put(l.octets());
            ip.put(r.octets());
            let c = !fold(ip.sum);
            buf[ETH + 10..ETH + 12].copy_from_slice(&c.to_ne_bytes());
        }
        (IpAddress::Ipv6(l), IpAddress::Ipv6(r)) => {
            buf[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
            let ip = &mut buf[ETH..ETH + 40];
            let ecn = if seg.ect { u32::from(ECT0) << 20 } else { 0 };
            let class = u32::from(path.tos & !3) << 20;
            ip[..4].copy_from_slice(&(0x6000_0000u32 | class | ecn).to_be_bytes());
            ip[4..8].copy_from_slice(
                &((tcp_len as u32) << 16 | 6 << 8 | u32::from(path.ttl)).to_be_bytes(),
            );
            ip[8..24].copy_from_slice(&l.octets());
            ip[24..40].copy_from_slice(&r.octets());
        }
        _ => {}
    }
    let t = &mut buf[ETH + ip_len..];
    let (hdr, body) = t.split_at_mut(hl);
    let mut h = Words::new(hdr);
    h.be(u32::from(path.local.port) << 16 | u32::from(path.remote.port));
    h.be(seg.seq.0);
    h.be(seg.ack.map_or(0, |a| a.0));
    let flags = seg.flags | if seg.ack.is_some() { ACK } else { 0 };
    h.be(((hl / 4) as u32) << 28 | u32::from(flags) << 16 | u32::from(seg.window));
    // Checksum (zero while summing) and urgent pointer.
    h.be(0);
    if let Some(m) = seg.mss {
        h.be(0x0204_0000 | u32::from(m));
    }
    if let Some((val, ecr)) = seg.ts {
        // SACK-permitted rides in the two NOPs before the timestamps.
        h.be(if seg.sack_perm {
            0x0402_080a
        } else {
            0x0101_080a
        });
        h.be(val);
        h.be(ecr);
    } else if seg.sack_perm {
        h.be(0x0101_0402);
    }
    if let Some(w) = seg.wscale {
        h.be(0x0103_0300 | u32::from(w));
    }
    if seg.nsack > 0 {
        h.be(0x0101_0500 | (2 + 8 * seg.nsack) as u32);
        for &(l, r) in &seg.sack[..seg.nsack] {
            h.be(l.0);
            h.be(r.0);
        }
    }
    debug_assert_eq!(h.at, hl);
    let hsum = h.sum;
    let (a, b) = seg.payload;
    let (da, db) = body.split_at_mut(a.len());
    let c = if partial {
        da.copy_from_slice(a);
        db[..b.len()].copy_from_slice(b);
        fold(pseudo_sum(path, tcp_len))
    } else {
        let sa = fold(copy_sum(da, a));
        let mut sb = fold(copy_sum(&mut db[..b.len()], b));
        if a.len() % 2 == 1 {
            // The second half starts in the middle of a 16-bit word.
            sb = sb.swap_bytes();
        }
        !fold(pseudo_sum(path, tcp_len) + hsum + u64::from(sa) + u64::from(sb))
    };
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
    /// The urgent pointer, when URG is set (TcpRepr leaves it out too): the offset from the
    /// segment's sequence number of the octet after the urgent data.
    pub(crate) urgent: Option<u16>,
}

/// Parses a frame the classify stage called TCP. None for what smoltcp's parser refuses (a SYN
/// with FIN, a zero port, a bad option).
///
/// An established connection's segments come in two layouts (no options; two NOPs and the
/// timestamps) over IPv4 without IP options or IPv6 without extension headers: those are read
/// directly, everything else through smoltcp's parser, with the same result
/// (`the_direct_reading_agrees_with_the_general_parser`).
#[inline]
pub(crate) fn parse(frame: &[u8]) -> Option<In<'_>> {
    match parse_direct(frame) {
        Direct::Parsed(inn) => Some(inn),
        Direct::Refused => None,
        Direct::Other => parse_general(frame),
    }
}

/// Parses `frame` as [`parse`] does and hands the segment to `f` where it was parsed: the
/// per-segment path, where moving the 152-byte [`In`] out of the parser and out of the
/// `Option` cost two calls to `memcpy` a segment (4% of the in-memory pipeline's time).
#[inline(always)]
pub(crate) fn with_parsed<R>(frame: &[u8], f: impl FnOnce(&In<'_>) -> R) -> Option<R> {
    match parse_direct(frame) {
        Direct::Parsed(ref inn) => Some(f(inn)),
        Direct::Refused => None,
        Direct::Other => parse_general(frame).as_ref().map(f),
    }
}

enum Direct<'a> {
    Parsed(In<'a>),
    Refused,
    /// Not one of the layouts read directly.
    Other,
}

#[inline(always)]
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline(always)]
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn parse_direct(frame: &[u8]) -> Direct<'_> {
    // Ethernet, then the IP header and where the TCP segment lies.
    if frame.len() < ETH + 40 {
        return Direct::Other;
    }
    let (src, dst, tcp, ip_ecn) = match be16(frame, 12) {
        0x0800 => {
            let ip = &frame[ETH..];
            // Version 4, no options, TCP, and a length the frame holds.
            if ip[0] != 0x45 || ip[9] != 6 {
                return Direct::Other;
            }
            let total = usize::from(be16(ip, 2));
            let Some(tcp) = ip.get(20..total) else {
                return Direct::Other;
            };
            let a = |at: usize| {
                smoltcp::wire::Ipv4Address::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3])
            };
            (
                IpAddress::Ipv4(a(12)),
                IpAddress::Ipv4(a(16)),
                tcp,
                ip[1] & 3,
            )
        }
        0x86dd => {
            let ip = &frame[ETH..];
            // Version 6, TCP as the next header (no extension headers).
            if ip[0] >> 4 != 6 || ip[6] != 6 {
                return Direct::Other;
            }
            let len = usize::from(be16(ip, 4));
            let Some(tcp) = ip.get(40..40 + len) else {
                return Direct::Other;
            };
            let a = |at: usize| {
                let mut o = [0u8; 16];
                o.copy_from_slice(&ip[at..at + 16]);
                smoltcp::wire::Ipv6Address::from(o)
            };
            (
                IpAddress::Ipv6(a(8)),
                IpAddress::Ipv6(a(24)),
                tcp,
                (ip[1] >> 4) & 3,
            )
        }
        _ => return Direct::Other,
    };
    if tcp.len() < 20 {
        return Direct::Other;
    }
    let offset = usize::from(tcp[12] >> 4) * 4;
    let flags = tcp[13];
    // SYNs carry the options that need the general parser.
    if flags & SYN != 0 || tcp.len() < offset {
        return Direct::Other;
    }
    let timestamp = match offset {
        20 => None,
        32 if tcp[20..24] == [1, 1, 8, 10] => Some(smoltcp::wire::TcpTimestampRepr {
            tsval: be32(tcp, 24),
            tsecr: be32(tcp, 28),
        }),
        _ => return Direct::Other,
    };
    let (src_port, dst_port) = (be16(tcp, 0), be16(tcp, 2));
    if src_port == 0 || dst_port == 0 {
        return Direct::Refused;
    }
    let control = match (flags & FIN != 0, flags & RST != 0, flags & PSH != 0) {
        (false, false, false) => TcpControl::None,
        (false, false, true) => TcpControl::Psh,
        (true, false, _) => TcpControl::Fin,
        (false, true, _) => TcpControl::Rst,
        (true, true, _) => return Direct::Refused,
    };
    let seg = TcpRepr {
        src_port,
        dst_port,
        control,
        seq_number: smoltcp::wire::TcpSeqNumber(be32(tcp, 4) as i32),
        ack_number: (flags & ACK != 0).then(|| smoltcp::wire::TcpSeqNumber(be32(tcp, 8) as i32)),
        window_len: be16(tcp, 14),
        window_scale: None,
        max_seg_size: None,
        sack_permitted: false,
        sack_ranges: [None; 3],
        timestamp,
        payload: &tcp[offset..],
    };
    let mut src_mac = [0u8; 6];
    src_mac.copy_from_slice(&frame[6..12]);
    Direct::Parsed(In {
        src_mac,
        local: IpEndpoint::new(dst, dst_port),
        remote: IpEndpoint::new(src, src_port),
        seg,
        ecn: EcnIn::of(ip_ecn, flags),
        urgent: (flags & URG != 0).then(|| be16(tcp, 18)),
    })
}

/// [`parse`] through smoltcp's parser, for any layout.
fn parse_general(frame: &[u8]) -> Option<In<'_>> {
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
    let seg = match TcpRepr::parse(&pkt, &src, &dst, &ChecksumCapabilities::ignored()) {
        Ok(seg) => seg,
        // Options Linux would read past: read as it does (`options_as_linux_reads_them`).
        Err(_) => options::reparse(payload, &src, &dst)?,
    };
    Some(In {
        src_mac,
        local: IpEndpoint::new(dst, seg.dst_port),
        remote: IpEndpoint::new(src, seg.src_port),
        seg,
        // new_checked made sure the fixed header is there.
        ecn: EcnIn::of(ip_ecn, payload[13]),
        urgent: (payload[13] & URG != 0).then(|| be16(payload, 18)),
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

#[path = "wire_options.rs"]
mod options;

#[path = "wire_sum.rs"]
mod sums;
use sums::{Words, copy_sum, fold, pseudo_sum};
pub(crate) use sums::{checksum, inet_checksum, verify};

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
