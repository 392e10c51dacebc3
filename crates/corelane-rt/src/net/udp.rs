//! A UDP socket on the current core.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use corelane_stack::{FlowId, Proto};

use crate::lane::{Core, current};
use crate::net::ToSocketAddr;

/// A UDP socket on the current core.
///
/// ```no_run
/// # use corelane_rt as corelane;
/// # async fn f() -> std::io::Result<()> {
/// use corelane::net::UdpSocket;
/// // Inside a task of Runtime::run, on every core:
/// let sock = UdpSocket::bind(7).await?;
/// let mut buf = vec![0; 2048];
/// loop {
///     let (n, peer) = sock.recv_from(&mut buf).await?;
///     sock.send_to(&buf[..n], peer).await?;
/// }
/// # }
/// ```
pub struct UdpSocket {
    pub(super) core: Arc<Core>,
    pub(super) id: FlowId,
    port: u16,
    /// The address given to `bind` (unspecified: every owned one).
    ip: std::net::IpAddr,
    pub(super) peer: crate::net::SyncCell<Option<SocketAddr>>,
}

impl std::fmt::Debug for UdpSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpSocket")
            .field("core", &self.core.index)
            .field("port", &self.port)
            .finish()
    }
}

impl UdpSocket {
    /// Binds a port on every owned address: `addr` is a port (`7`) or an address and port as
    /// tokio takes it (`"0.0.0.0:7"`, `(ip, 7)`, a `SocketAddr`; the address must be the
    /// unspecified one or an owned one; the socket takes datagrams to any owned address, and
    /// one bound to an owned address sends from it, as a kernel socket does).
    /// Port 0 picks a port this core owns, so replies come here. To serve one port from every
    /// core, bind it on every core.
    ///
    /// # Errors
    /// `InvalidInput` for text that is not an address, `AddrNotAvailable` for an address the
    /// runtime does not own or when no ephemeral port is free, `AddrInUse` when this core
    /// already has the port or, on an address shared with the kernel, when a kernel socket
    /// holds it (the message names the socket; port 0 picks past such ports), and `Other`
    /// outside a corelane core.
    pub async fn bind(addr: impl ToSocketAddr) -> io::Result<UdpSocket> {
        UdpSocket::bind_now(addr.to_socket_addr()?)
    }

    /// [`UdpSocket::bind`], which waits for nothing.
    pub(crate) fn bind_now(sa: SocketAddr) -> io::Result<UdpSocket> {
        let core = current()?;
        let owned = core
            .stack()
            .addrs()
            .iter()
            .any(|c| std::net::IpAddr::from(c.address()) == sa.ip());
        if !sa.ip().is_unspecified() && !owned {
            return Err(corelane_stack::StackError::NotOwned(sa.ip()).into());
        }
        // Port 0 on an address shared with the kernel: a port a kernel socket holds is
        // refused (`AddrInUse`), and the stack's next pick is tried, up to 16.
        let mut tries = 0;
        let (id, port) = loop {
            let (id, port) = core.stack().bind_udp(sa.port())?;
            let Err(e) = core.own_port(Proto::Udp, port) else {
                break (id, port);
            };
            core.stack().release(id);
            tries += 1;
            if sa.port() != 0 || e.kind() != io::ErrorKind::AddrInUse || tries == 16 {
                return Err(e);
            }
        };
        if !sa.ip().is_unspecified() {
            // Its datagrams leave from the address it was bound to, as a kernel socket's do.
            core.stack().udp_set_source(id, Some(sa.ip()))?;
        }
        Ok(UdpSocket {
            core,
            id,
            port,
            ip: sa.ip(),
            peer: crate::net::SyncCell::new(None),
        })
    }

    /// The bound port.
    pub fn local_port(&self) -> u16 {
        self.port
    }

    /// Sends one datagram to `addr`.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// # async fn f() -> std::io::Result<()> {
    /// use corelane::net::UdpSocket;
    /// // Inside a task of Runtime::run:
    /// let sock = UdpSocket::bind(0).await?;
    /// sock.send_to(b"ping", "10.0.0.2:9000").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `InvalidInput` for a datagram larger than the send buffer or an address the stack
    /// cannot send to.
    ///
    /// # Cancel safety
    /// Cancel safe: the datagram is queued whole or not at all.
    pub async fn send_to(&self, buf: &[u8], addr: impl ToSocketAddr) -> io::Result<usize> {
        let addr = addr.to_socket_addr()?;
        let sent = poll_fn(|cx| {
            self.core
                .stack()
                .udp_send_to(self.id, buf, addr, Some(cx.waker()))
        })
        .await?;
        self.core.wake_driver();
        Ok(sent)
    }

    /// Receives one datagram; returns the bytes copied into `buf` and its sender. A datagram
    /// longer than `buf` is cut to it, the rest lost (as tokio's, on Linux).
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// # async fn f() -> std::io::Result<()> {
    /// use corelane::net::UdpSocket;
    /// // A UDP echo server, inside a task of Runtime::run:
    /// let sock = UdpSocket::bind(7).await?;
    /// let mut buf = vec![0; 65_507];
    /// loop {
    ///     let (n, from) = sock.recv_from(&mut buf).await?;
    ///     sock.send_to(&buf[..n], from).await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `NotConnected` when no datagram waits and the runtime is shutting down
    /// ([`StopHandle::shutdown`](crate::StopHandle::shutdown)).
    ///
    /// # Cancel safety
    /// Cancel safe: a datagram is taken only when this returns it.
    pub async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        poll_fn(|cx| {
            self.core
                .stack()
                .udp_recv_from(self.id, buf, Some(cx.waker()))
        })
        .await
    }

    /// Copies the next datagram into `buf` without taking it: the next `recv_from` returns it
    /// again. A datagram longer than `buf` is cut to it here (and whole to a later receive
    /// with room).
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// # async fn f() -> std::io::Result<()> {
    /// use corelane::net::UdpSocket;
    /// let sock = UdpSocket::bind(5353).await?;
    /// let mut head = [0u8; 2];
    /// // Look at the first two bytes, then take the datagram with a buffer that fits it.
    /// let (_, from) = sock.peek_from(&mut head).await?;
    /// let mut whole = vec![0; 65_507];
    /// let (n, _) = sock.recv_from(&mut whole).await?;
    /// println!("{n} bytes from {from}, starting {head:?}");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`recv_from`](Self::recv_from).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn peek_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        poll_fn(|cx| {
            self.core
                .stack()
                .udp_peek_from(self.id, buf, Some(cx.waker()))
        })
        .await
    }

    /// The local address, as the kernel reports a socket's: the address given to `bind`;
    /// for one bound to the unspecified address and connected, the owned address its
    /// datagrams to the peer leave from; otherwise the unspecified address (`0.0.0.0:port`).
    ///
    /// # Errors
    /// None today; the signature is tokio's.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        let ip = match self.peer.get() {
            Some(peer) if self.ip.is_unspecified() => {
                self.core.stack().source_for(peer.ip()).unwrap_or(self.ip)
            }
            _ => self.ip,
        };
        Ok(SocketAddr::new(ip, self.port))
    }

    /// Broadcast sends are not supported: `false` is accepted, `true` refused.
    ///
    /// # Errors
    /// `Unsupported` for `true`.
    pub fn set_broadcast(&self, on: bool) -> io::Result<()> {
        if on {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "corelane does not send UDP broadcasts",
            ));
        }
        Ok(())
    }

    /// Broadcast sends are never on.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn broadcast(&self) -> io::Result<bool> {
        Ok(false)
    }

    /// Sets the default peer: [`send`](Self::send) goes to it and [`recv`](Self::recv) takes
    /// only its datagrams.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// # async fn f() -> std::io::Result<()> {
    /// use corelane::net::UdpSocket;
    /// let sock = UdpSocket::bind(0).await?;
    /// sock.connect("10.0.0.2:53").await?;
    /// sock.send(b"query").await?;
    /// let mut buf = [0; 512];
    /// let n = sock.recv(&mut buf).await?;
    /// # let _ = n;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `InvalidInput` for text that is not an address.
    ///
    /// # Cancel safety
    /// Cancel safe: it completes at once (no name is resolved).
    pub async fn connect(&self, addr: impl ToSocketAddr) -> io::Result<()> {
        self.peer.set(Some(addr.to_socket_addr()?));
        Ok(())
    }

    /// The connected peer.
    ///
    /// # Errors
    /// `NotConnected` before [`connect`](Self::connect).
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.peer
            .get()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "not connected"))
    }

    /// Sends to the connected peer (see [`connect`](Self::connect) for an example).
    ///
    /// # Errors
    /// `NotConnected` before [`connect`](Self::connect); `ConnectionRefused` once after an
    /// ICMP error said the peer refused a datagram; as [`send_to`](Self::send_to).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn send(&self, buf: &[u8]) -> io::Result<usize> {
        let peer = self.peer_addr()?;
        self.refused(peer)?;
        self.send_to(buf, peer).await
    }

    /// `ConnectionRefused` once when an ICMP error said the connected peer `peer` refused a
    /// datagram from here (as the kernel's connected UDP socket reports `ECONNREFUSED`).
    pub(super) fn refused(&self, peer: SocketAddr) -> io::Result<()> {
        if self.core.stack().udp_take_refused(self.id, peer) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("{peer} refused a datagram from here (ICMP destination unreachable)"),
            ));
        }
        Ok(())
    }

    /// Receives from the connected peer (datagrams from others are dropped; see
    /// [`connect`](Self::connect) for an example).
    ///
    /// # Errors
    /// `NotConnected` before [`connect`](Self::connect); `ConnectionRefused` once after an
    /// ICMP error said the peer refused a datagram; as [`recv_from`](Self::recv_from).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut rb = tokio::io::ReadBuf::new(buf);
        poll_fn(|cx| self.poll_recv(cx, &mut rb)).await?;
        Ok(rb.filled().len())
    }
}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        self.core.stack().release(self.id);
    }
}
