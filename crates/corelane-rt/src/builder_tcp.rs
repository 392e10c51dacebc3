//! The builder's TCP options beyond the stack configuration: ECN, the memory cap (by default
//! a share of the machine's memory), the connection cap and the XDP program's SYN cookies.

use crate::Builder;

impl Builder {
    /// Whether the XDP program may answer a flooded listener's SYNs with the stack's SYN
    /// cookies (see below). By default it does, except on veth in native mode: there the
    /// answer leaves through the peer's XDP receive path, which the kernel runs only when the
    /// peer has an XDP program or GRO on (`ethtool -K PEER gro on`); otherwise it would be
    /// dropped. `true` turns it on there too (for a peer set up so), `false` off everywhere.
    /// Not under a grant (the broker holds the program): the stack answers.
    ///
    /// While on for a port (from the first SYN its listener answered with a cookie, its SYN
    /// backlog full, until a second passes with fewer than 1000 SYNs answered), a flood over
    /// IPv4 or IPv6 costs the CPU it arrives on a few hundred nanoseconds per SYN and never
    /// reaches the AF_XDP ring, so real clients' SYNs are not lost with it. The program's count is
    /// [`XdpCounters::syn_cookies`](corelane_xsk::XdpCounters::syn_cookies).
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// let rt = corelane::Runtime::builder("veth0")
    ///     .addr("10.0.0.1/24")
    ///     .xdp_syn_cookies(true)
    ///     .build()?;
    /// # Ok::<(), corelane::Error>(())
    /// ```
    pub fn xdp_syn_cookies(mut self, on: bool) -> Self {
        self.xdp_cookies = Some(on);
        self
    }
}

impl Builder {
    /// Explicit Congestion Notification (RFC 3168) on TCP connections: by default accepted
    /// when a peer asks ([`EcnMode::Accept`](corelane_stack::EcnMode::Accept), as Linux);
    /// [`EcnMode::On`](corelane_stack::EcnMode::On) asks on connections this side opens too.
    /// A connection with ECN reduces its window when a router marks its segments instead of
    /// waiting for one to be dropped.
    ///
    /// ```no_run
    /// # mod corelane { pub use corelane_rt::*; pub use corelane_stack::EcnMode; }
    /// use corelane::{EcnMode, Runtime};
    /// let rt = Runtime::builder("veth0")
    ///     .addr("10.0.0.1/24")
    ///     .ecn(EcnMode::On)
    ///     .build()?;
    /// # Ok::<(), corelane::Error>(())
    /// ```
    pub fn ecn(mut self, mode: corelane_stack::EcnMode) -> Self {
        self.stack.tcp.ecn = mode;
        self
    }

    /// Caps what the TCP buffers of each core may hold, in bytes. By default a sixteenth of
    /// the machine's memory shared by the cores (at least 64 MiB each), as the kernel gives
    /// its TCP about a tenth. Past the cap a write takes only what fits in the buffer it has,
    /// and a writer with none waits until memory is given back; receive windows stop growing,
    /// and a received segment that would need more memory is dropped (the peer sends it
    /// again), so peers that send out of order or faster than the application reads cannot
    /// pass the cap. [`CoreStats`](crate::CoreStats)'s `stack.tcp_mem` counts the bytes held,
    /// `stack.tcp_mem_limited` the refusals and `stack.tcp_mem_dropped` the dropped segments.
    /// Idle connections hold no buffer.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// let rt = corelane::Runtime::builder("veth0")
    ///     .addr("10.0.0.1/24")
    ///     .tcp_memory_limit(512 << 20)
    ///     .build()?;
    /// # Ok::<(), corelane::Error>(())
    /// ```
    pub fn tcp_memory_limit(mut self, bytes: usize) -> Self {
        self.stack.tcp_mem_limit = Some(bytes);
        self.tcp_mem_auto = false;
        self
    }

    /// Most TCP connections each core holds at once (default 262,144), in any state. Past it
    /// a SYN is dropped and `connect` fails; `stack.tcp_conn_limited` counts both.
    pub fn max_connections(mut self, per_core: usize) -> Self {
        self.stack.max_tcp = per_core;
        self
    }

    /// The default memory cap for `cores` cores, unless one was given.
    pub(crate) fn tcp_mem_default(&mut self, cores: usize) {
        if self.tcp_mem_auto {
            self.stack.tcp_mem_limit = Some(machine_share(memory_total(), cores));
        }
    }
}

/// The machine's memory in bytes (`MemTotal`), or 4 GiB when it cannot be read.
fn memory_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            kib.checked_mul(1024)
        })
        .unwrap_or(4 << 30)
}

/// Each of `cores` cores' share of a sixteenth of `total` bytes, at least 64 MiB.
fn machine_share(total: u64, cores: usize) -> usize {
    let share = total / 16 / cores.max(1) as u64;
    usize::try_from(share).unwrap_or(usize::MAX).max(64 << 20)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_cap_is_a_sixteenth_of_memory_shared_by_the_cores_with_a_floor() {
        assert_eq!(super::machine_share(24 << 30, 2), 768 << 20);
        assert_eq!(super::machine_share(24 << 30, 1), 1536 << 20);
        assert_eq!(super::machine_share(1 << 30, 4), 64 << 20);
        assert!(super::memory_total() > 64 << 20);
    }
}
