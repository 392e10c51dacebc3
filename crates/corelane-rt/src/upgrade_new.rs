//! The new process's side of an upgrade as one machine ([`NewSide`]), polled by its thread
//! (`Joining::serve` in `host/xsk/join.rs`) or a simulation's step with the time, once its
//! cores run: it says `joined` once the application listens where the old process did, waits
//! for the switch, and ends the split once the old process has gone. Every wait is a
//! deadline a poll compares.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::control::Shared;
use crate::host::{Heard, Talk};
use crate::lock::lock;
use crate::upgrade_words::Extras;
use crate::upgrade_words::Word;

/// How long the new process waits for the application to listen on the old one's ports
/// before it calls the upgrade off.
pub(crate) const LISTEN_WAIT: Duration = Duration::from_secs(10);
/// How long, once the old process's connection ended without leaving, the new one waits for
/// its process to be seen ended (the pidfd is ready a moment after the process's descriptors
/// are closed), to tell its death from an end of the connection alone.
pub(crate) const DEATH_WAIT: Duration = Duration::from_secs(2);
/// How long after the old process's death the cores take back what it held: a zero-copy
/// device completes the sends it had in flight meanwhile.
pub(crate) const OUTLIVE_AFTER: Duration = Duration::from_millis(100);

/// The upgrade is called off on this side: each core stands down from its queue (it fills and
/// sends no more, lets its sends complete, says so) and the run ends with an error.
pub(crate) fn stand_down(shared: &Shared) {
    shared.upgrades.stand_down.store(true, Ordering::Release);
    shared.ring_all();
}

/// Where the new process's side of an upgrade stands once its cores run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NewSide {
    /// Waits for the application to listen on every TCP port the old process did (at most
    /// [`LISTEN_WAIT`], else the upgrade is called off: new connections on a port nobody
    /// listens on would be refused), then says `joined`.
    Listening { since: Instant },
    /// Said `joined`; the switch is the old process's to make and to say (a `joined` it read
    /// too late, having called the upgrade off, is answered with an error or the connection's
    /// end).
    AwaitingSwitch,
    /// The connection ended before the switch with no word of a call-off: the old process
    /// died (this one takes over once its pidfd says so) or only its connection ended (this
    /// one stands down after [`DEATH_WAIT`]).
    OldGone { since: Instant },
    /// The program switched to this process; the old one drains, and its connection's end
    /// (every one of its cores has left) ends the split.
    Serving,
    /// The split has ended; should the old process have died before leaving every queue,
    /// its frames are taken back once its pidfd says so (at most [`DEATH_WAIT`]).
    Watching { since: Instant },
    /// This process serves every connection alone.
    Ended,
    /// The upgrade was called off: this process stood down (its run ends with an error).
    StoodDown,
}

impl NewSide {
    /// Moves on as far as the application and the old process allow.
    pub(crate) fn poll(
        &mut self,
        shared: &Shared,
        extras: &Extras,
        talk: &mut impl Talk,
        now: Instant,
    ) {
        let up = &shared.upgrades;
        match *self {
            NewSide::Listening { since } => {
                let listening = up.listening_ports();
                let old_ports = &extras.ports;
                if !old_ports.iter().all(|p| listening.contains(p)) {
                    if now.duration_since(since) <= LISTEN_WAIT && !shared.life.ending() {
                        return;
                    }
                    let why = format!(
                        "the application does not listen on every port the old process did \
                         ({old_ports:?}; now {listening:?}) after {LISTEN_WAIT:?}: new \
                         connections to the others would be refused"
                    );
                    tracing::error!("upgrade called off: {why}; the old process serves on");
                    let _ = talk.say(&Word::Error(why));
                    up.stop_listing();
                    stand_down(shared);
                    *self = NewSide::StoodDown;
                    return;
                }
                up.stop_listing();
                if let Err(e) = talk.say(&Word::Joined) {
                    tracing::error!(
                        "upgrade: telling the old process failed ({e}); it takes its queues back"
                    );
                    stand_down(shared);
                    *self = NewSide::StoodDown;
                    return;
                }
                tracing::info!("upgrade: every queue joined; the old process switches to this one");
                *self = NewSide::AwaitingSwitch;
            }
            NewSide::AwaitingSwitch => {
                let why = match talk.hear() {
                    Heard::Nothing => return,
                    Heard::Word(Word::Switched) => {
                        *self = NewSide::Serving;
                        return;
                    }
                    Heard::Word(w @ Word::Error(_)) => w.to_text(),
                    Heard::Word(_) => return,
                    Heard::Ended => {
                        *self = NewSide::OldGone { since: now };
                        return;
                    }
                };
                self.give_up(shared, &why);
            }
            NewSide::OldGone { since } => {
                if up.partner_ended() {
                    // It died holding nothing of the run but its queues' frames: this process
                    // takes the program and the queues over.
                    tracing::warn!(
                        "upgrade: the old process died before switching: this one takes over"
                    );
                    end_split(shared, extras.generation);
                    old_died(shared, now);
                    *self = NewSide::Ended;
                } else if now.duration_since(since) > DEATH_WAIT {
                    self.give_up(shared, "the old process ended the connection first");
                }
            }
            NewSide::Serving => {
                // Whatever the old process says until it ends is ignored; its end ends the
                // split.
                if talk.hear() != Heard::Ended {
                    return;
                }
                end_split(shared, extras.generation);
                *self = NewSide::Watching { since: now };
            }
            NewSide::Watching { since } => {
                if up.partner_ended() {
                    old_died(shared, now);
                    *self = NewSide::Ended;
                } else if now.duration_since(since) > DEATH_WAIT {
                    *self = NewSide::Ended;
                }
            }
            NewSide::Ended | NewSide::StoodDown => {}
        }
    }

    fn give_up(&mut self, shared: &Shared, why: &str) {
        tracing::error!(
            "upgrade: the old process did not switch to this one ({why}): it serves on, and this \
             one stands down"
        );
        stand_down(shared);
        *self = NewSide::StoodDown;
    }
}

/// The old process was seen dead at `now`: the cores take back what it held on their queues
/// (each where it had not left) once [`OUTLIVE_AFTER`] has passed.
fn old_died(shared: &Shared, now: Instant) {
    *lock(&shared.upgrades.old_died_at) = Some(now);
    shared.upgrades.old_died.store(true, Ordering::Release);
    shared.ring_all();
}

/// Every frame comes to this process's generation, and no connection is kept for the old one.
fn end_split(shared: &Shared, generation: u32) {
    let ended = shared.steer.run(move |s| {
        s.set_upgrade(generation, false)?;
        s.clear_flows()
    });
    match ended {
        Ok(Ok(n)) => tracing::info!(
            "upgrade: the old process has gone; this one serves every connection ({n} kept \
             connection(s) forgotten)"
        ),
        Ok(Err(e)) => tracing::error!("upgrade: ending the split failed: {e}"),
        Err(e) => tracing::error!("upgrade: ending the split failed: {e}"),
    }
}

#[cfg(test)]
#[path = "upgrade_new_tests.rs"]
mod tests;
