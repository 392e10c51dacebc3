//! The driver: one core's pipeline run as a task of its executor, between the application's
//! tasks, and how an idle core waits for work (adaptive poll).

#![allow(unsafe_code)] // The executor polls the AF_XDP socket and doorbell descriptors.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant as StdInstant};

use corelane_stack::smoltcp::time::Instant;
use corelane_stack::{Pipeline, Proto, TIMED_EVERY};
use corelane_xsk::XskQueue;
use corelane_xsk::{FrameCounts, FrameIo as _};
use tokio::io::unix::AsyncFd;

use crate::PollMode;
use crate::capture::{Change, CoreCapture};
use crate::lane::Core;
use crate::peers::CorePeers;

/// Connection buffer memory given back, in bytes, after which the allocator's free pages go
/// back to the system.
const GIVE_BACK: usize = 8 << 20;

struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// The per-core pipeline, run as a task on the core's executor.
pub(crate) struct Driver {
    pub(crate) core: Arc<Core>,
    pub(crate) pipe: Pipeline<XskQueue>,
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

impl Driver {
    /// The driver of `core` over `dev`, nothing published or captured yet, no upgrade.
    pub(crate) fn new(
        core: Arc<Core>,
        pipe: Pipeline<XskQueue>,
        peers: CorePeers,
        mode: PollMode,
        epoch: StdInstant,
    ) -> Driver {
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
            last_turn: StdInstant::now(),
            neighbours_at: None,
        }
    }

    /// The next turn reads its first frame's receive stamp, for `kind` of wait. A frame the
    /// next turn reads arrived after the last turn began (that turn read the RX ring), so an
    /// older stamp is a stale one from the frame's earlier use.
    fn want_stamp(&mut self, kind: Wait) {
        self.stamp = Some(kind);
        let not_before = corelane_xsk::monotonic_ns(self.last_turn);
        self.pipe.dev.io_mut().want_rx_stamp(not_before);
    }

    /// The clock read once per turn: as the stack counts time (since the run's epoch) and as
    /// it is.
    fn now(&self) -> (Instant, StdInstant) {
        let clock = self.core.shared.clock.now();
        let since = clock.saturating_duration_since(self.epoch);
        (Instant::from_micros(since.as_micros() as i64), clock)
    }

    /// One turn of the pipeline ([`Pipeline::turn`]) with this core's stack and peers, then
    /// the core's counters brought up to date. Returns true when anything moved.
    pub(crate) fn turn(&mut self, freed: &mut Vec<(Proto, u16)>) -> bool {
        let core = self.core.clone();
        let (now, clock) = self.now();
        self.last_turn = clock;
        let mut stack = core.stack();
        let life = &core.shared.life;
        if life.draining() {
            if !self.listeners_closed && self.upgrade.listeners_may_close(&core.shared, &stack) {
                // Stop accepting: waiting accepts (and UDP receives) return an error, new SYNs
                // are refused.
                self.listeners_closed = true;
                stack.begin_drain();
            }
            if life.drain_deadline().is_some_and(|t| clock >= t) {
                tracing::info!(
                    "core {}: the shutdown's grace ran out: stopping",
                    core.index
                );
                core.shared.stop_all();
            }
        }
        self.upgrade.turn(
            &core.shared,
            core.index,
            &mut stack,
            self.pipe.dev.io_mut(),
            clock,
        );
        let added = core.shared.addrs.sync(&mut self.addrs_seen, &mut stack);
        core.shared.routes.sync(&mut self.routes_seen, &mut stack);
        if core.index == 0 {
            for a in added {
                stack.announce_addr(now, &mut self.pipe.dev, a);
            }
        }
        // Cookies another core (or the program) sent: their ACKs may arrive here.
        core.shared
            .cookies
            .share_sent(&mut self.cookies_seen, &mut stack);
        if let Some(c) = &mut self.capture {
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
        let turn = self.pipe.turn(&mut stack, now, &mut self.peers);
        if let Some(e) = &turn.tx_error {
            tracing::warn!("core {}: transmit: {e}", core.index);
        }
        stack.take_freed_ports(freed);
        stack.take_cookie_ports(&mut self.cookie_ports);
        if self.neighbours_at.is_none_or(|t| clock >= t) {
            self.neighbours_at = Some(clock + NEIGHBOURS_EVERY);
            learn_shared_neighbours(&core, &mut stack);
        }
        let cookies = &core.shared.cookies;
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
            let epoch = self.epoch;
            cookies.update(
                &core.shared.steer,
                &stack,
                epoch,
                clock,
                &mut self.cookie_ports,
            );
            self.cookie_check_at = Some(clock + crate::cookies::CHECK_EVERY / 4);
        }
        let waited = self.stamp.take().and_then(|kind| {
            let at = self.pipe.dev.io_mut().take_rx_stamp()?;
            // From the steering program to this turn's start (a frame stamped after the clock
            // was read waited for nothing measurable).
            let wait = corelane_xsk::monotonic_ns(clock).saturating_sub(at);
            // A stamp from another boot of the clock or a stale one reads as ages: not a wait.
            (wait < 10_000_000_000).then_some((kind, wait))
        });
        let mut st = core.stats();
        if let Some((kind, ns)) = waited {
            let w = match kind {
                Wait::Woken => &mut st.rx_wait_woken,
                Wait::Awake => &mut st.rx_wait_awake,
            };
            w.items += 1;
            w.nanos += ns;
        }
        st.pipeline = self.pipe.stats();
        if let Some(tu) = &self.pipe.tuner {
            st.batch.current = tu.batch();
            st.batch.settled = tu.settled();
            st.batch.changes = tu.changes();
            st.batch.fill_target = self.pipe.dev.io().fill_target();
        }
        if self.drops_read_at.is_none_or(|t| clock >= t) {
            // A system call: ten times a second.
            self.pipe.dev.read_rx_drops();
            self.drops_read_at = Some(clock + Duration::from_millis(100));
            // Connection buffers given back after a load go to the allocator, which keeps
            // what is not at the top of its heap: once the buffers held have fallen by
            // GIVE_BACK since their high point, the free pages go back to the system.
            let held = stack.tcp_mem_in_use();
            self.mem_high = self.mem_high.max(held);
            if self.mem_high - held >= GIVE_BACK {
                crate::cpu::give_back_free_memory();
                self.mem_high = held;
            }
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
                &mut stack,
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
        turn.busy()
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

    /// Runs the pipeline until the core is told to stop.
    pub(crate) async fn run(mut self) -> Self {
        let readable = tokio::io::Interest::READABLE;
        // SAFETY: the AF_XDP socket is owned by the core's device, which outlives this function
        // (the AsyncFd is dropped when it returns), and it is never replaced.
        let xsk = unsafe { AsyncFd::register_with_interest(Fd(self.pipe.dev.io().fd()), readable) }
            .map_err(|e| e.into_parts().1);
        let bell = &self.peers.bell();
        // SAFETY: the eventfd is owned by `bell`, an Arc held across this function.
        let bell_fd = unsafe { AsyncFd::register_with_interest(Fd(bell.fd()), readable) }
            .map_err(|e| e.into_parts().1);
        let (xsk, bell_fd) = match (xsk, bell_fd) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(
                    "core {}: cannot register with the executor ({e}); busy polling",
                    self.core.index
                );
                self.mode = PollMode::Busy;
                return self.run_busy().await;
            }
        };
        let mut freed = Vec::new();
        let mut idle_since: Option<StdInstant> = None;
        // Start of the current stretch of work (since the last wake-up or the last idle turn).
        let mut busy_since: Option<StdInstant> = None;
        let mut spin_for = Duration::ZERO;
        // Moving average of the idle gaps: how long work took to come once the core went idle.
        let mut gap_ns = 0.0f64;
        let mut turns = 0u64;
        loop {
            if self.core.stopping() {
                return self;
            }
            turns += 1;
            if self.stamp.is_none() && turns.is_multiple_of(crate::lane::RX_WAIT_SAMPLE_EVERY) {
                self.want_stamp(Wait::Awake);
            }
            if self.turn(&mut freed) {
                if let Some(idle) = idle_since.take() {
                    // How long the core waited for this work (spinning or asleep).
                    gap_ns = 0.8 * gap_ns + 0.2 * idle.elapsed().as_nanos() as f64;
                    busy_since = Some(StdInstant::now());
                } else if busy_since.is_none() {
                    busy_since = Some(StdInstant::now());
                }
                self.release_ports(&mut freed);
                self.yield_to_tasks().await;
                continue;
            }
            let spin = match self.mode {
                PollMode::Busy => {
                    self.yield_to_tasks().await;
                    continue;
                }
                PollMode::Adaptive { spin } => spin,
            };
            let since = *idle_since.get_or_insert_with(|| {
                // Going idle. Spin through a gap the recent past says will be short (sleeping
                // and waking costs more CPU than a short spin, and adds latency); otherwise spin
                // no longer than the work just done took, so spinning never costs more than the
                // work it waits for, and sleep through the gap.
                let worked = busy_since.take().map_or(Duration::ZERO, |b| b.elapsed());
                spin_for = if gap_ns < spin.as_nanos() as f64 / 2.0 {
                    spin
                } else {
                    worked.max(Duration::from_micros(2)).min(spin)
                };
                StdInstant::now()
            });
            if since.elapsed() < spin_for {
                self.yield_to_tasks().await;
                continue;
            }
            // Sleep: on the XSK fd, the doorbell, a task's output, or the next protocol timer.
            bell.arm();
            if self.peers.inbound_waiting()
                || self.pipe.dev.rx_waiting()
                || self.core.stack().egress_pending()
            {
                bell.disarm();
                continue;
            }
            self.core.stats().parks += 1;
            let deadline = self.core.stack().next_deadline().map(|d| {
                let at = Duration::from_micros(d.total_micros().max(0) as u64);
                tokio::time::Instant::from_std(self.epoch + at)
            });
            // A graceful shutdown's end is a deadline too.
            let drain = self.core.shared.life.drain_deadline();
            let deadline = match (deadline, drain.map(tokio::time::Instant::from_std)) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            // Idle cores still publish their statistics (and answer connection snapshots).
            let far = tokio::time::Instant::now()
                + if self.publish.is_some() {
                    crate::publish::Publish::interval()
                } else {
                    Duration::from_secs(3600)
                };
            let mut deadline = deadline.map(|d| d.min(far));
            if self.pipe.dev.io().upgrade_phase() == Some(corelane_xsk::UpgradePhase::Handed) {
                // Two processes share the queue (an upgrade): the frames one gives back and
                // the completions it forwards wake nothing in the other, which must look
                // often (the new one fills the ring the old one receives on).
                let soon = tokio::time::Instant::now() + crate::upgrade::SHARED_NAP;
                deadline = Some(deadline.map_or(soon, |d| d.min(soon)));
            }
            if self.pipe.dev.io().tx_in_flight() {
                // Frames in transmit: their completion wakes nothing here, and a driver that
                // stopped sending without asking for a wakeup is kicked only from a turn.
                let soon = tokio::time::Instant::now() + corelane_xsk::TX_NUDGE_AFTER;
                deadline = Some(deadline.map_or(soon, |d| d.min(soon)));
            }
            tokio::select! {
                biased;
                r = xsk.readable() => if let Ok(mut g) = r { g.clear_ready() },
                r = bell_fd.readable() => if let Ok(mut g) = r { g.clear_ready() },
                _ = self.core.kick.notified() => {},
                _ = tokio::time::sleep_until(deadline.unwrap_or(far)) => {},
            }
            bell.disarm();
            // The first frame of the next turn tells how long waking up took.
            self.want_stamp(Wait::Woken);
            // idle_since stays: the gap runs until the next turn that finds work.
            busy_since = None;
            spin_for = Duration::ZERO;
        }
    }

    /// The pipeline over an in-memory queue (a lab's, `crate::lab`): there is no descriptor to
    /// wait on and nothing arrives from outside, so an idle core sleeps until a task gives it
    /// work or the stack's next deadline. `after_turn` runs after each turn (the lab takes
    /// what was sent to its link).
    #[cfg(any(test, feature = "sim"))]
    pub(crate) async fn run_in_memory(mut self, mut after_turn: impl FnMut()) -> Self {
        let mut freed = Vec::new();
        loop {
            if self.core.stopping() {
                return self;
            }
            let busy = self.turn(&mut freed);
            after_turn();
            self.release_ports(&mut freed);
            if busy || self.pipe.dev.rx_waiting() || self.core.stack().egress_pending() {
                self.yield_to_tasks().await;
                continue;
            }
            let far = tokio::time::Instant::now() + Duration::from_secs(3600);
            let deadline = self.core.stack().next_deadline().map(|d| {
                let at = Duration::from_micros(d.total_micros().max(0) as u64);
                tokio::time::Instant::from_std(self.epoch + at)
            });
            tokio::select! {
                biased;
                _ = self.core.kick.notified() => {},
                _ = tokio::time::sleep_until(deadline.unwrap_or(far).min(far)) => {},
            }
        }
    }

    async fn run_busy(mut self) -> Self {
        let mut freed = Vec::new();
        while !self.core.stopping() {
            self.turn(&mut freed);
            self.release_ports(&mut freed);
            self.yield_to_tasks().await;
        }
        self
    }

    pub(crate) fn release_ports(&self, freed: &mut Vec<(Proto, u16)>) {
        for (proto, port) in freed.drain(..) {
            self.core.release_port(proto, port);
        }
    }

    /// Lets the core's tasks run; one yield in [`TIMED_EVERY`] is timed (and counts for that
    /// many), as the pipeline's stages are.
    async fn yield_to_tasks(&mut self) {
        self.yields += 1;
        if !self.yields.is_multiple_of(TIMED_EVERY) {
            return tokio::task::yield_now().await;
        }
        let t = StdInstant::now();
        tokio::task::yield_now().await;
        self.core.stats().tasks.record_weighted(t, TIMED_EVERY);
    }

    /// Keeps the pipeline (and, by yielding, the core's tasks) running until nothing is left
    /// to finish (`Stack::settled`: the application holds no socket, every connection closed or
    /// in TIME-WAIT), for at most `linger`, or until the shutdown's grace ends; a stop ends it
    /// at once.
    pub(crate) async fn linger(mut self, linger: Duration) -> Self {
        let shared = self.core.shared.clone();
        let until = shared
            .life
            .drain_deadline()
            .unwrap_or_else(|| StdInstant::now() + linger);
        let mut freed = Vec::new();
        while StdInstant::now() < until && !shared.life.stop.load(Ordering::Relaxed) {
            let busy = self.turn(&mut freed);
            self.release_ports(&mut freed);
            let settled = self.core.stack().settled();
            if settled && self.upgrade.all_settled(&shared) {
                break;
            }
            if busy || self.core.stack().egress_pending() {
                // Connections still move data (a drain can be long): at full speed.
                self.yield_to_tasks().await;
            } else {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        }
        self
    }
}

/// The next hops `stack`'s flows wait for, learnt from what the steering program noted of a
/// shared address's neighbours: the kernel takes the ARP and NDP answers to the stack's
/// requests sent from such an address, and the program notes what they said. A map read (a
/// system call) per next hop waited for, at most every [`NEIGHBOURS_EVERY`]; nothing without a
/// waiting flow or a shared address.
fn learn_shared_neighbours(core: &Core, stack: &mut corelane_stack::Stack) {
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
