//! Deterministic simulation of two stacks talking through an impaired path.
//!
//! Two [`Node`]s over the in-memory link, with a simulated router between them: each direction
//! loses, duplicates, reorders, rate-limits and delays frames as its [`Impair`] says, decided by
//! a generator seeded from one number. The clock jumps to the next deadline (a connection's
//! timer or a frame's arrival), so seconds of simulated time cost milliseconds. A
//! [`Workload`] drives sockets on both sides the way real services do (an echo, requests with
//! bodies both ways, bulk both ways at once, connections opening and closing) and the harness
//! checks, after every step:
//!
//! - every byte is delivered in order, exactly once (each stream's content is a function of its
//!   key and offset, checked as it is read);
//! - no frame is longer than the link's MTU allows;
//! - no stall: bytes keep reaching readers, never more than [`SimConfig::stall_limit`] apart;
//!   on a path that loses nothing, stalls and handshakes are bounded by round trips
//!   ([`SimConfig::lossless_limit`]), since no timeout has anything to recover;
//! - at the end every connection closes, every flow is freed, the TCP buffer memory is back to
//!   zero and every frame is back where it belongs.
//!
//! A failure carries its scenario and seed; [`run_scenario`] with the same two replays it
//! exactly.
//!
//! ```
//! use corelane_stack::sim::{run_scenario, scenarios};
//! let s = scenarios()
//!     .into_iter()
//!     .find(|s| s.name == "echo/loss-1%")
//!     .ok_or("no such scenario")?;
//! let report = run_scenario(&s, 7)?; // a failure names its seed and the replay command
//! assert_eq!(report.oversize, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod scenarios;
mod wire;
mod workload;

use std::collections::VecDeque;
use std::fmt;
use std::io;

use corelane_frame::{FrameIo, MemLink, MemPort};
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{IpCidr, Ipv4Address};

use crate::{Node, StackConfig, TcpConfig};
pub use scenarios::{Scenario, hold_scenarios, impairments, run_scenario, run_with, scenarios};
use wire::{Dice, Wire};
pub use wire::{HOLD_LIMIT, Impair, WireStats};
pub use workload::{Shape, Workload};

/// The IP MTU of the simulated link.
pub const MTU: usize = 1500;

/// How a simulation runs.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    /// The seed of everything: both stacks' generators and the path's decisions.
    pub seed: u64,
    /// What the path does to frames from the client to the server.
    pub up: Impair,
    /// What the path does to frames from the server to the client.
    pub down: Impair,
    /// The server's TCP configuration.
    pub tcp: TcpConfig,
    /// The client's (the same by default; another, e.g. a peer that delays its ACKs as long as
    /// Linux may, 40 ms and more, to see what the server does with it).
    pub client_tcp: TcpConfig,
    /// The longest an established connection may go without delivering a byte to a reader
    /// while some are owed to it, once both ends have an RTT sample.
    pub stall_limit: Duration,
    /// The same before that: the timers run from the initial timeout.
    pub handshake_limit: Duration,
    /// The longest the whole run may take, in simulated time.
    pub time_limit: Duration,
    /// A frame longer than the MTU fails the run (true, the default), or is only dropped by
    /// the path, as a real link drops it (false: to watch what such drops do to a transfer).
    pub strict_mtu: bool,
    /// Prints every frame offered to the path, with what became of it (for a replay).
    pub trace: bool,
    /// Frames in each end's memory, half of them posted for receive ([`MemLink::frames`]). Fewer
    /// than the default leave a sender short of transmit frames and a receiver short of
    /// posted ones; a frame that finds none posted is dropped, as a NIC drops it, so the path
    /// then counts as one that may lose frames.
    pub frames: usize,
}

/// What the limits allow for the clock's steps: a timer fires, and its segment is handled, a
/// step or two after the instant it was due.
const STEP_SLACK: Duration = Duration::from_millis(5);

/// Steps a run may take without the clock moving: a step that moves nothing lets the clock
/// jump to the next deadline, so this many at one instant means the stacks keep each other
/// (or themselves) busy without getting anywhere, a livelock, which fails the run instead of
/// hanging it.
const STILL_LIMIT: u64 = 100_000;

impl SimConfig {
    /// A run with `seed` over a path impaired `up` and `down`, default TCP, a stall limit of
    /// four back-to-back retransmission timeouts from the floor (0.2 + 0.4 + 0.8 + 1.6 s) plus
    /// the path's round trip (or from the stalled connection's own timeout when an end's
    /// estimate is above the floor; six from the initial timeout, 63 s, plus the round trip,
    /// for a connection with no RTT sample yet: a SYN, a SYN-ACK or the first data lost six
    /// times in a row, which a path losing 10% each way does to about one connection in
    /// 20,000, where five would be one in 4,000), and ten
    /// simulated minutes for the whole run.
    pub fn new(seed: u64, up: Impair, down: Impair) -> SimConfig {
        let tcp = TcpConfig::default();
        SimConfig {
            seed,
            up,
            down,
            tcp,
            client_tcp: tcp,
            stall_limit: Duration::from(tcp.rto_min) * 15 + up.delay + down.delay + STEP_SLACK,
            handshake_limit: Duration::from(tcp.rto_initial) * 63
                + up.delay
                + down.delay
                + STEP_SLACK,
            time_limit: Duration::from_secs(600),
            strict_mtu: true,
            trace: false,
            frames: MemLink::default().frames,
        }
    }
}

impl SimConfig {
    /// On a path that loses nothing (it may delay, reorder and duplicate frames), what a stall
    /// or a handshake may last: no timer has anything to recover, so both are bounded by
    /// trips over the path, the longest a frame is held back for reordering and the ACK
    /// delays, never by a retransmission timeout (200 ms at the least). None when a direction
    /// may lose frames (or queue them until they are dropped), or an end has too few frames
    /// to post for all a window brings ([`SimConfig::frames`]).
    pub fn lossless_limit(&self) -> Option<Duration> {
        if !(self.up.loses_nothing() && self.down.loses_nothing())
            || self.frames < MemLink::default().frames
        {
            return None;
        }
        // Eight frames in a row, each one way and each possibly held back with nothing behind
        // it to release it (a handshake's ARP request and reply, SYN, SYN-ACK and first data
        // can be).
        let hop = self.up.delay.max(self.down.delay) + wire::HOLD_LIMIT;
        let acks = self.tcp.ack_delay.max(self.client_tcp.ack_delay);
        Some(hop * 8 + Duration::from(acks) * 2 + STEP_SLACK)
    }
}

/// What a finished run measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SimReport {
    /// Simulated time from the start until every byte was delivered.
    pub elapsed: Duration,
    /// The longest time an established connection went between two deliveries of bytes to a
    /// reader while some were owed.
    pub worst_stall: Duration,
    /// Bytes delivered to readers, both directions, all connections.
    pub bytes: u64,
    /// Frames longer than the MTU (always 0 in a run that passed).
    pub oversize: u64,
    /// Segments both stacks sent again.
    pub retransmits: u64,
    /// Retransmission timeouts on both stacks.
    pub rtos: u64,
    /// Segments both stacks sent.
    pub segments: u64,
    /// Spurious recoveries undone on both stacks.
    pub undos: u64,
    /// What the path did, client to server and server to client.
    pub wire: [WireStats; 2],
    /// Simulation steps taken.
    pub steps: u64,
    /// Times either end's output found no free transmit frame ([`DeviceStats::tx_no_frame`]).
    ///
    /// [`DeviceStats::tx_no_frame`]: crate::DeviceStats::tx_no_frame
    pub no_frame: u64,
    /// Frames either end's port dropped on arrival for want of a posted receive frame.
    pub rx_no_frame: u64,
    /// Both stacks' TCP counters added together.
    pub tcp: crate::TcpStats,
}

/// A broken invariant, with what replays it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimFailure {
    /// The scenario's name.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// Simulated time of the failure.
    pub at: Duration,
    /// What broke.
    pub what: String,
    /// The run so far.
    pub report: Box<SimReport>,
}

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "scenario {} seed {} failed at {} ms: {} (replay: cargo run --release -p \
             corelane-bench --bin sim -- --scenario {} --seed {})",
            self.scenario,
            self.seed,
            self.at.total_millis(),
            self.what,
            self.scenario,
            self.seed
        )
    }
}

impl std::error::Error for SimFailure {}

/// Two stacks and the impaired path between them.
#[derive(Debug)]
pub struct Sim {
    /// The server, 10.9.0.1.
    pub server: Node<MemPort>,
    /// The client, 10.9.0.2.
    pub client: Node<MemPort>,
    now: Instant,
    /// Client to server, server to client.
    wires: [Wire; 2],
    dice: Dice,
    sent: VecDeque<Vec<u8>>,
    due: Vec<Vec<u8>>,
    steps: u64,
    trace: bool,
}

/// The server's address in a [`Sim`].
pub const SERVER: Ipv4Address = Ipv4Address::new(10, 9, 0, 1);

impl Sim {
    /// Two stacks with `cfg`'s TCP configuration and seed, joined by a path impaired as `cfg`
    /// says.
    pub fn new(cfg: &SimConfig) -> Sim {
        let (x, y) = MemLink {
            frames: cfg.frames,
            ..MemLink::default()
        }
        .pair();
        let node = |mut io: MemPort, last: u8, seed: u64, tcp: TcpConfig| {
            io.set_capture(true);
            let addr = Ipv4Address::new(10, 9, 0, last);
            let stack = StackConfig {
                seed: Some(seed),
                tcp,
                ..StackConfig::default()
            };
            let mut n = Node::new(
                io,
                [2, 0, 0, 0, 0, last],
                &[IpCidr::new(addr.into(), 24)],
                MTU,
                stack,
            );
            n.dev_mut().set_strict(cfg.strict_mtu);
            n
        };
        let mut dice = Dice::new(cfg.seed);
        let (s1, s2) = (dice.next(), dice.next());
        Sim {
            server: node(x, 1, s1, cfg.tcp),
            client: node(y, 2, s2, cfg.client_tcp),
            now: Instant::ZERO,
            wires: [Wire::new(cfg.up, MTU), Wire::new(cfg.down, MTU)],
            dice,
            sent: VecDeque::new(),
            due: Vec::new(),
            steps: 0,
            trace: cfg.trace,
        }
    }

    /// The simulated time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// What the path did so far: client to server, server to client.
    pub fn wire_stats(&self) -> [WireStats; 2] {
        [self.wires[0].stats, self.wires[1].stats]
    }

    /// One turn of each stack at the current time, then the frames they sent onto the path and
    /// the frames due off it. Returns true when anything moved.
    ///
    /// # Errors
    /// When a transmit kick fails.
    pub fn step(&mut self) -> io::Result<bool> {
        self.steps += 1;
        let mut busy = self.server.poll(self.now)?;
        busy |= self.client.poll(self.now)?;
        for (node, w) in [(&mut self.server, 1), (&mut self.client, 0)] {
            node.dev_mut().io_mut().take_sent(&mut self.sent);
            busy |= !self.sent.is_empty();
            for f in self.sent.drain(..) {
                self.wires[w].offer(self.now, f, &mut self.dice, self.trace);
            }
        }
        for (w, node) in [(0, &mut self.client), (1, &mut self.server)] {
            self.wires[w].deliver(self.now, &mut self.due);
            busy |= !self.due.is_empty();
            // The sender's port puts bytes on its peer's receive ring.
            let port = node.dev_mut().io_mut();
            for f in self.due.drain(..) {
                port.inject(&f);
            }
        }
        Ok(busy || self.server.stack.egress_pending() || self.client.stack.egress_pending())
    }

    /// Moves the clock to the next deadline of either stack or the path, but not past
    /// `until`. Returns false when nothing is due before `until`.
    pub fn jump(&mut self, until: Instant) -> bool {
        let next = [
            self.server.stack.sleep_deadline(),
            self.client.stack.sleep_deadline(),
            self.wires[0].next_at(),
            self.wires[1].next_at(),
        ];
        crate::node::jump_clock(&mut self.now, next, until)
    }

    pub(super) fn report(&self) -> SimReport {
        let (s, c) = (self.server.stack.stats().tcp, self.client.stack.stats().tcp);
        let mut tcp = s;
        tcp += c;
        SimReport {
            tcp,
            retransmits: s.retrans_segs + c.retrans_segs,
            rtos: s.rto_expiries + c.rto_expiries,
            segments: s.segs_out + c.segs_out,
            undos: s.undos + c.undos,
            oversize: self.wires[0].stats.oversize + self.wires[1].stats.oversize,
            wire: self.wire_stats(),
            steps: self.steps,
            no_frame: self.server.dev().stats().tx_no_frame + self.client.dev().stats().tx_no_frame,
            rx_no_frame: self.server.dev().io().rx_dropped() + self.client.dev().io().rx_dropped(),
            ..SimReport::default()
        }
    }

    /// Runs `w` to its end and checks every invariant on the way (see the module's docs).
    ///
    /// # Errors
    /// The first invariant broken, or the run's time limit.
    pub fn run(&mut self, cfg: &SimConfig, w: &mut Workload) -> Result<SimReport, String> {
        let end = Instant::ZERO + cfg.time_limit;
        w.start(self)?;
        // The instant the clock last moved to, and the steps taken at it since.
        let mut still = (self.now, 0u64);
        let finished = loop {
            let delivered = w.poll(self)?;
            let oversize = self.wires[0].stats.oversize + self.wires[1].stats.oversize;
            if oversize > 0 && cfg.strict_mtu {
                return Err(format!(
                    "{oversize} frames longer than the MTU ({} bytes with the Ethernet header; \
                     longest {})",
                    MTU + 14,
                    self.wires[0].stats.longest.max(self.wires[1].stats.longest)
                ));
            }
            if w.delivered_all() {
                break self.now;
            }
            let (stalled, established) = w.stall(self.now);
            let limit = if let Some(l) = cfg.lossless_limit() {
                l
            } else if established {
                let own = w.stall_allowance(self, Duration::from(cfg.tcp.rto_min));
                cfg.stall_limit
                    .max(own + cfg.up.delay + cfg.down.delay + STEP_SLACK)
            } else {
                cfg.handshake_limit
            };
            if stalled > limit {
                return Err(format!(
                    "stalled {} ms (limit {} ms{}) with {} of {} bytes delivered: {}",
                    stalled.total_millis(),
                    limit.total_millis(),
                    match (established, cfg.lossless_limit().is_some()) {
                        (_, true) => ", on a path that loses nothing",
                        (true, false) => "",
                        (false, false) => ", in the handshake",
                    },
                    delivered,
                    w.total(),
                    w.describe(self)
                ));
            }
            if self.now >= end {
                return Err(format!(
                    "not finished in the time limit: {}",
                    w.describe(self)
                ));
            }
            if self.now != still.0 {
                still = (self.now, 0);
            }
            still.1 += 1;
            if still.1 > STILL_LIMIT {
                return Err(format!(
                    "no progress: {STILL_LIMIT} steps without the clock moving; server frames \
                     {:?}, client frames {:?}: {}",
                    self.server.dev_mut().io_mut().counts(),
                    self.client.dev_mut().io_mut().counts(),
                    w.describe(self)
                ));
            }
            if !self.step().map_err(|e| e.to_string())? {
                let until = (self.now + (limit - stalled) + Duration::from_millis(1)).min(end);
                self.jump(until);
            }
        };
        // Everything delivered: the connections close, then every flow, buffer and frame must
        // come back.
        let settle_end = self.now + Duration::from_secs(120);
        loop {
            w.poll(self)?;
            let flows = self.server.stack.flow_count() + self.client.stack.flow_count();
            if w.closed() && flows == 0 {
                break;
            }
            if self.now >= settle_end {
                return Err(format!(
                    "not settled 120 s after the last byte: {flows} flows left; {}",
                    w.describe(self)
                ));
            }
            if !self.step().map_err(|e| e.to_string())? {
                self.jump(settle_end);
            }
        }
        for (name, node) in [("server", &mut self.server), ("client", &mut self.client)] {
            let mem = node.stack.stats().tcp_mem;
            if mem != 0 {
                return Err(format!(
                    "{name}: {mem} bytes of TCP buffers held after the end"
                ));
            }
            let c = node.shutdown(self.now).map_err(|e| e.to_string())?;
            if c.in_use != 0 || c.sum() != c.total {
                return Err(format!("{name}: frames not all back: {c:?}"));
            }
        }
        let mut r = self.report();
        r.elapsed = finished - Instant::ZERO;
        r.worst_stall = w.worst_stall();
        r.bytes = w.total();
        Ok(r)
    }
}
