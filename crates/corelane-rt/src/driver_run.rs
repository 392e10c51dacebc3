//! The driver's one run loop: turns while there is work, and an idle core's wait (adaptive
//! poll): a short spin, then sleep on what the host gives to wait on (the queue's descriptor
//! where frames arrive from outside, the doorbell other cores ring), a task's kick, or the
//! next deadline. Serving and lingering after the application are the same loop, ended
//! differently ([`End`]).

#![allow(unsafe_code)] // The executor polls the queue's and the doorbell's descriptors.

use std::future::Future;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, Instant as StdInstant};

use corelane_stack::TIMED_EVERY;
use tokio::io::unix::AsyncFd;

use crate::PollMode;
use crate::driver::{Driver, Wait};
use crate::host::{Queue, TX_NUDGE_AFTER, UpgradePhase};

struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Where the run loop ends.
#[derive(Debug, Clone, Copy)]
enum End {
    /// When the core is told to stop.
    Stopped,
    /// When nothing is left to finish, at `until`, or on a stop ([`Driver::linger`]).
    Settled { until: StdInstant },
}

/// A lingering core's longest sleep: it looks this often whether everything settled.
const LINGER_NAP: Duration = Duration::from_micros(200);

/// What an idle core sleeps on besides its kick and its deadline.
///
/// The queue's descriptor is registered with the executor for sleeps, not for the core's
/// whole life. A registered AF_XDP socket has a sleeper on its wait queue, and the kernel then runs the
/// wake-up path (two locks taken with interrupts off, and the executor's epoll callback) for
/// every frame received and for every transmitted frame it frees in copy mode, on whichever
/// CPU that happens, even when nobody waits: about 3% of a busy core at 16 connections
/// (`perf record -g`: `sock_wfree` and `sock_def_write_space` under `sendto`). A core that
/// moved [`UNREGISTER_AFTER`] frames since it last woke drops the registration, and registers
/// again at its next sleep; the registration looks at the queue, so a frame that came in
/// between wakes that sleep at once. A core that sleeps every few frames (one connection's
/// requests far apart) keeps it: two system calls a sleep would cost more than they save.
struct Waits {
    /// The queue's descriptor (none for a host with nothing to sleep on).
    queue_fd: Option<RawFd>,
    /// Its registration, while it lasts.
    queue: Option<AsyncFd<Fd>>,
    bell: Option<AsyncFd<Fd>>,
    /// Frames received and sent when the core last woke (or began).
    frames_at_wake: u64,
}

/// Frames received and sent since the core last woke after which it unregisters its queue's
/// descriptor: registering again costs two system calls (about 2 us) at the next sleep, and
/// the kernel's wake-up path costs a few hundred nanoseconds for each of these frames.
pub(crate) const UNREGISTER_AFTER: u64 = 64;

/// Registers `fd` with the executor for readability.
fn register(fd: RawFd) -> std::io::Result<AsyncFd<Fd>> {
    // SAFETY: the descriptor is the queue's (owned by the core's device, which outlives the
    // loop: every registration is dropped by the time it returns, and the queue is never
    // replaced) or the doorbell's (an Arc the driver's peers hold across the loop).
    unsafe { AsyncFd::register_with_interest(Fd(fd), tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// Until `fd` is readable (never, without one).
async fn readable(fd: &Option<AsyncFd<Fd>>) {
    match fd {
        Some(fd) => {
            if let Ok(mut g) = fd.readable().await {
                g.clear_ready();
            }
        }
        None => std::future::pending().await,
    }
}

impl<Q: Queue> Driver<Q> {
    /// Runs the pipeline until the core is told to stop.
    ///
    /// The driver comes back boxed: a future's output is moved through `Poll` on every poll of
    /// it, pending or not (the task's and each `await`'s), and the driver is kilobytes; a
    /// pointer costs nothing to move. Returned by value it was two copies of 2.6 KB for every
    /// turn the driver yielded (`perf probe` on `memmove` under `compare --cases rr1`).
    pub(crate) async fn run(self) -> Box<Self> {
        self.run_until(End::Stopped).await
    }

    /// Keeps the pipeline (and, by yielding, the core's tasks) running until nothing is left
    /// to finish (`Stack::settled`: the application holds no socket, every connection closed or
    /// in TIME-WAIT), for at most `linger`, or until the shutdown's grace ends; a stop ends it
    /// at once.
    pub(crate) async fn linger(self, linger: Duration) -> Box<Self> {
        let life = &self.core.shared.life;
        let until = life
            .drain_deadline()
            .unwrap_or_else(|| self.clock() + linger);
        self.run_until(End::Settled { until }).await
    }

    /// Whether the loop is over.
    fn ended(&self, end: End) -> bool {
        match end {
            End::Stopped => self.core.stopping(),
            End::Settled { until } => {
                let shared = &self.core.shared;
                self.clock() >= until || shared.life.stop.load(Ordering::Relaxed)
            }
        }
    }

    /// What an idle core sleeps on: the doorbell registered with the executor (the queue's
    /// descriptor is registered at the first sleep), or an error.
    fn waits(&self) -> std::io::Result<Waits> {
        let bell = Some(register(self.peers.bell().fd())?);
        Ok(Waits {
            queue_fd: self.pipe.dev.io().wake_fd(),
            queue: None,
            bell,
            frames_at_wake: 0,
        })
    }

    /// Frames received and sent so far.
    fn frames_moved(&self) -> u64 {
        let d = self.pipe.dev.stats();
        d.rx_frames + d.tx_frames
    }

    /// Registers the queue's descriptor for a sleep, if it is not. False (and busy polling
    /// from now on) when the executor refuses it.
    fn register_queue(&mut self, waits: &mut Waits) -> bool {
        let (None, Some(fd)) = (&waits.queue, waits.queue_fd) else {
            return true;
        };
        match register(fd) {
            Ok(q) => {
                waits.queue = Some(q);
                self.core.stats().queue_registrations += 1;
                true
            }
            Err(e) => {
                tracing::error!(
                    "core {}: cannot register its queue with the executor ({e}); busy polling",
                    self.core.index
                );
                self.mode = PollMode::Busy;
                false
            }
        }
    }

    async fn run_until(mut self, end: End) -> Box<Self> {
        let mut waits = match self.waits() {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(
                    "core {}: cannot register with the executor ({e}); busy polling",
                    self.core.index
                );
                self.mode = PollMode::Busy;
                Waits {
                    queue_fd: None,
                    queue: None,
                    bell: None,
                    frames_at_wake: 0,
                }
            }
        };
        let bell = self.peers.bell();
        let mut freed = Vec::new();
        let mut idle_since: Option<StdInstant> = None;
        // Start of the current stretch of work (since the last wake-up or the last idle turn).
        let mut busy_since: Option<StdInstant> = None;
        let mut spin_for = Duration::ZERO;
        // Moving average of the idle gaps: how long work took to come once the core went idle.
        let mut gap_ns = 0.0f64;
        let mut turns = 0u64;
        // One timer for every sleep, reset to each sleep's end. A new timer per sleep was
        // registered after the executor's last look at its timers had found none (the one
        // before was dropped when the core woke), so the executor took it for the earliest
        // and woke itself through its eventfd: a write and one more `epoll_wait` per sleep.
        let timer = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(timer);
        loop {
            if self.ended(end) {
                return Box::new(self);
            }
            turns += 1;
            if self.stamp.is_none() && turns.is_multiple_of(crate::lane::RX_WAIT_SAMPLE_EVERY) {
                self.want_stamp(Wait::Awake);
            }
            let busy = self.turn(&mut freed);
            self.release_ports(&mut freed);
            if let End::Settled { .. } = end {
                let shared = &self.core.shared;
                if self.core.stack().settled() && self.upgrade.all_settled(shared) {
                    return Box::new(self);
                }
            }
            if busy {
                // The clock is read only where a stretch of work begins (a busy core's turns
                // read it once each, in the turn).
                if let Some(idle) = idle_since.take() {
                    let now = self.clock();
                    // How long the core waited for this work (spinning or asleep).
                    gap_ns = 0.8 * gap_ns + 0.2 * (now - idle).as_nanos() as f64;
                    busy_since = Some(now);
                } else if busy_since.is_none() {
                    busy_since = Some(self.clock());
                }
                if waits.queue.is_some()
                    && self.frames_moved().saturating_sub(waits.frames_at_wake) >= UNREGISTER_AFTER
                {
                    waits.queue = None;
                    self.core.stats().queue_unregistrations += 1;
                }
                self.yield_to_tasks().await;
                continue;
            }
            let spin = match self.mode {
                PollMode::Busy => {
                    self.yield_to_tasks().await;
                    continue;
                }
                PollMode::Adaptive { spin } => self.wake.spin(spin),
            };
            let now = self.clock();
            let since = *idle_since.get_or_insert_with(|| {
                // Going idle. Spin through a gap the recent past says will be short (sleeping
                // and waking costs more CPU than a short spin, and adds latency); otherwise spin
                // no longer than the work just done took, so spinning never costs more than the
                // work it waits for, and sleep through the gap.
                let worked = busy_since.take().map_or(Duration::ZERO, |b| now - b);
                spin_for = if gap_ns < spin.as_nanos() as f64 / 2.0 {
                    spin
                } else {
                    worked.max(Duration::from_micros(2)).min(spin)
                };
                now
            });
            if now - since < spin_for {
                self.yield_to_tasks().await;
                continue;
            }
            // Sleep: on the queue, the doorbell, a task's output, or the next protocol timer.
            bell.arm();
            if self.peers.inbound_waiting()
                || self.pipe.dev.rx_waiting()
                || self.core.stack().egress_pending()
            {
                bell.disarm();
                continue;
            }
            if !self.register_queue(&mut waits) {
                bell.disarm();
                continue;
            }
            self.core.stats().parks += 1;
            let nap = self.nap(end);
            timer.as_mut().reset(tokio::time::Instant::now() + nap);
            let by_frame = tokio::select! {
                biased;
                _ = readable(&waits.queue) => true,
                _ = readable(&waits.bell) => false,
                _ = self.core.kick.notified() => false,
                _ = &mut timer => false,
            };
            bell.disarm();
            // The frame that woke the core tells how long waking up took. (Woken otherwise,
            // the next frame may come later, to a core awake: its wait says nothing of waking.)
            if by_frame {
                self.want_stamp(Wait::Woken);
            }
            // idle_since stays: the gap runs until the next turn that finds work.
            waits.frames_at_wake = self.frames_moved();
            busy_since = None;
            spin_for = Duration::ZERO;
        }
    }

    /// How long an idle core sleeps at most, on the host's clock: until the stack's next
    /// deadline or the shutdown's end, and shorter where something wakes nothing.
    fn nap(&self, end: End) -> Duration {
        let now = self.clock();
        let deadline = self.core.stack().sleep_deadline().map(|d| {
            let at = Duration::from_micros(d.total_micros().max(0) as u64);
            self.epoch + at
        });
        // A graceful shutdown's end is a deadline too.
        let drain = self.core.shared.life.drain_deadline();
        let deadline = match (deadline, drain) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // Idle cores still publish their statistics (and answer connection snapshots).
        let mut nap = if self.publish.is_some() {
            crate::publish::Publish::interval()
        } else {
            Duration::from_secs(3600)
        };
        if let Some(d) = deadline {
            nap = nap.min(d.saturating_duration_since(now));
        }
        let io = self.pipe.dev.io();
        if io.upgrade_phase() == Some(UpgradePhase::Handed) {
            // Two processes share the queue (an upgrade): the frames one gives back and the
            // completions it forwards wake nothing in the other, which must look often (the
            // new one fills the ring the old one receives on).
            nap = nap.min(crate::upgrade::SHARED_NAP);
        }
        if io.tx_in_flight() {
            // Frames in transmit: their completion wakes nothing here, and a driver that
            // stopped sending without asking for a wakeup is kicked only from a turn.
            nap = nap.min(TX_NUDGE_AFTER);
        }
        if let End::Settled { until } = end {
            // Settling is looked for between naps; the end is a deadline.
            nap = nap
                .min(LINGER_NAP)
                .min(until.saturating_duration_since(now));
        }
        nap
    }

    /// Lets the core's tasks run; one yield in [`TIMED_EVERY`] is timed (and counts for that
    /// many), as the pipeline's stages are. The time the tasks took is work measured, not
    /// the host's time: read from the wall, as the stages' is.
    async fn yield_to_tasks(&mut self) {
        self.yields += 1;
        if !self.yields.is_multiple_of(TIMED_EVERY) {
            return Requeue(false).await;
        }
        let t = StdInstant::now();
        Requeue(false).await;
        self.core.stats().tasks.record_weighted(t, TIMED_EVERY);
    }
}

/// Yields once: the driver wakes itself, which puts it at the back of the executor's run
/// queue, behind the tasks its turn woke. `tokio::task::yield_now` defers the task instead,
/// and the executor then looks at its I/O and timers (an `epoll_wait`) before every turn; as
/// a queued task, the executor looks every so many polls (its event interval), and when the
/// core sleeps.
struct Requeue(bool);

impl Future for Requeue {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
