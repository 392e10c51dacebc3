//! The protocol stage: smoltcp's interface and sockets over an [`XdpDevice`], with listening
//! pools that give TCP a backlog (smoltcp has one socket per connection and no accept queue).

use std::collections::VecDeque;
use std::io;

use corelane_xsk::{FrameCounts, FrameIo};
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::socket::{tcp, udp};
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr, IpListenEndpoint};

use crate::device::{DeviceStats, SynGate, XdpDevice};

/// Sizes and limits of a [`Stack`].
#[derive(Debug, Clone, Copy)]
pub struct StackConfig {
    /// Receive buffer per TCP connection, in bytes (sets the advertised window and its scale).
    pub tcp_rx_buffer: usize,
    /// Send buffer per TCP connection, in bytes.
    pub tcp_tx_buffer: usize,
    /// Most connections per listener that are half-open or waiting to be accepted.
    pub backlog: usize,
    /// Datagrams buffered per UDP socket, each way.
    pub udp_packets: usize,
    /// Payload bytes buffered per UDP socket, each way.
    pub udp_bytes: usize,
    /// Frames per RX batch and per TX kick.
    pub batch: usize,
}

impl Default for StackConfig {
    fn default() -> Self {
        StackConfig {
            tcp_rx_buffer: 256 * 1024,
            tcp_tx_buffer: 256 * 1024,
            backlog: 256,
            udp_packets: 256,
            udp_bytes: 256 * 1024,
            batch: 64,
        }
    }
}

/// Errors of the protocol stage.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StackError {
    /// The port already has a listener or socket.
    #[error("{proto} port {port} is already in use")]
    InUse {
        /// "TCP" or "UDP".
        proto: &'static str,
        /// The port.
        port: u16,
    },
    /// smoltcp refused an operation.
    #[error("{0}")]
    Refused(String),
}

/// A listener: its idle listening sockets, the connections being set up, and the accept queue.
#[derive(Debug)]
struct Listener {
    port: u16,
    idle: Vec<SocketHandle>,
    syn_rcvd: Vec<SocketHandle>,
    ready: VecDeque<SocketHandle>,
    /// SYNs admitted in this batch, each needing an idle socket.
    admitted: usize,
    open: bool,
}

/// Identifies a listener of a [`Stack`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerId(usize);

/// One stack instance: interface, sockets, device.
pub struct Stack<P: FrameIo> {
    iface: Interface,
    device: XdpDevice<P>,
    sockets: SocketSet<'static>,
    listeners: Vec<Listener>,
    udp_ports: Vec<u16>,
    cfg: StackConfig,
}

impl<P: FrameIo> std::fmt::Debug for Stack<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("addrs", &self.iface.ip_addrs())
            .field("listeners", &self.listeners.len())
            .finish_non_exhaustive()
    }
}

fn new_tcp(cfg: &StackConfig) -> tcp::Socket<'static> {
    let rx = tcp::SocketBuffer::new(vec![0u8; cfg.tcp_rx_buffer]);
    let tx = tcp::SocketBuffer::new(vec![0u8; cfg.tcp_tx_buffer]);
    let mut s = tcp::Socket::new(rx, tx);
    s.set_nagle_enabled(false);
    s.set_ack_delay(Some(Duration::from_millis(1)));
    s
}

/// A seed for smoltcp's generator (initial sequence numbers, ephemeral ports) from the OS.
pub fn os_random_seed() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into the valid buffer `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == 8 {
        u64::from_ne_bytes(b)
    } else {
        // getrandom cannot fail for 8 bytes once the pool is initialised; fall back to time.
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x5eed)
    }
}

struct Gate<'a> {
    listeners: &'a mut [Listener],
    sockets: &'a mut SocketSet<'static>,
    cfg: &'a StackConfig,
}

impl SynGate for Gate<'_> {
    fn admit_syn(&mut self, port: u16) -> bool {
        let Some(l) = self.listeners.iter_mut().find(|l| l.open && l.port == port) else {
            // No listener: smoltcp answers with a reset, as a closed port should.
            return true;
        };
        if l.syn_rcvd.len() + l.ready.len() + l.admitted >= self.cfg.backlog {
            return false;
        }
        l.admitted += 1;
        while l.idle.len() < l.admitted {
            let mut s = new_tcp(self.cfg);
            if s.listen(l.port).is_err() {
                return false;
            }
            l.idle.push(self.sockets.add(s));
        }
        true
    }
}

impl<P: FrameIo> Stack<P> {
    /// A stack with hardware address `mac` and the given IP addresses over `io`.
    pub fn new(io: P, mac: [u8; 6], addrs: &[IpCidr], mtu: usize, cfg: StackConfig) -> Self {
        let mut device = XdpDevice::new(io, mtu, cfg.batch);
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac)));
        config.random_seed = os_random_seed();
        let mut iface = Interface::new(config, &mut device, Instant::now());
        iface.update_ip_addrs(|a| {
            for c in addrs {
                if a.push(*c).is_err() {
                    log::warn!("address {c} dropped: at most {} addresses", a.capacity());
                }
            }
        });
        Stack {
            iface,
            device,
            sockets: SocketSet::new(Vec::new()),
            listeners: Vec::new(),
            udp_ports: Vec::new(),
            cfg,
        }
    }

    /// Listens for TCP connections on `port` (every owned address).
    pub fn listen_tcp(&mut self, port: u16) -> Result<ListenerId, StackError> {
        if self.listeners.iter().any(|l| l.open && l.port == port) {
            return Err(StackError::InUse { proto: "TCP", port });
        }
        let mut s = new_tcp(&self.cfg);
        s.listen(IpListenEndpoint { addr: None, port })
            .map_err(|e| StackError::Refused(format!("listen on {port}: {e}")))?;
        let h = self.sockets.add(s);
        self.listeners.push(Listener {
            port,
            idle: vec![h],
            syn_rcvd: Vec::new(),
            ready: VecDeque::new(),
            admitted: 0,
            open: true,
        });
        Ok(ListenerId(self.listeners.len() - 1))
    }

    /// The next established connection of listener `id`, if one is waiting.
    pub fn accept(&mut self, id: ListenerId) -> Option<SocketHandle> {
        self.listeners.get_mut(id.0)?.ready.pop_front()
    }

    /// Connections waiting in listener `id`'s accept queue.
    pub fn accept_queue_len(&self, id: ListenerId) -> usize {
        self.listeners.get(id.0).map_or(0, |l| l.ready.len())
    }

    /// Opens a TCP connection to `remote` from `local_port` (0: an ephemeral port).
    pub fn connect_tcp(
        &mut self,
        remote: std::net::SocketAddr,
        local_port: u16,
    ) -> Result<SocketHandle, StackError> {
        let mut s = new_tcp(&self.cfg);
        let local = if local_port == 0 {
            49152 + (os_random_seed() % 16384) as u16
        } else {
            local_port
        };
        s.connect(self.iface.context(), remote, local)
            .map_err(|e| StackError::Refused(format!("connect to {remote}: {e}")))?;
        Ok(self.sockets.add(s))
    }

    /// Binds a UDP socket to `port` on every owned address.
    pub fn bind_udp(&mut self, port: u16) -> Result<SocketHandle, StackError> {
        if self.udp_ports.contains(&port) {
            return Err(StackError::InUse { proto: "UDP", port });
        }
        let meta = || vec![udp::PacketMetadata::EMPTY; self.cfg.udp_packets];
        let rx = udp::PacketBuffer::new(meta(), vec![0u8; self.cfg.udp_bytes]);
        let tx = udp::PacketBuffer::new(meta(), vec![0u8; self.cfg.udp_bytes]);
        let mut s = udp::Socket::new(rx, tx);
        s.bind(port)
            .map_err(|e| StackError::Refused(format!("bind UDP {port}: {e}")))?;
        self.udp_ports.push(port);
        Ok(self.sockets.add(s))
    }

    /// The TCP socket behind `h`.
    pub fn tcp(&mut self, h: SocketHandle) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket<'static>>(h)
    }

    /// The UDP socket behind `h`.
    pub fn udp(&mut self, h: SocketHandle) -> &mut udp::Socket<'static> {
        self.sockets.get_mut::<udp::Socket<'static>>(h)
    }

    /// Frees a closed connection's socket.
    pub fn remove(&mut self, h: SocketHandle) {
        self.sockets.remove(h);
    }

    /// One pass of the pipeline: RX batch, classify, protocol, TX batch with one kick, recycle,
    /// refill. Returns true when any frame moved or any socket may have changed.
    pub fn poll(&mut self, now: Instant) -> io::Result<bool> {
        // TX tokens count frames as smoltcp writes them, so read the counter before the protocol
        // stage runs to see whether this pass sent anything (a retransmission, say).
        let sent_before = self.device.stats().tx_frames;
        let pulled = {
            let mut gate = Gate {
                listeners: &mut self.listeners,
                sockets: &mut self.sockets,
                cfg: &self.cfg,
            };
            self.device.pull_batch(&mut gate)
        };
        let changed = self.iface.poll(now, &mut self.device, &mut self.sockets)
            == smoltcp::iface::PollResult::SocketStateChanged;
        if pulled > 0 || changed {
            self.sweep_listeners();
        }
        let sent = self.device.stats().tx_frames != sent_before;
        self.device.flush()?;
        Ok(pulled > 0 || changed || sent)
    }

    /// Emits what the application queued on its sockets since the last poll.
    pub fn egress(&mut self, now: Instant) -> io::Result<()> {
        self.iface.poll(now, &mut self.device, &mut self.sockets);
        self.device.flush()
    }

    fn sweep_listeners(&mut self) {
        for l in &mut self.listeners {
            l.admitted = 0;
            let mut k = 0;
            while k < l.idle.len() {
                let s = self.sockets.get_mut::<tcp::Socket<'static>>(l.idle[k]);
                if s.state() == tcp::State::Listen {
                    k += 1;
                } else {
                    l.syn_rcvd.push(l.idle.swap_remove(k));
                }
            }
            let mut k = 0;
            while k < l.syn_rcvd.len() {
                let h = l.syn_rcvd[k];
                let s = self.sockets.get_mut::<tcp::Socket<'static>>(h);
                match s.state() {
                    tcp::State::SynReceived => k += 1,
                    tcp::State::Closed | tcp::State::Listen => {
                        // Reset or timed out before it was established: listen again.
                        l.syn_rcvd.swap_remove(k);
                        if s.state() == tcp::State::Closed && s.listen(l.port).is_err() {
                            self.sockets.remove(h);
                        } else {
                            l.idle.push(h);
                        }
                    }
                    _ => {
                        l.syn_rcvd.swap_remove(k);
                        l.ready.push_back(h);
                    }
                }
            }
            if l.idle.is_empty() && l.open {
                let mut s = new_tcp(&self.cfg);
                if s.listen(l.port).is_ok() {
                    l.idle.push(self.sockets.add(s));
                }
            }
        }
    }

    /// How long the caller may sleep before the next timer (retransmit, delayed ACK) is due.
    pub fn poll_delay(&mut self, now: Instant) -> Option<Duration> {
        self.iface.poll_delay(now, &self.sockets)
    }

    /// Frames waiting for the protocol stage (already pulled from the RX ring).
    pub fn rx_pending(&self) -> usize {
        self.device.rx_pending()
    }

    /// Device counters.
    pub fn device_stats(&self) -> DeviceStats {
        self.device.stats()
    }

    /// The frame I/O underneath.
    pub fn io(&self) -> &P {
        self.device.io()
    }

    /// The frame I/O underneath, mutably.
    pub fn io_mut(&mut self) -> &mut P {
        self.device.io_mut()
    }

    /// Closes every socket at once (RST for open connections), emits the resets, and gives every
    /// frame back, returning the final frame accounting.
    pub fn shutdown(&mut self, now: Instant) -> io::Result<FrameCounts> {
        for (_, s) in self.sockets.iter_mut() {
            if let smoltcp::socket::Socket::Tcp(t) = s {
                t.abort();
            }
        }
        for l in &mut self.listeners {
            l.open = false;
        }
        self.iface.poll(now, &mut self.device, &mut self.sockets);
        self.device.drain()?;
        Ok(self.device.io_mut().counts())
    }
}
