//! The counters a stack keeps.

use crate::frag::FragStats;
use crate::tcp::TcpStats;
use crate::udp::UdpStats;

/// Counters of a [`Stack`](crate::Stack).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StackStats {
    /// Frames given to a flow found in the table (or a bound UDP port).
    pub demux_hits: u64,
    /// SYNs that opened a new flow on a listener.
    pub syn_accepted: u64,
    /// SYNs dropped because the listener's backlog was full.
    pub syn_dropped: u64,
    /// Frames for no known flow: answered with a reset or ICMP port unreachable, or dropped.
    pub no_flow: u64,
    /// Frames handed to another core.
    pub handed_off: u64,
    /// Frames that should have gone to another core but the channel was full.
    pub handoff_dropped: u64,
    /// Connections moved to an accept queue.
    pub established: u64,
    /// Accept waiters woken.
    pub accept_wakeups: u64,
    /// Flows polled for egress.
    pub egress_polls: u64,
    /// Flow timers that fired.
    pub timers_fired: u64,
    /// Flows open now.
    pub flows: u64,
    /// Next hops whose hardware address the neighbour table holds now.
    pub neighbors: u64,
    /// TCP frames for a listener refused because its accept queue was full.
    pub accept_queue_full: u64,
    /// TCP segments that did not parse (what the classify stage passed but the TCP parser
    /// refused: a SYN with FIN, a zero port, a bad option).
    pub tcp_malformed: u64,
    /// ICMP and ICMPv6 echo requests answered.
    pub icmp_echoes: u64,
    /// ICMP errors about TCP segments that no connection took (unknown, or quoting a sequence
    /// number not in flight, or an MTU no smaller than the one in use).
    pub icmp_ignored: u64,
    /// ICMP "port unreachable" sent for datagrams to closed UDP ports.
    pub icmp_unreachable_sent: u64,
    /// ICMP errors not sent because of the rate limit.
    pub icmp_limited: u64,
    /// ARP requests and neighbour solicitations for owned addresses answered.
    pub neighbor_answers: u64,
    /// Connections still open when the stack shut down with data unread or unacknowledged,
    /// and therefore reset.
    pub reset_at_stop: u64,
    /// Connections with nothing unread and everything acknowledged when the stack shut down:
    /// ended with a FIN, as a process's exit ends a kernel socket.
    pub fin_at_stop: u64,
    /// Reassembled datagrams dropped because no socket or connection here takes them.
    pub reassembled_unclaimed: u64,
    /// Transmissions held back because the next hop's hardware address is not known yet.
    pub neighbor_waits: u64,
    /// TCP counters, summed over every connection this stack has had.
    pub tcp: TcpStats,
    /// UDP counters, summed over every socket this stack has had.
    pub udp: UdpStats,
    /// Bytes the TCP buffers hold now.
    pub tcp_mem: u64,
    /// Times a TCP buffer was refused room by `StackConfig::tcp_mem_limit`.
    pub tcp_mem_limited: u64,
    /// TCP segments received and dropped because holding them would have passed
    /// `StackConfig::tcp_mem_limit` (their senders retransmit them).
    pub tcp_mem_dropped: u64,
    /// Connections whose out-of-order data was dropped because a received segment was refused
    /// room under `StackConfig::tcp_mem_limit` (they hold none after; their senders resend).
    pub tcp_ooo_pruned: u64,
    /// Connections refused (a SYN or a cookie's ACK dropped, a `connect` failed) because the
    /// core held `StackConfig::max_tcp` of them.
    pub tcp_conn_limited: u64,
    /// Fragment reassembly and fragmenting.
    pub frag: FragStats,
}
