//! The new process's side of joining an upgrade ([`PendingJoin`]), and the check that no frame
//! is in both processes' hands ([`frames_in_two_hands`]).

use std::io;
use std::os::fd::{AsFd, RawFd};
use std::time::{Duration, Instant};

use super::exchange::{Exchange, Phase};
use super::partner::{Partner, Role, UpgradeOffer};
use super::shared::Joined;
#[cfg(any(test, feature = "sim"))]
use super::sim::SimKernel;
use super::{Parts, XskConfig, XskQueue};
use crate::error::Error;
use corelane_frame::{FramePool, FrameState};

/// How long the new process waits for the old one's hand-over (the old one hands over at its
/// next turn: milliseconds unless it is stuck).
const HAND_OVER_WAIT: Duration = Duration::from_secs(5);

/// The frames the two processes of an upgrade of one queue both hold at once, by their two
/// ledgers: held by user space (free or in use) on both sides, or on one side while the other
/// has it with the kernel for transmit, or sent by both. Empty when every frame is in one
/// place. A new process that has stood down holds nothing (it touches nothing). A check for
/// tests and simulations, over both ends in one address space.
pub fn frames_in_two_hands(old: &XskQueue, new: &XskQueue) -> Vec<usize> {
    let state = |q: &XskQueue, i: usize| {
        if q.upgrade_called_off() {
            None
        } else {
            q.pool.ledger().get(i)
        }
    };
    let held = |s: Option<FrameState>| matches!(s, Some(FrameState::Free | FrameState::InUse));
    let sent = |s: Option<FrameState>| s == Some(FrameState::Transmit);
    (0..old.pool.len().min(new.pool.len()))
        .filter(|&i| {
            let (a, b) = (state(old, i), state(new, i));
            (held(a) && (held(b) || sent(b))) || (held(b) && sent(a)) || (sent(a) && sent(b))
        })
        .collect()
}

impl XskQueue {
    /// Joins the queue `offer` names on `ifname`, beside the process that offered it: binds a
    /// socket sharing its UMEM, waits for it to hand the fill and completion rings over, and
    /// returns the queue, which from then on fills and completes for both. The two steps of
    /// [`PendingJoin`] at once.
    pub fn join_upgrade(ifname: &str, offer: UpgradeOffer) -> Result<XskQueue, Error> {
        PendingJoin::bind(ifname, offer)?.take_over()
    }
}

/// The new process's socket on a queue an old process offered, bound beside it but not yet
/// holding the fill and completion rings ([`XskQueue::join_upgrade`] in two steps). Made where
/// the new process has its privileges ([`PendingJoin::bind`]); the rings are taken by
/// [`PendingJoin::take_over`] on the core that will turn them, so that no moment passes with
/// the rings held and nobody filling them. Dropped before, it leaves the queue to the old
/// process: withdrawn, or, if the old process has already handed the rings over, said to be
/// untouched ([`Phase::Aborted`]) so that it takes them back at once.
#[derive(Debug)]
pub struct PendingJoin {
    inner: Option<Pending>,
}

#[derive(Debug)]
struct Pending {
    joined: Joined,
    ex: Exchange,
    config: XskConfig,
    queue_id: u32,
    ifname: String,
}

impl Drop for PendingJoin {
    fn drop(&mut self) {
        if let Some(p) = &self.inner
            && !p.ex.advance(Phase::Bound, Phase::Offered)
            && matches!(p.ex.phase(), Phase::Handing | Phase::Handed)
        {
            // Handed to this side, which never touched a ring or a frame.
            while p.ex.phase() == Phase::Handing {
                std::thread::yield_now();
            }
            p.ex.set_phase(Phase::Aborted);
        }
    }
}

impl PendingJoin {
    /// Binds a socket to the queue `offer` names on `ifname`, sharing the old process's UMEM.
    ///
    /// # Errors
    /// The socket cannot be made or bound, the exchange cannot be mapped, or the offer was
    /// taken or called off already.
    pub fn bind(ifname: &str, offer: UpgradeOffer) -> Result<PendingJoin, Error> {
        let c = offer.config;
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
        Self::with(joined, offer.exchange, c, offer.queue_id, ifname)
    }

    /// As [`PendingJoin::bind`], on the in-memory kernel's queue.
    ///
    /// # Errors
    /// As [`PendingJoin::bind`].
    #[cfg(any(test, feature = "sim"))]
    pub fn bind_sim(kernel: &SimKernel, offer: UpgradeOffer) -> Result<PendingJoin, Error> {
        let c = offer.config;
        let len = c.frames as usize * c.frame_bytes() as usize;
        let joined = Joined::open_sim(kernel, offer.umem, len, c.ring_size)?;
        Self::with(joined, offer.exchange, c, offer.queue_id, "sim")
    }

    fn with(
        joined: Joined,
        exchange: std::os::fd::OwnedFd,
        c: XskConfig,
        queue_id: u32,
        ifname: &str,
    ) -> Result<PendingJoin, Error> {
        let ex =
            Exchange::join(exchange, c.frames.next_power_of_two()).map_err(|e| Error::Umem {
                errno: e.raw_os_error(),
                detail: format!("joining queue {queue_id} of {ifname}: the exchange: {e}"),
            })?;
        if ex.phase() != Phase::Offered {
            return Err(Error::Config(format!(
                "queue {queue_id} of {ifname}: offered to another process already, or called off \
                 ({:?})",
                ex.phase()
            )));
        }
        Ok(PendingJoin {
            inner: Some(Pending {
                joined,
                ex,
                config: c,
                queue_id,
                ifname: ifname.to_string(),
            }),
        })
    }

    /// Its parts: held until `try_take_over` moves them into the queue, which consumes this.
    fn pending(&self) -> Result<&Pending, Error> {
        self.inner
            .as_ref()
            .ok_or_else(|| Error::Config("the join was taken over already".into()))
    }

    /// The socket's descriptor, to register in the program's next generation.
    pub fn fd(&self) -> RawFd {
        self.pending().map_or(-1, |p| p.joined.socket.raw())
    }

    /// The queue.
    pub fn queue_id(&self) -> u32 {
        self.pending().map_or(u32::MAX, |p| p.queue_id)
    }

    /// Asks the old process for the fill and completion rings: it hands them over on its next
    /// turn ([`PendingJoin::try_take_over`] sees it).
    ///
    /// # Errors
    /// The old process called the upgrade off, or gave the queue to another process.
    pub fn ask(&self) -> Result<(), Error> {
        let p = self.pending()?;
        if p.ex.advance(Phase::Offered, Phase::Bound) {
            return Ok(());
        }
        Err(Error::Config(format!(
            "queue {} of {}: the old process called the upgrade off, or gave the queue to \
             another process ({:?})",
            p.queue_id,
            p.ifname,
            p.ex.phase()
        )))
    }

    /// Withdraws the question unless the old process has begun handing over. True when
    /// withdrawn (the queue is offered again).
    pub fn withdraw(&self) -> bool {
        self.pending()
            .is_ok_and(|p| p.ex.advance(Phase::Bound, Phase::Offered))
    }

    /// The queue, once the old process has handed the rings over (after
    /// [`PendingJoin::ask`]); this pending join back while it has not yet.
    ///
    /// # Errors
    /// The old process called the upgrade off, or the rings cannot be mapped.
    pub fn try_take_over(mut self) -> Result<Result<XskQueue, PendingJoin>, Error> {
        let p = self.pending()?;
        match p.ex.phase() {
            Phase::Handed => {}
            Phase::Bound | Phase::Handing => return Ok(Err(self)),
            other => {
                return Err(Error::Config(format!(
                    "queue {} of {}: the old process called the upgrade off ({other:?})",
                    p.queue_id, p.ifname
                )));
            }
        }
        let Some(Pending {
            joined,
            ex,
            config: c,
            queue_id,
            ifname,
        }) = self.inner.take()
        else {
            return Err(Error::Config("the join was taken over already".into()));
        };
        // Mapped now, after the hand-over: the rings' indices are where the old process left
        // them.
        let (fq, cq) = joined
            .fill_and_completion()
            .map_err(|e: io::Error| Error::Umem {
                errno: e.raw_os_error(),
                detail: format!(
                    "joining queue {queue_id} of {ifname}: the fill and completion rings: {e}"
                ),
            })?;
        let parts = Parts {
            socket: joined.socket,
            rx: joined.rings.rx,
            tx: joined.rings.tx,
            fq,
            cq,
            umem: joined.umem,
        };
        let pool = FramePool::joining(c.frames as usize, XskQueue::fill_share(&c));
        let mut q = XskQueue::assemble(parts, &c, queue_id, pool);
        q.partner = Some(Partner::new(ex, Role::New, 0, 0));
        q.partner_turn();
        q.top_up_fill()?;
        Ok(Ok(q))
    }

    /// Asks for the rings, waits (at most 5 s; the old process hands over on
    /// its next turn) and returns the queue, which from then on fills and completes for both.
    /// Call it where the queue will be turned at once.
    ///
    /// # Errors
    /// The old process called the upgrade off, or did not hand over in time (then this side
    /// withdraws and the old process keeps the queue).
    pub fn take_over(self) -> Result<XskQueue, Error> {
        self.ask()?;
        let start = Instant::now();
        let mut pending = self;
        loop {
            pending = match pending.try_take_over()? {
                Ok(q) => return Ok(q),
                Err(p) => p,
            };
            // Withdrawn unless the old process has begun handing over (then it finishes).
            if start.elapsed() > HAND_OVER_WAIT && pending.withdraw() {
                let p = pending.pending()?;
                return Err(Error::Config(format!(
                    "queue {} of {}: the process serving it did not hand it over within \
                     {HAND_OVER_WAIT:?}",
                    p.queue_id, p.ifname
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
