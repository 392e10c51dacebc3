//! What the steering program reports, whoever attached it (this process or a grant broker):
//! the mode it runs in and its counters.

/// The mode the program ended up attached in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachedMode {
    /// Run by the driver.
    Native,
    /// Run by the kernel's generic receive path.
    Generic,
}

impl std::fmt::Display for AttachedMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AttachedMode::Native => "native",
            AttachedMode::Generic => "generic",
        })
    }
}

/// The program's counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XdpCounters {
    /// Frames redirected to an AF_XDP socket.
    pub steered: u64,
    /// Frames given to the kernel because they are not ours.
    pub passed: u64,
    /// Frames with truncated headers (given to the kernel).
    pub malformed: u64,
    /// Frames that were ours but arrived on a queue with no socket (given to the kernel).
    pub no_socket: u64,
    /// SYNs the program answered with a SYN cookie ([`Steering::set_syn_cookies`](crate::Steering::set_syn_cookies)).
    pub syn_cookies: u64,
    /// TCP segments to an owned address and a port nothing here serves, answered with a reset
    /// (as the host that owns the address owes them): handed by the program to the queue's
    /// stack to answer while the queue has a socket, answered by the program itself when it
    /// has none. 0 when the counters come through a grant broker, which reports the first four.
    pub closed_port_resets: u64,
    /// UDP datagrams to an owned address and a port nothing here serves, answered with ICMP
    /// port unreachable (by the stack or the program, as the resets). 0 through a grant broker.
    pub port_unreachables: u64,
    /// Such datagrams dropped unanswered because the answers' rate limit (a burst of 50, then
    /// one per millisecond, per CPU) was spent. 0 through a grant broker.
    pub unreachables_limited: u64,
    /// Segments to closed ports dropped unanswered because the resets' own rate limit (a
    /// burst of 50, then one per millisecond, per CPU) was spent. 0 through a grant broker.
    pub resets_limited: u64,
}
