//! How a connection ends: closed (in order, or with an error) or in TIME-WAIT. Its buffers
//! are given back, except what arrived and the application has not read yet, which stays
//! readable until it is read or the connection is released, as a kernel socket's receive queue
//! does (a half-closed side whose reader is behind reaches TIME-WAIT; a passive closer reads
//! after its LAST-ACK).

use std::io;

use smoltcp::time::Instant;

use super::conn::{Conn, TcpState};
use super::due::Due;

impl Conn {
    /// Ends the connection with `error` (None: an orderly end).
    pub(super) fn set_closed(&mut self, error: Option<io::ErrorKind>) {
        if error.is_some() && self.error.is_none() {
            self.error = error;
        }
        self.state = TcpState::Closed;
        self.free_all_but_unread();
        self.clear_timers();
        self.wake_rx();
        self.wake_tx();
    }

    /// TIME-WAIT: short when PAWS guards against old duplicates. Everything sent was
    /// acknowledged and nothing more arrives.
    pub(super) fn enter_time_wait(&mut self, now: Instant) {
        self.state = TcpState::TimeWait;
        self.free_all_but_unread();
        self.rto_at = Due::NONE;
        self.probe.disarm();
        self.reo_at = Due::NONE;
        self.keep_at = Due::NONE;
        // Every buffer is gone: nothing is left for the trim timer.
        self.trim_at = Due::NONE;
        let wait = if self.ts_ok {
            self.cfg.time_wait.into()
        } else {
            self.cfg.time_wait_no_ts.into()
        };
        self.end_at = Due::from(Some(now + wait));
        self.wake_rx();
        self.wake_tx();
    }

    /// Gives every buffer back.
    pub(super) fn free_buffers(&mut self) {
        self.snd.free();
        self.rcv.free();
        self.ooo = Vec::new();
        self.sack_fresh = Vec::new();
        self.dsack.clear();
        self.board.clear();
    }

    /// Gives every buffer back but the unread part of the receive ring.
    fn free_all_but_unread(&mut self) {
        let unread = std::mem::take(&mut self.rcv);
        self.free_buffers();
        self.rcv = unread;
        if self.rcv.is_empty() {
            self.rcv.free();
        }
    }

    fn clear_timers(&mut self) {
        self.rto_at = Due::NONE;
        self.probe.clear();
        self.reo_at = Due::NONE;
        self.ack_at = Due::NONE;
        self.keep_at = Due::NONE;
        self.end_at = Due::NONE;
        self.trim_at = Due::NONE;
        self.syn_due = false;
        self.win_probe_due = false;
        self.keep_probe_due = false;
        self.ack_now = false;
        self.dupacks_owed = 0;
    }
}
