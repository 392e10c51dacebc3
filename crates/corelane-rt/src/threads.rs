//! One core's threads: the protocol thread (its queue, stack, executor and driver) and, on a
//! lane whose placement splits, the application's thread.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant as StdInstant};

use corelane_stack::{BatchTuner, Pipeline, TuneConfig};

use crate::cpu::{pin, thread_cpu_time};
use crate::driver::Driver;
use crate::executor::{executor, run_task};
use crate::host::FrameIo as _;
use crate::lane::{self, BatchStats, Core};
use crate::launch::Runtime;
use crate::peers::CorePeers;
use crate::report::CoreReport;
use crate::{CoreInfo, Error, OnPanic, handoff};

impl Runtime {
    /// Core and application threads keep no capability (unless the application asked to keep
    /// them): they run what the wire and the application hand them.
    fn drop_thread_capabilities(&self) -> Result<(), Error> {
        if self.cfg.keep_capabilities {
            return Ok(());
        }
        crate::access::drop_thread_capabilities()
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn core_main<F, Fut>(
        &self,
        info: CoreInfo,
        outbound: Vec<Option<handoff::Producer>>,
        inbound: Vec<handoff::Consumer>,
        epoch: StdInstant,
        started: &StartGate,
        failed: &AtomicBool,
        f: &F,
        app: Option<std::sync::mpsc::Sender<(Arc<Core>, CoreInfo)>>,
    ) -> Result<CoreReport, Error>
    where
        F: Fn(CoreInfo) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        // Everything this thread logs carries its core, CPU and queue.
        let _span = tracing::info_span!(
            "core",
            index = info.index,
            cpu = info.cpu,
            queue = info.queue
        )
        .entered();
        let setup = self.setup_core(info).and_then(|s| {
            self.drop_thread_capabilities()?;
            Ok(s)
        });
        if setup.is_err() {
            failed.store(true, Ordering::SeqCst);
        }
        started.arrive_and_wait();
        let (core, mut dev, exec) = setup?;
        let bind_mode = dev.io().mode();
        let tx_checksum_offload = dev.io().checksum_offload();
        let info = CoreInfo {
            bind_mode,
            tx_checksum_offload,
            ..info
        };
        let clock = self.shared.clock.clone();
        let now = || {
            let since = clock.now().saturating_duration_since(epoch);
            corelane_stack::smoltcp::time::Instant::from_micros(since.as_micros() as i64)
        };
        let report = |core: &Core, frames| {
            let mut stats = core.snapshot();
            stats.cpu_time = thread_cpu_time();
            CoreReport {
                stats,
                frames,
                bind_mode,
                panics: core.panics.lock().map(|p| p.clone()).unwrap_or_default(),
            }
        };
        if failed.load(Ordering::SeqCst) {
            // Another core failed: end without running anything.
            let counts = core.stack().shutdown(now(), &mut dev)?;
            return Ok(report(&core, counts));
        }
        let l2 = crate::cpu::l2_bytes(info.cpu);
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
        if info.index == 0 {
            // Tell the link where the owned addresses are now (gratuitous ARP, unsolicited
            // neighbour advertisements), so peers that knew another hardware address for
            // them, and switches, learn this one without waiting.
            let n = core.stack().announce(now(), &mut dev);
            if let Err(e) = dev.flush() {
                tracing::warn!("core 0: announcing the addresses: {e}");
            }
            tracing::debug!("core 0: {n} address announcement(s) sent");
        }
        let peers = CorePeers::new(info.index, inbound, outbound, self.shared.bells.clone());
        let mut driver = Driver::new(
            core.clone(),
            Pipeline::new(dev, tuner),
            peers,
            self.cfg.poll,
            epoch,
        );
        // This core's slot of the live statistics, and the capture tap beside it.
        let slot = || {
            self.shared
                .telemetry
                .publisher
                .as_ref()
                .and_then(|p| p.core(info.index))
        };
        let at = self.shared.clock.now();
        driver.publish = slot().map(|w| crate::publish::Publish::new(w, info.index, at));
        driver.capture = slot().and_then(|w| crate::capture::CoreCapture::new(w, epoch, at));
        let linger = self.cfg.linger;
        if let Some(app) = app {
            // A split lane: the application runs on its own thread; this one runs the pipeline.
            let _ = app.send((core.clone(), info));
            let mut driver = run_task(&exec, driver.run());
            if !self.shared.life.stop.load(Ordering::SeqCst) {
                driver = run_task(&exec, (*driver).linger(linger));
            }
            let counts = core.stack().shutdown(now(), &mut driver.pipe.dev)?;
            let counts = exec.block_on(driver.leave_upgrade(counts));
            self.shared.note_no_socket();
            core.ended.send_replace(true);
            return Ok(report(&core, counts));
        }
        lane::set_current(Some(core.clone()));
        let mut panicked = None;
        let restart = self.cfg.on_panic == OnPanic::RestartCore;
        let counts = exec.block_on(async {
            let mut driver_task = tokio::task::spawn_local(driver.run());
            let mut app = tokio::task::spawn_local(f(info));
            let driver = loop {
                tokio::select! {
                    d = &mut driver_task => break d,
                    r = &mut app => {
                        if let Some(again) = next_attempt(&core, r, restart, f, info, &mut panicked).await {
                            app = again;
                            continue;
                        }
                        // This core's future is done; the core serves its queue (handoff,
                        // ARP, retransmissions) until every core's is, then lingers.
                        self.shared.app_done();
                        match driver_task.await {
                            Ok(d) if !self.shared.life.stop.load(Ordering::SeqCst) => {
                                break Ok((*d).linger(linger).await);
                            }
                            other => break other,
                        }
                    }
                }
            };
            match driver {
                Ok(mut d) => {
                    let counts = core.stack().shutdown(now(), &mut d.pipe.dev)?;
                    let counts = d.leave_upgrade(counts).await;
                    self.shared.note_no_socket();
                    Ok(counts)
                }
                Err(e) => {
                    tracing::error!("core {}: the driver task failed: {e}", info.index);
                    Err(Error::Internal(format!("the driver task failed: {e}")))
                }
            }
        });
        // Tasks still alive (a stop interrupted them) are dropped with the executor, while the
        // core is still reachable for their destructors.
        drop(exec);
        lane::set_current(None);
        let counts = counts?;
        if let Some(message) = panicked {
            return Err(Error::Panicked {
                core: info.index,
                message,
            });
        }
        Ok(report(&core, counts))
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

/// A core's application future ended with `r`. When it panicked and the core's policy
/// restarts it (see `Core::on_panic`), waits the policy's delay and returns the new attempt;
/// otherwise None, with the panic's message in `panicked` when the policy ends the runtime.
async fn next_attempt<F, Fut>(
    core: &Core,
    r: Result<(), tokio::task::JoinError>,
    restart: bool,
    f: &F,
    info: CoreInfo,
    panicked: &mut Option<String>,
) -> Option<tokio::task::JoinHandle<()>>
where
    F: Fn(CoreInfo) -> Fut,
    Fut: Future<Output = ()> + 'static,
{
    let message = panic_message(r)?;
    match core.on_panic(&message, restart) {
        Ok(delay) => {
            tokio::time::sleep(delay).await;
            Some(tokio::task::spawn_local(f(info)))
        }
        Err(message) => {
            *panicked = Some(message);
            None
        }
    }
}

/// How a split lane's application thread ended.
pub(crate) struct AppEnd {
    pub(crate) panicked: Option<String>,
    pub(crate) cpu_time: Duration,
}

/// A split lane's application thread: waits for its core to start, then runs `f` on its own
/// executor until the core's protocol side has shut down.
pub(crate) fn app_main<F, Fut>(
    cpu: usize,
    start: std::sync::mpsc::Receiver<(Arc<Core>, CoreInfo)>,
    f: &F,
    on_panic: OnPanic,
    drop_caps: bool,
) -> AppEnd
where
    F: Fn(CoreInfo) -> Fut,
    Fut: Future<Output = ()> + 'static,
{
    let mut end = AppEnd {
        panicked: None,
        cpu_time: Duration::ZERO,
    };
    let pinned = pin(cpu).and_then(|()| {
        if drop_caps {
            crate::access::drop_thread_capabilities()?;
        }
        Ok(())
    });
    let _span = tracing::info_span!("app", cpu).entered();
    // No core: setup failed somewhere and nothing runs.
    let Ok((core, info)) = start.recv() else {
        return end;
    };
    let stop_core = |why: String| {
        tracing::error!("core {}: {why}", info.index);
        core.stopping.store(true, Ordering::SeqCst);
        core.shared.app_done();
        core.wake_driver();
    };
    let exec = match (pinned, executor()) {
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
    lane::set_current(Some(core.clone()));
    let restart = on_panic == OnPanic::RestartCore;
    exec.block_on(async {
        let mut app = tokio::task::spawn_local(f(info));
        let (mut a, mut b) = (core.ended.subscribe(), core.ended.subscribe());
        loop {
            tokio::select! {
                r = &mut app => {
                    if let Some(again) = next_attempt(&core, r, restart, f, info, &mut end.panicked).await {
                        app = again;
                        continue;
                    }
                    core.shared.app_done();
                    core.wake_driver();
                    // Keep running the connections' tasks while the protocol side lingers.
                    let _ = a.wait_for(|e| *e).await;
                    break;
                }
                _ = b.wait_for(|e| *e) => break,
            }
        }
    });
    drop(exec);
    lane::set_current(None);
    end.cpu_time = thread_cpu_time();
    end
}

/// The cores' start: each core arrives once it is set up, or the starting thread arrives for
/// one whose thread could not be started, and those that wait go on once all have arrived.
pub(crate) struct StartGate {
    left: std::sync::Mutex<usize>,
    all: std::sync::Condvar,
}

impl StartGate {
    /// A start of `parties` arrivals.
    pub(crate) fn new(parties: usize) -> Self {
        StartGate {
            left: std::sync::Mutex::new(parties),
            all: std::sync::Condvar::new(),
        }
    }

    /// One party has arrived and does not wait.
    pub(crate) fn arrive(&self) {
        let mut left = crate::lock::lock(&self.left);
        *left = left.saturating_sub(1);
        if *left == 0 {
            self.all.notify_all();
        }
    }

    /// One party has arrived and waits for the rest.
    pub(crate) fn arrive_and_wait(&self) {
        self.arrive();
        let mut left = crate::lock::lock(&self.left);
        while *left > 0 {
            left = self
                .all
                .wait(left)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::StartGate;

    #[test]
    fn the_start_goes_on_once_every_party_arrived_waiting_or_not() {
        let gate = StartGate::new(3);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| gate.arrive_and_wait());
            // A party that could not start: arrives without waiting.
            gate.arrive();
            // One party is still to come: the waiter waits for it.
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(
                !waiter.is_finished(),
                "the start went on before all arrived"
            );
            gate.arrive_and_wait();
            assert!(waiter.join().is_ok());
        });
        assert_eq!(*crate::lock::lock(&gate.left), 0);
    }
}
