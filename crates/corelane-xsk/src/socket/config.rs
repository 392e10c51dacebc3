//! How a queue's socket is asked for (`XskConfig`, `ZeroCopy`) and how it ended up bound
//! (`BindMode`).

#[cfg(doc)]
use super::chain::MAX_PIECES;

/// Whether to ask for zero-copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZeroCopy {
    /// Copy mode only.
    Off,
    /// Try zero-copy, fall back to copy mode (and report it) when the driver refuses.
    #[default]
    Try,
    /// Zero-copy or an error.
    Require,
}

/// How an AF_XDP socket ended up bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindMode {
    /// The kernel copies frames between the driver and the UMEM.
    Copy,
    /// The driver DMAs straight into the UMEM.
    ZeroCopy,
}

impl std::fmt::Display for BindMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BindMode::Copy => "copy",
            BindMode::ZeroCopy => "zero-copy",
        })
    }
}

/// Sizes of a queue's UMEM and rings.
#[derive(Debug, Clone, Copy)]
pub struct XskConfig {
    /// Frames in the UMEM (default 4096).
    pub frames: u32,
    /// Bytes per frame: 2048 or 4096; 0 (the default) lets the runtime choose from the
    /// interface's MTU (2048 bytes up to an MTU of 1778, 4096 above), and means 2048 for a
    /// queue opened directly.
    pub frame_size: u32,
    /// Entries in each of the four rings, a power of two (default 2048).
    pub ring_size: u32,
    /// Zero-copy preference.
    pub zero_copy: ZeroCopy,
    /// The largest packet (Ethernet header included) the socket must carry. Above what one frame
    /// holds (the frame size less 256 bytes of headroom) the socket is bound for multi-buffer
    /// (`XDP_USE_SG`, Linux 6.6+): a jumbo frame comes and goes as a chain of UMEM frames, at
    /// most [`MAX_PIECES`]. 0 (the default): one frame.
    pub max_packet: u32,
    /// TCP segments leave their checksum to the kernel and the NIC (AF_XDP TX metadata,
    /// Linux 6.11+): in copy mode, or in zero-copy where the driver says it takes checksum
    /// requests (the `netdev` netlink family's `xsk-features`); elsewhere, or on an older
    /// kernel, they are summed here as without it. Off by default: over a veth the checksum reaches the other end unfinished,
    /// as the kernel's own offloaded frames do, which that end's kernel trusts but an XDP
    /// program there (another corelane, say) sees as wrong.
    pub tx_checksum_offload: bool,
}

impl XskConfig {
    /// The frame size in force: `frame_size`, or 2048 for 0.
    pub fn frame_bytes(&self) -> u32 {
        if self.frame_size == 0 {
            2048
        } else {
            self.frame_size
        }
    }

    /// Bytes of packet one frame holds: the frame less the kernel's 256 bytes of headroom.
    pub fn frame_capacity(&self) -> u32 {
        self.frame_bytes().saturating_sub(256)
    }

    /// Checks sizes another process sent (an upgrade's hand-over): frames 64 to 1 Mi, frames of
    /// 2048 or 4096 bytes, a ring a power of two from 16 to the frame count, a largest packet
    /// of at most 64 KiB. Anything else would divide by zero, underflow or map past the end.
    ///
    /// # Errors
    /// A message naming the size out of range.
    pub fn check_received(&self) -> Result<(), String> {
        if !(64..=1 << 20).contains(&self.frames) {
            return Err(format!("{} frames (64 to 1048576)", self.frames));
        }
        if !matches!(self.frame_size, 2048 | 4096) {
            return Err(format!(
                "frames of {} bytes (2048 or 4096)",
                self.frame_size
            ));
        }
        if !self.ring_size.is_power_of_two() || !(16..=self.frames).contains(&self.ring_size) {
            return Err(format!(
                "rings of {} entries (a power of two from 16 to the frame count)",
                self.ring_size
            ));
        }
        if self.max_packet > 65_536 {
            return Err(format!("a largest packet of {} bytes", self.max_packet));
        }
        Ok(())
    }

    /// Whether packets span frames (`max_packet` above one frame's capacity).
    pub fn multi_buffer(&self) -> bool {
        self.max_packet > self.frame_capacity()
    }
}

impl Default for XskConfig {
    fn default() -> Self {
        XskConfig {
            frames: 4096,
            frame_size: 0,
            ring_size: 2048,
            zero_copy: ZeroCopy::Try,
            max_packet: 0,
            tx_checksum_offload: false,
        }
    }
}
