//! The receive side: in-window data placed where it belongs in the receive ring (out-of-order
//! ranges remembered for SACK), `RCV.NXT` moved over what became contiguous, the peer's FIN
//! taken in order, and the receive window auto-tuned from the receiver's RTT.

use smoltcp::time::{Duration, Instant};

use super::conn::{Conn, TcpState};
use super::due::Due;
use super::seq::Seq;

/// At most this many out-of-order ranges are remembered; a segment that would make another is
/// dropped (the peer sends it again).
const MAX_OOO: usize = 64;
/// Out-of-order arrivals remembered until a SACK block reports them.
const MAX_FRESH: usize = 32;

impl Conn {
    /// The receiver's RTT from the timestamp a data segment echoes (RFC 7323 section 4.1), in
    /// milliseconds, for receive-window auto-tuning. A sender that was idle echoes an old
    /// value, so the estimate follows a smaller sample at once and a larger one slowly.
    pub(super) fn sample_rcv_rtt(&mut self, now: Instant, tsecr: u32) {
        if !self.ts_ok || tsecr == 0 {
            return;
        }
        let ms = self.ts_now(now).wrapping_sub(tsecr);
        if ms > 60_000 {
            return;
        }
        let ms = ms.max(1);
        self.rcv_rtt_ms = if self.rcv_rtt_ms == 0 || ms < self.rcv_rtt_ms {
            ms
        } else {
            (7 * self.rcv_rtt_ms + ms) / 8
        };
    }

    /// The window in force from `RCV.NXT`: the room in the buffer, or what was advertised when
    /// that is more (a window rounded up to the scale's unit, so that its right edge never
    /// moved back, is a promise: data inside it is taken, the ring growing past its cap by
    /// less than one unit). None after a shut window was advertised, until one with room is
    /// (RFC 9293 section 3.10.7.4; Linux drops past its advertised window too): a byte taken
    /// into the room the window's scale rounded away would answer a sender's zero-window
    /// probe with new data acknowledged, and the sender, its backoff reset by that, would
    /// probe every 200 ms until the room was used up a byte at a time.
    pub(super) fn rcv_window_now(&self) -> usize {
        if self.rcv_shut {
            return 0;
        }
        self.rcv_room().max(self.rcv_adv.since(self.rcv_nxt))
    }

    /// In-window data at `seq`: placed where it belongs in the receive ring; `RCV.NXT` moves
    /// over what is now contiguous.
    pub(super) fn receive(&mut self, now: Instant, seq: Seq, payload: &[u8]) {
        let (mut seq, mut data) = (seq, payload);
        if seq.lt(self.rcv_nxt) {
            let cut = self.rcv_nxt.since(seq);
            self.note_duplicate(seq, seq.plus(cut.min(data.len())));
            if cut >= data.len() {
                return;
            }
            data = &data[cut..];
            seq = self.rcv_nxt;
        }
        let room = self.rcv_window_now();
        let off = seq.since(self.rcv_nxt);
        if off >= room {
            self.ack_now = true;
            return;
        }
        let n = data.len().min(room - off);
        let (start, end) = (seq, seq.plus(n));
        if off > 0
            && self.ooo.len() >= MAX_OOO
            && !self.ooo.iter().any(|&(s, e)| s.le(end) && e.ge(start))
        {
            self.ack_now = true;
            return;
        }
        let at = self.rcv.len() + off;
        // Past the stack's memory cap a segment that needs the ring to grow is dropped, in
        // order or not (the peer sends it again once the application has read and memory is
        // given back): what a window promised is not a reservation, so many connections
        // holding data out of order, or unread, cannot take more than the cap.
        if !self.rcv.may_hold(at + n, self.rcv_cap) {
            // In-order data refused: the stack gives up out-of-order data held elsewhere.
            if off == 0 {
                self.rcv.note_pressure();
            }
            self.ack_now = true;
            return;
        }
        self.rcv.reserve_total(at + n, self.rcv_cap);
        self.rcv.write_at(at, &data[..n]);
        if off == 0 {
            let had_holes = !self.ooo.is_empty();
            self.advance(now, n);
            if had_holes {
                self.ack_now = true;
            } else {
                self.unacked_segs += 1;
                if self.unacked_segs >= 2 {
                    self.ack_now = true;
                    if self.unacked_segs.is_multiple_of(2) {
                        self.ack_point = Some(self.rcv_nxt);
                    }
                } else if self.ack_at.is_none() {
                    self.ack_at = Due::from(Some(now + self.cfg.ack_delay.into()));
                }
            }
            self.wake_rx();
        } else {
            if let Some(&(s, e)) = self.ooo.iter().find(|&&(s, e)| s.lt(end) && e.gt(start)) {
                self.note_duplicate(s.max(start), e.min(end));
            }
            self.insert_ooo(start, end);
            // Reported in the next SACK blocks (each once at least, not only the newest): one
            // entry per block, the newest arrival's last. Per arrival, a batch of segments
            // extending the highest block pushed the other blocks it changed out of the list,
            // and those were never reported: the peer resent what had arrived (a kernel
            // sender through 5% loss resent 1.5-2x the frames lost).
            if let Some(&(a, e)) = self.ooo.iter().find(|&&(a, e)| a.le(start) && e.gt(start)) {
                self.sack_fresh.retain(|&s| !(s.ge(a) && s.lt(e)));
            }
            if self.sack_fresh.len() >= MAX_FRESH {
                self.sack_fresh.remove(0);
            }
            self.sack_fresh.push(start);
            self.ack_now = true;
            if !self.sack_ok {
                self.dupacks_owed = (self.dupacks_owed + 1).min(3);
            }
        }
    }

    /// True while data is held past a hole.
    pub(crate) fn holds_out_of_order(&self) -> bool {
        !self.ooo.is_empty()
    }

    /// Drops the data held past a hole (RFC 2018 lets a receiver renege on what it SACKed:
    /// the sender keeps it until cumulatively acknowledged and sends it again); returns the
    /// bytes of buffer given back to the stack's memory.
    pub(crate) fn prune_out_of_order(&mut self) -> usize {
        if self.ooo.is_empty() {
            return 0;
        }
        self.ooo.clear();
        self.sack_fresh.clear();
        self.rcv.drop_past_contents()
    }

    /// Moves `RCV.NXT` over `n` bytes written at it, then over the out-of-order ranges that
    /// now touch it.
    fn advance(&mut self, now: Instant, n: usize) {
        let mut moved = n;
        self.rcv.extend(n);
        self.rcv_nxt = self.rcv_nxt.plus(n);
        while let Some(&(s, e)) = self.ooo.first() {
            if s.gt(self.rcv_nxt) {
                break;
            }
            if e.gt(self.rcv_nxt) {
                let k = e.since(self.rcv_nxt);
                self.rcv.extend(k);
                self.rcv_nxt = e;
                moved += k;
            }
            self.ooo.remove(0);
        }
        self.stats.bytes_in += moved as u64;
        self.autotune(now, moved);
    }

    fn insert_ooo(&mut self, start: Seq, end: Seq) {
        let i = self
            .ooo
            .partition_point(|&(s, _)| s.since(self.rcv_nxt) < start.since(self.rcv_nxt));
        self.ooo.insert(i, (start, end));
        // Merge with neighbours.
        let mut j = i.saturating_sub(1);
        while j + 1 < self.ooo.len() {
            let (a, b) = (self.ooo[j], self.ooo[j + 1]);
            if b.0.le(a.1) {
                self.ooo[j].1 = a.1.max(b.1);
                self.ooo.remove(j + 1);
            } else if j >= i {
                break;
            } else {
                j += 1;
            }
        }
    }

    /// Receive-window auto-tuning: once per receiver RTT, let the window reach twice what
    /// arrived in that RTT plus room for the sender's slow start, up to the configured most.
    fn autotune(&mut self, now: Instant, n: usize) {
        self.rcv_space += n;
        let rtt = if self.rcv_rtt_ms > 0 {
            Duration::from_millis(u64::from(self.rcv_rtt_ms))
        } else {
            self.rtt.srtt().unwrap_or(Duration::from_millis(1))
        };
        if now - self.rcv_space_at < rtt {
            return;
        }
        let target = (2 * self.rcv_space + 16 * self.smss).min(self.rcv_max());
        // Under the stack's memory cap the window stops growing (what it promised stands).
        if target > self.rcv_cap && self.rcv.affordable(target, target) >= target {
            self.rcv_cap = target;
        }
        self.rcv_space = 0;
        self.rcv_space_at = now;
    }

    /// The peer's FIN, once everything before it arrived.
    pub(super) fn take_fin(&mut self, now: Instant) {
        let Some(f) = self.peer_fin else {
            return;
        };
        if f != self.rcv_nxt || self.fin_rcvd {
            return;
        }
        self.peer_fin = None;
        self.fin_rcvd = true;
        self.rcv_nxt = self.rcv_nxt.plus(1);
        self.ack_now = true;
        self.wake_rx();
        match self.state {
            TcpState::SynReceived | TcpState::Established => self.state = TcpState::CloseWait,
            TcpState::FinWait1 => {
                // Our FIN is not yet acknowledged (else we would be in FIN-WAIT-2).
                self.state = TcpState::Closing;
            }
            TcpState::FinWait2 => self.enter_time_wait(now),
            _ => {}
        }
    }
}

/// How long the odd last segment of a batch of in-order segments waits for a second one, or
/// for data to ride on, after the ACK for those before it. Longer than a sender's tail loss
/// probe (Linux's: two SRTT plus two ticks), as Linux's own delayed ACK (40 ms at least) is:
/// were it acknowledged at once, a sender whose next segment was lost would have one segment
/// out, and wait 200 ms more for its probe.
const HELD_ACK_DELAY: Duration = Duration::from_millis(40);

impl Conn {
    /// A pure ACK. When in-order segments arrived together and an odd one came last, the ACK
    /// says what one sent at the last second segment would have (RFC 1122's ACK for every
    /// second segment, as a receiver that answers each segment in turn sends it), and the odd
    /// one waits `HELD_ACK_DELAY`. Anything else to report (a hole, a duplicate, the peer's
    /// FIN) acknowledges everything at once.
    pub(super) fn ack_header(&mut self, now: Instant) -> super::wire::Out<'static> {
        let held = self.ack_point.take().filter(|p| {
            p.lt(self.rcv_nxt)
                && !self.unacked_segs.is_multiple_of(2)
                && self.ooo.is_empty()
                && self.dsack.is_empty()
                && !self.fin_rcvd
        });
        let Some(point) = held else {
            return self.header(now);
        };
        let nxt = std::mem::replace(&mut self.rcv_nxt, point);
        let o = self.header(now);
        self.rcv_nxt = nxt;
        self.unacked_segs = 1;
        self.ack_at = Due::from(Some(now + HELD_ACK_DELAY));
        o
    }
}
