//! The rings two processes sharing a queue's UMEM pass frames on (an upgrade): one each way,
//! of frame indices, in a memory file both map, laid out as the kernel lays out its rings (so
//! the same [`Producer`] and [`Consumer`] serve), and a word saying how far the hand-over is.
//!
//! The old process gives back on its ring the frames it is done with (received ones, and its
//! free ones when it leaves); the new one, which consumes the shared completion ring, forwards
//! on the other ring the completions of frames the old one sent. The frame ledger's moves for
//! each are `FramePool::give_back`, `returned`, and `completed` (see corelane-frame).

#![allow(unsafe_code)] // The hand-over word is read and written in the shared mapping.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use super::ring::{Consumer, Producer, Region, RingOffsets};

const PAGE: usize = 4096;

/// Where a ring's indices and entries are in its pages.
const OFFSETS: RingOffsets = RingOffsets {
    producer: 0,
    consumer: 64,
    flags: 128,
    desc: 192,
};

/// Bytes from one ring's first page to the next ring's.
fn ring_pages(size: u32) -> usize {
    (OFFSETS.desc as usize + size as usize * 4).next_multiple_of(PAGE)
}

/// How far an upgrade of a queue is (see [`XskQueue::offer_upgrade`](crate::XskQueue)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Phase {
    /// Offered: the old process serves the queue alone.
    Offered = 0,
    /// The new process is bound beside the old one, which fills and completes until its next
    /// turn.
    Bound = 1,
    /// The old process is handing the rings over (the new one can no longer withdraw).
    Handing = 2,
    /// The new process fills and completes; the old one drains.
    Handed = 3,
    /// The old process has given back every frame and is leaving.
    Left = 4,
    /// The upgrade is being called off after the hand-over: the new process stops filling the
    /// fill ring and sending, lets its last sends complete, then says [`Phase::Aborted`].
    Aborting = 5,
    /// Called off: the new process touches none of the queue's rings or frames any more (or
    /// never did); the old process takes the queue back.
    Aborted = 6,
}

/// One process's end of the exchange.
#[derive(Debug)]
pub(crate) struct Exchange {
    /// Frames this side passes to the other.
    pub(crate) out: Producer<u32>,
    /// Frames the other side passes to this one.
    pub(crate) inbound: Consumer<u32>,
    region: Region,
}

impl Exchange {
    /// The old process's end: a new exchange with rings of `size` entries (a power of two).
    pub(crate) fn create(size: u32) -> io::Result<Exchange> {
        let region = Region::new(PAGE + 2 * ring_pages(size))?;
        Exchange::open(region, size, false)
    }

    /// The new process's end, over the memory file the old one passed.
    pub(crate) fn join(file: OwnedFd, size: u32) -> io::Result<Exchange> {
        let region = Region::map(file, PAGE + 2 * ring_pages(size))?;
        Exchange::open(region, size, true)
    }

    fn open(region: Region, size: u32, new: bool) -> io::Result<Exchange> {
        let first = PAGE as u64;
        let second = (PAGE + ring_pages(size)) as u64;
        let (out, inbound) = if new {
            (second, first)
        } else {
            (first, second)
        };
        Ok(Exchange {
            out: Producer::map(region.file(), OFFSETS, out, size)?,
            inbound: Consumer::map(region.file(), OFFSETS, inbound, size)?,
            region,
        })
    }

    /// The memory file, to pass to the new process.
    pub(crate) fn file(&self) -> BorrowedFd<'_> {
        self.region.file()
    }

    fn word(&self) -> &AtomicU32 {
        // SAFETY: the first word of the region's first page, 4-byte aligned (a page is), lives
        // as long as `self`; both processes touch it only atomically.
        unsafe { &*(self.region.addr() as *const AtomicU32) }
    }

    /// How far the hand-over is.
    pub(crate) fn phase(&self) -> Phase {
        match self.word().load(Ordering::Acquire) {
            0 => Phase::Offered,
            1 => Phase::Bound,
            2 => Phase::Handing,
            3 => Phase::Handed,
            4 => Phase::Left,
            5 => Phase::Aborting,
            // Anything else is no phase either side wrote: neither may go on.
            _ => Phase::Aborted,
        }
    }

    /// Moves the hand-over from `from` to `to` if it is still at `from` (what the two sides
    /// race for: the old one starting to hand over, the new one withdrawing). Returns whether
    /// it moved.
    pub(crate) fn advance(&self, from: Phase, to: Phase) -> bool {
        self.word()
            .compare_exchange(from as u32, to as u32, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Moves the hand-over on (release: what this side wrote before is seen by the other once
    /// it reads the new phase).
    pub(crate) fn set_phase(&self, p: Phase) {
        self.word().store(p as u32, Ordering::Release);
    }
}

#[cfg(test)]
#[path = "exchange_tests.rs"]
mod tests;
