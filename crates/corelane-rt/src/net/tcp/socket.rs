//! A TCP socket not yet connected or listening, as tokio's `TcpSocket`: options first, then
//! `connect` or `listen`.

use std::cell::Cell;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use corelane_stack::ConnectOptions;

use super::{TcpListener, TcpStream};

/// How long a connection with keep-alive on stays quiet before the first probe (Linux's
/// `tcp_keepalive_time`).
const KEEPALIVE: Duration = Duration::from_secs(7200);

/// A TCP socket to set up before it connects or listens, as `tokio::net::TcpSocket`: bind it
/// to a local address and port, size its buffers, then [`connect`](Self::connect) or
/// [`listen`](Self::listen). It lives on the current core.
///
/// ```no_run
/// # use corelane_rt as corelane;
/// # async fn f() -> std::io::Result<()> {
/// use std::net::SocketAddr;
/// use corelane::net::TcpSocket;
/// // From a chosen local port, with a 1 MiB receive buffer:
/// let sock = TcpSocket::new_v4()?;
/// sock.bind(SocketAddr::from(([10, 0, 0, 1], 40000)))?;
/// sock.set_recv_buffer_size(1 << 20)?;
/// let stream = sock.connect(SocketAddr::from(([10, 0, 0, 2], 80))).await?;
/// # let _ = stream;
/// // A listener with a backlog of 1024:
/// let sock = TcpSocket::new_v4()?;
/// sock.set_reuseaddr(true)?;
/// sock.bind(SocketAddr::from(([0, 0, 0, 0], 8080)))?;
/// let listener = sock.listen(1024)?;
/// # let _ = listener;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TcpSocket {
    v6: bool,
    local: Cell<Option<SocketAddr>>,
    reuseaddr: Cell<bool>,
    reuseport: Cell<bool>,
    nodelay: Cell<bool>,
    keepalive: Cell<bool>,
    send_buffer: Cell<Option<u32>>,
    recv_buffer: Cell<Option<u32>>,
    linger: Cell<Option<Duration>>,
    tos: Cell<u8>,
}

impl TcpSocket {
    fn new(v6: bool) -> TcpSocket {
        TcpSocket {
            v6,
            local: Cell::new(None),
            reuseaddr: Cell::new(false),
            reuseport: Cell::new(false),
            nodelay: Cell::new(true),
            keepalive: Cell::new(false),
            send_buffer: Cell::new(None),
            recv_buffer: Cell::new(None),
            linger: Cell::new(None),
            tos: Cell::new(0),
        }
    }

    /// An IPv4 socket.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn new_v4() -> io::Result<TcpSocket> {
        Ok(TcpSocket::new(false))
    }

    /// An IPv6 socket.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn new_v6() -> io::Result<TcpSocket> {
        Ok(TcpSocket::new(true))
    }

    fn family(&self, addr: SocketAddr) -> io::Result<()> {
        if addr.is_ipv6() == self.v6 {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{addr} is not an {} address (the socket was made with new_{})",
                    if self.v6 { "IPv6" } else { "IPv4" },
                    if self.v6 { "v6" } else { "v4" }
                ),
            ))
        }
    }

    /// Allows binding a port whose earlier connections linger in TIME-WAIT. corelane's
    /// connections never block a bind that way, so this is recorded only.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn set_reuseaddr(&self, reuseaddr: bool) -> io::Result<()> {
        self.reuseaddr.set(reuseaddr);
        Ok(())
    }

    /// What [`set_reuseaddr`](Self::set_reuseaddr) recorded.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn reuseaddr(&self) -> io::Result<bool> {
        Ok(self.reuseaddr.get())
    }

    /// Recorded only: every core of a runtime listens on a port already (the XDP program
    /// spreads connections over them), as `SO_REUSEPORT` sockets would.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn set_reuseport(&self, reuseport: bool) -> io::Result<()> {
        self.reuseport.set(reuseport);
        Ok(())
    }

    /// What [`set_reuseport`](Self::set_reuseport) recorded.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn reuseport(&self) -> io::Result<bool> {
        Ok(self.reuseport.get())
    }

    /// The largest send buffer of the connection [`connect`](Self::connect) opens, in bytes
    /// (default: the runtime's `StackConfig::tcp_tx_buffer`).
    ///
    /// # Errors
    /// `InvalidInput` for 0.
    pub fn set_send_buffer_size(&self, size: u32) -> io::Result<()> {
        self.send_buffer.set(Some(nonzero(size)?));
        Ok(())
    }

    /// Twice the send buffer size set, as Linux reads `SO_SNDBUF` back (it doubles
    /// the value to count its bookkeeping; corelane's buffer holds the size set, as much as
    /// the kernel's holds of data), or 0 for the runtime's default.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn send_buffer_size(&self) -> io::Result<u32> {
        Ok(self.send_buffer.get().map_or(0, |n| n.saturating_mul(2)))
    }

    /// The largest receive window of the connection [`connect`](Self::connect) opens, in
    /// bytes (default: the runtime's `StackConfig::tcp_rx_buffer`; the window scale follows).
    ///
    /// # Errors
    /// `InvalidInput` for 0.
    pub fn set_recv_buffer_size(&self, size: u32) -> io::Result<()> {
        self.recv_buffer.set(Some(nonzero(size)?));
        Ok(())
    }

    /// Twice the receive buffer size set, as Linux reads `SO_RCVBUF` back (it doubles
    /// the value to count its bookkeeping; corelane's buffer holds the size set, as much as
    /// the kernel's holds of data), or 0 for the runtime's default.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn recv_buffer_size(&self) -> io::Result<u32> {
        Ok(self.recv_buffer.get().map_or(0, |n| n.saturating_mul(2)))
    }

    /// Nagle's algorithm off (true, corelane's default) or on for the connection.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.nodelay.set(nodelay);
        Ok(())
    }

    /// What [`set_nodelay`](Self::set_nodelay) set.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn nodelay(&self) -> io::Result<bool> {
        Ok(self.nodelay.get())
    }

    /// Keep-alive probes after two hours of quiet (true) for the connection.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn set_keepalive(&self, keepalive: bool) -> io::Result<()> {
        self.keepalive.set(keepalive);
        Ok(())
    }

    /// What [`set_keepalive`](Self::set_keepalive) set.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn keepalive(&self) -> io::Result<bool> {
        Ok(self.keepalive.get())
    }

    /// The linger of the stream this socket connects ([`TcpStream::set_linger`]): zero resets
    /// the connection when the stream is dropped; any other value closes it with FIN in the
    /// background, as None does (a drop never blocks the thread), and reads back as set.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn set_linger(&self, dur: Option<Duration>) -> io::Result<()> {
        self.linger.set(dur);
        Ok(())
    }

    /// `set_linger(Some(Duration::ZERO))`: the stream's drop resets the connection.
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn set_zero_linger(&self) -> io::Result<()> {
        self.set_linger(Some(Duration::ZERO))
    }

    /// What [`set_linger`](Self::set_linger) set (None unless set).
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        Ok(self.linger.get())
    }

    /// Sets the IPv4 type of service of the connection's packets from its SYN on (or of every
    /// connection a listener made from this socket accepts): its upper six bits (DSCP) reach
    /// the wire; the two ECN bits stay the stack's, as with the kernel's TCP.
    ///
    /// # Errors
    /// `InvalidInput` for more than 255.
    pub fn set_tos_v4(&self, tos: u32) -> io::Result<()> {
        self.tos.set(u8::try_from(tos).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "a type of service is 0 to 255")
        })?);
        Ok(())
    }

    /// What [`set_tos_v4`](Self::set_tos_v4) set (0 unless set).
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn tos_v4(&self) -> io::Result<u32> {
        Ok(u32::from(self.tos.get()))
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
    /// None; the signature is tokio's.
    #[deprecated(note = "use `tos_v4`, as tokio says")]
    pub fn tos(&self) -> io::Result<u32> {
        self.tos_v4()
    }

    /// Sets the IPv6 traffic class of the connection's packets (as
    /// [`set_tos_v4`](Self::set_tos_v4) for IPv4: the same byte of the header).
    ///
    /// # Errors
    /// `InvalidInput` for more than 255.
    pub fn set_tclass_v6(&self, tclass: u32) -> io::Result<()> {
        self.set_tos_v4(tclass)
    }

    /// What [`set_tclass_v6`](Self::set_tclass_v6) set (0 unless set).
    ///
    /// # Errors
    /// None; the signature is tokio's.
    pub fn tclass_v6(&self) -> io::Result<u32> {
        self.tos_v4()
    }

    /// The local address and port to connect from or listen on (an unspecified address: any
    /// owned one; port 0: one picked for it). Checked when the socket connects or listens.
    ///
    /// # Errors
    /// `InvalidInput` for an address of the other family.
    pub fn bind(&self, addr: SocketAddr) -> io::Result<()> {
        self.family(addr)?;
        self.local.set(Some(addr));
        Ok(())
    }

    /// The address given to [`bind`](Self::bind).
    ///
    /// # Errors
    /// `InvalidInput` before `bind`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.local.get().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "the socket is not bound yet")
        })
    }

    /// Connects to `addr` from the bound address (if any) with the options set.
    ///
    /// # Errors
    /// An address of the other family, a bound address the runtime does not own or a port
    /// in use, and everything [`TcpStream::connect`] returns.
    pub async fn connect(self, addr: SocketAddr) -> io::Result<TcpStream> {
        self.family(addr)?;
        let opts = ConnectOptions {
            local: self.local.get(),
            rx_buffer: self.recv_buffer.get().map(|n| n as usize),
            tx_buffer: self.send_buffer.get().map(|n| n as usize),
            tos: self.tos.get(),
        };
        let stream = TcpStream::connect_with(addr, opts).await?;
        stream.set_nodelay(self.nodelay.get())?;
        stream.set_linger(self.linger.get())?;
        if self.keepalive.get() {
            stream.set_keepalive(Some(KEEPALIVE))?;
        }
        Ok(stream)
    }

    /// Listens on the bound address (unbound: every owned address of the family, a port
    /// picked for it) with at most `backlog` connections half-open or waiting to be accepted.
    ///
    /// # Errors
    /// As [`TcpListener::bind`].
    pub fn listen(self, backlog: u32) -> io::Result<TcpListener> {
        let any = if self.v6 {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        };
        let at = self.local.get().unwrap_or(SocketAddr::new(any, 0));
        let listener = TcpListener::bind_now(at, Some(backlog.max(1) as usize))?;
        if self.keepalive.get() {
            listener.set_accept_options(Some(KEEPALIVE), None)?;
        }
        if self.tos.get() != 0 {
            listener.set_accepted_tos(self.tos.get())?;
        }
        Ok(listener)
    }
}

fn nonzero(size: u32) -> io::Result<u32> {
    if size == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a buffer size is at least 1 byte",
        ));
    }
    Ok(size)
}
