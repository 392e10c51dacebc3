//! What SIGTERM and SIGINT do to a process that installed no handler for them.
//!
//! Left to their default, they kill the process at once and its peers learn nothing: the
//! kernel, which would have closed a dead process's sockets, never held corelane's
//! connections. So when `run` starts and either signal still has its default disposition,
//! the runtime watches it (one thread per process, kept for the process's life): while a
//! runtime runs, the signal starts a short graceful shutdown (listeners close, connections end
//! with a FIN, what is left after [`GRACE`] ends as a process's exit ends a kernel
//! socket: a FIN when idle, else a reset), and when `run` has returned the process
//! ends by the same signal, as it would have (exit status included). Between runs the signal
//! kills at once, as by default. An application with its own handler for a signal keeps it:
//! only signals left at their default are watched, and `Builder::default_signals(false)` turns
//! this off.

#![allow(unsafe_code)] // Reading a signal's disposition is a libc call.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use signal_hook::consts::{SIGINT, SIGTERM};

use crate::StopHandle;

/// How long the shutdown a signal starts lets connections finish before they are reset.
pub(crate) const GRACE: Duration = Duration::from_secs(1);

/// The process's watcher: the runtime running now (if any), and the signal that asked it to
/// end.
struct Watch {
    running: Mutex<Option<StopHandle>>,
    got: AtomicI32,
}

static WATCH: OnceLock<Option<Watch>> = OnceLock::new();

/// True when `sig`'s disposition is the default one (no handler, not ignored).
fn is_default(sig: i32) -> bool {
    // SAFETY: a zeroed sigaction is a valid value of this plain C struct.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: with a null new action, sigaction only writes the current one into `old`, a
    // valid sigaction owned here.
    let rc = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
    rc == 0 && old.sa_sigaction == libc::SIG_DFL
}

/// Starts watching the signals still at their default (once per process).
fn watch() -> Option<&'static Watch> {
    WATCH
        .get_or_init(|| {
            let sigs: Vec<i32> = [SIGTERM, SIGINT]
                .into_iter()
                .filter(|&s| is_default(s))
                .collect();
            if sigs.is_empty() {
                return None;
            }
            let mut signals = match signal_hook::iterator::Signals::new(&sigs) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("watching SIGTERM and SIGINT: {e}");
                    return None;
                }
            };
            let spawned = std::thread::Builder::new()
                .name("corelane-signals".into())
                .spawn(move || {
                    for sig in signals.forever() {
                        on_signal(sig);
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!("watching SIGTERM and SIGINT: {e}");
                return None;
            }
            Some(Watch {
                running: Mutex::new(None),
                got: AtomicI32::new(0),
            })
        })
        .as_ref()
}

fn on_signal(sig: i32) {
    let Some(Some(w)) = WATCH.get() else {
        return;
    };
    let running = w.running.lock().unwrap_or_else(|p| p.into_inner()).clone();
    match running {
        Some(handle) if w.got.swap(sig, Ordering::SeqCst) == 0 => {
            tracing::warn!(
                "signal {sig}: shutting down ({} s at most); the process then ends by it",
                GRACE.as_secs()
            );
            handle.shutdown(GRACE);
        }
        // A second signal: stop now.
        Some(handle) => handle.stop(),
        // No runtime runs: what the default would have done.
        None => {
            let _ = signal_hook::low_level::emulate_default_handler(sig);
        }
    }
}

/// The watch over one `run`: registers the runtime, and at its end either clears it or, when
/// a signal ended the run, ends the process by that signal.
pub(crate) struct RunGuard {
    active: bool,
}

impl RunGuard {
    /// Watches the default signals for the runtime `handle` stops (nothing when `enabled` is
    /// false or both signals have handlers).
    pub(crate) fn start(handle: StopHandle, enabled: bool) -> RunGuard {
        let Some(w) = enabled.then(watch).flatten() else {
            return RunGuard { active: false };
        };
        w.got.store(0, Ordering::SeqCst);
        *w.running.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        RunGuard { active: true }
    }

    /// The run returned: if a watched signal ended it, the process ends by that signal now.
    pub(crate) fn finish(self) {
        let sig = match (self.active, WATCH.get()) {
            (true, Some(Some(w))) => w.got.swap(0, Ordering::SeqCst),
            _ => 0,
        };
        drop(self);
        if sig != 0 {
            let _ = signal_hook::low_level::emulate_default_handler(sig);
        }
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        // However the run ended (an error, a panic): no runtime to stop any more, so the
        // signals do what they would by default again.
        if let (true, Some(Some(w))) = (self.active, WATCH.get()) {
            *w.running.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

impl crate::Builder {
    /// Whether `run` watches SIGTERM and SIGINT when the application left them at their
    /// default (default: true). Watched, such a signal starts a graceful shutdown of 1 s
    /// (connections end with a FIN; what remains then gets one too when idle, else a reset)
    /// and the process then ends by it,
    /// so no peer is left waiting for a process that is gone; unwatched, the process dies at
    /// once and its peers time out. An application that handles a signal itself (with
    /// signal-hook, tokio's `signal`, or `sigaction`) keeps its handler either way; turn this
    /// off if it installs one only after `run` has started.
    pub fn default_signals(mut self, on: bool) -> Self {
        self.default_signals = on;
        self
    }
}
