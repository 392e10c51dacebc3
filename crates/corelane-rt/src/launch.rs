//! The runtime: starting one pinned thread per core, running the application on each, and
//! collecting what each core reports when it ends.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corelane_stack::{Stack, StackConfig, XdpDevice};
use corelane_topo::{Placement, Plan};
use corelane_xsk::{AttachMode, AttachedMode, BindMode, XskConfig, XskQueue};

use crate::control::Shared;
use crate::cpu::pin;
use crate::lane::{Core, CoreStats};
use crate::queues::RestoreQueues;
use crate::report::RunReport;
use crate::stop::StopHandle;
use crate::{Builder, Error, PollMode};

/// The runtime: an interface, the XDP program and the cores that will serve it.
pub struct Runtime {
    pub(crate) shared: Arc<Shared>,
    pub(crate) cfg: Builder,
    pub(crate) plan: Plan,
    pub(crate) nqueues: u32,
    pub(crate) mac: [u8; 6],
    pub(crate) mtu: usize,
    pub(crate) routes: corelane_stack::route::RouteTable,
    /// Each lane's AF_XDP socket, opened by `build`, taken by its core when it starts.
    pub(crate) sockets: Mutex<Vec<Option<LaneSocket>>>,
    /// Where a new process takes this one's place ([`Builder::upgrades`]).
    pub(crate) upgrade_listener: Option<crate::host::xsk::handover::Listener>,
    /// The old process this one takes over from, until the cores run
    /// ([`Builder::upgrade_from`]).
    pub(crate) joining: Mutex<Option<crate::host::xsk::join::Joining>>,
    // Dropped after `shared` (and with it the XDP program).
    pub(crate) _restore: RestoreQueues,
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
    /// Whether its TCP segments leave their checksums to the kernel and the NIC
    /// ([`XskConfig::tx_checksum_offload`] asked for and granted: copy mode on Linux 6.11+,
    /// or a zero-copy driver that takes checksum requests).
    pub tx_checksum_offload: bool,
}

impl Runtime {
    /// Starts building a runtime on interface `ifname`.
    pub fn builder(ifname: &str) -> Builder {
        Builder {
            ifname: ifname.to_string(),
            addrs: Vec::new(),
            invalid: Vec::new(),
            placement: Placement::SameCore,
            lanes: None,
            queues: None,
            attach: AttachMode::Auto,
            vlan: corelane_xsk::Vlan::default(),
            xsk: XskConfig::default(),
            stack: StackConfig::default(),
            poll: PollMode::default(),
            handoff_slots: 1024,
            linger: Duration::from_millis(200),
            adaptive_batch: true,
            routes: Vec::new(),
            kernel_routes: true,
            share_kernel_addrs: false,
            on_panic: crate::OnPanic::RestartCore,
            publish_stats: true,
            metrics: None,
            xdp: crate::Xdp::Auto,
            keep_capabilities: false,
            death_linger: Duration::from_secs(60),
            xdp_cookies: None,
            tcp_mem_auto: true,
            default_signals: true,
            upgrades: None,
            upgrade_from: None,
        }
    }

    /// A handle that adds and removes owned addresses while the runtime runs, from any
    /// thread. It does not keep the runtime alive: once `run` returns, changes are refused.
    pub fn addr_handle(&self) -> crate::AddrHandle {
        crate::AddrHandle(Arc::downgrade(&self.shared))
    }

    /// A handle that stops the runtime from any thread. It does not keep the runtime alive
    /// (the interface is released when `run` returns, whatever handles are left); once the
    /// runtime has ended, stopping it does nothing.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(Arc::downgrade(&self.shared))
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
    /// addresses, routes, buffers and poll mode.
    pub fn describe(&self) -> String {
        let st = self.shared.steer.read();
        let mut s = format!(
            "interface {}: XDP program attached in {} mode",
            self.cfg.ifname,
            st.mode()
        );
        if let Some(why) = st.fallback_reason() {
            s.push_str(&format!(" (native mode refused: {why})"));
        }
        if let Some(g) = st.grant() {
            s.push_str(&format!(
                " by corelane-broker grant ({}): this process steers through its grant",
                g.path().display()
            ));
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
        let routes: Vec<String> = self.routes.routes().iter().map(|r| r.to_string()).collect();
        if routes.is_empty() {
            s.push_str("\nroutes: none (only peers on the owned subnets are reachable)");
        } else {
            s.push_str(&format!("\nroutes: {}", routes.join(", ")));
        }
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
    /// or when a [`StopHandle`] stops or shuts it down. SIGTERM and SIGINT, when the
    /// application left them at their default, end the run gracefully in 1 s and then the
    /// process, by that signal (see [`Builder::default_signals`](crate::Builder::default_signals));
    /// an application with its own handler calls the handle from it. A core whose
    /// future returns keeps serving its queue until every core's has. Each core first opens its
    /// AF_XDP socket;
    /// if any core fails to start, none runs and the error names the core. On a lane whose
    /// placement splits protocol and application, `f` runs on a second thread pinned to the
    /// application CPU.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// use corelane::{Runtime, net::UdpSocket};
    /// let rt = Runtime::builder("veth0").addr("10.0.0.1/24").build()?;
    /// let report = rt.run(|core| async move {
    ///     let sock = UdpSocket::bind(7).await.expect("port 7");
    ///     let mut buf = [0; 2048];
    ///     while let Ok((n, peer)) = sock.recv_from(&mut buf).await {
    ///         let _ = sock.send_to(&buf[..n], peer).await;
    ///     }
    ///     println!("core {} done", core.index);
    /// })?;
    /// assert!(report.frames_balanced());
    /// # Ok::<(), corelane::Error>(())
    /// ```
    ///
    /// # Sharing state between cores
    /// The future runs once per core: what it creates, each core has its own (a store made in
    /// it splits across cores silently). [`run_with`](Runtime::run_with) is the shape that
    /// keeps one instance. The closure may borrow from the caller (the cores run inside a scope that ends before
    /// `run` returns); each future it returns runs on its core and must own what it uses:
    /// clone what it needs out of the borrowed state, and share what the cores update together
    /// through an `Arc` of something `Sync` (an atomic, a lock, a channel).
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use corelane::{Runtime, net::TcpListener};
    ///
    /// struct Config { port: u16, greeting: String }
    /// let config = Config { port: 7, greeting: "hello".into() };
    /// let served = Arc::new(AtomicU64::new(0));
    /// let rt = Runtime::builder("veth0").addr("10.0.0.1/24").build()?;
    /// rt.run(|_core| {
    ///     // Borrowed here, owned by the future:
    ///     let (port, greeting, served) = (config.port, config.greeting.clone(), served.clone());
    ///     async move {
    ///         let l = TcpListener::bind(port).await.expect("the port");
    ///         while let Ok((s, _)) = l.accept().await {
    ///             served.fetch_add(1, Ordering::Relaxed);
    ///             let _ = (&s, &greeting);
    ///         }
    ///     }
    /// })?;
    /// println!("{} connections", served.load(Ordering::Relaxed));
    /// # Ok::<(), corelane::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Core`] when a core could not start (its AF_XDP socket, its pinning), and
    /// [`Error::Panicked`] when the future of a core panicked and
    /// [`OnPanic::StopRuntime`](crate::OnPanic) was chosen (with the default, the future runs
    /// again and the panic is in the report).
    pub fn run<F, Fut>(self, f: F) -> Result<RunReport, Error>
    where
        F: Fn(CoreInfo) -> Fut + Send + Sync,
        Fut: Future<Output = ()> + 'static,
    {
        let _say = crate::say::enter(&crate::say::dispatch());
        let guard = crate::signals::RunGuard::start(self.stop_handle(), self.cfg.default_signals);
        let r = self.run_cores(f);
        guard.finish();
        r
    }

    /// As [`run`](Runtime::run), for a future that returns a `Result`, as a
    /// `#[tokio::main]` function may: `?` works inside it. An error ends the run (every core
    /// stops at once, as [`StopHandle::stop`](crate::StopHandle::stop)) and is returned as
    /// [`Error::Failed`], naming the core and the error.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// use corelane::{Runtime, net::TcpListener};
    /// let rt = Runtime::builder("veth0").addr("10.0.0.1/24").build()?;
    /// let report = rt.try_run(|_core| async move {
    ///     let listener = TcpListener::bind(7).await?; // a port in use ends the run, with why
    ///     while let Ok((s, peer)) = listener.accept().await {
    ///         println!("{peer} connected");
    ///         drop(s);
    ///     }
    ///     Ok::<(), std::io::Error>(()) // the error type, as in any async block using `?`
    /// })?;
    /// # let _ = report;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`run`](Runtime::run), and [`Error::Failed`] when the future of a core returned an
    /// error.
    pub fn try_run<F, Fut, E>(self, f: F) -> Result<RunReport, Error>
    where
        F: Fn(CoreInfo) -> Fut + Send + Sync,
        Fut: Future<Output = Result<(), E>> + 'static,
        E: std::fmt::Display,
    {
        let shared = self.shared.clone();
        let _say = crate::say::enter(&crate::say::dispatch());
        let guard = crate::signals::RunGuard::start(self.stop_handle(), self.cfg.default_signals);
        let r = self.run_cores(move |info: CoreInfo| {
            let fut = f(info);
            let shared = shared.clone();
            async move {
                if let Err(e) = fut.await {
                    shared.core_failed(info.index, e.to_string());
                }
            }
        });
        guard.finish();
        r
    }
}

impl Runtime {
    /// As [`run`](Runtime::run), with one instance of `state` made by the caller and a clone
    /// of it handed to every core's future: the shape that keeps a service's state (a store,
    /// a map of subscribers, a cache) one for the whole server. The future `f` returns runs
    /// once per core, so whatever it creates itself, each core has its own: a store made
    /// inside it splits silently, as a connection that lands on another queue (RSS decides)
    /// finds another store. Make the state before, put what the cores change together behind
    /// an `Arc` of something `Sync` (a lock, an atomic, a channel), and let each core clone it.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// use std::collections::HashMap;
    /// use std::sync::{Arc, Mutex};
    /// use corelane::{Runtime, net::TcpListener};
    /// use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    ///
    /// // What `#[tokio::main]` made at the top of `main`: one store for every core.
    /// let db: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    /// let rt = Runtime::builder("veth0").addr("10.0.0.1/24").build()?;
    /// rt.run_with(db, |_core, db| async move {
    ///     let Ok(listener) = TcpListener::bind(6379).await else { return };
    ///     while let Ok((s, _)) = listener.accept().await {
    ///         let db = db.clone();
    ///         tokio::task::spawn_local(async move {
    ///             let (r, mut w) = s.into_split();
    ///             let mut lines = BufReader::new(r).lines();
    ///             while let Ok(Some(line)) = lines.next_line().await {
    ///                 let Ok(mut db) = db.lock() else { break };
    ///                 let reply = match line.split_once(' ') {
    ///                     Some(("GET", k)) => db.get(k).cloned().unwrap_or_default(),
    ///                     Some(("SET", kv)) => {
    ///                         let (k, v) = kv.split_once(' ').unwrap_or((kv, ""));
    ///                         db.insert(k.into(), v.into());
    ///                         "OK".into()
    ///                     }
    ///                     _ => "ERR".into(),
    ///                 };
    ///                 drop(db);
    ///                 if w.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
    ///                     break;
    ///                 }
    ///             }
    ///         });
    ///     }
    /// })?;
    /// # Ok::<(), corelane::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`run`](Runtime::run).
    pub fn run_with<S, F, Fut>(self, state: S, f: F) -> Result<RunReport, Error>
    where
        S: Clone + Send + Sync,
        F: Fn(CoreInfo, S) -> Fut + Send + Sync,
        Fut: Future<Output = ()> + 'static,
    {
        self.run(move |core| f(core, state.clone()))
    }

    /// As [`try_run`](Runtime::try_run), with `state` as [`run_with`](Runtime::run_with)
    /// hands it: one instance, a clone to every core's future.
    ///
    /// # Errors
    /// As [`try_run`](Runtime::try_run).
    pub fn try_run_with<S, F, Fut, E>(self, state: S, f: F) -> Result<RunReport, Error>
    where
        S: Clone + Send + Sync,
        F: Fn(CoreInfo, S) -> Fut + Send + Sync,
        Fut: Future<Output = Result<(), E>> + 'static,
        E: std::fmt::Display,
    {
        self.try_run(move |core| f(core, state.clone()))
    }
}

/// A lane's socket, as `build` leaves it for its core.
#[derive(Debug)]
pub(crate) enum LaneSocket {
    /// Opened, with the queue's UMEM of its own.
    Open(Box<corelane_xsk::XskQueue>),
    /// Bound beside the old process of an upgrade: the core takes the rings over as it starts.
    Joining(Box<corelane_xsk::PendingJoin>),
}

impl LaneSocket {
    /// The queue, its rings taken over from the old process of an upgrade where it joins one.
    pub(crate) fn ready(self) -> Result<corelane_xsk::XskQueue, Error> {
        match self {
            LaneSocket::Open(q) => Ok(*q),
            LaneSocket::Joining(j) => Ok(j.take_over()?),
        }
    }
}

impl Runtime {
    #[allow(clippy::type_complexity)]
    /// Core `info`'s thread, pinned, takes its queue (its rings taken over here when it joins
    /// an upgrade) and makes its device, stack and executor: the one place a core's queue is
    /// named, so the core's run (`threads.rs`) and its driver stay generic over it.
    pub(crate) fn setup_core(
        &self,
        info: CoreInfo,
    ) -> Result<(Arc<Core>, XdpDevice<XskQueue>, tokio::runtime::LocalRuntime), Error> {
        pin(info.cpu)?;
        let q = self
            .sockets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(info.index)
            .and_then(Option::take)
            .ok_or_else(|| Error::Internal(format!("core {}: no socket", info.index)))?
            // Joining an upgrade: the rings are taken over here, on the core that turns them
            // from now on.
            .ready()?;
        let mut dev = XdpDevice::new(q, self.mtu, self.cfg.stack.batch);
        dev.set_vlans(self.cfg.vlan.service, self.cfg.vlan.id);
        // A frame built over the MTU is a bug: counted (`DeviceStats::tx_oversize`) and dropped,
        // or a panic in debug builds and wherever CORELANE_STRICT=1 (every test run).
        if std::env::var_os("CORELANE_STRICT").is_some_and(|v| v == "1") {
            dev.set_strict(true);
        }
        let mut stack = Stack::new(
            &mut dev,
            self.mac,
            &self.cfg.addrs,
            StackConfig {
                core: info.index,
                cores: info.cores,
                ..self.cfg.stack
            },
        );
        for r in self.routes.routes() {
            // Checked when the runtime was built; the stack's table has the same size.
            stack.add_route(r.dst, r.via)?;
        }
        let exec = crate::executor::executor()?;
        let stats = CoreStats {
            core: info.index,
            cpu: info.cpu,
            app_cpu: info.app_cpu,
            queue: info.queue,
            ..CoreStats::default()
        };
        let core = Arc::new(Core::new(info.index, stack, self.shared.clone(), stats));
        Ok((core, dev, exec))
    }
}

impl Runtime {
    /// On `scope`, the run's threads that talk to the host (run by setup, which picks it): the
    /// one following the kernel's routes, the old process's side of an upgrade and, joining
    /// one, the new process's (not scoped: it waits for the old process, which may outlast the
    /// run). `n`: the run's lanes.
    pub(crate) fn start_host_threads<'scope>(
        &'scope self,
        scope: &'scope std::thread::Scope<'scope, '_>,
        say: &'scope Option<tracing::Dispatch>,
        n: usize,
    ) {
        if self.cfg.kernel_routes {
            match corelane_xsk::RouteWatch::open(&self.cfg.ifname) {
                Ok(watch) => {
                    let this = self;
                    let spawned = std::thread::Builder::new()
                        .name("corelane-routes".into())
                        .spawn_scoped(scope, move || {
                            let _say = crate::say::enter(say);
                            this.follow_routes(watch)
                        });
                    if let Err(e) = spawned {
                        tracing::warn!("the kernel's route changes will not be followed: {e}");
                    }
                }
                Err(e) => {
                    tracing::warn!("the kernel's route changes will not be followed: {e}")
                }
            }
        }
        if let (Some(listener), Some((_, grace))) = (&self.upgrade_listener, &self.cfg.upgrades) {
            let run = crate::upgrade_old::OldRun {
                shared: &self.shared,
                secret: crate::upgrade_words::RunSecret::of(&self.cfg.stack),
                grace: *grace,
                restore: &self._restore,
            };
            let spawned = std::thread::Builder::new()
                .name("corelane-upgrade".into())
                .spawn_scoped(scope, move || {
                    let _say = crate::say::enter(say);
                    crate::host::xsk::handover::serve(listener, &run)
                });
            if let Err(e) = spawned {
                tracing::warn!("no upgrade can be made: {e}");
            }
        }
        if let Some(joining) = crate::lock::lock(&self.joining).take() {
            // Not scoped: it waits for the old process to end, which may outlast this run.
            self.shared.upgrades.start_listing(n);
            let weak = std::sync::Arc::downgrade(&self.shared);
            let ifname = self.cfg.ifname.clone();
            let say = say.clone();
            let spawned = std::thread::Builder::new()
                .name("corelane-succeed".into())
                .spawn(move || {
                    let _say = crate::say::enter(&say);
                    joining.serve(&weak, &ifname)
                });
            if let Err(e) = spawned {
                tracing::error!("upgrade: the old process will not be told to switch: {e}");
            }
        }
    }

    /// While the run lasts: reads the kernel's routes again after each change of a route out
    /// of the interface (a router advertisement, `ip route`, a DHCP client) and gives the
    /// cores the new table, the builder's routes kept over the kernel's.
    fn follow_routes(&self, mut watch: corelane_xsk::RouteWatch) {
        while !self.shared.life.ending() {
            if !watch.changed(Duration::from_millis(200)) {
                continue;
            }
            let addrs = self.shared.addrs.list();
            let table = corelane_xsk::kernel_routes(&self.cfg.ifname)
                .map_err(Error::from)
                .and_then(|kernel| {
                    crate::routing::resolve(&self.cfg.ifname, &addrs, &kernel, &self.cfg.routes)
                });
            match table {
                Ok(table) => {
                    let shown: Vec<String> =
                        table.routes().iter().map(ToString::to_string).collect();
                    if self.shared.routes.replace(table) {
                        tracing::info!(
                            "{}: the kernel's routes changed; now {}",
                            self.cfg.ifname,
                            if shown.is_empty() {
                                "none".to_string()
                            } else {
                                shown.join(", ")
                            }
                        );
                        self.shared.ring_all();
                    }
                }
                Err(e) => tracing::warn!(
                    "{}: the kernel's routes changed but could not be read: {e}",
                    self.cfg.ifname
                ),
            }
        }
    }
}
