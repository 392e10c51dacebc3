//! Starting a run's threads (one per core, a second for a lane whose placement splits, and
//! the privileged one), waiting for them, and the run's report.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::host::BindMode;

use crate::launch::{CoreInfo, Runtime};
use crate::report::{CoreReport, RunReport};
use crate::threads::{AppEnd, StartGate, app_main};
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
        let started = StartGate::new(n + 1);
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
            // The threads that talk to the kernel and to another process of an upgrade.
            self.start_host_threads(scope, say, n);
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
                    tx_checksum_offload: false,
                };
                let this = &self;
                let (f, started, failed) = (&f, &started, &failed);
                // A thread that cannot be started (no memory for its stack, a limit on
                // threads) fails its core: the others are told before they run anything, and
                // the start does not wait for it.
                let cannot_start = |what: &str, e: std::io::Error| {
                    failed.store(true, Ordering::SeqCst);
                    started.arrive();
                    Error::Core {
                        core: i,
                        cpu: info.cpu,
                        queue: info.queue,
                        source: Box::new(Error::Io(std::io::Error::new(
                            e.kind(),
                            format!("cannot start its {what} thread: {e}"),
                        ))),
                    }
                };
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
                        });
                    match h {
                        Ok(h) => (Some(tx), Some(h)),
                        Err(e) => {
                            handles.push(Err(cannot_start("application", e)));
                            continue;
                        }
                    }
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
                    });
                // An application thread whose core did not start ends when its channel
                // closes (the sender went with the closure).
                handles.push(match h {
                    Ok(h) => Ok((h, app)),
                    Err(e) => Err(cannot_start("protocol", e)),
                });
            }
            started.arrive_and_wait();
            let ended: Vec<_> = handles
                .into_iter()
                .enumerate()
                .map(|(i, started)| {
                    let (h, app) = started?;
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
            // The threads beside the cores end with them (a core that failed to start or to
            // set up ran no future, so the futures' count alone would keep them waiting).
            self.shared
                .life
                .cores_ended
                .store(true, std::sync::atomic::Ordering::Release);
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
}
