//! The life of a run: whether it runs, drains or stops, how many core futures still run,
//! the first error one returned, and what a panic does.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use crate::lock::lock;

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
    /// The first error a core's future returned, and its core.
    pub(crate) failure: Mutex<Option<(usize, String)>>,
    /// Every core's thread has ended, or never started: the threads beside the cores (the
    /// kernel's routes, the upgrade's listener) end too.
    pub(crate) cores_ended: AtomicBool,
}

impl Life {
    /// Every core future has returned, or a stop was asked for: the cores may end (or have:
    /// a core that failed to start runs no future).
    pub(crate) fn ending(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
            || self.apps_running.load(Ordering::Acquire) == 0
            || self.cores_ended.load(Ordering::Acquire)
    }

    pub(crate) fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// The drain deadline, if a graceful shutdown runs.
    pub(crate) fn drain_deadline(&self) -> Option<Instant> {
        *lock(&self.drain_until)
    }

    /// Keeps the first failure (the core, what its future returned); false when one was kept
    /// already.
    pub(crate) fn fail(&self, core: usize, message: String) -> bool {
        let mut f = lock(&self.failure);
        if f.is_some() {
            return false;
        }
        *f = Some((core, message));
        true
    }

    /// The failure kept, taken.
    pub(crate) fn take_failure(&self) -> Option<(usize, String)> {
        lock(&self.failure).take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_ends_when_its_futures_have_or_on_stop() {
        let life = Life::default();
        life.apps_running.store(2, Ordering::SeqCst);
        assert!(!life.ending());
        life.apps_running.fetch_sub(1, Ordering::SeqCst);
        assert!(!life.ending());
        life.stop.store(true, Ordering::SeqCst);
        assert!(life.ending(), "a stop ends it with futures left");
    }

    #[test]
    fn the_first_failure_is_kept() {
        let life = Life::default();
        assert!(life.fail(1, "bind: port in use".into()));
        assert!(!life.fail(0, "later".into()));
        assert_eq!(life.take_failure(), Some((1, "bind: port in use".into())));
        assert_eq!(life.take_failure(), None);
    }
}
