//! The old process's side of an upgrade as one machine ([`OldSide`]), polled by the thread
//! `corelane-upgrade` (or a simulation's step) with the time: it walks the cores through the
//! stages (see `upgrade.rs`) and talks to the new process between them, and every wait is a
//! deadline a poll compares, never a sleep.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::Error;
use crate::control::Shared;
use crate::host::{Heard, Talk, UpgradeOffer};
use crate::lock::lock;
use crate::upgrade::{JOIN_WAIT, STAGE_WAIT, STAND_DOWN_WAIT, Stage};
use crate::upgrade_words::Word;
use crate::upgrade_words::{Extras, RunSecret};

/// What the old process hands over besides its queues, and how long it drains.
pub(crate) struct OldRun<'a> {
    pub(crate) shared: &'a Arc<Shared>,
    /// The run's secret (SYN cookies, ISNs).
    pub(crate) secret: RunSecret,
    pub(crate) grace: Duration,
    /// The queue count to put back at the end, which the new process inherits.
    pub(crate) restore: &'a crate::queues::RestoreQueues,
}

/// Where the old process's side of an upgrade stands. Each poll moves it at most one state
/// on; [`OldSide::Over`] is the end.
#[derive(Debug)]
pub(crate) enum OldSide {
    /// The cores are asked to offer their queues.
    Offering { since: Instant, new_gen: u32 },
    /// The hand-over is sent, with the TCP ports this process listened on (`ports`); the new
    /// process has to join every queue and say `joined` once its application listens on them.
    AwaitingJoin {
        since: Instant,
        new_gen: u32,
        ports: Vec<u16>,
    },
    /// The cores record their connections in the program.
    Recording { since: Instant, new_gen: u32 },
    /// Called off: every core takes its queue back once the new process no longer holds it;
    /// one that has not stood down after [`STAND_DOWN_WAIT`] is ended (`ended`), so that
    /// nothing of it touches the rings when they are taken back.
    CallingOff {
        since: Instant,
        said: Duration,
        why: String,
        ended: bool,
    },
    /// Done: `Ok` once the program has switched to the new process (this one drains), or why
    /// the upgrade was called off (this one serves on).
    Over(Result<(), String>),
}

impl OldSide {
    /// Starts an upgrade: asks every core to offer its queue.
    pub(crate) fn start(run: &OldRun<'_>, now: Instant) -> OldSide {
        let shared = run.shared;
        let cores = shared.bells.len();
        let up = &shared.upgrades;
        let old_gen = match shared.steer.run(|s| s.upgrade_state()) {
            Ok(Ok((g, _))) => g,
            Ok(Err(e)) => return OldSide::Over(Err(e.to_string())),
            Err(e) => return OldSide::Over(Err(e.to_string())),
        };
        let new_gen = (old_gen + 1) % crate::host::data::GENERATIONS;
        up.old_gen.store(old_gen as u8, Ordering::Release);
        *lock(&up.offers) = (0..cores).map(|_| None).collect();
        // The cores publish their listening ports from now on (each at its offer, then as they
        // change): the new process waits for its application to listen on them.
        up.start_listing(cores);
        up.ask(Stage::Offer);
        shared.ring_all();
        OldSide::Offering {
            since: now,
            new_gen,
        }
    }

    /// Whether the machine has ended.
    pub(crate) fn over(&self) -> Option<&Result<(), String>> {
        match self {
            OldSide::Over(r) => Some(r),
            _ => None,
        }
    }

    /// Moves the machine on as far as what the cores did and the new process said allow.
    pub(crate) fn poll(&mut self, run: &OldRun<'_>, talk: &mut impl Talk, now: Instant) {
        let shared = run.shared;
        let cores = shared.bells.len();
        let up = &shared.upgrades;
        if up.cores_ended.load(Ordering::Acquire)
            && matches!(
                self,
                OldSide::Offering { .. } | OldSide::AwaitingJoin { .. } | OldSide::Recording { .. }
            )
        {
            // The cores ended (a shutdown) before the switch: their queues are closed, so
            // there is nothing left to hand over, and the run waits for this machine.
            *self = call_off(
                shared,
                talk,
                now,
                "this process's cores ended (it was shut down) before the switch".into(),
            );
        }
        let next = match self {
            OldSide::Offering { since, new_gen } => {
                if up.done.load(Ordering::Acquire) >= cores {
                    match hand_over(run, talk, *new_gen) {
                        Ok(ports) => Some(OldSide::AwaitingJoin {
                            since: now,
                            new_gen: *new_gen,
                            ports,
                        }),
                        Err(e) => Some(call_off(shared, talk, now, e.to_string())),
                    }
                } else if now.duration_since(*since) > STAGE_WAIT {
                    let why = format!(
                        "{} of {cores} core(s) offered their queues within {STAGE_WAIT:?}",
                        up.done.load(Ordering::Acquire)
                    );
                    Some(call_off(shared, talk, now, why))
                } else {
                    // An idle core sleeps: rung until it has done the stage.
                    shared.ring_all();
                    None
                }
            }
            OldSide::AwaitingJoin {
                since,
                new_gen,
                ports,
            } => {
                // The cores hand their rings over on their next turn: rung until the new
                // process has joined them all.
                shared.ring_all();
                match talk.hear() {
                    Heard::Word(Word::Joined) => {
                        let listening = up.listening_ports();
                        let late: Vec<u16> = listening
                            .iter()
                            .filter(|p| !ports.contains(p))
                            .copied()
                            .collect();
                        Some(if late.is_empty() {
                            record(run, now, *new_gen)
                                .unwrap_or_else(|e| call_off(shared, talk, now, e.to_string()))
                        } else {
                            // The new process was not told of them: it may not listen there,
                            // and new connections to them would be refused after the switch.
                            let why = format!(
                                "this process began listening on TCP port(s) {late:?} after it \
                                 offered its queues: upgrade again"
                            );
                            call_off(shared, talk, now, why)
                        })
                    }
                    Heard::Word(w) => Some(call_off(
                        shared,
                        talk,
                        now,
                        format!("the new process said `{}`", w.to_text()),
                    )),
                    Heard::Ended => Some(call_off(
                        shared,
                        talk,
                        now,
                        "the new process closed the connection before joining".into(),
                    )),
                    Heard::Nothing if now.duration_since(*since) > JOIN_WAIT => Some(call_off(
                        shared,
                        talk,
                        now,
                        format!("the new process did not say it joined within {JOIN_WAIT:?}"),
                    )),
                    Heard::Nothing => None,
                }
            }
            OldSide::Recording { since, new_gen } => {
                if up.done.load(Ordering::Acquire) >= cores {
                    Some(match switch(run, talk, *new_gen) {
                        Ok(()) => OldSide::Over(Ok(())),
                        Err(e) => call_off(shared, talk, now, e.to_string()),
                    })
                } else if now.duration_since(*since) > STAGE_WAIT {
                    let why = format!(
                        "{} of {cores} core(s) recorded their connections within {STAGE_WAIT:?}",
                        up.done.load(Ordering::Acquire)
                    );
                    Some(call_off(shared, talk, now, why))
                } else {
                    shared.ring_all();
                    None
                }
            }
            OldSide::CallingOff {
                since,
                said,
                why,
                ended,
            } => {
                let back = up.done.load(Ordering::Acquire);
                // Over once every core has its queue back, or none is left to take it (a
                // shutdown ended them first: their queues closed with them). Waiting on would
                // keep the run from ending.
                if back >= cores
                    || shared.life.stop.load(Ordering::Acquire)
                    || up.cores_ended.load(Ordering::Acquire)
                {
                    up.stop_listing();
                    up.stage.store(Stage::Idle as u8, Ordering::Release);
                    lock(&up.partner_process).take();
                    Some(OldSide::Over(Err(std::mem::take(why))))
                } else {
                    shared.ring_all();
                    let waited = now.duration_since(*since);
                    if waited >= STAND_DOWN_WAIT && !*ended {
                        *ended = true;
                        match up.kill_partner() {
                            Ok(pid) => tracing::error!(
                                "upgrade called off: the new process (pid {pid}) did not stand \
                                 down within {STAND_DOWN_WAIT:?} (stopped, or its cores blocked): \
                                 ended it (SIGKILL) to take the queues back"
                            ),
                            Err(e) => tracing::error!(
                                "upgrade called off: the new process did not stand down within \
                                 {STAND_DOWN_WAIT:?} and {e}; waiting for it"
                            ),
                        }
                    }
                    if waited >= *said + Duration::from_secs(5) {
                        *said = waited;
                        tracing::warn!(
                            "upgrade called off: {back} of {cores} core(s) have their queue back \
                             after {waited:?}; waiting for the new process to stand down or end"
                        );
                    }
                    None
                }
            }
            OldSide::Over(_) => None,
        };
        if let Some(n) = next {
            *self = n;
        }
    }
}

/// Sends the hand-over: the cores' offers, the program (unless a broker holds it) and the
/// extras. Returns the TCP ports the new process was told this one listens on.
fn hand_over(run: &OldRun<'_>, talk: &mut impl Talk, new_gen: u32) -> Result<Vec<u16>, Error> {
    let shared = run.shared;
    let up = &shared.upgrades;
    let offers: Vec<UpgradeOffer> = lock(&up.offers)
        .iter_mut()
        .enumerate()
        .map(|(i, o)| match o.take() {
            Some(Ok(o)) => Ok(o),
            Some(Err(e)) => Err(Error::Upgrade(format!("core {i}: {e}"))),
            None => Err(Error::Upgrade(format!("core {i} made no offer"))),
        })
        .collect::<Result<_, _>>()?;
    // A broker's program stays the broker's: the new process asks it as the old one's
    // successor. An in-memory program is the simulation's to share.
    let program = if shared.steer.read().shares_by_descriptors() {
        Some(shared.steer.run(|s| s.share())??)
    } else {
        None
    };
    let extras = Extras {
        secret: run.secret,
        generation: new_gen,
        channels: run.restore.channels(),
        ports: up.listening_ports(),
    };
    talk.hand_over(program, offers, &extras.to_text())?;
    Ok(extras.ports)
}

/// The new process joined: the drain's end is set, the program handed on, and the cores
/// asked to record their connections.
fn record(run: &OldRun<'_>, now: Instant, new_gen: u32) -> Result<OldSide, Error> {
    let shared = run.shared;
    // The drain's end is set before the cores close their listeners, so that a core whose
    // future ends at once lingers for the whole grace.
    {
        let mut until = lock(&shared.life.drain_until);
        let t = now + run.grace;
        *until = Some(until.map_or(t, |u| u.min(t)));
    }
    // From here on this process gives up nothing it owns: its listeners close now, and the
    // ports they release are the new process's too.
    shared.steer.run(|s| s.hand_on())?;
    shared.upgrades.stop_listing();
    shared.upgrades.ask(Stage::Record);
    shared.ring_all();
    Ok(OldSide::Recording {
        since: now,
        new_gen,
    })
}

/// Every core recorded its connections: the program switches to the new process, the cores
/// drain, and the new process is told.
fn switch(run: &OldRun<'_>, talk: &mut impl Talk, new_gen: u32) -> Result<(), Error> {
    let shared = run.shared;
    shared.steer.run(move |s| s.set_upgrade(new_gen, true))??;
    run.restore.hand_on();
    shared.upgrades.ask(Stage::Switched);
    shared.ring_all();
    // Only this word lets the new process end the split when this connection ends: a
    // connection that ends without it means the upgrade was called off.
    if let Err(e) = talk.say(&Word::Switched) {
        tracing::error!(
            "upgrade: the new process did not hear that the program switched to it ({e}); it \
             may have ended"
        );
    }
    tracing::info!(
        "upgrade: the new process serves; this one drains (at most {:?}) and ends",
        run.grace
    );
    crate::StopHandle(Arc::downgrade(shared)).shutdown(run.grace);
    Ok(())
}

/// Calls the upgrade off: the new process is told first (it stands down at once; each of its
/// queues also sees the call-off on its next turn), what this process gave up for the switch
/// is taken back (the program's hand-on, the drain's end), and every core is asked to take
/// its queue back.
fn call_off(shared: &Arc<Shared>, talk: &mut impl Talk, now: Instant, why: String) -> OldSide {
    tracing::error!("upgrade refused or failed: {why}; this process serves on");
    let _ = talk.say(&Word::Error(why.clone()));
    if let Err(e) = shared.steer.run(|s| s.hand_back()) {
        tracing::warn!("upgrade: taking the program back: {e}");
    }
    {
        // The drain's end this process set for the switch, unless a shutdown began (its
        // deadline is then the shutdown's): read with the flag under the lock `shutdown`
        // holds while it sets both.
        let mut until = lock(&shared.life.drain_until);
        if !shared.life.draining() {
            until.take();
        }
    }
    shared.upgrades.ask(Stage::Reclaim);
    shared.ring_all();
    OldSide::CallingOff {
        since: now,
        said: Duration::ZERO,
        why,
        ended: false,
    }
}

#[cfg(test)]
#[path = "upgrade_old_tests.rs"]
mod tests;
