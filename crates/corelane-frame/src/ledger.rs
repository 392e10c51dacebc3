//! Frame accounting: where every UMEM frame is.
//!
//! Each frame is in exactly one [`FrameState`]. Every move between places goes through
//! [`FrameLedger::advance`], which refuses a move from the wrong place, so a frame handed to the
//! kernel twice, or freed while the kernel still owns it, is caught where it happens instead of
//! corrupting a packet later. [`FrameLedger::counts`] adds the kernel rings' occupancy to split
//! the kernel-owned states into the six places a frame can be.

/// Where a frame is, as far as user space can know on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameState {
    /// In the free list, ready to be allocated for transmit or handed to the fill ring.
    Free = 0,
    /// Given to the kernel for receive: in the fill ring, or already filled and in the RX ring.
    Receive = 1,
    /// Held by user space: a received frame being processed or a transmit frame being written.
    InUse = 2,
    /// Given to the kernel for transmit: in the TX ring, or sent and in the completion ring.
    Transmit = 3,
    /// Away with the other process on a queue both serve during an upgrade: held by it, or by
    /// the kernel on its behalf. Only a queue shared that way has frames here.
    Away = 4,
}

/// A refused move: the frame was not where the caller said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("frame {index} is {actual:?}, expected {expected:?} (moving it to {to:?})")]
pub struct LedgerError {
    /// Frame index.
    pub index: usize,
    /// Where the caller thought it was.
    pub expected: FrameState,
    /// Where it is.
    pub actual: FrameState,
    /// Where the caller wanted it.
    pub to: FrameState,
}

/// The six places a frame can be, plus the total. `sum() == total` always holds for a
/// consistent ledger; [`FrameLedger::counts`] computes it from the per-frame states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FrameCounts {
    /// In the free list.
    pub free: usize,
    /// In the fill ring (given to the kernel, not yet filled).
    pub fill: usize,
    /// In the RX ring (filled by the kernel, not yet consumed).
    pub rx: usize,
    /// Held by user space.
    pub in_use: usize,
    /// In the TX ring or being sent.
    pub tx: usize,
    /// In the completion ring (sent, not yet reclaimed).
    pub completion: usize,
    /// With the other process of an upgrade (0 but while two share a queue).
    pub away: usize,
    /// Frames in the UMEM.
    pub total: usize,
}

impl std::ops::AddAssign for FrameCounts {
    /// Adds another UMEM's counts (for totals over several queues).
    fn add_assign(&mut self, o: FrameCounts) {
        self.free += o.free;
        self.fill += o.fill;
        self.rx += o.rx;
        self.in_use += o.in_use;
        self.tx += o.tx;
        self.completion += o.completion;
        self.away += o.away;
        self.total += o.total;
    }
}

impl FrameCounts {
    /// Frames accounted for across the six places (and with the other process of an upgrade).
    pub fn sum(&self) -> usize {
        self.free + self.fill + self.rx + self.in_use + self.tx + self.completion + self.away
    }
}

/// Per-frame state for one UMEM.
#[derive(Debug, Clone)]
pub struct FrameLedger {
    states: Vec<FrameState>,
    per_state: [usize; 5],
}

impl FrameLedger {
    /// A ledger for `frames` frames, all [`FrameState::Free`].
    pub fn new(frames: usize) -> Self {
        FrameLedger {
            states: vec![FrameState::Free; frames],
            per_state: [frames, 0, 0, 0, 0],
        }
    }

    /// Number of frames.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    /// True for a ledger of no frames.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// Where frame `index` is.
    pub fn state(&self, index: usize) -> FrameState {
        self.states[index]
    }

    /// Where frame `index` is, or None past the last frame.
    pub fn get(&self, index: usize) -> Option<FrameState> {
        self.states.get(index).copied()
    }

    /// Frames currently in `state`.
    pub fn count(&self, state: FrameState) -> usize {
        self.per_state[state as usize]
    }

    /// Moves frame `index` from `from` to `to`, refusing when it is elsewhere.
    #[inline]
    pub fn advance(
        &mut self,
        index: usize,
        from: FrameState,
        to: FrameState,
    ) -> Result<(), LedgerError> {
        let Some(slot) = self.states.get_mut(index) else {
            return Err(LedgerError {
                index,
                expected: from,
                actual: FrameState::Free,
                to,
            });
        };
        if *slot != from {
            return Err(LedgerError {
                index,
                expected: from,
                actual: *slot,
                to,
            });
        }
        *slot = to;
        self.per_state[from as usize] -= 1;
        self.per_state[to as usize] += 1;
        Ok(())
    }

    /// The six-way split, given how many entries the RX ring and completion ring hold now.
    /// The ring occupancies are clamped to what the ledger says the kernel owns.
    pub fn counts(&self, rx_ring: usize, completion_ring: usize) -> FrameCounts {
        let receive = self.count(FrameState::Receive);
        let transmit = self.count(FrameState::Transmit);
        let rx = rx_ring.min(receive);
        let completion = completion_ring.min(transmit);
        FrameCounts {
            free: self.count(FrameState::Free),
            fill: receive - rx,
            rx,
            in_use: self.count(FrameState::InUse),
            tx: transmit - completion,
            completion,
            away: self.count(FrameState::Away),
            total: self.len(),
        }
    }

    /// Recounts every frame's state and compares with the running totals; an error names the
    /// first state whose count disagrees.
    pub fn verify(&self) -> Result<FrameCounts, String> {
        let mut recount = [0usize; 5];
        for s in &self.states {
            recount[*s as usize] += 1;
        }
        if recount != self.per_state {
            return Err(format!(
                "ledger totals {:?} disagree with per-frame states {:?}",
                self.per_state, recount
            ));
        }
        Ok(self.counts(0, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::FrameState::*;
    use super::*;

    #[test]
    fn every_frame_is_in_one_place() {
        let mut l = FrameLedger::new(8);
        for i in 0..4 {
            l.advance(i, Free, Receive).unwrap();
        }
        l.advance(0, Receive, InUse).unwrap();
        l.advance(4, Free, InUse).unwrap();
        l.advance(4, InUse, Transmit).unwrap();
        let c = l.counts(1, 1);
        assert_eq!(
            c,
            FrameCounts {
                free: 3,
                fill: 2,
                rx: 1,
                in_use: 1,
                tx: 0,
                completion: 1,
                away: 0,
                total: 8
            }
        );
        assert_eq!(c.sum(), c.total);
        assert!(l.verify().is_ok());
    }

    #[test]
    fn wrong_moves_are_refused_and_change_nothing() {
        let mut l = FrameLedger::new(2);
        l.advance(0, Free, Receive).unwrap();
        // Handing the same frame to the kernel twice.
        let e = l.advance(0, Free, Receive).unwrap_err();
        assert_eq!(e.actual, Receive);
        // Freeing a frame the kernel owns.
        assert!(l.advance(0, InUse, Free).is_err());
        // Out of range.
        assert!(l.advance(9, Free, InUse).is_err());
        assert_eq!(l.count(Receive), 1);
        assert_eq!(l.count(Free), 1);
        assert!(l.verify().is_ok());
    }

    #[test]
    fn ring_occupancy_is_clamped_to_what_the_kernel_owns() {
        let mut l = FrameLedger::new(4);
        l.advance(0, Free, Receive).unwrap();
        let c = l.counts(10, 10);
        assert_eq!(c.rx, 1);
        assert_eq!(c.fill, 0);
        assert_eq!(c.completion, 0);
        assert_eq!(c.sum(), 4);
    }
}
