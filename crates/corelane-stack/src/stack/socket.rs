//! What the application's sockets call. Every call that changes what a flow has to send queues
//! the flow for the next egress pass itself; callers never touch engine or smoltcp types.

use std::io;
use std::net::SocketAddr;
use std::task::{Poll, Waker};
use std::time::Duration;

use corelane_frame::Proto;
use smoltcp::wire::{IpAddress, IpEndpoint, Ipv4Address};

use super::{FlowId, PORT_STEPS, Sock, Stack};
use crate::classify::FlowKey;
use crate::config::{EPHEMERAL_START, StackError};
use crate::tcp::{Congestion, Conn, Sizes, TcpState};

/// What [`Stack::tcp_info`] reports of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpInfo {
    /// The state.
    pub state: TcpState,
    /// Smoothed round-trip time, once measured.
    pub srtt: Option<Duration>,
    /// Round-trip time variation (RFC 6298's RTTVAR), once measured.
    pub rttvar: Option<Duration>,
    /// Bytes written and not yet acknowledged by the peer.
    pub send_queue: usize,
    /// Bytes received and not yet read by the application.
    pub recv_queue: usize,
    /// Congestion window, bytes.
    pub cwnd: usize,
    /// The peer's receive window, bytes.
    pub snd_window: usize,
    /// This side's receive window (grows with auto-tuning), bytes.
    pub rcv_window: usize,
    /// The congestion controller.
    pub congestion: Congestion,
    /// Payload bytes per full segment: the smaller of the two sides' MSS, less the options,
    /// and shrunk by path MTU discovery.
    pub mss: usize,
    /// The connection's counters.
    pub stats: crate::tcp::TcpStats,
}

/// The error a socket call returns once the connection ended with `kind`.
pub(super) fn ended(kind: io::ErrorKind) -> io::Error {
    let what = match kind {
        io::ErrorKind::TimedOut => "the connection timed out",
        io::ErrorKind::ConnectionRefused => "the connection was refused",
        io::ErrorKind::ConnectionAborted => "the connection was aborted",
        io::ErrorKind::HostUnreachable => {
            "the peer is unreachable (an ICMP error said so, or ARP/NDP got no answer)"
        }
        _ => "the connection was reset by the peer",
    };
    io::Error::new(kind, what)
}

pub(super) fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the connection is gone")
}

fn to_socket_addr(e: IpEndpoint) -> SocketAddr {
    SocketAddr::new(e.addr.into(), e.port)
}

/// Where a connection opened with [`Stack::connect_tcp_with`] leaves from, and its buffers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectOptions {
    /// The local address and port (an unspecified address: routing picks; port 0: an
    /// ephemeral port of this stack's share).
    pub local: Option<SocketAddr>,
    /// Largest receive window (None: `StackConfig::tcp_rx_buffer`).
    pub rx_buffer: Option<usize>,
    /// Largest send buffer (None: `StackConfig::tcp_tx_buffer`).
    pub tx_buffer: Option<usize>,
    /// IPv4 type of service / IPv6 traffic class of its packets, from the SYN on (its ECN
    /// bits are the stack's).
    pub tos: u8,
}

impl Stack {
    /// A free port of this stack's share of the ephemeral range (`port % cores == core`) for
    /// a connection from `local` to `remote` (None: a port with no destination yet), chosen
    /// as RFC 6056's algorithm 4 does (`Secret::port_hashes`): one destination's
    /// connections take the ports of the share in turn from a secret start.
    pub(super) fn ephemeral_port(
        &mut self,
        proto: Proto,
        to: Option<(IpAddress, IpEndpoint)>,
    ) -> Result<u16, StackError> {
        let cores = self.cfg.cores as u32;
        let span = (u32::from(u16::MAX) - u32::from(EPHEMERAL_START) + 1) / cores;
        let (start, group) = match to {
            Some((local, remote)) => self.secret.port_hashes(local, remote, 0),
            None => {
                self.port_draws += 1;
                let none = IpAddress::Ipv4(Ipv4Address::UNSPECIFIED);
                self.secret
                    .port_hashes(none, IpEndpoint::new(none, 0), self.port_draws)
            }
        };
        let step = &mut self.port_steps[group as usize % PORT_STEPS];
        let base = u32::from(EPHEMERAL_START).div_ceil(cores) * cores + self.cfg.core as u32;
        for _ in 0..span {
            let k = *step;
            *step = step.wrapping_add(1);
            let port = base + (start.wrapping_add(k) % span) * cores;
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

    /// The sizes a TCP connection to `remote` opens with.
    pub(super) fn sizes(&self, remote: IpAddress) -> Sizes {
        let headers = match remote {
            IpAddress::Ipv4(_) => 40,
            IpAddress::Ipv6(_) => 60,
        };
        Sizes {
            mss: self.mtu.saturating_sub(headers).clamp(536, 65535) as u16,
            rx_max: self.cfg.tcp_rx_buffer.max(1),
            tx_max: self.cfg.tcp_tx_buffer.max(1),
        }
    }

    /// Opens a TCP connection to `remote` from a port of this stack's share of the ephemeral
    /// range, so that the runtime can tell which core the peer's segments belong to. Returns the
    /// flow and its local port (which the caller must steer to this interface).
    ///
    /// # Errors
    /// No owned address of the remote's family, no route to it, no free port, a remote that
    /// cannot be connected to (port 0, an unspecified or multicast address), or as many
    /// connections as `StackConfig::max_tcp` already held.
    pub fn connect_tcp(&mut self, remote: SocketAddr) -> Result<(FlowId, u16), StackError> {
        self.connect_tcp_with(remote, ConnectOptions::default())
    }

    /// As [`Stack::connect_tcp`], from the local address and port of `opts.local` (an
    /// unspecified address: the one routing picks; port 0: an ephemeral one) and with its
    /// buffer sizes.
    ///
    /// # Errors
    /// As [`Stack::connect_tcp`]; also a local address this stack does not own or of the
    /// other family, and a local port already in use here.
    pub fn connect_tcp_with(
        &mut self,
        remote: SocketAddr,
        opts: ConnectOptions,
    ) -> Result<(FlowId, u16), StackError> {
        let now = self.clock;
        if remote.port() == 0 || remote.ip().is_unspecified() || remote.ip().is_multicast() {
            return Err(StackError::Refused(format!(
                "cannot connect to {remote}: not a unicast address and port"
            )));
        }
        if self.tcp_conns >= self.cfg.max_tcp {
            self.stats.tcp_conn_limited += 1;
            return Err(StackError::TooManyConnections {
                core: self.cfg.core,
                max: self.cfg.max_tcp,
            });
        }
        let remote = IpEndpoint::from(remote);
        let local_addr = match opts.local.map(|l| l.ip()) {
            Some(ip) if !ip.is_unspecified() => {
                let a = IpAddress::from(ip);
                let same_family =
                    std::mem::discriminant(&a) == std::mem::discriminant(&remote.addr);
                if !same_family || !self.addrs.iter().any(|c| c.address() == a) {
                    return Err(StackError::NotOwned(ip));
                }
                a
            }
            _ => self.local_addr_for(remote.addr)?,
        };
        if self.next_hop(remote.addr).is_none() {
            return Err(StackError::NoRoute(remote.addr.into()));
        }
        let port = match opts.local.map_or(0, |l| l.port()) {
            0 => self.ephemeral_port(Proto::Tcp, Some((local_addr, remote)))?,
            p if self.ports.contains(&(Proto::Tcp, p)) || self.listeners.contains_key(&p) => {
                return Err(StackError::InUse {
                    proto: "TCP",
                    port: p,
                });
            }
            p => p,
        };
        let local = IpEndpoint::new(local_addr, port);
        let mut sizes = self.sizes(remote.addr);
        if let Some(n) = opts.rx_buffer {
            sizes.rx_max = n.max(1);
        }
        if let Some(n) = opts.tx_buffer {
            sizes.tx_max = n.max(1);
        }
        let conn = Conn::connect(
            self.tcp_cfg.clone(),
            &self.secret,
            local,
            remote,
            sizes,
            now,
        );
        let key = FlowKey { local, remote };
        let i = self.insert_tcp(conn, |f| {
            f.key = Some(key);
            f.held = true;
            f.ephemeral = true;
            f.tos = opts.tos;
        });
        self.table.insert(key, i);
        self.ports.insert((Proto::Tcp, port));
        self.queue_egress(i);
        Ok((self.id_of(i), port))
    }

    /// The TCP connection of flow `id` (None if the id is stale or not TCP).
    pub(crate) fn conn(&mut self, id: FlowId) -> Option<&mut Conn> {
        self.flow(id)?.conn()
    }

    /// Runs `f` on TCP flow `id`'s connection, then queues the flow for egress when `f` says
    /// its output may have changed.
    fn with_tcp<R>(&mut self, id: FlowId, f: impl FnOnce(&mut Conn) -> (R, bool)) -> io::Result<R> {
        let (r, changed) = self.conn(id).map(f).ok_or_else(gone)?;
        if changed {
            self.queue_egress(id.index);
        }
        Ok(r)
    }

    /// [`with_tcp`](Self::with_tcp) for the socket calls that poll: a gone flow is a ready
    /// error like any other.
    pub(super) fn poll_tcp<T>(
        &mut self,
        id: FlowId,
        f: impl FnOnce(&mut Conn) -> (Poll<io::Result<T>>, bool),
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
        self.conn(id).map(|c| c.state())
    }

    /// Queues `buf` (as much as fits) for sending on TCP flow `id`. `Pending` means the send
    /// buffer is full, and `waker` (if given) is woken when room frees up.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone; `ConnectionReset` (or the error that ended the
    /// connection) after it ended abnormally, `BrokenPipe` after this side shut down writing
    /// or the connection closed.
    pub fn tcp_write(
        &mut self,
        id: FlowId,
        buf: &[u8],
        waker: Option<&Waker>,
    ) -> Poll<io::Result<usize>> {
        let r = self.poll_tcp(id, |c| {
            if let Some(kind) = c.error() {
                return (Poll::Ready(Err(ended(kind))), false);
            }
            if !c.may_send() {
                let e = io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the connection is closed for writing",
                );
                return (Poll::Ready(Err(e)), false);
            }
            if buf.is_empty() {
                return (Poll::Ready(Ok(0)), false);
            }
            let n = c.write(buf);
            if n > 0 {
                (Poll::Ready(Ok(n)), true)
            } else {
                if let Some(w) = waker {
                    c.set_tx_waker(w);
                }
                (Poll::Pending, false)
            }
        });
        if r.is_pending() {
            self.wait_for_memory(id);
        }
        r
    }

    /// Bytes TCP flow `id` can take into its send buffer now.
    pub fn tcp_send_room(&mut self, id: FlowId) -> usize {
        self.conn(id).map_or(0, |c| c.send_room())
    }

    /// Whether the handshake of TCP flow `id` is done: `Pending` while it runs (`waker`, if
    /// given, is woken when it ends).
    ///
    /// # Errors
    /// `ConnectionRefused` when the peer refused (a reset, or ICMP port unreachable),
    /// `TimedOut` when it never answered, `HostUnreachable` when it never answered and ICMP
    /// said why or its next hop never answered ARP/NDP (after 3 s); `NotConnected` when the
    /// flow is gone.
    pub fn tcp_connected(&mut self, id: FlowId, waker: Option<&Waker>) -> Poll<io::Result<()>> {
        let r = self.poll_tcp(id, |c| match c.state() {
            TcpState::SynSent | TcpState::SynReceived => {
                if let Some(w) = waker {
                    c.set_tx_waker(w);
                }
                (Poll::Pending, false)
            }
            TcpState::Closed => {
                let kind = c.error().unwrap_or(io::ErrorKind::ConnectionRefused);
                (Poll::Ready(Err(kind.into())), false)
            }
            _ => (Poll::Ready(Ok(())), false),
        });
        match r {
            // Name the peer, looked up only when failing.
            Poll::Ready(Err(e)) if e.kind() != io::ErrorKind::NotConnected => {
                let what = match e.kind() {
                    io::ErrorKind::TimedOut => "timed out",
                    io::ErrorKind::ConnectionRefused => "refused",
                    io::ErrorKind::HostUnreachable => {
                        "failed: the host is unreachable (an ICMP error said so, or ARP/NDP got \
                         no answer)"
                    }
                    _ => "failed",
                };
                let to = match self.tcp_addrs(id) {
                    Some((_, remote)) => format!("connection to {remote} {what}"),
                    None => format!("connection {what}"),
                };
                Poll::Ready(Err(io::Error::new(e.kind(), to)))
            }
            other => other,
        }
    }

    /// Ready when a write on TCP flow `id` would not wait: room in the send buffer, or an
    /// error a write would return (`waker`, if given, is woken when room frees up).
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn tcp_poll_writable(&mut self, id: FlowId, waker: Option<&Waker>) -> Poll<io::Result<()>> {
        self.poll_tcp(id, |c| {
            if c.error().is_some() || !c.may_send() || c.send_room() > 0 {
                (Poll::Ready(Ok(())), false)
            } else {
                if let Some(w) = waker {
                    c.set_tx_waker(w);
                }
                (Poll::Pending, false)
            }
        })
    }

    /// Closes TCP flow `id` for writing: a FIN follows the data already queued.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn tcp_shutdown(&mut self, id: FlowId) -> io::Result<()> {
        self.with_tcp(id, |c| (c.close(), true))
    }

    /// Sends small writes at once (true) or coalesces them (Nagle) on TCP flow `id`.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn tcp_set_nodelay(&mut self, id: FlowId, nodelay: bool) -> io::Result<()> {
        self.with_tcp(id, |c| (c.set_nodelay(nodelay), true))
    }

    /// Whether small writes on TCP flow `id` go out at once.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn tcp_nodelay(&mut self, id: FlowId) -> io::Result<bool> {
        self.with_tcp(id, |c| (c.nodelay(), false))
    }

    /// How many of the bytes still to read on TCP flow `id` are urgent data: up to the
    /// point the peer's urgent pointer marked (RFC 9293 MUST-31), 0 when none is pending. The
    /// urgent data is read in order with the rest (inline, as a kernel socket with
    /// `SO_OOBINLINE`); this says where it ends.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn tcp_urgent(&mut self, id: FlowId) -> io::Result<usize> {
        self.with_tcp(id, |c| (c.urgent_unread(), false))
    }

    /// Sends keep-alive probes on TCP flow `id` after `interval` of silence (None: off); after
    /// [`TcpConfig::keepalive_probes`](crate::tcp::TcpConfig::keepalive_probes) unanswered
    /// probes the connection ends with `TimedOut`.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn tcp_set_keepalive(&mut self, id: FlowId, interval: Option<Duration>) -> io::Result<()> {
        let now = self.clock;
        self.with_tcp(id, |c| {
            (c.set_keepalive(interval.map(Into::into), now), true)
        })
    }

    /// Sets the user timeout of TCP flow `id` (RFC 5482): when data it sent stays
    /// unacknowledged this long, the connection is reset and ends with `TimedOut`. At least one
    /// second; the default is [`TcpConfig::user_timeout`](crate::tcp::TcpConfig::user_timeout).
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn tcp_set_user_timeout(&mut self, id: FlowId, timeout: Duration) -> io::Result<()> {
        self.with_tcp(id, |c| (c.set_user_timeout(timeout.into()), true))
    }

    /// The user timeout of TCP flow `id`.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn tcp_user_timeout(&mut self, id: FlowId) -> io::Result<Duration> {
        self.with_tcp(id, |c| (c.user_timeout().into(), false))
    }

    /// Switches the congestion controller of TCP flow `id`.
    ///
    /// # Errors
    /// `NotConnected` when the flow is gone.
    pub fn tcp_set_congestion(&mut self, id: FlowId, cc: Congestion) -> io::Result<()> {
        self.with_tcp(id, |c| (c.set_congestion(cc), false))
    }

    /// What TCP flow `id` knows of its path: smoothed RTT, congestion window, the peer's
    /// window and its own receive window, and its counters.
    pub fn tcp_info(&mut self, id: FlowId) -> Option<TcpInfo> {
        self.conn(id).map(|c| info_of(c))
    }

    /// Every TCP connection of this core with what [`tcp_info`](Self::tcp_info) says of it,
    /// for diagnostics (the published connection table): `f` is called once per connection.
    pub fn each_tcp(&mut self, mut f: impl FnMut(SocketAddr, SocketAddr, &TcpInfo)) {
        for slot in &self.slots {
            if let Some(Sock::Tcp(c)) = slot.flow.as_ref().map(|fl| &fl.sock) {
                let (l, r) = (c.local(), c.remote());
                f(to_socket_addr(l), to_socket_addr(r), &info_of(c));
            }
        }
    }
}

fn info_of(c: &Conn) -> TcpInfo {
    let (send_queue, recv_queue) = c.queues();
    TcpInfo {
        state: c.state(),
        srtt: c.srtt().map(Into::into),
        rttvar: c.rttvar().map(Into::into),
        send_queue,
        recv_queue,
        cwnd: c.cwnd(),
        snd_window: c.snd_window(),
        rcv_window: c.rcv_window(),
        congestion: c.congestion(),
        mss: c.mss(),
        stats: c.stats.get(),
    }
}

impl Stack {
    /// Aborts TCP flow `id` (a reset is sent on the next egress pass).
    pub fn abort(&mut self, id: FlowId) {
        if let Some(c) = self.conn(id) {
            c.abort();
            self.queue_egress(id.index);
        }
    }

    /// The application lets go of flow `id`. A TCP connection is closed (FIN after the data
    /// still queued; a reset if received data was left unread) and freed once closed, never
    /// later than the FIN-WAIT-2 and TIME-WAIT timers allow; a UDP socket is freed at once.
    pub fn release(&mut self, id: FlowId) {
        let now = self.clock;
        let Some(f) = self.flow(id) else {
            return;
        };
        f.held = false;
        match &mut f.sock {
            Sock::Udp(..) => self.udp_release(id.index),
            Sock::Tcp(c) => {
                c.release(now);
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
