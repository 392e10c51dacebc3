//! The frame-level interface the protocol stages drive: batches of frames in and out of a UMEM.
//!
//! [`FrameIo`] is implemented by [`XskQueue`](crate::XskQueue) (a real AF_XDP socket) and by
//! [`MemPort`] (an in-memory link between two ports that behaves like the kernel's copy-mode
//! path), so the same stack code runs over both.

use std::collections::VecDeque;
use std::io;

use crate::ledger::FrameCounts;

/// A frame handle. Handles are unique (neither `Clone` nor `Copy`): holding one is what gives the
/// right to read or write the frame's bytes.
pub trait Frame: std::fmt::Debug {
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
    fn bytes<'a>(&'a self, frame: &'a Self::Frame) -> &'a [u8];

    /// Sets `frame`'s length to `len` (at most [`FrameIo::frame_capacity`]) and returns its bytes
    /// for writing.
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
    fn send(&mut self, frames: &mut Vec<Self::Frame>) -> io::Result<usize>;

    /// Reclaims sent frames from the completion ring and tops up the fill ring; returns how many
    /// frames were reclaimed.
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
}

// ---------------------------------------------------------------------------------------------
// In-memory link
// ---------------------------------------------------------------------------------------------

use std::cell::RefCell;
use std::rc::Rc;

use crate::ledger::{FrameLedger, FrameState};

/// A frame of a [`MemPort`].
#[derive(Debug)]
pub struct MemFrame {
    index: u32,
    len: u32,
}

impl Frame for MemFrame {
    fn index(&self) -> usize {
        self.index as usize
    }
    fn len(&self) -> usize {
        self.len as usize
    }
}

/// Frame memory owned by one port, read and written through raw slices the way a UMEM is.
#[derive(Debug)]
struct Region {
    ptr: *mut u8,
    frame_size: usize,
    frames: usize,
    _buf: Box<[u8]>,
}

impl Region {
    fn new(frames: usize, frame_size: usize) -> Self {
        let mut buf = vec![0u8; frames * frame_size].into_boxed_slice();
        Region {
            ptr: buf.as_mut_ptr(),
            frame_size,
            frames,
            _buf: buf,
        }
    }

    /// # Safety
    /// The caller holds the unique handle for frame `index` (or is the simulated kernel acting on
    /// a frame the ledger gives it), so no other reference to these bytes exists.
    unsafe fn slice_mut<'a>(&self, index: usize, len: usize) -> &'a mut [u8] {
        assert!(index < self.frames && len <= self.frame_size);
        // SAFETY: in bounds (asserted); exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(index * self.frame_size), len) }
    }
}

/// The simulated kernel side of one port: its rings.
#[derive(Debug, Default)]
struct Rings {
    fill: VecDeque<u32>,
    rx: VecDeque<(u32, u32)>,
    completion: VecDeque<u32>,
    ring_size: usize,
    rx_dropped: u64,
}

/// Counters of a [`MemPort`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemStats {
    /// Frames this port sent.
    pub sent: u64,
    /// Frames the peer could not take (no fill frame or full RX ring).
    pub peer_dropped: u64,
    /// Frames dropped on purpose by the loss setting.
    pub lost: u64,
    /// Frames refused because the TX ring was full.
    pub tx_ring_full: u64,
}

/// One end of an in-memory link. Bytes are copied from the sender's frame into a receive frame
/// the peer put in its fill ring, as the kernel does for AF_XDP in copy mode.
#[derive(Debug)]
pub struct MemPort {
    region: Rc<Region>,
    me: Rc<RefCell<Rings>>,
    peer: Rc<RefCell<Rings>>,
    peer_region: Rc<Region>,
    ledger: FrameLedger,
    free: Vec<u32>,
    fill_target: usize,
    stats: MemStats,
    loss_every: u64,
}

/// Builds a connected pair of [`MemPort`]s.
#[derive(Debug, Clone, Copy)]
pub struct MemLink {
    /// Frames per port.
    pub frames: usize,
    /// Bytes per frame.
    pub frame_size: usize,
    /// Entries per ring.
    pub ring_size: usize,
}

impl Default for MemLink {
    fn default() -> Self {
        MemLink {
            frames: 4096,
            frame_size: 2048,
            ring_size: 2048,
        }
    }
}

impl MemLink {
    /// Two ports joined back to back, each with its fill ring stocked.
    pub fn pair(self) -> (MemPort, MemPort) {
        let ra = Rc::new(Region::new(self.frames, self.frame_size));
        let rb = Rc::new(Region::new(self.frames, self.frame_size));
        let ka = Rc::new(RefCell::new(Rings {
            ring_size: self.ring_size,
            ..Rings::default()
        }));
        let kb = Rc::new(RefCell::new(Rings {
            ring_size: self.ring_size,
            ..Rings::default()
        }));
        let mk = |region: &Rc<Region>, me: &Rc<RefCell<Rings>>, pr: &Rc<Region>, peer| {
            let mut p = MemPort {
                region: region.clone(),
                me: Rc::clone(me),
                peer,
                peer_region: pr.clone(),
                ledger: FrameLedger::new(self.frames),
                free: (0..self.frames as u32).rev().collect(),
                fill_target: self.ring_size.min(self.frames / 2),
                stats: MemStats::default(),
                loss_every: 0,
            };
            p.top_up_fill();
            p
        };
        let a = mk(&ra, &ka, &rb, Rc::clone(&kb));
        let b = mk(&rb, &kb, &ra, ka);
        (a, b)
    }
}

impl MemPort {
    fn top_up_fill(&mut self) {
        let mut k = self.me.borrow_mut();
        while self.ledger.count(FrameState::Receive) < self.fill_target
            && k.fill.len() < k.ring_size
        {
            let Some(i) = self.free.pop() else { break };
            self.ledger
                .advance(i as usize, FrameState::Free, FrameState::Receive)
                .expect("free list holds free frames");
            k.fill.push_back(i);
        }
    }

    /// Drops every `n`th frame this port sends (0: none), to exercise retransmission.
    pub fn set_loss_every(&mut self, n: u64) {
        self.loss_every = n;
    }

    /// Counters so far.
    pub fn stats(&self) -> MemStats {
        self.stats
    }

    /// Frames dropped at this port's receive side for want of a fill frame or RX ring room.
    pub fn rx_dropped(&self) -> u64 {
        self.me.borrow().rx_dropped
    }

    /// Puts raw bytes on the wire towards the peer, as if another host sent them. Returns false
    /// when the peer had no room.
    pub fn inject(&mut self, bytes: &[u8]) -> bool {
        deliver(&self.peer, &self.peer_region, bytes)
    }
}

fn deliver(peer: &RefCell<Rings>, region: &Region, bytes: &[u8]) -> bool {
    let mut k = peer.borrow_mut();
    if k.rx.len() >= k.ring_size || bytes.len() > region.frame_size {
        k.rx_dropped += 1;
        return false;
    }
    let Some(i) = k.fill.pop_front() else {
        k.rx_dropped += 1;
        return false;
    };
    // SAFETY: frame `i` was in the peer's fill ring, so only the simulated kernel refers to it.
    let dst = unsafe { region.slice_mut(i as usize, bytes.len()) };
    dst.copy_from_slice(bytes);
    k.rx.push_back((i, bytes.len() as u32));
    true
}

impl FrameIo for MemPort {
    type Frame = MemFrame;

    fn frame_capacity(&self) -> usize {
        self.region.frame_size
    }

    fn bytes<'a>(&'a self, frame: &'a MemFrame) -> &'a [u8] {
        // SAFETY: the handle is unique and borrowed for 'a, so nothing writes these bytes.
        unsafe { self.region.slice_mut(frame.index(), frame.len()) }
    }

    fn bytes_mut<'a>(&'a self, frame: &'a mut MemFrame, len: usize) -> &'a mut [u8] {
        let len = len.min(self.region.frame_size);
        frame.len = len as u32;
        // SAFETY: the handle is unique and mutably borrowed for 'a.
        unsafe { self.region.slice_mut(frame.index(), len) }
    }

    fn recv(&mut self, out: &mut VecDeque<MemFrame>, max: usize) -> usize {
        let mut k = self.me.borrow_mut();
        let n = max.min(k.rx.len());
        for (i, len) in k.rx.drain(..n) {
            self.ledger
                .advance(i as usize, FrameState::Receive, FrameState::InUse)
                .expect("RX ring holds frames given for receive");
            out.push_back(MemFrame { index: i, len });
        }
        n
    }

    fn release(&mut self, frames: &mut Vec<MemFrame>) {
        let mut k = self.me.borrow_mut();
        for f in frames.drain(..) {
            if k.fill.len() < k.ring_size {
                self.ledger
                    .advance(f.index(), FrameState::InUse, FrameState::Receive)
                    .expect("released frames are in use");
                k.fill.push_back(f.index);
            } else {
                self.ledger
                    .advance(f.index(), FrameState::InUse, FrameState::Free)
                    .expect("released frames are in use");
                self.free.push(f.index);
            }
        }
    }

    fn alloc(&mut self, out: &mut Vec<MemFrame>, n: usize) -> usize {
        let mut got = 0;
        while got < n {
            let Some(i) = self.free.pop() else { break };
            self.ledger
                .advance(i as usize, FrameState::Free, FrameState::InUse)
                .expect("free list holds free frames");
            out.push(MemFrame { index: i, len: 0 });
            got += 1;
        }
        got
    }

    fn free(&mut self, frames: &mut Vec<MemFrame>) {
        for f in frames.drain(..) {
            self.ledger
                .advance(f.index(), FrameState::InUse, FrameState::Free)
                .expect("freed frames are in use");
            self.free.push(f.index);
        }
    }

    fn send(&mut self, frames: &mut Vec<MemFrame>) -> io::Result<usize> {
        let mut sent = 0;
        for f in frames.drain(..) {
            let room = self.me.borrow().completion.len() < self.me.borrow().ring_size;
            if !room {
                self.stats.tx_ring_full += 1;
                self.ledger
                    .advance(f.index(), FrameState::InUse, FrameState::Free)
                    .expect("sent frames are in use");
                self.free.push(f.index);
                continue;
            }
            self.ledger
                .advance(f.index(), FrameState::InUse, FrameState::Transmit)
                .expect("sent frames are in use");
            self.stats.sent += 1;
            let lose = self.loss_every > 0 && self.stats.sent.is_multiple_of(self.loss_every);
            if lose {
                self.stats.lost += 1;
            } else {
                // SAFETY: the frame is in Transmit state: only the simulated kernel reads it.
                let bytes = unsafe { self.region.slice_mut(f.index(), f.len()) };
                if !deliver(&self.peer, &self.peer_region, bytes) {
                    self.stats.peer_dropped += 1;
                }
            }
            self.me.borrow_mut().completion.push_back(f.index);
            sent += 1;
        }
        Ok(sent)
    }

    fn complete(&mut self) -> io::Result<usize> {
        let done: Vec<u32> = self.me.borrow_mut().completion.drain(..).collect();
        for &i in &done {
            self.ledger
                .advance(i as usize, FrameState::Transmit, FrameState::Free)
                .expect("completed frames were sent");
            self.free.push(i);
        }
        self.top_up_fill();
        Ok(done.len())
    }

    fn counts(&mut self) -> FrameCounts {
        let k = self.me.borrow();
        self.ledger.counts(k.rx.len(), k.completion.len())
    }

    fn fill_target(&self) -> usize {
        self.fill_target
    }

    fn set_fill_target(&mut self, frames: usize) -> usize {
        let most = self.me.borrow().ring_size.min(self.ledger.len() / 2).max(1);
        self.fill_target = frames.clamp(1, most);
        self.top_up_fill();
        self.fill_target
    }

    fn rx_drops(&mut self) -> u64 {
        self.rx_dropped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> MemLink {
        MemLink {
            frames: 16,
            frame_size: 256,
            ring_size: 8,
        }
    }

    #[test]
    fn frames_cross_the_link_and_are_accounted() {
        let (mut a, mut b) = small().pair();
        assert_eq!(a.counts().fill, 8);
        let mut tx = Vec::new();
        assert_eq!(a.alloc(&mut tx, 3), 3);
        for (n, f) in tx.iter_mut().enumerate() {
            a.bytes_mut(f, 10 + n).fill(n as u8 + 1);
        }
        assert_eq!(a.counts().in_use, 3);
        assert_eq!(a.send(&mut tx).unwrap(), 3);
        assert_eq!(a.counts().completion, 3);
        let mut rx = VecDeque::new();
        assert_eq!(b.recv(&mut rx, 64), 3);
        let c = b.counts();
        assert_eq!((c.in_use, c.fill, c.rx), (3, 5, 0));
        for (n, f) in rx.iter().enumerate() {
            assert_eq!(b.bytes(f), vec![n as u8 + 1; 10 + n].as_slice());
        }
        let mut done: Vec<MemFrame> = rx.drain(..).collect();
        b.release(&mut done);
        assert_eq!(b.counts().fill, 8);
        assert_eq!(a.complete().unwrap(), 3);
        let c = a.counts();
        assert_eq!(c.free + c.fill, 16);
        assert_eq!(c.sum(), c.total);
    }

    #[test]
    fn ring_wraps_many_times_without_losing_frames() {
        let (mut a, mut b) = small().pair();
        let mut rx = VecDeque::new();
        let mut tx = Vec::new();
        for round in 0..1000u32 {
            a.alloc(&mut tx, 5);
            for f in tx.iter_mut() {
                a.bytes_mut(f, 4).copy_from_slice(&round.to_le_bytes());
            }
            a.send(&mut tx).unwrap();
            a.complete().unwrap();
            assert_eq!(b.recv(&mut rx, 64), 5, "round {round}");
            for f in &rx {
                assert_eq!(b.bytes(f), round.to_le_bytes());
            }
            let mut done: Vec<_> = rx.drain(..).collect();
            b.release(&mut done);
        }
        for p in [&mut a, &mut b] {
            let c = p.counts();
            assert_eq!(c.in_use + c.rx + c.tx + c.completion, 0);
            assert_eq!(c.sum(), 16);
        }
    }

    #[test]
    fn a_full_peer_drops_and_counts_instead_of_blocking() {
        let (mut a, b) = small().pair();
        let mut tx = Vec::new();
        // The peer has 8 fill frames; send 12.
        for _ in 0..3 {
            a.alloc(&mut tx, 4);
            for f in tx.iter_mut() {
                a.bytes_mut(f, 60);
            }
            a.send(&mut tx).unwrap();
            a.complete().unwrap();
        }
        assert_eq!(a.stats().peer_dropped, 4);
        assert_eq!(b.rx_dropped(), 4);
    }
}
