//! TCP and UDP sockets on the current core, with tokio's `AsyncRead` and `AsyncWrite`.
//!
//! Every socket lives on the core whose task created it and must stay there (the types are not
//! `Send`). A socket's task is woken only when that socket changes: smoltcp holds the task's
//! waker and wakes it from the protocol stage.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use corelane_stack::FlowId;
use corelane_stack::smoltcp::socket::tcp::{self, State};
use corelane_stack::smoltcp::socket::udp;
use corelane_stack::smoltcp::wire::IpEndpoint;
use corelane_xsk::Proto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::core::{Core, current};

fn to_socket_addr(e: IpEndpoint) -> SocketAddr {
    SocketAddr::new(e.addr.into(), e.port)
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the connection is gone")
}

/// A TCP listener on one port of the current core. Bind it on every core (each core accepts the
/// connections whose SYN reached its queue).
pub struct TcpListener {
    core: Arc<Core>,
    port: u16,
}

impl std::fmt::Debug for TcpListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpListener")
            .field("core", &self.core.index)
            .field("port", &self.port)
            .finish()
    }
}

impl TcpListener {
    /// Listens on `port` on every owned address, with the runtime's default backlog.
    pub fn bind(port: u16) -> io::Result<TcpListener> {
        Self::bind_with_backlog(port, None)
    }

    /// Listens on `port` with at most `backlog` connections half-open or waiting to be
    /// accepted; SYNs past it are dropped (the peer retries), not reset.
    pub fn bind_with_backlog(port: u16, backlog: Option<usize>) -> io::Result<TcpListener> {
        if port == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "listen on a fixed port: every core must bind the same one",
            ));
        }
        let core = current()?;
        core.stack().listen_tcp(port, backlog)?;
        if let Err(e) = core.own_port(Proto::Tcp, port) {
            core.stack().unlisten(port);
            return Err(e);
        }
        Ok(TcpListener { core, port })
    }

    /// The port.
    pub fn local_port(&self) -> u16 {
        self.port
    }

    /// Waits for the next connection. With many tasks waiting, each connection wakes one.
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let waiter = self.core.next_waiter.fetch_add(1, Ordering::Relaxed);
        let mut guard = AcceptGuard {
            core: &self.core,
            port: self.port,
            waiter,
            registered: false,
        };
        let id = poll_fn(|cx| {
            let mut stack = self.core.stack();
            if !stack.is_listening(self.port) {
                return Poll::Ready(Err(io::Error::other("the listener was closed")));
            }
            if let Some(id) = stack.accept(self.port) {
                return Poll::Ready(Ok(id));
            }
            if guard.registered {
                // Woken with nothing to take: counted, as wake-one should make this rare.
                self.core.stats().accept_spurious += 1;
            }
            stack.accept_wait(self.port, waiter, cx.waker());
            guard.registered = true;
            Poll::Pending
        })
        .await?;
        guard.registered = false;
        let peer = self
            .core
            .stack()
            .endpoints(id)
            .map(|k| to_socket_addr(k.remote))
            .ok_or_else(gone)?;
        Ok((TcpStream::new(self.core.clone(), id), peer))
    }
}

struct AcceptGuard<'a> {
    core: &'a Arc<Core>,
    port: u16,
    waiter: u64,
    registered: bool,
}

impl Drop for AcceptGuard<'_> {
    fn drop(&mut self) {
        if self.registered {
            self.core.stack().accept_cancel(self.port, self.waiter);
        }
    }
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        self.core.stack().unlisten(self.port);
        self.core.release_port(Proto::Tcp, self.port);
        self.core.wake_driver();
    }
}

struct Conn {
    core: Arc<Core>,
    id: FlowId,
}

impl Conn {
    fn with<R>(&self, f: impl FnOnce(&mut tcp::Socket<'static>) -> R) -> io::Result<R> {
        let mut stack = self.core.stack();
        stack.tcp(self.id).map(f).ok_or_else(gone)
    }

    fn touch(&self) {
        self.core.stack().touch(self.id);
        self.core.wake_driver();
    }

    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let r = self.with(|s| {
            if s.can_recv() {
                let n = s.recv_slice(buf.initialize_unfilled()).unwrap_or(0);
                buf.advance(n);
                Poll::Ready(Ok(true))
            } else if !s.may_recv() {
                // FIN received, or the connection is closed: end of stream.
                Poll::Ready(Ok(false))
            } else {
                s.register_recv_waker(cx.waker());
                Poll::Pending
            }
        })?;
        if let Poll::Ready(Ok(true)) = r {
            // Reading opens the window: let the driver send the update.
            self.touch();
        }
        r.map(|r| r.map(|_| ()))
    }

    fn poll_write(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = self.with(|s| {
            if s.can_send() {
                Poll::Ready(Ok(s.send_slice(buf).unwrap_or(0)))
            } else if !s.may_send() {
                let kind = if s.state() == State::Closed {
                    io::ErrorKind::ConnectionReset
                } else {
                    io::ErrorKind::BrokenPipe
                };
                Poll::Ready(Err(io::Error::new(
                    kind,
                    "the connection is closed for writing",
                )))
            } else {
                s.register_send_waker(cx.waker());
                Poll::Pending
            }
        })?;
        if let Poll::Ready(Ok(_)) = r {
            self.touch();
        }
        r
    }

    fn poll_shutdown(&self) -> Poll<io::Result<()>> {
        self.with(|s| s.close())?;
        self.touch();
        Poll::Ready(Ok(()))
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.core.stack().release(self.id);
        self.core.wake_driver();
    }
}

/// A TCP connection on the current core.
pub struct TcpStream {
    conn: Arc<Conn>,
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
    fn new(core: Arc<Core>, id: FlowId) -> TcpStream {
        TcpStream {
            conn: Arc::new(Conn { core, id }),
        }
    }

    /// Connects to `addr` from an owned address of the same family. The local port is one this
    /// core owns, so the peer's replies come to this core whatever queue they arrive on. Bound
    /// the wait with `tokio::time::timeout`.
    pub async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
        let core = current()?;
        let (id, port) = core.stack().connect_tcp(addr.into())?;
        // From here the flow is released if this future is dropped.
        let stream = TcpStream::new(core.clone(), id);
        if let Err(e) = core.own_port(Proto::Tcp, port) {
            stream.abort();
            return Err(e);
        }
        core.wake_driver();
        poll_fn(|cx| {
            stream.conn.with(|s| match s.state() {
                State::SynSent | State::SynReceived => {
                    s.register_send_waker(cx.waker());
                    Poll::Pending
                }
                State::Closed => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("connection to {addr} refused"),
                ))),
                _ => Poll::Ready(Ok(())),
            })?
        })
        .await?;
        Ok(stream)
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.endpoint(|k| k.remote)
    }

    /// This side's address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.endpoint(|k| k.local)
    }

    fn endpoint(&self, pick: fn(corelane_stack::FlowKey) -> IpEndpoint) -> io::Result<SocketAddr> {
        let mut stack = self.conn.core.stack();
        stack
            .endpoints(self.conn.id)
            .map(|k| to_socket_addr(pick(k)))
            .ok_or_else(gone)
    }

    /// Sends small writes at once (true, the default) or coalesces them (Nagle).
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.conn.with(|s| s.set_nagle_enabled(!nodelay))
    }

    /// Whether small writes go out at once.
    pub fn nodelay(&self) -> io::Result<bool> {
        self.conn.with(|s| !s.nagle_enabled())
    }

    /// Sends keep-alive probes after `interval` of silence (None: off, the default).
    pub fn set_keepalive(&self, interval: Option<Duration>) -> io::Result<()> {
        self.conn
            .with(|s| s.set_keep_alive(interval.map(Into::into)))?;
        self.conn.touch();
        Ok(())
    }

    /// Closes the connection with a reset (no FIN, unsent data dropped).
    pub fn abort(&self) {
        self.conn.core.stack().abort(self.conn.id);
        self.conn.core.wake_driver();
    }

    /// The TCP state (for diagnostics).
    pub fn state(&self) -> io::Result<State> {
        self.conn.with(|s| s.state())
    }

    /// Splits into a read half and a write half that can move to different tasks (of this core).
    /// Dropping the write half sends FIN; the connection is released when both are dropped.
    pub fn into_split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        (
            OwnedReadHalf {
                conn: self.conn.clone(),
            },
            OwnedWriteHalf { conn: self.conn },
        )
    }
}

/// The reading half of a [`TcpStream`].
pub struct OwnedReadHalf {
    conn: Arc<Conn>,
}

/// The writing half of a [`TcpStream`]; dropping it sends FIN.
pub struct OwnedWriteHalf {
    conn: Arc<Conn>,
}

impl std::fmt::Debug for OwnedReadHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedReadHalf").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for OwnedWriteHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedWriteHalf").finish_non_exhaustive()
    }
}

impl OwnedReadHalf {
    /// Puts the halves back together.
    pub fn reunite(self, w: OwnedWriteHalf) -> Result<TcpStream, (OwnedReadHalf, OwnedWriteHalf)> {
        if Arc::ptr_eq(&self.conn, &w.conn) {
            let conn = self.conn.clone();
            // Neither half's destructor may run its half-close.
            std::mem::forget(w);
            drop(self);
            Ok(TcpStream { conn })
        } else {
            Err((self, w))
        }
    }
}

/// tokio's reading trait for a type with a `conn: Arc<Conn>`.
macro_rules! async_read {
    ($t:ty) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                self.conn.poll_read(cx, buf)
            }
        }
    };
}

/// tokio's writing trait for a type with a `conn: Arc<Conn>`. Flush has nothing to wait for:
/// written bytes are in the socket's send buffer and the driver sends them this turn.
macro_rules! async_write {
    ($t:ty) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                self.conn.poll_write(cx, buf)
            }

            fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Ok(()))
            }

            fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                self.conn.poll_shutdown()
            }
        }
    };
}

async_read!(TcpStream);
async_write!(TcpStream);
async_read!(OwnedReadHalf);
async_write!(OwnedWriteHalf);

impl Drop for OwnedWriteHalf {
    fn drop(&mut self) {
        let _ = self.conn.poll_shutdown();
    }
}

/// A UDP socket on the current core.
pub struct UdpSocket {
    core: Arc<Core>,
    id: FlowId,
    port: u16,
    peer: std::cell::Cell<Option<SocketAddr>>,
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
    /// Binds `port` on every owned address (0: a port this core owns, so replies come here).
    /// To serve one port from every core, bind it on every core.
    pub fn bind(port: u16) -> io::Result<UdpSocket> {
        let core = current()?;
        let (id, port) = core.stack().bind_udp(port)?;
        if let Err(e) = core.own_port(Proto::Udp, port) {
            core.stack().release(id);
            return Err(e);
        }
        Ok(UdpSocket {
            core,
            id,
            port,
            peer: std::cell::Cell::new(None),
        })
    }

    /// The bound port.
    pub fn local_port(&self) -> u16 {
        self.port
    }

    fn with<R>(&self, f: impl FnOnce(&mut udp::Socket<'static>) -> R) -> io::Result<R> {
        let mut stack = self.core.stack();
        stack.udp(self.id).map(f).ok_or_else(gone)
    }

    /// Sends one datagram to `addr`.
    pub async fn send_to(&self, buf: &[u8], addr: SocketAddr) -> io::Result<usize> {
        let sent = poll_fn(|cx| {
            self.with(|s| {
                if buf.len() > s.payload_send_capacity() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "datagram of {} bytes is larger than the send buffer ({} bytes)",
                            buf.len(),
                            s.payload_send_capacity()
                        ),
                    )));
                }
                match s.send_slice(buf, IpEndpoint::from(addr)) {
                    Ok(()) => Poll::Ready(Ok(buf.len())),
                    Err(udp::SendError::BufferFull) => {
                        s.register_send_waker(cx.waker());
                        Poll::Pending
                    }
                    Err(e) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("send to {addr}: {e}"),
                    ))),
                }
            })?
        })
        .await?;
        self.core.stack().touch(self.id);
        self.core.wake_driver();
        Ok(sent)
    }

    /// Receives one datagram; returns its length (truncated to `buf`) and sender.
    pub async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        poll_fn(|cx| {
            self.with(|s| match s.recv_slice(buf) {
                Ok((n, meta)) => Poll::Ready(Ok((n, to_socket_addr(meta.endpoint)))),
                Err(udp::RecvError::Truncated) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "datagram larger than the buffer (dropped)",
                ))),
                Err(_) => {
                    s.register_recv_waker(cx.waker());
                    Poll::Pending
                }
            })?
        })
        .await
    }

    /// Sets the default peer: [`send`](Self::send) goes to it and [`recv`](Self::recv) takes
    /// only its datagrams.
    pub fn connect(&self, addr: SocketAddr) -> io::Result<()> {
        self.peer.set(Some(addr));
        Ok(())
    }

    /// The connected peer.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.peer
            .get()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "not connected"))
    }

    /// Sends to the connected peer.
    pub async fn send(&self, buf: &[u8]) -> io::Result<usize> {
        self.send_to(buf, self.peer_addr()?).await
    }

    /// Receives from the connected peer (datagrams from others are dropped).
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let peer = self.peer_addr()?;
        loop {
            let (n, from) = self.recv_from(buf).await?;
            if from == peer {
                return Ok(n);
            }
        }
    }
}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        self.core.stack().release(self.id);
    }
}
