//! Cutting the board's segments: all of them to a smaller MSS when the path's MTU shrank, or
//! one in two when it no longer fits a frame with the options it must now carry.

use super::{Board, SegState, TxSeg};
use crate::tcp::seq::Seq;

impl Board {
    /// The path's MTU shrank: every segment not yet delivered that is longer than `mss` is cut
    /// into pieces of at most `mss` and deemed lost (they never arrived whole). Returns the
    /// bytes newly marked lost.
    pub(crate) fn shrink(&mut self, mss: usize) -> usize {
        let mss = mss.max(1);
        if !self
            .segs
            .iter()
            .any(|s| s.state != SegState::Sacked && s.len() > mss)
        {
            return 0;
        }
        let before = self.lost;
        let old = std::mem::take(&mut self.segs);
        let (mut in_flight, mut lost, mut sacked) = (0, 0, 0);
        for s in old {
            if s.state == SegState::Sacked || s.len() <= mss {
                match s.state {
                    SegState::Sent | SegState::Retrans => in_flight += s.len(),
                    SegState::Lost => lost += s.len(),
                    SegState::Sacked => sacked += s.len(),
                }
                self.segs.push_back(s);
                continue;
            }
            let mut start = s.start;
            while start.lt(s.end) {
                let left = s.end.since(start);
                let len = left.min(mss);
                let end = start.plus(len);
                // The FIN rides on the last piece, which then holds one byte less of data.
                let fin = s.fin && end == s.end;
                self.segs.push_back(TxSeg {
                    start,
                    end,
                    state: SegState::Lost,
                    fin,
                    ..s
                });
                lost += len;
                start = end;
            }
        }
        self.in_flight = in_flight;
        self.lost = lost;
        self.sacked = sacked;
        self.lost_hint = 0;
        self.first_sent = 0;
        self.reorder();
        self.lost - before
    }

    /// Cuts segment `i` in two at `at` (inside it): both pieces keep its state and transmit
    /// time, the FIN rides on the second. For a segment that no longer fits one frame with the
    /// options it must now carry.
    pub(crate) fn split(&mut self, i: usize, at: Seq) {
        let s = self.segs[i];
        if !(at.gt(s.start) && at.lt(s.end)) {
            return;
        }
        self.segs[i].end = at;
        self.segs[i].fin = false;
        self.segs.insert(i + 1, TxSeg { start: at, ..s });
        if s.retx > 0 && matches!(s.state, SegState::Sent | SegState::Retrans) {
            self.sent_at(s.xmit, at);
        }
    }
}
