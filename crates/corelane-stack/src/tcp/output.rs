//! What a connection sends now: a reset, a SYN, the holes the scoreboard marks lost, a tail
//! loss probe, new data within the congestion and peer windows (paced), a FIN, and ACKs
//! carrying the window, timestamps and SACK blocks.

use smoltcp::time::{Duration, Instant};

use super::board::TxSeg;
use super::conn::{Conn, TcpState};
use super::due::Due;
use super::pacing::{Rate, Step};
use super::probe;
use super::seq::Seq;
use super::wire::{FIN, Out, PSH, RST, SYN};

/// What one output pass works out once for all the data segments it sends.
#[derive(Default)]
struct Pass {
    /// The header template: the ACK, window, timestamps and ECN flags every data segment of
    /// the pass carries, worked out (`header`) for its first segment and kept while no SACK
    /// block is owed (blocks change from one segment to the next; then each segment gets its
    /// own).
    tmpl: Option<Out<'static>>,
    /// The pacing rate.
    step: Step,
}

#[cfg(test)]
thread_local! {
    /// The reference the tests compare a pass's sharing against (`tests_pass.rs`): with it
    /// set, each data segment works out its own header and pacing rate and arms the loss
    /// probe's timer itself, as every segment did before a pass shared them.
    pub(crate) static PER_SEGMENT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Data segments sent from a template another segment worked out.
    pub(crate) static FROM_TEMPLATE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[inline(always)]
fn per_segment() -> bool {
    #[cfg(test)]
    return PER_SEGMENT.get();
    #[cfg(not(test))]
    false
}

impl Conn {
    /// Whether pacing lets a segment leave now (a refusal is remembered: the connection's
    /// next deadline includes the pacing clock's).
    fn pace_ok(&mut self, now: Instant) -> bool {
        !self.cfg.pacing || self.pacer.allows(now)
    }

    /// `bytes` left at `now`: the pacing clock moves past them at twice (slow start) or 1.2
    /// times (congestion avoidance) the rate of one window per round trip. The rate is worked
    /// out for a pass's first segment only: nothing it depends on changes while a connection
    /// sends.
    fn paced(&mut self, now: Instant, bytes: usize, step: &mut Step) {
        if !self.cfg.pacing {
            return;
        }
        let (rtt, rack_rtt, cwnd, slow_start) = (
            self.rtt.srtt(),
            self.rack_rtt,
            self.cc.cwnd,
            self.cc.slow_start(),
        );
        let (smss, burst) = (self.smss, self.cfg.burst);
        self.pacer.sent_in_pass(now, bytes, step, || {
            let srtt = rtt?;
            // SRTT, but no more than twice the round trip of the latest delivery (RACK's):
            // one ACK a peer held for its delayed-ACK timer (40 ms and more, where the path's
            // round trip is a hundred microseconds) lifts SRTT a hundredfold for dozens of
            // ACKs, and a rate paced on it would be as much too slow; the latest delivery
            // says what the path does now.
            let rtt = if rack_rtt > Duration::ZERO {
                srtt.min(rack_rtt * 2)
            } else {
                srtt
            };
            Some(Rate {
                cwnd,
                rtt,
                slow_start,
                smss,
                burst,
            })
        });
    }

    /// Sends the data (and FIN) of `[start, end)` from the send ring, with the header and
    /// pacing rate `pass` holds (see `Pass`).
    fn send_range(
        &mut self,
        now: Instant,
        (start, end, fin): (Seq, Seq, bool),
        pass: &mut Pass,
        emit: &mut dyn FnMut(&Out<'_>) -> bool,
    ) -> bool {
        let len = end.since(start) - usize::from(fin);
        let off = start.since(self.data_base());
        if per_segment() {
            *pass = Pass::default();
        }
        let tmpl = &mut pass.tmpl;
        let mut o = match *tmpl {
            Some(t) => {
                #[cfg(test)]
                FROM_TEMPLATE.set(FROM_TEMPLATE.get() + 1);
                // What the segment would carry had it worked out its own header (its sequence
                // number is set below), with nothing owed that `header` would have settled.
                debug_assert_eq!(
                    t,
                    Out {
                        seq: t.seq,
                        ..self.ack_fields(now)
                    },
                    "a stale header template"
                );
                debug_assert!(!self.ack_now && self.sack_options_len() == 0);
                t
            }
            None => {
                let h = self.header(now);
                // A D-SACK block goes once; blocks above RCV.NXT change as they are reported.
                if h.nsack == 0 && self.sack_options_len() == 0 {
                    *tmpl = Some(h);
                }
                h
            }
        };
        o.seq = start;
        if fin {
            o.flags |= FIN;
        }
        if off + len == self.snd.len() && len > 0 {
            o.flags |= PSH;
        }
        // New data inside the window (not a retransmission, not a window probe).
        let new = len > 0 && start == self.snd_nxt && start.lt(self.snd_una.plus(self.snd_wnd));
        let (ect, cwr) = self.ecn.data(new);
        o.ect = ect;
        o.flags |= cwr;
        o.payload = self.snd.slices(off, len);
        debug_assert!(
            o.header_len() - 20 + len <= self.seg_room,
            "a segment of {len} bytes and {} of options exceeds the MSS ({})",
            o.header_len() - 20,
            self.seg_room
        );
        let ok = emit(&o);
        if ok {
            self.stats.segs_out += 1;
            self.paced(now, len + 64, &mut pass.step);
            if cwr != 0 {
                self.ecn.cwr_sent();
            }
        } else {
            self.ack_now = true;
        }
        ok
    }

    fn send_syn(&mut self, now: Instant, emit: &mut dyn FnMut(&Out<'_>) -> bool) -> bool {
        let active = self.state == TcpState::SynSent;
        let ecn = if active {
            self.ecn.syn_flags(self.cfg.ecn)
        } else {
            self.ecn.syn_ack_flags()
        };
        let o = Out {
            seq: self.iss,
            ack: (!active).then_some(self.rcv_nxt),
            flags: SYN | ecn,
            window: self.rcv_cap.min(0xffff) as u16,
            mss: Some(self.sizes.mss),
            wscale: (active || self.wscale_ok).then_some(self.rcv_wscale),
            sack_perm: if active { self.cfg.sack } else { self.sack_ok },
            ts: if active && self.cfg.timestamps {
                Some((self.ts_now(now), 0))
            } else if self.ts_ok {
                Some((self.ts_now(now), self.ts_recent))
            } else {
                None
            },
            ..Out::default()
        };
        if !emit(&o) {
            return false;
        }
        self.stats.segs_out += 1;
        if !active {
            self.last_ack_sent = self.rcv_nxt;
        }
        self.syn_due = false;
        self.syn_tries += 1;
        self.syn_sent_at = Due::from(Some(now));
        self.snd_nxt = self.iss.plus(1);
        self.rto_at = Due::from(Some(now + self.rtt.rto()));
        true
    }

    /// Sends what is due now, at most `budget` segments; `emit` writes one into a frame and
    /// returns false when no frame is free. Returns the segments sent.
    pub(crate) fn output(
        &mut self,
        now: Instant,
        budget: usize,
        emit: &mut dyn FnMut(&Out<'_>) -> bool,
    ) -> usize {
        let mut n = 0;
        self.pacer.new_pass();
        let mut pass = Pass::default();
        if let Some(seq) = self.rst_due_for.take() {
            let o = Out {
                seq,
                flags: RST,
                ..Out::default()
            };
            if emit(&o) {
                n += 1;
                self.stats.rare().resets_out += 1;
            }
        }
        if self.rst_due {
            self.rst_due = false;
            let o = Out {
                seq: self.snd_nxt,
                ack: Some(self.rcv_nxt),
                flags: RST,
                ..Out::default()
            };
            if emit(&o) {
                n += 1;
                self.stats.rare().resets_out += 1;
            }
            return n;
        }
        match self.state {
            TcpState::Closed | TcpState::Listen => return n,
            TcpState::SynSent | TcpState::SynReceived => {
                if self.syn_due && self.send_syn(now, emit) {
                    n += 1;
                }
                return n;
            }
            TcpState::TimeWait => {
                if self.ack_now {
                    let o = self.header(now);
                    if emit(&o) {
                        self.stats.segs_out += 1;
                        n += 1;
                    }
                }
                return n;
            }
            _ => {}
        }

        // The holes first.
        while n < budget {
            let lost = self.board.next_lost();
            let Some((i, s)) = self.fitted(lost) else {
                break;
            };
            let flight = self.board.in_flight();
            if flight > 0 && flight + s.len() > self.cc.cwnd {
                break;
            }
            if !self.pace_ok(now) {
                break;
            }
            if !self.send_range(now, (s.start, s.end, s.fin), &mut pass, emit) {
                return n;
            }
            self.board.resent(i, now);
            self.sent_again(now, &s);
            if self.rto_at.is_none() {
                self.rto_at = Due::from(Some(now + self.rtt.rto()));
            }
            self.arm_tlp(now);
            n += 1;
        }

        // A loss probe: new data if there is some, else the last segment again. In recovery
        // the next hole comes first, and the segment sent again is the newest not delivered,
        // so that whatever the peer reports of it is news to RACK.
        let mut force = false;
        if n < budget && self.probe.take() {
            let recovering = self.recovery.is_some();
            let hole = if recovering {
                self.stats.rare().recovery_probes += 1;
                self.board.next_lost()
            } else {
                self.stats.rare().tail_probes += 1;
                None
            };
            let new_data = self.unsent() > 0 && self.snd_una.plus(self.snd_wnd).gt(self.snd_nxt);
            let again = probe::target(recovering, hole, new_data, || self.board.newest_in_flight());
            let again = self.fitted(again);
            if let Some((i, s)) = again {
                if !self.send_range(now, (s.start, s.end, s.fin), &mut pass, emit) {
                    return n;
                }
                self.board.resent(i, now);
                self.sent_again(now, &s);
                n += 1;
            } else if new_data {
                force = true;
            } else if let Some(s) = self.last_fitted() {
                if !self.send_range(now, (s.start, s.end, s.fin), &mut pass, emit) {
                    return n;
                }
                self.board.probe_last(now);
                self.sent_again(now, &s);
                n += 1;
            }
            self.rto_at = Due::from(Some(now + self.rtt.rto()));
            // In recovery, a second probe if this one brings nothing either.
            self.arm_tlp(now);
        }

        // New data: the pass's segments share one header template, and the loss probe's timer
        // is armed once, after the last of them (each arming replaces the one before).
        let first_new = self.snd_nxt;
        let mut stopped = false;
        while n < budget {
            let unsent = self.unsent();
            let fin_ready = self.close_requested
                && self.fin_seq.is_none()
                && matches!(self.state, TcpState::Established | TcpState::CloseWait);
            if unsent == 0 && !fin_ready {
                break;
            }
            let wnd_room = self.snd_una.plus(self.snd_wnd).since(self.snd_nxt);
            let flight = self.board.in_flight();
            let cwnd_room = if force {
                self.smss
            } else {
                self.cc.cwnd.saturating_sub(flight)
            };
            let room = self.payload_room();
            let want = unsent.min(room);
            let mut len = want.min(wnd_room).min(cwnd_room);
            if len < want {
                if self.win_probe_due && (wnd_room == 0 || len == wnd_room) {
                    // The persist timer fired: one byte past a closed window, or what fits a
                    // small one that sender silly window avoidance held back (RFC 1122
                    // section 4.2.3.4's override). Either brings an ACK with the window as it
                    // is now: the update that opened it may have been lost, and then neither
                    // side would ever send again.
                    self.win_probe_due = false;
                    len = wnd_room.clamp(1, want);
                } else if cwnd_room < want && len < self.smss {
                    // Wait for ACKs rather than send a runt.
                    break;
                } else if len == 0 || len < self.max_snd_wnd / 2 {
                    // Sender silly window avoidance (RFC 9293 section 3.8.6.2.1): wait for
                    // the window to open; the persist timer probes a closed one.
                    if self.board.is_empty() && self.rto_at.is_none() {
                        self.rto_at = Due::from(Some(now + self.rtt.rto()));
                    }
                    break;
                }
            }
            // Nagle (RFC 896): a short tail waits for what is in flight, unless nodelay.
            if len > 0 && len < room && len == unsent && !self.nodelay && flight > 0 {
                break;
            }
            let fin = fin_ready && len == unsent;
            if len == 0 && !fin {
                break;
            }
            if !force && !self.pace_ok(now) {
                break;
            }
            let start = self.snd_nxt;
            let end = start.plus(len + usize::from(fin));
            if !self.send_range(now, (start, end, fin), &mut pass, emit) {
                stopped = true;
                break;
            }
            if self.board.is_empty() {
                // The user timeout counts from the oldest unacknowledged data, not from an
                // idle spell before it.
                self.last_progress = now;
            }
            self.board.push(start, end, fin, now);
            self.snd_nxt = end;
            self.stats.bytes_out += len as u64;
            if let Some(rec) = &mut self.recovery {
                rec.prr_out += len;
            }
            if fin {
                self.fin_seq = Some(start.plus(len));
                self.state = match self.state {
                    TcpState::CloseWait => TcpState::LastAck,
                    _ => TcpState::FinWait1,
                };
            }
            if self.rto_at.is_none() {
                self.rto_at = Due::from(Some(now + self.rtt.rto()));
            }
            if per_segment() && !force {
                self.arm_tlp(now);
            }
            self.peak_flight = self.peak_flight.max(self.board.in_flight());
            n += 1;
            if fin || force {
                break;
            }
        }
        if !force && self.snd_nxt != first_new {
            self.arm_tlp(now);
        }
        if stopped {
            return n;
        }

        if self.keep_probe_due {
            // A keep-alive probe: an old sequence number the peer must ACK (RFC 1122 4.2.3.6).
            self.keep_probe_due = false;
            let mut o = self.header(now);
            o.seq = self.snd_una.minus(1);
            if emit(&o) {
                self.stats.segs_out += 1;
                n += 1;
            }
        }
        if self.ack_now || self.dupacks_owed > 0 {
            // Without SACK, each out-of-order segment earns its own duplicate ACK.
            let k = self.dupacks_owed.max(1);
            self.dupacks_owed = 0;
            for _ in 0..k {
                let o = self.ack_header(now);
                if !emit(&o) {
                    self.ack_now = true;
                    break;
                }
                self.stats.segs_out += 1;
                n += 1;
            }
        }
        // Arrivals whose blocks did not fit the last segment's three, and duplicates after
        // the first: ACKs until each block was reported once (a few at most; Linux ACKs every
        // out-of-order segment and every duplicate).
        for _ in 0..4 {
            if !self.sack_ok || (self.sack_fresh.is_empty() && self.dsack.is_empty()) {
                break;
            }
            let o = self.header(now);
            if !emit(&o) {
                break;
            }
            self.stats.segs_out += 1;
            n += 1;
        }
        n
    }

    /// Segment `seg` of the board, cut (on the board too) to what one frame carries with the
    /// options the next segment carries: SACK blocks may have appeared since it was first
    /// sent, or the path's MTU shrunk.
    fn fitted(&mut self, seg: Option<(usize, TxSeg)>) -> Option<(usize, TxSeg)> {
        let (i, s) = seg?;
        let room = self.payload_room();
        if s.len() - usize::from(s.fin) <= room {
            return Some((i, s));
        }
        self.board.split(i, s.start.plus(room));
        let mut s = s;
        s.end = s.start.plus(room);
        s.fin = false;
        Some((i, s))
    }

    /// The newest segment, its front cut off if it does not fit one frame (a tail loss probe
    /// sends the end of the flight).
    fn last_fitted(&mut self) -> Option<TxSeg> {
        let s = *self.board.back()?;
        let room = self.payload_room();
        if s.len() - usize::from(s.fin) > room {
            let i = self.board.len() - 1;
            self.board.split(i, s.end.minus(room + usize::from(s.fin)));
        }
        self.board.back().copied()
    }

    fn sent_again(&mut self, now: Instant, s: &TxSeg) {
        let bytes = s.len() - usize::from(s.fin);
        self.stats.rare().retrans_segs += 1;
        self.stats.rare().retrans_bytes += bytes as u64;
        if let Some(rec) = &mut self.recovery {
            rec.prr_out += bytes;
        }
        let ts = self.ts_now(now);
        if let Some(u) = &mut self.undo {
            u.left += 1;
            u.retx_ts.get_or_insert(ts);
        }
    }
}
