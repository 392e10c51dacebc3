//! RACK's view of reordering (RFC 8985 section 6.2): the evidence that the path reorders
//! (a D-SACK, or an original segment delivered below one delivered before it), the reordering
//! window that evidence widens, the reordering timer's floor once it has been seen, and the
//! undo of a recovery the echoed timestamps prove spurious.
//!
//! The window goes past RFC 8985's bound (SRTT) in one case: an original segment seen to
//! arrive late, behind a later one. How late it was past that later one's round trip is what
//! the window would have had to be; the window is at least the latest such lateness (up to
//! `REO_LATE_MAX`, forgotten when the quarters are: after 16 recoveries with no D-SACK). A
//! path that holds a segment behind sixteen later ones holds it for sixteen segments' time,
//! which at a small window is several round trips: bounded by SRTT, RACK deemed such segments
//! lost every time, each spurious recovery cut the window, and a smaller window made the holds
//! longer still (16 MiB echo through the router with 40% of frames held behind 16: 85 Mbit/s
//! and some 3,000 segments resent a run; with the measured window 554-612 Mbit/s and 25-140).

use smoltcp::time::{Duration, Instant};
use smoltcp::wire::TcpRepr;

use super::board::Delivered;
use super::conn::{Conn, Undo};
use super::seq::Seq;

/// Once the path has been seen to reorder, the reordering timer fires no sooner than this
/// after it is set. RFC 8985 caps the window at SRTT, and where the round trip is a hundred
/// microseconds a segment held back a few hundred would be resent every time by a timer that
/// precise; Linux's timer (two ticks at least) waits a millisecond or more. Losses found by
/// arriving ACKs are not delayed by it.
pub(super) const REO_TIMER_FLOOR: Duration = Duration::from_millis(1);

/// The longest RACK's window may grow from what the path showed: a real loss is found by
/// ACKs no later than this past the round trip (and by the loss probe and the retransmission
/// timer, 200 ms at the least, as before).
pub(super) const REO_LATE_MAX: Duration = Duration::from_millis(20);

impl Conn {
    /// A D-SACK: the path reorders more than the window allowed for; widen it by a quarter
    /// of the minimum RTT, at most once per round trip (RFC 8985 section 6.2, step 4), up to
    /// 255 quarters as Linux allows (still never past SRTT): on a veth the minimum RTT is tens
    /// of microseconds, and 64 quarters of it were shorter than a frame held behind eight
    /// others at a few hundred Mbit/s.
    pub(super) fn on_dsack(&mut self, left_edge: Seq) {
        self.stats.rare().dsacks += 1;
        self.reordering = true;
        if let Some(u) = &mut self.undo
            && u.left > 0
            && left_edge.ge(u.from)
        {
            u.left -= 1;
            // In recovery, the undo waits for its end (PRR still sets the window until then).
            if u.left == 0
                && self.recovery.is_none()
                && let Some(u) = self.undo.take()
            {
                self.apply_undo(*u);
            }
        }
        self.reo_quiet = 0;
        if self.reo_round.is_none_or(|r| self.snd_una.gt(r)) {
            self.reo_mult = self.reo_mult.saturating_add(1);
            self.reo_round = Some(self.snd_nxt);
        }
    }

    /// RACK's reordering window (RFC 8985 section 6.2, step 4): none in recovery unless
    /// reordering was seen, else `reo_mult` quarters of the minimum RTT, never more than SRTT;
    /// and at least the latest lateness seen (see the module's docs).
    pub(super) fn reo_wnd(&self) -> Duration {
        if !self.reordering && (self.recovery.is_some() || self.board.sacked() >= 3 * self.smss) {
            return Duration::ZERO;
        }
        let min = self.rtt.min_rtt().unwrap_or(Duration::ZERO);
        let q = Duration::from_micros(min.total_micros() / 4 * u64::from(self.reo_mult));
        let q = self.rtt.srtt().map_or(q, |s| q.min(s));
        let late = Duration::from_micros(u64::from(self.reo_late_us)).min(REO_LATE_MAX);
        q.max(late)
    }

    /// RACK's reordering detection (RFC 8985 section 6.2, step 2): an original transmission
    /// delivered below the highest sequence delivered before it arrived late. Also moves
    /// that highest sequence (`RACK.fack`) over what this ACK delivered.
    pub(super) fn note_reordering(&mut self, d: &Delivered, now: Instant) {
        if let (Some(low), Some(fack)) = (d.low_original, self.rack_fack)
            && low.lt(fack)
        {
            self.reordering = true;
            // How late the segment that arrived was: the lowest one delivered, when it was
            // sent once (a retransmission's time says nothing of the original's; sent once,
            // its end is `low`, below RACK.fack).
            if let Some((_, xmit, true)) = d.lowest
                && self.rack.is_some()
            {
                let late = (now - xmit)
                    .total_micros()
                    .saturating_sub(self.rack_rtt.total_micros());
                self.reo_late_us = self.reo_late_us.max(late.min(u64::from(u32::MAX)) as u32);
            }
        }
        if let Some(high) = d.high {
            self.rack_fack = Some(self.rack_fack.map_or(high, |f| f.max(high)));
        }
    }

    /// When the reordering timer should fire, given the time RACK computed: no sooner than
    /// `REO_TIMER_FLOOR` from now once reordering has been seen.
    pub(super) fn reo_timer(&self, due: Option<Instant>, now: Instant) -> Option<Instant> {
        if self.reordering {
            due.map(|t| t.max(now + REO_TIMER_FLOOR))
        } else {
            due
        }
    }

    /// Whether the ACK that ends a fast recovery shows the episode's retransmissions were not
    /// needed (RFC 3522's detection, from RFC 7323's echo): it echoes a timestamp older than
    /// the first retransmission, so the segment that closed the last hole was sent before
    /// any, and no ACK that covered a retransmission echoed a newer one. A path that holds
    /// segments back long enough to be deemed lost loses the reduction's D-SACKs as well (the
    /// ACKs that carry them are held back and overtaken too); this one needs none.
    pub(super) fn echo_proves_spurious(&self, u: &Undo, seg: &TcpRepr<'_>) -> bool {
        let (Some(first), Some(ts)) = (u.retx_ts, seg.timestamp) else {
            return false;
        };
        self.ts_ok && !u.echoed_retx && (ts.tsecr.wrapping_sub(first) as i32) < 0
    }

    /// An ACK covered retransmitted segments: if it echoes a timestamp no older than the
    /// episode's first retransmission, a retransmission may have closed the hole, and the
    /// echo can no longer prove the episode spurious.
    pub(super) fn note_echo(&mut self, d: &Delivered, seg: &TcpRepr<'_>) {
        if d.retx_acked == 0 {
            return;
        }
        if let Some(u) = &mut self.undo
            && let Some(first) = u.retx_ts
            && seg
                .timestamp
                .is_none_or(|t| (t.tsecr.wrapping_sub(first) as i32) >= 0)
        {
            u.echoed_retx = true;
        }
    }
}
