//! Answers for the owned addresses: ARP replies and neighbour advertisements (RFC 826, RFC
//! 4861 section 7.2.4), and the announcements sent when an address is taken (gratuitous ARP,
//! unsolicited neighbour advertisements, RFC 5227 and RFC 4861 section 7.2.6) so that peers
//! and switches learn where it is at once.

use corelane_frame::FrameIo;
use smoltcp::phy::Device;
use smoltcp::time::Instant;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, IpAddress, Ipv4Address, Ipv6Address,
};

use super::Stack;
use crate::device::XdpDevice;
use crate::tcp::wire::checksum;

impl Stack {
    /// Answers the waiting ARP or NDP frame if it asks for an owned address, and consumes it.
    pub(super) fn neighbor_answer<P: FrameIo>(&mut self, now: Instant, dev: &mut XdpDevice<P>) {
        let addrs = &self.addrs;
        let owned = |a: IpAddress| addrs.iter().any(|c| c.address() == a);
        let reply = dev.front_bytes().and_then(|f| answer(f, self.mac, owned));
        dev.consume();
        if let Some(r) = reply
            && let Some(tx) = dev.transmit(now)
        {
            smoltcp::phy::TxToken::consume(tx, r.len(), |b| b.copy_from_slice(&r));
            self.stats.neighbor_answers += 1;
        }
    }
}

/// An IPv6 ICMP frame from `src` to `dst` carrying `body` (its checksum field zero), with hop
/// limit 255 as neighbour discovery requires.
pub(super) fn icmp6_frame(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: [u8; 16],
    dst: [u8; 16],
    body: &[u8],
) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 40 + body.len()];
    f[..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
    let ip = &mut f[14..54];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&(body.len() as u16).to_be_bytes());
    ip[6] = 58;
    ip[7] = 255;
    ip[8..24].copy_from_slice(&src);
    ip[24..40].copy_from_slice(&dst);
    f[54..].copy_from_slice(body);
    let c = checksum(&src, &dst, 58, &f[54..]);
    f[56..58].copy_from_slice(&c.to_ne_bytes());
    f
}

/// An ARP packet of `op` from `mac` at `sender` about `target`, in a frame to `dst_mac`
/// (whose hardware address it also names as the target's, unless it is the broadcast).
pub(super) fn arp_frame(
    op: ArpOperation,
    mac: [u8; 6],
    sender: Ipv4Address,
    dst_mac: [u8; 6],
    target: Ipv4Address,
) -> Vec<u8> {
    let repr = ArpRepr::EthernetIpv4 {
        operation: op,
        source_hardware_addr: EthernetAddress(mac),
        source_protocol_addr: sender,
        target_hardware_addr: EthernetAddress(if dst_mac == [0xff; 6] {
            [0; 6]
        } else {
            dst_mac
        }),
        target_protocol_addr: target,
    };
    let mut f = vec![0u8; 14 + repr.buffer_len()];
    f[..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    repr.emit(&mut ArpPacket::new_unchecked(&mut f[14..]));
    f
}

/// The multicast hardware address of IPv6 group `g` (RFC 2464 section 7).
pub(super) fn multicast_mac(g: [u8; 16]) -> [u8; 6] {
    [0x33, 0x33, g[12], g[13], g[14], g[15]]
}

const ALL_NODES: [u8; 16] = [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// A neighbour advertisement for `target` at `mac`, to `dst` (flags: solicited, override).
fn advertisement(mac: [u8; 6], target: [u8; 16], dst: [u8; 16], solicited: bool) -> Vec<u8> {
    let mut body = [0u8; 32];
    body[0] = 136;
    // Override always; solicited when answering a solicitation.
    body[4] = 0x20 | if solicited { 0x40 } else { 0 };
    body[8..24].copy_from_slice(&target);
    body[24] = 2;
    body[25] = 1;
    body[26..32].copy_from_slice(&mac);
    let dst_mac = if dst[0] == 0xff {
        multicast_mac(dst)
    } else {
        [0; 6]
    };
    icmp6_frame(dst_mac, mac, target, dst, &body)
}

/// The answer to `frame` if it asks for an owned address: an ARP reply to an ARP request, a
/// neighbour advertisement to a neighbour solicitation (checksum and hop limit checked).
pub(super) fn answer(
    frame: &[u8],
    mac: [u8; 6],
    owned: impl Fn(IpAddress) -> bool,
) -> Option<Vec<u8>> {
    let src_mac: [u8; 6] = frame.get(6..12)?.try_into().ok()?;
    match frame.get(12..14)? {
        [0x08, 0x06] => {
            let p = ArpPacket::new_checked(frame.get(14..)?).ok()?;
            let ArpRepr::EthernetIpv4 {
                operation: ArpOperation::Request,
                source_hardware_addr,
                source_protocol_addr,
                target_protocol_addr,
                ..
            } = ArpRepr::parse(&p).ok()?
            else {
                return None;
            };
            if !owned(IpAddress::Ipv4(target_protocol_addr)) {
                return None;
            }
            Some(arp_frame(
                ArpOperation::Reply,
                mac,
                target_protocol_addr,
                source_hardware_addr.0,
                source_protocol_addr,
            ))
        }
        [0x86, 0xdd] => {
            let ip = frame.get(14..)?;
            let plen = usize::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]));
            if ip[0] >> 4 != 6 || *ip.get(6)? != 58 || *ip.get(7)? != 255 || plen < 24 {
                return None;
            }
            let icmp = ip.get(40..40 + plen)?;
            let src: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            let dst: [u8; 16] = ip.get(24..40)?.try_into().ok()?;
            if icmp[0] != 135 || icmp[1] != 0 || checksum(&src, &dst, 58, icmp) != 0 {
                return None;
            }
            let target: [u8; 16] = icmp[8..24].try_into().ok()?;
            if !owned(IpAddress::Ipv6(Ipv6Address::from_octets(target))) {
                return None;
            }
            // From the unspecified address (duplicate address detection): to all nodes.
            let (to, solicited) = if src == [0; 16] {
                (ALL_NODES, false)
            } else {
                (src, true)
            };
            let mut f = advertisement(mac, target, to, solicited);
            if solicited {
                f[..6].copy_from_slice(&src_mac);
            }
            Some(f)
        }
        _ => None,
    }
}

/// An MLDv2 report (RFC 3810 section 5.2) joining `groups`: what a switch that snoops MLD
/// needs before it forwards those groups' frames (neighbour solicitations for an owned address
/// go to its solicited-node group) to this port. Sent from the unspecified address, which
/// section 5.2.13 allows for a host without a link-local address.
pub(super) fn mld_report(mac: [u8; 6], groups: &[[u8; 16]]) -> Vec<u8> {
    const ALL_MLDV2_ROUTERS: [u8; 16] = [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x16];
    let icmp_len = 8 + 20 * groups.len();
    let mut f = vec![0u8; 14 + 40 + 8 + icmp_len];
    f[..6].copy_from_slice(&multicast_mac(ALL_MLDV2_ROUTERS));
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
    let ip = &mut f[14..54];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&((8 + icmp_len) as u16).to_be_bytes());
    ip[6] = 0; // a hop-by-hop options header follows
    ip[7] = 1;
    ip[24..40].copy_from_slice(&ALL_MLDV2_ROUTERS);
    // Hop-by-hop: next header ICMPv6, router alert (MLD), two bytes of padding.
    f[54..62].copy_from_slice(&[58, 0, 5, 2, 0, 0, 1, 0]);
    let icmp = &mut f[62..];
    icmp[0] = 143;
    icmp[6..8].copy_from_slice(&(groups.len() as u16).to_be_bytes());
    for (i, g) in groups.iter().enumerate() {
        let r = &mut icmp[8 + 20 * i..8 + 20 * (i + 1)];
        r[0] = 4; // CHANGE_TO_EXCLUDE_MODE with no sources: join
        r[4..20].copy_from_slice(g);
    }
    let c = checksum(&[0; 16], &ALL_MLDV2_ROUTERS, 58, &f[62..]);
    f[64..66].copy_from_slice(&c.to_ne_bytes());
    f
}

/// Address `a`'s solicited-node multicast group, ff02::1:ffXX:XXXX.
pub(super) fn solicited_node(a: [u8; 16]) -> [u8; 16] {
    let mut g = [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 0];
    g[13..].copy_from_slice(&a[13..]);
    g
}

/// What tells the link that `addr` is at `mac`: a gratuitous ARP request (sender and target
/// both `addr`, broadcast) or an unsolicited neighbour advertisement to all nodes.
pub(super) fn announcement(mac: [u8; 6], addr: IpAddress) -> Vec<u8> {
    match addr {
        IpAddress::Ipv4(a) => arp_frame(ArpOperation::Request, mac, a, [0xff; 6], a),
        IpAddress::Ipv6(a) => advertisement(mac, a.octets(), ALL_NODES, false),
    }
}

#[cfg(test)]
mod tests {
    use super::super::neigh::{Neighbors, request};
    use super::*;
    use crate::classify::{Class, classify};
    use smoltcp::time::Instant;

    const US: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const PEER: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn ip(s: &str) -> IpAddress {
        s.parse::<std::net::IpAddr>()
            .map_or(IpAddress::Ipv4([0; 4].into()), Into::into)
    }

    #[test]
    fn requests_for_owned_addresses_are_answered_and_teach_the_asker() -> Result<(), String> {
        for (ours, theirs) in [("10.0.0.1", "10.0.0.2"), ("fd00::1", "fd00::2")] {
            let ask = request(PEER, ip(theirs), ip(ours)).ok_or("a request")?;
            let reply = answer(&ask, US, |a| a == ip(ours)).ok_or("an answer")?;
            assert_eq!(&reply[..6], &PEER, "unicast to the asker");
            assert!(matches!(classify(&reply), Class::Neighbor { reply: true }));
            // The asker's table learns our address from it (an ARP reply teaches anyone; an
            // advertisement only the side that asked).
            let mut n = Neighbors::default();
            if ours.contains(':') {
                assert!(
                    !n.snoop(&reply, Instant::ZERO),
                    "an answer nobody asked for"
                );
                assert!(n.may_ask(ip(ours), Instant::ZERO));
            }
            assert!(n.snoop(&reply, Instant::ZERO));
            assert_eq!(n.lookup(ip(ours), Instant::ZERO), Some((US, true)));
            // Not ours: no answer; corrupted: no answer.
            assert!(answer(&ask, US, |_| false).is_none());
            let mut bad = ask.clone();
            let last = bad.len() - 1;
            bad[last] ^= 1;
            if ours.contains(':') {
                assert!(answer(&bad, US, |_| true).is_none());
            }
            for n in 0..ask.len() {
                assert!(answer(&ask[..n], US, |_| true).is_none());
            }
        }
        Ok(())
    }

    #[test]
    fn an_mld_report_joins_each_group_with_a_valid_checksum() {
        let groups = [solicited_node([
            0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3,
        ])];
        let f = mld_report(US, &groups);
        assert_eq!(&f[..6], &[0x33, 0x33, 0, 0, 0, 0x16]);
        assert_eq!(
            (f[14 + 6], f[14 + 7]),
            (0, 1),
            "hop-by-hop header, hop limit 1"
        );
        assert_eq!(&f[56..58], &[5, 2], "router alert");
        assert_eq!(checksum(&[0; 16], &f[38..54], 58, &f[62..]), 0);
        assert_eq!((f[62], u16::from_be_bytes([f[68], f[69]])), (143, 1));
        assert_eq!(&f[74..90], &groups[0]);
        assert_eq!(groups[0][11..13], [1, 0xff]);
    }

    #[test]
    fn announcements_update_every_listener_that_knew_the_address() {
        for a in ["10.0.0.1", "fd00::1"] {
            let f = announcement(US, ip(a));
            assert_eq!(f[0] & 1, 1, "broadcast or multicast");
            // A listener that knew the address at another hardware address (a restart on
            // another NIC) moves to the new one: the advertisement carries Override.
            let mut n = Neighbors::default();
            n.learn(ip(a), PEER, Instant::ZERO);
            assert!(n.snoop(&f, Instant::ZERO), "{a}");
            assert_eq!(n.lookup(ip(a), Instant::ZERO), Some((US, true)));
        }
        // An unsolicited advertisement makes no entry (RFC 4861 section 7.2.5); gratuitous
        // ARP does, as ARP has no such rule.
        let mut n = Neighbors::default();
        assert!(!n.snoop(&announcement(US, ip("fd00::1")), Instant::ZERO));
        assert!(n.lookup(ip("fd00::1"), Instant::ZERO).is_none());
    }

    /// Sets the hop limit of the IPv6 frame `f` (the checksum does not cover it).
    fn with_hop_limit(mut f: Vec<u8>, hops: u8) -> Vec<u8> {
        f[14 + 7] = hops;
        f
    }

    #[test]
    fn neighbour_discovery_that_crossed_a_router_or_lacks_override_teaches_nothing() {
        let peer = ip("fd00::2");
        // A solicitation with hop limit 64 could come from off the link: ignored.
        let ns = request(PEER, peer, ip("fd00::1")).unwrap_or_default();
        let mut n = Neighbors::default();
        assert!(!n.snoop(&with_hop_limit(ns.clone(), 64), Instant::ZERO));
        assert!(n.lookup(peer, Instant::ZERO).is_none());
        assert!(n.snoop(&ns, Instant::ZERO), "hop limit 255: learnt");
        // An advertisement without Override does not move a known address; with it, it does.
        let other = [2, 0, 0, 0, 0, 7];
        let mut na = advertisement(
            other,
            [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
            ALL_NODES,
            false,
        );
        let icmp = 14 + 40;
        na[icmp + 4] = 0; // no flags
        let sum_at = icmp + 2;
        na[sum_at..sum_at + 2].fill(0);
        let c = checksum(&na[22..38], &na[38..54], 58, &na[icmp..]);
        na[sum_at..sum_at + 2].copy_from_slice(&c.to_ne_bytes());
        assert!(!n.snoop(&na, Instant::ZERO), "no Override");
        assert_eq!(n.lookup(peer, Instant::ZERO), Some((PEER, true)));
        assert!(!n.snoop(
            &with_hop_limit(
                advertisement(
                    other,
                    [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
                    ALL_NODES,
                    false
                ),
                254
            ),
            Instant::ZERO
        ));
        assert!(n.snoop(
            &advertisement(
                other,
                [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
                ALL_NODES,
                false
            ),
            Instant::ZERO
        ));
        assert_eq!(n.lookup(peer, Instant::ZERO), Some((other, true)));
    }
}
