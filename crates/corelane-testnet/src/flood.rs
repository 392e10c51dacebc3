//! A flood from spoofed sources, written as raw Ethernet frames on an interface as fast as it
//! takes them, bounded in count and in time: TCP SYNs over IPv4 ([`SynFlood::builder`]) or
//! IPv6 ([`SynFlood::builder_v6`]), or (with [`SynFloodBuilder::fragments`]) IPv4 fragments of
//! datagrams that never complete.
//!
//! ```no_run
//! use std::time::Duration;
//! use corelane_testnet::{SynFlood, VethPair};
//! let net = VethPair::builder().server_addr("10.77.0.1/24").client_addr("10.77.0.2/24").build()?;
//! let mac = net.server_ns().mac(net.server_if())?;
//! let flood = SynFlood::builder(std::net::SocketAddrV4::new([10, 77, 0, 1].into(), 7), mac)
//!     .sources([10, 200, 0, 0].into(), 16)
//!     .limit(1_000_000, Duration::from_secs(2))
//!     .start(net.client_ns(), net.client_if())?;
//! let sent = flood.join()?;
//! # let _ = sent;
//! # Ok::<(), corelane_testnet::Error>(())
//! ```

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::craft::{Ip4, checksum, ipv4_header, sum16};
use crate::packet::PacketSocket;
use crate::{Error, Netns, NsThread, Result};

/// How to flood: the target, the spoofed sources and the bounds.
#[derive(Debug, Clone)]
pub struct SynFloodBuilder {
    target: SocketAddrV4,
    /// Aimed at this IPv6 address and port instead, from random addresses of `NET6`.
    target6: Option<SocketAddrV6>,
    target_mac: [u8; 6],
    net: Ipv4Addr,
    prefix: u8,
    packets: u64,
    duration: Duration,
    seed: u64,
    /// Send fragments of this many bytes instead of SYNs.
    fragments: Option<usize>,
}

impl SynFloodBuilder {
    /// Source addresses drawn at random from `net`/`prefix` (default 10.200.0.0/16).
    pub fn sources(mut self, net: Ipv4Addr, prefix: u8) -> Self {
        self.net = net;
        self.prefix = prefix.min(32);
        self
    }

    /// Stops after `packets` SYNs or after `duration`, whichever comes first (default 100 000
    /// and 1 s).
    pub fn limit(mut self, packets: u64, duration: Duration) -> Self {
        self.packets = packets;
        self.duration = duration;
        self
    }

    /// Seeds the source addresses, ports and sequence numbers (default 1).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed.max(1);
        self
    }

    /// Sends IPv4 fragments instead of SYNs (a flood aimed at an IPv4 target only): each a middle piece (offset past zero, more
    /// fragments set) of `size` bytes (rounded to a multiple of 8, 8..=1472) of a UDP datagram
    /// with a fresh identification, so none ever completes and a receiver must hold or drop
    /// each one.
    pub fn fragments(mut self, size: usize) -> Self {
        self.fragments = Some(size.clamp(8, 1472) & !7);
        self
    }

    /// Starts the flood from `ifname` in `ns`.
    pub fn start(self, ns: &Netns, ifname: &str) -> Result<SynFlood> {
        let src_mac = ns.mac(ifname)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let ifname = ifname.to_string();
        let thread = ns.spawn(move || -> std::io::Result<FloodReport> {
            let sock = PacketSocket::open(&ifname, false)?;
            Ok(self.run(&sock, src_mac, &s))
        })?;
        Ok(SynFlood {
            stop,
            thread: Some(thread),
        })
    }

    fn run(&self, sock: &PacketSocket, src_mac: [u8; 6], stop: &AtomicBool) -> FloodReport {
        let mut rng = self.seed;
        let mut frame = vec![0u8; 78.max(34 + self.fragments.unwrap_or(0))];
        let host_bits = 32 - u32::from(self.prefix);
        let mask = if host_bits == 32 {
            u32::MAX
        } else {
            (1u32 << host_bits) - 1
        };
        let net = u32::from(self.net) & !mask;
        let start = Instant::now();
        let mut report = FloodReport::default();
        while report.sent < self.packets && !stop.load(Ordering::Relaxed) {
            // The clock is read once per 256 frames.
            if report.sent % 256 == 0 && start.elapsed() >= self.duration {
                break;
            }
            let r = xorshift(&mut rng);
            let src = Ipv4Addr::from(net | ((r as u32) & mask).max(1));
            let port = ((r >> 32) as u16).max(1024);
            let frame = match (self.target6, self.fragments) {
                (Some(dst), _) => {
                    let f = &mut frame[..78];
                    let src = Ipv6Addr::from(u128::from(NET6) | u128::from(r as u32).max(1));
                    syn_frame6(
                        f,
                        src_mac,
                        self.target_mac,
                        src,
                        port,
                        dst,
                        (r >> 16) as u32,
                    );
                    &*f
                }
                (None, Some(size)) => {
                    let f = &mut frame[..34 + size];
                    frag_frame(f, src_mac, self.target_mac, src, *self.target.ip(), r);
                    &*f
                }
                (None, None) => {
                    let f = &mut frame[..58];
                    syn_frame(
                        f,
                        src_mac,
                        self.target_mac,
                        src,
                        port,
                        self.target,
                        (r >> 16) as u32,
                    );
                    &*f
                }
            };
            match sock.send(frame) {
                Ok(true) => report.sent += 1,
                Ok(false) => {
                    report.refused += 1;
                    std::thread::yield_now();
                }
                Err(_) => {
                    report.refused += 1;
                    break;
                }
            }
        }
        report.elapsed = start.elapsed();
        report
    }
}

/// What a flood sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FloodReport {
    /// SYNs written.
    pub sent: u64,
    /// Writes the device refused (its queue full).
    pub refused: u64,
    /// How long the flood ran.
    pub elapsed: Duration,
}

impl FloodReport {
    /// SYNs per second.
    pub fn rate(&self) -> f64 {
        self.sent as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// A running flood; [`SynFlood::join`] waits for its bound, dropping it stops it.
#[derive(Debug)]
pub struct SynFlood {
    stop: Arc<AtomicBool>,
    thread: Option<NsThread<std::io::Result<FloodReport>>>,
}

impl SynFlood {
    /// Starts a builder aimed at `target` (an IPv4 address and port) behind `target_mac`.
    pub fn builder(target: SocketAddrV4, target_mac: [u8; 6]) -> SynFloodBuilder {
        SynFloodBuilder {
            target,
            target6: None,
            target_mac,
            net: Ipv4Addr::new(10, 200, 0, 0),
            prefix: 16,
            packets: 100_000,
            duration: Duration::from_secs(1),
            seed: 1,
            fragments: None,
        }
    }

    /// Starts a builder aimed at `target` (an IPv6 address and port) behind `target_mac`, its
    /// SYNs from random addresses of fd00:c8::/96 (`sources` does not apply).
    pub fn builder_v6(target: SocketAddrV6, target_mac: [u8; 6]) -> SynFloodBuilder {
        SynFloodBuilder {
            target6: Some(target),
            ..Self::builder(
                SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, target.port()),
                target_mac,
            )
        }
    }

    /// Waits until the flood reaches its bound.
    pub fn join(mut self) -> Result<FloodReport> {
        self.finish()
    }

    /// Stops the flood now.
    pub fn stop(mut self) -> Result<FloodReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.finish()
    }

    fn finish(&mut self) -> Result<FloodReport> {
        let Some(t) = self.thread.take() else {
            return Ok(FloodReport::default());
        };
        t.join()?.map_err(|source| Error::Io {
            what: "sending the SYN flood".into(),
            source,
        })
    }
}

impl Drop for SynFlood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.finish();
    }
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Writes an Ethernet + IPv4 frame (the whole of `f`) that is a middle fragment of a UDP
/// datagram: identification and offset from `r`, more fragments set.
fn frag_frame(
    f: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    r: u64,
) {
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let offset = ((r >> 20) as u16 % 7000).max(1);
    let ip = Ip4 {
        id: (r >> 40) as u16,
        ..Ip4::new(src, dst)
    };
    let header = ipv4_header(&ip, 17, f.len() - 34, 0x2000 | offset);
    f[14..34].copy_from_slice(&header);
}

/// Writes a 58-byte Ethernet + IPv4 + TCP SYN (with a 1460-byte MSS option) into `f`.
fn syn_frame(
    f: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    sport: u16,
    dst: SocketAddrV4,
    isn: u32,
) {
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14..34].copy_from_slice(&ipv4_header(&Ip4::new(src, *dst.ip()), 6, 24, 0x4000));
    let tcp = &mut f[34..58];
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&dst.port().to_be_bytes());
    tcp[4..8].copy_from_slice(&isn.to_be_bytes());
    tcp[8..12].fill(0);
    tcp[12] = 6 << 4; // 24 bytes of header
    tcp[13] = 0x02; // SYN
    tcp[14..16].copy_from_slice(&64240u16.to_be_bytes());
    tcp[16..20].fill(0); // checksum, urgent pointer
    tcp[20..24].copy_from_slice(&[2, 4, 0x05, 0xb4]);
    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&src.octets());
    pseudo[4..8].copy_from_slice(&dst.ip().octets());
    pseudo[9] = 6;
    pseudo[10..12].copy_from_slice(&24u16.to_be_bytes());
    let c = checksum(tcp, sum16(&pseudo, 0));
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
}

/// The network an IPv6 flood's sources are drawn from (its low 32 bits random).
const NET6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xc8, 0, 0, 0, 0, 0, 0);

/// Writes a 78-byte Ethernet + IPv6 + TCP SYN (with a 1440-byte MSS option) into `f`.
fn syn_frame6(
    f: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv6Addr,
    sport: u16,
    dst: SocketAddrV6,
    isn: u32,
) {
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
    let ip = &mut f[14..54];
    ip[..4].copy_from_slice(&[0x60, 0, 0, 0]);
    ip[4..6].copy_from_slice(&24u16.to_be_bytes());
    ip[6] = 6; // TCP
    ip[7] = 64;
    ip[8..24].copy_from_slice(&src.octets());
    ip[24..40].copy_from_slice(&dst.ip().octets());
    let tcp = &mut f[54..78];
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&dst.port().to_be_bytes());
    tcp[4..8].copy_from_slice(&isn.to_be_bytes());
    tcp[8..12].fill(0);
    tcp[12] = 6 << 4;
    tcp[13] = 0x02;
    tcp[14..16].copy_from_slice(&64240u16.to_be_bytes());
    tcp[16..20].fill(0);
    tcp[20..24].copy_from_slice(&[2, 4, 0x05, 0xa0]);
    let mut pseudo = [0u8; 40];
    pseudo[0..16].copy_from_slice(&src.octets());
    pseudo[16..32].copy_from_slice(&dst.ip().octets());
    pseudo[32..36].copy_from_slice(&24u32.to_be_bytes());
    pseudo[39] = 6;
    let c = checksum(tcp, sum16(&pseudo, 0));
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_syn_frame_checks_out() {
        let mut f = [0u8; 58];
        let dst = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 80);
        syn_frame(
            &mut f,
            [2; 6],
            [4; 6],
            Ipv4Addr::new(10, 200, 1, 2),
            40000,
            dst,
            7,
        );
        // A correct checksum sums (with the pseudo-header) to all ones.
        assert_eq!(checksum(&f[14..34], 0), 0);
        assert_eq!(&f[16..18], &44u16.to_be_bytes(), "IP total length");
        assert_eq!(f[20], 0x40, "don't fragment");
        assert_eq!((f[22], f[23]), (64, 6), "TTL, TCP");
        let mut pseudo = [0u8; 12];
        pseudo[0..4].copy_from_slice(&[10, 200, 1, 2]);
        pseudo[4..8].copy_from_slice(&[10, 0, 0, 1]);
        pseudo[9] = 6;
        pseudo[11] = 24;
        assert_eq!(checksum(&f[34..], sum16(&pseudo, 0)), 0);
        assert_eq!(f[34 + 13], 0x02);
        assert_eq!(&f[34..36], &40000u16.to_be_bytes());
    }

    #[test]
    fn an_ipv6_syn_frame_checks_out() {
        let mut f = [0u8; 78];
        let dst = SocketAddrV6::new(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1), 80, 0, 0);
        let src = Ipv6Addr::new(0xfd00, 0xc8, 0, 0, 0, 0, 1, 2);
        syn_frame6(&mut f, [2; 6], [4; 6], src, 40000, dst, 7);
        assert_eq!(&f[12..14], &[0x86, 0xdd]);
        assert_eq!((f[14] >> 4, f[20], &f[18..20]), (6, 6, &[0, 24][..]));
        let mut pseudo = [0u8; 40];
        pseudo[0..16].copy_from_slice(&src.octets());
        pseudo[16..32].copy_from_slice(&dst.ip().octets());
        pseudo[35] = 24;
        pseudo[39] = 6;
        assert_eq!(checksum(&f[54..], sum16(&pseudo, 0)), 0);
        assert_eq!(f[54 + 13], 0x02);
        assert_eq!(&f[56..58], &80u16.to_be_bytes());
    }

    #[test]
    fn a_fragment_frame_checks_out() {
        let mut f = [0u8; 14 + 20 + 64];
        frag_frame(
            &mut f,
            [2; 6],
            [4; 6],
            Ipv4Addr::new(10, 200, 1, 2),
            Ipv4Addr::new(10, 0, 0, 1),
            0x1234_5678_9abc_def0,
        );
        assert_eq!(checksum(&f[14..34], 0), 0);
        assert_eq!(&f[16..18], &84u16.to_be_bytes(), "IP total length");
        let flags = u16::from_be_bytes([f[20], f[21]]);
        assert_eq!(flags & 0xe000, 0x2000, "more fragments, DF clear");
        assert!(flags & 0x1fff > 0, "a middle fragment");
        assert_eq!((f[23], &f[26..30]), (17, &[10, 200, 1, 2][..]));
    }
}
