//! The public face of a connection: its state and its counters.

/// The state of a TCP connection (RFC 9293's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TcpState {
    /// No connection.
    Closed,
    /// Waiting for a SYN.
    Listen,
    /// SYN sent, waiting for the SYN-ACK.
    SynSent,
    /// SYN received and answered, waiting for the ACK.
    SynReceived,
    /// Open both ways.
    Established,
    /// This side sent FIN, not yet acknowledged.
    FinWait1,
    /// This side's FIN acknowledged; waiting for the peer's.
    FinWait2,
    /// The peer sent FIN; this side may still send.
    CloseWait,
    /// Both sent FIN at once.
    Closing,
    /// The peer closed first and this side's FIN waits for its ACK.
    LastAck,
    /// Both closed; waiting out old segments.
    TimeWait,
}

impl std::fmt::Display for TcpState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TcpState::Closed => "CLOSED",
            TcpState::Listen => "LISTEN",
            TcpState::SynSent => "SYN-SENT",
            TcpState::SynReceived => "SYN-RECEIVED",
            TcpState::Established => "ESTABLISHED",
            TcpState::FinWait1 => "FIN-WAIT-1",
            TcpState::FinWait2 => "FIN-WAIT-2",
            TcpState::CloseWait => "CLOSE-WAIT",
            TcpState::Closing => "CLOSING",
            TcpState::LastAck => "LAST-ACK",
            TcpState::TimeWait => "TIME-WAIT",
        })
    }
}

/// TCP counters, per connection and summed per stack.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpStats {
    /// Segments sent.
    pub segs_out: u64,
    /// Segments received.
    pub segs_in: u64,
    /// Payload bytes sent for the first time.
    pub bytes_out: u64,
    /// Payload bytes received in order.
    pub bytes_in: u64,
    /// Segments sent again.
    pub retrans_segs: u64,
    /// Payload bytes sent again.
    pub retrans_bytes: u64,
    /// Retransmission timeouts.
    pub rto_expiries: u64,
    /// Fast recoveries entered (SACK or duplicate ACKs).
    pub fast_recoveries: u64,
    /// Tail loss probes sent.
    pub tail_probes: u64,
    /// Loss probes sent during recovery, after a silence (`TcpConfig::recovery_probe`).
    pub recovery_probes: u64,
    /// Challenge ACKs sent (RFC 5961).
    pub challenge_acks: u64,
    /// Segments dropped by PAWS (RFC 7323).
    pub paws_dropped: u64,
    /// Segments outside the receive window.
    pub out_of_window: u64,
    /// Resets sent.
    pub resets_out: u64,
    /// Resets received that closed a connection.
    pub resets_in: u64,
    /// SYN-ACKs sent as SYN cookies.
    pub cookies_sent: u64,
    /// Connections opened from a valid cookie.
    pub cookies_ok: u64,
    /// Connections dropped by a timer (SYN retries, user timeout, keep-alive).
    pub timeouts: u64,
    /// D-SACKs received (RFC 2883): segments the peer got twice, so a retransmission was
    /// spurious (reordering, or a duplicating path).
    pub dsacks: u64,
    /// Window reductions undone because every retransmission of the episode was D-SACKed.
    pub undos: u64,
    /// Times the path MTU shrank on an ICMP "fragmentation needed" / "packet too big".
    pub pmtu_updates: u64,
    /// ICMP errors that reached a connection and were acted on (the MTU ones included).
    pub icmp_errors: u64,
    /// Data segments received marked Congestion Experienced (ECN, RFC 3168).
    pub ecn_ce: u64,
    /// Window reductions for an ECN-Echo from the peer.
    pub ecn_reductions: u64,
    /// SYNs of connections this side opened sent again because their timer ran out: each is
    /// a wait the connecting task sat through (a second at the initial timeout).
    pub syn_timeouts: u64,
    /// SYNs answered by the ACK of an earlier connection of the same four-tuple (a peer that
    /// still held it in TIME-WAIT): reset there and sent again at once.
    pub syn_old_acks: u64,
    /// Urgent pointers taken that moved the urgent point on (RFC 9293 3.8.5; the data stays
    /// inline).
    pub urgent_pointers: u64,
}

impl std::ops::AddAssign for TcpStats {
    fn add_assign(&mut self, o: TcpStats) {
        self.segs_out += o.segs_out;
        self.segs_in += o.segs_in;
        self.bytes_out += o.bytes_out;
        self.bytes_in += o.bytes_in;
        self.retrans_segs += o.retrans_segs;
        self.retrans_bytes += o.retrans_bytes;
        self.rto_expiries += o.rto_expiries;
        self.fast_recoveries += o.fast_recoveries;
        self.tail_probes += o.tail_probes;
        self.recovery_probes += o.recovery_probes;
        self.challenge_acks += o.challenge_acks;
        self.paws_dropped += o.paws_dropped;
        self.out_of_window += o.out_of_window;
        self.resets_out += o.resets_out;
        self.resets_in += o.resets_in;
        self.cookies_sent += o.cookies_sent;
        self.cookies_ok += o.cookies_ok;
        self.timeouts += o.timeouts;
        self.dsacks += o.dsacks;
        self.undos += o.undos;
        self.pmtu_updates += o.pmtu_updates;
        self.icmp_errors += o.icmp_errors;
        self.ecn_ce += o.ecn_ce;
        self.ecn_reductions += o.ecn_reductions;
        self.syn_timeouts += o.syn_timeouts;
        self.syn_old_acks += o.syn_old_acks;
        self.urgent_pointers += o.urgent_pointers;
    }
}

/// A connection's counters as it keeps them: the four that every segment moves inline, the
/// counters of rarer events (losses, probes, resets, ECN) in a box made when the first of
/// them happens, so an idle connection that never met one holds 40 bytes of counters, not
/// the 192 of a whole [`TcpStats`].
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnStats {
    pub(crate) segs_out: u64,
    pub(crate) segs_in: u64,
    pub(crate) bytes_out: u64,
    pub(crate) bytes_in: u64,
    rare: Option<Box<TcpStats>>,
}

impl ConnStats {
    /// The rarer counters, to move one (made on the first call).
    #[inline]
    pub(crate) fn rare(&mut self) -> &mut TcpStats {
        self.rare.get_or_insert_with(Box::default)
    }

    /// Whether the rarer counters were made (one of their events happened).
    #[cfg(test)]
    pub(crate) fn holds_rare(&self) -> bool {
        self.rare.is_some()
    }

    /// Every counter as a [`TcpStats`].
    pub(crate) fn get(&self) -> TcpStats {
        let mut s = self.rare.as_deref().copied().unwrap_or_default();
        s.segs_out = self.segs_out;
        s.segs_in = self.segs_in;
        s.bytes_out = self.bytes_out;
        s.bytes_in = self.bytes_in;
        s
    }
}
