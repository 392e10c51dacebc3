//! IP fragments: reassembly of IPv4 and IPv6 datagrams (RFC 791, RFC 8200 section 4.5) with
//! bounded memory, and the fragmenting of datagrams larger than the link's MTU.
//!
//! Reassembly charges each datagram in progress for what it really holds (the bytes of its
//! fragments and a fixed cost per fragment and per datagram, never the offset a fragment
//! claims), keeps at most [`FragLimits::max_datagrams`] datagrams and
//! [`FragLimits::max_bytes`] bytes, and takes at most [`FragLimits::max_pieces`] fragments per
//! datagram. Past a limit the datagram that received a fragment least recently is dropped: a
//! datagram whose fragments are arriving is the most recently used, so a flood of fragments
//! that never complete (high offsets, 8-byte pieces, spoofed sources) evicts its own kind,
//! not a datagram in progress. A datagram not complete within [`FragLimits::timeout`] of its
//! first fragment is dropped. Overlapping fragments drop their datagram (RFC 5722). The work
//! per fragment is bounded by `max_pieces`, whatever the table holds. Every drop is counted
//! by cause.
//!
//! ```
//! use corelane_stack::frag::{fragment, FragLimits, Reassembler};
//! use smoltcp::time::Instant;
//! // A 3000-byte UDP payload from 10.0.0.2 to 10.0.0.1, cut for a 1500-byte MTU...
//! let mut udp = vec![0u8; 8 + 3000];
//! udp[4..6].copy_from_slice(&(3008u16).to_be_bytes());
//! let frames = fragment(
//!     [2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2],
//!     "10.0.0.2".parse::<std::net::IpAddr>()?.into(),
//!     "10.0.0.1".parse::<std::net::IpAddr>()?.into(),
//!     17, 7, &udp, 1500,
//! );
//! assert_eq!(frames.len(), 3);
//! // ...and put back together.
//! let mut r = Reassembler::new(FragLimits::default());
//! let mut whole = None;
//! for f in &frames {
//!     whole = r.push(f, Instant::ZERO);
//! }
//! let whole = whole.ok_or("reassembled")?;
//! assert_eq!(whole.len(), 14 + 20 + 8 + 3000);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use smoltcp::wire::IpAddress;

use crate::tcp::wire::inet_checksum;

/// How much reassembly may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragLimits {
    /// Bytes of datagrams in progress, at most.
    pub max_bytes: usize,
    /// Datagrams in progress, at most.
    pub max_datagrams: usize,
    /// Fragments per datagram, at most (a 65,535-byte datagram cut for a 576-byte link takes
    /// 120); a datagram sent in more pieces is dropped.
    pub max_pieces: usize,
    /// A datagram not complete this long after its first fragment is dropped.
    pub timeout: std::time::Duration,
}

impl Default for FragLimits {
    fn default() -> Self {
        FragLimits {
            max_bytes: 4 << 20,
            max_datagrams: 1024,
            max_pieces: 128,
            timeout: std::time::Duration::from_secs(30),
        }
    }
}

/// Counters of reassembly, one per outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FragStats {
    /// Fragments received.
    pub fragments: u64,
    /// Datagrams put back together.
    pub reassembled: u64,
    /// Datagrams dropped because they were not complete in time.
    pub timeouts: u64,
    /// Datagrams dropped to keep within the byte or datagram limit (the least recently
    /// used first).
    pub evicted: u64,
    /// Datagrams dropped for coming in more than `FragLimits::max_pieces` fragments.
    pub too_many_pieces: u64,
    /// Datagrams dropped because fragments overlapped or disagreed on the end.
    pub overlaps: u64,
    /// Fragments dropped as malformed (a bad length, past 65535 bytes, a bad header).
    pub malformed: u64,
    /// Datagrams sent as fragments.
    pub fragmented: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    src: IpAddress,
    dst: IpAddress,
    proto: u8,
    id: u32,
}

/// One fragment, parsed.
struct Piece<'a> {
    key: Key,
    /// The Ethernet header and the IP header, without the fragment header (IPv6).
    head: &'a [u8],
    offset: usize,
    more: bool,
    data: &'a [u8],
    v6: bool,
}

mod reassemble;
pub use reassemble::Reassembler;

fn parse(frame: &[u8]) -> Option<Piece<'_>> {
    let ip = frame.get(14..)?;
    match frame.get(12..14)? {
        [0x08, 0x00] => {
            let ihl = usize::from(ip.first()? & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
            if ip[0] >> 4 != 4 || ihl < 20 || total < ihl || total > ip.len() {
                return None;
            }
            if inet_checksum(ip.get(..ihl)?) != 0 {
                return None;
            }
            let flags = u16::from_be_bytes([ip[6], ip[7]]);
            let key = Key {
                src: IpAddress::Ipv4(<[u8; 4]>::try_from(&ip[12..16]).ok()?.into()),
                dst: IpAddress::Ipv4(<[u8; 4]>::try_from(&ip[16..20]).ok()?.into()),
                proto: ip[9],
                id: u32::from(u16::from_be_bytes([ip[4], ip[5]])),
            };
            Some(Piece {
                key,
                head: frame.get(..14 + ihl)?,
                offset: usize::from(flags & 0x1fff) * 8,
                more: flags & 0x2000 != 0,
                data: ip.get(ihl..total)?,
                v6: false,
            })
        }
        [0x86, 0xdd] => {
            let plen = usize::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]));
            if ip[0] >> 4 != 6 || *ip.get(6)? != 44 || 40 + plen > ip.len() || plen < 8 {
                return None;
            }
            let fh = ip.get(40..48)?;
            let off = u16::from_be_bytes([fh[2], fh[3]]);
            let key = Key {
                src: IpAddress::Ipv6(<[u8; 16]>::try_from(&ip[8..24]).ok()?.into()),
                dst: IpAddress::Ipv6(<[u8; 16]>::try_from(&ip[24..40]).ok()?.into()),
                proto: fh[0],
                id: u32::from_be_bytes([fh[4], fh[5], fh[6], fh[7]]),
            };
            Some(Piece {
                key,
                head: frame.get(..14 + 40)?,
                offset: usize::from(off >> 3) * 8,
                more: off & 1 != 0,
                data: ip.get(48..40 + plen)?,
                v6: true,
            })
        }
        _ => None,
    }
}

/// The frames that carry upper-layer `payload` (protocol `proto`, its checksum already in
/// place) from `src` to `dst` over a link of `mtu` bytes (the IP packet's limit): one frame
/// when it fits, else IPv4 fragments (`id` as the identification) or IPv6 fragments (`id` in
/// a fragment header), each piece a multiple of 8 bytes but the last.
#[allow(clippy::too_many_arguments)]
pub fn fragment(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: IpAddress,
    dst: IpAddress,
    proto: u8,
    id: u32,
    payload: &[u8],
    mtu: usize,
) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let v6 = matches!(src, IpAddress::Ipv6(_));
    let ip_len = if v6 { 40 } else { 20 };
    let whole = payload.len() + ip_len <= mtu;
    let room = if whole {
        payload.len()
    } else {
        // Fragment payloads are multiples of 8 (the IPv6 fragment header takes 8 more).
        mtu.saturating_sub(ip_len + if v6 { 8 } else { 0 }) & !7
    };
    let room = room.max(8);
    let mut offset = 0;
    loop {
        let chunk = &payload[offset..(offset + room).min(payload.len())];
        let more = offset + chunk.len() < payload.len();
        let extra = if v6 && !whole { 8 } else { 0 };
        let mut f = vec![0u8; 14 + ip_len + extra];
        f[..6].copy_from_slice(&dst_mac);
        f[6..12].copy_from_slice(&src_mac);
        let frag = (!whole).then_some(Frag { offset, more, id });
        if write_ip_header(&mut f, src, dst, proto, chunk.len(), id as u16, frag).is_none() {
            return Vec::new();
        }
        f.extend_from_slice(chunk);
        frames.push(f);
        offset += chunk.len();
        if !more {
            break;
        }
    }
    frames
}

/// A whole frame (Ethernet, an IP header without options or extension headers, the payload)
/// cut into fragments for a link of `mtu` bytes, `id` the datagram's identification. Empty
/// when the frame is not such a frame.
pub(crate) fn refragment(frame: &[u8], mtu: usize, id: u32) -> Vec<Vec<u8>> {
    let parts = || -> Option<_> {
        let dst_mac: [u8; 6] = frame.get(..6)?.try_into().ok()?;
        let src_mac: [u8; 6] = frame.get(6..12)?.try_into().ok()?;
        let ip = frame.get(14..)?;
        match frame.get(12..14)? {
            [0x08, 0x00] => {
                let ihl = usize::from(ip.first()? & 0x0f) * 4;
                let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
                let src = IpAddress::Ipv4(<[u8; 4]>::try_from(ip.get(12..16)?).ok()?.into());
                let dst = IpAddress::Ipv4(<[u8; 4]>::try_from(ip.get(16..20)?).ok()?.into());
                Some((dst_mac, src_mac, src, dst, *ip.get(9)?, ip.get(ihl..total)?))
            }
            [0x86, 0xdd] => {
                let plen = usize::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]));
                let src = IpAddress::Ipv6(<[u8; 16]>::try_from(ip.get(8..24)?).ok()?.into());
                let dst = IpAddress::Ipv6(<[u8; 16]>::try_from(ip.get(24..40)?).ok()?.into());
                Some((
                    dst_mac,
                    src_mac,
                    src,
                    dst,
                    *ip.get(6)?,
                    ip.get(40..40 + plen)?,
                ))
            }
            _ => None,
        }
    };
    match parts() {
        Some((dm, sm, src, dst, proto, payload)) => {
            fragment(dm, sm, src, dst, proto, id, payload, mtu)
        }
        None => Vec::new(),
    }
}

/// Sets byte `at` of the IPv4 header in Ethernet frame `buf` and makes the header checksum
/// right again; nothing for a frame too short for its header.
fn set_v4_byte(buf: &mut [u8], at: usize, v: u8) {
    let ihl = usize::from(buf.get(14).map_or(0, |b| b & 0x0f)) * 4;
    if buf.len() < 34 || ihl < 20 || buf.len() < 14 + ihl {
        return;
    }
    buf[at] = v;
    buf[24..26].copy_from_slice(&[0, 0]);
    let c = inet_checksum(&buf[14..14 + ihl]);
    buf[24..26].copy_from_slice(&c.to_ne_bytes());
}

/// Sets the type of service (IPv4, the header checksum made right again) or traffic class
/// (IPv6) of the IP packet in Ethernet frame `buf`; nothing for anything else or for 0.
pub(crate) fn set_tos(buf: &mut [u8], tos: u8) {
    if tos == 0 {
        return;
    }
    match buf.get(12..14) {
        Some([0x08, 0x00]) => set_v4_byte(buf, 15, tos),
        Some([0x86, 0xdd]) if buf.len() >= 54 => {
            // Version (4 bits), traffic class (8), flow label (20).
            buf[14] = 0x60 | tos >> 4;
            buf[15] = (tos << 4) | (buf[15] & 0x0f);
        }
        _ => {}
    }
}

/// Sets the TTL (IPv4, the header checksum made right again) or hop limit (IPv6) of the IP
/// packet in Ethernet frame `buf`; nothing for anything else or a default TTL.
pub(crate) fn set_ttl(buf: &mut [u8], ttl: u8) {
    if ttl == 64 {
        return;
    }
    match buf.get(12..14) {
        Some([0x08, 0x00]) => set_v4_byte(buf, 22, ttl),
        Some([0x86, 0xdd]) if buf.len() >= 54 => buf[21] = ttl,
        _ => {}
    }
}

/// Where a fragment sits in its datagram.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frag {
    /// Its payload's offset, a multiple of 8.
    pub(crate) offset: usize,
    /// More fragments follow.
    pub(crate) more: bool,
    /// The datagram's identification.
    pub(crate) id: u32,
}

/// Writes the Ethernet type and the IP header (and the IPv6 fragment header, for a fragment)
/// of a packet of `payload_len` upper-layer bytes into `buf` from byte 12 on; the hardware
/// addresses are the caller's. IPv4 packets that are not fragments carry DF. Returns the
/// length of the headers written after the Ethernet header, None for mixed families or a
/// short buffer.
pub(crate) fn write_ip_header(
    buf: &mut [u8],
    src: IpAddress,
    dst: IpAddress,
    proto: u8,
    payload_len: usize,
    ip_id: u16,
    frag: Option<Frag>,
) -> Option<usize> {
    match (src, dst) {
        (IpAddress::Ipv4(s), IpAddress::Ipv4(d)) => {
            buf.get_mut(12..14)?.copy_from_slice(&[0x08, 0x00]);
            let h = buf.get_mut(14..34)?;
            h.fill(0);
            h[0] = 0x45;
            h[2..4].copy_from_slice(&((20 + payload_len) as u16).to_be_bytes());
            h[4..6].copy_from_slice(&ip_id.to_be_bytes());
            let flags = match frag {
                None => 0x4000,
                Some(f) => ((f.offset / 8) as u16) | if f.more { 0x2000 } else { 0 },
            };
            h[6..8].copy_from_slice(&flags.to_be_bytes());
            h[8] = 64;
            h[9] = proto;
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
            let c = inet_checksum(h);
            h[10..12].copy_from_slice(&c.to_ne_bytes());
            Some(20)
        }
        (IpAddress::Ipv6(s), IpAddress::Ipv6(d)) => {
            buf.get_mut(12..14)?.copy_from_slice(&[0x86, 0xdd]);
            let extra = if frag.is_some() { 8 } else { 0 };
            let h = buf.get_mut(14..54 + extra)?;
            h.fill(0);
            h[0] = 0x60;
            h[4..6].copy_from_slice(&((payload_len + extra) as u16).to_be_bytes());
            h[6] = if frag.is_some() { 44 } else { proto };
            h[7] = 64;
            h[8..24].copy_from_slice(&s.octets());
            h[24..40].copy_from_slice(&d.octets());
            if let Some(f) = frag {
                let off = ((f.offset / 8) as u16) << 3 | u16::from(f.more);
                h[40] = proto;
                h[42..44].copy_from_slice(&off.to_be_bytes());
                h[44..48].copy_from_slice(&f.id.to_be_bytes());
            }
            Some(40 + extra)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
