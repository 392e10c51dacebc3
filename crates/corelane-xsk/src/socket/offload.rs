//! Transmit checksum offload through AF_XDP TX metadata (Linux 6.11+ for the registration's
//! `XDP_UMEM_TX_METADATA_LEN`): a frame's `struct xsk_tx_metadata` lies in the bytes right
//! before its packet, in the frame's headroom, and the descriptor's `XDP_TX_METADATA` option
//! says it is there. In copy mode the kernel makes the frame a `CHECKSUM_PARTIAL` buffer from
//! it, which the NIC (or the kernel, where the NIC cannot) finishes; a veth hands it to the
//! receiving kernel unfinished, which trusts it, as it does the kernel's own offloaded frames.

use corelane_frame::Frame;

use super::{XskFrame, XskQueue};

/// Bytes of metadata before each transmitted packet: `struct xsk_tx_metadata` as Linux 6.15
/// has it (flags; the request's `csum_start`, `csum_offset`, 4 bytes of padding and
/// `launch_time`), a multiple of 8 as the registration needs. Earlier kernels read the first
/// 16 bytes of it, laid out the same.
pub(super) const META_LEN: usize = 24;

/// The metadata asking for the checksum from `start` (from the packet's first byte) stored at
/// `start + offset`: `flags`, then the request's `csum_start` and `csum_offset`, the rest zero.
fn checksum_request(start: u16, offset: u16) -> [u8; META_LEN] {
    let mut m = [0u8; META_LEN];
    m[..8].copy_from_slice(&u64::from(libc::XDP_TXMD_FLAGS_CHECKSUM).to_ne_bytes());
    m[8..10].copy_from_slice(&start.to_ne_bytes());
    m[10..12].copy_from_slice(&offset.to_ne_bytes());
    m
}

impl XskQueue {
    /// Asks the kernel to finish `frame`'s checksum (see [`corelane_frame::FrameIo::finish_checksum`]);
    /// false when it cannot: no TX metadata on this socket, a packet spanning frames, or a
    /// packet too close to its frame's start for the metadata.
    pub(super) fn request_checksum(
        &self,
        frame: &mut XskFrame,
        start: usize,
        offset: usize,
    ) -> bool {
        self.id.check(frame);
        let at = frame.desc.addr % self.frame_size as u64;
        if !self.tx_checksum
            || frame.chain.is_some()
            || at < META_LEN as u64
            || start + offset + 2 > frame.len()
        {
            return false;
        }
        let (Ok(start), Ok(offset)) = (u16::try_from(start), u16::try_from(offset)) else {
            return false;
        };
        // SAFETY: `frame` is a unique handle to a frame of this UMEM (checked above) that user
        // space holds, borrowed mutably; the metadata lies in the same frame, in the headroom
        // before its packet (`at` is at least META_LEN), which nothing else refers to.
        let meta = unsafe {
            self.umem
                .bytes_mut(frame.desc.addr - META_LEN as u64, META_LEN)
        };
        meta.copy_from_slice(&checksum_request(start, offset));
        frame.desc.options |= libc::XDP_TX_METADATA;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_laid_out_as_the_kernels_struct() {
        // libc's struct, the layout before launch_time: flags, then the request.
        assert_eq!(
            std::mem::offset_of!(libc::xsk_tx_metadata, xsk_tx_metadata_union),
            8
        );
        assert_eq!(
            std::mem::offset_of!(libc::xsk_tx_metadata_request, csum_offset),
            2
        );
        let m = checksum_request(34, 16);
        assert_eq!(m[..8], 2u64.to_ne_bytes(), "XDP_TXMD_FLAGS_CHECKSUM");
        assert_eq!(m[8..10], 34u16.to_ne_bytes());
        assert_eq!(m[10..12], 16u16.to_ne_bytes());
        assert!(m[12..].iter().all(|&b| b == 0), "no launch time");
        assert_eq!(META_LEN % 8, 0);
    }
}
