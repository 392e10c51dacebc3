//! A seeded simulation of an upgrade of one queue: the old process's queue and the new one's,
//! on the in-memory kernel, each step chosen by the seed (traffic, a turn of either process,
//! the upgrade's next move or a fault: a call-off by the old process at any point, the new
//! process standing down, giving up before it takes the rings, ending or crashing), and after
//! every step every frame checked to be in at most one place across both processes' ledgers,
//! the exchange's two rings and the kernel's rings. At the end the upgrade is finished (or
//! called off), every frame is in exactly one place, and the survivor still serves.
//!
//! `cargo run --release -p corelane-bench --bin upgrade-sim -- --seeds 100000` sweeps; a
//! failing seed replays with `--seed N`.

use std::collections::BTreeSet;

use corelane_frame::{FrameIo, FrameState, SplitMix64 as Rng};

use super::SimKernel;
use crate::socket::join::PendingJoin;
use crate::socket::partner::CallOff;
use crate::{XskConfig, XskFrame, XskQueue};

/// A run's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// The new process took over and the old one left.
    Upgraded,
    /// The upgrade was called off; the old process serves on.
    CalledOff,
    /// No upgrade was started.
    NotStarted,
}

/// What one run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// The faults injected, in order.
    pub faults: Vec<&'static str>,
    /// Upgrades called off (the old process took its queue back) before the last outcome.
    pub call_offs: usize,
    /// Requests the kernel delivered, and echoes sent.
    pub delivered: usize,
    /// Echoes on the wire.
    pub echoed: usize,
}

/// A run that broke an invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The seed, to replay it.
    pub seed: u64,
    /// The step it failed at.
    pub step: usize,
    /// What broke.
    pub what: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {} step {}: {} (replay: cargo run --release -p corelane-bench --bin \
             upgrade-sim -- --seed {})",
            self.seed, self.step, self.what, self.seed
        )
    }
}

/// Where the new process is.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // One per run, moved a few times a step.
enum New {
    None,
    /// Bound beside the old one (its `build`).
    Bound(PendingJoin),
    /// Asked for the rings (its cores starting).
    Asked(PendingJoin),
    /// Holds the rings.
    Joined(XskQueue),
    /// Gone (its queue dropped, or crashed).
    Gone,
}

const REQUEST: u8 = b'q';
const ANSWER: u8 = b'r';

/// A request: its number, the tag, then bytes that follow from the number (any corruption
/// of the frame shows).
fn request(seq: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len.max(9)];
    b[..8].copy_from_slice(&seq.to_le_bytes());
    b[8] = REQUEST;
    for (k, x) in b[9..].iter_mut().enumerate() {
        *x = (seq as u8).wrapping_mul(31).wrapping_add(k as u8);
    }
    b
}

/// Answers every request waiting on `q` in its own frame (the tag changed), as a server
/// answering in place does.
fn echo(q: &mut XskQueue) {
    let mut got = std::collections::VecDeque::new();
    q.recv(&mut got, 64);
    let mut out: Vec<XskFrame> = got.into_iter().collect();
    for f in &mut out {
        let len = corelane_frame::Frame::len(f);
        let b = q.bytes_mut(f, len);
        if b.len() > 8 {
            b[8] = ANSWER;
        }
    }
    let _ = q.send(&mut out);
}

fn turn(q: &mut XskQueue) {
    echo(q);
    let _ = q.complete();
}

struct Run {
    seed: u64,
    rng: Rng,
    kernel: SimKernel,
    old: Option<XskQueue>,
    new: New,
    /// The program steers to the new process (the switch).
    switched: bool,
    /// The old process is calling the upgrade off.
    calling_off: bool,
    /// The new process has ended (its pidfd would say so).
    new_ended: bool,
    outcome: Outcome,
    faults: Vec<&'static str>,
    call_offs: usize,
    next_seq: u64,
    delivered: BTreeSet<u64>,
    echoed: BTreeSet<u64>,
    step: usize,
}

impl Run {
    fn fail(&self, what: impl Into<String>) -> Failure {
        Failure {
            seed: self.seed,
            step: self.step,
            what: format!("{} (after: {})", what.into(), self.faults.join("; ")),
        }
    }

    fn deliver(&mut self, n: u64) {
        for _ in 0..n {
            let len = 9 + self.rng.below(200) as usize;
            let seq = self.next_seq;
            self.next_seq += 1;
            if self.kernel.deliver(&request(seq, len)) {
                self.delivered.insert(seq);
            }
        }
    }

    /// The wire: each answer once, for a request delivered, its bytes intact.
    fn read_wire(&mut self) -> Result<(), Failure> {
        for f in self.kernel.take_wire() {
            let seq = u64::from_le_bytes(f[..8].try_into().unwrap_or_default());
            let mut want = request(seq, f.len());
            want[8] = ANSWER;
            if f != want {
                return Err(self.fail(format!("answer {seq} corrupted on the wire")));
            }
            if !self.delivered.contains(&seq) {
                return Err(self.fail(format!("answer {seq} to a request never delivered")));
            }
            if !self.echoed.insert(seq) {
                return Err(self.fail(format!("request {seq} answered twice")));
            }
        }
        Ok(())
    }

    /// Every frame in at most one place (exactly one with `all`).
    fn check(&mut self, all: bool) -> Result<(), Failure> {
        let mut queues: Vec<&mut XskQueue> = Vec::new();
        if let Some(a) = &mut self.old {
            queues.push(a);
        }
        if let New::Joined(b) = &mut self.new {
            queues.push(b);
        }
        let places = self.kernel.misplaced(&mut queues);
        let m = places.map_err(|e| self.fail(e))?;
        if !m.twice.is_empty() {
            return Err(self.fail(format!("frames in two places: {:?}", m.twice)));
        }
        if all && !m.lost.is_empty() {
            let states = |q: Option<&XskQueue>| -> Vec<Option<FrameState>> {
                m.lost
                    .iter()
                    .map(|&i| q.and_then(|q| q.pool.ledger().get(i)))
                    .collect()
            };
            let b = match &self.new {
                New::Joined(b) => Some(b),
                _ => None,
            };
            return Err(self.fail(format!(
                "frames in no place: {:?} (old process's ledger {:?}, new's {:?}; {:?})",
                m.lost,
                states(self.old.as_ref()),
                states(b),
                self.outcome
            )));
        }
        Ok(())
    }

    fn old(&mut self) -> Result<&mut XskQueue, Failure> {
        let f = self.fail("the old process is gone");
        self.old.as_mut().ok_or(f)
    }

    /// The upgrade's next move, or a fault.
    fn upgrade_step(&mut self) -> Result<(), Failure> {
        if self.calling_off {
            return self.call_off();
        }
        let choice = self.rng.below(100);
        match std::mem::replace(&mut self.new, New::None) {
            New::None | New::Gone if self.old.is_some() && !self.switched => {
                let offer = self
                    .old()?
                    .offer_upgrade()
                    .map_err(|e| self.fail(e.to_string()))?;
                let p = PendingJoin::bind_sim(&self.kernel, offer)
                    .map_err(|e| self.fail(e.to_string()))?;
                // Another process: the last one's end says nothing of this one.
                self.new_ended = false;
                self.new = New::Bound(p);
            }
            New::None => {}
            New::Bound(p) => match choice {
                0..10 => self.start_call_off("the old process calls off before the cores start"),
                10..20 => {
                    self.faults
                        .push("the new process goes before its cores start");
                    drop(p);
                    self.new = New::Gone;
                    self.start_call_off("its connection ended");
                }
                _ => match p.ask() {
                    Ok(()) => self.new = New::Asked(p),
                    Err(e) => return Err(self.fail(format!("asking for the rings: {e}"))),
                },
            },
            New::Asked(p) => match choice {
                0..8 => {
                    self.new = New::Asked(p);
                    self.start_call_off("the old process calls off while the rings are asked for");
                }
                8..14 => {
                    self.faults
                        .push("the new process goes while asking for the rings");
                    drop(p);
                    self.new = New::Gone;
                    self.start_call_off("its connection ended");
                }
                _ => match p.try_take_over() {
                    Ok(Ok(q)) => self.new = New::Joined(q),
                    Ok(Err(p)) => self.new = New::Asked(p),
                    Err(e) => return Err(self.fail(format!("taking the rings over: {e}"))),
                },
            },
            New::Joined(mut b) if !self.switched => match choice {
                0..12 => {
                    self.new = New::Joined(b);
                    self.start_call_off("the new process did not say it joined in time");
                }
                12..20 => {
                    self.faults.push("the new process stands down");
                    b.stand_down();
                    self.new = New::Joined(b);
                    self.start_call_off("the new process gave up");
                }
                20..26 => {
                    self.faults.push("the new process crashes");
                    b.crash_for_simulation();
                    self.new = New::Gone;
                    self.new_ended = true;
                    self.start_call_off("its connection ended");
                }
                26..32 => {
                    self.faults.push("the new process's queue ends");
                    drop(b);
                    self.new = New::Gone;
                    self.start_call_off("its connection ended");
                }
                _ => {
                    // `joined`, then the switch.
                    self.kernel.steer_to(&b);
                    self.switched = true;
                    self.new = New::Joined(b);
                }
            },
            New::Joined(b) => {
                self.new = New::Joined(b);
                if self.old.is_some() {
                    self.leave()?;
                }
            }
            New::Gone => self.new = New::Gone,
        }
        Ok(())
    }

    fn start_call_off(&mut self, why: &'static str) {
        self.faults.push(why);
        self.calling_off = true;
    }

    /// The old process's call-off, one turn of it.
    fn call_off(&mut self) -> Result<(), Failure> {
        // A new process whose cores are starting sees the hand-over, if it came, and takes the
        // rings (then stands down on its next turn).
        if let New::Asked(p) = std::mem::replace(&mut self.new, New::None) {
            self.new = match p.try_take_over() {
                Ok(Ok(q)) => New::Joined(q),
                Ok(Err(p)) => New::Asked(p),
                Err(_) => New::Gone,
            };
        }
        let ended = self.new_ended;
        let r = self.old()?.call_off_upgrade(ended);
        match r {
            Ok(CallOff::Waiting) => Ok(()),
            Ok(CallOff::Reclaimed(_)) => {
                self.calling_off = false;
                self.outcome = Outcome::CalledOff;
                self.call_offs += 1;
                // The program stays with the old process's generation (it never switched).
                if let Some(a) = &self.old {
                    self.kernel.steer_to(a);
                }
                // A new process not yet holding the rings finds the upgrade called off.
                match std::mem::replace(&mut self.new, New::Gone) {
                    New::Bound(p) => {
                        if p.ask().is_ok() {
                            return Err(self.fail("a called-off queue could still be asked for"));
                        }
                    }
                    New::Asked(p) => {
                        if p.try_take_over().is_ok() {
                            return Err(self.fail("a called-off queue could still be taken over"));
                        }
                    }
                    // Stood down: its run ends (its queue touched nothing since). One that
                    // has not would go on turning, as a live process does: the frame checks
                    // see what that does.
                    New::Joined(b) if b.upgrade_called_off() => drop(b),
                    other => self.new = other,
                }
                Ok(())
            }
            Err(e) => Err(self.fail(format!("calling the upgrade off: {e}"))),
        }
    }

    /// After the switch: the old process leaves once its last sends complete.
    fn leave(&mut self) -> Result<(), Failure> {
        let r = self.old()?.leave_upgrade();
        match r {
            Ok(true) => {
                // The old process ends.
                self.old = None;
                self.outcome = Outcome::Upgraded;
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => Err(self.fail(format!("leaving: {e}"))),
        }
    }

    fn turn_all(&mut self) {
        if let Some(a) = self.old.as_mut() {
            turn(a);
        }
        if let New::Joined(b) = &mut self.new {
            turn(b);
        }
    }

    /// Finishes what is under way: the upgrade completes or is called off.
    fn settle(&mut self) -> Result<(), Failure> {
        for _ in 0..10_000 {
            let done = match &self.new {
                _ if self.calling_off => false,
                New::None | New::Gone => true,
                New::Joined(b) => self.old.is_none() || b.upgrade_called_off(),
                New::Bound(_) | New::Asked(_) => false,
            };
            if done {
                return Ok(());
            }
            self.turn_all();
            self.read_wire()?;
            self.check(false)?;
            if self.calling_off {
                self.call_off()?;
            } else {
                match std::mem::replace(&mut self.new, New::None) {
                    New::Bound(p) => {
                        p.ask().map_err(|e| self.fail(e.to_string()))?;
                        self.new = New::Asked(p);
                    }
                    New::Asked(p) => match p.try_take_over() {
                        Ok(Ok(q)) => self.new = New::Joined(q),
                        Ok(Err(p)) => self.new = New::Asked(p),
                        Err(e) => return Err(self.fail(format!("taking the rings over: {e}"))),
                    },
                    New::Joined(b) => {
                        if !self.switched {
                            self.kernel.steer_to(&b);
                            self.switched = true;
                        }
                        self.new = New::Joined(b);
                        self.leave()?;
                    }
                    other => self.new = other,
                }
            }
            self.step += 1;
        }
        Err(self.fail("the upgrade did not settle"))
    }
}

/// One run of `steps` steps with `seed`.
///
/// # Errors
/// The first invariant broken, with the seed and step.
pub fn run(seed: u64, steps: usize) -> Result<Report, Failure> {
    let config = XskConfig {
        frames: 64,
        frame_size: 2048,
        ring_size: 16,
        ..XskConfig::default()
    };
    let fail = |what: String| Failure {
        seed,
        step: 0,
        what,
    };
    let (kernel, old) = SimKernel::open(&config).map_err(|e| fail(e.to_string()))?;
    let mut run = Run {
        seed,
        rng: Rng(seed),
        kernel,
        old: Some(old),
        new: New::None,
        switched: false,
        calling_off: false,
        new_ended: false,
        outcome: Outcome::NotStarted,
        faults: Vec::new(),
        call_offs: 0,
        next_seq: 0,
        delivered: BTreeSet::new(),
        echoed: BTreeSet::new(),
        step: 0,
    };
    while run.step < steps {
        match run.rng.below(100) {
            0..30 => {
                let n = 1 + run.rng.below(8);
                run.deliver(n);
            }
            30..50 => {
                if let Some(a) = run.old.as_mut() {
                    turn(a);
                }
            }
            50..70 => {
                if let New::Joined(b) = &mut run.new {
                    turn(b);
                }
            }
            _ => run.upgrade_step()?,
        }
        run.read_wire()?;
        run.check(false)?;
        run.step += 1;
    }
    run.settle()?;
    // Quiet: what is in flight completes; then every frame is in exactly one place.
    for _ in 0..8 {
        run.turn_all();
    }
    run.read_wire()?;
    run.check(true)?;
    // The survivor serves: a last batch, every request answered.
    let before = run.echoed.len();
    let from = run.next_seq;
    for _ in 0..4 {
        run.deliver(4);
        for _ in 0..4 {
            run.turn_all();
        }
        run.read_wire()?;
    }
    let last: Vec<u64> = run.delivered.range(from..).copied().collect();
    let missing: Vec<u64> = last
        .iter()
        .copied()
        .filter(|s| !run.echoed.contains(s))
        .collect();
    if last.is_empty() || !missing.is_empty() {
        let counts = match (&mut run.old, &mut run.new) {
            (Some(a), _) => Some((a.counts(), a.fill_target())),
            (None, New::Joined(b)) => Some((b.counts(), b.fill_target())),
            _ => None,
        };
        return Err(run.fail(format!(
            "the survivor does not serve: {} of the last {} requests unanswered ({} answered \
             before; {} dropped by the kernel; the survivor's frames and fill target {counts:?}; \
             kernel holds {})",
            missing.len(),
            last.len(),
            before,
            run.kernel.dropped(),
            run.kernel.frames_held().len()
        )));
    }
    run.check(true)?;
    Ok(Report {
        seed,
        outcome: run.outcome,
        faults: run.faults,
        call_offs: run.call_offs,
        delivered: run.delivered.len(),
        echoed: run.echoed.len(),
    })
}
