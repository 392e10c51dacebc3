//! ICMP and ICMPv6 for owned addresses: echo requests are answered here, straight back to the
//! hardware address they came from (so a pinger behind a router gets its reply without a route
//! or neighbour lookup), for every owned address; errors that quote a TCP segment go to its
//! connection (path MTU, unreachable peers), on whichever core holds it.

use corelane_frame::{FrameIo, Proto};
use smoltcp::phy::Device;
use smoltcp::time::Instant;
use smoltcp::wire::{IpAddress, IpEndpoint, Ipv4Address, Ipv6Address};

use super::Stack;
use crate::classify::FlowKey;
use crate::config::EPHEMERAL_START;
use crate::device::XdpDevice;
use crate::pipeline::{Disposition, Peers, Unclaimed};
use crate::tcp::wire::{checksum, inet_checksum};
use crate::tcp::{IcmpError, Seq};

/// Hop limit of what this stack originates.
const HOP_LIMIT: u8 = 64;

impl Stack {
    /// Answers the waiting frame if it is an echo request for an owned address, and consumes
    /// it then. False (the frame left waiting) for anything else.
    pub(super) fn echo<P: FrameIo>(&mut self, dev: &mut XdpDevice<P>) -> bool {
        let addrs = &self.addrs;
        let owned = |a: IpAddress| addrs.iter().any(|c| c.address() == a);
        let Some(reply) = dev
            .front_bytes()
            .and_then(|req| echo_reply(req, self.mac, owned, &mut self.ids))
        else {
            return false;
        };
        dev.consume();
        self.send_frame(dev, &reply);
        self.stats.icmp_echoes += 1;
        true
    }

    /// Answers `frame` (a reassembled datagram) if it is an echo request for an owned address.
    pub(super) fn echo_frame<P: FrameIo>(&mut self, dev: &mut XdpDevice<P>, frame: &[u8]) -> bool {
        let addrs = &self.addrs;
        let owned = |a: IpAddress| addrs.iter().any(|c| c.address() == a);
        let Some(reply) = echo_reply(frame, self.mac, owned, &mut self.ids) else {
            return false;
        };
        self.send_frame(dev, &reply);
        self.stats.icmp_echoes += 1;
        true
    }

    /// Sends a whole frame, cut into IP fragments when it is larger than the MTU.
    pub(super) fn send_frame<P: FrameIo>(&mut self, dev: &mut XdpDevice<P>, frame: &[u8]) {
        if frame.len() <= self.mtu + 14 {
            if let Some(tx) = dev.transmit(Instant::ZERO) {
                smoltcp::phy::TxToken::consume(tx, frame.len(), |b| b.copy_from_slice(frame));
            }
            return;
        }
        // A fresh identification for the fragments, from the datagram's addresses.
        let (src, dst, proto) = if frame.get(12..14) == Some(&[0x08, 0x00]) {
            (frame.get(26..30), frame.get(30..34), frame.get(23))
        } else {
            (frame.get(22..38), frame.get(38..54), frame.get(20))
        };
        let (Some(src), Some(dst), Some(&proto)) = (src, dst, proto) else {
            return;
        };
        let id = self.ids.next(src, dst, proto);
        self.frag.count_fragmented();
        for f in crate::frag::refragment(frame, self.mtu, id) {
            let Some(tx) = dev.transmit(Instant::ZERO) else {
                return;
            };
            smoltcp::phy::TxToken::consume(tx, f.len(), |b| b.copy_from_slice(&f));
        }
    }

    /// Gives the waiting frame to the TCP connection it is about, if it is an ICMP error that
    /// quotes one of this host's segments: here, or on the core that holds the connection.
    /// False (the frame left waiting) when it is no such error.
    pub(super) fn icmp_error<P: FrameIo>(
        &mut self,
        now: Instant,
        dev: &mut XdpDevice<P>,
        peers: &mut dyn Peers,
        hops: u8,
    ) -> bool {
        let Some((proto, key, e, seq)) = dev.front_bytes().and_then(parse_error) else {
            return false;
        };
        if proto == Proto::Udp {
            return self.udp_icmp_error(dev, peers, hops, key, e);
        }
        if let Some(i) = self.table.get(&key) {
            dev.skip();
            let taken = self.slots[i as usize]
                .flow
                .as_mut()
                .and_then(|f| f.conn())
                .is_some_and(|c| c.on_icmp(now, e, seq));
            if taken {
                self.settle(i);
                self.queue_egress(i);
            } else {
                self.stats.icmp_ignored += 1;
            }
            return true;
        }
        let port = key.local.port;
        // A passive connection may be on any core: around the ring once.
        self.hand_icmp(dev, peers, hops, Proto::Tcp, port, port < EPHEMERAL_START);
        true
    }

    /// Hands the waiting ICMP error about `proto` port `port` to the core that may hold its
    /// socket (around the ring once when `listening`), counted; it is taken off the queue.
    fn hand_icmp<P: FrameIo>(
        &mut self,
        dev: &mut XdpDevice<P>,
        peers: &mut dyn Peers,
        hops: u8,
        proto: Proto,
        port: u16,
        listening: bool,
    ) {
        let disposition = dev.front_bytes().map_or(Disposition::Answer, |bytes| {
            peers.unclaimed(Unclaimed {
                proto,
                local_port: port,
                listening,
                hops,
                bytes,
            })
        });
        match disposition {
            Disposition::HandedOff => self.stats.handed_off += 1,
            Disposition::Dropped => self.stats.handoff_dropped += 1,
            Disposition::Answer => self.stats.icmp_ignored += 1,
        }
        dev.skip();
    }

    /// An ICMP error quoting a datagram a UDP socket here sent: a refusal (port or protocol
    /// unreachable) is kept for the socket's connected calls and wakes its reader; anything
    /// else is counted and dropped. A quote of another core's port goes to that core.
    fn udp_icmp_error<P: FrameIo>(
        &mut self,
        dev: &mut XdpDevice<P>,
        peers: &mut dyn Peers,
        hops: u8,
        key: FlowKey,
        e: IcmpError,
    ) -> bool {
        let port = key.local.port;
        if let Some(&i) = self.udp.get(&port) {
            dev.skip();
            match (e, self.udp_sock_at(i)) {
                (IcmpError::Refused, Some(s)) => {
                    s.refused = Some(key.remote);
                    s.wake_rx();
                }
                _ => self.stats.icmp_ignored += 1,
            }
            return true;
        }
        self.hand_icmp(dev, peers, hops, Proto::Udp, port, false);
        true
    }
}

/// The protocol and flow an ICMP or ICMPv6 error is about (as this side names it), what it
/// says, and the sequence number of the TCP segment it quotes (0 for a UDP datagram). None
/// for anything else: echo, a bad checksum, a quote of something not TCP or UDP or too short
/// to name the segment.
fn parse_error(frame: &[u8]) -> Option<(Proto, FlowKey, IcmpError, Seq)> {
    let ip = frame.get(14..)?;
    let (e, quoted) = match u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]) {
        0x0800 => {
            let ihl = usize::from(ip.first()? & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
            if ip[0] >> 4 != 4 || *ip.get(9)? != 1 || ihl < 20 || total > ip.len() {
                return None;
            }
            let icmp = ip.get(ihl..total)?;
            if icmp.len() < 8 || inet_checksum(icmp) != 0 || icmp[0] != 3 {
                return None;
            }
            let e = match icmp[1] {
                4 => IcmpError::TooBig(u32::from(u16::from_be_bytes([icmp[6], icmp[7]]))),
                2 | 3 => IcmpError::Refused,
                0 | 1 | 9 | 10 | 13 => IcmpError::Unreachable,
                _ => return None,
            };
            let q = icmp.get(8..)?;
            let qihl = usize::from(q.first()? & 0x0f) * 4;
            let proto = quoted_proto(*q.get(9)?)?;
            if q[0] >> 4 != 4 || qihl < 20 {
                return None;
            }
            let src = IpAddress::Ipv4(Ipv4Address::from_octets(q.get(12..16)?.try_into().ok()?));
            let dst = IpAddress::Ipv4(Ipv4Address::from_octets(q.get(16..20)?.try_into().ok()?));
            (e, (proto, src, dst, q.get(qihl..qihl + 8)?))
        }
        0x86dd => {
            let plen = usize::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]));
            if ip[0] >> 4 != 6 || *ip.get(6)? != 58 {
                return None;
            }
            let icmp = ip.get(40..40 + plen)?;
            let src: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            let dst: [u8; 16] = ip.get(24..40)?.try_into().ok()?;
            if icmp.len() < 8 || checksum(&src, &dst, 58, icmp) != 0 {
                return None;
            }
            let e = match (icmp[0], icmp[1]) {
                (2, _) => IcmpError::TooBig(u32::from_be_bytes(icmp[4..8].try_into().ok()?)),
                (1, 4) => IcmpError::Refused,
                (1, 0 | 1 | 3) => IcmpError::Unreachable,
                _ => return None,
            };
            let q = icmp.get(8..)?;
            let proto = quoted_proto(*q.get(6)?)?;
            if q.first()? >> 4 != 6 {
                return None;
            }
            let src = IpAddress::Ipv6(Ipv6Address::from_octets(q.get(8..24)?.try_into().ok()?));
            let dst = IpAddress::Ipv6(Ipv6Address::from_octets(q.get(24..40)?.try_into().ok()?));
            (e, (proto, src, dst, q.get(40..48)?))
        }
        _ => return None,
    };
    let (proto, src, dst, l4) = quoted;
    let sport = u16::from_be_bytes([l4[0], l4[1]]);
    let dport = u16::from_be_bytes([l4[2], l4[3]]);
    let seq = match proto {
        Proto::Tcp => Seq(u32::from_be_bytes([l4[4], l4[5], l4[6], l4[7]])),
        Proto::Udp => Seq(0),
    };
    let key = FlowKey {
        local: IpEndpoint::new(src, sport),
        remote: IpEndpoint::new(dst, dport),
    };
    Some((proto, key, e, seq))
}

/// The protocol of a quoted header, if it is one whose errors this stack takes.
fn quoted_proto(p: u8) -> Option<Proto> {
    match p {
        6 => Some(Proto::Tcp),
        17 => Some(Proto::Udp),
        _ => None,
    }
}

/// The reply frame to `frame` if it is a valid echo request (ICMP type 8 or ICMPv6 type 128,
/// checksum correct, not a fragment) for an address `owned` accepts.
fn echo_reply(
    frame: &[u8],
    mac: [u8; 6],
    owned: impl Fn(IpAddress) -> bool,
    ids: &mut crate::tcp::IdGen,
) -> Option<Vec<u8>> {
    let eth_src: [u8; 6] = frame.get(6..12)?.try_into().ok()?;
    match u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]) {
        0x0800 => {
            let ip = frame.get(14..)?;
            let ihl = usize::from(ip.first()? & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
            // Version 4, protocol 1, not a fragment (MF clear, offset 0), sane lengths.
            if ip[0] >> 4 != 4
                || *ip.get(9)? != 1
                || ihl < 20
                || total < ihl + 8
                || total > ip.len()
                || u16::from_be_bytes([*ip.get(6)?, *ip.get(7)?]) & 0x3fff != 0
            {
                return None;
            }
            let src: [u8; 4] = ip[12..16].try_into().ok()?;
            let dst: [u8; 4] = ip[16..20].try_into().ok()?;
            let icmp = &ip[ihl..total];
            if icmp[0] != 8 || icmp[1] != 0 || inet_checksum(icmp) != 0 {
                return None;
            }
            if !owned(IpAddress::Ipv4(dst.into())) {
                return None;
            }
            let mut out = vec![0u8; 14 + 20 + icmp.len()];
            ethernet(&mut out, eth_src, mac, 0x0800);
            let h = &mut out[14..34];
            h[0] = 0x45;
            h[2..4].copy_from_slice(&((20 + icmp.len()) as u16).to_be_bytes());
            // Not atomic (no DF: the reply may meet a smaller MTU): a keyed identification.
            h[4..6].copy_from_slice(&(ids.next(&dst, &src, 1) as u16).to_be_bytes());
            h[8] = HOP_LIMIT;
            h[9] = 1;
            h[12..16].copy_from_slice(&dst);
            h[16..20].copy_from_slice(&src);
            let c = inet_checksum(h);
            h[10..12].copy_from_slice(&c.to_ne_bytes());
            let m = &mut out[34..];
            m.copy_from_slice(icmp);
            m[0] = 0;
            m[2..4].fill(0);
            let c = inet_checksum(m);
            m[2..4].copy_from_slice(&c.to_ne_bytes());
            Some(out)
        }
        0x86dd => {
            let ip = frame.get(14..)?;
            let plen = usize::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]));
            if ip[0] >> 4 != 6 || *ip.get(6)? != 58 || 40 + plen > ip.len() || plen < 8 {
                return None;
            }
            let src: [u8; 16] = ip[8..24].try_into().ok()?;
            let dst: [u8; 16] = ip[24..40].try_into().ok()?;
            let icmp = &ip[40..40 + plen];
            if icmp[0] != 128 || icmp[1] != 0 || checksum(&src, &dst, 58, icmp) != 0 {
                return None;
            }
            if !owned(IpAddress::Ipv6(dst.into())) {
                return None;
            }
            let mut out = vec![0u8; 14 + 40 + plen];
            ethernet(&mut out, eth_src, mac, 0x86dd);
            let h = &mut out[14..54];
            h[0] = 0x60;
            h[4..6].copy_from_slice(&(plen as u16).to_be_bytes());
            h[6] = 58;
            h[7] = HOP_LIMIT;
            h[8..24].copy_from_slice(&dst);
            h[24..40].copy_from_slice(&src);
            let m = &mut out[54..];
            m.copy_from_slice(icmp);
            m[0] = 129;
            m[2..4].fill(0);
            let c = checksum(&dst, &src, 58, m);
            m[2..4].copy_from_slice(&c.to_ne_bytes());
            Some(out)
        }
        _ => None,
    }
}

fn ethernet(out: &mut [u8], dst: [u8; 6], src: [u8; 6], ethertype: u16) {
    out[..6].copy_from_slice(&dst);
    out[6..12].copy_from_slice(&src);
    out[12..14].copy_from_slice(&ethertype.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::phy::ChecksumCapabilities;
    use smoltcp::wire::{
        EthernetFrame, Icmpv4Packet, Icmpv4Repr, Icmpv6Packet, Icmpv6Repr, Ipv4Address, Ipv4Packet,
        Ipv6Address, Ipv6Packet,
    };

    const PEER: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const US: [u8; 6] = [2, 0, 0, 0, 0, 1];

    fn v4_request(dst: [u8; 4]) -> Vec<u8> {
        let data = b"corelane ping";
        let repr = Icmpv4Repr::EchoRequest {
            ident: 7,
            seq_no: 3,
            data,
        };
        let mut f = vec![0u8; 14 + 20 + repr.buffer_len()];
        ethernet(&mut f, US, PEER, 0x0800);
        let ip = &mut f[14..];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((20 + repr.buffer_len()) as u16).to_be_bytes());
        ip[8] = 64;
        ip[9] = 1;
        ip[12..16].copy_from_slice(&[10, 0, 0, 2]);
        ip[16..20].copy_from_slice(&dst);
        let mut p = Ipv4Packet::new_unchecked(&mut f[14..]);
        p.fill_checksum();
        let mut icmp = Icmpv4Packet::new_unchecked(&mut f[34..]);
        repr.emit(&mut icmp, &ChecksumCapabilities::default());
        f
    }

    #[test]
    fn an_ipv4_echo_request_for_an_owned_address_is_answered_to_its_sender() -> Result<(), String> {
        let ours = IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, 1));
        let req = v4_request([10, 0, 0, 1]);
        let mut id = crate::tcp::Secret::new(1).ids();
        let reply = echo_reply(&req, US, |a| a == ours, &mut id).ok_or("a reply")?;
        let eth = EthernetFrame::new_checked(&reply[..]).map_err(|e| e.to_string())?;
        assert_eq!(eth.dst_addr().0, PEER);
        let ip = Ipv4Packet::new_checked(eth.payload()).map_err(|e| e.to_string())?;
        assert!(ip.verify_checksum());
        assert_eq!(ip.dst_addr(), Ipv4Address::new(10, 0, 0, 2));
        let icmp = Icmpv4Packet::new_checked(ip.payload()).map_err(|e| e.to_string())?;
        let repr = Icmpv4Repr::parse(&icmp, &ChecksumCapabilities::default())
            .map_err(|e| e.to_string())?;
        assert_eq!(
            repr,
            Icmpv4Repr::EchoReply {
                ident: 7,
                seq_no: 3,
                data: b"corelane ping"
            }
        );
        // Not ours, corrupt, or a fragment: no reply.
        assert!(echo_reply(&v4_request([10, 0, 0, 9]), US, |a| a == ours, &mut id).is_none());
        let mut bad = req.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        assert!(echo_reply(&bad, US, |a| a == ours, &mut id).is_none());
        let mut frag = req.clone();
        frag[14 + 6] = 0x20;
        assert!(echo_reply(&frag, US, |a| a == ours, &mut id).is_none());
        // Truncated frames of every length are refused without a panic.
        for n in 0..req.len() {
            assert!(echo_reply(&req[..n], US, |_| true, &mut id).is_none());
        }
        Ok(())
    }

    /// An ICMP "destination unreachable" (code `code`, next-hop MTU `mtu`) from a router at
    /// 10.0.0.254 quoting a TCP segment 10.0.0.1:80 -> 10.9.9.9:40000 with sequence `seq`.
    fn v4_error(code: u8, mtu: u16, seq: u32) -> Vec<u8> {
        let mut q = vec![0u8; 28];
        q[0] = 0x45;
        q[2..4].copy_from_slice(&1500u16.to_be_bytes());
        q[8] = 64;
        q[9] = 6;
        q[12..16].copy_from_slice(&[10, 0, 0, 1]);
        q[16..20].copy_from_slice(&[10, 9, 9, 9]);
        q[20..22].copy_from_slice(&80u16.to_be_bytes());
        q[22..24].copy_from_slice(&40000u16.to_be_bytes());
        q[24..28].copy_from_slice(&seq.to_be_bytes());
        let mut icmp = vec![3, code, 0, 0, 0, 0];
        icmp.extend_from_slice(&mtu.to_be_bytes());
        icmp.extend_from_slice(&q);
        let c = inet_checksum(&icmp);
        icmp[2..4].copy_from_slice(&c.to_ne_bytes());
        let mut f = vec![0u8; 14 + 20];
        ethernet(&mut f, US, PEER, 0x0800);
        let ip = &mut f[14..];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((20 + icmp.len()) as u16).to_be_bytes());
        ip[8] = 64;
        ip[9] = 1;
        ip[12..16].copy_from_slice(&[10, 0, 0, 254]);
        ip[16..20].copy_from_slice(&[10, 0, 0, 1]);
        let c = inet_checksum(&f[14..34]);
        f[24..26].copy_from_slice(&c.to_ne_bytes());
        f.extend_from_slice(&icmp);
        f
    }

    #[test]
    fn an_icmp_error_names_the_connection_it_quotes() -> Result<(), String> {
        let f = v4_error(4, 1280, 77);
        let (_, key, e, seq) = parse_error(&f).ok_or("a fragmentation-needed message")?;
        assert_eq!(key.local.to_string(), "10.0.0.1:80");
        assert_eq!(key.remote.to_string(), "10.9.9.9:40000");
        assert_eq!((e, seq), (IcmpError::TooBig(1280), Seq(77)));
        let (_, _, e, _) = parse_error(&v4_error(3, 0, 1)).ok_or("port unreachable")?;
        assert_eq!(e, IcmpError::Refused);
        let (_, _, e, _) = parse_error(&v4_error(1, 0, 1)).ok_or("host unreachable")?;
        assert_eq!(e, IcmpError::Unreachable);
        // A corrupted message, an echo request and every truncation: nothing, no panic.
        let mut bad = f.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(parse_error(&bad).is_none());
        assert!(parse_error(&v4_request([10, 0, 0, 1])).is_none());
        for n in 0..f.len() {
            assert!(parse_error(&f[..n]).is_none(), "cut at {n}");
        }
        Ok(())
    }

    #[test]
    fn an_ipv6_echo_request_is_answered_with_a_valid_checksum() -> Result<(), String> {
        let src = Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 2);
        let dst = Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 1);
        let repr = Icmpv6Repr::EchoRequest {
            ident: 1,
            seq_no: 2,
            data: b"v6",
        };
        let mut f = vec![0u8; 14 + 40 + repr.buffer_len()];
        ethernet(&mut f, US, PEER, 0x86dd);
        let ip = &mut f[14..54];
        ip[0] = 0x60;
        ip[4..6].copy_from_slice(&(repr.buffer_len() as u16).to_be_bytes());
        ip[6] = 58;
        ip[7] = 64;
        ip[8..24].copy_from_slice(&src.octets());
        ip[24..40].copy_from_slice(&dst.octets());
        repr.emit(
            &src,
            &dst,
            &mut Icmpv6Packet::new_unchecked(&mut f[54..]),
            &ChecksumCapabilities::default(),
        );
        let mut id = crate::tcp::Secret::new(1).ids();
        let reply = echo_reply(&f, US, |a| a == IpAddress::Ipv6(dst), &mut id).ok_or("a reply")?;
        let ip = Ipv6Packet::new_checked(&reply[14..]).map_err(|e| e.to_string())?;
        assert_eq!(ip.dst_addr(), src);
        let icmp = Icmpv6Packet::new_checked(ip.payload()).map_err(|e| e.to_string())?;
        let back = Icmpv6Repr::parse(&dst, &src, &icmp, &ChecksumCapabilities::default())
            .map_err(|e| e.to_string())?;
        assert_eq!(
            back,
            Icmpv6Repr::EchoReply {
                ident: 1,
                seq_no: 2,
                data: b"v6"
            }
        );
        for n in 0..f.len() {
            assert!(echo_reply(&f[..n], US, |_| true, &mut id).is_none());
        }
        Ok(())
    }
}
