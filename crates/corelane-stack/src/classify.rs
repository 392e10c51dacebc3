//! The classify stage: parse each received frame once, verify its checksums, and note what the
//! later stages need (is it a TCP SYN for a listening port?). Frames that fail are dropped here
//! and counted, so nothing malformed reaches the protocol code.

use smoltcp::wire::{
    ArpOperation, ArpPacket, EthernetFrame, EthernetProtocol, IpAddress, IpEndpoint, IpProtocol,
    Ipv4Packet, Ipv6Packet, TcpPacket, UdpPacket,
};

/// A TCP or UDP flow as seen from this side: `local` is the received frame's destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowKey {
    /// This side's address and port.
    pub local: IpEndpoint,
    /// The peer's address and port.
    pub remote: IpEndpoint,
}

impl std::hash::Hash for FlowKey {
    /// In whole words: an IPv4 endpoint is one (address and port), an IPv6 one three. The flow
    /// table hashes every received segment's key, and the derived hash fed its hasher the
    /// enum's discriminant, the address array's length and the bytes in seven pieces.
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        for e in [&self.local, &self.remote] {
            match e.addr {
                IpAddress::Ipv4(a) => h.write_u64(u64::from(a.to_bits()) << 16 | u64::from(e.port)),
                IpAddress::Ipv6(a) => {
                    let bits = a.to_bits();
                    h.write_u64((bits >> 64) as u64);
                    h.write_u64(bits as u64);
                    h.write_u64(1 << 16 | u64::from(e.port));
                }
            }
        }
    }
}

/// What the classify stage decided about one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A TCP segment with valid checksums; `syn` is true for a connection request (SYN without
    /// ACK).
    Tcp {
        /// The connection.
        key: FlowKey,
        /// SYN without ACK.
        syn: bool,
    },
    /// A UDP datagram with valid checksums.
    Udp {
        /// Source and destination.
        key: FlowKey,
    },
    /// ARP or an NDP solicitation/advertisement; `reply` is true for an ARP reply or a neighbor
    /// advertisement (what fills a neighbor cache that asked).
    Neighbor {
        /// ARP reply or NDP neighbor advertisement.
        reply: bool,
    },
    /// ICMP, IP fragments and the rest: passed to the protocol stage as they are.
    Other,
    /// Dropped: a bad IPv4 header, TCP or UDP checksum.
    BadChecksum,
    /// Dropped: truncated or inconsistent headers.
    Malformed,
}

/// Classifies one Ethernet frame, verifying the IPv4 header checksum and the TCP or UDP checksum.
pub fn classify(frame: &[u8]) -> Class {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return Class::Malformed;
    };
    match eth.ethertype() {
        EthernetProtocol::Ipv4 => {
            let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
                return Class::Malformed;
            };
            if !ip.verify_checksum() {
                return Class::BadChecksum;
            }
            if ip.more_frags() || ip.frag_offset() != 0 {
                return Class::Other;
            }
            let (src, dst) = (
                IpAddress::Ipv4(ip.src_addr()),
                IpAddress::Ipv4(ip.dst_addr()),
            );
            l4(ip.next_header(), src, dst, ip.payload())
        }
        EthernetProtocol::Ipv6 => {
            let Ok(ip) = Ipv6Packet::new_checked(eth.payload()) else {
                return Class::Malformed;
            };
            let (src, dst) = (
                IpAddress::Ipv6(ip.src_addr()),
                IpAddress::Ipv6(ip.dst_addr()),
            );
            l4(ip.next_header(), src, dst, ip.payload())
        }
        EthernetProtocol::Arp => match ArpPacket::new_checked(eth.payload()) {
            Ok(arp) => Class::Neighbor {
                reply: arp.operation() == ArpOperation::Reply,
            },
            Err(_) => Class::Malformed,
        },
        _ => Class::Other,
    }
}

fn l4(proto: IpProtocol, src: IpAddress, dst: IpAddress, payload: &[u8]) -> Class {
    match proto {
        IpProtocol::Tcp => {
            let Ok(tcp) = TcpPacket::new_checked(payload) else {
                return Class::Malformed;
            };
            if !crate::tcp::verify_checksum(&src, &dst, 6, payload) {
                return Class::BadChecksum;
            }
            Class::Tcp {
                key: FlowKey {
                    local: IpEndpoint::new(dst, tcp.dst_port()),
                    remote: IpEndpoint::new(src, tcp.src_port()),
                },
                syn: tcp.syn() && !tcp.ack(),
            }
        }
        IpProtocol::Udp => {
            let Ok(udp) = UdpPacket::new_checked(payload) else {
                return Class::Malformed;
            };
            // A zero UDP checksum over IPv4 means "not computed".
            let unchecked = matches!(src, IpAddress::Ipv4(_)) && udp.checksum() == 0;
            // Over the datagram's own length (new_checked made sure the buffer holds it).
            let datagram = &payload[..usize::from(udp.len())];
            if !unchecked && !crate::tcp::verify_checksum(&src, &dst, 17, datagram) {
                return Class::BadChecksum;
            }
            Class::Udp {
                key: FlowKey {
                    local: IpEndpoint::new(dst, udp.dst_port()),
                    remote: IpEndpoint::new(src, udp.src_port()),
                },
            }
        }
        IpProtocol::Icmpv6 => match payload.first() {
            // Neighbor solicitation (135) and advertisement (136).
            Some(135) => Class::Neighbor { reply: false },
            Some(136) => Class::Neighbor { reply: true },
            _ => Class::Other,
        },
        _ => Class::Other,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use smoltcp::wire::Ipv4Address;

    pub(crate) fn tcp_frame(syn: bool, payload: &[u8]) -> Vec<u8> {
        crate::frames::tcp_v4(syn, payload)
    }

    #[test]
    fn the_checksum_check_agrees_with_smoltcp_s_on_every_length_and_flipped_bit() {
        use smoltcp::wire::{Ipv6Address, TcpPacket, UdpPacket};
        let v4 = (
            IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, 1)),
            IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, 2)),
        );
        let v6 = (
            IpAddress::Ipv6(Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 1)),
            IpAddress::Ipv6(Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 2)),
        );
        let mut checked = 0;
        for (src, dst) in [v4, v6] {
            for len in 20..120usize {
                let mut seg: Vec<u8> = (0..len).map(|i| (i * 37 + len) as u8).collect();
                seg[12] = 5 << 4;
                // A UDP header's length field: the datagram's own length.
                let mut dgram = seg.clone();
                dgram[4..6].copy_from_slice(&(len as u16).to_be_bytes());
                for flip in [None, Some(len / 3), Some(len - 1)] {
                    let (mut t, mut u) = (seg.clone(), dgram.clone());
                    if let Some(at) = flip {
                        t[at] ^= 0x10;
                        u[at.max(8)] ^= 0x10;
                    }
                    // Right checksums first (the field set so that the sum is all ones).
                    for (buf, proto) in [(&mut t, 6u8), (&mut u, 17u8)] {
                        let at = if proto == 6 { 16 } else { 6 };
                        if flip.is_none() {
                            buf[at..at + 2].fill(0);
                            let c = crate::tcp::wire::checksum(
                                &addr_bytes(&src),
                                &addr_bytes(&dst),
                                proto,
                                buf,
                            );
                            buf[at..at + 2].copy_from_slice(&c.to_ne_bytes());
                        }
                        let ours = crate::tcp::verify_checksum(&src, &dst, proto, buf);
                        let theirs = if proto == 6 {
                            TcpPacket::new_unchecked(&buf[..]).verify_checksum(&src, &dst)
                        } else {
                            UdpPacket::new_unchecked(&buf[..]).verify_checksum(&src, &dst)
                        };
                        assert_eq!(ours, theirs, "proto {proto} len {len} flip {flip:?}");
                        checked += usize::from(ours);
                    }
                }
            }
        }
        assert!(checked >= 400, "{checked} right checksums among the cases");
    }

    fn addr_bytes(a: &IpAddress) -> Vec<u8> {
        match a {
            IpAddress::Ipv4(a) => a.octets().to_vec(),
            IpAddress::Ipv6(a) => a.octets().to_vec(),
        }
    }

    #[test]
    fn udp_frames_are_classified_and_a_flipped_bit_is_caught() {
        let mut f = crate::frames::udp_v4(b"datagram");
        assert!(
            matches!(classify(&f), Class::Udp { .. }),
            "{:?}",
            classify(&f)
        );
        let last = f.len() - 1;
        f[last] ^= 1;
        assert_eq!(classify(&f), Class::BadChecksum);
    }

    #[test]
    fn good_segments_are_classified() {
        let key = FlowKey {
            local: IpEndpoint::new(Ipv4Address::new(10, 0, 0, 1).into(), 7),
            remote: IpEndpoint::new(Ipv4Address::new(10, 0, 0, 2).into(), 40000),
        };
        assert_eq!(
            classify(&tcp_frame(true, b"")),
            Class::Tcp { key, syn: true }
        );
        assert_eq!(
            classify(&tcp_frame(false, b"hello")),
            Class::Tcp { key, syn: false }
        );
    }

    #[test]
    fn a_flipped_payload_bit_fails_the_tcp_checksum() {
        let mut f = tcp_frame(false, b"hello");
        let last = f.len() - 1;
        f[last] ^= 1;
        assert_eq!(classify(&f), Class::BadChecksum);
    }

    #[test]
    fn a_flipped_header_bit_fails_the_ipv4_checksum() {
        let mut f = tcp_frame(false, b"hello");
        f[14 + 8] ^= 1; // TTL
        assert_eq!(classify(&f), Class::BadChecksum);
    }

    #[test]
    fn truncations_never_panic_and_are_malformed() {
        let f = tcp_frame(false, b"hello world");
        for n in 0..f.len() {
            let c = classify(&f[..n]);
            assert!(
                matches!(c, Class::Malformed | Class::BadChecksum | Class::Other),
                "prefix {n}: {c:?}"
            );
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for len in 0..2000 {
            let mut f = tcp_frame(false, b"abcdefgh");
            for b in f.iter_mut().skip(12) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x.is_multiple_of(7) {
                    *b = x as u8;
                }
            }
            f.truncate(len % (f.len() + 1));
            let _ = classify(&f);
        }
    }
}
