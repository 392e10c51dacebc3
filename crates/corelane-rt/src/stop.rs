//! How a run ends, and what a panic does. The process's signals are the application's, which
//! calls [`StopHandle::shutdown`] (or `stop`) from its own handler; SIGTERM and SIGINT left at
//! their default get the runtime's (a 1 s graceful end, then the process ends by the signal:
//! [`Builder::default_signals`](crate::Builder::default_signals)).
//!
//! A run ends when every core's future has returned (a core whose future returns early keeps
//! serving its queue until then), when [`StopHandle::shutdown`] drains it, or at once on
//! [`StopHandle::stop`]. After the futures, each core lingers while connections close (FIN and
//! its ACK), then resets what is left.

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::control::Shared;
use crate::lock::lock;

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
/// // The application's own signal handling, here signal-hook's (a signal with a handler of
/// // the application's is left to it: see `Builder::default_signals`):
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
    /// after `grace` ends as a process's exit ends a kernel socket: with a FIN when nothing is
    /// unread and everything sent was acknowledged, else with a reset. `run` returns with
    /// `RunReport::stopped` set; each core's `CoreStats::stack.reset_at_stop` says how many
    /// connections had to be reset, `fin_at_stop` how many idle ones got a FIN.
    pub fn shutdown(&self, grace: Duration) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        let life = &shared.life;
        {
            // The deadline and the flag change together, under the deadline's lock: an
            // upgrade called off at this moment takes back the deadline it set itself only if
            // no shutdown has begun (`upgrade_old.rs` `call_off`), and must not see the
            // shutdown's deadline without its flag (taken, the drain would have no end).
            let mut until = lock(&life.drain_until);
            let t = shared.clock.now() + grace;
            *until = Some(until.map_or(t, |u| u.min(t)));
            life.draining.store(true, Ordering::SeqCst);
        }
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
