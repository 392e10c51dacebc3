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

impl Conn {
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
