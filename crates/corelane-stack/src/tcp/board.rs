//! The send scoreboard: every segment sent and not yet cumulatively acknowledged, with its
//! transmit time and state, so that SACK blocks mark what arrived (RFC 6675's scoreboard),
//! RACK (RFC 8985) can tell what is lost by time rather than by counting duplicate ACKs, and
//! only the holes are retransmitted. Bytes in flight are kept as counters, updated on each
//! state change, so the sender never walks the board to know how much it may send.
//!
//! No ACK costs work in proportion to the segments in flight, whatever a hostile receiver
//! SACKs (the CVE-2019-11477/11478 class): a SACK block skips runs already SACKed in one
//! search (each SACKed segment keeps a lower bound of where its run ends), and RACK takes the
//! segments in flight oldest first, so each is looked at once per transmission, not on every
//! ACK. Segments sent once lie on the board in the order they were sent (a later one starts
//! higher), so RACK walks those with a cursor; only what was sent again (out of that order)
//! goes through a time order of its own. A segment sent once costs RACK no entry at all.

use std::collections::VecDeque;

use smoltcp::time::{Duration, Instant};

use super::order::TimeOrder;
use super::seq::Seq;

mod cut;

/// Where one segment stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SegState {
    /// Sent once, not known to have arrived: in flight.
    Sent,
    /// Deemed lost and waiting to be sent again: not in flight.
    Lost,
    /// Sent again after being deemed lost: in flight.
    Retrans,
    /// Selectively acknowledged: delivered.
    Sacked,
}

/// One segment on the board. `end` includes the FIN when `fin` is set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TxSeg {
    /// First sequence number.
    pub(crate) start: Seq,
    /// One past the last (the FIN included).
    pub(crate) end: Seq,
    /// Last transmit time.
    pub(crate) xmit: Instant,
    /// Where it stands.
    pub(crate) state: SegState,
    /// Times retransmitted.
    pub(crate) retx: u8,
    /// Carries the FIN.
    pub(crate) fin: bool,
    /// While SACKed: everything from `start` to here is SACKed (at least `end`).
    run_end: Seq,
}

impl TxSeg {
    /// Sequence space it covers.
    pub(crate) fn len(&self) -> usize {
        self.end.since(self.start)
    }
}

/// What one ACK did to the board.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Delivered {
    /// Bytes newly acknowledged cumulatively or selectively.
    pub(crate) bytes: usize,
    /// The shortest round trip among the segments delivered that were sent once (Karn's
    /// rule): the minimum RTT's sample.
    pub(crate) rtt: Option<Duration>,
    /// The longest of those: SRTT's sample (as Linux takes it, from the oldest segment an
    /// ACK newly covers). A segment the path held back behind later ones is timed with its
    /// wait, so that SRTT, and RACK's reordering window that SRTT bounds, learn how long the
    /// path holds segments; the shortest alone left SRTT at the unheld round trip, and a
    /// segment held longer than that was deemed lost every time.
    pub(crate) rtt_long: Option<Duration>,
    /// The newest transmit time and end among what was delivered (for RACK).
    pub(crate) newest: Option<(Instant, Seq)>,
    /// Whether that newest one was a retransmission (its ACK may answer the first
    /// transmission: RFC 8985 section 6.2, step 2).
    pub(crate) newest_retx: bool,
    /// Segments retransmitted (not sacked) among what was cumulatively acknowledged.
    pub(crate) retx_acked: usize,
    /// The lowest end among the segments delivered that were sent once.
    pub(crate) low_original: Option<Seq>,
    /// The lowest segment delivered: its end, its last transmit time, and whether it was
    /// sent once. When an ACK covers a hole and what lay above it, the hole's segment is the
    /// one that just arrived; those above may have arrived long before (their report is
    /// what was late).
    pub(crate) lowest: Option<(Seq, Instant, bool)>,
    /// The highest end among the segments delivered.
    pub(crate) high: Option<Seq>,
}

/// The scoreboard.
#[derive(Debug)]
pub(crate) struct Board {
    segs: VecDeque<TxSeg>,
    in_flight: usize,
    lost: usize,
    sacked: usize,
    /// Index from which to look for a lost segment.
    lost_hint: usize,
    /// Index from which RACK looks for a segment sent once and in flight: none lies below it.
    first_sent: usize,
    /// Each retransmission's time, order and start, oldest first, for RACK (a segment sent
    /// again, or probed). An entry whose segment was since delivered, deemed lost or sent
    /// again is dropped when met.
    order: TimeOrder,
    /// The end of the highest segment pushed, as a sequence number and as a position in the
    /// stream (64 bits: it never wraps), so that RACK orders the retransmissions sent at one
    /// instant by sequence (RFC 8985's `RACK_sent_after`), across a wrap of sequence space.
    top: (Seq, u64),
    /// Indices a SACK block walked through, whose run ends it moves on.
    walked: Vec<usize>,
    /// Segments looked at by SACK blocks and RACK: the work ACKs cost, for the tests that
    /// bound it.
    ops: u64,
}

impl Default for Board {
    fn default() -> Board {
        Board::new()
    }
}

impl Board {
    /// An empty board (const: what a connection with nothing in flight reads, see
    /// `BoardBox`).
    pub(crate) const fn new() -> Board {
        Board {
            segs: VecDeque::new(),
            in_flight: 0,
            lost: 0,
            sacked: 0,
            lost_hint: 0,
            first_sent: 0,
            order: TimeOrder::new(),
            // Positions start far from zero: one below the first segment is never negative.
            top: (Seq(0), 1 << 40),
            walked: Vec::new(),
            ops: 0,
        }
    }

    #[inline]
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Bytes deemed lost and not yet resent.
    #[inline]
    pub(crate) fn lost(&self) -> usize {
        self.lost
    }

    /// Bytes selectively acknowledged.
    #[inline]
    pub(crate) fn sacked(&self) -> usize {
        self.sacked
    }

    /// Segments on the board.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.segs.len()
    }

    /// True when nothing is outstanding.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// The newest segment.
    pub(crate) fn back(&self) -> Option<&TxSeg> {
        self.segs.back()
    }

    fn account(&mut self, s: SegState, len: usize, add: bool) {
        let c = match s {
            SegState::Sent | SegState::Retrans => &mut self.in_flight,
            SegState::Lost => &mut self.lost,
            SegState::Sacked => &mut self.sacked,
        };
        if add {
            *c += len;
        } else {
            *c -= len;
        }
    }

    fn set(&mut self, i: usize, state: SegState) {
        let (old, len) = (self.segs[i].state, self.segs[i].len());
        if old == state {
            return;
        }
        self.account(old, len, false);
        self.account(state, len, true);
        self.segs[i].state = state;
        if state == SegState::Lost && i < self.lost_hint {
            self.lost_hint = i;
        }
    }

    /// A new segment was sent.
    pub(crate) fn push(&mut self, start: Seq, end: Seq, fin: bool, now: Instant) {
        let seg = TxSeg {
            start,
            end,
            xmit: now,
            state: SegState::Sent,
            retx: 0,
            fin,
            run_end: end,
        };
        self.in_flight += seg.len();
        self.segs.push_back(seg);
        self.top = (end, self.position(end));
    }

    /// Where `s` lies in the stream: `s` is within 2^31 of the highest end pushed.
    fn position(&self, s: Seq) -> u64 {
        position(self.top, s)
    }

    /// Segments looked at by SACK blocks and RACK so far.
    #[cfg(test)]
    pub(crate) fn ops(&self) -> u64 {
        self.ops
    }

    /// The segments, lowest first.
    #[cfg(test)]
    pub(crate) fn segs(&self) -> impl Iterator<Item = &TxSeg> {
        self.segs.iter()
    }

    /// Entries in RACK's time order.
    #[cfg(test)]
    pub(crate) fn order_len(&self) -> usize {
        self.order.len()
    }

    /// Enters the segment at `start`, sent again at `xmit`, in RACK's time order (a
    /// retransmission, or one whose start moved: a partial ACK, a cut). Entries of segments
    /// long delivered are dropped when they outnumber the board's (a connection without SACK
    /// never runs RACK to drop them).
    fn sent_at(&mut self, xmit: Instant, start: Seq) {
        self.order.push((xmit, self.position(start), start.0));
        if self.order.len() > 2 * self.segs.len() + 64 {
            self.reorder();
        }
    }

    /// Builds RACK's time order again from the segments sent again and in flight.
    fn reorder(&mut self) {
        let top = self.top;
        let live = self
            .segs
            .iter()
            .filter(|s| s.retx > 0 && matches!(s.state, SegState::Sent | SegState::Retrans))
            .map(|s| (s.xmit, position(top, s.start), s.start.0));
        self.order.rebuild(live);
    }

    /// The index of the segment at `start`, sent again at `xmit` and in flight since, if any.
    fn in_flight_at(&self, start: Seq, xmit: Instant) -> Option<usize> {
        let base = self.segs.front()?.start;
        if start.lt(base) {
            return None;
        }
        let i = self.index_after(start, base);
        let s = self.segs.get(i)?;
        (s.start == start
            && s.xmit == xmit
            && s.retx > 0
            && matches!(s.state, SegState::Sent | SegState::Retrans))
        .then_some(i)
    }

    /// Index of the first segment ending after `seq`.
    fn index_after(&self, seq: Seq, base: Seq) -> usize {
        let off = seq.since(base);
        self.segs.partition_point(|s| s.end.since(base) <= off)
    }

    /// Everything before `ack` was received: drop those segments. `una` is the old
    /// `SND.UNA`.
    pub(crate) fn ack(&mut self, ack: Seq, now: Instant, out: &mut Delivered) {
        while let Some(front) = self.segs.front() {
            if front.end.le(ack) {
                let s = *front;
                self.segs.pop_front();
                self.lost_hint = self.lost_hint.saturating_sub(1);
                self.first_sent = self.first_sent.saturating_sub(1);
                self.account(s.state, s.len(), false);
                if s.state != SegState::Sacked {
                    out.bytes += s.len();
                    note(out, &s, now);
                    if s.retx > 0 {
                        out.retx_acked += 1;
                    }
                }
            } else {
                if front.start.lt(ack) {
                    // Part of it arrived (the peer took what fit its window).
                    let cut = ack.since(front.start);
                    let state = front.state;
                    self.account(state, cut, false);
                    if state != SegState::Sacked {
                        out.bytes += cut;
                    }
                    if let Some(f) = self.segs.front_mut() {
                        f.start = ack;
                        let (xmit, retx) = (f.xmit, f.retx);
                        if retx > 0 && matches!(state, SegState::Sent | SegState::Retrans) {
                            self.sent_at(xmit, ack);
                        }
                    }
                }
                break;
            }
        }
    }

    /// The peer holds `[left, right)`: mark the segments wholly inside it. A run already
    /// SACKed is crossed in one search, and every segment walked learns where the run it is
    /// in now ends.
    pub(crate) fn sack(
        &mut self,
        left: Seq,
        right: Seq,
        base: Seq,
        now: Instant,
        out: &mut Delivered,
    ) {
        let mut walked = std::mem::take(&mut self.walked);
        walked.clear();
        let mut i = self.index_after(left, base);
        while i < self.segs.len() {
            self.ops += 1;
            let s = self.segs[i];
            if s.start.lt(left) {
                i += 1;
                continue;
            }
            if s.end.gt(right) {
                break;
            }
            walked.push(i);
            if s.state == SegState::Sacked {
                // Already SACKed up to `run_end`: go on from there.
                let to = s.run_end.min(right);
                i = if to.gt(s.end) {
                    self.index_after(to, base)
                } else {
                    i + 1
                };
                continue;
            }
            self.set(i, SegState::Sacked);
            self.segs[i].run_end = s.end;
            out.bytes += s.len();
            note(out, &s, now);
            i += 1;
        }
        // Everything walked is one SACKed run now, reaching past the block into any run
        // that follows it.
        if let Some(&last) = walked.last() {
            let mut end = self.segs[last].run_end.max(self.segs[last].end);
            if let Some(next) = self.segs.get(i)
                && next.state == SegState::Sacked
                && next.start.le(end)
            {
                end = end.max(next.run_end);
            }
            for &k in &walked {
                self.segs[k].run_end = self.segs[k].run_end.max(end);
            }
        }
        self.walked = walked;
    }

    /// RACK's loss detection (RFC 8985 section 6.2): every segment sent before the newest
    /// delivered one (`rack`, its transmit time and end), and not delivered itself, is lost once
    /// `rtt + reo_wnd` has passed since it was sent. Returns the bytes newly marked lost and the
    /// time at which the next one would be (the reordering timer).
    pub(crate) fn rack_detect(
        &mut self,
        rack: (Instant, Seq),
        rtt: Duration,
        reo_wnd: Duration,
        now: Instant,
    ) -> (usize, Option<Instant>) {
        let (rack_xmit, rack_end) = rack;
        let mut marked = 0;
        let mut timer = None;
        // Oldest transmission first: the first not yet due ends the walk, and its time is
        // the timer's (a later one is due later). The oldest is the older of the first
        // segment sent once and in flight (the cursor's) and the oldest retransmission in
        // flight (the time order's); of two sent at the same instant, the lower.
        loop {
            while let Some(s) = self.segs.get(self.first_sent)
                && !(s.retx == 0 && s.state == SegState::Sent)
            {
                self.ops += 1;
                self.first_sent += 1;
            }
            let again = loop {
                let Some((xmit, _, start)) = self.order.peek() else {
                    break None;
                };
                self.ops += 1;
                match self.in_flight_at(Seq(start), xmit) {
                    Some(i) => break Some(i),
                    None => {
                        self.order.pop();
                    }
                }
            };
            let once = (self.first_sent < self.segs.len()).then_some(self.first_sent);
            let (i, from_order) = match (once, again) {
                (Some(a), Some(b)) => {
                    let (x, y) = (&self.segs[a], &self.segs[b]);
                    if y.xmit < x.xmit || (y.xmit == x.xmit && y.start.lt(x.start)) {
                        (b, true)
                    } else {
                        (a, false)
                    }
                }
                (Some(a), None) => (a, false),
                (None, Some(b)) => (b, true),
                (None, None) => break,
            };
            self.ops += 1;
            let s = self.segs[i];
            let before = s.xmit < rack_xmit || (s.xmit == rack_xmit && s.end.le(rack_end));
            if !before {
                break;
            }
            let due = s.xmit + rtt + reo_wnd;
            if due > now {
                timer = Some(due);
                break;
            }
            if from_order {
                self.order.pop();
            } else {
                self.first_sent += 1;
            }
            self.set(i, SegState::Lost);
            marked += s.len();
        }
        (marked, timer)
    }

    /// Marks the first not-delivered segment lost (a third duplicate ACK without SACK, RFC
    /// 5681; or a partial ACK in NewReno recovery, RFC 6582). Returns the bytes marked.
    pub(crate) fn mark_first_lost(&mut self) -> usize {
        match self.segs.iter().position(|s| s.state == SegState::Sent) {
            Some(i) if self.segs.range(..i).all(|s| s.state == SegState::Sacked) => {
                let len = self.segs[i].len();
                self.set(i, SegState::Lost);
                len
            }
            _ => 0,
        }
    }

    /// The retransmission timer expired: every segment not delivered is lost (RFC 6675 section
    /// 5.1 and RFC 5681 section 3.1: go back to the first hole).
    pub(crate) fn mark_all_lost(&mut self) {
        for i in 0..self.segs.len() {
            if self.segs[i].state != SegState::Sacked {
                self.set(i, SegState::Lost);
            }
        }
        self.lost_hint = 0;
        self.first_sent = self.segs.len();
        self.order.clear();
    }

    /// The oldest segment deemed lost, if any: its index and bounds.
    pub(crate) fn next_lost(&mut self) -> Option<(usize, TxSeg)> {
        while self.lost > 0 && self.lost_hint < self.segs.len() {
            let s = self.segs[self.lost_hint];
            if s.state == SegState::Lost {
                return Some((self.lost_hint, s));
            }
            self.lost_hint += 1;
        }
        None
    }

    /// Segment `i` was sent again.
    pub(crate) fn resent(&mut self, i: usize, now: Instant) {
        self.set(i, SegState::Retrans);
        let s = &mut self.segs[i];
        s.xmit = now;
        s.retx = s.retx.saturating_add(1);
        let start = s.start;
        self.sent_at(now, start);
    }

    /// The newest segment in flight (not delivered, not deemed lost): what a probe in recovery
    /// sends again when there is no hole to fill and no new data.
    pub(crate) fn newest_in_flight(&self) -> Option<(usize, TxSeg)> {
        let i = self
            .segs
            .iter()
            .rposition(|s| matches!(s.state, SegState::Sent | SegState::Retrans))?;
        Some((i, self.segs[i]))
    }

    /// The newest segment was sent again (a tail loss probe): it stays in flight.
    pub(crate) fn probe_last(&mut self, now: Instant) -> Option<TxSeg> {
        let s = self.segs.back_mut()?;
        s.xmit = now;
        s.retx = s.retx.saturating_add(1);
        let s = *s;
        if matches!(s.state, SegState::Sent | SegState::Retrans) {
            self.sent_at(now, s.start);
        }
        Some(s)
    }
}

/// Where `s` lies in the stream, given the highest end pushed (`top`, as a sequence number and
/// a position): `s` is within 2^31 of it.
fn position(top: (Seq, u64), s: Seq) -> u64 {
    top.1
        .wrapping_add_signed(i64::from(s.0.wrapping_sub(top.0.0) as i32))
}

/// Records what a delivered segment tells: an RTT sample if it was sent once, and RACK's
/// newest delivered transmit.
fn note(out: &mut Delivered, s: &TxSeg, now: Instant) {
    if s.retx == 0 {
        let rtt = now - s.xmit;
        out.rtt = Some(out.rtt.map_or(rtt, |r| r.min(rtt)));
        out.rtt_long = Some(out.rtt_long.map_or(rtt, |r| r.max(rtt)));
        out.low_original = Some(out.low_original.map_or(s.end, |l| l.min(s.end)));
    }
    out.high = Some(out.high.map_or(s.end, |h| h.max(s.end)));
    if out.lowest.is_none_or(|(e, _, _)| s.end.lt(e)) {
        out.lowest = Some((s.end, s.xmit, s.retx == 0));
    }
    let newer = out
        .newest
        .is_none_or(|(t, e)| s.xmit > t || (s.xmit == t && s.end.gt(e)));
    if newer {
        out.newest = Some((s.xmit, s.end));
        out.newest_retx = s.retx > 0;
    }
}
