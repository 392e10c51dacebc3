//! The new process of a simulated upgrade, from its connection to the old one through its
//! `build` (its socket bound beside the old one's), its `run` (the rings taken over) to its
//! serving or its end.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::host::mem::PendingJoin;
use corelane_stack::smoltcp::wire::IpCidr;

use super::{SERVER, World};
use crate::control::Shared;
use crate::sim::Failure;
use crate::sim::SimProcess;
use crate::sim::process::{self, Process};
use crate::sim::talk::MemTalk;
use crate::upgrade_new::NewSide;
use crate::upgrade_words::{Extras, RunSecret};

/// Where the new process is.
pub(super) enum New {
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

impl World {
    /// The new process's turn, whatever it is at.
    pub(super) fn new_turn(&mut self) -> Result<bool, Failure> {
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
                        Some(Box::new(SimProcess(self.old.gone.clone())));
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
                // Not handed over yet: waited for, and withdrawn after 5 s unless the old
                // process has begun handing over.
                Ok(Err(join)) => {
                    if now.duration_since(since) > Duration::from_secs(5) && join.withdraw() {
                        (New::Gone, true)
                    } else {
                        let starting = New::Starting {
                            shared,
                            join,
                            talk,
                            extras,
                            since,
                        };
                        (starting, false)
                    }
                }
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
}
