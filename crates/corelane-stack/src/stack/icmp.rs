//! ICMP and ICMPv6 for owned addresses: echo requests are answered here, straight back to the
//! hardware address they came from (so a pinger behind a router gets its reply without a route
//! or neighbour lookup), for every owned address.

use corelane_frame::FrameIo;
use smoltcp::phy::Device;
use smoltcp::time::Instant;
use smoltcp::wire::IpAddress;

use super::Stack;
use crate::device::XdpDevice;
use crate::tcp::wire::{checksum, inet_checksum};

/// Hop limit of what this stack originates.
const HOP_LIMIT: u8 = 64;

impl Stack {
    /// Answers the waiting frame if it is an echo request for an owned address, and consumes
    /// it then. False (the frame left waiting) for anything else.
    pub(super) fn echo<P: FrameIo>(&mut self, dev: &mut XdpDevice<P>) -> bool {
        let Some(req) = dev.front_bytes() else {
            return false;
        };
        let addrs = self.iface.ip_addrs();
        let owned = |a: IpAddress| addrs.iter().any(|c| c.address() == a);
        let Some(reply) = echo_reply(req, self.mac, owned, &mut self.ip_id) else {
            return false;
        };
        dev.consume();
        if let Some(tx) = dev.transmit(Instant::ZERO) {
            smoltcp::phy::TxToken::consume(tx, reply.len(), |buf| buf.copy_from_slice(&reply));
            self.stats.icmp_echoes += 1;
        }
        true
    }
}

/// The reply frame to `frame` if it is a valid echo request (ICMP type 8 or ICMPv6 type 128,
/// checksum correct, not a fragment) for an address `owned` accepts.
fn echo_reply(
    frame: &[u8],
    mac: [u8; 6],
    owned: impl Fn(IpAddress) -> bool,
    ip_id: &mut u16,
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
            *ip_id = ip_id.wrapping_add(1);
            h[4..6].copy_from_slice(&ip_id.to_be_bytes());
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
        let mut id = 0;
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
        let mut id = 0;
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
