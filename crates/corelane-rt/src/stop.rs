//! How a run ends, and what a panic does. The process's signals are the application's, which
//! calls [`StopHandle::shutdown`] (or `stop`) from its own handler; SIGTERM and SIGINT left at
//! their default get the runtime's (a 1 s graceful end, then the process ends by the signal:
//! [`Builder::default_signals`](crate::Builder::default_signals)).
//!
//! A run ends when every core's future has returned (a core whose future returns early keeps
//! serving its queue until then), when [`StopHandle::shutdown`] drains it, or at once on
//! [`StopHandle::stop`]. After the futures, each core lingers while connections close (FIN and
//! its ACK), then resets what is left.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use crate::launch::Shared;

/// What a panic in a core's future does (see [`Builder::on_panic`](crate::Builder::on_panic)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnPanic {
    /// The core's future is run again (the closure given to `run` is called anew); the
    /// sockets the old one held are dropped with it (their connections closed or reset), and
    /// the core keeps serving its queue throughout. The panic is logged and counted
    /// (`CoreStats::restarts`, `CoreReport::panics`). What a server operator wants: one bad
    /// request does not take a queue down.
    ///
    /// Restarts back off: the first panic after a quiet spell waits 10 ms before the future
    /// runs again, each further panic within 10 s twice as long as the last (at most 1 s),
    /// and the 5th panic within 10 s stops the runtime: `run` returns
    /// [`Error::Panicked`](crate::Error) with the panic's message. A future that fails every
    /// time it starts (a bind of an address the runtime does not own, a port in use) so ends
    /// the run within a second, with the reason, instead of restarting forever.
    #[default]
    RestartCore,
    /// The whole runtime stops at once and `run` returns [`Error::Panicked`](crate::Error).
    StopRuntime,
}

/// The state of a run, shared by the cores and the handles.
#[derive(Debug, Default)]
pub(crate) struct Life {
    /// Stop now: every core resets its connections and ends.
    pub(crate) stop: AtomicBool,
    /// A graceful shutdown was asked for: listeners close, futures finish, then the cores end.
    pub(crate) draining: AtomicBool,
    /// When a graceful shutdown turns into a stop.
    pub(crate) drain_until: Mutex<Option<Instant>>,
    /// Core futures still running.
    pub(crate) apps_running: AtomicUsize,
    /// Woken when a stop or a graceful shutdown is asked for.
    pub(crate) asked: tokio::sync::Notify,
}

impl Life {
    /// Every core future has returned, or a stop was asked for: the cores may end.
    pub(crate) fn ending(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.apps_running.load(Ordering::Acquire) == 0
    }

    pub(crate) fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// The drain deadline, if a graceful shutdown runs.
    pub(crate) fn drain_deadline(&self) -> Option<Instant> {
        *self.drain_until.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Shared {
    /// Stop now.
    pub(crate) fn stop_all(&self) {
        self.life.stop.store(true, Ordering::SeqCst);
        self.announce_shutdown();
        self.ring_all();
    }

    /// A core's future returned for good.
    pub(crate) fn app_done(&self) {
        if self.life.apps_running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.ring_all();
        }
    }

    /// Logs `message` (and, when no tracing subscriber was ever installed, prints it to
    /// stderr) and keeps it for the run's report, unless the same was said before.
    pub(crate) fn warn_once(&self, message: String) {
        let mut w = self.warnings.lock().unwrap_or_else(|p| p.into_inner());
        if !w.contains(&message) {
            tracing::warn!("{message}");
            // With no subscriber installed the warning would go nowhere: a user who did not
            // set up logging still sees it.
            if !tracing::dispatcher::has_been_set() {
                eprintln!("corelane: warning: {message}");
            }
            w.push(message);
        }
    }

    fn ring_all(&self) {
        for b in &self.bells {
            b.ring_always();
        }
    }
}

/// Ends a running [`Runtime`](crate::Runtime) from any thread (a signal handler's thread,
/// say): gracefully with [`shutdown`](StopHandle::shutdown), or at once with
/// [`stop`](StopHandle::stop).
///
/// ```no_run
/// # use corelane_rt as corelane;
/// use std::time::Duration;
/// let rt = corelane::Runtime::builder("eth0")
///     .addr("10.0.0.5/24")
///     .build()?;
/// let handle = rt.stop_handle();
/// // The application's own signal handling (corelane installs none), here signal-hook's:
/// let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM])?;
/// std::thread::spawn(move || {
///     if signals.forever().next().is_some() {
///         handle.shutdown(Duration::from_secs(10));
///     }
/// });
/// rt.run(|_core| async { /* the service */ })?;
/// # Ok::<(), corelane::Error>(())
/// ```
#[derive(Clone)]
pub struct StopHandle(pub(crate) Weak<Shared>);

impl std::fmt::Debug for StopHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopHandle").finish_non_exhaustive()
    }
}

impl StopHandle {
    /// Stops now: every core resets its connections and ends; `run` returns with
    /// `RunReport::stopped` set.
    pub fn stop(&self) {
        if let Some(shared) = self.0.upgrade() {
            shared.stop_all();
        }
    }

    /// Shuts down gracefully: every listener closes (pending `accept`s return an error, new
    /// connection requests are refused), the cores' futures and their tasks finish what they
    /// are doing and close their connections (FIN), and the cores end. What is still open
    /// after `grace` is reset. `run` returns with `RunReport::stopped` set; each core's
    /// `CoreStats::stack.reset_at_stop` says how many connections had to be reset.
    pub fn shutdown(&self, grace: Duration) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        let life = &shared.life;
        {
            let mut until = life.drain_until.lock().unwrap_or_else(|p| p.into_inner());
            let t = Instant::now() + grace;
            *until = Some(until.map_or(t, |u| u.min(t)));
        }
        life.draining.store(true, Ordering::SeqCst);
        shared.announce_shutdown();
        shared.ring_all();
    }

    /// True once a stop or a shutdown was asked for, or the runtime has ended.
    pub fn is_stopping(&self) -> bool {
        self.0
            .upgrade()
            .is_none_or(|shared| shared.life.stop.load(Ordering::Relaxed) || shared.life.draining())
    }
}
