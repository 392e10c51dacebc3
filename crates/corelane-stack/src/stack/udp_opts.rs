//! A UDP socket's options (TTL, type of service, a refusal an ICMP error reported) and the
//! ECN bits of each datagram, received and sent (what QUIC reads and writes, RFC 9000
//! section 13.4).

use std::io;
use std::net::SocketAddr;
use std::task::{Poll, Waker};

use smoltcp::wire::IpEndpoint;

use super::{FlowId, Stack};

impl Stack {
    /// Sets the TTL (IPv4) or hop limit (IPv6) of UDP flow `id`'s datagrams (1..=255).
    ///
    /// # Errors
    /// `InvalidInput` for 0 or more than 255; `NotConnected` when the flow is gone.
    pub fn udp_set_ttl(&mut self, id: FlowId, ttl: u32) -> io::Result<()> {
        if self.udp_sock(id).is_none() {
            return Err(super::socket::gone());
        }
        self.tcp_set_ttl(id, ttl)
    }

    /// The TTL (IPv4) or hop limit (IPv6) of UDP flow `id`'s datagrams.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn udp_ttl(&mut self, id: FlowId) -> io::Result<u32> {
        if self.udp_sock(id).is_none() {
            return Err(super::socket::gone());
        }
        self.tcp_ttl(id)
    }

    /// True once (then forgotten) when an ICMP error said `peer` refused a datagram UDP flow
    /// `id` sent (port or protocol unreachable): a connected socket's next receive or send
    /// fails with `ConnectionRefused`, as the kernel's does. A refusal by another peer is
    /// forgotten too (an unconnected kernel socket ignores them).
    pub fn udp_take_refused(&mut self, id: FlowId, peer: std::net::SocketAddr) -> bool {
        self.udp_sock(id)
            .and_then(|s| s.refused.take())
            .is_some_and(|r| r == IpEndpoint::from(peer))
    }

    /// Sets the IPv4 type of service or IPv6 traffic class of UDP flow `id`'s datagrams
    /// (`IP_TOS`, `IPV6_TCLASS`: all eight bits, ECN's two included, as the kernel's UDP).
    ///
    /// # Errors
    /// `InvalidInput` for more than 255; `NotConnected` when the flow is gone.
    pub fn udp_set_tos(&mut self, id: FlowId, tos: u32) -> io::Result<()> {
        if self.udp_sock(id).is_none() {
            return Err(super::socket::gone());
        }
        self.set_tos(id, tos)
    }

    /// The IPv4 type of service or IPv6 traffic class of UDP flow `id`'s datagrams (0 unless
    /// set).
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn udp_tos(&mut self, id: FlowId) -> io::Result<u32> {
        if self.udp_sock(id).is_none() {
            return Err(super::socket::gone());
        }
        self.tos(id)
    }

    /// [`Stack::udp_recv_from`] with the datagram's two ECN bits (0: not ECN-capable;
    /// 0b10 ECT(0), 0b01 ECT(1), 0b11 CE), as `IP_RECVTOS` reports them.
    ///
    /// # Errors
    /// As [`Stack::udp_recv_from`].
    pub fn udp_recv_from_ecn(
        &mut self,
        id: FlowId,
        buf: &mut [u8],
        waker: Option<&Waker>,
    ) -> Poll<io::Result<(usize, SocketAddr, u8)>> {
        self.udp_take(id, buf, waker, false)
    }

    /// As [`Stack::udp_recv_from`], for a buffer whose free part need not be initialized
    /// (tokio's `ReadBuf`, which a slice would have to zero first, all of it, for every
    /// datagram): the datagram's first `max` bytes are handed to `put`, once.
    ///
    /// # Errors
    /// As [`Stack::udp_recv_from`].
    pub fn udp_recv_from_with(
        &mut self,
        id: FlowId,
        max: usize,
        mut put: impl FnMut(&[u8]),
        waker: Option<&Waker>,
    ) -> Poll<io::Result<(usize, SocketAddr)>> {
        self.udp_take_with(id, max, &mut put, waker, false)
            .map_ok(|(n, from, _)| (n, from))
    }

    /// As [`Stack::udp_recv_from_with`], leaving the datagram queued.
    ///
    /// # Errors
    /// As [`Stack::udp_recv_from`].
    pub fn udp_peek_from_with(
        &mut self,
        id: FlowId,
        max: usize,
        mut put: impl FnMut(&[u8]),
        waker: Option<&Waker>,
    ) -> Poll<io::Result<(usize, SocketAddr)>> {
        self.udp_take_with(id, max, &mut put, waker, true)
            .map_ok(|(n, from, _)| (n, from))
    }

    /// [`Stack::udp_send_to`] with the datagram's two ECN bits set to `ecn` (0 leaves the
    /// socket's type of service as it is), as a `IP_TOS` control message does.
    ///
    /// # Errors
    /// As [`Stack::udp_send_to`].
    pub fn udp_send_to_ecn(
        &mut self,
        id: FlowId,
        buf: &[u8],
        to: SocketAddr,
        ecn: u8,
        waker: Option<&Waker>,
    ) -> Poll<io::Result<usize>> {
        self.udp_send(id, buf, to, ecn, waker)
    }
}

/// The ECN bits of an IPv4 or IPv6 frame (0 for anything else).
pub(super) fn ecn_of(frame: &[u8]) -> u8 {
    match frame.get(12..14) {
        Some([0x08, 0x00]) => frame.get(15).map_or(0, |tos| tos & 3),
        Some([0x86, 0xdd]) => frame.get(15).map_or(0, |b| (b >> 4) & 3),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use std::task::Poll;

    use smoltcp::time::Duration;

    use crate::{Pair, StackConfig};

    #[test]
    fn a_datagram_s_ecn_bits_cross_the_link_both_as_set_and_from_the_socket_s_tos()
    -> Result<(), Box<dyn std::error::Error>> {
        let mut p = Pair::new(StackConfig {
            seed: Some(0xec),
            ..StackConfig::default()
        });
        let (a, _) = p.a.stack.bind_udp(4433)?;
        let (b, _) = p.b.stack.bind_udp(0)?;
        let to = "10.9.0.1:4433".parse()?;
        let mut got = Vec::new();
        // Per datagram: not-ECT, ECT(0), ECT(1), CE; then none set on a socket whose type of
        // service says ECT(0) with a DSCP, which it keeps; then CE over that.
        assert!(matches!(
            p.b.stack.udp_send_to_ecn(b, b"0", to, 0, None),
            Poll::Ready(Ok(1))
        ));
        // The first one resolves the neighbour (until then, four wait at most).
        p.drive(Duration::from_secs(1), |p| {
            let mut buf = [0u8; 8];
            if let Poll::Ready(Ok((n, _, ecn))) = p.a.stack.udp_recv_from_ecn(a, &mut buf, None) {
                got.push((buf[..n].to_vec(), ecn));
            }
            !got.is_empty()
        })?;
        for ecn in [2u8, 1, 3] {
            assert!(matches!(
                p.b.stack.udp_send_to_ecn(b, &[ecn], to, ecn, None),
                Poll::Ready(Ok(1))
            ));
        }
        p.b.stack.udp_set_tos(b, 0xb8 | 2)?;
        assert!(matches!(
            p.b.stack.udp_send_to(b, b"t", to, None),
            Poll::Ready(Ok(1))
        ));
        assert!(matches!(
            p.b.stack.udp_send_to_ecn(b, b"c", to, 3, None),
            Poll::Ready(Ok(1))
        ));
        p.drive(Duration::from_secs(1), |p| {
            let mut buf = [0u8; 8];
            while let Poll::Ready(Ok((n, _, ecn))) = p.a.stack.udp_recv_from_ecn(a, &mut buf, None)
            {
                got.push((buf[..n].to_vec(), ecn));
            }
            got.len() == 6
        })?;
        let want: Vec<(Vec<u8>, u8)> = vec![
            (b"0".to_vec(), 0),
            (vec![2], 2),
            (vec![1], 1),
            (vec![3], 3),
            (b"t".to_vec(), 2),
            (b"c".to_vec(), 3),
        ];
        assert_eq!(got, want);
        assert_eq!(
            p.b.stack.udp_tos(b)?,
            0xba,
            "the socket's own type of service unchanged"
        );
        Ok(())
    }
}
