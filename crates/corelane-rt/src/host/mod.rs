//! The host under the runtime: what a core's turn and the upgrade ask of the kernel, as
//! traits, so that they run over AF_XDP and the kernel's program (a real run) or over the
//! in-memory kernel (`corelane_xsk::SimKernel`, a simulation's, `crate::sim`) alike.
//!
//! - the queue's upgrade moves ([`UpgradeQueue`]): offer, call off, stand down, leave, on
//!   top of the frame moves every queue makes ([`FrameIo`]);
//! - the program's maps: `corelane_xsk::Steering`, attached, granted, or in memory
//!   (`Steering::in_memory`);
//! - the clock: `crate::clock::Clock`, the wall's or a virtual one.
//!
//! A core's queue is a [`Queue`]; the driver (`crate::driver::Driver`) is generic over it, so
//! the core's turn and its one run loop name no device. `xsk.rs` is the AF_XDP queue's side of
//! these traits, the one module of the host that names a concrete queue.

use std::os::fd::RawFd;

pub(crate) use data::{
    BindMode, CallOff, CookieParams, FrameCounts, FrameIo, KernelRoute, Steering, SteeringShare,
    TX_NUDGE_AFTER, UpgradeOffer, UpgradePhase, XdpCounters, XskError, monotonic_ns,
};

pub(crate) mod data;
#[cfg(any(test, feature = "sim"))]
pub(crate) mod mem;
pub(crate) mod xsk;

use crate::Error;

/// The moves an upgrade makes on one queue, besides its frame moves.
pub(crate) trait UpgradeQueue: FrameIo {
    /// Where the queue's hand-over stands (None: no upgrade).
    fn upgrade_phase(&self) -> Option<UpgradePhase>;
    /// The old process offers the queue to a new one.
    fn offer_upgrade(&mut self) -> Result<UpgradeOffer, Error>;
    /// The old process takes the queue back (see `XskQueue::call_off_upgrade`).
    fn call_off_upgrade(&mut self, partner_gone: bool) -> Result<CallOff, Error>;
    /// The new process stands down from the queue.
    fn stand_down(&mut self);
    /// The new process: the old one has called the upgrade off.
    fn upgrade_called_off(&self) -> bool;
    /// The old process leaves the queue to the new one: true once it has.
    fn leave_upgrade(&mut self) -> Result<bool, Error>;
    /// The new process outlives the old one, dead before it left: the queue is its alone.
    fn outlive_partner(&mut self) -> Result<usize, Error>;
}

/// A core's queue as its driver turns it: the frame moves ([`FrameIo`]), the upgrade's
/// ([`UpgradeQueue`]), and what the one run loop (`Driver::run`) asks of it to wait and to
/// measure. An AF_XDP queue (`xsk.rs`) over the kernel or over the in-memory kernel.
pub(crate) trait Queue: UpgradeQueue + 'static {
    /// The descriptor that turns readable when frames arrive for the core, which sleeps on
    /// it; None where nothing arrives from outside the process (an in-memory queue: a task's
    /// kick, a doorbell or a deadline wakes the core).
    fn wake_fd(&self) -> Option<RawFd>;
    /// The next frame received records its receive stamp, if stamped at `not_before_ns` (the
    /// host's monotonic clock) or later.
    fn want_rx_stamp(&mut self, not_before_ns: u64);
    /// The stamp asked for with [`Queue::want_rx_stamp`], once a frame brought it.
    fn take_rx_stamp(&mut self) -> Option<u64>;
    /// Frames are in transmit: their completion wakes nothing, so an idle core looks again
    /// after [`TX_NUDGE_AFTER`].
    fn tx_in_flight(&self) -> bool;
}

/// The other process of an upgrade, as this one sees whether it has ended, and ends it: a
/// pidfd (`xsk.rs`), or a simulation's process.
pub(crate) trait Partner: std::fmt::Debug + Send {
    /// Whether the process has ended.
    fn ended(&self) -> bool;
    /// Ends the process (`SIGKILL` through its pidfd, which names it and no other): once it
    /// has ended, nothing of it touches a ring or a frame. Returns its pid.
    fn kill(&self) -> Result<u32, String>;
}

/// What one process of an upgrade heard from the other ([`Talk::hear`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Heard {
    /// Nothing yet.
    Nothing,
    /// A word.
    Word(crate::upgrade_words::Word),
    /// The connection ended (or failed: the same to an upgrade).
    Ended,
}

/// The connection between the two processes of an upgrade: a unix socket (`SocketTalk` in
/// `host/xsk/handover.rs`), or a simulation's mailbox. Never blocks: the sides are machines a
/// thread (or a simulation's step) polls.
pub(crate) trait Talk {
    /// Says `word` to the other process.
    fn say(&mut self, word: &crate::upgrade_words::Word) -> std::io::Result<()>;
    /// What the other process said since the last call, one word at a time.
    fn hear(&mut self) -> Heard;
    /// The old process: hands the queues' offers over, with the program unless a broker
    /// holds it (`program` is then None), and `extras` (the run's secret, the generation, the
    /// ports).
    fn hand_over(
        &mut self,
        program: Option<SteeringShare>,
        offers: Vec<UpgradeOffer>,
        extras: &str,
    ) -> Result<(), Error>;
}
