//! Starting a run's threads (one per core, a second for a lane whose placement splits, and
//! the privileged one), waiting for them, and the run's report.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use corelane_xsk::BindMode;

use crate::launch::{CoreInfo, Runtime};
use crate::report::{CoreReport, RunReport};
use crate::threads::{AppEnd, app_main};
use crate::{Error, handoff};

impl Runtime {
    pub(crate) fn run_cores<F, Fut>(self, f: F) -> Result<RunReport, Error>
    where
        F: Fn(CoreInfo) -> Fut + Send + Sync,
        Fut: Future<Output = ()> + 'static,
    {
        let n = self.plan.lanes.len();
        self.shared.life.apps_running.store(n, Ordering::SeqCst);
        // rings[from][to]
        let mut producers: Vec<Vec<Option<handoff::Producer>>> =
            (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        let mut consumers: Vec<Vec<handoff::Consumer>> = (0..n).map(|_| Vec::new()).collect();
        let frame_bytes = self.cfg.xsk.max_packet as usize;
        for (from, row) in producers.iter_mut().enumerate() {
            for (to, slot) in row.iter_mut().enumerate().filter(|(t, _)| *t != from) {
                let (p, c) = handoff::channel(self.cfg.handoff_slots, frame_bytes);
                *slot = Some(p);
                consumers[to].push(c);
            }
        }
        let started = std::sync::Barrier::new(n + 1);
        let failed = AtomicBool::new(false);
        // Stack time counts from the host's monotonic zero, the same in every process.
        let epoch = crate::clock::host_epoch();
        let jobs = self.shared.steer.steward().open();
        // The calling thread's subscriber, or stderr's writer, on every thread of the run.
        let say = &crate::say::dispatch();
        let results: Vec<Result<CoreReport, Error>> = std::thread::scope(|scope| {
            // Spawned by this thread, it keeps what this thread kept; the cores drop all.
            let priv_thread = std::thread::Builder::new()
                .name("corelane-priv".into())
                .spawn_scoped(scope, move || {
                    let _say = crate::say::enter(say);
                    crate::steward::serve(jobs)
                });
            if let Err(e) = priv_thread {
                // Changes then run on the thread that asks (and fail where it has no capability).
                self.shared.steer.steward().close();
                tracing::warn!(
                    "the privileged thread did not start ({e}): port and address changes may fail"
                );
            }
            if self.cfg.kernel_routes {
                match corelane_xsk::RouteWatch::open(&self.cfg.ifname) {
                    Ok(watch) => {
                        let this = &self;
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
            if let (Some(listener), Some((_, grace))) = (&self.upgrade_listener, &self.cfg.upgrades)
            {
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
                        crate::upgrade_handover::serve(listener, &run)
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
                        .spawn_scoped(scope, move || {
                            let _say = crate::say::enter(say);
                            app_main(
                                info.app_cpu,
                                rx,
                                f,
                                this.cfg.on_panic,
                                !this.cfg.keep_capabilities,
                            )
                        })
                        .expect("spawning an application thread");
                    (Some(tx), Some(h))
                } else {
                    (None, None)
                };
                let h = std::thread::Builder::new()
                    .name(format!("corelane-{i}"))
                    .spawn_scoped(scope, move || {
                        let _say = crate::say::enter(say);
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
            let ended: Vec<_> = handles
                .into_iter()
                .enumerate()
                .map(|(i, (h, app))| {
                    let r = h.join().unwrap_or_else(|_| {
                        Err(Error::Internal("a core's thread panicked".into()))
                    });
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
                .collect();
            // A call-off still waiting for the cores to take their queues back ends now: the
            // upgrade thread is joined with this scope.
            self.shared
                .upgrades
                .cores_ended
                .store(true, std::sync::atomic::Ordering::Release);
            self.shared.steer.steward().close();
            ended
        });
        // Every core has left its queue: the new process of an upgrade ends the split.
        self.shared.upgrades.close();
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
        if let Some((core, message)) = self.shared.life.take_failure() {
            return Err(Error::Failed { core, message });
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let xdp = self.shared.steer.read().counters().unwrap_or_default();
        // Counted while the sockets were open: frames a device still held when they closed
        // (a zero-copy NIC keeps a ring's worth) find none, which is no steering fault.
        let unserved = self
            .shared
            .no_socket_open
            .load(Ordering::Acquire)
            .min(xdp.no_socket);
        if unserved > 0 {
            self.shared.telemetry.warn_once(format!(
                "{unserved} frame(s) for owned addresses and ports arrived on a queue no core \
                 served and went to the kernel"
            ));
        }
        Ok(RunReport {
            cores,
            xdp,
            warnings: self.shared.telemetry.warnings(),
            stopped: self.shared.life.stop.load(Ordering::SeqCst) || self.shared.life.draining(),
            upgraded: self.shared.upgrades.switched(),
        })
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
            match crate::routing::resolve(&self.cfg.ifname, &addrs, true, &self.cfg.routes) {
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
