//! What a segment that fails the acceptance checks may still earn: an ACK for one outside the
//! window or failing PAWS, at most every `OOW_ACK_GAP` when it carries no data; and whether a
//! SYN may end a connection in TIME-WAIT and reopen its four-tuple (RFC 6191).

use smoltcp::time::{Duration, Instant};
use smoltcp::wire::TcpRepr;

use super::conn::{Conn, TcpState};
use super::due::Due;
use super::seq::Seq;

/// At most one ACK per this long answers segments without data outside the window.
pub(super) const OOW_ACK_GAP: Duration = Duration::from_millis(500);

/// PAWS does not apply to a timestamp this old (RFC 7323 section 5.5: 24 days).
const PAWS_IDLE: Duration = Duration::from_secs(24 * 24 * 3600);

/// How many ticks behind TS.Recent a segment with data not yet received may be and still
/// be taken (see `paws_rejects`).
pub(super) const PAWS_REORDER_TICKS: u32 = 8;

impl Conn {
    /// PAWS (RFC 7323 section 5.3): whether the segment's timestamp marks it an old
    /// duplicate. One tick behind TS.Recent is let through (as Linux's `TCP_PAWS_WINDOW`): a
    /// reordered segment sent in the tick before the one that set TS.Recent. A segment that
    /// carries data not yet received may be up to `PAWS_REORDER_TICKS` behind: a path that
    /// holds segments behind later ones delivers an original after the retransmission that
    /// filled the hole below it (and moved TS.Recent on), and dropped, that original is a
    /// loss the sender recovers only when its reordering window, grown to the path's, runs
    /// out. What PAWS guards against is a segment some 2^31 bytes older aliased into the
    /// window by wrapped sequence numbers: within eight ticks that takes 2.1 Tbit/s at a
    /// millisecond tick (Linux's and the BSDs'), and at the slowest tick RFC 7323 allows
    /// (1 s) 2.1 Gbit/s held for eight seconds, where one tick's leniency already lets
    /// 17 Gbit/s through.
    pub(super) fn paws_rejects(
        &self,
        now: Instant,
        seg: &TcpRepr<'_>,
        seq: Seq,
        len: usize,
    ) -> bool {
        let Some(ts) = seg.timestamp.filter(|_| self.ts_ok) else {
            return false;
        };
        let behind = self.ts_recent.wrapping_sub(ts.tsval) as i32;
        let new_data = len > 0 && seq.plus(len).gt(self.rcv_nxt);
        let allowed = if new_data { PAWS_REORDER_TICKS } else { 1 };
        behind > allowed as i32 && now - self.ts_recent_at < PAWS_IDLE
    }

    /// Whether a new SYN for this connection's four-tuple may end it and open a new one
    /// (RFC 6191): always once closed; in TIME-WAIT only when the SYN's timestamp is newer
    /// than the last one this connection saw, or, without timestamps on both, when its
    /// sequence number is above everything this connection received (RFC 9293 section
    /// 3.10.7.4, as Linux does). Otherwise the SYN is the old connection's business (an ACK
    /// or a challenge), and an old duplicate or a forged SYN cannot cut TIME-WAIT short.
    pub(crate) fn syn_may_reopen(&self, seg: &TcpRepr<'_>) -> bool {
        match self.state {
            TcpState::Closed => true,
            TcpState::TimeWait => match (self.ts_ok, seg.timestamp) {
                (true, Some(ts)) => Seq(ts.tsval).gt(Seq(self.ts_recent)),
                _ => Seq(seg.seq_number.0 as u32).gt(self.rcv_nxt),
            },
            _ => false,
        }
    }

    /// Answers a segment that was outside the window or failed PAWS with an ACK (RFC 9293
    /// section 3.10.7.4): always for one with data (the sender must learn where we are), at
    /// most once per `OOW_ACK_GAP` for one without, so that two ends that disagree about the
    /// window (or an attacker spoofing one of them) cannot drive an ACK loop at wire speed (as
    /// Linux's `tcp_invalid_ratelimit`).
    pub(super) fn ack_out_of_window(&mut self, now: Instant, len: usize) {
        if len > 0 || self.oow_ack_at.is_none_or(|t| now - t >= OOW_ACK_GAP) {
            self.oow_ack_at = Due::from(Some(now));
            self.ack_now = true;
        }
    }
}

impl Conn {
    /// A challenge ACK (RFC 5961 section 3.2), at most 10 per second per connection.
    pub(super) fn challenge(&mut self, now: Instant) {
        if now - self.challenge_at >= Duration::from_secs(1) {
            self.challenge_at = now;
            self.challenges = 0;
        }
        if self.challenges < 10 {
            self.challenges += 1;
            self.ack_now = true;
            self.stats.rare().challenge_acks += 1;
        }
    }

    /// Remembers `[start, end)`, data that arrived again, for the next ACK's D-SACK block
    /// (RFC 2883 section 4: the first duplicate since the last ACK), and ACKs at once.
    pub(super) fn note_duplicate(&mut self, start: Seq, end: Seq) {
        if self.sack_ok {
            self.dsack.note(start, end);
        }
        self.ack_now = true;
    }
}
