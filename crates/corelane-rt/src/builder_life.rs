//! The builder's options about privileges and death: which capabilities the runtime keeps,
//! and how long the XDP program answers for it once it died.

use std::time::Duration;

use crate::Builder;

impl Builder {
    /// Keeps every capability the process has after `build` (default: dropped). By default
    /// the thread that builds the runtime keeps none under a grant, and only `CAP_NET_ADMIN`
    /// and `CAP_BPF` (to put the queues back and detach the program) when the runtime attached
    /// the program; the core and application threads, which parse the wire and run the
    /// application's tasks, keep none either way, and what needs a capability while they run
    /// (a port bound, an address taken) is done for them by one thread that parses nothing
    /// (`corelane-priv`). Threads the application started before `build` keep theirs.
    pub fn keep_capabilities(mut self, keep: bool) -> Self {
        self.keep_capabilities = keep;
        self
    }

    /// How long the XDP program answers for this runtime after the process dies, however it
    /// dies (SIGKILL included): a reset for every TCP segment to an owned address and port
    /// unreachable for every UDP datagram, so that a peer in the middle of a transfer learns
    /// at once, as from a host whose process died, instead of waiting for its timeout
    /// (default 60 s; zero: none). A small keeper process (`/bin/sleep`, shown as
    /// `corelane-linger`) holds the program for that long and changes nothing while the
    /// runtime lives; a clean exit ends it first, and the next runtime on the interface ends
    /// one a dead runtime left at once. Only when the runtime attached the program itself
    /// (under a grant, the broker answers for a server that died).
    pub fn linger_on_death(mut self, time: Duration) -> Self {
        self.death_linger = time;
        self
    }
}
