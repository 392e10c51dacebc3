//! Handing the run to a new process without dropping a connection (the old process's side;
//! the new one's is `upgrade_join.rs`).
//!
//! The old runtime listens on a unix socket ([`Builder::upgrades`](crate::Builder::upgrades)).
//! When a new process connects, the runtime's thread `corelane-upgrade` walks the cores
//! through the stages below, each done by every core on its next turn ([`Stage`]), and talks to
//! the new process between them:
//!
//! 1. **Offer**: each core offers its queue (`XskQueue::offer_upgrade`); the program and the
//!    offers go to the new process (`send_handover`), with this run's secret (SYN cookies and
//!    ISNs stay valid across the switch) and the interface's queue count to put back at the end.
//!    The new process joins every queue with its own sockets (the cores hand the fill and
//!    completion rings over on their next turn) and registers them as the next generation.
//! 2. **Record**, once it says `joined`: each core stops taking connections without refusing
//!    any (listeners closed, a SYN left unanswered: `Stack::set_quiet`; the peer's retry reaches
//!    the new process) and writes each of its TCP connections into the program's `old_flows`.
//! 3. **Switched**: the program sends every frame to the new generation except the kept
//!    connections' segments (`Steering::set_upgrade`); this process gives up nothing it owns
//!    from now on (`Steering::hand_on`) and drains as [`StopHandle::shutdown`] does; each core
//!    forgets a connection in the program once it is gone. When a core ends it forgets the
//!    rest, and leaves the queue (`XskQueue::leave_upgrade`) with every frame it held.
//!
//! The connection to the new process stays open until the cores have left: its end tells
//! the new process to end the split. If the new process fails before `joined`, the cores take
//! their queues back (**Reclaim**) and this process serves on.

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corelane_stack::Stack;
use corelane_xsk::{UpgradeOffer, UpgradePhase, XskQueue};

use crate::Error;
use crate::control::Shared;
use crate::lock::lock;
use crate::steward::Steer;

/// What the cores are asked to do, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub(crate) enum Stage {
    Idle = 0,
    Offer = 1,
    Record = 2,
    Switched = 3,
    Reclaim = 4,
}

impl Stage {
    fn from_u8(v: u8) -> Stage {
        match v {
            1 => Stage::Offer,
            2 => Stage::Record,
            3 => Stage::Switched,
            4 => Stage::Reclaim,
            _ => Stage::Idle,
        }
    }
}

/// How long the cores have to do a stage (each does it on its next turn: milliseconds).
const STAGE_WAIT: Duration = Duration::from_secs(5);
/// How long the new process has to join every queue and say so.
const JOIN_WAIT: Duration = Duration::from_secs(20);
/// How often a core forgets the kept connections that closed.
pub(crate) const FORGET_EVERY: Duration = Duration::from_millis(100);
/// The longest an idle core sleeps while it shares its queue with the other process of an
/// upgrade: what one process hands the other (frames to fill the ring with, completions)
/// wakes nothing.
pub(crate) const SHARED_NAP: Duration = Duration::from_micros(250);
/// How long a core waits, at its end, for its last sends to complete before leaving.
const LEAVE_WAIT: Duration = Duration::from_secs(3);

/// The upgrade's state, shared by the cores and the thread that talks to the new process.
#[derive(Default)]
pub(crate) struct Upgrades {
    stage: AtomicU8,
    /// Cores that have done the current stage.
    done: AtomicUsize,
    /// Each core's offer, or why it could not make one.
    offers: Mutex<Vec<Option<Result<UpgradeOffer, String>>>>,
    /// The generation of this process's sockets.
    old_gen: AtomicU8,
    /// While set, each core publishes its listening TCP ports in `listening` (the new
    /// process waits for the application to listen where the old one did).
    listing: std::sync::atomic::AtomicBool,
    /// Each core's listening TCP ports (the old process's at its offer; the new one's while
    /// `listing`).
    listening: Mutex<Vec<Vec<u16>>>,
    /// Cores whose connections are all done, once the program has switched.
    settled: AtomicUsize,
    /// The connection to the new process: closed once every core has left.
    partner: Mutex<Option<OwnedFd>>,
    /// The new process's hold on the interface's record, once the old process has gone
    /// (`upgrade_join.rs`).
    pub(crate) inherited: Mutex<Option<crate::queues::RestoreQueues>>,
}

impl Upgrades {
    /// The stage the cores are asked to do (one atomic load: read every turn).
    pub(crate) fn stage(&self) -> Stage {
        Stage::from_u8(self.stage.load(Ordering::Acquire))
    }

    fn ask(&self, shared: &Shared, stage: Stage) {
        self.done.store(0, Ordering::SeqCst);
        self.stage.store(stage as u8, Ordering::Release);
        shared.ring_all();
    }

    /// Waits until every one of `cores` has done the stage asked.
    fn wait_done(&self, cores: usize, what: &str) -> Result<(), Error> {
        let start = Instant::now();
        while self.done.load(Ordering::Acquire) < cores {
            if start.elapsed() > STAGE_WAIT {
                return Err(Error::Config(format!(
                    "upgrade: {} of {cores} core(s) {what} within {STAGE_WAIT:?}",
                    self.done.load(Ordering::Acquire)
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Has each of `cores` publish its listening ports until [`Upgrades::stop_listing`].
    pub(crate) fn start_listing(&self, cores: usize) {
        *lock(&self.listening) = vec![Vec::new(); cores];
        self.listing.store(true, Ordering::Release);
    }

    pub(crate) fn stop_listing(&self) {
        self.listing.store(false, Ordering::Release);
    }

    /// Every core's listening ports, together.
    pub(crate) fn listening_ports(&self) -> Vec<u16> {
        let mut all: Vec<u16> = lock(&self.listening).iter().flatten().copied().collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    fn note_listening(&self, core: usize, stack: &Stack) {
        let mut ports = stack.listening_ports();
        ports.sort_unstable();
        if let Some(slot) = lock(&self.listening).get_mut(core) {
            *slot = ports;
        }
    }

    /// True once a new process has taken this run's place.
    pub(crate) fn switched(&self) -> bool {
        self.stage() == Stage::Switched
    }

    /// Ends the upgrade's connection: the new process ends the split (every core has left).
    pub(crate) fn close(&self) {
        lock(&self.partner).take();
    }
}

/// One core's part in an upgrade, kept by its driver.
#[derive(Debug, Default)]
pub(crate) struct CoreUpgrade {
    /// The last stage this core did.
    seen: Option<Stage>,
    /// The connections this core keeps in the program: (peer, local port).
    kept: Vec<(SocketAddr, u16)>,
    /// When the core next forgets the kept connections that closed.
    forget_at: Option<Instant>,
    /// How many ports this core listened on when it last published them.
    listened: Option<usize>,
    /// This core's connections are all done and counted in `Upgrades::settled`.
    settled: bool,
}

impl CoreUpgrade {
    /// Does the stage asked, once, on this core's turn (a load and a compare when none is).
    pub(crate) fn turn(
        &mut self,
        shared: &Shared,
        core: usize,
        stack: &mut Stack,
        io: &mut XskQueue,
        listeners_closed: &mut bool,
    ) {
        let up = &shared.upgrades;
        if up.listing.load(Ordering::Relaxed) {
            let n = stack.listening_ports().len();
            if self.listened != Some(n) {
                self.listened = Some(n);
                up.note_listening(core, stack);
            }
        }
        let stage = up.stage();
        if stage == Stage::Idle {
            return;
        }
        if self.seen != Some(stage) {
            self.seen = Some(stage);
            match stage {
                Stage::Idle => {}
                Stage::Offer => {
                    up.note_listening(core, stack);
                    let offer = io.offer_upgrade().map_err(|e| e.to_string());
                    if let Some(slot) = lock(&up.offers).get_mut(core) {
                        *slot = Some(offer);
                    }
                }
                Stage::Record => {
                    stack.set_quiet(true);
                    if !*listeners_closed {
                        *listeners_closed = true;
                        stack.begin_drain();
                    }
                    let mut kept = Vec::new();
                    stack.each_tcp(|local, remote, _| kept.push((remote, local.port())));
                    let generation = u32::from(up.old_gen.load(Ordering::Acquire));
                    let flows = kept.clone();
                    let r = shared.steer.run(move |s| {
                        flows
                            .iter()
                            .try_for_each(|&(peer, port)| s.keep_flow(peer, port, generation))
                    });
                    if let Err(e) = r
                        .map_err(|e| e.to_string())
                        .and_then(|r| r.map_err(|e| e.to_string()))
                    {
                        tracing::error!(
                            "core {core}: keeping its connections in the program failed ({e}): \
                             some may be reset"
                        );
                    }
                    tracing::debug!("core {core}: keeps {kept:?} in generation {generation}");
                    self.kept = kept;
                }
                Stage::Switched => {}
                Stage::Reclaim => {
                    if io.upgrade_phase().is_some() {
                        match io.reclaim_upgrade() {
                            Ok(n) => tracing::info!(
                                "core {core}: the upgrade failed; the queue is back ({n} frames)"
                            ),
                            Err(e) => tracing::error!("core {core}: taking the queue back: {e}"),
                        }
                    }
                }
            }
            up.done.fetch_add(1, Ordering::AcqRel);
        }
        if stage == Stage::Switched {
            let now = Instant::now();
            if self.forget_at.is_none_or(|t| now >= t) {
                self.forget_at = Some(now + FORGET_EVERY);
                self.forget_closed(&shared.steer, stack);
            }
        }
    }

    /// Whether a lingering core whose own connections are done may end: yes, but while the
    /// old process drains after an upgrade, only once every core's are. A kept connection's
    /// segments may arrive on any queue (the peer's kernel picks another one after a timeout),
    /// and only a core still turning hands them to the connection's core.
    pub(crate) fn all_settled(&mut self, shared: &Shared) -> bool {
        let up = &shared.upgrades;
        if !matches!(up.stage(), Stage::Record | Stage::Switched) {
            return true;
        }
        if !self.settled {
            self.settled = true;
            up.settled.fetch_add(1, Ordering::AcqRel);
        }
        up.settled.load(Ordering::Acquire) >= shared.bells.len()
    }

    /// Forgets in the program the kept connections this core no longer has.
    fn forget_closed(&mut self, steer: &Arc<Steer>, stack: &mut Stack) {
        if self.kept.is_empty() {
            return;
        }
        let mut open = Vec::new();
        stack.each_tcp(|local, remote, _| open.push((remote, local.port())));
        let (still, gone): (Vec<_>, Vec<_>) = self.kept.iter().partition(|k| open.contains(k));
        self.kept = still;
        if !gone.is_empty() {
            forget(steer, gone);
        }
    }

    /// At the core's end (its stack shut down): forgets every kept connection, then leaves
    /// the queue once its RX ring is read empty and its last sends completed. True when it
    /// left.
    pub(crate) fn leave(&mut self, shared: &Shared, core: usize, io: &mut XskQueue) -> bool {
        use corelane_xsk::FrameIo as _;
        if io.upgrade_phase() != Some(UpgradePhase::Handed) {
            return false;
        }
        // A core with nothing to drain may end before the program has switched: its socket
        // stays until then, so no frame of its queue finds none.
        let start = Instant::now();
        while shared.upgrades.stage() == Stage::Record && start.elapsed() < STAGE_WAIT {
            std::thread::sleep(Duration::from_millis(1));
        }
        forget(&shared.steer, std::mem::take(&mut self.kept));
        let start = Instant::now();
        let mut frames = std::collections::VecDeque::new();
        let mut done = Vec::new();
        loop {
            // What still arrives is for connections gone: dropped.
            io.recv(&mut frames, 64);
            done.extend(frames.drain(..));
            io.release(&mut done);
            let _ = io.complete();
            match io.leave_upgrade() {
                Ok(()) => {
                    tracing::info!("core {core}: left its queue to the new process");
                    return true;
                }
                Err(e) if start.elapsed() > LEAVE_WAIT => {
                    tracing::error!("core {core}: leaving its queue: {e}");
                    return false;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }
}

fn forget(steer: &Arc<Steer>, flows: Vec<(SocketAddr, u16)>) {
    if flows.is_empty() {
        return;
    }
    let r = steer.run(move |s| {
        for (peer, port) in flows {
            s.forget_flow(peer, port)?;
        }
        Ok::<(), corelane_xsk::Error>(())
    });
    if let Err(e) = r
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
    {
        tracing::warn!("forgetting closed connections in the program: {e}");
    }
}

#[path = "upgrade_handover.rs"]
mod handover;
pub(crate) use handover::{Extras, Listener, serve};

#[cfg(test)]
#[path = "upgrade_tests.rs"]
mod tests;
