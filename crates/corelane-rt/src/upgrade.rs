//! Handing the run to a new process without dropping a connection: the state the cores and
//! the upgrade's threads share. The old process's thread is `host/xsk/handover.rs`, each core's
//! part `upgrade_core.rs`, the new process's side `host/xsk/join.rs`.
//!
//! The old runtime listens on a unix socket ([`Builder::upgrades`](crate::Builder::upgrades)).
//! When a new process connects, the runtime's thread `corelane-upgrade` walks the cores
//! through the stages below, each done by every core on its next turn ([`Stage`]), and talks to
//! the new process between them:
//!
//! 1. **Offer**: each core offers its queue (`XskQueue::offer_upgrade`); the program and the
//!    offers go to the new process (`send_handover`), with this run's secret (SYN cookies and
//!    ISNs stay valid across the switch), the ports it listens on and the interface's queue
//!    count to put back at the end. The new process joins every queue with its own sockets (the
//!    cores hand the fill and completion rings over on their next turn), registers them as the
//!    next generation, and says `joined` once its application listens on those ports.
//! 2. **Record**: from here on this process gives up nothing it owns (`Steering::hand_on`: the
//!    ports its closing listeners release are the new process's too). Each core stops taking
//!    connections without refusing any (listeners closed, a SYN left unanswered:
//!    `Stack::set_quiet`; the peer's retry reaches the new process) and writes each of its TCP
//!    connections into the program's `old_flows`.
//! 3. **Switched**: the program sends every frame to the new generation except the kept
//!    connections' segments (`Steering::set_upgrade`), and this process drains as
//!    [`StopHandle::shutdown`](crate::StopHandle::shutdown) does; each core forgets a
//!    connection in the program once it is gone. The cores end together once every
//!    connection is done (a kept connection's segments may arrive on any queue), each forgets
//!    the rest and leaves its queue (`XskQueue::leave_upgrade`) with every frame it held.
//!
//! Once the program has switched, the old process says `switched`; the new process ends the
//! split only after that word, when the connection ends (the cores have left). Without it,
//! the upgrade was called off and the new process stands down.
//!
//! If the new process does not say `joined` in time (or its connection ends first), the
//! upgrade is called off (**Reclaim**): each core takes its queue back at once where the new
//! process never took the rings, and otherwise only once the new process has said it touches
//! them no more (it stops on its next turn: `XskQueue::call_off_upgrade`) or its process has
//! ended (its pidfd), so that no frame is ever in both processes' hands. This process serves
//! on throughout.
//!
//! | old process's stage | queue phase (exchange word) | program | new process |
//! |---|---|---|---|
//! | Idle | none | old generation | connects (build) |
//! | Offer | Offered | old generation | binds its sockets, registers them as the next generation |
//! | (waits for `joined`) | Bound, Handing, Handed (each core at its start in `run`) | old generation | fills and completes for both; says `joined` once it listens |
//! | Record | Handed | old generation, `hand_on` | waits for `switched` |
//! | Switched | Handed | new generation, split on (kept flows to the old) | serves new connections |
//! | (cores end) | Left | split on | ends the split when the connection ends |
//! | Reclaim (no `joined`) | Offered/Bound -> Aborted; Handed -> Aborting -> Aborted | old generation | stands down: fills and sends no more, lets its sends complete, says Aborted; its run ends with an error |

use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::host::{Partner, UpgradeOffer};
use corelane_stack::Stack;

use crate::lock::lock;

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
pub(crate) const STAGE_WAIT: Duration = Duration::from_secs(5);
/// How long the new process has to join every queue and say so.
pub(crate) const JOIN_WAIT: Duration = Duration::from_secs(20);
/// How long a called-off new process has to stand down (it stops at its next turn and waits
/// at most [`LEAVE_WAIT`] for its last sends) before the old one ends it to take its rings
/// back: a successor that is stopped (`SIGSTOP`, a debugger) or whose core thread blocks would
/// otherwise leave the serving process without receive or transmit.
pub(crate) const STAND_DOWN_WAIT: Duration = Duration::from_secs(8);
/// How often a core forgets the kept connections that closed.
pub(crate) const FORGET_EVERY: Duration = Duration::from_millis(100);
/// The longest an idle core sleeps while it shares its queue with the other process of an
/// upgrade: what one process hands the other (frames to fill the ring with, completions)
/// wakes nothing.
pub(crate) const SHARED_NAP: Duration = Duration::from_micros(250);
/// How long a core waits, at its end, for its last sends to complete before leaving.
pub(crate) const LEAVE_WAIT: Duration = Duration::from_secs(3);

/// The upgrade's state, shared by the cores and the thread that talks to the new process.
#[derive(Default)]
pub(crate) struct Upgrades {
    pub(crate) stage: AtomicU8,
    /// Cores that have done the current stage.
    pub(crate) done: AtomicUsize,
    /// Every core's thread has ended (a graceful shutdown's cores end once their futures and
    /// connections are done): no core will do a stage any more, and their queues are closed.
    pub(crate) cores_ended: std::sync::atomic::AtomicBool,
    /// Each core's offer, or why it could not make one.
    pub(crate) offers: Mutex<Vec<Option<Result<UpgradeOffer, String>>>>,
    /// The generation of this process's sockets.
    pub(crate) old_gen: AtomicU8,
    /// While set, each core publishes its listening TCP ports in `listening` (the new
    /// process waits for the application to listen where the old one did).
    pub(crate) listing: std::sync::atomic::AtomicBool,
    /// Each core's listening TCP ports (the old process's at its offer; the new one's while
    /// `listing`).
    pub(crate) listening: Mutex<Vec<Vec<u16>>>,
    /// Cores whose connections are all done, once the program has switched.
    pub(crate) settled: AtomicUsize,
    /// The connection to the new process: closed once every core has left.
    pub(crate) partner: Mutex<Option<OwnedFd>>,
    /// The new process's hold on the interface's record, once the old process has gone
    /// (`host/xsk/join.rs`).
    pub(crate) inherited: Mutex<Option<crate::queues::RestoreQueues>>,
    /// The old process: the new process (a pidfd), to see whether it has ended while an
    /// upgrade is called off.
    pub(crate) partner_process: Mutex<Option<Box<dyn Partner>>>,
    /// The new process: the upgrade was called off; each core stands down from its queue.
    pub(crate) stand_down: std::sync::atomic::AtomicBool,
    /// The new process: a core has reported its queue called off (once).
    pub(crate) called_off: std::sync::atomic::AtomicBool,
    /// The new process: when the old one was seen dead before it left every queue; each
    /// core takes back what it held on its queue (`XskQueue::outlive_partner`).
    pub(crate) old_died_at: Mutex<Option<Instant>>,
    /// Set with `old_died_at` (one load a turn).
    pub(crate) old_died: std::sync::atomic::AtomicBool,
}

impl Upgrades {
    /// The stage the cores are asked to do (one atomic load: read every turn).
    pub(crate) fn stage(&self) -> Stage {
        Stage::from_u8(self.stage.load(Ordering::Acquire))
    }

    /// Asks every core for `stage` (the caller rings them).
    pub(crate) fn ask(&self, stage: Stage) {
        self.done.store(0, Ordering::SeqCst);
        self.stage.store(stage as u8, Ordering::Release);
    }

    /// Whether the new process of a call-off has ended (no pidfd: not known, so not).
    pub(crate) fn partner_ended(&self) -> bool {
        lock(&self.partner_process)
            .as_ref()
            .is_some_and(|p| p.ended())
    }

    /// Ends the new process of a call-off that did not stand down in time (see
    /// [`STAND_DOWN_WAIT`]). Returns its pid.
    pub(crate) fn kill_partner(&self) -> Result<u32, String> {
        match lock(&self.partner_process).as_ref() {
            Some(p) => p.kill(),
            None => Err("no pidfd of the new process is held".into()),
        }
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

    pub(crate) fn note_listening(&self, core: usize, stack: &Stack) {
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
