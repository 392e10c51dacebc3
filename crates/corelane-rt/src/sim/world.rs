//! The world of one simulated run: the in-memory kernel and program, the peer, the old
//! process and (once an upgrade starts) the new one, stepped on the virtual clock in an order
//! and with faults the seed picks, and checked after every step.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::host::mem::{MemProgram, SimKernel, XskConfig};
use corelane_stack::smoltcp::wire::{IpCidr, Ipv4Address};

use super::peer::{Peer, State};
use super::process::{self, Phase, Process};
use super::talk::{self, MemTalk};
use super::{Failure, Fault, Outcome, Report, Rng};
use successor::New;

#[path = "world_checks.rs"]
mod checks;
#[path = "successor.rs"]
mod successor;
use crate::clock::Clock;
use crate::queues::RestoreQueues;
use crate::sim::SimProcess;
use crate::upgrade::JOIN_WAIT;
use crate::upgrade_old::OldRun;
use crate::upgrade_old::OldSide;
use crate::upgrade_words::RunSecret;

const SERVER: Ipv4Address = Ipv4Address::new(10, 77, 0, 2);
const PEER: Ipv4Address = Ipv4Address::new(10, 77, 0, 1);
/// The longest a run may take, in simulated time.
const TIME_LIMIT: Duration = Duration::from_secs(300);
/// The drain's grace after a switch.
const GRACE: Duration = Duration::from_secs(30);
/// The grace of a graceful shutdown without an upgrade.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// What the seed decided for a run before it starts.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// When the new process connects (None: no upgrade).
    upgrade_at: Option<Duration>,
    /// How long the new process takes between `build` and `run`.
    run_delay: Duration,
    /// How long its application takes to listen once it runs.
    listen_delay: Duration,
    /// How long each side's words take to be heard.
    lag: [Duration; 2],
    /// Each side's words are heard twice.
    twice: [bool; 2],
    /// A process killed, and when (after the upgrade starts).
    crash: Option<(Crash, Duration)>,
    /// A graceful shutdown of a process not upgraded, and when.
    drain_at: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crash {
    Old,
    New,
}

pub(super) struct World {
    seed: u64,
    step: u64,
    rng: Rng,
    clock: Clock,
    start: Instant,
    program: MemProgram,
    kernel: SimKernel,
    peer: Peer,
    old: Process,
    old_side: Option<(OldSide, MemTalk)>,
    restore: RestoreQueues,
    secret: RunSecret,
    new: New,
    plan: Plan,
    faults: Vec<Fault>,
    /// The upgrade started at (simulated time).
    started: Option<Instant>,
    crashed: bool,
    outcome: Outcome,
    call_offs: u32,
    /// A graceful shutdown began, with the connections the application had accepted then.
    drained: Option<Vec<usize>>,
    /// The new process has ended (what its pidfd says to the old one).
    new_gone: Arc<std::sync::atomic::AtomicBool>,
}

fn ms(rng: &mut Rng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(lo + rng.below(hi - lo + 1))
}

impl World {
    pub(super) fn new(seed: u64) -> Result<World, Failure> {
        let fail = |what: String| Failure {
            seed,
            step: 0,
            at_ms: 0,
            what,
        };
        let mut rng = Rng(seed);
        let mut faults = Vec::new();
        let upgrade = rng.below(10) != 0;
        let mut plan = Plan {
            upgrade_at: upgrade.then(|| ms(&mut rng, 5, 400)),
            run_delay: ms(&mut rng, 0, 50),
            listen_delay: ms(&mut rng, 0, 30),
            lag: [Duration::ZERO; 2],
            twice: [false; 2],
            crash: None,
            drain_at: None,
        };
        if !upgrade && rng.below(2) == 0 {
            plan.drain_at = Some(ms(&mut rng, 0, 900));
            faults.push(Fault::Drain);
        }
        if upgrade {
            // One fault in two runs, each of the kinds about as often.
            match rng.below(16) {
                0 => {
                    plan.run_delay = JOIN_WAIT + ms(&mut rng, 1, 3000);
                    faults.push(Fault::SlowToRun);
                }
                1 => {
                    plan.listen_delay = crate::upgrade_new::LISTEN_WAIT + ms(&mut rng, 1, 2000);
                    faults.push(Fault::SlowToListen);
                }
                2 => {
                    // Late enough that the old process gives up in between.
                    plan.lag[1] = JOIN_WAIT + ms(&mut rng, 0, 100);
                    faults.push(Fault::LateJoined);
                }
                3 => {
                    plan.lag = [ms(&mut rng, 1, 500), ms(&mut rng, 1, 500)];
                    faults.push(Fault::Late);
                }
                4 => {
                    plan.twice = [rng.below(2) == 0, true];
                    faults.push(Fault::Twice);
                }
                5 | 6 => {
                    plan.crash = Some((Crash::New, ms(&mut rng, 0, 600)));
                    faults.push(Fault::NewCrashes);
                }
                7 => {
                    plan.crash = Some((Crash::Old, ms(&mut rng, 0, 300)));
                    faults.push(Fault::OldCrashes);
                }
                _ => {}
            }
        }
        let clock = Clock::virtual_clock();
        let start = clock.now();
        let config = XskConfig {
            frames: 256,
            frame_size: 2048,
            ring_size: 64,
            ..XskConfig::default()
        };
        let (kernel, queue) = SimKernel::open(&config).map_err(|e| fail(e.to_string()))?;
        // Half the runs on a zero-copy driver: it waits for a wakeup once it found the fill
        // ring empty, and now and then finds it so just as the ring is filled (the race).
        let zero_copy = rng.below(2) == 0;
        if zero_copy {
            kernel.fill_like_zero_copy();
            faults.push(Fault::ZeroCopyFill);
        }
        let program = MemProgram::new();
        program.add_queue(0, kernel.clone());
        let addr = IpCidr::new(SERVER.into(), 24);
        let shared = process::shared(&program, addr, &clock).map_err(|e| fail(e.to_string()))?;
        shared
            .steer
            .run({
                let fd = queue.fd();
                move |s| s.register(0, fd)
            })
            .map_err(|e| fail(e.to_string()))?
            .map_err(|e| fail(e.to_string()))?;
        let stack_seed = rng.draw();
        let old = Process::new(shared, queue, addr, [2, 0, 0, 0, 0, 2], stack_seed, start);
        // Connections: a few at the start, more through the upgrade's window.
        let n = 2 + rng.below(5) as usize;
        let conns: Vec<(i64, u64)> = (0..n)
            .map(|_| {
                let at = rng.below(900_000) as i64;
                let bytes = 1 + rng.below(24_000);
                (at, bytes)
            })
            .collect();
        let peer = Peer::new(
            IpCidr::new(PEER.into(), 24),
            std::net::SocketAddr::from((SERVER.octets(), process::PORT)),
            rng.draw(),
            &conns,
        );
        Ok(World {
            seed,
            step: 0,
            rng,
            clock,
            start,
            program,
            kernel,
            peer,
            old,
            old_side: None,
            restore: RestoreQueues::new("sim0", None, None),
            secret: RunSecret::Seed(stack_seed),
            new: New::None,
            plan,
            faults,
            started: None,
            crashed: false,
            outcome: Outcome::NotStarted,
            call_offs: 0,
            new_gone: Arc::default(),
            drained: None,
        })
    }

    fn since_start(&self) -> Duration {
        self.clock.now().saturating_duration_since(self.start)
    }

    fn fail(&self, what: impl Into<String>) -> Failure {
        Failure {
            seed: self.seed,
            step: self.step,
            at_ms: self.since_start().as_millis() as u64,
            what: what.into(),
        }
    }

    /// The stacks' time now.
    fn stack_now(&self) -> corelane_stack::smoltcp::time::Instant {
        corelane_stack::smoltcp::time::Instant::from_micros(self.since_start().as_micros() as i64)
    }

    /// Runs to the end.
    pub(super) fn run(mut self) -> Result<Report, Failure> {
        let trace = std::env::var_os("CORELANE_RUNTIME_SIM_TRACE").is_some_and(|v| v == "1");
        loop {
            let busy = self.step_once()?;
            if trace {
                eprintln!(
                    "step {} at {:?}: {}",
                    self.step,
                    self.since_start(),
                    self.describe()
                );
            }
            self.check_step()?;
            if self.finished() {
                break;
            }
            if self.since_start() > TIME_LIMIT {
                return Err(self.fail(format!(
                    "not settled after {TIME_LIMIT:?}: {}",
                    self.describe()
                )));
            }
            self.advance(busy);
            self.step += 1;
        }
        self.check_end()?;
        Ok(Report {
            seed: self.seed,
            outcome: self.outcome,
            faults: self.faults.clone(),
            call_offs: self.call_offs,
            connections: self.peer.conns.len(),
            reset: self
                .peer
                .conns
                .iter()
                .filter(|c| matches!(c.state, State::Failed(_)))
                .count(),
            steps: self.step,
            simulated: self.since_start(),
        })
    }

    /// One step: the peer, each process's core and application (in an order the seed picks,
    /// and now and then one left out), the frames between them, the upgrade's two sides and
    /// the faults due.
    fn step_once(&mut self) -> Result<bool, Failure> {
        let now = self.stack_now();
        let (mut busy, frames) = self.peer.turn(now).map_err(|e| self.fail(e))?;
        for f in frames {
            self.program.receive(0, &f);
        }
        let old_first = self.rng.below(2) == 0;
        for k in 0..2 {
            let old = (k == 0) == old_first;
            if self.rng.below(8) == 0 {
                continue;
            }
            if old {
                busy |= self.old.turn();
                self.old
                    .app_turn()
                    .map_err(|e| self.fail(format!("old process: {e}")))?;
            } else {
                busy |= self.new_turn()?;
            }
        }
        for f in self.kernel.take_wire() {
            self.peer.wire.inject(&f);
        }
        self.upgrade_step()?;
        self.faults_due();
        if self.faults.contains(&Fault::ZeroCopyFill) && self.rng.below(16) == 0 {
            self.kernel.fill_runs_dry_now();
        }
        Ok(busy)
    }

    /// The upgrade: started when the plan says, the old side's machine polled, the new side's
    /// polled once its core runs; the old process's end closes the connection.
    fn upgrade_step(&mut self) -> Result<(), Failure> {
        let now = self.clock.now();
        if self.drained.is_none() && self.plan.drain_at.is_some_and(|t| self.since_start() >= t) {
            self.drained = Some(self.peer.answered());
            crate::StopHandle(Arc::downgrade(&self.old.shared)).shutdown(DRAIN_GRACE);
        }
        if self.started.is_none()
            && self
                .plan
                .upgrade_at
                .is_some_and(|t| self.since_start() >= t)
            && self.old.phase == Phase::Serving
        {
            self.started = Some(now);
            let (a, b) = talk::pair(&self.clock, self.plan.lag, self.plan.twice);
            let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
            *crate::lock::lock(&self.old.shared.upgrades.partner_process) =
                Some(Box::new(SimProcess(gone.clone())));
            self.new_gone = gone;
            let run = OldRun {
                shared: &self.old.shared,
                secret: self.secret,
                grace: GRACE,
                restore: &self.restore,
            };
            self.old_side = Some((OldSide::start(&run, now), a));
            self.new = New::Connecting { talk: b };
            self.outcome = Outcome::Pending;
        }
        if let Some((side, talk)) = &mut self.old_side {
            let run = OldRun {
                shared: &self.old.shared,
                secret: self.secret,
                grace: GRACE,
                restore: &self.restore,
            };
            side.poll(&run, talk, now);
            match side.over() {
                Some(Ok(())) => self.outcome = Outcome::Upgraded,
                Some(Err(_)) => {
                    self.outcome = Outcome::CalledOff;
                    self.call_offs += 1;
                    // The connection ends: this process serves on.
                    self.old_side = None;
                }
                None => {}
            }
        }
        if self.old.phase == Phase::Ended && self.old.driver.is_some() {
            // Its core has ended: every frame of the queue is in one place, across both
            // processes, before the process exits with what it holds.
            self.check_frames_at_exit()?;
            // Every core has left (or failed to): the connection ends, and the process exits.
            if let Some((_, mut talk)) = self.old_side.take() {
                talk.close();
            }
            self.old.end();
        }
        if let New::Running {
            process,
            side,
            talk,
            extras,
        } = &mut self.new
        {
            side.poll(&process.shared, extras, talk, now);
        }
        if matches!(self.new, New::Gone) {
            self.new_gone.store(true, Ordering::Release);
        }
        Ok(())
    }
}
