//! The simulated wire between the client and the server's two cores: every frame delayed,
//! and lost, duplicated or held back (reordered) as the seed says; a frame toward the server
//! goes to the core a hash of its addresses and ports picks, as a NIC's receive-side scaling
//! does (and anything not UDP over IPv4, ARP included, to core 0, as a NIC's default queue).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use corelane_xsk::SplitMix64;

/// Where a frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum To {
    Client,
    Core(usize),
}

/// How the seed impairs the wire.
#[derive(Debug, Clone, Copy)]
pub(super) struct Impairments {
    /// One-way delay.
    pub(super) delay: Duration,
    /// Frames lost in a thousand: toward the server, toward the client.
    pub(super) loss: [u64; 2],
    /// Frames sent twice in a thousand.
    pub(super) dup: u64,
    /// Frames held back (delivered after later ones) in a thousand.
    pub(super) reorder: u64,
    /// ECN-capable frames marked CE (congestion experienced) in a thousand, as a router
    /// with active queue management marks instead of dropping.
    pub(super) ce: u64,
}

impl Impairments {
    /// The seed's draw: one run in eight on a clean wire, the rest with up to 5% loss each
    /// way, 2% duplication and 10% reordering, each present or not by its own draw.
    pub(super) fn draw(rng: &mut SplitMix64) -> Impairments {
        let delay = Duration::from_micros(200 + rng.below(20_000));
        if rng.below(8) == 0 {
            return Impairments {
                delay,
                loss: [0, 0],
                dup: 0,
                reorder: 0,
                ce: 0,
            };
        }
        // One run in eight marks CE and does nothing else.
        if rng.below(7) == 0 {
            return Impairments {
                delay,
                loss: [0, 0],
                dup: 0,
                reorder: 0,
                ce: 1 + rng.below(50),
            };
        }
        let mut some = |max: u64| {
            if rng.below(2) == 0 {
                0
            } else {
                rng.below(max + 1)
            }
        };
        Impairments {
            delay,
            loss: [some(50), some(50)],
            dup: some(20),
            reorder: some(100),
            ce: some(50),
        }
    }
}

/// What the wire did.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct WireStats {
    pub(super) frames: u64,
    pub(super) lost: u64,
    pub(super) duplicated: u64,
    pub(super) reordered: u64,
    pub(super) ce_marked: u64,
}

/// A frame in flight: when it is delivered, its place in the order sent (ties go in that
/// order), where to, its bytes.
type InFlight = Reverse<(Duration, u64, To, Vec<u8>)>;

/// Frames in flight, earliest first.
pub(super) struct Wire {
    imp: Impairments,
    rng: SplitMix64,
    /// The key of the server's receive-side hash.
    rss: u64,
    flight: BinaryHeap<InFlight>,
    sent: u64,
    pub(super) stats: WireStats,
}

impl Wire {
    pub(super) fn new(imp: Impairments, seed: u64) -> Wire {
        let mut rng = SplitMix64(seed);
        let rss = rng.draw();
        Wire {
            imp,
            rng,
            rss,
            flight: BinaryHeap::new(),
            sent: 0,
            stats: WireStats::default(),
        }
    }

    /// The server core a frame from the client lands on.
    pub(super) fn core_for(&self, frame: &[u8]) -> usize {
        let Some(k) = udp4_tuple(frame) else {
            return 0;
        };
        (SplitMix64(self.rss ^ k).draw() & 1) as usize
    }

    /// `bytes` sent at `now` toward `to` (`to_server`: from the client).
    pub(super) fn send(&mut self, now: Duration, to_server: bool, mut bytes: Vec<u8>) {
        self.stats.frames += 1;
        if self.rng.below(1000) < self.imp.loss[usize::from(!to_server)] {
            self.stats.lost += 1;
            return;
        }
        if self.rng.below(1000) < self.imp.ce && mark_ce(&mut bytes) {
            self.stats.ce_marked += 1;
        }
        let to = if to_server {
            To::Core(self.core_for(&bytes))
        } else {
            To::Client
        };
        let copies = if self.rng.below(1000) < self.imp.dup {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut at = now + self.imp.delay;
            if self.rng.below(1000) < self.imp.reorder {
                // Held back by up to two delays: later frames pass it.
                self.stats.reordered += 1;
                at += Duration::from_micros(
                    100 + self.rng.below(2 * self.imp.delay.as_micros() as u64 + 1),
                );
            }
            self.sent += 1;
            self.flight
                .push(Reverse((at, self.sent, to, bytes.clone())));
        }
    }

    /// The next frame due by `now`.
    pub(super) fn due(&mut self, now: Duration) -> Option<(To, Vec<u8>)> {
        if self
            .flight
            .peek()
            .is_some_and(|Reverse((at, ..))| *at <= now)
        {
            return self.flight.pop().map(|Reverse((_, _, to, b))| (to, b));
        }
        None
    }

    /// When the next frame is due.
    pub(super) fn next(&self) -> Option<Duration> {
        self.flight.peek().map(|Reverse((at, ..))| *at)
    }
}

/// Marks an ECN-capable IPv4 frame CE, its header checksum made good again: true when it was
/// ECN-capable (a not-ECT frame is left alone, as a router leaves it).
fn mark_ce(frame: &mut [u8]) -> bool {
    if frame.get(12..14) != Some(&[0x08, 0x00][..]) {
        return false;
    }
    let Some(ihl) = frame.get(14).map(|b| usize::from(b & 0x0f) * 4) else {
        return false;
    };
    let Some(ip) = frame.get_mut(14..14 + ihl) else {
        return false;
    };
    if ihl < 20 || ip[1] & 3 == 0 {
        return false;
    }
    ip[1] |= 3;
    ip[10..12].fill(0);
    let mut sum: u32 = ip
        .chunks_exact(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    true
}

/// Source address and both ports of a UDP over IPv4 frame, in one word.
fn udp4_tuple(frame: &[u8]) -> Option<u64> {
    if frame.get(12..14)? != [0x08, 0x00] {
        return None;
    }
    let ip = frame.get(14..)?;
    let ihl = usize::from(ip.first()? & 0x0f) * 4;
    if *ip.get(9)? != 17 {
        return None;
    }
    let src = u32::from_be_bytes(ip.get(12..16)?.try_into().ok()?);
    let ports = u32::from_be_bytes(ip.get(ihl..ihl + 4)?.try_into().ok()?);
    Some(u64::from(src) << 32 | u64::from(ports))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp_frame(src_port: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[14 + 9] = 17;
        f[34..36].copy_from_slice(&src_port.to_be_bytes());
        f[36..38].copy_from_slice(&4433u16.to_be_bytes());
        f
    }

    #[test]
    fn the_hash_spreads_ports_over_both_cores_and_arp_goes_to_core_0() {
        let w = Wire::new(
            Impairments {
                delay: Duration::from_millis(1),
                loss: [0, 0],
                dup: 0,
                reorder: 0,
                ce: 0,
            },
            3,
        );
        let on1 = (49152..49252u16)
            .filter(|&p| w.core_for(&udp_frame(p)) == 1)
            .count();
        assert!((20..80).contains(&on1), "{on1} of 100 ports on core 1");
        let mut arp = udp_frame(1);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(w.core_for(&arp), 0);
    }

    #[test]
    fn held_back_frames_arrive_after_later_ones_and_nothing_before_its_delay() {
        let imp = Impairments {
            delay: Duration::from_millis(5),
            loss: [0, 0],
            dup: 0,
            reorder: 500,
            ce: 0,
        };
        let mut w = Wire::new(imp, 11);
        for i in 0..100u8 {
            w.send(Duration::from_micros(u64::from(i)), false, vec![i]);
        }
        assert!(w.due(Duration::from_millis(4)).is_none());
        let mut order = Vec::new();
        while let Some((_, b)) = w.due(Duration::from_secs(1)) {
            order.push(b[0]);
        }
        assert_eq!(order.len(), 100);
        assert!(order.windows(2).any(|p| p[0] > p[1]), "some reordered");
        assert!(w.stats.reordered > 20);
    }
}
