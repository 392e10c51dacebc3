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
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use super::exchange::{Exchange, Phase};
use super::shared::Joined;
use super::{Parts, XskConfig, XskQueue};
use crate::error::Error;
use corelane_frame::{FramePool, FrameState};

/// Which of the two processes this side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Old,
    New,
}

/// The other process of an upgrade, as one queue sees it.
#[derive(Debug)]
pub(super) struct Partner {
    ex: Exchange,
    role: Role,
    /// Free frames the old process keeps to send from after the hand-over.
    keep: usize,
    /// The old process's fill target before the hand-over (restored if it takes the queue
    /// back).
    fill_target: usize,
    inbound: Vec<u32>,
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

/// How long the new process waits for the old one's hand-over (the old one hands over at its
/// next turn: milliseconds unless it is stuck).
const HAND_OVER_WAIT: Duration = Duration::from_secs(5);

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
        self.partner = Some(Box::new(Partner {
            ex,
            role: Role::Old,
            keep: (self.ring_size as usize).min(self.frames as usize / 4),
            fill_target: self.pool.fill_target(),
            inbound: Vec::new(),
        }));
        Ok(offer)
    }

    /// Joins the queue `offer` names on `ifname`, beside the process that offered it: binds a
    /// socket sharing its UMEM, waits for it to hand the fill and completion rings over, and
    /// returns the queue, which from then on fills and completes for both.
    pub fn join_upgrade(ifname: &str, offer: UpgradeOffer) -> Result<XskQueue, Error> {
        let c = offer.config;
        let io_err = |what: &str, e: io::Error| Error::Umem {
            errno: e.raw_os_error(),
            detail: format!("joining queue {} of {ifname}: {what}: {e}", offer.queue_id),
        };
        let len = c.frames as usize * c.frame_bytes() as usize;
        let joined = Joined::open(
            ifname,
            offer.queue_id,
            offer.socket.as_fd(),
            offer.umem,
            len,
            c.ring_size,
        )?;
        drop(offer.socket);
        let ex = Exchange::join(offer.exchange, c.frames.next_power_of_two())
            .map_err(|e| io_err("the exchange", e))?;
        if !ex.advance(Phase::Offered, Phase::Bound) {
            return Err(Error::Config(format!(
                "queue {} of {ifname}: offered to another process already ({:?})",
                offer.queue_id,
                ex.phase()
            )));
        }
        let start = Instant::now();
        while ex.phase() != Phase::Handed {
            // Withdrawn unless the old process has begun handing over (then it finishes).
            if start.elapsed() > HAND_OVER_WAIT && ex.advance(Phase::Bound, Phase::Offered) {
                return Err(Error::Config(format!(
                    "queue {} of {ifname}: the process serving it did not hand it over within \
                     {HAND_OVER_WAIT:?}",
                    offer.queue_id
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // Mapped now, after the hand-over: the rings' indices are where the old process left
        // them.
        let (fq, cq) = joined
            .fill_and_completion()
            .map_err(|e| io_err("the fill and completion rings", e))?;
        let n = c.frames as usize;
        let parts = Parts {
            socket: joined.socket,
            rx: joined.rings.rx,
            tx: joined.rings.tx,
            fq,
            cq,
            umem: joined.umem,
        };
        let pool = FramePool::joining(n, (c.ring_size as usize).min(n / 2));
        let mut q = XskQueue::assemble(parts, &c, offer.queue_id, pool);
        q.partner = Some(Box::new(Partner {
            ex,
            role: Role::New,
            keep: 0,
            fill_target: 0,
            inbound: Vec::new(),
        }));
        q.partner_turn();
        q.top_up_fill()?;
        Ok(q)
    }

    /// Where an upgrade of this queue stands (None: none under way).
    pub fn upgrade_phase(&self) -> Option<Phase> {
        self.partner.as_ref().map(|p| p.ex.phase())
    }

    /// The old process leaves an upgrade: every frame it holds goes to the new process. Call
    /// it once the program steers nothing more to this socket and its RX ring was read empty.
    ///
    /// # Errors
    /// When frames are still held (received and not released) or still being sent: call
    /// again after the next turns.
    pub fn leave_upgrade(&mut self) -> Result<(), Error> {
        let Some(p) = self.partner.as_mut().filter(|p| p.role == Role::Old) else {
            return Err(Error::Config("no upgrade to leave".into()));
        };
        if p.ex.phase() != Phase::Handed {
            return Err(Error::Config(
                "the new process has not taken the queue yet".into(),
            ));
        }
        let busy = self.pool.count(FrameState::InUse) + self.pool.count(FrameState::Transmit);
        if busy > 0 {
            return Err(Error::Config(format!(
                "{busy} frames are still held or being sent"
            )));
        }
        let mut gone = Vec::new();
        self.pool.lend(usize::MAX, |i| gone.push(i));
        let pushed = p.ex.out.push(&gone);
        debug_assert_eq!(pushed, gone.len(), "the exchange holds every frame");
        p.ex.set_phase(Phase::Left);
        Ok(())
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
            p.ex.out.push(&[index]);
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
                    p.ex.out.push(&[index]);
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
        // Read before the frames it gave back: once it says so, all of them are on the way.
        let old_left = p.role == Role::New && p.ex.phase() == Phase::Left;
        if p.role == Role::Old && self.owns_rings && p.ex.advance(Phase::Bound, Phase::Handing) {
            // The completion ring was read this turn; what completes from here on, the new
            // process reads and forwards.
            let lend = self.pool.count(FrameState::Free).saturating_sub(p.keep);
            let mut lent = Vec::new();
            self.pool.lend(lend, |i| lent.push(i));
            p.ex.out.push(&lent);
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
            p.ex.out.push(&back);
        }
    }
}

#[cfg(test)]
#[path = "partner_tests.rs"]
mod tests;
