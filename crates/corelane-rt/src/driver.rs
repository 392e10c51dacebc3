//! The driver: one core's pipeline run as a task of its executor, between the application's
//! tasks. Generic over the core's queue ([`Queue`]): a turn ([`Driver::turn`]) calls its parts
//! (the drain, the upgrade, the shared tables, the capture, the cookies, the measures, the
//! statistics) each with what it needs; the run loop and the idle wait are in `driver_run.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use corelane_stack::smoltcp::time::Instant;
use corelane_stack::{Pipeline, Proto, Stack};

use crate::PollMode;
use crate::capture::{Change, CoreCapture};
use crate::host::{FrameCounts, Queue, monotonic_ns};
use crate::lane::Core;
use crate::peers::CorePeers;

/// Connection buffer memory given back, in bytes, after which the allocator's free pages go
/// back to the system.
const GIVE_BACK: usize = 8 << 20;

/// The per-core pipeline over queue `Q`, run as a task on the core's executor.
pub(crate) struct Driver<Q: Queue> {
    pub(crate) core: Arc<Core>,
    pub(crate) pipe: Pipeline<Q>,
    pub(crate) peers: CorePeers,
    pub(crate) mode: PollMode,
    pub(crate) epoch: StdInstant,
    /// The generation of the shared address list this core's stack matches.
    pub(crate) addrs_seen: u64,
    /// A graceful shutdown closed this core's listeners.
    pub(crate) listeners_closed: bool,
    /// The bad-checksum warning was given.
    pub(crate) warned_checksums: bool,
    /// This core's slot of the live statistics (None when they are off).
    pub(crate) publish: Option<crate::publish::Publish>,
    /// The generation of the shared route table this core's stack matches.
    pub(crate) routes_seen: u64,
    /// The most connection buffer memory held since the free pages last went back.
    pub(crate) mem_high: usize,
    /// Packet capture, when a reader asks (through the stats file).
    pub(crate) capture: Option<CoreCapture>,
    /// Listener ports that answered SYNs with cookies this turn.
    pub(crate) cookie_ports: Vec<u16>,
    /// When this core next looks whether a SYN flood is over.
    pub(crate) cookie_check_at: Option<StdInstant>,
    /// The generation of the shared record of cookies sent this core last applied.
    pub(crate) cookies_seen: u64,
    /// When this core next reads the kernel's count of frames dropped before it.
    pub(crate) drops_read_at: Option<StdInstant>,
    /// Yields to the tasks so far.
    pub(crate) yields: u64,
    /// This core's part in an upgrade.
    pub(crate) upgrade: crate::upgrade_core::CoreUpgrade,
    /// The next turn reads its first frame's receive stamp, for the wait it measures.
    pub(crate) stamp: Option<Wait>,
    /// When the last turn began (its clock).
    pub(crate) last_turn: StdInstant,
    /// When this core next looks for the next hops its flows wait for (a shared address's).
    pub(crate) neighbours_at: Option<StdInstant>,
    /// What a wake-up costs a frame here, which sets how long the core spins once idle.
    pub(crate) wake: crate::spin::WakeCost,
}

/// How often a core with flows waiting for a next hop reads what the steering program noted
/// of a shared address's neighbours.
const NEIGHBOURS_EVERY: Duration = Duration::from_millis(1);
/// At most this many shared-address neighbours read per [`NEIGHBOURS_EVERY`] (a map read
/// each), taken in turn.
const NEIGHBOURS_PER_TURN: usize = 16;

/// Which wait a frame's receive stamp measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// The core slept until the frame came.
    Woken,
    /// The core was awake (spinning or working).
    Awake,
}

impl<Q: Queue> Driver<Q> {
    /// The driver of `core` over `pipe`, nothing published or captured yet, no upgrade.
    pub(crate) fn new(
        core: Arc<Core>,
        pipe: Pipeline<Q>,
        peers: CorePeers,
        mode: PollMode,
        epoch: StdInstant,
    ) -> Driver<Q> {
        let last_turn = core.shared.clock.now();
        Driver {
            core,
            pipe,
            peers,
            mode,
            epoch,
            addrs_seen: 0,
            listeners_closed: false,
            warned_checksums: false,
            publish: None,
            capture: None,
            cookie_ports: Vec::new(),
            cookie_check_at: None,
            cookies_seen: 0,
            drops_read_at: None,
            mem_high: 0,
            routes_seen: 0,
            yields: 0,
            upgrade: Default::default(),
            stamp: None,
            last_turn,
            neighbours_at: None,
            wake: Default::default(),
        }
    }

    /// The next turn reads its first frame's receive stamp, for `kind` of wait. A frame the
    /// next turn reads arrived after the last turn began (that turn read the RX ring), so an
    /// older stamp is a stale one from the frame's earlier use.
    pub(crate) fn want_stamp(&mut self, kind: Wait) {
        self.stamp = Some(kind);
        let not_before = monotonic_ns(self.last_turn);
        self.pipe.dev.io_mut().want_rx_stamp(not_before);
    }

    /// The host's clock now.
    pub(crate) fn clock(&self) -> StdInstant {
        self.core.shared.clock.now()
    }

    /// The clock read once per turn: as the stack counts time (since the run's epoch) and as
    /// it is.
    fn now(&self) -> (Instant, StdInstant) {
        let clock = self.clock();
        let since = clock.saturating_duration_since(self.epoch);
        (Instant::from_micros(since.as_micros() as i64), clock)
    }

    /// One turn of the pipeline ([`Pipeline::turn`]) with this core's stack and peers, its
    /// parts before and after it, then the core's counters brought up to date. Returns true
    /// when anything moved.
    pub(crate) fn turn(&mut self, freed: &mut Vec<(Proto, u16)>) -> bool {
        let core = self.core.clone();
        let (now, clock) = self.now();
        self.last_turn = clock;
        let mut stack = core.stack();
        self.drain(&mut stack, clock);
        self.upgrade.turn(
            &core.shared,
            core.index,
            &mut stack,
            self.pipe.dev.io_mut(),
            clock,
        );
        self.sync_tables(&mut stack, now);
        self.capture_turn(clock);
        // A real run's host clock is the wall clock the pipeline times its stages by.
        let wall = matches!(core.shared.clock, crate::clock::Clock::Wall).then_some(clock);
        let turn = self.pipe.turn_from(&mut stack, now, wall, &mut self.peers);
        if let Some(e) = &turn.tx_error {
            tracing::warn!("core {}: transmit: {e}", core.index);
        }
        stack.take_freed_ports(freed);
        stack.take_cookie_ports(&mut self.cookie_ports);
        if self.neighbours_at.is_none_or(|t| clock >= t) {
            self.neighbours_at = Some(clock + NEIGHBOURS_EVERY);
            learn_shared_neighbours(&core, &mut stack);
        }
        self.cookies_turn(&stack, now, clock);
        self.account(&mut stack, clock);
        turn.busy()
    }

    /// A graceful shutdown: the listeners close once the upgrade lets them, and the core
    /// stops when the grace runs out.
    fn drain(&mut self, stack: &mut Stack, clock: StdInstant) {
        let shared = &self.core.shared;
        if !shared.life.draining() {
            return;
        }
        if !self.listeners_closed && self.upgrade.listeners_may_close(shared, stack) {
            // Stop accepting: waiting accepts (and UDP receives) return an error, new SYNs are
            // refused.
            self.listeners_closed = true;
            stack.begin_drain();
        }
        if shared.life.drain_deadline().is_some_and(|t| clock >= t) {
            tracing::info!(
                "core {}: the shutdown's grace ran out: stopping",
                self.core.index
            );
            shared.stop_all();
        }
    }

    /// The shared address list, route table and cookies sent, as other cores and the control
    /// plane changed them; core 0 announces the addresses added.
    fn sync_tables(&mut self, stack: &mut Stack, now: Instant) {
        let shared = &self.core.shared;
        let added = shared.addrs.sync(&mut self.addrs_seen, stack);
        shared.routes.sync(&mut self.routes_seen, stack);
        if self.core.index == 0 {
            for a in added {
                stack.announce_addr(now, &mut self.pipe.dev, a);
            }
        }
        // Cookies another core (or the program) sent: their ACKs may arrive here.
        shared.cookies.share_sent(&mut self.cookies_seen, stack);
    }

    /// Packet capture: the tap installed, its clock moved, or removed, as the reader asks.
    fn capture_turn(&mut self, clock: StdInstant) {
        let Some(c) = &mut self.capture else {
            return;
        };
        match c.turn(clock) {
            Some(Change::Install(tap)) => self.pipe.dev.set_tap(Some(tap)),
            Some(Change::Clock(ns)) => {
                if let Some(t) = self.pipe.dev.tap_mut() {
                    t.clock(ns);
                }
            }
            Some(Change::Remove) => self.pipe.dev.set_tap(None),
            None => {}
        }
    }

    /// SYN cookies: the ports that answered with cookies this turn noted for every core, and
    /// while a flood lasts, whether the program should answer for them (or stop).
    fn cookies_turn(&mut self, stack: &Stack, now: Instant, clock: StdInstant) {
        let cookies = &self.core.shared.cookies;
        if !self.cookie_ports.is_empty() {
            cookies.note_sent(&self.cookie_ports, now);
        }
        let checking = cookies.active() && self.cookie_check_at.is_none_or(|t| clock >= t);
        if checking {
            // The program answers for these ports while the flood lasts: their cookie ACKs
            // stay acceptable on every core.
            cookies.note_sent(&cookies.program_ports(), now);
        }
        if !self.cookie_ports.is_empty() || checking {
            cookies.update(
                &self.core.shared.steer,
                stack,
                self.epoch,
                clock,
                &mut self.cookie_ports,
            );
            self.cookie_check_at = Some(clock + crate::cookies::CHECK_EVERY / 4);
        }
    }

    /// The wait the receive stamp measured, if one was asked for and came: from the steering
    /// program to this turn's start.
    fn waited(&mut self, clock: StdInstant) -> Option<(Wait, u64)> {
        let kind = self.stamp.take()?;
        let at = self.pipe.dev.io_mut().take_rx_stamp()?;
        // A frame stamped after the clock was read waited for nothing measurable.
        let wait = monotonic_ns(clock).saturating_sub(at);
        // A stamp from another boot of the clock or a stale one reads as ages: not a wait.
        (wait < 10_000_000_000).then_some((kind, wait))
    }

    /// Ten times a second, the kernel's count of frames dropped before the core (a system
    /// call), and the allocator's free pages given back after a load.
    fn housekeeping(&mut self, stack: &Stack, clock: StdInstant) {
        if self.drops_read_at.is_some_and(|t| clock < t) {
            return;
        }
        self.pipe.dev.read_rx_drops();
        self.drops_read_at = Some(clock + Duration::from_millis(100));
        // Connection buffers given back after a load go to the allocator, which keeps what is
        // not at the top of its heap: once the buffers held have fallen by GIVE_BACK since
        // their high point, the free pages go back to the system.
        let held = stack.tcp_mem_in_use();
        self.mem_high = self.mem_high.max(held);
        if self.mem_high - held >= GIVE_BACK {
            crate::cpu::give_back_free_memory();
            self.mem_high = held;
        }
    }

    /// The core's counters brought up to date, published when due, and the bad-checksum
    /// warning given once.
    fn account(&mut self, stack: &mut Stack, clock: StdInstant) {
        let core = self.core.clone();
        let waited = self.waited(clock);
        self.housekeeping(stack, clock);
        let mut st = core.stats();
        if let Some((kind, ns)) = waited {
            let w = match kind {
                Wait::Woken => {
                    self.wake.woken(ns);
                    &mut st.rx_wait_woken
                }
                Wait::Awake => {
                    self.wake.awake(ns);
                    &mut st.rx_wait_awake
                }
            };
            w.items += 1;
            w.nanos += ns;
            st.wake_cost = self.wake.cost();
            if let PollMode::Adaptive { spin } = self.mode {
                st.spin = self.wake.spin(spin);
            }
        }
        st.pipeline = self.pipe.stats();
        if let Some(tu) = &self.pipe.tuner {
            st.batch.current = tu.batch();
            st.batch.settled = tu.settled();
            st.batch.changes = tu.changes();
            st.batch.fill_target = self.pipe.dev.io().fill_target();
        }
        st.device = self.pipe.dev.stats();
        let (bad, all) = (st.device.rx_bad_checksum, st.device.rx_frames);
        // Published every 100 ms: the turns between cost one comparison.
        let snapshot = self
            .publish
            .as_ref()
            .is_some_and(|p| p.due(clock))
            .then(|| *st);
        drop(st);
        if let (Some(p), Some(stats)) = (&mut self.publish, snapshot) {
            let io = self.pipe.dev.io_mut();
            p.tick(
                clock,
                stats,
                stack,
                || io.counts(),
                || core.shared.steer.read().counters().ok(),
            );
        }
        // Three is one client's SYN and its first two retries.
        if !self.warned_checksums && bad >= 3 && bad * 2 >= all {
            // Most of what arrives fails its checksum: not corruption, a peer that leaves
            // checksums to an offload that never happens (a veth peer with tx offload on).
            self.warned_checksums = true;
            core.shared.telemetry.warn_once(format!(
                "core {}: {bad} of {all} frames had bad TCP/UDP checksums and were dropped: a \
                 peer with transmit checksum offload sends partial checksums (on a veth peer, \
                 run `ethtool -K PEER_IF tx off` in its namespace)",
                core.index
            ));
        }
    }

    /// At the core's end, its stack shut down with its frames where `counts` says: leaves the
    /// queue to the new process of an upgrade, if one took it, and says where they are then.
    /// Polls [`CoreUpgrade::leave_step`](crate::upgrade_core::CoreUpgrade::leave_step) on the
    /// core's executor until it is done.
    pub(crate) async fn leave_upgrade(&mut self, counts: FrameCounts) -> FrameCounts {
        use crate::upgrade_core::Leave;
        let core = self.core.clone();
        loop {
            let now = core.shared.clock.now();
            let io = self.pipe.dev.io_mut();
            match self.upgrade.leave_step(&core.shared, core.index, io, now) {
                Leave::Left => return io.counts(),
                Leave::NotHanded | Leave::Failed => return counts,
                Leave::Waiting => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
    }

    pub(crate) fn release_ports(&self, freed: &mut Vec<(Proto, u16)>) {
        for (proto, port) in freed.drain(..) {
            self.core.release_port(proto, port);
        }
    }
}

/// The next hops `stack`'s flows wait for, learnt from what the steering program noted of a
/// shared address's neighbours: the kernel takes the ARP and NDP answers to the stack's
/// requests sent from such an address, and the program notes what they said. A map read (a
/// system call) per next hop waited for, at most every [`NEIGHBOURS_EVERY`]; nothing without a
/// waiting flow or a shared address.
fn learn_shared_neighbours(core: &Core, stack: &mut Stack) {
    // Without a shared address nothing is read, and the program's lock is not taken.
    if !core.shared.steer.has_shared() {
        return;
    }
    let wanted = stack.neighbors_wanted(NEIGHBOURS_PER_TURN);
    if wanted.is_empty() {
        return;
    }
    core.stats().neighbour_reads += wanted.len() as u64;
    let steer = core.shared.steer.read();
    for ip in wanted {
        if let Some(mac) = steer.shared_neighbour(ip) {
            stack.learn_neighbor(ip, mac);
        }
    }
}
