//! One simulated process: a runtime's control plane ([`Shared`]) and one core (a real
//! [`Driver`] over a queue of the in-memory kernel), with the application of the examples'
//! echo server driven on the core's stack between the driver's turns.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Instant;

use crate::host::mem::{MemProgram, XskQueue};
use corelane_stack::smoltcp::wire::IpCidr;
use corelane_stack::{FlowId, Pipeline, Proto, Stack, StackConfig, XdpDevice};

use crate::clock::Clock;
use crate::control::Shared;
use crate::driver::Driver;
use crate::lane::{Core, CoreStats};
use crate::peers::CorePeers;
use crate::upgrade_core::Leave;

/// The port the echo server listens on.
pub(super) const PORT: u16 = 7;
/// The IP MTU of the simulated link.
pub(super) const MTU: usize = 1500;

/// A process's control plane over the in-memory program `program`, on the world's clock.
pub(crate) fn shared(
    program: &MemProgram,
    addr: IpCidr,
    clock: &Clock,
) -> std::io::Result<Arc<Shared>> {
    Shared::in_memory(program, &[addr], clock)
}

/// The echo server's side of one connection.
#[derive(Debug)]
struct Conn {
    id: FlowId,
    pending: Vec<u8>,
    eof: bool,
    shut: bool,
}

/// Where a process's core stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Serving (the application runs).
    Serving,
    /// The application is done (drained): the core lingers until nothing is left to finish.
    Lingering,
    /// The stack is shut down; the core leaves its queue to the new process, if it shares it.
    Leaving,
    /// The core has ended.
    Ended,
}

/// One process with one core.
pub(super) struct Process {
    pub(super) shared: Arc<Shared>,
    pub(super) driver: Option<Driver<XskQueue>>,
    pub(super) phase: Phase,
    conns: Vec<Conn>,
    listening: bool,
    freed: Vec<(Proto, u16)>,
    /// Set once the process has ended (a pidfd's readiness, to the other process).
    pub(super) gone: Arc<AtomicBool>,
    /// Connections this process accepted.
    pub(super) accepted: usize,
    /// Its queue left to the new process at its end.
    pub(super) left: bool,
    /// The application listens from this time on.
    pub(super) listen_at: Instant,
}

impl Process {
    /// A process whose core serves `queue`, its stack seeded with `seed`.
    pub(super) fn new(
        shared: Arc<Shared>,
        queue: XskQueue,
        addr: IpCidr,
        mac: [u8; 6],
        seed: u64,
        epoch: Instant,
    ) -> Process {
        let mut dev = XdpDevice::new(queue, MTU, 32);
        dev.set_strict(true);
        let stack = Stack::new(
            &mut dev,
            mac,
            &[addr],
            StackConfig {
                seed: Some(seed),
                ..StackConfig::default()
            },
        );
        let core = Arc::new(Core::new(0, stack, shared.clone(), CoreStats::default()));
        let peers = CorePeers::new(0, Vec::new(), vec![None], shared.bells.clone());
        let pipe = Pipeline::new(dev, None);
        let driver = Driver::new(core, pipe, peers, crate::PollMode::Busy, epoch);
        Process {
            shared,
            driver: Some(driver),
            phase: Phase::Serving,
            conns: Vec::new(),
            listening: false,
            freed: Vec::new(),
            gone: Arc::new(AtomicBool::new(false)),
            accepted: 0,
            left: false,
            listen_at: epoch,
        }
    }

    /// The stack's time now, as a driver with `epoch` counts it.
    fn stack_now(&self, epoch: Instant) -> corelane_stack::smoltcp::time::Instant {
        let since = self.shared.clock.now().saturating_duration_since(epoch);
        corelane_stack::smoltcp::time::Instant::from_micros(since.as_micros() as i64)
    }

    /// One turn of the core: the driver's turn while it serves or lingers, then the end's
    /// steps. True when anything moved.
    pub(super) fn turn(&mut self) -> bool {
        let Some(d) = self.driver.as_mut() else {
            return false;
        };
        match self.phase {
            Phase::Serving | Phase::Lingering => {
                let busy = d.turn(&mut self.freed);
                d.release_ports(&mut self.freed);
                if self.phase == Phase::Lingering {
                    let settled = d.core.stack().settled();
                    let shared = self.shared.clone();
                    let over = shared
                        .life
                        .drain_deadline()
                        .is_some_and(|t| shared.clock.now() >= t);
                    if (settled && d.upgrade.all_settled(&shared))
                        || over
                        || shared.life.stop.load(Ordering::Relaxed)
                    {
                        let epoch = d.epoch;
                        let now = self.stack_now(epoch);
                        if let Some(d) = self.driver.as_mut() {
                            let core = d.core.clone();
                            let _ = core.stack().shutdown(now, &mut d.pipe.dev);
                        }
                        self.phase = Phase::Leaving;
                    }
                }
                busy
            }
            Phase::Leaving => {
                let now = self.shared.clock.now();
                let core = d.core.clone();
                match d
                    .upgrade
                    .leave_step(&core.shared, 0, d.pipe.dev.io_mut(), now)
                {
                    Leave::Waiting => {}
                    Leave::Left => {
                        self.left = true;
                        self.phase = Phase::Ended;
                    }
                    Leave::NotHanded | Leave::Failed => self.phase = Phase::Ended,
                }
                true
            }
            Phase::Ended => false,
        }
    }

    /// The echo server's turn: listens (once), accepts, echoes, closes what the peer closed.
    /// Once the process drains and every connection is done, its future returns.
    pub(super) fn app_turn(&mut self) -> Result<(), String> {
        if self.phase != Phase::Serving {
            return Ok(());
        }
        let Some(d) = self.driver.as_ref() else {
            return Ok(());
        };
        let core = d.core.clone();
        let draining = self.shared.life.draining();
        if !self.listening && !draining && self.shared.clock.now() >= self.listen_at {
            core.own_port(Proto::Tcp, PORT)
                .map_err(|e| format!("owning the port: {e}"))?;
            core.stack()
                .listen_tcp_on(None, PORT, None)
                .map_err(|e| format!("listen: {e}"))?;
            self.listening = true;
        }
        let mut stack = core.stack();
        while let Some(id) = stack.accept(PORT) {
            self.accepted += 1;
            self.conns.push(Conn {
                id,
                pending: Vec::new(),
                eof: false,
                shut: false,
            });
        }
        let mut buf = [0u8; 4096];
        for c in &mut self.conns {
            if let Err(e) = echo(&mut stack, c, &mut buf) {
                // The connection ended abnormally (reset): dropped, as a task would drop its
                // stream after an error.
                tracing::debug!("echo: {e}");
                stack.release(c.id);
                c.shut = true;
                c.eof = true;
                c.pending.clear();
            }
        }
        self.conns
            .retain(|c| !(c.shut && c.eof && c.pending.is_empty()));
        // A listener with connections half open or queued stays open through an upgrade's
        // drain (`listeners_may_close`), and a real accept loop keeps accepting until it closes.
        // The grace's end stops the cores, and with them the application's futures.
        let listener_closed = !stack.is_listening(PORT);
        drop(stack);
        let stopped = self.shared.life.stop.load(Ordering::Relaxed);
        if (draining && listener_closed && self.conns.is_empty()) || stopped {
            // The accept loop ended (the listener closed) and every connection task is done.
            self.shared.app_done();
            self.phase = Phase::Lingering;
        }
        Ok(())
    }

    /// What the core would sleep until, idle (`Stack::sleep_deadline`, as the driver's nap
    /// reads it), on the world's clock.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let d = self.driver.as_ref()?;
        let at = d.core.stack().sleep_deadline()?;
        Some(d.epoch + std::time::Duration::from_micros(at.total_micros().max(0) as u64))
    }

    /// The queue, while the core holds it.
    pub(super) fn queue(&mut self) -> Option<&mut XskQueue> {
        self.driver.as_mut().map(|d| d.pipe.dev.io_mut())
    }

    /// The process is killed: its queue closes as a crash closes it (nothing said on the
    /// exchange), its connections vanish without a word.
    pub(super) fn crash(&mut self) {
        if let Some(d) = self.driver.take() {
            let Driver { pipe, .. } = d;
            pipe.dev.into_io().crash_for_simulation();
        }
        self.phase = Phase::Ended;
        self.gone.store(true, Ordering::Release);
    }

    /// The process ends: its queue closes (what it held goes with it, said on the exchange).
    pub(super) fn end(&mut self) {
        self.driver.take();
        self.phase = Phase::Ended;
        self.gone.store(true, Ordering::Release);
    }
}

/// Echoes what `c` received; Err once the connection failed.
fn echo(stack: &mut Stack, c: &mut Conn, buf: &mut [u8]) -> std::io::Result<()> {
    loop {
        while !c.pending.is_empty() {
            match stack.tcp_write(c.id, &c.pending, None) {
                Poll::Pending => return Ok(()),
                Poll::Ready(Ok(k)) => {
                    c.pending.drain(..k);
                }
                Poll::Ready(Err(e)) => return Err(e),
            }
        }
        if c.eof {
            break;
        }
        match stack.tcp_read(c.id, buf, None) {
            Poll::Pending => break,
            Poll::Ready(Ok(0)) => c.eof = true,
            Poll::Ready(Ok(n)) => c.pending.extend_from_slice(&buf[..n]),
            Poll::Ready(Err(e)) => return Err(e),
        }
    }
    if c.eof && c.pending.is_empty() && !c.shut {
        stack.tcp_shutdown(c.id)?;
        stack.release(c.id);
        c.shut = true;
    }
    Ok(())
}
