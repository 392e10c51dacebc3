//! A TCP connection on the current core.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use corelane_stack::{Congestion, FlowId, Proto, TcpInfo, TcpState};

use super::{Conn, OwnedReadHalf, OwnedWriteHalf, ReadHalf, WriteHalf, async_read, async_write};
use crate::lane::{Core, current};
use crate::net::ToSocketAddr;

/// A TCP connection on the current core, with tokio's `AsyncRead` and `AsyncWrite`.
///
/// ```no_run
/// # use corelane_rt as corelane;
/// # async fn f() -> std::io::Result<()> {
/// use corelane::net::TcpStream;
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// // Inside a task of Runtime::run:
/// let mut s = TcpStream::connect("10.0.0.2:7").await?;
/// s.write_all(b"ping").await?;
/// let mut buf = [0; 4];
/// s.read_exact(&mut buf).await?;
/// # Ok(()) }
/// ```
pub struct TcpStream {
    pub(super) conn: Arc<Conn>,
}

impl std::fmt::Debug for TcpStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStream")
            .field("core", &self.conn.core.index)
            .field("peer", &self.peer_addr().ok())
            .finish()
    }
}

impl TcpStream {
    /// The stream of connection `id`; an accepted one (`accepted`) starts out assumed
    /// readable, as tokio's does, a connected one not.
    pub(crate) fn new(core: Arc<Core>, id: FlowId, accepted: bool) -> TcpStream {
        TcpStream::from_conn(Arc::new(Conn {
            core,
            id,
            linger: super::Linger::new(None),
            write_ready: std::sync::atomic::AtomicBool::new(true),
            read_ready: std::sync::atomic::AtomicBool::new(accepted),
            quickack: std::sync::atomic::AtomicBool::new(true),
        }))
    }

    pub(crate) fn from_conn(conn: Arc<Conn>) -> TcpStream {
        TcpStream { conn }
    }

    fn conn(&self) -> &Conn {
        &self.conn
    }

    /// Connects to `addr` (a `SocketAddr`, `(ip, port)` or `"10.0.0.5:80"`; names are not
    /// resolved) from an owned address of the same family. The local port is one this
    /// core owns, so the peer's replies come to this core whatever queue they arrive on. Bound
    /// the wait with `tokio::time::timeout`.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// # async fn f() -> std::io::Result<()> {
    /// use corelane::net::TcpStream;
    /// use std::time::Duration;
    /// // Inside a task of Runtime::run:
    /// let s = tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(("10.0.0.2", 80)))
    ///     .await
    ///     .map_err(|_| std::io::ErrorKind::TimedOut)??;
    /// println!("connected from {}", s.local_addr()?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `ConnectionRefused` when the peer resets the attempt; `AddrNotAvailable` with no owned
    /// address of `addr`'s family or no free port; `Other` outside a corelane core.
    ///
    /// # Cancel safety
    /// Dropping the future abandons the attempt: the half-open connection is released.
    pub async fn connect(addr: impl ToSocketAddr) -> io::Result<TcpStream> {
        let addr = addr.to_socket_addr()?;
        Self::connect_with(addr, corelane_stack::ConnectOptions::default()).await
    }

    /// As `connect`, from the local address and port and with the buffers of `opts`.
    pub(crate) async fn connect_with(
        addr: SocketAddr,
        opts: corelane_stack::ConnectOptions,
    ) -> io::Result<TcpStream> {
        let core = current()?;
        // On an address shared with the kernel, a port a kernel socket holds is refused
        // (`AddrInUse`): the stack's next pick is another port.
        let mut tries = 0;
        let (stream, id) = loop {
            let (id, port) = core.stack().connect_tcp_with(addr, opts)?;
            // From here the flow is released if this future is dropped.
            let stream = TcpStream::new(core.clone(), id, false);
            match core.own_port(Proto::Tcp, port) {
                Ok(()) => break (stream, id),
                Err(e) => {
                    stream.abort();
                    tries += 1;
                    if e.kind() != io::ErrorKind::AddrInUse || tries == 16 {
                        return Err(e);
                    }
                }
            }
        };
        core.wake_driver();
        poll_fn(|cx| core.stack().tcp_connected(id, Some(cx.waker()))).await?;
        Ok(stream)
    }

    /// The peer's address.
    ///
    /// # Errors
    /// `NotConnected` when the connection is gone.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.addrs().map(|(_, remote)| remote)
    }

    /// This side's address.
    ///
    /// # Errors
    /// `NotConnected` when the connection is gone.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.addrs().map(|(local, _)| local)
    }

    fn addrs(&self) -> io::Result<(SocketAddr, SocketAddr)> {
        self.conn
            .core
            .stack()
            .tcp_addrs(self.conn.id)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "the connection is gone"))
    }

    /// Sends small writes at once (true, the default) or coalesces them (Nagle).
    ///
    /// # Errors
    /// `NotConnected` when the connection is gone.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.conn
            .core
            .stack()
            .tcp_set_nodelay(self.conn.id, nodelay)
    }

    /// Whether small writes go out at once.
    ///
    /// # Errors
    /// `NotConnected` when the connection is gone.
    pub fn nodelay(&self) -> io::Result<bool> {
        self.conn.core.stack().tcp_nodelay(self.conn.id)
    }

    /// Sends keep-alive probes after `interval` of silence (None: off, the default).
    ///
    /// # Errors
    /// `NotConnected` when the connection is gone.
    pub fn set_keepalive(&self, interval: Option<Duration>) -> io::Result<()> {
        self.conn
            .core
            .stack()
            .tcp_set_keepalive(self.conn.id, interval)?;
        self.conn.core.wake_driver();
        Ok(())
    }

    /// Sets the user timeout (RFC 5482, like Linux's `TCP_USER_TIMEOUT`): when data sent on
    /// this connection stays unacknowledged this long, because the peer vanished or the path
    /// died, the connection is reset, its memory freed, and reads and writes fail with
    /// `TimedOut`. At least one second; the default is `TcpConfig::user_timeout` (924 s, as
    /// Linux's 15 retries come to).
    ///
    /// # Errors
    /// `NotConnected` when the connection is gone.
    pub fn set_user_timeout(&self, timeout: Duration) -> io::Result<()> {
        self.conn
            .core
            .stack()
            .tcp_set_user_timeout(self.conn.id, timeout)?;
        self.conn.core.wake_driver();
        Ok(())
    }

    /// The user timeout in force.
    ///
    /// # Errors
    /// `NotConnected` when the connection is gone.
    pub fn user_timeout(&self) -> io::Result<Duration> {
        self.conn.core.stack().tcp_user_timeout(self.conn.id)
    }

    /// Closes the connection with a reset (no FIN, unsent data dropped).
    pub fn abort(&self) {
        self.conn.core.stack().abort(self.conn.id);
        self.conn.core.wake_driver();
    }

    /// The TCP state (for diagnostics).
    ///
    /// # Errors
    /// `NotConnected` when the connection is gone.
    pub fn state(&self) -> io::Result<TcpState> {
        self.conn
            .core
            .stack()
            .tcp_state(self.conn.id)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "the connection is gone"))
    }

    /// What the connection knows of its path and what it did: smoothed RTT, congestion and
    /// peer windows, the receive window auto-tuning reached, retransmissions and timeouts.
    ///
    /// # Errors
    /// `NotConnected` once the connection is gone.
    pub fn info(&self) -> io::Result<TcpInfo> {
        self.conn
            .core
            .stack()
            .tcp_info(self.conn.id)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "the connection is gone"))
    }

    /// Switches this connection's congestion controller (every new connection starts with
    /// [`TcpConfig::congestion`](corelane_stack::TcpConfig::congestion), CUBIC by default).
    ///
    /// # Errors
    /// `NotConnected` once the connection is gone.
    pub fn set_congestion(&self, cc: Congestion) -> io::Result<()> {
        self.conn.core.stack().tcp_set_congestion(self.conn.id, cc)
    }

    /// Splits into a read half and a write half that can move to different tasks (of this
    /// core). Dropping the write half sends FIN; the connection is released when both are
    /// dropped, or put back together with [`OwnedReadHalf::reunite`].
    pub fn into_split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        OwnedReadHalf::pair(self.conn)
    }

    /// Splits into halves that borrow the stream, for use in one task (with `select!` or
    /// `join!`): as tokio's `split`.
    pub fn split(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>) {
        ReadHalf::pair(&self.conn)
    }

    /// Copies received bytes into `buf` without taking them: the next read returns them
    /// again. Waits while none are there; 0 at the end of the stream.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// # async fn f() -> std::io::Result<()> {
    /// use corelane::net::TcpStream;
    /// use tokio::io::AsyncReadExt;
    /// let mut s = TcpStream::connect("10.0.0.2:80").await?;
    /// let mut first = [0u8; 1];
    /// if s.peek(&mut first).await? == 1 && first[0] == 0x16 {
    ///     // A TLS handshake: hand the stream, unread, to the TLS layer.
    /// }
    /// let mut buf = vec![0; 4096];
    /// let n = s.read(&mut buf).await?; // the peeked byte comes again
    /// # let _ = n;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As a read: the connection was reset, timed out or is gone.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        let (core, id) = (&self.conn.core, self.conn.id);
        poll_fn(|cx| core.stack().tcp_peek(id, buf, Some(cx.waker()))).await
    }

    /// Waits until a read would not wait (bytes, the end of the stream, or an error).
    /// With [`try_read`](Self::try_read), the pair reads without a `&mut` borrow.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// # async fn f() -> std::io::Result<()> {
    /// use corelane::net::TcpStream;
    /// let s = TcpStream::connect("10.0.0.2:7").await?;
    /// let mut buf = [0; 4096];
    /// loop {
    ///     s.readable().await?;
    ///     match s.try_read(&mut buf) {
    ///         Ok(0) => break,
    ///         Ok(n) => println!("{n} bytes"),
    ///         Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
    ///         Err(e) => return Err(e),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `NotConnected` when the connection is gone.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn readable(&self) -> io::Result<()> {
        poll_fn(|cx| self.poll_read_ready(cx)).await
    }

    /// Reads what is there without waiting.
    ///
    /// # Errors
    /// `WouldBlock` when nothing is there yet; otherwise as a read.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let r = self.conn.core.stack().tcp_read(self.conn.id, buf, None);
        self.conn.note_read(&r);
        match r {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Waits until a write would not wait (room in the send buffer, or an error).
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// # async fn f() -> std::io::Result<()> {
    /// use corelane::net::TcpStream;
    /// let s = TcpStream::connect("10.0.0.2:7").await?;
    /// let mut rest: &[u8] = b"hello";
    /// while !rest.is_empty() {
    ///     s.writable().await?;
    ///     match s.try_write(rest) {
    ///         Ok(n) => rest = &rest[n..],
    ///         Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
    ///         Err(e) => return Err(e),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `NotConnected` when the connection is gone.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn writable(&self) -> io::Result<()> {
        poll_fn(|cx| self.poll_write_ready(cx)).await
    }

    /// Writes what fits without waiting.
    ///
    /// # Errors
    /// `WouldBlock` when the send buffer is full; otherwise as a write.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        let r = self.conn.core.stack().tcp_write(self.conn.id, buf, None);
        self.conn.note_write(&r);
        match r {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// `Some(Duration::ZERO)`: dropping the stream resets the connection (RST, unsent data
    /// dropped) instead of closing it. Any other value (or None, the default) closes it with
    /// FIN, in the background: a drop never blocks the thread (where a kernel socket's
    /// `SO_LINGER` would), so a longer linger is kept and read back but changes nothing.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        self.conn.linger.set(linger);
        Ok(())
    }

    /// What [`set_linger`](Self::set_linger) set (None unless set).
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        Ok(self.conn.linger.get())
    }

    /// Sets the IPv4 TTL or IPv6 hop limit of this connection's packets (1..=255; default 64).
    ///
    /// # Errors
    /// `InvalidInput` out of range; `NotConnected` when the connection is gone.
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        self.conn.core.stack().tcp_set_ttl(self.conn.id, ttl)
    }

    /// The IPv4 TTL or IPv6 hop limit of this connection's packets.
    ///
    /// # Errors
    /// `NotConnected` when the connection is gone.
    pub fn ttl(&self) -> io::Result<u32> {
        self.conn.core.stack().tcp_ttl(self.conn.id)
    }
}

async_read!(TcpStream);
async_write!(TcpStream);
