//! Segment arrival (RFC 9293 section 3.10.7), with RFC 5961's checks on resets, SYNs and ACKs,
//! PAWS (RFC 7323), SACK and RACK loss detection, and out-of-order reassembly in place.

use std::io;

use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{TcpControl, TcpRepr};

use super::board::Delivered;
use super::conn::{Conn, Peer, Recovery, TcpState, Undo};
use super::due::Due;
use super::ecn::EcnIn;
use super::probe::Arming;
use super::seq::Seq;

impl Conn {
    /// A segment for this connection arrived, with no ECN marks.
    #[cfg(test)]
    pub(crate) fn input(&mut self, now: Instant, seg: &TcpRepr<'_>) {
        self.input_ecn(now, seg, EcnIn::default());
    }

    /// A segment for this connection arrived; `ecn`: its IP header's ECN field and its ECE
    /// and CWR flags. Returns whether it passed the sequence and acknowledgment checks (only
    /// such a segment may tell where the peer is: its hardware address).
    pub(crate) fn input_ecn(&mut self, now: Instant, seg: &TcpRepr<'_>, ecn: EcnIn) -> bool {
        self.stats.segs_in += 1;
        match self.state {
            TcpState::Closed | TcpState::Listen => return false,
            TcpState::SynSent => {
                self.input_syn_sent(now, seg, ecn);
                return self.state == TcpState::Established;
            }
            _ => {}
        }
        let rst = seg.control == TcpControl::Rst;
        let syn = seg.control == TcpControl::Syn;
        let fin = seg.control == TcpControl::Fin;
        let seq = Seq(seg.seq_number.0 as u32);
        let len = seg.payload.len() + usize::from(syn) + usize::from(fin);

        // Our SYN-ACK was lost: the peer sent its SYN again (before the window check, which
        // a SYN below RCV.NXT fails).
        if syn && self.state == TcpState::SynReceived && seq == self.irs {
            // At most one answer per OOW_ACK_GAP, as Linux's `tcp_oow_rate_limited`: a burst
            // of one forged source's SYNs is not reflected toward it one for one.
            if self
                .oow_ack_at
                .is_some_and(|t| now - t < super::admit::OOW_ACK_GAP)
            {
                return true;
            }
            self.oow_ack_at = Due::from(Some(now));
            self.syn_due = true;
            // The SYN-ACK answers this SYN: it echoes this one's timestamp, else the peer
            // would time its round trip from the first, lost SYN-ACK's cause.
            if self.ts_ok
                && let Some(ts) = seg.timestamp
            {
                self.ts_recent = ts.tsval;
                self.ts_recent_at = now;
            }
            return true;
        }

        // PAWS (RFC 7323 section 5.3; see `paws_rejects`).
        if !rst && self.paws_rejects(now, seg, seq, len) {
            self.stats.rare().paws_dropped += 1;
            let end = seq.plus(seg.payload.len()).min(self.rcv_nxt);
            if !seg.payload.is_empty() && seq.lt(end) {
                self.note_duplicate(seq, end);
            }
            self.ack_out_of_window(now, len - usize::from(syn));
            return false;
        }

        // Is the segment acceptable (RFC 9293 section 3.10.7.4, first check)?
        let wnd = self.rcv_window_now();
        let inside = |s: Seq| s.ge(self.rcv_nxt) && s.lt(self.rcv_nxt.plus(wnd));
        let acceptable = match (len, wnd) {
            (0, 0) => seq == self.rcv_nxt,
            // At the right edge too (as Linux takes it): a peer that filled the window it was
            // given sends its ACKs from there, and they must not all be dropped while the
            // data that filled it waits for room.
            (0, _) => seq.ge(self.rcv_nxt) && seq.le(self.rcv_nxt.plus(wnd)),
            (_, 0) => false,
            _ => inside(seq) || inside(seq.plus(len - 1)),
        };
        let mut ack_only = false;
        if !acceptable {
            if rst {
                return false;
            }
            self.stats.rare().out_of_window += 1;
            let end = seq.plus(seg.payload.len());
            if !seg.payload.is_empty() && end.le(self.rcv_nxt) {
                self.note_duplicate(seq, end);
            }
            // With the window shut, the ACK of a segment at RCV.NXT still counts.
            if wnd == 0 && seq == self.rcv_nxt {
                self.ack_now = true;
            } else {
                self.ack_out_of_window(now, len - usize::from(syn));
            }
            if !(wnd == 0 && seq == self.rcv_nxt) {
                return false;
            }
            ack_only = true;
        }

        // RST (RFC 5961 section 3.2): exactly at RCV.NXT resets, elsewhere in the window only
        // earns a challenge ACK.
        if rst {
            if seq == self.rcv_nxt {
                self.stats.rare().resets_in += 1;
                let kind = if self.state == TcpState::SynReceived {
                    io::ErrorKind::ConnectionRefused
                } else {
                    io::ErrorKind::ConnectionReset
                };
                self.set_closed(Some(kind));
            } else {
                self.challenge(now);
            }
            return false;
        }

        // SYN in a synchronized state (RFC 5961 section 4.2).
        if syn {
            self.challenge(now);
            return false;
        }

        let Some(ack) = seg.ack_number else {
            return false;
        };
        let ack = Seq(ack.0 as u32);

        let fresh_ts = !self.ts_ok
            || seg
                .timestamp
                .is_none_or(|t| Seq(t.tsval).gt(Seq(self.ts_recent)));
        // TS.Recent (RFC 7323 section 4.3).
        if self.ts_ok
            && let Some(ts) = seg.timestamp
            && Seq(ts.tsval).ge(Seq(self.ts_recent))
            && seq.le(self.last_ack_sent)
        {
            self.ts_recent = ts.tsval;
            self.ts_recent_at = now;
        }

        if self.state == TcpState::SynReceived {
            if ack.gt(self.snd_una) && ack.le(self.snd_nxt) {
                self.state = TcpState::Established;
                self.syn_due = false;
                if let Some(r) = self.handshake_rtt(now, seg) {
                    self.rtt.sample_handshake(r);
                }
                self.rto_at = Due::NONE;
                self.last_progress = now;
                self.snd_wl1 = seq;
                self.snd_wl2 = ack;
                self.snd_wnd = usize::from(seg.window_len) << self.snd_wscale;
                self.max_snd_wnd = self.snd_wnd;
                self.wake_tx();
            } else {
                // RFC 9293: an unacceptable ACK in SYN-RECEIVED earns a reset.
                self.rst_due_for = Some(ack);
                return false;
            }
        }

        // The ACK field (RFC 5961 section 5.2).
        if ack.gt(self.snd_nxt) {
            self.ack_now = true;
            return false;
        }
        if ack.lt(self.snd_una.minus(self.max_snd_wnd.max(self.smss))) {
            self.challenge(now);
            return false;
        }
        self.process_ack(now, seg, seq, ack, fresh_ts);
        if matches!(self.state, TcpState::Closed) || ack_only {
            return true;
        }
        if self.ecn.on_ack(ecn, self.recovery.is_some()) {
            // A D-SACK proves nothing about a mark: no undo of this reduction.
            self.undo = None;
            self.enter_recovery();
            self.stats.rare().ecn_reductions += 1;
        }
        if self.ecn.on_segment(ecn, !seg.payload.is_empty()) {
            self.stats.rare().ecn_ce += 1;
            // Tell the sender at once rather than with a delayed ACK.
            self.ack_now = true;
        }
        if self.state == TcpState::TimeWait {
            // A retransmitted FIN: ACK it and wait again.
            if fin {
                self.ack_now = true;
                self.enter_time_wait(now);
            }
            return true;
        }

        if !seg.payload.is_empty()
            && matches!(
                self.state,
                TcpState::Established | TcpState::FinWait1 | TcpState::FinWait2
            )
        {
            if let Some(ts) = seg.timestamp {
                self.sample_rcv_rtt(now, ts.tsecr);
            }
            self.receive(now, seq, seg.payload);
        }
        if fin {
            let at = seq.plus(seg.payload.len());
            if at.ge(self.rcv_nxt) {
                self.peer_fin = Some(at);
            }
            self.ack_now = true;
        }
        self.take_fin(now);
        if let Some(i) = self.keepalive {
            self.keep_probes = 0;
            self.keep_at = Due::from(Some(now + i));
        }
        true
    }

    /// SYN-SENT (RFC 9293 section 3.10.7.3).
    /// A listener's new connection: the peer's SYN asked for ECN (ECE and CWR), and this side
    /// accepts unless configured off.
    pub(crate) fn ecn_on_syn(&mut self, e: EcnIn) {
        self.ecn.on_syn(e, self.cfg.ecn);
    }

    fn input_syn_sent(&mut self, now: Instant, seg: &TcpRepr<'_>, ecn: EcnIn) {
        let ack = seg.ack_number.map(|a| Seq(a.0 as u32));
        if let Some(a) = ack
            && (a.le(self.iss) || a.gt(self.snd_nxt))
        {
            // Not for this attempt: a reset for it, unless it is one.
            if seg.control != TcpControl::Rst {
                self.rst_due_for = Some(a);
                // A peer's TIME-WAIT of this four-tuple (PAWS dropped the SYN) answers with the
                // old connection's ACK: the reset ends it there, the SYN goes again at once; once
                // only (RFC 1337's TIME-WAIT ignores resets; a forged ACK earns one SYN).
                if self.syn_tries == 1 && seg.control == TcpControl::None {
                    self.stats.rare().syn_old_acks += 1;
                    self.syn_due = true;
                }
            }
            return;
        }
        if seg.control == TcpControl::Rst {
            if ack.is_some() {
                self.stats.rare().resets_in += 1;
                self.set_closed(Some(io::ErrorKind::ConnectionRefused));
            }
            return;
        }
        if seg.control != TcpControl::Syn {
            return;
        }
        self.irs = Seq(seg.seq_number.0 as u32);
        self.rcv_nxt = self.irs.plus(1);
        self.rcv_adv = self.rcv_nxt;
        self.negotiate(Peer::of(seg), now);
        self.snd_wl1 = self.irs;
        match ack {
            Some(a) => {
                self.ecn.on_syn_ack(ecn);
                self.snd_una = a;
                self.snd_wl2 = a;
                // A SYN's window is never scaled (RFC 7323 section 2.2).
                self.snd_wnd = usize::from(seg.window_len);
                self.max_snd_wnd = self.snd_wnd;
                if let Some(r) = self.handshake_rtt(now, seg) {
                    self.rtt.sample_handshake(r);
                }
                self.rto_at = Due::NONE;
                self.last_progress = now;
                self.state = TcpState::Established;
                self.ack_now = true;
                self.wake_tx();
            }
            None => {
                // Simultaneous open: answer with a SYN-ACK.
                self.snd_wnd = usize::from(seg.window_len);
                self.max_snd_wnd = self.snd_wnd;
                self.state = TcpState::SynReceived;
                self.snd_nxt = self.iss;
                self.syn_due = true;
            }
        }
    }

    /// The round trip the handshake measured: from the SYN (or SYN-ACK) when it was sent once;
    /// after retransmissions, only when the answer echoes the timestamp of the latest one
    /// (RFC 7323 section 4: the echo names the transmission answered). An answer to an
    /// earlier one (the peer resent on its own timer) would time the peer's timeout, not the
    /// path, and leave a timeout of seconds for the first data; with no sample the timer
    /// keeps its initial value until the data gives one.
    fn handshake_rtt(&self, now: Instant, seg: &TcpRepr<'_>) -> Option<Duration> {
        let sent = self.syn_sent_at.get()?;
        if self.syn_tries <= 1 {
            return Some(now - sent);
        }
        let tsecr = seg.timestamp.filter(|_| self.ts_ok)?.tsecr;
        (tsecr == self.ts_now(sent)).then(|| now - sent)
    }

    /// The ACK, the window and the SACK blocks of an acceptable segment.
    /// `fresh_ts`: the segment's timestamp is newer than any before it (see `take_window`).
    fn process_ack(&mut self, now: Instant, seg: &TcpRepr<'_>, seq: Seq, ack: Seq, fresh_ts: bool) {
        let mut d = Delivered::default();
        let mut acked = 0;
        if ack.gt(self.snd_una) {
            self.board.ack(ack, now, &mut d);
            let base = self.data_base();
            let fin_acked = self.fin_seq.is_some_and(|f| ack.gt(f));
            let mut data = ack.since(base);
            if fin_acked {
                data -= 1;
            }
            acked = ack.since(self.snd_una);
            self.snd.consume(data);
            if self.snd.is_empty() {
                self.trim(now);
            }
            self.snd_una = ack;
            self.last_progress = now;
            self.dupacks = 0;
            self.probe.progress();
            if self.snd.len() < self.send_limit() {
                self.wake_tx();
            }
            if fin_acked {
                self.our_fin_acked(now);
                if self.state == TcpState::Closed || self.state == TcpState::TimeWait {
                    return;
                }
            }
        } else if ack == self.snd_una
            && seg.payload.is_empty()
            && seg.control == TcpControl::None
            && !self.board.is_empty()
            && (usize::from(seg.window_len) << self.snd_wscale) == self.snd_wnd
        {
            self.dupacks += 1;
        }

        self.take_window(now, seg, seq, ack, fresh_ts);
        let newest_acked = d.newest;

        if self.sack_ok {
            // The first block inside the second is a D-SACK too (RFC 2883 section 4).
            let inner = match seg.sack_ranges {
                [Some((l, r)), Some((l2, r2)), _] => Seq(l).ge(Seq(l2)) && Seq(r).le(Seq(r2)),
                _ => false,
            };
            for (i, &(l, r)) in seg.sack_ranges.iter().flatten().enumerate() {
                let (l, r) = (Seq(l), Seq(r));
                // A D-SACK (RFC 2883): the first block, below this segment's own cumulative
                // ACK or inside the second block: a retransmission was not needed. A block
                // below SND.UNA but not below the segment's ACK is an older ACK overtaken on
                // the path, whose SACK information a newer ACK already carried: not a D-SACK
                // (taken as one, it undid recoveries and widened the reordering window on
                // paths that reorder ACKs).
                if i == 0 && r.gt(l) && (inner || r.le(ack)) {
                    self.on_dsack(l);
                } else if l.gt(self.snd_una) && r.gt(l) && r.le(self.snd_nxt) {
                    self.board.sack(l, r, self.snd_una, now, &mut d);
                }
            }
        }
        self.note_reordering(&d, now);
        self.note_echo(&d, seg);
        if let (Some(short), Some(long)) = (d.rtt, d.rtt_long) {
            self.rtt.sample_span(long, short);
        } else if acked > 0
            && d.retx_acked > 0
            && self.ts_ok
            && let Some((xmit, _)) = d.newest
            && seg.timestamp.is_some_and(|t| t.tsecr == self.ts_now(xmit))
            && self.rtt.min_rtt().is_none_or(|m| now - xmit >= m)
        {
            // Only retransmissions were acknowledged, and the ACK echoes the timestamp of the
            // newest: it answers that transmission, not the first, so its time is a sample
            // Karn's rule need not refuse (RFC 7323 section 4; RFC 3522 tells the two apart
            // the same way), and the timer's backoff ends with it. The echo is in
            // milliseconds: a first transmission in the same tick echoes the same value, so a
            // time shorter than any round trip seen answers that one and is no sample (taken,
            // it made a veth's minimum RTT 4 us, and RACK's reordering window with it).
            self.rtt.sample(now - xmit);
        }
        // RACK's newest delivery (RFC 8985 section 6.2, step 2), unless it was a
        // retransmission whose ACK may answer the first transmission: one sooner than any
        // round trip seen, or, when this ACK's cumulative part covered it, one echoing an
        // older timestamp. A SACK block's echo is the left edge's (RFC 7323 section 4.3), not
        // the SACKed segment's, so it tells nothing of which transmission arrived (Linux
        // takes the round-trip test alone for both): read as it was, a loss probe's copy of
        // the last segment, SACKed while a hole below waited, never moved RACK on, and a hole
        // sent after the newest original delivered waited for the retransmission timer.
        let sacked = d.newest != newest_acked;
        let ambiguous = d.newest_retx
            && d.newest.is_some_and(|(xmit, _)| {
                self.rtt.min_rtt().is_some_and(|m| now - xmit < m)
                    || (self.ts_ok
                        && !sacked
                        && seg
                            .timestamp
                            .is_some_and(|t| (self.ts_now(xmit).wrapping_sub(t.tsecr) as i32) > 0))
            });
        if let Some(n) = d.newest.filter(|_| !ambiguous) {
            let newer = self
                .rack
                .is_none_or(|(t, e)| n.0 > t || (n.0 == t && n.1.gt(e)));
            if newer {
                self.rack = Some(n);
                self.rack_rtt = now - n.0;
            }
        }
        self.detect_losses(now);

        // The window: PRR in fast recovery, slow start after a timeout, the controller
        // otherwise.
        let mss = self.smss;
        if let Some(rec) = &mut self.recovery
            && self.snd_una.ge(rec.recover)
        {
            let timeout = rec.timeout;
            self.recovery = None;
            if !timeout {
                match self.undo.take() {
                    Some(u) if u.left == 0 || self.echo_proves_spurious(&u, seg) => {
                        self.apply_undo(*u);
                    }
                    other => {
                        self.undo = other;
                        self.cc.cwnd = self.cc.ssthresh.max(2 * mss);
                    }
                }
            }
        }
        match &mut self.recovery {
            Some(rec) if !rec.timeout => {
                rec.prr_delivered += d.bytes;
                let pipe = self.board.in_flight();
                let ssthresh = self.cc.ssthresh;
                let sndcnt = if pipe > ssthresh {
                    (rec.prr_delivered * ssthresh)
                        .div_ceil(rec.recover_fs.max(1))
                        .saturating_sub(rec.prr_out)
                } else {
                    // Slow start reduction bound (RFC 6937 section 3.1).
                    let limit = rec.prr_delivered.saturating_sub(rec.prr_out).max(d.bytes) + mss;
                    (ssthresh - pipe).min(limit)
                };
                self.cc.cwnd = (pipe + sndcnt).max(mss);
            }
            _ => {
                let srtt = self.rtt.srtt().unwrap_or(Duration::from_millis(1));
                let limited = if self.cc.slow_start() {
                    2 * self.peak_flight < self.cc.cwnd
                } else {
                    self.peak_flight + 3 * mss < self.cc.cwnd
                };
                self.cc.on_ack(now, d.bytes, srtt, limited);
                self.peak_flight = self.board.in_flight();
            }
        }

        // Timers (RFC 6298 section 5.2 and 5.3).
        if self.board.is_empty() {
            self.rto_at = Due::NONE;
            self.probe.disarm();
            self.reo_at = Due::NONE;
        } else if acked > 0 {
            self.rto_at = Due::from(Some(now + self.rtt.rto()));
            self.arm_tlp(now);
        } else if d.bytes > 0 && self.recovery.is_some() {
            // In recovery a SACK is the progress the recovery probe waits for.
            self.probe.progress();
            self.arm_tlp(now);
        }
    }

    /// Loss detection on the board: RACK with SACK, three duplicate ACKs or a partial ACK
    /// without. A loss starts recovery.
    pub(super) fn detect_losses(&mut self, now: Instant) {
        if self.sack_ok {
            if let Some(rack) = self.rack {
                let (_, timer) = self
                    .board
                    .rack_detect(rack, self.rack_rtt, self.reo_wnd(), now);
                self.reo_at = Due::from(self.reo_timer(timer, now));
            }
        } else if self.dupacks >= 3 || (self.recovery.is_some() && self.dupacks == 0) {
            // RFC 5681's third duplicate ACK, or RFC 6582's partial ACK: the first hole.
            if self.dupacks >= 3 {
                self.dupacks = 0;
            }
            self.board.mark_first_lost();
        }
        if self.board.lost() > 0 && self.recovery.is_none() {
            self.undo = Some(Box::new(Undo {
                prior: self.cc.clone(),
                left: 0,
                from: self.snd_una,
                retx_ts: None,
                echoed_retx: false,
            }));
            self.enter_recovery();
            self.stats.rare().fast_recoveries += 1;
            // The recovery's own probe from now: a recovery that cannot send (its window
            // full of segments the peer will never take) probes after a silence rather than
            // wait for the retransmission timer.
            self.probe.disarm();
            self.arm_tlp(now);
            self.reo_quiet += 1;
            if self.reo_quiet >= 16 {
                self.reo_mult = 1;
                self.reo_quiet = 0;
                self.reo_late_us = 0;
            }
        }
    }

    /// Reduces the window for congestion (a loss, or an ECN-Echo) and starts the episode in
    /// which PRR brings it down over the next round trip, until what is sent now is acked.
    pub(super) fn enter_recovery(&mut self) {
        let flight = self.board.in_flight() + self.board.lost();
        self.cc.on_loss(flight);
        self.recovery = Some(Recovery {
            recover: self.snd_nxt,
            timeout: false,
            prr_delivered: 0,
            prr_out: 0,
            recover_fs: self.snd_nxt.since(self.snd_una),
        });
    }

    /// Arms the loss probe (see `probe.rs`) from what the connection knows now.
    pub(super) fn arm_tlp(&mut self, now: Instant) {
        let arming = Arming {
            sack: self.sack_ok,
            recovering: self.recovery.is_some(),
            in_recovery: self.cfg.recovery_probe,
            srtt: self.rtt.srtt(),
            rto: self.rtt.rto(),
            one_segment: self.board.len() == 1,
            holes: self.board.sacked() + self.board.lost() > 0,
            window_shut: self.snd_wnd == 0,
        };
        self.probe.arm(arming, now);
    }

    /// Our FIN was acknowledged.
    fn our_fin_acked(&mut self, now: Instant) {
        match self.state {
            TcpState::FinWait1 => {
                self.state = TcpState::FinWait2;
                if self.orphan {
                    self.end_at = Due::from(Some(now + self.cfg.fin_wait_2.into()));
                }
            }
            TcpState::Closing => self.enter_time_wait(now),
            TcpState::LastAck => self.set_closed(None),
            _ => {}
        }
        self.rto_at = Due::NONE;
        self.probe.disarm();
    }
}

impl Conn {
    /// Puts the controller back as it was before the spurious episode (keeping a window
    /// that has grown since).
    pub(super) fn apply_undo(&mut self, u: Undo) {
        let cwnd = self.cc.cwnd;
        self.cc = u.prior;
        self.cc.cwnd = self.cc.cwnd.max(cwnd);
        self.stats.rare().undos += 1;
    }
}
