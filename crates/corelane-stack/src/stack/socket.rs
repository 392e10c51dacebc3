//! What the application's sockets call. Every call that changes what a flow has to send queues
//! the flow for the next egress pass itself; callers never touch smoltcp types.

use std::io;
use std::net::SocketAddr;
use std::task::{Poll, Waker};
use std::time::Duration;

use corelane_frame::Proto;
use smoltcp::socket::{tcp, udp};
use smoltcp::wire::{IpAddress, IpEndpoint};

use super::{FlowId, Stack, new_tcp};
use crate::classify::FlowKey;
use crate::config::{EPHEMERAL_START, StackError};

/// The state of a TCP connection (RFC 9293's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TcpState {
    /// No connection.
    Closed,
    /// Waiting for a SYN.
    Listen,
    /// SYN sent, waiting for the SYN-ACK.
    SynSent,
    /// SYN received and answered, waiting for the ACK.
    SynReceived,
    /// Open both ways.
    Established,
    /// This side sent FIN, not yet acknowledged.
    FinWait1,
    /// This side's FIN acknowledged; waiting for the peer's.
    FinWait2,
    /// The peer sent FIN; this side may still send.
    CloseWait,
    /// Both sent FIN at once.
    Closing,
    /// The peer closed first and this side's FIN waits for its ACK.
    LastAck,
    /// Both closed; waiting out old segments.
    TimeWait,
}

impl std::fmt::Display for TcpState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TcpState::Closed => "CLOSED",
            TcpState::Listen => "LISTEN",
            TcpState::SynSent => "SYN-SENT",
            TcpState::SynReceived => "SYN-RECEIVED",
            TcpState::Established => "ESTABLISHED",
            TcpState::FinWait1 => "FIN-WAIT-1",
            TcpState::FinWait2 => "FIN-WAIT-2",
            TcpState::CloseWait => "CLOSE-WAIT",
            TcpState::Closing => "CLOSING",
            TcpState::LastAck => "LAST-ACK",
            TcpState::TimeWait => "TIME-WAIT",
        })
    }
}

impl From<tcp::State> for TcpState {
    fn from(s: tcp::State) -> TcpState {
        match s {
            tcp::State::Closed => TcpState::Closed,
            tcp::State::Listen => TcpState::Listen,
            tcp::State::SynSent => TcpState::SynSent,
            tcp::State::SynReceived => TcpState::SynReceived,
            tcp::State::Established => TcpState::Established,
            tcp::State::FinWait1 => TcpState::FinWait1,
            tcp::State::FinWait2 => TcpState::FinWait2,
            tcp::State::CloseWait => TcpState::CloseWait,
            tcp::State::Closing => TcpState::Closing,
            tcp::State::LastAck => TcpState::LastAck,
            tcp::State::TimeWait => TcpState::TimeWait,
        }
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the connection is gone")
}

fn to_socket_addr(e: IpEndpoint) -> SocketAddr {
    SocketAddr::new(e.addr.into(), e.port)
}

impl Stack {
    fn local_addr_for(&self, remote: IpAddress) -> Result<IpAddress, StackError> {
        self.iface
            .ip_addrs()
            .iter()
            .map(|c| c.address())
            .find(|a| std::mem::discriminant(a) == std::mem::discriminant(&remote))
            .ok_or(StackError::NoAddress(match remote {
                IpAddress::Ipv4(_) => "IPv4",
                IpAddress::Ipv6(_) => "IPv6",
            }))
    }

    /// A free port of this stack's share of the ephemeral range (`port % cores == core`).
    fn ephemeral_port(&mut self, proto: Proto) -> Result<u16, StackError> {
        let cores = self.cfg.cores as u32;
        let span = (u32::from(u16::MAX) - u32::from(EPHEMERAL_START) + 1) / cores;
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let start = (self.rng % u64::from(span)) as u32;
        let base = u32::from(EPHEMERAL_START).div_ceil(cores) * cores + self.cfg.core as u32;
        for k in 0..span {
            let port = base + ((start + k) % span) * cores;
            if port > u32::from(u16::MAX) {
                continue;
            }
            let port = port as u16;
            if !self.ports.contains(&(proto, port)) && !self.listeners.contains_key(&port) {
                return Ok(port);
            }
        }
        Err(StackError::NoPort {
            proto: proto.name(),
            core: self.cfg.core,
            cores: self.cfg.cores,
        })
    }

    /// Opens a TCP connection to `remote` from a port of this stack's share of the ephemeral
    /// range, so that the runtime can tell which core the peer's segments belong to. Returns the
    /// flow and its local port (which the caller must steer to this interface).
    ///
    /// # Errors
    /// No owned address of the remote's family, no free port, or a remote smoltcp refuses
    /// (port 0, an unspecified address).
    pub fn connect_tcp(&mut self, remote: SocketAddr) -> Result<(FlowId, u16), StackError> {
        let remote = IpEndpoint::from(remote);
        let local_addr = self.local_addr_for(remote.addr)?;
        let port = self.ephemeral_port(Proto::Tcp)?;
        let local = IpEndpoint::new(local_addr, port);
        let mut s = new_tcp(&self.cfg);
        s.connect(self.iface.context(), remote, local)
            .map_err(|e| StackError::Refused(format!("connect to {remote}: {e}")))?;
        let key = FlowKey { local, remote };
        let i = self.insert(s, Proto::Tcp, port, |f| {
            f.key = Some(key);
            f.held = true;
            f.ephemeral = true;
        });
        self.table.insert(key, i);
        self.ports.insert((Proto::Tcp, port));
        self.queue_egress(i);
        Ok((self.id_of(i), port))
    }

    /// Binds a UDP socket to `port` (0: a port of this stack's share of the ephemeral range) on
    /// every owned address. Returns the flow and the port.
    ///
    /// # Errors
    /// The port is taken, or no ephemeral port is free.
    pub fn bind_udp(&mut self, port: u16) -> Result<(FlowId, u16), StackError> {
        let port = if port == 0 {
            self.ephemeral_port(Proto::Udp)?
        } else {
            port
        };
        if self.udp.contains_key(&port) {
            return Err(StackError::InUse { proto: "UDP", port });
        }
        let meta = || vec![udp::PacketMetadata::EMPTY; self.cfg.udp_packets];
        let rx = udp::PacketBuffer::new(meta(), vec![0u8; self.cfg.udp_bytes]);
        let tx = udp::PacketBuffer::new(meta(), vec![0u8; self.cfg.udp_bytes]);
        let mut s = udp::Socket::new(rx, tx);
        s.bind(port)
            .map_err(|e| StackError::Refused(format!("bind UDP {port}: {e}")))?;
        let i = self.insert(s, Proto::Udp, port, |f| f.held = true);
        self.udp.insert(port, i);
        self.ports.insert((Proto::Udp, port));
        Ok((self.id_of(i), port))
    }

    /// The TCP socket of flow `id` (None if the id is stale or not TCP).
    pub(crate) fn tcp(&mut self, id: FlowId) -> Option<&mut tcp::Socket<'static>> {
        let f = self.flow(id)?;
        if f.proto != Proto::Tcp {
            return None;
        }
        Some(f.set.get_mut::<tcp::Socket<'static>>(f.handle))
    }

    /// The UDP socket of flow `id` (None if the id is stale or not UDP).
    fn udp(&mut self, id: FlowId) -> Option<&mut udp::Socket<'static>> {
        let f = self.flow(id)?;
        if f.proto != Proto::Udp {
            return None;
        }
        Some(f.set.get_mut::<udp::Socket<'static>>(f.handle))
    }

    /// Runs `f` on TCP flow `id`'s socket, then queues the flow for egress when `f` says its
    /// output may have changed.
    fn with_tcp<R>(
        &mut self,
        id: FlowId,
        f: impl FnOnce(&mut tcp::Socket<'static>) -> (R, bool),
    ) -> io::Result<R> {
        let (r, changed) = self.tcp(id).map(f).ok_or_else(gone)?;
        if changed {
            self.queue_egress(id.index);
        }
        Ok(r)
    }

    /// [`with_tcp`](Self::with_tcp) for the socket calls that poll: a gone flow is a ready
    /// error like any other.
    fn poll_tcp<T>(
        &mut self,
        id: FlowId,
        f: impl FnOnce(&mut tcp::Socket<'static>) -> (Poll<io::Result<T>>, bool),
    ) -> Poll<io::Result<T>> {
        self.with_tcp(id, f).unwrap_or_else(|e| Poll::Ready(Err(e)))
    }

    /// This side's and the peer's address of TCP flow `id`.
    pub fn tcp_addrs(&mut self, id: FlowId) -> Option<(SocketAddr, SocketAddr)> {
        let k = self.flow(id)?.key?;
        Some((to_socket_addr(k.local), to_socket_addr(k.remote)))
    }

    /// The state of TCP flow `id` (None if the id is stale).
    pub fn tcp_state(&mut self, id: FlowId) -> Option<TcpState> {
        self.tcp(id).map(|s| s.state().into())
    }

    /// Reads what TCP flow `id` received into `buf`. `Ready(Ok(0))` with a non-empty `buf` is
    /// the end of the stream; `Pending` means nothing yet, and `waker` (if given) is woken when
    /// something arrives. Reading opens the window, so the flow is queued for egress.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn tcp_read(
        &mut self,
        id: FlowId,
        buf: &mut [u8],
        waker: Option<&Waker>,
    ) -> Poll<io::Result<usize>> {
        self.poll_tcp(id, |s| {
            if s.can_recv() {
                (Poll::Ready(Ok(s.recv_slice(buf).unwrap_or(0))), true)
            } else if !s.may_recv() {
                // FIN received, or the connection is closed: end of stream.
                (Poll::Ready(Ok(0)), false)
            } else {
                if let Some(w) = waker {
                    s.register_recv_waker(w);
                }
                (Poll::Pending, false)
            }
        })
    }

    /// Queues `buf` (as much as fits) for sending on TCP flow `id`. `Pending` means the send
    /// buffer is full, and `waker` (if given) is woken when room frees up.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone; `ConnectionReset` after a reset, `BrokenPipe`
    /// after this side shut down writing.
    pub fn tcp_write(
        &mut self,
        id: FlowId,
        buf: &[u8],
        waker: Option<&Waker>,
    ) -> Poll<io::Result<usize>> {
        self.poll_tcp(id, |s| {
            if s.can_send() {
                (Poll::Ready(Ok(s.send_slice(buf).unwrap_or(0))), true)
            } else if !s.may_send() {
                let kind = if s.state() == tcp::State::Closed {
                    io::ErrorKind::ConnectionReset
                } else {
                    io::ErrorKind::BrokenPipe
                };
                let e = io::Error::new(kind, "the connection is closed for writing");
                (Poll::Ready(Err(e)), false)
            } else {
                if let Some(w) = waker {
                    s.register_send_waker(w);
                }
                (Poll::Pending, false)
            }
        })
    }

    /// Bytes TCP flow `id` can take into its send buffer now.
    pub fn tcp_send_room(&mut self, id: FlowId) -> usize {
        self.tcp(id)
            .map_or(0, |s| s.send_capacity().saturating_sub(s.send_queue()))
    }

    /// Whether the handshake of TCP flow `id` is done: `Pending` while it runs (`waker`, if
    /// given, is woken when it ends).
    ///
    /// # Errors
    /// `ConnectionRefused` when the peer refused or the attempt ended; `NotConnected` when the
    /// flow is gone.
    pub fn tcp_connected(&mut self, id: FlowId, waker: Option<&Waker>) -> Poll<io::Result<()>> {
        let refused = io::ErrorKind::ConnectionRefused;
        match self.poll_tcp(id, |s| match s.state() {
            tcp::State::SynSent | tcp::State::SynReceived => {
                if let Some(w) = waker {
                    s.register_send_waker(w);
                }
                (Poll::Pending, false)
            }
            tcp::State::Closed => (Poll::Ready(Err(refused.into())), false),
            _ => (Poll::Ready(Ok(())), false),
        }) {
            // Name the peer, looked up only when refusing.
            Poll::Ready(Err(e)) if e.kind() == refused => {
                let to = match self.tcp_addrs(id) {
                    Some((_, remote)) => format!("connection to {remote} refused"),
                    None => "connection refused".into(),
                };
                Poll::Ready(Err(io::Error::new(refused, to)))
            }
            other => other,
        }
    }

    /// Closes TCP flow `id` for writing: a FIN follows the data already queued.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn tcp_shutdown(&mut self, id: FlowId) -> io::Result<()> {
        self.with_tcp(id, |s| (s.close(), true))
    }

    /// Sends small writes at once (true) or coalesces them (Nagle) on TCP flow `id`.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn tcp_set_nodelay(&mut self, id: FlowId, nodelay: bool) -> io::Result<()> {
        self.with_tcp(id, |s| (s.set_nagle_enabled(!nodelay), false))
    }

    /// Whether small writes on TCP flow `id` go out at once.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn tcp_nodelay(&mut self, id: FlowId) -> io::Result<bool> {
        self.with_tcp(id, |s| (!s.nagle_enabled(), false))
    }

    /// Sends keep-alive probes on TCP flow `id` after `interval` of silence (None: off).
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn tcp_set_keepalive(&mut self, id: FlowId, interval: Option<Duration>) -> io::Result<()> {
        self.with_tcp(id, |s| (s.set_keep_alive(interval.map(Into::into)), true))
    }

    /// Queues one datagram from UDP flow `id` to `to`. `Pending` means the send buffer is full
    /// (`waker`, if given, is woken when room frees up).
    ///
    /// # Errors
    /// `InvalidInput` for a datagram larger than the send buffer or an address smoltcp refuses;
    /// `NotConnected` when the flow is gone.
    pub fn udp_send_to(
        &mut self,
        id: FlowId,
        buf: &[u8],
        to: SocketAddr,
        waker: Option<&Waker>,
    ) -> Poll<io::Result<usize>> {
        let Some(s) = self.udp(id) else {
            return Poll::Ready(Err(gone()));
        };
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
        match s.send_slice(buf, IpEndpoint::from(to)) {
            Ok(()) => {
                self.queue_egress(id.index);
                Poll::Ready(Ok(buf.len()))
            }
            Err(udp::SendError::BufferFull) => {
                if let Some(w) = waker {
                    s.register_send_waker(w);
                }
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("send to {to}: {e}"),
            ))),
        }
    }

    /// Takes the next datagram UDP flow `id` received: its length and sender. `Pending` means
    /// none is waiting (`waker`, if given, is woken when one arrives).
    ///
    /// # Errors
    /// `InvalidInput` when the datagram was larger than `buf` (it is dropped); `NotConnected`
    /// when the flow is gone.
    pub fn udp_recv_from(
        &mut self,
        id: FlowId,
        buf: &mut [u8],
        waker: Option<&Waker>,
    ) -> Poll<io::Result<(usize, SocketAddr)>> {
        let Some(s) = self.udp(id) else {
            return Poll::Ready(Err(gone()));
        };
        match s.recv_slice(buf) {
            Ok((n, meta)) => Poll::Ready(Ok((n, to_socket_addr(meta.endpoint)))),
            Err(udp::RecvError::Truncated) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "datagram larger than the buffer (dropped)",
            ))),
            Err(_) => {
                if let Some(w) = waker {
                    s.register_recv_waker(w);
                }
                Poll::Pending
            }
        }
    }

    /// Aborts TCP flow `id` (a reset is sent on the next egress pass).
    pub fn abort(&mut self, id: FlowId) {
        if let Some(s) = self.tcp(id) {
            s.abort();
            self.queue_egress(id.index);
        }
    }

    /// The application lets go of flow `id`. A TCP connection is closed (FIN after the data
    /// still queued) and freed once closed; a UDP socket is freed at once.
    pub fn release(&mut self, id: FlowId) {
        let Some(f) = self.flow(id) else {
            return;
        };
        f.held = false;
        match f.proto {
            Proto::Udp => self.free(id.index),
            Proto::Tcp => {
                f.set.get_mut::<tcp::Socket<'static>>(f.handle).close();
                self.queue_egress(id.index);
                self.settle(id.index);
            }
        }
    }

    /// Ports freed since the last call (for the caller to stop steering them).
    pub fn take_freed_ports(&mut self, out: &mut Vec<(Proto, u16)>) {
        out.append(&mut self.freed_ports);
    }
}
