//! A connection's timers: retransmission (with the persist probe of a zero window), the tail
//! loss probe, RACK's reordering timer, the delayed ACK, keep-alive, TIME-WAIT and the orphan
//! FIN-WAIT-2 limit. Each is a deadline; `poll_at` is the earliest, `on_time` runs the due ones.

use std::io;

use smoltcp::time::Instant;

use super::conn::{Conn, Recovery, TcpState};
use super::due::Due;

impl Conn {
    /// The earliest time this connection needs the clock.
    pub(crate) fn poll_at(&self) -> Option<Instant> {
        // The connection's own deadlines are a minimum (none is the end of time).
        let own = self
            .rto_at
            .min(self.reo_at)
            .min(self.ack_at)
            .min(self.keep_at)
            .min(self.end_at)
            .min(self.trim_at);
        let mut t = own.get();
        if let Some(p) = self.probe.deadline() {
            t = Some(t.map_or(p, |t| t.min(p)));
        }
        if let Some(u) = self.user_deadline() {
            t = Some(t.map_or(u, |t| t.min(u)));
        }
        if let Some(p) = self.pacer.deadline() {
            t = Some(t.map_or(p, |t| t.min(p)));
        }
        t
    }

    /// When the user timeout ends this connection: data is in flight and unacknowledged.
    fn user_deadline(&self) -> Option<Instant> {
        if self.board.is_empty() {
            return None;
        }
        match self.state {
            TcpState::Established
            | TcpState::CloseWait
            | TcpState::FinWait1
            | TcpState::Closing
            | TcpState::LastAck => Some(self.last_progress + self.user_timeout),
            _ => None,
        }
    }

    /// Deals with the timers that are due; what they want sent is flagged for `output`.
    pub(crate) fn on_time(&mut self, now: Instant) {
        if self.user_deadline().is_some_and(|t| t <= now) {
            // The peer acknowledged nothing for the user timeout, however far the
            // retransmission timer has backed off.
            self.stats.rare().timeouts += 1;
            self.set_closed(Some(self.soft_error.unwrap_or(io::ErrorKind::TimedOut)));
            self.rst_due = true;
            return;
        }
        if self.rto_at.is_some_and(|t| t <= now) {
            self.rto_at = Due::NONE;
            self.on_rto(now);
        }
        // A probe armed before the peer's window shut finds it shut: the persist timer probes.
        self.probe
            .on_time(now, !self.board.is_empty() && self.snd_wnd > 0);
        if self.reo_at.is_some_and(|t| t <= now) {
            self.reo_at = Due::NONE;
            self.detect_losses(now);
        }
        if self.ack_at.is_some_and(|t| t <= now) {
            self.ack_at = Due::NONE;
            self.ack_now = true;
        }
        if self.keep_at.is_some_and(|t| t <= now) {
            self.keep_at = Due::NONE;
            self.on_keepalive(now);
        }
        if self.trim_at.is_some_and(|t| t <= now) {
            self.on_trim(now);
        }
        if self.end_at.is_some_and(|t| t <= now) {
            self.end_at = Due::NONE;
            if matches!(self.state, TcpState::TimeWait | TcpState::FinWait2) {
                self.set_closed(None);
            }
        }
    }

    fn on_rto(&mut self, now: Instant) {
        match self.state {
            TcpState::SynSent | TcpState::SynReceived => {
                if self.syn_tries > self.cfg.syn_retries {
                    self.stats.rare().timeouts += 1;
                    let synsent = self.state == TcpState::SynSent;
                    self.set_closed(Some(self.soft_error.unwrap_or(io::ErrorKind::TimedOut)));
                    self.rst_due = !synsent;
                    return;
                }
                // Counted for the side that connects only: a SYN-ACK's timer is an attacker's
                // to start, and the counters' box is made on the first count.
                if self.state == TcpState::SynSent {
                    self.stats.rare().syn_timeouts += 1;
                }
                self.rtt.back_off();
                self.syn_due = true;
            }
            TcpState::Closed | TcpState::Listen | TcpState::TimeWait => {}
            _ => {
                if self.board.is_empty() {
                    // The persist timer: probe a closed window, or one too small to send into
                    // (see `output`).
                    if self.snd_wnd < self.smss && self.unsent() > 0 {
                        self.rtt.back_off();
                        self.win_probe_due = true;
                    }
                    return;
                }
                if now - self.last_progress >= self.user_timeout {
                    self.stats.rare().timeouts += 1;
                    self.set_closed(Some(io::ErrorKind::TimedOut));
                    self.rst_due = true;
                    return;
                }
                self.stats.rare().rto_expiries += 1;
                self.rtt.back_off();
                self.cc.on_rto(self.board.in_flight() + self.board.lost());
                // After a timeout nothing is undone.
                self.undo = None;
                self.board.mark_all_lost();
                self.recovery = Some(Recovery::without_prr(self.snd_nxt));
                self.probe.on_rto();
                self.dupacks = 0;
            }
        }
    }

    fn on_keepalive(&mut self, now: Instant) {
        let Some(interval) = self.keepalive else {
            return;
        };
        if !matches!(self.state, TcpState::Established | TcpState::CloseWait) {
            return;
        }
        if !self.board.is_empty() {
            // Data in flight: the retransmission timer watches the peer.
            self.keep_at = Due::from(Some(now + interval));
            return;
        }
        if self.keep_probes >= self.cfg.keepalive_probes {
            self.stats.rare().timeouts += 1;
            self.set_closed(Some(io::ErrorKind::TimedOut));
            self.rst_due = true;
            return;
        }
        self.keep_probes += 1;
        self.keep_probe_due = true;
        self.keep_at = Due::from(Some(now + interval));
    }
}
