//! corelane's frame layer: what the protocol stack and the AF_XDP sockets both need, with no
//! system dependency, so the protocol crate builds and tests on any OS.
//!
//! - [`FrameIo`]: batches of frames in and out of a UMEM (`recv`, `release`, `alloc`, `send`,
//!   `complete`). Implemented by `corelane_xsk::XskQueue` (a real AF_XDP socket), by
//!   [`MemPort`] (an in-memory link that copies frames the way the kernel's copy mode does) and
//!   by [`FaultInjector`] (drops and corrupts frames of any `FrameIo`, from a seed).
//! - [`FrameLedger`] and [`FramePool`]: every frame is in exactly one place; a move from the
//!   wrong place is refused where it happens.
//! - [`Frame`] handles are unique and branded with their UMEM ([`UmemId`]): a frame of one
//!   queue handed to another queue's `bytes` is refused (a panic), never read.
//!
//! ```
//! use std::collections::VecDeque;
//! use corelane_frame::{FrameIo, MemLink};
//!
//! let (mut a, mut b) = MemLink::default().pair();
//! let mut tx = Vec::new();
//! a.alloc(&mut tx, 1);
//! a.bytes_mut(&mut tx[0], 5).copy_from_slice(b"hello");
//! a.send(&mut tx)?;
//! let mut rx = VecDeque::new();
//! assert_eq!(b.recv(&mut rx, 8), 1);
//! assert_eq!(b.bytes(&rx[0]), b"hello");
//! b.release(&mut rx.drain(..).collect());
//! # Ok::<(), std::io::Error>(())
//! ```

#![deny(unsafe_code)]

mod fault;
#[cfg(test)]
mod handover_tests;
mod ledger;
mod mem;
mod pool;
mod seeded;

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};

pub use fault::{FaultConfig, FaultInjector, FaultStats};
pub use ledger::{FrameCounts, FrameLedger, FrameState, LedgerError};
pub use mem::{MemFrame, MemLink, MemPort, MemStats};
pub use pool::FramePool;
pub use seeded::SplitMix64;

/// Transport protocols whose ports a flow, a listener or the steering program can own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Proto {
    /// "TCP" or "UDP".
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
        }
    }
}

impl std::fmt::Display for Proto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Names one UMEM (one queue's frame memory) for the life of the process. Every [`Frame`]
/// carries the id of the UMEM it belongs to, and a [`FrameIo`] refuses frames of another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UmemId(u32);

impl UmemId {
    /// A new id, never handed out before in this process.
    pub fn fresh() -> UmemId {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        UmemId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// Checks that `frame` belongs to this UMEM: reading or writing another UMEM's frame
    /// through this one would touch a frame the kernel may own.
    ///
    /// # Panics
    /// When `frame` belongs to another UMEM.
    #[inline]
    #[track_caller]
    pub fn check(self, frame: &impl Frame) {
        assert!(
            frame.umem() == self,
            "frame {} of UMEM {:?} used with UMEM {:?}",
            frame.index(),
            frame.umem(),
            self
        );
    }
}

/// A frame handle. Handles are unique (neither `Clone` nor `Copy`): holding one is what gives the
/// right to read or write the frame's bytes, through the [`FrameIo`] of the UMEM it names.
pub trait Frame: std::fmt::Debug {
    /// The UMEM the frame belongs to.
    fn umem(&self) -> UmemId;
    /// The frame's index in its UMEM.
    fn index(&self) -> usize;
    /// Bytes of packet data in the frame.
    fn len(&self) -> usize;
    /// True when the frame holds no data.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Batched frame I/O over a UMEM.
///
/// Frames move: `recv` (kernel -> user), `release` (user -> fill ring), `alloc` (free -> user),
/// `send` (user -> TX ring, one kick), `complete` (completion ring -> free, and the fill ring
/// topped up), `free` (an allocated frame given back unused).
pub trait FrameIo {
    /// The frame handle type.
    type Frame: Frame;

    /// Largest packet a frame can hold.
    fn frame_capacity(&self) -> usize;

    /// The received bytes of `frame`.
    ///
    /// # Panics
    /// When `frame` belongs to another UMEM.
    fn bytes<'a>(&'a self, frame: &'a Self::Frame) -> &'a [u8];

    /// Sets `frame`'s length to `len` (at most [`FrameIo::frame_capacity`]) and returns its bytes
    /// for writing.
    ///
    /// # Panics
    /// When `frame` belongs to another UMEM.
    fn bytes_mut<'a>(&'a self, frame: &'a mut Self::Frame, len: usize) -> &'a mut [u8];

    /// Moves up to `max` received frames to the back of `out`; returns how many.
    fn recv(&mut self, out: &mut VecDeque<Self::Frame>, max: usize) -> usize;

    /// Gives processed receive frames back to the kernel's fill ring (draining `frames`).
    fn release(&mut self, frames: &mut Vec<Self::Frame>);

    /// Moves up to `n` free frames to `out` for writing; returns how many.
    fn alloc(&mut self, out: &mut Vec<Self::Frame>, n: usize) -> usize;

    /// Returns allocated frames that were not sent (draining `frames`).
    fn free(&mut self, frames: &mut Vec<Self::Frame>);

    /// Queues written frames for transmit (draining `frames`) and kicks the kernel once for the
    /// batch. Returns how many were queued; frames that did not fit are freed and counted.
    ///
    /// # Errors
    /// When the kernel refuses the kick.
    fn send(&mut self, frames: &mut Vec<Self::Frame>) -> io::Result<usize>;

    /// Reclaims sent frames from the completion ring and tops up the fill ring; returns how many
    /// frames were reclaimed.
    ///
    /// # Errors
    /// When a wake-up of the kernel fails.
    fn complete(&mut self) -> io::Result<usize>;

    /// Where every frame is now.
    fn counts(&mut self) -> FrameCounts;

    /// Frames kept posted for receive: the fill ring's occupancy target.
    fn fill_target(&self) -> usize;

    /// Sets the fill ring's occupancy target (clamped to what the rings and frames allow) and
    /// returns the value set. Lowering it takes effect as posted frames come back; frames the
    /// kernel already holds stay posted.
    fn set_fill_target(&mut self, frames: usize) -> usize;

    /// Received frames dropped below this side so far, for want of a fill frame or RX ring room
    /// (may cost a system call: read it every so many turns, not every frame).
    fn rx_drops(&mut self) -> u64;

    /// Whether a frame's TCP or UDP checksum may be left to the device
    /// ([`FrameIo::finish_checksum`]); false (the default) where it cannot finish one.
    fn checksum_offload(&self) -> bool {
        false
    }

    /// Asks the device to finish `frame`'s TCP or UDP checksum (the frame written, its length
    /// set): the ones'-complement sum of its bytes from `start` to the end, over the
    /// pseudo-header's sum that the checksum field at `start + offset` holds, stored there
    /// complemented. False when it cannot for this frame: the caller finishes it itself.
    fn finish_checksum(&self, frame: &mut Self::Frame, start: usize, offset: usize) -> bool {
        let _ = (frame, start, offset);
        false
    }
}
