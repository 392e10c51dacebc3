//! The protocol stage behind an O(1) flow table.
//!
//! A hash table from a connection's addresses to its flow picks the TCP connection (corelane's
//! own engine, [`crate::tcp`]) or UDP socket ([`crate::udp`]) for each frame. Segments and
//! datagrams go straight from the frame to the connection or socket, and from it into a
//! transmit frame. The stack answers ARP and neighbour solicitations for its addresses and
//! ICMP echo, and reassembles fragments ([`crate::frag`]); smoltcp gives the wire formats.
//! Egress polls only the flows that received something, that the application wrote to, or
//! whose timer is due (a heap of deadlines), so the per-frame cost does not grow with the
//! number of open connections.
//!
//! Listeners give TCP a backlog: a SYN for a listening port opens a connection in a new flow
//! while fewer than the backlog are half-open or waiting to be accepted; past that it is
//! answered with a SYN cookie (nothing kept) while the accept queue has room, and dropped (not
//! reset) when the accept queue is full. Once established the flow joins the accept queue and
//! exactly one waiting accept is woken.
//!
//! With several cores, each has its own [`Stack`]. A frame this stack's table does not claim is
//! offered to the caller's [`Peers`](crate::Peers) (the runtime knows the other cores and which
//! one owns what); only what they leave is answered here (a reset, ICMP port unreachable).
//!
//! The files: `mod.rs` the flow slots and their life cycle (`settle`), `ingress.rs` demux and
//! protocol, `egress.rs` output and timers, `listen.rs` listeners and accept, `socket.rs` what
//! the application's TCP sockets call, `udp.rs` UDP, `neigh.rs` the next hops' hardware
//! addresses, `ndisc.rs` answers for the owned addresses, `icmp.rs` echo and errors,
//! `addrs.rs` the owned addresses and routes.

mod addrs;
mod cookies;
mod egress;
mod icmp;
mod ingress;
mod listen;
mod ndisc;
mod neigh;
mod options;
mod prune;
mod socket;
mod stats;
mod tcp_read;
mod udp;
mod udp_opts;
mod udp_steer;

pub use cookies::SynCookieTemplate;
pub use listen::AcceptOptions;
pub use socket::{ConnectOptions, TcpInfo};
pub use stats::StackStats;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use corelane_frame::{FrameIo, Proto};
use rustc_hash::FxBuildHasher;
use smoltcp::phy::Device;
use smoltcp::time::Instant;
use smoltcp::wire::IpCidr;

use crate::classify::FlowKey;
use crate::config::StackConfig;
use crate::device::XdpDevice;
use crate::flows::FlowTable;
use crate::frag::Reassembler;
use crate::route::RouteTable;
use crate::tcp::due::Due;
use crate::tcp::wire::{Out, Path};
use crate::tcp::{Conn, Secret, TcpState, TcpStats};
use crate::udp::{UdpSock, UdpStats};
use listen::Listener;
use neigh::Neighbors;

/// Names a flow (a TCP connection or a UDP socket) of a [`Stack`]. A stale id (its flow was
/// freed and the slot reused) is recognised and refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowId {
    index: u32,
    generation: u32,
}

/// What a flow holds: a TCP connection or a UDP socket.
enum Sock {
    Tcp(Box<Conn>),
    Udp(Box<UdpSock>),
}

struct Flow {
    sock: Sock,
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
    /// The timer it has in the heap (an entry of another time is a superseded one).
    deadline: Due,
    /// TCP: a retry the stack set for the flow, which is not among the connection's own
    /// deadlines: the next hop's resolution asked again, or an output pass that found no free
    /// transmit frame going on. `Stack::sleep_deadline` keeps a timer it covers.
    retry: Due,
    queued: bool,
    /// TCP: the next hop's hardware address, once known.
    mac: Option<[u8; 6]>,
    /// TCP: opened by a listener (counted in `Stack::passive`).
    passive: bool,
    /// TCP: the TTL / hop limit of its packets.
    ttl: u8,
    /// The IPv4 type of service / IPv6 traffic class of its packets (`IP_TOS`, `IPV6_TCLASS`;
    /// for TCP the two ECN bits stay the stack's).
    tos: u8,
    /// TCP: since when its next hop's hardware address has been asked for in vain.
    resolving_since: Option<Instant>,
    /// TCP: in `Stack::ooo_holders` (it held data out of order since last pruned).
    ooo_listed: bool,
}

/// How long an opening connection waits for its next hop to answer ARP or neighbour
/// solicitation before it fails with `HostUnreachable` (Linux: three probes a second apart).
const NEIGHBOR_GIVE_UP: smoltcp::time::Duration = smoltcp::time::Duration::from_secs(3);

/// The TTL / hop limit of what the stack sends unless a socket says otherwise.
pub(crate) const DEFAULT_TTL: u8 = 64;

impl Flow {
    fn conn(&mut self) -> Option<&mut Conn> {
        match &mut self.sock {
            Sock::Tcp(c) => Some(c),
            Sock::Udp(..) => None,
        }
    }
}

struct Slot {
    generation: u32,
    flow: Option<Flow>,
}

/// One core's protocol state: the owned addresses and routes, the flow table, TCP
/// connections, UDP sockets, listeners and timers. The device is passed in to each call, so the same stack runs over
/// AF_XDP or an in-memory link.
pub struct Stack {
    /// The owned addresses with their prefixes (at most [`crate::MAX_ADDRS`]).
    addrs: Vec<IpCidr>,
    mac: [u8; 6],
    mtu: usize,
    secret: Secret,
    neigh: Neighbors,
    routes: RouteTable,
    /// TCP flows waiting for a next hop's hardware address.
    unresolved: Vec<u32>,
    /// Identifications of datagrams that may be fragmented.
    ids: crate::tcp::IdGen,
    /// Counters of connections already freed, and of what no connection did (cookies, resets).
    tcp_done: TcpStats,
    /// Counters of UDP sockets already freed.
    udp_done: UdpStats,
    frag: Reassembler,
    /// ICMP errors that may be sent now (a token bucket), and when it was last refilled (ms).
    icmp_tokens: u32,
    icmp_at: i64,
    /// The latest time the caller gave (for the application's calls, which carry none).
    clock: Instant,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    table: FlowTable,
    udp: HashMap<u16, u32, FxBuildHasher>,
    listeners: HashMap<u16, Listener, FxBuildHasher>,
    /// Connections opened by a listener, per local port: the port stays steered here while
    /// any is open, even after its listener closed.
    passive: HashMap<u16, u32, FxBuildHasher>,
    /// Ports whose listener closed while connections on them were open: given back (to
    /// `freed_ports`) when the last one is freed.
    release_pending: HashSet<u16, FxBuildHasher>,
    ports: HashSet<(Proto, u16), FxBuildHasher>,
    freed_ports: Vec<(Proto, u16)>,
    /// Listener ports that answered a SYN with a cookie since the runtime last asked.
    cookie_ports: Vec<u16>,
    /// What the TCP buffers hold, under `cfg.tcp_mem_limit`; flows whose writer waits for it.
    mem: std::sync::Arc<crate::tcp::MemBudget>,
    mem_waiters: Vec<u32>,
    /// Flows that came to hold out-of-order data, oldest first (index, generation): pruned
    /// from the front when in-order data is refused room (`prune.rs`).
    ooo_holders: std::collections::VecDeque<(u32, u32)>,
    /// TCP connections held (flows with a `Sock::Tcp`), under `cfg.max_tcp`.
    tcp_conns: usize,
    egress: Vec<u32>,
    egress_spare: Vec<u32>,
    timers: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    cfg: StackConfig,
    /// `cfg.tcp`, shared by every connection (one copy per core, not per connection).
    tcp_cfg: std::sync::Arc<crate::TcpConfig>,
    /// A graceful shutdown began: no new connections, no more waiting for datagrams.
    draining: bool,
    /// Segments no connection claims are dropped unanswered ([`Stack::set_quiet`]).
    quiet: bool,
    stats: StackStats,
    /// RFC 6056 algorithm 4's counters: how far each group of destinations moved on from
    /// where its search for a free port starts.
    port_steps: Box<[u32; PORT_STEPS]>,
    /// Numbers used once for ports chosen with no destination.
    port_draws: u64,
}

/// Counters of [`Stack::ephemeral_port`] (RFC 6056 suggests a table of some hundreds).
const PORT_STEPS: usize = 256;

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("core", &self.cfg.core)
            .field("addrs", &self.addrs)
            .field("flows", &self.table.len())
            .field("listeners", &self.listeners.len())
            .finish_non_exhaustive()
    }
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
        // Keys from the OS; expanded from the seed when one is fixed (reproducible runs).
        let secret = match (cfg.key, cfg.seed) {
            (Some([a, b]), _) => Secret::from_master((a, b)),
            (None, Some(seed)) => Secret::new(seed),
            (None, None) => Secret::random().unwrap_or_else(|| {
                tracing::warn!("the OS gave no random bytes: secrets seeded from the std library");
                Secret::new(cfg.seed_or_random())
            }),
        };
        let secret = match cfg.restart_key {
            Some([a, b]) => secret.with_restart_key((a, b)),
            None => secret,
        };
        let mtu = dev.capabilities().max_transmission_unit.saturating_sub(14);
        // A frame to an owned address comes back through the device, never the wire.
        dev.set_own_mac(mac);
        let mut owned = Vec::new();
        for c in addrs {
            if owned.len() >= crate::MAX_ADDRS {
                tracing::warn!(
                    "address {c} dropped: at most {} addresses",
                    crate::MAX_ADDRS
                );
            } else if !owned.iter().any(|o: &IpCidr| o.address() == c.address()) {
                owned.push(*c);
            }
        }
        let tables = crate::keyed::KeyedState::new(secret.table_key());
        let cfg = StackConfig {
            cores: cfg.cores.max(1),
            core: cfg.core.min(cfg.cores.max(1) - 1),
            ..cfg
        };
        Stack {
            tcp_cfg: std::sync::Arc::new(cfg.tcp),
            addrs: owned,
            mac,
            mtu,
            secret: secret.clone(),
            neigh: Neighbors::keyed(tables),
            routes: RouteTable::default(),
            unresolved: Vec::new(),
            ids: secret.ids(),
            tcp_done: TcpStats::default(),
            udp_done: UdpStats::default(),
            frag: Reassembler::keyed(cfg.frag, tables),
            icmp_tokens: 50,
            icmp_at: 0,
            clock: Instant::ZERO,
            slots: Vec::with_capacity(cfg.flows),
            free_slots: Vec::new(),
            table: FlowTable::keyed(cfg.flows, tables),
            udp: HashMap::default(),
            listeners: HashMap::default(),
            passive: HashMap::default(),
            release_pending: HashSet::default(),
            ports: HashSet::default(),
            freed_ports: Vec::new(),
            cookie_ports: Vec::new(),
            mem: crate::tcp::MemBudget::new(cfg.tcp_mem_limit),
            mem_waiters: Vec::new(),
            ooo_holders: std::collections::VecDeque::new(),
            tcp_conns: 0,
            egress: Vec::with_capacity(cfg.batch * 2),
            egress_spare: Vec::with_capacity(cfg.batch * 2),
            timers: BinaryHeap::with_capacity(cfg.flows),
            cfg,
            draining: false,
            quiet: false,
            stats: StackStats::default(),
            port_steps: Box::new([0; PORT_STEPS]),
            port_draws: 0,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &StackConfig {
        &self.cfg
    }

    /// Flows open now (cheap; [`Stack::stats`] also sums every connection's counters).
    pub fn flow_count(&self) -> usize {
        self.slots.len() - self.free_slots.len()
    }

    /// Bytes one TCP connection's state takes, without its buffers (which are allocated as
    /// data arrives or is written, and given back when empty): what `StackConfig::max_tcp`
    /// connections cost at least.
    pub fn conn_size() -> usize {
        std::mem::size_of::<Conn>() + std::mem::size_of::<Slot>()
    }

    /// Bytes the TCP buffers hold now (what [`stats`](Self::stats) reports as `tcp_mem`,
    /// without walking the flows).
    pub fn tcp_mem_in_use(&self) -> usize {
        self.mem.used()
    }

    /// Counters so far.
    pub fn stats(&self) -> StackStats {
        let mut tcp = self.tcp_done;
        let mut udp = self.udp_done;
        for slot in &self.slots {
            match slot.flow.as_ref().map(|f| &f.sock) {
                Some(Sock::Tcp(c)) => tcp += c.stats.get(),
                Some(Sock::Udp(u)) => udp += u.stats,
                None => {}
            }
        }
        StackStats {
            flows: self.flow_count() as u64,
            neighbors: self.neigh.len() as u64,
            tcp,
            udp,
            frag: self.frag.stats(),
            tcp_mem: self.mem.used() as u64,
            tcp_mem_limited: self.mem.limited(),
            tcp_mem_dropped: self.mem.dropped(),
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

    fn insert_tcp(&mut self, mut conn: Conn, setup: impl FnOnce(&mut Flow)) -> u32 {
        conn.set_mem(&self.mem);
        self.tcp_conns += 1;
        let port = conn.local().port;
        self.insert(Sock::Tcp(Box::new(conn)), Proto::Tcp, port, setup)
    }

    fn insert(
        &mut self,
        sock: Sock,
        proto: Proto,
        local_port: u16,
        setup: impl FnOnce(&mut Flow),
    ) -> u32 {
        let mut flow = Flow {
            sock,
            proto,
            key: None,
            local_port,
            listener: None,
            held: false,
            ephemeral: false,
            deadline: Due::NONE,
            retry: Due::NONE,
            queued: false,
            mac: None,
            passive: false,
            ttl: DEFAULT_TTL,
            tos: 0,
            resolving_since: None,
            ooo_listed: false,
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
        match &flow.sock {
            Sock::Tcp(c) => {
                self.tcp_done += c.stats.get();
                self.tcp_conns -= 1;
            }
            Sock::Udp(u) => self.udp_done += u.stats,
        }
        if let Some(key) = flow.key
            && self.table.get(&key) == Some(index)
        {
            self.table.remove(&key);
        }
        if flow.proto == Proto::Udp {
            self.udp.remove(&flow.local_port);
        }
        if flow.ephemeral || flow.proto == Proto::Udp {
            self.ports.remove(&(flow.proto, flow.local_port));
            self.freed_ports.push((flow.proto, flow.local_port));
        }
        if flow.passive
            && let Some(n) = self.passive.get_mut(&flow.local_port)
        {
            *n -= 1;
            if *n == 0 {
                self.passive.remove(&flow.local_port);
                if self.release_pending.remove(&flow.local_port) {
                    self.freed_ports.push((Proto::Tcp, flow.local_port));
                }
            }
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

    fn state_of(&self, index: u32) -> Option<TcpState> {
        match &self.slots[index as usize].flow.as_ref()?.sock {
            Sock::Tcp(c) => Some(c.state()),
            Sock::Udp(..) => None,
        }
    }

    /// The frame path of TCP flow `f`, once its next hop's hardware address is known.
    fn path_of(mac: [u8; 6], f: &Flow) -> Option<Path> {
        let key = f.key?;
        Some(Path {
            src_mac: mac,
            dst_mac: f.mac?,
            local: key.local,
            remote: key.remote,
            ttl: f.ttl,
            tos: f.tos,
        })
    }

    /// Writes segment `out` on `path` into a transmit frame. False when no frame is free.
    fn send_segment<P: FrameIo>(dev: &mut XdpDevice<P>, path: &Path, out: &Out<'_>) -> bool {
        let len = out.frame_len(path);
        let Some(tx) = dev.transmit(Instant::ZERO) else {
            return false;
        };
        tx.write_offloading(len, |buf, offload| {
            crate::tcp::wire::write(buf, path, out, offload);
            offload.then(|| (len - out.header_len() - out.payload_len(), 16))
        });
        true
    }

    /// Finds the hardware address of TCP flow `index`'s next hop, asking for it if unknown.
    /// Returns false while it is unknown (the flow is polled again when it is learnt, or on
    /// its timer).
    fn resolve<P: FrameIo>(&mut self, now: Instant, dev: &mut XdpDevice<P>, index: u32) -> bool {
        let Some(f) = self.slots[index as usize].flow.as_ref() else {
            return false;
        };
        if f.mac.is_some() {
            return true;
        }
        let Some(key) = f.key else {
            return false;
        };
        // A route removed since the connection opened: ask on the link.
        let hop = self.next_hop(key.remote.addr).unwrap_or(key.remote.addr);
        if let Some((mac, fresh)) = self.neighbor(hop, now) {
            if let Some(f) = self.slots[index as usize].flow.as_mut() {
                f.mac = Some(mac);
                f.resolving_since = None;
            }
            if !fresh {
                // Used as it is; the answer refreshes it for the flows that come later.
                self.ask(now, dev, key.local.addr, hop);
            }
            return true;
        }
        self.stats.neighbor_waits += 1;
        if let Some(f) = self.slots[index as usize].flow.as_mut() {
            let since = *f.resolving_since.get_or_insert(now);
            // An opening connection whose next hop never answers fails as the kernel's does,
            // instead of waiting out every SYN retry.
            if now - since >= NEIGHBOR_GIVE_UP
                && let Sock::Tcp(c) = &mut f.sock
                && c.no_next_hop()
            {
                return false;
            }
        }
        if !self.unresolved.contains(&index) {
            self.unresolved.push(index);
        }
        self.ask(now, dev, key.local.addr, hop);
        false
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
            if !matches!(
                state,
                TcpState::Listen | TcpState::SynReceived | TcpState::SynSent | TcpState::Closed
            ) {
                f.listener = None;
                f.held = true;
                let options = self.listeners.get(&port).map(|l| l.options);
                if let Some(o) = options
                    && o != listen::AcceptOptions::default()
                {
                    self.apply_options(id, o);
                }
                if let Some(l) = self.listeners.get_mut(&port) {
                    l.half_open -= 1;
                    l.ready.push_back(id);
                    self.stats.established += 1;
                    if let Some((_, w)) = l.waiters.pop_front() {
                        self.stats.accept_wakeups += 1;
                        w.wake();
                    }
                }
            } else if matches!(state, TcpState::Closed | TcpState::Listen) {
                // Reset or timed out during the handshake.
                if let Some(l) = self.listeners.get_mut(&port) {
                    l.half_open -= 1;
                }
                self.free(index);
            }
        } else if state == TcpState::Closed {
            if !f.held && !f.queued {
                // Not while queued for egress: an aborted connection still owes its peer the
                // reset, which the egress pass sends before it settles the flow again.
                self.free(index);
            } else if let Some(key) = f.key {
                // Closed but still held (or owing a reset): a new connection on the same
                // addresses and ports (a peer reusing its port) must open a new flow, not meet
                // this one. The key stays: it is also the flow's path.
                if self.table.get(&key) == Some(index) {
                    self.table.remove(&key);
                }
            }
        }
    }
}
