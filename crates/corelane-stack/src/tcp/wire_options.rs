//! TCP options read as Linux reads them, for the segments the general parser refuses.

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{IpAddress, TcpPacket, TcpRepr};

/// The TCP header `tcp` begins with (at most 60 bytes), its options as Linux reads them
/// (`tcp_parse_options`): reading stops at an option whose length is below 2 or runs past the
/// header (the rest reads as end-of-list), and a known option of the wrong length is skipped
/// (read as no-operations). None when the header is not whole.
fn options_as_linux_reads_them(tcp: &[u8]) -> Option<([u8; 60], usize)> {
    let hl = usize::from(*tcp.get(12)? >> 4) * 4;
    if hl < 20 || tcp.len() < hl {
        return None;
    }
    let mut h = [0u8; 60];
    h[..hl].copy_from_slice(&tcp[..hl]);
    let mut i = 20;
    while i < hl {
        match h[i] {
            0 => break,
            1 => i += 1,
            kind => {
                let len = h.get(i + 1).map_or(0, |&l| usize::from(l));
                if i + 1 >= hl || len < 2 || i + len > hl {
                    // A silly or partial option: nothing from here on is read.
                    h[i..hl].fill(0);
                    break;
                }
                let fits = match kind {
                    2 => len == 4,
                    3 => len == 3,
                    4 => len == 2,
                    5 => len >= 10 && (len - 2) % 8 == 0,
                    _ => true,
                };
                if !fits {
                    h[i..i + len].fill(1);
                }
                i += len;
            }
        }
    }
    Some((h, hl))
}

/// A segment whose options the general parser refused, read again with its options as Linux
/// reads them; its payload is still the frame's own.
pub(super) fn reparse<'a>(tcp: &'a [u8], src: &IpAddress, dst: &IpAddress) -> Option<TcpRepr<'a>> {
    let (h, hl) = options_as_linux_reads_them(tcp)?;
    let pkt = TcpPacket::new_checked(&h[..hl]).ok()?;
    let r = TcpRepr::parse(&pkt, src, dst, &ChecksumCapabilities::ignored()).ok()?;
    Some(TcpRepr {
        src_port: r.src_port,
        dst_port: r.dst_port,
        control: r.control,
        seq_number: r.seq_number,
        ack_number: r.ack_number,
        window_len: r.window_len,
        window_scale: r.window_scale,
        max_seg_size: r.max_seg_size,
        sack_permitted: r.sack_permitted,
        sack_ranges: r.sack_ranges,
        timestamp: r.timestamp,
        payload: tcp.get(hl..)?,
    })
}
