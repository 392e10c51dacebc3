//! Explicit Congestion Notification (RFC 3168): a router that would drop a segment marks it
//! Congestion Experienced (CE) instead; the receiver echoes ECE on its ACKs until the sender
//! says with CWR that it reduced its window. The sender reduces once per window of data, as
//! for a loss but with nothing to resend: the reduction runs as a recovery episode (PRR, RFC
//! 6937, which applies to ECN as to loss) that retransmits nothing.
//!
//! Negotiated in the handshake (section 6.1.1): a SYN with ECE and CWR asks, a SYN-ACK with ECE
//! (and not CWR) agrees. Only new data segments are ECN-capable (ECT(0)): never the SYN or
//! SYN-ACK, pure ACKs, retransmissions or window probes (section 6.1.5 and 6.1.6).

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

impl Ecn {
    /// The flags an active open's SYN carries: ECE and CWR when `mode` asks.
    pub(crate) fn syn_flags(&mut self, mode: EcnMode) -> u8 {
        if mode == EcnMode::On {
            self.asked = true;
            ECE | CWR
        } else {
            0
        }
    }

    /// The flags of our SYN-ACK: ECE when the peer's SYN asked and we agreed.
    pub(crate) fn syn_ack_flags(&self) -> u8 {
        if self.ok { ECE } else { 0 }
    }

    /// A listener's new connection: the peer's SYN asked for ECN (ECE and CWR), and this side
    /// accepts unless `mode` is off.
    pub(crate) fn on_syn(&mut self, e: EcnIn, mode: EcnMode) {
        self.ok = e.ece && e.cwr && mode != EcnMode::Off;
    }

    /// Our SYN was answered: ECN holds when we asked and the SYN-ACK has ECE without CWR.
    pub(crate) fn on_syn_ack(&mut self, e: EcnIn) {
        self.ok = self.asked && e.ece && !e.cwr;
    }

    /// A segment arrived on a synchronized connection (after the acceptability checks): CWR
    /// ends the echo, CE on data starts it (CWR first: a segment with both starts it again).
    /// True when this segment was marked CE: the connection counts it and tells the sender at
    /// once rather than with a delayed ACK.
    pub(crate) fn on_segment(&mut self, e: EcnIn, data: bool) -> bool {
        if !self.ok {
            return false;
        }
        if e.cwr {
            self.echo = false;
        }
        if e.ce && data {
            self.echo = true;
            return true;
        }
        false
    }

    /// An ACK arrived; `recovering`: a recovery episode (a loss, or an earlier ECE whose window
    /// is not acknowledged yet) is running. True when the ACK's ECE asks for a window reduction
    /// (once per window of data: within an episode nothing more is done); CWR then goes on the
    /// next new data segment.
    pub(crate) fn on_ack(&mut self, e: EcnIn, recovering: bool) -> bool {
        if !(self.ok && e.ece) || recovering {
            return false;
        }
        self.cwr_due = true;
        true
    }

    /// The ECN flags of any segment after the handshake: ECE while echoing.
    pub(crate) fn flags(&self) -> u8 {
        if self.echo { ECE } else { 0 }
    }

    /// For a data segment about to go out: whether it is ECN-capable (new data inside the
    /// window), and the CWR flag when a reduction is to be announced.
    pub(crate) fn data(&self, new: bool) -> (bool, u8) {
        match (self.ok && new, self.cwr_due) {
            (false, _) => (false, 0),
            (true, due) => (true, if due { CWR } else { 0 }),
        }
    }

    /// A segment carrying CWR went out.
    pub(crate) fn cwr_sent(&mut self) {
        self.cwr_due = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ASK: EcnIn = EcnIn {
        ce: false,
        ece: true,
        cwr: true,
    };
    const AGREE: EcnIn = EcnIn {
        ce: false,
        ece: true,
        cwr: false,
    };
    const CE: EcnIn = EcnIn {
        ce: true,
        ece: false,
        cwr: false,
    };

    #[test]
    fn negotiation_needs_both_sides() {
        let mut listener = Ecn::default();
        listener.on_syn(ASK, EcnMode::Off);
        assert!(!listener.ok, "off declines");
        listener.on_syn(AGREE, EcnMode::Accept);
        assert!(!listener.ok, "a SYN without CWR is not a request");
        listener.on_syn(ASK, EcnMode::Accept);
        assert!(listener.ok);
        assert_eq!(listener.syn_ack_flags(), ECE);

        let mut opener = Ecn::default();
        assert_eq!(opener.syn_flags(EcnMode::Accept), 0, "accept does not ask");
        opener.on_syn_ack(AGREE);
        assert!(!opener.ok, "agreement to a question never asked");
        assert_eq!(opener.syn_flags(EcnMode::On), ECE | CWR);
        opener.on_syn_ack(ASK);
        assert!(!opener.ok, "a SYN-ACK with CWR is no agreement");
        opener.on_syn_ack(AGREE);
        assert!(opener.ok);
    }

    #[test]
    fn ce_starts_the_echo_and_cwr_ends_it() {
        let mut e = Ecn::default();
        e.on_syn(ASK, EcnMode::Accept);
        assert!(
            !e.on_segment(CE, false),
            "a mark on a pure ACK is not echoed"
        );
        assert!(e.on_segment(CE, true));
        assert_eq!(e.flags(), ECE);
        assert!(!e.on_segment(EcnIn::default(), true));
        assert_eq!(e.flags(), ECE, "echoed until CWR");
        e.on_segment(
            EcnIn {
                cwr: true,
                ..EcnIn::default()
            },
            false,
        );
        assert_eq!(e.flags(), 0);
        assert!(e.on_segment(
            EcnIn {
                ce: true,
                ece: false,
                cwr: true
            },
            true
        ));
        assert_eq!(e.flags(), ECE, "CWR first, then the new mark");
    }

    #[test]
    fn one_reduction_per_episode_announced_once() {
        let mut e = Ecn::default();
        let ece = EcnIn {
            ece: true,
            ..EcnIn::default()
        };
        assert!(!e.on_ack(ece, false), "not negotiated");
        e.on_syn(ASK, EcnMode::Accept);
        assert_eq!(e.data(true), (true, 0));
        assert!(e.on_ack(ece, false));
        assert!(!e.on_ack(ece, true), "within the episode");
        assert_eq!(
            e.data(false),
            (false, 0),
            "retransmissions are not ECN-capable"
        );
        assert_eq!(e.data(true), (true, CWR));
        e.cwr_sent();
        assert_eq!(e.data(true), (true, 0));
    }
}
