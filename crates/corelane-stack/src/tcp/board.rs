//! The send scoreboard: every segment sent and not yet cumulatively acknowledged, with its
//! transmit time and state, so that SACK blocks mark what arrived (RFC 6675's scoreboard),
//! RACK (RFC 8985) can tell what is lost by time rather than by counting duplicate ACKs, and
//! only the holes are retransmitted. Bytes in flight are kept as counters, updated on each
//! state change, so the sender never walks the board to know how much it may send.

use std::collections::VecDeque;

use smoltcp::time::{Duration, Instant};

use super::seq::Seq;

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
    /// A round-trip sample from a segment sent once (Karn's rule).
    pub(crate) rtt: Option<Duration>,
    /// The newest transmit time and end among what was delivered (for RACK).
    pub(crate) newest: Option<(Instant, Seq)>,
    /// Segments retransmitted (not sacked) among what was cumulatively acknowledged.
    pub(crate) retx_acked: usize,
    /// The lowest end among the segments delivered that were sent once.
    pub(crate) low_original: Option<Seq>,
    /// The highest end among the segments delivered.
    pub(crate) high: Option<Seq>,
}

/// The scoreboard.
#[derive(Debug, Default)]
pub(crate) struct Board {
    segs: VecDeque<TxSeg>,
    in_flight: usize,
    lost: usize,
    sacked: usize,
    /// Index from which to look for a lost segment.
    lost_hint: usize,
}

impl Board {
    /// Bytes in flight: sent (or resent) and neither acknowledged nor deemed lost.
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

    /// Forgets everything (the connection ended).
    pub(crate) fn clear(&mut self) {
        *self = Board::default();
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
        };
        self.in_flight += seg.len();
        self.segs.push_back(seg);
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
                    }
                }
                break;
            }
        }
    }

    /// The peer holds `[left, right)`: mark the segments wholly inside it.
    pub(crate) fn sack(
        &mut self,
        left: Seq,
        right: Seq,
        base: Seq,
        now: Instant,
        out: &mut Delivered,
    ) {
        let mut i = self.index_after(left, base);
        while i < self.segs.len() {
            let s = self.segs[i];
            if s.start.lt(left) {
                i += 1;
                continue;
            }
            if s.end.gt(right) {
                break;
            }
            if s.state != SegState::Sacked {
                self.set(i, SegState::Sacked);
                out.bytes += s.len();
                note(out, &s, now);
            }
            i += 1;
        }
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
        let mut timer: Option<Instant> = None;
        for i in 0..self.segs.len() {
            let s = self.segs[i];
            if s.state == SegState::Sacked || s.state == SegState::Lost {
                continue;
            }
            let before = s.xmit < rack_xmit || (s.xmit == rack_xmit && s.end.le(rack_end));
            if !before {
                if s.state == SegState::Sent {
                    // First transmissions go out in sequence order: the rest are newer.
                    break;
                }
                continue;
            }
            let due = s.xmit + rtt + reo_wnd;
            if due <= now {
                self.set(i, SegState::Lost);
                marked += s.len();
            } else {
                timer = Some(timer.map_or(due, |t| t.min(due)));
                if s.state == SegState::Sent {
                    break;
                }
            }
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
    }

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
        Some(*s)
    }
}

/// Records what a delivered segment tells: an RTT sample if it was sent once, and RACK's
/// newest delivered transmit.
fn note(out: &mut Delivered, s: &TxSeg, now: Instant) {
    if s.retx == 0 {
        let rtt = now - s.xmit;
        out.rtt = Some(out.rtt.map_or(rtt, |r| r.min(rtt)));
        out.low_original = Some(out.low_original.map_or(s.end, |l| l.min(s.end)));
    }
    out.high = Some(out.high.map_or(s.end, |h| h.max(s.end)));
    let newer = out
        .newest
        .is_none_or(|(t, e)| s.xmit > t || (s.xmit == t && s.end.gt(e)));
    if newer {
        out.newest = Some((s.xmit, s.end));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> Instant {
        Instant::from_millis(ms)
    }

    /// Ten segments of 100 bytes from 1000, sent 1 ms apart.
    fn board() -> Board {
        let mut b = Board::default();
        for k in 0..10 {
            let s = Seq(1000 + 100 * k as u32);
            b.push(s, s.plus(100), false, t(k));
        }
        b
    }

    #[test]
    fn sack_marks_whole_segments_and_ack_pops_them() {
        let mut b = board();
        assert_eq!(b.in_flight(), 1000);
        let mut d = Delivered::default();
        // Blocks covering segments 3..5 and half of 6.
        b.sack(Seq(1300), Seq(1650), Seq(1000), t(20), &mut d);
        assert_eq!((d.bytes, b.sacked(), b.in_flight()), (300, 300, 700));
        assert_eq!(d.newest, Some((t(5), Seq(1600))));
        let mut d = Delivered::default();
        b.ack(Seq(1400), t(21), &mut d);
        // Three unsacked segments acknowledged, plus one already sacked (not counted again).
        assert_eq!(d.bytes, 300);
        assert_eq!(d.rtt, Some(Duration::from_millis(19)));
        assert_eq!((b.sacked(), b.in_flight(), b.len()), (200, 400, 6));
    }

    #[test]
    fn rack_marks_what_was_sent_before_the_newest_delivery_once_its_time_is_up()
    -> Result<(), &'static str> {
        let mut b = board();
        let mut d = Delivered::default();
        b.sack(Seq(1500), Seq(1600), Seq(1000), t(30), &mut d);
        let rack = d.newest.ok_or("nothing delivered")?;
        // At 30 ms, with an RTT of 25 ms: segments sent at 0..=4 ms are due at 25..=29.
        let (lost, timer) = b.rack_detect(rack, Duration::from_millis(25), Duration::ZERO, t(30));
        assert_eq!(lost, 500);
        assert_eq!(timer, None);
        // With a reordering window of 3 ms, those sent at 3 and 4 ms are not yet due.
        let mut b = board();
        let mut d = Delivered::default();
        b.sack(Seq(1500), Seq(1600), Seq(1000), t(30), &mut d);
        let (lost, timer) = b.rack_detect(
            d.newest.ok_or("nothing delivered")?,
            Duration::from_millis(25),
            Duration::from_millis(3),
            t(30),
        );
        assert_eq!(lost, 300);
        assert_eq!(timer, Some(t(31)));
        assert_eq!(
            b.next_lost().map(|(i, s)| (i, s.start)),
            Some((0, Seq(1000)))
        );
        b.resent(0, t(30));
        assert_eq!(b.next_lost().map(|(i, _)| i), Some(1));
        assert_eq!((b.lost(), b.in_flight()), (200, 700));
        Ok(())
    }

    #[test]
    fn a_split_segment_keeps_its_state_and_the_counts() {
        let mut b = board();
        b.mark_all_lost();
        b.split(9, Seq(1960));
        assert_eq!((b.len(), b.lost(), b.in_flight()), (11, 1000, 0));
        let (i, s) = b.next_lost().unwrap();
        assert_eq!((i, s.start, s.end), (0, Seq(1000), Seq(1100)));
        b.resent(0, t(50));
        b.split(0, Seq(1040));
        assert_eq!((b.lost(), b.in_flight(), b.len()), (900, 100, 12));
        // Out of range: nothing changes.
        b.split(0, Seq(1000));
        assert_eq!(b.len(), 12);
    }

    #[test]
    fn a_timeout_marks_everything_not_sacked_lost() {
        let mut b = board();
        let mut d = Delivered::default();
        b.sack(Seq(1200), Seq(1300), Seq(1000), t(30), &mut d);
        b.mark_all_lost();
        assert_eq!((b.lost(), b.in_flight(), b.sacked()), (900, 0, 100));
        let mut d = Delivered::default();
        b.ack(Seq(1050), t(40), &mut d);
        assert_eq!((d.bytes, b.lost()), (50, 850));
    }
}
