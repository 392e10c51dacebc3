//! The counters of an [`XdpDevice`](crate::XdpDevice).

/// Counters of an [`XdpDevice`](crate::XdpDevice).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Frames taken from the RX ring.
    pub rx_frames: u64,
    /// Frames handed to the protocol stage.
    pub rx_delivered: u64,
    /// Frames dropped for a bad checksum.
    pub rx_bad_checksum: u64,
    /// Frames dropped for truncated or inconsistent headers.
    pub rx_malformed: u64,
    /// Frames copied in from another core (see [`XdpDevice::inject`](crate::XdpDevice::inject)).
    pub rx_injected: u64,
    /// Frames from another core dropped because no frame was free to copy them into.
    pub rx_inject_dropped: u64,
    /// Frames written and queued for transmit.
    pub tx_frames: u64,
    /// Frames the protocol stage wanted to send but no transmit frame was free.
    pub tx_no_frame: u64,
    /// Transmit batches (one kick each).
    pub tx_batches: u64,
    /// Frames whose TCP checksum the device finished (checksum offload).
    pub tx_checksum_offloaded: u64,
    /// Frames the stack built longer than the link's MTU allows, dropped instead of sent. A
    /// bug counter: it stays 0 (a strict device, as in every test, panics instead).
    pub tx_oversize: u64,
    /// Frames received longer than the link's MTU allows (processed all the same; a peer or
    /// a link configured with a larger MTU than this side's).
    pub rx_oversize: u64,
    /// Frames the kernel dropped before this side saw them, for want of room in the receive
    /// ring or of a free frame in the fill ring (AF_XDP's `rx_dropped + rx_ring_full`), as
    /// last read (every few thousand turns, and at the end of a run).
    pub rx_ring_drops: u64,
    /// Frames sent to this device's own hardware address (a connection or datagram to an
    /// owned address): taken back as received instead of sent, as a kernel's loopback does.
    pub looped: u64,
}

impl std::ops::AddAssign for DeviceStats {
    /// Adds another device's counters (for totals over several cores).
    fn add_assign(&mut self, o: DeviceStats) {
        self.rx_frames += o.rx_frames;
        self.rx_delivered += o.rx_delivered;
        self.rx_bad_checksum += o.rx_bad_checksum;
        self.rx_malformed += o.rx_malformed;
        self.rx_injected += o.rx_injected;
        self.rx_inject_dropped += o.rx_inject_dropped;
        self.tx_frames += o.tx_frames;
        self.tx_no_frame += o.tx_no_frame;
        self.tx_batches += o.tx_batches;
        self.tx_checksum_offloaded += o.tx_checksum_offloaded;
        self.tx_oversize += o.tx_oversize;
        self.rx_oversize += o.rx_oversize;
        self.rx_ring_drops += o.rx_ring_drops;
        self.looped += o.looped;
    }
}
