//! An in-memory link between two [`MemPort`]s that behaves like the kernel's AF_XDP copy mode:
//! each port has its own frame memory and rings, and a sent frame's bytes are copied into a
//! receive frame the peer posted in its fill ring.

#![allow(unsafe_code)] // The frame memory is shared with the simulated kernel, as a UMEM is.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::rc::Rc;

use crate::ledger::FrameCounts;
use crate::pool::FramePool;
use crate::{Frame, FrameIo, UmemId};

/// A frame of a [`MemPort`].
#[derive(Debug)]
pub struct MemFrame {
    umem: UmemId,
    index: u32,
    len: u32,
}

impl Frame for MemFrame {
    fn umem(&self) -> UmemId {
        self.umem
    }
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
    id: UmemId,
    region: Rc<Region>,
    me: Rc<RefCell<Rings>>,
    peer: Rc<RefCell<Rings>>,
    peer_region: Rc<Region>,
    pool: FramePool,
    stats: MemStats,
    loss_every: u64,
    /// When set, sent frames are kept here for the caller (a simulated wire) instead of being
    /// delivered to the peer.
    captured: Option<VecDeque<Vec<u8>>>,
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
        let regions = [
            Rc::new(Region::new(self.frames, self.frame_size)),
            Rc::new(Region::new(self.frames, self.frame_size)),
        ];
        let rings = [(); 2].map(|_| {
            Rc::new(RefCell::new(Rings {
                ring_size: self.ring_size,
                ..Rings::default()
            }))
        });
        let port = |me: usize| {
            let peer = 1 - me;
            let mut p = MemPort {
                id: UmemId::fresh(),
                region: regions[me].clone(),
                me: rings[me].clone(),
                peer: rings[peer].clone(),
                peer_region: regions[peer].clone(),
                pool: FramePool::new(self.frames, self.ring_size.min(self.frames / 2)),
                stats: MemStats::default(),
                loss_every: 0,
                captured: None,
            };
            p.top_up_fill();
            p
        };
        (port(0), port(1))
    }
}

impl MemPort {
    fn top_up_fill(&mut self) {
        let mut k = self.me.borrow_mut();
        let room = k.ring_size.saturating_sub(k.fill.len());
        self.pool.post_for_receive(room, |i| k.fill.push_back(i));
    }

    /// Drops every `n`th frame this port sends (0: none), to exercise retransmission.
    pub fn set_loss_every(&mut self, n: u64) {
        self.loss_every = n;
    }

    /// Keeps what this port sends for [`MemPort::take_sent`] instead of delivering it (true),
    /// or delivers it to the peer at once (false, the default). A simulated wire takes the
    /// frames, impairs and delays them, and puts them on the peer's side with
    /// [`MemPort::inject`]. The sender's frame accounting is the same either way.
    pub fn set_capture(&mut self, on: bool) {
        self.captured = on.then(VecDeque::new);
    }

    /// Moves the frames captured since the last call (oldest first) to the back of `out`.
    pub fn take_sent(&mut self, out: &mut VecDeque<Vec<u8>>) {
        if let Some(c) = &mut self.captured {
            out.append(c);
        }
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
        self.id.check(frame);
        // SAFETY: the handle is unique, of this UMEM (checked) and borrowed for 'a, so nothing
        // writes these bytes meanwhile.
        unsafe { self.region.slice_mut(frame.index(), frame.len()) }
    }

    fn bytes_mut<'a>(&'a self, frame: &'a mut MemFrame, len: usize) -> &'a mut [u8] {
        self.id.check(frame);
        let len = len.min(self.region.frame_size);
        frame.len = len as u32;
        // SAFETY: the handle is unique, of this UMEM (checked) and mutably borrowed for 'a.
        unsafe { self.region.slice_mut(frame.index(), len) }
    }

    fn recv(&mut self, out: &mut VecDeque<MemFrame>, max: usize) -> usize {
        let mut k = self.me.borrow_mut();
        let n = max.min(k.rx.len());
        for (i, len) in k.rx.drain(..n) {
            if self.pool.received(i).is_ok() {
                out.push_back(MemFrame {
                    umem: self.id,
                    index: i,
                    len,
                });
            }
        }
        n
    }

    fn release(&mut self, frames: &mut Vec<MemFrame>) {
        let mut k = self.me.borrow_mut();
        for f in frames.drain(..) {
            self.id.check(&f);
            if k.fill.len() < k.ring_size && self.pool.repost(f.index).is_ok() {
                k.fill.push_back(f.index);
            } else {
                let _ = self.pool.free(f.index);
            }
        }
    }

    fn alloc(&mut self, out: &mut Vec<MemFrame>, n: usize) -> usize {
        let id = self.id;
        self.pool.alloc(n, |index| {
            out.push(MemFrame {
                umem: id,
                index,
                len: 0,
            })
        })
    }

    fn free(&mut self, frames: &mut Vec<MemFrame>) {
        for f in frames.drain(..) {
            self.id.check(&f);
            let _ = self.pool.free(f.index);
        }
    }

    fn send(&mut self, frames: &mut Vec<MemFrame>) -> io::Result<usize> {
        let mut sent = 0;
        for f in frames.drain(..) {
            self.id.check(&f);
            let room = {
                let k = self.me.borrow();
                k.completion.len() < k.ring_size
            };
            if !room {
                self.stats.tx_ring_full += 1;
                let _ = self.pool.free(f.index);
                continue;
            }
            self.pool.sent(f.index).map_err(io::Error::other)?;
            self.stats.sent += 1;
            let lose = self.loss_every > 0 && self.stats.sent.is_multiple_of(self.loss_every);
            if lose {
                self.stats.lost += 1;
            } else {
                // SAFETY: the frame is in Transmit state: only the simulated kernel reads it.
                let bytes = unsafe { self.region.slice_mut(f.index(), f.len()) };
                if let Some(c) = &mut self.captured {
                    c.push_back(bytes.to_vec());
                } else if !deliver(&self.peer, &self.peer_region, bytes) {
                    self.stats.peer_dropped += 1;
                }
            }
            self.me.borrow_mut().completion.push_back(f.index);
            sent += 1;
        }
        Ok(sent)
    }

    fn complete(&mut self) -> io::Result<usize> {
        // Taken in place: a turn that flushes completes, and collecting them into a vector
        // cost more than the rest of an idle turn.
        let mut k = self.me.borrow_mut();
        let done = k.completion.len();
        for i in k.completion.drain(..) {
            self.pool.completed(i).map_err(io::Error::other)?;
        }
        drop(k);
        self.top_up_fill();
        Ok(done)
    }

    fn counts(&mut self) -> FrameCounts {
        let k = self.me.borrow();
        self.pool.counts(k.rx.len(), k.completion.len())
    }

    fn fill_target(&self) -> usize {
        self.pool.fill_target()
    }

    fn set_fill_target(&mut self, frames: usize) -> usize {
        let most = self.me.borrow().ring_size.min(self.pool.len() / 2);
        let set = self.pool.set_fill_target(frames, most);
        self.top_up_fill();
        set
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

    #[test]
    #[should_panic(expected = "used with UMEM")]
    fn a_frame_of_one_port_is_refused_by_another() {
        let (mut a, b) = small().pair();
        let mut tx = Vec::new();
        a.alloc(&mut tx, 1);
        // Same frame size, index in range: only the brand tells them apart.
        let _ = b.bytes(&tx[0]);
    }
}
