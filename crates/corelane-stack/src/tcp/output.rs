//! What a connection sends now: a reset, a SYN, the holes the scoreboard marks lost, a tail
//! loss probe, new data within the congestion and peer windows (paced), a FIN, and ACKs
//! carrying the window, timestamps and SACK blocks.

use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{IpEndpoint, TcpRepr};

use super::TcpConfig;
use super::board::TxSeg;
use super::conn::{Conn, Sizes, TcpState, default_mss, scale_for};
use super::due::Due;
use super::pacing::Rate;
use super::probe;
use super::secret::Secret;
use super::seq::Seq;
use super::wire::{FIN, Out, PSH, RST, SYN};

impl Conn {
    /// The fields every segment after the handshake carries: the ACK, the window, the
    /// timestamps and the SACK blocks. Sending them settles any ACK owed.
    pub(super) fn header(&mut self, now: Instant) -> Out<'static> {
        let ws = self.rcv_wscale;
        let room = self.rcv_room();
        let right = self.rcv_nxt.plus(room).max(self.rcv_adv);
        let win = right.since(self.rcv_nxt);
        let mut field = win >> ws;
        if (field << ws) < self.rcv_adv.since(self.rcv_nxt) {
            // Never move the right edge back (RFC 9293 section 3.8.6.2.2).
            field += 1;
        }
        let field = field.min(0xffff);
        self.rcv_adv = self.rcv_adv.max(self.rcv_nxt.plus(field << ws));
        self.last_ack_sent = self.rcv_nxt;
        self.ack_now = false;
        self.ack_at = Due::NONE;
        self.unacked_segs = 0;
        self.ack_point = None;
        let mut o = Out {
            seq: self.snd_nxt,
            ack: Some(self.rcv_nxt),
            flags: self.ecn.flags(),
            window: field as u16,
            ..Out::default()
        };
        if self.ts_ok {
            o.ts = Some((self.ts_now(now), self.ts_recent));
        }
        let dsack = self.dsack.take();
        if self.sack_ok && (dsack.is_some() || !self.ooo.is_empty()) {
            // A duplicate's D-SACK block first, then the block holding it if it is above
            // RCV.NXT (RFC 2883 section 4); then the block holding the newest arrival (RFC
            // 2018 section 4), those holding the other arrivals not yet reported, newest
            // first, then the highest (each range once: `sack_options_len` counts on it). One
            // ACK may answer a whole batch of arrivals: every block they changed is reported,
            // in this ACK or, past three, in the further ACKs `output` sends for them.
            let block_of = |s: Seq| self.ooo.iter().find(|(a, e)| a.le(s) && e.gt(s)).copied();
            let mut k = 0;
            if let Some(d) = dsack {
                o.sack[0] = d;
                k = 1;
            }
            let holder = dsack.and_then(|d| block_of(d.0));
            let fresh = self.sack_fresh.iter().rev().filter_map(|&s| block_of(s));
            for b in holder
                .into_iter()
                .chain(fresh)
                .chain(self.ooo.iter().rev().copied())
            {
                if k == 3 {
                    break;
                }
                if !o.sack[usize::from(dsack.is_some())..k].contains(&b) {
                    o.sack[k] = b;
                    k += 1;
                }
            }
            let told = o.sack;
            self.sack_fresh
                .retain(|&s| block_of(s).is_some_and(|b| !told[..k].contains(&b)));
            // A FIN that arrived out of order occupies the sequence number after its data:
            // the block holding that data covers it too, as the peer's segment did, or the
            // peer would never see that segment arrive.
            for b in &mut o.sack[..k] {
                if self.peer_fin == Some(b.1) {
                    b.1 = b.1.plus(1);
                }
            }
            o.nsack = k;
        }
        o
    }

    /// Whether pacing lets a segment leave now (a refusal is remembered: the connection's
    /// next deadline includes the pacing clock's).
    fn pace_ok(&mut self, now: Instant) -> bool {
        !self.cfg.pacing || self.pacer.allows(now)
    }

    /// `bytes` left at `now`: the pacing clock moves past them at twice (slow start) or 1.2
    /// times (congestion avoidance) the rate of one window per round trip.
    fn paced(&mut self, now: Instant, bytes: usize) {
        if !self.cfg.pacing {
            return;
        }
        let Some(srtt) = self.rtt.srtt() else {
            return;
        };
        // SRTT, but no more than twice the round trip of the latest delivery (RACK's): one ACK
        // a peer held for its delayed-ACK timer (40 ms and more, where the path's round trip
        // is a hundred microseconds) lifts SRTT a hundredfold for dozens of ACKs, and a rate
        // paced on it would be as much too slow; the latest delivery says what the path does
        // now.
        let rtt = if self.rack_rtt > Duration::ZERO {
            srtt.min(self.rack_rtt * 2)
        } else {
            srtt
        };
        let rate = Rate {
            cwnd: self.cc.cwnd,
            rtt,
            slow_start: self.cc.slow_start(),
            smss: self.smss,
            burst: self.cfg.burst,
        };
        self.pacer.sent(now, bytes, rate);
    }

    /// Sends the data (and FIN) of `[start, end)` from the send ring.
    fn send_range(
        &mut self,
        now: Instant,
        start: Seq,
        end: Seq,
        fin: bool,
        emit: &mut dyn FnMut(&Out<'_>) -> bool,
    ) -> bool {
        let len = end.since(start) - usize::from(fin);
        let off = start.since(self.data_base());
        let mut o = self.header(now);
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
            self.paced(now, len + 64);
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
            if !self.send_range(now, s.start, s.end, s.fin, emit) {
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
                if !self.send_range(now, s.start, s.end, s.fin, emit) {
                    return n;
                }
                self.board.resent(i, now);
                self.sent_again(now, &s);
                n += 1;
            } else if new_data {
                force = true;
            } else if let Some(s) = self.last_fitted() {
                if !self.send_range(now, s.start, s.end, s.fin, emit) {
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

        // New data.
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
            if !self.send_range(now, start, end, fin, emit) {
                return n;
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
            if !force {
                self.arm_tlp(now);
            }
            self.peak_flight = self.peak_flight.max(self.board.in_flight());
            n += 1;
            if fin || force {
                break;
            }
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

    /// Option bytes every segment after the handshake carries: the timestamps.
    pub(super) fn fixed_options_len(&self) -> usize {
        if self.ts_ok { 12 } else { 0 }
    }

    /// Option bytes of the SACK blocks the next segment carries (see `header`): a kind and
    /// length padded to four bytes, then eight bytes a block, at most three.
    fn sack_options_len(&self) -> usize {
        let blocks = self.ooo.len() + usize::from(!self.dsack.is_empty());
        if self.sack_ok && blocks > 0 {
            4 + 8 * blocks.min(3)
        } else {
            0
        }
    }

    /// Payload bytes the next segment may carry with the options it will carry, so that no
    /// frame is longer than the MTU (RFC 9293 section 3.7.1, RFC 6691).
    fn payload_room(&self) -> usize {
        self.seg_room
            .saturating_sub(self.fixed_options_len() + self.sack_options_len())
            .max(1)
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

/// The window field and window scale of a cookie SYN-ACK (`cookie_syn_ack`).
pub(crate) fn cookie_window(cfg: &TcpConfig, sizes: Sizes) -> (u16, u8) {
    (
        cfg.rx_initial.min(sizes.rx_max).min(0xffff) as u16,
        scale_for(sizes.rx_max),
    )
}

/// The SYN-ACK of a listener whose SYN backlog is full: its ISN is a SYN cookie, and when the
/// SYN had timestamps the low bits of this side's TSval carry the peer's window scale and
/// SACK-permitted, so nothing need be kept (RFC 4987 section 3.6). Without timestamps the
/// connection does without window scaling and SACK.
pub(crate) fn cookie_syn_ack(
    cfg: &TcpConfig,
    secret: &Secret,
    (local, remote): (IpEndpoint, IpEndpoint),
    syn: &TcpRepr<'_>,
    sizes: Sizes,
    now: Instant,
) -> Out<'static> {
    let peer_isn = Seq(syn.seq_number.0 as u32);
    let peer_mss = syn.max_seg_size.unwrap_or_else(|| default_mss(remote.addr));
    let isn = secret.cookie(local, remote, peer_isn, peer_mss.min(sizes.mss), now);
    let ts = syn.timestamp.filter(|_| cfg.timestamps).map(|t| {
        let ws = syn.window_scale.map_or(0xf, |w| u32::from(w.min(14)));
        let sack = u32::from(cfg.sack && syn.sack_permitted);
        let clock = (now.total_millis() as u32).wrapping_add(secret.ts_offset(local, remote));
        // The options replace the low 5 bits of a value from the 32 ms before now, never of
        // one after it: the connection's later timestamps must not look older to the peer's
        // PAWS check.
        ((clock.wrapping_sub(0x20) & !0x1f) | ws | sack << 4, t.tsval)
    });
    Out {
        seq: isn,
        ack: Some(peer_isn.plus(1)),
        flags: SYN,
        window: cookie_window(cfg, sizes).0,
        mss: Some(sizes.mss),
        wscale: ts
            .and(syn.window_scale)
            .map(|_| cookie_window(cfg, sizes).1),
        sack_perm: ts.is_some() && cfg.sack && syn.sack_permitted,
        ts,
        ..Out::default()
    }
}
