//! One core (a lane): its protocol stack behind a lock its sockets share, its counters, and the
//! thread-local through which the application's tasks find it.

use std::cell::RefCell;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::host::Steering;
pub use corelane_stack::Stage;
use corelane_stack::{DeviceStats, PipelineStats, Proto, Stack, StackStats};
use tokio::sync::Notify;

use crate::control::Shared;
use crate::lock::lock;

/// Counters of one core's pipeline: per stage, frames (or flows) and time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreStats {
    /// Core index (0-based, in the runtime's order).
    pub core: usize,
    /// CPU the core's thread is pinned to.
    pub cpu: usize,
    /// Interface queue the core serves.
    pub queue: u32,
    /// The pipeline's turns and, per stage, frames (or flows) and time.
    pub pipeline: PipelineStats,
    /// Times the core went to sleep (adaptive poll mode).
    pub parks: u64,
    /// Times the core registered its queue's descriptor with the executor to sleep on it: at
    /// its first sleep, and at the first sleep after each unregistration.
    pub queue_registrations: u64,
    /// Times a busy core unregistered its queue's descriptor (after 64 frames received and
    /// sent since it last woke), so that the kernel runs no wake-up path for each frame
    /// received and each transmitted frame freed while nobody sleeps on the queue.
    pub queue_unregistrations: u64,
    /// Frames that woke the core from a sleep: how long each waited, from the steering
    /// program's receive stamp to the turn that read it (what sleeping costs in latency;
    /// items: wake-ups measured).
    pub rx_wait_woken: Stage,
    /// The same wait for frames that found the core awake (one turn in
    /// [`RX_WAIT_SAMPLE_EVERY`] is measured): the part of the wait sleeping does not add. Only
    /// frames that arrived since the turn before are sampled (an older stamp cannot be told
    /// from a stale one), so a frame a full batch left in the ring is not.
    pub rx_wait_awake: Stage,
    /// What sleeping adds to a frame's wait here: the median of the recent waits after a
    /// sleep less that of the recent waits awake (None until a frame woke the core).
    pub wake_cost: Option<Duration>,
    /// The longest spin of an idle core now ([`crate::PollMode::Adaptive`]: four times
    /// `wake_cost`, within the configured spin; zero until a wait was measured, and when
    /// busy polling).
    pub spin: Duration,
    /// Application tasks: time between the driver yielding and running again.
    pub tasks: Stage,
    /// Accept polls that found nothing after being woken (should stay 0: wake-one).
    pub accept_spurious: u64,
    /// Reads of the program's map of a shared address's neighbours (each a system call, or a
    /// request to the broker under a grant): at most 16 a millisecond, however many sources
    /// a flood spoofs.
    pub neighbour_reads: u64,
    /// CPU the application's tasks run on (the same as `cpu` for a same-core lane).
    pub app_cpu: usize,
    /// CPU time of the protocol thread (and of the application, on a same-core lane), measured
    /// when the core ends.
    pub cpu_time: Duration,
    /// CPU time of the application thread of a split lane (zero on a same-core lane).
    pub app_cpu_time: Duration,
    /// Model-T batching: the batch size now, where it settled, and the fill ring's occupancy.
    pub batch: BatchStats,
    /// Times the core's future panicked and was run again ([`crate::OnPanic::RestartCore`]).
    pub restarts: u64,
    /// Device counters.
    pub device: DeviceStats,
    /// Protocol counters.
    pub stack: StackStats,
}

/// One turn in this many, the first frame a core reads while awake has its wait measured
/// ([`CoreStats::rx_wait_awake`]).
pub const RX_WAIT_SAMPLE_EVERY: u64 = 64;

/// Where a core's batching stands (see [`crate::Builder::adaptive_batch`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// The batch adapts (Model-T); otherwise it is fixed at `current`.
    pub adaptive: bool,
    /// Frames per RX pull and per TX kick now.
    pub current: usize,
    /// The size that carried the most frames so far.
    pub settled: usize,
    /// The largest batch whose working set fits half of the core's L2.
    pub cap: usize,
    /// The core's L2 in bytes, as read for the cap.
    pub l2_bytes: usize,
    /// Times the size changed.
    pub changes: u64,
    /// Frames kept posted in the fill ring.
    pub fill_target: usize,
}

/// The state of one core (lane), reachable from its tasks through a thread-local. The protocol
/// stack sits behind a mutex so that a split lane's application thread can reach it; on a
/// same-core lane nobody else takes the lock, which then costs two uncontended atomics.
/// Lock order: the stack before the counters.
pub(crate) struct Core {
    pub(crate) index: usize,
    pub(crate) stack: Mutex<Stack>,
    pub(crate) shared: Arc<Shared>,
    /// Wakes the driver when a task queued output.
    pub(crate) kick: Notify,
    pub(crate) stats: Mutex<CoreStats>,
    pub(crate) next_waiter: AtomicU64,
    /// Set when the core should stop: the driver returns.
    pub(crate) stopping: AtomicBool,
    /// Set when the protocol side has shut down (a split lane's application thread waits for it).
    pub(crate) ended: tokio::sync::watch::Sender<bool>,
    /// What each panic of the core's future said (the future was restarted after each).
    pub(crate) panics: Mutex<Vec<String>>,
    /// When the core's future last panicked, for the restarts' back-off.
    pub(crate) panic_times: Mutex<std::collections::VecDeque<std::time::Instant>>,
    /// How many times this core bound port 0 (its n-th such bind gets the n-th picked port).
    pub(crate) auto_binds: AtomicU64,
}

/// A core's future that panics this many times within [`PANIC_WINDOW`] is not run again: the
/// runtime stops with the panic (a future that fails at start, such as a bind of a port in
/// use, would otherwise restart forever).
pub(crate) const PANIC_LIMIT: usize = 5;
/// The window of [`PANIC_LIMIT`].
pub(crate) const PANIC_WINDOW: Duration = Duration::from_secs(10);
/// The wait before the first restart after a quiet spell; it doubles with each panic in
/// [`PANIC_WINDOW`], up to [`RESTART_DELAY_MAX`].
pub(crate) const RESTART_DELAY: Duration = Duration::from_millis(10);
/// The longest wait before a restart.
pub(crate) const RESTART_DELAY_MAX: Duration = Duration::from_secs(1);

impl Core {
    /// Core `index` of a run, with its stack and its counters to start from.
    pub(crate) fn new(index: usize, stack: Stack, shared: Arc<Shared>, stats: CoreStats) -> Core {
        Core {
            index,
            stack: Mutex::new(stack),
            shared,
            kick: Notify::new(),
            stats: Mutex::new(stats),
            next_waiter: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            ended: tokio::sync::watch::Sender::new(false),
            panics: Mutex::new(Vec::new()),
            panic_times: Mutex::new(std::collections::VecDeque::new()),
            auto_binds: AtomicU64::new(0),
        }
    }

    /// The core's future panicked with `message`: with `restart`, it is logged and counted,
    /// and the caller runs the future again after the wait returned (the 1st panic in
    /// [`PANIC_WINDOW`] waits [`RESTART_DELAY`], each further one twice the last, at most
    /// [`RESTART_DELAY_MAX`]); at the [`PANIC_LIMIT`]-th panic in the window, or without
    /// `restart`, the runtime stops and the error names the panic (None, with the message to
    /// report).
    pub(crate) fn on_panic(&self, message: &str, restart: bool) -> Result<Duration, String> {
        let restart = restart && !self.shared.life.stop.load(Ordering::Relaxed);
        let now = self.shared.clock.now();
        let recent = {
            let mut times = lock(&self.panic_times);
            while times
                .front()
                .is_some_and(|&t| now.duration_since(t) > PANIC_WINDOW)
            {
                times.pop_front();
            }
            times.push_back(now);
            times.len()
        };
        if restart && recent < PANIC_LIMIT {
            let delay = (RESTART_DELAY * (1 << (recent - 1).min(16) as u32)).min(RESTART_DELAY_MAX);
            tracing::error!(
                "core {}: its future panicked ({message}); running it again in {delay:?}",
                self.index
            );
            self.stats().restarts += 1;
            lock(&self.panics).push(message.to_string());
            return Ok(delay);
        }
        let message = if restart {
            format!(
                "{message} (panic {recent} in {PANIC_WINDOW:?}: not run again, as a future that \
                 fails every time it starts would restart forever)"
            )
        } else {
            message.to_string()
        };
        tracing::error!(
            "core {}: its future panicked ({message}); stopping the runtime",
            self.index
        );
        self.shared.stop_all();
        Err(message)
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Core>>> = const { RefCell::new(None) };
}

pub(crate) fn set_current(core: Option<Arc<Core>>) {
    CURRENT.with(|c| *c.borrow_mut() = core);
}

/// The core the calling task runs on.
pub(crate) fn current() -> io::Result<Arc<Core>> {
    CURRENT.with(|c| c.borrow().clone()).ok_or_else(|| {
        io::Error::other(
            "not on a corelane core: call this from a task inside Runtime::run \
             (in a test: inside corelane::lab::run)",
        )
    })
}

impl Core {
    /// The protocol stack, locked.
    pub(crate) fn stack(&self) -> MutexGuard<'_, Stack> {
        lock(&self.stack)
    }

    /// The counters, locked (after the stack, when both are needed).
    pub(crate) fn stats(&self) -> MutexGuard<'_, CoreStats> {
        lock(&self.stats)
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed) || self.shared.life.ending()
    }

    /// Queues flow output and makes sure the driver runs soon.
    pub(crate) fn wake_driver(&self) {
        self.kick.notify_one();
    }

    /// The steering program, to read (changes go through [`Steer::run`](crate::steward::Steer::run)).
    pub(crate) fn steering(&self) -> MutexGuard<'_, Steering> {
        self.shared.steer.read()
    }

    pub(crate) fn own_port(&self, proto: Proto, port: u16) -> io::Result<()> {
        self.shared
            .steer
            .run_port_change(Some(port), move |s| s.own_port(proto, port))
            .map_err(|e| io::Error::other(e.to_string()))?
            .map_err(io::Error::from)
    }

    /// The port for this core's next bind of port 0: the same on every core, picked by the
    /// first core to get there from the ports no socket holds (below the ephemeral range,
    /// which the cores share out for connections they open).
    /// Returns the bind's number (for [`Core::auto_port_instead`]) and its port.
    pub(crate) fn auto_port(&self, proto: Proto) -> io::Result<(usize, u16)> {
        let n = self.auto_binds.fetch_add(1, Ordering::Relaxed) as usize;
        let mut picked = lock(&self.shared.auto_ports);
        if let Some(&p) = picked.get(n) {
            return Ok((n, p));
        }
        let free = self.free_auto_port(proto, &picked, 20_000)?;
        picked.push(free);
        Ok((n, free))
    }

    /// Another port for bind `n` of port 0, whose port `refused` could not be steered (on an
    /// address shared with the kernel, a kernel socket holds it): a port above it, the same
    /// for every core that comes to bind `n` later (one that got there first keeps its pick).
    pub(crate) fn auto_port_instead(
        &self,
        proto: Proto,
        n: usize,
        refused: u16,
    ) -> io::Result<u16> {
        let mut picked = lock(&self.shared.auto_ports);
        match picked.get(n) {
            Some(&p) if p != refused => Ok(p),
            _ => {
                let free = self.free_auto_port(proto, &picked, refused.saturating_add(1))?;
                if let Some(p) = picked.get_mut(n) {
                    *p = free;
                }
                Ok(free)
            }
        }
    }

    fn free_auto_port(&self, proto: Proto, picked: &[u16], from: u16) -> io::Result<u16> {
        let steering = self.steering();
        (from..corelane_stack::EPHEMERAL_START)
            .find(|p| !steering.port_owned(proto, *p) && !picked.contains(p))
            .ok_or_else(|| io::Error::new(io::ErrorKind::AddrNotAvailable, "no free port"))
    }

    pub(crate) fn release_port(&self, proto: Proto, port: u16) {
        let done = self
            .shared
            .steer
            .run_port_change(None, move |s| s.release_port(proto, port));
        if let Err(e) = done
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            tracing::warn!("core {}: releasing {proto:?} port {port}: {e}", self.index);
        }
    }

    /// A snapshot of this core's counters.
    pub(crate) fn snapshot(&self) -> CoreStats {
        let stack = self.stack().stats();
        let mut s = *self.stats();
        s.stack = stack;
        s
    }
}
