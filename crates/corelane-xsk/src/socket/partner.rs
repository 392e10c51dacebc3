//! Two processes on one queue during an upgrade: the old process offers its queue
//! ([`XskQueue::offer_upgrade`]), the new one joins it ([`XskQueue::join_upgrade`]) with a
//! socket of its own sharing the UMEM, the old one hands the fill and completion rings over at
//! its next turn, and later leaves ([`XskQueue::leave_upgrade`]) once nothing is steered to it
//! and every frame it sent has completed.
//!
//! The frames' moves are the ledger's (corelane-frame `FramePool::lend`, `hand_over_receive`,
//! `received_shared`, `give_back`, `returned`); the indices travel on the two rings of an
//! [`Exchange`]. After the hand-over the old process keeps a few free frames to send from and
//! gives back every other frame it is done with; the new one fills, consumes the completion
//! ring, and forwards the old one's completions.

use std::io;
use std::os::fd::OwnedFd;

use super::exchange::{Exchange, Phase};
use super::{XskConfig, XskQueue};
use crate::error::Error;
use corelane_frame::FrameState;

/// Which of the two processes this side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Old,
    New,
}

/// The other process of an upgrade, as one queue sees it.
#[derive(Debug)]
pub(super) struct Partner {
    pub(super) ex: Exchange,
    pub(super) role: Role,
    /// Free frames the old process keeps to send from after the hand-over.
    keep: usize,
    /// The old process's fill target before the hand-over (restored if it takes the queue
    /// back).
    fill_target: usize,
    inbound: Vec<u32>,
    /// The new process: the upgrade is being called off (it fills and sends no more).
    calling_off: bool,
    /// The new process: called off, and said so; it touches no ring or frame any more.
    called_off: bool,
    /// Gone without a word (a simulated crash): its end says nothing on the exchange.
    crashed: bool,
}

impl Partner {
    pub(super) fn new(ex: Exchange, role: Role, keep: usize, fill_target: usize) -> Box<Partner> {
        Box::new(Partner {
            ex,
            role,
            keep,
            fill_target,
            inbound: Vec::new(),
            calling_off: false,
            called_off: false,
            crashed: false,
        })
    }
}

impl Drop for Partner {
    fn drop(&mut self) {
        // The new process's queue goes (its socket is closed first: it is declared before the
        // partner in `XskQueue`): it touches nothing of the queue from here on, and says so,
        // so that the old process may take the queue back without waiting for its exit.
        if self.role == Role::New
            && !self.crashed
            && matches!(
                self.ex.phase(),
                Phase::Bound | Phase::Handing | Phase::Handed | Phase::Aborting
            )
        {
            self.ex.set_phase(Phase::Aborted);
        }
    }
}

/// Where the old process's call-off of an upgrade of one queue stands
/// ([`XskQueue::call_off_upgrade`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOff {
    /// The queue is the old process's alone again; this many frames the new process held are
    /// free again.
    Reclaimed(usize),
    /// The new process still holds the fill and completion rings: it stops filling and
    /// sending, and says so once its last sends have completed (or its process ends). Ask
    /// again on a later turn.
    Waiting,
}

/// What the new process needs to join a queue: the descriptors of the socket on it, of its
/// UMEM's memory file and of the exchange, and the queue's sizes. Made by
/// [`XskQueue::offer_upgrade`]; another process receives the descriptors (`SCM_RIGHTS`).
#[derive(Debug)]
pub struct UpgradeOffer {
    /// The socket bound to the queue (the new one shares its UMEM).
    pub socket: OwnedFd,
    /// The UMEM's memory file.
    pub umem: OwnedFd,
    /// The exchange's memory file.
    pub exchange: OwnedFd,
    /// The interface's queue.
    pub queue_id: u32,
    /// The sizes the queue was opened with (frames, frame size, rings, largest packet).
    pub config: XskConfig,
}

impl XskQueue {
    /// Offers this queue to a new process: returns what it needs to join (see
    /// [`XskQueue::join_upgrade`]). The fill and completion rings are handed over on a later
    /// turn ([`corelane_frame::FrameIo::complete`]), once the new process is bound.
    pub fn offer_upgrade(&mut self) -> Result<UpgradeOffer, Error> {
        // An offer nobody took (or a new process withdrew from) may be made again.
        let taken = self
            .partner
            .as_ref()
            .is_some_and(|p| p.role == Role::New || p.ex.phase() != Phase::Offered);
        if taken {
            return Err(Error::Config(format!(
                "queue {}: an upgrade is already under way",
                self.queue_id
            )));
        }
        let io_err = |what: &str, e: io::Error| Error::Umem {
            errno: e.raw_os_error(),
            detail: format!("offering the queue to a new process: {what}: {e}"),
        };
        let ex = Exchange::create(self.frames.next_power_of_two())
            .map_err(|e| io_err("the exchange", e))?;
        let dup = |f: std::os::fd::BorrowedFd<'_>, what| {
            f.try_clone_to_owned().map_err(|e| io_err(what, e))
        };
        let offer = UpgradeOffer {
            socket: dup(self.socket.borrow(), "the socket")?,
            umem: dup(self.umem.file(), "the UMEM")?,
            exchange: dup(ex.file(), "the exchange")?,
            queue_id: self.queue_id,
            config: XskConfig {
                frames: self.frames,
                frame_size: self.frame_size as u32,
                ring_size: self.ring_size,
                max_packet: self.max_packet as u32,
                ..XskConfig::default()
            },
        };
        self.partner = Some(Partner::new(
            ex,
            Role::Old,
            (self.ring_size as usize).min(self.frames as usize / 4),
            self.pool.fill_target(),
        ));
        Ok(offer)
    }

    /// Where an upgrade of this queue stands (None: none under way).
    pub fn upgrade_phase(&self) -> Option<Phase> {
        self.partner.as_ref().map(|p| p.ex.phase())
    }

    /// The old process leaves an upgrade: every frame it holds goes to the new process. Call
    /// it once the program steers nothing more to this socket and its RX ring was read empty.
    ///
    /// Returns `Ok(false)`, not yet, while frames are still held (received and not released),
    /// being sent, or waiting on the RX ring: call again after the next turns.
    ///
    /// # Errors
    /// When this side is not the old process of an upgrade the new process has taken.
    pub fn leave_upgrade(&mut self) -> Result<bool, Error> {
        let Some(p) = self.partner.as_mut().filter(|p| p.role == Role::Old) else {
            return Err(Error::Config("no upgrade to leave".into()));
        };
        if p.ex.phase() != Phase::Handed {
            return Err(Error::Config(format!(
                "the new process does not hold the queue ({:?})",
                p.ex.phase()
            )));
        }
        let busy = self.pool.count(FrameState::InUse) + self.pool.count(FrameState::Transmit);
        // A frame still on the RX ring would go with the socket (found by the upgrade
        // simulation: the new process's ledger kept it posted for good).
        if busy > 0 || self.rx.ready_exact() > 0 {
            return Ok(false);
        }
        let mut gone = Vec::new();
        self.pool.lend(usize::MAX, |i| gone.push(i));
        pass(&mut p.ex, &gone, self.queue_id);
        p.ex.set_phase(Phase::Left);
        Ok(true)
    }

    /// The old process calls an upgrade of this queue off (the new process did not say it
    /// joined in time, or its connection ended): takes the queue back at once when the new
    /// process never took the rings, and otherwise only once it has said it touches them no
    /// more ([`Phase::Aborted`]: it stops on its next turn and waits for its last sends) or
    /// `partner_gone` (its process has ended: the kernel closed its socket). Until then
    /// [`CallOff::Waiting`]: the rings stay the new process's, and the frames are in no
    /// two hands at once.
    ///
    /// # Errors
    /// When this side is not the old process of an upgrade, or has already left it.
    pub fn call_off_upgrade(&mut self, partner_gone: bool) -> Result<CallOff, Error> {
        let Some(p) = self.partner.as_ref().filter(|p| p.role == Role::Old) else {
            return Err(Error::Config("no upgrade to call off".into()));
        };
        loop {
            let now = p.ex.phase();
            let next = match now {
                // Not taken (or not yet): the new process finds it called off when it tries.
                Phase::Offered | Phase::Bound => Phase::Aborted,
                Phase::Handed => Phase::Aborting,
                // Only within this side's own turn.
                Phase::Handing => return Ok(CallOff::Waiting),
                Phase::Aborting if !partner_gone => return Ok(CallOff::Waiting),
                Phase::Aborting | Phase::Aborted => break,
                Phase::Left => {
                    return Err(Error::Config(
                        "the queue was left to the new process already".into(),
                    ));
                }
            };
            if p.ex.advance(now, next) && next == Phase::Aborting && !partner_gone {
                return Ok(CallOff::Waiting);
            }
        }
        self.reclaim_upgrade().map(CallOff::Reclaimed)
    }

    /// The new process stops its part in an upgrade of this queue (it gave up, or the old
    /// process did not switch to it): as when the old one calls it off, it fills and sends no
    /// more and, once its last sends complete, says so ([`Phase::Aborted`]).
    pub fn stand_down(&mut self) {
        if let Some(p) = self.partner.as_mut().filter(|p| p.role == Role::New) {
            p.calling_off = true;
        }
        self.partner_turn();
    }

    /// The new process of an upgrade that was called off: it touches the queue no more and
    /// its run should end (the old process serves on).
    pub fn upgrade_called_off(&self) -> bool {
        self.partner
            .as_ref()
            .is_some_and(|p| p.role == Role::New && p.called_off)
    }

    /// The frames on the exchange's two rings, as this side maps them (for checks).
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn exchange_frames(&mut self) -> Vec<u32> {
        match self.partner.as_mut() {
            Some(p) => {
                let mut v = p.ex.out.pending();
                v.extend(p.ex.inbound.peek_all());
                v
            }
            None => Vec::new(),
        }
    }

    /// Ends this queue as a crash would (for simulations): its socket closes, and nothing is
    /// said on the exchange, as when the process is killed.
    #[doc(hidden)]
    pub fn crash_for_simulation(mut self) {
        if let Some(p) = self.partner.as_mut() {
            p.crashed = true;
        }
    }

    /// Whether this side may use the rings: not the new process of an upgrade being called
    /// off.
    pub(super) fn may_send(&self) -> bool {
        !self
            .partner
            .as_ref()
            .is_some_and(|p| p.role == Role::New && (p.calling_off || p.called_off))
    }

    /// The old process takes its queue back from a new process that is gone (it died, or its
    /// connection ended, after the hand-over): it fills and completes again, the frames posted
    /// for receive stay posted, its own sends complete, and every other frame the new process
    /// held is free. Call it once the new process's socket is closed (its process gone), so
    /// that no frame is still in its hands. Returns the frames taken back.
    ///
    /// # Errors
    /// When this side is not the old process of an upgrade.
    pub fn reclaim_upgrade(&mut self) -> Result<usize, Error> {
        let Some(mut p) = self.partner.take_if(|p| p.role == Role::Old) else {
            return Err(Error::Config(
                "no upgrade to take the queue back from".into(),
            ));
        };
        if self.owns_rings {
            // Never handed over: nothing to take back.
            return Ok(0);
        }
        // Completions the new process forwarded before it went.
        let mut buf = vec![0u32; 256];
        loop {
            let n = p.ex.inbound.pop(&mut buf);
            for &i in &buf[..n] {
                self.completed_here(i);
            }
            if n < buf.len() {
                break;
            }
        }
        // What is posted for receive stays posted: on this side's RX ring (read before and
        // after the fill ring, so that a frame the kernel moves between the two meanwhile is
        // seen on one of them), and in the fill ring.
        let mut posted: Vec<u64> = self.rx.peek_all().iter().map(|d| d.addr).collect();
        posted.extend(self.fq.take_over());
        posted.extend(self.rx.peek_all().iter().map(|d| d.addr));
        for addr in posted {
            let i = self.index_of(addr);
            if self.pool.ledger().get(i as usize) == Some(FrameState::Away) {
                let _ = self.pool.found_posted(i);
            }
        }
        // This side's sends complete; the new one's are swept with the rest.
        self.cq.take_over();
        loop {
            let n = self.cq.pop(&mut self.addrs);
            for k in 0..n {
                let i = self.index_of(self.addrs[k]);
                if self.pool.ledger().get(i as usize) == Some(FrameState::Transmit) {
                    self.completed_here(i);
                }
            }
            if n < self.addrs.len() {
                break;
            }
        }
        let taken = self.pool.reclaim_away();
        self.owns_rings = true;
        let most = (self.ring_size as usize).min(self.frames as usize / 2);
        self.pool.set_fill_target(p.fill_target, most);
        tracing::warn!(
            "queue {}: the new process went away after the hand-over: the queue is taken back \
             ({taken} frames it held are free again)",
            self.queue_id
        );
        self.top_up_fill()?;
        Ok(taken)
    }

    /// The new process of an upgrade outlives the old one, which died after the hand-over
    /// without leaving (its connection ended while the queue was still [`Phase::Handed`]):
    /// the queue becomes this process's alone, and every frame the old process held is taken
    /// back. Frames it gave back on the way are taken first; a frame still posted (in the
    /// fill ring, or on this side's RX ring) stays posted; every other frame away with the old
    /// process, or posted and received by it, is free here now (what was on its RX ring or
    /// its TX ring went with its socket). Call it once the old process's socket is closed.
    /// Returns the frames taken back.
    ///
    /// In copy mode a send completes within the `sendto` that kicks it, so nothing of the
    /// old process's is in flight once it is gone; with zero-copy, a frame the device still
    /// sends completes later on the completion ring, so the runtime calls this only some time
    /// after the old process has gone.
    ///
    /// # Errors
    /// When this side is not the new process of an upgrade the old process handed over.
    pub fn outlive_partner(&mut self) -> Result<usize, Error> {
        let handed = self
            .partner
            .as_ref()
            .is_some_and(|p| p.role == Role::New && p.ex.phase() == Phase::Handed && !p.called_off);
        if !handed {
            return Err(Error::Config(
                "no old process of an upgrade to outlive".into(),
            ));
        }
        // What the old process gave back before it went.
        self.partner_turn();
        let Some(p) = self.partner.take() else {
            return Ok(0);
        };
        let mut posted: Vec<u64> = self.rx.peek_all().iter().map(|d| d.addr).collect();
        posted.extend(self.fq.pending());
        posted.extend(self.rx.peek_all().iter().map(|d| d.addr));
        let mut still = vec![false; self.pool.len()];
        for addr in posted {
            let i = self.index_of(addr) as usize;
            if let Some(s) = still.get_mut(i) {
                *s = true;
            }
        }
        let mut taken = 0;
        for (i, posted) in still.iter().enumerate() {
            let state = self.pool.ledger().get(i);
            let r = match (state, posted) {
                (Some(FrameState::Away), true) => self.pool.found_posted(i as u32),
                (Some(FrameState::Receive), false) => {
                    taken += 1;
                    self.pool.returned(i as u32)
                }
                _ => Ok(()),
            };
            if let Err(e) = r {
                tracing::error!("queue {}: {e}", self.queue_id);
            }
        }
        taken += self.pool.reclaim_away();
        // The exchange's word for whoever reads it: this side holds the queue alone.
        p.ex.set_phase(Phase::Left);
        tracing::warn!(
            "queue {}: the old process died without leaving: the queue is this process's alone \
             ({taken} frames it held are free again)",
            self.queue_id
        );
        Ok(taken)
    }

    /// Frames posted for receive, to measure the fill target against: the ledger's count, but
    /// on the new process of an upgrade the fill ring's own. There the ledger counts the
    /// frames it posted until they come back, and the old process may hold many of them (it
    /// keeps some free to send from): counted as posted, they would keep the ring from being
    /// filled while it runs dry.
    pub(super) fn posted_for_receive(&mut self) -> usize {
        match &self.partner {
            Some(p) if p.role == Role::New => {
                self.ring_size.saturating_sub(self.fq.free_exact()) as usize
            }
            _ => self.pool.count(FrameState::Receive),
        }
    }

    fn completed_here(&mut self, index: u32) {
        if let Err(e) = self.pool.completed(index) {
            tracing::error!("queue {}: {e}", self.queue_id);
        }
    }

    /// A frame arrived on the RX ring: one this side posted, or (while frames are away with
    /// the other process of an upgrade) one the other side did.
    pub(super) fn received(&mut self, index: u32) -> Result<(), corelane_frame::LedgerError> {
        if self.pool.count(FrameState::Away) > 0 {
            self.pool.received_shared(index)
        } else {
            self.pool.received(index)
        }
    }

    /// The kernel completed the send of frame `index`: this side's, or (on the new process of
    /// an upgrade) the old one's, which goes back to it: a frame this side did not send, be it
    /// one lent or one it posted that the old process received and sent back out in place.
    pub(super) fn completed(&mut self, index: u32) {
        if let Some(p) = self.partner.as_mut()
            && p.role == Role::New
            && self.pool.ledger().get(index as usize) != Some(FrameState::Transmit)
        {
            pass(&mut p.ex, &[index], self.queue_id);
            return;
        }
        if let Err(e) = self.pool.completed(index) {
            tracing::error!("queue {}: {e}", self.queue_id);
        }
    }

    /// Done with frame `index`: free, or, on the old process of an upgrade once it keeps
    /// enough free frames, back to the new one.
    pub(super) fn let_go(&mut self, index: u32) {
        if let Some(p) = self.partner.as_mut()
            && !self.owns_rings
            && self.pool.count(FrameState::Free) >= p.keep
        {
            match self.pool.give_back(index) {
                Ok(()) => {
                    pass(&mut p.ex, &[index], self.queue_id);
                }
                Err(e) => tracing::error!("queue {}: {e}", self.queue_id),
            }
            return;
        }
        if let Err(e) = self.pool.free(index) {
            tracing::error!("queue {}: {e}", self.queue_id);
        }
    }

    /// One turn of the upgrade: the old process hands the rings over once the new one is
    /// bound, and takes its forwarded completions; the new one takes the frames given back.
    pub(super) fn partner_turn(&mut self) {
        let Some(p) = self.partner.as_mut() else {
            return;
        };
        if p.role == Role::New {
            if p.called_off {
                return;
            }
            if p.calling_off || matches!(p.ex.phase(), Phase::Aborting | Phase::Aborted) {
                if !p.calling_off {
                    tracing::warn!(
                        "queue {}: the upgrade was called off: this process fills and sends no \
                         more, and lets the old one take the queue back",
                        self.queue_id
                    );
                }
                p.calling_off = true;
                // The completion ring stays this side's until its own sends are done, and the
                // frames it holds are released: a frame the kernel still reads, or that this
                // side could still write, is never given to the old process to reuse.
                let busy =
                    self.pool.count(FrameState::Transmit) + self.pool.count(FrameState::InUse);
                if busy == 0 {
                    self.owns_rings = false;
                    p.called_off = true;
                    p.ex.set_phase(Phase::Aborted);
                    tracing::info!(
                        "queue {}: this process has stood down from the upgrade",
                        self.queue_id
                    );
                }
                return;
            }
        }
        // Read before the frames it gave back: once it says so, all of them are on the way.
        let old_left = p.role == Role::New && p.ex.phase() == Phase::Left;
        if p.role == Role::Old && self.owns_rings && p.ex.advance(Phase::Bound, Phase::Handing) {
            // The completion ring was read this turn; what completes from here on, the new
            // process reads and forwards.
            let lend = self.pool.count(FrameState::Free).saturating_sub(p.keep);
            let mut lent = Vec::new();
            self.pool.lend(lend, |i| lent.push(i));
            pass(&mut p.ex, &lent, self.queue_id);
            self.pool.hand_over_receive();
            self.owns_rings = false;
            p.ex.set_phase(Phase::Handed);
            tracing::info!(
                "queue {}: fill and completion rings handed to the new process ({} frames lent)",
                self.queue_id,
                lent.len()
            );
        }
        let mut inbound = std::mem::take(&mut p.inbound);
        inbound.resize(self.scratch.len().max(64), 0);
        loop {
            let n = p.ex.inbound.pop(&mut inbound);
            for &i in &inbound[..n] {
                let r = match p.role {
                    Role::Old => self.pool.completed(i),
                    Role::New => self.pool.returned(i),
                };
                if let Err(e) = r {
                    tracing::error!("queue {}: {e}", self.queue_id);
                }
            }
            if n < inbound.len() {
                break;
            }
        }
        p.inbound = inbound;
        if old_left {
            // The upgrade is over: the queue is this process's alone.
            let posted = self.pool.away_were_posted();
            self.partner = None;
            tracing::info!(
                "queue {}: the old process has left ({posted} frames it posted are still in \
                 the fill ring)",
                self.queue_id
            );
            return;
        }
        if p.role == Role::Old && !self.owns_rings {
            // Completions make frames free here; past what it keeps to send from, the old
            // process gives them back.
            let extra = self.pool.count(FrameState::Free).saturating_sub(p.keep);
            let mut back = Vec::new();
            self.pool.lend(extra, |i| back.push(i));
            pass(&mut p.ex, &back, self.queue_id);
        }
    }
}

/// Passes `frames` to the other process. The exchange's rings hold every frame of the UMEM,
/// so none is ever left over; were one, it would be lost to both ledgers: said loudly.
fn pass(ex: &mut Exchange, frames: &[u32], queue: u32) {
    let pushed = ex.out.push(frames);
    if pushed < frames.len() {
        tracing::error!(
            "queue {queue}: the exchange took {pushed} of {} frames: {:?} are lost until the \
             upgrade ends",
            frames.len(),
            &frames[pushed..]
        );
    }
}

#[cfg(test)]
#[path = "partner_tests.rs"]
mod tests;
