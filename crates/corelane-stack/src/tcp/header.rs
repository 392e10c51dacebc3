//! What the segments a connection sends carry besides their data: the header fields every
//! segment after the handshake carries (ACK, window, timestamps, SACK blocks), the option
//! bytes those take from a frame, and the SYN-ACK of a SYN cookie.

use smoltcp::time::Instant;
use smoltcp::wire::{IpEndpoint, TcpRepr};

use super::TcpConfig;
use super::conn::{Conn, Sizes, default_mss, scale_for};
use super::due::Due;
use super::secret::Secret;
use super::seq::Seq;
use super::wire::{Out, SYN};

impl Conn {
    /// The ACK, window, ECN flags and timestamps a segment sent now carries, without SACK
    /// blocks, and without settling anything (`header` does). Working it out again before
    /// anything arrives gives the same fields: a pass's data segments share it.
    pub(super) fn ack_fields(&self, now: Instant) -> Out<'static> {
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
        Out {
            seq: self.snd_nxt,
            ack: Some(self.rcv_nxt),
            flags: self.ecn.flags(),
            window: field as u16,
            ts: self.ts_ok.then(|| (self.ts_now(now), self.ts_recent)),
            ..Out::default()
        }
    }

    /// The fields every segment after the handshake carries: the ACK, the window, the
    /// timestamps and the SACK blocks. Sending them settles any ACK owed.
    pub(super) fn header(&mut self, now: Instant) -> Out<'static> {
        let mut o = self.ack_fields(now);
        let edge = self.rcv_nxt.plus(usize::from(o.window) << self.rcv_wscale);
        self.rcv_adv = self.rcv_adv.max(edge);
        self.rcv_shut = o.window == 0;
        self.last_ack_sent = self.rcv_nxt;
        self.ack_now = false;
        self.ack_at = Due::NONE;
        self.unacked_segs = 0;
        self.ack_point = None;
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

    /// Option bytes every segment after the handshake carries: the timestamps.
    pub(super) fn fixed_options_len(&self) -> usize {
        if self.ts_ok { 12 } else { 0 }
    }

    /// Option bytes of the SACK blocks the next segment carries (see `header`): a kind and
    /// length padded to four bytes, then eight bytes a block, at most three.
    pub(super) fn sack_options_len(&self) -> usize {
        let blocks = self.ooo.len() + usize::from(!self.dsack.is_empty());
        if self.sack_ok && blocks > 0 {
            4 + 8 * blocks.min(3)
        } else {
            0
        }
    }

    /// Payload bytes the next segment may carry with the options it will carry, so that no
    /// frame is longer than the MTU (RFC 9293 section 3.7.1, RFC 6691).
    pub(super) fn payload_room(&self) -> usize {
        self.seg_room
            .saturating_sub(self.fixed_options_len() + self.sack_options_len())
            .max(1)
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
