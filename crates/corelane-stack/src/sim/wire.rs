//! One direction of the simulated path: what a router between the two stacks does to the frames
//! it forwards (loss, loss of pure ACKs only, duplication, reordering behind later frames, a
//! bottleneck rate with a drop-tail queue, a propagation delay), decided by a seeded generator.

use std::collections::VecDeque;

use smoltcp::time::{Duration, Instant};

/// What one direction of the path does to frames, in frames per million where it is odds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Impair {
    /// Frames dropped, whatever they carry.
    pub loss_ppm: u32,
    /// Pure ACKs (TCP segments with no data, SYN, FIN or RST) dropped.
    pub ack_loss_ppm: u32,
    /// TCP segments that carry data dropped (everything else passes: ARP, handshakes, ACKs).
    pub data_loss_ppm: u32,
    /// Frames sent twice.
    pub dup_ppm: u32,
    /// Frames held back until `reorder_hold` later frames have passed (or until
    /// [`HOLD_LIMIT`] past their time, when fewer follow).
    pub reorder_ppm: u32,
    /// How many later frames overtake a held frame.
    pub reorder_hold: u32,
    /// One-way propagation delay.
    pub delay: Duration,
    /// Bottleneck rate in bits per second (0: none).
    pub rate_bps: u64,
    /// The bottleneck's queue in bytes: a frame that would wait behind more is dropped.
    pub queue_bytes: usize,
}

impl Impair {
    /// True when this direction never drops a frame: no loss of any kind and no bottleneck
    /// queue to overflow.
    pub fn loses_nothing(&self) -> bool {
        self.loss_ppm == 0
            && self.ack_loss_ppm == 0
            && self.data_loss_ppm == 0
            && self.rate_bps == 0
    }

    /// A clean direction with a one-way delay of `ms` milliseconds.
    pub fn delay_ms(ms: u64) -> Impair {
        Impair {
            delay: Duration::from_millis(ms),
            ..Impair::default()
        }
    }
}

/// The longest a reordered frame waits for the frames that are to overtake it.
pub const HOLD_LIMIT: Duration = Duration::from_millis(5);

/// What one direction of the path did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireStats {
    /// Frames offered.
    pub frames: u64,
    /// Frames dropped by `loss_ppm`.
    pub lost: u64,
    /// Pure ACKs dropped by `ack_loss_ppm`.
    pub acks_lost: u64,
    /// Data segments dropped by `data_loss_ppm`.
    pub data_lost: u64,
    /// Frames sent twice.
    pub duplicated: u64,
    /// Frames held back behind later ones.
    pub reordered: u64,
    /// Frames dropped by the bottleneck's full queue.
    pub queue_dropped: u64,
    /// Frames longer than the link's MTU allows (dropped, as a real link does): a bug of the
    /// sender.
    pub oversize: u64,
    /// The longest frame offered, bytes (Ethernet header included).
    pub longest: usize,
    /// A hash (FNV-1a) of every frame offered, in order, byte for byte: two runs with the
    /// same digest put the same frames on the wire.
    pub digest: u64,
}

/// The generator behind every decision: splitmix64, so a seed replays exactly.
#[derive(Debug, Clone)]
pub(crate) struct Dice(u64);

impl Dice {
    pub(crate) fn new(seed: u64) -> Dice {
        Dice(seed ^ 0x6a09_e667_f3bc_c908)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True with odds of `ppm` in a million.
    pub(crate) fn roll(&mut self, ppm: u32) -> bool {
        ppm > 0 && self.next() % 1_000_000 < u64::from(ppm)
    }
}

/// A frame held back for reordering.
#[derive(Debug)]
struct Held {
    /// Frames still to pass it.
    left: u32,
    /// When it goes anyway.
    until: Instant,
    bytes: Vec<u8>,
}

/// One direction of the path.
#[derive(Debug)]
pub(crate) struct Wire {
    pub(crate) imp: Impair,
    /// Longest frame the link carries (the IP MTU plus the Ethernet header).
    max_frame: usize,
    /// Frames on their way, in the order they arrive.
    queue: VecDeque<(Instant, Vec<u8>)>,
    held: Vec<Held>,
    /// When the bottleneck has finished sending what it holds.
    busy_until: Instant,
    pub(crate) stats: WireStats,
}

/// The TCP payload bytes of an IPv4 or IPv6 Ethernet frame (0 for anything else).
pub(crate) fn tcp_payload(f: &[u8]) -> usize {
    let (l4, end) = match f.get(12..14) {
        Some([0x08, 0x00]) if f.get(23) == Some(&6) => {
            let ihl = f.get(14).map_or(0, |b| usize::from(b & 0xf) * 4);
            let total = f
                .get(16..18)
                .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
            (14 + ihl, 14 + total)
        }
        Some([0x86, 0xdd]) if f.get(20) == Some(&6) => {
            let plen = f
                .get(18..20)
                .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
            (54, 54 + plen)
        }
        _ => return 0,
    };
    let doff = f.get(l4 + 12).map_or(0, |b| usize::from(b >> 4) * 4);
    end.saturating_sub(l4 + doff)
}

/// Whether an Ethernet frame is an IPv4 or IPv6 TCP segment with no data and only the ACK flag
/// (among SYN, FIN, RST): a pure ACK.
pub(crate) fn pure_ack(f: &[u8]) -> bool {
    let (l4, payload_end) = match f.get(12..14) {
        Some([0x08, 0x00]) => {
            let Some(&vihl) = f.get(14) else { return false };
            if f.get(23) != Some(&6) {
                return false;
            }
            let total = f
                .get(16..18)
                .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
            (14 + usize::from(vihl & 0xf) * 4, 14 + total)
        }
        Some([0x86, 0xdd]) => {
            if f.get(20) != Some(&6) {
                return false;
            }
            let plen = f
                .get(18..20)
                .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
            (54, 54 + plen)
        }
        _ => return false,
    };
    let (Some(&off), Some(&flags)) = (f.get(l4 + 12), f.get(l4 + 13)) else {
        return false;
    };
    let data = payload_end.saturating_sub(l4 + usize::from(off >> 4) * 4);
    data == 0 && flags & 0x07 == 0
}

/// One line about an Ethernet frame holding an IPv4 TCP segment: ports, flags, sequence and
/// acknowledgment numbers, length, window and SACK blocks (for a replay's trace).
pub(crate) fn describe(f: &[u8]) -> String {
    let Some(&vihl) = f.get(14) else {
        return format!("{} bytes", f.len());
    };
    let l4 = 14 + usize::from(vihl & 0xf) * 4;
    let (Some(h), Some(total)) = (
        f.get(l4..l4 + 20),
        f.get(16..18)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]]))),
    ) else {
        return format!("{} bytes", f.len());
    };
    let be32 = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    let doff = usize::from(h[12] >> 4) * 4;
    let len = (14 + total).saturating_sub(l4 + doff);
    let fl = h[13];
    let flags: String = [
        (0x02, 'S'),
        (0x01, 'F'),
        (0x04, 'R'),
        (0x08, 'P'),
        (0x10, '.'),
    ]
    .iter()
    .filter(|(b, _)| fl & b != 0)
    .map(|(_, c)| *c)
    .collect();
    let mut sack = String::new();
    let opts = f.get(l4 + 20..l4 + doff).unwrap_or(&[]);
    let mut i = 0;
    while i < opts.len() {
        match opts[i] {
            0 => break,
            1 => i += 1,
            k => {
                let n = usize::from(*opts.get(i + 1).unwrap_or(&2)).max(2);
                if k == 5 {
                    for b in opts.get(i + 2..i + n).unwrap_or(&[]).chunks_exact(8) {
                        sack.push_str(&format!(" sack {}-{}", be32(&b[..4]), be32(&b[4..])));
                    }
                }
                i += n;
            }
        }
    }
    format!(
        "{}>{} [{flags}] seq {} ack {} len {len} win {}{sack}",
        u16::from_be_bytes([h[0], h[1]]),
        u16::from_be_bytes([h[2], h[3]]),
        be32(&h[4..8]),
        be32(&h[8..12]),
        u16::from_be_bytes([h[14], h[15]])
    )
}

impl Wire {
    pub(crate) fn new(imp: Impair, mtu: usize) -> Wire {
        Wire {
            imp,
            max_frame: mtu + 14,
            queue: VecDeque::new(),
            held: Vec::new(),
            busy_until: Instant::ZERO,
            stats: WireStats::default(),
        }
    }

    /// A frame enters this direction at `now`; with `trace`, a line says what became of it.
    pub(crate) fn offer(&mut self, now: Instant, bytes: Vec<u8>, dice: &mut Dice, trace: bool) {
        let before = self.stats;
        let line = trace.then(|| describe(&bytes));
        self.decide(now, bytes, dice);
        if let Some(line) = line {
            let s = self.stats;
            let fate = if s.lost > before.lost || s.acks_lost > before.acks_lost {
                " LOST"
            } else if s.queue_dropped > before.queue_dropped {
                " QUEUE-DROPPED"
            } else if s.oversize > before.oversize {
                " OVERSIZE"
            } else if s.reordered > before.reordered {
                " held"
            } else if s.duplicated > before.duplicated {
                " duplicated"
            } else {
                ""
            };
            println!("{:>10} us {line}{fate}", now.total_micros());
        }
    }

    fn decide(&mut self, now: Instant, bytes: Vec<u8>, dice: &mut Dice) {
        let s = &mut self.stats;
        s.frames += 1;
        s.longest = s.longest.max(bytes.len());
        if s.digest == 0 {
            s.digest = 0xcbf2_9ce4_8422_2325;
        }
        for &b in bytes.iter().chain(&(bytes.len() as u32).to_le_bytes()) {
            s.digest = (s.digest ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        if bytes.len() > self.max_frame {
            s.oversize += 1;
            return;
        }
        if dice.roll(self.imp.loss_ppm) {
            s.lost += 1;
            return;
        }
        if self.imp.ack_loss_ppm > 0 && pure_ack(&bytes) && dice.roll(self.imp.ack_loss_ppm) {
            s.acks_lost += 1;
            return;
        }
        if self.imp.data_loss_ppm > 0
            && tcp_payload(&bytes) > 0
            && dice.roll(self.imp.data_loss_ppm)
        {
            s.data_lost += 1;
            return;
        }
        let copies = if dice.roll(self.imp.dup_ppm) {
            s.duplicated += 1;
            2
        } else {
            1
        };
        let mut at = now + self.imp.delay;
        if self.imp.rate_bps > 0 {
            let start = self.busy_until.max(now);
            let waiting =
                (start - now).total_micros() as u128 * u128::from(self.imp.rate_bps) / 8_000_000;
            if waiting > self.imp.queue_bytes as u128 {
                s.queue_dropped += 1;
                return;
            }
            let ser = bytes.len() as u64 * 8_000_000 / self.imp.rate_bps;
            self.busy_until = start + Duration::from_micros(ser.max(1));
            at = self.busy_until + self.imp.delay;
        }
        let hold = self.imp.reorder_hold > 0 && dice.roll(self.imp.reorder_ppm);
        if copies == 2 {
            self.queue.push_back((at, bytes.clone()));
        }
        if hold {
            self.stats.reordered += 1;
            self.held.push(Held {
                left: self.imp.reorder_hold,
                until: at + HOLD_LIMIT,
                bytes,
            });
        } else {
            self.queue.push_back((at, bytes));
        }
    }

    /// Moves the frames due by `now`, in arrival order, to the back of `out`.
    pub(crate) fn deliver(&mut self, now: Instant, out: &mut Vec<Vec<u8>>) {
        loop {
            // A held frame whose time is up goes first if it is due before the next frame.
            let next_queued = self.queue.front().map(|(t, _)| *t).filter(|t| *t <= now);
            let held_due = self
                .held
                .iter()
                .enumerate()
                .filter(|(_, h)| h.until <= now)
                .min_by_key(|(_, h)| h.until)
                .map(|(i, h)| (i, h.until));
            match (next_queued, held_due) {
                (_, Some((i, until))) if next_queued.is_none_or(|t| until <= t) => {
                    out.push(self.held.swap_remove(i).bytes);
                }
                (Some(_), _) => {
                    let Some((_, b)) = self.queue.pop_front() else {
                        break;
                    };
                    out.push(b);
                    // Every held frame has one more frame past it; those overtaken by enough
                    // follow it now.
                    let mut i = 0;
                    while i < self.held.len() {
                        self.held[i].left = self.held[i].left.saturating_sub(1);
                        if self.held[i].left == 0 {
                            out.push(self.held.swap_remove(i).bytes);
                        } else {
                            i += 1;
                        }
                    }
                }
                _ => break,
            }
        }
    }

    /// When the next frame is due, if one is on its way.
    pub(crate) fn next_at(&self) -> Option<Instant> {
        let q = self.queue.front().map(|(t, _)| *t);
        let h = self.held.iter().map(|h| h.until).min();
        match (q, h) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Frames on their way.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.queue.len() + self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[12] = 0x08;
        f
    }

    #[test]
    fn a_held_frame_arrives_after_the_frames_that_overtake_it() {
        let imp = Impair {
            reorder_ppm: 1_000_000,
            reorder_hold: 2,
            ..Impair::default()
        };
        let mut w = Wire::new(imp, 1500);
        let mut dice = Dice::new(1);
        w.offer(Instant::ZERO, vec![1; 60], &mut dice, false);
        w.imp.reorder_ppm = 0;
        w.offer(Instant::ZERO, vec![2; 60], &mut dice, false);
        w.offer(Instant::ZERO, vec![3; 60], &mut dice, false);
        w.offer(Instant::ZERO, vec![4; 60], &mut dice, false);
        let mut out = Vec::new();
        w.deliver(Instant::ZERO, &mut out);
        let order: Vec<u8> = out.iter().map(|f| f[0]).collect();
        assert_eq!(order, [2, 3, 1, 4]);
        assert_eq!(w.in_flight(), 0);
    }

    #[test]
    fn a_held_frame_with_nothing_behind_it_goes_at_the_hold_limit() {
        let imp = Impair {
            reorder_ppm: 1_000_000,
            reorder_hold: 3,
            ..Impair::default()
        };
        let mut w = Wire::new(imp, 1500);
        let mut dice = Dice::new(1);
        w.offer(Instant::ZERO, vec![1; 60], &mut dice, false);
        let mut out = Vec::new();
        w.deliver(Instant::ZERO, &mut out);
        assert!(out.is_empty());
        assert_eq!(w.next_at(), Some(Instant::ZERO + HOLD_LIMIT));
        w.deliver(Instant::ZERO + HOLD_LIMIT, &mut out);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn oversize_frames_are_dropped_and_counted() {
        let mut w = Wire::new(Impair::default(), 1500);
        let mut dice = Dice::new(1);
        w.offer(Instant::ZERO, frame(1515), &mut dice, false);
        w.offer(Instant::ZERO, frame(1514), &mut dice, false);
        assert_eq!((w.stats.oversize, w.in_flight()), (1, 1));
        assert_eq!(w.stats.longest, 1515);
    }

    #[test]
    fn a_bottleneck_spaces_frames_and_drops_past_its_queue() {
        let imp = Impair {
            rate_bps: 8_000_000, // a byte per microsecond
            queue_bytes: 3000,
            ..Impair::default()
        };
        let mut w = Wire::new(imp, 1500);
        let mut dice = Dice::new(1);
        for _ in 0..5 {
            w.offer(Instant::ZERO, frame(1000), &mut dice, false);
        }
        // The first starts at once; three more wait (up to 3000 bytes ahead); the fifth would
        // wait behind 4000 and is dropped.
        assert_eq!((w.in_flight(), w.stats.queue_dropped), (4, 1));
        assert_eq!(w.next_at(), Some(Instant::from_micros(1000)));
    }
}
