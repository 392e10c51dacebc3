//! An in-memory link between two [`MemPort`]s that behaves like the kernel's AF_XDP copy mode
//! ([`MemLink::pair`]: each port has its own frame memory and rings, and a sent frame's bytes are
//! copied into a receive frame the peer posted in its fill ring) or like a zero-copy device
//! ([`MemLink::pair_zero_copy`]: the sent frame's buffer itself becomes the peer's received frame,
//! and the peer's posted buffer goes to the sender in exchange, so nothing is copied and what a
//! bench measures over it is the stacks' own work).

#![allow(unsafe_code)] // The frame memory is shared with the simulated kernel, as a UMEM is.

use std::cell::{Cell, RefCell};
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

/// The frame memory of both ports, read and written through raw slices the way a UMEM is. Each
/// port sees its frames through a map from its frame index to a buffer of the arena; the maps
/// together name every buffer exactly once (a zero-copy delivery swaps two entries).
#[derive(Debug)]
struct Arena {
    ptr: *mut u8,
    frame_size: usize,
    buffers: usize,
    _buf: Box<[u8]>,
}

impl Arena {
    fn new(buffers: usize, frame_size: usize) -> Self {
        let mut buf = vec![0u8; buffers * frame_size].into_boxed_slice();
        Arena {
            ptr: buf.as_mut_ptr(),
            frame_size,
            buffers,
            _buf: buf,
        }
    }

    /// # Safety
    /// The caller holds the unique handle for the frame mapped to `buffer` (or is the simulated
    /// kernel acting on a frame the ledger gives it), so no other reference to these bytes exists.
    unsafe fn slice_mut<'a>(&self, buffer: u32, len: usize) -> &'a mut [u8] {
        let buffer = buffer as usize;
        assert!(buffer < self.buffers && len <= self.frame_size);
        // SAFETY: in bounds (asserted); exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(buffer * self.frame_size), len) }
    }
}

/// One port's view of the arena: its frame `i` is the arena's buffer `map[i]`.
#[derive(Debug)]
struct Region {
    arena: Rc<Arena>,
    map: Box<[Cell<u32>]>,
}

impl Region {
    fn frame_size(&self) -> usize {
        self.arena.frame_size
    }

    /// # Safety
    /// As [`Arena::slice_mut`], for this port's frame `index`.
    unsafe fn slice_mut<'a>(&self, index: usize, len: usize) -> &'a mut [u8] {
        let buffer = self.map[index].get();
        // SAFETY: the caller's contract, passed on.
        unsafe { self.arena.slice_mut(buffer, len) }
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
    /// Delivery hands the sent buffer over instead of copying its bytes.
    zero_copy: bool,
    /// Offers transmit checksum offload ([`MemPort::set_checksum_offload`]).
    checksum_offload: bool,
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
    /// Two ports joined back to back, each with its fill ring stocked. A sent frame's bytes are
    /// copied into the peer's receive frame, as AF_XDP copy mode does.
    pub fn pair(self) -> (MemPort, MemPort) {
        self.build(false)
    }

    /// Two ports joined back to back that deliver without a copy: a sent frame's buffer becomes
    /// the receive frame the peer posted, and the buffer the peer had posted takes its place on
    /// the sender's side, as a zero-copy device leaves the copy to nobody. The frame accounting
    /// is the same as [`MemLink::pair`]'s; a captured frame ([`MemPort::set_capture`]) or an
    /// injected one is still copied.
    pub fn pair_zero_copy(self) -> (MemPort, MemPort) {
        self.build(true)
    }

    fn build(self, zero_copy: bool) -> (MemPort, MemPort) {
        let arena = Rc::new(Arena::new(2 * self.frames, self.frame_size));
        let regions = [0u32, 1].map(|side| {
            let first = side * self.frames as u32;
            Rc::new(Region {
                arena: arena.clone(),
                map: (first..first + self.frames as u32).map(Cell::new).collect(),
            })
        });
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
                zero_copy,
                checksum_offload: false,
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

    /// Offers transmit checksum offload ([`FrameIo::checksum_offload`]): a checksum left to
    /// the device is finished in the frame as a NIC finishes it on its way out.
    pub fn set_checksum_offload(&mut self, on: bool) {
        self.checksum_offload = on;
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

/// Takes a frame of the peer's fill ring for a delivery of `len` bytes, or counts a drop.
fn take_fill(k: &mut Rings, region: &Region, len: usize) -> Option<u32> {
    if k.rx.len() >= k.ring_size || len > region.frame_size() {
        k.rx_dropped += 1;
        return None;
    }
    let i = k.fill.pop_front();
    if i.is_none() {
        k.rx_dropped += 1;
    }
    i
}

fn deliver(peer: &RefCell<Rings>, region: &Region, bytes: &[u8]) -> bool {
    let mut k = peer.borrow_mut();
    let Some(i) = take_fill(&mut k, region, bytes.len()) else {
        return false;
    };
    // SAFETY: frame `i` was in the peer's fill ring, so only the simulated kernel refers to it.
    let dst = unsafe { region.slice_mut(i as usize, bytes.len()) };
    dst.copy_from_slice(bytes);
    k.rx.push_back((i, bytes.len() as u32));
    true
}

/// Delivers the sender's frame `index` of `len` bytes by swapping its buffer with the one behind
/// the peer's next fill frame: no byte moves.
fn hand_over(
    peer: &RefCell<Rings>,
    peer_region: &Region,
    mine: &Region,
    index: u32,
    len: usize,
) -> bool {
    let mut k = peer.borrow_mut();
    let Some(i) = take_fill(&mut k, peer_region, len) else {
        return false;
    };
    // Both frames are the simulated kernel's now (one in transmit, one taken from the fill
    // ring): swapping the buffers behind them touches nothing a handle can see.
    mine.map[index as usize].swap(&peer_region.map[i as usize]);
    k.rx.push_back((i, len as u32));
    true
}

impl FrameIo for MemPort {
    type Frame = MemFrame;

    fn frame_capacity(&self) -> usize {
        self.region.frame_size()
    }

    fn bytes<'a>(&'a self, frame: &'a MemFrame) -> &'a [u8] {
        self.id.check(frame);
        // SAFETY: the handle is unique, of this UMEM (checked) and borrowed for 'a, so nothing
        // writes these bytes meanwhile.
        unsafe { self.region.slice_mut(frame.index(), frame.len()) }
    }

    fn bytes_mut<'a>(&'a self, frame: &'a mut MemFrame, len: usize) -> &'a mut [u8] {
        self.id.check(frame);
        let len = len.min(self.region.frame_size());
        frame.len = len as u32;
        // SAFETY: the handle is unique, of this UMEM (checked) and mutably borrowed for 'a.
        unsafe { self.region.slice_mut(frame.index(), len) }
    }

    fn checksum_offload(&self) -> bool {
        self.checksum_offload
    }

    fn finish_checksum(&self, frame: &mut MemFrame, start: usize, offset: usize) -> bool {
        self.id.check(frame);
        if !self.checksum_offload || start + offset + 2 > frame.len() {
            return false;
        }
        // SAFETY: as for `bytes_mut`: a unique handle of this UMEM, mutably borrowed.
        let b = unsafe { self.region.slice_mut(frame.index(), frame.len()) };
        let mut sum = 0u64;
        for w in b[start..].chunks(2) {
            sum += u64::from(u16::from_be_bytes([w[0], w.get(1).copied().unwrap_or(0)]));
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        b[start + offset..start + offset + 2].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        true
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
        // As an AF_XDP queue does: back to the free list, from which the fill ring is topped
        // up to the fill target, so that the frames over it stay free for transmit and a freed
        // frame is the next one posted (its memory still warm).
        for f in frames.drain(..) {
            self.id.check(&f);
            let _ = self.pool.free(f.index);
        }
        self.top_up_fill();
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
            } else if self.zero_copy && self.captured.is_none() {
                if !hand_over(
                    &self.peer,
                    &self.peer_region,
                    &self.region,
                    f.index,
                    f.len(),
                ) {
                    self.stats.peer_dropped += 1;
                }
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
#[path = "mem_tests.rs"]
mod tests;
