//! The builder's TCP options beyond the stack configuration: ECN and the memory cap.

use crate::Builder;

impl Builder {
    /// Explicit Congestion Notification (RFC 3168) on TCP connections: by default accepted
    /// when a peer asks ([`EcnMode::Accept`](corelane_stack::EcnMode::Accept), as Linux);
    /// [`EcnMode::On`](corelane_stack::EcnMode::On) asks on connections this side opens too.
    /// A connection with ECN reduces its window when a router marks its segments instead of
    /// waiting for one to be dropped.
    ///
    /// ```no_run
    /// use corelane_rt::Runtime;
    /// use corelane_stack::EcnMode;
    /// let rt = Runtime::builder("veth0")
    ///     .addr("10.0.0.1/24")
    ///     .ecn(EcnMode::On)
    ///     .build()?;
    /// # Ok::<(), corelane_rt::Error>(())
    /// ```
    pub fn ecn(mut self, mode: corelane_stack::EcnMode) -> Self {
        self.stack.tcp.ecn = mode;
        self
    }

    /// Caps what the TCP buffers of each core may hold, in bytes (default: no cap). Past the
    /// cap a write takes only what fits in the buffer it has, and a writer with none waits
    /// until memory is given back; receive windows stop growing (what a window already
    /// promised is still taken). [`CoreStats`](crate::CoreStats)'s `stack.tcp_mem` counts the
    /// bytes held and `stack.tcp_mem_limited` the refusals. Idle connections hold no buffer.
    ///
    /// ```no_run
    /// let rt = corelane_rt::Runtime::builder("veth0")
    ///     .addr("10.0.0.1/24")
    ///     .tcp_memory_limit(512 << 20)
    ///     .build()?;
    /// # Ok::<(), corelane_rt::Error>(())
    /// ```
    pub fn tcp_memory_limit(mut self, bytes: usize) -> Self {
        self.stack.tcp_mem_limit = Some(bytes);
        self
    }
}
