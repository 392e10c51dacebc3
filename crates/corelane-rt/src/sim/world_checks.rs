//! A simulated run's checks and clock: what is checked after every step and at the end, when
//! the run is over, and how far the virtual clock moves.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::host::mem::{Misplaced, XskQueue};

use super::successor::New;
use super::{Crash, World};
use crate::sim::peer::State;
use crate::sim::process::{Phase, Process};
use crate::sim::{Failure, Outcome};
use crate::upgrade_new::NewSide;

impl World {
    /// Kills the process the plan names once its time has come.
    pub(super) fn faults_due(&mut self) {
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
    pub(super) fn check_step(&mut self) -> Result<(), Failure> {
        let m = self.places()?;
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
    pub(super) fn servers(&mut self) -> Vec<&mut Process> {
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
    pub(super) fn finished(&mut self) -> bool {
        if self.servers().is_empty() {
            self.outcome = if self.drained.is_some() && !self.crashed {
                Outcome::Drained
            } else {
                Outcome::ServerGone
            };
            return true;
        }
        if !self.peer.finished() || self.old_side.is_some() {
            return false;
        }
        // A planned shutdown is waited for, and once begun, for the process's end.
        if (self.plan.upgrade_at.is_some() && self.started.is_none())
            || (self.plan.drain_at.is_some()
                && (self.drained.is_none() || self.old.driver.is_some()))
        {
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
    pub(super) fn advance(&mut self, busy: bool) {
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
        if let Some(t) = self.plan.drain_at.filter(|_| self.drained.is_none()) {
            next.push(self.start + t);
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
    pub(super) fn check_end(&mut self) -> Result<(), Failure> {
        if self.outcome == Outcome::ServerGone {
            return Ok(());
        }
        if self.outcome == Outcome::Drained {
            // Every connection the application had accepted when the shutdown began finished
            // within its grace; the others were refused (as a kernel's closed listener refuses
            // what it held unaccepted) or found nobody.
            for &i in self.drained.iter().flatten() {
                let state = &self.peer.conns[i].state;
                if *state != State::Done {
                    return Err(self.fail(format!(
                        "connection {i}, accepted before the shutdown, ended {state:?} ({})",
                        self.describe()
                    )));
                }
            }
            return Ok(());
        }
        self.every_frame_in_one_place("at the end")?;
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

    /// As the old process exits: every frame of the queue in exactly one place across both
    /// processes' queues and the kernel (a killed process checks nothing: it did not exit).
    pub(super) fn check_frames_at_exit(&mut self) -> Result<(), Failure> {
        if self.crashed {
            // The new process was killed holding what the old one left it.
            return Ok(());
        }
        self.every_frame_in_one_place("as the old process exits")
    }

    /// Where the queue's frames are across both processes' queues and the kernel.
    fn places(&mut self) -> Result<Misplaced, Failure> {
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
        m.map_err(|e| self.fail(e))
    }

    /// Every frame in exactly one place (`when` says when, for the failure).
    fn every_frame_in_one_place(&mut self, when: &str) -> Result<(), Failure> {
        let m = self.places()?;
        if !m.twice.is_empty() || !m.lost.is_empty() {
            return Err(self.fail(format!(
                "{when}, frames in two places {:?}, in none {:?} ({})",
                m.twice,
                m.lost,
                self.describe()
            )));
        }
        Ok(())
    }

    /// The state of things, for a failure's message.
    pub(super) fn describe(&self) -> String {
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
