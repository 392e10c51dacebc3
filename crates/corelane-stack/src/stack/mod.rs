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
//! With several cores, each has its own [`Stack`]. A frame this stack's table does not claim is
//! offered to the caller's [`Peers`](crate::Peers) (the runtime knows the other cores and which
//! one owns what); only what they leave is answered here (a reset, ICMP).
//!
//! The files: `mod.rs` the flow slots and their life cycle (`settle`), `ingress.rs` demux and
//! protocol, `egress.rs` output and timers, `listen.rs` listeners and accept, `socket.rs` what
//! the application's sockets call.

mod egress;
mod ingress;
mod listen;
mod socket;

pub use socket::TcpState;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use corelane_frame::{FrameIo, Proto};
use rustc_hash::FxBuildHasher;
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::socket::{AnySocket, tcp};
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr};

use crate::classify::FlowKey;
use crate::config::StackConfig;
use crate::device::XdpDevice;
use crate::flows::FlowTable;
use listen::Listener;

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

/// True for the TCP states in which a passive open has completed its handshake.
fn established(s: tcp::State) -> bool {
    !matches!(
        s,
        tcp::State::Listen | tcp::State::SynReceived | tcp::State::SynSent | tcp::State::Closed
    )
}

impl Stack {
    /// A stack with hardware address `mac` and the given IP addresses, for frames moved by `dev`
    /// (whose capabilities it reads). The generators (initial sequence numbers, ephemeral ports)
    /// are seeded from [`StackConfig::seed`], or from the OS when it is None.
    pub fn new<P: FrameIo>(
        dev: &mut XdpDevice<P>,
        mac: [u8; 6],
        addrs: &[IpCidr],
        cfg: StackConfig,
    ) -> Self {
        let seed = cfg.seed_or_random();
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac)));
        config.random_seed = seed;
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
            // A second generator for port choice, kept apart from the sequence numbers'.
            rng: seed.rotate_left(29).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
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

    fn state_of(&self, index: u32) -> Option<tcp::State> {
        let f = self.slots[index as usize].flow.as_ref()?;
        (f.proto == Proto::Tcp).then(|| f.set.get::<tcp::Socket<'static>>(f.handle).state())
    }

    /// After a flow was polled: promote a finished handshake to the accept queue, free what is
    /// closed and no longer held.
    fn settle(&mut self, index: u32) {
        let Some(state) = self.state_of(index) else {
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
}
