//! The send window a segment may set (RFC 9293 section 3.10.7.4, the fifth check), on a path
//! that may deliver a peer's segments out of the order it sent them.

use smoltcp::time::Instant;
use smoltcp::wire::TcpRepr;

use super::conn::Conn;
use super::seq::Seq;

impl Conn {
    /// Takes the segment's window from any segment whose ACK is newer than the one that last
    /// set it (as Linux takes it): a peer's retransmission carries an old sequence number but
    /// its current ACK and window, and SND.UNA moved by that ACK with the older, larger window
    /// kept would put the right edge past what the peer offered.
    ///
    /// A segment with the same sequence number and ACK as the one that set it carries nothing
    /// newer: it may be an older window update overtaken on the path, so it may open the
    /// window but never shrink it (as Linux's `tcp_may_update_window`); taken as it came, a
    /// stale small window after the peer's update left the sender waiting for the override
    /// timer with nothing lost. It closes the window to zero only with a timestamp newer than
    /// every one before it (`fresh_ts`; always without timestamps, as Linux): a receiver
    /// whose buffer filled says "zero" and, once its reader caught up, "open" with the same
    /// numbers and often the same timestamp, and a path that delivered the two the other way
    /// round left the sender at a zero window with the peer's buffer empty, waiting for its
    /// probe timer (200 ms at the least: the simulation's sweep of reordering by depth found
    /// it).
    pub(super) fn take_window(
        &mut self,
        now: Instant,
        seg: &TcpRepr<'_>,
        seq: Seq,
        ack: Seq,
        fresh_ts: bool,
    ) {
        let wnd = usize::from(seg.window_len) << self.snd_wscale;
        let same = self.snd_wl1 == seq && self.snd_wl2 == ack;
        if self.snd_wl1.lt(seq)
            || self.snd_wl2.lt(ack)
            || (same && (wnd > self.snd_wnd || (wnd == 0 && fresh_ts)))
        {
            if wnd > self.snd_wnd {
                self.wake_tx();
            }
            if wnd == 0 && self.snd_wnd == 0 {
                // The peer answers our zero-window probes: it is alive.
                self.last_progress = now;
            }
            self.snd_wnd = wnd;
            self.max_snd_wnd = self.max_snd_wnd.max(wnd);
            self.snd_wl1 = seq;
            self.snd_wl2 = ack;
        }
    }
}
