//! Explicit Congestion Notification (RFC 3168): a router that would drop a segment marks it
//! Congestion Experienced (CE) instead; the receiver echoes ECE on its ACKs until the sender
//! says with CWR that it reduced its window. The sender reduces once per window of data, as
//! for a loss but with nothing to resend: the reduction runs as a recovery episode (PRR, RFC
//! 6937, which applies to ECN as to loss) that retransmits nothing.
//!
//! Negotiated in the handshake (section 6.1.1): a SYN with ECE and CWR asks, a SYN-ACK with ECE
//! (and not CWR) agrees. Only new data segments are ECN-capable (ECT(0)): never the SYN or
//! SYN-ACK, pure ACKs, retransmissions or window probes (section 6.1.5 and 6.1.6).

use super::conn::Conn;

/// The ECN-Echo flag.
pub(crate) const ECE: u8 = 0x40;
/// The Congestion Window Reduced flag.
pub(crate) const CWR: u8 = 0x80;

/// When a connection uses ECN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EcnMode {
    /// Never: a peer's request is declined.
    Off,
    /// When the peer asks (its SYN carries ECE and CWR); connections this side opens do not
    /// ask. Linux's default (`net.ipv4.tcp_ecn = 2`).
    #[default]
    Accept,
    /// Ask on connections this side opens, and accept when a peer asks.
    On,
}

impl std::str::FromStr for EcnMode {
    type Err = String;

    fn from_str(s: &str) -> Result<EcnMode, String> {
        match s {
            "off" => Ok(EcnMode::Off),
            "accept" => Ok(EcnMode::Accept),
            "on" => Ok(EcnMode::On),
            o => Err(format!("`{o}` is not an ECN mode (off, accept, on)")),
        }
    }
}

/// What a received segment says about congestion: the ECN field of its IP header and its TCP
/// flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct EcnIn {
    /// The IP header's ECN field is CE (0b11).
    pub(crate) ce: bool,
    pub(crate) ece: bool,
    pub(crate) cwr: bool,
}

impl EcnIn {
    /// From the IP header's ECN field (the low two bits of the TOS or traffic class) and the
    /// TCP header's flags byte.
    pub(crate) fn of(ip_ecn: u8, tcp_flags: u8) -> EcnIn {
        EcnIn {
            ce: ip_ecn & 3 == 3,
            ece: tcp_flags & ECE != 0,
            cwr: tcp_flags & CWR != 0,
        }
    }
}

/// A connection's ECN state.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ecn {
    /// Negotiated.
    pub(crate) ok: bool,
    /// Our SYN asked.
    asked: bool,
    /// Receiver: CE arrived; ECE goes on every segment until the peer's CWR.
    echo: bool,
    /// Sender: the window was reduced for an ECE; CWR goes on the next new data segment.
    cwr_due: bool,
}

impl Conn {
    /// The flags an active open's SYN carries: ECE and CWR when configured to ask.
    pub(super) fn ecn_syn_flags(&mut self) -> u8 {
        if self.cfg.ecn == EcnMode::On {
            self.ecn.asked = true;
            ECE | CWR
        } else {
            0
        }
    }

    /// The flags of our SYN-ACK: ECE when the peer's SYN asked and we agreed.
    pub(super) fn ecn_syn_ack_flags(&self) -> u8 {
        if self.ecn.ok { ECE } else { 0 }
    }

    /// A listener's new connection: the peer's SYN asked for ECN (ECE and CWR), and this side
    /// accepts unless ECN is off.
    pub(crate) fn ecn_on_syn(&mut self, e: EcnIn) {
        self.ecn.ok = e.ece && e.cwr && self.cfg.ecn != EcnMode::Off;
    }

    /// Our SYN was answered: ECN holds when we asked and the SYN-ACK has ECE without CWR.
    pub(super) fn ecn_on_syn_ack(&mut self, e: EcnIn) {
        self.ecn.ok = self.ecn.asked && e.ece && !e.cwr;
    }

    /// A segment arrived on a synchronized connection (after the acceptability checks): CWR
    /// ends the echo, CE on data starts it (CWR first: a segment with both starts it again).
    pub(super) fn ecn_on_segment(&mut self, e: EcnIn, data: bool) {
        if !self.ecn.ok {
            return;
        }
        if e.cwr {
            self.ecn.echo = false;
        }
        if e.ce && data {
            self.ecn.echo = true;
            self.stats.ecn_ce += 1;
            // Tell the sender at once rather than with a delayed ACK.
            self.ack_now = true;
        }
    }

    /// An ACK with ECE: reduce the window once per window of data. Within a recovery episode
    /// (a loss, or an earlier ECE whose window is not acknowledged yet) nothing more is done.
    pub(super) fn ecn_on_ack(&mut self, e: EcnIn) {
        if !(self.ecn.ok && e.ece) || self.recovery.is_some() {
            return;
        }
        // A D-SACK proves nothing about a mark: no undo of this reduction.
        self.undo = None;
        self.enter_recovery();
        self.ecn.cwr_due = true;
        self.stats.ecn_reductions += 1;
    }

    /// The ECN flags of any segment after the handshake: ECE while echoing.
    pub(super) fn ecn_flags(&self) -> u8 {
        if self.ecn.echo { ECE } else { 0 }
    }

    /// For a data segment about to go out: whether it is ECN-capable (new data inside the
    /// window), and the CWR flag when a reduction is to be announced.
    pub(super) fn ecn_data(&self, new: bool) -> (bool, u8) {
        match (self.ecn.ok && new, self.ecn.cwr_due) {
            (false, _) => (false, 0),
            (true, due) => (true, if due { CWR } else { 0 }),
        }
    }

    /// A segment carrying CWR went out.
    pub(super) fn ecn_cwr_sent(&mut self) {
        self.ecn.cwr_due = false;
    }
}
