//! The protocol stage behind an O(1) flow table.
//!
//! smoltcp finds the socket for a segment by scanning its whole `SocketSet`, and finds work to
//! send by scanning it again. Here every flow owns a `SocketSet` holding exactly one socket, and
//! a hash table from the connection's addresses to the flow picks the set for each frame, so
//! smoltcp only ever looks at the one socket a frame is for. Egress polls only the flows that
//! received something, that the application wrote to, or whose timer is due (a heap of
//! deadlines), so the per-frame cost does not grow with the number of open connections.
//!
//! Listeners give TCP a backlog: a SYN for a listening port gets a fresh listening socket in a
//! new flow (up to the backlog, counting half-open and not-yet-accepted connections; past it the
//! SYN is dropped, not reset); once established the flow joins the accept queue and exactly one
//! waiting accept is woken.
//!
//! With several cores, each has its own [`Stack`]. A frame that reaches a core whose table does
//! not know its flow is routed by a rule every core computes alike: a destination port from the
//! ephemeral range belongs to core `port % cores` (connections this side opens pick their port
//! that way), and an unknown segment for a listening port goes around the ring of cores once
//! before it is answered with a reset. The caller moves those frames (see [`Stack::ingress`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::io;
use std::task::Waker;

use corelane_xsk::{FrameCounts, FrameIo};
use rustc_hash::FxBuildHasher;
use smoltcp::iface::{Config, Interface, PollResult, SocketHandle, SocketSet};
use smoltcp::socket::{AnySocket, tcp, udp};
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpEndpoint};

use crate::classify::{Class, FlowKey};
use crate::device::XdpDevice;
use crate::flows::FlowTable;
use crate::tune::BatchTuner;

/// First port of the ephemeral range from which connections this side opens take their port.
pub const EPHEMERAL_START: u16 = 49152;

/// Sizes and limits of a [`Stack`].
#[derive(Debug, Clone, Copy)]
pub struct StackConfig {
    /// Receive buffer per TCP connection, in bytes (sets the advertised window and its scale).
    pub tcp_rx_buffer: usize,
    /// Send buffer per TCP connection, in bytes.
    pub tcp_tx_buffer: usize,
    /// Default most connections per listener that are half-open or waiting to be accepted.
    pub backlog: usize,
    /// Datagrams buffered per UDP socket, each way.
    pub udp_packets: usize,
    /// Payload bytes buffered per UDP socket, each way.
    pub udp_bytes: usize,
    /// Frames per RX batch and per TX kick.
    pub batch: usize,
    /// Flows the table is sized for at start (it grows past this if it must).
    pub flows: usize,
    /// This stack's core index, in `0..cores`.
    pub core: usize,
    /// How many cores (stacks) share the interface.
    pub cores: usize,
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
            flows: 4096,
            core: 0,
            cores: 1,
        }
    }
}

/// Errors of the protocol stage.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StackError {
    /// The port already has a listener or socket.
    #[error("{proto} port {port} is already in use on this core")]
    InUse {
        /// "TCP" or "UDP".
        proto: &'static str,
        /// The port.
        port: u16,
    },
    /// Every ephemeral port this core may use is taken.
    #[error(
        "no free ephemeral {proto} port on core {core} (each core uses 1/{cores} of 49152-65535)"
    )]
    NoPort {
        /// "TCP" or "UDP".
        proto: &'static str,
        /// This core.
        core: usize,
        /// Cores sharing the range.
        cores: usize,
    },
    /// No owned address of the remote's family to connect from.
    #[error("no local {0} address to connect from: add one with .addr()")]
    NoAddress(&'static str),
    /// smoltcp refused an operation.
    #[error("{0}")]
    Refused(String),
}

impl From<StackError> for io::Error {
    fn from(e: StackError) -> io::Error {
        let kind = match e {
            StackError::InUse { .. } => io::ErrorKind::AddrInUse,
            StackError::NoPort { .. } | StackError::NoAddress(_) => io::ErrorKind::AddrNotAvailable,
            StackError::Refused(_) => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, e)
    }
}

/// Transport protocol of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// Names a flow (a TCP connection or a UDP socket) of a [`Stack`]. A stale id (its flow was
/// freed and the slot reused) is recognised and refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowId {
    index: u32,
    generation: u32,
}

/// Counters of a [`Stack`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StackStats {
    /// Frames given to a flow found in the table (or a bound UDP port).
    pub demux_hits: u64,
    /// SYNs that opened a new flow on a listener.
    pub syn_accepted: u64,
    /// SYNs dropped because the listener's backlog was full.
    pub syn_dropped: u64,
    /// Frames for no known flow, answered by smoltcp (reset, ICMP unreachable) or used for ARP,
    /// NDP and ICMP echo.
    pub no_flow: u64,
    /// Frames handed to another core.
    pub handed_off: u64,
    /// Frames that should have gone to another core but the channel was full.
    pub handoff_dropped: u64,
    /// Connections moved to an accept queue.
    pub established: u64,
    /// Accept waiters woken.
    pub accept_wakeups: u64,
    /// Flows polled for egress.
    pub egress_polls: u64,
    /// Flow timers that fired.
    pub timers_fired: u64,
    /// Flows open now.
    pub flows: u64,
}

struct Flow {
    set: SocketSet<'static>,
    handle: SocketHandle,
    proto: Proto,
    /// TCP: the key under which the table holds this flow.
    key: Option<FlowKey>,
    local_port: u16,
    /// While the handshake of a passive open runs: the listener's port.
    listener: Option<u16>,
    /// The application (or an accept queue) holds this flow.
    held: bool,
    /// The local port came from the ephemeral range and is given back when the flow is freed.
    ephemeral: bool,
    deadline: Option<Instant>,
    queued: bool,
}

struct Slot {
    generation: u32,
    flow: Option<Flow>,
}

#[derive(Debug)]
struct Listener {
    backlog: usize,
    half_open: usize,
    ready: VecDeque<FlowId>,
    waiters: VecDeque<(u64, Waker)>,
}

enum Route {
    Flow(u32),
    Open(u16, FlowKey),
    NoFlow,
    Handoff(usize, u8),
    Drop,
    Neighbor(bool),
}

/// One core's protocol state: smoltcp's interface, the flow table, listeners and timers. The
/// device is passed in to each call, so the same stack runs over AF_XDP or an in-memory link.
pub struct Stack {
    iface: Interface,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    table: FlowTable,
    udp: HashMap<u16, u32, FxBuildHasher>,
    listeners: HashMap<u16, Listener, FxBuildHasher>,
    ports: HashSet<(Proto, u16), FxBuildHasher>,
    freed_ports: Vec<(Proto, u16)>,
    empty: SocketSet<'static>,
    egress: Vec<u32>,
    egress_spare: Vec<u32>,
    timers: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    cfg: StackConfig,
    stats: StackStats,
    rng: u64,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("core", &self.cfg.core)
            .field("addrs", &self.iface.ip_addrs())
            .field("flows", &self.table.len())
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

fn proto_name(p: Proto) -> &'static str {
    match p {
        Proto::Tcp => "TCP",
        Proto::Udp => "UDP",
    }
}

/// True for the TCP states in which a passive open has completed its handshake.
fn established(s: tcp::State) -> bool {
    !matches!(
        s,
        tcp::State::Listen | tcp::State::SynReceived | tcp::State::SynSent | tcp::State::Closed
    )
}

impl Stack {
    /// A stack with hardware address `mac` and the given IP addresses, for frames moved by `dev`
    /// (whose capabilities it reads). The TCP initial sequence numbers are seeded from the OS.
    pub fn new<P: FrameIo>(
        dev: &mut XdpDevice<P>,
        mac: [u8; 6],
        addrs: &[IpCidr],
        cfg: StackConfig,
    ) -> Self {
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac)));
        config.random_seed = os_random_seed();
        let mut iface = Interface::new(config, dev, Instant::ZERO);
        iface.update_ip_addrs(|a| {
            for c in addrs {
                if a.push(*c).is_err() {
                    log::warn!("address {c} dropped: at most {} addresses", a.capacity());
                }
            }
        });
        let cfg = StackConfig {
            cores: cfg.cores.max(1),
            core: cfg.core.min(cfg.cores.max(1) - 1),
            ..cfg
        };
        Stack {
            iface,
            slots: Vec::with_capacity(cfg.flows),
            free_slots: Vec::new(),
            table: FlowTable::with_capacity(cfg.flows),
            udp: HashMap::default(),
            listeners: HashMap::default(),
            ports: HashSet::default(),
            freed_ports: Vec::new(),
            empty: SocketSet::new(Vec::new()),
            egress: Vec::with_capacity(cfg.batch * 2),
            egress_spare: Vec::with_capacity(cfg.batch * 2),
            timers: BinaryHeap::with_capacity(cfg.flows),
            cfg,
            stats: StackStats::default(),
            rng: os_random_seed() | 1,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &StackConfig {
        &self.cfg
    }

    /// Counters so far.
    pub fn stats(&self) -> StackStats {
        StackStats {
            flows: (self.slots.len() - self.free_slots.len()) as u64,
            ..self.stats
        }
    }

    /// The core that owns flows whose local port is `port`, by the rule every core shares.
    pub fn owner_of_port(&self, port: u16) -> usize {
        if port >= EPHEMERAL_START {
            usize::from(port) % self.cfg.cores
        } else {
            self.cfg.core
        }
    }

    // ----- flow slots -----------------------------------------------------------------------

    fn flow(&mut self, id: FlowId) -> Option<&mut Flow> {
        let slot = self.slots.get_mut(id.index as usize)?;
        if slot.generation != id.generation {
            return None;
        }
        slot.flow.as_mut()
    }

    fn id_of(&self, index: u32) -> FlowId {
        FlowId {
            index,
            generation: self.slots[index as usize].generation,
        }
    }

    fn insert(
        &mut self,
        socket: impl AnySocket<'static>,
        proto: Proto,
        local_port: u16,
        setup: impl FnOnce(&mut Flow),
    ) -> u32 {
        let mut set = SocketSet::new(Vec::with_capacity(1));
        let handle = set.add(socket);
        let mut flow = Flow {
            set,
            handle,
            proto,
            key: None,
            local_port,
            listener: None,
            held: false,
            ephemeral: false,
            deadline: None,
            queued: false,
        };
        setup(&mut flow);
        match self.free_slots.pop() {
            Some(i) => {
                self.slots[i as usize].flow = Some(flow);
                i
            }
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    flow: Some(flow),
                });
                (self.slots.len() - 1) as u32
            }
        }
    }

    fn free(&mut self, index: u32) {
        let slot = &mut self.slots[index as usize];
        let Some(flow) = slot.flow.take() else {
            return;
        };
        slot.generation = slot.generation.wrapping_add(1);
        if let Some(key) = flow.key {
            self.table.remove(&key);
        }
        if flow.proto == Proto::Udp {
            self.udp.remove(&flow.local_port);
        }
        if flow.ephemeral || flow.proto == Proto::Udp {
            self.ports.remove(&(flow.proto, flow.local_port));
            self.freed_ports.push((flow.proto, flow.local_port));
        }
        self.free_slots.push(index);
    }

    fn queue_egress(&mut self, index: u32) {
        if let Some(f) = self.slots[index as usize].flow.as_mut()
            && !f.queued
        {
            f.queued = true;
            self.egress.push(index);
        }
    }

    fn tcp_state(&self, index: u32) -> Option<tcp::State> {
        let f = self.slots[index as usize].flow.as_ref()?;
        (f.proto == Proto::Tcp).then(|| f.set.get::<tcp::Socket<'static>>(f.handle).state())
    }

    /// After a flow was polled: promote a finished handshake to the accept queue, free what is
    /// closed and no longer held.
    fn settle(&mut self, index: u32) {
        let Some(state) = self.tcp_state(index) else {
            return;
        };
        let id = self.id_of(index);
        let Some(f) = self.slots[index as usize].flow.as_mut() else {
            return;
        };
        if let Some(port) = f.listener {
            if established(state) {
                f.listener = None;
                f.held = true;
                if let Some(l) = self.listeners.get_mut(&port) {
                    l.half_open -= 1;
                    l.ready.push_back(id);
                    self.stats.established += 1;
                    if let Some((_, w)) = l.waiters.pop_front() {
                        self.stats.accept_wakeups += 1;
                        w.wake();
                    }
                }
            } else if matches!(state, tcp::State::Closed | tcp::State::Listen) {
                // Reset or timed out during the handshake.
                if let Some(l) = self.listeners.get_mut(&port) {
                    l.half_open -= 1;
                }
                self.free(index);
            }
        } else if state == tcp::State::Closed {
            if !f.held && !f.queued {
                // Not while queued for egress: an aborted connection still owes its peer the
                // reset, which the egress pass sends before it settles the flow again.
                self.free(index);
            } else if let Some(key) = f.key.take() {
                // Closed but still held: a new connection on the same addresses and ports (a
                // peer reusing its port) must open a new flow, not meet this one.
                if self.table.get(&key) == Some(index) {
                    self.table.remove(&key);
                }
            }
        }
    }

    // ----- the pipeline ---------------------------------------------------------------------

    fn route(&mut self, class: Class, hops: u8) -> Route {
        let cores = self.cfg.cores;
        match class {
            Class::Tcp { key, syn } => {
                if let Some(i) = self.table.get(&key) {
                    return Route::Flow(i);
                }
                let port = key.local.port;
                if let Some(l) = self.listeners.get(&port) {
                    if syn {
                        return if l.half_open + l.ready.len() >= l.backlog {
                            self.stats.syn_dropped += 1;
                            Route::Drop
                        } else {
                            Route::Open(port, key)
                        };
                    }
                    // Another core may have taken this connection's SYN: go round the ring once.
                    if usize::from(hops) + 1 < cores {
                        return Route::Handoff((self.cfg.core + 1) % cores, hops + 1);
                    }
                    return Route::NoFlow;
                }
                let owner = self.owner_of_port(port);
                if owner != self.cfg.core && hops == 0 {
                    return Route::Handoff(owner, 1);
                }
                Route::NoFlow
            }
            Class::Udp { key } => {
                if let Some(&i) = self.udp.get(&key.local.port) {
                    return Route::Flow(i);
                }
                let owner = self.owner_of_port(key.local.port);
                if owner != self.cfg.core && hops == 0 {
                    return Route::Handoff(owner, 1);
                }
                Route::NoFlow
            }
            Class::Neighbor { reply } => Route::Neighbor(reply && hops == 0),
            _ => Route::NoFlow,
        }
    }

    /// Gives the next waiting frame to flow `i`'s socket alone, then settles the flow and queues
    /// it for egress (its ACK, its reply).
    fn feed<P: FrameIo>(&mut self, now: Instant, dev: &mut XdpDevice<P>, i: u32) {
        let Some(f) = self.slots[i as usize].flow.as_mut() else {
            dev.skip();
            return;
        };
        self.iface.poll_ingress_single(now, dev, &mut f.set);
        self.settle(i);
        self.queue_egress(i);
    }

    /// Flow demux and protocol stages over the frames `dev` has classified: each frame goes to
    /// its flow's socket alone. Frames another core owns are given to `handoff(core, hops,
    /// bytes)` (which returns false if it could not take them), and neighbor replies are copied
    /// to every other core as well. Returns how many frames were consumed.
    pub fn ingress<P: FrameIo>(
        &mut self,
        now: Instant,
        dev: &mut XdpDevice<P>,
        handoff: &mut dyn FnMut(usize, u8, &[u8]) -> bool,
    ) -> usize {
        let mut n = 0;
        while let Some((class, hops)) = dev.peek() {
            n += 1;
            match self.route(class, hops) {
                Route::Flow(i) => {
                    self.stats.demux_hits += 1;
                    self.feed(now, dev, i);
                }
                Route::Open(port, key) => {
                    let mut s = new_tcp(&self.cfg);
                    if s.listen(port).is_err() {
                        dev.skip();
                        continue;
                    }
                    let i = self.insert(s, Proto::Tcp, port, |f| {
                        f.key = Some(key);
                        f.listener = Some(port);
                    });
                    self.table.insert(key, i);
                    if let Some(l) = self.listeners.get_mut(&port) {
                        l.half_open += 1;
                    }
                    self.stats.syn_accepted += 1;
                    self.feed(now, dev, i);
                }
                Route::NoFlow => {
                    self.stats.no_flow += 1;
                    self.iface.poll_ingress_single(now, dev, &mut self.empty);
                }
                Route::Handoff(core, hops) => {
                    if dev.front_bytes().is_some_and(|b| handoff(core, hops, b)) {
                        self.stats.handed_off += 1;
                    } else {
                        self.stats.handoff_dropped += 1;
                    }
                    dev.skip();
                }
                Route::Drop => dev.skip(),
                Route::Neighbor(broadcast) => {
                    if broadcast && let Some(bytes) = dev.front_bytes() {
                        for c in (0..self.cfg.cores).filter(|&c| c != self.cfg.core) {
                            if handoff(c, 1, bytes) {
                                self.stats.handed_off += 1;
                            } else {
                                self.stats.handoff_dropped += 1;
                            }
                        }
                    }
                    self.stats.no_flow += 1;
                    self.iface.poll_ingress_single(now, dev, &mut self.empty);
                    // Flows waiting for this neighbor have a timer; poll them now.
                    for i in 0..self.slots.len() as u32 {
                        if self.slots[i as usize]
                            .flow
                            .as_ref()
                            .is_some_and(|f| f.deadline.is_some())
                        {
                            self.queue_egress(i);
                        }
                    }
                }
            }
        }
        n
    }

    /// Egress stage: polls the flows that received frames, were written to, or whose timer is
    /// due, and schedules each one's next timer. Returns how many flows were polled.
    pub fn egress<P: FrameIo>(&mut self, now: Instant, dev: &mut XdpDevice<P>) -> usize {
        while let Some(&Reverse((t, index, generation))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let slot = &mut self.slots[index as usize];
            if slot.generation == generation
                && let Some(f) = slot.flow.as_mut()
                && f.deadline == Some(t)
            {
                f.deadline = None;
                self.stats.timers_fired += 1;
                self.queue_egress(index);
            }
        }
        let mut list = std::mem::replace(&mut self.egress, std::mem::take(&mut self.egress_spare));
        let polled = list.len();
        // A flow may emit at most this many frames per pass, so one bulk sender cannot starve
        // the others; it stays queued for the next pass.
        let budget = self.cfg.batch.max(8);
        for &index in &list {
            let generation = self.slots[index as usize].generation;
            let Some(f) = self.slots[index as usize].flow.as_mut() else {
                continue;
            };
            f.queued = false;
            self.stats.egress_polls += 1;
            let mut emitted = 0;
            while emitted < budget
                && self.iface.poll_egress(now, dev, &mut f.set) == PollResult::SocketStateChanged
            {
                emitted += 1;
            }
            let at = self.iface.poll_at(now, &f.set);
            if emitted == budget {
                f.queued = true;
                self.egress.push(index);
            } else if let Some(t) = at
                && f.deadline.is_none_or(|d| t < d)
            {
                f.deadline = Some(t);
                self.timers.push(Reverse((t, index, generation)));
            }
            self.settle(index);
        }
        list.clear();
        self.egress_spare = list;
        polled
    }

    /// True when flows wait for an egress pass (the application wrote, or a pass ran out of
    /// budget).
    pub fn egress_pending(&self) -> bool {
        !self.egress.is_empty()
    }

    /// The earliest flow timer, if any (it may be one that no longer matters: waking early is
    /// harmless).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.peek().map(|r| r.0.0)
    }

    // ----- the application's side -----------------------------------------------------------

    /// Listens for TCP connections on `port` on every owned address, with `backlog` connections
    /// at most half-open or waiting to be accepted (None: the configured default).
    pub fn listen_tcp(&mut self, port: u16, backlog: Option<usize>) -> Result<(), StackError> {
        if self.listeners.contains_key(&port) || self.ports.contains(&(Proto::Tcp, port)) {
            return Err(StackError::InUse { proto: "TCP", port });
        }
        self.listeners.insert(
            port,
            Listener {
                backlog: backlog.unwrap_or(self.cfg.backlog).max(1),
                half_open: 0,
                ready: VecDeque::new(),
                waiters: VecDeque::new(),
            },
        );
        Ok(())
    }

    /// Stops listening on `port`: connections not yet accepted are reset, waiting accepts woken.
    pub fn unlisten(&mut self, port: u16) {
        let Some(l) = self.listeners.remove(&port) else {
            return;
        };
        for (_, w) in l.waiters {
            w.wake();
        }
        for id in l.ready {
            self.abort(id);
            self.release(id);
        }
        let pending: Vec<u32> = (0..self.slots.len() as u32)
            .filter(|&i| {
                self.slots[i as usize]
                    .flow
                    .as_ref()
                    .is_some_and(|f| f.listener == Some(port))
            })
            .collect();
        for i in pending {
            let Some(f) = self.slots[i as usize].flow.as_mut() else {
                continue;
            };
            f.listener = None;
            f.set.get_mut::<tcp::Socket<'static>>(f.handle).abort();
            self.queue_egress(i);
        }
    }

    /// True when `port` has a listener.
    pub fn is_listening(&self, port: u16) -> bool {
        self.listeners.contains_key(&port)
    }

    /// Takes the next established connection of the listener on `port`.
    pub fn accept(&mut self, port: u16) -> Option<FlowId> {
        let l = self.listeners.get_mut(&port)?;
        let id = l.ready.pop_front()?;
        // More connections are waiting: pass the baton to the next waiter.
        if !l.ready.is_empty()
            && let Some((_, w)) = l.waiters.pop_front()
        {
            self.stats.accept_wakeups += 1;
            w.wake();
        }
        Some(id)
    }

    /// Registers accept waiter `waiter` (any id unique per listener) to be woken, alone, when a
    /// connection is ready. Registering the same id again replaces its waker in place.
    pub fn accept_wait(&mut self, port: u16, waiter: u64, waker: &Waker) {
        let Some(l) = self.listeners.get_mut(&port) else {
            waker.wake_by_ref();
            return;
        };
        match l.waiters.iter_mut().find(|(id, _)| *id == waiter) {
            Some((_, w)) => w.clone_from(waker),
            None => l.waiters.push_back((waiter, waker.clone())),
        }
    }

    /// Withdraws accept waiter `waiter`; if connections are waiting, the next waiter is woken.
    pub fn accept_cancel(&mut self, port: u16, waiter: u64) {
        let Some(l) = self.listeners.get_mut(&port) else {
            return;
        };
        l.waiters.retain(|(id, _)| *id != waiter);
        if !l.ready.is_empty()
            && let Some((_, w)) = l.waiters.pop_front()
        {
            self.stats.accept_wakeups += 1;
            w.wake();
        }
    }

    /// Connections waiting in the accept queue of the listener on `port`.
    pub fn accept_queue_len(&self, port: u16) -> usize {
        self.listeners.get(&port).map_or(0, |l| l.ready.len())
    }

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

    /// A free port of the ephemeral range that this core owns (`port % cores == core`).
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
            proto: proto_name(proto),
            core: self.cfg.core,
            cores: self.cfg.cores,
        })
    }

    /// Opens a TCP connection to `remote` from an ephemeral port this core owns, so that the
    /// peer's segments are routed here whichever queue they arrive on. Returns the flow and its
    /// local port (which the caller must steer to this interface).
    pub fn connect_tcp(&mut self, remote: IpEndpoint) -> Result<(FlowId, u16), StackError> {
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

    /// Binds a UDP socket to `port` (0: an ephemeral port this core owns) on every owned
    /// address. Returns the flow and the port.
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
    pub fn tcp(&mut self, id: FlowId) -> Option<&mut tcp::Socket<'static>> {
        let f = self.flow(id)?;
        if f.proto != Proto::Tcp {
            return None;
        }
        Some(f.set.get_mut::<tcp::Socket<'static>>(f.handle))
    }

    /// The UDP socket of flow `id` (None if the id is stale or not UDP).
    pub fn udp(&mut self, id: FlowId) -> Option<&mut udp::Socket<'static>> {
        let f = self.flow(id)?;
        if f.proto != Proto::Udp {
            return None;
        }
        Some(f.set.get_mut::<udp::Socket<'static>>(f.handle))
    }

    /// The local and remote endpoints of TCP flow `id`.
    pub fn endpoints(&mut self, id: FlowId) -> Option<FlowKey> {
        self.flow(id)?.key
    }

    /// Queues flow `id` for the next egress pass (the application wrote to it or read from it,
    /// which may open the window).
    pub fn touch(&mut self, id: FlowId) {
        if self.flow(id).is_some() {
            self.queue_egress(id.index);
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

    /// Ends everything at once: every connection is reset, the resets sent, and every frame
    /// given back. Returns the final frame accounting.
    pub fn shutdown<P: FrameIo>(
        &mut self,
        now: Instant,
        dev: &mut XdpDevice<P>,
    ) -> io::Result<FrameCounts> {
        for port in self.listeners.keys().copied().collect::<Vec<_>>() {
            self.unlisten(port);
        }
        for i in 0..self.slots.len() as u32 {
            if let Some(f) = self.slots[i as usize].flow.as_mut() {
                if f.proto == Proto::Tcp {
                    f.set.get_mut::<tcp::Socket<'static>>(f.handle).abort();
                }
                self.queue_egress(i);
            }
        }
        while self.egress_pending() {
            self.egress(now, dev);
            dev.flush()?;
        }
        dev.drain()?;
        Ok(dev.io_mut().counts())
    }
}

/// A stack and its device driven together on one core, with no other cores to hand frames to:
/// what tests, benchmarks and single-core tools need.
#[derive(Debug)]
pub struct Node<P: FrameIo> {
    /// The protocol state.
    pub stack: Stack,
    /// The device moving frames.
    pub dev: XdpDevice<P>,
    /// Adapts the batch size turn by turn when set (Model-T); otherwise the batch is fixed.
    pub tuner: Option<BatchTuner>,
}

impl<P: FrameIo> Node<P> {
    /// A node over `io` with IP MTU `mtu`.
    pub fn new(io: P, mac: [u8; 6], addrs: &[IpCidr], mtu: usize, cfg: StackConfig) -> Self {
        let mut dev = XdpDevice::new(io, mtu, cfg.batch);
        let stack = Stack::new(
            &mut dev,
            mac,
            addrs,
            StackConfig {
                cores: 1,
                core: 0,
                ..cfg
            },
        );
        Node {
            stack,
            dev,
            tuner: None,
        }
    }

    /// One pass of the pipeline: RX batch, classify, demux, protocol, egress, TX with one kick,
    /// recycle, refill. Returns true when any frame moved or any flow was polled.
    pub fn poll(&mut self, now: Instant) -> io::Result<bool> {
        let started = self.tuner.as_ref().map(|t| {
            self.dev.set_batch(t.batch());
            (std::time::Instant::now(), self.dev.stats().tx_frames)
        });
        let pulled = self.dev.pull_batch();
        let consumed = self.stack.ingress(now, &mut self.dev, &mut |_, _, _| false);
        let polled = self.stack.egress(now, &mut self.dev);
        self.dev.flush()?;
        if let (Some(t), Some((started, sent_before))) = (self.tuner.as_mut(), started) {
            let sent = (self.dev.stats().tx_frames - sent_before) as usize;
            t.observe(pulled, sent, started.elapsed().as_nanos() as u64);
        }
        Ok(pulled + consumed + polled > 0)
    }

    /// Resets every connection and gives every frame back; returns the frame accounting.
    pub fn shutdown(&mut self, now: Instant) -> io::Result<FrameCounts> {
        self.stack.shutdown(now, &mut self.dev)
    }
}
