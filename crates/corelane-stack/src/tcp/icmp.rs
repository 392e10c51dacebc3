//! What ICMP tells a connection (RFC 1122 section 4.2.3.9, RFC 5927): path MTU discovery's
//! "fragmentation needed" / "packet too big" (RFC 1191, RFC 8201) shrinks the segment size and
//! resends what no longer fits; an unreachable port or protocol refuses a connection still
//! opening; a host or network unreachable is remembered and reported if the connection later
//! times out. Every message must quote a sequence number in flight, so a blind attacker cannot
//! forge one (RFC 5927 section 4.1).

use std::io;

use smoltcp::time::Instant;
use smoltcp::wire::IpAddress;

use super::conn::{Conn, Recovery, TcpState};
use super::due::Due;
use super::seq::Seq;

/// The smallest MTU an IPv4 message may set (Linux's `min_pmtu`; RFC 1191 allows 68, which
/// would make segments tiny on a forged message's word).
pub const MIN_PMTU_V4: u32 = 552;
/// IPv6's minimum link MTU (RFC 8200 section 5).
pub const MIN_PMTU_V6: u32 = 1280;

/// An ICMP error about a connection, as the stack decoded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcmpError {
    /// The packet was too big for a hop whose MTU is this (0: not told; RFC 1191's old
    /// routers).
    TooBig(u32),
    /// The port or protocol is unreachable at the peer (a hard error).
    Refused,
    /// No route to the host or its network, or communication prohibited (a soft error).
    Unreachable,
}

impl Conn {
    /// Acts on ICMP error `e` quoting a segment that began at `seq`. Returns true if it was
    /// taken (the quoted sequence number is in flight and the message meant something).
    pub(crate) fn on_icmp(&mut self, now: Instant, e: IcmpError, seq: Seq) -> bool {
        let opening = matches!(self.state, TcpState::SynSent | TcpState::SynReceived);
        let in_flight = if opening {
            seq == self.iss
        } else {
            seq.ge(self.snd_una) && seq.lt(self.snd_nxt)
        };
        if !in_flight || matches!(self.state, TcpState::Closed | TcpState::TimeWait) {
            return false;
        }
        let taken = match e {
            IcmpError::TooBig(mtu) => self.on_too_big(now, mtu),
            IcmpError::Refused if self.state == TcpState::SynSent => {
                self.set_closed(Some(io::ErrorKind::ConnectionRefused));
                true
            }
            IcmpError::Refused | IcmpError::Unreachable => {
                self.soft_error = Some(io::ErrorKind::HostUnreachable);
                true
            }
        };
        if taken {
            self.stats.rare().icmp_errors += 1;
        }
        taken
    }

    /// The next hop never answered ARP or neighbour solicitation: a connection still opening
    /// (SYN-SENT) fails with `HostUnreachable`. Returns whether it did.
    pub(crate) fn no_next_hop(&mut self) -> bool {
        if self.state != TcpState::SynSent {
            return false;
        }
        self.set_closed(Some(io::ErrorKind::HostUnreachable));
        true
    }

    /// The path's MTU is `mtu`: segments shrink to fit, and those in flight that did not fit
    /// are cut and sent again at once, without a congestion response (they were not dropped
    /// by congestion).
    fn on_too_big(&mut self, now: Instant, mtu: u32) -> bool {
        let (ip, floor) = match self.remote.addr {
            IpAddress::Ipv4(_) => (20, MIN_PMTU_V4),
            IpAddress::Ipv6(_) => (40, MIN_PMTU_V6),
        };
        // An old router that names no MTU: the next plateau below a full frame (RFC 1191
        // section 7), i.e. the floor.
        let mtu = if mtu == 0 { floor } else { mtu.max(floor) } as usize;
        let room = mtu
            .saturating_sub(ip + 20)
            .max(64 + self.fixed_options_len());
        let mss = room - self.fixed_options_len();
        if mss >= self.smss {
            return false;
        }
        self.seg_room = room;
        self.smss = mss;
        self.cc.set_mss(mss);
        self.stats.rare().pmtu_updates += 1;
        if self.board.shrink(mss) > 0 && self.recovery.is_none() {
            // A recovery episode that reduces nothing: it keeps RACK and the duplicate-ACK
            // count from calling the cut segments a congestion loss.
            self.recovery = Some(Recovery::without_prr(self.snd_nxt));
            self.rto_at = Due::from(Some(now + self.rtt.rto()));
        }
        true
    }

    /// The segment size in force (payload bytes per full segment).
    pub(crate) fn mss(&self) -> usize {
        self.smss
    }
}
