//! The world of one simulated run: the in-memory kernel and program, the peer, the old
//! process and (once an upgrade starts) the new one, stepped on the virtual clock in an order
//! and with faults the seed picks, and checked after every step.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use corelane_stack::smoltcp::wire::{IpCidr, Ipv4Address};
use corelane_xsk::sim::SimKernel;
use corelane_xsk::{MemProgram, PendingJoin, XskConfig, XskQueue};

use super::peer::{Peer, State};
use super::process::{self, Phase, Process};
use super::talk::{self, MemTalk};
use super::{Failure, Fault, Outcome, Report, Rng};
use crate::clock::Clock;
use crate::control::Shared;
use crate::queues::RestoreQueues;
use crate::upgrade::{JOIN_WAIT, PartnerProcess};
use crate::upgrade_handover::{Extras, OldRun, RunSecret};
use crate::upgrade_new::NewSide;
use crate::upgrade_old::OldSide;

const SERVER: Ipv4Address = Ipv4Address::new(10, 77, 0, 2);
const PEER: Ipv4Address = Ipv4Address::new(10, 77, 0, 1);
/// The longest a run may take, in simulated time.
const TIME_LIMIT: Duration = Duration::from_secs(300);
/// The drain's grace after a switch.
const GRACE: Duration = Duration::from_secs(30);

/// Where the new process is.
enum New {
    None,
    /// Connected to the old process; waits for the hand-over (its `build`).
    Connecting {
        talk: MemTalk,
    },
    /// Built: its socket bound beside the old process's; its `run` starts at `run_at`.
    Built {
        shared: Arc<Shared>,
        join: PendingJoin,
        talk: MemTalk,
        extras: Extras,
        run_at: Instant,
    },
    /// Its core starting: the rings asked for, since `since`.
    Starting {
        shared: Arc<Shared>,
        join: PendingJoin,
        talk: MemTalk,
        extras: Extras,
        since: Instant,
    },
    /// Running: its core serves, its side of the upgrade polled.
    Running {
        process: Box<Process>,
        side: NewSide,
        talk: MemTalk,
        extras: Extras,
    },
    /// Ended.
    Gone,
}

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
        };
        if upgrade {
            // One fault in two runs, each of the kinds about as often.
            match rng.below(16) {
                0 => {
                    plan.run_delay = JOIN_WAIT + ms(&mut rng, 1, 3000);
                    faults.push(Fault::SlowToRun);
                }
                1 => {
                    plan.listen_delay = crate::upgrade_join::LISTEN_WAIT + ms(&mut rng, 1, 2000);
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
        let stack_seed = rng.next();
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
            rng.next(),
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
        Ok(busy)
    }

    /// The new process's turn, whatever it is at.
    fn new_turn(&mut self) -> Result<bool, Failure> {
        let now = self.clock.now();
        let new = std::mem::replace(&mut self.new, New::Gone);
        let (next, busy) = match new {
            New::Connecting { mut talk } => match talk.take_handover() {
                Some((offers, text)) => {
                    let extras = Extras::parse(&text)
                        .ok_or_else(|| self.fail(format!("the extras `{text}` do not parse")))?;
                    let mut offers = offers;
                    let offer = offers.pop().ok_or_else(|| self.fail("no offer"))?;
                    let join = PendingJoin::bind_sim(&self.kernel, offer)
                        .map_err(|e| self.fail(format!("binding beside the old process: {e}")))?;
                    let addr = IpCidr::new(SERVER.into(), 24);
                    let shared = process::shared(&self.program, addr, &self.clock)
                        .map_err(|e| self.fail(e.to_string()))?;
                    // Whether the old process has ended, as its pidfd tells the new one.
                    *crate::lock::lock(&shared.upgrades.partner_process) =
                        Some(PartnerProcess::Sim(self.old.gone.clone()));
                    let (generation, fd) = (extras.generation, join.fd());
                    shared
                        .steer
                        .run(move |s| s.register_in(generation, 0, fd))
                        .map_err(|e| self.fail(e.to_string()))?
                        .map_err(|e| self.fail(e.to_string()))?;
                    let run_at = now + self.plan.run_delay;
                    (
                        New::Built {
                            shared,
                            join,
                            talk,
                            extras,
                            run_at,
                        },
                        true,
                    )
                }
                None if talk.ended() => (New::Gone, true),
                None => (New::Connecting { talk }, false),
            },
            New::Built {
                shared,
                join,
                talk,
                extras,
                run_at,
            } if now >= run_at => match join.ask() {
                Ok(()) => (
                    New::Starting {
                        shared,
                        join,
                        talk,
                        extras,
                        since: now,
                    },
                    true,
                ),
                // Called off meanwhile: `run` fails at once.
                Err(_) => (New::Gone, true),
            },
            b @ New::Built { .. } => (b, false),
            New::Starting {
                shared,
                join,
                talk,
                extras,
                since,
            } => match join.try_take_over() {
                Ok(Ok(queue)) => {
                    shared.upgrades.start_listing(1);
                    let seed = match extras.secret {
                        RunSecret::Seed(s) => s,
                        RunSecret::Key([a, _]) => a,
                    };
                    let mut process = Box::new(Process::new(
                        shared,
                        queue,
                        IpCidr::new(SERVER.into(), 24),
                        [2, 0, 0, 0, 0, 2],
                        seed ^ 1,
                        self.start,
                    ));
                    process.listen_at = now + self.plan.listen_delay;
                    (
                        New::Running {
                            process,
                            side: NewSide::Listening { since: now },
                            talk,
                            extras,
                        },
                        true,
                    )
                }
                Ok(Err(join)) if now.duration_since(since) > Duration::from_secs(5) => {
                    if join.withdraw() {
                        (New::Gone, true)
                    } else {
                        (
                            New::Starting {
                                shared,
                                join,
                                talk,
                                extras,
                                since,
                            },
                            false,
                        )
                    }
                }
                Ok(Err(join)) => (
                    New::Starting {
                        shared,
                        join,
                        talk,
                        extras,
                        since,
                    },
                    false,
                ),
                Err(_) => (New::Gone, true),
            },
            New::Running {
                mut process,
                side,
                talk,
                extras,
            } => {
                let busy = process.turn();
                process
                    .app_turn()
                    .map_err(|e| self.fail(format!("new process: {e}")))?;
                if process.shared.life.stop.load(Ordering::Acquire) {
                    // Its run ended (it stood down): the process exits.
                    process.end();
                    (New::Gone, true)
                } else {
                    (
                        New::Running {
                            process,
                            side,
                            talk,
                            extras,
                        },
                        busy,
                    )
                }
            }
            other => (other, false),
        };
        self.new = next;
        Ok(busy)
    }

    /// The upgrade: started when the plan says, the old side's machine polled, the new side's
    /// polled once its core runs; the old process's end closes the connection.
    fn upgrade_step(&mut self) -> Result<(), Failure> {
        let now = self.clock.now();
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
                Some(PartnerProcess::Sim(gone.clone()));
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

impl World {
    /// Kills the process the plan names once its time has come.
    fn faults_due(&mut self) {
        let Some((who, after)) = self.plan.crash else {
            return;
        };
        if self.crashed
            || self
                .started
                .is_none_or(|s| self.clock.now().duration_since(s) < after)
        {
            return;
        }
        self.crashed = true;
        match who {
            Crash::Old => {
                self.old.crash();
                // Its end of the connection closes with it.
                if self.old_side.take().is_some() || self.outcome == Outcome::Pending {
                    self.outcome = Outcome::TakenOver;
                }
            }
            Crash::New => {
                if let New::Running { process, .. } = &mut self.new {
                    process.crash();
                }
                // Whatever it held (a pending join, its end of the connection) closes.
                self.new = New::Gone;
                self.new_gone.store(true, Ordering::Release);
            }
        }
    }

    /// After every step: no frame in two places across both processes and the kernel.
    fn check_step(&mut self) -> Result<(), Failure> {
        let mut queues: Vec<&mut XskQueue> = Vec::new();
        if let Some(q) = self.old.queue() {
            queues.push(q);
        }
        if let New::Running { process, .. } = &mut self.new
            && let Some(q) = process.queue()
        {
            queues.push(q);
        }
        let m = self.kernel.misplaced(&mut queues);
        let m = m.map_err(|e| self.fail(e))?;
        if !m.twice.is_empty() {
            return Err(self.fail(format!(
                "frames in two places at once: {:?} ({})",
                m.twice,
                self.describe()
            )));
        }
        Ok(())
    }

    /// The processes still serving.
    fn servers(&mut self) -> Vec<&mut Process> {
        let mut v = Vec::new();
        if self.old.driver.is_some() {
            v.push(&mut self.old);
        }
        if let New::Running { process, .. } = &mut self.new
            && process.driver.is_some()
        {
            v.push(process.as_mut());
        }
        v
    }

    /// Whether the run is over: every connection of the peer ended, the upgrade (if any)
    /// settled either way, and the survivor has nothing left to finish; or no process serves.
    fn finished(&mut self) -> bool {
        if self.servers().is_empty() {
            self.outcome = Outcome::ServerGone;
            return true;
        }
        if !self.peer.finished() || self.old_side.is_some() {
            return false;
        }
        if self.plan.upgrade_at.is_some() && self.started.is_none() {
            return false;
        }
        let new_settled = match &self.new {
            New::None | New::Gone => true,
            New::Running { side, .. } => matches!(side, NewSide::Ended),
            _ => false,
        };
        let old_settled = matches!(self.old.phase, Phase::Serving | Phase::Ended);
        // The survivor's queue is its alone again (the upgrade's last move on it is done),
        // and its stack has nothing left to finish.
        new_settled
            && old_settled
            && self.servers().iter().all(|p| {
                p.driver.as_ref().is_some_and(|d| {
                    d.core.stack().settled() && d.pipe.dev.io().upgrade_phase().is_none()
                })
            })
    }

    /// Moves the clock on: a little after a busy step, else to the next thing due.
    fn advance(&mut self, busy: bool) {
        if busy {
            self.clock
                .advance(Duration::from_micros(20 + self.rng.below(200)));
            return;
        }
        let now = self.clock.now();
        let mut next: Vec<Instant> = Vec::new();
        if let Some(t) = self.peer.next_deadline() {
            next.push(self.start + Duration::from_micros(t.total_micros().max(0) as u64));
        }
        for p in self.servers() {
            next.extend(p.next_deadline());
            next.push(p.listen_at);
        }
        if let Some(t) = self.plan.upgrade_at.filter(|_| self.started.is_none()) {
            next.push(self.start + t);
        }
        if let (Some((_, after)), Some(s), false) = (self.plan.crash, self.started, self.crashed) {
            next.push(s + after);
        }
        if let New::Built { run_at, .. } = &self.new {
            next.push(*run_at);
        }
        // What the machines and the cores wait for (a word, a stage, a deadline) comes no
        // later than this, or is looked at this often.
        let cap = now + Duration::from_millis(if self.started.is_some() { 50 } else { 500 });
        let at = next
            .into_iter()
            .filter(|&t| t > now)
            .min()
            .unwrap_or(cap)
            .min(cap);
        self.clock
            .advance(at.duration_since(now).max(Duration::from_micros(10)));
    }

    /// At the end: every frame in exactly one place, every connection done (or, where a
    /// process was killed, reset with a reason), the program back to one generation.
    fn check_end(&mut self) -> Result<(), Failure> {
        if self.outcome == Outcome::ServerGone {
            return Ok(());
        }
        let mut queues: Vec<&mut XskQueue> = Vec::new();
        if let Some(q) = self.old.queue() {
            queues.push(q);
        }
        if let New::Running { process, .. } = &mut self.new
            && let Some(q) = process.queue()
        {
            queues.push(q);
        }
        let m = self.kernel.misplaced(&mut queues);
        let m = m.map_err(|e| self.fail(e))?;
        if !m.twice.is_empty() || !m.lost.is_empty() {
            return Err(self.fail(format!(
                "at the end, frames in two places {:?}, in none {:?} ({})",
                m.twice,
                m.lost,
                self.describe()
            )));
        }
        if !self.crashed {
            for (i, c) in self.peer.conns.iter().enumerate() {
                if let State::Failed(e) = &c.state {
                    return Err(self.fail(format!(
                        "connection {i} failed ({e}) though no process was killed ({})",
                        self.describe()
                    )));
                }
            }
        }
        let (current, split) = self.program.upgrade();
        let kept = self.program.kept_flows();
        let want = match &self.new {
            New::Running { extras, .. } => extras.generation,
            _ => 0,
        };
        if split || kept != 0 || current != want {
            return Err(self.fail(format!(
                "the program at the end: generation {current} (want {want}), split {split}, {kept} \
                 kept connection(s) ({})",
                self.describe()
            )));
        }
        Ok(())
    }

    /// The state of things, for a failure's message.
    fn describe(&self) -> String {
        let new = match &self.new {
            New::None => "none".to_string(),
            New::Connecting { .. } => "connecting".into(),
            New::Built { .. } => "built".into(),
            New::Starting { .. } => "starting".into(),
            New::Running { process, side, .. } => format!("running {side:?} {:?}", process.phase),
            New::Gone => "gone".into(),
        };
        let side = self.old_side.as_ref().map(|(s, _)| format!("{s:?}"));
        let conns: Vec<String> = self
            .peer
            .conns
            .iter()
            .map(|c| format!("{:?}", c.state))
            .collect();
        format!(
            "old process {:?}, its side {side:?}; new process {new}; outcome {:?}; faults {:?}; \
             peer {conns:?}",
            self.old.phase, self.outcome, self.faults
        )
    }
}
