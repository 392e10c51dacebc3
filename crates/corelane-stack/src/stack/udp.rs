//! UDP: sockets bound on every owned address, datagrams delivered from the frame (or from
//! reassembly) to the socket's queue, and sent straight into transmit frames, fragmented when
//! larger than the link's MTU. A datagram to a closed port is answered with a rate-limited
//! ICMP "port unreachable".

use std::io;
use std::net::SocketAddr;
use std::task::{Poll, Waker};

use corelane_frame::{FrameIo, Proto};
use smoltcp::phy::Device;
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{IpAddress, IpEndpoint};

use super::{FlowId, Sock, Stack};
use crate::config::StackError;
use crate::device::XdpDevice;
use crate::tcp::wire::{checksum, inet_checksum};
use crate::udp::{MAX_PAYLOAD, UdpSock};

/// How long a datagram may wait for its next hop's hardware address before it is dropped.
const RESOLVE_WAIT: Duration = Duration::from_secs(3);
/// ICMP errors a stack may send: a burst of this many, refilled at one per millisecond.
const ICMP_BURST: u32 = 50;

/// The parts of a received UDP frame: the peer, this side's address, the payload.
pub(super) fn parse(frame: &[u8]) -> Option<(IpEndpoint, IpAddress, [u8; 6], &[u8])> {
    let src_mac: [u8; 6] = frame.get(6..12)?.try_into().ok()?;
    let ip = frame.get(14..)?;
    let (src, dst, udp) = match frame.get(12..14)? {
        [0x08, 0x00] => {
            let ihl = usize::from(ip.first()? & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
            let src = IpAddress::Ipv4(<[u8; 4]>::try_from(ip.get(12..16)?).ok()?.into());
            let dst = IpAddress::Ipv4(<[u8; 4]>::try_from(ip.get(16..20)?).ok()?.into());
            (src, dst, ip.get(ihl..total)?)
        }
        [0x86, 0xdd] => {
            let plen = usize::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]));
            let src = IpAddress::Ipv6(<[u8; 16]>::try_from(ip.get(8..24)?).ok()?.into());
            let dst = IpAddress::Ipv6(<[u8; 16]>::try_from(ip.get(24..40)?).ok()?.into());
            (src, dst, ip.get(40..40 + plen)?)
        }
        _ => return None,
    };
    let len = usize::from(u16::from_be_bytes([*udp.get(4)?, *udp.get(5)?]));
    let sport = u16::from_be_bytes([udp[0], udp[1]]);
    Some((
        IpEndpoint::new(src, sport),
        dst,
        src_mac,
        udp.get(8..len.max(8))?,
    ))
}

impl Stack {
    /// Binds a UDP socket to `port` (0: a port of this stack's share of the ephemeral range) on
    /// every owned address. Returns the flow and the port.
    ///
    /// # Errors
    /// The port is taken, or no ephemeral port is free.
    pub fn bind_udp(&mut self, port: u16) -> Result<(FlowId, u16), StackError> {
        let port = if port == 0 {
            self.ephemeral_port(Proto::Udp, None)?
        } else {
            port
        };
        if self.udp.contains_key(&port) {
            return Err(StackError::InUse { proto: "UDP", port });
        }
        let sock = UdpSock::new(self.cfg.udp_packets, self.cfg.udp_bytes);
        let i = self.insert(Sock::Udp(Box::new(sock)), Proto::Udp, port, |f| {
            f.held = true;
        });
        self.udp.insert(port, i);
        self.ports.insert((Proto::Udp, port));
        Ok((self.id_of(i), port))
    }

    /// The UDP socket of flow `id` (None if the id is stale or not UDP).
    pub(super) fn udp_sock(&mut self, id: FlowId) -> Option<&mut UdpSock> {
        match &mut self.flow(id)?.sock {
            Sock::Udp(s) => Some(s),
            Sock::Tcp(_) => None,
        }
    }

    /// Queues one datagram from UDP flow `id` to `to`. `Pending` means the send queue is full
    /// (`waker`, if given, is woken when room frees up). Datagrams larger than the link's MTU
    /// go out as IP fragments.
    ///
    /// # Errors
    /// `InvalidInput` for a datagram larger than 65507 bytes or than the send queue, or a
    /// destination that is not a unicast address and port; `NotConnected` when the flow is gone.
    pub fn udp_send_to(
        &mut self,
        id: FlowId,
        buf: &[u8],
        to: SocketAddr,
        waker: Option<&Waker>,
    ) -> Poll<io::Result<usize>> {
        self.udp_send(id, buf, to, 0, waker)
    }

    /// [`Stack::udp_send_to`], the datagram's two ECN bits set to `ecn` (when not 0).
    pub(super) fn udp_send(
        &mut self,
        id: FlowId,
        buf: &[u8],
        to: SocketAddr,
        ecn: u8,
        waker: Option<&Waker>,
    ) -> Poll<io::Result<usize>> {
        if to.port() == 0 || to.ip().is_unspecified() || to.ip().is_multicast() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot send to {to}: not a unicast address and port"),
            )));
        }
        let Some(s) = self.udp_sock(id) else {
            return Poll::Ready(Err(super::socket::gone()));
        };
        if buf.len() > s.send_capacity() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "datagram of {} bytes is larger than {} (the send queue or UDP's limit of \
                     {MAX_PAYLOAD})",
                    buf.len(),
                    s.send_capacity()
                ),
            )));
        }
        if s.write(IpEndpoint::from(to), buf, ecn & 3) {
            self.queue_egress(id.index);
            Poll::Ready(Ok(buf.len()))
        } else {
            if let Some(w) = waker {
                s.set_tx_waker(w);
            }
            Poll::Pending
        }
    }

    /// Ready when UDP flow `id`'s send queue has room for a datagram; `Pending` otherwise
    /// (`waker`, if given, is woken when room frees up).
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn udp_poll_writable(&mut self, id: FlowId, waker: Option<&Waker>) -> Poll<io::Result<()>> {
        let Some(s) = self.udp_sock(id) else {
            return Poll::Ready(Err(super::socket::gone()));
        };
        if s.has_room() {
            return Poll::Ready(Ok(()));
        }
        if let Some(w) = waker {
            s.set_tx_waker(w);
        }
        Poll::Pending
    }

    /// Takes the next datagram UDP flow `id` received: the bytes copied into `buf` (a longer
    /// datagram is cut to `buf`, as a kernel UDP socket does) and its sender. `Pending` means
    /// none is waiting (`waker`, if given, is woken when one arrives).
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone, or when none waits and a graceful shutdown began
    /// ([`Stack::begin_drain`]).
    pub fn udp_recv_from(
        &mut self,
        id: FlowId,
        buf: &mut [u8],
        waker: Option<&Waker>,
    ) -> Poll<io::Result<(usize, SocketAddr)>> {
        self.udp_take(id, buf, waker, false)
            .map_ok(|(n, from, _)| (n, from))
    }

    /// As [`Stack::udp_recv_from`], leaving the datagram queued.
    ///
    /// # Errors
    /// As [`Stack::udp_recv_from`].
    pub fn udp_peek_from(
        &mut self,
        id: FlowId,
        buf: &mut [u8],
        waker: Option<&Waker>,
    ) -> Poll<io::Result<(usize, SocketAddr)>> {
        self.udp_take(id, buf, waker, true)
            .map_ok(|(n, from, _)| (n, from))
    }

    /// A datagram waits on `id` (else `waker` is woken at the next), also in the drain.
    pub fn udp_wait_datagram(&mut self, id: FlowId, waker: &Waker) -> io::Result<bool> {
        let Some(s) = self.udp_sock(id) else {
            return Err(super::socket::gone());
        };
        if s.peek(&mut []).is_some() {
            return Ok(true);
        }
        s.set_rx_waker(waker);
        Ok(false)
    }

    /// The next datagram (taken, or left when `peek`): its length, sender and ECN bits.
    pub(super) fn udp_take(
        &mut self,
        id: FlowId,
        buf: &mut [u8],
        waker: Option<&Waker>,
        peek: bool,
    ) -> Poll<io::Result<(usize, SocketAddr, u8)>> {
        let max = buf.len();
        self.udp_take_with(id, max, &mut crate::copy::slice_put(buf), waker, peek)
    }

    /// The next datagram's first `max` bytes handed to `put` (taken, or left when `peek`): its
    /// length, sender and ECN bits.
    pub(super) fn udp_take_with(
        &mut self,
        id: FlowId,
        max: usize,
        put: &mut dyn FnMut(&[u8]),
        waker: Option<&Waker>,
        peek: bool,
    ) -> Poll<io::Result<(usize, SocketAddr, u8)>> {
        let draining = self.draining;
        let Some(s) = self.udp_sock(id) else {
            return Poll::Ready(Err(super::socket::gone()));
        };
        let ecn = s.front_ecn();
        let got = if peek {
            s.peek_with(max, put)
        } else {
            s.read_with(max, put)
        };
        match got {
            Some((n, p)) => Poll::Ready(Ok((n, SocketAddr::new(p.addr.into(), p.port), ecn))),
            None if draining => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "no datagram waits and the runtime is shutting down",
            ))),
            None => {
                if let Some(w) = waker {
                    s.set_rx_waker(w);
                }
                Poll::Pending
            }
        }
    }

    /// Gives UDP datagram `frame` (a whole frame, its checksums verified) to socket `index`.
    /// A known neighbour that sent it is confirmed (never learnt from it: see
    /// `Neighbors::confirm`).
    pub(super) fn udp_deliver(&mut self, now: Instant, index: u32, frame: &[u8]) {
        let Some((peer, _local, src_mac, payload)) = parse(frame) else {
            return;
        };
        if self.addrs.iter().any(|c| c.contains_addr(&peer.addr)) {
            self.neigh.confirm(peer.addr, src_mac, now);
        }
        if let Some(Sock::Udp(s)) = self.slots[index as usize]
            .flow
            .as_mut()
            .map(|f| &mut f.sock)
        {
            s.received(peer, payload, super::udp_opts::ecn_of(frame));
        }
    }

    /// Sends what UDP socket `index` has queued, up to `budget` datagrams. Returns when it
    /// needs the clock again (a next hop still unresolved).
    ///
    /// A datagram whose next hop has not answered is set aside ([`UdpSock::park`]) and the
    /// queue goes on: one silent neighbour (a spoofed on-link source, say) never holds the
    /// replies to the others. It goes out when the hop answers, or is dropped (counted) after
    /// `RESOLVE_WAIT`.
    pub(super) fn udp_output<P: FrameIo>(
        &mut self,
        now: Instant,
        dev: &mut XdpDevice<P>,
        index: u32,
        budget: usize,
        emitted: &mut usize,
    ) -> Option<Instant> {
        let (local_port, ttl, tos) = {
            let f = self.slots[index as usize].flow.as_ref()?;
            (f.local_port, f.ttl, f.tos)
        };
        let mut again = None;
        if self.udp_sock_at(index)?.parked() > 0 {
            let mut still = std::collections::VecDeque::new();
            for p in self.udp_sock_at(index)?.take_parked() {
                let local = self.udp_source(index, p.d.peer.addr);
                match (local, self.neighbor(p.hop, now)) {
                    (Some(local), Some((mac, _))) if *emitted < budget => {
                        if self.send_udp(
                            dev,
                            (mac, ttl, with_ecn(tos, p.d.ecn)),
                            local,
                            local_port,
                            p.d.peer,
                            &p.d.data,
                        ) {
                            self.udp_sock_at(index)?.finish(p.d, true);
                            *emitted += 1;
                        } else {
                            // No transmit frame free: again on the next pass.
                            still.push_back(p);
                            again = Some(now);
                        }
                    }
                    (Some(_), Some(_)) => still.push_back(p),
                    (Some(local), None) if now - p.since < RESOLVE_WAIT => {
                        self.ask(now, dev, local, p.hop);
                        still.push_back(p);
                    }
                    // Never answered, or no longer routable: dropped, counted.
                    _ => self.udp_sock_at(index)?.finish(p.d, false),
                }
            }
            self.udp_sock_at(index)?.restore_parked(still);
        }
        while *emitted < budget {
            let Some(peer) = self.udp_sock_at(index)?.next_peer() else {
                break;
            };
            let local = self.udp_source(index, peer.addr);
            let hop = self.next_hop(peer.addr);
            let (Some(local), Some(hop)) = (local, hop) else {
                self.udp_sock_at(index)?.drop_out();
                continue;
            };
            let Some((mac, fresh)) = self.neighbor(hop, now) else {
                self.ask(now, dev, local, hop);
                let s = self.udp_sock_at(index)?;
                if let Some(d) = s.pop_out() {
                    s.park(hop, d, now);
                }
                continue;
            };
            if !fresh {
                self.ask(now, dev, local, hop);
            }
            let d = self.udp_sock_at(index)?.pop_out()?;
            let hdr = (mac, ttl, with_ecn(tos, d.ecn));
            let sent = self.send_udp(dev, hdr, local, local_port, peer, &d.data);
            let s = self.udp_sock_at(index)?;
            if !sent {
                // No transmit frame free: again on the next pass.
                s.unpop(d);
                return Some(now);
            }
            s.finish(d, true);
            *emitted += 1;
        }
        if self.udp_sock_at(index)?.parked() > 0 {
            // Polled again when an address is learnt, or on this retry timer.
            if !self.unresolved.contains(&index) {
                self.unresolved.push(index);
            }
            let retry = now + Duration::from_millis(200);
            again = Some(again.map_or(retry, |t: Instant| t.min(retry)));
        }
        self.udp_free_if_drained(index);
        again
    }

    /// The socket of UDP flow `index` was dropped: what it queued is still sent (a kernel
    /// socket's datagrams are the kernel's once `send` returns), then the flow is freed. It
    /// takes no more datagrams meanwhile; its port stays taken until it is freed.
    pub(super) fn udp_release(&mut self, index: u32) {
        let queued = self
            .udp_sock_at(index)
            .is_some_and(|s| s.next_peer().is_some() || s.parked() > 0);
        if !queued {
            self.free(index);
            return;
        }
        if let Some(f) = self.slots[index as usize].flow.as_ref() {
            let port = f.local_port;
            if self.udp.get(&port) == Some(&index) {
                self.udp.remove(&port);
            }
        }
        self.queue_egress(index);
    }

    /// The address UDP flow `index`'s datagrams to `peer` leave from: the one it was bound to
    /// (of the peer's family), else the owned address routing picks.
    fn udp_source(&mut self, index: u32, peer: IpAddress) -> Option<IpAddress> {
        let bound = self.udp_sock_at(index).and_then(|s| s.bound);
        match bound {
            Some(b) if b.version() == peer.version() => Some(b),
            _ => self.local_addr_for(peer).ok(),
        }
    }

    /// Datagrams of UDP flow `id` leave from `ip` from now on (a socket bound to an owned
    /// address, as the kernel's sends from the address it was bound to); None: from the owned
    /// address routing picks for each.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn udp_set_source(&mut self, id: FlowId, ip: Option<std::net::IpAddr>) -> io::Result<()> {
        let s = self.udp_sock(id).ok_or_else(super::socket::gone)?;
        s.bound = ip.map(IpAddress::from);
        Ok(())
    }

    /// Frees released UDP flow `index` once its queues are empty.
    fn udp_free_if_drained(&mut self, index: u32) {
        let released = self.slots[index as usize]
            .flow
            .as_ref()
            .is_some_and(|f| !f.held);
        let empty = self
            .udp_sock_at(index)
            .is_some_and(|s| s.next_peer().is_none() && s.parked() == 0);
        if released && empty {
            self.free(index);
        }
    }

    pub(super) fn udp_sock_at(&mut self, index: u32) -> Option<&mut UdpSock> {
        match &mut self.slots[index as usize].flow.as_mut()?.sock {
            Sock::Udp(s) => Some(s),
            Sock::Tcp(_) => None,
        }
    }

    /// Writes one datagram into transmit frames: one frame, written in place, when it fits
    /// the MTU; IP fragments when not. False when no transmit frame was free (nothing sent).
    fn send_udp<P: FrameIo>(
        &mut self,
        dev: &mut XdpDevice<P>,
        (dst_mac, ttl, tos): ([u8; 6], u8, u8),
        local: IpAddress,
        local_port: u16,
        peer: IpEndpoint,
        data: &[u8],
    ) -> bool {
        let ip_len = if matches!(local, IpAddress::Ipv4(_)) {
            20
        } else {
            40
        };
        let udp_len = 8 + data.len();
        let (src, dst) = (octets(local), octets(peer.addr));
        let write_udp = |seg: &mut [u8]| {
            seg[..2].copy_from_slice(&local_port.to_be_bytes());
            seg[2..4].copy_from_slice(&peer.port.to_be_bytes());
            seg[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            seg[6..8].fill(0);
            seg[8..].copy_from_slice(data);
            let c = checksum(&src, &dst, 17, seg);
            // All zero means "no checksum" in IPv4 and is invalid in IPv6: send all ones.
            let c = if c == 0 { 0xffff } else { c };
            seg[6..8].copy_from_slice(&c.to_ne_bytes());
        };
        if ip_len + udp_len <= self.mtu {
            let Some(tx) = dev.transmit(Instant::ZERO) else {
                return false;
            };
            // Fits the MTU: sent with DF, an atomic datagram with identification 0.
            let (mac, id) = (self.mac, 0);
            smoltcp::phy::TxToken::consume(tx, 14 + ip_len + udp_len, |buf| {
                buf[..6].copy_from_slice(&dst_mac);
                buf[6..12].copy_from_slice(&mac);
                if crate::frag::write_ip_header(buf, local, peer.addr, 17, udp_len, id, None)
                    .is_some()
                {
                    write_udp(&mut buf[14 + ip_len..]);
                    crate::frag::set_ttl(buf, ttl);
                    crate::frag::set_tos(buf, tos);
                }
            });
            return true;
        }
        let mut seg = vec![0u8; udp_len];
        write_udp(&mut seg);
        let id = self.ids.next(&src, &dst, 17);
        let frames =
            crate::frag::fragment(dst_mac, self.mac, local, peer.addr, 17, id, &seg, self.mtu);
        self.frag.count_fragmented();
        let mut any = false;
        for f in &frames {
            let Some(tx) = dev.transmit(Instant::ZERO) else {
                return any;
            };
            smoltcp::phy::TxToken::consume(tx, f.len(), |buf| {
                buf.copy_from_slice(f);
                crate::frag::set_ttl(buf, ttl);
                crate::frag::set_tos(buf, tos);
            });
            any = true;
        }
        any
    }

    /// Answers a datagram for a port no socket holds with ICMP "port unreachable" (at most a
    /// burst of 50, then one per millisecond); never to a broadcast or multicast sender.
    pub(super) fn udp_unreachable<P: FrameIo>(&mut self, now: Instant, dev: &mut XdpDevice<P>) {
        let Some(frame) = dev.front_bytes() else {
            return;
        };
        let ms = now.total_millis();
        let refill = ms.saturating_sub(self.icmp_at).max(0) as u32;
        self.icmp_tokens = (self.icmp_tokens + refill).min(ICMP_BURST);
        self.icmp_at = ms;
        if self.icmp_tokens == 0 {
            self.stats.icmp_limited += 1;
            return;
        }
        let Some(reply) = unreachable_for(frame, self.mac) else {
            return;
        };
        self.icmp_tokens -= 1;
        if let Some(tx) = dev.transmit(now) {
            smoltcp::phy::TxToken::consume(tx, reply.len(), |b| b.copy_from_slice(&reply));
            self.stats.icmp_unreachable_sent += 1;
        }
    }
}

/// The address's bytes (4 or 16).
/// The type of service (traffic class) `tos` with a datagram's own ECN bits, when it has any.
fn with_ecn(tos: u8, ecn: u8) -> u8 {
    if ecn == 0 {
        tos
    } else {
        (tos & !3) | (ecn & 3)
    }
}

fn octets(a: IpAddress) -> Vec<u8> {
    match a {
        IpAddress::Ipv4(v) => v.octets().to_vec(),
        IpAddress::Ipv6(v) => v.octets().to_vec(),
    }
}

/// ICMP "port unreachable" (type 3 code 3, or ICMPv6 type 1 code 4) for the UDP datagram in
/// `frame`, quoting as much of it as a minimal MTU allows (RFC 1812 4.3.2.3, RFC 4443 2.4).
fn unreachable_for(frame: &[u8], mac: [u8; 6]) -> Option<Vec<u8>> {
    let src_mac: [u8; 6] = frame.get(6..12)?.try_into().ok()?;
    if src_mac[0] & 1 == 1 {
        return None;
    }
    let ip = frame.get(14..)?;
    match frame.get(12..14)? {
        [0x08, 0x00] => {
            let src: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
            let dst: [u8; 4] = ip.get(16..20)?.try_into().ok()?;
            let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
            let quote = ip.get(..total.min(576 - 28))?;
            let mut icmp = vec![3, 3, 0, 0, 0, 0, 0, 0];
            icmp.extend_from_slice(quote);
            let c = inet_checksum(&icmp);
            icmp[2..4].copy_from_slice(&c.to_ne_bytes());
            let frames = crate::frag::fragment(
                src_mac,
                mac,
                IpAddress::Ipv4(dst.into()),
                IpAddress::Ipv4(src.into()),
                1,
                0,
                &icmp,
                576,
            );
            frames.into_iter().next()
        }
        [0x86, 0xdd] => {
            let src: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            let dst: [u8; 16] = ip.get(24..40)?.try_into().ok()?;
            let plen = usize::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]));
            let quote = ip.get(..(40 + plen).min(1280 - 48))?;
            let mut icmp = vec![1, 4, 0, 0, 0, 0, 0, 0];
            icmp.extend_from_slice(quote);
            let mut f = super::ndisc::icmp6_frame(src_mac, mac, dst, src, &icmp);
            // An error is not neighbour discovery: an ordinary hop limit.
            f[14 + 7] = 64;
            Some(f)
        }
        _ => None,
    }
}
