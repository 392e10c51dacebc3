//! A TCP listener on one port of the current core.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use corelane_stack::{AcceptOptions, Proto};

use super::TcpStream;
use crate::lane::{Core, current};
use crate::net::ToSocketAddr;

/// A TCP listener on one port of the current core. Bind it on every core: each core accepts the
/// connections whose SYN reached its queue.
///
/// ```no_run
/// # use corelane_rt as corelane;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use corelane::{Runtime, net::TcpListener};
/// let rt = Runtime::builder("veth0").addr("10.0.0.1/24").build()?;
/// rt.run(|_core| async move {
///     let listener = TcpListener::bind(8080).await.expect("port 8080 on this core");
///     while let Ok((stream, peer)) = listener.accept().await {
///         println!("{peer} connected");
///         drop(stream);
///     }
/// })?;
/// # Ok(()) }
/// ```
pub struct TcpListener {
    core: Arc<Core>,
    port: u16,
    /// The waiter id `poll_accept` registers under (one per listener).
    poll_waiter: u64,
    ip: std::net::IpAddr,
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
    ///
    /// `addr` is a port (`7`: every owned address), or an address and port as tokio takes it
    /// (`"0.0.0.0:7"`, `"10.0.0.5:7"`, `(ip, 7)`, a `SocketAddr`): an owned address listens
    /// on that address only. Port 0 picks a free port, the same on every core: each core's
    /// n-th `bind` of port 0 gets the n-th port picked ([`local_addr`](Self::local_addr)
    /// says which).
    ///
    /// # Errors
    /// `InvalidInput` for text that is not an address, `AddrNotAvailable` for an address the
    /// runtime does not own, `AddrInUse` when this core already has the port or, on an address
    /// shared with the kernel ([`Builder::share_kernel_addrs`](crate::Builder::share_kernel_addrs)),
    /// when a kernel socket holds it (the message names the socket; port 0 picks past such
    /// ports), an error naming the steering program when it cannot be told to steer the port,
    /// and `Other` outside a corelane core.
    pub async fn bind(addr: impl ToSocketAddr) -> io::Result<TcpListener> {
        Self::bind_with_backlog(addr, None).await
    }

    /// Listens on `port` with at most `backlog` connections half-open or waiting to be
    /// accepted; SYNs past it are dropped (the peer retries), not reset.
    ///
    /// # Errors
    /// As [`TcpListener::bind`].
    pub async fn bind_with_backlog(
        addr: impl ToSocketAddr,
        backlog: Option<usize>,
    ) -> io::Result<TcpListener> {
        Self::bind_now(addr.to_socket_addr()?, backlog)
    }

    /// As `bind_with_backlog`, at once (it never waits: `bind` is async for tokio's
    /// signature).
    pub(crate) fn bind_now(sa: SocketAddr, backlog: Option<usize>) -> io::Result<TcpListener> {
        let core = current()?;
        let (auto, mut port) = match sa.port() {
            0 => {
                let (n, p) = core.auto_port(Proto::Tcp)?;
                (Some(n), p)
            }
            p => (None, p),
        };
        let ip = (!sa.ip().is_unspecified()).then(|| sa.ip().into());
        // Port 0 on an address shared with the kernel: a port a kernel socket holds is
        // refused (`AddrInUse`), and the next free one is tried, up to 16.
        let mut tries = 0;
        loop {
            core.stack().listen_tcp_on(ip, port, backlog)?;
            let Err(e) = core.own_port(Proto::Tcp, port) else {
                break;
            };
            core.stack().unlisten(port);
            tries += 1;
            match auto {
                Some(n) if e.kind() == io::ErrorKind::AddrInUse && tries < 16 => {
                    port = core.auto_port_instead(Proto::Tcp, n, port)?;
                }
                _ => return Err(e),
            }
        }
        let poll_waiter = core.next_waiter.fetch_add(1, Ordering::Relaxed);
        Ok(TcpListener {
            core,
            port,
            poll_waiter,
            ip: sa.ip(),
        })
    }

    /// The address listened on: the one given, with the port picked for port 0.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::new(self.ip, self.port))
    }

    /// Keep-alive and user timeout for every connection this listener accepts on this core
    /// from now on (and those waiting to be accepted): the same as calling
    /// [`TcpStream::set_keepalive`] and [`TcpStream::set_user_timeout`] on each.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// # async fn f() -> std::io::Result<()> {
    /// use std::time::Duration;
    /// let l = corelane::net::TcpListener::bind(80).await?;
    /// l.set_accept_options(Some(Duration::from_secs(60)), Some(Duration::from_secs(30)))?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `NotConnected` when the listener was closed.
    pub fn set_accept_options(
        &self,
        keepalive: Option<Duration>,
        user_timeout: Option<Duration>,
    ) -> io::Result<()> {
        let mut stack = self.core.stack();
        let o = stack.accept_options(self.port).unwrap_or_default();
        stack.set_accept_options(
            self.port,
            AcceptOptions {
                keepalive,
                user_timeout,
                ..o
            },
        )
    }

    /// The type of service / traffic class of the connections this listener accepts.
    pub(crate) fn set_accepted_tos(&self, tos: u8) -> io::Result<()> {
        let mut stack = self.core.stack();
        let o = stack.accept_options(self.port).unwrap_or_default();
        stack.set_accept_options(self.port, AcceptOptions { tos, ..o })
    }

    /// Sets the TTL (IPv4) or hop limit (IPv6) of every connection this listener accepts from
    /// now on (and those waiting to be accepted), as a kernel listener's `IP_TTL` is inherited.
    ///
    /// # Errors
    /// `InvalidInput` for 0 or more than 255; `NotConnected` when the listener was closed.
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        let ttl = u8::try_from(ttl)
            .ok()
            .filter(|t| *t > 0)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a TTL is 1 to 255"))?;
        let mut stack = self.core.stack();
        let mut o = stack.accept_options(self.port).unwrap_or_default();
        o.ttl = Some(ttl);
        stack.set_accept_options(self.port, o)
    }

    /// The TTL (IPv4) or hop limit (IPv6) accepted connections get.
    ///
    /// # Errors
    /// `NotConnected` when the listener was closed.
    pub fn ttl(&self) -> io::Result<u32> {
        let o = self.core.stack().accept_options(self.port).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotConnected, "the listener was closed")
        })?;
        Ok(u32::from(o.ttl.unwrap_or(64)))
    }

    /// Polls for the next connection: `Ready` with it, or `Pending` with `cx`'s waker
    /// registered (as tokio's, for code that drives a listener by hand, such as a
    /// `Stream` or hyper's accept loop).
    ///
    /// # Errors
    /// As [`TcpListener::accept`].
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
        let id = {
            let mut stack = self.core.stack();
            if !stack.is_listening(self.port) {
                return Poll::Ready(Err(io::Error::other("the listener was closed")));
            }
            match stack.accept(self.port) {
                Some(id) => id,
                None => {
                    stack.accept_wait(self.port, self.poll_waiter, cx.waker());
                    return Poll::Pending;
                }
            }
        };
        let stream = TcpStream::new(self.core.clone(), id, true);
        Poll::Ready(stream.peer_addr().map(|peer| (stream, peer)))
    }

    /// The port.
    pub fn local_port(&self) -> u16 {
        self.port
    }

    /// Waits for the next connection. With many tasks waiting, each connection wakes one.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// # async fn f() -> std::io::Result<()> {
    /// use corelane::net::TcpListener;
    /// use tokio::io::AsyncWriteExt;
    /// // Inside the future of Runtime::run (one listener per core, all on port 80):
    /// let listener = TcpListener::bind(80).await?;
    /// loop {
    ///     let (mut s, peer) = listener.accept().await?;
    ///     tokio::task::spawn_local(async move {
    ///         let _ = s.write_all(format!("hello {peer}\n").as_bytes()).await;
    ///     });
    /// }
    /// # }
    /// ```
    ///
    /// # Errors
    /// When the listener was closed, or the connection was gone before it was taken.
    ///
    /// # Cancel safety
    /// Cancel safe: a connection is taken from the accept queue only when this returns it, and
    /// a dropped wait passes its turn to the next waiter.
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
        let stream = TcpStream::new(self.core.clone(), id, true);
        let peer = stream.peer_addr()?;
        Ok((stream, peer))
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
        self.core.stack().accept_cancel(self.port, self.poll_waiter);
        // The port stays steered while connections this listener accepted are open.
        if self.core.stack().close_listener(self.port) {
            self.core.release_port(Proto::Tcp, self.port);
        }
        self.core.wake_driver();
    }
}
