//! corelane's per-core runtime.
//!
//! One thread per core, pinned, each owning one interface queue: its AF_XDP socket and UMEM, its
//! protocol stack (flow table, sockets, timers) and a single-threaded tokio executor (a
//! current_thread runtime with a `LocalSet`), so `tokio::time`, `tokio::sync` and `spawn_local`
//! work and tasks need not be `Send`. Nothing is shared between cores on the per-frame path;
//! frames that reach the wrong core are copied over a ring for that core ([`handoff`]).
//!
//! The pipeline runs as a task of the executor (the driver): RX batch, classify, handoff in,
//! flow demux and protocol, egress, TX batch with one kick, recycle, refill; then it yields so the
//! tasks whose sockets changed (and only those: smoltcp wakes the socket's own waker) run. In
//! [`PollMode::Adaptive`] an idle core spins for a bounded time, then sleeps on the AF_XDP
//! socket, its doorbell, its tasks' output and its next protocol timer.
//!
//! ```no_run
//! use corelane_rt::{Runtime, net::TcpListener};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! let rt = Runtime::builder("veth0").addr("10.0.0.1/24".parse().expect("an address")).build()?;
//! rt.run(|_core| async move {
//!     let listener = TcpListener::bind(7).expect("port 7");
//!     loop {
//!         let (mut s, _) = listener.accept().await.expect("accept");
//!         tokio::task::spawn_local(async move {
//!             let mut buf = vec![0; 4096];
//!             while let Ok(n @ 1..) = s.read(&mut buf).await {
//!                 if s.write_all(&buf[..n]).await.is_err() { break }
//!             }
//!         });
//!     }
//! })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod core;
pub mod handoff;
pub mod net;

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant as StdInstant};

pub use crate::core::{BatchStats, CoreStats, Stage};
use corelane_stack::smoltcp::wire::IpCidr;
use corelane_stack::{BatchTuner, Stack, StackConfig, StackError, TuneConfig, XdpDevice};
pub use corelane_topo::{Lane, Machine, Placement, Plan, Sharing};
use corelane_xsk::FrameIo as _;
use corelane_xsk::{
    AttachMode, AttachedMode, BindMode, Channels, FrameCounts, Steering, XdpCounters, XskConfig,
    XskQueue,
};

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From the AF_XDP layer: privileges, interface, XDP mode, socket binding.
    #[error(transparent)]
    Xsk(#[from] corelane_xsk::Error),
    /// From the protocol stage.
    #[error(transparent)]
    Stack(#[from] StackError),
    /// Bad configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The machine could not be read, or the placement does not fit it.
    #[error(transparent)]
    Topology(#[from] corelane_topo::Error),
    /// A core failed to start.
    #[error("core {core} (CPU {cpu}, queue {queue}): {source}")]
    Core {
        /// Core index.
        core: usize,
        /// CPU.
        cpu: usize,
        /// Queue.
        queue: u32,
        /// What failed.
        source: Box<Error>,
    },
    /// The application's task on a core panicked; the core was shut down cleanly.
    #[error("the task on core {core} panicked: {message}")]
    Panicked {
        /// Core index.
        core: usize,
        /// The panic message.
        message: String,
    },
    /// I/O.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        match e {
            Error::Xsk(x) => x.into(),
            Error::Io(io) => io,
            Error::Stack(s) => s.into(),
            other => io::Error::other(other),
        }
    }
}

/// How an idle core waits for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// Never sleep: lowest latency, one CPU fully used per core.
    Busy,
    /// Once idle, spin as long as the stretch of work just done took (at least 2 µs, at most
    /// `spin`), then sleep until a frame, a handoff, a task's output or the next protocol timer.
    /// Spinning thus never costs more CPU than the work it waits for: under steady load the next
    /// frame arrives within the spin, at light load the core sleeps through the gaps.
    Adaptive {
        /// The longest spin once idle.
        spin: Duration,
    },
}

impl Default for PollMode {
    fn default() -> Self {
        PollMode::Adaptive {
            spin: Duration::from_micros(50),
        }
    }
}

/// State every core can reach: the steering program (for port ownership changes, never per
/// frame), the stop flag and the doorbells.
pub(crate) struct Shared {
    pub(crate) steering: Mutex<Steering>,
    pub(crate) stop: AtomicBool,
    pub(crate) bells: Vec<Arc<handoff::Doorbell>>,
}

impl Shared {
    fn stop_all(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for b in &self.bells {
            b.ring_always();
        }
    }
}

static CTRL_C: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());
static CTRL_C_INSTALLED: std::sync::Once = std::sync::Once::new();

fn stop_on_ctrl_c(shared: &Arc<Shared>) {
    CTRL_C
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Arc::downgrade(shared));
    CTRL_C_INSTALLED.call_once(|| {
        let r = ctrlc::set_handler(|| {
            for s in CTRL_C.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                if let Some(s) = s.upgrade() {
                    s.stop_all();
                }
            }
        });
        if let Err(e) = r {
            log::warn!("Ctrl-C will not stop the runtime: {e} (use StopHandle instead)");
        }
    });
}

/// How to build a [`Runtime`].
#[derive(Debug, Clone)]
pub struct Builder {
    ifname: String,
    addrs: Vec<IpCidr>,
    placement: Placement,
    lanes: Option<usize>,
    queues: Option<Vec<u32>>,
    attach: AttachMode,
    xsk: XskConfig,
    stack: StackConfig,
    poll: PollMode,
    handoff_slots: usize,
    linger: Duration,
    adaptive_batch: bool,
}

/// Bytes in flight for `bits_per_sec` over a round trip of `rtt`: the socket buffer size that
/// lets one connection fill the path.
pub fn bandwidth_delay_product(bits_per_sec: u64, rtt: Duration) -> usize {
    ((bits_per_sec as u128 * rtt.as_nanos()) / 8 / 1_000_000_000) as usize
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size into it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; `set` is valid for writes of its size.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return vec![0];
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below CPU_SETSIZE and `set` is initialised.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

impl Builder {
    /// An address (with prefix) the runtime owns. May repeat (IPv4 and IPv6, up to 4). Use an
    /// address the kernel does not also hold on this interface: frames for it, and ARP or NDP
    /// for it, go to corelane only.
    pub fn addr(mut self, cidr: IpCidr) -> Self {
        self.addrs.push(cidr);
        self
    }

    /// CPUs to run on, one core (thread, queue) each, protocol and application together: the
    /// same as `placement(Placement::Explicit { protocol: cpus, application: vec![] })`.
    pub fn cpus(mut self, cpus: Vec<usize>) -> Self {
        self.placement = Placement::Explicit {
            protocol: cpus,
            application: Vec::new(),
        };
        self
    }

    /// Where the protocol and the application run (default [`Placement::SameCore`]); the plan
    /// is made from the machine hwloc reads, NIC-local CPUs first. [`Runtime::plan`] shows it.
    pub fn placement(mut self, p: Placement) -> Self {
        self.placement = p;
        self
    }

    /// How many cores (lanes: one queue, one protocol thread each) to run (default: one per
    /// physical core the process may use, up to the interface's receive queues). When the
    /// interface has fewer queues and its driver allows more, they are raised (ethtool -L)
    /// for the run.
    pub fn cores(mut self, n: usize) -> Self {
        self.lanes = Some(n);
        self
    }

    /// The receive queues the cores serve, in core order (default: 0, 1, ...).
    pub fn queues(mut self, q: Vec<u32>) -> Self {
        self.queues = Some(q);
        self
    }

    /// XDP attach mode (default: native, falling back to generic).
    pub fn attach_mode(mut self, m: AttachMode) -> Self {
        self.attach = m;
        self
    }

    /// UMEM and ring sizes, and the zero-copy preference.
    pub fn xsk(mut self, c: XskConfig) -> Self {
        self.xsk = c;
        self
    }

    /// Protocol settings: socket buffers, backlog, batch size, flow table size.
    pub fn stack(mut self, c: StackConfig) -> Self {
        self.stack = c;
        self
    }

    /// Sizes TCP socket buffers from a bandwidth-delay product (window scaling follows).
    pub fn bdp(mut self, bits_per_sec: u64, rtt: Duration) -> Self {
        let b = bandwidth_delay_product(bits_per_sec, rtt).clamp(4096, 64 << 20);
        self.stack.tcp_rx_buffer = b;
        self.stack.tcp_tx_buffer = b;
        self
    }

    /// Default TCP listen backlog.
    pub fn backlog(mut self, n: usize) -> Self {
        self.stack.backlog = n;
        self
    }

    /// How idle cores wait (default: adaptive, 50 µs spin).
    pub fn poll_mode(mut self, m: PollMode) -> Self {
        self.poll = m;
        self
    }

    /// Model-T batching (on by default): the batch size and the fill ring's occupancy adapt
    /// turn by turn to the load, keeping a batch's working set within the core's L2 (see
    /// [`corelane_stack::BatchTuner`]); `StackConfig::batch` is then the largest batch. Off:
    /// every turn uses `StackConfig::batch`.
    pub fn adaptive_batch(mut self, on: bool) -> Self {
        self.adaptive_batch = on;
        self
    }

    /// Frames each cross-core ring holds (default 1024).
    pub fn handoff_slots(mut self, n: usize) -> Self {
        self.handoff_slots = n;
        self
    }

    /// How long a core keeps running after its task ends, so closed connections can finish
    /// (default 200 ms). Stopping with Ctrl-C or a [`StopHandle`] resets them instead.
    pub fn linger(mut self, d: Duration) -> Self {
        self.linger = d;
        self
    }

    /// The placement plan [`Builder::build`] would follow, from the machine hwloc reads and the
    /// interface's queues, without attaching anything or changing the interface (needs no
    /// privileges). Prints as an explanation.
    pub fn plan(&self) -> Result<Plan, Error> {
        let (mut plan, channels) = self.make_plan()?;
        let nqueues = channels.map_or(1, |c| c.rx_queues());
        let need = queues_needed(&plan);
        if need > nqueues {
            let max = channels.map_or(1, |c| c.max_rx_queues());
            plan.reasons.push(if max >= need {
                format!(
                    "{} has {nqueues} receive queue(s): build() raises them to {need} for the run",
                    self.ifname
                )
            } else {
                format!(
                    "{} has {nqueues} receive queue(s) and allows at most {max}: build() refuses \
                     {} core(s)",
                    self.ifname,
                    plan.lanes.len()
                )
            });
        }
        Ok(plan)
    }

    fn make_plan(&self) -> Result<(Plan, Option<Channels>), Error> {
        corelane_xsk::check_interface(&self.ifname)?;
        let channels = corelane_xsk::channels(&self.ifname)?;
        let nqueues = channels.map_or(1, |c| c.rx_queues());
        let machine = Machine::this()?;
        let driver = corelane_xsk::driver_info(&self.ifname).unwrap_or_default();
        let lanes = self.queues.as_ref().map(Vec::len).or(self.lanes);
        if lanes == Some(0) {
            return Err(Error::Config("no core to run on".into()));
        }
        let mut plan = corelane_topo::plan(
            &machine,
            &self.placement,
            &corelane_topo::Request {
                lanes,
                max_lanes: Some(nqueues as usize),
                allowed: allowed_cpus(),
                nic: machine.nic(&self.ifname, Some(&driver.bus_info)),
            },
        )?;
        if let Some(q) = &self.queues {
            for (lane, q) in plan.lanes.iter_mut().zip(q) {
                lane.queue = *q;
            }
        }
        Ok((plan, channels))
    }

    /// Checks the configuration, attaches the XDP program and owns the addresses. The AF_XDP
    /// sockets are opened by each core when [`Runtime::run`] starts it.
    pub fn build(self) -> Result<Runtime, Error> {
        if self.addrs.is_empty() {
            return Err(Error::Config(
                "no address: give the runtime at least one address it owns (e.g. 10.0.0.1/24)"
                    .into(),
            ));
        }
        if self.addrs.len() > 4 {
            return Err(Error::Config("at most 4 addresses".into()));
        }
        corelane_xsk::check_privileges()?;
        let (mut plan, channels) = self.make_plan()?;
        let nqueues = channels.map_or(1, |c| c.rx_queues());
        let need = queues_needed(&plan);
        let mut restore = None;
        if need > nqueues {
            let cores = plan.lanes.len();
            let raised = channels
                .filter(|c| c.max_rx_queues() >= need)
                .map(|c| raise_queues(&self.ifname, c, need));
            match raised {
                Some(Ok(old)) => {
                    plan.reasons.push(format!(
                        "{} had {nqueues} receive queue(s): raised to {need} for this run \
                         (ethtool -L), restored at the end",
                        self.ifname
                    ));
                    restore = Some(old);
                }
                other => {
                    let why = match other {
                        Some(Err(e)) => format!("setting its queues failed: {e}"),
                        _ => format!(
                            "its driver allows at most {}",
                            channels.map_or(1, |c| c.max_rx_queues())
                        ),
                    };
                    return Err(Error::Config(format!(
                        "{} has {nqueues} receive queue(s), too few for {cores} core(s) (queue {} \
                         does not exist) and {why}; run fewer cores or give it more queues \
                         (ethtool -L {} combined {need}, or a veth made with \
                         numrxqueues/numtxqueues)",
                        self.ifname,
                        need - 1,
                        self.ifname,
                    )));
                }
            }
        }
        let nqueues = nqueues.max(need);
        if (nqueues as usize) > plan.lanes.len() {
            log::warn!(
                "{} has {nqueues} receive queues and {} are served: frames on the others go to the kernel",
                self.ifname,
                plan.lanes.len()
            );
        }
        let restore = RestoreQueues {
            ifname: self.ifname.clone(),
            old: restore,
        };
        let mac = corelane_xsk::mac_address(&self.ifname)?;
        let mtu = corelane_xsk::mtu(&self.ifname)? as usize;
        // Attach first: a driver that refuses the program (in native mode, say) explains more
        // than the frame size does.
        let mut steering = Steering::attach(&self.ifname, self.attach)?;
        let capacity = (self.xsk.frame_size as usize).saturating_sub(256);
        if mtu + 14 > capacity {
            let most = handoff::SLOT_BYTES - 14;
            let fix = if mtu <= most {
                "use 4096-byte frames (XskConfig::frame_size)".to_string()
            } else {
                format!(
                    "lower the MTU to at most {most} (frames larger than a page are not supported)"
                )
            };
            return Err(Error::Config(format!(
                "MTU {mtu} of {} does not fit a {}-byte frame; {fix}",
                self.ifname, self.xsk.frame_size
            )));
        }
        for a in &self.addrs {
            steering.own_addr(a.address().into())?;
        }
        let bells = plan
            .lanes
            .iter()
            .map(|_| handoff::Doorbell::new())
            .collect::<io::Result<Vec<_>>>()?;
        let shared = Arc::new(Shared {
            steering: Mutex::new(steering),
            stop: AtomicBool::new(false),
            bells,
        });
        Ok(Runtime {
            shared,
            cfg: self,
            plan,
            nqueues,
            mac,
            mtu,
            _restore: restore,
        })
    }
}

/// Receive queues the interface must have for the plan: one past the highest lane queue.
fn queues_needed(plan: &Plan) -> u32 {
    plan.lanes.iter().map(|l| l.queue + 1).max().unwrap_or(1)
}

/// Sets an interface's receive queues to `need` and returns what they were.
fn raise_queues(ifname: &str, old: Channels, need: u32) -> Result<Channels, corelane_xsk::Error> {
    let want = if old.max_combined > 0 && old.max_rx == 0 {
        Channels {
            combined: need,
            ..old
        }
    } else {
        Channels {
            rx: need.saturating_sub(old.combined),
            tx: old
                .tx
                .max(need.saturating_sub(old.combined))
                .min(old.max_tx),
            ..old
        }
    };
    corelane_xsk::set_channels(ifname, want)?;
    log::info!("{ifname}: receive queues raised to {need} for this run");
    Ok(old)
}

/// Puts an interface's queues back as they were when the runtime ends.
struct RestoreQueues {
    ifname: String,
    old: Option<Channels>,
}

impl Drop for RestoreQueues {
    fn drop(&mut self) {
        let Some(old) = self.old.take() else { return };
        // The driver refuses fewer queues while the XDP program is attached; its link can
        // outlive our close for a moment (a child process forked by another thread holds the
        // descriptor until it execs), so a refusal is retried for up to a second.
        let mut last = None;
        for _ in 0..100 {
            match corelane_xsk::set_channels(&self.ifname, old) {
                Ok(()) => return,
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if let Some(e) = last {
            log::warn!("{}: restoring its queues failed: {e}", self.ifname);
        }
    }
}

/// Stops a running [`Runtime`] from any thread: every core resets its connections and ends.
#[derive(Clone)]
pub struct StopHandle(Arc<Shared>);

impl std::fmt::Debug for StopHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopHandle").finish_non_exhaustive()
    }
}

impl StopHandle {
    /// Asks every core to stop.
    pub fn stop(&self) {
        self.0.stop_all();
    }
}

/// What a core reported when it ended.
#[derive(Debug, Clone)]
pub struct CoreReport {
    /// Its counters.
    pub stats: CoreStats,
    /// Where every frame of its UMEM was after shutdown (all free or with the kernel).
    pub frames: FrameCounts,
    /// AF_XDP bind mode.
    pub bind_mode: BindMode,
}

/// What [`Runtime::run`] returns.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// One per core.
    pub cores: Vec<CoreReport>,
    /// The XDP program's counters at the end.
    pub xdp: XdpCounters,
    /// True when the run ended by Ctrl-C or a [`StopHandle`].
    pub stopped: bool,
}

impl RunReport {
    /// True when on every core every frame is back (none lost, none held).
    pub fn frames_balanced(&self) -> bool {
        self.cores
            .iter()
            .all(|c| c.frames.in_use == 0 && c.frames.sum() == c.frames.total)
    }

    /// Frame accounting summed over the cores.
    pub fn frames(&self) -> FrameCounts {
        let mut t = FrameCounts::default();
        for c in &self.cores {
            t += c.frames;
        }
        t
    }

    /// Device counters summed over the cores.
    pub fn device(&self) -> corelane_stack::DeviceStats {
        let mut t = corelane_stack::DeviceStats::default();
        for c in &self.cores {
            t += c.stats.device;
        }
        t
    }
}

/// The runtime: an interface, the XDP program and the cores that will serve it.
pub struct Runtime {
    shared: Arc<Shared>,
    cfg: Builder,
    plan: Plan,
    nqueues: u32,
    mac: [u8; 6],
    mtu: usize,
    // Dropped after `shared` (and with it the XDP program).
    _restore: RestoreQueues,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("ifname", &self.cfg.ifname)
            .field("lanes", &self.plan.lanes)
            .finish_non_exhaustive()
    }
}

/// Handed to the closure of [`Runtime::run`] on each core.
#[derive(Debug, Clone, Copy)]
pub struct CoreInfo {
    /// Core index, 0-based.
    pub index: usize,
    /// How many cores run.
    pub cores: usize,
    /// The CPU its protocol thread is pinned to.
    pub cpu: usize,
    /// The CPU its application tasks run on (the same as `cpu` unless the placement splits).
    pub app_cpu: usize,
    /// The queue it serves.
    pub queue: u32,
    /// Whether its AF_XDP socket copies frames or shares the NIC's buffers.
    pub bind_mode: BindMode,
}

impl Runtime {
    /// Starts building a runtime on interface `ifname`.
    pub fn builder(ifname: &str) -> Builder {
        Builder {
            ifname: ifname.to_string(),
            addrs: Vec::new(),
            placement: Placement::SameCore,
            lanes: None,
            queues: None,
            attach: AttachMode::Auto,
            xsk: XskConfig::default(),
            stack: StackConfig::default(),
            poll: PollMode::default(),
            handoff_slots: 1024,
            linger: Duration::from_millis(200),
            adaptive_batch: true,
        }
    }

    /// A handle that stops the runtime from any thread.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.shared.clone())
    }

    /// How many cores (lanes) will run.
    pub fn cores(&self) -> usize {
        self.plan.lanes.len()
    }

    /// The placement plan: which CPU runs the protocol and the application of each queue,
    /// what they share, how far the NIC is, and why. Prints as an explanation.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// One line per fact: interface, XDP mode (and why, after a fallback), queues and cores,
    /// addresses, buffers and poll mode.
    pub fn describe(&self) -> String {
        let st = self
            .shared
            .steering
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut s = format!(
            "interface {}: XDP program attached in {} mode",
            self.cfg.ifname,
            st.mode()
        );
        if let Some(why) = st.fallback_reason() {
            s.push_str(&format!(" (native mode refused: {why})"));
        }
        s.push_str(&format!(
            "\nqueues: {} on the interface; {} core(s), one pinned thread and AF_XDP socket each",
            self.nqueues,
            self.plan.lanes.len(),
        ));
        s.push('\n');
        s.push_str(self.plan.to_string().trim_end());
        if st.mode() == AttachedMode::Generic && self.nqueues > 1 {
            s.push_str("\nnote: generic XDP on veth delivers every frame on queue 0");
        }
        let addrs: Vec<String> = self.cfg.addrs.iter().map(|a| a.to_string()).collect();
        s.push_str(&format!("\naddresses: {}", addrs.join(", ")));
        s.push_str(&format!(
            "\nTCP buffers {} KiB each way, backlog {}, batch {}, poll mode {:?}",
            self.cfg.stack.tcp_rx_buffer / 1024,
            self.cfg.stack.backlog,
            self.cfg.stack.batch,
            self.cfg.poll
        ));
        s
    }

    /// Runs `f` on every core (each call gets its [`CoreInfo`]) and returns when all of them end,
    /// or on Ctrl-C, SIGTERM or a [`StopHandle`]. Each core first opens its AF_XDP socket;
    /// if any core fails to start, none runs and the error names the core. On a lane whose
    /// placement splits protocol and application, `f` runs on a second thread pinned to the
    /// application CPU.
    pub fn run<F, Fut>(self, f: F) -> Result<RunReport, Error>
    where
        F: Fn(CoreInfo) -> Fut + Send + Sync,
        Fut: Future<Output = ()> + 'static,
    {
        stop_on_ctrl_c(&self.shared);
        let n = self.plan.lanes.len();
        // rings[from][to]
        let mut producers: Vec<Vec<Option<handoff::Producer>>> =
            (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        let mut consumers: Vec<Vec<handoff::Consumer>> = (0..n).map(|_| Vec::new()).collect();
        for (from, row) in producers.iter_mut().enumerate() {
            for (to, slot) in row.iter_mut().enumerate().filter(|(t, _)| *t != from) {
                let (p, c) = handoff::channel(self.cfg.handoff_slots);
                *slot = Some(p);
                consumers[to].push(c);
            }
        }
        let started = std::sync::Barrier::new(n + 1);
        let failed = AtomicBool::new(false);
        let epoch = StdInstant::now();
        let results: Vec<Result<CoreReport, Error>> = std::thread::scope(|scope| {
            let mut handles = Vec::new();
            for (i, (out, inb)) in producers.into_iter().zip(consumers).enumerate() {
                let lane = &self.plan.lanes[i];
                let info = CoreInfo {
                    index: i,
                    cores: n,
                    cpu: lane.protocol_cpu,
                    app_cpu: lane.app_cpu,
                    queue: lane.queue,
                    bind_mode: BindMode::Copy,
                };
                let this = &self;
                let (f, started, failed) = (&f, &started, &failed);
                let (app_tx, app) = if lane.split() {
                    let (tx, rx) = std::sync::mpsc::channel();
                    let h = std::thread::Builder::new()
                        .name(format!("corelane-{i}-app"))
                        .spawn_scoped(scope, move || app_main(info.app_cpu, rx, f))
                        .expect("spawning an application thread");
                    (Some(tx), Some(h))
                } else {
                    (None, None)
                };
                let h = std::thread::Builder::new()
                    .name(format!("corelane-{i}"))
                    .spawn_scoped(scope, move || {
                        this.core_main(info, out, inb, epoch, started, failed, f, app_tx)
                            .map_err(|e| match e {
                                e @ Error::Panicked { .. } => e,
                                e => Error::Core {
                                    core: i,
                                    cpu: info.cpu,
                                    queue: info.queue,
                                    source: Box::new(e),
                                },
                            })
                    })
                    .expect("spawning a core thread");
                handles.push((h, app));
            }
            started.wait();
            handles
                .into_iter()
                .enumerate()
                .map(|(i, (h, app))| {
                    let r = h
                        .join()
                        .unwrap_or_else(|_| Err(Error::Config("a core panicked".into())));
                    let Some(app) = app else { return r };
                    let end = app.join().unwrap_or_else(|_| AppEnd {
                        panicked: Some("the application thread panicked".into()),
                        cpu_time: Duration::ZERO,
                    });
                    match (r, end.panicked) {
                        (Err(e), _) => Err(e),
                        (Ok(_), Some(message)) => Err(Error::Panicked { core: i, message }),
                        (Ok(mut c), None) => {
                            c.stats.app_cpu_time = end.cpu_time;
                            Ok(c)
                        }
                    }
                })
                .collect()
        });
        let mut cores = Vec::with_capacity(n);
        let mut first_err = None;
        for r in results {
            match r {
                Ok(c) => cores.push(c),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let st = self
            .shared
            .steering
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        Ok(RunReport {
            cores,
            xdp: st.counters().unwrap_or_default(),
            stopped: self.shared.stop.load(Ordering::SeqCst),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn core_main<F, Fut>(
        &self,
        info: CoreInfo,
        outbound: Vec<Option<handoff::Producer>>,
        inbound: Vec<handoff::Consumer>,
        epoch: StdInstant,
        started: &std::sync::Barrier,
        failed: &AtomicBool,
        f: &F,
        app: Option<std::sync::mpsc::Sender<(Arc<core::Core>, CoreInfo)>>,
    ) -> Result<CoreReport, Error>
    where
        F: Fn(CoreInfo) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        let setup = self.setup_core(info);
        if setup.is_err() {
            failed.store(true, Ordering::SeqCst);
        }
        started.wait();
        let (core, mut dev, exec) = setup?;
        let bind_mode = dev.io().mode();
        let info = CoreInfo { bind_mode, ..info };
        let now = || {
            corelane_stack::smoltcp::time::Instant::from_micros(epoch.elapsed().as_micros() as i64)
        };
        let report = |core: &core::Core, frames| {
            let mut stats = core.snapshot();
            stats.cpu_time = core::thread_cpu_time();
            CoreReport {
                stats,
                frames,
                bind_mode,
            }
        };
        if failed.load(Ordering::SeqCst) {
            // Another core failed: end without running anything.
            let counts = core.stack().shutdown(now(), &mut dev)?;
            return Ok(report(&core, counts));
        }
        let l2 = corelane_stack::tune::l2_bytes(info.cpu);
        let tuner = self.cfg.adaptive_batch.then(|| {
            BatchTuner::new(TuneConfig {
                min_batch: 4,
                max_batch: self.cfg.stack.batch,
                l2_bytes: l2.unwrap_or(1 << 20),
                frame_bytes: self.cfg.xsk.frame_size as usize,
                max_fill: self.cfg.xsk.ring_size as usize,
            })
        });
        core.stats().batch = match &tuner {
            Some(t) => BatchStats {
                adaptive: true,
                current: t.batch(),
                settled: t.batch(),
                cap: t.cap(),
                l2_bytes: l2.unwrap_or(0),
                changes: 0,
                fill_target: dev.io_mut().set_fill_target(t.fill_target()),
            },
            None => BatchStats {
                current: dev.batch(),
                settled: dev.batch(),
                cap: dev.batch(),
                l2_bytes: l2.unwrap_or(0),
                fill_target: dev.io().fill_target(),
                ..BatchStats::default()
            },
        };
        let driver = core::Driver {
            tuner,
            core: core.clone(),
            dev,
            inbound,
            outbound,
            bells: self.shared.bells.clone(),
            mode: self.cfg.poll,
            epoch,
        };
        let linger = self.cfg.linger;
        if let Some(app) = app {
            // A split lane: the application runs on its own thread; this one runs the pipeline.
            let _ = app.send((core.clone(), info));
            let mut driver = exec.block_on(driver.run());
            if !self.shared.stop.load(Ordering::SeqCst) {
                driver = exec.block_on(driver.linger(linger));
            }
            let counts = core.stack().shutdown(now(), &mut driver.dev);
            core.ended.send_replace(true);
            return Ok(report(&core, counts?));
        }
        crate::core::set_current(Some(core.clone()));
        let local = tokio::task::LocalSet::new();
        let mut panicked = None;
        let counts = local.block_on(&exec, async {
            let driver_task = tokio::task::spawn_local(driver.run());
            let app = tokio::task::spawn_local(f(info));
            tokio::pin!(driver_task);
            let driver = tokio::select! {
                d = &mut driver_task => d,
                r = app => {
                    panicked = panic_message(r);
                    // The application is done on this core: let closing connections finish.
                    core.stopping.store(true, Ordering::SeqCst);
                    core.wake_driver();
                    match driver_task.await {
                        Ok(d) => Ok(d.linger(linger).await),
                        Err(e) => Err(e),
                    }
                }
            };
            match driver {
                Ok(mut d) => core
                    .stack()
                    .shutdown(now(), &mut d.dev)
                    .map_err(Error::from),
                Err(e) => {
                    log::error!("core {}: the driver task failed: {e}", info.index);
                    Err(Error::Config(format!("the driver task failed: {e}")))
                }
            }
        });
        // Tasks still alive (a stop interrupted them) are dropped with the LocalSet, while the
        // core is still reachable for their destructors.
        drop(local);
        crate::core::set_current(None);
        let counts = counts?;
        if let Some(message) = panicked {
            return Err(Error::Panicked {
                core: info.index,
                message,
            });
        }
        Ok(report(&core, counts))
    }

    #[allow(clippy::type_complexity)]
    fn setup_core(
        &self,
        info: CoreInfo,
    ) -> Result<
        (
            Arc<core::Core>,
            XdpDevice<XskQueue>,
            tokio::runtime::Runtime,
        ),
        Error,
    > {
        pin(info.cpu)?;
        let q = XskQueue::open(&self.cfg.ifname, info.queue, &self.cfg.xsk)?;
        self.shared
            .steering
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .register(info.queue, q.fd())?;
        let mut dev = XdpDevice::new(q, self.mtu, self.cfg.stack.batch);
        let stack = Stack::new(
            &mut dev,
            self.mac,
            &self.cfg.addrs,
            StackConfig {
                core: info.index,
                cores: info.cores,
                ..self.cfg.stack
            },
        );
        let exec = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let core = Arc::new(core::Core {
            index: info.index,
            stack: Mutex::new(stack),
            shared: self.shared.clone(),
            kick: tokio::sync::Notify::new(),
            stats: Mutex::new(CoreStats {
                core: info.index,
                cpu: info.cpu,
                app_cpu: info.app_cpu,
                queue: info.queue,
                ..CoreStats::default()
            }),
            next_waiter: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            ended: tokio::sync::watch::Sender::new(false),
        });
        Ok((core, dev, exec))
    }
}

fn pin(cpu: usize) -> Result<(), Error> {
    if core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
        Ok(())
    } else {
        Err(Error::Config(format!("cannot pin a thread to CPU {cpu}")))
    }
}

fn panic_message(r: Result<(), tokio::task::JoinError>) -> Option<String> {
    let e = r.err().filter(|e| e.is_panic())?;
    let p = e.into_panic();
    Some(
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "(not a string)".into()),
    )
}

/// How a split lane's application thread ended.
struct AppEnd {
    panicked: Option<String>,
    cpu_time: Duration,
}

/// A split lane's application thread: waits for its core to start, then runs `f` on its own
/// executor until the core's protocol side has shut down.
fn app_main<F, Fut>(
    cpu: usize,
    start: std::sync::mpsc::Receiver<(Arc<core::Core>, CoreInfo)>,
    f: &F,
) -> AppEnd
where
    F: Fn(CoreInfo) -> Fut,
    Fut: Future<Output = ()> + 'static,
{
    let mut end = AppEnd {
        panicked: None,
        cpu_time: Duration::ZERO,
    };
    let pinned = pin(cpu);
    // No core: setup failed somewhere and nothing runs.
    let Ok((core, info)) = start.recv() else {
        return end;
    };
    let stop_core = |why: String| {
        log::error!("core {}: {why}", info.index);
        core.stopping.store(true, Ordering::SeqCst);
        core.wake_driver();
    };
    let exec = match (
        pinned,
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    ) {
        (Ok(()), Ok(exec)) => exec,
        (Err(e), _) => {
            stop_core(e.to_string());
            end.panicked = Some(e.to_string());
            return end;
        }
        (_, Err(e)) => {
            stop_core(format!("no executor for the application: {e}"));
            end.panicked = Some(e.to_string());
            return end;
        }
    };
    crate::core::set_current(Some(core.clone()));
    let local = tokio::task::LocalSet::new();
    local.block_on(&exec, async {
        let app = tokio::task::spawn_local(f(info));
        let (mut a, mut b) = (core.ended.subscribe(), core.ended.subscribe());
        tokio::select! {
            r = app => {
                end.panicked = panic_message(r);
                core.stopping.store(true, Ordering::SeqCst);
                core.wake_driver();
                // Keep running the connections' tasks while the protocol side lingers.
                let _ = a.wait_for(|e| *e).await;
            }
            _ = b.wait_for(|e| *e) => {}
        }
    });
    drop(local);
    crate::core::set_current(None);
    end.cpu_time = core::thread_cpu_time();
    end
}

/// The index of the core the calling task runs on (None outside the runtime).
pub fn core_index() -> Option<usize> {
    crate::core::current().ok().map(|c| c.index)
}

/// Counters of the core the calling task runs on (None outside the runtime).
pub fn core_stats() -> Option<CoreStats> {
    crate::core::current().ok().map(|c| c.snapshot())
}
