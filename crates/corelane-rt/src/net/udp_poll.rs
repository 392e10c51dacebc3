//! A UDP socket's `poll_*` calls (for code that drives a socket by hand: a `Future` or
//! `Stream` of its own, quinn's `AsyncUdpSocket`), the peeks at a datagram's sender, and the
//! IP options tokio offers beside the TTL: type of service, traffic class and multicast.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::task::{Context, Poll};

use tokio::io::ReadBuf;

use super::UdpSocket;

impl UdpSocket {
    /// Polls until the send queue has room: `Ready(Ok(()))`, or `Pending` with `cx`'s waker
    /// registered (the waker of the last call only, as tokio's).
    ///
    /// # Errors
    /// `NotConnected` when the socket is gone.
    pub fn poll_send_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.core
            .stack()
            .udp_poll_writable(self.id, Some(cx.waker()))
    }

    /// Polls until a datagram waits: `Ready(Ok(()))`, or `Pending` with `cx`'s waker
    /// registered.
    ///
    /// # Errors
    /// `NotConnected` when the socket is gone.
    pub fn poll_recv_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self
            .core
            .stack()
            .udp_peek_from(self.id, &mut [], Some(cx.waker()))
        {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(_)) => Poll::Ready(Ok(())),
            Poll::Pending => Poll::Pending,
        }
    }

    /// `Ready` once a datagram waits, also while the runtime shuts down (where
    /// [`poll_recv_ready`](Self::poll_recv_ready) is ready at once, with an error): for a
    /// protocol above UDP that finishes its connections in the shutdown's drain.
    #[cfg(feature = "quic")]
    pub(crate) fn poll_datagram(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.core.stack().udp_wait_datagram(self.id, cx.waker()) {
            Ok(true) => Poll::Ready(Ok(())),
            Ok(false) => Poll::Pending,
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// Marks the socket as a QUIC endpoint's: short-header datagrams whose connection ID
    /// names another core go to that core (and the IDs this core makes: returned).
    #[cfg(feature = "quic")]
    pub(crate) fn steer_quic(&self) -> io::Result<corelane_stack::quic_cid::CidSteer> {
        let mut stack = self.core.stack();
        stack.udp_steer_quic(self.id, true)?;
        Ok(stack.quic_cid_steer())
    }

    /// [`try_recv_from`](Self::try_recv_from) with the datagram's ECN bits (a QUIC
    /// endpoint's read).
    #[cfg(feature = "quic")]
    pub(crate) fn try_recv_from_ecn(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr, u8)> {
        match self.core.stack().udp_recv_from_ecn(self.id, buf, None) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// [`send_to`](Self::send_to) with the datagram's ECN bits (a QUIC endpoint's send).
    #[cfg(feature = "quic")]
    pub(crate) async fn send_to_ecn(
        &self,
        buf: &[u8],
        to: SocketAddr,
        ecn: u8,
    ) -> io::Result<usize> {
        let sent = std::future::poll_fn(|cx| {
            self.core
                .stack()
                .udp_send_to_ecn(self.id, buf, to, ecn, Some(cx.waker()))
        })
        .await?;
        self.core.wake_driver();
        Ok(sent)
    }

    /// Queues one datagram to `target`, or `Pending` (waker registered) while the send queue
    /// is full.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// # async fn f() -> std::io::Result<()> {
    /// use std::future::poll_fn;
    /// use corelane::net::UdpSocket;
    /// let sock = UdpSocket::bind(0).await?;
    /// let to = "10.0.0.2:9000".parse().unwrap();
    /// let n = poll_fn(|cx| sock.poll_send_to(cx, b"ping", to)).await?;
    /// # let _ = n;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`send_to`](Self::send_to).
    pub fn poll_send_to(
        &self,
        cx: &mut Context<'_>,
        buf: &[u8],
        target: SocketAddr,
    ) -> Poll<io::Result<usize>> {
        let r = self
            .core
            .stack()
            .udp_send_to(self.id, buf, target, Some(cx.waker()));
        if r.is_ready() {
            self.core.wake_driver();
        }
        r
    }

    /// Queues one datagram to the connected peer, as [`poll_send_to`](Self::poll_send_to).
    ///
    /// # Errors
    /// `NotConnected` before [`connect`](Self::connect); as [`send_to`](Self::send_to).
    pub fn poll_send(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.peer_addr().and_then(|p| self.refused(p).map(|()| p)) {
            Ok(peer) => self.poll_send_to(cx, buf, peer),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// Takes the next datagram into `buf`'s unfilled part (a longer one is cut to it), or
    /// `Pending` (waker registered) while none waits; its sender.
    ///
    /// # Errors
    /// As [`recv_from`](Self::recv_from).
    pub fn poll_recv_from(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<SocketAddr>> {
        // Into the buffer's free part as it is (zeroing it first cost a pass over all of it, 64
        // KiB a datagram for a framed reader's buffer).
        let max = buf.remaining();
        self.core
            .stack()
            .udp_recv_from_with(self.id, max, |d| buf.put_slice(d), Some(cx.waker()))
            .map_ok(|(_, from)| from)
    }

    /// Takes the next datagram from the connected peer (others are dropped), as
    /// [`poll_recv_from`](Self::poll_recv_from).
    ///
    /// # Errors
    /// `NotConnected` before [`connect`](Self::connect); as [`recv_from`](Self::recv_from).
    pub fn poll_recv(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let peer = match self.peer_addr().and_then(|p| self.refused(p).map(|()| p)) {
            Ok(p) => p,
            Err(e) => return Poll::Ready(Err(e)),
        };
        loop {
            let start = buf.filled().len();
            match self.poll_recv_from(cx, buf) {
                Poll::Ready(Ok(from)) if from != peer => {
                    // Not the peer's: dropped, as the kernel's filter would have.
                    buf.set_filled(start);
                }
                Poll::Ready(r) => return Poll::Ready(r.map(|_| ())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Copies the next datagram into `buf`'s unfilled part without taking it, or `Pending`
    /// (waker registered) while none waits; its sender.
    ///
    /// # Errors
    /// As [`peek_from`](Self::peek_from).
    pub fn poll_peek_from(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<SocketAddr>> {
        let max = buf.remaining();
        self.core
            .stack()
            .udp_peek_from_with(self.id, max, |d| buf.put_slice(d), Some(cx.waker()))
            .map_ok(|(_, from)| from)
    }

    /// Copies the next datagram from the connected peer into `buf` without taking it (one
    /// from another sender is dropped), as [`poll_peek_from`](Self::poll_peek_from).
    ///
    /// # Errors
    /// `NotConnected` before [`connect`](Self::connect); as [`peek_from`](Self::peek_from).
    pub fn poll_peek(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let peer = match self.peer_addr() {
            Ok(p) => p,
            Err(e) => return Poll::Ready(Err(e)),
        };
        loop {
            let start = buf.filled().len();
            match self.poll_peek_from(cx, buf) {
                Poll::Ready(Ok(from)) if from != peer => {
                    buf.set_filled(start);
                    let _ = self.core.stack().udp_recv_from(self.id, &mut [], None);
                }
                Poll::Ready(r) => return Poll::Ready(r.map(|_| ())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Copies the next datagram into `buf` without taking it or waiting: its length (cut to
    /// `buf`) and sender.
    ///
    /// # Errors
    /// `WouldBlock` when none waits; otherwise as [`peek_from`](Self::peek_from).
    pub fn try_peek_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        match self.core.stack().udp_peek_from(self.id, buf, None) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Copies the next datagram from the connected peer into `buf` without taking it or
    /// waiting (one from another sender is dropped).
    ///
    /// # Errors
    /// `NotConnected` before [`connect`](Self::connect); `WouldBlock` when none waits.
    pub fn try_peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        let peer = self.peer_addr()?;
        loop {
            let (n, from) = self.try_peek_from(buf)?;
            if from == peer {
                return Ok(n);
            }
            let _ = self.try_recv_from(&mut []);
        }
    }

    /// The sender of the next datagram, which stays queued.
    ///
    /// # Errors
    /// As [`peek_from`](Self::peek_from).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn peek_sender(&self) -> io::Result<SocketAddr> {
        std::future::poll_fn(|cx| self.poll_peek_sender(cx)).await
    }

    /// The sender of the next datagram, which stays queued, or `Pending` (waker registered)
    /// while none waits.
    ///
    /// # Errors
    /// As [`peek_from`](Self::peek_from).
    pub fn poll_peek_sender(&self, cx: &mut Context<'_>) -> Poll<io::Result<SocketAddr>> {
        self.core
            .stack()
            .udp_peek_from(self.id, &mut [], Some(cx.waker()))
            .map(|r| r.map(|(_, from)| from))
    }

    /// The sender of the next datagram, which stays queued, without waiting.
    ///
    /// # Errors
    /// `WouldBlock` when none waits; otherwise as [`peek_from`](Self::peek_from).
    pub fn try_peek_sender(&self) -> io::Result<SocketAddr> {
        self.try_peek_from(&mut []).map(|(_, from)| from)
    }

    /// Sets the IPv4 type of service of the datagrams this socket sends (`IP_TOS`: all eight
    /// bits, ECN's two included, as the kernel's UDP).
    ///
    /// # Errors
    /// `InvalidInput` for more than 255; `NotConnected` when the socket is gone.
    pub fn set_tos_v4(&self, tos: u32) -> io::Result<()> {
        self.core.stack().udp_set_tos(self.id, tos)
    }

    /// The IPv4 type of service of the datagrams this socket sends (0 unless set).
    ///
    /// # Errors
    /// `NotConnected` when the socket is gone.
    pub fn tos_v4(&self) -> io::Result<u32> {
        self.core.stack().udp_tos(self.id)
    }

    /// As [`set_tos_v4`](Self::set_tos_v4) (tokio's older name).
    ///
    /// # Errors
    /// As [`set_tos_v4`](Self::set_tos_v4).
    #[deprecated(note = "use `set_tos_v4`, as tokio says")]
    pub fn set_tos(&self, tos: u32) -> io::Result<()> {
        self.set_tos_v4(tos)
    }

    /// As [`tos_v4`](Self::tos_v4) (tokio's older name).
    ///
    /// # Errors
    /// As [`tos_v4`](Self::tos_v4).
    #[deprecated(note = "use `tos_v4`, as tokio says")]
    pub fn tos(&self) -> io::Result<u32> {
        self.tos_v4()
    }

    /// Sets the IPv6 traffic class of the datagrams this socket sends (`IPV6_TCLASS`; the
    /// same byte as [`set_tos_v4`](Self::set_tos_v4) sets for IPv4).
    ///
    /// # Errors
    /// `InvalidInput` for more than 255; `NotConnected` when the socket is gone.
    pub fn set_tclass_v6(&self, tclass: u32) -> io::Result<()> {
        self.set_tos_v4(tclass)
    }

    /// The IPv6 traffic class of the datagrams this socket sends (0 unless set).
    ///
    /// # Errors
    /// `NotConnected` when the socket is gone.
    pub fn tclass_v6(&self) -> io::Result<u32> {
        self.tos_v4()
    }

    /// Multicast loopback: on, as a kernel socket's is by default. corelane neither sends to
    /// nor joins multicast groups, so this never changes.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn multicast_loop_v4(&self) -> io::Result<bool> {
        Ok(true)
    }

    /// Refused: corelane neither sends to nor joins multicast groups.
    ///
    /// # Errors
    /// `Unsupported`, always.
    pub fn set_multicast_loop_v4(&self, on: bool) -> io::Result<()> {
        let _ = on;
        Err(no_multicast())
    }

    /// The TTL of multicast datagrams: 1, the kernel's default (corelane sends none).
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn multicast_ttl_v4(&self) -> io::Result<u32> {
        Ok(1)
    }

    /// Refused: corelane neither sends to nor joins multicast groups.
    ///
    /// # Errors
    /// `Unsupported`, always.
    pub fn set_multicast_ttl_v4(&self, ttl: u32) -> io::Result<()> {
        let _ = ttl;
        Err(no_multicast())
    }

    /// Multicast loopback over IPv6: on, as a kernel socket's is by default (corelane sends
    /// no multicast).
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn multicast_loop_v6(&self) -> io::Result<bool> {
        Ok(true)
    }

    /// Refused: corelane neither sends to nor joins multicast groups.
    ///
    /// # Errors
    /// `Unsupported`, always.
    pub fn set_multicast_loop_v6(&self, on: bool) -> io::Result<()> {
        let _ = on;
        Err(no_multicast())
    }

    /// Refused: corelane's XDP program steers no multicast group to its sockets.
    ///
    /// # Errors
    /// `Unsupported`, always.
    pub fn join_multicast_v4(&self, group: Ipv4Addr, interface: Ipv4Addr) -> io::Result<()> {
        let _ = (group, interface);
        Err(no_multicast())
    }

    /// Refused: corelane's XDP program steers no multicast group to its sockets.
    ///
    /// # Errors
    /// `Unsupported`, always.
    pub fn join_multicast_v6(&self, group: &Ipv6Addr, interface: u32) -> io::Result<()> {
        let _ = (group, interface);
        Err(no_multicast())
    }

    /// Refused: no group can have been joined.
    ///
    /// # Errors
    /// `Unsupported`, always.
    pub fn leave_multicast_v4(&self, group: Ipv4Addr, interface: Ipv4Addr) -> io::Result<()> {
        let _ = (group, interface);
        Err(no_multicast())
    }

    /// Refused: no group can have been joined.
    ///
    /// # Errors
    /// `Unsupported`, always.
    pub fn leave_multicast_v6(&self, group: &Ipv6Addr, interface: u32) -> io::Result<()> {
        let _ = (group, interface);
        Err(no_multicast())
    }
}

fn no_multicast() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "corelane neither sends to nor joins multicast groups (its XDP program steers unicast \
         flows only); use a kernel socket for multicast",
    )
}
