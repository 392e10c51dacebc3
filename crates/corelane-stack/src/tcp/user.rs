//! What the application calls on a connection: read, write, close, release, abort, options.

use std::io;
use std::task::Waker;

use smoltcp::time::{Duration, Instant};

use super::conn::{Conn, TcpState};
use super::due::Due;
use super::ring::SMALL;
use super::seq::Seq;

/// How long a large emptied buffer is kept before it is given back.
pub(super) const TRIM_AFTER: Duration = Duration::from_millis(500);

/// How long an emptied small buffer is kept: a request/response connection empties its rings
/// after every exchange, and taking a buffer from the pool and giving it back on each was a
/// tenth of a request's cost; an idle connection still holds none once this passed.
pub(super) const SMALL_KEEP: Duration = Duration::from_millis(10);

/// The least a send buffer may hold, however small the window (64 KiB).
pub(crate) const SEND_MIN: usize = 64 * 1024;

impl Conn {
    /// The RTT variation.
    pub(crate) fn rttvar(&self) -> Option<smoltcp::time::Duration> {
        self.rtt.rttvar()
    }

    /// Bytes written and not yet acknowledged, and bytes received and not yet read.
    pub(crate) fn queues(&self) -> (usize, usize) {
        (self.snd.len(), self.rcv.len())
    }

    /// [`input_ecn`](Conn::input_ecn) for a parsed frame, then its urgent pointer if the
    /// segment was acceptable. True as `input_ecn`.
    pub(crate) fn input_in(&mut self, now: Instant, inn: &super::wire::In<'_>) -> bool {
        let ok = self.input_ecn(now, &inn.seg, inn.ecn);
        if ok && let Some(pointer) = inn.urgent {
            self.note_urgent(Seq(inn.seg.seq_number.0 as u32), pointer);
        }
        ok
    }

    /// Takes the urgent pointer of an acceptable segment that starts at `seq` (RFC 9293
    /// 3.10.7.4, seventh: `RCV.UP <- max(RCV.UP, SEG.UP)`), within what the window allowed.
    /// The urgent data itself stays in the stream, in order (inline, as `SO_OOBINLINE`).
    pub(crate) fn note_urgent(&mut self, seq: Seq, pointer: u16) {
        // Data is taken in these states only (RFC 9293 3.10.7.4, seventh).
        let takes_data = matches!(
            self.state,
            TcpState::Established | TcpState::FinWait1 | TcpState::FinWait2
        );
        if pointer == 0 || !takes_data {
            return;
        }
        let up = seq.plus(usize::from(pointer));
        let unread = self.rcv_nxt.minus(self.rcv.len());
        // Within the window: what was advertised, or may be now.
        let right = self.rcv_adv.max(self.rcv_nxt.plus(self.rcv_window_now()));
        if up.gt(unread) && up.le(right) && self.rcv_up.is_none_or(|u| up.gt(u)) {
            self.rcv_up = Some(up);
            self.stats.rare().urgent_pointers += 1;
        }
    }

    /// How many of the bytes still to read are urgent data (up to the urgent pointer, RFC
    /// 9293 MUST-31), some of them perhaps not arrived yet; 0 when none is pending.
    pub(crate) fn urgent_unread(&self) -> usize {
        let unread = self.rcv_nxt.minus(self.rcv.len());
        self.rcv_up
            .filter(|u| u.gt(unread))
            .map_or(0, |u| u.since(unread))
    }

    /// Bytes ready to read.
    pub(crate) fn readable(&self) -> usize {
        self.rcv.len()
    }

    /// No more data will arrive (FIN received, or the connection ended).
    /// Whether the peer's FIN came, in order: every byte it sent is in the receive buffer.
    pub(crate) fn fin_received(&self) -> bool {
        self.fin_rcvd
    }

    pub(crate) fn at_eof(&self) -> bool {
        self.fin_rcvd || self.state == TcpState::Closed || self.state == TcpState::TimeWait
    }

    /// Reads into `buf`. Returns the count and whether the connection wants an output pass (a
    /// window update is worth sending, or a timer to give back an emptied buffer was set).
    #[cfg(test)]
    pub(crate) fn read(&mut self, now: Instant, buf: &mut [u8]) -> (usize, bool) {
        self.read_with(now, buf.len(), &mut crate::copy::slice_put(buf))
    }

    /// Reads up to `max` bytes, handing them to `put`; as [`Conn::read`].
    pub(crate) fn read_with(
        &mut self,
        now: Instant,
        max: usize,
        put: &mut dyn FnMut(&[u8]),
    ) -> (usize, bool) {
        let n = self.rcv.read_with(max, put);
        if n == 0 {
            return (0, false);
        }
        if self.urgent_unread() == 0 {
            self.rcv_up = None;
        }
        let armed = self.trim(now);
        // Receiver-side silly window avoidance (RFC 9293 3.8.6.2.2): announce the window once
        // it has grown by a segment or half the buffer.
        let right = self.rcv_nxt.plus(self.rcv_cap - self.rcv.len());
        let grown = right.since(self.rcv_adv);
        // After the peer's FIN no data can come: no update (as Linux, which sends none after
        // RCV_SHUTDOWN). One would reach a peer that may have closed all the way, which
        // answers it with a reset.
        let update = !self.fin_rcvd && grown >= self.smss.min(self.rcv_cap / 2).max(1);
        if update {
            self.ack_now = true;
        }
        (n, update || armed)
    }

    /// Arms the trim timer for the buffers that emptied: a small one is given back
    /// [`SMALL_KEEP`] later, a larger one (and the flight's bookkeeping) [`TRIM_AFTER`] later at
    /// the soonest, each only if still empty then (a connection that goes on keeps them).
    /// Returns true when it set the timer or moved it earlier.
    pub(super) fn trim(&mut self, now: Instant) -> bool {
        let small = |r: &super::ring::Ring| r.capacity() <= SMALL;
        if matches!(self.state(), TcpState::TimeWait | TcpState::Closed) {
            // No exchange follows: an emptied small buffer is given back at once.
            if self.snd.is_empty() && small(&self.snd) {
                self.snd.free();
            }
            if self.rcv.is_empty() && self.ooo.is_empty() && small(&self.rcv) {
                self.rcv.free();
            }
        }
        let (mut short, mut long) = (false, false);
        // The flight's bookkeeping (the scoreboard's deque, the SACK lists) goes with the
        // long timer: a connection that sends again soon keeps it, an idle one holds none.
        if (self.snd.is_empty() && self.board.holds_heap())
            || (self.ooo.is_empty() && self.sack_fresh.capacity() > 0)
        {
            long = true;
        }
        if self.snd.is_empty() && self.snd.capacity() > 0 {
            *if small(&self.snd) {
                &mut short
            } else {
                &mut long
            } = true;
        }
        if self.rcv.is_empty() && self.ooo.is_empty() && self.rcv.capacity() > 0 {
            *if small(&self.rcv) {
                &mut short
            } else {
                &mut long
            } = true;
        }
        let (at, is_short) = if short {
            (now + SMALL_KEEP, true)
        } else if long {
            (now + TRIM_AFTER, false)
        } else {
            return false;
        };
        // A short timer set while a long one waits fires first; what needs the long keep is
        // given its own timer then (see `on_trim`), so it is never given back sooner.
        if self.trim_at.get().is_none_or(|t| t > at) {
            self.trim_at = Due::from(Some(at));
            self.trim_short = is_short;
            return true;
        }
        false
    }

    /// The trim timer: every ring still empty is given back (a small one only, when it was the
    /// short timer; what needs the long keep then gets the long timer).
    pub(super) fn on_trim(&mut self, now: Instant) {
        self.trim_at = Due::NONE;
        if std::mem::take(&mut self.trim_short) {
            if self.snd.is_empty() && self.snd.capacity() <= SMALL {
                self.snd.free();
            }
            if self.rcv.is_empty() && self.ooo.is_empty() && self.rcv.capacity() <= SMALL {
                self.rcv.free();
            }
            self.trim(now);
            return;
        }
        if self.snd.is_empty() {
            self.snd.free();
            self.board.release_if_empty();
        }
        if self.ooo.is_empty() {
            self.sack_fresh = Vec::new();
        }
        if self.rcv.is_empty() && self.ooo.is_empty() {
            self.rcv.free();
            self.ooo = Vec::new();
        }
    }

    /// Hands up to `max` readable bytes to `put` without taking them; returns how many.
    pub(crate) fn peek_with(&self, max: usize, put: &mut dyn FnMut(&[u8])) -> usize {
        self.rcv.peek_with(max, put)
    }

    /// Room in the send buffer.
    pub(crate) fn send_room(&self) -> usize {
        if !self.may_send() {
            return 0;
        }
        self.send_limit().saturating_sub(self.snd.len())
    }

    /// What the send buffer may hold now: two congestion windows (one in flight, one queued to
    /// follow it while the application is woken), at least [`SEND_MIN`], at most the stack's
    /// `tcp_tx_buffer`. So the buffer follows the path's bandwidth-delay product as the receive
    /// window does, instead of holding the largest buffer on every connection or capping a
    /// long path's rate at one fixed buffer per round trip.
    pub(crate) fn send_limit(&self) -> usize {
        let max = self.sizes.tx_max;
        self.cc.cwnd.saturating_mul(2).clamp(SEND_MIN.min(max), max)
    }

    /// The application may still send.
    pub(crate) fn may_send(&self) -> bool {
        !self.close_requested
            && matches!(
                self.state,
                TcpState::SynSent
                    | TcpState::SynReceived
                    | TcpState::Established
                    | TcpState::CloseWait
            )
    }

    /// Queues as much of `data` as fits. Returns the count.
    pub(crate) fn write(&mut self, data: &[u8]) -> usize {
        let mut n = data.len().min(self.send_room());
        if n == 0 {
            return 0;
        }
        // Under the stack's memory cap the buffer grows only as far as the cap allows (a writer
        // that gets nothing waits for memory to be given back).
        let total = self.snd.affordable(self.snd.len() + n, self.send_limit());
        n = n.min(total.saturating_sub(self.snd.len()));
        if n == 0 {
            return 0;
        }
        self.snd.reserve_total(self.snd.len() + n, total);
        self.snd.push(&data[..n]);
        n
    }

    /// Counts this connection's buffers in the stack's `mem` (before either holds anything).
    pub(crate) fn set_mem(&mut self, mem: &std::sync::Arc<super::ring::MemBudget>) {
        self.snd.set_budget(mem);
        self.rcv.set_budget(mem);
    }

    /// True when a write would take bytes but the memory cap refuses the room for them.
    pub(crate) fn write_blocked_by_memory(&self) -> bool {
        self.send_room() > 0 && self.snd.capacity() == self.snd.len() && self.snd.budget_exhausted()
    }

    /// Wakes a writer (one that waited for memory to be given back).
    pub(crate) fn wake_writer(&mut self) {
        self.wake_tx();
    }

    /// Closes for writing: a FIN follows the queued data.
    pub(crate) fn close(&mut self) {
        match self.state {
            TcpState::SynSent => self.set_closed(None),
            TcpState::SynReceived | TcpState::Established | TcpState::CloseWait => {
                self.close_requested = true;
            }
            _ => {}
        }
    }

    /// The application let go: close, and never wait forever for a peer that went quiet. With
    /// unread data the connection is reset instead (RFC 2525 section 2.17).
    pub(crate) fn release(&mut self, now: Instant) {
        self.orphan = true;
        self.rx_waker = None;
        self.tx_waker = None;
        if !self.rcv.is_empty() && !self.at_eof() {
            return self.abort();
        }
        self.close();
        if self.state == TcpState::FinWait2 {
            self.end_at = Due::from(Some(now + self.cfg.fin_wait_2.into()));
        }
    }

    /// Whether the stack may go without a reset here, as a process's exit closes a kernel
    /// socket: nothing unread, and everything sent acknowledged (a FIN of ours may still be
    /// on its way). Open ones get a FIN first ([`Conn::close_at_stop`]).
    pub(crate) fn quiet_at_stop(&self) -> bool {
        matches!(
            self.state,
            TcpState::Established
                | TcpState::CloseWait
                | TcpState::FinWait1
                | TcpState::FinWait2
                | TcpState::Closing
                | TcpState::LastAck
        ) && self.rcv.is_empty()
            && self.snd.is_empty()
    }

    /// The stack is stopping and this connection is quiet: a FIN is queued where none was
    /// (the next output sends it once; nothing will retransmit it).
    pub(crate) fn close_at_stop(&mut self) {
        self.close();
    }

    /// Forgets the connection without a reset, once the stack sent what it had (its stop).
    pub(crate) fn forget(&mut self) {
        self.set_closed(None);
    }

    /// Resets the connection: a RST is sent, everything dropped.
    pub(crate) fn abort(&mut self) {
        if matches!(
            self.state,
            TcpState::Closed | TcpState::Listen | TcpState::TimeWait
        ) {
            self.set_closed(None);
            return;
        }
        let synsent = self.state == TcpState::SynSent;
        self.set_closed(Some(io::ErrorKind::ConnectionAborted));
        // A SYN-SENT connection has nothing to reset.
        self.rst_due = !synsent;
    }

    /// Small writes go out at once (true) or wait for what is in flight (Nagle).
    pub(crate) fn set_nodelay(&mut self, on: bool) {
        self.nodelay = on;
    }

    /// Whether small writes go out at once.
    pub(crate) fn nodelay(&self) -> bool {
        self.nodelay
    }

    /// Probes the peer after `interval` of silence (None: off).
    pub(crate) fn set_keepalive(&mut self, interval: Option<Duration>, now: Instant) {
        self.keepalive = interval;
        self.keep_probes = 0;
        self.keep_at = Due::from(interval.map(|i| now + i));
    }

    /// Sets how long sent data may go unacknowledged before the connection is reset
    /// (RFC 5482's user timeout; at least one second).
    pub(crate) fn set_user_timeout(&mut self, d: Duration) {
        self.user_timeout = d.max(Duration::from_secs(1));
    }

    /// The user timeout in force.
    pub(crate) fn user_timeout(&self) -> Duration {
        self.user_timeout
    }

    /// Registers the waker of a reader.
    pub(crate) fn set_rx_waker(&mut self, w: &Waker) {
        crate::udp::keep_waker(&mut self.rx_waker, w);
    }

    /// Registers the waker of a writer (or of a connect).
    pub(crate) fn set_tx_waker(&mut self, w: &Waker) {
        crate::udp::keep_waker(&mut self.tx_waker, w);
    }
}
