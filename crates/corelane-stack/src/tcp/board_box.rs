//! The scoreboard as a connection holds it: on the heap only while a flight is on it. An
//! idle connection (most of a server's, most of the time) holds one pointer where the board
//! is 160 bytes; reading an absent board reads an empty one, only sending a segment makes
//! one, and the trim timer that gives back emptied buffers gives it back once it is empty.

use std::ops::Deref;

use smoltcp::time::{Duration, Instant};

use super::board::{Board, Delivered, TxSeg};
use super::seq::Seq;

/// What an absent board reads as.
static EMPTY: Board = Board::new();

/// A connection's scoreboard, boxed while it holds segments (see the module's text). Reads go
/// through `Deref`; each change is a method here, which does nothing where no board is
/// (nothing was sent that it could change) except [`push`](Self::push).
#[derive(Debug, Default)]
pub(crate) struct BoardBox(Option<Box<Board>>);

impl Deref for BoardBox {
    type Target = Board;

    #[inline]
    fn deref(&self) -> &Board {
        self.0.as_deref().unwrap_or(&EMPTY)
    }
}

impl BoardBox {
    /// Whether a board is held (on the heap).
    pub(crate) fn holds_heap(&self) -> bool {
        self.0.is_some()
    }

    /// Gives the board back if it holds no segment (the trim timer: the flight is over).
    pub(crate) fn release_if_empty(&mut self) {
        if self.0.as_ref().is_some_and(|b| b.is_empty()) {
            self.0 = None;
        }
    }

    /// Forgets everything (the connection ended).
    pub(crate) fn clear(&mut self) {
        self.0 = None;
    }

    /// A new segment was sent: the one change that makes a board.
    #[inline]
    pub(crate) fn push(&mut self, start: Seq, end: Seq, fin: bool, now: Instant) {
        self.0
            .get_or_insert_with(|| Box::new(Board::new()))
            .push(start, end, fin, now);
    }

    #[inline]
    pub(crate) fn ack(&mut self, ack: Seq, now: Instant, out: &mut Delivered) {
        if let Some(b) = &mut self.0 {
            b.ack(ack, now, out);
        }
    }

    pub(crate) fn sack(
        &mut self,
        left: Seq,
        right: Seq,
        base: Seq,
        now: Instant,
        out: &mut Delivered,
    ) {
        if let Some(b) = &mut self.0 {
            b.sack(left, right, base, now, out);
        }
    }

    pub(crate) fn rack_detect(
        &mut self,
        rack: (Instant, Seq),
        rtt: Duration,
        reo_wnd: Duration,
        now: Instant,
    ) -> (usize, Option<Instant>) {
        match &mut self.0 {
            Some(b) => b.rack_detect(rack, rtt, reo_wnd, now),
            None => (0, None),
        }
    }

    pub(crate) fn mark_first_lost(&mut self) -> usize {
        self.0.as_mut().map_or(0, |b| b.mark_first_lost())
    }

    pub(crate) fn mark_all_lost(&mut self) {
        if let Some(b) = &mut self.0 {
            b.mark_all_lost();
        }
    }

    pub(crate) fn next_lost(&mut self) -> Option<(usize, TxSeg)> {
        self.0.as_mut().and_then(|b| b.next_lost())
    }

    pub(crate) fn resent(&mut self, i: usize, now: Instant) {
        if let Some(b) = &mut self.0 {
            b.resent(i, now);
        }
    }

    pub(crate) fn shrink(&mut self, mss: usize) -> usize {
        self.0.as_mut().map_or(0, |b| b.shrink(mss))
    }

    pub(crate) fn split(&mut self, i: usize, at: Seq) {
        if let Some(b) = &mut self.0 {
            b.split(i, at);
        }
    }

    pub(crate) fn probe_last(&mut self, now: Instant) -> Option<TxSeg> {
        self.0.as_mut().and_then(|b| b.probe_last(now))
    }
}
