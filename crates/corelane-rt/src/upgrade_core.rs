//! One core's part in an upgrade (see `upgrade.rs`): the stage asked done on its turn, its
//! connections kept in the program and forgotten as they close, and its queue left at its end.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use corelane_stack::Stack;

use crate::host::{CallOff, UpgradePhase, UpgradeQueue};

use crate::control::Shared;
use crate::lock::lock;
use crate::steward::Steer;
use crate::upgrade::{FORGET_EVERY, LEAVE_WAIT, STAGE_WAIT, Stage};

/// One core's part in an upgrade, kept by its driver.
#[derive(Debug, Default)]
pub(crate) struct CoreUpgrade {
    /// The last stage this core did.
    seen: Option<Stage>,
    /// The connections this core keeps in the program: (peer, local port).
    kept: Vec<(SocketAddr, u16)>,
    /// When the core next forgets the kept connections that closed.
    forget_at: Option<Instant>,
    /// How many ports this core listened on when it last published them.
    listened: Option<usize>,
    /// This core's connections are all done and counted in `Upgrades::settled`.
    settled: bool,
    /// This core has its queue back from an upgrade called off (counted in `done`).
    reclaimed: bool,
    /// When the core, at its end, started to leave its queue.
    leaving_since: Option<Instant>,
    /// When it started to wait for its last sends (the program had switched).
    left_since: Option<Instant>,
}

impl CoreUpgrade {
    /// Does the stage asked, once, on this core's turn (a load and a compare when none is).
    pub(crate) fn turn(
        &mut self,
        shared: &Shared,
        core: usize,
        stack: &mut Stack,
        io: &mut impl UpgradeQueue,
        now: Instant,
    ) {
        let up = &shared.upgrades;
        if up.listing.load(Ordering::Relaxed) {
            let n = stack.listening_ports().len();
            if self.listened != Some(n) {
                self.listened = Some(n);
                up.note_listening(core, stack);
            }
        }
        let stage = up.stage();
        if stage == Stage::Idle {
            self.successor_turn(shared, core, io, now);
            return;
        }
        if stage == Stage::Reclaim {
            self.call_off(shared, core, stack, io);
            return;
        }
        if self.seen != Some(stage) {
            self.seen = Some(stage);
            match stage {
                Stage::Idle => {}
                Stage::Offer => {
                    up.note_listening(core, stack);
                    let offer = io.offer_upgrade().map_err(|e| e.to_string());
                    if let Some(slot) = lock(&up.offers).get_mut(core) {
                        *slot = Some(offer);
                    }
                }
                Stage::Record => {
                    // No new connection from here on, and none refused: the listeners
                    // close once what they have half open or queued is accepted.
                    stack.set_quiet(true);
                    let mut kept = Vec::new();
                    stack.each_tcp(|local, remote, _| kept.push((remote, local.port())));
                    let generation = u32::from(up.old_gen.load(Ordering::Acquire));
                    let flows = kept.clone();
                    let r = shared.steer.run(move |s| {
                        flows
                            .iter()
                            .try_for_each(|&(peer, port)| s.keep_flow(peer, port, generation))
                    });
                    if let Err(e) = r
                        .map_err(|e| e.to_string())
                        .and_then(|r| r.map_err(|e| e.to_string()))
                    {
                        tracing::error!(
                            "core {core}: keeping its connections in the program failed ({e}): \
                             some may be reset"
                        );
                    }
                    tracing::debug!("core {core}: keeps {kept:?} in generation {generation}");
                    self.kept = kept;
                }
                Stage::Switched | Stage::Reclaim => {}
            }
            up.done.fetch_add(1, Ordering::AcqRel);
        }
        if stage == Stage::Switched && self.forget_at.is_none_or(|t| now >= t) {
            self.forget_at = Some(now + FORGET_EVERY);
            self.forget_closed(&shared.steer, stack);
        }
    }

    /// The old process calls the upgrade off: this core takes its queue back, at once where
    /// the new process never took the rings, and otherwise once it has stood down or ended
    /// (asked again every turn until then: the rings are the new process's meanwhile).
    fn call_off(
        &mut self,
        shared: &Shared,
        core: usize,
        stack: &mut Stack,
        io: &mut impl UpgradeQueue,
    ) {
        if self.seen != Some(Stage::Reclaim) {
            if self.seen == Some(Stage::Record) {
                // Called off after the connections were recorded: new connections are
                // taken again, and the program keeps none for this process any more.
                stack.set_quiet(false);
                forget(&shared.steer, std::mem::take(&mut self.kept));
            }
            self.seen = Some(Stage::Reclaim);
            self.reclaimed = false;
        }
        if self.reclaimed {
            return;
        }
        let up = &shared.upgrades;
        let done = match io.upgrade_phase() {
            None => true,
            Some(_) => match io.call_off_upgrade(up.partner_ended()) {
                Ok(CallOff::Reclaimed(n)) => {
                    tracing::info!(
                        "core {core}: the upgrade was called off; the queue is back ({n} frames                          the new process held)"
                    );
                    true
                }
                Ok(CallOff::Waiting) => false,
                Err(e) => {
                    tracing::error!("core {core}: taking the queue back: {e}");
                    true
                }
            },
        };
        if done {
            self.reclaimed = true;
            up.done.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The new process of an upgrade: stands down from its queue when the upgrade is called
    /// off (by either process), and ends the run once it has (the old process serves on).
    fn successor_turn(
        &mut self,
        shared: &Shared,
        core: usize,
        io: &mut impl UpgradeQueue,
        now: Instant,
    ) {
        let up = &shared.upgrades;
        if up.stand_down.load(Ordering::Relaxed) && io.upgrade_phase().is_some() {
            io.stand_down();
        }
        if up.old_died.load(Ordering::Relaxed)
            && io.upgrade_phase() == Some(UpgradePhase::Handed)
            && lock(&up.old_died_at)
                .is_some_and(|t| now.duration_since(t) >= crate::upgrade_new::OUTLIVE_AFTER)
        {
            match io.outlive_partner() {
                Ok(n) => tracing::warn!(
                    "core {core}: the old process died without leaving its queue: {n} frames it \
                     held are this one's again"
                ),
                Err(e) => {
                    tracing::error!("core {core}: taking the queue from the dead old process: {e}")
                }
            }
        }
        if io.upgrade_called_off() && !up.called_off.swap(true, Ordering::AcqRel) {
            shared.core_failed(
                core,
                "the upgrade was called off: the old process serves on, and this one ends".into(),
            );
        }
    }

    /// Whether a draining core may close its listeners now: at once, but while it hands its
    /// queue to a new process only once nothing is half open or queued on them (closing would
    /// reset those; the application accepts them first).
    pub(crate) fn listeners_may_close(&self, shared: &Shared, stack: &Stack) -> bool {
        !matches!(shared.upgrades.stage(), Stage::Record | Stage::Switched)
            || stack.listeners_idle()
    }

    /// Whether a lingering core whose own connections are done may end: yes, but while the
    /// old process drains after an upgrade, only once every core's are. A kept connection's
    /// segments may arrive on any queue (the peer's kernel picks another one after a timeout),
    /// and only a core still turning hands them to the connection's core.
    pub(crate) fn all_settled(&mut self, shared: &Shared) -> bool {
        let up = &shared.upgrades;
        if !matches!(up.stage(), Stage::Record | Stage::Switched) {
            return true;
        }
        if !self.settled {
            self.settled = true;
            up.settled.fetch_add(1, Ordering::AcqRel);
        }
        up.settled.load(Ordering::Acquire) >= shared.bells.len()
    }

    /// Forgets in the program the kept connections this core no longer has.
    fn forget_closed(&mut self, steer: &Arc<Steer>, stack: &mut Stack) {
        if self.kept.is_empty() {
            return;
        }
        let mut open = Vec::new();
        stack.each_tcp(|local, remote, _| open.push((remote, local.port())));
        let (still, gone): (Vec<_>, Vec<_>) = self.kept.iter().partition(|k| open.contains(k));
        self.kept = still;
        if !gone.is_empty() {
            forget(steer, gone);
        }
    }

    /// At the core's end (its stack shut down), one step of leaving the queue to the new
    /// process, polled until it says more than [`Leave::Waiting`]: waits for the program to
    /// have switched (a core with nothing to drain may end first: its socket stays until then,
    /// so no frame of its queue finds none), forgets every kept connection, then leaves once
    /// its RX ring is read empty and its last sends completed (what still arrives is for
    /// connections gone: dropped).
    pub(crate) fn leave_step(
        &mut self,
        shared: &Shared,
        core: usize,
        io: &mut impl UpgradeQueue,
        now: Instant,
    ) -> Leave {
        if io.upgrade_phase() != Some(UpgradePhase::Handed) {
            return Leave::NotHanded;
        }
        let since = *self.leaving_since.get_or_insert(now);
        if shared.upgrades.stage() == Stage::Record && now.duration_since(since) < STAGE_WAIT {
            return Leave::Waiting;
        }
        if !self.kept.is_empty() {
            forget(&shared.steer, std::mem::take(&mut self.kept));
        }
        let left_since = *self.left_since.get_or_insert(now);
        let mut frames = std::collections::VecDeque::new();
        let mut done = Vec::new();
        io.recv(&mut frames, 64);
        done.extend(frames.drain(..));
        io.release(&mut done);
        let _ = io.complete();
        match io.leave_upgrade() {
            Ok(true) => {
                tracing::info!("core {core}: left its queue to the new process");
                Leave::Left
            }
            Ok(false) if now.duration_since(left_since) > LEAVE_WAIT => {
                tracing::error!(
                    "core {core}: its last sends did not complete within {LEAVE_WAIT:?}: the \
                     queue is not left ({:?})",
                    io.counts()
                );
                Leave::Failed
            }
            Ok(false) => Leave::Waiting,
            Err(e) => {
                tracing::error!("core {core}: leaving its queue: {e}");
                Leave::Failed
            }
        }
    }
}

/// Where a core's leaving of its queue stands ([`CoreUpgrade::leave_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leave {
    /// The queue is not shared with a new process: nothing to leave.
    NotHanded,
    /// Not yet: ask again.
    Waiting,
    /// Left: its frames are the new process's.
    Left,
    /// Could not leave (logged): the queue and its frames stay this process's.
    Failed,
}

fn forget(steer: &Arc<Steer>, flows: Vec<(SocketAddr, u16)>) {
    if flows.is_empty() {
        return;
    }
    let r = steer.run(move |s| {
        for (peer, port) in flows {
            s.forget_flow(peer, port)?;
        }
        Ok::<(), crate::host::XskError>(())
    });
    if let Err(e) = r
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
    {
        tracing::warn!("forgetting closed connections in the program: {e}");
    }
}
