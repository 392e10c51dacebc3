//! One core: its AF_XDP queue, device, protocol stack and the driver task that runs the
//! pipeline between the application's tasks.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant as StdInstant};

use corelane_stack::smoltcp::time::Instant;
use corelane_stack::{BatchTuner, DeviceStats, Proto as StackProto, Stack, StackStats, XdpDevice};
use corelane_xsk::FrameIo as _;
use corelane_xsk::{Proto, Steering, XskQueue};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use crate::handoff::{Consumer, Doorbell, Producer};
use crate::{PollMode, Shared};

/// Frames and time spent in one stage of the pipeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stage {
    /// Frames (or flows, for egress) the stage handled.
    pub items: u64,
    /// Nanoseconds spent in the stage.
    pub nanos: u64,
}

impl Stage {
    fn add(&mut self, items: usize, since: StdInstant) -> StdInstant {
        let now = StdInstant::now();
        self.items += items as u64;
        self.nanos += (now - since).as_nanos() as u64;
        now
    }

    /// Nanoseconds per item (0 when none).
    pub fn ns_per_item(&self) -> f64 {
        if self.items == 0 {
            0.0
        } else {
            self.nanos as f64 / self.items as f64
        }
    }
}

/// Counters of one core's pipeline: per stage, frames (or flows) and time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreStats {
    /// Core index (0-based, in the runtime's order).
    pub core: usize,
    /// CPU the core's thread is pinned to.
    pub cpu: usize,
    /// Interface queue the core serves.
    pub queue: u32,
    /// Passes of the pipeline.
    pub turns: u64,
    /// Passes that found work.
    pub busy_turns: u64,
    /// Times the core went to sleep (adaptive poll mode).
    pub parks: u64,
    /// RX stage: frames taken from the RX ring.
    pub rx: Stage,
    /// Classify stage: frames parsed and checksum-verified.
    pub classify: Stage,
    /// Handoff in: frames taken from other cores' rings.
    pub handoff_in: Stage,
    /// Flow demux and protocol (ingress) stage: frames processed.
    pub protocol: Stage,
    /// Egress stage: flows polled for output.
    pub egress: Stage,
    /// TX, recycle and refill stage: frames sent.
    pub tx: Stage,
    /// Application tasks: time between the driver yielding and running again.
    pub tasks: Stage,
    /// Accept polls that found nothing after being woken (should stay 0: wake-one).
    pub accept_spurious: u64,
    /// CPU the application's tasks run on (the same as `cpu` for a same-core lane).
    pub app_cpu: usize,
    /// CPU time of the protocol thread (and of the application, on a same-core lane), measured
    /// when the core ends.
    pub cpu_time: Duration,
    /// CPU time of the application thread of a split lane (zero on a same-core lane).
    pub app_cpu_time: Duration,
    /// Model-T batching: the batch size now, where it settled, and the fill ring's occupancy.
    pub batch: BatchStats,
    /// Device counters.
    pub device: DeviceStats,
    /// Protocol counters.
    pub stack: StackStats,
}

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
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Core>>> = const { RefCell::new(None) };
}

pub(crate) fn set_current(core: Option<Arc<Core>>) {
    CURRENT.with(|c| *c.borrow_mut() = core);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// CPU time the calling thread has used.
pub(crate) fn thread_cpu_time() -> Duration {
    // SAFETY: timespec is plain data; all-zero is a valid value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is valid for writes; the clock id is a constant the kernel knows.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The core the calling task runs on.
pub(crate) fn current() -> io::Result<Arc<Core>> {
    CURRENT.with(|c| c.borrow().clone()).ok_or_else(|| {
        io::Error::other("not on a corelane core: call this from a task inside Runtime::run")
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
        self.stopping.load(Ordering::Relaxed) || self.shared.stop.load(Ordering::Relaxed)
    }

    /// Queues flow output and makes sure the driver runs soon.
    pub(crate) fn wake_driver(&self) {
        self.kick.notify_one();
    }

    pub(crate) fn steering(&self) -> MutexGuard<'_, Steering> {
        lock(&self.shared.steering)
    }

    pub(crate) fn own_port(&self, proto: Proto, port: u16) -> io::Result<()> {
        self.steering()
            .own_port(proto, port)
            .map_err(io::Error::from)
    }

    pub(crate) fn release_port(&self, proto: Proto, port: u16) {
        if let Err(e) = self.steering().release_port(proto, port) {
            log::warn!("core {}: releasing {proto:?} port {port}: {e}", self.index);
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

struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// The per-core pipeline, run as a task on the core's executor.
pub(crate) struct Driver {
    pub(crate) core: Arc<Core>,
    pub(crate) dev: XdpDevice<XskQueue>,
    pub(crate) inbound: Vec<Consumer>,
    /// Indexed by destination core; None for this core.
    pub(crate) outbound: Vec<Option<Producer>>,
    pub(crate) bells: Vec<Arc<Doorbell>>,
    pub(crate) mode: PollMode,
    pub(crate) epoch: StdInstant,
    /// Model-T: adapts the batch size and fill ring occupancy (None: fixed batch).
    pub(crate) tuner: Option<BatchTuner>,
}

impl Driver {
    fn now(&self) -> Instant {
        Instant::from_micros(self.epoch.elapsed().as_micros() as i64)
    }

    /// One pass: RX batch, classify, handoff in, demux + protocol, egress, TX with one kick,
    /// recycle, refill. Returns true when anything moved.
    fn turn(&mut self, rung: &mut [bool], freed: &mut Vec<(StackProto, u16)>) -> bool {
        let core = self.core.clone();
        let now = self.now();
        let dev = &mut self.dev;
        let mut stack = core.stack();
        let mut st = core.stats();
        st.turns += 1;
        let sent_before = dev.stats().tx_frames;
        if let Some(tu) = &self.tuner {
            dev.set_batch(tu.batch());
        }
        let t = StdInstant::now();
        let turn_start = t;
        let pulled = dev.recv_batch();
        let t = st.rx.add(pulled, t);
        dev.classify_batch();
        let t = st.classify.add(pulled, t);
        let mut injected = 0;
        for c in &mut self.inbound {
            while injected < 256
                && c.pop(|hops, bytes| {
                    dev.inject(bytes, hops);
                })
            {
                injected += 1;
            }
        }
        let t = st.handoff_in.add(injected, t);
        let outbound = &mut self.outbound;
        let consumed = stack.ingress(now, dev, &mut |to, hops, bytes| {
            let ok = outbound
                .get_mut(to)
                .and_then(Option::as_mut)
                .is_some_and(|p| p.push(hops, bytes));
            if ok {
                rung[to] = true;
            }
            ok
        });
        let t = st.protocol.add(consumed, t);
        let polled = stack.egress(now, dev);
        let t = st.egress.add(polled, t);
        if let Err(e) = dev.flush() {
            log::warn!("core {}: transmit: {e}", core.index);
        }
        // Frames written by the protocol and egress stages this pass, sent by this flush.
        let sent = dev.stats().tx_frames - sent_before;
        st.tx.add(sent as usize, t);
        for (to, r) in rung.iter_mut().enumerate() {
            if std::mem::take(r) {
                self.bells[to].ring();
            }
        }
        if let Some(tu) = self.tuner.as_mut() {
            tu.observe(
                pulled + injected,
                sent as usize,
                turn_start.elapsed().as_nanos() as u64,
            );
            // The kernel's drop counters cost a system call: read them now and then.
            if st.turns.is_multiple_of(4096) {
                tu.observe_drops(dev.io_mut().rx_drops());
                st.batch.fill_target = dev.io_mut().set_fill_target(tu.fill_target());
            }
            st.batch.current = tu.batch();
            st.batch.settled = tu.settled();
            st.batch.changes = tu.changes();
        }
        stack.take_freed_ports(freed);
        st.device = dev.stats();
        let busy = pulled + injected + consumed + polled > 0;
        st.busy_turns += u64::from(busy);
        busy
    }

    fn inbound_waiting(&self) -> bool {
        self.inbound.iter().any(|c| !c.is_empty())
    }

    /// Runs the pipeline until the core is told to stop.
    pub(crate) async fn run(mut self) -> Self {
        let readable = tokio::io::Interest::READABLE;
        // SAFETY: the AF_XDP socket is owned by the core's device, which outlives this function
        // (the AsyncFd is dropped when it returns), and it is never replaced.
        let xsk = unsafe { AsyncFd::register_with_interest(Fd(self.dev.io().fd()), readable) }
            .map_err(|e| e.into_parts().1);
        let bell = &self.bells[self.core.index].clone();
        // SAFETY: the eventfd is owned by `bell`, an Arc held across this function.
        let bell_fd = unsafe { AsyncFd::register_with_interest(Fd(bell.fd()), readable) }
            .map_err(|e| e.into_parts().1);
        let (xsk, bell_fd) = match (xsk, bell_fd) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                log::error!(
                    "core {}: cannot register with the executor ({e}); busy polling",
                    self.core.index
                );
                self.mode = PollMode::Busy;
                return self.run_busy().await;
            }
        };
        let mut rung = vec![false; self.bells.len()];
        let mut freed = Vec::new();
        let mut idle_since: Option<StdInstant> = None;
        // Start of the current stretch of work (since the last wake-up or the last idle turn).
        let mut busy_since: Option<StdInstant> = None;
        let mut spin_for = Duration::ZERO;
        // Moving average of the idle gaps: how long work took to come once the core went idle.
        let mut gap_ns = 0.0f64;
        loop {
            if self.core.stopping() {
                return self;
            }
            if self.turn(&mut rung, &mut freed) {
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
            if self.inbound_waiting() || self.core.stack().egress_pending() {
                bell.disarm();
                continue;
            }
            self.core.stats().parks += 1;
            let deadline = self.core.stack().next_deadline().map(|d| {
                let at = Duration::from_micros(d.total_micros().max(0) as u64);
                tokio::time::Instant::from_std(self.epoch + at)
            });
            let far = tokio::time::Instant::now() + Duration::from_secs(3600);
            tokio::select! {
                biased;
                r = xsk.readable() => if let Ok(mut g) = r { g.clear_ready() },
                r = bell_fd.readable() => if let Ok(mut g) = r { g.clear_ready() },
                _ = self.core.kick.notified() => {},
                _ = tokio::time::sleep_until(deadline.unwrap_or(far)) => {},
            }
            bell.disarm();
            // idle_since stays: the gap runs until the next turn that finds work.
            busy_since = None;
            spin_for = Duration::ZERO;
        }
    }

    async fn run_busy(mut self) -> Self {
        let mut rung = vec![false; self.bells.len()];
        let mut freed = Vec::new();
        while !self.core.stopping() {
            self.turn(&mut rung, &mut freed);
            self.release_ports(&mut freed);
            self.yield_to_tasks().await;
        }
        self
    }

    fn release_ports(&self, freed: &mut Vec<(StackProto, u16)>) {
        for (p, port) in freed.drain(..) {
            let proto = match p {
                StackProto::Tcp => Proto::Tcp,
                StackProto::Udp => Proto::Udp,
            };
            self.core.release_port(proto, port);
        }
    }

    async fn yield_to_tasks(&self) {
        let t = StdInstant::now();
        tokio::task::yield_now().await;
        self.core.stats().tasks.add(1, t);
    }

    /// Keeps the pipeline running for at most `linger` so that connections the application
    /// closed can finish (FIN and its ACK), then stops.
    pub(crate) async fn linger(mut self, linger: Duration) -> Self {
        let until = StdInstant::now() + linger;
        let mut rung = vec![false; self.bells.len()];
        let mut freed = Vec::new();
        while StdInstant::now() < until && !self.core.shared.stop.load(Ordering::Relaxed) {
            self.turn(&mut rung, &mut freed);
            self.release_ports(&mut freed);
            if self.core.stack().stats().flows == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        self
    }
}
