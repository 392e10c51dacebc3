//! The user-space side of a UMEM's frames: a free list and the ledger, shared by every
//! [`FrameIo`](crate::FrameIo) so that the same accounting rules hold for a real AF_XDP socket
//! and for the in-memory link.

use crate::ledger::{FrameCounts, FrameLedger, FrameState, LedgerError};

/// Frames of one UMEM: which are free, and where every other one is.
///
/// Receive keeps a share (the fill target): frames for transmit are allocated only from what
/// is left once the fill ring's share is set aside.
#[derive(Debug, Clone)]
pub struct FramePool {
    ledger: FrameLedger,
    free: Vec<u32>,
    fill_target: usize,
}

impl FramePool {
    /// `frames` frames, all free; `fill_target` of them are to be kept posted for receive.
    pub fn new(frames: usize, fill_target: usize) -> Self {
        FramePool {
            ledger: FrameLedger::new(frames),
            free: (0..frames as u32).rev().collect(),
            fill_target,
        }
    }

    /// Frames in the UMEM.
    pub fn len(&self) -> usize {
        self.ledger.len()
    }

    /// True for a pool of no frames.
    pub fn is_empty(&self) -> bool {
        self.ledger.is_empty()
    }

    /// The ledger.
    pub fn ledger(&self) -> &FrameLedger {
        &self.ledger
    }

    /// Frames in `state`.
    pub fn count(&self, state: FrameState) -> usize {
        self.ledger.count(state)
    }

    /// The six-way split given the kernel rings' occupancy.
    pub fn counts(&self, rx_ring: usize, completion_ring: usize) -> FrameCounts {
        self.ledger.counts(rx_ring, completion_ring)
    }

    /// Frames kept posted for receive.
    pub fn fill_target(&self) -> usize {
        self.fill_target
    }

    /// Sets the fill target, clamped to `1..=most`; returns the value set.
    pub fn set_fill_target(&mut self, frames: usize, most: usize) -> usize {
        self.fill_target = frames.clamp(1, most.max(1));
        self.fill_target
    }

    /// Posts free frames for receive until the fill target is met or `room` frames were
    /// posted; `post` is called with each frame's index. Returns how many.
    pub fn post_for_receive(&mut self, room: usize, mut post: impl FnMut(u32)) -> usize {
        let want = self
            .fill_target
            .saturating_sub(self.count(FrameState::Receive))
            .min(room)
            .min(self.free.len());
        for _ in 0..want {
            let Some(i) = self.free.pop() else { break };
            self.move_to(i, FrameState::Free, FrameState::Receive);
            post(i);
        }
        want
    }

    /// Takes up to `n` free frames for writing, leaving the fill target's share; `take` is
    /// called with each frame's index. Returns how many.
    pub fn alloc(&mut self, n: usize, mut take: impl FnMut(u32)) -> usize {
        let reserve = self
            .fill_target
            .saturating_sub(self.count(FrameState::Receive));
        let n = n.min(self.free.len().saturating_sub(reserve));
        for _ in 0..n {
            let Some(i) = self.free.pop() else { break };
            self.move_to(i, FrameState::Free, FrameState::InUse);
            take(i);
        }
        n
    }

    /// The kernel handed frame `index` to user space (RX ring).
    ///
    /// # Errors
    /// When the frame was not given to the kernel for receive: the caller must not touch it.
    pub fn received(&mut self, index: u32) -> Result<(), LedgerError> {
        self.ledger
            .advance(index as usize, FrameState::Receive, FrameState::InUse)
    }

    /// A frame user space held is free again.
    ///
    /// # Errors
    /// When the frame was not held by user space (it is then left where it is).
    pub fn free(&mut self, index: u32) -> Result<(), LedgerError> {
        self.ledger
            .advance(index as usize, FrameState::InUse, FrameState::Free)?;
        self.free.push(index);
        Ok(())
    }

    /// A frame user space wrote was given to the kernel for transmit.
    ///
    /// # Errors
    /// When the frame was not held by user space.
    pub fn sent(&mut self, index: u32) -> Result<(), LedgerError> {
        self.ledger
            .advance(index as usize, FrameState::InUse, FrameState::Transmit)
    }

    /// The kernel completed the transmit of frame `index`: it is free again.
    ///
    /// # Errors
    /// When the frame was not given to the kernel for transmit.
    pub fn completed(&mut self, index: u32) -> Result<(), LedgerError> {
        self.ledger
            .advance(index as usize, FrameState::Transmit, FrameState::Free)?;
        self.free.push(index);
        Ok(())
    }

    /// A pool for a process that joins a queue another one serves (an upgrade): every frame is
    /// [`Away`](FrameState::Away) until the other process lends it ([`FramePool::returned`]) or
    /// the kernel hands it over on this side's RX ring ([`FramePool::received_shared`]).
    pub fn joining(frames: usize, fill_target: usize) -> Self {
        let mut ledger = FrameLedger::new(frames);
        for i in 0..frames {
            let moved = ledger.advance(i, FrameState::Free, FrameState::Away);
            debug_assert!(moved.is_ok());
        }
        FramePool {
            ledger,
            free: Vec::new(),
            fill_target,
        }
    }

    /// Gives up to `n` free frames to the other process of an upgrade; `give` is called with
    /// each frame's index. Returns how many.
    pub fn lend(&mut self, n: usize, mut give: impl FnMut(u32)) -> usize {
        let n = n.min(self.free.len());
        for _ in 0..n {
            let Some(i) = self.free.pop() else { break };
            self.move_to(i, FrameState::Free, FrameState::Away);
            give(i);
        }
        n
    }

    /// The fill ring passes to the other process of an upgrade: the frames posted for receive
    /// may now arrive on either process's RX ring, so they are away until one arrives here, and
    /// this side keeps none for receive any more. Returns how many.
    pub fn hand_over_receive(&mut self) -> usize {
        self.fill_target = 0;
        self.move_all(FrameState::Receive, FrameState::Away)
    }

    /// A frame arrived on this side's RX ring of a queue two processes share: one this side
    /// posted, or one the other process did (or lent to the kernel before the hand-over).
    ///
    /// # Errors
    /// When user space already holds the frame, or it is being sent.
    pub fn received_shared(&mut self, index: u32) -> Result<(), LedgerError> {
        let from = match self.ledger.get(index as usize) {
            Some(FrameState::Away) => FrameState::Away,
            _ => FrameState::Receive,
        };
        self.ledger.advance(index as usize, from, FrameState::InUse)
    }

    /// Done with a frame that goes back to the other process of an upgrade.
    ///
    /// # Errors
    /// When user space did not hold the frame.
    pub fn give_back(&mut self, index: u32) -> Result<(), LedgerError> {
        self.ledger
            .advance(index as usize, FrameState::InUse, FrameState::Away)
    }

    /// The other process of an upgrade handed frame `index` over: one lent to it, or one this
    /// side posted for receive that arrived on its RX ring. It is free here now.
    ///
    /// # Errors
    /// When the frame is neither away nor posted for receive (it is then left where it is).
    pub fn returned(&mut self, index: u32) -> Result<(), LedgerError> {
        let from = match self.ledger.get(index as usize) {
            Some(FrameState::Receive) => FrameState::Receive,
            _ => FrameState::Away,
        };
        self.ledger
            .advance(index as usize, from, FrameState::Free)?;
        self.free.push(index);
        Ok(())
    }

    /// Frame `index`, away with the other process of an upgrade, was found posted for receive
    /// (in the fill ring, or on this side's RX ring) when the other process went away.
    ///
    /// # Errors
    /// When the frame was not away.
    pub fn found_posted(&mut self, index: u32) -> Result<(), LedgerError> {
        self.ledger
            .advance(index as usize, FrameState::Away, FrameState::Receive)
    }

    /// The other process of an upgrade has left, having given back every frame it held: the
    /// frames still away are those it posted for receive before the hand-over that no packet
    /// has used yet, still in the fill ring. Returns how many.
    pub fn away_were_posted(&mut self) -> usize {
        self.move_all(FrameState::Away, FrameState::Receive)
    }

    /// The other process of an upgrade is gone: every frame still away was in its hands, and
    /// is free here now. Returns how many.
    pub fn reclaim_away(&mut self) -> usize {
        self.move_all(FrameState::Away, FrameState::Free)
    }

    /// Moves every frame in state `from` to `to` (onto the free list when `to` is free).
    /// Returns how many. A walk over the ledger: for an upgrade's few steps, not per frame.
    fn move_all(&mut self, from: FrameState, to: FrameState) -> usize {
        let mut n = 0;
        for i in 0..self.ledger.len() {
            if self.ledger.state(i) == from {
                self.move_to(i as u32, from, to);
                if to == FrameState::Free {
                    self.free.push(i as u32);
                }
                n += 1;
            }
        }
        n
    }

    fn move_to(&mut self, index: u32, from: FrameState, to: FrameState) {
        // Only frames taken off the free list come here, and the free list holds free frames
        // only (every push follows a successful move to Free).
        let moved = self.ledger.advance(index as usize, from, to);
        debug_assert!(moved.is_ok(), "{moved:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transmit_leaves_receive_its_share() {
        let mut p = FramePool::new(8, 4);
        let mut got = Vec::new();
        // Nothing posted yet: 4 of the 8 are set aside for the fill ring.
        assert_eq!(p.alloc(8, |i| got.push(i)), 4);
        assert_eq!(p.post_for_receive(8, |_| {}), 4);
        assert_eq!(p.alloc(8, |_| {}), 0);
        for i in got {
            p.sent(i).unwrap();
            p.completed(i).unwrap();
        }
        let c = p.counts(0, 0);
        assert_eq!((c.free, c.fill, c.sum()), (4, 4, 8));
    }

    #[test]
    fn wrong_moves_are_refused() {
        let mut p = FramePool::new(4, 2);
        let mut posted = Vec::new();
        p.post_for_receive(2, |i| posted.push(i));
        // Freeing a frame the kernel holds for receive is refused and changes nothing.
        assert!(p.free(posted[0]).is_err());
        assert!(p.completed(posted[0]).is_err());
        p.received(posted[0]).unwrap();
        assert!(p.received(posted[0]).is_err(), "received twice");
        p.free(posted[0]).unwrap();
        assert!(p.ledger().verify().is_ok());
        assert_eq!(p.count(FrameState::Receive), 1);
    }
}
